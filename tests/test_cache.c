/* test_cache: the cache manager (HixlCacheManager*, seed 003) between two processes.
 *
 * A child process (forked before this one opens any engine, so nothing of verbs is
 * inherited) holds cluster 2: a contiguous cache (2 layers x K,V, 4 batch items) and a
 * blocks cache (3 layers x K,V, 1024 blocks of 64 bytes), filled with a pattern. This
 * process is cluster 1 with caches of the same shapes, filled with a sentinel, and
 * pulls and pushes between them. Every transfer is checked byte for byte, including
 * that the bytes outside the asked layers, blocks and items are untouched; the number
 * of engine ops is read from the stats. Over Transport auto (shm on one host), again
 * over tcp (test_cache_tcp), and over rdma in the soft-RoCE guest. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache_ext.h"
#include "cache/cache_int.h"
#include "engine/engine_ext.h"
#include "test_util.h"

enum {
  C_LAYERS = 2,
  C_TENSORS = 4,
  C_BATCH = 4,
  C_ITEM = 128, /* 64 elements of 2 bytes */
  B_LAYERS = 3,
  B_TENSORS = 6,
  B_BLOCKS = 1024,
  B_BLOCK = 64,    /* 32 elements of 2 bytes */
  ODD_TENSORS = 3, /* a cache whose tensors are no whole number of 2-tensor layers */
  ELEM = 2,
  SENTINEL = 0xEE,
  CLUSTER_ME = 1,
  CLUSTER_PEER = 2,
  PEER_REQ = 7, /* the CacheKey req of the peer's contiguous cache, item 0 */
  PEER_MODEL = 5,
  TIMEOUT = 5000,
};

/* Byte j of tensor t of a pattern. */
static uint8_t pat(uint64_t seed, uint32_t t, size_t j) {
  uint64_t x = (seed << 48) ^ ((uint64_t)t << 32) ^ j;
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return (uint8_t)(x >> 24);
}

struct caches {
  uint8_t *c[C_TENSORS]; /* C_BATCH * C_ITEM each */
  uint8_t *b[B_TENSORS]; /* B_BLOCKS * B_BLOCK each */
};

static void caches_alloc(struct caches *k) {
  for (int t = 0; t < C_TENSORS; t++) k->c[t] = malloc(C_BATCH * C_ITEM);
  for (int t = 0; t < B_TENSORS; t++) k->b[t] = malloc(B_BLOCKS * B_BLOCK);
}

static void caches_fill(struct caches *k, uint64_t seed) {
  for (uint32_t t = 0; t < C_TENSORS; t++)
    for (size_t j = 0; j < C_BATCH * C_ITEM; j++) k->c[t][j] = seed ? pat(seed, t, j) : SENTINEL;
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (size_t j = 0; j < B_BLOCKS * B_BLOCK; j++) k->b[t][j] = seed ? pat(seed, 100 + t, j) : SENTINEL;
}

static HixlCacheDesc desc_c(void) {
  HixlCacheDesc d = {C_TENSORS, ELEM, 2, {C_BATCH, C_ITEM / ELEM}, HIXL_CACHE_HOST};
  return d;
}

static HixlCacheDesc desc_b(void) {
  HixlCacheDesc d = {B_TENSORS, ELEM, 2, {B_BLOCKS, B_BLOCK / ELEM}, HIXL_CACHE_HOST};
  return d;
}

static HixlStatus register_both(HixlCacheManager *m, struct caches *k, uint64_t req, uint64_t model,
                                uint64_t *idc, uint64_t *idb) {
  HixlCacheDesc dc = desc_c(), db = desc_b();
  HixlCacheKey key = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, req);
  HixlBlocksCacheKey bkey = {CLUSTER_PEER, model};
  uintptr_t ac[C_TENSORS], ab[B_TENSORS];
  for (int t = 0; t < C_TENSORS; t++) ac[t] = (uintptr_t)k->c[t];
  for (int t = 0; t < B_TENSORS; t++) ab[t] = (uintptr_t)k->b[t];
  HixlStatus st =
      HixlCacheManagerRegisterCache(m, &dc, ac, C_TENSORS, &key, req ? 1 : 0, HIXL_CACHE_ACCESS_REMOTE, idc);
  if (st == HIXL_SUCCESS)
    st = HixlCacheManagerRegisterBlocksCache(m, &db, ab, B_TENSORS, model ? &bkey : NULL,
                                             HIXL_CACHE_ACCESS_REMOTE, idb);
  return st;
}

/* ---- the peer process ---- */

enum { P_INIT, P_GET, P_FILL, P_UNREG_B, P_REG_B, P_ALLOC_B, P_ALLOC_ODD, P_QUIT };

struct pcmd {
  int32_t op;
  uint32_t port, which, tensor; /* P_GET: which 0 contiguous, 1 blocks */
  uint64_t seed;
};

struct prep {
  int32_t st;
  uint64_t idc, idb;
  uint64_t addrs_b[B_TENSORS];
  uint32_t len; /* P_GET: that many bytes follow */
};

static int to_peer = -1, from_peer = -1;
static pid_t peer_pid = -1;
static char peer_addr[TU_ADDR_LEN];

static void peer_main(int in, int out) {
  struct caches k;
  HixlEngine *e = NULL;
  HixlCacheManager *m = NULL;
  struct pcmd c;
  caches_alloc(&k);
  while (tu_read_all(in, &c, sizeof(c)) == 0) {
    struct prep r = {0};
    const uint8_t *data = NULL;
    if (c.op == P_INIT) {
      char addr[TU_ADDR_LEN];
      caches_fill(&k, c.seed);
      e = tu_engine_start(tu_addr(addr, sizeof(addr), (uint16_t)c.port));
      r.st = e ? HixlCacheManagerCreate(e, CLUSTER_PEER, &m) : HIXL_FAILED;
      if (r.st == HIXL_SUCCESS) r.st = register_both(m, &k, PEER_REQ, PEER_MODEL, &r.idc, &r.idb);
    } else if (c.op == P_GET) {
      data = c.which ? k.b[c.tensor] : k.c[c.tensor];
      r.len = c.which ? B_BLOCKS * B_BLOCK : C_BATCH * C_ITEM;
    } else if (c.op == P_FILL) {
      caches_fill(&k, c.seed);
    } else if (c.op == P_UNREG_B) {
      r.st = HixlCacheManagerUnregisterCache(m, c.seed);
    } else if (c.op == P_REG_B) {
      HixlCacheDesc db = desc_b();
      HixlBlocksCacheKey bkey = {CLUSTER_PEER, PEER_MODEL};
      uintptr_t ab[B_TENSORS];
      for (int t = 0; t < B_TENSORS; t++) ab[t] = (uintptr_t)k.b[t];
      r.st =
          HixlCacheManagerRegisterBlocksCache(m, &db, ab, B_TENSORS, &bkey, HIXL_CACHE_ACCESS_REMOTE, &r.idb);
    }
    if (c.op == P_ALLOC_B || c.op == P_ALLOC_ODD) {
      /* a blocks cache in allocated memory, model PEER_MODEL + 1, filled; ODD: of
       * ODD_TENSORS tensors, model PEER_MODEL + 2 */
      HixlCacheDesc db = desc_b();
      uint32_t n = c.op == P_ALLOC_ODD ? ODD_TENSORS : B_TENSORS;
      db.num_tensors = n;
      HixlBlocksCacheKey bkey = {CLUSTER_PEER, PEER_MODEL + (c.op == P_ALLOC_ODD ? 2 : 1)};
      uintptr_t ab[B_TENSORS];
      r.st = HixlCacheManagerAllocateBlocksCache(m, &db, &bkey, ab, n, &r.idb);
      for (uint32_t t = 0; t < n && r.st == HIXL_SUCCESS; t++) {
        for (size_t j = 0; j < B_BLOCKS * B_BLOCK; j++) ((uint8_t *)ab[t])[j] = pat(c.seed, 100 + t, j);
        r.addrs_b[t] = ab[t];
      }
    } else {
      for (int t = 0; t < B_TENSORS; t++) r.addrs_b[t] = (uintptr_t)k.b[t];
    }
    if (tu_write_all(out, &r, sizeof(r)) != 0 || (data && tu_write_all(out, data, r.len) != 0)) break;
    if (c.op == P_QUIT) break;
  }
  if (m) HixlCacheManagerDestroy(m);
  if (e) HixlEngineDestroy(e);
  _exit(0);
}

static struct prep peer(int op, uint32_t which, uint32_t tensor, uint64_t seed, uint8_t *data) {
  struct pcmd c = {op, 0, which, tensor, seed};
  struct prep r = {.st = -1};
  if (tu_write_all(to_peer, &c, sizeof(c)) != 0 || tu_read_all(from_peer, &r, sizeof(r)) != 0) {
    r.st = -1;
    return r;
  }
  if (r.len && (!data || tu_read_all(from_peer, data, r.len) != 0)) r.st = -1;
  return r;
}

/* ---- this process: cluster 1 ---- */

static HixlEngine *eng;
static HixlCacheManager *mgr;
static struct caches mine;
static uint64_t my_c, my_b;     /* local cache ids */
static uint64_t peer_c, peer_b; /* the peer's */
static uint64_t peer_addrs[B_TENSORS];
static const uint64_t PEER_SEED = 41;

static HixlCacheAnyKey blocks_key(void) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS};
  k.u.blocks = (HixlBlocksCacheKey){CLUSTER_PEER, PEER_MODEL};
  return k;
}

static uint64_t ops_now(void) {
  HixlCacheStats s;
  CU_ASSERT_EQUAL(HixlCacheManagerGetStats(mgr, &s), HIXL_SUCCESS);
  return s.engine_ops;
}

/* Local block db of tensor t holds the peer's block sb of tensor t (pattern). */
static bool my_block_is(uint32_t t, uint64_t db, uint64_t sb, uint64_t seed) {
  for (size_t j = 0; j < B_BLOCK; j++)
    if (mine.b[t][db * B_BLOCK + j] != pat(seed, 100 + t, sb * B_BLOCK + j)) return false;
  return true;
}

/* Every local block byte except the (t, block) pairs marked in moved is the sentinel. */
static bool my_blocks_untouched(const bool moved[B_TENSORS][B_BLOCKS]) {
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (size_t b = 0; b < B_BLOCKS; b++) {
      if (moved && moved[t][b]) continue;
      if (tu_check_byte(mine.b[t] + b * B_BLOCK, B_BLOCK, SENTINEL) >= 0) return false;
    }
  return true;
}

