/* test_devmem_rdma: device memory over RDMA (docs/device-memory.md, "RDMA: GPUDirect
 * by dma-buf"), on a real verbs device (soft-RoCE in the project's QEMU guest), with the
 * test builds' host stand-in provider (HIXL_TEST_DEVMEM=host), whose "device" memory
 * comes from devmem_test_alloc (a memfd):
 *   - the real attempt: each device registration asks the provider for a dma-buf (the
 *     kernel's udmabuf over the memfd) and the RDMA device for an MR over it
 *     (ibv_reg_dmabuf_mr). Whichever the device answers, the engine says it
 *     (rdma_regs or rdma_refused), and the ops go the way it said: by RDMA with no copy
 *     through host buffers, or as tcp frames through them; every byte checked;
 *   - GPUDirect's paths whatever the device takes (HIXL_TEST_RDMA_DMABUF=plain: the
 *     stand-in's memory registered as the host memory it is, in place of its dma-buf;
 *     =refuse: no MR, as a NIC without GPUDirect):
 *     device to device, device to and from host memory, both ways, across chunk
 *     boundaries at odd offsets, a batch of small ops, all by RDMA (rdma_bytes grows by
 *     exactly the bytes, the stand-in copies nothing, no pool buffer is taken); a target
 *     whose device memory has no MR makes the same ops go as frames; a registration
 *     withdrawn is refused after;
 *   - a scoped target: its device memory is reached by RDMA only inside windows it
 *     granted (each over an MR of the range's own), refused by its CPU outside them
 *     and after the revoke, the initiator's buffer untouched.
 * Skips (77) where no RDMA device exists; HIXL_REQUIRE_RDMA=1 (the guest) fails then. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/engine_ext.h"
#include "hixl/hixl_engine.h"
#include "test_util.h"
#include "transport/rdma/rdma.h"

#define DEV_LEN  (8u << 20) /* each side's "device" memory: several 1 MiB chunks */
#define HOST_LEN (8u << 20)
#define WIN      (64u << 10) /* a scoped target's granted range */

struct side {
  HixlEngine *e;
  char name[TU_ADDR_LEN];
  uint8_t *dev, *host;
  HixlMemHandle hd, hh;
};

/* An engine on the RDMA address (Transport rdma, a key; scoped when asked), its memory
 * allocated; nothing registered. */
static bool side_up(struct side *s, bool scoped) {
  memset(s, 0, sizeof(*s));
  tu_addr(s->name, sizeof(s->name), tu_free_port());
  HixlOption key = {"AuthKeyFile", tu_key_file()};
  s->e = tu_engine_start_opts(s->name, "rdma", &key, 1);
  s->dev = devmem_test_alloc(DEV_LEN);
  s->host = tu_alloc_mem(HOST_LEN, false);
  if (s->e && scoped && hixl_engine_set_scoped(s->e, true) != HIXL_SUCCESS) return false;
  return s->e && s->dev && s->host;
}

/* Register s's device and host memory; dmabuf: HIXL_TEST_RDMA_DMABUF's value for the
 * device registration (NULL: the real attempt; "peermem": the real attempt with the
 * stand-in saying a peer-memory client is loaded, HIXL_TEST_DEVMEM_PEERMEM=1). */
static bool side_reg(struct side *s, const char *dmabuf) {
  HixlMemDesc d = {.addr = (uintptr_t)s->dev, .len = DEV_LEN},
              h = {.addr = (uintptr_t)s->host, .len = HOST_LEN};
  bool peermem = dmabuf && strcmp(dmabuf, "peermem") == 0;
  if (dmabuf && !peermem)
    setenv("HIXL_TEST_RDMA_DMABUF", dmabuf, 1);
  else
    unsetenv("HIXL_TEST_RDMA_DMABUF");
  if (peermem) setenv("HIXL_TEST_DEVMEM_PEERMEM", "1", 1);
  HixlStatus st = HixlEngineRegisterMem(s->e, &d, HIXL_MEM_DEVICE, &s->hd);
  unsetenv("HIXL_TEST_RDMA_DMABUF");
  unsetenv("HIXL_TEST_DEVMEM_PEERMEM");
  if (st != HIXL_SUCCESS) fprintf(stderr, "RegisterMem (device): %s\n", HixlGetLastErrorMessage());
  return st == HIXL_SUCCESS && HixlEngineRegisterMem(s->e, &h, HIXL_MEM_HOST, &s->hh) == HIXL_SUCCESS;
}

