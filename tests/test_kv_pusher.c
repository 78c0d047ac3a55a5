/* test_kv_pusher: a push producer's pusher thread (plugin/src/kv_pusher.c) when its
 * allocations fail, white-box: the plugin linked as hixl_kv_test (its ops table taken
 * from the entry point directly), a consumer and a producer instance in this process.
 * Each allocation of the pusher fails in turn (KV_ALLOC, KV_TEST_PUSH); every time the
 * request still ends on both sides (the producer's finished_sending, the consumer's
 * finished_recving), the producer holds nothing after, and a push that went through
 * landed byte for byte. Under ASan (detect_leaks) nothing of a failed push is left. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_hung.h"
#include "kv_int.h"
#include "test_util.h"

enum { LAYERS = 2, BLOCKS = 24, NB = 2, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };
#define WAIT_MS 10000 /* a request ends well within this, or it never will */

/* The plugin's one entry point, here linked in rather than found by dlsym. */
hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap);

static const hixl_kv_ops *ops;

#include "kv_inst.h"

static bool inst_up(struct inst *x, const char *role) {
  return inst_up_with(x, role,
                      "\"mode\": \"push\", \"lease_ms\": 5000, \"transfer_timeout_ms\": 3000, "
                      "\"connect_timeout_ms\": 3000",
                      0xEE);
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), NB * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* The consumer d expects id into its blocks db (NB of them): its push params' text
 * (free it), NULL on failure. */
static char *expect_push(struct inst *d, const char *id, const uint64_t *db) {
  hixl_kv_request r = request(id, "{\"do_remote_prefill\": true}");
  hixl_kv_buffer params = {0};
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, db, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
  if (ops->get_push_params(d->sched, id, strlen(id), &params) != HIXL_KV_SUCCESS) return NULL;
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  return text;
}

/* The producer p pushes id from its blocks pb (NB of them) as params say. */
static void produce(struct inst *p, const char *id, const char *params, const uint64_t *pb) {
  hixl_kv_request r = request(id, params);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(p->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(p->sched, &r, pb, NB, 0), HIXL_KV_SUCCESS);
}

/* Fill p's blocks pb with seed's pattern and d's db with 0xEE. */
static void fill_blocks(struct inst *d, const uint64_t *db, struct inst *p, const uint64_t *pb,
                        uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++) {
        memset(block(d, l, v, db[b]), 0xEE, BLOCK_BYTES);
        tu_fill(block(p, l, v, pb[b]), BLOCK_BYTES, seed + (uint64_t)(l * 4 + v * 2 + b));
      }
}

/* d's blocks db hold seed's pattern (fill_blocks). */
static void assert_landed(struct inst *d, const uint64_t *db, uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++)
        TU_ASSERT_PATTERN(block(d, l, v, db[b]), BLOCK_BYTES, seed + (uint64_t)(l * 4 + v * 2 + b),
                          "a pushed block");
}

/* One request pushed from p's blocks {4, 5} into d's {1, 2}: whether it ended on both
 * sides within WAIT_MS; *landed: the consumer's load succeeded. */
static bool push_one(struct inst *d, struct inst *p, const char *id, uint64_t seed, bool *landed) {
  static const uint64_t dblocks[NB] = {1, 2}, pblocks[NB] = {4, 5};
  hixl_kv_buffer none = {0};
  int32_t delay = 0;
  *landed = false;
  fill_blocks(d, dblocks, p, pblocks, seed);
  char *text = expect_push(d, id, dblocks); /* the consumer allocates first and hands its blocks over */
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  produce(p, id, text, pblocks);
  hixl_kv_request r = request(id, text);
  step(d);
  step(p);
  for (uint32_t l = 0; l < LAYERS; l++) CU_ASSERT_EQUAL(ops->save_kv_layer(p->worker, l), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->request_finished(p->sched, &r, pblocks, NB, &delay, &none), HIXL_KV_SUCCESS);
  ops->free_buffer(&none);
  free(text);
  bool sent = inst_wait_stepped(p, id, 0, WAIT_MS), got = sent && inst_wait_stepped(d, id, 1, WAIT_MS);
  if (!sent || !got) return false;
  hixl_kv_blocks errs = {0};
  CU_ASSERT_EQUAL(ops->get_block_ids_with_load_errors(d->worker, &errs), HIXL_KV_SUCCESS);
  *landed = errs.count == 0;
  ops->free_buffer(&errs.raw);
  if (*landed) assert_landed(d, dblocks, seed);
  return true;
}

