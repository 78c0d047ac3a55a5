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
 * held. Local caches in use by a transfer are pinned (busy) so Unregister refuses. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

#define CM_PROTO        1u   /* the CACHE service's request layout */
#define CM_OP_HELLO     1u   /* -> cluster u64, nonce u64 */
#define CM_OP_LOOKUP    2u   /* key -> layout and addresses */
#define CM_REMEMBER_MAX 1024 /* remote caches remembered per linked cluster */
#define CM_TAG_PREFIX   "hixl.cache/"
#define CM_TAG_LEN      64

/* A cache this manager registered. */
struct cm_cache {
  uint64_t id;
  bool blocks; /* paged (register_blocks_cache) */
  bool remote; /* remote_accessible: registered with the engine, found by peers */
  HixlCacheDesc desc;
  uint64_t tensor_bytes;
  uint64_t item_bytes; /* a batch item or a block: tensor_bytes / shape[0] */
  uintptr_t *addrs;
  HixlMemHandle *handles; /* remote: one per span of tensors adjacent in memory, at the span's
                           * first tensor; NULL elsewhere and once deregistered */
  HixlCacheKey *keys;     /* keys[b] names batch item b (contiguous) */
  size_t nkeys;
  bool has_bkey;
  HixlBlocksCacheKey bkey;
  uint32_t busy;  /* transfers and tasks using it */
  bool allocated; /* AllocateCache: handles[0] is the engine's allocation holding every tensor */
  struct cm_cache *next;
};

/* What a peer answered about one of its caches (the "view" of a remote cache). */
struct cm_view {
  HixlCacheAnyKey key; /* the key it was found by */
  uint64_t id;
  bool blocks;
  uint32_t n, elem_size, batch_index; /* batch_index: the item a REQ or ID key names */
  uint64_t shape0, tensor_bytes, item_bytes;
  uintptr_t *addrs;
  struct cm_view *next;
};

struct cm_link {
  uint64_t cluster_id;
  char remote[64]; /* "ip:port" */
  bool connected;  /* Link made the engine's link, Unlink closes it */
  uint64_t nonce;  /* the peer manager's, in its tags */
  struct cm_view *views;
  size_t nviews;
  struct cm_link *next;
};

struct HixlCacheManager {
  HixlEngine *eng;
  uint64_t cluster_id;
  uint64_t nonce;
  pthread_mutex_t lock; /* a leaf: never held across an engine call */
  struct cm_cache *caches;
  uint64_t next_id;
  size_t naddrs; /* tensor addresses registered, all caches */
  struct cm_link *links;
  uint32_t tasks; /* async tasks not yet destroyed */
  HixlCacheStats stats;
};

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return hixl_fail(HIXL_PARAM_INVALID, __VA_ARGS__);                                          \
  } while (0)

/* ---- big-endian helpers for the service's messages ---- */

struct cm_buf {
  uint8_t *p;
  size_t len, cap;
  bool bad; /* overflow (writing) or short / malformed (reading) */
};

static void put_u8(struct cm_buf *b, uint8_t v) {
  if (b->len + 1 > b->cap) {
    b->bad = true;
    return;
  }
  b->p[b->len++] = v;
}
static void put_be(struct cm_buf *b, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) put_u8(b, (uint8_t)(v >> (8 * i)));
}
static uint64_t get_be(struct cm_buf *b, int bytes) {
  uint64_t v = 0;
  if (b->len + (size_t)bytes > b->cap) {
    b->bad = true;
    return 0;
  }
  for (int i = 0; i < bytes; i++) v = (v << 8) | b->p[b->len++];
  return v;
}

static void put_key(struct cm_buf *b, const HixlCacheAnyKey *k) {
  put_u8(b, (uint8_t)k->kind);
  switch (k->kind) {
  case HIXL_CACHE_KEY_REQ:
    put_be(b, k->u.req.cluster_id, 8);
    put_be(b, k->u.req.req_id, 8);
    put_be(b, k->u.req.model_id, 8);
    put_be(b, k->u.req.prefix_id, 8);
    break;
  case HIXL_CACHE_KEY_ID:
    put_be(b, k->u.id.cluster_id, 8);
    put_be(b, k->u.id.cache_id, 8);
    put_be(b, k->u.id.batch_index, 4);
    break;
  case HIXL_CACHE_KEY_BLOCKS:
    put_be(b, k->u.blocks.cluster_id, 8);
    put_be(b, k->u.blocks.model_id, 8);
    break;
  }
}

static bool get_key(struct cm_buf *b, HixlCacheAnyKey *k) {
  memset(k, 0, sizeof(*k));
  uint8_t kind = (uint8_t)get_be(b, 1);
  switch (kind) {
  case HIXL_CACHE_KEY_REQ:
    k->u.req.cluster_id = get_be(b, 8);
    k->u.req.req_id = get_be(b, 8);
    k->u.req.model_id = get_be(b, 8);
    k->u.req.prefix_id = get_be(b, 8);
    break;
  case HIXL_CACHE_KEY_ID:
    k->u.id.cluster_id = get_be(b, 8);
    k->u.id.cache_id = get_be(b, 8);
    k->u.id.batch_index = (uint32_t)get_be(b, 4);
    break;
  case HIXL_CACHE_KEY_BLOCKS:
    k->u.blocks.cluster_id = get_be(b, 8);
    k->u.blocks.model_id = get_be(b, 8);
    break;
  default: return false;
  }
  k->kind = (HixlCacheKeyKind)kind;
  return !b->bad;
}

static uint64_t key_cluster(const HixlCacheAnyKey *k) {
  return k->kind == HIXL_CACHE_KEY_REQ  ? k->u.req.cluster_id
         : k->kind == HIXL_CACHE_KEY_ID ? k->u.id.cluster_id
                                        : k->u.blocks.cluster_id;
}

static bool key_equal(const HixlCacheAnyKey *a, const HixlCacheAnyKey *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case HIXL_CACHE_KEY_REQ: return memcmp(&a->u.req, &b->u.req, sizeof(a->u.req)) == 0;
  case HIXL_CACHE_KEY_ID:
    return a->u.id.cluster_id == b->u.id.cluster_id && a->u.id.cache_id == b->u.id.cache_id &&
           a->u.id.batch_index == b->u.id.batch_index;
  case HIXL_CACHE_KEY_BLOCKS: return memcmp(&a->u.blocks, &b->u.blocks, sizeof(a->u.blocks)) == 0;
  }
  return false;
}

static void key_text(const HixlCacheAnyKey *k, char *out, size_t cap) {
  switch (k->kind) {
  case HIXL_CACHE_KEY_REQ:
    snprintf(out, cap,
             "CacheKey{cluster %" PRIu64 ", req %" PRIu64 ", model %" PRIu64 ", prefix %" PRIu64 "}",
             k->u.req.cluster_id, k->u.req.req_id, k->u.req.model_id, k->u.req.prefix_id);
    return;
  case HIXL_CACHE_KEY_ID:
    snprintf(out, cap, "CacheKeyByIdAndIndex{cluster %" PRIu64 ", cache %" PRIu64 ", batch %u}",
             k->u.id.cluster_id, k->u.id.cache_id, k->u.id.batch_index);
    return;
  case HIXL_CACHE_KEY_BLOCKS:
    snprintf(out, cap, "BlocksCacheKey{cluster %" PRIu64 ", model %" PRIu64 "}", k->u.blocks.cluster_id,
             k->u.blocks.model_id);
    return;
  }
  snprintf(out, cap, "key of unknown kind %d", (int)k->kind);
}

static void tag_of(char *tag, uint64_t nonce, uint64_t id) {
  snprintf(tag, CM_TAG_LEN, CM_TAG_PREFIX "%016" PRIx64 "/%" PRIu64, nonce, id);
}

/* ---- the CACHE service (runs on the engine's progress thread) ---- */

static struct cm_cache *cache_by_id(HixlCacheManager *m, uint64_t id) {
  for (struct cm_cache *c = m->caches; c; c = c->next)
    if (c->id == id) return c;
  return NULL;
}

/* The cache a key names here, and the batch item it names; NULL with why. */
static struct cm_cache *cache_by_key(HixlCacheManager *m, const HixlCacheAnyKey *k, uint32_t *batch,
                                     char *why, size_t cap) {
  char kt[160];
  key_text(k, kt, sizeof(kt));
  if (key_cluster(k) != m->cluster_id) {
    snprintf(why, cap, "%s: this manager is cluster %" PRIu64, kt, m->cluster_id);
    return NULL;
  }
  for (struct cm_cache *c = m->caches; c; c = c->next) {
    if (k->kind == HIXL_CACHE_KEY_ID && c->id == k->u.id.cache_id) {
      if (k->u.id.batch_index >= c->desc.shape[0] && !c->blocks) {
        snprintf(why, cap, "%s: cache %" PRIu64 " has %" PRIu64 " batch items", kt, c->id, c->desc.shape[0]);
        return NULL;
      }
      *batch = k->u.id.batch_index;
      return c;
    }
    if (k->kind == HIXL_CACHE_KEY_BLOCKS && c->has_bkey && c->bkey.model_id == k->u.blocks.model_id) {
      *batch = 0;
      return c;
    }
    if (k->kind == HIXL_CACHE_KEY_REQ)
      for (size_t b = 0; b < c->nkeys; b++)
        if (c->keys[b].req_id == k->u.req.req_id && c->keys[b].model_id == k->u.req.model_id &&
            c->keys[b].prefix_id == k->u.req.prefix_id) {
          *batch = (uint32_t)b;
          return c;
        }
  }
  snprintf(why, cap, "%s names no cache on cluster %" PRIu64, kt, m->cluster_id);
  return NULL;
}

