/* kv_sched: the scheduler's ops. A producer's request_finished keeps a finished
 * request's blocks (delay_free) and returns kv_transfer_params naming its worker's
 * engine, cluster, request and blocks; a consumer's update_state_after_alloc turns
 * such params into a LOAD (pull) or an EXPECT (push); build_connector_meta hands the
 * step's entries to the workers. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"
#include "util/log.h"

/* The fields of a consumer's kv_transfer_params; false with why when absent or bad. */
struct kv_params {
  char remote[KV_MAX_ENGINE + 1]; /* rank 0's engine */
  uint64_t port0;
  char rreq[KV_MAX_ID + 1];
  uint64_t *blocks; /* every group's, one list after another */
  size_t n;
  uint32_t ng, gn[KV_MAX_GROUPS];
  uint64_t epoch, seq; /* hold_epoch, hold_seq: which hold of the producer (0: not given) */
  struct kv_cap cap;   /* cap: what the peer's KV service wants for remote_request_id (len 0: not given) */
  uint32_t tp;         /* tp_size: the peer instance's tensor-parallel size (not given: this one's) */
  bool flagged;        /* the flag asked for was true: the params were meant for this side */
};

/* A request's block ids from the host, every group's one list after another. */
struct kv_gb {
  uint64_t *v;
  size_t n;
  uint32_t ng, gn[KV_MAX_GROUPS];
};

static hixl_kv_status gb_take(const hixl_kv_block_ids *g, size_t ng, struct kv_gb *out, const char *fn) {
  CHECK_ARG(g && ng >= 1 && ng <= KV_MAX_GROUPS, "%s: %zu groups of block ids; 1 to %u", fn, ng,
            KV_MAX_GROUPS);
  struct kv_gb b = {.ng = (uint32_t)ng};
  for (size_t k = 0; k < ng; k++) {
    CHECK_ARG(g[k].count == 0 || g[k].ids, "%s: group %zu's block ids are NULL", fn, k);
    CHECK_ARG(g[k].count <= KV_MAX_BLOCKS, "%s: group %zu has %zu blocks; at most %u", fn, k, g[k].count,
              KV_MAX_BLOCKS);
    b.gn[k] = (uint32_t)g[k].count;
    b.n += g[k].count;
  }
  if (b.n && !(b.v = malloc(b.n * sizeof(*b.v))))
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (size_t k = 0, off = 0; k < ng; off += g[k++].count)
    if (g[k].count) memcpy(b.v + off, g[k].ids, g[k].count * sizeof(*b.v));
  *out = b;
  return HIXL_KV_SUCCESS;
}

/* remote_block_ids: one list, or one per group when there are several. */
static json_object *blocks_json(const uint64_t *v, const uint32_t *gn, uint32_t ng) {
  json_object *all = json_object_new_array();
  for (uint32_t g = 0, off = 0; g < ng && all; off += gn[g++]) {
    json_object *a = ng == 1 ? all : json_object_new_array();
    for (uint32_t i = 0; i < gn[g] && a; i++)
      json_object_array_add(a, json_object_new_int64((int64_t)v[off + i]));
    if (ng > 1 && a) json_object_array_add(all, a);
  }
  return all;
}

/* The kv_transfer_params this side hands out: held (a producer's, for a consumer to
 * pull) or not (a consumer's push params, for a producer), this worker's address, the
 * request, its blocks (taken: freed on failure) and its capability, which the peer
 * presents in every KV service call on the request; NULL when out of memory. */
static json_object *params_new(const hixl_kv_connector *c, const char *id, bool held, json_object *blocks) {
  struct kv_cap cap;
  char hex[KV_CAP_HEX];
  kv_cap_make(c->sched.cap_key, id, &cap);
  json_object *o = blocks && cap.len ? json_object_new_object() : NULL;
  if (!o) {
    json_object_put(blocks);
    return NULL;
  }
  kv_cap_hex(&cap, hex);
  json_object_object_add(o, "do_remote_prefill", json_object_new_boolean(held));
  json_object_object_add(o, "do_remote_decode", json_object_new_boolean(!held));
  json_object_object_add(o, "remote_engine", json_object_new_string(c->cfg.address));
  json_object_object_add(o, "remote_request_id", json_object_new_string(id));
  json_object_object_add(o, "remote_block_ids", blocks);
  json_object_object_add(o, "hixl_abi", json_object_new_int(HIXL_KV_ABI_MAJOR));
  json_object_object_add(o, "tp_size", json_object_new_int((int32_t)c->world));
  json_object_object_add(o, "cap", json_object_new_string(hex));
  kv_cap_wipe(&cap, sizeof(cap));
  return o;
}

/* flag: "do_remote_prefill" (a consumer's params, from a producer) or
 * "do_remote_decode" (a producer's, from a consumer in push mode). */
