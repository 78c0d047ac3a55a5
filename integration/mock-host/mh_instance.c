/* mh_instance: one serving instance (prefill or decode) in its own process: a
 * scheduler connector and one worker connector (rank 0 of 1) that talk only through
 * the bytes of build_connector_meta -> bind_connector_meta, a paged KV cache with a
 * free list, and a step loop, as a vLLM engine core runs them. */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "mh.h"

/* A request the instance tracks, from arrival until its blocks are freed. */
struct ireq {
  uint32_t idx;
  char id[24];
  uint64_t seed;
  uint64_t prompt;
  char *params; /* kv_transfer_params from the router (decode) */
  size_t plen;
  uint64_t *blocks; /* its block table; NULL until allocated */
  uint64_t nblocks;
  bool loading;         /* decode: update_state_after_alloc done, waiting for get_finished */
  uint64_t load_errors; /* decode: its blocks in get_block_ids_with_load_errors */
  bool verifying;       /* decode: received; its KV is being checked, a few layers a step */
  bool aborted;         /* decode: request_finished(ABORTED) while it loads; blocks kept until received */
  uint32_t vlayer;      /* the next layer to check */
  uint64_t vbad;        /* bytes wrong so far */
  uint64_t t_held;      /* when get_finished reported it received */
  char vwhere[256];     /* the first wrong byte */
};

struct inst {
  const struct mh_inst_args *a;
  const hixl_kv_ops *ops;
  const char *who;
  hixl_kv_connector *sched, *worker;
  struct mh_cache cache;
  struct mh_conn conn;
  struct ireq **v; /* tracked requests, in arrival order */
  size_t n, cap;
  uint32_t count; /* prefill: requests finished; decode: loads started */
  bool exiting;
  uint64_t drain_end_ns;
};

static bool has(const struct inst *x, size_t off, size_t size) { return x->ops->size >= off + size; }
#define HAS(x, op) has((x), offsetof(hixl_kv_ops, op), sizeof((x)->ops->op))

static void say(const struct inst *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const struct inst *x, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", x->who, line);
}

