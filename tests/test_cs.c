/* The HixlCS* client/server API on 127.0.0.1: the seed's usage flow step by step (in
 * one process and across two), every argument and handle rule, the limit of 4096
 * uncompleted batches, and what HIXL leaves undone: batches really end FAILED or
 * TIMEOUT (a range outside the server's memory; a server killed, stopped or
 * destroyed), a client connects again without being recreated, and Destroy with
 * batches outstanding is clean. Servers that get killed or stopped, and calls that
 * may crash, run in children that re-execute this program (--cs-child). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "hixl/hixl_cs.h"
#include "transport/rdma/rdma.h"
#include "test_util.h"

#define KiB         ((size_t)1 << 10)
#define MiB         ((size_t)1 << 20)
#define SLACK       MiB   /* unregistered bytes mapped on both sides of a region */
#define XFER_MS     30000 /* sync batches and polls; generous on a loaded 2-core machine */
#define CONNECT_MS  5000  /* Connect and GetRemoteMem */
#define READY_MS    10000 /* a child has this long to report readiness */
#define STOP_MS     300   /* HIXL_CS_BATCH_TIMEOUT_MS and sync timeouts against a stopped server */
#define KILL_MS     5000  /* HIXL_CS_BATCH_TIMEOUT_MS of a batch whose server dies */
#define PROMPT_MS   3000  /* a broken link must end its batches this fast */
#define TIMEOUT_ENV "HIXL_CS_BATCH_TIMEOUT_MS"

/* ---------------------------------------------------------------- memory */

/* A mapping of len + 2 * SLACK bytes of which [mem, mem + len) gets registered, so the
 * bytes just outside a registration are ours and can be checked for stray writes. */
typedef struct {
  unsigned char *base;
  unsigned char *mem;
  size_t len;
  MemHandle h;
} region;

static bool region_map(region *r, size_t len) {
  memset(r, 0, sizeof(*r));
  r->base = tu_alloc_mem(len + 2 * SLACK, false);
  if (!r->base) return false;
  r->mem = r->base + SLACK;
  r->len = len;
  return true;
}

static void region_unmap(region *r) {
  tu_free_mem(r->base, r->len + 2 * SLACK);
  memset(r, 0, sizeof(*r));
}

static HcommMem host_mem(void *addr, size_t len) {
  HcommMem m = {.type = HCCL_MEM_TYPE_HOST, .addr = addr, .size = len};
  return m;
}

static HixlOneSideOpDesc op(void *local, void *remote, size_t len) {
  HixlOneSideOpDesc d = {.remote_buf = remote, .local_buf = local, .len = len};
  return d;
}

/* ---------------------------------------------------------------- servers and clients here */

/* Whether a setup or teardown call succeeded: an assertion inside a test, a line on
 * stderr in a suite's init or cleanup (where CUnit takes no assertions). */
static bool call_ok(HixlStatus st, const char *expr, const char *file, unsigned line) {
  if (CU_get_current_test()) return tu_status_is(st, HIXL_SUCCESS, expr, file, line);
  if (st != HIXL_SUCCESS)
    fprintf(stderr, "%s:%u: %s: %s (%s)\n", file, line, expr, HixlStatusName(st), HixlGetLastErrorMessage());
  return st == HIXL_SUCCESS;
}
#define CALL_OK(expr) call_ok((expr), #expr, __FILE__, __LINE__)

/* A server in this process: memory registered with a tag, listening on 127.0.0.1. */
typedef struct {
  HixlServerHandle h;
  region m;
  uint16_t port;
} server;

static bool server_up(server *s, uint16_t port, size_t len, const char *tag, bool listen) {
  HixlServerDesc d = {
      .server_ip = "127.0.0.1", .server_port = port, .endpoint_list = NULL, .endpoint_list_num = 0};
  HcommMem m;

  memset(s, 0, sizeof(*s));
  s->port = port;
  if (!region_map(&s->m, len)) return false;
  if (!CALL_OK(HixlCSServerCreate(&d, NULL, &s->h))) return false;
  m = host_mem(s->m.mem, len);
  if (!CALL_OK(HixlCSServerRegMem(s->h, tag, &m, &s->m.h))) return false;
  if (listen && !CALL_OK(HixlCSServerListen(s->h, 0))) return false;
  return true;
}

/* Unregister and destroy what server_up set up (also after a partial setup). */
static void server_down(server *s) {
  if (s->h && s->m.h) (void)CALL_OK(HixlCSServerUnregMem(s->h, s->m.h));
  if (s->h) (void)CALL_OK(HixlCSServerDestroy(s->h));
  region_unmap(&s->m);
  memset(s, 0, sizeof(*s));
}

/* A client of 127.0.0.1:port, created with env HIXL_CS_BATCH_TIMEOUT_MS = timeout_env
 * (NULL: unset, the default); NULL on failure (reported). */
static HixlClientHandle client_new(uint16_t port, const char *timeout_env) {
  HixlClientDesc d = {
      .server_ip = "127.0.0.1", .server_port = port, .local_endpoint = NULL, .remote_endpoint = NULL};
  HixlClientHandle c = NULL;
  bool ok;

  if (timeout_env)
    setenv(TIMEOUT_ENV, timeout_env, 1);
  else
    unsetenv(TIMEOUT_ENV);
  ok = CALL_OK(HixlCSClientCreate(&d, NULL, &c));
  unsetenv(TIMEOUT_ENV);
  return ok ? c : NULL;
}

/* Map len bytes and register them with c under tag. */
static bool client_region(HixlClientHandle c, region *r, size_t len, const char *tag) {
  HcommMem m;

  if (!region_map(r, len)) return false;
  m = host_mem(r->mem, len);
  return CALL_OK(HixlCSClientRegMem(c, tag, &m, &r->h));
}

static void client_region_free(HixlClientHandle c, region *r) {
  if (c && r->h) (void)CALL_OK(HixlCSClientUnregMem(c, r->h));
  region_unmap(r);
}

/* The server registration tagged tag, as GetRemoteMem lists it; reports when absent. */
static bool remote_find(HixlClientHandle c, const char *tag, HcommMem *out) {
  HcommMem *list = NULL;
  char **tags = NULL;
  uint32_t n = 0, i;

  if (!CALL_OK(HixlCSClientGetRemoteMem(c, &list, &tags, &n, CONNECT_MS))) return false;
  for (i = 0; i < n; i++)
    if (tags[i] && strcmp(tags[i], tag) == 0) {
      *out = list[i];
      return true;
    }
  if (CU_get_current_test())
    tu_fail(__FILE__, __LINE__, "GetRemoteMem lists %u registrations, none tagged \"%s\"", n, tag);
  else
    fprintf(stderr, "GetRemoteMem lists %u registrations, none tagged \"%s\"\n", n, tag);
  return false;
}

/* ---------------------------------------------------------------- batches */

static const char *cs_name(HixlCompleteStatus s) {
  switch (s) {
  case HIXL_COMPLETE_STATUS_WAITING: return "WAITING";
  case HIXL_COMPLETE_STATUS_COMPLETED: return "COMPLETED";
  case HIXL_COMPLETE_STATUS_TIMEOUT: return "TIMEOUT";
  case HIXL_COMPLETE_STATUS_FAILED: return "FAILED";
  }
  return "?";
}

/* Poll a batch until it leaves WAITING or deadline_ms (CLOCK_MONOTONIC) passes. Returns
 * the Query status; *final gets the last state seen and err its last error message. */
static HixlStatus wait_batch(HixlClientHandle c, CompleteHandle h, int64_t deadline_ms,
                             HixlCompleteStatus *final, char *err, size_t errlen) {
  HixlCompleteStatus s = HIXL_COMPLETE_STATUS_WAITING;
  struct timespec pause = {0, 200000}; /* 0.2 ms between polls */
  HixlStatus st;

  for (;;) {
    st = HixlCSClientQueryCompleteStatus(c, h, &s);
    if (st != HIXL_SUCCESS || s != HIXL_COMPLETE_STATUS_WAITING || tu_now_ms() >= deadline_ms) break;
    nanosleep(&pause, NULL);
  }
  if (err) snprintf(err, errlen, "%s", HixlGetLastErrorMessage());
  *final = s;
  return st;
}

/* Assert that a batch ends in state want within timeout_ms; then that a second query
 * of its handle is PARAM_INVALID (a final state released it). */
static bool batch_ends(HixlClientHandle c, CompleteHandle h, HixlCompleteStatus want, int timeout_ms,
                       const char *what, const char *file, unsigned line) {
  HixlCompleteStatus s = HIXL_COMPLETE_STATUS_WAITING, again = HIXL_COMPLETE_STATUS_WAITING;
  char err[256];
  HixlStatus st = wait_batch(c, h, tu_now_ms() + timeout_ms, &s, err, sizeof(err));

  if (st != HIXL_SUCCESS) {
    tu_fail(file, line, "%s: QueryCompleteStatus gave %s (%s)", what, HixlStatusName(st), err);
    return false;
  }
  if (s != want) {
    tu_fail(file, line, "%s: batch ended %s after %d ms, want %s (last error \"%s\")", what, cs_name(s),
            timeout_ms, cs_name(want), err);
    return false;
  }
  CU_assertImplementation(CU_TRUE, line, what, file, "", CU_FALSE);
  if (s != HIXL_COMPLETE_STATUS_WAITING)
    return tu_status_is(HixlCSClientQueryCompleteStatus(c, h, &again), HIXL_PARAM_INVALID,
                        "QueryCompleteStatus of a released handle", file, line);
  return true;
}
#define ASSERT_BATCH_ENDS(c, h, want, ms, what)                                                              \
  ((void)batch_ends((c), (h), (want), (ms), (what), __FILE__, __LINE__))

/* Submit an async batch that must be accepted and then end in want. */
static void async_ends(HixlClientHandle c, bool put, uint32_t n, const HixlOneSideOpDesc *d,
                       HixlCompleteStatus want, int timeout_ms, const char *what, const char *file,
                       unsigned line) {
  CompleteHandle h = NULL;
  HixlStatus st = put ? HixlCSClientBatchPutAsync(c, n, d, &h) : HixlCSClientBatchGetAsync(c, n, d, &h);

  if (st != HIXL_SUCCESS) {
    tu_fail(file, line,
            "%s: Batch%sAsync refused the batch with %s (\"%s\"); want it accepted and "
            "ending %s",
            what, put ? "Put" : "Get", HixlStatusName(st), HixlGetLastErrorMessage(), cs_name(want));
    return;
  }
  (void)batch_ends(c, h, want, timeout_ms, what, file, line);
}
#define ASSERT_ASYNC_ENDS(c, put, n, d, want, ms, what)                                                      \
  async_ends((c), (put), (n), (d), (want), (ms), (what), __FILE__, __LINE__)

/* Put len bytes of pattern seed from local to remote (sync), get them back into back
 * and check them; remote is server memory in this process when rcheck is not NULL. */
static void put_get_check(HixlClientHandle c, unsigned char *local, unsigned char *back, void *remote,
                          const unsigned char *rcheck, size_t len, uint64_t seed) {
  HixlOneSideOpDesc d;

  tu_fill(local, len, seed);
  d = op(local, remote, len);
  TU_ASSERT_OK(HixlCSClientBatchPutSync(c, 1, &d, XFER_MS));
  if (rcheck) TU_ASSERT_PATTERN(rcheck, len, seed, "server memory after BatchPutSync");
  memset(back, 0, len);
  d = op(back, remote, len);
  TU_ASSERT_OK(HixlCSClientBatchGetSync(c, 1, &d, XFER_MS));
  TU_ASSERT_PATTERN(back, len, seed, "BatchGetSync of what was put");
}

/* ---------------------------------------------------------------- children */

/* A child re-executes this program with these arguments (a fork without exec would
 * inherit locks held by the engine threads of this process):
 *   --cs-child server PORT LEN SEED  a HixlCS server with LEN bytes tagged "server_mem"
 *   --cs-child wrongkind N           call N of wrong_kind_names, with a handle of the other kind
 *   --cs-child unbounded N           call N of unbounded_names, with an argument it must not read past */
#define CS_CHILD_FLAG "--cs-child"
#define CHILD_UP      3 /* fds set up by tu_child_start */
#define CHILD_DOWN    4

static char self_exe[4096];

enum cs_cmd_op {
  CS_CMD_CHECK = 1,     /* reply: first mismatch vs pattern(seed) of [off, off+len), or -1 */
  CS_CMD_FILL = 2,      /* fill [off, off+len) with pattern(seed); reply 0 */
  CS_CMD_QUIT = 3,      /* UnregMem and Destroy (unless destroyed); reply their status; exit */
  CS_CMD_WAIT_DATA = 4, /* reply 0 once a byte in [off, off+len) is not 0, -1 after seed ms */
  CS_CMD_DESTROY = 5,   /* HixlCSServerDestroy now, with clients connected; reply its status */
};

typedef struct {
  uint32_t status;
  char error[200];
} child_reply;

/* UnregMem once the transfers of clients that went away have settled: FAILED (chunks
 * in flight) is retried for up to 5 s, and a wait is reported. */
static HixlStatus unreg_settled(HixlServerHandle s, MemHandle mh) {
  struct timespec pause = {0, 1000000};
  int64_t t0 = tu_now_ms();
  HixlStatus st;

  while ((st = HixlCSServerUnregMem(s, mh)) == HIXL_FAILED && tu_now_ms() - t0 < 5000)
    nanosleep(&pause, NULL);
  if (tu_now_ms() - t0 >= 5)
    fprintf(stderr, "  [server child: UnregMem gave %s after %lld ms of FAILED (in flight)]\n",
            HixlStatusName(st), (long long)(tu_now_ms() - t0));
  return st;
}

static int server_child(uint16_t port, size_t len, uint64_t seed) {
  HixlServerDesc d = {
      .server_ip = "127.0.0.1", .server_port = port, .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlServerHandle s = NULL;
  MemHandle mh = NULL;
  tu_server_ready r;
  tu_cmd cmd;
  HcommMem m;
  HixlStatus st;
  int64_t reply;
  unsigned char *mem;
  int rc = 0;

  memset(&r, 0, sizeof(r));
  mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    r.status = HIXL_RESOURCE_EXHAUSTED;
    snprintf(r.error, sizeof(r.error), "child: mapping %zu bytes: %s", len, strerror(errno));
    tu_write_all(CHILD_UP, &r, sizeof(r));
    return 2;
  }
  if (seed) tu_fill(mem, len, seed);
  m = host_mem(mem, len);
  st = HixlCSServerCreate(&d, NULL, &s);
  if (st == HIXL_SUCCESS) st = HixlCSServerRegMem(s, "server_mem", &m, &mh);
  if (st == HIXL_SUCCESS) st = HixlCSServerListen(s, 0);
  r.status = st;
  r.addr = (uintptr_t)mem;
  r.len = len;
  if (st != HIXL_SUCCESS) snprintf(r.error, sizeof(r.error), "%s", HixlGetLastErrorMessage());
  if (tu_write_all(CHILD_UP, &r, sizeof(r)) != 0 || st != HIXL_SUCCESS) {
    rc = 3;
    goto destroy;
  }
  /* Serve until the parent closes the command pipe or says QUIT. */
  while (tu_read_all(CHILD_DOWN, &cmd, sizeof(cmd)) == 0) {
    reply = 0;
    if (cmd.off > len || cmd.len > len - cmd.off) {
      reply = -2;
    } else if (cmd.op == CS_CMD_CHECK) {
      reply = tu_check_pattern(mem + cmd.off, cmd.len, cmd.seed);
    } else if (cmd.op == CS_CMD_FILL) {
      tu_fill(mem + cmd.off, cmd.len, cmd.seed);
    } else if (cmd.op == CS_CMD_WAIT_DATA) {
      reply = tu_wait_nonzero(mem + cmd.off, cmd.len, 64 * KiB, 64, tu_now_ms() + (int64_t)cmd.seed) ? 0 : -1;
    } else if (cmd.op == CS_CMD_DESTROY) {
      reply = s ? (int64_t)HixlCSServerDestroy(s) : -4;
      s = NULL;
    } else if (cmd.op == CS_CMD_QUIT) {
      st = s ? unreg_settled(s, mh) : HIXL_SUCCESS;
      if (st == HIXL_SUCCESS && s) st = HixlCSServerDestroy(s);
      if (st != HIXL_SUCCESS) fprintf(stderr, "server child: quit: %s\n", HixlGetLastErrorMessage());
      s = NULL;
      reply = st;
    } else {
      reply = -3;
    }
    if (tu_write_all(CHILD_UP, &reply, sizeof(reply)) != 0 || cmd.op == CS_CMD_QUIT) break;
  }
destroy:
  if (s) HixlCSServerDestroy(s);
  munmap(mem, len);
  return rc;
}

