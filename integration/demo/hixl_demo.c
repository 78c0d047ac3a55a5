/* hixl-demo: the main job until the plugin exists. The process forks: the child is a
 * target engine listening on 127.0.0.1:PORT with one registered buffer; the parent
 * is the initiator. It WRITEs a seeded random pattern into the child's memory, READs
 * it back into a second region, compares byte for byte, and sends a notify; the child
 * checks the pattern landed in its own buffer and reports over a pipe. Exit status 0
 * only when every step verified. Readiness goes over the pipe, never by sleeping. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#include "hixl/hixl.h"

#define DEMO_NOTIFY_NAME        "hixl-demo"
#define DEMO_TARGET_MAX_WAIT_MS (10 * 60 * 1000) /* child gives up after this */
#define DEMO_LINE_MAX           4096

struct demo_opts {
  size_t size;        /* bytes moved each way */
  size_t block;       /* bytes per op */
  size_t batch;       /* ops per HixlEngineTransferSync call */
  uint16_t port;      /* target's port; 0 picks a free one */
  uint64_t seed;      /* pattern seed */
  int32_t timeout_ms; /* per transfer call; 0 derives it from the batch size */
  bool quiet;         /* only the summary */
};

static const char *g_prog = "hixl-demo";

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [options]\n"
          "  One process WRITEs a seeded random pattern into another process's registered\n"
          "  memory on 127.0.0.1 (Transport auto: shm on one host), READs it back, verifies it byte for byte "
          "and\n"
          "  sends a notify the other side must receive. Exit 0 only if all verified.\n"
          "options:\n"
          "  --size BYTES      bytes to move each way (default 256M; K, M, G suffixes)\n"
          "  --block BYTES     bytes per op (default 4M)\n"
          "  --batch N         ops per TransferSync call (default 16)\n"
          "  --port PORT       target port on 127.0.0.1 (default: a free port)\n"
          "  --seed N          pattern seed (default 1)\n"
          "  --timeout-ms MS   per transfer call (default: from the batch size, >= 10 s)\n"
          "  --quiet           print only the summary\n"
          "  --help\n",
          g_prog);
}

static bool parse_u64(const char *s, uint64_t *out) {
  char *end = NULL;
  if (s == NULL || *s == '\0' || *s == '-') return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0') return false;
  *out = (uint64_t)v;
  return true;
}

/* Returns true when buf holds the pattern; otherwise *bad is the first bad offset. */
static bool pattern_check(const uint8_t *buf, size_t len, uint64_t seed, size_t *bad) {
  size_t words = len / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = bench_pattern_word(seed, i);
    if (memcmp(buf + i * 8, &w, 8) != 0) {
      for (size_t b = 0; b < 8; b++)
        if (buf[i * 8 + b] != ((const uint8_t *)&w)[b]) {
          *bad = i * 8 + b;
          return false;
        }
    }
  }
  if (len % 8 != 0) {
    uint64_t w = bench_pattern_word(seed, words);
    for (size_t b = 0; b < len % 8; b++)
      if (buf[words * 8 + b] != ((const uint8_t *)&w)[b]) {
        *bad = words * 8 + b;
        return false;
      }
  }
  return true;
}

static bool first_diff(const uint8_t *a, const uint8_t *b, size_t len, size_t *bad) {
  if (memcmp(a, b, len) == 0) return false;
  for (size_t i = 0; i < len; i++)
    if (a[i] != b[i]) {
      *bad = i;
      return true;
    }
  return false;
}

static void report_hixl(const char *who, const char *what, HixlStatus st) {
  const char *why = HixlGetLastErrorMessage();
  fprintf(stderr, "%s: %s: %s failed: %s (%s)%s%s\n", g_prog, who, what, HixlStatusName(st),
          HixlStatusString(st), (why != NULL && *why != '\0') ? ": " : "", (why != NULL) ? why : "");
}

