/* rping_prober: a batch's prober thread: PINGs on schedule, answers matched and tallied, over UDP or RoCE. */
/* The prober sends a batch's PINGs on schedule and matches the answers; every answer
 * is checked (rp_decode) before anything reads it. Mode ROCE: PINGs and PONGs are UD
 * SENDs from the batch's own QP, through an address handle per target that carries
 * the target's traffic class (GRH) and service level. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"
#include "rping/rping_int.h"
#include "util/sock.h"
#include "util/thread.h"

/* ---- the batch prober ---- */

/* Count one answer p (already decoded) if it is a timely first answer to a probe of b
 * that was sent; from_ok: it came from where that target's probes went. here_tc: the
 * traffic class (TOS byte) the answer arrived with. */
static bool take_answer(struct rp_batch *b, const struct rp_pkt *p, bool from_ok, uint8_t here_tc,
                        uint64_t now) {
  const struct rp_target *t;
  uint64_t *sent;
  uint64_t rtt;
  struct rp_tally *tl;

  if (p->type != RP_PONG || p->batch != b->id || p->target >= b->n || p->seq >= b->pkt_num) return false;
  t = &b->t[p->target];
  sent = &b->sent_ns[(size_t)p->target * b->pkt_num + p->seq];
  if (!from_ok || *sent == 0 || *sent == RP_ANSWERED) return false;
  if (p->payload_len != t->payload_len ||
      (p->payload_len && memcmp(p->payload, t->payload, p->payload_len))) {
    log_debug("rping %s: answer %u from %s has a damaged payload; counted lost", b->ctx->addr_str, p->seq,
              t->name);
    return false;
  }
  rtt = now - *sent;
  *sent = RP_ANSWERED; /* duplicates and late copies are ignored from now on */
  if (rtt > (uint64_t)b->timeout_ms * 1000000u) return false; /* late: lost */
  tl = &b->tally[p->target];
  tl->rx++;
  tl->rtt_sum += rtt;
  if (tl->rx == 1 || rtt < tl->rtt_min) tl->rtt_min = rtt;
  if (rtt > tl->rtt_max) tl->rtt_max = rtt;
  tl->echo_tc = p->tos;
  tl->here_tc = here_tc;
  if (p->tos != tl->set_tc) tl->echo_bad++;
  if (here_tc != tl->set_tc) tl->here_bad++;
  return true;
}

/* Mark b's tallies final (GetResult reads them from now on). */
static void batch_finish(struct rp_batch *b) {
  pthread_mutex_lock(&b->ctx->lock);
  b->done = true;
  pthread_mutex_unlock(&b->ctx->lock);
}

/* ---- over UDP ---- */

/* Send probe seq to targets [first, end); returns how many left. */
static uint32_t send_probes(struct rp_batch *b, uint32_t seq, size_t first, size_t end, uint8_t *buf,
                            size_t cap) {
  uint32_t sent = 0;
  for (size_t i = first; i < end; i++) {
    const struct rp_target *t = &b->t[i];
    struct rp_pkt ping = {.type = RP_PING,
                          .batch = b->id,
                          .target = (uint32_t)i,
                          .seq = seq,
                          .payload_len = t->payload_len,
                          .payload = t->payload};
    struct sockaddr_in to = rp_target_sa(t);
    uint64_t now = hixl_now_ns();
    size_t len;

    ping.stamp = now;
    len = rp_encode(&ping, buf, cap);
    if (rp_send_tos(b->socks[b->sock_of[i]], buf, len, &to, t->tc) < 0) {
      log_debug("rping %s: PING %u to %s: %s", b->ctx->addr_str, seq, t->name, strerror(errno));
      continue; /* not sent, not counted */
    }
    b->sent_ns[i * b->pkt_num + seq] = now;
    b->tally[i].tx++;
    sent++;
  }
  return sent;
}

/* Match one datagram; returns whether it was a valid, timely first answer. */
static bool take_pong(struct rp_batch *b, const uint8_t *buf, size_t n, const struct sockaddr_in *from,
                      uint8_t tos, uint64_t now) {
  struct rp_pkt p;
  if (rp_decode(buf, n, &p) != RP_OK || p.target >= b->n) return false;
  return take_answer(b, &p, rp_from_target(from, &b->t[p.target]), tos, now);
}

