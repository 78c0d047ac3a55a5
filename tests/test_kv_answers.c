/* test_kv_answers: a peer that lies in its answers, white-box: the plugin linked as
 * hixl_kv_test, two instances in this process. The peer worker's KV service is wrapped:
 * kv_serve answers, then the wrapper changes the HELD answer one way per case (cut
 * short, a byte more, another state, fewer blocks, another digest, group counts that do
 * not add up, another layout, another tensor-parallel size, a cache of no or 2^64 - 1
 * blocks or too few for the ids, a plane at 0, a stride of 2^63, a plane moved onto
 * blocks not granted, a GONE whose reason runs past the answer):
 *  - a pull producer's PIN answers, to a consumer's loader (kv_pin_answer);
 *  - a push consumer's ACCEPT answers, to a producer's pusher (kv_accept_answer).
 * Each time: the request fails at once (well within the transfer timeout; received on
 * the consumer, its blocks in the load errors), no byte of the consumer's cache changes
 * (a moved plane: none of that plane), and neither side holds anything after. One more:
 * a peer that says it holds more blocks than asked (allowed: a group's leading blocks
 * cached) moves the request byte for byte. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_int.h"
#include "test_util.h"
#include "util/be.h"

enum { LAYERS = 2, BLOCKS = 8, NB = 2, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };
#define WAIT_MS     10000 /* a step's work ends well within this, or it never will */
#define TRANSFER_MS 5000

/* The plugin's one entry point, here linked in rather than found by dlsym. */
hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap);

static const hixl_kv_ops *ops;

#include "kv_inst.h"

static bool inst_up(struct inst *x, const char *role, const char *mode) {
  char keys[160];
  snprintf(
      keys, sizeof(keys),
      "\"mode\": \"%s\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000",
      mode);
  return inst_up_with(x, role, keys, 0xEE);
}

/* How the peer lies in its HELD answers (a producer's to PIN, a consumer's to ACCEPT). */
enum lie {
  LIE_NONE,
  LIE_CUT,       /* one byte short */
  LIE_EXTRA,     /* one byte more */
  LIE_STATE,     /* a state that does not exist */
  LIE_FEWER,     /* a block fewer (count and group) */
  LIE_DIGEST,    /* other blocks */
  LIE_SUM,       /* the group's count one more than the total */
  LIE_LAYOUT,    /* another layout text */
  LIE_TP,        /* another tensor-parallel size than its params said */
  LIE_NUM0,      /* a cache of no blocks */
  LIE_NUM_MAX,   /* a cache of 2^64 - 1 blocks */
  LIE_NUM_SMALL, /* a cache too small for the ids asked */
  LIE_BASE0,     /* a plane at address 0 */
  LIE_STRIDE,    /* a stride near 2^63 */
  LIE_SHIFT,     /* a plane moved 2 blocks on: blocks not granted */
  LIE_MORE,      /* a block more than asked (count and group): allowed */
  LIE_GONE_BAD,  /* GONE, its reason's length past the answer (last: the producer is not told) */
};

struct liar {
  hixl_kv_connector *real;
  uint8_t op; /* whose answers it changes: PIN or ACCEPT */
  _Atomic int lie;
  _Atomic int lied; /* answers changed */
};

/* The peer's KV service: kv_serve's answer, then the lie. Its HELD answer: state,
 * u16 + layout text, u32 n, u64 digest, u8 ngroups, u32 each, u32 nplanes, per group
 * u64 num_blocks then per plane u64 base, stride, head_stride. */