static void *map_buffer(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Bind 127.0.0.1:0 and keep the port the kernel chose, held until this program exits:
 * the socket stays bound with SO_REUSEADDR and never listens, so nobody else takes the
 * port before the target's engine (SO_REUSEADDR too) listens there. */
static bool pick_port(uint16_t *port) {
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    if (fd >= 0) close(fd);
    return false;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  bool ok =
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0;
  if (!ok) close(fd); /* else kept open: the hold */
  if (ok) *port = ntohs(sa.sin_port);
  return ok;
}

static bool write_all(int fd, const char *s) {
  size_t len = strlen(s);
  while (len > 0) {
    ssize_t n = write(fd, s, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s += n;
    len -= (size_t)n;
  }
  return true;
}

static double gbps(size_t bytes, uint64_t ns) { return ns == 0 ? 0.0 : (double)bytes / (double)ns; }

static int32_t call_timeout(const struct demo_opts *o, size_t bytes) {
  if (o->timeout_ms > 0) return o->timeout_ms;
  /* Generous: 10 s plus 1 s per 100 MB, so a slow machine is not a false failure. */
  uint64_t ms = 10000u + bytes / 100000u;
  return ms > INT32_MAX ? INT32_MAX : (int32_t)ms;
}

/* ---------------------------------------------------------------- target (child) */

static int target_fail(int to_parent, const char *what) {
  char line[DEMO_LINE_MAX];
  /* Cut the reason so "ERROR " and the newline always fit. */
  snprintf(line, sizeof(line), "ERROR %.*s\n", (int)(sizeof(line) - 8), what);
  write_all(to_parent, line);
  return 1;
}

/* Wait for the demo's notify, or the parent's pipe closing, within a bound. */
static int target_wait_notify(HixlEngine *eng, int from_parent, char *name, size_t name_cap, char *msg,
                              size_t msg_cap, char *from, size_t from_cap) {
  uint64_t deadline = bench_now_ns() + (uint64_t)DEMO_TARGET_MAX_WAIT_MS * 1000000ull;
  while (bench_now_ns() < deadline) {
    HixlNotifyDesc *nd = NULL;
    size_t count = 0;
    HixlStatus st = HixlEngineGetNotifies(eng, &nd, &count);
    if (st != HIXL_SUCCESS) {
      report_hixl("target", "HixlEngineGetNotifies", st);
      return -1;
    }
    bool found = false;
    for (size_t i = 0; i < count && !found; i++) {
      if (nd[i].name != NULL && strcmp(nd[i].name, DEMO_NOTIFY_NAME) == 0) {
        snprintf(name, name_cap, "%s", nd[i].name);
        snprintf(msg, msg_cap, "%s", nd[i].msg != NULL ? nd[i].msg : "");
        snprintf(from, from_cap, "%s", nd[i].remote_engine != NULL ? nd[i].remote_engine : "?");
        found = true;
      }
    }
    HixlEngineFreeNotifies(nd);
    if (found) return 0;
    /* Sleep on the parent's pipe: EOF there means the parent gave up. */
    struct pollfd pfd = {.fd = from_parent, .events = POLLIN};
    if (poll(&pfd, 1, 1) > 0) {
      char c;
      if (read(from_parent, &c, 1) <= 0) return -1;
    }
  }
  return -1;
}

static int run_target(const struct demo_opts *o, int to_parent, int from_parent) {
  char line[DEMO_LINE_MAX];
  char addr[64];
  int rc = 1;
  HixlEngine *eng = NULL;
  HixlMemHandle mh = NULL;
  HixlStatus st;

  uint8_t *buf = map_buffer(o->size);
  if (buf == NULL) {
    snprintf(line, sizeof(line), "target cannot map %zu bytes: %s", o->size, strerror(errno));
    return target_fail(to_parent, line);
  }
  memset(buf, 0, o->size);

  snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)o->port);
  st = HixlEngineCreate(&eng);
  if (st != HIXL_SUCCESS) {
    report_hixl("target", "HixlEngineCreate", st);
    target_fail(to_parent, "HixlEngineCreate failed");
    goto out_unmap;
  }
  st = HixlEngineInitialize(eng, addr, NULL, 0);
  if (st != HIXL_SUCCESS) {
    report_hixl("target", "HixlEngineInitialize", st);
    snprintf(line, sizeof(line), "HixlEngineInitialize(%s) failed: %s", addr, HixlGetLastErrorMessage());
    target_fail(to_parent, line);
    goto out_destroy;
  }
  HixlMemDesc md = {.addr = (uintptr_t)buf, .len = o->size};
  st = HixlEngineRegisterMem(eng, &md, HIXL_MEM_HOST, &mh);
  if (st != HIXL_SUCCESS) {
    report_hixl("target", "HixlEngineRegisterMem", st);
    snprintf(line, sizeof(line), "HixlEngineRegisterMem failed: %s", HixlGetLastErrorMessage());
    target_fail(to_parent, line);
    goto out_finalize;
  }

  snprintf(line, sizeof(line), "READY %" PRIxPTR " %zu\n", (uintptr_t)buf, o->size);
  if (!write_all(to_parent, line)) goto out_dereg;

  char name[HIXL_MAX_NOTIFY_LEN + 1], msg[HIXL_MAX_NOTIFY_LEN + 1], from[256];
  if (target_wait_notify(eng, from_parent, name, sizeof(name), msg, sizeof(msg), from, sizeof(from)) != 0) {
    target_fail(to_parent, "no notify received");
    goto out_dereg;
  }

  /* The notify carries the seed; check the WRITE really landed in this process. */
  uint64_t seed = 0;
  size_t size = 0;
  bool parsed = sscanf(msg, "seed=%" SCNu64 " size=%zu", &seed, &size) == 2 && size == o->size;
  size_t bad = 0;
  uint64_t t0 = bench_now_ns();
  bool good = parsed && pattern_check(buf, o->size, seed, &bad);
  uint64_t check_ns = bench_now_ns() - t0;
  snprintf(line, sizeof(line),
           "NOTIFY from=%s name=%s msg=[%s] target_check=%s bad_offset=%zd check_ms=%.1f\n", from, name, msg,
           good ? "ok" : (parsed ? "mismatch" : "unparsed"), good ? (ssize_t)-1 : (ssize_t)bad,
           (double)check_ns / 1e6);
  write_all(to_parent, line);
  rc = good ? 0 : 1;

  /* Stay up until the parent has disconnected and closed the pipe (bounded). */
  while (bench_read_line(from_parent, line, sizeof(line), DEMO_TARGET_MAX_WAIT_MS) == 1) {
  }

out_dereg:
  st = HixlEngineDeregisterMem(eng, mh);
  if (st != HIXL_SUCCESS) {
    report_hixl("target", "HixlEngineDeregisterMem", st);
    rc = 1;
  }
out_finalize:
  st = HixlEngineFinalize(eng);
  if (st != HIXL_SUCCESS) {
    report_hixl("target", "HixlEngineFinalize", st);
    rc = 1;
  }
out_destroy:
  HixlEngineDestroy(eng);
out_unmap:
  munmap(buf, o->size);
  return rc;
}

