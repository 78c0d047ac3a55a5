/* RPing (HccnRping*) on loopback: the probe packet codec (versions 1 and 2, the RoCE
 * endpoint, the RoCE GRH reader), every argument and state
 * rule of the API with its error, results from real responders (in this process on
 * 127.0.0.x devices, and in a child process on 127.0.0.1), the IP TOS byte both ways,
 * and the prober against hostile or impaired fake responders built from the packet
 * codec: duplicates, forgeries, damaged payloads, drops, delays and late answers. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sock_diag.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "hixl/hixl.h"
#include "transport/rdma/rdma.h"
#include "rping/rping_int.h"
#include "rping/rping_wire.h"
#include "test_util.h"

#define BUF_BIG (4096u * 1024u) /* bufferSize that fits every batch below */

/* ---------------------------------------------------------------- helpers */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A UDP port free on ip right now (bind :0, read it, close); 0 on error. */
static uint16_t free_udp_port(const char *ip) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;

  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* A UDP socket bound to ip:port (port 0: any), IP_RECVTOS on; -1 on error. */
static int udp_bind(const char *ip, uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  int one = 1, fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (fd < 0) return -1;
  setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static uint16_t sock_port(int fd) {
  struct sockaddr_in sa;
  socklen_t len = sizeof(sa);
  return getsockname(fd, (struct sockaddr *)&sa, &len) == 0 ? ntohs(sa.sin_port) : 0;
}

static struct sockaddr_in sa_of(const char *ip, uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  return sa;
}

/* Receive one datagram within timeout_ms; *tos gets its TOS byte. -1 on timeout. */
static ssize_t recv_wait(int fd, uint8_t *buf, size_t cap, int timeout_ms, struct sockaddr_in *from,
                         uint8_t *tos) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char ctl[64];
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct sockaddr_in dummy;
  struct msghdr m = {.msg_name = from ? from : &dummy,
                     .msg_namelen = sizeof(dummy),
                     .msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl,
                     .msg_controllen = sizeof(ctl)};
  ssize_t n;

  if (poll(&p, 1, timeout_ms) != 1) return -1;
  n = recvmsg(fd, &m, 0);
  if (tos) {
    *tos = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n >= 0 && c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) *tos = *(uint8_t *)CMSG_DATA(c);
  }
  return n;
}

static HccnRpingInitAttr attr_of(uint16_t port) {
  HccnRpingInitAttr a = {.mode = HCCN_RPING_MODE_UDP,
                         .port = port,
                         .npuNum = 64,
                         .bufferSize = BUF_BIG,
                         .sl = 4,
                         .tc = 132,
                         .ipAddr = NULL};
  return a;
}

/* A context on device ip with its responder on a free port; *port gets the port. */
static HccnRpingCtx ctx_on(const char *ip, uint16_t *port) {
  HccnRpingCtx c = NULL;
  if (port) *port = 0; /* set on every path (gcc -O3 cannot see the callers stop on NULL) */
  uint16_t p = free_udp_port(ip);
  HccnRpingInitAttr a = attr_of(p);
  HccnResult r = HccnRpingInit(ip, &a, &c);

  if (r != HCCN_SUCCESS) {
    fprintf(stderr, "ctx_on %s:%u: %s: %s\n", ip, p, HccnResultName(r), HixlGetLastErrorMessage());
    return NULL;
  }
  if (port) *port = p;
  return c;
}

static HccnRpingTargetInfo tgt(const char *ip, uint16_t port) {
  HccnRpingTargetInfo t;
  memset(&t, 0, sizeof(t));
  t.dstIp = (char *)ip;
  t.port = port;
  t.sl = 4;
  t.tc = 132;
  return t;
}

/* Poll GetResult (the API's contract) until it is not HCCN_E_AGAIN or timeout_ms. */
static HccnResult wait_results(HccnRpingCtx c, uint32_t n, HccnRpingTargetInfo *t, HccnRpingResultInfo *res,
                               int timeout_ms) {
  uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
  struct timespec pause = {0, 1000000};
  HccnResult r;

  while ((r = HccnRpingGetResult(c, n, t, res)) == HCCN_E_AGAIN && now_ns() < deadline)
    nanosleep(&pause, NULL);
  return r;
}

/* Every probe answered, with sane times. */
static void check_all_answered(const HccnRpingResultInfo *r, uint32_t pkts, uint32_t timeout_ms,
                               const char *what) {
  if (r->state != HCCN_RPING_RESULT_STATE_VALID || r->txPkt != pkts || r->rxPkt != pkts ||
      r->minRTT > r->avgRTT || r->avgRTT > r->maxRTT || r->maxRTT > timeout_ms * 1000u)
    tu_fail(__FILE__, __LINE__,
            "%s: state %d tx %u rx %u min/avg/max %u/%u/%u us (want %u answered, < %u ms)", what,
            (int)r->state, r->txPkt, r->rxPkt, r->minRTT, r->avgRTT, r->maxRTT, pkts, timeout_ms);
  else
    CU_PASS(what);
}

/* ---------------------------------------------------------------- a fake responder
 * Answers HELLO, and PING according to its behaviour, from a thread of this test. */

#define FAKE_QUEUE 4096

struct fake_reply {
  uint64_t due_ns;
  struct sockaddr_in to;
  size_t len;
  uint8_t buf[RP_MAX_PKT];
};

struct fake {
  const char *ip;
  uint16_t port;
  int fd, efd;
  pthread_t th;
  /* behaviour */
  uint32_t drop_mod, drop_rem; /* no answer when seq % drop_mod == drop_rem */
  uint32_t late_mod, late_rem; /* answer after late_ms when seq % late_mod == late_rem */
  uint32_t late_ms, delay_ms;  /* every other answer after delay_ms */
  bool forge;                  /* around each answer: duplicates and forgeries */
  bool damage;                 /* flip a payload byte of every answer */
  bool mute;                   /* answer HELLO only */
  /* what it saw */
  atomic_uint pings;
  atomic_uint bad_tos; /* PINGs whose TOS byte was not want_tos */
  atomic_uint bad_src; /* PINGs not from want_src_port (when set) */
  uint8_t want_tos;
  uint16_t want_src_port;
  struct fake_reply *q; /* delayed answers, unordered */
  size_t nq;
};

static void fake_send(struct fake *f, const uint8_t *buf, size_t len, const struct sockaddr_in *to) {
  if (sendto(f->fd, buf, len, 0, (const struct sockaddr *)to, sizeof(*to)) < 0) perror("fake: sendto");
}

static void fake_queue(struct fake *f, const uint8_t *buf, size_t len, const struct sockaddr_in *to,
                       uint32_t delay_ms) {
  if (delay_ms == 0 || f->nq == FAKE_QUEUE) {
    fake_send(f, buf, len, to);
    return;
  }
  struct fake_reply *r = &f->q[f->nq++];
  r->due_ns = now_ns() + (uint64_t)delay_ms * 1000000u;
  r->to = *to;
  r->len = len;
  memcpy(r->buf, buf, len);
}

static void fake_answer(struct fake *f, struct rp_pkt *p, const struct sockaddr_in *from) {
  uint8_t out[RP_MAX_PKT];
  size_t len;
  uint32_t delay = f->delay_ms;

  if (p->type == RP_HELLO) {
    p->type = RP_HELLO_ACK;
    len = rp_encode(p, out, sizeof(out));
    fake_send(f, out, len, from);
    return;
  }
  if (f->mute || (f->drop_mod && p->seq % f->drop_mod == f->drop_rem)) return;
  if (f->late_mod && p->seq % f->late_mod == f->late_rem) delay = f->late_ms;
  p->type = RP_PONG;
  if (f->forge) {
    struct rp_pkt x = *p;
    x.batch = p->batch + 1; /* another batch */
    len = rp_encode(&x, out, sizeof(out));
    fake_send(f, out, len, from);
    x = *p;
    x.seq = 1000000; /* out of range */
    len = rp_encode(&x, out, sizeof(out));
    fake_send(f, out, len, from);
    x = *p;
    x.target = 77; /* no such target */
    len = rp_encode(&x, out, sizeof(out));
    fake_send(f, out, len, from);
    x = *p;
    x.type = RP_HELLO_ACK; /* wrong type */
    x.payload_len = 0;
    len = rp_encode(&x, out, sizeof(out));
    fake_send(f, out, len, from);
    len = rp_encode(p, out, sizeof(out)); /* garbage after a valid header */
    out[0] ^= 0xff;
    fake_send(f, out, len, from);
  }
  len = rp_encode(p, out, sizeof(out));
  if (f->damage && p->payload_len) out[RP_HDR_LEN] ^= 0x5a;
  fake_queue(f, out, len, from, delay);
  if (f->forge) fake_queue(f, out, len, from, delay); /* a duplicate */
}