static bool params_parse(const hixl_kv_connector *c, const hixl_kv_request *r, const char *flag,
                         struct kv_params *p, char *why, size_t cap) {
  memset(p, 0, sizeof(*p));
  p->tp = c->world;
  if (!r->kv_transfer_params || r->kv_transfer_params_len == 0) {
    snprintf(why, cap, "no kv_transfer_params");
    return false;
  }
  struct json_tokener *tok = json_tokener_new();
  if (!tok) return false;
  json_object *o = json_tokener_parse_ex(tok, r->kv_transfer_params, (int)r->kv_transfer_params_len);
  bool ok =
      o && json_tokener_get_error(tok) == json_tokener_success && json_object_is_type(o, json_type_object);
  json_tokener_free(tok);
  json_object *v;
  p->flagged = ok && json_object_object_get_ex(o, flag, &v) && json_object_is_type(v, json_type_boolean) &&
               json_object_get_boolean(v);
  if (ok && !p->flagged)
    ok = false, snprintf(why, cap, "%s is not true", flag);
  else if (ok &&
           (!json_object_object_get_ex(o, "remote_engine", &v) || !json_object_is_type(v, json_type_string) ||
            json_object_get_string_len(v) > (int)KV_MAX_ENGINE))
    ok = false,
    snprintf(why, cap, "remote_engine is missing or not a string of at most %u bytes", KV_MAX_ENGINE);
  else if (ok)
    snprintf(p->remote, sizeof(p->remote), "%s", json_object_get_string(v));
  if (ok &&
      (!json_object_object_get_ex(o, "remote_request_id", &v) || !json_object_is_type(v, json_type_string) ||
       !kv_copy_id(p->rreq, json_object_get_string(v), (size_t)json_object_get_string_len(v))))
    ok = false,
    snprintf(why, cap, "remote_request_id is missing or not a string of 1 to %u bytes", KV_MAX_ID);
  json_object *b = NULL;
  if (ok && (!json_object_object_get_ex(o, "remote_block_ids", &b) ||
             !json_object_is_type(b, json_type_array) || json_object_array_length(b) == 0))
    ok = false, snprintf(why, cap, "remote_block_ids is missing or empty");
  /* A list of block ids, or a list of them per KV cache group. */
  bool nested = ok && json_object_is_type(json_object_array_get_idx(b, 0), json_type_array);
  size_t ng = nested ? json_object_array_length(b) : 1, total = 0;
  if (ok && ng > KV_MAX_GROUPS)
    ok = false, snprintf(why, cap, "remote_block_ids has more than %u groups", KV_MAX_GROUPS);
  for (size_t g = 0; ok && g < ng; g++) {
    json_object *l = nested ? json_object_array_get_idx(b, g) : b;
    if (!json_object_is_type(l, json_type_array))
      ok = false, snprintf(why, cap, "remote_block_ids[%zu] is not a list of block ids", g);
    else
      total += p->gn[g] = (uint32_t)json_object_array_length(l);
  }
  if (ok && (total == 0 || total > KV_MAX_BLOCKS))
    ok = false, snprintf(why, cap, "remote_block_ids holds %zu blocks; 1 to %u", total, KV_MAX_BLOCKS);
  if (ok && !(p->blocks = malloc(total * sizeof(uint64_t)))) ok = false, snprintf(why, cap, "out of memory");
  p->ng = (uint32_t)ng;
  for (size_t g = 0; ok && g < ng; g++) {
    json_object *l = nested ? json_object_array_get_idx(b, g) : b;
    for (size_t i = 0; ok && i < p->gn[g]; i++) {
      json_object *e = json_object_array_get_idx(l, i);
      int64_t x = json_object_get_int64(e);
      if (!json_object_is_type(e, json_type_int) || x < 0)
        ok = false, snprintf(why, cap, "remote_block_ids: entry %zu of group %zu is not a block id", i, g);
      else
        p->blocks[p->n++] = (uint64_t)x;
    }
  }
  /* Optional (a producer before 1.4 gave none; its calls are then refused, and say so):
   * the capability of remote_request_id. */
  if (ok && json_object_object_get_ex(o, "cap", &v) &&
      (!json_object_is_type(v, json_type_string) ||
       !kv_cap_parse_hex(json_object_get_string(v), (size_t)json_object_get_string_len(v), &p->cap)))
    ok = false, snprintf(why, cap, "cap is not a string of %u hex digits", 2 * KV_CAP_LEN);
  /* Optional (a producer before them gave neither): which hold of the producer. */
  const char *num[2] = {"hold_epoch", "hold_seq"};
  uint64_t *dst[2] = {&p->epoch, &p->seq};
  for (int k = 0; ok && k < 2; k++)
    if (json_object_object_get_ex(o, num[k], &v)) {
      if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
        ok = false, snprintf(why, cap, "%s is not a count", num[k]);
      else
        *dst[k] = (uint64_t)json_object_get_int64(v);
    }
  /* Optional (a producer before 1.5 gave none: the same size as this instance). */
  if (ok && json_object_object_get_ex(o, "tp_size", &v)) {
    int64_t t = json_object_get_int64(v);
    if (!json_object_is_type(v, json_type_int) || t < 1 || t > KV_TP_MAX)
      ok = false, snprintf(why, cap, "tp_size is not a tensor-parallel size of 1 to %u", KV_TP_MAX);
    else
      p->tp = (uint32_t)t;
  }
  /* The peer's ranks listen on port + rank: each one's port is checked here, so no
   * worker is handed an entry naming a rank it cannot reach (refused at its bind). */
  char last[KV_MAX_ENGINE + 16];
  uint64_t cluster;
  if (ok && kv_worker_address(p->remote, p->tp - 1, last, sizeof(last), &cluster) != HIXL_KV_SUCCESS)
    ok = false, snprintf(why, cap,
                         "remote_engine is not ip:port with port + rank in [1, 65535] for each of "
                         "its %u ranks",
                         p->tp);
  if (!ok && why[0] == '\0') snprintf(why, cap, "kv_transfer_params is not a JSON object");
  if (!ok) {
    free(p->blocks);
    p->blocks = NULL;
  }
  json_object_put(o);
  return ok;
}

