/* test_devmem_ipc: device memory over the same-host path by IPC handle
 * (docs/device-memory.md), with the host stand-in provider (HIXL_TEST_DEVMEM=host, set
 * here): a forked child is the target, with "device" memory from devmem_test_alloc
 * (a memfd the stand-in exports); this process connects over shm, opens it by the
 * handle the child hands over on the link (SHM_DEV_MAP) and moves device ops by d2d
 * copies. The child is forked before this process starts an engine (no threads yet),
 * and is this process's descendant, so Yama's ptrace_scope 1 lets the stand-in open
 * /proc/<child>/fd and shm's probe read it. */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/engine_ext.h"
#include "hixl/hixl_engine.h"
#include "test_util.h"

#define DEV_LEN  (4u << 20)  /* the child's device allocation, registered whole */
#define BIG_LEN  (64u << 20) /* ... for the test that kills it mid-transfer */
#define HOST_LEN (1u << 20)
#define WAIT_MS  20000

/* What the child says once its engine is up. */
struct child_info {
  char name[TU_ADDR_LEN];
  uint64_t dev, host, dev_len;
};

struct child_arg {
  size_t dev_len;
  bool scoped;       /* a scoped engine: nothing granted until told */
  bool devmap_whole; /* ... that hands device memory to same-host peers whole all the same */
  const char *forge; /* HIXL_TEST_SHM_FORGE: a handover forged on the wire */
};

/* The child's service SVC_REVOKE: revoke the caller's grant of the whole allocation from
 * inside the handler (the progress thread, the lock held), answering its status; asked
 * "b", grant it back at once too (while the recall is still on its way). */
#define SVC_REVOKE 3
struct revoke_ctx {
  HixlEngine *e;
  uint64_t range[1][2];
};
static HixlStatus revoke_handler(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                 size_t cap, size_t *resp_len) {
  struct revoke_ctx *x = ctx;
  (void)cap;
  uint32_t st = (uint32_t)hixl_engine_revoke(x->e, peer, (const uint64_t(*)[2])x->range, 1);
  if (st == HIXL_SUCCESS && len == 1 && req[0] == 'b')
    st = (uint32_t)hixl_engine_grant(x->e, peer, (const uint64_t(*)[2])x->range, 1);
  memcpy(resp, &st, 4);
  *resp_len = 4;
  return HIXL_SUCCESS;
}

/* The child: a shm engine with DEV_LEN (or dev_len) of stand-in device memory and
 * HOST_LEN of host memory registered. Commands on ctl_fd: 'f' seed (u32): fill the
 * device memory, answer 'k'; 'v' seed: answer 'y' when it holds that fill, else 'n';
 * 'd': deregister the device memory, answer its status (u32) once the call returned;
 * 'g' / 'r' name (TU_ADDR_LEN): grant / revoke the whole allocation to that peer,
 * answer the status once the call returned. A scoped child also serves SVC_REVOKE.
 * EOF: finalize and quit. */
static int child_main(void *argp, int ready_fd, int ctl_fd) {
  const struct child_arg *a = argp;
  struct child_info info;
  memset(&info, 0, sizeof(info));
  if (a->forge) setenv("HIXL_TEST_SHM_FORGE", a->forge, 1);
  unsetenv("HIXL_TEST_NO_DEVMEM_CAP"); /* the target is of this build (test_no_devmem_cap) */
  unsetenv("HIXL_TEST_DEVMEM_DEVICE"); /* its memory is device 0's, whatever this process's is */
  tu_addr(info.name, sizeof(info.name), tu_free_port());
  HixlEngine *e = tu_engine_start_opts(info.name, "shm", NULL, 0);
  uint8_t *dev = devmem_test_alloc(a->dev_len), *host = malloc(HOST_LEN), *want = malloc(a->dev_len);
  HixlMemHandle hd = NULL, hh = NULL;
  if (!e || !dev || !host || !want) return 2;
  if (a->scoped && hixl_engine_set_scoped(e, true) != HIXL_SUCCESS) return 3;
  if (a->devmap_whole && hixl_engine_set_devmap_scoped(e, false) != HIXL_SUCCESS) return 3;
  HixlMemDesc d = {.addr = (uintptr_t)dev, .len = a->dev_len}, h = {.addr = (uintptr_t)host, .len = HOST_LEN};
  if (HixlEngineRegisterMem(e, &d, HIXL_MEM_DEVICE, &hd) != HIXL_SUCCESS ||
      HixlEngineRegisterMem(e, &h, HIXL_MEM_HOST, &hh) != HIXL_SUCCESS)
    return 4;
  struct revoke_ctx rx = {e, {{(uintptr_t)dev, a->dev_len}}};
  if (a->scoped && hixl_engine_set_service(e, SVC_REVOKE, revoke_handler, &rx) != HIXL_SUCCESS) return 4;
  info.dev = (uintptr_t)dev;
  info.host = (uintptr_t)host;
  info.dev_len = a->dev_len;
  if (write(ready_fd, &info, sizeof(info)) != (ssize_t)sizeof(info)) return 5;
  for (;;) {
    char cmd;
    uint32_t seed, st;
    char peer[TU_ADDR_LEN];
    uint64_t range[1][2] = {{(uintptr_t)dev, a->dev_len}};
    if (read(ctl_fd, &cmd, 1) != 1) break;
    switch (cmd) {
    case 'f':
    case 'v':
      if (read(ctl_fd, &seed, 4) != 4) return 6;
      if (cmd == 'f') tu_fill(dev, a->dev_len, seed);
      if (cmd == 'v') tu_fill(want, a->dev_len, seed);
      cmd = cmd == 'f' ? 'k' : memcmp(dev, want, a->dev_len) == 0 ? 'y' : 'n';
      if (write(ready_fd, &cmd, 1) != 1) return 7;
      break;
    case 'd':
      st = (uint32_t)HixlEngineDeregisterMem(e, hd);
      if (write(ready_fd, &st, 4) != 4) return 8;
      break;
    case 'g':
    case 'r':
      if (read(ctl_fd, peer, sizeof(peer)) != (ssize_t)sizeof(peer)) return 9;
      peer[sizeof(peer) - 1] = '\0';
      st = (uint32_t)(cmd == 'g' ? hixl_engine_grant(e, peer, (const uint64_t(*)[2])range, 1)
                                 : hixl_engine_revoke(e, peer, (const uint64_t(*)[2])range, 1));
      if (write(ready_fd, &st, 4) != 4) return 10;
      break;
    default: return 11;
    }
  }
  HixlEngineFinalize(e);
  HixlEngineDestroy(e);
  devmem_test_free(dev);
  free(host);
  free(want);
  return 0;
}

