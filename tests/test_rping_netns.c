/* RPing between two network namespaces this test creates, joined by a veth pair
 * (10.200.0.1 in A, 10.200.0.2 in B, nothing in the host's namespace). The responder
 * runs in a child process that joined B; this process joins A and probes it.
 * Built twice:
 *   test_rping_netns  the plain link: every probe answered, a NIC name as the device,
 *                     a host that does not exist, a link that is down;
 *   test_rping_netem  (RPING_NETEM) the link with netem delay 20ms loss 10%: measured
 *                     RTT and loss within tolerance of what netem imposes.
 * Exits 77 (skipped) and says why when namespaces, veth or netem are not available.
 * The namespaces are removed on every exit: by this process, by a janitor child that
 * outlives it when it is killed, and by a sweep of stale ones at the next start. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "hixl/hixl.h"
#include "test_util.h"

#define NS_PREFIX "hixlrp"
#define IP_A      "10.200.0.1"
#define IP_B      "10.200.0.2"
#define IP_NONE   "10.200.0.3"
#define MAC_A     "02:68:78:6c:00:01"
#define MAC_B     "02:68:78:6c:00:02"
#define PORT_A    13886
#define PORT_B    13887

static char ns_a[32], ns_b[32];
static int host_ns = -1; /* this process's original network namespace */
static tu_child responder;

/* ---------------------------------------------------------------- helpers */

/* Run a shell command; its output (stdout and stderr, trimmed) goes to out.
 * Returns the exit status, or -1 when it could not run. */
static int run(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t outlen, const char *fmt, ...) {
  char cmd[512], line[256];
  size_t used = 0;
  va_list ap;
  FILE *p;
  int st;

  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd) - 8, fmt, ap);
  va_end(ap);
  strcat(cmd, " 2>&1");
  if (out && outlen) out[0] = '\0';
  fflush(NULL);
  p = popen(cmd, "r");
  if (!p) return -1;
  while (fgets(line, sizeof(line), p)) {
    size_t n = strlen(line);
    if (out && used + n < outlen) {
      memcpy(out + used, line, n + 1);
      used += n;
    }
  }
  st = pclose(p);
  while (out && used > 0 && (out[used - 1] == '\n' || out[used - 1] == ' ')) out[--used] = '\0';
  return st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ns_delete(const char *name) {
  char path[64];
  snprintf(path, sizeof(path), "/run/netns/%s", name);
  if (access(path, F_OK) == 0) run(NULL, 0, "ip netns del %s", name);
}

static void ns_cleanup(void) {
  if (host_ns >= 0) setns(host_ns, CLONE_NEWNET);
  ns_delete(ns_a);
  ns_delete(ns_b);
}

/* Remove namespaces left by runs of this test that were killed. */
static void sweep_stale(void) {
  DIR *d = opendir("/run/netns");
  struct dirent *e;

  if (!d) return;
  while ((e = readdir(d))) {
    char *end;
    long pid;
    if (strncmp(e->d_name, NS_PREFIX, strlen(NS_PREFIX)) != 0) continue;
    pid = strtol(e->d_name + strlen(NS_PREFIX), &end, 10);
    if (pid <= 0 || (*end != 'a' && *end != 'b') || end[1] != '\0') continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    fprintf(stderr, "removing stale namespace %s\n", e->d_name);
    ns_delete(e->d_name);
  }
  closedir(d);
}

/* A child that deletes the namespaces when this process is gone, however it ends:
 * it waits for EOF on a pipe whose only write end this process holds. */
static void start_janitor(void) {
  int fds[2];
  pid_t pid;
  char byte;

  if (pipe2(fds, O_CLOEXEC) != 0) return;
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    close(fds[1]);
    if (null >= 0) { /* do not hold the test runner's output pipes open */
      dup2(null, 1);
      dup2(null, 2);
      close(null);
    }
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    setsid();
    while (read(fds[0], &byte, 1) < 0 && errno == EINTR) continue;
    ns_delete(ns_a);
    ns_delete(ns_b);
    _exit(0);
  }
  close(fds[0]);
  /* fds[1] stays open (close-on-exec) until this process ends. */
}

