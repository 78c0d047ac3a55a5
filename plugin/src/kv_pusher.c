/* kv_pusher: a push producer worker's pusher thread: ACCEPT on the consumer, then
 * each layer as soon as the forward pass saved it, with a landed notice behind it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "kv_obs.h"
#include "util/log.h"
#include "util/thread.h"

/* Whether the consumer's block ids (e->rblocks, its push params': e->rgn[g] of group g,
 * one group after another) name, in every group, at least the blocks this producer
 * writes there (e->gn[g]), and add up to the list; why names the request, the group and
 * both counts when not. push_pairs takes group g's ids from its offset on: a group
 * short of them would take the next group's ids (another request's blocks) or read
 * past the end of the list. */
static bool push_counts_ok(const hixl_kv_connector *c, const struct kv_meta_entry *e, char *why, size_t cap) {
  size_t total = 0;
  if (e->ngroups != c->lay.ng) {
    snprintf(why, cap, "request %s has blocks in %u groups, this worker registered %u; nothing was written",
             e->req, e->ngroups, c->lay.ng);
    return false;
  }
  for (uint32_t g = 0; g < e->ngroups; g++) {
    if (e->rgn[g] < e->gn[g]) {
      snprintf(why, cap,
               "the consumer's push params name %u blocks in group %u of request %s, this producer writes %u "
               "there; nothing was written",
               e->rgn[g], g, e->req, e->gn[g]);
      return false;
    }
    total += e->rgn[g];
  }
  if (total != e->nrblocks) {
    snprintf(
        why, cap,
        "the consumer's push params for request %s list %zu blocks, their groups %zu; nothing was written",
        e->req, e->nrblocks, total);
    return false;
  }
  return true;
}

/* Push v's block pairs, per group: the producer's n blocks into the consumer's first n
 * (a sliding-window group: its last n, the window). Each group names at least n
 * (push_counts_ok, at the accept). */
static void push_pairs(const hixl_kv_connector *c, const struct kv_meta_entry *e, struct kv_pairs *pairs) {
  for (uint32_t g = 0, off = 0, roff = 0; g < e->ngroups; off += e->gn[g], roff += e->rgn[g], g++) {
    bool tail = c->lay.g[g].kind == HIXL_KV_GROUP_SLIDING_WINDOW && e->rgn[g] > e->gn[g];
    uint32_t skip = tail ? e->rgn[g] - e->gn[g] : 0;
    pairs[g] = (struct kv_pairs){e->blocks + off, e->rblocks + roff + skip, e->gn[g]};
  }
}

/* The parse of an ACCEPT answer alone, no I/O (kv_int.h): tests/fuzz/fuzz_kv_service.c
 * drives it. */
HixlStatus kv_accept_answer(hixl_kv_connector *c, const struct kv_meta_entry *e, const uint8_t *ans, size_t n,
                            struct kv_peer_held *h, char *why, size_t cap) {
  struct kv_in in = {ans, n, 0, false};
  uint8_t state = kv_get_u8(&in);
  if (state != KV_PIN_HELD) {
    char gone[257] = "", esc[97]; /* GONE: the consumer's reason, logged: escaped (cut at its size) */
    if (state == KV_PIN_GONE && !kv_get_str(&in, gone, sizeof(gone) - 1)) snprintf(gone, sizeof(gone), "?");
    log_escape(esc, sizeof(esc), gone, strlen(gone));
    snprintf(why, cap, "the consumer %s does not expect request %s (%s%s)", e->remote, e->rreq,
             state == KV_PIN_GONE      ? "it already ended: "
             : state == KV_PIN_NOT_YET ? "not within the transfer timeout"
                                       : "a malformed answer",
             esc);
    return state == KV_PIN_GONE ? HIXL_NOT_FOUND : state == KV_PIN_NOT_YET ? HIXL_TIMEOUT : HIXL_FAILED;
  }
  h->waddr = 0;
  h->wmark = 0;
  if (h->word) { /* an ACCEPT_W's answer ends with the landed bytes' address and mark */
    struct kv_in tail = {ans, n, n >= 9 ? n - 9 : 0, n < 10};
    h->waddr = kv_get_u64(&tail);
    h->wmark = kv_get_u8(&tail);
    if (tail.bad || (h->waddr != 0) != (h->wmark != 0)) {
      snprintf(why, cap, "the consumer %s gave a malformed answer for request %s", e->remote, e->rreq);
      return HIXL_FAILED;
    }
    in.len = n - 9;
  }
  HixlStatus st = kv_held_parse(c, &in, "consumer", e->remote, e->rreq, h, why, cap);
  if (st != HIXL_SUCCESS) return st;
  if (h->world != e->rtp) {
    snprintf(why, cap, "the consumer %s runs %u ranks, its push params said tp_size %u", e->remote, h->world,
             e->rtp);
    return HIXL_PARAM_INVALID;
  }
  bool fewer = e->ngroups != h->ngroups;
  for (uint32_t g = 0; g < e->ngroups && !fewer; g++) fewer = h->gn[g] < e->gn[g];
  if (fewer) {
    snprintf(why, cap, "the consumer %s expects %zu blocks of request %s, this producer has %zu", e->remote,
             h->n, e->rreq, e->nblocks);
    return HIXL_PARAM_INVALID;
  }
  if (h->n == e->nrblocks && h->digest != kv_groups_digest(e->rblocks, e->nrblocks, e->rgn, e->ngroups)) {
    snprintf(why, cap, "the consumer %s expects request %s in other blocks than its push params named",
             e->remote, e->rreq);
    return HIXL_PARAM_INVALID;
  }
  return push_counts_ok(c, e, why, cap) ? HIXL_SUCCESS : HIXL_PARAM_INVALID;
}

