/* Internal status helpers. */
#ifndef HIXL_STATUS_INT_H
#define HIXL_STATUS_INT_H
#include "hixl/hixl_status.h"

/* Record why the calling thread's current call fails and return status. */
HixlStatus hixl_fail(HixlStatus status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hixl_error_clear(void);

#endif
