/* kv_worker: the worker's ops: register the KV caches, bind each step's metadata
 * (HOLD, LOAD, FREE, PUSH, EXPECT entries) to the roles' state, release saved layers
 * to the pusher, wait for landed ones, and report what finished. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "kv_int.h"

/* register_kv_caches (the host's memory at ly[i].base), or alloc_kv_caches (alloc:
 * the cache manager allocates it; base and v_offset are written back on success). */
static hixl_kv_status kv_setup(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n, bool alloc) {
  const char *fn = alloc ? "alloc_kv_caches" : "register_kv_caches";
  CHECK_ARG(c && ly && n > 0 && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or layers is NULL, none given, or a "
            "scheduler's connector",
            fn);
  CHECK_ARG(c->cache_id == 0, "%s: caches are already registered", fn);
  CHECK_ARG(n <= HIXL_CACHE_MAX_ADDRS / 2, "%s: %zu layers; at most %d", fn, n, HIXL_CACHE_MAX_ADDRS / 2);
  const hixl_kv_layer *l0 = &ly[0];
  for (size_t i = 0; i < n; i++) {
    const hixl_kv_layer *l = &ly[i];
    CHECK_ARG(
        (l->base || alloc) && l->num_blocks && l->block_bytes && l->elem_size && l->block_tokens &&
            l->block_bytes % l->elem_size == 0,
        "%s: layer %zu: base, num_blocks, block_bytes, elem_size and block_tokens must be set (block_bytes a "
        "multiple of elem_size)",
        fn, i);
    CHECK_ARG(l->layout == HIXL_KV_LAYOUT_KV_FIRST || l->layout == HIXL_KV_LAYOUT_BLOCKS_FIRST,
              "%s: layer %zu: layout %u is unknown", fn, i, l->layout);
    CHECK_ARG(alloc || l->layout != HIXL_KV_LAYOUT_KV_FIRST || l->v_offset >= l->num_blocks * l->block_bytes,
              "%s: layer %zu: V at offset %" PRIu64 " overlaps K's %" PRIu64 " bytes", fn, i, l->v_offset,
              l->num_blocks * l->block_bytes);
    CHECK_ARG(l->num_blocks == l0->num_blocks && l->block_bytes == l0->block_bytes &&
                  l->layout == l0->layout && l->elem_size == l0->elem_size &&
                  l->block_tokens == l0->block_tokens,
              "%s: layer %zu differs from layer 0 (every layer must have the same shape)", fn, i);
  }
  bool split = l0->layout == HIXL_KV_LAYOUT_KV_FIRST;
  uint32_t tpl = split ? 2 : 1;
  size_t nt = n * tpl;
  uintptr_t *addrs = malloc(nt * sizeof(*addrs));
  if (!addrs) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (size_t i = 0; i < n; i++) {
    addrs[i * tpl] = ly[i].base;
    if (split) addrs[i * tpl + 1] = ly[i].base + ly[i].v_offset;
  }
  uint64_t item = split ? l0->block_bytes : 2 * l0->block_bytes;
  HixlCacheDesc d = {(uint32_t)nt, l0->elem_size, 2, {l0->num_blocks, item / l0->elem_size}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey key = {c->cluster, 0};
  uint64_t id = 0;
  HixlStatus st =
      alloc ? HixlCacheManagerAllocateBlocksCache(c->mgr, &d, &key, addrs, nt, &id)
            : HixlCacheManagerRegisterBlocksCache(c->mgr, &d, addrs, nt, &key, HIXL_CACHE_ACCESS_REMOTE, &id);
  if (st != HIXL_SUCCESS) {
    free(addrs);
    return kv_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  }
  for (size_t i = 0; i < n && alloc; i++) { /* K (and V) of layer i are tensors i * tpl (+ 1) */
    ly[i].base = addrs[i * tpl];
    ly[i].v_offset = split ? addrs[i * tpl + 1] - addrs[i * tpl] : 0;
  }
  free(addrs);
  uint64_t *saved = calloc(n, sizeof(*saved));
  if (!saved) {
    HixlCacheManagerUnregisterCache(c->mgr, id);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  pthread_mutex_lock(&c->lock);
  c->push.saved_step = saved;
  c->cache_id = id;
  c->layers = (uint32_t)n;
  c->tensors_per_layer = tpl;
  c->block_bytes = n * 2 * l0->block_bytes;
  snprintf(c->layout_text, sizeof(c->layout_text),
           "abi=%u layers=%zu block_tokens=%u block_bytes=%" PRIu64 " elem_size=%u layout=%s tp=%u",
           HIXL_KV_ABI_MAJOR, n, l0->block_tokens, l0->block_bytes, l0->elem_size,
           split ? "kv_first" : "blocks_first", c->world);
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_register(hixl_kv_connector *c, const hixl_kv_layer *ly, size_t n) {
  return kv_setup(c, (hixl_kv_layer *)ly, n, false); /* nothing is written back */
}

hixl_kv_status kv_alloc_caches(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n) {
  return kv_setup(c, ly, n, true);
}

hixl_kv_status kv_bind(hixl_kv_connector *c, const uint8_t *meta, size_t len) {
  const char *fn = "bind_connector_meta";
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or metadata is NULL, or a scheduler's", fn);
  struct kv_meta_entry *v = NULL;
  size_t n = 0;
  CHECK_ARG(kv_meta_parse(meta, len, &v, &n),
            "%s: %zu bytes of metadata do not parse (not from this plugin's "
            "build_connector_meta?)",
            fn, len);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  pthread_mutex_lock(&c->lock);
  c->step++; /* one bind per step: this step's save_kv_layer calls release its pushes */
  uint64_t now = kv_now_ns();
  for (size_t i = 0; i < n; i++) {
    struct kv_meta_entry *e = &v[i];
    if (e->type == KV_META_PUSH || e->type == KV_META_EXPECT) {
      if (c->cache_id == 0) {
        st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: register_kv_caches first", fn, e->req);
        continue;
      }
      if (e->type == KV_META_PUSH && c->cfg.producer) {
        struct kv_push *p = calloc(1, sizeof(*p));
        if (!p || kv_worker_address(e->remote, c->rank, e->remote, sizeof(e->remote), &e->cluster) !=
                      HIXL_KV_SUCCESS) {
          free(p);
          st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: cannot push to \"%s\"", fn, e->req, e->remote);
          continue;
        }
        p->e = *e;
        e->blocks = e->rblocks = NULL;
        p->step = c->step;
        p->bound_ns = now;
        c->stats.blocks_held += p->e.nblocks;
        c->stats.requests_held++;
        if (c->push.tail)
          c->push.tail->next = p;
        else
          c->push.pushes = p;
        c->push.tail = p;
        pthread_cond_broadcast(&c->push.cond);
      } else if (e->type == KV_META_EXPECT && c->cfg.consumer && !kv_expect_find(c, e->req)) {
        struct kv_expect *x = calloc(1, sizeof(*x));
        uint8_t *landed = calloc(c->layers, 1);
        if (!x || !landed) {
          free(x);
          free(landed);
          st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
          continue;
        }
        snprintf(x->id, sizeof(x->id), "%s", e->req);
        x->blocks = e->blocks;
        x->n = e->nblocks;
        e->blocks = NULL;
        x->landed = landed;
        x->step = c->step;
        x->deadline_ns = now + (uint64_t)c->cfg.lease_ms * 1000000ull;
        x->next = c->exp.expects;
        c->exp.expects = x;
      }
      continue;
    }
    if (e->type == KV_META_HOLD) {
      if (!c->cfg.producer) continue;
      if (e->epoch != c->hold.epoch || e->seq > c->hold.bound_seq) { /* a PIN of an earlier one fails now */
        c->hold.epoch = e->epoch;
        c->hold.bound_seq = e->seq;
      }
      if (kv_held_find(c, e->req)) continue;
      if (kv_idset_has(&c->gone, e->req)) { /* the consumer freed it already (an abort) */
        kv_finished_add(c, &c->sending_done, e->req);
        continue;
      }
      struct kv_held *h = calloc(1, sizeof(*h));
      if (!h) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        continue;
      }
      snprintf(h->id, sizeof(h->id), "%s", e->req);
      h->blocks = e->blocks;
      h->n = e->nblocks;
      e->blocks = NULL;
      h->expires_ns = kv_now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull;
      h->next = c->hold.held;
      c->hold.held = h;
      c->stats.blocks_held += h->n;
      c->stats.requests_held++;
    } else if (c->cfg.consumer) { /* LOAD or FREE: the loader's */
      struct kv_load *l = calloc(1, sizeof(*l));
      if (!l) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        continue;
      }
      l->e = *e;
      /* This rank pulls from the same rank of the producer. */
      if (kv_worker_address(e->remote, c->rank, l->e.remote, sizeof(l->e.remote), &l->e.cluster) !=
          HIXL_KV_SUCCESS) {
        free(l);
        continue;
      }
      e->blocks = e->rblocks = NULL;
      if (c->load.bound_tail)
        c->load.bound_tail->next = l;
      else
        c->load.bound = l;
      c->load.bound_tail = l;
    }
  }
  pthread_mutex_unlock(&c->lock);
  kv_meta_free(v, n);
  return st;
}

