/* test_cache_keys: the cache manager's index of keys (core/src/cache/cache_index.c).
 *
 * Tens of thousands of CacheKeys over hundreds of caches (1 to 100 keys each, and two of
 * 5000) and a few BlocksCacheKeys: each is found by a peer's lookup (the CACHE service,
 * called as the engine's progress thread calls it) to its cache and batch item, and a
 * registration of any one of them is refused with the message it always had. Half the
 * caches unregistered: their keys are free to register again (and found there), the
 * others' still taken; after Destroy a new manager finds none of them. Two keys of one
 * registration that are the same are named as before; an out of memory while the
 * index grows, or the engine refusing the memory, refuses the registration whole, none
 * of its keys left behind; a pending cache's keys are taken but not served. And the
 * index itself against a plain array under random adds and removals. One engine, one
 * process; caches peers may reach, one tensor each, in one buffer of this process.
 * (UnregisterCache and Destroy refused half way: test_cache's Destroy case.) */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"
#include "test_util.h"

enum {
  CLUSTER = 1,
  N_SMALL = 600,   /* caches of 1 to 100 keys */
  N_BIG = 2,       /* caches of BIG_KEYS keys */
  BIG_KEYS = 5000, /* batch items: one more than keys (the last has none) */
  N_BLOCKS = 4,    /* blocks caches, models MODEL0 ... */
  MODEL0 = 100,
  N_CACHES = N_SMALL + N_BIG + N_BLOCKS,
  SLOT = 8192,    /* bytes of the buffer per cache */
  REGROUP = 1000, /* freed keys registered again, this many per cache */
};

static HixlEngine *eng;
static uint8_t *buf; /* N_CACHES + extra slots of SLOT bytes: every cache's one tensor */
static const size_t BUF_SLOTS = N_CACHES + 64;
static size_t next_slot;

/* Key g: req, model and prefix all vary, (req, model) alone names g. */
static HixlCacheKey key_of(uint64_t g) {
  HixlCacheKey k = {CLUSTER, 1000 + g / 2, g % 2, g % 3 ? g % 3 : HIXL_CACHE_PREFIX_NONE};
  return k;
}

struct kc {
  size_t g0, nkeys; /* keys key_of(g0 ...) name batch items 0 ... */
  uint64_t model;   /* blocks: its BlocksCacheKey's model */
  bool blocks, registered;
  uint64_t id;
};

static struct kc caches[N_CACHES];
static size_t total_keys;
static HixlCacheManager *mgr;

static uintptr_t take_slot(void) {
  CU_ASSERT_FATAL(next_slot < BUF_SLOTS);
  return (uintptr_t)(buf + SLOT * next_slot++);
}

/* Register keys key_of(g0 ...) (nkeys of them) as a cache of nkeys + 1 items of 1 byte,
 * peers may reach it. */
static HixlStatus reg_keys(HixlCacheManager *m, size_t g0, size_t nkeys, uint64_t *id) {
  HixlCacheKey *keys = malloc((nkeys + 1) * sizeof(*keys)); /* + 1: never malloc(0) */
  CU_ASSERT_FATAL(keys != NULL);
  for (size_t b = 0; b < nkeys; b++) keys[b] = key_of(g0 + b);
  HixlCacheDesc d = {1, 1, 2, {nkeys + 1, 1}, HIXL_CACHE_HOST};
  uintptr_t a = take_slot();
  HixlStatus st = HixlCacheManagerRegisterCache(m, &d, &a, 1, keys, nkeys, HIXL_CACHE_ACCESS_REMOTE, id);
  free(keys);
  return st;
}

