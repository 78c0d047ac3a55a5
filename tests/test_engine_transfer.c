/* Two engines in one process on 127.0.0.1: WRITE and READ of random data checked
 * byte for byte, batches, async requests, range checks on both sides, link states,
 * connect timeouts, late registration, notifications and concurrent threads. Run as
 * test_engine_transfer (Transport auto: shm here) and test_engine_transfer_tcp. */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "test_util.h"

#define KiB          ((size_t)1 << 10)
#define MiB          ((size_t)1 << 20)
#define REG_LEN      (64 * MiB + 64 * KiB) /* registered bytes of each big buffer */
#define SLACK        MiB                   /* unregistered bytes mapped on each side */
#define XFER_TIMEOUT 30000                 /* ms; generous for a loaded 2-core machine */

/* A mapping of REG_LEN + 2 * SLACK of which [mem, mem + REG_LEN) is registered, so
 * the bytes just outside a registration are ours and unregistered. */
typedef struct {
  unsigned char *base;
  unsigned char *mem;
  HixlMemHandle h;
} region;

static struct {
  HixlEngine *srv, *cli;
  char srv_name[TU_ADDR_LEN];
  const char *cli_name;
  region s, src, dst; /* server memory; client source and destination */
} g;

static int region_init(region *r, HixlEngine *e) {
  r->base = tu_alloc_mem(REG_LEN + 2 * SLACK, false);
  if (!r->base) return -1;
  r->mem = r->base + SLACK;
  r->h = tu_register(e, r->mem, REG_LEN);
  return r->h ? 0 : -1;
}

static void region_fini(region *r, HixlEngine *e) {
  if (r->h && e) HixlEngineDeregisterMem(e, r->h);
  tu_free_mem(r->base, REG_LEN + 2 * SLACK);
  memset(r, 0, sizeof(*r));
}

static int pair_init(void) {
  uint16_t port = tu_free_port();

  if (!port) return -1;
  tu_addr(g.srv_name, sizeof(g.srv_name), port);
  g.cli_name = tu_ip();
  g.srv = tu_engine_start(g.srv_name);
  g.cli = tu_engine_start(g.cli_name);
  if (!g.srv || !g.cli) return -1;
  if (region_init(&g.s, g.srv) || region_init(&g.src, g.cli) || region_init(&g.dst, g.cli)) return -1;
  if (HixlEngineConnect(g.cli, g.srv_name, 5000) != HIXL_SUCCESS) {
    fprintf(stderr, "pair_init: connect %s: %s\n", g.srv_name, HixlGetLastErrorMessage());
    return -1;
  }
  return 0;
}

static int pair_cleanup(void) {
  int rc = 0;

  if (g.cli && HixlEngineDisconnect(g.cli, g.srv_name, 1000) != HIXL_SUCCESS) rc = -1;
  region_fini(&g.dst, g.cli);
  region_fini(&g.src, g.cli);
  region_fini(&g.s, g.srv);
  if (g.cli && HixlEngineDestroy(g.cli) != HIXL_SUCCESS) rc = -1;
  if (g.srv && HixlEngineDestroy(g.srv) != HIXL_SUCCESS) rc = -1;
  memset(&g, 0, sizeof(g));
  return rc;
}

static HixlTransferOpDesc desc(const void *local, const void *remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = (uintptr_t)remote, .len = len};
  return d;
}

static HixlStatus xfer(HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  return HixlEngineTransferSync(g.cli, g.srv_name, op, d, n, XFER_TIMEOUT);
}

/* ---------------------------------------------------------------- data */

/* WRITE len bytes from src+loff to server+roff, check the server and its guard bytes,
 * then READ them back into dst+doff and check that and its guards. */
static void write_read_back(size_t len, size_t loff, size_t roff, size_t doff, uint64_t seed) {
  unsigned char *src = g.src.mem + loff, *srv = g.s.mem + roff, *dst = g.dst.mem + doff;
  const size_t guard = 16;
  HixlTransferOpDesc d;
  char what[96];

  CU_ASSERT_FATAL(loff + len <= REG_LEN && roff + len + guard <= REG_LEN && doff + len + guard <= REG_LEN &&
                  roff >= guard && doff >= guard);
  tu_fill(src, len, seed);
  memset(srv - guard, 0xEE, len + 2 * guard);
  memset(dst - guard, 0x00, len + 2 * guard);

  d = desc(src, srv, len);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  snprintf(what, sizeof(what), "WRITE %zu B: server memory", len);
  TU_ASSERT_PATTERN(srv, len, seed, what);
  if (tu_check_byte(srv - guard, guard, 0xEE) >= 0 || tu_check_byte(srv + len, guard, 0xEE) >= 0)
    tu_fail(__FILE__, __LINE__, "WRITE %zu B: bytes next to the target range changed", len);

  d = desc(dst, srv, len);
  TU_ASSERT_OK(xfer(HIXL_READ, &d, 1));
  snprintf(what, sizeof(what), "READ %zu B: read back", len);
  TU_ASSERT_PATTERN(dst, len, seed, what);
  if (tu_check_byte(dst - guard, guard, 0x00) >= 0 || tu_check_byte(dst + len, guard, 0x00) >= 0)
    tu_fail(__FILE__, __LINE__, "READ %zu B: bytes next to the local range changed", len);
}

static void test_sizes(void) {
  const size_t sizes[] = {1, 7, 4 * KiB, 64 * KiB + 3, MiB, 5 * MiB + 1, 64 * MiB};
  size_t i;

  for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    write_read_back(sizes[i], 0, 16, 16, 100 + i);  /* aligned */
    write_read_back(sizes[i], 13, 29, 41, 200 + i); /* every side unaligned */
  }
}

/* n ops of random lengths in [1, 1024], local slots in order, remote slots shuffled,
 * read back into slots shuffled another way. */
static void scattered_batch(size_t n, uint64_t seed) {
  const size_t slot = 1024, span = 4096 * slot;
  size_t *rperm = malloc(4096 * sizeof(size_t)), *dperm = malloc(4096 * sizeof(size_t));
  size_t *lens = malloc(n * sizeof(size_t));
  HixlTransferOpDesc *d = malloc(n * sizeof(*d));
  uint64_t rs = seed;
  unsigned char *used = calloc(4096, 1);
  size_t i, j, t;
  ptrdiff_t off;

  CU_ASSERT_FATAL(rperm && dperm && lens && d && used && n <= 4096);
  for (i = 0; i < 4096; i++) rperm[i] = dperm[i] = i;
  for (i = 4095; i > 0; i--) { /* Fisher-Yates, twice */
    j = tu_rand(&rs) % (i + 1);
    t = rperm[i], rperm[i] = rperm[j], rperm[j] = t;
    j = tu_rand(&rs) % (i + 1);
    t = dperm[i], dperm[i] = dperm[j], dperm[j] = t;
  }
  tu_fill(g.src.mem, span, seed);
  memset(g.s.mem, 0xEE, span);
  memset(g.dst.mem, 0x00, span);
  for (i = 0; i < n; i++) {
    lens[i] = 1 + tu_rand(&rs) % slot;
    d[i] = desc(g.src.mem + i * slot, g.s.mem + rperm[i] * slot, lens[i]);
    used[rperm[i]] = 1;
  }
  TU_ASSERT_OK(xfer(HIXL_WRITE, d, n));
  for (i = 0; i < n; i++) {
    off = tu_mismatch(g.s.mem + rperm[i] * slot, g.src.mem + i * slot, lens[i]);
    if (off >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu WRITE op %zu (len %zu): mismatch at %td", n, i, lens[i], off);
      break;
    }
    off = tu_check_byte(g.s.mem + rperm[i] * slot + lens[i], slot - lens[i], 0xEE);
    if (off >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu WRITE op %zu wrote past its len", n, i);
      break;
    }
  }
  for (i = 0; i < 4096; i++)
    if (!used[i] && tu_check_byte(g.s.mem + i * slot, slot, 0xEE) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu WRITE touched unused slot %zu", n, i);
      break;
    }

  for (i = 0; i < n; i++) d[i] = desc(g.dst.mem + dperm[i] * slot, g.s.mem + rperm[i] * slot, lens[i]);
  TU_ASSERT_OK(xfer(HIXL_READ, d, n));
  for (i = 0; i < n; i++) {
    off = tu_mismatch(g.dst.mem + dperm[i] * slot, g.src.mem + i * slot, lens[i]);
    if (off >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu READ op %zu (len %zu): mismatch at %td", n, i, lens[i], off);
      break;
    }
    if (tu_check_byte(g.dst.mem + dperm[i] * slot + lens[i], slot - lens[i], 0) >= 0) {
      tu_fail(__FILE__, __LINE__, "batch %zu READ op %zu wrote past its len", n, i);
      break;
    }
  }
  CU_PASS("batch checked");
  free(used);
  free(d);
  free(lens);
  free(dperm);
  free(rperm);
}

static void test_batches(void) {
  scattered_batch(1, 11);
  scattered_batch(16, 12);
  scattered_batch(1024, 13);
  scattered_batch(4096, 14);
}

