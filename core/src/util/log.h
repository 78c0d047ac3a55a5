/* log: quiet by default (errors only), env HIXL_LOG_LEVEL, host callback. */
#ifndef HIXL_LOG_H
#define HIXL_LOG_H
#include <stdatomic.h>
#include <stddef.h>

#include "hixl/hixl_status.h"

extern atomic_int hixl_log_level_; /* checked before any formatting */
void hixl_log_write(HixlLogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hixl_log_init(void);
/* Copy n bytes a peer sent (a name) into dst as printable text: bytes outside ' '..'~'
 * and the backslash become \xNN, so nothing a peer says can break a log line or
 * drive a terminal. Always NUL-terminated; cut short at cap. */
void log_escape(char *dst, size_t cap, const void *src, size_t n);

#define HIXL_LOG(lvl, ...)                                                                                   \
  do {                                                                                                       \
    if ((int)(lvl) <= atomic_load_explicit(&hixl_log_level_, memory_order_relaxed))                          \
      hixl_log_write((lvl), __VA_ARGS__);                                                                    \
  } while (0)
#define log_error(...) HIXL_LOG(HIXL_LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  HIXL_LOG(HIXL_LOG_WARN, __VA_ARGS__)
#define log_info(...)  HIXL_LOG(HIXL_LOG_INFO, __VA_ARGS__)
#define log_debug(...) HIXL_LOG(HIXL_LOG_DEBUG, __VA_ARGS__)

#endif
