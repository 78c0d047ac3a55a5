/* kv_pusher: a push producer worker's pusher thread: ACCEPT on the consumer, then
 * each layer as soon as the forward pass saved it, with a landed notice behind it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "kv_int.h"

/* Accept on the consumer: it expects the request, with the same layout, into at
 * least as many blocks. */
static HixlStatus push_accept(hixl_kv_connector *c, struct kv_push *p, char *why, size_t cap) {
  struct kv_meta_entry *e = &p->e;
  uint64_t deadline = kv_now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = kv_link(c, e, c->cfg.connect_timeout_ms);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "linking to the consumer %s: %s", e->remote, HixlGetLastErrorMessage());
    return st;
  }
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  if (!ans) return HIXL_RESOURCE_EXHAUSTED;
  char layout[257] = "";
  uint64_t digest = 0;
  size_t nrb = 0, n = 0;
  for (unsigned tries = 0;; tries++) {
    if (kv_call(c, e->remote, KV_SVC_ACCEPT, e->rreq, ans, HIXL_CALL_MAX, &n, kv_ms_until(deadline), &st) <
        0) {
      snprintf(why, cap, "asking the consumer %s for request %s: %s", e->remote, e->rreq,
               HixlGetLastErrorMessage());
      break;
    }
    struct kv_in in = {ans, n, 0, false};
    uint8_t state = kv_get_u8(&in);
    if (state == KV_PIN_HELD) {
      kv_get_str(&in, layout, 256);
      nrb = kv_get_u32(&in);
      digest = kv_get_u64(&in);
      if (in.bad || in.off != n) {
        snprintf(why, cap, "the consumer %s gave a malformed answer for request %s", e->remote, e->rreq);
        st = HIXL_FAILED;
      } else if (strcmp(layout, c->layout_text) != 0) {
        st = kv_layout_mismatch("consumer", e->remote, layout, c->layout_text, "producer", why, cap);
      } else if (nrb < e->nblocks) {
        snprintf(why, cap, "the consumer %s expects %zu blocks of request %s, this producer has %zu",
                 e->remote, nrb, e->rreq, e->nblocks);
        st = HIXL_PARAM_INVALID;
      } else if (nrb == e->nrblocks && digest != kv_blocks_digest(e->rblocks, e->nrblocks)) {
        snprintf(why, cap, "the consumer %s expects request %s in other blocks than its push params named",
                 e->remote, e->rreq);
        st = HIXL_PARAM_INVALID;
      }
      break;
    }
    if (state == KV_PIN_GONE || state != KV_PIN_NOT_YET || kv_ms_until(deadline) == 0) {
      snprintf(why, cap, "the consumer %s does not expect request %s (%s)", e->remote, e->rreq,
               state == KV_PIN_GONE ? "it already ended" : "not within the transfer timeout");
      st = state == KV_PIN_GONE ? HIXL_NOT_FOUND : HIXL_TIMEOUT;
      break;
    }
    struct timespec ts = {0, tries < 20 ? 200000 : 2000000};
    nanosleep(&ts, NULL);
  }
  free(ans);
  return st;
}

/* Wait until layer l of step has been saved (save_kv_layer), or the deadline. */
static bool push_wait_saved(hixl_kv_connector *c, uint32_t l, uint64_t step, uint64_t deadline) {
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&c->lock);
  while (!c->shut && c->push.saved_step[l] < step)
    if (pthread_cond_timedwait(&c->push.saved, &c->lock, &ts) == ETIMEDOUT) break;
  bool ok = c->push.saved_step[l] >= step;
  pthread_mutex_unlock(&c->lock);
  return ok;
}

/* One range of layers of one push on its way (one layer while the pusher keeps up):
 * its WRITE, and the landed notice (KV service LAYER or LAYERS call) the engine sends
 * once the WRITE has landed (hixl_cache_push_blocks_then_call). The pusher starts
 * each range as soon as it is saved, never waiting for the one before: the next
 * range's data queues right behind, as the raw engine's async WRITEs do; all are
 * waited for once the step's layers are out. */
