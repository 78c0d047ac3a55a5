/* opvec: see opvec.h. */
#include "util/opvec.h"

#include <stdlib.h>
#include <string.h>

int opvec_add(struct opvec *o, uintptr_t local, uintptr_t remote, uint64_t len, bool join) {
  HixlTransferOpDesc *last = o->n ? &o->v[o->n - 1] : NULL;
  if (join && last && last->local_addr + last->len == local && last->remote_addr + last->len == remote) {
    last->len += (size_t)len; /* the run goes on */
    o->bytes += len;
    return 0;
  }
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    HixlTransferOpDesc *v = realloc(o->v, cap * sizeof(*v));
    if (!v) return -1;
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = (HixlTransferOpDesc){local, remote, (size_t)len};
  o->bytes += len;
  return 0;
}

void opvec_free(struct opvec *o) {
  free(o->v);
  memset(o, 0, sizeof(*o));
}
