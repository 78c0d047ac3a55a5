/* kv_loader: a pull consumer worker's loader threads: for each load a step started,
 * link to the producer, PIN the request there (is it still held? same layout? it
 * extends the lease), pull the blocks through the cache manager (one op per run of
 * adjacent blocks per tensor), then FREE it there. A failed load reports its blocks
 * (get_block_ids_with_load_errors).
 *
 * A thread serves one producer at a time, and at most loads_per_producer threads (1 by
 * default) serve the same one: its loads start in the order they were bound, that many
 * pulled at once (more: one's PIN, report and FREE overlap another's data, but they
 * share the link, so each takes longer). Threads start
 * as loads that could start outnumber the idle ones (at most KV_LOADERS_MAX), so a
 * producer that does not answer (a connect that waits out connect_timeout_ms, a PIN
 * that waits out transfer_timeout_ms) holds up only its own loads. An abort's FREE of
 * a producer waits until no thread serves that producer, and its later loads wait for
 * it. A thread's loads go back to back: the next one's PIN leaves as a pull starts
 * (the thread then goes on with that load, kv_load.ahead_by), and a FREE's answer is
 * waited for after the next pull, or before the thread sleeps (struct
 * kv_loader_slot). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"
#include "util/thread.h"

/* A PIN (or RENEW: op) of e's request; with its hold's number (from the params), so the
 * producer answers at once for one it bound and does not hold. */
static void hold_msg(const hixl_kv_connector *c, struct kv_out *msg, uint8_t op,
                     const struct kv_meta_entry *e) {
  kv_msg(c, msg, op, e->rreq, &e->rcap, 0, "");
  if (e->seq) {
    kv_put_u64(msg, e->epoch);
    kv_put_u64(msg, e->seq);
  }
}

/* The parse alone, no I/O (kv_int.h): tests/fuzz/fuzz_kv_service.c drives it. */
HixlStatus kv_pin_answer(hixl_kv_connector *c, const struct kv_meta_entry *e, const uint8_t *ans, size_t n,
                         struct kv_peer_held *h, bool *again, char *why, size_t cap) {
  struct kv_in in = {ans, n, 0, false};
  uint8_t state = kv_get_u8(&in);
  *again = false;
  if (state == KV_PIN_HELD) {
    HixlStatus ps = kv_held_parse(c, &in, "producer", e->remote, e->rreq, h, why, cap);
    if (ps == HIXL_SUCCESS && h->world != e->rtp) {
      snprintf(why, cap, "the producer %s runs %u ranks, its kv_transfer_params said tp_size %u", e->remote,
               h->world, e->rtp);
      ps = HIXL_PARAM_INVALID;
    }
    return ps;
  }
  if (state == KV_PIN_GONE) {
    char reason[257], esc[257]; /* the peer's text, logged: escaped (cut at its size) */
    kv_get_str(&in, reason, 256);
    log_escape(esc, sizeof(esc), reason, strlen(reason));
    snprintf(why, cap, "the producer %s no longer holds request %s: %s", e->remote, e->rreq, esc);
    return HIXL_NOT_FOUND;
  }
  if (state != KV_PIN_NOT_YET) {
    snprintf(why, cap, "the producer %s gave a malformed answer for request %s", e->remote, e->rreq);
    return HIXL_FAILED;
  }
  *again = true;
  return HIXL_SUCCESS;
}

/* PIN e's request on its producer, asking again while the producer has not bound it
 * yet; what it holds into h. cleanup: a PIN before a FREE (kv_call_settled). */
static HixlStatus pin(hixl_kv_connector *c, const struct kv_meta_entry *e, uint64_t deadline, uint8_t *ans,
                      struct kv_peer_held *h, char *why, size_t cap, bool cleanup) {
  struct kv_out msg = {0};
  size_t n = 0;
  bool again;
  hold_msg(c, &msg, KV_SVC_PIN, e);
  HixlStatus st = kv_call_settled(c, e->remote, &msg, deadline, ans, HIXL_CALL_MAX, &n, cleanup);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "asking %s for request %s: %s", e->remote, e->rreq, HixlGetLastErrorMessage());
    return st;
  }
  if ((st = kv_pin_answer(c, e, ans, n, h, &again, why, cap)) != HIXL_SUCCESS || !again) return st;
  pthread_mutex_lock(&c->lock);
  bool shut = c->shut; /* kv_call_settled asks no more then */
  pthread_mutex_unlock(&c->lock);
  if (shut)
    snprintf(why, cap, "the producer %s did not hold request %s yet when this worker shut down", e->remote,
             e->rreq);
  else
    snprintf(why, cap, "the producer %s did not hold request %s within %d ms", e->remote, e->rreq,
             c->cfg.transfer_timeout_ms);
  return HIXL_TIMEOUT;
}