static void side_down(struct side *s) {
  if (s->e) {
    HixlEngineFinalize(s->e);
    HixlEngineDestroy(s->e);
  }
  devmem_test_free(s->dev);
  tu_free_mem(s->host, HOST_LEN);
  memset(s, 0, sizeof(*s));
}

static struct hixl_devmem_stats dstats(HixlEngine *e) {
  struct hixl_devmem_stats s;
  memset(&s, 0, sizeof(s));
  TU_ASSERT_OK(hixl_engine_devmem_stats(e, &s));
  return s;
}

/* a and b up, their memory registered (HIXL_TEST_RDMA_DMABUF a_db for a's device memory,
 * b_db for b's: "plain" gets an MR, "refuse" none, as counted; NULL the real attempt), b
 * scoped when asked, a linked to b over RDMA. */
static void pair_up(struct side *a, struct side *b, bool b_scoped, const char *a_db, const char *b_db) {
  CU_ASSERT_FATAL(side_up(a, false) && side_up(b, b_scoped));
  CU_ASSERT_FATAL(side_reg(a, a_db) && side_reg(b, b_db));
  const char *db[2] = {a_db, b_db};
  struct side *s[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    if (!db[k]) continue;
    struct hixl_devmem_stats st = dstats(s[k]->e);
    bool peermem = strcmp(db[k], "peermem") == 0, mr = peermem || strcmp(db[k], "plain") == 0;
    CU_ASSERT_EQUAL(st.rdma_regs, mr ? 1 : 0);
    CU_ASSERT_EQUAL(st.rdma_refused, mr ? 0 : 1);
    CU_ASSERT_EQUAL(st.rdma_peermem, peermem ? 1 : 0); /* by address: no dma-buf MR here (soft-RoCE) */
  }
  TU_ASSERT_OK_FATAL(HixlEngineConnect(a->e, b->name, 10000));
  struct hixl_link_info li;
  TU_ASSERT_OK(hixl_engine_link_info(a->e, b->name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "rdma");
}

static void pair_down(struct side *a, struct side *b) {
  side_down(a);
  side_down(b);
}

/* What one sync op of x's to y moved: through the stand-in's copies (host buffers),
 * and by RDMA as x counted it. */
struct moved {
  uint64_t copied, rdma;
};

static HixlStatus op(struct side *x, struct side *y, HixlTransferOp o, const void *local, const void *remote,
                     size_t len, struct moved *m) {
  uint64_t out0, in0, out1, in1;
  uint64_t r0 = dstats(x->e).rdma_bytes;
  devmem_test_counts(&out0, &in0);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = (uintptr_t)remote, .len = len};
  HixlStatus st = HixlEngineTransferSync(x->e, y->name, o, &d, 1, 10000);
  devmem_test_counts(&out1, &in1);
  m->copied = (out1 - out0) + (in1 - in0);
  m->rdma = dstats(x->e).rdma_bytes - r0;
  return st;
}

/* No pool buffer of the process is handed out or pinned: the engines up now made none,
 * so nothing went through one. */
static void assert_no_pool(void) {
  uint64_t out, pinned, waits;
  devmem_test_pool(&out, &pinned, &waits);
  CU_ASSERT_EQUAL(out, 0);
  CU_ASSERT_EQUAL(pinned, 0);
}

