/* The RDMA transport on a real verbs device (soft-RoCE in the project's QEMU guest):
 * transport choice, traffic class and service level on the QP, data byte for byte,
 * and refusals. Skips (77) where no RDMA device exists; with HIXL_REQUIRE_RDMA=1
 * (the guest run) a missing device is a failure. Engines use HIXL_TEST_IP, which
 * must be an address of the RDMA device (the guest sets 10.77.0.1). */
#include <CUnit/Basic.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "transport/rdma/erdma.h"
#include "transport/rdma/rdma.h"
#include "test_util.h"

#define MEM (80u << 20)

static struct {
  HixlEngine *srv, *cli;
  uint8_t *smem, *cmem;
  char srv_name[TU_ADDR_LEN];
} g;

static HixlEngine *engine_with(const char *local, const HixlOption *o, size_t n) {
  HixlEngine *e = NULL;
  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return NULL;
  if (HixlEngineInitialize(e, local, o, n) != HIXL_SUCCESS) {
    fprintf(stderr, "Initialize %s: %s\n", local, HixlGetLastErrorMessage());
    HixlEngineDestroy(e);
    return NULL;
  }
  return e;
}

/* The target's address: HIXL_TEST_PEER_IP when set (a second rxe device, so the
 * traffic crosses a veth where tcpdump sees the TOS byte), else tu_ip(). */
static const char *peer_ip(void) {
  const char *ip = getenv("HIXL_TEST_PEER_IP");
  return ip && *ip ? ip : tu_ip();
}

/* Transport rdma throughout: between engines of one host, auto would pick shm. */
static int pair_init(void) {
  static const HixlOption qos[] = {{"RdmaTrafficClass", "104"},
                                   {"RdmaServiceLevel", "3"},
                                   {"RdmaTimeout", "18"},
                                   {"RdmaRetryCount", "6"},
                                   {"Transport", "rdma"}};
  snprintf(g.srv_name, sizeof(g.srv_name), "%s:%u", peer_ip(), (unsigned)tu_free_port());
  g.smem = tu_alloc_mem(MEM, false);
  g.cmem = tu_alloc_mem(MEM, false);
  g.srv = engine_with(g.srv_name, qos, 5);
  g.cli = engine_with(tu_ip(), qos, 5);
  if (!g.smem || !g.cmem || !g.srv || !g.cli) return -1;
  if (!tu_register(g.srv, g.smem, MEM) || !tu_register(g.cli, g.cmem, MEM)) return -1;
  return HixlEngineConnect(g.cli, g.srv_name, 5000) == HIXL_SUCCESS ? 0 : -1;
}

static int pair_cleanup(void) {
  HixlEngineDestroy(g.cli);
  HixlEngineDestroy(g.srv);
  tu_free_mem(g.smem, MEM);
  tu_free_mem(g.cmem, MEM);
  return 0;
}

static HixlTransferOpDesc op(size_t loff, size_t roff, size_t len) {
  return (HixlTransferOpDesc){(uintptr_t)g.cmem + loff, (uintptr_t)g.smem + roff, len};
}

static void test_rdma_link_with_qos(void) {
  struct hixl_link_info li;
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(g.cli, g.srv_name, &li));
  CU_ASSERT_EQUAL_FATAL(li.rdma, 1);
  CU_ASSERT_STRING_EQUAL(li.transport, "rdma");
  CU_ASSERT(li.device[0] != '\0');
  CU_ASSERT_EQUAL(li.tc_set, 104);
  CU_ASSERT_EQUAL(li.tc_queried, 104); /* the GRH traffic class the QP really carries */
  CU_ASSERT_EQUAL(li.sl_set, 3);
  /* rxe accepts the SL and reports 0 (RoCE without a VLAN has nowhere to carry it). */
  CU_ASSERT_EQUAL(li.sl_queried, strncmp(li.device, "rxe", 3) == 0 ? 0 : 3);
  CU_ASSERT_EQUAL(li.timeout_queried, 18); /* RdmaTimeout */
  CU_ASSERT_EQUAL(li.retry_queried, 6);    /* RdmaRetryCount */
}

static void test_sizes(void) {
  static const size_t sizes[] = {1, 7, 4096, 65536 + 3, 1u << 20, (5u << 20) + 1, 64u << 20};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t n = sizes[i];
    HixlTransferOpDesc d = op(0, 4096, n);
    tu_fill(g.cmem, n, 100 + i);
    TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 60000));
    TU_ASSERT_PATTERN(g.smem + 4096, n, 100 + i, "target after WRITE");
    memset(g.cmem + (8u << 20), 0, n);
    d = op(8u << 20, 4096, n);
    TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 60000));
    TU_ASSERT_PATTERN(g.cmem + (8u << 20), n, 100 + i, "initiator after READ");
  }
}

