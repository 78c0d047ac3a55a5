/* hixl: status codes, error detail and logging hooks shared by every API family. */
#ifndef HIXL_STATUS_H
#define HIXL_STATUS_H

#include <stdint.h>

#if defined(_WIN32)
#define HIXL_API __declspec(dllexport)
#elif defined(__GNUC__)
#define HIXL_API __attribute__((visibility("default")))
#else
#define HIXL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One list drives the values, the names and the strings (HIXL's values kept). */
#define HIXL_STATUS_MAP(X)                                                                                   \
  X(HIXL_SUCCESS, 0U, "success")                                                                             \
  X(HIXL_PARAM_INVALID, 103900U, "invalid parameter")                                                        \
  X(HIXL_TIMEOUT, 103901U, "timed out")                                                                      \
  X(HIXL_NOT_CONNECTED, 103902U, "not connected")                                                            \
  X(HIXL_ALREADY_CONNECTED, 103903U, "already connected")                                                    \
  X(HIXL_NOTIFY_FAILED, 103904U, "notification failed")                                                      \
  X(HIXL_UNSUPPORTED, 103905U, "unsupported")                                                                \
  X(HIXL_NOT_FOUND, 103906U, "not found") /* hixl's own: a key names no cache on the peer */                 \
  X(HIXL_RESOURCE_EXHAUSTED, 203900U, "resource exhausted")                                                  \
  X(HIXL_FAILED, 503900U, "failed")

typedef uint32_t HixlStatus;

#define HIXL_STATUS_ENUM_(name, value, text) name = value,
enum { HIXL_STATUS_MAP(HIXL_STATUS_ENUM_) };
#undef HIXL_STATUS_ENUM_

/** Name of a status ("HIXL_TIMEOUT"); "HIXL_UNKNOWN_STATUS" for other values. */
HIXL_API const char *HixlStatusName(HixlStatus status);
/** Short English text of a status ("timed out"). */
HIXL_API const char *HixlStatusString(HixlStatus status);
/** Why the calling thread's last failing hixl call failed; "" when none did. */
HIXL_API const char *HixlGetLastErrorMessage(void);

typedef enum {
  HIXL_LOG_OFF = 0,
  HIXL_LOG_ERROR = 1,
  HIXL_LOG_WARN = 2,
  HIXL_LOG_INFO = 3,
  HIXL_LOG_DEBUG = 4,
} HixlLogLevel;

typedef void (*HixlLogCallback)(HixlLogLevel level, const char *message, void *ctx);

/** Route log lines to cb (NULL restores stderr). The level still comes from
 *  HixlSetLogLevel or env HIXL_LOG_LEVEL (off|error|warn|info|debug; default error).
 *  Both setters are safe from any thread at any time; a line written as the callback
 *  changes may still go to the previous one. cb runs on whichever hixl thread logs,
 *  the progress thread included, with that engine's lock held: it must return quickly
 *  and must not call any hixl function. */
HIXL_API void HixlSetLogCallback(HixlLogCallback cb, void *ctx);
HIXL_API void HixlSetLogLevel(HixlLogLevel level);

/** Library version, "MAJOR.MINOR.PATCH". */
HIXL_API const char *HixlVersionString(void);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_STATUS_H */
