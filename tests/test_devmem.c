/* test_devmem: device memory (docs/device-memory.md). Run twice by CTest:
 *   test_devmem        no provider set: on a host without a CUDA driver (or a build
 *                      without cuda.h) HIXL_MEM_DEVICE is refused UNSUPPORTED with a
 *                      sentence, and host memory works as before;
 *   test_devmem_host   HIXL_TEST_DEVMEM=host: the test builds' stand-in provider treats
 *                      host memory as device 0's, so every device path runs here: the
 *                      memory table's kind, host bounce buffers both ways on both ends,
 *                      multi-chunk ops, the refusals (staged, shm), a peer lost mid-transfer;
 *                      its copies asynchronous, on a stream per link;
 *   test_devmem_host_sync  the same with HIXL_TEST_DEVMEM_ASYNC=0: a provider without
 *                      streams, whose copies the engine makes one after another.
 * Engines on 127.0.0.1 (the guest's rxe address there), one process, Transport tcp
 * (rdma in the soft-RoCE guest) unless a test says otherwise. */
#include <CUnit/Basic.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "hixl/hixl_cs.h"
#include "hixl/hixl_engine.h"
#include "raw_auth.h"
#include "test_util.h"

#define DEV_LEN  (4u << 20) /* each engine's "device" region: several 1 MiB chunks */
#define HOST_LEN (4u << 20) /* ... and its host region */

struct side {
  HixlEngine *e;
  char name[TU_ADDR_LEN];
  uint8_t *dev, *host;
  HixlMemHandle hd, hh;
};

static void assert_pool_back(const char *what);

static bool host_provider(void) {
  const char *t = getenv("HIXL_TEST_DEVMEM");
  return t && strcmp(t, "host") == 0;
}

/* An engine (transport) with a device and a host region registered; shm links two
 * engines of one process only when they authenticate: a key then. false: it could not. */
static bool side_up(struct side *s, const char *transport) {
  memset(s, 0, sizeof(*s));
  tu_addr(s->name, sizeof(s->name), tu_free_port());
  HixlOption key = {"AuthKeyFile", tu_key_file()};
  s->e = tu_engine_start_opts(s->name, transport, &key, strcmp(transport, "shm") == 0 ? 1 : 0);
  s->dev = tu_alloc_mem(DEV_LEN, false);
  s->host = tu_alloc_mem(HOST_LEN, false);
  if (!s->e || !s->dev || !s->host) return false;
  HixlMemDesc d = {.addr = (uintptr_t)s->dev, .len = DEV_LEN},
              h = {.addr = (uintptr_t)s->host, .len = HOST_LEN};
  return HixlEngineRegisterMem(s->e, &d, HIXL_MEM_DEVICE, &s->hd) == HIXL_SUCCESS &&
         HixlEngineRegisterMem(s->e, &h, HIXL_MEM_HOST, &s->hh) == HIXL_SUCCESS;
}

static void side_down(struct side *s) {
  if (s->e) {
    HixlEngineFinalize(s->e);
    HixlEngineDestroy(s->e);
  }
  tu_free_mem(s->dev, DEV_LEN);
  tu_free_mem(s->host, HOST_LEN);
  memset(s, 0, sizeof(*s));
}

/* ---- no provider ---- */

/* Without a driver: device memory refused UNSUPPORTED with a sentence, by the engine
 * and the cache manager; host memory as before. With one (a GPU host, where
 * run-gpu-checks.sh runs this too): host memory said to be device memory is refused
 * PARAM_INVALID, the driver saying what it is. */
static void test_no_driver(void) {
  HixlEngine *e = NULL;
  char name[TU_ADDR_LEN], dwhy[256] = "";
  uint8_t *buf = tu_alloc_mem(4096, false);
  HixlMemHandle h = NULL;
  bool driver = devmem_get(dwhy, sizeof(dwhy)) != NULL;
  HixlStatus want = tu_device_refusal();
  tu_addr(name, sizeof(name), tu_free_port());
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(e, name, NULL, 0));
  HixlMemDesc d = {.addr = (uintptr_t)buf, .len = 4096};
  TU_ASSERT_STATUS(HixlEngineRegisterMem(e, &d, HIXL_MEM_DEVICE, &h), want);
  const char *why = HixlGetLastErrorMessage();
  if (driver) {
    CU_ASSERT(strstr(why, "not CUDA device memory") != NULL);
  } else {
    CU_ASSERT(strstr(why, "device memory") != NULL);
    CU_ASSERT(strstr(why, "libcuda.so.1") != NULL || strstr(why, "no accelerator backend") != NULL);
  }
  printf("  [%s]\n", why);
  CU_ASSERT_PTR_NULL(h);
  /* The cache manager's device placement likewise. */
  HixlCacheManager *m = NULL;
  uint64_t id = 0;
  uintptr_t addr = (uintptr_t)buf;
  HixlCacheDesc cd = {
      .num_tensors = 1, .elem_size = 1, .num_dims = 1, .shape = {4}, .placement = HIXL_CACHE_DEVICE};
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(e, 7, &m));
  TU_ASSERT_STATUS(HixlCacheManagerRegisterCache(m, &cd, &addr, 1, NULL, 0, HIXL_CACHE_ACCESS_DEFAULT, &id),
                   want);
  CU_ASSERT(strstr(HixlGetLastErrorMessage(), driver ? "not CUDA device memory" : "device memory") != NULL);
  TU_ASSERT_OK(HixlCacheManagerDestroy(m));
  TU_ASSERT_OK(HixlEngineRegisterMem(e, &d, HIXL_MEM_HOST, &h)); /* the same range, as host memory */
  TU_ASSERT_OK(HixlEngineDeregisterMem(e, h));
  HixlEngineFinalize(e);
  HixlEngineDestroy(e);
  tu_free_mem(buf, 4096);
}

/* The driver entry points the device tests call themselves, from lib; false unless all. */
struct cu_fns {
  int (*init)(unsigned);
  int (*retain)(void **, int);
  int (*push)(void *);
  int (*pop)(void **);
  int (*alloc)(unsigned long long *, size_t);
  int (*release)(unsigned long long);
  int (*dtoh)(void *, unsigned long long, size_t);
};

static bool cu_fns_load(void *lib, struct cu_fns *f) {
  f->init = (int (*)(unsigned))dlsym(lib, "cuInit");
  f->retain = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
  f->push = (int (*)(void *))dlsym(lib, "cuCtxPushCurrent_v2");
  f->pop = (int (*)(void **))dlsym(lib, "cuCtxPopCurrent_v2");
  f->alloc = (int (*)(unsigned long long *, size_t))dlsym(lib, "cuMemAlloc_v2");
  f->release = (int (*)(unsigned long long))dlsym(lib, "cuMemFree_v2");
  f->dtoh = (int (*)(void *, unsigned long long, size_t))dlsym(lib, "cuMemcpyDtoH_v2");
  return f->init && f->retain && f->push && f->pop && f->alloc && f->release && f->dtoh;
}

/* With a CUDA driver (the fake one in fakecuda_test_devmem, whose device memory faults
 * when the CPU touches it, as a GPU's does; the GPU's own in the GPU run): cuMemAlloc'd
 * memory registered as HIXL_MEM_HOST is refused PARAM_INVALID, naming HIXL_MEM_DEVICE,
 * and nothing is registered; as HIXL_MEM_DEVICE it registers, and host memory as host
 * memory still does. Before, it registered as host memory and a peer's WRITE into it
 * was received there by this CPU: the process died (SIGSEGV on the fake). Likewise an
 * op whose local range is device memory never registered (hixl takes unregistered
 * memory for host memory, and stages it through this CPU): refused PARAM_INVALID before
 * anything is sent; before, the WRITE's send failed EFAULT and took the link down, and
 * the READ's answer was copied into device memory by the CPU (SIGSEGV). Without a driver
 * there is nothing to try. */