/* Accept on the consumer: it expects the request, with the same layout, into at
 * least as many blocks per group, and its push params name as many (push_counts_ok);
 * its planes go to p->r. */
static HixlStatus push_accept(hixl_kv_connector *c, struct kv_push *p, char *why, size_t cap) {
  struct kv_meta_entry *e = &p->e; /* linked already (link_all) */
  uint64_t deadline = kv_now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = HIXL_RESOURCE_EXHAUSTED;
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  struct kv_peer_held *h = calloc(1, sizeof(*h));
  size_t n = 0;
  uint64_t t_accept = kv_obs_phase(c, e->req, KV_PH_PIN, e->remote);
  if (!ans || !h) {
    snprintf(why, cap, "out of memory");
    goto out;
  }
  /* Over shm, ACCEPT_W: the layers' landed bytes too (kv_word.c). A consumer older than
   * them refuses it as malformed: ACCEPT then, and for its next pushes until it is
   * linked anew (restarted, perhaps upgraded), not a refused round trip each. */
  h->word = !kv_peer_older(c, &c->push.noword, e->remote) && kv_word_wanted(c, e->remote);
  for (;;) {
    struct kv_out msg = {0};
    kv_msg(c, &msg, h->word ? KV_SVC_ACCEPT_W : KV_SVC_ACCEPT, e->rreq, &e->rcap, 0, "");
    kv_put_groups(&msg, e->gn, e->ngroups); /* what it writes per group: the consumer's bytes_loaded */
    st = kv_call_settled(c, e->remote, &msg, deadline, ans, HIXL_CALL_MAX, &n, false);
    /* Only an older consumer's refusal of the op itself: any other refusal (a wrong
     * capability, a rank refused) would be ACCEPT's too, and counted twice there. */
    if (!h->word || !kv_op_unknown(st)) break;
    h->word = false;
    kv_peer_older_note(c, &c->push.noword, e->remote);
  }
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "asking the consumer %s for request %s: %s", e->remote, e->rreq,
             HixlGetLastErrorMessage());
    goto out;
  }
  if ((st = kv_accept_answer(c, e, ans, n, h, why, cap)) == HIXL_SUCCESS) {
    p->r = h->r; /* its planes: this push's */
    h->r.planes = NULL;
    p->waddr = h->waddr;
    p->wmark = h->wmark;
    /* Its block pairs as runs and the heads it moves, once: each layer's ops come
     * from them (a layer's pairs were sorted and checked again per layer). */
    struct kv_pairs pairs[KV_MAX_GROUPS];
    push_pairs(c, e, pairs);
    kv_push_heads(c, p, p->hs);
    if ((st = kv_runs_build(&p->runs, &c->lay, &p->r, pairs, why, cap)) == HIXL_SUCCESS)
      kv_obs_span(c, e->req, KV_PH_PINNED, KV_H_PIN, t_accept);
  }
out:
  if (h) free(h->r.planes);
  free(h);
  free(ans);
  return st;
}

