/* test_cache_peer: the cache manager against a hostile or slow peer.
 *
 * One process, two engines over tcp on loopback. Engine A holds cluster 1's manager with
 * a contiguous cache (4 tensors, 4 batch items of 128 bytes) and a blocks cache (4
 * tensors, 16 blocks of 32 bytes), every tensor between guard bytes, all filled with a
 * sentinel. Engine B has no manager: a fake CACHE service there answers HELLO and LOOKUP
 * with whatever the test sets, and B registers a buffer of patterned bytes the answers
 * point into. Checked: HELLO answers that lie (another cluster, short, long) leave no
 * link; LOOKUP answers that lie (more tensors than here, an item smaller than here,
 * element size 0 or other, batch index outside, address wrapping 2^64, a count near
 * 2^32, truncated, trailing bytes, an unknown kind byte, another kind of cache, another
 * cache or item than an id key named) move nothing and leave every local byte as it
 * was; an honest answer moves exactly the item asked; and a peer that answers a lookup
 * late and then stalls the transfer ends the pull TIMEOUT within the caller's one
 * timeout (the lookup and the transfer each had a timeout of their own: twice it). A
 * third engine holds a real manager (cluster 3): its service refuses malformed requests
 * (old layout, unknown op, trailing bytes, bad keys) with a reason, and its cache
 * unregistered and registered again over and over while this side pulls and floods it
 * with lookups moves right bytes or is refused. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache_int.h"
#include "engine/engine_ext.h"
#include "test_util.h"

enum {
  ME = 1,
  PEER = 2,
  NT = 4,       /* tensors of each local cache */
  BATCH = 4,    /* contiguous: batch items */
  ITEM = 128,   /* contiguous: bytes of an item (64 elements of 2 bytes) */
  TB = 512,     /* bytes of a tensor, both caches */
  BLOCKS = 16,  /* blocks cache: blocks of BLK bytes */
  BLK = 32,     /* 16 elements of 2 bytes */
  GUARD = 64,   /* sentinel bytes around each local tensor */
  SENT = 0xEE,  /* the local sentinel */
  PBUF = 16384, /* the peer's registered buffer */
  REQ_ID = 7,
  MODEL = 5,
  T_MS = 3000,
};

static HixlEngine *ea, *eb;
static HixlCacheManager *mgr;
static char b_addr[TU_ADDR_LEN];
static uint8_t *lbuf, *pbuf; /* local tensors (with guards); the peer's memory */
static uint64_t cid, bid;    /* local caches */
static HixlMemHandle ph;

static uint8_t *ltensor(int cache, int t) { return lbuf + GUARD + (size_t)(cache * NT + t) * (TB + GUARD); }
static size_t lbuf_len(void) { return GUARD + (size_t)2 * NT * (TB + GUARD); }

/* ---- the fake CACHE service on B ---- */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint8_t hello[32], ans[256];
  size_t hello_len, ans_len;
  unsigned lookups;
  bool slow, entered, go; /* slow: a lookup waits for go, then sleeps delay_ms */
  int delay_ms;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static HixlStatus fake_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                             size_t cap, size_t *resp_len) {
  (void)ctx, (void)peer;
  pthread_mutex_lock(&fk.mu);
  bool lookup = len >= 2 && req[1] == CM_OP_LOOKUP;
  if (lookup) fk.lookups++;
  if (lookup && fk.slow) {
    fk.entered = true;
    pthread_cond_broadcast(&fk.cv);
    while (!fk.go) pthread_cond_wait(&fk.cv, &fk.mu);
    struct timespec d = {fk.delay_ms / 1000, (long)(fk.delay_ms % 1000) * 1000000L};
    nanosleep(&d, NULL); /* the peer is slow: this is the delay under test, not a wait for an event */
  }
  size_t n = lookup ? fk.ans_len : fk.hello_len;
  memcpy(resp, lookup ? fk.ans : fk.hello, n < cap ? n : cap);
  *resp_len = n < cap ? n : cap;
  pthread_mutex_unlock(&fk.mu);
  return HIXL_SUCCESS;
}