static HixlStatus cm_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                           size_t cap, size_t *resp_len) {
  HixlCacheManager *m = ctx;
  struct cm_buf in = {(uint8_t *)req, 0, len, false}, out = {resp, 0, cap, false};
  uint8_t proto = (uint8_t)get_be(&in, 1), op = (uint8_t)get_be(&in, 1);
  HixlStatus st = HIXL_SUCCESS;
  char why[320] = "";
  if (in.bad || proto != CM_PROTO) {
    snprintf(why, sizeof(why), "cache service request of %zu bytes, layout %u: this side speaks layout %u",
             len, proto, CM_PROTO);
    st = HIXL_UNSUPPORTED;
  } else if (op == CM_OP_HELLO && in.len == len) {
    put_be(&out, m->cluster_id, 8);
    put_be(&out, m->nonce, 8);
  } else if (op == CM_OP_LOOKUP) {
    HixlCacheAnyKey k;
    if (!get_key(&in, &k) || in.len != len) {
      snprintf(why, sizeof(why), "malformed cache lookup from %s", peer);
      st = HIXL_PARAM_INVALID;
    } else {
      pthread_mutex_lock(&m->lock);
      uint32_t batch = 0;
      struct cm_cache *c = cache_by_key(m, &k, &batch, why, sizeof(why));
      if (!c) {
        st = HIXL_NOT_FOUND;
      } else if (!c->remote) {
        snprintf(why, sizeof(why),
                 "cache %" PRIu64 " of cluster %" PRIu64 " is registered without remote access", c->id,
                 m->cluster_id);
        st = HIXL_NOT_FOUND;
      } else {
        put_be(&out, c->id, 8);
        put_u8(&out, c->blocks);
        put_be(&out, c->desc.num_tensors, 4);
        put_be(&out, c->desc.elem_size, 4);
        put_be(&out, batch, 4);
        put_be(&out, c->desc.shape[0], 8);
        put_be(&out, c->tensor_bytes, 8);
        for (uint32_t t = 0; t < c->desc.num_tensors; t++) put_be(&out, c->addrs[t], 8);
      }
      pthread_mutex_unlock(&m->lock);
      if (st == HIXL_SUCCESS && out.bad) {
        snprintf(why, sizeof(why), "cache answer does not fit %zu bytes", cap);
        st = HIXL_FAILED;
      }
    }
  } else {
    snprintf(why, sizeof(why), "unknown cache service operation %u", op);
    st = HIXL_UNSUPPORTED;
  }
  if (st != HIXL_SUCCESS) {
    size_t n = strlen(why);
    memcpy(resp, why, n < cap ? n : cap);
    *resp_len = n < cap ? n : cap;
    return st;
  }
  *resp_len = out.len;
  return HIXL_SUCCESS;
}

/* ---- manager ---- */

HixlStatus HixlCacheManagerCreate(HixlEngine *engine, uint64_t cluster_id, HixlCacheManager **mgr) {
  CHECK_ARG(engine && mgr, "HixlCacheManagerCreate: engine or mgr output is NULL");
  HixlCacheManager *m = calloc(1, sizeof(*m));
  if (!m) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlCacheManagerCreate: out of memory");
  m->eng = engine;
  m->cluster_id = cluster_id;
  m->next_id = 1;
  if (getrandom(&m->nonce, sizeof(m->nonce), 0) != (ssize_t)sizeof(m->nonce))
    m->nonce = hixl_now_ns() ^ (uint64_t)(uintptr_t)m;
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

static void views_free(struct cm_view *v) {
  while (v) {
    struct cm_view *n = v->next;
    free(v->addrs);
    free(v);
    v = n;
  }
}

static void cache_free(struct cm_cache *c) {
  free(c->addrs);
  free(c->handles);
  free(c->keys);
  free(c);
}

/* Deregister what is still registered of c; FAILED (c kept) when the engine refuses. */
static HixlStatus cache_deregister(HixlCacheManager *m, struct cm_cache *c, const char *fn) {
  HixlStatus st = HIXL_SUCCESS;
  for (uint32_t t = 0; c->handles && t < c->desc.num_tensors; t++) {
    if (!c->handles[t]) continue;
    HixlStatus s = c->allocated ? HixlEngineFreeMem(m->eng, c->handles[t])
                                : HixlEngineDeregisterMem(m->eng, c->handles[t]);
    if (s == HIXL_SUCCESS)
      c->handles[t] = NULL;
    else if (st == HIXL_SUCCESS)
      st = hixl_fail(s, "%s: cache %" PRIu64 " tensor %u: %s", fn, c->id, t, HixlGetLastErrorMessage());
  }
  return st;
}

HixlStatus HixlCacheManagerDestroy(HixlCacheManager *m) {
  CHECK_ARG(m, "HixlCacheManagerDestroy: mgr is NULL");
  pthread_mutex_lock(&m->lock);
  uint32_t tasks = m->tasks, busy = 0;
  for (struct cm_cache *c = m->caches; c; c = c->next) busy += c->busy;
  pthread_mutex_unlock(&m->lock);
  if (tasks || busy)
    return hixl_fail(HIXL_FAILED, "HixlCacheManagerDestroy: %u async tasks and %u transfers still use it",
                     tasks, busy);
  hixl_engine_set_service(m->eng, HIXL_SERVICE_CACHE, NULL, NULL);
  HixlStatus st = HIXL_SUCCESS;
  while (m->caches) {
    struct cm_cache *c = m->caches;
    HixlStatus s = cache_deregister(m, c, "HixlCacheManagerDestroy");
    if (s != HIXL_SUCCESS && st == HIXL_SUCCESS) st = s;
    m->caches = c->next;
    cache_free(c);
  }
  while (m->links) {
    struct cm_link *l = m->links;
    if (l->connected) HixlEngineDisconnect(m->eng, l->remote, 0);
    m->links = l->next;
    views_free(l->views);
    free(l);
  }
  pthread_mutex_destroy(&m->lock);
  free(m);
  return st;
}

static struct cm_link *link_by_cluster(HixlCacheManager *m, uint64_t cluster) {
  for (struct cm_link *l = m->links; l; l = l->next)
    if (l->cluster_id == cluster) return l;
  return NULL;
}

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
  struct cm_buf b = {ans, 0, n, false};
  uint64_t got = get_be(&b, 8);
  *nonce = get_be(&b, 8);
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
    struct cm_link *l = link_by_cluster(m, cluster);
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
  views_free(stale);
  return st;
}

