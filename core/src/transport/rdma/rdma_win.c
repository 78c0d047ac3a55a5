/* rdma_win: scoped memory over RDMA (docs/security.md, "Scoped memory over RDMA").
 *
 * A scoped engine registers its memory with no remote access: the keys it advertises
 * are 0, and an MR's own key reaches nothing from the wire. What a peer was granted
 * (hixl_engine_grant) it reaches through windows: for each run of adjacent ranges one
 * grant added inside one registration, on each of that peer's QPs, a type 2 memory
 * window bound on that QP over an MR of the run's own. Only that QP's peer can use the
 * window's key, only inside the run (the window's bounds, and the MR's: soft-RoCE in
 * Linux 6.1 checks only the MR's, measured in the guest), and only until a revoke of
 * any range in it closes it (ibv_dealloc_mw: at once; the rest of the run, still
 * granted, gets windows again: wins_shut). The target
 * binds the windows before hixl_engine_grant returns and tells the peer their keys
 * (WIN_ADD) on the link's socket, ahead of whatever the grant's caller answers next;
 * WIN_DEL after a revoke. An initiator posts an op inside windows with their keys
 * (one work request per window it spans), and sends any other op on an unkeyed
 * registration as tcp frames, which the target's CPU checks.
 *
 * A bind completes on the CQ the progress thread reads; the granting thread (any,
 * the engine lock held) takes it off the CQ itself and keeps the completions it meets
 * on the way, in order, for the progress thread (struct erdma_stash). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/erdma.h"
#include "util/log.h"
#include "util/sock.h"

#define WIN_BIND_WAIT_NS (5ull * 1000000000ull) /* a bind not complete by then resets the link */

/* ---- a target's sorted vector ---- */

static int by_addr(const void *a, const void *b) {
  const struct erdma_win *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Add n windows (sorted here) to w. -1: out of memory (w unchanged), -2: one overlaps
 * another (w unchanged). */
static int wins_add(struct erdma_wins *w, struct erdma_win *add, size_t n) {
  qsort(add, n, sizeof(*add), by_addr);
  struct erdma_win *out = malloc((w->n + n ? w->n + n : 1) * sizeof(*out));
  if (!out) return -1;
  size_t a = 0, b = 0, k = 0;
  while (a < w->n || b < n) {
    struct erdma_win next = b == n || (a < w->n && w->v[a].addr <= add[b].addr) ? w->v[a++] : add[b++];
    if (k > 0 && out[k - 1].addr + out[k - 1].len > next.addr) {
      free(out);
      return -2;
    }
    out[k++] = next;
  }
  free(w->v);
  w->v = out;
  w->n = w->cap = k;
  return 0;
}

static void win_close(struct HixlEngine *e, struct erdma_win *w) {
  if (!w->mw) return;  /* an initiator's: a key, nothing bound here */
  rdma_mw_free(w->mw); /* first: the MR is bound under it */
  if (w->own_mr) rdma_dereg(w->mr);
  w->mw = NULL;
  w->mr = NULL;
  struct hixl_window_stats *s = engine_win_stats(e);
  s->open--;
  s->closed++;
}

void erdma_wins_free(struct HixlEngine *e, struct erdma_link *l) {
  for (size_t i = 0; i < l->wins.n; i++) win_close(e, &l->wins.v[i]);
  for (size_t i = 0; i < l->retired.n; i++) win_close(e, &l->retired.v[i]);
  free(l->wins.v);
  free(l->retired.v);
  l->wins = l->retired = (struct erdma_wins){0};
  erdma_rwins_free(&l->rwins);
}

/* Close l's retired windows that overlap one of ranges (sorted), or all of them that
 * overlap [addr, addr + len) when ranges is NULL. The peer was never told of their end:
 * it let go of them when told of the windows that replaced them. */
static void retired_close(struct HixlEngine *e, struct erdma_link *l, const uint64_t (*ranges)[2], size_t n,
                          uint64_t addr, uint64_t len) {
  size_t k = 0;
  for (size_t i = 0; i < l->retired.n; i++) {
    struct erdma_win *w = &l->retired.v[i];
    bool hit = false;
    if (!ranges) {
      hit = w->addr < addr + len && addr < w->addr + w->len;
    } else {
      size_t lo = 0, hi = n; /* the first range ending after the window's start */
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid][0] + ranges[mid][1] <= w->addr)
          lo = mid + 1;
        else
          hi = mid;
      }
      hit = lo < n && ranges[lo][0] < w->addr + w->len;
    }
    if (hit)
      win_close(e, w);
    else
      l->retired.v[k++] = *w;
  }
  l->retired.n = k;
}