/* The pusher's nth allocation fails, for each n until a push allocates fewer. */
static void test_pusher_allocation_fails(void) {
  struct inst d, p;
  if (!inst_up(&d, "consumer") || !inst_up(&p, "producer")) goto down;
  for (unsigned nth = 1;; nth++) {
    char id[32], what[96];
    hixl_kv_stats s0, s1;
    bool landed;
    snprintf(id, sizeof(id), "oom-%u", nth);
    CU_ASSERT_EQUAL(ops->get_stats(p.worker, &s0), HIXL_KV_SUCCESS);
    unsigned failed0 = kv_test_failed(KV_TEST_PUSH);
    kv_test_fail_nth(KV_TEST_PUSH, nth);
    bool ended = push_one(&d, &p, id, 1000 * nth, &landed);
    kv_test_fail_nth(KV_TEST_PUSH, 0);
    bool injected = kv_test_failed(KV_TEST_PUSH) > failed0;
    CU_ASSERT_EQUAL(ops->get_stats(p.worker, &s1), HIXL_KV_SUCCESS);
    snprintf(what, sizeof(what), "the pusher's allocation %u %s", nth, injected ? "failed" : "(none failed)");
    if (!ended) {
      tu_fail(__FILE__, __LINE__, "%s: request %s never ended (producer holds %llu requests)", what, id,
              (unsigned long long)s1.requests_held);
      break; /* the pusher is stuck or gone: later rounds would only wait too */
    }
    CU_PASS(what);
    CU_ASSERT_EQUAL(s1.requests_held, 0);
    CU_ASSERT_EQUAL(s1.blocks_held, 0);
    CU_ASSERT_EQUAL(s1.pushes_done + s1.pushes_failed, s0.pushes_done + s0.pushes_failed + 1);
    CU_ASSERT_EQUAL(s1.pushes_done - s0.pushes_done, landed ? 1 : 0);
    if (!injected) {
      CU_ASSERT_TRUE(landed);  /* nothing failed: pushed whole */
      CU_ASSERT_TRUE(nth > 1); /* the hook reached the pusher's allocations at all */
      break;
    }
  }
down:
  inst_down(&p);
  inst_down(&d);
}

/* One step of the producer pushes two requests to a consumer H that never accepts (each
 * answer 1.5 s late, the producer's transfer_timeout_ms 2000) and, after them, one to a
 * healthy consumer D whose expected push lives 600 ms: D's part goes through its layers
 * as soon as D accepts, lands byte for byte and ends on the producer (finished_sending)
 * before H's, which fail; the producer holds nothing after. Before, the pusher ACCEPTed a step's parts one
 * after another: D's ACCEPT came after H's, past D's lease, and D's load failed. */
