/* test_shm_map: memory a same-host peer maps (HixlEngineAllocMem + SCM_RIGHTS).
 *  - a target engine in a child (an agent doing what the test asks: a link to itself
 *    is refused, issue 27): its AllocMem regions are mapped into this process's
 *    initiator at Connect and when allocated later (after one round trip); WRITE and
 *    READ of 1 B to 64 MiB at offsets, 1024-op batches and async requests move by
 *    memcpy (map_ops counts them) and arrive byte for byte (the agent checks); memory
 *    the target only registered, after Connect, keeps process_vm_* and is refused
 *    once deregistered; two engines of this process map nothing (tcp);
 *  - FreeMem: the mapping here is gone when it returns (/proc/self/maps); ops into the
 *    freed range fail; FreeMem while an async copy into the region runs returns after
 *    the copy let go (the copy ends SUCCESS or FAILED, never touches unmapped pages:
 *    this suite also runs under ASan); Disconnect unmaps, Connect maps again;
 *  - a target in a child process: mapped, byte-checked by the child; a process forked
 *    here afterwards holds none of its pages (MADV_DONTFORK); the child's FreeMem
 *    takes the mapping out of this process; a killed child: ops FAILED, unmapped
 *    (while it lived, the link's peer_life named its hixl-shm-life thread);
 *  - refusals: a target running as another user does not hand its memory to this
 *    process (SO_PEERCRED; data still moves by process_vm_*); an initiator that does
 *    not answer SHM_UNMAP (stopped) is cut off when FreeMem's timeout passes, and so
 *    are two of them (cutting the first does not end the walk over the links). */
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "test_util.h"

#define KiB          ((size_t)1 << 10)
#define MiB          ((size_t)1 << 20)
#define BIG          (64 * MiB)
#define XFER_TIMEOUT 30000
#define READY_MS     10000
#define INIT_FLAG    "--shm-map-initiator-child"
#define AGENT_FLAG   "--shm-map-target-agent"
#define USER_A       65501

static struct {
  tu_child agent;          /* the target: an engine in a child (agent_main) */
  HixlEngine *i;           /* the initiator, this process */
  char tname[TU_ADDR_LEN]; /* the target's address */
  uint64_t r1;             /* the target's AllocMem region, BIG bytes, in the agent */
  unsigned char *loc;      /* 2 x BIG, registered with the initiator */
  HixlMemHandle loc_h;
} g;

static struct hixl_link_info link_of(HixlEngine *e, const char *remote) {
  struct hixl_link_info li;
  memset(&li, 0, sizeof(li));
  TU_ASSERT_OK(hixl_engine_link_info(e, remote, &li));
  return li;
}

static HixlStatus xfer(HixlTransferOp op, void *local, uint64_t remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = remote, .len = len};
  return HixlEngineTransferSync(g.i, g.tname, op, &d, 1, XFER_TIMEOUT);
}

/* The table brought up to date by one round trip: SHM_MAP frames the target queued
 * before it have been taken. */
static void round_trip(HixlEngine *e, const char *remote) {
  struct hixl_remote_mem *m = NULL;
  size_t n = 0;
  TU_ASSERT_OK(hixl_engine_remote_mems(e, remote, 5000, &m, &n));
  free(m);
}

/* ---------------------------------------------------------------- a target agent */

/* The target engine of the first suite runs in a child (a link to itself is refused,
 * issue 27), re-executed from this program, and does what the test asks on its
 * command pipe: allocate, free, register, deregister, fill with a pattern, check a
 * pattern, hash a range. */
enum agent_op { A_ALLOC = 1, A_FREE, A_REG, A_DEREG, A_FILL, A_CHECK, A_HASH };

struct agent_cmd {
  uint32_t op;
  uint64_t addr, len, seed;
};

#define AGENT_REGIONS 16

struct agent_region {
  unsigned char *base; /* NULL: a free slot */
  size_t len;
  HixlMemHandle h;
  bool alloc, live; /* HixlEngineAllocMem's; still allocated or registered */
};