static void *batch_udp_main(void *arg) {
  struct rp_batch *b = arg;
  uint8_t buf[RP_MAX_PKT + 1];
  const uint64_t interval = (uint64_t)b->interval_ms * 1000000u, timeout = (uint64_t)b->timeout_ms * 1000000u;
  const uint64_t t0 = hixl_now_ns();
  uint64_t last_send = t0, sent = 0, answered = 0;
  uint32_t round = 0;
  size_t next = 0; /* the target probe round goes to next, within a round sent in pieces */
  size_t nfd = b->nsocks + 1;
  struct pollfd *pfd = calloc(nfd, sizeof(*pfd));

  if (!pfd) {
    log_error("rping %s: batch %u: out of memory; the batch ends with nothing sent", b->ctx->addr_str, b->id);
    goto finish;
  }
  pfd[0].fd = b->stop_efd;
  pfd[0].events = POLLIN;
  for (size_t i = 0; i < b->nsocks; i++) {
    pfd[i + 1].fd = b->socks[i];
    pfd[i + 1].events = POLLIN;
  }
  for (;;) {
    uint64_t now = hixl_now_ns(), wake;

    /* At most RP_DRAIN_MAX probes, then Stop and the answers again: a burst of due
     * probes (interval 0: every round at once, up to millions) must not hold Stop or
     * Deinit until it is all sent. A round cut short goes on after the poll. */
    for (size_t budget = RP_DRAIN_MAX; budget > 0 && round < b->pkt_num && now >= t0 + round * interval;) {
      size_t end = b->n - next < budget ? b->n : next + budget;
      sent += send_probes(b, round, next, end, buf, sizeof(buf));
      budget -= end - next;
      next = end;
      if (next == b->n) {
        next = 0;
        round++;
      }
      now = last_send = hixl_now_ns();
    }
    if (round == b->pkt_num && (answered == sent || now >= last_send + timeout)) break;
    wake = round < b->pkt_num ? t0 + round * interval : last_send + timeout;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 0};
    if (wake > now) {
      ts.tv_sec = (time_t)((wake - now) / 1000000000u);
      ts.tv_nsec = (long)((wake - now) % 1000000000u);
    }
    if (ppoll(pfd, nfd, &ts, NULL) < 0 && errno != EINTR) {
      log_error("rping %s: batch %u: poll: %s; the batch ends early", b->ctx->addr_str, b->id,
                strerror(errno));
      break;
    }
    if (pfd[0].revents) break; /* Stop or Deinit */
    for (size_t s = 1; s < nfd; s++) {
      if (!pfd[s].revents) continue;
      for (int taken = 0; taken < RP_DRAIN_MAX; taken++) { /* then Stop and the rounds again */
        struct sockaddr_in from;
        uint8_t tos;
        ssize_t k = rp_recv_tos(pfd[s].fd, buf, sizeof(buf), &from, &tos);
        if (k == -1) break;
        if (k >= 0 && take_pong(b, buf, (size_t)k, &from, tos, hixl_now_ns())) answered++;
      }
    }
  }
  free(pfd);
finish:
  batch_finish(b);
  return NULL;
}

static HccnResult udp_setup(struct rp_batch *b) {
  for (size_t i = 0; i < b->n; i++) {
    size_t s;
    for (s = 0; s < i; s++)
      if (b->t[s].src_port == b->t[i].src_port) break;
    if (s < i) {
      b->sock_of[i] = b->sock_of[s];
      continue;
    }
    char what[64];
    snprintf(what, sizeof(what), "HccnRpingBatchPingStart: source port of %s", b->t[i].name);
    int fd = rp_udp_socket(b->ctx->addr, b->t[i].src_port, what);
    if (fd < 0) {
      while (b->nsocks > 0) close(b->socks[--b->nsocks]);
      return HCCN_E_FAIL;
    }
    b->sock_of[i] = (int)b->nsocks;
    b->socks[b->nsocks++] = fd;
  }
  return HCCN_SUCCESS;
}

/* ---- over RoCE: UD SENDs from the batch's own QP ----
 * The batch area (ctx->buffer_size bytes after the responder's slots) holds nrecv
 * receive slots of recv_len bytes, then nsend send slots of RP_SLOT bytes. Every
 * receive is posted before the first probe; an answer's slot is posted again as soon
 * as the answer is read. A send slot is busy from its post to its completion. */

static uint8_t *batch_area(const struct rp_batch *b) {
  return b->ctx->mem + (size_t)RP_RESP_SLOTS * b->ctx->resp_len;
}
static uint8_t *recv_slot(const struct rp_batch *b, uint32_t slot) {
  return batch_area(b) + (size_t)slot * b->recv_len;
}
static uint8_t *send_slot(const struct rp_batch *b, uint32_t slot) {
  return batch_area(b) + (size_t)b->nrecv * b->recv_len + (size_t)slot * RP_SLOT;
}