/* Params meant for this side (their flag true) that do not parse: the request moves no KV
 * through hixl. The first such refusal is said, naming the request and why; all counted. */
static void params_refused(hixl_kv_connector *c, const char *id, const char *flag, const char *why) {
  char esc[4 * KV_MAX_ID + 1]; /* a client's id: escaped (docs/security.md, "Logs") */
  pthread_mutex_lock(&c->lock);
  bool first = c->sched.params_refused++ == 0;
  pthread_mutex_unlock(&c->lock);
  if (!first) return;
  log_escape(esc, sizeof(esc), id, strnlen(id, KV_MAX_ID));
  log_warn("hixl-kv: request %s: kv_transfer_params with %s true refused (%s): it moves no KV through hixl "
           "(a consumer computes its prompt, a producer pushes nothing); later such refusals are not logged",
           esc, flag, why);
}

/* Whether the request's params set flag to true (push mode: the router's mark). */
static bool params_flag(const hixl_kv_request *r, const char *flag) {
  if (!r->kv_transfer_params || r->kv_transfer_params_len == 0) return false;
  struct json_tokener *tok = json_tokener_new();
  if (!tok) return false;
  json_object *o = json_tokener_parse_ex(tok, r->kv_transfer_params, (int)r->kv_transfer_params_len), *v;
  bool yes = o && json_tokener_get_error(tok) == json_tokener_success &&
             json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, flag, &v) &&
             json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);
  json_tokener_free(tok);
  json_object_put(o);
  return yes;
}

