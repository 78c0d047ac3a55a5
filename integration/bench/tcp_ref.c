/* hixl-tcp-ref: the plain TCP reference hixl-bench is compared with, on 127.0.0.1 in the same
 * run (docs/performance.md): --mode stream, --streams threads each send()ing --size bytes for
 * --seconds (GB/s over all; the receiver acknowledges the byte count at EOF, so the time
 * includes the drain), or --mode rtt, --size byte request and response (latency), or --mode
 * answered, --size byte messages, at most --window of them unanswered, each answered by the
 * receiver with its count (8 bytes) once it has it whole: the kernel's ceiling for a WRITE that
 * ends when the target holds its data, as hixl's does (docs/performance-peers.md). TCP_NODELAY
 * on every socket. The receiver is the test's server; one host: the counts go in host order. */
#include <inttypes.h>
#include <netinet/tcp.h>
#include <pthread.h>

#include "harness.h"

#define REF_MAX_STREAMS       64
#define REF_ACCEPT_TIMEOUT_MS 10000
#define REF_IO_TIMEOUT_S      30 /* SO_RCVTIMEO / SO_SNDTIMEO: no call blocks forever */
#define REF_CSV_HEADER                                                                                       \
  "tool,mode,streams,size,iters,bytes,seconds,gbps,"                                                         \
  "avg_us,p50_us,p99_us,min_us,max_us"

enum ref_mode { REF_STREAM, REF_RTT, REF_ANSWERED };
static const char *const modes[] = {"stream", "rtt", "answered", NULL};

static struct {
  int mode;              /* enum ref_mode */
  size_t size;           /* bytes per send() (stream) or per message (rtt, answered) */
  unsigned streams;      /* connections (stream) */
  unsigned window;       /* messages unanswered at most (answered) */
  double seconds;        /* stream and answered duration; rtt upper bound */
  uint64_t iters;        /* rtt round trips measured */
  uint64_t warmup;       /* rtt round trips not measured */
  const char *csv;       /* append a row here */
  int cpu[2];            /* --pin: sender, receiver; -1 none */
  int lfd;               /* the receiver's listening socket */
  struct sockaddr_in sa; /* ... and its address */
} o = {.mode = -1, .streams = 1, .window = 1, .seconds = -1, .iters = 20000, .warmup = 1000, .cpu = {-1, -1}};

/* One connection, each side's thread: its socket and what it measured. */
struct conn {
  int fd;
  uint64_t sent, acked, end_ns; /* stream: bytes; answered: messages */
  uint64_t *lat, n;             /* rtt: the round trips measured */
  bool ok;
};
static pthread_barrier_t start; /* the sender's threads start together */
static uint64_t deadline_ns;    /* set by the sender's main thread before the barrier opens */

