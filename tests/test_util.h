/* Helpers shared by the hixl test programs: loopback ports, data patterns, status
 * assertions that say what came back and why, and server engines in child processes
 * that report readiness through a pipe (never a sleep). */
#ifndef HIXL_TEST_UTIL_H
#define HIXL_TEST_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <CUnit/CUnit.h>

#include "hixl/hixl.h"

#define TU_ADDR_LEN 32 /* fits "127.0.0.1:65535" with room to spare */

/* ---- time ---- */

/** Write or read exactly len bytes on a blocking fd (EINTR retried); 0, or -1 on
 *  error or end of file. */
int tu_write_all(int fd, const void *buf, size_t len);
int tu_read_all(int fd, void *buf, size_t len);

/** CLOCK_MONOTONIC in milliseconds. */
int64_t tu_now_ms(void);
/* How many of this process's threads are named name (their comm); -1 when /proc cannot
 * be read. */
int tu_threads_named(const char *name);
/* The ids of this process's threads named name, at most cap into tids: how many there
 * are (-1: /proc cannot be read). A thread joined a moment ago may still be listed
 * (the kernel reaps it after pthread_join returned). */
int tu_thread_ids_named(const char *name, int *tids, int cap);

/* ---- loopback addresses ---- */

/** A TCP port on tu_ip() held for the rest of this process: a socket bound there with
 *  SO_REUSEADDR that never listens and is never closed, so no other bind(:0) or connect()
 *  takes it, while an engine (which sets SO_REUSEADDR) or a test's listener
 *  with SO_REUSEADDR still listens on it.
 *  A port probed and closed could go to a parallel test first. 0 on error. */
uint16_t tu_free_port(void);

/** The IPv4 address engines under test use: env HIXL_TEST_IP, default 127.0.0.1
 *  (the soft-RoCE guest sets the rxe device's address, so auto picks rdma). */
const char *tu_ip(void);

/** Write "IP:PORT" (IP from tu_ip) into buf (at least TU_ADDR_LEN bytes); returns buf. */
char *tu_addr(char *buf, size_t len, uint16_t port);

/* ---- data patterns ---- */

/** Fill buf with the pseudo-random pattern of seed; byte i depends only on (seed, i). */
void tu_fill(void *buf, size_t len, uint64_t seed);

/** Offset of the first byte where buf differs from the pattern of seed, or -1. */
ptrdiff_t tu_check_pattern(const void *buf, size_t len, uint64_t seed);

/** Offset of the first byte where a and b differ, or -1. */
ptrdiff_t tu_mismatch(const void *a, const void *b, size_t len);

/** Offset of the first byte of buf that is not c, or -1. */
ptrdiff_t tu_check_byte(const void *buf, size_t len, unsigned char c);
/* Until deadline_ms (tu_now_ms): is any byte of the first sample of each stride bytes
 * of buf[0, len) non-zero? Watches a transfer land: the bytes are read as an outside
 * observer does, through the kernel (process_vm_readv on this process), since they
 * arrive with nothing ordering them against this thread (as DMA would). Yields
 * between scans so the engine's threads run. */
bool tu_wait_nonzero(const void *buf, size_t len, size_t stride, size_t sample, int64_t deadline_ms);

/** Small deterministic generator for test layouts (splitmix64). */
uint64_t tu_rand(uint64_t *state);

/** Page-aligned zeroed anonymous memory (MAP_SHARED when shared, so a forked child
 *  and its parent see the same bytes); NULL on failure. Release with tu_free_mem. */
void *tu_alloc_mem(size_t len, bool shared);
void tu_free_mem(void *p, size_t len);

/* ---- CUnit assertions with detail ---- */

