/* devmem: the provider of this process (devmem.h): the CUDA driver API loaded at run
 * time, or in test builds the host-memory stand-in. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem/devmem.h"

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
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*htod)(CUdeviceptr, const void *, size_t);
  CUresult (*host_register)(void *, size_t, unsigned int);
  CUresult (*host_unregister)(void *);
  CUresult (*err_string)(CUresult, const char **);
} cu;

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
              {(void **)&cu.dtoh, "cuMemcpyDtoH_v2"},
              {(void **)&cu.htod, "cuMemcpyHtoD_v2"},
              {(void **)&cu.host_register, "cuMemHostRegister_v2"},
              {(void **)&cu.host_unregister, "cuMemHostUnregister"},
              {(void **)&cu.err_string, "cuGetErrorString"}};
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
    if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
      snprintf(why, cap, "libcuda.so.1 lacks %s: a driver older than this build's CUDA", syms[i].name);
      return false;
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

static HixlStatus cu_to_host(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap) {
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.dtoh(dst, (CUdeviceptr)src, n);
  cu_leave();
  if (r != CUDA_SUCCESS)
    snprintf(why, cap, "cuMemcpyDtoH of %zu bytes on device %d: %s", n, device, cu_err(r));
  return r == CUDA_SUCCESS ? HIXL_SUCCESS : HIXL_FAILED;
}

static HixlStatus cu_to_device(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap) {
  if (!cu_enter(device, why, cap)) return HIXL_FAILED;
  CUresult r = cu.htod((CUdeviceptr)dst, src, n);
  cu_leave();
  if (r != CUDA_SUCCESS)
    snprintf(why, cap, "cuMemcpyHtoD of %zu bytes on device %d: %s", n, device, cu_err(r));
  return r == CUDA_SUCCESS ? HIXL_SUCCESS : HIXL_FAILED;
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

static const struct devmem_ops cuda_ops = {.name = "cuda",
                                           .query = cu_query,
                                           .to_host = cu_to_host,
                                           .to_device = cu_to_device,
                                           .host_pin = cu_host_pin,
                                           .host_unpin = cu_host_unpin};
#endif /* HIXL_HAVE_CUDA_H */

#ifdef HIXL_DEVMEM_TEST
/* host-test: any host range is "device 0" memory; copies are memcpy. Only for tests:
 * it lets every device path (bounces, copies, the memory table's kind) run here. */
static HixlStatus ht_query(uint64_t addr, uint64_t len, int *device, char *why, size_t cap) {
  (void)addr, (void)len, (void)why, (void)cap;
  *device = 0;
  return HIXL_SUCCESS;
}
static uint64_t ht_out, ht_in; /* bytes copied each way */
static HixlStatus ht_to_host(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap) {
  (void)device, (void)why, (void)cap;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  __atomic_add_fetch(&ht_out, n, __ATOMIC_RELAXED);
  return HIXL_SUCCESS;
}
static HixlStatus ht_to_device(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap) {
  (void)device, (void)why, (void)cap;
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
static const struct devmem_ops host_test_ops = {.name = "host-test",
                                                .query = ht_query,
                                                .to_host = ht_to_host,
                                                .to_device = ht_to_device,
                                                .host_pin = ht_host_pin,
                                                .host_unpin = ht_host_unpin};
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
    provider = &host_test_ops;
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