/* The calls wrong_kind_child makes, each with a handle of the other kind. */
static const char *const wrong_kind_names[] = {
    "HixlCSClientConnect(server)",
    "HixlCSClientGetRemoteMem(server)",
    "HixlCSClientRegMem(server)",
    "HixlCSClientUnregMem(server)",
    "HixlCSClientBatchPutAsync(server)",
    "HixlCSClientBatchGetAsync(server)",
    "HixlCSClientQueryCompleteStatus(server)",
    "HixlCSClientBatchPutSync(server)",
    "HixlCSClientBatchGetSync(server)",
    "HixlCSClientDestroy(server)",
    "HixlCSServerRegMem(client)",
    "HixlCSServerListen(client)",
    "HixlCSServerUnregMem(client)",
    "HixlCSServerDestroy(client)",
};
#define N_WRONG_KIND (sizeof(wrong_kind_names) / sizeof(wrong_kind_names[0]))

static int wrong_kind_child(unsigned which) {
  static unsigned char smem[4096], cmem[4096];
  HixlServerDesc sd = {
      .server_ip = "127.0.0.1", .server_port = 9, .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlClientDesc cd = {
      .server_ip = "127.0.0.1", .server_port = 9, .local_endpoint = NULL, .remote_endpoint = NULL};
  HixlServerHandle s = NULL;
  HixlClientHandle c = NULL;
  MemHandle smh = NULL, cmh = NULL, mh = NULL;
  HcommMem sm = host_mem(smem, sizeof(smem)), cm = host_mem(cmem, sizeof(cmem));
  HixlOneSideOpDesc d = op(cmem, smem, 64);
  CompleteHandle ch = NULL;
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  HcommMem *list = NULL;
  char **tags = NULL;
  uint32_t n = 0;
  child_reply r;
  HixlStatus st;

  memset(&r, 0, sizeof(r));
  if (HixlCSServerCreate(&sd, NULL, &s) != HIXL_SUCCESS ||
      HixlCSClientCreate(&cd, NULL, &c) != HIXL_SUCCESS ||
      HixlCSServerRegMem(s, "s", &sm, &smh) != HIXL_SUCCESS ||
      HixlCSClientRegMem(c, "c", &cm, &cmh) != HIXL_SUCCESS)
    return 2;
  switch (which) {
  case 0: st = HixlCSClientConnect(s, 100); break;
  case 1: st = HixlCSClientGetRemoteMem(s, &list, &tags, &n, 100); break;
  case 2: st = HixlCSClientRegMem(s, "x", &cm, &mh); break;
  case 3: st = HixlCSClientUnregMem(s, smh); break;
  case 4: st = HixlCSClientBatchPutAsync(s, 1, &d, &ch); break;
  case 5: st = HixlCSClientBatchGetAsync(s, 1, &d, &ch); break;
  case 6: st = HixlCSClientQueryCompleteStatus(s, &d, &cs); break;
  case 7: st = HixlCSClientBatchPutSync(s, 1, &d, 100); break;
  case 8: st = HixlCSClientBatchGetSync(s, 1, &d, 100); break;
  case 9: st = HixlCSClientDestroy(s); break;
  case 10: st = HixlCSServerRegMem(c, "x", &sm, &mh); break;
  case 11: st = HixlCSServerListen(c, 0); break;
  case 12: st = HixlCSServerUnregMem(c, cmh); break;
  case 13: st = HixlCSServerDestroy(c); break;
  default: return 2;
  }
  r.status = st;
  snprintf(r.error, sizeof(r.error), "%s", HixlGetLastErrorMessage());
  if (tu_write_all(CHILD_UP, &r, sizeof(r)) != 0) return 3;
  /* Clean up as a correct program would; what the wrong call did may make it fail. */
  if (HixlCSClientUnregMem(c, cmh) != HIXL_SUCCESS || HixlCSClientDestroy(c) != HIXL_SUCCESS ||
      HixlCSServerUnregMem(s, smh) != HIXL_SUCCESS || HixlCSServerDestroy(s) != HIXL_SUCCESS)
    return 4;
  return 0;
}

/* The calls unbounded_child makes: strings that end at a page nobody may read, without a
 * NUL, and a list_num far above what desc_list holds. Each must be refused from the
 * bytes it may read (a tag has at most 255, a device name at most 63, a batch at most
 * HIXL_MAX_BATCH ops), not crash or try to allocate for 2^32 - 1 ops. */
static const char *const unbounded_names[] = {
    "HixlCSServerRegMem(tag without a NUL)",
    "HixlCSClientRegMem(tag without a NUL)",
    "HixlCSServerCreate(endpoint device without a NUL)",
    "HixlCSClientCreate(local_endpoint device without a NUL)",
    "HixlCSClientCreate(remote_endpoint device without a NUL)",
    "HixlCSClientBatchPutAsync(list_num 2^32 - 1, one op)",
    "HixlCSClientBatchGetSync(list_num 2^32 - 1, one op)",
};
#define N_UNBOUNDED (sizeof(unbounded_names) / sizeof(unbounded_names[0]))

static int unbounded_child(unsigned which) {
  static unsigned char smem[4096], cmem[4096];
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *two = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HixlServerDesc sd = {
      .server_ip = "127.0.0.1", .server_port = 9, .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlClientDesc cd = {
      .server_ip = "127.0.0.1", .server_port = 9, .local_endpoint = NULL, .remote_endpoint = NULL};
  EndpointDesc ep = {.protocol = HIXL_EP_PROTOCOL_RDMA, .address = "127.0.0.1", .device = NULL};
  HixlServerHandle s = NULL, s2 = NULL;
  HixlClientHandle c = NULL, c2 = NULL;
  MemHandle mh = NULL;
  HcommMem sm = host_mem(smem, sizeof(smem)), cm = host_mem(cmem, sizeof(cmem));
  HixlOneSideOpDesc d = op(cmem, smem, 64);
  CompleteHandle ch = NULL;
  child_reply r;
  HixlStatus st;

  memset(&r, 0, sizeof(r));
  if (two == MAP_FAILED || mprotect(two + page, page, PROT_NONE) != 0) return 2;
  memset(two, 'a', page); /* no NUL up to the page nobody may read */
  const char *tag = (const char *)two + page - (HIXL_CS_MAX_TAG_LEN + 1);
  ep.device = (const char *)two + page - 64;
  if (HixlCSServerCreate(&sd, NULL, &s) != HIXL_SUCCESS || HixlCSClientCreate(&cd, NULL, &c) != HIXL_SUCCESS)
    return 2;
  switch (which) {
  case 0: st = HixlCSServerRegMem(s, tag, &sm, &mh); break;
  case 1: st = HixlCSClientRegMem(c, tag, &cm, &mh); break;
  case 2:
    sd.endpoint_list = &ep;
    sd.endpoint_list_num = 1;
    st = HixlCSServerCreate(&sd, NULL, &s2);
    break;
  case 3:
    cd.local_endpoint = &ep;
    st = HixlCSClientCreate(&cd, NULL, &c2);
    break;
  case 4:
    cd.remote_endpoint = &ep;
    st = HixlCSClientCreate(&cd, NULL, &c2);
    break;
  case 5: st = HixlCSClientBatchPutAsync(c, UINT32_MAX, &d, &ch); break;
  case 6: st = HixlCSClientBatchGetSync(c, UINT32_MAX, &d, 100); break;
  default: return 2;
  }
  r.status = st;
  snprintf(r.error, sizeof(r.error), "%s", HixlGetLastErrorMessage());
  if (tu_write_all(CHILD_UP, &r, sizeof(r)) != 0) return 3;
  if (HixlCSClientDestroy(c) != HIXL_SUCCESS || HixlCSServerDestroy(s) != HIXL_SUCCESS) return 4;
  return 0;
}

/* In a child: run it and return its exit code. Otherwise -1. */
static int cs_child_main(int argc, char **argv) {
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);

  self_exe[n > 0 ? n : 0] = '\0';
  if (argc < 3 || strcmp(argv[1], CS_CHILD_FLAG) != 0) return -1;
  if (argc == 6 && strcmp(argv[2], "server") == 0)
    return server_child((uint16_t)strtoul(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                        strtoull(argv[5], NULL, 10));
  if (argc == 4 && strcmp(argv[2], "wrongkind") == 0)
    return wrong_kind_child((unsigned)strtoul(argv[3], NULL, 10));
  if (argc == 4 && strcmp(argv[2], "unbounded") == 0)
    return unbounded_child((unsigned)strtoul(argv[3], NULL, 10));
  fprintf(stderr, "%s: bad child arguments\n", argv[0]);
  return 2;
}

/* tu_child_start body: only exec (async-signal-safe), so it is fine in a parent with
 * engine threads. */
static int exec_child(void *arg, int ready_fd, int ctl_fd) {
  char *const *argv = arg;

  (void)ready_fd;
  (void)ctl_fd; /* already fds 3 and 4 */
  execv(argv[0], argv);
  return 127;
}

/* A HixlCS server in a child process. */
typedef struct {
  tu_child c;
  tu_server_ready info; /* addr and len of its "server_mem" */
} srvchild;

static bool srvchild_start(srvchild *sc, uint16_t port, size_t len, uint64_t seed) {
  char p[16], l[32], s[32];
  char *argv[] = {self_exe, CS_CHILD_FLAG, "server", p, l, s, NULL};

  memset(sc, 0, sizeof(*sc));
  snprintf(p, sizeof(p), "%u", (unsigned)port);
  snprintf(l, sizeof(l), "%zu", len);
  snprintf(s, sizeof(s), "%llu", (unsigned long long)seed);
  if (tu_child_start(&sc->c, exec_child, argv) != 0) {
    tu_fail(__FILE__, __LINE__, "cannot start a server child");
    return false;
  }
  if (tu_child_read(&sc->c, &sc->info, sizeof(sc->info), READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "server child on port %u sent no readiness within %d ms", (unsigned)port,
            READY_MS);
    tu_child_wait(&sc->c, 0);
    return false;
  }
  if (sc->info.status != HIXL_SUCCESS) {
    tu_fail(__FILE__, __LINE__, "server child on port %u: %s (%s)", (unsigned)port,
            HixlStatusName(sc->info.status), sc->info.error);
    tu_child_wait(&sc->c, 5000);
    return false;
  }
  return true;
}

/* Send one command and return the child's reply (-99 when it did not answer). */
static int64_t srvchild_cmd(srvchild *sc, uint32_t cmd_op, uint64_t off, uint64_t len, uint64_t seed,
                            int timeout_ms) {
  tu_cmd cmd;
  int64_t reply = -99;

  memset(&cmd, 0, sizeof(cmd));
  cmd.op = cmd_op;
  cmd.off = off;
  cmd.len = len;
  cmd.seed = seed;
  if (tu_server_send(&sc->c, &cmd, &reply, timeout_ms) != 0) return -99;
  return reply;
}

/* Ask the child to check [off, off + len) of its memory against pattern seed. */
static void srvchild_expect(srvchild *sc, uint64_t off, uint64_t len, uint64_t seed, const char *what) {
  int64_t reply = srvchild_cmd(sc, CS_CMD_CHECK, off, len, seed, 30000);

  if (reply == -99)
    tu_fail(__FILE__, __LINE__, "%s: the server child did not answer CHECK", what);
  else if (reply != -1)
    tu_fail(__FILE__, __LINE__, "%s: server child memory differs from pattern %llu at offset %lld", what,
            (unsigned long long)seed, (long long)reply);
  else
    CU_PASS(what);
}

/* QUIT: the child unregisters and destroys its server, then exits 0. */
static void srvchild_quit(srvchild *sc) {
  int64_t reply = srvchild_cmd(sc, CS_CMD_QUIT, 0, 0, 0, 10000);
  int ws;

  if (reply != HIXL_SUCCESS)
    tu_fail(__FILE__, __LINE__, "server child QUIT: UnregMem/Destroy gave %lld (%s)", (long long)reply,
            reply >= 0 ? HixlStatusName((HixlStatus)reply) : "no answer");
  ws = tu_child_stop(&sc->c, 10000);
  if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "server child ended badly (wait status 0x%x)", (unsigned)ws);
  else
    CU_PASS("server child exited 0");
}

static bool srvchild_stop(srvchild *sc) {
  tu_child_kill(&sc->c, SIGSTOP);
  if (tu_child_wait_stopped(&sc->c, 5000) != 0) {
    tu_fail(__FILE__, __LINE__, "the server child did not stop");
    return false;
  }
  return true;
}

/* ---------------------------------------------------------------- 1. the seed's usage flow */

/* Blocks of every size the seed's example loops over, plus small odd ones; local and
 * remote placed in opposite orders with gaps between blocks. */
static const size_t flow_sizes[] = {1, 4 * KiB, 64 * KiB + 3, MiB, 5 * MiB};
#define FLOW_ROUNDS 4
#define FLOW_SMALL  64
#define FLOW_OPS    (FLOW_ROUNDS * 5 + FLOW_SMALL)
#define FLOW_LOCAL  (32 * MiB)
#define FLOW_REMOTE (64 * MiB)

typedef struct {
  size_t loff, roff, len;
} block;

static void flow_layout(block *b, uint64_t seed) {
  uint64_t rs = seed;
  size_t i, off;

  for (i = 0; i < FLOW_OPS; i++) b[i].len = i < FLOW_ROUNDS * 5 ? flow_sizes[i % 5] : 1 + tu_rand(&rs) % 300;
  for (i = 0, off = 0; i < FLOW_OPS; i++) {
    b[i].loff = off;
    off += b[i].len + 1 + tu_rand(&rs) % 7;
  }
  for (i = FLOW_OPS, off = 0; i-- > 0;) {
    b[i].roff = off;
    off += b[i].len + 1 + tu_rand(&rs) % 7;
  }
}

/* Put the blocks of src to the server, check its memory byte for byte, get them back
 * into dst, check dst byte for byte; async (poll until COMPLETED) or sync. */
static void flow_put_get(HixlClientHandle c, bool async, unsigned char *src, unsigned char *dst,
                         unsigned char *rbase, server *srv, uint64_t seed) {
  static block b[FLOW_OPS];
  static HixlOneSideOpDesc d[FLOW_OPS];
  unsigned char *want_srv = malloc(FLOW_REMOTE), *want_dst = malloc(FLOW_LOCAL);
  CompleteHandle h = NULL;
  size_t i;

  CU_ASSERT_PTR_NOT_NULL_FATAL(want_srv);
  CU_ASSERT_PTR_NOT_NULL_FATAL(want_dst);
  flow_layout(b, seed);
  tu_fill(src, FLOW_LOCAL, seed);
  tu_fill(srv->m.mem, FLOW_REMOTE, seed + 1000);
  memset(dst, 0x5a, FLOW_LOCAL);
  memcpy(want_srv, srv->m.mem, FLOW_REMOTE);
  memset(want_dst, 0x5a, FLOW_LOCAL);
  for (i = 0; i < FLOW_OPS; i++) {
    memcpy(want_srv + b[i].roff, src + b[i].loff, b[i].len);
    memcpy(want_dst + b[i].loff, src + b[i].loff, b[i].len);
    d[i] = op(src + b[i].loff, rbase + b[i].roff, b[i].len);
  }

  if (async) {
    TU_ASSERT_OK(HixlCSClientBatchPutAsync(c, FLOW_OPS, d, &h));
    ASSERT_BATCH_ENDS(c, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchPutAsync of varying blocks");
  } else {
    TU_ASSERT_OK(HixlCSClientBatchPutSync(c, FLOW_OPS, d, XFER_MS));
  }
  TU_ASSERT_SAME(srv->m.mem, want_srv, FLOW_REMOTE,
                 async ? "server memory after BatchPutAsync" : "server memory after BatchPutSync");
  CU_ASSERT_EQUAL(tu_check_byte(srv->m.base, SLACK, 0), -1);
  CU_ASSERT_EQUAL(tu_check_byte(srv->m.mem + FLOW_REMOTE, SLACK, 0), -1);

  for (i = 0; i < FLOW_OPS; i++) d[i].local_buf = dst + b[i].loff;
  if (async) {
    TU_ASSERT_OK(HixlCSClientBatchGetAsync(c, FLOW_OPS, d, &h));
    ASSERT_BATCH_ENDS(c, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchGetAsync of varying blocks");
  } else {
    TU_ASSERT_OK(HixlCSClientBatchGetSync(c, FLOW_OPS, d, XFER_MS));
  }
  TU_ASSERT_SAME(dst, want_dst, FLOW_LOCAL,
                 async ? "client memory after BatchGetAsync" : "client memory after BatchGetSync");
  free(want_srv);
  free(want_dst);
}

static void test_usage_flow(void) {
  const EndpointDesc ep = {.protocol = HIXL_EP_PROTOCOL_TCP, .address = "127.0.0.1", .device = NULL};
  const HixlServerConfig scfg = {{0}};
  const HixlClientConfig ccfg = {{0}};
  uint16_t port = tu_free_port();
  HixlServerDesc sdesc = {
      .server_ip = "127.0.0.1", .server_port = port, .endpoint_list = &ep, .endpoint_list_num = 1};
  HixlClientDesc cdesc = {
      .server_ip = "127.0.0.1", .server_port = port, .local_endpoint = &ep, .remote_endpoint = &ep};
  HixlClientHandle cli = NULL;
  server srv;
  region src, dst;
  HcommMem m, *remote = NULL;
  char **tags = NULL;
  uint32_t num = 0, i;
  unsigned char *rbase = NULL;

  memset(&srv, 0, sizeof(srv));
  memset(&src, 0, sizeof(src));
  memset(&dst, 0, sizeof(dst));
  CU_ASSERT_FATAL(port != 0);
  unsetenv(TIMEOUT_ENV);

  /* Server: Create -> RegMem("server_mem") -> Listen. */
  srv.port = port;
  if (!region_map(&srv.m, FLOW_REMOTE) || !region_map(&src, FLOW_LOCAL) || !region_map(&dst, FLOW_LOCAL)) {
    CU_FAIL("mmap");
    goto out;
  }
  TU_ASSERT_OK(HixlCSServerCreate(&sdesc, &scfg, &srv.h));
  if (!srv.h) goto out;
  m = host_mem(srv.m.mem, FLOW_REMOTE);
  TU_ASSERT_OK(HixlCSServerRegMem(srv.h, "server_mem", &m, &srv.m.h));
  TU_ASSERT_OK(HixlCSServerListen(srv.h, 1024));

  /* Client: Create -> RegMem("client_mem") -> Connect -> GetRemoteMem. */
  TU_ASSERT_OK(HixlCSClientCreate(&cdesc, &ccfg, &cli));
  if (!cli) goto out;
  m = host_mem(src.mem, FLOW_LOCAL);
  TU_ASSERT_OK(HixlCSClientRegMem(cli, "client_mem", &m, &src.h));
  m = host_mem(dst.mem, FLOW_LOCAL);
  TU_ASSERT_OK(HixlCSClientRegMem(cli, "client_dst", &m, &dst.h));
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  TU_ASSERT_OK(HixlCSClientGetRemoteMem(cli, &remote, &tags, &num, 2000));
  CU_ASSERT_EQUAL(num, 1);
  CU_ASSERT_PTR_NOT_NULL(remote);
  CU_ASSERT_PTR_NOT_NULL(tags);
  for (i = 0; remote && tags && i < num; i++) {
    CU_ASSERT_PTR_NOT_NULL(tags[i]);
    if (tags[i] && strcmp(tags[i], "server_mem") == 0) rbase = remote[i].addr;
  }
  if (!rbase) {
    tu_fail(__FILE__, __LINE__, "GetRemoteMem: no registration tagged \"server_mem\" among %u", num);
    goto out;
  }
  CU_ASSERT_STRING_EQUAL(tags[0], "server_mem");
  CU_ASSERT_PTR_EQUAL(remote[0].addr, srv.m.mem);
  CU_ASSERT_EQUAL(remote[0].size, FLOW_REMOTE);
  CU_ASSERT_EQUAL(remote[0].type, HCCL_MEM_TYPE_HOST);

  /* BatchPutAsync / BatchGetAsync polled to COMPLETED, then the same with *Sync. */
  flow_put_get(cli, true, src.mem, dst.mem, rbase, &srv, 101);
  flow_put_get(cli, false, src.mem, dst.mem, rbase, &srv, 102);

out:
  /* UnregMem and Destroy on both sides, all SUCCESS. */
  if (cli) {
    if (src.h) TU_ASSERT_OK(HixlCSClientUnregMem(cli, src.h));
    if (dst.h) TU_ASSERT_OK(HixlCSClientUnregMem(cli, dst.h));
    TU_ASSERT_OK(HixlCSClientDestroy(cli));
  }
  region_unmap(&src);
  region_unmap(&dst);
  if (srv.h && srv.m.h) TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, srv.m.h));
  if (srv.h) TU_ASSERT_OK(HixlCSServerDestroy(srv.h));
  region_unmap(&srv.m);
}

/* The same flow with the server in another process: contiguous blocks of varying
 * sizes, checked by the server child against the pattern and read back here. */
static void test_usage_flow_two_processes(void) {
  static const size_t sizes[] = {1, 4 * KiB, 64 * KiB + 3, MiB, 5 * MiB, 7, 3 * MiB + 1};
  const size_t ns = sizeof(sizes) / sizeof(sizes[0]), nops = 2 * ns, len = 20 * MiB;
  HixlOneSideOpDesc d[2 * sizeof(sizes) / sizeof(sizes[0])];
  uint16_t port = tu_free_port();
  HixlClientHandle cli;
  CompleteHandle h = NULL;
  region src, dst;
  HcommMem rm;
  srvchild sc;
  size_t i, off, total;

  CU_ASSERT_FATAL(port != 0);
  if (!srvchild_start(&sc, port, len, 0)) return;
  memset(&src, 0, sizeof(src));
  memset(&dst, 0, sizeof(dst));
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, len, "client_mem") || !client_region(cli, &dst, len, "client_dst"))
    goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (!remote_find(cli, "server_mem", &rm)) goto out;
  CU_ASSERT_EQUAL((uintptr_t)rm.addr, sc.info.addr);
  CU_ASSERT_EQUAL(rm.size, len);
  CU_ASSERT_EQUAL(rm.type, HCCL_MEM_TYPE_HOST);

  /* Async: blocks back to back at the same offsets on both sides. */
  for (i = 0, off = 0; i < nops; off += sizes[i % ns], i++)
    d[i] = op(src.mem + off, (unsigned char *)rm.addr + off, sizes[i % ns]);
  total = off;
  CU_ASSERT_FATAL(total <= len);
  tu_fill(src.mem, total, 201);
  TU_ASSERT_OK(HixlCSClientBatchPutAsync(cli, (uint32_t)nops, d, &h));
  ASSERT_BATCH_ENDS(cli, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchPutAsync to the child");
  srvchild_expect(&sc, 0, total, 201, "child memory after BatchPutAsync");
  /* Read back split the other way round. */
  for (i = 0, off = 0; i < nops; off += sizes[ns - 1 - i % ns], i++)
    d[i] = op(dst.mem + off, (unsigned char *)rm.addr + off, sizes[ns - 1 - i % ns]);
  TU_ASSERT_OK(HixlCSClientBatchGetAsync(cli, (uint32_t)nops, d, &h));
  ASSERT_BATCH_ENDS(cli, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchGetAsync from the child");
  TU_ASSERT_PATTERN(dst.mem, total, 201, "BatchGetAsync from the child");

  /* Sync, new data. */
  tu_fill(src.mem, total, 202);
  for (i = 0; i < nops; i++) d[i].local_buf = src.mem + ((unsigned char *)d[i].local_buf - dst.mem);
  TU_ASSERT_OK(HixlCSClientBatchPutSync(cli, (uint32_t)nops, d, XFER_MS));
  srvchild_expect(&sc, 0, total, 202, "child memory after BatchPutSync");
  memset(dst.mem, 0, total);
  for (i = 0; i < nops; i++) d[i].local_buf = dst.mem + ((unsigned char *)d[i].local_buf - src.mem);
  TU_ASSERT_OK(HixlCSClientBatchGetSync(cli, (uint32_t)nops, d, XFER_MS));
  TU_ASSERT_PATTERN(dst.mem, total, 202, "BatchGetSync from the child");

out:
  client_region_free(cli, &src);
  client_region_free(cli, &dst);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  srvchild_quit(&sc);
}

/* shm endpoints: a server offering shm and a client asking for it move data between
 * the two by process_vm_*; a server offering tcp only refuses such a client clearly. */
static void test_shm_endpoints(void) {
  const EndpointDesc shm = {.protocol = HIXL_EP_PROTOCOL_SHM, .address = NULL, .device = NULL};
  const EndpointDesc local = {.protocol = HIXL_EP_PROTOCOL_SHM, .address = "127.0.0.1", .device = NULL};
  const size_t len = 3 * MiB + 5;
  for (int offer = 1; offer >= 0; offer--) {
    uint16_t port = tu_free_port();
    HixlServerDesc sd = {.server_ip = "127.0.0.1",
                         .server_port = port,
                         .endpoint_list = offer ? &shm : NULL,
                         .endpoint_list_num = offer ? 1u : 0u};
    HixlClientDesc cd = {
        .server_ip = "127.0.0.1", .server_port = port, .local_endpoint = &local, .remote_endpoint = &shm};
    HixlServerHandle s = NULL;
    HixlClientHandle c = NULL;
    region sm, a, b;
    MemHandle smh = NULL;
    HcommMem m, rm;
    memset(&sm, 0, sizeof(sm));
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    CU_ASSERT_FATAL(port != 0 && region_map(&sm, len));
    m = host_mem(sm.mem, len);
    TU_ASSERT_OK(HixlCSServerCreate(&sd, NULL, &s));
    TU_ASSERT_OK(HixlCSServerRegMem(s, "server_mem", &m, &smh));
    TU_ASSERT_OK(HixlCSServerListen(s, 0));
    TU_ASSERT_OK(HixlCSClientCreate(&cd, NULL, &c));
    if (c && client_region(c, &a, len, "a") && client_region(c, &b, len, "b")) {
      if (offer) {
        TU_ASSERT_OK(HixlCSClientConnect(c, CONNECT_MS));
        if (remote_find(c, "server_mem", &rm)) put_get_check(c, a.mem, b.mem, rm.addr, sm.mem, len, 301);
      } else {
        TU_ASSERT_STATUS(HixlCSClientConnect(c, CONNECT_MS), HIXL_FAILED);
        TU_ASSERT_ERRMSG_HAS("shm");
      }
    }
    client_region_free(c, &a);
    client_region_free(c, &b);
    if (c) TU_ASSERT_OK(HixlCSClientDestroy(c));
    if (smh) TU_ASSERT_OK(HixlCSServerUnregMem(s, smh));
    if (s) TU_ASSERT_OK(HixlCSServerDestroy(s));
    region_unmap(&sm);
  }
}

/* Four threads share one client (every call is safe from any thread): each puts and
 * gets its own slice, async and sync, and checks it. */
#define THR_N     4
#define THR_SLICE (4 * MiB)
#define THR_ROUND 32

struct thr_arg {
  HixlClientHandle cli;
  unsigned char *local, *back, *remote;
  int index;
  int failures;
  char first[256];
};

static void thr_fail(struct thr_arg *a, const char *what, HixlStatus st) {
  if (a->failures++ == 0)
    snprintf(a->first, sizeof(a->first), "thread %d: %s: %s (%s)", a->index, what, HixlStatusName(st),
             HixlGetLastErrorMessage());
}

static void *thr_main(void *p) {
  struct thr_arg *a = p;
  const size_t blk = THR_SLICE / THR_ROUND;
  HixlOneSideOpDesc d;
  CompleteHandle h;
  HixlCompleteStatus s;
  HixlStatus st;
  int r;

  for (r = 0; r < THR_ROUND; r++) {
    uint64_t seed = 1000 + (uint64_t)a->index * 100 + (uint64_t)r;
    unsigned char *l = a->local + (size_t)r * blk, *b = a->back + (size_t)r * blk,
                  *rm = a->remote + (size_t)r * blk;
    tu_fill(l, blk, seed);
    memset(b, 0, blk);
    d = op(l, rm, blk);
    if (r % 2) {
      if ((st = HixlCSClientBatchPutSync(a->cli, 1, &d, XFER_MS)) != HIXL_SUCCESS)
        thr_fail(a, "BatchPutSync", st);
    } else if ((st = HixlCSClientBatchPutAsync(a->cli, 1, &d, &h)) != HIXL_SUCCESS) {
      thr_fail(a, "BatchPutAsync", st);
    } else if ((st = wait_batch(a->cli, h, tu_now_ms() + XFER_MS, &s, NULL, 0)) != HIXL_SUCCESS ||
               s != HIXL_COMPLETE_STATUS_COMPLETED) {
      thr_fail(a, "BatchPutAsync did not complete", st);
    }
    d = op(b, rm, blk);
    if (r % 2) {
      if ((st = HixlCSClientBatchGetAsync(a->cli, 1, &d, &h)) != HIXL_SUCCESS)
        thr_fail(a, "BatchGetAsync", st);
      else if ((st = wait_batch(a->cli, h, tu_now_ms() + XFER_MS, &s, NULL, 0)) != HIXL_SUCCESS ||
               s != HIXL_COMPLETE_STATUS_COMPLETED)
        thr_fail(a, "BatchGetAsync did not complete", st);
    } else if ((st = HixlCSClientBatchGetSync(a->cli, 1, &d, XFER_MS)) != HIXL_SUCCESS) {
      thr_fail(a, "BatchGetSync", st);
    }
    if (tu_check_pattern(b, blk, seed) >= 0) thr_fail(a, "data read back differs", HIXL_SUCCESS);
  }
  return NULL;
}

static void test_threads(void) {
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  struct thr_arg a[THR_N];
  pthread_t th[THR_N];
  server srv;
  region src, back;
  HcommMem rm;
  int i, started = 0;

  memset(&src, 0, sizeof(src));
  memset(&back, 0, sizeof(back));
  if (!server_up(&srv, port, THR_N * THR_SLICE, "server_mem", true)) goto out;
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, THR_N * THR_SLICE, "client_mem") ||
      !client_region(cli, &back, THR_N * THR_SLICE, "client_back"))
    goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (!remote_find(cli, "server_mem", &rm)) goto out;
  for (i = 0; i < THR_N; i++) {
    memset(&a[i], 0, sizeof(a[i]));
    a[i].cli = cli;
    a[i].index = i;
    a[i].local = src.mem + (size_t)i * THR_SLICE;
    a[i].back = back.mem + (size_t)i * THR_SLICE;
    a[i].remote = (unsigned char *)rm.addr + (size_t)i * THR_SLICE;
    if (pthread_create(&th[i], NULL, thr_main, &a[i]) != 0) break;
    started++;
  }
  CU_ASSERT_EQUAL(started, THR_N);
  for (i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    if (a[i].failures)
      tu_fail(__FILE__, __LINE__, "%d failures; first: %s", a[i].failures, a[i].first);
    else
      CU_PASS("thread ok");
  }
  TU_ASSERT_SAME(srv.m.mem, src.mem, (size_t)started * THR_SLICE, "server memory after four threads");
