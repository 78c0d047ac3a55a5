/* Two processes on loopback: a server engine in a forked child, the client here.
 * Data crossing the process boundary is checked on both sides; a peer killed with
 * SIGKILL mid-transfer ends the transfer FAILED or TIMEOUT without a hang, and a new
 * server on the same port is reachable again; a SIGSTOPped peer gives TIMEOUT (data ops
 * over rdma and shm still complete: they need no work from the peer's CPU). Engines use
 * tu_transport(): shm here under auto, tcp in test_engine_procs_tcp, rdma in the guest. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "test_util.h"

#define KiB      ((size_t)1 << 10)
#define MiB      ((size_t)1 << 20)
#define SRV_LEN  (64 * MiB)  /* server child memory in the basic tests */
#define KILL_LEN (256 * MiB) /* bytes moved by the transfer that gets killed */
#define KILL_OP  (4 * MiB)   /* per op */
#define KILL_OPS                                                                                             \
  1024                     /* 4 GiB in all: KILL_LEN is covered 16 times over, so                            \
                            * the batch cannot finish before the kill lands even                             \
                            * when this process is slowed down (valgrind) */
#define KILL_TIMEOUT 10000 /* ms: long, so a result must come from the death */
/* A closed link must fail its transfers this fast: well inside KILL_TIMEOUT, so an end
 * by the transfer's own timeout still fails the test. Sanitizers slow the engine several
 * times over (a TSan run ended one 3046 ms after the kill). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define PROMPT_MS 6000
#else
#define PROMPT_MS 3000
#endif
#define READY_MS 10000 /* a child has this long to report readiness */

static struct {
  HixlEngine *cli;
  uint16_t port;
  char srv_name[TU_ADDR_LEN];
  unsigned char *local; /* KILL_LEN, registered with cli */
  HixlMemHandle local_h;
} g;

static int procs_init(void) {
  g.port = tu_free_port();
  if (!g.port) return -1;
  tu_addr(g.srv_name, sizeof(g.srv_name), g.port);
  g.local = tu_alloc_mem(KILL_LEN, false);
  if (!g.local) return -1;
  g.cli = tu_engine_start(tu_ip());
  if (!g.cli) return -1;
  g.local_h = tu_register(g.cli, g.local, KILL_LEN);
  return g.local_h ? 0 : -1;
}

static int procs_cleanup(void) {
  int rc = 0;

  if (g.cli && HixlEngineDestroy(g.cli) != HIXL_SUCCESS) rc = -1;
  tu_free_mem(g.local, KILL_LEN);
  memset(&g, 0, sizeof(g));
  return rc;
}

static HixlTransferOpDesc desc(const void *local, uint64_t remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = (uintptr_t)remote, .len = len};
  return d;
}

/* Start a server child on g.port; fatal for the test when it does not come up. */
static bool start_server(tu_child *c, tu_server_cfg *cfg, tu_server_ready *info) {
  cfg->port = g.port;
  if (tu_server_start(c, cfg, info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "server child on %s did not start: %s (%s)", g.srv_name,
            HixlStatusName(info->status), info->error);
    return false;
  }
  return true;
}

/* Ask the child to check [off, off + len) of its memory against pattern seed. */
static void child_expect_pattern(tu_child *c, uint64_t off, uint64_t len, uint64_t seed, const char *what) {
  tu_cmd cmd;
  int64_t reply = -99;

  memset(&cmd, 0, sizeof(cmd));
  cmd.op = TU_CMD_CHECK;
  cmd.seed = seed;
  cmd.off = off;
  cmd.len = len;
  if (tu_server_send(c, &cmd, &reply, 30000) != 0)
    tu_fail(__FILE__, __LINE__, "%s: child did not answer CHECK", what);
  else if (reply != -1)
    tu_fail(__FILE__, __LINE__, "%s: child memory differs from pattern %llu at offset %lld", what,
            (unsigned long long)seed, (long long)reply);
  else
    CU_PASS("child memory checked");
}

