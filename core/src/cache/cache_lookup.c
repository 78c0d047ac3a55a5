/* cache_lookup: the requester side: links to other clusters' managers, finding their caches. */
/* A remote cache is found by key from what its peer answered before, while the
 * engine's copy of the peer's table still holds it, else by one lookup. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"
#include "engine/engine_ext.h"
#include "util/sock.h"

#define CM_REMEMBER_MAX 1024 /* remote caches remembered per linked cluster */

void cm_views_free(struct cm_view *v) {
  while (v) {
    struct cm_view *n = v->next;
    free(v->addrs);
    free(v);
    v = n;
  }
}

struct cm_link *cm_link_by_cluster(HixlCacheManager *m, uint64_t cluster) {
  for (struct cm_link *l = m->links; l; l = l->next)
    if (l->cluster_id == cluster) return l;
  return NULL;
}

/* ---- links ---- */

/* Ask the manager at remote who it is: its cluster must be cluster; its nonce out. */
static HixlStatus cm_hello(HixlCacheManager *m, const char *remote, uint64_t cluster, uint64_t deadline,
                           uint64_t *nonce, const char *fn) {
  uint8_t req[2] = {CM_PROTO, CM_OP_HELLO}, ans[16];
  size_t n = 0;
  uint64_t now = hixl_now_ns();
  int32_t left = deadline > now ? (int32_t)((deadline - now + 999999) / 1000000) : 1;
  HixlStatus st =
      hixl_engine_call(m->eng, remote, HIXL_SERVICE_CACHE, req, sizeof(req), ans, sizeof(ans), &n, left);
  if (st == HIXL_UNSUPPORTED)
    return hixl_fail(HIXL_UNSUPPORTED, "%s: %s has no cache manager (%s)", fn, remote,
                     HixlGetLastErrorMessage());
  if (st != HIXL_SUCCESS) return st;
  struct be_in b = be_in_of(ans, n);
  uint64_t got = be_in_u64(&b);
  *nonce = be_in_u64(&b);
  if (b.bad || n != 16)
    return hixl_fail(HIXL_FAILED, "%s: %s gave a malformed answer (%zu bytes)", fn, remote, n);
  if (got != cluster)
    return hixl_fail(HIXL_PARAM_INVALID, "%s: %s is cluster %" PRIu64 ", not cluster %" PRIu64, fn, remote,
                     got, cluster);
  return HIXL_SUCCESS;
}

/* cluster is linked: when its engine link broke (the peer closed it, or cut it when a
 * lease it granted expired), connect again and check it is still that cluster. Views
 * of a manager that restarted (another nonce) are dropped. */
static HixlStatus cm_relink(HixlCacheManager *m, uint64_t cluster, const char *remote, int32_t timeout_ms,
                            const char *fn) {
  uint64_t deadline = hixl_deadline_ns(timeout_ms), nonce = 0;
  HixlStatus st = HixlEngineConnect(m->eng, remote, timeout_ms);
  if (st == HIXL_ALREADY_CONNECTED)
    return hixl_fail(HIXL_ALREADY_CONNECTED, "%s: cluster %" PRIu64 " is already linked", fn, cluster);
  if (st != HIXL_SUCCESS) return st;
  st = cm_hello(m, remote, cluster, deadline, &nonce, fn);
  struct cm_view *stale = NULL;
  if (st == HIXL_SUCCESS) {
    pthread_mutex_lock(&m->lock);
    struct cm_link *l = cm_link_by_cluster(m, cluster);
    if (l && strcmp(l->remote, remote) == 0) {
      l->connected = true;
      if (l->nonce != nonce) {
        stale = l->views;
        l->views = NULL;
        l->nviews = 0;
        l->nonce = nonce;
      }
    } else {
      st = hixl_fail(HIXL_NOT_CONNECTED, "%s: cluster %" PRIu64 " was unlinked meanwhile", fn, cluster);
    }
    pthread_mutex_unlock(&m->lock);
  }
  if (st != HIXL_SUCCESS) HixlEngineDisconnect(m->eng, remote, 0);
  cm_views_free(stale);
  return st;
}

