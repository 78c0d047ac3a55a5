/* devmem: the provider of this process (devmem.h): the CUDA driver API loaded at run
 * time, or in test builds the host-memory stand-in. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <linux/udmabuf.h>

#include "devmem/devmem.h"
#include "util/be.h"

/* The notice for the host (devmem_notice_take): devmem sits beside util/log, not above
 * it, so it logs nothing itself. */
static char notice[160];
static bool notice_due; /* atomic: notice is written before it is set */

bool devmem_notice_take(char *out, size_t cap) {
  if (!__atomic_exchange_n(&notice_due, false, __ATOMIC_ACQ_REL)) return false;
  snprintf(out, cap, "%s", notice);
  return true;
}

HixlStatus devmem_ipc_valid(const struct devmem_ipc *h, char *why, size_t cap) {
  if (!h) {
    snprintf(why, cap, "no IPC handle");
    return HIXL_PARAM_INVALID;
  }
  if (h->alloc_len == 0 || h->len == 0 || h->offset > h->alloc_len || h->len > h->alloc_len - h->offset) {
    snprintf(why, cap, "IPC handle: range [+%llu, +%llu) is not inside its allocation of %llu bytes",
             (unsigned long long)h->offset, (unsigned long long)h->len, (unsigned long long)h->alloc_len);
    return HIXL_PARAM_INVALID;
  }
  return HIXL_SUCCESS;
}

/* v[0..n) one at a time by dm's d2d, to_host and to_device (each waits: st->waits
 * counts them), up to the first that fails (*bad; n when none did). */
static HixlStatus copy_each(const struct devmem_ops *dm, const struct devmem_copy *v, size_t n, size_t *bad,
                            struct devmem_many *ms, char *why, size_t cap) {
  *bad = n;
  *ms = (struct devmem_many){0, 0, 0};
  for (size_t k = 0; k < n; k++) {
    const struct devmem_copy *c = &v[k];
    HixlStatus st;
    if (c->ddev >= 0 && c->sdev >= 0)
      st = dm->d2d(c->dst, c->ddev, c->src, c->sdev, c->n, why, cap);
    else if (c->ddev >= 0)
      st = dm->to_device(c->dst, (const void *)(uintptr_t)c->src, c->n, c->ddev, why, cap);
    else
      st = dm->to_host((void *)(uintptr_t)c->dst, c->src, c->n, c->sdev, why, cap);
    ms->waits++;
    if (st != HIXL_SUCCESS) {
      *bad = k;
      return st;
    }
  }
  return HIXL_SUCCESS;
}

#if defined(HIXL_HAVE_CUDA_H) || defined(HIXL_DEVMEM_TEST)
/* The host pages around [addr, addr + len) inside its allocation [start, start + size):
 * *lo and *hi; false when they reach past it. */
static bool page_span(uint64_t addr, uint64_t len, uint64_t start, uint64_t size, uint64_t *lo,
                      uint64_t *hi) {
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  *lo = addr & ~(pg - 1);
  *hi = (addr + len + pg - 1) & ~(pg - 1);
  return *lo >= start && *hi <= start + size;
}
#endif

#ifdef HIXL_HAVE_CUDA_H
#include <cuda.h>

/* The driver entry points used, by the names libcuda.so.1 exports them under. */
static struct {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*pointer_attr)(void *, CUpointer_attribute, CUdeviceptr);
  CUresult (*ctx_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext *);
  CUresult (*host_register)(void *, size_t, unsigned int);
  CUresult (*host_unregister)(void *);
  CUresult (*err_string)(CUresult, const char **);
  CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned int);
  CUresult (*ipc_close)(CUdeviceptr);
  CUresult (*dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*peer_async)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
  CUresult (*stream_create)(CUstream *, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_sync)(CUstream);
  CUresult (*stream_callback)(CUstream, CUstreamCallback, void *, unsigned int);
  CUresult (*dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*htod_async)(CUdeviceptr, const void *, size_t, CUstream);
  /* Optional: a driver before CUDA 11.7 has no dma-buf export (GPUDirect then falls back). */
  CUresult (*dev_attr)(int *, CUdevice_attribute, CUdevice);
  CUresult (*range_handle)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  /* Optional: CUDA 13's batch of copies in one call (a driver before it: a call each). */
  CUresult (*batch)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                    CUstream);
  /* Optional: the copy kernel's module and launch (gather.cu). */
  CUresult (*module_load)(CUmodule *, const void *);
  CUresult (*module_fn)(CUfunction *, CUmodule, const char *);
  CUresult (*launch)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                     unsigned int, unsigned int, CUstream, void **, void **);
} cu;
static bool cu_batch_off; /* atomic: the driver refused a batch once; a call each from then on */

#define CU_DEVICES_MAX 64
static CUcontext cu_ctx[CU_DEVICES_MAX]; /* each device's primary context, retained once */
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *cu_err(CUresult r) {
  const char *s = NULL;
  if (cu.err_string && cu.err_string(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

static bool cu_load(char *why, size_t cap) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, cap, "no CUDA driver on this host (dlopen libcuda.so.1: %s)", dlerror());
    return false;
  }
  struct {
    void **fn;
    const char *name;
  } syms[] = {{(void **)&cu.init, "cuInit"},
              {(void **)&cu.device_get, "cuDeviceGet"},
              {(void **)&cu.pointer_attr, "cuPointerGetAttribute"},
              {(void **)&cu.ctx_retain, "cuDevicePrimaryCtxRetain"},
              {(void **)&cu.ctx_push, "cuCtxPushCurrent_v2"},
              {(void **)&cu.ctx_pop, "cuCtxPopCurrent_v2"},
              {(void **)&cu.host_register, "cuMemHostRegister_v2"},
              {(void **)&cu.host_unregister, "cuMemHostUnregister"},
              {(void **)&cu.err_string, "cuGetErrorString"},
              {(void **)&cu.ipc_get, "cuIpcGetMemHandle"},
              {(void **)&cu.ipc_open, "cuIpcOpenMemHandle_v2"},
              {(void **)&cu.ipc_close, "cuIpcCloseMemHandle"},
              {(void **)&cu.dtod_async, "cuMemcpyDtoDAsync_v2"},
              {(void **)&cu.peer_async, "cuMemcpyPeerAsync"},
              {(void **)&cu.stream_create, "cuStreamCreate"},
              {(void **)&cu.stream_destroy, "cuStreamDestroy_v2"},
              {(void **)&cu.stream_sync, "cuStreamSynchronize"},
              {(void **)&cu.stream_callback, "cuStreamAddCallback"},
              {(void **)&cu.dtoh_async, "cuMemcpyDtoHAsync_v2"},
              {(void **)&cu.htod_async, "cuMemcpyHtoDAsync_v2"}};
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
    if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
      snprintf(why, cap, "libcuda.so.1 lacks %s: a driver older than this build's CUDA", syms[i].name);
      return false;
    }
  cu.dev_attr = (CUresult(*)(int *, CUdevice_attribute, CUdevice))dlsym(h, "cuDeviceGetAttribute");
  cu.range_handle = (CUresult(*)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long))dlsym(
      h, "cuMemGetHandleForAddressRange");
  cu.batch = (CUresult(*)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
                          size_t, CUstream))dlsym(h, "cuMemcpyBatchAsync_v2");
  const char *k = getenv("HIXL_DEVMEM_COPY_KERNEL");
  if (k && strcmp(k, "0") != 0 && strcmp(k, "1") != 0) { /* "off" or a typo: on, said, not silently */
    snprintf(notice, sizeof(notice),
             "HIXL_DEVMEM_COPY_KERNEL=\"%.40s\" is neither 0 nor 1: the copy kernel stays on", k);
    __atomic_store_n(&notice_due, true, __ATOMIC_RELEASE);
  }
  if (!k || strcmp(k, "0") != 0) {
    cu.module_load = (CUresult(*)(CUmodule *, const void *))dlsym(h, "cuModuleLoadData");
    cu.module_fn = (CUresult(*)(CUfunction *, CUmodule, const char *))dlsym(h, "cuModuleGetFunction");
    cu.launch =
        (CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                     unsigned int, unsigned int, CUstream, void **, void **))dlsym(h, "cuLaunchKernel");
  }
  CUresult r = cu.init(0);
  if (r != CUDA_SUCCESS) {
    snprintf(why, cap, "the CUDA driver does not start: cuInit: %s", cu_err(r));
    return false;
  }
  return true;
}

