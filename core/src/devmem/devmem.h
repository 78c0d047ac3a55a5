/* devmem: device (accelerator) memory behind one small interface, so the engine moves
 * KV cache that lives in GPU memory (docs/device-memory.md). A provider says whether a
 * range is device memory and which device, and copies between it and host memory.
 *
 * Providers: "cuda", the CUDA driver API loaded at run time (dlopen("libcuda.so.1"),
 * as UCX and NIXL do: no link-time dependency; built only where the toolkit's cuda.h
 * was found); and, in test builds only, "host-test", which treats host memory as if it
 * were a device's so every device path runs where there is no GPU (HIXL_TEST_DEVMEM=host).
 * Thread-safe: providers keep no per-call state. */
#ifndef HIXL_DEVMEM_H
#define HIXL_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_status.h"

/* Same host: a peer process's device allocation, named so that another process can map
 * it (cuda: a CUipcMemHandle; host-test: the owner's pid and memfd), and the range of
 * it exported. Travels between processes as opaque bytes; every field is checked by
 * the opening side (devmem_ipc_valid, then the provider against what it maps). */
#define DEVMEM_IPC_BLOB 64 /* CU_IPC_HANDLE_SIZE */
struct devmem_ipc {
  uint8_t blob[DEVMEM_IPC_BLOB]; /* the provider's handle of the whole allocation */
  uint64_t alloc_len;            /* the allocation's bytes */
  uint64_t offset;               /* the exported range: its start within the allocation ... */
  uint64_t len;                  /* ... and its bytes */
};

/* One copy of copy_many: n bytes from src to dst, each on device sdev / ddev (device
 * memory) or -1 (host memory, pageable or pinned); one side at least is a device's. */
struct devmem_copy {
  uint64_t dst, src;
  size_t n;
  int ddev, sdev;
};

/* What a copy_many did: the waits for a device it made, and how many of its copies it
 * started by one call of the driver for many (cuda: cuMemcpyBatchAsync) or by one
 * launch of a copy kernel for many (cuda: gather.cu) rather than a call each. */
struct devmem_many {
  uint32_t waits;
  uint32_t batched;
  uint32_t gathered;
};

/* The end of an asynchronous copy (copy_async): st, and why it failed when it did.
 * Called once, on a thread of the provider's, which it holds back meanwhile (the
 * stream's next copy waits): it must be short and must not call the provider. */
typedef void (*devmem_done_fn)(void *arg, HixlStatus st, const char *why);