static void skip(const char *why, const char *detail) {
  printf("SKIP: %s%s%s\n", why, detail && *detail ? ": " : "", detail ? detail : "");
  ns_cleanup();
  exit(77);
}

static int enter_ns(const char *name) {
  char path[64];
  int fd, rc;
  snprintf(path, sizeof(path), "/run/netns/%s", name);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}

/* Namespaces A and B, the veth pair, addresses, static neighbours (so that no ARP
 * packet meets netem's loss), and netem when asked. Skips when something is missing. */
static void setup_network(bool netem) {
  char out[512];

  if (geteuid() != 0) skip("network namespaces need root", NULL);
  snprintf(ns_a, sizeof(ns_a), NS_PREFIX "%da", (int)getpid());
  snprintf(ns_b, sizeof(ns_b), NS_PREFIX "%db", (int)getpid());
  sweep_stale();
  start_janitor();
  if (run(out, sizeof(out), "ip netns add %s", ns_a) != 0) skip("cannot create a network namespace", out);
  if (run(out, sizeof(out), "ip netns add %s", ns_b) != 0) skip("cannot create a network namespace", out);
  if (run(out, sizeof(out),
          "ip -n %s link add vA address " MAC_A " type veth peer name vB address " MAC_B " netns %s", ns_a,
          ns_b) != 0)
    skip("cannot create a veth pair between namespaces", out);
  if (run(out, sizeof(out),
          "ip -n %s addr add " IP_A "/24 dev vA && ip -n %s link set lo up && ip -n %s link set vA up && "
          "ip -n %s addr add " IP_B "/24 dev vB && ip -n %s link set lo up && ip -n %s link set vB up && "
          "ip -n %s neigh replace " IP_B " lladdr " MAC_B " dev vA nud permanent && "
          "ip -n %s neigh replace " IP_A " lladdr " MAC_A " dev vB nud permanent",
          ns_a, ns_a, ns_a, ns_b, ns_b, ns_b, ns_a, ns_b) != 0) {
    printf("network setup failed: %s\n", out);
    ns_cleanup();
    exit(1);
  }
  if (netem && run(out, sizeof(out), "ip netns exec %s tc qdisc add dev vA root netem delay 20ms loss 10%%",
                   ns_a) != 0)
    skip("tc netem is not available on this host (kernel module sch_netem missing?)", out);
}

static int responder_child(void *arg, int ready_fd, int ctl_fd) {
  HccnRpingInitAttr a = {.mode = HCCN_RPING_MODE_UDP,
                         .port = PORT_B,
                         .npuNum = 4,
                         .bufferSize = 4096 * 1024,
                         .sl = 4,
                         .tc = 132};
  HccnRpingCtx c = NULL;
  HccnResult r = HCCN_E_FAIL;
  char byte;

  (void)arg;
  if (enter_ns(ns_b) == 0) r = HccnRpingInit("vB", &a, &c);
  if (write(ready_fd, &r, sizeof(r)) != sizeof(r)) return 2;
  if (r != HCCN_SUCCESS) {
    fprintf(stderr, "responder in %s: %s: %s\n", ns_b, HccnResultName(r), HixlGetLastErrorMessage());
    return 1;
  }
  while (read(ctl_fd, &byte, 1) > 0) continue;
  return HccnRpingDeinit(c) == HCCN_SUCCESS ? 0 : 1;
}