static void *fake_main(void *arg) {
  struct fake *f = arg;
  uint8_t buf[RP_MAX_PKT + 1];

  for (;;) {
    struct pollfd p[2] = {{.fd = f->fd, .events = POLLIN}, {.fd = f->efd, .events = POLLIN}};
    uint64_t now = now_ns(), due = UINT64_MAX;
    int wait_ms;

    for (size_t i = 0; i < f->nq;) { /* send what is due */
      if (f->q[i].due_ns <= now) {
        fake_send(f, f->q[i].buf, f->q[i].len, &f->q[i].to);
        f->q[i] = f->q[--f->nq];
        continue;
      }
      if (f->q[i].due_ns < due) due = f->q[i].due_ns;
      i++;
    }
    wait_ms = due == UINT64_MAX ? -1 : (int)((due - now) / 1000000u);
    if (poll(p, 2, wait_ms) < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    if (!p[0].revents) continue;
    struct sockaddr_in from;
    uint8_t tos;
    struct rp_pkt pkt;
    ssize_t n = recv_wait(f->fd, buf, sizeof(buf), 0, &from, &tos);
    if (n < 0 || rp_decode(buf, (size_t)n, &pkt) != RP_OK) continue;
    if (pkt.type == RP_PING) {
      atomic_fetch_add(&f->pings, 1);
      if (tos != f->want_tos) atomic_fetch_add(&f->bad_tos, 1);
      if (f->want_src_port && ntohs(from.sin_port) != f->want_src_port) atomic_fetch_add(&f->bad_src, 1);
    }
    if (pkt.type == RP_HELLO || pkt.type == RP_PING) fake_answer(f, &pkt, &from);
  }
  return NULL;
}

/* Start f (behaviour fields set by the caller) on ip and a free port. */
static bool fake_start(struct fake *f, const char *ip) {
  f->ip = ip;
  f->fd = udp_bind(ip, 0);
  f->efd = eventfd(0, EFD_CLOEXEC);
  f->q = calloc(FAKE_QUEUE, sizeof(*f->q));
  if (f->fd < 0 || f->efd < 0 || !f->q) return false;
  f->port = sock_port(f->fd);
  return pthread_create(&f->th, NULL, fake_main, f) == 0;
}

static void fake_stop(struct fake *f) {
  uint64_t one = 1;
  if (write(f->efd, &one, sizeof(one)) != sizeof(one)) perror("fake_stop");
  pthread_join(f->th, NULL);
  close(f->fd);
  close(f->efd);
  free(f->q);
}

/* ---------------------------------------------------------------- packet codec */

static size_t good_ping(uint8_t *buf, uint16_t payload_len) {
  static uint8_t payload[RP_MAX_PAYLOAD];
  struct rp_pkt p = {.type = RP_PING,
                     .batch = 0x01020304,
                     .target = 5,
                     .seq = 6,
                     .stamp = 0x1122334455667788ull,
                     .payload_len = payload_len,
                     .payload = payload};
  memset(payload, 0xab, sizeof(payload));
  return rp_encode(&p, buf, RP_MAX_PKT + 8);
}

static void test_result_names(void) {
#define CHECK_RESULT_(name, value, text)                                                                     \
  CU_ASSERT_EQUAL((int)name, value);                                                                         \
  CU_ASSERT_STRING_EQUAL(HccnResultName(name), #name);                                                       \
  CU_ASSERT_STRING_EQUAL(HccnResultString(name), text);
  HCCN_RESULT_MAP(CHECK_RESULT_)
#undef CHECK_RESULT_
  /* hcomm's values, spelled out. */
  CU_ASSERT_EQUAL(HCCN_SUCCESS, 0);
  CU_ASSERT_EQUAL(HCCN_E_AGAIN, 1);
  CU_ASSERT_EQUAL(HCCN_E_FAIL, 2);
  CU_ASSERT_EQUAL(HCCN_E_PARA, 3);
  CU_ASSERT_EQUAL(HCCN_E_MEM, 4);
  CU_ASSERT_EQUAL(HCCN_RPING_RESULT_STATE_NOT_FOUND, 0);
  CU_ASSERT_EQUAL(HCCN_RPING_RESULT_STATE_INVALID, 1);
  CU_ASSERT_EQUAL(HCCN_RPING_RESULT_STATE_VALID, 2);
  CU_ASSERT_STRING_EQUAL(HccnResultName((HccnResult)99), "HCCN_UNKNOWN_RESULT");
  CU_ASSERT(strlen(HccnResultString((HccnResult)99)) > 0);
}

static void test_wire_roundtrip(void) {
  uint8_t buf[RP_MAX_PKT + 8];
  struct rp_pkt p;
  size_t n = good_ping(buf, 100);

  CU_ASSERT_EQUAL_FATAL(n, RP_HDR_LEN + 100);
  /* Explicit byte order: the header bytes are fixed whatever the host. */
  /* clang-format off */
  static const uint8_t hdr[RP_HDR_LEN] = {
      0x48, 0x58, 0x52, 0x50,                         /* magic "HXRP" */
      1, RP_PING, 0, 0,                               /* version, type, tos, flags */
      0, 132, 0, 100,                                 /* length 132, payload_len 100 */
      1, 2, 3, 4,                                     /* batch */
      0, 0, 0, 5,                                     /* target */
      0, 0, 0, 6,                                     /* seq */
      0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, /* stamp */
  };
  /* clang-format on */
  TU_ASSERT_SAME(buf, hdr, RP_HDR_LEN, "PING header bytes");
  CU_ASSERT_EQUAL_FATAL(rp_decode(buf, n, &p), RP_OK);
  CU_ASSERT_EQUAL(p.type, RP_PING);
  CU_ASSERT_EQUAL(p.batch, 0x01020304u);
  CU_ASSERT_EQUAL(p.target, 5u);
  CU_ASSERT_EQUAL(p.seq, 6u);
  CU_ASSERT_EQUAL(p.stamp, 0x1122334455667788ull);
  CU_ASSERT_EQUAL(p.payload_len, 100);
  CU_ASSERT_PTR_EQUAL(p.payload, buf + RP_HDR_LEN);
  n = good_ping(buf, RP_MAX_PAYLOAD);
  CU_ASSERT_EQUAL(n, RP_MAX_PKT);
  CU_ASSERT_EQUAL(rp_decode(buf, n, &p), RP_OK);
  struct rp_pkt hello = {.type = RP_HELLO, .target = 9};
  n = rp_encode(&hello, buf, sizeof(buf));
  CU_ASSERT_EQUAL(n, RP_HDR_LEN);
  CU_ASSERT_EQUAL(rp_decode(buf, n, &p), RP_OK);
  CU_ASSERT_EQUAL(p.type, RP_HELLO);
  CU_ASSERT_PTR_NULL(p.payload);
}

static void test_wire_encode_rejects(void) {
  uint8_t buf[RP_MAX_PKT + 8], payload[4] = {0};
  struct rp_pkt hello = {.type = RP_HELLO, .payload_len = 4, .payload = payload};
  struct rp_pkt big = {.type = RP_PING, .payload_len = RP_MAX_PAYLOAD + 1, .payload = buf};
  struct rp_pkt odd = {.type = 9};
  struct rp_pkt ping = {.type = RP_PING, .payload_len = 4, .payload = payload};

  CU_ASSERT_EQUAL(rp_encode(&hello, buf, sizeof(buf)), 0u);
  CU_ASSERT_EQUAL(rp_encode(&big, buf, sizeof(buf)), 0u);
  CU_ASSERT_EQUAL(rp_encode(&odd, buf, sizeof(buf)), 0u);
  CU_ASSERT_EQUAL(rp_encode(&ping, buf, RP_HDR_LEN + 3), 0u);
  CU_ASSERT_EQUAL(rp_encode(&ping, buf, RP_HDR_LEN + 4), RP_HDR_LEN + 4u);
}

/* Each case damages a valid 32 + 10 byte PING; the decoder must say why. */
static void test_wire_decode_rejects(void) {
  static const struct {
    const char *what;
    size_t off; /* byte to set, or SIZE_MAX */
    uint8_t val;
    ptrdiff_t dlen; /* change of the datagram length */
    enum rp_err want;
  } cases[] = {
      {"empty", SIZE_MAX, 0, -42, RP_ESHORT},
      {"31 bytes", SIZE_MAX, 0, -11, RP_ESHORT},
      {"bad magic", 0, 0x00, 0, RP_EMAGIC},
      {"magic byte 3", 3, 0x51, 0, RP_EMAGIC},
      {"version 0", 4, 0, 0, RP_EVERSION},
      {"version 3", 4, 3, 0, RP_EVERSION},
      {"type 0", 5, 0, 0, RP_ETYPE},
      {"type 5", 5, 5, 0, RP_ETYPE},
      {"flags", 7, 1, 0, RP_EFLAGS},
      {"length says more", 9, 43, 0, RP_ELEN},
      {"length says less", 9, 41, 0, RP_ELEN},
      {"payload_len disagrees", 11, 9, 0, RP_ELEN},
      {"datagram longer", SIZE_MAX, 0, 1, RP_ELEN},
      {"datagram shorter", SIZE_MAX, 0, -1, RP_ELEN},
      {"HELLO with a payload", 5, RP_HELLO, 0, RP_ELEN},
      {"HELLO_ACK with a payload", 5, RP_HELLO_ACK, 0, RP_ELEN},
  };
  uint8_t buf[RP_MAX_PKT + 64];
  struct rp_pkt p, sentinel;

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    size_t n = good_ping(buf, 10);
    if (cases[i].off != SIZE_MAX) buf[cases[i].off] = cases[i].val;
    n = (size_t)((ptrdiff_t)n + cases[i].dlen);
    memset(&p, 0x5c, sizeof(p));
    sentinel = p;
    enum rp_err got = rp_decode(buf, n, &p);
    if (got != cases[i].want)
      tu_fail(__FILE__, __LINE__, "%s: got \"%s\", want \"%s\"", cases[i].what, rp_err_str(got),
              rp_err_str(cases[i].want));
    else
      CU_PASS(cases[i].what);
    CU_ASSERT(memcmp(&p, &sentinel, sizeof(p)) == 0); /* untouched on failure */
  }
  /* Too long for version 1: 32 + 1501 bytes with matching length fields. */
  size_t n = good_ping(buf, RP_MAX_PAYLOAD);
  buf[8] = (uint8_t)((n + 1) >> 8);
  buf[9] = (uint8_t)(n + 1);
  buf[10] = (uint8_t)((RP_MAX_PAYLOAD + 1) >> 8);
  buf[11] = (uint8_t)(RP_MAX_PAYLOAD + 1);
  CU_ASSERT_EQUAL(rp_decode(buf, n + 1, &p), RP_ELEN);
}

static const struct rp_ep test_ep = {.qpn = 0x123456,
                                     .qkey = 0x11111111,
                                     .mtu = 1024,
                                     .gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1}};

/* A version-2 HELLO_ACK carrying test_ep; returns its length. */
static size_t good_ack_v2(uint8_t *buf) {
  uint8_t ep[RP_EP_LEN];
  struct rp_pkt p = {.version = RP_VERSION2,
                     .type = RP_HELLO_ACK,
                     .tos = 0x68,
                     .target = 0xcafe,
                     .seq = 3,
                     .stamp = 1,
                     .payload_len = RP_EP_LEN,
                     .payload = ep};
  CU_ASSERT_EQUAL(rp_ep_put(&test_ep, ep), RP_EP_LEN);
  return rp_encode(&p, buf, RP_MAX_PKT + 8);
}