hixl_kv_status kv_clear(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "clear_connector_meta: connector is NULL or a scheduler's");
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_start_load(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "start_load_kv: connector is NULL or a scheduler's");
  pthread_mutex_lock(&c->lock);
  if (c->load.bound && c->cache_id == 0) {
    pthread_mutex_unlock(&c->lock);
    return kv_fail(HIXL_KV_PARAM_INVALID, "start_load_kv: register_kv_caches first");
  }
  hixl_kv_status st = kv_loader_submit(c);
  pthread_mutex_unlock(&c->lock);
  return st;
}

hixl_kv_status kv_wait_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "wait_for_layer_load: connector is NULL or a scheduler's");
  CHECK_ARG(c->cache_id == 0 || layer < c->layers, "wait_for_layer_load: layer %u of %u", layer, c->layers);
  if (!c->cfg.push) return HIXL_KV_SUCCESS; /* pull loads are asynchronous: they end in get_finished */
  /* Push: until layer has landed for every request this step bound (the forward pass
   * about to use it), or one's lease ends. Earlier ones end in get_finished. */
  pthread_mutex_lock(&c->lock);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  for (;;) {
    kv_expects_expire(c);
    uint64_t first = UINT64_MAX;
    for (struct kv_expect *x = c->exp.expects; x; x = x->next)
      if (x->step == c->step && !x->landed[layer] && x->deadline_ns < first) first = x->deadline_ns;
    if (first == UINT64_MAX || c->shut) break;
    struct timespec ts = {.tv_sec = (time_t)(first / 1000000000ull),
                          .tv_nsec = (long)(first % 1000000000ull)};
    pthread_cond_timedwait(&c->exp.landed, &c->lock, &ts);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

hixl_kv_status kv_save_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "save_kv_layer: connector is NULL or a scheduler's");
  CHECK_ARG(c->cache_id == 0 || layer < c->layers, "save_kv_layer: layer %u of %u", layer, c->layers);
  if (c->cfg.push && c->push.saved_step) { /* this step's pushes may send layer now */
    pthread_mutex_lock(&c->lock);
    c->push.saved_step[layer] = c->step;
    pthread_cond_broadcast(&c->push.saved); /* the pusher only */
    pthread_mutex_unlock(&c->lock);
  }
  return HIXL_KV_SUCCESS; /* pull mode: the consumer reads the blocks; nothing to send */
}