static void set_hello(uint64_t cluster, size_t len) {
  pthread_mutex_lock(&fk.mu);
  struct be_out o = be_out_fixed(fk.hello, sizeof(fk.hello));
  be_out_u64(&o, cluster);
  be_out_u64(&o, 0x1234);
  while (o.len < len) be_out_u8(&o, 0);
  fk.hello_len = len;
  pthread_mutex_unlock(&fk.mu);
}

/* A LOOKUP answer as cache_codec.c lays it out; addresses: the peer's tensors at
 * pbuf + t * stride; extra bytes appended (negative: that many dropped). */
struct ans {
  uint8_t blocks;
  uint32_t n, elem, batch;
  uint64_t shape0, tbytes, addr0, stride;
  int extra;
};

static void set_answer(struct ans a) {
  pthread_mutex_lock(&fk.mu);
  struct be_out o = be_out_fixed(fk.ans, sizeof(fk.ans));
  be_out_u64(&o, 99);
  be_out_u8(&o, a.blocks);
  be_out_u32(&o, a.n);
  be_out_u32(&o, a.elem);
  be_out_u32(&o, a.batch);
  be_out_u64(&o, a.shape0);
  be_out_u64(&o, a.tbytes);
  uint32_t na = a.n < 16 ? a.n : 1; /* a count past what fits: one address, as a liar might */
  for (uint32_t t = 0; t < na; t++)
    be_out_u64(&o, a.addr0 ? a.addr0 + t * a.stride : (uint64_t)(uintptr_t)pbuf + t * a.stride);
  for (int k = 0; k < a.extra; k++) be_out_u8(&o, 0);
  fk.ans_len = a.extra < 0 ? o.len - (size_t)-a.extra : o.len;
  pthread_mutex_unlock(&fk.mu);
  CU_ASSERT_FATAL(!o.bad);
}

/* An honest contiguous answer: NT tensors of TB bytes, item 1 of 4, as the local one. */
static struct ans honest(void) { return (struct ans){0, NT, 2, 1, BATCH, TB, 0, TB, 0}; }

static bool local_untouched(void) { return tu_check_byte(lbuf, lbuf_len(), SENT) < 0; }

static void reset_local(void) { memset(lbuf, SENT, lbuf_len()); }

static HixlCacheAnyKey req_key(void) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_REQ};
  k.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(PEER, REQ_ID);
  return k;
}

static HixlCacheAnyKey blocks_key(void) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS};
  k.u.blocks = (HixlBlocksCacheKey){PEER, MODEL};
  return k;
}

static int suite_init(void) {
  char a[TU_ADDR_LEN];
  tu_addr(b_addr, sizeof(b_addr), tu_free_port());
  if (!(eb = tu_engine_start_with(b_addr, "tcp")) ||
      !(ea = tu_engine_start_with(tu_addr(a, sizeof(a), 0), "tcp")))
    return 1;
  if (hixl_engine_set_service(eb, HIXL_SERVICE_CACHE, fake_serve, NULL) != HIXL_SUCCESS) return 1;
  if (!(pbuf = malloc(PBUF)) || !(lbuf = malloc(lbuf_len()))) return 1;
  tu_fill(pbuf, PBUF, 77);
  if (!(ph = tu_register(eb, pbuf, PBUF))) return 1;
  reset_local();
  if (HixlCacheManagerCreate(ea, ME, &mgr) != HIXL_SUCCESS) return 1;
  HixlCacheDesc dc = {NT, 2, 2, {BATCH, ITEM / 2}, HIXL_CACHE_HOST};
  HixlCacheDesc db = {NT, 2, 2, {BLOCKS, BLK / 2}, HIXL_CACHE_HOST};
  uintptr_t ac[NT], ab[NT];
  for (int t = 0; t < NT; t++) {
    ac[t] = (uintptr_t)ltensor(0, t);
    ab[t] = (uintptr_t)ltensor(1, t);
  }
  if (HixlCacheManagerRegisterCache(mgr, &dc, ac, NT, NULL, 0, HIXL_CACHE_ACCESS_REMOTE, &cid) !=
          HIXL_SUCCESS ||
      HixlCacheManagerRegisterBlocksCache(mgr, &db, ab, NT, NULL, HIXL_CACHE_ACCESS_REMOTE, &bid) !=
          HIXL_SUCCESS)
    return 1;
  return 0;
}