/* ---- a loader thread's calls in flight (struct kv_loader_slot) ----
 * A producer's loads go one after another on one thread: a PIN before each pull and a
 * FREE after it would leave that link idle for two round trips per request. So the
 * next load's PIN is started as a pull begins (answered behind its data) and a FREE
 * is waited for only once the next pull is done, or before the thread sleeps. */

/* Wait for the PIN started ahead, if any, and forget it. */
static void ahead_drop(hixl_kv_connector *c, struct kv_loader_slot *s) {
  if (!s->ahead_call) return;
  hixl_engine_call_wait(c->eng, s->ahead.remote, s->ahead_call);
  s->ahead_call = NULL;
}

/* Start the PIN of the next load of l's producer, while l is pulled, and take that
 * load as this thread's next (ahead_by): the first one of that producer queued that no
 * other thread took so, unless a thread would have to leave another producer's load
 * waiting for it (no thread idle) or an abort's FREE comes first. Best effort: a PIN
 * that fails is asked again in time. */
static void ahead_start(hixl_kv_connector *c, struct kv_loader_slot *s, const struct kv_load *l) {
  struct kv_loader *ld = &c->load;
  ahead_drop(c, s);
  bool found = false;
  pthread_mutex_lock(&c->lock);
  for (struct kv_load *n = ld->queue; n && !c->shut; n = n->next) {
    if (strcmp(n->e.remote, l->e.remote) == 0) {
      if (n->ahead_by) continue; /* another thread of this producer runs it next */
      found = n->whole != NULL;  /* a load (an abort's FREE is only told) */
      if (found) {
        n->ahead_by = (uint32_t)(s - ld->slots) + 1;
        s->ahead = n->e;
        s->ahead_stale = false;
        s->ahead.blocks = s->ahead.rblocks = NULL;
      }
      break;
    }
    if (ld->idle == 0 && !kv_idset_has(&ld->busy, n->e.remote)) break; /* that one comes first */
  }
  pthread_mutex_unlock(&c->lock);
  if (!found || (!s->ahead_ans && !(s->ahead_ans = malloc(HIXL_CALL_MAX)))) return;
  struct kv_out msg = {0};
  hold_msg(c, &msg, KV_SVC_PIN, &s->ahead);
  int32_t t = c->cfg.transfer_timeout_ms;
  kv_obs_phase(c, s->ahead.req, KV_PH_PIN, s->ahead.remote);
  if (msg.bad ||
      hixl_engine_call_start(c->eng, s->ahead.remote, HIXL_SERVICE_KV, msg.p, msg.len, s->ahead_ans,
                             HIXL_CALL_MAX, &s->ahead_len, t, &s->ahead_call) != HIXL_SUCCESS)
    s->ahead_call = NULL;
  free(msg.p);
}

/* l (after prev, NULL: l is first) taken out of the queue. Lock held. */
static struct kv_load *queue_unlink(struct kv_loader *ld, struct kv_load *l, struct kv_load *prev) {
  if (prev)
    prev->next = l->next;
  else
    ld->queue = l->next;
  if (ld->queue_tail == l) ld->queue_tail = prev;
  l->next = NULL;
  return l;
}

/* The load this thread took as its next (ahead_start), unlinked from the queue; NULL
 * if none, or handle_preemptions took it. Lock held. */
static struct kv_load *ahead_take(hixl_kv_connector *c, const struct kv_loader_slot *s) {
  struct kv_loader *ld = &c->load;
  uint32_t me = (uint32_t)(s - ld->slots) + 1;
  for (struct kv_load *l = ld->queue, *prev = NULL; l; prev = l, l = l->next)
    if (l->ahead_by == me) {
      l->ahead_by = 0;
      return queue_unlink(ld, l, prev);
    }
  return NULL;
}

/* PIN e's request: the answer to the PIN started ahead for it if there is one (unless
 * it says "not yet", or the call failed), else pin(). */
static HixlStatus pin_load(hixl_kv_connector *c, struct kv_loader_slot *s, const struct kv_meta_entry *e,
                           uint64_t deadline, uint8_t *ans, struct kv_peer_held *h, uint64_t *t_pin,
                           char *why, size_t cap) {
  bool mine = s->ahead_call && strcmp(s->ahead.req, e->req) == 0 && strcmp(s->ahead.remote, e->remote) == 0;
  if (mine) { /* unless its load was preempted while queued and e is that id allocated again: the
               * answer's blocks and grants were freed then (kv_preemptions) */
    pthread_mutex_lock(&c->lock);
    mine = !s->ahead_stale;
    pthread_mutex_unlock(&c->lock);
  }
  if (mine) {
    *t_pin = kv_now_ns(); /* the histogram takes what this load waits for it (usually nothing) */
    HixlStatus st = hixl_engine_call_wait(c->eng, e->remote, s->ahead_call);
    s->ahead_call = NULL;
    bool again = true;
    if (st == HIXL_SUCCESS &&
        ((st = kv_pin_answer(c, e, s->ahead_ans, s->ahead_len, h, &again, why, cap)) != HIXL_SUCCESS ||
         !again))
      return st; /* held, gone, or refused: as pin() would have found */
  }
  ahead_drop(c, s); /* one for another load (that one was preempted) */
  *t_pin = kv_obs_phase(c, e->req, KV_PH_PIN, e->remote);
  return pin(c, e, deadline, ans, h, why, cap, false);
}