/* This process's side: the child, then an engine with its own device and host memory. */
struct pair {
  tu_child ch;
  struct child_info ci;
  HixlEngine *e;
  char name[TU_ADDR_LEN];
  uint8_t *dev, *host, *want;
  size_t len;
};

static bool pair_up(struct pair *p, const struct child_arg *a) {
  memset(p, 0, sizeof(*p));
  p->len = a->dev_len;
  if (tu_child_start(&p->ch, child_main, (void *)a) != 0) return false;
  if (tu_child_read(&p->ch, &p->ci, sizeof(p->ci), WAIT_MS) != 0) return false;
  tu_addr(p->name, sizeof(p->name), tu_free_port());
  p->e = tu_engine_start_opts(p->name, "shm", NULL, 0);
  p->dev = devmem_test_alloc(p->len);
  p->host = malloc(HOST_LEN);
  p->want = malloc(p->len);
  HixlMemHandle hd, hh;
  if (!p->e || !p->dev || !p->host || !p->want) return false;
  HixlMemDesc d = {.addr = (uintptr_t)p->dev, .len = p->len},
              h = {.addr = (uintptr_t)p->host, .len = HOST_LEN};
  return HixlEngineRegisterMem(p->e, &d, HIXL_MEM_DEVICE, &hd) == HIXL_SUCCESS &&
         HixlEngineRegisterMem(p->e, &h, HIXL_MEM_HOST, &hh) == HIXL_SUCCESS;
}

static void pair_down(struct pair *p) {
  if (p->e) {
    HixlEngineFinalize(p->e);
    HixlEngineDestroy(p->e);
  }
  if (p->ch.pid) CU_ASSERT_EQUAL(tu_child_stop(&p->ch, WAIT_MS), 0);
  devmem_test_free(p->dev);
  free(p->host);
  free(p->want);
  memset(p, 0, sizeof(*p));
}

/* A command with a seed to the child, and its one-byte answer. */
static char child_seed(struct pair *p, char cmd, uint32_t seed) {
  char ans = 0;
  CU_ASSERT_EQUAL(tu_child_write(&p->ch, &cmd, 1), 0);
  CU_ASSERT_EQUAL(tu_child_write(&p->ch, &seed, 4), 0);
  CU_ASSERT_EQUAL(tu_child_read(&p->ch, &ans, 1, WAIT_MS), 0);
  return ans;
}

/* A command (with this engine's name for 'g' and 'r') and the child's status. */
static HixlStatus child_call(struct pair *p, char cmd) {
  uint32_t st = UINT32_MAX;
  CU_ASSERT_EQUAL(tu_child_write(&p->ch, &cmd, 1), 0);
  if (cmd == 'g' || cmd == 'r') CU_ASSERT_EQUAL(tu_child_write(&p->ch, p->name, sizeof(p->name)), 0);
  CU_ASSERT_EQUAL(tu_child_read(&p->ch, &st, 4, WAIT_MS), 0);
  return (HixlStatus)st;
}

static HixlStatus xfer(struct pair *p, HixlTransferOp op, const void *local, uint64_t remote, size_t len) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = remote, .len = len};
  return HixlEngineTransferSync(p->e, p->ci.name, op, &d, 1, WAIT_MS);
}

static uint64_t ipc_bytes(HixlEngine *e) {
  struct hixl_devmem_stats ds = {0};
  TU_ASSERT_OK(hixl_engine_devmem_stats(e, &ds));
  return ds.ipc_bytes;
}