static hixl_kv_status check_req(const hixl_kv_request *r, const char *fn, char *id) {
  CHECK_ARG(r, "%s: request is NULL", fn);
  CHECK_ARG(kv_copy_id(id, r->req_id, r->req_id_len), "%s: req_id must be 1 to %u bytes of text", fn,
            KV_MAX_ID);
  CHECK_ARG((r->flags & ~HIXL_KV_REQ_ABORTED) == 0,
            "%s: request flags 0x%x: only HIXL_KV_REQ_ABORTED (0x%x) is defined", fn, r->flags,
            HIXL_KV_REQ_ABORTED); /* a bit not defined would be ignored */
  CHECK_ARG(r->kv_transfer_params_len == 0 || r->kv_transfer_params, "%s: kv_transfer_params is NULL", fn);
  CHECK_ARG(r->kv_transfer_params_len <= INT32_MAX, "%s: kv_transfer_params is %zu bytes; at most 2^31 - 1",
            fn, r->kv_transfer_params_len); /* json-c's length is an int */
  CHECK_ARG(r->num_prompt_tokens <= INT64_MAX, "%s: num_prompt_tokens %" PRIu64 "; at most 2^63 - 1", fn,
            r->num_prompt_tokens); /* the tokens answered are an int64 */
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_matched(hixl_kv_connector *c, const hixl_kv_request *r, uint64_t computed, int64_t *tokens,
                          int32_t *load_async) {
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  CHECK_ARG(c && tokens && load_async, "get_num_new_matched_tokens: connector or an output is NULL");
  CHECK_ARG(c->role == HIXL_KV_ROLE_SCHEDULER,
            "get_num_new_matched_tokens: a scheduler op, on a worker connector");
  if ((st = check_req(r, "get_num_new_matched_tokens", id)) != HIXL_KV_SUCCESS) return st;
  int64_t n = 0;
  struct kv_params p = {0};
  bool remote =
      c->cfg.consumer && (c->cfg.push ? params_flag(r, "do_remote_prefill")
                                      : r->kv_transfer_params_len &&
                                            params_parse(c, r, "do_remote_prefill", &p, why, sizeof(why)));
  if (!remote && p.flagged) params_refused(c, id, "do_remote_prefill", why);
  if (remote) {
    free(p.blocks);
    pthread_mutex_lock(&c->lock);
    bool failed = kv_idhash_has(&c->sched.failed, id);
    pthread_mutex_unlock(&c->lock);
    if (failed && !c->cfg.recompute)
      return kv_fail(HIXL_KV_FAILED,
                     "get_num_new_matched_tokens: request %s failed to load its KV "
                     "(load_failure_policy fail)",
                     id);
    if (!failed && r->num_prompt_tokens > computed) n = (int64_t)(r->num_prompt_tokens - computed);
    /* A synchronous load's step computes at least one token (the last prompt token, which
     * samples the first output): the runtime takes no hit of the whole prompt then. Its
     * block is loaded all the same; the forward pass writes that token's KV again. */
    if (c->cfg.load_in_forward && n > 0) n--;
  }
  *tokens = n;
  *load_async = n > 0 && !c->cfg.load_in_forward; /* load_in_forward: loaded in the step that runs it */
  return HIXL_KV_SUCCESS;
}

/* Queue one metadata entry for the next build. Lock held. */
static void meta_add(hixl_kv_connector *c, const struct kv_meta_entry *e) {
  kv_meta_put(&c->sched.meta, e);
  c->sched.meta_count++;
}

/* How often a waiting request's hold is renewed: a third of the lease (the consumer's
 * lease_ms sets the pace, as for its loads: keep it no longer than the producers'). */
static uint64_t renew_every_ns(const hixl_kv_connector *c) {
  return (uint64_t)c->cfg.lease_ms * 1000000ull / 3;
}

/* id is no longer waiting to be scheduled: its hold is not renewed from here. Lock held. */
static void waiting_drop(hixl_kv_connector *c, const char *id) {
  void *w = NULL;
  if (kv_idhash_del(&c->sched.waiting, id, &w)) free(w);
}

hixl_kv_status kv_new_request(hixl_kv_connector *c, const hixl_kv_request *r) {
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_SCHEDULER, "on_new_request: connector is NULL or a worker's");
  if ((st = check_req(r, "on_new_request", id)) != HIXL_KV_SUCCESS) return st;
  struct kv_params p;
  /* Params that do not parse: get_num_new_matched_tokens says so, once. */
  if (!c->cfg.consumer || c->cfg.push || c->cfg.lease_ms == 0 || r->kv_transfer_params_len == 0 ||
      (r->flags & HIXL_KV_REQ_ABORTED) || !params_parse(c, r, "do_remote_prefill", &p, why, sizeof(why)))
    return HIXL_KV_SUCCESS;
  free(p.blocks);
  struct kv_waiting *w = calloc(1, sizeof(*w));
  if (!w) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "on_new_request: out of memory");
  w->e = (struct kv_meta_entry){
      .type = KV_META_RENEW, .rcap = p.cap, .rtp = p.tp, .epoch = p.epoch, .seq = p.seq};
  snprintf(w->e.req, sizeof(w->e.req), "%s", id);
  snprintf(w->e.remote, sizeof(w->e.remote), "%s", p.remote);
  snprintf(w->e.rreq, sizeof(w->e.rreq), "%s", p.rreq);
  char engine[64];
  (void)kv_worker_address(p.remote, 0, engine, sizeof(engine), &w->e.cluster); /* params_parse checked it */
  w->next_ns = kv_now_ns() + renew_every_ns(c); /* one scheduled before then needs none */
  void *old = NULL;
  char gone[KV_MAX_ID + 1] = "";
  pthread_mutex_lock(&c->lock);
  waiting_drop(c, id); /* seen again: these params */
  int added = kv_idhash_add(&c->sched.waiting, id, w, KV_WAITING_MAX, &old);
  if (added == 1 && c->sched.waiting.evicted == 1)
    snprintf(gone, sizeof(gone), "%s", ((struct kv_waiting *)old)->e.req);
  pthread_mutex_unlock(&c->lock);
  free(old);
  if (added < 0) {
    free(w);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "on_new_request: out of memory");
  }
  if (gone[0])
    log_warn("hixl-kv: %u requests wait to be scheduled with their producers' holds renewed (the bound): the "
             "oldest is no longer renewed (request %s now; it is recomputed if it waits past its producer's "
             "lease) (the first such)",
             KV_WAITING_MAX, gone);
  return HIXL_KV_SUCCESS;
}

/* The renewals due (RENEW entries), at most 1024 a build; each renewed is made the
 * newest, so the oldest is always the next due. Lock held. */
static void renewals_due(hixl_kv_connector *c) {
  uint64_t now = kv_now_ns();
  for (unsigned k = 0; k < 1024 && c->sched.waiting.oldest; k++) {
    struct kv_waiting *w = kv_idnode_val(c->sched.waiting.oldest);
    if (w->next_ns > now) break;
    meta_add(c, &w->e);
    w->next_ns = now + renew_every_ns(c);
    kv_idhash_touch(&c->sched.waiting, w->e.req);
  }
}

/* Push mode: a consumer expects the producer's writes into the blocks just allocated
 * (get_push_params tells the producer where); a producer queues a PUSH of its blocks
 * into the consumer's named in the params. b is taken (freed here or kept). */
