/* kv_service: the KV service a worker answers (engine CALL frames, service
 * HIXL_SERVICE_KV, on the engine's progress thread): as a pull producer, PIN and FREE
 * of the requests it holds for consumers, with their leases; as a push consumer,
 * ACCEPT, the landed LAYER(S) notices and ABORT of the pushes it expects. Every call
 * presents the capability of its request (kv_cap.c), or is refused and counted
 * (cap_refused): reaching the engine's port is not enough to act on a request. */
#include <inttypes.h>
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"

/* What a PIN of a request hears when its consumer's FREE came before its hold (an
 * abort: the hold is then never made), and when its id ended here before its hold came
 * (a reused id: refused). Constants: kv_held_bind tells the first from an ending by its
 * address. */
static const char freed_early[] = "its consumer freed it before it was held here (an abort)";
static const char reused[] =
    "refused: its request id was used here by a request that ended lately (request ids must be unique per "
    "run)";
/* What an ACCEPT of an expected push that handle_preemptions ended hears: the host
 * allocates the same request again, expected anew (kv_expect_bind tells it from a
 * reused id by its address). */
static const char preempted[] = "its consumer preempted it (handle_preemptions)";

struct kv_held *kv_held_find(hixl_kv_connector *c, const char *id) {
  void *h;
  return kv_idhash_get(&c->hold.held, id, &h) ? h : NULL;
}

void kv_held_free(void *p) {
  struct kv_held *h = p;
  kv_peers_free(&h->peers);
  free(h->blocks);
  free(h);
}

/* Out of the set, reported finished-sending, freed. Lock held. */
static void held_release(hixl_kv_connector *c, struct kv_held *h) {
  kv_idhash_del(&c->hold.held, h->id, NULL);
  c->stats.blocks_held -= h->n;
  c->stats.requests_held--;
  kv_peers_revoke(c, &h->peers);
  kv_finished_add(c, &c->sending_done, h->id);
  kv_gone_add(c, h->id);
  kv_held_free(h);
}

/* A hold refused at max_inflight_requests: nothing is held; the host hears it finished
 * (frees its blocks), its consumer's PIN hears GONE and why. Lock held. */
static void held_refuse(hixl_kv_connector *c, const char *id) {
  if (!c->hold.full_why[0])
    snprintf(c->hold.full_why, sizeof(c->hold.full_why),
             "refused: the producer's worker held max_inflight_requests (%u) requests already",
             c->cfg.max_inflight);
  if (c->hold.refused++ == 0)
    log_warn("hixl-kv: this worker holds %zu requests for consumers, its bound (max_inflight_requests %u): "
             "request %s and later ones beyond it are not held; their blocks are reported free at once and "
             "their consumers' PIN answers GONE (they recompute or fail them). A scheduler that restarted "
             "while its predecessor's holds were still leased does this; raise max_inflight_requests to "
             "hold more (the first such refusal)",
             c->hold.held.n, c->cfg.max_inflight, id);
  kv_obs_count(c, KV_CAUSE_REFUSED);
  kv_finished_add(c, &c->sending_done, id);
  kv_gone_add_why(c, id, c->hold.full_why);
}

/* A HOLD's or EXPECT's first block past its group's blocks (a PIN or ACCEPT grants the
 * blocks' memory, so an id past them would grant memory beyond the caches: another
 * request's blocks), said into why; or none to check against (no caches registered yet,
 * or groups past theirs); false when every block is inside. */
static bool blocks_past(const hixl_kv_connector *c, const struct kv_meta_entry *e, char *why, size_t cap) {
  size_t k = 0;
  if (c->lay.ng == 0 || e->ngroups > c->lay.ng) {
    snprintf(why, cap, "refused: %u groups of blocks, and %u of KV caches registered", e->ngroups, c->lay.ng);
    return true;
  }
  for (uint32_t g = 0; g < e->ngroups; g++)
    for (uint32_t j = 0; j < e->gn[g]; j++, k++)
      if (e->blocks[k] >= c->lay.g[g].num_blocks) {
        snprintf(why, cap, "refused: group %u's block %" PRIu64 " is past its %" PRIu64 " blocks", g,
                 e->blocks[k], c->lay.g[g].num_blocks);
        return true;
      }
  return false;
}

