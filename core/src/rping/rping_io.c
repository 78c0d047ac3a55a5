/* rping_io: the sockets and queue pairs of RPing. The responder answers HELLO and PING
 * on the context's UDP port with the TOS byte it received; AddTarget's handshake sends
 * HELLO until each target answers; the prober sends a batch's PINGs on schedule and
 * matches the answers. Every datagram is checked (rp_decode) before anything reads it.
 *
 * Mode ROCE: the handshake stays on UDP (it is how a target that has not run Init is
 * noticed) and its HELLO_ACK carries the responder's UD endpoint. PINGs and PONGs are
 * UD SENDs: the prober's address handle per target carries the target's traffic class
 * (GRH) and service level; the responder answers each PING with an address handle made
 * from the received completion and GRH (ibv_create_ah_from_wc), so the answer goes
 * back with the traffic class the probe arrived with, and says which in its tos. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/ip.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"
#include "rping/rping_int.h"
#include "util/sock.h"
#include "util/status_int.h"

#define RP_SOCK_BUF       (1 << 20)    /* a batch's answers arrive in bursts */
#define RP_HELLO_FIRST_NS 10000000ull  /* handshake resend: 10 ms, doubling ... */
#define RP_HELLO_MAX_NS   500000000ull /* ... up to 500 ms */
#define RP_CMSG_SPACE     CMSG_SPACE(sizeof(int))