static hixl_kv_status push_after_alloc(hixl_kv_connector *c, const hixl_kv_request *r, const char *id,
                                       struct kv_gb *b, uint64_t external) {
  char why[256] = "";
  const char *fn = "update_state_after_alloc";
  if (c->cfg.consumer && params_flag(r, "do_remote_prefill")) {
    struct kv_alloc *a = external && b->n ? calloc(1, sizeof(*a)) : NULL;
    if (!a) {
      free(b->v);
      return external && b->n ? kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn)
                              : HIXL_KV_SUCCESS;
    }
    snprintf(a->id, sizeof(a->id), "%s", id);
    a->blocks = b->v;
    a->n = b->n;
    a->ngroups = b->ng;
    memcpy(a->gn, b->gn, sizeof(a->gn));
    struct kv_meta_entry e = {.type = KV_META_EXPECT, .blocks = b->v, .nblocks = b->n, .ngroups = b->ng};
    memcpy(e.gn, b->gn, sizeof(e.gn));
    snprintf(e.req, sizeof(e.req), "%s", id);
    void *same = NULL, *old = NULL;
    pthread_mutex_lock(&c->lock);
    kv_idhash_del(&c->sched.allocs, id, &same); /* allocated again (after a preemption): these blocks now */
    int added = kv_idhash_add(&c->sched.allocs, id, a, KV_ALLOCS_MAX, &old);
    if (added >= 0) meta_add(c, &e);
    bool first = added == 1 && c->sched.allocs.evicted == 1;
    pthread_mutex_unlock(&c->lock);
    kv_alloc_free(same);
    if (first)
      log_warn("hixl-kv: push allocations waiting for get_push_params are at their bound of %u: the oldest "
               "are released first (request %s now; its get_push_params fails NOT_FOUND). request_finished "
               "releases a request's allocation",
               KV_ALLOCS_MAX, ((struct kv_alloc *)old)->id);
    kv_alloc_free(old);
    if (added < 0) {
      kv_alloc_free(a);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    }
    return HIXL_KV_SUCCESS;
  }
  struct kv_params p = {0};
  if (!c->cfg.producer || !params_parse(c, r, "do_remote_decode", &p, why, sizeof(why))) {
    if (p.flagged) params_refused(c, id, "do_remote_decode", why);
    free(b->v);
    return HIXL_KV_SUCCESS;
  }
  hixl_kv_status st = HIXL_KV_SUCCESS;
  struct kv_meta_entry e = {.type = KV_META_PUSH, .blocks = b->v, .nblocks = b->n, .ngroups = b->ng};
  memcpy(e.gn, b->gn, sizeof(e.gn));
  snprintf(e.req, sizeof(e.req), "%s", id);
  snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
  snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
  e.rcap = p.cap;
  e.rtp = p.tp;
  char engine[64];
  /* A block count that differs is refused by the pusher when it accepts on the consumer,
   * which tells the consumer at once (after the layout check, so a layout mismatch is
   * named as such). */
  if (b->n == 0)
    st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: no blocks for request %s", fn, id);
  else if (p.ng != b->ng)
    st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s has blocks in %u groups, the consumer's params in %u",
                 fn, id, b->ng, p.ng);
  else if (kv_worker_address(p.remote, 0, engine, sizeof(engine), &e.cluster) != HIXL_KV_SUCCESS)
    st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: remote_engine \"%s\" is not ip:port", fn, id,
                 p.remote);
  bool warn = false; /* the first refusal at max_inflight_requests */
  size_t pushing = 0;
  if (st == HIXL_KV_SUCCESS) {
    e.rblocks = p.blocks;
    e.nrblocks = p.n;
    memcpy(e.rgn, p.gn, sizeof(e.rgn));
    pthread_mutex_lock(&c->lock);
    /* Tracked before it is queued: request_finished keeps the blocks only of a request
     * it finds here, so one queued but not tracked would be freed while pushed. */
    bool known = kv_idhash_has(&c->sched.pushing, id); /* allocated again (a preemption): pushed again */
    pushing = c->sched.pushing.n;
    if (!known && pushing >= c->cfg.max_inflight) {
      warn = c->sched.not_held++ == 0; /* not pushed: request_finished frees its blocks */
    } else if (!known && kv_idhash_add(&c->sched.pushing, id, NULL, SIZE_MAX, NULL) < 0) {
      st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: request %s: out of memory", fn, id);
    } else {
      meta_add(c, &e);
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (warn)
    log_warn("hixl-kv: %zu requests wait to be pushed (max_inflight_requests %u); request %s and later ones "
             "beyond the bound are not pushed: request_finished frees their blocks, and their consumers' "
             "loads fail at their lease (then recompute)",
             pushing, c->cfg.max_inflight, id);
  free(p.blocks);
  free(b->v);
  return st;
}

hixl_kv_status kv_after_alloc_groups(hixl_kv_connector *c, const hixl_kv_request *r,
                                     const hixl_kv_block_ids *g, size_t ng, uint64_t external) {
  const char *fn = "update_state_after_alloc";
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  struct kv_gb b;
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_SCHEDULER, "%s: connector is NULL or a worker's", fn);
  if ((st = check_req(r, fn, id)) != HIXL_KV_SUCCESS || (st = gb_take(g, ng, &b, fn)) != HIXL_KV_SUCCESS)
    return st;
  if (c->cfg.push) return push_after_alloc(c, r, id, &b, external);
  pthread_mutex_lock(&c->lock);
  waiting_drop(c, id); /* scheduled: its load (or FREE) keeps or frees the hold from here */
  pthread_mutex_unlock(&c->lock);
  struct kv_params p;
  if (!c->cfg.consumer || r->kv_transfer_params_len == 0 ||
      !params_parse(c, r, "do_remote_prefill", &p, why, sizeof(why))) {
    free(b.v);
    return HIXL_KV_SUCCESS;
  }
  struct kv_meta_entry e = {
      .type = external > 0 && b.n > 0 ? KV_META_LOAD : KV_META_FREE, .epoch = p.epoch, .seq = p.seq};
  snprintf(e.req, sizeof(e.req), "%s", id);
  snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
  snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
  e.rcap = p.cap;
  e.rtp = p.tp;
  st = HIXL_KV_SUCCESS;
  uint64_t *rb = NULL;
  if (e.type == KV_META_LOAD) {
    /* Per group, locally cached leading blocks are not loaded: the last ones of the
     * producer's list are (a sliding window's too). */
    bool fits = p.ng == b.ng && (rb = malloc(b.n * sizeof(*rb)));
    for (uint32_t k = 0, off = 0, roff = 0; fits && k < b.ng; off += b.gn[k], roff += p.gn[k], k++) {
      fits = b.gn[k] <= p.gn[k];
      if (fits) memcpy(rb + off, p.blocks + roff + (p.gn[k] - b.gn[k]), b.gn[k] * sizeof(*rb));
    }
    if (!fits) {
      st = kv_fail(
          HIXL_KV_PARAM_INVALID,
          "%s: %zu blocks in %u groups allocated for request %s, the producer holds %zu in %u (a group "
          "with more here than there, or another number of groups)",
          fn, b.n, b.ng, id, p.n, p.ng);
      e.type = KV_META_FREE;
    } else {
      e.blocks = b.v;
      e.nblocks = b.n;
      e.rblocks = rb;
      e.nrblocks = b.n;
      e.ngroups = b.ng;
      memcpy(e.gn, b.gn, sizeof(e.gn));
      memcpy(e.rgn, b.gn, sizeof(e.rgn));
    }
  }
  char engine[64];
  uint64_t cluster = 0;
  /* Rank 0's: each worker finds the producer ranks it reads from (kv_tp.c). */
  if (kv_worker_address(p.remote, 0, engine, sizeof(engine), &cluster) != HIXL_KV_SUCCESS) {
    st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: remote_engine \"%s\" is not ip:port", fn, id,
                 p.remote);
  } else {
    e.cluster = cluster;
    pthread_mutex_lock(&c->lock);
    meta_add(c, &e);
    pthread_mutex_unlock(&c->lock);
  }
  free(rb);
  free(p.blocks);
  free(b.v);
  return st;
}