/* Record a failure with a formatted message (CUnit copies the text). */
void tu_fail(const char *file, unsigned line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Compare a status; on mismatch report both names and the last error message of the
 * calling thread. Returns whether it matched. */
bool tu_status_is(HixlStatus got, HixlStatus want, const char *expr, const char *file, unsigned line);

#define TU_ASSERT_STATUS(expr, want)                                                                         \
  ((void)tu_status_is((HixlStatus)(expr), (HixlStatus)(want), #expr, __FILE__, __LINE__))
#define TU_ASSERT_OK(expr) TU_ASSERT_STATUS(expr, HIXL_SUCCESS)
#define TU_ASSERT_OK_FATAL(expr)                                                                             \
  do {                                                                                                       \
    if (!tu_status_is((HixlStatus)(expr), HIXL_SUCCESS, #expr, __FILE__, __LINE__))                          \
      CU_FAIL_FATAL("setup failed, see above");                                                              \
  } while (0)

/* Compare an HccnResult (RPing); on mismatch report both names and the last error. */
bool tu_hccn_is(HccnResult got, HccnResult want, const char *expr, const char *file, unsigned line);
#define ASSERT_HCCN(expr, want) ((void)tu_hccn_is((expr), (want), #expr, __FILE__, __LINE__))
#define ASSERT_HCCN_FATAL(expr, want)                                                                        \
  do {                                                                                                       \
    if (!tu_hccn_is((expr), (want), #expr, __FILE__, __LINE__)) CU_FAIL_FATAL("setup failed, see above");    \
  } while (0)

/* Whether the last error message of this thread contains needle; reports if not. */
bool tu_last_error_has(const char *needle, const char *file, unsigned line);
#define TU_ASSERT_ERRMSG_HAS(needle) ((void)tu_last_error_has((needle), __FILE__, __LINE__))

/* Byte-for-byte comparisons that report the first mismatching offset. */
bool tu_same(const void *got, const void *want, size_t len, const char *what, const char *file,
             unsigned line);
bool tu_pattern_ok(const void *buf, size_t len, uint64_t seed, const char *what, const char *file,
                   unsigned line);
#define TU_ASSERT_SAME(got, want, len, what) ((void)tu_same((got), (want), (len), (what), __FILE__, __LINE__))
#define TU_ASSERT_PATTERN(buf, len, seed, what)                                                              \
  ((void)tu_pattern_ok((buf), (len), (seed), (what), __FILE__, __LINE__))

/** Run every registered suite with CU_basic (verbose) and return the process exit
 *  code: 0 when all passed, 1 on any failure or setup error. Cleans the registry. */
int tu_run_registry(void);
/** Register suites and run them as tu_run_registry does; name prefixes a setup error. */
int tu_run_suites(const char *name, CU_SuiteInfo *suites);

/* ---- engines ---- */

/** The Transport option engines under test get: env HIXL_TEST_TRANSPORT when set
 *  ("auto", "tcp", "rdma" or "shm"); else "rdma" in the soft-RoCE guest run
 *  (HIXL_REQUIRE_RDMA), since there auto would pick shm between engines of one host
 *  and that run exists for rdma; else NULL: no option, which means auto. */
const char *tu_transport(void);

/** What registering host memory as device memory gets here: UNSUPPORTED where no
 *  device-memory provider is found (no CUDA driver: the build machines), PARAM_INVALID
 *  where one is (a GPU host: the driver says it is not device memory). */
HixlStatus tu_device_refusal(void);

/** Capture the library's log: from here on every line at level or above goes to
 *  the callback (echoed to stderr when echo), and the first that holds the needle
 *  given to tu_log_watch is kept; tu_log_seen copies it out (true when one came) and
 *  stops watching. */
void tu_log_capture(HixlLogLevel level, bool echo);
void tu_log_watch(const char *needle);
bool tu_log_seen(char *out, size_t cap);
/** How many lines held the needle since tu_log_watch (tu_log_seen leaves it as it was). */
unsigned tu_log_hits(void);

/** A key file (mode 0600) for AuthKeyFile, made once per process with a fixed test
 *  key and removed when the process that made it exits; NULL if it cannot be. */
const char *tu_key_file(void);
#define TU_KEY_HEX "9f1c2e7a4b6d8e0f13a5c7e9b2d4f6081a3c5e7f9b1d3f5a7c9e1b3d5f7a9c0e"

/** Create and initialize an engine as local_engine with Transport tu_transport();
 *  NULL (and the reason on stderr) on failure. */
HixlEngine *tu_engine_start(const char *local_engine);

/** The same with Transport given (NULL: no option, i.e. auto). */
HixlEngine *tu_engine_start_with(const char *local_engine, const char *transport);
/** The same with more options after Transport (at most 15), e.g. {"BufferPool", "0:0"}. */
HixlEngine *tu_engine_start_opts(const char *local_engine, const char *transport, const HixlOption *extra,
                                 size_t n_extra);

/** Register [addr, addr + len) as host memory; NULL on failure. */
HixlMemHandle tu_register(HixlEngine *engine, void *addr, size_t len);

/** Poll an async request until it leaves WAITING or deadline_ms (CLOCK_MONOTONIC) has
 *  passed. Returns the GetTransferStatus status; *final gets the last state seen. */
HixlStatus tu_wait_request(HixlEngine *engine, HixlTransferReq req, int64_t deadline_ms,
                           HixlTransferStatus *final);

/* ---- a target held: its progress thread kept in a service's handler ---- */

/* Install with hixl_engine_set_service(target, id, tu_hold_handler, &hold) (hold from
 * TU_HOLD_INIT); a CALL to it keeps the target's progress thread there, reading
 * nothing, until tu_hold_release. tu_hold_entered waits until a call got there. */
struct tu_hold {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool entered, release;
};
#define TU_HOLD_INIT                                                                                         \
  { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false }
HixlStatus tu_hold_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                           size_t cap, size_t *resp_len);
void tu_hold_entered(struct tu_hold *h);
void tu_hold_release(struct tu_hold *h);

/* ---- child processes ---- */

typedef struct {
  pid_t pid;    /* 0 when no child */
  int ready_fd; /* parent's read end: the child's readiness message and replies */
  int ctl_fd;   /* parent's write end: commands to the child; EOF asks it to quit */
} tu_child;

/* Body of a child: runs in the child after fork; its return value is the exit code.
 * ready_fd is where it reports readiness, ctl_fd where it reads commands (EOF: quit). */
typedef int (*tu_child_fn)(void *arg, int ready_fd, int ctl_fd);

/** Fork a child running fn(arg, ...) without exec. Only for a parent with no other
 *  threads: a lock held by another thread at fork time stays held in the child.
 *  0 on success, -1 on error. */
int tu_child_start(tu_child *child, tu_child_fn fn, void *arg);

/** Read exactly len bytes from the child's readiness/reply pipe within timeout_ms.
 *  0 on success, -1 on EOF, error or timeout. */
int tu_child_read(tu_child *child, void *buf, size_t len, int timeout_ms);

/** Write exactly len bytes to the child's command pipe. 0 on success. */
int tu_child_write(tu_child *child, const void *buf, size_t len);

/** Send a signal to the child (no-op when it is gone). */
void tu_child_kill(tu_child *child, int sig);

/** Wait up to timeout_ms until the child is stopped (after SIGSTOP). 0 once it is. */
int tu_child_wait_stopped(tu_child *child, int timeout_ms);

/** Wait up to timeout_ms for the child to exit; SIGKILL it past that and reap it.
 *  Returns the raw wait status, or -1 if it had to be killed or could not be reaped.
 *  Closes the pipes; the tu_child can be reused afterwards. */
int tu_child_wait(tu_child *child, int timeout_ms);

/** Ask the child to quit (close its command pipe) and wait as tu_child_wait. */
int tu_child_stop(tu_child *child, int timeout_ms);

/* ---- a server engine in a child process ----
 * The child is forked and then re-executes this test program (so it starts with
 * no threads and no locks inherited from the parent's engines; ASan's allocator,
 * for one, deadlocks in a child forked while another thread held its lock). Every
 * program that starts server children calls tu_child_main first thing in main. */

/** Memory shared with a child across exec (a memfd mapped MAP_SHARED). */
typedef struct {
  unsigned char *mem; /* this process's view */
  size_t len;
  int fd; /* -1 when none */
} tu_shm;

int tu_shm_create(tu_shm *shm, size_t len);
void tu_shm_destroy(tu_shm *shm);

typedef struct {
  uint16_t port;         /* listen on 127.0.0.1:port */
  size_t mem_len;        /* bytes of memory to register */
  const tu_shm *shared;  /* register this shared memory (mem_len bytes of it), or NULL
                          * to map private memory in the child */
  uint64_t seed;         /* fill the memory with this pattern before registering; 0: as is */
  const char *transport; /* Transport of the child's engine; NULL: tu_transport() */
  uint32_t uid, gid;     /* run the child as this user and group (setres[ug]id before the
                          * exec; needs root); 0: as this process */
  bool nondumpable;      /* prctl(PR_SET_DUMPABLE, 0) in the child before its engine starts */
  uint64_t memlock;      /* nonzero: the child runs without CAP_IPC_LOCK (dropped from the
                          * bounding set before exec) and with this RLIMIT_MEMLOCK */
  bool alloc;            /* the memory comes from HixlEngineAllocMem (shared is ignored) */
} tu_server_cfg;

typedef struct {
  uint32_t status; /* HixlStatus of the child's setup */
  uint64_t addr;   /* registered memory in the child's address space */
  uint64_t len;
  char error[200]; /* HixlGetLastErrorMessage() on failure */
} tu_server_ready;

enum tu_server_cmd_op {
  TU_CMD_CHECK = 1, /* reply: first mismatch vs pattern(seed) of [off, off+len), or -1 */
  TU_CMD_FILL = 2,  /* fill [off, off+len) with pattern(seed); reply 0 */
  TU_CMD_QUIT = 3,  /* finalize the engine and exit 0; reply 0 first */
  TU_CMD_FREE = 4,  /* alloc: HixlEngineFreeMem the memory; reply its HixlStatus */
  TU_CMD_DROP = 5,  /* hixl_engine_drop_peer the engine at tu_ip():seed; reply the links cut */
  TU_CMD_HOLD = 6,  /* fork a process that keeps every descriptor of this one open (its links'
                     * sockets stay up when this one dies) until it is killed or process seed
                     * exits; reply its pid */
};

typedef struct {
  uint32_t op;
  uint64_t seed;
  uint64_t off;
  uint64_t len;
} tu_cmd;

/** Call first in main(argc, argv) of a program that uses tu_server_start: in a server
 *  child it runs the server and returns its exit code; otherwise it returns -1. */
int tu_child_main(int argc, char **argv);

/** In a forked child: drop every group and become uid/gid (real, effective, saved);
 *  nothing to do when both are 0. 0 on success, -1 (reason on stderr) otherwise. */
int tu_become(uint32_t uid, uint32_t gid);

/** Mappings of memory from HixlEngineAllocMem ("/memfd:hixl", not the shm transport's
 *  own page) in /proc/<pid>/maps (pid 0: this process), or -1. Only open, read and
 *  close: a child forked from a threaded process may call it. */
int tu_memfd_maps(pid_t pid);

/** This program's path, as tu_child_main resolved it ("" before). */
const char *tu_self_exe(void);

/** Start a server child per cfg and wait for its readiness (timeout_ms). 0 when the
 *  child runs and serves (info filled), -1 otherwise (child reaped; info->status and
 *  info->error say why when the child got that far). */
int tu_server_start(tu_child *child, const tu_server_cfg *cfg, tu_server_ready *info, int timeout_ms);

/** Send one command to a server child and read its int64 reply. 0 on success. */
int tu_server_send(tu_child *child, const tu_cmd *cmd, int64_t *reply, int timeout_ms);

#endif /* HIXL_TEST_UTIL_H */
