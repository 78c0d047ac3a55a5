/* test_kv_util: the plugin's hashed sets of ids (plugin/src/kv_util.c, struct
 * kv_idhash), white-box: add, has, del, values, the order entries are forgotten in at a
 * bound, get and touch and a walk, ids that land in one bucket, many ids, the table
 * shrinking after a burst; and the two lists built on them in kv_util.c: the "gone" ids
 * (KV_GONE_MAX, oldest forgotten first, an id that ended twice counted twice, as the
 * list it replaced) and the unreachable peers (KV_UNREACH_MAX). */
#include <CUnit/Basic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"
#include "test_util.h"

static const char *idf(char *buf, size_t cap, const char *prefix, unsigned i) {
  snprintf(buf, cap, "%s-%u", prefix, i);
  return buf;
}

static void test_add_has_del(void) {
  struct kv_idhash s = {0};
  CU_ASSERT_FALSE(kv_idhash_has(&s, "a"));
  CU_ASSERT_FALSE(kv_idhash_del(&s, "a", NULL)); /* empty, no buckets yet */
  int va = 1, vb = 2, vb2 = 3;
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "a", &va, 10, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "b", &vb, 10, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "b", &vb2, 10, NULL), 0); /* twice: two entries */
  CU_ASSERT_EQUAL(s.n, 3);
  CU_ASSERT_TRUE(kv_idhash_has(&s, "a"));
  CU_ASSERT_TRUE(kv_idhash_has(&s, "b"));
  CU_ASSERT_FALSE(kv_idhash_has(&s, "c"));
  CU_ASSERT_FALSE(kv_idhash_has(&s, "ab"));
  void *v = NULL;
  CU_ASSERT_TRUE(kv_idhash_del(&s, "b", &v));
  CU_ASSERT_PTR_EQUAL(v, &vb2); /* the newest first */
  CU_ASSERT_TRUE(kv_idhash_has(&s, "b"));
  CU_ASSERT_TRUE(kv_idhash_del(&s, "b", &v));
  CU_ASSERT_PTR_EQUAL(v, &vb);
  CU_ASSERT_FALSE(kv_idhash_has(&s, "b"));
  CU_ASSERT_FALSE(kv_idhash_del(&s, "b", &v));
  CU_ASSERT_EQUAL(s.n, 1);
  CU_ASSERT_TRUE(kv_idhash_del(&s, "a", NULL));
  CU_ASSERT_EQUAL(s.n, 0);
  CU_ASSERT_PTR_NULL(s.oldest);
  CU_ASSERT_PTR_NULL(s.newest);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "a", NULL, 10, NULL), 0); /* usable again once empty */
  CU_ASSERT_TRUE(kv_idhash_has(&s, "a"));
  kv_idhash_clear(&s, NULL);
  CU_ASSERT_EQUAL(s.n, 0);
  CU_ASSERT_FALSE(kv_idhash_has(&s, "a"));
}

static int freed;
static void count_free(void *v) {
  freed++;
  free(v);
}

/* At the bound the oldest entry goes, its value handed back; entries deleted in the
 * middle leave the order of the rest as it was. */