hixl_kv_status kv_after_alloc(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                              size_t nblocks, uint64_t external) {
  CHECK_ARG(nblocks == 0 || blocks, "update_state_after_alloc: block_ids is NULL");
  return kv_after_alloc_groups(c, r, &(hixl_kv_block_ids){blocks, nblocks}, 1, external);
}

hixl_kv_status kv_build_meta(hixl_kv_connector *c, hixl_kv_buffer *meta) {
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_SCHEDULER,
            "build_connector_meta: connector or meta is NULL, or "
            "the connector is a worker's");
  struct kv_out o = {0};
  pthread_mutex_lock(&c->lock);
  renewals_due(c);
  kv_meta_begin(&o, c->sched.cap_key, c->sched.meta_count); /* the key: for the workers' checks */
  kv_put_raw(&o, c->sched.meta.p, c->sched.meta.len);       /* the entries, encoded as they were queued */
  bool bad = o.bad || c->sched.meta.bad;
  if (!bad) { /* the step's entries are in the metadata now */
    c->sched.meta.len = 0;
    c->sched.meta_count = 0;
  }
  pthread_mutex_unlock(&c->lock);
  if (bad) {
    free(o.p);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "build_connector_meta: out of memory");
  }
  meta->data = o.p;
  meta->len = o.len;
  return HIXL_KV_SUCCESS;
}

