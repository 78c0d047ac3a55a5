/* Bad arguments to every public engine function, option and env parsing, and the
 * status names and strings. Uses loopback engines only where an argument check
 * needs a live link (so that only the argument under test is wrong). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "test_util.h"
#include "util/log.h"

#define MEM_LEN (1u << 20)

/* A server and a connected client, each with MEM_LEN registered. */
static struct {
  HixlEngine *srv, *cli;
  char srv_name[TU_ADDR_LEN];
  unsigned char *srv_mem, *cli_mem;
  HixlMemHandle srv_h, cli_h;
} g;

static int live_init(void) {
  uint16_t port = tu_free_port();

  if (!port) return -1;
  tu_addr(g.srv_name, sizeof(g.srv_name), port);
  g.srv_mem = tu_alloc_mem(MEM_LEN, false);
  g.cli_mem = tu_alloc_mem(MEM_LEN, false);
  if (!g.srv_mem || !g.cli_mem) return -1;
  g.srv = tu_engine_start(g.srv_name);
  g.cli = tu_engine_start("127.0.0.1");
  if (!g.srv || !g.cli) return -1;
  g.srv_h = tu_register(g.srv, g.srv_mem, MEM_LEN);
  g.cli_h = tu_register(g.cli, g.cli_mem, MEM_LEN);
  if (!g.srv_h || !g.cli_h) return -1;
  if (HixlEngineConnect(g.cli, g.srv_name, 5000) != HIXL_SUCCESS) {
    fprintf(stderr, "live_init: connect %s: %s\n", g.srv_name, HixlGetLastErrorMessage());
    return -1;
  }
  return 0;
}

static int live_cleanup(void) {
  int rc = 0;

  if (g.cli && HixlEngineDestroy(g.cli) != HIXL_SUCCESS) rc = -1;
  if (g.srv && HixlEngineDestroy(g.srv) != HIXL_SUCCESS) rc = -1;
  tu_free_mem(g.srv_mem, MEM_LEN);
  tu_free_mem(g.cli_mem, MEM_LEN);
  memset(&g, 0, sizeof(g));
  return rc;
}

/* A desc that would be valid on the live pair. */
static HixlTransferOpDesc good_desc(size_t off, size_t len) {
  HixlTransferOpDesc d = {
      .local_addr = (uintptr_t)g.cli_mem + off, .remote_addr = (uintptr_t)g.srv_mem + off, .len = len};
  return d;
}

/* A made-up pointer that no engine ever handed out. */
static int bogus_object;
#define BOGUS_REQ ((HixlTransferReq)(void *)&bogus_object)
#define BOGUS_MEM ((HixlMemHandle)(void *)&bogus_object)

/* ---------------------------------------------------------------- status */