static void roce_qp_failed(struct rp_batch *b, const char *what, const char *why) {
  if (!b->qp_dead)
    log_error("rping %s: batch %u: UD QP 0x%x: %s: %s; the batch sends nothing more", b->ctx->addr_str, b->id,
              b->ud.qpn, what, why);
  b->qp_dead = true;
}

/* Read the answer in receive slot (completion wc) and count it if it is one. */
static void roce_take(struct rp_batch *b, uint32_t slot, const struct rdma_ud_wc *wc, uint64_t now) {
  uint8_t *grh = recv_slot(b, slot);
  struct rdma_grh_info gi = {.tc = 0};
  struct rp_pkt p;
  enum rp_err err;
  bool from_ok;

  if (wc->byte_len < RDMA_GRH_LEN || wc->byte_len > b->recv_len) return;
  err = rp_decode(grh + RDMA_GRH_LEN, wc->byte_len - RDMA_GRH_LEN, &p);
  if (err != RP_OK || p.target >= b->n) {
    log_debug("rping %s: batch %u: dropped a UD message from QP 0x%x: %s", b->ctx->addr_str, b->id,
              wc->src_qp, err != RP_OK ? rp_err_str(err) : "no such target");
    return;
  }
  /* From the target's QP and GID (the GRH's source), as the handshake told them. */
  from_ok = wc->src_qp == b->t[p.target].ep.qpn;
  if (wc->grh)
    from_ok = from_ok && rdma_grh_read(grh, &gi) > 0 && !memcmp(gi.sgid, b->t[p.target].ep.gid, 16);
  if (take_answer(b, &p, from_ok, gi.tc, now)) b->answered++;
}

/* Take the completions there are, RP_DRAIN_MAX at most, then Stop and the deadline again
 * (a flood of UD messages kept this loop going): free send slots, count answers, repost
 * receives. b->roce_more when it stopped with completions maybe left: the channel has no
 * event for them, so the next wait does not sleep. */
static void roce_drain(struct rp_batch *b) {
  struct rdma_ud_wc wc[RP_WC_BATCH];
  int n = 0;

  for (int taken = 0; taken < RP_DRAIN_MAX && (n = rdma_ud_poll(&b->ud, wc, RP_WC_BATCH)) > 0; taken += n) {
    uint64_t now = hixl_now_ns();
    for (int i = 0; i < n; i++) {
      uint32_t slot = (uint32_t)wc[i].wr_id;
      if (wc[i].wr_id & RP_WR_SEND) {
        if (slot >= b->nsend) continue;
        uint32_t probe = b->send_probe[slot];
        b->send_probe[slot] = UINT32_MAX;
        b->free_send[b->nfree++] = slot;
        if (wc[i].ok || probe == UINT32_MAX) continue;
        /* It never left: not sent, not counted (unless it was answered after all). */
        if (b->sent_ns[probe] != 0 && b->sent_ns[probe] != RP_ANSWERED) {
          b->sent_ns[probe] = 0;
          b->tally[probe / b->pkt_num].tx--;
          b->sent--;
        }
        roce_qp_failed(b, "a probe was not sent", wc[i].status);
        continue;
      }
      if (slot >= b->nrecv) continue;
      if (!wc[i].ok) {
        roce_qp_failed(b, "a receive failed", wc[i].status);
        continue;
      }
      roce_take(b, slot, &wc[i], now);
      int rc = rdma_ud_post_recv(&b->ud, recv_slot(b, slot), b->recv_len, b->ctx->lkey, slot);
      if (rc != 0) roce_qp_failed(b, "cannot post a receive", strerror(rc));
    }
  }
  b->roce_more = n > 0;
  if (n < 0) roce_qp_failed(b, "ibv_poll_cq", "failed");
}

/* Wait until a completion, Stop, or until (CLOCK_MONOTONIC ns), not at all when the last
 * drain left completions; then drain. */
static void roce_wait(struct rp_batch *b, uint64_t until) {
  struct pollfd pfd[2] = {{.fd = b->stop_efd, .events = POLLIN},
                          {.fd = rdma_ud_chan_fd(&b->ud), .events = POLLIN}};
  uint64_t now = hixl_now_ns();
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 0};

  if (until > now && !b->roce_more) {
    ts.tv_sec = (time_t)((until - now) / 1000000000u);
    ts.tv_nsec = (long)((until - now) % 1000000000u);
  }
  if (ppoll(pfd, 2, &ts, NULL) < 0 && errno != EINTR) {
    log_error("rping %s: batch %u: poll: %s; the batch ends early", b->ctx->addr_str, b->id, strerror(errno));
    b->stopping = true;
    return;
  }
  if (pfd[0].revents) b->stopping = true; /* Stop or Deinit */
  if (pfd[1].revents && rdma_ud_rearm(&b->ud) != 0)
    roce_qp_failed(b, "cannot re-arm its CQ", strerror(errno));
  roce_drain(b);
}