static uint32_t mapped(struct pair *p) {
  struct hixl_link_info li;
  memset(&li, 0, sizeof(li));
  TU_ASSERT_OK(hixl_engine_link_info(p->e, p->ci.name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  return li.mapped;
}

/* Pull and push device memory between two processes over shm: opened once by its IPC
 * handle, moved by d2d (its count grows by every byte), the tcp-frame path's host
 * copies and pool untouched; device <-> host by the provider against the mapping. */
static void test_pull_push(void) {
  struct child_arg a = {.dev_len = DEV_LEN};
  struct pair p;
  uint64_t d0, m0, d1, m1, o0, i0, o1, i1, po0, pp0, pw0, po1, pp1, pw1;
  devmem_test_d2d(&d0, &m0);
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(ipc_bytes(p.e), 0);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0 + 1); /* its allocation, opened once in Connect */
  int od = -2, cd = -2;
  devmem_test_ipc_devices(&od, &cd);
  CU_ASSERT_EQUAL(od, 0); /* in device 0's context: this side's device memory is there */
  CU_ASSERT_EQUAL(mapped(&p), 1);
  devmem_test_counts(&o0, &i0);
  devmem_test_pool(&po0, &pp0, &pw0);
  /* pull: 3 MiB + 5 from an odd offset, over chunk boundaries */
  size_t len = (3u << 20) + 5;
  struct hixl_devmem_stats s0, s1;
  TU_ASSERT_OK(hixl_engine_devmem_stats(p.e, &s0));
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 61), 'k');
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev + 3, p.ci.dev + 7, len));
  TU_ASSERT_OK(hixl_engine_devmem_stats(p.e, &s1));
  CU_ASSERT_EQUAL(s1.ipc_ops - s0.ipc_ops, 1); /* its 4 chunks follow each other on both sides: one copy */
  CU_ASSERT_EQUAL(s1.ipc_waits - s0.ipc_waits, 1);
  tu_fill(p.want, p.len, 61);
  TU_ASSERT_SAME(p.dev + 3, p.want + 7, len, "pull: the peer's device memory read by d2d");
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(d1 - d0, len);
  /* push: the whole allocation */
  tu_fill(p.dev, p.len, 62);
  TU_ASSERT_OK(xfer(&p, HIXL_WRITE, p.dev, p.ci.dev, p.len));
  CU_ASSERT_EQUAL(child_seed(&p, 'v', 62), 'y');
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(d1 - d0, len + p.len);
  CU_ASSERT_EQUAL(m1, m0 + 1); /* still the one mapping */
  devmem_test_counts(&o1, &i1);
  devmem_test_pool(&po1, &pp1, &pw1);
  CU_ASSERT_EQUAL(o1, o0); /* nothing through host buffers: the tcp-frame path did not run */
  CU_ASSERT_EQUAL(i1, i0);
  CU_ASSERT_EQUAL(pp1, pp0);
  CU_ASSERT_EQUAL(pw1, pw0);
  /* host memory here <-> the peer's device memory: to_device / to_host on the mapping */
  struct hixl_link_info li0, li1;
  TU_ASSERT_OK(hixl_engine_link_info(p.e, p.ci.name, &li0));
  tu_fill(p.host, HOST_LEN, 63);
  TU_ASSERT_OK(xfer(&p, HIXL_WRITE, p.host, p.ci.dev, HOST_LEN));
  memset(p.host, 0, HOST_LEN);
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.host, p.ci.dev, HOST_LEN));
  tu_fill(p.want, HOST_LEN, 63);
  TU_ASSERT_SAME(p.host, p.want, HOST_LEN, "host <-> the peer's device memory, both ways");
  TU_ASSERT_OK(hixl_engine_link_info(p.e, p.ci.name, &li1));
  CU_ASSERT_EQUAL(li1.map_ops - li0.map_ops, 2); /* one chunk each way, on the mapping */
  devmem_test_counts(&o1, &i1);
  CU_ASSERT_EQUAL(o1 - o0, HOST_LEN);
  CU_ASSERT_EQUAL(i1 - i0, HOST_LEN);
  devmem_test_pool(&po1, &pp1, &pw1);
  CU_ASSERT_EQUAL(pp1, pp0);                                   /* no pool buffer pinned: no tcp frames */
  CU_ASSERT_EQUAL(ipc_bytes(p.e), len + p.len + 2 * HOST_LEN); /* every byte on the mapping, counted */
  pair_down(&p);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* closed at Finalize */
}

/* An initiator whose HELLO lacks WIRE_CAP_DEVMEM while its SHM_HELLO asks for device
 * mappings (WIRE_SHM_F_DEVMAP), as engines from the IPC handover (7709cff) to the bit
 * (8417983) send them: the target tells it of no device registration, so it hands it
 * none either, and the link serves the host memory. Before, the target sent SHM_DEV_MAP
 * of a registration it had not told, the initiator refused it as a protocol error and
 * the link died in Connect, every time: a KV hand-off in device memory between such an
 * engine and a later one never linked (hixl-mock-host with an older plugin). */
static void test_no_devmem_cap(void) {
  struct child_arg a = {.dev_len = DEV_LEN};
  struct pair p;
  uint64_t d0, m0, d1, m1;
  devmem_test_d2d(&d0, &m0);
  setenv("HIXL_TEST_NO_DEVMEM_CAP", "1", 1); /* this process's engine (link_caps); no thread runs yet */
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(mapped(&p), 0);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* no allocation opened */
  /* The peer's device memory is not known here: refused, nothing written here. */
  memset(p.dev, 0x5a, p.len);
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 71), 'k');
  CU_ASSERT_NOT_EQUAL(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_check_byte(p.dev, p.len, 0x5a), -1);
  /* The link lives: the peer's host memory written and read back, byte for byte. */
  tu_fill(p.host, HOST_LEN, 72);
  TU_ASSERT_OK(xfer(&p, HIXL_WRITE, p.host, p.ci.host, HOST_LEN));
  memset(p.host, 0, HOST_LEN);
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.host, p.ci.host, HOST_LEN));
  tu_fill(p.want, HOST_LEN, 72);
  TU_ASSERT_SAME(p.host, p.want, HOST_LEN, "the peer's host memory over a link without device memory");
  CU_ASSERT_EQUAL(ipc_bytes(p.e), 0);
  CU_ASSERT_EQUAL(child_seed(&p, 'v', 71), 'y'); /* its device memory untouched */
  pair_down(&p);
  unsetenv("HIXL_TEST_NO_DEVMEM_CAP");
}

static struct hixl_devmem_stats dstats(HixlEngine *e) {
  struct hixl_devmem_stats ds;
  memset(&ds, 0, sizeof(ds));
  TU_ASSERT_OK(hixl_engine_devmem_stats(e, &ds));
  return ds;
}

/* Many ops of one call on the peer's device memory: started together and waited for
 * once per 1024 (copy_many), not once each; a provider without copy_many
 * (HIXL_TEST_DEVMEM_ASYNC=0) waits once each. A copy that fails fails its op and
 * those after it, uncopied; the ones before it landed. */