static int suite_clean(void) {
  if (mgr) HixlCacheManagerDestroy(mgr);
  if (ea) HixlEngineDestroy(ea);
  if (eb) HixlEngineDestroy(eb);
  free(lbuf);
  free(pbuf);
  return 0;
}

/* HELLO answers that lie leave no link; the honest one links. Runs first. */
static void test_hello_lies(void) {
  HixlCacheAnyKey k = req_key();
  set_hello(PEER + 1, 16); /* another cluster */
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, PEER, b_addr, T_MS), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("is cluster 3");
  set_hello(PEER, 8); /* short */
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, PEER, b_addr, T_MS), HIXL_FAILED);
  set_hello(PEER, 24); /* long: the engine refuses more than asked for */
  TU_ASSERT_STATUS(HixlCacheManagerLink(mgr, PEER, b_addr, T_MS), HIXL_FAILED);
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL), HIXL_NOT_CONNECTED);
  set_hello(PEER, 16);
  TU_ASSERT_OK(HixlCacheManagerLink(mgr, PEER, b_addr, T_MS));
  CU_ASSERT_TRUE(local_untouched());
}

/* The honest answer moves item 1 of each peer tensor into local item 0, nothing else. */
static void test_honest(void) {
  HixlCacheAnyKey k = req_key();
  reset_local();
  set_answer(honest());
  TU_ASSERT_OK(HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL));
  for (int t = 0; t < NT; t++) {
    TU_ASSERT_SAME(ltensor(0, t), pbuf + t * TB + ITEM, ITEM, "the pulled item");
    memset(ltensor(0, t), SENT, ITEM);
  }
  CU_ASSERT_TRUE(local_untouched());
  /* A peer item larger than ours: only ours moves (size -1 is the local item). */
  struct ans big = honest();
  big.tbytes = 2 * TB;
  big.stride = 2 * TB;
  set_answer(big);
  TU_ASSERT_OK(HixlCacheManagerPullCache(mgr, &k, cid, 2, NULL));
  for (int t = 0; t < NT; t++) {
    TU_ASSERT_SAME(ltensor(0, t) + 2 * ITEM, pbuf + t * 2 * TB + 2 * ITEM, ITEM, "the pulled item");
    memset(ltensor(0, t) + 2 * ITEM, SENT, ITEM);
  }
  CU_ASSERT_TRUE(local_untouched());
}