static void test_hung_consumer_delays_no_other_push(void) {
  static const uint64_t db[NB] = {1, 2}, pb[NB] = {4, 5}, hb[2][NB] = {{6, 7}, {0, 3}};
  struct inst d, p;
  bool up = inst_up_with(&d, "consumer", "\"mode\": \"push\", \"lease_ms\": 600", 0xEE) &&
            inst_up_with(&p, "producer",
                         "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 2000, "
                         "\"connect_timeout_ms\": 3000, \"notify_timeout_ms\": 1000",
                         0x11);
  CU_ASSERT_FATAL(up);
  char hparams[512];
  struct hung_peer h;
  CU_ASSERT_FATAL(hung_peer_up(&h));
  fill_blocks(&d, db, &p, pb, 500);
  char *dparams = expect_push(&d, "D", db);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dparams);
  for (int i = 0; i < 2; i++) { /* first in the step */
    snprintf(hparams, sizeof(hparams),
             "{\"do_remote_decode\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"H%d\", "
             "\"remote_block_ids\": [1, 2], \"tp_size\": 1, \"cap\": \"00112233445566778899aabbccddeeff\"}",
             h.addr, i);
    produce(&p, i ? "H1" : "H0", hparams, hb[i]);
  }
  produce(&p, "D", dparams, pb);
  step(&d);
  step(&p);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  bool d_got = false, d_sent = false, d_before_h = false;
  int h_sent = 0;
  for (int64_t end = tu_now_ms() + 2 * WAIT_MS; !(d_got && d_sent && h_sent == 2) && tu_now_ms() < end;) {
    hixl_kv_ids s = {0}, r = {0};
    if (ops->get_finished(d.worker, NULL, &s, &r) == HIXL_KV_SUCCESS)
      for (size_t i = 0; i < r.count; i++) d_got |= strcmp(r.ids[i], "D") == 0;
    ops->free_ids(&s);
    ops->free_ids(&r);
    if (ops->get_finished(p.worker, NULL, &s, &r) == HIXL_KV_SUCCESS)
      for (size_t i = 0; i < s.count; i++) {
        if (strcmp(s.ids[i], "D") == 0) d_sent = true, d_before_h = h_sent == 0;
        h_sent += s.ids[i][0] == 'H';
      }
    ops->free_ids(&s);
    ops->free_ids(&r);
    struct timespec ts = {0, 5000000}; /* a host's step, not a synchronization: the lease is tested */
    nanosleep(&ts, NULL);
  }
  CU_ASSERT_TRUE(d_got && d_sent && h_sent == 2);
  CU_ASSERT_TRUE(d_before_h); /* D's part ended as it landed, not with H's */
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(errs.count, 0); /* D's load did not fail */
  ops->free_buffer(&errs.raw);
  assert_landed(&d, db, 500);
  hixl_kv_stats sp, sd;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.pushes_done, 1);
  CU_ASSERT_EQUAL(sp.pushes_failed, 2);
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  CU_ASSERT_EQUAL(sp.blocks_held, 0);
  CU_ASSERT_EQUAL(sd.blocks_held, 0);
  free(dparams);
  inst_down(&p);
  inst_down(&d);
  hung_peer_down(&h);
}

/* A push to a consumer that answers its ACCEPT "not yet" (it never expects the request),
 * with a transfer_timeout_ms of 30 s: the producer's shutdown, once that ACCEPT is being
 * asked again, returns within a few seconds (before: the pusher asked on until
 * transfer_timeout_ms and shutdown joined it, 30 s); the push ends failed, the producer
 * holds nothing. */
static void test_shutdown_stops_accept_not_yet(void) {
  static const uint64_t pb[NB] = {4, 5};
  struct inst p;
  CU_ASSERT_FATAL(inst_up_with(&p, "producer",
                               "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 30000, "
                               "\"connect_timeout_ms\": 3000, \"notify_timeout_ms\": 1000",
                               0x11));
  struct hung_peer h;
  CU_ASSERT_FATAL(never_peer_up(&h));
  char params[512];
  snprintf(params, sizeof(params),
           "{\"do_remote_decode\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"N0\", "
           "\"remote_block_ids\": [1, 2], \"tp_size\": 1, \"cap\": \"00112233445566778899aabbccddeeff\"}",
           h.addr);
  produce(&p, "N0", params, pb);
  step(&p);
  CU_ASSERT_FATAL(hung_peer_asked(&h, 3, WAIT_MS)); /* and asked again */
  int64_t t0 = tu_now_ms();
  ST_IS(ops->shutdown(p.worker), HIXL_KV_SUCCESS);
  int64_t took = tu_now_ms() - t0;
  if (took >= 5000)
    tu_fail(__FILE__, __LINE__, "shutdown took %lld ms (an ACCEPT asked on)", (long long)took);
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.pushes_failed, 1);
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  CU_ASSERT_EQUAL(sp.blocks_held, 0);
  inst_down(&p);
  hung_peer_down(&h);
}