/* Wait for the last FREE's answer, if any. As kv_tell: a link that was lost gets it
 * again (kv_tell links again if it has to), and a FREE that could not be told is
 * named in a warning. */
static void free_settle(hixl_kv_connector *c, struct kv_loader_slot *s) {
  if (!s->free_call) return;
  HixlStatus st = hixl_engine_call_wait(c->eng, s->freed.remote, s->free_call);
  s->free_call = NULL;
  uint8_t ans[64];
  size_t n;
  if (st == HIXL_NOT_CONNECTED || st == HIXL_FAILED)
    kv_tell(c, &s->freed, KV_SVC_FREE, "", ans, sizeof(ans), &n);
  else if (st != HIXL_SUCCESS)
    log_warn("hixl-kv: request %s: %s could not be told that it ended (%s): it keeps it until its lease runs "
             "out",
             s->freed.req, s->freed.remote, HixlStatusName(st));
}

/* Tell l's producer that its request was loaded (FREE), without waiting: the answer
 * is taken by the next free_settle. */
static void free_start(hixl_kv_connector *c, struct kv_loader_slot *s, const struct kv_load *l) {
  free_settle(c, s);
  s->freed = l->e;
  s->freed.blocks = s->freed.rblocks = NULL;
  struct kv_out msg = {0};
  kv_msg(c, &msg, KV_SVC_FREE, s->freed.rreq, &s->freed.rcap, 0, "");
  if (msg.bad || hixl_engine_call_start(c->eng, s->freed.remote, HIXL_SERVICE_KV, msg.p, msg.len, s->free_ans,
                                        sizeof(s->free_ans), &s->free_len, c->cfg.notify_timeout_ms,
                                        &s->free_call) != HIXL_SUCCESS) {
    uint8_t ans[64];
    size_t n;
    s->free_call = NULL;
    kv_tell(c, &s->freed, KV_SVC_FREE, "", ans, sizeof(ans), &n); /* links again if it has to */
  }
  free(msg.p);
}

/* Read the ops, in engine-sized batches. */
static HixlStatus pull_ops(hixl_kv_connector *c, const struct kv_meta_entry *e, const struct opvec *o,
                           uint64_t deadline, char *why, size_t cap) {
  const HixlTransferOpDesc *d = o->v;
  HixlStatus st = HIXL_SUCCESS;
  for (size_t i = 0, k; i < o->n && st == HIXL_SUCCESS; i += k) {
    k = o->n - i < HIXL_MAX_BATCH ? o->n - i : HIXL_MAX_BATCH;
    int32_t left = kv_ms_until(deadline);
    st = left > 0 ? HixlEngineTransferSync(c->eng, e->remote, HIXL_READ, d + i, k, left) : HIXL_TIMEOUT;
    if (st != HIXL_SUCCESS)
      snprintf(why, cap, "pulling request %s from %s (ops %zu to %zu of %zu): %s", e->rreq, e->remote, i,
               i + k, o->n, left > 0 ? HixlGetLastErrorMessage() : "timed out");
  }
  return st;
}

#define RENEW_WINDOW 32 /* PINs of a renewal round in flight at once */

/* A RENEW refused as an operation the producer does not know (its plugin is older):
 * said once; that producer is not asked again until it is linked anew (kv_link: it may
 * have been restarted, upgraded), and its holds are renewed only once their loads are
 * queued. */
static void renew_unknown(hixl_kv_connector *c, const struct kv_meta_entry *e, HixlStatus st) {
  bool old = kv_op_unknown(st);
  if (old) kv_peer_older_note(c, &c->load.norenew, e->remote);
  pthread_mutex_lock(&c->lock);
  bool say = old && !c->load.renew_old_said;
  c->load.renew_old_said |= old;
  pthread_mutex_unlock(&c->lock);
  if (say)
    log_warn("hixl-kv: the producer %s does not renew a hold before its load starts (its plugin is older): "
             "its requests that wait to be scheduled longer than its lease_ms are recomputed",
             e->remote);
}

