/* kv_worker: the worker's ops: register the KV caches, bind each step's metadata
 * (HOLD, LOAD, FREE, PUSH, EXPECT entries) to the roles' state, release saved layers
 * to the pusher, wait for landed ones, and report what finished. */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"

/* The groups become the connector's layout: checked, their memory registered (none of
 * it inside alloc_kv_memory's), the digest made. */
static hixl_kv_status setup_groups(hixl_kv_connector *c, const hixl_kv_group *g, size_t n, const char *fn) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "%s: connector is NULL or a scheduler's", fn);
  struct kv_layout l;
  hixl_kv_status st = kv_layout_build(&l, g, n, c->world, true, fn);
  if (st != HIXL_KV_SUCCESS) return st;
  uint64_t *saved = calloc(l.nlayers, sizeof(*saved));
  if (!saved) {
    kv_layout_free(&l);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  pthread_mutex_lock(&c->lock);
  bool twice = c->lay.ng > 0 || c->registering;
  c->registering = true; /* a second call at the same time fails */
  pthread_mutex_unlock(&c->lock);
  if (twice) {
    free(saved);
    kv_layout_free(&l);
    return kv_fail(HIXL_KV_PARAM_INVALID, "%s: caches are already registered", fn);
  }
  st = kv_layout_register(c, &l, fn);
  pthread_mutex_lock(&c->lock);
  c->registering = false;
  if (st == HIXL_KV_SUCCESS) {
    c->push.saved_step = saved;
    c->lay = l;
    c->layers = l.nlayers;
  }
  pthread_mutex_unlock(&c->lock);
  if (st != HIXL_KV_SUCCESS) {
    free(saved);
    kv_layout_free(&l);
  } else {
    kv_words_setup(c); /* push: the landed bytes, sized by the layers */
  }
  return st;
}

hixl_kv_status kv_register_groups(hixl_kv_connector *c, const hixl_kv_group *g, size_t n) {
  return setup_groups(c, g, n, "register_kv_groups");
}

