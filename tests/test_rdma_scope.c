/* Scoped memory over RDMA (docs/security.md, "Scoped memory over RDMA"): a scoped
 * target's registrations carry no key, and each range granted to a peer gets a type 2
 * memory window on that peer's QP. Checked on a real verbs device (soft-RoCE in the
 * project's QEMU guest), byte for byte on both sides:
 *   - nothing granted: ops go as tcp frames, the target refuses them, nothing moves;
 *   - granted: READ and WRITE go by RDMA inside the windows (across two adjacent ones
 *     too), and an op running past a window is refused by the target's CPU;
 *   - adjacent ranges granted together share one window; revoking one of them closes
 *     it, the rest gets windows again (new keys), the old key fails at the NIC;
 *   - two runs granted apart that overlap in part (two requests' runs of blocks sharing
 *     some): the shared part is counted twice, every byte is read by RDMA, each revoke
 *     closes what only its run held;
 *   - a range of such a run granted again (a block two requests share) splits the run:
 *     its window stays open until the first grant is revoked (ops in flight with its key
 *     still land), the peer uses new windows, and the shared range stays reachable by
 *     RDMA after the first grant is revoked;
 *   - forged keys (white-box: a window the initiator was never sent): the window of
 *     another range, the MR's own key, another peer's window, a window after its
 *     revoke. Each fails at the NIC (the QP goes to error, the link ends), and the
 *     target's memory and the initiator's buffer are unchanged;
 *   - revoke closes the windows at once, on both sides;
 *   - an op spanning more windows than a send queue holds work requests (one each) is
 *     refused before any is posted, and the link stays (an op before it in the call
 *     ends at once, not at the deadline);
 *   - the device was asked whether it holds a window's key to the window, and the
 *     windows are bound over the registration's own MR where it does, over an MR of
 *     their own where it does not (soft-RoCE in Linux 6.1: the forged key above would
 *     reach past its window otherwise). Run again with HIXL_TEST_RDMA_MW_BOUNDS=held
 *     (test_rdma_scope_mr_shared): every window over the registration's MR whatever
 *     the device does, for that path's grants, splits, revokes and withdrawals; the
 *     one forged key that only the device's bounds can stop is then not tried where
 *     the device does not hold them.
 * Skips (77) where no RDMA device exists; HIXL_REQUIRE_RDMA=1 (the guest) fails then. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "test_util.h"
#include "transport/rdma/erdma.h"
#include "transport/rdma/rdma.h"

#define MEM   (4u << 20)
#define WIN   (64u << 10)   /* one granted range */
#define A_OFF (1u << 20)    /* two adjacent ranges granted from here */
#define B_OFF (3u << 20)    /* one range granted to J only */
#define C_OFF (2u << 20)    /* a run of four adjacent ranges, granted together */
#define D_OFF (2560u << 10) /* another run of four, one of them then granted again */
#define E_OFF (3328u << 10) /* two runs of four overlapping by two (the plugin's runs of blocks) */
#define F_OFF (1536u << 10) /* one range cut into more windows than a send queue holds */

static struct {
  int bounds;            /* what the target's device answered rdma_probe_mw_bounds: 1, 0 */
  bool shared;           /* the target binds windows over its registrations' MRs */
  HixlEngine *t, *i, *j; /* the scoped target; two initiators */
  uint8_t *tmem, *imem, *jmem;
  char t_name[TU_ADDR_LEN], i_name[TU_ADDR_LEN], j_name[TU_ADDR_LEN];
} g;

static HixlEngine *engine_at(char *name, bool scoped) {
  static const HixlOption o[] = {{"Transport", "rdma"}};
  HixlEngine *e = NULL;
  snprintf(name, TU_ADDR_LEN, "%s:%u", tu_ip(), (unsigned)tu_free_port());
  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return NULL;
  if (HixlEngineInitialize(e, name, o, 1) != HIXL_SUCCESS ||
      (scoped && hixl_engine_set_scoped(e, true) != HIXL_SUCCESS)) {
    fprintf(stderr, "engine %s: %s\n", name, HixlGetLastErrorMessage());
    HixlEngineDestroy(e);
    return NULL;
  }
  return e;
}

static int suite_init(void) {
  g.tmem = tu_alloc_mem(MEM, false);
  g.imem = tu_alloc_mem(MEM, false);
  g.jmem = tu_alloc_mem(MEM, false);
  g.t = engine_at(g.t_name, true);
  g.i = engine_at(g.i_name, false);
  g.j = engine_at(g.j_name, false);
  if (!g.tmem || !g.imem || !g.jmem || !g.t || !g.i || !g.j) return -1;
  if (!tu_register(g.t, g.tmem, MEM) || !tu_register(g.i, g.imem, MEM) || !tu_register(g.j, g.jmem, MEM))
    return -1;
  if (HixlEngineConnect(g.i, g.t_name, 10000) != HIXL_SUCCESS ||
      HixlEngineConnect(g.j, g.t_name, 10000) != HIXL_SUCCESS)
    return -1;
  return 0;
}

static int suite_cleanup(void) {
  HixlEngineDestroy(g.i);
  HixlEngineDestroy(g.j);
  HixlEngineDestroy(g.t);
  tu_free_mem(g.tmem, MEM);
  tu_free_mem(g.imem, MEM);
  tu_free_mem(g.jmem, MEM);
  return 0;
}

