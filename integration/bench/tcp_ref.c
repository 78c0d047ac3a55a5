/* hixl-tcp-ref: the plain TCP reference hixl-bench is compared with, measured in the
 * same run on 127.0.0.1. Two processes (fork): a receiver and a sender.
 *   --mode stream: N connections (--streams), each a thread doing blocking send() of
 *     --size bytes from one buffer for --seconds; the receiver recv()s into a buffer of
 *     the same size and acknowledges the byte count at EOF, so the time includes the
 *     drain. Reports GB/s (10^9 bytes/s) over all streams.
 *   --mode rtt: one connection, blocking --size byte request and --size byte response,
 *     repeated --iters times (bounded by --seconds); avg / p50 / p99 microseconds.
 * TCP_NODELAY on every socket. `hixl-perf tcp-ref` (hixl-tcp-ref): the receiver is the
 * test's server. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define REF_MAX_STREAMS       64
#define REF_ACCEPT_TIMEOUT_MS 10000
#define REF_IO_TIMEOUT_S      30 /* SO_RCVTIMEO / SO_SNDTIMEO: no call blocks forever */

enum ref_mode { REF_STREAM, REF_RTT };

struct ref_opts {
  int mode;         /* enum ref_mode */
  size_t size;      /* bytes per send() (stream) or per message (rtt) */
  unsigned streams; /* connections (stream) */
  double seconds;   /* stream duration; rtt upper bound */
  uint64_t iters;   /* rtt round trips measured */
  uint64_t warmup;  /* rtt round trips not measured */
  const char *csv;  /* append a row here */
  int cpu[2];       /* --pin: sender, receiver; -1 none */
  bool quiet;
  int lfd; /* the receiver's listening socket */
};

static void set_sock_opts(int fd) {
  int one = 1;
  struct timeval tv = {.tv_sec = REF_IO_TIMEOUT_S, .tv_usec = 0};
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* 1: got len bytes; 0: EOF before any byte; -1: error or EOF mid-message. */
static int recv_all(int fd, void *p, size_t len) {
  uint8_t *b = p;
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, b + got, len - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return got == 0 ? 0 : -1;
    got += (size_t)n;
  }
  return 1;
}

/* ------------------------------------------------------------------ receiver */

struct sink_arg {
  int fd;
  size_t size;
  enum ref_mode mode;
  int ok;
};

static void *sink_thread(void *p) {
  struct sink_arg *a = p;
  uint8_t *buf = hb_map(a->size);
  a->ok = 0;
  if (buf == NULL) return NULL;
  if (a->mode == REF_STREAM) {
    uint64_t total = 0;
    for (;;) {
      ssize_t n = recv(a->fd, buf, a->size, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) goto out;
      if (n == 0) break;
      total += (uint64_t)n;
    }
    uint8_t ack[8];
    for (int i = 0; i < 8; i++) ack[i] = (uint8_t)(total >> (56 - 8 * i));
    a->ok = hb_write_all(a->fd, ack, sizeof(ack));
  } else {
    for (;;) {
      int r = recv_all(a->fd, buf, a->size);
      if (r == 0) break;
      if (r < 0 || !hb_write_all(a->fd, buf, a->size)) goto out;
    }
    a->ok = 1;
  }
out:
  munmap(buf, a->size);
  return NULL;
}

static int run_receiver(const struct ref_opts *o, int lfd) {
  unsigned n = o->mode == REF_STREAM ? o->streams : 1;
  struct sink_arg args[REF_MAX_STREAMS];
  pthread_t th[REF_MAX_STREAMS];
  unsigned started = 0;
  int rc = 0;
  for (unsigned i = 0; i < n; i++) {
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    if (poll(&pfd, 1, REF_ACCEPT_TIMEOUT_MS) <= 0) {
      hb_say("receiver: no connection within %d ms\n", REF_ACCEPT_TIMEOUT_MS);
      rc = 1;
      break;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      hb_say("receiver: accept: %s\n", strerror(errno));
      rc = 1;
      break;
    }
    set_sock_opts(fd);
    args[i] = (struct sink_arg){.fd = fd, .size = o->size, .mode = o->mode, .ok = 0};
    if (pthread_create(&th[i], NULL, sink_thread, &args[i]) != 0) {
      close(fd);
      rc = 1;
      break;
    }
    started++;
  }
  for (unsigned i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    close(args[i].fd);
    if (!args[i].ok) rc = 1;
  }
  return rc;
}

/* -------------------------------------------------------------------- sender */

struct src_arg {
  int fd;
  size_t size;
  uint64_t deadline_ns; /* set by the main thread before the barrier opens */
  pthread_barrier_t *start;
  uint64_t sent;
  uint64_t acked;
  uint64_t end_ns;
  int ok;
};