/* The consumer's EXPECT bind runs out of memory (KV_ALLOC, KV_TEST_BIND): the bind says
 * RESOURCE_EXHAUSTED, and the request still ends on both sides: the consumer reports it
 * finished receiving with its blocks in the load errors and none written, the
 * producer's ACCEPT hears GONE and its push ends (finished_sending, counted failed),
 * holding nothing. Before, the bind kept nothing and told nobody: the host waited for
 * the request for ever and the producer's ACCEPT for its transfer timeout. */
static void test_expect_out_of_memory(void) {
  static const uint64_t db[NB] = {1, 2}, pb[NB] = {4, 5};
  struct inst d, p;
  if (!inst_up(&d, "consumer") || !inst_up(&p, "producer")) goto down;
  fill_blocks(&d, db, &p, pb, 77);
  char *text = expect_push(&d, "oom-x", db);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  produce(&p, "oom-x", text, pb);
  hixl_kv_buffer m = {0}, none = {0};
  ST_IS(ops->build_connector_meta(d.sched, &m), HIXL_KV_SUCCESS);
  unsigned failed0 = kv_test_failed(KV_TEST_BIND);
  kv_test_fail_nth(KV_TEST_BIND, 1);
  CU_ASSERT_EQUAL(ops->bind_connector_meta(d.worker, m.data, m.len), HIXL_KV_RESOURCE_EXHAUSTED);
  kv_test_fail_nth(KV_TEST_BIND, 0);
  CU_ASSERT_EQUAL(kv_test_failed(KV_TEST_BIND), failed0 + 1);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(d.worker), HIXL_KV_SUCCESS);
  step(&p);
  for (uint32_t l = 0; l < LAYERS; l++) CU_ASSERT_EQUAL(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->wait_for_save(p.worker), HIXL_KV_SUCCESS);
  hixl_kv_request r = request("oom-x", text);
  int32_t delay = 0;
  CU_ASSERT_EQUAL(ops->request_finished(p.sched, &r, pb, NB, &delay, &none), HIXL_KV_SUCCESS);
  ops->free_buffer(&none);
  free(text);
  CU_ASSERT_TRUE(inst_wait_stepped(&d, "oom-x", 1, WAIT_MS));
  CU_ASSERT_TRUE(inst_wait_stepped(&p, "oom-x", 0, WAIT_MS));
  inst_assert_unloaded(&d, db, NB, 0xEE, "a block not pushed"); /* 0xEE: fill_blocks' consumer bytes */
  hixl_kv_stats s;
  ST_IS(ops->get_stats(p.worker, &s), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(s.requests_held, 0);
  CU_ASSERT_EQUAL(s.blocks_held, 0);
  CU_ASSERT_EQUAL(s.pushes_failed, 1);
  CU_ASSERT_EQUAL(s.pushes_done, 0);
down:
  inst_down(&p);
  inst_down(&d);
}

/* The host steps producer p until n requests whose ids start with c are reported sent
 * (get_finished), 2 x WAIT_MS at most; then each must have failed and p hold nothing.
 * Returns the ms it took from t0 (the caller asserts its bound). */
static int64_t wait_pushes_failed(struct inst *p, char c, int n, int64_t t0) {
  int sent = 0;
  for (int64_t end = tu_now_ms() + 2 * WAIT_MS; sent < n && tu_now_ms() < end;) {
    hixl_kv_ids s = {0}, r = {0};
    if (ops->get_finished(p->worker, NULL, &s, &r) == HIXL_KV_SUCCESS)
      for (size_t i = 0; i < s.count; i++) sent += s.ids[i][0] == c;
    ops->free_ids(&s);
    ops->free_ids(&r);
    struct timespec ts = {0, 5000000}; /* a host's step, not a synchronization: the time is tested */
    nanosleep(&ts, NULL);
  }
  int64_t took = tu_now_ms() - t0;
  CU_ASSERT_EQUAL(sent, n);
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p->worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.pushes_done, 0);
  CU_ASSERT_EQUAL(sp.pushes_failed, (uint64_t)n);
  CU_ASSERT_EQUAL(sp.blocks_held, 0);
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  return took;
}

