/* hixl-soak: one target engine, in its own process under a descriptor limit (1024 by
 * default), serves legitimate HixlEngine clients while hostile peers press on it
 * (issue 28, "What it must show"):
 *
 *   - a READ flood: raw links that say HELLO, then pipeline READ_REQs of registered
 *     memory and never read an answer;
 *   - idle connects: 2x the target's descriptor limit of connections that never say
 *     HELLO (from 127.0.0.2-9), opened again whenever the target closes them;
 *   - half-sent frames: connections that send part of a HELLO header, or a whole
 *     HELLO and then a READ_REQ header without its body, and then nothing;
 *   - connect/close churn: connections opened and closed at once (plainly, after a
 *     HELLO, or by a reset), at a fixed rate.
 *
 * The legitimate clients (threads of this process, each its own engine) run all the
 * time: READ batches of 200 x 4 KiB, WRITE batches of 200 x 4 KiB read back, and every
 * fourth round a 4 MiB WRITE read back, every byte checked; a late joiner connects a
 * fresh engine every few seconds and READs 64 KiB (checked), to see that a newcomer
 * is not locked out. Phases: baseline (no hostile peers), hostile, baseline again; the
 * legitimate throughput with hostile peers is held against the baselines' (goal
 * >= 0.8x). Every second the target's RSS (/proc/PID/status VmRSS), open descriptors
 * (/proc/PID/fd) and CPU time (/proc/PID/stat utime + stime) are sampled and printed.
 * At the end: a table per phase, the goals (PASS / MISS), and with --json FILE the
 * samples and the figures.
 *
 * Only sockets on 127.0.0.0/8. Nothing waits by sleeping: the pacing of the churn and
 * of reconnects is a timer (a rate, not a synchronisation), and the sampling is one a
 * second. */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "wire/wire.h"

#define SOAK_MAX_CLIENTS 16
#define SOAK_MAX_FLOODS  16
#define SOAK_LINE_MAX    512

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

enum { PH_BASE1, PH_HOSTILE, PH_BASE2, PH_N };
static const char *const ph_name[PH_N] = {"baseline", "hostile", "baseline-after"};

struct soak_opts {
  double seconds;      /* hostile phase */
  double base_seconds; /* each baseline phase */
  const char *transport;
  unsigned clients, floods, half, idle_addrs;
  unsigned idle; /* idle connects (default: 2x the target's descriptor limit) */
  unsigned target_nofile;
  unsigned churn_rate;     /* connects a second */
  unsigned reconnect_rate; /* idle / half-sent connections opened again, a second */
  unsigned flood_len;      /* bytes of one flood READ_REQ */
  double join_every;       /* seconds between late joiners; 0: none */
  int32_t join_timeout_ms;
  int32_t op_timeout_ms;
  size_t answer_mib; /* LinkAnswerMiB the target runs with */
  const char *json;
  struct hb_extra x; /* --opt: the target's */
};

static char g_taddr[64];  /* the target engine, "127.0.0.1:port" */
static uintptr_t g_rbase; /* its registered memory */
static size_t g_rlen;
static uint8_t *g_ref; /* the read area's expected content */
static atomic_bool g_clients_stop;

/* ------------------------------------------------------------------ helpers */

static bool set_flood_len(void *p, const char *v) {
  size_t sz = 0;
  bool ok = bench_parse_size(v, &sz) && sz >= 1 && sz <= WIRE_MAX_PAYLOAD;
  *(unsigned *)p = (unsigned)sz;
  return ok;
}

static void report_hixl(const char *who, const char *what, HixlStatus st) {
  char w[160];
  snprintf(w, sizeof(w), "%s: %s", who, what);
  hb_fail(w, st);
}

/* Bytes of a and b that differ. */
static uint64_t count_wrong(const uint8_t *a, const uint8_t *b, size_t len) {
  uint64_t n = 0;
  if (memcmp(a, b, len) == 0) return 0;
  for (size_t i = 0; i < len; i++) n += a[i] != b[i];
  return n;
}

/* A socket bound to 127.0.0.<host> (the port chosen at connect, so sources of
 * TIME_WAIT do not run out of ports); -1 on error. */
static int socket_from(unsigned host, bool nonblock) {
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | (host & 0xffu))};
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&me, sizeof(me)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static struct sockaddr_in target_sa(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  const char *colon = strrchr(g_taddr, ':');
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  return sa;
}

/* ------------------------------------------------------------------- target */

/* The target process: its descriptor limit, one engine, the registered memory (the
 * read area holds the pattern), "READY addr len" on ctrl, then serve until ctrl says
 * QUIT or closes. */
static int target_main(const struct soak_opts *o, int ctrl) {
  struct rlimit rl;
  HixlEngine *e = NULL;
  HixlMemHandle h;
  int rc = 1;

  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
  rl.rlim_cur = o->target_nofile;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur) rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    hb_say("target: setrlimit(RLIMIT_NOFILE, %u): %s\n", o->target_nofile, strerror(errno));
    return 1;
  }
  size_t len = SOAK_READ_AREA + (size_t)o->clients * SOAK_WRITE_AREA;
  uint8_t *mem = hb_map(len);
  if (mem == NULL) return 1;
  bench_pattern_fill(mem, len, SOAK_SEED);
  if (!(e = hb_engine(g_taddr, o->transport, o->x.v, o->x.n))) goto out_unmap;
  if (hb_reg(e, mem, len, &h) != HIXL_SUCCESS) goto out_destroy;
  hb_send(ctrl, "READY %" PRIxPTR " %zu\n", (uintptr_t)mem, len);
  hb_serve(ctrl, "QUIT", INT_MAX);
  rc = 0;
out_destroy:
  if (!hb_ok(HixlEngineDestroy(e), "target: HixlEngineDestroy")) rc = 1;
out_unmap:
  munmap(mem, len);
  return rc;
}

/* --------------------------------------------------------- target sampling */

struct proc_sample {
  uint64_t rss_kib;
  int fds;
  uint64_t cpu_ticks;
};

static bool sample_proc(pid_t pid, struct proc_sample *s) {
  char path[64], buf[4096];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return false;
  s->rss_kib = 0;
  while (fgets(buf, sizeof(buf), f) != NULL)
    if (strncmp(buf, "VmRSS:", 6) == 0) s->rss_kib = strtoull(buf + 6, NULL, 10);
  fclose(f);
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (dir == NULL) return false;
  s->fds = 0;
  for (struct dirent *de; (de = readdir(dir)) != NULL;)
    if (de->d_name[0] != '.') s->fds++;
  closedir(dir);
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  f = fopen(path, "r");
  if (f == NULL) return false;
  size_t got = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[got] = '\0';
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  unsigned long long ut = 0, stt = 0;
  /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15)
   */
  if (p == NULL || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stt) != 2)
    return false;
  s->cpu_ticks = ut + stt;
  return true;
}

/* ------------------------------------------------------- legitimate clients */

struct legit_counts {
  atomic_uint_least64_t bytes, ops, calls, failed_ops, failed_calls, wrong;
};

struct client {
  unsigned id;
  const struct soak_opts *o;
  HixlEngine *eng;
  uint8_t *mem; /* rd | wr | back | large | large_back */
  size_t mem_len;
  uint8_t *key_base; /* the pattern WRITE data is derived from (SOAK_LARGE bytes) */
  struct legit_counts n;
  pthread_t th;
  unsigned errors_told;
};

