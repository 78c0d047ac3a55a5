/* hixl-rping: check the fabric before blaming the KV transfer. Probes RPing
 * responders (other hixl-rping --serve processes, or any program that runs
 * HccnRpingInit) with the HccnRping* API and prints, per target, probes sent and
 * received, loss and min / avg / max round-trip time, as a table or as JSON.
 * Exit status: 0 every target answered, 1 a target is unreachable, 2 usage or setup. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hixl/hixl.h"

#define DEFAULT_PORT    13886
#define EXIT_UNREACH    1
#define EXIT_USAGE      2
#define PROGRESS_MIN_MS 2000 /* runs expected to last longer show progress */

struct target {
  char ip[INET_ADDRSTRLEN];
  uint16_t port;
  char name[32]; /* "ip:port" */
};

static struct {
  const char *device;
  uint16_t port;       /* targets' default port; the listening port with --serve */
  uint16_t local_port; /* this process's own responder when probing; 0: a free one */
  uint32_t count, interval_ms, timeout_ms, wait_ms, tc, sl, src_port, payload_len;
  HccnRpingMode mode;
  bool json, quiet, serve;
  struct target *t;
  size_t n, cap;
} opt = {.port = DEFAULT_PORT,
         .count = 10,
         .interval_ms = 10,
         .timeout_ms = 1000,
         .wait_ms = 5000,
         .tc = 132,
         .sl = 4,
         .mode = HCCN_RPING_MODE_UDP};

static void usage(FILE *f) {
  fprintf(f,
          "usage: hixl-rping [options] TARGET[:PORT]...\n"
          "       hixl-rping --serve -d DEVICE [-p PORT]\n"
          "Probe RPing responders over UDP or RoCE and print per-target loss and round-trip times.\n"
          "A target is an IPv4 address where a responder runs (hixl-rping --serve, or any\n"
          "program that called HccnRpingInit); one port per address.\n"
          "\n"
          "  -d, --device DEV       local NIC name or IPv4 address (default: the address that\n"
          "                         routes to the first target)\n"
          "  -p, --port PORT        the targets' responder port (default %d); with --serve,\n"
          "                         the port to answer on (0: a free one, printed)\n"
          "      --local-port PORT  this process's own responder port (default: a free one)\n"
          "  -f, --file FILE        read targets from FILE, one per line, '#' starts a comment\n"
          "                         ('-': standard input)\n"
          "  -c, --count N          probes per target (default 10)\n"
          "  -i, --interval MS      between rounds of probes, 0..10000 (default 10)\n"
          "  -W, --timeout MS       an answer counts if it comes within MS, 1..60000 (default 1000)\n"
          "  -w, --wait MS          how long a target's responder may take to answer the\n"
          "                         handshake, 1..3600000 (default 5000)\n"
          "  -t, --tc TC            IP TOS byte (roce: GRH traffic class) of the probes, 0..255\n"
          "                         (default 132 = DSCP 33)\n"
          "  -s, --sl SL            service level 0..7 (roce only; default 4)\n"
          "  -S, --src-port PORT    UDP source port of the probes (udp only; default: any)\n"
          "  -l, --payload-len N    payload bytes per probe, 0..1500 (roce: up to the MTU less 32;\n"
          "                         default 0)\n"
          "  -m, --mode MODE        udp (default) or roce: RoCE UD probes from the RDMA device\n"
          "                         that owns DEV's address, to targets that serve with -m roce\n"
          "      --json             JSON instead of a table\n"
          "  -q, --quiet            no progress on standard error\n"
          "      --serve            only answer probes, until SIGINT or SIGTERM\n"
          "  -h, --help\n"
          "Exit status: 0 every target answered, 1 a target is unreachable, 2 usage or setup error.\n",
          DEFAULT_PORT);
}

static void die_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "hixl-rping: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(hixl-rping --help for usage)\n");
  exit(EXIT_USAGE);
}

static uint32_t parse_u32(const char *s, const char *what, uint32_t min, uint32_t max) {
  char *end;
  unsigned long v;
  errno = 0;
  v = strtoul(s, &end, 10);
  if (!*s || *s == '-' || *end || errno || v < min || v > max) {
    char msg[128];
    snprintf(msg, sizeof(msg), "%s \"%%s\" is not a number in [%u,%u]", what, min, max);
    die_usage(msg, s);
  }
  return (uint32_t)v;
}

