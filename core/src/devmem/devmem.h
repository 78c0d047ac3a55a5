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

#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_status.h"

struct devmem_ops {
  const char *name;
  /* Whether [addr, addr + len) lies in one allocation of device memory; its device
   * ordinal into *device. Not: PARAM_INVALID (why says what it is instead). */
  HixlStatus (*query)(uint64_t addr, uint64_t len, int *device, char *why, size_t cap);
  /* Copies between device memory (on device) and host memory; done when they return. */
  HixlStatus (*to_host)(void *dst, uint64_t src, size_t n, int device, char *why, size_t cap);
  HixlStatus (*to_device)(uint64_t dst, const void *src, size_t n, int device, char *why, size_t cap);
};

/* The provider of this process (found once), or NULL with why: no driver, no device,
 * or a build without CUDA headers. */
const struct devmem_ops *devmem_get(char *why, size_t cap);

/* Test builds: bytes the host stand-in copied to host and to "device" memory so far
 * (a test tells the device paths ran, not only that the bytes arrived). */
void devmem_test_counts(uint64_t *to_host, uint64_t *to_device);

#endif