static HixlTransferOpDesc op(uint8_t *local, size_t loff, size_t roff, size_t len) {
  return (HixlTransferOpDesc){(uintptr_t)local + loff, (uintptr_t)g.tmem + roff, len};
}

static struct hixl_link_info info(HixlEngine *e) {
  struct hixl_link_info li;
  memset(&li, 0, sizeof(li));
  TU_ASSERT_OK(hixl_engine_link_info(e, g.t_name, &li));
  return li;
}

static uint64_t refusals(void) {
  uint64_t r = 0;
  TU_ASSERT_OK(hixl_engine_grant_stats(g.t, g.i_name, NULL, &r));
  return r;
}

static struct hixl_window_stats wstats(void) {
  struct hixl_window_stats s;
  memset(&s, 0, sizeof(s));
  TU_ASSERT_OK(hixl_engine_window_stats(g.t, &s));
  return s;
}

/* White-box: e's RDMA link to the target (NULL when there is none). */
static struct erdma_link *rdma_link_of(HixlEngine *e) {
  struct erdma_link *l = NULL;
  pthread_mutex_lock(&e->lock);
  for (struct peer *p = e->peers; p && !l; p = p->next)
    if (strcmp(p->name, g.t_name) == 0 && p->conn) l = p->conn->xs[XPORT_RDMA];
  pthread_mutex_unlock(&e->lock);
  return l;
}

/* White-box: e's window starting at addr (all zero: none). */
static struct erdma_win window_at(HixlEngine *e, uint64_t addr) {
  struct erdma_win w = {0};
  struct erdma_link *l = rdma_link_of(e);
  pthread_mutex_lock(&e->lock);
  const struct erdma_win *x = l ? erdma_rwins_find(&l->rwins, addr) : NULL;
  if (x && x->addr == addr) w = *x;
  pthread_mutex_unlock(&e->lock);
  return w;
}

static uint32_t window_key(HixlEngine *e, uint64_t addr) { return window_at(e, addr).rkey; }
static uint64_t window_len(HixlEngine *e, uint64_t addr) { return window_at(e, addr).len; }

/* White-box: give e a window the target never sent it. */
static void forge(HixlEngine *e, uint64_t addr, uint64_t len, uint32_t rkey) {
  struct erdma_link *l = rdma_link_of(e);
  CU_ASSERT_PTR_NOT_NULL_FATAL(l);
  pthread_mutex_lock(&e->lock);
  struct erdma_win w = {.addr = addr, .len = len, .rkey = rkey};
  CU_ASSERT_EQUAL(erdma_rwins_add(&l->rwins, &w, 1), 0); /* over any it holds there */
  pthread_mutex_unlock(&e->lock);
}

static void grant(const char *peer, const uint64_t (*r)[2], size_t n, bool add) {
  TU_ASSERT_OK(add ? hixl_engine_grant(g.t, peer, r, n) : hixl_engine_revoke(g.t, peer, r, n));
}

static uint64_t at(size_t off) { return (uintptr_t)g.tmem + off; }

/* A READ of [roff, +len) into imem at loff must fail and leave both sides as they were. */
static void read_refused(HixlEngine *e, uint8_t *local, size_t loff, size_t roff, size_t len) {
  memset(local + loff, 0x5a, len);
  HixlTransferOpDesc d = op(local, loff, roff, len);
  TU_ASSERT_STATUS(HixlEngineTransferSync(e, g.t_name, HIXL_READ, &d, 1, 10000), HIXL_FAILED);
  CU_ASSERT_EQUAL(tu_check_byte(local + loff, len, 0x5a), -1);
}

/* I READs the WIN bytes at x (the target's, filled with pattern) by RDMA, in one op
 * inside its windows: every byte arrives. */
static void read_by_rdma(uint8_t *x, int pattern, const char *what) {
  tu_fill(x, WIN, pattern);
  HixlTransferOpDesc d = {(uintptr_t)g.imem, (uintptr_t)x, WIN};
  uint64_t ops0 = info(g.i).win_ops;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &d, 1, 10000));
  TU_ASSERT_SAME(g.imem, x, WIN, what);
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
}

/* White-box: the target's device (its engine's own address). */
static struct rdma_dev *target_dev(void) {
  struct erdma_engine *x = engine_xe(g.t, XPORT_RDMA);
  return x ? &x->dev[0] : NULL;
}

/* The target's scoped registration asked its device (or a test build was told), once;
 * asked again here directly, the device answers the same, and a remote access error
 * or a READ that went through, nothing else. */
