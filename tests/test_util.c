/* Helpers shared by the hixl test programs; see test_util.h. */
#include "test_util.h"

#include "devmem/devmem.h"
#include "engine/engine_ext.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "util/sock.h"

/* ---- time ---- */

int64_t tu_now_ms(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tu_thread_ids_named(const char *name, int *tids, int cap) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *t; (t = readdir(d));) {
    char path[300], comm[32] = "";
    if (t->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", t->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* the thread ended meanwhile */
    if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
    if (strcmp(comm, name) != 0) continue;
    if (n < cap) tids[n] = atoi(t->d_name);
    n++;
  }
  closedir(d);
  return n;
}

int tu_threads_named(const char *name) { return tu_thread_ids_named(name, NULL, 0); }

/* Milliseconds left until deadline, clamped to [0, INT32_MAX]. */
static int ms_left(int64_t deadline) {
  int64_t left = deadline - tu_now_ms();

  if (left < 0) return 0;
  return left > INT32_MAX ? INT32_MAX : (int)left;
}

/* ---- loopback addresses ---- */

uint16_t tu_free_port(void) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof(sa);
  uint16_t port = 0;
  int one = 1;
  int fd;

  /* Held, not probed and closed: see tu_free_port in test_util.h. */
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "tu_free_port: socket: %m\n");
    return 0;
  }
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  sa.sin_port = 0;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    fprintf(stderr, "tu_free_port: bind %s:0: %m\n", tu_ip());
    goto close_fd;
  }
  if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    fprintf(stderr, "tu_free_port: getsockname: %m\n");
    goto close_fd;
  }
  return ntohs(sa.sin_port); /* fd stays open: the port is held until exit */
close_fd:
  close(fd);
  return port;
}

const char *tu_ip(void) {
  const char *ip = getenv("HIXL_TEST_IP");
  return ip && *ip ? ip : "127.0.0.1";
}

char *tu_addr(char *buf, size_t len, uint16_t port) {
  snprintf(buf, len, "%s:%u", tu_ip(), (unsigned)port);
  return buf;
}

/* ---- data patterns ---- */

static uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Word i of the pattern of seed. */
static uint64_t pattern_word(uint64_t seed, uint64_t i) {
  return mix64(seed * 0x2545f4914f6cdd1dULL + (i + 1) * 0x9e3779b97f4a7c15ULL);
}

uint64_t tu_rand(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ULL;
  return mix64(*state);
}

void tu_fill(void *buf, size_t len, uint64_t seed) {
  unsigned char *p = buf;
  size_t words = len / 8, i;
  uint64_t w;

  for (i = 0; i < words; i++) {
    w = pattern_word(seed, i);
    memcpy(p + i * 8, &w, 8);
  }
  if (len % 8) {
    w = pattern_word(seed, words);
    memcpy(p + words * 8, &w, len % 8);
  }
}

ptrdiff_t tu_mismatch(const void *a, const void *b, size_t len) {
  const unsigned char *pa = a, *pb = b;
  size_t off = 0, chunk, i;

  /* memcmp in chunks keeps it fast; walk bytes only inside a differing chunk. */
  while (off < len) {
    chunk = len - off < 4096 ? len - off : 4096;
    if (memcmp(pa + off, pb + off, chunk) != 0) {
      for (i = 0; i < chunk; i++)
        if (pa[off + i] != pb[off + i]) return (ptrdiff_t)(off + i);
    }
    off += chunk;
  }
  return -1;
}

ptrdiff_t tu_check_pattern(const void *buf, size_t len, uint64_t seed) {
  const unsigned char *p = buf;
  size_t i, words = len / 8, j;
  uint64_t w;

  for (i = 0; i < words; i++) {
    w = pattern_word(seed, i);
    if (memcmp(p + i * 8, &w, 8) != 0) {
      for (j = 0; j < 8; j++)
        if (p[i * 8 + j] != ((unsigned char *)&w)[j]) return (ptrdiff_t)(i * 8 + j);
    }
  }
  if (len % 8) {
    w = pattern_word(seed, words);
    for (j = 0; j < len % 8; j++)
      if (p[words * 8 + j] != ((unsigned char *)&w)[j]) return (ptrdiff_t)(words * 8 + j);
  }
  return -1;
}