/* Four requests, each in a step of its own, pushed to a consumer that is gone (its port
 * refuses every connection) with a connect_timeout_ms of 1.5 s: the first step's Link
 * fails at 1.5 s, and the steps behind it fail at once (the consumer a Link failed to
 * lately is not dialled again within connect_timeout_ms), so every push has ended well
 * before 4 x 1.5 s (before: each step waited its own connect_timeout_ms on the pusher
 * thread, and every other consumer's pushes waited behind them; found by chaos.py, push
 * mode with decode killed, prefill's blocks held past its lease). Each ends failed,
 * the producer holds nothing. */
static void test_gone_consumer_costs_one_connect_timeout(void) {
  enum { NREQ = 4, CONNECT_MS = 1500 };
  struct inst p;
  bool up = inst_up_with(&p, "producer",
                         "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 2000, "
                         "\"connect_timeout_ms\": 1500, \"notify_timeout_ms\": 500",
                         0x11);
  CU_ASSERT_FATAL(up);
  uint16_t port = tu_free_port(); /* nobody listens there: connection refused */
  CU_ASSERT_FATAL(port != 0);
  int64_t t0 = tu_now_ms();
  for (int i = 0; i < NREQ; i++) { /* each its own step */
    char id[8], params[512];
    const uint64_t pb[NB] = {(uint64_t)(2 * i), (uint64_t)(2 * i + 1)};
    snprintf(id, sizeof(id), "G%d", i);
    snprintf(params, sizeof(params),
             "{\"do_remote_decode\": true, \"remote_engine\": \"127.0.0.1:%u\", \"remote_request_id\": "
             "\"%s\", \"remote_block_ids\": [1, 2], \"tp_size\": 1, \"cap\": "
             "\"00112233445566778899aabbccddeeff\"}",
             (unsigned)port, id);
    produce(&p, id, params, pb);
    step(&p);
    for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  }
  int64_t took = wait_pushes_failed(&p, 'G', NREQ, t0);
  CU_ASSERT_TRUE(took < 3 * CONNECT_MS); /* one connect_timeout_ms and some; before: NREQ of them */
  if (took >= 3 * CONNECT_MS)
    fprintf(stderr, "test_kv_pusher: the pushes to a gone consumer took %lld ms\n", (long long)took);
  inst_down(&p);
}

/* Two gone consumers whose Links failed apart: A's in a step of its own, then four
 * steps of a push to each. The second step dials B (A is in its window); while it waits
 * connect_timeout_ms, A's window ends, so before, the third step dialled A while B was
 * in its window, the fourth B, and so on: the two alternated and every step waited
 * connect_timeout_ms (found by chaos.py seed 40355, ASan: push, decode TP 4, a rank
 * killed, the other three ranks' links lost earlier than the dead one's Link failed;
 * prefill pushed 1 s a step and still held blocks when it was shut down). A step whose
 * dial failed gives the consumers it left out its window too: two connect_timeout_ms
 * in all, the three steps behind fail at once. Each ends failed, the producer holds
 * nothing. */
static void test_gone_consumers_out_of_phase(void) {
  enum { NSTEP = 4, CONNECT_MS = 1000 };
  struct inst p;
  bool up = inst_up_with(&p, "producer",
                         "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 2000, "
                         "\"connect_timeout_ms\": 1000, \"notify_timeout_ms\": 500",
                         0x11);
  CU_ASSERT_FATAL(up);
  uint16_t port[2] = {tu_free_port(), tu_free_port()}; /* nobody listens there: connection refused */
  CU_ASSERT_FATAL(port[0] != 0 && port[1] != 0 && port[0] != port[1]);
  int64_t t0 = tu_now_ms();
  int n = 0;
  for (int st = 0; st <= NSTEP; st++) { /* step 0: A alone; then A and B */
    for (int k = 0; k < (st ? 2 : 1); k++, n++) {
      char id[16], params[512];
      const uint64_t pb[NB] = {(uint64_t)(2 * n), (uint64_t)(2 * n + 1)};
      snprintf(id, sizeof(id), "O%d", n);
      snprintf(params, sizeof(params),
               "{\"do_remote_decode\": true, \"remote_engine\": \"127.0.0.1:%u\", \"remote_request_id\": "
               "\"%s\", \"remote_block_ids\": [1, 2], \"tp_size\": 1, \"cap\": "
               "\"00112233445566778899aabbccddeeff\"}",
               (unsigned)port[k], id);
      produce(&p, id, params, pb);
    }
    step(&p);
    for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  }
  CU_ASSERT_FATAL(2 * n <= BLOCKS);
  int64_t took = wait_pushes_failed(&p, 'O', n, t0);
  CU_ASSERT_TRUE(took < 3 * CONNECT_MS + CONNECT_MS / 2); /* 2 x CONNECT_MS and some; before: NSTEP + 1 */
  if (took >= 3 * CONNECT_MS + CONNECT_MS / 2)
    fprintf(stderr, "test_kv_pusher: the pushes to two gone consumers took %lld ms\n", (long long)took);
  inst_down(&p);
}