static void set_sock_opts(int fd) {
  int one = 1;
  struct timeval tv = {.tv_sec = REF_IO_TIMEOUT_S, .tv_usec = 0};
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* The receiver's side of a connection: stream: drain to EOF and acknowledge the byte
 * count; rtt: echo each message until EOF; answered: answer each with the count so far. */
static void *sink_thread(void *p) {
  struct conn *a = p;
  uint8_t *buf = hb_map(o.size);
  ssize_t n;
  if (buf == NULL) return NULL;
  if (o.mode == REF_STREAM) {
    while ((n = recv(a->fd, buf, o.size, 0)) != 0) {
      if (n < 0 && errno != EINTR) goto out;
      a->acked += n > 0 ? (uint64_t)n : 0;
    }
    a->ok = hb_write_all(a->fd, &a->acked, sizeof(a->acked));
  } else { /* each message whole: answered with the count so far, or (rtt) echoed */
    bool echo = o.mode == REF_RTT;
    while ((n = recv(a->fd, buf, o.size, MSG_WAITALL)) == (ssize_t)o.size)
      if (++a->acked, !hb_write_all(a->fd, echo ? (void *)buf : &a->acked, echo ? o.size : sizeof(a->acked)))
        goto out;
    a->ok = n == 0; /* the sender closed between two messages */
  }
out:
  munmap(buf, o.size);
  return NULL;
}

static int receiver(int ctrl) {
  unsigned n = o.mode == REF_STREAM ? o.streams : 1, started = 0;
  struct conn a[REF_MAX_STREAMS];
  pthread_t th[REF_MAX_STREAMS];
  int rc = bench_pin_cpu(o.cpu[1]) ? 0 : 1;
  (void)ctrl;
  for (; started < n && rc == 0; started++) {
    struct pollfd pfd = {.fd = o.lfd, .events = POLLIN};
    int r = poll(&pfd, 1, REF_ACCEPT_TIMEOUT_MS);
    a[started] = (struct conn){.fd = r > 0 ? accept4(o.lfd, NULL, NULL, SOCK_CLOEXEC) : -1};
    if (a[started].fd < 0) {
      if (r > 0) hb_say("receiver: accept: %s\n", strerror(errno));
      if (r <= 0) hb_say("receiver: no connection within %d ms\n", REF_ACCEPT_TIMEOUT_MS);
      return 1; /* the threads started are in recv(); _exit ends them */
    }
    set_sock_opts(a[started].fd);
    if (pthread_create(&th[started], NULL, sink_thread, &a[started]) != 0) return 1;
  }
  for (unsigned i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    close(a[i].fd);
    rc |= !a[i].ok;
  }
  return rc;
}

/* answered: up to o.window messages out, then whatever answers have come (at least one),
 * until the deadline; then the answers still owed. Each answer is the receiver's count. */
static bool answered(struct conn *a, const uint8_t *buf) {
  uint64_t ans[256];
  size_t part = 0; /* bytes of an answer read so far */
  bool more = true;
  for (;;) {
    more = more && bench_now_ns() < deadline_ns;
    for (; more && a->sent - a->acked < o.window; a->sent++)
      if (!hb_write_all(a->fd, buf, o.size)) return hb_say("send: %s\n", strerror(errno)), false;
    if (a->acked == a->sent) break; /* past the deadline, with nothing owed */
    ssize_t k = recv(a->fd, (uint8_t *)ans + part, sizeof(ans) - part, 0);
    if (k <= 0 && !(k < 0 && errno == EINTR))
      return hb_say("answers: %s\n", k ? strerror(errno) : "EOF"), false;
    part += k > 0 ? (size_t)k : 0;
    size_t whole = part / sizeof(ans[0]);
    if (whole > 0 && ans[whole - 1] != a->acked + whole)
      return hb_say("answer %" PRIu64 " counts %" PRIu64 "\n", a->acked + whole, ans[whole - 1]), false;
    a->acked += whole;
    memmove(ans, ans + whole, part %= sizeof(ans[0]));
  }
  shutdown(a->fd, SHUT_WR);
  return true;
}

/* The sender's side: stream: send until the deadline, then wait for the receiver's
 * count; rtt: warm-up and measured round trips, until the deadline at most; answered: above. */
static void *source_thread(void *p) {
  struct conn *a = p;
  uint8_t *buf = hb_map(o.size);
  if (buf != NULL) memset(buf, o.mode == REF_STREAM ? 0xa5 : 0x5a, o.size);
  pthread_barrier_wait(&start);
  if (buf == NULL) return NULL;
  if (o.mode == REF_STREAM) {
    bool sent_all = true;
    while (bench_now_ns() < deadline_ns && (sent_all = hb_write_all(a->fd, buf, o.size))) a->sent += o.size;
    shutdown(a->fd, SHUT_WR);
    a->ok = sent_all && bench_read_full(a->fd, &a->acked, sizeof(a->acked)) == 0 && a->acked == a->sent;
  } else if (o.mode == REF_ANSWERED) {
    a->ok = answered(a, buf);
  } else {
    for (uint64_t i = 0; i < o.warmup + o.iters; i++) {
      uint64_t t0 = bench_now_ns();
      if (!hb_write_all(a->fd, buf, o.size) || bench_read_full(a->fd, buf, o.size) != 0) {
        hb_say("round trip %" PRIu64 " failed: %s\n", i, strerror(errno));
        goto out;
      }
      uint64_t t1 = bench_now_ns();
      if (i >= o.warmup) a->lat[a->n++] = t1 - t0;
      if (t1 > deadline_ns) break;
    }
    a->ok = a->n > 0;
  }
out:
  a->end_ns = bench_now_ns();
  munmap(buf, o.size);
  return NULL;
}

/* A connection to the receiver; -1 (said). */
static int connect_receiver(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&o.sa, sizeof(o.sa)) == 0) return set_sock_opts(fd), fd;
  hb_say("connect 127.0.0.1:%u: %s\n", ntohs(o.sa.sin_port), strerror(errno));
  if (fd >= 0) close(fd);
  return -1;
}