static void send_fail(struct inst *x, uint32_t idx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void send_fail(struct inst *x, uint32_t idx, const char *fmt, ...) {
  char why[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  struct mh_out o = {0};
  mh_put_u32(&o, idx);
  mh_put_str(&o, why, strlen(why));
  mh_send(x->conn.fd, MH_FAIL, &o);
}

static hixl_kv_request hreq(const struct ireq *r) {
  return (hixl_kv_request){r->id, strlen(r->id), r->prompt, r->params, r->plen, 0};
}

static struct ireq *req_add(struct inst *x, uint32_t idx, uint64_t seed, uint64_t prompt, const char *params,
                            size_t plen) {
  if (x->n == x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 32;
    struct ireq **v = realloc(x->v, cap * sizeof(*v));
    if (!v) return NULL;
    x->v = v;
    x->cap = cap;
  }
  struct ireq *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->idx = idx;
  snprintf(r->id, sizeof(r->id), "req-%u", idx);
  r->seed = seed;
  r->prompt = prompt;
  if (plen && !(r->params = malloc(plen))) {
    free(r);
    return NULL;
  }
  if (plen) memcpy(r->params, params, plen);
  r->plen = plen;
  x->v[x->n++] = r;
  return r;
}

static size_t req_find(const struct inst *x, const char *id) {
  for (size_t i = 0; i < x->n; i++)
    if (strcmp(x->v[i]->id, id) == 0) return i;
  return SIZE_MAX;
}

/* Free the request's blocks (if any) and forget it. */
static void req_drop(struct inst *x, size_t i) {
  struct ireq *r = x->v[i];
  if (r->blocks) mh_free(&x->cache, r->blocks, r->nblocks);
  free(r->blocks);
  free(r->params);
  free(r);
  memmove(x->v + i, x->v + i + 1, (x->n - i - 1) * sizeof(*x->v));
  x->n--;
}

static bool req_alloc(struct inst *x, struct ireq *r, const struct mh_model *m) {
  uint64_t nb = mh_request_blocks(m, r->prompt);
  uint64_t *b = malloc(nb * sizeof(*b));
  if (!b || !mh_alloc(&x->cache, nb, r->idx + 1, b)) {
    free(b);
    return false;
  }
  r->blocks = b;
  r->nblocks = nb;
  return true;
}

/* The request's block list per KV cache group (mh_group_span). */
static size_t group_ids(const struct inst *x, const struct ireq *r, hixl_kv_block_ids *g) {
  uint32_t n = mh_num_groups(&x->a->model);
  for (uint32_t k = 0; k < n; k++) {
    uint64_t off, cnt;
    mh_group_span(&x->a->model, k, r->prompt, &off, &cnt);
    g[k] = (hixl_kv_block_ids){r->blocks + off, (size_t)cnt};
  }
  return n;
}

/* The scheduler's update_state_after_alloc: with one block list per group when the
 * model has several (ABI 1.3, vLLM's hybrid allocator), else 1.0's. */
static hixl_kv_status sched_after_alloc(struct inst *x, const struct ireq *r, uint64_t tokens) {
  hixl_kv_request q = hreq(r);
  hixl_kv_block_ids g[MH_MAX_GROUPS];
  if (mh_num_groups(&x->a->model) == 1)
    return x->ops->update_state_after_alloc(x->sched, &q, r->blocks, r->nblocks, tokens);
  if (!HAS(x, update_state_after_alloc_groups)) return HIXL_KV_UNSUPPORTED;
  return x->ops->update_state_after_alloc_groups(x->sched, &q, g, group_ids(x, r, g), tokens);
}

/* ... and its request_finished. */
static hixl_kv_status sched_finished(struct inst *x, const struct ireq *r, uint32_t flags, int32_t *delay,
                                     hixl_kv_buffer *params) {
  hixl_kv_request q = hreq(r);
  hixl_kv_block_ids g[MH_MAX_GROUPS];
  q.flags = flags;
  if (mh_num_groups(&x->a->model) == 1)
    return x->ops->request_finished(x->sched, &q, r->blocks, r->nblocks, delay, params);
  if (!HAS(x, request_finished_groups)) return HIXL_KV_UNSUPPORTED;
  return x->ops->request_finished_groups(x->sched, &q, g, group_ids(x, r, g), delay, params);
}

/* One step of connector metadata: the scheduler's bytes, bound by the worker. */
static void meta_step(struct inst *x) {
  hixl_kv_buffer m = {0};
  hixl_kv_status st = x->ops->build_connector_meta(x->sched, &m);
  if (st != HIXL_KV_SUCCESS) {
    say(x, "build_connector_meta failed (%s): %s", mh_status_name(st), x->ops->last_error());
    return;
  }
  st = x->ops->bind_connector_meta(x->worker, m.data, m.len);
  if (st != HIXL_KV_SUCCESS)
    say(x, "bind_connector_meta of %zu bytes failed (%s): %s", m.len, mh_status_name(st),
        x->ops->last_error());
  x->ops->free_buffer(&m);
  if (st == HIXL_KV_SUCCESS && (st = x->ops->start_load_kv(x->worker)) != HIXL_KV_SUCCESS)
    say(x, "start_load_kv failed (%s): %s", mh_status_name(st), x->ops->last_error());
}

/* The worker's metadata is done with at the end of the step (vLLM: after the forward). */
static void meta_clear(struct inst *x) {
  if (!HAS(x, clear_connector_meta)) return;
  hixl_kv_status st = x->ops->clear_connector_meta(x->worker);
  if (st != HIXL_KV_SUCCESS)
    say(x, "clear_connector_meta failed (%s): %s", mh_status_name(st), x->ops->last_error());
}

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* ---- prefill ---- */

static void prefill_step(struct inst *x) {
  const struct mh_model *m = &x->a->model;
  struct ireq **batch = malloc((x->n ? x->n : 1) * sizeof(*batch));
  size_t nb = 0;
  uint64_t batch_tokens = 0;
  /* Admit waiting requests, first come first served, while blocks last. */
  for (size_t i = 0; batch && i < x->n; i++) {
    struct ireq *r = x->v[i];
    if (r->blocks) continue;
    if (!req_alloc(x, r, m)) break;
    batch[nb++] = r;
  }
  /* Push mode: the batch's PUSH entries are bound in the step whose forward pass
   * computes them, so each layer leaves as soon as it is saved. */
  for (size_t k = 0; x->a->push && k < nb; k++) {
    struct ireq *r = batch[k];
    hixl_kv_status st = sched_after_alloc(x, r, 0);
    if (st != HIXL_KV_SUCCESS) {
      send_fail(x, r->idx, "prefill: update_state_after_alloc(%s, %" PRIu64 " blocks, push) failed (%s): %s",
                r->id, r->nblocks, mh_status_name(st), x->ops->last_error());
      req_drop(x, req_find(x, r->id));
      memmove(batch + k, batch + k + 1, (nb - k - 1) * sizeof(*batch));
      nb--;
      k--;
    }
  }
  if (x->a->push) meta_step(x);
  for (size_t k = 0; k < nb; k++) batch_tokens += batch[k]->prompt;
  if (nb) {
    /* The forward pass: layer by layer over the batch, each layer saved as it ends. */
    for (uint32_t l = 0; l < m->layers; l++) {
      hixl_kv_status ws = x->ops->wait_for_layer_load(x->worker, l); /* as every forward pass does */
      if (ws != HIXL_KV_SUCCESS)
        say(x, "wait_for_layer_load(%u) failed (%s): %s", l, mh_status_name(ws), x->ops->last_error());
      for (size_t k = 0; k < nb; k++)
        mh_compute_layer(&x->cache, batch[k]->seed, l, batch[k]->blocks, batch[k]->prompt);
      if (x->a->compute_us_per_token) sleep_us((uint64_t)x->a->compute_us_per_token * batch_tokens);
      hixl_kv_status st = x->ops->save_kv_layer(x->worker, l);
      if (st != HIXL_KV_SUCCESS)
        say(x, "save_kv_layer(%u) failed (%s): %s", l, mh_status_name(st), x->ops->last_error());
    }
    uint64_t t_saved = mh_now_ns(); /* the last layer is computed: the hand-off starts */
    hixl_kv_status st = x->ops->wait_for_save(x->worker);
    if (st != HIXL_KV_SUCCESS)
      say(x, "wait_for_save failed (%s): %s", mh_status_name(st), x->ops->last_error());
    for (size_t k = 0; k < nb; k++) {
      struct ireq *r = batch[k];
      int32_t delay = -1;
      hixl_kv_buffer p = {0};
      st = sched_finished(x, r, 0, &delay, &p);
      if (st != HIXL_KV_SUCCESS || delay != 1 || (!x->a->push && p.len == 0)) {
        if (st != HIXL_KV_SUCCESS)
          send_fail(x, r->idx, "prefill: request_finished(%s, %" PRIu64 " blocks) failed (%s): %s", r->id,
                    r->nblocks, mh_status_name(st), x->ops->last_error());
        else
          send_fail(x, r->idx,
                    "prefill: request_finished(%s) answered delay_free %d with %zu bytes of "
                    "kv_transfer_params (want 1 and params: is the config's role producer?)",
                    r->id, delay, p.len);
        if (st == HIXL_KV_SUCCESS) x->ops->free_buffer(&p);
        req_drop(x, req_find(x, r->id));
        continue;
      }
      struct mh_out o = {0};
      mh_put_u32(&o, r->idx);
      mh_put_u64(&o, t_saved);
      mh_put_str(&o, p.data, p.len);
      x->ops->free_buffer(&p);
      mh_send(x->conn.fd, MH_PARAMS, &o);
      if (++x->count == x->a->fault_at && x->a->fault == MH_FAULT_PREFILL_DIES) {
        say(x, "fault prefill-dies: killing this process (pid %d) after request_finished of %s",
            (int)getpid(), r->id);
        raise(SIGKILL);
      }
    }
  }
  free(batch);
  if (!x->a->push) meta_step(x); /* the HOLD entries of the requests just finished */
  /* Requests the consumer has taken (or whose lease ran out): their blocks are free. */
  hixl_kv_ids s = {0}, rv = {0};
  hixl_kv_status st = x->ops->get_finished(x->worker, NULL, &s, &rv);
  if (st != HIXL_KV_SUCCESS) {
    say(x, "get_finished failed (%s): %s", mh_status_name(st), x->ops->last_error());
    return;
  }
  for (size_t i = 0; i < s.count; i++) {
    size_t k = req_find(x, s.ids[i]);
    if (k == SIZE_MAX || !x->v[k]->blocks)
      say(x, "get_finished reported %s finished sending, a request this prefill does not hold", s.ids[i]);
    else
      req_drop(x, k);
  }
  if (HAS(x, update_connector_output) && (s.count || rv.count))
    x->ops->update_connector_output(x->sched, &s, &rv, NULL);
  x->ops->free_ids(&s);
  x->ops->free_ids(&rv);
}

/* ---- decode ---- */

static void done(struct inst *x, size_t i, uint8_t outcome, uint64_t t_held, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void done(struct inst *x, size_t i, uint8_t outcome, uint64_t t_held, const char *fmt, ...) {
  struct ireq *r = x->v[i];
  char why[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  /* The request ends as a runtime ends it: request_finished, then its blocks go back. */
  if (r->blocks && !r->aborted) {
    int32_t delay = 0;
    hixl_kv_buffer p = {0};
    hixl_kv_status st = sched_finished(x, r, 0, &delay, &p);
    if (st != HIXL_KV_SUCCESS)
      say(x, "request_finished(%s) failed (%s): %s", r->id, mh_status_name(st), x->ops->last_error());
    else if (delay != 0)
      say(x, "request_finished(%s) on a consumer answered delay_free %d; freeing its blocks anyway", r->id,
          delay);
    if (st == HIXL_KV_SUCCESS) x->ops->free_buffer(&p);
  }
  const struct mh_model *m = &x->a->model;
  struct mh_out o = {0};
  mh_put_u32(&o, r->idx);
  mh_put_u8(&o, outcome);
  mh_put_u64(&o, t_held);
  mh_put_u64(&o, outcome == MH_VERIFIED ? mh_request_kv_bytes(m, r->prompt) : 0);
  mh_put_str(&o, why, strlen(why));
  mh_send(x->conn.fd, MH_DONE, &o);
  req_drop(x, i);
}

/* The runtime computes the prompt itself (no KV came): then checks it like any other. */
static void recompute(struct inst *x, size_t i, uint64_t t_held, const char *why) {
  struct ireq *r = x->v[i];
  char where[256] = "";
  for (uint32_t l = 0; l < x->a->model.layers; l++)
    mh_compute_layer(&x->cache, r->seed, l, r->blocks, r->prompt);
  uint64_t bad =
      mh_verify(&x->cache, r->seed, r->blocks, r->prompt, 0, x->a->model.layers, where, sizeof(where));
  if (bad)
    done(x, i, MH_CORRUPT, t_held, "%s; recomputed, but %" PRIu64 " bytes differ, first %s", why, bad, where);
  else
    done(x, i, MH_RECOMPUTED, t_held, "%s; recomputed locally", why);
}

static void decode_admit(struct inst *x) {
  const struct mh_model *m = &x->a->model;
  for (size_t i = 0; i < x->n;) {
    struct ireq *r = x->v[i];
    if (r->loading || r->verifying) {
      i++;
      continue;
    }
    hixl_kv_request q = hreq(r);
    int64_t tokens = 0;
    int32_t async = 0;
    hixl_kv_status st = x->ops->get_num_new_matched_tokens(x->sched, &q, 0, &tokens, &async);
    if (st != HIXL_KV_SUCCESS) {
      done(x, i, MH_FAILED, 0, "get_num_new_matched_tokens(%s) failed (%s): %s", r->id, mh_status_name(st),
           x->ops->last_error());
      continue;
    }
    if (tokens == HIXL_KV_TOKENS_LATER) {
      i++;
      continue;
    }
    if (!req_alloc(x, r, m)) break; /* wait for blocks, first come first served */
    if (tokens <= 0) {
      recompute(x, i, mh_now_ns(), "the connector matched no tokens");
      continue;
    }
    if ((uint64_t)tokens != r->prompt || !async)
      say(x, "get_num_new_matched_tokens(%s): %" PRId64 " tokens, load_async %d (want %" PRIu64 ", 1)", r->id,
          tokens, async, r->prompt);
    st = sched_after_alloc(x, r, (uint64_t)tokens);
    if (st != HIXL_KV_SUCCESS) {
      done(x, i, MH_FAILED, 0, "update_state_after_alloc(%s, %" PRIu64 " blocks) failed (%s): %s", r->id,
           r->nblocks, mh_status_name(st), x->ops->last_error());
      continue;
    }
    if (x->a->push) { /* the producer needs these blocks: through the router, as vLLM's proxy */
      hixl_kv_buffer pp = {0};
      st = x->ops->get_push_params(x->sched, r->id, strlen(r->id), &pp);
      if (st != HIXL_KV_SUCCESS) {
        done(x, i, MH_FAILED, 0, "get_push_params(%s) failed (%s): %s", r->id, mh_status_name(st),
             x->ops->last_error());
        continue;
      }
      struct mh_out o = {0};
      mh_put_u32(&o, r->idx);
      mh_put_str(&o, pp.data, pp.len);
      x->ops->free_buffer(&pp);
      mh_send(x->conn.fd, MH_PUSHPARAMS, &o);
    }
    r->loading = true;
    x->count++;
    if (x->a->fault == MH_FAULT_DECODE_ABORTS && x->count == x->a->fault_at) {
      /* A client that went away: the runtime finishes the request aborted while its KV
       * loads, and keeps its blocks until get_finished reports it received (vLLM's
       * WAITING_FOR_REMOTE_KVS), as the plugin's header asks. */
      int32_t delay = 0;
      hixl_kv_buffer p = {0};
      st = sched_finished(x, r, HIXL_KV_REQ_ABORTED, &delay, &p);
      if (st != HIXL_KV_SUCCESS)
        say(x, "fault decode-aborts: request_finished(%s, aborted) failed (%s): %s", r->id,
            mh_status_name(st), x->ops->last_error());
      else
        x->ops->free_buffer(&p);
      say(x, "fault decode-aborts: %s aborted while its KV loads; its blocks are kept until it is received",
          r->id);
      r->aborted = true;
    }
    i++;
  }
}

/* Check received requests' KV, about budget bytes this step. */
static void verify_some(struct inst *x, uint64_t budget) {
  const struct mh_model *m = &x->a->model;
  for (size_t i = 0; i < x->n && budget > 0;) {
    struct ireq *r = x->v[i];
    if (!r->verifying) {
      i++;
      continue;
    }
    uint64_t layer_bytes = 2 * r->prompt * mh_token_bytes(m);
    while (r->vlayer < m->layers && budget > 0) {
      r->vbad +=
          mh_verify(&x->cache, r->seed, r->blocks, r->prompt, r->vlayer++, 1, r->vwhere, sizeof(r->vwhere));
      budget = budget > layer_bytes ? budget - layer_bytes : 0;
    }
    if (r->vlayer < m->layers) break;
    if (r->vbad)
      done(x, i, MH_CORRUPT, r->t_held,
           "%" PRIu64 " bytes of its KV differ from what prefill computed, first %s", r->vbad, r->vwhere);
    else
      done(x, i, MH_VERIFIED, r->t_held, "every byte checked");
  }
}

static void decode_step(struct inst *x) {
  decode_admit(x);
  meta_step(x);
  if (x->a->fault == MH_FAULT_DECODE_DIES && x->count >= x->a->fault_at) {
    size_t loading = 0;
    for (size_t i = 0; i < x->n; i++) loading += x->v[i]->loading;
    if (loading) {
      say(x, "fault decode-dies: killing this process (pid %d) with %zu loads in flight", (int)getpid(),
          loading);
      raise(SIGKILL);
    }
  }
  hixl_kv_ids s = {0}, rv = {0};
  hixl_kv_status st = x->ops->get_finished(x->worker, NULL, &s, &rv);
  if (st != HIXL_KV_SUCCESS) {
    say(x, "get_finished failed (%s): %s", mh_status_name(st), x->ops->last_error());
    return;
  }
  uint64_t t_held = mh_now_ns();
  /* After get_finished: a request it lists has its error blocks in here already. */
  hixl_kv_blocks eb = {0};
  if ((st = x->ops->get_block_ids_with_load_errors(x->worker, &eb)) != HIXL_KV_SUCCESS) {
    say(x, "get_block_ids_with_load_errors failed (%s): %s", mh_status_name(st), x->ops->last_error());
  } else {
    for (size_t k = 0; k < eb.count; k++) {
      uint64_t b = eb.ids[k];
      uint32_t owner = b < x->cache.m.num_blocks ? x->cache.owner[b] : 0;
      size_t i = 0;
      while (i < x->n && !(owner && x->v[i]->idx == owner - 1 && x->v[i]->loading)) i++;
      if (i == x->n)
        say(x, "get_block_ids_with_load_errors reported block %" PRIu64 ", which no loading request holds",
            b);
      else
        x->v[i]->load_errors++;
    }
    x->ops->free_buffer(&eb.raw);
  }
  /* Tell the scheduler what the worker reported: finished, and which of them failed. */
  const char **failed = calloc(rv.count ? rv.count : 1, sizeof(*failed));
  hixl_kv_ids fids = {failed, 0};
  for (size_t k = 0; failed && k < rv.count; k++) {
    size_t i = req_find(x, rv.ids[k]);
    if (i != SIZE_MAX && x->v[i]->load_errors) failed[fids.count++] = rv.ids[k];
  }
  if (HAS(x, update_connector_output) && (s.count || rv.count)) {
    st = x->ops->update_connector_output(x->sched, &s, &rv, &fids);
    if (st != HIXL_KV_SUCCESS)
      say(x, "update_connector_output failed (%s): %s", mh_status_name(st), x->ops->last_error());
  }
  free(failed);
  for (size_t k = 0; k < rv.count; k++) {
    size_t i = req_find(x, rv.ids[k]);
    if (i == SIZE_MAX || !x->v[i]->loading) {
      say(x, "get_finished reported %s finished receiving, a request this decode is not loading", rv.ids[k]);
      continue;
    }
    struct ireq *r = x->v[i];
    char why[512];
    if (r->aborted) { /* received (or failed): only now do its blocks go back */
      done(x, i, MH_FAILED, t_held, "aborted by its client while its KV loaded (%" PRIu64 " load errors)",
           r->load_errors);
      continue;
    }
    if (r->load_errors) {
      snprintf(why, sizeof(why),
               "KV load failed (%" PRIu64 " of its %" PRIu64
               " blocks reported by get_block_ids_with_load_errors)",
               r->load_errors, r->nblocks);
      hixl_kv_request q = hreq(r);
      int64_t tokens = -2;
      int32_t async = 0;
      st = x->ops->get_num_new_matched_tokens(x->sched, &q, 0, &tokens, &async);
      if (st != HIXL_KV_SUCCESS)
        done(x, i, MH_FAILED, t_held, "%s; failed as configured: %s", why, x->ops->last_error());
      else if (tokens == 0)
        recompute(x, i, t_held, why);
      else
        done(x, i, MH_FAILED, t_held,
             "%s; the connector then matched %" PRId64 " tokens again (want 0 or FAILED)", why, tokens);
      continue;
    }
    r->loading = false; /* held now: checked a few layers a step, so get_finished is polled meanwhile */
    r->verifying = true;
    r->t_held = t_held;
  }
  x->ops->free_ids(&s);
  x->ops->free_ids(&rv);
  verify_some(x, 64ull << 20);
}

/* ---- the process ---- */

static int handle_frame(struct inst *x, uint8_t type, struct mh_in *in) {
  if (type == MH_EXIT && mh_in_done(in)) {
    x->exiting = true;
    x->drain_end_ns = mh_now_ns() + (uint64_t)x->a->drain_ms * 1000000ull;
    return 0;
  }
  if ((type == MH_REQ && x->a->prefill) || (type == MH_LOAD && !x->a->prefill)) {
    uint32_t idx = mh_get_u32(in);
    uint64_t seed = mh_get_u64(in), prompt = mh_get_u64(in);
    size_t plen = 0;
    const char *params = mh_get_str(in, &plen);
    if (!mh_in_done(in) || prompt == 0 || mh_request_blocks(&x->a->model, prompt) > x->a->model.num_blocks) {
      say(x, "malformed or impossible request frame from the router (prompt %" PRIu64 ")", prompt);
      return -1;
    }
    if (!req_add(x, idx, seed, prompt, params, plen)) send_fail(x, idx, "%s: out of memory", x->who);
    return 0;
  }
  say(x, "unexpected frame type %u from the router", type);
  return -1;
}

static void side_report(struct inst *x) {
  struct mh_side s = {.blocks_total = x->cache.m.num_blocks, .blocks_free = x->cache.nfree};
  s.requests_left = (uint32_t)x->n;
  s.stats_ok = HAS(x, get_stats) && x->ops->get_stats(x->worker, &s.ks) == HIXL_KV_SUCCESS;
  mh_obs_tick(x->ops, x->worker, x->conn.fd, x->a->metrics,
              true); /* before the report: the router has them */
  struct mh_out o = {0};
  mh_put_side(&o, &s);
  mh_send(x->conn.fd, MH_STATS, &o);
}

int mh_instance_main(const struct mh_inst_args *a) {
  struct inst x = {.a = a, .ops = a->ops, .who = a->prefill ? "prefill" : "decode"};
  char err[512] = "";
  int rc = 1;
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the router */
  fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) | O_NONBLOCK);
  mh_conn_init(&x.conn, a->fd);
  size_t clen = strlen(a->config);
  hixl_kv_status st =
      x.ops->create(a->config, clen, HIXL_KV_ROLE_SCHEDULER, 0, 1, &x.sched, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    send_fail(&x, MH_NO_REQUEST, "%s: create(scheduler) failed (%s): %s", x.who, mh_status_name(st), err);
    goto fail_sched;
  }
  if (mh_cache_init(&x.cache, &a->model) < 0) {
    send_fail(&x, MH_NO_REQUEST, "%s: cannot allocate its KV cache's block tables", x.who);
    goto fail_cache;
  }
  st = x.ops->create(a->config, clen, HIXL_KV_ROLE_WORKER, 0, 1, &x.worker, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    send_fail(&x, MH_NO_REQUEST, "%s: create(worker, rank 0 of 1) failed (%s): %s", x.who, mh_status_name(st),
              err);
    goto fail_worker;
  }
  if (mh_cache_attach(&x.cache, x.ops, x.worker, a->host_memory, x.who, err, sizeof(err)) < 0) {
    send_fail(&x, MH_NO_REQUEST, "%s: %s", x.who, err);
    goto fail_register;
  }
  if (a->verbose) mh_cache_describe(&x.cache, x.who);
  struct mh_out o = {0};
  mh_put_u32(&o, (uint32_t)a->model.num_blocks);
  mh_send(a->fd, MH_READY, &o);

  /* Decode also wakes when a load ended (ABI 1.2's event fd), not only at its next step:
   * its step polls get_finished, which quiets the fd. */
  int32_t efd = -1; /* written only on success */
  if (!a->prefill && HIXL_KV_HAS_OP(x.ops, get_event_fd)) x.ops->get_event_fd(x.worker, &efd);
  for (;;) {
    struct pollfd pfd[2] = {{a->fd, POLLIN, 0}, {efd, POLLIN, 0}};
    poll(pfd, efd >= 0 ? 2 : 1, x.n || x.exiting ? 1 : 20);
    if (mh_conn_fill(&x.conn) < 0 && !x.conn.eof) break;
    uint8_t type;
    struct mh_in in;
    int got;
    while ((got = mh_conn_next(&x.conn, &type, &in)) > 0)
      if (handle_frame(&x, type, &in) < 0) goto out;
    if (got < 0) goto out;
    if (x.conn.eof) {
      say(&x, "the router went away; exiting");
      goto out;
    }
    if (a->prefill)
      prefill_step(&x);
    else
      decode_step(&x);
    meta_clear(&x);
    mh_obs_tick(x.ops, x.worker, a->fd, a->metrics, false);
    if (x.exiting && (x.n == 0 || mh_now_ns() >= x.drain_end_ns)) {
      if (x.n) say(&x, "%zu requests still tracked after draining %u ms", x.n, a->drain_ms);
      side_report(&x);
      rc = 0;
      break;
    }
  }
out:
  while (x.n) req_drop(&x, x.n - 1);
  free(x.v);
fail_register:
  x.ops->destroy(x.worker); /* before the memory it registered goes */
fail_worker:
  mh_cache_fini(&x.cache);
fail_cache:
  x.ops->destroy(x.sched);
fail_sched:
  mh_conn_fini(&x.conn);
  return rc;
}
