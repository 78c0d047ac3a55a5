/* fake_cuda: a CUDA driver made of host memory, built as libcuda.so.1 in a folder of
 * its own for tests (the fakecuda_* CTests put it on LD_LIBRARY_PATH). It checks
 * hixl's use of the driver API where no GPU is: the entry points the CUDA provider,
 * hixl-gpu-check and the mock host look up by name, a current context around each
 * call that needs one, streams that run their work in order on a thread of their own
 * and call callbacks there, stream synchronization, pinned-memory registration, and IPC
 * handles opened by another process. It says nothing of CUDA's speed or of a device's
 * own behaviour: that is for a lent GPU (docs/device-memory.md).
 *
 * Device memory is a memfd mapped shared (so another process can map it by an IPC
 * handle: /proc/<pid>/fd/<fd>), one device (0). As on a GPU, the CPU cannot touch it:
 * its device pointer is a PROT_NONE mapping of the memfd (a load or store there faults,
 * and the kernel's copies to or from it fail EFAULT), and the fake's own copies go
 * through a second, readable and writable mapping of it. Copies are memcpy.
 * Prototypes from the toolkit's cuda.h, so each entry point has CUDA's own. */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAKE_API __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool inited;

/* ---- contexts: one primary context; a stack of current ones per thread ---- */
static int primary; /* its address is the context */
static _Thread_local CUcontext cur[16];
static _Thread_local int depth;

static CUresult need_ctx(void) {
  return depth > 0 && cur[depth - 1] ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

FAKE_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  inited = true;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (d != 0 || len < 1) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "hixl fake CUDA device (host memory)");
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *v = 0; /* no dma-buf, nothing else asked */
  (void)a;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *c = (CUcontext)&primary;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPushCurrent(CUcontext c) {
  if (c != (CUcontext)&primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (depth == 16) return CUDA_ERROR_INVALID_VALUE;
  cur[depth++] = c;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPopCurrent(CUcontext *c) {
  if (depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext was = cur[--depth];
  if (c) *c = was;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext c) {
  if (c && c != (CUcontext)&primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (depth == 0) depth = 1;
  cur[depth - 1] = c;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
  case CUDA_SUCCESS: *s = "no error (fake CUDA)"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument (fake CUDA)"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context (fake CUDA)"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory (fake CUDA)"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered (fake CUDA)"; break;
  default: *s = "an error of the fake CUDA driver"; break;
  }
  return CUDA_SUCCESS;
}

/* ---- device memory: allocations here, and mappings of other processes' ---- */
#define RANGES 256
static struct range {
  uintptr_t base; /* the device pointer: a mapping the CPU cannot touch */
  uintptr_t rw;   /* the same memory, mapped for the fake's own copies */
  size_t len;
  int fd;    /* an allocation's memfd (the IPC handle names it); -1 for a peer's mapping */
  bool peer; /* opened from an IPC handle */
} ranges[RANGES];

static struct range *range_of(uintptr_t p) { /* lock held */
  for (int i = 0; i < RANGES; i++)
    if (ranges[i].base && p >= ranges[i].base && p - ranges[i].base < ranges[i].len) return &ranges[i];
  return NULL;
}

/* Where the fake copies p, device memory of g: its readable mapping. */
static void *rw_of(const struct range *g, uintptr_t p) { return (void *)(g->rw + (p - g->base)); }

/* The device pointer and the fake's own mapping of len bytes of memfd f: false when
 * either cannot be made. */
static bool map_pair(int f, size_t len, uintptr_t *base, uintptr_t *rw) {
  void *b = mmap(NULL, len, PROT_NONE, MAP_SHARED, f, 0), *m = MAP_FAILED;
  if (b != MAP_FAILED) m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (m == MAP_FAILED) {
    if (b != MAP_FAILED) munmap(b, len);
    return false;
  }
  *base = (uintptr_t)b;
  *rw = (uintptr_t)m;
  return true;
}

static CUresult range_add(uintptr_t base, uintptr_t rw, size_t len, int fd, bool peer) {
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < RANGES; i++)
    if (!ranges[i].base) {
      ranges[i] = (struct range){base, rw, len, fd, peer};
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&lock);
  return r;
}

FAKE_API CUresult cuMemAlloc(CUdeviceptr *p, size_t len) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (len == 0) return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fake-cuda", 0);
  if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uintptr_t m, rw;
  if (!map_pair(fd, len, &m, &rw)) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if ((r = range_add(m, rw, len, fd, false)) != CUDA_SUCCESS) {
    munmap((void *)m, len);
    munmap((void *)rw, len);
    close(fd);
    return r;
  }
  *p = (CUdeviceptr)m;
  return CUDA_SUCCESS;
}

/* Unmap what base starts, an allocation (peer false) or a peer's mapping (true). */
static CUresult range_free(uintptr_t base, bool peer) {
  pthread_mutex_lock(&lock);
  struct range *g = range_of(base);
  struct range x = g && g->base == base && g->peer == peer ? *g : (struct range){0};
  if (x.base) *g = (struct range){0};
  pthread_mutex_unlock(&lock);
  if (!x.base) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)x.base, x.len);
  munmap((void *)x.rw, x.len);
  if (x.fd >= 0) close(x.fd);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemFree(CUdeviceptr p) {
  CUresult r = need_ctx();
  return r != CUDA_SUCCESS ? r : range_free((uintptr_t)p, false);
}

FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p) {
  pthread_mutex_lock(&lock);
  struct range *g = range_of((uintptr_t)p);
  struct range x = g ? *g : (struct range){0};
  pthread_mutex_unlock(&lock);
  if (!x.base) return CUDA_ERROR_INVALID_VALUE; /* host memory CUDA does not know */
  switch (a) {
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = CU_MEMORYTYPE_DEVICE; break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break; /* no managed memory here */
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)x.base; break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = x.len; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* ---- host memory ---- */
#define PINS 256
static struct {
  uintptr_t p;
  size_t n;
} pins[PINS];

FAKE_API CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!p || n == 0 || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < PINS; i++)
    if (pins[i].p && (uintptr_t)p < pins[i].p + pins[i].n && pins[i].p < (uintptr_t)p + n) {
      r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      break;
    }
  for (int i = 0; i < PINS && r == CUDA_ERROR_OUT_OF_MEMORY; i++)
    if (!pins[i].p) {
      pins[i].p = (uintptr_t)p;
      pins[i].n = n;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  return r;
}

FAKE_API CUresult cuMemHostUnregister(void *p) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < PINS; i++)
    if (pins[i].p == (uintptr_t)p) {
      pins[i].p = 0;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&lock);
  return r;
}

FAKE_API CUresult cuMemAllocHost(void **p, size_t n) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  return posix_memalign(p, 4096, n ? n : 1) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}

/* ---- streams: a thread each, running copies and callbacks in order ---- */
struct op {
  struct op *next;
  void *dst;
  const void *src;
  size_t n;
  CUstreamCallback cb; /* NULL: a copy */
  void *ud;
  bool fault; /* the copy faults when run (fakecuda_test_fault) */
};

/* A device fault, for tests: fakecuda_test_fault(n) lets n more copies start on streams
 * and makes the one after them fault when its stream runs it (nothing copied), as a
 * GPU's copy or kernel faults on an address. As on a GPU the context is then broken (sticky): every copy
 * started after it, and every wait, fails CUDA_ERROR_ILLEGAL_ADDRESS, callbacks are
 * told so; fakecuda_test_fault(-1) mends it (a GPU's stays broken). */
FAKE_API void fakecuda_test_fault(long n);
static long fault_after = -1; /* lock */
static bool faulted;          /* atomic */

FAKE_API void fakecuda_test_fault(long n) {
  pthread_mutex_lock(&lock);
  fault_after = n;
  if (n < 0) __atomic_store_n(&faulted, false, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&lock);
}

