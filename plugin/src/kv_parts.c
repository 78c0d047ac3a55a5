/* kv_parts: a request as parts, one per rank of the peer instance it moves with
 * (kv_tp.c says which): a consumer rank's load reads from one or several producer
 * ranks and frees each one it is to free; a producer rank's push writes into one or
 * several consumer ranks. The request ends (get_finished) once its last part has, and
 * fails when any part failed. Equal world sizes: one part, rank r with rank r. Also
 * the lists of peer ranks a held or expected request's blocks are given to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"

bool kv_peers_has(const struct kv_peers *s, const char *name) {
  for (uint32_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i].name, name) == 0) return true;
  return false;
}

struct kv_peer_ref *kv_peers_add(struct kv_peers *s, const char *name) {
  for (uint32_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i].name, name) == 0) return &s->v[i];
  if (strnlen(name, KV_PEER_NAME_MAX + 1) > KV_PEER_NAME_MAX) return NULL; /* kept whole or not at all */
  if (s->n >= KV_PEERS_MAX) return NULL;
  struct kv_peer_ref *v = realloc(s->v, (s->n + 1) * sizeof(*v));
  if (!v) return NULL;
  s->v = v;
  memset(&v[s->n], 0, sizeof(v[s->n]));
  snprintf(v[s->n].name, sizeof(v[s->n].name), "%s", name);
  return &v[s->n++];
}

void kv_peers_free(struct kv_peers *s) {
  for (uint32_t i = 0; i < s->n; i++) kv_revoke_free(s->v[i].grant);
  free(s->v);
  s->v = NULL;
  s->n = 0;
}

void kv_peers_drop(hixl_kv_connector *c, const struct kv_peers *s) {
  for (uint32_t i = 0; i < s->n; i++)
    if (!s->v[i].done && !kv_idhash_has(&c->drop, s->v[i].name))
      kv_idhash_add(&c->drop, s->v[i].name, NULL, SIZE_MAX, NULL);
}

void kv_peers_done(hixl_kv_connector *c, struct kv_peers *s, const char *peer) {
  for (uint32_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i].name, peer) == 0) {
      if (s->v[i].grant) kv_revoke_later(c, s->v[i].grant);
      s->v[i].grant = NULL;
      s->v[i].done = true;
      return;
    }
}

bool kv_peers_grant(hixl_kv_connector *c, struct kv_peers *s, const char *peer, const uint64_t *blocks,
                    const uint32_t *gn, uint32_t ngroups) {
  struct kv_peer_ref *r = kv_peers_add(s, peer);
  if (!r) return false;
  r->done = false; /* it reads again */
  if (!r->grant) r->grant = kv_grant(c, peer, blocks, gn, ngroups);
  return true;
}

void kv_peers_revoke(hixl_kv_connector *c, struct kv_peers *s) {
  for (uint32_t i = 0; i < s->n; i++)
    if (s->v[i].grant) {
      kv_revoke_later(c, s->v[i].grant);
      s->v[i].grant = NULL;
    }
}

/* A copy of n block ids (NULL for none); false when out of memory. */
static bool dup_blocks(uint64_t **dst, const uint64_t *src, size_t n) {
  *dst = NULL;
  if (!n) return true;
  if (!(*dst = malloc(n * sizeof(**dst)))) return false;
  memcpy(*dst, src, n * sizeof(**dst));
  return true;
}

/* The world sizes do not map (kv_tp_check), or no layout is registered yet: one part,
 * with the peer rank of the same number (mod its world), which fails at its PIN or
 * ACCEPT with the reason named. */
static bool tp_usable(const hixl_kv_connector *c, uint32_t np, uint32_t nd) {
  char why[8];
  return c->lay.ng > 0 && kv_tp_check(&c->lay, np, nd, why, sizeof(why));
}

/* A load that cannot be bound fails at once (its blocks to the load errors, the host told it
 * finished) rather than being waited for by the host for ever; its producer's lease frees
 * its side. An abort's FREE is only told: nothing waits for it. Lock held. */
static hixl_kv_status load_unbound(hixl_kv_connector *c, const struct kv_meta_entry *e, hixl_kv_status st,
                                   const char *why) {
  if (e->type == KV_META_LOAD) {
    kv_recv_refused(c, e, KV_CAUSE_OTHER);
  }
  return kv_fail(st, "bind_connector_meta: request %s: %s", e->req, why);
}

