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

#include "hixl/hixl_kv_connector.h"
#include "kv_int.h"
#include "test_util.h"

enum { LAYERS = 2, BLOCKS = 8, NB = 2, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };
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

/* Step x until id shows in its worker's finished sending (which 0) or receiving (1). */
static bool wait_finished(struct inst *x, const char *id, int which) {
  int64_t end = tu_now_ms() + WAIT_MS;
  do {
    hixl_kv_ids s = {0}, r = {0};
    bool seen = false;
    step(x);
    if (ops->get_finished(x->worker, NULL, &s, &r) != HIXL_KV_SUCCESS) return false;
    for (size_t i = 0; i < (which ? r.count : s.count); i++)
      seen |= strcmp((which ? r.ids : s.ids)[i], id) == 0;
    ops->free_ids(&s);
    ops->free_ids(&r);
    if (seen) return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  } while (tu_now_ms() < end);
  return false;
}

static uint8_t *block(struct inst *x, int layer, int v, uint64_t b) {
  return x->mem + ((size_t)layer * 2 + (size_t)v) * BLOCKS * BLOCK_BYTES + b * BLOCK_BYTES;
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), NB * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* One request pushed from p's blocks {4, 5} into d's {1, 2}: whether it ended on both
 * sides within WAIT_MS; *landed: the consumer's load succeeded. */
static bool push_one(struct inst *d, struct inst *p, const char *id, uint64_t seed, bool *landed) {
  static const uint64_t dblocks[NB] = {1, 2}, pblocks[NB] = {4, 5};
  hixl_kv_request r = request(id, "{\"do_remote_prefill\": true}");
  hixl_kv_buffer params = {0}, none = {0};
  int64_t tokens = 0;
  int32_t async = 0, delay = 0;
  *landed = false;
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++) {
        memset(block(d, l, v, dblocks[b]), 0xEE, BLOCK_BYTES);
        tu_fill(block(p, l, v, pblocks[b]), BLOCK_BYTES, seed + (uint64_t)(l * 4 + v * 2 + b));
      }
  /* The consumer allocates first and hands its blocks to the producer. */
  CU_ASSERT_EQUAL(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->update_state_after_alloc(d->sched, &r, dblocks, NB, (uint64_t)tokens),
                  HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(ops->get_push_params(d->sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  r = request(id, text);
  CU_ASSERT_EQUAL(ops->get_num_new_matched_tokens(p->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->update_state_after_alloc(p->sched, &r, pblocks, NB, 0), HIXL_KV_SUCCESS);
  step(d);
  step(p);
  for (uint32_t l = 0; l < LAYERS; l++) CU_ASSERT_EQUAL(ops->save_kv_layer(p->worker, l), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->request_finished(p->sched, &r, pblocks, NB, &delay, &none), HIXL_KV_SUCCESS);
  ops->free_buffer(&none);
  free(text);
  bool sent = wait_finished(p, id, 0), got = sent && wait_finished(d, id, 1);
  if (!sent || !got) return false;
  hixl_kv_blocks errs = {0};
  CU_ASSERT_EQUAL(ops->get_block_ids_with_load_errors(d->worker, &errs), HIXL_KV_SUCCESS);
  *landed = errs.count == 0;
  ops->free_buffer(&errs.raw);
  for (int l = 0; *landed && l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++)
        TU_ASSERT_PATTERN(block(d, l, v, dblocks[b]), BLOCK_BYTES, seed + (uint64_t)(l * 4 + v * 2 + b),
                          "a pushed block");
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

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_pusher: %s\n", err);
    return 1;
  }
  CU_TestInfo tests[] = {{"each allocation of the pusher fails in turn: the request ends, nothing held",
                          test_pusher_allocation_fails},
                         CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_pusher", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_pusher", suites);
}