static HixlStatus link_in(HixlCacheManager *m, uint64_t remote_cluster_id, const char *remote_engine,
                          int32_t timeout_ms, const char *fn) {
  CHECK_ARG(remote_engine, "%s: remote_engine is NULL", fn);
  CHECK_ARG(strlen(remote_engine) < sizeof(((struct cm_link *)0)->remote), "%s: remote_engine is too long",
            fn);
  CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, timeout_ms);
  char remote[sizeof(((struct cm_link *)0)->remote)] = "";
  pthread_mutex_lock(&m->lock);
  struct cm_link *had = cm_link_by_cluster(m, remote_cluster_id);
  if (had) snprintf(remote, sizeof(remote), "%s", had->remote);
  pthread_mutex_unlock(&m->lock);
  if (had) return cm_relink(m, remote_cluster_id, remote, timeout_ms, fn);
  uint64_t deadline = hixl_deadline_ns(timeout_ms), nonce = 0;
  HixlStatus st = HixlEngineConnect(m->eng, remote_engine, timeout_ms);
  bool ours = st == HIXL_SUCCESS;
  if (st != HIXL_SUCCESS && st != HIXL_ALREADY_CONNECTED) return st;
  st = cm_hello(m, remote_engine, remote_cluster_id, deadline, &nonce, fn);
  struct cm_link *l = st == HIXL_SUCCESS ? calloc(1, sizeof(*l)) : NULL;
  if (st == HIXL_SUCCESS && !l) st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  if (st != HIXL_SUCCESS) {
    if (ours) HixlEngineDisconnect(m->eng, remote_engine, 0);
    return st;
  }
  l->cluster_id = remote_cluster_id;
  snprintf(l->remote, sizeof(l->remote), "%s", remote_engine);
  l->connected = ours;
  l->nonce = nonce;
  pthread_mutex_lock(&m->lock);
  struct cm_link *won = cm_link_by_cluster(m, remote_cluster_id);
  if (won) { /* a racing Link won; if this call made the engine link, Unlink is to close it */
    if (ours && strcmp(won->remote, remote_engine) == 0) won->connected = true;
    pthread_mutex_unlock(&m->lock);
    free(l);
    return hixl_fail(HIXL_ALREADY_CONNECTED, "%s: cluster %" PRIu64 " is already linked", fn,
                     remote_cluster_id);
  }
  l->next = m->links;
  m->links = l;
  pthread_mutex_unlock(&m->lock);
  return HIXL_SUCCESS;
}

HixlStatus HixlCacheManagerLink(HixlCacheManager *m, uint64_t remote_cluster_id, const char *remote_engine,
                                int32_t timeout_ms) {
  const char *fn = "HixlCacheManagerLink";
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS ? st : cm_leave(m, link_in(m, remote_cluster_id, remote_engine, timeout_ms, fn));
}

static HixlStatus unlink_in(HixlCacheManager *m, uint64_t remote_cluster_id, int32_t timeout_ms,
                            const char *fn) {
  CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, timeout_ms);
  pthread_mutex_lock(&m->lock);
  struct cm_link **pp = &m->links;
  while (*pp && (*pp)->cluster_id != remote_cluster_id) pp = &(*pp)->next;
  struct cm_link *l = *pp;
  if (l) *pp = l->next;
  pthread_mutex_unlock(&m->lock);
  if (!l)
    return hixl_fail(HIXL_NOT_CONNECTED, "%s: cluster %" PRIu64 " is not linked", fn, remote_cluster_id);
  HixlStatus st = l->connected ? HixlEngineDisconnect(m->eng, l->remote, timeout_ms) : HIXL_SUCCESS;
  if (st == HIXL_NOT_CONNECTED) st = HIXL_SUCCESS; /* the link was already lost */
  cm_views_free(l->views);
  free(l);
  return st;
}

HixlStatus HixlCacheManagerUnlink(HixlCacheManager *m, uint64_t remote_cluster_id, int32_t timeout_ms) {
  const char *fn = "HixlCacheManagerUnlink";
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS ? st : cm_leave(m, unlink_in(m, remote_cluster_id, timeout_ms, fn));
}

/* ---- finding a remote cache ---- */

static struct cm_view *cm_view_copy(const struct cm_view *v) {
  struct cm_view *c = malloc(sizeof(*c));
  if (!c) return NULL;
  *c = *v;
  c->next = NULL;
  if (!(c->addrs = malloc(v->n * sizeof(*v->addrs)))) {
    free(c);
    return NULL;
  }
  memcpy(c->addrs, v->addrs, v->n * sizeof(*v->addrs));
  return c;
}

/* Forget every view of cache id on cluster. */
void cm_forget(HixlCacheManager *m, uint64_t cluster, uint64_t id) {
  pthread_mutex_lock(&m->lock);
  struct cm_link *l = cm_link_by_cluster(m, cluster);
  struct cm_view **pp = l ? &l->views : NULL;
  while (pp && *pp) {
    struct cm_view *v = *pp;
    if (v->id == id) {
      *pp = v->next;
      v->next = NULL;
      cm_views_free(v);
      l->nviews--;
    } else {
      pp = &v->next;
    }
  }
  pthread_mutex_unlock(&m->lock);
}