static void test_status_names(void) {
#define CHECK_STATUS_(name, value, text)                                                                     \
  CU_ASSERT_EQUAL((unsigned)name, (unsigned)value);                                                          \
  CU_ASSERT_STRING_EQUAL(HixlStatusName(name), #name);                                                       \
  CU_ASSERT_STRING_EQUAL(HixlStatusString(name), text);
  HIXL_STATUS_MAP(CHECK_STATUS_)
#undef CHECK_STATUS_
  /* HIXL's values, spelled out so a change to the map is caught. */
  CU_ASSERT_EQUAL(HIXL_SUCCESS, 0u);
  CU_ASSERT_EQUAL(HIXL_PARAM_INVALID, 103900u);
  CU_ASSERT_EQUAL(HIXL_TIMEOUT, 103901u);
  CU_ASSERT_EQUAL(HIXL_NOT_CONNECTED, 103902u);
  CU_ASSERT_EQUAL(HIXL_ALREADY_CONNECTED, 103903u);
  CU_ASSERT_EQUAL(HIXL_NOTIFY_FAILED, 103904u);
  CU_ASSERT_EQUAL(HIXL_UNSUPPORTED, 103905u);
  CU_ASSERT_EQUAL(HIXL_NOT_FOUND, 103906u); /* hixl's own: a key that names no cache */
  CU_ASSERT_EQUAL(HIXL_RESOURCE_EXHAUSTED, 203900u);
  CU_ASSERT_EQUAL(HIXL_FAILED, 503900u);
}

static void test_status_unknown(void) {
  const HixlStatus odd[] = {1u, 103899u, 103907u, 999999u, 0xffffffffu};
  size_t i;

  for (i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
    CU_ASSERT_STRING_EQUAL(HixlStatusName(odd[i]), "HIXL_UNKNOWN_STATUS");
    CU_ASSERT_PTR_NOT_NULL_FATAL(HixlStatusString(odd[i]));
    CU_ASSERT(strlen(HixlStatusString(odd[i])) > 0);
  }
}

static void test_version(void) {
  const char *v = HixlVersionString();
  unsigned a, b, c;
  char tail;

  CU_ASSERT_PTR_NOT_NULL_FATAL(v);
  CU_ASSERT_EQUAL(sscanf(v, "%u.%u.%u%c", &a, &b, &c, &tail), 3);
}

static void test_last_error_set_on_failure(void) {
  CU_ASSERT_PTR_NOT_NULL_FATAL(HixlGetLastErrorMessage());
  TU_ASSERT_STATUS(HixlEngineCreate(NULL), HIXL_PARAM_INVALID);
  CU_ASSERT(strlen(HixlGetLastErrorMessage()) > 0);
}

static int log_calls;
static void count_log(HixlLogLevel level, const char *message, void *ctx) {
  (void)level;
  (void)message;
  (void)ctx;
  log_calls++;
}

static void test_log_off_is_quiet(void) {
  HixlSetLogLevel(HIXL_LOG_OFF);
  HixlSetLogCallback(count_log, NULL);
  log_calls = 0;
  TU_ASSERT_STATUS(HixlEngineCreate(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(NULL, "127.0.0.1", NULL, 0), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(log_calls, 0);
  HixlSetLogCallback(NULL, NULL);
  HixlSetLogLevel(HIXL_LOG_ERROR);
}

/* The log settings change while another thread logs (issue 28): each line reaches
 * exactly one callback with that callback's own context, never a torn pair, and
 * ThreadSanitizer sees no race. */
enum { LOG_LINES = 4000 };
struct log_box {
  atomic_int lines, torn;
};
static struct log_box box_a, box_b;
static void log_to_a(HixlLogLevel level, const char *message, void *ctx) {
  (void)level, (void)message;
  atomic_fetch_add(ctx == &box_a ? &box_a.lines : &box_a.torn, 1);
}
static void log_to_b(HixlLogLevel level, const char *message, void *ctx) {
  (void)level, (void)message;
  atomic_fetch_add(ctx == &box_b ? &box_b.lines : &box_b.torn, 1);
}
static atomic_int logging_done;
static void *log_writer(void *arg) {
  (void)arg;
  for (int i = 0; i < LOG_LINES; i++) log_error("line %d", i); /* as hixl logs: util/log.h */
  atomic_store(&logging_done, 1);
  return NULL;
}

static void test_log_settings_race(void) {
  pthread_t th;
  atomic_store(&logging_done, 0);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  HixlSetLogCallback(log_to_a, &box_a);
  CU_ASSERT_FATAL(pthread_create(&th, NULL, log_writer, NULL) == 0);
  for (unsigned k = 0; !atomic_load(&logging_done); k++) {
    if (k & 1)
      HixlSetLogCallback(log_to_a, &box_a);
    else
      HixlSetLogCallback(log_to_b, &box_b);
    HixlSetLogLevel(HIXL_LOG_ERROR);
  }
  pthread_join(th, NULL);
  HixlSetLogCallback(NULL, NULL);
  CU_ASSERT_EQUAL(atomic_load(&box_a.lines) + atomic_load(&box_b.lines), LOG_LINES);
  CU_ASSERT_EQUAL(atomic_load(&box_a.torn) + atomic_load(&box_b.torn), 0);
}

/* ---------------------------------------------------------------- lifecycle */

static void test_create_destroy_null(void) {
  HixlEngine *e = NULL;

  TU_ASSERT_STATUS(HixlEngineCreate(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(NULL, "127.0.0.1", NULL, 0), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineFinalize(NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDestroy(NULL), HIXL_PARAM_INVALID);
  /* Create then Destroy without Initialize is fine. */
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  CU_ASSERT_PTR_NOT_NULL(e);
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* Initialize with local_engine name and no options; returns the status. */
static HixlStatus try_init_name(const char *name) {
  HixlEngine *e = NULL;
  HixlStatus st;

  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return 0xdeadu;
  st = HixlEngineInitialize(e, name, NULL, 0);
  HixlEngineDestroy(e);
  return st;
}

static void test_init_bad_local_engine(void) {
  const char *bad[] = {"",           "1.2.3",           "127.0.0.1:99999", "host:abc",
                       "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:12ab",  "300.0.0.1",
                       ":1234",      "127.0.0.1:1:2",   " 127.0.0.1",      "127.0.0.1 "};
  /* A negative port is none (test_init_good_local_engine); these are not numbers. */
  const char *bad_neg[] = {"127.0.0.1:-", "127.0.0.1:--1", "127.0.0.1:-1x", "127.0.0.1:-2147483649"};
  HixlEngine *e = NULL;
  size_t i;

  for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    HixlStatus st = try_init_name(bad[i]);
    if (st != HIXL_PARAM_INVALID)
      tu_fail(__FILE__, __LINE__, "Initialize(\"%s\"): got %s, want HIXL_PARAM_INVALID", bad[i],
              HixlStatusName(st));
    else
      CU_PASS("bad local_engine rejected");
  }
  for (i = 0; i < sizeof(bad_neg) / sizeof(bad_neg[0]); i++)
    TU_ASSERT_STATUS(try_init_name(bad_neg[i]), HIXL_PARAM_INVALID);
  /* NULL name, and a failed Initialize leaves the engine usable. */
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, NULL, NULL, 0), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "host:abc", NULL, 0), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

static void test_init_good_local_engine(void) {
  char name[TU_ADDR_LEN];
  HixlEngine *e = NULL;

  TU_ASSERT_OK(try_init_name("127.0.0.1"));
  TU_ASSERT_OK(try_init_name("127.0.0.1:0"));
  TU_ASSERT_OK(try_init_name(tu_addr(name, sizeof(name), tu_free_port())));
  /* Seed 001: "host_port<=0 ... is a Client, no listening" (HIXL takes the port as an
   * int32_t and listens only when it is above 0). Before, a negative port was refused. */
  TU_ASSERT_OK(try_init_name("127.0.0.1:-1"));
  TU_ASSERT_OK(try_init_name("127.0.0.1:-0"));
  TU_ASSERT_OK(try_init_name("127.0.0.1:-65536"));
  TU_ASSERT_OK(try_init_name("127.0.0.1:-2147483648"));
  /* ... and it does not listen: a later listen on a port of its own is taken. */
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1:-1", NULL, 0));
  TU_ASSERT_OK(hixl_engine_listen(e, tu_free_port(), 0));
  /* A remote engine still needs a port above 0. */
  TU_ASSERT_STATUS(HixlEngineConnect(e, "127.0.0.1:-1", 200), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("needs a port");
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* Whether thread tid is among the n in v. */
static bool tid_in(int tid, const int *v, int n) {
  for (int i = 0; i < n; i++)
    if (v[i] == tid) return true;
  return false;
}

/* Each engine's progress thread is named (top -H, perf, gdb tell it apart); the name
 * goes with the thread at Finalize. Told apart by id from the threads of engines before
 * it, which the kernel may still list a moment after they were joined. */
static void test_progress_thread_named(void) {
  enum { CAP = 64 };
  HixlEngine *e = NULL;
  int before[CAP], after[CAP], mine = -1;
  int nb = tu_thread_ids_named("hixl-progress", before, CAP);

  CU_ASSERT_FATAL(nb >= 0 && nb < CAP);
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  int na = tu_thread_ids_named("hixl-progress", after, CAP), fresh = 0;
  for (int i = 0; i < na && i < CAP; i++)
    if (!tid_in(after[i], before, nb)) {
      mine = after[i];
      fresh++;
    }
  CU_ASSERT_EQUAL(fresh, 1); /* this engine's, and only it */
  TU_ASSERT_OK(HixlEngineFinalize(e));
  /* Joined: it is gone once the kernel has reaped it (no event says so: polled, 5 s at most). */
  bool gone = false;
  for (int64_t until = tu_now_ms() + 5000; !gone && tu_now_ms() < until;) {
    na = tu_thread_ids_named("hixl-progress", after, CAP);
    gone = na >= 0 && !tid_in(mine, after, na < CAP ? na : CAP);
    if (!gone) sched_yield();
  }
  CU_ASSERT_TRUE(gone);
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

static void test_double_initialize(void) {
  HixlEngine *e = NULL;
  char name[TU_ADDR_LEN];

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", NULL, 0), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(e, tu_addr(name, sizeof(name), tu_free_port()), NULL, 0),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineFinalize(e));
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* Finalize is a call that needs an initialized engine, like every other: before
 * Initialize and after Finalize it is PARAM_INVALID; Destroy works in every state. */
static void test_finalize_paths(void) {
  HixlEngine *e = NULL;

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineFinalize(e), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK(HixlEngineFinalize(e));
  TU_ASSERT_STATUS(HixlEngineFinalize(e), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineDestroy(e));
  /* Destroy of an initialized engine finalizes it. */
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

struct connect_arg {
  HixlEngine *e;
  const char *addr;
  HixlStatus st;
  int64_t ms; /* how long Connect took */
};

static void *connect_main(void *p) {
  struct connect_arg *a = p;
  int64_t t0 = tu_now_ms();
  a->st = HixlEngineConnect(a->e, a->addr, 20000);
  a->ms = tu_now_ms() - t0;
  return NULL;
}

/* Finalize while another thread's Connect waits in its handshake (a target that never
 * answers): Finalize cuts it and waits for it, so Connect fails at once, not at its 20 s
 * timeout, and nothing of the engine is freed under it (before: Finalize freed the
 * modules' state a handshake was using). */
static void test_finalize_cuts_connect(void) {
  HixlEngine *e = NULL;
  char addr[TU_ADDR_LEN];
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  int lfd = socket(AF_INET, SOCK_STREAM, 0); /* never accepts: the kernel completes the dial */
  CU_ASSERT_FATAL(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 4) == 0 &&
                  getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
  tu_addr(addr, sizeof(addr), ntohs(sa.sin_port));
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  struct connect_arg a = {e, addr, HIXL_SUCCESS, 0};
  pthread_t th;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, connect_main, &a) == 0);
  struct pollfd pf = {.fd = lfd, .events = POLLIN}; /* its dial is in the accept queue */
  CU_ASSERT(poll(&pf, 1, 10000) == 1);
  TU_ASSERT_OK(HixlEngineFinalize(e));
  pthread_join(th, NULL);
  CU_ASSERT(a.st != HIXL_SUCCESS);
  CU_ASSERT(a.ms < 10000);
  TU_ASSERT_OK(HixlEngineDestroy(e));
  close(lfd);
}

struct alloc_loop {
  HixlEngine *e;
  atomic_bool stop;
  atomic_uint ok;
  unsigned refused, other;
};

static void *alloc_loop_main(void *p) {
  struct alloc_loop *a = p;
  while (!atomic_load(&a->stop)) {
    void *addr = NULL;
    HixlMemHandle h = NULL;
    HixlStatus st = HixlEngineAllocMem(a->e, 4096, &addr, &h);
    if (st == HIXL_SUCCESS) {
      atomic_fetch_add(&a->ok, 1);     /* not written: a Finalize may unmap it at once */
      st = HixlEngineFreeMem(a->e, h); /* PARAM_INVALID when a Finalize came between */
      a->other += st != HIXL_SUCCESS && st != HIXL_PARAM_INVALID;
    } else {
      a->refused += st == HIXL_PARAM_INVALID;
      a->other += st != HIXL_PARAM_INVALID;
    }
  }
  return NULL;
}

/* AllocMem and FreeMem on one thread while another finalizes and initializes the engine
 * again and again: each call succeeds or is refused (PARAM_INVALID). Finalize waits for an
 * AllocMem between its registration and its share (api_out); before, it freed the
 * registration AllocMem then wrote into, a window this churn rarely hits (a hostile
 * host's loop hit it in 1-18 s under ASan). */
static void test_finalize_while_alloc(void) {
  HixlEngine *e = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  struct alloc_loop a = {.e = e};
  pthread_t th;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, alloc_loop_main, &a) == 0);
  for (int64_t end = tu_now_ms() + 10000; atomic_load(&a.ok) == 0 && tu_now_ms() < end;) sched_yield();
  CU_ASSERT(atomic_load(&a.ok) > 0); /* it runs: the churn begins */
  for (int i = 0; i < 300; i++) {
    TU_ASSERT_OK(HixlEngineFinalize(e));
    TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  }
  atomic_store(&a.stop, true);
  pthread_join(th, NULL);
  CU_ASSERT_EQUAL(a.other, 0);
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* Every call that needs an initialized engine, on one that is not. */
static void test_calls_before_initialize(void) {
  HixlEngine *e = NULL;
  unsigned char buf[64];
  HixlMemDesc md = {.addr = (uintptr_t)buf, .len = sizeof(buf)};
  HixlMemHandle h = BOGUS_MEM;
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)buf, .remote_addr = 0x1000, .len = 8};
  HixlTransferReq req = BOGUS_REQ;
  HixlTransferStatus ts = (HixlTransferStatus)77;
  HixlNotifyDesc nd = {.name = "n", .msg = "m", .remote_engine = NULL};
  HixlNotifyDesc *list = (HixlNotifyDesc *)(void *)&bogus_object;
  size_t count = 99;
  void *ud = &bogus_object;

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineRegisterMem(e, &md, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(h, BOGUS_MEM); /* outputs are written only on success */
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(e, BOGUS_MEM), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineConnect(e, "127.0.0.1:1", 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDisconnect(e, "127.0.0.1:1", 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(e, "127.0.0.1:1", HIXL_WRITE, &d, 1, 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(e, "127.0.0.1:1", HIXL_WRITE, &d, 1, 100, NULL, &req),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(req, BOGUS_REQ);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(e, BOGUS_REQ, &ts), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(ts, (HixlTransferStatus)77);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(e, BOGUS_REQ, &ud), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(ud, &bogus_object);
  TU_ASSERT_STATUS(HixlEngineSendNotify(e, "127.0.0.1:1", &nd, 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetNotifies(e, &list, &count), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(count, 99);
  /* The same after Finalize. */
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK(HixlEngineFinalize(e));
  TU_ASSERT_STATUS(HixlEngineRegisterMem(e, &md, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineConnect(e, "127.0.0.1:1", 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(e, "127.0.0.1:1", HIXL_WRITE, &d, 1, 100), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetNotifies(e, &list, &count), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* ---------------------------------------------------------------- options */

/* Initialize a client engine with one option; returns the status and leaves the
 * last error message of this thread as Initialize set it. A refusal's message names
 * the key and the value (escaped: a control character as \xNN). */
static HixlStatus try_option(const char *key, const char *value) {
  HixlOption o = {.key = key, .value = value};
  HixlEngine *e = NULL;
  HixlStatus st;
  static char msg[1024];

  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return 0xdeadu;
  st = HixlEngineInitialize(e, "127.0.0.1", &o, 1);
  snprintf(msg, sizeof(msg), "%s", HixlGetLastErrorMessage());
  HixlEngineDestroy(e);
  /* Destroy succeeded and may have cleared the message; failures are judged by the
   * message Initialize left, so check it here. */
  char shown[4 * 64 + 1]; /* the value as messages quote it: escaped (log_escape) */
  log_escape(shown, sizeof(shown), value, strlen(value));
  if (st != HIXL_SUCCESS && (!strstr(msg, key) || !strstr(msg, shown)))
    tu_fail(__FILE__, __LINE__, "option %s=\"%s\": message \"%s\" names not both key and value", key, value,
            msg);
  return st;
}

#define EXPECT_OPTION(key, value, want)                                                                      \
  do {                                                                                                       \
    HixlStatus st_ = try_option((key), (value));                                                             \
    if (st_ != (want))                                                                                       \
      tu_fail(__FILE__, __LINE__, "option %s=\"%s\": got %s, want %s", (key), (value), HixlStatusName(st_),  \
              HixlStatusName(want));                                                                         \
    else                                                                                                     \
      CU_PASS("option");                                                                                     \
  } while (0)

static void test_option_unknown_key(void) {
  HixlOption o = {.key = "NoSuchOption", .value = "1"};
  HixlEngine *e = NULL;

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("NoSuchOption");
  /* the known keys, from the table */
  TU_ASSERT_ERRMSG_HAS(
      "MaxLinksPerAddress, AuthKeyFile, AuthAliases, AuthPayloadTag, Rails, RailStallMs, RailProbeMs, "
      "SocketBufferKiB, PollUs)");
  /* Keys are case-sensitive, as HIXL's. */
  o.key = "bufferpool";
  o.value = "4:8";
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("bufferpool");
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

static void test_option_null_fields(void) {
  HixlOption o[2] = {{.key = NULL, .value = "4:8"}, {.key = "BufferPool", .value = NULL}};
  HixlEngine *e = NULL;

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", NULL, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o[0], 1), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o[1], 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("BufferPool");
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", o, 0)); /* count 0: options ignored */
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

static void test_option_buffer_pool(void) {
  EXPECT_OPTION("BufferPool", "x", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "4", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "4:-1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "-1:8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "4:8:1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", ":8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "4:", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "", HIXL_PARAM_INVALID);
  /* Whitespace strtoull would skip, and empty list items strtok_r would: refused. */
  EXPECT_OPTION("BufferPool", "4:\t8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "\n4:8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "\v132", HIXL_PARAM_INVALID);
  EXPECT_OPTION("PollUs", "\r5", HIXL_PARAM_INVALID);
  EXPECT_OPTION("Rails", "127.0.0.1,,127.0.0.2", HIXL_PARAM_INVALID);
  EXPECT_OPTION("Rails", ",127.0.0.1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("BufferPool", "4:8", HIXL_SUCCESS);
  EXPECT_OPTION("BufferPool", "0:0", HIXL_SUCCESS);
  EXPECT_OPTION("BufferPool", "8:16", HIXL_SUCCESS);
}

static void test_option_traffic_class(void) {
  EXPECT_OPTION("RdmaTrafficClass", "256", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "3", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "-4", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "abc", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "132x", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTrafficClass", "0", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaTrafficClass", "132", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaTrafficClass", "252", HIXL_SUCCESS);
}

static void test_option_service_level(void) {
  EXPECT_OPTION("RdmaServiceLevel", "8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaServiceLevel", "-1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaServiceLevel", "x", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaServiceLevel", "0", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaServiceLevel", "4", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaServiceLevel", "7", HIXL_SUCCESS);
}

static void test_option_rdma_timeout_retry(void) {
  EXPECT_OPTION("RdmaTimeout", "4", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTimeout", "21", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTimeout", "", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaTimeout", "5", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaTimeout", "20", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaRetryCount", "0", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaRetryCount", "8", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaRetryCount", "1", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaRetryCount", "7", HIXL_SUCCESS);
}

/* The SO_RCVBUF and SO_SNDBUF (as the kernel reports them: twice what was asked) of
 * this process's TCP sockets between two engines, the one listening on port and its
 * peer: the link's both ends, into rcv[2] and snd[2]; how many were found. */
static int link_buffers(uint16_t port, int rcv[2], int snd[2]) {
  int n = 0;
  for (int fd = 3; fd < 4096 && n < 2; fd++) {
    struct sockaddr_in me, peer;
    socklen_t l1 = sizeof(me), l2 = sizeof(peer), il = sizeof(int);
    if (getsockname(fd, (struct sockaddr *)&me, &l1) != 0 || me.sin_family != AF_INET ||
        getpeername(fd, (struct sockaddr *)&peer, &l2) != 0)
      continue; /* not a socket, not IPv4, or not connected (the listener) */
    if (ntohs(me.sin_port) != port && ntohs(peer.sin_port) != port) continue;
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv[n], &il);
    il = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd[n], &il);
    n++;
  }
  return n;
}

/* A server at 127.0.0.1:port (its name into name) and a client, both initialized
 * with option o. */
static void pair_with(const HixlOption *o, uint16_t port, char *name, size_t cap, HixlEngine **srv,
                      HixlEngine **cli) {
  TU_ASSERT_OK_FATAL(HixlEngineCreate(srv));
  TU_ASSERT_OK_FATAL(HixlEngineCreate(cli));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(*srv, tu_addr(name, cap, port), o, 1));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(*cli, "127.0.0.1", o, 1));
}

static void test_option_socket_buffer(void) {
  EXPECT_OPTION("SocketBufferKiB", "63", HIXL_PARAM_INVALID);
  EXPECT_OPTION("SocketBufferKiB", "65537", HIXL_PARAM_INVALID);
  EXPECT_OPTION("SocketBufferKiB", "-1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("SocketBufferKiB", "2M", HIXL_PARAM_INVALID);
  EXPECT_OPTION("SocketBufferKiB", "", HIXL_PARAM_INVALID);
  EXPECT_OPTION("SocketBufferKiB", "auto", HIXL_SUCCESS);
  EXPECT_OPTION("SocketBufferKiB", "0", HIXL_SUCCESS);
  EXPECT_OPTION("SocketBufferKiB", "64", HIXL_SUCCESS);
  EXPECT_OPTION("SocketBufferKiB", "65536", HIXL_SUCCESS);
  /* Both ends of a link, the dialled one and the one that dialled, get the size each
   * engine was given: 128 and 192 KiB, under the stock kernel's cap (208 KiB). */
  const char *kib[2] = {"128", "192"};
  for (int k = 0; k < 2; k++) {
    char name[64];
    uint16_t port = tu_free_port();
    HixlOption o = {.key = "SocketBufferKiB", .value = kib[k]};
    HixlEngine *srv = NULL, *cli = NULL;
    int rcv[2] = {0, 0}, snd[2] = {0, 0}, want = 2 * 1024 * atoi(kib[k]);
    pair_with(&o, port, name, sizeof(name), &srv, &cli);
    TU_ASSERT_OK_FATAL(HixlEngineConnect(cli, name, 5000));
    CU_ASSERT_EQUAL(link_buffers(port, rcv, snd), 2);
    for (int i = 0; i < 2; i++)
      if (rcv[i] != want || snd[i] != want)
        tu_fail(__FILE__, __LINE__,
                "SocketBufferKiB %s: end %d of the link has SO_RCVBUF %d, SO_SNDBUF %d, want %d", kib[k], i,
                rcv[i], snd[i], want);
    TU_ASSERT_OK(HixlEngineDestroy(cli));
    TU_ASSERT_OK(HixlEngineDestroy(srv));
  }
}

/* An engine pair with PollUs US: src (LEN bytes) registered on the target, dst on the
 * client, linked; the target's name in NAME. */
static void poll_pair(const char *us, void *src, void *dst, size_t len, char *name, size_t cap,
                      HixlEngine **srv, HixlEngine **cli) {
  HixlOption o = {.key = "PollUs", .value = us};
  HixlMemHandle hs = NULL, hc = NULL;
  pair_with(&o, tu_free_port(), name, cap, srv, cli);
  HixlMemDesc ms = {.addr = (uintptr_t)src, .len = len}, mc = {.addr = (uintptr_t)dst, .len = len};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(*srv, &ms, HIXL_MEM_HOST, &hs));
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(*cli, &mc, HIXL_MEM_HOST, &hc));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(*cli, name, 5000));
}

/* PollUs: parsed; with it, the target's progress thread takes a client's back-to-back
 * requests while it polls (counted as polled, not woken), every byte still right; with
 * 0 it never polls. 200 ms is far longer than the gap between two sync READs. */
static void test_option_poll(void) {
  EXPECT_OPTION("PollUs", "-1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("PollUs", "1000001", HIXL_PARAM_INVALID);
  EXPECT_OPTION("PollUs", "5ms", HIXL_PARAM_INVALID);
  EXPECT_OPTION("PollUs", "", HIXL_PARAM_INVALID);
  EXPECT_OPTION("PollUs", "0", HIXL_SUCCESS);
  EXPECT_OPTION("PollUs", "1000000", HIXL_SUCCESS);
  const char *us[2] = {"200000", "0"};
  enum { OPS = 64, LEN = 4096 };
  static unsigned char src[OPS * LEN], dst[OPS * LEN];
  for (int k = 0; k < 2; k++) {
    char name[64];
    HixlEngine *srv = NULL, *cli = NULL;
    struct hixl_poll_stats ps = {0};
    tu_fill(src, sizeof(src), 0x9011 + (uint64_t)k);
    memset(dst, 0, sizeof(dst));
    poll_pair(us[k], src, dst, sizeof(src), name, sizeof(name), &srv, &cli);
    TU_ASSERT_OK(hixl_engine_poll_stats(srv, &ps));
    uint64_t before = ps.polled;
    for (int i = 0; i < OPS; i++) {
      HixlTransferOpDesc d = {.local_addr = (uintptr_t)dst + (uintptr_t)i * LEN,
                              .remote_addr = (uintptr_t)src + (uintptr_t)i * LEN,
                              .len = LEN};
      TU_ASSERT_OK(HixlEngineTransferSync(cli, name, HIXL_READ, &d, 1, 5000));
    }
    TU_ASSERT_SAME(dst, src, sizeof(dst), "PollUs READs");
    TU_ASSERT_OK(hixl_engine_poll_stats(srv, &ps));
    if (k == 0 && ps.polled - before < OPS / 2)
      tu_fail(__FILE__, __LINE__, "PollUs %s: the target polled up %llu of %d requests, want at least %d",
              us[k], (unsigned long long)(ps.polled - before), OPS, OPS / 2);
    if (k == 1 && ps.polled != 0)
      tu_fail(__FILE__, __LINE__, "PollUs 0: the target polled up %llu rounds, want none",
              (unsigned long long)ps.polled);
    CU_ASSERT(ps.woken > 0); /* the link's HELLO at least came to a sleeping thread */
    TU_ASSERT_OK(HixlEngineDestroy(cli));
    TU_ASSERT_OK(HixlEngineDestroy(srv));
  }
  TU_ASSERT_STATUS(hixl_engine_poll_stats(NULL, NULL), HIXL_PARAM_INVALID);
}

/* PollUs back-off: sparse traffic. The client READs once every 5 ms, so each of the
 * target's 0.2 ms windows ends with nothing come; after each miss the target skips twice
 * as many windows (1, 3, 7, ... 64), so 32 READs open about 5, not 32. The pause shapes
 * the traffic only: every READ is synchronous and checked whatever the timing. A window
 * that does catch a request (its thread held off the CPU for the whole gap, say) starts
 * the doubling again, hence the margin. */
static void test_option_poll_backoff(void) {
  enum { OPS = 32, LEN = 4096 };
  static unsigned char src[LEN], dst[LEN];
  char name[64];
  HixlEngine *srv = NULL, *cli = NULL;
  struct hixl_poll_stats before = {0}, after = {0};
  poll_pair("200", src, dst, sizeof(src), name, sizeof(name), &srv, &cli);
  TU_ASSERT_OK(hixl_engine_poll_stats(srv, &before));
  for (int i = 0; i < OPS; i++) {
    tu_fill(src, sizeof(src), 0xb0ff + (uint64_t)i);
    HixlTransferOpDesc d = {.local_addr = (uintptr_t)dst, .remote_addr = (uintptr_t)src, .len = LEN};
    TU_ASSERT_OK(HixlEngineTransferSync(cli, name, HIXL_READ, &d, 1, 5000));
    TU_ASSERT_SAME(dst, src, sizeof(dst), "PollUs 200 READ");
    struct timespec gap = {0, 5000000};
    nanosleep(&gap, NULL);
  }
  TU_ASSERT_OK(hixl_engine_poll_stats(srv, &after));
  uint64_t missed = after.missed - before.missed,
           events = after.woken + after.polled - before.woken - before.polled;
  if (events < OPS || missed == 0 || missed > OPS / 3)
    tu_fail(__FILE__, __LINE__,
            "PollUs 200, a READ every 5 ms: %llu rounds with events, %llu windows missed; "
            "want at least %d and 1 to %d",
            (unsigned long long)events, (unsigned long long)missed, OPS, OPS / 3);
  TU_ASSERT_OK(HixlEngineDestroy(cli));
  TU_ASSERT_OK(HixlEngineDestroy(srv));
}

/* PollUs beside a CPU-bound thread on the same CPU: a poller that yields hands it that
 * CPU until its time slice ends (milliseconds), and an event that comes meanwhile waits
 * for it, where a thread asleep is woken ahead of it (a 4 KiB READ over loopback with a
 * CPU hog beside the target: 0.001 GB/s polling, 0.049 sleeping). So a yield that lasted
 * 1 ms or more stops polling for 100 ms. This thread, both engines' threads and the hog
 * share one CPU; the READs go on until that was seen (at most 200 of them, each checked). */
static atomic_bool hog_stop;
static void *hog_main(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&hog_stop, memory_order_relaxed)) {
  }
  return NULL;
}

static void test_option_poll_contended(void) {
  enum { LEN = 4096, MAX_OPS = 200 };
  static unsigned char src[LEN], dst[LEN];
  cpu_set_t was, one;
  CU_ASSERT_EQUAL_FATAL(pthread_getaffinity_np(pthread_self(), sizeof(was), &was), 0);
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  /* The engines' threads, made below, inherit it. */
  CU_ASSERT_EQUAL_FATAL(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
  char name[64];
  HixlEngine *srv = NULL, *cli = NULL;
  struct hixl_poll_stats ps = {0}, pc = {0};
  poll_pair("200000", src, dst, sizeof(src), name, sizeof(name), &srv, &cli);
  pthread_t hog;
  atomic_store(&hog_stop, false);
  CU_ASSERT_EQUAL_FATAL(pthread_create(&hog, NULL, hog_main, NULL), 0);
  int i = 0;
  for (; i < MAX_OPS && ps.contended + pc.contended == 0; i++) {
    tu_fill(src, sizeof(src), 0xc0de + (uint64_t)i);
    HixlTransferOpDesc d = {.local_addr = (uintptr_t)dst, .remote_addr = (uintptr_t)src, .len = LEN};
    TU_ASSERT_OK(HixlEngineTransferSync(cli, name, HIXL_READ, &d, 1, 5000));
    TU_ASSERT_SAME(dst, src, sizeof(dst), "PollUs READ beside a CPU hog");
    TU_ASSERT_OK(hixl_engine_poll_stats(srv, &ps));
    TU_ASSERT_OK(hixl_engine_poll_stats(cli, &pc));
  }
  atomic_store(&hog_stop, true);
  pthread_join(hog, NULL);
  if (ps.contended + pc.contended == 0)
    tu_fail(__FILE__, __LINE__,
            "PollUs beside a CPU hog: no poller stopped in %d READs (target %llu, client %llu)", i,
            (unsigned long long)ps.contended, (unsigned long long)pc.contended);
  TU_ASSERT_OK(HixlEngineDestroy(cli));
  TU_ASSERT_OK(HixlEngineDestroy(srv));
  CU_ASSERT_EQUAL(pthread_setaffinity_np(pthread_self(), sizeof(was), &was), 0);
}

static void test_option_transport(void) {
  HixlOption o = {.key = "Transport", .value = "rdma"};
  HixlEngine *e = NULL;

  EXPECT_OPTION("Transport", "foo", HIXL_PARAM_INVALID);
  EXPECT_OPTION("Transport", "", HIXL_PARAM_INVALID);
  EXPECT_OPTION("Transport", "auto", HIXL_SUCCESS);
  EXPECT_OPTION("Transport", "tcp", HIXL_SUCCESS);
  EXPECT_OPTION("RdmaDevice", "bad name", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaGidIndex", "256", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaGidIndex", "-1", HIXL_PARAM_INVALID);
  EXPECT_OPTION("RdmaGidIndex", "auto", HIXL_SUCCESS);
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  /* No RDMA device owns 127.0.0.1, here or in the soft-RoCE guest: a clear failure
   * that says what was looked for. */
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o, 1), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("127.0.0.1");
  /* shm needs nothing but this host's boot id at Initialize; peers are checked at Connect. */
  o.value = "shm";
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", &o, 1));
  TU_ASSERT_OK(HixlEngineFinalize(e));
  o.value = "tcp";
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", &o, 1));
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

static void test_option_several(void) {
  HixlOption o[4] = {
      {"BufferPool", "2:4"}, {"RdmaTrafficClass", "8"}, {"RdmaServiceLevel", "3"}, {"Transport", "tcp"}};
  HixlEngine *e = NULL;

  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  /* One bad value among good ones fails the whole call and names its key. */
  o[2].value = "9";
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", o, 4), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("RdmaServiceLevel");
  o[2].value = "3";
  TU_ASSERT_OK(HixlEngineInitialize(e, "127.0.0.1", o, 4));
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* Initialize a fresh client engine with these options; the last error message of
 * this thread is the one Initialize left (copied into errbuf). */
static HixlStatus try_init_opts(const HixlOption *o, size_t n, char *errbuf, size_t errlen) {
  HixlEngine *e = NULL;
  HixlStatus st;

  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return 0xdeadu;
  st = HixlEngineInitialize(e, "127.0.0.1", o, n);
  snprintf(errbuf, errlen, "%s", HixlGetLastErrorMessage());
  if (HixlEngineDestroy(e) != HIXL_SUCCESS) return 0xdeadu;
  return st;
}

#define EXPECT_ENV_INIT(o, n, want, needle)                                                                  \
  do {                                                                                                       \
    char err_[1024];                                                                                         \
    HixlStatus st_ = try_init_opts((o), (n), err_, sizeof(err_));                                            \
    if (st_ != (want))                                                                                       \
      tu_fail(__FILE__, __LINE__, "env TC=%s SL=%s, %zu options: got %s, want %s (\"%s\")",                  \
              getenv("HCCL_RDMA_TC") ? getenv("HCCL_RDMA_TC") : "-",                                         \
              getenv("HCCL_RDMA_SL") ? getenv("HCCL_RDMA_SL") : "-", (size_t)(n), HixlStatusName(st_),       \
              HixlStatusName(want), err_);                                                                   \
    else if ((needle) != NULL && !strstr(err_, (needle) ? (needle) : ""))                                    \
      tu_fail(__FILE__, __LINE__, "message \"%s\" does not name %s", err_, (needle));                        \
    else                                                                                                     \
      CU_PASS("env");                                                                                        \
  } while (0)

/* Env HCCL_RDMA_TC / HCCL_RDMA_SL apply only when the option is absent. */
static void test_env_precedence(void) {
  HixlOption tc = {"RdmaTrafficClass", "8"}, sl = {"RdmaServiceLevel", "2"};
  const char *none = NULL;

  unsetenv("HCCL_RDMA_TC");
  unsetenv("HCCL_RDMA_SL");

  setenv("HCCL_RDMA_TC", "7", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_PARAM_INVALID, "HCCL_RDMA_TC");
  EXPECT_ENV_INIT(&tc, 1, HIXL_SUCCESS, none);                 /* the option wins */
  EXPECT_ENV_INIT(&sl, 1, HIXL_PARAM_INVALID, "HCCL_RDMA_TC"); /* another option does not */
  setenv("HCCL_RDMA_TC", "256", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_PARAM_INVALID, "HCCL_RDMA_TC");
  setenv("HCCL_RDMA_TC", "x", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_PARAM_INVALID, "HCCL_RDMA_TC");
  setenv("HCCL_RDMA_TC", "8", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_SUCCESS, none);
  setenv("HCCL_RDMA_TC", "252", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_SUCCESS, none);
  unsetenv("HCCL_RDMA_TC");

  setenv("HCCL_RDMA_SL", "8", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_PARAM_INVALID, "HCCL_RDMA_SL");
  EXPECT_ENV_INIT(&sl, 1, HIXL_SUCCESS, none);
  setenv("HCCL_RDMA_SL", "3", 1);
  EXPECT_ENV_INIT(NULL, 0, HIXL_SUCCESS, none);
  unsetenv("HCCL_RDMA_SL");

  EXPECT_ENV_INIT(NULL, 0, HIXL_SUCCESS, none);
}

/* ---------------------------------------------------------------- memory */

static void test_register_args(void) {
  HixlMemDesc d = {.addr = (uintptr_t)g.cli_mem, .len = 64};
  HixlMemHandle h = BOGUS_MEM;
  unsigned char *extra = tu_alloc_mem(8192, false);

  CU_ASSERT_PTR_NOT_NULL_FATAL(extra);
  d.addr = (uintptr_t)extra;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(NULL, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, NULL, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, (HixlMemType)7, &h), HIXL_PARAM_INVALID);
  d.len = 0;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  d.addr = 0;
  d.len = 64;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  d.addr = UINTPTR_MAX - 10; /* wraps around the address space */
  d.len = 64;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(h, BOGUS_MEM);
  /* Host memory said to be device memory: no provider here, or the driver refuses it. */
  d.addr = (uintptr_t)extra;
  d.len = 4096;
  TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_DEVICE, &h), tu_device_refusal());
  CU_ASSERT(strlen(HixlGetLastErrorMessage()) > 0);
  CU_ASSERT_PTR_EQUAL(h, BOGUS_MEM);
  /* The failures registered nothing: the same range registers now. */
  TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h));
  CU_ASSERT_PTR_NOT_EQUAL(h, BOGUS_MEM);
  CU_ASSERT_PTR_NOT_NULL(h);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
  tu_free_mem(extra, 8192);
}

/* Host memory peers could not read and write is refused (PARAM_INVALID, saying which
 * byte): a page with no access, a read-only one, a hole, a range running past its
 * mapping. Before, each registered, and a peer's first WRITE there killed this process
 * (SIGSEGV on its progress thread). Two adjacent mappings, both read-write, register
 * as one range. */
static void test_register_unmapped(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *m = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HixlMemHandle h = BOGUS_MEM;
  CU_ASSERT_FATAL(m != MAP_FAILED);
  /* [0] read-write, [1] no access, [2] read-only, [3] read-write but unmapped below */
  CU_ASSERT_FATAL(mprotect(m + page, page, PROT_NONE) == 0 && mprotect(m + 2 * page, page, PROT_READ) == 0);
  CU_ASSERT_FATAL(munmap(m + 3 * page, page) == 0);
  const struct {
    size_t off, len;
    const char *says;
  } bad[] = {{page, page, "not readable and writable"},
             {2 * page, 16, "not readable and writable"},
             {0, 2 * page, "not readable and writable"},
             {3 * page, page, "not mapped"},
             {page - 8, 16, "not readable and writable"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    HixlMemDesc d = {.addr = (uintptr_t)m + bad[i].off, .len = bad[i].len};
    TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS(bad[i].says);
    CU_ASSERT_PTR_EQUAL(h, BOGUS_MEM);
  }
  HixlMemDesc ok = {.addr = (uintptr_t)m, .len = page};
  TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &ok, HIXL_MEM_HOST, &h));
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
  munmap(m, 3 * page);
  /* Two mappings side by side (anonymous, then a memfd's), one range across both. */
  unsigned char *two = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int fd = memfd_create("test-register", MFD_CLOEXEC);
  CU_ASSERT_FATAL(two != MAP_FAILED && fd >= 0 && ftruncate(fd, (off_t)page) == 0);
  CU_ASSERT_FATAL(mmap(two + page, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
                  two + page);
  HixlMemDesc both = {.addr = (uintptr_t)two, .len = 2 * page};
  TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &both, HIXL_MEM_HOST, &h));
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
  munmap(two, 2 * page);
  close(fd);
}

static void test_register_overlap(void) {
  const uintptr_t base = (uintptr_t)g.cli_mem; /* [base, base + MEM_LEN) is registered */
  const struct {
    uintptr_t addr;
    size_t len;
  } overlap[] = {
      {base, MEM_LEN},              /* the same range */
      {base, 1},                    /* first byte */
      {base + MEM_LEN - 1, 1},      /* last byte */
      {base + 100, 200},            /* inside */
      {base - 4096, 4097},          /* ends on the first byte */
      {base + MEM_LEN - 1, 4096},   /* starts on the last byte */
      {base - 4096, MEM_LEN + 8192} /* contains it */
  };
  HixlMemHandle h = BOGUS_MEM, h2 = NULL;
  HixlMemDesc d;
  size_t i;

  for (i = 0; i < sizeof(overlap) / sizeof(overlap[0]); i++) {
    HixlStatus st;
    d.addr = overlap[i].addr;
    d.len = overlap[i].len;
    st = HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h);
    if (st != HIXL_PARAM_INVALID)
      tu_fail(__FILE__, __LINE__, "overlap case %zu [+%td, len %zu): got %s, want PARAM_INVALID", i,
              (ptrdiff_t)(overlap[i].addr - base), overlap[i].len, HixlStatusName(st));
    else
      CU_PASS("overlap rejected");
    CU_ASSERT_PTR_EQUAL(h, BOGUS_MEM);
    if (st == HIXL_SUCCESS) HixlEngineDeregisterMem(g.cli, h);
    h = BOGUS_MEM;
  }

  /* Two overlapping new ranges: the second is refused, adjacent ones are fine. */
  {
    unsigned char *m = tu_alloc_mem(3 * 4096, false);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    d.addr = (uintptr_t)m;
    d.len = 4096;
    TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h));
    d.addr = (uintptr_t)m + 4095;
    d.len = 2;
    TU_ASSERT_STATUS(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h2), HIXL_PARAM_INVALID);
    d.addr = (uintptr_t)m + 4096; /* adjacent, not overlapping */
    d.len = 4096;
    TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h2));
    CU_ASSERT_PTR_NOT_EQUAL(h, h2);
    TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h2));
    TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
    /* After deregistration the range can be registered again. */
    d.addr = (uintptr_t)m;
    d.len = 3 * 4096;
    TU_ASSERT_OK(HixlEngineRegisterMem(g.cli, &d, HIXL_MEM_HOST, &h));
    TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
    tu_free_mem(m, 3 * 4096);
  }
}