static void test_mw_bounds(void) {
  struct rdma_dev *d = target_dev();
  CU_ASSERT_PTR_NOT_NULL_FATAL(d);
  CU_ASSERT_TRUE_FATAL(d->mw2);
  char why[256] = "";
  g.bounds = rdma_probe_mw_bounds(d, why, sizeof(why));
  if (g.bounds < 0) fprintf(stderr, "rdma_probe_mw_bounds: %s\n", why);
  CU_ASSERT_TRUE_FATAL(g.bounds == 0 || g.bounds == 1);
  const char *forced = getenv("HIXL_TEST_RDMA_MW_BOUNDS");
  int want = forced && strcmp(forced, "held") == 0 ? RDMA_MWB_HELD
             : forced && strcmp(forced, "mr") == 0 ? RDMA_MWB_MR
             : g.bounds                            ? RDMA_MWB_HELD
                                                   : RDMA_MWB_MR;
  pthread_mutex_lock(&g.t->lock);
  int got = d->mw_bounds;
  pthread_mutex_unlock(&g.t->lock);
  CU_ASSERT_EQUAL(got, want);
  g.shared = got == RDMA_MWB_HELD;
  /* Another scoped engine of this process on the same device: the answer is the
   * process's, not probed again. */
  uint32_t probes = erdma_mw_probes();
  char name[TU_ADDR_LEN];
  HixlEngine *e2 = engine_at(name, true);
  uint8_t *m2 = tu_alloc_mem(WIN, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(e2);
  CU_ASSERT_PTR_NOT_NULL(tu_register(e2, m2, WIN)); /* its first scoped registration asks */
  struct erdma_engine *x2 = engine_xe(e2, XPORT_RDMA);
  CU_ASSERT_PTR_NOT_NULL_FATAL(x2);
  CU_ASSERT_EQUAL(x2->dev[0].mw_bounds, got);
  CU_ASSERT_EQUAL(erdma_mw_probes(), probes);
  HixlEngineFinalize(e2);
  HixlEngineDestroy(e2);
  tu_free_mem(m2, WIN);
  fprintf(stderr, "test_rdma_scope: %s %s a window's key to the window; windows bound over %s\n", d->name,
          g.bounds ? "holds" : "does not hold", g.shared ? "the registration's MR" : "MRs of their own");
}

/* A window over a run, the whole of another registration: bound over an MR of its own
 * where the device does not hold its key to it, else over the registration's. */
static void test_window_mr(void) {
  uint8_t *x = tu_alloc_mem(WIN, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  HixlMemHandle h = tu_register(g.t, x, WIN);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  const uint64_t r[2][2] = {{(uintptr_t)x, WIN / 2}, {(uintptr_t)x + WIN / 2, WIN / 2}};
  struct hixl_window_stats s0 = wstats();
  grant(g.i_name, r, 2, true);
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.bound, s0.bound + 1); /* one run */
  CU_ASSERT_EQUAL(s1.own_mrs, s0.own_mrs + (g.shared ? 0 : 1));
  read_by_rdma(x, 8, "READ in a window over the run");
  grant(g.i_name, r, 2, false);
  CU_ASSERT_EQUAL(wstats().open, s0.open);
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.t, h));
  tu_free_mem(x, WIN);
}

static void test_link_and_keys(void) {
  struct hixl_link_info li = info(g.i);
  CU_ASSERT_EQUAL_FATAL(li.rdma, 1);
  CU_ASSERT_EQUAL(li.windows, 0);
  /* The target advertised its registration with no key. */
  pthread_mutex_lock(&g.i->lock);
  const struct remote_mem *rm = NULL;
  for (struct peer *p = g.i->peers; p && !rm; p = p->next)
    if (strcmp(p->name, g.t_name) == 0) rm = (const struct remote_mem *)memtab_find(&p->rtab, at(0), 1);
  CU_ASSERT_PTR_NOT_NULL(rm);
  if (rm) CU_ASSERT_EQUAL(rm->rkey, 0);
  pthread_mutex_unlock(&g.i->lock);
  /* Scoping is chosen before any registration. */
  TU_ASSERT_STATUS(hixl_engine_set_scoped(g.t, false), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("before registering memory");
}

static void test_nothing_granted(void) {
  tu_fill(g.tmem, MEM, 1);
  uint64_t before = refusals();
  read_refused(g.i, g.imem, 0, A_OFF, WIN);
  CU_ASSERT_EQUAL(refusals(), before + 1); /* the target's CPU saw it */
  HixlTransferOpDesc w = op(g.imem, 0, A_OFF, 4096);
  memset(g.imem, 0x33, 4096);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.i, g.t_name, HIXL_WRITE, &w, 1, 10000), HIXL_FAILED);
  TU_ASSERT_PATTERN(g.tmem, MEM, 1, "target after refused ops");
  CU_ASSERT_EQUAL(info(g.i).win_ops, 0);
}