/* ---- completions kept for the progress thread ---- */

static int stash_put(struct erdma_stash *s, const struct rdma_wc *w) {
  if (s->head > 0 && s->n == s->cap) {
    memmove(s->v, s->v + s->head, (s->n - s->head) * sizeof(*s->v));
    s->n -= s->head;
    s->head = 0;
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    struct rdma_wc *v = realloc(s->v, cap * sizeof(*v));
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = *w;
  return 0;
}

void erdma_stash_drain(struct HixlEngine *e, int dev,
                       void (*handle)(struct HixlEngine *e, int dev, const struct rdma_wc *w)) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  struct erdma_stash *s = &x->stash[dev];
  while (s->head < s->n) {
    struct rdma_wc w = s->v[s->head++];
    handle(e, dev, &w); /* may grant, and stash more behind */
  }
  s->head = s->n = 0;
}

/* Wait until the signaled bind posted last on QP qpn of device dev completes. 0, or -1
 * with why (the link is then reset by the caller). */
static int bind_wait(struct HixlEngine *e, int dev, uint32_t qpn, char *why, size_t whylen) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  uint64_t deadline = hixl_now_ns() + WIN_BIND_WAIT_NS;
  for (;;) {
    struct rdma_wc wc[32];
    int n = rdma_cq_poll(&x->dev[dev], wc, 32);
    bool done = false;
    for (int i = 0; i < n; i++) {
      if (wc[i].qpn == qpn && wc[i].wr_id == ERDMA_WR_BIND) {
        if (!wc[i].ok) {
          snprintf(why, whylen, "binding a memory window on QP 0x%x failed: %s", qpn, wc[i].status);
          for (int j = i + 1; j < n; j++) stash_put(&x->stash[dev], &wc[j]);
          return -1;
        }
        done = true;
        continue;
      }
      if (stash_put(&x->stash[dev], &wc[i]) != 0) {
        snprintf(why, whylen, "out of memory keeping completions while binding memory windows on QP 0x%x",
                 qpn);
        return -1;
      }
    }
    if (done) return 0;
    if (n < 0) {
      snprintf(why, whylen, "ibv_poll_cq failed while binding memory windows on QP 0x%x", qpn);
      return -1;
    }
    if (hixl_now_ns() > deadline) {
      snprintf(why, whylen, "binding memory windows on QP 0x%x did not complete within %llu s", qpn,
               WIN_BIND_WAIT_NS / 1000000000ull);
      return -1;
    }
    if (n == 0) sched_yield();
  }
}

/* ---- a target opens and closes a peer's windows ---- */

static void refused(struct HixlEngine *e, size_t n, const char *peer, const char *why) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  engine_win_stats(e)->refused += n;
  if (x->win_refusal_logged) return;
  x->win_refusal_logged = true;
  log_warn("engine %s: %zu range(s) granted to %s get no RDMA window (%s): its ops on them go as tcp frames, "
           "checked here (said once)",
           engine_name(e), n, peer, why);
}

/* Send the windows' keys (add) or their end to the peer, WIRE_MAX_WINS a frame. */
static void wins_tell(struct conn *c, const struct erdma_win *w, size_t n, bool add) {
  for (size_t off = 0; off < n && !link_dead(c); off += WIRE_MAX_WINS) {
    uint32_t k = (uint32_t)(n - off < WIRE_MAX_WINS ? n - off : WIRE_MAX_WINS);
    size_t cap = WIRE_HDR_LEN + 4 + (size_t)WIRE_WIN_LEN * k;
    uint8_t *buf = malloc(cap);
    uint64_t(*r)[2] = malloc(k * sizeof(*r));
    uint32_t *keys = malloc(k * sizeof(*keys));
    if (!buf || !r || !keys) {
      free(buf), free(r), free(keys);
      link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory telling the peer its memory windows");
      return;
    }
    for (uint32_t i = 0; i < k; i++) {
      r[i][0] = w[off + i].addr;
      r[i][1] = w[off + i].len;
      keys[i] = w[off + i].rkey;
    }
    size_t len = wire_put_wins(buf, cap, (const uint64_t(*)[2])r, add ? keys : NULL, k);
    link_queue_copy(c, buf, len);
    free(buf), free(r), free(keys);
  }
  link_flush(c);
}