/* Renew the n requests' holds, op PIN (loads queued or pulled) or RENEW (requests not
 * scheduled yet): the calls started RENEW_WINDOW at a time and waited for together,
 * each for at most timeout_ms, so a producer that does not answer costs a window one
 * timeout, not one per load (one after another, the loads behind it waited that long
 * each, and a healthy producer's lease ran out meanwhile). ans: RENEW_WINDOW answers of
 * HIXL_CALL_MAX bytes. */
static void renew_round(hixl_kv_connector *c, const struct kv_meta_entry *v, size_t n, uint8_t *ans,
                        int32_t timeout_ms, uint8_t op) {
  for (size_t k0 = 0; k0 < n; k0 += RENEW_WINDOW) {
    hixl_call_t call[RENEW_WINDOW];
    uint32_t len[RENEW_WINDOW];
    bool started[RENEW_WINDOW] = {false};
    size_t w = n - k0 < RENEW_WINDOW ? n - k0 : RENEW_WINDOW;
    for (size_t k = 0; k < w; k++) {
      struct kv_out msg = {0};
      hold_msg(c, &msg, op, &v[k0 + k]);
      started[k] = !msg.bad && hixl_engine_call_start(c->eng, v[k0 + k].remote, HIXL_SERVICE_KV, msg.p,
                                                      msg.len, ans + k * HIXL_CALL_MAX, HIXL_CALL_MAX,
                                                      &len[k], timeout_ms, &call[k]) == HIXL_SUCCESS;
      free(msg.p);
    }
    for (size_t k = 0; k < w; k++) {
      HixlStatus st = started[k] ? hixl_engine_call_wait(c->eng, v[k0 + k].remote, call[k]) : HIXL_FAILED;
      if (st == HIXL_SUCCESS) {
        pthread_mutex_lock(&c->lock); /* the pull itself sees any failure */
        c->stats.lookups++;
        pthread_mutex_unlock(&c->lock);
      } else if (op == KV_SVC_RENEW && started[k]) {
        renew_unknown(c, &v[k0 + k], st);
      }
    }
  }
}

/* The renewals of requests not scheduled yet: each producer linked, then RENEWed, as a
 * round. A producer whose last link failed (kv_link notes it; a load's link clears it) is
 * not linked again for a renewal: its holds are left to their leases, and a dead one
 * costs this thread one connect_timeout_ms, not one a request. */
static void renew_waiting(hixl_kv_connector *c, struct kv_meta_entry *v, size_t n, uint8_t *ans,
                          int32_t timeout_ms) {
  size_t m = 0;
  for (size_t k = 0; k < n; k++) {
    pthread_mutex_lock(&c->lock);
    bool skip = c->shut || kv_idhash_has(&c->unreach, v[k].remote);
    pthread_mutex_unlock(&c->lock);
    if (skip || kv_link(c, &v[k], c->cfg.connect_timeout_ms) != HIXL_SUCCESS) continue;
    if (!kv_peer_older(c, &c->load.norenew, v[k].remote))
      v[m++] = v[k]; /* after the link: a new one forgets */
  }
  renew_round(c, v, m, ans, timeout_ms, KV_SVC_RENEW);
}

/* The renewer, started with the first load or the first renewal bound (lock held). */
static void renewer_up(hixl_kv_connector *c);

void kv_renew_bind(hixl_kv_connector *c, const struct kv_meta_entry *e) {
  struct kv_loader *ld = &c->load;
  /* Rank r renews producer ranks r, r + world, ...: the ranks together renew each once. */
  for (uint32_t p = c->rank; p < e->rtp; p += c->world) {
    if (ld->nrenews == ld->renews_cap) {
      size_t cap = ld->renews_cap ? 2 * ld->renews_cap : 16;
      struct kv_meta_entry *nv = cap <= KV_WAITING_MAX ? realloc(ld->renews, cap * sizeof(*nv)) : NULL;
      if (!nv) { /* past the bound at once (or out of memory): left to its lease */
        if (ld->renews_dropped++ == 0)
          log_warn("hixl-kv: more than %u hold renewals bound at once: request %s's is dropped (the first "
                   "such); it is recomputed if it waits past its producer's lease",
                   KV_WAITING_MAX, e->req);
        break;
      }
      ld->renews = nv;
      ld->renews_cap = cap;
    }
    struct kv_meta_entry *x = &ld->renews[ld->nrenews];
    *x = *e;
    x->blocks = x->rblocks = NULL;
    if (kv_worker_address(e->remote, p, x->remote, sizeof(x->remote), &x->cluster) == HIXL_KV_SUCCESS)
      ld->nrenews++;
  }
  if (!ld->nrenews) return;
  renewer_up(c);
  pthread_cond_broadcast(&ld->renew);
}