/* The human line and the CSV row of the run: false when the row could not be written (said). */
static bool report(unsigned n, uint64_t iters, uint64_t bytes, double secs, const struct bench_stats *s) {
  double gbps = o.mode != REF_RTT && secs > 0 ? (double)bytes / secs / 1e9 : 0;
  if (o.mode == REF_STREAM)
    printf("tcp stream: %u connection%s, %zu B writes: %" PRIu64 " bytes in %.3f s = %.3f GB/s\n", n,
           n == 1 ? "" : "s", o.size, bytes, secs, gbps);
  if (o.mode == REF_ANSWERED)
    printf("tcp answered: %zu B messages, at most %u unanswered, each answered with 8 B: %" PRIu64
           " in %.3f s = %.3f GB/s\n",
           o.size, o.window, iters, secs, gbps);
  if (o.mode == REF_RTT)
    printf("tcp rtt: %zu B request + %zu B response, %" PRIu64
           " round trips: avg %.2f us, p50 %.2f us, p99 %.2f us, min %.2f us, max %.2f us\n",
           o.size, o.size, iters, s->avg_us, s->p50_us, s->p99_us, s->min_us, s->max_us);
  FILE *f = o.csv ? hb_csv(o.csv, REF_CSV_HEADER) : NULL;
  if (f == NULL) return !o.csv;
  fprintf(f, "tcp-ref,%s,%u,%zu,%" PRIu64 ",%" PRIu64 ",%.6f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f\n", modes[o.mode],
          n, o.size, iters, bytes, secs, gbps, s->avg_us, s->p50_us, s->p99_us, s->min_us, s->max_us);
  if (fclose(f) == 0) return true;
  hb_say("--csv %s: %s\n", o.csv, strerror(errno));
  return false;
}