/* One sync call, counted; false when it failed (said once per client up to 5 times). */
static bool legit_call(struct client *c, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  HixlStatus st = HixlEngineTransferSync(c->eng, g_taddr, op, d, n, c->o->op_timeout_ms);
  atomic_fetch_add(&c->n.calls, 1);
  atomic_fetch_add(&c->n.ops, n);
  if (st == HIXL_SUCCESS) {
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += d[i].len;
    atomic_fetch_add(&c->n.bytes, bytes);
    return true;
  }
  atomic_fetch_add(&c->n.failed_calls, 1);
  atomic_fetch_add(&c->n.failed_ops, n);
  if (c->errors_told++ < 5) {
    char who[32];
    snprintf(who, sizeof(who), "client %u", c->id);
    report_hixl(who, op == HIXL_READ ? "a READ batch" : "a WRITE batch", st);
  }
  HixlEngineConnect(c->eng, g_taddr, c->o->op_timeout_ms); /* the link may be gone: try again */
  return false;
}

static void check(struct client *c, const uint8_t *got, const uint8_t *want, size_t len, const char *what) {
  uint64_t w = count_wrong(got, want, len);
  if (w == 0) return;
  atomic_fetch_add(&c->n.wrong, w);
  if (c->errors_told++ < 5) hb_say("client %u: %s: %" PRIu64 " of %zu bytes wrong\n", c->id, what, w, len);
}

/* data = key_base ^ key, 8 bytes at a time: fresh for each round, cheap to make. */
static void keyed(uint8_t *out, const uint8_t *base, size_t len, uint64_t key) {
  for (size_t i = 0; i + 8 <= len; i += 8) {
    uint64_t v;
    memcpy(&v, base + i, 8);
    v ^= key;
    memcpy(out + i, &v, 8);
  }
}

static void *client_main(void *arg) {
  struct client *c = arg;
  HixlTransferOpDesc d[SOAK_BATCH];
  uint8_t *rd = c->mem, *wr = rd + SOAK_BATCH_LEN, *back = wr + SOAK_BATCH_LEN;
  uint8_t *large = back + SOAK_BATCH_LEN, *large_back = large + SOAK_LARGE;
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

    /* 200 x 4 KiB WRITEs of fresh data, read back in one op, checked. */
    uint64_t key = bench_pattern_word(c->id + 1, k);
    uintptr_t at = warea + (uintptr_t)(k % 4) * (1u << 20);
    keyed(wr, c->key_base, SOAK_BATCH_LEN, key);
    for (uint32_t i = 0; i < SOAK_BATCH; i++)
      d[i] = (HixlTransferOpDesc){(uintptr_t)wr + i * SOAK_SMALL, at + i * SOAK_SMALL, SOAK_SMALL};
    if (legit_call(c, HIXL_WRITE, d, SOAK_BATCH)) {
      d[0] = (HixlTransferOpDesc){(uintptr_t)back, at, SOAK_BATCH_LEN};
      if (legit_call(c, HIXL_READ, d, 1)) check(c, back, wr, SOAK_BATCH_LEN, "WRITE read back");
    }

    /* Every fourth round a 4 MiB WRITE, read back, checked. */
    if (k % 4 == 3) {
      keyed(large, c->key_base, SOAK_LARGE, ~key);
      d[0] = (HixlTransferOpDesc){(uintptr_t)large, warea + (SOAK_WRITE_AREA / 2), SOAK_LARGE};
      if (legit_call(c, HIXL_WRITE, d, 1)) {
        d[0].local_addr = (uintptr_t)large_back;
        if (legit_call(c, HIXL_READ, d, 1)) check(c, large_back, large, SOAK_LARGE, "large WRITE read back");
      }
    }
  }
  return NULL;
}

static bool client_start(struct client *c) {
  HixlMemHandle h;
  c->mem_len = 3 * SOAK_BATCH_LEN + 2 * (size_t)SOAK_LARGE;
  c->mem = hb_map(c->mem_len);
  c->key_base = malloc(SOAK_LARGE);
  if (c->mem == NULL || c->key_base == NULL) return false;
  bench_pattern_fill(c->key_base, SOAK_LARGE, 1000 + c->id);
  if (!(c->eng = hb_engine("127.0.0.1", c->o->transport, NULL, 0)) ||
      hb_reg(c->eng, c->mem, c->mem_len, &h) != HIXL_SUCCESS ||
      !hb_ok(HixlEngineConnect(c->eng, g_taddr, 10000), "a client's HixlEngineConnect"))
    return false;
  return pthread_create(&c->th, NULL, client_main, c) == 0;
}

/* --------------------------------------------------------------- late joiner */

struct join_counts {
  atomic_uint_least64_t tries, ok, late, failed, wrong, max_ms, sum_ms; /* late: served after the phase */
};

struct joiner {
  const struct soak_opts *o;
  int stopfd;
  atomic_int *phase;
  struct join_counts n[PH_N];
  pthread_t th;
};

/* A fresh engine connects, READs 64 KiB of the read area (checked), and goes. */
static void join_once(struct joiner *j) {
  int ph = atomic_load(j->phase);
  struct join_counts *n = &j->n[ph];
  uint8_t *buf = hb_map(SOAK_JOIN_LEN);
  HixlMemHandle h;
  HixlStatus st = HIXL_FAILED;
  uint64_t t0 = bench_now_ns();
  atomic_fetch_add(&n->tries, 1);
  HixlEngine *e = buf != NULL ? hb_engine("127.0.0.1", j->o->transport, NULL, 0) : NULL;
  if (e != NULL) {
    st = hb_reg(e, buf, SOAK_JOIN_LEN, &h);
    if (st == HIXL_SUCCESS) st = HixlEngineConnect(e, g_taddr, j->o->join_timeout_ms);
    if (st == HIXL_SUCCESS) {
      HixlTransferOpDesc op = {(uintptr_t)buf, g_rbase + SOAK_LARGE, SOAK_JOIN_LEN};
      st = HixlEngineTransferSync(e, g_taddr, HIXL_READ, &op, 1, j->o->join_timeout_ms);
    }
    if (st != HIXL_SUCCESS) report_hixl("late joiner", "Connect / READ", st);
  }
  uint64_t ms = (bench_now_ns() - t0) / 1000000u;
  if (st == HIXL_SUCCESS) {
    atomic_fetch_add(atomic_load(j->phase) == ph ? &n->ok : &n->late, 1);
    atomic_fetch_add(&n->wrong, count_wrong(buf, g_ref + SOAK_LARGE, SOAK_JOIN_LEN));
    atomic_fetch_add(&n->sum_ms, ms);
    uint64_t m = atomic_load(&n->max_ms);
    while (ms > m && !atomic_compare_exchange_weak(&n->max_ms, &m, ms)) {
    }
  } else {
    atomic_fetch_add(&n->failed, 1);
  }
  if (e != NULL) HixlEngineDestroy(e);
  if (buf != NULL) munmap(buf, SOAK_JOIN_LEN);
}