static void test_wire_v2_endpoint(void) {
  uint8_t buf[RP_MAX_PKT + 8];
  struct rp_pkt p;
  struct rp_ep ep;
  size_t n = good_ack_v2(buf);

  CU_ASSERT_EQUAL_FATAL(n, RP_HDR_LEN + RP_EP_LEN);
  /* clang-format off */
  static const uint8_t want[RP_HDR_LEN + RP_EP_LEN] = {
      0x48, 0x58, 0x52, 0x50, 2, RP_HELLO_ACK, 0x68, 0, /* magic, version 2, type, tos, flags */
      0, 64, 0, 32,                                     /* length 64, payload_len 32 */
      0, 0, 0, 0, 0, 0, 0xca, 0xfe, 0, 0, 0, 3,         /* batch, target (nonce), seq */
      0, 0, 0, 0, 0, 0, 0, 1,                           /* stamp */
      1, 0, 0, 0,                                       /* endpoint kind RoCE UD, reserved */
      0x00, 0x12, 0x34, 0x56,                           /* qpn */
      0x11, 0x11, 0x11, 0x11,                           /* qkey */
      0, 0, 4, 0,                                       /* mtu 1024 */
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1, /* gid ::ffff:10.77.0.1 */
  };
  /* clang-format on */
  TU_ASSERT_SAME(buf, want, sizeof(want), "version-2 HELLO_ACK bytes");
  CU_ASSERT_EQUAL_FATAL(rp_decode(buf, n, &p), RP_OK);
  CU_ASSERT_EQUAL(p.version, RP_VERSION2);
  CU_ASSERT_EQUAL(p.type, RP_HELLO_ACK);
  CU_ASSERT_EQUAL_FATAL(rp_ep_get(p.payload, p.payload_len, &ep), RP_OK);
  CU_ASSERT(memcmp(&ep, &test_ep, sizeof(ep)) == 0);
  /* A version-1 packet decodes as version 1 and re-encodes to the same bytes. */
  struct rp_pkt hello = {.type = RP_HELLO, .target = 9};
  uint8_t again[RP_MAX_PKT + 8];
  n = rp_encode(&hello, buf, sizeof(buf));
  CU_ASSERT_EQUAL(buf[4], 1);
  CU_ASSERT_EQUAL_FATAL(rp_decode(buf, n, &p), RP_OK);
  CU_ASSERT_EQUAL(p.version, RP_VERSION1);
  CU_ASSERT_EQUAL(rp_encode(&p, again, sizeof(again)), n);
  CU_ASSERT(memcmp(again, buf, n) == 0);
  /* A version-2 HELLO_ACK without an endpoint (a UDP responder's) is valid too. */
  struct rp_pkt bare = {.version = RP_VERSION2, .type = RP_HELLO_ACK};
  n = rp_encode(&bare, buf, sizeof(buf));
  CU_ASSERT_EQUAL(n, RP_HDR_LEN);
  CU_ASSERT_EQUAL(rp_decode(buf, n, &p), RP_OK);
}

static void test_wire_v2_rejects(void) {
  static const struct {
    const char *what;
    size_t off; /* byte of the 64-byte HELLO_ACK to set, or SIZE_MAX */
    uint8_t val;
    enum rp_err want;
  } cases[] = {
      {"endpoint in a version-1 HELLO_ACK", 4, 1, RP_ELEN},
      {"endpoint on a HELLO", 5, RP_HELLO, RP_ELEN},
      {"endpoint kind 0", 32, 0, RP_EENDPOINT},
      {"endpoint kind 2", 32, 2, RP_EENDPOINT},
      {"endpoint reserved byte", 34, 1, RP_EENDPOINT},
      {"qpn 1 (GSI)", SIZE_MAX, 1, RP_EENDPOINT},
      {"qpn above 24 bits", 36, 1, RP_EENDPOINT},
      {"mtu 1000", 46, 0xe8, RP_EENDPOINT},
      {"mtu 8192", 46, 0x20, RP_EENDPOINT},
  };
  uint8_t buf[RP_MAX_PKT + 8];
  struct rp_pkt p;

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    size_t n = good_ack_v2(buf);
    if (cases[i].off != SIZE_MAX) {
      buf[cases[i].off] = cases[i].val;
      if (cases[i].off == 46) buf[47] = 0; /* mtu low byte */
    } else {
      memset(buf + 36, 0, 4);
      buf[39] = cases[i].val;
    }
    enum rp_err got = rp_decode(buf, n, &p);
    if (got != cases[i].want)
      tu_fail(__FILE__, __LINE__, "%s: got \"%s\", want \"%s\"", cases[i].what, rp_err_str(got),
              rp_err_str(cases[i].want));
    else
      CU_PASS(cases[i].what);
  }
  /* QPN 0xffffff is the multicast QPN, no responder's: refused like the others. */
  size_t n = good_ack_v2(buf);
  memcpy(buf + 36, (const uint8_t[]){0, 0xff, 0xff, 0xff}, 4);
  CU_ASSERT_EQUAL(rp_decode(buf, n, &p), RP_EENDPOINT);
  memcpy(buf + 36, (const uint8_t[]){0, 0xff, 0xff, 0xfe}, 4);
  CU_ASSERT_EQUAL(rp_decode(buf, n, &p), RP_OK);
  /* An endpoint of another length. */
  n = good_ack_v2(buf);
  buf[11] = RP_EP_LEN - 1;
  buf[9] = (uint8_t)(n - 1);
  CU_ASSERT_EQUAL(rp_decode(buf, n - 1, &p), RP_ELEN);
  /* The encoder refuses what the decoder would. */
  uint8_t ep[RP_EP_LEN];
  struct rp_ep bad = test_ep;
  bad.mtu = 1500;
  CU_ASSERT_EQUAL(rp_ep_put(&bad, ep), 0u);
  CU_ASSERT_EQUAL(rp_ep_put(&test_ep, ep), RP_EP_LEN);
  struct rp_pkt v1 = {.version = RP_VERSION1, .type = RP_HELLO_ACK, .payload_len = RP_EP_LEN, .payload = ep};
  struct rp_pkt v3 = {.version = 3, .type = RP_HELLO};
  CU_ASSERT_EQUAL(rp_encode(&v1, buf, sizeof(buf)), 0u);
  CU_ASSERT_EQUAL(rp_encode(&v3, buf, sizeof(buf)), 0u);
  ep[0] = 7;
  v1.version = RP_VERSION2;
  CU_ASSERT_EQUAL(rp_encode(&v1, buf, sizeof(buf)), 0u);
}

/* rdma_grh_read on the 40 bytes in front of a UD message: RoCE v2 puts the IPv4
 * header at offset 20; an IPv6 / IB GRH starts with version 6. */
static void test_grh_read(void) {
  /* clang-format off */
  uint8_t v4[40] = {0};
  static const uint8_t ip4[20] = {0x45, 0x68, 0x00, 0x3c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
                                  10, 77, 0, 2, 10, 77, 0, 1};
  static const uint8_t v6[40] = {0x66, 0x8a, 0xbc, 0xde, 0x00, 0x20, 0x11, 0x40,
                                 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42,
                                 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x43};
  /* clang-format on */
  static const uint8_t src4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2};
  static const uint8_t dst4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};
  struct rdma_grh_info gi;
  uint32_t acc = 0;
  uint16_t sum;

  memcpy(v4 + 20, ip4, 20);
  for (int i = 0; i < 20; i += 2) acc += (uint32_t)(ip4[i] << 8 | ip4[i + 1]);
  while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
  sum = (uint16_t)~acc;
  v4[30] = (uint8_t)(sum >> 8);
  v4[31] = (uint8_t)sum;
  CU_ASSERT_EQUAL(rdma_grh_read(v4, &gi), 4);
  CU_ASSERT_EQUAL(gi.tc, 0x68);
  CU_ASSERT_EQUAL(gi.hop_limit, 0x40);
  CU_ASSERT_EQUAL(gi.flow_label, 0u);
  CU_ASSERT(memcmp(gi.sgid, src4, 16) == 0);
  CU_ASSERT(memcmp(gi.dgid, dst4, 16) == 0);
  /* Garbage in the first 20 bytes that looks like IPv6: the checksum decides. */
  v4[0] = 0x60;
  CU_ASSERT_EQUAL(rdma_grh_read(v4, &gi), 4);
  v4[31] ^= 1;
  CU_ASSERT_EQUAL(rdma_grh_read(v4, &gi), 6);
  CU_ASSERT_EQUAL(rdma_grh_read(v6, &gi), 6);
  CU_ASSERT_EQUAL(gi.tc, 0x68);
  CU_ASSERT_EQUAL(gi.flow_label, 0xabcdeu);
  CU_ASSERT_EQUAL(gi.hop_limit, 0x40);
  CU_ASSERT_EQUAL(gi.sgid[0], 0xfe);
  CU_ASSERT_EQUAL(gi.sgid[15], 0x42);
  CU_ASSERT_EQUAL(gi.dgid[15], 0x43);
  uint8_t junk[40];
  memset(junk, 0x11, sizeof(junk));
  CU_ASSERT_EQUAL(rdma_grh_read(junk, &gi), -1);
}

/* Random damage to valid packets: the decoder never reads out of bounds (ASan), and
 * whatever it accepts re-encodes to the same bytes (nothing ambiguous gets through). */
static void test_wire_mutations(void) {
  uint8_t buf[RP_MAX_PKT + 64], again[RP_MAX_PKT + 64];
  uint64_t rng = 0x68786c72;
  unsigned accepted = 0, mismatched = 0;

  for (int iter = 0; iter < 200000; iter++) {
    size_t n = iter % 4 == 3 ? good_ack_v2(buf) : good_ping(buf, (uint16_t)(tu_rand(&rng) % 64));
    int flips = 1 + (int)(tu_rand(&rng) % 4);
    for (int k = 0; k < flips; k++) buf[tu_rand(&rng) % (n + 1)] ^= (uint8_t)(1u << (tu_rand(&rng) % 8));
    if (tu_rand(&rng) % 4 == 0) n = tu_rand(&rng) % (n + 2);
    /* Give ASan an exact-size copy, so a read past n is caught. */
    uint8_t *exact = malloc(n ? n : 1);
    struct rp_pkt p;
    if (!exact) continue;
    memcpy(exact, buf, n);
    if (rp_decode(exact, n, &p) == RP_OK) {
      accepted++;
      if (rp_encode(&p, again, sizeof(again)) != n || memcmp(again, exact, n) != 0) mismatched++;
    }
    free(exact);
  }
  CU_ASSERT(accepted > 0);
  CU_ASSERT_EQUAL(mismatched, 0u);
}

/* ---------------------------------------------------------------- Init / Deinit */

