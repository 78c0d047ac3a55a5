/* test_grant: engine/grant.c, the ranges each peer of a scoped engine may reach, against a
 * model of one count per 4 KiB unit. Grants may overlap each other and what is held (the
 * plugin grants runs of blocks, which two requests may share in part): a byte is granted
 * while a grant holding it is not revoked. A revoke names a range granted before; one
 * over a byte no grant holds is PARAM_INVALID and changes nothing. Thousands of random
 * grants and revokes (a fixed seed), every unit and random spans checked after each, then
 * everything revoked: no piece, no set left. */
#include <CUnit/Basic.h>
#include <stdlib.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "test_util.h"

#define UNITS 96
#define UNIT  4096u
#define BASE  0x7f0000000000ull
#define LIVE  256 /* grants held at most */
#define PEER  "10.1.2.3:4"

static HixlEngine *e;
static unsigned counts[UNITS]; /* the model: grants holding each unit */
static uint64_t live[LIVE][2]; /* the ranges granted and not revoked, in units */
static size_t nlive;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) { /* xorshift64 */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static bool covers(uint64_t u0, uint64_t u1) { /* the engine's answer for units [u0, u1) */
  pthread_mutex_lock(&e->lock);
  bool c = grant_covers(grant_set_of(e, PEER, false), BASE + u0 * UNIT, (u1 - u0) * UNIT);
  pthread_mutex_unlock(&e->lock);
  return c;
}

/* Unit i covered exactly where mask[i] is '1'. */
static void expect(const char *mask, const char *when) {
  for (uint64_t u = 0; mask[u]; u++)
    if (covers(u, u + 1) != (mask[u] == '1')) {
      tu_fail(__FILE__, __LINE__, "%s: unit %llu covered %d, want %c (%s)", when, (unsigned long long)u,
              covers(u, u + 1), mask[u], mask);
      return;
    }
  CU_PASS(when);
}

static size_t pieces(void) { /* what the engine counts for PEER */
  size_t n = 99999;
  TU_ASSERT_OK(hixl_engine_grant_stats(e, PEER, &n, NULL));
  return n;
}

static bool model(uint64_t u0, uint64_t u1) {
  for (uint64_t u = u0; u < u1; u++)
    if (!counts[u]) return false;
  return true;
}

/* Every unit, and spans across pieces, as the model says; failures counted once an op. */
static void check(const char *after, int op) {
  for (uint64_t u = 0; u < UNITS; u++)
    if (covers(u, u + 1) != (counts[u] > 0)) {
      tu_fail(__FILE__, __LINE__, "op %d (%s): unit %llu covered %d, held by %u grants", op, after,
              (unsigned long long)u, covers(u, u + 1), counts[u]);
      return;
    }
  for (int k = 0; k < 16; k++) {
    uint64_t u0 = next() % UNITS, u1 = u0 + 1 + next() % (UNITS - u0);
    if (covers(u0, u1) != model(u0, u1)) {
      tu_fail(__FILE__, __LINE__, "op %d (%s): units [%llu, %llu) covered %d, the model says %d", op, after,
              (unsigned long long)u0, (unsigned long long)u1, covers(u0, u1), model(u0, u1));
      return;
    }
  }
  CU_PASS("as the model");
}

static void add_units(uint64_t u0, uint64_t u1, int d) {
  for (uint64_t u = u0; u < u1; u++) counts[u] = (unsigned)((int)counts[u] + d);
}

static void test_random_against_model(void) {
  uint64_t r[4][2];
  for (int op = 0; op < 4000; op++) {
    unsigned kind = (unsigned)(next() % 10);
    if (kind < 5 && nlive + 4 <= LIVE) { /* grant 1 to 4 ranges, overlapping at will */
      size_t n = 1 + next() % 4;
      for (size_t i = 0; i < n; i++) {
        uint64_t u0 = next() % UNITS, u1 = u0 + 1 + next() % (UNITS - u0 < 12 ? UNITS - u0 : 12);
        r[i][0] = BASE + u0 * UNIT, r[i][1] = (u1 - u0) * UNIT;
      }
      TU_ASSERT_OK(hixl_engine_grant(e, PEER, (const uint64_t(*)[2])r, n));
      for (size_t i = 0; i < n; i++) {
        uint64_t u0 = (r[i][0] - BASE) / UNIT, u1 = u0 + r[i][1] / UNIT;
        add_units(u0, u1, 1);
        live[nlive][0] = u0, live[nlive++][1] = u1;
      }
      check("grant", op);
    } else if (kind < 9 && nlive > 0) { /* revoke 1 or 2 ranges granted */
      size_t n = nlive > 1 && next() % 2 ? 2 : 1;
      for (size_t i = 0; i < n; i++) {
        size_t j = next() % nlive;
        r[i][0] = BASE + live[j][0] * UNIT, r[i][1] = (live[j][1] - live[j][0]) * UNIT;
        add_units(live[j][0], live[j][1], -1);
        live[j][0] = live[nlive - 1][0], live[j][1] = live[--nlive][1];
      }
      TU_ASSERT_OK(hixl_engine_revoke(e, PEER, (const uint64_t(*)[2])r, n));
      check("revoke", op);
    } else { /* revoke a span over a unit nobody holds: refused, nothing changed */
      uint64_t u = next() % UNITS;
      if (counts[u]) continue;
      uint64_t u0 = u > 0 && next() % 2 ? u - 1 : u;
      r[0][0] = BASE + u0 * UNIT, r[0][1] = (u + 1 - u0) * UNIT;
      TU_ASSERT_STATUS(hixl_engine_revoke(e, PEER, (const uint64_t(*)[2])r, 1), HIXL_PARAM_INVALID);
      TU_ASSERT_ERRMSG_HAS("not granted");
      check("a revoke refused", op);
    }
  }
  /* A piece of a granted range is not a range granted (when nothing else cuts it there). */
  while (nlive > 0) { /* everything back, then nothing left */
    r[0][0] = BASE + live[nlive - 1][0] * UNIT, r[0][1] = (live[nlive - 1][1] - live[nlive - 1][0]) * UNIT;
    add_units(live[nlive - 1][0], live[nlive - 1][1], -1);
    nlive--;
    TU_ASSERT_OK(hixl_engine_revoke(e, PEER, (const uint64_t(*)[2])r, 1));
  }
  size_t peers = 99;
  TU_ASSERT_OK(hixl_engine_grant_peers(e, &peers));
  CU_ASSERT_EQUAL(pieces(), 0);
  CU_ASSERT_EQUAL(peers, 0);
}

/* Two overlapping runs and a block both share: the pieces, and what each revoke leaves. */
static void test_runs_shared(void) {
  const uint64_t a[1][2] = {{BASE, 4 * UNIT}},
                 b[2][2] = {{BASE + 2 * UNIT, 4 * UNIT}, {BASE + 3 * UNIT, UNIT}};
  const uint64_t part[1][2] = {{BASE + UNIT, UNIT}};
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, a, 1));
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, b, 2)); /* b overlaps itself too */
  CU_ASSERT_EQUAL(pieces(), 4); /* [0, 2) held once, [2, 3) twice, [3, 4) three times, [4, 6) once */
  TU_ASSERT_STATUS(hixl_engine_revoke(e, PEER, part, 1), HIXL_PARAM_INVALID); /* inside a piece */
  expect("111111", "both runs");
  CU_ASSERT_TRUE(covers(0, 6));
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, a, 1));
  expect("0011110", "the first revoked");
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, b, 2));
  expect("000000", "both revoked");
  CU_ASSERT_EQUAL(pieces(), 0);
}

