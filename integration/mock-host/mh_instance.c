/* mh_instance: one serving instance (prefill or decode) in its own process: a
 * scheduler connector and its worker ranks (mh_rank.c; TP 1: one, in this process;
 * more: one process each, forked here) that talk only through the bytes of
 * build_connector_meta -> bind_connector_meta, a block allocator with a free list (one
 * block table for every rank, as vLLM's scheduler keeps it), and a step loop, as a vLLM
 * engine core runs them. Each step's metadata goes to every rank; what the ranks
 * report comes back and is aggregated as vLLM's KVOutputAggregator does: a request is
 * finished sending (receiving) once every rank has reported it, and its load-error
 * blocks are the union of every rank's. A rank that is gone fails every request it had
 * not reported. */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
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
  uint32_t smask;       /* ranks whose get_finished reported it finished sending */
  uint32_t rmask;       /* ... finished receiving */
  bool rank_lost;       /* a rank went away before it reported the request */
  uint64_t t_arrived;   /* decode: when the router's frame came (--queue-ms counts from it) */
  bool announced;       /* decode: on_new_request took it (its hold is renewed until it finishes) */
};

/* A worker rank in a process of its own (TP > 1), as the instance sees it. */
struct rk {
  pid_t pid;
  struct mh_conn conn;
  bool dead;
  int wstatus;
  int efd; /* its worker's event fd, passed over the socket; -1: none */
  struct mh_side_rank s;
};

struct inst {
  const struct mh_inst_args *a;
  const hixl_kv_ops *ops;
  const char *who;
  hixl_kv_connector *sched;
  struct mh_cache cache; /* the block allocator; the KV memory is the ranks' */
  uint32_t tp;
  struct mh_rank local; /* TP 1: the one rank, in this process */
  struct rk rk[MH_MAX_TP];
  uint32_t all_mask, dead_mask; /* the ranks; those gone */
  uint32_t twice;               /* a rank reported a request finished twice (the run fails) */
  bool rank_killed;             /* fault decode-rank-dies: done */
  uint8_t *errblk;              /* per block: some rank reported it in get_block_ids_with_load_errors */
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
  for (uint64_t k = 0; r->blocks && k < r->nblocks; k++)
    if (r->blocks[k] < x->cache.m.num_blocks) x->errblk[r->blocks[k]] = 0;
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
  size_t ng = mh_num_groups(&x->a->model);
  q.flags = flags;
  if (ng == 1)
    return x->ops->request_finished(x->sched, &q, r->blocks, r->blocks ? r->nblocks : 0, delay, params);
  if (!HAS(x, request_finished_groups)) return HIXL_KV_UNSUPPORTED;
  if (r->blocks)
    ng = group_ids(x, r, g);
  else /* never allocated: an empty list each group */
    for (size_t k = 0; k < ng; k++) g[k] = (hixl_kv_block_ids){NULL, 0};
  return x->ops->request_finished_groups(x->sched, &q, g, ng, delay, params);
}

/* ---- the ranks: in this process (TP 1), else one process each, one request and one
 * answer at a time over its socket pair ---- */

/* Rank r is gone (it died, or spoke out of turn): reap it; every request it has not
 * reported counts as failed by it (agg_finished). */
static void rk_lost(struct inst *x, uint32_t r, const char *what) {
  struct rk *k = &x->rk[r];
  if (k->dead) return;
  k->dead = true;
  x->dead_mask |= 1u << r;
  if (waitpid(k->pid, &k->wstatus, WNOHANG) != k->pid) {
    kill(k->pid, SIGKILL);
    waitpid(k->pid, &k->wstatus, 0);
  }
  close(k->conn.fd);
  if (k->efd >= 0) close(k->efd);
  k->efd = -1;
  say(x, "rank %u (pid %d) is gone (%s; %s %d): the requests it has not reported fail", r, (int)k->pid, what,
      WIFSIGNALED(k->wstatus) ? "killed by signal" : "exit status",
      WIFSIGNALED(k->wstatus) ? WTERMSIG(k->wstatus) : WEXITSTATUS(k->wstatus));
}