/* FNV-1a over len bytes: the agent's hash and the test's must agree. */
static uint64_t hash_of(const unsigned char *p, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* argv: flag port. Reply on fd 3 (int64 per command; a ready byte first), commands
 * on fd 4 until it closes. */
static int agent_main(int argc, char **argv) {
  struct agent_region reg[AGENT_REGIONS];
  struct agent_cmd cmd;
  char name[TU_ADDR_LEN];
  int rc = 0;
  memset(reg, 0, sizeof(reg));
  if (argc != 3) return 2;
  HixlEngine *e = tu_engine_start_with(tu_addr(name, sizeof(name), (uint16_t)atoi(argv[2])), "shm");
  if (!e || tu_write_all(3, "r", 1) != 0) return 3;
  while (tu_read_all(4, &cmd, sizeof(cmd)) == 0) {
    int64_t reply = -2;
    int k = -1; /* the region holding [addr, addr + len) */
    for (int i = 0; i < AGENT_REGIONS && k < 0; i++)
      if (reg[i].base && cmd.addr >= (uintptr_t)reg[i].base && cmd.len <= reg[i].len &&
          cmd.addr - (uintptr_t)reg[i].base <= reg[i].len - cmd.len)
        k = i;
    unsigned char *at = (unsigned char *)(uintptr_t)cmd.addr;
    if (cmd.op == A_ALLOC || cmd.op == A_REG) {
      for (k = 0; k < AGENT_REGIONS && reg[k].base; k++) {
      }
      void *p = NULL;
      HixlStatus st = HIXL_FAILED;
      if (k < AGENT_REGIONS && cmd.op == A_ALLOC) {
        st = HixlEngineAllocMem(e, cmd.len, &p, &reg[k].h);
      } else if (k < AGENT_REGIONS && (p = tu_alloc_mem(cmd.len, false))) {
        reg[k].h = tu_register(e, p, cmd.len);
        st = reg[k].h ? HIXL_SUCCESS : HIXL_FAILED;
      }
      if (st == HIXL_SUCCESS) {
        reg[k] = (struct agent_region){p, cmd.len, reg[k].h, cmd.op == A_ALLOC, true};
        reply = (int64_t)(uintptr_t)p;
      }
    } else if (k < 0) {
      reply = -3;
    } else if (cmd.op == A_FREE || cmd.op == A_DEREG) {
      reply = !reg[k].live   ? -4
              : reg[k].alloc ? (int64_t)HixlEngineFreeMem(e, reg[k].h)
                             : (int64_t)HixlEngineDeregisterMem(e, reg[k].h);
      if (reply == HIXL_SUCCESS) reg[k].live = false;
      if (reply == HIXL_SUCCESS && reg[k].alloc) reg[k].base = NULL; /* gone */
    } else if (cmd.op == A_FILL) {
      tu_fill(at, cmd.len, cmd.seed);
      reply = 0;
    } else if (cmd.op == A_CHECK) {
      reply = tu_check_pattern(at, cmd.len, cmd.seed);
    } else if (cmd.op == A_HASH) {
      reply = (int64_t)hash_of(at, cmd.len);
    }
    if (tu_write_all(3, &reply, sizeof(reply)) != 0) break;
  }
  for (int i = 0; i < AGENT_REGIONS; i++)
    if (reg[i].live && reg[i].alloc && HixlEngineFreeMem(e, reg[i].h) != HIXL_SUCCESS) rc = 4;
  if (HixlEngineDestroy(e) != HIXL_SUCCESS) rc = 5;
  return rc;
}

static int exec_self(void *arg, int ready_fd, int ctl_fd) {
  char **argv = arg;
  (void)ready_fd, (void)ctl_fd;
  execv(argv[0], argv);
  return 127;
}

static int64_t agent(uint32_t op, uint64_t addr, uint64_t len, uint64_t seed) {
  struct agent_cmd cmd = {.op = op, .addr = addr, .len = len, .seed = seed};
  int64_t reply = -100;
  if (tu_child_write(&g.agent, &cmd, sizeof(cmd)) != 0 ||
      tu_child_read(&g.agent, &reply, sizeof(reply), 30000) != 0)
    tu_fail(__FILE__, __LINE__, "agent command %u: no reply", op);
  return reply;
}

/* ---------------------------------------------------------------- a target agent's memory */

static int one_init(void) {
  uint16_t port = tu_free_port();
  char p[8], ready;
  snprintf(p, sizeof(p), "%u", (unsigned)port);
  char *argv[] = {(char *)tu_self_exe(), AGENT_FLAG, p, NULL};
  tu_addr(g.tname, sizeof(g.tname), port);
  if (tu_child_start(&g.agent, exec_self, argv) != 0 || tu_child_read(&g.agent, &ready, 1, READY_MS) != 0)
    return -1;
  int64_t r1 = agent(A_ALLOC, 0, BIG, 0);
  if (r1 <= 0) return -1;
  g.r1 = (uint64_t)r1;
  g.i = tu_engine_start_with(tu_ip(), "shm");
  if (!g.i || !(g.loc = tu_alloc_mem(2 * BIG, false)) || !(g.loc_h = tu_register(g.i, g.loc, 2 * BIG)))
    return -1;
  return HixlEngineConnect(g.i, g.tname, 5000) == HIXL_SUCCESS ? 0 : -1;
}

static int one_cleanup(void) {
  int rc = 0;
  if (g.i && HixlEngineDestroy(g.i) != HIXL_SUCCESS) rc = -1;
  if (g.agent.pid > 0) { /* frees r1 */
    int ws = tu_child_stop(&g.agent, 10000);
    if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) rc = -1;
  }
  if (g.loc) tu_free_mem(g.loc, 2 * BIG);
  memset(&g, 0, sizeof(g));
  return rc;
}

static void test_one_mapped(void) {
  struct hixl_link_info li = link_of(g.i, g.tname);
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)g.agent.pid);
  CU_ASSERT_EQUAL(li.mapped, 1);
  CU_ASSERT(li.mapped_bytes >= BIG);
  CU_ASSERT_EQUAL(li.map_ops, 0);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 1);           /* the initiator's */
  CU_ASSERT_EQUAL(tu_memfd_maps(g.agent.pid), 1); /* the target's own */
}

/* WRITE then READ back, sizes 1 B to 64 MiB at offsets, all by memcpy; the target
 * checks what landed, and the byte before it. */
static void test_one_sizes(void) {
  static const size_t lens[] = {1, 7, 4095, 4096, 65536 + 3, MiB, 16 * MiB + 5, BIG - 64, BIG};
  uint64_t ops0 = link_of(g.i, g.tname).map_ops, done = 0;
  for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
    size_t len = lens[k], roff = len == BIG ? 0 : (k * 4099) % (BIG - len), seed = 100 + k;
    unsigned char *src = g.loc + (len == BIG ? 0 : 5), *dst = g.loc + BIG;
    tu_fill(src, len, seed);
    if (roff > 0) CU_ASSERT_EQUAL(agent(A_FILL, g.r1 + roff - 1, 1, 999), 0);
    TU_ASSERT_OK(xfer(HIXL_WRITE, src, g.r1 + roff, len));
    CU_ASSERT_EQUAL(agent(A_CHECK, g.r1 + roff, len, seed), -1);
    if (roff > 0) CU_ASSERT_EQUAL(agent(A_CHECK, g.r1 + roff - 1, 1, 999), -1); /* nothing before */
    memset(dst, 0, len);
    TU_ASSERT_OK(xfer(HIXL_READ, dst, g.r1 + roff, len));
    TU_ASSERT_PATTERN(dst, len, seed, "initiator memory after a mapped READ");
    done += 2;
  }
  CU_ASSERT(link_of(g.i, g.tname).map_ops >= ops0 + done); /* large ops go in pieces */
}