out:
  client_region_free(cli, &src);
  client_region_free(cli, &back);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  server_down(&srv);
}

/* Destroy racing calls on the same client (issue 28): calls in flight finish on a live
 * client, later ones are refused PARAM_INVALID, and nothing is used after it was freed
 * (ASan and TSan runs of this test are clean). Each thread WRITEs its own 8 MiB slice
 * again and again until the client is gone. */
#define RACE_THREADS 2
#define RACE_SLICE   (8u << 20) /* long calls: Destroy lands inside one */
struct race_arg {
  HixlClientHandle cli;
  unsigned char *local, *remote;
  atomic_int ok; /* calls that succeeded */
  int refused, other;
  HixlStatus last_other;
};

static void *race_main(void *p) {
  struct race_arg *a = p;
  HixlOneSideOpDesc d = {.remote_buf = a->remote, .local_buf = a->local, .len = RACE_SLICE};
  for (;;) {
    HixlStatus st = HixlCSClientBatchPutSync(a->cli, 1, &d, 5000);
    if (st == HIXL_SUCCESS) {
      atomic_fetch_add(&a->ok, 1);
    } else if (st == HIXL_PARAM_INVALID) {
      a->refused++; /* destroyed: the end */
      return NULL;
    } else {
      a->other++;
      a->last_other = st;
      return NULL;
    }
  }
}