static void rk_send(struct inst *x, uint32_t r, uint8_t type, struct mh_out *o) {
  if (x->rk[r].dead) {
    free(o->p);
    memset(o, 0, sizeof(*o));
    return;
  }
  if (mh_send(x->rk[r].conn.fd, type, o) < 0) rk_lost(x, r, "its socket closed");
}

/* Rank r's answer, of type want: 0 and its payload (valid until the next call for r),
 * or -1 when the rank is gone or answered anything else (then it is stopped). */
static int rk_wait(struct inst *x, uint32_t r, uint8_t want, struct mh_in *in, int *efd) {
  struct rk *k = &x->rk[r];
  for (;;) {
    if (k->dead) return -1;
    uint8_t type;
    int got = mh_conn_next(&k->conn, &type, in);
    if (got > 0 && type == want) return 0;
    if (got > 0 && type == MH_FAIL) { /* it could not start: why goes to the router */
      size_t n = 0;
      uint32_t idx = mh_get_u32(in);
      const char *why = mh_get_str(in, &n);
      if (mh_in_done(in) && idx == MH_NO_REQUEST) send_fail(x, MH_NO_REQUEST, "%.*s", (int)n, why);
      rk_lost(x, r, "it could not start");
      return -1;
    }
    if (got != 0) {
      rk_lost(x, r, got > 0 ? "it answered out of turn" : "a malformed frame");
      return -1;
    }
    if (k->conn.eof) {
      rk_lost(x, r, "its socket closed");
      return -1;
    }
    struct pollfd p = {k->conn.fd, POLLIN, 0};
    poll(&p, 1, -1);
    if (mh_conn_fill_fd(&k->conn, efd) < 0 && !k->conn.eof) k->conn.eof = true;
  }
}

/* Answers that carry nothing must be empty. */
static void rk_wait_ok(struct inst *x, uint32_t r) {
  struct mh_in in;
  if (rk_wait(x, r, MH_RK_OK, &in, NULL) == 0 && !mh_in_done(&in)) rk_lost(x, r, "a malformed answer");
}

/* Fork rank r's process; -1 (said) when it cannot be. */
static int rk_start(struct inst *x, uint32_t r) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    send_fail(x, MH_NO_REQUEST, "%s: socketpair for rank %u: %m", x->who, r);
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    send_fail(x, MH_NO_REQUEST, "%s: fork of rank %u: %m", x->who, r);
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  if (pid == 0) {
    close(sv[0]);
    close(x->a->fd); /* the router's: only the instance speaks to it */
    for (uint32_t j = 0; j < r; j++) close(x->rk[j].conn.fd);
    exit(mh_rank_main(x->a, r, sv[1])); /* exit, not _exit: a sanitizer build checks the rank for leaks */
  }
  close(sv[1]);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  x->rk[r].pid = pid;
  mh_conn_init(&x->rk[r].conn, sv[0]);
  return 0;
}

/* One step of connector metadata: the scheduler's bytes, bound by every rank (vLLM
 * broadcasts SchedulerOutput); die: the rank that kills itself once its loads started
 * (fault decode-rank-dies), else UINT32_MAX. */
static void meta_step(struct inst *x, uint32_t die) {
  hixl_kv_buffer m = {0};
  hixl_kv_status st = x->ops->build_connector_meta(x->sched, &m);
  if (st != HIXL_KV_SUCCESS) {
    say(x, "build_connector_meta failed (%s): %s", mh_status_name(st), x->ops->last_error());
    return;
  }
  if (x->tp == 1) {
    mh_rank_meta(&x->local, m.data, m.len);
  } else {
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_out o = {0};
      mh_put_str(&o, m.data, m.len);
      mh_put_u8(&o, r == die);
      rk_send(x, r, MH_RK_META, &o);
    }
    for (uint32_t r = 0; r < x->tp; r++) rk_wait_ok(x, r);
  }
  x->ops->free_buffer(&m);
}