static HixlStatus reg_blocks(HixlCacheManager *m, uint64_t model, uint64_t *id) {
  HixlCacheDesc d = {1, 1, 2, {64, 16}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey bk = {CLUSTER, model};
  uintptr_t a = take_slot();
  return HixlCacheManagerRegisterBlocksCache(m, &d, &a, 1, &bk, HIXL_CACHE_ACCESS_REMOTE, id);
}

/* A peer's lookup of k, answered by the CACHE service as on the progress thread: the
 * cache and batch item it names; else the status, with why. */
static HixlStatus lookup(HixlCacheManager *m, const HixlCacheAnyKey *k, uint64_t *id, uint32_t *batch,
                         char *why, size_t cap) {
  uint8_t req[64], ans[256];
  size_t n = 0;
  struct be_out o = be_out_fixed(req, sizeof(req));
  be_out_u8(&o, CM_PROTO);
  be_out_u8(&o, CM_OP_LOOKUP);
  cm_put_key(&o, k);
  HixlStatus st = cm_serve(m, "test", req, o.len, ans, sizeof(ans), &n);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "%.*s", (int)n, (const char *)ans);
    return st;
  }
  struct cm_view v;
  memset(&v, 0, sizeof(v));
  if (!cm_get_view(ans, n, &v)) return HIXL_FAILED;
  *id = v.id;
  *batch = v.batch_index;
  free(v.addrs);
  return HIXL_SUCCESS;
}

static HixlCacheAnyKey any_req(HixlCacheKey k) {
  HixlCacheAnyKey a = {.kind = HIXL_CACHE_KEY_REQ};
  a.u.req = k;
  return a;
}

static HixlCacheAnyKey any_blocks(uint64_t model) {
  HixlCacheAnyKey a = {.kind = HIXL_CACHE_KEY_BLOCKS};
  a.u.blocks = (HixlBlocksCacheKey){CLUSTER, model};
  return a;
}

/* Key g is found at (id, batch); counts a miss (reported once) otherwise. */
static void expect_found(HixlCacheManager *m, HixlCacheAnyKey k, uint64_t want_id, uint32_t want_batch,
                         size_t *bad) {
  uint64_t id = 0;
  uint32_t b = 0;
  char why[320] = "";
  HixlStatus st = lookup(m, &k, &id, &b, why, sizeof(why));
  if (st == HIXL_SUCCESS && id == want_id && b == want_batch) return;
  if ((*bad)++ == 0)
    tu_fail(__FILE__, __LINE__,
            "lookup: status %d, cache %" PRIu64 " item %u; want cache %" PRIu64 " item %u (%s)", (int)st, id,
            b, want_id, want_batch, why);
}

static void expect_not_found(HixlCacheManager *m, HixlCacheAnyKey k, size_t *bad) {
  uint64_t id = 0;
  uint32_t b = 0;
  char why[320] = "";
  HixlStatus st = lookup(m, &k, &id, &b, why, sizeof(why));
  if (st == HIXL_NOT_FOUND && strstr(why, "names no cache")) return;
  if ((*bad)++ == 0)
    tu_fail(__FILE__, __LINE__, "lookup of a key naming nothing: status %d, cache %" PRIu64 " (%s)", (int)st,
            id, why);
}

/* A registration of key g (after two fresh ones, so the clash is not the first key) is
 * refused naming cache id, in the words it always had. */
static void expect_clash(HixlCacheManager *m, size_t g, uint64_t id, size_t *bad) {
  HixlCacheKey keys[3] = {key_of(900000000 + 2 * g), key_of(900000001 + 2 * g), key_of(g)};
  HixlCacheDesc d = {1, 1, 2, {3, 1}, HIXL_CACHE_HOST};
  uintptr_t a = (uintptr_t)buf; /* only recorded (local access), never registered */
  uint64_t got = 0;
  char want[200];
  snprintf(want, sizeof(want),
           "HixlCacheManagerRegisterCache: CacheKey req %" PRIu64 " already names cache %" PRIu64,
           keys[2].req_id, id);
  HixlStatus st = HixlCacheManagerRegisterCache(m, &d, &a, 1, keys, 3, HIXL_CACHE_ACCESS_LOCAL, &got);
  if (st == HIXL_PARAM_INVALID && strcmp(HixlGetLastErrorMessage(), want) == 0) return;
  if ((*bad)++ == 0)
    tu_fail(__FILE__, __LINE__, "key %zu: status %d (%s); want PARAM_INVALID (%s)", g, (int)st,
            HixlGetLastErrorMessage(), want);
  if (st == HIXL_SUCCESS) HixlCacheManagerUnregisterCache(m, got);
}

