/* cache_service: the CACHE service, the target side, on the engine's progress thread. */
/* It answers a peer's HELLO and its lookup of a cache by key (cache_codec.c). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cache/cache_int.h"

/* The cache a key names here, and the batch item it names; NULL with why. A CacheKey
 * or a BlocksCacheKey is one probe of the index; a cache id, a walk of the caches
 * (at most HIXL_CACHE_MAX_ADDRS). */
static struct cm_cache *cache_by_key(HixlCacheManager *m, const HixlCacheAnyKey *k, uint32_t *batch,
                                     char *why, size_t cap) {
  char kt[160];
  cm_key_text(k, kt, sizeof(kt));
  if (cm_key_cluster(k) != m->cluster_id) {
    snprintf(why, cap, "%s: this manager is cluster %" PRIu64, kt, m->cluster_id);
    return NULL;
  }
  struct cm_cache *c = NULL;
  uint32_t b = 0;
  if (k->kind == HIXL_CACHE_KEY_REQ) {
    struct cm_ixkey ik = cm_ixkey_req(&k->u.req);
    c = cm_index_get(&m->index, &ik, &b);
  } else if (k->kind == HIXL_CACHE_KEY_BLOCKS) {
    struct cm_ixkey ik = cm_ixkey_blocks(k->u.blocks.model_id);
    c = cm_index_get(&m->index, &ik, NULL);
  } else if (k->kind == HIXL_CACHE_KEY_ID) {
    for (c = m->caches; c && c->id != k->u.id.cache_id;) c = c->next;
    if (c && c->listed && c->remote && k->u.id.batch_index >= c->desc.shape[0] && !c->blocks) {
      snprintf(why, cap, "%s: cache %" PRIu64 " has %" PRIu64 " batch items", kt, c->id, c->desc.shape[0]);
      return NULL;
    }
    b = k->u.id.batch_index;
  }
  /* A pending cache (registering, or going) holds its keys but is not served; one without
   * remote access is not there for a peer: the same answer as no cache, so that a peer
   * does not learn it exists (its id, its batch size). */
  if (c && c->listed && c->remote) {
    *batch = b;
    return c;
  }
  snprintf(why, cap, "%s names no cache on cluster %" PRIu64, kt, m->cluster_id);
  return NULL;
}

HixlStatus cm_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                    size_t *resp_len) {
  HixlCacheManager *m = ctx;
  struct be_out out = be_out_fixed(resp, cap);
  char why[320] = "";
  uint8_t op = 0;
  HixlCacheAnyKey k;
  HixlStatus st = cm_get_request(req, len, peer, &op, &k, why, sizeof(why));
  if (st == HIXL_SUCCESS && op == CM_OP_HELLO) {
    be_out_u64(&out, m->cluster_id);
    be_out_u64(&out, m->nonce);
  } else if (st == HIXL_SUCCESS) { /* CM_OP_LOOKUP */
    pthread_mutex_lock(&m->lock);
    uint32_t batch = 0;
    struct cm_cache *c = cache_by_key(m, &k, &batch, why, sizeof(why));
    if (!c) {
      st = HIXL_NOT_FOUND;
    } else {
      cm_put_view(&out, c, batch);
    }
    pthread_mutex_unlock(&m->lock);
    if (st == HIXL_SUCCESS && out.bad) {
      snprintf(why, sizeof(why), "cache answer does not fit %zu bytes", cap);
      st = HIXL_FAILED;
    }
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