static void test_deregister_args(void) {
  unsigned char *m = tu_alloc_mem(4096, false);
  HixlMemHandle h;

  CU_ASSERT_PTR_NOT_NULL_FATAL(m);
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(NULL, g.cli_h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, BOGUS_MEM), HIXL_PARAM_INVALID);
  /* A handle of another engine is unknown to this one. */
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, g.srv_h), HIXL_PARAM_INVALID);
  /* Twice: the second time the handle is stale. */
  h = tu_register(g.cli, m, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, h), HIXL_PARAM_INVALID);
  /* The same range registered again, likely in the registration's old memory: a handle of
   * its own, and the stale one does not drop it (with addresses for handles, it did). */
  HixlMemHandle h2 = tu_register(g.cli, m, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h2);
  CU_ASSERT(h2 != h);
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.cli, h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineFreeMem(g.cli, h), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h2));
  tu_free_mem(m, 4096);
}

/* ---------------------------------------------------------------- links */

static void test_connect_args(void) {
  const char *bad[] = {"", "abc", "127.0.0.1:99999", "host:abc", "1.2.3", "127.0.0.1:"};
  size_t i;

  TU_ASSERT_STATUS(HixlEngineConnect(NULL, g.srv_name, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, NULL, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, -1), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, INT32_MIN), HIXL_PARAM_INVALID);
  for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    HixlStatus st = HixlEngineConnect(g.cli, bad[i], 200);
    if (st != HIXL_PARAM_INVALID)
      tu_fail(__FILE__, __LINE__, "Connect(\"%s\"): got %s, want HIXL_PARAM_INVALID", bad[i],
              HixlStatusName(st));
    else
      CU_PASS("bad remote rejected");
  }
  /* The link survived all of that. */
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, 1000), HIXL_ALREADY_CONNECTED);
  /* The link's description: a place to write it, and a well-formed name. */
  struct hixl_link_info li;
  TU_ASSERT_STATUS(hixl_engine_link_info(g.cli, g.srv_name, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("info is NULL");
  TU_ASSERT_STATUS(hixl_engine_link_info(g.cli, NULL, &li), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(hixl_engine_link_info(g.cli, "abc", &li), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(hixl_engine_link_info(g.cli, g.srv_name, &li));
}

static void test_disconnect_args(void) {
  char other[TU_ADDR_LEN];
  HixlStatus st;

  TU_ASSERT_STATUS(HixlEngineDisconnect(NULL, g.srv_name, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, NULL, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, "", 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, g.srv_name, -5), HIXL_PARAM_INVALID);
  /* A malformed name can never be connected: either answer is truthful. */
  st = HixlEngineDisconnect(g.cli, "host:abc", 1000);
  CU_ASSERT(st == HIXL_PARAM_INVALID || st == HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, tu_addr(other, sizeof(other), tu_free_port()), 1000),
                   HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, 1000), HIXL_ALREADY_CONNECTED);
}

/* ---------------------------------------------------------------- transfers */

static void test_transfer_sync_args(void) {
  HixlTransferOpDesc d = good_desc(0, 64), many[2];
  HixlTransferOpDesc *huge;

  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000));
  TU_ASSERT_STATUS(HixlEngineTransferSync(NULL, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, NULL, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, "", HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  /* The name is parsed only when no peer has it: a malformed one still says what is
   * wrong with it, a well-formed one nobody connected to says so. */
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, "127.0.0.1", HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "needs a port"));
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, "not-an-ip:80", HIXL_WRITE, &d, 1, 1000),
                   HIXL_PARAM_INVALID);
  char unknown[TU_ADDR_LEN], longname[300];
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, tu_addr(unknown, sizeof(unknown), tu_free_port()),
                                          HIXL_WRITE, &d, 1, 1000),
                   HIXL_NOT_CONNECTED);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "not connected to"));
  memset(longname, '1', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, longname, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(
      HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000)); /* nothing of that stuck */
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, NULL, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 0, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, (HixlTransferOp)2, &d, 1, 1000),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, (HixlTransferOp)-1, &d, 1, 1000),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, -1), HIXL_PARAM_INVALID);
  d.len = 0;
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &d, 1, 1000), HIXL_PARAM_INVALID);
  /* len 0 in the middle of an otherwise good batch. */
  many[0] = good_desc(0, 64);
  many[1] = good_desc(128, 0);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, many, 2, 1000), HIXL_PARAM_INVALID);
  /* Local range wrapping the address space. */
  d = good_desc(0, 64);
  d.local_addr = UINTPTR_MAX - 8;
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  /* A local address 0 (NULL), alone or in a good batch: refused, nothing sent, the link
   * kept. Before, a READ took it as the discard sink and ended SUCCESS with its bytes
   * dropped; a WRITE from it reset the link. */
  for (int k = 0; k < 2; k++) {
    many[0] = good_desc(0, 64);
    many[1] = good_desc(128, 64);
    many[k].local_addr = 0;
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, many, 2, 1000), HIXL_PARAM_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "local_addr is 0"));
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, many, 2, 1000),
                     HIXL_PARAM_INVALID);
  }
  /* A remote address 0 likewise: PARAM_INVALID, as HIXL's own TransferSync and TransferAsync
   * answer it ("remote addr of desc can not be null", hicann/hixl src/hixl/engine/hixl_impl.cc).
   * Before, it went as a staged op and ended FAILED (the peer lets none reach unregistered
   * memory), after a round trip to the peer. */
  for (int k = 0; k < 2; k++) {
    many[0] = good_desc(0, 64);
    many[1] = good_desc(128, 64);
    many[k].remote_addr = 0;
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, many, 2, 1000), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("remote_addr is 0");
    TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, many, 2, 1000),
                     HIXL_PARAM_INVALID);
  }
  d = good_desc(0, 64);
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000)); /* the link stayed */
  /* More than HIXL_MAX_BATCH descriptors. */
  huge = calloc(HIXL_MAX_BATCH + 1, sizeof(*huge));
  CU_ASSERT_PTR_NOT_NULL_FATAL(huge);
  for (size_t i = 0; i < HIXL_MAX_BATCH + 1; i++) huge[i] = good_desc((i * 8) % MEM_LEN, 8);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, huge, HIXL_MAX_BATCH + 1, 5000),
                   HIXL_PARAM_INVALID);
  free(huge);
}