static void test_init_args(void) {
  HccnRpingCtx sentinel = (HccnRpingCtx)(uintptr_t)0x5eed, c = sentinel;
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.2"));
  static const struct {
    const char *what;
    size_t off;
    uint32_t val;
    HccnResult want;
  } fields[] = {
      {"mode 7", offsetof(HccnRpingInitAttr, mode), 7, HCCN_E_PARA},
      {"mode ROCE", offsetof(HccnRpingInitAttr, mode), HCCN_RPING_MODE_ROCE, HCCN_E_FAIL},
      {"port 0", offsetof(HccnRpingInitAttr, port), 0, HCCN_E_PARA},
      {"port 65536", offsetof(HccnRpingInitAttr, port), 65536, HCCN_E_PARA},
      {"npuNum 0", offsetof(HccnRpingInitAttr, npuNum), 0, HCCN_E_PARA},
      {"npuNum 65537", offsetof(HccnRpingInitAttr, npuNum), 65537, HCCN_E_PARA},
      {"bufferSize 0", offsetof(HccnRpingInitAttr, bufferSize), 0, HCCN_E_PARA},
      {"bufferSize 4097", offsetof(HccnRpingInitAttr, bufferSize), 4097, HCCN_E_PARA},
      {"bufferSize 6144", offsetof(HccnRpingInitAttr, bufferSize), 6144, HCCN_E_PARA},
      {"sl 8", offsetof(HccnRpingInitAttr, sl), 8, HCCN_E_PARA},
      {"tc 256", offsetof(HccnRpingInitAttr, tc), 256, HCCN_E_PARA},
  };

  ASSERT_HCCN(HccnRpingInit("127.0.0.2", NULL, &c), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingInit("127.0.0.2", &a, NULL), HCCN_E_PARA);
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    HccnRpingInitAttr bad = a;
    memcpy((char *)&bad + fields[i].off, &fields[i].val, sizeof(uint32_t));
    HccnResult r = HccnRpingInit("127.0.0.2", &bad, &c);
    if (r != fields[i].want)
      tu_fail(__FILE__, __LINE__, "%s: got %s, want %s (%s)", fields[i].what, HccnResultName(r),
              HccnResultName(fields[i].want), HixlGetLastErrorMessage());
    else
      CU_PASS(fields[i].what);
    CU_ASSERT_PTR_EQUAL(c, sentinel); /* output untouched on failure */
  }
  /* ROCE on an address no RDMA device owns (none at all on most hosts that run this
   * test) is refused with a reason that says what is missing. */
  a.mode = HCCN_RPING_MODE_ROCE;
  ASSERT_HCCN(HccnRpingInit("127.0.0.2", &a, &c), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("RDMA");
  TU_ASSERT_ERRMSG_HAS("HCCN_RPING_MODE_UDP");
  a.mode = HCCN_RPING_MODE_UDP;
  /* Naming the device. */
  ASSERT_HCCN(HccnRpingInit(NULL, &a, &c), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingInit("", &a, &c), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingInit("nosuchnic0", &a, &c), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("nosuchnic0");
  ASSERT_HCCN(HccnRpingInit("0.0.0.0", &a, &c), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingInit("224.0.0.1", &a, &c), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingInit("255.255.255.255", &a, &c), HCCN_E_PARA);
  a.ipAddr = "127.0.0.3";
  ASSERT_HCCN(HccnRpingInit("127.0.0.2", &a, &c), HCCN_E_PARA); /* disagree */
  ASSERT_HCCN(HccnRpingInit("lo", &a, &c), HCCN_E_PARA);        /* not an address of lo */
  TU_ASSERT_ERRMSG_HAS("not an address of NIC lo");
  a.ipAddr = "not-an-ip";
  ASSERT_HCCN(HccnRpingInit(NULL, &a, &c), HCCN_E_PARA);
  CU_ASSERT_PTR_EQUAL(c, sentinel);
}

static void test_init_env_timeout(void) {
  static const char *const bad[] = {"", "abc", "0", "-5", "12x", "3600001", "99999999999999999999"};
  HccnRpingCtx c = NULL;
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.2"));

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    setenv("HIXL_RPING_ADD_TIMEOUT_MS", bad[i], 1);
    HccnResult r = HccnRpingInit("127.0.0.2", &a, &c);
    if (bad[i][0] == '\0') { /* empty means unset */
      ASSERT_HCCN(r, HCCN_SUCCESS);
      if (r == HCCN_SUCCESS) ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
      continue;
    }
    if (r != HCCN_E_PARA)
      tu_fail(__FILE__, __LINE__, "env \"%s\": got %s", bad[i], HccnResultName(r));
    else
      TU_ASSERT_ERRMSG_HAS("HIXL_RPING_ADD_TIMEOUT_MS");
  }
  unsetenv("HIXL_RPING_ADD_TIMEOUT_MS");
}

static void test_one_init_per_device(void) {
  HccnRpingCtx c1 = NULL, c2 = NULL, c3 = NULL;
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.1")), b = attr_of(free_udp_port("127.0.0.1"));

  ASSERT_HCCN_FATAL(HccnRpingInit("lo", &a, &c1), HCCN_SUCCESS); /* NIC name: lo is 127.0.0.1 */
  ASSERT_HCCN(HccnRpingInit("127.0.0.1", &b, &c2), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("one HccnRpingInit per device");
  b.ipAddr = "127.0.0.1";
  ASSERT_HCCN(HccnRpingInit(NULL, &b, &c2), HCCN_E_FAIL);
  ASSERT_HCCN(HccnRpingInit("lo", &b, &c2), HCCN_E_FAIL);
  /* Another loopback address is another device. */
  b.ipAddr = NULL;
  ASSERT_HCCN(HccnRpingInit("127.0.0.2", &b, &c3), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c1), HCCN_SUCCESS);
  /* Free again after Deinit. */
  ASSERT_HCCN(HccnRpingInit("127.0.0.1", &a, &c2), HCCN_SUCCESS);
  CU_ASSERT_PTR_NOT_EQUAL(c2, c1); /* handles are never reused */
  ASSERT_HCCN(HccnRpingDeinit(c2), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c3), HCCN_SUCCESS);
}

static void test_init_port_in_use(void) {
  uint16_t port = free_udp_port("127.0.0.4");
  int fd = udp_bind("127.0.0.4", port);
  HccnRpingInitAttr a = attr_of(port);
  HccnRpingCtx c = NULL;

  CU_ASSERT_FATAL(fd >= 0);
  ASSERT_HCCN(HccnRpingInit("127.0.0.4", &a, &c), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("127.0.0.4");
  close(fd);
  /* The failed Init left nothing claimed. */
  ASSERT_HCCN(HccnRpingInit("127.0.0.4", &a, &c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

static void test_closed_and_bogus_ctx(void) {
  HccnRpingCtx c = ctx_on("127.0.0.2", NULL), bogus = (HccnRpingCtx)(uintptr_t)0x12345678;
  HccnRpingTargetInfo t = tgt("127.0.0.3", 9);
  HccnRpingResultInfo res;
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 10};
  HccnRpingCtx handles[3];

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  handles[0] = c;
  handles[1] = NULL;
  handles[2] = bogus;
  for (int i = 0; i < 3; i++) {
    HccnRpingCtx h = handles[i];
    ASSERT_HCCN(HccnRpingDeinit(h), HCCN_E_PARA);
    ASSERT_HCCN(HccnRpingAddTarget(h, 1, &t), HCCN_E_PARA);
    TU_ASSERT_ERRMSG_HAS("not a live context");
    ASSERT_HCCN(HccnRpingAddTargetWithCfg(h, 1, &t, &cfg), HCCN_E_PARA);
    ASSERT_HCCN(HccnRpingRemoveTarget(h, 1, &t), HCCN_E_PARA);
    ASSERT_HCCN(HccnRpingBatchPingStart(h, 1, 0, 10), HCCN_E_PARA);
    ASSERT_HCCN(HccnRpingBatchPingStop(h), HCCN_E_PARA);
    ASSERT_HCCN(HccnRpingGetResult(h, 1, &t, &res), HCCN_E_PARA);
  }
}

/* ---------------------------------------------------------------- AddTarget */

static void test_add_args(void) {
  uint16_t cport, rport;
  HccnRpingCtx c = ctx_on("127.0.0.1", &cport), r = ctx_on("127.0.0.2", &rport);
  HccnRpingTargetInfo many[17], good = tgt("127.0.0.2", rport), bad, two[2];
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 0};
  static const char *const bad_ips[] = {"",        "127.0.0",   "localhost",
                                        "0.0.0.0", "239.1.2.3", "255.255.255.255"};

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  for (int i = 0; i < 17; i++) many[i] = good;
  ASSERT_HCCN(HccnRpingAddTarget(c, 0, many), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingAddTarget(c, 17, many), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("[1,16]");
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, NULL), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &good, &cfg), HCCN_E_PARA);
  cfg.connectTimeout = HCCN_RPING_ADD_TIMEOUT_MAX + 1;
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &good, &cfg), HCCN_E_PARA);
  bad = good;
  bad.dstIp = NULL;
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &bad), HCCN_E_PARA);
  for (size_t i = 0; i < sizeof(bad_ips) / sizeof(bad_ips[0]); i++) {
    bad.dstIp = (char *)bad_ips[i];
    ASSERT_HCCN(HccnRpingAddTarget(c, 1, &bad), HCCN_E_PARA);
  }
#define BAD_FIELD(field, value, needle)                                                                      \
  do {                                                                                                       \
    bad = good;                                                                                              \
    bad.field = value;                                                                                       \
    ASSERT_HCCN(HccnRpingAddTarget(c, 1, &bad), HCCN_E_PARA);                                                \
    TU_ASSERT_ERRMSG_HAS(needle);                                                                            \
  } while (0)
  BAD_FIELD(srcIp, "127.0.0.9", "srcIp");
  BAD_FIELD(srcIp, "x", "srcIp");
  BAD_FIELD(port, 0, "port");
  BAD_FIELD(port, 65536, "port");
  BAD_FIELD(srcPort, 65536, "srcPort");
  BAD_FIELD(srcPort, cport, "responder port");
  BAD_FIELD(sl, 8, "sl");
  BAD_FIELD(tc, 256, "tc");
  BAD_FIELD(payloadLen, HCCN_RPING_PAYLOAD_LEN_MAX + 1, "payloadLen");
  BAD_FIELD(reserved, 1, "reserved");
#undef BAD_FIELD
  /* A bad second target: the good first one is not added either. */
  two[0] = good;
  two[1] = good;
  two[1].dstIp = "127.0.0.3";
  two[1].tc = 300;
  ASSERT_HCCN(HccnRpingAddTarget(c, 2, two), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("target[1].tc");
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 100), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("no targets");
  /* srcIp naming this context is fine. */
  good.srcIp = "127.0.0.1";
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &good), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

