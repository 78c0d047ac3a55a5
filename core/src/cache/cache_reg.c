/* cache_reg: local caches: registration (or allocation), unregistration, pins for transfers. */
/* A cache peers may reach is registered with the engine under its tag (cm_tag_of). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"
#include "engine/engine_ext.h"

struct cm_cache *cache_by_id(HixlCacheManager *m, uint64_t id) {
  for (struct cm_cache *c = m->caches; c; c = c->next)
    if (c->id == id) return c;
  return NULL;
}

void cache_free(struct cm_cache *c) {
  free(c->addrs);
  free(c->handles);
  free(c->keys);
  free(c);
}

/* Deregister what is still registered of c; FAILED (c kept) when the engine refuses (a
 * transfer in flight on it). A handle the engine no longer knows is gone already: its
 * Finalize released every registration. */
HixlStatus cache_deregister(HixlCacheManager *m, struct cm_cache *c, const char *fn) {
  HixlStatus st = HIXL_SUCCESS;
  for (uint32_t t = 0; c->handles && t < c->desc.num_tensors; t++) {
    if (!c->handles[t]) continue;
    HixlStatus s = c->allocated ? HixlEngineFreeMem(m->eng, c->handles[t])
                                : HixlEngineDeregisterMem(m->eng, c->handles[t]);
    if (s == HIXL_SUCCESS || s == HIXL_PARAM_INVALID) /* unknown: the engine's Finalize released it */
      c->handles[t] = NULL;
    else if (st == HIXL_SUCCESS)
      st = hixl_fail(s, "%s: cache %" PRIu64 " tensor %u: %s", fn, c->id, t, HixlGetLastErrorMessage());
  }
  return st;
}