static void expect_blocks_clash(HixlCacheManager *m, uint64_t model, uint64_t id) {
  HixlCacheDesc d = {1, 1, 2, {64, 16}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey bk = {CLUSTER, model};
  uintptr_t a = (uintptr_t)buf;
  uint64_t got = 0;
  char want[200];
  snprintf(want, sizeof(want),
           "HixlCacheManagerRegisterBlocksCache: BlocksCacheKey model %" PRIu64
           " already names cache %" PRIu64,
           model, id);
  TU_ASSERT_STATUS(HixlCacheManagerRegisterBlocksCache(m, &d, &a, 1, &bk, HIXL_CACHE_ACCESS_LOCAL, &got),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_STRING_EQUAL(HixlGetLastErrorMessage(), want);
}

/* Every registered cache's keys found where they name, and each refused again. */
static void check_all(HixlCacheManager *m, bool clashes) {
  size_t bad_found = 0, bad_clash = 0;
  for (size_t i = 0; i < N_CACHES; i++) {
    const struct kc *c = &caches[i];
    if (!c->registered) continue;
    if (c->blocks) {
      expect_found(m, any_blocks(c->model), c->id, 0, &bad_found);
      if (clashes) expect_blocks_clash(m, c->model, c->id);
      continue;
    }
    for (size_t b = 0; b < c->nkeys; b++) {
      expect_found(m, any_req(key_of(c->g0 + b)), c->id, (uint32_t)b, &bad_found);
      if (clashes) expect_clash(m, c->g0 + b, c->id, &bad_clash);
    }
  }
  CU_ASSERT_EQUAL(bad_found, 0);
  CU_ASSERT_EQUAL(bad_clash, 0);
}

static int suite_init(void) {
  char addr[TU_ADDR_LEN];
  buf = tu_alloc_mem(SLOT * BUF_SLOTS, false);
  eng = tu_engine_start(tu_addr(addr, sizeof(addr), 0));
  return buf && eng && HixlCacheManagerCreate(eng, CLUSTER, &mgr) == HIXL_SUCCESS ? 0 : 1;
}

static int suite_clean(void) {
  if (mgr) HixlCacheManagerDestroy(mgr);
  if (eng) HixlEngineDestroy(eng);
  if (buf) tu_free_mem(buf, SLOT * BUF_SLOTS);
  return 0;
}

/* ---- many keys ---- */

static void test_many_keys(void) {
  size_t g = 0;
  for (size_t i = 0; i < N_CACHES; i++) {
    struct kc *c = &caches[i];
    if (i >= N_SMALL + N_BIG) {
      c->blocks = true;
      c->model = MODEL0 + (i - N_SMALL - N_BIG);
      TU_ASSERT_OK_FATAL(reg_blocks(mgr, c->model, &c->id));
    } else {
      c->g0 = g;
      c->nkeys = i < N_SMALL ? 1 + i * 37 % 100 : BIG_KEYS;
      g += c->nkeys;
      TU_ASSERT_OK_FATAL(reg_keys(mgr, c->g0, c->nkeys, &c->id));
    }
    c->registered = true;
  }
  total_keys = g;
  CU_ASSERT(total_keys >= 40000);
  check_all(mgr, true);
  /* A key that differs from a registered one in one field only is another key. */
  HixlCacheKey near[3] = {key_of(0), key_of(0), key_of(0)};
  near[0].req_id += 1u << 30;
  near[1].model_id += 2; /* the models taken are 0 and 1 */
  near[2].prefix_id = 7; /* the prefixes taken are 1, 2 and none */
  HixlCacheDesc d = {1, 1, 2, {3, 1}, HIXL_CACHE_HOST};
  uintptr_t a = take_slot();
  uint64_t id;
  TU_ASSERT_OK(HixlCacheManagerRegisterCache(mgr, &d, &a, 1, near, 3, HIXL_CACHE_ACCESS_REMOTE, &id));
  size_t bad = 0;
  for (uint32_t b = 0; b < 3; b++) expect_found(mgr, any_req(near[b]), id, b, &bad);
  expect_found(mgr, any_req(key_of(0)), caches[0].id, 0, &bad);
  CU_ASSERT_EQUAL(bad, 0);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  for (uint32_t b = 0; b < 3; b++) expect_not_found(mgr, any_req(near[b]), &bad);
  CU_ASSERT_EQUAL(bad, 0);
}

/* Half the caches go: their keys are free (not found, registered again, then found
 * there), the rest still found and taken. */
static void test_unregister_half(void) {
  CU_ASSERT_FATAL(total_keys > 0);
  size_t bad = 0, freed = 0, *gs = malloc(total_keys * sizeof(*gs));
  uint64_t freed_models[N_BLOCKS];
  size_t nmodels = 0;
  CU_ASSERT_FATAL(gs != NULL);
  for (size_t i = 0; i < N_CACHES; i += 2) { /* the even ones: small, one big, blocks */
    struct kc *c = &caches[i];
    TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, c->id));
    c->registered = false;
    if (c->blocks) freed_models[nmodels++] = c->model;
    for (size_t b = 0; b < c->nkeys; b++) gs[freed++] = c->g0 + b;
  }
  for (size_t i = 0; i < freed; i++) expect_not_found(mgr, any_req(key_of(gs[i])), &bad);
  for (size_t i = 0; i < nmodels; i++) expect_not_found(mgr, any_blocks(freed_models[i]), &bad);
  CU_ASSERT_EQUAL(bad, 0);
  check_all(mgr, true);
  /* The freed keys, grouped otherwise: REGROUP to a cache, in reverse order. */
  uint64_t ids[64];
  size_t nids = 0;
  for (size_t i = 0; i < freed / 2; i++) { /* reversed: gs[] no longer runs of consecutive keys */
    size_t t = gs[i];
    gs[i] = gs[freed - 1 - i];
    gs[freed - 1 - i] = t;
  }
  for (size_t s = 0; s < freed; s += REGROUP) {
    size_t n = freed - s < REGROUP ? freed - s : REGROUP;
    HixlCacheKey *keys = malloc(n * sizeof(*keys));
    CU_ASSERT_FATAL(keys != NULL && nids < 64);
    for (size_t b = 0; b < n; b++) keys[b] = key_of(gs[s + b]);
    HixlCacheDesc d = {1, 1, 2, {n, 1}, HIXL_CACHE_HOST};
    uintptr_t a = take_slot();
    TU_ASSERT_OK(
        HixlCacheManagerRegisterCache(mgr, &d, &a, 1, keys, n, HIXL_CACHE_ACCESS_REMOTE, &ids[nids]));
    free(keys);
    for (size_t b = 0; b < n; b++)
      expect_found(mgr, any_req(key_of(gs[s + b])), ids[nids], (uint32_t)b, &bad);
    nids++;
  }
  for (size_t i = 0; i < nmodels; i++) {
    uint64_t id;
    TU_ASSERT_OK(reg_blocks(mgr, freed_models[i], &id));
    expect_found(mgr, any_blocks(freed_models[i]), id, 0, &bad);
  }
  CU_ASSERT_EQUAL(bad, 0);
  check_all(mgr, false); /* the others unmoved */
  free(gs);
}