#define MANY_OPS 1100
#define MANY_BAD 1050 /* in the second run of 1024 */
static void test_many_ops(void) {
  struct child_arg a = {.dev_len = 2 * DEV_LEN};
  struct pair p;
  const char *as = getenv("HIXL_TEST_DEVMEM_ASYNC");
  bool batches = !(as && strcmp(as, "0") == 0);
  HixlTransferOpDesc d[MANY_OPS];
  const size_t stride = 4352, olen = 4096 + 3; /* MANY_OPS * stride inside 2 * DEV_LEN */
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 71), 'k');
  tu_fill(p.want, p.len, 71);
  for (size_t i = 0; i < MANY_OPS; i++) /* op i: the peer's [i * stride + 1, +olen) to here, backwards */
    d[i] = (HixlTransferOpDesc){.local_addr = (uintptr_t)p.dev + (MANY_OPS - 1 - i) * stride,
                                .remote_addr = p.ci.dev + i * stride + 1,
                                .len = olen};
  memset(p.dev, 0, p.len);
  struct hixl_devmem_stats s0 = dstats(p.e), s1;
  uint64_t b0 = devmem_test_batches();
  TU_ASSERT_OK(HixlEngineTransferSync(p.e, p.ci.name, HIXL_READ, d, MANY_OPS, WAIT_MS));
  for (size_t i = 0; i < MANY_OPS; i++)
    TU_ASSERT_SAME((uint8_t *)(uintptr_t)d[i].local_addr, p.want + i * stride + 1, olen, "READ op by op");
  s1 = dstats(p.e);
  CU_ASSERT_EQUAL(s1.ipc_ops - s0.ipc_ops, MANY_OPS);
  CU_ASSERT_EQUAL(s1.ipc_bytes - s0.ipc_bytes, MANY_OPS * olen);
  CU_ASSERT_EQUAL(s1.ipc_waits - s0.ipc_waits, batches ? 2u : MANY_OPS); /* 1024 + 76 */
  CU_ASSERT_EQUAL(devmem_test_batches() - b0, batches ? 2u : 0u);
  /* WRITE back: the same ops the other way, every byte checked by the child */
  for (size_t i = 0; i < MANY_OPS; i++) d[i].remote_addr = p.ci.dev + i * stride;
  tu_fill(p.dev, p.len, 72);
  TU_ASSERT_OK(HixlEngineTransferSync(p.e, p.ci.name, HIXL_WRITE, d, MANY_OPS, WAIT_MS));
  tu_fill(p.want, p.len, 71); /* what the child holds now: its fill, with the ops' bytes over it */
  for (size_t i = 0; i < MANY_OPS; i++)
    memcpy(p.want + i * stride, p.dev + (MANY_OPS - 1 - i) * stride, olen);
  uint8_t *back = devmem_test_alloc(p.len);
  CU_ASSERT_FATAL(back != NULL);
  HixlMemHandle hb = NULL;
  HixlMemDesc bd = {.addr = (uintptr_t)back, .len = p.len};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(p.e, &bd, HIXL_MEM_DEVICE, &hb));
  TU_ASSERT_OK(xfer(&p, HIXL_READ, back, p.ci.dev, p.len));
  TU_ASSERT_SAME(back, p.want, p.len, "WRITE op by op, read back whole");
  /* op MANY_BAD fails: those before it landed, it and those after it not copied, the call FAILED with the
   * provider's why */
  for (size_t i = 0; i < MANY_OPS; i++) d[i].remote_addr = p.ci.dev + i * stride + 1;
  memset(p.dev, 0, p.len);
  s0 = dstats(p.e);
  devmem_test_fail_range(d[MANY_BAD].local_addr,
                         1); /* its side here: the peer's is mapped at another address */
  CU_ASSERT_EQUAL(HixlEngineTransferSync(p.e, p.ci.name, HIXL_READ, d, MANY_OPS, WAIT_MS), HIXL_FAILED);
  devmem_test_fail_range(0, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(HixlGetLastErrorMessage(), "the stand-in fails copies"));
  /* p.want: what the child holds since the WRITE */
  for (size_t i = 0; i < MANY_OPS; i++) {
    const uint8_t *got = (const uint8_t *)(uintptr_t)d[i].local_addr;
    if (i < MANY_BAD)
      TU_ASSERT_SAME(got, p.want + i * stride + 1, olen, "the ops before the failed one landed");
    else
      CU_ASSERT_TRUE(got[0] == 0 && memcmp(got, got + 1, olen - 1) == 0); /* not copied: still 0 */
  }
  s1 = dstats(p.e);
  CU_ASSERT_EQUAL(s1.ipc_ops - s0.ipc_ops, MANY_BAD);
  CU_ASSERT_EQUAL(s1.ipc_bytes - s0.ipc_bytes, MANY_BAD * olen);
  /* and the link goes on */
  memset(p.dev, 0, p.len);
  TU_ASSERT_OK(HixlEngineTransferSync(p.e, p.ci.name, HIXL_READ, d, MANY_OPS, WAIT_MS));
  for (size_t i = 0; i < MANY_OPS; i++)
    TU_ASSERT_SAME((uint8_t *)(uintptr_t)d[i].local_addr, p.want + i * stride + 1, olen, "READ after");
  TU_ASSERT_OK(HixlEngineDeregisterMem(p.e, hb));
  pair_down(&p);
  devmem_test_free(back);
}

/* The child deregisters its device memory while this process has it open: the
 * mapping is closed before DeregisterMem returns there; ops on it fail after. */