int rp_udp_socket(struct in_addr addr, uint16_t port, const char *what) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
  char ip[INET_ADDRSTRLEN];
  int one = 1, buf = RP_SOCK_BUF;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

  inet_ntop(AF_INET, &addr, ip, sizeof(ip));
  if (fd < 0) {
    rp_fail(HCCN_E_FAIL, "%s: socket(): %s", what, strerror(errno));
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  if (setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) < 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    rp_fail(HCCN_E_FAIL, "%s: cannot bind UDP %s:%u: %s", what, ip, (unsigned)port, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* The detail goes to the thread's hixl error message, with the nearest HixlStatus. */
HccnResult rp_fail(HccnResult r, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  hixl_fail(r == HCCN_E_PARA  ? HIXL_PARAM_INVALID
            : r == HCCN_E_MEM ? HIXL_RESOURCE_EXHAUSTED
                              : HIXL_FAILED,
            "%s", msg);
  return r;
}

/* sendmsg one datagram with its IP TOS byte. */
static ssize_t send_tos(int fd, const void *buf, size_t len, const struct sockaddr_in *to, int tos) {
  union {
    char buf[RP_CMSG_SPACE];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr m = {.msg_name = (void *)to,
                     .msg_namelen = sizeof(*to),
                     .msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl.buf,
                     .msg_controllen = sizeof(ctl.buf)};
  struct cmsghdr *c;

  memset(&ctl, 0, sizeof(ctl));
  c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = IPPROTO_IP;
  c->cmsg_type = IP_TOS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &tos, sizeof(tos));
  return sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* recvmsg one datagram; *tos gets its IP TOS byte. Returns the length, -1 when the
 * socket is drained (or failed), -2 for a datagram too long for buf (dropped). */
static ssize_t recv_tos(int fd, uint8_t *buf, size_t cap, struct sockaddr_in *from, uint8_t *tos) {
  union {
    char buf[64];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct msghdr m = {.msg_name = from,
                     .msg_namelen = sizeof(*from),
                     .msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl.buf,
                     .msg_controllen = sizeof(ctl.buf)};
  ssize_t n;

  do n = recvmsg(fd, &m, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  *tos = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS && c->cmsg_len >= CMSG_LEN(1))
      *tos = *(const uint8_t *)CMSG_DATA(c);
  if ((m.msg_flags & MSG_TRUNC) || m.msg_namelen != sizeof(*from) || from->sin_family != AF_INET) return -2;
  return n;
}

/* "ip:port" of sa into buf, for log lines (inet_ntoa is not thread-safe). */
static const char *sa_str(const struct sockaddr_in *sa, char *buf, size_t len) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
  snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
  return buf;
}

/* ---- responder ---- */

#define RP_WR_SEND  (1ull << 32) /* wr_id: a send (else a receive); the low 32 bits are the slot */
#define RP_WC_BATCH 16

static uint8_t *resp_slot(struct rp_ctx *ctx, uint32_t slot) {
  return ctx->mem + (size_t)slot * ctx->resp_len;
}

static void resp_repost(struct rp_ctx *ctx, uint32_t slot) {
  int rc = rdma_ud_post_recv(&ctx->resp_ud, resp_slot(ctx, slot), ctx->resp_len, ctx->lkey, slot);
  if (rc != 0)
    log_error("rping responder %s: UD QP 0x%x: cannot post a receive: %s; answering less", ctx->addr_str,
              ctx->resp_ud.qpn, strerror(rc));
}

/* The AH that answers the message of wc (GRH gi): a kept one made from an earlier
 * probe with the same GRH and SL, else a new one from ibv_create_ah_from_wc, kept when
 * there is room. *ent gets its ah_cache index, or -1 for an AH of this answer alone. */
static struct ibv_ah *answer_ah(struct rp_ctx *ctx, const struct rdma_ud_wc *wc, const uint8_t *grh,
                                const struct rdma_grh_info *gi, int *ent) {
  struct rp_ah_ent *e, *idle = NULL;
  struct ibv_ah *ah;

  *ent = -1;
  for (int k = 0; wc->grh && k < RP_AH_CACHE; k++) {
    e = &ctx->ah_cache[k];
    if (e->ah && e->sl == wc->sl && e->slid == wc->slid && !memcmp(&e->grh, gi, sizeof(*gi))) {
      e->busy++;
      e->used = ++ctx->ah_clock;
      *ent = k;
      return e->ah;
    }
    if (e->busy == 0 && (!idle || !e->ah || (idle->ah && e->used < idle->used))) idle = e;
  }
  /* ibv_create_ah_from_wc takes the traffic class from the probe's GRH: the answer
   * travels with the class the probe came with. */
  ah = rdma_ah_from_wc(&ctx->dev, wc, grh);
  if (!ah || !wc->grh || !idle) return ah;
  rdma_ah_free(idle->ah); /* the least recently used idle one */
  idle->ah = ah;
  idle->grh = *gi;
  idle->sl = wc->sl;
  idle->slid = wc->slid;
  idle->busy = 1;
  idle->used = ++ctx->ah_clock;
  *ent = (int)(idle - ctx->ah_cache);
  return ah;
}

/* An answer has left (or was never posted): let go of its AH. */
static void answer_ah_done(struct rp_ctx *ctx, uint32_t slot) {
  if (ctx->resp_ent[slot] >= 0)
    ctx->ah_cache[ctx->resp_ent[slot]].busy--;
  else
    rdma_ah_free(ctx->resp_ah[slot]);
  ctx->resp_ent[slot] = -1;
  ctx->resp_ah[slot] = NULL;
}

/* Answer the PING in slot (a UD receive) in place; false when it is dropped, so the
 * caller posts the slot again at once. */
static bool roce_answer(struct rp_ctx *ctx, uint32_t slot, const struct rdma_ud_wc *wc) {
  uint8_t *grh = resp_slot(ctx, slot), *msg = grh + RDMA_GRH_LEN;
  struct rdma_grh_info gi;
  size_t n, len;
  struct rp_pkt pkt;
  enum rp_err err;
  struct ibv_ah *ah;
  int rc, ent;

  if (wc->byte_len < RDMA_GRH_LEN || wc->byte_len > ctx->resp_len) return false;
  n = wc->byte_len - RDMA_GRH_LEN;
  err = rp_decode(msg, n, &pkt);
  if (err != RP_OK || pkt.type != RP_PING) {
    log_debug("rping responder %s: dropped a %zu-byte UD message from QP 0x%x: %s", ctx->addr_str, n,
              wc->src_qp, err != RP_OK ? rp_err_str(err) : "not a PING");
    return false;
  }
  memset(&gi, 0, sizeof(gi));
  if (wc->grh && rdma_grh_read(grh, &gi) < 0) {
    log_debug("rping responder %s: a PING from QP 0x%x has a GRH of no known kind", ctx->addr_str,
              wc->src_qp);
    return false;
  }
  ah = answer_ah(ctx, wc, grh, &gi, &ent);
  if (!ah) {
    log_debug("rping responder %s: no address handle back to QP 0x%x: %s", ctx->addr_str, wc->src_qp,
              strerror(errno));
    return false;
  }
  ctx->resp_ah[slot] = ah;
  ctx->resp_ent[slot] = (int16_t)ent;
  pkt.type = RP_PONG;
  pkt.tos = gi.tc;                                          /* the traffic class the probe arrived with */
  len = rp_encode(&pkt, msg, ctx->resp_len - RDMA_GRH_LEN); /* in place */
  rc = len ? rdma_ud_post_send(&ctx->resp_ud, ah, wc->src_qp, RP_QKEY, msg, (uint32_t)len, ctx->lkey,
                               RP_WR_SEND | slot)
           : EINVAL;
  if (rc != 0) {
    log_debug("rping responder %s: answer to QP 0x%x: %s", ctx->addr_str, wc->src_qp, strerror(rc));
    answer_ah_done(ctx, slot);
    return false;
  }
  return true; /* the AH is let go when the send completes */
}

/* Drain the responder's CQ: answer PINGs; a slot whose answer left receives again. */
static void roce_answer_all(struct rp_ctx *ctx) {
  struct rdma_ud_wc wc[RP_WC_BATCH];
  int n;

  while ((n = rdma_ud_poll(&ctx->resp_ud, wc, RP_WC_BATCH)) > 0) {
    for (int i = 0; i < n; i++) {
      uint32_t slot = (uint32_t)wc[i].wr_id;
      if (slot >= RP_RESP_SLOTS) continue;
      if (wc[i].wr_id & RP_WR_SEND) {
        answer_ah_done(ctx, slot);
        if (!wc[i].ok && !wc[i].flushed)
          log_debug("rping responder %s: an answer failed: %s", ctx->addr_str, wc[i].status);
      } else if (!wc[i].ok) {
        if (!wc[i].flushed)
          log_error("rping responder %s: UD QP 0x%x: receive failed: %s", ctx->addr_str, ctx->resp_ud.qpn,
                    wc[i].status);
        continue; /* the QP is in error: nothing more arrives */
      } else if (roce_answer(ctx, slot, &wc[i])) {
        continue; /* the slot receives again once its answer has left */
      }
      resp_repost(ctx, slot);
    }
  }
  if (n < 0) log_error("rping responder %s: ibv_poll_cq failed", ctx->addr_str);
}

void *rp_responder_main(void *arg) {
  struct rp_ctx *ctx = arg;
  uint8_t buf[RP_MAX_PKT + 1]; /* one spare byte: longer datagrams show as MSG_TRUNC */
  struct pollfd pfd[3] = {{.fd = ctx->resp_fd, .events = POLLIN},
                          {.fd = ctx->close_efd, .events = POLLIN},
                          {.fd = ctx->roce ? rdma_ud_chan_fd(&ctx->resp_ud) : -1, .events = POLLIN}};

  for (;;) {
    if (poll(pfd, 3, -1) < 0 && errno != EINTR) {
      log_error("rping responder %s:%u: poll: %s; no longer answering", ctx->addr_str, ctx->port,
                strerror(errno));
      break;
    }
    if (pfd[1].revents) break;
    if (pfd[2].revents) {
      if (rdma_ud_rearm(&ctx->resp_ud) != 0)
        log_error("rping responder %s: UD QP 0x%x: cannot re-arm its CQ: %s", ctx->addr_str, ctx->resp_ud.qpn,
                  strerror(errno));
      roce_answer_all(ctx);
    }
    for (;;) {
      struct sockaddr_in from;
      struct rp_pkt pkt;
      uint8_t tos;
      char who[RP_NAME_LEN];
      enum rp_err err;
      ssize_t n = recv_tos(ctx->resp_fd, buf, sizeof(buf), &from, &tos);
      size_t len;

      if (n == -1) break;
      if (n == -2) continue;
      err = rp_decode(buf, (size_t)n, &pkt);
      if (err != RP_OK || (pkt.type != RP_HELLO && pkt.type != RP_PING)) {
        log_debug("rping responder %s:%u: dropped %zd bytes from %s: %s", ctx->addr_str, ctx->port, n,
                  sa_str(&from, who, sizeof(who)), err != RP_OK ? rp_err_str(err) : "not a request");
        continue;
      }
      uint8_t ep[RP_EP_LEN];
      if (pkt.type == RP_HELLO && pkt.version >= RP_VERSION2 && ctx->roce && rp_ep_put(&ctx->ep, ep)) {
        pkt.payload = ep; /* a version-2 client learns where to send RoCE probes */
        pkt.payload_len = RP_EP_LEN;
      }
      pkt.type = pkt.type == RP_HELLO ? RP_HELLO_ACK : RP_PONG;
      pkt.tos = tos;
      len = rp_encode(&pkt, buf, sizeof(buf)); /* in place: the payload stays where it is */
      if (len && send_tos(ctx->resp_fd, buf, len, &from, tos) < 0)
        log_debug("rping responder %s:%u: answer to %s: %s", ctx->addr_str, ctx->port,
                  sa_str(&from, who, sizeof(who)), strerror(errno));
    }
  }
  return NULL;
}

/* ---- AddTarget handshake ---- */

static uint32_t rp_random32(void) {
  uint32_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  return (uint32_t)(hixl_now_ns() * 0x9e3779b97f4a7c15ull >> 32);
}

static bool from_target(const struct sockaddr_in *from, const struct rp_target *t) {
  return from->sin_addr.s_addr == t->dst.s_addr && ntohs(from->sin_port) == t->port;
}

static struct sockaddr_in target_sa(const struct rp_target *t) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(t->port), .sin_addr = t->dst};
  return sa;
}

HccnResult rp_handshake(struct rp_ctx *ctx, struct rp_target *t, size_t n, uint64_t deadline_ns, bool *ok,
                        int *err) {
  uint8_t buf[RP_MAX_PKT + 1];
  uint32_t nonce = rp_random32();
  uint64_t gap = RP_HELLO_FIRST_NS, next_send = 0;
  size_t left = n;
  HccnResult r = HCCN_SUCCESS;
  bool *done = calloc(n, sizeof(*done)); /* answered, usable or not */
  int fd;

  if (!done) return rp_fail(HCCN_E_MEM, "HccnRpingAddTarget: out of memory");
  fd = rp_udp_socket(ctx->addr, 0, "HccnRpingAddTarget");
  if (fd < 0) {
    free(done);
    return HCCN_E_FAIL;
  }
  memset(ok, 0, n * sizeof(*ok));
  memset(err, 0, n * sizeof(*err));
  while (left > 0) {
    uint64_t now = hixl_now_ns();
    struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}, {.fd = ctx->close_efd, .events = POLLIN}};
    uint64_t wake;

    if (now >= deadline_ns) break;
    if (now >= next_send) {
      for (size_t i = 0; i < n; i++) {
        /* A ROCE context asks in version 2, which a ROCE responder answers with its endpoint. */
        struct rp_pkt hello = {.version = ctx->roce ? RP_VERSION2 : RP_VERSION1,
                               .type = RP_HELLO,
                               .target = nonce,
                               .seq = (uint32_t)i,
                               .stamp = now};
        struct sockaddr_in to = target_sa(&t[i]);
        size_t len = rp_encode(&hello, buf, sizeof(buf));
        if (!done[i] && send_tos(fd, buf, len, &to, t[i].tc) < 0) {
          err[i] = errno;
          log_debug("rping %s: HELLO to %s: %s", ctx->addr_str, t[i].name, strerror(errno));
        }
      }
      next_send = now + gap;
      gap = gap * 2 > RP_HELLO_MAX_NS ? RP_HELLO_MAX_NS : gap * 2;
    }
    wake = next_send < deadline_ns ? next_send : deadline_ns;
    struct timespec ts = {.tv_sec = (time_t)((wake - now) / 1000000000u),
                          .tv_nsec = (long)((wake - now) % 1000000000u)};
    if (ppoll(pfd, 2, &ts, NULL) < 0 && errno != EINTR) {
      r = rp_fail(HCCN_E_FAIL, "HccnRpingAddTarget: poll: %s", strerror(errno));
      break;
    }
    if (pfd[1].revents) {
      r = rp_fail(HCCN_E_FAIL, "HccnRpingAddTarget: the context on %s was deinitialized while waiting",
                  ctx->addr_str);
      break;
    }
    for (;;) {
      struct sockaddr_in from;
      struct rp_pkt ack;
      uint8_t tos;
      ssize_t k = recv_tos(fd, buf, sizeof(buf), &from, &tos);
      if (k == -1) break;
      if (k < 0 || rp_decode(buf, (size_t)k, &ack) != RP_OK) continue;
      if (ack.type != RP_HELLO_ACK || ack.target != nonce || ack.seq >= n || done[ack.seq] ||
          !from_target(&from, &t[ack.seq]))
        continue;
      done[ack.seq] = true;
      left--;
      if (!ctx->roce) {
        ok[ack.seq] = true;
        continue;
      }
      /* rp_decode checked the endpoint already; a HELLO_ACK without one is from a
       * responder in mode UDP (or one that predates version 2). */
      struct rp_target *tt = &t[ack.seq];
      if (ack.payload_len != RP_EP_LEN || rp_ep_get(ack.payload, ack.payload_len, &tt->ep) != RP_OK)
        err[ack.seq] = RP_HS_NOT_ROCE;
      else if (tt->ep.mtu < RP_HDR_LEN + tt->payload_len)
        err[ack.seq] = RP_HS_SMALL_MTU;
      else
        ok[ack.seq] = true;
    }
  }
  close(fd);
  free(done);
  return r;
}

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