/* Big and tiny ops mixed in one batch, each split as the engine likes. */
static void test_mixed_batch(void) {
  const size_t lens[] = {9 * MiB + 5, 1, 4 * MiB, 3, 64 * KiB, 17 * MiB + 1, 100, 4 * MiB - 1};
  const size_t n = sizeof(lens) / sizeof(lens[0]);
  HixlTransferOpDesc d[sizeof(lens) / sizeof(lens[0])];
  size_t i, loff = 0, roff = 0;
  size_t lo[sizeof(lens) / sizeof(lens[0])], ro[sizeof(lens) / sizeof(lens[0])];

  for (i = 0; i < n; i++) { /* remote laid out in reverse order with gaps */
    lo[i] = loff;
    loff += lens[i] + 7;
  }
  for (i = n; i-- > 0;) {
    ro[i] = roff;
    roff += lens[i] + 13;
  }
  CU_ASSERT_FATAL(loff <= REG_LEN && roff <= REG_LEN);
  memset(g.s.mem, 0, roff);
  for (i = 0; i < n; i++) {
    tu_fill(g.src.mem + lo[i], lens[i], 300 + i);
    d[i] = desc(g.src.mem + lo[i], g.s.mem + ro[i], lens[i]);
  }
  TU_ASSERT_OK(xfer(HIXL_WRITE, d, n));
  for (i = 0; i < n; i++) TU_ASSERT_PATTERN(g.s.mem + ro[i], lens[i], 300 + i, "mixed batch WRITE");
  memset(g.dst.mem, 0, loff);
  for (i = 0; i < n; i++) d[i] = desc(g.dst.mem + lo[i], g.s.mem + ro[i], lens[i]);
  TU_ASSERT_OK(xfer(HIXL_READ, d, n));
  for (i = 0; i < n; i++) TU_ASSERT_PATTERN(g.dst.mem + lo[i], lens[i], 300 + i, "mixed batch READ");
}

/* ---------------------------------------------------------------- async */

static void test_async_single(void) {
  const size_t len = MiB + 11;
  HixlTransferOpDesc d = desc(g.src.mem, g.s.mem + 5, len);
  HixlTransferReq req = NULL;
  HixlTransferStatus ts;
  void *ud = NULL;
  int tag = 42;

  tu_fill(g.src.mem, len, 401);
  memset(g.s.mem, 0, len + 64);
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d, 1, XFER_TIMEOUT, &tag, &req));
  CU_ASSERT_PTR_NOT_NULL_FATAL(req);
  TU_ASSERT_OK(HixlEngineGetTransferUserData(g.cli, req, &ud));
  CU_ASSERT_PTR_EQUAL(ud, &tag);
  TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + XFER_TIMEOUT + 1000, &ts));
  CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, req, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_PATTERN(g.s.mem + 5, len, 401, "async WRITE");
  CU_ASSERT_EQUAL(tu_check_byte(g.s.mem + 5 + len, 59, 0), -1);

  memset(g.dst.mem, 0, len);
  d = desc(g.dst.mem, g.s.mem + 5, len);
  HixlTransferReq released = req;
  req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_READ, &d, 1, 0, NULL, &req));
  /* A new request, likely where the released one was in memory: a handle of its own, and
   * the released one stays unknown (with addresses for handles, it named the new one). */
  CU_ASSERT(req != released);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, released, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, released, &ud), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineGetTransferUserData(g.cli, req, &ud));
  CU_ASSERT_PTR_NULL(ud);
  TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + XFER_TIMEOUT, &ts));
  CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_STATUS(HixlEngineGetTransferStatus(g.cli, req, &ts), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineGetTransferUserData(g.cli, req, &ud), HIXL_PARAM_INVALID);
  TU_ASSERT_PATTERN(g.dst.mem, len, 401, "async READ");
}

/* Many requests in flight at once, batches of 16 ops each, on disjoint ranges. */
static void test_async_many(void) {
  enum { NREQ = 32, OPS = 16 };
  const size_t blk = 64 * KiB + 1, stride = 80 * KiB;
  HixlTransferOpDesc d[OPS];
  HixlTransferReq req[NREQ];
  HixlTransferStatus ts;
  uintptr_t ud_seen;
  void *ud;
  size_t r, i, at;

  tu_fill(g.src.mem, (size_t)NREQ * OPS * stride, 501);
  memset(g.s.mem, 0, (size_t)NREQ * OPS * stride);
  for (r = 0; r < NREQ; r++) {
    for (i = 0; i < OPS; i++) {
      at = (r * OPS + i) * stride;
      d[i] = desc(g.src.mem + at, g.s.mem + at, blk);
    }
    req[r] = NULL;
    TU_ASSERT_OK(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, d, OPS, XFER_TIMEOUT,
                                         (void *)(uintptr_t)(r + 1), &req[r]));
  }
  for (r = 0; r < NREQ; r++) {
    if (!req[r]) continue;
    TU_ASSERT_OK(HixlEngineGetTransferUserData(g.cli, req[r], &ud));
    ud_seen = (uintptr_t)ud;
    CU_ASSERT_EQUAL(ud_seen, r + 1);
    TU_ASSERT_OK(tu_wait_request(g.cli, req[r], tu_now_ms() + XFER_TIMEOUT + 1000, &ts));
    CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
  }
  for (r = 0; r < NREQ * OPS; r++) {
    at = r * stride;
    if (tu_mismatch(g.s.mem + at, g.src.mem + at, blk) >= 0 ||
        tu_check_byte(g.s.mem + at + blk, stride - blk, 0) >= 0) {
      tu_fail(__FILE__, __LINE__, "async many: op %zu landed wrong", r);
      break;
    }
  }
}

/* ---------------------------------------------------------------- ranges */

/* Server memory must still hold pattern 601 (and unreg pattern 777); restore it after
 * a failure so that the next check judges only its own call. For READ, the local
 * buffer must be untouched when the op is small enough to be one wire request; a
 * failed multi-chunk READ may leave its own local range partly written. */
static void check_untouched(HixlTransferOp op, size_t len, const unsigned char *unreg, size_t unreg_len,
                            const char *msg, int line) {
  ptrdiff_t off = tu_check_pattern(g.s.mem, REG_LEN, 601);

  if (off >= 0) {
    tu_fail(__FILE__, (unsigned)line, "%s: server memory changed at offset %td of %zu", msg, off, REG_LEN);
    tu_fill(g.s.mem, REG_LEN, 601);
  } else {
    CU_PASS("server memory untouched");
  }
  if (unreg && (off = tu_check_pattern(unreg, unreg_len, 777)) >= 0) {
    tu_fail(__FILE__, (unsigned)line, "%s: unregistered server memory changed at offset %td", msg, off);
    tu_fill((void *)unreg, unreg_len, 777);
  }
  if (op == HIXL_READ && len <= 64 * KiB && (off = tu_check_byte(g.dst.mem, 64 * KiB, 0xAB)) >= 0)
    tu_fail(__FILE__, (unsigned)line, "%s: local destination written at offset %td", msg, off);
}

/* Run one op that must fail on the responder side, then check nothing moved. */
static void expect_remote_reject(HixlTransferOp op, const void *remote, size_t len,
                                 const unsigned char *unreg, size_t unreg_len, const char *what) {
  HixlTransferOpDesc d;
  HixlStatus st;
  HixlTransferReq req = NULL;
  HixlTransferStatus ts;
  char msg[128];

  /* Server memory holds pattern 601 (set by the caller); the local side is known. */
  tu_fill(g.src.mem, 64 * KiB, 602);
  memset(g.dst.mem, 0xAB, 64 * KiB);

  d = desc(op == HIXL_WRITE ? g.src.mem : g.dst.mem, remote, len);
  st = xfer(op, &d, 1);
  snprintf(msg, sizeof(msg), "sync %s %s (%zu B)", op == HIXL_WRITE ? "WRITE" : "READ", what, len);
  if (st != HIXL_FAILED)
    tu_fail(__FILE__, __LINE__, "%s: got %s, want HIXL_FAILED (%s)", msg, HixlStatusName(st),
            HixlGetLastErrorMessage());
  else
    CU_ASSERT(strlen(HixlGetLastErrorMessage()) > 0);
  check_untouched(op, len, unreg, unreg_len, msg, __LINE__);

  /* The same as an async request: refused at submit or ends FAILED. */
  memset(g.dst.mem, 0xAB, 64 * KiB);
  snprintf(msg, sizeof(msg), "async %s %s (%zu B)", op == HIXL_WRITE ? "WRITE" : "READ", what, len);
  st = HixlEngineTransferAsync(g.cli, g.srv_name, op, &d, 1, XFER_TIMEOUT, NULL, &req);
  if (st == HIXL_SUCCESS) {
    TU_ASSERT_OK(tu_wait_request(g.cli, req, tu_now_ms() + XFER_TIMEOUT, &ts));
    if (ts != HIXL_TRANSFER_FAILED)
      tu_fail(__FILE__, __LINE__, "%s: final state %d, want FAILED", msg, (int)ts);
  } else if (st != HIXL_FAILED) {
    tu_fail(__FILE__, __LINE__, "%s: submit got %s, want SUCCESS or FAILED", msg, HixlStatusName(st));
  }
  check_untouched(op, len, unreg, unreg_len, msg, __LINE__);
}

