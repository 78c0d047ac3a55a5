/* test_kv_service: what a worker's KV service (plugin/src/kv_service.c) lets peers
 * grow, white-box: the plugin linked as hixl_kv_test, its kv_serve called as the
 * engine's progress thread calls it, with the peer names a test chooses (a peer's name
 * is what its HELLO claimed; any process that holds a request's capability can link
 * under as many names as it likes).
 *
 * A request's blocks are given (granted, and kept in its list of peers) to at most
 * KV_PEERS_MAX peers: a PIN (pull producer) or ACCEPT (push consumer) from one more
 * name is refused, naming the bound, and grants that peer nothing; once the request
 * ends every grant is revoked and the worker holds nothing.
 *
 * A worker holds (pull producer) and expects (push consumer) at most
 * max_inflight_requests requests: one more is refused, its blocks reported at once and
 * its peer's PIN or ACCEPT answering GONE with the bound's name. Calls among 10000
 * held or expected requests are answered as among 100, and the peers to cut (c->drop)
 * keep one entry a name among 10000. (The lookups are hashed; their cost is a
 * benchmark's to measure, not a timed test's.) */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_int.h"
#include "test_util.h"

enum { LAYERS = 2, BLOCKS = 8, NB = 2, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };

/* The plugin's one entry point, here linked in rather than found by dlsym. */
hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap);

static const hixl_kv_ops *ops;

#include "kv_inst.h"

static bool inst_up(struct inst *x, const char *role, const char *mode) {
  char keys[96];
  snprintf(keys, sizeof(keys), "\"mode\": \"%s\", \"lease_ms\": 20000", mode);
  return inst_up_with(x, role, keys, 0);
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), NB * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* The "cap" of kv_transfer_params (b, freed here) into cap. */
static bool params_cap(hixl_kv_buffer *b, struct kv_cap *cap) {
  char *text = strndup((char *)b->data, b->len);
  ops->free_buffer(b);
  const char *h = text ? strstr(text, "\"cap\":\"") : NULL;
  bool ok = h && kv_cap_parse_hex(h + 7, 2 * KV_CAP_LEN, cap);
  free(text);
  return ok;
}

/* kv_serve of op on id from peer, presenting cap (ABORT: with a reason); its status,
 * its answer's first byte in *state (or its text in why). */
static HixlStatus serve(struct inst *x, const char *peer, uint8_t op, const char *id,
                        const struct kv_cap *cap, uint8_t *state, char *why, size_t why_cap) {
  struct kv_out o = {0};
  uint8_t resp[4096];
  size_t n = 0;
  CU_ASSERT_FATAL(kv_msg(x->worker, &o, op, id, cap, 0, "a test"));
  HixlStatus st = kv_serve(x->worker, peer, o.p, o.len, resp, sizeof(resp), &n);
  free(o.p);
  *state = n ? resp[0] : 0;
  if (why) snprintf(why, why_cap, "%.*s", (int)n, (const char *)resp);
  return st;
}

/* Whether the answer of op on id from peer (presenting cap) is state GONE and holds
 * the text want (a GONE answer's reason). */
static bool gone_saying(struct inst *x, const char *peer, uint8_t op, const char *id,
                        const struct kv_cap *cap, const char *want) {
  struct kv_out o = {0};
  uint8_t resp[4096];
  size_t n = 0;
  CU_ASSERT_FATAL(kv_msg(x->worker, &o, op, id, cap, 0, "a test"));
  HixlStatus st = kv_serve(x->worker, peer, o.p, o.len, resp, sizeof(resp), &n);
  free(o.p);
  bool ok = st == HIXL_SUCCESS && n > 0 && resp[0] == KV_PIN_GONE && memmem(resp, n, want, strlen(want));
  if (!ok)
    tu_fail(__FILE__, __LINE__, "%s of %s: status %d, state %u, answer \"%.*s\", not GONE with \"%s\"",
            op == KV_SVC_PIN ? "PIN" : "ACCEPT", id, st, n ? resp[0] : 0, (int)(n > 1 ? n - 1 : 0),
            (const char *)resp + 1, want);
  return ok;
}

static size_t granted(struct inst *x, const char *peer) {
  size_t n = 99999;
  TU_ASSERT_OK(hixl_engine_grant_stats(x->worker->eng, peer, &n, NULL));
  return n;
}

/* KV_PEERS_MAX peers are given the request's blocks (op: PIN or ACCEPT), one more is
 * refused and granted nothing, and one of those given them may call again. */
static void fill_peers(struct inst *x, uint8_t op, const char *id, const struct kv_cap *cap) {
  char peer[32], why[512];
  uint8_t state;
  for (unsigned i = 0; i < KV_PEERS_MAX; i++) {
    snprintf(peer, sizeof(peer), "127.0.0.1:%u", 20000 + i);
    TU_ASSERT_OK(serve(x, peer, op, id, cap, &state, NULL, 0));
    CU_ASSERT_EQUAL(state, KV_PIN_HELD);
    CU_ASSERT(granted(x, peer) > 0);
  }
  uint64_t refused0 = x->worker->peers_refused;
  snprintf(peer, sizeof(peer), "127.0.0.1:%u", 20000 + KV_PEERS_MAX);
  TU_ASSERT_STATUS(serve(x, peer, op, id, cap, &state, why, sizeof(why)), HIXL_PARAM_INVALID);
  if (!strstr(why, "64 peers already (KV_PEERS_MAX"))
    tu_fail(__FILE__, __LINE__, "the refusal does not name the bound: %s", why);
  CU_ASSERT_EQUAL(granted(x, peer), 0);
  CU_ASSERT_EQUAL(x->worker->peers_refused, refused0 + 1);
  TU_ASSERT_OK(serve(x, "127.0.0.1:20000", op, id, cap, &state, NULL, 0)); /* a renewal: still one of them */
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
}

static void all_revoked(struct inst *x) {
  char peer[32];
  for (unsigned i = 0; i <= KV_PEERS_MAX; i++) {
    snprintf(peer, sizeof(peer), "127.0.0.1:%u", 20000 + i);
    CU_ASSERT_EQUAL(granted(x, peer), 0);
  }
}

/* Pull producer: a held request PINned under KV_PEERS_MAX + 1 names. */
static void test_pin_peers_bounded(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  static const uint64_t blocks[NB] = {3, 4};
  const char *id = "peers-pin";
  hixl_kv_request r = request(id, NULL);
  hixl_kv_buffer params = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &params), HIXL_KV_SUCCESS);
  struct kv_cap cap;
  CU_ASSERT_FATAL(params_cap(&params, &cap));
  step(&p); /* the worker holds it */
  fill_peers(&p, KV_SVC_PIN, id, &cap);
  uint8_t state;
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, id, &cap, &state, NULL, 0)); /* rank 0 of 1: freed */
  all_revoked(&p);
  hixl_kv_stats st;
  ST_IS(ops->get_stats(p.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.requests_held, 0);
  CU_ASSERT_EQUAL(st.blocks_held, 0);
  inst_down(&p);
}