hixl_kv_status kv_alloc_memory(hixl_kv_connector *c, uint64_t bytes, uintptr_t *base) {
  const char *fn = "alloc_kv_memory";
  CHECK_ARG(c && base && c->role == HIXL_KV_ROLE_WORKER, "%s: connector or base is NULL, or a scheduler's",
            fn);
  CHECK_ARG(!c->cfg.kv_device,
            "%s: kv_memory is device, and this allocates host memory: register the runtime's device memory "
            "with register_kv_groups",
            fn);
  CHECK_ARG(bytes > 0 && bytes <= (UINT64_C(1) << 46), "%s: %" PRIu64 " bytes; 1 to 2^46", fn, bytes);
  void *p = NULL;
  HixlMemHandle h = NULL;
  HixlStatus st = HixlEngineAllocMem(c->eng, (size_t)bytes, &p, &h);
  if (st != HIXL_SUCCESS)
    return kv_fail(st, "%s: %" PRIu64 " bytes: %s", fn, bytes, HixlGetLastErrorMessage());
  /* Grown and appended in one hold of the lock: calls on several threads each add theirs. */
  pthread_mutex_lock(&c->lock);
  struct kv_mem *v = realloc(c->mems, (c->nmems + 1) * sizeof(*v));
  if (v) c->mems = v, c->mems[c->nmems++] = (struct kv_mem){(uintptr_t)p, bytes, h};
  pthread_mutex_unlock(&c->lock);
  if (!v) {
    HixlEngineFreeMem(c->eng, h);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  *base = (uintptr_t)p;
  return HIXL_KV_SUCCESS;
}

/* register_kv_caches (the host's memory at ly[i].base), or alloc_kv_caches (alloc:
 * one allocation of alloc_kv_memory, each tensor at a page boundary; base and v_offset
 * are written back on success): one group of K and V planes (KV-first) or of one
 * plane per layer (blocks-first). */
static hixl_kv_status kv_setup(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n, bool alloc) {
  const char *fn = alloc ? "alloc_kv_caches" : "register_kv_caches";
  CHECK_ARG(c && ly && n > 0 && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or layers is NULL, none given, or a "
            "scheduler's connector",
            fn);
  pthread_mutex_lock(&c->lock); /* a registration on another thread sets it */
  bool done = c->lay.ng > 0 || c->registering;
  pthread_mutex_unlock(&c->lock);
  CHECK_ARG(!done, "%s: caches are already registered", fn);
  CHECK_ARG(n <= KV_MAX_PLANES / 2, "%s: %zu layers; at most %u", fn, n, KV_MAX_PLANES / 2);
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
    CHECK_ARG(alloc || l->layout != HIXL_KV_LAYOUT_KV_FIRST ||
                  (l->v_offset >= l->num_blocks * l->block_bytes && l->base + l->v_offset > l->base),
              "%s: layer %zu: V at offset %" PRIu64 " overlaps K's %" PRIu64 " bytes, or wraps past 2^64", fn,
              i, l->v_offset, l->num_blocks * l->block_bytes);
    CHECK_ARG(l->num_blocks == l0->num_blocks && l->block_bytes == l0->block_bytes &&
                  l->layout == l0->layout && l->elem_size == l0->elem_size &&
                  l->block_tokens == l0->block_tokens,
              "%s: layer %zu differs from layer 0 (every layer must have the same shape)", fn, i);
    CHECK_ARG(l->num_blocks <= (UINT64_C(1) << 40) / l->block_bytes, "%s: layer %zu is too large", fn, i);
  }
  bool split = l0->layout == HIXL_KV_LAYOUT_KV_FIRST;
  uint32_t ppl = split ? 2 : 1;
  uint64_t item = split ? l0->block_bytes : 2 * l0->block_bytes;
  uint64_t tensor = (l0->num_blocks * item + 4095) / 4096 * 4096; /* allocated: page-aligned tensors */
  uintptr_t base = 0;
  if (alloc) {
    hixl_kv_status st = kv_alloc_memory(c, tensor * n * ppl, &base);
    if (st != HIXL_KV_SUCCESS) return kv_fail(st, "%s: %s", fn, kv_last_error());
  }
  hixl_kv_plane *planes = calloc(n * ppl, sizeof(*planes));
  if (!planes) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (size_t i = 0; i < n; i++)
    for (uint32_t t = 0; t < ppl; t++) {
      uintptr_t b = alloc ? base + (i * ppl + t) * tensor : ly[i].base + t * ly[i].v_offset;
      planes[i * ppl + t] = (hixl_kv_plane){.base = b, .block_stride = item, .block_bytes = item};
    }
  hixl_kv_group g = {.size = sizeof(g),
                     .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                     .num_layers = (uint32_t)n,
                     .planes_per_layer = ppl,
                     .planes = planes,
                     .num_blocks = l0->num_blocks,
                     .block_tokens = l0->block_tokens,
                     .elem_size = l0->elem_size,
                     .layout = split ? "kv_first" : "blocks_first",
                     .layout_len = split ? 8 : 12};
  hixl_kv_status st = setup_groups(c, &g, 1, fn);
  for (size_t i = 0; i < n && alloc && st == HIXL_KV_SUCCESS; i++) { /* written back only on success */
    ly[i].base = planes[i * ppl].base;
    ly[i].v_offset = split ? tensor : 0;
  }
  free(planes); /* an allocation made for a call that failed stays until destroy */
  return st;
}

hixl_kv_status kv_register(hixl_kv_connector *c, const hixl_kv_layer *ly, size_t n) {
  return kv_setup(c, (hixl_kv_layer *)ly, n, false); /* nothing is written back */
}

hixl_kv_status kv_alloc_caches(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n) {
  if (c && c->cfg.kv_device)
    return kv_fail(
        HIXL_KV_PARAM_INVALID,
        "alloc_kv_caches: kv_memory is device, and this allocates host memory: register the runtime's "
        "device memory with register_kv_caches");
  return kv_setup(c, ly, n, true);
}