static HixlStatus liar_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                          size_t cap, size_t *resp_len) {
  struct liar *L = ctx;
  HixlStatus st = kv_serve(L->real, peer, req, len, resp, cap, resp_len);
  int lie = atomic_load(&L->lie);
  if (st != HIXL_SUCCESS || lie == LIE_NONE || len < 2 || req[1] != L->op || *resp_len < 3 ||
      resp[0] != KV_PIN_HELD)
    return st;
  size_t t = 3 + be_get16(resp + 1), n = t, digest = t + 4, ng = t + 12, gn = t + 13;
  if (*resp_len < gn + 4 + 4 + 8 + 24 || resp[ng] != 1) return st; /* one group: this test's layout */
  size_t num = gn + 4 + 4, base = num + 8, stride = base + 8;
  atomic_fetch_add(&L->lied, 1);
  switch (lie) {
  case LIE_CUT: (*resp_len)--; break;
  case LIE_EXTRA: resp[(*resp_len)++] = 0; break;
  case LIE_STATE: resp[0] = 9; break;
  case LIE_FEWER:
    be_put32(resp + n, be_get32(resp + n) - 1);
    be_put32(resp + gn, be_get32(resp + gn) - 1);
    break;
  case LIE_DIGEST: resp[digest] ^= 1; break;
  case LIE_SUM: be_put32(resp + gn, be_get32(resp + gn) + 1); break;
  case LIE_LAYOUT: resp[3] ^= 1; break;
  case LIE_TP: { /* " tp=1" -> " tp=2": the text's end */
    char *tp = memmem(resp + 3, t - 3, " tp=1", 5);
    if (tp) tp[4] = '2';
    break;
  }
  case LIE_NUM0: be_put64(resp + num, 0); break;
  case LIE_NUM_MAX: be_put64(resp + num, UINT64_MAX); break;
  case LIE_NUM_SMALL: be_put64(resp + num, 2); break; /* the ids are 3 and 4 */
  case LIE_BASE0: be_put64(resp + base, 0); break;
  case LIE_STRIDE: be_put64(resp + stride, UINT64_C(1) << 63); break;
  case LIE_SHIFT: be_put64(resp + base, be_get64(resp + base) + 2 * be_get64(resp + stride)); break;
  case LIE_GONE_BAD:
    resp[0] = KV_PIN_GONE;
    be_put16(resp + 1, 0xffff);
    *resp_len = 3;
    break;
  case LIE_MORE:
    be_put32(resp + n, be_get32(resp + n) + 1);
    be_put32(resp + gn, be_get32(resp + gn) + 1);
    break;
  }
  return st;
}

/* Step x until id showed in its worker's finished sending (which 0) or receiving (1);
 * false if it did not within WAIT_MS. */
static bool wait_finished(struct inst *x, const char *id, int which) {
  int64_t end = tu_now_ms() + WAIT_MS;
  for (;;) {
    hixl_kv_ids s = {0}, r = {0};
    if (ops->get_finished(x->worker, NULL, &s, &r) != HIXL_KV_SUCCESS) return false;
    const hixl_kv_ids *got = which ? &r : &s;
    bool seen = false;
    for (size_t i = 0; i < got->count; i++) seen |= strcmp(got->ids[i], id) == 0;
    ST_IS(ops->update_connector_output(x->sched, &s, &r, NULL), HIXL_KV_SUCCESS);
    ops->free_ids(&s);
    ops->free_ids(&r);
    if (seen) return true;
    if (tu_now_ms() >= end) return false;
    struct timespec ts = {0, 1000000}; /* polling the host's op, as a host does between steps */
    nanosleep(&ts, NULL);
  }
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), NB * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* The tp_size params text says (0: as it was written): a router that rewrote it. */
static int tp_said;

/* Params text with its tp_size set to tp_said (one digit, as this test's are). */
static void tp_edit(char *text) {
  char *t = strstr(text, "\"tp_size\":");
  if (!tp_said || !t) return;
  for (t += 10; *t == ' '; t++) {
  }
  CU_ASSERT_FATAL(*t >= '1' && *t <= '9' && !(t[1] >= '0' && t[1] <= '9'));
  *t = (char)('0' + tp_said);
}

/* The producer finishes id with its blocks pb (filled from seed) and holds them; the
 * consumer allocates db for it and queues its load (bound at the consumer's next step). */
static void hold_and_load(struct inst *p, struct inst *d, const char *id, const uint64_t pb[NB],
                          const uint64_t db[NB], uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++) tu_fill(block(p, l, v, pb[b]), BLOCK_BYTES, seed_of(seed, l, v, b));
  hixl_kv_request r = request(id, NULL);
  hixl_kv_buffer params = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p->sched, &r, pb, NB, &delay, &params), HIXL_KV_SUCCESS);
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  tp_edit(text);
  r = request(id, text);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT(tokens == NB * BLOCK_TOKENS && async == 1);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, db, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
  free(text);
}