static void child_fill(tu_child *c, uint64_t off, uint64_t len, uint64_t seed) {
  tu_cmd cmd;
  int64_t reply = -99;

  memset(&cmd, 0, sizeof(cmd));
  cmd.op = TU_CMD_FILL;
  cmd.seed = seed;
  cmd.off = off;
  cmd.len = len;
  if (tu_server_send(c, &cmd, &reply, 30000) != 0 || reply != 0)
    tu_fail(__FILE__, __LINE__, "child FILL failed (reply %lld)", (long long)reply);
}

/* Ask the child to quit and check that it exited 0 (its engine shut down cleanly). */
static void child_quit(tu_child *c) {
  tu_cmd cmd;
  int64_t reply = -99;
  int ws;

  memset(&cmd, 0, sizeof(cmd));
  cmd.op = TU_CMD_QUIT;
  if (tu_server_send(c, &cmd, &reply, 10000) != 0 || reply != 0)
    tu_fail(__FILE__, __LINE__, "child did not acknowledge QUIT");
  ws = tu_child_stop(c, 10000);
  if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "server child ended badly (wait status 0x%x)", (unsigned)ws);
  else
    CU_PASS("child exited 0");
}

/* WRITE len bytes to the child at off, have the child check them, READ them back. */
static void write_check_read(tu_child *c, uint64_t raddr, size_t off, size_t len, uint64_t seed) {
  HixlTransferOpDesc d;
  char what[64];

  snprintf(what, sizeof(what), "WRITE %zu B at +%zu", len, off);
  tu_fill(g.local, len, seed);
  d = desc(g.local, raddr + off, len);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 30000));
  child_expect_pattern(c, off, len, seed, what);
  memset(g.local + len, 0, len);
  d = desc(g.local + len, raddr + off, len);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 30000));
  snprintf(what, sizeof(what), "READ back %zu B", len);
  TU_ASSERT_PATTERN(g.local + len, len, seed, what);
}

/* ---------------------------------------------------------------- basic */

static void test_two_process_data(void) {
  const size_t sizes[] = {1, 4 * KiB + 5, MiB, 16 * MiB + 3};
  tu_server_cfg cfg = {.mem_len = SRV_LEN, .shared = NULL, .seed = 0};
  tu_server_ready info;
  tu_child c;
  HixlTransferOpDesc *d;
  size_t i, n = 1024, blk = 4 * KiB;
  int64_t t0, elapsed;
  HixlStatus st;

  if (!start_server(&c, &cfg, &info)) return;
  CU_ASSERT_EQUAL(info.len, SRV_LEN);
  TU_ASSERT_OK(HixlEngineConnect(g.cli, g.srv_name, 5000));
  for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    write_check_read(&c, info.addr, 7 * i, sizes[i], 10 + i);

  /* Data made by the child, read here. */
  child_fill(&c, 3, 8 * MiB, 20);
  memset(g.local, 0, 8 * MiB);
  d = malloc(n * sizeof(*d));
  CU_ASSERT_PTR_NOT_NULL_FATAL(d);
  d[0] = desc(g.local, info.addr + 3, 8 * MiB);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, d, 1, 30000));
  TU_ASSERT_PATTERN(g.local, 8 * MiB, 20, "READ of memory the child filled");

  /* A 1024-op batch, remote blocks in reverse order, checked by the child. */
  tu_fill(g.local, n * blk, 21);
  for (i = 0; i < n; i++) d[i] = desc(g.local + (n - 1 - i) * blk, info.addr + i * blk, blk);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, d, n, 30000));
  memset(g.local + n * blk, 0, n * blk); /* read the whole span back, check each block */
  d[0] = desc(g.local + n * blk, info.addr, n * blk);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, d, 1, 30000));
  for (i = 0; i < n; i++)
    if (tu_mismatch(g.local + n * blk + i * blk, g.local + (n - 1 - i) * blk, blk) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch block %zu holds the wrong data", i);
      break;
    }
  free(d);

  /* Out of the child's range: FAILED, and the child keeps serving. */
  child_fill(&c, 0, SRV_LEN, 22);
  {
    HixlTransferOpDesc bad = desc(g.local, info.addr + SRV_LEN - 8, 16);
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &bad, 1, 5000), HIXL_FAILED);
  }
  child_expect_pattern(&c, 0, SRV_LEN, 22, "child memory after a refused WRITE");
  write_check_read(&c, info.addr, 100, 64 * KiB, 23);

  /* The child quits cleanly; transfers to it then fail fast, never hang. */
  child_quit(&c);
  {
    HixlTransferOpDesc one = desc(g.local, info.addr, 4096);
    t0 = tu_now_ms();
    st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &one, 1, 3000);
    elapsed = tu_now_ms() - t0;
  }
  if (st != HIXL_FAILED && st != HIXL_NOT_CONNECTED)
    tu_fail(__FILE__, __LINE__, "transfer to an exited peer: got %s, want FAILED or NOT_CONNECTED",
            HixlStatusName(st));
  CU_ASSERT(elapsed < 3500);
  HixlEngineDisconnect(g.cli, g.srv_name, 1000); /* either result is fine here */
}