HixlStatus HixlCacheManagerLink(HixlCacheManager *m, uint64_t remote_cluster_id, const char *remote_engine,
                                int32_t timeout_ms) {
  const char *fn = "HixlCacheManagerLink";
  CHECK_ARG(m && remote_engine, "%s: mgr or remote_engine is NULL", fn);
  CHECK_ARG(strlen(remote_engine) < sizeof(((struct cm_link *)0)->remote), "%s: remote_engine is too long",
            fn);
  CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, timeout_ms);
  char remote[sizeof(((struct cm_link *)0)->remote)] = "";
  pthread_mutex_lock(&m->lock);
  struct cm_link *had = link_by_cluster(m, remote_cluster_id);
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
  if (link_by_cluster(m, remote_cluster_id)) { /* a racing Link won */
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

HixlStatus HixlCacheManagerUnlink(HixlCacheManager *m, uint64_t remote_cluster_id, int32_t timeout_ms) {
  const char *fn = "HixlCacheManagerUnlink";
  CHECK_ARG(m, "%s: mgr is NULL", fn);
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
  views_free(l->views);
  free(l);
  return st;
}

/* ---- registration ---- */

static HixlStatus check_desc(const HixlCacheDesc *d, const char *fn, uint64_t *tensor_bytes) {
  CHECK_ARG(d, "%s: cache_desc is NULL", fn);
  if (d->placement == HIXL_CACHE_DEVICE)
    return hixl_fail(HIXL_UNSUPPORTED,
                     "%s: device placement needs a device memory backend, which hixl does not have", fn);
  CHECK_ARG(d->placement == HIXL_CACHE_HOST, "%s: placement %d is unknown", fn, (int)d->placement);
  CHECK_ARG(d->num_tensors >= 1 && d->num_tensors <= HIXL_CACHE_MAX_ADDRS,
            "%s: num_tensors %u is not in [1, %d]", fn, d->num_tensors, HIXL_CACHE_MAX_ADDRS);
  CHECK_ARG(d->elem_size >= 1, "%s: elem_size is 0", fn);
  CHECK_ARG(d->num_dims >= 1 && d->num_dims <= HIXL_CACHE_MAX_DIMS, "%s: num_dims %u is not in [1, %d]", fn,
            d->num_dims, HIXL_CACHE_MAX_DIMS);
  uint64_t b = d->elem_size;
  for (uint32_t i = 0; i < d->num_dims; i++) {
    CHECK_ARG(d->shape[i] >= 1, "%s: shape[%u] is 0", fn, i);
    CHECK_ARG(b <= (UINT64_C(1) << 48) / d->shape[i],
              "%s: the tensor size overflows (shape[%u] = %" PRIu64 ")", fn, i, d->shape[i]);
    b *= d->shape[i];
  }
  *tensor_bytes = b;
  return HIXL_SUCCESS;
}

static int cmp_uptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Register a cache at addrs, or (alloc) allocate its tensors and write their
 * addresses to addrs. */
static HixlStatus cm_register(HixlCacheManager *m, bool blocks, bool alloc, const HixlCacheDesc *desc,
                              uintptr_t *addrs, size_t num_addrs, const HixlCacheKey *keys, size_t num_keys,
                              const HixlBlocksCacheKey *bkey, HixlCacheAccess access, uint64_t *cache_id,
                              const char *fn) {
  uint64_t tb = 0;
  HixlStatus st;
  CHECK_ARG(m && addrs && cache_id, "%s: mgr, addrs or cache_id output is NULL", fn);
  if ((st = check_desc(desc, fn, &tb)) != HIXL_SUCCESS) return st;
  CHECK_ARG(num_addrs == desc->num_tensors, "%s: %zu addresses for %u tensors", fn, num_addrs,
            desc->num_tensors);
  CHECK_ARG(num_keys == 0 || keys, "%s: keys is NULL but num_keys is %zu", fn, num_keys);
  CHECK_ARG(num_keys <= desc->shape[0], "%s: %zu keys for a batch of %" PRIu64, fn, num_keys, desc->shape[0]);
  CHECK_ARG(access >= HIXL_CACHE_ACCESS_DEFAULT && access <= HIXL_CACHE_ACCESS_REMOTE,
            "%s: remote_accessible %d is unknown", fn, (int)access);
  for (size_t i = 0; i < num_addrs && !alloc; i++)
    CHECK_ARG(addrs[i] != 0 && addrs[i] + tb > addrs[i], "%s: tensor %zu's address 0x%" PRIxPTR " is invalid",
              fn, i, addrs[i]);
  /* Allocated: the tensors one after another, each at a page boundary. */
  uint64_t stride = (tb + 4095) / 4096 * 4096;
  CHECK_ARG(!alloc || stride <= ((uint64_t)1 << 46) / num_addrs,
            "%s: %zu tensors of %" PRIu64 " bytes are too many to allocate", fn, num_addrs, tb);
  for (size_t i = 0; i < num_keys; i++)
    for (size_t j = 0; j < i; j++)
      CHECK_ARG(keys[i].req_id != keys[j].req_id || keys[i].model_id != keys[j].model_id ||
                    keys[i].prefix_id != keys[j].prefix_id,
                "%s: keys %zu and %zu are the same", fn, j, i);
  struct cm_cache *c = calloc(1, sizeof(*c));
  uintptr_t *sorted = alloc ? NULL : malloc(num_addrs * sizeof(*sorted)); /* to check for overlaps */
  if (!c || (!alloc && !sorted) || !(c->addrs = malloc(num_addrs * sizeof(*c->addrs))) ||
      !(c->handles = calloc(num_addrs, sizeof(*c->handles))) ||
      (num_keys && !(c->keys = malloc(num_keys * sizeof(*c->keys))))) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto fail_alloc;
  }
  if (!alloc) { /* allocated tensors are laid out apart below */
    memcpy(sorted, addrs, num_addrs * sizeof(*sorted));
    qsort(sorted, num_addrs, sizeof(*sorted), cmp_uptr);
  }
  for (size_t i = 1; i < num_addrs && !alloc; i++)
    if (sorted[i] < sorted[i - 1] + tb) {
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: tensors at 0x%" PRIxPTR " and 0x%" PRIxPTR " overlap (%" PRIu64 " bytes each)", fn,
                     sorted[i - 1], sorted[i], tb);
      goto fail_alloc;
    }
  if (!alloc) memcpy(c->addrs, addrs, num_addrs * sizeof(*addrs));
  if (num_keys) memcpy(c->keys, keys, num_keys * sizeof(*keys));
  c->nkeys = num_keys;
  c->blocks = blocks;
  c->remote =
      alloc || access == HIXL_CACHE_ACCESS_REMOTE; /* host default: not remotely accessible, as the seed */
  c->allocated = alloc;
  c->desc = *desc;
  c->tensor_bytes = tb;
  c->item_bytes = tb / desc->shape[0];
  if (bkey) {
    c->has_bkey = true;
    c->bkey = *bkey;
  }
  /* Reserve an id and the addresses; check keys against the other caches. */
  pthread_mutex_lock(&m->lock);
  if (m->naddrs + num_addrs > HIXL_CACHE_MAX_ADDRS) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: %zu tensor addresses are registered; %zu more exceed %d", fn,
                   m->naddrs, num_addrs, HIXL_CACHE_MAX_ADDRS);
  } else {
    st = HIXL_SUCCESS;
    for (struct cm_cache *o = m->caches; o && st == HIXL_SUCCESS; o = o->next) {
      if (bkey && o->has_bkey && o->bkey.model_id == bkey->model_id)
        st =
            hixl_fail(HIXL_PARAM_INVALID, "%s: BlocksCacheKey model %" PRIu64 " already names cache %" PRIu64,
                      fn, bkey->model_id, o->id);
      for (size_t i = 0; i < num_keys && st == HIXL_SUCCESS; i++)
        for (size_t j = 0; j < o->nkeys; j++)
          if (o->keys[j].req_id == keys[i].req_id && o->keys[j].model_id == keys[i].model_id &&
              o->keys[j].prefix_id == keys[i].prefix_id) {
            st = hixl_fail(HIXL_PARAM_INVALID, "%s: CacheKey req %" PRIu64 " already names cache %" PRIu64,
                           fn, keys[i].req_id, o->id);
            break;
          }
    }
  }
  if (st == HIXL_SUCCESS) {
    c->id = m->next_id++;
    m->naddrs += num_addrs;
  }
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) goto fail_alloc;
  if (alloc) { /* one allocation for every tensor, advertised under the cache's tag */
    char tag[CM_TAG_LEN];
    void *base = NULL;
    tag_of(tag, m->nonce, c->id);
    st = hixl_engine_alloc_tagged(m->eng, (size_t)(stride * num_addrs), tag, &base, &c->handles[0]);
    if (st != HIXL_SUCCESS) {
      st = hixl_fail(st, "%s: %zu tensors of %" PRIu64 " bytes: %s", fn, num_addrs, tb,
                     HixlGetLastErrorMessage());
      goto fail_registered;
    }
    for (size_t i = 0; i < num_addrs; i++) c->addrs[i] = (uintptr_t)base + i * stride;
    memcpy(addrs, c->addrs, num_addrs * sizeof(*addrs)); /* nothing fails from here on */
  } else if (c->remote) {
    /* Tensors adjacent in memory (a runtime's layers in one pool) go as one registration
     * (one MR over rdma), its handle kept at the span's first tensor. */
    char tag[CM_TAG_LEN];
    tag_of(tag, m->nonce, c->id);
    for (size_t i = 0, j; i < num_addrs; i = j) {
      for (j = i + 1; j < num_addrs && sorted[j] == sorted[j - 1] + tb;) j++;
      uint32_t t = 0;
      while (c->addrs[t] != sorted[i]) t++;
      HixlMemDesc md = {sorted[i], (size_t)(tb * (j - i))};
      st = hixl_engine_register_tagged(m->eng, &md, HIXL_MEM_HOST, tag, &c->handles[t]);
      if (st != HIXL_SUCCESS) {
        st = hixl_fail(st, "%s: tensors %u and the %zu after it in memory [0x%" PRIxPTR ", +%" PRIu64 "): %s",
                       fn, t, j - i - 1, sorted[i], tb * (j - i), HixlGetLastErrorMessage());
        goto fail_registered;
      }
    }
  }
  pthread_mutex_lock(&m->lock);
  c->next = m->caches;
  m->caches = c;
  pthread_mutex_unlock(&m->lock);
  free(sorted);
  *cache_id = c->id;
  return HIXL_SUCCESS;

fail_registered:
  for (uint32_t t = 0; t < desc->num_tensors; t++)
    if (c->handles[t])
      HixlEngineDeregisterMem(m->eng, c->handles[t]); /* never an allocation: it is the last step */
  pthread_mutex_lock(&m->lock);
  m->naddrs -= num_addrs;
  pthread_mutex_unlock(&m->lock);
fail_alloc:
  free(sorted);
  if (c) cache_free(c);
  return st;
}

HixlStatus HixlCacheManagerRegisterCache(HixlCacheManager *m, const HixlCacheDesc *desc,
                                         const uintptr_t *addrs, size_t num_addrs, const HixlCacheKey *keys,
                                         size_t num_keys, HixlCacheAccess remote_accessible,
                                         uint64_t *cache_id) {
  return cm_register(m, false, false, desc, (uintptr_t *)addrs, num_addrs, keys, num_keys, NULL,
                     remote_accessible, cache_id, "HixlCacheManagerRegisterCache");
}

HixlStatus HixlCacheManagerAllocateCache(HixlCacheManager *m, const HixlCacheDesc *desc,
                                         const HixlCacheKey *keys, size_t num_keys, uintptr_t *addrs,
                                         size_t num_addrs, uint64_t *cache_id) {
  return cm_register(m, false, true, desc, addrs, num_addrs, keys, num_keys, NULL, HIXL_CACHE_ACCESS_REMOTE,
                     cache_id, "HixlCacheManagerAllocateCache");
}

HixlStatus HixlCacheManagerAllocateBlocksCache(HixlCacheManager *m, const HixlCacheDesc *desc,
                                               const HixlBlocksCacheKey *key, uintptr_t *addrs,
                                               size_t num_addrs, uint64_t *cache_id) {
  const char *fn = "HixlCacheManagerAllocateBlocksCache";
  CHECK_ARG(!key || !m || key->cluster_id == m->cluster_id,
            "%s: the BlocksCacheKey names cluster %" PRIu64 ", this manager is cluster %" PRIu64, fn,
            key ? key->cluster_id : 0, m ? m->cluster_id : 0);
  return cm_register(m, true, true, desc, addrs, num_addrs, NULL, 0, key, HIXL_CACHE_ACCESS_REMOTE, cache_id,
                     fn);
}