/* 1024 scattered 4 KiB ops per call, WRITE then READ, remote order shuffled: the
 * target's whole range hashes to the ops' data in their slots and the fill between. */
static void test_one_batch(void) {
  enum { N = 1024, SLOT = 8 * 1024, OP = 4 * 1024 };
  static HixlTransferOpDesc d[N];
  uint64_t st = 77, ops0 = link_of(g.i, g.tname).map_ops;
  uint32_t slot[N];
  unsigned char *want = tu_alloc_mem((size_t)N * SLOT, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(want);
  for (uint32_t k = 0; k < N; k++) slot[k] = k;
  for (uint32_t k = N - 1; k > 0; k--) {
    uint32_t j = (uint32_t)(tu_rand(&st) % (k + 1)), t = slot[k];
    slot[k] = slot[j], slot[j] = t;
  }
  tu_fill(g.loc, (size_t)N * OP, 31);
  CU_ASSERT_EQUAL(agent(A_FILL, g.r1, (size_t)N * SLOT, 32), 0);
  tu_fill(want, (size_t)N * SLOT, 32);
  for (uint32_t k = 0; k < N; k++) {
    d[k] = (HixlTransferOpDesc){(uintptr_t)(g.loc + k * OP), g.r1 + (uint64_t)slot[k] * SLOT, OP};
    memcpy(want + (size_t)slot[k] * SLOT, g.loc + (size_t)k * OP, OP);
  }
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_WRITE, d, N, XFER_TIMEOUT));
  CU_ASSERT_EQUAL((uint64_t)agent(A_HASH, g.r1, (size_t)N * SLOT, 0), hash_of(want, (size_t)N * SLOT));
  memset(g.loc + BIG, 0, (size_t)N * OP);
  for (uint32_t k = 0; k < N; k++) d[k].local_addr = (uintptr_t)(g.loc + BIG + (size_t)k * OP);
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_READ, d, N, XFER_TIMEOUT));
  TU_ASSERT_SAME(g.loc + BIG, g.loc, (size_t)N * OP, "the batch read back");
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).map_ops, ops0 + 2 * N);
  tu_free_mem(want, (size_t)N * SLOT);
}

/* A sync call's WRITE then READ of n scattered ops of len bytes at r1 + base and
 * behind; the target checks what landed (each op's slot) and what came back is
 * compared: the ops went by memcpy (map_ops), copied in the call (now_ops) or not. */
static void now_batch(HixlTransferOpDesc *d, size_t n, size_t len, uint64_t base, unsigned seed, bool now) {
  struct hixl_link_info li0 = link_of(g.i, g.tname);
  for (size_t k = 0; k < n; k++) {
    d[k] = (HixlTransferOpDesc){(uintptr_t)(g.loc + k * len), base + (n - 1 - k) * 2 * len, len};
    tu_fill(g.loc + k * len, len, seed + k);
  }
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_WRITE, d, n, XFER_TIMEOUT));
  for (size_t k = 0; k < n; k++) CU_ASSERT_EQUAL(agent(A_CHECK, d[k].remote_addr, len, seed + k), -1);
  memset(g.loc, 0, n * len);
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_READ, d, n, XFER_TIMEOUT));
  for (size_t k = 0; k < n; k++) TU_ASSERT_PATTERN(g.loc + k * len, len, seed + k, "an op read back");
  struct hixl_link_info li = link_of(g.i, g.tname);
  uint64_t pieces = 2 * n * ((len + MiB - 1) / MiB);
  CU_ASSERT_EQUAL(li.map_ops, li0.map_ops + pieces);
  CU_ASSERT_EQUAL(li.now_ops, li0.now_ops + (now ? 2 * n : 0));
}

/* Up to 16 ops of at most 1 MiB inside one mapping: copied in the call with no request
 * (eshm_copy_now); 17 ops, an op of 1 MiB + 1 (two pieces) or ops in two mappings go
 * by a request as before; all byte for byte. */
