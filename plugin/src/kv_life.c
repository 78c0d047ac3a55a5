/* kv_life: create, shut down and destroy a connector; the ops table and the one
 * exported symbol. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"
#include "util/thread.h"

#define KV_EXPORT __attribute__((visibility("default")))

/* The connector's lock and condition variables (kv_create made them). */
static void sync_destroy(hixl_kv_connector *c) {
  pthread_cond_destroy(&c->load.cond);
  pthread_cond_destroy(&c->load.ended);
  pthread_cond_destroy(&c->load.renew);
  pthread_cond_destroy(&c->push.cond);
  pthread_cond_destroy(&c->push.saved);
  pthread_cond_destroy(&c->exp.landed);
  pthread_cond_destroy(&c->revoked);
  pthread_mutex_destroy(&c->lock);
}

hixl_kv_status kv_create(const char *json, size_t len, int32_t role, uint32_t rank, uint32_t world,
                         hixl_kv_connector **out, char *err, size_t err_cap) {
  hixl_kv_status st;
  char why[512] = "";
  hixl_kv_connector *c = NULL;
  hixl_log_init(); /* HIXL_LOG_LEVEL: a scheduler makes no engine, whose Create would read it */
  if (!json || !out || (role != HIXL_KV_ROLE_SCHEDULER && role != HIXL_KV_ROLE_WORKER) || world == 0 ||
      world > KV_TP_MAX || rank >= world) {
    st = kv_fail(HIXL_KV_PARAM_INVALID,
                 "create: config_json or out is NULL, role %d is unknown, or rank %u is not "
                 "below world size %u (1 to %u)",
                 role, rank, world, KV_TP_MAX);
    goto fail;
  }
  if (!(c = calloc(1, sizeof(*c)))) {
    st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "create: out of memory");
    goto fail;
  }
  c->role = role;
  c->rank = rank;
  c->world = world;
  c->efd = -1;
  if (getrandom(&c->sched.epoch, sizeof(c->sched.epoch), 0) != sizeof(c->sched.epoch))
    c->sched.epoch = kv_now_ns() ^ ((uint64_t)getpid() << 32);
  c->sched.epoch = (c->sched.epoch & ((1ull << 52) - 1)) | 1; /* never 0: 0 is "not given" */
  if (role == HIXL_KV_ROLE_SCHEDULER && (st = kv_cap_key_new(c->sched.cap_key)) != HIXL_KV_SUCCESS) {
    free(c);
    goto fail;
  }
  if ((st = kv_config_load(json, len, &c->cfg, why, sizeof(why))) != HIXL_KV_SUCCESS) {
    kv_fail(st, "create: %s", why);
    goto fail_cfg;
  }
  if ((st = kv_obs_new(&c->cfg, role, rank, &c->obs, why, sizeof(why))) != HIXL_KV_SUCCESS) {
    kv_fail(st, "create: %s", why);
    goto fail_obs;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->load.cond, &ca);
  pthread_cond_init(&c->load.ended, &ca);
  pthread_cond_init(&c->load.renew, &ca);
  pthread_cond_init(&c->push.cond, &ca);
  pthread_cond_init(&c->push.saved, &ca);
  pthread_cond_init(&c->exp.landed, &ca);
  pthread_cond_init(&c->revoked, &ca);
  pthread_condattr_destroy(&ca);
  if (role == HIXL_KV_ROLE_WORKER) {
    if ((st = kv_worker_address(c->cfg.address, rank, c->engine_addr, sizeof(c->engine_addr), &c->cluster)) !=
        HIXL_KV_SUCCESS)
      goto fail_sync;
    if ((st = HixlEngineCreate(&c->eng)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_sync;
    }
    if ((st = HixlEngineInitialize(c->eng, c->engine_addr, c->cfg.opts, c->cfg.nopts)) != HIXL_SUCCESS) {
      kv_fail(st, "create: engine %s: %s", c->engine_addr, HixlGetLastErrorMessage());
      goto fail_engine;
    }
    /* Scoped: a peer reaches only the blocks of the requests granted to it (kv_grant.c).
     * A same-host peer is not scoped (it reaches host memory by its own copies): it gets
     * the KV caches in device memory by IPC handle whole, opened once per link, so its
     * pulls and pushes go device to device instead of as tcp frames through host
     * buffers (a grant per request never covers a whole allocation). */
    if ((st = hixl_engine_set_scoped(c->eng, true)) != HIXL_SUCCESS ||
        (st = hixl_engine_set_devmap_scoped(c->eng, false)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_engine;
    }
    if ((st = HixlCacheManagerCreate(c->eng, c->cluster, &c->mgr)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_engine;
    }
    if ((st = hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, kv_serve, c)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_mgr;
    }
    if (c->cfg.push && c->cfg.producer) {
      int rc = pthread_create(&c->push.thread, NULL, kv_pusher_main, c);
      if (rc != 0) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "create: pthread_create: %s", strerror(rc));
        goto fail_service;
      }
      thread_name(c->push.thread, "hixl-kv-push");
      c->push.on = true;
    }
  }
  *out = c;
  return HIXL_KV_SUCCESS;

fail_service:
  hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, NULL, NULL);
