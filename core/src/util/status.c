/* status: names and strings from HIXL_STATUS_MAP, and the per-thread error detail. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "hixl/hixl_status.h"
#include "util/status_int.h"

const char *HixlStatusName(HixlStatus status) {
  switch (status) {
#define X(name, value, text)                                                                                 \
  case value: return #name;
    HIXL_STATUS_MAP(X)
#undef X
  }
  return "HIXL_UNKNOWN_STATUS";
}

const char *HixlStatusString(HixlStatus status) {
  switch (status) {
#define X(name, value, text)                                                                                 \
  case value: return text;
    HIXL_STATUS_MAP(X)
#undef X
  }
  return "unknown status";
}

static _Thread_local char last_error[1024];

const char *HixlGetLastErrorMessage(void) { return last_error; }

const char *HixlVersionString(void) { return HIXL_VERSION; }

HixlStatus hixl_fail(HixlStatus status, const char *fmt, ...) {
  char msg[sizeof(last_error)]; /* the arguments may include last_error itself */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof(msg));
  return status;
}

void hixl_error_clear(void) { last_error[0] = '\0'; }
