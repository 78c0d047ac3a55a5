/* The staging buffer pool (BufferPool, StagingThreshold, StagingUnregistered):
 * unregistered memory on either side, mixed batches, a pool of one buffer cycled,
 * coalescing of small registered ops, an exhausted pool ending calls on time, async
 * requests in flight, and a target that refuses an unmapped address without dying.
 * Every transfer's status and every byte that arrived (and the gaps around it) are
 * checked; the white-box counters of engine_ext.h say what went through the pool.
 * Engines use tu_transport(): shm between engines of this process under auto, tcp in
 * test_staging_tcp, rdma in the soft-RoCE guest. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "devmem/devmem.h"
#include "engine/engine_ext.h"
#include "test_util.h"

#define KiB          ((size_t)1 << 10)
#define MiB          ((size_t)1 << 20)
#define XFER_MS      60000 /* transfers that must complete; generous for the emulated guest */
#define READY_MS     10000 /* a child has this long to report readiness */
#define CMD_MS       30000 /* a child has this long to answer a command */
#define GUARD        64    /* bytes before the first op of an area, and after the last */
#define STOP_TIMEOUT 300   /* ms: calls made while the pool is held by a stopped peer */
#define STOP_MARGIN  2000  /* ms they may overrun it by on a loaded machine */
#define REFUSE_MS    10000 /* a transfer the target refuses must end well within this */

/* ---------------------------------------------------------------- engines */

struct stage_opts {
  const char *pool;      /* BufferPool; NULL: not given (default) */
  const char *threshold; /* StagingThreshold */
  const char *unreg;     /* StagingUnregistered */
};

static const struct stage_opts DEFAULTS = {NULL, NULL, NULL};

/* The options so gives, as key/value pairs in o (room for 3); returns how many. */
static size_t stage_options(const struct stage_opts *so, HixlOption o[3]) {
  size_t n = 0;

  if (so->pool) o[n++] = (HixlOption){.key = "BufferPool", .value = so->pool};
  if (so->threshold) o[n++] = (HixlOption){.key = "StagingThreshold", .value = so->threshold};
  if (so->unreg) o[n++] = (HixlOption){.key = "StagingUnregistered", .value = so->unreg};
  return n;
}

/* An engine as name with Transport tu_transport() and the staging options of so. */
static HixlEngine *engine_start(const char *name, const struct stage_opts *so) {
  HixlOption o[3];
  HixlEngine *e = tu_engine_start_opts(name, tu_transport(), o, stage_options(so, o));

  if (!e)
    tu_fail(__FILE__, __LINE__,
            "engine %s (BufferPool %s, StagingThreshold %s, StagingUnregistered %s) did not "
            "start; the reason is on stderr",
            name, so->pool ? so->pool : "default", so->threshold ? so->threshold : "default",
            so->unreg ? so->unreg : "default");
  return e;
}

static bool connect_to(HixlEngine *ini, const char *remote) {
  return tu_status_is(HixlEngineConnect(ini, remote, 5000), HIXL_SUCCESS, remote, __FILE__, __LINE__);
}

/* A listening engine on a free port of tu_ip(); name gets its "ip:port". */
static HixlEngine *target_start(const struct stage_opts *so, char name[TU_ADDR_LEN]) {
  uint16_t port = tu_free_port();

  if (!port) {
    tu_fail(__FILE__, __LINE__, "no free port on %s", tu_ip());
    return NULL;
  }
  return engine_start(tu_addr(name, TU_ADDR_LEN, port), so);
}

/* An initiator connected to a target, both in this process. */
typedef struct {
  HixlEngine *ini, *tgt;
  char tgt_name[TU_ADDR_LEN];
} pair;

static bool pair_open(pair *p, struct stage_opts ini, struct stage_opts tgt) {
  memset(p, 0, sizeof(*p));
  p->tgt = target_start(&tgt, p->tgt_name);
  p->ini = p->tgt ? engine_start(tu_ip(), &ini) : NULL;
  return p->ini && connect_to(p->ini, p->tgt_name);
}

static void pair_close(pair *p) {
  if (p->ini) TU_ASSERT_OK(HixlEngineDestroy(p->ini));
  if (p->tgt) TU_ASSERT_OK(HixlEngineDestroy(p->tgt));
  memset(p, 0, sizeof(*p));
}

static HixlTransferOpDesc desc(const void *local, uint64_t remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = (uintptr_t)remote, .len = len};
  return d;
}

static HixlStatus sync_xfer(HixlEngine *e, const char *remote, HixlTransferOp op, const HixlTransferOpDesc *d,
                            size_t n, int32_t timeout_ms) {
  return HixlEngineTransferSync(e, remote, op, d, n, timeout_ms);
}

static const char *op_name(HixlTransferOp op) { return op == HIXL_WRITE ? "WRITE" : "READ"; }

/* The text an error message uses for an address ("0x" and this). */
static const char *hex(char buf[32], const void *addr) {
  snprintf(buf, 32, "%lx", (unsigned long)(uintptr_t)addr);
  return buf;
}

/* ---------------------------------------------------------------- counters */

static struct hixl_stage_stats stats_now(HixlEngine *e) {
  struct hixl_stage_stats s;

  memset(&s, 0, sizeof(s));
  TU_ASSERT_OK(hixl_engine_stage_stats(e, &s));
  return s;
}

/* What the counters of e grew by since before. */
static struct hixl_stage_stats stats_since(HixlEngine *e, const struct hixl_stage_stats *before) {
  struct hixl_stage_stats s = stats_now(e);

  s.units -= before->units;
  s.ops -= before->ops;
  s.bytes -= before->bytes;
  s.waits -= before->waits;
  s.target_bufs -= before->target_bufs;
  s.target_buf_bytes -= before->target_buf_bytes;
  s.target_regs -= before->target_regs;
  return s;
}

/* Check a growth of the counters: units in [min_units, max_units], at least min_ops
 * ops and min_bytes bytes. */
static void expect_staged(const struct hixl_stage_stats *d, uint64_t min_units, uint64_t max_units,
                          uint64_t min_ops, uint64_t min_bytes, const char *what, unsigned line) {
  if (d->units < min_units || d->units > max_units || d->ops < min_ops || d->bytes < min_bytes)
    tu_fail(__FILE__, line,
            "%s: staged units +%llu (want %llu to %llu), ops +%llu (want >= %llu), bytes +%llu "
            "(want >= %llu), waits +%llu",
            what, (unsigned long long)d->units, (unsigned long long)min_units, (unsigned long long)max_units,
            (unsigned long long)d->ops, (unsigned long long)min_ops, (unsigned long long)d->bytes,
            (unsigned long long)min_bytes, (unsigned long long)d->waits);
  else
    CU_PASS(what);
}

#define EXPECT_STAGED(d, min_u, max_u, min_o, min_b, what)                                                   \
  expect_staged((d), (min_u), (max_u), (min_o), (min_b), (what), __LINE__)
#define ANY UINT64_MAX

/* ---------------------------------------------------------------- memory */

/* Memory registered with an engine (page-aligned) or malloc'd and registered with
 * none. len 0 is an empty area. */
typedef struct {
  unsigned char *mem;
  size_t len;
  HixlEngine *e; /* registered with e; NULL: unregistered */
  HixlMemHandle h;
} area;

static bool area_open(area *a, size_t len, HixlEngine *e) {
  memset(a, 0, sizeof(*a));
  if (!len) return true;
  a->len = len;
  a->e = e;
  a->mem = e ? tu_alloc_mem(len, false) : malloc(len);
  if (!a->mem) {
    tu_fail(__FILE__, __LINE__, "cannot allocate %zu bytes", len);
    return false;
  }
  if (e && !(a->h = tu_register(e, a->mem, len))) {
    tu_fail(__FILE__, __LINE__, "cannot register %zu bytes: %s", len, HixlGetLastErrorMessage());
    return false;
  }
  return true;
}

static void area_close(area *a) {
  if (a->h) TU_ASSERT_OK(HixlEngineDeregisterMem(a->e, a->h));
  if (a->e)
    tu_free_mem(a->mem, a->len);
  else
    free(a->mem);
  memset(a, 0, sizeof(*a));
}

/* Whether the len bytes before at and after at + len all still hold bg. */
static void expect_guards(const unsigned char *at, size_t len, unsigned char bg, const char *what,
                          unsigned line) {
  if (tu_check_byte(at - GUARD, GUARD, bg) >= 0 || tu_check_byte(at + len, GUARD, bg) >= 0)
    tu_fail(__FILE__, line, "%s: bytes next to the %zu-byte range changed", what, len);
  else
    CU_PASS(what);
}

/* ---------------------------------------------------------------- batches */

/* One op of a batch. Its local range lies in the local area of its kind (registered
 * with the initiator or not), its remote range in the remote area of its kind. */
struct xop {
  size_t len;
  bool lunreg, runreg; /* local / remote range outside any registration */
  size_t lo, ro;       /* offsets in those areas */
  uint64_t seed;       /* its data */
};

/* Lay ops out with odd gaps: local ranges in op order, remote ones in reverse. */
static void xops_place(struct xop *ops, size_t n) {
  size_t lnext[2] = {GUARD, GUARD}, rnext[2] = {GUARD, GUARD}, i;

  for (i = 0; i < n; i++) {
    ops[i].lo = lnext[ops[i].lunreg];
    lnext[ops[i].lunreg] += ops[i].len + 1 + (i * 7) % 29;
  }
  for (i = n; i-- > 0;) {
    ops[i].ro = rnext[ops[i].runreg];
    rnext[ops[i].runreg] += ops[i].len + 3 + (i * 11) % 31;
  }
}

static bool xop_in(const struct xop *o, bool remote, bool unreg) {
  return (remote ? o->runreg : o->lunreg) == unreg;
}

static size_t xop_off(const struct xop *o, bool remote) { return remote ? o->ro : o->lo; }

/* Bytes the area of one side and kind needs (GUARD after its last op), 0 if unused. */
static size_t xops_extent(const struct xop *ops, size_t n, bool remote, bool unreg) {
  size_t end = 0, i;

  for (i = 0; i < n; i++)
    if (xop_in(&ops[i], remote, unreg) && xop_off(&ops[i], remote) + ops[i].len > end)
      end = xop_off(&ops[i], remote) + ops[i].len;
  return end ? end + GUARD : 0;
}

/* Check area a (one side, one kind) byte for byte: each op placed in it holds its
 * pattern, every other byte still holds bg. The first wrong byte is named by op. */