/* The renewer: while loads are being pulled or wait for a loader thread, it pins each
 * again every half lease (vLLM's decode heartbeats), so a load longer than the lease,
 * or one queued behind others of its producer for longer, keeps its request held; idle
 * otherwise. A round's PINs wait at most a quarter lease (or notify_timeout_ms) for their
 * answers, and the next round starts half a lease after this one started: a producer
 * that does not answer delays no other's renewal past its lease. */
static void *renewer_main(void *arg) {
  hixl_kv_connector *c = arg;
  struct kv_loader *ld = &c->load;
  uint64_t half = (uint64_t)c->cfg.lease_ms * 500000ull;
  int32_t quarter = (int32_t)(c->cfg.lease_ms / 4), notify = c->cfg.notify_timeout_ms;
  int32_t timeout_ms = notify > 0 && notify < quarter ? notify : quarter > 0 ? quarter : 1;
  uint64_t at = kv_now_ns() + half; /* the next round: half a lease after the loads that started it */
  uint8_t *ans = malloc((size_t)RENEW_WINDOW * HIXL_CALL_MAX);
  struct kv_meta_entry *v = NULL;
  size_t cap = 0;
  pthread_mutex_lock(&c->lock);
  while (!c->shut && ans) {
    if (ld->nrenews) { /* requests not scheduled yet: their holds renewed now */
      struct kv_meta_entry *rv = ld->renews;
      size_t rn = ld->nrenews;
      ld->renews = NULL;
      ld->nrenews = ld->renews_cap = 0;
      pthread_mutex_unlock(&c->lock);
      renew_waiting(c, rv, rn, ans, timeout_ms);
      free(rv);
      pthread_mutex_lock(&c->lock);
      continue;
    }
    if (ld->npulling == 0 && !ld->queue) {
      ld->renewer_idle = true;
      pthread_cond_wait(&ld->renew, &c->lock);
      ld->renewer_idle = false;
      at = kv_now_ns() + half; /* a load just started or queued was pinned (or bound) just now */
      continue;
    }
    struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull), .tv_nsec = (long)(at % 1000000000ull)};
    while (!c->shut && !ld->nrenews && pthread_cond_timedwait(&ld->renew, &c->lock, &ts) == 0) {
    }
    if (ld->nrenews) continue;         /* those first; this round's time is kept */
    at = kv_now_ns() + half;           /* this round starts now: the next half a lease after it */
    size_t n = 0, want = ld->npulling; /* copied: a load's entry goes when its thread is done with it */
    for (struct kv_load *l = ld->queue; l; l = l->next) want += l->whole != NULL;
    if (want > cap) {
      struct kv_meta_entry *nv = realloc(v, want * sizeof(*v));
      if (nv) v = nv, cap = want;
    }
    for (uint32_t t = 0; t < KV_LOADERS_MAX && !c->shut && n < cap; t++)
      if (ld->pulling[t]) v[n++] = ld->pulling[t]->e;
    for (struct kv_load *l = ld->queue; l && !c->shut && n < cap; l = l->next)
      if (l->whole) v[n++] = l->e; /* a load waiting for its turn (not a FREE) */
    for (size_t k = 0; k < n; k++) v[k].blocks = v[k].rblocks = NULL;
    pthread_mutex_unlock(&c->lock);
    renew_round(c, v, n, ans, timeout_ms, KV_SVC_PIN);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  free(v);
  free(ans);
  return NULL;
}

/* One load: link, pin, check the layout and the blocks, pull, (the caller) free.
 * Returns the status and the reason in why. */