/* x's region at xoff to y's at yoff and back (WRITE, then READ into a cleared buffer),
 * len bytes, the byte before y's range untouched. direct: by RDMA, nothing copied; else
 * every byte copied through host buffers at each of the ndev ends in device memory. */
static void round_trip(struct side *x, uint8_t *xmem, size_t xoff, struct side *y, uint8_t *ymem, size_t yoff,
                       size_t len, uint32_t seed, bool direct, int ndev, const char *what) {
  struct moved m;
  tu_fill(xmem + xoff, len, seed);
  memset(ymem + yoff - (yoff > 0), 0x11, len + (yoff > 0));
  TU_ASSERT_OK(op(x, y, HIXL_WRITE, xmem + xoff, ymem + yoff, len, &m));
  TU_ASSERT_SAME(ymem + yoff, xmem + xoff, len, what);
  if (yoff > 0) CU_ASSERT_EQUAL(ymem[yoff - 1], 0x11); /* nothing before it */
  CU_ASSERT_EQUAL(m.rdma, direct ? len : 0);
  CU_ASSERT_EQUAL(m.copied, direct ? 0 : (uint64_t)ndev * len);
  memset(xmem + xoff, 0x22, len);
  TU_ASSERT_OK(op(x, y, HIXL_READ, xmem + xoff, ymem + yoff, len, &m));
  TU_ASSERT_SAME(xmem + xoff, ymem + yoff, len, what);
  CU_ASSERT_EQUAL(m.rdma, direct ? len : 0);
  CU_ASSERT_EQUAL(m.copied, direct ? 0 : (uint64_t)ndev * len);
}

/* ---- the real attempt: a dma-buf MR, or frames, as the device says ---- */

static void test_real_attempt(void) {
  struct side a, b;
  uint64_t made0 = devmem_test_dmabufs();
  pair_up(&a, &b, false, NULL, NULL);
  bool udmabuf = access("/dev/udmabuf", R_OK | W_OK) == 0;
  /* The provider was asked for each side's dma-buf: made where the kernel has udmabuf. */
  CU_ASSERT_EQUAL(devmem_test_dmabufs() - made0, udmabuf ? 2 : 0);
  struct hixl_devmem_stats sa = dstats(a.e), sb = dstats(b.e);
  CU_ASSERT_EQUAL(sa.rdma_regs + sa.rdma_refused, 1);
  CU_ASSERT_EQUAL(sb.rdma_regs + sb.rdma_refused, 1);
  CU_ASSERT_EQUAL(sa.rdma_regs, sb.rdma_regs); /* one device, one answer */
  bool direct = sa.rdma_regs == 1;
  if (!udmabuf) CU_ASSERT_FALSE(direct); /* no dma-buf, no MR over one */
  printf("\n  [/dev/udmabuf %s; the RDMA device %s a dma-buf MR: device ops go %s]\n",
         udmabuf ? "present" : "absent", direct ? "took" : "was not given or refused",
         direct ? "by RDMA" : "as tcp frames through host buffers");
  round_trip(&a, a.dev, 7, &b, b.dev, 11, (3u << 20) + 5, 31, direct, 2, "device to device");
  round_trip(&a, a.host, 0, &b, b.dev, 4096, (1u << 20) + 1, 32, direct, 1, "host to device");
  round_trip(&a, a.dev, 4096, &b, b.host, 3, 4096, 33, direct, 1, "device to host");
  pair_down(&a, &b);
}

/* ---- GPUDirect's paths (HIXL_TEST_RDMA_DMABUF=plain) ---- */

