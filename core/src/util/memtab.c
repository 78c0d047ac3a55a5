/* memtab: sorted array; registrations change rarely, lookups happen per op. */
#include "util/memtab.h"

#include <stdlib.h>
#include <string.h>

/* Index of the first entry with addr > key. */
static size_t upper_bound(const struct memtab *t, uint64_t key) {
  size_t lo = 0, hi = t->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->v[mid]->addr <= key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

size_t memtab_upper(const void *base, size_t n, size_t stride, uint64_t key) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    uint64_t addr;
    memcpy(&addr, (const uint8_t *)base + mid * stride, sizeof(addr));
    if (addr <= key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int memtab_add(struct memtab *t, struct memtab_entry *e, struct memtab_entry **clash) {
  size_t i = upper_bound(t, e->addr);
  *clash = NULL;
  /* Offsets from the lower start, not ends: an end at 2^64 wraps to 0 and hid the overlap. */
  if (i > 0 && e->addr - t->v[i - 1]->addr < t->v[i - 1]->len) {
    *clash = t->v[i - 1];
    return -1;
  }
  if (i < t->count && t->v[i]->addr - e->addr < e->len) {
    *clash = t->v[i];
    return -1;
  }
  if (t->count == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    struct memtab_entry **nv = realloc(t->v, cap * sizeof(*nv));
    if (!nv) return -1;
    t->v = nv;
    t->cap = cap;
  }
  memmove(&t->v[i + 1], &t->v[i], (t->count - i) * sizeof(*t->v));
  t->v[i] = e;
  t->count++;
  return 0;
}

struct memtab_entry *memtab_find(const struct memtab *t, uint64_t addr, uint64_t len) {
  size_t i = upper_bound(t, addr);
  if (i == 0 || len == 0 || addr + len < addr) return NULL;
  struct memtab_entry *e = t->v[i - 1];
  return addr + len <= e->addr + e->len ? e : NULL;
}

struct memtab_entry *memtab_find_exact(const struct memtab *t, uint64_t addr, uint64_t len) {
  size_t i = upper_bound(t, addr);
  if (i == 0) return NULL;
  struct memtab_entry *e = t->v[i - 1];
  return e->addr == addr && e->len == len ? e : NULL;
}

bool memtab_remove(struct memtab *t, struct memtab_entry *e) {
  size_t i = upper_bound(t, e->addr);
  if (i == 0 || t->v[i - 1] != e) return false;
  if (t->last == e) t->last = NULL;
  memmove(&t->v[i - 1], &t->v[i], (t->count - i) * sizeof(*t->v));
  t->count--;
  return true;
}

void memtab_free(struct memtab *t) {
  free(t->v);
  memset(t, 0, sizeof(*t));
}
