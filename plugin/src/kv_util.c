/* kv_util: what every file of the connector uses: errors kept for last_error, small
 * sets of request ids, addresses, and what get_finished will report. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv_int.h"
#include "kv_obs.h"

#define KV_GONE_MAX 4096 /* ids remembered as freed, so a late PIN fails at once */

static _Thread_local char kv_err[512];

hixl_kv_status kv_fail(hixl_kv_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv_err, sizeof(kv_err), fmt, ap);
  va_end(ap);
  return st;
}

const char *kv_last_error(void) { return kv_err; }

uint64_t kv_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int32_t kv_ms_until(uint64_t deadline) {
  uint64_t now = kv_now_ns();
  return now >= deadline ? 0 : (int32_t)((deadline - now + 999999) / 1000000);
}

/* ---- small sets of ids ---- */

bool kv_idset_has(const struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) return true;
  return false;
}

size_t kv_idset_count(const struct kv_idset *s, const char *id) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++) n += strcmp(s->v[i], id) == 0;
  return n;
}

int kv_idset_add(struct kv_idset *s, const char *id) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    char **v = realloc(s->v, cap * sizeof(*v));
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  if (!(s->v[s->n] = strdup(id))) return -1;
  s->n++;
  return 0;
}

void kv_idset_del(struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) {
      free(s->v[i]);
      s->v[i] = s->v[--s->n];
      return;
    }
}

void kv_idset_clear(struct kv_idset *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof(*s));
}

/* Hand a set to the host as hixl_kv_ids (one allocation), emptying it. */
int kv_idset_take(struct kv_idset *s, hixl_kv_ids *out) {
  size_t bytes = s->n * sizeof(char *);
  for (size_t i = 0; i < s->n; i++) bytes += strlen(s->v[i]) + 1;
  char **v = malloc(bytes ? bytes : 1);
  if (!v) return -1;
  char *p = (char *)(v + s->n);
  for (size_t i = 0; i < s->n; i++) {
    size_t l = strlen(s->v[i]) + 1;
    v[i] = memcpy(p, s->v[i], l);
    p += l;
    free(s->v[i]);
  }
  out->ids = (const char *const *)v;
  out->count = s->n;
  s->n = 0;
  return 0;
}

void kv_free_ids(hixl_kv_ids *ids) {
  if (!ids) return;
  free((void *)ids->ids);
  ids->ids = NULL;
  ids->count = 0;
}

void kv_free_buffer(hixl_kv_buffer *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = 0;
}

bool kv_copy_id(char *dst, const char *src, size_t n) {
  if (!src || n == 0 || n > KV_MAX_ID || memchr(src, '\0', n)) return false;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return true;
}

/* ---- engine address and cluster id ---- */

/* "ip:port" + rank -> this worker's engine address and its cluster id. */
hixl_kv_status kv_worker_address(const char *base, uint32_t rank, char *out, size_t cap, uint64_t *cluster) {
  char ip[48];
  const char *colon = strrchr(base, ':');
  CHECK_ARG(colon && (size_t)(colon - base) < sizeof(ip),
            "address \"%s\" needs a port: a worker's engine listens on port + rank", base);
  memcpy(ip, base, (size_t)(colon - base));
  ip[colon - base] = '\0';
  char *end;
  unsigned long port = strtoul(colon + 1, &end, 10);
  struct in_addr a;
  CHECK_ARG(*end == '\0' && port > 0 && port + rank <= 65535 && inet_pton(AF_INET, ip, &a) == 1,
            "address \"%s\" (rank %u) is not \"ip:port\" with port + rank in [1, 65535]", base, rank);
  snprintf(out, cap, "%s:%lu", ip, port + rank);
  *cluster = ((uint64_t)ntohl(a.s_addr) << 16) | (port + rank);
  return HIXL_KV_SUCCESS;
}

/* Make the event fd readable, if the host asked for it. Lock held. */
void kv_efd_signal(hixl_kv_connector *c) {
  if (c->efd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof(one)); /* fails only when the count is full: readable anyway */
    (void)w;
  }
}

/* id is finished sending (set sending_done) or receiving (recving_done): the host
 * learns it at its next get_finished; one waiting on the event fd wakes now. Lock held. */
void kv_finished_add(hixl_kv_connector *c, struct kv_idset *set, const char *id) {
  kv_obs_phase(c, id, KV_PH_DONE, NULL);
  kv_idset_add(set, id);
  kv_efd_signal(c);
}

void kv_gone_add(hixl_kv_connector *c, const char *id) {
  if (c->gone.n >= KV_GONE_MAX) {
    free(c->gone.v[0]);
    memmove(c->gone.v, c->gone.v + 1, (c->gone.n - 1) * sizeof(char *));
    c->gone.n--;
  }
  kv_idset_add(&c->gone, id);
}

void kv_err_blocks_add(hixl_kv_connector *c, const uint64_t *b, size_t n) {
  for (size_t k = 0; k < n; k++) {
    if (c->nerr == c->caperr) {
      size_t cap = c->caperr ? c->caperr * 2 : 64;
      uint64_t *v = realloc(c->err_blocks, cap * sizeof(*v));
      if (!v) return;
      c->err_blocks = v;
      c->caperr = cap;
    }
    c->err_blocks[c->nerr++] = b[k];
  }
}
