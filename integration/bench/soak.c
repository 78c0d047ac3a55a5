/* hixl-soak (issue 28): one target engine, in its own process under a descriptor limit,
 * serves legitimate HixlEngine clients, every byte checked, while hostile peers press on
 * it, through a baseline, a hostile phase and a baseline again; what each peer does, what
 * is sampled and the goals: docs/performance-soak.md. Nothing waits by sleeping: the
 * churn and the reconnects are paced by timers (a rate, not a synchronisation). */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/timerfd.h>

#include "harness.h"
#include "wire/wire.h"

#define SOAK_MAX        16                        /* clients, and flood links */
#define SOAK_SMALL      4096u                     /* one small op */
#define SOAK_BATCH      200u                      /* small ops per call */
#define SOAK_BATCH_LEN  (SOAK_SMALL * SOAK_BATCH) /* 800 KiB */
#define SOAK_LARGE      (4u << 20)                /* one large op */
#define SOAK_READ_AREA  (16u << 20)               /* target: the pattern every READ checks against */
#define SOAK_WRITE_AREA (8u << 20)                /* target: per client, its WRITEs and their read-back */
#define SOAK_JOIN_LEN   (64u << 10)               /* the late joiner's READ */
#define SOAK_SEED       0x50a4u                   /* the read area's pattern */
#define SOAK_RSS_SLACK  (16ull << 20)             /* the goal: RSS <= bound + 16 MiB */

#define SOAK_DEFAULT_ANSWER_MIB "16" /* LinkAnswerMiB unless an --opt sets it */
#define SOAK_CLIENT_MEM         (3 * SOAK_BATCH_LEN + 3 * (size_t)SOAK_LARGE) /* a client's buffers */

enum { PH_BASE1, PH_HOSTILE, PH_BASE2, PH_N };
static const char *const ph_name[PH_N] = {"baseline", "hostile", "baseline-after"};

/* The options (their table, defaults and docs are at main), in the initializer's order. */
static struct {
  double seconds, base_seconds, join_every; /* the hostile phase, each baseline, between late joiners */
  const char *transport, *json;
  unsigned clients, floods, half, idle_addrs, idle, target_nofile, churn_rate, reconnect_rate;
  size_t flood_len, answer_mib; /* answer_mib: the target's LinkAnswerMiB */
  int join_timeout_ms, op_timeout_ms;
} o = {120, -1, 5, "tcp", NULL, 2, 2, 64, 8, UINT32_MAX, 1024, 200, 500, SOAK_SMALL, 0, 15000, 10000};
static struct hb_extra g_topts; /* --opt: the target engine's */

static char g_taddr[64];              /* the target engine, "127.0.0.1:port" */
static struct sockaddr_in g_tsa;      /* the same, for the raw sockets */
static uintptr_t g_rbase;             /* its registered memory */
static uint8_t g_ref[SOAK_READ_AREA]; /* the read area's expected content */
static atomic_bool g_clients_stop;

static uint64_t count_wrong(const uint8_t *a, const uint8_t *b, size_t len) {
  uint64_t n = 0;
  if (memcmp(a, b, len) != 0)
    for (size_t i = 0; i < len; i++) n += a[i] != b[i];
  return n;
}

/* A TCP connection to the target from 127.0.0.<host> (the port chosen at connect, so
 * sources of TIME_WAIT do not run out of ports), made, or begun when nonblock; rcvbuf > 0
 * is its SO_RCVBUF, set before connect so that it stays small. -1 on error. */
static int connect_from(unsigned host, bool nonblock, int rcvbuf) {
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | (host & 0xffu))};
  int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  if (bind(fd, (struct sockaddr *)&me, sizeof(me)) == 0 &&
      (connect(fd, (struct sockaddr *)&g_tsa, sizeof(g_tsa)) == 0 || (nonblock && errno == EINPROGRESS)))
    return fd;
  close(fd);
  return -1;
}

/* A timerfd that fires every ns; -1 after saying why (who first). */
static int ticker(uint64_t ns, const char *who) {
  struct itimerspec its = {.it_interval = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}};
  its.it_value = its.it_interval;
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (tfd >= 0 && timerfd_settime(tfd, 0, &its, NULL) == 0) return tfd;
  hb_say("%s: timerfd: %s\n", who, strerror(errno));
  if (tfd >= 0) close(tfd);
  return -1;
}

/* A thread that calls fn(arg) on each tick of a timer, at most burst times a wake
 * (ticks it missed beyond those are dropped, not caught up), and ready(arg, revents) when
 * fd has one of events, until stopfd (an eventfd) is readable: the one body of every
 * hostile peer (the floods, the herd of idle and half-sent connections, the churn) and
 * of the late joiner. */
struct pacer {
  uint64_t ns; /* the period */
  unsigned burst;
  int stopfd;
  void (*fn)(void *arg);
  void *arg;
  const char *who; /* its messages' prefix */
  int fd;          /* -1: none now (fn and ready may change it) */
  short events;
  void (*ready)(void *arg, short revents);
};

static void *pacer_main(void *arg) {
  struct pacer *p = arg;
  int tfd = ticker(p->ns, p->who);
  for (uint64_t v; tfd >= 0;) {
    struct pollfd pf[3] = {{tfd, POLLIN, 0}, {p->stopfd, POLLIN, 0}, {p->fd, p->events, 0}};
    if ((poll(pf, 3, -1) < 0 && errno != EINTR) || pf[1].revents) break;
    if (pf[0].revents && read(tfd, &v, sizeof(v)) == (ssize_t)sizeof(v))
      for (uint64_t j = 0; j < v && j < p->burst; j++) p->fn(p->arg);
    if (pf[2].revents) p->ready(p->arg, pf[2].revents);
  }
  if (tfd >= 0) close(tfd);
  return NULL;
}

/* Set this process's soft descriptor limit to want, or to its hard limit when that is
 * lower: the limit now, 0 when it could not be set. */
static rlim_t set_nofile(rlim_t want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
  return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 0;
}

/* The target process: its descriptor limit, one engine, its memory registered (the read
 * area holds the pattern) and said on ctrl; it serves until ctrl says QUIT or closes. */