static void test_transfer_async_args(void) {
  HixlTransferOpDesc d = good_desc(0, 64);
  HixlTransferReq req = BOGUS_REQ;
  HixlTransferStatus ts = (HixlTransferStatus)77;
  void *ud = NULL;

  TU_ASSERT_STATUS(HixlEngineTransferAsync(NULL, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, NULL, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, "", HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, NULL, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 0, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, -1, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, (HixlTransferOp)9, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, NULL),
                   HIXL_PARAM_INVALID);
  d.len = 0;
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  d = good_desc(0, 64);
  d.local_addr = 0; /* NULL: not the discard sink */
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_READ, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(req, BOGUS_REQ);
  d = good_desc(0, 64);
  d.remote_addr = 0; /* as HIXL answers it */
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("remote_addr is 0");
  CU_ASSERT_PTR_EQUAL(req, BOGUS_REQ);

  /* Status and user data: bad arguments, then a real request. */
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(NULL, BOGUS_REQ, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, NULL, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, BOGUS_REQ, &ts), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(ts, (HixlTransferStatus)77);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(NULL, BOGUS_REQ, &ud), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, NULL, &ud), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, BOGUS_REQ, &ud), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(ud);

  d = good_desc(0, 64);
  req = NULL;
  TU_ASSERT_OK_FATAL(
      HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, 5000, &bogus_object, &req));
  CU_ASSERT_PTR_NOT_NULL_FATAL(req);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, req, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, req, NULL), HIXL_PARAM_INVALID);
  /* A request belongs to the engine that made it. */
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.srv, req, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineGetTransferUserData(g.cli, req, &ud));
  CU_ASSERT_PTR_EQUAL(ud, &bogus_object);
  TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + 5000, &ts));
  CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  /* Released once final. */
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, req, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, req, &ud), HIXL_PARAM_INVALID);
}