/* Destroy, then a new manager on the engine: none of the keys is found or taken. */
static void test_destroy_then_new(void) {
  CU_ASSERT_FATAL(total_keys > 0);
  TU_ASSERT_OK_FATAL(HixlCacheManagerDestroy(mgr));
  mgr = NULL;
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(eng, CLUSTER, &mgr));
  CU_ASSERT_EQUAL(mgr->index.n, 0);
  size_t bad = 0;
  for (size_t g = 0; g < total_keys; g++) expect_not_found(mgr, any_req(key_of(g)), &bad);
  for (uint64_t i = 0; i < N_BLOCKS; i++) expect_not_found(mgr, any_blocks(MODEL0 + i), &bad);
  CU_ASSERT_EQUAL(bad, 0);
  next_slot = 0; /* the old manager's registrations are gone with it */
  uint64_t id, bid;
  TU_ASSERT_OK(reg_keys(mgr, 0, BIG_KEYS, &id));
  TU_ASSERT_OK(reg_blocks(mgr, MODEL0, &bid));
  for (uint32_t b = 0; b < BIG_KEYS; b++) expect_found(mgr, any_req(key_of(b)), id, b, &bad);
  expect_found(mgr, any_blocks(MODEL0), bid, 0, &bad);
  CU_ASSERT_EQUAL(bad, 0);
  CU_ASSERT_EQUAL(mgr->index.n, BIG_KEYS + 1);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, bid));
  CU_ASSERT_EQUAL(mgr->index.n, 0);
}

