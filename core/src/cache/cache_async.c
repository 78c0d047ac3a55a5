/* cache_async: TransferCacheAsync's tasks, a thread each sending layer after layer. */
/* A layer is sent, to every config's destination, once the layer synchronizer says it
 * is ready; the task's deadline bounds it all. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache_int.h"
#include "util/handles.h"
#include "util/sock.h"
#include "util/thread.h"

/* One config of a task: where its layers go, and how that went. */
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
  uint32_t users; /* Synchronize / GetResults calls in it (under task_lock): Destroy waits for them */
};

/* Tasks by handle: a HixlCacheTask * the caller holds is a token (util/handles.h), so a
 * destroyed task's handle is PARAM_INVALID, not its freed memory; and a call in a task
 * keeps it until the call returns (a Synchronize racing Destroy read the freed task). */
static pthread_mutex_t task_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t task_left = PTHREAD_COND_INITIALIZER; /* a task's last user returned */
static struct handles task_handles;

/* The live task behind handle h, taken for a call (task_put after); NULL, said, if none. */
static HixlCacheTask *task_get(HixlCacheTask *h, const char *fn) {
  pthread_mutex_lock(&task_lock);
  HixlCacheTask *t = handles_get(&task_handles, (uintptr_t)h);
  if (t) t->users++;
  pthread_mutex_unlock(&task_lock);
  if (!t) hixl_fail(HIXL_PARAM_INVALID, "%s: task %p is unknown or destroyed", fn, (void *)h);
  return t;
}

static HixlStatus task_put(HixlCacheTask *t, HixlStatus st) {
  pthread_mutex_lock(&task_lock);
  if (--t->users == 0) pthread_cond_broadcast(&task_left);
  pthread_mutex_unlock(&task_lock);
  return st;
}

static void cm_conf_fail(struct cm_conf *cf, HixlStatus st, const char *why) {
  if (cf->st != HIXL_SUCCESS) return;
  cf->st = st;
  snprintf(cf->why, sizeof(cf->why), "%s", why);
}

/* Poll cf's requests; drop the ended ones. */
static void cm_conf_poll(HixlCacheTask *t, struct cm_conf *cf) {
  size_t k = 0;
  for (size_t i = 0; i < cf->nreqs; i++) {
    HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
    HixlStatus st = HixlEngineGetTransferStatus(t->mgr->eng, cf->reqs[i], &ts);
    if (st != HIXL_SUCCESS) {
      cm_conf_fail(cf, st, HixlGetLastErrorMessage());
      continue;
    }
    if (ts == HIXL_TRANSFER_WAITING) {
      cf->reqs[k++] = cf->reqs[i];
    } else if (ts != HIXL_TRANSFER_COMPLETED) {
      char why[320];
      snprintf(why, sizeof(why), "a layer to %s %s: %s", cf->remote,
               ts == HIXL_TRANSFER_TIMEOUT ? "timed out" : "failed", HixlGetLastErrorMessage());
      cm_conf_fail(cf, ts == HIXL_TRANSFER_TIMEOUT ? HIXL_TIMEOUT : HIXL_FAILED, why);
    }
  }
  cf->nreqs = k;
}

static int32_t cm_ms_left(uint64_t deadline) {
  uint64_t now = hixl_now_ns();
  return now >= deadline ? 0 : (int32_t)((deadline - now + 999999) / 1000000);
}