static CUresult fault_status(void) {
  return __atomic_load_n(&faulted, __ATOMIC_RELAXED) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

struct fstream {
  pthread_t t;
  pthread_mutex_t m;
  pthread_cond_t cv;
  struct op *head, *tail;
  bool busy, stop;
  struct fstream *next; /* the live streams (lock), which cuCtxSynchronize waits for */
};
static struct fstream *streams;

static void *stream_main(void *arg) {
  struct fstream *s = arg;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->m);
    struct op *o = s->head;
    if (!o) break;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    s->busy = true;
    pthread_mutex_unlock(&s->m);
    if (o->cb)
      o->cb((CUstream)s, fault_status(), o->ud);
    else if (!o->fault)
      memcpy(o->dst, o->src, o->n);
    free(o);
    pthread_mutex_lock(&s->m);
    s->busy = false;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->m);
  return NULL;
}

FAKE_API CUresult cuStreamCreate(CUstream *out, unsigned int flags) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  struct fstream *s = calloc(1, sizeof(*s));
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_init(&s->m, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->t, NULL, stream_main, s) != 0) {
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&lock);
  s->next = streams;
  streams = s;
  pthread_mutex_unlock(&lock);
  *out = (CUstream)s;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamSynchronize(CUstream st) {
  struct fstream *s = (struct fstream *)st;
  if (!s) return CUDA_SUCCESS; /* the legacy stream: its copies were made inline */
  pthread_mutex_lock(&s->m);
  while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->m);
  pthread_mutex_unlock(&s->m);
  return fault_status();
}

/* Returns once its work is done (CUDA's returns at once and frees it later). */
FAKE_API CUresult cuStreamDestroy(CUstream st) {
  struct fstream *s = (struct fstream *)st;
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  for (struct fstream **pp = &streams; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  pthread_mutex_unlock(&lock);
  pthread_mutex_lock(&s->m);
  s->stop = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->m);
  pthread_join(s->t, NULL);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->m);
  free(s);
  return CUDA_SUCCESS;
}

static CUresult enqueue(CUstream st, void *dst, const void *src, size_t n, CUstreamCallback cb, void *ud) {
  struct fstream *s = (struct fstream *)st;
  if (!s) { /* the legacy default stream: at once */
    if (cb)
      cb(st, CUDA_SUCCESS, ud);
    else
      memcpy(dst, src, n);
    return CUDA_SUCCESS;
  }
  bool fault = false;
  if (!cb) { /* a copy: none starts on a broken context; the one armed breaks it */
    pthread_mutex_lock(&lock);
    CUresult r = fault_status();
    if (r == CUDA_SUCCESS && fault_after == 0) {
      fault = true;
      fault_after = -1;
      __atomic_store_n(&faulted, true, __ATOMIC_RELAXED);
    } else if (r == CUDA_SUCCESS && fault_after > 0) {
      fault_after--;
    }
    pthread_mutex_unlock(&lock);
    if (r != CUDA_SUCCESS) return r;
  }
  struct op *o = malloc(sizeof(*o));
  if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
  *o = (struct op){NULL, dst, src, n, cb, ud, fault};
  pthread_mutex_lock(&s->m);
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->m);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamAddCallback(CUstream st, CUstreamCallback cb, void *ud, unsigned int flags) {
  if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return enqueue(st, NULL, NULL, 0, cb, ud);
}

/* Every stream's work done (the legacy stream's copies were made inline). Not for a
 * stream destroyed meanwhile, nor from a callback (CUDA forbids both). */
FAKE_API CUresult cuCtxSynchronize(void) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  for (struct fstream *s = streams; s; s = s->next) {
    pthread_mutex_lock(&s->m);
    while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->m);
    pthread_mutex_unlock(&s->m);
  }
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* A copy whose device side(s) must be device memory this process knows. */
static CUresult copy(void *dst, const void *src, size_t n, bool dst_dev, bool src_dev, CUstream st) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  struct range *d = dst_dev ? range_of((uintptr_t)dst) : NULL, *s = src_dev ? range_of((uintptr_t)src) : NULL;
  bool ok = (!dst_dev || (d && (uintptr_t)dst + n <= d->base + d->len)) &&
            (!src_dev || (s && (uintptr_t)src + n <= s->base + s->len));
  if (ok && d) dst = rw_of(d, (uintptr_t)dst);
  if (ok && s) src = rw_of(s, (uintptr_t)src);
  pthread_mutex_unlock(&lock);
  return ok ? enqueue(st, dst, src, n, NULL, NULL) : CUDA_ERROR_INVALID_VALUE;
}

