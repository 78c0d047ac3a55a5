/* fuzz_link: a live target engine's link state machine against a hostile peer. Set up
 * once: a target engine on 127.0.0.1 (keyless, Transport tcp, scoped) with one
 * registered buffer R between two buffers it never registered (S_lo, S_hi). R's first
 * half P, of a known pattern, is granted to the raw peer's name; its second half G is
 * granted only to a clean initiator engine, connected to the target once, which is
 * granted all of R. S_lo, G and S_hi hold a random 16-byte block, repeated: memory the
 * raw peer may not reach. A CALL service answers. Per input: a raw TCP link does the
 * keyless handshake (HELLO, HELLO_ACK), sends the frames the input encodes (below),
 * reading all the target sends meanwhile, then half-closes and waits for the target to
 * close the link. After each input (abort() on any violation):
 *  - the target closed the link, and no byte stood still for FUZZ_LINK_CLOSE_MS before
 *    (no hang: it read on, answered, or closed);
 *  - every whole frame it sent parses (header and body), and no READ_RESP payload
 *    holds the block (no read of memory not granted to the peer);
 *  - S_lo, G and S_hi hold their bytes (no write outside P);
 *  - P set back to its pattern, the initiator READs all of R and gets P's pattern and
 *    G's block byte for byte (reconnecting once if its link went); LeakSanitizer
 *    catches leaks.
 *
 * Input: a sequence of ops, each an op byte (kind = op & 15, mod = op >> 4) and the
 * fields it needs, taken from the input (0 once it ends); lengths are bounded.
 *   0 WRITE_REQ   seq, addr, len(mod) and that much payload (input bytes, then 0x5a)
 *   1 READ_REQ    seq, addr, len(mod)
 *   2 NOTIFY      seq, name, msg (each up to 255 bytes, or 2047 with mod & 1)
 *   3 SYNC        seq
 *   4 CALL        seq, service, request (up to 255 bytes, or 65535 + 255 with mod & 1)
 *   5 CALL_AFTER  seq, after, service, request
 *   6 STAGE_WRITE seq, count (0..8), ranges (addr, len u16), packed payload
 *   7 STAGE_READ  seq, count, ranges
 *   8 STAGE_PULL (mod & 1: STAGE_PUSH) seq, buf, rkey, count, ranges
 *   9 CALL_TAG    seq, tag, service, request
 *  10 RAILS       seq
 *  11 SHM_HELLO   layout, boot id, pid, uid (mod & 1: this host's), flags, extra bytes
 *  12 SHM_MAP_HELLO flags (mod & 1: SHM_UNMAP_ACK addr, len)
 *  13 RDMA_CONNECT qpn, psn, gid, mtu
 *  14 raw bytes   n, then n bytes as they are (mod & 1: hold, below)
 *  15 any frame   type, flags, body (n bytes), payload length and its bytes
 * addr: a selector byte (P, R's end, S_lo, S_hi + 1, 0, ~0, 8 input bytes, G),
 * plus a signed 16-bit offset when its bit 3 is set. len(mod): mod & 3 picks 1, 2, 3
 * or 4 input bytes. A length field may lie; the payload sent is bounded (FUZZ_LINK_PAY).
 * With a hold anywhere in the input, the raw link's receive buffer is 64 KiB and nothing
 * is read back until the target has taken no byte for FUZZ_LINK_HOLD_MS, so that its
 * answers back up (LinkAnswersMax is 16 here) and the link stalls and resumes.
 *
 * FUZZ_LINK_SEEDS=DIR: write the seed sequences there first (tests/fuzz/link_corpus
 * came from it). FUZZ_LINK_LOG=1: the engines' log, and each link's byte counts. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_engine.h"
#include "hixl/hixl_status.h"
#include "util/cma.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The engines' last messages (quiet keeps them), shown when an invariant fails. */
#define LAST_LOG 16
static char last[LAST_LOG][256];
static unsigned last_n;
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;

