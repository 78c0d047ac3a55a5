/* ptrset: an open-addressing set of pointers, so handles the caller passes back
 * are checked before they are dereferenced. */
#ifndef HIXL_PTRSET_H
#define HIXL_PTRSET_H
#include <stdbool.h>
#include <stddef.h>

struct ptrset {
  void **slots;
  size_t cap; /* power of two, or 0 */
  size_t count;
};

int ptrset_add(struct ptrset *s, void *p); /* 0, or -1 when out of memory */
bool ptrset_has(const struct ptrset *s, const void *p);
bool ptrset_del(struct ptrset *s, const void *p);
void ptrset_free(struct ptrset *s);

#endif