static int target_main(void *arg, int ctrl) {
  size_t len = SOAK_READ_AREA + (size_t)o.clients * SOAK_WRITE_AREA;
  HixlMemHandle h;
  HixlEngine *e;
  uint8_t *mem;
  int rc = 1;
  (void)arg;
  if (set_nofile(o.target_nofile) == 0)
    hb_die("target: setrlimit(RLIMIT_NOFILE, %u): %s", o.target_nofile, strerror(errno));
  if ((mem = hb_map(len)) == NULL) return 1;
  bench_pattern_fill(mem, len, SOAK_SEED);
  if ((e = hb_engine(g_taddr, o.transport, g_topts.v, g_topts.n)) != NULL) {
    if (hb_reg(e, mem, len, &h) == HIXL_SUCCESS && hb_ready(ctrl, (uint64_t[]){(uintptr_t)mem, len}, 2)) {
      hb_serve(ctrl, "QUIT", INT_MAX);
      rc = 0;
    }
    if (!hb_ok(HixlEngineDestroy(e), "target: HixlEngineDestroy")) rc = 1;
  }
  munmap(mem, len);
  return rc;
}

/* The target's RSS, open descriptors and CPU time now; false when it is gone. */
struct proc_sample {
  uint64_t rss_kib, cpu_ns;
  int fds;
};

static bool sample_proc(pid_t pid, struct proc_sample *s) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return false;
  for (s->rss_kib = 0; fgets(buf, sizeof(buf), f) != NULL;)
    if (strncmp(buf, "VmRSS:", 6) == 0) s->rss_kib = strtoull(buf + 6, NULL, 10);
  fclose(f);
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (dir == NULL) return false;
  s->fds = 0;
  for (struct dirent *de; (de = readdir(dir)) != NULL;) s->fds += de->d_name[0] != '.';
  closedir(dir);
  s->cpu_ns = hb_cpu_ns(pid); /* an unreaped target still has its clock */
  return true;
}

enum { L_BYTES, L_OPS, L_CALLS, L_FAILED_OPS, L_FAILED_CALLS, L_WRONG, L_N };
static atomic_uint_least64_t g_legit[L_N]; /* the clients' counts, summed */

struct client {
  unsigned id, errors_told;
  HixlEngine *eng;
  uint8_t *mem; /* rd | wr | back | large | large_back | key_base (the pattern WRITE data comes from) */
  pthread_t th;
};

/* One sync call, counted; false when it failed (said once per client up to 5 times). */
static bool legit_call(struct client *c, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  HixlStatus st = HixlEngineTransferSync(c->eng, g_taddr, op, d, n, o.op_timeout_ms);
  size_t bytes = 0;
  atomic_fetch_add(&g_legit[L_CALLS], 1);
  atomic_fetch_add(&g_legit[L_OPS], n);
  if (st == HIXL_SUCCESS) {
    for (size_t i = 0; i < n; i++) bytes += d[i].len;
    atomic_fetch_add(&g_legit[L_BYTES], bytes);
    return true;
  }
  atomic_fetch_add(&g_legit[L_FAILED_CALLS], 1);
  atomic_fetch_add(&g_legit[L_FAILED_OPS], n);
  if (c->errors_told++ < 5) {
    char what[64];
    snprintf(what, sizeof(what), "client %u: a %s batch", c->id, op == HIXL_READ ? "READ" : "WRITE");
    hb_fail(what, st);
  }
  HixlEngineConnect(c->eng, g_taddr, o.op_timeout_ms); /* the link may be gone: try again */
  return false;
}

static void check(struct client *c, const uint8_t *got, const uint8_t *want, size_t len, const char *what) {
  uint64_t w = count_wrong(got, want, len);
  if (w == 0) return;
  atomic_fetch_add(&g_legit[L_WRONG], w);
  if (c->errors_told++ < 5) hb_say("client %u: %s: %" PRIu64 " of %zu bytes wrong\n", c->id, what, w, len);
}

/* len bytes of fresh data (key_base ^ key, 8 bytes at a time: cheap to make) WRITten from src to at in
 * n ops, then read back in one op into the len bytes after src (its back), checked. */
static void write_back(struct client *c, HixlTransferOpDesc *d, uint32_t n, uint8_t *src, uintptr_t at,
                       size_t len, uint64_t key, const char *what) {
  const uint8_t *key_base = c->mem + SOAK_CLIENT_MEM - SOAK_LARGE;
  uint8_t *back = src + len;
  for (uint64_t i = 0, v; i + 8 <= len; i += 8) {
    memcpy(&v, key_base + i, 8);
    v ^= key;
    memcpy(src + i, &v, 8);
  }
  for (uint32_t i = 0; i < n; i++)
    d[i] = (HixlTransferOpDesc){(uintptr_t)src + i * (len / n), at + i * (len / n), len / n};
  if (!legit_call(c, HIXL_WRITE, d, n)) return;
  d[0] = (HixlTransferOpDesc){(uintptr_t)back, at, len};
  if (legit_call(c, HIXL_READ, d, 1)) check(c, back, src, len, what);
}

static void *client_main(void *arg) {
  struct client *c = arg;
  HixlTransferOpDesc d[SOAK_BATCH];
  uint8_t *rd = c->mem, *wr = rd + SOAK_BATCH_LEN, *large = wr + 2 * SOAK_BATCH_LEN;
  uintptr_t warea = g_rbase + SOAK_READ_AREA + (uintptr_t)c->id * SOAK_WRITE_AREA;
  const uint32_t slots = SOAK_READ_AREA / SOAK_SMALL;

  for (uint64_t k = 0; !atomic_load(&g_clients_stop); k++) {
    /* 200 x 4 KiB READs of scattered blocks of the read area, checked. */
    for (uint32_t i = 0; i < SOAK_BATCH; i++) {
      uint32_t slot = (uint32_t)((k * SOAK_BATCH + i) * 7919u + c->id * 104729u) % slots;
      d[i] = (HixlTransferOpDesc){(uintptr_t)rd + i * SOAK_SMALL, g_rbase + (uintptr_t)slot * SOAK_SMALL,
                                  SOAK_SMALL};
    }
    if (legit_call(c, HIXL_READ, d, SOAK_BATCH))
      for (uint32_t i = 0; i < SOAK_BATCH; i++)
        check(c, rd + i * SOAK_SMALL, g_ref + (d[i].remote_addr - g_rbase), SOAK_SMALL, "READ");

    /* 200 x 4 KiB WRITEs of fresh data, read back; every fourth round a 4 MiB one too. */
    uint64_t key = bench_pattern_word(c->id + 1, k);
    write_back(c, d, SOAK_BATCH, wr, warea + (k % 4) * (1u << 20), SOAK_BATCH_LEN, key, "WRITE read back");
    if (k % 4 == 3)
      write_back(c, d, 1, large, warea + SOAK_WRITE_AREA / 2, SOAK_LARGE, ~key, "large WRITE read back");
  }
  return NULL;
}