static void test_remote_out_of_range(void) {
  const size_t ulen = 16 * KiB;
  unsigned char *unreg = tu_alloc_mem(ulen, false);
  unsigned char *end = g.s.mem + REG_LEN;
  HixlTransferOpDesc d[2];
  int op;

  CU_ASSERT_PTR_NOT_NULL_FATAL(unreg);
  tu_fill(unreg, ulen, 777);
  tu_fill(end, SLACK, 778);
  tu_fill(g.s.base, SLACK, 779);
  tu_fill(g.s.mem, REG_LEN, 601);
  for (op = HIXL_READ; op <= HIXL_WRITE; op++) {
    expect_remote_reject(op, end - 10, 20, NULL, 0, "straddling the end");
    expect_remote_reject(op, end, 1, NULL, 0, "just past the end");
    expect_remote_reject(op, end + 4096, 4096, NULL, 0, "past the end");
    expect_remote_reject(op, g.s.mem - 1, 2, NULL, 0, "straddling the start");
    expect_remote_reject(op, unreg, 100, unreg, ulen, "in unregistered memory");
    expect_remote_reject(op, (void *)(uintptr_t)0x1000, 8, NULL, 0, "at 0x1000");
    expect_remote_reject(op, g.s.mem + 1, REG_LEN, NULL, 0, "one byte too long");
    TU_ASSERT_PATTERN(end, SLACK, 778, "bytes after the registration");
    TU_ASSERT_PATTERN(g.s.base, SLACK, 779, "bytes before the registration");
  }
  /* A batch whose second op is outside: the whole call fails, outside stays intact. */
  tu_fill(g.src.mem, 8 * KiB, 780);
  d[0] = desc(g.src.mem, g.s.mem, 4 * KiB);
  d[1] = desc(g.src.mem + 4 * KiB, end - 100, 4 * KiB);
  TU_ASSERT_STATUS(xfer(HIXL_WRITE, d, 2), HIXL_FAILED);
  TU_ASSERT_PATTERN(end, SLACK, 778, "bytes after the registration, batch");

  /* The responder keeps serving: a valid transfer works, both ways. */
  write_read_back(256 * KiB + 3, 1, 17, 33, 781);
  tu_free_mem(unreg, ulen);
}

/* With staging off (BufferPool "0:0") local memory must be registered: anything else
 * is PARAM_INVALID and nothing moves. With the default pool it is staged instead
 * (test_staging covers that); here the default client shows it works. */
