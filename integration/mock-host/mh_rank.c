/* mh_rank: one worker rank of an instance, as a vLLM worker process holds it: its
 * worker connector (rank r of the instance's TP size, its engine on the config's port
 * + r), the KV memory of its heads, and what it does when the scheduler's step reaches
 * it: bind the step's metadata, run the forward pass (compute its heads of each layer,
 * save_kv_layer, wait_for_save), report get_finished and its load errors, check a
 * request's KV. With TP 1 the instance calls these in its own process; with more, each
 * rank is a process of its own (mh_rank_main) that the instance drives over a socket
 * pair, one request and one answer at a time (mh_wire.c's frames). */
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

static void say(const struct mh_rank *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const struct mh_rank *k, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", k->who, line);
}

static bool has(const struct mh_rank *k, size_t off, size_t size) { return k->ops->size >= off + size; }
#define HAS(k, op) has((k), offsetof(hixl_kv_ops, op), sizeof((k)->ops->op))

int mh_rank_open(struct mh_rank *k, const struct mh_inst_args *a, uint32_t rank, char *err, size_t cap) {
  const char *side = a->prefill ? "prefill" : "decode";
  char why[512] = "";
  memset(k, 0, sizeof(*k));
  k->a = a;
  k->ops = a->ops;
  k->rank = rank;
  if (a->tp > 1)
    snprintf(k->who, sizeof(k->who), "%s rank %u", side, rank);
  else
    snprintf(k->who, sizeof(k->who), "%s", side);
  /* mismatch-heads: a decode rank that checks another rank's heads stands for a plugin
   * that gave it the wrong head slice: the check must catch every request. */
  bool swap = a->fault == MH_FAULT_MISMATCH_HEADS && !a->prefill;
  struct mh_model m = mh_rank_model(&a->model, swap ? a->tp - 1 - rank : rank, a->tp);
  if (mh_cache_init(&k->cache, &m) < 0) {
    snprintf(err, cap, "%s: cannot allocate its KV cache's block tables", k->who);
    return -1;
  }
  hixl_kv_status st = k->ops->create(a->config, strlen(a->config), HIXL_KV_ROLE_WORKER, rank, a->tp,
                                     &k->worker, why, sizeof(why));
  if (st != HIXL_KV_SUCCESS) {
    snprintf(err, cap, "%s: create(worker, rank %u of %u) failed (%s): %s", k->who, rank, a->tp,
             mh_status_name(st), why);
    mh_cache_fini(&k->cache);
    return -1;
  }
  if (mh_cache_attach(&k->cache, k->ops, k->worker, a->host_memory, a->dev, k->who, why, sizeof(why)) < 0) {
    snprintf(err, cap, "%s: %s", k->who, why);
    k->ops->destroy(k->worker); /* before the memory it registered goes */
    mh_cache_fini(&k->cache);
    return -1;
  }
  if (a->verbose) mh_cache_describe(&k->cache, k->who);
  return 0;
}

void mh_rank_close(struct mh_rank *k) {
  k->ops->destroy(k->worker); /* before the memory it registered goes */
  mh_cache_fini(&k->cache);
}

void mh_rank_meta(struct mh_rank *k, const uint8_t *meta, size_t len) {
  hixl_kv_status st = k->ops->bind_connector_meta(k->worker, meta, len);
  if (st != HIXL_KV_SUCCESS)
    say(k, "bind_connector_meta of %zu bytes failed (%s): %s", len, mh_status_name(st), k->ops->last_error());
  else if ((st = k->ops->start_load_kv(k->worker)) != HIXL_KV_SUCCESS)
    say(k, "start_load_kv failed (%s): %s", mh_status_name(st), k->ops->last_error());
}

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