/* Device dev's primary context, made current on this thread; false with why. */
static bool cu_enter(int dev, char *why, size_t cap) {
  CUresult r = CUDA_SUCCESS;
  if (dev < 0 || dev >= CU_DEVICES_MAX) {
    snprintf(why, cap, "device %d is beyond the %d this build handles", dev, CU_DEVICES_MAX);
    return false;
  }
  pthread_mutex_lock(&cu_lock);
  if (!cu_ctx[dev]) {
    CUdevice d;
    if ((r = cu.device_get(&d, dev)) == CUDA_SUCCESS) r = cu.ctx_retain(&cu_ctx[dev], d);
  }
  pthread_mutex_unlock(&cu_lock);
  if (r == CUDA_SUCCESS) r = cu.ctx_push(cu_ctx[dev]);
  if (r != CUDA_SUCCESS) snprintf(why, cap, "device %d: no context: %s", dev, cu_err(r));
  return r == CUDA_SUCCESS;
}

static void cu_leave(void) {
  CUcontext c;
  cu.ctx_pop(&c);
}

static HixlStatus cu_query(uint64_t addr, uint64_t len, int *device, char *why, size_t cap) {
  unsigned int type = 0;
  int ord = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUresult r = cu.pointer_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)addr);
  if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE) {
    snprintf(why, cap, "0x%llx is not CUDA device memory (%s)", (unsigned long long)addr,
             r != CUDA_SUCCESS ? cu_err(r) : "host or managed memory");
    return HIXL_PARAM_INVALID;
  }
  if ((r = cu.pointer_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)addr)) != CUDA_SUCCESS ||
      (r = cu.pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)addr)) !=
          CUDA_SUCCESS ||
      (r = cu.pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)addr)) != CUDA_SUCCESS) {
    snprintf(why, cap, "0x%llx: %s", (unsigned long long)addr, cu_err(r));
    return HIXL_PARAM_INVALID;
  }
  if (addr + len > (uint64_t)start + size) {
    snprintf(why, cap, "[0x%llx, +%llu) runs past its allocation [0x%llx, +%zu) on device %d",
             (unsigned long long)addr, (unsigned long long)len, (unsigned long long)start, size, ord);
    return HIXL_PARAM_INVALID;
  }
  *device = ord;
  return HIXL_SUCCESS;
}

/* The synchronous copies run on streams of their own, waited for: the plain calls
 * (cuMemcpyHtoD, cuMemcpyDtoD, cuMemcpyPeer) may return before their copy ends (from
 * pageable memory, or device to device), and they go on the legacy default stream,
 * which waits for every blocking stream of the context (the runtime's compute). A few
 * non-blocking streams per device are kept for them. */
#define CU_SPARE_STREAMS 8
static struct {
  CUstream s[CU_SPARE_STREAMS];
  int n;
} cu_spare[CU_DEVICES_MAX]; /* cu_lock */

/* A spare stream of dev's (its context current), made when none is spare. */
static CUresult cu_spare_get(int dev, CUstream *s) {
  *s = NULL;
  pthread_mutex_lock(&cu_lock);
  if (cu_spare[dev].n > 0) *s = cu_spare[dev].s[--cu_spare[dev].n];
  pthread_mutex_unlock(&cu_lock);
  return *s ? CUDA_SUCCESS : cu.stream_create(s, CU_STREAM_NON_BLOCKING);
}

/* Wait for everything on s, then keep it spare (destroyed when its wait failed or
 * enough are spare): the wait's result. */
static CUresult cu_spare_put(int dev, CUstream s) {
  CUresult w = cu.stream_sync(s); /* also after a failed start: nothing of it may be left running */
  pthread_mutex_lock(&cu_lock);
  if (w == CUDA_SUCCESS && cu_spare[dev].n < CU_SPARE_STREAMS) {
    cu_spare[dev].s[cu_spare[dev].n++] = s;
    s = NULL;
  }
  pthread_mutex_unlock(&cu_lock);
  if (s) cu.stream_destroy(s);
  return w;
}

/* copy_many: each copy started on a spare stream of the device d2d, to_host or
 * to_device would run it on (a peer copy: the source's), with that device's context
 * current; then each stream waited for once. Copies inside one device's memory next to
 * each other in v start CU_GATHER to a launch of the copy kernel (below), else
 * CU_BATCH to a cuMemcpyBatchAsync where the driver has it (CUDA 13): a call costs
 * about what a 256 KiB copy takes, so a KV pull of many runs of blocks spent its time
 * calling. At most CU_MANY_DEVS devices' streams at once: a copy on another device
 * first waits for those. */
#define CU_MANY_DEVS 4
#define CU_BATCH     128
struct cu_many {
  int dev[CU_MANY_DEVS];
  CUstream s[CU_MANY_DEVS];
  size_t n;
  uint32_t waits, batched, gathered;
};

/* Wait for every stream of m (each with its context current); the first failure. */
static CUresult cu_many_wait(struct cu_many *m) {
  CUresult r = CUDA_SUCCESS;
  char why[128];
  for (size_t i = 0; i < m->n; i++) {
    CUresult w = CUDA_ERROR_INVALID_CONTEXT;
    if (cu_enter(m->dev[i], why, sizeof(why))) { /* entered once before: cannot fail now */
      w = cu_spare_put(m->dev[i], m->s[i]);
      cu_leave();
    }
    m->waits++;
    if (r == CUDA_SUCCESS) r = w;
  }
  m->n = 0;
  return r;
}

/* m's stream of dev (dev's context current), taken when m has none yet. */
static CUresult cu_many_stream(struct cu_many *m, int dev, CUstream *s) {
  size_t i = 0;
  while (i < m->n && m->dev[i] != dev) i++;
  if (i == m->n) {
    CUresult r = cu_spare_get(dev, &m->s[i]);
    if (r != CUDA_SUCCESS) return r;
    m->dev[i] = dev;
    m->n++;
  }
  *s = m->s[i];
  return CUDA_SUCCESS;
}

/* Start c on s (its device's context current); its name for messages. */
static CUresult cu_start(CUstream s, const struct devmem_copy *c, const char **what) {
  if (c->ddev >= 0 && c->sdev >= 0 && c->ddev == c->sdev) {
    *what = "cuMemcpyDtoDAsync";
    return cu.dtod_async((CUdeviceptr)c->dst, (CUdeviceptr)c->src, c->n, s);
  }
  if (c->ddev >= 0 && c->sdev >= 0) {
    *what = "cuMemcpyPeerAsync";
    return cu.peer_async((CUdeviceptr)c->dst, cu_ctx[c->ddev], (CUdeviceptr)c->src, cu_ctx[c->sdev], c->n, s);
  }
  if (c->ddev >= 0) {
    *what = "cuMemcpyHtoDAsync";
    return cu.htod_async((CUdeviceptr)c->dst, (const void *)(uintptr_t)c->src, c->n, s);
  }
  *what = "cuMemcpyDtoHAsync";
  return cu.dtoh_async((void *)(uintptr_t)c->dst, (CUdeviceptr)c->src, c->n, s);
}

/* Whether c copies inside one device's memory (what a batch call takes here). */
static bool cu_in_device(const struct devmem_copy *c) { return c->ddev >= 0 && c->ddev == c->sdev; }

/* The end of the run from v[k] (inside dev's memory) that one call takes: at most most
 * copies, each inside dev's memory and of at most len bytes. */
static size_t cu_run_end(const struct devmem_copy *v, size_t k, size_t n, int dev, size_t most, size_t len) {
  size_t j = k + 1;
  while (j < n && j - k < most && cu_in_device(&v[j]) && v[j].sdev == dev && v[j].n <= len) j++;
  return j;
}

/* The copy kernel (gather.cu, its PTX in gather_ptx.h): one launch copies up to
 * CU_GATHER ranges inside one device, each of at most CU_GATHER_LEN bytes (larger ones
 * go to the copy engines, a call each, where a call's cost is small beside the copy).
 * Loaded once per device, in its primary context, at its first use; a device whose
 * driver cannot load it (a driver before CUDA 11.0 takes no PTX 7.0), or a launch
 * refused, turns it off for that device: batch calls or a call each then.
 * HIXL_DEVMEM_COPY_KERNEL=0 leaves it unused (copies by the copy engines alone, as a
 * runtime that keeps its SMs to itself may want). */