static void test_local_not_registered(void) {
  static const HixlOption pool_off = {"BufferPool", "0:0"};
  unsigned char *unreg = tu_alloc_mem(64 * KiB, false);
  unsigned char *dst_end = g.dst.mem + REG_LEN;
  HixlEngine *strict = tu_engine_start_opts(tu_ip(), tu_transport(), &pool_off, 1);
  HixlTransferOpDesc d;
  HixlTransferReq req = (HixlTransferReq)(void *)unreg;

  CU_ASSERT_PTR_NOT_NULL_FATAL(unreg);
  CU_ASSERT_PTR_NOT_NULL_FATAL(strict);
  TU_ASSERT_OK(HixlEngineConnect(strict, g.srv_name, 5000));
  HixlMemHandle sh = tu_register(strict, g.src.base, SLACK); /* memory of its own, below src */
  CU_ASSERT_PTR_NOT_NULL_FATAL(sh);
  tu_fill(g.s.mem, MiB, 801);
  tu_fill(unreg, 64 * KiB, 802);
  d = desc(unreg, g.s.mem, 4 * KiB);
  TU_ASSERT_STATUS(HixlEngineTransferSync(strict, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("BufferPool 0:0");
  TU_ASSERT_STATUS(HixlEngineTransferSync(strict, g.srv_name, HIXL_READ, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(strict, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_EQUAL(req, (HixlTransferReq)(void *)unreg);
  TU_ASSERT_PATTERN(unreg, 64 * KiB, 802, "unregistered local buffer");
  d = desc(g.src.base + SLACK - 10, g.s.mem, 20); /* straddles the end of its registration */
  TU_ASSERT_STATUS(HixlEngineTransferSync(strict, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_PATTERN(g.s.mem, MiB, 801, "server memory after refused local ranges");
  TU_ASSERT_OK(HixlEngineDeregisterMem(strict, sh));
  TU_ASSERT_OK(HixlEngineDestroy(strict));

  /* The default client stages the same ops: the data arrives. */
  d = desc(unreg, g.s.mem, 4 * KiB);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  TU_ASSERT_PATTERN(g.s.mem, 4 * KiB, 802, "server memory after a staged WRITE");
  memset(dst_end, 0x5A, 64);
  d = desc(dst_end - 10, g.s.mem + 100, 20); /* straddles the end of a registration: staged too */
  TU_ASSERT_OK(xfer(HIXL_READ, &d, 1));
  TU_ASSERT_SAME(dst_end - 10, g.s.mem + 100, 20, "staged READ across a registration's end");
  CU_ASSERT_EQUAL(tu_check_byte(dst_end + 10, 54, 0x5A), -1);
  /* Server memory is a remote registration, not a local one of the client: as local
   * memory it is plain host memory of this process, so it is staged as well. */
  tu_free_mem(unreg, 64 * KiB);
}

/* ---------------------------------------------------------------- links */

static void test_duplicate_connect(void) {
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, 1000), HIXL_ALREADY_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineConnect(g.cli, g.srv_name, 0), HIXL_ALREADY_CONNECTED);
  write_read_back(4 * KiB, 0, 16, 16, 901); /* the link is unharmed */
}

static void test_not_connected(void) {
  HixlEngine *other = tu_engine_start(tu_ip());
  unsigned char *m = tu_alloc_mem(64 * KiB, false);
  HixlMemHandle h;
  HixlTransferOpDesc d;
  HixlTransferReq req = NULL;
  HixlNotifyDesc n = {.name = "n", .msg = "m", .remote_engine = NULL};
  char nowhere[TU_ADDR_LEN];

  CU_ASSERT_PTR_NOT_NULL_FATAL(other);
  CU_ASSERT_PTR_NOT_NULL_FATAL(m);
  h = tu_register(other, m, 64 * KiB);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  tu_fill(g.s.mem, 64 * KiB, 911);
  d = desc(m, g.s.mem, 4 * KiB);
  /* The server listens but this engine never connected to it. */
  TU_ASSERT_STATUS(HixlEngineTransferSync(other, g.srv_name, HIXL_WRITE, &d, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineTransferSync(other, g.srv_name, HIXL_READ, &d, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(other, g.srv_name, HIXL_WRITE, &d, 1, 1000, NULL, &req),
                   HIXL_NOT_CONNECTED);
  CU_ASSERT_PTR_NULL(req);
  TU_ASSERT_STATUS(HixlEngineSendNotify(other, g.srv_name, &n, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineDisconnect(other, g.srv_name, 1000), HIXL_NOT_CONNECTED);
  /* An address nobody has heard of. */
  tu_addr(nowhere, sizeof(nowhere), tu_free_port());
  TU_ASSERT_STATUS(HixlEngineTransferSync(other, nowhere, HIXL_WRITE, &d, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_PATTERN(g.s.mem, 64 * KiB, 911, "server memory");
  TU_ASSERT_OK(HixlEngineDeregisterMem(other, h));
  TU_ASSERT_OK(HixlEngineDestroy(other));
  tu_free_mem(m, 64 * KiB);
}

static void check_connect_timeout(int32_t timeout_ms) {
  char nowhere[TU_ADDR_LEN];
  int32_t expect = timeout_ms ? timeout_ms : HIXL_DEFAULT_TIMEOUT_MS;
  int64_t t0, elapsed;
  HixlStatus st;

  tu_addr(nowhere, sizeof(nowhere), tu_free_port()); /* nothing listens there */
  t0 = tu_now_ms();
  st = HixlEngineConnect(g.cli, nowhere, timeout_ms);
  elapsed = tu_now_ms() - t0;
  TU_ASSERT_STATUS(st, HIXL_TIMEOUT);
  if (elapsed > expect + 500 || elapsed < expect - 20)
    tu_fail(__FILE__, __LINE__, "Connect(%s, %d ms) took %lld ms, want [%d, %d]", nowhere, (int)timeout_ms,
            (long long)elapsed, (int)expect - 20, (int)expect + 500);
  else
    CU_PASS("connect timeout in bounds");
  /* Nothing half-made was left behind. */
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, nowhere, 100), HIXL_NOT_CONNECTED);
}

static void test_connect_timeout(void) {
  check_connect_timeout(300);
  check_connect_timeout(50);
  check_connect_timeout(0); /* the default, 1000 ms */
}

struct connect_arg {
  HixlEngine *e;
  const char *remote;
  int32_t timeout_ms;
  HixlStatus st;
};

static void *connect_thread(void *p) {
  struct connect_arg *a = p;

  a->st = HixlEngineConnect(a->e, a->remote, a->timeout_ms);
  return NULL;
}

/* Connect retries while nothing listens yet; the server may start at any moment
 * during the call (or even before it): the result must be SUCCESS either way. */
static void test_connect_before_listen(void) {
  char name[TU_ADDR_LEN];
  struct connect_arg a;
  pthread_t th;
  HixlEngine *late, *cli2;
  unsigned char *m = tu_alloc_mem(MiB, false), *cm = tu_alloc_mem(MiB, false);
  HixlMemHandle h, ch;
  HixlTransferOpDesc d;

  CU_ASSERT_FATAL(m && cm);
  cli2 = tu_engine_start(tu_ip());
  CU_ASSERT_PTR_NOT_NULL_FATAL(cli2);
  ch = tu_register(cli2, cm, MiB);
  tu_addr(name, sizeof(name), tu_free_port());
  a.e = cli2;
  a.remote = name;
  a.timeout_ms = 10000;
  a.st = 0xdead;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, connect_thread, &a) == 0);
  late = tu_engine_start(name);
  h = late ? tu_register(late, m, MiB) : NULL;
  pthread_join(th, NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(late);
  CU_ASSERT_PTR_NOT_NULL(h);
  TU_ASSERT_STATUS(a.st, HIXL_SUCCESS);
  if (a.st == HIXL_SUCCESS && h && ch) {
    tu_fill(cm, MiB, 951);
    d = desc(cm, m, MiB);
    TU_ASSERT_OK(HixlEngineTransferSync(cli2, name, HIXL_WRITE, &d, 1, XFER_TIMEOUT));
    TU_ASSERT_PATTERN(m, MiB, 951, "late listener memory");
  }
  TU_ASSERT_OK(HixlEngineDestroy(cli2));
  TU_ASSERT_OK(HixlEngineDestroy(late));
  tu_free_mem(m, MiB);
  tu_free_mem(cm, MiB);
}

static void test_disconnect_reconnect(void) {
  HixlTransferOpDesc d = desc(g.src.mem, g.s.mem, 4 * KiB);
  HixlTransferReq req = NULL;

  TU_ASSERT_OK(HixlEngineDisconnect(g.cli, g.srv_name, 1000));
  TU_ASSERT_STATUS(xfer(HIXL_WRITE, &d, 1), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(xfer(HIXL_READ, &d, 1), HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_READ, &d, 1, 1000, NULL, &req),
                   HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(HixlEngineDisconnect(g.cli, g.srv_name, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  write_read_back(MiB + 1, 3, 16, 16, 961);
  /* Several rounds, to catch state that lingers on either side. */
  for (int i = 0; i < 5; i++) {
    TU_ASSERT_OK(HixlEngineDisconnect(g.cli, g.srv_name, 1000));
    TU_ASSERT_OK(HixlEngineConnect(g.cli, g.srv_name, 5000));
  }
  write_read_back(64 * KiB, 0, 16, 16, 962);
}

/* ---------------------------------------------------------------- registration */

static void test_register_after_connect(void) {
  const size_t len = 2 * MiB;
  unsigned char *late = tu_alloc_mem(len + 2 * 4096, false);
  unsigned char *m;
  HixlMemHandle h;
  HixlTransferOpDesc d;

  CU_ASSERT_PTR_NOT_NULL_FATAL(late);
  m = late + 4096;
  h = tu_register(g.srv, m, len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  /* Used at once, without reconnecting. */
  tu_fill(g.src.mem, len, 971);
  d = desc(g.src.mem, m, len);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  TU_ASSERT_PATTERN(m, len, 971, "memory registered after Connect");
  memset(g.dst.mem, 0, len);
  d = desc(g.dst.mem, m + 1, len - 1);
  TU_ASSERT_OK(xfer(HIXL_READ, &d, 1));
  CU_ASSERT_EQUAL(tu_mismatch(g.dst.mem, m + 1, len - 1), -1);

  /* Deregistered: transfers into that range now fail and leave it alone. */
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.srv, h));
  tu_fill(m, len, 972);
  tu_fill(g.src.mem, len, 973);
  d = desc(g.src.mem, m, len);
  TU_ASSERT_STATUS(xfer(HIXL_WRITE, &d, 1), HIXL_FAILED);
  d = desc(g.src.mem, m + len / 2, 100);
  TU_ASSERT_STATUS(xfer(HIXL_WRITE, &d, 1), HIXL_FAILED);
  memset(g.dst.mem, 0xCD, 4096);
  d = desc(g.dst.mem, m, 4096);
  TU_ASSERT_STATUS(xfer(HIXL_READ, &d, 1), HIXL_FAILED);
  CU_ASSERT_EQUAL(tu_check_byte(g.dst.mem, 4096, 0xCD), -1);
  TU_ASSERT_PATTERN(m, len, 972, "deregistered server memory");

  /* Registered again (a new handle): usable again. */
  h = tu_register(g.srv, m, len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  d = desc(g.src.mem, m, len);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  TU_ASSERT_PATTERN(m, len, 973, "re-registered server memory");
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.srv, h));
  tu_free_mem(late, len + 2 * 4096);
}

/* A client-side deregistration makes that local range unusable. */
static void test_local_deregister(void) {
  unsigned char *m = tu_alloc_mem(MiB, false);
  HixlMemHandle h;
  HixlTransferOpDesc d;

  CU_ASSERT_PTR_NOT_NULL_FATAL(m);
  h = tu_register(g.cli, m, MiB);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  tu_fill(m, MiB, 981);
  d = desc(m, g.s.mem, MiB);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  TU_ASSERT_PATTERN(g.s.mem, MiB, 981, "before local deregister");
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.cli, h));
  /* No longer registered: plain host memory, staged through the pool from now on. */
  tu_fill(m, MiB, 982);
  TU_ASSERT_OK(xfer(HIXL_WRITE, &d, 1));
  TU_ASSERT_PATTERN(g.s.mem, MiB, 982, "server after a staged WRITE from deregistered memory");
  memset(m, 0, MiB);
  TU_ASSERT_OK(xfer(HIXL_READ, &d, 1));
  TU_ASSERT_PATTERN(m, MiB, 982, "deregistered local memory after a staged READ");
  tu_free_mem(m, MiB);
}

/* ---------------------------------------------------------------- notify */

/* Collect notifications on e until want have arrived or the deadline passes. */
static size_t drain_notifies(HixlEngine *e, char (*names)[64], char (*msgs)[64], char (*from)[64],
                             size_t want, int timeout_ms) {
  int64_t deadline = tu_now_ms() + timeout_ms;
  HixlNotifyDesc *list;
  size_t count, got = 0, i;

  while (got < want && tu_now_ms() < deadline) {
    list = NULL;
    count = 0;
    if (HixlEngineGetNotifies(e, &list, &count) != HIXL_SUCCESS) {
      tu_fail(__FILE__, __LINE__, "GetNotifies: %s", HixlGetLastErrorMessage());
      break;
    }
    for (i = 0; i < count; i++, got++) {
      if (got >= want) continue; /* more than expected: counted, not kept */
      snprintf(names[got], 64, "%s", list[i].name ? list[i].name : "(null)");
      snprintf(msgs[got], 64, "%s", list[i].msg ? list[i].msg : "(null)");
      snprintf(from[got], 64, "%s", list[i].remote_engine ? list[i].remote_engine : "(null)");
    }
    HixlEngineFreeNotifies(list);
    if (count == 0) sched_yield();
  }
  return got;
}

static void test_notify(void) {
  enum { N = 100 };
  static char names[N][64], msgs[N][64], from[N][64];
  HixlNotifyDesc n = {.name = "kv_ready", .msg = "req-42 layer 7", .remote_engine = "ignored"};
  HixlNotifyDesc *list = NULL;
  size_t count = 9, got, i;
  char want[64];

  TU_ASSERT_OK(HixlEngineSendNotify(g.cli, g.srv_name, &n, 5000));
  got = drain_notifies(g.srv, names, msgs, from, 1, 5000);
  CU_ASSERT_EQUAL_FATAL(got, 1);
  CU_ASSERT_STRING_EQUAL(names[0], "kv_ready");
  CU_ASSERT_STRING_EQUAL(msgs[0], "req-42 layer 7");
  if (strcmp(from[0], g.cli_name) != 0)
    tu_fail(__FILE__, __LINE__, "remote_engine is \"%s\", want the sender's name \"%s\"", from[0],
            g.cli_name);
  /* Drained. */
  TU_ASSERT_OK(HixlEngineGetNotifies(g.srv, &list, &count));
  CU_ASSERT_EQUAL(count, 0);
  CU_ASSERT_PTR_NULL(list);
  HixlEngineFreeNotifies(list);

  /* Many, in the order sent; the sender's own queue stays empty. */
  for (i = 0; i < N; i++) {
    char nm[32], ms[32];
    snprintf(nm, sizeof(nm), "name-%zu", i);
    snprintf(ms, sizeof(ms), "msg-%zu", i * 7);
    n.name = nm;
    n.msg = ms;
    TU_ASSERT_OK(HixlEngineSendNotify(g.cli, g.srv_name, &n, 5000));
  }
  got = drain_notifies(g.srv, names, msgs, from, N, 5000);
  CU_ASSERT_EQUAL(got, N);
  for (i = 0; i < got && i < N; i++) {
    snprintf(want, sizeof(want), "name-%zu", i);
    if (strcmp(names[i], want) != 0) {
      tu_fail(__FILE__, __LINE__, "notify %zu: name \"%s\", want \"%s\"", i, names[i], want);
      break;
    }
    snprintf(want, sizeof(want), "msg-%zu", i * 7);
    if (strcmp(msgs[i], want) != 0) {
      tu_fail(__FILE__, __LINE__, "notify %zu: msg \"%s\", want \"%s\"", i, msgs[i], want);
      break;
    }
  }
  TU_ASSERT_OK(HixlEngineGetNotifies(g.cli, &list, &count));
  CU_ASSERT_EQUAL(count, 0);
  HixlEngineFreeNotifies(list);
}

/* A sender that listens itself is named by its "ip:port". */
static void test_notify_from_server_engine(void) {
  static char names[1][64], msgs[1][64], from[1][64];
  char name[TU_ADDR_LEN];
  HixlEngine *e = tu_engine_start(tu_addr(name, sizeof(name), tu_free_port()));
  HixlNotifyDesc n = {.name = "", .msg = "", .remote_engine = NULL};

  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  TU_ASSERT_OK(HixlEngineConnect(e, g.srv_name, 5000));
  n.name = "from-server";
  n.msg = "";
  TU_ASSERT_OK(HixlEngineSendNotify(e, g.srv_name, &n, 5000));
  CU_ASSERT_EQUAL(drain_notifies(g.srv, names, msgs, from, 1, 5000), 1);
  CU_ASSERT_STRING_EQUAL(names[0], "from-server");
  CU_ASSERT_STRING_EQUAL(msgs[0], "");
  CU_ASSERT_STRING_EQUAL(from[0], name);
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* The queue's bounds: one link holds at most HIXL_MAX_NOTIFY_PER_LINK undrained, so a
 * peer that floods it leaves room for the others; all links together at most
 * HIXL_MAX_NOTIFY_QUEUE; a drain gives every link its share again. */
static void test_notify_bounds(void) {
  enum { PEERS = HIXL_MAX_NOTIFY_QUEUE / HIXL_MAX_NOTIFY_PER_LINK + 1 };
  HixlEngine *p[PEERS] = {NULL};
  HixlNotifyDesc n = {.name = "flood", .msg = "m", .remote_engine = NULL}, *list = NULL;
  size_t count = 0, from_first = 0;

  for (int k = 0; k < PEERS; k++) {
    char name[TU_ADDR_LEN];
    p[k] = tu_engine_start(tu_addr(name, sizeof(name), tu_free_port()));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p[k]);
    TU_ASSERT_OK(HixlEngineConnect(p[k], g.srv_name, 5000));
  }
  for (int i = 0; i < HIXL_MAX_NOTIFY_PER_LINK; i++)
    if (HixlEngineSendNotify(p[0], g.srv_name, &n, 5000) != HIXL_SUCCESS) {
      tu_fail(__FILE__, __LINE__, "notification %d of the first link: %s", i, HixlGetLastErrorMessage());
      break;
    }
  TU_ASSERT_STATUS(HixlEngineSendNotify(p[0], g.srv_name, &n, 5000), HIXL_NOTIFY_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "from one link"));
  /* The others fill the rest of the queue, each within its share; then it is full. */
  for (int k = 1; k < PEERS - 1; k++)
    for (int i = 0; i < HIXL_MAX_NOTIFY_PER_LINK; i++)
      if (HixlEngineSendNotify(p[k], g.srv_name, &n, 5000) != HIXL_SUCCESS) {
        tu_fail(__FILE__, __LINE__, "notification %d of link %d: %s", i, k, HixlGetLastErrorMessage());
        k = PEERS;
        break;
      }
  TU_ASSERT_STATUS(HixlEngineSendNotify(p[PEERS - 1], g.srv_name, &n, 5000), HIXL_NOTIFY_FAILED);
  TU_ASSERT_OK(HixlEngineGetNotifies(g.srv, &list, &count));
  CU_ASSERT_EQUAL(count, HIXL_MAX_NOTIFY_QUEUE);
  for (size_t i = 0; i < count; i++) from_first += strcmp(list[i].remote_engine, list[0].remote_engine) == 0;
  CU_ASSERT_EQUAL(from_first, HIXL_MAX_NOTIFY_PER_LINK);
  HixlEngineFreeNotifies(list);
  /* Drained: the first link has its share again, and the last one gets in. */
  TU_ASSERT_OK(HixlEngineSendNotify(p[0], g.srv_name, &n, 5000));
  TU_ASSERT_OK(HixlEngineSendNotify(p[PEERS - 1], g.srv_name, &n, 5000));
  TU_ASSERT_OK(HixlEngineGetNotifies(g.srv, &list, &count));
  CU_ASSERT_EQUAL(count, 2);
  HixlEngineFreeNotifies(list);
  for (int k = 0; k < PEERS; k++) TU_ASSERT_OK(HixlEngineDestroy(p[k]));
}

/* ------------------------------------------------------------ allocated memory */

/* Descriptors of this process open on hixl's memfds. */
static int memfd_count(void) {
  int n = 0;
  struct dirent *de;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while ((de = readdir(d))) {
    char path[300], target[256];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
    ssize_t k = readlink(path, target, sizeof(target) - 1);
    if (k <= 0) continue;
    target[k] = '\0';
    n += strncmp(target, "/memfd:hixl (deleted)", 21) == 0; /* not /memfd:hixl-gen, the shm page */
  }
  closedir(d);
  return n;
}

/* Whether /proc/self/maps names p's mapping as hixl's memfd. */
static bool mapped_as_memfd(const void *p) {
  char line[512];
  bool found = false;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return false;
  while (!found && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
      found = strstr(line, "/memfd:hixl") != NULL;
  }
  fclose(f);
  return found;
}

/* Memory from HixlEngineAllocMem: a memfd's shared mapping, zeroed and registered, so a
 * peer WRITEs and READs it (every byte checked); DeregisterMem refuses it; FreeMem
 * releases it once and refuses anything else; a peer cannot reach it afterwards;
 * Finalize releases what is left (no descriptor stays open). */
static void test_alloc_mem(void) {
  const size_t len = 3 * MiB + 1;
  void *p = NULL;
  HixlMemHandle h = NULL;
  int fds0 = memfd_count();

  TU_ASSERT_STATUS(HixlEngineAllocMem(g.srv, 0, &p, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineAllocMem(g.srv, 4096, NULL, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineAllocMem(g.srv, 4096, &p, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineAllocMem(NULL, 4096, &p, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineFreeMem(g.srv, NULL), HIXL_PARAM_INVALID);
  TU_ASSERT_OK_FATAL(HixlEngineAllocMem(g.srv, len, &p, &h));
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  CU_ASSERT_EQUAL(tu_check_byte(p, len, 0), -1);
  CU_ASSERT_TRUE(mapped_as_memfd(p));
  CU_ASSERT_EQUAL(memfd_count(), fds0 + 1);

  tu_fill(g.src.mem, len, 0x51);
  HixlTransferOpDesc w = {.local_addr = (uintptr_t)g.src.mem, .remote_addr = (uintptr_t)p, .len = len};
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, &w, 1, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(p, len, 0x51, "allocated memory after a peer's WRITE");
  memset(g.dst.mem, 0, len);
  tu_fill(p, len, 0x52);
  HixlTransferOpDesc r = {.local_addr = (uintptr_t)g.dst.mem, .remote_addr = (uintptr_t)p, .len = len};
  TU_ASSERT_OK(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &r, 1, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(g.dst.mem, len, 0x52, "a peer's READ of allocated memory");

  TU_ASSERT_STATUS(HixlEngineDeregisterMem(g.srv, h), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("HixlEngineFreeMem");
  TU_ASSERT_STATUS(HixlEngineFreeMem(g.srv, g.s.h), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("HixlEngineDeregisterMem");
  TU_ASSERT_OK(HixlEngineFreeMem(g.srv, h));
  CU_ASSERT_FALSE(mapped_as_memfd(p));
  CU_ASSERT_EQUAL(memfd_count(), fds0);
  TU_ASSERT_STATUS(HixlEngineFreeMem(g.srv, h), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, &r, 1, XFER_TIMEOUT), HIXL_FAILED);

  char name[TU_ADDR_LEN];
  HixlEngine *e = tu_engine_start(tu_addr(name, sizeof(name), tu_free_port()));
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  int fds1 = memfd_count();
  void *p2 = NULL;
  TU_ASSERT_OK(HixlEngineAllocMem(e, 5000, &p, &h));
  TU_ASSERT_OK(HixlEngineAllocMem(e, 64 * MiB, &p2, &h));
  CU_ASSERT_EQUAL(memfd_count(), fds1 + 2);
  CU_ASSERT_TRUE(mapped_as_memfd(p) && mapped_as_memfd(p2));
  TU_ASSERT_OK(HixlEngineFinalize(e));
  CU_ASSERT_FALSE(mapped_as_memfd(p));
  CU_ASSERT_FALSE(mapped_as_memfd(p2));
  CU_ASSERT_EQUAL(memfd_count(), fds1);
  TU_ASSERT_STATUS(HixlEngineAllocMem(e, 4096, &p, &h), HIXL_PARAM_INVALID); /* not initialized */
  TU_ASSERT_OK(HixlEngineDestroy(e));
}

/* ------------------------------------------------------- services and order */

/* What the handler below lets go of: it overwrites the memory, as a host reusing
 * blocks after a FREE would. */
struct reuse_on_call {
  unsigned char *mem;
  size_t len;
  int calls;
};

static HixlStatus reuse_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                size_t cap, size_t *resp_len) {
  struct reuse_on_call *r = ctx;
  (void)peer, (void)req, (void)len, (void)resp, (void)cap;
  memset(r->mem, 0xEE, r->len);
  r->calls++;
  *resp_len = 0;
  return HIXL_SUCCESS;
}

/* Over tcp a target sends READ answers straight from its memory. A CALL that follows
 * a READ on the same link is served only once that answer has been sent, so a
 * handler that lets the memory go (overwrites it here) cannot change what the READ
 * delivers: all 64 MiB arrive as they were before the CALL. */
static void test_call_after_answers(void) {
  enum { SERVICE = 3 };
  const size_t len = 64 * MiB;
  char name[TU_ADDR_LEN];
  struct reuse_on_call r = {.mem = g.s.mem, .len = len};
  unsigned char *dst = tu_alloc_mem(len, false);
  HixlEngine *e = tu_engine_start_with(tu_addr(name, sizeof(name), tu_free_port()), "tcp");
  HixlTransferReq req = NULL;
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  uint8_t resp[16];
  size_t n = 1;

  CU_ASSERT_PTR_NOT_NULL_FATAL(dst);
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  HixlMemHandle h = tu_register(e, dst, len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  tu_fill(g.s.mem, len, 0xF3);
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, SERVICE, reuse_handler, &r));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(e, g.srv_name, 5000));
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)dst, .remote_addr = (uintptr_t)g.s.mem, .len = len};
  TU_ASSERT_OK(HixlEngineTransferAsync(e, g.srv_name, HIXL_READ, &op, 1, XFER_TIMEOUT, NULL, &req));
  TU_ASSERT_OK(hixl_engine_call(e, g.srv_name, SERVICE, NULL, 0, resp, sizeof(resp), &n, XFER_TIMEOUT));
  CU_ASSERT_EQUAL(n, 0);
  CU_ASSERT_EQUAL(r.calls, 1);
  TU_ASSERT_OK(tu_wait_request(e, req, tu_now_ms() + XFER_TIMEOUT, &fin));
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_PATTERN(dst, len, 0xF3, "the READ sent before the CALL");
  CU_ASSERT_EQUAL(tu_check_byte(g.s.mem, len, 0xEE), -1); /* the handler did run */
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, SERVICE, NULL, NULL));
  TU_ASSERT_OK(HixlEngineDeregisterMem(e, h));
  TU_ASSERT_OK(HixlEngineDestroy(e));
  tu_free_mem(dst, len);
}

/* The handler below answers "<n>:<request>" and records the order it served them. */
struct order_on_call {
  int calls;
  char seen[16][16];
};

static HixlStatus order_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                size_t cap, size_t *resp_len) {
  struct order_on_call *o = ctx;
  (void)peer;
  if (len >= sizeof(o->seen[0]) || o->calls >= 16) return HIXL_PARAM_INVALID;
  memcpy(o->seen[o->calls], req, len);
  o->seen[o->calls][len] = '\0';
  int n = snprintf((char *)resp, cap, "%d:%.*s", o->calls++, (int)len, (const char *)req);
  *resp_len = (size_t)n;
  return HIXL_SUCCESS;
}

/* hixl_engine_call_start: eight calls leave before the first answer is waited for;
 * the peer serves them in the order they were started, each answer lands in its own
 * buffer and length; a service the peer lacks comes back UNSUPPORTED at the wait; a
 * call to an engine not linked fails at the start. */
static void test_call_start(void) {
  enum { SERVICE = 3, N = 8 };
  struct order_on_call o = {0};
  hixl_call_t calls[N];
  uint8_t ans[N][32];
  uint32_t alen[N];
  char req[N][8];
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, SERVICE, order_handler, &o));
  for (int i = 0; i < N; i++) {
    snprintf(req[i], sizeof(req[i]), "r%d", i);
    alen[i] = 999;
    TU_ASSERT_OK(hixl_engine_call_start(g.cli, g.srv_name, SERVICE, req[i], strlen(req[i]), ans[i],
                                        sizeof(ans[i]), &alen[i], XFER_TIMEOUT, &calls[i]));
  }
  for (int i = N - 1; i >= 0; i--) TU_ASSERT_OK(hixl_engine_call_wait(g.cli, g.srv_name, calls[i]));
  CU_ASSERT_EQUAL(o.calls, N);
  for (int i = 0; i < N; i++) {
    char want[32];
    int n = snprintf(want, sizeof(want), "%d:r%d", i, i);
    CU_ASSERT_STRING_EQUAL(o.seen[i], req[i]);
    CU_ASSERT_EQUAL(alen[i], (uint32_t)n);
    CU_ASSERT(alen[i] == (uint32_t)n && memcmp(ans[i], want, (size_t)n) == 0);
  }
  hixl_call_t c;
  TU_ASSERT_OK(hixl_engine_call_start(g.cli, g.srv_name, HIXL_SERVICE_KV, "x", 1, ans[0], sizeof(ans[0]),
                                      &alen[0], XFER_TIMEOUT, &c));
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, c), HIXL_UNSUPPORTED);
  char other[TU_ADDR_LEN];
  TU_ASSERT_STATUS(hixl_engine_call_start(g.cli, tu_addr(other, sizeof(other), tu_free_port()), SERVICE, "x",
                                          1, ans[0], sizeof(ans[0]), &alen[0], XFER_TIMEOUT, &c),
                   HIXL_NOT_CONNECTED);
  TU_ASSERT_STATUS(hixl_engine_call_start(g.cli, g.srv_name, SERVICE, "x", 1, ans[0], sizeof(ans[0]),
                                          &alen[0], XFER_TIMEOUT, NULL),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, SERVICE, NULL, NULL));
}

