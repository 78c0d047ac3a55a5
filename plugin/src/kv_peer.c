/* kv_peer: calls to a peer worker's KV service (kv_service.c), and linking to it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "util/log.h"

/* A KV service request: op on request id, presenting cap (LAYER: which layer; ABORT: why). */
bool kv_msg(const hixl_kv_connector *c, struct kv_out *o, uint8_t op, const char *id,
            const struct kv_cap *cap, uint32_t layer, const char *reason) {
  kv_put_u8(o, KV_SVC_PROTO);
  kv_put_u8(o, op);
  kv_put_str(o, id, strlen(id));
  kv_put_cap(o, cap);      /* len 0 when the params gave none: the peer refuses it, and says so */
  kv_put_u32(o, c->world); /* who asks: which heads it reads or writes (kv_tp.c) */
  kv_put_u32(o, c->rank);
  if (op == KV_SVC_LAYER || op == KV_SVC_LAYERS) kv_put_u32(o, layer); /* LAYERS: the caller adds count */
  if (op == KV_SVC_ABORT) kv_put_str(o, reason, strnlen(reason, KV_MAX_ID));
  return !o->bad;
}

int kv_call_msg(hixl_kv_connector *c, const char *remote, struct kv_out *o, uint8_t *ans, size_t cap,
                size_t *n, int32_t timeout_ms, HixlStatus *st) {
  *st = o->bad ? HIXL_RESOURCE_EXHAUSTED
               : hixl_engine_call(c->eng, remote, HIXL_SERVICE_KV, o->p, o->len, ans, cap, n,
                                  timeout_ms > 0 ? timeout_ms : 1);
  free(o->p);
  o->p = NULL;
  return *st == HIXL_SUCCESS ? 0 : -1;
}

HixlStatus kv_call_settled(hixl_kv_connector *c, const char *remote, struct kv_out *o, uint64_t deadline,
                           uint8_t *ans, size_t cap, size_t *n, bool cleanup) {
  HixlStatus st = o->bad ? HIXL_RESOURCE_EXHAUSTED : HIXL_SUCCESS;
  for (unsigned tries = 0; st == HIXL_SUCCESS; tries++) {
    int32_t left = kv_ms_until(deadline);
    st = hixl_engine_call(c->eng, remote, HIXL_SERVICE_KV, o->p, o->len, ans, cap, n, left > 0 ? left : 1);
    if (st != HIXL_SUCCESS || *n == 0 || ans[0] != KV_PIN_NOT_YET || kv_ms_until(deadline) == 0) break;
    pthread_mutex_lock(&c->lock);
    bool shut = c->shut; /* shutdown joins this thread: asking on held it up to the deadline */
    uint64_t shut_end = c->shut_ns + (uint64_t)c->cfg.notify_timeout_ms * 1000000ull;
    pthread_mutex_unlock(&c->lock);
    if (shut) {
      KV_TEST_POINT(KV_TEST_SETTLE_SHUT);
      if (!cleanup) break;
      if (shut_end < deadline) deadline = shut_end;
      if (kv_ms_until(deadline) == 0) break;
    }
    struct timespec ts = {0, tries < 20 ? 200000 : 2000000}; /* the peer binds it at its next step */
    nanosleep(&ts, NULL);
  }
  free(o->p);
  o->p = NULL;
  return st;
}

int kv_call_ex(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id,
               const struct kv_cap *rcap, uint32_t layer, const char *reason, uint8_t *ans, size_t cap,
               size_t *n, int32_t timeout_ms, HixlStatus *st) {
  struct kv_out o = {0};
  kv_msg(c, &o, op, id, rcap, layer, reason);
  return kv_call_msg(c, remote, &o, ans, cap, n, timeout_ms, st);
}

int kv_call(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id, const struct kv_cap *rcap,
            uint8_t *ans, size_t cap, size_t *n, int32_t timeout_ms, HixlStatus *st) {
  return kv_call_ex(c, remote, op, id, rcap, 0, "", ans, cap, n, timeout_ms, st);
}

/* Whether st refuses a KV service operation as one the peer does not know: UNSUPPORTED,
 * or an older worker's "malformed" (its last error's text). */
bool kv_op_unknown(HixlStatus st) {
  return st == HIXL_UNSUPPORTED ||
         (st == HIXL_PARAM_INVALID && strstr(HixlGetLastErrorMessage(), "malformed KV service request"));
}

bool kv_peer_older(hixl_kv_connector *c, struct kv_idhash *set, const char *peer) {
  pthread_mutex_lock(&c->lock);
  bool has = kv_idhash_has(set, peer);
  pthread_mutex_unlock(&c->lock);
  return has;
}

void kv_peer_older_note(hixl_kv_connector *c, struct kv_idhash *set, const char *peer) {
  pthread_mutex_lock(&c->lock);
  if (!kv_idhash_has(set, peer)) kv_idhash_add(set, peer, NULL, KV_UNREACH_MAX, NULL);
  pthread_mutex_unlock(&c->lock);
}

/* Link to the peer of e (again, if its link was lost), within timeout_ms: SUCCESS
 * also when it was linked already. A peer it fails for is remembered as unreachable
 * until a Link to it succeeds (or, past KV_UNREACH_MAX such peers, the oldest is forgotten).
 * A peer linked anew may be another build (restarted): a refused RENEW is forgotten. */