static void test_lying_pin_answers(void) {
  struct inst p, d;
  bool up = inst_up(&p, "producer", "pull") && inst_up(&d, "consumer", "pull");
  CU_ASSERT_FATAL(up);
  struct liar L = {.real = p.worker, .op = KV_SVC_PIN};
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, liar_kv, &L));
  static const uint64_t pb[NB] = {3, 4}, db[NB] = {5, 6};
  uint64_t failed = 0;
  for (int lie = LIE_CUT; lie <= LIE_GONE_BAD; lie++) {
    char id[32];
    snprintf(id, sizeof(id), "lie-%d", lie);
    atomic_store(&L.lie, lie);
    int lied = atomic_load(&L.lied);
    memset(d.mem, 0xEE, LAYERS * 2 * BLOCKS * BLOCK_BYTES);
    hold_and_load(&p, &d, id, pb, db, 100 * (uint64_t)lie);
    step(&p); /* the producer's worker holds it */
    int64_t t0 = tu_now_ms();
    step(&d);
    bool ended = wait_finished(&d, id, 1);
    CU_ASSERT(ended);
    if (!ended) fprintf(stderr, "lie %d: the load did not end\n", lie);
    CU_ASSERT(tu_now_ms() - t0 < TRANSFER_MS); /* refused at once, not timed out */
    CU_ASSERT(atomic_load(&L.lied) > lied);
    hixl_kv_blocks errs = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
    bool ok = lie == LIE_MORE;
    CU_ASSERT_EQUAL(errs.count, ok ? 0 : NB);
    if (errs.count != (ok ? 0u : NB)) fprintf(stderr, "lie %d: %zu load errors\n", lie, errs.count);
    ops->free_buffer(&errs.raw);
    failed += !ok;
    for (int l = 0; l < LAYERS; l++)
      for (int v = 0; v < 2; v++)
        for (uint64_t b = 0; b < BLOCKS; b++) {
          int k = b == db[0] ? 0 : b == db[1] ? 1 : -1;
          if (ok && k >= 0) {
            TU_ASSERT_PATTERN(block(&d, l, v, b), BLOCK_BYTES, seed_of(100 * (uint64_t)lie, l, v, k),
                              "a block loaded");
          } else if ((ok || lie != LIE_SHIFT || k < 0 || (l == 0 && v == 0)) && /* SHIFT: others may land */
                     tu_check_byte(block(&d, l, v, b), BLOCK_BYTES, 0xEE) != -1) {
            CU_FAIL("a byte the load may not write changed");
            fprintf(stderr, "lie %d: layer %d %s block %" PRIu64 " changed\n", lie, l, v ? "V" : "K", b);
          }
        }
    if (lie != LIE_GONE_BAD) { /* told (FREE), the producer holds nothing; GONE: it is not told */
      CU_ASSERT(wait_finished(&p, id, 0));
      hixl_kv_stats sp;
      ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
      CU_ASSERT_EQUAL(sp.requests_held, 0);
      CU_ASSERT_EQUAL(sp.blocks_held, 0);
    }
  }
  hixl_kv_stats sd;
  ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sd.loads_failed, failed);
  CU_ASSERT_EQUAL(sd.loads_done, 1);
  atomic_store(&L.lie, LIE_NONE);
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, kv_serve, p.worker));
  inst_down(&d);
  inst_down(&p);
}

/* The consumer d expects id into its blocks db: its push params' text (free it). */
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

/* A push of id from p's blocks pb (filled from seed) into d's db (its cache set to
 * 0xEE first), its params' text into *text (free it): the request, both schedulers told,
 * neither stepped yet. */
static hixl_kv_request push_begin(struct inst *p, struct inst *d, const char *id, const uint64_t pb[NB],
                                  const uint64_t db[NB], uint64_t seed, char **text) {
  memset(d->mem, 0xEE, LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++) tu_fill(block(p, l, v, pb[b]), BLOCK_BYTES, seed_of(seed, l, v, b));
  *text = expect_push(d, id, db);
  CU_ASSERT_PTR_NOT_NULL_FATAL(*text);
  tp_edit(*text);
  hixl_kv_request r = request(id, *text);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(p->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(p->sched, &r, pb, NB, 0), HIXL_KV_SUCCESS);
  return r;
}

/* p's part of push r ends (wait_for_save, request_finished; text freed): whether p
 * reported it sent and d received, each within WAIT_MS (stepped meanwhile). */