/* The handler below is told which bytes a transfer just wrote to the server ("the
 * layer landed"): it answers "ok" only when every one of them is there already. */
struct landed_req {
  uint64_t off, len, seed;
};

struct landed_on_call {
  unsigned char *mem;
  int calls, bad;
};

static HixlStatus landed_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                 size_t cap, size_t *resp_len) {
  struct landed_on_call *l = ctx;
  struct landed_req q;
  (void)peer;
  if (len != sizeof(q)) return HIXL_PARAM_INVALID;
  memcpy(&q, req, sizeof(q));
  l->calls++;
  ptrdiff_t at = tu_check_pattern(l->mem + q.off, q.len, q.seed);
  if (at >= 0) {
    l->bad++;
    *resp_len =
        (size_t)snprintf((char *)resp, cap, "byte %td of %llu not there yet", at, (unsigned long long)q.len);
    return HIXL_FAILED;
  }
  *resp_len = (size_t)snprintf((char *)resp, cap, "ok %d", l->calls);
  return HIXL_SUCCESS;
}

/* hixl_engine_transfer_then_call: eight 8 MiB WRITEs, each with a call behind it,
 * started back to back and waited for at the end: every call finds its WRITE's bytes
 * all there (the RDMA data does not ride the socket the call goes on), in order; a
 * transfer that fails at the peer (an op outside its registrations) fails the call,
 * which is never served; a service the peer lacks is UNSUPPORTED after the data. */
