/* hixl-gpu-check: the GPU suite of docs/device-memory.md, for a machine with an NVIDIA
 * GPU and its driver. Exits 77 (a skip) where libcuda.so.1 does not load or finds no
 * device, saying so.
 *
 * In this process: two engines on 127.0.0.1, each with --mib MiB of cuMemAlloc'd memory
 * registered as HIXL_MEM_DEVICE and as much pinned host memory registered as host
 * memory. Over tcp, and over a shm link (same host: its device ops go on the link's
 * socket): WRITE and READ, device to device and device to host, 4 KiB to --mib MiB,
 * every byte checked by copying the far side back with cuMemcpyDtoH. Then the
 * figures, medians of --reps runs: cuMemcpyDtoD and cuMemcpyDtoH of the whole buffer
 * (the references), hixl's device-to-device WRITE over tcp and its host-to-host WRITE
 * over tcp, and their ratios (goals in docs/device-memory.md: tcp staging >= 0.8x of
 * the same transfer from host memory).
 *
 * Across processes (same host, CUDA IPC): a child forked before either process starts
 * CUDA holds --mib MiB of its own cuMemAlloc'd memory, filled with a pattern, registered
 * as device memory in its engine (Transport shm, a key). This process READs all of it
 * into its device memory over a shm link, which opens the child's allocation by its IPC
 * handle and copies device to device; every byte checked, every byte moved by IPC
 * (hixl_engine_devmem_stats: none as tcp frames), then timed beside cuMemcpyDtoD of
 * the same bytes in this process (goal: >= 0.8x); then the same bytes as ops of --op-kib (256 KiB)
 * in one call (KV's shape), every byte checked and the waits for the device counted.
 * Table on stdout,
 * --json FILE.
 *
 *   hixl-gpu-check [--mib N] [--reps N] [--json FILE] */
#include <arpa/inet.h>
#include <cuda.h>
#include <dlfcn.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "hixl/hixl.h"

#define IPC_BATCH 1024 /* copies the shm path starts before it waits (MAP_DEV_BATCH) */
#define IPC_STEP                                                                                             \
  (256u << 20) /* device bytes of one shm step (ESHM_STEP x ESHM_DEV_WEIGHT): one                            \
                * op's chunks are one copy a step */

static struct {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*ctx_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_set)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free_)(CUdeviceptr);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*htod)(CUdeviceptr, const void *, size_t);
  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*alloc_host)(void **, size_t);
  CUresult (*free_host)(void *);
  CUresult (*name)(char *, int, CUdevice);
  CUresult (*sync)(void);
  /* Optional (CUDA 13): the in-process reference for many copies, and whether hixl's
   * provider can start them so. */
  CUresult (*batch)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                    CUstream);
  CUresult (*stream_create)(CUstream *, unsigned int);
  CUresult (*stream_sync)(CUstream);
  CUresult (*stream_destroy)(CUstream);
  bool kernel; /* the driver can load hixl's copy kernel (cuModuleLoadData), and it is not turned off */
} cu;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int skip(const char *why) {
  printf("hixl-gpu-check: SKIP: %s\n", why);
  return 77;
}