static void test_granted_by_rdma(void) {
  const uint64_t r[3][2] = {{at(A_OFF), WIN}, {at(A_OFF + 4 * WIN), 4096}, {at(A_OFF + WIN), WIN}};
  struct hixl_window_stats s0 = wstats();
  grant(g.i_name, r, 2, true);
  grant(g.i_name, r + 2, 1, true); /* adjacent to the first, granted apart: a window of its own */
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.open, s0.open + 3);
  CU_ASSERT_EQUAL(s1.bound, s0.bound + 3);
  CU_ASSERT_EQUAL(s1.refused, s0.refused);
  tu_fill(g.tmem, MEM, 2);
  uint64_t before = refusals();
  /* One READ inside the first window, one across the two adjacent ones (two WRs). */
  HixlTransferOpDesc d[2] = {op(g.imem, 0, A_OFF + 512, 4096), op(g.imem, 8192, A_OFF + 4096, WIN)};
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, d, 2, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + A_OFF + 512, 4096, "READ inside a window");
  TU_ASSERT_SAME(g.imem + 8192, g.tmem + A_OFF + 4096, WIN, "READ across two windows");
  struct hixl_link_info li = info(g.i);
  CU_ASSERT_EQUAL(li.windows, 3);
  CU_ASSERT_EQUAL(li.win_ops, 2); /* by RDMA, not the target's CPU */
  CU_ASSERT_EQUAL(refusals(), before);
  /* WRITE into the small window. */
  tu_fill(g.imem, 4096, 3);
  HixlTransferOpDesc w = op(g.imem, 0, A_OFF + 4 * WIN, 4096);
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_WRITE, &w, 1, 10000));
  TU_ASSERT_PATTERN(g.tmem + A_OFF + 4 * WIN, 4096, 3, "target after a WRITE in a window");
  CU_ASSERT_EQUAL(info(g.i).win_ops, 3);
  /* Past a window's end: the target's CPU refuses it; nothing moves. */
  read_refused(g.i, g.imem, 0, A_OFF + 2 * WIN - 4096, 8192);
  CU_ASSERT_EQUAL(refusals(), before + 1);
  CU_ASSERT_EQUAL(info(g.i).win_ops, 3);
}

/* A forged window ends the link at the NIC; both sides unchanged; Connect again. */
static void forged(HixlEngine *e, uint8_t *local, uint64_t raddr_off, uint64_t len, uint32_t key, bool write,
                   const char *what) {
  tu_fill(g.tmem, MEM, 4);
  memset(local, 0x5a, len);
  forge(e, at(raddr_off), len, key);
  HixlTransferOpDesc d = op(local, 0, raddr_off, len);
  TU_ASSERT_STATUS(HixlEngineTransferSync(e, g.t_name, write ? HIXL_WRITE : HIXL_READ, &d, 1, 10000),
                   HIXL_FAILED);
  /* The NIC refused it: the QP went to error. The target's QP went too, and it closes the
   * link: that close may reach this side before its own completion does (1 run in 10 in
   * the soft-RoCE guest). Either way nothing moved (below). */
  const char *why = HixlGetLastErrorMessage();
  CU_ASSERT(strstr(why, "RDMA") != NULL || strstr(why, "peer closed the connection") != NULL);
  if (!strstr(why, "RDMA") && !strstr(why, "peer closed the connection"))
    fprintf(stderr, "  error: %s\n", why);
  CU_ASSERT_EQUAL(tu_check_byte(local, len, 0x5a), -1);
  TU_ASSERT_PATTERN(g.tmem, MEM, 4, what);
  TU_ASSERT_OK(HixlEngineConnect(e, g.t_name, 10000));
}

static void test_forged_keys(void) {
  uint32_t key_a = window_key(g.i, at(A_OFF));
  CU_ASSERT_NOT_EQUAL_FATAL(key_a, 0);
  /* Window A's key over the range after the granted ones: the window's bounds, or its
   * own MR's, stop it; neither where a test build binds over the registration's MR on
   * a device that does not hold them. */
  if (g.shared && !g.bounds) {
    fprintf(stderr,
            "test_rdma_scope: another range's key not tried: this device does not hold a window's "
            "key to the window, and HIXL_TEST_RDMA_MW_BOUNDS=held binds over the registration's MR\n");
  } else {
    forged(g.i, g.imem, A_OFF + 2 * WIN, WIN, key_a, false, "READ with another range's window key");
    /* The new link got no windows (granted before it was made): its ops go by the socket. */
    CU_ASSERT_EQUAL(info(g.i).windows, 0);
  }
  /* The MR's own key (no remote access: 0 on rxe, refused by any NIC). */
  pthread_mutex_lock(&g.t->lock);
  const struct hixl_mem_reg *reg = (const struct hixl_mem_reg *)memtab_find(&g.t->regs, at(0), 1);
  const struct erdma_mr *m = reg ? reg->xm[XPORT_RDMA] : NULL;
  uint32_t mr_key = m ? rdma_mr_rkey(m->mr[0]) : 0;
  pthread_mutex_unlock(&g.t->lock);
  CU_ASSERT_PTR_NOT_NULL(m);
  forged(g.i, g.imem, 0, 4096, mr_key, true, "WRITE with the registration's own key");
  /* J's window, used by I. */
  const uint64_t b[1][2] = {{at(B_OFF), WIN}};
  grant(g.j_name, b, 1, true);
  tu_fill(g.tmem, MEM, 5);
  HixlTransferOpDesc jd = op(g.jmem, 0, B_OFF, WIN);
  TU_ASSERT_OK(HixlEngineTransferSync(g.j, g.t_name, HIXL_READ, &jd, 1, 10000));
  TU_ASSERT_SAME(g.jmem, g.tmem + B_OFF, WIN, "J's READ in its window");
  CU_ASSERT_EQUAL(info(g.j).win_ops, 1);
  uint32_t key_j = window_key(g.j, at(B_OFF));
  CU_ASSERT_NOT_EQUAL_FATAL(key_j, 0);
  forged(g.i, g.imem, B_OFF, WIN, key_j, false, "READ with another peer's window key");
  grant(g.j_name, b, 1, false);
}