/* An MR of a window's own over [addr, addr + len) of the registration at reg_addr whose
 * MRs are m: host memory, or over m's dma-buf at the run's offset (device memory). The
 * dma-buf spans whole pages, so a run's offset in it is its offset in the registration
 * plus the registration's own. */
static struct ibv_mr *win_own_mr(struct rdma_dev *d, const struct erdma_mr *m, uint64_t reg_addr,
                                 uint64_t addr, uint64_t len, char *err, size_t errlen) {
  if (!m || !m->dmabuf) return rdma_reg_window(d, (void *)(uintptr_t)addr, len, NULL, err, errlen);
  struct rdma_dmabuf db = {.fd = m->db.fd, .off = m->db.off + (addr - reg_addr)};
  return rdma_reg_window(d, (void *)(uintptr_t)addr, len, &db, err, errlen);
}

/* Bind a window over each of ranges on c's QP and tell the peer; merge (and a peer
 * that takes splits): one over each run of adjacent ranges instead. */
static void wins_open(struct HixlEngine *e, struct conn *c, struct erdma_link *l, const uint64_t (*ranges)[2],
                      size_t n, bool merge) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  struct rdma_dev *d = &x->dev[l->dev];
  char err[384];
  if (!(link_hello_caps(c) & WIRE_CAP_WIN)) {
    refused(e, n, link_remote(c), "the peer does not take windows (an older hixl)");
    return;
  }
  if (!d->mw2) {
    refused(e, n, link_remote(c), "the device binds no type 2 memory windows");
    return;
  }
  struct erdma_win *nw = calloc(n, sizeof(*nw));
  if (!nw) {
    refused(e, n, link_remote(c), "out of memory");
    return;
  }
  size_t k = 0, skipped = 0;
  const char *why = NULL;
  for (size_t i = 0, j; i < n; i = j) { /* first each window's MR and window */
    struct hixl_mem_reg *reg = engine_reg_find(e, ranges[i][0], ranges[i][1]);
    struct erdma_win w = {.addr = ranges[i][0], .len = ranges[i][1]};
    /* One window over each run of adjacent ranges one grant adds inside one
     * registration: a request's blocks are mostly such runs (thousands of ranges, a few
     * windows, each an MR the kernel pins and a bind on the QP). */
    for (j = i + 1; merge && reg && j < n && ranges[j][0] == w.addr + w.len &&
                    ranges[j][0] + ranges[j][1] <= reg->range.addr + reg->range.len;
         j++)
      w.len += ranges[j][1];
    /* Device memory has windows where it has an MR (GPUDirect); else its ops go as tcp
     * frames, which the grant checks. */
    const struct erdma_mr *rm = reg ? reg->xm[XPORT_RDMA] : NULL;
    if (!reg || (reg->type == HIXL_MEM_DEVICE && !rm)) {
      skipped += j - i;
      why = reg ? "device memory this device has no MR over (no GPUDirect)"
                : "a range not inside one registration";
      continue;
    }
    /* Over the registration's MR where the device holds the key to the window; else an
     * MR of the run's own (over the dma-buf of device memory), so that the key reaches
     * the run alone (its pages pinned once more, at each grant: the cost of scoped memory
     * on such a device). */
    if (d->mw_bounds == RDMA_MWB_HELD && rm && rm->mr[l->dev])
      w.mr = rm->mr[l->dev];
    else
      w.own_mr = true;
    if ((w.own_mr && !(w.mr = win_own_mr(d, rm, reg->range.addr, w.addr, w.len, err, sizeof(err)))) ||
        !(w.mw = rdma_mw_new(d, err, sizeof(err)))) {
      if (w.own_mr) rdma_dereg(w.mr);
      skipped += j - i;
      why = "the device refused an MR or a window: see the log";
      log_warn("engine %s: no window over [0x%llx, +%llu) for %s: %s", engine_name(e),
               (unsigned long long)w.addr, (unsigned long long)w.len, link_remote(c), err);
      continue;
    }
    nw[k++] = w;
    engine_win_stats(e)->open++;
    engine_win_stats(e)->bound++;
    engine_win_stats(e)->own_mrs += w.own_mr;
  }
  /* Then the binds: work requests on the QP's send queue, posted in one call per round
   * of at most max_qp_wr - 2 (a staged unit's own WR may be there), the last of each
   * signaled and waited for. */
  size_t round = d->max_qp_wr > 2 ? d->max_qp_wr - 2 : 1;
  struct rdma_bind *b = calloc(k < round ? (k ? k : 1) : round, sizeof(*b));
  if (!b) {
    snprintf(err, sizeof(err), "out of memory binding memory windows");
    goto reset;
  }
  for (size_t off = 0; off < k; off += round) {
    size_t m = k - off < round ? k - off : round;
    for (size_t i = 0; i < m; i++)
      b[i] = (struct rdma_bind){
          .mw = nw[off + i].mw, .mr = nw[off + i].mr, .addr = nw[off + i].addr, .len = nw[off + i].len};
    if (rdma_post_binds(l->qp, b, m, ERDMA_WR_BIND) != 0) {
      snprintf(err, sizeof(err), "ibv_post_send of %zu windows' binds on QP 0x%x: %s", m, rdma_qp_num(l->qp),
               strerror(errno));
      free(b);
      goto reset;
    }
    for (size_t i = 0; i < m; i++) nw[off + i].rkey = b[i].rkey;
    if (bind_wait(e, l->dev, rdma_qp_num(l->qp), err, sizeof(err)) != 0) {
      free(b);
      goto reset;
    }
  }
  free(b);
  if (skipped) refused(e, skipped, link_remote(c), why);
  if (k == 0) {
    free(nw);
    return;
  }
  int rc = wins_add(&l->wins, nw, k);
  if (rc != 0) {
    snprintf(err, sizeof(err), "%s",
             rc == -1 ? "out of memory for its windows" : "a window overlaps another");
    goto reset;
  }
  wins_tell(c, nw, k, true);
  free(nw);
  return;
