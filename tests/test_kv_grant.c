/* test_kv_grant: the plugin's grants (plugin/src/kv_grant.c), white-box, on a real
 * engine: a request's blocks are granted as one range per run of adjacent blocks and
 * plane when the plane's heads are adjacent (a PIN grants every range on the producer's
 * progress thread, between the reads it serves), one per block and head when they are
 * not; the revoke takes back exactly what was granted, and two requests that share a
 * block (inside one's run) count it twice, one of them given out of order; an
 * allocation that fails grants nothing or still revokes (the allocation failures of
 * hixl_kv_test, KV_ALLOC). The engine's count is of pieces: where any grant starts or
 * ends cuts them. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "test_util.h"

#define PEER     "127.0.0.1:1"
#define NB       16   /* blocks per plane */
#define HEADS    4    /* per block */
#define HEAD_LEN 1024 /* bytes of one head of one block */

static uint8_t mem[2 * NB * 2 * HEADS * HEAD_LEN]; /* room for the strided planes */

/* One group of two planes (a layer's K and V) of HEADS heads, block stride and head
 * stride as given. */
static void layout(hixl_kv_connector *c, struct kv_group *g, struct kv_plane *pl, uint64_t head_stride) {
  uint64_t stride = HEADS * head_stride;
  for (uint32_t p = 0; p < 2; p++)
    pl[p] = (struct kv_plane){.base = (uintptr_t)mem + p * NB * stride,
                              .stride = stride,
                              .bytes = HEADS * HEAD_LEN,
                              .head_stride = head_stride,
                              .heads = HEADS};
  *g = (struct kv_group){
      .nlayers = 1, .ppl = 2, .nplanes = 2, .num_blocks = NB, .kheads = HEADS, .planes = pl};
  static struct kv_plane_at by_base[2] = {{0, 0}, {0, 1}}; /* as kv_layout_build orders them */
  c->lay.g = g;
  c->lay.ng = 1;
  c->lay.nplanes = 2;
  c->lay.by_base = by_base;
}

static size_t granted(HixlEngine *e) {
  size_t n = 99999;
  TU_ASSERT_OK(hixl_engine_grant_stats(e, PEER, &n, NULL));
  return n;
}

/* A connector of one worker on a scoped engine, with a layout of one group of two
 * planes (connector_down ends both). */
static hixl_kv_connector *connector_up(struct kv_group *g, struct kv_plane *pl, uint64_t head_stride) {
  char addr[64];
  HixlEngine *e = tu_engine_start(tu_addr(addr, sizeof(addr), tu_free_port()));
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  TU_ASSERT_OK(hixl_engine_set_scoped(e, true));
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  pthread_mutex_init(&c->lock, NULL);
  c->eng = e;
  layout(c, g, pl, head_stride);
  return c;
}

static void connector_down(hixl_kv_connector *c) {
  kv_revq_free(c);
  pthread_mutex_destroy(&c->lock);
  HixlEngineDestroy(c->eng);
  free(c);
}

/* Revoke what s's peers were granted, as a FREE or an expiry does: queued under the
 * connector's lock, made without it. */
static void revoke(hixl_kv_connector *c, struct kv_peers *s) {
  pthread_mutex_lock(&c->lock);
  kv_peers_revoke(c, s);
  pthread_mutex_unlock(&c->lock);
  kv_revoke_flush(c);
}

/* Grant two requests' blocks (block 5 in both, at the end of a's run 3..5), then revoke
 * them: want the engine's pieces after a's grant, after b's and after a's revoke. */