static HccnRpingCtx client_ctx(void) {
  HccnRpingInitAttr a = {.mode = HCCN_RPING_MODE_UDP,
                         .port = PORT_A,
                         .npuNum = 4,
                         .bufferSize = 4096 * 1024,
                         .sl = 4,
                         .tc = 132};
  HccnRpingCtx c = NULL;
  HccnResult r = HccnRpingInit("vA", &a, &c); /* a NIC name: resolved to 10.200.0.1 */
  if (r != HCCN_SUCCESS) fprintf(stderr, "client: %s: %s\n", HccnResultName(r), HixlGetLastErrorMessage());
  return r == HCCN_SUCCESS ? c : NULL;
}

static HccnRpingTargetInfo target_b(void) {
  HccnRpingTargetInfo t;
  memset(&t, 0, sizeof(t));
  t.dstIp = IP_B;
  t.srcIp = IP_A;
  t.port = PORT_B;
  t.sl = 4;
  t.tc = 132;
  return t;
}

static HccnResult wait_results(HccnRpingCtx c, HccnRpingTargetInfo *t, HccnRpingResultInfo *res,
                               int timeout_ms) {
  int64_t deadline = tu_now_ms() + timeout_ms;
  struct timespec pause = {0, 1000000};
  HccnResult r;
  while ((r = HccnRpingGetResult(c, 1, t, res)) == HCCN_E_AGAIN && tu_now_ms() < deadline)
    nanosleep(&pause, NULL);
  return r;
}

static void report(const char *what, const HccnRpingResultInfo *r) {
  printf("\n    %s: state %d, sent %u, received %u, loss %.1f%%, rtt min/avg/max %u/%u/%u us ", what,
         (int)r->state, r->txPkt, r->rxPkt, r->txPkt ? 100.0 * (r->txPkt - r->rxPkt) / r->txPkt : 0.0,
         r->minRTT, r->avgRTT, r->maxRTT);
}

/* ---------------------------------------------------------------- tests */

#ifndef RPING_NETEM

static void test_veth_clean(void) {
  HccnRpingCtx c = client_ctx();
  HccnRpingTargetInfo t = target_b();
  HccnRpingResultInfo res;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 200, 1, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 20000), HCCN_SUCCESS);
  report("veth", &res);
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.txPkt, 200u);
  CU_ASSERT_EQUAL(res.rxPkt, 200u);
  CU_ASSERT(res.minRTT <= res.avgRTT && res.avgRTT <= res.maxRTT && res.maxRTT < 1000000u);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

static void test_no_such_host(void) {
  HccnRpingCtx c = client_ctx();
  HccnRpingTargetInfo t = target_b();
  HccnRpingAddTargetConfig cfg = {.connectTimeout = 500};
  int64_t t0 = tu_now_ms();

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  t.dstIp = IP_NONE;
  ASSERT_HCCN(HccnRpingAddTargetWithCfg(c, 1, &t, &cfg), HCCN_E_FAIL);
  CU_ASSERT(tu_now_ms() - t0 >= 500 && tu_now_ms() - t0 < 3500);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

/* With the link down nothing can be sent: the result is INVALID (no probe left);
 * with it up again the next batch is VALID. */
static void test_link_down(void) {
  HccnRpingCtx c = client_ctx();
  HccnRpingTargetInfo t = target_b();
  HccnRpingResultInfo res;
  char out[256];

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS);
  CU_ASSERT_FATAL(run(out, sizeof(out), "ip -n %s link set vA down", ns_a) == 0);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 1, 200), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 10000), HCCN_SUCCESS);
  report("link down", &res);
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_INVALID);
  CU_ASSERT_EQUAL(res.txPkt, 0u);
  CU_ASSERT_EQUAL(res.rxPkt, 0u);
  ASSERT_HCCN(HccnRpingBatchPingStop(c), HCCN_SUCCESS);
  CU_ASSERT_FATAL(run(out, sizeof(out),
                      "ip -n %s link set vA up && ip -n %s neigh replace " IP_B " lladdr " MAC_B
                      " dev vA nud permanent",
                      ns_a, ns_a) == 0);
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 5, 1, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 10000), HCCN_SUCCESS);
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.rxPkt, 5u);
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