static void *joiner_main(void *arg) {
  struct joiner *j = arg;
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  uint64_t ns = (uint64_t)(j->o->join_every * 1e9);
  struct itimerspec its = {.it_interval = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}};
  its.it_value = its.it_interval;
  if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) != 0) {
    hb_say("late joiner: timerfd: %s\n", strerror(errno));
    return NULL;
  }
  for (;;) {
    struct pollfd p[2] = {{.fd = tfd, .events = POLLIN}, {.fd = j->stopfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    uint64_t v;
    if (p[0].revents && read(tfd, &v, sizeof(v)) == (ssize_t)sizeof(v)) join_once(j);
  }
  close(tfd);
  return NULL;
}

/* ------------------------------------------------------------ hostile peers */

struct hostile_counts {
  atomic_uint_least64_t flood_reqs, flood_links, flood_lost;
  atomic_uint_least64_t herd_opened, herd_connected, herd_closed, herd_connect_failed, herd_open_errors;
  atomic_uint_least64_t churn, churn_errors;
};

struct hostile {
  const struct soak_opts *o;
  int stopfd;
  struct hostile_counts n;
  pthread_t flood_th[SOAK_MAX_FLOODS], herd_th, churn_th;
  unsigned flood_id[SOAK_MAX_FLOODS];
  unsigned n_flood;
  bool herd_up, churn_up;
};

/* A raw link from 127.0.0.<host> that said HELLO and got its HELLO_ACK (status OK),
 * non-blocking from then on; -1 if not. */
static int flood_link(unsigned host) {
  uint8_t hello[512], hb[WIRE_HDR_LEN];
  struct sockaddr_in sa = target_sa();
  struct timeval tv = {.tv_sec = 10};
  int rcvbuf = 64 << 10;
  struct wire_hdr h;
  struct wire_msg m;
  int fd = socket_from(host, false);
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)); /* before connect: it stays small */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));       /* bounds the handshake */
  size_t n = wire_put_hello(hello, sizeof(hello), WIRE_CAP_TCP_DATA, "soak-flood");
  bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            send(fd, hello, n, MSG_NOSIGNAL) == (ssize_t)n && bench_read_full(fd, hb, sizeof(hb)) == 0 &&
            wire_parse_hdr(hb, &h) == WIRE_OK && h.type == WIRE_HELLO_ACK;
  uint8_t *body = ok ? malloc(h.body_len + 1u) : NULL; /* the memory table */
  ok = body != NULL && bench_read_full(fd, body, h.body_len) == 0 && wire_decode(&h, body, &m) == WIRE_OK &&
       m.u.hello_ack.status == WIRE_HELLO_OK;
  free(body);
  int fl = fcntl(fd, F_GETFL);
  if (!ok || fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

struct flood {
  struct hostile *h;
  unsigned id;
  int fd; /* linked by hostile_start, before the other hostile peers begin */
};

/* Pipelines READ_REQs on its link as fast as the target takes them, never reading an
 * answer; links again (at most ten times a second) if the target closes it. */
static void *flood_main(void *arg) {
  struct flood *f = arg;
  struct hostile *h = f->h;
  const unsigned len = h->o->flood_len;
  const uint64_t slots = SOAK_READ_AREA / len;
  uint8_t chunk[256 * WIRE_SMALL_FRAME];
  size_t have = 0, off = 0;
  uint64_t seq = 1;
  int fd = f->fd;
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = h->stopfd, .events = POLLIN}};
    if (fd < 0) { /* the target closed it: link again, paced */
      if (poll(p + 1, 1, 100) != 0) break;
      if ((fd = flood_link(20 + f->id)) < 0) continue;
      atomic_fetch_add(&h->n.flood_links, 1);
      have = off = 0;
      continue;
    }
    if (off == have) {
      have = off = 0;
      for (unsigned i = 0; i < 256; i++, seq++)
        have += wire_put_read_req(chunk + have, seq, g_rbase + (seq % slots) * len, len);
    }
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    ssize_t k = p[0].revents ? send(fd, chunk + off, have - off, MSG_NOSIGNAL) : 0;
    if (k > 0) {
      off += (size_t)k;
      atomic_fetch_add(&h->n.flood_reqs, (uint64_t)k); /* bytes; / frame length when reported */
    } else if ((p[0].revents & (POLLERR | POLLHUP)) || (k < 0 && errno != EAGAIN && errno != EINTR)) {
      atomic_fetch_add(&h->n.flood_lost, 1);
      close(fd);
      fd = -1;
    }
  }
  if (fd >= 0) close(fd);
  return NULL;
}

enum herd_kind { HERD_IDLE, HERD_HALF_PRE, HERD_HALF_POST };
struct herd_slot {
  int fd;
  uint8_t kind;
  bool connected;
};

struct herd {
  struct hostile *h;
  int ep;
  struct herd_slot *s;
  uint32_t *queue; /* slots waiting to be opened again */
  size_t qhead, qlen, n;
  atomic_int_least64_t *open_now;
};

static void herd_queue(struct herd *d, uint32_t i) { d->queue[(d->qhead + d->qlen++) % d->n] = i; }

static void herd_open(struct herd *d, uint32_t i) {
  struct herd_slot *s = &d->s[i];
  const struct soak_opts *o = d->h->o;
  struct sockaddr_in sa = target_sa();
  unsigned host = s->kind == HERD_IDLE ? 2 + i % o->idle_addrs : 11;
  s->connected = false;
  s->fd = socket_from(host, true);
  if (s->fd < 0) {
    atomic_fetch_add(&d->h->n.herd_open_errors, 1);
    herd_queue(d, i);
    return;
  }
  atomic_fetch_add(&d->h->n.herd_opened, 1);
  struct epoll_event ev = {.events = EPOLLOUT | EPOLLRDHUP, .data.u32 = i};
  if ((connect(s->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) ||
      epoll_ctl(d->ep, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
    atomic_fetch_add(&d->h->n.herd_connect_failed, 1);
    close(s->fd);
    s->fd = -1;
    herd_queue(d, i);
  }
}

/* Slot i's connection ended (by_target: after it was up); it is opened again later. */
static void herd_drop(struct herd *d, uint32_t i, bool by_target) {
  struct herd_slot *s = &d->s[i];
  epoll_ctl(d->ep, EPOLL_CTL_DEL, s->fd, NULL);
  close(s->fd);
  s->fd = -1;
  if (s->connected) atomic_fetch_sub(d->open_now, 1);
  atomic_fetch_add(by_target ? &d->h->n.herd_closed : &d->h->n.herd_connect_failed, 1);
  s->connected = false;
  herd_queue(d, i);
}

/* Connected: idle sends nothing; half-sent sends 10 bytes of a HELLO header, or a
 * HELLO and then a READ_REQ's header without its body. */
static void herd_up(struct herd *d, uint32_t i) {
  struct herd_slot *s = &d->s[i];
  uint8_t buf[512];
  size_t n = 0;
  s->connected = true;
  atomic_fetch_add(d->open_now, 1);
  atomic_fetch_add(&d->h->n.herd_connected, 1);
  if (s->kind == HERD_HALF_PRE) {
    n = 10;
    wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "soak-half");
  } else if (s->kind == HERD_HALF_POST) {
    n = wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "soak-half");
    uint8_t rr[WIRE_SMALL_FRAME];
    wire_put_read_req(rr, 1, g_rbase, SOAK_SMALL);
    memcpy(buf + n, rr, WIRE_HDR_LEN);
    n += WIRE_HDR_LEN;
  }
  if (n > 0) (void)!send(s->fd, buf, n, MSG_NOSIGNAL); /* a few bytes into an empty socket */
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = i};
  epoll_ctl(d->ep, EPOLL_CTL_MOD, s->fd, &ev);
}