uint64_t mh_rank_forward(struct mh_rank *k, const struct mh_work *w, size_t n) {
  const struct mh_model *m = &k->cache.m;
  uint64_t batch_tokens = 0;
  for (size_t i = 0; i < n; i++) batch_tokens += w[i].prompt;
  /* Layer by layer over the batch, each layer saved as it ends. */
  for (uint32_t l = 0; l < m->layers; l++) {
    hixl_kv_status ws = k->ops->wait_for_layer_load(k->worker, l); /* as every forward pass does */
    if (ws != HIXL_KV_SUCCESS)
      say(k, "wait_for_layer_load(%u) failed (%s): %s", l, mh_status_name(ws), k->ops->last_error());
    for (size_t i = 0; i < n; i++) {
      char why[256];
      mh_compute_layer(&k->cache, w[i].seed, l, w[i].blocks, w[i].prompt);
      if (mh_cache_mirror(&k->cache, w[i].blocks, w[i].prompt, l, 1, true, why, sizeof(why)) < 0)
        say(k, "layer %u to device memory: %s", l, why);
    }
    if (k->a->compute_us_per_token) sleep_us((uint64_t)k->a->compute_us_per_token * batch_tokens);
    hixl_kv_status st = k->ops->save_kv_layer(k->worker, l);
    if (st != HIXL_KV_SUCCESS)
      say(k, "save_kv_layer(%u) failed (%s): %s", l, mh_status_name(st), k->ops->last_error());
  }
  uint64_t t_saved = mh_now_ns(); /* the last layer is computed: the hand-off starts */
  hixl_kv_status st = k->ops->wait_for_save(k->worker);
  if (st != HIXL_KV_SUCCESS)
    say(k, "wait_for_save failed (%s): %s", mh_status_name(st), k->ops->last_error());
  return t_saved;
}

void mh_rank_report_free(struct mh_rank_report *r) {
  for (size_t i = 0; i < r->nsent; i++) free(r->sent[i]);
  for (size_t i = 0; i < r->nrecv; i++) free(r->recv[i]);
  free(r->sent);
  free(r->recv);
  free(r->err);
  memset(r, 0, sizeof(*r));
}

static bool ids_copy(const hixl_kv_ids *ids, char ***out, size_t *n) {
  *n = 0;
  if (!(*out = calloc(ids->count ? ids->count : 1, sizeof(**out)))) return false;
  for (size_t i = 0; i < ids->count; i++)
    if (!((*out)[(*n)++] = strdup(ids->ids[i]))) return false;
  return true;
}

int mh_rank_finished(struct mh_rank *k, struct mh_rank_report *rep) {
  memset(rep, 0, sizeof(*rep));
  hixl_kv_ids s = {0}, rv = {0};
  hixl_kv_status st = k->ops->get_finished(k->worker, NULL, &s, &rv);
  if (st != HIXL_KV_SUCCESS) {
    say(k, "get_finished failed (%s): %s", mh_status_name(st), k->ops->last_error());
    return -1;
  }
  bool ok = ids_copy(&s, &rep->sent, &rep->nsent) && ids_copy(&rv, &rep->recv, &rep->nrecv);
  k->ops->free_ids(&s);
  k->ops->free_ids(&rv);
  /* After get_finished: a request it lists has its error blocks in here already. */
  hixl_kv_blocks eb = {0};
  if ((st = k->ops->get_block_ids_with_load_errors(k->worker, &eb)) != HIXL_KV_SUCCESS) {
    say(k, "get_block_ids_with_load_errors failed (%s): %s", mh_status_name(st), k->ops->last_error());
  } else {
    if (eb.count && (rep->err = malloc(eb.count * sizeof(*rep->err)))) {
      memcpy(rep->err, eb.ids, eb.count * sizeof(*rep->err));
      rep->nerr = eb.count;
    } else if (eb.count) {
      ok = false;
    }
    k->ops->free_buffer(&eb.raw);
  }
  if (!ok) say(k, "out of memory copying what get_finished reported");
  return ok ? 0 : -1;
}