/* Push consumer: an expected push ACCEPTed under KV_PEERS_MAX + 1 names. */
static void test_accept_peers_bounded(void) {
  struct inst d;
  CU_ASSERT_FATAL(inst_up(&d, "consumer", "push"));
  static const uint64_t blocks[NB] = {5, 6};
  const char *id = "peers-accept";
  hixl_kv_request r = request(id, "{\"do_remote_prefill\": true}");
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, blocks, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
  struct kv_cap cap;
  CU_ASSERT_FATAL(params_cap(&params, &cap));
  step(&d); /* the worker expects it */
  fill_peers(&d, KV_SVC_ACCEPT, id, &cap);
  /* It ends, failed, with the producer's reason: control bytes in it (a forged log line,
   * terminal escapes) reach the log and the trace escaped, as \xNN (before: raw). */
  struct kv_out o = {0};
  uint8_t resp[64];
  size_t n = 0;
  CU_ASSERT_FATAL(kv_msg(d.worker, &o, KV_SVC_ABORT, id, &cap, 0, "oops\n[hixl E 1.0 1] forged\x1b[2J"));
  TU_ASSERT_OK(kv_serve(d.worker, "127.0.0.1:20000", o.p, o.len, resp, sizeof(resp), &n));
  free(o.p);
  all_revoked(&d);
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT(rv.count == 1 && strcmp(rv.ids[0], id) == 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  /* its trace, once the host took it */
  hixl_kv_buffer tr = {0};
  ST_IS(ops->drain_traces(d.worker, &tr), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL(memmem(tr.data, tr.len, "oops\\\\x0a[hixl E 1.0 1] forged\\\\x1b[2J", 38));
  CU_ASSERT_PTR_NULL(memmem(tr.data, tr.len, "oops\\n", 6));
  ops->free_buffer(&tr);
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT(errs.count == NB && errs.ids[0] == blocks[0] && errs.ids[1] == blocks[1]);
  ops->free_buffer(&errs.raw);
  inst_down(&d);
}

/* ---- the lists a worker keeps per request: bounded, and not searched linearly ---- */

/* sched (a pull producer's) holds n requests prefix-0 .. prefix-(n-1): their capabilities
 * into caps (when not NULL). */
static void hold_n(hixl_kv_connector *sched, const char *prefix, unsigned n, struct kv_cap *caps) {
  static const uint64_t blocks[NB] = {3, 4};
  char id[32];
  for (unsigned i = 0; i < n; i++) {
    snprintf(id, sizeof(id), "%s-%u", prefix, i);
    hixl_kv_request r = request(id, NULL);
    hixl_kv_buffer params = {0};
    int32_t delay = 0;
    ST_IS(ops->request_finished(sched, &r, blocks, NB, &delay, &params), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(delay, 1);
    struct kv_cap cap;
    CU_ASSERT(params_cap(&params, caps ? &caps[i] : &cap));
  }
}

/* sched's metadata bound to x's worker. */
static void bind_from(struct inst *x, hixl_kv_connector *sched) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(x->worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
}

static uint64_t held_now(struct inst *x) {
  hixl_kv_stats st = {0};
  ST_IS(ops->get_stats(x->worker, &st), HIXL_KV_SUCCESS);
  return st.requests_held;
}

/* Whether x's worker reports id alone as finished sending now (get_finished). */
static bool sending_only(struct inst *x, const char *id) {
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(x->worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  bool one = s.count == 1 && strcmp(s.ids[0], id) == 0;
  ops->free_ids(&s);
  ops->free_ids(&rv);
  return one;
}

/* A pull producer's scheduler made anew (one restarted), with more keys ("" or ", ..."). */
static hixl_kv_connector *sched_restarted(const char *more) {
  char cfg[320], err[256] = "";
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"role\": \"producer\", \"mode\": \"pull\"%s}",
           tu_ip(), (unsigned)tu_free_port(), more);
  hixl_kv_connector *s = NULL;
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  return s;
}

/* Whether ids (get_finished's) are exactly prefix-first .. prefix-(first + n - 1). */
static bool ids_are(const hixl_kv_ids *ids, const char *prefix, unsigned first, unsigned n) {
  char id[32];
  if (ids->count != n) return false;
  for (unsigned i = 0; i < n; i++) {
    snprintf(id, sizeof(id), "%s-%u", prefix, first + i);
    bool hit = false;
    for (size_t k = 0; k < ids->count && !hit; k++) hit = strcmp(ids->ids[k], id) == 0;
    if (!hit) return false;
  }
  return true;
}

#define HELD_CAP 4
enum { FEW = 100, MANY = 10000, CALLS = 500 }; /* entries, and calls made among them */

/* Pull producer: a worker holds at most max_inflight_requests requests. Its scheduler
 * holds no more than that, but a restarted scheduler (another epoch) hands over its
 * own while the old one's are still held: one more is refused, not held. Its blocks
 * are reported finished-sending at once (the host frees them), and its consumer's PIN
 * answers GONE naming the bound and the key that raises it; the first refusal is
 * logged. Before, the worker held every one until its lease. */
static void test_held_bounded(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up_with(&p, "producer",
                               "\"mode\": \"pull\", \"lease_ms\": 20000, \"max_inflight_requests\": 4", 0));
  struct kv_cap acap[HELD_CAP], bcap[HELD_CAP];
  hold_n(p.sched, "a", HELD_CAP, acap);
  step(&p);
  CU_ASSERT_EQUAL(held_now(&p), HELD_CAP);
  /* The scheduler restarted: a new one, its holds bound to the same worker. */
  char more[96];
  snprintf(more, sizeof(more), ", \"lease_ms\": 20000, \"max_inflight_requests\": %u", HELD_CAP);
  hixl_kv_connector *s2 = sched_restarted(more);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s2);
  hold_n(s2, "b", HELD_CAP, bcap);
  tu_log_watch("max_inflight_requests");
  bind_from(&p, s2);
  char line[512] = "";
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "b-0"));
  CU_ASSERT_EQUAL(held_now(&p), HELD_CAP);
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(p.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_are(&s, "b", 0, HELD_CAP)); /* the host frees their blocks now */
  ST_IS(ops->update_connector_output(s2, &s, NULL, NULL), HIXL_KV_SUCCESS); /* as the host hands them back */
  ops->free_ids(&s);
  ops->free_ids(&rv);
  gone_saying(&p, "127.0.0.1:20000", KV_SVC_PIN, "b-0", &bcap[0], "max_inflight_requests (4)");
  CU_ASSERT_EQUAL(granted(&p, "127.0.0.1:20000"), 0);
  /* The old scheduler's holds are freed by their consumers: room for the new one's. */
  uint8_t state;
  for (unsigned i = 0; i < HELD_CAP; i++) {
    char id[32];
    snprintf(id, sizeof(id), "a-%u", i);
    TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, id, &acap[i], &state, NULL, 0));
  }
  CU_ASSERT_EQUAL(held_now(&p), 0);
  ST_IS(ops->get_finished(p.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_are(&s, "a", 0, HELD_CAP));
  ops->free_ids(&s);
  ops->free_ids(&rv);
  hold_n(s2, "c", HELD_CAP, NULL);
  bind_from(&p, s2);
  CU_ASSERT_EQUAL(held_now(&p), HELD_CAP);
  ST_IS(ops->get_finished(p.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(s.count, 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  ops->destroy(s2);
  inst_down(&p);
}

/* Pull producer: a request id used again after its request ended. The capability binds
 * the id, not one run of it, so the earlier consumer's params would act on the later
 * request: the scheduler refuses request_finished of an id whose finished_sending came
 * back lately (PARAM_INVALID, logged), and a worker refuses a hold of an id that ended
 * there lately (a restarted scheduler that did not know it): not held, reported
 * finished-sending at once, its consumer's PIN answering GONE saying why. A FREE that
 * came before its hold (an abort) is still no reuse: not held, silently. Before, the
 * scheduler answered delay_free 1 and params, and the worker held nothing and said
 * nothing: the consumer heard GONE "it was freed, its lease expired, or it was aborted". */
static void test_held_id_reused(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  static const uint64_t blocks[NB] = {3, 4};
  const char *id = "reused";
  hixl_kv_request r = request(id, NULL);
  hixl_kv_buffer params = {0};
  int32_t delay = 0;
  struct kv_cap cap;
  uint8_t state;
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_FATAL(params_cap(&params, &cap));
  step(&p);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, id, &cap, &state, NULL, 0)); /* loaded and freed */
  CU_ASSERT_TRUE(sending_only(&p, id));
  hixl_kv_ids done = {(const char *[]){id}, 1};
  ST_IS(ops->update_connector_output(p.sched, &done, NULL, NULL), HIXL_KV_SUCCESS);
  /* The same id again, on the scheduler that held it: refused and logged. */
  tu_log_watch("must be unique per run");
  delay = 7;
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &params), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "unique per run"));
  CU_ASSERT_EQUAL(delay, 7); /* outputs untouched */
  char line[512] = "";
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, id));
  /* ... on a restarted scheduler, which does not know it: its worker refuses the hold. */
  hixl_kv_connector *s2 = sched_restarted("");
  CU_ASSERT_PTR_NOT_NULL_FATAL(s2);
  ST_IS(ops->request_finished(s2, &r, blocks, NB, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  CU_ASSERT_FATAL(params_cap(&params, &cap));
  tu_log_watch("must be");
  bind_from(&p, s2);
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, id));
  CU_ASSERT_EQUAL(held_now(&p), 0);
  CU_ASSERT_TRUE(sending_only(&p, id)); /* the host frees its blocks */
  gone_saying(&p, "127.0.0.1:20000", KV_SVC_PIN, id, &cap, "request ids must be unique per run");
  CU_ASSERT_EQUAL(granted(&p, "127.0.0.1:20000"), 0);
  /* An abort's FREE before the hold: not held, and no reuse. */
  const char *early = "freed-early";
  hixl_kv_request r2 = request(early, NULL);
  ST_IS(ops->request_finished(s2, &r2, blocks, NB, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_FATAL(params_cap(&params, &cap));
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, early, &cap, &state, NULL, 0));
  bind_from(&p, s2);
  CU_ASSERT_EQUAL(held_now(&p), 0);
  CU_ASSERT_TRUE(sending_only(&p, early));
  gone_saying(&p, "127.0.0.1:20000", KV_SVC_PIN, early, &cap, "freed it before it was held");
  ops->destroy(s2);
  inst_down(&p);
}