#define ROLE_WHY                                                                                             \
  "this worker's role (its config's role, or kv_role) takes no part in it: give the scheduler and its "      \
  "workers the same role"

/* An entry this worker takes no part in (its config names another role than its
 * scheduler's, or no caches are registered to check it against): refused, said, and
 * reported finished, so the host frees (a HOLD or PUSH: sending) or recomputes (a LOAD
 * or EXPECT: receiving, its blocks load errors) the blocks it keeps for the request,
 * instead of waiting for it for ever. Lock held. */
static void entry_ended(hixl_kv_connector *c, const struct kv_meta_entry *e, const char *gone) {
  if (e->type == KV_META_HOLD || e->type == KV_META_PUSH) {
    if (e->type == KV_META_PUSH) c->stats.pushes_failed++;
    kv_finished_add(c, &c->sending_done, e->req);
  } else {
    kv_recv_refused(c, e, KV_CAUSE_REFUSED);
  }
  if (e->type == KV_META_HOLD || e->type == KV_META_EXPECT) /* its peer's PIN or ACCEPT hears GONE */
    kv_gone_add_why(c, e->req, gone);                       /* a constant */
}

static hixl_kv_status entry_refused(hixl_kv_connector *c, const struct kv_meta_entry *e, const char *why) {
  entry_ended(c, e, "refused: the worker's role or caches do not take it");
  return kv_fail(HIXL_KV_PARAM_INVALID, "bind_connector_meta: request %s: %s", e->req, why);
}