static int suite_init(void) {
  caches_alloc(&mine);
  caches_fill(&mine, 0);
  char addr[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  tu_addr(peer_addr, sizeof(peer_addr), port);
  struct pcmd c = {P_INIT, port, 0, 0, PEER_SEED};
  struct prep r;
  if (tu_write_all(to_peer, &c, sizeof(c)) != 0 || tu_read_all(from_peer, &r, sizeof(r)) != 0 || r.st != 0) {
    fprintf(stderr, "test_cache: the peer did not start\n");
    return 1;
  }
  peer_c = r.idc;
  peer_b = r.idb;
  memcpy(peer_addrs, r.addrs_b, sizeof(peer_addrs));
  eng = tu_engine_start(tu_addr(addr, sizeof(addr), 0));
  if (!eng || HixlCacheManagerCreate(eng, CLUSTER_ME, &mgr) != HIXL_SUCCESS) return 1;
  if (register_both(mgr, &mine, 0, 0, &my_c, &my_b) != HIXL_SUCCESS) return 1;
  return HixlCacheManagerLink(mgr, CLUSTER_PEER, peer_addr, TIMEOUT) == HIXL_SUCCESS ? 0 : 1;
}

static int suite_clean(void) {
  if (mgr) HixlCacheManagerDestroy(mgr);
  if (eng) HixlEngineDestroy(eng);
  return 0;
}

static void reset_mine(void) { caches_fill(&mine, 0); }

/* ---- arguments ---- */

static int ready_at_once(void *ctx, uint32_t layer, int32_t timeout_ms) {
  (void)ctx, (void)layer, (void)timeout_ms;
  return 1;
}

static void test_args(void) {
  HixlCacheManager *m2 = NULL;
  uint64_t id = 0;
  HixlCacheDesc d = desc_b();
  uintptr_t a[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) a[t] = (uintptr_t)mine.b[t];
  HixlCacheAnyKey k = blocks_key();
  uint64_t sb[1] = {0}, db[1] = {0};
  HixlCacheStats s;
  TU_ASSERT_STATUS(HixlCacheManagerCreate(NULL, 3, &m2), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerCreate(eng, 3, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerCreate(eng, 3, &m2), HIXL_PARAM_INVALID); /* one per engine */
  CU_ASSERT_PTR_NULL(m2);
  TU_ASSERT_STATUS(HixlCacheManagerDestroy(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerLink(NULL, 2, peer_addr, TIMEOUT), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, 9, NULL, TIMEOUT), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, CLUSTER_PEER, peer_addr, TIMEOUT), HIXL_ALREADY_CONNECTED);
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, 9, peer_addr, TIMEOUT),
                   HIXL_PARAM_INVALID); /* it is cluster 2 */
  TU_ASSERT_STATUS(HixlCacheManagerUnlink(mgr, 9, TIMEOUT), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(NULL, &d, a, B_TENSORS, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, NULL, a, B_TENSORS, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &d, NULL, B_TENSORS, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &d, a, B_TENSORS - 1, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &d, a, B_TENSORS, NULL, 0, NULL),
                   HIXL_PARAM_INVALID);
  HixlCacheDesc bad = d;
  bad.num_dims = 0;
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &bad, a, B_TENSORS, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  bad = d;
  bad.elem_size = 0;
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &bad, a, B_TENSORS, NULL, 0, &id),
                   HIXL_PARAM_INVALID);
  bad = d;
  bad.placement = HIXL_CACHE_DEVICE; /* host memory said to be device memory */
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(mgr, &bad, a, B_TENSORS, NULL, 0, &id),
                   tu_device_refusal());
  TU_ASSERT_STATUS(HixlCacheManagerUnregisterCache(mgr, 999999), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(NULL, &k, my_b, sb, 1, db, 1, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, NULL, my_b, sb, 1, db, 1, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, 999999, sb, 1, db, 1, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, NULL, 1, db, 1, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, NULL, my_c, 0, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPushBlocks(mgr, NULL, my_b, sb, 1, db, 1, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPushCache(mgr, NULL, my_c, 0, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerGetStats(NULL, &s), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerGetStats(mgr, NULL), HIXL_PARAM_INVALID);
  hixl_cache_unpin(NULL, my_b); /* nothing (before: a NULL dereference) */
  TU_ASSERT_STATUS(HixlCacheManagerRemapRegisteredMemory(mgr, NULL, 0), HIXL_UNSUPPORTED);
  TU_ASSERT_STATUS(HixlCacheTaskSynchronize(NULL, 10), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheTaskDestroy(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerTransferCacheAsync(mgr, my_b, NULL, NULL, 0, NULL, NULL),
                   HIXL_PARAM_INVALID);
  /* The contiguous cache into 3 blocks of 0x5555555555555556 bytes: more than its item,
   * though their product wraps to 2 (before: taken, 2 bytes a tensor moved). */
  uintptr_t dst[C_TENSORS];
  for (int t = 0; t < C_TENSORS; t++) dst[t] = (uintptr_t)peer_addrs[0];
  HixlLayerSynchronizer sync = {ready_at_once, NULL, 1000};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, C_TENSORS, 0, 0, 0};
  const uint64_t three[] = {0, 1, 2};
  HixlCacheAsyncArgs wrap = {NULL, 0, three, 3, 0x5555555555555556ull, 0, 2000};
  HixlCacheTask *task = NULL;
  TU_ASSERT_STATUS(HixlCacheManagerTransferCacheAsync(mgr, my_c, &sync, &cfg, 1, &wrap, &task),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "exceed the batch item"));
  CU_ASSERT_PTR_NULL(task);
  /* A blocks source into destination block -1 (vLLM's padding) or 2^58 + 1: the offset,
   * index x block size, wrapped (before: taken, one block before the destination tensor,
   * another layer's KV, overwritten). */
  uintptr_t bdst[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) bdst[t] = (uintptr_t)peer_addrs[t];
  HixlCacheTransferConfig bcfg = {CLUSTER_PEER, bdst, B_TENSORS, 0, 0, 0};
  const uint64_t one_src[] = {0}, far[][1] = {{UINT64_MAX}, {(UINT64_C(1) << 58) + 1}};
  for (int i = 0; i < 2; i++) {
    HixlCacheAsyncArgs past = {one_src, 1, far[i], 1, 0, 0, 2000};
    TU_ASSERT_STATUS(HixlCacheManagerTransferCacheAsync(mgr, my_b, &sync, &bcfg, 1, &past, &task),
                     HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("outside any cache");
    CU_ASSERT_PTR_NULL(task);
  }
  /* A CacheKey of another cluster: refused, as a BlocksCacheKey of another cluster is
   * (before: registered, and found by a lookup naming this cluster). */
  HixlCacheDesc dc = desc_c();
  HixlCacheKey other = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 9);
  uintptr_t ac[C_TENSORS];
  uint64_t oid;
  for (int t = 0; t < C_TENSORS; t++) ac[t] = (uintptr_t)mine.c[t];
  TU_ASSERT_STATUS(
      HixlCacheManagerRegisterCache(mgr, &dc, ac, C_TENSORS, &other, 1, HIXL_CACHE_ACCESS_REMOTE, &oid),
      HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("names cluster 2");
  CU_ASSERT_TRUE(my_blocks_untouched(NULL));
  CU_ASSERT(HIXL_CACHE_MAX_ADDRS >= 240);
}

/* ---- blocks ---- */

static void test_pull_blocks(void) {
  static bool moved[B_TENSORS][B_BLOCKS];
  const uint64_t sb[] = {3, 4, 5, 10, 1023}, db[] = {0, 1, 2, 20, 7};
  HixlCacheAnyKey k = blocks_key();
  reset_mine();
  memset(moved, 0, sizeof(moved));
  uint64_t ops0 = ops_now();
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 5, db, 5, NULL));
  /* 3,4,5 -> 0,1,2 is one run; 10 -> 20 and 1023 -> 7 one each: 3 ops per tensor */
  CU_ASSERT_EQUAL(ops_now() - ops0, 3 * B_TENSORS);
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (int i = 0; i < 5; i++) {
      CU_ASSERT_TRUE(my_block_is(t, db[i], sb[i], PEER_SEED));
      moved[t][db[i]] = true;
    }
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
}

/* 1024 contiguous blocks of a tensor: one op, not 1024. */
static void test_coalescing(void) {
  static uint64_t all[B_BLOCKS];
  for (size_t i = 0; i < B_BLOCKS; i++) all[i] = i;
  HixlCacheAnyKey k = blocks_key();
  reset_mine();
  uint64_t ops0 = ops_now();
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, all, B_BLOCKS, all, B_BLOCKS, NULL));
  CU_ASSERT_EQUAL(ops_now() - ops0, B_TENSORS);
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (size_t b = 0; b < B_BLOCKS; b += 97) CU_ASSERT_TRUE(my_block_is(t, b, b, PEER_SEED));
  CU_ASSERT_TRUE(my_block_is(5, B_BLOCKS - 1, B_BLOCKS - 1, PEER_SEED));
  /* every other block: no two adjacent, one op each */
  static uint64_t odd[B_BLOCKS / 2];
  for (size_t i = 0; i < B_BLOCKS / 2; i++) odd[i] = 2 * i + 1;
  ops0 = ops_now();
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, odd, B_BLOCKS / 2, odd, B_BLOCKS / 2, NULL));
  CU_ASSERT_EQUAL(ops_now() - ops0, (uint64_t)B_TENSORS * B_BLOCKS / 2);
}

/* A layer range moves those layers' tensors only; one tensor per layer too. */
static void test_layer_ranges(void) {
  static bool moved[B_TENSORS][B_BLOCKS];
  const uint64_t sb[] = {8, 9}, db[] = {100, 101};
  HixlCacheAnyKey k = blocks_key();
  HixlCacheTransferArgs a = HIXL_CACHE_TRANSFER_ARGS_INIT;
  reset_mine();
  memset(moved, 0, sizeof(moved));
  a.src_layer_start = a.dst_layer_start = 1;
  a.src_layer_count = a.dst_layer_count = 1;
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, db, 2, &a));
  for (uint32_t t = 2; t < 4; t++) /* layer 1: tensors 2 (K) and 3 (V) */
    for (int i = 0; i < 2; i++) {
      CU_ASSERT_TRUE(my_block_is(t, db[i], sb[i], PEER_SEED));
      moved[t][db[i]] = true;
    }
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
  /* tensor_num_per_layer 1: six one-tensor layers; layer 4 is tensor 4 */
  a.tensor_num_per_layer = 1;
  a.src_layer_start = a.dst_layer_start = 4;
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, db, 2, &a));
  for (int i = 0; i < 2; i++) {
    CU_ASSERT_TRUE(my_block_is(4, db[i], sb[i], PEER_SEED));
    moved[4][db[i]] = true;
  }
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
  /* a range past the last layer: refused, nothing moved */
  a.tensor_num_per_layer = 2;
  a.src_layer_start = a.dst_layer_start = 2;
  a.src_layer_count = a.dst_layer_count = 2;
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, db, 2, &a), HIXL_PARAM_INVALID);
  a.tensor_num_per_layer = 4; /* does not divide 6 */
  a.src_layer_start = a.dst_layer_start = 0;
  a.src_layer_count = a.dst_layer_count = 1;
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, db, 2, &a), HIXL_PARAM_INVALID);
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
}