static _Noreturn void fail(void) {
  unsigned n = last_n < LAST_LOG ? last_n : LAST_LOG;
  for (unsigned i = last_n - n; i < last_n; i++)
    fprintf(stderr, "fuzz_link: engine said: %s\n", last[i % LAST_LOG]);
  abort();
}

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_link: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                \
      fail();                                                                                                \
    }                                                                                                        \
  } while (0)

#define R_LEN              (64u << 10)
#define S_LEN              (16u << 10)
#define P_LEN              (R_LEN / 2) /* granted to the raw peer; the rest of R, G, is not */
#define PEER_NAME          "fuzz-link"
#define FUZZ_LINK_PAY      (1u << 20)  /* payload bytes sent for one frame at most */
#define FUZZ_LINK_OUT      (8u << 20)  /* bytes sent on one link at most */
#define FUZZ_LINK_RX       (32u << 20) /* bytes kept of what the target sent */
#define FUZZ_LINK_OPS      256u
#define FUZZ_LINK_CLOSE_MS 10000
#define FUZZ_LINK_HOLD_MS  10
#define FUZZ_LINK_FDS      64 /* descriptors more than after the first input: a leak */
#define FUZZ_SERVICE       3  /* the target's test service (ENGINE_SERVICES is 4) */

static HixlEngine *target, *init;
static uint8_t *area;       /* S_lo | R | S_hi */
static uint8_t *rmem;       /* R, registered with the target: P | G */
static uint8_t *lmem;       /* the initiator's buffer, R_LEN */
static uint8_t want[R_LEN]; /* what R holds between inputs: P's pattern, G's block */
static uint8_t block[16];   /* S's block, random per run */
static char taddr[64], iaddr[64];
static uint16_t tport;
static struct cma_self me;

/* ---- setup ---- */

static uint8_t pat_byte(size_t i) { return (uint8_t)((i * 131u + 7u) ^ (i >> 8)); }

static bool secret_intact(const uint8_t *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (s[i] != block[i & 15]) return false;
  return true;
}

/* The test service: echoes the request with its first byte picking the status. */
static HixlStatus svc(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                      size_t *resp_len) {
  (void)ctx;
  CHECK(peer != NULL);
  size_t n = len < cap ? len : cap;
  if (n) memcpy(resp, req, n);
  *resp_len = n;
  return len > 0 && req[0] == 0xff ? HIXL_FAILED : HIXL_SUCCESS;
}

/* The engines' messages are formatted (that code runs too) and dropped: a link refused
 * is what most inputs end in. FUZZ_LINK_LOG=1 prints them. */
static void quiet(HixlLogLevel level, const char *message, void *ctx) {
  (void)level;
  (void)ctx;
  CHECK(message != NULL);
  pthread_mutex_lock(&last_lock);
  snprintf(last[last_n++ % LAST_LOG], sizeof(last[0]), "%s", message);
  pthread_mutex_unlock(&last_lock);
}

static uint16_t free_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
  CHECK(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
  close(fd);
  return ntohs(sa.sin_port);
}

static void write_seeds(const char *dir);