static void test_bound_order_values(void) {
  struct kv_idhash s = {0};
  char id[32];
  int *v[6];
  for (unsigned i = 0; i < 6; i++) {
    v[i] = malloc(sizeof(int));
    *v[i] = (int)i;
  }
  void *old = &old;
  for (unsigned i = 0; i < 4; i++) {
    CU_ASSERT_EQUAL(kv_idhash_add(&s, idf(id, sizeof(id), "v", i), v[i], 4, &old), 0);
    CU_ASSERT_PTR_NULL(old);
  }
  CU_ASSERT_TRUE(kv_idhash_del(&s, "v-1", &old)); /* the order now: 0 2 3 */
  CU_ASSERT_PTR_EQUAL(old, v[1]);
  free(v[1]);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "v-4", v[4], 4, &old), 0); /* 0 2 3 4: at the bound, nothing went */
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "v-5", v[5], 4, &old), 1); /* 2 3 4 5 */
  CU_ASSERT_PTR_EQUAL(old, v[0]);
  free(v[0]);
  CU_ASSERT_EQUAL(s.evicted, 1);
  CU_ASSERT_FALSE(kv_idhash_has(&s, "v-0"));
  CU_ASSERT_TRUE(kv_idhash_has(&s, "v-2") && kv_idhash_has(&s, "v-5"));
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "w", NULL, 4, &old), 1); /* 3 4 5 w */
  CU_ASSERT_PTR_EQUAL(old, v[2]);
  free(v[2]);
  CU_ASSERT_FALSE(kv_idhash_has(&s, "v-2"));
  CU_ASSERT_EQUAL(s.n, 4);
  freed = 0;
  kv_idhash_clear(&s, count_free); /* v-3, v-4, v-5 and w's NULL */
  CU_ASSERT_EQUAL(freed, 4);
}

/* get hands back the newest entry's value; touch makes an entry the newest (a renewed
 * lease, kv_service.c), so it is forgotten last; a walk goes newest to oldest. */
static void test_get_touch_walk(void) {
  struct kv_idhash s = {0};
  int v[4];
  void *got = &got;
  CU_ASSERT_FALSE(kv_idhash_get(&s, "a", &got));
  CU_ASSERT_FALSE(kv_idhash_touch(&s, "a")); /* empty, no buckets yet */
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "a", &v[0], 3, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "b", &v[1], 3, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "c", &v[2], 3, NULL), 0);
  CU_ASSERT_TRUE(kv_idhash_get(&s, "b", &got));
  CU_ASSERT_PTR_EQUAL(got, &v[1]);
  CU_ASSERT_FALSE(kv_idhash_get(&s, "d", &got));
  CU_ASSERT_PTR_EQUAL(got, &v[1]);          /* written only on success */
  CU_ASSERT_TRUE(kv_idhash_touch(&s, "a")); /* the oldest becomes the newest: b c a */
  CU_ASSERT_TRUE(kv_idhash_touch(&s, "a")); /* the newest already */
  CU_ASSERT_TRUE(kv_idhash_touch(&s, "c")); /* the middle: b a c */
  CU_ASSERT_FALSE(kv_idhash_touch(&s, "d"));
  const char *want[] = {"c", "a", "b"};
  const int *wantv[] = {&v[2], &v[0], &v[1]};
  unsigned i = 0;
  for (const struct kv_idnode *x = s.newest; x; x = kv_idnode_older(x), i++) {
    CU_ASSERT_FATAL(i < 3);
    CU_ASSERT_STRING_EQUAL(kv_idnode_id(x), want[i]);
    CU_ASSERT_PTR_EQUAL(kv_idnode_val(x), wantv[i]);
  }
  CU_ASSERT_EQUAL(i, 3);
  CU_ASSERT_PTR_EQUAL(kv_idnode_val(s.oldest), &v[1]);
  void *old = NULL;
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "d", &v[3], 3, &old), 1); /* at the bound: b, the oldest, goes */
  CU_ASSERT_PTR_EQUAL(old, &v[1]);
  CU_ASSERT_FALSE(kv_idhash_has(&s, "b"));
  CU_ASSERT_TRUE(kv_idhash_has(&s, "a") && kv_idhash_has(&s, "c") && kv_idhash_has(&s, "d"));
  kv_idhash_clear(&s, NULL);
}

/* Ids that share a bucket (the low 10 bits of their hash: one bucket up to 1024 of
 * them): each found by its own text, deleted from the head, the middle and the tail of
 * its chain, forgotten oldest first at the bound. */