static void test_push_blocks(void) {
  const uint64_t sb[] = {0, 1, 2, 3, 600}, db[] = {500, 501, 502, 503, 2};
  HixlBlocksCacheKey k = {CLUSTER_PEER, PEER_MODEL};
  static uint8_t got[B_BLOCKS * B_BLOCK];
  caches_fill(&mine, 77);
  TU_ASSERT_OK(HixlCacheManagerPushBlocks(mgr, &k, my_b, sb, 5, db, 5, NULL));
  for (uint32_t t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_EQUAL_FATAL(peer(P_GET, 1, t, 0, got).st, 0);
    for (size_t b = 0; b < B_BLOCKS; b++) {
      int i = -1;
      for (int x = 0; x < 5; x++)
        if (db[x] == b) i = x;
      for (size_t j = 0; j < B_BLOCK; j++) {
        uint8_t want =
            i >= 0 ? pat(77, 100 + t, sb[i] * B_BLOCK + j) : pat(PEER_SEED, 100 + t, b * B_BLOCK + j);
        if (got[b * B_BLOCK + j] != want) {
          tu_fail(__FILE__, __LINE__, "peer tensor %u block %zu byte %zu: got 0x%02x, want 0x%02x", t, b, j,
                  got[b * B_BLOCK + j], want);
          t = B_TENSORS;
          b = B_BLOCKS;
          break;
        }
      }
    }
  }
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* A destination block twice in one list: PARAM_INVALID naming both places, nothing
 * moved (before: taken, two sources written to one block, the second winning); a list
 * of more blocks than the destination has: refused before it is walked (before: walked,
 * planned and moved, 1025 copies into block 0). Pull and push, a contiguous item cut
 * into blocks, an async task. */
static void test_repeated_dst_blocks(void) {
  const uint64_t sb[] = {3, 4, 5}, db[] = {20, 21, 20}, twice[] = {7, 7};
  static uint64_t many[B_BLOCKS + 1];
  static uint8_t got[B_BLOCKS * B_BLOCK];
  HixlCacheAnyKey k = blocks_key(), kc = {.kind = HIXL_CACHE_KEY_REQ};
  kc.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(CLUSTER_PEER, PEER_REQ);
  HixlBlocksCacheKey pk = {CLUSTER_PEER, PEER_MODEL};
  reset_mine();
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 3, db, 3, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("dst_blocks[0] and dst_blocks[2] are both block 20");
  HixlCacheTransferArgs two = HIXL_CACHE_TRANSFER_ARGS_INIT; /* the peer's 2 contiguous layers */
  two.src_layer_count = two.dst_layer_count = 2;
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &kc, my_b, NULL, 0, twice, 2, &two), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("dst_blocks[0] and dst_blocks[1] are both block 7");
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, many, B_BLOCKS + 1, many, B_BLOCKS + 1, NULL),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("1025 dst_blocks");
  CU_ASSERT_TRUE(my_blocks_untouched(NULL));
  /* push: the peer's block 20 keeps its pattern */
  TU_ASSERT_STATUS(HixlCacheManagerPushBlocks(mgr, &pk, my_b, sb, 3, db, 3, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("are both block 20");
  /* async: a blocks source into the peer's blocks */
  uintptr_t bdst[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) bdst[t] = (uintptr_t)peer_addrs[t];
  HixlLayerSynchronizer sync = {ready_at_once, NULL, 1000};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, bdst, B_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs args = {sb, 3, db, 3, 0, 0, TIMEOUT};
  HixlCacheTask *task = NULL;
  TU_ASSERT_STATUS(HixlCacheManagerTransferCacheAsync(mgr, my_b, &sync, &cfg, 1, &args, &task),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("dst_block_indices[0] and dst_block_indices[2] are both block 20");
  CU_ASSERT_PTR_NULL(task);
  if (task) {
    HixlCacheTaskSynchronize(task, TIMEOUT);
    HixlCacheTaskDestroy(task);
  }
  for (uint32_t t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_EQUAL_FATAL(peer(P_GET, 1, t, 0, got).st, 0);
    for (size_t j = 0; j < B_BLOCK; j++)
      if (got[20 * B_BLOCK + j] != pat(PEER_SEED, 100 + t, 20 * B_BLOCK + j)) {
        tu_fail(__FILE__, __LINE__, "peer tensor %u block 20 byte %zu: got 0x%02x", t, j,
                got[20 * B_BLOCK + j]);
        break;
      }
  }
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* An async task given dst_block_memory_size but no dst_block_indices: a destination
 * of blocks with none named. Refused, nothing sent, as the seed's implementation
 * refuses it (before: taken as a contiguous destination, each tensor's whole batch item
 * written at dst_addrs[i], over whatever blocks lie there). */
static void test_async_block_size_without_blocks(void) {
  static uint8_t got[B_BLOCKS * B_BLOCK];
  uintptr_t dst[C_TENSORS];
  for (int t = 0; t < C_TENSORS; t++) dst[t] = (uintptr_t)peer_addrs[t];
  HixlLayerSynchronizer sync = {ready_at_once, NULL, 1000};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, C_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs a = {NULL, 0, NULL, 0, B_BLOCK, 0, TIMEOUT};
  HixlCacheTask *task = NULL;
  caches_fill(&mine, 23);
  TU_ASSERT_STATUS(HixlCacheManagerTransferCacheAsync(mgr, my_c, &sync, &cfg, 1, &a, &task),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("dst_block_memory_size");
  CU_ASSERT_PTR_NULL(task);
  if (task) {
    HixlCacheTaskSynchronize(task, TIMEOUT);
    HixlCacheTaskDestroy(task);
  }
  for (uint32_t t = 0; t < C_TENSORS; t++) { /* the peer's blocks tensors: every byte its own */
    CU_ASSERT_EQUAL_FATAL(peer(P_GET, 1, t, 0, got).st, 0);
    size_t bad = 0;
    for (size_t j = 0; j < B_BLOCKS * B_BLOCK; j++) bad += got[j] != pat(PEER_SEED, 100 + t, j);
    CU_ASSERT_EQUAL(bad, 0);
  }
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* ---- contiguous ---- */

static void test_contiguous(void) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_REQ};
  k.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(CLUSTER_PEER, PEER_REQ);
  reset_mine();
  /* by CacheKey: the peer's item 0 into local item 2 */
  TU_ASSERT_OK(HixlCacheManagerPullCache(mgr, &k, my_c, 2, NULL));
  for (uint32_t t = 0; t < C_TENSORS; t++) {
    for (size_t j = 0; j < C_ITEM; j++)
      if (mine.c[t][2 * C_ITEM + j] != pat(PEER_SEED, t, j)) {
        tu_fail(__FILE__, __LINE__, "item 2 of tensor %u byte %zu", t, j);
        break;
      }
    CU_ASSERT_EQUAL(tu_check_byte(mine.c[t], 2 * C_ITEM, SENTINEL), -1);
    CU_ASSERT_EQUAL(tu_check_byte(mine.c[t] + 3 * C_ITEM, C_ITEM, SENTINEL), -1);
  }
  /* by cache id and batch index, half an item (size), layer 1 only, into item 0 */
  HixlCacheAnyKey ki = {.kind = HIXL_CACHE_KEY_ID};
  ki.u.id = (HixlCacheKeyByIdAndIndex){CLUSTER_PEER, peer_c, 3};
  HixlCacheTransferArgs a = HIXL_CACHE_TRANSFER_ARGS_INIT;
  a.size = C_ITEM / 2;
  a.src_layer_start = a.dst_layer_start = 1;
  a.src_layer_count = a.dst_layer_count = 1;
  TU_ASSERT_OK(HixlCacheManagerPullCache(mgr, &ki, my_c, 0, &a));
  for (uint32_t t = 0; t < C_TENSORS; t++) {
    bool layer1 = t >= 2;
    for (size_t j = 0; j < C_ITEM; j++) {
      uint8_t want = layer1 && j < C_ITEM / 2 ? pat(PEER_SEED, t, 3 * C_ITEM + j) : SENTINEL;
      if (mine.c[t][j] != want) {
        tu_fail(__FILE__, __LINE__, "item 0 of tensor %u byte %zu: got 0x%02x want 0x%02x", t, j,
                mine.c[t][j], want);
        break;
      }
    }
  }
  /* blocks from a contiguous source: its item fills the destination blocks in order
   * (2 blocks of 64 bytes = the 128-byte item), for the source's 2 layers */
  const uint64_t db[] = {41, 40};
  reset_mine();
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, NULL, 0, db, 2, NULL),
                   HIXL_PARAM_INVALID); /* 4 vs 6 */
  HixlCacheTransferArgs two = HIXL_CACHE_TRANSFER_ARGS_INIT;
  two.src_layer_count = two.dst_layer_count = C_LAYERS;
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, NULL, 0, db, 2, &two));
  static bool moved[B_TENSORS][B_BLOCKS];
  memset(moved, 0, sizeof(moved));
  for (uint32_t t = 0; t < C_TENSORS; t++) {
    for (int i = 0; i < 2; i++) {
      for (size_t j = 0; j < B_BLOCK; j++)
        if (mine.b[t][db[i] * B_BLOCK + j] != pat(PEER_SEED, t, (size_t)i * B_BLOCK + j)) {
          tu_fail(__FILE__, __LINE__, "tensor %u block %llu byte %zu", t, (unsigned long long)db[i], j);
          break;
        }
      moved[t][db[i]] = true;
    }
  }
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
  /* push: local item 1 into the peer's item 2 */
  caches_fill(&mine, 88);
  HixlCacheKeyByIdAndIndex dk = {CLUSTER_PEER, peer_c, 2};
  TU_ASSERT_OK(HixlCacheManagerPushCache(mgr, &dk, my_c, 1, NULL));
  static uint8_t got[C_BATCH * C_ITEM];
  for (uint32_t t = 0; t < C_TENSORS; t++) {
    CU_ASSERT_EQUAL_FATAL(peer(P_GET, 0, t, 0, got).st, 0);
    for (size_t j = 0; j < C_BATCH * C_ITEM; j++) {
      size_t item = j / C_ITEM;
      uint8_t want = item == 2 ? pat(88, t, C_ITEM + j % C_ITEM) : pat(PEER_SEED, t, j);
      if (got[j] != want) {
        tu_fail(__FILE__, __LINE__, "peer tensor %u byte %zu: got 0x%02x want 0x%02x", t, j, got[j], want);
        break;
      }
    }
  }
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* ---- layouts checked before a byte moves ---- */