static void herd_event(struct herd *d, uint32_t i, uint32_t events) {
  struct herd_slot *s = &d->s[i];
  if (!s->connected) {
    int err = 0;
    socklen_t l = sizeof(err);
    if ((events & (EPOLLERR | EPOLLHUP)) || getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0 ||
        err != 0)
      herd_drop(d, i, false);
    else if (events & EPOLLOUT)
      herd_up(d, i);
    return;
  }
  uint8_t buf[4096];
  for (;;) { /* a half-sent link gets its HELLO_ACK: discarded */
    ssize_t k = recv(s->fd, buf, sizeof(buf), 0);
    if (k > 0) continue;
    if (k == 0 || (errno != EAGAIN && errno != EINTR)) herd_drop(d, i, true);
    return;
  }
}

#define HERD_TICK_NS 10000000ull /* reconnects are paced per 10 ms */

/* Idle and half-sent connections, all in one epoll set; each opened again when it
 * ends, at most reconnect_rate a second. */
static void *herd_main(void *arg) {
  struct herd *d = arg;
  struct hostile *h = d->h;
  const struct soak_opts *o = h->o;
  struct epoll_event evs[256];
  struct itimerspec its = {.it_interval = {0, (long)HERD_TICK_NS}, .it_value = {0, (long)HERD_TICK_NS}};
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
  if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) != 0 ||
      epoll_ctl(d->ep, EPOLL_CTL_ADD, h->stopfd, &ev) != 0)
    goto out;
  ev.data.u32 = UINT32_MAX - 1;
  if (epoll_ctl(d->ep, EPOLL_CTL_ADD, tfd, &ev) != 0) goto out;
  for (uint32_t i = 0; i < d->n; i++) herd_open(d, i);
  size_t budget = o->reconnect_rate / 100 > 0 ? o->reconnect_rate / 100 : 1;
  for (;;) {
    int k = epoll_wait(d->ep, evs, 256, -1);
    if (k < 0 && errno != EINTR) break;
    for (int j = 0; j < k; j++) {
      uint32_t i = evs[j].data.u32;
      if (i == UINT32_MAX) goto out;
      if (i == UINT32_MAX - 1) {
        uint64_t v;
        (void)!read(tfd, &v, sizeof(v));
        size_t left = d->qlen < budget ? d->qlen : budget;
        while (left-- > 0) {
          uint32_t q = d->queue[d->qhead];
          d->qhead = (d->qhead + 1) % d->n;
          d->qlen--;
          herd_open(d, q);
        }
        continue;
      }
      if (d->s[i].fd >= 0) herd_event(d, i, evs[j].events);
    }
  }
out:
  for (uint32_t i = 0; i < d->n; i++)
    if (d->s[i].fd >= 0) close(d->s[i].fd);
  if (tfd >= 0) close(tfd);
  return NULL;
}

/* Connections opened and closed at once, churn_rate a second, from 127.0.0.12-15:
 * in turn closed plainly, closed after a HELLO, and reset. */
static void *churn_main(void *arg) {
  struct hostile *h = arg;
  struct sockaddr_in sa = target_sa();
  uint8_t hello[512];
  size_t hn = wire_put_hello(hello, sizeof(hello), WIRE_CAP_TCP_DATA, "soak-churn");
  uint64_t ns = 1000000000ull / h->o->churn_rate;
  struct itimerspec its = {.it_interval = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}};
  its.it_value = its.it_interval;
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) != 0) {
    hb_say("churn: timerfd: %s\n", strerror(errno));
    return NULL;
  }
  for (uint64_t k = 0;;) {
    struct pollfd p[2] = {{.fd = tfd, .events = POLLIN}, {.fd = h->stopfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    uint64_t v = 0;
    if (!p[0].revents || read(tfd, &v, sizeof(v)) != (ssize_t)sizeof(v)) continue;
    if (v > 16) v = 16; /* ticks this thread missed are dropped, not caught up */
    for (uint64_t j = 0; j < v; j++, k++) {
      int fd = socket_from(12 + (unsigned)(k % 4), true);
      if (fd < 0 || (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)) {
        atomic_fetch_add(&h->n.churn_errors, 1);
        if (fd >= 0) close(fd);
        continue;
      }
      if (k % 3 == 1) (void)!send(fd, hello, hn, MSG_NOSIGNAL);
      if (k % 3 == 2) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      }
      close(fd);
      atomic_fetch_add(&h->n.churn, 1);
    }
  }
  close(tfd);
  return NULL;
}

struct hostile_run {
  struct hostile h;
  struct flood fl[SOAK_MAX_FLOODS];
  struct herd herd;
  atomic_int_least64_t herd_open_now;
};

/* The flood links first (the target has descriptors then), then the rest. */
static bool hostile_start(struct hostile_run *r, const struct soak_opts *o) {
  struct hostile *h = &r->h;
  memset(r, 0, sizeof(*r));
  r->herd.ep = -1;
  h->o = o;
  h->stopfd = eventfd(0, EFD_CLOEXEC);
  if (h->stopfd < 0) return false;
  for (unsigned i = 0; i < o->floods; i++) {
    r->fl[i] = (struct flood){.h = h, .id = i, .fd = flood_link(20 + i)};
    if (r->fl[i].fd < 0) {
      hb_say("flood %u: no link to the target\n", i);
      return false;
    }
    atomic_fetch_add(&h->n.flood_links, 1);
    if (pthread_create(&h->flood_th[i], NULL, flood_main, &r->fl[i]) != 0) return false;
    h->n_flood++;
  }
  struct herd *d = &r->herd;
  d->h = h;
  d->n = (size_t)o->idle + o->half;
  d->open_now = &r->herd_open_now;
  d->ep = epoll_create1(EPOLL_CLOEXEC);
  d->s = calloc(d->n, sizeof(*d->s));
  d->queue = calloc(d->n, sizeof(*d->queue));
  if (d->ep < 0 || d->s == NULL || d->queue == NULL) return false;
  for (size_t i = 0; i < d->n; i++) {
    d->s[i].fd = -1;
    d->s[i].kind = i < o->idle ? HERD_IDLE : ((i - o->idle) % 2 ? HERD_HALF_POST : HERD_HALF_PRE);
  }
  if (d->n > 0) {
    if (pthread_create(&h->herd_th, NULL, herd_main, d) != 0) return false;
    h->herd_up = true;
  }
  if (o->churn_rate > 0) {
    if (pthread_create(&h->churn_th, NULL, churn_main, h) != 0) return false;
    h->churn_up = true;
  }
  return true;
}