static void test_direct(void) {
  struct side a, b;
  pair_up(&a, &b, false, "plain", "plain");
  round_trip(&a, a.dev, 7, &b, b.dev, 11, (3u << 20) + 5, 41, true, 2, "device to device");
  round_trip(&a, a.dev, 0, &b, b.dev, 0, DEV_LEN, 42, true, 2, "the whole region");
  round_trip(&a, a.host, 5, &b, b.dev, (1u << 20) - 1, (2u << 20) + 9, 43, true, 1, "host to device");
  round_trip(&a, a.dev, 1, &b, b.host, 0, 1, 44, true, 1, "device to host, 1 byte");
  /* 64 small ops in one call, device to device. */
  enum { N = 64, SZ = 4096 };
  HixlTransferOpDesc d[N];
  for (int i = 0; i < N; i++)
    d[i] = (HixlTransferOpDesc){(uintptr_t)a.dev + (size_t)i * 2 * SZ, (uintptr_t)b.dev + (size_t)i * 3 * SZ,
                                SZ};
  tu_fill(a.dev, DEV_LEN, 45);
  memset(b.dev, 0, DEV_LEN);
  uint64_t r0 = dstats(a.e).rdma_bytes;
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, d, N, 10000));
  CU_ASSERT_EQUAL(dstats(a.e).rdma_bytes - r0, (uint64_t)N * SZ);
  for (int i = 0; i < N; i++)
    TU_ASSERT_SAME(b.dev + (size_t)i * 3 * SZ, a.dev + (size_t)i * 2 * SZ, SZ, "op");
  CU_ASSERT_EQUAL(tu_check_byte(b.dev + SZ, SZ, 0), -1); /* between two ops: untouched */
  assert_no_pool();
  /* Withdrawn: the peer hears of it before its next op, which is refused. */
  TU_ASSERT_OK(HixlEngineDeregisterMem(b.e, b.hd));
  CU_ASSERT_EQUAL(dstats(b.e).rdma_regs, 0);
  struct moved m;
  HixlStatus st = op(&a, &b, HIXL_READ, a.dev, b.dev, 4096, &m);
  CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS);
  CU_ASSERT_EQUAL(m.rdma, 0);
  pair_down(&a, &b);
}

/* The target's device memory has no MR (refused, as a NIC without GPUDirect would):
 * the same ops go as frames through the target's host buffers, the initiator's MR
 * over its own device memory notwithstanding. */
static void test_one_side(void) {
  struct side a, b;
  pair_up(&a, &b, false, "plain", "refuse");
  round_trip(&a, a.dev, 3, &b, b.dev, 5, (2u << 20) + 7, 51, false, 2,
             "device to device, target without an MR");
  round_trip(&a, a.host, 0, &b, b.dev, 0, 8192, 52, false, 1, "host to device, target without an MR");
  /* The target's host memory is still RDMA's, from device memory that has an MR. */
  round_trip(&a, a.dev, 0, &b, b.host, 0, (1u << 20) + 3, 53, true, 1, "device to the target's host memory");
  pair_down(&a, &b);
}

/* A scoped target: its device memory registered with an MR but no remote access of
 * its own; a granted range gets a window (over an MR of its own), the rest is refused
 * by the target's CPU, and so is the range after the revoke. */