HixlStatus HixlCacheManagerRegisterBlocksCache(HixlCacheManager *m, const HixlCacheDesc *desc,
                                               const uintptr_t *addrs, size_t num_addrs,
                                               const HixlBlocksCacheKey *key,
                                               HixlCacheAccess remote_accessible, uint64_t *cache_id) {
  const char *fn = "HixlCacheManagerRegisterBlocksCache";
  CHECK_ARG(!key || !m || key->cluster_id == m->cluster_id,
            "%s: the BlocksCacheKey names cluster %" PRIu64 ", this manager is cluster %" PRIu64, fn,
            key ? key->cluster_id : 0, m ? m->cluster_id : 0);
  return cm_register(m, true, false, desc, (uintptr_t *)addrs, num_addrs, NULL, 0, key, remote_accessible,
                     cache_id, fn);
}

HixlStatus HixlCacheManagerUnregisterCache(HixlCacheManager *m, uint64_t cache_id) {
  const char *fn = "HixlCacheManagerUnregisterCache";
  CHECK_ARG(m, "%s: mgr is NULL", fn);
  pthread_mutex_lock(&m->lock);
  struct cm_cache **pp = &m->caches;
  while (*pp && (*pp)->id != cache_id) pp = &(*pp)->next;
  struct cm_cache *c = *pp;
  HixlStatus st = HIXL_SUCCESS;
  if (!c)
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: cache %" PRIu64 " is not registered with this manager", fn,
                   cache_id);
  else if (c->busy)
    st = hixl_fail(HIXL_FAILED, "%s: cache %" PRIu64 " is in use by %u transfers or tasks", fn, cache_id,
                   c->busy);
  else
    *pp = c->next; /* peers can no longer find it */
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) return st;
  if ((st = cache_deregister(m, c, fn)) != HIXL_SUCCESS) { /* in flight on the engine: keep it */
    pthread_mutex_lock(&m->lock);
    c->next = m->caches;
    m->caches = c;
    pthread_mutex_unlock(&m->lock);
    return st;
  }
  pthread_mutex_lock(&m->lock);
  m->naddrs -= c->desc.num_tensors;
  pthread_mutex_unlock(&m->lock);
  cache_free(c);
  return HIXL_SUCCESS;
}

HixlStatus HixlCacheManagerRemapRegisteredMemory(HixlCacheManager *m, const HixlMemDesc *mems,
                                                 size_t num_mems) {
  (void)mems;
  (void)num_mems;
  CHECK_ARG(m, "HixlCacheManagerRemapRegisteredMemory: mgr is NULL");
  return hixl_fail(HIXL_UNSUPPORTED,
                   "HixlCacheManagerRemapRegisteredMemory: reserved by the seed (device memory "
                   "repair after a UCE fault); hixl has no device memory");
}

HixlStatus HixlCacheManagerGetStats(HixlCacheManager *m, HixlCacheStats *stats) {
  CHECK_ARG(m && stats, "HixlCacheManagerGetStats: mgr or stats output is NULL");
  pthread_mutex_lock(&m->lock);
  *stats = m->stats;
  pthread_mutex_unlock(&m->lock);
  return HIXL_SUCCESS;
}

/* ---- finding a remote cache ---- */