/* Two keys of one registration the same: refused, naming the first such pair (the
 * lowest second index, then the lowest first), as a scan of each against those before. */
static void test_repeated_keys(void) {
  enum { N = 6000 };
  HixlCacheKey *keys = malloc(N * sizeof(*keys));
  CU_ASSERT_FATAL(keys != NULL);
  for (size_t b = 0; b < N; b++) keys[b] = key_of(5000000 + b);
  keys[5500] = keys[9];  /* a later pair */
  keys[4321] = keys[17]; /* the first: 4321 is the lowest index repeating one before it */
  keys[4400] = keys[17];
  keys[4999] = keys[4321];
  HixlCacheDesc d = {1, 1, 2, {N, 1}, HIXL_CACHE_HOST};
  uintptr_t a = take_slot();
  uint64_t id;
  TU_ASSERT_STATUS(HixlCacheManagerRegisterCache(mgr, &d, &a, 1, keys, N, HIXL_CACHE_ACCESS_REMOTE, &id),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_STRING_EQUAL(HixlGetLastErrorMessage(),
                         "HixlCacheManagerRegisterCache: keys 17 and 4321 are the same");
  keys[1] = keys[0]; /* now the first */
  TU_ASSERT_STATUS(HixlCacheManagerRegisterCache(mgr, &d, &a, 1, keys, N, HIXL_CACHE_ACCESS_REMOTE, &id),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_STRING_EQUAL(HixlGetLastErrorMessage(),
                         "HixlCacheManagerRegisterCache: keys 0 and 1 are the same");
  size_t bad = 0;
  expect_not_found(mgr, any_req(keys[0]), &bad);
  CU_ASSERT_EQUAL(bad, 0);
  free(keys);
}

/* ---- out of memory growing the index ---- */

static atomic_uint calloc_refused;
static void *refuse_calloc(size_t n, size_t size) {
  (void)n, (void)size;
  atomic_fetch_add(&calloc_refused, 1);
  return NULL;
}

static void set_index_calloc(HixlCacheManager *m, void *(*fn)(size_t, size_t)) {
  pthread_mutex_lock(&m->lock);
  m->index.calloc_fn = fn;
  pthread_mutex_unlock(&m->lock);
}

/* A registration whose keys need the index to grow, when it cannot: RESOURCE_EXHAUSTED,
 * and none of its keys indexed (not found, not taken), nor its id or tensor. One the
 * index has room for needs no memory from it. */
static void test_index_out_of_memory(void) {
  uint64_t id0, id;
  TU_ASSERT_OK_FATAL(reg_keys(mgr, 7000000, 10, &id0));
  pthread_mutex_lock(&mgr->lock);
  size_t held = mgr->index.n, room = mgr->index.cap / 2 - held, naddrs = mgr->naddrs;
  uint64_t next_id = mgr->next_id;
  pthread_mutex_unlock(&mgr->lock);
  CU_ASSERT_EQUAL_FATAL(held, 10);
  set_index_calloc(mgr, refuse_calloc);
  TU_ASSERT_STATUS(reg_keys(mgr, 8000000, room + 1, &id), HIXL_RESOURCE_EXHAUSTED);
  TU_ASSERT_ERRMSG_HAS("out of memory for the index");
  CU_ASSERT(atomic_load(&calloc_refused) >= 1);
  pthread_mutex_lock(&mgr->lock);
  CU_ASSERT_EQUAL(mgr->index.n, held);
  CU_ASSERT_EQUAL(mgr->naddrs, naddrs);
  CU_ASSERT_EQUAL(mgr->next_id, next_id);
  CU_ASSERT_PTR_NULL(mgr->pending);
  pthread_mutex_unlock(&mgr->lock);
  size_t bad = 0;
  for (size_t b = 0; b <= room; b++) expect_not_found(mgr, any_req(key_of(8000000 + b)), &bad);
  unsigned refused = atomic_load(&calloc_refused);
  TU_ASSERT_OK(reg_keys(mgr, 9000000, room, &id)); /* fits: the refusing calloc is not called */
  CU_ASSERT_EQUAL(atomic_load(&calloc_refused), refused);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  TU_ASSERT_OK(reg_keys(mgr, 9000000, 0, &id)); /* no key: nothing asked of the index */
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  struct cm_index empty = {.calloc_fn = refuse_calloc}; /* a new manager's */
  CU_ASSERT_TRUE(cm_index_reserve(&empty, 0));
  CU_ASSERT_FALSE(cm_index_reserve(&empty, 1));
  CU_ASSERT_PTR_NULL(empty.slots);
  set_index_calloc(mgr, NULL);
  TU_ASSERT_OK(reg_keys(mgr, 8000000, room + 1, &id)); /* none was left taken */
  for (uint32_t b = 0; b <= room; b++) expect_found(mgr, any_req(key_of(8000000 + b)), id, b, &bad);
  for (uint32_t b = 0; b < 10; b++) expect_found(mgr, any_req(key_of(7000000 + b)), id0, b, &bad);
  CU_ASSERT_EQUAL(bad, 0);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id0));
}