/* ---------------------------------------------------------------- kill -9 */

struct sync_arg {
  HixlTransferOp op;
  HixlTransferOpDesc *d;
  size_t n;
  HixlStatus st;
  int64_t t_end;
  char err[256]; /* the thread's last error message */
};

static void *sync_thread(void *p) {
  struct sync_arg *a = p;

  a->st = HixlEngineTransferSync(g.cli, g.srv_name, a->op, a->d, a->n, KILL_TIMEOUT);
  a->t_end = tu_now_ms();
  snprintf(a->err, sizeof(a->err), "%s", HixlGetLastErrorMessage());
  return NULL;
}

/* Run one batch of KILL_OPS ops over KILL_LEN into (WRITE) or out of (READ) a child that is killed
 * with SIGKILL as soon as data is seen moving. shm is the child's memory, shared
 * with this process so that it can watch the bytes land. */
static void kill_mid_transfer(HixlTransferOp op, bool async, const tu_shm *shm) {
  unsigned char *shared = shm->mem;
  const size_t n = KILL_OPS, per_pass = KILL_LEN / KILL_OP;
  tu_server_cfg cfg = {.mem_len = KILL_LEN, .shared = shm, .seed = 0};
  static HixlTransferOpDesc d[KILL_OPS];
  const char *name =
      op == HIXL_WRITE ? (async ? "async WRITE" : "sync WRITE") : (async ? "async READ" : "sync READ");
  struct sync_arg sa;
  tu_server_ready info;
  tu_child c;
  pthread_t th;
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlStatus st;
  int64_t t0, t_sub, t_end, t_kill, deadline;
  struct timespec abs;
  bool moving;
  int ws;
  size_t i;

  /* WRITE: local holds data, the child's memory is zero and watched.
   * READ: the child's memory holds data, local is zero and watched. */
  if (op == HIXL_WRITE) {
    tu_fill(g.local, KILL_LEN, 31);
    memset(shared, 0, KILL_LEN);
  } else {
    memset(g.local, 0, KILL_LEN);
    tu_fill(shared, KILL_LEN, 32);
  }
  if (!start_server(&c, &cfg, &info)) return;
  CU_ASSERT_EQUAL(info.len, KILL_LEN);
  /* A new child on the port of the one killed before: Connect must work again. */
  st = HixlEngineConnect(g.cli, g.srv_name, 5000);
  if (st == HIXL_ALREADY_CONNECTED) {
    tu_fail(__FILE__, __LINE__,
            "%s: Connect to a new server on %s after the old one was killed "
            "gave ALREADY_CONNECTED (dead link kept)",
            name, g.srv_name);
    HixlEngineDisconnect(g.cli, g.srv_name, 1000);
    st = HixlEngineConnect(g.cli, g.srv_name, 5000);
  }
  if (!tu_status_is(st, HIXL_SUCCESS, "Connect to the new server child", __FILE__, __LINE__)) {
    tu_child_kill(&c, SIGKILL);
    tu_child_wait(&c, 5000);
    return;
  }
  for (i = 0; i < n; i++)
    d[i] = desc(g.local + (i % per_pass) * KILL_OP, info.addr + (i % per_pass) * KILL_OP, KILL_OP);

  t0 = tu_now_ms();
  if (async) {
    st = HixlEngineTransferAsync(g.cli, g.srv_name, op, d, n, KILL_TIMEOUT, NULL, &req);
    if (!tu_status_is(st, HIXL_SUCCESS, "TransferAsync", __FILE__, __LINE__)) {
      tu_child_kill(&c, SIGKILL);
      tu_child_wait(&c, 5000);
      return;
    }
  } else {
    sa.op = op;
    sa.d = d;
    sa.n = n;
    sa.st = 0xdead;
    sa.t_end = 0;
    sa.err[0] = '\0';
    CU_ASSERT_FATAL(pthread_create(&th, NULL, sync_thread, &sa) == 0);
  }
  t_sub = tu_now_ms() - t0; /* how long submitting took (async: should be short) */
  moving = tu_wait_nonzero(op == HIXL_WRITE ? shared : g.local, KILL_LEN, KILL_OP, 64, tu_now_ms() + 10000);
  tu_child_kill(&c, SIGKILL);
  t_kill = tu_now_ms();
  if (!moving) tu_fail(__FILE__, __LINE__, "%s: no data moved within 10 s; killed the child anyway", name);

  deadline = tu_now_ms() + KILL_TIMEOUT + 2000;
  if (async) {
    st = tu_wait_request(g.cli, req, deadline, &ts);
    t_end = tu_now_ms();
    TU_ASSERT_OK(st);
    if (ts == HIXL_TRANSFER_WAITING) {
      tu_fail(__FILE__, __LINE__, "%s: still WAITING %lld ms after submit (timeout %d ms)", name,
              (long long)(t_end - t0), KILL_TIMEOUT);
    } else if (ts != HIXL_TRANSFER_FAILED && ts != HIXL_TRANSFER_TIMEOUT) {
      tu_fail(__FILE__, __LINE__,
              "%s: peer killed mid-transfer, final state %d, want FAILED "
              "or TIMEOUT",
              name, (int)ts);
    } else {
      CU_PASS("async transfer ended FAILED or TIMEOUT");
      /* A final state releases the request. */
      TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, req, &ts), HIXL_PARAM_INVALID);
    }
  } else {
    abs.tv_sec = 0;
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_sec += (KILL_TIMEOUT + 5000) / 1000;
    if (pthread_timedjoin_np(th, NULL, &abs) != 0) {
      /* A hang: nothing safe is left to do in this process. */
      fprintf(stderr, "FATAL: %s: TransferSync still blocked %d s after the peer was killed\n", name,
              (KILL_TIMEOUT + 5000) / 1000);
      _exit(1);
    }
    t_end = sa.t_end;
    if (sa.st != HIXL_FAILED && sa.st != HIXL_TIMEOUT)
      tu_fail(__FILE__, __LINE__,
              "%s: peer killed mid-transfer: got %s, want FAILED or TIMEOUT "
              "(%s)",
              name, HixlStatusName(sa.st), sa.err);
    else
      CU_PASS("sync transfer ended FAILED or TIMEOUT");
  }
  if (t_end - t0 > KILL_TIMEOUT + 1000)
    tu_fail(__FILE__, __LINE__, "%s: took %lld ms to end, timeout was %d ms", name, (long long)(t_end - t0),
            KILL_TIMEOUT);
  /* The kernel closes a killed process's sockets at once, so the engine sees the link
   * die; its transfers must end then, not linger until their own timeout. */
  else if (t_end - t_kill > PROMPT_MS)
    tu_fail(__FILE__, __LINE__,
            "%s: ended %lld ms after the peer was killed (timeout %d ms): "
            "the closed link did not fail the transfer",
            name, (long long)(t_end - t_kill), KILL_TIMEOUT);
  else
    CU_PASS("ended promptly");
  printf("  [%s: submit %lld ms, ended %s after %lld ms: %s]\n", name, (long long)t_sub,
         async ? (ts == HIXL_TRANSFER_FAILED    ? "FAILED"
                  : ts == HIXL_TRANSFER_TIMEOUT ? "TIMEOUT"
                                                : "?")
               : HixlStatusName(sa.st),
         (long long)(t_end - t0), async ? "" : sa.err);

  ws = tu_child_wait(&c, 5000);
  CU_ASSERT(ws >= 0 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
}