static struct cm_view *view_copy(const struct cm_view *v) {
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

/* Decode a LOOKUP answer; false when it is malformed. */
static bool view_decode(const uint8_t *p, size_t n, struct cm_view *v) {
  struct cm_buf b = {(uint8_t *)p, 0, n, false};
  v->id = get_be(&b, 8);
  uint8_t blocks = (uint8_t)get_be(&b, 1);
  v->blocks = blocks == 1;
  v->n = (uint32_t)get_be(&b, 4);
  v->elem_size = (uint32_t)get_be(&b, 4);
  v->batch_index = (uint32_t)get_be(&b, 4);
  v->shape0 = get_be(&b, 8);
  v->tensor_bytes = get_be(&b, 8);
  if (b.bad || blocks > 1 || v->n == 0 || v->n > HIXL_CACHE_MAX_ADDRS || v->elem_size == 0 ||
      v->shape0 == 0 || v->tensor_bytes == 0 || v->tensor_bytes % v->shape0 != 0 ||
      v->tensor_bytes > (UINT64_C(1) << 48) || (!v->blocks && v->batch_index >= v->shape0) ||
      n != b.len + (size_t)v->n * 8)
    return false;
  v->item_bytes = v->tensor_bytes / v->shape0;
  if (!(v->addrs = malloc(v->n * sizeof(*v->addrs)))) return false;
  for (uint32_t t = 0; t < v->n; t++) {
    uint64_t a = get_be(&b, 8);
    if (a == 0 || a + v->tensor_bytes < a || a > UINTPTR_MAX) {
      free(v->addrs);
      v->addrs = NULL;
      return false;
    }
    v->addrs[t] = (uintptr_t)a;
  }
  return true;
}

/* Forget every view of cache id on cluster. */
static void cm_forget(HixlCacheManager *m, uint64_t cluster, uint64_t id) {
  pthread_mutex_lock(&m->lock);
  struct cm_link *l = link_by_cluster(m, cluster);
  struct cm_view **pp = l ? &l->views : NULL;
  while (pp && *pp) {
    struct cm_view *v = *pp;
    if (v->id == id) {
      *pp = v->next;
      v->next = NULL;
      views_free(v);
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
static HixlStatus cm_find(HixlCacheManager *m, const HixlCacheAnyKey *key, int32_t timeout_ms, const char *fn,
                          struct cm_view **out, char *remote, bool *hit) {
  *hit = false;
  uint64_t cluster = key_cluster(key);
  char tag[CM_TAG_LEN];
  pthread_mutex_lock(&m->lock);
  struct cm_link *l = link_by_cluster(m, cluster);
  struct cm_view *seen = NULL;
  if (l) {
    snprintf(remote, 64, "%s", l->remote);
    for (struct cm_view *v = l->views; v; v = v->next)
      if (key_equal(&v->key, key)) {
        seen = view_copy(v);
        break;
      }
    tag_of(tag, l->nonce, 0);
  }
  uint64_t nonce = l ? l->nonce : 0;
  pthread_mutex_unlock(&m->lock);
  if (!l)
    return hixl_fail(HIXL_NOT_CONNECTED,
                     "%s: cluster %" PRIu64 " is not linked; call HixlCacheManagerLink first", fn, cluster);
  if (seen) {
    tag_of(tag, nonce, seen->id);
    HixlStatus hs = hixl_engine_remote_has(m->eng, remote, seen->addrs, seen->n, seen->tensor_bytes, tag);
    if (hs != HIXL_SUCCESS && hs != HIXL_PARAM_INVALID) { /* the link, not the cache: keep the view */
      views_free(seen);
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
    views_free(seen);
  }
  uint8_t req[64];
  struct cm_buf b = {req, 0, sizeof(req), false};
  put_u8(&b, CM_PROTO);
  put_u8(&b, CM_OP_LOOKUP);
  put_key(&b, key);
  size_t cap = 40 + (size_t)HIXL_CACHE_MAX_ADDRS * 8, n = 0;
  uint8_t *ans = malloc(cap);
  if (!ans) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  HixlStatus st = hixl_engine_call(m->eng, remote, HIXL_SERVICE_CACHE, req, b.len, ans, cap, &n, timeout_ms);
  pthread_mutex_lock(&m->lock);
  m->stats.lookups++;
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) {
    free(ans);
    return hixl_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  }
  struct cm_view *v = calloc(1, sizeof(*v));
  if (!v || !view_decode(ans, n, v)) {
    free(ans);
    free(v);
    return hixl_fail(v ? HIXL_FAILED : HIXL_RESOURCE_EXHAUSTED,
                     "%s: %s gave a malformed cache answer (%zu bytes)", fn, remote, n);
  }
  free(ans);
  v->key = *key;
  struct cm_view *keep = view_copy(v);
  pthread_mutex_lock(&m->lock);
  if (keep && (l = link_by_cluster(m, cluster)) != NULL) {
    if (l->nviews >= CM_REMEMBER_MAX) { /* forget the oldest */
      struct cm_view **pp = &l->views;
      while ((*pp)->next) pp = &(*pp)->next;
      views_free(*pp);
      *pp = NULL;
      l->nviews--;
    }
    keep->next = l->views;
    l->views = keep;
    l->nviews++;
    keep = NULL;
  }
  pthread_mutex_unlock(&m->lock);
  views_free(keep);
  *out = v;
  return HIXL_SUCCESS;
}

/* ---- planning transfers ---- */

struct cm_ops {
  HixlTransferOpDesc *v;
  size_t n, cap;
  uint64_t bytes;
};

static int ops_add(struct cm_ops *o, uintptr_t local, uintptr_t remote, uint64_t len) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    HixlTransferOpDesc *v = realloc(o->v, cap * sizeof(*v));
    if (!v) return -1;
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = (HixlTransferOpDesc){local, remote, (size_t)len};
  o->bytes += len;
  return 0;
}

/* Resolve a layer range [start, start + count) of a cache with layers layers
 * (count 0: every layer). */
static HixlStatus layer_range(const char *fn, const char *side, uint32_t start, uint32_t count,
                              uint32_t layers, uint32_t *s, uint32_t *c) {
  if (count == 0) {
    CHECK_ARG(start == 0, "%s: %s layer range starts at %u but has no count", fn, side, start);
    count = layers;
  }
  CHECK_ARG(start < layers && count <= layers - start, "%s: %s layer range [%u, %u) is outside its %u layers",
            fn, side, start, start + count, layers);
  *s = start;
  *c = count;
  return HIXL_SUCCESS;
}

/* The layers both sides move: tensors per layer dividing both tensor counts, ranges
 * inside both, of one length (and equal, for a push). */
struct cm_layers {
  uint32_t tpl, src_start, dst_start, count;
};

static HixlStatus plan_layers(const char *fn, const HixlCacheTransferArgs *a, uint32_t src_tensors,
                              uint32_t dst_tensors, bool push, struct cm_layers *out) {
  uint32_t tpl = a->tensor_num_per_layer ? a->tensor_num_per_layer : HIXL_CACHE_TENSORS_PER_LAYER;
  CHECK_ARG(tpl <= src_tensors && src_tensors % tpl == 0,
            "%s: tensor_num_per_layer %u must be in [1, %u] and divide the source's %u tensors", fn, tpl,
            src_tensors, src_tensors);
  CHECK_ARG(dst_tensors % tpl == 0,
            "%s: tensor_num_per_layer %u does not divide the destination's %u tensors", fn, tpl, dst_tensors);
  if (push)
    CHECK_ARG(a->src_layer_start == a->dst_layer_start && a->src_layer_count == a->dst_layer_count,
              "%s: source layers [%u, +%u) and destination layers [%u, +%u) differ; a push needs them equal",
              fn, a->src_layer_start, a->src_layer_count, a->dst_layer_start, a->dst_layer_count);
  HixlStatus st;
  uint32_t sc = 0, dc = 0;
  if ((st = layer_range(fn, "source", a->src_layer_start, a->src_layer_count, src_tensors / tpl,
                        &out->src_start, &sc)) != HIXL_SUCCESS ||
      (st = layer_range(fn, "destination", a->dst_layer_start, a->dst_layer_count, dst_tensors / tpl,
                        &out->dst_start, &dc)) != HIXL_SUCCESS)
    return st;
  CHECK_ARG(sc == dc, "%s: %u source layers (%u tensors) against %u destination layers (%u tensors)", fn, sc,
            src_tensors, dc, dst_tensors);
  out->tpl = tpl;
  out->count = sc;
  return HIXL_SUCCESS;
}

/* Block pairs (sb[j], db[j]) as runs adjacent on both sides, each one op per tensor
 * of the layers; sb NULL: source offsets j * bs from src_base (a contiguous item). */
static int plan_blocks(struct cm_ops *o, const struct cm_layers *ly, const uintptr_t *src_addrs,
                       uint64_t src_off, const uintptr_t *dst_addrs, const uint64_t *sb, const uint64_t *db,
                       size_t nb, uint64_t bs, bool local_is_src) {
  for (uint32_t li = 0; li < ly->count; li++)
    for (uint32_t t = 0; t < ly->tpl; t++) {
      uintptr_t sa = src_addrs[(ly->src_start + li) * ly->tpl + t] + src_off;
      uintptr_t da = dst_addrs[(ly->dst_start + li) * ly->tpl + t];
      for (size_t j = 0; j < nb;) {
        size_t k = j + 1;
        uint64_t s0 = sb ? sb[j] : j;
        while (k < nb && (sb ? sb[k] : k) == s0 + (k - j) && db[k] == db[j] + (k - j)) k++;
        uintptr_t s = sa + s0 * bs, d = da + db[j] * bs;
        if (ops_add(o, local_is_src ? s : d, local_is_src ? d : s, (k - j) * bs) < 0) return -1;
        j = k;
      }
    }
  return 0;
}

/* hixl_cache_push_blocks_then_call: the last batch leaves with a call behind it. */
struct cm_then {
  uint16_t service;
  const void *req;
  size_t len;
  void *resp;
  size_t cap;
  uint32_t *resp_len;
  hixl_call_t *call;
};

/* Run ops against remote, in engine-sized batches within one deadline; with then, the
 * last batch is started with its call and not waited for. */
static HixlStatus run_ops(HixlCacheManager *m, const char *remote, HixlTransferOp op, const struct cm_ops *o,
                          int32_t timeout_ms, const struct cm_then *then, const char *fn) {
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  HixlStatus st = HIXL_SUCCESS;
  size_t calls = 0;
  for (size_t i = 0; i < o->n && st == HIXL_SUCCESS; i += HIXL_MAX_BATCH) {
    size_t k = o->n - i < HIXL_MAX_BATCH ? o->n - i : HIXL_MAX_BATCH;
    uint64_t now = hixl_now_ns();
    if (now >= deadline) return hixl_fail(HIXL_TIMEOUT, "%s: timed out after %zu of %zu ops", fn, i, o->n);
    int32_t left = (int32_t)((deadline - now + 999999) / 1000000);
    if (then && i + k == o->n)
      st = hixl_engine_transfer_then_call(m->eng, remote, op, o->v + i, k, then->service, then->req,
                                          then->len, then->resp, then->cap, then->resp_len, left, then->call);
    else
      st = HixlEngineTransferSync(m->eng, remote, op, o->v + i, k, left);
    calls++;
  }
  pthread_mutex_lock(&m->lock);
  m->stats.transfers += calls;
  m->stats.engine_ops += o->n;
  if (st == HIXL_SUCCESS) m->stats.bytes += o->bytes;
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) return hixl_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  return HIXL_SUCCESS;
}

/* Pin a local cache (busy) and copy what the plan needs; NULL with the failure. */
static struct cm_cache *pin_cache(HixlCacheManager *m, uint64_t id, const char *fn, HixlStatus *st) {
  pthread_mutex_lock(&m->lock);
  struct cm_cache *c = cache_by_id(m, id);
  if (c) c->busy++;
  pthread_mutex_unlock(&m->lock);
  if (!c)
    *st = hixl_fail(HIXL_PARAM_INVALID, "%s: cache %" PRIu64 " is not registered with this manager", fn, id);
  return c;
}

static void unpin_cache(HixlCacheManager *m, struct cm_cache *c) {
  pthread_mutex_lock(&m->lock);
  c->busy--;
  pthread_mutex_unlock(&m->lock);
}

static const HixlCacheTransferArgs default_args = HIXL_CACHE_TRANSFER_ARGS_INIT;

static HixlStatus check_key(const HixlCacheAnyKey *k, const char *fn) {
  CHECK_ARG(k, "%s: key is NULL", fn);
  CHECK_ARG(k->kind == HIXL_CACHE_KEY_REQ || k->kind == HIXL_CACHE_KEY_ID || k->kind == HIXL_CACHE_KEY_BLOCKS,
            "%s: key kind %d is unknown", fn, (int)k->kind);
  return HIXL_SUCCESS;
}

static HixlStatus check_blocks(const uint64_t *v, size_t n, uint64_t limit, const char *fn, const char *what,
                               uint64_t cluster) {
  CHECK_ARG(n == 0 || v, "%s: %s is NULL but has %zu entries", fn, what, n);
  for (size_t j = 0; j < n; j++)
    CHECK_ARG(v[j] < limit,
              "%s: %s[%zu] = %" PRIu64 " is outside the %" PRIu64 " blocks of the cache on cluster %" PRIu64,
              fn, what, j, v[j], limit, cluster);
  return HIXL_SUCCESS;
}

/* pull_cache and push_cache: one batch item of each tensor of the layers. */
static HixlStatus cm_item(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                          uint32_t local_batch, const HixlCacheTransferArgs *a, bool push, const char *fn) {
  HixlStatus st;
  if (!a) a = &default_args;
  CHECK_ARG(m, "%s: mgr is NULL", fn);
  if ((st = check_key(key, fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(a->size == -1 || a->size > 0, "%s: size %" PRId64 " must be -1 (a whole item) or > 0", fn,
            a->size);
  CHECK_ARG(a->timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, a->timeout_ms);
  struct cm_cache *c = pin_cache(m, local_id, fn, &st);
  if (!c) return st;
  struct cm_view *v = NULL;
  struct cm_ops ops = {0};
  char remote[64];
  uint64_t here = m->cluster_id;
  if (c->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: local cache %" PRIu64 " is a blocks cache; use the blocks calls",
                   fn, c->id);
    goto out;
  }
  if (local_batch >= c->desc.shape[0]) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: batch index %u is outside local cache %" PRIu64 "'s batch of %" PRIu64, fn,
                   local_batch, c->id, c->desc.shape[0]);
    goto out;
  }
  uint64_t there = key_cluster(key);
  bool hit;
retry:
  if ((st = cm_find(m, key, a->timeout_ms, fn, &v, remote, &hit)) != HIXL_SUCCESS) goto out;
  if (v->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: cache %" PRIu64 " on cluster %" PRIu64 " is a blocks cache; use the blocks calls", fn,
                   v->id, there);
    goto out;
  }
  if (v->elem_size != c->desc.elem_size) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: element size %u on cluster %" PRIu64 " (cache %" PRIu64
                   ") against %u here (cache %" PRIu64 ")",
                   fn, v->elem_size, there, v->id, c->desc.elem_size, here == there ? c->id : c->id);
    goto out;
  }
  uint64_t size = a->size == -1 ? c->item_bytes : (uint64_t)a->size;
  if (size > c->item_bytes || size > v->item_bytes) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: %" PRIu64 " bytes per tensor, but a batch item is %" PRIu64
                   " bytes here (cache %" PRIu64 ") and %" PRIu64 " on cluster %" PRIu64 " (cache %" PRIu64
                   ")",
                   fn, size, c->item_bytes, c->id, v->item_bytes, there, v->id);
    goto out;
  }
  struct cm_layers ly;
  if ((st = plan_layers(fn, a, push ? c->desc.num_tensors : v->n, push ? v->n : c->desc.num_tensors, push,
                        &ly)) != HIXL_SUCCESS)
    goto out;
  const uintptr_t *sa = push ? c->addrs : v->addrs, *da = push ? v->addrs : c->addrs;
  uint64_t soff = push ? local_batch * c->item_bytes : v->batch_index * v->item_bytes;
  uint64_t doff = push ? v->batch_index * v->item_bytes : local_batch * c->item_bytes;
  for (uint32_t li = 0; li < ly.count; li++)
    for (uint32_t t = 0; t < ly.tpl; t++) {
      uintptr_t s = sa[(ly.src_start + li) * ly.tpl + t] + soff,
                d = da[(ly.dst_start + li) * ly.tpl + t] + doff;
      if (ops_add(&ops, push ? s : d, push ? d : s, size) < 0) {
        st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        goto out;
      }
    }
  st = run_ops(m, remote, push ? HIXL_WRITE : HIXL_READ, &ops, a->timeout_ms, NULL, fn);
  if (st != HIXL_SUCCESS && st != HIXL_TIMEOUT && hit) {
    /* What was remembered may be stale (the peer's MEM_DEL still on its way): ask
     * once more; that answer comes after every MEM_DEL the peer sent before it. */
    cm_forget(m, there, v->id);
    views_free(v);
    v = NULL;
    ops.n = 0;
    ops.bytes = 0;
    goto retry;
  }