struct push_note {
  hixl_call_t call;
  uint32_t i, layer, count;
  uint32_t alen;
  uint8_t ans[256];
};

/* Start layers [k, k + count) of push v with their notice (LAYER for one, LAYERS
 * for more); why on failure. */
static HixlStatus layer_start(hixl_kv_connector *c, struct kv_push *v, uint32_t k, uint32_t count,
                              struct push_note *pn, char *why, size_t cap) {
  struct kv_meta_entry *e = &v->e;
  struct kv_out o = {0};
  HixlStatus st = HIXL_RESOURCE_EXHAUSTED;
  HixlBlocksCacheKey key = {e->cluster, 0};
  HixlCacheTransferArgs a = HIXL_CACHE_TRANSFER_ARGS_INIT;
  a.src_layer_start = a.dst_layer_start = k;
  a.src_layer_count = a.dst_layer_count = count;
  a.tensor_num_per_layer = c->tensors_per_layer;
  a.timeout_ms = c->cfg.transfer_timeout_ms;
  bool built = kv_msg(&o, count > 1 ? KV_SVC_LAYERS : KV_SVC_LAYER, e->rreq, k, "");
  if (count > 1) kv_put_u32(&o, count);
  built = built && !o.bad;
  if (built)
    st = hixl_cache_push_blocks_then_call(c->mgr, &key, c->cache_id, e->blocks, e->nblocks, e->rblocks,
                                          e->nblocks, &a, HIXL_SERVICE_KV, o.p, o.len, pn->ans,
                                          sizeof(pn->ans), &pn->alen, &pn->call);
  free(o.p);
  if (st != HIXL_SUCCESS)
    snprintf(why, cap, "layers %u..%u of request %s to %s: %s", k, k + count - 1, e->req, e->remote,
             !built ? "out of memory" : HixlGetLastErrorMessage());
  return st;
}

/* The last layer from k on whose save for step has come, each one between too. */
static uint32_t saved_through(hixl_kv_connector *c, uint32_t k, uint64_t step) {
  pthread_mutex_lock(&c->lock);
  while (k + 1 < c->layers && c->push.saved_step[k + 1] >= step) k++;
  pthread_mutex_unlock(&c->lock);
  return k;
}

/* One step's pushes, layer by layer: each layer leaves as soon as it is saved, while
 * the producer computes the next; layers saved while the pusher was busy starting
 * earlier ones leave together, as one range with one notice (layer_pipelining false:
 * every layer at once, once the last is saved). Each notice follows its data. */