static void grant_and_revoke(uint64_t head_stride, size_t after_a, size_t after_b, size_t after_revoke_a) {
  struct kv_group g;
  struct kv_plane pl[2];
  hixl_kv_connector *c = connector_up(&g, pl, head_stride);
  const uint64_t a[3] = {3, 4, 5}, b[2] = {9, 5}; /* b out of order: the grant sorts it */
  const uint32_t na = 3, nb = 2;
  struct kv_peers sa = {0}, sb = {0}; /* each request's peers */
  CU_ASSERT_TRUE(kv_peers_grant(c, &sa, PEER, a, &na, 1));
  CU_ASSERT_EQUAL(granted(c->eng), after_a);
  CU_ASSERT_TRUE(kv_peers_grant(c, &sb, PEER, b, &nb, 1));
  CU_ASSERT_EQUAL(granted(c->eng), after_b); /* block 5's pieces cut out of a's run, counted twice */
  revoke(c, &sa);
  CU_ASSERT_EQUAL(granted(c->eng), after_revoke_a); /* b's blocks, 5 and 9 */
  revoke(c, &sb);
  CU_ASSERT_EQUAL(granted(c->eng), 0);
  kv_peers_free(&sa);
  kv_peers_free(&sb);
  connector_down(c);
}

/* Adjacent heads (HND, packed): one range per run and plane (a: 3..5 in each of the two
 * planes; with b: 3..4, 5, 9; after a's revoke: 5, 9), not one per block or head. */
static void test_adjacent_heads_one_range(void) { grant_and_revoke(HEAD_LEN, 2, 3 * 2, 2 * 2); }

/* Heads apart (another rank's heads between them): one range per block and head. */
static void test_strided_heads_per_head(void) {
  grant_and_revoke(2 * HEAD_LEN, 3 * 2 * HEADS, 4 * 2 * HEADS, 2 * 2 * HEADS);
}

/* Each allocation of a grant, then of its revoke, fails in turn (issue 43). A grant
 * that cannot be made grants nothing; a grant made is revoked at its FREE whatever
 * fails then, so the peer never keeps blocks the host reuses. kv_revoke_later used to
 * allocate the ranges and the queue's room at the revoke, and when either failed it
 * logged "it stays until the engine ends" and dropped the revoke. */
static void test_allocation_fails(void) {
  const uint64_t a[3] = {3, 4, 5};
  const uint32_t na = 3;
  for (unsigned nth = 1; nth <= 3; nth++) {
    struct kv_group g;
    struct kv_plane pl[2];
    hixl_kv_connector *c = connector_up(&g, pl, HEAD_LEN);
    struct kv_peers s = {0};
    /* At the grant: nothing granted, nothing left allocated (ASan). */
    unsigned failed0 = kv_test_failed(KV_TEST_GRANT);
    kv_test_fail_nth(KV_TEST_GRANT, nth);
    CU_ASSERT_TRUE(kv_peers_grant(c, &s, PEER, a, &na, 1));
    kv_test_fail_nth(KV_TEST_GRANT, 0);
    bool failed = kv_test_failed(KV_TEST_GRANT) > failed0;
    CU_ASSERT_EQUAL(granted(c->eng), failed ? 0 : 2); /* blocks 3..5: a run in each plane */
    revoke(c, &s);
    CU_ASSERT_EQUAL(granted(c->eng), 0);
    kv_peers_free(&s);
    /* At the revoke: it is made all the same. */
    s = (struct kv_peers){0};
    CU_ASSERT_TRUE(kv_peers_grant(c, &s, PEER, a, &na, 1));
    CU_ASSERT_EQUAL_FATAL(granted(c->eng), 2);
    failed0 = kv_test_failed(KV_TEST_GRANT);
    kv_test_fail_nth(KV_TEST_GRANT, nth);
    revoke(c, &s);
    kv_test_fail_nth(KV_TEST_GRANT, 0);
    if (granted(c->eng) != 0)
      tu_fail(
          __FILE__, __LINE__,
          "allocation %u of the revoke failed (%u failed): the peer keeps %zu granted ranges of freed blocks",
          nth, kv_test_failed(KV_TEST_GRANT) - failed0, granted(c->eng));
    else
      CU_PASS("revoked although an allocation failed");
    kv_peers_free(&s);
    connector_down(c);
  }
}

int main(void) {
  CU_TestInfo tests[] = {
      {"adjacent heads: one range per run and plane; a shared block counted twice; revoked exactly",
       test_adjacent_heads_one_range},
      {"heads apart: one range per block and head; revoked exactly", test_strided_heads_per_head},
      {"allocations of a grant and of its revoke fail: nothing granted, or revoked all the same",
       test_allocation_fails},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_grant", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_grant", suites);
}
