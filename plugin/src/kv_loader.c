/* kv_loader: a pull consumer worker's loader thread: for each load a step started,
 * link to the producer, PIN the request there (is it still held? same layout? it
 * extends the lease), pull the blocks through the cache manager (one op per run of
 * adjacent blocks per tensor), then FREE it there. A failed load reports its blocks
 * (get_block_ids_with_load_errors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "kv_int.h"

/* One load: link, pin (asking again while the producer has not bound it yet),
 * check the layout, pull, free. Returns the status and the reason in why. */
static HixlStatus load_one(hixl_kv_connector *c, const struct kv_meta_entry *e, char *why, size_t cap) {
  uint64_t deadline = kv_now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = kv_link(c, e, c->cfg.connect_timeout_ms);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "linking to the producer %s: %s", e->remote, HixlGetLastErrorMessage());
    return st;
  }
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  if (!ans) {
    snprintf(why, cap, "out of memory");
    return HIXL_RESOURCE_EXHAUSTED;
  }
  uint64_t digest = 0;
  size_t nrb = 0, n = 0;
  char layout[257];
  for (unsigned tries = 0;; tries++) {
    if (kv_call(c, e->remote, KV_SVC_PIN, e->rreq, ans, HIXL_CALL_MAX, &n, kv_ms_until(deadline), &st) < 0) {
      snprintf(why, cap, "asking %s for request %s: %s", e->remote, e->rreq, HixlGetLastErrorMessage());
      goto out;
    }
    struct kv_in in = {ans, n, 0, false};
    uint8_t state = kv_get_u8(&in);
    if (state == KV_PIN_HELD) {
      kv_get_str(&in, layout, 256);
      nrb = kv_get_u32(&in);
      digest = kv_get_u64(&in);
      if (in.bad || in.off != n) {
        snprintf(why, cap, "%s gave a malformed answer for request %s", e->remote, e->rreq);
        st = HIXL_FAILED;
        goto out;
      }
      break;
    }
    if (state == KV_PIN_GONE) {
      char reason[257];
      kv_get_str(&in, reason, 256);
      snprintf(why, cap, "the producer %s no longer holds request %s: %s", e->remote, e->rreq, reason);
      st = HIXL_NOT_FOUND;
      goto out;
    }
    if (state != KV_PIN_NOT_YET || kv_ms_until(deadline) == 0) {
      snprintf(why, cap, "the producer %s did not hold request %s within %d ms", e->remote, e->rreq,
               c->cfg.transfer_timeout_ms);
      st = HIXL_TIMEOUT;
      goto out;
    }
    struct timespec ts = {0, tries < 20 ? 200000 : 2000000}; /* the producer binds it at its next step */
    nanosleep(&ts, NULL);
  }
  if (strcmp(layout, c->layout_text) != 0) {
    st = kv_layout_mismatch("producer", e->remote, layout, c->layout_text, "consumer", why, cap);
    goto out;
  }
  if (nrb < e->nrblocks || (nrb == e->nrblocks && digest != kv_blocks_digest(e->rblocks, e->nrblocks))) {
    snprintf(why, cap, "the producer %s holds %zu blocks of request %s, %zu %s asked for", e->remote, nrb,
             e->rreq, e->nrblocks, nrb < e->nrblocks ? "were" : "other ones were");
    st = HIXL_PARAM_INVALID;
    goto out;
  }
  HixlCacheAnyKey key = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {e->cluster, 0}};
  HixlCacheTransferArgs args = HIXL_CACHE_TRANSFER_ARGS_INIT;
  args.tensor_num_per_layer = c->tensors_per_layer;
  args.timeout_ms = kv_ms_until(deadline) > 0 ? kv_ms_until(deadline) : 1;
  st = HixlCacheManagerPullBlocks(c->mgr, &key, c->cache_id, e->rblocks, e->nrblocks, e->blocks, e->nblocks,
                                  &args);
  if (st != HIXL_SUCCESS)
    snprintf(why, cap, "pulling request %s from %s: %s", e->rreq, e->remote, HixlGetLastErrorMessage());
out:
  free(ans);
  return st;
}

void *kv_loader_main(void *arg) {
  hixl_kv_connector *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->load.queue && !c->shut) pthread_cond_wait(&c->load.cond, &c->lock);
    if (!c->load.queue && c->shut) break;
    struct kv_load *l = c->load.queue;
    c->load.queue = l->next;
    if (!c->load.queue) c->load.queue_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    char why[1024] = "";
    HixlStatus st;
    if (l->e.type == KV_META_FREE) { /* an abort: the producer frees what it holds */
      uint8_t ans[64];
      size_t n;
      HixlStatus ls = kv_link(c, &l->e, c->cfg.connect_timeout_ms);
      if (ls != HIXL_SUCCESS)
        st = ls;
      else
        kv_call(c, l->e.remote, KV_SVC_FREE, l->e.rreq, ans, sizeof(ans), &n, c->cfg.notify_timeout_ms, &st);
      pthread_mutex_lock(&c->lock);
      c->load.loading--;
      free(l->e.blocks);
      free(l->e.rblocks);
      free(l);
      pthread_cond_broadcast(&c->load.cond);
      continue;
    }
    st = c->shut ? HIXL_FAILED : load_one(c, &l->e, why, sizeof(why));
    HixlCacheStats cs;
    HixlCacheManagerGetStats(c->mgr, &cs);
    pthread_mutex_lock(&c->lock);
    c->load.loading--;
    c->stats.engine_ops = cs.engine_ops;
    c->stats.lookups = cs.lookups;
    if (st == HIXL_SUCCESS) {
      c->stats.loads_done++;
      c->stats.bytes_loaded = cs.bytes;
    } else {
      c->stats.loads_failed++;
      fprintf(stderr, "hixl-kv: request %s failed to load (%s): %s\n", l->e.req, HixlStatusName(st), why);
      kv_err_blocks_add(c, l->e.blocks, l->e.nblocks);
    }
    kv_finished_add(c, &c->recving_done, l->e.req); /* the host may use the blocks now */
    pthread_cond_broadcast(&c->load.cond);
    pthread_mutex_unlock(&c->lock);
    if (st != HIXL_NOT_FOUND) { /* the producer may still hold it: free it there (best effort) */
      uint8_t ans[64];
      size_t n;
      kv_tell(c, &l->e, KV_SVC_FREE, "", ans, sizeof(ans), &n);
    }
    free(l->e.blocks);
    free(l->e.rblocks);
    free(l);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}