/* 4096 scattered ops: more than one send queue (1024 WRs) holds. */
static void test_big_batch(void) {
  enum { N = 4096, B = 1000 };
  static HixlTransferOpDesc d[N];
  tu_fill(g.cmem, (size_t)N * 1024, 7);
  memset(g.smem, 0, (size_t)N * 1024);
  for (size_t i = 0; i < N; i++) d[i] = op(i * 1024, (N - 1 - i) * 1024, B);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, d, N, 60000));
  for (size_t i = 0; i < N; i++)
    if (memcmp(g.smem + (N - 1 - i) * 1024, g.cmem + i * 1024, B) != 0) {
      tu_fail(__FILE__, __LINE__, "op %zu landed wrong", i);
      break;
    }
  memset(g.cmem + (16u << 20), 0, (size_t)N * 1024);
  for (size_t i = 0; i < N; i++) d[i] = op((16u << 20) + i * 1024, (N - 1 - i) * 1024, B);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, d, N, 60000));
  for (size_t i = 0; i < N; i++)
    if (memcmp(g.cmem + (16u << 20) + i * 1024, g.cmem + i * 1024, B) != 0) {
      tu_fail(__FILE__, __LINE__, "READ op %zu wrong", i);
      break;
    }
}

static void test_async_window(void) {
  enum { R = 16, S = 256 << 10 };
  HixlTransferReq req[R];
  tu_fill(g.cmem, (size_t)R * S, 9);
  for (int i = 0; i < R; i++) {
    HixlTransferOpDesc d = op((size_t)i * S, (size_t)i * S, S);
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 60000, NULL, &req[i]));
  }
  for (int i = 0; i < R; i++) {
    HixlTransferStatus ts;
    TU_ASSERT_OK(tu_wait_request(g.cli, req[i], tu_now_ms() + 60000, &ts));
    CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  }
  TU_ASSERT_PATTERN(g.smem, (size_t)R * S, 9, "target after 16 async WRITEs");
}

static void test_out_of_range(void) {
  memset(g.smem, 0x5a, 1u << 20);
  tu_fill(g.cmem, 4096, 11);
  HixlTransferOpDesc d = op(0, MEM - 100, 4096); /* runs past the target's registration */
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 5000), HIXL_FAILED);
  d.remote_addr = (uintptr_t)g.cmem; /* memory the target never registered */
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 5000), HIXL_FAILED);
  CU_ASSERT(tu_check_byte(g.smem, 1u << 20, 0x5a) == -1);
  d = op(0, 0, 4096); /* the link still works */
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 5000));
  TU_ASSERT_PATTERN(g.smem, 4096, 11, "target after a good WRITE");
}

/* A registration made after Connect is usable at once (its rkey is advertised);
 * one deregistered is refused. */
static void test_register_after_connect(void) {
  uint8_t *extra = tu_alloc_mem(1u << 20, false);
  HixlMemHandle h = tu_register(g.srv, extra, 1u << 20);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  tu_fill(g.cmem, 1u << 20, 13);
  HixlTransferOpDesc d = {(uintptr_t)g.cmem, (uintptr_t)extra, 1u << 20};
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 10000));
  TU_ASSERT_PATTERN(extra, 1u << 20, 13, "late registration after WRITE");
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.srv, h));
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 5000), HIXL_FAILED);
  tu_free_mem(extra, 1u << 20);
}

/* Run a shell command; 0 when it exited 0. */
static int sh(const char *cmd) {
  int rc = system(cmd);
  return rc == 0 ? 0 : -1;
}

/* A transfer that times out with work requests posted resets the link: after the
 * call returns no DMA touches the caller's memory (its registration can go at once),
 * the next transfer is NOT_CONNECTED, and Connect builds a new QP that works. Sync,
 * then async. Needs a real packet path to break: rxe hands packets between QPs of one
 * device straight over, so this runs across the veth of tos-on-wire.sh, which names
 * the device (HIXL_TEST_NETEM_DEV); netem there drops every packet, so the READ's WRs
 * stay posted while the NIC retries. */
static void test_timeout_resets_qp(void) {
  const char *dev = getenv("HIXL_TEST_NETEM_DEV");
  char add[128], del[128];
  if (!dev || !*dev) {
    printf("  [not here: needs HIXL_TEST_NETEM_DEV; runs across the veth in tos-on-wire.sh]\n");
    return;
  }
  snprintf(add, sizeof(add), "tc qdisc add dev %s root netem loss 100%%", dev);
  snprintf(del, sizeof(del), "tc qdisc del dev %s root", dev);
  for (int async = 0; async < 2; async++) {
    uint8_t *m = tu_alloc_mem(64u << 20, false);
    HixlMemHandle h = tu_register(g.cli, m, 64u << 20);
    HixlTransferOpDesc d = {(uintptr_t)m, (uintptr_t)g.smem, 64u << 20};
    struct hixl_link_info before, after;
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    TU_ASSERT_OK_FATAL(hixl_engine_link_info(g.cli, g.srv_name, &before));
    CU_ASSERT_EQUAL_FATAL(sh(add), 0);
    if (!async) {
      TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 200), HIXL_TIMEOUT);
      TU_ASSERT_ERRMSG_HAS("reset");
    } else {
      HixlTransferReq req;
      HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
      TU_ASSERT_OK(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_READ, &d, 1, 200, NULL, &req));
      TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + 5000, &ts));
      CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_TIMEOUT);
    }
    /* Nothing is in flight any more: the registration goes at once. */
    TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
    CU_ASSERT_EQUAL(sh(del), 0);
    HixlTransferOpDesc small = op(0, 0, 4096);
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &small, 1, 5000),
                     HIXL_NOT_CONNECTED);
    TU_ASSERT_OK(HixlEngineConnect(g.cli, g.srv_name, 10000));
    TU_ASSERT_OK(hixl_engine_link_info(g.cli, g.srv_name, &after));
    CU_ASSERT_EQUAL(after.rdma, 1);
    CU_ASSERT_NOT_EQUAL(after.qpn, before.qpn);
    tu_fill(g.cmem, 4096, 70 + (uint64_t)async);
    TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &small, 1, 10000));
    TU_ASSERT_PATTERN(g.smem, 4096, 70 + (uint64_t)async, "target after a WRITE on the new QP");
    tu_free_mem(m, 64u << 20);
  }
}