static void scoped_with(const char *db) {
  struct side a, t;
  pair_up(&a, &t, true, db, db);
  struct moved m;
  tu_fill(t.dev, DEV_LEN, 61);
  memset(a.dev, 0x5a, WIN);
  CU_ASSERT_NOT_EQUAL(op(&a, &t, HIXL_READ, a.dev, t.dev + WIN, WIN, &m), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_check_byte(a.dev, WIN, 0x5a), -1); /* nothing granted: nothing arrived */
  CU_ASSERT_EQUAL(m.rdma, 0);
  const uint64_t r[1][2] = {{(uintptr_t)t.dev + WIN, WIN}};
  struct hixl_window_stats w0;
  TU_ASSERT_OK(hixl_engine_window_stats(t.e, &w0));
  TU_ASSERT_OK_FATAL(hixl_engine_grant(t.e, a.name, r, 1));
  struct hixl_window_stats w1;
  TU_ASSERT_OK(hixl_engine_window_stats(t.e, &w1));
  CU_ASSERT_EQUAL(w1.open, w0.open + 1);
  TU_ASSERT_OK(op(&a, &t, HIXL_READ, a.dev, t.dev + WIN, WIN, &m));
  TU_ASSERT_SAME(a.dev, t.dev + WIN, WIN, "READ of the granted device range");
  CU_ASSERT_EQUAL(m.rdma, WIN);
  CU_ASSERT_EQUAL(m.copied, 0);
  struct hixl_link_info li;
  TU_ASSERT_OK(hixl_engine_link_info(a.e, t.name, &li));
  CU_ASSERT(li.win_ops >= 1);
  tu_fill(a.dev, WIN, 62);
  TU_ASSERT_OK(op(&a, &t, HIXL_WRITE, a.dev, t.dev + WIN, WIN, &m));
  TU_ASSERT_SAME(t.dev + WIN, a.dev, WIN, "WRITE into the granted device range");
  CU_ASSERT_EQUAL(m.rdma, WIN);
  /* One byte past the window: refused by the target's CPU (frames), nothing moved. */
  memset(a.dev, 0x5b, WIN + 1);
  CU_ASSERT_NOT_EQUAL(op(&a, &t, HIXL_READ, a.dev, t.dev + WIN, WIN + 1, &m), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(m.rdma, 0);
  CU_ASSERT_EQUAL(tu_check_byte(a.dev, WIN + 1, 0x5b), -1);
  TU_ASSERT_OK(hixl_engine_revoke(t.e, a.name, r, 1));
  memset(a.dev, 0x5c, WIN);
  CU_ASSERT_NOT_EQUAL(op(&a, &t, HIXL_READ, a.dev, t.dev + WIN, WIN, &m), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_check_byte(a.dev, WIN, 0x5c), -1);
  CU_ASSERT_EQUAL(m.rdma, 0);
  pair_down(&a, &t);
}

static void test_scoped(void) { scoped_with("plain"); }

/* GPUDirect without dma-buf: no dma-buf MR (soft-RoCE takes none), but a peer-memory
 * client loaded (the stand-in says so): an MR by the memory's address, and every path
 * by RDMA as with a dma-buf's, a scoped target's windows too. */
static void test_peermem(void) {
  struct side a, b;
  pair_up(&a, &b, false, "peermem", "peermem");
  round_trip(&a, a.dev, 7, &b, b.dev, 11, (3u << 20) + 5, 71, true, 2, "device to device, by address");
  round_trip(&a, a.host, 5, &b, b.dev, 4096, (1u << 20) + 1, 72, true, 1, "host to device, by address");
  round_trip(&a, a.dev, 4096, &b, b.host, 3, 4096, 73, true, 1, "device to host, by address");
  assert_no_pool();
  pair_down(&a, &b);
  scoped_with("peermem");
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;
  bool required = getenv("HIXL_REQUIRE_RDMA") != NULL;
  if (setenv("HIXL_TEST_DEVMEM", "host", 1) != 0) return 1; /* before the provider is first found */
  if (!rdma_available() || !getenv("HIXL_TEST_IP")) {
    fprintf(stderr, "test_devmem_rdma: %s\n",
            !rdma_available() ? "no RDMA device on this host" : "HIXL_TEST_IP does not name an RDMA address");
    return required ? 1 : 77; /* skipped here; run for real in the soft-RoCE guest */
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("device memory over rdma", NULL, NULL);
  CU_add_test(s, "the real attempt: a dma-buf MR, or frames, as the device says", test_real_attempt);
  CU_add_test(s, "GPUDirect's paths: by RDMA, nothing through host buffers", test_direct);
  CU_add_test(s, "a target without an MR: frames", test_one_side);
  CU_add_test(s, "a scoped target: windows over device memory", test_scoped);
  CU_add_test(s, "no dma-buf MR, a peer-memory client: an MR by address, by RDMA", test_peermem);
  return tu_run_registry();
}