static void test_mismatches(void) {
  HixlCacheAnyKey k = blocks_key();
  const uint64_t sb[] = {1, 2}, db[] = {1, 2};
  reset_mine();
  /* element size 4 here, 2 there (same bytes per block) */
  HixlCacheDesc d = {B_TENSORS, 4, 2, {B_BLOCKS, B_BLOCK / 4}, HIXL_CACHE_HOST};
  static uint8_t *other[B_TENSORS];
  uintptr_t a[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) {
    other[t] = malloc(B_BLOCKS * B_BLOCK * 2);
    memset(other[t], SENTINEL, B_BLOCKS * B_BLOCK * 2);
    a[t] = (uintptr_t)other[t];
  }
  uint64_t id = 0;
  TU_ASSERT_OK(
      HixlCacheManagerRegisterBlocksCache(mgr, &d, a, B_TENSORS, NULL, HIXL_CACHE_ACCESS_REMOTE, &id));
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, id, sb, 2, db, 2, NULL), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "element size 2"));
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "against 4"));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  /* block size 128 here, 64 there */
  d = (HixlCacheDesc){B_TENSORS, ELEM, 2, {B_BLOCKS, 2 * B_BLOCK / ELEM}, HIXL_CACHE_HOST};
  TU_ASSERT_OK(
      HixlCacheManagerRegisterBlocksCache(mgr, &d, a, B_TENSORS, NULL, HIXL_CACHE_ACCESS_REMOTE, &id));
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, id, sb, 2, db, 2, NULL), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "block size"));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  /* tensor count 4 here, 6 there */
  d = (HixlCacheDesc){4, ELEM, 2, {B_BLOCKS, B_BLOCK / ELEM}, HIXL_CACHE_HOST};
  TU_ASSERT_OK(HixlCacheManagerRegisterBlocksCache(mgr, &d, a, 4, NULL, HIXL_CACHE_ACCESS_REMOTE, &id));
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, id, sb, 2, db, 2, NULL), HIXL_PARAM_INVALID);
  fprintf(stderr, "  [tensor count: %s]\n", HixlGetLastErrorMessage());
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  for (int t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_EQUAL(tu_check_byte(other[t], B_BLOCKS * B_BLOCK * 2, SENTINEL), -1);
    free(other[t]);
  }
  /* block indexes out of range on either side, lists of different lengths */
  const uint64_t far[] = {1, B_BLOCKS};
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, far, 2, db, 2, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, far, 2, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 2, db, 1, NULL), HIXL_PARAM_INVALID);
  /* a contiguous local cache with the blocks calls, and the other way round */
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_c, sb, 2, db, 2, NULL), HIXL_PARAM_INVALID);
  HixlCacheAnyKey ki = {.kind = HIXL_CACHE_KEY_ID};
  ki.u.id = (HixlCacheKeyByIdAndIndex){CLUSTER_PEER, peer_b, 0};
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &ki, my_c, 0, NULL), HIXL_PARAM_INVALID);
  CU_ASSERT_TRUE(my_blocks_untouched(NULL));
  for (int t = 0; t < C_TENSORS; t++)
    CU_ASSERT_EQUAL(tu_check_byte(mine.c[t], C_BATCH * C_ITEM, SENTINEL), -1);
}

/* A key that names nothing there is NOT_FOUND; so is a cache the peer unregistered
 * after this side remembered it; registered again, it is found again. */
static void test_not_found(void) {
  const uint64_t sb[] = {1}, db[] = {1};
  HixlCacheAnyKey k = blocks_key();
  HixlCacheAnyKey nokey = {.kind = HIXL_CACHE_KEY_REQ};
  nokey.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 99);
  reset_mine();
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &nokey, my_c, 0, NULL), HIXL_NOT_FOUND);
  HixlCacheAnyKey noid = {.kind = HIXL_CACHE_KEY_ID};
  noid.u.id = (HixlCacheKeyByIdAndIndex){CLUSTER_PEER, 424242, 0};
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &noid, my_c, 0, NULL), HIXL_NOT_FOUND);
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 1, db, 1, NULL)); /* remembered now */
  CU_ASSERT_EQUAL_FATAL(peer(P_UNREG_B, 0, 0, peer_b, NULL).st, 0);
  reset_mine();
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 1, db, 1, NULL), HIXL_NOT_FOUND);
  CU_ASSERT_TRUE(my_blocks_untouched(NULL));
  struct prep r = peer(P_REG_B, 0, 0, 0, NULL);
  CU_ASSERT_EQUAL_FATAL(r.st, 0);
  CU_ASSERT_NOT_EQUAL(r.idb, peer_b); /* ids are never reused */
  peer_b = r.idb;
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, sb, 1, db, 1, NULL));
  CU_ASSERT_TRUE(my_block_is(0, 1, 1, PEER_SEED));
}

/* ---- layer-pipelined async transfer ---- */

struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint32_t released; /* layers [0, released) may go */
  uint32_t asked;    /* the highest layer asked about, + 1 */
};

static int gate_sync(void *ctx, uint32_t layer, int32_t timeout_ms) {
  struct gate *g = ctx;
  int64_t end = tu_now_ms() + timeout_ms;
  pthread_mutex_lock(&g->lock);
  if (layer + 1 > g->asked) g->asked = layer + 1;
  pthread_cond_broadcast(&g->cond);
  while (layer >= g->released && tu_now_ms() < end) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 2000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&g->cond, &g->lock, &ts);
  }
  int ok = layer < g->released;
  pthread_mutex_unlock(&g->lock);
  return ok;
}