static void test_kill_mid_transfer(void) {
  tu_server_cfg cfg = {.mem_len = SRV_LEN, .shared = NULL, .seed = 0};
  tu_server_ready info;
  tu_shm shm;
  tu_child c;
  HixlStatus st;

  CU_ASSERT_FATAL(tu_shm_create(&shm, KILL_LEN) == 0);
  kill_mid_transfer(HIXL_WRITE, false, &shm);
  kill_mid_transfer(HIXL_READ, false, &shm);
  kill_mid_transfer(HIXL_WRITE, true, &shm);
  kill_mid_transfer(HIXL_READ, true, &shm);
  tu_shm_destroy(&shm);

  /* And once more a fresh child on the same port, with data checked on both sides. */
  if (!start_server(&c, &cfg, &info)) return;
  st = HixlEngineConnect(g.cli, g.srv_name, 5000);
  if (st == HIXL_ALREADY_CONNECTED) {
    tu_fail(__FILE__, __LINE__, "Connect after the last kill gave ALREADY_CONNECTED");
    HixlEngineDisconnect(g.cli, g.srv_name, 1000);
    st = HixlEngineConnect(g.cli, g.srv_name, 5000);
  }
  TU_ASSERT_STATUS(st, HIXL_SUCCESS);
  if (st == HIXL_SUCCESS) write_check_read(&c, info.addr, 5, 4 * MiB + 1, 33);
  child_quit(&c);
  HixlEngineDisconnect(g.cli, g.srv_name, 1000);
}