hixl_kv_status kv_load_parts(hixl_kv_connector *c, struct kv_meta_entry *e) {
  uint32_t np = e->rtp, nd = c->world, d = c->rank;
  uint64_t reads, frees;
  if (tp_usable(c, np, nd)) {
    reads = kv_tp_sources(&c->lay, np, nd, d);
    frees = kv_tp_frees(&c->lay, np, nd, d);
  } else {
    reads = frees = UINT64_C(1) << (d % np);
  }
  if (e->type == KV_META_FREE) reads = 0; /* an abort: only told */
  struct kv_whole *w = reads ? KV_ALLOC(KV_TEST_BIND, calloc(1, sizeof(*w))) : NULL;
  if (reads && !w) return load_unbound(c, e, HIXL_KV_RESOURCE_EXHAUSTED, "out of memory");
  if (w) w->in_forward = c->cfg.load_in_forward;
  struct kv_load *first = NULL, **tail = &first;
  bool ok = true, oom = false; /* !ok and !oom: the producer's address */
  for (uint32_t p = 0; p < np && ok; p++) {
    bool read = reads >> p & 1;
    if (!read && !(frees >> p & 1)) continue;
    struct kv_load *l = KV_ALLOC(KV_TEST_BIND, calloc(1, sizeof(*l)));
    if (!l) {
      oom = true;
      ok = false;
      break;
    }
    l->e = *e;
    l->e.blocks = l->e.rblocks = NULL;
    l->src = p;
    if (read) {
      l->e.type = KV_META_LOAD;
      l->whole = w;
      ok = dup_blocks(&l->e.blocks, e->blocks, e->nblocks) &&
           dup_blocks(&l->e.rblocks, e->rblocks, e->nrblocks);
      oom = !ok;
    } else {
      l->e.type = KV_META_FREE;
      l->e.nblocks = l->e.nrblocks = 0;
      l->pin_first = e->type == KV_META_LOAD; /* not an abort's: that one is told at once */
    }
    if (ok &&
        kv_worker_address(e->remote, p, l->e.remote, sizeof(l->e.remote), &l->e.cluster) != HIXL_KV_SUCCESS)
      ok = false;
    if (read) w->left++;
    *tail = l;
    tail = &l->next;
    if (!ok) break;
  }
  if (!ok) {
    for (struct kv_load *l = first, *next; l; l = next) {
      next = l->next;
      free(l->e.blocks);
      free(l->e.rblocks);
      free(l);
    }
    free(w);
    char why[KV_MAX_ENGINE + 64];
    snprintf(why, sizeof(why), "producer \"%s\" is not ip:port", e->remote);
    return oom ? load_unbound(c, e, HIXL_KV_RESOURCE_EXHAUSTED, "out of memory")
               : load_unbound(c, e, HIXL_KV_PARAM_INVALID, why);
  }
  if (c->load.bound_tail)
    c->load.bound_tail->next = first;
  else
    c->load.bound = first;
  for (struct kv_load *l = first; l; l = l->next) c->load.bound_tail = l;
  if (w && w->in_forward) c->load.in_forward++;
  return HIXL_KV_SUCCESS;
}

void kv_load_part_end(hixl_kv_connector *c, struct kv_load *l, HixlStatus st, const char *why) {
  struct kv_whole *w = l->whole;
  if (!w) return;
  l->whole = NULL;
  if (st != HIXL_SUCCESS) {
    log_error("hixl-kv: request %s failed to load from producer rank %u: %s", l->e.req, l->src, why);
    kv_obs_failed(c, l->e.req, kv_obs_cause(st, why), why); /* counted once per request */
    w->failed = true;
  }
  if (--w->left) return;
  if (w->failed) {
    c->stats.loads_failed++;
    kv_err_blocks_add(c, l->e.blocks, l->e.nblocks);
  } else {
    c->stats.loads_done++;
  }
  if (w->in_forward) { /* the forward pass waiting in kv_wait_layer goes on; get_finished says nothing */
    kv_obs_phase(c, l->e.req, KV_PH_DONE, NULL);
    kv_idset_add(&c->load.forward_done, l->e.req); /* out of memory: its trace is dropped later */
    if (c->load.in_forward) c->load.in_forward--;
    pthread_cond_broadcast(&c->load.ended);
  } else {
    kv_finished_add(c, &c->recving_done, l->e.req); /* the host may use the blocks now */
  }
  free(w);
}