/* request_finished (b taken: freed here). */
static hixl_kv_status finished(hixl_kv_connector *c, const hixl_kv_request *r, const char *id,
                               struct kv_gb *b, int32_t *delay_free, hixl_kv_buffer *params) {
  char why[256] = "";
  size_t nblocks = b->n;
  struct kv_params p;
  void *alloc = NULL;
  if (c->cfg.consumer) { /* the request ends: no later get_num_new_matched_tokens or get_push_params */
    pthread_mutex_lock(&c->lock);
    kv_idhash_del(&c->sched.failed, id, NULL);
    if (c->cfg.push) kv_idhash_del(&c->sched.allocs, id, &alloc); /* no producer took it */
    pthread_mutex_unlock(&c->lock);
    kv_alloc_free(alloc);
  }
  /* A consumer's request that never loaded: the producer frees what it holds. */
  if (c->cfg.consumer && (r->flags & HIXL_KV_REQ_ABORTED) && r->kv_transfer_params_len &&
      params_parse(c, r, "do_remote_prefill", &p, why, sizeof(why))) {
    struct kv_meta_entry e = {.type = KV_META_FREE, .rcap = p.cap, .rtp = p.tp};
    snprintf(e.req, sizeof(e.req), "%s", id);
    snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
    snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
    char engine[64];
    if (kv_worker_address(p.remote, 0, engine, sizeof(engine), &e.cluster) == HIXL_KV_SUCCESS) {
      pthread_mutex_lock(&c->lock);
      meta_add(c, &e);
      pthread_mutex_unlock(&c->lock);
    }
    free(p.blocks);
  }
  if (c->cfg.push) {
    /* A pushed request's blocks stay until the pusher has sent them, unless
     * update_connector_output already passed on that it has (or it was never pushed):
     * then the host frees them now, as the plugin reports that request no more. */
    pthread_mutex_lock(&c->lock);
    bool again = kv_idhash_has(&c->sched.delayed, id); /* its blocks are kept by the first call */
    bool pushing = !again && kv_idhash_del(&c->sched.pushing, id, NULL);
    if (pushing && kv_idhash_add(&c->sched.delayed, id, NULL, KV_DELAYED_MAX, NULL) < 0) {
      kv_idhash_add(&c->sched.pushing, id, NULL, SIZE_MAX, NULL); /* as it was: room was there */
      pthread_mutex_unlock(&c->lock);
      free(b->v);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "request_finished: request %s: out of memory", id);
    }
    pthread_mutex_unlock(&c->lock);
    if (again) {
      free(b->v);
      return kv_fail(HIXL_KV_PARAM_INVALID,
                     "request_finished: request %s is kept until it is pushed already: once a request", id);
    }
    *delay_free = pushing;
    params->data = NULL;
    params->len = 0;
    free(b->v);
    return HIXL_KV_SUCCESS;
  }
  bool full = false;
  if (c->cfg.producer && !(r->flags & HIXL_KV_REQ_ABORTED) && nblocks > 0) {
    pthread_mutex_lock(&c->lock);
    if (kv_idhash_has(&c->sched.holding, id)) { /* its blocks are held by the first call */
      pthread_mutex_unlock(&c->lock);
      free(b->v);
      return kv_fail(HIXL_KV_PARAM_INVALID, "request_finished: request %s is held already: once a request",
                     id);
    }
    if (kv_idhash_has(&c->sched.ended, id)) { /* a reused id: its earlier params' capability acts on it */
      bool first = c->sched.reused++ == 0;
      pthread_mutex_unlock(&c->lock);
      free(b->v);
      if (first)
        log_warn(
            "hixl-kv: request_finished of request %s, which was held here and ended lately: a request id "
            "must be unique per run; it is not held (its consumer computes it), and later reused ids are "
            "refused the same (the first such refusal)",
            id);
      return kv_fail(
          HIXL_KV_PARAM_INVALID,
          "request_finished: request %s was held here and ended lately: a request id must be unique "
          "per run; not held",
          id);
    }
    full = c->sched.holding.n >= c->cfg.max_inflight;
    if (full && c->sched.not_held++ == 0)
      log_warn("hixl-kv: %zu requests are held for consumers (max_inflight_requests); request %s and "
               "later ones beyond the bound are not held: their consumers recompute them",
               c->sched.holding.n, id);
    else if (!full && kv_idhash_add(&c->sched.holding, id, NULL, SIZE_MAX, NULL) < 0)
      full = true;
    pthread_mutex_unlock(&c->lock);
  }
  if (!c->cfg.producer || (r->flags & HIXL_KV_REQ_ABORTED) || nblocks == 0 || full) {
    *delay_free = 0;
    params->data = NULL;
    params->len = 0;
    free(b->v);
    return HIXL_KV_SUCCESS;
  }
  /* Keep the blocks for a consumer; tell it where they are, and which hold this is:
   * numbered under the lock, as the HOLD entries are queued, so a worker that bound
   * hold N has bound every hold before it (a PIN of one it does not hold fails at once). */
  pthread_mutex_lock(&c->lock);
  struct kv_meta_entry e = {.type = KV_META_HOLD,
                            .blocks = b->v,
                            .nblocks = nblocks,
                            .epoch = c->sched.epoch,
                            .seq = c->sched.hold_seq + 1,
                            .ngroups = b->ng};
  memcpy(e.gn, b->gn, sizeof(e.gn));
  json_object *o = params_new(c, id, true, blocks_json(b->v, b->gn, b->ng));
  if (o) {
    json_object_object_add(o, "remote_num_tokens", json_object_new_int64((int64_t)r->num_prompt_tokens));
    json_object_object_add(o, "lease_ms", json_object_new_int64(c->cfg.lease_ms));
    json_object_object_add(o, "hold_epoch", json_object_new_int64((int64_t)e.epoch));
    json_object_object_add(o, "hold_seq", json_object_new_int64((int64_t)e.seq));
  }
  const char *text = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) : NULL;
  uint8_t *copy = text ? (uint8_t *)strdup(text) : NULL;
  snprintf(e.req, sizeof(e.req), "%s", id);
  if (copy) {
    c->sched.hold_seq++;
    meta_add(c, &e);
  }
  pthread_mutex_unlock(&c->lock);
  json_object_put(o);
  free(b->v);
  if (!copy) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "request_finished: out of memory");
  *delay_free = 1;
  params->data = copy;
  params->len = strlen((char *)copy);
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_finished_groups(hixl_kv_connector *c, const hixl_kv_request *r, const hixl_kv_block_ids *g,
                                  size_t ng, int32_t *delay_free, hixl_kv_buffer *params) {
  char id[KV_MAX_ID + 1];
  hixl_kv_status st;
  struct kv_gb b;
  CHECK_ARG(c && delay_free && params && c->role == HIXL_KV_ROLE_SCHEDULER,
            "request_finished: connector or an output is NULL, or the connector is a worker's");
  if ((st = check_req(r, "request_finished", id)) != HIXL_KV_SUCCESS ||
      (st = gb_take(g, ng, &b, "request_finished")) != HIXL_KV_SUCCESS)
    return st;
  pthread_mutex_lock(&c->lock);
  waiting_drop(c, id); /* finished before it was scheduled (an abort): no more renewals */
  pthread_mutex_unlock(&c->lock);
  return finished(c, r, id, &b, delay_free, params);
}