ptrdiff_t tu_check_byte(const void *buf, size_t len, unsigned char c) {
  const unsigned char *p = buf;
  size_t i;

  for (i = 0; i < len; i++)
    if (p[i] != c) return (ptrdiff_t)i;
  return -1;
}

void *tu_alloc_mem(size_t len, bool shared) {
  void *p =
      mmap(NULL, len, PROT_READ | PROT_WRITE, (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);

  if (p == MAP_FAILED) {
    fprintf(stderr, "tu_alloc_mem: mmap %zu bytes: %m\n", len);
    return NULL;
  }
  return p;
}

void tu_free_mem(void *p, size_t len) {
  if (p) munmap(p, len);
}

/* ---- CUnit assertions with detail ---- */

void tu_fail(const char *file, unsigned line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  CU_assertImplementation(CU_FALSE, line, msg, file, "", CU_FALSE);
}

bool tu_status_is(HixlStatus got, HixlStatus want, const char *expr, const char *file, unsigned line) {
  if (got == want) {
    CU_assertImplementation(CU_TRUE, line, expr, file, "", CU_FALSE);
    return true;
  }
  tu_fail(file, line, "%s: got %s (%u), want %s (%u); last error: \"%s\"", expr, HixlStatusName(got),
          (unsigned)got, HixlStatusName(want), (unsigned)want, HixlGetLastErrorMessage());
  return false;
}

bool tu_hccn_is(HccnResult got, HccnResult want, const char *expr, const char *file, unsigned line) {
  if (got == want) {
    CU_assertImplementation(CU_TRUE, line, expr, file, "", CU_FALSE);
    return true;
  }
  tu_fail(file, line, "%s: got %s, want %s; last error: \"%s\"", expr, HccnResultName(got),
          HccnResultName(want), HixlGetLastErrorMessage());
  return false;
}

bool tu_last_error_has(const char *needle, const char *file, unsigned line) {
  const char *msg = HixlGetLastErrorMessage();

  if (msg && strstr(msg, needle)) {
    CU_assertImplementation(CU_TRUE, line, needle, file, "", CU_FALSE);
    return true;
  }
  tu_fail(file, line, "last error \"%s\" does not mention \"%s\"", msg ? msg : "(null)", needle);
  return false;
}

bool tu_same(const void *got, const void *want, size_t len, const char *what, const char *file,
             unsigned line) {
  ptrdiff_t off = tu_mismatch(got, want, len);

  if (off < 0) {
    CU_assertImplementation(CU_TRUE, line, what, file, "", CU_FALSE);
    return true;
  }
  tu_fail(file, line, "%s: first mismatch at offset %td of %zu (got 0x%02x, want 0x%02x)", what, off, len,
          ((const unsigned char *)got)[off], ((const unsigned char *)want)[off]);
  return false;
}

bool tu_pattern_ok(const void *buf, size_t len, uint64_t seed, const char *what, const char *file,
                   unsigned line) {
  ptrdiff_t off = tu_check_pattern(buf, len, seed);

  if (off < 0) {
    CU_assertImplementation(CU_TRUE, line, what, file, "", CU_FALSE);
    return true;
  }
  tu_fail(file, line, "%s: first mismatch with pattern %llu at offset %td of %zu (got 0x%02x)", what,
          (unsigned long long)seed, off, len, ((const unsigned char *)buf)[off]);
  return false;
}

int tu_run_suites(const char *name, CU_SuiteInfo *suites) {
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  if (CU_register_suites(suites) != CUE_SUCCESS) {
    fprintf(stderr, "%s: %s\n", name, CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}

int tu_run_registry(void) {
  unsigned failed;

  CU_basic_set_mode(CU_BRM_VERBOSE);
  if (CU_basic_run_tests() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed() + CU_get_number_of_tests_failed();
  if (failed) CU_basic_show_failures(CU_get_failure_list());
  printf("\n");
  CU_cleanup_registry();
  return failed ? 1 : 0;
}

/* ---- engines ---- */

static struct {
  pthread_mutex_t lock;
  const char *needle;
  char line[512];
  bool echo;
  unsigned hits;
} g_log = {PTHREAD_MUTEX_INITIALIZER, NULL, "", false, 0};

static void log_cb(HixlLogLevel level, const char *msg, void *ctx) {
  (void)level, (void)ctx;
  pthread_mutex_lock(&g_log.lock);
  if (g_log.echo) fprintf(stderr, "[hixl] %s\n", msg);
  if (g_log.needle && strstr(msg, g_log.needle) && g_log.hits++ == 0)
    snprintf(g_log.line, sizeof(g_log.line), "%s", msg);
  pthread_mutex_unlock(&g_log.lock);
}

void tu_log_capture(HixlLogLevel level, bool echo) {
  pthread_mutex_lock(&g_log.lock);
  g_log.echo = echo;
  pthread_mutex_unlock(&g_log.lock);
  HixlSetLogCallback(log_cb, NULL);
  HixlSetLogLevel(level);
}

void tu_log_watch(const char *needle) {
  pthread_mutex_lock(&g_log.lock);
  g_log.needle = needle;
  g_log.line[0] = '\0';
  g_log.hits = 0;
  pthread_mutex_unlock(&g_log.lock);
}

unsigned tu_log_hits(void) {
  pthread_mutex_lock(&g_log.lock);
  unsigned n = g_log.hits;
  pthread_mutex_unlock(&g_log.lock);
  return n;
}

bool tu_log_seen(char *out, size_t cap) {
  pthread_mutex_lock(&g_log.lock);
  bool seen = g_log.line[0] != '\0';
  snprintf(out, cap, "%s", g_log.line);
  g_log.needle = NULL;
  pthread_mutex_unlock(&g_log.lock);
  return seen;
}

static char key_path[64];
static pid_t key_owner;

static void key_remove(void) {
  if (key_owner == getpid()) unlink(key_path);
}

const char *tu_key_file(void) {
  if (key_path[0]) return key_path;
  char path[] = "/tmp/hixl-test-key-XXXXXX";
  int fd = mkstemp(path); /* mode 0600 */
  if (fd < 0) return NULL;
  bool ok = tu_write_all(fd, TU_KEY_HEX "\n", strlen(TU_KEY_HEX) + 1) == 0;
  close(fd);
  if (!ok) {
    unlink(path);
    return NULL;
  }
  snprintf(key_path, sizeof(key_path), "%s", path);
  key_owner = getpid();
  atexit(key_remove);
  return key_path;
}

HixlStatus tu_device_refusal(void) { return devmem_get(NULL, 0) ? HIXL_PARAM_INVALID : HIXL_UNSUPPORTED; }

const char *tu_transport(void) {
  const char *t = getenv("HIXL_TEST_TRANSPORT");

  if (t && *t) return t;
  return getenv("HIXL_REQUIRE_RDMA") ? "rdma" : NULL;
}

HixlEngine *tu_engine_start(const char *local_engine) {
  return tu_engine_start_with(local_engine, tu_transport());
}

HixlEngine *tu_engine_start_with(const char *local_engine, const char *transport) {
  return tu_engine_start_opts(local_engine, transport, NULL, 0);
}

HixlEngine *tu_engine_start_opts(const char *local_engine, const char *transport, const HixlOption *extra,
                                 size_t n_extra) {
  HixlOption opts[16];
  size_t n = 0;
  HixlEngine *e = NULL;
  HixlStatus st;

  if (n_extra > 15) return NULL;
  if (transport) opts[n++] = (HixlOption){.key = "Transport", .value = transport};
  for (size_t i = 0; i < n_extra; i++) opts[n++] = extra[i];
  st = HixlEngineCreate(&e);
  if (st != HIXL_SUCCESS) {
    fprintf(stderr, "HixlEngineCreate: %s: %s\n", HixlStatusName(st), HixlGetLastErrorMessage());
    return NULL;
  }
  st = HixlEngineInitialize(e, local_engine, opts, n);
  if (st != HIXL_SUCCESS) {
    fprintf(stderr, "HixlEngineInitialize(%s, Transport %s, %zu more options): %s: %s\n", local_engine,
            transport ? transport : "auto", n_extra, HixlStatusName(st), HixlGetLastErrorMessage());
    HixlEngineDestroy(e);
    return NULL;
  }
  return e;
}

HixlMemHandle tu_register(HixlEngine *engine, void *addr, size_t len) {
  HixlMemDesc d = {.addr = (uintptr_t)addr, .len = len};
  HixlMemHandle h = NULL;
  HixlStatus st;

  st = HixlEngineRegisterMem(engine, &d, HIXL_MEM_HOST, &h);
  if (st != HIXL_SUCCESS) {
    fprintf(stderr, "HixlEngineRegisterMem(%p, %zu): %s: %s\n", addr, len, HixlStatusName(st),
            HixlGetLastErrorMessage());
    return NULL;
  }
  return h;
}

HixlStatus tu_wait_request(HixlEngine *engine, HixlTransferReq req, int64_t deadline_ms,
                           HixlTransferStatus *final) {
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlStatus st;
  struct timespec pause = {0, 200000}; /* 0.2 ms between polls */

  for (;;) {
    st = HixlEngineGetTransferStatus(engine, req, &ts);
    if (st != HIXL_SUCCESS || ts != HIXL_TRANSFER_WAITING || tu_now_ms() >= deadline_ms) break;
    nanosleep(&pause, NULL);
  }
  *final = ts;
  return st;
}

bool tu_wait_nonzero(const void *buf, size_t len, size_t stride, size_t sample, int64_t deadline_ms) {
  unsigned char got[256];
  if (sample > sizeof(got)) sample = sizeof(got);
  while (tu_now_ms() < deadline_ms) {
    for (size_t off = 0; off < len; off += stride) {
      size_t n = len - off < sample ? len - off : sample;
      struct iovec local = {got, n}, remote = {(unsigned char *)buf + off, n};
      if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)n) return false;
      for (size_t k = 0; k < n; k++)
        if (got[k] != 0) return true;
    }
    sched_yield();
  }
  return false;
}

/* ---- child processes ---- */

static int full_read(int fd, void *buf, size_t len, int64_t deadline) {
  unsigned char *p = buf;
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  ssize_t n;
  int r;

  while (len > 0) {
    r = poll(&pfd, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1; /* error or deadline */
    n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;  /* error or EOF */
    sock_hb_received_any(); /* for ThreadSanitizer: what the other process saw, we sent */
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int tu_write_all(int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  ssize_t n;

  sock_hb_sent_any(); /* for ThreadSanitizer: what the other process does next, follows */
  while (len > 0) {
    n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    sock_hb_sent_any(); /* ... and follows the write's read of buf, which TSan records at the call */
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int tu_read_all(int fd, void *buf, size_t len) {
  unsigned char *p = buf;
  ssize_t n;

  while (len > 0) {
    n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    sock_hb_received_any();
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Fork a child running fn; in the child the pipe ends are fds 3 (up) and 4 (down),
 * extra_fd (when >= 0) is fd 5, and every other fd above 2 is closed. */
static int child_start(tu_child *child, tu_child_fn fn, void *arg, int extra_fd) {
  int up[2], down[2]; /* up: child -> parent, down: parent -> child */
  int first_closed = extra_fd >= 0 ? 6 : 5;
  pid_t pid;
  int rc;

  memset(child, 0, sizeof(*child));
  child->ready_fd = child->ctl_fd = -1;
  if (pipe2(up, O_CLOEXEC) != 0) {
    fprintf(stderr, "tu_child_start: pipe: %m\n");
    return -1;
  }
  if (pipe2(down, O_CLOEXEC) != 0) {
    fprintf(stderr, "tu_child_start: pipe: %m\n");
    goto close_up;
  }
  /* Let the parent's buffered CUnit output leave once, not once per process. */
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) {
    fprintf(stderr, "tu_child_start: fork: %m\n");
    goto close_down;
  }
  if (pid == 0) {
    /* Keep only stdio, the two pipe ends and extra_fd: sockets inherited from the
     * parent's engines must not keep its connections or listeners alive. Park the
     * fds high first so that the moves to 3, 4, 5 cannot clobber each other; dup2
     * clears close-on-exec on the copies. */
    if (dup2(up[1], 1000) < 0 || dup2(down[0], 1001) < 0 || (extra_fd >= 0 && dup2(extra_fd, 1002) < 0))
      _exit(126);
    if (dup2(1000, 3) < 0 || dup2(1001, 4) < 0 || (extra_fd >= 0 && dup2(1002, 5) < 0)) _exit(126);
    syscall(SYS_close_range, (unsigned)first_closed, ~0U, 0U);
    signal(SIGPIPE, SIG_DFL);
    rc = fn(arg, 3, 4);
    _exit(rc);
  }
  close(up[1]);
  close(down[0]);
  child->pid = pid;
  child->ready_fd = up[0];
  child->ctl_fd = down[1];
  return 0;

close_down:
  close(down[0]);
  close(down[1]);
close_up:
  close(up[0]);
  close(up[1]);
  return -1;
}

int tu_child_start(tu_child *child, tu_child_fn fn, void *arg) { return child_start(child, fn, arg, -1); }

int tu_child_read(tu_child *child, void *buf, size_t len, int timeout_ms) {
  if (child->ready_fd < 0) return -1;
  return full_read(child->ready_fd, buf, len, tu_now_ms() + timeout_ms);
}

int tu_child_write(tu_child *child, const void *buf, size_t len) {
  if (child->ctl_fd < 0) return -1;
  return tu_write_all(child->ctl_fd, buf, len);
}

void tu_child_kill(tu_child *child, int sig) {
  if (child->pid > 0) kill(child->pid, sig);
}

/* Wait for exit until deadline; returns whether the child was reaped. Polls waitpid
 * (1 ms apart) rather than a pidfd, which valgrind does not know. */
static bool reap_until(tu_child *child, int64_t deadline, int *wstatus) {
  struct timespec pause = {0, 1000000};
  pid_t r;

  for (;;) {
    r = waitpid(child->pid, wstatus, WNOHANG);
    if (r == child->pid) return true;
    if (r < 0 && errno != EINTR) return false;
    if (tu_now_ms() >= deadline) return false;
    nanosleep(&pause, NULL);
  }
}

int tu_child_wait_stopped(tu_child *child, int timeout_ms) {
  int64_t deadline = tu_now_ms() + timeout_ms;
  struct timespec pause = {0, 500000};
  int wstatus;
  pid_t r;

  for (;;) {
    r = waitpid(child->pid, &wstatus, WNOHANG | WUNTRACED);
    if (r == child->pid && WIFSTOPPED(wstatus)) return 0;
    if (r == child->pid) {
      fprintf(stderr, "child %d exited (status 0x%x) instead of stopping\n", (int)child->pid,
              (unsigned)wstatus);
      child->pid = 0; /* reaped: tu_child_wait only closes the pipes */
      return -1;
    }
    if ((r < 0 && errno != EINTR) || tu_now_ms() >= deadline) return -1;
    nanosleep(&pause, NULL);
  }
}

int tu_child_wait(tu_child *child, int timeout_ms) {
  int wstatus = 0, ret = -1;

  if (child->pid <= 0) {
    /* Already reaped (it exited while we waited for a stop): just close the pipes. */
  } else if (reap_until(child, tu_now_ms() + timeout_ms, &wstatus)) {
    ret = wstatus;
  } else {
    fprintf(stderr, "child %d did not exit within %d ms; killing it\n", (int)child->pid, timeout_ms);
    kill(child->pid, SIGKILL);
    kill(child->pid, SIGCONT);
    waitpid(child->pid, &wstatus, 0);
  }
  if (child->ready_fd >= 0) close(child->ready_fd);
  if (child->ctl_fd >= 0) close(child->ctl_fd);
  memset(child, 0, sizeof(*child));
  child->ready_fd = child->ctl_fd = -1;
  return ret;
}

int tu_child_stop(tu_child *child, int timeout_ms) {
  if (child->ctl_fd >= 0) {
    close(child->ctl_fd);
    child->ctl_fd = -1;
  }
  return tu_child_wait(child, timeout_ms);
}

/* ---- a server engine in a child process ---- */

#define CHILD_FLAG     "--tu-server-child"
#define CHILD_READY_FD 3
#define CHILD_CTL_FD   4
#define CHILD_SHM_FD   5

static char self_exe[4096]; /* this program, resolved by tu_child_main */

int tu_shm_create(tu_shm *shm, size_t len) {
  memset(shm, 0, sizeof(*shm));
  shm->fd = memfd_create("hixl-test-shm", MFD_CLOEXEC);
  if (shm->fd < 0) {
    fprintf(stderr, "tu_shm_create: memfd_create: %m\n");
    return -1;
  }
  if (ftruncate(shm->fd, (off_t)len) != 0) {
    fprintf(stderr, "tu_shm_create: ftruncate %zu: %m\n", len);
    goto close_fd;
  }
  shm->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, shm->fd, 0);
  if (shm->mem == MAP_FAILED) {
    fprintf(stderr, "tu_shm_create: mmap %zu: %m\n", len);
    goto close_fd;
  }
  shm->len = len;
  return 0;

close_fd:
  close(shm->fd);
  shm->fd = -1;
  shm->mem = NULL;
  return -1;
}

void tu_shm_destroy(tu_shm *shm) {
  if (shm->mem) munmap(shm->mem, shm->len);
  if (shm->fd >= 0) close(shm->fd);
  memset(shm, 0, sizeof(*shm));
  shm->fd = -1;
}

/* The server itself, in the re-executed child. */
static int server_run(const tu_server_cfg *cfg, unsigned char *mem, int ready_fd, int ctl_fd) {
  tu_server_ready r;
  tu_cmd cmd;
  HixlOption opt = {.key = "Transport", .value = NULL};
  HixlEngine *e = NULL;
  HixlMemHandle h = NULL;
  HixlMemDesc d;
  char name[TU_ADDR_LEN];
  int64_t reply;
  HixlStatus st;

  memset(&r, 0, sizeof(r));
  if (!mem && !cfg->alloc) {
    r.status = HIXL_RESOURCE_EXHAUSTED;
    snprintf(r.error, sizeof(r.error), "child: mapping %zu bytes failed", cfg->mem_len);
    tu_write_all(ready_fd, &r, sizeof(r));
    return 2;
  }
  if (cfg->seed && mem) tu_fill(mem, cfg->mem_len, cfg->seed);
  if (cfg->nondumpable && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    r.status = HIXL_FAILED;
    snprintf(r.error, sizeof(r.error), "child: prctl(PR_SET_DUMPABLE, 0): %s", strerror(errno));
    tu_write_all(ready_fd, &r, sizeof(r));
    return 2;
  }
  st = HixlEngineCreate(&e);
  if (st != HIXL_SUCCESS) goto report;
  opt.value = cfg->transport;
  st = HixlEngineInitialize(e, tu_addr(name, sizeof(name), cfg->port), &opt, cfg->transport ? 1 : 0);
  if (st != HIXL_SUCCESS) goto report;
  if (cfg->alloc) {
    void *p = NULL;
    st = HixlEngineAllocMem(e, cfg->mem_len, &p, &h);
    mem = p;
    if (st == HIXL_SUCCESS && cfg->seed) tu_fill(mem, cfg->mem_len, cfg->seed);
    goto report;
  }
  d.addr = (uintptr_t)mem;
  d.len = cfg->mem_len;
  st = HixlEngineRegisterMem(e, &d, HIXL_MEM_HOST, &h);
report:
  r.status = st;
  r.addr = (uintptr_t)mem;
  r.len = cfg->mem_len;
  if (st != HIXL_SUCCESS) snprintf(r.error, sizeof(r.error), "%s", HixlGetLastErrorMessage());
  if (tu_write_all(ready_fd, &r, sizeof(r)) != 0 || st != HIXL_SUCCESS) {
    if (e) HixlEngineDestroy(e);
    return 3;
  }

  /* Serve until the parent closes the command pipe or says QUIT. */
  while (tu_read_all(ctl_fd, &cmd, sizeof(cmd)) == 0) {
    reply = 0;
    if (cmd.op == TU_CMD_FREE) {
      reply = cfg->alloc && h ? (int64_t)HixlEngineFreeMem(e, h) : -3;
      if (reply == HIXL_SUCCESS) h = NULL;
    } else if (cmd.op == TU_CMD_HOLD) {
      int watch = (int)syscall(SYS_pidfd_open, (pid_t)cmd.seed, 0);
      pid_t holder = watch < 0 ? -1 : fork();
      if (holder == 0) { /* async-signal-safe calls only: the test's end ends it */
        struct pollfd pfd = {.fd = watch, .events = POLLIN};
        while (poll(&pfd, 1, -1) < 0 && errno == EINTR) continue;
        _exit(0);
      }
      if (watch >= 0) close(watch);
      reply = holder;
    } else if (cmd.op == TU_CMD_DROP) {
      char peer[TU_ADDR_LEN];
      size_t n = 0;
      tu_addr(peer, sizeof(peer), (uint16_t)cmd.seed);
      reply = hixl_engine_drop_peer(e, peer, "the test dropped it", &n) == HIXL_SUCCESS ? (int64_t)n : -5;
    } else if (!h) {
      reply = -4; /* freed */
    } else if (cmd.off > cfg->mem_len || cmd.len > cfg->mem_len - cmd.off) {
      reply = -2;
    } else if (cmd.op == TU_CMD_CHECK) {
      reply = tu_check_pattern(mem + cmd.off, cmd.len, cmd.seed);
    } else if (cmd.op == TU_CMD_FILL) {
      tu_fill(mem + cmd.off, cmd.len, cmd.seed);
    } else if (cmd.op != TU_CMD_QUIT) {
      reply = -3;
    }
    if (tu_write_all(ready_fd, &reply, sizeof(reply)) != 0 || cmd.op == TU_CMD_QUIT) break;
  }
  st = !h ? HIXL_SUCCESS : cfg->alloc ? HixlEngineFreeMem(e, h) : HixlEngineDeregisterMem(e, h);
  if (st == HIXL_SUCCESS) st = HixlEngineFinalize(e);
  if (HixlEngineDestroy(e) != HIXL_SUCCESS || st != HIXL_SUCCESS) {
    fprintf(stderr, "server child: shutdown: %s: %s\n", HixlStatusName(st), HixlGetLastErrorMessage());
    return 4;
  }
  return 0;
}

int tu_child_main(int argc, char **argv) {
  tu_server_cfg cfg;
  unsigned char *mem;
  ssize_t n;
  int rc;

  n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
  self_exe[n > 0 ? n : 0] = '\0';
  if (argc != 8 || strcmp(argv[1], CHILD_FLAG) != 0) return -1;
  memset(&cfg, 0, sizeof(cfg));
  cfg.port = (uint16_t)strtoul(argv[2], NULL, 10);
  cfg.mem_len = strtoull(argv[3], NULL, 10);
  cfg.seed = strtoull(argv[4], NULL, 10);
  cfg.transport = strcmp(argv[6], "-") == 0 ? tu_transport() : argv[6];
  cfg.nondumpable = strcmp(argv[7], "nondumpable") == 0;
  cfg.alloc = strcmp(argv[5], "alloc") == 0;
  if (cfg.alloc) {
    mem = NULL;
  } else if (strcmp(argv[5], "shm") == 0) {
    mem = mmap(NULL, cfg.mem_len, PROT_READ | PROT_WRITE, MAP_SHARED, CHILD_SHM_FD, 0);
    close(CHILD_SHM_FD);
  } else {
    mem = mmap(NULL, cfg.mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (mem == MAP_FAILED) mem = NULL;
  rc = server_run(&cfg, mem, CHILD_READY_FD, CHILD_CTL_FD);
  if (mem && !cfg.alloc) munmap(mem, cfg.mem_len);
  return rc;
}

int tu_become(uint32_t uid, uint32_t gid) {
  if (uid == 0 && gid == 0) return 0;
  if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
    fprintf(stderr, "child: cannot become uid %u gid %u: %m\n", (unsigned)uid, (unsigned)gid);
    return -1;
  }
  return 0;
}

const char *tu_self_exe(void) { return self_exe; }

int tu_memfd_maps(pid_t pid) {
  static char buf[1 << 20];
  char path[32] = "/proc/self/maps";
  if (pid > 0) { /* no snprintf: it may allocate */
    char digits[16];
    int n = 0, k = 6;
    for (pid_t p = pid; p > 0; p /= 10) digits[n++] = (char)('0' + p % 10);
    memcpy(path, "/proc/", 6);
    while (n > 0) path[k++] = digits[--n];
    memcpy(path + k, "/maps", 6);
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  ssize_t r;
  while (len < sizeof(buf) - 1 && (r = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0) len += (size_t)r;
  close(fd);
  buf[len] = '\0';
  int count = 0; /* "(deleted)" right after the name: not /memfd:hixl-gen */
  for (const char *p = buf; (p = strstr(p, "/memfd:hixl (deleted)")); p++) count++;
  return count;
}

/* fork() body of tu_server_start: exec this program as a server child. */
static int server_exec(void *arg, int ready_fd, int ctl_fd) {
  const tu_server_cfg *cfg = arg;
  char port[16], len[32], seed[32];
  char *argv[] = {self_exe,
                  CHILD_FLAG,
                  port,
                  len,
                  seed,
                  cfg->alloc    ? "alloc"
                  : cfg->shared ? "shm"
                                : "private",
                  cfg->transport ? (char *)cfg->transport : "-",
                  cfg->nondumpable ? "nondumpable" : "dumpable",
                  NULL};

  (void)ready_fd;
  (void)ctl_fd; /* tu_child_start put them at 3 and 4 already */
  if (tu_become(cfg->uid, cfg->gid) != 0) return 126;
  if (cfg->memlock) { /* both survive the exec: RLIMIT_MEMLOCK binds again */
    struct rlimit rl = {.rlim_cur = cfg->memlock, .rlim_max = cfg->memlock};
    if (prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 || setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 125;
  }
  snprintf(port, sizeof(port), "%u", (unsigned)cfg->port);
  snprintf(len, sizeof(len), "%zu", cfg->mem_len);
  snprintf(seed, sizeof(seed), "%llu", (unsigned long long)cfg->seed);
  execv(self_exe, argv);
  fprintf(stderr, "server child: exec %s: %m\n", self_exe);
  return 127;
}

int tu_server_start(tu_child *child, const tu_server_cfg *cfg, tu_server_ready *info, int timeout_ms) {
  memset(info, 0, sizeof(*info));
  info->status = HIXL_FAILED;
  if (!self_exe[0]) {
    snprintf(info->error, sizeof(info->error), "tu_child_main was not called in main");
    return -1;
  }
  if (cfg->shared && cfg->shared->len < cfg->mem_len) {
    snprintf(info->error, sizeof(info->error), "shared memory smaller than mem_len");
    return -1;
  }
  if (child_start(child, server_exec, (void *)cfg, cfg->shared && !cfg->alloc ? cfg->shared->fd : -1) != 0)
    return -1;
  if (tu_child_read(child, info, sizeof(*info), timeout_ms) != 0) {
    snprintf(info->error, sizeof(info->error), "server child sent no readiness within %d ms", timeout_ms);
    tu_child_wait(child, 0);
    return -1;
  }
  if (info->status != HIXL_SUCCESS) {
    tu_child_wait(child, timeout_ms);
    return -1;
  }
  return 0;
}

int tu_server_send(tu_child *child, const tu_cmd *cmd, int64_t *reply, int timeout_ms) {
  if (tu_child_write(child, cmd, sizeof(*cmd)) != 0) return -1;
  return tu_child_read(child, reply, sizeof(*reply), timeout_ms);
}

/* ---- a target held ---- */

HixlStatus tu_hold_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                           size_t cap, size_t *resp_len) {
  struct tu_hold *h = ctx;
  (void)peer, (void)req, (void)len, (void)resp, (void)cap;
  pthread_mutex_lock(&h->mu);
  h->entered = true;
  pthread_cond_broadcast(&h->cv);
  while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  *resp_len = 0;
  return HIXL_SUCCESS;
}

void tu_hold_entered(struct tu_hold *h) {
  pthread_mutex_lock(&h->mu);
  while (!h->entered) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}

void tu_hold_release(struct tu_hold *h) {
  pthread_mutex_lock(&h->mu);
  h->release = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}