static void setup(void) {
  HixlMemHandle h;
  /* Few answers owed before a link stalls (a hold reaches it), for the target only. */
  HixlOption o[] = {
      {"Transport", "tcp"}, {"LinkAnswersMax", "16"}, {"LinkAnswerMiB", "1"}, {"SocketBufferKiB", "64"}};
  if (!getenv("FUZZ_LINK_LOG")) HixlSetLogCallback(quiet, NULL);
  CHECK(getrandom(block, sizeof(block), 0) == (ssize_t)sizeof(block));
  CHECK(cma_self_get(&me) == 0);
  area = mmap(NULL, 2 * S_LEN + R_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  lmem = mmap(NULL, R_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(area != MAP_FAILED && lmem != MAP_FAILED);
  rmem = area + S_LEN;
  for (size_t i = 0; i < S_LEN; i++) area[i] = rmem[R_LEN + i] = block[i & 15];
  for (size_t i = 0; i < R_LEN; i++) want[i] = i < P_LEN ? pat_byte(i) : block[i & 15];
  memcpy(rmem, want, R_LEN);

  tport = free_port();
  snprintf(taddr, sizeof(taddr), "127.0.0.1:%u", (unsigned)tport);
  snprintf(iaddr, sizeof(iaddr), "127.0.0.1:%u", (unsigned)free_port());
  CHECK(HixlEngineCreate(&target) == HIXL_SUCCESS);
  CHECK(HixlEngineInitialize(target, taddr, o, 4) == HIXL_SUCCESS);
  CHECK(hixl_engine_set_scoped(target, true) == HIXL_SUCCESS);
  HixlMemDesc d = {(uintptr_t)rmem, R_LEN};
  CHECK(HixlEngineRegisterMem(target, &d, HIXL_MEM_HOST, &h) == HIXL_SUCCESS);
  const uint64_t all[1][2] = {{(uintptr_t)rmem, R_LEN}}, half[1][2] = {{(uintptr_t)rmem, P_LEN}};
  CHECK(hixl_engine_grant(target, iaddr, all, 1) == HIXL_SUCCESS);
  CHECK(hixl_engine_grant(target, PEER_NAME, half, 1) == HIXL_SUCCESS);
  CHECK(hixl_engine_set_service(target, FUZZ_SERVICE, svc, NULL) == HIXL_SUCCESS);

  CHECK(HixlEngineCreate(&init) == HIXL_SUCCESS);
  CHECK(HixlEngineInitialize(init, iaddr, o, 1) == HIXL_SUCCESS);
  d.addr = (uintptr_t)lmem;
  CHECK(HixlEngineRegisterMem(init, &d, HIXL_MEM_HOST, &h) == HIXL_SUCCESS);
  CHECK(HixlEngineConnect(init, taddr, 5000) == HIXL_SUCCESS);
  write_seeds(getenv("FUZZ_LINK_SEEDS"));
}

/* ---- the input, read field by field (0 once it ends) ---- */

struct rd {
  const uint8_t *p;
  size_t n;
};

static uint64_t take(struct rd *r, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes; i++) {
    v <<= 8;
    if (r->n) {
      v |= *r->p++;
      r->n--;
    }
  }
  return v;
}

/* ---- what is sent ---- */

struct out {
  uint8_t *b;
  size_t len, cap;
  bool full;
  bool hold; /* read nothing back until the target stops taking bytes (op 14, mod & 1) */
};

static void put_bytes(struct out *o, const void *p, size_t n) {
  if (n == 0) return;
  if (o->full || n > FUZZ_LINK_OUT - o->len) {
    o->full = true;
    return;
  }
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + n) cap *= 2;
    uint8_t *b = realloc(o->b, cap);
    CHECK(b != NULL);
    o->b = b;
    o->cap = cap;
  }
  if (p)
    memcpy(o->b + o->len, p, n);
  else
    memset(o->b + o->len, 0x5a, n);
  o->len += n;
}

