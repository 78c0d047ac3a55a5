/* test_shm: the same-host transport (process_vm_writev / process_vm_readv).
 *  - two engines of one process: a link to itself is refused (issue 27): Transport
 *    shm fails Connect saying so, auto links over tcp and moves the data;
 *  - the correctness matrix with Transport shm, a target in a child process whose
 *    memory is shared with this one so that every byte can be checked here: sizes
 *    1 B to 64 MiB, batches up to 4096 ops (scattered, and adjacent ones that become
 *    one iovec), mixed, async;
 *  - ranges outside the target's registered table refused, memory untouched;
 *  - async copies: queued ones past their deadline end TIMEOUT, Deregister refuses
 *    while copies are in flight, Disconnect ends them, four threads at once;
 *  - a target killed mid-transfer: FAILED, no hang, NOT_CONNECTED, Connect works again;
 *  - hostile peers (issue 27): fake targets naming this process, or a pid that is not
 *    the one behind the unix socket they name, get no same-host copies (auto: tcp,
 *    and a WRITE aimed at the memory they list lands nothing; shm: Connect fails with
 *    the reason); a target refuses an SHM_HELLO naming its own pid, and its socket
 *    takes no connection but the named pid's;
 *  - which transport a link takes: auto picks shm for a peer on this host;
 *  - the kernel refusing process_vm_* for real (children of two users; a
 *    non-dumpable target): auto falls back to tcp and data moves, shm fails Connect
 *    with the reason. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "raw_auth.h"
#include "test_util.h"
#include "transport/shm/shm_int.h"
#include "util/cma.h"
#include "wire/wire.h"

#define KiB          ((size_t)1 << 10)
#define MiB          ((size_t)1 << 20)
#define REG_LEN      (64 * MiB + 64 * KiB) /* registered bytes of each big buffer */
#define SLACK        MiB                   /* unregistered bytes mapped after (and before) it */
#define XFER_TIMEOUT 30000
#define READY_MS     10000
#define INIT_FLAG    "--shm-initiator-child"
#define USER_A       65501 /* unprivileged users the refusal tests run children as */
#define USER_B       65502

/* A client engine linked to a target, and this process's view of the target's
 * registered memory (the same bytes: one process, or a shared mapping). */
typedef struct {
  HixlEngine *cli;
  char name[TU_ADDR_LEN];   /* the target engine */
  unsigned char *rview;     /* the target's registered memory, seen from here */
  uint64_t raddr;           /* the same memory in the target's address space */
  size_t rlen;              /* registered bytes */
  unsigned char *src, *dst; /* REG_LEN each, registered with cli */
  HixlMemHandle src_h, dst_h;
} pair;

static struct {
  pair one; /* two engines in this process */
  HixlEngine *srv;
  unsigned char *srv_base, *src_base, *dst_base; /* SLACK + REG_LEN + SLACK each */
  HixlMemHandle srv_h;
  pair two; /* target in a child */
  tu_child child;
  tu_shm shm; /* the child's memory: REG_LEN + SLACK, REG_LEN registered */
  uint16_t child_port;
} g;

static HixlTransferOpDesc desc(const void *local, uint64_t remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = remote, .len = len};
  return d;
}

static HixlStatus xfer(pair *p, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  return HixlEngineTransferSync(p->cli, p->name, op, d, n, XFER_TIMEOUT);
}

static HixlTransferStatus wait_req(HixlEngine *e, HixlTransferReq req, int ms) {
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  TU_ASSERT_OK(tu_wait_request(e, req, tu_now_ms() + ms, &ts));
  return ts;
}

/* Local buffers for a pair: SLACK on each side of a REG_LEN registration. */
static int local_init(pair *p) {
  g.src_base = tu_alloc_mem(REG_LEN + 2 * SLACK, false);
  g.dst_base = tu_alloc_mem(REG_LEN + 2 * SLACK, false);
  if (!g.src_base || !g.dst_base) return -1;
  p->src = g.src_base + SLACK;
  p->dst = g.dst_base + SLACK;
  p->src_h = tu_register(p->cli, p->src, REG_LEN);
  p->dst_h = tu_register(p->cli, p->dst, REG_LEN);
  return p->src_h && p->dst_h ? 0 : -1;
}

static void local_fini(void) {
  tu_free_mem(g.src_base, REG_LEN + 2 * SLACK);
  tu_free_mem(g.dst_base, REG_LEN + 2 * SLACK);
  g.src_base = g.dst_base = NULL;
}

/* ---------------------------------------------------------------- the matrix */

/* WRITE len bytes from src+loff to the target at roff, check them and the guard bytes
 * around them, then READ them back into dst+doff and check that too. */
static void write_read_back(pair *p, size_t len, size_t loff, size_t roff, size_t doff, uint64_t seed) {
  unsigned char *src = p->src + loff, *rv = p->rview + roff, *dst = p->dst + doff;
  const size_t guard = 16;
  HixlTransferOpDesc d;
  char what[96];

  CU_ASSERT_FATAL(loff + len <= REG_LEN && roff + len + guard <= p->rlen && doff + len + guard <= REG_LEN &&
                  roff >= guard && doff >= guard);
  tu_fill(src, len, seed);
  memset(rv - guard, 0xEE, len + 2 * guard);
  memset(dst - guard, 0x00, len + 2 * guard);
  d = desc(src, p->raddr + roff, len);
  TU_ASSERT_OK(xfer(p, HIXL_WRITE, &d, 1));
  snprintf(what, sizeof(what), "WRITE %zu B: target memory", len);
  TU_ASSERT_PATTERN(rv, len, seed, what);
  if (tu_check_byte(rv - guard, guard, 0xEE) >= 0 || tu_check_byte(rv + len, guard, 0xEE) >= 0)
    tu_fail(__FILE__, __LINE__, "WRITE %zu B: bytes next to the target range changed", len);
  d = desc(dst, p->raddr + roff, len);
  TU_ASSERT_OK(xfer(p, HIXL_READ, &d, 1));
  snprintf(what, sizeof(what), "READ %zu B: read back", len);
  TU_ASSERT_PATTERN(dst, len, seed, what);
  if (tu_check_byte(dst - guard, guard, 0) >= 0 || tu_check_byte(dst + len, guard, 0) >= 0)
    tu_fail(__FILE__, __LINE__, "READ %zu B: bytes next to the local range changed", len);
}

static void matrix_sizes(pair *p) {
  const size_t sizes[] = {1, 7, 4 * KiB, 64 * KiB + 3, 256 * KiB, MiB, 5 * MiB + 1, 64 * MiB};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    write_read_back(p, sizes[i], 0, 16, 16, 100 + i);  /* aligned */
    write_read_back(p, sizes[i], 13, 29, 41, 200 + i); /* every side unaligned */
  }
}

/* n ops of random lengths in [1, 1024]: local slots in order, remote slots shuffled,
 * read back into slots shuffled another way; unused remote slots must stay intact. */
static void scattered_batch(pair *p, size_t n, uint64_t seed) {
  enum { SLOTS = 4096, SLOT = 1024 };
  size_t *rperm = malloc(SLOTS * sizeof(size_t)), *dperm = malloc(SLOTS * sizeof(size_t));
  size_t *lens = malloc(n * sizeof(size_t));
  HixlTransferOpDesc *d = malloc(n * sizeof(*d));
  unsigned char *used = calloc(SLOTS, 1);
  uint64_t rs = seed;
  size_t i, j, t;

  CU_ASSERT_FATAL(rperm && dperm && lens && d && used && n <= SLOTS);
  for (i = 0; i < SLOTS; i++) rperm[i] = dperm[i] = i;
  for (i = SLOTS - 1; i > 0; i--) {
    j = tu_rand(&rs) % (i + 1);
    t = rperm[i], rperm[i] = rperm[j], rperm[j] = t;
    j = tu_rand(&rs) % (i + 1);
    t = dperm[i], dperm[i] = dperm[j], dperm[j] = t;
  }
  tu_fill(p->src, (size_t)SLOTS * SLOT, seed);
  memset(p->rview, 0xEE, (size_t)SLOTS * SLOT);
  memset(p->dst, 0, (size_t)SLOTS * SLOT);
  for (i = 0; i < n; i++) {
    lens[i] = 1 + tu_rand(&rs) % SLOT;
    d[i] = desc(p->src + i * SLOT, p->raddr + rperm[i] * SLOT, lens[i]);
    used[rperm[i]] = 1;
  }
  TU_ASSERT_OK(xfer(p, HIXL_WRITE, d, n));
  for (i = 0; i < n; i++)
    if (tu_mismatch(p->rview + rperm[i] * SLOT, p->src + i * SLOT, lens[i]) >= 0 ||
        tu_check_byte(p->rview + rperm[i] * SLOT + lens[i], SLOT - lens[i], 0xEE) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu WRITE op %zu (len %zu) landed wrong", n, i, lens[i]);
      break;
    }
  for (i = 0; i < SLOTS; i++)
    if (!used[i] && tu_check_byte(p->rview + i * SLOT, SLOT, 0xEE) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu WRITE touched unused slot %zu", n, i);
      break;
    }
  for (i = 0; i < n; i++) d[i] = desc(p->dst + dperm[i] * SLOT, p->raddr + rperm[i] * SLOT, lens[i]);
  TU_ASSERT_OK(xfer(p, HIXL_READ, d, n));
  for (i = 0; i < n; i++)
    if (tu_mismatch(p->dst + dperm[i] * SLOT, p->src + i * SLOT, lens[i]) >= 0 ||
        tu_check_byte(p->dst + dperm[i] * SLOT + lens[i], SLOT - lens[i], 0) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu READ op %zu (len %zu) landed wrong", n, i, lens[i]);
      break;
    }
  CU_PASS("batch checked");
  free(used);
  free(d);
  free(lens);
  free(dperm);
  free(rperm);
}

