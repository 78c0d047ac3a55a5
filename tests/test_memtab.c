/* test_memtab: util/memtab, the sorted table of non-overlapping ranges every transfer
 * looks its ops up in: add (overlaps refused, where an end is 2^64 too), find (the
 * whole range inside one entry, ranges across two entries, at the edges, of length 0,
 * wrapping past 2^64), and memtab_find_near, which tries the previous op's entry first
 * and must answer exactly as memtab_find does for every hint, inside or not, on every
 * range tried, and memtab_hot, which tries the entry it found last: the same answers,
 * and never an entry removed since, even at the address it was found at. */
#include "util/memtab.h"

#include "test_util.h"

#include <CUnit/Basic.h>
#include <stdlib.h>

#define N 5

static struct memtab_entry ents[N] = {
    {0x1000, 0x1000}, {0x2000, 0x1000}, {0x8000, 0x100}, {~0ull - 0x1ff, 0x100}, {~0ull - 0xff, 0x100}};

/* The lengths and the addresses the sweeps try: each entry's start and end, 2 either side. */
static const uint64_t lens[] = {0, 1, 2, 0xff, 0x100, 0x101, 0x1000, 0x1001, 0x2000, ~0ull};
#define NLENS (sizeof(lens) / sizeof(lens[0]))

static uint64_t sweep_addr(int i, int64_t d, int end) {
  return (end ? ents[i].addr + ents[i].len : ents[i].addr) + (uint64_t)d;
}

static void table_up(struct memtab *t) {
  struct memtab_entry *clash;
  *t = (struct memtab){0};
  for (int i = N - 1; i >= 0; i--) CU_ASSERT_EQUAL(memtab_add(t, &ents[i], &clash), 0);
}

static void test_add_find(void) {
  struct memtab t;
  struct memtab_entry over = {0x1800, 0x1000}, *clash = NULL;
  table_up(&t);
  CU_ASSERT_EQUAL(t.count, N);
  CU_ASSERT_EQUAL(memtab_add(&t, &over, &clash), -1);
  CU_ASSERT_PTR_EQUAL(clash, &ents[0]);
  CU_ASSERT_PTR_EQUAL(memtab_find(&t, 0x1000, 0x1000), &ents[0]);
  CU_ASSERT_PTR_EQUAL(memtab_find(&t, 0x1fff, 1), &ents[0]);
  CU_ASSERT_PTR_EQUAL(memtab_find(&t, 0x2000, 1), &ents[1]);
  CU_ASSERT_PTR_NULL(memtab_find(&t, 0x1fff, 2)); /* across two entries, adjacent as they are */
  CU_ASSERT_PTR_NULL(memtab_find(&t, 0x1000, 0));
  CU_ASSERT_PTR_NULL(memtab_find(&t, 0xfff, 2));
  CU_ASSERT_PTR_NULL(memtab_find(&t, 0x8000, 0x101));
  CU_ASSERT_PTR_EQUAL(memtab_find(&t, ~0ull - 0x1ff, 0x100), &ents[3]);
  CU_ASSERT_PTR_NULL(memtab_find(&t, ~0ull, 2));           /* wraps */
  CU_ASSERT_PTR_NULL(memtab_find(&t, ~0ull - 0xff, 0x10)); /* an entry ending at 2^64: its end wraps */
  memtab_free(&t);
}

/* Overlaps where an end is 2^64 (its sum wraps to 0): refused like any other, whether the
 * entry in the table ends there or the one added does. */