uint64_t mh_rank_verify(struct mh_rank *k, const struct mh_work *w, uint32_t first, uint32_t nlayers,
                        bool compute, char *where, size_t cap) {
  for (uint32_t l = first; compute && l < first + nlayers && l < k->cache.m.layers; l++)
    mh_compute_layer(&k->cache, w->seed, l, w->blocks, w->prompt);
  /* Device memory: what the plugin loaded there (or what was computed here, as a
   * runtime's kernels write it) is what is checked. */
  if (mh_cache_mirror(&k->cache, w->blocks, w->prompt, first, nlayers, compute, where, cap) < 0)
    return 1; /* where says why */
  return mh_verify(&k->cache, w->seed, w->blocks, w->prompt, first, nlayers, where, cap);
}

void mh_rank_clear(struct mh_rank *k) {
  if (!HAS(k, clear_connector_meta)) return;
  hixl_kv_status st = k->ops->clear_connector_meta(k->worker);
  if (st != HIXL_KV_SUCCESS)
    say(k, "clear_connector_meta failed (%s): %s", mh_status_name(st), k->ops->last_error());
}

bool mh_rank_stats(struct mh_rank *k, hixl_kv_stats *s) {
  memset(s, 0, sizeof(*s));
  return HAS(k, get_stats) && k->ops->get_stats(k->worker, s) == HIXL_KV_SUCCESS;
}

/* ---- a rank's own process ---- */

/* A work item the instance sent, checked against this rank's cache before any byte of
 * it is touched. */
static bool work_ok(const struct mh_rank *k, const struct mh_work *w) {
  const struct mh_model *m = &k->cache.m;
  if (w->prompt == 0 || w->nblocks != mh_request_blocks(m, w->prompt)) return false;
  for (uint64_t i = 0; i < w->nblocks; i++)
    if (w->blocks[i] >= m->num_blocks) return false;
  return true;
}

static void send_fail(int fd, const char *why) {
  struct mh_out o = {0};
  mh_put_u32(&o, MH_NO_REQUEST);
  mh_put_str(&o, why, strlen(why));
  mh_send(fd, MH_FAIL, &o);
}

/* One request from the instance, answered; -1 when it is malformed (the rank stops),
 * 1 after EXIT's answer. */
