/* cache: the cache manager (hixl_cache.h), the C form of LLM-DataDist's CacheManager.
 * It sits on the public engine API plus two things of engine_ext.h: tagged
 * registrations (each tensor of a cache peers may reach is advertised as
 * "hixl.cache/<manager nonce>/<cache id>") and the CACHE service, which answers a
 * peer's lookup (by key or cache id) with the cache's layout and tensor addresses
 * in one round trip. What a peer learned is remembered per linked cluster and
 * checked against the engine's copy of the peer's table before each use, so a
 * cache the peer unregistered (its tensors' MEM_DEL) is forgotten.
 *
 * cache_ext.h adds a push started rather than waited for, with a call behind its data
 * (the plugin's pusher).
 *
 * Locking: mgr->lock is a leaf. It is never held across an engine call, because the
 * engine calls cm_serve (the service) from its progress thread with its own lock
 * held. Local caches in use by a transfer are pinned (busy) so Unregister refuses.
 *
 * Files, by job: this one the manager's life (create, destroy, stats);
 * cache_codec.c keys, tags and the service's messages; cache_service.c the service
 * (the target side); cache_reg.c local caches (registration, pins); cache_lookup.c
 * links and finding a remote cache (the requester side); cache_plan.c pull and push;
 * cache_async.c TransferCacheAsync's tasks; cache_int.h what they share. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cache/cache_int.h"
#include "engine/engine_ext.h"
#include "util/sock.h"

HixlStatus HixlCacheManagerCreate(HixlEngine *engine, uint64_t cluster_id, HixlCacheManager **mgr) {
  CHECK_ARG(engine && mgr, "HixlCacheManagerCreate: engine or mgr output is NULL");
  HixlCacheManager *m = calloc(1, sizeof(*m));
  if (!m) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlCacheManagerCreate: out of memory");
  m->eng = engine;
  m->cluster_id = cluster_id;
  m->next_id = 1;
  if (getrandom(&m->nonce, sizeof(m->nonce), 0) != (ssize_t)sizeof(m->nonce))
    m->nonce = hixl_now_ns() ^ (uint64_t)(uintptr_t)m;
  m->index.seed = m->nonce;
  pthread_mutex_init(&m->lock, NULL);
  HixlStatus st = hixl_engine_set_service(engine, HIXL_SERVICE_CACHE, cm_serve, m);
  if (st != HIXL_SUCCESS) {
    if (st == HIXL_PARAM_INVALID && strstr(HixlGetLastErrorMessage(), "already has"))
      st = hixl_fail(HIXL_PARAM_INVALID, "HixlCacheManagerCreate: this engine already has a cache manager");
    pthread_mutex_destroy(&m->lock);
    free(m);
    return st;
  }
  *mgr = m;
  return HIXL_SUCCESS;
}

/* Destroy: nothing in use (no task, pin, registration or other call under way, and no
 * new one begins once it has begun), then every cache deregistered, one at a time. One
 * the engine refuses (a transfer of the caller's own in flight on it) stays, with the
 * rest and the manager: FAILED, the manager usable again (the caches deregistered
 * before it are gone, as by UnregisterCache). Only then is the service taken away and
 * everything freed. */
HixlStatus HixlCacheManagerDestroy(HixlCacheManager *m) {
  CHECK_ARG(m, "HixlCacheManagerDestroy: mgr is NULL");
  pthread_mutex_lock(&m->lock);
  uint32_t tasks = m->tasks, busy = 0, calls = m->calls;
  for (struct cm_cache *c = m->caches; c; c = c->next) busy += c->busy;
  for (struct cm_cache *c = m->pending; c; c = c->next) busy++; /* a registration under way */
  bool was_closing = m->closing;
  if (!tasks && !busy && !calls) m->closing = true;
  pthread_mutex_unlock(&m->lock);
  CHECK_ARG(!was_closing, "HixlCacheManagerDestroy: another call is destroying the manager");
  if (tasks || busy || calls)
    return hixl_fail(
        HIXL_FAILED,
        "HixlCacheManagerDestroy: %u async tasks, %u transfers or registrations and %u other calls "
        "still use it; nothing was freed",
        tasks, busy, calls);
  for (;;) {
    pthread_mutex_lock(&m->lock);
    struct cm_cache *c = m->caches;
    if (c) { /* out of the list under the lock: the service no longer finds it */
      m->caches = c->next;
      c->listed = false;
      m->naddrs -= c->desc.num_tensors;
    }
    pthread_mutex_unlock(&m->lock);
    if (!c) break;
    HixlStatus st = cache_deregister(m, c, "HixlCacheManagerDestroy");
    if (st != HIXL_SUCCESS) {
      pthread_mutex_lock(&m->lock);
      c->next = m->caches;
      m->caches = c;
      c->listed = true;
      m->naddrs += c->desc.num_tensors;
      m->closing = false;
      pthread_mutex_unlock(&m->lock);
      return st;
    }
    pthread_mutex_lock(&m->lock);
    cm_index_drop(&m->index, c);
    pthread_mutex_unlock(&m->lock);
    cache_free(c);
  }
  /* Once this returns no peer's lookup runs cm_serve (the progress thread calls it with
   * the engine's lock held); on a finalized engine too. */
  hixl_engine_set_service(m->eng, HIXL_SERVICE_CACHE, NULL, NULL);
  while (m->links) {
    struct cm_link *l = m->links;
    if (l->connected) HixlEngineDisconnect(m->eng, l->remote, 0);
    m->links = l->next;
    cm_views_free(l->views);
    free(l);
  }
  cm_index_free(&m->index);
  pthread_mutex_destroy(&m->lock);
  free(m);
  return HIXL_SUCCESS;
}

/* A call as the others (cm_enter): Destroy refuses while it reads, and it is refused once
 * Destroy has begun (before: it read the manager Destroy was freeing). */
HixlStatus HixlCacheManagerGetStats(HixlCacheManager *m, HixlCacheStats *stats) {
  const char *fn = "HixlCacheManagerGetStats";
  CHECK_ARG(m && stats, "%s: mgr or stats output is NULL", fn);
  HixlStatus st = cm_enter(m, fn);
  if (st != HIXL_SUCCESS) return st;
  pthread_mutex_lock(&m->lock);
  *stats = m->stats;
  pthread_mutex_unlock(&m->lock);
  return cm_leave(m, HIXL_SUCCESS);
}