static HixlStatus load_one(hixl_kv_connector *c, struct kv_load *l, uint32_t slot, char *why, size_t cap) {
  const struct kv_meta_entry *e = &l->e;
  struct kv_loader_slot *s = &c->load.slots[slot];
  uint64_t deadline = kv_now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = kv_link(c, e, c->cfg.connect_timeout_ms);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "linking to the producer %s: %s", e->remote, HixlGetLastErrorMessage());
    return st;
  }
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  struct kv_peer_held *h = calloc(1, sizeof(*h));
  struct opvec o = {0};
  if (!ans || !h) {
    snprintf(why, cap, "out of memory");
    st = HIXL_RESOURCE_EXHAUSTED;
    goto out;
  }
  uint64_t t_pin = 0;
  if ((st = pin_load(c, s, e, deadline, ans, h, &t_pin, why, cap)) != HIXL_SUCCESS) goto out;
  kv_obs_span(c, e->req, KV_PH_PINNED, KV_H_PIN, t_pin);
  pthread_mutex_lock(&c->lock);
  c->stats.lookups++;
  pthread_mutex_unlock(&c->lock);
  /* Per group, the producer holds at least the blocks loaded (a group's leading blocks
   * cached here are not), and exactly those when none was left out. */
  bool fewer = e->ngroups != c->lay.ng;
  for (uint32_t g = 0; g < e->ngroups && !fewer; g++) fewer = h->gn[g] < e->rgn[g];
  if (fewer ||
      (h->n == e->nrblocks && h->digest != kv_groups_digest(e->rblocks, e->nrblocks, e->rgn, e->ngroups))) {
    snprintf(why, cap, "the producer %s holds %zu blocks of request %s in %u groups, %zu %s asked for in %u",
             e->remote, h->n, e->rreq, h->ngroups, e->nrblocks, fewer ? "were" : "other ones were",
             e->ngroups);
    st = HIXL_PARAM_INVALID;
    goto out;
  }
  struct kv_pairs pairs[KV_MAX_GROUPS];
  for (uint32_t g = 0, off = 0; g < e->ngroups; off += e->gn[g++])
    pairs[g] = (struct kv_pairs){e->blocks + off, e->rblocks + off, e->gn[g]};
  struct kv_heads hs[KV_MAX_GROUPS]; /* this rank's heads of that producer rank's blocks (kv_tp.c) */
  kv_load_heads(c, l, hs);
  uint64_t t_build = kv_now_ns();
  if ((st = kv_ops_build(&o, &c->lay, &h->r, 0, c->layers, pairs, hs, why, cap)) != HIXL_SUCCESS) goto out;
  kv_obs_span(c, e->req, KV_PH_POSTED, KV_H_POST, t_build); /* the read below posts at once */
  pthread_mutex_lock(&c->lock); /* pinned: the renewer pins it again while it is pulled */
  if (l->preempted) {           /* handle_preemptions waits for it: nothing read into its blocks */
    pthread_mutex_unlock(&c->lock);
    snprintf(why, cap, "preempted (handle_preemptions)");
    st = HIXL_FAILED;
    goto out;
  }
  c->load.pulling[slot] = l;
  c->load.npulling++;
  if (c->load.renewer_idle) pthread_cond_broadcast(&c->load.renew); /* else it is timing a half lease */
  pthread_mutex_unlock(&c->lock);
  ahead_start(c, s, l); /* answered behind this pull's data */
  KV_TEST_POINT(KV_TEST_LOADER_AHEAD);
  st = pull_ops(c, e, &o, deadline, why, cap);
  pthread_mutex_lock(&c->lock);
  c->load.pulling[slot] = NULL;
  c->load.npulling--;
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_lock(&c->lock);
  c->stats.engine_ops += o.n;
  if (st == HIXL_SUCCESS) c->stats.bytes_loaded += o.bytes;
  pthread_mutex_unlock(&c->lock);
  if (st == HIXL_SUCCESS) {
    kv_obs_moved(c, e->req, o.bytes, o.n);
    kv_obs_landed(c, e->req, e->remote);
  }
out:
  opvec_free(&o);
  if (h) free(h->r.planes);
  free(h);
  free(ans);
  return st;
}

/* loads_per_producer (the key's range is 1..8; a zeroed configuration counts as 1). */
static uint32_t per_producer(const hixl_kv_connector *c) {
  return c->cfg.per_producer ? c->cfg.per_producer : 1;
}

/* Whether an entry of producer remote is queued before l (only a FREE: frees_only). */
static bool queued_before(const struct kv_loader *ld, const struct kv_load *l, const char *remote,
                          bool frees_only) {
  for (const struct kv_load *k = ld->queue; k != l; k = k->next)
    if ((!frees_only || !k->whole) && strcmp(k->e.remote, remote) == 0) return true;
  return false;
}

/* The first queued entry that may start now, unlinked; NULL if none: a load no thread
 * took as its next whose producer fewer than loads_per_producer threads serve, with no
 * FREE of that producer before it; a FREE first of its producer's, which no thread
 * serves (an abort's FREE never runs beside a load of the same producer, which may be
 * the request it frees). Lock held. */
static struct kv_load *take_runnable(hixl_kv_connector *c) {
  struct kv_loader *ld = &c->load;
  uint32_t per = per_producer(c);
  for (struct kv_load *l = ld->queue, *prev = NULL; l; prev = l, l = l->next) {
    if (l->ahead_by) continue;
    size_t busy = kv_idset_count(&ld->busy, l->e.remote);
    if (l->whole ? busy < per && !queued_before(ld, l, l->e.remote, true)
                 : busy == 0 && !queued_before(ld, l, l->e.remote, false))
      return queue_unlink(ld, l, prev);
  }
  return NULL;
}

/* RELEASE e's request on a producer rank this consumer rank reads nothing of: freed
 * there in one call once held, asking again while it is not yet (as pin does).
 * UNSUPPORTED: an older producer, which needs PIN then FREE. */