/* A registration the engine refuses (its memory registered already) half way, after
 * its keys were indexed: none of them left taken or found. */
static void test_engine_refuses(void) {
  uintptr_t a = take_slot();
  HixlMemHandle h = tu_register(eng, (void *)a, SLOT);
  CU_ASSERT_FATAL(h != NULL);
  HixlCacheKey keys[40];
  for (size_t b = 0; b < 40; b++) keys[b] = key_of(10000000 + b);
  HixlCacheDesc d = {1, 1, 2, {40, 1}, HIXL_CACHE_HOST};
  uint64_t id;
  HixlStatus st = HixlCacheManagerRegisterCache(mgr, &d, &a, 1, keys, 40, HIXL_CACHE_ACCESS_REMOTE, &id);
  CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS);
  TU_ASSERT_ERRMSG_HAS("tensors 0 and the 0 after it in memory");
  size_t bad = 0;
  for (size_t b = 0; b < 40; b++) expect_not_found(mgr, any_req(keys[b]), &bad);
  CU_ASSERT_EQUAL(bad, 0);
  TU_ASSERT_OK(HixlEngineDeregisterMem(eng, h));
  TU_ASSERT_OK(reg_keys(mgr, 10000000, 40, &id));
  for (uint32_t b = 0; b < 40; b++) expect_found(mgr, any_req(keys[b]), id, b, &bad);
  CU_ASSERT_EQUAL(bad, 0);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
}

/* A cache pending (as while its registration or unregistration talks to the engine, put
 * there by hand): its keys are taken, with the message as before, and not served. */
static void test_pending_taken(void) {
  uint64_t id, bid;
  TU_ASSERT_OK_FATAL(reg_keys(mgr, 11000000, 30, &id));
  TU_ASSERT_OK_FATAL(reg_blocks(mgr, MODEL0 + 50, &bid));
  pthread_mutex_lock(&mgr->lock);
  struct cm_cache *c = mgr->caches, *saved_pending = mgr->pending;
  mgr->caches = c->next->next; /* the two just registered, newest first */
  c->next->next = NULL;
  mgr->pending = c;
  c->listed = c->next->listed = false;
  pthread_mutex_unlock(&mgr->lock);
  CU_ASSERT_EQUAL(c->id, bid);
  CU_ASSERT_EQUAL(c->next->id, id);
  size_t bad = 0;
  for (size_t b = 0; b < 30; b++) {
    expect_clash(mgr, 11000000 + b, id, &bad);
    expect_not_found(mgr, any_req(key_of(11000000 + b)), &bad);
  }
  expect_blocks_clash(mgr, MODEL0 + 50, bid);
  expect_not_found(mgr, any_blocks(MODEL0 + 50), &bad);
  CU_ASSERT_EQUAL(bad, 0);
  pthread_mutex_lock(&mgr->lock);
  c->next->next = mgr->caches;
  mgr->caches = c;
  mgr->pending = saved_pending;
  c->listed = c->next->listed = true;
  pthread_mutex_unlock(&mgr->lock);
  expect_found(mgr, any_blocks(MODEL0 + 50), bid, 0, &bad);
  CU_ASSERT_EQUAL(bad, 0);
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, id));
  TU_ASSERT_OK(HixlCacheManagerUnregisterCache(mgr, bid));
}