static void add_target(const char *text) {
  char ip[64];
  const char *colon = strchr(text, ':');
  size_t iplen = colon ? (size_t)(colon - text) : strlen(text);
  struct in_addr a;
  struct target *t;

  if (iplen == 0 || iplen >= sizeof(ip)) die_usage("target \"%s\" is not IP[:PORT]", text);
  memcpy(ip, text, iplen);
  ip[iplen] = '\0';
  if (inet_pton(AF_INET, ip, &a) != 1) die_usage("target \"%s\" is not an IPv4 address", text);
  for (size_t i = 0; i < opt.n; i++)
    if (strcmp(opt.t[i].ip, ip) == 0) {
      fprintf(stderr, "hixl-rping: %s is listed twice; probing it once (one port per address)\n", ip);
      return;
    }
  if (opt.n == opt.cap) {
    opt.cap = opt.cap ? opt.cap * 2 : 16;
    opt.t = realloc(opt.t, opt.cap * sizeof(*opt.t));
    if (!opt.t) {
      fprintf(stderr, "hixl-rping: out of memory\n");
      exit(EXIT_USAGE);
    }
  }
  t = &opt.t[opt.n++];
  inet_ntop(AF_INET, &a, t->ip, sizeof(t->ip));
  t->port = colon ? (uint16_t)parse_u32(colon + 1, "target port", 1, 65535) : 0;
}

static void read_file(const char *path) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
  char line[256];
  if (!f) {
    fprintf(stderr, "hixl-rping: cannot open %s: %s\n", path, strerror(errno));
    exit(EXIT_USAGE);
  }
  while (fgets(line, sizeof(line), f)) {
    char *p = line, *e;
    if ((e = strchr(p, '#'))) *e = '\0';
    while (*p == ' ' || *p == '\t') p++;
    for (e = p + strlen(p); e > p && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t');)
      *--e = '\0';
    if (*p) add_target(p);
  }
  if (f != stdin) fclose(f);
}

static void parse_args(int argc, char **argv) {
  enum { OPT_JSON = 256, OPT_SERVE, OPT_LOCAL_PORT };
  static const struct option longs[] = {{"device", required_argument, NULL, 'd'},
                                        {"port", required_argument, NULL, 'p'},
                                        {"local-port", required_argument, NULL, OPT_LOCAL_PORT},
                                        {"file", required_argument, NULL, 'f'},
                                        {"count", required_argument, NULL, 'c'},
                                        {"interval", required_argument, NULL, 'i'},
                                        {"timeout", required_argument, NULL, 'W'},
                                        {"wait", required_argument, NULL, 'w'},
                                        {"tc", required_argument, NULL, 't'},
                                        {"sl", required_argument, NULL, 's'},
                                        {"src-port", required_argument, NULL, 'S'},
                                        {"payload-len", required_argument, NULL, 'l'},
                                        {"mode", required_argument, NULL, 'm'},
                                        {"json", no_argument, NULL, OPT_JSON},
                                        {"quiet", no_argument, NULL, 'q'},
                                        {"serve", no_argument, NULL, OPT_SERVE},
                                        {"help", no_argument, NULL, 'h'},
                                        {NULL, 0, NULL, 0}};
  int c;

  while ((c = getopt_long(argc, argv, "d:p:f:c:i:W:w:t:s:S:l:m:qh", longs, NULL)) != -1) {
    switch (c) {
    case 'd': opt.device = optarg; break;
    case 'p': opt.port = (uint16_t)parse_u32(optarg, "port", 0, 65535); break;
    case OPT_LOCAL_PORT: opt.local_port = (uint16_t)parse_u32(optarg, "local port", 1, 65535); break;
    case 'f': read_file(optarg); break;
    case 'c': opt.count = parse_u32(optarg, "count", 1, 1000000); break;
    case 'i': opt.interval_ms = parse_u32(optarg, "interval", 0, 10000); break;
    case 'W': opt.timeout_ms = parse_u32(optarg, "timeout", 1, 60000); break;
    case 'w': opt.wait_ms = parse_u32(optarg, "wait", 1, HCCN_RPING_ADD_TIMEOUT_MAX); break;
    case 't': opt.tc = parse_u32(optarg, "tc", 0, 255); break;
    case 's': opt.sl = parse_u32(optarg, "sl", 0, 7); break;
    case 'S': opt.src_port = parse_u32(optarg, "source port", 0, 65535); break;
    case 'l': opt.payload_len = parse_u32(optarg, "payload length", 0, HCCN_RPING_PAYLOAD_LEN_MAX); break;
    case 'm':
      if (strcmp(optarg, "udp") == 0)
        opt.mode = HCCN_RPING_MODE_UDP;
      else if (strcmp(optarg, "roce") == 0)
        opt.mode = HCCN_RPING_MODE_ROCE;
      else
        die_usage("mode \"%s\" is not udp or roce", optarg);
      break;
    case OPT_JSON: opt.json = true; break;
    case 'q': opt.quiet = true; break;
    case OPT_SERVE: opt.serve = true; break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(EXIT_USAGE);
    }
  }
  for (int i = optind; i < argc; i++) add_target(argv[i]);
  if (opt.serve && opt.n > 0) die_usage("%s", "--serve takes no targets");
  if (opt.serve && !opt.device) die_usage("%s", "--serve needs --device");
  if (!opt.serve && opt.n == 0) die_usage("%s", "no targets (give TARGET arguments or --file)");
  if (!opt.serve && opt.port == 0) die_usage("%s", "--port 0 only makes sense with --serve");
  for (size_t i = 0; i < opt.n; i++) {
    if (!opt.t[i].port) opt.t[i].port = opt.port;
    snprintf(opt.t[i].name, sizeof(opt.t[i].name), "%s:%u", opt.t[i].ip, opt.t[i].port);
  }
}