/* One range of layers of one push on its way (one layer while the pusher keeps up):
 * its WRITE, and the landed notice (KV service LAYER or LAYERS call) the engine sends
 * once the WRITE has landed (hixl_engine_transfer_then_call). The pusher starts each
 * range as soon as it is saved, never waiting for the one before: the next range's
 * data queues right behind, as the raw engine's async WRITEs do; all are waited for
 * once the step's layers are out. */
struct push_note {
  hixl_call_t call;
  uint32_t i, layer, count;
  bool counted; /* its layers counted in layers_pushed already (landed bytes) */
  uint32_t alen;
  uint8_t ans[256];
};

/* Layers [k, k + count) of push v with landed bytes (kv_word.c): their data, then their
 * bytes, each copied by this thread before its call returns (shm); the last range's
 * notice names every layer (LAYERS 0..), its call into pn. Lock not held. */
static HixlStatus layer_word(hixl_kv_connector *c, struct kv_push *v, uint32_t k, uint32_t count,
                             const struct opvec *o, struct push_note *pn, char *why, size_t cap) {
  struct kv_meta_entry *e = &v->e;
  const HixlTransferOpDesc *d = o->v;
  int32_t t = c->cfg.transfer_timeout_ms;
  HixlStatus st = HIXL_SUCCESS;
  for (size_t i = 0; st == HIXL_SUCCESS && i < o->n; i += HIXL_MAX_BATCH)
    st = HixlEngineTransferSync(c->eng, e->remote, HIXL_WRITE, d + i,
                                o->n - i < HIXL_MAX_BATCH ? o->n - i : HIXL_MAX_BATCH, t);
  if (st != HIXL_SUCCESS) return st;
  /* The data's stores are seen before the bytes': the engine's lock, released after
   * the copy above and taken for the one below, orders them (a store-release then a
   * load-acquire, on every CPU). */
  memset(c->words.src + k, v->wmark, count);
  HixlTransferOpDesc w = {(uintptr_t)(c->words.src + k), (uintptr_t)(v->waddr + k), count};
  if ((st = HixlEngineTransferSync(c->eng, e->remote, HIXL_WRITE, &w, 1, t)) != HIXL_SUCCESS) return st;
  pthread_mutex_lock(&c->lock);
  c->stats.layers_pushed += count; /* landed, and the consumer can tell */
  pthread_mutex_unlock(&c->lock);
  if (k + count < c->layers) return HIXL_SUCCESS; /* no notice: the bytes told */
  struct kv_out msg = {0};
  kv_msg(c, &msg, c->layers > 1 ? KV_SVC_LAYERS : KV_SVC_LAYER, e->rreq, &e->rcap, 0, "");
  if (c->layers > 1) kv_put_u32(&msg, c->layers);
  if (msg.bad) {
    free(msg.p);
    snprintf(why, cap, "the notice of request %s to %s: out of memory", e->req, e->remote);
    return HIXL_RESOURCE_EXHAUSTED;
  }
  st = hixl_engine_call_start(c->eng, e->remote, HIXL_SERVICE_KV, msg.p, msg.len, pn->ans, sizeof(pn->ans),
                              &pn->alen, t, &pn->call);
  free(msg.p);
  pn->layer = 0;
  pn->count = c->layers;
  pn->counted = true;
  return st;
}

/* Start layers [k, k + count) of push v with their notice (LAYER for one, LAYERS
 * for more), the notice's call into pn (NULL: none, landed bytes told); why on failure. */