out:
  free(ops.v);
  views_free(v);
  unpin_cache(m, c);
  return st;
}

HixlStatus HixlCacheManagerPullCache(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t cache_id,
                                     uint32_t batch_index, const HixlCacheTransferArgs *args) {
  return cm_item(m, key, cache_id, batch_index, args, false, "HixlCacheManagerPullCache");
}

HixlStatus HixlCacheManagerPushCache(HixlCacheManager *m, const HixlCacheKeyByIdAndIndex *dst_key,
                                     uint64_t src_cache_id, uint32_t src_batch_index,
                                     const HixlCacheTransferArgs *args) {
  CHECK_ARG(dst_key, "HixlCacheManagerPushCache: dst_key is NULL");
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_ID, .u.id = *dst_key};
  return cm_item(m, &k, src_cache_id, src_batch_index, args, true, "HixlCacheManagerPushCache");
}

/* pull_blocks and push_blocks. With then (a push), the transfer's last batch is started
 * with its call and the local cache stays pinned on success: hixl_cache_unpin lets it
 * go. */
static HixlStatus cm_blocks(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                            const uint64_t *sb, size_t nsb, const uint64_t *db, size_t ndb,
                            const HixlCacheTransferArgs *a, bool push, const struct cm_then *then,
                            const char *fn) {
  HixlStatus st;
  if (!a) a = &default_args;
  CHECK_ARG(m, "%s: mgr is NULL", fn);
  if ((st = check_key(key, fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(a->size == -1, "%s: size %" PRId64 " applies to pull_cache and push_cache only (use -1)", fn,
            a->size);
  CHECK_ARG(a->timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, a->timeout_ms);
  CHECK_ARG(ndb > 0 && db, "%s: dst_blocks is empty", fn);
  CHECK_ARG(nsb == 0 || sb, "%s: src_blocks is NULL but has %zu entries", fn, nsb);
  struct cm_cache *c = pin_cache(m, local_id, fn, &st);
  if (!c) return st;
  struct cm_view *v = NULL;
  struct cm_ops ops = {0};
  char remote[64];
  uint64_t there = key_cluster(key), here = m->cluster_id;
  /* The blocks side (the destination) and the source side, whichever is local. */
  bool src_blocks_side = push ? c->blocks : key->kind == HIXL_CACHE_KEY_BLOCKS;
  if (!push && !c->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: local cache %" PRIu64 " is not a blocks cache", fn, c->id);
    goto out;
  }
  bool hit;
retry:
  if ((st = cm_find(m, key, a->timeout_ms, fn, &v, remote, &hit)) != HIXL_SUCCESS) goto out;
  if (push && !v->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: cache %" PRIu64 " on cluster %" PRIu64 " is not a blocks cache",
                   fn, v->id, there);
    goto out;
  }
  if (!push && src_blocks_side != v->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: the key names %s cache %" PRIu64 " on cluster %" PRIu64, fn,
                   v->blocks ? "blocks" : "contiguous", v->id, there);
    goto out;
  }
  if (v->elem_size != c->desc.elem_size) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: element size %u on cluster %" PRIu64 " (cache %" PRIu64
                   ") against %u on cluster %" PRIu64 " (cache %" PRIu64 ")",
                   fn, v->elem_size, there, v->id, c->desc.elem_size, here, c->id);
    goto out;
  }
  /* Sizes: the destination's block; a blocks source must match it. */
  uint64_t dbs = push ? v->item_bytes : c->item_bytes, dnb = push ? v->shape0 : c->desc.shape[0];
  uint64_t src_item = push ? c->item_bytes : v->item_bytes, snb = push ? c->desc.shape[0] : v->shape0;
  if (src_blocks_side) {
    if (src_item != dbs) {
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: block size %" PRIu64 " bytes on cluster %" PRIu64 " (cache %" PRIu64
                     ") against %" PRIu64 " on cluster %" PRIu64 " (cache %" PRIu64 ")",
                     fn, v->item_bytes, there, v->id, c->item_bytes, here, c->id);
      goto out;
    }
    if (nsb != ndb) {
      st =
          hixl_fail(HIXL_PARAM_INVALID, "%s: %zu source blocks against %zu destination blocks", fn, nsb, ndb);
      goto out;
    }
    if ((st = check_blocks(sb, nsb, snb, fn, "src_blocks", push ? here : there)) != HIXL_SUCCESS) goto out;
  } else {
    if (nsb != 0) {
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: src_blocks must be empty when the source is a contiguous cache",
                     fn);
      goto out;
    }
    if (ndb * dbs > src_item) {
      st =
          hixl_fail(HIXL_PARAM_INVALID,
                    "%s: %zu blocks of %" PRIu64 " bytes exceed the source's batch item of %" PRIu64 " bytes",
                    fn, ndb, dbs, src_item);
      goto out;
    }
  }
  if ((st = check_blocks(db, ndb, dnb, fn, "dst_blocks", push ? there : here)) != HIXL_SUCCESS) goto out;
  struct cm_layers ly;
  if ((st = plan_layers(fn, a, push ? c->desc.num_tensors : v->n, push ? v->n : c->desc.num_tensors, push,
                        &ly)) != HIXL_SUCCESS)
    goto out;
  const uintptr_t *sa = push ? c->addrs : v->addrs, *da = push ? v->addrs : c->addrs;
  /* A contiguous source: its item (the key's for a pull, item 0 for a push). */
  uint64_t soff = src_blocks_side ? 0 : push ? 0 : v->batch_index * v->item_bytes;
  if (plan_blocks(&ops, &ly, sa, soff, da, src_blocks_side ? sb : NULL, db, ndb, dbs, push) < 0) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto out;
  }
  st = run_ops(m, remote, push ? HIXL_WRITE : HIXL_READ, &ops, a->timeout_ms, then, fn);
  if (st != HIXL_SUCCESS && st != HIXL_TIMEOUT && hit) { /* as in cm_item */
    cm_forget(m, there, v->id);
    views_free(v);
    v = NULL;
    ops.n = 0;
    ops.bytes = 0;
    goto retry;
  }
out:
  free(ops.v);
  views_free(v);
  if (!then || st != HIXL_SUCCESS) unpin_cache(m, c);
  return st;
}

HixlStatus HixlCacheManagerPullBlocks(HixlCacheManager *m, const HixlCacheAnyKey *src_key,
                                      uint64_t dst_cache_id, const uint64_t *src_blocks,
                                      size_t num_src_blocks, const uint64_t *dst_blocks,
                                      size_t num_dst_blocks, const HixlCacheTransferArgs *args) {
  return cm_blocks(m, src_key, dst_cache_id, src_blocks, num_src_blocks, dst_blocks, num_dst_blocks, args,
                   false, NULL, "HixlCacheManagerPullBlocks");
}

HixlStatus HixlCacheManagerPushBlocks(HixlCacheManager *m, const HixlBlocksCacheKey *dst_key,
                                      uint64_t src_cache_id, const uint64_t *src_blocks,
                                      size_t num_src_blocks, const uint64_t *dst_blocks,
                                      size_t num_dst_blocks, const HixlCacheTransferArgs *args) {
  CHECK_ARG(dst_key, "HixlCacheManagerPushBlocks: dst_key is NULL");
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = *dst_key};
  return cm_blocks(m, &k, src_cache_id, src_blocks, num_src_blocks, dst_blocks, num_dst_blocks, args, true,
                   NULL, "HixlCacheManagerPushBlocks");
}