/* Child of test_memlock: without CAP_IPC_LOCK and with a 1 MiB locked-memory limit,
 * an rdma engine still starts (its BufferPool unregistered, with a warning), a small
 * registration works, and a 16 MiB one is RESOURCE_EXHAUSTED with a message naming
 * the limit and how to raise it. Writes that message to fd; exits 0 when all held. */
/* This process from now on: without CAP_IPC_LOCK, and a locked-memory limit of 1 MiB. */
static int limit_memlock(void) {
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct cap[2];
  struct rlimit rl = {.rlim_cur = 1u << 20, .rlim_max = 1u << 20};
  if (syscall(SYS_capget, &hdr, cap) != 0) return -1;
  cap[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  cap[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  return syscall(SYS_capset, &hdr, cap) == 0 && setrlimit(RLIMIT_MEMLOCK, &rl) == 0 ? 0 : -1;
}

static int memlock_child(int fd) {
  HixlOption o = {"Transport", "rdma"};
  HixlMemHandle h;
  if (limit_memlock() != 0) return 11;
  HixlEngine *e = engine_with(tu_ip(), &o, 1);
  if (!e) return 12;
  uint8_t *small = tu_alloc_mem(64u << 10, false), *big = tu_alloc_mem(16u << 20, false);
  HixlMemDesc ds = {(uintptr_t)small, 64u << 10}, db = {(uintptr_t)big, 16u << 20};
  if (HixlEngineRegisterMem(e, &ds, HIXL_MEM_HOST, &h) != HIXL_SUCCESS) return 13;
  HixlStatus st = HixlEngineRegisterMem(e, &db, HIXL_MEM_HOST, &h);
  const char *msg = HixlGetLastErrorMessage();
  (void)!write(fd, msg, strlen(msg));
  HixlEngineDestroy(e);
  return st == HIXL_RESOURCE_EXHAUSTED ? 0 : 14;
}

static void test_memlock(void) {
  int p[2];
  char msg[1024] = "";
  CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
  pid_t pid = fork();
  CU_ASSERT_FATAL(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    _exit(memlock_child(p[1]));
  }
  close(p[1]);
  (void)tu_read_all(p[0], msg, sizeof(msg) - 1); /* up to EOF: msg was zeroed, so it ends in NUL */
  close(p[0]);
  int ws = 0;
  CU_ASSERT_EQUAL(waitpid(pid, &ws, 0), pid);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__,
            "memlock child: %s %d (10-13: setup or small registration failed, 14: big "
            "registration not RESOURCE_EXHAUSTED); message \"%s\"",
            WIFEXITED(ws) ? "exit" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws), msg);
  CU_ASSERT_PTR_NOT_NULL(strstr(msg, "RLIMIT_MEMLOCK"));
  CU_ASSERT_PTR_NOT_NULL(strstr(msg, "ulimit -l"));
  printf("  [%s]\n", msg);
}

/* A target whose locked-memory limit leaves no room for its bounce buffer answers a
 * staged unit sent by RDMA (STAGE_PULL / STAGE_PUSH) RESOURCE_EXHAUSTED; the initiator
 * then sends that unit, and later ones to that peer, over the socket. The target is a
 * child without CAP_IPC_LOCK under a 1 MiB limit, 768 KiB of it registered; the
 * initiator writes and reads back 512 KiB of unregistered memory. */
static void test_stage_rdma_fallback(void) {
  enum { REG = 768u << 10, LEN = 512u << 10 };
  static const HixlOption o = {"Transport", "rdma"};
  tu_server_cfg cfg = {
      .port = tu_free_port(), .mem_len = REG, .seed = 91, .transport = "rdma", .memlock = 1u << 20};
  tu_server_ready info;
  tu_child c;
  char name[TU_ADDR_LEN];
  if (tu_server_start(&c, &cfg, &info, 20000) != 0) {
    tu_fail(__FILE__, __LINE__, "target child: %s", info.error);
    return;
  }
  tu_addr(name, sizeof(name), cfg.port);
  HixlEngine *e = engine_with(tu_ip(), &o, 1);
  uint8_t *src = malloc(LEN), *back = calloc(1, LEN);
  CU_ASSERT_FATAL(e && src && back);
  TU_ASSERT_OK(HixlEngineConnect(e, name, 10000));
  tu_fill(src, LEN, 81);
  HixlTransferOpDesc w = {(uintptr_t)src, info.addr + 4096, LEN};
  HixlTransferOpDesc r = {(uintptr_t)back, info.addr + 4096, LEN};
  TU_ASSERT_OK(HixlEngineTransferSync(e, name, HIXL_WRITE, &w, 1, 20000));
  tu_cmd check = {.op = TU_CMD_CHECK, .seed = 81, .off = 4096, .len = LEN};
  int64_t mismatch = 0;
  CU_ASSERT_EQUAL(tu_child_write(&c, &check, sizeof(check)), 0);
  CU_ASSERT_EQUAL(tu_child_read(&c, &mismatch, sizeof(mismatch), 10000), 0);
  CU_ASSERT_EQUAL(mismatch, -1); /* the target holds what was written, byte for byte */
  TU_ASSERT_OK(HixlEngineTransferSync(e, name, HIXL_READ, &r, 1, 20000));
  TU_ASSERT_PATTERN(back, LEN, 81, "read back through a target short of locked memory");
  HixlEngineDestroy(e);
  CU_ASSERT_EQUAL(tu_child_stop(&c, 10000), 0);
  free(src);
  free(back);
}