static void test_add_dedupe_keeps_first(void) {
  uint16_t rport;
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL), r = ctx_on("127.0.0.2", &rport);
  HccnRpingTargetInfo t[3];
  HccnRpingResultInfo res;
  uint16_t dead = free_udp_port("127.0.0.2");
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 60000};
  uint64_t t0;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  /* The second and third name the same dstIp with a port where nothing answers: were
   * they used, the call would wait the full minute and fail. */
  t[0] = tgt("127.0.0.2", rport);
  t[1] = tgt("127.0.0.2", dead);
  t[2] = tgt("127.0.0.2", dead);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 3, t, &cfg), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &t[1], &cfg), HCCN_SUCCESS); /* already there */
  CU_ASSERT(now_ns() - t0 < 10000000000ull);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 0, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t[1], &res, 10000), HCCN_SUCCESS); /* looked up by dstIp */
  check_all_answered(&res, 5, 2000, "the first target's port was probed");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

static void test_add_timeout(void) {
  uint16_t dead = free_udp_port("127.0.0.2");
  HccnRpingTargetInfo t = tgt("127.0.0.2", dead);
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 300};
  HccnRpingCtx c;
  uint64_t t0, ms;

  /* The wait from the config ... */
  c = ctx_on("127.0.0.1", NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &t, &cfg), HCCN_E_FAIL);
  ms = (now_ns() - t0) / 1000000u;
  CU_ASSERT(ms >= 300 && ms < 3000);
  TU_ASSERT_ERRMSG_HAS("did not answer within 300 ms");
  TU_ASSERT_ERRMSG_HAS("127.0.0.2:");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  /* ... and from the environment, read at Init. */
  setenv("HIXL_RPING_ADD_TIMEOUT_MS", "250", 1);
  c = ctx_on("127.0.0.1", NULL);
  unsetenv("HIXL_RPING_ADD_TIMEOUT_MS");
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_E_FAIL);
  ms = (now_ns() - t0) / 1000000u;
  CU_ASSERT(ms >= 250 && ms < 3000);
  TU_ASSERT_ERRMSG_HAS("within 250 ms");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

struct add_job {
  HccnRpingCtx c;
  HccnRpingTargetInfo t;
  uint32_t timeout_ms;
  HccnResult r;
  char err[256];
};

static void *add_thread(void *arg) {
  struct add_job *j = arg;
  HccnRpingAddTargetConfig cfg = {.connectTimeout = j->timeout_ms};
  j->r = HccnRpingAddTargetWithCfg(j->c, 1, &j->t, &cfg);
  snprintf(j->err, sizeof(j->err), "%s", HixlGetLastErrorMessage());
  return NULL;
}

/* Wait on a plain socket at the target's address for AddTarget's HELLO: proof that
 * AddTarget runs and waits, without sleeping. */
static bool saw_hello(int spy) {
  uint8_t buf[RP_MAX_PKT + 1];
  struct rp_pkt p;
  ssize_t n = recv_wait(spy, buf, sizeof(buf), 10000, NULL, NULL);
  return n > 0 && rp_decode(buf, (size_t)n, &p) == RP_OK && p.type == RP_HELLO;
}

static void test_add_waits_for_late_target(void) {
  uint16_t port = free_udp_port("127.0.0.6");
  int spy = udp_bind("127.0.0.6", port);
  struct add_job j = {.c = ctx_on("127.0.0.1", NULL), .t = tgt("127.0.0.6", port), .timeout_ms = 30000};
  HccnRpingInitAttr a = attr_of(port);
  HccnRpingCtx late = NULL;
  pthread_t th;

  CU_ASSERT_FATAL(spy >= 0 && j.c != NULL);
  CU_ASSERT_FATAL(pthread_create(&th, NULL, add_thread, &j) == 0);
  CU_ASSERT(saw_hello(spy)); /* AddTarget is waiting for a target that has not run Init */
  close(spy);
  ASSERT_HCCN(HccnRpingInit("127.0.0.6", &a, &late), HCCN_SUCCESS);
  pthread_join(th, NULL);
  if (j.r != HCCN_SUCCESS) tu_fail(__FILE__, __LINE__, "AddTarget: %s: %s", HccnResultName(j.r), j.err);
  ASSERT_HCCN(HccnRpingDeinit(j.c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(late), HCCN_SUCCESS);
}

static void test_deinit_during_add(void) {
  uint16_t port = free_udp_port("127.0.0.6");
  int spy = udp_bind("127.0.0.6", port);
  struct add_job j = {.c = ctx_on("127.0.0.1", NULL), .t = tgt("127.0.0.6", port), .timeout_ms = 60000};
  pthread_t th;
  uint64_t t0;

  CU_ASSERT_FATAL(spy >= 0 && j.c != NULL);
  CU_ASSERT_FATAL(pthread_create(&th, NULL, add_thread, &j) == 0);
  CU_ASSERT(saw_hello(spy));
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingDeinit(j.c), HCCN_SUCCESS); /* wakes the waiting AddTarget */
  pthread_join(th, NULL);
  CU_ASSERT(now_ns() - t0 < 5000000000ull);
  CU_ASSERT_EQUAL(j.r, HCCN_E_FAIL);
  CU_ASSERT(strstr(j.err, "deinitialized") != NULL);
  close(spy);
}

static void test_add_partial(void) {
  uint16_t rport, dead = free_udp_port("127.0.0.3");
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL), r = ctx_on("127.0.0.2", &rport);
  HccnRpingTargetInfo t[2] = {tgt("127.0.0.2", rport), tgt("127.0.0.3", dead)};
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 300};
  HccnRpingResultInfo res[2];
  char dead_name[32];

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  snprintf(dead_name, sizeof(dead_name), "127.0.0.3:%u", dead);
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 2, t, &cfg), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("1 of 2 targets");
  TU_ASSERT_ERRMSG_HAS(dead_name);
  /* The one that answered is in; asking again for it alone returns at once. */
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, t, &cfg), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 3, 0, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 2, t, res, 10000), HCCN_SUCCESS);
  check_all_answered(&res[0], 3, 1000, "the target that answered");
  CU_ASSERT_EQUAL(res[1].state, HCCN_RPING_RESULT_STATE_NOT_FOUND);
  CU_ASSERT_EQUAL(res[1].txPkt, 0u);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

static void test_npu_num_limit(void) {
  static const char *const ips[] = {"127.0.0.2", "127.0.0.3", "127.0.0.4"};
  HccnRpingCtx r[3], c = NULL;
  HccnRpingTargetInfo t[3];
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.1"));

  a.npuNum = 2;
  ASSERT_HCCN_FATAL(HccnRpingInit("127.0.0.1", &a, &c), HCCN_SUCCESS);
  for (int i = 0; i < 3; i++) {
    uint16_t p;
    r[i] = ctx_on(ips[i], &p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r[i]);
    t[i] = tgt(ips[i], p);
  }
  ASSERT_HCCN(HccnRpingAddTarget(c, 3, t), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("npuNum");
  ASSERT_HCCN(HccnRpingAddTarget(c, 2, t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t[2]), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t[1]), HCCN_SUCCESS); /* a duplicate needs no room */
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t[0]), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t[2]), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  for (int i = 0; i < 3; i++) ASSERT_HCCN(HccnRpingDeinit(r[i]), HCCN_SUCCESS);
}

/* Two AddTargets race for the last place (npuNum 1): both pass the count check and
 * both targets answer; the one that adds second finds the context full. Its target
 * did answer: the call says so (HCCN_E_PARA, the npuNum rule), not "did not answer
 * ... Has it run HccnRpingInit?". The first call is held in its handshake by a plain
 * socket that reads its HELLO and answers it only once the second call is done. */
static void test_add_race_for_last_place(void) {
  uint16_t port = free_udp_port("127.0.0.6"), rport;
  int spy = udp_bind("127.0.0.6", port);
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.1"));
  HccnRpingCtx r = ctx_on("127.0.0.2", &rport);
  HccnRpingTargetInfo t2 = tgt("127.0.0.2", rport);
  struct add_job j = {.t = tgt("127.0.0.6", port), .timeout_ms = 30000};
  uint8_t buf[RP_MAX_PKT + 1];
  struct sockaddr_in from;
  struct rp_pkt hello;
  char name[80];
  pthread_t th;

  a.npuNum = 1;
  CU_ASSERT_FATAL(spy >= 0 && r != NULL);
  ASSERT_HCCN_FATAL(HccnRpingInit("127.0.0.1", &a, &j.c), HCCN_SUCCESS);
  CU_ASSERT_FATAL(pthread_create(&th, NULL, add_thread, &j) == 0);
  ssize_t n = recv_wait(spy, buf, sizeof(buf), 10000, &from, NULL); /* it waits in its handshake */
  CU_ASSERT_FATAL(n > 0 && rp_decode(buf, (size_t)n, &hello) == RP_OK && hello.type == RP_HELLO);
  ASSERT_HCCN(HccnRpingAddTarget(j.c, 1, &t2), HCCN_SUCCESS); /* takes the last place */
  hello.type = RP_HELLO_ACK;
  n = (ssize_t)rp_encode(&hello, buf, sizeof(buf));
  CU_ASSERT(sendto(spy, buf, (size_t)n, 0, (struct sockaddr *)&from, sizeof(from)) == n);
  pthread_join(th, NULL);
  snprintf(name, sizeof(name), "127.0.0.6:%u (answered; the context was full)", port);
  CU_ASSERT_EQUAL(j.r, HCCN_E_PARA);
  if (!strstr(j.err, name) || !strstr(j.err, "npuNum 1") || strstr(j.err, "did not answer"))
    tu_fail(__FILE__, __LINE__, "the call whose target answered says: %s", j.err);
  else
    CU_PASS("the target that answered is not said to be silent");
  close(spy);
  ASSERT_HCCN(HccnRpingDeinit(j.c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

/* ---------------------------------------------------------------- batches */

static void test_batch_rules(void) {
  uint16_t rport;
  HccnRpingCtx c = NULL, r = ctx_on("127.0.0.2", &rport);
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.1"));
  HccnRpingTargetInfo t = tgt("127.0.0.2", rport);
  HccnRpingResultInfo res, sentinel;

  a.bufferSize = 5 * 4096; /* 20480 = 10 x 2048 x 1 */
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  ASSERT_HCCN_FATAL(HccnRpingInit("127.0.0.1", &a, &c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 100), HCCN_E_FAIL); /* no targets */
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, &res), HCCN_E_FAIL);    /* no batch */
  TU_ASSERT_ERRMSG_HAS("no batch is active");
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_E_FAIL);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_E_FAIL); /* none added */
  TU_ASSERT_ERRMSG_HAS("no targets are added");
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 0, 0, 100), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 0), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 60001), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 10001, 100), HCCN_E_PARA);
  /* bufferSize must be larger than pkt_num x 2048 x targets. */
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 10, 0, 100), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("bufferSize 20480");
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 11, 0, 100), HCCN_E_PARA);
  /* A batch of 9 x 2 s, so that it is surely running for the checks below. */
  ASSERT_HCCN_FATAL(HccnRpingBatchPingStart(c, 9, 2000, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 9, 0, 100), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("HccnRpingBatchPingStop first");
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_E_FAIL);
  memset(&res, 0x77, sizeof(res));
  sentinel = res;
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, &res), HCCN_E_AGAIN);
  CU_ASSERT(memcmp(&res, &sentinel, sizeof(res)) == 0); /* written only on success */
  ASSERT_HCCN(HccnRpingGetResult(c, 0, &t, &res), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, NULL, &res), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, NULL), HCCN_E_PARA);
  uint64_t t0 = now_ns();
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS); /* stops the running batch at once */
  CU_ASSERT(now_ns() - t0 < 2000000000ull);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_E_FAIL);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, &res), HCCN_E_FAIL);
  /* Start again; a finished batch stays active until Stop. */
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 9, 0, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  check_all_answered(&res, 9, 1000, "second batch");
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 9, 0, 1000), HCCN_E_FAIL);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_E_FAIL);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 100), HCCN_E_FAIL); /* removed: none left */
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