static bool load(char *why, size_t cap) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) {
    snprintf(why, cap, "no CUDA driver (dlopen libcuda.so.1: %s)", dlerror());
    return false;
  }
  struct {
    void **fn;
    const char *sym;
  } s[] = {{(void **)&cu.init, "cuInit"},
           {(void **)&cu.device_get, "cuDeviceGet"},
           {(void **)&cu.ctx_retain, "cuDevicePrimaryCtxRetain"},
           {(void **)&cu.ctx_set, "cuCtxSetCurrent"},
           {(void **)&cu.alloc, "cuMemAlloc_v2"},
           {(void **)&cu.free_, "cuMemFree_v2"},
           {(void **)&cu.dtoh, "cuMemcpyDtoH_v2"},
           {(void **)&cu.htod, "cuMemcpyHtoD_v2"},
           {(void **)&cu.dtod, "cuMemcpyDtoD_v2"},
           {(void **)&cu.alloc_host, "cuMemAllocHost_v2"},
           {(void **)&cu.free_host, "cuMemFreeHost"},
           {(void **)&cu.name, "cuDeviceGetName"},
           {(void **)&cu.sync, "cuCtxSynchronize"}};
  for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
    if (!(*s[i].fn = dlsym(h, s[i].sym))) {
      snprintf(why, cap, "libcuda.so.1 lacks %s", s[i].sym);
      return false;
    }
  cu.batch = (CUresult(*)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
                          size_t, CUstream))dlsym(h, "cuMemcpyBatchAsync_v2");
  cu.stream_create = (CUresult(*)(CUstream *, unsigned int))dlsym(h, "cuStreamCreate");
  cu.stream_sync = (CUresult(*)(CUstream))dlsym(h, "cuStreamSynchronize");
  cu.stream_destroy = (CUresult(*)(CUstream))dlsym(h, "cuStreamDestroy_v2");
  if (!cu.stream_create || !cu.stream_sync || !cu.stream_destroy) cu.batch = NULL;
  const char *k = getenv("HIXL_DEVMEM_COPY_KERNEL");
  cu.kernel = dlsym(h, "cuModuleLoadData") && dlsym(h, "cuLaunchKernel") && !(k && strcmp(k, "0") == 0);
  return true;
}

struct side {
  HixlEngine *e;
  char name[32];
  CUdeviceptr dev;
  uint8_t *host;
};

static bool side_up(struct side *s, const char *transport, uint16_t port, size_t len, const char *key) {
  HixlOption o[2] = {{"Transport", transport}, {"AuthKeyFile", key}};
  snprintf(s->name, sizeof(s->name), "127.0.0.1:%u", (unsigned)port);
  HixlMemHandle h;
  if (HixlEngineCreate(&s->e) != HIXL_SUCCESS ||
      HixlEngineInitialize(s->e, s->name, o, key ? 2 : 1) != HIXL_SUCCESS)
    return false;
  HixlMemDesc d = {.addr = (uintptr_t)s->dev, .len = len}, hd = {.addr = (uintptr_t)s->host, .len = len};
  if (HixlEngineRegisterMem(s->e, &d, HIXL_MEM_DEVICE, &h) != HIXL_SUCCESS) {
    fprintf(stderr, "hixl-gpu-check: registering device memory: %s\n", HixlGetLastErrorMessage());
    return false;
  }
  return HixlEngineRegisterMem(s->e, &hd, HIXL_MEM_HOST, &h) == HIXL_SUCCESS;
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 12));
}

/* One op of a's to b; the far side's bytes read back and compared with want. */
static bool check(struct side *a, struct side *b, HixlTransferOp op, bool local_dev, bool remote_dev,
                  size_t n, uint8_t *scratch, uint8_t *want, unsigned seed) {
  uint64_t l = local_dev ? (uint64_t)a->dev : (uintptr_t)a->host,
           r = remote_dev ? (uint64_t)b->dev : (uintptr_t)b->host;
  fill(want, n, seed);
  /* the source side gets the pattern (a pageable HtoD may return before its DMA ends) */
  if (op == HIXL_WRITE) {
    if (local_dev)
      cu.htod(a->dev, want, n);
    else
      memcpy(a->host, want, n);
  } else {
    if (remote_dev)
      cu.htod(b->dev, want, n);
    else
      memcpy(b->host, want, n);
  }
  cu.sync();
  HixlTransferOpDesc d = {.local_addr = l, .remote_addr = r, .len = n};
  if (HixlEngineTransferSync(a->e, b->name, op, &d, 1, 60000) != HIXL_SUCCESS) {
    fprintf(stderr, "hixl-gpu-check: %s: %s\n", op == HIXL_WRITE ? "WRITE" : "READ",
            HixlGetLastErrorMessage());
    return false;
  }
  bool dev = op == HIXL_WRITE ? remote_dev : local_dev;
  CUdeviceptr dp = op == HIXL_WRITE ? b->dev : a->dev;
  const uint8_t *hp = op == HIXL_WRITE ? b->host : a->host;
  if (dev)
    cu.dtoh(scratch, dp, n);
  else
    memcpy(scratch, hp, n);
  if (memcmp(scratch, want, n) != 0) {
    fprintf(stderr, "hixl-gpu-check: %s %s -> %s of %zu bytes: the bytes differ\n",
            op == HIXL_WRITE ? "WRITE" : "READ", local_dev ? "device" : "host",
            remote_dev ? "device" : "host", n);
    return false;
  }
  return true;
}