static void matrix_batches(pair *p) {
  scattered_batch(p, 1, 11);
  scattered_batch(p, 16, 12);
  scattered_batch(p, 1024, 13);
  scattered_batch(p, 4096, 14);
}

/* 4096 ops of 4 KiB whose ranges touch on one side, the other or both (the engine
 * then hands the kernel one iovec for many ops), and ops that touch but come in
 * reverse order (which must not merge). Remote block i gets local block perm(i). */
static void adjacent_batch(pair *p, int layout, uint64_t seed) {
  enum { N = 4096, B = 4096 };
  static HixlTransferOpDesc d[N];
  static const char *const names[] = {"both sides adjacent", "remote adjacent, local reversed",
                                      "local adjacent, remote reversed", "pairs adjacent, pairs apart",
                                      "one 16 MiB op cut in 4096, reversed"};
  size_t i, l, r;

  tu_fill(p->src, (size_t)N * B * 2, seed);
  memset(p->rview, 0xEE, (size_t)N * B * 2);
  for (i = 0; i < N; i++) {
    switch (layout) {
    case 0: l = r = i; break;
    case 1: l = N - 1 - i, r = i; break;
    case 2: l = i, r = N - 1 - i; break;
    case 3: l = r = (i / 2) * 4 + i % 2; break; /* blocks 0 1, 4 5, 8 9 ... */
    default: l = r = N - 1 - i; break;
    }
    d[i] = desc(p->src + l * B, p->raddr + r * B, B);
  }
  TU_ASSERT_OK(xfer(p, HIXL_WRITE, d, N));
  for (i = 0; i < N; i++)
    if (tu_mismatch(p->rview + (d[i].remote_addr - p->raddr), (void *)(uintptr_t)d[i].local_addr, B) >= 0) {
      tu_fail(__FILE__, __LINE__, "%s: WRITE op %zu landed wrong", names[layout], i);
      break;
    }
  if (layout == 3)
    for (i = 0; i < N / 2; i++)
      if (tu_check_byte(p->rview + (i * 4 + 2) * B, 2 * B, 0xEE) >= 0) {
        tu_fail(__FILE__, __LINE__, "%s: WRITE touched the gap after pair %zu", names[layout], i);
        break;
      }
  memset(p->dst, 0, (size_t)N * B * 2);
  for (i = 0; i < N; i++) d[i].local_addr = d[i].local_addr - (uintptr_t)p->src + (uintptr_t)p->dst;
  TU_ASSERT_OK(xfer(p, HIXL_READ, d, N));
  for (i = 0; i < N; i++)
    if (tu_mismatch((void *)(uintptr_t)d[i].local_addr, p->rview + (d[i].remote_addr - p->raddr), B) >= 0) {
      tu_fail(__FILE__, __LINE__, "%s: READ op %zu landed wrong", names[layout], i);
      break;
    }
  CU_PASS(names[layout]);
}

static void matrix_adjacent(pair *p) {
  for (int layout = 0; layout < 5; layout++) adjacent_batch(p, layout, 50 + (uint64_t)layout);
}

/* Big and tiny ops in one batch, some of them touching across the 1 MiB split. */
static void matrix_mixed(pair *p) {
  const size_t lens[] = {9 * MiB + 5, 1, 4 * MiB, 3, 64 * KiB, 17 * MiB + 1, 100, 4 * MiB - 1};
  enum { N = sizeof(lens) / sizeof(lens[0]) };
  HixlTransferOpDesc d[N];
  size_t i, lo[N], ro[N], loff = 0, roff = 0;

  for (i = 0; i < N; i++) { /* local packed tight (ops touch), remote reversed with gaps */
    lo[i] = loff;
    loff += lens[i];
  }
  for (i = N; i-- > 0;) {
    ro[i] = roff;
    roff += lens[i] + 13;
  }
  CU_ASSERT_FATAL(loff <= REG_LEN && roff <= p->rlen);
  memset(p->rview, 0, roff);
  for (i = 0; i < N; i++) {
    tu_fill(p->src + lo[i], lens[i], 300 + i);
    d[i] = desc(p->src + lo[i], p->raddr + ro[i], lens[i]);
  }
  TU_ASSERT_OK(xfer(p, HIXL_WRITE, d, N));
  for (i = 0; i < N; i++) TU_ASSERT_PATTERN(p->rview + ro[i], lens[i], 300 + i, "mixed batch WRITE");
  memset(p->dst, 0, loff);
  for (i = 0; i < N; i++) d[i] = desc(p->dst + lo[i], p->raddr + ro[i], lens[i]);
  TU_ASSERT_OK(xfer(p, HIXL_READ, d, N));
  for (i = 0; i < N; i++) TU_ASSERT_PATTERN(p->dst + lo[i], lens[i], 300 + i, "mixed batch READ");
}

/* One small async op (its submitter copies it), one large (the progress thread), and
 * 32 requests of 16 ops in flight at once. */
static void matrix_async(pair *p) {
  enum { NREQ = 32, OPS = 16 };
  const size_t blk = 64 * KiB + 1, stride = 80 * KiB, sizes[] = {4 * KiB, 9 * MiB + 7};
  HixlTransferOpDesc d[OPS];
  HixlTransferReq req[NREQ];
  HixlTransferStatus ts;
  void *ud;
  size_t r, i, at;
  int tag = 7;

  for (i = 0; i < 2; i++) {
    tu_fill(p->src, sizes[i], 400 + i);
    memset(p->rview, 0, sizes[i] + 64);
    d[0] = desc(p->src, p->raddr + 5, sizes[i]);
    req[0] = NULL;
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p->cli, p->name, HIXL_WRITE, d, 1, XFER_TIMEOUT, &tag, req));
    TU_ASSERT_OK(HixlEngineGetTransferUserData(p->cli, req[0], &ud));
    CU_ASSERT_PTR_EQUAL(ud, &tag);
    CU_ASSERT_EQUAL(wait_req(p->cli, req[0], XFER_TIMEOUT), HIXL_TRANSFER_COMPLETED);
    TU_ASSERT_STATUS(HixlEngineGetTransferStatus(p->cli, req[0], &ts), HIXL_PARAM_INVALID);
    TU_ASSERT_PATTERN(p->rview + 5, sizes[i], 400 + i, "async WRITE");
    CU_ASSERT_EQUAL(tu_check_byte(p->rview + 5 + sizes[i], 59, 0), -1);
    memset(p->dst, 0, sizes[i]);
    d[0] = desc(p->dst, p->raddr + 5, sizes[i]);
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p->cli, p->name, HIXL_READ, d, 1, 0, NULL, req));
    CU_ASSERT_EQUAL(wait_req(p->cli, req[0], XFER_TIMEOUT), HIXL_TRANSFER_COMPLETED);
    TU_ASSERT_PATTERN(p->dst, sizes[i], 400 + i, "async READ");
  }

  tu_fill(p->src, (size_t)NREQ * OPS * stride, 501);
  memset(p->rview, 0, (size_t)NREQ * OPS * stride);
  for (r = 0; r < NREQ; r++) {
    for (i = 0; i < OPS; i++) {
      at = (r * OPS + i) * stride;
      d[i] = desc(p->src + at, p->raddr + at, blk);
    }
    req[r] = NULL;
    TU_ASSERT_OK(HixlEngineTransferAsync(p->cli, p->name, HIXL_WRITE, d, OPS, XFER_TIMEOUT,
                                         (void *)(uintptr_t)(r + 1), &req[r]));
  }
  for (r = 0; r < NREQ; r++) {
    if (!req[r]) continue;
    TU_ASSERT_OK(HixlEngineGetTransferUserData(p->cli, req[r], &ud));
    CU_ASSERT_EQUAL((uintptr_t)ud, r + 1);
    CU_ASSERT_EQUAL(wait_req(p->cli, req[r], XFER_TIMEOUT), HIXL_TRANSFER_COMPLETED);
  }
  for (r = 0; r < NREQ * OPS; r++) {
    at = r * stride;
    if (tu_mismatch(p->rview + at, p->src + at, blk) >= 0 ||
        tu_check_byte(p->rview + at + blk, stride - blk, 0) >= 0) {
      tu_fail(__FILE__, __LINE__, "async many: op %zu landed wrong", r);
      break;
    }
  }
}