static void test_destroy_races_calls(void) {
  uint16_t port = tu_free_port();
  server srv;
  region src;
  HcommMem rm;
  struct race_arg a[RACE_THREADS];
  pthread_t th[RACE_THREADS];
  memset(&src, 0, sizeof(src));
  CU_ASSERT_FATAL(server_up(&srv, port, RACE_THREADS * RACE_SLICE, "server_mem", true));
  HixlClientHandle cli = client_new(port, NULL);
  CU_ASSERT_FATAL(cli != NULL);
  CU_ASSERT_FATAL(client_region(cli, &src, RACE_THREADS * RACE_SLICE, "client_mem"));
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  CU_ASSERT_FATAL(remote_find(cli, "server_mem", &rm));
  for (int i = 0; i < RACE_THREADS; i++) {
    memset(&a[i], 0, sizeof(a[i]));
    a[i].cli = cli;
    a[i].local = src.mem + (size_t)i * RACE_SLICE;
    a[i].remote = (unsigned char *)rm.addr + (size_t)i * RACE_SLICE;
    memset(a[i].local, 0x40 + i, RACE_SLICE);
    CU_ASSERT_FATAL(pthread_create(&th[i], NULL, race_main, &a[i]) == 0);
  }
  for (int i = 0; i < RACE_THREADS; i++) /* each thread wrote its slice and is in its loop */
    while (atomic_load(&a[i].ok) < 2) sched_yield();
  TU_ASSERT_OK(HixlCSClientDestroy(cli)); /* waits for the calls in flight */
  for (int i = 0; i < RACE_THREADS; i++) {
    pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(a[i].refused, 1);
    CU_ASSERT_EQUAL(a[i].other, 0);
    if (a[i].other) tu_fail(__FILE__, __LINE__, "thread %d: %s", i, HixlStatusName(a[i].last_other));
    CU_ASSERT_EQUAL(tu_check_byte(srv.m.mem + (size_t)i * RACE_SLICE, RACE_SLICE, (uint8_t)(0x40 + i)), -1);
  }
  region_unmap(&src); /* its registration went with the client */
  server_down(&srv);
}

/* ---------------------------------------------------------------- 2. arguments and rules */

/* One in-process server and one connected client shared by the argument tests. */
#define PAIR_LEN (8 * MiB)
static struct {
  server srv;
  HixlClientHandle cli;
  region src, dst;
  unsigned char *raddr; /* the server memory as GetRemoteMem lists it */
} g;

static int pair_init(void) {
  HcommMem rm;
  uint16_t port = tu_free_port();

  memset(&g, 0, sizeof(g));
  if (!port || !server_up(&g.srv, port, PAIR_LEN, "server_mem", true)) return -1;
  g.cli = client_new(port, NULL);
  if (!g.cli || !client_region(g.cli, &g.src, PAIR_LEN, "client_mem") ||
      !client_region(g.cli, &g.dst, PAIR_LEN, "client_dst"))
    return -1;
  if (HixlCSClientConnect(g.cli, CONNECT_MS) != HIXL_SUCCESS) {
    fprintf(stderr, "pair_init: Connect: %s\n", HixlGetLastErrorMessage());
    return -1;
  }
  if (!remote_find(g.cli, "server_mem", &rm)) return -1;
  g.raddr = rm.addr;
  return 0;
}

static int pair_cleanup(void) {
  int rc = 0;

  client_region_free(g.cli, &g.src);
  client_region_free(g.cli, &g.dst);
  if (g.cli && !CALL_OK(HixlCSClientDestroy(g.cli))) rc = -1;
  server_down(&g.srv);
  memset(&g, 0, sizeof(g));
  return rc;
}

#define SENTINEL ((void *)(uintptr_t)0x5e5e5e5e)