HixlStatus kv_link(hixl_kv_connector *c, const struct kv_meta_entry *e, int32_t timeout_ms) {
  HixlStatus st = HixlCacheManagerLink(c->mgr, e->cluster, e->remote, timeout_ms);
  bool anew = st == HIXL_SUCCESS; /* the engine linked now (ALREADY_CONNECTED: it was) */
  if (st == HIXL_ALREADY_CONNECTED) st = HIXL_SUCCESS;
  pthread_mutex_lock(&c->lock);
  kv_unreach_note(c, e->remote, st == HIXL_SUCCESS);
  if (anew) { /* restarted, maybe upgraded: RENEW and ACCEPT_W again */
    kv_idhash_del(&c->load.norenew, e->remote, NULL);
    kv_idhash_del(&c->push.noword, e->remote, NULL);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Tell the peer of e that its request ended (FREE, ABORT with reason), best effort;
 * a peer that could not be told is named in a warning.
 * When the link was lost (by the transfer, or under this call), link again and tell it
 * there: else the peer would hold the request until its lease ran out, and then cut
 * every link with this side, the new one and the transfers on it included. Not when the
 * last Link to that peer failed (a peer that is gone would cost a wait per request),
 * and linking within notify_timeout_ms at most. A call that timed out is not sent
 * again: it is on the link, served when the peer reads it. */
HixlStatus kv_tell(hixl_kv_connector *c, const struct kv_meta_entry *e, uint8_t op, const char *reason,
                   uint8_t *ans, size_t cap, size_t *n) {
  HixlStatus st;
  kv_call_ex(c, e->remote, op, e->rreq, &e->rcap, 0, reason, ans, cap, n, c->cfg.notify_timeout_ms, &st);
  pthread_mutex_lock(&c->lock);
  bool again = !c->shut && !kv_idhash_has(&c->unreach, e->remote);
  pthread_mutex_unlock(&c->lock);
  if ((st == HIXL_NOT_CONNECTED || st == HIXL_FAILED) && again) {
    int32_t t = c->cfg.notify_timeout_ms < c->cfg.connect_timeout_ms ? c->cfg.notify_timeout_ms
                                                                     : c->cfg.connect_timeout_ms;
    if (kv_link(c, e, t) == HIXL_SUCCESS)
      kv_call_ex(c, e->remote, op, e->rreq, &e->rcap, 0, reason, ans, cap, n, c->cfg.notify_timeout_ms, &st);
  }
  if (st != HIXL_SUCCESS)
    log_warn("hixl-kv: request %s: %s could not be told that it ended (%s): it keeps it until its lease runs "
             "out",
             e->req, e->remote, HixlStatusName(st));
  return st;
}

/* Two compatibility digests differ: PARAM_INVALID, why names both (and, when only the
 * world sizes differ, why they cannot map). */
HixlStatus kv_layout_mismatch(const char *peer_kind, const char *peer, const char *theirs, const char *mine,
                              const char *me, char *why, size_t cap) {
  char esc[4 * KV_LAYOUT_TEXT + 1]; /* theirs comes from the peer, and is logged: escaped */
  log_escape(esc, sizeof(esc), theirs, strlen(theirs));
  snprintf(why, cap, "layout mismatch: the %s %s has %s, this %s has %s; nothing was moved", peer_kind, peer,
           esc, me, mine);
  return HIXL_PARAM_INVALID;
}

HixlStatus kv_held_parse(hixl_kv_connector *c, struct kv_in *in, const char *peer_kind, const char *peer,
                         const char *req, struct kv_peer_held *h, char *why, size_t cap) {
  kv_get_str(in, h->layout, sizeof(h->layout) - 1);
  h->n = kv_get_u32(in);
  h->digest = kv_get_u64(in);
  bool ok = kv_get_groups(in, h->gn, &h->ngroups, h->n);
  bool producer = strcmp(peer_kind, "producer") == 0;
  const char *me = producer ? "consumer" : "producer";
  size_t core = kv_layout_core_len(c->lay.text);
  h->world = kv_layout_world(h->layout);
  char tp[320];
  if (ok && !in->bad &&
      (kv_layout_core_len(h->layout) != core || strncmp(h->layout, c->lay.text, core) != 0 ||
       h->world == 0)) {
    /* Another world size with a layout whose heads cannot be cut: that is why. */
    if (h->world && h->world != c->world &&
        !kv_tp_check(&c->lay, producer ? h->world : c->world, producer ? c->world : h->world, tp,
                     sizeof(tp))) {
      snprintf(why, cap,
               "the %s %s (%u ranks) and this %s (%u ranks) cannot hand request %s over: %s; nothing "
               "was moved",
               peer_kind, peer, h->world, me, c->world, req, tp);
      return HIXL_PARAM_INVALID;
    }
    return kv_layout_mismatch(peer_kind, peer, h->layout, c->lay.text, me, why, cap);
  }
  if (ok && !in->bad &&
      !kv_tp_check(&c->lay, producer ? h->world : c->world, producer ? c->world : h->world, tp, sizeof(tp))) {
    snprintf(why, cap,
             "the %s %s (%u ranks) and this %s (%u ranks) cannot hand request %s over: %s; nothing "
             "was moved",
             peer_kind, peer, h->world, me, c->world, req, tp);
    return HIXL_PARAM_INVALID;
  }
  if (!ok || in->bad || h->ngroups != c->lay.ng || !kv_layout_get_planes(in, &c->lay, h->world, &h->r) ||
      in->off != in->len) {
    free(h->r.planes);
    h->r.planes = NULL;
    snprintf(why, cap, "the %s %s gave a malformed answer for request %s", peer_kind, peer, req);
    return HIXL_FAILED;
  }
  return HIXL_SUCCESS;
}