/* A TCP port on 127.0.0.1 held for the rest of the process (and its child): a socket
 * bound there with SO_REUSEADDR that never listens, so no parallel test's bind(:0) or
 * connect takes it, while an engine (SO_REUSEADDR too) listens on it; as the tests'
 * tu_free_port. A port chosen by pid and not held was taken by another test's
 * connection in a CI run ("Address already in use"). 0 when none. */
static uint16_t held_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  socklen_t sl = sizeof(sa);
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  return ntohs(sa.sin_port); /* fd stays open: the port is held until exit */
}

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The child of the IPC pass: its own CUDA, len bytes of device memory holding fill(,, 77)
 * registered in an engine at name (Transport shm, key); the memory's address on ready_fd
 * once it is up, then it waits for EOF on ctl_fd. Exit status 0 when all went well. */
static int ipc_child(const char *name, const char *key, size_t len, int ready_fd, int ctl_fd) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr d = 0;
  HixlEngine *e = NULL;
  HixlMemHandle h;
  HixlOption o[2] = {{"Transport", "shm"}, {"AuthKeyFile", key}};
  uint8_t *pat = malloc(len);
  char c = 0;
  if (!pat || cu.init(0) != CUDA_SUCCESS || cu.device_get(&dev, 0) != CUDA_SUCCESS ||
      cu.ctx_retain(&ctx, dev) != CUDA_SUCCESS || cu.ctx_set(ctx) != CUDA_SUCCESS || cu.alloc(&d, len))
    return 3;
  fill(pat, len, 77);
  HixlMemDesc md = {.addr = (uint64_t)d, .len = len};
  if (cu.htod(d, pat, len) != CUDA_SUCCESS || cu.sync() != CUDA_SUCCESS ||
      HixlEngineCreate(&e) != HIXL_SUCCESS || HixlEngineInitialize(e, name, o, 2) != HIXL_SUCCESS ||
      HixlEngineRegisterMem(e, &md, HIXL_MEM_DEVICE, &h) != HIXL_SUCCESS) {
    fprintf(stderr, "hixl-gpu-check: the IPC child: %s\n", HixlGetLastErrorMessage());
    return 4;
  }
  uint64_t at = (uint64_t)d;
  if (write(ready_fd, &at, sizeof(at)) != (ssize_t)sizeof(at)) return 5;
  while (read(ctl_fd, &c, 1) > 0) {
  }
  HixlEngineFinalize(e);
  HixlEngineDestroy(e);
  cu.free_(d);
  free(pat);
  return 0;
}

struct ipc_peer {
  pid_t pid;
  int ready, ctl; /* our ends of the pipes: its memory's address, and the EOF that ends it */
};

/* Fork the IPC pass's child (before this process starts CUDA: a forked CUDA context is
 * unusable); false when it cannot be. */
static bool ipc_fork(struct ipc_peer *p, const char *name, const char *key, size_t len) {
  int up[2], down[2];
  if (pipe(up) != 0) return false;
  if (pipe(down) != 0) {
    close(up[0]), close(up[1]);
    return false;
  }
  p->pid = fork();
  if (p->pid == 0) {
    close(up[0]), close(down[1]);
    _exit(ipc_child(name, key, len, up[1], down[0]));
  }
  close(up[1]), close(down[0]);
  p->ready = up[0], p->ctl = down[1];
  return p->pid > 0;
}