/* ---------------------------------------------------------------- one process */

/* Two engines of one process: a link to itself is refused (issue 27). Transport shm
 * fails Connect naming why; auto links over tcp and moves the data. */
static int one_init(void) {
  pair *p = &g.one;
  tu_addr(p->name, sizeof(p->name), tu_free_port());
  g.srv = tu_engine_start_with(p->name, NULL);
  g.srv_base = tu_alloc_mem(REG_LEN + 2 * SLACK, false);
  if (!g.srv || !g.srv_base) return -1;
  p->rview = g.srv_base + SLACK;
  p->raddr = (uintptr_t)p->rview;
  p->rlen = REG_LEN;
  return (g.srv_h = tu_register(g.srv, p->rview, REG_LEN)) ? 0 : -1;
}

static int one_cleanup(void) {
  int rc = 0;
  if (g.one.cli && HixlEngineDestroy(g.one.cli) != HIXL_SUCCESS) rc = -1;
  if (g.srv && HixlEngineDestroy(g.srv) != HIXL_SUCCESS) rc = -1;
  tu_free_mem(g.srv_base, REG_LEN + 2 * SLACK);
  local_fini();
  memset(&g.one, 0, sizeof(g.one));
  g.srv = NULL;
  g.srv_base = NULL;
  return rc;
}

static void test_one_shm_refused(void) {
  pair *p = &g.one;
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  TU_ASSERT_STATUS(HixlEngineConnect(e, p->name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("a link within one process is taken only on an authenticated link");
  printf("  [%s]\n", HixlGetLastErrorMessage());
  TU_ASSERT_STATUS(HixlEngineDisconnect(e, p->name, 1000), HIXL_NOT_CONNECTED);
  HixlEngineDestroy(e);
}

static void test_one_auto_tcp(void) {
  pair *p = &g.one;
  struct hixl_link_info li;
  CU_ASSERT_PTR_NOT_NULL_FATAL(p->cli = tu_engine_start_with(tu_ip(), "auto"));
  CU_ASSERT_FATAL(local_init(p) == 0);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p->cli, p->name, 5000));
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(p->cli, p->name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
  CU_ASSERT_EQUAL(li.peer_pid, 0);
  write_read_back(p, 5 * MiB + 1, 13, 29, 41, 600);
}

/* Target memory holds pattern 601 (and the slack after it 603); a refused op must
 * leave all of it, and for READ the local buffer, untouched. */
static void expect_refused(pair *p, HixlTransferOp op, uint64_t remote, size_t len, const char *what) {
  unsigned char *after = p->rview + REG_LEN;
  HixlTransferOpDesc d = desc(op == HIXL_WRITE ? p->src : p->dst, remote, len);
  HixlTransferReq req = NULL;
  HixlStatus st;

  tu_fill(p->src, 64 * KiB, 604);
  memset(p->dst, 0xAB, 64 * KiB);
  st = xfer(p, op, &d, 1);
  if (st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "sync %s %s: got %s, want HIXL_FAILED", op == HIXL_WRITE ? "WRITE" : "READ",
            what, HixlStatusName(st));
  else
    TU_ASSERT_ERRMSG_HAS("not inside memory registered");
  st = HixlEngineTransferAsync(p->cli, p->name, op, &d, 1, XFER_TIMEOUT, NULL, &req);
  if (st == HIXL_SUCCESS) {
    CU_ASSERT_EQUAL(wait_req(p->cli, req, XFER_TIMEOUT), HIXL_TRANSFER_FAILED);
  } else {
    TU_ASSERT_STATUS(st, HIXL_FAILED);
  }
  if (tu_check_pattern(p->rview, REG_LEN, 601) >= 0 || tu_check_pattern(after, SLACK, 603) >= 0) {
    tu_fail(__FILE__, __LINE__, "%s: target memory changed", what);
    tu_fill(p->rview, REG_LEN, 601);
    tu_fill(after, SLACK, 603);
  }
  if (len <= 64 * KiB && tu_check_byte(p->dst, 64 * KiB, 0xAB) >= 0)
    tu_fail(__FILE__, __LINE__, "%s: local destination written", what);
}

/* Bytes after the child's registration are mapped in the child (and seen here) but
 * unregistered: every op reaching outside the table is refused, sync or async, and a
 * batch with one such op is refused whole before anything is copied. */
static void test_two_out_of_range(void) {
  pair *p = &g.two;
  uint64_t end = p->raddr + REG_LEN;
  HixlTransferOpDesc d[2];

  tu_fill(p->rview, REG_LEN, 601);
  tu_fill(p->rview + REG_LEN, SLACK, 603);
  for (int op = HIXL_READ; op <= HIXL_WRITE; op++) {
    expect_refused(p, op, end - 10, 20, "straddling the end");
    expect_refused(p, op, end, 1, "just past the end");
    expect_refused(p, op, end + 4096, 100, "in the child's unregistered memory");
    expect_refused(p, op, p->raddr - 1, 2, "straddling the start");
    expect_refused(p, op, p->raddr - 4096, 16, "before the start");
    expect_refused(p, op, p->raddr + 1, REG_LEN, "one byte too long");
    expect_refused(p, op, 0x1000, 8, "at 0x1000");
  }
  d[0] = desc(p->src, p->raddr, 4 * KiB);
  d[1] = desc(p->src + 4 * KiB, end - 100, 4 * KiB);
  TU_ASSERT_STATUS(xfer(p, HIXL_WRITE, d, 2), HIXL_FAILED);
  TU_ASSERT_PATTERN(p->rview, REG_LEN, 601, "child memory after a refused batch");
  TU_ASSERT_PATTERN(p->rview + REG_LEN, SLACK, 603, "unregistered child memory");
  write_read_back(p, 256 * KiB + 3, 1, 17, 33, 606); /* the link is unharmed */
}

/* Wait until no copy touches the local buffers any more (a step that was running when
 * its request ended finishes on its own), then register them afresh. */
static void drain_local(pair *p) {
  int64_t deadline = tu_now_ms() + 5000;
  HixlMemHandle *hs[2] = {&p->src_h, &p->dst_h};
  unsigned char *ms[2] = {p->src, p->dst};
  for (int i = 0; i < 2; i++) {
    HixlStatus st;
    while ((st = HixlEngineDeregisterMem(p->cli, *hs[i])) == HIXL_FAILED && tu_now_ms() < deadline)
      sched_yield();
    TU_ASSERT_STATUS(st, HIXL_SUCCESS);
    *hs[i] = tu_register(p->cli, ms[i], REG_LEN);
    CU_ASSERT_PTR_NOT_NULL_FATAL(*hs[i]);
  }
}

/* 4 GiB in 4096 ops of 1 MiB over the first 32 MiB of each side: long enough that
 * requests submitted after it wait in the queue. */
static HixlTransferReq submit_big(pair *p, HixlTransferOp op, int32_t timeout_ms) {
  enum { N = 4096 };
  static HixlTransferOpDesc d[N];
  HixlTransferReq req = NULL;
  for (size_t i = 0; i < N; i++) d[i] = desc(p->src + (i % 32) * MiB, p->raddr + (i % 32) * MiB, MiB);
  TU_ASSERT_OK(HixlEngineTransferAsync(p->cli, p->name, op, d, N, timeout_ms, NULL, &req));
  return req;
}

/* A request queued behind a long copy ends TIMEOUT without touching memory; the copy
 * in front of it completes. One that times out while its own copy runs is reported
 * TIMEOUT and released; what was running finishes, the rest is dropped. */
static void test_two_async_timeouts(void) {
  pair *p = &g.two;
  HixlTransferReq big, small;
  HixlTransferStatus ts;
  HixlTransferOpDesc d = desc(p->src + 40 * MiB, p->raddr + 48 * MiB, 256 * KiB);
  int64_t t0;

  tu_fill(p->src, 48 * MiB, 621);
  memset(p->rview + 48 * MiB, 0xEE, 256 * KiB);
  big = submit_big(p, HIXL_WRITE, XFER_TIMEOUT);
  CU_ASSERT_PTR_NOT_NULL_FATAL(big);
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p->cli, p->name, HIXL_WRITE, &d, 1, 1, NULL, &small));
  t0 = tu_now_ms();
  CU_ASSERT_EQUAL(wait_req(p->cli, small, 5000), HIXL_TRANSFER_TIMEOUT);
  CU_ASSERT(tu_now_ms() - t0 < 1000);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(p->cli, small, &ts), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(wait_req(p->cli, big, XFER_TIMEOUT), HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_PATTERN(p->rview, 32 * MiB, 621, "target after the long copy");
  CU_ASSERT_EQUAL(tu_check_byte(p->rview + 48 * MiB, 256 * KiB, 0xEE), -1);

  /* Times out while copying: TIMEOUT on time, then the engine drains it. */
  big = submit_big(p, HIXL_READ, 50);
  CU_ASSERT_PTR_NOT_NULL_FATAL(big);
  t0 = tu_now_ms();
  CU_ASSERT_EQUAL(wait_req(p->cli, big, 5000), HIXL_TRANSFER_TIMEOUT);
  CU_ASSERT(tu_now_ms() - t0 < 1000);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(p->cli, big, &ts), HIXL_PARAM_INVALID);
  drain_local(p);
  write_read_back(p, MiB, 0, 16, 16, 622); /* the link still works */
}