static bool client_start(struct client *c, unsigned id) {
  HixlMemHandle h;
  c->id = id;
  if ((c->mem = hb_map(SOAK_CLIENT_MEM)) == NULL) return false;
  bench_pattern_fill(c->mem + SOAK_CLIENT_MEM - SOAK_LARGE, SOAK_LARGE, 1000 + c->id); /* key_base */
  if (!(c->eng = hb_engine("127.0.0.1", o.transport, NULL, 0)) ||
      hb_reg(c->eng, c->mem, SOAK_CLIENT_MEM, &h) != HIXL_SUCCESS ||
      !hb_ok(HixlEngineConnect(c->eng, g_taddr, 10000), "a client's HixlEngineConnect"))
    return false;
  return pthread_create(&c->th, NULL, client_main, c) == 0;
}

/* The clients' counts now. */
static void legit_now(uint64_t s[L_N]) {
  for (int k = 0; k < L_N; k++) s[k] = atomic_load(&g_legit[k]);
}

struct join_counts {
  atomic_uint_least64_t tries, ok, late, wrong, max_ms; /* late: served after the phase */
};

struct joiner {
  atomic_int phase; /* the phase now */
  struct join_counts n[PH_N];
  struct pacer pace;
  pthread_t th;
  bool up; /* its thread runs */
};

/* A fresh engine connects, READs 64 KiB of the read area (checked), and goes. */
static void join_once(void *arg) {
  struct joiner *j = arg;
  int ph = atomic_load(&j->phase);
  struct join_counts *n = &j->n[ph];
  uint8_t *buf = hb_map(SOAK_JOIN_LEN);
  HixlTransferOpDesc op = {(uintptr_t)buf, g_rbase + SOAK_LARGE, SOAK_JOIN_LEN};
  HixlMemHandle h;
  HixlStatus st = HIXL_FAILED;
  uint64_t t0 = bench_now_ns();
  atomic_fetch_add(&n->tries, 1);
  HixlEngine *e = buf != NULL ? hb_engine("127.0.0.1", o.transport, NULL, 0) : NULL;
  if (e != NULL && (st = hb_reg(e, buf, SOAK_JOIN_LEN, &h)) == HIXL_SUCCESS &&
      (st = HixlEngineConnect(e, g_taddr, o.join_timeout_ms)) == HIXL_SUCCESS)
    st = HixlEngineTransferSync(e, g_taddr, HIXL_READ, &op, 1, o.join_timeout_ms);
  if (e != NULL && st != HIXL_SUCCESS) hb_fail("late joiner: Connect / READ", st);
  uint64_t ms = (bench_now_ns() - t0) / 1000000u;
  if (st == HIXL_SUCCESS) {
    atomic_fetch_add(atomic_load(&j->phase) == ph ? &n->ok : &n->late, 1);
    atomic_fetch_add(&n->wrong, count_wrong(buf, g_ref + SOAK_LARGE, SOAK_JOIN_LEN));
    if (ms > atomic_load(&n->max_ms)) atomic_store(&n->max_ms, ms); /* this thread alone writes it */
  }
  if (e != NULL) HixlEngineDestroy(e);
  if (buf != NULL) munmap(buf, SOAK_JOIN_LEN);
}

/* the hostile peers' counts, loaded in this order: closed before connected keeps connected - closed >= 0 */
enum { H_FLOOD_BYTES, H_FLOOD_LOST, H_HERD_CLOSED, H_HERD_CONNECTED, H_CHURN, H_CHURN_ERRORS, H_N };

enum herd_kind { HERD_IDLE, HERD_HALF_PRE, HERD_HALF_POST }; /* slot i: below --idle idle, then PRE, POST */
struct herd_slot {
  int fd;
  bool connected;
};

/* The hostile phase's peers; they stop when stopfd is written. */
static struct hostile {
  int stopfd;
  atomic_uint_least64_t n[H_N];
  struct flood {
    struct pacer pace; /* fd: its link, made before the other hostile peers begin */
    size_t have, off;  /* chunk: READ_REQs, sent up to off */
    uint64_t seq;
    uint8_t chunk[256 * WIRE_SMALL_FRAME];
  } fl[SOAK_MAX];
  pthread_t th[SOAK_MAX + 2]; /* the floods', the herd's, the churn's */
  unsigned n_th;
  /* the herd: idle and half-sent connections, all in one epoll set (its pacer's fd) */
  struct herd_slot *s;
  size_t n_herd, next; /* next: where the ticks' walk for closed slots goes on */
  struct pacer herd, churn;
  uint64_t churn_k; /* connections churned so far */
} g_h;

/* A raw link from 127.0.0.<host> that said HELLO and got its HELLO_ACK (status OK),
 * non-blocking from then on; -1 if not. */
static int flood_link(unsigned host) {
  uint8_t hello[512], hb[WIRE_HDR_LEN], *body = NULL; /* body: the memory table */
  struct timeval tv = {.tv_sec = 10};
  struct wire_hdr h;
  struct wire_msg m;
  int fl, fd = connect_from(host, false, 64 << 10);
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* bounds the handshake */
  size_t n = wire_put_hello(hello, sizeof(hello), WIRE_CAP_TCP_DATA, "soak-flood");
  bool ok = send(fd, hello, n, MSG_NOSIGNAL) == (ssize_t)n && bench_read_full(fd, hb, sizeof(hb)) == 0 &&
            wire_parse_hdr(hb, &h) == WIRE_OK && h.type == WIRE_HELLO_ACK &&
            (body = malloc(h.body_len + 1u)) != NULL && bench_read_full(fd, body, h.body_len) == 0 &&
            wire_decode(&h, body, &m) == WIRE_OK && m.u.hello_ack.status == WIRE_HELLO_OK;
  free(body);
  if (ok && (fl = fcntl(fd, F_GETFL)) >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0) return fd;
  close(fd);
  return -1;
}

/* A flood whose link the target closed links again, on a tick (at most ten a second). */
static void flood_relink(void *arg) {
  struct flood *f = arg;
  if (f->pace.fd >= 0) return;
  f->have = f->off = 0;
  f->pace.fd = flood_link(20 + (unsigned)(f - g_h.fl));
}