/* Layer l of the source to cf: async WRITEs of its tensors' items or blocks, HIXL_MAX_BATCH ops each. */
static void cm_send_layer(HixlCacheTask *t, struct cm_conf *cf, uint32_t l) {
  struct cm_cache *c = t->cache;
  struct opvec ops = {0};
  struct cm_layers ly = {t->tpl, l, l - cf->layer_start, 1};
  HixlStatus st = HIXL_SUCCESS;
  if (t->dbms == 0) { /* contiguous destination: the item, whole */
    for (uint32_t k = 0; k < t->tpl && st == HIXL_SUCCESS; k++)
      if (opvec_add(&ops, c->addrs[l * t->tpl + k] + cf->batch * c->item_bytes,
                    cf->dst_addrs[(l - cf->layer_start) * t->tpl + k], c->item_bytes, false) < 0)
        st = HIXL_RESOURCE_EXHAUSTED;
  } else if (cm_plan_blocks(&ops, &ly, c->addrs, c->blocks ? 0 : cf->batch * c->item_bytes, cf->dst_addrs,
                            c->blocks ? t->sb : NULL, t->db, t->ndb, t->dbms, true) < 0) {
    st = HIXL_RESOURCE_EXHAUSTED;
  }
  /* One request per HIXL_MAX_BATCH ops: an engine call takes no more (a layer of many
   * tensors or scattered blocks has more). */
  size_t parts = (ops.n + HIXL_MAX_BATCH - 1) / HIXL_MAX_BATCH;
  if (st == HIXL_SUCCESS && cf->cap - cf->nreqs < parts) {
    size_t cap = cf->cap ? cf->cap * 2 : 16;
    if (cap < cf->nreqs + parts) cap = cf->nreqs + parts;
    HixlTransferReq *v = realloc(cf->reqs, cap * sizeof(*v));
    if (v) {
      cf->reqs = v;
      cf->cap = cap;
    } else {
      st = HIXL_RESOURCE_EXHAUSTED;
    }
  }
  if (st != HIXL_SUCCESS) {
    cm_conf_fail(cf, st, "out of memory");
    opvec_free(&ops);
    return;
  }
  size_t calls = 0;
  for (size_t i = 0; i < ops.n && st == HIXL_SUCCESS; i += HIXL_MAX_BATCH, calls++) {
    size_t k = ops.n - i < HIXL_MAX_BATCH ? ops.n - i : HIXL_MAX_BATCH;
    int32_t left = cm_ms_left(t->deadline);
    HixlTransferReq r = NULL;
    st = left > 0 ? HixlEngineTransferAsync(t->mgr->eng, cf->remote, HIXL_WRITE, ops.v + i, k, left, NULL, &r)
                  : HIXL_TIMEOUT;
    if (st == HIXL_SUCCESS) cf->reqs[cf->nreqs++] = r;
  }
  char why[320];
  if (st == HIXL_TIMEOUT)
    snprintf(why, sizeof(why), "layer %u was not sent to %s before the task's deadline", l, cf->remote);
  else
    snprintf(why, sizeof(why), "layer %u to %s: %s", l, cf->remote, HixlGetLastErrorMessage());
  if (st != HIXL_SUCCESS) cm_conf_fail(cf, st, why);
  pthread_mutex_lock(&t->mgr->lock);
  t->mgr->stats.transfers += calls;
  t->mgr->stats.engine_ops += ops.n;
  if (st == HIXL_SUCCESS) t->mgr->stats.bytes += ops.bytes;
  pthread_mutex_unlock(&t->mgr->lock);
  opvec_free(&ops);
}

static bool cm_task_stopped(HixlCacheTask *t) {
  pthread_mutex_lock(&t->lock);
  bool s = t->stop;
  pthread_mutex_unlock(&t->lock);
  return s;
}