/* Every lying answer: refused (want), and no local byte written. */
static void test_answer_lies(void) {
  HixlCacheAnyKey k = req_key();
  struct {
    const char *what;
    struct ans a;
    HixlStatus want;
  } lies[] = {
      {"more tensors than here", {0, 2 * NT, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_PARAM_INVALID},
      {"fewer tensors than here", {0, NT / 2, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_PARAM_INVALID},
      {"an item smaller than here", {0, NT, 2, 1, BATCH, TB / 2, 0, TB, 0}, HIXL_PARAM_INVALID},
      {"element size 0", {0, NT, 0, 1, BATCH, TB, 0, TB, 0}, HIXL_FAILED},
      {"another element size", {0, NT, 4, 1, BATCH, TB, 0, TB, 0}, HIXL_PARAM_INVALID},
      {"batch index outside", {0, NT, 2, BATCH, BATCH, TB, 0, TB, 0}, HIXL_FAILED},
      {"shape[0] 0", {0, NT, 2, 0, 0, TB, 0, TB, 0}, HIXL_FAILED},
      {"tensor bytes not whole items", {0, NT, 2, 1, 3, TB, 0, TB, 0}, HIXL_FAILED},
      {"an address wrapping 2^64", {0, NT, 2, 1, BATCH, TB, UINT64_MAX - 255, 0, 0}, HIXL_FAILED},
      {"address 0", {0, NT, 2, 1, BATCH, TB, 0, 0, 0}, HIXL_FAILED},
      {"a tensor past 2^48 bytes", {0, NT, 2, 1, 1, UINT64_C(1) << 49, 0, TB, 0}, HIXL_FAILED},
      {"a count near 2^32", {0, UINT32_MAX, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_FAILED},
      {"a count past the limit", {0, HIXL_CACHE_MAX_ADDRS + 1, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_FAILED},
      {"truncated", {0, NT, 2, 1, BATCH, TB, 0, TB, -3}, HIXL_FAILED},
      {"trailing bytes", {0, NT, 2, 1, BATCH, TB, 0, TB, 5}, HIXL_FAILED},
      {"a blocks cache", {1, NT, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_PARAM_INVALID},
      {"an unknown kind byte", {2, NT, 2, 1, BATCH, TB, 0, TB, 0}, HIXL_FAILED},
  };
  for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
    reset_local();
    set_answer(lies[i].a);
    if (strcmp(lies[i].what, "address 0") == 0) { /* every address 0 */
      pthread_mutex_lock(&fk.mu);
      memset(fk.ans + 37, 0, fk.ans_len - 37);
      pthread_mutex_unlock(&fk.mu);
    }
    HixlStatus st = HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL);
    if (st != lies[i].want)
      tu_fail(__FILE__, __LINE__, "an answer with %s: %s (%s), want %s", lies[i].what, HixlStatusName(st),
              HixlGetLastErrorMessage(), HixlStatusName(lies[i].want));
    if (!local_untouched()) tu_fail(__FILE__, __LINE__, "an answer with %s wrote local bytes", lies[i].what);
  }
  /* Blocks: the peer's blocks larger or smaller than ours, or more tensors. */
  HixlCacheAnyKey bk = blocks_key();
  static const uint64_t sb[] = {3, 4}, db[] = {5, 15};
  struct ans blies[] = {
      {1, NT, 2, 0, BLOCKS / 2, TB, 0, TB, 0}, /* blocks of 64 bytes */
      {1, NT, 2, 0, BLOCKS * 2, TB, 0, TB, 0}, /* blocks of 16 bytes */
      {1, 2 * NT, 2, 0, BLOCKS, TB, 0, TB, 0}, /* twice the tensors */
      {0, NT, 2, 0, BLOCKS, TB, 0, TB, 0},     /* a contiguous cache */
  };
  for (size_t i = 0; i < sizeof(blies) / sizeof(blies[0]); i++) {
    reset_local();
    set_answer(blies[i]);
    TU_ASSERT_STATUS(HixlCacheManagerPullBlocks(mgr, &bk, bid, sb, 2, db, 2, NULL), HIXL_PARAM_INVALID);
    CU_ASSERT_TRUE(local_untouched());
  }
  /* The honest blocks answer: blocks 3 and 4 land in 5 and 15, nothing else. */
  reset_local();
  set_answer((struct ans){1, NT, 2, 0, BLOCKS, TB, 0, TB, 0});
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(mgr, &bk, bid, sb, 2, db, 2, NULL));
  for (int t = 0; t < NT; t++)
    for (int j = 0; j < 2; j++) {
      TU_ASSERT_SAME(ltensor(1, t) + db[j] * BLK, pbuf + t * TB + sb[j] * BLK, BLK, "a pulled block");
      memset(ltensor(1, t) + db[j] * BLK, SENT, BLK);
    }
  CU_ASSERT_TRUE(local_untouched());
}

/* An answer to a CacheKeyByIdAndIndex naming another cache or another batch item than
 * the key asked (the peer's cache 99, item 1): refused, nothing moves, and it is not
 * remembered (before: the item the answer named moved, SUCCESS). */
static void test_answer_not_the_key(void) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_ID};
  k.u.id = (HixlCacheKeyByIdAndIndex){PEER, 99, 1};
  struct ans other_item = honest();
  other_item.batch = 2;
  reset_local();
  set_answer(other_item);
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("cache 99 item 2");
  CU_ASSERT_TRUE(local_untouched());
  TU_ASSERT_STATUS(HixlCacheManagerPushCache(mgr, &k.u.id, cid, 0, NULL), HIXL_FAILED);
  k.u.id.cache_id = 98; /* the answer names cache 99 */
  set_answer(honest());
  TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("cache 98 item 1");
  CU_ASSERT_TRUE(local_untouched());
  /* The key's own cache and item: taken, exactly that item moved. */
  k.u.id.cache_id = 99;
  TU_ASSERT_OK(HixlCacheManagerPullCache(mgr, &k, cid, 0, NULL));
  for (int t = 0; t < NT; t++) {
    TU_ASSERT_SAME(ltensor(0, t), pbuf + t * TB + ITEM, ITEM, "the pulled item");
    memset(ltensor(0, t), SENT, ITEM);
  }
  CU_ASSERT_TRUE(local_untouched());
}