static int serve(struct mh_rank *k, int fd, uint8_t type, struct mh_in *in) {
  struct mh_out o = {0};
  if (type == MH_RK_META) {
    size_t n = 0;
    const char *meta = mh_get_str(in, &n);
    uint8_t die = mh_get_u8(in);
    if (!mh_in_done(in)) return -1;
    mh_rank_meta(k, (const uint8_t *)meta, n);
    if (die) {
      say(k, "fault decode-rank-dies: killing this rank's process (pid %d) with its loads just started",
          (int)getpid());
      raise(SIGKILL);
    }
    return mh_send(fd, MH_RK_OK, &o) < 0 ? -1 : 0;
  }
  if (type == MH_RK_FORWARD) {
    uint32_t n = mh_get_u32(in);
    if (in->bad || n > (in->len - in->off) / 20) return -1; /* a work item is 20 bytes at least */
    struct mh_work *w = calloc(n ? n : 1, sizeof(*w));
    uint64_t **b = calloc(n ? n : 1, sizeof(*b));
    bool ok = w && b;
    for (uint32_t i = 0; ok && i < n; i++) ok = mh_get_work(in, &w[i], &b[i]) && work_ok(k, &w[i]);
    ok = ok && mh_in_done(in);
    uint64_t t_saved = ok ? mh_rank_forward(k, w, n) : 0;
    for (uint32_t i = 0; b && i < n; i++) free(b[i]);
    free(b);
    free(w);
    if (!ok) return -1;
    mh_put_u64(&o, t_saved);
    return mh_send(fd, MH_RK_OK, &o) < 0 ? -1 : 0;
  }
  if (type == MH_RK_FINISHED) {
    struct mh_rank_report rep;
    if (!mh_in_done(in)) return -1;
    mh_rank_finished(k, &rep); /* what it got, even after a failure (said) */
    mh_put_u32(&o, (uint32_t)rep.nsent);
    for (size_t i = 0; i < rep.nsent; i++) mh_put_str(&o, rep.sent[i], strlen(rep.sent[i]));
    mh_put_u32(&o, (uint32_t)rep.nrecv);
    for (size_t i = 0; i < rep.nrecv; i++) mh_put_str(&o, rep.recv[i], strlen(rep.recv[i]));
    mh_put_u32(&o, (uint32_t)rep.nerr);
    for (size_t i = 0; i < rep.nerr; i++) mh_put_u64(&o, rep.err[i]);
    mh_rank_report_free(&rep);
    return mh_send(fd, MH_RK_REPORT, &o) < 0 ? -1 : 0;
  }
  if (type == MH_RK_VERIFY) {
    struct mh_work w;
    uint64_t *b = NULL;
    bool ok = mh_get_work(in, &w, &b);
    uint32_t first = mh_get_u32(in), nl = mh_get_u32(in);
    uint8_t compute = mh_get_u8(in);
    char where[256] = "";
    ok = ok && mh_in_done(in) && work_ok(k, &w) && first < k->cache.m.layers && compute <= 1;
    uint64_t bad = ok ? mh_rank_verify(k, &w, first, nl, compute, where, sizeof(where)) : 0;
    free(b);
    if (!ok) return -1;
    mh_put_u64(&o, bad);
    mh_put_str(&o, where, strlen(where));
    return mh_send(fd, MH_RK_VERIFIED, &o) < 0 ? -1 : 0;
  }
  if (type == MH_RK_CLEAR && mh_in_done(in)) {
    mh_rank_clear(k);
    return mh_send(fd, MH_RK_OK, &o) < 0 ? -1 : 0;
  }
  if (type == MH_RK_EXIT && mh_in_done(in)) {
    hixl_kv_stats s;
    mh_put_u8(&o, mh_rank_stats(k, &s));
    mh_put_stats(&o, &s);
    mh_send(fd, MH_RK_STATS, &o);
    return 1;
  }
  return -1;
}

int mh_rank_main(const struct mh_inst_args *a, uint32_t rank, int fd) {
  struct mh_rank k;
  struct mh_conn conn;
  char err[1024] = "";
  int rc = 1;
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the instance */
  mh_conn_init(&conn, fd);
  if (mh_rank_open(&k, a, rank, err, sizeof(err)) < 0) {
    send_fail(fd, err);
    goto fail_open;
  }
  /* A decode rank's event fd goes to the instance, which waits on it between steps. */
  int32_t efd = -1; /* written only on success */
  if (!a->prefill && HAS(&k, get_event_fd)) k.ops->get_event_fd(k.worker, &efd);
  struct mh_out o = {0};
  mh_put_u8(&o, efd >= 0);
  if (mh_send_fd(fd, MH_RK_READY, &o, efd) < 0) goto out;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  for (;;) { /* the instance's requests, one at a time: nothing happens here in between */
    struct pollfd p = {fd, POLLIN, 0};
    poll(&p, 1, -1);
    if (mh_conn_fill(&conn) < 0 && !conn.eof) break;
    uint8_t type;
    struct mh_in in;
    int got, done = 0;
    while (done == 0 && (got = mh_conn_next(&conn, &type, &in)) > 0) {
      if ((done = serve(&k, fd, type, &in)) < 0)
        say(&k, "malformed request (type %u) from its instance", type);
    }
    if (done == 1) {
      rc = 0;
      break;
    }
    if (done < 0 || got < 0) break;
    if (conn.eof) break; /* the instance went away */
  }
out:
  mh_rank_close(&k);
fail_open:
  mh_conn_fini(&conn);
  return rc;
}
