/* test_rdma_wins: an initiator's RDMA windows (transport/rdma/rdma_wins.h), what its
 * target tells it by WIN_ADD and WIN_DEL, driven here as erdma_win_frame drives them,
 * without a device:
 *   - a one-window WIN_ADD or WIN_DEL costs about what it holds, not the windows the link
 *     holds: with 2^20 held, 1,000 of each (and WIN_DELs of windows never held, and
 *     WIN_ADDs replacing one) stay under a bound the whole vector's rebuild per frame
 *     passes a thousandfold (moves counted by erdma_rwins_steps, not timed);
 *   - a WIN_ADD over the holes 100,000 windows dropped left, again and again, steps
 *     over them a few times, then not again (main is rebuilt);
 *   - against a plain reference (a map of every address unit to its window), after
 *     random WIN_ADDs (windows alone, adjacent, overlapping each other: refused,
 *     replacing those held, thousands at once), WIN_DELs (held, never held, a length
 *     off): the same windows found at every address tried, the same pieces and cover
 *     for random ranges, the same count;
 *   - a device's completion queue (struct rdma_cqb in transport/rdma/rdma.h), counted:
 *     QPs that all fail at once, each completing every work request it holds, never
 *     put more completions in it than it holds (four initiator QPs of 1,024 WRs
 *     overran the fixed 4,096 entries before). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "transport/rdma/rdma.h"
#include "transport/rdma/rdma_wins.h"

#define HELD   (ERDMA_WINS_MAX - 4096) /* windows held: room left for the WIN_ADDs below */
#define SLOT   0x2000ull               /* window i of HELD at 0x10000000 + i * SLOT, SLOT / 2 long */
#define BASE0  0x10000000ull
#define ROUNDS 1000

static struct erdma_win win(uint64_t addr, uint64_t len, uint32_t key) {
  return (struct erdma_win){.addr = addr, .len = len, .rkey = key};
}

/* One WIN_ADD of a single window. */
static int add1(struct erdma_rwins *w, uint64_t addr, uint64_t len, uint32_t key) {
  struct erdma_win x = win(addr, len, key);
  return erdma_rwins_add(w, &x, 1);
}

/* w holds HELD windows, each SLOT / 2 long with a gap as long after it: one WIN_ADD per
 * WIRE_MAX_WINS-sized frame would take long on the code before; one call here. */
static void hold_many(struct erdma_rwins *w) {
  struct erdma_win *v = malloc(HELD * sizeof(*v));
  CU_ASSERT_PTR_NOT_NULL_FATAL(v);
  for (size_t i = 0; i < HELD; i++) v[i] = win(BASE0 + i * SLOT, SLOT / 2, (uint32_t)i + 1);
  CU_ASSERT_EQUAL_FATAL(erdma_rwins_add(w, v, HELD), 0);
  free(v);
  CU_ASSERT_EQUAL_FATAL(erdma_rwins_count(w), HELD);
}

/* With 2^20 windows held, one-window frames: each costs its own moves (ERDMA_RWINS_SIDE
 * at most) and a share of the merges, not the 2^20 windows (the code before rebuilt the
 * vector at each WIN_ADD and compacted it at each WIN_DEL, taken or not: 28 ms a frame). */