/* A slow peer: it answers the lookup after SLOW_MS, then serves nothing (its progress
 * thread held in another call, queued on the link ahead of the transfer). The pull
 * ends TIMEOUT within its one timeout, not the lookup's time plus a timeout more. */
struct puller {
  HixlStatus st;
  int64_t ms;
};

static void *pull_thread(void *arg) {
  struct puller *p = arg;
  HixlCacheAnyKey k = req_key();
  HixlCacheTransferArgs ta = HIXL_CACHE_TRANSFER_ARGS_INIT;
  ta.timeout_ms = 1500;
  int64_t t0 = tu_now_ms();
  p->st = HixlCacheManagerPullCache(mgr, &k, cid, 0, &ta);
  p->ms = tu_now_ms() - t0;
  return NULL;
}

static void test_slow_peer(void) {
  static struct tu_hold hold = TU_HOLD_INIT;
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(eb, HIXL_SERVICE_KV, tu_hold_handler, &hold));
  reset_local();
  set_answer(honest());
  pthread_mutex_lock(&fk.mu);
  fk.slow = true;
  fk.delay_ms = 1000;
  pthread_mutex_unlock(&fk.mu);
  struct puller p = {HIXL_SUCCESS, 0};
  pthread_t th;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, pull_thread, &p), 0);
  pthread_mutex_lock(&fk.mu);
  while (!fk.entered) pthread_cond_wait(&fk.cv, &fk.mu);
  pthread_mutex_unlock(&fk.mu);
  /* The lookup is in B's handler: a call queued now reaches B before the transfer can. */
  uint8_t resp[8];
  uint32_t rlen = 0;
  hixl_call_t call = NULL;
  TU_ASSERT_OK(
      hixl_engine_call_start(ea, b_addr, HIXL_SERVICE_KV, "h", 1, resp, sizeof(resp), &rlen, 10000, &call));
  pthread_mutex_lock(&fk.mu);
  fk.go = true;
  pthread_cond_broadcast(&fk.cv);
  pthread_mutex_unlock(&fk.mu);
  pthread_join(th, NULL);
  tu_hold_release(&hold);
  if (call) (void)hixl_engine_call_wait(ea, b_addr, call);
  pthread_mutex_lock(&fk.mu);
  fk.slow = false;
  pthread_mutex_unlock(&fk.mu);
  if (p.st != HIXL_TIMEOUT && p.st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "a pull from a stalled peer: %s (%s)", HixlStatusName(p.st),
            HixlGetLastErrorMessage());
  if (p.ms > 1500 + 700) /* the old code took 2500: a timeout each for the lookup and the transfer */
    tu_fail(__FILE__, __LINE__, "a pull with a timeout of 1500 ms took %" PRId64 " ms", p.ms);
  CU_ASSERT_TRUE(local_untouched());
}

/* A real manager on a third engine (cluster 3) registers and unregisters a blocks cache
 * over and over while this side pulls from it and floods it with lookups of keys it
 * never had: every pull is SUCCESS with the peer's bytes, or refused (NOT_FOUND, or the
 * transfer refused as the memory goes), never anything else; no local byte outside the
 * blocks asked is written (and under ASan: no use after free on either side). */
enum { OTHER = 3, CHURNS = 200 };
static HixlCacheManager *other;
static uint8_t *obuf;
static atomic_bool churning;
static atomic_uint pulls_done; /* the puller's: the churn unregisters once two more began */