/* ---- the index alone ---- */

/* Random puts and deletes over a small universe of keys (so runs form, wrap the table's
 * end and are cut by deletes), checked against a plain array after each step. */
static void test_index_vs_array(void) {
  enum { U = 3000, STEPS = 300000 };
  static struct cm_cache dummy[2];
  static struct cm_cache *owner[U]; /* the reference: which dummy holds key u, or NULL */
  static uint32_t item[U];
  struct cm_index ix = {.seed = 12345};
  uint64_t r = 99;
  size_t held = 0, bad = 0;
  memset(owner, 0, sizeof(owner));
  for (size_t s = 0; s < STEPS && bad == 0; s++) {
    size_t u = tu_rand(&r) % U;
    /* Keys of the two kinds, and some differing in one field only. */
    struct cm_ixkey k = u % 3 ? (struct cm_ixkey){CM_IX_REQ, u / 3, u % 3, 5} : cm_ixkey_blocks(u / 3);
    uint32_t b = UINT32_MAX;
    struct cm_cache *got = cm_index_get(&ix, &k, &b);
    if (got != owner[u] || (got && b != item[u])) bad++;
    if (owner[u] && tu_rand(&r) % 2) {
      cm_index_del(&ix, &k, &dummy[1 - (owner[u] - dummy)]); /* not its owner: kept */
      if (cm_index_get(&ix, &k, NULL) != owner[u]) bad++;
      cm_index_del(&ix, &k, owner[u]);
      owner[u] = NULL;
      held--;
    } else if (!owner[u]) {
      if (!cm_index_reserve(&ix, 1)) {
        bad++;
        break;
      }
      owner[u] = &dummy[s % 2];
      item[u] = (uint32_t)s;
      cm_index_put(&ix, &k, owner[u], item[u]);
      held++;
    }
    if (ix.n != held) bad++;
    if (s % 20000 == 0) /* every key, held or not */
      for (size_t v = 0; v < U; v++) {
        struct cm_ixkey kv = v % 3 ? (struct cm_ixkey){CM_IX_REQ, v / 3, v % 3, 5} : cm_ixkey_blocks(v / 3);
        if (cm_index_get(&ix, &kv, &b) != owner[v] || (owner[v] && b != item[v])) bad++;
      }
  }
  CU_ASSERT_EQUAL(bad, 0);
  CU_ASSERT(ix.cap >= 2 * ix.n);
  cm_index_free(&ix);
}

int main(void) {
  CU_TestInfo tests[] = {
      {"the index against a plain array: random puts and deletes", test_index_vs_array},
      {"40,000 keys: each found at its cache and item, each refused again", test_many_keys},
      {"half unregistered: their keys free, the others still taken", test_unregister_half},
      {"Destroy, then a new manager: nothing of the old keys", test_destroy_then_new},
      {"two keys of one registration the same: the first pair named", test_repeated_keys},
      {"out of memory growing the index: refused whole, nothing left indexed", test_index_out_of_memory},
      {"a registration the engine refuses: its keys free again", test_engine_refuses},
      {"a pending cache's keys: taken, not served", test_pending_taken},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"cache manager's key index", suite_init, suite_clean, NULL, NULL, tests},
                           CU_SUITE_INFO_NULL};
  return tu_run_suites("test_cache_keys", suites);
}