/* Traffic class, SL and ack timeout from the environment when no option gives them;
 * the retry count keeps its default (HIXL's: 7). */
static void test_env_qos(void) {
  static const HixlOption rdma = {"Transport", "rdma"};
  char name[TU_ADDR_LEN];
  struct hixl_link_info li;
  setenv("HCCL_RDMA_TC", "8", 1);
  setenv("HCCL_RDMA_SL", "5", 1);
  setenv("HCCL_RDMA_TIMEOUT", "19", 1);
  HixlEngine *s = engine_with(tu_addr(name, sizeof(name), tu_free_port()), &rdma, 1);
  HixlEngine *c = engine_with(tu_ip(), &rdma, 1);
  unsetenv("HCCL_RDMA_TC");
  unsetenv("HCCL_RDMA_SL");
  unsetenv("HCCL_RDMA_TIMEOUT");
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  TU_ASSERT_OK(HixlEngineConnect(c, name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(c, name, &li));
  CU_ASSERT_EQUAL(li.rdma, 1);
  CU_ASSERT_EQUAL(li.tc_queried, 8);
  CU_ASSERT_EQUAL(li.sl_set, 5);
  CU_ASSERT_EQUAL(li.timeout_queried, 19);
  CU_ASSERT_EQUAL(li.retry_queried, 7);
  HixlEngineDestroy(c);
  HixlEngineDestroy(s);
}

/* Transport auto on both sides of one host: shm comes first, though both have RDMA;
 * a target told rdma offers no shm, and auto then takes rdma. */
static void test_auto_order(void) {
  static const HixlOption rdma = {"Transport", "rdma"};
  char name[TU_ADDR_LEN], name2[TU_ADDR_LEN];
  struct hixl_link_info li;
  HixlEngine *s = engine_with(tu_addr(name, sizeof(name), tu_free_port()), NULL, 0);
  HixlEngine *r = engine_with(tu_addr(name2, sizeof(name2), tu_free_port()), &rdma, 1);
  HixlEngine *a = engine_with(tu_ip(), NULL, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  TU_ASSERT_OK(HixlEngineConnect(a, name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(a, name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.rdma, 0);
  TU_ASSERT_OK(HixlEngineConnect(a, name2, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(a, name2, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "rdma");
  HixlEngineDestroy(a);
  HixlEngineDestroy(r);
  HixlEngineDestroy(s);
}

/* A target without RDMA: auto falls back to tcp; Transport rdma refuses clearly. */
static void test_peer_without_rdma(void) {
  static const HixlOption tcp = {"Transport", "tcp"}, rdma = {"Transport", "rdma"};
  char name[TU_ADDR_LEN];
  struct hixl_link_info li;
  HixlEngine *s = engine_with(tu_addr(name, sizeof(name), tu_free_port()), &tcp, 1);
  HixlEngine *a = engine_with(tu_ip(), NULL, 0);
  HixlEngine *r = engine_with(tu_ip(), &rdma, 1);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r);
  TU_ASSERT_OK(HixlEngineConnect(a, name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(a, name, &li));
  CU_ASSERT_EQUAL(li.rdma, 0);
  CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
  TU_ASSERT_STATUS(HixlEngineConnect(r, name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("no usable RDMA device");
  HixlEngineDestroy(r);
  HixlEngineDestroy(a);
  HixlEngineDestroy(s);
}

/* ---- a call behind WRITEs, served once their tag landed (CALL_TAG) ---- */

struct tag_req {
  uint64_t off, len, seed;
};
struct tag_seen {
  int calls, missing;
};

/* The service: whether [off, off + len) of the target's memory holds the seed's
 * pattern at the moment the call is served (progress thread: g.smem is not written
 * by the test meanwhile). */
static HixlStatus tag_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                              size_t cap, size_t *resp_len) {
  struct tag_seen *s = ctx;
  struct tag_req q;
  (void)peer;
  s->calls++;
  if (len != sizeof(q)) return HIXL_PARAM_INVALID;
  memcpy(&q, req, sizeof(q));
  ptrdiff_t at = tu_check_pattern(g.smem + q.off, q.len, q.seed);
  if (at >= 0) s->missing++;
  *resp_len = (size_t)snprintf((char *)resp, cap, at < 0 ? "all there" : "byte %td missing", at);
  return at < 0 ? HIXL_SUCCESS : HIXL_FAILED;
}

/* Eight WRITEs from cli, each with a call behind it, started back to back before any
 * is waited for: 4 KiB in one op, 12 MiB in one op (more than a submitting thread
 * posts itself, so its tag waits behind the progress thread's posts) and 4 MiB in 256
 * ops of 16 KiB, in turn. Every call finds its data there when it is served, each
 * answer comes back, and the bytes are checked; tagged: how many went as CALL_TAG. */
static void tagged_calls(HixlEngine *cli, uint64_t seed0, int tagged) {
  enum { SVC = 2, N = 8, SMALL = 16u << 10 };
  static HixlTransferOpDesc ops[256];
  struct tag_seen seen = {0};
  struct hixl_link_info before, after;
  struct tag_req q[N];
  hixl_call_t call[N];
  uint8_t ans[N][64];
  uint32_t alen[N];
  size_t off = 0;
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, SVC, tag_handler, &seen));
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(cli, g.srv_name, &before));
  for (int i = 0; i < N; i++) {
    size_t len = i % 3 == 0 ? 4096 : i % 3 == 1 ? (12u << 20) : 256 * SMALL, nops = i % 3 == 2 ? 256 : 1;
    q[i] = (struct tag_req){off, len, seed0 + (uint64_t)i};
    tu_fill(g.cmem + off, len, q[i].seed);
    memset(g.smem + off, 0, len);
    for (size_t k = 0; k < nops; k++) { /* the ops backwards: their order is not the memory's */
      size_t at = nops == 1 ? off : off + (nops - 1 - k) * SMALL;
      ops[k] = op(at, at, nops == 1 ? len : SMALL);
    }
    TU_ASSERT_OK_FATAL(hixl_engine_transfer_then_call(cli, g.srv_name, HIXL_WRITE, ops, nops, SVC, &q[i],
                                                      sizeof(q[i]), ans[i], sizeof(ans[i]), &alen[i], 60000,
                                                      &call[i]));
    off += len;
  }
  for (int i = 0; i < N; i++) {
    TU_ASSERT_OK(hixl_engine_call_wait(cli, g.srv_name, call[i]));
    CU_ASSERT(alen[i] == 9 && memcmp(ans[i], "all there", 9) == 0);
    TU_ASSERT_PATTERN(g.smem + q[i].off, q[i].len, q[i].seed, "target memory after a WRITE and its call");
  }
  CU_ASSERT_EQUAL(seen.calls, N);
  CU_ASSERT_EQUAL(seen.missing, 0);
  TU_ASSERT_OK(hixl_engine_link_info(cli, g.srv_name, &after));
  CU_ASSERT_EQUAL(after.tag_calls - before.tag_calls, (uint64_t)tagged);
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, SVC, NULL, NULL));
}

/* The target takes tags: each call rides behind its WRITEs on the QP's tag. */
static void test_call_tag(void) { tagged_calls(g.cli, 300, 8); }

/* A second engine linked to g.srv over rdma, knob (or nothing) set in the environment
 * while it connects; NULL when it cannot be made. */
static HixlEngine *tag_peer(const char *knob) {
  static const HixlOption rdma = {"Transport", "rdma"};
  HixlEngine *c2 = engine_with(tu_ip(), &rdma, 1);
  if (!c2) return NULL;
  if (knob) setenv(knob, "1", 1);
  HixlStatus st = tu_register(c2, g.cmem, MEM) ? HixlEngineConnect(c2, g.srv_name, 5000) : HIXL_FAILED;
  if (knob) unsetenv(knob);
  if (st == HIXL_SUCCESS) return c2;
  HixlEngineDestroy(c2);
  return NULL;
}

/* A target that takes no tags (an older hixl; HIXL_TEST_NO_CALL_TAG in a test build
 * leaves WIRE_CAP_CALL_TAG out of its handshake): the same calls go once their
 * WRITEs' completions are back, none tagged, each finding its data. */
static void test_call_tag_peer_without(void) {
  HixlEngine *c2 = tag_peer("HIXL_TEST_NO_CALL_TAG");
  CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
  tagged_calls(c2, 400, 0);
  HixlEngineDestroy(c2);
}

/* One WRITE of len bytes with a call behind it, from a new peer, with knob set while
 * it is started and waited for: the wait ends FAILED (the reason holding why, unless
 * NULL) at the link's end, well within its 60 s timeout, the handler never run; then
 * the peer links again and a WRITE lands byte for byte. */
static void tag_broken(const char *knob, size_t len, uint64_t seed, const char *why) {
  enum { SVC = 2 };
  struct tag_seen seen = {0};
  struct tag_req q = {0, len, seed};
  uint8_t ans[64];
  uint32_t alen = 0;
  hixl_call_t call;
  HixlEngine *c2 = tag_peer(NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, SVC, tag_handler, &seen));
  tu_fill(g.cmem, q.len, q.seed);
  HixlTransferOpDesc d = op(0, 0, q.len);
  int64_t t0 = tu_now_ms();
  setenv(knob, "1", 1);
  HixlStatus st = hixl_engine_transfer_then_call(c2, g.srv_name, HIXL_WRITE, &d, 1, SVC, &q, sizeof(q), ans,
                                                 sizeof(ans), &alen, 60000, &call);
  if (st == HIXL_SUCCESS) st = hixl_engine_call_wait(c2, g.srv_name, call);
  unsetenv(knob);
  TU_ASSERT_STATUS(st, HIXL_FAILED);
  if (why) TU_ASSERT_ERRMSG_HAS(why);
  CU_ASSERT(tu_now_ms() - t0 < 30000);
  CU_ASSERT_EQUAL(seen.calls, 0);
  TU_ASSERT_OK(HixlEngineConnect(c2, g.srv_name, 5000));
  TU_ASSERT_OK(HixlEngineTransferSync(c2, g.srv_name, HIXL_WRITE, &d, 1, 30000));
  TU_ASSERT_PATTERN(g.smem, q.len, q.seed, "target memory over a new link");
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, SVC, NULL, NULL));
  HixlEngineDestroy(c2);
}