HixlStatus hixl_cache_push_blocks_then_call(HixlCacheManager *m, const HixlBlocksCacheKey *dst_key,
                                            uint64_t src_cache_id, const uint64_t *src_blocks, size_t nsrc,
                                            const uint64_t *dst_blocks, size_t ndst,
                                            const HixlCacheTransferArgs *args, uint16_t service,
                                            const void *req, size_t len, void *resp, size_t cap,
                                            uint32_t *resp_len, hixl_call_t *call) {
  const char *fn = "hixl_cache_push_blocks_then_call";
  CHECK_ARG(dst_key && call, "%s: dst_key or call is NULL", fn);
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = *dst_key};
  struct cm_then t = {service, req, len, resp, cap, resp_len, call};
  return cm_blocks(m, &k, src_cache_id, src_blocks, nsrc, dst_blocks, ndst, args, true, &t, fn);
}

void hixl_cache_unpin(HixlCacheManager *m, uint64_t cache_id) {
  pthread_mutex_lock(&m->lock);
  struct cm_cache *c = cache_by_id(m, cache_id);
  if (c && c->busy > 0) c->busy--;
  pthread_mutex_unlock(&m->lock);
}

/* ---- transfer_cache_async: a thread per task sends layer after layer ---- */

struct cm_conf {
  char remote[64];
  uintptr_t *dst_addrs;
  uint32_t layer_start, layer_count, batch;
  HixlStatus st;
  char why[320];
  HixlTransferReq *reqs; /* in flight */
  size_t nreqs, cap;
};

struct HixlCacheTask {
  HixlCacheManager *mgr;
  struct cm_cache *cache; /* pinned */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done, stop;
  HixlLayerSynchronizer sync;
  struct cm_conf *conf;
  size_t nconf;
  uint64_t *sb, *db; /* copies */
  size_t nsb, ndb;
  uint64_t dbms; /* destination block bytes; 0: a contiguous destination */
  uint32_t tpl;
  uint64_t deadline;
};

static void conf_fail(struct cm_conf *cf, HixlStatus st, const char *why) {
  if (cf->st != HIXL_SUCCESS) return;
  cf->st = st;
  snprintf(cf->why, sizeof(cf->why), "%s", why);
}

/* Poll cf's requests; drop the ended ones. */
static void conf_poll(HixlCacheTask *t, struct cm_conf *cf) {
  size_t k = 0;
  for (size_t i = 0; i < cf->nreqs; i++) {
    HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
    HixlStatus st = HixlEngineGetTransferStatus(t->mgr->eng, cf->reqs[i], &ts);
    if (st != HIXL_SUCCESS) {
      conf_fail(cf, st, HixlGetLastErrorMessage());
      continue;
    }
    if (ts == HIXL_TRANSFER_WAITING) {
      cf->reqs[k++] = cf->reqs[i];
    } else if (ts != HIXL_TRANSFER_COMPLETED) {
      char why[320];
      snprintf(why, sizeof(why), "a layer to %s %s: %s", cf->remote,
               ts == HIXL_TRANSFER_TIMEOUT ? "timed out" : "failed", HixlGetLastErrorMessage());
      conf_fail(cf, ts == HIXL_TRANSFER_TIMEOUT ? HIXL_TIMEOUT : HIXL_FAILED, why);
    }
  }
  cf->nreqs = k;
}

static int32_t ms_left(uint64_t deadline) {
  uint64_t now = hixl_now_ns();
  return now >= deadline ? 0 : (int32_t)((deadline - now + 999999) / 1000000);
}

/* Layer l of the source to cf: one async WRITE of its tensors' items or blocks. */
static void send_layer(HixlCacheTask *t, struct cm_conf *cf, uint32_t l) {
  struct cm_cache *c = t->cache;
  struct cm_ops ops = {0};
  struct cm_layers ly = {t->tpl, l, l - cf->layer_start, 1};
  HixlStatus st = HIXL_SUCCESS;
  if (t->dbms == 0) { /* contiguous destination: the item, whole */
    for (uint32_t k = 0; k < t->tpl && st == HIXL_SUCCESS; k++)
      if (ops_add(&ops, c->addrs[l * t->tpl + k] + cf->batch * c->item_bytes,
                  cf->dst_addrs[(l - cf->layer_start) * t->tpl + k], c->item_bytes) < 0)
        st = HIXL_RESOURCE_EXHAUSTED;
  } else if (plan_blocks(&ops, &ly, c->addrs, c->blocks ? 0 : cf->batch * c->item_bytes, cf->dst_addrs,
                         c->blocks ? t->sb : NULL, t->db, t->ndb, t->dbms, true) < 0) {
    st = HIXL_RESOURCE_EXHAUSTED;
  }
  if (st == HIXL_SUCCESS && cf->nreqs == cf->cap) {
    size_t cap = cf->cap ? cf->cap * 2 : 16;
    HixlTransferReq *v = realloc(cf->reqs, cap * sizeof(*v));
    if (v) {
      cf->reqs = v;
      cf->cap = cap;
    } else {
      st = HIXL_RESOURCE_EXHAUSTED;
    }
  }
  if (st != HIXL_SUCCESS) {
    conf_fail(cf, st, "out of memory");
    free(ops.v);
    return;
  }
  int32_t left = ms_left(t->deadline);
  HixlTransferReq r = NULL;
  st = left > 0 ? HixlEngineTransferAsync(t->mgr->eng, cf->remote, HIXL_WRITE, ops.v, ops.n, left, NULL, &r)
                : HIXL_TIMEOUT;
  if (st == HIXL_SUCCESS) cf->reqs[cf->nreqs++] = r;
  char why[320];
  if (st == HIXL_TIMEOUT)
    snprintf(why, sizeof(why), "layer %u was not sent to %s before the task's deadline", l, cf->remote);
  else
    snprintf(why, sizeof(why), "layer %u to %s: %s", l, cf->remote, HixlGetLastErrorMessage());
  if (st != HIXL_SUCCESS) conf_fail(cf, st, why);
  pthread_mutex_lock(&t->mgr->lock);
  t->mgr->stats.transfers++;
  t->mgr->stats.engine_ops += ops.n;
  if (st == HIXL_SUCCESS) t->mgr->stats.bytes += ops.bytes;
  pthread_mutex_unlock(&t->mgr->lock);
  free(ops.v);
}

static bool task_stopped(HixlCacheTask *t) {
  pthread_mutex_lock(&t->lock);
  bool s = t->stop;
  pthread_mutex_unlock(&t->lock);
  return s;
}

static void *task_main(void *arg) {
  HixlCacheTask *t = arg;
  uint32_t lo = UINT32_MAX, hi = 0;
  for (size_t i = 0; i < t->nconf; i++) {
    if (t->conf[i].layer_start < lo) lo = t->conf[i].layer_start;
    if (t->conf[i].layer_start + t->conf[i].layer_count > hi)
      hi = t->conf[i].layer_start + t->conf[i].layer_count;
  }
  for (uint32_t l = lo; l < hi; l++) {
    bool wanted = false;
    for (size_t i = 0; i < t->nconf; i++) {
      struct cm_conf *cf = &t->conf[i];
      conf_poll(t, cf); /* earlier layers keep flowing meanwhile */
      wanted |= cf->st == HIXL_SUCCESS && l >= cf->layer_start && l < cf->layer_start + cf->layer_count;
    }
    if (!wanted) continue;
    char why[320];
    int32_t left = ms_left(t->deadline);
    int32_t per = t->sync.timeout_ms ? t->sync.timeout_ms : HIXL_DEFAULT_TIMEOUT_MS;
    HixlStatus st = HIXL_SUCCESS;
    if (task_stopped(t)) {
      snprintf(why, sizeof(why), "the task was destroyed before layer %u was sent", l);
      st = HIXL_FAILED;
    } else if (left == 0) {
      snprintf(why, sizeof(why), "layer %u was not sent before the task's deadline", l);
      st = HIXL_TIMEOUT;
    } else if (!t->sync.synchronize_layer(t->sync.ctx, l, per < left ? per : left)) {
      snprintf(why, sizeof(why), "layer %u was not ready within %d ms (the layer synchronizer said so)", l,
               per < left ? per : left);
      st = ms_left(t->deadline) == 0 ? HIXL_TIMEOUT : HIXL_FAILED;
    }
    for (size_t i = 0; i < t->nconf; i++) {
      struct cm_conf *cf = &t->conf[i];
      if (cf->st != HIXL_SUCCESS || l < cf->layer_start || l >= cf->layer_start + cf->layer_count) continue;
      if (st != HIXL_SUCCESS)
        conf_fail(cf, st, why);
      else
        send_layer(t, cf, l);
    }
  }
  /* Every request ends by its deadline (the task's), so this ends. */
  for (;;) {
    size_t pending = 0;
    for (size_t i = 0; i < t->nconf; i++) {
      conf_poll(t, &t->conf[i]);
      pending += t->conf[i].nreqs;
    }
    if (!pending) break;
    struct timespec ts = {0, 20000}; /* the engine has no wait on async requests: poll */
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&t->lock);
  t->done = true;
  pthread_cond_broadcast(&t->cond);
  pthread_mutex_unlock(&t->lock);
  return NULL;
}