static void test_small_frames(void) {
  struct erdma_rwins w = {0};
  uint64_t rng = 7;
  hold_many(&w);
  for (int i = 0; i < 600; i++) /* windows already added one at a time: the merges come sooner */
    CU_ASSERT_EQUAL(add1(&w, BASE0 + (tu_rand(&rng) % HELD) * SLOT + SLOT / 2, 16, 1), 0);
  size_t held = erdma_rwins_count(&w), frames = 0;
  erdma_rwins_steps = 0;
  for (int r = 0; r < ROUNDS; r++) {
    uint64_t i = tu_rand(&rng) % HELD, gap = BASE0 + i * SLOT + SLOT / 2 + 64;
    held += erdma_rwins_find(&w, gap) == NULL;
    CU_ASSERT_EQUAL(add1(&w, gap, 32, 0x100000u + (uint32_t)r), 0); /* a new one in a gap */
    uint64_t j = tu_rand(&rng) % HELD;
    const struct erdma_win *x = erdma_rwins_find(&w, BASE0 + j * SLOT);
    bool had = x && x->addr == BASE0 + j * SLOT && x->len == SLOT / 2;
    CU_ASSERT_EQUAL(erdma_rwins_del(&w, BASE0 + j * SLOT, SLOT / 2), had); /* one held (or taken already) */
    CU_ASSERT_FALSE(erdma_rwins_del(&w, BASE0 + j * SLOT + 1, 1));         /* one never held */
    held -= had;
    frames += 3;
    if (r % 10 == 0) { /* a split told: a WIN_ADD replacing a held window */
      uint64_t k = tu_rand(&rng) % HELD;
      held += erdma_rwins_find(&w, BASE0 + k * SLOT) == NULL;
      CU_ASSERT_EQUAL(add1(&w, BASE0 + k * SLOT, SLOT / 4, 0x200000u + (uint32_t)r), 0);
      x = erdma_rwins_find(&w, BASE0 + k * SLOT + SLOT / 4 - 1);
      CU_ASSERT_TRUE(x && x->rkey == 0x200000u + (uint32_t)r);
      CU_ASSERT_PTR_NULL(erdma_rwins_find(&w, BASE0 + k * SLOT + SLOT / 4));
      frames++;
    }
    x = erdma_rwins_find(&w, gap + 31);
    CU_ASSERT_TRUE(x && x->addr == gap && x->rkey == 0x100000u + (uint32_t)r);
    if (r % 100 == 0) { /* and a WIN_DEL of the one just added */
      CU_ASSERT_TRUE(erdma_rwins_del(&w, gap, 32));
      CU_ASSERT_PTR_NULL(erdma_rwins_find(&w, gap));
      held--;
      frames++;
    }
  }
  size_t steps = erdma_rwins_steps;
  CU_ASSERT_EQUAL(erdma_rwins_count(&w), held);
  /* Per frame: at most ERDMA_RWINS_SIDE moves in side, and a share of the merges (2^20
   * for every ERDMA_RWINS_SIDE windows added): 4 * ERDMA_RWINS_SIDE is room enough. */
  size_t bound = frames * 4 * ERDMA_RWINS_SIDE;
  CU_ASSERT_TRUE(steps <= bound);
  if (steps > bound)
    fprintf(stderr, "  %zu steps for %zu one-window frames (bound %zu)\n", steps, frames, bound);
  erdma_rwins_free(&w);
}

/* Holes under a window added and taken again and again: stepped over a few times at
 * most, then main is rebuilt without them. */
static void test_holes_stepped_over(void) {
  struct erdma_rwins w = {0};
  hold_many(&w);
  const size_t gone = 100000; /* the first ones, dropped by a window over them, taken again */
  CU_ASSERT_EQUAL(add1(&w, BASE0, gone * SLOT, 9), 0);
  CU_ASSERT_TRUE(erdma_rwins_del(&w, BASE0, gone * SLOT));
  CU_ASSERT_EQUAL(erdma_rwins_count(&w), HELD - gone);
  erdma_rwins_steps = 0;
  for (int r = 0; r < ROUNDS; r++) {
    CU_ASSERT_EQUAL(add1(&w, BASE0, gone * SLOT, 9), 0);
    CU_ASSERT_TRUE(erdma_rwins_del(&w, BASE0, gone * SLOT));
  }
  size_t steps = erdma_rwins_steps, bound = 2 * (size_t)HELD + 2 * ROUNDS * 4 * ERDMA_RWINS_SIDE;
  CU_ASSERT_TRUE(steps <= bound);
  if (steps > bound) fprintf(stderr, "  %zu steps over holes (bound %zu)\n", steps, bound);
  CU_ASSERT_EQUAL(erdma_rwins_count(&w), HELD - gone);
  CU_ASSERT_PTR_NULL(erdma_rwins_find(&w, BASE0));
  const struct erdma_win *x = erdma_rwins_find(&w, BASE0 + gone * SLOT + 1);
  CU_ASSERT_PTR_NOT_NULL(x);
  if (x) CU_ASSERT_EQUAL(x->rkey, gone + 1);
  erdma_rwins_free(&w);
}

/* ---- the reference: every unit of the space, the window over it ---- */

#define UNIT  64ull
#define UNITS (1u << 14)
#define BASE  0x7f0000000000ull

static uint32_t owner[UNITS];             /* 1 + the unit the window over it starts at; 0: none */
static uint32_t rlen[UNITS], rkey[UNITS]; /* the window starting at a unit: its length in units, its key */
static uint8_t mark[UNITS];               /* a frame's own units (overlap inside one WIN_ADD) */
static size_t rcount;