hixl_kv_status kv_held_bind(hixl_kv_connector *c, struct kv_meta_entry *e) {
  char why[160];
  void *ended = NULL;
  if (kv_held_find(c, e->req)) { /* another scheduler's (one restarted, or two on one worker) */
    if (c->hold.again++ == 0)
      log_warn("hixl-kv: request %s is held here already, and a scheduler handed over a hold of it again "
               "(hold %" PRIu64 " of epoch %" PRIu64 "): a scheduler that restarted while its predecessor's "
               "holds were leased, or two schedulers sharing this worker, does this. The second is not "
               "held: its consumer's PIN is refused (a wrong capability), and its blocks are reported free "
               "when the first hold ends, within its lease (the first such hold)",
               e->req, e->seq, e->epoch);
    kv_obs_count(c, KV_CAUSE_REFUSED);
    return HIXL_KV_SUCCESS;
  }
  if (kv_idhash_get(&c->gone, e->req, &ended)) { /* freed already (an abort), or a reused id */
    if (ended != freed_early) {                  /* not held: the host frees it, its consumer hears why */
      if (c->hold.reused++ == 0)
        log_warn("hixl-kv: request %s was held here by a request that ended lately: a request id must be "
                 "unique per run; it is not held, its blocks are reported free at once and its consumer's "
                 "PIN answers GONE saying so (the first such refusal)",
                 e->req);
      kv_obs_count(c, KV_CAUSE_REFUSED);
      kv_gone_add_why(c, e->req, reused);
    }
    kv_finished_add(c, &c->sending_done, e->req);
    return HIXL_KV_SUCCESS;
  }
  if (blocks_past(c, e, why, sizeof(why))) { /* not held: the host frees it, its consumer hears GONE */
    kv_finished_add(c, &c->sending_done, e->req);
    kv_gone_add_why(c, e->req, "refused: a block id past its group's blocks"); /* kept: a constant */
    return kv_fail(HIXL_KV_PARAM_INVALID, "bind_connector_meta: request %s: %s", e->req, why);
  }
  if (c->hold.held.n >= c->cfg.max_inflight) {
    held_refuse(c, e->req);
    return HIXL_KV_SUCCESS;
  }
  struct kv_held *h = KV_ALLOC(KV_TEST_BIND, calloc(1, sizeof(*h)));
  if (h) snprintf(h->id, sizeof(h->id), "%s", e->req);
  if (!h || kv_idhash_add(&c->hold.held, h->id, h, SIZE_MAX, NULL) < 0) { /* not held: as one refused */
    free(h);
    kv_obs_count(c, KV_CAUSE_OTHER);
    kv_finished_add(c, &c->sending_done, e->req);
    kv_gone_add_why(c, e->req, "refused: its producer was out of memory"); /* kept: a constant */
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "bind_connector_meta: request %s: out of memory", e->req);
  }
  kv_cap_make(c->cap_key, h->id, &h->cap); /* what its consumer's calls present */
  h->blocks = e->blocks;
  h->n = e->nblocks;
  h->ngroups = e->ngroups;
  memcpy(h->gn, e->gn, sizeof(h->gn));
  e->blocks = NULL;
  h->expires_ns = kv_now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull; /* the newest: its lease ends last */
  kv_obs_phase(c, h->id, KV_PH_BOUND, NULL);
  c->stats.blocks_held += h->n;
  c->stats.requests_held++;
  return HIXL_KV_SUCCESS;
}

/* Free held requests whose lease ran out, oldest lease first: O(1) when none has. A
 * consumer that pinned one may still be reading its blocks: its links are cut before
 * the host hears that the blocks are free (drop_peers, in get_finished), so no answer
 * of this engine reads them after the host reuses them. Lock held. */
void kv_leases_expire(hixl_kv_connector *c) {
  uint64_t now = kv_now_ns();
  struct kv_held *h;
  while (c->hold.held.oldest && now >= (h = kv_idnode_val(c->hold.held.oldest))->expires_ns) {
    c->stats.lease_expired++;
    kv_obs_failed(c, h->id, KV_CAUSE_LEASE, "its lease expired before a consumer freed it");
    kv_peers_drop(c, &h->peers);
    held_release(c, h);
  }
}