static void test_device_as_host(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    CU_PASS("no CUDA driver here: nothing to register");
    return;
  }
  struct cu_fns cu;
  void *ctx = NULL;
  unsigned long long dev = 0;
  if (!cu_fns_load(lib, &cu) || cu.init(0) != 0 || cu.retain(&ctx, 0) != 0 || cu.push(ctx) != 0) {
    CU_PASS("the CUDA driver does not start here (no device): nothing to register");
    return;
  }
  CU_ASSERT_FATAL(cu.alloc(&dev, 1u << 20) == 0);
  HixlEngine *e = NULL;
  char name[TU_ADDR_LEN];
  uint8_t *buf = tu_alloc_mem(8192, false);
  HixlMemHandle h = NULL;
  tu_addr(name, sizeof(name), tu_free_port());
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(e, name, NULL, 0));
  HixlMemDesc d = {.addr = (uintptr_t)dev + 4096, .len = 8192};
  TU_ASSERT_STATUS(HixlEngineRegisterMem(e, &d, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("HIXL_MEM_DEVICE");
  printf("  [%s]\n", HixlGetLastErrorMessage());
  CU_ASSERT_PTR_NULL(h);
  HixlMemDesc tail = {.addr = (uintptr_t)dev + (1u << 20) - 100, .len = 100}; /* its last bytes */
  TU_ASSERT_STATUS(HixlEngineRegisterMem(e, &tail, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  TU_ASSERT_OK(HixlEngineRegisterMem(e, &d, HIXL_MEM_DEVICE, &h));
  TU_ASSERT_OK(HixlEngineDeregisterMem(e, h));
  HixlMemDesc hd = {.addr = (uintptr_t)buf, .len = 8192};
  TU_ASSERT_OK(HixlEngineRegisterMem(e, &hd, HIXL_MEM_HOST, &h));
  /* Unregistered device memory as an op's local range, to a peer's host memory. */
  char tn[TU_ADDR_LEN];
  HixlEngine *t = tu_engine_start_opts(tu_addr(tn, sizeof(tn), tu_free_port()), "tcp", NULL, 0);
  uint8_t *tmem = tu_alloc_mem(8192, false);
  CU_ASSERT_FATAL(t && tmem && tu_register(t, tmem, 8192));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(e, tn, 5000));
  tu_fill(tmem, 8192, 701);
  for (int k = 0; k < 2; k++) {
    HixlTransferOpDesc op = {.local_addr = (uintptr_t)dev + 64, .remote_addr = (uintptr_t)tmem, .len = 100};
    TU_ASSERT_STATUS(HixlEngineTransferSync(e, tn, k ? HIXL_READ : HIXL_WRITE, &op, 1, 5000),
                     HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("HIXL_MEM_DEVICE");
  }
  TU_ASSERT_PATTERN(tmem, 8192, 701, "the peer's memory an op from unregistered device memory aimed at");
  HixlTransferOpDesc ok = {.local_addr = (uintptr_t)buf, .remote_addr = (uintptr_t)tmem, .len = 100};
  TU_ASSERT_OK(HixlEngineTransferSync(e, tn, HIXL_READ, &ok, 1, 5000)); /* the link serves on */
  TU_ASSERT_PATTERN(buf, 100, 701, "a READ after the refusals");
  HixlEngineFinalize(t);
  HixlEngineDestroy(t);
  tu_free_mem(tmem, 8192);
  TU_ASSERT_OK(HixlEngineDeregisterMem(e, h));
  HixlEngineFinalize(e);
  HixlEngineDestroy(e);
  tu_free_mem(buf, 8192);
  CU_ASSERT(cu.release(dev) == 0);
  cu.pop(&ctx);
}

/* With a CUDA driver that can be told to fault (the fake's fakecuda_test_fault; not a
 * GPU's): copy_many of three copies into device memory, the first faulting on its
 * stream after it started (nothing lands), which breaks the context, so the second's
 * start fails (CUDA's sticky error) and the wait fails. A copy that fails only when
 * waited for fails them all: *bad 0, not 1, which said the first had landed. */
static void test_many_fault(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void (*fault)(long) = lib ? (void (*)(long))dlsym(lib, "fakecuda_test_fault") : NULL;
  char why[256] = "";
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  if (!fault || !dm || strcmp(dm->name, "cuda") != 0) {
    CU_PASS("no fake CUDA driver here: nothing can be told to fault");
    return;
  }
  struct cu_fns cu;
  void *ctx = NULL;
  unsigned long long dev = 0;
  CU_ASSERT_FATAL(cu_fns_load(lib, &cu) && cu.init(0) == 0 && cu.retain(&ctx, 0) == 0 && cu.push(ctx) == 0);
  CU_ASSERT_FATAL(cu.alloc(&dev, 3 * 4096) == 0);
  uint8_t *host = tu_alloc_mem(3 * 4096, false), *back = tu_alloc_mem(3 * 4096, false);
  CU_ASSERT_FATAL(host && back);
  tu_fill(host, 3 * 4096, 731);
  struct devmem_copy v[3];
  for (int i = 0; i < 3; i++)
    v[i] = (struct devmem_copy){.dst = dev + (uint64_t)i * 4096,
                                .src = (uintptr_t)host + (uint64_t)i * 4096,
                                .n = 4096,
                                .ddev = 0,
                                .sdev = -1};
  size_t bad = 99;
  struct devmem_many ms;
  fault(0); /* the next copy started faults when it runs */
  TU_ASSERT_STATUS(devmem_copy_many(dm, v, 3, &bad, &ms, why, sizeof(why)), HIXL_FAILED);
  printf("  [bad %zu: %s]\n", bad, why);
  CU_ASSERT_EQUAL(bad, 0); /* before: 1, as if the first had landed */
  fault(-1);
  CU_ASSERT_FATAL(cu.dtoh(back, dev, 4096) == 0);
  CU_ASSERT(memcmp(back, host, 4096) != 0);                              /* it did not land */
  TU_ASSERT_OK(devmem_copy_many(dm, v, 3, &bad, &ms, why, sizeof(why))); /* mended: all land */
  CU_ASSERT_EQUAL(bad, 3);
  CU_ASSERT_FATAL(cu.dtoh(back, dev, 3 * 4096) == 0);
  TU_ASSERT_PATTERN(back, 3 * 4096, 731, "three copies after the fault was mended");
  tu_free_mem(host, 3 * 4096);
  tu_free_mem(back, 3 * 4096);
  CU_ASSERT(cu.release(dev) == 0);
  cu.pop(&ctx);
}

/* ---- the provider's IPC (same host, two processes), host stand-in ---- */

#define IPC_LEN (1u << 20)

/* The child: "device" memory from the stand-in's IPC allocator, filled (seed 901), a
 * handle for [4096, IPC_LEN - 4096) of it sent up; on 'c' it answers whether the first
 * 4096 bytes of that range now hold the parent's (seed 902). */
static int ipc_child(void *arg, int ready_fd, int ctl_fd) {
  (void)arg;
  char why[256] = "", cmd = 0, ok = 0;
  struct devmem_ipc h;
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  uint8_t *d = devmem_test_alloc(IPC_LEN), *want = malloc(4096);
  if (!dm || !d || !want) return 2;
  tu_fill(d, IPC_LEN, 901);
  tu_fill(want, 4096, 902);
  if (dm->ipc_export((uintptr_t)d + 4096, IPC_LEN - 8192, 0, &h, why, sizeof(why)) != HIXL_SUCCESS) return 3;
  if (write(ready_fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) return 4;
  if (read(ctl_fd, &cmd, 1) != 1 || cmd != 'c') return 5;
  ok = memcmp(d + 4096, want, 4096) == 0 ? 'y' : 'n';
  if (write(ready_fd, &ok, 1) != 1) return 6;
  if (read(ctl_fd, &cmd, 1) != 0) return 7; /* EOF: quit */
  devmem_test_free(d);
  free(want);
  return 0;
}

/* Another process's "device" memory opened by its handle, read and written device to
 * device byte for byte (the d2d count says that path ran), the mapping closed; forged
 * handles (a range past the allocation, an allocation longer than what it names, not
 * the stand-in's, a descriptor that is not there) refused; memory from elsewhere is not
 * exported. */
static void test_ipc_provider(void) {
  char why[256] = "";
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  CU_ASSERT_PTR_NOT_NULL_FATAL(dm);
  tu_child ch;
  struct devmem_ipc h, f;
  uint64_t base = 0, d0, m0, d1, m1;
  uint8_t *mine = devmem_test_alloc(IPC_LEN), *want = malloc(IPC_LEN);
  CU_ASSERT_FATAL(mine != NULL && want != NULL);
  CU_ASSERT_EQUAL_FATAL(tu_child_start(&ch, ipc_child, NULL), 0);
  CU_ASSERT_EQUAL_FATAL(tu_child_read(&ch, &h, sizeof(h), 10000), 0);
  CU_ASSERT_EQUAL(h.alloc_len, IPC_LEN);
  CU_ASSERT_EQUAL(h.offset, 4096);
  CU_ASSERT_EQUAL(h.len, IPC_LEN - 8192);
  devmem_test_d2d(&d0, &m0);
  TU_ASSERT_OK_FATAL(dm->ipc_open(&h, 0, &base, why, sizeof(why)));
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0 + 1);
  TU_ASSERT_OK(dm->d2d((uintptr_t)mine, 0, base + h.offset, 0, h.len, why, sizeof(why)));
  tu_fill(want, IPC_LEN, 901);
  TU_ASSERT_SAME(mine, want + 4096, h.len, "the peer's device memory read device to device");
  tu_fill(mine, 4096, 902);
  TU_ASSERT_OK(dm->d2d(base + h.offset, 0, (uintptr_t)mine, 0, 4096, why, sizeof(why)));
  char cmd = 'c', ok = 0;
  CU_ASSERT_EQUAL(tu_child_write(&ch, &cmd, 1), 0);
  CU_ASSERT_EQUAL(tu_child_read(&ch, &ok, 1, 10000), 0);
  CU_ASSERT_EQUAL(ok, 'y'); /* the child sees the parent's bytes in its own memory */
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(d1 - d0, h.len + 4096);
  dm->ipc_close(base, h.alloc_len, 0);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0);
  /* forged handles: refused before anything is mapped */
  f = h, f.offset = h.alloc_len;
  TU_ASSERT_STATUS(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_PARAM_INVALID);
  printf("  [%s]\n", why);
  f = h, f.len = h.alloc_len; /* offset 4096 + the whole allocation */
  TU_ASSERT_STATUS(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_PARAM_INVALID);
  f = h, f.offset = UINT64_MAX - 10, f.len = 20; /* wraps */
  TU_ASSERT_STATUS(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_PARAM_INVALID);
  f = h, f.alloc_len = 2 * h.alloc_len, f.len = h.alloc_len; /* more than the memfd holds */
  TU_ASSERT_STATUS(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_PARAM_INVALID);
  printf("  [%s]\n", why);
  f = h, f.blob[0] ^= 0xff; /* not the stand-in's */
  TU_ASSERT_STATUS(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_PARAM_INVALID);
  f = h, f.blob[12] = 0x7f; /* a descriptor it does not have */
  CU_ASSERT_NOT_EQUAL(dm->ipc_open(&f, 0, &base, why, sizeof(why)), HIXL_SUCCESS);
  devmem_test_d2d(&d1, &m1);
  CU_ASSERT_EQUAL(m1, m0); /* nothing left mapped */
  /* memory not from an IPC-able allocation is not exported */
  TU_ASSERT_STATUS(dm->ipc_export((uintptr_t)want, 4096, 0, &f, why, sizeof(why)), HIXL_UNSUPPORTED);
  printf("  [%s]\n", why);
  TU_ASSERT_STATUS(dm->ipc_export((uintptr_t)mine + IPC_LEN - 10, 20, 0, &f, why, sizeof(why)),
                   HIXL_UNSUPPORTED); /* runs past its allocation */
  TU_ASSERT_STATUS(dm->ipc_export((uintptr_t)mine, 0, 0, &f, why, sizeof(why)), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(tu_child_stop(&ch, 10000), 0);
  devmem_test_free(mine);
  free(want);
}

/* The stand-in's dma-buf (what an RDMA device registers for GPUDirect): made by the
 * kernel's udmabuf over its memfd, whole pages around the range, *offset the range's
 * first byte in it, which the dma-buf's own mapping shows (where /dev/udmabuf is; else
 * UNSUPPORTED saying so); memory not from devmem_test_alloc is refused. */
static void test_dmabuf_provider(void) {
  char why[256] = "";
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  CU_ASSERT_PTR_NOT_NULL_FATAL(dm);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t *mine = devmem_test_alloc(IPC_LEN), *plain = malloc(IPC_LEN);
  CU_ASSERT_FATAL(mine != NULL && plain != NULL);
  tu_fill(mine, IPC_LEN, 911);
  int fd = -1;
  uint64_t off = 0, made = devmem_test_dmabufs();
  HixlStatus st = dm->dmabuf((uintptr_t)mine + pg + 100, 3 * pg, 0, &fd, &off, why, sizeof(why));
  if (access("/dev/udmabuf", R_OK | W_OK) != 0) {
    TU_ASSERT_STATUS(st, HIXL_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "/dev/udmabuf"));
    CU_ASSERT_EQUAL(devmem_test_dmabufs(), made);
    printf("  [no udmabuf here: %s]\n", why);
  } else {
    TU_ASSERT_OK_FATAL(st);
    CU_ASSERT_EQUAL(off, 100);
    CU_ASSERT_EQUAL(devmem_test_dmabufs(), made + 1);
    uint8_t *v = mmap(NULL, 4 * pg, PROT_READ, MAP_SHARED, fd, 0); /* 3 pages + 100 bytes: 4 pages */
    CU_ASSERT_FATAL(v != MAP_FAILED);
    TU_ASSERT_SAME(v + off, mine + pg + 100, 3 * pg, "the dma-buf's bytes at its offset");
    munmap(v, 4 * pg);
    close(fd);
  }
  TU_ASSERT_STATUS(dm->dmabuf((uintptr_t)plain, 4096, 0, &fd, &off, why, sizeof(why)), HIXL_UNSUPPORTED);
  printf("  [%s]\n", why);
  TU_ASSERT_STATUS(dm->dmabuf((uintptr_t)mine + IPC_LEN - 10, 20, 0, &fd, &off, why, sizeof(why)),
                   HIXL_UNSUPPORTED); /* runs past its allocation */
  devmem_test_free(mine);
  free(plain);
}

static CU_TestInfo ipc_tests[] = {
    {"IPC: a peer's device memory opened by handle, D2D both ways; forged handles refused",
     test_ipc_provider},
    {"dma-buf: the stand-in's memory exported for an RDMA device, or UNSUPPORTED", test_dmabuf_provider},
    CU_TEST_INFO_NULL,
};

/* ---- the host stand-in: every device path ---- */

static struct side a, b; /* a initiates, b is the target; both tcp */

/* tcp here; rdma in the soft-RoCE guest (its device ops then go on the link's socket). */
static const char *pair_transport(void) { return tu_transport() ? tu_transport() : "tcp"; }

static int pair_init(void) {
  if (!side_up(&a, pair_transport()) || !side_up(&b, pair_transport())) return -1;
  return HixlEngineConnect(a.e, b.name, 5000) == HIXL_SUCCESS ? 0 : -1;
}

static int pair_clean(void) {
  side_down(&a);
  side_down(&b);
  return 0;
}

/* One op of a's; *out / *in get the bytes the stand-in copied to host and to device
 * meanwhile (both engines are in this process). */
static HixlStatus op_counted(HixlTransferOp o, const void *local, const void *remote, size_t len,
                             uint64_t *out, uint64_t *in) {
  uint64_t o0, i0;
  devmem_test_counts(&o0, &i0);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = (uintptr_t)remote, .len = len};
  HixlStatus st = HixlEngineTransferSync(a.e, b.name, o, &d, 1, 10000);
  devmem_test_counts(out, in);
  *out -= o0;
  *in -= i0;
  return st;
}

static HixlStatus op(HixlTransferOp o, const void *local, const void *remote, size_t len) {
  uint64_t out, in;
  return op_counted(o, local, remote, len, &out, &in);
}

/* Device to device, device to host and host to device, both ways, 1 byte to several
 * chunks: every byte where it should be, and nothing beside it. */
static void test_moves(void) {
  static const size_t sizes[] = {1, 4096, (1u << 20) + 3, 3u << 20};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    uint64_t seed = 100 + k;
    /* WRITE: a's device -> b's device, then a's host -> b's device, a's device -> b's host */
    uint64_t out, in;
    tu_fill(a.dev, DEV_LEN, seed);
    tu_fill(b.dev, DEV_LEN, 7);
    TU_ASSERT_OK(op_counted(HIXL_WRITE, a.dev, b.dev + 5, n, &out, &in));
    TU_ASSERT_SAME(b.dev + 5, a.dev, n, "WRITE device -> device");
    CU_ASSERT(out == n && in == n); /* out of a's device into a host buffer, and into b's from one */
    CU_ASSERT_EQUAL(tu_check_pattern(b.dev, 5, 7), -1);
    tu_fill(a.host, HOST_LEN, seed + 10);
    TU_ASSERT_OK(op(HIXL_WRITE, a.host, b.dev, n));
    TU_ASSERT_SAME(b.dev, a.host, n, "WRITE host -> device");
    tu_fill(b.host, HOST_LEN, 8);
    TU_ASSERT_OK(op(HIXL_WRITE, a.dev, b.host, n));
    TU_ASSERT_SAME(b.host, a.dev, n, "WRITE device -> host");
    /* READ: b's device -> a's device and a's host; b's host -> a's device */
    tu_fill(b.dev, DEV_LEN, seed + 20);
    tu_fill(a.dev, DEV_LEN, 9);
    TU_ASSERT_OK(op_counted(HIXL_READ, a.dev + 3, b.dev, n, &out, &in));
    TU_ASSERT_SAME(a.dev + 3, b.dev, n, "READ device -> device");
    CU_ASSERT(out == n && in == n);
    CU_ASSERT_EQUAL(tu_check_pattern(a.dev, 3, 9), -1);
    TU_ASSERT_OK(op_counted(HIXL_READ, a.host, b.dev, n, &out, &in));
    TU_ASSERT_SAME(a.host, b.dev, n, "READ device -> host");
    CU_ASSERT(out == n && in == 0); /* only the target's side is device memory */
    tu_fill(b.host, HOST_LEN, seed + 30);
    TU_ASSERT_OK(op(HIXL_READ, a.dev, b.host, n));
    TU_ASSERT_SAME(a.dev, b.host, n, "READ host -> device");
  }
  assert_pool_back("moves");
}