static HixlStatus release(hixl_kv_connector *c, const struct kv_meta_entry *e, uint64_t deadline) {
  uint8_t ans[300];
  size_t n = 0;
  struct kv_out msg = {0};
  kv_msg(c, &msg, KV_SVC_RELEASE, e->rreq, &e->rcap, 0, "");
  if (e->seq) {
    kv_put_u64(&msg, e->epoch);
    kv_put_u64(&msg, e->seq);
  }
  HixlStatus st = kv_call_settled(c, e->remote, &msg, deadline, ans, sizeof(ans), &n, true);
  if (st != HIXL_SUCCESS) return st;
  uint8_t state = n ? ans[0] : KV_PIN_GONE;
  if (state == KV_PIN_NOT_YET) return HIXL_TIMEOUT;
  return state == KV_PIN_HELD ? HIXL_SUCCESS : HIXL_NOT_FOUND;
}

/* An abort, or a producer rank this consumer rank frees without reading it
 * (pin_first): the producer frees what it holds (best effort). pin_first waits, as a
 * load does, until the producer rank holds the request (within transfer_timeout_ms,
 * and notify_timeout_ms past a shutdown: the host may shut down as soon as the request's
 * reads ended, before this): a FREE that came first would be refused (no metadata bound
 * there yet) or remembered only as an id, and the hold would wait out its lease.
 * RELEASE does both in one call; a producer without it gets PIN, then FREE. */
static void free_remote(hixl_kv_connector *c, const struct kv_load *l) {
  const struct kv_meta_entry *e = &l->e;
  uint8_t ans[64];
  size_t n;
  HixlStatus st;
  if (kv_link(c, e, c->cfg.connect_timeout_ms) != HIXL_SUCCESS) return;
  if (l->pin_first) {
    uint64_t deadline = kv_now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
    if (release(c, e, deadline) != HIXL_UNSUPPORTED) return;
    uint8_t *big = malloc(HIXL_CALL_MAX);
    struct kv_peer_held *h = calloc(1, sizeof(*h));
    char why[512];
    if (big && h && pin(c, e, deadline, big, h, why, sizeof(why), true) == HIXL_NOT_FOUND) {
      free(h->r.planes); /* gone there already: nothing to free */
      free(h);
      free(big);
      return;
    }
    if (h) free(h->r.planes);
    free(h);
    free(big);
  }
  kv_call(c, e->remote, KV_SVC_FREE, e->rreq, &e->rcap, ans, sizeof(ans), &n, c->cfg.notify_timeout_ms, &st);
}

/* One load, start to end: the host hears of it in get_finished. stop: why it ends
 * failed without being run (shut down, preempted), or NULL. */
static void load_run(hixl_kv_connector *c, struct kv_load *l, uint32_t slot, const char *stop) {
  char why[1024];
  snprintf(why, sizeof(why), "%s", stop ? stop : "");
  HixlStatus st = stop ? HIXL_FAILED : load_one(c, l, slot, why, sizeof(why));
  if (st != HIXL_SUCCESS) {
    char full[sizeof(why)];
    snprintf(full, sizeof(full), "%s", why);
    snprintf(why, sizeof(why), "%s: %.1000s", HixlStatusName(st), full);
  }
  pthread_mutex_lock(&c->lock);
  kv_load_part_end(c, l, st, why); /* its last part: the host may use the blocks now */
  pthread_mutex_unlock(&c->lock);
  if (st != HIXL_NOT_FOUND) { /* the producer may still hold it: free it there (best effort) */
    free_start(c, &c->load.slots[slot], l);
    kv_obs_phase(c, l->e.req, KV_PH_FREE, NULL);
  }
}