static void test_one_now(void) {
  HixlTransferOpDesc d[17];
  now_batch(d, 1, 4 * KiB, g.r1 + MiB, 110, true);
  now_batch(d, 16, 4 * KiB, g.r1 + MiB, 120, true);
  now_batch(d, 2, MiB, g.r1, 140, true);
  now_batch(d, 17, 4 * KiB, g.r1 + MiB, 150, false);
  now_batch(d, 1, MiB + 1, g.r1, 170, false);
  int64_t at = agent(A_ALLOC, 0, MiB, 0); /* a second mapping */
  CU_ASSERT_FATAL(at > 0);
  round_trip(g.i, g.tname);
  CU_ASSERT_EQUAL_FATAL(link_of(g.i, g.tname).mapped, 2);
  struct hixl_link_info li0 = link_of(g.i, g.tname);
  tu_fill(g.loc, 8 * KiB, 180);
  HixlTransferOpDesc two[2] = {{(uintptr_t)g.loc, g.r1 + 3 * MiB, 4 * KiB},
                               {(uintptr_t)(g.loc + 4 * KiB), (uint64_t)at + 4 * KiB, 4 * KiB}};
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_WRITE, two, 2, XFER_TIMEOUT));
  CU_ASSERT_EQUAL(agent(A_CHECK, g.r1 + 3 * MiB, 4 * KiB, 180), -1);
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).map_ops, li0.map_ops + 2);
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).now_ops, li0.now_ops);
  unsigned char want[4 * KiB];
  memcpy(want, g.loc + 4 * KiB, sizeof(want));
  memset(g.loc + 4 * KiB, 0, sizeof(want));
  two[0].len = 0; /* refused whole before anything moves */
  CU_ASSERT_EQUAL(HixlEngineTransferSync(g.i, g.tname, HIXL_READ, two, 2, XFER_TIMEOUT), HIXL_PARAM_INVALID);
  two[0].len = 4 * KiB;
  TU_ASSERT_OK(HixlEngineTransferSync(g.i, g.tname, HIXL_READ, &two[1], 1, XFER_TIMEOUT));
  TU_ASSERT_SAME(g.loc + 4 * KiB, want, sizeof(want), "the second mapping read back");
  CU_ASSERT_EQUAL(agent(A_FREE, (uint64_t)at, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_NOT_EQUAL(HixlEngineTransferSync(g.i, g.tname, HIXL_READ, &two[1], 1, XFER_TIMEOUT),
                      HIXL_SUCCESS);
}

/* Async requests, small (copied by the caller) and large (by the progress thread). */
static void test_one_async(void) {
  static const size_t lens[] = {4 * KiB, 32 * MiB};
  for (size_t k = 0; k < 2; k++) {
    HixlTransferOpDesc d = {(uintptr_t)g.loc, g.r1 + MiB, lens[k]};
    HixlTransferReq req = NULL;
    HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
    tu_fill(g.loc, lens[k], 300 + k);
    TU_ASSERT_OK(HixlEngineTransferAsync(g.i, g.tname, HIXL_WRITE, &d, 1, XFER_TIMEOUT, NULL, &req));
    TU_ASSERT_OK(tu_wait_request(g.i, req, tu_now_ms() + XFER_TIMEOUT, &ts));
    CU_ASSERT_EQUAL(ts, HIXL_TRANSFER_COMPLETED);
    CU_ASSERT_EQUAL(agent(A_CHECK, g.r1 + MiB, lens[k], 300 + k), -1);
  }
}

/* A WRITE of 1 MiB into the target's registered (not mapped) memory at m and a READ
 * back, byte for byte, both by process_vm_* (no op by memcpy). */
static void unmapped_round(uint64_t m, unsigned seed, const char *what) {
  uint64_t ops0 = link_of(g.i, g.tname).map_ops;
  tu_fill(g.loc, MiB, seed);
  TU_ASSERT_OK(xfer(HIXL_WRITE, g.loc, m, MiB));
  CU_ASSERT_EQUAL(agent(A_CHECK, m, MiB, seed), -1);
  memset(g.loc + BIG, 0, MiB);
  TU_ASSERT_OK(xfer(HIXL_READ, g.loc + BIG, m, MiB));
  TU_ASSERT_PATTERN(g.loc + BIG, MiB, seed, what);
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).map_ops, ops0);
}

/* Memory the target only registered, after Connect, keeps process_vm_*: usable at
 * once (the first op misses the table and SYNCs); deregistered, refused and untouched. */
static void test_one_registered_not_mapped(void) {
  int64_t at = agent(A_REG, 0, MiB, 0);
  CU_ASSERT_FATAL(at > 0);
  uint64_t m = (uint64_t)at;
  unmapped_round(m, 41, "registered target memory read by process_vm_readv");
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).mapped, 1);
  CU_ASSERT_EQUAL(agent(A_DEREG, m, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(agent(A_FILL, m, MiB, 42), 0);
  tu_fill(g.loc, MiB, 43);
  CU_ASSERT_NOT_EQUAL(xfer(HIXL_WRITE, g.loc, m, MiB), HIXL_SUCCESS);
  CU_ASSERT_NOT_EQUAL(xfer(HIXL_READ, g.loc + BIG, m + 100, 4096), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(agent(A_CHECK, m, MiB, 42), -1); /* deregistered memory untouched */
}

/* Memory the target frees and then registers anew where it lay (RegisterMem, not
 * mapped): the freed region's tombstone here, which fails ops queued before the free,
 * goes with the new registration's MEM_ADD; ops into it move by process_vm_*. */
static void test_one_registered_where_freed(void) {
  int64_t at = agent(A_ALLOC, 0, MiB, 0);
  CU_ASSERT_FATAL(at > 0);
  round_trip(g.i, g.tname);
  CU_ASSERT_EQUAL(agent(A_FREE, (uint64_t)at, 0, 0), HIXL_SUCCESS);
  int64_t re = agent(A_REG, 0, MiB, 0);
  CU_ASSERT_FATAL(re > 0);
  uint64_t a = (uint64_t)at, r = (uint64_t)re;
  if (r >= a + MiB || a >= r + MiB) { /* the kernel put it elsewhere: nothing to show */
    printf("  [registered at 0x%llx, away from the freed 0x%llx: the case did not arise]\n",
           (unsigned long long)r, (unsigned long long)a);
  } else {
    printf("  [registered at 0x%llx over the freed 0x%llx]\n", (unsigned long long)r, (unsigned long long)a);
  }
  unmapped_round(r, 191, "memory registered where a freed region lay"); /* not a stale mapping */
  CU_ASSERT_EQUAL(agent(A_DEREG, r, 0, 0), HIXL_SUCCESS);
}

/* Allocated after Connect: mapped once the SHM_MAP queued before a round trip is in;
 * FreeMem takes the initiator's mapping away before it returns; ops into it fail after. */
static void test_one_alloc_free_after_connect(void) {
  int maps0 = tu_memfd_maps(0);
  int64_t at = agent(A_ALLOC, 0, 8 * MiB, 0);
  CU_ASSERT_FATAL(at > 0);
  uint64_t p = (uint64_t)at;
  round_trip(g.i, g.tname);
  struct hixl_link_info li = link_of(g.i, g.tname);
  CU_ASSERT_EQUAL(li.mapped, 2);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0 + 1);
  tu_fill(g.loc, 8 * MiB, 51);
  TU_ASSERT_OK(xfer(HIXL_WRITE, g.loc, p, 8 * MiB));
  CU_ASSERT_EQUAL(agent(A_CHECK, p, 8 * MiB, 51), -1);
  CU_ASSERT(link_of(g.i, g.tname).map_ops > li.map_ops);

  CU_ASSERT_EQUAL(agent(A_FREE, p, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0); /* the initiator's mapping went first */
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).mapped, 1);
  CU_ASSERT_NOT_EQUAL(xfer(HIXL_WRITE, g.loc, p, 4096), HIXL_SUCCESS);
  /* the link itself is fine */
  TU_ASSERT_OK(xfer(HIXL_WRITE, g.loc, g.r1, 4096));
}