static HixlStatus layer_start(hixl_kv_connector *c, struct kv_push *v, uint32_t k, uint32_t count,
                              struct push_note *pn, char *why, size_t cap) {
  struct kv_meta_entry *e = &v->e;
  struct kv_out msg = {0};
  struct opvec o = {0};
  uint64_t t_build = kv_now_ns();
  pn->call = NULL;
  pn->counted = false;
  pn->layer = k;
  pn->count = count;
  HixlStatus st = kv_ops_runs(&o, &c->lay, &v->r, k, count, &v->runs, v->hs, why, cap);
  if (st != HIXL_SUCCESS) return st;
  const HixlTransferOpDesc *d = o.v;
  int32_t t = c->cfg.transfer_timeout_ms;
  kv_obs_phase(c, e->req, KV_PH_POSTED, NULL); /* the first range's: its first op */
  if (v->waddr) {
    why[0] = '\0';
    st = layer_word(c, v, k, count, &o, pn, why, cap);
  } else {
    kv_msg(c, &msg, count > 1 ? KV_SVC_LAYERS : KV_SVC_LAYER, e->rreq, &e->rcap, k, "");
    if (count > 1) kv_put_u32(&msg, count);
    if (msg.bad) {
      st = HIXL_RESOURCE_EXHAUSTED;
      snprintf(why, cap, "out of memory");
      goto out;
    }
    size_t i = 0; /* batches before the last go synchronously, the last with the notice behind it */
    for (; st == HIXL_SUCCESS && o.n - i > HIXL_MAX_BATCH; i += HIXL_MAX_BATCH)
      st = HixlEngineTransferSync(c->eng, e->remote, HIXL_WRITE, d + i, HIXL_MAX_BATCH, t);
    if (st == HIXL_SUCCESS)
      st = o.n > i ? hixl_engine_transfer_then_call(c->eng, e->remote, HIXL_WRITE, d + i, o.n - i,
                                                    HIXL_SERVICE_KV, msg.p, msg.len, pn->ans, sizeof(pn->ans),
                                                    &pn->alen, t, &pn->call)
                   : hixl_engine_call_start(c->eng, e->remote, HIXL_SERVICE_KV, msg.p, msg.len, pn->ans,
                                            sizeof(pn->ans), &pn->alen, t, &pn->call); /* no block here */
  }
  if (st != HIXL_SUCCESS && !(v->waddr && why[0]))
    snprintf(why, cap, "layers %u..%u of request %s to %s%s: %s", k, k + count - 1, e->req, e->remote,
             v->waddr ? ", their landed bytes or their notice" : "", HixlGetLastErrorMessage());
  kv_obs_hist(c, KV_H_POST, kv_now_ns() - t_build);
  if (st == HIXL_SUCCESS) kv_obs_moved(c, e->req, o.bytes, o.n);
  pthread_mutex_lock(&c->lock);
  c->stats.engine_ops += o.n;
  if (st == HIXL_SUCCESS) v->bytes += o.bytes; /* what it moves: its heads' bytes only */
  pthread_mutex_unlock(&c->lock);
out:
  free(msg.p);
  opvec_free(&o);
  return st;
}

/* The last layer from k on whose save for step has come, each one between too; c->lock held. */
static uint32_t saved_through(const hixl_kv_connector *c, uint32_t k, uint64_t step) {
  while (k + 1 < c->layers && c->push.saved_step[k + 1] >= step) k++;
  return k;
}

/* A part of a step's pushes (push_batch). */
struct push_part {
  HixlStatus st;
  bool accepting; /* under c->lock: its ACCEPT is not answered yet */
  bool ended;     /* push_end'ed */
  uint32_t cur;   /* the next layer to start */
  size_t peer;    /* its consumer: the index of the first part with its remote */
  char why[512];
};

/* Linking to one consumer rank (link_all). */
struct link_job {
  hixl_kv_connector *c;
  const struct kv_meta_entry *e;
  pthread_t t;
  bool started;
  bool skipped; /* a Link to its consumer failed lately: not dialled */
  HixlStatus st;
  char why[256];
};

static void *link_main(void *arg) {
  struct link_job *j = arg;
  j->st = kv_link(j->c, j->e, j->c->cfg.connect_timeout_ms);
  if (j->st != HIXL_SUCCESS) snprintf(j->why, sizeof(j->why), "%s", HixlGetLastErrorMessage());
  return NULL;
}

/* The slot of c->push.gone that remote has (KV_PUSH_GONE: none); with make, else the one that ends
 * first, taken for it. The pusher thread's alone. */
static size_t gone_slot(hixl_kv_connector *c, const char *remote, bool make) {
  size_t old = 0;
  for (size_t k = 0; k < KV_PUSH_GONE; k++) {
    if (strcmp(c->push.gone[k].remote, remote) == 0) return k;
    if (c->push.gone[k].until_ns < c->push.gone[old].until_ns) old = k;
  }
  if (!make) return KV_PUSH_GONE;
  snprintf(c->push.gone[old].remote, sizeof(c->push.gone[old].remote), "%s", remote);
  return old;
}

