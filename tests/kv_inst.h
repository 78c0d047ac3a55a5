/* kv_inst: a white-box plugin test's instance: a scheduler and a worker connector of
 * hixl_kv_test (linked in), and the worker's KV cache, LAYERS x (K, V) of BLOCKS blocks
 * of BLOCK_BYTES, kv_first. Include after defining LAYERS, BLOCKS, BLOCK_TOKENS, ELEM
 * and BLOCK_BYTES and declaring `static const hixl_kv_ops *ops`. */
#ifndef HIXL_TEST_KV_INST_H
#define HIXL_TEST_KV_INST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hixl/hixl_kv_connector.h"
#include "test_util.h"

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      tu_fail(__FILE__, __LINE__, "%s: got %u, want %u (%s)", #expr, st_, (unsigned)(want),                  \
              ops->last_error());                                                                            \
  } while (0)

struct inst {
  hixl_kv_connector *sched, *worker;
  uint8_t *mem;
  hixl_kv_layer layers[LAYERS];
};

/* x as role on a free port of tu_ip(), with the configuration's other members keys
 * (JSON, after a comma: "\"mode\": \"pull\", ..."), its cache filled with fill. */
static inline bool inst_up_with(struct inst *x, const char *role, const char *keys, int fill) {
  char cfg[640], err[256] = "";
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"role\": \"%s\", \"Transport\": \"%s\", %s}\n",
           tu_ip(), (unsigned)tu_free_port(), role, tu_transport() ? tu_transport() : "auto", keys);
  memset(x, 0, sizeof(*x));
  x->mem = malloc(LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  if (!x->mem) return false;
  memset(x->mem, fill, LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  for (int l = 0; l < LAYERS; l++)
    x->layers[l] = (hixl_kv_layer){"layer",
                                   5,
                                   (uintptr_t)(x->mem + l * 2 * BLOCKS * BLOCK_BYTES),
                                   BLOCKS,
                                   BLOCK_BYTES,
                                   BLOCKS * BLOCK_BYTES,
                                   HIXL_KV_LAYOUT_KV_FIRST,
                                   ELEM,
                                   BLOCK_TOKENS};
  if (ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x->sched, err, sizeof(err)) !=
          HIXL_KV_SUCCESS ||
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &x->worker, err, sizeof(err)) !=
          HIXL_KV_SUCCESS ||
      ops->register_kv_caches(x->worker, x->layers, LAYERS) != HIXL_KV_SUCCESS) {
    tu_fail(__FILE__, __LINE__, "a %s instance: %s%s", role, err, ops->last_error());
    return false;
  }
  return true;
}

static inline void inst_down(struct inst *x) {
  if (x->worker) ST_IS(ops->destroy(x->worker), HIXL_KV_SUCCESS);
  if (x->sched) ST_IS(ops->destroy(x->sched), HIXL_KV_SUCCESS);
  free(x->mem);
}

/* One step: the scheduler's metadata bound to the worker, loads started. */
static inline void step(struct inst *x) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(x->sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(x->worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(x->worker), HIXL_KV_SUCCESS);
}

/* Block b of x's cache in layer's K (v 0) or V (v 1). */
static inline uint8_t *block(struct inst *x, int layer, int v, uint64_t b) {
  return x->mem + ((size_t)layer * 2 + (size_t)v) * BLOCKS * BLOCK_BYTES + b * BLOCK_BYTES;
}

/* The pattern seed of a request's k-th block in layer's K or V, the request's seed given. */
static inline uint64_t seed_of(uint64_t seed, int layer, int v, int k) {
  return seed + (uint64_t)(layer * 4 + v * 2 + k);
}

/* Step x until id shows among its worker's finished sending (which 0) or receiving (1);
 * false if it did not within ms. */
static inline bool inst_wait_stepped(struct inst *x, const char *id, int which, int ms) {
  int64_t end = tu_now_ms() + ms;
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
    struct timespec ts = {0, 1000000}; /* polling the host's op, as a host does between steps */
    nanosleep(&ts, NULL);
  } while (tu_now_ms() < end);
  return false;
}

/* x's worker reports exactly the n blocks db with load errors, and each still holds fill
 * in every layer's K and V: nothing of the failed request landed. */
static inline void inst_assert_unloaded(struct inst *x, const uint64_t *db, size_t n, int fill,
                                        const char *what) {
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(x->worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(errs.count, n);
  for (size_t i = 0; i < errs.count && i < n; i++) CU_ASSERT_EQUAL(errs.ids[i], db[i]);
  ops->free_buffer(&errs.raw);
  uint8_t want[BLOCK_BYTES];
  memset(want, fill, sizeof(want));
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (size_t b = 0; b < n; b++) TU_ASSERT_SAME(block(x, l, v, db[b]), want, BLOCK_BYTES, what);
}

/* Neither x nor y (NULL: only x) holds a request or a block. */
static inline void inst_assert_idle(struct inst *x, struct inst *y) {
  for (struct inst *i = x; i; i = i == x ? y : NULL) {
    hixl_kv_stats st;
    ST_IS(ops->get_stats(i->worker, &st), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(st.requests_held, 0);
    CU_ASSERT_EQUAL(st.blocks_held, 0);
  }
}

#endif