static void test_server_create_args(void) {
  const EndpointDesc tcp = {.protocol = HIXL_EP_PROTOCOL_TCP, .address = NULL, .device = NULL};
  const EndpointDesc tcp_bad = {.protocol = HIXL_EP_PROTOCOL_TCP, .address = "1.2.3", .device = NULL};
  const EndpointDesc rdma = {.protocol = HIXL_EP_PROTOCOL_RDMA, .address = "127.0.0.1", .device = "rxe0"};
  const EndpointDesc shm = {.protocol = HIXL_EP_PROTOCOL_SHM, .address = NULL, .device = NULL};
  const EndpointDesc unknown = {.protocol = (HixlEndpointProtocol)7, .address = NULL, .device = NULL};
  const EndpointDesc two[2] = {tcp, shm};
  HixlServerDesc d = {
      .server_ip = "127.0.0.1", .server_port = 4000, .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlServerDesc bad;
  HixlServerHandle h = SENTINEL;
  const char *bad_ips[] = {"1.2.3", "256.1.1.1", "localhost", "", "127.0.0.1:80", NULL};
  size_t i;

  TU_ASSERT_STATUS(HixlCSServerCreate(NULL, NULL, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSServerCreate(&d, NULL, NULL), HIXL_PARAM_INVALID);
  for (i = 0; i < sizeof(bad_ips) / sizeof(bad_ips[0]); i++) {
    bad = d;
    bad.server_ip = bad_ips[i];
    TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  }
  bad = d;
  bad.server_port = 0;
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad.server_port = 70000;
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("70000");
  bad = d;
  bad.endpoint_list_num = 1; /* NULL list */
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  /* An rdma endpoint is offered beside tcp (auto): without a device the server still
   * serves tcp clients. */
  bad.endpoint_list = &rdma;
  TU_ASSERT_OK(HixlCSServerCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
  h = SENTINEL;
  bad.endpoint_list = &shm; /* offered beside tcp (auto) */
  TU_ASSERT_OK(HixlCSServerCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
  h = SENTINEL;
  bad.endpoint_list = &unknown;
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad.endpoint_list = &tcp_bad;
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  const EndpointDesc tcp_unknown[2] = {tcp, unknown};
  bad.endpoint_list = tcp_unknown; /* one bad entry is enough to refuse */
  bad.endpoint_list_num = 2;
  TU_ASSERT_STATUS(HixlCSServerCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(h, SENTINEL); /* outputs are written only on success */
  bad.endpoint_list = two;
  TU_ASSERT_OK(HixlCSServerCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
  h = SENTINEL;

  /* Valid: defaults, a zeroed config, an explicit tcp endpoint, port 65535, 0.0.0.0. */
  TU_ASSERT_OK(HixlCSServerCreate(&d, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
  {
    const HixlServerConfig cfg = {{0}};
    HixlServerDesc ok = d;
    ok.endpoint_list = &tcp;
    ok.endpoint_list_num = 1;
    ok.server_port = 65535;
    h = SENTINEL;
    TU_ASSERT_OK(HixlCSServerCreate(&ok, &cfg, &h));
    if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
    ok.server_ip = "0.0.0.0";
    h = SENTINEL;
    TU_ASSERT_OK(HixlCSServerCreate(&ok, &cfg, &h));
    if (h != SENTINEL) TU_ASSERT_OK(HixlCSServerDestroy(h));
  }
}

static void test_client_create_args(void) {
  const EndpointDesc tcp = {.protocol = HIXL_EP_PROTOCOL_TCP, .address = "127.0.0.1", .device = NULL};
  const EndpointDesc tcp_bad = {.protocol = HIXL_EP_PROTOCOL_TCP, .address = "1.2.3", .device = NULL};
  const EndpointDesc rdma = {.protocol = HIXL_EP_PROTOCOL_RDMA, .address = NULL, .device = "rxe0"};
  const EndpointDesc shm = {.protocol = HIXL_EP_PROTOCOL_SHM, .address = NULL, .device = NULL};
  const EndpointDesc unknown = {.protocol = (HixlEndpointProtocol)-1, .address = NULL, .device = NULL};
  HixlClientDesc d = {
      .server_ip = "127.0.0.1", .server_port = 4000, .local_endpoint = NULL, .remote_endpoint = NULL};
  HixlClientDesc bad;
  HixlClientHandle h = SENTINEL;
  const char *bad_ips[] = {"1.2.3", "1.2.3.4.5", "::1", "x", NULL};
  const char *bad_env[] = {"0", "-5", "abc", "12ms", "99999999999"};
  size_t i;

  TU_ASSERT_STATUS(HixlCSClientCreate(NULL, NULL, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientCreate(&d, NULL, NULL), HIXL_PARAM_INVALID);
  for (i = 0; i < sizeof(bad_ips) / sizeof(bad_ips[0]); i++) {
    bad = d;
    bad.server_ip = bad_ips[i];
    TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  }
  bad = d;
  bad.server_port = 0;
  TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad.server_port = 70000;
  TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad = d;
  /* A client that asks for rdma gets it or a clear failure (no device here). */
  bad.local_endpoint = &rdma;
  if (!rdma_available()) {
    TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_FAILED);
    TU_ASSERT_ERRMSG_HAS("RDMA");
  }
  bad.local_endpoint = &shm;
  TU_ASSERT_OK(HixlCSClientCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSClientDestroy(h));
  h = SENTINEL;
  bad.local_endpoint = &unknown;
  TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad.local_endpoint = &tcp_bad;
  TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  bad = d;
  bad.remote_endpoint = &rdma; /* checked only: the server is reached at server_ip */
  TU_ASSERT_OK(HixlCSClientCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSClientDestroy(h));
  h = SENTINEL;
  bad.remote_endpoint = &shm;
  TU_ASSERT_OK(HixlCSClientCreate(&bad, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSClientDestroy(h));
  h = SENTINEL;
  bad.remote_endpoint = &unknown;
  TU_ASSERT_STATUS(HixlCSClientCreate(&bad, NULL, &h), HIXL_PARAM_INVALID);
  /* HIXL_CS_BATCH_TIMEOUT_MS must be a number of ms in [1, INT32_MAX]. */
  for (i = 0; i < sizeof(bad_env) / sizeof(bad_env[0]); i++) {
    setenv(TIMEOUT_ENV, bad_env[i], 1);
    TU_ASSERT_STATUS(HixlCSClientCreate(&d, NULL, &h), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS(TIMEOUT_ENV);
  }
  unsetenv(TIMEOUT_ENV);
  CU_ASSERT_PTR_EQUAL(h, SENTINEL);

  /* Valid: defaults, a zeroed config, explicit tcp endpoints on both ends. */
  TU_ASSERT_OK(HixlCSClientCreate(&d, NULL, &h));
  if (h != SENTINEL) TU_ASSERT_OK(HixlCSClientDestroy(h));
  {
    const HixlClientConfig cfg = {{0}};
    HixlClientDesc ok = d;
    ok.local_endpoint = &tcp;
    ok.remote_endpoint = &tcp;
    h = SENTINEL;
    TU_ASSERT_OK(HixlCSClientCreate(&ok, &cfg, &h));
    if (h != SENTINEL) TU_ASSERT_OK(HixlCSClientDestroy(h));
  }
}

/* RegMem / UnregMem rules, the same on both sides. */
static void regmem_args(bool server_side) {
  char tag256[HIXL_CS_MAX_TAG_LEN + 2], tag255[HIXL_CS_MAX_TAG_LEN + 1];
  void *h = server_side ? g.srv.h : g.cli;
  unsigned char *buf = malloc(64 * KiB);
  HcommMem m;
  MemHandle mh = SENTINEL, mh2 = NULL;
#define REG(tag, mem, out)                                                                                   \
  (server_side ? HixlCSServerRegMem(h, (tag), (mem), (out)) : HixlCSClientRegMem(h, (tag), (mem), (out)))
#define UNREG(mhandle) (server_side ? HixlCSServerUnregMem(h, (mhandle)) : HixlCSClientUnregMem(h, (mhandle)))

  CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
  memset(tag256, 'a', sizeof(tag256) - 1);
  tag256[sizeof(tag256) - 1] = '\0';
  memset(tag255, 'b', sizeof(tag255) - 1);
  tag255[sizeof(tag255) - 1] = '\0';
  m = host_mem(buf, 64 * KiB);
  TU_ASSERT_STATUS(REG("t", NULL, &mh), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(REG("t", &m, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(REG(tag256, &m, &mh), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("255");
  m.type = HCCL_MEM_TYPE_DEVICE; /* host memory said to be device memory */
  TU_ASSERT_STATUS(REG("t", &m, &mh), tu_device_refusal());
  m.type = (HcommMemType)9;
  TU_ASSERT_STATUS(REG("t", &m, &mh), HIXL_PARAM_INVALID);
  m = host_mem(NULL, 64 * KiB);
  TU_ASSERT_STATUS(REG("t", &m, &mh), HIXL_PARAM_INVALID);
  m = host_mem(buf, 0);
  TU_ASSERT_STATUS(REG("t", &m, &mh), HIXL_PARAM_INVALID);
  m = host_mem((void *)(uintptr_t)(UINTPTR_MAX - 100), 4096); /* wraps around */
  TU_ASSERT_STATUS(REG("t", &m, &mh), HIXL_PARAM_INVALID);
  m = host_mem(server_side ? g.srv.m.mem + 4096 : g.src.mem + 4096, 4096); /* overlaps a registration */
  TU_ASSERT_STATUS(REG("t", &m, &mh), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(mh, SENTINEL);

  /* A 255-byte tag and a NULL tag are fine; unregistering twice is not. */
  m = host_mem(buf, 32 * KiB);
  TU_ASSERT_OK(REG(tag255, &m, &mh));
  m = host_mem(buf + 32 * KiB, 32 * KiB);
  TU_ASSERT_OK(REG(NULL, &m, &mh2));
  if (mh != SENTINEL) TU_ASSERT_OK(UNREG(mh));
  if (mh2) TU_ASSERT_OK(UNREG(mh2));
  if (mh != SENTINEL) TU_ASSERT_STATUS(UNREG(mh), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(UNREG(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(UNREG((MemHandle)&m), HIXL_PARAM_INVALID);
  /* The other side's handle is not ours. */
  TU_ASSERT_STATUS(UNREG(server_side ? g.src.h : g.srv.m.h), HIXL_PARAM_INVALID);
  free(buf);
#undef REG
#undef UNREG
}

static void test_regmem_args(void) {
  regmem_args(true);
  regmem_args(false);
}

static void test_listen_args(void) {
  HixlServerDesc d = {
      .server_ip = "127.0.0.1", .server_port = tu_free_port(), .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlServerHandle h = NULL;

  TU_ASSERT_STATUS(HixlCSServerListen(g.srv.h, 0), HIXL_PARAM_INVALID); /* listens already */
  TU_ASSERT_ERRMSG_HAS("already");
  TU_ASSERT_OK(HixlCSServerCreate(&d, NULL, &h));
  TU_ASSERT_STATUS(HixlCSServerListen(h, 70000), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlCSServerListen(h, 1));
  TU_ASSERT_STATUS(HixlCSServerListen(h, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSServerListen(h, 0), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlCSServerDestroy(h));
  /* A server on a port another one holds cannot listen. */
  d.server_port = g.srv.port;
  TU_ASSERT_OK(HixlCSServerCreate(&d, NULL, &h));
  {
    HixlStatus st = HixlCSServerListen(h, 0);
    if (st == HIXL_SUCCESS)
      tu_fail(__FILE__, __LINE__, "Listen on a port in use gave SUCCESS");
    else
      CU_PASS("Listen on a port in use refused");
  }
  TU_ASSERT_OK(HixlCSServerDestroy(h));
}

typedef enum { PUT_ASYNC, GET_ASYNC, PUT_SYNC, GET_SYNC } batch_kind;
static const char *const batch_names[] = {"BatchPutAsync", "BatchGetAsync", "BatchPutSync", "BatchGetSync"};

static HixlStatus batch_call(batch_kind k, HixlClientHandle c, uint32_t n, const HixlOneSideOpDesc *d,
                             CompleteHandle *h) {
  switch (k) {
  case PUT_ASYNC: return HixlCSClientBatchPutAsync(c, n, d, h);
  case GET_ASYNC: return HixlCSClientBatchGetAsync(c, n, d, h);
  case PUT_SYNC: return HixlCSClientBatchPutSync(c, n, d, XFER_MS);
  case GET_SYNC: return HixlCSClientBatchGetSync(c, n, d, XFER_MS);
  }
  return HIXL_FAILED;
}

static void test_batch_args(void) {
  const uint32_t too_many = 65537; /* one more op than a batch may hold */
  HixlOneSideOpDesc d[2], *many = calloc(too_many, sizeof(*many));
  CompleteHandle h = SENTINEL;
  char what[96];
  uint32_t i;
  int k;

  CU_ASSERT_PTR_NOT_NULL_FATAL(many);
  for (i = 0; i < too_many; i++) many[i] = op(g.src.mem + (i % 1024) * 64, g.raddr + (i % 1024) * 64, 64);
  for (k = PUT_ASYNC; k <= GET_SYNC; k++) {
    bool async = k == PUT_ASYNC || k == GET_ASYNC;
    snprintf(what, sizeof(what), "%s", batch_names[k]);
    d[0] = op(g.src.mem, g.raddr, 64);
    d[1] = op(g.src.mem + 64, g.raddr + 64, 64);
    TU_ASSERT_STATUS(batch_call(k, g.cli, 0, d, &h), HIXL_PARAM_INVALID); /* list_num 0 */
    TU_ASSERT_STATUS(batch_call(k, g.cli, 1, NULL, &h), HIXL_PARAM_INVALID);
    if (async) {
      TU_ASSERT_STATUS(batch_call(k, g.cli, 1, d, NULL), HIXL_PARAM_INVALID);
    }
    d[1].len = 0;
    TU_ASSERT_STATUS(batch_call(k, g.cli, 2, d, &h), HIXL_PARAM_INVALID);
    /* Local memory that is not registered (or runs past a registration) is not an
     * argument error: the engine stages it through its BufferPool (test_staging). */
    d[1] = op((void *)(uintptr_t)(UINTPTR_MAX - 8), g.raddr, 64); /* wraps around */
    TU_ASSERT_STATUS(batch_call(k, g.cli, 2, d, &h), HIXL_PARAM_INVALID);
    TU_ASSERT_STATUS(batch_call(k, g.cli, too_many, many, &h), HIXL_PARAM_INVALID);
    CU_ASSERT_PTR_EQUAL(h, SENTINEL);
    /* Nothing went out: a good batch still works on the link. */
    d[0] = op(g.src.mem, g.raddr, 64);
    tu_fill(g.src.mem, 64, 300 + (uint64_t)k);
    if (k == PUT_ASYNC || k == PUT_SYNC) {
      if (async) {
        ASSERT_ASYNC_ENDS(g.cli, true, 1, d, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, what);
      } else {
        TU_ASSERT_OK(batch_call(k, g.cli, 1, d, NULL));
      }
      TU_ASSERT_PATTERN(g.srv.m.mem, 64, 300 + (uint64_t)k, what);
    }
  }
  /* The largest batch allowed is fine. */
  TU_ASSERT_OK(HixlCSClientBatchPutSync(g.cli, too_many - 1, many, XFER_MS));
  free(many);
}

/* Client memory that is not registered is staged through the client engine's pool
 * (BufferPool, default 4:8): every batch kind moves it, byte for byte. */
static void test_unregistered_client_memory(void) {
  const size_t len = 3 * MiB + 5; /* two ops: one small (packed), one larger than a MiB */
  unsigned char *src = malloc(len), *dst = malloc(len);
  HixlOneSideOpDesc d[2];
  CompleteHandle h = SENTINEL;
  char what[96];

  CU_ASSERT_PTR_NOT_NULL_FATAL(src);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dst);
  for (int k = PUT_ASYNC; k <= GET_SYNC; k++) {
    bool put = k == PUT_ASYNC || k == PUT_SYNC, async = k == PUT_ASYNC || k == GET_ASYNC;
    snprintf(what, sizeof(what), "%s of unregistered client memory", batch_names[k]);
    tu_fill(src, len, 900 + (uint64_t)k);
    tu_fill(g.srv.m.mem, len, 950 + (uint64_t)k);
    memset(dst, 0, len);
    unsigned char *local = put ? src : dst;
    d[0] = op(local, g.raddr, 100);
    d[1] = op(local + 100, g.raddr + 100, len - 100);
    h = SENTINEL;
    TU_ASSERT_OK(batch_call(k, g.cli, 2, d, async ? &h : NULL));
    if (async) ASSERT_BATCH_ENDS(g.cli, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, what);
    if (put)
      TU_ASSERT_SAME(g.srv.m.mem, src, len, what);
    else
      TU_ASSERT_PATTERN(dst, len, 950 + (uint64_t)k, what);
  }
  free(src);
  free(dst);
}

static void test_remote_mem_args(void) {
  HcommMem *list = SENTINEL;
  char **tags = SENTINEL;
  uint32_t n = 7;

  TU_ASSERT_STATUS(HixlCSClientGetRemoteMem(g.cli, NULL, &tags, &n, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientGetRemoteMem(g.cli, &list, NULL, &n, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientGetRemoteMem(g.cli, &list, &tags, NULL, 1000), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(list, SENTINEL);
  CU_ASSERT_PTR_EQUAL(tags, SENTINEL);
  CU_ASSERT_EQUAL(n, 7);
  TU_ASSERT_OK(HixlCSClientGetRemoteMem(g.cli, &list, &tags, &n, 0)); /* 0: the default timeout */
  CU_ASSERT_EQUAL(n, 1);
}

/* Every function given a NULL, made-up or destroyed handle: PARAM_INVALID, no crash. */
static void bad_handle_calls(HixlServerHandle s, HixlClientHandle c, MemHandle smh, MemHandle cmh,
                             const char *what) {
  unsigned char buf[64];
  HcommMem m = host_mem(buf, sizeof(buf));
  HixlOneSideOpDesc d = op(buf, g.raddr, sizeof(buf));
  MemHandle mh = SENTINEL;
  CompleteHandle ch = SENTINEL;
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  HcommMem *list = SENTINEL;
  char **tags = SENTINEL;
  uint32_t n = 7;
  char msg[128];
#define BAD(expr)                                                                                            \
  do {                                                                                                       \
    snprintf(msg, sizeof(msg), "%s: %s", what, #expr);                                                       \
    (void)tu_status_is((expr), HIXL_PARAM_INVALID, msg, __FILE__, __LINE__);                                 \
  } while (0)

  BAD(HixlCSServerRegMem(s, "t", &m, &mh));
  BAD(HixlCSServerListen(s, 0));
  BAD(HixlCSServerUnregMem(s, smh));
  BAD(HixlCSServerDestroy(s));
  BAD(HixlCSClientConnect(c, 100));
  BAD(HixlCSClientGetRemoteMem(c, &list, &tags, &n, 100));
  BAD(HixlCSClientRegMem(c, "t", &m, &mh));
  BAD(HixlCSClientUnregMem(c, cmh));
  BAD(HixlCSClientBatchPutAsync(c, 1, &d, &ch));
  BAD(HixlCSClientBatchGetAsync(c, 1, &d, &ch));
  BAD(HixlCSClientQueryCompleteStatus(c, SENTINEL, &cs));
  BAD(HixlCSClientBatchPutSync(c, 1, &d, 100));
  BAD(HixlCSClientBatchGetSync(c, 1, &d, 100));
  BAD(HixlCSClientDestroy(c));
  CU_ASSERT_PTR_EQUAL(mh, SENTINEL);
  CU_ASSERT_PTR_EQUAL(ch, SENTINEL);
  CU_ASSERT_PTR_EQUAL(list, SENTINEL);
#undef BAD
}

static void test_bad_handles(void) {
  HixlServerDesc sd = {
      .server_ip = "127.0.0.1", .server_port = tu_free_port(), .endpoint_list = NULL, .endpoint_list_num = 0};
  HixlClientDesc cd = {.server_ip = "127.0.0.1",
                       .server_port = sd.server_port,
                       .local_endpoint = NULL,
                       .remote_endpoint = NULL};
  unsigned char buf[4096];
  HcommMem m = host_mem(buf, sizeof(buf));
  HixlServerHandle s = NULL;
  HixlClientHandle c = NULL;
  MemHandle smh = NULL, cmh = NULL;
  uint64_t junk[64];

  memset(junk, 0, sizeof(junk));
  bad_handle_calls(NULL, NULL, g.srv.m.h, g.src.h, "NULL handles");
  bad_handle_calls((HixlServerHandle)junk, (HixlClientHandle)junk, g.srv.m.h, g.src.h, "made-up handles");

  /* Destroyed handles, with the memory handles they had. */
  TU_ASSERT_OK(HixlCSServerCreate(&sd, NULL, &s));
  TU_ASSERT_OK(HixlCSServerRegMem(s, "s", &m, &smh));
  TU_ASSERT_OK(HixlCSServerListen(s, 0));
  TU_ASSERT_OK(HixlCSClientCreate(&cd, NULL, &c));
  TU_ASSERT_OK(HixlCSClientRegMem(c, "c", &m, &cmh));
  TU_ASSERT_OK(HixlCSClientConnect(c, CONNECT_MS));
  TU_ASSERT_OK(HixlCSClientDestroy(c)); /* connected, memory still registered */
  TU_ASSERT_OK(HixlCSServerDestroy(s));
  /* A new server and client, likely where the old ones were in memory: new handles, and
   * the old ones stay destroyed (with addresses for handles, they named the new ones). */
  HixlServerHandle s2 = NULL;
  HixlClientHandle c2 = NULL;
  sd.server_port = tu_free_port();
  cd.server_port = sd.server_port;
  TU_ASSERT_OK(HixlCSServerCreate(&sd, NULL, &s2));
  TU_ASSERT_OK(HixlCSClientCreate(&cd, NULL, &c2));
  CU_ASSERT(s2 != s && c2 != c);
  CU_ASSERT(((uintptr_t)s2 & 1) && ((uintptr_t)c2 & 1)); /* tokens, never an (aligned) address */
  bad_handle_calls(s, c, smh, cmh, "destroyed handles");
  TU_ASSERT_OK(HixlCSServerListen(s2, 0));
  TU_ASSERT_OK(HixlCSClientConnect(c2, CONNECT_MS));
  TU_ASSERT_OK(HixlCSClientDestroy(c2));
  TU_ASSERT_OK(HixlCSServerDestroy(s2));
  /* The live pair is unaffected by any of it. */
  put_get_check(g.cli, g.src.mem, g.dst.mem, g.raddr, g.srv.m.mem, 64 * KiB, 310);
}

/* Call i of a child kind ("wrongkind", "unbounded") in a child of its own, so a crash
 * is reported, not suffered: the call must return PARAM_INVALID and the child end well. */
static void child_call_invalid(const char *kind, unsigned i, const char *name) {
  char idx[16];
  char *argv[] = {self_exe, CS_CHILD_FLAG, (char *)kind, idx, NULL};
  child_reply r;
  tu_child c;
  int ws;
  bool replied;

  snprintf(idx, sizeof(idx), "%u", i);
  if (tu_child_start(&c, exec_child, argv) != 0) {
    tu_fail(__FILE__, __LINE__, "cannot start a child");
    return;
  }
  memset(&r, 0, sizeof(r));
  replied = tu_child_read(&c, &r, sizeof(r), 10000) == 0;
  ws = tu_child_wait(&c, 10000);
  if (!replied)
    tu_fail(__FILE__, __LINE__, "%s: the call did not return (child %s %d)", name,
            ws >= 0 && WIFSIGNALED(ws) ? "killed by signal" : "exited with",
            ws < 0            ? -1
            : WIFSIGNALED(ws) ? WTERMSIG(ws)
                              : WEXITSTATUS(ws));
  else if (r.status != HIXL_PARAM_INVALID)
    tu_fail(__FILE__, __LINE__, "%s: got %s (\"%s\"), want HIXL_PARAM_INVALID", name,
            HixlStatusName(r.status), r.error);
  else if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "%s: PARAM_INVALID, but the child then ended badly (wait status 0x%x)", name,
            (unsigned)ws);
  else
    CU_PASS(name);
}

/* A server handle given to a client function and the other way round: PARAM_INVALID. */
static void test_wrong_kind_handles(void) {
  for (unsigned i = 0; i < N_WRONG_KIND; i++) child_call_invalid("wrongkind", i, wrong_kind_names[i]);
}

/* Unterminated strings and a list_num past the list: PARAM_INVALID from the bytes the
 * call may read, never a read past them. */
static void test_unbounded_args(void) {
  for (unsigned i = 0; i < N_UNBOUNDED; i++) child_call_invalid("unbounded", i, unbounded_names[i]);
}

/* mem_tag NULL is listed as ""; the list is replaced by the next call and follows the
 * server's registrations made and removed between calls. */
static void test_remote_mem_tags(void) {
  char tag255[HIXL_CS_MAX_TAG_LEN + 1];
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  server srv;
  region more, src;
  MemHandle h_null = NULL, h_long = NULL, h_late = NULL;
  HcommMem m, *list = NULL;
  char **tags = NULL;
  uint32_t n = 0, i;
  int seen;

  memset(tag255, 't', sizeof(tag255) - 1);
  tag255[sizeof(tag255) - 1] = '\0';
  memset(&more, 0, sizeof(more));
  memset(&src, 0, sizeof(src));
  if (!server_up(&srv, port, MiB, "server_mem", false) || !region_map(&more, 3 * MiB)) goto out;
  m = host_mem(more.mem, MiB);
  TU_ASSERT_OK(HixlCSServerRegMem(srv.h, NULL, &m, &h_null));
  m = host_mem(more.mem + MiB, MiB);
  TU_ASSERT_OK(HixlCSServerRegMem(srv.h, tag255, &m, &h_long));
  TU_ASSERT_OK(HixlCSServerListen(srv.h, 0));
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, MiB, NULL)) goto out; /* a NULL tag on the client too */
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));

  TU_ASSERT_OK(HixlCSClientGetRemoteMem(cli, &list, &tags, &n, CONNECT_MS));
  CU_ASSERT_EQUAL(n, 3);
  for (i = 0, seen = 0; list && tags && i < n; i++) {
    CU_ASSERT_PTR_NOT_NULL(tags[i]);
    if (!tags[i]) continue;
    CU_ASSERT_EQUAL(list[i].type, HCCL_MEM_TYPE_HOST);
    CU_ASSERT_EQUAL(list[i].size, MiB);
    if (list[i].addr == srv.m.mem) {
      CU_ASSERT_STRING_EQUAL(tags[i], "server_mem");
      seen |= 1;
    } else if (list[i].addr == more.mem) {
      CU_ASSERT_STRING_EQUAL(tags[i], ""); /* registered with a NULL tag */
      seen |= 2;
    } else if (list[i].addr == more.mem + MiB) {
      CU_ASSERT_STRING_EQUAL(tags[i], tag255);
      seen |= 4;
    } else {
      tu_fail(__FILE__, __LINE__, "GetRemoteMem lists an unknown address %p", list[i].addr);
    }
  }
  CU_ASSERT_EQUAL(seen, 7);

  /* Between calls the server adds one registration and removes another. */
  m = host_mem(more.mem + 2 * MiB, MiB);
  TU_ASSERT_OK(HixlCSServerRegMem(srv.h, "late", &m, &h_late));
  TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, h_null));
  h_null = NULL;
  list = NULL;
  tags = NULL;
  TU_ASSERT_OK(HixlCSClientGetRemoteMem(cli, &list, &tags, &n, CONNECT_MS));
  CU_ASSERT_EQUAL(n, 3);
  for (i = 0, seen = 0; list && tags && i < n; i++) {
    if (list[i].addr == srv.m.mem && strcmp(tags[i], "server_mem") == 0) seen |= 1;
    if (list[i].addr == more.mem) tu_fail(__FILE__, __LINE__, "an unregistered range is still listed");
    if (list[i].addr == more.mem + MiB && strcmp(tags[i], tag255) == 0) seen |= 4;
    if (list[i].addr == more.mem + 2 * MiB && strcmp(tags[i], "late") == 0 && list[i].size == MiB) seen |= 8;
  }
  CU_ASSERT_EQUAL(seen, 1 | 4 | 8);
  /* And again with nothing changed: the same three (the previous arrays are freed). */
  TU_ASSERT_OK(HixlCSClientGetRemoteMem(cli, &list, &tags, &n, CONNECT_MS));
  CU_ASSERT_EQUAL(n, 3);

  /* The late registration takes data. */
  put_get_check(cli, src.mem, src.mem + MiB / 2, more.mem + 2 * MiB + 5, more.mem + 2 * MiB + 5, MiB / 2 - 5,
                320);
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  if (h_null) TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, h_null));
  if (h_long) TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, h_long));
  if (h_late) TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, h_late));
  server_down(&srv);
  region_unmap(&more);
}

/* An op whose local_buf is NULL is PARAM_INVALID in every batch kind, the whole batch
 * refused before anything moves: no handle, nothing read from or written to the server,
 * and the link stays (a put from NULL reset it, FAILED; a get into NULL threw the data
 * away and ended COMPLETED). A client of its own, so a broken link harms no other test. */
static void test_null_local_buf(void) {
  HixlClientHandle cli = client_new(g.srv.port, NULL);
  region src;
  HixlOneSideOpDesc d[2];
  CompleteHandle h = SENTINEL;
  char what[96];

  memset(&src, 0, sizeof(src));
  if (!cli || !client_region(cli, &src, 64 * KiB, "null_src")) goto out;
  for (int k = PUT_ASYNC; k <= GET_SYNC; k++) {
    bool put = k == PUT_ASYNC || k == PUT_SYNC, async = k == PUT_ASYNC || k == GET_ASYNC;
    TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS)); /* each kind on a live link */
    snprintf(what, sizeof(what), "%s after one with a NULL local_buf", batch_names[k]);
    tu_fill(g.srv.m.mem, 4 * KiB, 360 + (uint64_t)k);
    tu_fill(src.mem, 4 * KiB, 370 + (uint64_t)k);
    d[0] = op(src.mem, g.raddr, 64);
    d[1] = op(NULL, g.raddr + 64, 64);
    TU_ASSERT_STATUS(batch_call(k, cli, 2, d, &h), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("local_buf");
    CU_ASSERT_PTR_EQUAL(h, SENTINEL);
    TU_ASSERT_PATTERN(g.srv.m.mem, 4 * KiB, 360 + (uint64_t)k, "server memory after the refused batch");
    TU_ASSERT_PATTERN(src.mem, 4 * KiB, 370 + (uint64_t)k, "client memory after the refused batch");
    /* The link still carries a good batch of the same kind. */
    if (async) {
      ASSERT_ASYNC_ENDS(cli, put, 1, d, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, what);
    } else {
      TU_ASSERT_OK(batch_call(k, cli, 1, d, NULL));
    }
    if (put)
      TU_ASSERT_PATTERN(g.srv.m.mem, 64, 370 + (uint64_t)k, what);
    else
      TU_ASSERT_PATTERN(src.mem, 64, 360 + (uint64_t)k, what);
  }
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
}

/* A final status releases the handle; made-up handles and another client's are refused. */
static void test_query_rules(void) {
  HixlClientHandle other = client_new(g.srv.port, NULL);
  region osrc;
  HixlOneSideOpDesc d = op(g.src.mem, g.raddr, 4 * KiB);
  CompleteHandle h = NULL, ho = NULL;
  HixlCompleteStatus s = HIXL_COMPLETE_STATUS_WAITING;
  uint64_t junk[8];

  memset(&osrc, 0, sizeof(osrc));
  if (!other || !client_region(other, &osrc, 64 * KiB, "other")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(other, CONNECT_MS));

  tu_fill(g.src.mem, 4 * KiB, 330);
  TU_ASSERT_OK(HixlCSClientBatchPutAsync(g.cli, 1, &d, &h));
  /* A NULL output does not consume the handle. */
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, h, NULL), HIXL_PARAM_INVALID);
  ASSERT_BATCH_ENDS(g.cli, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchPutAsync");
  s = HIXL_COMPLETE_STATUS_WAITING;
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, h, &s), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, h, &s), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(s, HIXL_COMPLETE_STATUS_WAITING); /* not written on failure */
  TU_ASSERT_PATTERN(g.srv.m.mem, 4 * KiB, 330, "server memory after BatchPutAsync");

  d = op(g.dst.mem, g.raddr, 4 * KiB);
  memset(g.dst.mem, 0, 4 * KiB);
  CompleteHandle released = h;
  TU_ASSERT_OK(HixlCSClientBatchGetAsync(g.cli, 1, &d, &h));
  /* A new batch, likely where the released one was in memory: a handle of its own, and
   * the released one stays unknown (with addresses for handles, it named the new batch). */
  CU_ASSERT(h != released);
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, released, &s), HIXL_PARAM_INVALID);
  ASSERT_BATCH_ENDS(g.cli, h, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "BatchGetAsync");
  TU_ASSERT_PATTERN(g.dst.mem, 4 * KiB, 330, "BatchGetAsync");

  memset(junk, 0, sizeof(junk));
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, NULL, &s), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, (CompleteHandle)junk, &s), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, SENTINEL, &s), HIXL_PARAM_INVALID);

  /* Another client's handle: refused here, still good there. */
  d = op(osrc.mem, g.raddr + 8 * KiB, 4 * KiB);
  tu_fill(osrc.mem, 4 * KiB, 331);
  TU_ASSERT_OK(HixlCSClientBatchPutAsync(other, 1, &d, &ho));
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(g.cli, ho, &s), HIXL_PARAM_INVALID);
  ASSERT_BATCH_ENDS(other, ho, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "the other client's batch");
  TU_ASSERT_PATTERN(g.srv.m.mem + 8 * KiB, 4 * KiB, 331, "server memory after the other client's put");