static void hostile_stop(struct hostile_run *r) {
  struct hostile *h = &r->h;
  uint64_t one = 1;
  if (h->stopfd >= 0) (void)!write(h->stopfd, &one, sizeof(one));
  for (unsigned i = 0; i < h->n_flood; i++) pthread_join(h->flood_th[i], NULL);
  if (h->herd_up) pthread_join(h->herd_th, NULL);
  if (h->churn_up) pthread_join(h->churn_th, NULL);
  if (r->herd.ep >= 0) close(r->herd.ep);
  free(r->herd.s);
  free(r->herd.queue);
  if (h->stopfd >= 0) close(h->stopfd);
}

/* ------------------------------------------------------------------- phases */

struct legit_sum {
  uint64_t bytes, ops, calls, failed_ops, failed_calls, wrong;
};

static struct legit_sum legit_total(struct client *c, unsigned n) {
  struct legit_sum s = {0, 0, 0, 0, 0, 0};
  for (unsigned i = 0; i < n; i++) {
    s.bytes += atomic_load(&c[i].n.bytes);
    s.ops += atomic_load(&c[i].n.ops);
    s.calls += atomic_load(&c[i].n.calls);
    s.failed_ops += atomic_load(&c[i].n.failed_ops);
    s.failed_calls += atomic_load(&c[i].n.failed_calls);
    s.wrong += atomic_load(&c[i].n.wrong);
  }
  return s;
}

struct phase_res {
  double secs;
  struct legit_sum legit;
  uint64_t rss_max_kib;
  int fds_max;
  double cpu_pct;
  uint64_t flood_reqs, flood_lost, herd_connected, herd_closed, churn, churn_errors;
  uint64_t joins, joins_ok, joins_late, joins_failed, join_wrong, join_max_ms, join_sum_ms;
  bool ran;
};

struct sample {
  double t;
  int phase;
  uint64_t rss_kib;
  int fds;
  double cpu_pct, legit_mbs;
  uint64_t flood_reqs;
  int64_t herd_open;
};

struct run {
  const struct soak_opts *o;
  pid_t pid;
  struct client *cl;
  struct joiner *jn;
  atomic_int phase;
  struct phase_res ph[PH_N];
  struct sample *smp;
  size_t n_smp, cap_smp;
  struct proc_sample idle;
  bool target_died;
  uint64_t t0_ns;
  unsigned frame_len; /* one flood READ_REQ */
};

/* One phase: secs seconds, a sample every second. */
static bool run_phase(struct run *r, int ph, double secs) {
  const struct soak_opts *o = r->o;
  struct hostile_run *hr = NULL;
  struct phase_res *res = &r->ph[ph];
  long tck = sysconf(_SC_CLK_TCK);
  if (ph == PH_HOSTILE) {
    hr = calloc(1, sizeof(*hr));
    if (hr == NULL || !hostile_start(hr, o)) {
      if (hr != NULL) hostile_stop(hr);
      free(hr);
      return false;
    }
  }
  atomic_store(&r->phase, ph);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  struct itimerspec its = {.it_interval = {1, 0}, .it_value = {1, 0}};
  if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) != 0) {
    hb_say("timerfd: %s\n", strerror(errno));
    if (hr != NULL) hostile_stop(hr);
    free(hr);
    return false;
  }
  struct proc_sample prev, now;
  if (!sample_proc(r->pid, &prev)) prev = r->idle;
  struct legit_sum l0 = legit_total(r->cl, o->clients), lprev = l0;
  uint64_t start = bench_now_ns(), tprev = start, cpu0 = prev.cpu_ticks;
  unsigned ticks = (unsigned)(secs + 0.5);
  res->ran = true;
  for (unsigned t = 1; t <= ticks; t++) {
    uint64_t v;
    if (read(tfd, &v, sizeof(v)) != (ssize_t)sizeof(v)) break; /* blocks for the second */
    int wst;
    if (waitpid(r->pid, &wst, WNOHANG) == r->pid) {
      hb_say("FINDING: the target process ended during the %s phase (%s %d)\n", ph_name[ph],
             WIFSIGNALED(wst) ? "signal" : "status", WIFSIGNALED(wst) ? WTERMSIG(wst) : WEXITSTATUS(wst));
      r->target_died = true;
      break;
    }
    uint64_t tn = bench_now_ns();
    if (!sample_proc(r->pid, &now)) continue;
    struct legit_sum l = legit_total(r->cl, o->clients);
    double dt = (double)(tn - tprev) / 1e9;
    struct sample s = {.t = (double)(tn - r->t0_ns) / 1e9,
                       .phase = ph,
                       .rss_kib = now.rss_kib,
                       .fds = now.fds,
                       .cpu_pct = 100.0 * (double)(now.cpu_ticks - prev.cpu_ticks) / (double)tck / dt,
                       .legit_mbs = (double)(l.bytes - lprev.bytes) / 1e6 / dt,
                       .flood_reqs = hr ? atomic_load(&hr->h.n.flood_reqs) / r->frame_len : 0,
                       .herd_open = hr ? atomic_load(&hr->herd_open_now) : 0};
    if (r->n_smp < r->cap_smp) r->smp[r->n_smp++] = s;
    if (now.rss_kib > res->rss_max_kib) res->rss_max_kib = now.rss_kib;
    if (now.fds > res->fds_max) res->fds_max = now.fds;
    struct join_counts *jc = r->jn ? &r->jn->n[ph] : NULL;
    fprintf(stderr,
            "%s: [%5.0fs %-14s] legit %7.1f MB/s, %" PRIu64 " ops, %" PRIu64 " failed, %" PRIu64
            " bytes wrong | target RSS %6.1f MiB, %4d fds, CPU %3.0f%%",
            hb_prog, s.t, ph_name[ph], s.legit_mbs, l.ops - l0.ops, l.failed_ops - l0.failed_ops,
            l.wrong - l0.wrong, (double)now.rss_kib / 1024.0, now.fds, s.cpu_pct);
    if (hr)
      fprintf(stderr,
              " | flood %" PRIu64 " READ_REQs sent, idle/half-sent %" PRId64 " open, %" PRIu64
              " closed by the target, churn %" PRIu64,
              s.flood_reqs, s.herd_open, (uint64_t)atomic_load(&hr->h.n.herd_closed),
              (uint64_t)atomic_load(&hr->h.n.churn));
    if (jc)
      fprintf(stderr, " | joiners %" PRIu64 "/%" PRIu64 " ok", (uint64_t)atomic_load(&jc->ok),
              (uint64_t)atomic_load(&jc->tries));
    fputc('\n', stderr);
    prev = now;
    lprev = l;
    tprev = tn;
  }
  close(tfd);
  uint64_t end = bench_now_ns();
  struct legit_sum l1 = legit_total(r->cl, o->clients);
  res->secs = (double)(end - start) / 1e9;
  res->legit = (struct legit_sum){l1.bytes - l0.bytes,
                                  l1.ops - l0.ops,
                                  l1.calls - l0.calls,
                                  l1.failed_ops - l0.failed_ops,
                                  l1.failed_calls - l0.failed_calls,
                                  l1.wrong - l0.wrong};
  if (tprev > start)
    res->cpu_pct = 100.0 * (double)(prev.cpu_ticks - cpu0) / (double)tck / ((double)(tprev - start) / 1e9);
  if (hr) {
    res->flood_reqs = atomic_load(&hr->h.n.flood_reqs) / r->frame_len;
    res->flood_lost = atomic_load(&hr->h.n.flood_lost);
    res->herd_connected = atomic_load(&hr->h.n.herd_connected);
    res->herd_closed = atomic_load(&hr->h.n.herd_closed);
    res->churn = atomic_load(&hr->h.n.churn);
    res->churn_errors = atomic_load(&hr->h.n.churn_errors);
    hostile_stop(hr);
    free(hr);
  }
  return !r->target_died;
}