/* FreeMem while an async copy into the region runs: FreeMem waits for the copy to let
 * go; the request ends SUCCESS or FAILED (ops after the SHM_UNMAP), never later. */
static void test_one_free_while_copying(void) {
  HixlTransferOpDesc d[4];
  HixlTransferReq req = NULL;
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  int maps0 = tu_memfd_maps(0);
  int64_t at = agent(A_ALLOC, 0, BIG, 0);
  CU_ASSERT_FATAL(at > 0);
  uint64_t p = (uint64_t)at;
  round_trip(g.i, g.tname);
  CU_ASSERT_EQUAL_FATAL(link_of(g.i, g.tname).mapped, 2);
  for (int k = 0; k < 4; k++)
    d[k] = (HixlTransferOpDesc){(uintptr_t)(g.loc + k * 16 * MiB), p + k * 16 * MiB, 16 * MiB};
  TU_ASSERT_OK(HixlEngineTransferAsync(g.i, g.tname, HIXL_WRITE, d, 4, XFER_TIMEOUT, NULL, &req));
  CU_ASSERT_EQUAL(agent(A_FREE, p, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0); /* the mapping here gone when FreeMem returns */
  TU_ASSERT_OK(tu_wait_request(g.i, req, tu_now_ms() + XFER_TIMEOUT, &ts));
  CU_ASSERT(ts == HIXL_TRANSFER_COMPLETED || ts == HIXL_TRANSFER_FAILED);
  printf("  [the request racing FreeMem ended %s]\n", ts == HIXL_TRANSFER_COMPLETED ? "COMPLETED" : "FAILED");
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).mapped, 1);
}

/* Disconnect unmaps; Connect maps again. */
static void test_one_disconnect(void) {
  int maps0 = tu_memfd_maps(0);
  TU_ASSERT_OK(HixlEngineDisconnect(g.i, g.tname, 1000));
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0 - 1);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(g.i, g.tname, 5000));
  CU_ASSERT_EQUAL(link_of(g.i, g.tname).mapped, 1);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0);
  tu_fill(g.loc, MiB, 61);
  TU_ASSERT_OK(xfer(HIXL_WRITE, g.loc, g.r1, MiB));
  CU_ASSERT_EQUAL(agent(A_CHECK, g.r1, MiB, 61), -1);
}