#include "devmem/gather_ptx.h"
#define CU_GATHER     128
#define CU_GATHER_LEN (4u << 20)
#define CU_GATHER_THR 256 /* threads a block */
struct cu_gather {        /* gather.cu's struct hixl_gather, passed by value */
  unsigned long long dst[CU_GATHER], src[CU_GATHER], len[CU_GATHER];
};
_Static_assert(sizeof(struct cu_gather) == 3072, "gather.cu's parameter is 3072 bytes");
static CUfunction cu_gather_fn[CU_DEVICES_MAX];  /* cu_lock */
static signed char cu_gather_st[CU_DEVICES_MAX]; /* cu_lock: 0 not tried, 1 loaded, -1 off */

/* dev's copy kernel (its context current), or NULL: none, or it could not be loaded. */
static CUfunction cu_gather_get(int dev) {
  CUfunction f = NULL;
  if (!cu.module_load || !cu.module_fn || !cu.launch) return NULL;
  pthread_mutex_lock(&cu_lock);
  if (cu_gather_st[dev] == 0) {
    CUmodule mod;
    bool ok = cu.module_load(&mod, hixl_gather_ptx) == CUDA_SUCCESS &&
              cu.module_fn(&cu_gather_fn[dev], mod, "hixl_gather_copy") == CUDA_SUCCESS;
    cu_gather_st[dev] = ok ? 1 : -1; /* the module stays loaded with the context */
  }
  if (cu_gather_st[dev] == 1) f = cu_gather_fn[dev];
  pthread_mutex_unlock(&cu_lock);
  return f;
}

/* v[0..n) (n <= CU_GATHER, each inside dev's memory, at most CU_GATHER_LEN) started on
 * s by one launch of f. Refused: nothing started, the kernel off for dev. */
static CUresult cu_start_gather(CUfunction f, int dev, CUstream s, const struct devmem_copy *v, size_t n) {
  struct cu_gather g;
  size_t most = 0;
  for (size_t i = 0; i < n; i++) {
    g.dst[i] = v[i].dst, g.src[i] = v[i].src, g.len[i] = v[i].n;
    if (v[i].n > most) most = v[i].n;
  }
  /* blocks a range: one per 8 KiB of the longest (16 bytes a thread, 2 loads each), 1 to 64:
   * enough blocks in flight that each SM has loads outstanding */
  size_t bx = most / (8u << 10);
  bx = bx < 1 ? 1 : bx > 64 ? 64 : bx;
  void *args[] = {&g};
  CUresult r = cu.launch(f, (unsigned)bx, (unsigned)n, 1, CU_GATHER_THR, 1, 1, 0, s, args, NULL);
  if (r != CUDA_SUCCESS) {
    pthread_mutex_lock(&cu_lock);
    cu_gather_st[dev] = -1;
    pthread_mutex_unlock(&cu_lock);
  }
  return r;
}

/* v[0..n) (n <= CU_BATCH, each inside dev's memory) started on s by one batch call.
 * A driver that refuses it: whatever it started is waited for, then each is started
 * alone; if they all start so, batches are off for good (the driver's, not the
 * copies'). *started: how many started before the one that failed. */
static CUresult cu_start_batch(struct cu_many *m, CUstream s, const struct devmem_copy *v, size_t n,
                               size_t *started, const char **what) {
  CUdeviceptr dst[CU_BATCH], src[CU_BATCH];
  size_t len[CU_BATCH], at0 = 0;
  CUmemcpyAttributes attr;
  memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  for (size_t i = 0; i < n; i++)
    dst[i] = (CUdeviceptr)v[i].dst, src[i] = (CUdeviceptr)v[i].src, len[i] = v[i].n;
  *started = 0;
  *what = "cuMemcpyBatchAsync";
  CUresult r = cu.batch(dst, src, len, n, &attr, &at0, 1, s);
  if (r == CUDA_SUCCESS) {
    *started = n;
    m->batched += (uint32_t)n;
    return r;
  }
  if ((r = cu.stream_sync(s)) != CUDA_SUCCESS) {
    *what = "cuStreamSynchronize after a refused cuMemcpyBatchAsync";
    return r;
  }
  for (; *started < n; (*started)++)
    if ((r = cu_start(s, &v[*started], what)) != CUDA_SUCCESS) return r;
  __atomic_store_n(&cu_batch_off, true, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}

static HixlStatus cu_copy_many(const struct devmem_copy *v, size_t n, size_t *bad, struct devmem_many *ms,
                               char *why, size_t cap) {
  struct cu_many m = {.n = 0, .waits = 0, .batched = 0, .gathered = 0};
  CUresult r = CUDA_SUCCESS;
  const char *what = "";
  bool batch = cu.batch && !__atomic_load_n(&cu_batch_off, __ATOMIC_RELAXED);
  *bad = n;
  for (size_t k = 0; k < n;) {
    const struct devmem_copy *c = &v[k];
    int dev = c->sdev >= 0 ? c->sdev : c->ddev; /* a peer copy on the source's, as cu_d2d's */
    if (dev < 0) {
      snprintf(why, cap, "copy %zu of %zu: neither side is device memory", k, n);
      *bad = k;
      break;
    }
    bool known = false;
    for (size_t i = 0; i < m.n; i++) known |= m.dev[i] == dev;
    if (!known && m.n == CU_MANY_DEVS && (r = cu_many_wait(&m)) != CUDA_SUCCESS) {
      snprintf(why, cap, "cuStreamSynchronize: %s", cu_err(r));
      *bad = 0; /* which of those ended cannot be told */
      break;
    }
    /* A peer copy names both contexts: the destination's retained too (cu_enter). */
    if (c->ddev >= 0 && c->sdev >= 0 && c->ddev != c->sdev) {
      if (!cu_enter(c->ddev, why, cap)) {
        *bad = k;
        break;
      }
      cu_leave();
    }
    if (!cu_enter(dev, why, cap)) {
      *bad = k;
      break;
    }
    /* The copies from k on that one launch of the copy kernel takes, else one batch
     * call, else k alone. */
    size_t j = k + 1, started = 0;
    CUstream s = NULL;
    what = "cuStreamCreate";
    r = cu_many_stream(&m, dev, &s);
    CUfunction f = r == CUDA_SUCCESS && cu_in_device(c) && c->n <= CU_GATHER_LEN ? cu_gather_get(dev) : NULL;
    if (f) {
      j = cu_run_end(v, k, n, dev, CU_GATHER, CU_GATHER_LEN);
      if (cu_start_gather(f, dev, s, c, j - k) == CUDA_SUCCESS) {
        m.gathered += (uint32_t)(j - k);
        cu_leave();
        k = j;
        continue;
      }
      j = k + 1; /* refused: nothing started; as if there were no kernel */
    }
    if (batch && cu_in_device(c)) j = cu_run_end(v, k, n, dev, CU_BATCH, SIZE_MAX);
    if (r == CUDA_SUCCESS && j - k > 1)
      r = cu_start_batch(&m, s, c, j - k, &started, &what);
    else if (r == CUDA_SUCCESS)
      r = cu_start(s, c, &what);
    cu_leave();
    if (r != CUDA_SUCCESS) {
      c = &v[k + started];
      snprintf(why, cap, "%s of %zu bytes, device %d to %d: %s", what, c->n, c->sdev, c->ddev, cu_err(r));
      *bad = k + started;
      break;
    }
    k = j;
  }
  /* A failed wait fails them all, a start failed before it too: which of those started
   * ended cannot be told (a fault breaks the context, so a later start fails with it). */
  if ((r = cu_many_wait(&m)) != CUDA_SUCCESS) {
    if (*bad == n) snprintf(why, cap, "cuStreamSynchronize after %zu copies: %s", n, cu_err(r));
    *bad = 0;
  }
  *ms = (struct devmem_many){.waits = m.waits, .batched = m.batched, .gathered = m.gathered};
  return *bad == n ? HIXL_SUCCESS : HIXL_FAILED;
}

/* One copy, waited for: copy_many of one. */
static HixlStatus cu_copy_one(struct devmem_copy c, char *why, size_t cap) {
  size_t bad;
  struct devmem_many ms;
  return cu_copy_many(&c, 1, &bad, &ms, why, cap);
}

static HixlStatus cu_to_host(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap) {
  return cu_copy_one(
      (struct devmem_copy){.dst = (uintptr_t)dst, .src = src, .n = n, .ddev = -1, .sdev = device}, why, cap);
}

static HixlStatus cu_to_device(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap) {
  return cu_copy_one(
      (struct devmem_copy){.dst = dst, .src = (uintptr_t)src, .n = n, .ddev = device, .sdev = -1}, why, cap);
}

static HixlStatus cu_host_pin(void *p, size_t n, int device, char *why, size_t cap) {
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.host_register(p, n, CU_MEMHOSTREGISTER_PORTABLE);
  cu_leave();
  if (r != CUDA_SUCCESS)
    snprintf(why, cap, "cuMemHostRegister of %zu bytes on device %d: %s", n, device, cu_err(r));
  return r == CUDA_SUCCESS ? HIXL_SUCCESS : HIXL_RESOURCE_EXHAUSTED;
}

static void cu_host_unpin(void *p, size_t n, int device) {
  char why[128];
  (void)n;
  if (!cu_enter(device, why, sizeof(why))) return;
  cu.host_unregister(p);
  cu_leave();
}

_Static_assert(sizeof(CUipcMemHandle) == DEVMEM_IPC_BLOB, "a CUipcMemHandle fills devmem_ipc.blob");

/* The handle names the whole allocation (cuIpcGetMemHandle takes its base), the range
 * its offset in it. */
static HixlStatus cu_ipc_export(uint64_t addr, uint64_t len, int device, struct devmem_ipc *out, char *why,
                                size_t cap) {
  CUdeviceptr start = 0;
  size_t size = 0;
  CUipcMemHandle h;
  CUresult r;
  if (len == 0 || !out) {
    snprintf(why, cap, "ipc_export: %s", len == 0 ? "an empty range" : "no handle to fill");
    return HIXL_PARAM_INVALID;
  }
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  if ((r = cu.pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)addr)) ==
          CUDA_SUCCESS &&
      (r = cu.pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)addr)) == CUDA_SUCCESS)
    r = cu.ipc_get(&h, start);
  cu_leave();
  if (r != CUDA_SUCCESS) {
    snprintf(why, cap, "[0x%llx, +%llu) on device %d cannot be shared (cuIpcGetMemHandle: %s)",
             (unsigned long long)addr, (unsigned long long)len, device, cu_err(r));
    return HIXL_UNSUPPORTED;
  }
  if (addr < (uint64_t)start || addr - (uint64_t)start > size || len > size - (addr - (uint64_t)start)) {
    snprintf(why, cap, "[0x%llx, +%llu) runs past its allocation [0x%llx, +%zu)", (unsigned long long)addr,
             (unsigned long long)len, (unsigned long long)start, size);
    return HIXL_PARAM_INVALID;
  }
  memset(out, 0, sizeof(*out));
  memcpy(out->blob, &h, sizeof(h));
  out->alloc_len = size;
  out->offset = addr - (uint64_t)start;
  out->len = len;
  return HIXL_SUCCESS;
}

