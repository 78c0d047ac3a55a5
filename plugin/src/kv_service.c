/* kv_service: the KV service a worker answers (engine CALL frames, service
 * HIXL_SERVICE_KV, on the engine's progress thread): as a pull producer, PIN and FREE
 * of the requests it holds for consumers, with their leases; as a push consumer,
 * ACCEPT, the landed LAYER(S) notices and ABORT of the pushes it expects. Every call
 * presents the capability of its request (kv_cap.c), or is refused and counted
 * (cap_refused): reaching the engine's port is not enough to act on a request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"

struct kv_held *kv_held_find(hixl_kv_connector *c, const char *id) {
  for (struct kv_held *h = c->hold.held; h; h = h->next)
    if (strcmp(h->id, id) == 0) return h;
  return NULL;
}

/* Unlink h, report it finished-sending, free it. Lock held. */
static void held_release(hixl_kv_connector *c, struct kv_held *h) {
  struct kv_held **pp = &c->hold.held;
  while (*pp != h) pp = &(*pp)->next;
  *pp = h->next;
  c->stats.blocks_held -= h->n;
  c->stats.requests_held--;
  kv_peers_revoke(c, &h->peers);
  kv_finished_add(c, &c->sending_done, h->id);
  kv_gone_add(c, h->id);
  kv_peers_free(&h->peers);
  free(h->blocks);
  free(h);
}

/* Free held requests whose lease ran out. A consumer that pinned one may still be
 * reading its blocks: its links are cut before the host hears that the blocks are
 * free (drop_peers, in get_finished), so no answer of this engine reads them after
 * the host reuses them. Lock held. */
void kv_leases_expire(hixl_kv_connector *c) {
  uint64_t now = kv_now_ns();
  for (struct kv_held *h = c->hold.held, *next; h; h = next) {
    next = h->next;
    if (now >= h->expires_ns) {
      c->stats.lease_expired++;
      kv_obs_failed(c, h->id, KV_CAUSE_LEASE, "its lease expired before a consumer freed it");
      kv_peers_drop(c, &h->peers);
      held_release(c, h);
    }
  }
}

/* ---- push mode: what a consumer worker expects ---- */

struct kv_expect *kv_expect_find(hixl_kv_connector *c, const char *id) {
  for (struct kv_expect *x = c->exp.expects; x; x = x->next)
    if (strcmp(x->id, id) == 0) return x;
  return NULL;
}

/* x ends: landed whole (why NULL) or failed. Lock held. */
void kv_expect_end(hixl_kv_connector *c, struct kv_expect *x, const char *why) {
  struct kv_expect **pp = &c->exp.expects;
  while (*pp != x) pp = &(*pp)->next;
  *pp = x->next;
  if (why) {
    kv_obs_failed(c, x->id, KV_CAUSE_ABORTED, why); /* the cause set ahead, if any */
    c->stats.loads_failed++;
    kv_err_blocks_add(c, x->blocks, x->n);
    log_error("hixl-kv: request %s failed to load: %s", x->id, why);
  } else {
    c->stats.loads_done++;
    c->stats.bytes_loaded += kv_request_bytes(c, x->pgn, x->ngroups);
    kv_obs_moved(c, x->id, kv_request_bytes(c, x->pgn, x->ngroups), 0);
    kv_obs_phase(c, x->id, KV_PH_LAST_BYTE, NULL); /* the producer's histograms time the transfer */
  }
  kv_peers_revoke(c, &x->peers);
  kv_finished_add(c, &c->recving_done, x->id);
  kv_gone_add(c, x->id);
  kv_peers_free(&x->peers);
  free(x->blocks);
  free(x->landed);
  free(x);
  pthread_cond_broadcast(&c->exp.landed);
}

/* Expected pushes that no producer finished within the lease fail. Lock held. */
void kv_expects_expire(hixl_kv_connector *c) {
  uint64_t now = kv_now_ns();
  for (struct kv_expect *x = c->exp.expects, *next; x; x = next) {
    next = x->next;
    if (now >= x->deadline_ns) {
      char why[96];
      snprintf(why, sizeof(why), "no producer wrote all %u layers within lease_ms %u", c->layers,
               c->cfg.lease_ms);
      /* A producer that accepted may still be writing: its links are cut before the
       * host hears of the failure and reuses the blocks (see drop_peers). */
      kv_peers_drop(c, &x->peers);
      kv_obs_cause_set(c, x->id, KV_CAUSE_LEASE);
      kv_expect_end(c, x, why);
    }
  }
}

