/* opvec: a growing list of transfer op descriptors, as the cache manager and the
 * plugin build them for one HixlEngineTransfer* call. */
#ifndef HIXL_UTIL_OPVEC_H
#define HIXL_UTIL_OPVEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_engine.h"

struct opvec {
  HixlTransferOpDesc *v;
  size_t n, cap;
  uint64_t bytes; /* the sum of what was added */
};

/* Append the op [local, +len) <-> [remote, +len); join: extend the last op instead when
 * both its ranges end where these begin. 0, or -1 (out of memory: o unchanged). */
int opvec_add(struct opvec *o, uintptr_t local, uintptr_t remote, uint64_t len, bool join);
void opvec_free(struct opvec *o); /* and empty it */

#endif