static void *cm_task_main(void *arg) {
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
      cm_conf_poll(t, cf); /* earlier layers keep flowing meanwhile */
      wanted |= cf->st == HIXL_SUCCESS && l >= cf->layer_start && l < cf->layer_start + cf->layer_count;
    }
    if (!wanted) continue;
    char why[320];
    int32_t left = cm_ms_left(t->deadline);
    int32_t per = t->sync.timeout_ms ? t->sync.timeout_ms : HIXL_DEFAULT_TIMEOUT_MS;
    HixlStatus st = HIXL_SUCCESS;
    int ready = 0;
    if (cm_task_stopped(t)) {
      snprintf(why, sizeof(why), "the task was destroyed before layer %u was sent", l);
      st = HIXL_FAILED;
    } else if (left == 0) {
      snprintf(why, sizeof(why), "layer %u was not sent before the task's deadline", l);
      st = HIXL_TIMEOUT;
    } else if ((ready = t->sync.synchronize_layer(t->sync.ctx, l, per < left ? per : left)) == 0) {
      snprintf(why, sizeof(why), "layer %u was not ready within %d ms (the layer synchronizer said so)", l,
               per < left ? per : left);
      st = cm_ms_left(t->deadline) == 0 ? HIXL_TIMEOUT : HIXL_FAILED;
    } else if (ready != 1) { /* only 1 is ready: -1 (a failed C call) must not send unready KV */
      snprintf(why, sizeof(why), "layer %u: the layer synchronizer returned %d (1: ready, 0: not ready)", l,
               ready);
      st = HIXL_FAILED;
    }
    for (size_t i = 0; i < t->nconf; i++) {
      struct cm_conf *cf = &t->conf[i];
      if (cf->st != HIXL_SUCCESS || l < cf->layer_start || l >= cf->layer_start + cf->layer_count) continue;
      if (st != HIXL_SUCCESS)
        cm_conf_fail(cf, st, why);
      else
        cm_send_layer(t, cf, l);
    }
  }
  /* Every request ends by its deadline (the task's), so this ends. */
  for (;;) {
    size_t pending = 0;
    for (size_t i = 0; i < t->nconf; i++) {
      cm_conf_poll(t, &t->conf[i]);
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

static void cm_task_free(HixlCacheTask *t) {
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

static uint64_t *cm_dup_u64(const uint64_t *v, size_t n) {
  uint64_t *c = malloc((n ? n : 1) * sizeof(*c));
  if (c && n) memcpy(c, v, n * sizeof(*c));
  return c;
}

static HixlStatus async_in(HixlCacheManager *m, uint64_t src_cache_id, const HixlLayerSynchronizer *sync,
                           const HixlCacheTransferConfig *configs, size_t num_configs,
                           const HixlCacheAsyncArgs *args, HixlCacheTask **task, const char *fn) {
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
  struct cm_cache *c = cache_pin(m, src_cache_id, fn, &st);
  if (!c) return st;
  HixlCacheTask *t = calloc(1, sizeof(*t));
  if (!t) {
    cache_unpin(m, c);
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
      st = cm_check_blocks(args->src_block_indices, args->num_src_blocks, c->desc.shape[0], fn,
                           "src_block_indices", m->cluster_id);
    t->dbms = c->item_bytes;
  } else if (args->dst_block_indices) {
    if (args->num_src_blocks)
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: src_block_indices given for contiguous cache %" PRIu64, fn,
                     c->id);
    else if (!args->dst_block_memory_size || args->num_dst_blocks == 0)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: a contiguous source into blocks needs dst_block_memory_size and blocks", fn);
    else if (args->dst_block_memory_size > c->item_bytes / args->num_dst_blocks) /* a product would wrap */
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: %zu blocks of %" PRIu64 " bytes exceed the batch item of %" PRIu64 " bytes", fn,
                     args->num_dst_blocks, args->dst_block_memory_size, c->item_bytes);
    t->dbms = args->dst_block_memory_size;
  } else if (args->num_src_blocks) {
    st =
        hixl_fail(HIXL_PARAM_INVALID, "%s: src_block_indices given for contiguous cache %" PRIu64, fn, c->id);
  } else if (args->dst_block_memory_size) { /* blocks meant, none named: not a whole item over them */
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "%s: dst_block_memory_size %" PRIu64
                   " given for a contiguous destination (dst_block_indices NULL); "
                   "name the destination blocks, or pass 0",
                   fn, args->dst_block_memory_size);
  }
  /* A destination block's offset, index x block size, stays inside the largest tensor a
   * cache may have (2^48 bytes): unchecked it wrapped (an index of -1, vLLM's padding,
   * wrote one block before the destination tensor, into another layer's KV). */
  for (size_t j = 0; st == HIXL_SUCCESS && t->dbms && j < args->num_dst_blocks; j++)
    if (args->dst_block_indices[j] >= (UINT64_C(1) << 48) / t->dbms)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "%s: dst_block_indices[%zu] = %" PRIu64 ": its %" PRIu64
                     "-byte block lies past 2^48 bytes, outside any cache",
                     fn, j, args->dst_block_indices[j], t->dbms);
  if (st == HIXL_SUCCESS && t->dbms)
    st = cm_check_distinct(args->dst_block_indices, args->num_dst_blocks, fn, "dst_block_indices");
  if (st == HIXL_SUCCESS && (!(t->sb = cm_dup_u64(args->src_block_indices, args->num_src_blocks)) ||
                             !(t->db = cm_dup_u64(args->dst_block_indices, args->num_dst_blocks)) ||
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
    struct cm_link *l = cm_link_by_cluster(m, g->dst_cluster_id);
    if (l) snprintf(cf->remote, sizeof(cf->remote), "%s", l->remote);
    pthread_mutex_unlock(&m->lock);
    if (!l) {
      st = hixl_fail(HIXL_NOT_CONNECTED, "%s: config %zu: cluster %" PRIu64 " is not linked", fn, i,
                     g->dst_cluster_id);
      break;
    }
    char side[48];
    snprintf(side, sizeof(side), "config %zu's source", i);
    if ((st = cm_layer_range(fn, side, g->src_layer_start, g->src_layer_count, n / t->tpl, &s, &cnt)) !=
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
    int rc = pthread_create(&t->thread, NULL, cm_task_main, t);
    if (rc == 0) thread_name(t->thread, "hixl-cm-task");
    if (rc != 0) {
      pthread_mutex_lock(&m->lock);
      m->tasks--;
      pthread_mutex_unlock(&m->lock);
      st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: pthread_create: %s", fn, strerror(rc));
    }
  }
  if (st != HIXL_SUCCESS) {
    cm_task_free(t);
    cache_unpin(m, c);
    return st;
  }
  pthread_mutex_lock(&task_lock);
  uintptr_t token = handles_add(&task_handles, t);
  pthread_mutex_unlock(&task_lock);
  if (!token) { /* stopped at once: the caller never had it */
    t->stop = true;
    pthread_join(t->thread, NULL);
    cache_unpin(m, c);
    pthread_mutex_lock(&m->lock);
    m->tasks--;
    pthread_mutex_unlock(&m->lock);
    cm_task_free(t);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  *task = (HixlCacheTask *)token;
  return HIXL_SUCCESS;
}

/* The task's first failure, with its reason as the thread's error. Task lock held. */
static HixlStatus cm_task_status(HixlCacheTask *t) {
  for (size_t i = 0; i < t->nconf; i++)
    if (t->conf[i].st != HIXL_SUCCESS)
      return hixl_fail(t->conf[i].st, "cache task: config %zu: %s", i, t->conf[i].why);
  return HIXL_SUCCESS;
}

HixlStatus HixlCacheManagerTransferCacheAsync(HixlCacheManager *m, uint64_t src_cache_id,
                                              const HixlLayerSynchronizer *sync,
                                              const HixlCacheTransferConfig *configs, size_t num_configs,
                                              const HixlCacheAsyncArgs *args, HixlCacheTask **task) {
  const char *fn = "HixlCacheManagerTransferCacheAsync";
  HixlStatus st = cm_enter(m, fn);
  return st != HIXL_SUCCESS
             ? st
             : cm_leave(m, async_in(m, src_cache_id, sync, configs, num_configs, args, task, fn));
}

HixlStatus HixlCacheTaskSynchronize(HixlCacheTask *h, int32_t timeout_ms) {
  CHECK_ARG(h, "HixlCacheTaskSynchronize: task is NULL");
  CHECK_ARG(timeout_ms >= 0, "HixlCacheTaskSynchronize: timeout_ms %d is negative", timeout_ms);
  HixlCacheTask *t = task_get(h, "HixlCacheTaskSynchronize");
  if (!t) return HIXL_PARAM_INVALID;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&t->lock);
  while (!t->done)
    if (pthread_cond_timedwait(&t->cond, &t->lock, &ts) == ETIMEDOUT) break;
  HixlStatus st =
      t->done ? cm_task_status(t)
              : hixl_fail(HIXL_TIMEOUT, "HixlCacheTaskSynchronize: the task is still running after %d ms",
                          timeout_ms ? timeout_ms : HIXL_DEFAULT_TIMEOUT_MS);
  pthread_mutex_unlock(&t->lock);
  return task_put(t, st);
}

HixlStatus HixlCacheTaskGetResults(HixlCacheTask *h, HixlStatus *results, size_t num_results) {
  CHECK_ARG(h && results, "HixlCacheTaskGetResults: task or results is NULL");
  HixlCacheTask *t = task_get(h, "HixlCacheTaskGetResults");
  if (!t) return HIXL_PARAM_INVALID;
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
  return task_put(t, st);
}

HixlStatus HixlCacheTaskDestroy(HixlCacheTask *h) {
  CHECK_ARG(h, "HixlCacheTaskDestroy: task is NULL");
  pthread_mutex_lock(&task_lock); /* no new call finds it; those in it return first */
  HixlCacheTask *t = handles_get(&task_handles, (uintptr_t)h);
  if (t && pthread_equal(t->thread, pthread_self())) { /* its synchronizer: it cannot join itself */
    pthread_mutex_unlock(&task_lock);
    return hixl_fail(HIXL_PARAM_INVALID,
                     "HixlCacheTaskDestroy: called on task %p's own thread (its layer synchronizer); "
                     "return 0 to stop it and destroy it from another thread",
                     (void *)h);
  }
  t = handles_del(&task_handles, (uintptr_t)h);
  if (task_handles.count == 0) handles_free(&task_handles);
  pthread_mutex_unlock(&task_lock);
  CHECK_ARG(t, "HixlCacheTaskDestroy: task %p is unknown or destroyed", (void *)h);
  pthread_mutex_lock(&t->lock);
  t->stop = true;
  pthread_mutex_unlock(&t->lock);
  pthread_join(t->thread, NULL); /* ends a Synchronize waiting in it: the task is done */
  pthread_mutex_lock(&task_lock);
  while (t->users > 0) pthread_cond_wait(&task_left, &task_lock);
  pthread_mutex_unlock(&task_lock);
  HixlCacheManager *m = t->mgr;
  cache_unpin(m, t->cache);
  pthread_mutex_lock(&m->lock);
  m->tasks--;
  pthread_mutex_unlock(&m->lock);
  cm_task_free(t);
  return HIXL_SUCCESS;
}