/* End the child: EOF, then its exit status (0: it went well). */
static int ipc_end(struct ipc_peer *p) {
  int st = 0;
  if (p->pid <= 0) return -1;
  close(p->ctl);
  close(p->ready);
  if (waitpid(p->pid, &st, 0) != p->pid) return -1;
  p->pid = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"mib", 1, 0, 'm'},  {"reps", 1, 0, 'r'}, {"op-kib", 1, 0, 'o'},
                                     {"json", 1, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  size_t mib = 64, op_kib = 256; /* the KV-shaped pass's ops: by default a run of 8 blocks of 32 KiB */
  int reps = 9, c;
  const char *json = NULL;
  char why[512];
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    if (c == 'm')
      mib = strtoul(optarg, NULL, 10);
    else if (c == 'r')
      reps = atoi(optarg);
    else if (c == 'o')
      op_kib = strtoul(optarg, NULL, 10);
    else if (c == 'j')
      json = optarg;
    else {
      printf("usage: hixl-gpu-check [--mib N] [--reps N] [--op-kib N] [--json FILE]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  /* A power of two up to 1 MiB: a whole number of ops a shm step */
  if (mib < 1 || mib > 4096 || reps < 1 || reps > 99 || op_kib < 4 || op_kib > 1024 ||
      (op_kib & (op_kib - 1)) || op_kib > mib << 10 || (mib << 10) / op_kib > 65536) {
    fprintf(stderr,
            "hixl-gpu-check: --mib 1..4096, --reps 1..99, --op-kib a power of two, 4..1024, at most --mib "
            "and at least --mib / 65536 (a call's most ops)\n");
    return 2;
  }
  const size_t ipc_op = op_kib << 10;
  if (!load(why, sizeof(why))) return skip(why);
  size_t len = mib << 20;
  char keyf[] = "/tmp/hixl-gpu-key-XXXXXX";
  int kfd = mkstemp(keyf);
  if (kfd < 0 || write(kfd, "6b65792d666f722d7468652d6770752d636865636b2d6f6e6c792d6f6b2e2e2e\n", 65) != 65)
    return 1;
  close(kfd);
  uint16_t port[5]; /* a, b, x, y and the IPC child's */
  for (int i = 0; i < 5; i++)
    if ((port[i] = held_port()) == 0) {
      fprintf(stderr, "hixl-gpu-check: no free TCP port on 127.0.0.1\n");
      unlink(keyf);
      return 1;
    }
  char child_name[32];
  snprintf(child_name, sizeof(child_name), "127.0.0.1:%u", (unsigned)port[4]);
  struct ipc_peer peer = {0};
  if (!ipc_fork(&peer, child_name, keyf, len)) {
    fprintf(stderr, "hixl-gpu-check: cannot fork the IPC pass's child\n");
    unlink(keyf);
    return 1;
  }
  CUdevice dev;
  CUcontext ctx;
  char gpu[128] = "?";
  if (cu.init(0) != CUDA_SUCCESS || cu.device_get(&dev, 0) != CUDA_SUCCESS) {
    ipc_end(&peer), unlink(keyf);
    return skip("the driver finds no GPU");
  }
  if (cu.ctx_retain(&ctx, dev) != CUDA_SUCCESS || cu.ctx_set(ctx) != CUDA_SUCCESS) {
    ipc_end(&peer), unlink(keyf);
    return skip("no context on GPU 0");
  }
  cu.name(gpu, sizeof(gpu), dev);
  struct side a = {0}, b = {0}, x = {0}, y = {0};
  uint8_t *want = malloc(len), *scratch = malloc(len);
  if (!want || !scratch || cu.alloc(&a.dev, len) || cu.alloc(&b.dev, len) ||
      cu.alloc_host((void **)&a.host, len) || cu.alloc_host((void **)&b.host, len)) {
    fprintf(stderr, "hixl-gpu-check: cannot allocate %zu MiB four times\n", mib);
    ipc_end(&peer), unlink(keyf);
    return 1;
  }
  x.dev = a.dev, x.host = a.host, y.dev = b.dev, y.host = b.host;
  uint64_t child_dev = 0;
  if (read(peer.ready, &child_dev, sizeof(child_dev)) != (ssize_t)sizeof(child_dev)) { /* its engine is up */
    fprintf(stderr, "hixl-gpu-check: the IPC pass's child did not come up (exit %d)\n", ipc_end(&peer));
    unlink(keyf);
    return 1;
  }
  if (!side_up(&a, "tcp", port[0], len, NULL) || !side_up(&b, "tcp", port[1], len, NULL) ||
      HixlEngineConnect(a.e, b.name, 10000) != HIXL_SUCCESS || !side_up(&x, "shm", port[2], len, keyf) ||
      !side_up(&y, "shm", port[3], len, keyf) || HixlEngineConnect(x.e, y.name, 10000) != HIXL_SUCCESS) {
    fprintf(stderr, "hixl-gpu-check: engines: %s\n", HixlGetLastErrorMessage());
    unlink(keyf);
    return 1;
  }
  unlink(keyf);
  printf("# hixl-gpu-check (hixl %s): GPU 0 %s, %zu MiB buffers\n", HixlVersionString(), gpu, mib);
  int bad = 0, checks = 0;
  size_t sizes[] = {4096, 1u << 20, len};
  struct side *pairs[2][2] = {{&a, &b}, {&x, &y}};
  for (int p = 0; p < 2; p++)
    for (size_t k = 0; k < 3; k++)
      for (int op = 0; op < 2; op++)
        for (int rd = 0; rd < 2; rd++, checks++)
          bad += !check(pairs[p][0], pairs[p][1], op ? HIXL_READ : HIXL_WRITE, true, rd, sizes[k], scratch,
                        want, (unsigned)(k * 4 + (unsigned)op * 2 + (unsigned)rd));
  printf("byte checks: %d of %d passed (tcp and a shm link; WRITE and READ; device -> device and device <-> "
         "host)\n",
         checks - bad, checks);
  /* figures */
  double t_dtod[99], t_dtoh[99], t_hixl_dev[99], t_hixl_host[99];
  HixlTransferOpDesc dd = {.local_addr = (uint64_t)a.dev, .remote_addr = (uint64_t)b.dev, .len = len};
  HixlTransferOpDesc hh = {.local_addr = (uintptr_t)a.host, .remote_addr = (uintptr_t)b.host, .len = len};
  for (int i = 0; i < reps; i++) {
    double t0 = now_s();
    cu.dtod(b.dev, a.dev, len); /* returns before the copy ends (no host synchronization DtoD) */
    cu.sync();
    double t1 = now_s();
    cu.dtoh(scratch, a.dev, len);
    double t2 = now_s();
    HixlStatus s1 = HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, &dd, 1, 60000);
    double t3 = now_s();
    HixlStatus s2 = HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, &hh, 1, 60000);
    double t4 = now_s();
    if (s1 != HIXL_SUCCESS || s2 != HIXL_SUCCESS) bad++;
    t_dtod[i] = t1 - t0, t_dtoh[i] = t2 - t1, t_hixl_dev[i] = t3 - t2, t_hixl_host[i] = t4 - t3;
  }
  /* Across processes: x READs the child's device memory over a shm link (CUDA IPC). */
  double t_ipc[99];
  int ipc_bad = 0;
  HixlTransferOpDesc id = {.local_addr = (uint64_t)x.dev, .remote_addr = child_dev, .len = len};
  if (HixlEngineConnect(x.e, child_name, 10000) != HIXL_SUCCESS) {
    fprintf(stderr, "hixl-gpu-check: connecting to the IPC pass's child: %s\n", HixlGetLastErrorMessage());
    ipc_bad = 1;
  }
  struct hixl_devmem_stats ds = {0}, dsb = {0};
  if (!ipc_bad && hixl_engine_devmem_stats(x.e, &dsb) != HIXL_SUCCESS) ipc_bad = 1;
  for (int i = 0; !ipc_bad && i < reps; i++) {
    cu.htod(x.dev, want, 4096); /* not the pattern: the READ must bring it */
    cu.sync();
    double t0 = now_s();
    HixlStatus st = HixlEngineTransferSync(x.e, child_name, HIXL_READ, &id, 1, 60000);
    t_ipc[i] = now_s() - t0;
    if (st != HIXL_SUCCESS) {
      fprintf(stderr, "hixl-gpu-check: READ of the child's device memory: %s\n", HixlGetLastErrorMessage());
      ipc_bad = 1;
      break;
    }
    if (i == 0) {
      fill(want, len, 77);
      cu.dtoh(scratch, x.dev, len);
      if (memcmp(scratch, want, len) != 0) {
        fprintf(stderr, "hixl-gpu-check: READ of the child's device memory: the bytes differ\n");
        ipc_bad = 1;
      }
    }
  }
  uint64_t one_copies = (uint64_t)reps * ((len + IPC_STEP - 1) / IPC_STEP);
  if (!ipc_bad &&
      (hixl_engine_devmem_stats(x.e, &ds) != HIXL_SUCCESS ||
       ds.ipc_bytes - dsb.ipc_bytes != (uint64_t)len * reps || ds.ipc_ops - dsb.ipc_ops != one_copies)) {
    fprintf(
        stderr,
        "hixl-gpu-check: READ of the child's device memory: %llu of %llu bytes went by CUDA IPC (the rest "
        "as tcp frames), in %llu copies (want %llu: one a step of %u MiB)\n",
        (unsigned long long)(ds.ipc_bytes - dsb.ipc_bytes),
        (unsigned long long)len * (unsigned long long)reps, (unsigned long long)(ds.ipc_ops - dsb.ipc_ops),
        (unsigned long long)one_copies, IPC_STEP >> 20);
    ipc_bad = 1;
  }
  /* The same bytes in KV's shape: ops of ipc_op each (256 KiB: a run of 8 blocks), in reverse
   * order (no two next to each other on both sides), one call; started together (by
   * the driver's batch call where it has one) and waited for once per IPC_BATCH ops
   * (copy_many). */
  double t_ops[99];
  size_t nops = len / ipc_op;
  HixlTransferOpDesc *od = calloc(nops ? nops : 1, sizeof(*od));
  struct hixl_devmem_stats ds0 = ds;
  if (!od) ipc_bad = 1;
  for (size_t k = 0; od && k < nops; k++)
    od[k] = (HixlTransferOpDesc){.local_addr = (uint64_t)x.dev + (nops - 1 - k) * ipc_op,
                                 .remote_addr = child_dev + k * ipc_op,
                                 .len = ipc_op};
  for (int i = 0; !ipc_bad && i < reps; i++) {
    cu.htod(x.dev, want + ipc_op, 4096); /* not the pattern's bytes there: the READ must bring them */
    cu.sync();
    double t0 = now_s();
    HixlStatus st = HixlEngineTransferSync(x.e, child_name, HIXL_READ, od, nops, 60000);
    t_ops[i] = now_s() - t0;
    if (st != HIXL_SUCCESS) {
      fprintf(stderr, "hixl-gpu-check: READ of the child's device memory in %zu ops: %s\n", nops,
              HixlGetLastErrorMessage());
      ipc_bad = 1;
      break;
    }
    if (i == 0) {
      fill(want, len, 77);
      cu.dtoh(scratch, x.dev, len);
      for (size_t k = 0; k < nops; k++)
        if (memcmp(scratch + (nops - 1 - k) * ipc_op, want + k * ipc_op, ipc_op) != 0) {
          fprintf(stderr, "hixl-gpu-check: READ in %zu ops: op %zu's bytes differ\n", nops, k);
          ipc_bad = 1;
          break;
        }
    }
  }
  /* Started many at a time: by hixl's copy kernel, else by the driver's batch call,
   * where the driver has either (a refused kernel falls back to the batch). */
  /* A wait per IPC_BATCH copies of a step, a step IPC_STEP device bytes of ops */
  size_t step_ops = IPC_STEP / ipc_op, rem_ops = nops % step_ops;
  uint64_t want_waits = (uint64_t)reps * ((nops / step_ops) * ((step_ops + IPC_BATCH - 1) / IPC_BATCH) +
                                          (rem_ops + IPC_BATCH - 1) / IPC_BATCH);
  uint64_t want_many = cu.batch || cu.kernel ? (uint64_t)nops * reps : 0;
  uint64_t gathered = 0, batched = 0;
  if (!ipc_bad && hixl_engine_devmem_stats(x.e, &ds) == HIXL_SUCCESS)
    gathered = ds.ipc_gathered - ds0.ipc_gathered, batched = ds.ipc_batched - ds0.ipc_batched;
  if (!ipc_bad && (ds.ipc_ops - ds0.ipc_ops != (uint64_t)nops * reps ||
                   ds.ipc_waits - ds0.ipc_waits != want_waits || gathered + batched != want_many)) {
    fprintf(
        stderr,
        "hixl-gpu-check: READ in %zu ops, %d times: %llu ops by CUDA IPC with %llu waits for the device, "
        "%llu started by the copy kernel and %llu by batch calls (want %llu, %llu and %llu in all: started "
        "together, waited for once per %d)\n",
        nops, reps, (unsigned long long)(ds.ipc_ops - ds0.ipc_ops),
        (unsigned long long)(ds.ipc_waits - ds0.ipc_waits), (unsigned long long)gathered,
        (unsigned long long)batched, (unsigned long long)nops * reps, (unsigned long long)want_waits,
        (unsigned long long)want_many, IPC_BATCH);
    ipc_bad = 1;
  }
  const char *how = gathered ? "hixl's copy kernel" : batched ? "cuMemcpyBatchAsync" : "a call each";
  /* The driver's best at that shape, in this process: the same ops device to device by
   * cuMemcpyBatchAsync (128 a call, as hixl's provider), one stream, waited for once. */
  double t_ref[99], ref_ops = 0;
  CUstream rs = NULL;
  if (cu.batch && nops > 0 && cu.stream_create(&rs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
    CUdeviceptr rd[128], rsrc[128];
    size_t rl[128], at0 = 0;
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    bool ok = true;
    for (int i = 0; ok && i < reps; i++) {
      double t0 = now_s();
      for (size_t k = 0; ok && k < nops; k += 128) {
        size_t m = nops - k < 128 ? nops - k : 128;
        for (size_t j = 0; j < m; j++)
          rd[j] = b.dev + (nops - 1 - (k + j)) * ipc_op, rsrc[j] = a.dev + (k + j) * ipc_op, rl[j] = ipc_op;
        ok = cu.batch(rd, rsrc, rl, m, &attr, &at0, 1, rs) == CUDA_SUCCESS;
      }
      ok = ok && cu.stream_sync(rs) == CUDA_SUCCESS;
      t_ref[i] = now_s() - t0;
    }
    cu.stream_destroy(rs);
    ref_ops = ok ? (double)len / 1e9 / median(t_ref, reps) : 0;
  }
  free(od);
  HixlEngineDisconnect(x.e, child_name, 5000);
  int child_rc = ipc_end(&peer);
  if (child_rc != 0) {
    fprintf(stderr, "hixl-gpu-check: the IPC pass's child exited %d\n", child_rc);
    ipc_bad = 1;
  }
  printf("byte check across processes (READ of another process's device memory over shm, CUDA IPC): %s\n",
         ipc_bad ? "FAILED" : "passed");
  bad += ipc_bad;
  double gb = (double)len / 1e9;
  double dtod = gb / median(t_dtod, reps), dtoh = gb / median(t_dtoh, reps),
         hdev = gb / median(t_hixl_dev, reps), hhost = gb / median(t_hixl_host, reps);
  printf("| what | GB/s | ratio |\n|---|---:|---|\n");
  printf("| cuMemcpyDtoD, %zu MiB | %.2f | reference |\n", mib, dtod);
  printf("| cuMemcpyDtoH, %zu MiB | %.2f | reference |\n", mib, dtoh);
  printf("| hixl WRITE device -> device, tcp | %.2f | %.2fx of cuMemcpyDtoH; %.2fx of host -> host over tcp "
         "(goal >= 0.8x) |\n",
         hdev, hdev / dtoh, hdev / hhost);
  printf("| hixl WRITE host -> host, tcp | %.2f | the same transfer from host memory |\n", hhost);
  double ipc = ipc_bad ? 0 : gb / median(t_ipc, reps), ipc_ops = ipc_bad ? 0 : gb / median(t_ops, reps);
  printf(
      "| hixl READ device -> device, another process, shm (CUDA IPC) | %.2f | %.2fx of cuMemcpyDtoD (goal >= "
      "0.8x) |\n",
      ipc, ipc / dtod);
  printf(
      "| the same READ as %zu ops of %zu KiB (KV's shape), one call, by %s | %.2f | %.2fx of cuMemcpyDtoD; "
      "%.2fx of the driver's batch below |\n",
      nops, op_kib, how, ipc_ops, ipc_ops / dtod, ref_ops > 0 ? ipc_ops / ref_ops : 0.0);
  if (ref_ops > 0)
    printf("| the same %zu copies in this process, cuMemcpyBatchAsync | %.2f | %.2fx of cuMemcpyDtoD (the "
           "driver's best at that shape) |\n",
           nops, ref_ops, ref_ops / dtod);
  else
    printf("| the same %zu copies in this process, cuMemcpyBatchAsync | - | the driver has none |\n", nops);
  if (json) {
    FILE *f = fopen(json, "w");
    if (f) {
      fprintf(
          f,
          "{\"gpu\": \"%s\", \"mib\": %zu, \"reps\": %d, \"byte_checks\": %d, \"byte_checks_failed\": %d, "
          "\"dtod_gbps\": %.3f, \"dtoh_gbps\": %.3f, \"hixl_dev_tcp_gbps\": %.3f, \"hixl_host_tcp_gbps\": "
          "%.3f, \"hixl_ipc_read_gbps\": %.3f, \"hixl_ipc_read_ops\": %zu, \"ipc_op_kib\": %zu, "
          "\"hixl_ipc_read_ops_gbps\": %.3f, "
          "\"batch_ref_ops_gbps\": %.3f, \"ipc_batched\": %llu, \"ipc_gathered\": %llu, \"ipc_ok\": %s}\n",
          gpu, mib, reps, checks, bad, dtod, dtoh, hdev, hhost, ipc, nops, op_kib, ipc_ops, ref_ops,
          (unsigned long long)batched, (unsigned long long)gathered, ipc_bad ? "false" : "true");
      fclose(f);
    }
  }
  struct side *all[4] = {&a, &b, &x, &y};
  for (int i = 0; i < 4; i++) {
    HixlEngineFinalize(all[i]->e);
    HixlEngineDestroy(all[i]->e);
  }
  cu.free_(a.dev), cu.free_(b.dev), cu.free_host(a.host), cu.free_host(b.host);
  free(want), free(scratch);
  return bad ? 1 : 0;
}