/* ---------------------------------------------------------------- SIGSTOP */

/* Run a call with a 300 ms timeout against the stopped peer: TIMEOUT, on time. */
#define STOP_TIMEOUT 300
#define STOP_MARGIN  700
static void check_timely(HixlStatus st, int64_t t0, const char *what) {
  int64_t elapsed = tu_now_ms() - t0;

  if (st != HIXL_TIMEOUT)
    tu_fail(__FILE__, __LINE__, "%s to a stopped peer: got %s, want HIXL_TIMEOUT (%s)", what,
            HixlStatusName(st), HixlGetLastErrorMessage());
  else
    CU_PASS("timeout");
  if (elapsed < STOP_TIMEOUT - 20 || elapsed > STOP_TIMEOUT + STOP_MARGIN)
    tu_fail(__FILE__, __LINE__, "%s: took %lld ms, want [%d, %d]", what, (long long)elapsed,
            STOP_TIMEOUT - 20, STOP_TIMEOUT + STOP_MARGIN);
  else
    CU_PASS("on time");
}

/* Over rdma and shm a stopped process's registered memory is still served (one-sided:
 * the NIC, or the kernel for process_vm_*, does the work), so data ops complete; over
 * tcp they need the peer's CPU. */
static void check_data_op(const char *transport, HixlStatus st, int64_t t0, const char *what) {
  if (strcmp(transport, "tcp") == 0) {
    check_timely(st, t0, what);
    return;
  }
  if (st != HIXL_SUCCESS)
    tu_fail(__FILE__, __LINE__, "%s over %s to a stopped peer: got %s, want HIXL_SUCCESS (%s)", what,
            transport, HixlStatusName(st), HixlGetLastErrorMessage());
  else
    CU_PASS("one-sided op served while the peer is stopped");
}