/* A batch of many small ops between device ranges: moved directly (never staged),
 * each byte for byte. */
static void test_small_batch(void) {
  HixlTransferOpDesc d[64];
  for (int i = 0; i < 64; i++)
    d[i] = (HixlTransferOpDesc){.local_addr = (uintptr_t)a.dev + (size_t)i * 8192,
                                .remote_addr = (uintptr_t)b.dev + (size_t)i * 8192 + 11,
                                .len = 1000};
  tu_fill(a.dev, DEV_LEN, 201);
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, d, 64, 10000));
  for (int i = 0; i < 64; i++)
    TU_ASSERT_SAME(b.dev + (size_t)i * 8192 + 11, a.dev + (size_t)i * 8192, 1000, "small WRITE");
  tu_fill(b.dev, DEV_LEN, 202);
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_READ, d, 64, 10000));
  for (int i = 0; i < 64; i++)
    TU_ASSERT_SAME(a.dev + (size_t)i * 8192, b.dev + (size_t)i * 8192 + 11, 1000, "small READ");
}

/* The peer's table says which of its ranges are device memory: an op from memory not
 * registered here to its device range is refused before anything moves (it would have
 * been staged), naming device memory; its memory unchanged. */
static void test_refusals(void) {
  uint8_t *loose = tu_alloc_mem(8192, false);
  tu_fill(loose, 8192, 301);
  tu_fill(b.dev, DEV_LEN, 302);
  TU_ASSERT_STATUS(op(HIXL_WRITE, loose, b.dev, 4096), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("device memory");
  TU_ASSERT_STATUS(op(HIXL_READ, loose, b.dev, 4096), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(tu_check_pattern(b.dev, DEV_LEN, 302), -1);
  CU_ASSERT_EQUAL(tu_check_pattern(loose, 8192, 301), -1);
  tu_free_mem(loose, 8192);
}

/* ---- a hostile peer's staged frames into device memory ---- */

/* A raw peer's HELLO to a keyless engine on 127.0.0.1:port; the socket, or -1. */
static int raw_hello(uint16_t port) {
  uint8_t buf[4096];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = raw_dial(port);
  if (fd < 0) return -1;
  if (!raw_send_all(fd, buf, wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "raw-peer")) ||
      !raw_recv_frame(fd, &h, NULL, buf, sizeof(buf)) || h.type != WIRE_HELLO_ACK ||
      wire_decode(&h, buf, &m) != WIRE_OK || m.u.hello_ack.status != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A STAGE_WRITE (its data, the ranges' total, after it) or STAGE_READ of n ranges. */
static bool raw_stage(int fd, enum wire_type type, uint64_t seq, const uint64_t (*s)[2], uint32_t n,
                      const uint8_t *data) {
  uint8_t frame[WIRE_HDR_LEN + 12 + 4 * WIRE_STAGE_SEG_LEN];
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) total += s[i][1];
  bool write = type == WIRE_STAGE_WRITE;
  size_t len = wire_put_stage(frame, type, seq, n, write ? (uint32_t)total : 0);
  for (uint32_t i = 0; i < n; i++) wire_put_stage_seg(frame, false, i, s[i][0], (uint32_t)s[i][1]);
  return raw_send_all(fd, frame, len) && (!write || raw_send_all(fd, data, total));
}

/* The next answer is (type, seq, status) with plen bytes of payload (read and dropped). */
static bool raw_answer(int fd, uint8_t type, uint64_t seq, uint32_t status, uint32_t plen) {
  uint8_t body[64];
  struct wire_hdr h;
  struct wire_msg m;
  memset(&m, 0, sizeof(m));
  if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body)) || wire_decode(&h, body, &m) != WIRE_OK) return false;
  if (h.type != type || m.u.ack.seq != seq || m.u.ack.status != status || h.payload_len != plen)
    printf("  [got %s seq %llu %s payload %u]\n", wire_type_name(h.type), (unsigned long long)m.u.ack.seq,
           HixlStatusName(m.u.ack.status), h.payload_len);
  return h.type == type && m.u.ack.seq == seq && m.u.ack.status == status && h.payload_len == plen;
}