#define DP(p) ((void *)(uintptr_t)(p))
FAKE_API CUresult cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) {
  return copy(DP(d), s, n, true, false, NULL);
}
FAKE_API CUresult cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) {
  return copy(d, DP(s), n, false, true, NULL);
}
FAKE_API CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) {
  return copy(DP(d), DP(s), n, true, true, NULL);
}
FAKE_API CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {
  return copy(DP(d), s, n, true, false, st);
}
FAKE_API CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {
  return copy(d, DP(s), n, false, true, st);
}
FAKE_API CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  return copy(DP(d), DP(s), n, true, true, st);
}
FAKE_API CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n,
                                    CUstream st) {
  if (dc != (CUcontext)&primary || sc != (CUcontext)&primary) return CUDA_ERROR_INVALID_CONTEXT;
  return copy(DP(d), DP(s), n, true, true, st);
}

/* CUDA 13's batch: each copy checked as cuMemcpy checks its pointers (device memory
 * this process knows, else host memory), the attributes as CUDA documents them, then
 * all queued in order (CUDA leaves their order open), or none. FAKECUDA_NO_BATCH=1:
 * refused as a driver that cannot (CUDA_ERROR_NOT_SUPPORTED), for the caller's
 * fallback. */
FAKE_API CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                     CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                                     CUstream st) {
  const char *off = getenv("FAKECUDA_NO_BATCH");
  if (off && strcmp(off, "1") == 0) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!st || !dsts || !srcs || !sizes || count == 0 || !attrs || !attrsIdxs || numAttrs == 0 ||
      numAttrs > count || attrsIdxs[0] != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < numAttrs; i++) {
    CUmemcpySrcAccessOrder o = attrs[i].srcAccessOrder;
    if ((i > 0 && attrsIdxs[i] <= attrsIdxs[i - 1]) || attrsIdxs[i] >= count ||
        (o != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM && o != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
         o != CU_MEMCPY_SRC_ACCESS_ORDER_ANY))
      return CUDA_ERROR_INVALID_VALUE;
  }
  void **to = malloc(2 * count * sizeof(*to)), **from = to + count;
  if (!to) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  bool ok = true;
  for (size_t i = 0; i < count && ok; i++) {
    struct range *d = range_of((uintptr_t)dsts[i]), *s = range_of((uintptr_t)srcs[i]);
    ok = (!d || dsts[i] + sizes[i] <= d->base + d->len) && (!s || srcs[i] + sizes[i] <= s->base + s->len) &&
         (d || s);
    to[i] = d ? rw_of(d, (uintptr_t)dsts[i]) : DP(dsts[i]);
    from[i] = s ? rw_of(s, (uintptr_t)srcs[i]) : DP(srcs[i]);
  }
  pthread_mutex_unlock(&lock);
  for (size_t i = 0; i < count && ok && r == CUDA_SUCCESS; i++)
    r = enqueue(st, to[i], from[i], sizes[i], NULL, NULL);
  free(to);
  return ok ? r : CUDA_ERROR_INVALID_VALUE;
}

/* ---- the copy kernel (core/src/devmem/gather.cu): a module made of its PTX ----
 * cuModuleLoadData takes PTX that defines hixl_gather_copy with a 3072-byte parameter
 * (gather.cu's struct, which the provider mirrors), nothing else; cuLaunchKernel of it
 * queues the copies its parameter names, in order, each checked as cuMemcpy checks
 * one, the launch's shape as CUDA bounds it. FAKECUDA_NO_KERNEL=1: the module refused
 * (CUDA_ERROR_NOT_SUPPORTED), as by a driver too old for its PTX. */
#define GATHER_MAX 128
struct gather_param {
  unsigned long long dst[GATHER_MAX], src[GATHER_MAX], len[GATHER_MAX];
};
static int gather_module, gather_fn; /* their addresses are the handles */