/* ------------------------------------------------------------- initiator (parent) */

/* Move [0, size) between local and remote in ops of o->block, o->batch ops per call. */
static HixlStatus move_all(HixlEngine *eng, const char *remote, HixlTransferOp op, const struct demo_opts *o,
                           uintptr_t local, uintptr_t rbase, HixlTransferOpDesc *descs, size_t *calls) {
  size_t off = 0;
  *calls = 0;
  while (off < o->size) {
    size_t n = 0, bytes = 0;
    while (n < o->batch && off < o->size) {
      size_t len = o->size - off < o->block ? o->size - off : o->block;
      descs[n].local_addr = local + off;
      descs[n].remote_addr = rbase + off;
      descs[n].len = len;
      off += len;
      bytes += len;
      n++;
    }
    HixlStatus st = HixlEngineTransferSync(eng, remote, op, descs, n, call_timeout(o, bytes));
    if (st != HIXL_SUCCESS) return st;
    (*calls)++;
  }
  return HIXL_SUCCESS;
}

static void say(const struct demo_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const struct demo_opts *o, const char *fmt, ...) {
  if (o->quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

static int run_initiator(const struct demo_opts *o, pid_t child, int from_child, int *to_child) {
  char line[DEMO_LINE_MAX];
  char remote[64];
  int rc = 1;
  bool write_ok = false, read_ok = false, notify_ok = false, target_ok = false;
  uint64_t write_ns = 0, read_ns = 0, connect_ns = 0, notify_ns = 0;
  size_t write_calls = 0, read_calls = 0;
  HixlEngine *eng = NULL;
  HixlMemHandle src_h = NULL, dst_h = NULL;
  HixlTransferOpDesc *descs = NULL;
  HixlStatus st;
  uint64_t t_start = bench_now_ns();

  uint8_t *src = map_buffer(o->size);
  uint8_t *dst = map_buffer(o->size);
  descs = calloc(o->batch, sizeof(*descs));
  if (src == NULL || dst == NULL || descs == NULL) {
    fprintf(stderr, "%s: cannot allocate 2 x %zu bytes: %s\n", g_prog, o->size, strerror(errno));
    goto out_free;
  }
  uint64_t t0 = bench_now_ns();
  bench_pattern_fill(src, o->size, o->seed);
  memset(dst, 0, o->size);
  say(o, "initiator: filled %zu bytes with pattern seed %" PRIu64 " in %.1f ms\n", o->size, o->seed,
      (double)(bench_now_ns() - t0) / 1e6);

  /* The child's READY line carries its buffer address. */
  int r = bench_read_line(from_child, line, sizeof(line), 60000);
  uintptr_t rbase = 0;
  size_t rlen = 0;
  if (r != 1 || sscanf(line, "READY %" SCNxPTR " %zu", &rbase, &rlen) != 2) {
    fprintf(stderr, "%s: target did not become ready: %s\n", g_prog,
            r == 1 ? line : (r == 0 ? "it exited" : "no answer within 60 s"));
    goto out_free;
  }
  if (rlen != o->size) {
    fprintf(stderr, "%s: target registered %zu bytes, expected %zu\n", g_prog, rlen, o->size);
    goto out_free;
  }
  snprintf(remote, sizeof(remote), "127.0.0.1:%u", (unsigned)o->port);
  say(o, "target (pid %d): listening on %s, registered %zu bytes at 0x%" PRIxPTR "\n", (int)child, remote,
      rlen, rbase);

  st = HixlEngineCreate(&eng);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineCreate", st);
    goto out_free;
  }
  st = HixlEngineInitialize(eng, "127.0.0.1", NULL, 0);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineInitialize(127.0.0.1)", st);
    goto out_destroy;
  }
  HixlMemDesc smd = {.addr = (uintptr_t)src, .len = o->size};
  HixlMemDesc dmd = {.addr = (uintptr_t)dst, .len = o->size};
  st = HixlEngineRegisterMem(eng, &smd, HIXL_MEM_HOST, &src_h);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineRegisterMem(source)", st);
    goto out_finalize;
  }
  st = HixlEngineRegisterMem(eng, &dmd, HIXL_MEM_HOST, &dst_h);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineRegisterMem(readback)", st);
    goto out_dereg_src;
  }

  t0 = bench_now_ns();
  st = HixlEngineConnect(eng, remote, 5000);
  connect_ns = bench_now_ns() - t0;
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineConnect", st);
    goto out_dereg_dst;
  }
  say(o, "initiator: connected to %s in %.2f ms\n", remote, (double)connect_ns / 1e6);

  t0 = bench_now_ns();
  st = move_all(eng, remote, HIXL_WRITE, o, (uintptr_t)src, rbase, descs, &write_calls);
  write_ns = bench_now_ns() - t0;
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineTransferSync(WRITE)", st);
    goto out_disconnect;
  }
  write_ok = true;
  say(o, "WRITE: %zu bytes in %zu calls (%zu B ops, %zu per call): %.3f s, %.2f GB/s\n", o->size, write_calls,
      o->block, o->batch, (double)write_ns / 1e9, gbps(o->size, write_ns));

  t0 = bench_now_ns();
  st = move_all(eng, remote, HIXL_READ, o, (uintptr_t)dst, rbase, descs, &read_calls);
  read_ns = bench_now_ns() - t0;
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineTransferSync(READ)", st);
    goto out_disconnect;
  }
  say(o, "READ:  %zu bytes in %zu calls (%zu B ops, %zu per call): %.3f s, %.2f GB/s\n", o->size, read_calls,
      o->block, o->batch, (double)read_ns / 1e9, gbps(o->size, read_ns));

  size_t bad = 0;
  t0 = bench_now_ns();
  if (first_diff(src, dst, o->size, &bad)) {
    fprintf(stderr, "%s: READ back differs from what was written at offset %zu (0x%02x, expected 0x%02x)\n",
            g_prog, bad, dst[bad], src[bad]);
  } else {
    read_ok = true;
    say(o, "verify: %zu bytes read back match byte for byte (%.1f ms)\n", o->size,
        (double)(bench_now_ns() - t0) / 1e6);
  }

  char msg[128];
  snprintf(msg, sizeof(msg), "seed=%" PRIu64 " size=%zu", o->seed, o->size);
  HixlNotifyDesc nd = {.name = DEMO_NOTIFY_NAME, .msg = msg, .remote_engine = NULL};
  t0 = bench_now_ns();
  st = HixlEngineSendNotify(eng, remote, &nd, 5000);
  notify_ns = bench_now_ns() - t0;
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineSendNotify", st);
    goto out_disconnect;
  }
  r = bench_read_line(from_child, line, sizeof(line), 60000);
  if (r != 1 || strncmp(line, "NOTIFY ", 7) != 0) {
    fprintf(stderr, "%s: target did not report the notify: %s\n", g_prog,
            r == 1 ? line : (r == 0 ? "it exited" : "no answer within 60 s"));
    goto out_disconnect;
  }
  notify_ok = strstr(line, "name=" DEMO_NOTIFY_NAME " ") != NULL && strstr(line, msg) != NULL;
  target_ok = strstr(line, "target_check=ok") != NULL;
  say(o, "notify: sent {%s, \"%s\"} in %.2f ms; target reports: %s\n", DEMO_NOTIFY_NAME, msg,
      (double)notify_ns / 1e6, line + 7);
  if (!notify_ok) fprintf(stderr, "%s: the target received a different notify: %s\n", g_prog, line);
  if (!target_ok) fprintf(stderr, "%s: the target's own buffer does not hold the written pattern\n", g_prog);