static void test_stopped_peer(void) {
  tu_server_cfg cfg = {.mem_len = 16 * MiB, .shared = NULL, .seed = 0};
  tu_server_ready info;
  tu_child c;
  HixlTransferOpDesc d;
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlNotifyDesc nd = {.name = "n", .msg = "m", .remote_engine = NULL};
  HixlEngine *late;
  HixlStatus st;
  int64_t t0;

  if (!start_server(&c, &cfg, &info)) return;
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  write_check_read(&c, info.addr, 0, 64 * KiB, 41); /* the link works before the stop */
  struct hixl_link_info li;
  TU_ASSERT_OK(hixl_engine_link_info(g.cli, g.srv_name, &li));
  const char *transport = li.transport;
  bool one_sided = strcmp(transport, "tcp") != 0;

  tu_child_kill(&c, SIGSTOP);
  CU_ASSERT_EQUAL_FATAL(tu_child_wait_stopped(&c, 5000), 0);

  tu_fill(g.local, MiB, 42);
  d = desc(g.local, info.addr, MiB);
  t0 = tu_now_ms();
  st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, STOP_TIMEOUT);
  check_data_op(transport, st, t0, "sync WRITE 1 MiB");

  d = desc(g.local + MiB, info.addr, 4 * KiB);
  t0 = tu_now_ms();
  st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, STOP_TIMEOUT);
  check_data_op(transport, st, t0, "sync READ 4 KiB");

  d = desc(g.local, info.addr + MiB, 64 * KiB);
  t0 = tu_now_ms();
  st = HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, STOP_TIMEOUT, NULL, &req);
  TU_ASSERT_OK(st);
  if (st == HIXL_SUCCESS) {
    TU_ASSERT_OK(tu_wait_request(g.cli, req, t0 + STOP_TIMEOUT + 5000, &ts));
    check_data_op(transport,
                  ts == HIXL_TRANSFER_TIMEOUT     ? HIXL_TIMEOUT
                  : ts == HIXL_TRANSFER_FAILED    ? HIXL_FAILED
                  : ts == HIXL_TRANSFER_COMPLETED ? HIXL_SUCCESS
                                                  : 0xdeadu,
                  t0, "async WRITE 64 KiB");
  }

  t0 = tu_now_ms();
  st = HixlEngineSendNotify(g.cli, g.srv_name, &nd, STOP_TIMEOUT);
  check_timely(st, t0, "SendNotify");

  /* A new engine connecting to the stopped peer: the kernel accepts the TCP
   * connection but no handshake answer comes. */
  late = tu_engine_start(tu_ip());
  CU_ASSERT_PTR_NOT_NULL(late);
  if (late) {
    t0 = tu_now_ms();
    st = HixlEngineConnect(late, g.srv_name, STOP_TIMEOUT);
    check_timely(st, t0, "Connect");
  }

  tu_child_kill(&c, SIGCONT);
  if (late) TU_ASSERT_OK(HixlEngineDestroy(late));
  if (one_sided) { /* what the NIC or the kernel wrote while the peer was stopped is there */
    memset(g.local + 2 * MiB, 0, MiB);
    d = desc(g.local + 2 * MiB, info.addr, MiB);
    TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 10000));
    TU_ASSERT_PATTERN(g.local + 2 * MiB, MiB, 42, "WRITE done while the peer was stopped");
  }

  /* After SIGCONT the peer catches up on stale requests; the link is usable again,
   * possibly after reconnecting if the engine dropped it on the timeouts. */
  tu_fill(g.local, MiB, 43);
  d = desc(g.local, info.addr + 2 * MiB, MiB);
  st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 10000);
  if (st != HIXL_SUCCESS) {
    printf("  [after SIGCONT the first transfer gave %s: %s; reconnecting]\n", HixlStatusName(st),
           HixlGetLastErrorMessage());
    HixlEngineDisconnect(g.cli, g.srv_name, 1000);
    TU_ASSERT_OK(HixlEngineConnect(g.cli, g.srv_name, 5000));
  }
  write_check_read(&c, info.addr, 3 * MiB, MiB + 7, 44);
  child_quit(&c);
  HixlEngineDisconnect(g.cli, g.srv_name, 1000);
}

/* Bytes of got that are neither want's nor 0 (what the peer held before). */
static size_t foreign_bytes(const unsigned char *got, const unsigned char *want, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) n += got[i] != want[i] && got[i] != 0;
  return n;
}

/* A 64 MiB WRITE to a stopped peer times out with its frames in the socket, one part-sent
 * (tcp): from the call's return on the caller's memory is its own again, sync and async
 * alike. DeregisterMem succeeds at once (it refused, "still in flight", for as long as
 * the peer stayed stopped), and what the caller writes there afterwards never reaches
 * the peer: the part-sent frame ends from a copy (it went on from the caller's memory,
 * after the call had returned). Over rdma and shm the data moves without the peer's CPU
 * and the WRITE completes. */