static void test_dereg_while_mapped(void) {
  struct child_arg a = {.dev_len = DEV_LEN};
  struct pair p;
  uint64_t d0, m0, d1, m1;
  devmem_test_d2d(&d0, &m0);
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096));
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0 + 1);
  TU_ASSERT_OK(child_call(&p, 'd'));
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* closed here before the child's DeregisterMem returned */
  HixlStatus st = xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096);
  CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS);
  printf("  [after the deregistration: %s]\n", HixlGetLastErrorMessage());
  CU_ASSERT_EQUAL(mapped(&p), 0);
  pair_down(&p);
}

/* The child is killed while a large pull runs: the request ends (SUCCESS with every
 * byte, or FAILED / TIMEOUT) within its timeout, the next op fails, the mapping goes. */
static void test_peer_killed(void) {
  struct child_arg a = {.dev_len = BIG_LEN};
  struct pair p;
  uint64_t d0, m0, d1, m1;
  devmem_test_d2d(&d0, &m0);
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 71), 'k');
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)p.dev, .remote_addr = p.ci.dev, .len = p.len};
  HixlTransferReq req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p.e, p.ci.name, HIXL_READ, &d, 1, 10000, NULL, &req));
  tu_child_kill(&p.ch, SIGKILL);
  CU_ASSERT_NOT_EQUAL(tu_child_wait(&p.ch, WAIT_MS), 0); /* reaped: killed, not exited 0 */
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  int64_t deadline = tu_now_ms() + 15000;
  tu_wait_request(p.e, req, deadline, &fin);
  CU_ASSERT(fin == HIXL_TRANSFER_COMPLETED || fin == HIXL_TRANSFER_FAILED || fin == HIXL_TRANSFER_TIMEOUT);
  CU_ASSERT(tu_now_ms() <= deadline);
  if (fin == HIXL_TRANSFER_COMPLETED) { /* it was all copied before the child died */
    tu_fill(p.want, p.len, 71);
    TU_ASSERT_SAME(p.dev, p.want, p.len, "a pull that completed before the kill");
  }
  printf("  [the pull ended %d]\n", (int)fin);
  CU_ASSERT_NOT_EQUAL(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096), HIXL_SUCCESS);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* the dead link closed it */
  memset(&p.ch, 0, sizeof(p.ch));
  pair_down(&p);
}

/* A handover forged on the wire is refused: a handle naming more memory than its
 * allocation holds, or a handle for a range that is not the registration the target
 * advertised. Connect (Transport shm) fails saying why; nothing stays open. */
static void test_forged(void) {
  static const char *forge[] = {"alloc", "addr"};
  for (int k = 0; k < 2; k++) {
    struct child_arg a = {.dev_len = DEV_LEN, .forge = forge[k]};
    struct pair p;
    uint64_t d0, m0, d1, m1;
    devmem_test_d2d(&d0, &m0);
    CU_ASSERT_FATAL(pair_up(&p, &a));
    HixlStatus st = HixlEngineConnect(p.e, p.ci.name, WAIT_MS);
    CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS);
    const char *why = HixlGetLastErrorMessage();
    CU_ASSERT(strstr(why, "SHM_DEV_MAP") != NULL);
    printf("  [%s: %s]\n", forge[k], why);
    devmem_test_d2d(&d1, &m1);
    CU_ASSERT_EQUAL(m1, m0);
    CU_ASSERT_EQUAL(d1, d0);
    pair_down(&p);
  }
}

/* A scoped target hands its device memory over only once this engine is granted all of
 * the allocation: before, nothing is opened and a READ is refused (its CPU checks the
 * grant on tcp frames); after the grant it is opened and read by d2d; revoked, it is
 * taken back. */