void kv_load_heads(const hixl_kv_connector *c, const struct kv_load *l, struct kv_heads *hs) {
  for (uint32_t g = 0; g < c->lay.ng; g++) {
    struct kv_tp_slice s;
    hs[g] = (struct kv_heads){0};
    if (!kv_tp_slice(&c->lay.g[g], l->e.rtp, l->src, c->world, c->rank, &s)) continue;
    hs[g] = (struct kv_heads){s.whole, s.dst, s.src, s.n};
  }
}

/* A push that cannot start: failed and finished at once, so the host frees its blocks. */
static hixl_kv_status push_refused(hixl_kv_connector *c, const struct kv_meta_entry *e, const char *why) {
  c->stats.pushes_failed++;
  kv_finished_add(c, &c->sending_done, e->req);
  return kv_fail(HIXL_KV_PARAM_INVALID, "bind_connector_meta: request %s: %s", e->req, why);
}

hixl_kv_status kv_push_parts(hixl_kv_connector *c, struct kv_meta_entry *e, uint64_t now) {
  uint32_t np = c->world, p = c->rank, nd = e->rtp;
  uint64_t dsts = 0;
  if (!c->cfg.push) /* no pusher runs here */
    return push_refused(c, e,
                        "its scheduler pushes, and this worker's mode is pull: give both the same mode");
  if (tp_usable(c, np, nd)) {
    for (uint32_t d = 0; d < nd; d++)
      if (kv_tp_reads(&c->lay, np, p, nd, d)) dsts |= UINT64_C(1) << d;
  } else {
    dsts = UINT64_C(1) << (p % nd);
  }
  if (!dsts) { /* no consumer rank needs this rank's copy (an MLA rank past theirs) */
    c->stats.pushes_done++;
    kv_finished_add(c, &c->sending_done, e->req);
    return HIXL_KV_SUCCESS;
  }
  struct kv_whole *w = calloc(1, sizeof(*w));
  struct kv_push *first = NULL, **tail = &first;
  bool ok = w != NULL;
  for (uint32_t d = 0; d < nd && ok; d++) {
    if (!(dsts >> d & 1)) continue;
    struct kv_push *x = calloc(1, sizeof(*x));
    if (!x) {
      ok = false;
      break;
    }
    x->e = *e;
    x->dst = d;
    x->whole = w;
    x->step = c->step;
    x->bound_ns = now;
    w->left++;
    *tail = x;
    tail = &x->next;
    ok = dup_blocks(&x->e.blocks, e->blocks, e->nblocks) &&
         dup_blocks(&x->e.rblocks, e->rblocks, e->nrblocks) &&
         kv_worker_address(e->remote, d, x->e.remote, sizeof(x->e.remote), &x->e.cluster) == HIXL_KV_SUCCESS;
  }
  if (!ok) {
    for (struct kv_push *x = first, *next; x; x = next) {
      next = x->next;
      free(x->e.blocks);
      free(x->e.rblocks);
      free(x);
    }
    free(w);
    char why[KV_MAX_ENGINE + 64];
    snprintf(why, sizeof(why), "out of memory, or consumer \"%s\" is not ip:port", e->remote);
    return push_refused(c, e, why);
  }
  c->stats.blocks_held += e->nblocks;
  c->stats.requests_held++;
  if (c->push.tail)
    c->push.tail->next = first;
  else
    c->push.pushes = first;
  for (struct kv_push *x = first; x; x = x->next) c->push.tail = x;
  pthread_cond_broadcast(&c->push.cond);
  return HIXL_KV_SUCCESS;
}

void kv_push_part_end(hixl_kv_connector *c, struct kv_push *p, bool ok) {
  struct kv_whole *w = p->whole;
  if (!w) return;
  p->whole = NULL;
  w->failed |= !ok;
  if (--w->left) return;
  if (w->failed)
    c->stats.pushes_failed++;
  else
    c->stats.pushes_done++;
  c->stats.blocks_held -= p->e.nblocks;
  c->stats.requests_held--;
  kv_finished_add(c, &c->sending_done, p->e.req); /* the host may free the producer's blocks */
  free(w);
}

void kv_push_heads(const hixl_kv_connector *c, const struct kv_push *p, struct kv_heads *hs) {
  for (uint32_t g = 0; g < c->lay.ng; g++) {
    struct kv_tp_slice s;
    hs[g] = (struct kv_heads){0};
    if (!kv_tp_slice(&c->lay.g[g], c->world, c->rank, p->e.rtp, p->dst, &s)) continue;
    hs[g] = (struct kv_heads){s.whole, s.src, s.dst, s.n};
  }
}