/* Pull producer: a hold of an id the worker holds already (a restarted scheduler that
 * did not know it, or two schedulers on one worker) is not held again, and the first
 * is said (a warning naming the request and the hold); the second's consumer is
 * refused (a wrong capability) and served nothing, the first's keeps its request, and
 * the host hears the id finished once, when the first ends. Before, the second hold
 * was dropped with no word anywhere. */
static void test_held_again_said(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  const char *id = "held-twice-0"; /* hold_n's first of "held-twice" */
  struct kv_cap cap1, cap2;
  uint8_t state;
  hold_n(p.sched, "held-twice", 1, &cap1);
  step(&p);
  CU_ASSERT_EQUAL(held_now(&p), 1);
  for (int n = 0; n < 2; n++) { /* two more schedulers: the first said, the second not */
    hixl_kv_connector *s2 = sched_restarted("");
    CU_ASSERT_PTR_NOT_NULL_FATAL(s2);
    hold_n(s2, "held-twice", 1, &cap2);
    char line[512] = "";
    tu_log_watch("held here already");
    bind_from(&p, s2);
    CU_ASSERT_EQUAL(tu_log_seen(line, sizeof(line)), n == 0);
    if (n == 0) CU_ASSERT_PTR_NOT_NULL(strstr(line, id));
    CU_ASSERT_EQUAL(held_now(&p), 1);
    hixl_kv_ids s = {0}, rv = {0};
    ST_IS(ops->get_finished(p.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(s.count, 0); /* nothing reported free while the first is held */
    ops->free_ids(&s);
    ops->free_ids(&rv);
    ops->destroy(s2);
  }
  char why[256] = "";
  CU_ASSERT_EQUAL(serve(&p, "127.0.0.1:20001", KV_SVC_PIN, id, &cap2, &state, why, sizeof(why)),
                  HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "wrong capability"));
  CU_ASSERT_EQUAL(granted(&p, "127.0.0.1:20001"), 0);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_PIN, id, &cap1, &state, NULL, 0));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, id, &cap1, &state, NULL, 0));
  CU_ASSERT_EQUAL(held_now(&p), 0);
  CU_ASSERT_TRUE(sending_only(&p, id)); /* once */
  CU_ASSERT_FALSE(sending_only(&p, id));
  inst_down(&p);
}

/* Push producer: request_finished of a request whose push is under way answers
 * delay_free 1 once; a second one, before its finished_sending came back, is refused
 * (PARAM_INVALID), as pull mode refuses one of a request still held. Before: SUCCESS
 * with delay_free 0, and the host freed blocks the pusher was still sending from. Once
 * its finished_sending came back, delay_free 0. */
static void test_push_finished_twice(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "push"));
  static const uint64_t blocks[NB] = {3, 4};
  const char *id = "pushed-twice";
  char params[256];
  snprintf(params, sizeof(params),
           "{\"do_remote_decode\": true, \"remote_engine\": \"%s:%u\", \"remote_request_id\": \"%s\", "
           "\"remote_block_ids\": [5, 6]}",
           tu_ip(), (unsigned)tu_free_port(), id);
  hixl_kv_request r = request(id, params);
  ST_IS(ops->update_state_after_alloc(p.sched, &r, blocks, NB, 0), HIXL_KV_SUCCESS);
  hixl_kv_buffer out = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  delay = 7;
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &out), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_EQUAL(delay, 7);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), id));
  const char *ids[] = {id};
  hixl_kv_ids sent = {ids, 1};
  ST_IS(ops->update_connector_output(p.sched, &sent, NULL, NULL), HIXL_KV_SUCCESS);
  ST_IS(ops->request_finished(p.sched, &r, blocks, NB, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 0);
  inst_down(&p);
}

