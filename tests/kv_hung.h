/* kv_hung: a peer worker that does not answer in time, for white-box plugin tests: a
 * bare engine whose KV service answers every call "not yet", 1.5 s late (a GC pause, a
 * stopped process: the delay is the peer's behaviour under test, not a wait for an
 * event), with a cache manager of the worker's cluster, so that links to it succeed. */
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

static inline void hung_peer_down(struct hung_peer *h) {
  if (h->m) HixlCacheManagerDestroy(h->m);
  if (h->e) HixlEngineDestroy(h->e);
}

#endif
