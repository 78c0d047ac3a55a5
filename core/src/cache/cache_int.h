/* cache_int: the cache manager's state, and what its files call of each other. */
/* The files call only downward (no cycle, tests/check_layers.sh): cache_codec.c and
 * cache_index.c at the bottom; cache_reg.c, cache_service.c and cache_lookup.c on them;
 * cache.c (the manager's life) and cache_plan.c (pull and push) on those; cache_async.c
 * at the top. */
#ifndef HIXL_CACHE_INT_H
#define HIXL_CACHE_INT_H
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_cache.h"
#include "util/be.h"
#include "util/opvec.h"
#include "util/status_int.h"

#define CM_PROTO     1u /* the CACHE service's request layout */
#define CM_OP_HELLO  1u /* -> cluster u64, nonce u64 */
#define CM_OP_LOOKUP 2u /* key -> layout and addresses */
#define CM_TAG_LEN   64

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return hixl_fail(HIXL_PARAM_INVALID, __VA_ARGS__);                                          \
  } while (0)

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
  bool listed;        /* in mgr->caches, where peers' lookups find it (pending: its keys only taken) */
  uint32_t busy;      /* transfers and tasks using it */
  uint32_t then_pins; /* of busy: left by hixl_cache_push_blocks_then_call, for hixl_cache_unpin */
  bool allocated;     /* AllocateCache: handles[0] is the engine's allocation holding every tensor */
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

/* A key of the index: kind, then the key's fields (a CacheKey's req, model, prefix; a
 * BlocksCacheKey's model). */
enum { CM_IX_REQ = 1, CM_IX_BLOCKS = 2 };
struct cm_ixkey {
  uint32_t kind;
  uint64_t a, b, c;
};

struct cm_slot {
  uint64_t a, b, c;
  struct cm_cache *cache; /* NULL: an empty slot */
  uint32_t batch;         /* the batch item a CacheKey names */
  uint32_t kind;
};

/* Every key of the manager's caches, pending ones' too (cache_index.c); zeroed: empty. */
struct cm_index {
  struct cm_slot *slots;
  size_t cap; /* slots: 0 or a power of two */
  size_t n;   /* keys held, at most cap / 2 */
  uint64_t seed;
  void *(*calloc_fn)(size_t, size_t); /* NULL: calloc (a white-box test fails it) */
};

struct HixlCacheManager {
  HixlEngine *eng;
  uint64_t cluster_id;
  uint64_t nonce;
  pthread_mutex_t lock; /* a leaf: never held across an engine call */
  struct cm_cache *caches;
  struct cm_cache *pending; /* being registered: their ids and keys are taken, nothing is served */
  struct cm_index index;    /* the keys of caches and pending, to their caches */
  uint64_t next_id;
  size_t naddrs; /* tensor addresses registered, all caches */
  struct cm_link *links;
  uint32_t tasks; /* async tasks not yet destroyed */
  uint32_t calls; /* public calls under way (cm_enter): Destroy waits for none */
  bool closing;   /* Destroy has begun: new calls are refused */
  HixlCacheStats stats;
};

/* A public call begins on m (PARAM_INVALID, said, once Destroy has begun) ... (inline:
 * every file of the manager's calls them, and cache.c calls down into those files) */
static inline HixlStatus cm_enter(HixlCacheManager *m, const char *fn) {
  if (!m) return hixl_fail(HIXL_PARAM_INVALID, "%s: mgr is NULL", fn);
  pthread_mutex_lock(&m->lock);
  bool closing = m->closing;
  m->calls += !closing;
  pthread_mutex_unlock(&m->lock);
  return closing ? hixl_fail(HIXL_PARAM_INVALID, "%s: the manager is being destroyed", fn) : HIXL_SUCCESS;
}

/* ... and ends, returning st. */
static inline HixlStatus cm_leave(HixlCacheManager *m, HixlStatus st) {
  pthread_mutex_lock(&m->lock);
  m->calls--;
  pthread_mutex_unlock(&m->lock);
  return st;
}

/* The layers both sides move: tensors per layer dividing both tensor counts, ranges
 * inside both, of one length (and equal, for a push). */
struct cm_layers {
  uint32_t tpl, src_start, dst_start, count;
};

/* ---- cache_codec.c: keys, tags and the CACHE service's messages ---- */