static void area_expect(const area *a, const struct xop *ops, size_t n, bool remote, bool unreg,
                        unsigned char bg, const char *what) {
  unsigned char *want;
  ptrdiff_t off;
  size_t i, at;

  if (!a->len) return;
  want = malloc(a->len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(want);
  memset(want, bg, a->len);
  for (i = 0; i < n; i++)
    if (xop_in(&ops[i], remote, unreg)) tu_fill(want + xop_off(&ops[i], remote), ops[i].len, ops[i].seed);
  off = tu_mismatch(a->mem, want, a->len);
  if (off < 0) {
    CU_PASS(what);
    free(want);
    return;
  }
  for (i = 0; i < n; i++) {
    at = xop_off(&ops[i], remote);
    if (xop_in(&ops[i], remote, unreg) && (size_t)off >= at && (size_t)off < at + ops[i].len) break;
  }
  if (i < n)
    tu_fail(__FILE__, __LINE__,
            "%s: op %zu (%zu B, local %s, remote %s) wrong at its byte %zu (got 0x%02x, want 0x%02x)", what,
            i, ops[i].len, ops[i].lunreg ? "unregistered" : "registered",
            ops[i].runreg ? "unregistered" : "registered", (size_t)off - xop_off(&ops[i], remote),
            a->mem[off], want[off]);
  else
    tu_fail(__FILE__, __LINE__, "%s: byte %td of the area, outside every op, changed to 0x%02x (was 0x%02x)",
            what, off, a->mem[off], want[off]);
  free(want);
}

static void xops_descs(const struct xop *ops, size_t n, const area la[2], const area ra[2],
                       HixlTransferOpDesc *d) {
  for (size_t i = 0; i < n; i++)
    d[i] =
        desc(la[ops[i].lunreg].mem + ops[i].lo, (uintptr_t)(ra[ops[i].runreg].mem + ops[i].ro), ops[i].len);
}

/* How a batch is run: one sync call, or async requests. */
typedef void (*runner)(pair *p, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n);

static void run_sync(pair *p, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  (void)tu_status_is(sync_xfer(p->ini, p->tgt_name, op, d, n, XFER_MS), HIXL_SUCCESS,
                     op == HIXL_WRITE ? "sync WRITE batch" : "sync READ batch", __FILE__, __LINE__);
}

/* WRITE the batch (sources in fresh local areas, remote areas set to 0xEE first),
 * check the remote areas and that the sources are unchanged; then READ it back into
 * fresh local areas (0x00) and check them and that the remote areas are unchanged.
 * The initiator's counter growth of each direction goes to *wd and *rd. */
static void batch_round_trip(pair *p, const struct xop *ops, size_t n, runner run,
                             struct hixl_stage_stats *wd, struct hixl_stage_stats *rd, const char *what) {
  area la[2], ra[2], back[2];
  HixlTransferOpDesc *d = malloc(n * sizeof(*d));
  struct hixl_stage_stats s0;
  char msg[160];
  int k;

  memset(la, 0, sizeof(la));
  memset(ra, 0, sizeof(ra));
  memset(back, 0, sizeof(back));
  memset(wd, 0, sizeof(*wd));
  memset(rd, 0, sizeof(*rd));
  CU_ASSERT_PTR_NOT_NULL_FATAL(d);
  for (k = 0; k < 2; k++)
    if (!area_open(&la[k], xops_extent(ops, n, false, k), k ? NULL : p->ini) ||
        !area_open(&ra[k], xops_extent(ops, n, true, k), k ? NULL : p->tgt) ||
        !area_open(&back[k], la[k].len, k ? NULL : p->ini))
      goto close;
  for (k = 0; k < 2; k++) {
    if (la[k].len) memset(la[k].mem, 0x11, la[k].len);
    if (ra[k].len) memset(ra[k].mem, 0xEE, ra[k].len);
    if (back[k].len) memset(back[k].mem, 0x00, back[k].len);
  }
  for (size_t i = 0; i < n; i++) tu_fill(la[ops[i].lunreg].mem + ops[i].lo, ops[i].len, ops[i].seed);

  xops_descs(ops, n, la, ra, d);
  s0 = stats_now(p->ini);
  run(p, HIXL_WRITE, d, n);
  *wd = stats_since(p->ini, &s0);
  for (k = 0; k < 2; k++) {
    snprintf(msg, sizeof(msg), "%s: WRITE, %s remote memory", what, k ? "unregistered" : "registered");
    area_expect(&ra[k], ops, n, true, k, 0xEE, msg);
    snprintf(msg, sizeof(msg), "%s: WRITE, %s local source unchanged", what,
             k ? "unregistered" : "registered");
    area_expect(&la[k], ops, n, false, k, 0x11, msg);
  }

  xops_descs(ops, n, back, ra, d);
  s0 = stats_now(p->ini);
  run(p, HIXL_READ, d, n);
  *rd = stats_since(p->ini, &s0);
  for (k = 0; k < 2; k++) {
    snprintf(msg, sizeof(msg), "%s: READ back into %s local memory", what, k ? "unregistered" : "registered");
    area_expect(&back[k], ops, n, false, k, 0x00, msg);
    snprintf(msg, sizeof(msg), "%s: READ, %s remote memory unchanged", what,
             k ? "unregistered" : "registered");
    area_expect(&ra[k], ops, n, true, k, 0xEE, msg);
  }
close:
  for (k = 1; k >= 0; k--) {
    area_close(&back[k]);
    area_close(&ra[k]);
    area_close(&la[k]);
  }
  free(d);
}

/* ---------------------------------------------------------------- 1. local */

/* Malloc'd local memory, registered remote memory: WRITE and READ go through the
 * initiator's pool, every size, one and several units. */
static void test_local_unregistered(void) {
  const size_t sizes[] = {1, 4 * KiB + 3, 3 * MiB + 5, 17 * MiB + 1}; /* unit: 8 MiB */
  pair p;
  area tgt = {0};
  unsigned char *src, *back;
  struct hixl_stage_stats s0, d;
  HixlTransferOpDesc op;
  char what[96];
  size_t i, len;

  if (!pair_open(&p, DEFAULTS, DEFAULTS) || !area_open(&tgt, 18 * MiB + 2 * GUARD, p.tgt)) goto close;
  for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    len = sizes[i];
    src = malloc(len);
    back = malloc(len + 2 * GUARD);
    CU_ASSERT_FATAL(src && back);
    tu_fill(src, len, 100 + i);
    memset(tgt.mem, 0xEE, len + 2 * GUARD);
    memset(back, 0x00, len + 2 * GUARD);

    s0 = stats_now(p.ini);
    op = desc(src, (uintptr_t)(tgt.mem + GUARD), len);
    snprintf(what, sizeof(what), "WRITE %zu B from malloc'd memory", len);
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, HIXL_WRITE, &op, 1, XFER_MS), HIXL_SUCCESS, what,
                       __FILE__, __LINE__);
    d = stats_since(p.ini, &s0);
    EXPECT_STAGED(&d, 1, ANY, 1, len, what);
    TU_ASSERT_PATTERN(tgt.mem + GUARD, len, 100 + i, what);
    expect_guards(tgt.mem + GUARD, len, 0xEE, what, __LINE__);
    TU_ASSERT_PATTERN(src, len, 100 + i, "WRITE source unchanged");

    s0 = stats_now(p.ini);
    op = desc(back + GUARD, (uintptr_t)(tgt.mem + GUARD), len);
    snprintf(what, sizeof(what), "READ %zu B into malloc'd memory", len);
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, HIXL_READ, &op, 1, XFER_MS), HIXL_SUCCESS, what, __FILE__,
                       __LINE__);
    d = stats_since(p.ini, &s0);
    EXPECT_STAGED(&d, 1, ANY, 1, len, what);
    TU_ASSERT_PATTERN(back + GUARD, len, 100 + i, what);
    expect_guards(back + GUARD, len, 0x00, what, __LINE__);
    free(back);
    free(src);
  }
close:
  area_close(&tgt);
  pair_close(&p);
}

/* ---------------------------------------------------------------- 2. remote */

/* Remote memory the target did not register: staged when the target runs
 * StagingUnregistered "on"; refused before anything is sent when it is "off". */
static void test_remote_unregistered(void) {
  const size_t sizes[] = {100, 2 * MiB + 3}, ulen = 3 * MiB;
  const struct stage_opts on = {.unreg = "on"};
  char off_name[TU_ADDR_LEN], addr[32];
  HixlEngine *off = NULL;
  pair p;
  area lr = {0}, back = {0};
  unsigned char *ru = malloc(ulen); /* in the targets' process, registered with neither */
  struct hixl_stage_stats s0, d;
  HixlTransferOpDesc op;
  char what[96];
  size_t i, len;

  CU_ASSERT_PTR_NOT_NULL_FATAL(ru);
  if (!pair_open(&p, DEFAULTS, on) || !area_open(&lr, ulen, p.ini) || !area_open(&back, ulen, p.ini))
    goto close;
  for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    len = sizes[i];
    tu_fill(lr.mem, len, 200 + i);
    memset(ru, 0xEE, len + 2 * GUARD);
    s0 = stats_now(p.ini);
    op = desc(lr.mem, (uintptr_t)(ru + GUARD), len);
    snprintf(what, sizeof(what), "WRITE %zu B to unregistered memory (target on)", len);
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, HIXL_WRITE, &op, 1, XFER_MS), HIXL_SUCCESS, what,
                       __FILE__, __LINE__);
    d = stats_since(p.ini, &s0);
    EXPECT_STAGED(&d, 1, ANY, 1, len, what);
    TU_ASSERT_PATTERN(ru + GUARD, len, 200 + i, what);
    expect_guards(ru + GUARD, len, 0xEE, what, __LINE__);

    memset(back.mem, 0x00, len + 2 * GUARD);
    s0 = stats_now(p.ini);
    op = desc(back.mem + GUARD, (uintptr_t)(ru + GUARD), len);
    snprintf(what, sizeof(what), "READ %zu B from unregistered memory (target on)", len);
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, HIXL_READ, &op, 1, XFER_MS), HIXL_SUCCESS, what, __FILE__,
                       __LINE__);
    d = stats_since(p.ini, &s0);
    EXPECT_STAGED(&d, 1, ANY, 1, len, what);
    TU_ASSERT_PATTERN(back.mem + GUARD, len, 200 + i, what);
    expect_guards(back.mem + GUARD, len, 0x00, what, __LINE__);
  }

  /* A second target at the default (off): refused, nothing sent, nothing touched. */
  off = target_start(&DEFAULTS, off_name);
  if (!off || !connect_to(p.ini, off_name)) goto close;
  tu_fill(ru, ulen, 210);
  tu_fill(lr.mem, 64 * KiB, 211);
  memset(back.mem, 0xAB, 64 * KiB);
  hex(addr, ru + 4096);
  for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    len = sizes[i];
    s0 = stats_now(p.ini);
    op = desc(lr.mem, (uintptr_t)(ru + 4096), len);
    snprintf(what, sizeof(what), "WRITE %zu B to unregistered memory (target off)", len);
    (void)tu_status_is(sync_xfer(p.ini, off_name, HIXL_WRITE, &op, 1, XFER_MS), HIXL_FAILED, what, __FILE__,
                       __LINE__);
    TU_ASSERT_ERRMSG_HAS("StagingUnregistered");
    TU_ASSERT_ERRMSG_HAS(addr);
    op = desc(back.mem, (uintptr_t)(ru + 4096), len);
    snprintf(what, sizeof(what), "READ %zu B from unregistered memory (target off)", len);
    (void)tu_status_is(sync_xfer(p.ini, off_name, HIXL_READ, &op, 1, XFER_MS), HIXL_FAILED, what, __FILE__,
                       __LINE__);
    TU_ASSERT_ERRMSG_HAS("StagingUnregistered");
    TU_ASSERT_ERRMSG_HAS(addr);
    d = stats_since(p.ini, &s0);
    EXPECT_STAGED(&d, 0, 0, 0, 0, "refused ops staged nothing");
    TU_ASSERT_PATTERN(ru, ulen, 210, "target's unregistered memory after refused ops");
    CU_ASSERT_EQUAL(tu_check_byte(back.mem, 64 * KiB, 0xAB), -1); /* the refused READ wrote nothing */
  }