out_disconnect:
  st = HixlEngineDisconnect(eng, remote, 5000);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineDisconnect", st);
    notify_ok = false;
  }
out_dereg_dst:
  st = HixlEngineDeregisterMem(eng, dst_h);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineDeregisterMem(readback)", st);
    notify_ok = false;
  }
out_dereg_src:
  st = HixlEngineDeregisterMem(eng, src_h);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineDeregisterMem(source)", st);
    notify_ok = false;
  }
out_finalize:
  st = HixlEngineFinalize(eng);
  if (st != HIXL_SUCCESS) {
    report_hixl("initiator", "HixlEngineFinalize", st);
    notify_ok = false;
  }
out_destroy:
  HixlEngineDestroy(eng);
out_free:
  /* Closing the pipe lets the target finish; wait for it (bounded). */
  close(*to_child);
  *to_child = -1;
  int wst = 0;
  bool child_ok = false;
  uint64_t wait_deadline = bench_now_ns() + 30ull * 1000000000ull;
  for (;;) {
    pid_t w = waitpid(child, &wst, WNOHANG);
    if (w == child) {
      child_ok = WIFEXITED(wst) && WEXITSTATUS(wst) == 0;
      if (!child_ok)
        fprintf(stderr, "%s: target process %s %d\n", g_prog,
                WIFEXITED(wst) ? "exited with status" : "killed by signal",
                WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
      break;
    }
    if (w < 0 || bench_now_ns() > wait_deadline) {
      fprintf(stderr, "%s: target process did not exit within 30 s; killing it\n", g_prog);
      kill(child, SIGKILL);
      waitpid(child, &wst, 0);
      break;
    }
    struct pollfd pfd = {.fd = from_child, .events = POLLIN};
    if (poll(&pfd, 1, 10) > 0) {
      char c;
      if (read(from_child, &c, 1) <= 0) /* EOF: the child is on its way out */
        (void)poll(NULL, 0, 1);
    }
  }
  free(descs);
  if (dst != NULL) munmap(dst, o->size);
  if (src != NULL) munmap(src, o->size);

  bool all_ok = write_ok && read_ok && notify_ok && target_ok && child_ok;
  double total_s = (double)(bench_now_ns() - t_start) / 1e9;
  printf("hixl-demo %s: %zu bytes, %zu B ops, WRITE %.2f GB/s (%.3f s), READ %.2f GB/s (%.3f s), "
         "total %.2f s: %s\n",
         HixlVersionString(), o->size, o->block, gbps(o->size, write_ns), (double)write_ns / 1e9,
         gbps(o->size, read_ns), (double)read_ns / 1e9, total_s, all_ok ? "verified" : "FAILED");
  rc = all_ok ? 0 : 1;
  return rc;
}