static void *churn_thread(void *arg) {
  (void)arg;
  HixlCacheDesc db = {NT, 2, 2, {BLOCKS, BLK / 2}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey bk = {OTHER, MODEL};
  uintptr_t ab[NT];
  for (int t = 0; t < NT; t++) ab[t] = (uintptr_t)(obuf + t * TB);
  for (int i = 0; i < CHURNS; i++) {
    uint64_t id = 0;
    if (HixlCacheManagerRegisterBlocksCache(other, &db, ab, NT, &bk, HIXL_CACHE_ACCESS_REMOTE, &id) !=
        HIXL_SUCCESS) {
      tu_fail(__FILE__, __LINE__, "churn %d: register: %s", i, HixlGetLastErrorMessage());
      break;
    }
    unsigned seen = atomic_load(&pulls_done); /* a pull found it, and the next one races the unregister */
    while (atomic_load(&pulls_done) < seen + 2) sched_yield();
    HixlStatus st;
    while ((st = HixlCacheManagerUnregisterCache(other, id)) == HIXL_FAILED) /* a transfer on it: again */
      sched_yield();
    if (st != HIXL_SUCCESS) {
      tu_fail(__FILE__, __LINE__, "churn %d: unregister: %s", i, HixlGetLastErrorMessage());
      break;
    }
  }
  atomic_store(&churning, false);
  return NULL;
}

/* Requests the service refuses, and says why; it still answers a good one after. */
static void raw_requests(const char *addr) {
  static const uint8_t old_proto[] = {0, CM_OP_HELLO}, bad_op[] = {CM_PROTO, 9}, one[] = {CM_PROTO},
                       hello_long[] = {CM_PROTO, CM_OP_HELLO, 0}, bad_kind[] = {CM_PROTO, CM_OP_LOOKUP, 7},
                       short_key[] = {CM_PROTO, CM_OP_LOOKUP, HIXL_CACHE_KEY_BLOCKS, 0, 0, 0, 0, 0, 0,
                                      0,        OTHER},
                       hello[] = {CM_PROTO, CM_OP_HELLO};
  struct {
    const uint8_t *req;
    size_t len;
    HixlStatus want;
    const char *says;
  } bad[] = {
      {old_proto, sizeof(old_proto), HIXL_UNSUPPORTED, "layout 0"},
      {bad_op, sizeof(bad_op), HIXL_UNSUPPORTED, "unknown cache service operation 9"},
      {one, sizeof(one), HIXL_UNSUPPORTED, "request of 1 bytes"},
      {hello_long, sizeof(hello_long), HIXL_PARAM_INVALID, "malformed cache hello"},
      {bad_kind, sizeof(bad_kind), HIXL_PARAM_INVALID, "malformed cache lookup"},
      {short_key, sizeof(short_key), HIXL_PARAM_INVALID, "malformed cache lookup"},
  };
  uint8_t ans[64];
  size_t n = 0;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    TU_ASSERT_STATUS(
        hixl_engine_call(ea, addr, HIXL_SERVICE_CACHE, bad[i].req, bad[i].len, ans, sizeof(ans), &n, T_MS),
        bad[i].want);
    TU_ASSERT_ERRMSG_HAS(bad[i].says);
  }
  /* A trailing byte after a good key. */
  uint8_t req[64];
  struct be_out o = be_out_fixed(req, sizeof(req));
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS};
  k.u.blocks = (HixlBlocksCacheKey){OTHER, MODEL};
  be_out_u8(&o, CM_PROTO);
  be_out_u8(&o, CM_OP_LOOKUP);
  cm_put_key(&o, &k);
  be_out_u8(&o, 0);
  TU_ASSERT_STATUS(hixl_engine_call(ea, addr, HIXL_SERVICE_CACHE, req, o.len, ans, sizeof(ans), &n, T_MS),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(hixl_engine_call(ea, addr, HIXL_SERVICE_CACHE, req, o.len - 1, ans, sizeof(ans), &n, T_MS),
                   HIXL_NOT_FOUND); /* well formed: nothing registered yet */
  TU_ASSERT_OK(
      hixl_engine_call(ea, addr, HIXL_SERVICE_CACHE, hello, sizeof(hello), ans, sizeof(ans), &n, T_MS));
  CU_ASSERT_EQUAL(n, 16);
  CU_ASSERT_EQUAL(be_get64(ans), OTHER);
}