/* A flood pipelines READ_REQs on its link as fast as the target takes them, never reading
 * an answer. */
static void flood_send(void *arg, short revents) {
  struct flood *f = arg;
  const size_t len = o.flood_len;
  const uint64_t slots = SOAK_READ_AREA / len;
  if (f->off == f->have) {
    f->have = f->off = 0;
    for (unsigned i = 0; i < 256; i++, f->seq++)
      f->have +=
          wire_put_read_req(f->chunk + f->have, f->seq, g_rbase + (f->seq % slots) * len, (uint32_t)len);
  }
  ssize_t k = send(f->pace.fd, f->chunk + f->off, f->have - f->off, MSG_NOSIGNAL);
  if (k > 0) {
    f->off += (size_t)k;
    atomic_fetch_add(&g_h.n[H_FLOOD_BYTES], (uint64_t)k); /* / frame length when reported */
  } else if ((revents & (POLLERR | POLLHUP)) || (k < 0 && errno != EAGAIN && errno != EINTR)) {
    atomic_fetch_add(&g_h.n[H_FLOOD_LOST], 1);
    close(f->pace.fd);
    f->pace.fd = -1;
  }
}

/* Slot i connects (edge-triggered: an event says it is up, sent something or ended). */
static void herd_open(uint32_t i) {
  struct herd_slot *s = &g_h.s[i];
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u32 = i};
  s->fd = connect_from(i < o.idle ? 2 + i % o.idle_addrs : 11, true, 0);
  if (s->fd >= 0 && epoll_ctl(g_h.herd.fd, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
    close(s->fd);
    s->fd = -1; /* opened again on a tick */
  }
}

/* Slot i's event. Once connected, idle sends nothing; half-sent 10 bytes of a HELLO header,
 * or a HELLO and a READ_REQ's header without its body. What comes (a HELLO_ACK) is dropped;
 * a connection that ended (closed by the target when it was up) is opened again on a tick. */
static void herd_event(uint32_t i, uint32_t events) {
  struct herd_slot *s = &g_h.s[i];
  enum herd_kind kind = i < o.idle ? HERD_IDLE : (i - o.idle) % 2 ? HERD_HALF_POST : HERD_HALF_PRE;
  uint8_t buf[4096];
  size_t n = 0;
  ssize_t k;
  if (!s->connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == EPOLLOUT) {
    s->connected = true;
    atomic_fetch_add(&g_h.n[H_HERD_CONNECTED], 1);
    if (kind != HERD_IDLE) n = wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "soak-half");
    if (kind == HERD_HALF_PRE) n = 10;
    if (kind == HERD_HALF_POST) {
      wire_put_read_req(buf + n, 1, g_rbase, SOAK_SMALL); /* only its header is sent */
      n += WIRE_HDR_LEN;
    }
    if (n > 0) (void)!send(s->fd, buf, n, MSG_NOSIGNAL); /* a few bytes into an empty socket */
  }
  while ((k = recv(s->fd, buf, sizeof(buf), 0)) > 0) continue;
  if (!(events & (EPOLLERR | EPOLLHUP)) && k < 0 && (errno == EAGAIN || errno == EINTR)) return;
  close(s->fd); /* which takes it out of the epoll set */
  s->fd = -1;
  if (s->connected) atomic_fetch_add(&g_h.n[H_HERD_CLOSED], 1); /* up now: connected - closed */
  s->connected = false;
}

/* What the herd's epoll set has now. */
static void herd_ready(void *arg, short revents) {
  struct epoll_event evs[256];
  int k = epoll_wait(g_h.herd.fd, evs, 256, 0);
  (void)arg, (void)revents;
  for (int j = 0; j < k; j++)
    if (g_h.s[evs[j].data.u32].fd >= 0) herd_event(evs[j].data.u32, evs[j].events);
}

/* A tick (every 10 ms): the slots that ended opened again, at most reconnect_rate a second. */
static void herd_tick(void *arg) {
  size_t budget = o.reconnect_rate / 100 > 0 ? o.reconnect_rate / 100 : 1;
  (void)arg;
  for (size_t seen = 0, opened = 0; seen < g_h.n_herd && opened < budget; seen++) {
    uint32_t q = (uint32_t)(g_h.next++ % g_h.n_herd);
    if (g_h.s[q].fd >= 0) continue;
    herd_open(q);
    opened++;
  }
}

/* One connection opened and closed at once, from 127.0.0.12-15: in turn closed
 * plainly, closed after a HELLO, and reset. */
static void churn_once(void *arg) {
  uint64_t k = g_h.churn_k++;
  uint8_t hello[512];
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  int fd = connect_from(12 + (unsigned)(k % 4), true, 0);
  (void)arg;
  atomic_fetch_add(&g_h.n[fd < 0 ? H_CHURN_ERRORS : H_CHURN], 1);
  if (fd < 0) return;
  if (k % 3 == 1)
    (void)!send(fd, hello, wire_put_hello(hello, sizeof(hello), WIRE_CAP_TCP_DATA, "soak-churn"),
                MSG_NOSIGNAL);
  if (k % 3 == 2) setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(fd);
}

/* One more hostile peer, p's thread; false when it did not start. */
static bool hostile_thread(struct pacer *p) {
  if (pthread_create(&g_h.th[g_h.n_th], NULL, pacer_main, p) != 0) return false;
  g_h.n_th++;
  return true;
}

/* The flood links first (the target has descriptors then), then the rest; false when
 * one did not start (hostile_stop undoes what did). */