/* RENEW (a consumer's request not scheduled yet): a held request's lease runs again and
 * nothing is granted, no consumer recorded; a wrong capability is refused; a request
 * gone answers GONE, one not bound yet NOT_YET, as a PIN would. */
static void test_renew_served(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  struct kv_cap cap, other;
  uint8_t state;
  hold_n(p.sched, "renew", 1, &cap);
  step(&p);
  pthread_mutex_lock(&p.worker->lock);
  struct kv_held *h = kv_held_find(p.worker, "renew-0");
  uint64_t before = h ? h->expires_ns : 0;
  pthread_mutex_unlock(&p.worker->lock);
  CU_ASSERT_FATAL(before != 0);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_RENEW, "renew-0", &cap, &state, NULL, 0));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  pthread_mutex_lock(&p.worker->lock);
  CU_ASSERT(h->expires_ns > before); /* the lease runs again */
  CU_ASSERT_EQUAL(p.worker->hold.renewed, 1);
  pthread_mutex_unlock(&p.worker->lock);
  CU_ASSERT_EQUAL(granted(&p, "127.0.0.1:20000"), 0); /* nothing granted */
  kv_cap_make(p.worker->cap_key, "someone-else", &other);
  CU_ASSERT_EQUAL(serve(&p, "127.0.0.1:20000", KV_SVC_RENEW, "renew-0", &other, &state, NULL, 0),
                  HIXL_PARAM_INVALID);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_FREE, "renew-0", &cap, &state, NULL, 0));
  CU_ASSERT(gone_saying(&p, "127.0.0.1:20000", KV_SVC_RENEW, "renew-0", &cap, "freed"));
  kv_cap_make(p.worker->cap_key, "not-yet", &other);
  TU_ASSERT_OK(serve(&p, "127.0.0.1:20000", KV_SVC_RENEW, "not-yet", &other, &state, NULL, 0));
  CU_ASSERT_EQUAL(state, KV_PIN_NOT_YET);
  CU_ASSERT_EQUAL(held_now(&p), 0);
  inst_down(&p);
}

/* An operation past the ones a worker knows (a newer peer's), with its own fields after
 * the id or none, is answered UNSUPPORTED saying so, not PARAM_INVALID "malformed": the
 * status a newer caller falls back on (as the pusher does from ACCEPT_W to ACCEPT),
 * whatever the text. Protocol 4's malformed calls still say malformed. Before, one with
 * fields of its own was called malformed. */
static void test_unknown_op_unsupported(void) {
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  struct kv_cap cap;
  kv_cap_make(p.worker->cap_key, "newer", &cap);
  for (int extra = 0; extra < 3; extra++) {
    struct kv_out o = {0};
    CU_ASSERT_FATAL(kv_msg(p.worker, &o, KV_SVC_PIN, "newer", &cap, 0, "a test"));
    for (int k = 0; k < extra; k++) kv_put_u64(&o, 0x0102030405060708ull); /* its own fields */
    CU_ASSERT_FATAL(!o.bad);
    for (int op = 0; op < 2; op++) {
      o.p[1] = op ? KV_SVC_OP_LAST + 1 : 0;
      uint8_t resp[512];
      size_t n = 0;
      ST_IS(kv_serve(p.worker, "127.0.0.1:20000", o.p, o.len, resp, sizeof(resp), &n), HIXL_UNSUPPORTED);
      CU_ASSERT_PTR_NOT_NULL(memmem(resp, n, "not known to this worker", 24));
    }
    o.p[1] = KV_SVC_PIN;
    o.p[0] = 4; /* protocol 4: malformed, as before */
    uint8_t resp[512];
    size_t n = 0;
    ST_IS(kv_serve(p.worker, "127.0.0.1:20000", o.p, o.len, resp, sizeof(resp), &n), HIXL_PARAM_INVALID);
    CU_ASSERT_PTR_NOT_NULL(memmem(resp, n, "malformed", 9));
    free(o.p);
  }
  CU_ASSERT_EQUAL(held_now(&p), 0);
  inst_down(&p);
}

/* k calls of op on id (one neither held nor expected: a lookup that misses) from a
 * peer, presenting cap; each must be answered SUCCESS. */
static void calls_ok(struct inst *x, uint8_t op, const char *id, const struct kv_cap *cap, unsigned k) {
  struct kv_out o = {0};
  CU_ASSERT_FATAL(kv_msg(x->worker, &o, op, id, cap, 0, "a test"));
  unsigned bad = 0;
  for (unsigned i = 0; i < k; i++) {
    uint8_t resp[512];
    size_t n = 0;
    bad += kv_serve(x->worker, "127.0.0.1:20000", o.p, o.len, resp, sizeof(resp), &n) != HIXL_SUCCESS;
  }
  free(o.p);
  CU_ASSERT_EQUAL(bad, 0);
}

/* Pull producer: with FEW, then MANY requests held, PINs of one not held (the lookup
 * misses) are answered, and every request stays held. */
static void test_held_lookups_flat(void) {
  struct inst p;
  char keys[128];
  snprintf(keys, sizeof(keys), "\"mode\": \"pull\", \"lease_ms\": 600000, \"max_inflight_requests\": %u",
           MANY);
  CU_ASSERT_FATAL(inst_up_with(&p, "producer", keys, 0));
  hold_n(p.sched, "f", FEW, NULL);
  step(&p);
  struct kv_cap cap;
  kv_cap_make(p.worker->cap_key, "not-held", &cap); /* the scheduler's capability of an id it never held */
  calls_ok(&p, KV_SVC_PIN, "not-held", &cap, CALLS);
  CU_ASSERT_EQUAL(held_now(&p), FEW);
  hold_n(p.sched, "m", MANY - FEW, NULL);
  step(&p);
  CU_ASSERT_EQUAL(held_now(&p), MANY);
  calls_ok(&p, KV_SVC_PIN, "not-held", &cap, CALLS);
  CU_ASSERT_EQUAL(held_now(&p), MANY);
  inst_down(&p);
}

/* sched (a push consumer's) allocates blocks for n requests prefix-0 .. prefix-(n-1)
 * that a producer pushes: their capabilities into caps (when not NULL). */