/* Send probe seq to every target; returns how many left. */
static uint32_t send_round(struct rp_batch *b, uint32_t seq, uint8_t *buf, size_t cap) {
  uint32_t sent = 0;
  for (size_t i = 0; i < b->n; i++) {
    const struct rp_target *t = &b->t[i];
    struct rp_pkt ping = {.type = RP_PING,
                          .batch = b->id,
                          .target = (uint32_t)i,
                          .seq = seq,
                          .payload_len = t->payload_len,
                          .payload = t->payload};
    struct sockaddr_in to = target_sa(t);
    uint64_t now = hixl_now_ns();
    size_t len;

    ping.stamp = now;
    len = rp_encode(&ping, buf, cap);
    if (send_tos(b->socks[b->sock_of[i]], buf, len, &to, t->tc) < 0) {
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
  return take_answer(b, &p, from_target(from, &b->t[p.target]), tos, now);
}

static void *batch_udp_main(void *arg) {
  struct rp_batch *b = arg;
  uint8_t buf[RP_MAX_PKT + 1];
  const uint64_t interval = (uint64_t)b->interval_ms * 1000000u, timeout = (uint64_t)b->timeout_ms * 1000000u;
  const uint64_t t0 = hixl_now_ns();
  uint64_t last_send = t0, sent = 0, answered = 0;
  uint32_t round = 0;
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

    while (round < b->pkt_num && now >= t0 + round * interval) {
      sent += send_round(b, round++, buf, sizeof(buf));
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
      for (;;) {
        struct sockaddr_in from;
        uint8_t tos;
        ssize_t k = recv_tos(pfd[s].fd, buf, sizeof(buf), &from, &tos);
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

/* Take every completion there is: free send slots, count answers, repost receives. */
static void roce_drain(struct rp_batch *b) {
  struct rdma_ud_wc wc[RP_WC_BATCH];
  int n;

  while ((n = rdma_ud_poll(&b->ud, wc, RP_WC_BATCH)) > 0) {
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
  if (n < 0) roce_qp_failed(b, "ibv_poll_cq", "failed");
}

/* Wait until a completion, Stop, or until (CLOCK_MONOTONIC ns); then drain. */
static void roce_wait(struct rp_batch *b, uint64_t until) {
  struct pollfd pfd[2] = {{.fd = b->stop_efd, .events = POLLIN},
                          {.fd = rdma_ud_chan_fd(&b->ud), .events = POLLIN}};
  uint64_t now = hixl_now_ns();
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 0};

  if (until > now) {
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
  uint64_t last_send = t0;
  uint32_t round = 0;

  for (;;) {
    uint64_t now = hixl_now_ns();
    while (round < b->pkt_num && now >= t0 + round * interval && !b->stopping && !b->qp_dead) {
      roce_send_round(b, round++);
      now = last_send = hixl_now_ns();
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

/* ---- mode ROCE: the context's device, memory and responder QP ---- */

uint32_t rp_roce_max_payload(const struct rp_ctx *ctx) {
  uint32_t mtu = rdma_mtu_bytes(&ctx->dev);
  uint32_t room = mtu > RP_HDR_LEN ? mtu - RP_HDR_LEN : 0;
  return room < RP_MAX_PAYLOAD ? room : RP_MAX_PAYLOAD;
}

HccnResult rp_roce_open(struct rp_ctx *c) {
  const char *fn = "HccnRpingInit";
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = c->addr};
  char err[512];
  HccnResult r;

  if (!rdma_available())
    return rp_fail(HCCN_E_FAIL,
                   "%s: mode HCCN_RPING_MODE_ROCE probes over RDMA, and this host has no RDMA device; "
                   "use HCCN_RPING_MODE_UDP",
                   fn);
  if (!rdma_ip_has_device(&sa))
    return rp_fail(HCCN_E_FAIL,
                   "%s: mode HCCN_RPING_MODE_ROCE: no RDMA device owns %s (librdmacm found none); name the "
                   "address of a RoCE device, or use HCCN_RPING_MODE_UDP",
                   fn, c->addr_str);
  if (rdma_dev_open(&c->dev, &sa, NULL, -1, err, sizeof(err)) != 0)
    return rp_fail(HCCN_E_FAIL, "%s: mode HCCN_RPING_MODE_ROCE on %s: %s", fn, c->addr_str, err);
  /* A receive holds the GRH and the largest message the port carries. */
  c->resp_len = (RDMA_GRH_LEN + rdma_mtu_bytes(&c->dev) + RP_SLOT - 1) / RP_SLOT * RP_SLOT;
  c->mem_len = (size_t)RP_RESP_SLOTS * c->resp_len + c->buffer_size;
  c->mem = aligned_alloc(HCCN_RPING_BUFFER_ALIGN, c->mem_len);
  c->resp_ah = calloc(RP_RESP_SLOTS, sizeof(*c->resp_ah));
  c->resp_ent = malloc(RP_RESP_SLOTS * sizeof(*c->resp_ent));
  if (!c->mem || !c->resp_ah || !c->resp_ent) {
    r = rp_fail(HCCN_E_MEM, "%s: out of memory for %zu bytes of probe buffers", fn, c->mem_len);
    goto free_mem;
  }
  memset(c->mem, 0, c->mem_len);
  for (uint32_t k = 0; k < RP_RESP_SLOTS; k++) c->resp_ent[k] = -1;
  c->mr = rdma_reg_local(&c->dev, c->mem, c->mem_len, err, sizeof(err));
  if (!c->mr) {
    r = rp_fail(HCCN_E_FAIL, "%s: %s", fn, err);
    goto free_mem;
  }
  c->lkey = rdma_mr_lkey(c->mr);
  if (rdma_ud_open(&c->dev, &c->resp_ud, RP_QKEY, RP_RESP_SLOTS, RP_RESP_SLOTS, err, sizeof(err)) != 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: %s", fn, err);
    goto dereg;
  }
  for (uint32_t k = 0; k < c->resp_ud.max_recv; k++) {
    int rc = rdma_ud_post_recv(&c->resp_ud, c->mem + (size_t)k * c->resp_len, c->resp_len, c->lkey, k);
    if (rc != 0) {
      r = rp_fail(HCCN_E_FAIL, "%s: UD QP 0x%x: cannot post receive %u: %s", fn, c->resp_ud.qpn, k,
                  strerror(rc));
      goto close_ud;
    }
  }
  c->ep.qpn = c->resp_ud.qpn;
  c->ep.qkey = RP_QKEY;
  c->ep.mtu = rdma_mtu_bytes(&c->dev);
  memcpy(c->ep.gid, c->dev.gid, 16);
  log_info("rping: %s answers RoCE probes on %s UD QP 0x%x (GID index %d, MTU %u)", c->addr_str, c->dev.name,
           c->ep.qpn, c->dev.gid_index, c->ep.mtu);
  return HCCN_SUCCESS;

close_ud:
  rdma_ud_close(&c->resp_ud);
dereg:
  rdma_dereg(c->mr);
  c->mr = NULL;
free_mem:
  free(c->resp_ent);
  free(c->resp_ah);
  free(c->mem);
  c->resp_ent = NULL;
  c->resp_ah = NULL;
  c->mem = NULL;
  rdma_dev_close(&c->dev);
  return r;
}

/* Teardown in reverse: the QP (no DMA after it), the answers' AHs, the MR, the CQ and
 * channel, the memory, then the device's CQ, channel, PD and context. */
void rp_roce_close(struct rp_ctx *c) {
  rdma_ud_destroy_qp(&c->resp_ud);
  for (uint32_t k = 0; k < RP_RESP_SLOTS; k++)
    if (c->resp_ent[k] < 0) rdma_ah_free(c->resp_ah[k]);
  for (int k = 0; k < RP_AH_CACHE; k++) rdma_ah_free(c->ah_cache[k].ah);
  memset(c->ah_cache, 0, sizeof(c->ah_cache));
  rdma_dereg(c->mr);
  rdma_ud_close(&c->resp_ud);
  free(c->resp_ent);
  free(c->resp_ah);
  free(c->mem);
  rdma_dev_close(&c->dev);
  c->resp_ent = NULL;
  c->resp_ah = NULL;
  c->mem = NULL;
  c->mr = NULL;
}