/* PIN or ACCEPT of a request this worker holds (or expects): the layout, the
 * request's blocks as counts and a digest, and where this worker's planes are. Lock
 * held. */
static void held_answer(hixl_kv_connector *c, struct kv_out *o, const uint64_t *blocks, size_t n,
                        const uint32_t *gn, uint32_t ngroups) {
  kv_put_u8(o, KV_PIN_HELD);
  kv_put_str(o, c->lay.text, strlen(c->lay.text));
  kv_put_u32(o, (uint32_t)n);
  kv_put_u64(o, kv_groups_digest(blocks, n, gn, ngroups));
  kv_put_groups(o, gn, ngroups);
  kv_layout_put_planes(o, &c->lay); /* none before registration: the layouts differ then */
}

/* A consumer rank of world ranks calls on held h: its instance's world size is h's
 * (the first call sets it, and which ranks free h here); NULL, or why not. Lock held. */
static const char *held_rank(hixl_kv_connector *c, struct kv_held *h, uint32_t world) {
  if (h->ctp == 0) {
    h->ctp = world;
    h->need = c->lay.ng ? kv_tp_touchers(&c->lay, c->world, c->rank, world) : 1;
  }
  return h->ctp == world ? NULL : "another consumer rank of it runs another world size";
}

static const char *op_name(uint8_t op) {
  switch (op) {
  case KV_SVC_PIN: return "PIN";
  case KV_SVC_FREE: return "FREE";
  case KV_SVC_ACCEPT: return "ACCEPT";
  case KV_SVC_LAYER: return "LAYER";
  case KV_SVC_ABORT: return "ABORT";
  case KV_SVC_LAYERS: return "LAYERS";
  case KV_SVC_RELEASE: return "RELEASE";
  default: return "an unknown operation";
  }
}

/* Whether peer may be given the blocks of a request whose peers are s: one of them, or
 * room for one more (KV_PEERS_MAX); else why not in *why, counted, the first logged.
 * Lock held. */
static bool peers_room(hixl_kv_connector *c, const struct kv_peers *s, const char *peer, const char **why) {
  _Static_assert(KV_PEERS_MAX == 64, "the refusal below names the bound");
  if (s->n < KV_PEERS_MAX || kv_peers_has(s, peer)) return true;
  *why = "its blocks are given to 64 peers already (KV_PEERS_MAX: the ranks of one peer instance at most)";
  if (c->peers_refused++ == 0)
    log_warn("hixl-kv: a PIN or ACCEPT was refused: a request's blocks are given to at most %u peers "
             "(KV_PEERS_MAX, the ranks of one instance), and another one asked; its load or push of that "
             "request fails, and the caller hears why (the first such refusal)",
             KV_PEERS_MAX);
  return false;
}

/* What a call's capability check found. */
enum cap_verdict {
  CAP_OK,        /* it presents the request's capability */
  CAP_NONE,      /* it presents none */
  CAP_OLD,       /* it speaks the protocol before capabilities */
  CAP_WRONG,     /* it presents another */
  CAP_UNCHECKED, /* an id neither held nor expected here, and no metadata bound yet: no key to check with */
};

/* Check got against the capability of request id: want, the one it is held or
 * expected with; for an id neither held nor expected (want NULL), the one the
 * scheduler's key gives it, which only an id that scheduler issued has. Lock held. */
static enum cap_verdict cap_check(const hixl_kv_connector *c, const char *id, const struct kv_cap *want,
                                  const struct kv_cap *got) {
  struct kv_cap derived;
  if (got->len == 0) return CAP_NONE;
  if (!want) {
    if (!c->cap_key_set) return CAP_UNCHECKED;
    kv_cap_make(c->cap_key, id, &derived);
    want = &derived;
  }
  return kv_cap_equal(want, got) ? CAP_OK : CAP_WRONG;
}