FAKE_API CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
  const char *off = getenv("FAKECUDA_NO_KERNEL");
  if (off && strcmp(off, "1") == 0) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!mod || !image) return CUDA_ERROR_INVALID_VALUE;
  const char *ptx = image;
  if (strncmp(ptx, ".version ", 9) != 0 || !strstr(ptx, ".visible .entry hixl_gather_copy(") ||
      !strstr(ptx, ".param .align 8 .b8 hixl_gather_copy_param_0[3072]"))
    return CUDA_ERROR_INVALID_PTX;
  *mod = (CUmodule)&gather_module;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
  if (!f || mod != (CUmodule)&gather_module || !name) return CUDA_ERROR_INVALID_VALUE;
  if (strcmp(name, "hixl_gather_copy") != 0) return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction)&gather_fn;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                 unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                 CUstream st, void **params, void **extra) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (f != (CUfunction)&gather_fn || gx == 0 || gx > 65535 || gy == 0 || gy > GATHER_MAX || gz != 1 ||
      bx == 0 || bx > 1024 || by != 1 || bz != 1 || shmem != 0 || !params || !params[0] || extra)
    return CUDA_ERROR_INVALID_VALUE;
  const struct gather_param *g = params[0]; /* read now, as CUDA copies the parameters at launch */
  void *to[GATHER_MAX], *from[GATHER_MAX];
  pthread_mutex_lock(&lock);
  bool ok = true;
  for (unsigned i = 0; i < gy && ok; i++) {
    struct range *d = range_of((uintptr_t)g->dst[i]), *s = range_of((uintptr_t)g->src[i]);
    ok = d && s && g->dst[i] + g->len[i] <= d->base + d->len && g->src[i] + g->len[i] <= s->base + s->len;
    if (ok) to[i] = rw_of(d, (uintptr_t)g->dst[i]), from[i] = rw_of(s, (uintptr_t)g->src[i]);
  }
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE; /* a GPU would fault in the kernel: CUDA_ERROR_ILLEGAL_ADDRESS */
  for (unsigned i = 0; i < gy; i++)
    if ((r = enqueue(st, to[i], from[i], g->len[i], NULL, NULL)) != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

/* ---- IPC: a handle names the owner's pid, the memfd and its length ---- */
#define IPC_MAGIC "fakecuda"

FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  struct range *g = range_of((uintptr_t)p);
  struct range x = g && g->base == (uintptr_t)p && !g->peer ? *g : (struct range){0};
  pthread_mutex_unlock(&lock);
  if (!x.base) return CUDA_ERROR_INVALID_VALUE; /* not the start of an allocation of this process */
  memset(h, 0, sizeof(*h));
  uint32_t pid = (uint32_t)getpid(), fd = (uint32_t)x.fd;
  uint64_t len = x.len;
  memcpy(h->reserved, IPC_MAGIC, 8);
  memcpy(h->reserved + 8, &pid, 4);
  memcpy(h->reserved + 12, &fd, 4);
  memcpy(h->reserved + 16, &len, 8);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  CUresult r = need_ctx();
  uint32_t pid, fd;
  uint64_t len;
  char path[64];
  if (r != CUDA_SUCCESS) return r;
  if (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  if (memcmp(h.reserved, IPC_MAGIC, 8) != 0) return CUDA_ERROR_INVALID_VALUE;
  memcpy(&pid, h.reserved + 8, 4);
  memcpy(&fd, h.reserved + 12, 4);
  memcpy(&len, h.reserved + 16, 8);
  if (pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* as CUDA: not in the owner */
  snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fd);
  int f = open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t m, rw;
  bool mapped = map_pair(f, (size_t)len, &m, &rw);
  close(f);
  if (!mapped) return CUDA_ERROR_OUT_OF_MEMORY;
  if ((r = range_add(m, rw, (size_t)len, -1, true)) != CUDA_SUCCESS) {
    munmap((void *)m, (size_t)len);
    munmap((void *)rw, (size_t)len);
    return r;
  }
  *p = (CUdeviceptr)m;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  CUresult r = need_ctx();
  return r != CUDA_SUCCESS ? r : range_free((uintptr_t)p, true);
}