static void expect_n(hixl_kv_connector *sched, const char *prefix, unsigned n, struct kv_cap *caps) {
  static const uint64_t blocks[NB] = {5, 6};
  char id[32];
  for (unsigned i = 0; i < n; i++) {
    snprintf(id, sizeof(id), "%s-%u", prefix, i);
    hixl_kv_request r = request(id, "{\"do_remote_prefill\": true}");
    int64_t tokens = 0;
    int32_t async = 0;
    ST_IS(ops->get_num_new_matched_tokens(sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
    ST_IS(ops->update_state_after_alloc(sched, &r, blocks, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
    hixl_kv_buffer params = {0};
    ST_IS(ops->get_push_params(sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
    struct kv_cap cap;
    CU_ASSERT(params_cap(&params, caps ? &caps[i] : &cap));
  }
}

/* Push consumer: a worker expects at most max_inflight_requests pushes; one more is
 * refused: its load fails at once (reported received, its blocks with the load
 * errors), its producer's ACCEPT answers GONE naming the bound and the key that raises
 * it, the first refusal is logged. Before, the worker expected every one. */
static void test_expects_bounded(void) {
  struct inst d;
  CU_ASSERT_FATAL(inst_up_with(&d, "consumer",
                               "\"mode\": \"push\", \"lease_ms\": 20000, \"max_inflight_requests\": 4", 0));
  struct kv_cap cap[HELD_CAP + 1];
  expect_n(d.sched, "e", HELD_CAP + 1, cap);
  tu_log_watch("max_inflight_requests");
  step(&d);
  char line[512] = "";
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "e-4"));
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_are(&rv, "e", HELD_CAP, 1));
  ops->free_ids(&s);
  ops->free_ids(&rv);
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT(errs.count == NB && errs.ids[0] == 5 && errs.ids[1] == 6);
  ops->free_buffer(&errs.raw);
  gone_saying(&d, "127.0.0.1:20000", KV_SVC_ACCEPT, "e-4", &cap[HELD_CAP], "max_inflight_requests (4)");
  CU_ASSERT_EQUAL(granted(&d, "127.0.0.1:20000"), 0);
  uint8_t state;
  TU_ASSERT_OK(serve(&d, "127.0.0.1:20000", KV_SVC_ACCEPT, "e-0", &cap[0], &state, NULL, 0));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD); /* those within the bound are expected */
  inst_down(&d);
}

/* Whether x's worker reports id alone as finished receiving now (get_finished), its
 * blocks (expect_n's) alone with the load errors. */
static bool failed_only(struct inst *x, const char *id) {
  hixl_kv_ids s = {0}, rv = {0};
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_finished(x->worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  ST_IS(ops->get_block_ids_with_load_errors(x->worker, &errs), HIXL_KV_SUCCESS);
  bool one = s.count == 0 && rv.count == 1 && strcmp(rv.ids[0], id) == 0 && errs.count == NB &&
             errs.ids[0] == 5 && errs.ids[1] == 6;
  ops->free_ids(&s);
  ops->free_ids(&rv);
  ops->free_buffer(&errs.raw);
  return one;
}

/* Push consumer: an id expected again after its push ended there (the capability binds
 * the id, so the earlier push's producer could act on the later one) is not expected,
 * as a pull producer does not hold one: its load fails at once (reported received, its
 * blocks with the load errors), the first such refusal is logged, and its producer's
 * ACCEPT answers GONE saying why, granting nothing. One that handle_preemptions ended is
 * the same request allocated again: expected anew. Before, every one was expected anew:
 * its ACCEPT answered HELD with the blocks. */
static void test_expect_id_reused(void) {
  struct inst d;
  CU_ASSERT_FATAL(inst_up(&d, "consumer", "push"));
  const char *peer = "127.0.0.1:20000";
  struct kv_cap cap;
  uint8_t state;
  expect_n(d.sched, "reused", 1, &cap);
  step(&d);
  TU_ASSERT_OK(serve(&d, peer, KV_SVC_ABORT, "reused-0", &cap, &state, NULL, 0)); /* it ended, failed */
  CU_ASSERT_TRUE(failed_only(&d, "reused-0"));
  expect_n(d.sched, "reused", 1, &cap);
  tu_log_watch("must be unique per run");
  step(&d);
  char line[512] = "";
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "reused-0"));
  CU_ASSERT_TRUE(failed_only(&d, "reused-0"));
  gone_saying(&d, peer, KV_SVC_ACCEPT, "reused-0", &cap, "request ids must be unique per run");
  CU_ASSERT_EQUAL(granted(&d, peer), 0);
  /* Preempted, then allocated again: the same request, expected anew. */
  expect_n(d.sched, "preempted", 1, &cap);
  step(&d);
  const char *ids[] = {"preempted-0"};
  hixl_kv_ids pre = {ids, 1};
  ST_IS(ops->handle_preemptions(d.worker, &pre), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(failed_only(&d, "preempted-0"));
  expect_n(d.sched, "preempted", 1, &cap);
  step(&d);
  TU_ASSERT_OK(serve(&d, peer, KV_SVC_ACCEPT, "preempted-0", &cap, &state, NULL, 0));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  CU_ASSERT(granted(&d, peer) > 0);
  inst_down(&d);
}

/* ACCEPT_W of id from peer, presenting cap: HELD, its row's address and mark (the answer's
 * last 9 bytes) into *row, *mark. */
static void accept_w(struct inst *x, const char *peer, const char *id, const struct kv_cap *cap,
                     uint64_t *row, uint8_t *mark) {
  struct kv_out o = {0};
  uint8_t resp[4096];
  size_t n = 0;
  CU_ASSERT_FATAL(kv_msg(x->worker, &o, KV_SVC_ACCEPT_W, id, cap, 0, ""));
  TU_ASSERT_OK(kv_serve(x->worker, peer, o.p, o.len, resp, sizeof(resp), &n));
  free(o.p);
  CU_ASSERT_FATAL(n > 9 && resp[0] == KV_PIN_HELD);
  *row = 0;
  for (int i = 0; i < 8; i++) *row = *row << 8 | resp[n - 9 + i];
  *mark = resp[n - 1];
}

/* Push consumer, the landed bytes (kv_word.c): an expected push that fails gives its row
 * back while its producer may still write there (it is cut at the next get_finished).
 * The free rows are a queue: the next 1,023 ACCEPT_Ws take every other row first, and
 * only the 1,024th takes it again. Its mark then differs, so the late byte, the earlier
 * push's mark, is not the later push's landed layer. Before: a stack (the very next
 * ACCEPT_W took the row back, a row's mark came round after 255 takes of it, not 255 x
 * 1,024) and, before that, one mark per push for the connector, 1 to 255 round (the
 * later push had the earlier one's mark, its layer 0 held before anything was written). */
static void test_row_reused_marked(void) {
  struct inst d;
  CU_ASSERT_FATAL(inst_up_with(
      &d, "consumer", "\"mode\": \"push\", \"lease_ms\": 20000, \"max_inflight_requests\": 2048", 0));
  enum { N = KV_WORD_ROWS }; /* w-0, its row back, 1,023 more, then w-1024 */
  const char *peer = "127.0.0.1:20000";
  struct kv_cap *cap = calloc(N + 1, sizeof(*cap));
  CU_ASSERT_PTR_NOT_NULL_FATAL(cap);
  expect_n(d.sched, "w", N + 1, cap);
  step(&d);
  uint64_t row0 = 0, row = 0;
  uint8_t mark0 = 0, mark = 0, state;
  accept_w(&d, peer, "w-0", &cap[0], &row0, &mark0);
  TU_ASSERT_OK(serve(&d, peer, KV_SVC_ABORT, "w-0", &cap[0], &state, NULL, 0)); /* w-0 failed */
  unsigned again = 0;
  for (unsigned i = 1; i < N; i++) { /* every other row is taken before w-0's */
    char id[32];
    snprintf(id, sizeof(id), "w-%u", i);
    accept_w(&d, peer, id, &cap[i], &row, &mark);
    again += row == row0;
  }
  CU_ASSERT_EQUAL(again, 0);
  char last[32];
  snprintf(last, sizeof(last), "w-%u", (unsigned)N);
  accept_w(&d, peer, last, &cap[N], &row, &mark);
  CU_ASSERT_FATAL(row == row0 && row != 0); /* the row w-0 gave back */
  CU_ASSERT(mark != 0 && mark != mark0);
  memset((uint8_t *)(uintptr_t)row, mark0, LAYERS); /* w-0's producer, not cut yet, lands its bytes */
  pthread_mutex_lock(&d.worker->lock);
  struct kv_expect *x = kv_expect_find(d.worker, last);
  CU_ASSERT_PTR_NOT_NULL(x);
  if (x) CU_ASSERT(!kv_word_landed(d.worker, x, 0, 0) && !kv_word_landed(d.worker, x, 1, 0));
  pthread_mutex_unlock(&d.worker->lock);
  memset((uint8_t *)(uintptr_t)row, mark, 1); /* its own producer's byte of layer 0 */
  pthread_mutex_lock(&d.worker->lock);
  if (x) CU_ASSERT(kv_word_landed(d.worker, x, 0, 0) && !kv_word_landed(d.worker, x, 1, 0));
  pthread_mutex_unlock(&d.worker->lock);
  free(cap);
  inst_down(&d);
}

/* A scheduler handed kv_transfer_params meant for it (a pull consumer's do_remote_prefill,
 * a push producer's do_remote_decode, true) that do not parse: the request moves no KV
 * (0 tokens; nothing pushed), and the first such refusal is said, naming the request and
 * why; a second is not, nor are params meant for the other side. Before, nothing was said:
 * an operator saw prompts computed again with no reason anywhere. */
static void test_params_refused_said(void) {
  static const char *const roles[2] = {"consumer", "producer"}, *const flags[2] = {"do_remote_prefill",
                                                                                   "do_remote_decode"};
  static const uint64_t blocks[NB] = {1, 2};
  for (int k = 0; k < 2; k++) {
    struct inst x;
    CU_ASSERT_FATAL(inst_up_with(&x, roles[k], k ? "\"mode\": \"push\"" : "\"mode\": \"pull\"", 0));
    char bad[160], other[96], line[512] = "", id[2][16];
    snprintf(bad, sizeof(bad), "{\"%s\": true, \"remote_engine\": 7}", flags[k]);
    snprintf(other, sizeof(other), "{\"%s\": true}", flags[1 - k]);
    for (int n = 0; n < 3; n++) { /* the first refused, a second refused, one for the other side */
      snprintf(id[0], sizeof(id[0]), "bad-%d", n);
      hixl_kv_request r = request(id[0], n < 2 ? bad : other);
      int64_t tokens = -1;
      int32_t async = -1;
      tu_log_watch(id[0]);
      if (k == 0) {
        ST_IS(ops->get_num_new_matched_tokens(x.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
        CU_ASSERT_EQUAL(tokens, 0);
      } else { /* the producer's allocation reads them (push), then its request_finished frees the blocks */
        ST_IS(ops->update_state_after_alloc(x.sched, &r, blocks, NB, 0), HIXL_KV_SUCCESS);
      }
      bool said = tu_log_seen(line, sizeof(line));
      CU_ASSERT_EQUAL(said, n == 0);
      if (n == 0) CU_ASSERT_PTR_NOT_NULL(strstr(line, "remote_engine is missing or not a string"));
    }
    inst_down(&x);
  }
}

/* Push consumer: with FEW, then MANY pushes expected (bound at an earlier step), ACCEPTs
 * of one not expected and the forward pass's wait_for_layer_load are answered. */
static void test_expects_lookups_flat(void) {
  struct inst d;
  char keys[128];
  snprintf(keys, sizeof(keys), "\"mode\": \"push\", \"lease_ms\": 600000, \"max_inflight_requests\": %u",
           MANY);
  CU_ASSERT_FATAL(inst_up_with(&d, "consumer", keys, 0));
  for (int k = 0; k < 2; k++) {
    expect_n(d.sched, k ? "m" : "f", k ? MANY - FEW : FEW, NULL);
    step(&d);
    step(&d); /* a step that binds none: the wait waits for none of them */
    struct kv_cap cap;
    kv_cap_make(d.worker->cap_key, "not-expected", &cap);
    calls_ok(&d, KV_SVC_ACCEPT, "not-expected", &cap, CALLS);
    for (unsigned i = 0; i < CALLS; i++) ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
  }
  inst_down(&d);
}

/* Each of prefix-first .. prefix-(first + n - 1) (peer names) into c->drop, 64 at a
 * time as the peers of a request whose lease ran out. */
static void drop_names(hixl_kv_connector *c, const char *prefix, unsigned first, unsigned n) {
  for (unsigned i = 0; i < n; i += KV_PEERS_MAX) {
    struct kv_peers s = {0};
    char name[48];
    for (unsigned k = i; k < i + KV_PEERS_MAX && k < n; k++) {
      snprintf(name, sizeof(name), "%s-%u:7000", prefix, first + k);
      CU_ASSERT_PTR_NOT_NULL(kv_peers_add(&s, name));
    }
    kv_peers_drop(c, &s);
    kv_peers_free(&s);
  }
}

/* The peers to cut before reporting (c->drop): one entry per name however many
 * requests name it, among FEW and among MANY. */
static void test_drop_flat(void) {
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  drop_names(c, "few", 0, FEW);
  drop_names(c, "few", 0, FEW); /* the same peers again: nothing new */
  CU_ASSERT_EQUAL(c->drop.n, FEW);
  drop_names(c, "many", 0, MANY);
  drop_names(c, "many", MANY / 2, MANY / 2); /* half of them again */
  CU_ASSERT_EQUAL(c->drop.n, FEW + MANY);
  kv_idhash_clear(&c->drop, NULL);
  CU_ASSERT_EQUAL(c->drop.n, 0);
  free(c);
}

/* kv_serve of op on id from peer as rank rank of world ranks (LAYERS: every layer),
 * presenting cap: its status, its answer's first byte in *state. */
static HixlStatus serve_rank_why(struct inst *x, const char *peer, uint8_t op, const char *id,
                                 const struct kv_cap *cap, uint32_t world, uint32_t rank, uint8_t *state,
                                 char *why, size_t why_cap) {
  struct kv_out o = {0};
  uint8_t resp[4096];
  size_t n = 0;
  kv_put_u8(&o, KV_SVC_PROTO);
  kv_put_u8(&o, op);
  kv_put_str(&o, id, strlen(id));
  kv_put_cap(&o, cap);
  kv_put_u32(&o, world);
  kv_put_u32(&o, rank);
  if (op == KV_SVC_LAYERS) {
    kv_put_u32(&o, 0);
    kv_put_u32(&o, LAYERS);
  }
  CU_ASSERT_FATAL(!o.bad);
  HixlStatus st = kv_serve(x->worker, peer, o.p, o.len, resp, sizeof(resp), &n);
  free(o.p);
  *state = n ? resp[0] : 0;
  if (why) snprintf(why, why_cap, "%.*s", (int)n, (const char *)resp);
  return st;
}

static HixlStatus serve_rank(struct inst *x, const char *peer, uint8_t op, const char *id,
                             const struct kv_cap *cap, uint32_t world, uint32_t rank, uint8_t *state) {
  return serve_rank_why(x, peer, op, id, cap, world, rank, state, NULL, 0);
}

static bool to_cut(struct inst *x, const char *peer) {
  pthread_mutex_lock(&x->worker->lock);
  bool cut = kv_idhash_has(&x->worker->drop, peer);
  pthread_mutex_unlock(&x->worker->lock);
  return cut;
}

/* Pull producer, a consumer instance of two ranks that both read the request (its need,
 * set as held_rank sets it for a layout whose heads each rank reads: this instance's
 * layout has no heads): rank 0 PINs and FREEs it, rank 1 PINs and never comes again.
 * Rank 0's grant is revoked at its FREE; when the lease runs out, only rank 1's links are
 * to be cut. Before, rank 0 kept its grant until the request ended and its links were
 * cut with rank 1's, failing its loads of other requests. */
static void test_lease_cuts_only_unfreed_rank(void) {
  static const char *r0 = "127.0.0.1:21000", *r1 = "127.0.0.1:21001";
  struct inst p;
  CU_ASSERT_FATAL(inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 300", 0));
  struct kv_cap cap;
  hold_n(p.sched, "tp", 1, &cap);
  step(&p);
  CU_ASSERT_EQUAL_FATAL(held_now(&p), 1);
  uint8_t state = 0;
  TU_ASSERT_OK(serve_rank(&p, r0, KV_SVC_PIN, "tp-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  pthread_mutex_lock(&p.worker->lock);
  struct kv_held *h = kv_held_find(p.worker, "tp-0");
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  h->need = 3; /* both consumer ranks free it */
  pthread_mutex_unlock(&p.worker->lock);
  TU_ASSERT_OK(serve_rank(&p, r1, KV_SVC_PIN, "tp-0", &cap, 2, 1, &state));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  CU_ASSERT(granted(&p, r0) > 0 && granted(&p, r1) > 0);
  TU_ASSERT_OK(serve_rank(&p, r0, KV_SVC_FREE, "tp-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(held_now(&p), 1); /* rank 1 has not freed it */
  CU_ASSERT_EQUAL(granted(&p, r0), 0);
  CU_ASSERT(granted(&p, r1) > 0);
  struct timespec ts = {0, 400000000}; /* past the lease: its expiry is tested, not waited for */
  nanosleep(&ts, NULL);
  TU_ASSERT_OK(serve_rank(&p, r1, KV_SVC_PIN, "tp-0", &cap, 2, 1, &state)); /* leases looked at */
  CU_ASSERT_EQUAL(state, KV_PIN_GONE);
  CU_ASSERT_EQUAL(held_now(&p), 0);
  CU_ASSERT_TRUE(to_cut(&p, r1));
  CU_ASSERT_FALSE(to_cut(&p, r0));
  CU_ASSERT_EQUAL(granted(&p, r1), 0);
  inst_down(&p);
}

/* Push consumer, a producer instance of two ranks that both write the request (its want,
 * set as serve_accept sets it for a layout whose heads each rank writes): both ACCEPT,
 * rank 0's every layer lands, rank 1 writes nothing. Rank 0's grant is revoked once its
 * last layer landed; when the expected push runs out, only rank 1's links are to be
 * cut. Before, rank 0's were too, failing its pushes of other requests. */
static void test_expiry_cuts_only_unfinished_rank(void) {
  static const char *p0 = "127.0.0.1:22000", *p1 = "127.0.0.1:22001";
  struct inst d;
  CU_ASSERT_FATAL(inst_up_with(&d, "consumer", "\"mode\": \"push\", \"lease_ms\": 300", 0));
  struct kv_cap cap;
  expect_n(d.sched, "px", 1, &cap);
  step(&d);
  uint8_t state = 0;
  TU_ASSERT_OK(serve_rank(&d, p0, KV_SVC_ACCEPT, "px-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  pthread_mutex_lock(&d.worker->lock);
  struct kv_expect *x = kv_expect_find(d.worker, "px-0");
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  x->want = 3; /* both producer ranks write it */
  pthread_mutex_unlock(&d.worker->lock);
  TU_ASSERT_OK(serve_rank(&d, p1, KV_SVC_ACCEPT, "px-0", &cap, 2, 1, &state));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  CU_ASSERT(granted(&d, p0) > 0 && granted(&d, p1) > 0);
  TU_ASSERT_OK(serve_rank(&d, p0, KV_SVC_LAYERS, "px-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(granted(&d, p0), 0);
  CU_ASSERT(granted(&d, p1) > 0);
  struct timespec ts = {0, 400000000}; /* past the lease: its expiry is tested, not waited for */
  nanosleep(&ts, NULL);
  serve_rank(&d, p1, KV_SVC_ACCEPT, "px-0", &cap, 2, 1, &state); /* expects looked at */
  CU_ASSERT_NOT_EQUAL(state, KV_PIN_HELD);
  CU_ASSERT_TRUE(to_cut(&d, p1));
  CU_ASSERT_FALSE(to_cut(&d, p0));
  CU_ASSERT_EQUAL(granted(&d, p1), 0);
  inst_down(&d);
}

/* Push consumer, producer ranks that have no part in an expected push: one of another
 * world size than the first ACCEPT's, one that writes nothing into this rank (its want),
 * and LAYERS from either. Each is refused PARAM_INVALID naming why, is granted nothing,
 * and marks no layer landed; the rank that has a part is served throughout. */
static void test_accept_ranks_refused(void) {
  static const char *p0 = "127.0.0.1:23000", *p1 = "127.0.0.1:23001", *p3 = "127.0.0.1:23003";
  struct inst d;
  char why[512];
  CU_ASSERT_FATAL(inst_up(&d, "consumer", "push"));
  struct kv_cap cap;
  expect_n(d.sched, "ar", 1, &cap);
  step(&d);
  uint8_t state = 0;
  TU_ASSERT_OK(serve_rank(&d, p0, KV_SVC_ACCEPT, "ar-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(state, KV_PIN_HELD);
  pthread_mutex_lock(&d.worker->lock);
  struct kv_expect *x = kv_expect_find(d.worker, "ar-0");
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  x->want = 1; /* only producer rank 0 writes into this rank (a layout whose heads it cuts) */
  pthread_mutex_unlock(&d.worker->lock);
  const struct {
    const char *peer;
    uint8_t op;
    uint32_t world, rank;
    const char *why;
  } cases[] = {
      {p3, KV_SVC_ACCEPT, 3, 0, "another producer rank of it runs another world size"},
      {p3, KV_SVC_ACCEPT_W, 3, 2, "another producer rank of it runs another world size"},
      {p1, KV_SVC_ACCEPT, 2, 1, "that producer rank writes nothing into this rank"},
      {p1, KV_SVC_LAYERS, 2, 1, "that producer rank did not accept it here"},
      {p3, KV_SVC_LAYERS, 3, 0, "that producer rank did not accept it here"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    TU_ASSERT_STATUS(serve_rank_why(&d, cases[i].peer, cases[i].op, "ar-0", &cap, cases[i].world,
                                    cases[i].rank, &state, why, sizeof(why)),
                     HIXL_PARAM_INVALID);
    if (!strstr(why, cases[i].why) || !strstr(why, "refused: ") || !strstr(why, cases[i].peer))
      tu_fail(__FILE__, __LINE__, "case %zu: the refusal \"%s\" does not say \"%s\"", i, why, cases[i].why);
    CU_ASSERT_EQUAL(granted(&d, cases[i].peer), 0);
  }
  pthread_mutex_lock(&d.worker->lock);
  x = kv_expect_find(d.worker, "ar-0");
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  uint32_t landed = x->nlanded;
  uint64_t any = 0;
  for (uint32_t l = 0; l < LAYERS; l++) any |= x->landed[l];
  CU_ASSERT_EQUAL(x->ptp, 2);
  pthread_mutex_unlock(&d.worker->lock);
  CU_ASSERT_EQUAL(landed, 0);
  CU_ASSERT_EQUAL(any, 0);
  CU_ASSERT(granted(&d, p0) > 0); /* the rank with a part: still served */
  TU_ASSERT_OK(serve_rank(&d, p0, KV_SVC_LAYERS, "ar-0", &cap, 2, 0, &state));
  CU_ASSERT_EQUAL(granted(&d, p0), 0); /* every layer of it landed: its grant revoked */
  inst_down(&d);
}

/* Pull producer: PIN, RENEW and RELEASE of an id no longer held nor remembered as
 * ended (freed long ago: past KV_GONE_MAX ids ended since), naming its hold number,
 * which this worker bound: GONE, saying it was never held or freed long ago (no later
 * step brings it), nothing granted; naming a number not bound yet: "not yet". */
static void test_never_held_gone(void) {
  static const char *peer = "127.0.0.1:24000";
  struct inst p;
  CU_ASSERT_FATAL(inst_up(&p, "producer", "pull"));
  struct kv_cap cap[2];
  uint8_t state = 0;
  hold_n(p.sched, "nh", 2, cap);
  step(&p);
  CU_ASSERT_EQUAL_FATAL(held_now(&p), 2);
  TU_ASSERT_OK(serve(&p, peer, KV_SVC_FREE, "nh-1", &cap[1], &state, NULL, 0)); /* rank 0 of 1: freed */
  CU_ASSERT_EQUAL_FATAL(held_now(&p), 1);
  pthread_mutex_lock(&p.worker->lock);
  void *why_was = NULL;
  CU_ASSERT_TRUE(kv_idhash_del(&p.worker->gone, "nh-1", &why_was)); /* a constant: nothing to free */
  uint64_t epoch = p.worker->hold.epoch, bound = p.worker->hold.bound_seq;
  pthread_mutex_unlock(&p.worker->lock);
  CU_ASSERT_FATAL(bound == 2); /* nh-1's number */
  const uint8_t ops_[] = {KV_SVC_PIN, KV_SVC_RENEW, KV_SVC_RELEASE};
  for (size_t i = 0; i < sizeof(ops_); i++)
    for (int later = 0; later < 2; later++) {
      struct kv_out o = {0};
      uint8_t resp[1024];
      size_t n = 0;
      CU_ASSERT_FATAL(kv_msg(p.worker, &o, ops_[i], "nh-1", &cap[1], 0, ""));
      kv_put_u64(&o, epoch);
      kv_put_u64(&o, later ? bound + 1 : bound);
      TU_ASSERT_OK(kv_serve(p.worker, peer, o.p, o.len, resp, sizeof(resp), &n));
      free(o.p);
      CU_ASSERT_FATAL(n > 0);
      if (later) {
        CU_ASSERT_EQUAL(resp[0], KV_PIN_NOT_YET);
      } else {
        CU_ASSERT_EQUAL(resp[0], KV_PIN_GONE);
        const char *want =
            ops_[i] == KV_SVC_RELEASE ? "no longer held here" : "never held here (this worker bound";
        if (!memmem(resp, n, want, strlen(want)))
          tu_fail(__FILE__, __LINE__, "op %u: GONE \"%.*s\" does not say \"%s\"", ops_[i], (int)n - 1,
                  (const char *)resp + 1, want);
      }
      CU_ASSERT_EQUAL(granted(&p, peer), 0);
    }
  CU_ASSERT_EQUAL(held_now(&p), 1); /* nh-0: untouched */
  inst_down(&p);
}

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_service: %s\n", err);
    return 1;
  }
  tu_log_capture(HIXL_LOG_WARN, true); /* the refusals' lines the tests look for */
  CU_TestInfo tests[] = {
      {"PIN: a held request's blocks go to at most KV_PEERS_MAX peers, all revoked at FREE",
       test_pin_peers_bounded},
      {"ACCEPT: an expected push's blocks go to at most KV_PEERS_MAX peers, all revoked at ABORT",
       test_accept_peers_bounded},
      {"a worker holds at most max_inflight_requests requests; one more is refused, GONE naming it",
       test_held_bounded},
      {"a request id held again after it ended: refused by the scheduler, and by a worker that knows it",
       test_held_id_reused},
      {"a hold of an id held already: not held again, the first said, the id finished once",
       test_held_again_said},
      {"push: a second request_finished while the push is under way is refused", test_push_finished_twice},
      {"RENEW: a held request's lease runs again, nothing granted", test_renew_served},
      {"an operation past the ones known: UNSUPPORTED, not malformed", test_unknown_op_unsupported},
      {"PIN answered among 100 or 10000 held requests", test_held_lookups_flat},
      {"a worker expects at most max_inflight_requests pushes; one more fails, GONE naming it",
       test_expects_bounded},
      {"push: a request id expected again after it ended is refused; one preempted is expected anew",
       test_expect_id_reused},
      {"push over shm: a row given back is taken again after every other, told apart by its mark",
       test_row_reused_marked},
      {"kv_transfer_params meant for a scheduler that do not parse: the first refusal said",
       test_params_refused_said},
      {"ACCEPT and wait_for_layer_load answered among 100 or 10000 expected pushes",
       test_expects_lookups_flat},
      {"the peers to cut: one entry a name among 100 or 10000", test_drop_flat},
      {"a lease that runs out cuts the consumer ranks that did not free it, not one that did",
       test_lease_cuts_only_unfreed_rank},
      {"an expected push that runs out cuts the producer ranks that did not finish, not one that did",
       test_expiry_cuts_only_unfinished_rank},
      {"push: ACCEPT and LAYERS from producer ranks with no part in it: refused, naming why, nothing granted",
       test_accept_ranks_refused},
      {"pull: PIN, RENEW, RELEASE of a hold bound here, ended and forgotten: GONE, saying so",
       test_never_held_gone},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_service", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_service", suites);
}