static void test_transfer_then_call(void) {
  enum { SERVICE = 3, N = 8 };
  const size_t len = 8 * MiB; /* more than an RDMA caller posts itself (the rest leaves later) */
  struct landed_on_call l = {.mem = g.s.mem};
  struct landed_req q[N];
  hixl_call_t calls[N];
  uint8_t ans[N][64];
  uint32_t alen[N];
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, SERVICE, landed_handler, &l));
  memset(g.s.mem, 0xEE, N * len);
  for (int i = 0; i < N; i++) {
    q[i] = (struct landed_req){(size_t)i * len, len, 9100 + (uint64_t)i};
    tu_fill(g.src.mem + q[i].off, len, q[i].seed);
    HixlTransferOpDesc d = desc(g.src.mem + q[i].off, g.s.mem + q[i].off, len);
    alen[i] = 999;
    TU_ASSERT_OK(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &d, 1, SERVICE, &q[i],
                                                sizeof(q[i]), ans[i], sizeof(ans[i]), &alen[i], XFER_TIMEOUT,
                                                &calls[i]));
  }
  for (int i = 0; i < N; i++) TU_ASSERT_OK(hixl_engine_call_wait(g.cli, g.srv_name, calls[i]));
  CU_ASSERT_EQUAL(l.calls, N);
  CU_ASSERT_EQUAL(l.bad, 0);
  for (int i = 0; i < N; i++) {
    char want[16];
    int n = snprintf(want, sizeof(want), "ok %d", i + 1);
    CU_ASSERT(alen[i] == (uint32_t)n && memcmp(ans[i], want, (size_t)n) == 0);
    TU_ASSERT_PATTERN(g.s.mem + q[i].off, len, q[i].seed, "a WRITE with a call behind it");
  }

  /* The second op lies past the registration's end: refused whole at the start,
   * nothing sent, the call neither. */
  unsigned char *end = g.s.mem + REG_LEN;
  tu_fill(end, SLACK, 9200);
  HixlTransferOpDesc d[2] = {desc(g.src.mem, g.s.mem, 4 * KiB),
                             desc(g.src.mem + 4 * KiB, end - 100, 4 * KiB)};
  hixl_call_t c = NULL;
  TU_ASSERT_STATUS(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, d, 2, SERVICE, &q[0],
                                                  sizeof(q[0]), ans[0], sizeof(ans[0]), &alen[0],
                                                  XFER_TIMEOUT, &c),
                   HIXL_FAILED);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(l.calls, N);
  TU_ASSERT_PATTERN(end, SLACK, 9200, "bytes after the registration");

  /* Data, then a service nobody serves. */
  tu_fill(g.src.mem, len, 9300);
  HixlTransferOpDesc one = desc(g.src.mem, g.s.mem, len);
  TU_ASSERT_OK(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &one, 1, HIXL_SERVICE_KV, "x", 1,
                                              ans[0], sizeof(ans[0]), &alen[0], XFER_TIMEOUT, &c));
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, c), HIXL_UNSUPPORTED);
  TU_ASSERT_PATTERN(g.s.mem, len, 9300, "a WRITE with an unserved call behind it");
  TU_ASSERT_STATUS(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &one, 1, SERVICE, "x", 1,
                                                  ans[0], sizeof(ans[0]), &alen[0], XFER_TIMEOUT, NULL),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, SERVICE, NULL, NULL));
}