static void put_be(struct out *o, uint64_t v, unsigned bytes) {
  uint8_t b[8];
  for (unsigned i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
  put_bytes(o, b, bytes);
}

static void put_hdr(struct out *o, unsigned type, unsigned flags, uint32_t body, uint32_t payload) {
  put_be(o, WIRE_MAGIC, 4);
  put_be(o, WIRE_VERSION, 1);
  put_be(o, type, 1);
  put_be(o, flags, 2);
  put_be(o, body, 4);
  put_be(o, payload, 4);
  put_be(o, 0, 4);
}

/* n bytes from the input, then filler. */
static void put_from(struct out *o, struct rd *r, size_t n) {
  size_t k = n < r->n ? n : r->n;
  put_bytes(o, r->p, k);
  r->p += k;
  r->n -= k;
  if (n > k) put_bytes(o, NULL, n - k);
}

static uint64_t pick_addr(struct rd *r) {
  unsigned sel = (unsigned)take(r, 1);
  uint64_t base;
  switch (sel & 7) {
  case 0: base = (uintptr_t)rmem; break;
  case 1: base = (uintptr_t)rmem + R_LEN; break;
  case 2: base = (uintptr_t)area; break;
  case 3: base = (uintptr_t)rmem + R_LEN + 1; break;
  case 4: base = 0; break;
  case 5: base = UINT64_MAX; break;
  case 6: base = take(r, 8); break;
  default: base = (uintptr_t)rmem + P_LEN; break;
  }
  if (sel & 8) base += (uint64_t)(int64_t)(int16_t)take(r, 2);
  return base;
}

static uint32_t pick_len(struct rd *r, unsigned mod) { return (uint32_t)take(r, (mod & 3) + 1); }

/* A payload of len bytes: all of it when it is at most FUZZ_LINK_PAY, else none (the
 * link then waits for bytes that never come, as a peer that stops would leave it). */
static bool put_payload(struct out *o, struct rd *r, uint64_t len) {
  if (len > FUZZ_LINK_PAY) return false;
  put_from(o, r, (size_t)len);
  return true;
}

static void put_call_body(struct out *o, struct rd *r, unsigned type, unsigned mod) {
  uint64_t seq = take(r, 1), after = 0, tag = 0;
  if (type == WIRE_CALL_AFTER) after = take(r, 1);
  if (type == WIRE_CALL_TAG) tag = take(r, 1);
  uint16_t service = (uint16_t)(take(r, 1) % 8);
  uint32_t len = (uint32_t)take(r, 1);
  if (mod & 1) len += (uint32_t)take(r, 2);
  uint32_t fixed = type == WIRE_CALL ? 10 : type == WIRE_CALL_AFTER ? 18 : 14;
  put_hdr(o, type, 0, fixed + len, 0);
  put_be(o, seq, 8);
  if (type == WIRE_CALL_AFTER) put_be(o, after, 8);
  if (type == WIRE_CALL_TAG) put_be(o, tag, 4);
  put_be(o, service, 2);
  put_from(o, r, len);
}

static bool put_stage(struct out *o, struct rd *r, unsigned type, unsigned mod) {
  uint64_t seq = take(r, 1), buf = 0;
  uint32_t rkey = 0;
  bool rdma = type == WIRE_STAGE_PULL || type == WIRE_STAGE_PUSH;
  if (rdma) {
    buf = pick_addr(r);
    rkey = (uint32_t)take(r, 4);
  }
  uint32_t count = (uint32_t)(take(r, 1) % 9);
  uint64_t addr[8], sum = 0;
  uint32_t len[8];
  for (uint32_t i = 0; i < count; i++) {
    addr[i] = pick_addr(r);
    len[i] = (uint32_t)take(r, 2);
    sum += len[i];
  }
  uint64_t payload = type == WIRE_STAGE_WRITE ? ((mod & 2) ? take(r, 2) : sum) : 0;
  put_hdr(o, type, 0, (rdma ? 24 : 12) + count * WIRE_STAGE_SEG_LEN, (uint32_t)payload);
  put_be(o, seq, 8);
  if (rdma) {
    put_be(o, buf, 8);
    put_be(o, rkey, 4);
  }
  put_be(o, count, 4);
  for (uint32_t i = 0; i < count; i++) {
    put_be(o, addr[i], 8);
    put_be(o, len[i], 4);
  }
  return put_payload(o, r, payload);
}

/* The frames of one input into o. */
static void encode(struct out *o, struct rd *r) {
  for (unsigned ops = 0; r->n > 0 && ops < FUZZ_LINK_OPS && !o->full; ops++) {
    unsigned op = (unsigned)take(r, 1), mod = op >> 4;
    bool more = true;
    switch (op & 15) {
    case 0: {
      uint64_t seq = take(r, 1), addr = pick_addr(r);
      uint32_t len = pick_len(r, mod);
      put_hdr(o, WIRE_WRITE_REQ, 0, 16, len);
      put_be(o, seq, 8);
      put_be(o, addr, 8);
      more = put_payload(o, r, len);
      break;
    }
    case 1: {
      uint64_t seq = take(r, 1), addr = pick_addr(r);
      uint32_t len = pick_len(r, mod);
      put_hdr(o, WIRE_READ_REQ, 0, 20, 0);
      put_be(o, seq, 8);
      put_be(o, addr, 8);
      put_be(o, len, 4);
      break;
    }
    case 2: {
      uint64_t seq = take(r, 1);
      uint32_t nl = (uint32_t)take(r, 1), ml = (uint32_t)take(r, 1);
      if (mod & 1) {
        nl = (nl << 3) | (mod >> 1);
        ml = (ml << 3) | (mod >> 1);
      }
      put_hdr(o, WIRE_NOTIFY, 0, 12 + nl + ml, 0);
      put_be(o, seq, 8);
      put_be(o, nl, 2);
      put_be(o, ml, 2);
      put_from(o, r, nl + ml);
      break;
    }
    case 3:
      put_hdr(o, WIRE_SYNC, 0, 8, 0);
      put_be(o, take(r, 1), 8);
      break;
    case 4: put_call_body(o, r, WIRE_CALL, mod); break;
    case 5: put_call_body(o, r, WIRE_CALL_AFTER, mod); break;
    case 6: more = put_stage(o, r, WIRE_STAGE_WRITE, mod); break;
    case 7: more = put_stage(o, r, WIRE_STAGE_READ, mod); break;
    case 8: more = put_stage(o, r, (mod & 1) ? WIRE_STAGE_PUSH : WIRE_STAGE_PULL, mod); break;
    case 9: put_call_body(o, r, WIRE_CALL_TAG, mod); break;
    case 10:
      put_hdr(o, WIRE_RAILS, 0, 8, 0);
      put_be(o, take(r, 1), 8);
      break;
    case 11: {
      uint16_t layout = (mod & 2) ? (uint16_t)take(r, 2) : (mod & 4) ? 1 : 2;
      uint32_t ext = (uint32_t)take(r, 1);
      put_hdr(o, WIRE_SHM_HELLO, 0, WIRE_SHM_ID_LEN + 4 + ext, 0);
      put_be(o, layout, 2);
      if (mod & 1) {
        put_bytes(o, me.boot_id, sizeof(me.boot_id));
        put_be(o, me.pid + (uint32_t)take(r, 1), 4);
        put_be(o, me.uid, 4);
      } else {
        put_from(o, r, CMA_BOOT_ID_LEN);
        put_be(o, take(r, 4), 4);
        put_be(o, take(r, 4), 4);
      }
      put_be(o, take(r, 4), 4);
      put_from(o, r, ext);
      break;
    }
    case 12:
      if (mod & 1) {
        put_hdr(o, WIRE_SHM_UNMAP_ACK, 0, WIRE_SHM_UNMAP_LEN, 0);
        put_be(o, pick_addr(r), 8);
        put_be(o, pick_len(r, mod >> 1), 8);
      } else {
        put_hdr(o, WIRE_SHM_MAP_HELLO, 0, 4, 0);
        put_be(o, take(r, 4), 4);
      }
      break;
    case 13:
      put_hdr(o, WIRE_RDMA_CONNECT, 0, WIRE_QP_INFO_LEN, 0);
      put_from(o, r, WIRE_QP_INFO_LEN);
      break;
    case 14:
      if (mod & 1)
        o->hold = true;
      else
        put_from(o, r, (size_t)take(r, 1));
      break;
    default: {
      unsigned type = (unsigned)take(r, 1) % (WIRE_TYPE_MAX_ + 2);
      unsigned flags = (mod & 4) ? (unsigned)take(r, 1) : 0;
      uint32_t body = (uint32_t)take(r, (mod & 1) ? 2 : 1);
      uint32_t payload = (mod & 2) ? (uint32_t)take(r, 2) : 0;
      put_hdr(o, type, flags, body, payload);
      put_from(o, r, body);
      put_from(o, r, payload);
      break;
    }
    }
    if (!more) break;
  }
}

/* ---- the raw link ---- */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool recv_all(int fd, void *p, size_t n) {
  uint8_t *b = p;
  errno = 0;
  while (n) {
    ssize_t k = recv(fd, b, n, 0);
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

/* Descriptors this process holds (both engines' and the raw link's). */
static int fds_open(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  CHECK(d != NULL);
  while (readdir(d)) n++;
  closedir(d);
  return n - 3; /* ., .. and d's own */
}

/* A link to the target through the keyless handshake, as an initiator makes it. */
static int raw_link(bool hold) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(tport)};
  struct timeval tv = {.tv_sec = 5};
  uint8_t buf[4096];
  struct wire_hdr h;
  struct wire_msg m;
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (hold) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){65536}, sizeof(int));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    fprintf(stderr, "fuzz_link: cannot connect to the target: %s (%d descriptors open here)\n",
            strerror(errno), fds_open());
    fail();
  }
  size_t n = wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, PEER_NAME);
  CHECK(n > 0 && send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
  if (!recv_all(fd, buf, WIRE_HDR_LEN)) { /* EOF: it closed the link; EAGAIN: 5 s without an answer */
    fprintf(stderr, "fuzz_link: no HELLO_ACK: %s (%d descriptors open here)\n",
            errno ? strerror(errno) : "EOF", fds_open());
    fail();
  }
  CHECK(wire_parse_hdr(buf, &h) == WIRE_OK && h.type == WIRE_HELLO_ACK);
  uint8_t *body = malloc(h.body_len ? h.body_len : 1);
  CHECK(body && recv_all(fd, body, h.body_len));
  CHECK(wire_decode(&h, body, &m) == WIRE_OK && m.u.hello_ack.status == WIRE_HELLO_OK);
  free(body);
  return fd;
}