static void test_lookup_races_unregister(void) {
  char addr[TU_ADDR_LEN];
  HixlEngine *ec = tu_engine_start_with(tu_addr(addr, sizeof(addr), tu_free_port()), "tcp");
  CU_ASSERT_PTR_NOT_NULL_FATAL(ec);
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(ec, OTHER, &other));
  CU_ASSERT_PTR_NOT_NULL_FATAL(obuf = malloc(NT * TB));
  tu_fill(obuf, NT * TB, 91);
  TU_ASSERT_OK_FATAL(HixlCacheManagerLink(mgr, OTHER, addr, T_MS));
  raw_requests(addr);
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS}, none = {.kind = HIXL_CACHE_KEY_REQ};
  k.u.blocks = (HixlBlocksCacheKey){OTHER, MODEL};
  none.u.req = (HixlCacheKey)HIXL_CACHE_KEY_INIT(OTHER, 4242);
  static const uint64_t sb[] = {1, 2, 9}, db[] = {1, 2, 9};
  reset_local();
  atomic_store(&churning, true);
  pthread_t th;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, churn_thread, NULL), 0);
  unsigned ok = 0, refused = 0, pulls = 0;
  while (atomic_load(&churning)) {
    HixlStatus st = HixlCacheManagerPullBlocks(mgr, &k, bid, sb, 3, db, 3, NULL);
    pulls++;
    atomic_fetch_add(&pulls_done, 1);
    if (st == HIXL_SUCCESS) {
      ok++;
      for (int t = 0; t < NT; t++)
        for (int j = 0; j < 3; j++)
          if (tu_mismatch(ltensor(1, t) + db[j] * BLK, obuf + t * TB + sb[j] * BLK, BLK) >= 0)
            tu_fail(__FILE__, __LINE__, "pull %u: block %" PRIu64 " of tensor %d differs", pulls, db[j], t);
    } else if (st == HIXL_NOT_FOUND || st == HIXL_PARAM_INVALID || st == HIXL_FAILED) {
      refused++;

    } else {
      tu_fail(__FILE__, __LINE__, "pull %u: %s (%s)", pulls, HixlStatusName(st), HixlGetLastErrorMessage());
    }
    TU_ASSERT_STATUS(HixlCacheManagerPullCache(mgr, &none, cid, 0, NULL), HIXL_NOT_FOUND);
  }
  pthread_join(th, NULL);
  /* Nothing outside blocks 1, 2, 9 of the blocks cache was written. */
  for (int t = 0; t < NT; t++)
    for (int j = 0; j < 3; j++) memset(ltensor(1, t) + db[j] * BLK, SENT, BLK);
  CU_ASSERT_TRUE(local_untouched());
  CU_ASSERT(ok > 0);
  fprintf(stderr, "  [%u pulls while the peer churned: %u moved, %u refused]\n", pulls, ok, refused);
  TU_ASSERT_OK(HixlCacheManagerUnlink(mgr, OTHER, T_MS));
  TU_ASSERT_OK(HixlCacheManagerDestroy(other));
  TU_ASSERT_OK(HixlEngineDestroy(ec));
  free(obuf);
}

int main(void) {
  CU_TestInfo tests[] = {
      {"HELLO answers that lie leave no link", test_hello_lies},
      {"honest answers move exactly the item and blocks asked", test_honest},
      {"LOOKUP answers that lie move nothing", test_answer_lies},
      {"an answer naming another cache or item than the id key: refused", test_answer_not_the_key},
      {"a real service: malformed requests refused; lookups racing unregistration",
       test_lookup_races_unregister},
      {"a slow peer: lookup and transfer within one timeout", test_slow_peer},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {
      {"cache manager against a hostile peer", suite_init, suite_clean, NULL, NULL, tests},
      CU_SUITE_INFO_NULL};
  return tu_run_suites("test_cache_peer", suites);
}