static bool hostile_start(void) {
  memset(&g_h, 0, sizeof(g_h));
  for (unsigned i = 0; i < SOAK_MAX; i++) g_h.fl[i].pace.fd = -1;
  g_h.stopfd = eventfd(0, EFD_CLOEXEC);
  g_h.herd =
      (struct pacer){10000000u, 1, g_h.stopfd, herd_tick, NULL, "idle connects", -1, POLLIN, herd_ready};
  g_h.herd.fd = epoll_create1(EPOLL_CLOEXEC);
  g_h.n_herd = (size_t)o.idle + o.half;
  g_h.s = calloc(g_h.n_herd, sizeof(*g_h.s));
  if (g_h.stopfd < 0 || g_h.herd.fd < 0 || g_h.s == NULL) return false;
  for (unsigned i = 0; i < o.floods; i++) {
    struct flood *f = &g_h.fl[i];
    f->pace = (struct pacer){100000000u,         1,       g_h.stopfd, flood_relink, f, "flood",
                             flood_link(20 + i), POLLOUT, flood_send};
    f->seq = 1;
    if (f->pace.fd < 0) hb_say("flood %u: no link to the target\n", i);
    if (f->pace.fd < 0 || !hostile_thread(&f->pace)) return false;
  }
  for (size_t i = 0; i < g_h.n_herd; i++) herd_open((uint32_t)i);
  if (g_h.n_herd > 0 && !hostile_thread(&g_h.herd)) return false;
  if (o.churn_rate == 0) return true;
  g_h.churn =
      (struct pacer){1000000000ull / o.churn_rate, 16, g_h.stopfd, churn_once, NULL, "churn", -1, 0, NULL};
  return hostile_thread(&g_h.churn);
}

static void hostile_stop(void) {
  if (g_h.stopfd >= 0) eventfd_write(g_h.stopfd, 1);
  for (unsigned i = 0; i < g_h.n_th; i++) pthread_join(g_h.th[i], NULL);
  for (unsigned i = 0; i < o.floods; i++)
    if (g_h.fl[i].pace.fd >= 0) close(g_h.fl[i].pace.fd);
  for (size_t i = 0; g_h.s != NULL && i < g_h.n_herd; i++)
    if (g_h.s[i].fd >= 0) close(g_h.s[i].fd);
  if (g_h.herd.fd >= 0) close(g_h.herd.fd);
  free(g_h.s);
  if (g_h.stopfd >= 0) close(g_h.stopfd);
}

struct phase_res {
  bool ran;
  double secs, cpu_pct;
  uint64_t legit[L_N], hostile[H_N], rss_max_kib;
  int fds_max;
};

/* A second's sample: t, phase, rss_kib, fds, cpu_pct, legit_mbs, flood_reqs, herd_open. */
#define SAMPLE_NF 8

struct run {
  struct hb_peer tgt; /* the target process */
  struct client cl[SOAK_MAX];
  struct joiner jn;
  struct phase_res ph[PH_N];
  struct hb_field (*smp)[SAMPLE_NF];
  size_t n_smp, cap_smp;
  struct proc_sample idle;
  bool target_died;
  uint64_t t0_ns;
  unsigned frame_len; /* one flood READ_REQ */
};

/* One phase: secs seconds, a sample every second, each said on stderr. */
static bool run_phase(struct run *r, int ph, double secs) {
  struct phase_res *res = &r->ph[ph];
  struct hostile *hr = ph == PH_HOSTILE ? &g_h : NULL;
  struct join_counts *jc = &r->jn.n[ph];
  struct proc_sample prev, now;
  uint64_t l0[L_N], l[L_N], v;
  int tfd = -1, wst;
  if ((hr && !hostile_start()) || (tfd = ticker(1000000000ull, "phase")) < 0) {
    if (hr) hostile_stop();
    return false;
  }
  atomic_store(&r->jn.phase, ph);
  if (!sample_proc(r->tgt.pid, &prev)) prev = r->idle;
  legit_now(l0);
  uint64_t start = bench_now_ns(), tprev = start, cpu0 = prev.cpu_ns, bprev = l0[L_BYTES];
  res->ran = true;
  for (unsigned tick = 1; tick <= (unsigned)(secs + 0.5); tick++) {
    if (read(tfd, &v, sizeof(v)) != (ssize_t)sizeof(v)) break; /* blocks for the second */
    if (waitpid(r->tgt.pid, &wst, WNOHANG) == r->tgt.pid) {
      hb_say("FINDING: the target process ended during the %s phase (%s %d)\n", ph_name[ph],
             WIFSIGNALED(wst) ? "signal" : "status", WIFSIGNALED(wst) ? WTERMSIG(wst) : WEXITSTATUS(wst));
      r->target_died = true;
      break;
    }
    uint64_t tn = bench_now_ns();
    if (!sample_proc(r->tgt.pid, &now)) continue;
    legit_now(l);
    double t = (double)(tn - r->t0_ns) / 1e9, dt = (double)(tn - tprev) / 1e9;
    double cpu = 100.0 * (double)(now.cpu_ns - prev.cpu_ns) / 1e9 / dt;
    double mbs = (double)(l[L_BYTES] - bprev) / 1e6 / dt;
    for (int k = 0; hr && k < H_N; k++) res->hostile[k] = atomic_load(&hr->n[k]); /* so far */
    uint64_t flood = res->hostile[H_FLOOD_BYTES] / r->frame_len;
    uint64_t herd_open = res->hostile[H_HERD_CONNECTED] - res->hostile[H_HERD_CLOSED]; /* up now, >= 0 */
    const struct hb_field s[SAMPLE_NF] = {
        HB_FD("t", NULL, "%.1f", NULL, t),         HB_FS("phase", NULL, ph_name[ph]),
        HB_FU("rss_kib", NULL, now.rss_kib),       HB_FU("fds", NULL, now.fds),
        HB_FD("cpu_pct", NULL, "%.1f", NULL, cpu), HB_FD("legit_mbs", NULL, "%.1f", NULL, mbs),
        HB_FU("flood_reqs", NULL, flood),          HB_FU("herd_open", NULL, herd_open)};
    if (r->n_smp < r->cap_smp) memcpy(r->smp[r->n_smp++], s, sizeof(s));
    if (now.rss_kib > res->rss_max_kib) res->rss_max_kib = now.rss_kib;
    if (now.fds > res->fds_max) res->fds_max = now.fds;
    fprintf(stderr,
            "%s: [%5.0fs %-14s] legit %7.1f MB/s, %" PRIu64 " ops, %" PRIu64 " failed, %" PRIu64
            " bytes wrong | target RSS %6.1f MiB, %4d fds, CPU %3.0f%%",
            hb_prog, t, ph_name[ph], mbs, l[L_OPS] - l0[L_OPS], l[L_FAILED_OPS] - l0[L_FAILED_OPS],
            l[L_WRONG] - l0[L_WRONG], (double)now.rss_kib / 1024.0, now.fds, cpu);
    if (hr)
      fprintf(stderr,
              " | flood %" PRIu64 " READ_REQs sent, idle/half-sent %" PRIu64 " open, %" PRIu64
              " closed by the target, churn %" PRIu64,
              flood, herd_open, res->hostile[H_HERD_CLOSED], res->hostile[H_CHURN]);
    if (r->jn.up)
      fprintf(stderr, " | joiners %" PRIu64 "/%" PRIu64 " ok", (uint64_t)atomic_load(&jc->ok),
              (uint64_t)atomic_load(&jc->tries));
    fputc('\n', stderr);
    prev = now;
    bprev = l[L_BYTES];
    tprev = tn;
  }
  close(tfd);
  res->secs = (double)(bench_now_ns() - start) / 1e9;
  for (int k = 0; k < L_N; k++) res->legit[k] = atomic_load(&g_legit[k]) - l0[k];
  if (tprev > start) res->cpu_pct = 100.0 * (double)(prev.cpu_ns - cpu0) / (double)(tprev - start);
  for (int k = 0; hr && k < H_N; k++) res->hostile[k] = atomic_load(&hr->n[k]);
  if (hr) hostile_stop();
  return !r->target_died;
}