hixl_kv_status kv_wait_save(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "wait_for_save: connector is NULL or a scheduler's");
  return HIXL_KV_SUCCESS;
}

/* Cut the links of the peers in c->drop (taken under the lock): producers whose
 * expected pushes expired here, consumers that pinned a request whose lease expired
 * here. Over tcp and rdma nothing more of theirs lands, and no answer of ours reads
 * those blocks, once this returns; so the host may reuse the blocks get_finished and
 * get_block_ids_with_load_errors report. Called without the lock, before either reports. */
static void drop_peers(hixl_kv_connector *c, struct kv_idset *d) {
  const char *why = "a request between us expired here (a lease it pinned, or a push it accepted)";
  for (size_t i = 0; i < d->n; i++) {
    size_t n = 0;
    hixl_engine_drop_peer(c->eng, d->v[i], why, &n);
    if (n) fprintf(stderr, "hixl-kv: cut %zu link(s) with %s: %s\n", n, d->v[i], why);
  }
  kv_idset_clear(d);
}

hixl_kv_status kv_get_finished(hixl_kv_connector *c, const hixl_kv_ids *finished, hixl_kv_ids *sending,
                               hixl_kv_ids *recving) {
  (void)finished;
  CHECK_ARG(c && sending && recving && c->role == HIXL_KV_ROLE_WORKER,
            "get_finished: connector or an output is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  kv_leases_expire(c);
  kv_expects_expire(c);
  struct kv_idset drop = c->drop;
  memset(&c->drop, 0, sizeof(c->drop));
  hixl_kv_ids s = {0}, r = {0};
  int rc = kv_idset_take(&c->sending_done, &s);
  if (rc == 0 && (rc = kv_idset_take(&c->recving_done, &r)) < 0) {
    /* give the sending ids back: nothing is lost */
    for (size_t i = 0; i < s.count; i++) kv_idset_add(&c->sending_done, s.ids[i]);
    kv_free_ids(&s);
  }
  if (rc == 0 && c->efd >= 0) { /* all taken: the fd is quiet until the next one finishes */
    uint64_t v;
    ssize_t n = read(c->efd, &v, sizeof(v)); /* EAGAIN when nothing was signalled */
    (void)n;
  }
  pthread_mutex_unlock(&c->lock);
  drop_peers(c, &drop);
  if (rc < 0) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_finished: out of memory");
  *sending = s;
  *recving = r;
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_load_errors(hixl_kv_connector *c, hixl_kv_blocks *out) {
  CHECK_ARG(c && out && c->role == HIXL_KV_ROLE_WORKER,
            "get_block_ids_with_load_errors: connector or output is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  uint64_t *v = c->err_blocks;
  size_t n = c->nerr;
  c->err_blocks = NULL;
  c->nerr = c->caperr = 0;
  struct kv_idset drop = c->drop;
  memset(&c->drop, 0, sizeof(c->drop));
  pthread_mutex_unlock(&c->lock);
  drop_peers(c, &drop);
  out->ids = v;
  out->count = n;
  out->raw.data = (uint8_t *)v;
  out->raw.len = n * sizeof(*v);
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_get_handshake(hixl_kv_connector *c, hixl_kv_buffer *meta) {
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_WORKER,
            "get_handshake_metadata: connector or meta is NULL, or a "
            "scheduler's");
  char text[384];
  pthread_mutex_lock(&c->lock);
  int n =
      snprintf(text, sizeof(text), "{\"engine\":\"%s\",\"layout\":\"%s\"}", c->engine_addr, c->layout_text);
  pthread_mutex_unlock(&c->lock);
  uint8_t *p = malloc((size_t)n + 1);
  if (!p) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_handshake_metadata: out of memory");
  memcpy(p, text, (size_t)n + 1);
  meta->data = p;
  meta->len = (size_t)n;
  return HIXL_KV_SUCCESS;
}

_Static_assert(offsetof(hixl_kv_stats_ex, layers_pushed) - offsetof(hixl_kv_stats_ex, blocks_held) ==
                   offsetof(hixl_kv_stats, layers_pushed),
               "hixl_kv_stats_ex starts with hixl_kv_stats's fields");

/* The counters now, into out (its size field untouched). */
static void stats_now(hixl_kv_connector *c, hixl_kv_stats_ex *out) {
  pthread_mutex_lock(&c->lock);
  if (c->role == HIXL_KV_ROLE_WORKER) kv_leases_expire(c);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
}

hixl_kv_status kv_stats(hixl_kv_connector *c, hixl_kv_stats *out) {
  CHECK_ARG(c && out, "get_stats: connector or stats is NULL");
  hixl_kv_stats_ex s;
  stats_now(c, &s);
  memcpy(out, &s.blocks_held, sizeof(*out));
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_stats_ex(hixl_kv_connector *c, hixl_kv_stats_ex *out) {
  CHECK_ARG(c && out, "get_stats_ex: connector or stats is NULL");
  CHECK_ARG(out->size >= HIXL_KV_STATS_EX_MIN_SIZE,
            "get_stats_ex: stats->size %u is below %zu: set it to "
            "sizeof(hixl_kv_stats_ex)",
            out->size, (size_t)HIXL_KV_STATS_EX_MIN_SIZE);
  hixl_kv_stats_ex s;
  stats_now(c, &s);
  size_t head = HIXL_KV_STATS_EX_MIN_SIZE, fit = out->size < sizeof(s) ? out->size : sizeof(s);
  size_t n = head + (fit - head) / sizeof(uint64_t) * sizeof(uint64_t); /* whole fields only */
  memcpy((uint8_t *)out + head, (const uint8_t *)&s + head, n - head);
  out->reserved = 0;
  out->size = (uint32_t)n;
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_event_fd(hixl_kv_connector *c, int32_t *fd) {
  CHECK_ARG(c && fd && c->role == HIXL_KV_ROLE_WORKER,
            "get_event_fd: connector or fd is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  if (c->efd < 0) {
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0) {
      int e = errno;
      pthread_mutex_unlock(&c->lock);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_event_fd: eventfd: %s", strerror(e));
    }
    if (c->sending_done.n || c->recving_done.n) kv_efd_signal(c); /* finished before the fd existed */
  }
  *fd = c->efd;
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}