hixl_kv_status kv_bind(hixl_kv_connector *c, const uint8_t *meta, size_t len) {
  const char *fn = "bind_connector_meta";
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or metadata is NULL, or a scheduler's", fn);
  struct kv_meta_entry *v = NULL;
  size_t n = 0;
  uint8_t key[KV_CAP_KEY_LEN];
  CHECK_ARG(kv_meta_parse(meta, len, key, &v, &n),
            "%s: %zu bytes of metadata do not parse (not from this plugin's "
            "build_connector_meta?)",
            fn, len);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  pthread_mutex_lock(&c->lock);
  c->step++; /* one bind per step: this step's save_kv_layer calls release its pushes */
  memcpy(c->cap_key, key, sizeof(key)); /* the scheduler's: capabilities of its requests derive from it */
  c->cap_key_set = true;
  kv_cap_wipe(key, sizeof(key));
  uint64_t now = kv_now_ns();
  for (size_t i = 0; i < n; i++) {
    struct kv_meta_entry *e = &v[i];
    if (c->shut) { /* no thread is left to run it: ended as refused (a FREE or RENEW is best effort) */
      if (e->type != KV_META_FREE && e->type != KV_META_RENEW) {
        entry_ended(c, e, "refused: its worker shut down");
        st = kv_fail(HIXL_KV_FAILED, "%s: request %s: the connector is shut down", fn, e->req);
      }
      continue;
    }
    if (e->type == KV_META_PUSH || e->type == KV_META_EXPECT) {
      if (c->lay.ng == 0 || e->ngroups != c->lay.ng) {
        st = entry_refused(c, e,
                           c->lay.ng ? "its blocks name another number of KV cache groups than registered"
                                     : "register_kv_caches (or register_kv_groups) first");
        continue;
      }
      if (e->type == KV_META_PUSH && c->cfg.producer) {
        hixl_kv_status ps = kv_push_parts(c, e, now); /* one part per consumer rank it writes */
        if (ps != HIXL_KV_SUCCESS)
          st = ps;
        else
          kv_obs_phase(c, e->req, KV_PH_BOUND, e->remote);
      } else if (e->type == KV_META_EXPECT && c->cfg.consumer) {
        hixl_kv_status xs = kv_expect_bind(c, e, now); /* said: PARAM_INVALID or out of memory */
        if (xs != HIXL_KV_SUCCESS) st = xs;
      } else {
        st = entry_refused(c, e, ROLE_WHY);
      }
      continue;
    }
    if (e->type == KV_META_RENEW) { /* nothing of this side's: a producer's hold renewed */
      if (c->cfg.consumer && !c->cfg.push)
        kv_renew_bind(c, e);
      else
        st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: a renewal of its producer's hold: %s", fn,
                     e->req, ROLE_WHY);
      continue;
    }
    if (e->type == KV_META_HOLD) {
      if (!c->cfg.producer) {
        st = entry_refused(c, e, ROLE_WHY);
        continue;
      }
      if (e->epoch != c->hold.epoch || e->seq > c->hold.bound_seq) { /* a PIN of an earlier one fails now */
        c->hold.epoch = e->epoch;
        c->hold.bound_seq = e->seq;
      }
      hixl_kv_status hs = kv_held_bind(c, e);
      if (hs != HIXL_KV_SUCCESS) st = hs;
    } else if (c->cfg.consumer) { /* LOAD or FREE: the loader's, one part per producer rank (kv_tp.c) */
      hixl_kv_status ls = kv_load_parts(c, e);
      if (ls != HIXL_KV_SUCCESS)
        st = ls;
      else if (e->type != KV_META_FREE)
        kv_obs_phase(c, e->req, KV_PH_BOUND, e->remote);
    } else if (e->type == KV_META_LOAD) {
      st = entry_refused(c, e, ROLE_WHY);
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

/* load_in_forward: every load of the step ended, before the forward pass reads their
 * blocks (whole requests, not layer by layer). They end within their own timeouts
 * (link, PIN, transfer), as handle_preemptions counts on; a failed one's blocks go to
 * get_block_ids_with_load_errors, read after this forward pass, so the runtime
 * recomputes or fails the request (its sampled token dropped). */
static hixl_kv_status forward_loads_wait(hixl_kv_connector *c, const char *fn) {
  pthread_mutex_lock(&c->lock);
  if (c->load.in_forward && c->load.nthreads == 0 && !c->shut) {
    uint32_t n = c->load.in_forward;
    pthread_mutex_unlock(&c->lock);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED,
                   "%s: %u load(s) of this step have no loader thread to run them "
                   "(start_load_kv failed to start one)",
                   fn, n);
  }
  while (c->load.in_forward && !c->shut) pthread_cond_wait(&c->load.ended, &c->lock);
  hixl_kv_ids done = {0};
  int rc = c->load.forward_done.n ? kv_idset_take(&c->load.forward_done, &done) : 0;
  pthread_mutex_unlock(&c->lock);
  if (rc == 0 && done.count) { /* their traces end, as get_finished's reports end the others' */
    kv_obs_reported(c, &done);
    kv_free_ids(&done);
  }
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_start_load(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "start_load_kv: connector is NULL or a scheduler's");
  pthread_mutex_lock(&c->lock);
  if (c->load.bound && c->lay.ng == 0) {
    pthread_mutex_unlock(&c->lock);
    return kv_fail(HIXL_KV_PARAM_INVALID, "start_load_kv: register_kv_caches first");
  }
  hixl_kv_status st = kv_loader_submit(c);
  pthread_mutex_unlock(&c->lock);
  /* load_in_forward: the runtime calls this before the forward pass (vLLM: for a step
   * with synchronous loads), which writes the new tokens' KV into these blocks before
   * its attention waits (wait_for_layer_load): the blocks must be whole by then. */
  if (st == HIXL_KV_SUCCESS && c->cfg.load_in_forward) st = forward_loads_wait(c, "start_load_kv");
  return st;
}

/* How long wait_for_layer_load polls landed bytes, yielding between looks, before it
 * naps between them (a layer's transfer at most, on the hosts measured: issue 47); the
 * first nap, doubled each time up to the last (a producer that died after its accept
 * costs a wake-up a millisecond until the lease ends, not 20). */
#define KV_WORD_SPIN_NS    5000000ull
#define KV_WORD_NAP_NS     50000ull
#define KV_WORD_NAP_MAX_NS 1000000ull

/* Whether layer of x landed from every producer rank that writes it: its notice, or
 * its landed byte. Lock held. */
static bool layer_held(const hixl_kv_connector *c, const struct kv_expect *x, uint32_t layer) {
  if (!x->want) return false; /* no producer accepted it yet */
  uint64_t miss = x->want & ~x->landed[layer];
  if (miss & ~x->wranks) return false; /* a rank without landed bytes: its notice */
  for (uint32_t r = 0; miss && r < KV_TP_MAX; r++)
    if ((miss >> r & 1) && !kv_word_landed(c, x, layer, r)) return false;
  return true;
}

hixl_kv_status kv_wait_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "wait_for_layer_load: connector is NULL or a scheduler's");
  pthread_mutex_lock(&c->lock); /* a registration on another thread sets them */
  uint32_t nl = c->layers;
  bool ok = c->lay.ng == 0 || layer < nl;
  pthread_mutex_unlock(&c->lock);
  CHECK_ARG(ok, "wait_for_layer_load: layer %u of %u", layer, nl);
  /* Pull: loads are asynchronous, they end in get_finished; load_in_forward ones ended in
   * start_load_kv (here only if it failed to wait). */
  if (!c->cfg.push)
    return c->cfg.load_in_forward ? forward_loads_wait(c, "wait_for_layer_load") : HIXL_KV_SUCCESS;
  /* Push: until layer has landed for every request this step bound (the forward pass
   * about to use it), or one's lease ends. Earlier ones end in get_finished. A layer
   * told by landed bytes (kv_word.c) wakes nobody: it is polled, yielding the CPU between
   * looks for up to KV_WORD_SPIN_NS a call, then napping between them. */
  pthread_mutex_lock(&c->lock);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  uint64_t t0 = kv_now_ns(), nap = KV_WORD_NAP_NS;
  for (;;) {
    kv_expects_expire(c);
    uint64_t first = UINT64_MAX;
    bool bytes = false; /* one waited for may be told by its landed bytes */
    /* This step's are the newest (bound in order): the walk stops at the first of an earlier step. */
    for (const struct kv_idnode *n = c->exp.expects.newest; n; n = kv_idnode_older(n)) {
      const struct kv_expect *x = kv_idnode_val(n);
      if (x->step != c->step) break;
      if (layer_held(c, x, layer)) continue;
      if (x->deadline_ns < first) first = x->deadline_ns;
      bytes |= x->wranks != 0;
    }
    if (first == UINT64_MAX || c->shut) break;
    uint64_t now = kv_now_ns();
    if (bytes && now - t0 < KV_WORD_SPIN_NS) {
      pthread_mutex_unlock(&c->lock);
      sched_yield();
      pthread_mutex_lock(&c->lock);
      continue;
    }
    if (bytes && now + nap < first) first = now + nap;
    if (bytes && nap < KV_WORD_NAP_MAX_NS) nap *= 2;
    struct timespec ts = {.tv_sec = (time_t)(first / 1000000000ull),
                          .tv_nsec = (long)(first % 1000000000ull)};
    pthread_cond_timedwait(&c->exp.landed, &c->lock, &ts);
  }
  pthread_mutex_unlock(&c->lock);
  /* No revoke here: the forward pass waits for its layer, not for the grants of the
   * pushes that ended (the last layer's revoke held it ~0.7 M instructions at 1024
   * tokens, issue 47); the KV service's handler makes them, and get_finished waits for
   * them before the host hears the blocks are free (kv_revoke_settle). */
  return st;
}

