/* rping_io: RPing's UDP sockets (bind; send and receive with the TOS byte) and AddTarget's handshake. */
/* The handshake sends HELLO until each target answers; every datagram is checked
 * (rp_decode) before anything reads it. Mode ROCE: the handshake stays on UDP (it is
 * how a target that has not run Init is noticed) and its HELLO_ACK carries the
 * responder's UD endpoint. The responder is rping_responder.c's, the batch prober
 * rping_prober.c's. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/ip.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
ssize_t rp_send_tos(int fd, const void *buf, size_t len, const struct sockaddr_in *to, int tos) {
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
ssize_t rp_recv_tos(int fd, uint8_t *buf, size_t cap, struct sockaddr_in *from, uint8_t *tos) {
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

/* ---- AddTarget handshake ---- */

static uint32_t rp_random32(void) {
  uint32_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  return (uint32_t)(hixl_now_ns() * 0x9e3779b97f4a7c15ull >> 32);
}

/* Whether gid is a's IPv4-mapped form (::ffff:a.b.c.d): the GID a RoCE responder
 * advertises, rdma_dev_open having picked the GID of its context's address. */
static bool gid_is_addr(const uint8_t gid[16], struct in_addr a) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(gid, mapped, sizeof(mapped)) == 0 && memcmp(gid + 12, &a.s_addr, 4) == 0;
}

bool rp_from_target(const struct sockaddr_in *from, const struct rp_target *t) {
  return from->sin_addr.s_addr == t->dst.s_addr && ntohs(from->sin_port) == t->port;
}

struct sockaddr_in rp_target_sa(const struct rp_target *t) {
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
        struct sockaddr_in to = rp_target_sa(&t[i]);
        size_t len = rp_encode(&hello, buf, sizeof(buf));
        if (!done[i] && rp_send_tos(fd, buf, len, &to, t[i].tc) < 0) {
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
    for (int taken = 0; taken < RP_DRAIN_MAX; taken++) { /* then the deadline again */
      struct sockaddr_in from;
      struct rp_pkt ack;
      uint8_t tos;
      ssize_t k = rp_recv_tos(fd, buf, sizeof(buf), &from, &tos);
      if (k == -1) break;
      if (k < 0 || rp_decode(buf, (size_t)k, &ack) != RP_OK) continue;
      if (ack.type != RP_HELLO_ACK || ack.target != nonce || ack.seq >= n || done[ack.seq] ||
          !rp_from_target(&from, &t[ack.seq]))
        continue;
      done[ack.seq] = true;
      left--;
      if (!ctx->roce) {
        ok[ack.seq] = true;
        continue;
      }
      /* rp_decode checked the endpoint already; a HELLO_ACK without one is from a
       * responder in mode UDP (or one that predates version 2). The endpoint is the
       * peer's word: probes go to its GID and answers count from there, so it must be
       * the address dialled, not another host's (nor a multicast group's). */
      struct rp_target *tt = &t[ack.seq];
      if (ack.payload_len != RP_EP_LEN || rp_ep_get(ack.payload, ack.payload_len, &tt->ep) != RP_OK)
        err[ack.seq] = RP_HS_NOT_ROCE;
      else if (!gid_is_addr(tt->ep.gid, tt->dst))
        err[ack.seq] = RP_HS_BAD_GID;
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