static bool push_finish(struct inst *p, struct inst *d, hixl_kv_request *r, const char *id,
                        const uint64_t pb[NB], char *text) {
  ST_IS(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
  hixl_kv_buffer none = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p->sched, r, pb, NB, &delay, &none), HIXL_KV_SUCCESS);
  ops->free_buffer(&none);
  free(text);
  bool sent = inst_wait_stepped(p, id, 0, WAIT_MS), got = inst_wait_stepped(d, id, 1, WAIT_MS);
  if (!sent || !got) fprintf(stderr, "push %s: sent %d, received %d\n", id, sent, got);
  return sent && got;
}

static void test_lying_accept_answers(void) {
  struct inst p, d;
  bool up = inst_up(&p, "producer", "push") && inst_up(&d, "consumer", "push");
  CU_ASSERT_FATAL(up);
  struct liar L = {.real = d.worker, .op = KV_SVC_ACCEPT};
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, liar_kv, &L));
  static const uint64_t pb[NB] = {4, 5}, db[NB] = {1, 2};
  for (int lie = LIE_CUT; lie <= LIE_GONE_BAD; lie++) {
    char id[32];
    snprintf(id, sizeof(id), "push-lie-%d", lie);
    uint64_t seed = 100 * (uint64_t)lie;
    atomic_store(&L.lie, lie);
    int lied = atomic_load(&L.lied);
    char *text = NULL;
    hixl_kv_request r = push_begin(&p, &d, id, pb, db, seed, &text);
    int64_t t0 = tu_now_ms();
    step(&d);
    step(&p);
    for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
    CU_ASSERT(push_finish(&p, &d, &r, id, pb, text));
    CU_ASSERT(tu_now_ms() - t0 < TRANSFER_MS); /* refused at once, not timed out */
    CU_ASSERT(atomic_load(&L.lied) > lied);
    hixl_kv_blocks errs = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
    bool ok = lie == LIE_MORE;
    CU_ASSERT_EQUAL(errs.count, ok ? 0 : NB);
    if (errs.count != (ok ? 0u : NB)) fprintf(stderr, "push lie %d: %zu load errors\n", lie, errs.count);
    ops->free_buffer(&errs.raw);
    for (int l = 0; l < LAYERS; l++)
      for (int v = 0; v < 2; v++)
        for (uint64_t b = 0; b < BLOCKS; b++) {
          int k = b == db[0] ? 0 : b == db[1] ? 1 : -1;
          if (ok && k >= 0) {
            TU_ASSERT_PATTERN(block(&d, l, v, b), BLOCK_BYTES, seed_of(seed, l, v, k), "a block pushed");
          } else if ((ok || lie != LIE_SHIFT || k < 0 || (l == 0 && v == 0)) && /* SHIFT: others may land */
                     tu_check_byte(block(&d, l, v, b), BLOCK_BYTES, 0xEE) != -1) {
            CU_FAIL("a byte the push may not write changed");
            fprintf(stderr, "push lie %d: layer %d %s block %" PRIu64 " changed\n", lie, l, v ? "V" : "K", b);
          }
        }
    inst_assert_idle(&p, &d);
  }
  atomic_store(&L.lie, LIE_NONE);
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, kv_serve, d.worker));
  inst_down(&d);
  inst_down(&p);
}

/* A peer that runs another tensor-parallel size than the params said (a router that
 * rewrote tp_size, or params from another instance): the producer's PIN answer says 1
 * rank where the consumer's params said 2 (kv_pin_answer), the consumer's ACCEPT answer
 * the same to a producer told 2 (kv_accept_answer). Each fails at once naming both
 * sizes, no byte of the consumer's cache changes, and neither side holds anything. */