static void test_stopped_peer_lets_go(void) {
  const size_t len = 64 * MiB;
  tu_server_cfg cfg = {.mem_len = 2 * len, .shared = NULL, .seed = 0};
  tu_server_ready info;
  tu_child c;
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  struct hixl_link_info li;
  unsigned char *src[2];
  HixlMemHandle h[2];
  HixlStatus st;

  if (!start_server(&c, &cfg, &info)) return;
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(g.cli, g.srv_name, &li));
  bool one_sided = strcmp(li.transport, "tcp") != 0;
  for (int k = 0; k < 2; k++) {
    src[k] = tu_alloc_mem(len, false);
    CU_ASSERT_PTR_NOT_NULL_FATAL(src[k]);
    tu_fill(src[k], len, 51 + (uint64_t)k);
    h[k] = tu_register(g.cli, src[k], len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h[k]);
  }
  tu_child_kill(&c, SIGSTOP);
  CU_ASSERT_EQUAL_FATAL(tu_child_wait_stopped(&c, 5000), 0);

  /* One-sided: long enough to finish on a loaded host (a same-host step running at the
   * deadline keeps its registration until it ends, as documented). */
  const int32_t tmo = one_sided ? 30000 : STOP_TIMEOUT;
  HixlTransferOpDesc d = desc(src[0], info.addr, len);
  st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, tmo);
  TU_ASSERT_STATUS(st, one_sided ? HIXL_SUCCESS : HIXL_TIMEOUT);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h[0])); /* right after the call: nothing holds it */
  memset(src[0], 0xa5, len);                          /* the caller's again: reused */

  d = desc(src[1], info.addr + len, len);
  TU_ASSERT_OK(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, tmo, NULL, &req));
  TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + tmo + 5000, &ts));
  CU_ASSERT_EQUAL(ts, one_sided ? HIXL_TRANSFER_COMPLETED : HIXL_TRANSFER_TIMEOUT);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h[1]));
  memset(src[1], 0x5a, len);

  tu_child_kill(&c, SIGCONT); /* it takes in what was left on the wire, then answers */
  memset(g.local, 0, 2 * len);
  d = desc(g.local, info.addr, 2 * len);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 30000));
  for (int k = 0; k < 2; k++) {
    tu_fill(src[k], len, 51 + (uint64_t)k); /* what the WRITE held when it was called */
    if (one_sided) {
      TU_ASSERT_SAME(g.local + (size_t)k * len, src[k], len, "WRITE done while the peer was stopped");
      continue;
    }
    size_t bad = foreign_bytes(g.local + (size_t)k * len, src[k], len);
    if (bad)
      tu_fail(__FILE__, __LINE__,
              "%s WRITE that timed out: %zu bytes at the peer came from the caller's memory after the call "
              "returned",
              k ? "async" : "sync", bad);
    else
      CU_PASS("nothing read from the caller's memory after the call returned");
  }
  child_quit(&c);
  HixlEngineDisconnect(g.cli, g.srv_name, 1000);
  for (int k = 0; k < 2; k++) tu_free_mem(src[k], len);
}

/* A short op is packed into a staged unit (StagingThreshold, auto on tcp and rdma) even
 * when its local range is registered: the unit holds that registration as a direct
 * chunk holds its own. DeregisterMem refuses while the op is in flight (it succeeded,
 * and a READ answered later landed in memory the caller had taken back), and succeeds
 * once the op was given up; what comes after its deadline is dropped. */