fail_mgr:
  HixlCacheManagerDestroy(c->mgr);
fail_engine:
  HixlEngineDestroy(c->eng);
fail_sync:
  sync_destroy(c);
  kv_obs_free(c->obs);
fail_obs:
  kv_config_free(&c->cfg);
fail_cfg:
  kv_cap_wipe(c->sched.cap_key, sizeof(c->sched.cap_key));
  free(c);
fail:
  if (err && err_cap) snprintf(err, err_cap, "%s", kv_last_error());
  return st;
}

static void loads_free(struct kv_load *l);

/* Loads bound or queued that no loader thread took (none started, or every one had
 * left): ended failed, so the host hears of each in get_finished (its blocks in the
 * load errors) instead of waiting for it for ever. Their producers' leases free them
 * there. c->lock held. */
static void loads_left_end(hixl_kv_connector *c, struct kv_load **list, struct kv_load **tail) {
  for (struct kv_load *l = *list; l; l = l->next)
    if (l->e.type != KV_META_FREE) kv_load_part_end(c, l, HIXL_FAILED, "FAILED: shut down before it ran");
  loads_free(*list);
  *list = *tail = NULL;
}

hixl_kv_status kv_shutdown(hixl_kv_connector *c) {
  CHECK_ARG(c, "shutdown: connector is NULL");
  pthread_mutex_lock(&c->lock);
  if (!c->shut) c->shut_ns = kv_now_ns();
  c->shut = true;
  pthread_cond_broadcast(&c->load.cond);
  pthread_cond_broadcast(&c->push.cond);
  pthread_cond_broadcast(&c->push.saved);
  pthread_cond_broadcast(&c->exp.landed);
  /* One caller joins the threads; one on another thread meanwhile returns once they are. */
  while (c->joined == 1) pthread_cond_wait(&c->load.cond, &c->lock);
  bool mine = c->joined == 0;
  if (mine) c->joined = 1;
  pthread_mutex_unlock(&c->lock);
  if (!mine) return HIXL_KV_SUCCESS;
  kv_loader_join(c);
  if (c->push.on) pthread_join(c->push.thread, NULL);
  pthread_mutex_lock(&c->lock);
  loads_left_end(c, &c->load.bound, &c->load.bound_tail);
  loads_left_end(c, &c->load.queue, &c->load.queue_tail);
  c->push.on = false;
  c->joined = 2;
  pthread_cond_broadcast(&c->load.cond);
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

static void loads_free(struct kv_load *l) {
  while (l) {
    struct kv_load *n = l->next;
    if (l->whole && --l->whole->left == 0) free(l->whole); /* a request's last part */
    free(l->e.blocks);
    free(l->e.rblocks);
    free(l);
    l = n;
  }
}

hixl_kv_status kv_destroy(hixl_kv_connector *c) {
  CHECK_ARG(c, "destroy: connector is NULL");
  kv_shutdown(c);
  if (c->eng) {
    hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, NULL, NULL);
    HixlCacheManagerDestroy(c->mgr);
    for (size_t i = 0; i < c->nregs; i++) HixlEngineDeregisterMem(c->eng, c->regs[i]);
    for (size_t i = 0; i < c->nmems; i++) HixlEngineFreeMem(c->eng, c->mems[i].h);
    kv_words_free(c);
    HixlEngineDestroy(c->eng);
  }
  free(c->regs);
  free(c->mems);
  kv_layout_free(&c->lay);
  kv_idhash_clear(&c->hold.held, kv_held_free);
  loads_free(c->load.bound);
  loads_free(c->load.queue);
  free(c->load.renews);
  while (c->push.pushes) {
    struct kv_push *p = c->push.pushes;
    c->push.pushes = p->next;
    if (p->whole && --p->whole->left == 0) free(p->whole);
    free(p->e.blocks);
    free(p->e.rblocks);
    free(p->r.planes);
    free(p);
  }
  kv_idhash_clear(&c->exp.expects, kv_expect_free);
  kv_idhash_clear(&c->sched.allocs, kv_alloc_free);
  kv_idhash_clear(&c->sched.pushing, NULL);
  kv_idhash_clear(&c->sched.delayed, NULL);
  kv_idhash_clear(&c->sched.ended, NULL);
  kv_idset_clear(&c->load.busy);
  kv_idset_clear(&c->push.active);
  kv_idhash_clear(&c->sched.holding, NULL);
  kv_idhash_clear(&c->drop, NULL);
  kv_idhash_clear(&c->unreach, NULL);
  kv_idhash_clear(&c->load.norenew, NULL);
  kv_idhash_clear(&c->push.noword, NULL);
  free(c->push.saved_step);
  kv_idhash_clear(&c->sched.failed, NULL);
  kv_idhash_clear(&c->sched.waiting, free);
  kv_idhash_clear(&c->gone, NULL);
  kv_idset_clear(&c->sending_done);
  kv_idset_clear(&c->recving_done);
  kv_idset_clear(&c->load.forward_done);
  free(c->err_blocks);
  kv_revq_free(c);
  free(c->sched.meta.p);
  if (c->efd >= 0) close(c->efd);
  kv_obs_free(c->obs);
  kv_config_free(&c->cfg);
  sync_destroy(c);
  kv_cap_wipe(c->sched.cap_key, sizeof(c->sched.cap_key));
  kv_cap_wipe(c->cap_key, sizeof(c->cap_key));
  free(c);
  return HIXL_KV_SUCCESS;
}

