/* test_plugin_lease: a producer whose held request outlives its lease after a consumer
 * pinned it cuts that consumer off before it reports the request finished (and its
 * blocks reusable), so nothing the consumer reads afterwards can see them.
 *
 * The producer is the KV-connector plugin, loaded by dlopen as a host loads it. The
 * consumer is a bare engine of this program that speaks the KV service itself: it
 * PINs the request (as a consumer's loader does before it pulls), then stays silent
 * (no FREE), which a consumer through the plugin's ops cannot be made to do on cue.
 * Over tcp; and over shm with the producer's KV in memory the plugin allocated,
 * which the consumer maps: the producer has it unmapped before it reports. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_wire.h"
#include "test_util.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

enum { LAYERS = 2, BLOCKS = 16, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = 1 << 20, LEASE_MS = 300 };

static void *so;
static const hixl_kv_ops *ops;

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      tu_fail(__FILE__, __LINE__, "%s: got %u, want %u (%s)", #expr, st_, (unsigned)(want),                  \
              ops->last_error());                                                                            \
  } while (0)

static void step(hixl_kv_connector *sched, hixl_kv_connector *worker) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(worker), HIXL_KV_SUCCESS);
}

/* A KV service request as the plugin's loader sends it: protocol 5, op, request id,
 * the request's capability (kv_transfer_params' "cap"), the caller's world size 1 and
 * rank 0. */
static size_t kv_req(uint8_t *buf, uint8_t op, const char *id, const struct kv_cap *cap) {
  size_t n = strlen(id);
  buf[0] = KV_SVC_PROTO;
  buf[1] = op;
  buf[2] = (uint8_t)(n >> 8);
  buf[3] = (uint8_t)n;
  memcpy(buf + 4, id, n);
  buf[4 + n] = cap->len;
  memcpy(buf + 5 + n, cap->b, cap->len);
  static const uint8_t who[8] = {0, 0, 0, 1, 0, 0, 0, 0};
  memcpy(buf + 5 + n + cap->len, who, sizeof(who));
  return 5 + n + cap->len + sizeof(who);
}

/* The capability kv_transfer_params carry ("cap": 32 hex digits) into cap; false if none. */
static bool params_cap(const uint8_t *json, size_t len, struct kv_cap *cap) {
  char text[4096];
  snprintf(text, sizeof(text), "%.*s", (int)len, (const char *)json);
  const char *h = strstr(text, "\"cap\":\"");
  if (!h) return false;
  h += 7;
  for (unsigned i = 0; i < KV_CAP_LEN; i++) {
    unsigned v;
    if (sscanf(h + 2 * i, "%2x", &v) != 1) return false;
    cap->b[i] = (uint8_t)v;
  }
  cap->len = KV_CAP_LEN;
  return true;
}

static void fill_kv(const hixl_kv_layer *layers, uint8_t c) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      memset((void *)(layers[l].base + (v ? layers[l].v_offset : 0)), c, (size_t)BLOCKS * BLOCK_BYTES);
}

/* A scheduler and a worker connector of role and mode on a free port of this host
 * (its address in addr); NULLs on failure, reported. */
static int per_producer = 1; /* the connectors' loads_per_producer */

static void connectors_up(const char *role, const char *mode, int lease_ms, const char *transport, char *addr,
                          hixl_kv_connector **sched, hixl_kv_connector **worker) {
  char cfg[512], err[256] = "";
  tu_addr(addr, TU_ADDR_LEN, tu_free_port());
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": %d,"
           " \"transfer_timeout_ms\": 2000, \"connect_timeout_ms\": 2000, \"loads_per_producer\": %d,"
           " \"Transport\": \"%s\"}",
           addr, role, mode, lease_ms, per_producer, transport);
  *sched = *worker = NULL;
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, sched, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, worker, err, sizeof(err)), HIXL_KV_SUCCESS);
}

/* The layers of a KV laid out K then V blocks per layer from kv (0: the plugin's). */
static void layers_at(hixl_kv_layer *layers, uint8_t *kv) {
  for (int l = 0; l < LAYERS; l++)
    layers[l] = (hixl_kv_layer){"layer",
                                5,
                                kv ? (uintptr_t)(kv + (size_t)l * 2 * BLOCKS * BLOCK_BYTES) : 0,
                                BLOCKS,
                                BLOCK_BYTES,
                                BLOCKS * BLOCK_BYTES,
                                HIXL_KV_LAYOUT_KV_FIRST,
                                ELEM,
                                BLOCK_TOKENS};
}