/* ---- push mode: what a consumer worker expects ---- */

struct kv_expect *kv_expect_find(hixl_kv_connector *c, const char *id) {
  void *x;
  return kv_idhash_get(&c->exp.expects, id, &x) ? x : NULL;
}

void kv_expect_free(void *p) {
  struct kv_expect *x = p;
  kv_peers_free(&x->peers);
  free(x->blocks);
  free(x->landed);
  free(x);
}

/* An expected push refused at max_inflight_requests: its load fails now (its blocks
 * reported with the load errors), its producer's ACCEPT hears GONE and why. Lock held. */
static void expect_refuse(hixl_kv_connector *c, const struct kv_meta_entry *e) {
  if (!c->exp.full_why[0])
    snprintf(c->exp.full_why, sizeof(c->exp.full_why),
             "refused: the consumer's worker expected max_inflight_requests (%u) pushes already",
             c->cfg.max_inflight);
  if (c->exp.refused++ == 0)
    log_warn("hixl-kv: this worker expects %zu pushes, its bound (max_inflight_requests %u): request %s and "
             "later ones beyond it fail to load at once (their blocks are reported with the load errors, "
             "load_failure_policy decides) and their producers' ACCEPT answers GONE; raise "
             "max_inflight_requests to expect more (the first such refusal)",
             c->exp.expects.n, c->cfg.max_inflight, e->req);
  kv_recv_refused(c, e, KV_CAUSE_REFUSED);
  kv_gone_add_why(c, e->req, c->exp.full_why);
}

hixl_kv_status kv_expect_bind(hixl_kv_connector *c, struct kv_meta_entry *e, uint64_t now) {
  char why[160];
  void *ended = NULL;
  if (kv_expect_find(c, e->req)) return HIXL_KV_SUCCESS;
  if (kv_idhash_get(&c->gone, e->req, &ended) && ended != preempted) { /* a reused id, as kv_held_bind */
    if (c->exp.reused++ == 0)
      log_warn("hixl-kv: request %s was expected here by a request that ended lately: a request id must be "
               "unique per run; it is not expected, its load fails at once (its blocks are reported with "
               "the load errors) and its producer's ACCEPT answers GONE saying so (the first such refusal)",
               e->req);
    kv_recv_refused(c, e, KV_CAUSE_REFUSED);
    kv_gone_add_why(c, e->req, reused);
    return HIXL_KV_SUCCESS;
  }
  if (blocks_past(c, e, why, sizeof(why))) { /* its load fails now; its producer hears GONE */
    kv_recv_refused(c, e, KV_CAUSE_REFUSED);
    kv_gone_add_why(c, e->req, "refused: a block id past its group's blocks"); /* kept: a constant */
    return kv_fail(HIXL_KV_PARAM_INVALID, "bind_connector_meta: request %s: %s", e->req, why);
  }
  if (c->exp.expects.n >= c->cfg.max_inflight) {
    expect_refuse(c, e);
    return HIXL_KV_SUCCESS;
  }
  struct kv_expect *x = KV_ALLOC(KV_TEST_BIND, calloc(1, sizeof(*x)));
  uint64_t *landed = calloc(c->layers, sizeof(*landed));
  if (!x || !landed) goto free_both;
  snprintf(x->id, sizeof(x->id), "%s", e->req);
  if (kv_idhash_add(&c->exp.expects, x->id, x, SIZE_MAX, NULL) < 0) goto free_both;
  kv_cap_make(c->cap_key, x->id, &x->cap); /* what its producer's calls present */
  x->blocks = e->blocks;
  x->n = e->nblocks;
  x->ngroups = e->ngroups;
  memcpy(x->gn, e->gn, sizeof(x->gn));
  e->blocks = NULL;
  x->landed = landed;
  x->step = c->step;
  x->deadline_ns = now + (uint64_t)c->cfg.lease_ms * 1000000ull; /* the newest: its deadline comes last */
  kv_obs_phase(c, x->id, KV_PH_BOUND, NULL);
  return HIXL_KV_SUCCESS;
free_both: /* not expected: its load fails now, as one refused, and its producer hears GONE */
  free(x);
  free(landed);
  kv_recv_refused(c, e, KV_CAUSE_OTHER);
  kv_gone_add_why(c, e->req, "refused: its consumer was out of memory"); /* kept: a constant */
  return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "bind_connector_meta: request %s: out of memory", e->req);
}