#define NCOL 8
static void test_collisions(void) {
  struct kv_idhash s = {0};
  CU_ASSERT_EQUAL_FATAL(kv_idhash_add(&s, "seed", NULL, 64, NULL), 0); /* the set's seed is drawn */
  CU_ASSERT_TRUE_FATAL(kv_idhash_del(&s, "seed", NULL));
  char col[NCOL + 1][32], other[32] = "";
  uint64_t want = kv_idhash_hash(&s, "c-0") & 1023;
  snprintf(col[0], sizeof(col[0]), "c-0");
  unsigned n = 1;
  for (unsigned i = 1; n < NCOL + 1 && i < 10000000; i++) {
    char id[32];
    idf(id, sizeof(id), "c", i);
    if ((kv_idhash_hash(&s, id) & 1023) == want) snprintf(col[n++], sizeof(col[0]), "%s", id);
  }
  CU_ASSERT_EQUAL_FATAL(n, NCOL + 1);
  /* The last one is never added: a miss that walks the whole chain. */
  for (unsigned i = 0; i < NCOL; i++) CU_ASSERT_EQUAL(kv_idhash_add(&s, col[i], NULL, NCOL, NULL), 0);
  CU_ASSERT_EQUAL(s.nb, 16); /* one bucket holds them all */
  for (unsigned i = 0; i < NCOL; i++) CU_ASSERT_TRUE(kv_idhash_has(&s, col[i]));
  CU_ASSERT_FALSE(kv_idhash_has(&s, col[NCOL]));
  /* The chain is newest first: delete its head (7), its tail (0), its middle (3). */
  CU_ASSERT_TRUE(kv_idhash_del(&s, col[7], NULL));
  CU_ASSERT_TRUE(kv_idhash_del(&s, col[0], NULL));
  CU_ASSERT_TRUE(kv_idhash_del(&s, col[3], NULL));
  for (unsigned i = 0; i < NCOL; i++) CU_ASSERT_EQUAL(kv_idhash_has(&s, col[i]), i != 0 && i != 3 && i != 7);
  CU_ASSERT_EQUAL(s.n, NCOL - 3);
  /* Back to the bound (order 1 2 4 5 6 then 8 0 3), then one more: 1 goes, then 2. */
  CU_ASSERT_EQUAL(kv_idhash_add(&s, col[8], NULL, NCOL, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, col[0], NULL, NCOL, NULL), 0);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, col[3], NULL, NCOL, NULL), 0);
  snprintf(other, sizeof(other), "%s", col[7]);
  CU_ASSERT_EQUAL(kv_idhash_add(&s, other, NULL, NCOL, NULL), 1);
  CU_ASSERT_FALSE(kv_idhash_has(&s, col[1]));
  CU_ASSERT_TRUE(kv_idhash_has(&s, col[2]));
  CU_ASSERT_EQUAL(kv_idhash_add(&s, "not-colliding", NULL, NCOL, NULL), 1);
  CU_ASSERT_FALSE(kv_idhash_has(&s, col[2]));
  for (unsigned i = 0; i <= NCOL; i++) CU_ASSERT_EQUAL(kv_idhash_has(&s, col[i]), i != 1 && i != 2);
  CU_ASSERT_EQUAL(s.n, NCOL);
  kv_idhash_clear(&s, NULL);
}

/* Many ids with no bound in reach: every one found, half deleted, the rest found. */
static void test_many(void) {
  struct kv_idhash s = {0};
  char id[32];
  const unsigned n = 200000;
  for (unsigned i = 0; i < n; i++)
    CU_ASSERT_EQUAL(kv_idhash_add(&s, idf(id, sizeof(id), "m", i), NULL, n, NULL), 0);
  CU_ASSERT_EQUAL(s.n, n);
  CU_ASSERT(s.nb >= n); /* at most one entry per bucket on average */
  unsigned found = 0;
  for (unsigned i = 0; i < n; i++) found += kv_idhash_has(&s, idf(id, sizeof(id), "m", i));
  CU_ASSERT_EQUAL(found, n);
  for (unsigned i = 0; i < n; i += 2) CU_ASSERT_TRUE(kv_idhash_del(&s, idf(id, sizeof(id), "m", i), NULL));
  found = 0;
  for (unsigned i = 0; i < n; i++) found += kv_idhash_has(&s, idf(id, sizeof(id), "m", i)) == (i % 2 == 1);
  CU_ASSERT_EQUAL(found, n);
  CU_ASSERT_EQUAL(s.n, n / 2);
  kv_idhash_clear(&s, NULL);
}