static void test_results_and_states(void) {
  uint16_t p2, p3, p4;
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL), r2 = ctx_on("127.0.0.2", &p2), r3 = ctx_on("127.0.0.3", &p3),
               r4 = ctx_on("127.0.0.4", &p4);
  HccnRpingTargetInfo t[4] = {tgt("127.0.0.2", p2), tgt("127.0.0.3", p3), tgt("127.0.0.4", p4),
                              tgt("127.0.0.99", 1)};
  HccnRpingResultInfo res[4];

  CU_ASSERT_FATAL(c && r2 && r3 && r4);
  t[1].payloadLen = HCCN_RPING_PAYLOAD_LEN_MAX;
  tu_fill(t[1].payload, HCCN_RPING_PAYLOAD_LEN_MAX, 42);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 2, t), HCCN_SUCCESS);
  ASSERT_HCCN_FATAL(HccnRpingBatchPingStart(c, 20, 1, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t[2]), HCCN_SUCCESS); /* joins after the start */
  ASSERT_HCCN(wait_results(c, 4, t, res, 10000), HCCN_SUCCESS);
  check_all_answered(&res[0], 20, 1000, "127.0.0.2");
  check_all_answered(&res[1], 20, 1000, "127.0.0.3 with a 1500-byte payload");
  CU_ASSERT_EQUAL(res[2].state, HCCN_RPING_RESULT_STATE_INVALID); /* not in this batch */
  CU_ASSERT_EQUAL(res[2].txPkt, 0u);
  CU_ASSERT_EQUAL(res[3].state, HCCN_RPING_RESULT_STATE_NOT_FOUND);
  CU_ASSERT_EQUAL(res[3].txPkt + res[3].rxPkt + res[3].minRTT + res[3].maxRTT + res[3].avgRTT, 0u);
  /* The next batch includes it; the same targets may be asked for twice. */
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 0, 1000), HCCN_SUCCESS);
  t[3] = t[2];
  ASSERT_HCCN(wait_results(c, 4, t, res, 10000), HCCN_SUCCESS);
  check_all_answered(&res[2], 5, 1000, "added during the previous batch");
  check_all_answered(&res[3], 5, 1000, "asked for twice");
  /* RemoveTarget: all must be present, or nothing is removed. */
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  HccnRpingTargetInfo gone[2] = {t[0], tgt("127.0.0.99", 1)};
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 2, gone), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("127.0.0.99");
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 0, gone), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, NULL), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, gone), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 2, 0, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 3, t, res, 10000), HCCN_SUCCESS);
  CU_ASSERT_EQUAL(res[0].state, HCCN_RPING_RESULT_STATE_NOT_FOUND);
  check_all_answered(&res[1], 2, 1000, "kept after a removal");
  check_all_answered(&res[2], 2, 1000, "kept after a removal");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r2), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r3), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r4), HCCN_SUCCESS);
}

static void test_self_and_mesh(void) {
  static const char *const ips[] = {"127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13"};
  enum { N = 4 };
  HccnRpingCtx c[N];
  HccnRpingTargetInfo t[N];
  HccnRpingResultInfo res[N];

  for (int i = 0; i < N; i++) {
    uint16_t p;
    c[i] = ctx_on(ips[i], &p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c[i]);
    t[i] = tgt(ips[i], p);
  }
  /* Every context probes every context, itself included, all at once. */
  for (int i = 0; i < N; i++) ASSERT_HCCN(HccnRpingAddTarget(c[i], N, t), HCCN_SUCCESS);
  for (int i = 0; i < N; i++) ASSERT_HCCN(HccnRpingBatchPingStart(c[i], 50, 1, 2000), HCCN_SUCCESS);
  for (int i = 0; i < N; i++) {
    ASSERT_HCCN(wait_results(c[i], N, t, res, 20000), HCCN_SUCCESS);
    for (int k = 0; k < N; k++) check_all_answered(&res[k], 50, 2000, ips[k]);
  }
  for (int i = 0; i < N; i++) ASSERT_HCCN(HccnRpingDeinit(c[i]), HCCN_SUCCESS);
}

/* A target that dies after AddTarget: the batch ends on time, every probe lost. */
static void test_dead_target_bounded(void) {
  uint16_t p;
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL), r = ctx_on("127.0.0.2", &p);
  HccnRpingTargetInfo t = tgt("127.0.0.2", p);
  HccnRpingResultInfo res;
  uint64_t t0, ms;

  CU_ASSERT_FATAL(c && r);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 10, 10, 300), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  ms = (now_ns() - t0) / 1000000u;
  CU_ASSERT(ms >= 390 && ms < 2390); /* 9 x 10 ms of sending + 300 ms for the last */
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.txPkt, 10u);
  CU_ASSERT_EQUAL(res.rxPkt, 0u);
  CU_ASSERT_EQUAL(res.minRTT + res.avgRTT + res.maxRTT, 0u);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

static void test_deinit_with_batch_running(void) {
  uint16_t p;
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL), r = ctx_on("127.0.0.2", &p);
  HccnRpingTargetInfo t = tgt("127.0.0.2", p);
  uint64_t t0;

  CU_ASSERT_FATAL(c && r);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 100, 1000, 1000), HCCN_SUCCESS);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  CU_ASSERT(now_ns() - t0 < 2000000000ull);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, NULL), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

/* Datagrams that reached fd since *drops was read: those queued now (read here) and
 * those the kernel dropped for want of room (SK_MEMINFO_DROPS, a running count, into
 * *drops). Call once nothing sends to fd any more. */
static uint64_t datagrams_arrived(int fd, uint32_t *drops) {
  uint32_t mi[SK_MEMINFO_VARS], before = *drops;
  socklen_t len = sizeof(mi);
  uint64_t got = 0;
  uint8_t buf[RP_MAX_PKT + 1];

  while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) >= 0) got++;
  if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mi, &len) != 0 || len < sizeof(mi)) {
    tu_fail(__FILE__, __LINE__, "SO_MEMINFO: %s", strerror(errno));
    return UINT64_MAX;
  }
  *drops = mi[SK_MEMINFO_DROPS];
  return got + (uint32_t)(*drops - before);
}

/* An interval-0 batch is one burst of every probe (here a million). Stop, and Deinit,
 * end it where it is: the prober looks at its stop eventfd every RP_DRAIN_MAX probes,
 * not once the burst is all sent (it was: Stop took seconds). Counted, not timed: the
 * probes that reached the target by the time Stop or Deinit returned are far fewer
 * than the batch's. */
static void test_stop_ends_burst(void) {
  const uint32_t pkts = 1000000;
  struct fake f = {.mute = true};
  HccnRpingInitAttr a = attr_of(free_udp_port("127.0.0.1"));
  HccnRpingCtx c = NULL;
  HccnRpingTargetInfo t;
  uint64_t one = 1, arrived;
  uint32_t drops = 0;

  a.bufferSize = 0xfffff000u; /* room for pktNum x 2048 */
  CU_ASSERT_FATAL(fake_start(&f, "127.0.0.5"));
  ASSERT_HCCN_FATAL(HccnRpingInit("127.0.0.1", &a, &c), HCCN_SUCCESS);
  t = tgt("127.0.0.5", f.port);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  /* The fake's thread stops reading: what arrives stays queued or is counted dropped. */
  CU_ASSERT(write(f.efd, &one, sizeof(one)) == sizeof(one));
  pthread_join(f.th, NULL);
  datagrams_arrived(f.fd, &drops); /* from here on */

  ASSERT_HCCN(HccnRpingBatchPingStart(c, pkts, 0, 60000), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  arrived = datagrams_arrived(f.fd, &drops);
  if (arrived >= pkts)
    tu_fail(__FILE__, __LINE__, "Stop returned after all %llu probes of the burst were sent",
            (unsigned long long)arrived);
  else
    CU_PASS("Stop ended the burst");
  ASSERT_HCCN(HccnRpingBatchPingStart(c, pkts, 0, 60000), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  arrived = datagrams_arrived(f.fd, &drops);
  if (arrived >= pkts)
    tu_fail(__FILE__, __LINE__, "Deinit returned after all %llu probes of the burst were sent",
            (unsigned long long)arrived);
  else
    CU_PASS("Deinit ended the burst");
  close(f.fd);
  close(f.efd);
  free(f.q);
}

/* ---------------------------------------------------------------- responders in a child */

static uint16_t child_port;

static int responder_child(void *arg, int ready_fd, int ctl_fd) {
  HccnRpingInitAttr a = attr_of(child_port);
  HccnRpingCtx c = NULL;
  HccnResult r = HccnRpingInit("127.0.0.1", &a, &c);
  char byte;

  (void)arg;
  if (write(ready_fd, &r, sizeof(r)) != sizeof(r)) return 2;
  if (r != HCCN_SUCCESS) return 1;
  while (read(ctl_fd, &byte, 1) > 0) continue; /* EOF: quit */
  return HccnRpingDeinit(c) == HCCN_SUCCESS ? 0 : 1;
}

/* Two contexts on 127.0.0.1 in two processes (one per device per process); then the
 * child is stopped: the batch still ends on time with every probe counted lost. */
static void test_child_process_responder(void) {
  tu_child child;
  HccnResult ready = HCCN_E_FAIL;
  HccnRpingCtx c;
  HccnRpingTargetInfo t;
  HccnRpingResultInfo res;
  uint64_t t0, ms;

  child_port = free_udp_port("127.0.0.1");
  /* Fork first, while this process runs no thread of its own. */
  CU_ASSERT_FATAL(tu_child_start(&child, responder_child, NULL) == 0);
  CU_ASSERT_FATAL(tu_child_read(&child, &ready, sizeof(ready), 10000) == 0);
  ASSERT_HCCN_FATAL(ready, HCCN_SUCCESS);
  c = ctx_on("127.0.0.1", NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  t = tgt("127.0.0.1", child_port);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 100, 0, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  check_all_answered(&res, 100, 1000, "responder in another process");
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);

  tu_child_kill(&child, SIGSTOP);
  CU_ASSERT(tu_child_wait_stopped(&child, 10000) == 0);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 20, 250), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  ms = (now_ns() - t0) / 1000000u;
  CU_ASSERT(ms >= 330 && ms < 2330);
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.txPkt, 5u);
  CU_ASSERT_EQUAL(res.rxPkt, 0u);
  tu_child_kill(&child, SIGCONT);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  CU_ASSERT_EQUAL(tu_child_stop(&child, 10000), 0);
}