/* Link to every consumer rank the batch's parts write to (p[i].peer: one a consumer), all at once (a thread
 * each when there are several): a consumer instance that is gone costs one connect_timeout_ms, not one per
 * part. A part whose link failed fails now. A consumer a Link failed to less than connect_timeout_ms ago is
 * not dialled again, its parts fail at once: else each step queued behind a dead consumer would wait its
 * own connect_timeout_ms on this thread (and every other consumer's pushes behind it); one that comes back
 * is linked again once that time has passed. A step whose dial failed gives that time to the consumers it
 * left out too. */
static void link_all(hixl_kv_connector *c, struct kv_push **v, size_t n, struct push_part *p) {
  struct link_job *jobs = KV_ALLOC(KV_TEST_PUSH, calloc(n, sizeof(*jobs)));
  size_t nj = 0, *of = KV_ALLOC(KV_TEST_PUSH, calloc(n, sizeof(*of)));
  if (!jobs || !of) {
    for (size_t i = 0; i < n; i++)
      p[i].st = HIXL_RESOURCE_EXHAUSTED, snprintf(p[i].why, sizeof(p[i].why), "out of memory");
    free(jobs);
    free(of);
    return;
  }
  for (size_t i = 0; i < n; i++) { /* a job a consumer: its first part's (p[i].peer) */
    if (p[i].peer == i) jobs[nj] = (struct link_job){.c = c, .e = &v[i]->e};
    of[i] = p[i].peer == i ? nj++ : of[p[i].peer];
  }
  uint64_t now = kv_now_ns();
  for (size_t k = 0; k < nj; k++) {
    size_t g = gone_slot(c, jobs[k].e->remote, false);
    if (g < KV_PUSH_GONE && now < c->push.gone[g].until_ns) { /* failed lately: not again yet */
      jobs[k].skipped = true;
      jobs[k].st = HIXL_NOT_CONNECTED;
      snprintf(jobs[k].why, sizeof(jobs[k].why),
               "a Link to it failed less than connect_timeout_ms (%u ms) ago: not dialled again yet",
               (unsigned)c->cfg.connect_timeout_ms);
      continue;
    }
    jobs[k].started = nj > 1 && pthread_create(&jobs[k].t, NULL, link_main, &jobs[k]) == 0;
    if (jobs[k].started) thread_name(jobs[k].t, "hixl-kv-link");
  }
  uint64_t until = 0; /* the window of a dial that failed here */
  for (size_t k = 0; k < nj; k++) {
    if (jobs[k].skipped) continue;
    if (jobs[k].started)
      pthread_join(jobs[k].t, NULL);
    else
      link_main(&jobs[k]); /* the one, or no thread: here */
    size_t g = gone_slot(c, jobs[k].e->remote, jobs[k].st != HIXL_SUCCESS);
    if (g < KV_PUSH_GONE) /* failed: remembered from now; linked: forgotten */
      c->push.gone[g].until_ns =
          jobs[k].st != HIXL_SUCCESS ? kv_now_ns() + (uint64_t)c->cfg.connect_timeout_ms * 1000000ull : 0;
    if (g < KV_PUSH_GONE && c->push.gone[g].until_ns > until) until = c->push.gone[g].until_ns;
  }
  /* The consumers left out share that window: theirs ended while this step's dial waited,
   * and the next step would dial them alone, then this one's again: a step each,
   * connect_timeout_ms each, in turn (a dead instance's ranks whose links went apart). */
  for (size_t k = 0; until && k < nj; k++) {
    size_t g = jobs[k].skipped ? gone_slot(c, jobs[k].e->remote, false) : KV_PUSH_GONE;
    if (g < KV_PUSH_GONE && c->push.gone[g].until_ns < until) c->push.gone[g].until_ns = until;
  }
  for (size_t i = 0; i < n; i++)
    if ((p[i].st = jobs[of[i]].st) != HIXL_SUCCESS)
      snprintf(p[i].why, sizeof(p[i].why), "linking to the consumer %s: %s", v[i]->e.remote, jobs[of[i]].why);
  free(jobs);
  free(of);
}

/* Push p's part ends with st: reported, the consumer told of a failure (best effort),
 * the part ended (the request's last: the host may free the producer's blocks). */