/* A peer's STAGE_WRITE / STAGE_READ whose ranges lie in a device registration (alone, or
 * beside a host registration's): refused FAILED, nothing written, nothing sent, no copy
 * made; the link serves a host range after. Staged data is moved by this CPU, which on
 * a GPU host cannot touch device memory. Before, every range inside a registration was
 * received in place or sent from where it lies, device memory too: the frames were
 * answered SUCCESS and the CPU wrote and read the "device" bytes (a fault on a GPU). */
static void test_staged_frames_refused(void) {
  const size_t dlen = 64u << 10, hlen = 64u << 10;
  uint16_t port = tu_free_port();
  char name[TU_ADDR_LEN];
  snprintf(name, sizeof(name), "127.0.0.1:%u", port);
  HixlEngine *t = tu_engine_start_opts(name, "tcp", NULL, 0);
  uint8_t *dev = tu_alloc_mem(dlen, false), *host = tu_alloc_mem(hlen, false), data[32768];
  HixlMemHandle hd, hh;
  CU_ASSERT_FATAL(t && dev && host);
  HixlMemDesc dd = {(uintptr_t)dev, dlen}, hd_ = {(uintptr_t)host, hlen};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(t, &dd, HIXL_MEM_DEVICE, &hd));
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(t, &hd_, HIXL_MEM_HOST, &hh));
  tu_fill(dev, dlen, 601);
  tu_fill(host, hlen, 602);
  tu_fill(data, sizeof(data), 603);
  int fd = raw_hello(port);
  CU_ASSERT_FATAL(fd >= 0);
  uint64_t o0, i0, o1, i1;
  devmem_test_counts(&o0, &i0);
  const uint64_t small[1][2] = {{(uintptr_t)dev + 100, 64}};
  const uint64_t in_place[1][2] = {{(uintptr_t)dev + 4096, 20000}}; /* long enough to land in place */
  const uint64_t mixed[2][2] = {{(uintptr_t)host + 8, 64}, {(uintptr_t)dev + 8, 64}};
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_WRITE, 1, small, 1, data));
  CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 1, HIXL_FAILED, 0));
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_WRITE, 2, in_place, 1, data));
  CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 2, HIXL_FAILED, 0));
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_WRITE, 3, mixed, 2, data));
  CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 3, HIXL_FAILED, 0));
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_READ, 4, small, 1, NULL));
  CU_ASSERT(raw_answer(fd, WIRE_READ_RESP, 4, HIXL_FAILED, 0));
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_READ, 5, in_place, 1, NULL));
  CU_ASSERT(raw_answer(fd, WIRE_READ_RESP, 5, HIXL_FAILED, 0));
  TU_ASSERT_PATTERN(dev, dlen, 601, "device memory a peer's staged frames aimed at");
  TU_ASSERT_PATTERN(host, hlen, 602, "host memory beside it in a refused frame");
  devmem_test_counts(&o1, &i1);
  CU_ASSERT_EQUAL(o1 - o0, 0);
  CU_ASSERT_EQUAL(i1 - i0, 0);
  /* The link still serves host memory. */
  const uint64_t ok[1][2] = {{(uintptr_t)host + 1000, 64}};
  CU_ASSERT(raw_stage(fd, WIRE_STAGE_WRITE, 6, ok, 1, data));
  CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 6, HIXL_SUCCESS, 0));
  TU_ASSERT_SAME(host + 1000, data, 64, "a staged WRITE to host memory after the refusals");
  close(fd);
  HixlEngineFinalize(t);
  HixlEngineDestroy(t);
  tu_free_mem(dev, dlen);
  tu_free_mem(host, hlen);
}

/* A peer's WRITE_REQ / READ_REQ of device memory longer than a pool buffer (1 MiB; the
 * wire takes up to 4 MiB a frame, and hixl's own initiators split at 1 MiB): refused,
 * nothing written, the link serving after. Before, the WRITE's payload was received into
 * the 1 MiB pool buffer past its end, and the READ copied 4 MiB out of device memory
 * into one: a heap overflow any peer could make (ASan: heap-buffer-overflow; plain: a
 * crash). */
static void test_oversized_frames_refused(void) {
  const size_t dlen = 8u << 20;
  uint16_t port = tu_free_port();
  char name[TU_ADDR_LEN];
  snprintf(name, sizeof(name), "127.0.0.1:%u", port);
  HixlEngine *t = tu_engine_start_opts(name, "tcp", NULL, 0);
  uint8_t *dev = tu_alloc_mem(dlen, false);
  uint8_t *buf = malloc(WIRE_SMALL_FRAME + (4u << 20));
  HixlMemHandle hd;
  CU_ASSERT_FATAL(t && dev && buf);
  HixlMemDesc dd = {(uintptr_t)dev, dlen};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(t, &dd, HIXL_MEM_DEVICE, &hd));
  tu_fill(dev, dlen, 611);
  int fd = raw_hello(port);
  CU_ASSERT_FATAL(fd >= 0);
  static const uint32_t lens[] = {(1u << 20) + 1, 4u << 20};
  for (uint32_t i = 0; i < 2; i++) {
    size_t k = wire_put_write_req(buf, 1 + i, (uintptr_t)dev + 4096, lens[i]);
    tu_fill(buf + k, lens[i], 612);
    CU_ASSERT(raw_send_all(fd, buf, k + lens[i]));
    CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 1 + i, HIXL_RESOURCE_EXHAUSTED, 0));
    k = wire_put_read_req(buf, 3 + i, (uintptr_t)dev + 4096, lens[i]);
    CU_ASSERT(raw_send_all(fd, buf, k));
    CU_ASSERT(raw_answer(fd, WIRE_READ_RESP, 3 + i, HIXL_FAILED, 0));
  }
  TU_ASSERT_PATTERN(dev, dlen, 611, "device memory an oversized WRITE aimed at");
  /* One pool buffer's worth still lands, and is read back. */
  size_t k = wire_put_write_req(buf, 5, (uintptr_t)dev + 4096, 1u << 20);
  tu_fill(buf + k, 1u << 20, 613);
  CU_ASSERT(raw_send_all(fd, buf, k + (1u << 20)));
  CU_ASSERT(raw_answer(fd, WIRE_WRITE_ACK, 5, HIXL_SUCCESS, 0));
  TU_ASSERT_PATTERN(dev + 4096, 1u << 20, 613, "a 1 MiB WRITE into device memory");
  close(fd);
  free(buf);
  HixlEngineFinalize(t);
  HixlEngineDestroy(t);
  tu_free_mem(dev, dlen);
}

/* Over the same-host path (shm copies host memory itself) device ops go as tcp frames
 * on the link's socket: alone, and in one batch with host ops that shm copies. */
static void test_shm_socket(void) {
  struct side x, y;
  uint64_t o0, i0, o1, i1;
  CU_ASSERT_FATAL(side_up(&x, "shm") && side_up(&y, "shm"));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y.name, 5000));
  tu_fill(x.dev, DEV_LEN, 401);
  tu_fill(x.host, HOST_LEN, 402);
  HixlTransferOpDesc d[3] = {
      {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)y.dev + 1, .len = (1u << 20) + 5},
      {.local_addr = (uintptr_t)x.host, .remote_addr = (uintptr_t)y.host, .len = 65536},
      {.local_addr = (uintptr_t)x.host + 65536, .remote_addr = (uintptr_t)y.dev + (2u << 20), .len = 4096}};
  devmem_test_counts(&o0, &i0);
  TU_ASSERT_OK(HixlEngineTransferSync(x.e, y.name, HIXL_WRITE, d, 3, 10000));
  devmem_test_counts(&o1, &i1);
  TU_ASSERT_SAME(y.dev + 1, x.dev, (1u << 20) + 5, "shm link: a device WRITE on its socket");
  TU_ASSERT_SAME(y.host, x.host, 65536, "shm link: a host WRITE shm copied");
  TU_ASSERT_SAME(y.dev + (2u << 20), x.host + 65536, 4096, "shm link: host -> device on its socket");
  CU_ASSERT_EQUAL(o1 - o0, (1u << 20) + 5);        /* out of x's device */
  CU_ASSERT_EQUAL(i1 - i0, (1u << 20) + 5 + 4096); /* into y's device */
  tu_fill(y.dev, DEV_LEN, 403);
  TU_ASSERT_OK(HixlEngineTransferSync(x.e, y.name, HIXL_READ, d, 1, 10000));
  TU_ASSERT_SAME(x.dev, y.dev + 1, (1u << 20) + 5, "shm link: a device READ on its socket");
  side_down(&x);
  side_down(&y);
}