static const char *pm(bool pass) { return pass ? "PASS" : "MISS"; }

static double gbs(const struct phase_res *x) {
  return x->secs > 0 ? (double)x->legit[L_BYTES] / x->secs / 1e9 : 0.0;
}

/* The table, the hostile peers' tally and the goals on stdout, with --json the figures and
 * the samples: 0 when every goal passed, 3 when one was missed, 1 when the JSON was not written. */
static int report(struct run *r) {
  enum { PHASE_NF = 23 };
  const struct phase_res *h = &r->ph[PH_HOSTILE];
  struct hb_field rows[PH_N][PHASE_NF]; /* each phase's figures: the table's columns and the JSON's keys */
  char joiners[PH_N][96];
  size_t n_ran = 0;
  double bb = 0, bs = 0;
  uint64_t failed = 0, wrong = 0, rss_max = 0;
  int fds_max = 0;
  for (int p = 0; p < PH_N; p++) {
    const struct phase_res *x = &r->ph[p];
    struct join_counts *j = &r->jn.n[p];
    if (!x->ran) continue;
    uint64_t tries = atomic_load(&j->tries), ok = atomic_load(&j->ok), late = atomic_load(&j->late);
    uint64_t max_ms = atomic_load(&j->max_ms), x_wrong = x->legit[L_WRONG] + atomic_load(&j->wrong);
    snprintf(joiners[p], sizeof(joiners[p]), "%" PRIu64 " / %" PRIu64 " (%" PRIu64 ")%s", ok, tries, max_ms,
             late ? ", more served after the phase" : "");
    const struct hb_field rec[PHASE_NF] = {
        HB_FS("phase", "phase", ph_name[p]),
        HB_FD("seconds", "seconds", "%.3f", "%.0f", x->secs),
        HB_FU("legit_bytes", NULL, x->legit[L_BYTES]),
        HB_FD("legit_gbs", "legit GB/s", "%.4f", "%.3f", gbs(x)),
        HB_FU("legit_ops", "legit ops", x->legit[L_OPS]),
        HB_FU("legit_calls", NULL, x->legit[L_CALLS]),
        HB_FU("failed_ops", "failed ops", x->legit[L_FAILED_OPS]),
        HB_FU("failed_calls", NULL, x->legit[L_FAILED_CALLS]),
        HB_FU("bytes_wrong", "bytes wrong", x_wrong),
        HB_FD(NULL, "target max RSS MiB", "%.1f", NULL, (double)x->rss_max_kib / 1024.0),
        HB_FU("rss_max_kib", NULL, x->rss_max_kib),
        HB_FU("fds_max", "target max fds", x->fds_max),
        HB_FD("cpu_pct", "target CPU %", "%.1f", "%.0f", x->cpu_pct),
        HB_FU("flood_reqs", NULL, x->hostile[H_FLOOD_BYTES] / r->frame_len),
        HB_FU("flood_links_lost", NULL, x->hostile[H_FLOOD_LOST]),
        HB_FU("herd_connected", NULL, x->hostile[H_HERD_CONNECTED]),
        HB_FU("herd_closed_by_target", NULL, x->hostile[H_HERD_CLOSED]),
        HB_FU("churn", NULL, x->hostile[H_CHURN]),
        HB_FU("joins", NULL, tries),
        HB_FU("joins_ok", NULL, ok),
        HB_FU("joins_late", NULL, late),
        HB_FU("join_max_ms", NULL, max_ms),
        HB_FS(NULL, "late joiners served / tried (max ms)", joiners[p])};
    memcpy(rows[n_ran], rec, sizeof(rec)); /* kept for the JSON */
    hb_emit(stdout, NULL, NULL, n_ran++, PH_N, rec, PHASE_NF);
    if (p != PH_HOSTILE) bb += (double)x->legit[L_BYTES], bs += x->secs;
    failed += x->legit[L_FAILED_OPS];
    wrong += x_wrong;
    if (x->rss_max_kib > rss_max) rss_max = x->rss_max_kib;
    if (x->fds_max > fds_max) fds_max = x->fds_max;
  }
  printf("\nHostile peers (%.0f s): %u READ floods sent %" PRIu64 " READ_REQs of %zu bytes and read no answer"
         " (links lost: %" PRIu64 "); %u idle connects (from %u addresses) and %u half-sent ones were"
         " connected %" PRIu64 " times and closed by the target %" PRIu64 " times; churn: %" PRIu64
         " connections opened and closed (%u a second, %" PRIu64 " errors).\n",
         h->secs, o.floods, h->hostile[H_FLOOD_BYTES] / r->frame_len, o.flood_len, h->hostile[H_FLOOD_LOST],
         o.idle, o.idle_addrs, o.half, h->hostile[H_HERD_CONNECTED], h->hostile[H_HERD_CLOSED],
         h->hostile[H_CHURN], o.churn_rate, h->hostile[H_CHURN_ERRORS]);
  printf("Target idle RSS (memory registered, no peer yet): %.1f MiB; %d descriptors.\n\n",
         (double)r->idle.rss_kib / 1024.0, r->idle.fds);

  struct join_counts *hj = &r->jn.n[PH_HOSTILE];
  uint64_t joins = atomic_load(&hj->tries), joins_ok = atomic_load(&hj->ok);
  double base_gbs = bs > 0 ? bb / bs / 1e9 : 0, ratio = base_gbs > 0 ? gbs(h) / base_gbs : 0;
  uint64_t rss_bound = r->idle.rss_kib + (uint64_t)o.floods * o.answer_mib * 1024u;
  uint64_t rss_limit = rss_bound + SOAK_RSS_SLACK / 1024u;
  enum { G_RATIO, G_FAILED, G_WRONG, G_RSS, G_FDS, G_JOIN, G_N };
  const bool pass[G_N] = {h->ran && ratio >= 0.8 && !r->target_died,
                          failed == 0 && !r->target_died,
                          wrong == 0,
                          rss_max <= rss_limit,
                          fds_max <= (int)o.target_nofile,
                          joins == joins_ok};
  printf("- legitimate throughput with hostile peers / without: %.3f / %.3f GB/s = %.2fx (goal >= 0.8): %s\n",
         gbs(h), base_gbs, ratio, pm(pass[G_RATIO]));
  printf("- failed legitimate ops: %" PRIu64 " (goal 0): %s\n", failed, pm(pass[G_FAILED]));
  printf("- bytes wrong: %" PRIu64 " (goal 0): %s\n", wrong, pm(pass[G_WRONG]));
  printf("- target max RSS: %.1f MiB; bound: idle %.1f MiB + %u flood links x LinkAnswerMiB %zu = %.1f MiB;"
         " goal <= bound + 16 = %.1f MiB: %s\n",
         (double)rss_max / 1024.0, (double)r->idle.rss_kib / 1024.0, o.floods, o.answer_mib,
         (double)rss_bound / 1024.0, (double)rss_limit / 1024.0, pm(pass[G_RSS]));
  printf("- target max descriptors: %d (cap: its RLIMIT_NOFILE, %u): %s\n", fds_max, o.target_nofile,
         pm(pass[G_FDS]));
  printf("- late joiners during the hostile phase (a new engine connects and READs, %d ms timeout): %" PRIu64
         " of %" PRIu64 " served while hostile peers were on (%" PRIu64 " more only after they left;"
         " no lockout): %s\n",
         o.join_timeout_ms, joins_ok, joins, (uint64_t)atomic_load(&hj->late), pm(pass[G_JOIN]));
  if (r->target_died) printf("- the target process ended during the run: see the FINDING line on stderr\n");
  fflush(stdout);
  int rc = memchr(pass, false, sizeof(pass)) ? 3 : 0; /* a goal missed */
  if (o.json == NULL) return rc;

  FILE *f = hb_json_open(o.json, "hixl-soak");
  fprintf(
      f,
      "  \"transport\": \"%s\", \"hostile_seconds\": %.0f, \"baseline_seconds\": %.0f,\n  \"clients\": %u,"
      " \"floods\": %u, \"flood_len\": %zu, \"idle_connects\": %u, \"idle_addrs\": %u, \"half_sent\": %u,"
      " \"churn_rate\": %u, \"target_nofile\": %u,\n  \"options\": {",
      o.transport, o.seconds, o.base_seconds, o.clients, o.floods, o.flood_len, o.idle, o.idle_addrs, o.half,
      o.churn_rate, o.target_nofile);
  for (size_t i = 0; i < g_topts.n; i++)
    fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", g_topts.v[i].key, g_topts.v[i].value);
  fprintf(f, "},\n  \"target_idle_rss_kib\": %" PRIu64 ", \"target_idle_fds\": %d,\n  \"phases\": [\n",
          r->idle.rss_kib, r->idle.fds);
  for (size_t i = 0; i < n_ran; i++) hb_json_item(f, i, n_ran, rows[i], PHASE_NF);
  fprintf(f, "  ],\n  \"samples\": [\n");
  for (size_t i = 0; i < r->n_smp; i++) hb_json_item(f, i, r->n_smp, r->smp[i], SAMPLE_NF);
  fprintf(f,
          "  ],\n  \"goals\": {\"throughput_ratio\": %.4f, \"throughput\": \"%s\", \"failed_ops\": %" PRIu64
          ", \"failed\": \"%s\", \"bytes_wrong\": %" PRIu64 ", \"wrong\": \"%s\", \"rss_max_kib\": %" PRIu64
          ", \"rss_bound_kib\": %" PRIu64 ", \"rss_limit_kib\": %" PRIu64
          ", \"rss\": \"%s\", \"fds_max\": %d,"
          " \"fds_cap\": %u, \"fds\": \"%s\", \"hostile_joins\": %" PRIu64 ", \"hostile_joins_ok\": %" PRIu64
          ", \"join\": \"%s\", \"target_died\": %s}\n}\n",
          ratio, pm(pass[G_RATIO]), failed, pm(pass[G_FAILED]), wrong, pm(pass[G_WRONG]), rss_max, rss_bound,
          rss_limit, pm(pass[G_RSS]), fds_max, o.target_nofile, pm(pass[G_FDS]), joins, joins_ok,
          pm(pass[G_JOIN]), r->target_died ? "true" : "false");
  return fclose(f) == 0 ? rc : 1;
}