/* The local address a datagram to ip would leave from. */
static bool route_source(const char *ip, char *out, size_t len) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9)};
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bool ok = false;
  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    ok = inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)len) != NULL;
  if (fd >= 0) close(fd);
  return ok;
}

/* A UDP port free on the device's address right now (device is an address or NIC
 * name; for a NIC name, any address will do to find a free port). */
static uint16_t free_port(const char *ip) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int fail(const char *what, HccnResult r) {
  fprintf(stderr, "hixl-rping: %s: %s: %s\n", what, HccnResultName(r), HixlGetLastErrorMessage());
  return EXIT_USAGE;
}

static int serve(void) {
  HccnRpingInitAttr a = {
      .mode = opt.mode, .port = opt.port, .npuNum = 1, .bufferSize = 4096, .sl = opt.sl, .tc = opt.tc};
  HccnRpingCtx ctx;
  sigset_t set;
  HccnResult r;
  int sig;

  if (a.port == 0 && (a.port = free_port(opt.device)) == 0) {
    fprintf(stderr, "hixl-rping: found no free UDP port on %s\n", opt.device);
    return EXIT_USAGE;
  }
  /* Block the signals before the responder thread starts, so that sigwait gets them. */
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  if ((r = HccnRpingInit(opt.device, &a, &ctx)) != HCCN_SUCCESS) return fail("HccnRpingInit", r);
  printf("ready %s port %u\n", opt.device, a.port); /* scripts wait for this line */
  fflush(stdout);
  if (!opt.quiet)
    fprintf(stderr, "hixl-rping: answering probes on %s port %u until SIGINT or SIGTERM\n", opt.device,
            a.port);
  sigwait(&set, &sig);
  if ((r = HccnRpingDeinit(ctx)) != HCCN_SUCCESS) return fail("HccnRpingDeinit", r);
  return 0;
}

/* ---- output ---- */

static bool reachable(const HccnRpingResultInfo *r) {
  return r->state == HCCN_RPING_RESULT_STATE_VALID && r->rxPkt > 0;
}

static const char *status_of(const HccnRpingResultInfo *r) {
  if (r->state == HCCN_RPING_RESULT_STATE_NOT_FOUND) return "no responder";
  if (r->state != HCCN_RPING_RESULT_STATE_VALID) return "not probed";
  if (r->rxPkt == 0) return "no answer";
  return r->rxPkt == r->txPkt ? "ok" : "loss";
}

static double loss_pct(const HccnRpingResultInfo *r) {
  return r->txPkt ? 100.0 * (double)(r->txPkt - r->rxPkt) / r->txPkt : 100.0;
}