static void task_free(HixlCacheTask *t) {
  for (size_t i = 0; t->conf && i < t->nconf; i++) {
    free(t->conf[i].dst_addrs);
    free(t->conf[i].reqs);
  }
  free(t->conf);
  free(t->sb);
  free(t->db);
  pthread_cond_destroy(&t->cond);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

static uint64_t *dup_u64(const uint64_t *v, size_t n) {
  uint64_t *c = malloc((n ? n : 1) * sizeof(*c));
  if (c && n) memcpy(c, v, n * sizeof(*c));
  return c;
}

HixlStatus HixlCacheManagerTransferCacheAsync(HixlCacheManager *m, uint64_t src_cache_id,
                                              const HixlLayerSynchronizer *sync,
                                              const HixlCacheTransferConfig *configs, size_t num_configs,
                                              const HixlCacheAsyncArgs *args, HixlCacheTask **task) {
  const char *fn = "HixlCacheManagerTransferCacheAsync";
  static const HixlCacheAsyncArgs none = {0};
  HixlStatus st;
  CHECK_ARG(m && sync && sync->synchronize_layer && configs && task,
            "%s: mgr, layer synchronizer, configs or task output is NULL", fn);
  CHECK_ARG(num_configs >= 1 && num_configs <= HIXL_CACHE_MAX_CONFIGS,
            "%s: num_configs %zu is not in [1, %d]", fn, num_configs, HIXL_CACHE_MAX_CONFIGS);
  CHECK_ARG(sync->timeout_ms >= 0, "%s: the synchronizer's timeout_ms %d is negative", fn, sync->timeout_ms);
  if (!args) args = &none;
  CHECK_ARG(args->timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, args->timeout_ms);
  CHECK_ARG(args->num_src_blocks == 0 || args->src_block_indices, "%s: src_block_indices is NULL", fn);
  CHECK_ARG(args->num_dst_blocks == 0 || args->dst_block_indices, "%s: dst_block_indices is NULL", fn);
  struct cm_cache *c = pin_cache(m, src_cache_id, fn, &st);
  if (!c) return st;
  HixlCacheTask *t = calloc(1, sizeof(*t));
  if (!t) {
    unpin_cache(m, c);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  pthread_condattr_t ca; /* deadlines are CLOCK_MONOTONIC, as the engine's */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->cond, &ca);
  pthread_condattr_destroy(&ca);
  t->mgr = m;
  t->cache = c;
  t->sync = *sync;
  t->tpl = args->tensor_num_per_layer ? args->tensor_num_per_layer : HIXL_CACHE_TENSORS_PER_LAYER;
  t->deadline = hixl_deadline_ns(args->timeout_ms);
  uint32_t n = c->desc.num_tensors;
  st = HIXL_SUCCESS;
  if (t->tpl > n || n % t->tpl != 0) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: tensor_num_per_layer %u must divide cache %" PRIu64 "'s %u tensors", fn, t->tpl,
                   c->id, n);
  } else if (c->blocks) {
    if (!args->dst_block_indices)
      st = hixl_fail(HIXL_UNSUPPORTED,
                     "%s: a blocks source needs a blocks destination (dst_block_indices), as the seed", fn);
    else if (args->num_src_blocks != args->num_dst_blocks || args->num_src_blocks == 0)
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: %zu source blocks against %zu destination blocks", fn,
                     args->num_src_blocks, args->num_dst_blocks);
    else if (args->dst_block_memory_size && args->dst_block_memory_size != c->item_bytes)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: dst_block_memory_size %" PRIu64 " against the source's blocks of %" PRIu64 " bytes",
                     fn, args->dst_block_memory_size, c->item_bytes);
    else
      st = check_blocks(args->src_block_indices, args->num_src_blocks, c->desc.shape[0], fn,
                        "src_block_indices", m->cluster_id);
    t->dbms = c->item_bytes;
  } else if (args->dst_block_indices) {
    if (args->num_src_blocks)
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: src_block_indices given for contiguous cache %" PRIu64, fn,
                     c->id);
    else if (!args->dst_block_memory_size || args->num_dst_blocks == 0)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: a contiguous source into blocks needs dst_block_memory_size and blocks", fn);
    else if (args->num_dst_blocks * args->dst_block_memory_size > c->item_bytes)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: %zu blocks of %" PRIu64 " bytes exceed the batch item of %" PRIu64 " bytes", fn,
                     args->num_dst_blocks, args->dst_block_memory_size, c->item_bytes);
    t->dbms = args->dst_block_memory_size;
  } else if (args->num_src_blocks) {
    st =
        hixl_fail(HIXL_PARAM_INVALID, "%s: src_block_indices given for contiguous cache %" PRIu64, fn, c->id);
  }
  if (st == HIXL_SUCCESS && (!(t->sb = dup_u64(args->src_block_indices, args->num_src_blocks)) ||
                             !(t->db = dup_u64(args->dst_block_indices, args->num_dst_blocks)) ||
                             !(t->conf = calloc(num_configs, sizeof(*t->conf)))))
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  t->nsb = args->num_src_blocks;
  t->ndb = args->num_dst_blocks;
  t->nconf = t->conf ? num_configs : 0;
  for (size_t i = 0; i < t->nconf && st == HIXL_SUCCESS; i++) {
    const HixlCacheTransferConfig *g = &configs[i];
    struct cm_conf *cf = &t->conf[i];
    uint32_t s = 0, cnt = 0;
    pthread_mutex_lock(&m->lock);
    struct cm_link *l = link_by_cluster(m, g->dst_cluster_id);
    if (l) snprintf(cf->remote, sizeof(cf->remote), "%s", l->remote);
    pthread_mutex_unlock(&m->lock);
    if (!l) {
      st = hixl_fail(HIXL_NOT_CONNECTED, "%s: config %zu: cluster %" PRIu64 " is not linked", fn, i,
                     g->dst_cluster_id);
      break;
    }
    char side[48];
    snprintf(side, sizeof(side), "config %zu's source", i);
    if ((st = layer_range(fn, side, g->src_layer_start, g->src_layer_count, n / t->tpl, &s, &cnt)) !=
        HIXL_SUCCESS)
      break;
    if (!g->dst_addrs || g->num_dst_addrs != (size_t)cnt * t->tpl) {
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: config %zu has %zu dst_addrs for %u layers of %u tensors", fn,
                     i, g->dst_addrs ? g->num_dst_addrs : 0, cnt, t->tpl);
      break;
    }
    if (!c->blocks && g->src_batch_index >= c->desc.shape[0]) {
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: config %zu's src_batch_index %u is outside the batch of %" PRIu64, fn, i,
                     g->src_batch_index, c->desc.shape[0]);
      break;
    }
    if (!(cf->dst_addrs = malloc(g->num_dst_addrs * sizeof(*cf->dst_addrs)))) {
      st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
      break;
    }
    memcpy(cf->dst_addrs, g->dst_addrs, g->num_dst_addrs * sizeof(*cf->dst_addrs));
    cf->layer_start = s;
    cf->layer_count = cnt;
    cf->batch = g->src_batch_index;
  }
  if (st == HIXL_SUCCESS) {
    pthread_mutex_lock(&m->lock);
    m->tasks++;
    pthread_mutex_unlock(&m->lock);
    int rc = pthread_create(&t->thread, NULL, task_main, t);
    if (rc != 0) {
      pthread_mutex_lock(&m->lock);
      m->tasks--;
      pthread_mutex_unlock(&m->lock);
      st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: pthread_create: %s", fn, strerror(rc));
    }
  }
  if (st != HIXL_SUCCESS) {
    task_free(t);
    unpin_cache(m, c);
    return st;
  }
  *task = t;
  return HIXL_SUCCESS;
}

/* The task's first failure, with its reason as the thread's error. Task lock held. */
static HixlStatus task_status(HixlCacheTask *t) {
  for (size_t i = 0; i < t->nconf; i++)
    if (t->conf[i].st != HIXL_SUCCESS)
      return hixl_fail(t->conf[i].st, "cache task: config %zu: %s", i, t->conf[i].why);
  return HIXL_SUCCESS;
}

HixlStatus HixlCacheTaskSynchronize(HixlCacheTask *t, int32_t timeout_ms) {
  CHECK_ARG(t, "HixlCacheTaskSynchronize: task is NULL");
  CHECK_ARG(timeout_ms >= 0, "HixlCacheTaskSynchronize: timeout_ms %d is negative", timeout_ms);
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&t->lock);
  while (!t->done)
    if (pthread_cond_timedwait(&t->cond, &t->lock, &ts) == ETIMEDOUT) break;
  HixlStatus st =
      t->done ? task_status(t)
              : hixl_fail(HIXL_TIMEOUT, "HixlCacheTaskSynchronize: the task is still running after %d ms",
                          timeout_ms ? timeout_ms : HIXL_DEFAULT_TIMEOUT_MS);
  pthread_mutex_unlock(&t->lock);
  return st;
}

HixlStatus HixlCacheTaskGetResults(HixlCacheTask *t, HixlStatus *results, size_t num_results) {
  CHECK_ARG(t && results, "HixlCacheTaskGetResults: task or results is NULL");
  pthread_mutex_lock(&t->lock);
  HixlStatus st = HIXL_SUCCESS;
  if (!t->done)
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "HixlCacheTaskGetResults: the task is still running; Synchronize first");
  else if (num_results != t->nconf)
    st = hixl_fail(HIXL_PARAM_INVALID, "HixlCacheTaskGetResults: %zu results asked for %zu configs",
                   num_results, t->nconf);
  else
    for (size_t i = 0; i < t->nconf; i++) results[i] = t->conf[i].st;
  pthread_mutex_unlock(&t->lock);
  return st;
}

HixlStatus HixlCacheTaskDestroy(HixlCacheTask *t) {
  CHECK_ARG(t, "HixlCacheTaskDestroy: task is NULL");
  pthread_mutex_lock(&t->lock);
  t->stop = true;
  pthread_mutex_unlock(&t->lock);
  pthread_join(t->thread, NULL);
  HixlCacheManager *m = t->mgr;
  unpin_cache(m, t->cache);
  pthread_mutex_lock(&m->lock);
  m->tasks--;
  pthread_mutex_unlock(&m->lock);
  task_free(t);
  return HIXL_SUCCESS;
}
