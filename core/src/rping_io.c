/* rping_io: the sockets of RPing. The responder answers HELLO and PING on the
 * context's port with the TOS byte it received; AddTarget's handshake sends HELLO
 * until each target answers; the prober sends a batch's PINGs on schedule and matches
 * the answers. Every datagram is checked (rp_decode) before anything reads it. */
#include <arpa/inet.h>
#include <errno.h>
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

#include "log.h"
#include "rping_int.h"
#include "sock.h"

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

void *rp_responder_main(void *arg) {
  struct rp_ctx *ctx = arg;
  uint8_t buf[RP_MAX_PKT + 1]; /* one spare byte: longer datagrams show as MSG_TRUNC */
  struct pollfd pfd[2] = {{.fd = ctx->resp_fd, .events = POLLIN}, {.fd = ctx->close_efd, .events = POLLIN}};

  for (;;) {
    if (poll(pfd, 2, -1) < 0 && errno != EINTR) {
      log_error("rping responder %s:%u: poll: %s; no longer answering", ctx->addr_str, ctx->port,
                strerror(errno));
      break;
    }
    if (pfd[1].revents) break;
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

HccnResult rp_handshake(struct rp_ctx *ctx, const struct rp_target *t, size_t n, uint64_t deadline_ns,
                        bool *ok, int *err) {
  uint8_t buf[RP_MAX_PKT + 1];
  uint32_t nonce = rp_random32();
  uint64_t gap = RP_HELLO_FIRST_NS, next_send = 0;
  size_t left = n;
  HccnResult r = HCCN_SUCCESS;
  int fd = rp_udp_socket(ctx->addr, 0, "HccnRpingAddTarget");

  if (fd < 0) return HCCN_E_FAIL;
  memset(ok, 0, n * sizeof(*ok));
  memset(err, 0, n * sizeof(*err));
  while (left > 0) {
    uint64_t now = hixl_now_ns();
    struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}, {.fd = ctx->close_efd, .events = POLLIN}};
    uint64_t wake;

    if (now >= deadline_ns) break;
    if (now >= next_send) {
      for (size_t i = 0; i < n; i++) {
        struct rp_pkt hello = {.type = RP_HELLO, .target = nonce, .seq = (uint32_t)i, .stamp = now};
        struct sockaddr_in to = target_sa(&t[i]);
        size_t len = rp_encode(&hello, buf, sizeof(buf));
        if (!ok[i] && send_tos(fd, buf, len, &to, t[i].tc) < 0) {
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
      if (ack.type != RP_HELLO_ACK || ack.target != nonce || ack.seq >= n || ok[ack.seq] ||
          !from_target(&from, &t[ack.seq]))
        continue;
      ok[ack.seq] = true;
      left--;
    }
  }
  close(fd);
  return r;
}

/* ---- the batch prober ---- */

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

/* Match one answer; returns whether it was a valid, timely first answer. */
static bool take_pong(struct rp_batch *b, const uint8_t *buf, size_t n, const struct sockaddr_in *from,
                      uint64_t now) {
  struct rp_pkt p;
  const struct rp_target *t;
  uint64_t *sent;
  uint64_t rtt;
  struct rp_tally *tl;

  if (rp_decode(buf, n, &p) != RP_OK || p.type != RP_PONG || p.batch != b->id || p.target >= b->n ||
      p.seq >= b->pkt_num)
    return false;
  t = &b->t[p.target];
  sent = &b->sent_ns[(size_t)p.target * b->pkt_num + p.seq];
  if (!from_target(from, t) || *sent == 0 || *sent == RP_ANSWERED) return false;
  if (p.payload_len != t->payload_len || (p.payload_len && memcmp(p.payload, t->payload, p.payload_len))) {
    log_debug("rping %s: answer %u from %s has a damaged payload; counted lost", b->ctx->addr_str, p.seq,
              t->name);
    return false;
  }
  rtt = now - *sent;
  *sent = RP_ANSWERED; /* duplicates and late copies are ignored from now on */
  if (rtt > (uint64_t)b->timeout_ms * 1000000u) return false; /* late: lost */
  tl = &b->tally[p.target];
  tl->rx++;
  tl->rtt_sum += rtt;
  if (tl->rx == 1 || rtt < tl->rtt_min) tl->rtt_min = rtt;
  if (rtt > tl->rtt_max) tl->rtt_max = rtt;
  return true;
}

static void *batch_main(void *arg) {
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
        if (k >= 0 && take_pong(b, buf, (size_t)k, &from, hixl_now_ns())) answered++;
      }
    }
  }
  free(pfd);
finish:
  pthread_mutex_lock(&b->ctx->lock);
  b->done = true;
  pthread_mutex_unlock(&b->ctx->lock);
  return NULL;
}

HccnResult rp_batch_run(struct rp_batch *b) {
  HccnResult r;
  int rc;

  b->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (b->stop_efd < 0) return rp_fail(HCCN_E_FAIL, "HccnRpingBatchPingStart: eventfd: %s", strerror(errno));
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
      r = HCCN_E_FAIL;
      goto close_socks;
    }
    b->sock_of[i] = (int)b->nsocks;
    b->socks[b->nsocks++] = fd;
  }
  rc = pthread_create(&b->thread, NULL, batch_main, b);
  if (rc != 0) {
    r = rp_fail(HCCN_E_FAIL, "HccnRpingBatchPingStart: cannot start the prober thread: %s", strerror(rc));
    goto close_socks;
  }
  return HCCN_SUCCESS;

close_socks:
  while (b->nsocks > 0) close(b->socks[--b->nsocks]);
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
  while (b->nsocks > 0) close(b->socks[--b->nsocks]);
  close(b->stop_efd);
  free(b->t);
  free(b->tally);
  free(b->sent_ns);
  free(b->sock_of);
  free(b->socks);
  free(b);
}