/* Post probe seq to every target, waiting for a free send slot where needed. */
static void roce_send_round(struct rp_batch *b, uint32_t seq) {
  for (size_t i = 0; i < b->n; i++) {
    const struct rp_target *t = &b->t[i];
    struct rp_pkt ping = {.version = RP_VERSION2,
                          .type = RP_PING,
                          .batch = b->id,
                          .target = (uint32_t)i,
                          .seq = seq,
                          .payload_len = t->payload_len,
                          .payload = t->payload};
    uint32_t slot;
    uint64_t now;
    size_t len;
    int rc;

    while (b->nfree == 0 && !b->stopping && !b->qp_dead) roce_wait(b, hixl_now_ns() + 100000000u);
    if (b->stopping || b->qp_dead) return;
    slot = b->free_send[--b->nfree];
    now = hixl_now_ns();
    ping.stamp = now;
    len = rp_encode(&ping, send_slot(b, slot), RP_SLOT);
    rc = rdma_ud_post_send(&b->ud, b->ah[i], t->ep.qpn, t->ep.qkey, send_slot(b, slot), (uint32_t)len,
                           b->ctx->lkey, RP_WR_SEND | slot);
    if (rc != 0) {
      b->free_send[b->nfree++] = slot;
      log_debug("rping %s: PING %u to %s: %s", b->ctx->addr_str, seq, t->name, strerror(rc));
      continue; /* not sent, not counted */
    }
    b->send_probe[slot] = (uint32_t)(i * b->pkt_num + seq);
    b->sent_ns[i * b->pkt_num + seq] = now;
    b->tally[i].tx++;
    b->sent++;
  }
  roce_drain(b); /* answers get their receive slots back between rounds, even at interval 0 */
}

static void *batch_roce_main(void *arg) {
  struct rp_batch *b = arg;
  const uint64_t interval = (uint64_t)b->interval_ms * 1000000u, timeout = (uint64_t)b->timeout_ms * 1000000u;
  const uint64_t t0 = hixl_now_ns();
  uint64_t last_send = t0, checked = 0; /* b->sent when Stop was last looked at */
  uint32_t round = 0;

  for (;;) {
    uint64_t now = hixl_now_ns();
    while (round < b->pkt_num && now >= t0 + round * interval && !b->stopping && !b->qp_dead) {
      roce_send_round(b, round++);
      now = last_send = hixl_now_ns();
      if (b->sent - checked >= RP_DRAIN_MAX) { /* a burst of due rounds: Stop may not wait for all */
        roce_wait(b, 0);
        checked = b->sent;
      }
    }
    if (b->stopping || b->qp_dead) break; /* a failed QP receives nothing either */
    if (round == b->pkt_num && (b->answered == b->sent || now >= last_send + timeout)) break;
    roce_wait(b, round < b->pkt_num ? t0 + round * interval : last_send + timeout);
  }
  batch_finish(b);
  return NULL;
}

static void roce_teardown(struct rp_batch *b) {
  rdma_ud_destroy_qp(&b->ud); /* first: no DMA into the batch area after this */
  for (size_t i = 0; b->ah && i < b->n; i++) rdma_ah_free(b->ah[i]);
  rdma_ud_close(&b->ud);
  free(b->ah);
  free(b->send_probe);
  free(b->free_send);
  b->ah = NULL;
  b->send_probe = b->free_send = NULL;
}