/* Opened with lazy peer access (the allocation may be on another device than ours);
 * the mapping must be as long as the handle says. */
static HixlStatus cu_ipc_open(const struct devmem_ipc *hd, int device, uint64_t *base, char *why,
                              size_t cap) {
  CUipcMemHandle h;
  CUdeviceptr p = 0;
  size_t size = 0;
  HixlStatus st = devmem_ipc_valid(hd, why, cap);
  if (st != HIXL_SUCCESS) return st;
  if (!base) {
    snprintf(why, cap, "ipc_open: nowhere to put the base");
    return HIXL_PARAM_INVALID;
  }
  memcpy(&h, hd->blob, sizeof(h));
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.ipc_open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    cu_leave();
    snprintf(why, cap, "cuIpcOpenMemHandle on device %d: %s", device, cu_err(r));
    return HIXL_FAILED;
  }
  r = cu.pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
  if (r != CUDA_SUCCESS || size < hd->alloc_len) {
    cu.ipc_close(p);
    cu_leave();
    snprintf(why, cap, "IPC handle says %llu bytes; the allocation it opens has %zu (%s)",
             (unsigned long long)hd->alloc_len, size, r != CUDA_SUCCESS ? cu_err(r) : "shorter");
    return HIXL_PARAM_INVALID;
  }
  cu_leave();
  *base = (uint64_t)p;
  return HIXL_SUCCESS;
}

static void cu_ipc_close(uint64_t base, uint64_t alloc_len, int device) {
  char why[128];
  (void)alloc_len;
  if (!cu_enter(device, why, sizeof(why))) return;
  cu.ipc_close((CUdeviceptr)base);
  cu_leave();
}

static HixlStatus cu_d2d(uint64_t dst, int ddev, uint64_t src, int sdev, size_t n, char *why, size_t cap) {
  return cu_copy_one((struct devmem_copy){.dst = dst, .src = src, .n = n, .ddev = ddev, .sdev = sdev}, why,
                     cap);
}

/* A GPUDirect peer-memory client, found as NCCL, UCX and NVSHMEM find it: its sysfs
 * files (nvidia-peermem of the driver since 470, or MLNX_OFED's nv_peer_mem). With
 * one loaded, ibv_reg_mr pins device memory by its address. */
static bool cu_peer_mem(char *why, size_t cap) {
  static const char *const files[] = {
      "/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
      "/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version"};
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
    if (access(files[i], F_OK) == 0) return true;
  snprintf(why, cap,
           "no GPUDirect peer-memory client is loaded (nvidia-peermem: `modprobe nvidia-peermem`; none of "
           "/sys/kernel/mm/memory_peers/nv_mem*, /sys/module/nvidia_peermem, /sys/module/nv_peer_mem)");
  return false;
}

/* cuMemGetHandleForAddressRange over the host pages around the range (it takes nothing
 * finer), where the device says it exports dma-bufs. */
static HixlStatus cu_dmabuf(uint64_t addr, uint64_t len, int device, int *fd, uint64_t *offset, char *why,
                            size_t cap) {
  CUdeviceptr start = 0;
  size_t size = 0;
  CUdevice d;
  int ok = 0, h = -1;
  uint64_t lo = 0, hi = 0;
  if (!cu.dev_attr || !cu.range_handle) {
    snprintf(why, cap, "libcuda.so.1 lacks cuMemGetHandleForAddressRange (a driver before CUDA 11.7)");
    return HIXL_UNSUPPORTED;
  }
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.device_get(&d, device);
  if (r == CUDA_SUCCESS) r = cu.dev_attr(&ok, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
  if (r == CUDA_SUCCESS && ok &&
      (r = cu.pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)addr)) ==
          CUDA_SUCCESS &&
      (r = cu.pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)addr)) == CUDA_SUCCESS &&
      page_span(addr, len, start, size, &lo, &hi))
    r = cu.range_handle(&h, (CUdeviceptr)lo, hi - lo, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  cu_leave();
  if (r != CUDA_SUCCESS || !ok || h < 0) {
    if (r != CUDA_SUCCESS)
      snprintf(why, cap, "[0x%llx, +%llu) on device %d: no dma-buf (cuMemGetHandleForAddressRange: %s)",
               (unsigned long long)addr, (unsigned long long)len, device, cu_err(r));
    else if (!ok)
      snprintf(why, cap, "device %d exports no dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)",
               device);
    else
      snprintf(why, cap, "[0x%llx, +%llu): its host pages reach past its allocation [0x%llx, +%zu)",
               (unsigned long long)addr, (unsigned long long)len, (unsigned long long)start, size);
    return HIXL_UNSUPPORTED;
  }
  *fd = h;
  *offset = addr - lo;
  return HIXL_SUCCESS;
}

static HixlStatus cu_stream_new(int device, void **stream, char *why, size_t cap) {
  CUstream st = NULL;
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.stream_create(&st, CU_STREAM_NON_BLOCKING);
  cu_leave();
  if (r != CUDA_SUCCESS) {
    snprintf(why, cap, "cuStreamCreate on device %d: %s", device, cu_err(r));
    return HIXL_RESOURCE_EXHAUSTED;
  }
  *stream = st;
  return HIXL_SUCCESS;
}

static void cu_stream_free(void *stream, int device) {
  char why[128];
  if (!cu_enter(device, why, sizeof(why))) return;
  cu.stream_destroy((CUstream)stream);
  cu_leave();
}

struct cu_done {
  devmem_done_fn done;
  void *arg;
};

/* On the driver's thread, once the copy before it on the stream ended: no CUDA call
 * here (the driver forbids it), so a failure is named by its number. */