hixl_kv_status kv_finished(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                           size_t nblocks, int32_t *delay_free, hixl_kv_buffer *params) {
  CHECK_ARG(nblocks == 0 || blocks, "request_finished: block_ids is NULL");
  return kv_finished_groups(c, r, &(hixl_kv_block_ids){blocks, nblocks}, 1, delay_free, params);
}

void kv_alloc_free(void *v) {
  struct kv_alloc *a = v;
  if (a) free(a->blocks);
  free(a);
}

hixl_kv_status kv_push_params(hixl_kv_connector *c, const char *req_id, size_t len, hixl_kv_buffer *out) {
  char id[KV_MAX_ID + 1];
  CHECK_ARG(c && out && c->role == HIXL_KV_ROLE_SCHEDULER,
            "get_push_params: connector or output is NULL, or a worker's");
  CHECK_ARG(kv_copy_id(id, req_id, len), "get_push_params: req_id must be 1 to %u bytes of text", KV_MAX_ID);
  CHECK_ARG(c->cfg.push && c->cfg.consumer, "get_push_params: for a consumer in mode push");
  void *v = NULL;
  pthread_mutex_lock(&c->lock);
  kv_idhash_del(&c->sched.allocs, id, &v);
  pthread_mutex_unlock(&c->lock);
  struct kv_alloc *a = v;
  if (!a)
    return kv_fail(HIXL_KV_NOT_FOUND,
                   "get_push_params: no blocks are allocated for request %s (none were, its params were "
                   "taken, it finished, or it was forgotten past %u allocations waiting)",
                   id, KV_ALLOCS_MAX);
  json_object *o = params_new(c, id, false, blocks_json(a->blocks, a->gn, a->ngroups));
  char *copy = o ? strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) : NULL;
  json_object_put(o);
  kv_alloc_free(a);
  if (!copy) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_push_params: out of memory");
  out->data = (uint8_t *)copy;
  out->len = strlen(copy);
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_update_output(hixl_kv_connector *c, const hixl_kv_ids *sending, const hixl_kv_ids *recving,
                                const hixl_kv_ids *failed) {
  (void)recving;
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_SCHEDULER,
            "update_connector_output: connector is NULL or a worker's");
  const hixl_kv_ids *lists[] = {sending, recving, failed};
  /* Every id is one a request can have (as check_req takes it), checked before anything
   * is taken: a NULL, empty or overlong one names no request, and one kept among the
   * failed loads would push a real one out. */
  for (int k = 0; k < 3; k++) {
    const char *name = k ? k > 1 ? "failed" : "recving" : "sending";
    CHECK_ARG(!lists[k] || lists[k]->count == 0 || lists[k]->ids,
              "update_connector_output: the %s list has %zu ids and no array", name, lists[k]->count);
    for (size_t i = 0; lists[k] && i < lists[k]->count; i++) {
      const char *id = lists[k]->ids[i];
      size_t n = id ? strnlen(id, KV_MAX_ID + 1) : 0;
      CHECK_ARG(n >= 1 && n <= KV_MAX_ID,
                "update_connector_output: the %s list's id %zu is %s: a request id is 1 to %u bytes; "
                "nothing taken",
                name, i,
                !id ? "NULL"
                : n ? "too long"
                    : "empty",
                KV_MAX_ID);
    }
  }
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; sending && i < sending->count; i++) {
    const char *id = sending->ids[i];
    if (kv_idhash_del(&c->sched.holding, id, NULL)) /* its blocks are free: room to hold more */
      kv_idhash_add(&c->sched.ended, id, NULL, KV_GONE_MAX, NULL); /* the same id held again is refused */
    kv_idhash_del(&c->sched.pushing, id, NULL); /* pushed before request_finished: see kv_finished */
    kv_idhash_del(&c->sched.delayed, id, NULL); /* the host frees its blocks now */
  }
  bool first = false;
  for (size_t i = 0; failed && i < failed->count; i++)
    if (!kv_idhash_has(&c->sched.failed, failed->ids[i]) &&
        kv_idhash_add(&c->sched.failed, failed->ids[i], NULL, KV_FAILED_MAX, NULL) == 1)
      first = first || c->sched.failed.evicted == 1;
  pthread_mutex_unlock(&c->lock);
  if (first)
    log_warn("hixl-kv: failed loads of requests not yet finished are at their bound of %u: the oldest are "
             "forgotten first (a forgotten request's get_num_new_matched_tokens offers its load again); "
             "request_finished forgets a request",
             KV_FAILED_MAX);
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_set_handshake(hixl_kv_connector *c, const uint8_t *meta, size_t len) {
  CHECK_ARG(c && (meta || len == 0), "set_handshake_metadata: connector or metadata is NULL");
  return HIXL_KV_SUCCESS; /* kv_transfer_params and the PIN answer carry what a peer needs */
}