static void test_add_at_top(void) {
  struct memtab t;
  struct memtab_entry inside = {~0ull - 0x7f, 0x10}, tail = {~0ull - 0x1ff + 0x80, 0x100};
  struct memtab_entry to_top = {0x800, 0ull - 0x800}, *clash = NULL;
  table_up(&t);
  CU_ASSERT_EQUAL(memtab_add(&t, &inside, &clash), -1); /* inside ents[4], which ends at 2^64 */
  CU_ASSERT_PTR_EQUAL(clash, &ents[4]);
  clash = NULL;
  CU_ASSERT_EQUAL(memtab_add(&t, &tail, &clash), -1); /* ents[3]'s tail and ents[4]'s head */
  CU_ASSERT_PTR_EQUAL(clash, &ents[3]);
  clash = NULL;
  CU_ASSERT_EQUAL(memtab_add(&t, &to_top, &clash), -1); /* ends at 2^64, over every entry */
  CU_ASSERT_PTR_EQUAL(clash, &ents[0]);
  CU_ASSERT_EQUAL(t.count, N);
  memtab_free(&t);
  t = (struct memtab){0};
  CU_ASSERT_EQUAL(memtab_add(&t, &ents[2], &clash), 0);
  CU_ASSERT_EQUAL(memtab_add(&t, &to_top, &clash), -1); /* starts below ents[2], ends at 2^64 */
  CU_ASSERT_PTR_EQUAL(clash, &ents[2]);
  CU_ASSERT_EQUAL(memtab_add(&t, &ents[4], &clash), 0);
  CU_ASSERT_EQUAL(memtab_add(&t, &inside, &clash), -1); /* the last entry ends at 2^64 */
  CU_ASSERT_PTR_EQUAL(clash, &ents[4]);
  CU_ASSERT_EQUAL(t.count, 2);
  memtab_free(&t);
}

/* Every hint (none, each entry) against ranges at and around every entry's edges. */
static void test_near_agrees(void) {
  struct memtab t;
  size_t tried = 0, hits = 0;
  table_up(&t);
  for (int h = -1; h < N; h++)
    for (int i = 0; i < N; i++)
      for (int64_t d = -2; d <= 2; d++)
        for (int end = 0; end < 2; end++)
          for (size_t k = 0; k < NLENS; k++) {
            uint64_t addr = sweep_addr(i, d, end);
            struct memtab_entry *want = memtab_find(&t, addr, lens[k]);
            struct memtab_entry *got = memtab_find_near(&t, h < 0 ? NULL : &ents[h], addr, lens[k]);
            CU_ASSERT_PTR_EQUAL(got, want);
            tried++;
            hits += want != NULL;
          }
  CU_ASSERT(hits > 0 && hits < tried);
  memtab_free(&t);
}

/* After each find of every range of test_near_agrees, in turn: the same answer as
 * memtab_find, the last hit kept; then each entry removed while it is the one kept. */
static void test_hot(void) {
  struct memtab t;
  size_t hits = 0;
  table_up(&t);
  CU_ASSERT_PTR_NULL(t.last);
  for (int i = 0; i < N; i++)
    for (int64_t d = -2; d <= 2; d++)
      for (int end = 0; end < 2; end++)
        for (size_t k = 0; k < NLENS; k++) {
          uint64_t addr = sweep_addr(i, d, end);
          struct memtab_entry *was = t.last, *want = memtab_find(&t, addr, lens[k]);
          CU_ASSERT_PTR_EQUAL(memtab_hot(&t, addr, lens[k]), want);
          CU_ASSERT_PTR_EQUAL(t.last, want ? want : was); /* a miss keeps the last hit */
          hits += want != NULL;
        }
  CU_ASSERT(hits > 0);
  int kept = 0;
  for (int i = 0; i < N; i++) { /* (the last entry ends at 2^64: found by neither) */
    struct memtab_entry *want = memtab_find(&t, ents[i].addr, 1);
    CU_ASSERT_PTR_EQUAL(memtab_hot(&t, ents[i].addr, 1), want);
    kept += want && t.last == &ents[i];
    CU_ASSERT(memtab_remove(&t, &ents[i]));
    CU_ASSERT_PTR_NULL(memtab_hot(&t, ents[i].addr, 1)); /* gone, though it was the one kept */
    CU_ASSERT_PTR_NULL(memtab_find(&t, ents[i].addr, 1));
  }
  CU_ASSERT_EQUAL(kept, N - 1);
  CU_ASSERT_EQUAL(t.count, 0);
  memtab_free(&t);
}

int main(void) {
  static CU_TestInfo tests[] = {
      {"add refuses overlaps; find at the edges", test_add_find},
      {"add refuses overlaps at 2^64", test_add_at_top},
      {"find_near answers as find, whatever the hint", test_near_agrees},
      {"hot answers as find, and forgets a removed entry", test_hot},
      CU_TEST_INFO_NULL,
  };
  CU_SuiteInfo suites[] = {{"memtab", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_memtab", suites);
}