static void joins_into(struct run *r) {
  for (int p = 0; p < PH_N && r->jn; p++) {
    struct join_counts *j = &r->jn->n[p];
    r->ph[p].joins = atomic_load(&j->tries);
    r->ph[p].joins_ok = atomic_load(&j->ok);
    r->ph[p].joins_late = atomic_load(&j->late);
    r->ph[p].joins_failed = atomic_load(&j->failed);
    r->ph[p].join_wrong = atomic_load(&j->wrong);
    r->ph[p].join_max_ms = atomic_load(&j->max_ms);
    r->ph[p].join_sum_ms = atomic_load(&j->sum_ms);
  }
}

/* ------------------------------------------------------------------- report */

struct goals {
  double base_gbs, hostile_gbs, ratio;
  uint64_t failed, wrong, rss_max_kib, rss_bound_kib, rss_limit_kib;
  int fds_max, fds_cap;
  uint64_t hostile_joins, hostile_joins_ok, hostile_joins_late;
  bool pass_ratio, pass_failed, pass_wrong, pass_rss, pass_fds, pass_join;
};

static const char *pm(bool pass) { return pass ? "PASS" : "MISS"; }

static struct goals judge(const struct run *r) {
  const struct soak_opts *o = r->o;
  struct goals g;
  memset(&g, 0, sizeof(g));
  double bb = 0, bs = 0;
  for (int p = 0; p < PH_N; p++) {
    const struct phase_res *x = &r->ph[p];
    if (!x->ran) continue;
    if (p != PH_HOSTILE) bb += (double)x->legit.bytes, bs += x->secs;
    g.failed += x->legit.failed_ops;
    g.wrong += x->legit.wrong + x->join_wrong;
    if (x->rss_max_kib > g.rss_max_kib) g.rss_max_kib = x->rss_max_kib;
    if (x->fds_max > g.fds_max) g.fds_max = x->fds_max;
  }
  const struct phase_res *h = &r->ph[PH_HOSTILE];
  g.base_gbs = bs > 0 ? bb / bs / 1e9 : 0;
  g.hostile_gbs = h->secs > 0 ? (double)h->legit.bytes / h->secs / 1e9 : 0;
  g.ratio = g.base_gbs > 0 ? g.hostile_gbs / g.base_gbs : 0;
  g.rss_bound_kib = r->idle.rss_kib + (uint64_t)o->floods * o->answer_mib * 1024u;
  g.rss_limit_kib = g.rss_bound_kib + SOAK_RSS_SLACK / 1024u;
  g.fds_cap = (int)o->target_nofile;
  g.hostile_joins = h->joins;
  g.hostile_joins_ok = h->joins_ok;
  g.hostile_joins_late = h->joins_late;
  g.pass_ratio = h->ran && g.ratio >= 0.8 && !r->target_died;
  g.pass_failed = g.failed == 0 && !r->target_died;
  g.pass_wrong = g.wrong == 0;
  g.pass_rss = g.rss_max_kib <= g.rss_limit_kib;
  g.pass_fds = g.fds_max <= g.fds_cap;
  g.pass_join = h->joins == h->joins_ok;
  return g;
}

static void print_report(const struct run *r, const struct goals *g) {
  const struct soak_opts *o = r->o;
  printf("| phase | seconds | legit GB/s | legit ops | failed ops | bytes wrong | target max RSS MiB"
         " | target max fds | target CPU %% | late joiners served / tried (max ms) |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int p = 0; p < PH_N; p++) {
    const struct phase_res *x = &r->ph[p];
    if (!x->ran) continue;
    printf("| %s | %.0f | %.3f | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %.1f | %d | %.0f | %" PRIu64
           " / %" PRIu64 " (%" PRIu64 ")%s |\n",
           ph_name[p], x->secs, x->secs > 0 ? (double)x->legit.bytes / x->secs / 1e9 : 0.0, x->legit.ops,
           x->legit.failed_ops, x->legit.wrong + x->join_wrong, (double)x->rss_max_kib / 1024.0, x->fds_max,
           x->cpu_pct, x->joins_ok, x->joins, x->join_max_ms,
           x->joins_late ? ", more served after the phase" : "");
  }
  const struct phase_res *h = &r->ph[PH_HOSTILE];
  printf("\nHostile peers (%.0f s): %u READ floods sent %" PRIu64 " READ_REQs of %u bytes and read no answer"
         " (links lost: %" PRIu64 "); %u idle connects (from %u addresses) and %u half-sent ones were"
         " connected %" PRIu64 " times and closed by the target %" PRIu64 " times; churn: %" PRIu64
         " connections opened and closed (%u a second, %" PRIu64 " errors).\n",
         h->secs, o->floods, h->flood_reqs, o->flood_len, h->flood_lost, o->idle, o->idle_addrs, o->half,
         h->herd_connected, h->herd_closed, h->churn, o->churn_rate, h->churn_errors);
  printf("Target idle RSS (memory registered, no peer yet): %.1f MiB; %d descriptors.\n\n",
         (double)r->idle.rss_kib / 1024.0, r->idle.fds);
  printf("- legitimate throughput with hostile peers / without: %.3f / %.3f GB/s = %.2fx (goal >= 0.8): %s\n",
         g->hostile_gbs, g->base_gbs, g->ratio, pm(g->pass_ratio));
  printf("- failed legitimate ops: %" PRIu64 " (goal 0): %s\n", g->failed, pm(g->pass_failed));
  printf("- bytes wrong: %" PRIu64 " (goal 0): %s\n", g->wrong, pm(g->pass_wrong));
  printf("- target max RSS: %.1f MiB; bound: idle %.1f MiB + %u flood links x LinkAnswerMiB %zu = %.1f MiB;"
         " goal <= bound + 16 = %.1f MiB: %s\n",
         (double)g->rss_max_kib / 1024.0, (double)r->idle.rss_kib / 1024.0, o->floods, o->answer_mib,
         (double)g->rss_bound_kib / 1024.0, (double)g->rss_limit_kib / 1024.0, pm(g->pass_rss));
  printf("- target max descriptors: %d (cap: its RLIMIT_NOFILE, %d): %s\n", g->fds_max, g->fds_cap,
         pm(g->pass_fds));
  printf("- late joiners during the hostile phase (a new engine connects and READs, %d ms timeout): %" PRIu64
         " of %" PRIu64 " served while hostile peers were on (%" PRIu64 " more only after they left;"
         " no lockout): %s\n",
         o->join_timeout_ms, g->hostile_joins_ok, g->hostile_joins, g->hostile_joins_late, pm(g->pass_join));
  if (r->target_died) printf("- the target process ended during the run: see the FINDING line on stderr\n");
}