static void print_table(const HccnRpingResultInfo *res, const char *device) {
  if (opt.mode == HCCN_RPING_MODE_ROCE)
    printf("# from %s over RoCE: %u probe%s per target, %u ms apart, answers within %u ms, tc %u, sl %u\n",
           device, opt.count, opt.count == 1 ? "" : "s", opt.interval_ms, opt.timeout_ms, opt.tc, opt.sl);
  else
    printf("# from %s: %u probe%s per target, %u ms apart, answers within %u ms, tc %u\n", device, opt.count,
           opt.count == 1 ? "" : "s", opt.interval_ms, opt.timeout_ms, opt.tc);
  printf("%-21s %7s %7s %7s %9s %9s %9s  %s\n", "target", "sent", "recv", "loss%", "min_us", "avg_us",
         "max_us", "status");
  for (size_t i = 0; i < opt.n; i++) {
    const HccnRpingResultInfo *r = &res[i];
    if (r->rxPkt)
      printf("%-21s %7u %7u %7.1f %9u %9u %9u  %s\n", opt.t[i].name, r->txPkt, r->rxPkt, loss_pct(r),
             r->minRTT, r->avgRTT, r->maxRTT, status_of(r));
    else
      printf("%-21s %7u %7u %7.1f %9s %9s %9s  %s\n", opt.t[i].name, r->txPkt, r->rxPkt, loss_pct(r), "-",
             "-", "-", status_of(r));
  }
}

static void print_json(const HccnRpingResultInfo *res, const char *device) {
  static const char *const states[] = {"not_found", "invalid", "valid"};
  printf("{\"device\": \"%s\", \"mode\": \"%s\", \"count\": %u, \"interval_ms\": %u, \"timeout_ms\": %u, "
         "\"tc\": %u, \"sl\": %u, \"payload_len\": %u, \"targets\": [",
         device, opt.mode == HCCN_RPING_MODE_ROCE ? "roce" : "udp", opt.count, opt.interval_ms,
         opt.timeout_ms, opt.tc, opt.sl, opt.payload_len);
  for (size_t i = 0; i < opt.n; i++) {
    const HccnRpingResultInfo *r = &res[i];
    printf(
        "%s\n  {\"target\": \"%s\", \"state\": \"%s\", \"reachable\": %s, \"status\": \"%s\", \"sent\": %u, "
        "\"received\": %u, \"loss_pct\": %.1f, \"rtt_us\": ",
        i ? "," : "", opt.t[i].name, (unsigned)r->state < 3 ? states[r->state] : "unknown",
        reachable(r) ? "true" : "false", status_of(r), r->txPkt, r->rxPkt, loss_pct(r));
    if (r->rxPkt)
      printf("{\"min\": %u, \"avg\": %u, \"max\": %u}}", r->minRTT, r->avgRTT, r->maxRTT);
    else
      printf("null}");
  }
  printf("\n]}\n");
}

/* ---- probing ---- */