static void test_revoke(void) {
  const uint64_t r[1][2] = {{at(A_OFF + 8 * WIN), WIN}};
  grant(g.i_name, r, 1, true);
  tu_fill(g.tmem, MEM, 6);
  HixlTransferOpDesc d = op(g.imem, 0, A_OFF + 8 * WIN, WIN);
  uint64_t ops0 = info(g.i).win_ops;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &d, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + A_OFF + 8 * WIN, WIN, "READ in a window");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  uint32_t key = window_key(g.i, r[0][0]);
  CU_ASSERT_NOT_EQUAL_FATAL(key, 0);
  struct hixl_window_stats s0 = wstats();
  grant(g.i_name, r, 1, false);
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.open, s0.open - 1);
  CU_ASSERT_EQUAL(s1.closed, s0.closed + 1);
  /* The initiator forgets it (WIN_DEL) before its next op, which the target refuses. */
  read_refused(g.i, g.imem, 0, A_OFF + 8 * WIN, WIN);
  CU_ASSERT_EQUAL(window_key(g.i, r[0][0]), 0);
  /* The old key, kept by a peer that ignores WIN_DEL: the NIC refuses it. */
  forged(g.i, g.imem, A_OFF + 8 * WIN, WIN, key, false, "READ with a revoked window's key");
}

/* Four adjacent ranges granted together: one window. Revoking the second closes it at
 * once, and the first and the last two (still granted) get windows again, with new
 * keys; the old key fails at the NIC. */
static void test_run_and_partial_revoke(void) {
  uint64_t r[4][2];
  for (int k = 0; k < 4; k++) r[k][0] = at(C_OFF + k * WIN), r[k][1] = WIN;
  struct hixl_window_stats s0 = wstats();
  grant(g.i_name, (const uint64_t(*)[2])r, 4, true);
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.open, s0.open + 1);
  CU_ASSERT_EQUAL(s1.bound, s0.bound + 1);
  tu_fill(g.tmem, MEM, 8);
  uint64_t ops0 = info(g.i).win_ops, before = refusals();
  HixlTransferOpDesc all = op(g.imem, 0, C_OFF, 4 * WIN); /* the initiator has read WIN_ADD first */
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &all, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + C_OFF, 4 * WIN, "READ of the whole run");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  CU_ASSERT_EQUAL(window_len(g.i, at(C_OFF)), 4 * WIN);
  uint32_t old_key = window_key(g.i, at(C_OFF));
  CU_ASSERT_NOT_EQUAL_FATAL(old_key, 0);
  /* Revoke the second. */
  grant(g.i_name, (const uint64_t(*)[2])(r + 1), 1, false);
  struct hixl_window_stats s2 = wstats();
  CU_ASSERT_EQUAL(s2.closed, s1.closed + 1);
  CU_ASSERT_EQUAL(s2.bound, s1.bound + 2);
  CU_ASSERT_EQUAL(s2.open, s1.open + 1);
  CU_ASSERT_EQUAL(s2.refused, s1.refused);
  /* The initiator hears WIN_DEL and WIN_ADD before the answer to its next op. */
  tu_fill(g.tmem, MEM, 9);
  HixlTransferOpDesc d[2] = {op(g.imem, 0, C_OFF, WIN), op(g.imem, WIN, C_OFF + 2 * WIN, 2 * WIN)};
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, d, 2, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + C_OFF, WIN, "READ of the first, still granted");
  TU_ASSERT_SAME(g.imem + WIN, g.tmem + C_OFF + 2 * WIN, 2 * WIN, "READ of the last two, still granted");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 3); /* by RDMA, in the new windows */
  CU_ASSERT_EQUAL(window_len(g.i, at(C_OFF)), WIN);
  CU_ASSERT_EQUAL(window_len(g.i, at(C_OFF + WIN)), 0);
  CU_ASSERT_EQUAL(window_len(g.i, at(C_OFF + 2 * WIN)), 2 * WIN);
  uint32_t new_key = window_key(g.i, at(C_OFF));
  CU_ASSERT_NOT_EQUAL(new_key, 0);
  CU_ASSERT_NOT_EQUAL(new_key, old_key);
  CU_ASSERT_EQUAL(refusals(), before);
  /* The revoked one: refused by the target's CPU. */
  read_refused(g.i, g.imem, 0, C_OFF + WIN, WIN);
  CU_ASSERT_EQUAL(refusals(), before + 1);
  const uint64_t rest[3][2] = {{r[0][0], WIN}, {r[2][0], WIN}, {r[3][0], WIN}};
  grant(g.i_name, rest, 3, false);
  CU_ASSERT_EQUAL(wstats().open, s0.open);
  /* The closed window's key, over the revoked range: the NIC refuses it. */
  forged(g.i, g.imem, C_OFF + WIN, WIN, old_key, false, "READ with the closed run's key");
}

/* A run of four granted together; then the third granted again (a second grant: a block
 * two requests share). The run's window is split, not closed: it stays open (its key
 * still reaches the run at the target), the peer forgets it for four windows of the
 * pieces. Revoking the first grant closes the run's window and the pieces of the
 * ranges no longer granted; the third stays reachable by RDMA through its own window,
 * whose key never changed since the split. */