/* Local memory cannot be deregistered while a copy touches it; afterwards it can. */
static void test_two_deregister_in_flight(void) {
  pair *p = &g.two;
  HixlTransferReq big = submit_big(p, HIXL_WRITE, XFER_TIMEOUT);
  CU_ASSERT_PTR_NOT_NULL_FATAL(big);
  TU_ASSERT_STATUS(HixlEngineDeregisterMem(p->cli, p->src_h), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("in flight");
  CU_ASSERT_EQUAL(wait_req(p->cli, big, XFER_TIMEOUT), HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_OK(HixlEngineDeregisterMem(p->cli, p->src_h));
  p->src_h = tu_register(p->cli, p->src, REG_LEN);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p->src_h);
}

/* Disconnect while copies are queued: they end FAILED at once, nothing hangs, and a
 * new Connect links over shm again. */
static void test_two_disconnect_in_flight(void) {
  pair *p = &g.two;
  struct hixl_link_info li;
  HixlTransferReq big = submit_big(p, HIXL_WRITE, XFER_TIMEOUT);
  HixlTransferOpDesc d = desc(p->src, p->raddr, 4096);
  int64_t t0 = tu_now_ms();
  CU_ASSERT_PTR_NOT_NULL_FATAL(big);
  TU_ASSERT_OK(HixlEngineDisconnect(p->cli, p->name, 1000));
  CU_ASSERT_EQUAL(wait_req(p->cli, big, 5000), HIXL_TRANSFER_FAILED);
  CU_ASSERT(tu_now_ms() - t0 < 1000);
  TU_ASSERT_STATUS(xfer(p, HIXL_WRITE, &d, 1), HIXL_NOT_CONNECTED);
  drain_local(p);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p->cli, p->name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(p->cli, p->name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  write_read_back(p, 3 * MiB + 1, 3, 16, 16, 631);
}

/* Four threads copying on one link at once, sync and async, each on its own ranges. */
enum { NTHREADS = 4, ROUNDS = 10 };
#define THREAD_SPAN (8 * MiB)
struct worker {
  pthread_t th;
  int idx;
  int failed_round; /* -1: none */
  const char *what;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  pair *p = &g.two;
  size_t base = (size_t)w->idx * THREAD_SPAN;
  HixlTransferOpDesc *d = malloc(2048 * sizeof(*d));
  w->failed_round = -1;
  for (int r = 0; r < ROUNDS && d; r++) {
    size_t blk = (size_t)4096 << (r % 6), n = THREAD_SPAN / blk;
    HixlTransferReq req = NULL;
    HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
    HixlStatus st;
    tu_fill(p->src + base, THREAD_SPAN, 700 + (uint64_t)w->idx * 100 + (uint64_t)r);
    for (size_t i = 0; i < n; i++)
      d[i] = desc(p->src + base + i * blk, p->raddr + base + (n - 1 - i) * blk, blk);
    if (r % 2 == 0) {
      st = HixlEngineTransferSync(p->cli, p->name, HIXL_WRITE, d, n, XFER_TIMEOUT);
    } else {
      st = HixlEngineTransferAsync(p->cli, p->name, HIXL_WRITE, d, n, XFER_TIMEOUT, NULL, &req);
      if (st == HIXL_SUCCESS) st = tu_wait_request(p->cli, req, tu_now_ms() + XFER_TIMEOUT, &ts);
      if (st == HIXL_SUCCESS && ts != HIXL_TRANSFER_COMPLETED) st = HIXL_FAILED;
    }
    if (st != HIXL_SUCCESS) {
      w->failed_round = r, w->what = "WRITE";
      break;
    }
    for (size_t i = 0; i < n; i++) d[i].local_addr = (uintptr_t)p->dst + base + i * blk;
    memset(p->dst + base, 0, THREAD_SPAN);
    if (HixlEngineTransferSync(p->cli, p->name, HIXL_READ, d, n, XFER_TIMEOUT) != HIXL_SUCCESS) {
      w->failed_round = r, w->what = "READ";
      break;
    }
    if (tu_mismatch(p->dst + base, p->src + base, THREAD_SPAN) >= 0) {
      w->failed_round = r, w->what = "read-back data";
      break;
    }
  }
  if (!d) w->failed_round = 0, w->what = "malloc";
  free(d);
  return NULL;
}

static void test_two_threads(void) {
  struct worker w[NTHREADS];
  memset(w, 0, sizeof(w));
  for (int i = 0; i < NTHREADS; i++) {
    w[i].idx = i;
    CU_ASSERT_FATAL(pthread_create(&w[i].th, NULL, worker_main, &w[i]) == 0);
  }
  for (int i = 0; i < NTHREADS; i++) pthread_join(w[i].th, NULL);
  for (int i = 0; i < NTHREADS; i++)
    if (w[i].failed_round >= 0)
      tu_fail(__FILE__, __LINE__, "thread %d round %d: %s failed", i, w[i].failed_round, w[i].what);
    else
      CU_PASS("thread ok");
}

/* ---------------------------------------------------------------- two processes */

static bool child_start(tu_child *c, uint16_t port, const tu_shm *shm, size_t mem_len, const char *transport,
                        tu_server_ready *info) {
  tu_server_cfg cfg = {.port = port, .mem_len = mem_len, .shared = shm, .seed = 0, .transport = transport};
  if (tu_server_start(c, &cfg, info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "server child on port %u did not start: %s (%s)", (unsigned)port,
            HixlStatusName(info->status), info->error);
    return false;
  }
  return true;
}

static int two_init(void) {
  pair *p = &g.two;
  tu_server_ready info;
  g.child_port = tu_free_port();
  tu_addr(p->name, sizeof(p->name), g.child_port);
  if (tu_shm_create(&g.shm, REG_LEN + SLACK) != 0) return -1;
  if (!(p->cli = tu_engine_start_with(tu_ip(), "shm")) || local_init(p) != 0) return -1;
  if (!child_start(&g.child, g.child_port, &g.shm, REG_LEN, "shm", &info)) return -1;
  p->rview = g.shm.mem;
  p->raddr = info.addr;
  p->rlen = REG_LEN;
  return HixlEngineConnect(p->cli, p->name, 5000) == HIXL_SUCCESS ? 0 : -1;
}

static int two_cleanup(void) {
  int rc = 0;
  if (g.two.cli && HixlEngineDestroy(g.two.cli) != HIXL_SUCCESS) rc = -1;
  if (g.child.pid > 0) tu_child_stop(&g.child, 10000);
  tu_shm_destroy(&g.shm);
  local_fini();
  memset(&g.two, 0, sizeof(g.two));
  return rc;
}

static void test_two_link(void) {
  struct hixl_link_info li;
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(g.two.cli, g.two.name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)g.child.pid);
}
static void test_two_sizes(void) { matrix_sizes(&g.two); }
static void test_two_batches(void) { matrix_batches(&g.two); }
static void test_two_adjacent(void) { matrix_adjacent(&g.two); }
static void test_two_mixed(void) { matrix_mixed(&g.two); }
static void test_two_async(void) { matrix_async(&g.two); }

/* ---------------------------------------------------------------- peer killed */

#define KILL_OPS  1024 /* of 4 MiB over 64 MiB: 4 GiB, far more than moves before the kill */
#define KILL_OP   (4 * MiB)
#define PROMPT_MS 3000

struct sync_arg {
  pair *p;
  HixlTransferOp op;
  HixlTransferOpDesc *d;
  HixlStatus st;
  int64_t t_end;
  char err[512];
};

static void *sync_thread(void *arg) {
  struct sync_arg *a = arg;
  a->st = HixlEngineTransferSync(a->p->cli, a->p->name, a->op, a->d, KILL_OPS, XFER_TIMEOUT);
  a->t_end = tu_now_ms();
  snprintf(a->err, sizeof(a->err), "%s", HixlGetLastErrorMessage());
  return NULL;
}

/* The child is killed with SIGKILL once data is seen moving: the transfer ends FAILED
 * promptly (not at its timeout), later ones are NOT_CONNECTED, and a new child on the
 * same port is reachable with Connect. */
static void kill_mid_transfer(HixlTransferOp op, bool async) {
  pair *p = &g.two;
  static HixlTransferOpDesc d[KILL_OPS];
  const char *name =
      op == HIXL_WRITE ? (async ? "async WRITE" : "sync WRITE") : (async ? "async READ" : "sync READ");
  struct sync_arg sa = {.p = p, .op = op, .d = d, .st = 0xdead};
  struct hixl_link_info li;
  tu_server_ready info;
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlTransferOpDesc one = desc(p->src, p->raddr, 4096);
  pthread_t th;
  int64_t t_kill, t_end;
  int ws;

  if (op == HIXL_WRITE) {
    tu_fill(p->src, 64 * MiB, 651);
    memset(p->rview, 0, 64 * MiB);
  } else {
    memset(p->dst, 0, 64 * MiB);
    tu_fill(p->rview, 64 * MiB, 652);
  }
  /* A fresh child (the previous one was killed, or is the suite's). */
  if (g.child.pid > 0) tu_child_stop(&g.child, 10000);
  HixlEngineDisconnect(p->cli, p->name, 1000);
  if (!child_start(&g.child, g.child_port, &g.shm, REG_LEN, "shm", &info)) return;
  p->raddr = info.addr;
  TU_ASSERT_OK(HixlEngineConnect(p->cli, p->name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(p->cli, p->name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  for (size_t i = 0; i < KILL_OPS; i++) {
    size_t off = (i % 16) * KILL_OP;
    d[i] = desc((op == HIXL_WRITE ? p->src : p->dst) + off, p->raddr + off, KILL_OP);
  }
  if (async)
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p->cli, p->name, op, d, KILL_OPS, XFER_TIMEOUT, NULL, &req));
  else
    CU_ASSERT_FATAL(pthread_create(&th, NULL, sync_thread, &sa) == 0);
  if (!tu_wait_nonzero(op == HIXL_WRITE ? p->rview : p->dst, 64 * MiB, KILL_OP, 1, tu_now_ms() + 10000))
    tu_fail(__FILE__, __LINE__, "%s: no data moved within 10 s", name);
  tu_child_kill(&g.child, SIGKILL);
  t_kill = tu_now_ms();
  if (async) {
    ts = wait_req(p->cli, req, XFER_TIMEOUT + 2000);
    t_end = tu_now_ms();
    CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_FAILED);
  } else {
    struct timespec abs;
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_sec += XFER_TIMEOUT / 1000 + 5;
    if (pthread_timedjoin_np(th, NULL, &abs) != 0) {
      fprintf(stderr, "FATAL: %s: TransferSync still blocked after the peer was killed\n", name);
      _exit(1);
    }
    t_end = sa.t_end;
    if (sa.st != HIXL_FAILED)
      tu_fail(__FILE__, __LINE__, "%s: got %s, want FAILED (%s)", name, HixlStatusName(sa.st), sa.err);
  }
  if (t_end - t_kill > PROMPT_MS)
    tu_fail(__FILE__, __LINE__, "%s: ended %lld ms after the kill", name, (long long)(t_end - t_kill));
  printf("  [%s: ended %lld ms after the kill: %s]\n", name, (long long)(t_end - t_kill),
         async ? (ts == HIXL_TRANSFER_FAILED ? "FAILED" : "?") : sa.err);
  ws = tu_child_wait(&g.child, 5000);
  CU_ASSERT(ws >= 0 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
  TU_ASSERT_STATUS(xfer(p, HIXL_WRITE, &one, 1), HIXL_NOT_CONNECTED);
}

static void test_two_kill(void) {
  tu_server_ready info;
  kill_mid_transfer(HIXL_WRITE, false);
  kill_mid_transfer(HIXL_READ, false);
  kill_mid_transfer(HIXL_WRITE, true);
  kill_mid_transfer(HIXL_READ, true);
  /* A new child on the same port: Connect works, data moves. */
  if (!child_start(&g.child, g.child_port, &g.shm, REG_LEN, "shm", &info)) return;
  g.two.raddr = info.addr;
  TU_ASSERT_OK(HixlEngineConnect(g.two.cli, g.two.name, 5000));
  write_read_back(&g.two, MiB + 3, 1, 16, 16, 653);
}

/* ---------------------------------------------------------------- transport choice */

/* What an initiator child saw; it runs as another user in the refusal tests. */
struct init_result {
  uint32_t connect_st;
  char transport[8];
  uint32_t write_st, read_st;
  int64_t mismatch; /* READ back vs what was written; -1: none */
  int32_t logged;   /* the fallback was logged at info level */
  char err[400];    /* Connect's error message */
  char log[400];    /* the log line */
};

static struct {
  int seen;
  char line[400];
} g_log;

static void log_cb(HixlLogLevel level, const char *msg, void *ctx) {
  (void)level;
  (void)ctx;
  if (!g_log.seen && strstr(msg, "no same-host copies")) {
    snprintf(g_log.line, sizeof(g_log.line), "%s", msg);
    g_log.seen = 1;
  }
}

/* argv: flag target transport raddr len seed. Connect, WRITE pattern(seed) to raddr,
 * READ it back; report on fd 3. */
static int initiator_main(int argc, char **argv) {
  struct init_result r;
  struct hixl_link_info li;
  HixlEngine *e;
  memset(&r, 0, sizeof(r));
  r.mismatch = -1;
  if (argc != 7) return 2;
  const char *target = argv[2], *transport = strcmp(argv[3], "auto") == 0 ? NULL : argv[3];
  uint64_t raddr = strtoull(argv[4], NULL, 0), seed = strtoull(argv[6], NULL, 0);
  size_t len = strtoull(argv[5], NULL, 0);
  HixlSetLogCallback(log_cb, NULL);
  HixlSetLogLevel(HIXL_LOG_INFO);
  if (!(e = tu_engine_start_with(tu_ip(), transport))) return 3;
  r.connect_st = HixlEngineConnect(e, target, 5000);
  snprintf(r.err, sizeof(r.err), "%s", HixlGetLastErrorMessage());
  if (r.connect_st == HIXL_SUCCESS && hixl_engine_link_info(e, target, &li) == HIXL_SUCCESS)
    snprintf(r.transport, sizeof(r.transport), "%s", li.transport);
  unsigned char *m = tu_alloc_mem(2 * len, false);
  if (r.connect_st == HIXL_SUCCESS && m && tu_register(e, m, 2 * len)) {
    HixlTransferOpDesc d = desc(m, raddr, len);
    tu_fill(m, len, seed);
    r.write_st = HixlEngineTransferSync(e, target, HIXL_WRITE, &d, 1, XFER_TIMEOUT);
    d.local_addr = (uintptr_t)(m + len);
    r.read_st = HixlEngineTransferSync(e, target, HIXL_READ, &d, 1, XFER_TIMEOUT);
    r.mismatch = tu_mismatch(m, m + len, len);
  }
  r.logged = g_log.seen;
  snprintf(r.log, sizeof(r.log), "%s", g_log.line);
  HixlEngineDestroy(e);
  if (m) tu_free_mem(m, 2 * len);
  HixlSetLogCallback(NULL, NULL);
  return tu_write_all(3, &r, sizeof(r)) == 0 ? 0 : 4;
}

struct init_args {
  uint32_t uid;
  char *argv[8];
};

static int initiator_exec(void *arg, int ready_fd, int ctl_fd) {
  struct init_args *a = arg;
  (void)ready_fd;
  (void)ctl_fd;
  if (tu_become(a->uid, a->uid) != 0) return 126;
  execv(a->argv[0], a->argv);
  fprintf(stderr, "initiator child: exec %s: %m\n", a->argv[0]);
  return 127;
}

/* Run an initiator child as uid (0: as this process) against target with transport;
 * false when it could not run. */
static bool run_initiator(uint32_t uid, const char *target, const char *transport, uint64_t raddr, size_t len,
                          uint64_t seed, struct init_result *r) {
  char a_raddr[32], a_len[32], a_seed[32];
  struct init_args a = {.uid = uid,
                        .argv = {(char *)tu_self_exe(), INIT_FLAG, (char *)target, (char *)transport, a_raddr,
                                 a_len, a_seed, NULL}};
  tu_child c;
  snprintf(a_raddr, sizeof(a_raddr), "0x%llx", (unsigned long long)raddr);
  snprintf(a_len, sizeof(a_len), "%zu", len);
  snprintf(a_seed, sizeof(a_seed), "%llu", (unsigned long long)seed);
  memset(r, 0, sizeof(*r));
  if (tu_child_start(&c, initiator_exec, &a) != 0) return false;
  int rc = tu_child_read(&c, r, sizeof(*r), 30000);
  int ws = tu_child_wait(&c, 10000);
  if (rc != 0 || ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    tu_fail(__FILE__, __LINE__, "initiator child (uid %u, %s) failed: wait status 0x%x", uid, transport,
            (unsigned)ws);
    return false;
  }
  return true;
}

/* A target child (as tuid, non-dumpable or not) and two initiator children as iuid:
 * auto falls back to tcp, logs why and moves the data; shm fails Connect with why. */
static void refused_case(uint32_t tuid, bool nondumpable, uint32_t iuid, const char *need1,
                         const char *need2) {
  tu_shm shm;
  tu_child c;
  tu_server_ready info;
  struct init_result r;
  char name[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  tu_server_cfg cfg = {.port = port, .mem_len = 4 * MiB, .transport = "auto", .uid = tuid, .gid = tuid};
  cfg.nondumpable = nondumpable;
  CU_ASSERT_FATAL(tu_shm_create(&shm, 4 * MiB) == 0);
  cfg.shared = &shm;
  tu_addr(name, sizeof(name), port);
  if (tu_server_start(&c, &cfg, &info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "target child (uid %u) did not start: %s", tuid, info.error);
    tu_shm_destroy(&shm);
    return;
  }
  if (run_initiator(iuid, name, "auto", info.addr, 4 * MiB, 661, &r)) {
    TU_ASSERT_STATUS(r.connect_st, HIXL_SUCCESS);
    CU_ASSERT_STRING_EQUAL(r.transport, "tcp");
    TU_ASSERT_STATUS(r.write_st, HIXL_SUCCESS);
    TU_ASSERT_STATUS(r.read_st, HIXL_SUCCESS);
    CU_ASSERT_EQUAL(r.mismatch, -1);
    TU_ASSERT_PATTERN(shm.mem, 4 * MiB, 661, "target memory written over the tcp fallback");
    if (!r.logged || !strstr(r.log, need1))
      tu_fail(__FILE__, __LINE__, "auto: fallback not logged with \"%s\" (log: \"%s\")", need1, r.log);
    printf("  [auto, uid %u -> uid %u%s: %s]\n", iuid, tuid, nondumpable ? " (non-dumpable)" : "", r.log);
  }
  memset(shm.mem, 0, 4 * MiB);
  if (run_initiator(iuid, name, "shm", info.addr, 4 * MiB, 662, &r)) {
    TU_ASSERT_STATUS(r.connect_st, HIXL_FAILED);
    if (!strstr(r.err, need1) || !strstr(r.err, need2))
      tu_fail(__FILE__, __LINE__, "shm: Connect's message lacks \"%s\" or \"%s\": \"%s\"", need1, need2,
              r.err);
    printf("  [shm, uid %u -> uid %u: %s]\n", iuid, tuid, r.err);
    CU_ASSERT_EQUAL(tu_check_byte(shm.mem, 4 * MiB, 0), -1);
  }
  tu_child_stop(&c, 10000);
  tu_shm_destroy(&shm);
}

/* Processes of two users: process_vm_readv is EPERM without CAP_SYS_PTRACE. */
static void test_refused_two_users(void) {
  if (geteuid() != 0) {
    printf("  [skipped: running children as two users needs root]\n");
    CU_PASS("skipped");
    return;
  }
  refused_case(USER_A, false, USER_B, "Operation not permitted", "CAP_SYS_PTRACE");
}

/* One user, but the target made itself non-dumpable. */
static void test_refused_nondumpable(void) {
  uint32_t uid = geteuid() == 0 ? USER_A : 0; /* root could copy anyway (CAP_SYS_PTRACE) */
  refused_case(uid, true, uid, "Operation not permitted", "dumpable");
}

/* Auto on both sides of one host picks shm; the same initiator also as a child of
 * another process (sibling processes, one user) gets shm. */
static void test_auto_picks_shm(void) {
  tu_shm shm;
  tu_child c;
  tu_server_ready info;
  struct init_result r;
  struct hixl_link_info li;
  char name[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  HixlEngine *e = tu_engine_start_with(tu_ip(), NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  CU_ASSERT_FATAL(tu_shm_create(&shm, 4 * MiB) == 0);
  tu_addr(name, sizeof(name), port);
  if (child_start(&c, port, &shm, 4 * MiB, "auto", &info)) {
    TU_ASSERT_OK(HixlEngineConnect(e, name, 5000));
    TU_ASSERT_OK(hixl_engine_link_info(e, name, &li));
    CU_ASSERT_STRING_EQUAL(li.transport, "shm");
    CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)c.pid);
    if (run_initiator(0, name, "auto", info.addr, 4 * MiB, 671, &r)) {
      TU_ASSERT_STATUS(r.connect_st, HIXL_SUCCESS);
      CU_ASSERT_STRING_EQUAL(r.transport, "shm");
      CU_ASSERT_EQUAL(r.mismatch, -1);
      TU_ASSERT_PATTERN(shm.mem, 4 * MiB, 671, "target memory after a sibling's shm WRITE");
    }
    tu_child_stop(&c, 10000);
  }
  HixlEngineDestroy(e);
  tu_shm_destroy(&shm);
}

/* A target told tcp offers no shm: auto links over tcp, shm fails Connect saying so. */
static void test_target_without_shm(void) {
  char name[TU_ADDR_LEN];
  struct hixl_link_info li;
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), tu_free_port()), "tcp");
  HixlEngine *a = tu_engine_start_with(tu_ip(), "auto");
  HixlEngine *s = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(t && a && s);
  TU_ASSERT_OK(HixlEngineConnect(a, name, 5000));
  TU_ASSERT_OK(hixl_engine_link_info(a, name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
  TU_ASSERT_STATUS(HixlEngineConnect(s, name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("does not offer same-host copies");
  TU_ASSERT_STATUS(HixlEngineDisconnect(s, name, 1000), HIXL_NOT_CONNECTED);
  HixlEngineDestroy(s);
  HixlEngineDestroy(a);
  HixlEngineDestroy(t);
}

/* ---------------------------------------------------------------- hostile peers */

/* Issue 27: a peer this engine connects to answers SHM_HELLO with a pid not its own:
 * this process's, with its probe where the nonce it sent lies in our memory, or
 * another local process's. The copies must never go there: the pid counts only when
 * the process behind the unix socket the peer names is that pid (SO_PEERCRED), and
 * never when it is this process. A fake target speaks the wire on a raw socket, in a
 * thread here or in a child; the memory it lists is real memory of the process it
 * names, holding a pattern that must survive byte for byte. */

#define VICTIM_LEN  (64 * KiB)
#define VICTIM_SEED 801

static struct {
  unsigned char *victim; /* VICTIM_LEN bytes of VICTIM_SEED, here and (a copy) in the holder */
  uint8_t nonce[CMA_NONCE_LEN];
  tu_child holder; /* a child that only holds its copy of the above, then checks it */
} hz;

/* A unix SOCK_SEQPACKET socket in the abstract namespace: listening on name (bind)
 * or connected to it; -1 on error. */
static int unix_sock(const char *name, bool listen_on) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(name);
  memcpy(sa.sun_path + 1, name, n);
  socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd >= 0 && (listen_on ? bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, 4) < 0
                            : connect(fd, (struct sockaddr *)&sa, sl) < 0)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

struct fake {
  uint16_t port;          /* its TCP port (0: any) */
  int lfd;                /* ... its listener there */
  char name[TU_ADDR_LEN]; /* ... as an engine name */
  uint32_t pid;           /* the pid its SHM_HELLO_ACK names */
  bool sock;              /* it names a unix socket, of the process it runs in */
  int done;               /* read end: readable (EOF) ends it */
  int done_w;             /* the test's end, when the fake is a thread */
  pthread_t th;
};

/* The fake target: HELLO_ACK listing the victim (its address here, and in the
 * holder), SHM_HELLO_ACK naming f->pid with the probe at hz.nonce; then it reads and
 * drops whatever comes (data frames over tcp), refuses SHM_MAP_HELLO, takes
 * connections on its socket, until done. */
static void fake_serve(const struct fake *f) {
  uint8_t buf[1024], body[1024];
  char sname[64] = "";
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  int ul = -1, uc = -1;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return;
  if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body)) || h.type != WIRE_HELLO) goto out;
  wire_begin(&w, buf, sizeof(buf), WIRE_HELLO_ACK);
  wire_put_u32(&w, WIRE_HELLO_OK);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA | WIRE_CAP_SHM);
  wire_put_u16(&w, 4);
  wire_put_bytes(&w, "fake", 4);
  wire_put_u32(&w, 1);
  wire_put_mem_entry(&w, (uintptr_t)hz.victim, VICTIM_LEN, 0, "");
  if (!raw_send_all(fd, buf, wire_end(&w, 0))) goto out;
  if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body)) || h.type != WIRE_SHM_HELLO ||
      wire_decode(&h, body, &m) != WIRE_OK)
    goto out;
  if (f->sock) {
    snprintf(sname, sizeof(sname), "hixl-test-fake-%ld-%u", (long)getpid(), (unsigned)f->lfd);
    if ((ul = unix_sock(sname, true)) < 0) goto out;
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
  wire_put_u32(&w, WIRE_HELLO_OK);
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, m.u.shm.boot_id, f->pid, (uint32_t)geteuid());
  wire_put_u64(&w, (uintptr_t)hz.nonce);
  wire_put_bytes(&w, hz.nonce, sizeof(hz.nonce));
  wire_put_u16(&w, (uint16_t)strlen(sname));
  wire_put_bytes(&w, sname, strlen(sname));
  if (!raw_send_all(fd, buf, wire_end(&w, 0))) goto out;
  for (;;) {
    struct pollfd pf[3] = {
        {.fd = f->done, .events = POLLIN}, {.fd = fd, .events = POLLIN}, {.fd = ul, .events = POLLIN}};
    if (poll(pf, ul >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[0].revents) break;
    if (pf[1].revents) {
      if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body))) break;
      if (h.type == WIRE_SHM_MAP_HELLO) { /* an initiator that took shm: no memory to map */
        wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
        wire_put_u32(&w, WIRE_HELLO_REFUSED);
        wire_put_bytes(&w, "fake", 4);
        if (!raw_send_all(fd, buf, wire_end(&w, 0))) break;
      }
    }
    if (ul >= 0 && pf[2].revents) {
      int c = accept(ul, NULL, NULL);
      if (c >= 0 && uc >= 0) close(uc);
      if (c >= 0) uc = c;
    }
  }