static void test_scoped(void) {
  struct child_arg a = {.dev_len = DEV_LEN, .scoped = true};
  struct pair p;
  uint64_t d0, m0, d1, m1;
  struct hixl_remote_mem *rms = NULL;
  size_t n = 0;
  devmem_test_d2d(&d0, &m0);
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(mapped(&p), 0);
  CU_ASSERT_NOT_EQUAL(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096), HIXL_SUCCESS);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0);
  CU_ASSERT_EQUAL(d1, d0);
  TU_ASSERT_OK(child_call(&p, 'g'));
  /* One round trip: the handover the grant sent is read before its answer. */
  TU_ASSERT_OK(hixl_engine_remote_mems(p.e, p.ci.name, WAIT_MS, &rms, &n));
  free(rms);
  CU_ASSERT_EQUAL(mapped(&p), 1);
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 81), 'k');
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, p.len));
  tu_fill(p.want, p.len, 81);
  TU_ASSERT_SAME(p.dev, p.want, p.len, "scoped: a granted allocation read by d2d");
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(d1 - d0, p.len);
  CU_ASSERT_EQUAL(m1, m0 + 1);
  /* The revoke returns only once this process closed the mapping (no round trip
   * first), its copy running ended: a READ of the whole allocation is in flight. */
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)p.dev, .remote_addr = p.ci.dev, .len = p.len};
  HixlTransferReq req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p.e, p.ci.name, HIXL_READ, &d, 1, WAIT_MS, NULL, &req));
  TU_ASSERT_OK(child_call(&p, 'r'));
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* taken back before the revoke returned */
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  tu_wait_request(p.e, req, tu_now_ms() + WAIT_MS, &fin);
  CU_ASSERT(fin == HIXL_TRANSFER_COMPLETED || fin == HIXL_TRANSFER_FAILED); /* copied whole, or refused */
  if (fin == HIXL_TRANSFER_COMPLETED)
    TU_ASSERT_SAME(p.dev, p.want, p.len, "a READ that ended before the revoke");
  printf("  [the READ in flight at the revoke ended %d]\n", (int)fin);
  CU_ASSERT_NOT_EQUAL(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096), HIXL_SUCCESS);
  /* Granted again, and revoked from inside the child's service handler: it cannot wait
   * there (the progress thread reads the answer) and does not deadlock; the recall is
   * on the link ahead of the call's answer, so the mapping is closed here by then. */
  TU_ASSERT_OK(child_call(&p, 'g'));
  rms = NULL;
  TU_ASSERT_OK(hixl_engine_remote_mems(p.e, p.ci.name, WAIT_MS, &rms, &n));
  free(rms);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0 + 1);
  uint32_t rst = UINT32_MAX;
  size_t rlen = 0;
  TU_ASSERT_OK(hixl_engine_call(p.e, p.ci.name, SVC_REVOKE, "r", 1, &rst, sizeof(rst), &rlen, WAIT_MS));
  CU_ASSERT_EQUAL(rlen, 4);
  CU_ASSERT_EQUAL(rst, HIXL_SUCCESS);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0);
  CU_ASSERT_NOT_EQUAL(xfer(&p, HIXL_READ, p.dev, p.ci.dev, 4096), HIXL_SUCCESS);
  /* Revoked and granted back at once in the handler: the grant comes while this process
   * still holds the recalled mapping; once it let go, the allocation is handed over
   * again (one round trip: its handover is read before the answer), and read by d2d. */
  TU_ASSERT_OK(child_call(&p, 'g'));
  rms = NULL;
  TU_ASSERT_OK(hixl_engine_remote_mems(p.e, p.ci.name, WAIT_MS, &rms, &n));
  free(rms);
  CU_ASSERT_EQUAL(mapped(&p), 1);
  rst = UINT32_MAX;
  TU_ASSERT_OK(hixl_engine_call(p.e, p.ci.name, SVC_REVOKE, "b", 1, &rst, sizeof(rst), &rlen, WAIT_MS));
  CU_ASSERT_EQUAL(rst, HIXL_SUCCESS);
  rms = NULL;
  TU_ASSERT_OK(hixl_engine_remote_mems(p.e, p.ci.name, WAIT_MS, &rms, &n));
  free(rms);
  CU_ASSERT_EQUAL(mapped(&p), 1);
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 83), 'k');
  uint64_t d2;
  devmem_test_d2d(&d1, &m1);
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, p.len));
  tu_fill(p.want, p.len, 83);
  TU_ASSERT_SAME(p.dev, p.want, p.len, "scoped: granted back during its recall, read by d2d");
  devmem_test_d2d(&d2, &m1);
  CU_ASSERT_EQUAL(d2 - d1, p.len);
  pair_down(&p);
}

/* A scoped target told to hand device memory to same-host peers whole (as the plugin
 * does: same-host peers are not scoped) hands it over at Connect with nothing granted;
 * it is read and written by d2d, every byte counted in hixl_engine_devmem_stats. The
 * choice is made before registering memory, and refused after. */
static void test_scoped_devmap_whole(void) {
  struct child_arg a = {.dev_len = DEV_LEN, .scoped = true, .devmap_whole = true};
  struct pair p;
  uint64_t d0, m0, d1, m1;
  devmem_test_d2d(&d0, &m0);
  CU_ASSERT_FATAL(pair_up(&p, &a));
  CU_ASSERT_EQUAL(hixl_engine_set_devmap_scoped(p.e, false), HIXL_PARAM_INVALID); /* registered already */
  printf("  [%s]\n", HixlGetLastErrorMessage());
  CU_ASSERT_EQUAL(hixl_engine_devmem_stats(p.e, NULL), HIXL_PARAM_INVALID);
  CU_ASSERT_NOT_EQUAL(hixl_engine_set_devmap_scoped(NULL, false), HIXL_SUCCESS);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(mapped(&p), 1); /* nothing granted, handed over all the same */
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 91), 'k');
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, p.len));
  tu_fill(p.want, p.len, 91);
  TU_ASSERT_SAME(p.dev, p.want, p.len, "unscoped handover: read by d2d");
  tu_fill(p.dev, 4096, 92);
  TU_ASSERT_OK(xfer(&p, HIXL_WRITE, p.dev, p.ci.dev, 4096));
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(d1 - d0, p.len + 4096);
  CU_ASSERT_EQUAL(m1, m0 + 1);
  CU_ASSERT_EQUAL(ipc_bytes(p.e), p.len + 4096);
  pair_down(&p);
}

/* The peer's allocation is opened (and closed) in the context of the device this side's
 * device memory is on (3 here, the peer's on 0), not device 0's; copies run there. */
static void test_local_device(void) {
  struct child_arg a = {.dev_len = DEV_LEN};
  struct pair p;
  int od = -2, cd = -2;
  setenv("HIXL_TEST_DEVMEM_DEVICE", "3", 1); /* no engine thread runs yet */
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  devmem_test_ipc_devices(&od, &cd);
  CU_ASSERT_EQUAL(od, 3);
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 95), 'k');
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, p.len));
  tu_fill(p.want, p.len, 95);
  TU_ASSERT_SAME(p.dev, p.want, p.len, "read by d2d on device 3");
  pair_down(&p);
  devmem_test_ipc_devices(&od, &cd);
  CU_ASSERT_EQUAL(cd, 3); /* closed in the context it was opened in */
  unsetenv("HIXL_TEST_DEVMEM_DEVICE");
}

/* ---- the other way round: this process the scoped target, the child maps its memory ---- */

/* The child as an initiator: a shm engine with host memory. Ready: its name. Commands:
 * 'm' name (TU_ADDR_LEN): connect to that engine, answer the status (u32); 'c': one
 * round trip to it, answer the peer mappings open in this process (u32); 'x' addr
 * (u64): READ 4096 bytes of the target's memory there, answer the status (u32). */
