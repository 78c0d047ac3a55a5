/* test_kv_grant: the plugin's grants (plugin/src/kv_grant.c), white-box, on a real
 * engine: a request's blocks are granted as one range per block and plane when the
 * plane's heads are adjacent (a PIN grants every range on the producer's progress
 * thread, between the reads it serves), one per head when they are not; the revoke
 * takes back exactly what was granted, and two requests that share a block count it
 * twice, one of them given out of order. */
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
  c->lay.g = g;
  c->lay.ng = 1;
  c->lay.nplanes = 2;
}

static size_t granted(HixlEngine *e) {
  size_t n = 99999;
  TU_ASSERT_OK(hixl_engine_grant_stats(e, PEER, &n, NULL));
  return n;
}

/* Grant two requests' blocks (block 5 in both), then revoke them: want ranges per
 * block and plane while both are granted. */
static void grant_and_revoke(uint64_t head_stride, size_t per_block) {
  char addr[64];
  HixlEngine *e = tu_engine_start(tu_addr(addr, sizeof(addr), tu_free_port()));
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  TU_ASSERT_OK(hixl_engine_set_scoped(e, true));
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  pthread_mutex_init(&c->lock, NULL);
  c->eng = e;
  struct kv_group g;
  struct kv_plane pl[2];
  layout(c, &g, pl, head_stride);
  const uint64_t a[3] = {3, 4, 5}, b[2] = {9, 5}; /* b out of order: the grant sorts it */
  const uint32_t na = 3, nb = 2;
  CU_ASSERT_TRUE(kv_grant(c, PEER, a, &na, 1));
  CU_ASSERT_EQUAL(granted(e), 3 * 2 * per_block);
  CU_ASSERT_TRUE(kv_grant(c, PEER, b, &nb, 1));
  CU_ASSERT_EQUAL(granted(e), 4 * 2 * per_block); /* block 5's ranges are the same ones, counted twice */
  pthread_mutex_lock(&c->lock);
  kv_revoke_later(c, PEER, a, &na, 1);
  pthread_mutex_unlock(&c->lock);
  kv_revoke_flush(c);
  CU_ASSERT_EQUAL(granted(e), 2 * 2 * per_block); /* b's blocks, 5 and 9 */
  pthread_mutex_lock(&c->lock);
  kv_revoke_later(c, PEER, b, &nb, 1);
  pthread_mutex_unlock(&c->lock);
  kv_revoke_flush(c);
  CU_ASSERT_EQUAL(granted(e), 0);
  pthread_mutex_destroy(&c->lock);
  free(c);
  HixlEngineDestroy(e);
}

/* Adjacent heads (HND, packed): one range per block and plane, not one per head. */
static void test_adjacent_heads_one_range(void) { grant_and_revoke(HEAD_LEN, 1); }

/* Heads apart (another rank's heads between them): one range per head. */
static void test_strided_heads_per_head(void) { grant_and_revoke(2 * HEAD_LEN, HEADS); }

int main(void) {
  CU_TestInfo tests[] = {
      {"adjacent heads: one range per block and plane; revoked exactly", test_adjacent_heads_one_range},
      {"heads apart: one range per head; revoked exactly", test_strided_heads_per_head},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_grant", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_grant", suites);
}
