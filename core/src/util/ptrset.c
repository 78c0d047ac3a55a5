/* ptrset: linear probing with backward-shift deletion (no tombstones). */
#include "util/ptrset.h"

#include <stdint.h>
#include <stdlib.h>

static size_t slot_of(const struct ptrset *s, const void *p) {
  uintptr_t x = (uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (s->cap - 1);
}

static int grow(struct ptrset *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  struct ptrset n = {calloc(cap, sizeof(void *)), cap, 0};
  if (!n.slots) return -1;
  for (size_t i = 0; i < s->cap; i++)
    if (s->slots[i]) {
      size_t j = slot_of(&n, s->slots[i]);
      while (n.slots[j]) j = (j + 1) & (cap - 1);
      n.slots[j] = s->slots[i];
      n.count++;
    }
  free(s->slots);
  *s = n;
  return 0;
}

int ptrset_add(struct ptrset *s, void *p) {
  if ((s->count + 1) * 2 > s->cap && grow(s) < 0) return -1;
  size_t i = slot_of(s, p);
  while (s->slots[i]) {
    if (s->slots[i] == p) return 0;
    i = (i + 1) & (s->cap - 1);
  }
  s->slots[i] = p;
  s->count++;
  return 0;
}

static size_t find(const struct ptrset *s, const void *p) {
  if (!s->cap || !p) return SIZE_MAX;
  for (size_t i = slot_of(s, p); s->slots[i]; i = (i + 1) & (s->cap - 1))
    if (s->slots[i] == p) return i;
  return SIZE_MAX;
}

bool ptrset_has(const struct ptrset *s, const void *p) { return find(s, p) != SIZE_MAX; }

bool ptrset_del(struct ptrset *s, const void *p) {
  size_t i = find(s, p);
  if (i == SIZE_MAX) return false;
  s->slots[i] = NULL;
  s->count--;
  /* Pull later entries of the probe run back over the hole. */
  for (size_t j = (i + 1) & (s->cap - 1); s->slots[j]; j = (j + 1) & (s->cap - 1)) {
    size_t home = slot_of(s, s->slots[j]);
    if (((j - home) & (s->cap - 1)) >= ((j - i) & (s->cap - 1))) {
      s->slots[i] = s->slots[j];
      s->slots[j] = NULL;
      i = j;
    }
  }
  return true;
}

void ptrset_free(struct ptrset *s) {
  free(s->slots);
  s->slots = NULL;
  s->cap = s->count = 0;
}