hixl_kv_status kv_save_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "save_kv_layer: connector is NULL or a scheduler's");
  pthread_mutex_lock(&c->lock); /* saved_step and layers are set together, by the registration */
  uint32_t n = c->layers;
  bool ok = c->lay.ng == 0 || layer < n;
  if (ok && c->cfg.push && c->push.saved_step) { /* this step's pushes may send layer now */
    c->push.saved_step[layer] = c->step;
    pthread_cond_broadcast(&c->push.saved); /* the pusher only */
  }
  pthread_mutex_unlock(&c->lock);
  CHECK_ARG(ok, "save_kv_layer: layer %u of %u", layer, n);
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
static void drop_peers(hixl_kv_connector *c, struct kv_idhash *d) {
  const char *why = "a request between us expired here (a lease it pinned, or a push it accepted)";
  for (const struct kv_idnode *x = d->newest; x; x = kv_idnode_older(x)) {
    size_t n = 0;
    hixl_engine_drop_peer(c->eng, kv_idnode_id(x), why, &n);
    if (n) log_warn("hixl-kv: cut %zu link(s) with %s: %s", n, kv_idnode_id(x), why);
  }
  kv_idhash_clear(d, NULL);
  kv_revoke_settle(c); /* the grants of what ended, as their links go, also those another thread revokes */
}