/* ---------------------------------------------------------------- notify */

static void test_notify_args(void) {
  char *longs = malloc(HIXL_MAX_NOTIFY_LEN + 2);
  HixlNotifyDesc n = {.name = "name", .msg = "msg", .remote_engine = NULL};
  HixlNotifyDesc *list = NULL;
  size_t count = 0, i;
  int64_t deadline;
  size_t got = 0;

  CU_ASSERT_PTR_NOT_NULL_FATAL(longs);
  memset(longs, 'a', HIXL_MAX_NOTIFY_LEN + 1);
  longs[HIXL_MAX_NOTIFY_LEN + 1] = '\0'; /* 1025 bytes */

  TU_ASSERT_STATUS(HixlEngineSendNotify(NULL, g.srv_name, &n, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, NULL, &n, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, "", &n, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, NULL, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, &n, -1), HIXL_PARAM_INVALID);
  n.name = NULL;
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, &n, 1000), HIXL_PARAM_INVALID);
  n.name = "name";
  n.msg = NULL;
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, &n, 1000), HIXL_PARAM_INVALID);
  n.msg = "msg";
  n.name = longs;
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, &n, 1000), HIXL_PARAM_INVALID);
  n.name = "name";
  n.msg = longs;
  TU_ASSERT_STATUS(HixlEngineSendNotify(g.cli, g.srv_name, &n, 1000), HIXL_PARAM_INVALID);

  /* Exactly HIXL_MAX_NOTIFY_LEN is allowed for each. */
  longs[HIXL_MAX_NOTIFY_LEN] = '\0';
  n.name = longs;
  n.msg = longs;
  TU_ASSERT_OK(HixlEngineSendNotify(g.cli, g.srv_name, &n, 5000));

  TU_ASSERT_STATUS(HixlEngineGetNotifies(NULL, &list, &count), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetNotifies(g.srv, NULL, &count), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetNotifies(g.srv, &list, NULL), HIXL_PARAM_INVALID);
  HixlEngineFreeNotifies(NULL);

  /* The rejected ones never arrived; the 1024-byte one did, once. */
  deadline = tu_now_ms() + 5000;
  while (got == 0 && tu_now_ms() < deadline) {
    TU_ASSERT_OK_FATAL(HixlEngineGetNotifies(g.srv, &list, &count));
    for (i = 0; i < count; i++) {
      CU_ASSERT_EQUAL(strlen(list[i].name), HIXL_MAX_NOTIFY_LEN);
      CU_ASSERT_EQUAL(strlen(list[i].msg), HIXL_MAX_NOTIFY_LEN);
      CU_ASSERT_STRING_EQUAL(list[i].name, longs);
      CU_ASSERT_STRING_EQUAL(list[i].msg, longs);
    }
    got += count;
    if (count == 0) CU_ASSERT_PTR_NULL(list);
    HixlEngineFreeNotifies(list);
    list = NULL;
  }
  CU_ASSERT_EQUAL(got, 1);
  /* Drained: nothing more. */
  TU_ASSERT_OK(HixlEngineGetNotifies(g.srv, &list, &count));
  CU_ASSERT_EQUAL(count, 0);
  CU_ASSERT_PTR_NULL(list);
  HixlEngineFreeNotifies(list);
  free(longs);
}