static void test_shared_range_splits(void) {
  uint64_t r[4][2];
  for (int k = 0; k < 4; k++) r[k][0] = at(D_OFF + k * WIN), r[k][1] = WIN;
  struct hixl_window_stats s0 = wstats();
  grant(g.i_name, (const uint64_t(*)[2])r, 4, true);
  tu_fill(g.tmem, MEM, 10);
  HixlTransferOpDesc all = op(g.imem, 0, D_OFF, 4 * WIN); /* the initiator has read WIN_ADD first */
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &all, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + D_OFF, 4 * WIN, "READ of the run");
  CU_ASSERT_EQUAL(window_len(g.i, at(D_OFF)), 4 * WIN);
  uint32_t run_key = window_key(g.i, at(D_OFF));
  CU_ASSERT_NOT_EQUAL_FATAL(run_key, 0);
  grant(g.i_name, (const uint64_t(*)[2])(r + 2), 1, true); /* the second grant */
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.split, s0.split + 1);
  CU_ASSERT_EQUAL(s1.bound, s0.bound + 1 + 3); /* the run, then [0, 2), [2], [3] */
  CU_ASSERT_EQUAL(s1.open, s0.open + 1 + 3);   /* the run's still open, retired */
  CU_ASSERT_EQUAL(s1.closed, s0.closed);
  tu_fill(g.tmem, MEM, 13);
  uint64_t ops0 = info(g.i).win_ops; /* three windows now */
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &all, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + D_OFF, 4 * WIN, "READ of the run after the split");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  CU_ASSERT_EQUAL(window_len(g.i, at(D_OFF)), 2 * WIN);
  CU_ASSERT_EQUAL(window_len(g.i, at(D_OFF + 2 * WIN)), WIN);
  CU_ASSERT_EQUAL(window_len(g.i, at(D_OFF + 3 * WIN)), WIN);
  uint32_t third_key = window_key(g.i, at(D_OFF + 2 * WIN));
  CU_ASSERT_NOT_EQUAL(third_key, 0);
  CU_ASSERT_NOT_EQUAL(window_key(g.i, at(D_OFF)), run_key);
  /* The retired run's key still reaches the run at the target: an op the peer had in
   * flight with it lands (white-box: planted again over the fourth, as such an op would
   * have been posted). */
  struct erdma_link *l = rdma_link_of(g.i);
  CU_ASSERT_PTR_NOT_NULL_FATAL(l);
  pthread_mutex_lock(&g.i->lock);
  struct erdma_win *fourth_win = (struct erdma_win *)erdma_rwins_find(&l->rwins, at(D_OFF + 3 * WIN));
  if (fourth_win && fourth_win->addr == at(D_OFF + 3 * WIN)) fourth_win->rkey = run_key;
  pthread_mutex_unlock(&g.i->lock);
  tu_fill(g.tmem, MEM, 11);
  HixlTransferOpDesc fourth = op(g.imem, 0, D_OFF + 3 * WIN, WIN);
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &fourth, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + D_OFF + 3 * WIN, WIN, "READ with the retired run's key");
  /* The first grant revoked: the run's window and the pieces of [0, 2) and [3] close;
   * the third keeps its window (and its key). */
  uint64_t before = refusals();
  grant(g.i_name, (const uint64_t(*)[2])r, 4, false);
  struct hixl_window_stats s2 = wstats();
  CU_ASSERT_EQUAL(s2.closed, s1.closed + 3);
  CU_ASSERT_EQUAL(s2.open, s0.open + 1);
  tu_fill(g.tmem, MEM, 12);
  HixlTransferOpDesc third = op(g.imem, 0, D_OFF + 2 * WIN, WIN);
  ops0 = info(g.i).win_ops;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &third, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + D_OFF + 2 * WIN, WIN, "READ of the range still granted");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  CU_ASSERT_EQUAL(window_key(g.i, at(D_OFF + 2 * WIN)), third_key);
  read_refused(g.i, g.imem, 0, D_OFF, WIN);
  CU_ASSERT_EQUAL(refusals(), before + 1);
  grant(g.i_name, (const uint64_t(*)[2])(r + 2), 1, false);
  CU_ASSERT_EQUAL(wstats().open, s0.open);
  /* The run's old key, over the first range (no longer granted): the NIC refuses it. */
  forged(g.i, g.imem, D_OFF, WIN, run_key, false, "READ with the closed run's key");
}

/* Runs [0, 4) and [2, 6) (in WIN) granted apart: the second splits the first's window
 * where they overlap. The six read by RDMA; the first revoked, [0, 2) is refused and [2, 6)
 * still read by RDMA; the second revoked, nothing is open that was not before. */