close:
  if (off) TU_ASSERT_OK(HixlEngineDestroy(off));
  area_close(&back);
  area_close(&lr);
  pair_close(&p);
  free(ru);
}

/* ---------------------------------------------------------------- 2b. scoped */

/* A scoped target (hixl_engine_set_scoped) checks a peer's staged ops against its
 * grants before it allocates or registers anything for them (issue 43): a peer with
 * no grant sends staged WRITEs and READs of up to two units, into memory the target
 * registered and into memory it did not (StagingUnregistered on), and each is refused
 * FAILED with no buffer allocated and none registered on the target, nothing written
 * on either side. Granted, the same ops are served byte for byte, the unregistered
 * ones through the target's buffers, which the counters then show. Over tcp and shm a
 * refused STAGE_READ was gathered into a buffer of its size before the check; over
 * rdma a STAGE_PULL / STAGE_PUSH made and registered the link's bounce buffer first. */
static void test_scoped_target_allocates_nothing(void) {
  const size_t sizes[] = {100, 8 * MiB + 3}, alen = 8 * MiB + 3 + 2 * GUARD; /* unit: 8 MiB */
  const struct stage_opts on = {.unreg = "on"};
  char tname[TU_ADDR_LEN], iname[TU_ADDR_LEN], what[128];
  HixlEngine *tgt = target_start(&on, tname), *ini = tgt ? target_start(&DEFAULTS, iname) : NULL;
  area rr = {0}, src = {0}, back = {0};
  unsigned char *ru = malloc(alen); /* the target's, registered with neither engine */
  struct hixl_stage_stats s0, d;
  uint64_t refused0 = 0, refused1 = 0;
  HixlTransferOpDesc op;

  CU_ASSERT_PTR_NOT_NULL_FATAL(ru);
  if (tgt) TU_ASSERT_OK(hixl_engine_set_scoped(tgt, true)); /* before it registers: rdma keys depend on it */
  if (!ini || !connect_to(ini, tname) || !area_open(&rr, alen, tgt) || !area_open(&src, alen, NULL) ||
      !area_open(&back, alen, NULL))
    goto close;
  unsigned char *remote[2] = {rr.mem, ru};
  tu_fill(src.mem, alen, 300);
  memset(rr.mem, 0xEE, alen);
  memset(ru, 0xEE, alen);
  memset(back.mem, 0x00, alen);
  TU_ASSERT_OK(hixl_engine_grant_stats(tgt, iname, NULL, &refused0));
  s0 = stats_now(tgt);
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      op = desc(src.mem + GUARD, (uintptr_t)(remote[k] + GUARD), sizes[i]);
      snprintf(what, sizeof(what), "staged WRITE %zu B to %s memory, nothing granted", sizes[i],
               k ? "unregistered" : "registered");
      (void)tu_status_is(sync_xfer(ini, tname, HIXL_WRITE, &op, 1, XFER_MS), HIXL_FAILED, what, __FILE__,
                         __LINE__);
      op = desc(back.mem + GUARD, (uintptr_t)(remote[k] + GUARD), sizes[i]);
      snprintf(what, sizeof(what), "staged READ %zu B from %s memory, nothing granted", sizes[i],
               k ? "unregistered" : "registered");
      (void)tu_status_is(sync_xfer(ini, tname, HIXL_READ, &op, 1, XFER_MS), HIXL_FAILED, what, __FILE__,
                         __LINE__);
    }
  d = stats_since(tgt, &s0);
  if (d.target_bufs || d.target_buf_bytes || d.target_regs)
    tu_fail(__FILE__, __LINE__,
            "refused staged ops made the target allocate %llu buffers (%llu bytes) and register %llu: "
            "the grant must be checked before anything is allocated",
            (unsigned long long)d.target_bufs, (unsigned long long)d.target_buf_bytes,
            (unsigned long long)d.target_regs);
  else
    CU_PASS("refused staged ops: nothing allocated or registered on the target");
  TU_ASSERT_OK(hixl_engine_grant_stats(tgt, iname, NULL, &refused1));
  CU_ASSERT_TRUE(refused1 >= refused0 + 8);               /* each op refused for want of a grant */
  CU_ASSERT_EQUAL(tu_check_byte(rr.mem, alen, 0xEE), -1); /* nothing written */
  CU_ASSERT_EQUAL(tu_check_byte(ru, alen, 0xEE), -1);
  CU_ASSERT_EQUAL(tu_check_byte(back.mem, alen, 0x00), -1); /* nothing read */

  /* Granted: served byte for byte; the unregistered memory through the target's buffers. */
  const uint64_t g[2][2] = {{(uintptr_t)rr.mem, alen}, {(uintptr_t)ru, alen}};
  TU_ASSERT_OK(hixl_engine_grant(tgt, iname, g, 2));
  s0 = stats_now(tgt);
  for (int k = 0; k < 2; k++) {
    const size_t len = sizes[1];
    op = desc(src.mem + GUARD, (uintptr_t)(remote[k] + GUARD), len);
    TU_ASSERT_OK(sync_xfer(ini, tname, HIXL_WRITE, &op, 1, XFER_MS));
    TU_ASSERT_SAME(remote[k] + GUARD, src.mem + GUARD, len, "a granted staged WRITE");
    expect_guards(remote[k] + GUARD, len, 0xEE, "a granted staged WRITE", __LINE__);
    memset(back.mem, 0x00, alen);
    op = desc(back.mem + GUARD, (uintptr_t)(remote[k] + GUARD), len);
    TU_ASSERT_OK(sync_xfer(ini, tname, HIXL_READ, &op, 1, XFER_MS));
    TU_ASSERT_SAME(back.mem + GUARD, src.mem + GUARD, len, "a granted staged READ");
    expect_guards(back.mem + GUARD, len, 0x00, "a granted staged READ", __LINE__);
  }
  d = stats_since(tgt, &s0);
  /* the counters see buffers (tcp and shm gather an op in one of its size; rdma goes by
   * units through the link's bounce buffer, a unit at most) */
  CU_ASSERT_TRUE(d.target_bufs > 0 && d.target_buf_bytes > 0);
  TU_ASSERT_OK(hixl_engine_revoke(tgt, iname, g, 2));
close:
  area_close(&back);
  area_close(&src);
  area_close(&rr);
  if (ini) TU_ASSERT_OK(HixlEngineDestroy(ini));
  if (tgt) TU_ASSERT_OK(HixlEngineDestroy(tgt));
  free(ru);
}

/* ---------------------------------------------------------------- 3. pool off */

/* BufferPool "0:0": no staging; an unregistered range on either side is
 * PARAM_INVALID naming it, even with a target that would serve it. */
static void test_pool_off(void) {
  const struct stage_opts ini = {.pool = "0:0"}, tgt = {.unreg = "on"};
  pair p;
  area lr = {0}, rr = {0};
  unsigned char *lu = malloc(64 * KiB), *ru = malloc(64 * KiB);
  HixlTransferOpDesc d[2];
  HixlTransferReq req = NULL;
  char addr[32];
  int op;

  CU_ASSERT_FATAL(lu && ru);
  if (!pair_open(&p, ini, tgt) || !area_open(&lr, 64 * KiB, p.ini) || !area_open(&rr, 64 * KiB, p.tgt))
    goto close;
  tu_fill(lr.mem, 64 * KiB, 301);
  tu_fill(lu, 64 * KiB, 302);
  tu_fill(rr.mem, 64 * KiB, 303);
  tu_fill(ru, 64 * KiB, 304);

  /* Op 1's local range is malloc'd: the whole batch is refused. */
  d[0] = desc(lr.mem, (uintptr_t)rr.mem, 4096);
  d[1] = desc(lu + 8, (uintptr_t)(rr.mem + 8192), 4096);
  hex(addr, lu + 8);
  for (op = HIXL_READ; op <= HIXL_WRITE; op++) {
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, op, d, 2, XFER_MS), HIXL_PARAM_INVALID,
                       op == HIXL_WRITE ? "pool off: WRITE from malloc'd memory"
                                        : "pool off: READ into malloc'd memory",
                       __FILE__, __LINE__);
    TU_ASSERT_ERRMSG_HAS("op 1");
    TU_ASSERT_ERRMSG_HAS(addr);
  }
  TU_ASSERT_STATUS(HixlEngineTransferAsync(p.ini, p.tgt_name, HIXL_WRITE, d, 2, XFER_MS, NULL, &req),
                   HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(req);
  TU_ASSERT_ERRMSG_HAS(addr);

  /* The remote range is memory the target did not register. */
  d[0] = desc(lr.mem, (uintptr_t)(ru + 16), 4096);
  hex(addr, ru + 16);
  for (op = HIXL_READ; op <= HIXL_WRITE; op++) {
    (void)tu_status_is(sync_xfer(p.ini, p.tgt_name, op, d, 1, XFER_MS), HIXL_PARAM_INVALID,
                       op == HIXL_WRITE ? "pool off: WRITE to unregistered remote memory"
                                        : "pool off: READ from unregistered remote memory",
                       __FILE__, __LINE__);
    TU_ASSERT_ERRMSG_HAS(addr);
  }
  TU_ASSERT_PATTERN(lr.mem, 64 * KiB, 301, "registered local memory after refused calls");
  TU_ASSERT_PATTERN(lu, 64 * KiB, 302, "malloc'd local memory after refused calls");
  TU_ASSERT_PATTERN(rr.mem, 64 * KiB, 303, "registered remote memory after refused calls");
  TU_ASSERT_PATTERN(ru, 64 * KiB, 304, "unregistered remote memory after refused calls");

  /* Registered on both sides still works without a pool. */
  d[0] = desc(lr.mem, (uintptr_t)(rr.mem + 100), 10 * KiB);
  TU_ASSERT_OK(sync_xfer(p.ini, p.tgt_name, HIXL_WRITE, d, 1, XFER_MS));
  CU_ASSERT_EQUAL(tu_mismatch(rr.mem + 100, lr.mem, 10 * KiB), -1);
close:
  area_close(&rr);
  area_close(&lr);
  pair_close(&p);
  free(ru);
  free(lu);
}