static void gate_release(struct gate *g, uint32_t n) {
  pthread_mutex_lock(&g->lock);
  g->released = n;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

/* Has layer l of the peer's blocks sb[] received pattern seed (1), is it untouched
 * (0), or neither (-1)? */
/* Layer l of the peer's blocks sb[0..n) as an outside observer sees them while a
 * transfer may be landing: read through the kernel (process_vm_readv of the peer),
 * not by the peer's own thread, which would race with its engine's. 1: all of seed,
 * 0: all the peer's own, -1: a mix, -2: unreadable. */
static int peer_layer_state(uint32_t l, const uint64_t *sb, size_t n, uint64_t seed) {
  static uint8_t got[B_BLOCK];
  bool all_new = true, all_old = true;
  for (uint32_t t = 2 * l; t < 2 * l + 2; t++) {
    for (size_t i = 0; i < n; i++) {
      struct iovec local = {got, B_BLOCK};
      struct iovec remote = {(void *)(uintptr_t)(peer_addrs[t] + sb[i] * B_BLOCK), B_BLOCK};
      if (process_vm_readv(peer_pid, &local, 1, &remote, 1, 0) != (ssize_t)B_BLOCK) return -2;
      for (size_t j = 0; j < B_BLOCK; j++) {
        uint8_t x = got[j];
        all_new &= x == pat(seed, 100 + t, sb[i] * B_BLOCK + j);
        all_old &= x == pat(PEER_SEED, 100 + t, sb[i] * B_BLOCK + j);
      }
    }
  }
  return all_new ? 1 : all_old ? 0 : -1;
}

/* Start a layer-pipelined push of blocks (the same indexes on both sides) to the
 * peer's blocks cache, each layer released by gate g. */
static HixlStatus push_task(const uint64_t *blocks, size_t n, struct gate *g, int32_t layer_ms,
                            int32_t task_ms, HixlCacheTask **task) {
  uintptr_t dst[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) dst[t] = (uintptr_t)peer_addrs[t];
  HixlLayerSynchronizer sync = {gate_sync, g, layer_ms};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, B_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs a = {blocks, n, blocks, n, 0, 0, task_ms};
  return HixlCacheManagerTransferCacheAsync(mgr, my_b, &sync, &cfg, 1, &a, task);
}

static uint32_t busy_of(uint64_t id) {
  pthread_mutex_lock(&mgr->lock);
  struct cm_cache *c = cache_by_id(mgr, id);
  uint32_t n = c ? c->busy : 0;
  pthread_mutex_unlock(&mgr->lock);
  return n;
}

/* hixl_cache_unpin lets go of the pin a push with a call behind it left, once; on a
 * cache an async task holds it does nothing (before: it took the task's pin, and
 * UnregisterCache would have freed the cache under the task's thread). */
static void test_unpin_only_then_pins(void) {
  static const uint64_t blocks[] = {40};
  struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  HixlBlocksCacheKey pk = {CLUSTER_PEER, PEER_MODEL};
  const uint8_t hello[2] = {CM_PROTO, CM_OP_HELLO};
  uint8_t ans[16];
  uint32_t n = 0;
  hixl_call_t call = NULL;
  caches_fill(&mine, 55);
  TU_ASSERT_OK_FATAL(hixl_cache_push_blocks_then_call(mgr, &pk, my_b, blocks, 1, blocks, 1, NULL,
                                                      HIXL_SERVICE_CACHE, hello, sizeof(hello), ans,
                                                      sizeof(ans), &n, &call));
  TU_ASSERT_OK(hixl_engine_call_wait(eng, peer_addr, call));
  CU_ASSERT_EQUAL(n, 16);
  CU_ASSERT_EQUAL(busy_of(my_b), 1);
  HixlCacheTask *task = NULL;
  TU_ASSERT_OK_FATAL(push_task(blocks, 1, &g, 20000, 30000, &task));
  CU_ASSERT_EQUAL(busy_of(my_b), 2);
  hixl_cache_unpin(mgr, my_b); /* the then-call's */
  CU_ASSERT_EQUAL(busy_of(my_b), 1);
  hixl_cache_unpin(mgr, my_b); /* none left: the task's stays */
  CU_ASSERT_EQUAL(busy_of(my_b), 1);
  if (busy_of(my_b) == 1) TU_ASSERT_STATUS(HixlCacheManagerUnregisterCache(mgr, my_b), HIXL_FAILED);
  gate_release(&g, B_LAYERS);
  TU_ASSERT_OK(HixlCacheTaskSynchronize(task, TIMEOUT));
  TU_ASSERT_OK(HixlCacheTaskDestroy(task));
  CU_ASSERT_EQUAL(busy_of(my_b), 0);
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

static void test_async_pipelined(void) {
  static const uint64_t blocks[] = {10, 11, 12, 300};
  struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  HixlCacheTask *task = NULL;
  caches_fill(&mine, 99);
  TU_ASSERT_OK_FATAL(push_task(blocks, 4, &g, 20000, 30000, &task));
  for (uint32_t l = 0; l < B_LAYERS; l++) {
    /* the task waits for layer l's release: nothing of it has reached the peer */
    pthread_mutex_lock(&g.lock);
    while (g.asked < l + 1) pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);
    for (uint32_t m = l; m < B_LAYERS; m++) CU_ASSERT_EQUAL(peer_layer_state(m, blocks, 4, 99), 0);
    gate_release(&g, l + 1);
    /* it lands (over tcp piece by piece) while later layers wait */
    int64_t end = tu_now_ms() + 10000;
    int s;
    while ((s = peer_layer_state(l, blocks, 4, 99)) != 1 && s >= -1 && tu_now_ms() < end) sched_yield();
    CU_ASSERT_EQUAL(s, 1);
  }
  TU_ASSERT_OK(HixlCacheTaskSynchronize(task, 10000));
  int64_t t0 = tu_now_ms();
  TU_ASSERT_OK(HixlCacheTaskSynchronize(task, 10000)); /* ended: at once */
  CU_ASSERT(tu_now_ms() - t0 < 1000);
  HixlStatus res[1] = {12345};
  TU_ASSERT_OK(HixlCacheTaskGetResults(task, res, 1));
  CU_ASSERT_EQUAL(res[0], HIXL_SUCCESS);
  TU_ASSERT_OK(HixlCacheTaskDestroy(task));
  /* Its handle, destroyed: unknown (a token, not the freed task's address: before, read
   * after free). */
  TU_ASSERT_STATUS(HixlCacheTaskSynchronize(task, 10), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheTaskGetResults(task, res, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheTaskDestroy(task), HIXL_PARAM_INVALID);
  /* blocks not in the list are the peer's own */
  const uint64_t others[] = {9, 13, 299, 301};
  for (uint32_t l = 0; l < B_LAYERS; l++) CU_ASSERT_EQUAL(peer_layer_state(l, others, 4, 99), 0);
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* A synchronizer that never releases layer 1: the task fails naming it, in time;
 * layer 0 went, layer 1 never did. */
static void test_async_not_ready(void) {
  static const uint64_t blocks[] = {50, 51};
  struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 0};
  HixlCacheTask *task = NULL;
  caches_fill(&mine, 55);
  int64_t t0 = tu_now_ms();
  TU_ASSERT_OK_FATAL(push_task(blocks, 2, &g, 300, 10000, &task));
  HixlStatus st = HixlCacheTaskSynchronize(task, 8000);
  CU_ASSERT(st == HIXL_FAILED || st == HIXL_TIMEOUT);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "layer 1"));
  CU_ASSERT(tu_now_ms() - t0 < 5000);
  HixlStatus res[1] = {0};
  TU_ASSERT_OK(HixlCacheTaskGetResults(task, res, 1));
  CU_ASSERT(res[0] == HIXL_FAILED || res[0] == HIXL_TIMEOUT);
  TU_ASSERT_OK(HixlCacheTaskDestroy(task));
  CU_ASSERT_EQUAL(peer_layer_state(0, blocks, 2, 55), 1);
  CU_ASSERT_EQUAL(peer_layer_state(1, blocks, 2, 55), 0);
  CU_ASSERT_EQUAL(peer_layer_state(2, blocks, 2, 55), 0);
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* A synchronizer that answers neither 1 nor 0 for layer 1 (-1, as a C call says it
 * failed; 2): the layer is not ready, the task fails naming it, and no byte of it or of
 * the layers after it moves (before: any non-zero was "ready", and unready KV left). */
static int garbage_ret;

static int garbage_sync(void *ctx, uint32_t layer, int32_t timeout_ms) {
  (void)ctx, (void)timeout_ms;
  return layer == 0 ? 1 : garbage_ret;
}

static void test_async_garbage_sync(void) {
  static const uint64_t blocks[] = {60, 61};
  const int rets[] = {-1, 2};
  uintptr_t dst[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) dst[t] = (uintptr_t)peer_addrs[t];
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, B_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs a = {blocks, 2, blocks, 2, 0, 0, 10000};
  for (int i = 0; i < 2; i++) {
    HixlLayerSynchronizer sync = {garbage_sync, NULL, 1000};
    HixlCacheTask *task = NULL;
    garbage_ret = rets[i];
    caches_fill(&mine, 66 + i);
    TU_ASSERT_OK_FATAL(HixlCacheManagerTransferCacheAsync(mgr, my_b, &sync, &cfg, 1, &a, &task));
    TU_ASSERT_STATUS(HixlCacheTaskSynchronize(task, 8000), HIXL_FAILED);
    TU_ASSERT_ERRMSG_HAS("layer 1");
    HixlStatus res[1] = {0};
    TU_ASSERT_OK(HixlCacheTaskGetResults(task, res, 1));
    CU_ASSERT_EQUAL(res[0], HIXL_FAILED);
    TU_ASSERT_OK(HixlCacheTaskDestroy(task));
    CU_ASSERT_EQUAL(peer_layer_state(0, blocks, 2, 66 + i), 1);
    CU_ASSERT_EQUAL(peer_layer_state(1, blocks, 2, 66 + i), 0);
    CU_ASSERT_EQUAL(peer_layer_state(2, blocks, 2, 66 + i), 0);
    CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
  }
}

/* A synchronizer that destroys its own task (on the task's thread): refused, and the
 * task ends as the synchronizer said (before: SUCCESS, the task freed under its own
 * running thread, which read and wrote it after). */
struct self_destroy {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  HixlCacheTask *task; /* set once TransferCacheAsync returned */
  HixlStatus st;       /* what Destroy said inside */
  bool called;
};

static int self_destroy_sync(void *ctx, uint32_t layer, int32_t timeout_ms) {
  struct self_destroy *s = ctx;
  (void)layer, (void)timeout_ms;
  pthread_mutex_lock(&s->lock);
  while (!s->task) pthread_cond_wait(&s->cond, &s->lock);
  HixlCacheTask *t = s->task;
  pthread_mutex_unlock(&s->lock);
  HixlStatus st = HixlCacheTaskDestroy(t);
  pthread_mutex_lock(&s->lock);
  if (!s->called) s->st = st;
  s->called = true;
  pthread_mutex_unlock(&s->lock);
  return 0;
}

static void test_async_self_destroy(void) {
  static const uint64_t blocks[] = {70};
  struct self_destroy s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, HIXL_SUCCESS, false};
  uintptr_t dst[B_TENSORS];
  for (int t = 0; t < B_TENSORS; t++) dst[t] = (uintptr_t)peer_addrs[t];
  HixlLayerSynchronizer sync = {self_destroy_sync, &s, 1000};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, B_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs a = {blocks, 1, blocks, 1, 0, 0, 10000};
  HixlCacheTask *task = NULL;
  caches_fill(&mine, 77);
  TU_ASSERT_OK_FATAL(HixlCacheManagerTransferCacheAsync(mgr, my_b, &sync, &cfg, 1, &a, &task));
  pthread_mutex_lock(&s.lock);
  s.task = task;
  pthread_cond_broadcast(&s.cond);
  pthread_mutex_unlock(&s.lock);
  TU_ASSERT_STATUS(HixlCacheTaskSynchronize(task, 8000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("layer 0");
  pthread_mutex_lock(&s.lock);
  CU_ASSERT_TRUE(s.called);
  CU_ASSERT_EQUAL(s.st, HIXL_PARAM_INVALID);
  pthread_mutex_unlock(&s.lock);
  TU_ASSERT_OK(HixlCacheTaskDestroy(task));
  for (uint32_t l = 0; l < B_LAYERS; l++) CU_ASSERT_EQUAL(peer_layer_state(l, blocks, 1, 77), 0);
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* One layer of more ops than one engine call takes (HIXL_MAX_BATCH, 65,536): every other
 * one-byte block of a local blocks cache into the first 40,000 bytes of each of the
 * peer's tensors, 80,000 ops a layer, none adjacent at the source. The task sends them
 * all, as PullBlocks and PushBlocks send a plan of any length (before: each layer was one
 * TransferAsync of all its ops, which the engine refused, and the task failed
 * PARAM_INVALID with nothing sent). The peer's bytes past the blocks stay its own. */
enum { BIG_BLOCKS = 40000 };

static void test_async_layer_past_batch(void) {
  static uint64_t sb[BIG_BLOCKS], db[BIG_BLOCKS];
  static uint8_t got[B_BLOCKS * B_BLOCK];
  static uint8_t *src[B_TENSORS];
  uintptr_t a[B_TENSORS], dst[B_TENSORS];
  const uint64_t seed = 44;
  for (uint32_t t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(src[t] = malloc(2 * BIG_BLOCKS));
    for (size_t j = 0; j < 2 * BIG_BLOCKS; j++) src[t][j] = pat(seed, 200 + t, j);
    a[t] = (uintptr_t)src[t];
    dst[t] = (uintptr_t)peer_addrs[t];
  }
  for (size_t i = 0; i < BIG_BLOCKS; i++) sb[i] = 2 * i, db[i] = i;
  HixlCacheDesc d = {B_TENSORS, 1, 2, {2 * BIG_BLOCKS, 1}, HIXL_CACHE_HOST};
  uint64_t id = 0;
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterBlocksCache(mgr, &d, a, B_TENSORS, NULL, HIXL_CACHE_ACCESS_REMOTE, &id));
  HixlLayerSynchronizer sync = {ready_at_once, NULL, 1000};
  HixlCacheTransferConfig cfg = {CLUSTER_PEER, dst, B_TENSORS, 0, 0, 0};
  HixlCacheAsyncArgs args = {sb, BIG_BLOCKS, db, BIG_BLOCKS, 0, 0, 60000};
  HixlCacheTask *task = NULL;
  TU_ASSERT_OK(HixlCacheManagerTransferCacheAsync(mgr, id, &sync, &cfg, 1, &args, &task));
  if (task) {
    TU_ASSERT_OK(HixlCacheTaskSynchronize(task, 60000));
    HixlStatus res[1] = {12345};
    TU_ASSERT_OK(HixlCacheTaskGetResults(task, res, 1));
    CU_ASSERT_EQUAL(res[0], HIXL_SUCCESS);
    TU_ASSERT_OK(HixlCacheTaskDestroy(task));
  }
  for (uint32_t t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_EQUAL_FATAL(peer(P_GET, 1, t, 0, got).st, 0);
    size_t bad_blocks = 0, bad_rest = 0;
    for (size_t j = 0; j < BIG_BLOCKS; j++) bad_blocks += got[j] != src[t][2 * j];
    for (size_t j = BIG_BLOCKS; j < B_BLOCKS * B_BLOCK; j++) bad_rest += got[j] != pat(PEER_SEED, 100 + t, j);
    CU_ASSERT_EQUAL(bad_blocks, 0);
    CU_ASSERT_EQUAL(bad_rest, 0);
  }
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  for (uint32_t t = 0; t < B_TENSORS; t++) free(src[t]);
  CU_ASSERT_EQUAL(peer(P_FILL, 0, 0, PEER_SEED, NULL).st, 0);
}

/* A lost link comes back with Link (SUCCESS, once; then ALREADY_CONNECTED), and the
 * cache remembered before is pulled over the new link, every byte. Here this side drops
 * it; a producer cuts it the same way when a lease it granted expires. */
static void test_relink(void) {
  static const uint64_t blocks[] = {40, 41, 900};
  static bool moved[B_TENSORS][B_BLOCKS];
  HixlCacheAnyKey k = blocks_key();
  reset_mine();
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 3, blocks, 3, NULL)); /* remembered */
  size_t dropped = 0;
  TU_ASSERT_OK(hixl_engine_drop_peer(eng, peer_addr, "test_relink: cut", &dropped));
  CU_ASSERT_EQUAL(dropped, 1);
  reset_mine();
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 3, blocks, 3, NULL), HIXL_NOT_CONNECTED);
  CU_ASSERT_TRUE(my_blocks_untouched(NULL));
  uint64_t lookups0 = 0;
  HixlCacheStats cs;
  TU_ASSERT_OK(HixlCacheManagerGetStats(mgr, &cs));
  lookups0 = cs.lookups;
  TU_ASSERT_OK(HixlCacheManagerLink(mgr, CLUSTER_PEER, peer_addr, TIMEOUT));
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, CLUSTER_PEER, peer_addr, TIMEOUT), HIXL_ALREADY_CONNECTED);
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 3, blocks, 3, NULL));
  TU_ASSERT_OK(HixlCacheManagerGetStats(mgr, &cs));
  CU_ASSERT_EQUAL(cs.lookups, lookups0); /* the same manager: what it told us still holds */
  memset(moved, 0, sizeof(moved));
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (int i = 0; i < 3; i++) {
      CU_ASSERT_TRUE(my_block_is(t, blocks[i], blocks[i], PEER_SEED));
      moved[t][blocks[i]] = true;
    }
  CU_ASSERT_TRUE(my_blocks_untouched((const bool(*)[B_BLOCKS])moved));
}