/* The link is cut under an async device-to-device WRITE the target is not reading (its
 * thread held): the request ends FAILED within its timeout, its host buffers freed
 * (ASan), the target's half-received payload dropped when its thread goes on. */
static void test_peer_lost(void) {
  struct side x, y;
  struct tu_hold h = TU_HOLD_INIT;
  uint8_t ans[8];
  uint32_t alen = 0;
  hixl_call_t held;
  size_t cut = 0;
  CU_ASSERT_FATAL(side_up(&x, pair_transport()) && side_up(&y, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y.name, 5000));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(y.e, 1, tu_hold_handler, &h)); /* y then reads nothing */
  TU_ASSERT_OK_FATAL(hixl_engine_call_start(x.e, y.name, 1, NULL, 0, ans, sizeof(ans), &alen, 10000, &held));
  tu_hold_entered(&h);
  tu_fill(y.dev, DEV_LEN, 501);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)y.dev, .len = DEV_LEN};
  HixlTransferReq req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, y.name, HIXL_WRITE, &d, 1, 8000, NULL, &req));
  TU_ASSERT_OK(hixl_engine_drop_peer(x.e, y.name, "the test cuts the link", &cut));
  CU_ASSERT_EQUAL(cut, 1);
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  HixlStatus st = tu_wait_request(x.e, req, tu_now_ms() + 10000, &fin);
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_FAILED);
  TU_ASSERT_OK(st);
  printf("  [the transfer ended FAILED: %s]\n", HixlGetLastErrorMessage());
  tu_hold_release(&h);
  CU_ASSERT_NOT_EQUAL(hixl_engine_call_wait(x.e, y.name, held), HIXL_SUCCESS); /* its link went */
  side_down(&x);
  side_down(&y);
}

/* Device READs from four peers that stop answering (their threads held) time out; the
 * pool buffers their answers would have landed in come back at the deadline, and a
 * healthy peer's device READ then lands byte for byte. Before, each stalled link kept
 * its share (4 of the pool's 16) until it died: four such peers held the whole pool,
 * and the healthy peer's READ timed out too. */
static void test_stalled_peers_keep_no_pool(void) {
  enum { STALLED = 4 };
  struct side x, y[STALLED + 1];
  struct tu_hold h[STALLED];
  hixl_call_t held[STALLED];
  uint8_t ans[8];
  uint32_t alen = 0;
  uint64_t out0, out1, pinned, waits;
  CU_ASSERT_FATAL(side_up(&x, "tcp"));
  for (int i = 0; i <= STALLED; i++) {
    CU_ASSERT_FATAL(side_up(&y[i], "tcp"));
    TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y[i].name, 5000));
  }
  devmem_test_pool(&out0, &pinned, &waits);
  for (int i = 0; i < STALLED; i++) {
    h[i] = (struct tu_hold)TU_HOLD_INIT;
    TU_ASSERT_OK_FATAL(hixl_engine_set_service(y[i].e, 1, tu_hold_handler, &h[i]));
    TU_ASSERT_OK_FATAL(
        hixl_engine_call_start(x.e, y[i].name, 1, NULL, 0, ans, sizeof(ans), &alen, 20000, &held[i]));
    tu_hold_entered(&h[i]);                                                   /* y[i] reads nothing more */
    HixlTransferOpDesc d = {(uintptr_t)x.dev, (uintptr_t)y[i].host, DEV_LEN}; /* 4 chunks of 1 MiB */
    TU_ASSERT_STATUS(HixlEngineTransferSync(x.e, y[i].name, HIXL_READ, &d, 1, 200), HIXL_TIMEOUT);
  }
  /* Two async READs on one stalled link: the second's chunks wait for buffers (4 a
   * link), and leave without them, or take those the first gave back, at its deadline. */
  HixlTransferReq rq[2];
  for (int k = 0; k < 2; k++) {
    HixlTransferOpDesc d = {(uintptr_t)x.dev, (uintptr_t)y[0].host, DEV_LEN};
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, y[0].name, HIXL_READ, &d, 1, 200, NULL, &rq[k]));
  }
  for (int k = 0; k < 2; k++) {
    HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
    tu_wait_request(x.e, rq[k], tu_now_ms() + 10000, &fin);
    CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_TIMEOUT);
  }
  devmem_test_pool(&out1, &pinned, &waits);
  CU_ASSERT_EQUAL(out1, out0); /* every buffer back at the deadlines */
  tu_fill(y[STALLED].host, HOST_LEN, 521);
  HixlTransferOpDesc d = {(uintptr_t)x.dev, (uintptr_t)y[STALLED].host, DEV_LEN};
  TU_ASSERT_OK(HixlEngineTransferSync(x.e, y[STALLED].name, HIXL_READ, &d, 1, 5000));
  TU_ASSERT_PATTERN(x.dev, DEV_LEN, 521, "a healthy peer's device READ beside stalled ones");
  for (int i = 0; i < STALLED; i++) {
    tu_hold_release(&h[i]);
    hixl_engine_call_wait(x.e, y[i].name, held[i]); /* the late answers are dropped */
  }
  side_down(&x);
  for (int i = 0; i <= STALLED; i++) side_down(&y[i]);
}

/* ---- the pool of pinned host buffers, copies without the lock ---- */

/* One round trip through b's progress thread after a's last answer came: b answers a
 * READ of its device memory from a pool buffer and takes it back in the same locked
 * section in which it sent the answer's last byte, which a may have read (and its
 * request ended) before that section ended. A 1-byte WRITE into b's device memory goes
 * as a frame on every transport here (b parses it only after that section) and its
 * own buffer is back before its ACK leaves. */
static void settle_pair(void) {
  if (!a.e || !b.e) return;
  HixlTransferOpDesc d = {(uintptr_t)a.host + HOST_LEN - 1, (uintptr_t)b.dev + DEV_LEN - 1, 1};
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, &d, 1, 10000));
}

/* Every pool buffer of the process is back (none handed out). */
static void assert_pool_back(const char *what) {
  uint64_t out, pinned, waits;
  settle_pair();
  devmem_test_pool(&out, &pinned, &waits);
  if (out != 0) printf("  [%s: %llu pool buffer(s) not back]\n", what, (unsigned long long)out);
  CU_ASSERT_EQUAL(out, 0);
}

/* Many async device ops at once, more than the pool holds (16 MiB an engine), each
 * byte for byte: the initiator's chunks wait for buffers in order, the target stops
 * reading while its pool is empty; nothing fails, every buffer comes back, and the
 * buffers pinned stay within the bound. */
static void test_many_async(void) {
  enum { N = 24 };
  HixlTransferReq req[2 * N];
  uint64_t out0, pin0, waits0, out1, pin1, waits1;
  const size_t len = (1u << 20) + 4097; /* two chunks each, across the boundary */
  devmem_test_pool(&out0, &pin0, &waits0);
  tu_fill(a.dev, DEV_LEN, 601);
  tu_fill(b.dev, DEV_LEN, 602);
  tu_fill(a.host, HOST_LEN, 603);
  tu_fill(b.host, HOST_LEN, 604);
  uint8_t *want = malloc(DEV_LEN);
  CU_ASSERT_FATAL(want != NULL);
  memcpy(want, b.dev, DEV_LEN); /* the READs take b.dev, which nothing writes meanwhile */
  for (int i = 0; i < N; i++) { /* WRITE a.dev -> b.host, READ b.dev -> a.host: disjoint ranges */
    HixlTransferOpDesc w = {.local_addr = (uintptr_t)a.dev + (size_t)(i % 2) * len,
                            .remote_addr = (uintptr_t)b.host + (size_t)(i % 2) * len,
                            .len = len};
    HixlTransferOpDesc r = {.local_addr = (uintptr_t)a.host + (size_t)(i % 2) * len,
                            .remote_addr = (uintptr_t)b.dev + (size_t)(i % 2) * len,
                            .len = len};
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(a.e, b.name, HIXL_WRITE, &w, 1, 20000, NULL, &req[2 * i]));
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(a.e, b.name, HIXL_READ, &r, 1, 20000, NULL, &req[2 * i + 1]));
  }
  for (int i = 0; i < 2 * N; i++) {
    HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
    TU_ASSERT_OK(tu_wait_request(a.e, req[i], tu_now_ms() + 30000, &fin));
    CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  }
  TU_ASSERT_SAME(b.host, a.dev, 2 * len, "async device WRITEs");
  TU_ASSERT_SAME(a.host, want, 2 * len, "async device READs");
  settle_pair();
  devmem_test_pool(&out1, &pin1, &waits1);
  CU_ASSERT_EQUAL(out1, 0);
  CU_ASSERT(pin1 <= 2 * 16);  /* two engines, 16 buffers each at most */
  CU_ASSERT(waits1 > waits0); /* more chunks than buffers: some waited for one */
  printf("  [%llu pinned buffers, %llu waits for one]\n", (unsigned long long)pin1,
         (unsigned long long)(waits1 - waits0));
  /* and sync, device to device, after all that */
  TU_ASSERT_OK(op(HIXL_WRITE, a.dev, b.dev + 1, 3u << 20));
  TU_ASSERT_SAME(b.dev + 1, a.dev, 3u << 20, "sync WRITE device -> device after the async ones");
  assert_pool_back("many async ops");
  free(want);
}

/* The pool itself: max buffers, then NULL (a wait) from get, a buffer of its own from
 * spill; every one put back, the spilled one freed, the pool's reused. */