reset:
  for (size_t i = 0; i < k; i++) win_close(e, &nw[i]);
  free(nw);
  log_error("engine %s: link from %s: %s; the link is reset", engine_name(e), link_remote(c), err);
  link_conn_kill(c, HIXL_FAILED, err);
}

/* Close l's windows marked closing (at once: the memory may be freed as soon as the
 * caller returns), take them out, and tell the peer (WIN_DEL). */
static void wins_close_marked(struct HixlEngine *e, struct conn *c, struct erdma_link *l) {
  struct erdma_win *gone = malloc((l->wins.n ? l->wins.n : 1) * sizeof(*gone));
  size_t k = 0, kept = 0;
  for (size_t i = 0; i < l->wins.n; i++) {
    struct erdma_win *w = &l->wins.v[i];
    if (!w->closing) {
      l->wins.v[kept++] = *w;
      continue;
    }
    win_close(e, w);
    if (gone) gone[k++] = *w;
  }
  l->wins.n = kept;
  if (!gone) /* closed all the same: the peer's posts on them fail, which ends its link */
    link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory telling the peer its windows closed");
  else if (k && !link_dead(c))
    wins_tell(c, gone, k, false);
  free(gone);
}

static int by_start(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Close the windows holding ranges on c's QP and tell the peer. A window over a run of
 * ranges closes whole when any of them is revoked: what it held besides (still
 * granted) gets windows of its own again, after. A peer's op in flight there with the
 * old key fails, and its link resets: the plugin revokes a request's blocks together,
 * so this is a block shared by two requests, revoked for one while the other reads it. */
static void wins_shut(struct HixlEngine *e, struct conn *c, struct erdma_link *l, const uint64_t (*ranges)[2],
                      size_t n) {
  uint64_t(*sorted)[2] = NULL;
  for (size_t i = 1; i < n && !sorted; i++)
    if (ranges[i][0] < ranges[i - 1][0]) { /* grant_tell's come sorted */
      if (!(sorted = malloc(n * sizeof(*sorted)))) {
        link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory closing memory windows");
        return; /* the link's death closes every window of it */
      }
      memcpy(sorted, ranges, n * sizeof(*sorted));
      qsort(sorted, n, sizeof(*sorted), by_start);
      ranges = (const uint64_t(*)[2])sorted;
    }
  uint64_t(*keep)[2] = NULL;
  size_t nkeep = 0, cap = 0;
  bool oom = false;
  retired_close(e, l, ranges, n, 0, 0); /* split windows holding a range revoked */
  for (size_t i = 0; i < n;) {
    size_t at = erdma_wins_at(&l->wins, ranges[i][0]);
    struct erdma_win *w = at < l->wins.n ? &l->wins.v[at] : NULL;
    uint64_t end = w ? w->addr + w->len : 0;
    if (!w || ranges[i][0] + ranges[i][1] > end) { /* a range that got no window has none to close */
      i++;
      continue;
    }
    w->closing = true;
    uint64_t pos = w->addr;
    for (; i <= n; i++) { /* the gaps between the window's revoked ranges are kept */
      uint64_t upto = i < n && ranges[i][0] < end ? ranges[i][0] : end;
      if (upto > pos && !oom && nkeep == cap) {
        size_t ncap = cap ? 2 * cap : 16;
        uint64_t(*v)[2] = realloc(keep, ncap * sizeof(*v));
        if (v)
          keep = v, cap = ncap;
        else
          oom = true;
      }
      if (upto > pos && !oom) keep[nkeep][0] = pos, keep[nkeep++][1] = upto - pos;
      if (i == n || ranges[i][0] >= end) break;
      pos = ranges[i][0] + ranges[i][1];
    }
  }
  free(sorted);
  wins_close_marked(e, c, l);
  if (oom) /* what stays granted is left without a window: its ops go as tcp frames, checked here */
    refused(e, 1, link_remote(c), "out of memory reopening the rest of a window after a revoke");
  if (nkeep && !oom && !link_dead(c)) wins_open(e, c, l, (const uint64_t(*)[2])keep, nkeep, true);
  free(keep);
}

/* Ranges a later grant names again (XPORT_SHARED): each gets a window of its own, so that
 * its window lives exactly as long as its last count. One inside a window over a run
 * (of ranges one earlier grant added) splits it: that window is retired, left open
 * (every range in it is still granted, and the peer's ops in flight on it end there),
 * and the range and the runs beside it get windows of their own, which replace it at
 * the peer (a WIN_ADD over a window it holds: WIRE_CAP_WIN_RUNS). A retired window
 * closes with the first of its ranges revoked, when only its own grant's ops, ended,
 * used it. A shared range with no window yet (granted before this link was made) gets
 * one of its own. */
static void wins_share(struct HixlEngine *e, struct conn *c, struct erdma_link *l,
                       const uint64_t (*ranges)[2], size_t n) {
  uint64_t(*want)[2] = malloc((3 * n + 1) * sizeof(*want)); /* a range and a run on each side at most */
  if (!want) {
    link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory splitting memory windows");
    return;
  }
  size_t k = 0, split = 0;
  for (size_t i = 0; i < n;) {
    size_t at = erdma_wins_at(&l->wins, ranges[i][0]);
    struct erdma_win *w = at < l->wins.n ? &l->wins.v[at] : NULL;
    uint64_t end = w ? w->addr + w->len : 0;
    if (!w || ranges[i][0] + ranges[i][1] > end) { /* no window yet */
      want[k][0] = ranges[i][0], want[k++][1] = ranges[i][1], i++;
      continue;
    }
    if (w->addr == ranges[i][0] && w->len == ranges[i][1]) { /* its own already */
      i++;
      continue;
    }
    uint64_t pos = w->addr;
    for (; i < n && ranges[i][0] < end; i++) {
      if (ranges[i][0] > pos) want[k][0] = pos, want[k++][1] = ranges[i][0] - pos; /* the run before it */
      want[k][0] = ranges[i][0], want[k++][1] = ranges[i][1];
      pos = ranges[i][0] + ranges[i][1];
    }
    if (pos < end) want[k][0] = pos, want[k++][1] = end - pos;
    w->closing = true; /* retired below */
    split++;
  }
  if (split) { /* out of the link's windows, into its retired ones, still open */
    struct erdma_win *v = realloc(l->retired.v, (l->retired.n + split) * sizeof(*v));
    if (!v) {
      free(want);
      link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory splitting memory windows");
      return;
    }
    l->retired.v = v;
    size_t kept = 0;
    for (size_t i = 0; i < l->wins.n; i++) {
      struct erdma_win w = l->wins.v[i];
      if (!w.closing) {
        l->wins.v[kept++] = w;
        continue;
      }
      w.closing = false;
      l->retired.v[l->retired.n++] = w;
    }
    l->wins.n = kept;
    engine_win_stats(e)->split += split;
  }
  if (k) wins_open(e, c, l, (const uint64_t(*)[2])want, k, false);
  free(want);
}

void erdma_wins_dereg(struct HixlEngine *e, uint64_t addr, uint64_t len) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  for (struct erdma_link *l = x ? x->links : NULL, *next; l; l = next) {
    next = l->next; /* a kill (no memory to tell the peer) takes l off the list */
    if (!link_is_target(l->conn)) continue;
    retired_close(e, l, NULL, 0, addr, len);
    if (l->wins.n == 0) continue;
    for (size_t i = 0; i < l->wins.n; i++) {
      const struct erdma_win *w = &l->wins.v[i];
      l->wins.v[i].closing = w->addr < addr + len && addr < w->addr + w->len;
    }
    wins_close_marked(e, l->conn, l);
  }
}