/* Whether p holds the block anywhere (no memcmp: its bytes must not reach the fuzzer's
 * comparison hints, or it could write them into R and read them back). */
static bool holds_block(const uint8_t *p, size_t n) {
  for (size_t i = 0; i + sizeof(block) <= n; i++) {
    uint8_t d = 0;
    for (size_t j = 0; j < sizeof(block); j++) d |= (uint8_t)(p[i + j] ^ block[j]);
    if (!d) return true;
  }
  return false;
}

/* Every whole frame the target sent parses; no READ_RESP carries the block. A frame cut
 * short at the end is one the target was sending when it closed the link. */
static void check_answers(const uint8_t *b, size_t n) {
  while (n >= WIRE_HDR_LEN) {
    struct wire_hdr h;
    struct wire_msg m;
    CHECK(wire_parse_hdr(b, &h) == WIRE_OK);
    CHECK((h.flags & WIRE_F_TAG) == 0);
    size_t whole = WIRE_HDR_LEN + (size_t)h.body_len + h.payload_len;
    if (n < WIRE_HDR_LEN + (size_t)h.body_len) return;
    if (wire_decode(&h, b + WIRE_HDR_LEN, &m) != WIRE_OK) {
      fprintf(stderr, "fuzz_link: the target sent a malformed %s (body %u bytes, payload %u)\n",
              wire_type_name(h.type), h.body_len, h.payload_len);
      fail();
    }
    size_t pay =
        n - WIRE_HDR_LEN - h.body_len < h.payload_len ? n - WIRE_HDR_LEN - h.body_len : h.payload_len;
    if (h.type == WIRE_READ_RESP) CHECK(!holds_block(b + WIRE_HDR_LEN + h.body_len, pay));
    if (n < whole) return;
    b += whole;
    n -= whole;
  }
}

