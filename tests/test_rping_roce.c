/* RPing in mode ROCE on a real verbs device (soft-RoCE in the project's QEMU guest):
 * probes are UD SENDs whose address handles carry each target's traffic class and
 * service level, answered by a responder context in another process on the same
 * device (rxe loopback queue pairs). Every probe answered, with the traffic class the
 * responder read from the probe's GRH echoed back and seen again on the answer's GRH;
 * a tight bufferSize; AddTarget against a target that never ran Init, or runs mode
 * UDP; a stopped and a removed responder (probes lost, the batch ends on time);
 * Deinit with a batch running, Deinit twice.
 *
 * Skips (77) where no RDMA device exists; with HIXL_REQUIRE_RDMA=1 (the guest run) a
 * missing device is a failure. HIXL_TEST_IP must be an address of the RDMA device
 * (the guest sets 10.77.0.1). */
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "hixl/hixl.h"
#include "transport/rdma/rdma.h"
#include "rping/rping_int.h"
#include "test_util.h"

#define CHILD_FLAG "--rping-roce-responder"
#define TC         104 /* DSCP 26, as the tos-on-wire check of test_rdma */
#define SL         3
#define BUF_BIG    (4096u * 1024u)

static char self_exe[4096];

/* ---------------------------------------------------------------- helpers */

/* A UDP port free on ip right now; 0 on error. */
static uint16_t free_udp_port(const char *ip) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;

  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static HccnRpingInitAttr attr_of(HccnRpingMode mode, uint16_t port, uint32_t buffer_size) {
  HccnRpingInitAttr a = {.mode = mode,
                         .port = port,
                         .npuNum = 16,
                         .bufferSize = buffer_size,
                         .sl = SL,
                         .tc = TC,
                         .ipAddr = NULL};
  return a;
}

/* A ROCE context on the RDMA address (its responder on a free port); NULL on failure. */
static HccnRpingCtx roce_ctx(uint32_t buffer_size) {
  HccnRpingCtx c = NULL;
  HccnRpingInitAttr a = attr_of(HCCN_RPING_MODE_ROCE, free_udp_port(tu_ip()), buffer_size);
  HccnResult r = HccnRpingInit(tu_ip(), &a, &c);
  if (r != HCCN_SUCCESS) {
    fprintf(stderr, "roce_ctx %s: %s: %s\n", tu_ip(), HccnResultName(r), HixlGetLastErrorMessage());
    return NULL;
  }
  return c;
}

static HccnRpingTargetInfo tgt(const char *ip, uint16_t port, uint32_t tc, uint32_t sl) {
  HccnRpingTargetInfo t;
  memset(&t, 0, sizeof(t));
  t.dstIp = (char *)ip;
  t.port = port;
  t.tc = tc;
  t.sl = sl;
  return t;
}

/* Poll GetResult until it is not HCCN_E_AGAIN or timeout_ms. */
static HccnResult wait_results(HccnRpingCtx c, HccnRpingTargetInfo *t, HccnRpingResultInfo *res,
                               int timeout_ms) {
  int64_t deadline = tu_now_ms() + timeout_ms;
  struct timespec pause = {0, 1000000};
  HccnResult r;
  while ((r = HccnRpingGetResult(c, 1, t, res)) == HCCN_E_AGAIN && tu_now_ms() < deadline)
    nanosleep(&pause, NULL);
  return r;
}

static void check_all_answered(const HccnRpingResultInfo *r, uint32_t pkts, uint32_t timeout_ms,
                               const char *what) {
  if (r->state != HCCN_RPING_RESULT_STATE_VALID || r->txPkt != pkts || r->rxPkt != pkts || r->minRTT == 0 ||
      r->minRTT > r->avgRTT || r->avgRTT > r->maxRTT || r->maxRTT > timeout_ms * 1000u)
    tu_fail(__FILE__, __LINE__,
            "%s: state %d tx %u rx %u min/avg/max %u/%u/%u us (want %u answered, RTT > 0)", what,
            (int)r->state, r->txPkt, r->rxPkt, r->minRTT, r->avgRTT, r->maxRTT, pkts);
  else
    CU_PASS(what);
  printf("    %s: %u/%u answered, RTT min/avg/max %u/%u/%u us\n", what, r->rxPkt, r->txPkt, r->minRTT,
         r->avgRTT, r->maxRTT);
}