/* A handler that holds the server's progress thread until the test lets it go. */
/* A server whose progress thread a HOLD call keeps in its handler until released,
 * with the LANDED service beside it; over tcp it then reads nothing from the link. */
enum { HOLD = 2, LANDED = 3 }; /* 2: the KV service slot, unused here */
struct held_peer {
  struct tu_hold h;
  struct landed_on_call l;
  hixl_call_t held;
  uint8_t ans[8];
  uint32_t alen;
};

static void held_peer_start(struct held_peer *p) {
  p->h = (struct tu_hold)TU_HOLD_INIT;
  p->l = (struct landed_on_call){.mem = g.s.mem};
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, HOLD, tu_hold_handler, &p->h));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, LANDED, landed_handler, &p->l));
  TU_ASSERT_OK_FATAL(hixl_engine_call_start(g.cli, g.srv_name, HOLD, NULL, 0, p->ans, sizeof(p->ans),
                                            &p->alen, XFER_TIMEOUT, &p->held));
  tu_hold_entered(&p->h);
}

static void held_peer_release(struct held_peer *p) { tu_hold_release(&p->h); }

static void held_peer_end(void) {
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, HOLD, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, LANDED, NULL, NULL));
}

/* tcp: a peer that reads nothing (its progress thread held) takes none of a WRITE
 * larger than the sockets' buffers can hold (64 MiB; their maxima here are 32 + 4 MiB,
 * Debian's 6 + 4): the transfer times out at the wait with frames still queued, and
 * the call behind them never leaves: once the peer goes on, a call sent after it is
 * served and the first never is. A small WRITE (32 KiB) and its call fit in the
 * sockets: the wait still times out (no answer comes), but the call has left behind
 * its data, and the peer serves it once it goes on, with every byte there. */
static void test_then_call_timeout(void) {
  const size_t len = 64 * MiB, small = 32 * KiB;
  const char *t = tu_transport();
  if (!t || strcmp(t, "tcp") != 0) return; /* shm and rdma move the data without the peer's thread */
  struct held_peer p;
  struct landed_req q = {0, len, 9400};
  uint8_t ans[64];
  uint32_t alen = 0;
  size_t n = 0;
  hixl_call_t c;
  held_peer_start(&p);
  tu_fill(g.src.mem, len, q.seed);
  HixlTransferOpDesc d = desc(g.src.mem, g.s.mem, len);
  TU_ASSERT_OK(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &d, 1, LANDED, &q, sizeof(q),
                                              ans, sizeof(ans), &alen, 300, &c));
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, c), HIXL_TIMEOUT);
  held_peer_release(&p);
  TU_ASSERT_OK(hixl_engine_call_wait(g.cli, g.srv_name, p.held));
  /* Served after everything the link carried before it. */
  TU_ASSERT_STATUS(hixl_engine_call(g.cli, g.srv_name, LANDED, "x", 1, ans, sizeof(ans), &n, XFER_TIMEOUT),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(p.l.calls, 0);
  held_peer_end();

  held_peer_start(&p);
  q = (struct landed_req){len, small, 9401};
  tu_fill(g.src.mem + q.off, small, q.seed);
  d = desc(g.src.mem + q.off, g.s.mem + q.off, small);
  TU_ASSERT_OK(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &d, 1, LANDED, &q, sizeof(q),
                                              ans, sizeof(ans), &alen, 300, &c));
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, c), HIXL_TIMEOUT);
  CU_ASSERT_EQUAL(p.l.calls, 0);
  held_peer_release(&p);
  TU_ASSERT_OK(hixl_engine_call_wait(g.cli, g.srv_name, p.held));
  TU_ASSERT_STATUS(hixl_engine_call(g.cli, g.srv_name, LANDED, "x", 1, ans, sizeof(ans), &n, XFER_TIMEOUT),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(p.l.calls, 1);
  CU_ASSERT_EQUAL(p.l.bad, 0);
  TU_ASSERT_PATTERN(g.s.mem + q.off, small, q.seed, "a WRITE whose call left before the wait gave up");
  held_peer_end();
}

/* tcp: the link is cut (this side drops the peer) while the peer reads nothing: the
 * WRITE fails, so the call behind it fails with it and is never served, after the peer
 * goes on either; the link comes back with Connect. */
static void test_then_call_link_cut(void) {
  const size_t len = 16 * MiB;
  const char *t = tu_transport();
  if (!t || strcmp(t, "tcp") != 0) return; /* shm and rdma move the data without the peer's thread */
  struct held_peer p;
  struct landed_req q = {0, len, 9500};
  uint8_t ans[64];
  uint32_t alen = 0;
  size_t n = 0, dropped = 0;
  hixl_call_t c;
  held_peer_start(&p);
  tu_fill(g.src.mem, len, q.seed);
  HixlTransferOpDesc d = desc(g.src.mem, g.s.mem, len);
  TU_ASSERT_OK(hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, &d, 1, LANDED, &q, sizeof(q),
                                              ans, sizeof(ans), &alen, XFER_TIMEOUT, &c));
  TU_ASSERT_OK(hixl_engine_drop_peer(g.cli, g.srv_name, "the test cuts the link", &dropped));
  CU_ASSERT_EQUAL(dropped, 1);
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, c), HIXL_FAILED); /* not TIMEOUT: it ended */
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "the test cuts the link"));
  TU_ASSERT_STATUS(hixl_engine_call_wait(g.cli, g.srv_name, p.held), HIXL_FAILED);
  held_peer_release(&p);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  /* Served after everything the server took from the old link. */
  TU_ASSERT_STATUS(hixl_engine_call(g.cli, g.srv_name, LANDED, "x", 1, ans, sizeof(ans), &n, XFER_TIMEOUT),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(p.l.calls, 0);
  held_peer_end();
}

/* The peer closes the link just before transfers start, one right after the other: a
 * staged async WRITE (its bytes make the peer's side answer with a reset), a then-call
 * and an async WRITE, each with a direct op and a staged one, then a sync WRITE; only
 * then are they waited for. Whichever thread here meets the close first (the progress
 * thread reading its end, or a start's own send finding the socket reset), each ends
 * NOT_CONNECTED at its start or FAILED at its end, never a crash; the call is never
 * served, and Connect brings the link back. Many rounds: which thread wins is the
 * scheduler's choice. */
static void test_peer_closed_at_start(void) {
  enum { ROUNDS_CLOSED = 30, ASYNCS = 2 };
  const size_t len = 256 * KiB, slen = 16 * KiB;
  unsigned char *unreg = tu_alloc_mem(slen, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(unreg);
  struct landed_on_call l = {.mem = g.s.mem};
  struct landed_req q = {0, len, 9600};
  uint8_t ans[64];
  uint32_t alen = 0;
  size_t n = 0;
  int started = 0, refused = 0;
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(g.srv, LANDED, landed_handler, &l));
  tu_fill(g.src.mem, len, q.seed);
  tu_fill(unreg, slen, 9601);
  HixlTransferOpDesc d[2] = {desc(g.src.mem, g.s.mem, len), desc(unreg, g.s.mem + len, slen)};
  for (int i = 0; i < ROUNDS_CLOSED; i++) {
    size_t dropped = 0;
    TU_ASSERT_OK(hixl_engine_drop_peer(g.srv, g.cli_name, "the peer closes", &dropped));
    CU_ASSERT_EQUAL_FATAL(dropped, 1);
    HixlTransferReq req[ASYNCS] = {NULL, NULL};
    hixl_call_t c = NULL;
    HixlStatus st[4];
    st[0] = HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, &d[1], 1, XFER_TIMEOUT, NULL, &req[0]);
    st[1] = hixl_engine_transfer_then_call(g.cli, g.srv_name, HIXL_WRITE, d, 2, LANDED, &q, sizeof(q), ans,
                                           sizeof(ans), &alen, XFER_TIMEOUT, &c);
    st[2] = HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, d, 2, XFER_TIMEOUT, NULL, &req[1]);
    st[3] = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, d, 2, XFER_TIMEOUT);
    for (int k = 0; k < 3; k++) {
      if (st[k] != HIXL_SUCCESS) {
        refused++;
        TU_ASSERT_STATUS(st[k], HIXL_NOT_CONNECTED);
        continue;
      }
      started++;
      if (k == 1) {
        st[k] = hixl_engine_call_wait(g.cli, g.srv_name, c);
      } else {
        HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
        TU_ASSERT_OK(tu_wait_request(g.cli, req[k / 2], tu_now_ms() + XFER_TIMEOUT + 1000, &ts));
        st[k] = ts == HIXL_TRANSFER_FAILED      ? HIXL_FAILED
                : ts == HIXL_TRANSFER_COMPLETED ? HIXL_SUCCESS
                                                : HIXL_TIMEOUT;
      }
    }
    for (int k = 0; k < 4; k++)
      if (st[k] != HIXL_FAILED && st[k] != HIXL_NOT_CONNECTED)
        tu_fail(__FILE__, __LINE__, "round %d, transfer %d on a closed link: %s", i, k,
                HixlStatusName(st[k]));
    TU_ASSERT_OK_FATAL(HixlEngineConnect(g.cli, g.srv_name, 5000));
  }
  fprintf(stderr, "  [async and then-call: %d started then failed, %d refused at the start]", started,
          refused);
  /* The server is there: a call on the new link is served (and refused by the handler). */
  TU_ASSERT_STATUS(hixl_engine_call(g.cli, g.srv_name, LANDED, "x", 1, ans, sizeof(ans), &n, XFER_TIMEOUT),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(l.calls, 0);
  TU_ASSERT_OK(hixl_engine_set_service(g.srv, LANDED, NULL, NULL));
  tu_free_mem(unreg, slen);
}