/* A peer whose tag is not the one due (HIXL_TEST_TAG_SKEW, a test build: tag n + 1
 * behind call n): the target closes the link at the tag. */
static void test_call_tag_out_of_order(void) { tag_broken("HIXL_TEST_TAG_SKEW", 1u << 20, 500, NULL); }

/* Chunks of a WRITE with a call behind it dropped before they were posted (as when the
 * deadline passes while they wait for the send queue; HIXL_TEST_TAG_DROP in a test
 * build drops those waiting behind a tag): the link is reset rather than the tag
 * posted, so the call is never served. 12 MiB: a submitting thread posts 4 MiB
 * itself, the rest waits. */
static void test_call_tag_chunk_dropped(void) {
  tag_broken("HIXL_TEST_TAG_DROP", 12u << 20, 600, "lost a chunk before it was posted");
}

/* The CS API over RDMA: endpoints with protocol rdma; data checked byte for byte. */
static void test_cs_over_rdma(void) {
  uint16_t port = tu_free_port();
  EndpointDesc ep = {HIXL_EP_PROTOCOL_RDMA, tu_ip(), NULL}, sep = {HIXL_EP_PROTOCOL_RDMA, peer_ip(), NULL};
  HixlServerDesc sd = {peer_ip(), port, &sep, 1};
  HixlClientDesc cd = {peer_ip(), port, &ep, &sep};
  HixlServerHandle srv;
  HixlClientHandle cli;
  MemHandle sh, ch;
  HcommMem *rm;
  char **tags;
  uint32_t n;
  uint8_t *smem = tu_alloc_mem(8u << 20, false), *cmem = tu_alloc_mem(8u << 20, false);
  CU_ASSERT_FATAL(smem && cmem);
  /* HixlCS* has no QoS field (its configs are reserved): the environment sets it, and
   * tos-on-wire.sh sees this test's packets too. */
  setenv("HCCL_RDMA_TC", "104", 1);
  TU_ASSERT_OK_FATAL(HixlCSServerCreate(&sd, NULL, &srv));
  TU_ASSERT_OK_FATAL(HixlCSServerRegMem(srv, "kv", &(HcommMem){HCCL_MEM_TYPE_HOST, smem, 8u << 20}, &sh));
  TU_ASSERT_OK_FATAL(HixlCSServerListen(srv, 0));
  TU_ASSERT_OK_FATAL(HixlCSClientCreate(&cd, NULL, &cli));
  unsetenv("HCCL_RDMA_TC");
  TU_ASSERT_OK_FATAL(HixlCSClientRegMem(cli, NULL, &(HcommMem){HCCL_MEM_TYPE_HOST, cmem, 8u << 20}, &ch));
  TU_ASSERT_OK_FATAL(HixlCSClientConnect(cli, 5000));
  TU_ASSERT_OK_FATAL(HixlCSClientGetRemoteMem(cli, &rm, &tags, &n, 5000));
  CU_ASSERT_EQUAL_FATAL(n, 1);
  CU_ASSERT_STRING_EQUAL(tags[0], "kv");
  tu_fill(cmem, 4u << 20, 17);
  HixlOneSideOpDesc op = {rm[0].addr, cmem, 4u << 20};
  TU_ASSERT_OK(HixlCSClientBatchPutSync(cli, 1, &op, 30000));
  TU_ASSERT_PATTERN(smem, 4u << 20, 17, "server memory after an rdma put");
  op.local_buf = cmem + (4u << 20);
  CompleteHandle h;
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  TU_ASSERT_OK(HixlCSClientBatchGetAsync(cli, 1, &op, &h));
  int64_t deadline = tu_now_ms() + 30000;
  while (cs == HIXL_COMPLETE_STATUS_WAITING && tu_now_ms() < deadline)
    TU_ASSERT_OK(HixlCSClientQueryCompleteStatus(cli, h, &cs));
  CU_ASSERT_EQUAL(cs, HIXL_COMPLETE_STATUS_COMPLETED);
  TU_ASSERT_PATTERN(cmem + (4u << 20), 4u << 20, 17, "client memory after an rdma get");
  TU_ASSERT_OK(HixlCSClientDestroy(cli));
  TU_ASSERT_OK(HixlCSServerUnregMem(srv, sh));
  TU_ASSERT_OK(HixlCSServerDestroy(srv));
  tu_free_mem(smem, 8u << 20);
  tu_free_mem(cmem, 8u << 20);
}