/* A stopped peer (SIGSTOP). A lookup needs it to answer: TIMEOUT within the
 * transfer's timeout. Over tcp and rdma a transfer to it ends TIMEOUT on time too, and
 * an async task's Synchronize says TIMEOUT at the caller's bound, then the task ends at
 * its own deadline. Over shm the bytes move through the kernel without the peer
 * running: the remembered cache is pulled, every byte. */
static void test_stopped_peer(void) {
  static const uint64_t blocks[] = {70, 71};
  struct hixl_link_info li;
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(eng, peer_addr, &li));
  bool shm = strcmp(li.transport, "shm") == 0;
  HixlCacheAnyKey k = blocks_key(), unknown = {.kind = HIXL_CACHE_KEY_REQ};
  unknown.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 1234);
  HixlCacheTransferArgs ta = HIXL_CACHE_TRANSFER_ARGS_INIT;
  ta.timeout_ms = 1000;
  reset_mine();
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 2, blocks, 2, &ta)); /* remembered */
  reset_mine();
  CU_ASSERT_EQUAL_FATAL(kill(peer_pid, SIGSTOP), 0);
  int ws = 0; /* stopped for sure: a signal is delivered when the kernel gets to it */
  CU_ASSERT_EQUAL_FATAL(waitpid(peer_pid, &ws, WUNTRACED), peer_pid);
  CU_ASSERT_FATAL(WIFSTOPPED(ws));
  int64_t t0 = tu_now_ms();
  HixlStatus st = HixlCacheManagerPullCache(mgr, &unknown, my_c, 0, &ta);
  if (st != HIXL_TIMEOUT && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "a lookup at a stopped peer: %s (%s)", HixlStatusName(st),
            HixlGetLastErrorMessage());
  CU_ASSERT(tu_now_ms() - t0 < 4000);
  t0 = tu_now_ms();
  st = HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 2, blocks, 2, &ta);
  CU_ASSERT(tu_now_ms() - t0 < 4000);
  if (shm) {
    TU_ASSERT_OK(st);
    CU_ASSERT_TRUE(my_block_is(0, 70, 70, PEER_SEED) && my_block_is(5, 71, 71, PEER_SEED));
  } else {
    CU_ASSERT(st == HIXL_TIMEOUT || st == HIXL_FAILED);
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, B_LAYERS, 0};
    HixlCacheTask *task = NULL;
    if (HixlCacheManagerLink(mgr, CLUSTER_PEER, peer_addr, 100) == HIXL_SUCCESS) /* a timed-out link resets */
      fprintf(stderr, "  [relinked to a stopped peer]\n");
    st = push_task(blocks, 2, &g, 1000, 1500, &task);
    if (st == HIXL_SUCCESS) {
      t0 = tu_now_ms();
      TU_ASSERT_STATUS(HixlCacheTaskSynchronize(task, 100), HIXL_TIMEOUT); /* the caller's bound */
      st = HixlCacheTaskSynchronize(task, 10000);                          /* the task's own deadline */
      CU_ASSERT(st == HIXL_TIMEOUT || st == HIXL_FAILED || st == HIXL_NOT_CONNECTED);
      CU_ASSERT(tu_now_ms() - t0 < 5000);
      TU_ASSERT_OK(HixlCacheTaskDestroy(task));
    } else {
      CU_ASSERT(st == HIXL_NOT_CONNECTED); /* the link reset by the timeout above */
    }
  }
  CU_ASSERT_EQUAL(kill(peer_pid, SIGCONT), 0);
}

/* The peer dies: transfers end FAILED / NOT_CONNECTED / TIMEOUT within their timeout,
 * never hang; Unlink still works. Runs last. */
static void test_dead_peer(void) {
  static const uint64_t blocks[] = {1, 2};
  HixlCacheAnyKey k = blocks_key();
  HixlCacheTransferArgs ta = HIXL_CACHE_TRANSFER_ARGS_INIT;
  ta.timeout_ms = 2000;
  kill(peer_pid, SIGKILL);
  waitpid(peer_pid, NULL, 0);
  peer_pid = -1;
  int64_t t0 = tu_now_ms();
  HixlStatus st = HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 2, blocks, 2, &ta);
  CU_ASSERT(st == HIXL_FAILED || st == HIXL_NOT_CONNECTED || st == HIXL_TIMEOUT);
  CU_ASSERT(tu_now_ms() - t0 < 5000);
  TU_ASSERT_OK(HixlCacheManagerUnlink(mgr, CLUSTER_PEER, 1000));
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, my_b, blocks, 2, blocks, 2, &ta), HIXL_NOT_CONNECTED);
}

/* Caches in allocated memory on both sides (AllocateBlocksCache): pulled byte for
 * byte; on one host the peer's tensors are mapped here and copied with memcpy;
 * unregistering frees them. */
static void test_allocated(void) {
  HixlCacheDesc db = desc_b();
  uintptr_t ab[B_TENSORS];
  uint64_t id = 0, sb[B_BLOCKS], dbk[B_BLOCKS];
  const uint64_t seed = 77;
  TU_ASSERT_STATUS(HixlCacheManagerAllocateBlocksCache(mgr, &db, NULL, NULL, B_TENSORS, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCacheManagerAllocateBlocksCache(mgr, &db, NULL, ab, B_TENSORS - 1, &id),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_OK_FATAL(HixlCacheManagerAllocateBlocksCache(mgr, &db, NULL, ab, B_TENSORS, &id));
  for (uint32_t t = 0; t < B_TENSORS; t++) {
    CU_ASSERT_EQUAL(ab[t] % 4096, 0);
    CU_ASSERT_EQUAL(tu_check_byte((void *)ab[t], B_BLOCKS * B_BLOCK, 0), -1); /* zeroed */
  }
  struct prep r = peer(P_ALLOC_B, 0, 0, seed, NULL);
  CU_ASSERT_EQUAL_FATAL(r.st, HIXL_SUCCESS);
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {CLUSTER_PEER, PEER_MODEL + 1}};
  for (size_t i = 0; i < B_BLOCKS; i++) sb[i] = i, dbk[i] = B_BLOCKS - 1 - i; /* reversed */
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, id, sb, B_BLOCKS, dbk, B_BLOCKS, NULL));
  size_t bad = 0;
  for (uint32_t t = 0; t < B_TENSORS; t++)
    for (size_t i = 0; i < B_BLOCKS; i++)
      for (size_t j = 0; j < B_BLOCK; j++)
        bad += ((uint8_t *)ab[t])[dbk[i] * B_BLOCK + j] != pat(seed, 100 + t, sb[i] * B_BLOCK + j);
  CU_ASSERT_EQUAL(bad, 0);
  struct hixl_link_info li;
  TU_ASSERT_OK(hixl_engine_link_info(eng, peer_addr, &li));
  if (strcmp(li.transport, "shm") == 0) {
    CU_ASSERT(li.mapped >= 1);
    CU_ASSERT(li.map_ops > 0);
  }
  printf("  [%s link, %u of the peer's regions mapped, %llu ops by memcpy]\n", li.transport, li.mapped,
         (unsigned long long)li.map_ops);
  TU_ASSERT_STATUS(peer(P_UNREG_B, 0, 0, r.idb, NULL).st, HIXL_SUCCESS);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  TU_ASSERT_OK(hixl_engine_link_info(eng, peer_addr, &li));
  CU_ASSERT_EQUAL(li.mapped, 0);
}

/* A cache of 3 tensors (K and V cached apart, one tensor a layer, 3 layers), pulled and
 * pushed with the default arguments: every tensor, tensor i to tensor i. The seed asks
 * tensor_num_per_layer (default 2) to divide the tensor count only when a layer range
 * is given (before: PARAM_INVALID, "tensor_num_per_layer 2 must ... divide the
 * source's 3 tensors", nothing moved). With a range it still must. */
static void test_odd_tensors_default_args(void) {
  static uint8_t *odd[ODD_TENSORS];
  static uint8_t got[B_BLOCKS * B_BLOCK];
  const uint64_t sb[] = {5, 6, 900}, db[] = {1, 2, 3}, pdb[] = {10, 11, 12};
  const uint64_t seed = 33;
  HixlCacheDesc d = desc_b();
  d.num_tensors = ODD_TENSORS;
  uintptr_t a[ODD_TENSORS];
  for (uint32_t t = 0; t < ODD_TENSORS; t++) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(odd[t] = malloc(B_BLOCKS * B_BLOCK));
    memset(odd[t], SENTINEL, B_BLOCKS * B_BLOCK);
    a[t] = (uintptr_t)odd[t];
  }
  uint64_t id = 0;
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterBlocksCache(mgr, &d, a, ODD_TENSORS, NULL, HIXL_CACHE_ACCESS_REMOTE, &id));
  struct prep r = peer(P_ALLOC_ODD, 0, 0, seed, NULL);
  CU_ASSERT_EQUAL_FATAL(r.st, HIXL_SUCCESS);
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {CLUSTER_PEER, PEER_MODEL + 2}};
  HixlBlocksCacheKey pk = {CLUSTER_PEER, PEER_MODEL + 2};
  /* a layer range with the default 2 tensors a layer: refused, nothing moved */
  HixlCacheTransferArgs ranged = HIXL_CACHE_TRANSFER_ARGS_INIT;
  ranged.src_layer_count = ranged.dst_layer_count = 1;
  TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &k, id, sb, 3, db, 3, &ranged), HIXL_PARAM_INVALID);
  /* pull, every tensor: the blocks asked, the rest untouched */
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &k, id, sb, 3, db, 3, NULL));
  for (uint32_t t = 0; t < ODD_TENSORS; t++) {
    size_t bad = 0;
    for (size_t b = 0; b < B_BLOCKS; b++) {
      int i = b >= 1 && b <= 3 ? (int)b - 1 : -1;
      for (size_t j = 0; j < B_BLOCK; j++)
        bad += odd[t][b * B_BLOCK + j] != (i >= 0 ? pat(seed, 100 + t, sb[i] * B_BLOCK + j) : SENTINEL);
    }
    CU_ASSERT_EQUAL(bad, 0);
  }
  /* push them back into the peer's blocks 10, 11, 12; its other blocks stay its own */
  TU_ASSERT_OK(HixlCacheManagerPushBlocks(mgr, &pk, id, db, 3, pdb, 3, NULL));
  for (uint32_t t = 0; t < ODD_TENSORS; t++) {
    struct iovec local = {got, sizeof(got)};
    struct iovec remote = {(void *)(uintptr_t)r.addrs_b[t], sizeof(got)};
    CU_ASSERT_EQUAL_FATAL(process_vm_readv(peer_pid, &local, 1, &remote, 1, 0), (ssize_t)sizeof(got));
    size_t bad = 0;
    for (size_t b = 0; b < B_BLOCKS; b++) {
      int i = b >= 10 && b <= 12 ? (int)b - 10 : -1;
      for (size_t j = 0; j < B_BLOCK; j++)
        bad += got[b * B_BLOCK + j] != pat(seed, 100 + t, (i >= 0 ? sb[i] : b) * B_BLOCK + j);
    }
    CU_ASSERT_EQUAL(bad, 0);
  }
  TU_ASSERT_STATUS(peer(P_UNREG_B, 0, 0, r.idb, NULL).st, HIXL_SUCCESS);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  for (uint32_t t = 0; t < ODD_TENSORS; t++) free(odd[t]);
}