/* After a burst the table shrinks: a delete that leaves fewer than one entry per 8
 * buckets halves them (never below 16), so a set that held many ids and now holds few
 * is small again (before, it kept its largest table for good); the entries left are
 * found, in their order, and adding grows it as before. */
static void test_shrink(void) {
  struct kv_idhash s = {0};
  char id[32];
  const unsigned n = 100000;
  for (int round = 0; round < 3; round++) {
    for (unsigned i = 0; i < n; i++)
      CU_ASSERT_EQUAL(kv_idhash_add(&s, idf(id, sizeof(id), "s", i), NULL, n, NULL), 0);
    CU_ASSERT(s.nb >= n);
    bool tight = true; /* at most 8 buckets per entry after each delete, or the initial 16 */
    for (unsigned i = 0; i < n; i++)
      if (i % 64) {
        CU_ASSERT_TRUE(kv_idhash_del(&s, idf(id, sizeof(id), "s", i), NULL));
        tight &= s.nb <= 16 || s.n >= s.nb / 8;
      }
    CU_ASSERT_TRUE(tight);
    CU_ASSERT_EQUAL(s.n, (n + 63) / 64);
    CU_ASSERT(s.nb <= 8 * s.n);
    unsigned found = 0;
    for (unsigned i = 0; i < n; i++) found += kv_idhash_has(&s, idf(id, sizeof(id), "s", i)) == (i % 64 == 0);
    CU_ASSERT_EQUAL(found, n);
    /* The order survived the rehash: at a bound of s.n, s-0 is the oldest and goes. */
    CU_ASSERT_EQUAL(kv_idhash_add(&s, "late", NULL, s.n, NULL), 1);
    CU_ASSERT_FALSE(kv_idhash_has(&s, "s-0"));
    CU_ASSERT_TRUE(kv_idhash_has(&s, "s-64"));
    CU_ASSERT_TRUE(kv_idhash_del(&s, "late", NULL));
    for (unsigned i = 64; i < n; i += 64)
      CU_ASSERT_TRUE(kv_idhash_del(&s, idf(id, sizeof(id), "s", i), NULL));
    CU_ASSERT_EQUAL(s.n, 0);
    CU_ASSERT_EQUAL(s.nb, 16);
  }
  kv_idhash_clear(&s, NULL);
}

/* The "gone" ids: the last KV_GONE_MAX that ended, oldest forgotten first, as the list
 * it replaced; an id that ended twice stays until its later ending is forgotten. */