static void test_overlapping_runs(void) {
  const uint64_t a[1][2] = {{at(E_OFF), 4 * WIN}}, b[1][2] = {{at(E_OFF + 2 * WIN), 4 * WIN}};
  struct hixl_window_stats s0 = wstats();
  size_t pieces0 = 0, pieces = 0; /* what earlier tests left granted to I elsewhere, then with these */
  TU_ASSERT_OK(hixl_engine_grant_stats(g.t, g.i_name, &pieces0, NULL));
  grant(g.i_name, a, 1, true);
  grant(g.i_name, b, 1, true);
  TU_ASSERT_OK(hixl_engine_grant_stats(g.t, g.i_name, &pieces, NULL));
  CU_ASSERT_EQUAL(pieces, pieces0 + 3); /* [0, 2) once, [2, 4) twice, [4, 6) once */
  CU_ASSERT_EQUAL(wstats().split, s0.split + 1);
  tu_fill(g.tmem, MEM, 14);
  uint64_t ops0 = info(g.i).win_ops, before = refusals();
  HixlTransferOpDesc all = op(g.imem, 0, E_OFF, 6 * WIN);
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &all, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + E_OFF, 6 * WIN, "READ across two overlapping runs");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  grant(g.i_name, a, 1, false);
  read_refused(g.i, g.imem, 0, E_OFF, WIN);
  read_refused(g.i, g.imem, 0, E_OFF + WIN, WIN);
  CU_ASSERT_EQUAL(refusals(), before + 2);
  tu_fill(g.tmem, MEM, 15);
  HixlTransferOpDesc rest = op(g.imem, 0, E_OFF + 2 * WIN, 4 * WIN);
  ops0 = info(g.i).win_ops;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &rest, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + E_OFF + 2 * WIN, 4 * WIN, "READ of the second run, its shared part too");
  CU_ASSERT_EQUAL(info(g.i).win_ops, ops0 + 1);
  grant(g.i_name, b, 1, false);
  read_refused(g.i, g.imem, 0, E_OFF + 3 * WIN, WIN);
  CU_ASSERT_EQUAL(wstats().open, s0.open);
}

/* A registration withdrawn closes the windows inside it at once (each window's own MR
 * pins the pages: left open, it would outlive the memory): the count drops, and the
 * peer forgets the key before its next op, which fails. */
static void test_dereg_closes(void) {
  uint8_t *x = tu_alloc_mem(WIN, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  HixlMemHandle h = tu_register(g.t, x, WIN);
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  const uint64_t r[1][2] = {{(uintptr_t)x, WIN}};
  grant(g.i_name, r, 1, true);
  read_by_rdma(x, 7, "READ in the window over the extra registration");
  HixlTransferOpDesc d = {(uintptr_t)g.imem, (uintptr_t)x, WIN};
  uint32_t key = window_key(g.i, (uintptr_t)x);
  CU_ASSERT_NOT_EQUAL_FATAL(key, 0);
  struct hixl_window_stats s0 = wstats();
  TU_ASSERT_OK(HixlEngineDeregisterMem(g.t, h));
  struct hixl_window_stats s1 = wstats();
  CU_ASSERT_EQUAL(s1.open, s0.open - 1);
  CU_ASSERT_EQUAL(s1.closed, s0.closed + 1);
  /* The peer hears of both (MEM_DEL, WIN_DEL) before its next op, which fails. */
  memset(g.imem, 0x5a, WIN);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &d, 1, 10000), HIXL_FAILED);
  CU_ASSERT_EQUAL(tu_check_byte(g.imem, WIN, 0x5a), -1);
  CU_ASSERT_EQUAL(window_key(g.i, (uintptr_t)x), 0);
  /* (A closed window's key failing at the NIC: test_revoke; the same close.) */
  grant(g.i_name, r, 1, false);
  tu_free_mem(x, WIN);
}

/* A target cannot grow an initiator's windows without bound: a WIN_ADD past
 * ERDMA_WINS_MAX ends the link (white-box: the link holds that many already). */
static void test_wins_bounded(void) {
  struct erdma_link *l = rdma_link_of(g.i);
  CU_ASSERT_PTR_NOT_NULL_FATAL(l);
  uint8_t b[WIRE_HDR_LEN + 4 + WIRE_WIN_LEN];
  const uint64_t r[1][2] = {{at(0), 4096}};
  const uint32_t key[1] = {0x1234};
  struct wire_hdr h;
  struct wire_msg m;
  CU_ASSERT_FATAL(wire_put_wins(b, sizeof(b), r, key, 1) > 0);
  CU_ASSERT_FATAL(wire_parse_hdr(b, &h) == WIRE_OK && wire_decode(&h, b + WIRE_HDR_LEN, &m) == WIRE_OK);
  struct erdma_win *full = calloc(ERDMA_WINS_MAX, sizeof(*full));
  CU_ASSERT_PTR_NOT_NULL_FATAL(full);
  pthread_mutex_lock(&g.i->lock);
  struct conn *c = l->conn;
  erdma_rwins_free(&l->rwins);
  l->rwins.main = (struct erdma_wins){full, ERDMA_WINS_MAX, ERDMA_WINS_MAX};
  erdma_win_frame(c, &m);
  bool dead = c->dead;
  pthread_mutex_unlock(&g.i->lock);
  CU_ASSERT_TRUE(dead);
  TU_ASSERT_OK(HixlEngineConnect(g.i, g.t_name, 10000));
}

/* An op that needs more work requests than a send queue holds (one per window it spans)
 * is refused before any is posted, and the link stays: posted, it ran past the QP's
 * depth (ENOMEM from the provider, the link reset with that alone as its reason).
 * White-box: I's device is said to hold 8 work requests a QP (rxe retires them as they
 * are posted, so its real depth is not reached at will), and I's window over F is cut
 * into 16 with the window's own key. */