/* Send o on fd, reading what comes back; then half-close and wait for the target to
 * close the link. */
static void pump(int fd, const struct out *o) {
  static uint8_t *rx;
  size_t rx_len = 0, sent = 0;
  bool shut = false, reading = !o->hold;
  if (!rx) CHECK((rx = malloc(FUZZ_LINK_RX)) != NULL);
  uint64_t moved = now_ms(); /* when a byte last went either way, or the half-close */
  for (;;) {
    if (sent == o->len && !shut) {
      shutdown(fd, SHUT_WR);
      shut = true;
      moved = now_ms();
    }
    struct pollfd p = {.fd = fd, .events = (short)((reading ? POLLIN : 0) | (shut ? 0 : POLLOUT))};
    int k = poll(&p, 1, reading ? 100 : FUZZ_LINK_HOLD_MS);
    CHECK(k >= 0 || errno == EINTR);
    if (!reading && (k == 0 || (p.revents & (POLLHUP | POLLERR)))) { /* it takes no more, or it went */
      reading = true;
      moved = now_ms();
      continue;
    }
    if (now_ms() - moved > FUZZ_LINK_CLOSE_MS) {
      fprintf(stderr, "fuzz_link: the link stood still for %d ms (%s, %zu of %zu bytes sent)\n",
              FUZZ_LINK_CLOSE_MS,
              shut ? "half-closed, the target did not close it" : "the target read nothing", sent, o->len);
      fail();
    }
    if (k <= 0) continue;
    if (reading && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      uint8_t tmp[65536];
      ssize_t got = recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
      if (got > 0) {
        moved = now_ms();
        size_t keep = (size_t)got < FUZZ_LINK_RX - rx_len ? (size_t)got : FUZZ_LINK_RX - rx_len;
        memcpy(rx + rx_len, tmp, keep);
        rx_len += keep;
      }
    }
    if (!shut && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, o->b + sent, o->len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) {
        sent += (size_t)w;
        moved = now_ms();
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        sent = o->len; /* the target closed it: nothing more to send */
      }
    }
  }
  if (getenv("FUZZ_LINK_LOG")) fprintf(stderr, "fuzz_link: %zu bytes sent, %zu received\n", sent, rx_len);
  check_answers(rx, rx_len);
}

