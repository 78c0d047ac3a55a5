/* log: one line per event to stderr or to the host's callback. */
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

atomic_int hixl_log_level_ = HIXL_LOG_ERROR;
/* The callback and its context change together: read and written under log_lock. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static HixlLogCallback log_cb;
static void *log_ctx;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static atomic_int log_level_set_by_api;

static void log_read_env(void) {
  const char *v = getenv("HIXL_LOG_LEVEL");
  static const char *const names[] = {"off", "error", "warn", "info", "debug"};
  if (!v || atomic_load(&log_level_set_by_api)) return;
  for (int i = 0; i < 5; i++)
    if (strcasecmp(v, names[i]) == 0) {
      atomic_store(&hixl_log_level_, i);
      return;
    }
  char esc[64]; /* said once, at the level kept: a typo (debgu) left the level at error silently */
  log_escape(esc, sizeof(esc), v, strlen(v));
  log_error("HIXL_LOG_LEVEL=\"%s\" is not one of off, error, warn, info, debug: the level stays error", esc);
}

/* Called from Create: no work happens in library constructors. */
void hixl_log_init(void) { pthread_once(&log_once, log_read_env); }

void HixlSetLogCallback(HixlLogCallback cb, void *ctx) {
  pthread_mutex_lock(&log_lock);
  log_ctx = ctx;
  log_cb = cb;
  pthread_mutex_unlock(&log_lock);
}

void HixlSetLogLevel(HixlLogLevel level) {
  if (level < HIXL_LOG_OFF || level > HIXL_LOG_DEBUG) return;
  atomic_store(&log_level_set_by_api, 1);
  atomic_store(&hixl_log_level_, (int)level);
}

void hixl_log_write(HixlLogLevel level, const char *fmt, ...) {
  static const char *const tags[] = {"", "E", "W", "I", "D"};
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_lock);
  HixlLogCallback cb = log_cb;
  void *ctx = log_ctx;
  pthread_mutex_unlock(&log_lock);
  if (cb) {
    cb(level, msg, ctx);
    return;
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(stderr, "[hixl %s %ld.%06ld %d] %s\n", tags[level], (long)ts.tv_sec, ts.tv_nsec / 1000,
          (int)getpid(), msg);
}

void log_escape(char *dst, size_t cap, const void *src, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *b = src;
  size_t o = 0;
  if (cap == 0) return;
  for (size_t i = 0; i < n; i++) {
    bool plain = b[i] >= 0x20 && b[i] <= 0x7e && b[i] != '\\';
    size_t need = plain ? 1 : 4;
    if (o + need >= cap) break;
    if (plain) {
      dst[o++] = (char)b[i];
    } else {
      dst[o++] = '\\';
      dst[o++] = 'x';
      dst[o++] = hex[b[i] >> 4];
      dst[o++] = hex[b[i] & 15];
    }
  }
  dst[o] = '\0';
}