/* One step of four requests, each to a consumer of its own that never answers (a hung
 * peer), transfer_timeout_ms 1 s and notify_timeout_ms 2 s: the four ACCEPTs time out
 * together, and the four ABORTs that follow (each waits notify_timeout_ms) are told
 * together too, one thread a consumer, so every push has ended well before the 1 s + 4 x
 * 2 s of telling them one after another (before: the pusher told each in turn; with a
 * dead instance of four ranks its blocks were held 4 x notify_timeout_ms, found by
 * chaos.py). Each ends failed, the producer holds nothing. */
static void test_aborts_told_together(void) {
  enum { NREQ = 4, NOTIFY_MS = 2000 };
  struct inst p;
  struct hung_peer h[NREQ];
  bool up = inst_up_with(&p, "producer",
                         "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 1000, "
                         "\"connect_timeout_ms\": 3000, \"notify_timeout_ms\": 2000",
                         0x11);
  CU_ASSERT_FATAL(up);
  for (int i = 0; i < NREQ; i++) CU_ASSERT_FATAL(hung_peer_up(&h[i]));
  int64_t t0 = tu_now_ms();
  for (int i = 0; i < NREQ; i++) { /* one step */
    char id[8], params[512];
    const uint64_t pb[NB] = {(uint64_t)(2 * i), (uint64_t)(2 * i + 1)};
    snprintf(id, sizeof(id), "A%d", i);
    snprintf(params, sizeof(params),
             "{\"do_remote_decode\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"%s\", "
             "\"remote_block_ids\": [1, 2], \"tp_size\": 1, \"cap\": \"00112233445566778899aabbccddeeff\"}",
             h[i].addr, id);
    produce(&p, id, params, pb);
  }
  step(&p);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  int64_t took = wait_pushes_failed(&p, 'A', NREQ, t0);
  CU_ASSERT_TRUE(took < 6000); /* about 1 s + NOTIFY_MS; before: 1 s + 4 x NOTIFY_MS */
  if (took >= 6000)
    fprintf(stderr, "test_kv_pusher: four pushes to hung consumers took %lld ms (notify_timeout_ms %d)\n",
            (long long)took, NOTIFY_MS);
  inst_down(&p);
  for (int i = 0; i < NREQ; i++) hung_peer_down(&h[i]);
}

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_pusher: %s\n", err);
    return 1;
  }
  CU_TestInfo tests[] = {
      {"each allocation of the pusher fails in turn: the request ends, nothing held",
       test_pusher_allocation_fails},
      {"a consumer that never accepts delays no other consumer's push",
       test_hung_consumer_delays_no_other_push},
      {"shutdown while an ACCEPT is answered \"not yet\": no wait for transfer_timeout_ms",
       test_shutdown_stops_accept_not_yet},
      {"a consumer's EXPECT bind out of memory: the push still ends on both sides",
       test_expect_out_of_memory},
      {"a gone consumer costs one connect_timeout_ms, not one per step queued behind it",
       test_gone_consumer_costs_one_connect_timeout},
      {"a step's failed pushes to several consumers are told (ABORT) together", test_aborts_told_together},
      {"two gone consumers whose Links failed apart do not take a connect_timeout_ms a step in turn",
       test_gone_consumers_out_of_phase},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_pusher", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_pusher", suites);
}