/* Two engines of one process: not shm, so nothing is mapped; the data moves over tcp. */
static void test_one_process_not_mapped(void) {
  char name[TU_ADDR_LEN];
  void *p = NULL;
  HixlMemHandle h;
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), tu_free_port()), NULL);
  HixlEngine *i = tu_engine_start_with(tu_ip(), NULL);
  CU_ASSERT_FATAL(t && i);
  int maps0 = tu_memfd_maps(0);
  TU_ASSERT_OK_FATAL(HixlEngineAllocMem(t, 4 * MiB, &p, &h));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(i, name, 5000));
  struct hixl_link_info li = link_of(i, name);
  CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
  CU_ASSERT_EQUAL(li.mapped, 0);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), maps0 + 1); /* the target's own only */
  unsigned char *m = tu_alloc_mem(4 * MiB, false);
  CU_ASSERT_FATAL(m && tu_register(i, m, 4 * MiB));
  tu_fill(m, 4 * MiB, 62);
  HixlTransferOpDesc d = {(uintptr_t)m, (uintptr_t)p, 4 * MiB};
  TU_ASSERT_OK(HixlEngineTransferSync(i, name, HIXL_WRITE, &d, 1, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(p, 4 * MiB, 62, "AllocMem memory written over tcp");
  HixlEngineDestroy(i);
  TU_ASSERT_OK(HixlEngineFreeMem(t, h));
  HixlEngineDestroy(t);
  tu_free_mem(m, 4 * MiB);
}

/* ---------------------------------------------------------------- a child target */

static bool child_alloc(tu_child *c, uint16_t port, uint32_t uid, tu_server_ready *info) {
  tu_server_cfg cfg = {
      .port = port, .mem_len = 16 * MiB, .transport = "shm", .alloc = true, .uid = uid, .gid = uid};
  if (tu_server_start(c, &cfg, info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "target child (uid %u) did not start: %s (%s)", uid,
            HixlStatusName(info->status), info->error);
    return false;
  }
  return true;
}

static int64_t child_cmd(tu_child *c, uint32_t op, uint64_t seed, uint64_t off, uint64_t len) {
  tu_cmd cmd = {.op = op, .seed = seed, .off = off, .len = len};
  int64_t reply = -100;
  if (tu_server_send(c, &cmd, &reply, 30000) != 0)
    tu_fail(__FILE__, __LINE__, "child command %u: no reply", op);
  return reply;
}

/* This process's engine (Transport shm, 32 MiB registered at m) linked to a target
 * child running as uid whose 16 MiB come from HixlEngineAllocMem. */
struct side {
  HixlEngine *e;
  unsigned char *m;
  tu_child c;
  tu_server_ready info;
  char name[TU_ADDR_LEN];
};

static bool side_up(struct side *x, uint32_t uid) {
  uint16_t port = tu_free_port();
  memset(x, 0, sizeof(*x));
  x->e = tu_engine_start_with(tu_ip(), "shm");
  x->m = tu_alloc_mem(32 * MiB, false);
  CU_ASSERT_FATAL(x->e && x->m && tu_register(x->e, x->m, 32 * MiB));
  tu_addr(x->name, sizeof(x->name), port);
  if (!child_alloc(&x->c, port, uid, &x->info)) return false;
  return HixlEngineConnect(x->e, x->name, 5000) == HIXL_SUCCESS;
}

static void side_down(struct side *x) {
  if (x->c.pid > 0) tu_child_stop(&x->c, 10000);
  HixlEngineDestroy(x->e);
  tu_free_mem(x->m, 32 * MiB);
}

static HixlStatus side_xfer(struct side *x, HixlTransferOp op, size_t loff, size_t len) {
  HixlTransferOpDesc d = {(uintptr_t)(x->m + loff), x->info.addr, len};
  return HixlEngineTransferSync(x->e, x->name, op, &d, 1, XFER_TIMEOUT);
}

/* Mapped into this process, byte-checked by the child; a process forked here holds
 * none of it; the child's FreeMem takes it out of this process before it returns. */
static void test_child_map_fork_free(void) {
  struct side x;
  if (!side_up(&x, 0)) goto out;
  CU_ASSERT_EQUAL(link_of(x.e, x.name).mapped, 1);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 1);
  tu_fill(x.m, 16 * MiB, 71);
  TU_ASSERT_OK(side_xfer(&x, HIXL_WRITE, 0, 16 * MiB));
  CU_ASSERT_EQUAL(child_cmd(&x.c, TU_CMD_CHECK, 71, 0, 16 * MiB), -1);
  CU_ASSERT_EQUAL(child_cmd(&x.c, TU_CMD_FILL, 72, 0, 16 * MiB), 0);
  TU_ASSERT_OK(side_xfer(&x, HIXL_READ, 16 * MiB, 16 * MiB));
  TU_ASSERT_PATTERN(x.m + 16 * MiB, 16 * MiB, 72, "the child's memory read by memcpy");
  CU_ASSERT(link_of(x.e, x.name).map_ops >= 2);

  /* fork: the child of this process must not inherit the peer's pages */
  pid_t pid = fork();
  if (pid == 0) _exit(tu_memfd_maps(0) == 0 ? 0 : 1);
  int ws = 0;
  CU_ASSERT_FATAL(pid > 0 && waitpid(pid, &ws, 0) == pid);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    tu_fail(__FILE__, __LINE__, "a process forked after mapping holds the peer's memory (wait status 0x%x)",
            (unsigned)ws);
  tu_fill(x.m, MiB, 73); /* and this process goes on as before */
  TU_ASSERT_OK(side_xfer(&x, HIXL_WRITE, 0, MiB));
  CU_ASSERT_EQUAL(child_cmd(&x.c, TU_CMD_CHECK, 73, 0, MiB), -1);

  CU_ASSERT_EQUAL(child_cmd(&x.c, TU_CMD_FREE, 0, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 0); /* unmapped here before the child's FreeMem returned */
  CU_ASSERT_EQUAL(link_of(x.e, x.name).mapped, 0);
out:
  side_down(&x);
}

/* The target cuts a link (hixl_engine_drop_peer, as the plugin does when a lease or a
 * push expires, before it tells its host the blocks are free): that initiator's next
 * WRITE fails and lands nothing. The target's memory here is its own
 * (process_vm_writev, not a mapping) and its links are mapping links, whose transfers
 * skip reading the socket while the target's shared counter stands still: a cut must
 * move it (seen through a second initiator engine, whose link stays), else an
 * initiator whose progress thread has not yet seen the hang-up writes once more (the
 * plugin's push-expiry test did, about 1 run in 12). */
static void test_child_drops_peer(void) {
  enum { ROUNDS = 12, LEN = 256 * 1024 };
  uint16_t port = tu_free_port(), myport = tu_free_port();
  char name[TU_ADDR_LEN], me[TU_ADDR_LEN];
  tu_child c = {0};
  tu_server_ready info;
  tu_addr(name, sizeof(name), port);
  tu_addr(me, sizeof(me), myport);
  HixlEngine *e = tu_engine_start_with(me, "shm"), *e2 = tu_engine_start_with(tu_ip(), "shm");
  unsigned char *m = tu_alloc_mem(LEN, false);
  CU_ASSERT_FATAL(e && e2 && m && tu_register(e, m, LEN));
  tu_server_cfg cfg = {.port = port, .mem_len = LEN, .seed = 0, .transport = "shm"};
  if (tu_server_start(&c, &cfg, &info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "target child: %s", info.error);
    goto out;
  }
  int landed = 0;
  TU_ASSERT_OK(HixlEngineConnect(e2, name, 5000));
  for (int r = 0; r < ROUNDS; r++) {
    HixlTransferOpDesc d = {(uintptr_t)m, info.addr, LEN};
    TU_ASSERT_OK(HixlEngineConnect(e, name, 5000));
    tu_fill(m, LEN, 90 + (uint64_t)r);
    TU_ASSERT_OK(HixlEngineTransferSync(e, name, HIXL_WRITE, &d, 1, XFER_TIMEOUT));
    uint64_t g0 = link_of(e2, name).peer_gen;
    CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_DROP, myport, 0, 0), 1);
    CU_ASSERT(link_of(e2, name).peer_gen > g0); /* every initiator reads its socket next */
    tu_fill(m, LEN, 190 + (uint64_t)r);         /* what must not arrive */
    HixlStatus st = HixlEngineTransferSync(e, name, HIXL_WRITE, &d, 1, XFER_TIMEOUT);
    if (st == HIXL_SUCCESS) landed++;
    CU_ASSERT(st == HIXL_NOT_CONNECTED || st == HIXL_FAILED);
    CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_CHECK, 90 + (uint64_t)r, 0, LEN), -1);
  }
  if (landed) tu_fail(__FILE__, __LINE__, "%d of %d WRITEs after the cut landed", landed, ROUNDS);