static void *source_thread(void *p) {
  struct src_arg *a = p;
  uint8_t *buf = hb_map(a->size);
  a->ok = 0;
  if (buf != NULL) memset(buf, 0xa5, a->size);
  pthread_barrier_wait(a->start);
  if (buf == NULL) return NULL;
  uint64_t sent = 0;
  bool failed = false;
  while (bench_now_ns() < a->deadline_ns) {
    if (!hb_write_all(a->fd, buf, a->size)) {
      failed = true;
      break;
    }
    sent += a->size;
  }
  a->sent = sent;
  shutdown(a->fd, SHUT_WR);
  uint8_t ack[8];
  if (!failed && recv_all(a->fd, ack, sizeof(ack)) == 1) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | ack[i];
    a->acked = v;
    a->ok = v == sent;
  }
  a->end_ns = bench_now_ns();
  munmap(buf, a->size);
  return NULL;
}

/* A connection to 127.0.0.1:port; -1 (said). */
static int connect_loopback(uint16_t port) {
  struct sockaddr_in sa = {
      .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) return set_sock_opts(fd), fd;
  hb_say("connect 127.0.0.1:%u: %s\n", port, strerror(errno));
  if (fd >= 0) close(fd);
  return -1;
}

static void csv_row(const struct ref_opts *o, uint64_t iters, uint64_t bytes, double secs, double gbps,
                    const struct bench_stats *s) {
  if (o->csv == NULL) return;
  FILE *f =
      hb_csv(o->csv, "tool,mode,streams,size,iters,bytes,seconds,gbps,avg_us,p50_us,p99_us,min_us,max_us");
  if (f == NULL) return;
  fprintf(f, "tcp-ref,%s,%u,%zu,%" PRIu64 ",%" PRIu64 ",%.6f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f\n",
          o->mode == REF_STREAM ? "stream" : "rtt", o->mode == REF_STREAM ? o->streams : 1, o->size, iters,
          bytes, secs, gbps, s->avg_us, s->p50_us, s->p99_us, s->min_us, s->max_us);
  fclose(f);
}

static int run_stream(const struct ref_opts *o, uint16_t port) {
  struct src_arg args[REF_MAX_STREAMS];
  pthread_t th[REF_MAX_STREAMS];
  pthread_barrier_t start;
  unsigned started = 0;
  int rc = 0;
  pthread_barrier_init(&start, NULL, o->streams + 1);
  for (unsigned i = 0; i < o->streams; i++) {
    int fd = connect_loopback(port);
    if (fd < 0) return 1; /* no thread started yet */
    args[i] = (struct src_arg){.fd = fd, .size = o->size, .start = &start};
  }
  for (unsigned i = 0; i < o->streams; i++) {
    if (pthread_create(&th[i], NULL, source_thread, &args[i]) != 0)
      return hb_say("pthread_create failed\n"), 1;
    started++;
  }
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < o->streams; i++) args[i].deadline_ns = t0 + (uint64_t)(o->seconds * 1e9);
  pthread_barrier_wait(&start);
  uint64_t bytes = 0, t_end = t0;
  for (unsigned i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    close(args[i].fd);
    if (!args[i].ok) {
      hb_say("stream %u: sent %" PRIu64 " bytes, receiver acknowledged %" PRIu64 "\n", i, args[i].sent,
             args[i].acked);
      rc = 1;
    }
    bytes += args[i].sent;
    if (args[i].end_ns > t_end) t_end = args[i].end_ns;
  }
  pthread_barrier_destroy(&start);
  double secs = (double)(t_end - t0) / 1e9;
  double gbps = secs > 0 ? (double)bytes / secs / 1e9 : 0;
  if (!o->quiet)
    printf("tcp stream: %u connection%s, %zu B writes: %" PRIu64 " bytes in %.3f s = %.3f GB/s\n", o->streams,
           o->streams == 1 ? "" : "s", o->size, bytes, secs, gbps);
  struct bench_stats none = {0, 0, 0, 0, 0};
  if (rc == 0) csv_row(o, bytes / o->size, bytes, secs, gbps, &none);
  return rc;
}

