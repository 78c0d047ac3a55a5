/* mh_devmem: the KV caches in device memory (--kv-memory cuda | device-sim), as a GPU
 * runtime keeps them. The plugin gets device pointers (kv_memory device); the host's
 * forward pass and its checks work on a copy in host memory (the "shadow"), moved to
 * the device after computing a layer and back before checking one: the same bytes a
 * GPU runtime's kernels would write and read there.
 *
 * cuda: the CUDA driver API, loaded at run time (dlopen("libcuda.so.1")), its own few
 * declarations here so the mock host builds without the toolkit; each rank process
 * initializes it (CUDA does not survive fork). device-sim: a second host buffer
 * standing for the device (a memfd mapped shared, so that the host stand-in can hand
 * it to a same-host peer by IPC handle, as CUDA does cuMemAlloc'd memory), copied with
 * memcpy, registered as device memory through the test builds' host stand-in
 * (HIXL_TEST_DEVMEM=host): every path the cuda kind takes, run where there is no GPU. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mh.h"

typedef int cu_result; /* CUresult: 0 is CUDA_SUCCESS */
typedef int cu_device;
typedef void *cu_context;
typedef unsigned long long cu_ptr; /* CUdeviceptr */

static struct {
  void *so;
  cu_context ctx;
  cu_result (*init)(unsigned);
  cu_result (*device_get)(cu_device *, int);
  cu_result (*ctx_retain)(cu_context *, cu_device);
  cu_result (*ctx_set)(cu_context);
  cu_result (*alloc)(cu_ptr *, size_t);
  cu_result (*free)(cu_ptr);
  cu_result (*htod)(cu_ptr, const void *, size_t);
  cu_result (*dtoh)(void *, cu_ptr, size_t);
  cu_result (*sync)(void);
  cu_result (*err_string)(cu_result, const char **);
} cu;

static const char *cu_err(cu_result r) {
  const char *s = NULL;
  if (cu.err_string) cu.err_string(r, &s);
  return s ? s : "unknown CUDA error";
}

/* The driver, a device and its primary context, in this process; -1 with why. */
static int cu_open(int ordinal, char *err, size_t cap) {
  if (cu.ctx) return 0;
  if (!cu.so && !(cu.so = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) {
    snprintf(err, cap, "no CUDA driver on this host (dlopen libcuda.so.1: %s)", dlerror());
    return -1;
  }
  struct {
    void **fn;
    const char *name;
  } need[] = {{(void **)&cu.init, "cuInit"},
              {(void **)&cu.device_get, "cuDeviceGet"},
              {(void **)&cu.ctx_retain, "cuDevicePrimaryCtxRetain"},
              {(void **)&cu.ctx_set, "cuCtxSetCurrent"},
              {(void **)&cu.alloc, "cuMemAlloc_v2"},
              {(void **)&cu.free, "cuMemFree_v2"},
              {(void **)&cu.htod, "cuMemcpyHtoD_v2"},
              {(void **)&cu.dtoh, "cuMemcpyDtoH_v2"},
              {(void **)&cu.sync, "cuCtxSynchronize"},
              {(void **)&cu.err_string, "cuGetErrorString"}};
  for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
    if (!(*need[i].fn = dlsym(cu.so, need[i].name))) {
      snprintf(err, cap, "libcuda.so.1 has no %s: a driver too old", need[i].name);
      return -1;
    }
  cu_device d;
  cu_result r;
  if ((r = cu.init(0)) != 0 || (r = cu.device_get(&d, ordinal)) != 0 ||
      (r = cu.ctx_retain(&cu.ctx, d)) != 0) {
    snprintf(err, cap, "no usable CUDA device %d: %s", ordinal, cu_err(r));
    cu.ctx = NULL;
    return -1;
  }
  return 0;
}

int mh_dev_probe(enum mh_dev kind, char *err, size_t cap) {
  if (kind != MH_DEV_CUDA) return 0;
  /* In a child: the router must not initialize CUDA before it forks the instances. */
  int p[2];
  if (pipe(p) != 0) {
    snprintf(err, cap, "pipe: out of descriptors");
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    char why[256] = "";
    close(p[0]);
    int rc = cu_open(0, why, sizeof(why));
    if (rc < 0 && write(p[1], why, strlen(why)) < 0) _exit(2);
    _exit(rc < 0 ? 1 : 0);
  }
  close(p[1]);
  ssize_t n = pid > 0 ? read(p[0], err, cap - 1) : -1;
  err[n > 0 ? n : 0] = '\0';
  close(p[0]);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    if (!err[0]) snprintf(err, cap, "the CUDA probe failed");
    return -1;
  }
  return 0;
}