/* The worker's metadata is done with at the end of the step (vLLM: after the forward). */
static void meta_clear(struct inst *x) {
  if (x->tp == 1) {
    mh_rank_clear(&x->local);
    return;
  }
  for (uint32_t r = 0; r < x->tp; r++) {
    struct mh_out o = {0};
    rk_send(x, r, MH_RK_CLEAR, &o);
  }
  for (uint32_t r = 0; r < x->tp; r++) rk_wait_ok(x, r);
}

static struct mh_work work_of(const struct ireq *r) {
  return (struct mh_work){r->seed, r->prompt, r->blocks, r->nblocks};
}

/* The forward pass over the batch on every rank; when the last rank saved its last layer. */
static uint64_t forward(struct inst *x, struct ireq **batch, size_t nb) {
  struct mh_work *w = malloc((nb ? nb : 1) * sizeof(*w));
  uint64_t t_saved = 0;
  if (!w) {
    say(x, "out of memory for a batch of %zu", nb);
    return mh_now_ns();
  }
  for (size_t k = 0; k < nb; k++) w[k] = work_of(batch[k]);
  if (x->tp == 1) {
    t_saved = mh_rank_forward(&x->local, w, nb);
  } else {
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_out o = {0};
      mh_put_u32(&o, (uint32_t)nb);
      for (size_t k = 0; k < nb; k++) mh_put_work(&o, &w[k]);
      rk_send(x, r, MH_RK_FORWARD, &o);
    }
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_in in;
      if (rk_wait(x, r, MH_RK_OK, &in, NULL) < 0) continue;
      uint64_t t = mh_get_u64(&in);
      if (!mh_in_done(&in))
        rk_lost(x, r, "a malformed answer");
      else if (t > t_saved)
        t_saved = t;
    }
  }
  free(w);
  return t_saved ? t_saved : mh_now_ns();
}

/* Bytes of request r's KV in layers [first, first + n) that are wrong, over every
 * rank's heads (compute: each rank computes them first, as a recompute); lost: a rank
 * is gone, so some heads could not be checked. */
static uint64_t check(struct inst *x, const struct ireq *r, uint32_t first, uint32_t n, bool compute,
                      char *where, size_t cap, bool *lost) {
  struct mh_work w = work_of(r);
  uint64_t bad = 0;
  *lost = x->dead_mask != 0;
  if (x->tp == 1) return mh_rank_verify(&x->local, &w, first, n, compute, where, cap);
  for (uint32_t k = 0; k < x->tp; k++) {
    struct mh_out o = {0};
    mh_put_work(&o, &w);
    mh_put_u32(&o, first);
    mh_put_u32(&o, n);
    mh_put_u8(&o, compute);
    rk_send(x, k, MH_RK_VERIFY, &o);
  }
  for (uint32_t k = 0; k < x->tp; k++) {
    struct mh_in in;
    if (rk_wait(x, k, MH_RK_VERIFIED, &in, NULL) < 0) {
      *lost = true;
      continue;
    }
    uint64_t b = mh_get_u64(&in);
    size_t wn = 0;
    const char *wh = mh_get_str(&in, &wn);
    if (!mh_in_done(&in)) {
      rk_lost(x, k, "a malformed answer");
      *lost = true;
      continue;
    }
    if (b && where[0] == '\0') snprintf(where, cap, "rank %u: %.*s", k, (int)wn, wh);
    bad += b;
  }
  return bad;
}

