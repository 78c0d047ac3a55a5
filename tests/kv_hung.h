/* kv_hung: a peer worker that does not answer in time, for white-box plugin tests: a
 * bare engine whose KV service answers every call "not yet", 1.5 s late (a GC pause, a
 * stopped process: the delay is the peer's behaviour under test, not a wait for an
 * event), or at once (never_peer_up: a peer that never binds the request), with a cache
 * manager of the worker's cluster, so that links to it succeed. */
#ifndef HIXL_TEST_KV_HUNG_H
#define HIXL_TEST_KV_HUNG_H

#include <time.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "kv_int.h"
#include "test_util.h"

struct hung_peer {
  HixlEngine *e;
  HixlCacheManager *m;
  char addr[TU_ADDR_LEN];
  int calls; /* never_peer_up's: the calls it answered (atomic) */
};

static inline HixlStatus hung_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                 size_t cap, size_t *resp_len) {
  (void)ctx, (void)peer, (void)req, (void)len, (void)cap;
  struct timespec ts = {1, 500000000};
  nanosleep(&ts, NULL);
  resp[0] = KV_PIN_NOT_YET;
  *resp_len = 1;
  return HIXL_SUCCESS;
}

/* h up on a free port of tu_ip(): false on failure (asserted). */
static inline bool hung_peer_up(struct hung_peer *h) {
  char waddr[64];
  uint64_t cluster = 0;
  *h = (struct hung_peer){0};
  tu_addr(h->addr, sizeof(h->addr), tu_free_port());
  h->e = tu_engine_start_with(h->addr, "tcp");
  bool up = h->e && kv_worker_address(h->addr, 0, waddr, sizeof(waddr), &cluster) == HIXL_KV_SUCCESS &&
            HixlCacheManagerCreate(h->e, cluster, &h->m) == HIXL_SUCCESS &&
            hixl_engine_set_service(h->e, HIXL_SERVICE_KV, hung_kv, NULL) == HIXL_SUCCESS;
  if (!up) tu_fail(__FILE__, __LINE__, "a hung peer at %s: %s", h->addr, HixlGetLastErrorMessage());
  return up;
}

/* A peer that never binds the request: its KV service answers every call "not yet" at
 * once, and counts them (h->calls). */
static inline HixlStatus never_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                  size_t cap, size_t *resp_len) {
  (void)peer, (void)req, (void)len, (void)cap;
  __atomic_add_fetch(&((struct hung_peer *)ctx)->calls, 1, __ATOMIC_SEQ_CST);
  resp[0] = KV_PIN_NOT_YET;
  *resp_len = 1;
  return HIXL_SUCCESS;
}

/* h up as hung_peer_up, answering at once (never_kv). */
static inline bool never_peer_up(struct hung_peer *h) {
  bool up = hung_peer_up(h) && hixl_engine_set_service(h->e, HIXL_SERVICE_KV, NULL, NULL) == HIXL_SUCCESS &&
            hixl_engine_set_service(h->e, HIXL_SERVICE_KV, never_kv, h) == HIXL_SUCCESS;
  if (!up)
    tu_fail(__FILE__, __LINE__, "a peer that never binds at %s: %s", h->addr, HixlGetLastErrorMessage());
  return up;
}

/* Whether h answered at least n calls within timeout_ms. */
static inline bool hung_peer_asked(struct hung_peer *h, int n, int timeout_ms) {
  int64_t end = tu_now_ms() + timeout_ms;
  while (__atomic_load_n(&h->calls, __ATOMIC_SEQ_CST) < n && tu_now_ms() < end) {
    struct timespec ts = {0, 1000000}; /* polling the count */
    nanosleep(&ts, NULL);
  }
  return __atomic_load_n(&h->calls, __ATOMIC_SEQ_CST) >= n;
}

static inline void hung_peer_down(struct hung_peer *h) {
  if (h->m) HixlCacheManagerDestroy(h->m);
  if (h->e) HixlEngineDestroy(h->e);
}

#endif