out:
  if (uc >= 0) close(uc);
  if (ul >= 0) close(ul);
  close(fd);
}

/* The fake's TCP listener on tu_ip():f->port, and its name; false on error. */
static bool fake_listen(struct fake *f) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(f->port)};
  socklen_t sl = sizeof(sa);
  int one = 1;
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(f->lfd, 4) != 0 ||
      getsockname(f->lfd, (struct sockaddr *)&sa, &sl) != 0)
    return false;
  tu_addr(f->name, sizeof(f->name), ntohs(sa.sin_port));
  return true;
}

static void *fake_thread(void *arg) {
  fake_serve(arg);
  return NULL;
}

/* tu_child_start body: the fake in a child; the test closes ctl_fd to end it. */
static int fake_child(void *arg, int ready_fd, int ctl_fd) {
  struct fake *f = arg;
  f->done = ctl_fd;
  if (!fake_listen(f) || tu_write_all(ready_fd, "r", 1) != 0) return 1;
  fake_serve(f);
  close(f->lfd);
  return 0;
}

/* tu_child_start body: hold a copy of the victim until the test closes ctl_fd, then
 * exit 0 when it is intact, 1 when something wrote it. */
static int holder_child(void *arg, int ready_fd, int ctl_fd) {
  char b;
  (void)arg;
  (void)ready_fd;
  while (read(ctl_fd, &b, 1) > 0) {
  }
  return tu_check_pattern(hz.victim, VICTIM_LEN, VICTIM_SEED) < 0 ? 0 : 1;
}