/* The traffic class both ways: the AH was made with tc/sl; the responder read tc from
 * each probe's GRH (echoed in the answer's tos) and answered with it (the answer's GRH). */
static void check_qos(HccnRpingCtx c, const char *ip, uint8_t tc, uint8_t sl, uint32_t answers) {
  struct rp_qos_seen q;
  ASSERT_HCCN(rp_debug_qos(c, ip, &q), HCCN_SUCCESS);
  CU_ASSERT(q.roce);
  CU_ASSERT_EQUAL(q.set_tc, tc);
  CU_ASSERT_EQUAL(q.set_sl, sl);
  CU_ASSERT_EQUAL(q.rx, answers);
  if (q.echo_tc != tc || q.echo_bad != 0 || q.here_tc != tc || q.here_bad != 0)
    tu_fail(__FILE__, __LINE__,
            "traffic class %u: the responder saw %u (%u answers otherwise), the answers came with %u (%u "
            "otherwise)",
            tc, q.echo_tc, q.echo_bad, q.here_tc, q.here_bad);
  else
    CU_PASS("traffic class read back both ways");
  printf("    AH tc %u sl %u; responder read tc %u from the probes' GRH; answers arrived with tc %u\n",
         q.set_tc, q.set_sl, q.echo_tc, q.here_tc);
}

/* ---------------------------------------------------------------- the responder process
 * This program re-executed with CHILD_FLAG MODE PORT: a context on tu_ip() (so both
 * processes share the one RDMA device) that reports its Init result on fd 3 and then
 * obeys one-byte commands on fd 4: 'D' Deinit, 'I' Init again (each answered with the
 * HccnResult); EOF: Deinit and exit. */

struct child_ready {
  uint32_t result; /* HccnResult */
  char error[200];
};

static int child_main(char **argv) {
  HccnRpingMode mode = strcmp(argv[2], "roce") == 0 ? HCCN_RPING_MODE_ROCE : HCCN_RPING_MODE_UDP;
  HccnRpingInitAttr a = attr_of(mode, (uint16_t)strtoul(argv[3], NULL, 10), 4096);
  HccnRpingCtx c = NULL;
  struct child_ready ready = {0};
  bool live;
  char cmd;

  ready.result = HccnRpingInit(tu_ip(), &a, &c);
  live = ready.result == HCCN_SUCCESS;
  snprintf(ready.error, sizeof(ready.error), "%s", live ? "" : HixlGetLastErrorMessage());
  if (tu_write_all(3, &ready, sizeof(ready)) != 0 || !live) return live ? 1 : 2;
  while (tu_read_all(4, &cmd, 1) == 0) {
    uint32_t r = HCCN_E_PARA;
    if (cmd == 'D') r = HccnRpingDeinit(c);
    if (cmd == 'I') r = HccnRpingInit(tu_ip(), &a, &c);
    if (cmd == 'D' && r == HCCN_SUCCESS) live = false;
    if (cmd == 'I' && r == HCCN_SUCCESS) live = true;
    if (tu_write_all(3, &r, sizeof(r)) != 0) break;
  }
  if (live && HccnRpingDeinit(c) != HCCN_SUCCESS) return 3;
  return 0;
}

struct child_args {
  char *argv[5];
  char port[16];
};

/* fork() body: exec this program as a responder (nothing inherited but fds 0-4). */
static int child_exec(void *arg, int ready_fd, int ctl_fd) {
  struct child_args *ca = arg;
  (void)ready_fd;
  (void)ctl_fd; /* already at 3 and 4 */
  execv(self_exe, ca->argv);
  return 127;
}