static void CUDA_CB cu_copied(CUstream s, CUresult r, void *ud) {
  struct cu_done d = *(struct cu_done *)ud;
  char why[96] = "";
  (void)s;
  free(ud);
  if (r != CUDA_SUCCESS)
    snprintf(why, sizeof(why), "an asynchronous device copy failed: CUDA error %d", (int)r);
  d.done(d.arg, r == CUDA_SUCCESS ? HIXL_SUCCESS : HIXL_FAILED, why);
}

/* cuMemcpyHtoDAsync / DtoHAsync on the stream, then a callback behind it. */
static HixlStatus cu_copy_async(void *stream, int device, bool to_dev, uint64_t dev, void *host, size_t n,
                                devmem_done_fn done, void *arg, char *why, size_t cap) {
  struct cu_done *d = malloc(sizeof(*d));
  if (!d) {
    snprintf(why, cap, "out of memory for a device copy");
    return HIXL_RESOURCE_EXHAUSTED;
  }
  *d = (struct cu_done){done, arg};
  if (!cu_enter(device, why, cap)) {
    free(d);
    return HIXL_FAILED;
  }
  CUstream s = (CUstream)stream;
  CUresult r =
      to_dev ? cu.htod_async((CUdeviceptr)dev, host, n, s) : cu.dtoh_async(host, (CUdeviceptr)dev, n, s);
  if (r != CUDA_SUCCESS) {
    cu_leave();
    free(d);
    snprintf(why, cap, "%s of %zu bytes on device %d: %s", to_dev ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
             n, device, cu_err(r));
    return HIXL_FAILED;
  }
  r = cu.stream_callback(s, cu_copied, d, 0);
  if (r != CUDA_SUCCESS) { /* the copy is under way with nothing behind it to say so: wait here */
    CUresult w = cu.stream_sync(s);
    cu_leave();
    free(d);
    snprintf(why, cap, "cuStreamAddCallback on device %d: %s", device, cu_err(r));
    done(arg, w == CUDA_SUCCESS ? HIXL_SUCCESS : HIXL_FAILED, w == CUDA_SUCCESS ? "" : why);
    return HIXL_SUCCESS;
  }
  cu_leave();
  return HIXL_SUCCESS;
}

static const struct devmem_ops cuda_ops = {.name = "cuda",
                                           .query = cu_query,
                                           .to_host = cu_to_host,
                                           .to_device = cu_to_device,
                                           .host_pin = cu_host_pin,
                                           .host_unpin = cu_host_unpin,
                                           .ipc_export = cu_ipc_export,
                                           .ipc_open = cu_ipc_open,
                                           .ipc_close = cu_ipc_close,
                                           .d2d = cu_d2d,
                                           .dmabuf = cu_dmabuf,
                                           .peer_mem = cu_peer_mem,
                                           .stream_new = cu_stream_new,
                                           .stream_free = cu_stream_free,
                                           .copy_async = cu_copy_async,
                                           .copy_many = cu_copy_many};
#endif /* HIXL_HAVE_CUDA_H */

#ifdef HIXL_DEVMEM_TEST
/* host-test: any host range is "device 0" memory (or device HIXL_TEST_DEVMEM_DEVICE's, as
 * asked when it is registered); copies are memcpy. Only for tests: it lets every device
 * path (bounces, copies, the memory table's kind) run here. */
static HixlStatus ht_query(uint64_t addr, uint64_t len, int *device, char *why, size_t cap) {
  const char *d = getenv("HIXL_TEST_DEVMEM_DEVICE");
  (void)addr, (void)len, (void)why, (void)cap;
  *device = d ? atoi(d) : 0;
  return HIXL_SUCCESS;
}
static uint64_t ht_out, ht_in; /* bytes copied each way */

/* The gate copies to and from "device" memory wait at while a test holds it closed (a
 * device's DMA that takes its time), and how many wait there now. */
static pthread_mutex_t ht_gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ht_gate_cv = PTHREAD_COND_INITIALIZER;
static bool ht_gate_closed;
static uint32_t ht_gate_waiting;
static uint64_t ht_gate_lo, ht_gate_len; /* the copies it holds: those touching this range (len 0: all) */

static void ht_gate_pass(uint64_t dev, size_t n) {
  pthread_mutex_lock(&ht_gate_lock);
  if (ht_gate_closed && (ht_gate_len == 0 || (dev < ht_gate_lo + ht_gate_len && ht_gate_lo < dev + n))) {
    ht_gate_waiting++;
    pthread_cond_broadcast(&ht_gate_cv);
    while (ht_gate_closed) pthread_cond_wait(&ht_gate_cv, &ht_gate_lock);
    ht_gate_waiting--;
  }
  pthread_mutex_unlock(&ht_gate_lock);
}

void devmem_test_gate_range(uint64_t addr, uint64_t len) {
  pthread_mutex_lock(&ht_gate_lock);
  ht_gate_lo = addr;
  ht_gate_len = len;
  pthread_mutex_unlock(&ht_gate_lock);
}

void devmem_test_gate(bool closed) {
  pthread_mutex_lock(&ht_gate_lock);
  ht_gate_closed = closed;
  pthread_cond_broadcast(&ht_gate_cv);
  pthread_mutex_unlock(&ht_gate_lock);
}

bool devmem_test_gate_wait(uint32_t n, int ms) {
  struct timespec now; /* the condition variable's clock: CLOCK_REALTIME */
  clock_gettime(CLOCK_REALTIME, &now);
  uint64_t t = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec + (uint64_t)ms * 1000000u;
  struct timespec until = {.tv_sec = (time_t)(t / 1000000000u), .tv_nsec = (long)(t % 1000000000u)};
  pthread_mutex_lock(&ht_gate_lock);
  int rc = 0;
  while (ht_gate_waiting < n && rc == 0) rc = pthread_cond_timedwait(&ht_gate_cv, &ht_gate_lock, &until);
  bool ok = ht_gate_waiting >= n;
  pthread_mutex_unlock(&ht_gate_lock);
  return ok;
}

/* The copies the stand-in fails: those touching [lo, lo + len) of either side (len 0:
 * none), as a device fails a copy (an address fault). */
static uint64_t ht_fail_lo, ht_fail_len;
void devmem_test_fail_range(uint64_t addr, uint64_t len) {
  pthread_mutex_lock(&ht_gate_lock);
  ht_fail_lo = addr;
  ht_fail_len = len;
  pthread_mutex_unlock(&ht_gate_lock);
}
static bool ht_fails(uint64_t a, uint64_t b, size_t n, char *why, size_t cap) {
  pthread_mutex_lock(&ht_gate_lock);
  uint64_t lo = ht_fail_lo, len = ht_fail_len;
  pthread_mutex_unlock(&ht_gate_lock);
  bool hit = len && ((a < lo + len && lo < a + n) || (b < lo + len && lo < b + n));
  if (hit)
    snprintf(why, cap, "the stand-in fails copies touching [0x%llx, +%llu) (test)", (unsigned long long)lo,
             (unsigned long long)len);
  return hit;
}

