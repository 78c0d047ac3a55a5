/* kv_host: what a test host of the KV-connector plugin needs around it (no hixl: these
 * hosts include only the plugin's ABI header and link nothing of hixl). */
#ifndef HIXL_TEST_KV_HOST_H
#define HIXL_TEST_KV_HOST_H

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hixl/hixl_kv_connector.h"

static inline int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* As the other suites: HIXL_TEST_TRANSPORT, or rdma in the soft-RoCE guest
 * (HIXL_REQUIRE_RDMA), else auto (shm between two processes of one host). */
static inline const char *transport(void) {
  const char *t = getenv("HIXL_TEST_TRANSPORT");
  if (t && *t) return t;
  return getenv("HIXL_REQUIRE_RDMA") ? "rdma" : "auto";
}

/* The engines' IP: HIXL_TEST_IP (the rxe device's address in the guest). */
static inline const char *test_ip(void) {
  const char *ip = getenv("HIXL_TEST_IP");
  return ip && *ip ? ip : "127.0.0.1";
}

/* Holds ip:port (port 0: one the kernel picks) for the rest of this process: a socket
 * bound there with SO_REUSEADDR, never listening, never closed. No other bind(:0) or
 * connect() takes the port while it is held, and an engine (which sets SO_REUSEADDR)
 * still listens on it; a port only probed and closed could be taken by a parallel
 * test's bind(:0) before the engine listened ("Address already in use"). The port
 * held, or 0. */
static inline uint16_t hold_port(const char *ip, uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  socklen_t sl = sizeof(sa);
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (port) { /* a port named: nobody may hold it already (SO_REUSEADDR binds would share) */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool taken = probe < 0 || bind(probe, (struct sockaddr *)&sa, sizeof(sa)) != 0;
    if (probe >= 0) close(probe);
    if (taken) {
      if (fd >= 0) close(fd);
      return 0;
    }
  }
  uint16_t held = 0;
  if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    held = ntohs(sa.sin_port);
  if (fd >= 0 && !held) close(fd);
  return held;
}

/* A TCP port on test_ip() held for this process (hold_port); 0 if none was found. */
static inline uint16_t free_port(void) { return hold_port(test_ip(), 0); }

/* A run of n ports from the one returned, each held for this process (hold_port), as TP
 * ranks listen on port + rank; 0 if none was found. Tried at random below the kernel's
 * ephemeral range first: no port-0 bind or outgoing connection takes a port there, and
 * none of their closed connections lingers there in TIME_WAIT, which hold_port's probe
 * refuses (after tens of thousands of connections on a machine, nearly every run of
 * ephemeral ports held one); then from the kernel's pick. A run cut short leaves its
 * first ports held (unused). */
static inline uint16_t hold_run(const char *ip, uint32_t n) {
  unsigned low = 32768, r;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%u", &low) != 1) low = 32768;
    fclose(f);
  }
  for (int tries = 0; tries < 64; tries++) {
    uint16_t base = 0;
    if (tries < 48 && low <= 65536 && low >= 10000 + n + 64 && getentropy(&r, sizeof(r)) == 0)
      base = hold_port(ip, (uint16_t)(10000 + r % (low - n - 10000)));
    else if (tries >= 48)
      base = hold_port(ip, 0);
    bool ok = base && base + n <= 65536;
    for (uint32_t i = 1; i < n && ok; i++) ok = hold_port(ip, (uint16_t)(base + i)) != 0;
    if (ok) return base;
  }
  return 0;
}

/* One step of metadata from a scheduler to its worker, and the step's loads started. */
static inline void kv_host_step(const hixl_kv_ops *ops, hixl_kv_connector *sched, hixl_kv_connector *worker) {
  hixl_kv_buffer m = {0};
  CU_ASSERT_EQUAL(ops->build_connector_meta(sched, &m), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(ops->bind_connector_meta(worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  CU_ASSERT_EQUAL(ops->start_load_kv(worker), HIXL_KV_SUCCESS);
}

static inline bool ids_have(const hixl_kv_ids *ids, const char *id) {
  for (size_t i = 0; i < ids->count; i++)
    if (strcmp(ids->ids[i], id) == 0) return true;
  return false;
}

/* dlopen the plugin at path and take its ops table for this header's major version;
 * NULL, said on stderr as name's, when that fails. */
static inline void *kv_host_open(const char *name, const char *path, const hixl_kv_ops **ops) {
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "%s: dlopen %s: %s\n", name, path, dlerror());
    return NULL;
  }
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  char err[256] = "";
  if (!entry || entry(HIXL_KV_ABI_MAJOR, ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "%s: %s: no usable %s %s\n", name, path, HIXL_KV_ENTRY_SYMBOL, err);
    dlclose(so);
    return NULL;
  }
  return so;
}

/* Run the suites (verbose), close so; the exit status: 0 when every test passed. */
static inline int kv_host_run(const char *name, CU_SuiteInfo *suites, void *so) {
  int rc = 1;
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  if (CU_register_suites(suites) != CUE_SUCCESS) {
    fprintf(stderr, "%s: %s\n", name, CU_get_error_msg());
  } else {
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    rc = CU_get_number_of_failures() + CU_get_number_of_tests_failed() ? 1 : 0;
  }
  CU_cleanup_registry();
  dlclose(so);
  return rc;
}

#endif