static int hostile_init(void) {
  hz.victim = tu_alloc_mem(VICTIM_LEN, false);
  if (!hz.victim || getrandom(hz.nonce, sizeof(hz.nonce), 0) != (ssize_t)sizeof(hz.nonce)) return -1;
  tu_fill(hz.victim, VICTIM_LEN, VICTIM_SEED);
  return tu_child_start(&hz.holder, holder_child, NULL); /* no engine runs here yet: fork is safe */
}

static int hostile_cleanup(void) {
  if (hz.holder.pid > 0) tu_child_stop(&hz.holder, 10000);
  tu_free_mem(hz.victim, VICTIM_LEN);
  memset(&hz, 0, sizeof(hz));
  return 0;
}

/* Connect (Transport transport) to a fake naming pid, in a thread here or in a child.
 * auto: the link is not shm, and a WRITE aimed at the victim does not land (it goes
 * over tcp to the fake, which drops it; checked here for the victim of this process,
 * by the holder at the end for its copy); shm: Connect fails, its message has need. */
static void fake_case(const char *transport, uint32_t pid, bool sock, bool in_child, const char *need) {
  struct fake f = {.pid = pid, .sock = sock, .lfd = -1};
  struct hixl_link_info li;
  tu_child c = {0};
  int pfd[2];
  char ready;
  if (in_child) { /* forked before this test's engine exists; it listens itself */
    f.port = tu_free_port();
    tu_addr(f.name, sizeof(f.name), f.port);
    CU_ASSERT_FATAL(tu_child_start(&c, fake_child, &f) == 0);
    CU_ASSERT_FATAL(tu_child_read(&c, &ready, 1, READY_MS) == 0);
  } else {
    CU_ASSERT_FATAL(fake_listen(&f));
    CU_ASSERT_FATAL(pipe(pfd) == 0);
    f.done = pfd[0];
    f.done_w = pfd[1];
    CU_ASSERT_FATAL(pthread_create(&f.th, NULL, fake_thread, &f) == 0);
  }
  HixlEngine *e = tu_engine_start_with(tu_ip(), transport);
  unsigned char *src = tu_alloc_mem(VICTIM_LEN, false);
  CU_ASSERT_FATAL(e && src && tu_register(e, src, VICTIM_LEN));
  tu_fill(src, VICTIM_LEN, VICTIM_SEED + 1);
  HixlStatus st = HixlEngineConnect(e, f.name, 5000);
  if (strcmp(transport, "shm") == 0) {
    TU_ASSERT_STATUS(st, HIXL_FAILED);
    TU_ASSERT_ERRMSG_HAS(need);
    printf("  [shm: %s]\n", HixlGetLastErrorMessage());
  } else if (st == HIXL_SUCCESS) {
    TU_ASSERT_OK(hixl_engine_link_info(e, f.name, &li));
    CU_ASSERT_STRING_NOT_EQUAL(li.transport, "shm");
    CU_ASSERT_EQUAL(li.peer_pid, 0);
    HixlTransferOpDesc d = desc(src, (uintptr_t)hz.victim, VICTIM_LEN);
    st = HixlEngineTransferSync(e, f.name, HIXL_WRITE, &d, 1, 300);
    CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS); /* over tcp to the fake, which drops it */
    printf("  [auto: linked over %s; the WRITE: %s]\n", li.transport, HixlStatusName(st));
  } else {
    TU_ASSERT_STATUS(st, HIXL_FAILED); /* refusing outright is fine too, if clean */
  }
  TU_ASSERT_PATTERN(hz.victim, VICTIM_LEN, VICTIM_SEED, "this process's memory the fake listed");
  HixlEngineDestroy(e);
  tu_free_mem(src, VICTIM_LEN);
  if (in_child) {
    int ws = tu_child_stop(&c, 10000);
    CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  } else {
    close(f.done_w);
    pthread_join(f.th, NULL);
    close(f.done);
    close(f.lfd);
  }
}