/* x ends: landed whole (why NULL) or failed; an ACCEPT of it then hears GONE and
 * gone_why (NULL: the caller's words). Lock held. */
static void expect_end(hixl_kv_connector *c, struct kv_expect *x, const char *why, const char *gone_why) {
  kv_idhash_del(&c->exp.expects, x->id, NULL);
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
  kv_word_give(c, x);
  kv_finished_add(c, &c->recving_done, x->id);
  kv_gone_add_why(c, x->id, gone_why);
  kv_expect_free(x);
  pthread_cond_broadcast(&c->exp.landed);
}

void kv_expect_end(hixl_kv_connector *c, struct kv_expect *x, const char *why) {
  expect_end(c, x, why, NULL);
}

void kv_expect_preempt(hixl_kv_connector *c, struct kv_expect *x) {
  kv_peers_drop(c, &x->peers);
  expect_end(c, x, "preempted (handle_preemptions)", preempted);
}

/* Expected pushes that no producer finished within the lease fail, oldest deadline
 * first: O(1) when none has. Lock held. */
void kv_expects_expire(hixl_kv_connector *c) {
  uint64_t now = kv_now_ns();
  struct kv_expect *x;
  while (c->exp.expects.oldest && now >= (x = kv_idnode_val(c->exp.expects.oldest))->deadline_ns) {
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
  case KV_SVC_ACCEPT_W: return "ACCEPT_W";
  case KV_SVC_LAYER: return "LAYER";
  case KV_SVC_ABORT: return "ABORT";
  case KV_SVC_LAYERS: return "LAYERS";
  case KV_SVC_RELEASE: return "RELEASE";
  case KV_SVC_RENEW: return "RENEW";
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

/* A KV service request, parsed whole (svc_parse). */
struct svc_req {
  uint8_t proto, op;
  char id[KV_MAX_ID + 1];
  char reason[KV_MAX_ID + 1];       /* ABORT: why */
  struct kv_cap cap;                /* what it presents */
  uint32_t world, rank;             /* the caller's (kv_tp.c) */
  uint32_t layer, count;            /* LAYER(S): which layers landed */
  uint64_t epoch, seq;              /* PIN, RELEASE: which hold (a consumer given hold_epoch and hold_seq) */
  uint32_t png, pgn[KV_MAX_GROUPS]; /* ACCEPT: the blocks per group the producer writes */
};

enum svc_parsed {
  SVC_OK,
  SVC_OLD,     /* protocol 3, before capabilities: proto, op and id only */
  SVC_UNKNOWN, /* an operation this worker does not know (a newer peer's), whatever follows its id */
  SVC_BAD,     /* malformed */
};

static enum svc_parsed svc_parse(const uint8_t *req, size_t len, struct svc_req *r) {
  struct kv_in in = {req, len, 0, false};
  memset(r, 0, sizeof(*r));
  r->proto = kv_get_u8(&in);
  r->op = kv_get_u8(&in);
  kv_get_str(&in, r->id, KV_MAX_ID);
  if (!in.bad && r->proto == KV_SVC_PROTO_NOCAP && r->op >= KV_SVC_PIN && r->op <= KV_SVC_OP_LAST)
    return SVC_OLD; /* a call that carries no capability, whatever follows */
  if (!in.bad && r->proto == KV_SVC_PROTO && (r->op < KV_SVC_PIN || r->op > KV_SVC_OP_LAST))
    return SVC_UNKNOWN; /* its fields are not known here: not read, and not called malformed */
  kv_get_cap(&in, &r->cap);
  r->world = kv_get_u32(&in);
  r->rank = kv_get_u32(&in);
  r->layer = r->op == KV_SVC_LAYER || r->op == KV_SVC_LAYERS ? kv_get_u32(&in) : 0;
  r->count = r->op == KV_SVC_LAYERS ? kv_get_u32(&in) : 1;
  if (r->op == KV_SVC_ABORT) kv_get_str(&in, r->reason, KV_MAX_ID);
  if ((r->op == KV_SVC_PIN || r->op == KV_SVC_RELEASE || r->op == KV_SVC_RENEW) && in.off < len) {
    r->epoch = kv_get_u64(&in);
    r->seq = kv_get_u64(&in);
  }
  if ((r->op == KV_SVC_ACCEPT || r->op == KV_SVC_ACCEPT_W) && in.off < len) {
    r->png = kv_get_u8(&in);
    if (r->png > KV_MAX_GROUPS) in.bad = true;
    for (uint32_t g = 0; g < r->png && !in.bad; g++) r->pgn[g] = kv_get_u32(&in);
  }
  bool bad = in.bad || in.off != len || r->proto != KV_SVC_PROTO ||
             (r->op == KV_SVC_LAYERS && r->count < 2) || r->world == 0 || r->world > KV_TP_MAX ||
             r->rank >= r->world;
  return bad ? SVC_BAD : SVC_OK;
}

/* The answer GONE, and why. */
static void put_gone(struct kv_out *out, const char *why) {
  kv_put_u8(out, KV_PIN_GONE);
  kv_put_str(out, why, strlen(why));
}

/* Whether id ended lately ("gone"): why, its ending's own words when it has them (a
 * refusal), else the caller's. Lock held. */
static bool gone_why(const hixl_kv_connector *c, const char *id, const char **why) {
  void *v;
  if (!kv_idhash_get(&c->gone, id, &v)) return false;
  if (v) *why = v;
  return true;
}

/* Each operation, the capability checked: its answer into out, or a status; *tp_why
 * when the caller is a rank that has no part in it (refused). Lock held. */

/* ACCEPT of an expected push (x): the producer rank is granted its blocks; an
 * ACCEPT_W is given its row of landed bytes too (kv_word.c). */
static HixlStatus serve_accept(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                               struct kv_expect *x, struct kv_out *out, const char **tp_why) {
  HixlStatus st = HIXL_SUCCESS;
  if (!x) {
    const char *why = "it already ended (loaded, failed or expired)";
    if (gone_why(c, r->id, &why))
      put_gone(out, why);
    else
      kv_put_u8(out, KV_PIN_NOT_YET);
    return st;
  }
  if (x->ptp == 0) { /* the first producer rank: which ranks write into it */
    x->ptp = r->world;
    x->want = c->lay.ng ? kv_tp_sources(&c->lay, r->world, c->world, c->rank) : 0;
  }
  if (x->ptp != r->world)
    *tp_why = "another producer rank of it runs another world size";
  else if (x->want && !(x->want >> r->rank & 1))
    *tp_why = "that producer rank writes nothing into this rank (kv_tp.c)";
  else if (peers_room(c, &x->peers, peer, tp_why)) {
    if (!kv_peers_grant(c, &x->peers, peer, x->blocks, x->gn, x->ngroups))
      st = HIXL_RESOURCE_EXHAUSTED;
    else
      kv_obs_phase(c, r->id, KV_PH_PINNED, peer);
  }
  for (uint32_t g = 0; !*tp_why && st == HIXL_SUCCESS && g < x->ngroups; g++) /* what lands: at most what */
    x->pgn[g] = r->png == x->ngroups && r->pgn[g] < x->gn[g] ? r->pgn[g] : x->gn[g]; /* each group expects */
  held_answer(c, out, x->blocks, x->n, x->gn, x->ngroups);
  if (r->op == KV_SVC_ACCEPT_W) { /* none to a rank refused (tp_why): the answer is a refusal then */
    uint64_t had = x->wranks, at = !*tp_why && st == HIXL_SUCCESS ? kv_word_take(c, x, r->rank) : 0;
    if (x->wranks != had) pthread_cond_broadcast(&c->exp.landed); /* a forward pass waiting polls now */
    kv_put_u64(out, at);
    kv_put_u8(out, at ? x->mark[r->rank] : 0);
  }
  return st;
}

/* LAYER(S): layers of x landed from that producer rank; the forward pass wakes once per
 * call, and only when one of them is new. */
static HixlStatus serve_layers(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                               struct kv_expect *x, const char **tp_why) {
  uint64_t bit = UINT64_C(1) << r->rank;
  if (x && (x->ptp != r->world || !(x->want & bit))) {
    *tp_why = "that producer rank did not accept it here";
    return HIXL_SUCCESS;
  }
  if (!x || r->layer >= c->layers || r->count > c->layers - r->layer)
    return x ? HIXL_PARAM_INVALID : HIXL_NOT_FOUND;
  bool woke = false;
  kv_obs_layer(c, r->id, r->layer, r->count);
  for (uint32_t l = r->layer; l < r->layer + r->count && x; l++)
    if (!(x->landed[l] & bit)) {
      x->landed[l] |= bit;
      woke = true;
      if (x->landed[l] == x->want && ++x->nlanded == c->layers) kv_expect_end(c, x, NULL), x = NULL;
    }
  bool all = woke && x; /* every layer of that rank landed: its writes are over */
  for (uint32_t l = 0; l < c->layers && all; l++) all = (x->landed[l] & bit) != 0;
  if (all) kv_peers_done(c, &x->peers, peer);
  if (woke) pthread_cond_broadcast(&c->exp.landed); /* the forward pass only */
  return HIXL_SUCCESS;
}

/* ABORT: the producer gave up on x. */
static HixlStatus serve_abort(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                              struct kv_expect *x) {
  if (x) {
    /* The other producer ranks that accepted it may still be writing: cut off before the
     * host hears of the failure and reuses the blocks, as when it expires (drop_peers). */
    for (uint32_t i = 0; i < x->peers.n; i++)
      if (strcmp(x->peers.v[i].name, peer) != 0 && !x->peers.v[i].done &&
          !kv_idhash_has(&c->drop, x->peers.v[i].name))
        kv_idhash_add(&c->drop, x->peers.v[i].name, NULL, SIZE_MAX, NULL);
    char
        esc[KV_MAX_ID + 1]; /* the peer's text, logged: escaped (docs/security.md, "Logs"), cut at its size */
    char why[sizeof(esc) + 96];
    log_escape(esc, sizeof(esc), r->reason, strlen(r->reason));
    snprintf(why, sizeof(why), "the producer %s gave up: %s", peer, esc);
    kv_expect_end(c, x, why);
  }
  return HIXL_SUCCESS;
}

/* Whether r names a hold of this scheduler that was bound here (or would have been):
 * no later step brings it. */
static bool hold_bound(const hixl_kv_connector *c, const struct svc_req *r) {
  return r->seq && r->epoch == c->hold.epoch && r->seq <= c->hold.bound_seq;
}

/* What a PIN or RENEW of a request not held here hears: GONE and why (it ended here,
 * or this worker bound every hold up to its number), else "not yet". Lock held. */
static void not_held(const hixl_kv_connector *c, const struct svc_req *r, struct kv_out *out) {
  const char *why = "it was freed, its lease expired, or it was aborted";
  if (gone_why(c, r->id, &why))
    put_gone(out, why);
  else if (hold_bound(c, r))
    put_gone(out, "it was never held here (this worker bound every hold up to its number), or was freed "
                  "long ago");
  else
    kv_put_u8(out, KV_PIN_NOT_YET);
}

/* Held h's lease runs again from now: it ends last. Lock held. */
static void lease_again(hixl_kv_connector *c, struct kv_held *h) {
  h->expires_ns = kv_now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull;
  kv_idhash_touch(&c->hold.held, h->id);
}

/* PIN of held h: the lease runs again, the consumer rank is granted its blocks. */
static HixlStatus serve_pin(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                            struct kv_held *h, struct kv_out *out, const char **tp_why) {
  if (h) {
    if ((*tp_why = held_rank(c, h, r->world)) || !peers_room(c, &h->peers, peer, tp_why)) return HIXL_SUCCESS;
    lease_again(c, h);
    kv_obs_phase(c, r->id, KV_PH_PINNED, peer);
    HixlStatus st = HIXL_SUCCESS;
    if (!kv_peers_grant(c, &h->peers, peer, h->blocks, h->gn, h->ngroups)) st = HIXL_RESOURCE_EXHAUSTED;
    held_answer(c, out, h->blocks, h->n, h->gn, h->ngroups);
    return st;
  }
  not_held(c, r, out);
  return HIXL_SUCCESS;
}

/* RENEW: a consumer whose request waits to be scheduled keeps it held here: the lease
 * runs again, as a PIN's does, but nothing is granted and no consumer is recorded (the
 * load's PIN does both); not held: as a PIN's answer. */
static HixlStatus serve_renew(hixl_kv_connector *c, const struct svc_req *r, struct kv_held *h,
                              struct kv_out *out, const char **tp_why) {
  if (h) {
    if ((*tp_why = held_rank(c, h, r->world))) return HIXL_SUCCESS;
    lease_again(c, h);
    c->hold.renewed++;
    kv_put_u8(out, KV_PIN_HELD);
    return HIXL_SUCCESS;
  }
  not_held(c, r, out);
  return HIXL_SUCCESS;
}

/* RELEASE: a consumer rank that reads nothing of this rank's copy lets go of it: as
 * FREE when held; else "not yet", nothing remembered (the hold may still come), or
 * gone. */
static HixlStatus serve_release(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                                struct kv_held *h, struct kv_out *out, const char **tp_why) {
  const char *why = "it is no longer held here";
  if (h) {
    if ((*tp_why = held_rank(c, h, r->world))) return HIXL_SUCCESS;
    h->freed |= UINT64_C(1) << r->rank;
    kv_peers_done(c, &h->peers, peer);
    kv_obs_phase(c, r->id, KV_PH_FREE, peer);
    kv_put_u8(out, KV_PIN_HELD);
    if ((h->freed & h->need) == h->need) held_release(c, h);
  } else if (gone_why(c, r->id, &why) || hold_bound(c, r)) {
    put_gone(out, why);
  } else {
    kv_put_u8(out, KV_PIN_NOT_YET);
  }
  return HIXL_SUCCESS;
}

/* FREE: one not bound yet (an abort), its capability checked: never hold it. One held:
 * freed once every consumer rank that frees it here did (kv_tp_touchers). */
static HixlStatus serve_free(hixl_kv_connector *c, const char *peer, const struct svc_req *r,
                             struct kv_held *h, const char **tp_why) {
  if (h && !(*tp_why = held_rank(c, h, r->world))) {
    h->freed |= UINT64_C(1) << r->rank;
    kv_peers_done(c, &h->peers, peer); /* its reads are over: the lease cuts only the others */
    kv_obs_phase(c, r->id, KV_PH_FREE, peer);
    if ((h->freed & h->need) == h->need) held_release(c, h);
  } else if (!h && !kv_idhash_has(&c->gone, r->id)) {
    kv_gone_add_why(c, r->id, freed_early);
  }
  return HIXL_SUCCESS;
}

/* An answer that is a message (a refusal or an error), cut to cap. */
static HixlStatus refuse(HixlStatus st, uint8_t *resp, size_t cap, size_t *resp_len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static HixlStatus refuse(HixlStatus st, uint8_t *resp, size_t cap, size_t *resp_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf((char *)resp, cap, fmt, ap);
  va_end(ap);
  *resp_len = n < 0 ? 0 : (size_t)n;
  if (*resp_len >= cap) *resp_len = cap ? cap - 1 : 0;
  return st;
}

HixlStatus kv_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                    size_t *resp_len) {
  hixl_kv_connector *c = ctx;
  if (strnlen(peer, KV_PEER_NAME_MAX + 1) > KV_PEER_NAME_MAX)
    /* Grants are made and revoked by the caller's whole name: one this worker could not
     * keep whole is refused, never cut (a cut name's grant would never be revoked). */
    return refuse(
        HIXL_PARAM_INVALID, resp, cap, resp_len,
        "refused: a KV service call from a peer whose name (%.64s...) is longer than the %u bytes a "
        "worker keeps of one; nothing was done",
        peer, KV_PEER_NAME_MAX);
  struct svc_req r;
  enum svc_parsed parsed = svc_parse(req, len, &r);
  HixlStatus st = HIXL_SUCCESS;
  if (parsed == SVC_OLD) {
    pthread_mutex_lock(&c->lock);
    st = cap_refuse(c, r.op, r.id, peer, CAP_OLD, resp, cap, resp_len);
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  if (parsed == SVC_UNKNOWN) /* the status a newer caller falls back on, not this text */
    return refuse(HIXL_UNSUPPORTED, resp, cap, resp_len,
                  "unsupported: KV service operation %u from %s is not known to this worker (its plugin is "
                  "older); nothing was done",
                  r.op, peer);
  if (parsed == SVC_BAD)
    return refuse(HIXL_PARAM_INVALID, resp, cap, resp_len, "malformed KV service request from %s%s", peer,
                  r.proto == 4 ? " (KV service protocol 4, before tensor parallelism: update its plugin)"
                               : "");
  struct kv_out out = {0};
  pthread_mutex_lock(&c->lock);
  kv_leases_expire(c);
  kv_expects_expire(c);
  bool held_op = r.op == KV_SVC_PIN || r.op == KV_SVC_FREE || r.op == KV_SVC_RELEASE || r.op == KV_SVC_RENEW;
  struct kv_held *h = held_op ? kv_held_find(c, r.id) : NULL;
  struct kv_expect *x = held_op ? NULL : kv_expect_find(c, r.id);
  enum cap_verdict v = CAP_OK;
  if (r.op >= KV_SVC_PIN && r.op <= KV_SVC_OP_LAST)
    v = cap_check(c, r.id, held_op ? (h ? &h->cap : NULL) : (x ? &x->cap : NULL), &r.cap);
  /* Unchecked (nothing bound yet here) is refused only where it would change
   * something: a FREE would be remembered. PIN and ACCEPT answer "not yet", LAYER
   * "not expected", ABORT does nothing, as for any id this worker does not know. */
  if (v == CAP_NONE || v == CAP_WRONG || (v == CAP_UNCHECKED && r.op == KV_SVC_FREE)) {
    st = cap_refuse(c, r.op, r.id, peer, v, resp, cap, resp_len);
    pthread_mutex_unlock(&c->lock);
    kv_revoke_flush(c); /* what the expiries above let go */
    return st;
  }
  const char *tp_why = NULL; /* a call from a rank of another world size, or one that has no part in it */
  switch (r.op) {
  case KV_SVC_PIN: st = serve_pin(c, peer, &r, h, &out, &tp_why); break;
  case KV_SVC_FREE: st = serve_free(c, peer, &r, h, &tp_why); break;
  case KV_SVC_RELEASE: st = serve_release(c, peer, &r, h, &out, &tp_why); break;
  case KV_SVC_RENEW: st = serve_renew(c, &r, h, &out, &tp_why); break;
  case KV_SVC_ACCEPT:
  case KV_SVC_ACCEPT_W: st = serve_accept(c, peer, &r, x, &out, &tp_why); break;
  case KV_SVC_LAYER:
  case KV_SVC_LAYERS: st = serve_layers(c, peer, &r, x, &tp_why); break;
  case KV_SVC_ABORT: st = serve_abort(c, peer, &r, x); break;
  default: st = HIXL_UNSUPPORTED; break;
  }
  /* A LAYER that woke the forward pass (wait_for_layer_load) lets it run before this
   * thread revokes what the push's end let go (~0.25 ms at 1024 tokens): where the two
   * share a CPU, the forward pass otherwise waited for the revoke. */
  bool yield = (r.op == KV_SVC_LAYER || r.op == KV_SVC_LAYERS) && c->revq;
  pthread_mutex_unlock(&c->lock);
  if (yield) sched_yield();
  kv_revoke_flush(c); /* what the expiries, a FREE or an end let go */
  if (tp_why && st == HIXL_SUCCESS)
    st = refuse(HIXL_PARAM_INVALID, resp, cap, resp_len,
                "refused: %s of request %s from %s (rank %u of %u): %s", op_name(r.op), r.id, peer, r.rank,
                r.world, tp_why);
  else if (st != HIXL_SUCCESS)
    refuse(st, resp, cap, resp_len, "%s: KV service operation %u for request %s",
           st == HIXL_NOT_FOUND            ? "not expected here"
           : st == HIXL_PARAM_INVALID      ? "layers out of range"
           : st == HIXL_RESOURCE_EXHAUSTED ? "out of memory"
                                           : "unknown",
           r.op, r.id);
  else if (out.bad || out.len > cap)
    st = refuse(HIXL_RESOURCE_EXHAUSTED, resp, cap, resp_len, "KV service answer for %s does not fit", r.id);
  else if ((*resp_len = out.len))
    memcpy(resp, out.p, out.len);
  free(out.p);
  return st;
}