static bool ref_find(uint64_t addr, struct erdma_win *out) {
  if (addr < BASE || addr >= BASE + UNITS * UNIT || !owner[(addr - BASE) / UNIT]) return false;
  uint32_t s = owner[(addr - BASE) / UNIT] - 1;
  *out = win(BASE + s * UNIT, rlen[s] * UNIT, rkey[s]);
  return true;
}

static void ref_forget(uint32_t s) {
  for (uint32_t u = s; u < s + rlen[s]; u++) owner[u] = 0;
  rcount--;
}

static int ref_add(const struct erdma_win *add, size_t n) {
  int rc = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t u = (add[i].addr - BASE) / UNIT; u < (add[i].addr + add[i].len - BASE) / UNIT; u++)
      rc = mark[u]++ ? -2 : rc;
  memset(mark, 0, sizeof(mark));
  if (rc) return rc;
  for (size_t i = 0; i < n; i++)
    for (uint64_t u = (add[i].addr - BASE) / UNIT; u < (add[i].addr + add[i].len - BASE) / UNIT; u++)
      if (owner[u]) ref_forget(owner[u] - 1);
  for (size_t i = 0; i < n; i++) {
    uint32_t s = (uint32_t)((add[i].addr - BASE) / UNIT);
    rlen[s] = (uint32_t)(add[i].len / UNIT);
    rkey[s] = add[i].rkey;
    for (uint32_t u = s; u < s + rlen[s]; u++) owner[u] = s + 1;
    rcount++;
  }
  return 0;
}

static bool ref_del(uint64_t addr, uint64_t len) {
  struct erdma_win x;
  if (!ref_find(addr, &x) || x.addr != addr || x.len != len) return false;
  ref_forget((uint32_t)((addr - BASE) / UNIT));
  return true;
}

static uint32_t ref_pieces(uint64_t addr, uint64_t len) {
  uint64_t pos = addr, end = addr + len;
  uint32_t k = 0;
  struct erdma_win x;
  for (; pos < end; k++) {
    if (!ref_find(pos, &x)) return 0;
    pos = x.addr + x.len;
  }
  return k;
}

static void same_at(const struct erdma_rwins *w, uint64_t addr) {
  struct erdma_win want;
  bool has = ref_find(addr, &want);
  const struct erdma_win *got = erdma_rwins_find(w, addr);
  CU_ASSERT_EQUAL(got != NULL, has);
  if (got && has) {
    CU_ASSERT_EQUAL(got->addr, want.addr);
    CU_ASSERT_EQUAL(got->len, want.len);
    CU_ASSERT_EQUAL(got->rkey, want.rkey);
  }
}

static uint64_t any_addr(uint64_t *rng) { /* inside the space mostly, a unit either side too */
  return BASE - UNIT + tu_rand(rng) % ((UNITS + 2) * UNIT);
}

/* A WIN_ADD: a few windows anywhere (they may overlap each other: refused), or
 * hundreds to thousands side by side (adjacent ones among them), past what side holds. */
static size_t frame_add(uint64_t *rng, struct erdma_win *f) {
  size_t n = 0;
  if (tu_rand(rng) % 20 == 0) {
    uint64_t u = tu_rand(rng) % UNITS, want = 600 + tu_rand(rng) % 1400;
    for (; n < want; n++) {
      u += tu_rand(rng) % 3;
      uint64_t len = 1 + tu_rand(rng) % 4;
      if (u + len > UNITS) break;
      f[n] = win(BASE + u * UNIT, len * UNIT, (uint32_t)tu_rand(rng));
      u += len;
    }
  } else {
    n = 1 + tu_rand(rng) % 4;
    for (size_t i = 0; i < n; i++) {
      uint64_t u = tu_rand(rng) % (UNITS - 8), len = 1 + tu_rand(rng) % 8;
      f[i] = win(BASE + u * UNIT, len * UNIT, (uint32_t)tu_rand(rng));
    }
  }
  /* shuffled: a frame need not come sorted */
  for (size_t i = n; i > 1; i--) {
    size_t j = tu_rand(rng) % i;
    struct erdma_win t = f[i - 1];
    f[i - 1] = f[j];
    f[j] = t;
  }
  return n;
}