static int probe(void) {
  HccnRpingTargetInfo *ti = calloc(opt.n, sizeof(*ti));
  HccnRpingResultInfo *res = calloc(opt.n, sizeof(*res));
  HccnRpingAddTargetConfig cfg = {.connectTimeout = opt.wait_ms}, one_ms = {.connectTimeout = 1};
  HccnRpingInitAttr a = {.mode = opt.mode, .sl = opt.sl, .tc = opt.tc};
  char device[INET_ADDRSTRLEN + 16];
  HccnRpingCtx ctx = NULL;
  uint64_t need;
  int64_t t0, expect_ms, last_shown = 0;
  bool progress, shown = false, tty = isatty(STDERR_FILENO);
  int rc = EXIT_USAGE;
  size_t added = 0;
  HccnResult r;

  if (!ti || !res) {
    fprintf(stderr, "hixl-rping: out of memory\n");
    goto free_all;
  }
  if (opt.device) {
    snprintf(device, sizeof(device), "%s", opt.device);
  } else if (!route_source(opt.t[0].ip, device, sizeof(device))) {
    fprintf(stderr, "hixl-rping: no route to %s; name the local device with --device\n", opt.t[0].ip);
    goto free_all;
  }
  need = (uint64_t)opt.count * HCCN_RPING_BUFFER_PER_PACKET * opt.n + 1;
  need = (need + HCCN_RPING_BUFFER_ALIGN - 1) / HCCN_RPING_BUFFER_ALIGN * HCCN_RPING_BUFFER_ALIGN;
  if (need > UINT32_MAX || opt.n > 65536) {
    fprintf(stderr, "hixl-rping: %zu targets x %u probes is too many for one batch; send fewer\n", opt.n,
            opt.count);
    goto free_all;
  }
  a.bufferSize = (uint32_t)need;
  a.npuNum = (uint32_t)opt.n;
  a.port = opt.local_port ? opt.local_port : free_port(device);
  if ((r = HccnRpingInit(device, &a, &ctx)) != HCCN_SUCCESS) {
    rc = fail("HccnRpingInit", r);
    goto free_all;
  }
  for (size_t i = 0; i < opt.n; i++) {
    ti[i].dstIp = opt.t[i].ip;
    ti[i].port = opt.t[i].port;
    ti[i].srcPort = opt.src_port;
    ti[i].tc = opt.tc;
    ti[i].sl = opt.sl;
    ti[i].payloadLen = opt.payload_len;
    for (uint32_t k = 0; k < opt.payload_len; k++) ti[i].payload[k] = (char)('a' + k % 26);
  }

  /* Handshake in groups of 16; a target that does not answer is reported, not fatal.
   * The note: on a terminal a transient line; in a log only when the wait may be long. */
  bool wait_note = !opt.quiet && opt.wait_ms >= PROGRESS_MIN_MS && (tty || opt.wait_ms > 10000);
  if (wait_note)
    fprintf(stderr, "hixl-rping: %zu target%s from %s; waiting up to %.1f s for the responders%s", opt.n,
            opt.n == 1 ? "" : "s", device, opt.wait_ms / 1000.0, tty ? "" : "\n");
  for (size_t i = 0; i < opt.n; i += HCCN_RPING_MAX_ADD_TARGETS) {
    uint32_t k = (uint32_t)(opt.n - i < HCCN_RPING_MAX_ADD_TARGETS ? opt.n - i : HCCN_RPING_MAX_ADD_TARGETS);
    r = HccnRpingAddTargetWithCfg(ctx, k, &ti[i], &cfg);
    if (r == HCCN_SUCCESS) {
      added += k;
      continue;
    }
    if (r != HCCN_E_FAIL) {
      rc = fail("HccnRpingAddTarget", r);
      goto deinit;
    }
    if (!opt.quiet)
      fprintf(stderr, "%shixl-rping: %s\n", wait_note && tty ? "\r\033[K" : "", HixlGetLastErrorMessage());
    /* Which of the group are in: one that answered is a duplicate now and returns at
     * once; one that did not gets one more millisecond. */
    for (uint32_t j = 0; j < k; j++)
      if (HccnRpingAddTargetWithCfg(ctx, 1, &ti[i + j], &one_ms) == HCCN_SUCCESS) added++;
  }
  if (wait_note && tty) fprintf(stderr, "\r\033[K");

  expect_ms = (int64_t)(opt.count - 1) * opt.interval_ms + opt.timeout_ms;
  progress = !opt.quiet && expect_ms >= PROGRESS_MIN_MS;
  if (added == 0) { /* nobody answered the handshake: every row says so */
    for (size_t i = 0; i < opt.n; i++) res[i].state = HCCN_RPING_RESULT_STATE_NOT_FOUND;
    goto report;
  }
  r = HccnRpingBatchPingStart(ctx, opt.count, opt.interval_ms, opt.timeout_ms);
  if (r != HCCN_SUCCESS) {
    rc = fail("HccnRpingBatchPingStart", r);
    goto deinit;
  }
  t0 = now_ms();
  while ((r = HccnRpingGetResult(ctx, (uint32_t)opt.n, ti, res)) == HCCN_E_AGAIN) {
    struct timespec pause = {0, 20000000};
    int64_t el = now_ms() - t0;
    if (progress && (!shown || el - last_shown >= (tty ? 200 : 5000))) {
      fprintf(stderr, "%shixl-rping: probing %zu target%s: %.1f of about %.1f s%s", tty ? "\r" : "", opt.n,
              opt.n == 1 ? "" : "s", el / 1000.0, expect_ms / 1000.0, tty ? "" : "\n");
      last_shown = el;
      shown = true;
    }
    nanosleep(&pause, NULL);
  }
  if (progress && tty && shown) fprintf(stderr, "\r\033[K");
  if (r != HCCN_SUCCESS) {
    rc = fail("HccnRpingGetResult", r);
    goto stop;
  }

report:
  if (opt.json)
    print_json(res, device);
  else
    print_table(res, device);
  rc = 0;
  for (size_t i = 0; i < opt.n; i++)
    if (!reachable(&res[i])) rc = EXIT_UNREACH;
stop:
  HccnRpingBatchPingStop(ctx);
deinit:
  HccnRpingDeinit(ctx);
free_all:
  free(ti);
  free(res);
  return rc;
}

int main(int argc, char **argv) {
  int rc;
  parse_args(argc, argv);
  rc = opt.serve ? serve() : probe();
  free(opt.t);
  return rc;
}