/* ---------------------------------------------------------------- main */

int main(void) {
  CU_pSuite s;

  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  unsetenv("HCCL_RDMA_TC");
  unsetenv("HCCL_RDMA_SL");

  s = CU_add_suite("status", NULL, NULL);
  CU_add_test(s, "names and strings of every code", test_status_names);
  CU_add_test(s, "unknown codes", test_status_unknown);
  CU_add_test(s, "version string", test_version);
  CU_add_test(s, "last error set on failure", test_last_error_set_on_failure);
  CU_add_test(s, "log level off is quiet", test_log_off_is_quiet);
  CU_add_test(s, "log settings changed while another thread logs", test_log_settings_race);

  s = CU_add_suite("lifecycle", NULL, NULL);
  CU_add_test(s, "NULL engine to create/init/finalize/destroy", test_create_destroy_null);
  CU_add_test(s, "bad local_engine strings", test_init_bad_local_engine);
  CU_add_test(s, "good local_engine strings", test_init_good_local_engine);
  CU_add_test(s, "the progress thread is named hixl-progress", test_progress_thread_named);
  CU_add_test(s, "double Initialize", test_double_initialize);
  CU_add_test(s, "Finalize before Initialize and twice", test_finalize_paths);
  CU_add_test(s, "calls before Initialize and after Finalize", test_calls_before_initialize);
  CU_add_test(s, "Finalize while another thread's Connect handshakes: cut, waited for",
              test_finalize_cuts_connect);
  CU_add_test(s, "Finalize and Initialize again and again while another thread allocates",
              test_finalize_while_alloc);

  s = CU_add_suite("options", NULL, NULL);
  CU_add_test(s, "unknown key", test_option_unknown_key);
  CU_add_test(s, "NULL options, keys, values", test_option_null_fields);
  CU_add_test(s, "BufferPool", test_option_buffer_pool);
  CU_add_test(s, "RdmaTrafficClass", test_option_traffic_class);
  CU_add_test(s, "RdmaServiceLevel", test_option_service_level);
  CU_add_test(s, "RdmaTimeout and RdmaRetryCount", test_option_rdma_timeout_retry);
  CU_add_test(s, "SocketBufferKiB: parsed, and both ends of a link get it", test_option_socket_buffer);
  CU_add_test(s, "PollUs: parsed; the target takes back-to-back requests while it polls", test_option_poll);
  CU_add_test(s, "PollUs: windows that catch nothing are skipped, doubling", test_option_poll_backoff);
  CU_add_test(s, "PollUs: a yield that another thread took the CPU in stops polling",
              test_option_poll_contended);
  CU_add_test(s, "Transport", test_option_transport);
  CU_add_test(s, "several options", test_option_several);
  CU_add_test(s, "env HCCL_RDMA_TC/SL and precedence", test_env_precedence);

  s = CU_add_suite("live pair", live_init, live_cleanup);
  CU_add_test(s, "RegisterMem arguments", test_register_args);
  CU_add_test(s, "RegisterMem: host memory peers cannot read and write refused", test_register_unmapped);
  CU_add_test(s, "RegisterMem overlapping ranges", test_register_overlap);
  CU_add_test(s, "DeregisterMem arguments", test_deregister_args);
  CU_add_test(s, "Connect arguments", test_connect_args);
  CU_add_test(s, "Disconnect arguments", test_disconnect_args);
  CU_add_test(s, "TransferSync arguments", test_transfer_sync_args);
  CU_add_test(s, "TransferAsync and status arguments", test_transfer_async_args);
  CU_add_test(s, "SendNotify and GetNotifies arguments", test_notify_args);

  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