/* ---------------------------------------------------------------- TOS and hostile peers */

/* The prober sets the TOS byte from tc and the source port from srcPort; the responder
 * answers with the TOS byte it received and says which in the answer. */
static void test_tos_both_ways(void) {
  struct fake f = {.want_tos = 0xb8};
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL);
  uint16_t rport, src_port = free_udp_port("127.0.0.1");
  HccnRpingCtx r = ctx_on("127.0.0.2", &rport);
  HccnRpingTargetInfo t;
  HccnRpingResultInfo res;
  uint8_t buf[RP_MAX_PKT + 1], tos;
  struct rp_pkt p;

  CU_ASSERT_FATAL(c && r);
  f.want_src_port = src_port;
  CU_ASSERT_FATAL(fake_start(&f, "127.0.0.5"));
  t = tgt("127.0.0.5", f.port);
  t.tc = 0xb8; /* DSCP 46 (EF) x 4 */
  t.srcPort = src_port;
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 20, 0, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  check_all_answered(&res, 20, 1000, "fake responder");
  CU_ASSERT_EQUAL(atomic_load(&f.pings), 20u);
  CU_ASSERT_EQUAL(atomic_load(&f.bad_tos), 0u);
  CU_ASSERT_EQUAL(atomic_load(&f.bad_src), 0u);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  /* srcPort taken by someone else: the batch cannot start, and says why. */
  int squat = udp_bind("127.0.0.1", src_port);
  CU_ASSERT(squat >= 0);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 100), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("source port");
  close(squat);
  fake_stop(&f);

  /* A raw PING with TOS 0x84 to a real responder. */
  int fd = udp_bind("127.0.0.1", 0), val = 0x84;
  struct sockaddr_in to = sa_of("127.0.0.2", rport);
  struct rp_pkt ping = {.type = RP_PING, .batch = 1, .seq = 2};
  size_t n = rp_encode(&ping, buf, sizeof(buf));
  CU_ASSERT_FATAL(fd >= 0);
  setsockopt(fd, IPPROTO_IP, IP_TOS, &val, sizeof(val));
  CU_ASSERT(sendto(fd, buf, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n);
  ssize_t k = recv_wait(fd, buf, sizeof(buf), 5000, NULL, &tos);
  CU_ASSERT_FATAL(k > 0);
  CU_ASSERT_EQUAL_FATAL(rp_decode(buf, (size_t)k, &p), RP_OK);
  CU_ASSERT_EQUAL(p.type, RP_PONG);
  CU_ASSERT_EQUAL(p.seq, 2u);
  CU_ASSERT_EQUAL(p.tos, 0x84);
  CU_ASSERT_EQUAL(tos, 0x84);
  close(fd);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

/* Malformed datagrams get no answer and do not disturb the responder: the first
 * answer that comes back is the one to the valid PING sent after them. */
static void test_responder_ignores_garbage(void) {
  uint16_t rport;
  HccnRpingCtx r = ctx_on("127.0.0.2", &rport);
  int fd = udp_bind("127.0.0.1", 0);
  struct sockaddr_in to = sa_of("127.0.0.2", rport);
  uint8_t buf[RP_MAX_PKT + 64], in[RP_MAX_PKT + 64];
  struct rp_pkt p;
  size_t n;

  CU_ASSERT_FATAL(r && fd >= 0);
  for (int i = 0; i < 9; i++) {
    n = good_ping(buf, 10);
    switch (i) {
    case 0: buf[0] = 0; break;                                      /* magic */
    case 1: buf[4] = 3; break;                                      /* version */
    case 2: buf[5] = 9; break;                                      /* type */
    case 3: buf[7] = 1; break;                                      /* flags */
    case 4: buf[9] = 99; break;                                     /* length */
    case 5: n = 20; break;                                          /* short */
    case 6: n += 1; break;                                          /* trailing byte */
    case 7: buf[5] = RP_PONG; break;                                /* an answer, not a request */
    case 8: memset(buf, 0xff, sizeof(buf)), n = sizeof(buf); break; /* too long */
    }
    CU_ASSERT(sendto(fd, buf, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n);
  }
  struct rp_pkt ping = {.type = RP_PING, .batch = 7, .seq = 4242};
  n = rp_encode(&ping, buf, sizeof(buf));
  CU_ASSERT(sendto(fd, buf, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n);
  ssize_t k = recv_wait(fd, in, sizeof(in), 5000, NULL, NULL);
  CU_ASSERT_FATAL(k > 0);
  CU_ASSERT_EQUAL_FATAL(rp_decode(in, (size_t)k, &p), RP_OK);
  CU_ASSERT_EQUAL(p.type, RP_PONG);
  CU_ASSERT_EQUAL(p.seq, 4242u);
  close(fd);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

struct ping_flood {
  struct sockaddr_in to;
  atomic_bool stop;
  atomic_uint_fast64_t sent;
};

static void *ping_flood_main(void *arg) { /* PINGs as fast as one thread sends, 64 a call */
  struct ping_flood *f = arg;
  int fd = udp_bind("127.0.0.1", 0);
  int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big)); /* the PONGs: never read */
  static uint8_t buf[64][RP_MAX_PKT];
  struct mmsghdr m[64];
  struct iovec iov[64];
  for (int i = 0; i < 64; i++) {
    struct rp_pkt ping = {.type = RP_PING, .batch = 9, .seq = (uint32_t)i};
    iov[i] = (struct iovec){buf[i], rp_encode(&ping, buf[i], sizeof(buf[i]))};
    m[i] = (struct mmsghdr){
        .msg_hdr = {.msg_name = &f->to, .msg_namelen = sizeof(f->to), .msg_iov = &iov[i], .msg_iovlen = 1}};
  }
  while (fd >= 0 && !atomic_load(&f->stop)) {
    int k = sendmmsg(fd, m, 64, 0);
    atomic_fetch_add(&f->sent, k > 0 ? (uint64_t)k : 0);
  }
  if (fd >= 0) close(fd);
  return NULL;
}

/* A flood of PINGs at a responder (one thread sending them as fast as it can, more than
 * one thread answers): Deinit still ends it within 5 s (before: the responder read until
 * its socket was empty before it looked at Deinit's eventfd, and under a flood faster
 * than its answers that never came). */
static void test_deinit_under_flood(void) {
  uint16_t rport;
  HccnRpingCtx r = ctx_on("127.0.0.2", &rport);
  struct ping_flood f = {.to = sa_of("127.0.0.2", rport)};
  pthread_t th;
  CU_ASSERT_FATAL(r && pthread_create(&th, NULL, ping_flood_main, &f) == 0);
  for (int64_t end = (int64_t)(now_ns() / 1000000) + 5000;
       atomic_load(&f.sent) < 100000 && (int64_t)(now_ns() / 1000000) < end;)
    sched_yield();
  CU_ASSERT(atomic_load(&f.sent) >= 100000); /* it floods */
  uint64_t t0 = now_ns();
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
  uint64_t ms = (now_ns() - t0) / 1000000;
  if (ms >= 5000) fprintf(stderr, "  [Deinit under the flood took %llu ms]\n", (unsigned long long)ms);
  CU_ASSERT(ms < 5000);
  atomic_store(&f.stop, true);
  pthread_join(th, NULL);
}

/* A responder answers in the version it was asked in; one in mode UDP gives no RoCE
 * endpoint, so a ROCE client knows it cannot probe it over RDMA. */
static void test_responder_versions(void) {
  uint16_t rport;
  HccnRpingCtx r = ctx_on("127.0.0.2", &rport);
  int fd = udp_bind("127.0.0.1", 0);
  struct sockaddr_in to = sa_of("127.0.0.2", rport);
  uint8_t buf[RP_MAX_PKT + 64], in[RP_MAX_PKT + 64];
  struct rp_pkt p;

  CU_ASSERT_FATAL(r && fd >= 0);
  for (uint8_t v = RP_VERSION1; v <= RP_VERSION2; v++) {
    struct rp_pkt hello = {.version = v, .type = RP_HELLO, .target = 77, .seq = v};
    size_t n = rp_encode(&hello, buf, sizeof(buf));
    CU_ASSERT(sendto(fd, buf, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n);
    ssize_t k = recv_wait(fd, in, sizeof(in), 5000, NULL, NULL);
    CU_ASSERT_FATAL(k > 0);
    CU_ASSERT_EQUAL_FATAL(rp_decode(in, (size_t)k, &p), RP_OK);
    CU_ASSERT_EQUAL(p.version, v);
    CU_ASSERT_EQUAL(p.type, RP_HELLO_ACK);
    CU_ASSERT_EQUAL(p.seq, v);
    CU_ASSERT_EQUAL(p.payload_len, 0); /* mode UDP: no endpoint */
  }
  close(fd);
  ASSERT_HCCN(HccnRpingDeinit(r), HCCN_SUCCESS);
}

/* A mode-ROCE handshake's HELLO_ACK names the responder's UD endpoint; probes go to its
 * GID and answers count from there. A GID other than the target's own address (another
 * host, a multicast group) is refused, as is QPN 0xffffff (decoding drops it); the
 * target's own IPv4-mapped GID is taken. rp_handshake runs on a context marked ROCE:
 * the handshake is UDP, so no RDMA device is needed. */
struct ep_answer {
  int fd;
  uint8_t gid[16];
  uint32_t qpn; /* written over the encoded endpoint's, as a hostile peer may */
};

static void *ep_answer_main(void *arg) {
  struct ep_answer *a = arg;
  struct rp_ep ep = {.qpn = 0x11, .qkey = RP_QKEY, .mtu = 1024};
  uint8_t buf[RP_MAX_PKT + 1], epb[RP_EP_LEN];
  struct sockaddr_in from;
  struct rp_pkt p;
  ssize_t n = recv_wait(a->fd, buf, sizeof(buf), 10000, &from, NULL);

  if (n <= 0 || rp_decode(buf, (size_t)n, &p) != RP_OK || p.type != RP_HELLO) return NULL;
  memcpy(ep.gid, a->gid, 16);
  rp_ep_put(&ep, epb);
  p.type = RP_HELLO_ACK;
  p.payload = epb;
  p.payload_len = RP_EP_LEN;
  n = (ssize_t)rp_encode(&p, buf, sizeof(buf));
  for (int i = 0; i < 4; i++) buf[RP_HDR_LEN + 4 + i] = (uint8_t)(a->qpn >> (24 - 8 * i));
  if (sendto(a->fd, buf, (size_t)n, 0, (struct sockaddr *)&from, sizeof(from)) != n) perror("ep_answer");
  return NULL;
}

static void test_roce_endpoint_must_be_target(void) {
  static const struct {
    const char *what;
    uint8_t gid[16];
    uint32_t qpn;
    bool ok;
    int err;
  } cases[] = {
      {"another host's GID",
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 9, 9, 9},
       0x11,
       false,
       RP_HS_BAD_GID},
      {"a multicast GID",
       {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 6},
       0x11,
       false,
       RP_HS_BAD_GID},
      {"another address's GID on the same host",
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1},
       0x11,
       false,
       RP_HS_BAD_GID},
      {"the multicast QPN", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 6}, 0xffffff, false, 0},
      {"its own GID", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 6}, 0x11, true, 0},
  };
  struct rp_ctx ctx;

  memset(&ctx, 0, sizeof(ctx));
  inet_pton(AF_INET, "127.0.0.1", &ctx.addr);
  snprintf(ctx.addr_str, sizeof(ctx.addr_str), "127.0.0.1");
  ctx.roce = true;
  ctx.close_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  CU_ASSERT_FATAL(ctx.close_efd >= 0);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct ep_answer a = {.fd = udp_bind("127.0.0.6", 0), .qpn = cases[i].qpn};
    struct rp_target t;
    bool ok = !cases[i].ok;
    int err = -99;
    pthread_t th;

    CU_ASSERT_FATAL(a.fd >= 0);
    memcpy(a.gid, cases[i].gid, 16);
    memset(&t, 0, sizeof(t));
    inet_pton(AF_INET, "127.0.0.6", &t.dst);
    t.port = sock_port(a.fd);
    snprintf(t.name, sizeof(t.name), "127.0.0.6:%u", t.port);
    CU_ASSERT_FATAL(pthread_create(&th, NULL, ep_answer_main, &a) == 0);
    /* The answer comes at once; a refused one that is dropped leaves the wait to end. */
    ASSERT_HCCN(rp_handshake(&ctx, &t, 1, now_ns() + (cases[i].err || cases[i].ok ? 10000 : 500) * 1000000ull,
                             &ok, &err),
                HCCN_SUCCESS);
    pthread_join(th, NULL);
    close(a.fd);
    if (ok != cases[i].ok || err != cases[i].err)
      tu_fail(__FILE__, __LINE__, "%s: ok %d err %d, want ok %d err %d", cases[i].what, ok, err, cases[i].ok,
              cases[i].err);
    else
      CU_PASS(cases[i].what);
  }
  close(ctx.close_efd);
}