/* Two threads register one CacheKey at once, RACE_TRIALS times: exactly one succeeds
 * each time, the other is refused naming the key (issue 28: the key was checked under
 * the lock and inserted after the engine registration, so both could succeed). */
enum { RACE_TRIALS = 40 };
struct race_arg {
  atomic_int *ready, *go; /* spun on, not slept on: both threads leave within nanoseconds */
  uint8_t *mem[C_TENSORS];
  uint64_t req, id;
  HixlStatus st;
};

static void *race_register(void *p) {
  struct race_arg *a = p;
  HixlCacheDesc d = desc_c();
  HixlCacheKey key = HIXL_CACHE_KEY_INIT(CLUSTER_ME, a->req);
  uintptr_t addrs[C_TENSORS];
  for (int t = 0; t < C_TENSORS; t++) addrs[t] = (uintptr_t)a->mem[t];
  atomic_fetch_add(a->ready, 1);
  while (!atomic_load(a->go)) {
  }
  a->st = HixlCacheManagerRegisterCache(mgr, &d, addrs, C_TENSORS, &key, 1, HIXL_CACHE_ACCESS_REMOTE, &a->id);
  return NULL;
}

static void test_register_race(void) {
  struct race_arg a[2];
  atomic_int ready, go;
  memset(a, 0, sizeof(a));
  for (int i = 0; i < 2; i++)
    for (int t = 0; t < C_TENSORS; t++) CU_ASSERT_FATAL((a[i].mem[t] = calloc(1, C_BATCH * C_ITEM)) != NULL);
  for (uint64_t trial = 0; trial < RACE_TRIALS; trial++) {
    pthread_t th[2];
    atomic_store(&ready, 0);
    atomic_store(&go, 0);
    for (int i = 0; i < 2; i++) {
      a[i].ready = &ready;
      a[i].go = &go;
      a[i].req = 5000 + trial;
      CU_ASSERT_FATAL(pthread_create(&th[i], NULL, race_register, &a[i]) == 0);
    }
    while (atomic_load(&ready) < 2) {
    }
    atomic_store(&go, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    int won = (a[0].st == HIXL_SUCCESS) + (a[1].st == HIXL_SUCCESS);
    CU_ASSERT_EQUAL(won, 1);
    for (int i = 0; i < 2; i++) {
      if (a[i].st == HIXL_SUCCESS)
        TU_ASSERT_STATUS(HixlCacheManagerUnregisterCache(mgr, a[i].id), HIXL_SUCCESS);
      else
        CU_ASSERT_EQUAL(a[i].st, HIXL_PARAM_INVALID);
    }
    if (won != 1) break;
  }
  for (int i = 0; i < 2; i++)
    for (int t = 0; t < C_TENSORS; t++) free(a[i].mem[t]);
}

/* ---- a manager's Destroy: all or nothing ---- */

static struct tu_hold destroy_hold = TU_HOLD_INIT;
struct destroy_call {
  HixlEngine *e;
  HixlCacheManager *m;
  const char *peer;
  HixlStatus st;
};

static void *hold_peer(void *p) { /* keeps the peer's progress thread in its handler */
  struct destroy_call *d = p;
  uint8_t ans[8];
  size_t n;
  d->st = hixl_engine_call(d->e, d->peer, 3, "x", 1, ans, sizeof(ans), &n, 20000);
  return NULL;
}

static void *link_peer(void *p) { /* a Link whose HELLO waits on the held peer */
  struct destroy_call *d = p;
  d->st = HixlCacheManagerLink(d->m, 77, d->peer, 20000);
  return NULL;
}

static uint32_t calls_of(HixlCacheManager *m) {
  pthread_mutex_lock(&m->lock);
  uint32_t n = m->calls;
  pthread_mutex_unlock(&m->lock);
  return n;
}

static bool closing_of(HixlCacheManager *m) {
  pthread_mutex_lock(&m->lock);
  bool c = m->closing;
  pthread_mutex_unlock(&m->lock);
  return c;
}

static void *destroy_mgr(void *p) {
  struct destroy_call *d = p;
  d->st = HixlCacheManagerDestroy(d->m);
  return NULL;
}

/* GetStats while Destroy is under way (held in its first deregistration: the engine's
 * lock is a held service handler's): PARAM_INVALID, as every other call (before:
 * SUCCESS, read from the manager Destroy was freeing); Destroy then ends. */
static struct tu_hold stats_hold = TU_HOLD_INIT;
static void test_stats_during_destroy(void) {
  char aa[TU_ADDR_LEN], ab[TU_ADDR_LEN];
  HixlEngine *a = tu_engine_start_with(tu_addr(aa, sizeof(aa), tu_free_port()), "tcp");
  HixlEngine *b = tu_engine_start_with(tu_addr(ab, sizeof(ab), tu_free_port()), "tcp");
  CU_ASSERT_FATAL(a && b);
  struct caches k;
  caches_alloc(&k);
  HixlCacheManager *m;
  uint64_t idc, idb;
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(a, CLUSTER_PEER, &m));
  TU_ASSERT_OK_FATAL(register_both(m, &k, 1, 1, &idc, &idb));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(a, 3, tu_hold_handler, &stats_hold));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(b, aa, TIMEOUT));
  struct destroy_call h = {b, NULL, aa, -1}, d = {a, m, NULL, -1};
  pthread_t th, td;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, hold_peer, &h) == 0);
  tu_hold_entered(&stats_hold); /* a's progress thread holds a's lock */
  CU_ASSERT_FATAL(pthread_create(&td, NULL, destroy_mgr, &d) == 0);
  for (int64_t end = tu_now_ms() + 10000; !closing_of(m) && tu_now_ms() < end;) sched_yield();
  CU_ASSERT_TRUE(closing_of(m));
  HixlCacheStats s;
  TU_ASSERT_STATUS(HixlCacheManagerGetStats(m, &s), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("being destroyed");
  hixl_cache_unpin(m, idb); /* refused too: nothing to see, nothing touched */
  tu_hold_release(&stats_hold);
  pthread_join(td, NULL);
  pthread_join(th, NULL);
  TU_ASSERT_OK(d.st);
  TU_ASSERT_OK(h.st);
  TU_ASSERT_OK(HixlEngineDestroy(b));
  TU_ASSERT_OK(HixlEngineDestroy(a));
  for (int t = 0; t < C_TENSORS; t++) free(k.c[t]);
  for (int t = 0; t < B_TENSORS; t++) free(k.b[t]);
}

/* A peer's lookup of k, answered by m's CACHE service as on the engine's progress thread:
 * the cache it names (*id), else the status and its reason (why). */
static HixlStatus serve_lookup(HixlCacheManager *m, HixlCacheAnyKey k, uint64_t *id, char *why, size_t cap) {
  uint8_t req[64], ans[256];
  size_t n = 0;
  struct be_out o = be_out_fixed(req, sizeof(req));
  be_out_u8(&o, CM_PROTO);
  be_out_u8(&o, CM_OP_LOOKUP);
  cm_put_key(&o, &k);
  HixlStatus st = cm_serve(m, "test", req, o.len, ans, sizeof(ans), &n);
  struct cm_view v;
  memset(&v, 0, sizeof(v));
  snprintf(why, cap, "%.*s", st == HIXL_SUCCESS ? 0 : (int)n, (const char *)ans);
  if (st == HIXL_SUCCESS && !cm_get_view(ans, n, &v)) return HIXL_FAILED;
  *id = v.id;
  free(v.addrs);
  return st;
}

/* The lookups of the caches of test_destroy_whole_or_nothing (cluster CLUSTER_PEER): the
 * contiguous cache by CacheKey req 1 at idc, the blocks cache by model 1 at idb, and
 * CacheKey req 2 naming nothing. */
static void expect_lookups(HixlCacheManager *m, uint64_t idc, uint64_t idb) {
  HixlCacheAnyKey kc = {.kind = HIXL_CACHE_KEY_REQ, .u.req = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 1)};
  HixlCacheAnyKey kx = {.kind = HIXL_CACHE_KEY_REQ, .u.req = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 2)};
  HixlCacheAnyKey kb = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {CLUSTER_PEER, 1}};
  uint64_t id = 0;
  char why[320];
  TU_ASSERT_OK(serve_lookup(m, kc, &id, why, sizeof(why)));
  CU_ASSERT_EQUAL(id, idc);
  TU_ASSERT_OK(serve_lookup(m, kb, &id, why, sizeof(why)));
  CU_ASSERT_EQUAL(id, idb);
  TU_ASSERT_STATUS(serve_lookup(m, kx, &id, why, sizeof(why)), HIXL_NOT_FOUND);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "names no cache"));
}

/* A peer's lookups of caches registered without remote access (a CacheKey, a
 * BlocksCacheKey, their ids with a batch item in range and out of it) get the answer a
 * key that names nothing gets: NOT_FOUND, "names no cache", no word of the cache's id,
 * access or batch size (before: "cache N of cluster C is registered without remote
 * access", and "cache N has 4 batch items" for an index out of range). A cache with
 * remote access beside them is found, and its batch size is told as before. */