/* Three pieces with gaps between, then one range over all of them and beyond: seven
 * pieces, more than the set's and the batch's ranges together. */
static void test_range_over_gaps(void) {
  const uint64_t p[3][2] = {{BASE + UNIT, UNIT}, {BASE + 3 * UNIT, UNIT}, {BASE + 5 * UNIT, UNIT}};
  const uint64_t all[1][2] = {{BASE, 7 * UNIT}};
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, p, 3));
  expect("0101010", "three apart");
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, all, 1));
  CU_ASSERT_EQUAL(pieces(), 7);
  CU_ASSERT_TRUE(covers(0, 7));
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, all, 1));
  expect("01010100", "the range over them revoked");
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, p, 3));
  CU_ASSERT_EQUAL(pieces(), 0);
}

/* A range that ends at the last byte of the address space (2^64 - 1): granted, covered,
 * revoked like any other. */
static void test_top_of_memory(void) {
  const uint64_t top[1][2] = {{UINT64_MAX - 2 * UNIT, 2 * UNIT}}, half[1][2] = {{UINT64_MAX - UNIT, UNIT}};
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, top, 1));
  TU_ASSERT_OK(hixl_engine_grant(e, PEER, half, 1));
  CU_ASSERT_EQUAL(pieces(), 2);
  pthread_mutex_lock(&e->lock);
  CU_ASSERT_TRUE(grant_covers(grant_set_of(e, PEER, false), UINT64_MAX - 2 * UNIT, 2 * UNIT));
  pthread_mutex_unlock(&e->lock);
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, top, 1));
  TU_ASSERT_OK(hixl_engine_revoke(e, PEER, half, 1));
  CU_ASSERT_EQUAL(pieces(), 0);
}

static int suite_up(void) {
  char addr[64];
  e = tu_engine_start(tu_addr(addr, sizeof(addr), tu_free_port()));
  return e && hixl_engine_set_scoped(e, true) == HIXL_SUCCESS ? 0 : 1;
}

static int suite_down(void) {
  HixlEngineDestroy(e);
  return 0;
}

int main(void) {
  CU_TestInfo tests[] = {
      {"one range over three pieces and the gaps between", test_range_over_gaps},
      {"a range ending at the last byte of the address space", test_top_of_memory},
      {"two runs sharing blocks: pieces, revokes of what was granted", test_runs_shared},
      {"4000 random overlapping grants and revokes against a count per unit", test_random_against_model},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"grant", suite_up, suite_down, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_grant", suites);
}