#else

/* netem delays each probe 20 ms and drops 10%; answers go back undelayed. 400 probes:
 * the loss count is binomial (mean 40, sd 6), accepted within 4 sd: 16..64. */
static void test_netem_delay_loss(void) {
  HccnRpingCtx c = client_ctx();
  HccnRpingTargetInfo t = target_b();
  HccnRpingResultInfo res;
  uint32_t lost;

  CU_ASSERT_PTR_NOT_NULL_FATAL(c);
  ASSERT_HCCN_FATAL(HccnRpingAddTarget(c, 1, &t), HCCN_SUCCESS); /* HELLO is resent past the loss */
  ASSERT_HCCN(HccnRpingBatchPingStart(c, 400, 2, 1000), HCCN_SUCCESS);
  ASSERT_HCCN(wait_results(c, &t, &res, 30000), HCCN_SUCCESS);
  report("netem delay 20ms loss 10%", &res);
  CU_ASSERT_EQUAL(res.state, HCCN_RPING_RESULT_STATE_VALID);
  CU_ASSERT_EQUAL(res.txPkt, 400u);
  lost = res.txPkt - res.rxPkt;
  if (lost < 16 || lost > 64)
    tu_fail(__FILE__, __LINE__, "lost %u of 400, netem drops 10%% (16..64 accepted)", lost);
  if (res.minRTT < 19500 || res.avgRTT > 30000 || res.maxRTT >= 1000000)
    tu_fail(__FILE__, __LINE__,
            "rtt min/avg/max %u/%u/%u us, netem adds 20 ms (min >= 19.5 ms, avg <= 30 ms)", res.minRTT,
            res.avgRTT, res.maxRTT);
  else
    CU_PASS("RTT within tolerance of netem's 20 ms");
  ASSERT_HCCN(HccnRpingDeinit(c), HCCN_SUCCESS);
}

#endif

int main(void) {
  HccnResult ready = HCCN_E_FAIL;
  CU_pSuite s;
  int rc;

#ifdef RPING_NETEM
  const bool netem = true;
#else
  const bool netem = false;
#endif
  signal(SIGPIPE, SIG_IGN);
  setup_network(netem);
  host_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  /* The responder forks while this process has no threads. */
  if (tu_child_start(&responder, responder_child, NULL) != 0 ||
      tu_child_read(&responder, &ready, sizeof(ready), 10000) != 0 || ready != HCCN_SUCCESS) {
    printf("the responder in %s did not start\n", ns_b);
    tu_child_wait(&responder, 5000);
    ns_cleanup();
    return 1;
  }
  /* This thread, and every thread it starts from now on, lives in A. */
  if (enter_ns(ns_a) != 0) {
    printf("setns %s: %s\n", ns_a, strerror(errno));
    tu_child_stop(&responder, 5000);
    ns_cleanup();
    return 1;
  }
  rc = 1;
  if (CU_initialize_registry() != CUE_SUCCESS) goto out;
#ifndef RPING_NETEM
  s = CU_add_suite("two namespaces over veth", NULL, NULL);
  CU_add_test(s, "200 probes, all answered; NIC names as devices", test_veth_clean);
  CU_add_test(s, "a host that does not exist times out", test_no_such_host);
  CU_add_test(s, "link down: INVALID; up again: VALID", test_link_down);
#else
  s = CU_add_suite("two namespaces over veth with netem", NULL, NULL);
  CU_add_test(s, "netem delay 20ms loss 10%: RTT and loss within tolerance", test_netem_delay_loss);
#endif
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    goto out;
  }
  rc = tu_run_registry();
out:
  if (tu_child_stop(&responder, 10000) != 0) {
    printf("the responder in %s did not exit cleanly\n", ns_b);
    rc = 1;
  }
  ns_cleanup();
  return rc;
}