/* It names this process, its probe where our copy of the nonce lies. */
static void test_fake_names_this_process(void) {
  fake_case("auto", (uint32_t)getpid(), false, false, "");
  fake_case("shm", (uint32_t)getpid(), false, false,
            "a link within one process is taken only on an authenticated link");
  fake_case("auto", (uint32_t)getpid(), true, false, "");
  fake_case("shm", (uint32_t)getpid(), true, false,
            "a link within one process is taken only on an authenticated link");
}

/* It names the holder (which has the nonce and the victim where this process has
 * them), with a unix socket of this process: SO_PEERCRED says this process. */
static void test_fake_socket_is_this_process(void) {
  fake_case("auto", (uint32_t)hz.holder.pid, true, false, "");
  fake_case("shm", (uint32_t)hz.holder.pid, true, false, "belongs to this very process");
}

/* It names the holder, with a unix socket of its own (a child): SO_PEERCRED says
 * another pid than the one it named. Also with no socket at all. */
static void test_fake_socket_not_the_named_pid(void) {
  fake_case("auto", (uint32_t)hz.holder.pid, true, true, "");
  fake_case("shm", (uint32_t)hz.holder.pid, true, true, "but the unix socket it named belongs to pid");
  fake_case("auto", (uint32_t)hz.holder.pid, false, false, "");
  fake_case("shm", (uint32_t)hz.holder.pid, false, false, "named no unix socket");
}

/* The holder's copy of the victim: no WRITE above reached it. */
static void test_holder_untouched(void) {
  int ws = tu_child_stop(&hz.holder, 10000);
  if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "the process the fakes named had its memory written (wait status 0x%x)",
            (unsigned)ws);
}

/* A raw link to the engine at port: plain HELLO, HELLO_ACK OK; -1 on failure. */
static int raw_link(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  struct timeval tv = {.tv_sec = 5};
  uint8_t buf[4096];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
      !raw_send_all(fd, buf, wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "raw-test")) ||
      !raw_recv_frame(fd, &h, NULL, buf, sizeof(buf)) || h.type != WIRE_HELLO_ACK ||
      wire_decode(&h, buf, &m) != WIRE_OK || m.u.hello_ack.status != WIRE_HELLO_OK ||
      !(m.u.hello_ack.caps & WIRE_CAP_SHM)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* The target's side: an SHM_HELLO naming the target's own pid is refused; one naming
 * another pid gets a unix socket even without asking to map, and the socket takes
 * no connection but that pid's (this process is turned away: EOF). */