static void test_stopped_peer_staged_holds(void) {
  tu_server_cfg cfg = {.mem_len = MiB, .shared = NULL, .seed = 71};
  tu_server_ready info;
  tu_child c;
  HixlTransferReq req[2] = {NULL, NULL};
  HixlTransferStatus ts;
  const size_t len = 64 * KiB;

  if (!start_server(&c, &cfg, &info)) return;
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  unsigned char *m = tu_alloc_mem(len, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(m);
  HixlMemHandle h = tu_register(g.cli, m, len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  memset(m, 0x11, len);
  tu_child_kill(&c, SIGSTOP);
  CU_ASSERT_EQUAL_FATAL(tu_child_wait_stopped(&c, 5000), 0);

  HixlTransferOpDesc d[2] = {desc(m, info.addr, KiB), desc(m + 8 * KiB, info.addr + 8 * KiB, KiB)};
  TU_ASSERT_OK(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_READ, &d[0], 1, STOP_TIMEOUT, NULL, &req[0]));
  TU_ASSERT_OK(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d[1], 1, STOP_TIMEOUT, NULL, &req[1]));
  bool waiting = true; /* a one-sided transport may have copied them already */
  for (int k = 0; k < 2; k++) {
    TU_ASSERT_OK(HixlEngineGetTransferStatus(g.cli, req[k], &ts));
    waiting &= ts == HIXL_TRANSFER_WAITING;
    if (ts != HIXL_TRANSFER_WAITING) req[k] = NULL; /* final: released */
  }
  if (waiting) {
    TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, h), HIXL_FAILED);
    TU_ASSERT_ERRMSG_HAS("in flight");
  }
  for (int k = 0; k < 2; k++)
    if (req[k]) TU_ASSERT_OK(tu_wait_request(g.cli, req[k], tu_now_ms() + STOP_TIMEOUT + 5000, &ts));
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h)); /* given up: nothing holds it */
  memset(m, 0x22, len);

  tu_child_kill(&c, SIGCONT); /* its answers to both come before the READ below's */
  HixlTransferOpDesc back = desc(g.local, info.addr, KiB);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &back, 1, 10000));
  CU_ASSERT_EQUAL(tu_check_byte(m, len, 0x22), -1); /* late data dropped, not landed */
  child_quit(&c);
  HixlEngineDisconnect(g.cli, g.srv_name, 1000);
  tu_free_mem(m, len);
}

/* Links cut in e (white box): those in its graveyard, waiting for the progress thread. */
static int graveyard_len(HixlEngine *e) {
  int n = 0;
  pthread_mutex_lock(&e->lock);
  for (struct conn *c = e->graveyard; c; c = c->next) n++;
  pthread_mutex_unlock(&e->lock);
  return n;
}

/* Connect, a sync READ and Disconnect, again and again, on a link only its caller reads
 * (nothing wakes the progress thread): every cut link is freed soon after, not kept
 * (its 256 KiB receive buffer, over shm the peer's page mapped) until some other event
 * wakes the thread; 256 such rounds held 64 MiB and 256 mappings. */
static void test_disconnect_frees(void) {
  tu_server_cfg cfg = {.mem_len = MiB, .shared = NULL, .seed = 61};
  tu_server_ready info;
  tu_child c;
  const int rounds = 32;

  if (!start_server(&c, &cfg, &info)) return;
  for (int k = 0; k < rounds; k++) {
    HixlTransferOpDesc d = desc(g.local, info.addr, 4 * KiB);
    TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
    memset(g.local, 0, 4 * KiB);
    TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 5000));
    TU_ASSERT_OK(HixlEngineDisconnect(g.cli, g.srv_name, 1000));
  }
  TU_ASSERT_PATTERN(g.local, 4 * KiB, 61, "READ of the child's memory");
  int64_t deadline = tu_now_ms() + 5000;
  int left;
  while ((left = graveyard_len(g.cli)) > 0 && tu_now_ms() < deadline) sched_yield();
  if (left > 0)
    tu_fail(__FILE__, __LINE__, "%d of %d links cut by Disconnect still unfreed 5 s later", left, rounds);
  else
    CU_PASS("every cut link freed");
  child_quit(&c);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  CU_pSuite s;
  int rc = tu_child_main(argc, argv);

  if (rc >= 0) return rc; /* this process was a server child */
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  s = CU_add_suite("two processes", procs_init, procs_cleanup);
  CU_add_test(s, "data across processes, checked on both sides", test_two_process_data);
  CU_add_test(s, "peer killed mid-transfer, then a new peer", test_kill_mid_transfer);
  CU_add_test(s, "stopped peer gives TIMEOUT on time", test_stopped_peer);
  CU_add_test(s, "a WRITE that timed out on a stopped peer lets go of the caller's memory",
              test_stopped_peer_lets_go);
  CU_add_test(s, "a short (staged) op holds its registration while in flight",
              test_stopped_peer_staged_holds);
  CU_add_test(s, "Connect, READ, Disconnect again and again: the cut links are freed", test_disconnect_frees);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