/* ---- 1.3 ops not built yet: UNSUPPORTED, with the reason ---- */

/* hixl moves any layout register_kv_groups describes between instances of one world
 * size: none is required. Of different sizes a rank's heads are cut from each block,
 * which needs each head's tokens together: required_kv_layout HND asks for that
 * (kv_tp.c). */
static hixl_kv_status kv_required_layout(hixl_kv_connector *c, hixl_kv_buffer *layout) {
  CHECK_ARG(c && layout, "get_required_kvcache_layout: connector or layout is NULL");
  const char *want = c->cfg.hnd ? "HND" : "";
  uint8_t *p = calloc(1, 4);
  if (!p) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_required_kvcache_layout: out of memory");
  memcpy(p, want, strlen(want));
  layout->data = p;
  layout->len = strlen(want);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_worker_meta(hixl_kv_connector *c, hixl_kv_buffer *meta) {
  CHECK_ARG(c && meta, "build_connector_worker_meta: connector or meta is NULL");
  return kv_fail(HIXL_KV_UNSUPPORTED, "build_connector_worker_meta: hixl's workers have nothing for the "
                                      "scheduler beyond get_finished and get_block_ids_with_load_errors");
}

/* ---- the table and the one exported symbol ---- */

static const hixl_kv_ops kv_ops_v1 = {
    .abi_version = HIXL_KV_ABI_VERSION,
    .size = sizeof(hixl_kv_ops),
    .create = kv_create,
    .destroy = kv_destroy,
    .shutdown = kv_shutdown,
    .last_error = kv_last_error,
    .free_buffer = kv_free_buffer,
    .free_ids = kv_free_ids,
    .get_num_new_matched_tokens = kv_matched,
    .update_state_after_alloc = kv_after_alloc,
    .build_connector_meta = kv_build_meta,
    .request_finished = kv_finished,
    .update_connector_output = kv_update_output,
    .set_handshake_metadata = kv_set_handshake,
    .register_kv_caches = kv_register,
    .alloc_kv_caches = kv_alloc_caches,
    .bind_connector_meta = kv_bind,
    .clear_connector_meta = kv_clear,
    .start_load_kv = kv_start_load,
    .wait_for_layer_load = kv_wait_layer,
    .save_kv_layer = kv_save_layer,
    .wait_for_save = kv_wait_save,
    .get_finished = kv_get_finished,
    .get_block_ids_with_load_errors = kv_load_errors,
    .get_handshake_metadata = kv_get_handshake,
    .get_stats = kv_stats,
    .get_push_params = kv_push_params,
    .get_event_fd = kv_event_fd,
    .get_stats_ex = kv_stats_ex,
    .register_kv_groups = kv_register_groups,
    .alloc_kv_memory = kv_alloc_memory,
    .update_state_after_alloc_groups = kv_after_alloc_groups,
    .request_finished_groups = kv_finished_groups,
    .handle_preemptions = kv_preemptions,
    .get_required_kvcache_layout = kv_required_layout,
    .build_connector_worker_meta = kv_worker_meta,
    .render_metrics = kv_render_metrics,
    .drain_traces = kv_drain_traces,
    .on_new_request = kv_new_request,
};

KV_EXPORT hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                                 size_t err_cap);

KV_EXPORT hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                                 size_t err_cap);

hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap) {
  if (!ops) {
    if (err && err_cap) snprintf(err, err_cap, "hixl_kv_connector_entry: ops output is NULL");
    return HIXL_KV_PARAM_INVALID;
  }
  if (abi_major != HIXL_KV_ABI_MAJOR) {
    if (err && err_cap)
      snprintf(err, err_cap,
               "hixl_kv_connector_entry: this plugin serves ABI major version %u (minor %u), not %u",
               HIXL_KV_ABI_MAJOR, HIXL_KV_ABI_MINOR, abi_major);
    return HIXL_KV_UNSUPPORTED;
  }
  *ops = &kv_ops_v1;
  return HIXL_KV_SUCCESS;
}