/* Start a responder process in mode ("roce"/"udp") on tu_ip():port. */
static int responder_start(tu_child *child, const char *mode, uint16_t port) {
  static struct child_args ca;
  struct child_ready ready;

  snprintf(ca.port, sizeof(ca.port), "%u", (unsigned)port);
  ca.argv[0] = self_exe;
  ca.argv[1] = CHILD_FLAG;
  ca.argv[2] = (char *)mode;
  ca.argv[3] = ca.port;
  ca.argv[4] = NULL;
  if (tu_child_start(child, child_exec, &ca) != 0) return -1;
  if (tu_child_read(child, &ready, sizeof(ready), 60000) != 0 || ready.result != HCCN_SUCCESS) {
    fprintf(stderr, "responder %s on %s:%u did not start: %s\n", mode, tu_ip(), (unsigned)port,
            ready.result != HCCN_SUCCESS ? ready.error : "no answer");
    tu_child_wait(child, 10000);
    return -1;
  }
  return 0;
}

static HccnResult responder_cmd(tu_child *child, char cmd) {
  uint32_t r = HCCN_E_FAIL;
  if (tu_child_write(child, &cmd, 1) != 0 || tu_child_read(child, &r, sizeof(r), 60000) != 0)
    return HCCN_E_FAIL;
  return (HccnResult)r;
}

static struct {
  tu_child child;
  uint16_t port;
} g;

static int suite_init(void) {
  g.port = free_udp_port(tu_ip());
  return responder_start(&g.child, "roce", g.port) == 0 ? 0 : 1;
}

static int suite_cleanup(void) { return tu_child_stop(&g.child, 30000) == 0 ? 0 : 1; }

/* ---------------------------------------------------------------- tests */

static void test_init_rules(void) {
  HccnRpingCtx c = roce_ctx(BUF_BIG), c2 = NULL, sentinel = (HccnRpingCtx)(uintptr_t)0x5eed;
  HccnRpingInitAttr a = attr_of(HCCN_RPING_MODE_ROCE, free_udp_port(tu_ip()), BUF_BIG);
  HccnRpingTargetInfo t = tgt(tu_ip(), g.port, TC, SL);
  HccnRpingResultInfo res;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN(HccnRpingInit(tu_ip(), &a, &c2), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("one HccnRpingInit per device");
  /* Loopback is no RDMA device: refused, and the reason says so. */
  c2 = sentinel;
  a.port = free_udp_port("127.0.0.1");
  ASSERT_HCCN(HccnRpingInit("127.0.0.1", &a, &c2), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("no RDMA device owns 127.0.0.1");
  CU_ASSERT_PTR_EQUAL(c2, sentinel);
  /* Deinit twice, and calls on the closed context, are errors, not crashes. */
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("not a live context");
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 10), HCCN_E_PARA);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, &res), HCCN_E_PARA);
  /* The device is free again. */
  c = roce_ctx(BUF_BIG);
  CU_ASSERT_PTR_NOT_NULL(c);
  if (c) ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* Every probe answered over RDMA, with tc and sl on the AH and the tc read back on
 * both GRHs; then again with another tc and a payload, after RemoveTarget / AddTarget. */
static void test_probes_answered(void) {
  HccnRpingCtx c = roce_ctx(BUF_BIG);
  HccnRpingTargetInfo t = tgt(tu_ip(), g.port, TC, SL);
  HccnRpingResultInfo res;
  HccnResult r;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 50, 2, 2000), HCCN_SUCCESS);
  r = HccnRpingGetResult(c, 1, &t, &res);
  CU_ASSERT(r == HCCN_E_AGAIN || r == HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, 50, 2000, "50 probes, tc 104, sl 3");
  check_qos(c, tu_ip(), TC, SL, 50);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 10), HCCN_E_FAIL); /* still active until Stop */
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);

  /* DSCP 46 (tc 184), sl 5, 200 bytes of payload echoed. */
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_SUCCESS);
  t = tgt(tu_ip(), g.port, 184, 5);
  t.payloadLen = 200;
  for (uint32_t i = 0; i < t.payloadLen; i++) t.payload[i] = (char)(i * 7);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 30, 0, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, 30, 2000, "30 probes, tc 184, sl 5, 200-byte payload");
  check_qos(c, tu_ip(), 184, 5, 30);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* bufferSize just above pktNum x 2048: the batch gets one send slot and waits for
 * each send to complete before the next; every probe is still answered. */