static void test_pool_spill(void) {
  char why[256] = "";
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  CU_ASSERT_PTR_NOT_NULL_FATAL(dm);
  struct devmem_pool *p = devmem_pool_new(dm, 0, 4096, 2);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  uint64_t out0, pin0, waits0, out1, pin1, waits1, spills0 = devmem_test_spills();
  devmem_test_pool(&out0, &pin0, &waits0);
  void *b0 = devmem_pool_get(p, why, sizeof(why)), *b1 = devmem_pool_get(p, why, sizeof(why));
  CU_ASSERT(b0 && b1 && b0 != b1);
  CU_ASSERT_TRUE(devmem_pool_empty(p));
  CU_ASSERT_PTR_NULL(devmem_pool_get(p, why, sizeof(why))); /* a wait */
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "in use"));
  void *s0 = devmem_pool_spill(p, why, sizeof(why));
  CU_ASSERT(s0 && s0 != b0 && s0 != b1);
  memset(s0, 0xab, 4096); /* a whole buffer (ASan: its size) */
  CU_ASSERT_EQUAL(devmem_test_spills(), spills0 + 1);
  devmem_test_pool(&out1, &pin1, &waits1);
  CU_ASSERT_EQUAL(out1, out0 + 3);
  CU_ASSERT_EQUAL(waits1, waits0 + 1);
  devmem_pool_put(p, s0); /* freed, not kept */
  devmem_pool_put(p, b1);
  CU_ASSERT_FALSE(devmem_pool_empty(p));
  void *again = devmem_pool_spill(p, why, sizeof(why)); /* one is free: the pool's, no spill */
  CU_ASSERT_PTR_EQUAL(again, b1);
  CU_ASSERT_EQUAL(devmem_test_spills(), spills0 + 1);
  devmem_pool_put(p, again);
  devmem_pool_put(p, b0);
  devmem_test_pool(&out1, &pin1, &waits1);
  CU_ASSERT_EQUAL(out1, out0);
  devmem_pool_free(p);
}

/* Two initiators WRITE into one target's device memory at once, more chunks than its
 * pool holds: a target lands a WRITE in a buffer beyond its pool when the pool is out
 * (this link then stalls until one is back), so no WRITE of either link is refused
 * RESOURCE_EXHAUSTED; every byte lands and every buffer comes back. */
static void test_two_links_write(void) {
  enum { N = 12 };
  struct side t, x, y;
  HixlTransferReq req[2 * N];
  const size_t len = 2u << 20; /* two chunks; x writes the first half of t.dev, y the second */
  CU_ASSERT_FATAL(side_up(&t, pair_transport()) && side_up(&x, pair_transport()) &&
                  side_up(&y, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, t.name, 5000));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(y.e, t.name, 5000));
  tu_fill(x.dev, DEV_LEN, 701);
  tu_fill(y.dev, DEV_LEN, 702);
  uint64_t spills0 = devmem_test_spills();
  for (int i = 0; i < N; i++) {
    HixlTransferOpDesc wx = {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)t.dev, .len = len};
    HixlTransferOpDesc wy = {
        .local_addr = (uintptr_t)y.dev, .remote_addr = (uintptr_t)t.dev + len, .len = len};
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, t.name, HIXL_WRITE, &wx, 1, 20000, NULL, &req[2 * i]));
    TU_ASSERT_OK_FATAL(
        HixlEngineTransferAsync(y.e, t.name, HIXL_WRITE, &wy, 1, 20000, NULL, &req[2 * i + 1]));
  }
  for (int i = 0; i < 2 * N; i++) {
    HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
    TU_ASSERT_OK(tu_wait_request(i % 2 ? y.e : x.e, req[i], tu_now_ms() + 30000, &fin));
    CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  }
  TU_ASSERT_SAME(t.dev, x.dev, len, "x's device WRITEs");
  TU_ASSERT_SAME(t.dev + len, y.dev, len, "y's device WRITEs");
  printf("  [%llu buffers beyond the pool]\n", (unsigned long long)(devmem_test_spills() - spills0));
  side_down(&x);
  side_down(&y);
  side_down(&t);
  assert_pool_back("two links writing");
}

/* The pool bound per link: x queues many async device WRITEs on a link to y, whose
 * thread is held (it reads nothing, so x's buffers on that link stay out while its
 * frames wait for the socket), then WRITEs device memory to z on another link. That op
 * completes while every op to y still waits: the first link holds at most its share of
 * x's pool (ENGINE_DEV_LINK_BUFS, 4 of 16), so the second finds buffers. Without the
 * bound the first link takes all 16 and the op to z waits until it times out. Then y
 * goes on and every byte of both links lands. */
static void test_link_share(void) {
  enum { N = 24, SHARE = 4 };
  struct side x, y, z;
  struct tu_hold h = TU_HOLD_INIT;
  uint8_t ans[8];
  uint32_t alen = 0;
  hixl_call_t held;
  HixlTransferReq req[N];
  const size_t len = 1u << 20;
  CU_ASSERT_FATAL(side_up(&x, pair_transport()) && side_up(&y, pair_transport()) &&
                  side_up(&z, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y.name, 5000));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, z.name, 5000));
  TU_ASSERT_OK_FATAL(hixl_engine_set_service(y.e, 1, tu_hold_handler, &h));
  TU_ASSERT_OK_FATAL(hixl_engine_call_start(x.e, y.name, 1, NULL, 0, ans, sizeof(ans), &alen, 30000, &held));
  tu_hold_entered(&h); /* y reads nothing from here on */
  tu_fill(x.dev, DEV_LEN, 801);
  memset(y.host, 0, HOST_LEN);
  memset(z.host, 0, HOST_LEN);
  for (int i = 0; i < N; i++) { /* 24 MiB: more than x's pool and the socket's buffers hold */
    HixlTransferOpDesc w = {.local_addr = (uintptr_t)x.dev + (size_t)(i % 4) * len,
                            .remote_addr = (uintptr_t)y.host + (size_t)(i % 4) * len,
                            .len = len};
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, y.name, HIXL_WRITE, &w, 1, 30000, NULL, &req[i]));
  }
  HixlTransferOpDesc wz = {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)z.host, .len = 2 * len};
  TU_ASSERT_OK(HixlEngineTransferSync(x.e, z.name, HIXL_WRITE, &wz, 1, 10000));
  TU_ASSERT_SAME(z.host, x.dev, 2 * len, "the other link's device WRITE");
  uint64_t out, pinned, waits;
  devmem_test_pool(&out, &pinned, &waits); /* y and z land in host memory: only x holds buffers */
  CU_ASSERT(out <= SHARE);
  /* Buffers the held link's sends gave back (the socket took them) go to its next jobs
   * by the copier, after the release: the link holds some again once its socket is full. */
  for (int64_t until = tu_now_ms() + 10000; out == 0 && tu_now_ms() < until;
       devmem_test_pool(&out, &pinned, &waits))
    sched_yield();
  printf("  [the held link holds %llu pool buffer(s)]\n", (unsigned long long)out);
  CU_ASSERT(out >= 1 && out <= SHARE);
  int waiting = 0;
  for (int i = 0; i < N; i++) {
    HixlTransferStatus s = HIXL_TRANSFER_FAILED;
    TU_ASSERT_OK(HixlEngineGetTransferStatus(x.e, req[i], &s));
    waiting += s == HIXL_TRANSFER_WAITING;
  }
  CU_ASSERT_EQUAL(waiting, N); /* y answered none: not one op to it ended */
  tu_hold_release(&h);
  TU_ASSERT_OK(hixl_engine_call_wait(x.e, y.name, held));
  for (int i = 0; i < N; i++) {
    HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
    TU_ASSERT_OK(tu_wait_request(x.e, req[i], tu_now_ms() + 30000, &fin));
    CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  }
  TU_ASSERT_SAME(y.host, x.dev, 4 * len, "the held link's device WRITEs, once it went on");
  side_down(&x);
  side_down(&y);
  side_down(&z);
  assert_pool_back("a link's share");
}

/* The link cut while device copies are queued and running on both sides (many async
 * ops, both ways): each request ends, FAILED or COMPLETED, within its timeout; no
 * crash, no hang; every pool buffer comes back. */
static void test_cut_in_flight(void) {
  enum { N = 16 };
  struct side x, y;
  HixlTransferReq req[2 * N];
  size_t cut = 0;
  CU_ASSERT_FATAL(side_up(&x, pair_transport()) && side_up(&y, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y.name, 5000));
  for (int i = 0; i < N; i++) {
    HixlTransferOpDesc w = {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)y.dev, .len = 2u << 20};
    HixlTransferOpDesc r = {.local_addr = (uintptr_t)x.dev + (2u << 20),
                            .remote_addr = (uintptr_t)y.dev + (2u << 20),
                            .len = 2u << 20};
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, y.name, HIXL_WRITE, &w, 1, 8000, NULL, &req[2 * i]));
    TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, y.name, HIXL_READ, &r, 1, 8000, NULL, &req[2 * i + 1]));
  }
  TU_ASSERT_OK(hixl_engine_drop_peer(x.e, y.name, "the test cuts the link", &cut));
  int failed = 0;
  for (int i = 0; i < 2 * N; i++) {
    HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
    TU_ASSERT_OK(tu_wait_request(x.e, req[i], tu_now_ms() + 10000, &fin));
    CU_ASSERT(fin == HIXL_TRANSFER_FAILED || fin == HIXL_TRANSFER_COMPLETED);
    failed += fin == HIXL_TRANSFER_FAILED;
  }
  CU_ASSERT(failed > 0);
  printf("  [%d of %d requests FAILED with the link]\n", failed, 2 * N);
  side_down(&x);
  side_down(&y);
  assert_pool_back("a link cut in flight");
}

/* Finalize while async device ops are queued and copying: it returns, their requests
 * end with the engine, the pool is freed (its buffers unpinned), the peer goes on. */