static void test_local_caches_unseen(void) {
  char addr[TU_ADDR_LEN];
  HixlEngine *e = tu_engine_start_with(tu_addr(addr, sizeof(addr), tu_free_port()), "tcp");
  CU_ASSERT_FATAL(e != NULL);
  struct caches k, r;
  caches_alloc(&k);
  caches_alloc(&r);
  HixlCacheManager *m;
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(e, CLUSTER_PEER, &m));
  HixlCacheDesc dc = desc_c(), db = desc_b();
  HixlCacheKey key = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 3);
  HixlBlocksCacheKey bkey = {CLUSTER_PEER, 3};
  uintptr_t ac[C_TENSORS], ab[B_TENSORS];
  for (int t = 0; t < C_TENSORS; t++) ac[t] = (uintptr_t)k.c[t];
  for (int t = 0; t < B_TENSORS; t++) ab[t] = (uintptr_t)k.b[t];
  uint64_t idc, idb, ridc, ridb, id = 0;
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterCache(m, &dc, ac, C_TENSORS, &key, 1, HIXL_CACHE_ACCESS_LOCAL, &idc));
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterBlocksCache(m, &db, ab, B_TENSORS, &bkey, HIXL_CACHE_ACCESS_LOCAL, &idb));
  TU_ASSERT_OK_FATAL(register_both(m, &r, 4, 4, &ridc, &ridb));
  HixlCacheAnyKey keys[] = {
      {.kind = HIXL_CACHE_KEY_REQ, .u.req = key},
      {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = bkey},
      {.kind = HIXL_CACHE_KEY_ID, .u.id = {CLUSTER_PEER, idc, 0}},
      {.kind = HIXL_CACHE_KEY_ID, .u.id = {CLUSTER_PEER, idc, C_BATCH}},
      {.kind = HIXL_CACHE_KEY_ID, .u.id = {CLUSTER_PEER, idb, 0}},
  };
  char why[320], text[32];
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    TU_ASSERT_STATUS(serve_lookup(m, keys[i], &id, why, sizeof(why)), HIXL_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "names no cache"));
    CU_ASSERT_PTR_NULL(strstr(why, "remote access"));
    CU_ASSERT_PTR_NULL(strstr(why, "batch items"));
    if (keys[i].kind != HIXL_CACHE_KEY_ID) { /* the id is in the key's own text only */
      snprintf(text, sizeof(text), "cache %" PRIu64, keys[i].kind == HIXL_CACHE_KEY_REQ ? idc : idb);
      CU_ASSERT_PTR_NULL(strstr(why, text));
    }
  }
  HixlCacheAnyKey found = {.kind = HIXL_CACHE_KEY_ID, .u.id = {CLUSTER_PEER, ridc, 0}};
  TU_ASSERT_OK(serve_lookup(m, found, &id, why, sizeof(why)));
  CU_ASSERT_EQUAL(id, ridc);
  found.u.id.batch_index = C_BATCH;
  TU_ASSERT_STATUS(serve_lookup(m, found, &id, why, sizeof(why)), HIXL_NOT_FOUND);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "batch items"));
  TU_ASSERT_OK(HixlCacheManagerDestroy(m));
  TU_ASSERT_OK(HixlEngineDestroy(e));
  for (int t = 0; t < C_TENSORS; t++) free(k.c[t]), free(r.c[t]);
  for (int t = 0; t < B_TENSORS; t++) free(k.b[t]), free(r.b[t]);
}

/* Destroy while the engine refuses a cache's deregistration (a transfer of the caller's
 * own in flight on it: FAILED, and the manager and its cache stay whole, before: freed,
 * the registration left in the engine for good and a second Destroy a use after free), or
 * while another call is under way (a Link waiting for its peer: FAILED, before: freed
 * under it); once both ended, SUCCESS and the memory registers again. After the engine's
 * Finalize, Destroy frees all and takes its service away (before: FAILED, the freed
 * manager left as the engine's CACHE handler, and a new manager refused). */
static void test_destroy_whole_or_nothing(void) {
  char aa[TU_ADDR_LEN], ab[TU_ADDR_LEN];
  HixlEngine *a = tu_engine_start_with(tu_addr(aa, sizeof(aa), tu_free_port()), "tcp"); /* the peer answers */
  HixlEngine *b = tu_engine_start_with(tu_addr(ab, sizeof(ab), tu_free_port()), "tcp");
  CU_ASSERT_FATAL(a && b);
  struct caches k;
  caches_alloc(&k);
  caches_fill(&k, 9);
  uint8_t *bmem = calloc(1, B_BLOCKS * B_BLOCK);
  CU_ASSERT_FATAL(bmem && tu_register(b, bmem, B_BLOCKS * B_BLOCK));
  HixlCacheManager *m;
  uint64_t idc, idb;
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(a, CLUSTER_PEER, &m));
  TU_ASSERT_OK_FATAL(register_both(m, &k, 1, 1, &idc, &idb));
  /* A third cache, CacheKey req 2, registered last: Destroy deregisters it first. */
  uint8_t *xmem = calloc(C_TENSORS, C_BATCH * C_ITEM);
  HixlCacheDesc dx = desc_c();
  HixlCacheKey kx = HIXL_CACHE_KEY_INIT(CLUSTER_PEER, 2);
  uintptr_t ax[C_TENSORS];
  uint64_t idx;
  CU_ASSERT_FATAL(xmem != NULL);
  for (int t = 0; t < C_TENSORS; t++) ax[t] = (uintptr_t)(xmem + t * C_BATCH * C_ITEM);
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterCache(m, &dx, ax, C_TENSORS, &kx, 1, HIXL_CACHE_ACCESS_REMOTE, &idx));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(b, 3, tu_hold_handler, &destroy_hold));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(a, ab, TIMEOUT));
  struct destroy_call h = {a, NULL, ab, -1}, l = {a, m, ab, -1};
  pthread_t th, tl;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, hold_peer, &h) == 0);
  tu_hold_entered(&destroy_hold);
  /* A WRITE from the blocks cache's tensor 0 (64 KiB: sent from it, not staged), unanswered
   * while the peer is held. */
  HixlTransferOpDesc op = {(uintptr_t)k.b[0], (uintptr_t)bmem, B_BLOCKS * B_BLOCK};
  HixlTransferReq r;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(a, ab, HIXL_WRITE, &op, 1, 20000, NULL, &r));
  TU_ASSERT_STATUS(HixlCacheManagerDestroy(m), HIXL_FAILED);
  /* Destroy freed the third cache before the engine refused the blocks cache: the third's
   * key names nothing and is free, the others' are found as before; and so after an
   * UnregisterCache the engine refuses. */
  expect_lookups(m, idc, idb);
  TU_ASSERT_OK(HixlCacheManagerRegisterCache(m, &dx, ax, C_TENSORS, &kx, 1, HIXL_CACHE_ACCESS_LOCAL, &idx));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(m, idx));
  TU_ASSERT_STATUS(HixlCacheManagerUnregisterCache(m, idb), HIXL_FAILED);
  expect_lookups(m, idc, idb);
  HixlMemDesc md = {(uintptr_t)k.b[0], B_BLOCKS * B_BLOCK};
  HixlMemHandle again;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(a, &md, HIXL_MEM_HOST, &again), HIXL_PARAM_INVALID); /* still its */
  HixlCacheStats stats;
  TU_ASSERT_OK(HixlCacheManagerGetStats(m, &stats)); /* usable */
  CU_ASSERT_FATAL(pthread_create(&tl, NULL, link_peer, &l) == 0);
  for (int64_t end = tu_now_ms() + 10000; calls_of(m) == 0 && tu_now_ms() < end;) sched_yield();
  CU_ASSERT_EQUAL(calls_of(m), 1);
  TU_ASSERT_STATUS(HixlCacheManagerDestroy(m), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("1 other calls");
  tu_hold_release(&destroy_hold);
  pthread_join(tl, NULL);
  pthread_join(th, NULL);
  HixlTransferStatus ts;
  TU_ASSERT_OK(tu_wait_request(a, r, tu_now_ms() + 20000, &ts));
  CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_OK(HixlCacheManagerDestroy(m));
  TU_ASSERT_OK(HixlEngineRegisterMem(a, &md, HIXL_MEM_HOST, &again)); /* the cache's registration is gone */
  TU_ASSERT_OK(HixlEngineDeregisterMem(a, again));
  /* After the engine's Finalize. */
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(a, CLUSTER_PEER, &m));
  TU_ASSERT_OK(register_both(m, &k, 1, 1, &idc, &idb));
  TU_ASSERT_OK(HixlEngineFinalize(a));
  TU_ASSERT_OK(HixlCacheManagerDestroy(m));
  TU_ASSERT_OK(HixlEngineInitialize(a, aa, NULL, 0));
  TU_ASSERT_OK(HixlCacheManagerCreate(a, CLUSTER_PEER, &m));
  TU_ASSERT_OK(HixlCacheManagerDestroy(m));
  TU_ASSERT_OK(HixlEngineDestroy(a));
  TU_ASSERT_OK(HixlEngineDestroy(b));
  for (int t = 0; t < C_TENSORS; t++) free(k.c[t]);
  for (int t = 0; t < B_TENSORS; t++) free(k.b[t]);
  free(bmem);
  free(xmem);
}

int main(void) {
  int down[2], up[2];
  signal(SIGPIPE, SIG_IGN);
  if (pipe(down) != 0 || pipe(up) != 0) return 1;
  peer_pid = fork(); /* before this process opens any engine or device */
  if (peer_pid < 0) return 1;
  if (peer_pid == 0) {
    close(down[1]);
    close(up[0]);
    peer_main(down[0], up[1]);
  }
  close(down[0]);
  close(up[1]);
  to_peer = down[1];
  from_peer = up[0];
  CU_TestInfo tests[] = {
      {"arguments of every call", test_args},
      {"pull blocks by BlocksCacheKey, others untouched", test_pull_blocks},
      {"adjacent blocks coalesce: 1024 blocks, one op per tensor", test_coalescing},
      {"layer ranges, one or two tensors per layer", test_layer_ranges},
      {"push blocks", test_push_blocks},
      {"a destination block twice, a list longer than the cache: refused", test_repeated_dst_blocks},
      {"async: a block size with no blocks named: refused", test_async_block_size_without_blocks},
      {"contiguous: CacheKey, id and index, size, push", test_contiguous},
      {"layout mismatches move nothing", test_mismatches},
      {"NOT_FOUND: no such key, unregistered, found again", test_not_found},
      {"async: no byte of layer l before its release", test_async_pipelined},
      {"async: a layer never ready fails the task", test_async_not_ready},
      {"async: a synchronizer answering neither 1 nor 0 sends nothing of the layer", test_async_garbage_sync},
      {"async: a synchronizer destroying its own task is refused", test_async_self_destroy},
      {"async: a layer of more ops than one engine call takes, sent whole", test_async_layer_past_batch},
      {"hixl_cache_unpin: a then-call's pin only, never a task's", test_unpin_only_then_pins},
      {"allocated caches: pulled, mapped on one host, freed", test_allocated},
      {"3 tensors with the default arguments: every tensor, pulled and pushed",
       test_odd_tensors_default_args},
      {"one CacheKey registered by two threads at once: one wins", test_register_race},
      {"a manager's Destroy: refused while in use, whole or not at all", test_destroy_whole_or_nothing},
      {"GetStats while Destroy is under way: refused, as every call", test_stats_during_destroy},
      {"caches without remote access: a peer's lookup learns nothing of them", test_local_caches_unseen},
      {"a lost link comes back with Link", test_relink},
      {"a stopped peer: TIMEOUT on time", test_stopped_peer},
      {"a dead peer: FAILED, never a hang", test_dead_peer},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"cache manager, two processes", suite_init, suite_clean, NULL, NULL, tests},
                           CU_SUITE_INFO_NULL};
  int rc = 1;
  if (CU_initialize_registry() == CUE_SUCCESS && CU_register_suites(suites) == CUE_SUCCESS)
    rc = tu_run_registry();
  if (peer_pid > 0) {
    struct pcmd q = {P_QUIT, 0, 0, 0, 0};
    tu_write_all(to_peer, &q, sizeof(q));
    close(to_peer);
    waitpid(peer_pid, NULL, 0);
  }
  return rc;
}
