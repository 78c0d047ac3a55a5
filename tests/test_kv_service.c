/* test_kv_service: what a worker's KV service (plugin/src/kv_service.c) lets peers
 * grow, white-box: the plugin linked as hixl_kv_test, its kv_serve called as the
 * engine's progress thread calls it, with the peer names a test chooses (a peer's name
 * is what its HELLO claimed; any process that holds a request's capability can link
 * under as many names as it likes).
 *
 * A request's blocks are given (granted, and kept in its list of peers) to at most
 * KV_PEERS_MAX peers: a PIN (pull producer) or ACCEPT (push consumer) from one more
 * name is refused, naming the bound, and grants that peer nothing; once the request
 * ends every grant is revoked and the worker holds nothing. */
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
  uint8_t state;
  TU_ASSERT_OK(serve(&d, "127.0.0.1:20000", KV_SVC_ABORT, id, &cap, &state, NULL, 0)); /* it ends, failed */
  all_revoked(&d);
  hixl_kv_ids s = {0}, rv = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &s, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT(rv.count == 1 && strcmp(rv.ids[0], id) == 0);
  ops->free_ids(&s);
  ops->free_ids(&rv);
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT(errs.count == NB && errs.ids[0] == blocks[0] && errs.ids[1] == blocks[1]);
  ops->free_buffer(&errs.raw);
  inst_down(&d);
}

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_service: %s\n", err);
    return 1;
  }
  CU_TestInfo tests[] = {
      {"PIN: a held request's blocks go to at most KV_PEERS_MAX peers, all revoked at FREE",
       test_pin_peers_bounded},
      {"ACCEPT: an expected push's blocks go to at most KV_PEERS_MAX peers, all revoked at ABORT",
       test_accept_peers_bounded},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_service", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_service", suites);
}