static HixlStatus ht_to_host(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap) {
  (void)device;
  if (ht_fails((uintptr_t)dst, src, n, why, cap)) return HIXL_FAILED;
  ht_gate_pass(src, n);
  memcpy(dst, (const void *)(uintptr_t)src, n);
  __atomic_add_fetch(&ht_out, n, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}
static HixlStatus ht_to_device(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap) {
  (void)device;
  if (ht_fails(dst, (uintptr_t)src, n, why, cap)) return HIXL_FAILED;
  ht_gate_pass(dst, n);
  memcpy((void *)(uintptr_t)dst, src, n);
  __atomic_add_fetch(&ht_in, n, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}

static uint64_t ht_pinned; /* buffers pinned now */
static HixlStatus ht_host_pin(void *p, size_t n, int device, char *why, size_t cap) {
  (void)p, (void)n, (void)device, (void)why, (void)cap;
  __atomic_add_fetch(&ht_pinned, 1, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}
static void ht_host_unpin(void *p, size_t n, int device) {
  (void)p, (void)n, (void)device;
  __atomic_sub_fetch(&ht_pinned, 1, __ATOMIC_RELAXED);
}

void devmem_test_counts(uint64_t *to_host, uint64_t *to_device) {
  *to_host = __atomic_load_n(&ht_out, __ATOMIC_RELAXED);
  *to_device = __atomic_load_n(&ht_in, __ATOMIC_RELAXED);
}
/* The stand-in's IPC: "device" memory from devmem_test_alloc is a memfd mapped shared;
 * its handle names the owner's pid and descriptor, and a peer of the same host (and
 * user) maps /proc/<pid>/fd/<fd>. */
#define HT_ALLOCS 64
#define HT_MAGIC  "hixl-ht1"
static struct {
  uint8_t *base;
  size_t len;
  int fd;
} ht_alloc[HT_ALLOCS];
static pthread_mutex_t ht_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t ht_d2d_bytes, ht_maps;          /* bytes copied device to device; peer mappings open */
static int ht_open_dev = -1, ht_close_dev = -1; /* the device the last ipc_open, ipc_close was asked for */

void *devmem_test_alloc(size_t len) {
  void *p = MAP_FAILED;
  int fd = len ? memfd_create("hixl-test-dev", MFD_CLOEXEC | MFD_ALLOW_SEALING) : -1;
  if (fd < 0) goto err;
  /* Its size sealed, as the kernel's udmabuf asks of a memfd it exports (ht_dmabuf). */
  if (ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) goto close_fd;
  p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) goto close_fd;
  pthread_mutex_lock(&ht_lock);
  for (int i = 0; i < HT_ALLOCS; i++)
    if (!ht_alloc[i].base) {
      ht_alloc[i].base = p;
      ht_alloc[i].len = len;
      ht_alloc[i].fd = fd;
      pthread_mutex_unlock(&ht_lock);
      return p;
    }
  pthread_mutex_unlock(&ht_lock);
  munmap(p, len);
close_fd:
  close(fd);
err:
  return NULL;
}

void devmem_test_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&ht_lock);
  for (int i = 0; i < HT_ALLOCS; i++)
    if (ht_alloc[i].base == p) {
      munmap(p, ht_alloc[i].len);
      close(ht_alloc[i].fd);
      ht_alloc[i].base = NULL;
      break;
    }
  pthread_mutex_unlock(&ht_lock);
}

/* The devmem_test_alloc allocation holding addr: its start, length and memfd; false
 * when none does. */
static bool ht_find(uint64_t addr, uint64_t *base, uint64_t *len, int *fd) {
  bool found = false;
  pthread_mutex_lock(&ht_lock);
  for (int i = 0; i < HT_ALLOCS && !found; i++) {
    uint64_t b = (uint64_t)(uintptr_t)ht_alloc[i].base;
    if (!b || addr < b || addr - b >= ht_alloc[i].len) continue;
    *base = b;
    *len = ht_alloc[i].len;
    *fd = ht_alloc[i].fd;
    found = true;
  }
  pthread_mutex_unlock(&ht_lock);
  return found;
}

/* A shared mapping of a whole memfd holding addr, made by someone else in this process
 * (a host's "device" memory: hixl-mock-host --kv-memory device-sim, which links nothing
 * of hixl), as the CUDA driver exports memory any caller got from it: its start and
 * length from /proc/self/maps, and a descriptor of this process open on the same memfd
 * (its owner keeps one while the memory is registered). false when there is none. */
static bool ht_adopt(uint64_t addr, uint64_t *base, uint64_t *len, int *fd) {
  char line[512];
  unsigned long long start = 0, end = 0, off = 0, ino = 0;
  unsigned maj = 0, min = 0;
  bool found = false;
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return false;
  while (!found && fgets(line, sizeof(line), f)) {
    char perms[5];
    int path = 0;
    if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &min, &ino, &path) <
        7)
      continue;
    found = addr >= start && addr < end && perms[3] == 's' && off == 0 && path > 0 &&
            strncmp(line + path, "/memfd:", 7) == 0;
  }
  fclose(f);
  if (!found) return false;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return false;
  found = false;
  for (struct dirent *de; !found && (de = readdir(d));) {
    struct stat st;
    char *e;
    long n = strtol(de->d_name, &e, 10);
    if (*e || e == de->d_name || n < 0 || n > INT32_MAX || n == dirfd(d)) continue;
    found = fstat((int)n, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == (ino_t)ino &&
            st.st_dev == makedev(maj, min) && (uint64_t)st.st_size >= end - start;
    if (found) *fd = (int)n;
  }
  closedir(d);
  *base = start;
  *len = end - start;
  return found;
}

static void ht_handle(struct devmem_ipc *out, int fd, uint64_t alloc_len, uint64_t offset, uint64_t len) {
  memset(out, 0, sizeof(*out));
  memcpy(out->blob, HT_MAGIC, 8);
  be_put32(out->blob + 8, (uint32_t)getpid());
  be_put32(out->blob + 12, (uint32_t)fd);
  out->alloc_len = alloc_len;
  out->offset = offset;
  out->len = len;
}

static HixlStatus ht_ipc_export(uint64_t addr, uint64_t len, int device, struct devmem_ipc *out, char *why,
                                size_t cap) {
  uint64_t b = 0, blen = 0;
  int fd = -1;
  (void)device;
  if (len == 0 || !out) {
    snprintf(why, cap, "ipc_export: %s", len == 0 ? "an empty range" : "no handle to fill");
    return HIXL_PARAM_INVALID;
  }
  if (!ht_find(addr, &b, &blen, &fd) && !ht_adopt(addr, &b, &blen, &fd)) fd = -1;
  if (fd >= 0 && len <= blen - (addr - b)) {
    ht_handle(out, fd, blen, addr - b, len);
    return HIXL_SUCCESS;
  }
  snprintf(
      why, cap,
      "[0x%llx, +%llu) is not inside one IPC-able allocation (devmem_test_alloc, or a whole memfd mapped "
      "shared with a descriptor open)",
      (unsigned long long)addr, (unsigned long long)len);
  return HIXL_UNSUPPORTED;
}

static HixlStatus ht_ipc_open(const struct devmem_ipc *h, int device, uint64_t *base, char *why, size_t cap) {
  char path[64];
  struct stat st;
  __atomic_store_n(&ht_open_dev, device, __ATOMIC_RELAXED);
  HixlStatus s = devmem_ipc_valid(h, why, cap);
  if (s != HIXL_SUCCESS) return s;
  if (!base) {
    snprintf(why, cap, "ipc_open: nowhere to put the base");
    return HIXL_PARAM_INVALID;
  }
  uint32_t pid = be_get32(h->blob + 8), fdn = be_get32(h->blob + 12);
  if (memcmp(h->blob, HT_MAGIC, 8) != 0 || pid == 0 || fdn > INT32_MAX || h->alloc_len > SIZE_MAX) {
    snprintf(why, cap, "IPC handle: not the host stand-in's (pid %u, fd %u)", pid, fdn);
    return HIXL_PARAM_INVALID;
  }
  snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fdn);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, cap, "IPC handle: cannot open %s: %s", path, strerror(errno));
    return HIXL_FAILED;
  }
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < h->alloc_len) {
    close(fd);
    snprintf(why, cap, "IPC handle: %s is not a memfd of %llu bytes", path, (unsigned long long)h->alloc_len);
    return HIXL_PARAM_INVALID;
  }
  void *p = mmap(NULL, (size_t)h->alloc_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(why, cap, "IPC handle: cannot map %s: %s", path, strerror(errno));
    return HIXL_FAILED;
  }
  __atomic_add_fetch(&ht_maps, 1, __ATOMIC_RELAXED);
  *base = (uint64_t)(uintptr_t)p;
  return HIXL_SUCCESS;
}

static void ht_ipc_close(uint64_t base, uint64_t alloc_len, int device) {
  __atomic_store_n(&ht_close_dev, device, __ATOMIC_RELAXED);
  if (munmap((void *)(uintptr_t)base, (size_t)alloc_len) == 0)
    __atomic_sub_fetch(&ht_maps, 1, __ATOMIC_RELAXED);
}