/* A call refused for its capability: counted, and answered PARAM_INVALID with the
 * reason. Lock held. */
static HixlStatus cap_refuse(hixl_kv_connector *c, uint8_t op, const char *id, const char *peer,
                             enum cap_verdict v, uint8_t *resp, size_t cap, size_t *resp_len) {
  kv_obs_count(c, KV_CAUSE_REFUSED);
  if (c->stats.cap_refused++ == 0)
    log_warn(
        "hixl-kv: a KV service call presenting no or a wrong request capability was refused (get_stats_ex "
        "cap_refused counts them; the caller hears why)");
  const char *why =
      v == CAP_NONE  ? "carries no capability (its kv_transfer_params had no \"cap\"?)"
      : v == CAP_OLD ? "carries no capability (KV service protocol 3, before capabilities: update its plugin)"
      : v == CAP_WRONG ? "presents a wrong capability (not the one its kv_transfer_params gave)"
                       : "cannot be checked: this worker has bound no connector metadata yet, so it knows no "
                         "capability key";
  *resp_len = (size_t)snprintf((char *)resp, cap, "refused: %s of request %s from %s %s; nothing was done",
                               op_name(op), id, peer, why);
  if (*resp_len >= cap) *resp_len = cap ? cap - 1 : 0;
  return HIXL_PARAM_INVALID;
}