static bool write_json(const struct run *r, const struct goals *g, const char *path) {
  const struct soak_opts *o = r->o;
  FILE *f = fopen(path, "w");
  if (f == NULL) return hb_say("--json %s: %s\n", path, strerror(errno)), false;
  fprintf(f, "{\n  \"transport\": \"%s\", \"hostile_seconds\": %.0f, \"baseline_seconds\": %.0f,\n",
          o->transport, o->seconds, o->base_seconds);
  fprintf(f,
          "  \"clients\": %u, \"floods\": %u, \"flood_len\": %u, \"idle_connects\": %u, \"idle_addrs\": %u,"
          " \"half_sent\": %u, \"churn_rate\": %u, \"target_nofile\": %u,\n",
          o->clients, o->floods, o->flood_len, o->idle, o->idle_addrs, o->half, o->churn_rate,
          o->target_nofile);
  fprintf(f, "  \"options\": {");
  for (size_t i = 0; i < o->x.n; i++)
    fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", o->x.v[i].key, o->x.v[i].value);
  fprintf(f, "},\n  \"target_idle_rss_kib\": %" PRIu64 ", \"target_idle_fds\": %d,\n", r->idle.rss_kib,
          r->idle.fds);
  fprintf(f, "  \"phases\": [\n");
  bool first = true;
  for (int p = 0; p < PH_N; p++) {
    const struct phase_res *x = &r->ph[p];
    if (!x->ran) continue;
    fprintf(f,
            "%s    {\"phase\": \"%s\", \"seconds\": %.3f, \"legit_bytes\": %" PRIu64 ", \"legit_gbs\": %.4f,"
            " \"legit_ops\": %" PRIu64 ", \"legit_calls\": %" PRIu64 ", \"failed_ops\": %" PRIu64
            ", \"failed_calls\": %" PRIu64 ", \"bytes_wrong\": %" PRIu64 ", \"rss_max_kib\": %" PRIu64
            ", \"fds_max\": %d, \"cpu_pct\": %.1f, \"flood_reqs\": %" PRIu64
            ", \"flood_links_lost\": %" PRIu64 ", \"herd_connected\": %" PRIu64
            ", \"herd_closed_by_target\": %" PRIu64 ", \"churn\": %" PRIu64 ", \"joins\": %" PRIu64
            ", \"joins_ok\": %" PRIu64 ", \"joins_late\": %" PRIu64 ", \"join_max_ms\": %" PRIu64 "}",
            first ? "" : ",\n", ph_name[p], x->secs, x->legit.bytes,
            x->secs > 0 ? (double)x->legit.bytes / x->secs / 1e9 : 0.0, x->legit.ops, x->legit.calls,
            x->legit.failed_ops, x->legit.failed_calls, x->legit.wrong + x->join_wrong, x->rss_max_kib,
            x->fds_max, x->cpu_pct, x->flood_reqs, x->flood_lost, x->herd_connected, x->herd_closed, x->churn,
            x->joins, x->joins_ok, x->joins_late, x->join_max_ms);
    first = false;
  }
  fprintf(f, "\n  ],\n  \"samples\": [\n");
  for (size_t i = 0; i < r->n_smp; i++) {
    const struct sample *s = &r->smp[i];
    fprintf(f,
            "    {\"t\": %.1f, \"phase\": \"%s\", \"rss_kib\": %" PRIu64 ", \"fds\": %d, \"cpu_pct\": %.1f,"
            " \"legit_mbs\": %.1f, \"flood_reqs\": %" PRIu64 ", \"herd_open\": %" PRId64 "}%s\n",
            s->t, ph_name[s->phase], s->rss_kib, s->fds, s->cpu_pct, s->legit_mbs, s->flood_reqs,
            s->herd_open, i + 1 < r->n_smp ? "," : "");
  }
  fprintf(
      f,
      "  ],\n  \"goals\": {\"throughput_ratio\": %.4f, \"throughput\": \"%s\", \"failed_ops\": %" PRIu64
      ", \"failed\": \"%s\", \"bytes_wrong\": %" PRIu64 ", \"wrong\": \"%s\", \"rss_max_kib\": %" PRIu64
      ", \"rss_bound_kib\": %" PRIu64 ", \"rss_limit_kib\": %" PRIu64 ", \"rss\": \"%s\", \"fds_max\": %d,"
      " \"fds_cap\": %d, \"fds\": \"%s\", \"hostile_joins\": %" PRIu64 ", \"hostile_joins_ok\": %" PRIu64
      ", \"join\": \"%s\", \"target_died\": %s}\n}\n",
      g->ratio, pm(g->pass_ratio), g->failed, pm(g->pass_failed), g->wrong, pm(g->pass_wrong), g->rss_max_kib,
      g->rss_bound_kib, g->rss_limit_kib, pm(g->pass_rss), g->fds_max, g->fds_cap, pm(g->pass_fds),
      g->hostile_joins, g->hostile_joins_ok, pm(g->pass_join), r->target_died ? "true" : "false");
  return fclose(f) == 0;
}

/* --------------------------------------------------------------------- main */

static struct soak_opts o = {.seconds = 120,
                             .base_seconds = -1,
                             .transport = "tcp",
                             .clients = 2,
                             .floods = 2,
                             .flood_len = SOAK_SMALL,
                             .target_nofile = 1024,
                             .idle = UINT32_MAX,
                             .idle_addrs = 8,
                             .half = 64,
                             .churn_rate = 200,
                             .reconnect_rate = 500,
                             .join_every = 5,
                             .join_timeout_ms = 15000,
                             .op_timeout_ms = 10000};