static void push_end(hixl_kv_connector *c, struct kv_push *p, HixlStatus st, const char *why, uint64_t t_end,
                     uint64_t t_saved) {
  struct kv_meta_entry *e = &p->e;
  uint8_t ans[256];
  size_t an;
  if (st == HIXL_SUCCESS) {
    kv_obs_landed(c, e->req, e->remote);
    kv_obs_hist(c, KV_H_TAIL, t_end > t_saved ? t_end - t_saved : 0);
  } else {
    kv_obs_failed(c, e->req, kv_obs_cause(st, why), why);
    log_error("hixl-kv: request %s was not pushed (%s): %s", e->req, HixlStatusName(st), why);
    kv_tell(c, e, KV_SVC_ABORT, why, ans, sizeof(ans), &an); /* the consumer reports the failure */
  }
  pthread_mutex_lock(&c->lock);
  if (st == HIXL_SUCCESS) c->stats.bytes_pushed += p->bytes;
  kv_push_part_end(c, p, st == HIXL_SUCCESS);
  pthread_mutex_unlock(&c->lock);
}

/* A step's parts on their way (push_batch). The accept threads take the consumers in
 * turn and ACCEPT each one's parts on it, one after another; the pusher takes each part
 * through its layers on its own, from the moment its ACCEPT is answered: a consumer
 * that answers late (or never, up to transfer_timeout_ms a part) delays only its own
 * parts. */
struct push_run {
  hixl_kv_connector *c;
  struct kv_push **v;
  struct push_part *p;
  size_t n;
  size_t next; /* under c->lock: the next part whose consumer an accept thread may take */
  struct push_note *notes;
  size_t nnotes;
  uint64_t t_saved; /* when the pusher saw the step's last layer saved */
};

#define PUSH_ACCEPTERS 8 /* accept threads of a step at most */