/* ---------------------------------------------------------------- 3b. huge */

/* An op whose length is near SIZE_MAX (its range does not wrap: it starts in the first
 * page) to a StagingUnregistered target is refused at once as too large, its chunk count
 * computed without wrapping. Before, the count wrapped to 0 and the staging plan walked
 * 2^40 pieces holding the engine lock: the call never returned (the test's TIMEOUT ended
 * it). In this process: a forked child could not make RDMA engines in the guest run,
 * the parent's librdmacm state being stale there. */
static void test_huge_len_refused(void) {
  const struct stage_opts on = {.unreg = "on"};
  pair p;

  if (!pair_open(&p, DEFAULTS, on)) {
    tu_fail(__FILE__, __LINE__, "cannot open the pair");
    pair_close(&p);
    return;
  }
  HixlTransferOpDesc d = desc((const void *)(uintptr_t)4096, 4096, SIZE_MAX - 3 * 4096);
  TU_ASSERT_STATUS(sync_xfer(p.ini, p.tgt_name, HIXL_WRITE, &d, 1, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("too large");
  pair_close(&p);
}

/* An op of 2^50 bytes registered on neither side, to a StagingUnregistered target, is
 * refused at once as too large, nothing staged; so is a batch of two ops that together
 * pass 1 TiB (2^20 pieces of 1 MiB). Before, the first was planned as 2^27 units of the
 * default 8 MiB buffers: ~47 GB of chunks and units allocated and filled (on a machine
 * with less memory the allocation failed: RESOURCE_EXHAUSTED after the plan). */
static void test_huge_batch_bounded(void) {
  const struct stage_opts on = {.unreg = "on"};
  const size_t over = ((size_t)1 << 39) + 1; /* 2^19 + 1 pieces */
  struct hixl_stage_stats before, got;
  HixlTransferOpDesc d[2];
  pair p;

  if (!pair_open(&p, DEFAULTS, on)) {
    tu_fail(__FILE__, __LINE__, "cannot open the pair");
    pair_close(&p);
    return;
  }
  before = stats_now(p.ini);
  d[0] = desc((const void *)(uintptr_t)4096, 4096, (size_t)1 << 50);
  if (!tu_status_is(sync_xfer(p.ini, p.tgt_name, HIXL_READ, d, 1, 1000), HIXL_PARAM_INVALID, "2^50 B READ",
                    __FILE__, __LINE__))
    goto close; /* the rest would try to move a TiB from unmapped memory */
  TU_ASSERT_ERRMSG_HAS("too large");
  TU_ASSERT_ERRMSG_HAS("at most 1048576");
  d[0] = desc((const void *)(uintptr_t)4096, 4096, over);
  d[1] = desc((const void *)(uintptr_t)4096 + over, 4096 + over, over);
  TU_ASSERT_STATUS(sync_xfer(p.ini, p.tgt_name, HIXL_READ, d, 2, 1000), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("too large");
  got = stats_since(p.ini, &before);
  CU_ASSERT_EQUAL(got.units, 0);
  CU_ASSERT_EQUAL(got.waits, 0);
close:
  pair_close(&p);
}

/* ---------------------------------------------------------------- 4. mixed */

/* Every size with every kind (direct, local unregistered, remote unregistered,
 * both) in one batch, with ops bigger than a unit (BufferPool "2:4": 4 MiB units). */
static void test_mixed_batch(void) {
  const size_t sizes[] = {100, 9 * MiB, 1, 4096, MiB + 3, 7};
  enum { N = 4 * (sizeof(sizes) / sizeof(sizes[0])) };
  const struct stage_opts ini = {.pool = "2:4"}, tgt = {.unreg = "on"};
  struct xop ops[N];
  struct hixl_stage_stats wd, rd;
  pair p;
  size_t i;

  memset(ops, 0, sizeof(ops));
  for (i = 0; i < N; i++) {
    ops[i].len = sizes[i / 4];
    ops[i].lunreg = i & 1;
    ops[i].runreg = (i >> 1) & 1;
    ops[i].seed = 400 + i;
  }
  xops_place(ops, N);
  if (pair_open(&p, ini, tgt)) {
    batch_round_trip(&p, ops, N, run_sync, &wd, &rd, "mixed batch");
    EXPECT_STAGED(&wd, 1, ANY, 1, 0, "mixed batch WRITE staged");
    EXPECT_STAGED(&rd, 1, ANY, 1, 0, "mixed batch READ staged");
  }
  pair_close(&p);
}

/* ---------------------------------------------------------------- 5. one buffer */

/* BufferPool "1:1": an 8 MiB unregistered op and 1000 small ones (every other one
 * from malloc'd memory) cycle through one 1 MiB buffer. */
static void test_one_buffer(void) {
  enum { SMALL = 1000 };
  const struct stage_opts ini = {.pool = "1:1"};
  struct xop *ops = calloc(SMALL + 1, sizeof(*ops));
  struct hixl_stage_stats wd, rd;
  uint64_t rs = 501;
  pair p;
  size_t i;

  CU_ASSERT_PTR_NOT_NULL_FATAL(ops);
  ops[0].len = 8 * MiB;
  ops[0].lunreg = true;
  ops[0].seed = 500;
  for (i = 1; i <= SMALL; i++) {
    ops[i].len = 1 + tu_rand(&rs) % 700;
    ops[i].lunreg = i & 1;
    ops[i].seed = 500 + i;
  }
  xops_place(ops, SMALL + 1);
  if (pair_open(&p, ini, DEFAULTS)) {
    batch_round_trip(&p, ops, SMALL + 1, run_sync, &wd, &rd, "8 MiB + 1000 small, BufferPool 1:1");
    EXPECT_STAGED(&wd, 9, ANY, 9, 8 * MiB, "WRITE through one buffer");
    EXPECT_STAGED(&rd, 9, ANY, 9, 8 * MiB, "READ through one buffer");
  }
  pair_close(&p);
  free(ops);
}

/* ---------------------------------------------------------------- 6. coalescing */

static void shuffle(size_t *perm, size_t n, uint64_t *rs) {
  size_t i, j, t;

  for (i = 0; i < n; i++) perm[i] = i;
  for (i = n - 1; i > 0; i--) {
    j = tu_rand(rs) % (i + 1);
    t = perm[i], perm[i] = perm[j], perm[j] = t;
  }
}

/* 1024 ops of 64 B, registered on both sides, at scattered offsets: on tcp and rdma
 * links StagingThreshold 4096 packs them into one or two units; shm links never
 * coalesce; StagingThreshold "0" never does. */
static void test_coalescing(void) {
  enum { N = 1024, SLOTS = 4096, SLOT = 256 };
  const struct stage_opts packs = {.threshold = "4096"}, never = {.threshold = "0"};
  struct xop *ops = calloc(N, sizeof(*ops));
  size_t *lperm = malloc(SLOTS * sizeof(size_t)), *rperm = malloc(SLOTS * sizeof(size_t));
  struct hixl_stage_stats wd, rd;
  struct hixl_link_info li;
  uint64_t rs = 601;
  bool coalesce;
  pair p;
  size_t i;

  CU_ASSERT_FATAL(ops && lperm && rperm);
  shuffle(lperm, SLOTS, &rs);
  shuffle(rperm, SLOTS, &rs);
  for (i = 0; i < N; i++) {
    ops[i].len = 64;
    ops[i].lo = GUARD + lperm[i] * SLOT;
    ops[i].ro = GUARD + rperm[i] * SLOT;
    ops[i].seed = 600 + i;
  }
  if (pair_open(&p, packs, DEFAULTS) &&
      tu_status_is(hixl_engine_link_info(p.ini, p.tgt_name, &li), HIXL_SUCCESS, "hixl_engine_link_info",
                   __FILE__, __LINE__)) {
    coalesce = strcmp(li.transport, "shm") != 0;
    printf("  [link over %s: %s]\n", li.transport, coalesce ? "coalesced" : "never coalesced");
    batch_round_trip(&p, ops, N, run_sync, &wd, &rd, "1024 x 64 B, StagingThreshold 4096");
    if (coalesce) {
      EXPECT_STAGED(&wd, 1, 2, N, N * 64, "WRITE of 1024 x 64 B coalesced");
      EXPECT_STAGED(&rd, 1, 2, N, N * 64, "READ of 1024 x 64 B coalesced");
    } else {
      EXPECT_STAGED(&wd, 0, 0, 0, 0, "WRITE over shm not staged");
      EXPECT_STAGED(&rd, 0, 0, 0, 0, "READ over shm not staged");
    }
  }
  pair_close(&p);
  if (pair_open(&p, never, DEFAULTS)) {
    batch_round_trip(&p, ops, N, run_sync, &wd, &rd, "1024 x 64 B, StagingThreshold 0");
    EXPECT_STAGED(&wd, 0, 0, 0, 0, "WRITE with StagingThreshold 0 not staged");
    EXPECT_STAGED(&rd, 0, 0, 0, 0, "READ with StagingThreshold 0 not staged");
  }
  pair_close(&p);
  free(rperm);
  free(lperm);
  free(ops);
}

/* ---------------------------------------------------------------- 8. async */

enum { WINDOW = 4, PER_REQ = 2 };

/* The batch as requests of PER_REQ ops, WINDOW of them in flight, waited for in
 * order; each must end COMPLETED. */
static void run_async_window(pair *p, HixlTransferOp op, const HixlTransferOpDesc *d, size_t n) {
  HixlTransferReq req[WINDOW];
  HixlTransferStatus ts;
  size_t nreq = (n + PER_REQ - 1) / PER_REQ, sent = 0, done = 0, first;
  HixlStatus st;

  while (done < sent || sent < nreq) {
    while (sent < nreq && sent - done < WINDOW) {
      first = sent * PER_REQ;
      req[sent % WINDOW] = NULL;
      st = HixlEngineTransferAsync(p->ini, p->tgt_name, op, d + first,
                                   n - first < PER_REQ ? n - first : PER_REQ, XFER_MS,
                                   (void *)(uintptr_t)(sent + 1), &req[sent % WINDOW]);
      if (!tu_status_is(st, HIXL_SUCCESS, "TransferAsync", __FILE__, __LINE__)) {
        nreq = sent; /* submit no more; drain those in flight */
        break;
      }
      sent++;
    }
    if (done == sent) break;
    st = tu_wait_request(p->ini, req[done % WINDOW], tu_now_ms() + XFER_MS + 5000, &ts);
    if (st != HIXL_SUCCESS || ts != HIXL_TRANSFER_COMPLETED)
      tu_fail(__FILE__, __LINE__, "async %s request %zu: GetTransferStatus %s, state %d (want COMPLETED): %s",
              op_name(op), done, HixlStatusName(st), (int)ts, HixlGetLastErrorMessage());
    else
      CU_PASS("request completed");
    done++;
  }
}

/* Sixteen requests of two malloc'd-memory ops each, four in flight, through a pool
 * of two 1 MiB buffers. */
static void test_async_window(void) {
  enum { NREQ = 16, N = NREQ * PER_REQ };
  const struct stage_opts ini = {.pool = "2:1"};
  struct xop ops[N];
  struct hixl_stage_stats wd, rd;
  pair p;
  size_t r;

  memset(ops, 0, sizeof(ops));
  for (r = 0; r < NREQ; r++) {
    ops[2 * r].len = MiB + 5 + r * 1000; /* two units */
    ops[2 * r + 1].len = 100 + r;
    ops[2 * r].lunreg = ops[2 * r + 1].lunreg = true;
    ops[2 * r].seed = 800 + 2 * r;
    ops[2 * r + 1].seed = 801 + 2 * r;
  }
  xops_place(ops, N);
  if (pair_open(&p, ini, DEFAULTS)) {
    batch_round_trip(&p, ops, N, run_async_window, &wd, &rd, "async window of 4, BufferPool 2:1");
    EXPECT_STAGED(&wd, 2 * NREQ, ANY, N, N / 2 * MiB, "async WRITEs staged");
    EXPECT_STAGED(&rd, 2 * NREQ, ANY, N, N / 2 * MiB, "async READs staged");
  }
  pair_close(&p);
}

/* ---------------------------------------------------------------- children */

/* A target engine in a child process that re-executes this program:
 *   --staging-target PORT UNREG   StagingUnregistered UNREG ("on" / "off")
 * It registers TARGET_REG bytes, maps TARGET_UNREG bytes it does not register, and
 * maps three pages whose middle one (the hole) it unmaps when told: as late as
 * possible, since a mapping made after the munmap (by the engine, the verbs
 * provider at Connect, ...) could land in a one-page hole. Commands are tu_cmd,
 * replies int64. */
#define TARGET_FLAG  "--staging-target"
#define TARGET_REG   (4 * MiB)
#define TARGET_UNREG MiB
#define CHILD_UP     3 /* fds set up by tu_child_start */
#define CHILD_DOWN   4

enum target_cmd {
  TGT_CHECK_REG = TU_CMD_CHECK, /* reply: first mismatch vs pattern(seed), or -1 */
  TGT_FILL_REG = TU_CMD_FILL,   /* reply 0 */
  TGT_QUIT = TU_CMD_QUIT,       /* reply 0, deregister, destroy, exit */
  TGT_CHECK_UNREG = 10,         /* the same on the unregistered memory */
  TGT_FILL_UNREG = 11,
  TGT_MAKE_HOLE = 12,  /* munmap the hole; reply 0 or -errno */
  TGT_HOLE_STATE = 13, /* reply 0 while nothing is mapped at the hole, 1 once something is */
};

typedef struct {
  uint32_t status; /* HixlStatus of the child's setup */
  uint64_t reg, unreg, hole;
  char error[400];
} target_ready;

static int target_child(uint16_t port, const char *unreg_opt) {
  const struct stage_opts so = {.unreg = unreg_opt};
  long page = sysconf(_SC_PAGESIZE);
  unsigned char *reg = tu_alloc_mem(TARGET_REG, false), *unreg = tu_alloc_mem(TARGET_UNREG, false);
  unsigned char *pages = tu_alloc_mem((size_t)page * 3, false), *base;
  HixlEngine *e = NULL;
  HixlMemHandle h = NULL;
  HixlOption o[3];
  char name[TU_ADDR_LEN];
  target_ready r;
  unsigned char in_core;
  int64_t reply;
  size_t len;
  tu_cmd cmd;
  int rc = 0;

  memset(&r, 0, sizeof(r));
  r.status = HIXL_RESOURCE_EXHAUSTED;
  snprintf(r.error, sizeof(r.error), "child: cannot map its memory");
  if (reg && unreg && pages) {
    e = tu_engine_start_opts(tu_addr(name, sizeof(name), port), tu_transport(), o, stage_options(&so, o));
    r.status = e ? HIXL_SUCCESS : HIXL_FAILED;
    snprintf(r.error, sizeof(r.error), "child: engine %s did not start (reason on its stderr)", name);
  }
  if (r.status == HIXL_SUCCESS && !(h = tu_register(e, reg, TARGET_REG))) {
    r.status = HIXL_FAILED;
    snprintf(r.error, sizeof(r.error), "child: RegisterMem: %s", HixlGetLastErrorMessage());
  }
  r.reg = (uintptr_t)reg;
  r.unreg = (uintptr_t)unreg;
  r.hole = (uintptr_t)(pages + page);
  if (tu_write_all(CHILD_UP, &r, sizeof(r)) != 0 || r.status != HIXL_SUCCESS) {
    rc = 3;
    goto destroy;
  }
  while (tu_read_all(CHILD_DOWN, &cmd, sizeof(cmd)) == 0) {
    base = cmd.op == TGT_CHECK_UNREG || cmd.op == TGT_FILL_UNREG ? unreg : reg;
    len = base == unreg ? TARGET_UNREG : TARGET_REG;
    reply = 0;
    if (cmd.op == TGT_QUIT)
      reply = 0;
    else if (cmd.op == TGT_MAKE_HOLE)
      reply = munmap(pages + page, (size_t)page) == 0 ? 0 : -errno;
    else if (cmd.op == TGT_HOLE_STATE) /* mincore fails with ENOMEM on an unmapped page */
      reply = mincore(pages + page, (size_t)page, &in_core) != 0 && errno == ENOMEM ? 0 : 1;
    else if (cmd.off > len || cmd.len > len - cmd.off)
      reply = -2;
    else if (cmd.op == TGT_CHECK_REG || cmd.op == TGT_CHECK_UNREG)
      reply = tu_check_pattern(base + cmd.off, cmd.len, cmd.seed);
    else if (cmd.op == TGT_FILL_REG || cmd.op == TGT_FILL_UNREG)
      tu_fill(base + cmd.off, cmd.len, cmd.seed);
    else
      reply = -3;
    if (tu_write_all(CHILD_UP, &reply, sizeof(reply)) != 0 || cmd.op == TGT_QUIT) break;
  }
  if (HixlEngineDeregisterMem(e, h) != HIXL_SUCCESS || HixlEngineDestroy(e) != HIXL_SUCCESS) {
    fprintf(stderr, "target child: shutdown: %s\n", HixlGetLastErrorMessage());
    return 4;
  }
  e = NULL;
destroy:
  if (e) HixlEngineDestroy(e);
  tu_free_mem(pages, (size_t)page * 3);
  tu_free_mem(unreg, TARGET_UNREG);
  tu_free_mem(reg, TARGET_REG);
  return rc;
}

/* In a target child: run it and return its exit code. Otherwise -1. */
static int target_child_main(int argc, char **argv) {
  if (argc != 4 || strcmp(argv[1], TARGET_FLAG) != 0) return -1;
  return target_child((uint16_t)strtoul(argv[2], NULL, 10), argv[3]);
}

/* tu_child_start body: only exec, so it is fine in a parent with engine threads. */
static int exec_self(void *arg, int ready_fd, int ctl_fd) {
  (void)ready_fd;
  (void)ctl_fd; /* already fds 3 and 4 */
  execv(tu_self_exe(), arg);
  return 127;
}

typedef struct {
  tu_child c;
  target_ready info;
  char name[TU_ADDR_LEN];
} target_proc;

static bool target_proc_start(target_proc *t, const char *unreg_opt) {
  uint16_t port = tu_free_port();
  char p[16];
  char *argv[] = {(char *)tu_self_exe(), TARGET_FLAG, p, (char *)unreg_opt, NULL};

  memset(t, 0, sizeof(*t));
  snprintf(p, sizeof(p), "%u", (unsigned)port);
  tu_addr(t->name, sizeof(t->name), port);
  if (!port || tu_child_start(&t->c, exec_self, argv) != 0) {
    tu_fail(__FILE__, __LINE__, "cannot start a target child");
    return false;
  }
  if (tu_child_read(&t->c, &t->info, sizeof(t->info), READY_MS) != 0 || t->info.status != HIXL_SUCCESS) {
    tu_fail(__FILE__, __LINE__, "target child on %s did not come up: %s (%s)", t->name,
            HixlStatusName(t->info.status), t->info.error);
    tu_child_wait(&t->c, 5000);
    return false;
  }
  return true;
}

/* Send one command to a child (a target child or a tu_server child); its reply, or
 * -99 when it did not answer. */
static int64_t child_cmd(tu_child *c, uint32_t op, uint64_t off, uint64_t len, uint64_t seed) {
  tu_cmd cmd = {.op = op, .seed = seed, .off = off, .len = len};
  int64_t reply = -99;

  if (tu_server_send(c, &cmd, &reply, CMD_MS) != 0) return -99;
  return reply;
}

/* Have the child check [off, off + len) of its memory against pattern seed. */
static void child_expect(tu_child *c, uint32_t op, uint64_t off, uint64_t len, uint64_t seed,
                         const char *what, unsigned line) {
  int64_t reply = child_cmd(c, op, off, len, seed);

  if (reply == -99)
    tu_fail(__FILE__, line, "%s: the child did not answer (is it alive?)", what);
  else if (reply != -1)
    tu_fail(__FILE__, line, "%s: child memory [+%llu, +%llu) differs from pattern %llu at its byte %lld",
            what, (unsigned long long)off, (unsigned long long)len, (unsigned long long)seed,
            (long long)reply);
  else
    CU_PASS(what);
}

/* QUIT, and the child must exit 0 (its engine shut down cleanly). */
static void child_quit(tu_child *c) {
  int64_t reply;
  int ws;

  if (c->pid <= 0) return;
  tu_child_kill(c, SIGCONT); /* in case a failed test left it stopped */
  reply = child_cmd(c, TU_CMD_QUIT, 0, 0, 0);
  ws = tu_child_stop(c, 10000);
  if (reply != 0 || ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "child: QUIT reply %lld, wait status 0x%x (want 0 and exit 0)",
            (long long)reply, (unsigned)ws);
  else
    CU_PASS("child exited 0");
}

/* ---------------------------------------------------------------- 6b. a peer stops answering */

/* A peer that stops answering (its progress thread held in a service handler: it reads
 * nothing) while staged units to it are on the wire: each call times out, and at its
 * deadline its buffer comes back (on the socket a buffer is only a token), so three
 * calls go out on a pool of two, and a staged WRITE and READ to another peer meanwhile
 * complete; once the peer reads again, its late answers are dropped and it serves again.
 * Before, the stalled peer kept the whole pool until its link died: the third call and
 * those to the other peer ended RESOURCE_EXHAUSTED. Over rdma a unit's buffer stays
 * until the answer (the target may still move its bytes): not run there. */
static void test_stalled_peer_pool_back(void) {
  const struct stage_opts two = {.pool = "2:1"};
  const size_t len = 64 * KiB;
  char bn[TU_ADDR_LEN], cn[TU_ADDR_LEN];
  struct tu_hold h = TU_HOLD_INIT;
  uint8_t ans[8];
  uint32_t alen = 0;
  hixl_call_t held;
  HixlTransferOpDesc d;

  if (tu_transport() && strcmp(tu_transport(), "rdma") == 0) {
    CU_PASS("rdma: staged units go by the target's RDMA and keep their buffer until answered");
    return;
  }
  HixlEngine *b = target_start(&DEFAULTS, bn), *c = target_start(&DEFAULTS, cn);
  HixlEngine *a = engine_start(tu_ip(), &two);
  uint8_t *bm = tu_alloc_mem(4 * len, false), *cm = tu_alloc_mem(len, false);
  uint8_t *loose = malloc(len), *back = malloc(len);
  CU_ASSERT_FATAL(a && b && c && bm && cm && loose && back);
  CU_ASSERT_FATAL(tu_register(b, bm, 4 * len) && tu_register(c, cm, len));
  CU_ASSERT_FATAL(connect_to(a, bn) && connect_to(a, cn));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(b, 1, tu_hold_handler, &h));
  TU_ASSERT_OK_FATAL(hixl_engine_call_start(a, bn, 1, NULL, 0, ans, sizeof(ans), &alen, XFER_MS, &held));
  tu_hold_entered(&h); /* b reads nothing from here */
  tu_fill(loose, len, 901);
  for (int i = 0; i < 3; i++) {
    d = desc(loose, (uintptr_t)bm + (size_t)i * len, len);
    TU_ASSERT_STATUS(sync_xfer(a, bn, HIXL_WRITE, &d, 1, STOP_TIMEOUT), HIXL_TIMEOUT);
  }
  tu_fill(loose, len, 902);
  d = desc(loose, (uintptr_t)cm, len);
  TU_ASSERT_OK(sync_xfer(a, cn, HIXL_WRITE, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(cm, len, 902, "staged WRITE to another peer while one stalls");
  memset(back, 0, len);
  d = desc(back, (uintptr_t)cm, len);
  TU_ASSERT_OK(sync_xfer(a, cn, HIXL_READ, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(back, len, 902, "staged READ from another peer while one stalls");
  tu_hold_release(&h);
  (void)hixl_engine_call_wait(a, bn, held);
  tu_fill(loose, len, 903);
  d = desc(loose, (uintptr_t)bm + 3 * len, len);
  TU_ASSERT_OK(sync_xfer(a, bn, HIXL_WRITE, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(bm + 3 * len, len, 903, "staged WRITE to the peer once it reads again");
  TU_ASSERT_OK(HixlEngineDestroy(a));
  TU_ASSERT_OK(HixlEngineDestroy(b));
  TU_ASSERT_OK(HixlEngineDestroy(c));
  tu_free_mem(bm, 4 * len);
  tu_free_mem(cm, len);
  free(loose);
  free(back);
}

/* ---------------------------------------------------------------- 6c. starved beside device READs */

/* A batch whose staged op finds no pool buffer by its deadline (the pool's one buffer
 * held by a unit the stalled peer never answers) ends RESOURCE_EXHAUSTED from a wait and
 * FAILED from GetTransferStatus; its other op, a device READ on the same stalled peer,
 * is cancelled as a timed-out one is: its bounce buffers come back at the deadline and
 * its late answers are dropped. Before, the starved path skipped that (and the rdma
 * link reset): the READ's four buffers stayed out until the peer answered (over rdma its
 * work requests could still write the caller's memory). Device memory is the test
 * builds' host stand-in (HIXL_TEST_DEVMEM=host), chosen once a process: so in a child
 * that re-executes this program (no engines in a forked child), over tcp, whose device
 * ops go through the bounce buffers. */
#define STARVED_FLAG "--starved-devmem"

/* In the child: a failed check, said on stderr; the child then exits 1. */
#define STARVED_CHECK(cond, ...)                                                                             \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "starved-devmem child, line %d: ", __LINE__);                                          \
      fprintf(stderr, __VA_ARGS__);                                                                          \
      fputc('\n', stderr);                                                                                   \
      fails++;                                                                                               \
    }                                                                                                        \
  } while (0)

/* Device pool buffers out now (the stand-in counts every engine's). */
static uint64_t dev_bufs_out(void) {
  uint64_t out, pinned, waits;

  devmem_test_pool(&out, &pinned, &waits);
  return out;
}

static int starved_devmem_child(void) {
  const size_t dlen = 4 * MiB, small = 64 * KiB;
  const HixlOption one = {.key = "BufferPool", .value = "1:1"};
  char bn[TU_ADDR_LEN], an[TU_ADDR_LEN];
  struct tu_hold h = TU_HOLD_INIT;
  HixlTransferOpDesc d[2];
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlTransferReq holder = NULL, req = NULL;
  HixlMemHandle hd = NULL;
  hixl_call_t held = NULL;
  uint8_t ans[8];
  uint32_t alen = 0;
  HixlStatus st;
  int fails = 0;

  if (setenv("HIXL_TEST_DEVMEM", "host", 1) != 0) return 2; /* before any engine asks for the provider */
  HixlEngine *b = tu_engine_start_opts(tu_addr(bn, sizeof(bn), tu_free_port()), "tcp", NULL, 0);
  HixlEngine *a = tu_engine_start_opts(tu_addr(an, sizeof(an), tu_free_port()), "tcp", &one, 1);
  uint8_t *dev = tu_alloc_mem(dlen, false), *bm = tu_alloc_mem(4 * dlen, false),
          *host = tu_alloc_mem(small, false);
  uint8_t *loose = malloc(small), *loose2 = malloc(small);
  HixlMemDesc md = {.addr = (uintptr_t)dev, .len = dlen};
  if (!a || !b || !dev || !bm || !host || !loose || !loose2 || !tu_register(b, bm, 4 * dlen) ||
      !tu_register(a, host, small) || HixlEngineRegisterMem(a, &md, HIXL_MEM_DEVICE, &hd) != HIXL_SUCCESS ||
      HixlEngineConnect(a, bn, 5000) != HIXL_SUCCESS ||
      hixl_engine_set_service(b, 1, tu_hold_handler, &h) != HIXL_SUCCESS) {
    fprintf(stderr, "starved-devmem child: setup failed: %s\n", HixlGetLastErrorMessage());
    return 3;
  }
  tu_fill(dev, dlen, 951);
  tu_fill(bm, 4 * dlen, 952);
  tu_fill(loose, small, 953);
  st = hixl_engine_call_start(a, bn, 1, NULL, 0, ans, sizeof(ans), &alen, XFER_MS, &held);
  STARVED_CHECK(st == HIXL_SUCCESS, "call_start: %s", HixlStatusName(st));
  tu_hold_entered(&h); /* b reads nothing from here */
  /* The pool's one buffer: a staged WRITE b never answers while held. */
  d[0] = desc(loose, (uintptr_t)bm, small);
  st = HixlEngineTransferAsync(a, bn, HIXL_WRITE, d, 1, XFER_MS, NULL, &holder);
  STARVED_CHECK(st == HIXL_SUCCESS, "the holder's TransferAsync: %s", HixlStatusName(st));
  /* A device READ (four 1 MiB chunks, a bounce buffer each) and a staged READ that starves. */
  d[0] = desc(dev, (uintptr_t)bm + dlen, dlen);
  d[1] = desc(loose2, (uintptr_t)bm + 3 * dlen, small);
  st = sync_xfer(a, bn, HIXL_READ, d, 2, STOP_TIMEOUT);
  STARVED_CHECK(st == HIXL_RESOURCE_EXHAUSTED, "starved TransferSync: %s (want RESOURCE_EXHAUSTED): %s",
                HixlStatusName(st), HixlGetLastErrorMessage());
  STARVED_CHECK(dev_bufs_out() == 0, "after the starved TransferSync %llu device buffers are out (want 0)",
                (unsigned long long)dev_bufs_out());
  /* The same by GetTransferStatus. */
  d[0] = desc(dev, (uintptr_t)bm + 2 * dlen, dlen);
  st = HixlEngineTransferAsync(a, bn, HIXL_READ, d, 2, STOP_TIMEOUT, NULL, &req);
  STARVED_CHECK(st == HIXL_SUCCESS, "starved TransferAsync: %s", HixlStatusName(st));
  st = tu_wait_request(a, req, tu_now_ms() + STOP_TIMEOUT + STOP_MARGIN, &ts);
  STARVED_CHECK(st == HIXL_SUCCESS && ts == HIXL_TRANSFER_FAILED,
                "starved async: %s, state %d (want FAILED): %s", HixlStatusName(st), (int)ts,
                HixlGetLastErrorMessage());
  STARVED_CHECK(dev_bufs_out() == 0, "after the starved async batch %llu device buffers are out (want 0)",
                (unsigned long long)dev_bufs_out());
  /* b reads again: the holder completes, the cancelled READs' answers are dropped. A
   * sync op after them on the link ends once they were all read. */
  tu_hold_release(&h);
  (void)hixl_engine_call_wait(a, bn, held);
  st = tu_wait_request(a, holder, tu_now_ms() + XFER_MS, &ts);
  STARVED_CHECK(st == HIXL_SUCCESS && ts == HIXL_TRANSFER_COMPLETED, "the holder: %s, state %d: %s",
                HixlStatusName(st), (int)ts, HixlGetLastErrorMessage());
  d[0] = desc(host, (uintptr_t)bm + small, small);
  st = sync_xfer(a, bn, HIXL_READ, d, 1, XFER_MS);
  STARVED_CHECK(st == HIXL_SUCCESS, "a READ after: %s: %s", HixlStatusName(st), HixlGetLastErrorMessage());
  STARVED_CHECK(tu_check_pattern(dev, dlen, 951) == -1, "the cancelled device READs wrote device memory");
  STARVED_CHECK(tu_mismatch(bm, loose, small) == -1, "the holder's data did not land");
  STARVED_CHECK(dev_bufs_out() == 0, "at the end %llu device buffers are out (want 0)",
                (unsigned long long)dev_bufs_out());
  if (HixlEngineDeregisterMem(a, hd) != HIXL_SUCCESS || HixlEngineDestroy(a) != HIXL_SUCCESS ||
      HixlEngineDestroy(b) != HIXL_SUCCESS) {
    fprintf(stderr, "starved-devmem child: shutdown: %s\n", HixlGetLastErrorMessage());
    fails++;
  }
  tu_free_mem(dev, dlen);
  tu_free_mem(bm, 4 * dlen);
  tu_free_mem(host, small);
  free(loose);
  free(loose2);
  return fails ? 1 : 0;
}

/* In a starved-devmem child: run it and return its exit code. Otherwise -1. */
static int starved_child_main(int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], STARVED_FLAG) != 0) return -1;
  return starved_devmem_child();
}

static void test_starved_batch_device_reads(void) {
  char *argv[] = {(char *)tu_self_exe(), STARVED_FLAG, NULL};
  tu_child c;
  int ws;

  if (tu_child_start(&c, exec_self, argv) != 0) {
    tu_fail(__FILE__, __LINE__, "cannot start the child");
    return;
  }
  ws = tu_child_wait(&c, 4 * XFER_MS);
  if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "the child's checks failed (wait status 0x%x; what failed is on its stderr)",
            (unsigned)ws);
  else
    CU_PASS("starved batch: device buffers back, late answers dropped");
}

/* A staged WRITE to a peer that reads nothing times out with its unit part-sent (16 MiB,
 * more than the sockets hold): the caller has TIMEOUT and its memory back, and writes
 * other bytes there. Once the peer reads again the rest of the frame goes out, from a
 * copy the engine took at the deadline: the peer's memory holds the first bytes
 * throughout, and the link still serves. Before, the rest went from the caller's
 * ranges after the call had returned (the peer got the caller's new bytes; memory the
 * caller had freed would have failed the send and taken the link). */
static void test_part_sent_write_timeout(void) {
  const struct stage_opts one = {.pool = "1:16"};
  const size_t len = 16 * MiB, tail = 64 * KiB;
  char bn[TU_ADDR_LEN];
  struct tu_hold h = TU_HOLD_INIT;
  uint8_t ans[8];
  uint32_t alen = 0;
  hixl_call_t held;
  HixlTransferOpDesc d;

  if (tu_transport() && strcmp(tu_transport(), "rdma") == 0) {
    CU_PASS(
        "rdma: a staged unit goes by the target's RDMA from the engine's buffer, not the caller's ranges");
    return;
  }
  HixlEngine *b = target_start(&DEFAULTS, bn), *a = engine_start(tu_ip(), &one);
  uint8_t *bm = tu_alloc_mem(len + tail, false), *loose = tu_alloc_mem(len, false), *small = malloc(tail);
  CU_ASSERT_FATAL(a && b && bm && loose && small);
  CU_ASSERT_FATAL(tu_register(b, bm, len + tail) && connect_to(a, bn));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(b, 1, tu_hold_handler, &h));
  TU_ASSERT_OK_FATAL(hixl_engine_call_start(a, bn, 1, NULL, 0, ans, sizeof(ans), &alen, XFER_MS, &held));
  tu_hold_entered(&h); /* b reads nothing from here */
  tu_fill(loose, len, 911);
  d = desc(loose, (uintptr_t)bm, len);
  TU_ASSERT_STATUS(sync_xfer(a, bn, HIXL_WRITE, &d, 1, STOP_TIMEOUT), HIXL_TIMEOUT);
  tu_fill(loose, len, 912); /* the caller's memory again */
  tu_hold_release(&h);
  (void)hixl_engine_call_wait(a, bn, held);
  tu_fill(small, tail, 913); /* behind the timed-out frame on the link: applied after it */
  d = desc(small, (uintptr_t)bm + len, tail);
  TU_ASSERT_OK(sync_xfer(a, bn, HIXL_WRITE, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(bm + len, tail, 913, "a staged WRITE after the timed-out one");
  TU_ASSERT_PATTERN(bm, len, 911, "the timed-out WRITE's bytes, as they were when it was made");
  TU_ASSERT_OK(HixlEngineDestroy(a));
  TU_ASSERT_OK(HixlEngineDestroy(b));
  tu_free_mem(bm, len + tail);
  tu_free_mem(loose, len);
  free(small);
}

/* ---------------------------------------------------------------- 7. exhausted */

/* One call while every buffer is held: RESOURCE_EXHAUSTED on time, "BufferPool 1:1". */
static void expect_exhausted(HixlStatus st, int64_t t0, const char *what, unsigned line) {
  int64_t elapsed = tu_now_ms() - t0;

  if (tu_status_is(st, HIXL_RESOURCE_EXHAUSTED, what, __FILE__, line))
    (void)tu_last_error_has("BufferPool 1:1", __FILE__, line);
  if (elapsed < STOP_TIMEOUT - 20 || elapsed > STOP_TIMEOUT + STOP_MARGIN)
    tu_fail(__FILE__, line, "%s: returned after %lld ms, want [%d, %d]", what, (long long)elapsed,
            STOP_TIMEOUT - 20, STOP_TIMEOUT + STOP_MARGIN);
  else
    CU_PASS("on time");
}

/* Wait (bounded) until e has sent more than units staged units. */
static bool wait_units_above(HixlEngine *e, uint64_t units, int timeout_ms) {
  int64_t deadline = tu_now_ms() + timeout_ms;
  struct timespec pause = {0, 200000};
  struct hixl_stage_stats s;

  while (hixl_engine_stage_stats(e, &s) == HIXL_SUCCESS) {
    if (s.units > units) return true;
    if (tu_now_ms() >= deadline) break;
    nanosleep(&pause, NULL);
  }
  return false;
}

/* The target child stopped (SIGSTOP) while an async staged WRITE holds the only
 * buffer (BufferPool "1:1"): a sync staged call gives RESOURCE_EXHAUSTED at its
 * timeout and an async one ends FAILED, both naming the pool, neither sending data;
 * after SIGCONT the first request completes and the pool serves again. */
static void test_exhausted_pool(void) {
  const size_t big = 32 * MiB, small = 64 * KiB, late = 2 * MiB + 1;
  const uint64_t at_sync = 48 * MiB, at_async = 56 * MiB, at_warm = 60 * MiB, at_late = 40 * MiB;
  const struct stage_opts one = {.pool = "1:1"};
  tu_server_cfg cfg = {.mem_len = 64 * MiB, .shared = NULL, .seed = 0};
  tu_server_ready info;
  tu_child c;
  char name[TU_ADDR_LEN];
  HixlEngine *ini = NULL;
  unsigned char *bigbuf = malloc(big), *sbuf = malloc(small), *lbuf = malloc(2 * late);
  HixlTransferReq req = NULL, req2 = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  struct hixl_stage_stats s0;
  HixlTransferOpDesc d;
  HixlStatus st;
  int64_t t0;

  CU_ASSERT_FATAL(bigbuf && sbuf && lbuf);
  cfg.port = tu_free_port();
  tu_addr(name, sizeof(name), cfg.port);
  if (tu_server_start(&c, &cfg, &info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "server child on %s did not start: %s (%s)", name,
            HixlStatusName(info.status), info.error);
    goto free_bufs;
  }
  ini = engine_start(tu_ip(), &one);
  if (!ini || !connect_to(ini, name)) goto quit;
  /* The ranges the refused calls aim at hold known patterns. */
  CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_FILL, at_sync, small, 71), 0);
  CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_FILL, at_async, small, 72), 0);
  /* Staging works before the stop. */
  tu_fill(sbuf, small, 70);
  d = desc(sbuf, info.addr + at_warm, small);
  TU_ASSERT_OK(sync_xfer(ini, name, HIXL_WRITE, &d, 1, XFER_MS));
  child_expect(&c, TU_CMD_CHECK, at_warm, small, 70, "staged WRITE before the stop", __LINE__);

  tu_child_kill(&c, SIGSTOP);
  if (tu_child_wait_stopped(&c, 5000) != 0) {
    tu_fail(__FILE__, __LINE__, "the server child did not stop");
    goto quit;
  }
  /* 32 units for one buffer: far more than the socket buffers take in. */
  tu_fill(bigbuf, big, 73);
  s0 = stats_now(ini);
  d = desc(bigbuf, info.addr, big);
  st = HixlEngineTransferAsync(ini, name, HIXL_WRITE, &d, 1, 20000, NULL, &req);
  if (!tu_status_is(st, HIXL_SUCCESS, "async staged WRITE of 32 MiB to the stopped peer", __FILE__,
                    __LINE__)) {
    req = NULL;
    goto cont;
  }
  if (!wait_units_above(ini, s0.units, 5000))
    printf("  [no staged unit counted within 5 s of the async WRITE; going on]\n");

  tu_fill(sbuf, small, 74);
  d = desc(sbuf, info.addr + at_sync, small);
  t0 = tu_now_ms();
  st = sync_xfer(ini, name, HIXL_WRITE, &d, 1, STOP_TIMEOUT);
  expect_exhausted(st, t0, "sync staged WRITE, every buffer held", __LINE__);

  memset(lbuf, 0xAB, small);
  d = desc(lbuf, info.addr + at_warm, small);
  t0 = tu_now_ms();
  st = sync_xfer(ini, name, HIXL_READ, &d, 1, STOP_TIMEOUT);
  expect_exhausted(st, t0, "sync staged READ, every buffer held", __LINE__);
  CU_ASSERT_EQUAL(tu_check_byte(lbuf, small, 0xAB), -1); /* no data came */

  d = desc(sbuf, info.addr + at_async, small);
  t0 = tu_now_ms();
  st = HixlEngineTransferAsync(ini, name, HIXL_WRITE, &d, 1, STOP_TIMEOUT, NULL, &req2);
  if (tu_status_is(st, HIXL_SUCCESS, "async staged WRITE, every buffer held", __FILE__, __LINE__)) {
    st = tu_wait_request(ini, req2, t0 + STOP_TIMEOUT + STOP_MARGIN, &ts);
    if (st != HIXL_SUCCESS || ts != HIXL_TRANSFER_FAILED)
      tu_fail(__FILE__, __LINE__,
              "async staged WRITE, every buffer held: GetTransferStatus %s, state %d "
              "(want SUCCESS, FAILED %d): %s",
              HixlStatusName(st), (int)ts, (int)HIXL_TRANSFER_FAILED, HixlGetLastErrorMessage());
    else
      TU_ASSERT_ERRMSG_HAS("BufferPool 1:1");
  }