/* ---------------------------------------------------------------- threads */

enum { NTHREADS = 4, ROUNDS = 12 };
#define THREAD_SPAN (8 * MiB)

struct worker {
  pthread_t th;
  int idx;
  HixlStatus st; /* first failing status */
  int round;     /* where it happened, -1 if none */
  const char *what;
  ptrdiff_t mismatch; /* first bad offset on a data check */
  uint64_t last_seed;
};

static void *worker_main(void *p) {
  struct worker *w = p;
  size_t base = (size_t)w->idx * THREAD_SPAN, blk, n, i;
  unsigned char *src = g.src.mem + base, *srv = g.s.mem + base, *dst = g.dst.mem + base;
  HixlTransferOpDesc *d = malloc(4096 * sizeof(*d));
  HixlTransferReq req;
  HixlTransferStatus ts;
  HixlStatus st;
  uint64_t seed;

  w->round = -1;
  w->mismatch = -1;
  if (!d) {
    w->what = "malloc";
    w->round = 0;
    return NULL;
  }
  for (int r = 0; r < ROUNDS; r++) {
    seed = 1000 + (uint64_t)w->idx * 100 + (uint64_t)r;
    blk = (size_t)4096 << (r % 6); /* 4 KiB .. 128 KiB blocks */
    n = THREAD_SPAN / blk;
    tu_fill(src, THREAD_SPAN, seed);
    for (i = 0; i < n; i++) /* reversed order on the remote side */
      d[i] = desc(src + i * blk, srv + (n - 1 - i) * blk, blk);
    if (r % 2 == 0) {
      st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_WRITE, d, n, XFER_TIMEOUT);
    } else {
      req = NULL;
      st = HixlEngineTransferAsync(g.cli, g.srv_name, HIXL_WRITE, d, n, XFER_TIMEOUT, w, &req);
      if (st == HIXL_SUCCESS) {
        st = tu_wait_request(g.cli, req, tu_now_ms() + XFER_TIMEOUT + 1000, &ts);
        if (st == HIXL_SUCCESS && ts != HIXL_TRANSFER_COMPLETED) st = HIXL_FAILED;
      }
    }
    if (st != HIXL_SUCCESS) {
      w->st = st, w->round = r, w->what = "WRITE";
      break;
    }
    memset(dst, 0, THREAD_SPAN);
    for (i = 0; i < n; i++) d[i] = desc(dst + i * blk, srv + (n - 1 - i) * blk, blk);
    st = HixlEngineTransferSync(g.cli, g.srv_name, HIXL_READ, d, n, XFER_TIMEOUT);
    if (st != HIXL_SUCCESS) {
      w->st = st, w->round = r, w->what = "READ";
      break;
    }
    w->mismatch = tu_mismatch(dst, src, THREAD_SPAN);
    if (w->mismatch >= 0) {
      w->round = r, w->what = "read-back data";
      break;
    }
    w->last_seed = seed;
  }
  free(d);
  return NULL;
}

static void test_four_threads(void) {
  struct worker w[NTHREADS];
  int i;

  memset(w, 0, sizeof(w));
  for (i = 0; i < NTHREADS; i++) {
    w[i].idx = i;
    CU_ASSERT_FATAL(pthread_create(&w[i].th, NULL, worker_main, &w[i]) == 0);
  }
  for (i = 0; i < NTHREADS; i++) pthread_join(w[i].th, NULL);
  for (i = 0; i < NTHREADS; i++) {
    if (w[i].round >= 0)
      tu_fail(__FILE__, __LINE__, "thread %d round %d: %s failed: %s, mismatch at %td", i, w[i].round,
              w[i].what, HixlStatusName(w[i].st), w[i].mismatch);
    else
      CU_PASS("thread ok");
  }
  /* Each server region holds its thread's last round, blocks in reverse order. */
  for (i = 0; i < NTHREADS; i++) {
    size_t blk = (size_t)4096 << ((ROUNDS - 1) % 6), n = THREAD_SPAN / blk, b;
    unsigned char *srv = g.s.mem + (size_t)i * THREAD_SPAN;
    unsigned char *src = g.src.mem + (size_t)i * THREAD_SPAN;
    if (w[i].round >= 0) continue;
    for (b = 0; b < n; b++)
      if (tu_mismatch(srv + (n - 1 - b) * blk, src + b * blk, blk) >= 0) {
        tu_fail(__FILE__, __LINE__, "thread %d: server block %zu holds wrong data", i, n - 1 - b);
        break;
      }
    TU_ASSERT_PATTERN(src, THREAD_SPAN, w[i].last_seed, "thread source untouched");
  }
}

/* ---------------------------------------------------------------- main */

/* The link's data path. Engines get tu_transport(): unset (auto), two engines of one
 * process link over shm (the kernel always lets a process copy within itself), which
 * comes before rdma and tcp; told tcp (test_engine_transfer_tcp) or rdma (the
 * soft-RoCE guest), they use that. */
static void test_link_transport(void) {
  struct hixl_link_info li;
  const char *want = tu_transport();

  if (!want || strcmp(want, "auto") == 0) want = "shm";
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(g.cli, g.srv_name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, want);
  CU_ASSERT_EQUAL(li.rdma, strcmp(want, "rdma") == 0);
  if (strcmp(want, "shm") == 0) CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)getpid());
}

int main(void) {
  CU_pSuite s;

  /* Two engines of this one process link over shm only when authenticated (a pid that
   * is this process's own is proven by the socket's binding, docs/security.md): every
   * engine here, children included, holds a key. */
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  s = CU_add_suite("transfer (one process)", pair_init, pair_cleanup);
  CU_add_test(s, "link transport: shm under auto, else as told", test_link_transport);
  CU_add_test(s, "WRITE then READ back, 1 B to 64 MiB", test_sizes);
  CU_add_test(s, "batches of 1, 16, 1024, 4096 scattered ops", test_batches);
  CU_add_test(s, "mixed big and tiny ops in one batch", test_mixed_batch);
  CU_add_test(s, "async WRITE and READ, released after final", test_async_single);
  CU_add_test(s, "32 async requests in flight", test_async_many);
  CU_add_test(s, "remote range outside registrations: FAILED, untouched", test_remote_out_of_range);
  CU_add_test(s, "local range not registered: PARAM_INVALID", test_local_not_registered);
  CU_add_test(s, "duplicate Connect", test_duplicate_connect);
  CU_add_test(s, "transfer without Connect", test_not_connected);
  CU_add_test(s, "Connect where nothing listens: TIMEOUT in time", test_connect_timeout);
  CU_add_test(s, "Connect before the peer listens", test_connect_before_listen);
  CU_add_test(s, "Disconnect, then Connect again", test_disconnect_reconnect);
  CU_add_test(s, "server memory registered after Connect; deregistered", test_register_after_connect);
  CU_add_test(s, "client memory deregistered", test_local_deregister);
  CU_add_test(s, "notify delivery", test_notify);
  CU_add_test(s, "notify from a listening engine", test_notify_from_server_engine);
  CU_add_test(s, "notifications: one link holds a share of the queue", test_notify_bounds);
  CU_add_test(s, "allocated memory: memfd, registered, freed once", test_alloc_mem);
  CU_add_test(s, "a CALL is served after the READ answers before it (tcp)", test_call_after_answers);
  CU_add_test(s, "calls started before any answer is waited for, served in order", test_call_start);
  CU_add_test(s, "transfers with a call behind each: the call finds the data there", test_transfer_then_call);
  CU_add_test(s, "tcp: a transfer that times out before its call left never has it served",
              test_then_call_timeout);
  CU_add_test(s, "tcp: a link cut under a transfer fails its call, never sent", test_then_call_link_cut);
  CU_add_test(s, "the peer closes the link just before transfers start: they fail, never a crash",
              test_peer_closed_at_start);
  CU_add_test(s, "four threads at once", test_four_threads);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