static void test_target_refuses_own_pid(void) {
  char name[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), port), NULL);
  struct cma_self self;
  CU_ASSERT_FATAL(t && cma_self_get(&self) == 0);
  for (int k = 0; k < 2; k++) {
    uint8_t buf[1024];
    struct wire_wr w;
    struct wire_hdr h;
    struct wire_msg m;
    uint32_t pid = k == 0 ? (uint32_t)getpid() : (uint32_t)getppid();
    int fd = raw_link(port);
    CU_ASSERT_FATAL(fd >= 0);
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
    wire_put_shm_id(&w, WIRE_SHM_LAYOUT, self.boot_id, pid, self.uid);
    wire_put_u32(&w, k == 0 ? WIRE_SHM_F_MAP : 0);
    CU_ASSERT_FATAL(raw_send_all(fd, buf, wire_end(&w, 0)));
    CU_ASSERT_FATAL(raw_recv_frame(fd, &h, NULL, buf, sizeof(buf)) && h.type == WIRE_SHM_HELLO_ACK &&
                    wire_decode(&h, buf, &m) == WIRE_OK);
    if (k == 0) {
      CU_ASSERT_EQUAL(m.u.shm.status, WIRE_HELLO_REFUSED);
      CU_ASSERT_EQUAL(m.u.shm.sock_len, 0);
      CU_ASSERT_EQUAL(m.u.shm.probe_addr, 0);
    } else {
      char sname[WIRE_SHM_SOCK_MAX + 1];
      char b;
      CU_ASSERT_EQUAL(m.u.shm.status, WIRE_HELLO_OK);
      CU_ASSERT_EQUAL(m.u.shm.pid, (uint32_t)getpid());
      CU_ASSERT_FATAL(m.u.shm.sock_len > 0 && m.u.shm.sock_len <= WIRE_SHM_SOCK_MAX);
      memcpy(sname, m.u.shm.sock, m.u.shm.sock_len);
      sname[m.u.shm.sock_len] = '\0';
      int u = unix_sock(sname, false);
      CU_ASSERT_FATAL(u >= 0);
      struct pollfd pf = {.fd = u, .events = POLLIN};
      CU_ASSERT(poll(&pf, 1, 5000) == 1 && recv(u, &b, 1, MSG_DONTWAIT) == 0); /* closed on us */
      close(u);
    }
    close(fd);
  }
  HixlEngineDestroy(t);
}

/* The target's side: connections to a link's unix socket from other processes than
 * the one its SHM_HELLO named are accepted and closed, ESHM_STRANGERS_MAX of them; then
 * the socket closes (a connect is refused) and the link goes on without same-host
 * copies: SHM_MAP_HELLO is refused, "no unix socket", the link stays up. Before, the
 * target took every one (someone flooding the name held its progress thread). Here
 * this process is the stranger: the SHM_HELLO names its parent. */
static void test_target_strangers_bounded(void) {
  char name[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), port), NULL);
  struct cma_self self;
  uint8_t buf[1024];
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  char sname[WIRE_SHM_SOCK_MAX + 1];
  CU_ASSERT_FATAL(t && cma_self_get(&self) == 0);
  int fd = raw_link(port);
  CU_ASSERT_FATAL(fd >= 0);
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, self.boot_id, (uint32_t)getppid(), self.uid);
  wire_put_u32(&w, WIRE_SHM_F_MAP);
  CU_ASSERT_FATAL(raw_send_all(fd, buf, wire_end(&w, 0)));
  CU_ASSERT_FATAL(raw_recv_frame(fd, &h, NULL, buf, sizeof(buf)) && h.type == WIRE_SHM_HELLO_ACK &&
                  wire_decode(&h, buf, &m) == WIRE_OK && m.u.shm.status == WIRE_HELLO_OK);
  CU_ASSERT_FATAL(m.u.shm.sock_len > 0 && m.u.shm.sock_len <= WIRE_SHM_SOCK_MAX);
  memcpy(sname, m.u.shm.sock, m.u.shm.sock_len);
  sname[m.u.shm.sock_len] = '\0';
  /* Strangers until a connect is refused (the socket gone), for at most 10 s. */
  uint32_t taken = 0;
  bool refused = false;
  for (int64_t end = tu_now_ms() + 10000; !refused && tu_now_ms() < end;) {
    int u = unix_sock(sname, false);
    refused = u < 0 && errno == ECONNREFUSED;
    if (u >= 0) {
      taken++;
      close(u);
    }
  }
  CU_ASSERT(refused);
  CU_ASSERT(taken >= ESHM_STRANGERS_MAX);
  /* + those queued when it closed: the listener's backlog, 4, and one more the kernel lets in */
  CU_ASSERT(taken <= ESHM_STRANGERS_MAX + 5);
  /* The link goes on: its SHM_MAP_HELLO is answered, refused for want of the socket. */
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_HELLO);
  wire_put_u32(&w, 0);
  CU_ASSERT_FATAL(raw_send_all(fd, buf, wire_end(&w, 0)));
  bool got = false; /* SHM_MAP frames would come first, had it taken the link's peer */
  while (!got && raw_recv_frame(fd, &h, NULL, buf, sizeof(buf))) got = h.type == WIRE_SHM_MAP_ACK;
  CU_ASSERT_FATAL(got);
  CU_ASSERT_FATAL(wire_decode(&h, buf, &m) == WIRE_OK);
  CU_ASSERT_EQUAL(m.u.map.status, WIRE_HELLO_REFUSED);
  CU_ASSERT(m.u.map.text_len > 0 && memmem(m.u.map.text, m.u.map.text_len, "no unix socket", 14) != NULL);
  close(fd);
  HixlEngineDestroy(t);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], INIT_FLAG) == 0) return initiator_main(argc, argv);
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc; /* a server child */
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("shm, one process: a link to itself", one_init, one_cleanup);
  CU_add_test(s, "Transport shm: Connect FAILED, a link to itself", test_one_shm_refused);
  CU_add_test(s, "auto: tcp, data moves", test_one_auto_tcp);
  s = CU_add_suite("shm, two processes", two_init, two_cleanup);
  CU_add_test(s, "link: shm to the child's pid", test_two_link);
  CU_add_test(s, "WRITE then READ back, 1 B to 64 MiB", test_two_sizes);
  CU_add_test(s, "batches of 1, 16, 1024, 4096 scattered ops", test_two_batches);
  CU_add_test(s, "4096 adjacent ops: merged iovecs, and reversed ones", test_two_adjacent);
  CU_add_test(s, "mixed big and tiny ops in one batch", test_two_mixed);
  CU_add_test(s, "async: small, large, 32 in flight", test_two_async);
  CU_add_test(s, "remote ranges outside the table: FAILED, untouched", test_two_out_of_range);
  CU_add_test(s, "async past its deadline: queued TIMEOUT, running finishes", test_two_async_timeouts);
  CU_add_test(s, "Deregister refused while copies are in flight", test_two_deregister_in_flight);
  CU_add_test(s, "Disconnect with copies queued: FAILED, Connect again", test_two_disconnect_in_flight);
  CU_add_test(s, "four threads on one link", test_two_threads);
  CU_add_test(s, "peer killed mid-transfer: FAILED, NOT_CONNECTED, Connect again", test_two_kill);
  s = CU_add_suite("shm, hostile peers (issue 27)", hostile_init, hostile_cleanup);
  CU_add_test(s, "a target naming this process: not shm, nothing lands", test_fake_names_this_process);
  CU_add_test(s, "a target whose unix socket is this process's: refused", test_fake_socket_is_this_process);
  CU_add_test(s, "a target naming a pid its socket is not: refused", test_fake_socket_not_the_named_pid);
  CU_add_test(s, "the process the fakes named: untouched", test_holder_untouched);
  CU_add_test(s, "target: SHM_HELLO naming its own pid REFUSED; socket takes the named pid only",
              test_target_refuses_own_pid);
  CU_add_test(s, "target: a link's socket takes 64 strangers, then closes; the link goes on",
              test_target_strangers_bounded);
  s = CU_add_suite("transport choice", NULL, NULL);
  CU_add_test(s, "auto picks shm for a peer on this host", test_auto_picks_shm);
  CU_add_test(s, "target told tcp: auto -> tcp, shm -> FAILED", test_target_without_shm);
  CU_add_test(s, "kernel refuses, two users: auto -> tcp with data, shm -> FAILED", test_refused_two_users);
  CU_add_test(s, "kernel refuses, non-dumpable target: auto -> tcp, shm -> FAILED", test_refused_nondumpable);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