static const char *const transports[] = {"tcp", "auto", "shm", "rdma", NULL};
static int transport_idx;
static const struct hb_opt opts[] = {
    {"--seconds", HB_DBL, &o.seconds, "S", "the hostile phase (120)", 1, 86400, NULL},
    {"--baseline-seconds", HB_DBL, &o.base_seconds, "S", "each baseline (S / 4, >= 5)", 0, 86400, NULL},
    {"--transport", HB_CHOICE, &transport_idx, "NAME", "tcp (default) | auto | shm | rdma", 0, 0, transports},
    {"--opt", HB_FN, &g_topts, "KEY=VALUE",
     "a target engine option, repeatable (MaxLinks, ...);\n"
     "LinkAnswerMiB is " SOAK_DEFAULT_ANSWER_MIB " unless given (the RSS bound uses it)",
     0, 0, hb_extra_add},
    {"--clients", HB_UNS, &o.clients, "N", "legitimate client engines (2)", 1, SOAK_MAX, NULL},
    {"--floods", HB_UNS, &o.floods, "N", "READ flood links (2)", 0, SOAK_MAX, NULL},
    {"--flood-len", HB_SIZE, &o.flood_len, "BYTES", "flood READ_REQ length (4K)", 1, WIRE_MAX_PAYLOAD, NULL},
    {"--target-nofile", HB_UNS, &o.target_nofile, "N", "target's RLIMIT_NOFILE (1024)", 64, 1u << 20, NULL},
    {"--idle", HB_UNS, &o.idle, "N", "idle connects (2 x --target-nofile)", 0, 1u << 20, NULL},
    {"--idle-addrs", HB_UNS, &o.idle_addrs, "N", "their source addresses, 127.0.0.2.. (8)", 1, 8, NULL},
    {"--half", HB_UNS, &o.half, "N", "half-sent connections (64)", 0, 1u << 16, NULL},
    {"--churn-rate", HB_UNS, &o.churn_rate, "N", "connect/close a second (200; 0: none)", 0, 100000, NULL},
    {"--reconnect-rate", HB_UNS, &o.reconnect_rate, "N", "idle/half-sent reopens/s (500)", 1, 1000000, NULL},
    {"--join-every", HB_DBL, &o.join_every, "S", "a late joiner every S s (5; 0: none)", 0, 86400, NULL},
    {"--join-timeout-ms", HB_INT, &o.join_timeout_ms, "MS", "joiner timeouts (15000)", 1, INT32_MAX, NULL},
    {"--op-timeout-ms", HB_INT, &o.op_timeout_ms, "MS", "client call timeout (10000)", 1, INT32_MAX, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the figures and the samples", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

int main(int argc, char **argv) {
  static struct run r;
  uint64_t ready[2]; /* the target's registered memory: address, length */
  uint8_t rr[WIRE_SMALL_FRAME];
  unsigned started = 0;
  bool ran = false;
  int rc = 1, trc;
  hb_prog = "hixl-soak";
  hb_parse(argc, argv, opts,
           "One target engine (its own process, under a descriptor limit) serves legitimate clients\n"
           "during a baseline phase, a hostile phase and a second baseline; docs/performance-soak.md.\n"
           "Defaults in parentheses.\n"
           "Exit status: 0 all goals PASS, 3 a goal MISSed, 1 the run failed, 2 bad arguments.\n");
  o.transport = transports[transport_idx];
  if (o.base_seconds < 0) o.base_seconds = o.seconds / 4 < 5 ? 5 : o.seconds / 4;
  if (o.idle == UINT32_MAX) o.idle = 2 * o.target_nofile;
  const char *mib = hb_extra_get(&g_topts, "LinkAnswerMiB");
  if (mib == NULL && !hb_extra_add(&g_topts, "LinkAnswerMiB=" SOAK_DEFAULT_ANSWER_MIB)) return 2;
  o.answer_mib = (size_t)strtoull(mib ? mib : SOAK_DEFAULT_ANSWER_MIB, NULL, 10);
  uint16_t port = hb_ports("127.0.0.1", 1);
  snprintf(g_taddr, sizeof(g_taddr), "127.0.0.1:%u", (unsigned)port);
  g_tsa = (struct sockaddr_in){
      .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001u)};
  hb_spawn(&r.tgt, target_main, NULL); /* before any thread */
  hb_wait_ready(r.tgt.fd, ready, 2);
  g_rbase = (uintptr_t)ready[0];
  r.jn.pace =
      (struct pacer){(uint64_t)(o.join_every * 1e9), 1, -1, join_once, &r.jn, "late joiner", -1, 0, NULL};
  rlim_t nofile = set_nofile(RLIM_INFINITY), need = (rlim_t)o.idle + o.half + 1024; /* up to the hard limit */
  if (nofile != RLIM_INFINITY && nofile < need) {
    hb_say("this process may open %llu descriptors (hard limit); the hostile peers need %llu: lower --idle\n",
           (unsigned long long)nofile, (unsigned long long)need);
    goto out_target;
  }
  r.cap_smp = (size_t)(o.seconds + 2 * o.base_seconds) + 16;
  if ((r.smp = calloc(r.cap_smp, sizeof(*r.smp))) == NULL || !sample_proc(r.tgt.pid, &r.idle))
    goto out_target;
  bench_pattern_fill(g_ref, SOAK_READ_AREA, SOAK_SEED); /* the target filled its region alike */
  r.frame_len = (unsigned)wire_put_read_req(rr, 1, 0, 1);
  hb_say("target %s (pid %d, Transport %s, RLIMIT_NOFILE %u): %.1f MiB RSS, %d descriptors, %zu bytes"
         " registered\n",
         g_taddr, (int)r.tgt.pid, o.transport, o.target_nofile, (double)r.idle.rss_kib / 1024.0, r.idle.fds,
         (size_t)ready[1]);
  r.t0_ns = bench_now_ns();
  while (started < o.clients && client_start(&r.cl[started], started)) started++;
  if (started == o.clients && o.join_every > 0) {
    r.jn.pace.stopfd = eventfd(0, EFD_CLOEXEC);
    r.jn.up = r.jn.pace.stopfd >= 0 && pthread_create(&r.jn.th, NULL, pacer_main, &r.jn.pace) == 0;
  }
  ran = started == o.clients && (o.join_every <= 0 || r.jn.up);
  const double secs[PH_N] = {o.base_seconds, o.seconds, o.base_seconds};
  for (int p = 0; ran && p < PH_N; p++) {
    if (secs[p] < 1) continue;
    hb_say("phase %s: %.0f s%s\n", ph_name[p], secs[p], p == PH_HOSTILE ? ", hostile peers on" : "");
    ran = run_phase(&r, p, secs[p]);
  }
  atomic_store(&g_clients_stop, true);
  if (r.jn.pace.stopfd >= 0) eventfd_write(r.jn.pace.stopfd, 1);
  if (r.jn.up) pthread_join(r.jn.th, NULL);
  for (unsigned i = 0; i < o.clients; i++) {
    if (i < started) pthread_join(r.cl[i].th, NULL);
    if (r.cl[i].eng != NULL) HixlEngineDestroy(r.cl[i].eng);
    if (r.cl[i].mem != NULL) munmap(r.cl[i].mem, SOAK_CLIENT_MEM);
  }
  if (r.jn.pace.stopfd >= 0) close(r.jn.pace.stopfd);
  /* A target that died is reported too (the table up to then, its JSON saying so, the goals
   * it touched missed); the run fails as before. */
  if (ran || r.target_died) rc = report(&r);
  if (r.target_died) rc = 1;
out_target: /* closing the channel ends its hb_serve; hb_reap kills and says a hang past 30 s */
  if (r.target_died)
    close(r.tgt.fd);
  else if ((trc = hb_reap(&r.tgt, 30)) != 0) {
    hb_say("FINDING: the target process exited with status %d\n", trc);
    rc = 1;
  }
  free(r.smp);
  return rc;
}
