/* memtab: a sorted table of non-overlapping address ranges with O(log n) lookup.
 * Used for local registrations and for each peer's advertised table. */
#ifndef HIXL_MEMTAB_H
#define HIXL_MEMTAB_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct memtab_entry {
  uint64_t addr;
  uint64_t len;
};

struct memtab {
  struct memtab_entry **v; /* sorted by addr; entries owned by the caller */
  size_t count;
  size_t cap;
  struct memtab_entry *last; /* what memtab_hot found last (an entry of v), or NULL */
};

/* 0, or -1 when e overlaps an entry (*clash set) or memory runs out (*clash NULL). */
int memtab_add(struct memtab *t, struct memtab_entry *e, struct memtab_entry **clash);
/* The entry holding all of [addr, addr+len), or NULL. */
struct memtab_entry *memtab_find(const struct memtab *t, uint64_t addr, uint64_t len);
/* memtab_find, trying hint first (an entry of t: the one the op before found, as a
 * batch's ops mostly fall in one registration; entries never overlap, so an entry
 * holding the range is the one memtab_find would return). */
static inline struct memtab_entry *memtab_find_near(const struct memtab *t, const struct memtab_entry *hint,
                                                    uint64_t addr, uint64_t len) {
  /* memtab_find's own arithmetic, so both answer alike even at 2^64 */
  if (hint && len > 0 && addr + len > addr && addr >= hint->addr && addr + len <= hint->addr + hint->len)
    return (struct memtab_entry *)hint;
  return memtab_find(t, addr, len);
}
/* memtab_find, trying first the entry the last memtab_hot on t found: a call's op mostly
 * falls where the call before's did (~5% of a same-host 4 KiB op, the table searched
 * three times a call). It writes t: only for tables whose finds one lock serializes. */
static inline struct memtab_entry *memtab_hot(struct memtab *t, uint64_t addr, uint64_t len) {
  struct memtab_entry *e = memtab_find_near(t, t->last, addr, len);
  if (e) t->last = e;
  return e;
}
/* The entry that starts at addr with length len exactly, or NULL. */
struct memtab_entry *memtab_find_exact(const struct memtab *t, uint64_t addr, uint64_t len);
bool memtab_remove(struct memtab *t, struct memtab_entry *e);
void memtab_free(struct memtab *t); /* frees the array, not the entries */

/* In an array of n records of stride bytes, sorted by a uint64_t address at their
 * start (grants, RDMA windows): the index of the first whose address is > key. */
size_t memtab_upper(const void *base, size_t n, size_t stride, uint64_t key);

#endif