out:
  client_region_free(other, &osrc);
  if (other) TU_ASSERT_OK(HixlCSClientDestroy(other));
}

/* At most 4096 uncompleted batches per client: with the server stopped, 4096 are
 * accepted, the next is refused with RESOURCE_EXHAUSTED naming the limit; after
 * SIGCONT all 4096 complete and their data is in place. */
#define LIMIT_OP 64
static void test_inflight_limit(void) {
  const size_t n = HIXL_CS_MAX_INFLIGHT_BATCHES, span = n * LIMIT_OP;
  uint16_t port = tu_free_port();
  CompleteHandle *hs = calloc(n, sizeof(*hs)), extra = SENTINEL;
  unsigned char *done = calloc(n, 1);
  HixlClientHandle cli = NULL;
  HixlOneSideOpDesc d;
  HixlCompleteStatus s;
  region src;
  HcommMem rm;
  srvchild sc;
  size_t i, left, bad = 0, accepted = 0;
  int64_t deadline;
  bool stopped = false;

  CU_ASSERT_PTR_NOT_NULL_FATAL(hs);
  CU_ASSERT_PTR_NOT_NULL_FATAL(done);
  memset(&src, 0, sizeof(src));
  if (!srvchild_start(&sc, port, 2 * span, 0)) goto free_arrays;
  cli = client_new(port, "60000"); /* nothing may time out while the server is stopped */
  if (!cli || !client_region(cli, &src, 2 * span, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (!remote_find(cli, "server_mem", &rm)) goto out;
  tu_fill(src.mem, span, 340);

  if (!(stopped = srvchild_stop(&sc))) goto out;
  for (i = 0; i < n; i++) {
    d = op(src.mem + i * LIMIT_OP, (unsigned char *)rm.addr + i * LIMIT_OP, LIMIT_OP);
    if (HixlCSClientBatchPutAsync(cli, 1, &d, &hs[i]) != HIXL_SUCCESS) {
      tu_fail(__FILE__, __LINE__, "async batch %zu of %zu refused: %s", i, n, HixlGetLastErrorMessage());
      break;
    }
    accepted++;
  }
  CU_ASSERT_EQUAL(accepted, n);
  d = op(src.mem + span, (unsigned char *)rm.addr + span, LIMIT_OP);
  TU_ASSERT_STATUS(HixlCSClientBatchPutAsync(cli, 1, &d, &extra), HIXL_RESOURCE_EXHAUSTED);
  TU_ASSERT_ERRMSG_HAS("4096");
  TU_ASSERT_STATUS(HixlCSClientBatchGetAsync(cli, 1, &d, &extra), HIXL_RESOURCE_EXHAUSTED);
  TU_ASSERT_ERRMSG_HAS("4096");
  CU_ASSERT_PTR_EQUAL(extra, SENTINEL);
  /* A WAITING answer does not release a slot. */
  if (accepted > 0) {
    TU_ASSERT_OK(HixlCSClientQueryCompleteStatus(cli, hs[0], &s));
    CU_ASSERT_EQUAL(s, HIXL_COMPLETE_STATUS_WAITING);
    TU_ASSERT_STATUS(HixlCSClientBatchPutAsync(cli, 1, &d, &extra), HIXL_RESOURCE_EXHAUSTED);
  }

  tu_child_kill(&sc.c, SIGCONT);
  stopped = false;
  deadline = tu_now_ms() + XFER_MS;
  for (left = accepted; left > 0 && tu_now_ms() < deadline;) {
    for (i = 0; i < accepted; i++) {
      if (done[i]) continue;
      if (HixlCSClientQueryCompleteStatus(cli, hs[i], &s) != HIXL_SUCCESS) {
        tu_fail(__FILE__, __LINE__, "batch %zu: Query: %s", i, HixlGetLastErrorMessage());
        s = HIXL_COMPLETE_STATUS_FAILED;
      }
      if (s == HIXL_COMPLETE_STATUS_WAITING) continue;
      if (s != HIXL_COMPLETE_STATUS_COMPLETED && bad++ == 0)
        tu_fail(__FILE__, __LINE__, "batch %zu ended %s (%s)", i, cs_name(s), HixlGetLastErrorMessage());
      done[i] = 1;
      left--;
    }
    if (left) sched_yield();
  }
  CU_ASSERT_EQUAL(left, 0);
  CU_ASSERT_EQUAL(bad, 0);
  srvchild_expect(&sc, 0, span, 340, "child memory after 4096 async batches");
  /* Room again: one more batch goes through; released handles stay released. */
  tu_fill(src.mem + span, LIMIT_OP, 341);
  ASSERT_ASYNC_ENDS(cli, true, 1, &d, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS, "batch 4097 after the drain");
  srvchild_expect(&sc, span, LIMIT_OP, 341, "child memory after batch 4097");
  if (accepted > 0) TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(cli, hs[0], &s), HIXL_PARAM_INVALID);
out:
  if (stopped) tu_child_kill(&sc.c, SIGCONT);
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  srvchild_quit(&sc);
free_arrays:
  free(hs);
  free(done);
}

/* ---------------------------------------------------------------- 3. better than HIXL */

/* An async batch with a remote range the server has not registered is refused at
 * submit with HIXL_FAILED and a message naming the range; nothing is sent and no
 * handle is made (fail fast, as documented in hixl_cs.h). Refusals are counted in
 * *refused; any other outcome is a failure (the first described in first). */
static void async_refused(HixlClientHandle c, bool put, uint32_t n, const HixlOneSideOpDesc *d,
                          const char *what, int *refused, char *first, size_t first_len) {
  CompleteHandle h = NULL;
  HixlStatus st = put ? HixlCSClientBatchPutAsync(c, n, d, &h) : HixlCSClientBatchGetAsync(c, n, d, &h);

  if (st == HIXL_SUCCESS) {
    tu_fail(__FILE__, __LINE__, "%s: accepted; want a refusal at submit", what);
    ASSERT_BATCH_ENDS(c, h, HIXL_COMPLETE_STATUS_FAILED, XFER_MS, what);
  } else if (st == HIXL_FAILED && strstr(HixlGetLastErrorMessage(), "not inside memory registered")) {
    (*refused)++;
  } else {
    if (!first[0]) snprintf(first, first_len, "%s: \"%s\"", what, HixlGetLastErrorMessage());
    tu_fail(__FILE__, __LINE__, "%s: submit gave %s (\"%s\")", what, HixlStatusName(st),
            HixlGetLastErrorMessage());
  }
}

/* A remote range outside the server's registered memory: the batch ends FAILED (async:
 * COMPLETE_STATUS_FAILED; sync: HIXL_FAILED) and no byte of server memory changes. */
static void test_remote_out_of_range(void) {
  uint16_t port = tu_free_port();
  const size_t len = 4 * MiB, map = len + 2 * SLACK;
  HixlClientHandle cli = NULL;
  unsigned char *before = malloc(map), *r;
  server srv;
  region src, gone;
  MemHandle gone_h = NULL;
  HixlOneSideOpDesc d[2];
  HcommMem m;
  size_t i;
  char what[128], first[400] = "";
  int refused = 0, async_cases = 0;

  CU_ASSERT_PTR_NOT_NULL_FATAL(before);
  memset(&src, 0, sizeof(src));
  memset(&gone, 0, sizeof(gone));
  if (!server_up(&srv, port, len, "server_mem", true) || !region_map(&gone, MiB)) goto out;
  r = srv.m.mem;
  m = host_mem(gone.mem, MiB);
  TU_ASSERT_OK(HixlCSServerRegMem(srv.h, "gone", &m, &gone_h));
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, 2 * MiB, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  {
    HcommMem rm;
    if (!remote_find(cli, "gone", &rm)) goto out;
  }
  /* Unregistered after the client learned of it: the server must refuse it now. */
  TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, gone_h));
  gone_h = NULL;
  tu_fill(srv.m.base, map, 350);
  tu_fill(gone.base, MiB + 2 * SLACK, 351);
  memcpy(before, srv.m.base, map);
  tu_fill(src.mem, MiB, 352);
  memset(src.mem + MiB, 0x33, MiB);

  {
    struct {
      unsigned char *remote;
      size_t len;
      const char *what;
    } cases[] = {
        {r + len - 8, 16, "straddling the end"},
        {r + len, 4096, "just past the end"},
        {r - 8, 16, "straddling the start"},
        {r - 4096, 4096, "just before the start"},
        {r + len - MiB / 2, MiB, "starting inside, running past the end"},
        {(unsigned char *)(uintptr_t)0x1000, 64, "at a made-up address"},
        {gone.mem, 4096, "in a registration the server removed"},
    };
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
      d[0] = op(src.mem, cases[i].remote, cases[i].len);
      snprintf(what, sizeof(what), "put %s: async", cases[i].what);
      async_refused(cli, true, 1, d, what, &refused, first, sizeof(first));
      async_cases++;
      snprintf(what, sizeof(what), "put %s: sync", cases[i].what);
      (void)tu_status_is(HixlCSClientBatchPutSync(cli, 1, d, XFER_MS), HIXL_FAILED, what, __FILE__, __LINE__);
      d[0].local_buf = src.mem + MiB;
      snprintf(what, sizeof(what), "get %s: async", cases[i].what);
      async_refused(cli, false, 1, d, what, &refused, first, sizeof(first));
      async_cases++;
      snprintf(what, sizeof(what), "get %s: sync", cases[i].what);
      (void)tu_status_is(HixlCSClientBatchGetSync(cli, 1, d, XFER_MS), HIXL_FAILED, what, __FILE__, __LINE__);
      snprintf(what, sizeof(what), "server memory after a put %s", cases[i].what);
      TU_ASSERT_SAME(srv.m.base, before, map, what);
      TU_ASSERT_PATTERN(gone.base, MiB + 2 * SLACK, 351, "the removed registration's memory");
      snprintf(what, sizeof(what), "client memory after a get %s", cases[i].what);
      CU_ASSERT_EQUAL(tu_check_byte(src.mem + MiB, MiB, 0x33), -1);
    }
  }

  /* A good op and a bad one in one batch: FAILED; nothing outside the registration moves. */
  d[0] = op(src.mem, r, 4096);
  d[1] = op(src.mem + 4096, r + len - 100, 200);
  async_refused(cli, true, 2, d, "put of a good and a bad op: async", &refused, first, sizeof(first));
  async_cases++;
  if (refused != async_cases)
    tu_fail(__FILE__, __LINE__,
            "%d of %d async batches with a remote range outside the server's memory were refused at submit "
            "with HIXL_FAILED naming the range; first other outcome: %s",
            refused, async_cases, first);
  TU_ASSERT_STATUS(HixlCSClientBatchPutSync(cli, 2, d, XFER_MS), HIXL_FAILED);
  TU_ASSERT_SAME(srv.m.base, before, SLACK, "the slack before the server memory");
  TU_ASSERT_SAME(srv.m.mem + len, before + SLACK + len, SLACK, "the slack after the server memory");
  TU_ASSERT_SAME(srv.m.mem + 4096, before + SLACK + 4096, len - 4096 - 100,
                 "server memory between the two ops");

  /* The link is still good. */
  put_get_check(cli, src.mem, src.mem + MiB, r + 12345, r + 12345, 256 * KiB, 353);
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  if (gone_h) TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, gone_h));
  server_down(&srv);
  region_unmap(&gone);
  free(before);
}