static void test_tp_size_said(void) {
  char line[1024];
  for (int push = 0; push < 2; push++) {
    struct inst p, d;
    const char *mode = push ? "push" : "pull";
    bool up = inst_up(&p, "producer", mode) && inst_up(&d, "consumer", mode);
    CU_ASSERT_FATAL(up);
    static const uint64_t pb[NB] = {4, 5}, db[NB] = {1, 2};
    const char *id = push ? "tp-said-push" : "tp-said-pull";
    tu_log_capture(HIXL_LOG_ERROR, false);
    tu_log_watch(push ? "its push params said tp_size 2" : "its kv_transfer_params said tp_size 2");
    tp_said = 2;
    if (push) {
      char *text = NULL;
      hixl_kv_request r = push_begin(&p, &d, id, pb, db, 7, &text);
      step(&d);
      step(&p);
      for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
      CU_ASSERT(push_finish(&p, &d, &r, id, pb, text));
    } else {
      memset(d.mem, 0xEE, LAYERS * 2 * BLOCKS * BLOCK_BYTES);
      hold_and_load(&p, &d, id, pb, db, 7);
      step(&p);
      step(&d);
      CU_ASSERT(wait_finished(&d, id, 1));
      CU_ASSERT(wait_finished(&p, id, 0)); /* told (FREE) */
    }
    tp_said = 0;
    CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "runs 1 ranks"));
    HixlSetLogCallback(NULL, NULL);
    HixlSetLogLevel(HIXL_LOG_ERROR);
    hixl_kv_blocks errs = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(errs.count, NB);
    ops->free_buffer(&errs.raw);
    CU_ASSERT_EQUAL(tu_check_byte(d.mem, LAYERS * 2 * BLOCKS * BLOCK_BYTES, 0xEE), -1);
    inst_assert_idle(&p, &d);
    inst_down(&d);
    inst_down(&p);
  }
}

/* ---- push over shm: the landed bytes (kv_word.c) ---- */

/* How the consumer answers ACCEPT_W, one way per case. */
enum bytes_case {
  BYTES_OK,      /* as kv_serve does */
  BYTES_OLD,     /* refused as malformed, as a consumer from before landed bytes does */
  BYTES_UNKNOWN, /* refused as an unknown operation (UNSUPPORTED), as kv_serve refuses one newer than it */
  BYTES_STALE,   /* as kv_serve, its row holding the mark before (an earlier push's late write) */
  BYTES_NO_MARK, /* an address with mark 0 */
  BYTES_PAST,    /* an address outside the consumer's memory */
  BYTES_REFUSED, /* refused (PARAM_INVALID), not as malformed: not asked again with ACCEPT */
};

struct counter {
  hixl_kv_connector *real;
  _Atomic int how;
  _Atomic int accept_w, accept, notices; /* calls served: ACCEPT_W, ACCEPT, LAYER or LAYERS */
};

/* The consumer's KV service, counting the calls it serves, answering ACCEPT_W as told.
 * An ACCEPT_W answer that is HELD ends with u64 the row's address and u8 the mark. */
static HixlStatus counting_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                              size_t cap, size_t *resp_len) {
  struct counter *K = ctx;
  uint8_t op = len >= 2 ? req[1] : 0;
  int how = atomic_load(&K->how);
  if (op == KV_SVC_ACCEPT_W)
    atomic_fetch_add(&K->accept_w, 1);
  else if (op == KV_SVC_ACCEPT)
    atomic_fetch_add(&K->accept, 1);
  else if (op == KV_SVC_LAYER || op == KV_SVC_LAYERS)
    atomic_fetch_add(&K->notices, 1);
  if (op == KV_SVC_ACCEPT_W && (how == BYTES_OLD || how == BYTES_REFUSED)) {
    int n = snprintf((char *)resp, cap,
                     how == BYTES_OLD ? "malformed KV service request from %s"
                                      : "refused: ACCEPT_W from %s: a made-up reason",
                     peer);
    *resp_len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    return HIXL_PARAM_INVALID;
  }
  if (op == KV_SVC_ACCEPT_W && how == BYTES_UNKNOWN &&
      len <= 1024) { /* served as an operation past its own */
    uint8_t newer[1024];
    memcpy(newer, req, len);
    newer[1] = KV_SVC_OP_LAST + 1;
    return kv_serve(K->real, peer, newer, len, resp, cap, resp_len);
  }
  HixlStatus st = kv_serve(K->real, peer, req, len, resp, cap, resp_len);
  if (op != KV_SVC_ACCEPT_W || st != HIXL_SUCCESS || *resp_len < 10 || resp[0] != KV_PIN_HELD) return st;
  uint8_t *tail = resp + *resp_len - 9;
  uint8_t *row = (uint8_t *)(uintptr_t)be_get64(tail), mark = tail[8];
  if (how == BYTES_NO_MARK) tail[8] = 0;
  if (how == BYTES_PAST) be_put64(tail, 4096); /* never mapped, never registered */
  if (how == BYTES_STALE && row && mark) memset(row, mark == 1 ? 255 : mark - 1, LAYERS);
  return st;
}