/* device-sim's allocations: a memfd mapped shared, its descriptor kept open while it
 * lives, which the host stand-in exports by IPC handle (a same-host peer maps it), as
 * CUDA exports what cuMemAlloc gave. */
#define SIM_ALLOCS 16
static struct {
  void *p;
  size_t len;
  int fd;
} sim[SIM_ALLOCS];

static uintptr_t sim_alloc(size_t len, char *err, size_t cap) {
  int i = 0;
  while (i < SIM_ALLOCS && sim[i].p) i++;
  if (i == SIM_ALLOCS) {
    snprintf(err, cap, "more than %d allocations standing for device memory", SIM_ALLOCS);
    return 0;
  }
  int fd = memfd_create("mh-device-sim", MFD_CLOEXEC);
  void *p = MAP_FAILED;
  if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
      (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    snprintf(err, cap, "cannot make %zu bytes standing for device memory (a memfd mapped shared): %s", len,
             strerror(errno));
    if (fd >= 0) close(fd);
    return 0;
  }
  sim[i].p = p;
  sim[i].len = len;
  sim[i].fd = fd;
  return (uintptr_t)p;
}

static void sim_free(uintptr_t p) {
  for (int i = 0; i < SIM_ALLOCS; i++)
    if (sim[i].p && (uintptr_t)sim[i].p == p) {
      munmap(sim[i].p, sim[i].len);
      close(sim[i].fd);
      sim[i].p = NULL;
      return;
    }
}

uintptr_t mh_dev_alloc(enum mh_dev kind, size_t len, char *err, size_t cap) {
  if (kind == MH_DEV_SIM) return sim_alloc(len, err, cap);
  cu_ptr d = 0;
  cu_result r;
  if (cu_open(0, err, cap) < 0) return 0;
  if ((r = cu.ctx_set(cu.ctx)) != 0 || (r = cu.alloc(&d, len)) != 0) {
    snprintf(err, cap, "cuMemAlloc(%zu bytes): %s", len, cu_err(r));
    return 0;
  }
  return (uintptr_t)d;
}

void mh_dev_free(enum mh_dev kind, uintptr_t p) {
  if (kind == MH_DEV_SIM)
    sim_free(p);
  else if (p && cu.ctx && cu.ctx_set(cu.ctx) == 0)
    cu.free((cu_ptr)p);
}

int mh_dev_copy(enum mh_dev kind, uintptr_t dev, void *host, size_t n, bool to_device, char *err,
                size_t cap) {
  if (kind == MH_DEV_SIM) {
    if (to_device)
      memcpy((void *)dev, host, n);
    else
      memcpy(host, (const void *)dev, n);
    return 0;
  }
  cu_result r = cu.ctx_set(cu.ctx);
  if (r == 0) r = to_device ? cu.htod((cu_ptr)dev, host, n) : cu.dtoh(host, (cu_ptr)dev, n);
  /* From pageable memory cuMemcpyHtoD may return before its DMA ends: the layer is
   * there only once the context is idle, as a runtime waits for its stream before it
   * says a layer is saved. */
  if (r == 0 && to_device) r = cu.sync();
  if (r != 0) {
    snprintf(err, cap, "%s of %zu bytes at 0x%" PRIxPTR ": %s", to_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH",
             n, dev, cu_err(r));
    return -1;
  }
  return 0;
}