struct devmem_ops {
  const char *name;
  /* Whether [addr, addr + len) lies in one allocation of device memory; its device
   * ordinal into *device. Not: PARAM_INVALID (why says what it is instead). */
  HixlStatus (*query)(uint64_t addr, uint64_t len, int *device, char *why, size_t cap);
  /* Copies between device memory (on device) and host memory; done when they return. */
  HixlStatus (*to_host)(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap);
  HixlStatus (*to_device)(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap);
  /* Page-lock n bytes of host memory at p for device's copies (cuda: cuMemHostRegister,
   * portable; host-test: counted), and undo it. */
  HixlStatus (*host_pin)(void *p, size_t n, int device, char *why, size_t cap);
  void (*host_unpin)(void *p, size_t n, int device);
  /* A handle another process of this host can open for [addr, addr + len) of device
   * memory on device. UNSUPPORTED (why says so) where it cannot be shared: a provider
   * without IPC, memory not from an IPC-able allocation. */
  HixlStatus (*ipc_export)(uint64_t addr, uint64_t len, int device, struct devmem_ipc *out, char *why,
                           size_t cap);
  /* Map the allocation h names into this process, for copies on device; *base: its
   * start here (the range is at *base + h->offset). PARAM_INVALID: h is malformed or
   * names less memory than it says; FAILED: it cannot be opened (the owner is gone).
   * Each open is undone by one ipc_close(*base, h->alloc_len, device). */
  HixlStatus (*ipc_open)(const struct devmem_ipc *h, int device, uint64_t *base, char *why, size_t cap);
  void (*ipc_close)(uint64_t base, uint64_t alloc_len, int device);
  /* n bytes from device memory src (on sdev) to device memory dst (on ddev), done when
   * it returns (cuda: cuMemcpyDtoD, cuMemcpyPeer across devices). */
  HixlStatus (*d2d)(uint64_t dst, int ddev, uint64_t src, int sdev, size_t n, char *why, size_t cap);
  /* A dma-buf of the device memory holding [addr, addr + len) on device, for an RDMA
   * device to register (ibv_reg_dmabuf_mr: GPUDirect). *fd (the caller closes it) spans
   * the whole host pages around the range; *offset: addr's byte in it. UNSUPPORTED (why
   * says so) where the provider, the device or the allocation cannot export one (cuda:
   * cuMemGetHandleForAddressRange; host-test: the kernel's udmabuf over its memfd). */
  HixlStatus (*dmabuf)(uint64_t addr, uint64_t len, int device, int *fd, uint64_t *offset, char *why,
                       size_t cap);
  /* Whether this host's RDMA drivers register the provider's device memory by its
   * address (plain ibv_reg_mr): a peer-memory client is loaded (cuda: nvidia-peermem,
   * or the older nv_peer_mem: GPUDirect without dma-buf). false with why. Optional:
   * NULL, never. */
  bool (*peer_mem)(char *why, size_t cap);
  /* Asynchronous copies, in order on a stream of device's (cuda: a CUstream made
   * non-blocking; host-test: a thread of its own). A provider without them leaves the
   * three NULL and the engine copies with to_host / to_device. stream_free: after every
   * copy on it has ended (its done called); cuda's returns at once. */
  HixlStatus (*stream_new)(int device, void **stream, char *why, size_t cap);
  void (*stream_free)(void *stream, int device);
  /* Start a copy of n bytes on stream, behind those started on it before: to_dev, host
   * memory at host into device memory at dev; else device memory at dev to host. done
   * (arg, ...) is called once when it has ended, possibly before this returns; host
   * memory a device copies from asynchronously is pinned (host_pin), or the copy may
   * hold the caller until it ended (cuda). Not SUCCESS: nothing started, done is never
   * called. */
  HixlStatus (*copy_async)(void *stream, int device, bool to_dev, uint64_t dev, void *host, size_t n,
                           devmem_done_fn done, void *arg, char *why, size_t cap);
  /* v[0..n) (independent ranges) copied, done when it returns: all started, then waited
   * for once per device they ran on (cuda: each on a spare non-blocking stream of the
   * device d2d, to_host or to_device would run it on, then cuStreamSynchronize), not
   * once each; copies inside one device's memory next to each other in v started many
   * at a time (cuda: a launch of its copy kernel, else a batch call) where it can.
   * *bad: the first that failed, n when none did; those from it on may not have run,
   * those before it all ran (a copy that fails only when waited for fails them all:
   * *bad 0). *st: what it did. Optional: NULL, the caller copies one at a time with
   * d2d, to_host and to_device. */
  HixlStatus (*copy_many)(const struct devmem_copy *v, size_t n, size_t *bad, struct devmem_many *st,
                          char *why, size_t cap);
};

/* Whether h's numbers hold together (a range inside its allocation, not empty, no
 * wrap); PARAM_INVALID with why naming them. Every ipc_open checks it first. */
HixlStatus devmem_ipc_valid(const struct devmem_ipc *h, char *why, size_t cap);

/* The provider of this process (found once), or NULL with why: no driver, no device,
 * or a build without CUDA headers. */
const struct devmem_ops *devmem_get(char *why, size_t cap);
/* What finding the provider left for the host's log (a setting it could not take, its
 * value quoted raw: escape it), into out; true once, for the first caller after it was
 * found (devmem logs nothing itself: it sits beside util/log, not above it). */
bool devmem_notice_take(char *out, size_t cap);

/* Whether [addr, addr + len), taken for host memory (registered as such, or an op's
 * unregistered range staged through this CPU), is device memory of the driver this
 * process loaded (its ends asked): PARAM_INVALID naming it (the CPU cannot touch it: a
 * recv or memcpy into it faults), else SUCCESS. Never loads a driver (a process holds
 * device memory only once it loaded one; without one: a walk of the loaded objects);
 * the host stand-in's "device" memory is host memory. */
HixlStatus devmem_host_check(uint64_t addr, uint64_t len, char *why, size_t cap);

/* v[0..n) copied by dm: by its copy_many, or one at a time (d2d, to_host, to_device: a
 * wait each) where it has none; *bad and *st as copy_many's. */
HixlStatus devmem_copy_many(const struct devmem_ops *dm, const struct devmem_copy *v, size_t n, size_t *bad,
                            struct devmem_many *st, char *why, size_t cap);