int main(int argc, char **argv) {
  struct demo_opts o = {.size = 256u << 20, .block = 4u << 20, .batch = 16, .seed = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
    uint64_t u = 0;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--quiet") == 0) {
      o.quiet = true;
    } else if (strcmp(a, "--size") == 0 && bench_parse_size(v, &o.size) && o.size > 0) {
      i++;
    } else if (strcmp(a, "--block") == 0 && bench_parse_size(v, &o.block) && o.block > 0) {
      i++;
    } else if (strcmp(a, "--batch") == 0 && parse_u64(v, &u) && u > 0 && u <= HIXL_MAX_BATCH) {
      o.batch = (size_t)u;
      i++;
    } else if (strcmp(a, "--port") == 0 && parse_u64(v, &u) && u > 0 && u < 65536) {
      o.port = (uint16_t)u;
      i++;
    } else if (strcmp(a, "--seed") == 0 && parse_u64(v, &u)) {
      o.seed = u;
      i++;
    } else if (strcmp(a, "--timeout-ms") == 0 && parse_u64(v, &u) && u > 0 && u <= INT32_MAX) {
      o.timeout_ms = (int32_t)u;
      i++;
    } else {
      fprintf(stderr, "%s: bad option or value: %s%s%s\n", g_prog, a, v != NULL ? " " : "",
              v != NULL ? v : "");
      usage(stderr);
      return 2;
    }
  }
  if (o.port == 0 && !pick_port(&o.port)) {
    fprintf(stderr, "%s: cannot find a free port on 127.0.0.1: %s\n", g_prog, strerror(errno));
    return 1;
  }

  /* The two processes prove the same key when they link (AuthKeyFile from
   * HIXL_AUTH_KEY_FILE, docs/security.md); without one given, a key made for the run. */
  char key[128] = "";
  if (!getenv("HIXL_AUTH_KEY_FILE") &&
      (bench_key_file(key, sizeof(key), g_prog) != 0 || setenv("HIXL_AUTH_KEY_FILE", key, 1) != 0))
    return 1;
  int up[2], down[2]; /* up: child -> parent; down: parent -> child */
  if (pipe2(up, O_CLOEXEC) != 0 || pipe2(down, O_CLOEXEC) != 0) {
    fprintf(stderr, "%s: pipe: %s\n", g_prog, strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "%s: fork: %s\n", g_prog, strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    int rc = run_target(&o, up[1], down[0]);
    fflush(NULL);
    _exit(rc);
  }
  close(up[1]);
  close(down[0]);
  int rc = run_initiator(&o, pid, up[0], &down[1]);
  close(up[0]);
  if (key[0]) unlink(key);
  return rc;
}