static void lease_case(const char *transport, bool alloc) {
  char addr[TU_ADDR_LEN];
  hixl_kv_connector *sched, *worker;
  connectors_up("producer", "pull", LEASE_MS, transport, addr, &sched, &worker);
  CU_ASSERT_FATAL(sched && worker);

  /* The producer's KV: K then V blocks per layer (the host's, or the plugin's), 0x5a. */
  size_t len = (size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES;
  uint8_t *kv = alloc ? NULL : malloc(len);
  CU_ASSERT_FATAL(alloc || kv);
  hixl_kv_layer layers[LAYERS];
  layers_at(layers, kv); /* alloc: kv is NULL, the plugin allocates */
  if (alloc)
    ST_IS(ops->alloc_kv_caches(worker, layers, LAYERS), HIXL_KV_SUCCESS);
  else
    ST_IS(ops->register_kv_caches(worker, layers, LAYERS), HIXL_KV_SUCCESS);
  fill_kv(layers, 0x5a);

  /* A finished request the producer holds: blocks 2 and 3. */
  const uint64_t blocks[2] = {2, 3};
  const char *id = "lease-1";
  hixl_kv_request r = {id, strlen(id), 2 * BLOCK_TOKENS, NULL, 0, 0};
  int32_t delay = 0;
  hixl_kv_buffer params = {0};
  for (int l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(worker, (uint32_t)l), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_save(worker), HIXL_KV_SUCCESS);
  ST_IS(ops->request_finished(sched, &r, blocks, 2, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  struct kv_cap cap = {0};
  CU_ASSERT_FATAL(params_cap(params.data, params.len, &cap)); /* what a consumer's calls present */
  ops->free_buffer(&params);
  step(sched, worker); /* the worker holds the blocks now */

  /* The consumer: a bare engine that PINs the request and then says nothing more. */
  int maps0 = tu_memfd_maps(0);
  HixlEngine *cons = tu_engine_start_with(tu_ip(), transport);
  CU_ASSERT_PTR_NOT_NULL_FATAL(cons);
  uint8_t *dst = tu_alloc_mem(BLOCK_BYTES, false);
  CU_ASSERT_FATAL(dst && tu_register(cons, dst, BLOCK_BYTES));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(cons, addr, 5000));
  if (alloc) CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0 + 1); /* the consumer maps the producer's KV */
  /* Over shm the consumer keeps copying the whole KV (async, by its progress thread)
   * while the lease runs out: the producer must wait for the copy running to let go. */
  size_t bulk_len = (size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES;
  uint8_t *bulk = alloc ? tu_alloc_mem(bulk_len, false) : NULL;
  HixlTransferOpDesc bulk_ops[LAYERS * 2];
  HixlTransferReq busy = NULL;
  if (alloc) {
    CU_ASSERT_FATAL(bulk && tu_register(cons, bulk, bulk_len));
    for (int t = 0; t < LAYERS * 2; t++)
      bulk_ops[t] = (HixlTransferOpDesc){(uintptr_t)(bulk + (size_t)t * BLOCKS * BLOCK_BYTES),
                                         layers[t / 2].base + (t % 2 ? layers[t / 2].v_offset : 0),
                                         (size_t)BLOCKS * BLOCK_BYTES};
  }
  uint8_t req[64], ans[4096];
  size_t n = 0, qlen = kv_req(req, 1 /* PIN */, id, &cap);
  TU_ASSERT_OK_FATAL(hixl_engine_call(cons, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == 0); /* HELD: the lease now runs from here */
  /* Pinned and linked: its READ of the held block works. */
  uint64_t block2 = layers[0].base + 2 * BLOCK_BYTES;
  HixlTransferOpDesc d = {(uintptr_t)dst, block2, BLOCK_BYTES};
  TU_ASSERT_OK(HixlEngineTransferSync(cons, addr, HIXL_READ, &d, 1, 5000));
  CU_ASSERT_EQUAL(tu_check_byte(dst, BLOCK_BYTES, 0x5a), -1);

  /* The lease runs out; the producer reports the request finished sending. */
  bool done = false;
  int64_t end = tu_now_ms() + 10 * LEASE_MS + 5000;
  while (!done && tu_now_ms() < end) {
    hixl_kv_ids s = {0}, rv = {0};
    HixlTransferStatus bs = HIXL_TRANSFER_WAITING;
    if (busy && (HixlEngineGetTransferStatus(cons, busy, &bs) != HIXL_SUCCESS || bs != HIXL_TRANSFER_WAITING))
      busy = NULL;
    if (alloc && !busy &&
        HixlEngineTransferAsync(cons, addr, HIXL_READ, bulk_ops, LAYERS * 2, 30000, NULL, &busy) !=
            HIXL_SUCCESS)
      busy = NULL;
    step(sched, worker);
    ST_IS(ops->get_finished(worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
    for (size_t i = 0; i < s.count; i++) done |= strcmp(s.ids[i], id) == 0;
    ops->free_ids(&s);
    ops->free_ids(&rv);
    struct timespec ts = {0, 2000000};
    if (!alloc) nanosleep(&ts, NULL); /* over shm the consumer's copies pace the loop */
    if (busy && !done) {              /* one copy per round: running while get_finished (and its drop) run */
      tu_wait_request(cons, busy, tu_now_ms() + 30000, &bs);
      busy = NULL;
    }
  }
  CU_ASSERT_TRUE_FATAL(done);
  hixl_kv_stats st;
  ST_IS(ops->get_stats(worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.lease_expired, 1);
  CU_ASSERT_EQUAL(st.blocks_held, 0);

  /* The host may reuse blocks 2 and 3 now; the consumer that pinned them is cut off
   * (and no longer maps them), so its late READ fails and brings nothing of them. */
  if (alloc) CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0);
  if (busy) { /* it ended when the mapping went, or fails now */
    HixlTransferStatus bs = HIXL_TRANSFER_WAITING;
    TU_ASSERT_OK(tu_wait_request(cons, busy, tu_now_ms() + 30000, &bs));
  }
  fill_kv(layers, 0x77); /* the next request's KV */
  memset(dst, 0xab, BLOCK_BYTES);
  HixlStatus late = HixlEngineTransferSync(cons, addr, HIXL_READ, &d, 1, 5000);
  CU_ASSERT_NOT_EQUAL(late, HIXL_SUCCESS);
  printf("  [the pinned consumer's READ after the lease: %s: %s]\n", HixlStatusName(late),
         HixlGetLastErrorMessage());
  CU_ASSERT_EQUAL(tu_check_byte(dst, BLOCK_BYTES, 0xab), -1);
  /* A PIN now: it cannot get through, or the request is GONE. */
  n = 0;
  HixlStatus pin = hixl_engine_call(cons, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 2000);
  CU_ASSERT(pin != HIXL_SUCCESS || (n >= 1 && ans[0] == 2));

  HixlEngineDestroy(cons);
  tu_free_mem(dst, BLOCK_BYTES);
  if (bulk) tu_free_mem(bulk, bulk_len);
  ST_IS(ops->destroy(worker), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(sched), HIXL_KV_SUCCESS);
  free(kv);
}

static void test_lease_tcp(void) { lease_case("tcp", false); }
static void test_lease_shm_mapped(void) { lease_case("shm", true); }

/* A LAYER / LAYERS notice as a producer's pusher sends it: id, first layer, and
 * (LAYERS) how many. */
static size_t kv_layers_req(uint8_t *buf, uint8_t op, const char *id, const struct kv_cap *cap,
                            uint32_t first, uint32_t count) {
  size_t n = kv_req(buf, op, id, cap);
  for (int k = 0; k < (op == 6 ? 2 : 1); k++) {
    uint32_t v = k ? count : first;
    for (int b = 0; b < 4; b++) buf[n++] = (uint8_t)(v >> (24 - 8 * b));
  }
  return n;
}

/* Push mode, the consumer: landed notices from a bare engine standing for the
 * producer, with the request's capability from its push params. A range (LAYERS)
 * marks each layer in it, an already landed one too; a range of one, or one past the
 * last layer, is refused (PARAM_INVALID) and marks nothing; another request presenting
 * this one's capability is refused too; a request that ended is NOT_FOUND. The request
 * is received once every layer landed. */
static void test_push_notices(void) {
  char addr[TU_ADDR_LEN];
  hixl_kv_connector *sched, *worker;
  connectors_up("consumer", "push", 20000, "tcp", addr, &sched, &worker);
  CU_ASSERT_FATAL(sched && worker);
  uint8_t *kv = malloc((size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  CU_ASSERT_FATAL(kv != NULL);
  hixl_kv_layer layers[LAYERS];
  layers_at(layers, kv);
  ST_IS(ops->register_kv_caches(worker, layers, LAYERS), HIXL_KV_SUCCESS);

  /* The consumer expects "push-1" into blocks 4 and 5. */
  const char *id = "push-1", *mark = "{\"do_remote_prefill\": true}";
  const uint64_t blocks[2] = {4, 5};
  hixl_kv_request r = {id, strlen(id), 2 * BLOCK_TOKENS, mark, strlen(mark), 0};
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(tokens, 2 * BLOCK_TOKENS);
  ST_IS(ops->update_state_after_alloc(sched, &r, blocks, 2, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer pp = {0};
  struct kv_cap cap = {0};
  ST_IS(ops->get_push_params(sched, id, strlen(id), &pp), HIXL_KV_SUCCESS);
  CU_ASSERT_FATAL(params_cap(pp.data, pp.len, &cap));
  ops->free_buffer(&pp);
  step(sched, worker);

  HixlEngine *prod = tu_engine_start_with(tu_ip(), "tcp");
  CU_ASSERT_PTR_NOT_NULL_FATAL(prod);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(prod, addr, 5000));
  uint8_t req[64], ans[4096];
  size_t n = 0, qlen = kv_req(req, 3 /* ACCEPT */, id, &cap);
  TU_ASSERT_OK_FATAL(hixl_engine_call(prod, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == 0); /* HELD: it expects the request */
  struct {
    uint8_t op;
    const char *id;
    uint32_t first, count;
    HixlStatus want;
  } bad[] = {{6, id, 0, 1, HIXL_PARAM_INVALID},            /* a range of one is a LAYER */
             {6, id, 1, LAYERS, HIXL_PARAM_INVALID},       /* one past the last layer */
             {6, id, 0, UINT32_MAX, HIXL_PARAM_INVALID},   /* first + count overflows */
             {4, id, LAYERS, 0, HIXL_PARAM_INVALID},       /* no such layer */
             {6, "nobody", 0, LAYERS, HIXL_PARAM_INVALID}, /* push-1's capability */
             {4, "nobody", 0, 0, HIXL_PARAM_INVALID}};
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    qlen = kv_layers_req(req, bad[k].op, bad[k].id, &cap, bad[k].first, bad[k].count);
    TU_ASSERT_STATUS(hixl_engine_call(prod, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000),
                     bad[k].want);
  }
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(rv.count, 0); /* nothing marked by the refused ones */
  ops->free_ids(&s);
  ops->free_ids(&rv);
  qlen = kv_layers_req(req, 4 /* LAYER */, id, &cap, 0, 0);
  TU_ASSERT_OK(hixl_engine_call(prod, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000));
  ST_IS(ops->wait_for_layer_load(worker, 0), HIXL_KV_SUCCESS);
  ST_IS(ops->get_finished(worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(rv.count, 0); /* layer 1 has not landed */
  ops->free_ids(&s);
  ops->free_ids(&rv);
  qlen = kv_layers_req(req, 6 /* LAYERS */, id, &cap, 0, LAYERS); /* layer 0 again, and layer 1 */
  TU_ASSERT_OK(hixl_engine_call(prod, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000));
  ST_IS(ops->wait_for_layer_load(worker, LAYERS - 1), HIXL_KV_SUCCESS);
  ST_IS(ops->get_finished(worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(rv.count, 1);
  if (rv.count == 1) CU_ASSERT_STRING_EQUAL(rv.ids[0], id);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  qlen = kv_layers_req(req, 4 /* LAYER */, id, &cap, 0, 0); /* it ended: not expected any more */
  TU_ASSERT_STATUS(hixl_engine_call(prod, addr, HIXL_SERVICE_KV, req, qlen, ans, sizeof(ans), &n, 5000),
                   HIXL_NOT_FOUND);
  hixl_kv_stats_ex st = {.size = sizeof(st)};
  ST_IS(ops->get_stats_ex(worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.loads_done, 1);
  CU_ASSERT_EQUAL(st.loads_failed, 0);
  CU_ASSERT_EQUAL(st.cap_refused, 2); /* the two for "nobody" */
  HixlEngineDestroy(prod);
  ST_IS(ops->destroy(worker), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(sched), HIXL_KV_SUCCESS);
  free(kv);
}

/* A peer standing in for the plugin's: a bare engine with a cache manager (so the
 * other side can link to it) that answers the KV service itself: PIN or ACCEPT "not
 * yet", and FREE or ABORT by counting it. */
struct fake_producer {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pins, frees;
  char freed[64];
  char pinned[8][64]; /* the requests PINned, each once (the first 8) */
  int npinned;
  const uint8_t *held; /* non-NULL: PIN answers these bytes (HELD) instead of "not yet" */
  size_t held_len;
};

static HixlStatus fake_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                          size_t cap, size_t *resp_len) {
  struct fake_producer *f = ctx;
  size_t n = len >= 4 ? (size_t)req[2] << 8 | req[3] : 0;
  (void)peer, (void)cap;
  /* After the id its capability (u8 length, the bytes), the caller's world size and
   * rank (u32 each); then ABORT carries its reason, PIN may carry its hold's epoch and
   * number, ACCEPT the producer's blocks per group */
  size_t t = len > 4 + n ? 4 + n + 1 + req[4 + n] + 8 : len + 1; /* where the op's own fields start */
  bool tail_ok = t <= len && (len == t || req[1] == 5 || (req[1] == 1 && len == t + 16) ||
                              (req[1] == 3 && len > t && len == t + 1 + 4 * (size_t)req[t]));
  if (len < 4 || req[0] != KV_SVC_PROTO || len < 4 + n || !tail_ok || n >= sizeof(f->freed))
    return HIXL_PARAM_INVALID;
  pthread_mutex_lock(&f->mu);
  *resp_len = 0;
  if (req[1] == 1 || req[1] == 3) { /* PIN, ACCEPT */
    f->pins++;
    bool seen = false;
    for (int i = 0; i < f->npinned && !seen; i++)
      seen = strlen(f->pinned[i]) == n && !memcmp(f->pinned[i], req + 4, n);
    if (!seen && f->npinned < 8) {
      memcpy(f->pinned[f->npinned], req + 4, n);
      f->pinned[f->npinned++][n] = '\0';
    }
    resp[0] = 1; /* NOT_YET: ask again */
    *resp_len = 1;
    if (f->held && f->held_len <= cap) {
      memcpy(resp, f->held, f->held_len);
      *resp_len = f->held_len;
    }
  } else if (req[1] == 2 || req[1] == 5) { /* FREE, ABORT */
    f->frees++;
    memcpy(f->freed, req + 4, n);
    f->freed[n] = '\0';
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return HIXL_SUCCESS;
}

/* Wait until *count reaches want, at most timeout_ms; whether it did. */
static bool fake_wait(struct fake_producer *f, const int *count, int want, int timeout_ms) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += timeout_ms / 1000;
  dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&f->mu);
  int rc = 0;
  while (*count < want && rc == 0) rc = pthread_cond_timedwait(&f->cv, &f->mu, &dl);
  bool ok = *count >= want;
  pthread_mutex_unlock(&f->mu);
  return ok;
}

/* A connector of role and mode (the side under test) beside a fake peer, its KV of
 * BLOCKS blocks per layer registered and filled with c. */
struct lost {
  struct fake_producer f;
  char peer[TU_ADDR_LEN], self[TU_ADDR_LEN];
  HixlEngine *eng;
  HixlCacheManager *mgr;
  hixl_kv_connector *sched, *worker;
  uint8_t *kv;
  size_t len;
  int32_t efd;
};

static bool lost_up(struct lost *t, const char *role, const char *mode, int lease_ms, uint8_t c) {
  *t = (struct lost){.f = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}, .efd = -1};
  uint16_t port = tu_free_port();
  struct in_addr ip;
  if (!port || inet_pton(AF_INET, tu_ip(), &ip) != 1) return false;
  tu_addr(t->peer, TU_ADDR_LEN, port);
  if (!(t->eng = tu_engine_start_with(t->peer, "tcp"))) return false;
  /* its cluster id as the plugin derives it: ip, then port */
  TU_ASSERT_OK(HixlCacheManagerCreate(t->eng, (uint64_t)ntohl(ip.s_addr) << 16 | port, &t->mgr));
  TU_ASSERT_OK(hixl_engine_set_service(t->eng, HIXL_SERVICE_KV, fake_kv, &t->f));
  connectors_up(role, mode, lease_ms, "tcp", t->self, &t->sched, &t->worker);
  t->len = (size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES;
  if (!t->mgr || !t->sched || !t->worker || !(t->kv = malloc(t->len))) return false;
  hixl_kv_layer layers[LAYERS];
  layers_at(layers, t->kv);
  ST_IS(ops->register_kv_caches(t->worker, layers, LAYERS), HIXL_KV_SUCCESS);
  fill_kv(layers, c);
  ST_IS(ops->get_event_fd(t->worker, &t->efd), HIXL_KV_SUCCESS);
  return t->efd >= 0;
}

/* The connector asked the peer (PIN or ACCEPT): linked. The peer cuts it off. */
static void lost_cut(struct lost *t) {
  CU_ASSERT_FATAL(fake_wait(&t->f, &t->f.pins, 1, 10000));
  size_t dropped = 0;
  TU_ASSERT_OK(hixl_engine_drop_peer(t->eng, t->self, "the test cuts the link", &dropped));
  CU_ASSERT_EQUAL(dropped, 1);
}

/* The host hears (by the fd) that id finished: sending (push) or receiving. */
static void lost_finished(struct lost *t, const char *id, bool sending) {
  struct pollfd pf = {t->efd, POLLIN, 0};
  CU_ASSERT_EQUAL_FATAL(poll(&pf, 1, 10000), 1);
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(t->worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  const hixl_kv_ids *got = sending ? &s : &rv;
  CU_ASSERT(got->count == 1 && strcmp(got->ids[0], id) == 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
}

static void lost_down(struct lost *t) {
  if (t->worker) ST_IS(ops->destroy(t->worker), HIXL_KV_SUCCESS);
  if (t->sched) ST_IS(ops->destroy(t->sched), HIXL_KV_SUCCESS);
  if (t->eng) TU_ASSERT_OK(hixl_engine_set_service(t->eng, HIXL_SERVICE_KV, NULL, NULL));
  if (t->mgr) TU_ASSERT_OK(HixlCacheManagerDestroy(t->mgr));
  if (t->eng) HixlEngineDestroy(t->eng);
  free(t->kv);
}

/* Pull mode, the consumer: its load loses its link (the producer cuts it while the
 * consumer asks it to pin the request). The load fails and reports its blocks, and the
 * consumer tells the producer to free the request over a new link: else the producer
 * would hold it until its lease runs out, and then cut this consumer's links, the new
 * one and every load on it included. */
static void test_free_after_lost_link(void) {
  struct lost t;
  char params[256];
  CU_ASSERT_FATAL(lost_up(&t, "consumer", "pull", 20000, 0xee));
  /* The host loads "dec-lost" (the producer's "lost-1") into blocks 4 and 5. */
  snprintf(params, sizeof(params),
           "{\"do_remote_prefill\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"lost-1\","
           " \"remote_block_ids\": [2, 3]}",
           t.peer);
  const char *id = "dec-lost";
  const uint64_t blocks[2] = {4, 5};
  hixl_kv_request r = {id, strlen(id), 2 * BLOCK_TOKENS, params, strlen(params), 0};
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(t.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(tokens, 2 * BLOCK_TOKENS);
  CU_ASSERT_EQUAL(async, 1);
  ST_IS(ops->update_state_after_alloc(t.sched, &r, blocks, 2, (uint64_t)tokens), HIXL_KV_SUCCESS);
  step(t.sched, t.worker);
  lost_cut(&t);

  /* The load fails, reporting blocks 4 and 5 ... */
  lost_finished(&t, id, false);
  hixl_kv_blocks b = {0};
  ST_IS(ops->get_block_ids_with_load_errors(t.worker, &b), HIXL_KV_SUCCESS);
  CU_ASSERT(b.count == 2 && b.ids[0] == 4 && b.ids[1] == 5);
  ops->free_buffer(&b.raw);
  CU_ASSERT_EQUAL(tu_check_byte(t.kv, t.len, 0xee), -1); /* nothing moved */
  /* ... and the producer is told to free it, over the new link the consumer made. */
  CU_ASSERT(fake_wait(&t.f, &t.f.frees, 1, 10000));
  CU_ASSERT_STRING_EQUAL(t.f.freed, "lost-1");
  hixl_kv_stats st;
  ST_IS(ops->get_stats(t.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_failed == 1 && st.loads_done == 0);
  lost_down(&t);
}

/* Push mode, the producer: its push loses its link (the consumer cuts it while the
 * producer asks it to accept the request). The push fails, the host hears the request
 * finished sending, and the producer tells the consumer over a new link (ABORT): else
 * the consumer would wait for the request until its lease ran out, and then cut this
 * producer's links, the new one and every push on it included. */
static void test_abort_after_lost_link(void) {
  struct lost t;
  char params[256];
  CU_ASSERT_FATAL(lost_up(&t, "producer", "push", 20000, 0x5a));
  /* The host pushes "pre-lost" (blocks 2 and 3) into the consumer's "push-lost". */
  snprintf(params, sizeof(params),
           "{\"do_remote_decode\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"push-lost\","
           " \"remote_block_ids\": [4, 5]}",
           t.peer);
  const char *id = "pre-lost";
  const uint64_t blocks[2] = {2, 3};
  hixl_kv_request r = {id, strlen(id), 2 * BLOCK_TOKENS, params, strlen(params), 0};
  ST_IS(ops->update_state_after_alloc(t.sched, &r, blocks, 2, 0), HIXL_KV_SUCCESS);
  step(t.sched, t.worker);
  lost_cut(&t);

  /* The consumer is told, over the new link the producer made, and the host hears the
   * request finished sending: its blocks are free. */
  CU_ASSERT(fake_wait(&t.f, &t.f.frees, 1, 10000));
  CU_ASSERT_STRING_EQUAL(t.f.freed, "push-lost");
  lost_finished(&t, id, true);
  hixl_kv_stats st;
  ST_IS(ops->get_stats(t.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.pushes_failed == 1 && st.pushes_done == 0);
  lost_down(&t);
}

/* The consumer's scheduler binds a load of id (the producer's rid) from the peer:
 * its blocks local[] from the peer's remote[] (n of them). */
static void lost_load(struct lost *t, const char *id, const char *rid, const uint64_t *local,
                      const uint64_t *remote, size_t n) {
  char params[512];
  int k = snprintf(params, sizeof(params),
                   "{\"do_remote_prefill\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"%s\","
                   " \"remote_block_ids\": [",
                   t->peer, rid);
  for (size_t i = 0; i < n; i++)
    k += snprintf(params + k, sizeof(params) - (size_t)k, "%s%lu", i ? "," : "", (unsigned long)remote[i]);
  snprintf(params + k, sizeof(params) - (size_t)k, "]}");
  hixl_kv_request r = {id, strlen(id), n * BLOCK_TOKENS, params, strlen(params), 0};
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(t->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(t->sched, &r, local, n, (uint64_t)tokens), HIXL_KV_SUCCESS);
}

/* Pull mode, the consumer: while a load is pulled its request is pinned again every
 * half lease (vLLM's decode heartbeats), so the producer keeps holding it. The peer
 * holds the request in planes of its own (a PIN answer it builds from the consumer's
 * digest) and counts the PINs: a load of 32 MiB in 1 MiB pieces, with a lease of 1 ms,
 * is pinned again while it moves (without the renewer: once). */
static void test_pin_renewed(void) {
  struct lost t;
  CU_ASSERT_FATAL(lost_up(&t, "consumer", "pull", 1, 0xee));
  /* The peer's KV: the consumer's shape (2 layers, K and V, 16 blocks of 1 MiB), 0x3c. */
  size_t plane = (size_t)BLOCKS * BLOCK_BYTES;
  uint8_t *kv = tu_alloc_mem(4 * plane, false);
  CU_ASSERT_FATAL(kv && tu_register(t.eng, kv, 4 * plane));
  memset(kv, 0x3c, 4 * plane);
  hixl_kv_buffer hs = {0}; /* the consumer's digest, from its handshake metadata */
  ST_IS(ops->get_handshake_metadata(t.worker, &hs), HIXL_KV_SUCCESS);
  const char *lay = strstr((const char *)hs.data, "\"layout\":\"");
  CU_ASSERT_FATAL(lay != NULL);
  lay += 10;
  size_t lay_len = (size_t)(strchr(lay, '"') - lay);
  const uint64_t local[8] = {0, 2, 4, 6, 8, 10, 12, 14}, remote[8] = {1, 3, 5, 7, 9, 11, 13, 15};
  uint32_t count = 8;
  struct kv_out a = {0}; /* HELD, layout, 8 blocks, their digest, one group, 4 planes */
  kv_put_u8(&a, KV_PIN_HELD);
  kv_put_str(&a, lay, lay_len);
  kv_put_u32(&a, count);
  kv_put_u64(&a, kv_groups_digest(remote, count, &count, 1));
  kv_put_groups(&a, &count, 1);
  kv_put_u32(&a, 4);
  kv_put_u64(&a, BLOCKS);
  for (int p = 0; p < 4; p++) {
    kv_put_u64(&a, (uintptr_t)(kv + (size_t)p * plane));
    kv_put_u64(&a, BLOCK_BYTES);
    kv_put_u64(&a, 0);
  }
  CU_ASSERT_FATAL(!a.bad);
  pthread_mutex_lock(&t.f.mu);
  t.f.held = a.p;
  t.f.held_len = a.len;
  pthread_mutex_unlock(&t.f.mu);
  lost_load(&t, "dec-long", "long-1", local, remote, 8);
  step(t.sched, t.worker);
  lost_finished(&t, "dec-long", false);
  hixl_kv_blocks b = {0};
  ST_IS(ops->get_block_ids_with_load_errors(t.worker, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(b.count, 0);
  ops->free_buffer(&b.raw);
  for (int p = 0; p < 4; p++) /* every loaded block is the peer's, every other one untouched */
    for (uint64_t k = 0; k < BLOCKS; k++)
      CU_ASSERT_EQUAL(
          tu_check_byte(t.kv + (size_t)p * plane + k * BLOCK_BYTES, BLOCK_BYTES, k % 2 ? 0xee : 0x3c), -1);
  pthread_mutex_lock(&t.f.mu);
  int pins = t.f.pins;
  pthread_mutex_unlock(&t.f.mu);
  CU_ASSERT(pins >= 2); /* the first, and a renewal while the 32 MiB moved */
  hixl_kv_stats st;
  ST_IS(ops->get_stats(t.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_done == 1 && st.bytes_loaded == 32ull * BLOCK_BYTES && st.engine_ops == 32);
  ops->free_buffer(&hs);
  lost_down(&t);
  pthread_mutex_lock(&t.f.mu);
  t.f.held = NULL;
  pthread_mutex_unlock(&t.f.mu);
  free(a.p);
  tu_free_mem(kv, 4 * plane);
}

/* handle_preemptions on a pull consumer: loads not yet started end at once, failed,
 * their blocks reported; loads under way (the peer keeps answering "not yet") are
 * waited for: when the op returns they have ended and get_finished reports them.
 * Three loads of one producer: loads_per_producer (per) of them under way, the others
 * waiting for a loader thread of that producer. */
static void preemptions(int per) {
  struct lost t;
  per_producer = per;
  bool up = lost_up(&t, "consumer", "pull", 20000, 0xee);
  per_producer = 1;
  CU_ASSERT_FATAL(up);
  const char *ids[3] = {"pre-a", "pre-b", "pre-c"}, *rids[3] = {"rem-a", "rem-b", "rem-c"};
  const uint64_t local[3][2] = {{4, 5}, {6, 7}, {8, 9}}, ra[2] = {2, 3};
  for (int k = 0; k < 3; k++) lost_load(&t, ids[k], rids[k], local[k], ra, 2);
  step(t.sched, t.worker);
  CU_ASSERT_FATAL(fake_wait(&t.f, &t.f.npinned, per, 10000)); /* the first per are under way */
  hixl_kv_ids waiting = {ids + per, (size_t)(3 - per)}, under = {ids, (size_t)per};
  ST_IS(ops->handle_preemptions(t.worker, &waiting), HIXL_KV_SUCCESS);
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(t.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(rv.count, (size_t)(3 - per));
  for (size_t i = 0; i < rv.count && rv.ids; i++) CU_ASSERT(strcmp(rv.ids[i], ids[0]) != 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  hixl_kv_blocks b = {0};
  ST_IS(ops->get_block_ids_with_load_errors(t.worker, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(b.count, (size_t)(2 * (3 - per)));
  for (size_t i = 0; i < b.count && b.ids; i++) CU_ASSERT(b.ids[i] >= local[per][0] && b.ids[i] <= 9);
  ops->free_buffer(&b.raw);
  pthread_mutex_lock(&t.f.mu);
  CU_ASSERT_EQUAL(t.f.npinned, per); /* the ones waiting were never asked for */
  for (int i = 0; i < t.f.npinned; i++)
    for (int k = per; k < 3; k++) CU_ASSERT(strcmp(t.f.pinned[i], rids[k]) != 0);
  pthread_mutex_unlock(&t.f.mu);
  ST_IS(ops->handle_preemptions(t.worker, &under), HIXL_KV_SUCCESS);
  ST_IS(ops->get_finished(t.worker, NULL, &s, &rv), HIXL_KV_SUCCESS); /* ended before the op returned */
  CU_ASSERT_EQUAL(rv.count, (size_t)per);
  for (size_t i = 0; i < rv.count && rv.ids; i++)
    CU_ASSERT(strcmp(rv.ids[i], ids[0]) == 0 || (per == 2 && strcmp(rv.ids[i], ids[1]) == 0));
  ops->free_ids(&s);
  ops->free_ids(&rv);
  CU_ASSERT_EQUAL(tu_check_byte(t.kv, t.len, 0xee), -1); /* nothing moved */
  hixl_kv_stats st;
  ST_IS(ops->get_stats(t.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_failed == 3 && st.loads_done == 0);
  lost_down(&t);
}

static void test_preemptions(void) { preemptions(1); }
static void test_preemptions_two(void) { preemptions(2); }

/* handle_preemptions on a push consumer: a push expected into the request's blocks
 * ends at once, failed (reported received, its blocks in the load errors), and the
 * wait for its layers returns. */
static void test_preempt_expected_push(void) {
  struct lost t;
  CU_ASSERT_FATAL(lost_up(&t, "consumer", "push", 20000, 0xee));
  const char *id = "dec-pre";
  const uint64_t blocks[2] = {8, 9};
  hixl_kv_request r = {id, strlen(id), 2 * BLOCK_TOKENS, "{\"do_remote_prefill\": true}", 27, 0};
  int64_t tokens = 0;
  int32_t async = 0;
  hixl_kv_buffer pp = {0};
  ST_IS(ops->get_num_new_matched_tokens(t.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(t.sched, &r, blocks, 2, (uint64_t)tokens), HIXL_KV_SUCCESS);
  ST_IS(ops->get_push_params(t.sched, id, strlen(id), &pp), HIXL_KV_SUCCESS);
  ops->free_buffer(&pp);
  step(t.sched, t.worker); /* the worker expects the push now */
  const char *ids[1] = {id};
  ST_IS(ops->handle_preemptions(t.worker, &(hixl_kv_ids){ids, 1}), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_layer_load(t.worker, 0), HIXL_KV_SUCCESS); /* nothing to wait for */
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(t.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT(rv.count == 1 && strcmp(rv.ids[0], id) == 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  hixl_kv_blocks b = {0};
  ST_IS(ops->get_block_ids_with_load_errors(t.worker, &b), HIXL_KV_SUCCESS);
  CU_ASSERT(b.count == 2 && b.ids[0] == 8 && b.ids[1] == 9);
  ops->free_buffer(&b.raw);
  hixl_kv_stats st;
  ST_IS(ops->get_stats(t.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_failed == 1 && st.loads_done == 0);
  lost_down(&t);
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;
  /* Two engines of this one process link over shm only when authenticated (a pid that
   * is this process's own is proven by the socket's binding, docs/security.md): every
   * engine here, children included, holds a key. */
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;
  so = dlopen(HIXL_KV_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "dlopen %s: %s\n", HIXL_KV_PLUGIN_PATH, dlerror());
    return 1;
  }
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  char err[256] = "";
  if (!entry || entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "entry: %s\n", err);
    return 1;
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("plugin lease, a peer speaking the KV service", NULL, NULL);
  CU_add_test(s, "tcp: a pinned consumer is cut off when the lease runs out", test_lease_tcp);
  CU_add_test(s, "shm, the producer's KV mapped: the consumer unmaps before the report",
              test_lease_shm_mapped);
  CU_add_test(s, "push, the consumer: LAYER and LAYERS notices, ranges checked", test_push_notices);
  CU_add_test(s, "pull, the consumer: a load that lost its link frees the request over a new one",
              test_free_after_lost_link);
  CU_add_test(s, "push, the producer: a push that lost its link is aborted over a new one",
              test_abort_after_lost_link);
  CU_add_test(s, "pull, the consumer: a load longer than half the lease pins again", test_pin_renewed);
  CU_add_test(s, "handle_preemptions: a queued load ends at once, one under way is waited for",
              test_preemptions);
  CU_add_test(s, "handle_preemptions: two loads of one producer under way (loads_per_producer 2)",
              test_preemptions_two);
  CU_add_test(s, "handle_preemptions: a push expected into the blocks ends at once",
              test_preempt_expected_push);
  if (CU_get_error() != CUE_SUCCESS) return 1;
  int result = tu_run_registry();
  dlclose(so);
  return result;
}