static void test_gone(void) {
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  char id[32];
  kv_gone_add(c, "twice");
  for (unsigned i = 0; i < KV_GONE_MAX - 1; i++) kv_gone_add(c, idf(id, sizeof(id), "g", i));
  CU_ASSERT_EQUAL(c->gone.n, KV_GONE_MAX);
  CU_ASSERT_EQUAL(c->gone.evicted, 0);
  kv_gone_add(c, "twice"); /* its first ending is forgotten, its second kept */
  CU_ASSERT_TRUE(kv_idhash_has(&c->gone, "twice"));
  CU_ASSERT_TRUE(kv_idhash_has(&c->gone, "g-0"));
  kv_gone_add(c, "x"); /* g-0 goes */
  CU_ASSERT_FALSE(kv_idhash_has(&c->gone, "g-0"));
  CU_ASSERT_TRUE(kv_idhash_has(&c->gone, "g-1"));
  for (unsigned i = 0; i < 100; i++) kv_gone_add(c, idf(id, sizeof(id), "y", i)); /* g-1 .. g-100 go */
  unsigned kept = 0;
  for (unsigned i = 0; i < KV_GONE_MAX - 1; i++)
    kept += kv_idhash_has(&c->gone, idf(id, sizeof(id), "g", i)) == (i > 100);
  CU_ASSERT_EQUAL(kept, KV_GONE_MAX - 1);
  CU_ASSERT_EQUAL(c->gone.n, KV_GONE_MAX);
  CU_ASSERT_TRUE(kv_idhash_has(&c->gone, "twice"));
  /* A long-running server: 300,000 more endings; the last KV_GONE_MAX are remembered. */
  const unsigned more = 300000;
  for (unsigned i = 0; i < more; i++) kv_gone_add(c, idf(id, sizeof(id), "z", i));
  CU_ASSERT_EQUAL(c->gone.n, KV_GONE_MAX);
  CU_ASSERT_FALSE(kv_idhash_has(&c->gone, "twice"));
  CU_ASSERT_FALSE(kv_idhash_has(&c->gone, idf(id, sizeof(id), "z", more - KV_GONE_MAX - 1)));
  kept = 0;
  for (unsigned i = more - KV_GONE_MAX; i < more; i++)
    kept += kv_idhash_has(&c->gone, idf(id, sizeof(id), "z", i));
  CU_ASSERT_EQUAL(kept, KV_GONE_MAX);
  kv_idhash_clear(&c->gone, NULL);
  free(c);
}

/* Unreachable peers: one entry per peer, gone when a Link succeeds, at most
 * KV_UNREACH_MAX (the oldest forgotten first). Before the bound, the list grew with
 * every peer a request named. */
static void test_unreach(void) {
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  char peer[32];
  kv_unreach_note(c, "10.0.0.1:1", false);
  kv_unreach_note(c, "10.0.0.1:1", false);
  CU_ASSERT_EQUAL(c->unreach.n, 1);
  kv_unreach_note(c, "10.0.0.1:1", true);
  CU_ASSERT_EQUAL(c->unreach.n, 0);
  CU_ASSERT_FALSE(kv_idhash_has(&c->unreach, "10.0.0.1:1"));
  for (unsigned i = 0; i <= KV_UNREACH_MAX; i++) {
    snprintf(peer, sizeof(peer), "10.1.%u.%u:7000", i / 256, i % 256);
    kv_unreach_note(c, peer, false);
  }
  CU_ASSERT_EQUAL(c->unreach.n, KV_UNREACH_MAX);
  CU_ASSERT_EQUAL(c->unreach.evicted, 1);
  CU_ASSERT_FALSE(kv_idhash_has(&c->unreach, "10.1.0.0:7000"));
  CU_ASSERT_TRUE(kv_idhash_has(&c->unreach, "10.1.0.1:7000"));
  snprintf(peer, sizeof(peer), "10.1.%u.%u:7000", KV_UNREACH_MAX / 256, KV_UNREACH_MAX % 256);
  CU_ASSERT_TRUE(kv_idhash_has(&c->unreach, peer));
  kv_idhash_clear(&c->unreach, NULL);
  free(c);
}

int main(void) {
  CU_TestInfo tests[] = {{"add, has, del", test_add_has_del},
                         {"at the bound: oldest first, values handed back", test_bound_order_values},
                         {"get, touch, a walk newest to oldest", test_get_touch_walk},
                         {"ids in one bucket", test_collisions},
                         {"many ids", test_many},
                         {"shrinks after a burst", test_shrink},
                         {"gone ids: the last KV_GONE_MAX, oldest forgotten first", test_gone},
                         {"unreachable peers: one each, at most KV_UNREACH_MAX", test_unreach},
                         CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_util", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_util", suites);
}