static int sender(struct hb_peer *p) {
  unsigned n = o.mode == REF_STREAM ? o.streams : 1;
  struct conn a[REF_MAX_STREAMS];
  pthread_t th[REF_MAX_STREAMS];
  uint64_t *lat = calloc(o.mode == REF_RTT ? o.iters : 1, sizeof(*lat)), bytes = 0, sum = 0;
  int rc = lat && bench_pin_cpu(o.cpu[0]) ? 0 : 1;
  close(o.lfd);
  pthread_barrier_init(&start, NULL, n + 1);
  for (unsigned i = 0; i < n && rc == 0; i++) { /* a failure leaves those started at the barrier */
    a[i] = (struct conn){.fd = connect_receiver(), .lat = lat};
    rc = a[i].fd < 0 || pthread_create(&th[i], NULL, source_thread, &a[i]) != 0;
    if (rc && a[i].fd >= 0) hb_say("pthread_create failed\n");
  }
  if (rc == 0) {
    uint64_t t0 = bench_now_ns(), t_end = t0;
    deadline_ns = t0 + (uint64_t)(o.seconds * 1e9);
    pthread_barrier_wait(&start);
    for (unsigned i = 0; i < n; i++) {
      pthread_join(th[i], NULL);
      close(a[i].fd);
      if (!a[i].ok && o.mode == REF_STREAM)
        hb_say("stream %u: sent %" PRIu64 " bytes, receiver acknowledged %" PRIu64 "\n", i, a[i].sent,
               a[i].acked);
      rc |= !a[i].ok;
      bytes += o.mode == REF_ANSWERED ? a[i].acked * o.size : a[i].sent;
      t_end = a[i].end_ns > t_end ? a[i].end_ns : t_end;
    }
    for (uint64_t i = 0; i < a[0].n; i++) sum += lat[i];
    struct bench_stats s = bench_stats_ns(lat, a[0].n);
    if (rc == 0 && o.mode != REF_RTT) rc = !report(n, bytes / o.size, bytes, (double)(t_end - t0) / 1e9, &s);
    if (rc == 0 && o.mode == REF_RTT) rc = !report(n, a[0].n, a[0].n * o.size * 2, (double)sum / 1e9, &s);
  }
  if (rc != 0) kill(p->pid, SIGTERM); /* a failed sender may leave the receiver waiting on a socket */
  free(lat);
  return rc;
}

static const struct hb_opt opts[] = {
    {"--mode", HB_CHOICE, &o.mode, "stream|rtt|answered", "required", 0, 0, modes},
    {"--size", HB_SIZE, &o.size, "BYTES", "per send (stream, default 1M) or message (64; answered 4K)", 1,
     1 << 30, NULL},
    {"--streams", HB_UNS, &o.streams, "N", "connections (default 1, max 64)", 1, REF_MAX_STREAMS, NULL},
    {"--window", HB_UNS, &o.window, "N", "answered: messages unanswered at most (default 1)", 1, 1u << 20,
     NULL},
    {"--seconds", HB_DBL, &o.seconds, "S", "stream and answered duration (default 3); rtt's limit (10)", 1e-9,
     3600, NULL},
    {"--iters", HB_U64, &o.iters, "N", "rtt round trips measured (default 20000)", 1, 1e8, NULL},
    {"--warmup", HB_U64, &o.warmup, "N", "rtt round trips before measuring (default 1000)", 0, 1e8, NULL},
    {"--pin", HB_PIN, o.cpu, "S,R", "pin the sender process to CPU S and the receiver to CPU R", 0, 0, NULL},
    {"--csv", HB_STR, &o.csv, "FILE", "append one result row (a new file: its header first)", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

/* The defaults of the mode, and the receiver's socket listening before the fork. */
static int setup(void) {
  socklen_t sl = sizeof(o.sa);
  o.sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (o.mode < 0) return hb_say("--mode is required\n"), hb_usage(stderr, opts, NULL), 2;
  if (o.csv && !hb_csv_ready(o.csv, REF_CSV_HEADER)) return 1; /* fails now, not after measuring */
  if (o.size == 0) o.size = o.mode == REF_STREAM ? (1u << 20) : o.mode == REF_RTT ? 64 : 4096;
  if (o.seconds <= 0) o.seconds = o.mode == REF_RTT ? 10.0 : 3.0;
  o.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (o.lfd < 0 || bind(o.lfd, (struct sockaddr *)&o.sa, sizeof(o.sa)) != 0 ||
      listen(o.lfd, REF_MAX_STREAMS) != 0 || getsockname(o.lfd, (struct sockaddr *)&o.sa, &sl) != 0)
    hb_die("cannot listen on 127.0.0.1: %s", strerror(errno));
  return 0;
}

const struct hb_test hb_test_tcp_ref = {
    "tcp-ref", "hixl-tcp-ref", "the plain TCP reference: stream GB/s and round trips on 127.0.0.1",
    NULL,      opts,           setup,
    receiver,  sender};