/* White-box: e's device keeps room on its CQ for `more` QPs besides those on it, and
 * the device allows no more (the CQ does not grow). The entries it had. */
static uint32_t cq_room(HixlEngine *e, uint32_t more, int *max_cqe) {
  struct erdma_engine *x = engine_xe(e, XPORT_RDMA);
  struct rdma_dev *d = &x->dev[0];
  pthread_mutex_lock(&d->cq_lock);
  uint32_t cap = d->cqb.cap;
  d->cqb.cap = d->cqb.held + d->cqb.dead + more * d->qp_cqes;
  *max_cqe = d->max_cqe;
  d->max_cqe = (int)d->cqb.cap;
  pthread_mutex_unlock(&d->cq_lock);
  return cap;
}

static void cq_cap_set(HixlEngine *e, uint32_t cap, int max_cqe) {
  struct rdma_dev *d = &((struct erdma_engine *)engine_xe(e, XPORT_RDMA))->dev[0];
  pthread_mutex_lock(&d->cq_lock);
  d->cqb.cap = cap;
  d->max_cqe = max_cqe;
  pthread_mutex_unlock(&d->cq_lock);
}

/* A device's CQ starts at RDMA_CQ_FIRST entries (7 QPs; what the provider rounds it to)
 * and grows as QPs come, up to the device's max_cqe: two links more than it held at
 * first, from one engine, each moving bytes. */