static HixlStatus ht_d2d(uint64_t dst, int ddev, uint64_t src, int sdev, size_t n, char *why, size_t cap) {
  (void)ddev, (void)sdev;
  if (ht_fails(dst, src, n, why, cap)) return HIXL_FAILED;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  __atomic_add_fetch(&ht_d2d_bytes, n, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}

void devmem_test_d2d(uint64_t *bytes, uint64_t *open_maps) {
  *bytes = __atomic_load_n(&ht_d2d_bytes, __ATOMIC_RELAXED);
  *open_maps = __atomic_load_n(&ht_maps, __ATOMIC_RELAXED);
}

/* A dma-buf of the stand-in's memfd, made by the kernel's udmabuf (/dev/udmabuf, root or
 * the group that owns it): what an RDMA device registers as it would a GPU's. */
static uint64_t ht_dmabufs;
static HixlStatus ht_dmabuf(uint64_t addr, uint64_t len, int device, int *fd, uint64_t *offset, char *why,
                            size_t cap) {
  uint64_t b = 0, blen = 0, lo = 0, hi = 0;
  int mfd = -1;
  (void)device;
  if (!ht_find(addr, &b, &blen, &mfd) || len == 0 || len > blen - (addr - b) ||
      !page_span(addr - b, len, 0, blen, &lo, &hi)) {
    snprintf(why, cap, "[0x%llx, +%llu) is not whole host pages of one devmem_test_alloc allocation",
             (unsigned long long)addr, (unsigned long long)len);
    return HIXL_UNSUPPORTED;
  }
  int u = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (u < 0) {
    snprintf(why, cap, "the host stand-in makes dma-bufs with the kernel's udmabuf: /dev/udmabuf: %s",
             strerror(errno));
    return HIXL_UNSUPPORTED;
  }
  struct udmabuf_create c = {
      .memfd = (uint32_t)mfd, .flags = UDMABUF_FLAGS_CLOEXEC, .offset = lo, .size = hi - lo};
  int d = ioctl(u, UDMABUF_CREATE, &c);
  int e = errno;
  close(u);
  if (d < 0) {
    snprintf(why, cap, "UDMABUF_CREATE of %llu bytes: %s", (unsigned long long)(hi - lo), strerror(e));
    return HIXL_UNSUPPORTED;
  }
  __atomic_add_fetch(&ht_dmabufs, 1, __ATOMIC_RELAXED);
  *fd = d;
  *offset = addr - b - lo;
  return HIXL_SUCCESS;
}

uint64_t devmem_test_dmabufs(void) { return __atomic_load_n(&ht_dmabufs, __ATOMIC_RELAXED); }

void devmem_test_ipc_devices(int *opened, int *closed) {
  *opened = __atomic_load_n(&ht_open_dev, __ATOMIC_RELAXED);
  *closed = __atomic_load_n(&ht_close_dev, __ATOMIC_RELAXED);
}

/* The stand-in's streams: a thread each, running the copies started on it in order
 * (through the gate, as the synchronous ones), then their done. */
struct ht_copy {
  struct ht_copy *next;
  bool to_dev;
  uint64_t dev;
  void *host;
  size_t n;
  int device;
  devmem_done_fn done;
  void *arg;
};
struct ht_stream {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  struct ht_copy *head, *tail;
  bool stop;
};
static uint64_t ht_streams_made, ht_streams_live, ht_async;

static void *ht_stream_main(void *arg) {
  struct ht_stream *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->lock);
    struct ht_copy *c = s->head;
    if (!c) break; /* stopped with nothing left */
    s->head = c->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->lock);
    char why[128] = "";
    HixlStatus st = c->to_dev ? ht_to_device(c->dev, c->host, c->n, c->device, why, sizeof(why))
                              : ht_to_host(c->host, c->dev, c->n, c->device, why, sizeof(why));
    c->done(c->arg, st, why);
    free(c);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static HixlStatus ht_stream_new(int device, void **stream, char *why, size_t cap) {
  struct ht_stream *s = calloc(1, sizeof(*s));
  (void)device;
  if (!s) {
    snprintf(why, cap, "out of memory for a stream");
    return HIXL_RESOURCE_EXHAUSTED;
  }
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cv, NULL);
  int rc = pthread_create(&s->thread, NULL, ht_stream_main, s);
  if (rc != 0) {
    snprintf(why, cap, "no thread for a stream: %s", strerror(rc));
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return HIXL_RESOURCE_EXHAUSTED;
  }
  __atomic_add_fetch(&ht_streams_made, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&ht_streams_live, 1, __ATOMIC_RELAXED);
  *stream = s;
  return HIXL_SUCCESS;
}

static void ht_stream_free(void *stream, int device) {
  struct ht_stream *s = stream;
  (void)device;
  pthread_mutex_lock(&s->lock);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->lock);
  free(s);
  __atomic_sub_fetch(&ht_streams_live, 1, __ATOMIC_RELAXED);
}

static HixlStatus ht_copy_async(void *stream, int device, bool to_dev, uint64_t dev, void *host, size_t n,
                                devmem_done_fn done, void *arg, char *why, size_t cap) {
  struct ht_stream *s = stream;
  struct ht_copy *c = malloc(sizeof(*c));
  if (!c) {
    snprintf(why, cap, "out of memory for a device copy");
    return HIXL_RESOURCE_EXHAUSTED;
  }
  *c = (struct ht_copy){
      .to_dev = to_dev, .dev = dev, .host = host, .n = n, .device = device, .done = done, .arg = arg};
  pthread_mutex_lock(&s->lock);
  if (s->tail)
    s->tail->next = c;
  else
    s->head = c;
  s->tail = c;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->lock);
  __atomic_add_fetch(&ht_async, 1, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}

void devmem_test_streams(uint64_t *made, uint64_t *live, uint64_t *copies) {
  *made = __atomic_load_n(&ht_streams_made, __ATOMIC_RELAXED);
  *live = __atomic_load_n(&ht_streams_live, __ATOMIC_RELAXED);
  *copies = __atomic_load_n(&ht_async, __ATOMIC_RELAXED);
}

/* peer_mem: the stand-in's "device" memory is host memory, which ibv_reg_mr takes;
 * HIXL_TEST_DEVMEM_PEERMEM=1 says so, as a host with a peer-memory client would. */
static bool ht_peer_mem(char *why, size_t cap) {
  const char *t = getenv("HIXL_TEST_DEVMEM_PEERMEM");
  if (t && strcmp(t, "1") == 0) return true;
  snprintf(why, cap, "the host stand-in has no peer-memory client (HIXL_TEST_DEVMEM_PEERMEM=1 pretends one)");
  return false;
}

/* copy_many: the copies made in turn as d2d, to_host and to_device make them, counted
 * as one wait (a batch, for the tests to tell from copies made one at a time). */
static const struct devmem_ops host_test_ops;
static uint64_t ht_batches;
static HixlStatus ht_copy_many(const struct devmem_copy *v, size_t n, size_t *bad, struct devmem_many *ms,
                               char *why, size_t cap) {
  HixlStatus st = copy_each(&host_test_ops, v, n, bad, ms, why, cap);
  ms->waits = n ? 1 : 0;
  __atomic_add_fetch(&ht_batches, ms->waits, __ATOMIC_RELAXED);
  return st;
}

uint64_t devmem_test_batches(void) { return __atomic_load_n(&ht_batches, __ATOMIC_RELAXED); }

#define HT_OPS                                                                                               \
  .query = ht_query, .to_host = ht_to_host, .to_device = ht_to_device, .host_pin = ht_host_pin,              \
  .host_unpin = ht_host_unpin, .ipc_export = ht_ipc_export, .ipc_open = ht_ipc_open,                         \
  .ipc_close = ht_ipc_close, .d2d = ht_d2d, .dmabuf = ht_dmabuf, .peer_mem = ht_peer_mem
static const struct devmem_ops host_test_ops = {.name = "host-test",
                                                HT_OPS,
                                                .stream_new = ht_stream_new,
                                                .stream_free = ht_stream_free,
                                                .copy_async = ht_copy_async,
                                                .copy_many = ht_copy_many};
/* HIXL_TEST_DEVMEM_ASYNC=0: without streams or copy_many, as a provider that has
 * neither. */
static const struct devmem_ops host_test_sync_ops = {.name = "host-test", HT_OPS};
#endif

/* ---- the pool of pinned host buffers ---- */

struct devmem_pool {
  const struct devmem_ops *dm;
  int device; /* the context the buffers were pinned in (portable: every device copies with them) */
  size_t size;
  uint32_t max, made; /* made: buffers allocated and pinned so far, at most max */
  uint32_t nfree;
  void **free; /* made - (handed out) of them, a stack */
  void **all;  /* every buffer made, to unpin and free them at the end */
};

static uint64_t pool_out, pool_waits, pool_spills; /* every pool of the process: handed out now; gets that
                                                      found none; buffers made beyond a pool */