static void test_pieces_past_queue(void) {
  const uint64_t f[1][2] = {{at(F_OFF), WIN}};
  struct erdma_engine *x = engine_xe(g.i, XPORT_RDMA);
  CU_ASSERT_PTR_NOT_NULL_FATAL(x);
  grant(g.i_name, f, 1, true);
  read_by_rdma(g.tmem + F_OFF, 6, "READ of the granted range"); /* I has read its WIN_ADD */
  uint32_t key = window_key(g.i, at(F_OFF)), qpn = info(g.i).qpn;
  CU_ASSERT_NOT_EQUAL_FATAL(key, 0);
  for (uint64_t k = 0; k < 16; k++) forge(g.i, at(F_OFF) + k * (WIN / 16), WIN / 16, key);
  pthread_mutex_lock(&g.i->lock);
  uint32_t depth = x->dev[0].max_qp_wr;
  x->dev[0].max_qp_wr = 8;
  pthread_mutex_unlock(&g.i->lock);
  tu_fill(g.tmem + F_OFF, WIN, 7);
  memset(g.imem, 0x5a, WIN);
  HixlTransferOpDesc d = op(g.imem, 0, F_OFF, WIN);
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &d, 1, 10000), HIXL_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "spans 16 of the peer's memory windows"));
  CU_ASSERT_EQUAL(tu_check_byte(g.imem, WIN, 0x5a), -1);
  CU_ASSERT_EQUAL(info(g.i).qpn, qpn);
  /* Behind a narrow op in one call: the narrow one is posted unsignaled (more is queued
   * behind it) and the refusal posts nothing after it. A signaled zero-length WRITE
   * ends it at once; without it the call waited for its deadline, which reset the link. */
  HixlTransferOpDesc two[2] = {op(g.imem, 0, F_OFF, WIN / 16), op(g.imem, 0, F_OFF, WIN)};
  TU_ASSERT_STATUS(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, two, 2, 3000), HIXL_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "spans 16 of the peer's memory windows"));
  /* The same link; half of it (8 windows) fits. */
  CU_ASSERT_EQUAL(info(g.i).qpn, qpn);
  d.len = WIN / 2;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.t_name, HIXL_READ, &d, 1, 10000));
  TU_ASSERT_SAME(g.imem, g.tmem + F_OFF, WIN / 2, "READ over 8 windows");
  pthread_mutex_lock(&g.i->lock);
  x->dev[0].max_qp_wr = depth;
  pthread_mutex_unlock(&g.i->lock);
  forge(g.i, at(F_OFF), WIN, key); /* the window the target sent, which its revoke names */
  grant(g.i_name, f, 1, false);
}

/* Every window closes with its link, and the engine's count comes back to what the
 * grants still hold open (none here once revoked). */
static void test_windows_drain(void) {
  const uint64_t r[3][2] = {{at(A_OFF), WIN}, {at(A_OFF + WIN), WIN}, {at(A_OFF + 4 * WIN), 4096}};
  grant(g.i_name, r, 3, false);
  CU_ASSERT_EQUAL(wstats().open, 0);
  struct hixl_window_stats s = wstats();
  CU_ASSERT_EQUAL(s.bound, s.closed);
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;
  if (!tu_key_file() || setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) != 0) return 1;
  bool required = getenv("HIXL_REQUIRE_RDMA") != NULL;
  if (!rdma_available() || !getenv("HIXL_TEST_IP")) {
    fprintf(stderr, "test_rdma_scope: %s\n",
            !rdma_available() ? "no RDMA device on this host" : "HIXL_TEST_IP does not name an RDMA address");
    return required ? 1 : 77; /* skipped here; run for real in the soft-RoCE guest */
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("scoped memory over rdma", suite_init, suite_cleanup);
  CU_add_test(s, "the device asked whether it holds a window's key to the window", test_mw_bounds);
  CU_add_test(s, "no key advertised; scoping fixed once registered", test_link_and_keys);
  CU_add_test(s, "nothing granted: refused by the target's CPU, untouched", test_nothing_granted);
  CU_add_test(s, "granted: READ and WRITE by RDMA inside windows", test_granted_by_rdma);
  CU_add_test(s, "forged keys fail at the NIC, untouched", test_forged_keys);
  CU_add_test(s, "revoke closes the window at once", test_revoke);
  CU_add_test(s, "a run shares a window; revoking part of it", test_run_and_partial_revoke);
  CU_add_test(s, "a range of a run granted again splits it", test_shared_range_splits);
  CU_add_test(s, "two runs overlapping in part: shared bytes held until both are revoked",
              test_overlapping_runs);
  CU_add_test(s, "a registration withdrawn closes its windows", test_dereg_closes);
  CU_add_test(s, "a WIN_ADD past the bound ends the link", test_wins_bounded);
  CU_add_test(s, "a window's MR: its own, or the registration's", test_window_mr);
  CU_add_test(s, "more windows in an op than a send queue holds: refused, the link stays",
              test_pieces_past_queue);
  CU_add_test(s, "windows closed: bound == closed", test_windows_drain);
  return tu_run_registry();
}