/* A pool of pinned host buffers of size bytes each, at most max of them, made as first
 * needed and kept until devmem_pool_free: the host side of device copies (an engine
 * has one). The caller serializes calls (the engine lock). */
struct devmem_pool;
struct devmem_pool *devmem_pool_new(const struct devmem_ops *dm, int device, size_t size, uint32_t max);
/* A buffer, or NULL when max are out (counted: a wait) or one cannot be made (why). */
void *devmem_pool_get(struct devmem_pool *p, char *why, size_t cap);
/* A buffer even when max are out: then one of its own, unpinned, freed when put back
 * (counted: a spill). NULL only when memory runs out. For a target landing a peer's
 * WRITE, which cannot wait without stalling every link behind the pool. */
void *devmem_pool_spill(struct devmem_pool *p, char *why, size_t cap);
/* A buffer of its own beyond the pool even when the pool has one free (counted: a
 * spill): a target's link that holds its share of the pool lands a WRITE there. */
void *devmem_pool_extra(struct devmem_pool *p, char *why, size_t cap);
bool devmem_pool_owns(const struct devmem_pool *p, const void *buf); /* one of its max, not a spill */
void devmem_pool_waited(
    struct devmem_pool *p); /* a get its caller did not make (a link's share held): a wait */
void devmem_pool_put(struct devmem_pool *p, void *buf); /* a spilled buffer is freed */
bool devmem_pool_empty(const struct devmem_pool *p);    /* the next get would wait */
void devmem_pool_free(struct devmem_pool *p);           /* every buffer back: unpinned and freed */

/* Test builds: what every pool of this process holds now: buffers handed out, buffers
 * pinned (the host stand-in's count), and gets that found none free so far (the pool
 * out, or the link asking holding its share: devmem_pool_waited). */
void devmem_test_pool(uint64_t *out, uint64_t *pinned, uint64_t *waits);
uint64_t devmem_test_spills(void); /* buffers devmem_pool_spill made beyond the pool */

/* Test builds: bytes the host stand-in copied to host and to "device" memory so far
 * (a test tells the device paths ran, not only that the bytes arrived). */
void devmem_test_counts(uint64_t *to_host, uint64_t *to_device);
/* Test builds: bytes the host stand-in copied device to device (d2d), and its peer
 * mappings open now (ipc_open not yet closed). */
void devmem_test_d2d(uint64_t *bytes, uint64_t *open_maps);
/* Test builds: the device ordinal the host stand-in's last ipc_open and ipc_close were
 * asked for (-1: none yet). Its "device" memory is device 0's, or that of
 * HIXL_TEST_DEVMEM_DEVICE as its registration finds it. */
void devmem_test_ipc_devices(int *opened, int *closed);
/* Test builds: "device" memory the host stand-in can export (ipc_export): len bytes of
 * a memfd mapped shared, NULL when it cannot be made; devmem_test_free undoes it. */
void *devmem_test_alloc(size_t len);
void devmem_test_free(void *p);
/* Test builds: close (true) or open the gate the host stand-in's copies to and from
 * "device" memory wait at (a device's copy that takes its time); gate_wait waits at most
 * ms for n copies to wait there, and says whether they do. */
void devmem_test_gate(bool closed);
bool devmem_test_gate_wait(uint32_t n, int ms);
/* Test builds: hold at the closed gate only the copies touching [addr, addr + len) of
 * "device" memory (len 0: every copy, the default). */
void devmem_test_gate_range(uint64_t addr, uint64_t len);
/* Test builds: the host stand-in's streams: made so far, alive now, and the copies
 * started on them so far. HIXL_TEST_DEVMEM_ASYNC=0 gives a stand-in without streams
 * (the engine's synchronous copies), read when the provider is first found. */
void devmem_test_streams(uint64_t *made, uint64_t *live, uint64_t *copies);
/* Test builds: the stand-in fails its copies touching [addr, addr + len) on either side
 * (len 0: none, the default), saying so. */
void devmem_test_fail_range(uint64_t addr, uint64_t len);
/* Test builds: the stand-in's copy_many calls that copied anything so far (each one
 * wait, however many copies it made). */
uint64_t devmem_test_batches(void);
/* Test builds: dma-bufs the host stand-in made so far (dmabuf). */
uint64_t devmem_test_dmabufs(void);

#endif