out:
  if (c.pid > 0) tu_child_stop(&c, 10000);
  HixlEngineDestroy(e2);
  HixlEngineDestroy(e);
  tu_free_mem(m, LEN);
}

/* A killed target: ops into its memory FAIL (its pages outlive it, nobody reads them),
 * the link goes, the mapping with it: a 4 KiB op (copied in the call, copy_now) and a
 * 16 MiB one (a request of 16 pieces), each against a child of its own. held: a process
 * the child forked keeps its sockets open, so the link is still up when the op runs and
 * only the copy's own check (the life word) can tell: FAILED, "has exited". */
static void killed_case(size_t len, bool held) {
  struct side x;
  int64_t holder = -1;
  if (!side_up(&x, 0)) goto out;
  if (held) {
    holder = child_cmd(&x.c, TU_CMD_HOLD, (uint64_t)getpid(), 0, 0);
    CU_ASSERT_FATAL(holder > 0);
  }
  CU_ASSERT_EQUAL(link_of(x.e, x.name).mapped, 1);
  /* Its life word (shm_life.c) names the child's hixl-shm-life thread: alive. */
  uint32_t w = link_of(x.e, x.name).peer_life;
  char path[64], comm[32] = "";
  snprintf(path, sizeof(path), "/proc/%d/task/%u/comm", (int)x.c.pid, w & FUTEX_TID_MASK);
  FILE *f = w ? fopen(path, "r") : NULL;
  if (f) {
    if (!fgets(comm, sizeof(comm), f)) comm[0] = '\0';
    fclose(f);
  }
  CU_ASSERT(w != 0 && (w & FUTEX_OWNER_DIED) == 0);
  CU_ASSERT_STRING_EQUAL(comm, "hixl-shm-life\n");
  tu_child_kill(&x.c, SIGKILL);
  tu_child_wait(&x.c, 10000);
  HixlStatus st = side_xfer(&x, HIXL_WRITE, 0, len);
  if (held) { /* the link is up: only the copy's own check can tell */
    CU_ASSERT_EQUAL(st, HIXL_FAILED);
  } else {
    CU_ASSERT(st == HIXL_FAILED || st == HIXL_NOT_CONNECTED);
  }
  if (st == HIXL_FAILED) CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "has exited"));
  printf("  [WRITE of %zu B to a killed target%s: %s: %s]\n", len, held ? ", its sockets held" : "",
         HixlStatusName(st), HixlGetLastErrorMessage());
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 0); /* the link went, with the copy's finding when held */
out:
  if (holder > 0) kill((pid_t)holder, SIGKILL);
  side_down(&x);
}

static void test_child_killed(void) {
  killed_case(4 * KiB, false);
  killed_case(16 * MiB, false);
  killed_case(4 * KiB, true);
  killed_case(16 * MiB, true);
}

/* A target of another user hands nothing over (root copies its memory anyway). */
static void test_child_other_user(void) {
  struct side x;
  char line[512];
  if (geteuid() != 0) {
    printf("  [skipped: a target of another user needs root]\n");
    CU_PASS("skipped");
    return;
  }
  tu_log_watch("refused to map");
  if (!side_up(&x, USER_A)) goto out;
  struct hixl_link_info li = link_of(x.e, x.name);
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.mapped, 0);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 0);
  if (!tu_log_seen(line, sizeof(line)) || !strstr(line, "uid 0") || !strstr(line, "65501"))
    tu_fail(__FILE__, __LINE__, "the refusal was not logged with both uids: \"%s\"", line);
  printf("  [%s]\n", line);
  tu_fill(x.m, 16 * MiB, 81);
  TU_ASSERT_OK(side_xfer(&x, HIXL_WRITE, 0, 16 * MiB));
  CU_ASSERT_EQUAL(child_cmd(&x.c, TU_CMD_CHECK, 81, 0, 16 * MiB), -1);
  CU_ASSERT_EQUAL(link_of(x.e, x.name).map_ops, 0);
out:
  side_down(&x);
}

/* What the initiator child reports on fd 3. */
struct init_result {
  uint32_t connect_st;
  uint32_t mapped;
};

/* argv: flag target. Connect with Transport shm, report, then hold the link until
 * the command pipe (fd 4) closes. */
static int initiator_main(int argc, char **argv) {
  struct init_result r = {0, 0};
  char b;
  if (argc != 3) return 2;
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  if (!e) return 3;
  r.connect_st = HixlEngineConnect(e, argv[2], 5000);
  struct hixl_link_info li;
  if (r.connect_st == HIXL_SUCCESS && hixl_engine_link_info(e, argv[2], &li) == HIXL_SUCCESS)
    r.mapped = li.mapped;
  if (tu_write_all(3, &r, sizeof(r)) != 0) return 4;
  while (read(4, &b, 1) > 0) {
  }
  HixlEngineDestroy(e);
  return 0;
}

/* An initiator that does not answer SHM_UNMAP (stopped) is cut off at FreeMem's
 * timeout; FreeMem then frees the memory and says SUCCESS. */