static void *accept_main(void *arg) {
  struct push_run *b = arg;
  hixl_kv_connector *c = b->c;
  pthread_mutex_lock(&c->lock);
  while (b->next < b->n) {
    size_t r = b->next++;
    if (b->p[r].peer != r) continue; /* not a consumer's first part */
    for (size_t i = r; i < b->n; i++) {
      struct push_part *q = &b->p[i];
      if (q->peer != r || !q->accepting) continue; /* another's, or its link failed */
      pthread_mutex_unlock(&c->lock);
      HixlStatus st = push_accept(c, b->v[i], q->why, sizeof(q->why));
      pthread_mutex_lock(&c->lock);
      q->st = st;
      q->accepting = false;
      pthread_cond_broadcast(&c->push.saved); /* the pusher takes it from here */
    }
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* The next range of layers a part may start now, round robin from part from: its
 * index (n: none now), its range in *k, *count; *accepts, *saves: a part still waits for
 * its ACCEPT, for a save. A part whose save did not come by the deadline (or the
 * connector shuts) fails here. c->lock held. */
static size_t push_next(struct push_run *b, bool whole, uint64_t step, bool expired, size_t from, uint32_t *k,
                        uint32_t *count, bool *accepts, bool *saves) {
  hixl_kv_connector *c = b->c;
  *accepts = *saves = false;
  for (size_t j = 0; j < b->n; j++) {
    size_t i = (from + j) % b->n;
    struct push_part *q = &b->p[i];
    *accepts |= q->accepting;
    if (q->accepting || q->st != HIXL_SUCCESS || q->cur >= c->layers) continue;
    uint32_t need = whole ? c->layers - 1 : q->cur;
    if (c->push.saved_step[need] >= step) {
      *k = q->cur;
      *count = saved_through(c, need, step) - q->cur + 1;
      return i;
    }
    if (expired) {
      q->st = HIXL_TIMEOUT;
      snprintf(q->why, sizeof(q->why), "layer %u was not saved within lease_ms %u", need, c->cfg.lease_ms);
    } else {
      *saves = true;
    }
  }
  return b->n;
}

/* Wait for the notices of part i (b->n: of every part) not waited for yet. */
static void notes_wait(struct push_run *b, size_t i) {
  hixl_kv_connector *c = b->c;
  for (size_t j = 0; j < b->nnotes; j++) {
    struct push_note *pn = &b->notes[j];
    if ((i < b->n && pn->i != i) || !pn->call) continue; /* another part's: its thread's (end_all) */
    struct push_part *q = &b->p[pn->i];
    struct kv_meta_entry *e = &b->v[pn->i]->e;
    HixlStatus ns = hixl_engine_call_wait(c->eng, e->remote, pn->call);
    pn->call = NULL;
    if (ns == HIXL_SUCCESS) {
      pthread_mutex_lock(&c->lock);
      if (!pn->counted) c->stats.layers_pushed += pn->count;
      pthread_mutex_unlock(&c->lock);
    } else if (q->st == HIXL_SUCCESS) {
      q->st = ns;
      snprintf(q->why, sizeof(q->why), "layers %u..%u of request %s to %s, or their landed notice: %s",
               pn->layer, pn->layer + pn->count - 1, e->req, e->remote, HixlGetLastErrorMessage());
    }
  }
}

/* Part i ends: its notices answered, reported. */
static void part_end(struct push_run *b, size_t i) {
  notes_wait(b, i);
  push_end(b->c, b->v[i], b->p[i].st, b->p[i].why, kv_now_ns(), b->t_saved);
  b->p[i].ended = true;
}

/* The parts of one consumer (end_all): p's first part's index. */
struct end_job {
  struct push_run *b;
  size_t peer;
  pthread_t t;
  bool started;
};

static void *end_main(void *arg) {
  struct end_job *j = arg;
  for (size_t i = j->peer; i < j->b->n; i++)
    if (j->b->p[i].peer == j->peer && !j->b->p[i].ended) part_end(j->b, i);
  return NULL;
}

/* Whether a part of consumer peer (its first part's index) failed and has not ended:
 * its ABORT is still to be told. */
static bool end_aborts(const struct push_run *b, size_t peer) {
  for (size_t i = peer; i < b->n; i++)
    if (b->p[i].peer == peer && !b->p[i].ended && b->p[i].st != HIXL_SUCCESS) return true;
  return false;
}

/* The step's parts not ended yet end. A failed part's ABORT may wait notify_timeout_ms
 * for its consumer (and a link again), and consumers that are gone (a dead instance's
 * ranks) would otherwise cost that once each, one after another, on this thread: when
 * several consumers have one, each ends its parts on a thread of its own. Parts that
 * succeeded end here (no round trip): a step that went well starts no thread. */
static void end_all(struct push_run *b) {
  size_t nj = 0;
  for (size_t i = 0; i < b->n; i++) nj += b->p[i].peer == i && end_aborts(b, i);
  struct end_job *jobs = nj > 1 ? KV_ALLOC(KV_TEST_PUSH, calloc(nj, sizeof(*jobs))) : NULL;
  size_t k = 0;
  for (size_t i = 0; jobs && i < b->n; i++) {
    if (b->p[i].peer != i || !end_aborts(b, i)) continue;
    jobs[k] = (struct end_job){.b = b, .peer = i};
    jobs[k].started = pthread_create(&jobs[k].t, NULL, end_main, &jobs[k]) == 0;
    if (jobs[k].started) thread_name(jobs[k].t, "hixl-kv-end");
    k++;
  }
  for (size_t j = 0; j < k; j++)
    if (jobs[j].started) pthread_join(jobs[j].t, NULL);
  free(jobs);
  for (size_t i = 0; i < b->n; i++) /* one consumer, no memory, or a thread that did not start: here */
    if (!b->p[i].ended) part_end(b, i);
}

/* While the pusher only waits for ACCEPTs, a part whose every layer left ends (the host
 * may free its blocks), rather than with its step's slowest consumer: whether one did
 * (c->lock held, and again on return). A failed part ends with the step: its ABORT may
 * wait for the consumer, while another part's layer waits to be started. */
static bool end_one_pushed(struct push_run *b) {
  for (size_t i = 0; i < b->n; i++) {
    struct push_part *q = &b->p[i];
    if (q->ended || q->accepting || q->st != HIXL_SUCCESS || q->cur < b->c->layers) continue;
    pthread_mutex_unlock(&b->c->lock);
    part_end(b, i);
    pthread_mutex_lock(&b->c->lock);
    return true;
  }
  return false;
}

/* One step's pushes, layer by layer: each part's layers leave as soon as they are
 * saved and its consumer accepted it, while the producer computes the next; layers
 * saved while the pusher was busy starting earlier ones leave together, as one range
 * with one notice (layer_pipelining false: every layer at once, once the last is
 * saved). Each notice follows its data. Every push ends here, failed when this runs
 * out of memory. */
static void push_batch(hixl_kv_connector *c, struct kv_push **v, size_t n) {
  struct push_run b = {.c = c, .v = v, .n = n};
  size_t nthreads = 0, npeers = 0;
  pthread_t th[PUSH_ACCEPTERS];
  b.p = KV_ALLOC(KV_TEST_PUSH, calloc(n, sizeof(*b.p)));
  b.notes = KV_ALLOC(KV_TEST_PUSH, calloc(n * c->layers + 1, sizeof(*b.notes)));
  if (!b.p || !b.notes) {
    for (size_t i = 0; i < n; i++) push_end(c, v[i], HIXL_RESOURCE_EXHAUSTED, "out of memory", 0, 0);
    goto free_arrays;
  }
  for (size_t i = 0; i < n; i++) { /* the consumers: a part's is its remote's first part */
    struct push_part *q = &b.p[i];
    q->peer = i;
    for (size_t j = 0; j < i && q->peer == i; j++)
      if (strcmp(v[j]->e.remote, v[i]->e.remote) == 0) q->peer = b.p[j].peer;
    npeers += q->peer == i;
  }
  link_all(c, v, n, b.p);
  for (size_t i = 0; i < n; i++) b.p[i].accepting = b.p[i].st == HIXL_SUCCESS;
  /* One part: its ACCEPT here. Several: on a thread a consumer, while this one pushes. */
  for (; n > 1 && nthreads < npeers && nthreads < PUSH_ACCEPTERS; nthreads++) {
    if (pthread_create(&th[nthreads], NULL, accept_main, &b) != 0) break;
    thread_name(th[nthreads], "hixl-kv-accept");
  }
  if (!nthreads) accept_main(&b); /* one after another, here */
  pthread_mutex_lock(&c->lock);
  c->stats.lookups += n;
  /* A cross-layer group moves whole: then every layer leaves at once, after the last. */
  bool whole = !c->cfg.pipelining;
  for (uint32_t g = 0; g < c->lay.ng; g++) whole |= (c->lay.g[g].flags & HIXL_KV_GROUP_CROSS_LAYER) != 0;
  uint64_t step = v[0]->step, deadline = v[0]->bound_ns + (uint64_t)c->cfg.lease_ms * 1000000ull;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  for (size_t from = 0;;) {
    uint32_t k = 0, count = 0;
    bool accepts, saves, expired = c->shut || kv_now_ns() >= deadline;
    size_t i = push_next(&b, whole, step, expired, from, &k, &count, &accepts, &saves);
    if (i == n) {
      if (!accepts && !saves) break;
      if (saves)
        pthread_cond_timedwait(&c->push.saved, &c->lock, &ts);
      else if (!end_one_pushed(&b)) /* only ACCEPTs are awaited: their threads wake this */
        pthread_cond_wait(&c->push.saved, &c->lock);
      continue;
    }
    pthread_mutex_unlock(&c->lock);
    struct push_part *q = &b.p[i];
    struct push_note *pn = &b.notes[b.nnotes];
    if (k + count == c->layers && !b.t_saved) b.t_saved = kv_now_ns();
    if ((q->st = layer_start(c, v[i], k, count, pn, q->why, sizeof(q->why))) == HIXL_SUCCESS && pn->call) {
      pn->i = (uint32_t)i;
      b.nnotes++;
    }
    q->cur = k + count;
    from = i + 1;
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  for (size_t t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  /* Every notice answered (or failed) before the pushes are reported done. */
  notes_wait(&b, n);
  end_all(&b);
free_arrays:
  free(b.notes);
  free(b.p);
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
    struct kv_push *one, **v = KV_ALLOC(KV_TEST_PUSH, malloc(n * sizeof(*v)));
    if (!v) { /* out of memory: this step's pushes one at a time */
      v = &one;
      n = 1;
    }
    for (size_t i = 0; i < n; i++) {
      v[i] = c->push.pushes;
      c->push.pushes = c->push.pushes->next;
      kv_idset_add(&c->push.active, v[i]->e.req);
    }
    if (!c->push.pushes) c->push.tail = NULL;
    pthread_mutex_unlock(&c->lock);
    push_batch(c, v, n);
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < n; i++) kv_idset_del(&c->push.active, v[i]->e.req);
    pthread_cond_broadcast(&c->push.cond); /* handle_preemptions waits for them */
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) {
      free(v[i]->e.blocks);
      free(v[i]->e.rblocks);
      free(v[i]->r.planes);
      kv_runs_free(&v[i]->runs);
      free(v[i]);
    }
    if (v != &one) free(v);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}