static void test_cq_grows(void) {
  static const HixlOption rdma = {"Transport", "rdma"};
  enum { NMAX = 32 };
  char names[NMAX][TU_ADDR_LEN];
  HixlEngine *t[NMAX], *c = engine_with(tu_ip(), &rdma, 1);
  uint8_t *tmem[NMAX], *cmem = tu_alloc_mem(4096, false);
  CU_ASSERT_FATAL(c && cmem && tu_register(c, cmem, 4096));
  struct rdma_dev *d = &((struct erdma_engine *)engine_xe(c, XPORT_RDMA))->dev[0];
  pthread_mutex_lock(&d->cq_lock);
  uint32_t first = d->cqb.cap, N = first / d->qp_cqes + 2;
  pthread_mutex_unlock(&d->cq_lock);
  CU_ASSERT_FATAL(N <= NMAX && (uint64_t)N * d->qp_cqes <= (uint64_t)d->max_cqe);
  for (uint32_t i = 0; i < N; i++) {
    snprintf(names[i], sizeof(names[i]), "%s:%u", tu_ip(), (unsigned)tu_free_port());
    t[i] = engine_with(names[i], &rdma, 1);
    tmem[i] = tu_alloc_mem(4096, false);
    CU_ASSERT_FATAL(t[i] && tmem[i] && tu_register(t[i], tmem[i], 4096));
    TU_ASSERT_OK_FATAL(HixlEngineConnect(c, names[i], 5000));
    tu_fill(cmem, 4096, 50 + (uint64_t)i);
    HixlTransferOpDesc op = {(uintptr_t)cmem, (uintptr_t)tmem[i], 4096};
    TU_ASSERT_OK(HixlEngineTransferSync(c, names[i], HIXL_WRITE, &op, 1, 10000));
    TU_ASSERT_PATTERN(tmem[i], 4096, 50 + (uint64_t)i, "a link's WRITE, its QP on the grown CQ");
  }
  pthread_mutex_lock(&d->cq_lock);
  CU_ASSERT_TRUE(d->cqb.cap > first && d->cqb.held >= N * d->qp_cqes && d->cqb.held <= d->cqb.cap);
  pthread_mutex_unlock(&d->cq_lock);
  HixlEngineDestroy(c);
  for (uint32_t i = 0; i < N; i++) {
    HixlEngineDestroy(t[i]);
    tu_free_mem(tmem[i], 4096);
  }
  tu_free_mem(cmem, 4096);
}

/* Every QP on a device's CQ holds room there for all it can hold (a QP in error
 * completes each WR it holds: four of 1,024 WRs failing together overran the 4,096
 * entries before, and requests waited for their deadlines). Where the CQ has room for
 * one more QP (cut to it here): one link is made, the next is refused by name, at the
 * initiator and at the target alike, and none overruns; a link gone gives its room
 * back (once the CQ is found empty), and a new link moves data. */