/* Until *v reaches want; false if it did not within WAIT_MS. */
static bool wait_count(_Atomic int *v, int want) {
  int64_t end = tu_now_ms() + WAIT_MS;
  while (atomic_load(v) < want) {
    if (tu_now_ms() >= end) return false;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  return true;
}

/* A push over shm (both engines hold a key: a link within one process is shm only
 * then) tells each layer by its landed byte: the forward pass holds layer 0 before any
 * notice came, and one LAYERS notice ends the push. A consumer from before landed
 * bytes, or one that answers ACCEPT_W as an unknown operation (UNSUPPORTED), gets
 * ACCEPT and a notice per layer. A byte left with the mark before in a
 * reused row is not taken for this push's. An answer with an address and no mark, or
 * an address outside the consumer's memory, fails the push at once, nothing held; so
 * does an ACCEPT_W refused for another reason than being unknown, not asked again. */
static void test_landed_bytes(void) {
  char keys[512];
  snprintf(keys, sizeof(keys),
           "\"mode\": \"push\", \"lease_ms\": 20000, \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": "
           "5000, \"AuthKeyFile\": \"%s\"",
           tu_key_file());
  struct inst p, d;
  bool up = inst_up_with(&p, "producer", keys, 0xEE) && inst_up_with(&d, "consumer", keys, 0xEE);
  CU_ASSERT_FATAL(up);
  struct counter K = {.real = d.worker};
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, counting_kv, &K));
  static const uint64_t pb[NB] = {4, 5}, db[NB] = {1, 2};
  uint64_t pushed = 0;
  /* Each case once; an older consumer's twice: the second push asks no ACCEPT_W (it
   * refused it), and once the link is made anew the next case's does (it may have been
   * upgraded meanwhile). */
  static const int cases[][2] = {{BYTES_OK, 0},      {BYTES_OLD, 0},     {BYTES_OLD, 1},
                                 {BYTES_UNKNOWN, 0}, {BYTES_UNKNOWN, 1}, {BYTES_STALE, 0},
                                 {BYTES_NO_MARK, 0}, {BYTES_PAST, 0},    {BYTES_REFUSED, 0}};
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
    int how = cases[ci][0], again = cases[ci][1];
    char id[32];
    snprintf(id, sizeof(id), "bytes-%d-%d", how, again);
    uint64_t seed = 300 + 10 * (uint64_t)how;
    bool ok = how <= BYTES_STALE, bytes = how == BYTES_OK || how == BYTES_STALE;
    bool old = how == BYTES_OLD || how == BYTES_UNKNOWN; /* ACCEPT then, and a notice per layer */
    atomic_store(&K.how, how);
    atomic_store(&K.accept_w, 0);
    atomic_store(&K.accept, 0);
    atomic_store(&K.notices, 0);
    char *text = NULL;
    hixl_kv_request r = push_begin(&p, &d, id, pb, db, seed, &text);
    int64_t t0 = tu_now_ms();
    step(&d);
    step(&p);
    CU_ASSERT(wait_count(old ? &K.accept : &K.accept_w, 1)); /* the pusher's, as the push starts */
    struct hixl_link_info li;
    memset(&li, 0, sizeof(li));
    TU_ASSERT_OK(hixl_engine_link_info(p.worker->eng, d.worker->engine_addr, &li));
    CU_ASSERT_STRING_EQUAL(li.transport, "shm");
    if (how == BYTES_STALE) { /* its row holds the mark before: not this push's */
      pthread_mutex_lock(&d.worker->lock);
      struct kv_expect *x = kv_expect_find(d.worker, id);
      CU_ASSERT(x && x->wranks == 1 && x->mark[0] != 0);
      if (x) CU_ASSERT(!kv_word_landed(d.worker, x, 0, 0) && !kv_word_landed(d.worker, x, 1, 0));
      pthread_mutex_unlock(&d.worker->lock);
    }
    ST_IS(ops->save_kv_layer(p.worker, 0), HIXL_KV_SUCCESS);
    if (ok) { /* the forward pass holds layer 0: told by its byte, before any notice */
      ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
      if (bytes) CU_ASSERT_EQUAL(atomic_load(&K.notices), 0);
      for (int v = 0; v < 2; v++)
        for (int k = 0; k < NB; k++) {
          TU_ASSERT_PATTERN(block(&d, 0, v, db[k]), BLOCK_BYTES, seed_of(seed, 0, v, k), "layer 0 pushed");
          CU_ASSERT_EQUAL(tu_check_byte(block(&d, 1, v, db[k]), BLOCK_BYTES, 0xEE), -1); /* not saved yet */
        }
    }
    ST_IS(ops->save_kv_layer(p.worker, 1), HIXL_KV_SUCCESS);
    if (ok) ST_IS(ops->wait_for_layer_load(d.worker, 1), HIXL_KV_SUCCESS);
    CU_ASSERT(push_finish(&p, &d, &r, id, pb, text));
    CU_ASSERT(tu_now_ms() - t0 < TRANSFER_MS); /* ended at once, not timed out */
    hixl_kv_blocks errs = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(errs.count, ok ? 0 : NB);
    if (errs.count != (ok ? 0u : NB)) fprintf(stderr, "bytes case %d: %zu load errors\n", how, errs.count);
    ops->free_buffer(&errs.raw);
    for (int l = 0; l < LAYERS; l++)
      for (int v = 0; v < 2; v++)
        for (uint64_t b = 0; b < BLOCKS; b++) {
          int k = b == db[0] ? 0 : b == db[1] ? 1 : -1;
          if (ok && k >= 0)
            TU_ASSERT_PATTERN(block(&d, l, v, b), BLOCK_BYTES, seed_of(seed, l, v, k), "a block pushed");
          else if ((k < 0 || how == BYTES_NO_MARK || how == BYTES_REFUSED) &&
                   tu_check_byte(block(&d, l, v, b), BLOCK_BYTES, 0xEE) != -1)
            CU_FAIL(
                "a byte the push may not write changed"); /* PAST: layer 0 may land before its byte fails */
        }
    /* The calls: landed bytes, ACCEPT_W and one LAYERS; an old consumer, ACCEPT and a
     * notice per layer (the second saved after the first landed); a bad answer or another
     * refusal, none (no ACCEPT after it). */
    CU_ASSERT_EQUAL(atomic_load(&K.accept_w), again ? 0 : 1);
    CU_ASSERT_EQUAL(atomic_load(&K.accept), old ? 1 : 0);
    CU_ASSERT_EQUAL(atomic_load(&K.notices), bytes ? 1 : old ? LAYERS : 0);
    hixl_kv_stats sp, sd;
    ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
    ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
    pushed += ok ? LAYERS : 0;
    CU_ASSERT_EQUAL(sp.layers_pushed, pushed); /* PAST: layer 0's data landed, not its byte: not counted */
    CU_ASSERT_EQUAL(sp.requests_held, 0);
    CU_ASSERT_EQUAL(sp.blocks_held, 0);
    CU_ASSERT_EQUAL(sd.requests_held, 0);
    CU_ASSERT_EQUAL(sd.blocks_held, 0);
    pthread_mutex_lock(&d.worker->lock);
    CU_ASSERT_EQUAL(d.worker->words.nfree, KV_WORD_ROWS); /* every row given back */
    pthread_mutex_unlock(&d.worker->lock);
    if (again) /* linked anew next: the consumer may be another build */
      TU_ASSERT_OK(HixlEngineDisconnect(p.worker->eng, d.worker->cfg.address, 1000));
  }
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(d.worker->eng, HIXL_SERVICE_KV, kv_serve, d.worker));
  inst_down(&d);
  inst_down(&p);
}

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_answers: %s\n", err);
    return 1;
  }
  CU_TestInfo tests[] = {
      {"a producer's lying PIN answers fail the load, nothing written, nothing held", test_lying_pin_answers},
      {"a consumer's lying ACCEPT answers fail the push, nothing written, nothing held",
       test_lying_accept_answers},
      {"a peer of another tensor-parallel size than tp_size said: pull and push fail, nothing written, "
       "nothing held",
       test_tp_size_said},
      {"push over shm: layers told by landed bytes, one notice; an old consumer, a stale mark, bad rows",
       test_landed_bytes},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_answers", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_answers", suites);
}