static void test_finalize_in_flight(void) {
  enum { N = 16 };
  struct side x, y;
  HixlTransferReq req[N];
  uint64_t out, pin0, pin1, waits;
  devmem_test_pool(&out, &pin0, &waits);
  CU_ASSERT_FATAL(side_up(&x, pair_transport()) && side_up(&y, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, y.name, 5000));
  for (int i = 0; i < N; i++) {
    HixlTransferOpDesc d = {.local_addr = (uintptr_t)x.dev, .remote_addr = (uintptr_t)y.dev, .len = DEV_LEN};
    TU_ASSERT_OK_FATAL(
        HixlEngineTransferAsync(x.e, y.name, i % 2 ? HIXL_READ : HIXL_WRITE, &d, 1, 8000, NULL, &req[i]));
  }
  TU_ASSERT_OK(HixlEngineFinalize(x.e)); /* the requests end with it; Destroy frees them */
  devmem_test_pool(&out, &pin1, &waits);
  CU_ASSERT(pin1 <= pin0 + 16); /* x's buffers unpinned; y may still hold its own */
  HixlEngineDestroy(x.e);
  x.e = NULL;
  side_down(&x);
  side_down(&y);
  devmem_test_pool(&out, &pin1, &waits);
  CU_ASSERT_EQUAL(out, 0);
  CU_ASSERT_EQUAL(pin1, pin0); /* both pools freed at Finalize */
}

/* A device copy that takes its time (the stand-in's gate held closed) holds up no wire:
 * while b's copy of a's WRITE into its device memory waits, another engine's WRITE into
 * b's host memory is answered (b's progress thread reads on: the copier waits, not it);
 * once the gate opens, a's WRITE lands too, every byte. */
static void test_copy_beside_wire(void) {
  struct side x;
  CU_ASSERT_FATAL(side_up(&x, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, b.name, 5000));
  tu_fill(a.host, 1u << 20, 801);
  tu_fill(x.host, 65536, 802);
  memset(b.dev, 0, 1u << 20);
  memset(b.host, 0, 65536);
  devmem_test_gate(true);
  HixlTransferOpDesc w = {(uintptr_t)a.host, (uintptr_t)b.dev, 1u << 20};
  HixlTransferReq req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(a.e, b.name, HIXL_WRITE, &w, 1, 20000, NULL, &req));
  bool held = devmem_test_gate_wait(1, 10000); /* b's copy into its device memory waits */
  CU_ASSERT_TRUE(held);
  HixlTransferOpDesc h = {(uintptr_t)x.host, (uintptr_t)b.host, 65536};
  HixlStatus st = HixlEngineTransferSync(x.e, b.name, HIXL_WRITE, &h, 1, 5000);
  devmem_test_gate(false);
  TU_ASSERT_OK(st);
  TU_ASSERT_SAME(b.host, x.host, 65536, "a host WRITE beside a device copy that waits");
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  TU_ASSERT_OK(tu_wait_request(a.e, req, tu_now_ms() + 20000, &fin));
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_SAME(b.dev, a.host, 1u << 20, "the device WRITE, once its copy went on");
  side_down(&x);
  assert_pool_back("after the copy beside the wire");
}

static bool async_provider(void) {
  const char *v = getenv("HIXL_TEST_DEVMEM_ASYNC");
  return !(v && strcmp(v, "0") == 0);
}

/* Device copies on a stream per link: while the copy of x's WRITE into t's device
 * memory is held (the stand-in's gate, closed on that range alone), y's WRITE into the
 * next range of t's device memory lands and is answered: t copies for its two links at
 * once, where one copier thread would wait behind the held copy (y's WRITE then times
 * out: HIXL_TEST_DEVMEM_ASYNC=0, the provider without streams, skips this). Then x's
 * lands too, every byte; a sync caller's device-to-device READ copies on its own link's
 * stream; the streams go with their links. */
static void test_streams_per_link(void) {
  const size_t len = 1u << 20;
  struct side t, x, y;
  uint64_t made0, live0, copies0, made1, live1, copies1;
  if (!async_provider()) {
    printf("  [skipped: HIXL_TEST_DEVMEM_ASYNC=0, the provider has no streams]\n");
    return;
  }
  devmem_test_streams(&made0, &live0, &copies0);
  CU_ASSERT_FATAL(side_up(&t, pair_transport()) && side_up(&x, pair_transport()) &&
                  side_up(&y, pair_transport()));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(x.e, t.name, 5000));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(y.e, t.name, 5000));
  tu_fill(x.host, len, 811);
  tu_fill(y.host, len, 812);
  memset(t.dev, 0, 2 * len);
  devmem_test_gate_range((uintptr_t)t.dev, len);
  devmem_test_gate(true);
  HixlTransferOpDesc wx = {(uintptr_t)x.host, (uintptr_t)t.dev, len};
  HixlTransferReq req = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(x.e, t.name, HIXL_WRITE, &wx, 1, 20000, NULL, &req));
  CU_ASSERT_TRUE(devmem_test_gate_wait(1, 10000)); /* t's copy of x's WRITE waits */
  HixlTransferOpDesc wy = {(uintptr_t)y.host, (uintptr_t)t.dev + len, len};
  HixlStatus st = HixlEngineTransferSync(y.e, t.name, HIXL_WRITE, &wy, 1, 5000);
  HixlTransferStatus fin = HIXL_TRANSFER_WAITING;
  HixlStatus xst = HixlEngineGetTransferStatus(x.e, req, &fin);
  devmem_test_gate(false);
  devmem_test_gate_range(0, 0);
  TU_ASSERT_OK(st);
  TU_ASSERT_SAME(t.dev + len, y.host, len, "y's WRITE, landed while x's copy was held");
  TU_ASSERT_OK(xst);
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_WAITING); /* x's was still held then */
  TU_ASSERT_OK(tu_wait_request(x.e, req, tu_now_ms() + 20000, &fin));
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_SAME(t.dev, x.host, len, "x's WRITE, once its copy went on");
  /* A sync caller's device READ: t copies out on its stream, x copies in on its own. */
  memset(x.dev, 0, 2 * len);
  HixlTransferOpDesc r = {(uintptr_t)x.dev + 3, (uintptr_t)t.dev + 5, 2 * len - 5};
  TU_ASSERT_OK(HixlEngineTransferSync(x.e, t.name, HIXL_READ, &r, 1, 10000));
  TU_ASSERT_SAME(x.dev + 3, t.dev + 5, 2 * len - 5, "a sync device-to-device READ");
  devmem_test_streams(&made1, &live1, &copies1);
  CU_ASSERT(made1 - made0 >= 3);             /* t: x's link and y's; x: its link to t */
  CU_ASSERT(copies1 - copies0 >= 2 + 2 * 2); /* 2 WRITEs landed; the READ's 2 chunks out and in */
  side_down(&x);
  side_down(&y);
  side_down(&t);
  devmem_test_streams(&made1, &live1, &copies1);
  CU_ASSERT_EQUAL(live1, live0); /* freed with their links */
  assert_pool_back("after copies on streams");
}

/* ---- the CS API and the cache manager with device memory ---- */

/* HCCL_MEM_TYPE_DEVICE through the CS API: the server's device memory registered as
 * such (GetRemoteMem says so); the client puts from its device memory into it and gets
 * it back into its host memory, byte for byte at odd offsets, through the stand-in's
 * copies. Without a provider (test_devmem) RegMem refuses it UNSUPPORTED. */
static void test_cs_device(void) {
  const size_t len = 3u << 20;
  uint16_t port = tu_free_port();
  uint8_t *sdev = tu_alloc_mem(len, false), *cdev = tu_alloc_mem(len, false),
          *chost = tu_alloc_mem(len, false);
  HixlServerHandle srv = NULL;
  HixlClientHandle cli = NULL;
  MemHandle sm = NULL, cm = NULL, ch = NULL;
  HcommMem *rl = NULL;
  char **tags = NULL;
  uint32_t n = 0;
  uint64_t o0, i0, o1, i1;
  CU_ASSERT_FATAL(sdev && cdev && chost);
  HixlServerDesc sd = {.server_ip = tu_ip(), .server_port = port};
  TU_ASSERT_OK_FATAL(HixlCSServerCreate(&sd, NULL, &srv));
  HcommMem m = {HCCL_MEM_TYPE_DEVICE, sdev, len};
  TU_ASSERT_OK_FATAL(HixlCSServerRegMem(srv, "kv-device", &m, &sm));
  TU_ASSERT_OK_FATAL(HixlCSServerListen(srv, 0));
  HixlClientDesc cd = {.server_ip = tu_ip(), .server_port = port};
  TU_ASSERT_OK_FATAL(HixlCSClientCreate(&cd, NULL, &cli));
  m = (HcommMem){HCCL_MEM_TYPE_DEVICE, cdev, len};
  TU_ASSERT_OK_FATAL(HixlCSClientRegMem(cli, NULL, &m, &cm));
  m = (HcommMem){HCCL_MEM_TYPE_HOST, chost, len};
  TU_ASSERT_OK_FATAL(HixlCSClientRegMem(cli, NULL, &m, &ch));
  TU_ASSERT_OK_FATAL(HixlCSClientConnect(cli, 5000));
  TU_ASSERT_OK(HixlCSClientGetRemoteMem(cli, &rl, &tags, &n, 5000));
  bool found = false;
  for (uint32_t i = 0; i < n; i++)
    if (rl[i].addr == sdev) {
      found = true;
      CU_ASSERT_EQUAL(rl[i].type, HCCL_MEM_TYPE_DEVICE);
      CU_ASSERT_EQUAL(rl[i].size, len);
      CU_ASSERT_STRING_EQUAL(tags[i], "kv-device");
    }
  CU_ASSERT_TRUE(found);
  tu_fill(cdev, len, 821);
  memset(sdev, 0, len);
  memset(chost, 0, len);
  devmem_test_counts(&o0, &i0);
  HixlOneSideOpDesc put = {sdev + 7, cdev + 7, len - 7};
  TU_ASSERT_OK(HixlCSClientBatchPutSync(cli, 1, &put, 10000));
  TU_ASSERT_SAME(sdev + 7, cdev + 7, len - 7, "a CS put, device to device");
  HixlOneSideOpDesc get = {sdev + 7, chost, len - 7};
  TU_ASSERT_OK(HixlCSClientBatchGetSync(cli, 1, &get, 10000));
  TU_ASSERT_SAME(chost, cdev + 7, len - 7, "a CS get, device into host memory");
  devmem_test_counts(&o1, &i1);
  CU_ASSERT(o1 - o0 >= 2 * (len - 7)); /* out of the client's device (put), the server's (get) */
  CU_ASSERT(i1 - i0 >= len - 7);       /* into the server's device (put) */
  TU_ASSERT_OK(HixlCSClientDestroy(cli));
  TU_ASSERT_OK(HixlCSServerDestroy(srv));
  tu_free_mem(sdev, len);
  tu_free_mem(cdev, len);
  tu_free_mem(chost, len);
  assert_pool_back("after the CS API");
}