static HccnResult roce_setup(struct rp_batch *b) {
  const char *fn = "HccnRpingBatchPingStart";
  struct rp_ctx *c = b->ctx;
  uint64_t probes = (uint64_t)b->n * b->pkt_num;
  char err[512];
  HccnResult r;

  /* bufferSize > probes x RP_SLOT (checked by the caller) leaves room for a send slot. */
  b->recv_len = c->resp_len;
  uint64_t nrecv = (c->buffer_size - RP_SLOT) / b->recv_len;
  if (nrecv > probes) nrecv = probes;
  if (nrecv > RP_BATCH_RECV) nrecv = RP_BATCH_RECV;
  uint64_t nsend = (c->buffer_size - nrecv * b->recv_len) / RP_SLOT;
  if (nsend > RP_BATCH_SEND) nsend = RP_BATCH_SEND;
  if (nrecv == 0 || nsend == 0)
    return rp_fail(HCCN_E_PARA, "%s: attr->bufferSize %u leaves no room for a receive and a send of %u bytes",
                   fn, c->buffer_size, b->recv_len);
  if (rdma_ud_open(&c->dev, &b->ud, RP_QKEY, (uint32_t)nsend, (uint32_t)nrecv, err, sizeof(err)) != 0)
    return rp_fail(HCCN_E_FAIL, "%s: %s", fn, err);
  b->nrecv = b->ud.max_recv; /* the device may allow fewer */
  b->nsend = b->ud.max_send;
  b->ah = calloc(b->n, sizeof(*b->ah));
  b->send_probe = malloc(b->nsend * sizeof(*b->send_probe));
  b->free_send = malloc(b->nsend * sizeof(*b->free_send));
  if (!b->ah || !b->send_probe || !b->free_send) {
    r = rp_fail(HCCN_E_MEM, "%s: out of memory", fn);
    goto teardown;
  }
  for (uint32_t k = 0; k < b->nsend; k++) {
    b->send_probe[k] = UINT32_MAX;
    b->free_send[k] = b->nsend - 1 - k;
  }
  b->nfree = b->nsend;
  for (size_t i = 0; i < b->n; i++) {
    const struct rp_target *t = &b->t[i];
    b->ah[i] = rdma_ah_new(&c->dev, t->ep.gid, t->tc, t->sl, err, sizeof(err));
    if (!b->ah[i]) {
      r = rp_fail(HCCN_E_FAIL, "%s: target %s: %s", fn, t->name, err);
      goto teardown;
    }
    b->tally[i].set_tc = t->tc; /* what the AH was made with */
    b->tally[i].set_sl = t->sl;
  }
  for (uint32_t k = 0; k < b->nrecv; k++) {
    int rc = rdma_ud_post_recv(&b->ud, recv_slot(b, k), b->recv_len, c->lkey, k);
    if (rc != 0) {
      r = rp_fail(HCCN_E_FAIL, "%s: UD QP 0x%x: cannot post receive %u of %u: %s", fn, b->ud.qpn, k, b->nrecv,
                  strerror(rc));
      goto teardown;
    }
  }
  log_debug("rping %s: batch %u on UD QP 0x%x: %u receives, %u sends in flight at most", c->addr_str, b->id,
            b->ud.qpn, b->nrecv, b->nsend);
  return HCCN_SUCCESS;

teardown:
  roce_teardown(b);
  return r;
}

/* ---- either ---- */

HccnResult rp_batch_run(struct rp_batch *b) {
  HccnResult r;
  int rc;

  b->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (b->stop_efd < 0) return rp_fail(HCCN_E_FAIL, "HccnRpingBatchPingStart: eventfd: %s", strerror(errno));
  for (size_t i = 0; i < b->n; i++) {
    b->tally[i].set_tc = b->t[i].tc;
    b->tally[i].set_sl = b->t[i].sl;
  }
  r = b->ctx->roce ? roce_setup(b) : udp_setup(b);
  if (r != HCCN_SUCCESS) goto close_efd;
  rc = pthread_create(&b->thread, NULL, b->ctx->roce ? batch_roce_main : batch_udp_main, b);
  if (rc == 0) thread_name(b->thread, "hixl-rping");
  if (rc != 0) {
    r = rp_fail(HCCN_E_FAIL, "HccnRpingBatchPingStart: cannot start the prober thread: %s", strerror(rc));
    goto teardown;
  }
  return HCCN_SUCCESS;

teardown:
  if (b->ctx->roce) roce_teardown(b);
  while (b->nsocks > 0) close(b->socks[--b->nsocks]);
close_efd:
  close(b->stop_efd);
  b->stop_efd = -1;
  return r;
}

void rp_batch_free(struct rp_batch *b) {
  uint64_t one = 1;
  if (!b) return;
  if (write(b->stop_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
    log_error("rping %s: batch %u: cannot signal the prober: %s", b->ctx->addr_str, b->id, strerror(errno));
  pthread_join(b->thread, NULL);
  if (b->ctx->roce) roce_teardown(b);
  while (b->nsocks > 0) close(b->socks[--b->nsocks]);
  close(b->stop_efd);
  rp_batch_release(b);
}

void rp_batch_release(struct rp_batch *b) {
  if (!b) return;
  free(b->t);
  free(b->tally);
  free(b->sent_ns);
  free(b->sock_of);
  free(b->socks);
  free(b);
}