static int run_rtt(const struct ref_opts *o, uint16_t port) {
  int fd = connect_loopback(port);
  if (fd < 0) return 1;
  uint8_t *req = hb_map(o->size), *resp = hb_map(o->size);
  uint64_t *lat = calloc(o->iters, sizeof(*lat));
  int rc = 1;
  if (req == NULL || resp == NULL || lat == NULL) goto out;
  memset(req, 0x5a, o->size);
  uint64_t limit = bench_now_ns() + (uint64_t)(o->seconds * 1e9);
  uint64_t n = 0;
  for (uint64_t i = 0; i < o->warmup + o->iters; i++) {
    uint64_t t0 = bench_now_ns();
    if (!hb_write_all(fd, req, o->size) || recv_all(fd, resp, o->size) != 1) {
      hb_say("round trip %" PRIu64 " failed: %s\n", i, strerror(errno));
      goto out;
    }
    uint64_t t1 = bench_now_ns();
    if (i >= o->warmup) lat[n++] = t1 - t0;
    if (t1 > limit) break;
  }
  uint64_t sum = 0;
  for (uint64_t i = 0; i < n; i++) sum += lat[i];
  struct bench_stats s = bench_stats_ns(lat, n);
  if (!o->quiet)
    printf("tcp rtt: %zu B request + %zu B response, %" PRIu64
           " round trips: avg %.2f us, p50 %.2f us, p99 %.2f us, min %.2f us, max %.2f us\n",
           o->size, o->size, n, s.avg_us, s.p50_us, s.p99_us, s.min_us, s.max_us);
  csv_row(o, n, n * o->size * 2, (double)sum / 1e9, 0.0, &s);
  rc = n > 0 ? 0 : 1;
out:
  close(fd);
  free(lat);
  if (req != NULL) munmap(req, o->size);
  if (resp != NULL) munmap(resp, o->size);
  return rc;
}

static struct ref_opts o = {
    .mode = -1, .streams = 1, .seconds = -1, .iters = 20000, .warmup = 1000, .cpu = {-1, -1}};
static const char *const modes[] = {"stream", "rtt", NULL};
static const struct hb_opt opts[] = {
    {"--mode", HB_CHOICE, &o.mode, "stream|rtt", "required", 0, 0, modes},
    {"--size", HB_SIZE, &o.size, "BYTES",
     "bytes per send (stream, default 1M) or per message (rtt, default 64)", 1, 1u << 30, NULL},
    {"--streams", HB_UNS, &o.streams, "N", "connections for stream mode (default 1, max 64)", 1,
     REF_MAX_STREAMS, NULL},
    {"--seconds", HB_DBL, &o.seconds, "S",
     "stream duration (default 3); rtt stops early past it (default 10)", 1e-9, 3600, NULL},
    {"--iters", HB_U64, &o.iters, "N", "rtt round trips measured (default 20000)", 1, 1e8, NULL},
    {"--warmup", HB_U64, &o.warmup, "N", "rtt round trips before measuring (default 1000)", 0, 1e8, NULL},
    {"--pin", HB_PIN, o.cpu, "S,R", "pin the sender process to CPU S and the receiver to CPU R", 0, 0, NULL},
    {"--csv", HB_STR, &o.csv, "FILE", "append one result row (header written when the file is new)", 0, 0,
     NULL},
    {"--quiet", HB_FLAG, &o.quiet, NULL, "no human-readable line", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};
static struct sockaddr_in sa = {.sin_family = AF_INET}; /* the receiver's */

/* The defaults of the mode, and the receiver's socket listening before the fork. */
static int setup(void) {
  socklen_t sl = sizeof(sa);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (o.mode < 0) return hb_usage(stderr, opts, NULL), 2;
  if (o.size == 0) o.size = o.mode == REF_STREAM ? (1u << 20) : 64;
  if (o.seconds <= 0) o.seconds = o.mode == REF_STREAM ? 3.0 : 10.0;
  o.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (o.lfd < 0 || bind(o.lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
      listen(o.lfd, REF_MAX_STREAMS) != 0 || getsockname(o.lfd, (struct sockaddr *)&sa, &sl) != 0)
    hb_die("cannot listen on 127.0.0.1: %s", strerror(errno));
  return 0;
}

static int receiver(int fd) {
  (void)fd;
  return bench_pin_cpu(o.cpu[1]) ? run_receiver(&o, o.lfd) : 1;
}

static int sender(struct hb_peer *p) {
  int rc = 1;
  close(o.lfd);
  if (bench_pin_cpu(o.cpu[0]))
    rc = o.mode == REF_STREAM ? run_stream(&o, ntohs(sa.sin_port)) : run_rtt(&o, ntohs(sa.sin_port));
  if (rc != 0) kill(p->pid, SIGTERM); /* a failed sender may leave the receiver waiting on a socket */
  return rc;
}

const struct hb_test hb_test_tcp_ref = {
    "tcp-ref", "hixl-tcp-ref", "the plain TCP reference: stream GB/s and round trips on 127.0.0.1",
    NULL,      opts,           setup,
    receiver,  sender};