static int initiator_main(void *argp, int ready_fd, int ctl_fd) {
  char name[TU_ADDR_LEN], peer[TU_ADDR_LEN] = "";
  (void)argp;
  tu_addr(name, sizeof(name), tu_free_port());
  HixlEngine *e = tu_engine_start_opts(name, "shm", NULL, 0);
  uint8_t *host = malloc(HOST_LEN);
  HixlMemHandle hh = NULL;
  HixlMemDesc h = {.addr = (uintptr_t)host, .len = HOST_LEN};
  if (!e || !host || HixlEngineRegisterMem(e, &h, HIXL_MEM_HOST, &hh) != HIXL_SUCCESS) return 2;
  if (write(ready_fd, name, sizeof(name)) != (ssize_t)sizeof(name)) return 3;
  for (char cmd; read(ctl_fd, &cmd, 1) == 1;) {
    uint32_t st = UINT32_MAX;
    uint64_t at = 0, bytes = 0, maps = 0;
    struct hixl_remote_mem *rms = NULL;
    size_t n = 0;
    if (cmd == 'm') {
      if (read(ctl_fd, peer, sizeof(peer)) != (ssize_t)sizeof(peer)) return 4;
      peer[sizeof(peer) - 1] = '\0';
      st = (uint32_t)HixlEngineConnect(e, peer, WAIT_MS);
    } else if (cmd == 'c') {
      if (hixl_engine_remote_mems(e, peer, WAIT_MS, &rms, &n) == HIXL_SUCCESS) free(rms);
      devmem_test_d2d(&bytes, &maps);
      st = (uint32_t)maps;
    } else if (cmd == 'x') {
      if (read(ctl_fd, &at, 8) != 8) return 5;
      HixlTransferOpDesc d = {.local_addr = (uintptr_t)host, .remote_addr = at, .len = 4096};
      st = (uint32_t)HixlEngineTransferSync(e, peer, HIXL_READ, &d, 1, WAIT_MS);
    } else {
      return 6;
    }
    if (write(ready_fd, &st, 4) != 4) return 7;
  }
  HixlEngineFinalize(e);
  HixlEngineDestroy(e);
  free(host);
  return 0;
}

static uint32_t initiator_cmd(tu_child *ch, char cmd, const void *arg, size_t len) {
  uint32_t st = UINT32_MAX;
  CU_ASSERT_EQUAL(tu_child_write(ch, &cmd, 1), 0);
  if (len) CU_ASSERT_EQUAL(tu_child_write(ch, arg, len), 0);
  CU_ASSERT_EQUAL(tu_child_read(ch, &st, 4, WAIT_MS), 0);
  return st;
}

/* The child connects to the target t (named tname) and is granted all of its device
 * memory [dev, +len): it maps it (one mapping open there). */
static void initiator_maps(tu_child *ch, HixlEngine *t, const char *tname, const char *cname,
                           const uint64_t (*range)[2]) {
  TU_ASSERT_OK((HixlStatus)initiator_cmd(ch, 'm', tname, TU_ADDR_LEN));
  TU_ASSERT_OK(hixl_engine_grant(t, cname, range, 1));
  CU_ASSERT_EQUAL(initiator_cmd(ch, 'c', NULL, 0), 1);
}

struct revoker {
  HixlEngine *e;
  const char *peer;
  const uint64_t (*range)[2];
  int started; /* atomic: the revoke is about to be called */
  HixlStatus st;
  int64_t ms; /* how long it took */
};

static void *revoker_main(void *arg) {
  struct revoker *r = arg;
  int64_t t0 = tu_now_ms();
  __atomic_store_n(&r->started, 1, __ATOMIC_RELEASE);
  r->st = hixl_engine_revoke(r->e, r->peer, r->range, 1);
  r->ms = tu_now_ms() - t0;
  return NULL;
}

/* A peer that never answers a revoke's recall (stopped with SIGSTOP while it maps the
 * allocation): the revoke waits for it at most HIXL_DEFAULT_TIMEOUT_MS, then cuts it
 * off and returns; the peer's next op fails. And Finalize while a revoke waits so: both
 * return, neither hangs. */