static const char *const transports[] = {"tcp", "auto", "shm", "rdma", NULL};
static int transport_idx;
static const struct hb_opt opts[] = {
    {"--seconds", HB_DBL, &o.seconds, "S", "hostile phase (default 120)", 1, 86400, NULL},
    {"--baseline-seconds", HB_DBL, &o.base_seconds, "S",
     "each baseline phase, before and after (default seconds / 4, >= 5)", 0, 86400, NULL},
    {"--transport", HB_CHOICE, &transport_idx, "NAME",
     "tcp (default) | auto | shm | rdma: the engines' Transport", 0, 0, transports},
    {"--opt", HB_FN, &o.x, "KEY=VALUE",
     "a target engine option, repeatable (LinkAnswersMax, MaxLinks, ...);\n"
     "LinkAnswerMiB is " SOAK_DEFAULT_ANSWER_MIB " unless given (the RSS bound uses it)",
     0, 0, hb_extra_add},
    {"--clients", HB_UNS, &o.clients, "N", "legitimate client engines (default 2)", 1, SOAK_MAX_CLIENTS,
     NULL},
    {"--floods", HB_UNS, &o.floods, "N", "READ flood links (default 2)", 0, SOAK_MAX_FLOODS, NULL},
    {"--flood-len", HB_FN, &o.flood_len, "BYTES", "bytes of one flood READ_REQ (default 4K)", 0, 0,
     set_flood_len},
    {"--target-nofile", HB_UNS, &o.target_nofile, "N", "the target's RLIMIT_NOFILE (default 1024)", 64,
     1u << 20, NULL},
    {"--idle", HB_UNS, &o.idle, "N", "idle connects (default 2 x the target's descriptor limit)", 0, 1u << 20,
     NULL},
    {"--idle-addrs", HB_UNS, &o.idle_addrs, "N", "source addresses they come from, 127.0.0.2.. (default 8)",
     1, 8, NULL},
    {"--half", HB_UNS, &o.half, "N", "half-sent connections (default 64)", 0, 1u << 16, NULL},
    {"--churn-rate", HB_UNS, &o.churn_rate, "N", "connect/close a second (default 200; 0: none)", 0, 100000,
     NULL},
    {"--reconnect-rate", HB_UNS, &o.reconnect_rate, "N",
     "idle / half-sent connections opened again a second (default 500)", 1, 1000000, NULL},
    {"--join-every", HB_DBL, &o.join_every, "S", "a late joiner every S seconds (default 5; 0: none)", 0,
     86400, NULL},
    {"--join-timeout-ms", HB_INT, &o.join_timeout_ms, "MS", "its Connect and READ timeout (default 15000)", 1,
     INT32_MAX, NULL},
    {"--op-timeout-ms", HB_INT, &o.op_timeout_ms, "MS", "a legitimate call's timeout (default 10000)", 1,
     INT32_MAX, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the figures and the samples", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

/* Raise this process's soft descriptor limit to its hard one; false when that is
 * still below need. */
static bool raise_nofile(rlim_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    hb_say("this process may open %llu descriptors (hard limit); the hostile peers need %llu: lower --idle\n",
           (unsigned long long)rl.rlim_cur, (unsigned long long)need);
    return false;
  }
  return true;
}

/* Wait for the target to exit; a hang past timeout_s is a finding: it is killed. */
static int wait_target(pid_t pid, int timeout_s) {
  bool in_time;
  int rc = bench_wait_child(pid, timeout_s, &in_time);
  if (!in_time)
    hb_say("FINDING: the target did not exit within %d s of QUIT (HixlEngineDestroy hangs?); killed it\n",
           timeout_s);
  return rc;
}

static int target_child(void *arg, int fd) { return target_main(arg, fd); }

int main(int argc, char **argv) {
  static struct run r;
  char line[SOAK_LINE_MAX];
  int rc = 1;
  hb_prog = "hixl-soak";
  hb_parse(argc, argv, opts,
           "One target engine (its own process, under a descriptor limit) serves legitimate clients\n"
           "during a baseline phase, a hostile phase and a second baseline; see the file's head.\n"
           "Exit status: 0 all goals PASS, 3 a goal MISSed, 1 the run failed, 2 bad arguments.\n");
  o.transport = transports[transport_idx];
  if (o.base_seconds < 0) o.base_seconds = o.seconds / 4 < 5 ? 5 : o.seconds / 4;
  if (o.idle == UINT32_MAX) o.idle = 2 * o.target_nofile;
  const char *mib = hb_extra_get(&o.x, "LinkAnswerMiB");
  if (mib == NULL && !hb_extra_add(&o.x, "LinkAnswerMiB=" SOAK_DEFAULT_ANSWER_MIB)) return 2;
  o.answer_mib = (size_t)strtoull(mib ? mib : SOAK_DEFAULT_ANSWER_MIB, NULL, 10);
  snprintf(g_taddr, sizeof(g_taddr), "127.0.0.1:%u", (unsigned)hb_ports("127.0.0.1", 1));
  struct hb_peer tgt;
  hb_spawn(&tgt, target_child, &o); /* before any thread */
  int sp0 = tgt.fd;
  pid_t pid = tgt.pid;
  r.o = &o;
  r.pid = pid;
  if (bench_read_line(sp0, line, sizeof(line), 60000) != 1 ||
      sscanf(line, "READY %" SCNxPTR " %zu", &g_rbase, &g_rlen) != 2) {
    hb_say("the target did not come up\n");
    goto out_target;
  }
  if (!raise_nofile((rlim_t)o.idle + o.half + 1024)) goto out_target;
  g_ref = malloc(SOAK_READ_AREA);
  r.cl = calloc(o.clients, sizeof(*r.cl));
  r.cap_smp = (size_t)(o.seconds + 2 * o.base_seconds) + 16;
  r.smp = calloc(r.cap_smp, sizeof(*r.smp));
  if (g_ref == NULL || r.cl == NULL || r.smp == NULL) goto out_target;
  bench_pattern_fill(g_ref, SOAK_READ_AREA, SOAK_SEED); /* the target filled its region alike */
  uint8_t rr[WIRE_SMALL_FRAME];
  r.frame_len = (unsigned)wire_put_read_req(rr, 1, 0, 1);
  if (!sample_proc(pid, &r.idle)) goto out_target;
  hb_say("target %s (pid %d, Transport %s, RLIMIT_NOFILE %u): %.1f MiB RSS, %d descriptors, %zu bytes"
         " registered\n",
         g_taddr, (int)pid, o.transport, o.target_nofile, (double)r.idle.rss_kib / 1024.0, r.idle.fds,
         g_rlen);
  r.t0_ns = bench_now_ns();

  unsigned started = 0;
  for (; started < o.clients; started++) {
    r.cl[started].id = started;
    r.cl[started].o = &o;
    if (!client_start(&r.cl[started])) break;
  }
  struct joiner jn = {.o = &o, .stopfd = -1, .phase = &r.phase};
  bool joiner_up = false;
  if (started == o.clients && o.join_every > 0) {
    jn.stopfd = eventfd(0, EFD_CLOEXEC);
    joiner_up = jn.stopfd >= 0 && pthread_create(&jn.th, NULL, joiner_main, &jn) == 0;
    if (joiner_up) r.jn = &jn;
  }
  bool ran = started == o.clients && (o.join_every <= 0 || joiner_up);
  const double secs[PH_N] = {o.base_seconds, o.seconds, o.base_seconds};
  for (int p = 0; ran && p < PH_N; p++) {
    if (secs[p] < 1) continue;
    hb_say("phase %s: %.0f s%s\n", ph_name[p], secs[p], p == PH_HOSTILE ? ", hostile peers on" : "");
    ran = run_phase(&r, p, secs[p]);
  }

  atomic_store(&g_clients_stop, true);
  if (joiner_up) {
    uint64_t one = 1;
    (void)!write(jn.stopfd, &one, sizeof(one));
    pthread_join(jn.th, NULL);
  }
  for (unsigned i = 0; i < o.clients; i++) {
    if (i < started) pthread_join(r.cl[i].th, NULL);
    if (r.cl[i].eng != NULL) HixlEngineDestroy(r.cl[i].eng);
    if (r.cl[i].mem != NULL) munmap(r.cl[i].mem, r.cl[i].mem_len);
    free(r.cl[i].key_base);
  }
  if (jn.stopfd >= 0) close(jn.stopfd);
  if (ran) {
    joins_into(&r);
    struct goals g = judge(&r);
    print_report(&r, &g);
    fflush(stdout);
    bool all = g.pass_ratio && g.pass_failed && g.pass_wrong && g.pass_rss && g.pass_fds && g.pass_join;
    rc = all ? 0 : 3;
    if (o.json != NULL && !write_json(&r, &g, o.json)) rc = 1;
  }
out_target:
  if (!r.target_died) {
    (void)!send(sp0, "QUIT\n", 5, MSG_NOSIGNAL);
    int trc = wait_target(pid, 30);
    if (trc != 0) {
      hb_say("the target process exited with status %d\n", trc);
      rc = 1;
    }
  }
  close(sp0);
  free(r.smp);
  free(r.cl);
  free(g_ref);
  return rc;
}