static void test_differential(void) {
  struct erdma_rwins w = {0};
  uint64_t rng = 42;
  static struct erdma_win f[2048], copy[2048];
  memset(owner, 0, sizeof(owner));
  rcount = 0;
  size_t refused = 0, replaced_runs = 0, bulk = 0, dels = 0;
  for (int op = 0; op < 20000; op++) {
    if (tu_rand(&rng) % 2) {
      size_t n = frame_add(&rng, f);
      memcpy(copy, f, n * sizeof(*f));
      size_t before = rcount;
      int want = ref_add(copy, n);
      CU_ASSERT_EQUAL(erdma_rwins_add(&w, f, n), want);
      refused += want != 0;
      replaced_runs += want == 0 && rcount < before + n;
      bulk += n > ERDMA_RWINS_SIDE;
    } else {
      for (uint64_t k = 1 + tu_rand(&rng) % 4; k > 0; k--) {
        uint64_t addr = any_addr(&rng), len = UNIT * (1 + tu_rand(&rng) % 8);
        struct erdma_win x;
        int how = (int)(tu_rand(&rng) % 4);
        if (how < 2 && ref_find(addr, &x)) /* one held */
          addr = x.addr, len = x.len;
        else if (how == 2 && ref_find(addr, &x)) /* one held, a unit too long */
          addr = x.addr, len = x.len + UNIT;
        bool want = ref_del(addr, len);
        CU_ASSERT_EQUAL(erdma_rwins_del(&w, addr, len), want);
        dels += want;
      }
    }
    CU_ASSERT_EQUAL(erdma_rwins_count(&w), rcount);
    for (int p = 0; p < 16; p++) same_at(&w, any_addr(&rng));
    for (int p = 0; p < 4; p++) {
      uint64_t addr = any_addr(&rng), len = tu_rand(&rng) % (12 * UNIT);
      uint32_t want = ref_pieces(addr, len);
      CU_ASSERT_EQUAL(erdma_rwins_pieces(&w, addr, len), want);
      CU_ASSERT_EQUAL(erdma_rwins_cover(&w, addr, len), len > 0 && want > 0);
    }
    if (op % 1000 == 0) /* every window, at its first and last byte and just past it */
      for (uint32_t u = 0; u < UNITS; u++) {
        if (!owner[u] || owner[u] - 1 != u) continue;
        same_at(&w, BASE + u * UNIT);
        same_at(&w, BASE + (u + rlen[u]) * UNIT - 1);
        same_at(&w, BASE + (u + rlen[u]) * UNIT);
      }
  }
  /* the paths were taken: refusals, replacements, merges of thousands, WIN_DELs */
  CU_ASSERT_TRUE(refused > 0 && replaced_runs > 0 && bulk > 0 && dels > 0);
  erdma_rwins_free(&w);
  CU_ASSERT_EQUAL(erdma_rwins_count(&w), 0);
}

/* A CQ's entries against a model of what is in it: live QPs post up to their depth,
 * succeed (one completion for the signaled one), fail (every WR they hold completes,
 * flushed, and they are destroyed), and the progress thread polls (the CQ found empty
 * frees what destroyed QPs held). In no state does the CQ hold more than its entries. */