struct devmem_pool *devmem_pool_new(const struct devmem_ops *dm, int device, size_t size, uint32_t max) {
  struct devmem_pool *p = calloc(1, sizeof(*p));
  if (!p) goto err;
  p->free = calloc(max, sizeof(*p->free));
  if (!p->free) goto free_pool;
  p->all = calloc(max, sizeof(*p->all));
  if (!p->all) goto free_stack;
  p->dm = dm;
  p->device = device;
  p->size = size;
  p->max = max;
  return p;
free_stack:
  free(p->free);
free_pool:
  free(p);
err:
  return NULL;
}

void *devmem_pool_get(struct devmem_pool *p, char *why, size_t cap) {
  void *b = NULL;
  if (p->nfree > 0) {
    b = p->free[--p->nfree];
  } else if (p->made < p->max) {
    b = aligned_alloc(4096, p->size);
    if (!b) {
      snprintf(why, cap, "out of memory for a %zu-byte host buffer", p->size);
      return NULL;
    }
    if (p->dm->host_pin(b, p->size, p->device, why, cap) != HIXL_SUCCESS) {
      free(b);
      return NULL;
    }
    p->all[p->made++] = b;
  } else {
    snprintf(why, cap, "all %u host buffers of %zu bytes are in use", p->max, p->size);
    __atomic_add_fetch(&pool_waits, 1, __ATOMIC_RELAXED);
    return NULL;
  }
  __atomic_add_fetch(&pool_out, 1, __ATOMIC_RELAXED);
  return b;
}

void *devmem_pool_extra(struct devmem_pool *p, char *why, size_t cap) {
  if (!p) {
    snprintf(why, cap, "no pool to spill beyond");
    return NULL;
  }
  void *b = aligned_alloc(4096, p->size);
  if (!b) {
    snprintf(why, cap, "out of memory for a %zu-byte host buffer beyond the pool's %u", p->size, p->max);
    return NULL;
  }
  __atomic_add_fetch(&pool_spills, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&pool_out, 1, __ATOMIC_RELAXED);
  return b;
}

void *devmem_pool_spill(struct devmem_pool *p, char *why, size_t cap) {
  if (!devmem_pool_empty(p)) return devmem_pool_get(p, why, cap);
  return devmem_pool_extra(p, why, cap);
}

bool devmem_pool_owns(const struct devmem_pool *p, const void *buf) {
  if (!p || !buf) return false;
  for (uint32_t i = 0; i < p->made; i++)
    if (p->all[i] == buf) return true;
  return false;
}

void devmem_pool_waited(struct devmem_pool *p) {
  (void)p;
  __atomic_add_fetch(&pool_waits, 1, __ATOMIC_RELAXED);
}

void devmem_pool_put(struct devmem_pool *p, void *buf) {
  if (!buf) return;
  __atomic_sub_fetch(&pool_out, 1, __ATOMIC_RELAXED);
  for (uint32_t i = 0; i < p->made; i++)
    if (p->all[i] == buf) {
      p->free[p->nfree++] = buf;
      return;
    }
  free(buf); /* spilled: not the pool's */
}

bool devmem_pool_empty(const struct devmem_pool *p) { return p->nfree == 0 && p->made == p->max; }

void devmem_pool_free(struct devmem_pool *p) {
  if (!p) return;
  for (uint32_t i = 0; i < p->made; i++) {
    p->dm->host_unpin(p->all[i], p->size, p->device);
    free(p->all[i]);
  }
  free(p->all);
  free(p->free);
  free(p);
}

#ifdef HIXL_DEVMEM_TEST
uint64_t devmem_test_spills(void) { return __atomic_load_n(&pool_spills, __ATOMIC_RELAXED); }

void devmem_test_pool(uint64_t *out, uint64_t *pinned, uint64_t *waits) {
  *out = __atomic_load_n(&pool_out, __ATOMIC_RELAXED);
  *pinned = __atomic_load_n(&ht_pinned, __ATOMIC_RELAXED);
  *waits = __atomic_load_n(&pool_waits, __ATOMIC_RELAXED);
}
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct devmem_ops *provider;
static char provider_why[256];

static void devmem_find(void) {
#ifdef HIXL_DEVMEM_TEST
  const char *t = getenv("HIXL_TEST_DEVMEM");
  if (t && strcmp(t, "host") == 0) {
    const char *a = getenv("HIXL_TEST_DEVMEM_ASYNC");
    provider = a && strcmp(a, "0") == 0 ? &host_test_sync_ops : &host_test_ops;
    return;
  }
#endif
#ifdef HIXL_HAVE_CUDA_H
  if (cu_load(provider_why, sizeof(provider_why))) provider = &cuda_ops;
#else
  snprintf(provider_why, sizeof(provider_why),
           "this build of hixl has no accelerator backend (CUDA's cuda.h was not found when it was built)");
#endif
}

const struct devmem_ops *devmem_get(char *why, size_t cap) {
  pthread_once(&once, devmem_find);
  if (!provider && why) snprintf(why, cap, "%s", provider_why);
  return provider;
}

#ifdef HIXL_HAVE_CUDA_H
/* A walk of the loaded objects for libcuda: the first object's count of loads since the
 * process began (dlpi_adds) tells whether anything was loaded since the last walk that
 * found none, so a process without CUDA pays one callback a check. */
struct cu_walk {
  bool first, found, counted;
  unsigned long long adds;
};
static unsigned long long cu_walked_adds; /* atomic: dlpi_adds at the last walk that found none */

static int cu_lib_seen(struct dl_phdr_info *info, size_t size, void *arg) {
  struct cu_walk *w = arg;
  if (w->first) {
    w->first = false;
    w->counted = size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds);
    w->adds = w->counted ? info->dlpi_adds : 0;
    if (w->counted && w->adds == __atomic_load_n(&cu_walked_adds, __ATOMIC_RELAXED))
      return 1; /* nothing new */
  }
  const char *n = info->dlpi_name, *b = n ? strrchr(n, '/') : NULL;
  b = b ? b + 1 : n;
  return (w->found = b && strncmp(b, "libcuda.so", 10) == 0);
}

/* Whether this process has loaded the CUDA driver (itself, or a runtime for it): only
 * then can it hold CUDA device memory. A walk of the loaded objects, not a dlopen with
 * RTLD_NOLOAD (which searches the library path: 20 us); once seen, for good. */
static bool cu_in_process(void) {
  static bool seen; /* atomic */
  struct cu_walk w = {.first = true};
  if (__atomic_load_n(&seen, __ATOMIC_RELAXED)) return true;
  dl_iterate_phdr(cu_lib_seen, &w);
  if (w.found)
    __atomic_store_n(&seen, true, __ATOMIC_RELAXED);
  else if (w.counted)
    __atomic_store_n(&cu_walked_adds, w.adds, __ATOMIC_RELAXED);
  return w.found;
}
#endif

HixlStatus devmem_host_check(uint64_t addr, uint64_t len, char *why, size_t cap) {
#ifdef HIXL_HAVE_CUDA_H
  /* Never load the driver here: cuInit in a process that does not use CUDA costs, and
   * its children forked after could not use CUDA. */
  if (!cu_in_process()) return HIXL_SUCCESS;
  if (devmem_get(NULL, 0) != &cuda_ops)
    return HIXL_SUCCESS; /* the stand-in's "device" memory is host memory */
  const uint64_t at[2] = {addr, addr + (len ? len - 1 : 0)};
  for (int i = 0; i < 2; i++) {
    unsigned int type = 0;
    int ord = -1, managed = 0; /* managed memory may say DEVICE wherever it lies: the CPU reaches it */
    if (cu.pointer_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)at[i]) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE ||
        (cu.pointer_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)at[i]) == CUDA_SUCCESS &&
         managed))
      continue;
    (void)cu.pointer_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)at[i]);
    snprintf(why, cap,
             "0x%llx is CUDA device memory (device %d), which this CPU cannot touch: register it as "
             "HIXL_MEM_DEVICE",
             (unsigned long long)at[i], ord);
    return HIXL_PARAM_INVALID;
  }
#else
  (void)addr, (void)len, (void)why, (void)cap;
#endif
  return HIXL_SUCCESS;
}

HixlStatus devmem_copy_many(const struct devmem_ops *dm, const struct devmem_copy *v, size_t n, size_t *bad,
                            struct devmem_many *ms, char *why, size_t cap) {
  if (dm->copy_many) return dm->copy_many(v, n, bad, ms, why, cap);
  return copy_each(dm, v, n, bad, ms, why, cap);
}