static void test_tight_buffer(void) {
  const uint32_t pkts = 21;
  uint32_t size =
      (pkts * HCCN_RPING_BUFFER_PER_PACKET / HCCN_RPING_BUFFER_ALIGN + 1) * HCCN_RPING_BUFFER_ALIGN;
  HccnRpingCtx c = roce_ctx(size);
  HccnRpingTargetInfo t = tgt(tu_ip(), g.port, TC, SL);
  HccnRpingResultInfo res;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, pkts + 1, 0, 2000), HCCN_E_PARA); /* the rule still holds */
  ASSERT_HCCN(HccnRpingBatchPingStart(c, pkts, 0, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, pkts, 2000, "bufferSize for 21 probes, sent back to back");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS); /* with the batch still active */
}

/* A target that never ran Init: AddTarget waits HIXL_RPING_ADD_TIMEOUT_MS, then fails. */
static void test_add_times_out(void) {
  HccnRpingCtx c;
  HccnRpingTargetInfo t = tgt(tu_ip(), free_udp_port(tu_ip()), TC, SL);
  int64_t t0, ms;

  setenv("HIXL_RPING_ADD_TIMEOUT_MS", "300", 1);
  c = roce_ctx(BUF_BIG);
  unsetenv("HIXL_RPING_ADD_TIMEOUT_MS");
  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  t0 = tu_now_ms();
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_E_FAIL);
  ms = tu_now_ms() - t0;
  TU_ASSERT_ERRMSG_HAS("did not answer as RoCE responders within 300 ms");
  if (ms < 290 || ms > 5000)
    tu_fail(__FILE__, __LINE__, "AddTarget took %lld ms, want about 300", (long long)ms);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1, 0, 10), HCCN_E_FAIL); /* nothing was added */
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* A responder in mode UDP answers the handshake without a RoCE endpoint: refused by
 * name. A payload larger than the port's MTU allows is refused before any handshake. */