uint64_t cm_key_cluster(const HixlCacheAnyKey *k);
bool cm_key_equal(const HixlCacheAnyKey *a, const HixlCacheAnyKey *b);
void cm_key_text(const HixlCacheAnyKey *k, char *out, size_t cap);
void cm_tag_of(char *tag, uint64_t nonce, uint64_t id); /* tag: CM_TAG_LEN bytes */
void cm_put_key(struct be_out *o, const HixlCacheAnyKey *k);
bool cm_get_key(struct be_in *i, HixlCacheAnyKey *k); /* false: malformed */
/* A CACHE service request from peer: its op, and for LOOKUP the key (into *k); anything
 * malformed or not spoken here is refused (why, text) before the service acts on it. */
HixlStatus cm_get_request(const uint8_t *req, size_t len, const char *peer, uint8_t *op, HixlCacheAnyKey *k,
                          char *why, size_t cap);
/* A LOOKUP answer: local cache c, batch item batch. */
void cm_put_view(struct be_out *o, const struct cm_cache *c, uint32_t batch);
/* Decode a LOOKUP answer (v->addrs allocated); false when it is malformed. */
bool cm_get_view(const uint8_t *p, size_t n, struct cm_view *v);

/* ---- cache_index.c: the manager's keys, hashed (mgr->lock held) ---- */

static inline struct cm_ixkey cm_ixkey_req(const HixlCacheKey *k) {
  return (struct cm_ixkey){CM_IX_REQ, k->req_id, k->model_id, k->prefix_id};
}
static inline struct cm_ixkey cm_ixkey_blocks(uint64_t model_id) {
  return (struct cm_ixkey){CM_IX_BLOCKS, model_id, 0, 0};
}
/* Room for more keys; false (nothing changed) when out of memory. */
bool cm_index_reserve(struct cm_index *ix, size_t more);
/* Add k, absent, naming batch item batch of c, into room reserved: it never allocates. */
void cm_index_put(struct cm_index *ix, const struct cm_ixkey *k, struct cm_cache *c, uint32_t batch);
/* The cache k names (and its batch item, when batch is not NULL), or NULL. */
struct cm_cache *cm_index_get(const struct cm_index *ix, const struct cm_ixkey *k, uint32_t *batch);
/* Remove k, when it names c. */
void cm_index_del(struct cm_index *ix, const struct cm_ixkey *k, const struct cm_cache *c);
void cm_index_free(struct cm_index *ix);
/* Add every key of c (none of them held): all, or none and false when out of memory. */
bool cm_index_add(struct cm_index *ix, struct cm_cache *c);
/* Remove every key of c. */
void cm_index_drop(struct cm_index *ix, const struct cm_cache *c);

/* ---- cache_reg.c: local caches ---- */

void cache_free(struct cm_cache *c);
HixlStatus cache_deregister(HixlCacheManager *m, struct cm_cache *c, const char *fn);
struct cm_cache *cache_by_id(HixlCacheManager *m, uint64_t id); /* mgr->lock held */
struct cm_cache *cache_pin(HixlCacheManager *m, uint64_t id, const char *fn, HixlStatus *st);
void cache_unpin(HixlCacheManager *m, struct cm_cache *c);

/* ---- cache_service.c: the CACHE service (on the engine's progress thread) ---- */

HixlStatus cm_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                    size_t *resp_len);

/* ---- cache_lookup.c: linked clusters and what their managers answered ---- */

void cm_views_free(struct cm_view *v);
struct cm_link *cm_link_by_cluster(HixlCacheManager *m, uint64_t cluster); /* mgr->lock held */
void cm_forget(HixlCacheManager *m, uint64_t cluster, uint64_t id);
/* deadline: the calling pull's or push's (CLOCK_MONOTONIC ns), its lookup and transfer both inside it */
HixlStatus cm_find(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t deadline, const char *fn,
                   struct cm_view **out, char *remote, bool *hit);

/* ---- cache_plan.c: op lists; pull and push ---- */

HixlStatus cm_layer_range(const char *fn, const char *side, uint32_t start, uint32_t count, uint32_t layers,
                          uint32_t *s, uint32_t *c);
int cm_plan_blocks(struct opvec *o, const struct cm_layers *ly, const uintptr_t *src_addrs, uint64_t src_off,
                   const uintptr_t *dst_addrs, const uint64_t *sb, const uint64_t *db, size_t nb, uint64_t bs,
                   bool local_is_src);
HixlStatus cm_check_blocks(const uint64_t *v, size_t n, uint64_t limit, const char *fn, const char *what,
                           uint64_t cluster);
/* PARAM_INVALID naming the first two places of the lowest block in v twice (two sources would
 * land in one block, the last silently winning). */
HixlStatus cm_check_distinct(const uint64_t *v, size_t n, const char *fn, const char *what);

#endif