static HixlStatus cm_check_desc(const HixlCacheDesc *d, const char *fn, uint64_t *tensor_bytes) {
  CHECK_ARG(d, "%s: cache_desc is NULL", fn);
  CHECK_ARG(d->placement == HIXL_CACHE_HOST || d->placement == HIXL_CACHE_DEVICE,
            "%s: placement %d is unknown", fn, (int)d->placement);
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

static int cm_cmp_uptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* PARAM_INVALID when a cache of the manager, pending ones included, already holds one of
 * keys or bkey's model (mgr->lock held): one probe of the index per key. */
static HixlStatus keys_clash(const HixlCacheManager *m, const char *fn, const HixlCacheKey *keys,
                             size_t num_keys, const HixlBlocksCacheKey *bkey) {
  const struct cm_cache *o;
  struct cm_ixkey bk = cm_ixkey_blocks(bkey ? bkey->model_id : 0);
  if (bkey && (o = cm_index_get(&m->index, &bk, NULL)) != NULL)
    return hixl_fail(HIXL_PARAM_INVALID, "%s: BlocksCacheKey model %" PRIu64 " already names cache %" PRIu64,
                     fn, bkey->model_id, o->id);
  for (size_t i = 0; i < num_keys; i++) {
    struct cm_ixkey k = cm_ixkey_req(&keys[i]);
    if ((o = cm_index_get(&m->index, &k, NULL)) != NULL)
      return hixl_fail(HIXL_PARAM_INVALID, "%s: CacheKey req %" PRIu64 " already names cache %" PRIu64, fn,
                       keys[i].req_id, o->id);
  }
  return HIXL_SUCCESS;
}

/* PARAM_INVALID when two of keys are the same, naming the first pair as a scan of each
 * key against those before it would: through an index of its own, c's keys to c. */
static HixlStatus keys_repeat(struct cm_cache *c, const char *fn, const HixlCacheKey *keys, size_t num_keys,
                              uint64_t seed) {
  struct cm_index ix = {.seed = seed};
  HixlStatus st = HIXL_SUCCESS;
  if (num_keys < 2) return HIXL_SUCCESS;
  if (!cm_index_reserve(&ix, num_keys)) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (size_t i = 0; i < num_keys && st == HIXL_SUCCESS; i++) {
    struct cm_ixkey k = cm_ixkey_req(&keys[i]);
    uint32_t j = 0;
    if (cm_index_get(&ix, &k, &j))
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: keys %zu and %zu are the same", fn, (size_t)j, i);
    else
      cm_index_put(&ix, &k, c, (uint32_t)i);
  }
  cm_index_free(&ix);
  return st;
}

static void list_unlink(struct cm_cache **head, struct cm_cache *c) {
  for (struct cm_cache **pp = head; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      return;
    }
}

/* Register a cache at addrs, or (alloc) allocate its tensors and write their
 * addresses to addrs. */
static HixlStatus cm_register_in(HixlCacheManager *m, bool blocks, bool alloc, const HixlCacheDesc *desc,
                                 uintptr_t *addrs, size_t num_addrs, const HixlCacheKey *keys,
                                 size_t num_keys, const HixlBlocksCacheKey *bkey, HixlCacheAccess access,
                                 uint64_t *cache_id, const char *fn) {
  uint64_t tb = 0;
  HixlStatus st;
  CHECK_ARG(m && addrs && cache_id, "%s: mgr, addrs or cache_id output is NULL", fn);
  if ((st = cm_check_desc(desc, fn, &tb)) != HIXL_SUCCESS) return st;
  CHECK_ARG(num_addrs == desc->num_tensors, "%s: %zu addresses for %u tensors", fn, num_addrs,
            desc->num_tensors);
  CHECK_ARG(num_keys == 0 || keys, "%s: keys is NULL but num_keys is %zu", fn, num_keys);
  CHECK_ARG(num_keys <= desc->shape[0], "%s: %zu keys for a batch of %" PRIu64, fn, num_keys, desc->shape[0]);
  for (size_t i = 0; i < num_keys; i++) /* as the blocks calls: peers look a key up by its cluster */
    CHECK_ARG(keys[i].cluster_id == m->cluster_id,
              "%s: key %zu names cluster %" PRIu64 ", this manager is cluster %" PRIu64, fn, i,
              keys[i].cluster_id, m->cluster_id);
  CHECK_ARG(access >= HIXL_CACHE_ACCESS_DEFAULT && access <= HIXL_CACHE_ACCESS_REMOTE,
            "%s: remote_accessible %d is unknown", fn, (int)access);
  /* Device memory moves only registered with the engine, which knows it is device
   * memory; the staging pool copies with memcpy, which device memory is not for. */
  bool device = desc->placement == HIXL_CACHE_DEVICE;
  if (device && alloc)
    return hixl_fail(
        HIXL_UNSUPPORTED,
        "%s: device placement: hixl does not allocate device memory (the runtime does); register "
        "it with RegisterCache or RegisterBlocksCache",
        fn);
  if (device && access == HIXL_CACHE_ACCESS_LOCAL)
    return hixl_fail(
        HIXL_UNSUPPORTED,
        "%s: a device cache peers may not reach would move through the staging pool, which copies "
        "host memory only; register it remotely accessible (the default for device placement)",
        fn);
  for (size_t i = 0; i < num_addrs && !alloc; i++)
    CHECK_ARG(addrs[i] != 0 && addrs[i] + tb > addrs[i], "%s: tensor %zu's address 0x%" PRIxPTR " is invalid",
              fn, i, addrs[i]);
  /* Allocated: the tensors one after another, each at a page boundary. */
  uint64_t stride = (tb + 4095) / 4096 * 4096;
  CHECK_ARG(!alloc || stride <= ((uint64_t)1 << 46) / num_addrs,
            "%s: %zu tensors of %" PRIu64 " bytes are too many to allocate", fn, num_addrs, tb);
  struct cm_cache *c = calloc(1, sizeof(*c));
  uintptr_t *sorted = alloc ? NULL : malloc(num_addrs * sizeof(*sorted)); /* to check for overlaps */
  if (!c || (!alloc && !sorted) || !(c->addrs = malloc(num_addrs * sizeof(*c->addrs))) ||
      !(c->handles = calloc(num_addrs, sizeof(*c->handles))) ||
      (num_keys && !(c->keys = malloc(num_keys * sizeof(*c->keys))))) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto fail_alloc;
  }
  if ((st = keys_repeat(c, fn, keys, num_keys, m->nonce)) != HIXL_SUCCESS) goto fail_alloc;
  if (!alloc) { /* allocated tensors are laid out apart below */
    memcpy(sorted, addrs, num_addrs * sizeof(*sorted));
    qsort(sorted, num_addrs, sizeof(*sorted), cm_cmp_uptr);
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
  /* The seed's defaults: host memory not remotely accessible, device memory so. */
  c->remote = alloc || device || access == HIXL_CACHE_ACCESS_REMOTE;
  c->allocated = alloc;
  c->desc = *desc;
  c->tensor_bytes = tb;
  c->item_bytes = tb / desc->shape[0];
  if (bkey) {
    c->has_bkey = true;
    c->bkey = *bkey;
  }
  /* Reserve an id, the addresses and the keys (c waits in m->pending, its keys in the
   * index, so a concurrent registration of one of them is refused); check keys against
   * the other caches'. */
  pthread_mutex_lock(&m->lock);
  if (m->naddrs + num_addrs > HIXL_CACHE_MAX_ADDRS)
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: %zu tensor addresses are registered; %zu more exceed %d", fn,
                   m->naddrs, num_addrs, HIXL_CACHE_MAX_ADDRS);
  else
    st = keys_clash(m, fn, keys, num_keys, bkey);
  if (st == HIXL_SUCCESS && !cm_index_add(&m->index, c))
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory for the index of %zu more keys", fn,
                   num_keys + (bkey != NULL));
  if (st == HIXL_SUCCESS) {
    c->id = m->next_id++;
    m->naddrs += num_addrs;
    c->next = m->pending;
    m->pending = c;
  }
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) goto fail_alloc;
  if (alloc) { /* one allocation for every tensor, advertised under the cache's tag */
    char tag[CM_TAG_LEN];
    void *base = NULL;
    cm_tag_of(tag, m->nonce, c->id);
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
     * (one MR over rdma), its handle kept at the span's first tensor. Device tensors go
     * one by one: two allocations may lie side by side, and a registration of device
     * memory must lie inside one. */
    char tag[CM_TAG_LEN];
    cm_tag_of(tag, m->nonce, c->id);
    for (size_t i = 0, j; i < num_addrs; i = j) {
      for (j = i + 1; !device && j < num_addrs && sorted[j] == sorted[j - 1] + tb;) j++;
      uint32_t t = 0;
      while (c->addrs[t] != sorted[i]) t++;
      HixlMemDesc md = {sorted[i], (size_t)(tb * (j - i))};
      st = hixl_engine_register_tagged(m->eng, &md, device ? HIXL_MEM_DEVICE : HIXL_MEM_HOST, tag,
                                       &c->handles[t]);
      if (st != HIXL_SUCCESS) {
        st = hixl_fail(st, "%s: tensors %u and the %zu after it in memory [0x%" PRIxPTR ", +%" PRIu64 "): %s",
                       fn, t, j - i - 1, sorted[i], tb * (j - i), HixlGetLastErrorMessage());
        goto fail_registered;
      }
    }
  }
  pthread_mutex_lock(&m->lock);
  list_unlink(&m->pending, c);
  c->next = m->caches;
  m->caches = c;
  c->listed = true;
  pthread_mutex_unlock(&m->lock);
  free(sorted);
  *cache_id = c->id;
  return HIXL_SUCCESS;