static void test_cq_room(void) {
  static const HixlOption rdma = {"Transport", "rdma"};
  char a_name[TU_ADDR_LEN], b_name[TU_ADDR_LEN];
  snprintf(a_name, sizeof(a_name), "%s:%u", tu_ip(), (unsigned)tu_free_port());
  snprintf(b_name, sizeof(b_name), "%s:%u", tu_ip(), (unsigned)tu_free_port());
  HixlEngine *a = engine_with(a_name, &rdma, 1), *b = engine_with(b_name, &rdma, 1),
             *c = engine_with(tu_ip(), &rdma, 1);
  uint8_t *bmem = tu_alloc_mem(1u << 20, false), *cmem = tu_alloc_mem(1u << 20, false);
  CU_ASSERT_FATAL(a && b && c && bmem && cmem);
  CU_ASSERT_PTR_NOT_NULL_FATAL(tu_register(b, bmem, 1u << 20));
  CU_ASSERT_PTR_NOT_NULL_FATAL(tu_register(c, cmem, 1u << 20));
  int max_cqe;
  uint32_t cap = cq_room(c, 1, &max_cqe);
  TU_ASSERT_OK(HixlEngineConnect(c, a_name, 5000));
  TU_ASSERT_STATUS(HixlEngineConnect(c, b_name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("no room for another QP on its completion queue");
  /* The link to a goes: its QP's room is back once c's progress thread finds the CQ empty. */
  TU_ASSERT_OK(HixlEngineDisconnect(c, a_name, 5000));
  HixlStatus st = HIXL_FAILED;
  for (int64_t end = tu_now_ms() + 5000; st != HIXL_SUCCESS && tu_now_ms() < end;)
    st = HixlEngineConnect(c, b_name, 5000);
  TU_ASSERT_STATUS(st, HIXL_SUCCESS);
  struct hixl_link_info info;
  TU_ASSERT_OK(hixl_engine_link_info(c, b_name, &info));
  CU_ASSERT_EQUAL(info.rdma, 1);
  tu_fill(cmem, 4096, 31);
  HixlTransferOpDesc d = {(uintptr_t)cmem, (uintptr_t)bmem, 4096};
  TU_ASSERT_OK(HixlEngineTransferSync(c, b_name, HIXL_WRITE, &d, 1, 10000));
  TU_ASSERT_PATTERN(bmem, 4096, 31, "target after a WRITE on the link made once room came back");
  cq_cap_set(c, cap, max_cqe);
  /* The target: b's CQ, with c's link on it, has no room for a's. */
  cap = cq_room(b, 0, &max_cqe);
  TU_ASSERT_STATUS(HixlEngineConnect(a, b_name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("could not connect its QP");
  cq_cap_set(b, cap, max_cqe);
  TU_ASSERT_OK(HixlEngineConnect(a, b_name, 5000));
  HixlEngineDestroy(c);
  HixlEngineDestroy(a);
  HixlEngineDestroy(b);
  tu_free_mem(bmem, 1u << 20);
  tu_free_mem(cmem, 1u << 20);
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;
  /* Two engines of this one process link over shm only when authenticated (a pid that
   * is this process's own is proven by the socket's binding, docs/security.md): every
   * engine here, children included, holds a key. */
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;
  bool required = getenv("HIXL_REQUIRE_RDMA") != NULL;
  if (!rdma_available() || !getenv("HIXL_TEST_IP")) {
    fprintf(stderr, "test_rdma: %s\n",
            !rdma_available() ? "no RDMA device on this host" : "HIXL_TEST_IP does not name an RDMA address");
    return required ? 1 : 77; /* skipped here; run for real in the soft-RoCE guest */
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  if (getenv("HIXL_TEST_NETEM_DEV")) { /* across tos-on-wire.sh's veth: that test alone */
    CU_pSuite v = CU_add_suite("rdma pair across a veth", pair_init, pair_cleanup);
    CU_add_test(v, "timeout with WRs posted resets the QP; Connect again", test_timeout_resets_qp);
    return tu_run_registry();
  }
  CU_pSuite s = CU_add_suite("rdma pair", pair_init, pair_cleanup);
  CU_add_test(s, "rdma link; TC and SL on the QP", test_rdma_link_with_qos);
  CU_add_test(s, "WRITE then READ back, 1 B to 64 MiB", test_sizes);
  CU_add_test(s, "4096 scattered ops (more than a send queue)", test_big_batch);
  CU_add_test(s, "16 async requests in flight", test_async_window);
  CU_add_test(s, "outside the registration: FAILED, untouched", test_out_of_range);
  CU_add_test(s, "registered after Connect; deregistered", test_register_after_connect);
  CU_add_test(s, "8 WRITEs, a call behind each: served at their tag, data there", test_call_tag);
  CU_add_test(s, "a target without tags: the calls follow the completions", test_call_tag_peer_without);
  CU_add_test(s, "a tag out of order: link closed, call FAILED, a new link works",
              test_call_tag_out_of_order);
  CU_add_test(s, "a tagged WRITE's chunk dropped unposted: link reset, call FAILED unserved",
              test_call_tag_chunk_dropped);
  CU_pSuite o = CU_add_suite("rdma options and peers", NULL, NULL);
  CU_add_test(o, "HCCL_RDMA_TC / HCCL_RDMA_SL on the QP", test_env_qos);
  CU_add_test(o, "auto: shm on one host first, then rdma", test_auto_order);
  CU_add_test(o, "peer without RDMA: auto -> tcp, rdma -> FAILED", test_peer_without_rdma);
  CU_add_test(o, "HixlCS* with rdma endpoints", test_cs_over_rdma);
  CU_add_test(o, "a device's CQ full: a new QP refused by name; room back once a link goes", test_cq_room);
  CU_add_test(o, "a device's CQ grows as QPs come: two links more than it held at first, each moving bytes",
              test_cq_grows);
  CU_add_test(o, "locked-memory limit: clear RESOURCE_EXHAUSTED", test_memlock);
  CU_add_test(o, "target short of locked memory: staged units fall back to the socket",
              test_stage_rdma_fallback);
  return tu_run_registry();
}