/* A server killed with SIGKILL in the middle of a large async put: the batch ends FAILED
 * or TIMEOUT within its timeout (HIXL_CS_BATCH_TIMEOUT_MS), never hangs. The same
 * client then connects to a new server on the same port, without being recreated. */
#define KILL_LEN (64 * MiB)
#define KILL_OP  (4 * MiB)
#define KILL_OPS 1024 /* 4 GiB in all: cannot finish before the kill lands */
static void test_server_killed(void) {
  static HixlOneSideOpDesc d[KILL_OPS];
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  CompleteHandle h = NULL;
  HixlCompleteStatus s = HIXL_COMPLETE_STATUS_WAITING;
  HixlStatus st;
  region src;
  HcommMem rm;
  srvchild sc;
  int64_t t0, t_kill, t_end, reply;
  char err[256];
  size_t i;
  int ws;

  memset(&src, 0, sizeof(src));
  if (!srvchild_start(&sc, port, KILL_LEN, 0)) return;
  cli = client_new(port, "5000");
  if (!cli || !client_region(cli, &src, KILL_LEN, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (!remote_find(cli, "server_mem", &rm)) goto out;
  tu_fill(src.mem, KILL_LEN, 360);
  for (i = 0; i < KILL_OPS; i++)
    d[i] = op(src.mem + (i % (KILL_LEN / KILL_OP)) * KILL_OP,
              (unsigned char *)rm.addr + (i % (KILL_LEN / KILL_OP)) * KILL_OP, KILL_OP);

  t0 = tu_now_ms();
  TU_ASSERT_OK(HixlCSClientBatchPutAsync(cli, KILL_OPS, d, &h));
  if (!h) goto out;
  reply = srvchild_cmd(&sc, CS_CMD_WAIT_DATA, 0, KILL_LEN, 10000, 15000);
  tu_child_kill(&sc.c, SIGKILL);
  t_kill = tu_now_ms();
  if (reply != 0) tu_fail(__FILE__, __LINE__, "no data reached the child within 10 s; killed it anyway");
  st = wait_batch(cli, h, t0 + KILL_MS + 3000, &s, err, sizeof(err));
  t_end = tu_now_ms();
  TU_ASSERT_OK(st);
  printf("  [killed server: the batch ended %s %lld ms after the kill (%s)]\n", cs_name(s),
         (long long)(t_end - t_kill), err);
  if (s != HIXL_COMPLETE_STATUS_FAILED && s != HIXL_COMPLETE_STATUS_TIMEOUT)
    tu_fail(__FILE__, __LINE__, "server killed mid-put: batch %s after %lld ms, want FAILED or TIMEOUT",
            cs_name(s), (long long)(t_end - t0));
  else if (t_end - t0 > KILL_MS + 1000)
    tu_fail(__FILE__, __LINE__, "the batch took %lld ms to end; its timeout was %d ms",
            (long long)(t_end - t0), KILL_MS);
  else
    CU_PASS("the batch ended FAILED or TIMEOUT in time");
  if (s != HIXL_COMPLETE_STATUS_WAITING)
    TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(cli, h, &s), HIXL_PARAM_INVALID);
  ws = tu_child_wait(&sc.c, 5000);
  CU_ASSERT(ws >= 0 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);

  /* Batches to the dead server fail at once. */
  t0 = tu_now_ms();
  st = HixlCSClientBatchPutSync(cli, 1, d, 3000);
  if (st != HIXL_NOT_CONNECTED && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "BatchPutSync to a killed server: %s (%s), want NOT_CONNECTED or FAILED",
            HixlStatusName(st), HixlGetLastErrorMessage());
  CU_ASSERT(tu_now_ms() - t0 < PROMPT_MS);

  /* A new server on the same port: the same client connects again. */
  if (!srvchild_start(&sc, port, KILL_LEN, 361)) goto out_client;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (remote_find(cli, "server_mem", &rm)) {
    CU_ASSERT_EQUAL((uintptr_t)rm.addr, sc.info.addr);
    d[0] = op(src.mem, rm.addr, MiB + 5);
    memset(src.mem, 0, MiB + 5);
    TU_ASSERT_OK(HixlCSClientBatchGetSync(cli, 1, d, XFER_MS));
    TU_ASSERT_PATTERN(src.mem, MiB + 5, 361, "BatchGetSync from the new server");
    tu_fill(src.mem, 2 * MiB + 1, 362);
    d[0] = op(src.mem, rm.addr, 2 * MiB + 1);
    ASSERT_ASYNC_ENDS(cli, true, 1, d, HIXL_COMPLETE_STATUS_COMPLETED, XFER_MS,
                      "BatchPutAsync to the new server");
    srvchild_expect(&sc, 0, 2 * MiB + 1, 362, "new server memory after BatchPutAsync");
  }
out:
  srvchild_quit(&sc);
out_client:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
}

/* Connect where nothing listens yet: TIMEOUT; the same client connects once it does. */
static void test_connect_again(void) {
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  HcommMem *list = NULL;
  char **tags = NULL;
  uint32_t n = 0;
  HixlOneSideOpDesc d;
  CompleteHandle h = SENTINEL;
  server srv;
  region src;
  HcommMem rm;
  int64_t t0, el;

  memset(&src, 0, sizeof(src));
  if (!server_up(&srv, port, MiB, "server_mem", false)) goto out; /* created, not listening */
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, 2 * MiB, "client_mem")) goto out;
  for (int attempt = 0; attempt < 2; attempt++) {
    t0 = tu_now_ms();
    TU_ASSERT_STATUS(HixlCSClientConnect(cli, STOP_MS), HIXL_TIMEOUT);
    el = tu_now_ms() - t0;
    if (el < STOP_MS - 20 || el > STOP_MS + 2000)
      tu_fail(__FILE__, __LINE__, "Connect with timeout %d ms took %lld ms", STOP_MS, (long long)el);
  }
  /* Not connected: every data call says so. */
  d = op(src.mem, srv.m.mem, 64);
  TU_ASSERT_STATUS(HixlCSClientGetRemoteMem(cli, &list, &tags, &n, 100), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlCSClientBatchPutSync(cli, 1, &d, 100), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlCSClientBatchGetAsync(cli, 1, &d, &h), HIXL_NOT_CONNECTED);
  CU_ASSERT_PTR_EQUAL(h, SENTINEL);

  TU_ASSERT_OK(HixlCSServerListen(srv.h, 0));
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  /* Again on the live link: SUCCESS, as HIXL answers (it warns), and the link kept. */
  tu_log_capture(HIXL_LOG_WARN, true);
  tu_log_watch("connected to");
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  CU_ASSERT_TRUE(tu_log_seen(NULL, 0));
  HixlSetLogLevel(HIXL_LOG_ERROR); /* the default */
  if (remote_find(cli, "server_mem", &rm)) {
    CU_ASSERT_PTR_EQUAL(rm.addr, srv.m.mem);
    put_get_check(cli, src.mem, src.mem + MiB, rm.addr, srv.m.mem, MiB, 370);
  }
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  server_down(&srv);
}

/* ClientDestroy with batches outstanding returns SUCCESS and leaks nothing (ASan); the
 * server goes on serving other clients. */
static void test_destroy_outstanding(void) {
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL, next = NULL;
  HixlOneSideOpDesc d[4];
  CompleteHandle h;
  server srv;
  region src, src2;
  int i, k;

  memset(&src, 0, sizeof(src));
  memset(&src2, 0, sizeof(src2));
  if (!server_up(&srv, port, 64 * MiB, "server_mem", true)) goto out;
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, 64 * MiB, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  tu_fill(src.mem, 64 * MiB, 380);
  for (i = 0; i < 16; i++) {
    for (k = 0; k < 4; k++)
      d[k] = op(src.mem + (size_t)(i * 4 + k) * MiB, srv.m.mem + (size_t)(63 - i * 4 - k) * MiB, MiB);
    TU_ASSERT_OK(i % 2 ? HixlCSClientBatchGetAsync(cli, 4, d, &h) : HixlCSClientBatchPutAsync(cli, 4, d, &h));
  }
  TU_ASSERT_OK(HixlCSClientDestroy(cli)); /* 16 batches never queried */
  TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(cli, h, NULL), HIXL_PARAM_INVALID);
  cli = NULL;
  region_unmap(&src); /* the engine must not touch it any more */

  next = client_new(port, NULL);
  if (!next || !client_region(next, &src2, 2 * MiB, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(next, CONNECT_MS));
  put_get_check(next, src2.mem, src2.mem + MiB, srv.m.mem + 5, srv.m.mem + 5, MiB, 381);
out:
  client_region_free(next, &src2);
  if (next) TU_ASSERT_OK(HixlCSClientDestroy(next));
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  server_down(&srv);
}

/* The same against a stopped server, so the batches are surely outstanding: Destroy
 * returns at once, and a batch timeout of 300 ms gives TIMEOUT on time. */
struct query_loop {
  HixlClientHandle c;
  atomic_bool stop;
  int64_t worst_ms; /* the longest one query took */
  unsigned n;
};

static void *query_loop_main(void *p) { /* queries of a handle the client never gave out */
  struct query_loop *q = p;
  static int bogus;
  while (!atomic_load(&q->stop)) {
    HixlCompleteStatus s;
    int64_t t0 = tu_now_ms();
    (void)HixlCSClientQueryCompleteStatus(q->c, (CompleteHandle)&bogus, &s);
    int64_t el = tu_now_ms() - t0;
    q->worst_ms = el > q->worst_ms ? el : q->worst_ms;
    q->n++;
  }
  return NULL;
}