/* Duplicates, answers for other batches, seqs or targets, wrong types, garbage and
 * damaged payloads are never counted. */
static void test_forged_answers_ignored(void) {
  struct fake f = {.forge = true, .want_tos = 132}, d = {.damage = true, .want_tos = 132};
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL);
  HccnRpingTargetInfo t[2];
  HccnRpingResultInfo res[2];

  CU_ASSERT_FATAL(c && fake_start(&f, "127.0.0.5") && fake_start(&d, "127.0.0.6"));
  t[0] = tgt("127.0.0.5", f.port);
  t[1] = tgt("127.0.0.6", d.port);
  for (int i = 0; i < 2; i++) {
    t[i].payloadLen = 64;
    tu_fill(t[i].payload, 64, 7);
  }
  ASSERT_HCCN(HccnRpingAddTarget(c, 2, t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 30, 1, 500), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 2, t, res, 10000), HCCN_SUCCESS);
  check_all_answered(&res[0], 30, 500, "forgeries around valid answers");
  CU_ASSERT_EQUAL(res[1].state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res[1].txPkt, 30u);
  CU_ASSERT_EQUAL(res[1].rxPkt, 0u); /* every payload came back damaged */
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  fake_stop(&f);
  fake_stop(&d);
}

/* A responder that drops 1 probe in 10, answers 1 in 10 after the timeout and the
 * rest after 20 ms: the counts are exact and the times within tolerance. */
static void test_impaired_responder(void) {
  struct fake f = {.drop_mod = 10,
                   .drop_rem = 3,
                   .late_mod = 10,
                   .late_rem = 5,
                   .late_ms = 600,
                   .delay_ms = 20,
                   .want_tos = 132};
  HccnRpingCtx c = ctx_on("127.0.0.1", NULL);
  HccnRpingTargetInfo t;
  HccnRpingResultInfo res;
  uint64_t t0, ms;

  CU_ASSERT_FATAL(c && fake_start(&f, "127.0.0.5"));
  t = tgt("127.0.0.5", f.port);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  t0 = now_ns();
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 50, 2, 300), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, 1, &t, &res, 10000), HCCN_SUCCESS);
  ms = (now_ns() - t0) / 1000000u;
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.txPkt, 50u);
  CU_ASSERT_EQUAL(res.rxPkt, 40u);
  if (res.minRTT < 20000 || res.avgRTT > 20000 + 15000 || res.maxRTT >= 300000)
    tu_fail(__FILE__, __LINE__, "min/avg/max %u/%u/%u us for a 20 ms delay", res.minRTT, res.avgRTT,
            res.maxRTT);
  CU_ASSERT(ms >= 398 && ms < 2400); /* ends 300 ms after the last probe, before the late answers */
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  fake_stop(&f);
}

/* ---------------------------------------------------------------- main */

int main(void) {
  CU_pSuite s;

  signal(SIGPIPE, SIG_IGN);
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  s = CU_add_suite("packet codec", NULL, NULL);
  CU_add_test(s, "HccnResult names and values", test_result_names);
  CU_add_test(s, "encode/decode round trip, byte order", test_wire_roundtrip);
  CU_add_test(s, "encode refuses invalid packets", test_wire_encode_rejects);
  CU_add_test(s, "decode rejects each malformation", test_wire_decode_rejects);
  CU_add_test(s, "version 2: HELLO_ACK with a RoCE endpoint", test_wire_v2_endpoint);
  CU_add_test(s, "version 2: malformed endpoints", test_wire_v2_rejects);
  CU_add_test(s, "RoCE GRH: IPv4 at offset 20, or IPv6", test_grh_read);
  CU_add_test(s, "200000 random mutations", test_wire_mutations);
  s = CU_add_suite("processes", NULL, NULL);
  CU_add_test(s, "responder in a child process; stopped child", test_child_process_responder);
  s = CU_add_suite("Init and Deinit", NULL, NULL);
  CU_add_test(s, "bad attributes and devices", test_init_args);
  CU_add_test(s, "HIXL_RPING_ADD_TIMEOUT_MS", test_init_env_timeout);
  CU_add_test(s, "one Init per device", test_one_init_per_device);
  CU_add_test(s, "responder port in use", test_init_port_in_use);
  CU_add_test(s, "closed, NULL and bogus contexts", test_closed_and_bogus_ctx);
  s = CU_add_suite("AddTarget", NULL, NULL);
  CU_add_test(s, "bad arguments add nothing", test_add_args);
  CU_add_test(s, "duplicates by dstIp keep the first", test_add_dedupe_keeps_first);
  CU_add_test(s, "a target that never answers times out", test_add_timeout);
  CU_add_test(s, "waits for a target that starts later", test_add_waits_for_late_target);
  CU_add_test(s, "Deinit wakes a waiting AddTarget", test_deinit_during_add);
  CU_add_test(s, "answering targets stay added", test_add_partial);
  CU_add_test(s, "npuNum bounds the targets", test_npu_num_limit);
  CU_add_test(s, "two AddTargets racing for the last place", test_add_race_for_last_place);
  s = CU_add_suite("batches", NULL, NULL);
  CU_add_test(s, "state rules and bufferSize", test_batch_rules);
  CU_add_test(s, "results, states and RemoveTarget", test_results_and_states);
  CU_add_test(s, "four contexts probe each other and themselves", test_self_and_mesh);
  CU_add_test(s, "a dead target: bounded batch, all lost", test_dead_target_bounded);
  CU_add_test(s, "Deinit with a batch running", test_deinit_with_batch_running);
  CU_add_test(s, "Stop and Deinit end an interval-0 burst", test_stop_ends_burst);
  s = CU_add_suite("on the wire", NULL, NULL);
  CU_add_test(s, "TOS byte and source port both ways", test_tos_both_ways);
  CU_add_test(s, "responder ignores malformed datagrams", test_responder_ignores_garbage);
  CU_add_test(s, "Deinit ends a responder under a flood of PINGs", test_deinit_under_flood);
  CU_add_test(s, "responder answers in the version asked", test_responder_versions);
  CU_add_test(s, "ROCE handshake: the endpoint's GID is the target's", test_roce_endpoint_must_be_target);
  CU_add_test(s, "forged and damaged answers are not counted", test_forged_answers_ignored);
  CU_add_test(s, "drops, delays and late answers", test_impaired_responder);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
