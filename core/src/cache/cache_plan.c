/* cache_plan: pull and push (PullCache, PushCache, PullBlocks, PushBlocks): checks, plan, run. */
/* The plan is an op list over the layers, run in engine-sized batches; cache_ext.h's
 * push with a call behind it is PushBlocks with its last batch started, not waited for. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_ext.h"
#include "cache/cache_int.h"
#include "engine/engine_ext.h"
#include "util/sock.h"

/* ---- the plan: op lists over the layers ---- */

/* Resolve a layer range [start, start + count) of a cache with layers layers
 * (count 0: every layer). */
HixlStatus cm_layer_range(const char *fn, const char *side, uint32_t start, uint32_t count, uint32_t layers,
                          uint32_t *s, uint32_t *c) {
  if (count == 0) {
    CHECK_ARG(start == 0, "%s: %s layer range starts at %u but has no count", fn, side, start);
    count = layers;
  }
  CHECK_ARG(start < layers && count <= layers - start,
            "%s: %s layer range [%u, +%u) is outside its %u layers", fn, side, start, count,
            layers); /* start + count may wrap: not printed */
  *s = start;
  *c = count;
  return HIXL_SUCCESS;
}

static HixlStatus cm_plan_layers(const char *fn, const HixlCacheTransferArgs *a, uint32_t src_tensors,
                                 uint32_t dst_tensors, bool push, struct cm_layers *out) {
  if (a->src_layer_start == 0 && a->src_layer_count == 0 && a->dst_layer_start == 0 &&
      a->dst_layer_count == 0) {
    /* Every layer on both sides: every tensor, i to i. The seed asks tensor_num_per_layer
     * to divide the tensor count only with a layer range (a cache of K or V alone, one
     * tensor a layer, may have an odd count). */
    CHECK_ARG(src_tensors == dst_tensors, "%s: %u source tensors against %u destination tensors", fn,
              src_tensors, dst_tensors);
    *out = (struct cm_layers){1, 0, 0, src_tensors};
    return HIXL_SUCCESS;
  }
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
  if ((st = cm_layer_range(fn, "source", a->src_layer_start, a->src_layer_count, src_tensors / tpl,
                           &out->src_start, &sc)) != HIXL_SUCCESS ||
      (st = cm_layer_range(fn, "destination", a->dst_layer_start, a->dst_layer_count, dst_tensors / tpl,
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
int cm_plan_blocks(struct opvec *o, const struct cm_layers *ly, const uintptr_t *src_addrs, uint64_t src_off,
                   const uintptr_t *dst_addrs, const uint64_t *sb, const uint64_t *db, size_t nb, uint64_t bs,
                   bool local_is_src) {
  for (uint32_t li = 0; li < ly->count; li++)
    for (uint32_t t = 0; t < ly->tpl; t++) {
      uintptr_t sa = src_addrs[(ly->src_start + li) * ly->tpl + t] + src_off;
      uintptr_t da = dst_addrs[(ly->dst_start + li) * ly->tpl + t];
      for (size_t j = 0; j < nb;) {
        size_t k = j + 1;
        uint64_t s0 = sb ? sb[j] : j;
        while (k < nb && (sb ? sb[k] : k) == s0 + (k - j) && db[k] == db[j] + (k - j)) k++;
        uintptr_t s = sa + s0 * bs, d = da + db[j] * bs;
        if (opvec_add(o, local_is_src ? s : d, local_is_src ? d : s, (k - j) * bs, false) < 0) return -1;
        j = k;
      }
    }
  return 0;
}

/* ---- pull and push ---- */

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

/* Run ops against remote, in engine-sized batches within the call's deadline; with then,
 * the last batch is started with its call and not waited for. */
static HixlStatus cm_run_ops(HixlCacheManager *m, const char *remote, HixlTransferOp op,
                             const struct opvec *o, uint64_t deadline, const struct cm_then *then,
                             const char *fn) {
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

/* A transfer planned on a remembered view (hit) failed, not by timing out: what was
 * remembered may be stale (the peer's MEM_DEL still on its way). Forget the view and
 * empty the plan; true: the caller asks once more, and that answer comes after every
 * MEM_DEL the peer sent before it. */
static bool cm_stale_view(HixlCacheManager *m, HixlStatus st, bool hit, uint64_t cluster, struct cm_view **v,
                          struct opvec *ops) {
  if (st == HIXL_SUCCESS || st == HIXL_TIMEOUT || !hit) return false;
  cm_forget(m, cluster, (*v)->id);
  cm_views_free(*v);
  *v = NULL;
  ops->n = 0;
  ops->bytes = 0;
  return true;
}

static const HixlCacheTransferArgs cm_default_args = HIXL_CACHE_TRANSFER_ARGS_INIT;

static HixlStatus cm_check_key(const HixlCacheAnyKey *k, const char *fn) {
  CHECK_ARG(k, "%s: key is NULL", fn);
  CHECK_ARG(k->kind == HIXL_CACHE_KEY_REQ || k->kind == HIXL_CACHE_KEY_ID || k->kind == HIXL_CACHE_KEY_BLOCKS,
            "%s: key kind %d is unknown", fn, (int)k->kind);
  return HIXL_SUCCESS;
}

HixlStatus cm_check_blocks(const uint64_t *v, size_t n, uint64_t limit, const char *fn, const char *what,
                           uint64_t cluster) {
  CHECK_ARG(n == 0 || v, "%s: %s is NULL but has %zu entries", fn, what, n);
  for (size_t j = 0; j < n; j++)
    CHECK_ARG(v[j] < limit,
              "%s: %s[%zu] = %" PRIu64 " is outside the %" PRIu64 " blocks of the cache on cluster %" PRIu64,
              fn, what, j, v[j], limit, cluster);
  return HIXL_SUCCESS;
}

static int cm_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

HixlStatus cm_check_distinct(const uint64_t *v, size_t n, const char *fn, const char *what) {
  if (n < 2) return HIXL_SUCCESS;
  uint64_t *s = malloc(n * sizeof(*s));
  if (!s) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory checking %zu %s", fn, n, what);
  memcpy(s, v, n * sizeof(*s));
  qsort(s, n, sizeof(*s), cm_cmp_u64);
  size_t k = 1;
  while (k < n && s[k] != s[k - 1]) k++;
  uint64_t twice = k < n ? s[k] : 0;
  free(s);
  if (k == n) return HIXL_SUCCESS;
  size_t i = 0, j;
  while (v[i] != twice) i++;
  for (j = i + 1; v[j] != twice;) j++;
  return hixl_fail(HIXL_PARAM_INVALID,
                   "%s: %s[%zu] and %s[%zu] are both block %" PRIu64 ": two sources would land in one block",
                   fn, what, i, what, j, twice);
}

/* pull_cache and push_cache: one batch item of each tensor of the layers. */
static HixlStatus cm_item_in(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                             uint32_t local_batch, const HixlCacheTransferArgs *a, bool push,
                             const char *fn) {
  HixlStatus st;
  if (!a) a = &cm_default_args;
  CHECK_ARG(m, "%s: mgr is NULL", fn);
  if ((st = cm_check_key(key, fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(a->size == -1 || a->size > 0, "%s: size %" PRId64 " must be -1 (a whole item) or > 0", fn,
            a->size);
  CHECK_ARG(a->timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, a->timeout_ms);
  struct cm_cache *c = cache_pin(m, local_id, fn, &st);
  if (!c) return st;
  struct cm_view *v = NULL;
  struct opvec ops = {0};
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
  uint64_t there = cm_key_cluster(key);
  uint64_t deadline = hixl_deadline_ns(a->timeout_ms); /* the lookup and the transfer: one timeout */
  bool hit;
retry:
  if ((st = cm_find(m, key, deadline, fn, &v, remote, &hit)) != HIXL_SUCCESS) goto out;
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
  if ((st = cm_plan_layers(fn, a, push ? c->desc.num_tensors : v->n, push ? v->n : c->desc.num_tensors, push,
                           &ly)) != HIXL_SUCCESS)
    goto out;
  const uintptr_t *sa = push ? c->addrs : v->addrs, *da = push ? v->addrs : c->addrs;
  uint64_t soff = push ? local_batch * c->item_bytes : v->batch_index * v->item_bytes;
  uint64_t doff = push ? v->batch_index * v->item_bytes : local_batch * c->item_bytes;
  for (uint32_t li = 0; li < ly.count; li++)
    for (uint32_t t = 0; t < ly.tpl; t++) {
      uintptr_t s = sa[(ly.src_start + li) * ly.tpl + t] + soff,
                d = da[(ly.dst_start + li) * ly.tpl + t] + doff;
      if (opvec_add(&ops, push ? s : d, push ? d : s, size, false) < 0) {
        st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        goto out;
      }
    }
  st = cm_run_ops(m, remote, push ? HIXL_WRITE : HIXL_READ, &ops, deadline, NULL, fn);
  if (cm_stale_view(m, st, hit, there, &v, &ops)) goto retry;
out:
  opvec_free(&ops);
  cm_views_free(v);
  cache_unpin(m, c);
  return st;
}

static HixlStatus cm_item(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                          uint32_t local_batch, const HixlCacheTransferArgs *a, bool push, const char *fn) {
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS ? st : cm_leave(m, cm_item_in(m, key, local_id, local_batch, a, push, fn));
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
static HixlStatus cm_blocks_in(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                               const uint64_t *sb, size_t nsb, const uint64_t *db, size_t ndb,
                               const HixlCacheTransferArgs *a, bool push, const struct cm_then *then,
                               const char *fn) {
  HixlStatus st;
  if (!a) a = &cm_default_args;
  CHECK_ARG(m, "%s: mgr is NULL", fn);
  if ((st = cm_check_key(key, fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(a->size == -1, "%s: size %" PRId64 " applies to pull_cache and push_cache only (use -1)", fn,
            a->size);
  CHECK_ARG(a->timeout_ms >= 0, "%s: timeout_ms %d is negative", fn, a->timeout_ms);
  CHECK_ARG(ndb > 0 && db, "%s: dst_blocks is empty", fn);
  CHECK_ARG(nsb == 0 || sb, "%s: src_blocks is NULL but has %zu entries", fn, nsb);
  struct cm_cache *c = cache_pin(m, local_id, fn, &st);
  if (!c) return st;
  struct cm_view *v = NULL;
  struct opvec ops = {0};
  char remote[64];
  uint64_t there = cm_key_cluster(key), here = m->cluster_id;
  /* The blocks side (the destination) and the source side, whichever is local. */
  bool src_blocks_side = push ? c->blocks : key->kind == HIXL_CACHE_KEY_BLOCKS;
  if (!push && !c->blocks) {
    st = hixl_fail(HIXL_PARAM_INVALID, "%s: local cache %" PRIu64 " is not a blocks cache", fn, c->id);
    goto out;
  }
  uint64_t deadline = hixl_deadline_ns(a->timeout_ms); /* the lookup and the transfer: one timeout */
  bool hit;
retry:
  if ((st = cm_find(m, key, deadline, fn, &v, remote, &hit)) != HIXL_SUCCESS) goto out;
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
  if (ndb > dnb) { /* before any list is walked: each block at most once */
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: %zu dst_blocks, but the cache on cluster %" PRIu64 " has %" PRIu64 " blocks", fn, ndb,
                   push ? there : here, dnb);
    goto out;
  }
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
    if ((st = cm_check_blocks(sb, nsb, snb, fn, "src_blocks", push ? here : there)) != HIXL_SUCCESS) goto out;
  } else {
    if (nsb != 0) {
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: src_blocks must be empty when the source is a contiguous cache",
                     fn);
      goto out;
    }
    if (ndb && dbs > src_item / ndb) { /* a product would wrap */
      st =
          hixl_fail(HIXL_PARAM_INVALID,
                    "%s: %zu blocks of %" PRIu64 " bytes exceed the source's batch item of %" PRIu64 " bytes",
                    fn, ndb, dbs, src_item);
      goto out;
    }
  }
  if ((st = cm_check_blocks(db, ndb, dnb, fn, "dst_blocks", push ? there : here)) != HIXL_SUCCESS ||
      (st = cm_check_distinct(db, ndb, fn, "dst_blocks")) != HIXL_SUCCESS)
    goto out;
  struct cm_layers ly;
  if ((st = cm_plan_layers(fn, a, push ? c->desc.num_tensors : v->n, push ? v->n : c->desc.num_tensors, push,
                           &ly)) != HIXL_SUCCESS)
    goto out;
  const uintptr_t *sa = push ? c->addrs : v->addrs, *da = push ? v->addrs : c->addrs;
  /* A contiguous source: its item (the key's for a pull, item 0 for a push). */
  uint64_t soff = src_blocks_side ? 0 : push ? 0 : v->batch_index * v->item_bytes;
  if (cm_plan_blocks(&ops, &ly, sa, soff, da, src_blocks_side ? sb : NULL, db, ndb, dbs, push) < 0) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto out;
  }
  st = cm_run_ops(m, remote, push ? HIXL_WRITE : HIXL_READ, &ops, deadline, then, fn);
  if (cm_stale_view(m, st, hit, there, &v, &ops)) goto retry;
out:
  opvec_free(&ops);
  cm_views_free(v);
  if (!then || st != HIXL_SUCCESS) {
    cache_unpin(m, c);
  } else { /* hixl_cache_unpin's to let go */
    pthread_mutex_lock(&m->lock);
    c->then_pins++;
    pthread_mutex_unlock(&m->lock);
  }
  return st;
}

static HixlStatus cm_blocks(HixlCacheManager *m, const HixlCacheAnyKey *key, uint64_t local_id,
                            const uint64_t *sb, size_t nsb, const uint64_t *db, size_t ndb,
                            const HixlCacheTransferArgs *a, bool push, const struct cm_then *then,
                            const char *fn) {
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS
             ? st
             : cm_leave(m, cm_blocks_in(m, key, local_id, sb, nsb, db, ndb, a, push, then, fn));
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

/* A call as the others (cm_enter): nothing on a NULL manager or one being destroyed
 * (Destroy begins only once no cache is pinned). Only a pin a then-call left goes: a
 * task's or a transfer's taken would let UnregisterCache free the cache under it. */
void hixl_cache_unpin(HixlCacheManager *m, uint64_t cache_id) {
  if (cm_enter(m, "hixl_cache_unpin") != HIXL_SUCCESS) return;
  pthread_mutex_lock(&m->lock);
  struct cm_cache *c = cache_by_id(m, cache_id);
  if (c && c->then_pins > 0) {
    c->then_pins--;
    c->busy--;
  }
  pthread_mutex_unlock(&m->lock);
  cm_leave(m, HIXL_SUCCESS);
}