static void test_add_refusals(void) {
  HccnRpingCtx c = roce_ctx(BUF_BIG);
  uint16_t uport = free_udp_port("127.0.0.1");
  HccnRpingInitAttr ua = attr_of(HCCN_RPING_MODE_UDP, uport, BUF_BIG);
  HccnRpingCtx u = NULL;
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 3000};
  HccnRpingTargetInfo t = tgt("127.0.0.1", uport, TC, SL), big = tgt(tu_ip(), g.port, TC, SL);

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingInit("127.0.0.1", &ua, &u), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &t, &cfg), HCCN_E_FAIL);
  TU_ASSERT_ERRMSG_HAS("in mode UDP");
  big.payloadLen = HCCN_RPING_PAYLOAD_LEN_MAX; /* rxe on a 1500-byte link: MTU 1024 */
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &big), HCCN_E_PARA);
  TU_ASSERT_ERRMSG_HAS("a RoCE probe carries");
  ASSERT_HCCN(HccnRpingDeinit(u), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* A stopped responder process answers nothing: every probe lost, the batch ends within
 * (pktNum - 1) x interval + timeout. A removed one (Deinit: its QP is gone) likewise;
 * once it runs again, RemoveTarget / AddTarget learn its new QP and probes get through. */
static void test_dead_responder(void) {
  HccnRpingCtx c = roce_ctx(BUF_BIG);
  HccnRpingTargetInfo t = tgt(tu_ip(), g.port, TC, SL);
  HccnRpingResultInfo res;
  int64_t t0, ms;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);

  tu_child_kill(&g.child, SIGSTOP);
  CU_ASSERT_FATAL(tu_child_wait_stopped(&g.child, 10000) == 0);
  t0 = tu_now_ms();
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 20, 250), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  ms = tu_now_ms() - t0;
  tu_child_kill(&g.child, SIGCONT);
  if (res.state != HCCN_RPING_RESULT_STATE_VALID || res.txPkt != 5 || res.rxPkt != 0 || ms < 330 || ms > 3330)
    tu_fail(__FILE__, __LINE__, "stopped responder: state %d tx %u rx %u after %lld ms (want 5, 0, 330 ms)",
            (int)res.state, res.txPkt, res.rxPkt, (long long)ms);
  else
    CU_PASS("stopped responder: 5 sent, 5 lost, on time");
  printf("    stopped responder: %u sent, %u answered, batch over after %lld ms\n", res.txPkt, res.rxPkt,
         (long long)ms);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  /* Running again: the probes it queued while stopped belong to the old batch. */
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 10, 1, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, 10, 2000, "after SIGCONT");
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);

  ASSERT_HCCN_FATAL(responder_cmd(&g.child, 'D'), HCCN_SUCCESS);
  t0 = tu_now_ms();
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 4, 10, 200), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  ms = tu_now_ms() - t0;
  if (res.state != HCCN_RPING_RESULT_STATE_VALID || res.txPkt != 4 || res.rxPkt != 0 || ms < 230 || ms > 3230)
    tu_fail(__FILE__, __LINE__, "removed responder: state %d tx %u rx %u after %lld ms (want 4, 0, 230 ms)",
            (int)res.state, res.txPkt, res.rxPkt, (long long)ms);
  else
    CU_PASS("removed responder: 4 sent, 4 lost, on time");
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);

  ASSERT_HCCN_FATAL(responder_cmd(&g.child, 'I'), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingRemoveTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 10, 1, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, 10, 2000, "the responder back, target added again");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* Stop a running batch and start the next at once; Deinit with a batch running. */
static void test_stop_and_deinit_while_running(void) {
  HccnRpingCtx c = roce_ctx(BUF_BIG);
  HccnRpingTargetInfo t = tgt(tu_ip(), g.port, TC, SL);
  HccnRpingResultInfo res;
  int64_t t0;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1000, 10, 1000), HCCN_SUCCESS);
  usleep(50000);
  ASSERT_HCCN(HccnRpingGetResult(c, 1, &t, &res), HCCN_E_AGAIN);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 0, 2000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  check_all_answered(&res, 5, 2000, "the batch after a stopped one");
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 1000, 10, 1000), HCCN_SUCCESS);
  usleep(50000);
  t0 = tu_now_ms();
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
  CU_ASSERT(tu_now_ms() - t0 < 5000);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_E_PARA);
}

int main(int argc, char **argv) {
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
  self_exe[n > 0 ? n : 0] = '\0';
  if (argc == 4 && strcmp(argv[1], CHILD_FLAG) == 0) return child_main(argv);

  bool required = getenv("HIXL_REQUIRE_RDMA") != NULL;
  if (!rdma_available() || !getenv("HIXL_TEST_IP")) {
    fprintf(stderr, "test_rping_roce: %s\n",
            !rdma_available() ? "no RDMA device on this host" : "HIXL_TEST_IP does not name an RDMA address");
    return required ? 1 : 77; /* skipped here; run for real in the soft-RoCE guest */
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("rping over RoCE, responder in another process", suite_init, suite_cleanup);
  CU_add_test(s, "Init, one per device, no device, Deinit twice", test_init_rules);
  CU_add_test(s, "every probe answered; tc and sl both ways", test_probes_answered);
  CU_add_test(s, "tight bufferSize: one send slot", test_tight_buffer);
  CU_add_test(s, "a target that never ran Init: AddTarget times out", test_add_times_out);
  CU_add_test(s, "a UDP responder; a payload over the MTU", test_add_refusals);
  CU_add_test(s, "stopped and removed responder: lost, on time", test_dead_responder);
  CU_add_test(s, "Stop then Start; Deinit with a batch running", test_stop_and_deinit_while_running);
  return tu_run_registry();
}