/* A rank's report of one step, into the requests it names. */
static void agg_report(struct inst *x, uint32_t r, const struct mh_rank_report *rep) {
  for (size_t k = 0; k < rep->nsent; k++) {
    size_t i = req_find(x, rep->sent[k]);
    if (i == SIZE_MAX || (x->a->prefill && !x->v[i]->blocks)) {
      if (x->a->prefill)
        say(x, "get_finished reported %s finished sending, a request this prefill does not hold",
            rep->sent[k]);
      continue;
    }
    if (x->v[i]->smask & (1u << r)) {
      say(x, "rank %u reported %s finished sending twice", r, rep->sent[k]);
      x->twice++;
    }
    x->v[i]->smask |= 1u << r;
  }
  for (size_t k = 0; k < rep->nrecv; k++) {
    size_t i = req_find(x, rep->recv[k]);
    if (i == SIZE_MAX || !x->v[i]->loading) {
      say(x, "get_finished reported %s finished receiving, a request this %s is not loading", rep->recv[k],
          x->who);
      continue;
    }
    if (x->v[i]->rmask & (1u << r)) {
      say(x, "rank %u reported %s finished receiving twice", r, rep->recv[k]);
      x->twice++;
    }
    x->v[i]->rmask |= 1u << r;
  }
  for (size_t k = 0; k < rep->nerr; k++) {
    uint64_t b = rep->err[k];
    uint32_t owner = b < x->cache.m.num_blocks ? x->cache.owner[b] : 0;
    size_t i = 0;
    while (i < x->n && !(owner && x->v[i]->idx == owner - 1 && x->v[i]->loading)) i++;
    if (i == x->n)
      say(x, "get_block_ids_with_load_errors reported block %" PRIu64 ", which no loading request holds", b);
    else if (!x->errblk[b]) { /* the union over the ranks */
      x->errblk[b] = 1;
      x->v[i]->load_errors++;
    }
  }
}

/* Every rank's get_finished and load errors, aggregated: the requests every rank has
 * now reported finished sending (sent) and receiving (recv), each once; a rank that is
 * gone counts as having reported (rank_lost: failed). -1 when nothing could be asked. */
static int finished(struct inst *x, struct ireq ***sent, size_t *ns, struct ireq ***recv, size_t *nr) {
  *ns = *nr = 0;
  if (x->tp == 1) {
    struct mh_rank_report rep;
    if (mh_rank_finished(&x->local, &rep) < 0) {
      mh_rank_report_free(&rep);
      return -1;
    }
    agg_report(x, 0, &rep);
    mh_rank_report_free(&rep);
  } else {
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_out o = {0};
      rk_send(x, r, MH_RK_FINISHED, &o);
    }
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_in in;
      struct mh_rank_report rep = {0};
      if (rk_wait(x, r, MH_RK_REPORT, &in, NULL) < 0) continue;
      bool ok = true;
      for (int list = 0; list < 2 && ok; list++) {
        uint32_t n = mh_get_u32(&in);
        char ***ids = list ? &rep.recv : &rep.sent;
        size_t *cnt = list ? &rep.nrecv : &rep.nsent;
        ok = !in.bad && n <= (in.len - in.off) / 4 && (*ids = calloc(n ? n : 1, sizeof(**ids)));
        for (uint32_t k = 0; ok && k < n; k++) {
          size_t len = 0;
          const char *id = mh_get_str(&in, &len);
          ok = !in.bad && len < 64 && ((*ids)[(*cnt)++] = strndup(id, len));
        }
      }
      uint32_t ne = ok ? mh_get_u32(&in) : 0;
      ok = ok && !in.bad && ne <= (in.len - in.off) / 8 && (rep.err = calloc(ne ? ne : 1, sizeof(*rep.err)));
      for (uint32_t k = 0; ok && k < ne; k++) rep.err[rep.nerr++] = mh_get_u64(&in);
      if (ok && mh_in_done(&in))
        agg_report(x, r, &rep);
      else
        rk_lost(x, r, "a malformed report");
      mh_rank_report_free(&rep);
    }
  }
  *sent = calloc(x->n ? x->n : 1, sizeof(**sent));
  *recv = calloc(x->n ? x->n : 1, sizeof(**recv));
  if (!*sent || !*recv) {
    free(*sent);
    free(*recv);
    say(x, "out of memory aggregating what the ranks reported");
    return -1;
  }
  for (size_t i = 0; i < x->n; i++) {
    struct ireq *r = x->v[i];
    bool sending = x->a->prefill ? r->blocks != NULL : r->smask != 0;
    if (sending && (r->smask | x->dead_mask) == x->all_mask) {
      (*sent)[(*ns)++] = r;
      r->smask = 0;
    }
    if (r->loading && (r->rmask | x->dead_mask) == x->all_mask) {
      r->rank_lost = (x->dead_mask & ~r->rmask) != 0;
      (*recv)[(*nr)++] = r;
      r->rmask = 0;
    }
  }
  return 0;
}