static void test_silent_initiator(void) {
  tu_child c;
  struct init_result r;
  char name[TU_ADDR_LEN], line[512];
  void *p = NULL;
  HixlMemHandle h;
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), tu_free_port()), "shm");
  CU_ASSERT_PTR_NOT_NULL_FATAL(t);
  TU_ASSERT_OK_FATAL(HixlEngineAllocMem(t, 4 * MiB, &p, &h));
  char *argv[] = {(char *)tu_self_exe(), INIT_FLAG, name, NULL};
  CU_ASSERT_FATAL(tu_child_start(&c, exec_self, argv) == 0);
  CU_ASSERT_FATAL(tu_child_read(&c, &r, sizeof(r), 30000) == 0);
  TU_ASSERT_STATUS(r.connect_st, HIXL_SUCCESS);
  CU_ASSERT_EQUAL(r.mapped, 1);
  CU_ASSERT_EQUAL(tu_memfd_maps(c.pid), 1);
  tu_child_kill(&c, SIGSTOP);
  CU_ASSERT_FATAL(tu_child_wait_stopped(&c, 10000) == 0);
  tu_log_watch("did not unmap");
  int64_t t0 = tu_now_ms();
  TU_ASSERT_OK(HixlEngineFreeMem(t, h));
  int64_t ms = tu_now_ms() - t0;
  if (!tu_log_seen(line, sizeof(line))) tu_fail(__FILE__, __LINE__, "FreeMem did not log the cut-off link");
  printf("  [FreeMem returned after %lld ms: %s]\n", (long long)ms, line);
  tu_child_kill(&c, SIGCONT);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  HixlEngineDestroy(t);
}

/* Two initiators that do not answer SHM_UNMAP (stopped) are both cut off at FreeMem's
 * timeout: the walk that cuts them goes on past the first link it kills. A link left
 * up would keep a grant of the freed region, which its end then touches (ASan). */
static void test_silent_initiators(void) {
  tu_child c[2] = {{0}, {0}};
  struct init_result r;
  char name[TU_ADDR_LEN];
  void *p = NULL;
  HixlMemHandle h;
  HixlEngine *t = tu_engine_start_with(tu_addr(name, sizeof(name), tu_free_port()), "shm");
  CU_ASSERT_PTR_NOT_NULL_FATAL(t);
  TU_ASSERT_OK_FATAL(HixlEngineAllocMem(t, 4 * MiB, &p, &h));
  char *argv[] = {(char *)tu_self_exe(), INIT_FLAG, name, NULL};
  for (int k = 0; k < 2; k++) {
    CU_ASSERT_FATAL(tu_child_start(&c[k], exec_self, argv) == 0);
    CU_ASSERT_FATAL(tu_child_read(&c[k], &r, sizeof(r), 30000) == 0);
    TU_ASSERT_STATUS(r.connect_st, HIXL_SUCCESS);
    CU_ASSERT_EQUAL(r.mapped, 1);
  }
  for (int k = 0; k < 2; k++) {
    tu_child_kill(&c[k], SIGSTOP);
    CU_ASSERT_FATAL(tu_child_wait_stopped(&c[k], 10000) == 0);
  }
  TU_ASSERT_OK(HixlEngineFreeMem(t, h));
  size_t left = 0; /* links from the two still up: none */
  TU_ASSERT_OK(hixl_engine_drop_peer(t, tu_ip(), "test", &left));
  if (left != 0) tu_fail(__FILE__, __LINE__, "FreeMem left %zu of the 2 silent links up", left);
  for (int k = 0; k < 2; k++) tu_child_kill(&c[k], SIGCONT);
  for (int k = 0; k < 2; k++) {
    int ws = tu_child_stop(&c[k], 10000);
    CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  HixlEngineDestroy(t);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], INIT_FLAG) == 0) return initiator_main(argc, argv);
  if (argc > 1 && strcmp(argv[1], AGENT_FLAG) == 0) return agent_main(argc, argv);
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;              /* a server child */
  tu_log_capture(HIXL_LOG_WARN, true); /* the lines the tests look for */
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("mapped memory, a target agent in a child", one_init, one_cleanup);
  CU_add_test(s, "AllocMem region mapped at Connect", test_one_mapped);
  CU_add_test(s, "WRITE then READ back by memcpy, 1 B to 64 MiB", test_one_sizes);
  CU_add_test(s, "1024 scattered 4 KiB ops, shuffled", test_one_batch);
  CU_add_test(s, "async: small and large", test_one_async);
  CU_add_test(s, "registered after Connect: process_vm_*; deregistered: refused",
              test_one_registered_not_mapped);
  CU_add_test(s, "up to 16 ops in one mapping: copied in the call, no request", test_one_now);
  CU_add_test(s, "registered where a freed region lay: process_vm_*", test_one_registered_where_freed);
  CU_add_test(s, "allocated after Connect: mapped; FreeMem unmaps both sides first",
              test_one_alloc_free_after_connect);
  CU_add_test(s, "FreeMem while a copy runs: waits for it, then frees", test_one_free_while_copying);
  CU_add_test(s, "Disconnect unmaps, Connect maps again", test_one_disconnect);
  CU_add_test(s, "engines of one process: tcp, nothing mapped", test_one_process_not_mapped);
  s = CU_add_suite("mapped memory, a child target", NULL, NULL);
  CU_add_test(s, "mapped, byte-checked; fork inherits none; FreeMem unmaps here", test_child_map_fork_free);
  CU_add_test(s, "target killed: FAILED, unmapped", test_child_killed);
  CU_add_test(s, "target cuts the link: the next WRITE lands nothing", test_child_drops_peer);
  CU_add_test(s, "target of another user: not mapped, copied", test_child_other_user);
  s = CU_add_suite("mapped memory, a silent initiator", NULL, NULL);
  CU_add_test(s, "stopped initiator cut off at FreeMem's timeout", test_silent_initiator);
  CU_add_test(s, "two stopped initiators: both cut off", test_silent_initiators);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