void erdma_win_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                     enum xport_grant how) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  if (!x || n == 0) return;
  for (struct erdma_link *l = x->links, *next; l; l = next) {
    next = l->next; /* a reset takes l off the list */
    struct conn *c = l->conn;
    if (!link_is_target(c) || link_dead(c) || !l->qp || strcmp(link_remote(c), peer) != 0) continue;
    if (how == XPORT_GRANTED)
      wins_open(e, c, l, ranges, n, true);
    else if (how == XPORT_SHARED)
      wins_share(e, c, l, ranges, n);
    else
      wins_shut(e, c, l, ranges, n);
  }
}

/* ---- an initiator learns its windows ---- */

void erdma_win_frame(struct conn *c, const struct wire_msg *m) {
  struct erdma_link *l = link_xs(c, XPORT_RDMA);
  if (!l || link_is_target(c)) {
    link_conn_kill(c, HIXL_FAILED, "protocol error: memory windows on a link without a QP");
    return;
  }
  uint32_t n = m->u.win.count;
  if (m->hdr.type == WIRE_WIN_DEL) {
    for (uint32_t i = 0; i < n; i++) {
      uint64_t addr, len;
      uint32_t key;
      wire_win(m, i, &addr, &len, &key);
      erdma_rwins_del(&l->rwins, addr, len); /* one it never had: nothing to forget */
    }
    return;
  }
  /* a target holds no more grants than that for one peer */
  if (erdma_rwins_count(&l->rwins) + n > ERDMA_WINS_MAX) {
    link_conn_kill(c, HIXL_FAILED, "protocol error: WIN_ADD past the bound of windows a link holds");
    return;
  }
  struct erdma_win *add = calloc(n, sizeof(*add));
  if (!add) {
    link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory for the peer's memory windows");
    return;
  }
  for (uint32_t i = 0; i < n; i++) wire_win(m, i, &add[i].addr, &add[i].len, &add[i].rkey);
  int rc = erdma_rwins_add(&l->rwins, add, n); /* a split's windows replace the one split */
  free(add);
  if (rc == -1) link_conn_kill(c, HIXL_RESOURCE_EXHAUSTED, "out of memory for the peer's memory windows");
  if (rc == -2) link_conn_kill(c, HIXL_FAILED, "protocol error: the windows of one WIN_ADD overlap");
}