/* ---- prefill ---- */

/* The aggregate of what the ranks reported, as update_connector_output takes it. */
static hixl_kv_ids ids_of(struct ireq **v, size_t n, const char **buf) {
  for (size_t k = 0; k < n; k++) buf[k] = v[k]->id;
  return (hixl_kv_ids){buf, n};
}

static void prefill_step(struct inst *x) {
  const struct mh_model *m = &x->a->model;
  struct ireq **batch = malloc((x->n ? x->n : 1) * sizeof(*batch));
  size_t nb = 0;
  /* Admit waiting requests, first come first served, while blocks last. */
  for (size_t i = 0; batch && i < x->n; i++) {
    struct ireq *r = x->v[i];
    if (r->blocks) continue;
    if (x->dead_mask) { /* a rank is gone: this instance computes nothing more */
      send_fail(x, r->idx, "prefill: a worker rank is gone (mask 0x%x); request not served", x->dead_mask);
      req_drop(x, i--);
      continue;
    }
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
  if (x->a->push) meta_step(x, UINT32_MAX);
  if (nb) {
    /* The forward pass, on every rank: layer by layer over the batch, each layer saved
     * as it ends; then the requests finish. */
    uint64_t t_saved = forward(x, batch, nb);
    for (size_t k = 0; k < nb; k++) {
      struct ireq *r = batch[k];
      int32_t delay = -1;
      hixl_kv_buffer p = {0};
      hixl_kv_status st = sched_finished(x, r, 0, &delay, &p);
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
  if (!x->a->push) meta_step(x, UINT32_MAX); /* the HOLD entries of the requests just finished */
  /* Requests the consumer has taken from every rank (or whose lease ran out): their
   * blocks are free. */
  struct ireq **sent, **recv;
  size_t ns, nr;
  if (finished(x, &sent, &ns, &recv, &nr) < 0) return;
  const char **buf = calloc(ns + nr + 1, sizeof(*buf));
  if (buf && HAS(x, update_connector_output) && (ns || nr)) {
    hixl_kv_ids s = ids_of(sent, ns, buf), rv = ids_of(recv, nr, buf + ns);
    x->ops->update_connector_output(x->sched, &s, &rv, NULL);
  }
  free(buf);
  for (size_t k = 0; k < ns; k++) req_drop(x, req_find(x, sent[k]->id));
  free(sent);
  free(recv);
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
  /* The request ends as a runtime ends it: request_finished, then its blocks go back.
   * One on_new_request took is finished even without blocks (vLLM finishes every request
   * it saw): else the scheduler renews its producer's hold for ever. */
  if ((r->blocks || r->announced) && !r->aborted) {
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
  bool lost = false;
  uint64_t bad = check(x, r, 0, x->a->model.layers, true, where, sizeof(where), &lost);
  if (lost)
    done(x, i, MH_FAILED, t_held, "%s; a worker rank is gone, so it cannot be recomputed", why);
  else if (bad)
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
    if (x->a->queue_ms && mh_now_ns() < r->t_arrived + x->a->queue_ms * 1000000ull) {
      i++; /* --queue-ms: still waiting in the host's queues */
      continue;
    }
    if (x->dead_mask) { /* a rank is gone: this instance loads nothing more */
      done(x, i, MH_FAILED, 0, "decode: a worker rank is gone (mask 0x%x); request not served", x->dead_mask);
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
    bool lost = false;
    while (r->vlayer < m->layers && budget > 0 && !lost) {
      r->vbad += check(x, r, r->vlayer++, 1, false, r->vwhere, sizeof(r->vwhere), &lost);
      budget = budget > layer_bytes ? budget - layer_bytes : 0;
    }
    if (lost)
      done(x, i, MH_FAILED, r->t_held, "received, but a worker rank went away before its heads were checked");
    else if (r->vlayer < m->layers)
      break;
    else if (r->vbad)
      done(x, i, MH_CORRUPT, r->t_held,
           "%" PRIu64 " bytes of its KV differ from what prefill computed, first %s", r->vbad, r->vwhere);
    else
      done(x, i, MH_VERIFIED, r->t_held, "every byte checked");
  }
}

static void decode_step(struct inst *x) {
  decode_admit(x);
  size_t loading = 0;
  for (size_t i = 0; i < x->n; i++) loading += x->v[i]->loading;
  /* decode-rank-dies: the last rank kills itself right after its loads start. */
  uint32_t die = UINT32_MAX;
  if (x->a->fault == MH_FAULT_DECODE_RANK_DIES && !x->rank_killed && x->count >= x->a->fault_at && loading) {
    die = x->tp - 1;
    x->rank_killed = true;
    say(x, "fault decode-rank-dies: rank %u dies as its loads start, with %zu loads in flight", die, loading);
  }
  /* decode-dies: before this step's loads start (as the Python host), so what prefill
   * holds for them is certain to be left to its lease; killed after start_load_kv, the
   * worker could pin, read and release them all first on a loaded machine. */
  if (x->a->fault == MH_FAULT_DECODE_DIES && x->count >= x->a->fault_at && loading) {
    say(x, "fault decode-dies: killing this process (pid %d) as its loads start, %zu of them", (int)getpid(),
        loading);
    raise(SIGKILL);
  }
  meta_step(x, die);
  struct ireq **sent, **recv;
  size_t ns, nr;
  if (finished(x, &sent, &ns, &recv, &nr) < 0) return;
  uint64_t t_held = mh_now_ns();
  /* Tell the scheduler what the workers reported: finished, and which of them failed. */
  const char **buf = calloc(ns + 2 * nr + 1, sizeof(*buf));
  size_t nf = 0;
  for (size_t k = 0; buf && k < nr; k++)
    if (recv[k]->load_errors || recv[k]->rank_lost) buf[ns + nr + nf++] = recv[k]->id;
  if (buf && HAS(x, update_connector_output) && (ns || nr)) {
    hixl_kv_ids s = ids_of(sent, ns, buf), rv = ids_of(recv, nr, buf + ns), fids = {buf + ns + nr, nf};
    hixl_kv_status st = x->ops->update_connector_output(x->sched, &s, &rv, &fids);
    if (st != HIXL_KV_SUCCESS)
      say(x, "update_connector_output failed (%s): %s", mh_status_name(st), x->ops->last_error());
  }
  free(buf);
  for (size_t k = 0; k < nr; k++) {
    size_t i = req_find(x, recv[k]->id);
    struct ireq *r = x->v[i];
    char why[512];
    if (r->aborted) { /* received (or failed): only now do its blocks go back */
      done(x, i, MH_FAILED, t_held, "aborted by its client while its KV loaded (%" PRIu64 " load errors)",
           r->load_errors);
      continue;
    }
    if (r->rank_lost) { /* its heads on that rank never came: nothing to recompute them with */
      done(x, i, MH_FAILED, t_held,
           "KV load failed: a worker rank went away before it reported the request (ranks gone: mask 0x%x; "
           "%" PRIu64 " blocks reported by get_block_ids_with_load_errors)",
           x->dead_mask, r->load_errors);
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
      hixl_kv_status st = x->ops->get_num_new_matched_tokens(x->sched, &q, 0, &tokens, &async);
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
  free(sent);
  free(recv);
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
    struct ireq *r = req_add(x, idx, seed, prompt, params, plen);
    if (!r) {
      send_fail(x, idx, "%s: out of memory", x->who);
      return 0;
    }
    r->t_arrived = mh_now_ns();
    if (!x->a->prefill && x->a->queue_ms && HAS(x, on_new_request)) { /* vLLM: as the request arrives */
      hixl_kv_request q = hreq(r);
      hixl_kv_status st = x->ops->on_new_request(x->sched, &q);
      r->announced = st == HIXL_KV_SUCCESS;
      if (st != HIXL_KV_SUCCESS)
        say(x, "on_new_request(%s) failed (%s): %s", r->id, mh_status_name(st), x->ops->last_error());
    }
    return 0;
  }
  say(x, "unexpected frame type %u from the router", type);
  return -1;
}

/* The instance's report at exit: its pool, and each rank's counters (a rank's process
 * answers with them and exits). */
static void side_report(struct inst *x) {
  struct mh_side s = {.blocks_total = x->cache.m.num_blocks, .blocks_free = x->cache.nfree};
  s.requests_left = (uint32_t)x->n;
  s.tp = x->tp;
  if (x->tp == 1) {
    s.rk[0].alive = 1;
    s.rk[0].stats_ok = mh_rank_stats(&x->local, &s.rk[0].ks);
    mh_obs_tick(x->ops, x->local.worker, x->conn.fd, x->a->metrics,
                true); /* before the report: the router has them */
    s.ipc_bytes = mh_obs_counter(x->ops, x->local.worker, "hixl_kv_device_ipc_bytes_total{");
    s.rdma_bytes = mh_obs_counter(x->ops, x->local.worker, "hixl_kv_device_rdma_bytes_total{");
  } else {
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_out o = {0};
      rk_send(x, r, MH_RK_EXIT, &o);
    }
    for (uint32_t r = 0; r < x->tp; r++) {
      struct mh_in in;
      if (rk_wait(x, r, MH_RK_STATS, &in, NULL) < 0) continue;
      s.rk[r].stats_ok = mh_get_u8(&in);
      mh_get_stats(&in, &s.rk[r].ks);
      if (!mh_in_done(&in)) rk_lost(x, r, "a malformed report");
    }
    for (uint32_t r = 0; r < x->tp; r++) s.rk[r].alive = !x->rk[r].dead;
  }
  s.stats_ok = 1;
  for (uint32_t r = 0; r < x->tp; r++) {
    const hixl_kv_stats *k = &s.rk[r].ks;
    if (!s.rk[r].alive) continue;
    s.stats_ok &= s.rk[r].stats_ok;
    s.ks.blocks_held += k->blocks_held;
    s.ks.requests_held += k->requests_held;
    s.ks.loads_done += k->loads_done;
    s.ks.loads_failed += k->loads_failed;
    s.ks.lease_expired += k->lease_expired;
    s.ks.bytes_loaded += k->bytes_loaded;
    s.ks.engine_ops += k->engine_ops;
    s.ks.lookups += k->lookups;
    s.ks.pushes_done += k->pushes_done;
    s.ks.pushes_failed += k->pushes_failed;
    s.ks.layers_pushed += k->layers_pushed;
  }
  s.twice = x->twice;
  struct mh_out o = {0};
  mh_put_side(&o, &s);
  mh_send(x->conn.fd, MH_STATS, &o);
}

/* The ranks' processes end: each exits once its socket closes (or after EXIT); a rank
 * that exits other than cleanly fails the instance (a sanitizer's finding shows here). */
static bool ranks_stop(struct inst *x) {
  bool clean = true;
  for (uint32_t r = 0; r < x->tp && x->tp > 1; r++) {
    struct rk *k = &x->rk[r];
    if (!k->pid || k->dead) continue;
    close(k->conn.fd);
    waitpid(k->pid, &k->wstatus, 0);
    if (!WIFEXITED(k->wstatus) || WEXITSTATUS(k->wstatus) != 0) {
      say(x, "rank %u (pid %d) ended with %s %d", r, (int)k->pid,
          WIFSIGNALED(k->wstatus) ? "signal" : "exit status",
          WIFSIGNALED(k->wstatus) ? WTERMSIG(k->wstatus) : WEXITSTATUS(k->wstatus));
      clean = false;
    }
  }
  for (uint32_t r = 0; r < x->tp && x->tp > 1; r++) {
    mh_conn_fini(&x->rk[r].conn);
    if (x->rk[r].efd >= 0) close(x->rk[r].efd);
    x->rk[r].efd = -1;
  }
  return clean;
}

int mh_instance_main(const struct mh_inst_args *a) {
  struct inst x = {.a = a, .ops = a->ops, .who = a->prefill ? "prefill" : "decode", .tp = a->tp};
  char err[1024] = "";
  int rc = 1;
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the router */
  fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) | O_NONBLOCK);
  mh_conn_init(&x.conn, a->fd);
  x.all_mask = (uint32_t)((1ull << x.tp) - 1);
  for (uint32_t r = 0; r < MH_MAX_TP; r++) x.rk[r].efd = -1;
  /* The ranks' processes first, before this process has any connector (or its threads). */
  uint32_t started = 0;
  for (; x.tp > 1 && started < x.tp; started++)
    if (rk_start(&x, started) < 0) goto fail_ranks;
  size_t clen = strlen(a->config);
  hixl_kv_status st =
      x.ops->create(a->config, clen, HIXL_KV_ROLE_SCHEDULER, 0, x.tp, &x.sched, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    send_fail(&x, MH_NO_REQUEST, "%s: create(scheduler) failed (%s): %s", x.who, mh_status_name(st), err);
    goto fail_sched;
  }
  if (mh_cache_init(&x.cache, &a->model) < 0) {
    send_fail(&x, MH_NO_REQUEST, "%s: cannot allocate its KV cache's block tables", x.who);
    goto fail_cache;
  }
  if (!(x.errblk = calloc(a->model.num_blocks, 1))) {
    send_fail(&x, MH_NO_REQUEST, "%s: cannot allocate its KV cache's block tables", x.who);
    goto fail_errblk;
  }
  if (x.tp == 1 && mh_rank_open(&x.local, a, 0, err, sizeof(err)) < 0) {
    send_fail(&x, MH_NO_REQUEST, "%s", err);
    goto fail_errblk;
  }
  for (uint32_t r = 0; x.tp > 1 && r < x.tp; r++) { /* each rank's worker up, its KV registered */
    struct mh_in in;
    uint8_t has_efd = 0;
    if (rk_wait(&x, r, MH_RK_READY, &in, &x.rk[r].efd) == 0) has_efd = mh_get_u8(&in);
    if (!x.rk[r].dead && (!mh_in_done(&in) || has_efd > 1 || (has_efd == 1) != (x.rk[r].efd >= 0)))
      rk_lost(&x, r, "a malformed READY");
    if (x.rk[r].dead) {
      send_fail(&x, MH_NO_REQUEST, "%s: rank %u did not start", x.who, r);
      goto fail_ready;
    }
  }
  struct mh_out o = {0};
  mh_put_u32(&o, (uint32_t)a->model.num_blocks);
  mh_send(a->fd, MH_READY, &o);

  /* Decode also wakes when a load ended (ABI 1.2's event fd; every rank's, passed over
   * its socket), not only at its next step: its step polls get_finished, which quiets
   * the fd. */
  int32_t efd = -1; /* written only on success */
  if (!a->prefill && x.tp == 1 && HIXL_KV_HAS_OP(x.ops, get_event_fd))
    x.ops->get_event_fd(x.local.worker, &efd);
  for (;;) {
    struct pollfd pfd[1 + MH_MAX_TP] = {{a->fd, POLLIN, 0}, {efd, POLLIN, 0}};
    nfds_t np = efd >= 0 ? 2 : 1;
    for (uint32_t r = 0; x.tp > 1 && r < x.tp; r++)
      if (x.rk[r].efd >= 0) pfd[np++] = (struct pollfd){x.rk[r].efd, POLLIN, 0};
    poll(pfd, np, x.n || x.exiting ? 1 : 20);
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
    if (x.tp == 1) mh_obs_tick(x.ops, x.local.worker, a->fd, a->metrics, false); /* TP > 1: not built */
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
fail_ready:
  if (x.tp == 1) mh_rank_close(&x.local);
fail_errblk:
  free(x.errblk);
  mh_cache_fini(&x.cache);
fail_cache:
  x.ops->destroy(x.sched);
fail_sched:
fail_ranks:
  if (!ranks_stop(&x)) rc = 1;
  mh_conn_fini(&x.conn);
  return rc;
}