hixl_kv_status kv_get_finished(hixl_kv_connector *c, const hixl_kv_ids *finished, hixl_kv_ids *sending,
                               hixl_kv_ids *recving) {
  (void)finished;
  CHECK_ARG(c && sending && recving && c->role == HIXL_KV_ROLE_WORKER,
            "get_finished: connector or an output is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  kv_leases_expire(c);
  kv_expects_expire(c);
  struct kv_idhash drop = c->drop;
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
  kv_obs_reported(c, &s);
  kv_obs_reported(c, &r);
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
  struct kv_idhash drop = c->drop;
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
            "get_handshake_metadata: connector or meta is NULL, or a scheduler's");
  size_t cap = sizeof(c->engine_addr) + sizeof(c->lay.text) + 32;
  char *p = malloc(cap);
  if (!p) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_handshake_metadata: out of memory");
  pthread_mutex_lock(&c->lock);
  int n = snprintf(p, cap, "{\"engine\":\"%s\",\"layout\":\"%s\"}", c->engine_addr, c->lay.text);
  pthread_mutex_unlock(&c->lock);
  meta->data = (uint8_t *)p;
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
  if (c->role == HIXL_KV_ROLE_WORKER) kv_revoke_flush(c);
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

/* Unlink from *head the loads of the ids (a singly linked list with a tail). Lock held. */
static struct kv_load *loads_take(struct kv_load **head, struct kv_load **tail, const hixl_kv_ids *ids) {
  struct kv_load *out = NULL, *prev = NULL;
  for (struct kv_load *l = *head, *next; l; l = next) {
    next = l->next;
    bool hit = false;
    for (size_t i = 0; i < ids->count && !hit; i++) hit = ids->ids[i] && strcmp(ids->ids[i], l->e.req) == 0;
    if (!hit) {
      prev = l;
      continue;
    }
    if (prev)
      prev->next = next;
    else
      *head = next;
    if (*tail == l) *tail = prev;
    l->next = out;
    out = l;
  }
  return out;
}

static bool ids_any(const struct kv_idset *s, const hixl_kv_ids *ids) {
  for (size_t i = 0; i < ids->count; i++)
    if (ids->ids[i] && kv_idset_has(s, ids->ids[i])) return true;
  return false;
}

static bool ids_hit(const hixl_kv_ids *ids, const char *id) {
  for (size_t i = 0; i < ids->count; i++)
    if (ids->ids[i] && strcmp(ids->ids[i], id) == 0) return true;
  return false;
}

/* Mark the loads of the ids the loader threads run (they end failed if they have not
 * started pulling; kv_loader.c checks under the lock); whether any of them runs, a
 * FREE included. Lock held. */
static bool running_mark(hixl_kv_connector *c, const hixl_kv_ids *ids) {
  bool any = false;
  for (uint32_t t = 0; t < KV_LOADERS_MAX; t++) {
    struct kv_load *l = c->load.running[t];
    if (!l || !ids_hit(ids, l->e.req)) continue;
    any = true;
    if (l->whole && !l->preempted) {
      l->preempted = true;
      kv_obs_cause_set(c, l->e.req, KV_CAUSE_ABORTED);
    }
  }
  return any;
}

hixl_kv_status kv_preemptions(hixl_kv_connector *c, const hixl_kv_ids *ids) {
  const char *fn = "handle_preemptions";
  CHECK_ARG(c && ids && (ids->count == 0 || ids->ids) && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or ids is NULL, or a scheduler's", fn);
  pthread_mutex_lock(&c->lock);
  /* Loads not started and pushes not yet taken: they end now, failed. */
  struct kv_load *gone = loads_take(&c->load.bound, &c->load.bound_tail, ids);
  struct kv_load *q = loads_take(&c->load.queue, &c->load.queue_tail, ids);
  struct kv_push *pushes = NULL;
  for (struct kv_push **pp = &c->push.pushes, *prev = NULL; *pp;) {
    struct kv_push *p = *pp;
    bool hit = false;
    for (size_t i = 0; i < ids->count && !hit; i++) hit = ids->ids[i] && strcmp(ids->ids[i], p->e.req) == 0;
    if (!hit) {
      prev = p;
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    if (c->push.tail == p) c->push.tail = prev;
    p->next = pushes;
    pushes = p;
  }
  for (int k = 0; k < 2; k++)
    for (struct kv_load *l = k ? q : gone; l; l = l->next) {
      if (l->ahead_by) c->load.slots[l->ahead_by - 1].ahead_stale = true; /* its PIN sent ahead */
      if (l->whole) kv_obs_cause_set(c, l->e.req, KV_CAUSE_ABORTED);
      kv_load_part_end(c, l, HIXL_FAILED, "preempted (handle_preemptions)"); /* a FREE: nothing */
    }
  /* Pushes expected into the blocks: they end failed, and the producers that accepted
   * them are cut off before the host hears of it (as when their lease ends). */
  for (size_t i = 0; i < ids->count; i++) {
    struct kv_expect *x = ids->ids[i] ? kv_expect_find(c, ids->ids[i]) : NULL;
    if (x) kv_expect_preempt(c, x);
  }
  /* Loads and pushes under way: those not yet pulling end failed at once, the others
   * are waited for (they end within their timeouts). */
  bool running = running_mark(c, ids);
  KV_TEST_POINT(KV_TEST_PREEMPT_WAIT);
  while (running) {
    pthread_cond_wait(&c->load.ended, &c->lock);
    running = running_mark(c, ids);
  }
  while (ids_any(&c->push.active, ids)) pthread_cond_wait(&c->push.cond, &c->lock);
  struct kv_idhash drop = c->drop;
  memset(&c->drop, 0, sizeof(c->drop));
  pthread_mutex_unlock(&c->lock);
  drop_peers(c, &drop);
  for (int k = 0; k < 2; k++)
    for (struct kv_load *l = k ? q : gone, *next; l; l = next) {
      next = l->next;
      uint8_t ans[64]; /* the producer rank may hold it: free it there (best effort) */
      size_t n;
      kv_tell(c, &l->e, KV_SVC_FREE, "", ans, sizeof(ans), &n);
      free(l->e.blocks);
      free(l->e.rblocks);
      free(l);
    }
  for (struct kv_push *p = pushes, *next; p; p = next) {
    next = p->next;
    uint8_t ans[256];
    size_t n;
    kv_tell(c, &p->e, KV_SVC_ABORT, "the producer's request was preempted", ans, sizeof(ans), &n);
    kv_obs_failed(c, p->e.req, KV_CAUSE_ABORTED, "preempted (handle_preemptions)");
    pthread_mutex_lock(&c->lock);
    kv_push_part_end(c, p, false);
    pthread_mutex_unlock(&c->lock);
    free(p->e.blocks);
    free(p->e.rblocks);
    free(p->r.planes);
    free(p);
  }
  return HIXL_KV_SUCCESS;
}