/* ---- after each input ---- */

static void check_engine(void) {
  CHECK(secret_intact(area, S_LEN));
  CHECK(secret_intact(rmem + P_LEN, R_LEN - P_LEN));
  CHECK(secret_intact(rmem + R_LEN, S_LEN));
  memcpy(rmem, want, P_LEN); /* a WRITE the link made there is its right; the link is gone now */
  memset(lmem, 0, R_LEN);
  HixlTransferOpDesc op = {(uintptr_t)lmem, (uintptr_t)rmem, R_LEN};
  HixlStatus st = HixlEngineTransferSync(init, taddr, HIXL_READ, &op, 1, 5000);
  if (st != HIXL_SUCCESS) { /* its link went: once more on a new one */
    fprintf(stderr, "fuzz_link: the initiator's READ: %s; connecting again\n", HixlGetLastErrorMessage());
    HixlEngineDisconnect(init, taddr, 1000);
    CHECK(HixlEngineConnect(init, taddr, 5000) == HIXL_SUCCESS);
    CHECK(HixlEngineTransferSync(init, taddr, HIXL_READ, &op, 1, 5000) == HIXL_SUCCESS);
  }
  CHECK(memcmp(lmem, want, R_LEN) == 0);
  HixlNotifyDesc *nd = NULL;
  size_t count = 0;
  CHECK(HixlEngineGetNotifies(target, &nd, &count) == HIXL_SUCCESS);
  HixlEngineFreeNotifies(nd);
  /* The links gone leave no descriptor behind (now and then: it reads /proc). */
  static int base = -1;
  static unsigned runs;
  if (base < 0) base = fds_open();
  if (++runs % 256 == 0 && fds_open() > base + FUZZ_LINK_FDS) {
    fprintf(stderr, "fuzz_link: %d descriptors open, %d after the first input\n", fds_open(), base);
    fail();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool ready;
  if (!ready) {
    setup();
    ready = true;
  }
  struct out o = {0};
  struct rd r = {data, size};
  encode(&o, &r);
  int fd = raw_link(o.hold);
  pump(fd, &o);
  close(fd);
  free(o.b);
  check_engine();
  return 0;
}

/* ---- seeds ---- */

static void seed(const char *dir, const char *name, const uint8_t *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

static void write_seeds(const char *dir) {
  if (!dir) return;
  /* WRITE 16 bytes at R + 256, SYNC, READ them back. */
  static const uint8_t write_read[] = {0x00, 1,   0x08, 0x01, 0x00, 16,  'h',  'i',  'x',  'l',
                                       '-',  'f', 'u',  'z',  'z',  '-', 'l',  'i',  'n',  'k',
                                       '!',  '!', 0x03, 2,    0x01, 3,   0x08, 0x01, 0x00, 16};
  /* READ 4096 at R, READ past R's end, READ of S_lo. */
  static const uint8_t reads[] = {0x11, 1, 0x00, 0x10, 0x00, 0x11, 2, 0x01, 0x00, 0x10, 0x01, 3, 0x02, 64};
  /* MEM_ADD from the initiator (any frame: type 3, a 22-byte entry). */
  static const uint8_t mem_add[] = {0x0f, 3, 22, 0, 0,    0, 0, 0, 0, 0x10, 0, 0,    0,
                                    0,    0, 0,  0, 0x10, 0, 0, 0, 0, 0,    0, 0x03, 1};
  /* CALL the test service, CALL a service nobody offers, CALL_AFTER. */
  static const uint8_t calls[] = {0x04, 1, FUZZ_SERVICE, 4, 'p', 'i',          'n', 'g', 0x04, 2,
                                  1,    0, 0x05,         3, 0,   FUZZ_SERVICE, 2,   'o', 'k'};
  /* NOTIFY name "n", msg "hello"; a second one. */
  static const uint8_t notify[] = {0x02, 1, 1, 5, 'n', 'h', 'e', 'l', 'l', 'o', 0x02, 2, 0, 0};
  /* STAGE_WRITE two ranges in R, STAGE_READ them back. */
  static const uint8_t stage[] = {0x06, 1,    2,    0x08, 0x00, 0x40, 0x00, 4,    0x08, 0x01, 0x00, 0x00,
                                  4,    'a',  'b',  'c',  'd',  'e',  'f',  'g',  'h',  0x07, 2,    2,
                                  0x08, 0x00, 0x40, 0x00, 4,    0x08, 0x01, 0x00, 0x00, 4};
  /* READ across P's end into G, a WRITE into G: both refused (G is not granted). */
  static const uint8_t grant_edge[] = {0x01, 1, 0x0f, 0xff, 0xf8, 16,  0x00, 2,
                                       0x07, 4, 'g',  'g',  'g',  'g', 0x03, 3};
  seed(dir, "grant-edge", grant_edge, sizeof(grant_edge));
  /* A hold, 64 READs of 32 KiB of P nobody reads for a while, a CALL behind them, a
   * SYNC. */
  uint8_t hold[1 + 64 * 5 + 8];
  size_t n = 0;
  hold[n++] = 0x1e;
  for (unsigned i = 0; i < 64; i++) {
    const uint8_t rd32k[] = {0x11, (uint8_t)i, 0x00, 0x80, 0x00};
    memcpy(hold + n, rd32k, sizeof(rd32k));
    n += sizeof(rd32k);
  }
  const uint8_t tail[] = {0x04, 99, FUZZ_SERVICE, 2, 'h', 'i', 0x03, 100};
  memcpy(hold + n, tail, sizeof(tail));
  seed(dir, "hold", hold, n + sizeof(tail));
  seed(dir, "write-read", write_read, sizeof(write_read));
  seed(dir, "reads", reads, sizeof(reads));
  seed(dir, "mem-add", mem_add, sizeof(mem_add));
  seed(dir, "calls", calls, sizeof(calls));
  seed(dir, "notify", notify, sizeof(notify));
  seed(dir, "stage", stage, sizeof(stage));
}