static void test_recall_unanswered(void) {
  tu_child ch;
  char cname[TU_ADDR_LEN], tname[TU_ADDR_LEN];
  CU_ASSERT_FATAL(tu_child_start(&ch, initiator_main, NULL) == 0);
  CU_ASSERT_FATAL(tu_child_read(&ch, cname, sizeof(cname), WAIT_MS) == 0);
  cname[sizeof(cname) - 1] = '\0';
  tu_addr(tname, sizeof(tname), tu_free_port());
  HixlEngine *t = tu_engine_start_opts(tname, "shm", NULL, 0);
  uint8_t *dev = devmem_test_alloc(DEV_LEN);
  HixlMemHandle hd = NULL;
  HixlMemDesc d = {.addr = (uintptr_t)dev, .len = DEV_LEN};
  CU_ASSERT_FATAL(t && dev);
  TU_ASSERT_OK_FATAL(hixl_engine_set_scoped(t, true));
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(t, &d, HIXL_MEM_DEVICE, &hd));
  const uint64_t range[1][2] = {{(uintptr_t)dev, DEV_LEN}};
  initiator_maps(&ch, t, tname, cname, range);

  tu_child_kill(&ch, SIGSTOP);
  CU_ASSERT_FATAL(tu_child_wait_stopped(&ch, WAIT_MS) == 0);
  int64_t t0 = tu_now_ms();
  TU_ASSERT_OK(hixl_engine_revoke(t, cname, range, 1));
  int64_t took = tu_now_ms() - t0;
  printf("  [the revoke returned after %lld ms, the peer cut off]\n", (long long)took);
  CU_ASSERT(took >= HIXL_DEFAULT_TIMEOUT_MS - 50);  /* it waited for the answer that did not come ... */
  CU_ASSERT(took < HIXL_DEFAULT_TIMEOUT_MS + 4000); /* ... and no longer than its bound */
  tu_child_kill(&ch, SIGCONT);
  uint64_t at = (uintptr_t)dev;
  CU_ASSERT_NOT_EQUAL(initiator_cmd(&ch, 'x', &at, 8), HIXL_SUCCESS); /* its link was cut */

  /* Mapped again (a new link), stopped again; Finalize while a revoke waits for it. */
  initiator_maps(&ch, t, tname, cname, range);
  tu_child_kill(&ch, SIGSTOP);
  CU_ASSERT_FATAL(tu_child_wait_stopped(&ch, WAIT_MS) == 0);
  struct revoker rv = {.e = t, .peer = cname, .range = range, .st = HIXL_FAILED};
  pthread_t th;
  CU_ASSERT_FATAL(pthread_create(&th, NULL, revoker_main, &rv) == 0);
  while (!__atomic_load_n(&rv.started, __ATOMIC_ACQUIRE)) sched_yield();
  t0 = tu_now_ms();
  TU_ASSERT_OK(HixlEngineFinalize(t)); /* the revoke waits a second for the stopped peer: this lands inside */
  took = tu_now_ms() - t0;
  pthread_join(th, NULL);
  printf("  [Finalize returned after %lld ms, the revoke after %lld ms: %s]\n", (long long)took,
         (long long)rv.ms, HixlStatusName(rv.st));
  CU_ASSERT(took < HIXL_DEFAULT_TIMEOUT_MS + 4000);
  CU_ASSERT(rv.ms < HIXL_DEFAULT_TIMEOUT_MS + 4000);
  CU_ASSERT(rv.st == HIXL_SUCCESS || rv.st == HIXL_NOT_CONNECTED || rv.st == HIXL_FAILED);
  tu_child_kill(&ch, SIGCONT);
  CU_ASSERT_EQUAL(tu_child_stop(&ch, WAIT_MS), 0);
  HixlEngineDestroy(t);
  devmem_test_free(dev);
}

/* One op of BIG_LEN (64 MiB) on the peer's device memory, device memory here: its 64
 * chunks are one copy, in one step (a device op counts for a sixteenth of its bytes
 * against a step's 16 MiB: ESHM_DEV_WEIGHT), waited for once; every byte checked both
 * ways. */
static void test_big_op(void) {
  struct child_arg a = {.dev_len = BIG_LEN};
  struct pair p;
  CU_ASSERT_FATAL(pair_up(&p, &a));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(p.e, p.ci.name, WAIT_MS));
  CU_ASSERT_EQUAL(child_seed(&p, 'f', 81), 'k');
  tu_fill(p.want, p.len, 81);
  memset(p.dev, 0, p.len);
  struct hixl_devmem_stats s0 = dstats(p.e), s1;
  TU_ASSERT_OK(xfer(&p, HIXL_READ, p.dev, p.ci.dev, p.len));
  TU_ASSERT_SAME(p.dev, p.want, p.len, "one 64 MiB READ");
  s1 = dstats(p.e);
  CU_ASSERT_EQUAL(s1.ipc_bytes - s0.ipc_bytes, BIG_LEN);
  CU_ASSERT_EQUAL(s1.ipc_ops - s0.ipc_ops, 1);
  CU_ASSERT_EQUAL(s1.ipc_waits - s0.ipc_waits, 1);
  tu_fill(p.dev, p.len, 82);
  TU_ASSERT_OK(xfer(&p, HIXL_WRITE, p.dev, p.ci.dev, p.len));
  CU_ASSERT_EQUAL(child_seed(&p, 'v', 82), 'y'); /* the child checks every byte */
  s0 = dstats(p.e);
  CU_ASSERT_EQUAL(s0.ipc_ops - s1.ipc_ops, 1);
  CU_ASSERT_EQUAL(s0.ipc_waits - s1.ipc_waits, 1);
  pair_down(&p);
}

static CU_TestInfo tests[] = {
    {"pull and push device memory between processes over shm by IPC handle: d2d, byte for byte",
     test_pull_push},
    {"1100 ops of one call on the peer's device memory: waited for once per 1024 (copy_many); a failed copy "
     "fails its op and those after it, the ones before landed",
     test_many_ops},
    {"one op of 64 MiB: its chunks one copy, one step, one wait; byte for byte both ways", test_big_op},
    {"the target deregisters device memory mapped here: closed before its call returns",
     test_dereg_while_mapped},
    {"the target killed mid-pull: the request ends in time, the next op fails, the mapping closes",
     test_peer_killed},
    {"a forged handover (handle past its allocation, range not the registration): refused", test_forged},
    {"an initiator without WIRE_CAP_DEVMEM (an older engine's HELLO) asking for device mappings: none handed "
     "over, the link serves host memory",
     test_no_devmem_cap},
    {"a scoped target hands over only a granted allocation; a revoke returns once it is closed here (from "
     "a service handler: sent, no deadlock)",
     test_scoped},
    {"a scoped target with device memory unscoped for same-host peers hands it over at Connect",
     test_scoped_devmap_whole},
    {"the peer's allocation opened in the context of this side's device, not device 0's", test_local_device},
    {"a peer that never answers a revoke's recall is cut off in time; Finalize while a revoke waits",
     test_recall_unanswered},
    CU_TEST_INFO_NULL};
static CU_SuiteInfo suites[] = {
    {"device memory over shm by IPC, host stand-in", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};

int main(void) {
  setenv("HIXL_TEST_DEVMEM", "host", 1); /* before the provider is first looked for */
  return tu_run_suites("test_devmem_ipc", suites);
}