fail_registered:
  for (uint32_t t = 0; t < desc->num_tensors; t++)
    if (c->handles[t])
      HixlEngineDeregisterMem(m->eng, c->handles[t]); /* never an allocation: it is the last step */
  pthread_mutex_lock(&m->lock);
  list_unlink(&m->pending, c);
  cm_index_drop(&m->index, c);
  m->naddrs -= num_addrs;
  pthread_mutex_unlock(&m->lock);
fail_alloc:
  free(sorted);
  if (c) cache_free(c);
  return st;
}

static HixlStatus cm_register(HixlCacheManager *m, bool blocks, bool alloc, const HixlCacheDesc *desc,
                              uintptr_t *addrs, size_t num_addrs, const HixlCacheKey *keys, size_t num_keys,
                              const HixlBlocksCacheKey *bkey, HixlCacheAccess access, uint64_t *cache_id,
                              const char *fn) {
  HixlStatus st = cm_enter(m, fn);
  if (st != HIXL_SUCCESS) return st;
  return cm_leave(m, cm_register_in(m, blocks, alloc, desc, addrs, num_addrs, keys, num_keys, bkey, access,
                                    cache_id, fn));
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

static HixlStatus unregister_in(HixlCacheManager *m, uint64_t cache_id, const char *fn) {
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
  else {
    *pp = c->next; /* peers can no longer find it; its keys stay taken until it is gone */
    c->next = m->pending;
    m->pending = c;
    c->listed = false;
  }
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) return st;
  st = cache_deregister(m, c, fn);
  pthread_mutex_lock(&m->lock);
  list_unlink(&m->pending, c);
  if (st != HIXL_SUCCESS) { /* in flight on the engine: keep it */
    c->next = m->caches;
    m->caches = c;
    c->listed = true;
  } else {
    m->naddrs -= c->desc.num_tensors;
    cm_index_drop(&m->index, c);
  }
  pthread_mutex_unlock(&m->lock);
  if (st != HIXL_SUCCESS) return st;
  cache_free(c);
  return HIXL_SUCCESS;
}

HixlStatus HixlCacheManagerUnregisterCache(HixlCacheManager *m, uint64_t cache_id) {
  const char *fn = "HixlCacheManagerUnregisterCache";
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS ? st : cm_leave(m, unregister_in(m, cache_id, fn));
}

HixlStatus HixlCacheManagerRemapRegisteredMemory(HixlCacheManager *m, const HixlMemDesc *mems,
                                                 size_t num_mems) {
  (void)mems;
  (void)num_mems;
  CHECK_ARG(m, "HixlCacheManagerRemapRegisteredMemory: mgr is NULL");
  return hixl_fail(HIXL_UNSUPPORTED,
                   "HixlCacheManagerRemapRegisteredMemory: reserved by the seed (device memory "
                   "repair after a UCE fault): not done here; unregister the cache and register it anew");
}

/* Pin a local cache (busy) and copy what the plan needs; NULL with the failure. */
struct cm_cache *cache_pin(HixlCacheManager *m, uint64_t id, const char *fn, HixlStatus *st) {
  pthread_mutex_lock(&m->lock);
  struct cm_cache *c = cache_by_id(m, id);
  if (c) c->busy++;
  pthread_mutex_unlock(&m->lock);
  if (!c)
    *st = hixl_fail(HIXL_PARAM_INVALID, "%s: cache %" PRIu64 " is not registered with this manager", fn, id);
  return c;
}

void cache_unpin(HixlCacheManager *m, struct cm_cache *c) {
  pthread_mutex_lock(&m->lock);
  c->busy--;
  pthread_mutex_unlock(&m->lock);
}