/* The peer's view of the cache key names, from memory when it still holds (every
 * tensor still advertised under the cache's tag), else by one lookup. *out is the
 * caller's copy; *remote the peer's engine. */
HixlStatus cm_find(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t deadline, const char *fn,
                   struct cm_view **out, char *remote, bool *hit) {
  *hit = false;
  uint64_t cluster = cm_key_cluster(key);
  char tag[CM_TAG_LEN];
  pthread_mutex_lock(&m->lock);
  struct cm_link *l = cm_link_by_cluster(m, cluster);
  struct cm_view *seen = NULL;
  if (l) {
    snprintf(remote, 64, "%s", l->remote);
    for (struct cm_view *v = l->views; v; v = v->next)
      if (cm_key_equal(&v->key, key)) {
        seen = cm_view_copy(v);
        break;
      }
    cm_tag_of(tag, l->nonce, 0);
  }
  uint64_t nonce = l ? l->nonce : 0;
  pthread_mutex_unlock(&m->lock);
  if (!l)
    return hixl_fail(HIXL_NOT_CONNECTED,
                     "%s: cluster %" PRIu64 " is not linked; call HixlCacheManagerLink first", fn, cluster);
  if (seen) {
    cm_tag_of(tag, nonce, seen->id);
    HixlStatus hs = hixl_engine_remote_has(m->eng, remote, seen->addrs, seen->n, seen->tensor_bytes, tag);
    if (hs != HIXL_SUCCESS && hs != HIXL_PARAM_INVALID) { /* the link, not the cache: keep the view */
      cm_views_free(seen);
      return hixl_fail(hs, "%s: %s", fn, HixlGetLastErrorMessage());
    }
    if (hs == HIXL_SUCCESS) {
      pthread_mutex_lock(&m->lock);
      m->stats.lookup_hits++;
      pthread_mutex_unlock(&m->lock);
      *hit = true;
      *out = seen;
      return HIXL_SUCCESS;
    }
    cm_forget(m, cluster, seen->id); /* the peer unregistered it */
    cm_views_free(seen);
  }
  uint8_t req[64];
  struct be_out b = be_out_fixed(req, sizeof(req));
  be_out_u8(&b, CM_PROTO);
  be_out_u8(&b, CM_OP_LOOKUP);
  cm_put_key(&b, key);
  uint64_t now = hixl_now_ns();
  if (now >= deadline)
    return hixl_fail(HIXL_TIMEOUT, "%s: timed out before the lookup of a cache on cluster %" PRIu64, fn,
                     cluster);
  int32_t left = (int32_t)((deadline - now + 999999) / 1000000);
  size_t cap = 40 + (size_t)HIXL_CACHE_MAX_ADDRS * 8, n = 0;
  uint8_t *ans = malloc(cap);
  if (!ans) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  HixlStatus st = hixl_engine_call(m->eng, remote, HIXL_SERVICE_CACHE, req, b.len, ans, cap, &n, left);
  pthread_mutex_lock(&m->lock);
  m->stats.lookups++;
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) {
    free(ans);
    return hixl_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  }
  struct cm_view *v = calloc(1, sizeof(*v));
  if (!v) {
    free(ans);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory for %s's cache answer", fn, remote);
  }
  if (!cm_get_view(ans, n, v)) {
    free(ans);
    free(v);
    return hixl_fail(HIXL_FAILED, "%s: %s gave a malformed cache answer (%zu bytes)", fn, remote, n);
  }
  free(ans);
  /* An id key names the cache and its item: an answer of another is not this key's. */
  if (key->kind == HIXL_CACHE_KEY_ID &&
      (v->id != key->u.id.cache_id || (!v->blocks && v->batch_index != key->u.id.batch_index))) {
    HixlStatus bad = hixl_fail(
        HIXL_FAILED, "%s: %s answered cache %" PRIu64 " item %u for a key naming cache %" PRIu64 " item %u",
        fn, remote, v->id, v->batch_index, key->u.id.cache_id, key->u.id.batch_index);
    cm_views_free(v);
    return bad;
  }
  v->key = *key;
  struct cm_view *keep = cm_view_copy(v);
  pthread_mutex_lock(&m->lock);
  if (keep && (l = cm_link_by_cluster(m, cluster)) != NULL) {
    if (l->nviews >= CM_REMEMBER_MAX) { /* forget the oldest */
      struct cm_view **pp = &l->views;
      while ((*pp)->next) pp = &(*pp)->next;
      cm_views_free(*pp);
      *pp = NULL;
      l->nviews--;
    }
    keep->next = l->views;
    l->views = keep;
    l->nviews++;
    keep = NULL;
  }
  pthread_mutex_unlock(&m->lock);
  cm_views_free(keep);
  *out = v;
  return HIXL_SUCCESS;
}