static void test_stopped_server(void) {
  uint16_t port = tu_free_port();
  HixlClientHandle fast = NULL, slow = NULL, mid = NULL;
  HixlOneSideOpDesc d;
  CompleteHandle h, hs[8];
  HixlCompleteStatus s;
  HixlStatus st;
  region src1, src2;
  HcommMem rm;
  srvchild sc;
  int64_t t0, el;
  bool stopped = false;
  char err[256];
  int i;

  memset(&src1, 0, sizeof(src1));
  memset(&src2, 0, sizeof(src2));
  if (!srvchild_start(&sc, port, 4 * MiB, 0)) return;
  fast = client_new(port, "300");
  slow = client_new(port, NULL);
  mid = client_new(port, "3000");
  if (!fast || !slow || !mid || !client_region(fast, &src1, 2 * MiB, "c1") ||
      !client_region(slow, &src2, 2 * MiB, "c2"))
    goto out;
  TU_ASSERT_OK(HixlCSClientConnect(fast, CONNECT_MS));
  TU_ASSERT_OK(HixlCSClientConnect(slow, CONNECT_MS));
  TU_ASSERT_OK(HixlCSClientConnect(mid, CONNECT_MS));
  if (!remote_find(fast, "server_mem", &rm)) goto out;
  tu_fill(src1.mem, 64 * KiB, 390); /* the link works before the stop */
  d = op(src1.mem, rm.addr, 64 * KiB);
  TU_ASSERT_OK(HixlCSClientBatchPutSync(fast, 1, &d, XFER_MS));
  srvchild_expect(&sc, 0, 64 * KiB, 390, "child memory before the stop");

  if (!(stopped = srvchild_stop(&sc))) goto out;
  /* A batch to a range the server never advertised waits for its table first (a SYNC the
   * stopped server never answers), up to the batch's 3 s; the client's other calls go on
   * meanwhile (before: each waited on the client's lock for those 3 s). */
  {
    struct query_loop q = {.c = mid};
    pthread_t th;
    CU_ASSERT_FATAL(pthread_create(&th, NULL, query_loop_main, &q) == 0);
    d = op(src1.mem, (unsigned char *)rm.addr + 64 * MiB, 4 * KiB);
    t0 = tu_now_ms();
    st = HixlCSClientBatchPutAsync(mid, 1, &d, &h);
    el = tu_now_ms() - t0;
    atomic_store(&q.stop, true);
    pthread_join(th, NULL);
    if (st == HIXL_SUCCESS) TU_ASSERT_OK(wait_batch(mid, h, tu_now_ms() + 10000, &s, err, sizeof(err)));
    fprintf(stderr,
            "  [an unadvertised range: %s after %lld ms; %u queries meanwhile, the longest %lld ms]\n",
            HixlStatusName(st), (long long)el, q.n, (long long)q.worst_ms);
    CU_ASSERT(q.n > 0 && q.worst_ms < 1000);
  }
  /* Async batches end TIMEOUT once HIXL_CS_BATCH_TIMEOUT_MS (300) has passed. */
  for (i = 0; i < 2; i++) {
    d = op(src1.mem + MiB, (unsigned char *)rm.addr + MiB, 64 * KiB);
    t0 = tu_now_ms();
    st = i == 0 ? HixlCSClientBatchPutAsync(fast, 1, &d, &h) : HixlCSClientBatchGetAsync(fast, 1, &d, &h);
    TU_ASSERT_OK(st);
    if (st != HIXL_SUCCESS) continue;
    st = wait_batch(fast, h, t0 + STOP_MS + 5000, &s, err, sizeof(err));
    el = tu_now_ms() - t0;
    TU_ASSERT_OK(st);
    if (s != HIXL_COMPLETE_STATUS_TIMEOUT)
      tu_fail(__FILE__, __LINE__, "%s to a stopped server: %s after %lld ms, want TIMEOUT (%s)",
              i == 0 ? "BatchPutAsync" : "BatchGetAsync", cs_name(s), (long long)el, err);
    else if (el < STOP_MS - 20 || el > STOP_MS + 2000)
      tu_fail(__FILE__, __LINE__, "TIMEOUT after %lld ms, want about %d", (long long)el, STOP_MS);
    else
      CU_PASS("TIMEOUT on time");
    if (s != HIXL_COMPLETE_STATUS_WAITING)
      TU_ASSERT_STATUS(HixlCSClientQueryCompleteStatus(fast, h, &s), HIXL_PARAM_INVALID);
  }
  /* Sync batches: HIXL_TIMEOUT after their own timeout. */
  d = op(src1.mem, rm.addr, 4 * KiB);
  t0 = tu_now_ms();
  TU_ASSERT_STATUS(HixlCSClientBatchPutSync(fast, 1, &d, STOP_MS), HIXL_TIMEOUT);
  el = tu_now_ms() - t0;
  CU_ASSERT(el >= STOP_MS - 20 && el <= STOP_MS + 2000);
  t0 = tu_now_ms();
  TU_ASSERT_STATUS(HixlCSClientBatchGetSync(fast, 1, &d, 0), HIXL_TIMEOUT); /* 0: 1000 ms */
  el = tu_now_ms() - t0;
  if (el < 980 || el > 3000)
    tu_fail(__FILE__, __LINE__, "sync timeout 0 (1000 ms) took %lld ms", (long long)el);
  /* GetRemoteMem and a new client's Connect: TIMEOUT, not a hang. */
  {
    HixlClientHandle late = client_new(port, NULL);
    HcommMem *list;
    char **tags;
    uint32_t n;

    t0 = tu_now_ms();
    TU_ASSERT_STATUS(HixlCSClientGetRemoteMem(fast, &list, &tags, &n, STOP_MS), HIXL_TIMEOUT);
    el = tu_now_ms() - t0;
    CU_ASSERT(el >= STOP_MS - 20 && el <= STOP_MS + 2000);
    if (late) {
      t0 = tu_now_ms();
      TU_ASSERT_STATUS(HixlCSClientConnect(late, STOP_MS), HIXL_TIMEOUT);
      el = tu_now_ms() - t0;
      CU_ASSERT(el >= STOP_MS - 20 && el <= STOP_MS + 2000);
      TU_ASSERT_OK(HixlCSClientDestroy(late));
    }
  }

  /* Destroy with batches outstanding (default timeout, 30 s): SUCCESS, at once. */
  for (i = 0; i < 8; i++) {
    /* At 3 MiB, apart from what is checked later: data already sent may still land. */
    d = op(src2.mem + (size_t)i * 64 * KiB, (unsigned char *)rm.addr + 3 * MiB + (size_t)i * 64 * KiB,
           64 * KiB);
    TU_ASSERT_OK(i % 2 ? HixlCSClientBatchGetAsync(slow, 1, &d, &hs[i])
                       : HixlCSClientBatchPutAsync(slow, 1, &d, &hs[i]));
  }
  TU_ASSERT_OK(HixlCSClientQueryCompleteStatus(slow, hs[0], &s));
  CU_ASSERT_EQUAL(s, HIXL_COMPLETE_STATUS_WAITING);
  t0 = tu_now_ms();
  TU_ASSERT_OK(HixlCSClientDestroy(slow));
  el = tu_now_ms() - t0;
  slow = NULL;
  if (el > PROMPT_MS)
    tu_fail(__FILE__, __LINE__, "ClientDestroy with batches outstanding took %lld ms", (long long)el);
  region_unmap(&src2);

  tu_child_kill(&sc.c, SIGCONT);
  stopped = false;
  /* The server survived all of it, and the client whose batches timed out goes on
   * (connecting again if the timeouts cost it the link). */
  srvchild_expect(&sc, 0, 64 * KiB, 390, "child memory after the stop");
  tu_fill(src1.mem, 64 * KiB, 391);
  d = op(src1.mem, (unsigned char *)rm.addr + 2 * MiB, 64 * KiB);
  st = HixlCSClientBatchPutSync(fast, 1, &d, XFER_MS);
  if (st != HIXL_SUCCESS) {
    printf("  [after SIGCONT the first batch gave %s: %s; connecting again]\n", HixlStatusName(st),
           HixlGetLastErrorMessage());
    TU_ASSERT_OK(HixlCSClientConnect(fast, CONNECT_MS));
    TU_ASSERT_OK(HixlCSClientBatchPutSync(fast, 1, &d, XFER_MS));
  }
  srvchild_expect(&sc, 2 * MiB, 64 * KiB, 391, "child memory after the stop and a new put");
  /* Once the server has answered the stale requests, nothing is in flight on the
   * memory of the timed-out batches: UnregMem succeeds (polled, bounded). */
  t0 = tu_now_ms();
  while ((st = HixlCSClientUnregMem(fast, src1.h)) == HIXL_FAILED && tu_now_ms() - t0 < 5000) sched_yield();
  if (st != HIXL_SUCCESS)
    tu_fail(__FILE__, __LINE__, "ClientUnregMem after timed-out batches: %s for %lld ms (%s)",
            HixlStatusName(st), (long long)(tu_now_ms() - t0), HixlGetLastErrorMessage());
  else
    src1.h = NULL;
out:
  if (stopped) tu_child_kill(&sc.c, SIGCONT);
  client_region_free(fast, &src1);
  client_region_free(slow, &src2);
  if (fast) TU_ASSERT_OK(HixlCSClientDestroy(fast));
  if (slow) TU_ASSERT_OK(HixlCSClientDestroy(slow));
  if (mid) TU_ASSERT_OK(HixlCSClientDestroy(mid));
  srvchild_quit(&sc);
}

/* ServerDestroy while a client is connected: its next batches end FAILED (async) or
 * give NOT_CONNECTED / FAILED (sync); it connects to a new server on the same port. */
static void test_server_destroyed(void) {
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  HixlOneSideOpDesc d;
  CompleteHandle h = NULL;
  HixlCompleteStatus s;
  HixlStatus st;
  HcommMem *list, rm;
  char **tags;
  uint32_t n;
  server srv, srv2;
  region src;
  char err[256];
  int i;

  memset(&src, 0, sizeof(src));
  memset(&srv2, 0, sizeof(srv2));
  if (!server_up(&srv, port, 4 * MiB, "server_mem", true)) goto out;
  cli = client_new(port, NULL);
  if (!cli || !client_region(cli, &src, 4 * MiB, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  put_get_check(cli, src.mem, src.mem + MiB, srv.m.mem, srv.m.mem, MiB, 400);

  TU_ASSERT_OK(HixlCSServerUnregMem(srv.h, srv.m.h));
  srv.m.h = NULL;
  TU_ASSERT_OK(HixlCSServerDestroy(srv.h));
  srv.h = NULL;

  for (i = 0; i < 2; i++) {
    d = op(src.mem, srv.m.mem, 64 * KiB);
    st = i == 0 ? HixlCSClientBatchPutAsync(cli, 1, &d, &h) : HixlCSClientBatchGetAsync(cli, 1, &d, &h);
    if (st == HIXL_SUCCESS) {
      st = wait_batch(cli, h, tu_now_ms() + PROMPT_MS, &s, err, sizeof(err));
      TU_ASSERT_OK(st);
      if (s != HIXL_COMPLETE_STATUS_FAILED)
        tu_fail(__FILE__, __LINE__, "%s after ServerDestroy ended %s, want FAILED (%s)",
                i == 0 ? "BatchPutAsync" : "BatchGetAsync", cs_name(s), err);
      else
        CU_PASS("FAILED");
      printf("  [%s after ServerDestroy: accepted, ended %s]\n", i == 0 ? "BatchPutAsync" : "BatchGetAsync",
             cs_name(s));
    } else if (st == HIXL_FAILED && strstr(HixlGetLastErrorMessage(), "link to")) {
      /* The range is gone from the table, so submit asked the server (SYNC) and saw
       * the link close while it waited: refused at submit, nothing sent. */
      CU_PASS("FAILED at submit: the link closed");
      printf("  [%s after ServerDestroy: FAILED at submit (%s)]\n",
             i == 0 ? "BatchPutAsync" : "BatchGetAsync", HixlGetLastErrorMessage());
    } else if (st != HIXL_NOT_CONNECTED) {
      tu_fail(__FILE__, __LINE__, "%s after ServerDestroy: submit gave %s (%s)",
              i == 0 ? "BatchPutAsync" : "BatchGetAsync", HixlStatusName(st), HixlGetLastErrorMessage());
    } else {
      CU_PASS("NOT_CONNECTED at submit");
      printf("  [%s after ServerDestroy: NOT_CONNECTED at submit]\n",
             i == 0 ? "BatchPutAsync" : "BatchGetAsync");
    }
  }
  d = op(src.mem, srv.m.mem, 64 * KiB);
  st = HixlCSClientBatchPutSync(cli, 1, &d, PROMPT_MS);
  if (st != HIXL_NOT_CONNECTED && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "BatchPutSync after ServerDestroy: %s (%s)", HixlStatusName(st),
            HixlGetLastErrorMessage());
  st = HixlCSClientBatchGetSync(cli, 1, &d, PROMPT_MS);
  if (st != HIXL_NOT_CONNECTED && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "BatchGetSync after ServerDestroy: %s (%s)", HixlStatusName(st),
            HixlGetLastErrorMessage());
  st = HixlCSClientGetRemoteMem(cli, &list, &tags, &n, PROMPT_MS);
  if (st != HIXL_NOT_CONNECTED && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "GetRemoteMem after ServerDestroy: %s (%s)", HixlStatusName(st),
            HixlGetLastErrorMessage());

  /* A new server on the same port; the same client. */
  if (!server_up(&srv2, port, 2 * MiB, "server_mem", true)) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (remote_find(cli, "server_mem", &rm)) {
    CU_ASSERT_PTR_EQUAL(rm.addr, srv2.m.mem);
    put_get_check(cli, src.mem, src.mem + MiB, rm.addr, srv2.m.mem, MiB, 401);
  }
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  server_down(&srv);
  server_down(&srv2);
}

/* ServerDestroy in another process while a large put from here is in flight: the
 * batch ends FAILED promptly and the server's process is unharmed. */
static void test_server_destroyed_mid_batch(void) {
  static HixlOneSideOpDesc d[KILL_OPS];
  uint16_t port = tu_free_port();
  HixlClientHandle cli = NULL;
  CompleteHandle h = NULL;
  HixlCompleteStatus s = HIXL_COMPLETE_STATUS_WAITING;
  HixlOneSideOpDesc one;
  HixlStatus st;
  region src;
  HcommMem rm;
  srvchild sc;
  int64_t t_destroy, reply;
  char err[256];
  size_t i;

  memset(&src, 0, sizeof(src));
  if (!srvchild_start(&sc, port, KILL_LEN, 0)) return;
  cli = client_new(port, NULL); /* default batch timeout: a result must come from the destroy */
  if (!cli || !client_region(cli, &src, KILL_LEN, "client_mem")) goto out;
  TU_ASSERT_OK(HixlCSClientConnect(cli, CONNECT_MS));
  if (!remote_find(cli, "server_mem", &rm)) goto out;
  tu_fill(src.mem, KILL_LEN, 410);
  for (i = 0; i < KILL_OPS; i++)
    d[i] = op(src.mem + (i % (KILL_LEN / KILL_OP)) * KILL_OP,
              (unsigned char *)rm.addr + (i % (KILL_LEN / KILL_OP)) * KILL_OP, KILL_OP);
  TU_ASSERT_OK(HixlCSClientBatchPutAsync(cli, KILL_OPS, d, &h));
  reply = srvchild_cmd(&sc, CS_CMD_WAIT_DATA, 0, KILL_LEN, 10000, 15000);
  if (reply != 0) tu_fail(__FILE__, __LINE__, "no data reached the child within 10 s");
  reply = srvchild_cmd(&sc, CS_CMD_DESTROY, 0, 0, 0, 15000);
  t_destroy = tu_now_ms();
  if (reply != HIXL_SUCCESS)
    tu_fail(__FILE__, __LINE__, "ServerDestroy in the child, clients connected: %lld", (long long)reply);
  st = wait_batch(cli, h, t_destroy + XFER_MS, &s, err, sizeof(err));
  TU_ASSERT_OK(st);
  if (s != HIXL_COMPLETE_STATUS_FAILED)
    tu_fail(__FILE__, __LINE__, "batch in flight at ServerDestroy ended %s, want FAILED (%s)", cs_name(s),
            err);
  else if (tu_now_ms() - t_destroy > PROMPT_MS)
    tu_fail(__FILE__, __LINE__, "the batch ended FAILED only %lld ms after ServerDestroy",
            (long long)(tu_now_ms() - t_destroy));
  else
    CU_PASS("FAILED promptly");
  one = op(src.mem, rm.addr, 4 * KiB);
  st = HixlCSClientBatchPutSync(cli, 1, &one, PROMPT_MS);
  if (st != HIXL_NOT_CONNECTED && st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "BatchPutSync after ServerDestroy: %s (%s)", HixlStatusName(st),
            HixlGetLastErrorMessage());
out:
  client_region_free(cli, &src);
  if (cli) TU_ASSERT_OK(HixlCSClientDestroy(cli));
  srvchild_quit(&sc); /* the child answers and exits 0: Destroy left it sound */
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  CU_pSuite s;
  int rc = tu_child_main(argc, argv);

  if (rc >= 0) return rc; /* a test_util server child (unused here) */
  rc = cs_child_main(argc, argv);
  if (rc >= 0) return rc; /* one of this program's children */
  /* Two engines of this one process link over shm only when authenticated (a pid that
   * is this process's own is proven by the socket's binding, docs/security.md): every
   * engine here, children included, holds a key. */
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;

  if (!self_exe[0]) {
    fprintf(stderr, "cannot resolve /proc/self/exe\n");
    return 1;
  }
  unsetenv(TIMEOUT_ENV);
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;

  s = CU_add_suite("usage flow (seed 000)", NULL, NULL);
  CU_add_test(s, "server and client in one process, async and sync", test_usage_flow);
  CU_add_test(s, "server in another process", test_usage_flow_two_processes);
  CU_add_test(s, "four threads on one client", test_threads);
  CU_add_test(s, "Destroy racing calls on the client: refused after, nothing used after free",
              test_destroy_races_calls);
  CU_add_test(s, "shm endpoints: same-host copies, or a clear refusal", test_shm_endpoints);

  s = CU_add_suite("arguments and rules", pair_init, pair_cleanup);
  CU_add_test(s, "ServerCreate arguments", test_server_create_args);
  CU_add_test(s, "ClientCreate arguments", test_client_create_args);
  CU_add_test(s, "RegMem / UnregMem arguments, both sides", test_regmem_args);
  CU_add_test(s, "Listen twice and its arguments", test_listen_args);
  CU_add_test(s, "batch arguments", test_batch_args);
  CU_add_test(s, "a NULL local_buf: PARAM_INVALID, and the link stays", test_null_local_buf);
  CU_add_test(s, "unregistered client memory is staged", test_unregistered_client_memory);
  CU_add_test(s, "GetRemoteMem arguments", test_remote_mem_args);
  CU_add_test(s, "NULL, made-up and destroyed handles", test_bad_handles);
  CU_add_test(s, "server handle to client calls and back", test_wrong_kind_handles);
  CU_add_test(s, "tags and device names without a NUL, list_num past the list", test_unbounded_args);
  CU_add_test(s, "mem tags; GetRemoteMem replaced and refreshed", test_remote_mem_tags);
  CU_add_test(s, "QueryCompleteStatus releases; bogus handles", test_query_rules);
  CU_add_test(s, "at most 4096 uncompleted batches", test_inflight_limit);

  s = CU_add_suite("failures reported (better than HIXL)", NULL, NULL);
  CU_add_test(s, "remote range outside registered memory: FAILED", test_remote_out_of_range);
  CU_add_test(s, "server killed mid-put; a new server on the port", test_server_killed);
  CU_add_test(s, "Connect fails, then succeeds without recreating", test_connect_again);
  CU_add_test(s, "ClientDestroy with batches outstanding", test_destroy_outstanding);
  CU_add_test(s, "stopped server: TIMEOUT on time; Destroy at once", test_stopped_server);
  CU_add_test(s, "ServerDestroy while a client is connected", test_server_destroyed);
  CU_add_test(s, "ServerDestroy with a batch in flight", test_server_destroyed_mid_batch);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