static void *loader_main(void *arg) {
  const struct kv_loader_arg *a = arg;
  hixl_kv_connector *c = a->c;
  struct kv_loader *ld = &c->load;
  struct kv_loader_slot *s = &ld->slots[a->slot];
  struct kv_load *l = NULL; /* the load to run next: taken from the queue, or PINned ahead (ahead_take) */
  pthread_mutex_lock(&c->lock);
  for (;;) {
    if (!l) {
      l = take_runnable(c);
      if (!l && (s->free_call || s->ahead_call)) { /* nothing to do: end what is in flight first */
        pthread_mutex_unlock(&c->lock);
        free_settle(c, s);
        ahead_drop(c, s);
        pthread_mutex_lock(&c->lock);
        continue;
      }
      if (!l && c->shut) break; /* what is left waits for another thread of its producer */
      if (!l) {
        pthread_cond_wait(&ld->cond, &c->lock);
        continue;
      }
      ld->idle--;
      kv_idset_add(&ld->busy, l->e.remote); /* out of memory: two threads may serve it, no harm */
      ld->running[a->slot] = l;             /* in the section that took it off the queue */
    }
    const char *stop = c->shut ? "shut down" : l->preempted ? "preempted (handle_preemptions)" : NULL;
    pthread_mutex_unlock(&c->lock);
    if (l->e.type == KV_META_FREE)
      free_remote(c, l);
    else
      load_run(c, l, a->slot, stop);
    pthread_mutex_lock(&c->lock);
    /* The next load is marked running in the section that takes it off the queue: with
     * the lock dropped between the two, handle_preemptions found it in neither, returned,
     * and this thread then pulled into the preempted request's blocks (issue 43). */
    struct kv_load *next = ahead_take(c, s); /* this thread goes on with its producer */
    ld->running[a->slot] = next;
    if (!next) {
      kv_idset_del(&ld->busy, l->e.remote);
      ld->idle++;
      pthread_cond_broadcast(&ld->cond); /* that producer's next load may go now */
    }
    /* Going on with its producer changes nothing for the idle threads: waking them for
     * each load (a request) costs every one of them a wake-up beside the pulls. */
    pthread_cond_broadcast(&ld->ended); /* a preemption may wait for it */
    pthread_mutex_unlock(&c->lock);
    free(l->e.blocks);
    free(l->e.rblocks);
    free(l);
    l = next;
    if (l) KV_TEST_POINT(KV_TEST_LOADER_NEXT);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  free_settle(c, s);
  ahead_drop(c, s);
  free(s->ahead_ans);
  s->ahead_ans = NULL;
  return NULL;
}

static void renewer_up(hixl_kv_connector *c) {
  struct kv_loader *ld = &c->load;
  if (!ld->renewer_on && !c->shut && c->cfg.lease_ms > 0) {
    ld->renewer_on = pthread_create(&ld->renewer, NULL, renewer_main, c) == 0; /* else no renewals */
    if (ld->renewer_on) thread_name(ld->renewer, "hixl-kv-renew");
  }
}

hixl_kv_status kv_loader_submit(hixl_kv_connector *c) {
  struct kv_loader *ld = &c->load;
  if (!ld->bound) return HIXL_KV_SUCCESS;
  if (ld->queue_tail)
    ld->queue_tail->next = ld->bound;
  else
    ld->queue = ld->bound;
  ld->queue_tail = ld->bound_tail;
  ld->bound = ld->bound_tail = NULL;
  /* Loads waiting that a thread could start: per producer, as many as fewer than
   * loads_per_producer threads serve it (a FREE's wait is not counted: a thread too many
   * only sleeps). */
  uint32_t runnable = 0, per = per_producer(c);
  for (struct kv_load *l = ld->queue; l && runnable < KV_LOADERS_MAX; l = l->next) {
    if (l->ahead_by) continue;
    size_t have = kv_idset_count(&ld->busy, l->e.remote);
    for (struct kv_load *k = ld->queue; have < per && k != l; k = k->next)
      have += !k->ahead_by && strcmp(k->e.remote, l->e.remote) == 0;
    runnable += have < per;
  }
  int rc = 0;
  while (!c->shut && ld->idle < runnable && ld->nthreads < KV_LOADERS_MAX) {
    ld->args[ld->nthreads] = (struct kv_loader_arg){c, ld->nthreads};
    if ((rc = pthread_create(&ld->threads[ld->nthreads], NULL, loader_main, &ld->args[ld->nthreads])) != 0)
      break;
    thread_name(ld->threads[ld->nthreads], "hixl-kv-load");
    ld->nthreads++;
    ld->idle++; /* until it takes a load */
  }
  if (ld->nthreads) renewer_up(c);
  pthread_cond_broadcast(&ld->cond);
  pthread_cond_broadcast(&ld->renew); /* loads queued: the renewer keeps them held too */
  if (ld->nthreads == 0 && !c->shut)  /* the loads stay queued: a later start_load_kv tries again */
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "start_load_kv: no loader thread: pthread_create: %s",
                   strerror(rc));
  return HIXL_KV_SUCCESS;
}

void kv_loader_join(hixl_kv_connector *c) {
  pthread_mutex_lock(&c->lock);
  uint32_t n = c->load.nthreads; /* none start once shut */
  bool renewer = c->load.renewer_on;
  c->load.renewer_on = false;
  pthread_cond_broadcast(&c->load.renew);
  pthread_mutex_unlock(&c->lock);
  for (uint32_t i = 0; i < n; i++) pthread_join(c->load.threads[i], NULL);
  if (renewer) pthread_join(c->load.renewer, NULL);
  pthread_mutex_lock(&c->lock);
  c->load.nthreads = 0;
  c->load.idle = 0;
  pthread_mutex_unlock(&c->lock);
}