cont:
  tu_child_kill(&c, SIGCONT);
  if (req) {
    st = tu_wait_request(ini, req, tu_now_ms() + XFER_MS, &ts);
    if (st != HIXL_SUCCESS || ts != HIXL_TRANSFER_COMPLETED)
      tu_fail(__FILE__, __LINE__,
              "the held async WRITE after SIGCONT: GetTransferStatus %s, state %d (want "
              "COMPLETED): %s",
              HixlStatusName(st), (int)ts, HixlGetLastErrorMessage());
    else
      child_expect(&c, TU_CMD_CHECK, 0, big, 73, "the async WRITE held up by the stop", __LINE__);
  }
  child_expect(&c, TU_CMD_CHECK, at_sync, small, 71, "target of the exhausted sync WRITE untouched",
               __LINE__);
  child_expect(&c, TU_CMD_CHECK, at_async, small, 72, "target of the exhausted async WRITE untouched",
               __LINE__);
  /* The buffer is free again: a new staged transfer works both ways. */
  tu_fill(lbuf, late, 75);
  d = desc(lbuf, info.addr + at_late, late);
  TU_ASSERT_OK(sync_xfer(ini, name, HIXL_WRITE, &d, 1, XFER_MS));
  child_expect(&c, TU_CMD_CHECK, at_late, late, 75, "staged WRITE after SIGCONT", __LINE__);
  memset(lbuf + late, 0, late);
  d = desc(lbuf + late, info.addr + at_late, late);
  TU_ASSERT_OK(sync_xfer(ini, name, HIXL_READ, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(lbuf + late, late, 75, "staged READ after SIGCONT");
quit:
  tu_child_kill(&c, SIGCONT);
  if (ini) TU_ASSERT_OK(HixlEngineDestroy(ini));
  child_quit(&c);
free_bufs:
  free(lbuf);
  free(sbuf);
  free(bigbuf);
}

/* ---------------------------------------------------------------- 9. unmapped */

/* One op the target must refuse when it copies: FAILED, sync and async. */
static void expect_target_refuses(HixlEngine *ini, const char *remote, HixlTransferOp op, void *local,
                                  uint64_t raddr, size_t len, const char *what) {
  HixlTransferOpDesc d = desc(local, raddr, len);
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  char msg[160];
  HixlStatus st;

  snprintf(msg, sizeof(msg), "sync %s of %s", op_name(op), what);
  (void)tu_status_is(sync_xfer(ini, remote, op, &d, 1, REFUSE_MS), HIXL_FAILED, msg, __FILE__, __LINE__);
  snprintf(msg, sizeof(msg), "async %s of %s", op_name(op), what);
  st = HixlEngineTransferAsync(ini, remote, op, &d, 1, REFUSE_MS, NULL, &req);
  if (st == HIXL_SUCCESS) {
    st = tu_wait_request(ini, req, tu_now_ms() + REFUSE_MS + 5000, &ts);
    if (st != HIXL_SUCCESS || ts != HIXL_TRANSFER_FAILED)
      tu_fail(__FILE__, __LINE__, "%s: GetTransferStatus %s, state %d (want FAILED): %s", msg,
              HixlStatusName(st), (int)ts, HixlGetLastErrorMessage());
    else
      CU_PASS(msg);
  } else {
    (void)tu_status_is(st, HIXL_FAILED, msg, __FILE__, __LINE__);
  }
}

/* A target with StagingUnregistered "on" asked to copy to and from a page it has
 * unmapped: FAILED, and the target lives on and serves. */
static void test_target_unmapped(void) {
  const size_t len = 64 * KiB, page = (size_t)sysconf(_SC_PAGESIZE);
  target_proc t;
  HixlEngine *ini = NULL;
  area lr = {0};
  HixlTransferOpDesc d;
  uint64_t hole;
  int op;

  if (!target_proc_start(&t, "on")) return;
  hole = t.info.hole;
  ini = engine_start(tu_ip(), &DEFAULTS);
  if (!ini || !connect_to(ini, t.name) || !area_open(&lr, 4 * len, ini)) goto quit;
  CU_ASSERT_EQUAL(child_cmd(&t.c, TGT_FILL_UNREG, 0, TARGET_UNREG, 901), 0);
  CU_ASSERT_EQUAL_FATAL(child_cmd(&t.c, TGT_MAKE_HOLE, 0, 0, 0), 0);
  tu_fill(lr.mem, len, 902);
  for (op = HIXL_READ; op <= HIXL_WRITE; op++) {
    expect_target_refuses(ini, t.name, op, lr.mem + len, hole, page, "the target's unmapped page");
    expect_target_refuses(ini, t.name, op, lr.mem + len, hole + 100, 8, "8 B inside the unmapped page");
    expect_target_refuses(ini, t.name, op, lr.mem + len, hole - 10, 20,
                          "a range running into the unmapped page");
    expect_target_refuses(ini, t.name, op, lr.mem + len, hole + page - 10, 20,
                          "a range running out of the unmapped page");
  }
  /* The premise held: the hole was unmapped all along (nothing mapped it since). */
  if (child_cmd(&t.c, TGT_HOLE_STATE, 0, 0, 0) != 0)
    tu_fail(__FILE__, __LINE__,
            "something in the target child mapped the hole; the checks above prove nothing");
  /* Alive: it answers, its memory is as it was, and it serves valid transfers. */
  child_expect(&t.c, TGT_CHECK_UNREG, 0, TARGET_UNREG, 901, "unregistered memory after refused ops",
               __LINE__);
  d = desc(lr.mem, t.info.unreg + 100, len);
  TU_ASSERT_OK(sync_xfer(ini, t.name, HIXL_WRITE, &d, 1, XFER_MS));
  child_expect(&t.c, TGT_CHECK_UNREG, 100, len, 902, "WRITE to unregistered memory after refused ops",
               __LINE__);
  memset(lr.mem + 2 * len, 0, len);
  d = desc(lr.mem + 2 * len, t.info.unreg + 100, len);
  TU_ASSERT_OK(sync_xfer(ini, t.name, HIXL_READ, &d, 1, XFER_MS));
  TU_ASSERT_PATTERN(lr.mem + 2 * len, len, 902, "READ from unregistered memory after refused ops");
  d = desc(lr.mem, t.info.reg + 7, len);
  TU_ASSERT_OK(sync_xfer(ini, t.name, HIXL_WRITE, &d, 1, XFER_MS));
  child_expect(&t.c, TGT_CHECK_REG, 7, len, 902, "WRITE to registered memory after refused ops", __LINE__);
quit:
  area_close(&lr);
  if (ini) TU_ASSERT_OK(HixlEngineDestroy(ini));
  child_quit(&t.c);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  CU_pSuite s;
  int rc = tu_child_main(argc, argv);

  if (rc >= 0) return rc; /* a tu_server child (test 7's target) */
  rc = target_child_main(argc, argv);
  if (rc >= 0) return rc; /* a staging target child */
  rc = starved_child_main(argc, argv);
  if (rc >= 0) return rc; /* the starved-batch child (test 6c) */
  if (!tu_self_exe()[0]) {
    fprintf(stderr, "cannot resolve /proc/self/exe\n");
    return 1;
  }
  /* StagingUnregistered on needs a key: every engine here, children included, holds one. */
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  s = CU_add_suite("staging, engines in one process", NULL, NULL);
  CU_add_test(s, "malloc'd local memory, WRITE and READ", test_local_unregistered);
  CU_add_test(s, "unregistered remote memory, target on and off", test_remote_unregistered);
  CU_add_test(s, "scoped target, no grant: staged ops refused, nothing allocated",
              test_scoped_target_allocates_nothing);
  CU_add_test(s, "BufferPool 0:0 refuses unregistered ranges", test_pool_off);
  CU_add_test(s, "an op of nearly SIZE_MAX bytes: PARAM_INVALID at once", test_huge_len_refused);
  CU_add_test(s, "an op of 2^50 bytes, a batch over 1 TiB: PARAM_INVALID before anything is allocated",
              test_huge_batch_bounded);
  CU_add_test(s, "mixed sizes and kinds in one batch", test_mixed_batch);
  CU_add_test(s, "BufferPool 1:1 cycles one buffer", test_one_buffer);
  CU_add_test(s, "small registered ops coalesced; threshold 0", test_coalescing);
  CU_add_test(s, "async staged requests, window of 4", test_async_window);
  CU_add_test(s, "a peer stops answering: its units' buffers back at their deadline",
              test_stalled_peer_pool_back);
  CU_add_test(s, "a starved batch to a stalled peer: its device READs' bounce buffers back at the deadline",
              test_starved_batch_device_reads);
  s = CU_add_suite("staging, target in a child process", NULL, NULL);
  CU_add_test(s, "a staged WRITE times out part-sent: the rest goes from a copy made at the deadline",
              test_part_sent_write_timeout);
  CU_add_test(s, "pool held by a stopped peer: EXHAUSTED, then recovers", test_exhausted_pool);
  CU_add_test(s, "unmapped target address: FAILED, target survives", test_target_unmapped);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