#define CD_TENSORS 4 /* 2 layers x (K, V) */
#define CD_BLOCKS  8
#define CD_BLOCK   (64u << 10)

static void cd_check_blocks(const uint8_t *dst, const uint8_t *src, const uint64_t *db, const uint64_t *sb,
                            size_t n, const char *what) {
  const size_t tb = (size_t)CD_BLOCKS * CD_BLOCK;
  for (size_t t = 0; t < CD_TENSORS; t++)
    for (size_t k = 0; k < n; k++)
      TU_ASSERT_SAME(dst + t * tb + db[k] * CD_BLOCK, src + t * tb + sb[k] * CD_BLOCK, CD_BLOCK, what);
}

/* HIXL_CACHE_DEVICE through the cache manager: a blocks cache in device memory on each
 * of two managers, registered as device memory and remotely accessible by default;
 * decode pulls prefill's blocks and prefill pushes others, byte for byte through the
 * stand-in's copies. Allocating device memory, and a device cache peers may not
 * reach, are refused UNSUPPORTED with a sentence. */
static void test_cache_device(void) {
  const size_t tb = (size_t)CD_BLOCKS * CD_BLOCK, all = CD_TENSORS * tb;
  char pn[TU_ADDR_LEN], dn[TU_ADDR_LEN];
  HixlEngine *pe = tu_engine_start_opts(tu_addr(pn, sizeof(pn), tu_free_port()), pair_transport(), NULL, 0);
  HixlEngine *de = tu_engine_start_opts(tu_addr(dn, sizeof(dn), tu_free_port()), pair_transport(), NULL, 0);
  uint8_t *pdev = tu_alloc_mem(all, false), *ddev = tu_alloc_mem(all, false);
  HixlCacheManager *pm = NULL, *dm = NULL;
  uintptr_t pa[CD_TENSORS], da[CD_TENSORS];
  uint64_t pid = 0, did = 0, id = 0, o0, i0, o1, i1;
  CU_ASSERT_FATAL(pe && de && pdev && ddev);
  for (size_t t = 0; t < CD_TENSORS; t++) {
    pa[t] = (uintptr_t)pdev + t * tb;
    da[t] = (uintptr_t)ddev + t * tb;
  }
  HixlCacheDesc desc = {.num_tensors = CD_TENSORS,
                        .elem_size = 2,
                        .num_dims = 4,
                        .shape = {CD_BLOCKS, 64, 8, 64}, /* 64 KiB blocks */
                        .placement = HIXL_CACHE_DEVICE};
  HixlBlocksCacheKey pk = {1, 0}, dk = {2, 0};
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(pe, 1, &pm));
  TU_ASSERT_OK_FATAL(HixlCacheManagerCreate(de, 2, &dm));
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterBlocksCache(pm, &desc, pa, CD_TENSORS, &pk, HIXL_CACHE_ACCESS_DEFAULT, &pid));
  TU_ASSERT_OK_FATAL(
      HixlCacheManagerRegisterBlocksCache(dm, &desc, da, CD_TENSORS, &dk, HIXL_CACHE_ACCESS_DEFAULT, &did));
  TU_ASSERT_OK_FATAL(HixlCacheManagerLink(dm, 1, pn, 5000));
  TU_ASSERT_OK_FATAL(HixlCacheManagerLink(pm, 2, dn, 5000));
  tu_fill(pdev, all, 831);
  memset(ddev, 0, all);
  devmem_test_counts(&o0, &i0);
  const uint64_t sb[] = {1, 3, 5}, db[] = {0, 2, 7};
  HixlCacheAnyKey src = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = pk};
  TU_ASSERT_OK(HixlCacheManagerPullBlocks(dm, &src, did, sb, 3, db, 3, NULL));
  cd_check_blocks(ddev, pdev, db, sb, 3, "blocks pulled into device memory");
  const uint64_t psb[] = {6, 0}, pdb[] = {4, 6};
  TU_ASSERT_OK(HixlCacheManagerPushBlocks(pm, &dk, pid, psb, 2, pdb, 2, NULL));
  cd_check_blocks(ddev, pdev, pdb, psb, 2, "blocks pushed into device memory");
  devmem_test_counts(&o1, &i1);
  CU_ASSERT(o1 - o0 >= 5 * CD_TENSORS * CD_BLOCK); /* every block out of prefill's device */
  CU_ASSERT(i1 - i0 >= 5 * CD_TENSORS * CD_BLOCK); /* ... and into decode's */
  /* Refused: allocating device memory; a device cache peers may not reach. */
  uintptr_t na[CD_TENSORS];
  TU_ASSERT_STATUS(HixlCacheManagerAllocateBlocksCache(dm, &desc, NULL, na, CD_TENSORS, &id),
                   HIXL_UNSUPPORTED);
  CU_ASSERT(strstr(HixlGetLastErrorMessage(), "does not allocate device memory") != NULL);
  TU_ASSERT_STATUS(
      HixlCacheManagerRegisterBlocksCache(pm, &desc, pa, CD_TENSORS, NULL, HIXL_CACHE_ACCESS_LOCAL, &id),
      HIXL_UNSUPPORTED);
  CU_ASSERT(strstr(HixlGetLastErrorMessage(), "staging pool") != NULL);
  TU_ASSERT_OK(HixlCacheManagerDestroy(pm));
  TU_ASSERT_OK(HixlCacheManagerDestroy(dm));
  HixlEngineFinalize(pe);
  HixlEngineDestroy(pe);
  HixlEngineFinalize(de);
  HixlEngineDestroy(de);
  tu_free_mem(pdev, all);
  tu_free_mem(ddev, all);
  assert_pool_back("after the cache manager");
}

static CU_TestInfo none_tests[] = {
    {"no driver: HIXL_MEM_DEVICE UNSUPPORTED with a sentence (with one: host memory refused)",
     test_no_driver},
    {"with a driver: device memory registered as host memory refused, naming HIXL_MEM_DEVICE",
     test_device_as_host},
    {"with a driver: copy_many whose first copy faults on its stream fails them all (bad 0)",
     test_many_fault},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo host_tests[] = {
    {"device <-> device and host, WRITE and READ, 1 B to 3 MiB, byte for byte", test_moves},
    {"64 small ops between device ranges: direct, byte for byte", test_small_batch},
    {"an op from unregistered memory to a device range: refused, nothing moved", test_refusals},
    {"a peer's staged frames into a device registration: refused, nothing written or read",
     test_staged_frames_refused},
    {"a peer's WRITE / READ of device memory longer than a pool buffer: refused, no overflow",
     test_oversized_frames_refused},
    {"a shm link: device ops on its socket, beside host ops shm copies, one batch", test_shm_socket},
    {"the link cut under an async device WRITE its target is not reading: FAILED in time", test_peer_lost},
    {"48 async device ops at once, more than the pool: they wait, all land, buffers back", test_many_async},
    {"device READs from peers that stop answering: the pool comes back at their deadlines",
     test_stalled_peers_keep_no_pool},
    {"the pool: a wait when out, a buffer of its own from spill, freed when put back", test_pool_spill},
    {"two links WRITE into one target beyond its pool: none refused, all land, buffers back",
     test_two_links_write},
    {"a link with many ops held holds at most its share of the pool: another link's op completes",
     test_link_share},
    {"the link cut with device copies queued and running: requests end, buffers back", test_cut_in_flight},
    {"Finalize with device copies in flight: returns, pools freed and unpinned", test_finalize_in_flight},
    {"a device copy that waits holds up no wire: another link's WRITE answered meanwhile",
     test_copy_beside_wire},
    {"copies on a stream per link: one link's copy held, another link's WRITE lands meanwhile",
     test_streams_per_link},
    {"the CS API: device memory registered, reported, put and got byte for byte", test_cs_device},
    {"the cache manager: device blocks caches pulled and pushed byte for byte; refusals", test_cache_device},
    CU_TEST_INFO_NULL,
};

static CU_SuiteInfo none_suites[] = {{"device memory, no provider", NULL, NULL, NULL, NULL, none_tests},
                                     CU_SUITE_INFO_NULL};
static CU_SuiteInfo host_suites[] = {
    {"device memory IPC, host stand-in (no engine: it forks)", NULL, NULL, NULL, NULL, ipc_tests},
    {"device memory, host stand-in", pair_init, pair_clean, NULL, NULL, host_tests},
    CU_SUITE_INFO_NULL};

int main(void) { return tu_run_suites("test_devmem", host_provider() ? host_suites : none_suites); }