#define CQ_QPS   64
#define CQ_DEPTH (1024 + RDMA_RECV_DEPTH) /* a QP's send and receive depths */
static void test_cq_bound(void) {
  /* RDMA_CQ_FIRST at first (less where the device allows less), then grown as QPs
   * come: twice, or what they need, up to the device's max_cqe, then no more */
  CU_ASSERT_EQUAL(rdma_cq_size(32767), RDMA_CQ_FIRST);   /* soft-RoCE */
  CU_ASSERT_EQUAL(rdma_cq_size(4194303), RDMA_CQ_FIRST); /* mlx5 */
  CU_ASSERT_EQUAL(rdma_cq_size(4000), 4000);
  CU_ASSERT_EQUAL(rdma_cq_size(0), 1);
  CU_ASSERT_EQUAL(rdma_cq_grow(8191, 8191 + CQ_DEPTH, 32767), 16382);
  CU_ASSERT_EQUAL(rdma_cq_grow(16384, 16384 + CQ_DEPTH, 32767), 32767);
  CU_ASSERT_EQUAL(rdma_cq_grow(32767, 32767 + CQ_DEPTH, 32767), 0);
  CU_ASSERT_EQUAL(rdma_cq_grow(4096, 40000, 4194303), 40000);
  CU_ASSERT_EQUAL(rdma_cq_grow(8192, 8193, 0), 0);
  /* the fixed 4,096 entries of before: a fourth QP of 1,040 is refused, not let overrun */
  struct rdma_cqb b = {.cap = 4096};
  for (int i = 0; i < 3; i++) CU_ASSERT_TRUE(rdma_cqb_take(&b, CQ_DEPTH));
  CU_ASSERT_FALSE(rdma_cqb_take(&b, CQ_DEPTH));
  CU_ASSERT_EQUAL(b.held, 3 * CQ_DEPTH);
  /* one destroyed: its room waits for the CQ to be found empty */
  rdma_cqb_give(&b, CQ_DEPTH, true);
  CU_ASSERT_FALSE(rdma_cqb_take(&b, CQ_DEPTH));
  rdma_cqb_empty(&b, CQ_DEPTH);
  CU_ASSERT_TRUE(rdma_cqb_take(&b, CQ_DEPTH));
  /* one never posted on: at once */
  rdma_cqb_give(&b, CQ_DEPTH, false);
  CU_ASSERT_TRUE(rdma_cqb_take(&b, CQ_DEPTH));

  /* random: 64 would-be QPs on a CQ that starts at RDMA_CQ_FIRST and grows up to
   * soft-RoCE's max_cqe (31 fit then) */
  b = (struct rdma_cqb){.cap = rdma_cq_size(32767)};
  uint32_t held[CQ_QPS] = {0}; /* WRs a live QP holds */
  bool live[CQ_QPS] = {false};
  uint64_t in_cq = 0, max_cq = 0, rng = 11, refused = 0, flushed = 0, emptied = 0;
  for (int op = 0; op < 200000; op++) {
    uint32_t q = (uint32_t)(tu_rand(&rng) % CQ_QPS);
    switch (tu_rand(&rng) % 6) {
    case 0: /* a link: a QP, where there is room */
      if (live[q]) break;
      if (rdma_cqb_take(&b, CQ_DEPTH)) {
        live[q] = true;
      } else {
        uint32_t want = rdma_cq_grow(b.cap, (uint64_t)b.held + b.dead + CQ_DEPTH, 32767);
        if (want) { /* as qp_new_on: resized, then taken */
          CU_ASSERT_TRUE(want > b.cap);
          b.cap = want;
          live[q] = rdma_cqb_take(&b, CQ_DEPTH);
          CU_ASSERT_TRUE(live[q]);
        } else {
          refused++;
        }
      }
      break;
    case 1: /* posts, as far as the queues go */
    case 2:
      if (live[q]) held[q] = CQ_DEPTH - (uint32_t)(tu_rand(&rng) % 4);
      break;
    case 3: /* a signaled completion ends what it holds */
      if (live[q] && held[q]) {
        in_cq++;
        held[q] = 0;
      }
      break;
    case 4: /* fails: every WR completes, flushed; then destroyed */
      if (!live[q]) break;
      in_cq += held[q];
      flushed += held[q];
      held[q] = 0;
      live[q] = false;
      rdma_cqb_give(&b, CQ_DEPTH, true);
      break;
    case 5: { /* the progress thread polls (now and then): some, or all */
      if (tu_rand(&rng) % 16) break;
      uint32_t dead = b.dead;
      uint64_t take = tu_rand(&rng) % 3 == 0 ? in_cq : in_cq / 2;
      in_cq -= take;
      if (in_cq == 0) {
        rdma_cqb_empty(&b, dead);
        emptied++;
      }
      break;
    }
    }
    if (in_cq > max_cq) max_cq = in_cq;
    CU_ASSERT_TRUE_FATAL(in_cq <= b.cap);
    CU_ASSERT_TRUE_FATAL((uint64_t)b.held + b.dead <= b.cap);
  }
  CU_ASSERT_TRUE(refused > 0 && flushed > 0 && emptied > 0);
  CU_ASSERT_TRUE(b.cap > 32767 - CQ_DEPTH && b.cap <= 32767); /* grown to the device's bound */
  CU_ASSERT_TRUE(max_cq > b.cap / 2);                         /* it came near */
}

int main(void) {
  static CU_TestInfo tests[] = {
      {"one-window WIN_ADD / WIN_DEL: not the windows held", test_small_frames},
      {"holes a WIN_ADD steps over: a few times, then rebuilt", test_holes_stepped_over},
      {"random frames: the same answers as a reference", test_differential},
      {"a CQ's entries: QPs failing at once never overrun it", test_cq_bound},
      CU_TEST_INFO_NULL,
  };
  CU_SuiteInfo suites[] = {{"rdma_wins", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_rdma_wins", suites);
}