HixlStatus kv_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                    size_t *resp_len) {
  hixl_kv_connector *c = ctx;
  struct kv_in in = {req, len, 0, false};
  if (strnlen(peer, KV_PEER_NAME_MAX + 1) > KV_PEER_NAME_MAX) {
    /* Grants are made and revoked by the caller's whole name: one this worker could not
     * keep whole is refused, never cut (a cut name's grant would never be revoked). */
    *resp_len =
        (size_t)snprintf((char *)resp, cap,
                         "refused: a KV service call from a peer whose name (%.64s...) is longer than "
                         "the %u bytes a worker keeps of one; nothing was done",
                         peer, KV_PEER_NAME_MAX);
    if (*resp_len >= cap) *resp_len = cap ? cap - 1 : 0;
    return HIXL_PARAM_INVALID;
  }
  char id[KV_MAX_ID + 1];
  char reason[KV_MAX_ID + 1] = "";
  uint8_t proto = kv_get_u8(&in), op = kv_get_u8(&in);
  kv_get_str(&in, id, KV_MAX_ID);
  struct kv_cap got = {0};
  if (!in.bad && proto == KV_SVC_PROTO_NOCAP && op >= KV_SVC_PIN && op <= KV_SVC_OP_LAST) {
    /* The protocol before capabilities: a call that carries none, whatever follows. */
    pthread_mutex_lock(&c->lock);
    HixlStatus st = cap_refuse(c, op, id, peer, CAP_OLD, resp, cap, resp_len);
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  kv_get_cap(&in, &got);
  uint32_t world = kv_get_u32(&in), rank = kv_get_u32(&in); /* the caller's (kv_tp.c) */
  uint32_t layer = op == KV_SVC_LAYER || op == KV_SVC_LAYERS ? kv_get_u32(&in) : 0;
  uint32_t count = op == KV_SVC_LAYERS ? kv_get_u32(&in) : 1;
  if (op == KV_SVC_ABORT) kv_get_str(&in, reason, KV_MAX_ID);
  uint64_t epoch = 0, seq = 0; /* PIN: which hold (a consumer given hold_epoch and hold_seq) */
  if ((op == KV_SVC_PIN || op == KV_SVC_RELEASE) && in.off < len) {
    epoch = kv_get_u64(&in);
    seq = kv_get_u64(&in);
  }
  uint32_t png = 0, pgn[KV_MAX_GROUPS] = {0}; /* ACCEPT: the blocks per group the producer writes */
  if (op == KV_SVC_ACCEPT && in.off < len) {
    png = kv_get_u8(&in);
    if (png > KV_MAX_GROUPS) in.bad = true;
    for (uint32_t g = 0; g < png && !in.bad; g++) pgn[g] = kv_get_u32(&in);
  }
  struct kv_out out = {0};
  HixlStatus st = HIXL_SUCCESS;
  if (in.bad || in.off != len || proto != KV_SVC_PROTO || (op == KV_SVC_LAYERS && count < 2) || world == 0 ||
      world > KV_TP_MAX || rank >= world) {
    *resp_len = (size_t)snprintf(
        (char *)resp, cap, "malformed KV service request from %s%s", peer,
        proto == 4 ? " (KV service protocol 4, before tensor parallelism: update its plugin)" : "");
    return HIXL_PARAM_INVALID;
  }
  pthread_mutex_lock(&c->lock);
  kv_leases_expire(c);
  kv_expects_expire(c);
  struct kv_held *h = kv_held_find(c, id);
  struct kv_expect *x = kv_expect_find(c, id);
  bool held_op = op == KV_SVC_PIN || op == KV_SVC_FREE || op == KV_SVC_RELEASE;
  enum cap_verdict v = CAP_OK;
  if (op >= KV_SVC_PIN && op <= KV_SVC_OP_LAST)
    v = cap_check(c, id, held_op ? (h ? &h->cap : NULL) : (x ? &x->cap : NULL), &got);
  /* Unchecked (nothing bound yet here) is refused only where it would change
   * something: a FREE would be remembered. PIN and ACCEPT answer "not yet", LAYER
   * "not expected", ABORT does nothing, as for any id this worker does not know. */
  if (v == CAP_NONE || v == CAP_WRONG || (v == CAP_UNCHECKED && op == KV_SVC_FREE)) {
    st = cap_refuse(c, op, id, peer, v, resp, cap, resp_len);
    pthread_mutex_unlock(&c->lock);
    kv_revoke_flush(c); /* what the expiries above let go */
    return st;
  }
  const char *tp_why = NULL; /* a call from a rank of another world size, or one that has no part in it */
  if (op == KV_SVC_ACCEPT) {
    if (x) {
      if (x->ptp == 0) { /* the first producer rank: which ranks write into it */
        x->ptp = world;
        x->want = c->lay.ng ? kv_tp_sources(&c->lay, world, c->world, c->rank) : 0;
      }
      if (x->ptp != world)
        tp_why = "another producer rank of it runs another world size";
      else if (x->want && !(x->want >> rank & 1))
        tp_why = "that producer rank writes nothing into this rank (kv_tp.c)";
      else if (peers_room(c, &x->peers, peer, &tp_why)) {
        if (!kv_peers_grant(c, &x->peers, peer, x->blocks, x->gn, x->ngroups))
          st = HIXL_RESOURCE_EXHAUSTED;
        else
          kv_obs_phase(c, id, KV_PH_PINNED, peer);
      }
      for (uint32_t g = 0; g < x->ngroups; g++) /* what lands: at most what each group expects */
        x->pgn[g] = png == x->ngroups && pgn[g] < x->gn[g] ? pgn[g] : x->gn[g];
      held_answer(c, &out, x->blocks, x->n, x->gn, x->ngroups);
    } else if (kv_idhash_has(&c->gone, id)) {
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why = "it already ended (loaded, failed or expired)";
      kv_put_str(&out, why, strlen(why));
    } else {
      kv_put_u8(&out, KV_PIN_NOT_YET);
    }
  } else if (op == KV_SVC_LAYER || op == KV_SVC_LAYERS) {
    uint64_t bit = UINT64_C(1) << rank;
    if (x && (x->ptp != world || !(x->want & bit))) {
      tp_why = "that producer rank did not accept it here";
    } else if (x && layer < c->layers && count <= c->layers - layer) {
      bool woke = false;
      kv_obs_layer(c, id, layer, count);
      for (uint32_t l = layer; l < layer + count && x; l++)
        if (!(x->landed[l] & bit)) {
          x->landed[l] |= bit;
          woke = true;
          if (x->landed[l] == x->want && ++x->nlanded == c->layers) kv_expect_end(c, x, NULL), x = NULL;
        }
      if (woke) pthread_cond_broadcast(&c->exp.landed); /* the forward pass only */
    } else {
      st = x ? HIXL_PARAM_INVALID : HIXL_NOT_FOUND;
    }
  } else if (op == KV_SVC_ABORT) {
    if (x) {
      char why[KV_MAX_ID + 64];
      snprintf(why, sizeof(why), "the producer %s gave up: %s", peer, reason);
      kv_expect_end(c, x, why);
    }
  } else if (op == KV_SVC_PIN) {
    if (h) {
      if (!(tp_why = held_rank(c, h, world)) && peers_room(c, &h->peers, peer, &tp_why)) {
        h->expires_ns = kv_now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull;
        kv_obs_phase(c, id, KV_PH_PINNED, peer);
        if (!kv_peers_grant(c, &h->peers, peer, h->blocks, h->gn, h->ngroups)) st = HIXL_RESOURCE_EXHAUSTED;
        held_answer(c, &out, h->blocks, h->n, h->gn, h->ngroups);
      }
    } else if (kv_idhash_has(&c->gone, id)) {
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why = "it was freed, its lease expired, or it was aborted";
      kv_put_str(&out, why, strlen(why));
    } else if (seq && epoch == c->hold.epoch && seq <= c->hold.bound_seq) {
      /* Its hold was bound here, or would have been: no later step brings it. */
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why =
          "it was never held here (this worker bound every hold up to its number), or was freed "
          "long ago";
      kv_put_str(&out, why, strlen(why));
    } else {
      kv_put_u8(&out, KV_PIN_NOT_YET);
    }
  } else if (op == KV_SVC_RELEASE) {
    /* A consumer rank that reads nothing of this rank's copy lets go of it: as FREE when
     * held; else "not yet", nothing remembered (the hold may still come), or gone. */
    if (h) {
      if (!(tp_why = held_rank(c, h, world))) {
        h->freed |= UINT64_C(1) << rank;
        kv_obs_phase(c, id, KV_PH_FREE, peer);
        kv_put_u8(&out, KV_PIN_HELD);
        if ((h->freed & h->need) == h->need) held_release(c, h);
      }
    } else if (kv_idhash_has(&c->gone, id) || (seq && epoch == c->hold.epoch && seq <= c->hold.bound_seq)) {
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why = "it is no longer held here";
      kv_put_str(&out, why, strlen(why));
    } else {
      kv_put_u8(&out, KV_PIN_NOT_YET);
    }
  } else if (op == KV_SVC_FREE) {
    /* One not bound yet (an abort), its capability checked above: never hold it. One
     * held: freed once every consumer rank that frees it here did (kv_tp_touchers). */
    if (h && !(tp_why = held_rank(c, h, world))) {
      h->freed |= UINT64_C(1) << rank;
      kv_obs_phase(c, id, KV_PH_FREE, peer);
      if ((h->freed & h->need) == h->need) held_release(c, h);
    } else if (!h && !kv_idhash_has(&c->gone, id)) {
      kv_gone_add(c, id);
    }
  } else {
    st = HIXL_UNSUPPORTED;
  }
  if (tp_why && st == HIXL_SUCCESS) {
    st = HIXL_PARAM_INVALID;
    *resp_len = (size_t)snprintf((char *)resp, cap, "refused: %s of request %s from %s (rank %u of %u): %s",
                                 op_name(op), id, peer, rank, world, tp_why);
    if (*resp_len >= cap) *resp_len = cap ? cap - 1 : 0;
    pthread_mutex_unlock(&c->lock);
    kv_revoke_flush(c);
    free(out.p);
    return st;
  }
  pthread_mutex_unlock(&c->lock);
  kv_revoke_flush(c);
  if (st != HIXL_SUCCESS) {
    *resp_len = (size_t)snprintf((char *)resp, cap, "%s: KV service operation %u for request %s",
                                 st == HIXL_NOT_FOUND            ? "not expected here"
                                 : st == HIXL_PARAM_INVALID      ? "layers out of range"
                                 : st == HIXL_RESOURCE_EXHAUSTED ? "out of memory"
                                                                 : "unknown",
                                 op, id);
    free(out.p);
    return st;
  }
  if (out.bad || out.len > cap) {
    free(out.p);
    *resp_len = (size_t)snprintf((char *)resp, cap, "KV service answer for %s does not fit", id);
    return HIXL_RESOURCE_EXHAUSTED;
  }
  if (out.len) memcpy(resp, out.p, out.len);
  *resp_len = out.len;
  free(out.p);
  return HIXL_SUCCESS;
}