static void push_batch(hixl_kv_connector *c, struct kv_push **v, size_t n) {
  HixlStatus *st = calloc(n, sizeof(*st));
  char(*why)[512] = calloc(n, sizeof(*why));
  struct push_note *notes = calloc(n * c->layers + 1, sizeof(*notes));
  size_t nnotes = 0;
  if (!st || !why || !notes) {
    free(st);
    free(why);
    free(notes);
    return;
  }
  for (size_t i = 0; i < n; i++) st[i] = push_accept(c, v[i], why[i], sizeof(why[i]));
  for (uint32_t l = 0, count; l < c->layers; l += count) {
    bool any = false;
    count = 1;
    for (size_t i = 0; i < n; i++) any |= st[i] == HIXL_SUCCESS;
    if (!any) break;
    uint32_t need = c->cfg.pipelining ? l : c->layers - 1;
    uint64_t deadline = v[0]->bound_ns + (uint64_t)c->cfg.lease_ms * 1000000ull;
    if (!push_wait_saved(c, need, v[0]->step, deadline)) {
      for (size_t i = 0; i < n; i++)
        if (st[i] == HIXL_SUCCESS) {
          st[i] = HIXL_TIMEOUT;
          snprintf(why[i], sizeof(why[i]), "layer %u was not saved within lease_ms %u", need,
                   c->cfg.lease_ms);
        }
      break;
    }
    count = saved_through(c, need, v[0]->step) - l + 1;
    for (size_t i = 0; i < n; i++) {
      if (st[i] != HIXL_SUCCESS) continue;
      struct push_note *pn = &notes[nnotes];
      if ((st[i] = layer_start(c, v[i], l, count, pn, why[i], sizeof(why[i]))) != HIXL_SUCCESS) continue;
      pn->i = (uint32_t)i;
      pn->layer = l;
      pn->count = count;
      nnotes++;
    }
  }
  /* Every notice answered (or failed) before the pushes are reported done. */
  for (size_t j = 0; j < nnotes; j++) {
    struct push_note *pn = &notes[j];
    struct kv_meta_entry *e = &v[pn->i]->e;
    HixlStatus ns = hixl_engine_call_wait(c->eng, e->remote, pn->call);
    hixl_cache_unpin(c->mgr, c->cache_id);
    if (ns == HIXL_SUCCESS) {
      pthread_mutex_lock(&c->lock);
      c->stats.layers_pushed += pn->count;
      pthread_mutex_unlock(&c->lock);
    } else if (st[pn->i] == HIXL_SUCCESS) {
      st[pn->i] = ns;
      snprintf(why[pn->i], sizeof(why[pn->i]),
               "layers %u..%u of request %s to %s, or their landed notice: %s", pn->layer,
               pn->layer + pn->count - 1, e->req, e->remote, HixlGetLastErrorMessage());
    }
  }
  free(notes);
  uint8_t ans[256];
  size_t an;
  HixlCacheStats cs;
  HixlCacheManagerGetStats(c->mgr, &cs);
  for (size_t i = 0; i < n; i++) {
    struct kv_meta_entry *e = &v[i]->e;
    if (st[i] != HIXL_SUCCESS) { /* the consumer reports the failure; best effort */
      fprintf(stderr, "hixl-kv: request %s was not pushed (%s): %s\n", e->req, HixlStatusName(st[i]), why[i]);
      kv_tell(c, e, KV_SVC_ABORT, why[i], ans, sizeof(ans), &an);
    }
    pthread_mutex_lock(&c->lock);
    if (st[i] == HIXL_SUCCESS) {
      c->stats.pushes_done++;
      c->stats.bytes_pushed += e->nblocks * c->block_bytes;
    } else {
      c->stats.pushes_failed++;
    }
    c->stats.engine_ops = cs.engine_ops;
    c->stats.lookups = cs.lookups;
    c->stats.blocks_held -= e->nblocks;
    c->stats.requests_held--;
    kv_finished_add(c, &c->sending_done, e->req); /* the host may free the producer's blocks */
    pthread_mutex_unlock(&c->lock);
  }
  free(st);
  free(why);
}

void *kv_pusher_main(void *arg) {
  hixl_kv_connector *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->push.pushes && !c->shut) pthread_cond_wait(&c->push.cond, &c->lock);
    if (!c->push.pushes) break;
    /* The head's step: every push bound in it goes layer by layer together. */
    uint64_t step = c->push.pushes->step;
    size_t n = 0;
    for (struct kv_push *p = c->push.pushes; p && p->step == step; p = p->next) n++;
    struct kv_push **v = malloc(n * sizeof(*v));
    if (!v) break;
    for (size_t i = 0; i < n; i++) {
      v[i] = c->push.pushes;
      c->push.pushes = c->push.pushes->next;
    }
    if (!c->push.pushes) c->push.tail = NULL;
    pthread_mutex_unlock(&c->lock);
    push_batch(c, v, n);
    for (size_t i = 0; i < n; i++) {
      free(v[i]->e.blocks);
      free(v[i]->e.rblocks);
      free(v[i]);
    }
    free(v);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}
