/* api: the public HixlEngine* API. Validates every argument, then works on the
 * engine state under its lock. The wire and socket work lives in link.c; the data
 * paths in the modules behind the transport interface (xport.h), which this file
 * wires to the engine (engine_mods) and reaches only through their tables. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "engine/stage.h"
#include "transport/rdma/xport_rdma.h"
#include "transport/shm/xport_shm.h"
#include "transport/tcp/xport_tcp.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return hixl_fail(HIXL_PARAM_INVALID, __VA_ARGS__);                                          \
  } while (0)

/* Lock e and check it is initialized; on failure the lock is not held. */
static HixlStatus engine_enter(HixlEngine *e, const char *fn) {
  if (!e) return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is NULL", fn);
  pthread_mutex_lock(&e->lock);
  if (!e->initialized) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is not initialized; call HixlEngineInitialize first",
                     fn);
  }
  return HIXL_SUCCESS;
}

/* The modules, by id: the transports in the order Connect tries them, then staging. */
static const struct xport_ops *const engine_mods[XPORT_MODS] = {[XPORT_SHM] = &xport_shm,
                                                                [XPORT_RDMA] = &xport_rdma,
                                                                [XPORT_TCP] = &xport_tcp,
                                                                [XPORT_STAGE] = &xport_stage};

/* Close modules [0, n) in reverse order (staging's MR before the RDMA device). */
static void mods_close(HixlEngine *e, int n) {
  while (n-- > 0)
    if (e->mods[n]->close) e->mods[n]->close(e);
}

static void reg_release(HixlEngine *e, struct hixl_mem_reg *r);

/* Whether a request timing out had to reset a link (RDMA work requests posted). */
static bool mods_req_timeout(HixlEngine *e, struct hixl_transfer_req *r) {
  bool reset = false;
  for (int i = 0; i < XPORT_MODS; i++)
    if (e->mods[i]->req_timeout) reset |= e->mods[i]->req_timeout(e, r);
  return reset;
}

static HixlStatus check_timeout(int32_t timeout_ms, const char *fn) {
  CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %d is negative (0 means the default %d ms)", fn, timeout_ms,
            HIXL_DEFAULT_TIMEOUT_MS);
  return HIXL_SUCCESS;
}

/* remote_engine must be "ip:port"; returns its address. */
static HixlStatus check_remote(const char *remote, const char *fn, struct sockaddr_in *sa) {
  bool has_port;
  HixlStatus st;
  CHECK_ARG(remote && strlen(remote) < ENGINE_NAME_MAX, "%s: remote_engine is NULL or too long", fn);
  if ((st = sock_parse_endpoint(remote, "remote_engine", sa, &has_port)) != HIXL_SUCCESS)
    return hixl_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  CHECK_ARG(has_port, "%s: remote_engine \"%s\" needs a port (\"ip:port\")", fn, remote);
  return HIXL_SUCCESS;
}

static struct peer *find_peer(HixlEngine *e, const char *name) {
  for (struct peer *p = e->peers; p; p = p->next)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

static void peer_free(HixlEngine *e, struct peer *p) {
  for (struct peer **pp = &e->peers; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  for (size_t i = 0; i < p->rtab.count; i++) free(p->rtab.v[i]);
  memtab_free(&p->rtab);
  free(p);
}

HixlStatus HixlEngineCreate(HixlEngine **engine) {
  pthread_condattr_t ca;
  CHECK_ARG(engine, "HixlEngineCreate: engine output is NULL");
  hixl_log_init();
  HixlEngine *e = calloc(1, sizeof(*e));
  if (!e) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineCreate: out of memory");
  pthread_mutex_init(&e->lock, NULL);
  pthread_mutex_init(&e->req_lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cond, &ca);
  pthread_condattr_destroy(&ca);
  e->listen_fd = e->epfd = e->evfd = -1;
  *engine = e;
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineInitialize(HixlEngine *e, const char *local_engine, const HixlOption *options,
                                size_t num_options) {
  struct hixl_options opts;
  struct sockaddr_in sa;
  bool has_port;
  HixlStatus st;
  CHECK_ARG(e, "HixlEngineInitialize: engine is NULL");
  CHECK_ARG(local_engine && strlen(local_engine) < ENGINE_NAME_MAX,
            "HixlEngineInitialize: local_engine is NULL or longer than %d characters", ENGINE_NAME_MAX - 1);
  st = sock_parse_endpoint(local_engine, "local_engine", &sa, &has_port);
  if (st != HIXL_SUCCESS) return st;
  st = hixl_options_parse(options, num_options, &opts);
  if (st != HIXL_SUCCESS) return st;

  pthread_mutex_lock(&e->lock);
  if (e->initialized) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID, "HixlEngineInitialize: engine is already initialized as %s",
                     e->local_name);
  }
  e->opts = opts;
  e->local_addr = sa;
  e->stopping = false;
  snprintf(e->local_name, sizeof(e->local_name), "%s", local_engine);
  int opened = 0;
  for (; opened < XPORT_MODS; opened++) {
    e->mods[opened] = engine_mods[opened];
    if (e->mods[opened]->open && (st = e->mods[opened]->open(e)) != HIXL_SUCCESS) goto close_mods;
  }
  e->listen_fd = has_port ? sock_listen(&sa, 0, &st) : -1;
  if (has_port && e->listen_fd < 0) goto close_mods;
  if (link_start(e, &st) < 0) {
    st =
        hixl_fail(HIXL_FAILED, "HixlEngineInitialize: cannot start the progress thread: %s", strerror(errno));
    goto close_listen;
  }
  e->initialized = true;
  log_info("engine %s up (%s, transport %s)", e->local_name, has_port ? "listening" : "client only",
           hixl_transport_name(opts.transport));
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
close_listen:
  if (e->listen_fd >= 0) close(e->listen_fd);
  e->listen_fd = -1;
close_mods:
  mods_close(e, opened);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineFinalize(HixlEngine *e) {
  HixlStatus st = engine_enter(e, "HixlEngineFinalize");
  if (st != HIXL_SUCCESS) return st;
  e->initialized = false; /* new calls are refused from here on */
  pthread_mutex_unlock(&e->lock);
  link_stop(e);
  pthread_mutex_lock(&e->lock);
  /* Work still running without the lock (an shm copy) ends before what it holds goes. */
  for (int i = 0; i < XPORT_MODS; i++)
    if (e->mods[i]->quiesce) e->mods[i]->quiesce(e);
  link_free_graveyard(e);
  while (e->peers) peer_free(e, e->peers);
  for (size_t i = 0; i < e->regs.count; i++) {
    reg_release(e, (struct hixl_mem_reg *)e->regs.v[i]);
  }
  memtab_free(&e->regs);
  mods_close(e, XPORT_MODS);
  for (size_t i = 0; i < e->n_notifies; i++) {
    free(e->notifies[i].name);
    free(e->notifies[i].msg);
    free(e->notifies[i].remote);
  }
  free(e->notifies);
  e->notifies = NULL;
  e->n_notifies = e->cap_notifies = 0;
  if (e->listen_fd >= 0) close(e->listen_fd);
  e->listen_fd = -1;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineDestroy(HixlEngine *e) {
  CHECK_ARG(e, "HixlEngineDestroy: engine is NULL");
  if (e->initialized) HixlEngineFinalize(e);
  /* Async requests never queried: every chunk ended when the links closed. */
  for (size_t i = 0; i < e->reqs.cap; i++) {
    struct hixl_transfer_req *r = e->reqs.slots[i];
    if (r) {
      free(r->chunks);
      free(r->segs);
      free(r);
    }
  }
  ptrset_free(&e->reqs);
  link_free_graveyard(e); /* a link a caller was still driving at Finalize */
  pthread_cond_destroy(&e->cond);
  pthread_mutex_destroy(&e->req_lock);
  pthread_mutex_destroy(&e->lock);
  free(e);
  return HIXL_SUCCESS;
}

/* ---- memory ---- */

/* Unmap and close what HixlEngineAllocMem made (nothing for the caller's memory). */
static void alloc_release(struct hixl_mem_reg *r) {
  if (r->memfd < 0) return;
  munmap((void *)(uintptr_t)r->range.addr, r->map_len);
  close(r->memfd);
  r->memfd = -1;
}

/* The registration behind handle, or NULL when this engine holds none such. */
static struct hixl_mem_reg *reg_of(HixlEngine *e, HixlMemHandle handle) {
  for (size_t i = 0; i < e->regs.count; i++)
    if (e->regs.v[i] == &handle->range) return handle;
  return NULL;
}

/* Let go of r: every transport's hold on it, the memory if the engine allocated it. */
static void reg_release(HixlEngine *e, struct hixl_mem_reg *r) {
  for (int k = 0; k < XPORT_MODS; k++)
    if (e->mods[k]->mem_dereg) e->mods[k]->mem_dereg(e, r);
  alloc_release(r);
  free(r);
}

/* Withdraw r from the table and from peers, then release it. Lock held. */
static void reg_drop(HixlEngine *e, struct hixl_mem_reg *r) {
  memtab_remove(&e->regs, &r->range);
  link_broadcast_mem(e, WIRE_MEM_DEL, r);
  reg_release(e, r);
}

/* FAILED, saying then, while transfers that touch r are in flight. */
static HixlStatus reg_idle(const struct hixl_mem_reg *r, const char *fn, const char *then) {
  if (r->inflight == 0) return HIXL_SUCCESS;
  return hixl_fail(HIXL_FAILED, "%s: %u transfer chunks on [0x%llx, +%llu) are still in flight; %s", fn,
                   r->inflight, (unsigned long long)r->range.addr, (unsigned long long)r->range.len, then);
}

#define ALLOC_HUGE (2u << 20)

/* A shared mapping of a new memfd of at least len bytes: huge pages when the kernel
 * can back all of it now (MAP_POPULATE faults them in, so a shortage fails here, not
 * later with SIGBUS), else normal pages advised to transparent huge pages. */
static HixlStatus alloc_map(size_t len, int *fd_out, void **addr_out, size_t *map_len, bool *huge) {
  long page = sysconf(_SC_PAGESIZE);
  size_t hlen = (len + ALLOC_HUGE - 1) / ALLOC_HUGE * ALLOC_HUGE;
  int fd = memfd_create("hixl", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (fd >= 0) {
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)hlen) == 0)
      p = mmap(NULL, hlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) {
      *fd_out = fd, *addr_out = p, *map_len = hlen, *huge = true;
      return HIXL_SUCCESS;
    }
    close(fd);
  }
  size_t plen = (len + (size_t)page - 1) / (size_t)page * (size_t)page;
  if ((fd = memfd_create("hixl", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0)
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineAllocMem: memfd_create: %s", strerror(errno));
  void *p = MAP_FAILED;
  int err = ftruncate(fd, (off_t)plen) == 0 ? 0 : errno;
  if (!err && (p = mmap(NULL, plen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) err = errno;
  if (err) {
    close(fd);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineAllocMem: %zu bytes of memfd memory: %s", plen,
                     strerror(err));
  }
  (void)madvise(p, plen, MADV_HUGEPAGE); /* a hint: shmem THP may be off */
  *fd_out = fd, *addr_out = p, *map_len = plen, *huge = false;
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineAllocMem(HixlEngine *e, size_t len, void **addr, HixlMemHandle *handle) {
  return hixl_engine_alloc_tagged(e, len, NULL, addr, handle);
}

HixlStatus hixl_engine_alloc_tagged(HixlEngine *e, size_t len, const char *tag, void **addr,
                                    HixlMemHandle *handle) {
  CHECK_ARG(addr && handle, "HixlEngineAllocMem: addr or handle output is NULL");
  CHECK_ARG(len > 0 && len <= ((size_t)1 << 46), "HixlEngineAllocMem: len %zu is 0 or above 64 TiB", len);
  HixlStatus st = engine_enter(e, "HixlEngineAllocMem"); /* fail before allocating */
  if (st != HIXL_SUCCESS) return st;
  pthread_mutex_unlock(&e->lock);
  int fd = -1;
  void *p = NULL;
  size_t map_len = 0;
  bool huge = false;
  if ((st = alloc_map(len, &fd, &p, &map_len, &huge)) != HIXL_SUCCESS) return st;
  HixlMemDesc m = {(uintptr_t)p, map_len};
  HixlMemHandle h;
  if ((st = hixl_engine_register_tagged(e, &m, HIXL_MEM_HOST, tag, &h)) != HIXL_SUCCESS) {
    munmap(p, map_len);
    close(fd);
    return hixl_fail(st, "HixlEngineAllocMem: %s", HixlGetLastErrorMessage());
  }
  /* Sealed at its size: a peer that maps it can trust every page stays (no SIGBUS). */
  bool sealed = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
  if (!sealed)
    log_warn("HixlEngineAllocMem: cannot seal the memfd (%s): peers copy it, not map it", strerror(errno));
  pthread_mutex_lock(&e->lock); /* h stays: only FreeMem or Finalize drop it */
  h->memfd = fd;
  h->map_len = map_len;
  h->sealed = sealed;
  for (int k = 0; k < XPORT_MODS; k++)
    if (e->mods[k]->mem_share) e->mods[k]->mem_share(e, h);
  pthread_mutex_unlock(&e->lock);
  log_info("engine %s: allocated %zu bytes at %p (memfd, %s pages)", e->local_name, map_len, p,
           huge ? "huge" : "normal");
  *addr = p;
  *handle = h;
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineFreeMem(HixlEngine *e, HixlMemHandle handle) {
  CHECK_ARG(handle, "HixlEngineFreeMem: handle is NULL");
  HixlStatus st = engine_enter(e, "HixlEngineFreeMem");
  if (st != HIXL_SUCCESS) return st;
  struct hixl_mem_reg *r = reg_of(e, handle);
  if (!r || r->memfd < 0) {
    st = hixl_fail(
        HIXL_PARAM_INVALID,
        "HixlEngineFreeMem: handle %p is not memory HixlEngineAllocMem allocated with this engine%s",
        (void *)handle, r ? " (it was registered: use HixlEngineDeregisterMem)" : "");
  } else if (r->freeing) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineFreeMem: another call is freeing [0x%llx, +%llu)",
                   (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
  } else if ((st = reg_idle(r, "HixlEngineFreeMem", "nothing was released")) == HIXL_SUCCESS) {
    /* Peers that mapped it let go first (a round trip; silent ones are cut off). */
    uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
    r->freeing = true; /* the hooks may release the lock while they wait */
    for (int k = 0; k < XPORT_MODS; k++)
      if (e->mods[k]->mem_unshare) e->mods[k]->mem_unshare(e, r, deadline);
    r->freeing = false;
    /* A transfer may have started on it while the peers answered (lock released). */
    if ((st = reg_idle(r, "HixlEngineFreeMem", "nothing was released")) == HIXL_SUCCESS) reg_drop(e, r);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineRegisterMem(HixlEngine *e, const HixlMemDesc *mem, HixlMemType type,
                                 HixlMemHandle *handle) {
  return hixl_engine_register_tagged(e, mem, type, NULL, handle);
}

HixlStatus hixl_engine_register_tagged(HixlEngine *e, const HixlMemDesc *mem, HixlMemType type,
                                       const char *tag, HixlMemHandle *handle) {
  struct memtab_entry *clash;
  CHECK_ARG(mem && handle, "HixlEngineRegisterMem: mem or handle is NULL");
  CHECK_ARG(!tag || strlen(tag) <= WIRE_MAX_TAG, "HixlEngineRegisterMem: mem_tag is longer than %u bytes",
            WIRE_MAX_TAG);
  CHECK_ARG(mem->addr != 0 && mem->len > 0, "HixlEngineRegisterMem: empty range [0x%lx, +%zu)",
            (unsigned long)mem->addr, mem->len);
  CHECK_ARG(mem->addr + mem->len > mem->addr, "HixlEngineRegisterMem: range [0x%lx, +%zu) wraps around",
            (unsigned long)mem->addr, mem->len);
  if (type == HIXL_MEM_DEVICE)
    return hixl_fail(
        HIXL_UNSUPPORTED,
        "HixlEngineRegisterMem: device memory needs an accelerator backend, and this build has none");
  CHECK_ARG(type == HIXL_MEM_HOST, "HixlEngineRegisterMem: unknown memory type %d", (int)type);
  HixlStatus st = engine_enter(e, "HixlEngineRegisterMem");
  if (st != HIXL_SUCCESS) return st;
  struct hixl_mem_reg *r = NULL;
  if (e->regs.count >= HIXL_MAX_REGISTRATIONS) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineRegisterMem: %d registrations already (the limit)",
                   HIXL_MAX_REGISTRATIONS);
    goto unlock;
  }
  r = calloc(1, sizeof(*r));
  if (!r) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineRegisterMem: out of memory");
    goto unlock;
  }
  r->memfd = -1;
  r->range.addr = mem->addr;
  r->range.len = mem->len;
  r->type = type;
  snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "");
  if (memtab_add(&e->regs, &r->range, &clash) < 0) {
    if (clash)
      st = hixl_fail(HIXL_PARAM_INVALID,
                     "HixlEngineRegisterMem: [0x%lx, +%zu) overlaps registered [0x%llx, +%llu)",
                     (unsigned long)mem->addr, mem->len, (unsigned long long)clash->addr,
                     (unsigned long long)clash->len);
    else
      st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineRegisterMem: out of memory");
    free(r);
    goto unlock;
  }
  for (int k = 0; k < XPORT_MODS; k++) {
    if (!e->mods[k]->mem_reg || (st = e->mods[k]->mem_reg(e, r)) == HIXL_SUCCESS) continue;
    while (k-- > 0)
      if (e->mods[k]->mem_dereg) e->mods[k]->mem_dereg(e, r);
    memtab_remove(&e->regs, &r->range);
    free(r);
    goto unlock;
  }
  link_broadcast_mem(e, WIRE_MEM_ADD, r);
  *handle = r;
unlock:
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineDeregisterMem(HixlEngine *e, HixlMemHandle handle) {
  CHECK_ARG(handle, "HixlEngineDeregisterMem: handle is NULL");
  HixlStatus st = engine_enter(e, "HixlEngineDeregisterMem");
  if (st != HIXL_SUCCESS) return st;
  struct hixl_mem_reg *r = reg_of(e, handle);
  if (!r) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "HixlEngineDeregisterMem: handle %p is not registered with this engine", (void *)handle);
  } else if (r->memfd >= 0) {
    st = hixl_fail(
        HIXL_PARAM_INVALID,
        "HixlEngineDeregisterMem: handle %p is memory HixlEngineAllocMem allocated; release it with "
        "HixlEngineFreeMem",
        (void *)handle);
  } else if ((st = reg_idle(r, "HixlEngineDeregisterMem", "wait for them or Disconnect the peer first")) ==
             HIXL_SUCCESS) {
    reg_drop(e, r);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* ---- links ---- */

/* Exchange HELLO / HELLO_ACK on a fresh blocking socket; fills the peer. */
static HixlStatus handshake(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                            const struct xport_ops **xp, void **link) {
  uint8_t hello[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME], hb[WIRE_HDR_LEN];
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st;
  wire_begin(&w, hello, sizeof(hello), WIRE_HELLO);
  wire_put_u32(&w, link_caps(e));
  wire_put_u16(&w, (uint16_t)strlen(e->local_name));
  wire_put_bytes(&w, e->local_name, strlen(e->local_name));
  st = sock_send_all(fd, hello, wire_end(&w, 0), deadline);
  if (st == HIXL_SUCCESS) st = sock_recv_all(fd, hb, sizeof(hb), deadline);
  if (st != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  enum wire_err err = wire_parse_hdr(hb, &h);
  if (err == WIRE_EVERSION)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s speaks hixl protocol version %u, this engine %u",
                     remote, h.version, WIRE_VERSION);
  if (err != WIRE_OK || h.type != WIRE_HELLO_ACK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s is not a hixl engine (%s)", remote,
                     err != WIRE_OK ? wire_err_str(err) : "unexpected first frame");
  uint8_t *body = malloc(h.body_len);
  if (!body) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  st = sock_recv_all(fd, body, h.body_len, deadline);
  if (st != HIXL_SUCCESS) {
    st = hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
    goto out;
  }
  if (wire_decode(&h, body, &m) != WIRE_OK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed HELLO_ACK", remote);
    goto out;
  }
  if (m.u.hello_ack.status != WIRE_HELLO_OK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s refused the link (%s)", remote,
                   m.u.hello_ack.status == WIRE_HELLO_VERSION ? "protocol version mismatch" : "refused");
    goto out;
  }
  snprintf(p->remote_name, sizeof(p->remote_name), "%.*s", (int)m.u.hello_ack.name_len,
           (const char *)m.u.hello_ack.name);
  p->caps = m.u.hello_ack.caps;
  const uint8_t *cur = m.u.hello_ack.entries;
  size_t left = m.u.hello_ack.entries_len;
  struct wire_mem_entry me;
  while (wire_mem_entry_next(&cur, &left, &me)) link_peer_add_mem(p, &me);
  /* Data path: the first transport that takes the link (xport_id order: shm for a
   * peer on this host that the kernel lets us reach, else rdma when both ends have
   * it, else tcp). Each passes on, or fails when Transport names it and it cannot. */
  bool taken = false;
  for (int i = 0; i < XPORT_MODS && !taken && st == HIXL_SUCCESS; i++) {
    const struct xport_ops *x = e->mods[i];
    if (!x->connect) continue;
    st = x->connect(e, fd, deadline, remote, p, &taken, link);
    if (taken) *xp = x;
  }
out:
  free(body);
  return st;
}

HixlStatus HixlEngineConnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = check_remote(remote, "HixlEngineConnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = check_timeout(timeout_ms, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = engine_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  struct peer *old = find_peer(e, remote);
  bool connected = old && old->conn && link_alive(old->conn);
  pthread_mutex_unlock(&e->lock);
  if (connected)
    return hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);

  struct peer *p = calloc(1, sizeof(*p));
  if (!p) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  snprintf(p->name, sizeof(p->name), "%s", remote);
  int fd = sock_connect(&sa, deadline, &st);
  if (fd < 0) goto free_peer;
  const struct xport_ops *xp = NULL;
  void *link = NULL;
  st = handshake(e, fd, remote, deadline, p, &xp, &link);
  if (st != HIXL_SUCCESS) goto close_fd;

  if ((st = engine_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) goto close_fd;
  old = find_peer(e, remote);
  if (old && old->conn) {
    pthread_mutex_unlock(&e->lock);
    st = hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);
    goto close_fd;
  }
  if (old) peer_free(e, old); /* a link that broke earlier: replaced */
  struct conn *c = link_conn_new(e, fd, CONN_INITIATOR);
  if (c) c->rx = RX_PARKED; /* nothing is owed yet; a hang-up still wakes the thread */
  if (!c || link_conn_watch(c) < 0) {
    pthread_mutex_unlock(&e->lock);
    if (c) {
      free(c->rxbuf);
      free(c);
    }
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: cannot set up the link to %s", remote);
    goto close_fd;
  }
  if (xp->attach) xp->attach(c, link); /* c->xp: xp */
  xp = NULL;
  snprintf(c->remote_name, sizeof(c->remote_name), "%s", p->remote_name[0] ? p->remote_name : remote);
  c->peer = p;
  p->conn = c;
  p->next = e->peers;
  e->peers = p;
  log_info("connected to %s (%zu remote registrations)", remote, p->rtab.count);
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
close_fd:
  if (xp && xp->discard) xp->discard(link);
  close(fd);
free_peer:
  for (size_t i = 0; i < p->rtab.count; i++) free(p->rtab.v[i]);
  memtab_free(&p->rtab);
  free(p);
  return st;
}

HixlStatus HixlEngineDisconnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = check_remote(remote, "HixlEngineDisconnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = check_timeout(timeout_ms, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  if ((st = engine_enter(e, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  struct peer *p = find_peer(e, remote);
  if (!p) {
    st = hixl_fail(HIXL_NOT_CONNECTED, "HixlEngineDisconnect: not connected to %s", remote);
  } else {
    if (p->conn) link_conn_kill(p->conn, HIXL_FAILED, "disconnected by the local engine");
    peer_free(e, p);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* ---- transfers ---- */

/* The live link to remote, or NULL with the reason recorded. Lock held. */
static struct conn *link_for(HixlEngine *e, const char *remote, const char *fn, HixlStatus *st) {
  struct peer *p = find_peer(e, remote);
  if (!p) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: not connected to %s; call HixlEngineConnect first", fn, remote);
    return NULL;
  }
  if (!p->conn) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: the link to %s was lost (%s); call HixlEngineConnect again", fn,
                    remote, p->broken_why);
    return NULL;
  }
  return p->conn;
}

static struct hixl_transfer_req *req_new(HixlEngine *e, uint32_t nchunks, int32_t timeout_ms) {
  struct hixl_transfer_req *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->chunks = calloc(nchunks, sizeof(*r->chunks));
  if (!r->chunks) {
    free(r);
    return NULL;
  }
  r->eng = e;
  r->nchunks = r->outstanding = r->ndirect = nchunks;
  r->user_holds = true;
  r->deadline_ns = hixl_deadline_ns(timeout_ms);
  return r;
}

/* Wait for a request the caller holds, then let go of it. Lock held. */
static HixlStatus req_wait(HixlEngine *e, struct conn *c, struct hixl_transfer_req *r, const char *fn,
                           const char *remote) {
  struct timespec ts = {.tv_sec = (time_t)(r->deadline_ns / 1000000000ull),
                        .tv_nsec = (long)(r->deadline_ns % 1000000000ull)};
  HixlStatus st = HIXL_SUCCESS;
  /* Receive our own answers when nobody else is; an async request's data was handed to
   * its transport already (shm would copy it twice). */
  if (c && !r->is_async) link_drive(c, r);
  while (r->outstanding > 0)
    if (pthread_cond_timedwait(&e->cond, &e->lock, &ts) == ETIMEDOUT) break;
  uint32_t starved = r->outstanding > 0 ? stage_cancel(r) : 0;
  if (starved > 0) {
    r->cancelled = true;
    st = stage_exhausted(e, fn, starved, remote);
    link_then_cancel(r, st, "the transfer before it found no staging buffer");
  } else if (r->outstanding > 0) {
    uint32_t left = r->outstanding;
    r->cancelled = true;
    bool reset = mods_req_timeout(e, r);
    st = hixl_fail(HIXL_TIMEOUT, "%s: %u of %u chunks to %s unanswered at the deadline%s", fn, left,
                   r->nchunks + (r->then ? 1u : 0u), remote,
                   reset ? "; RDMA work requests were still posted, so the link was reset (Connect again)"
                         : "");
    link_then_cancel(r, HIXL_TIMEOUT, "the transfer before it timed out");
  } else if (r->status != HIXL_SUCCESS) {
    st = hixl_fail(r->status, "%s: %s", fn, r->err);
  }
  r->user_holds = false;
  link_req_maybe_free(r);
  return st;
}

/* Index of the first op whose remote range the peer has not advertised, or count. */
/* Look every op's remote range up in the peer's table (rms[i], NULL when it is not
 * inside one advertised registration); returns how many missed. */
static size_t remote_lookup(struct conn *c, const HixlTransferOpDesc *descs, size_t count,
                            const struct remote_mem **rms) {
  size_t miss = 0;
  for (size_t i = 0; i < count; i++)
    miss += !(rms[i] =
                  (const struct remote_mem *)memtab_find(&c->peer->rtab, descs[i].remote_addr, descs[i].len));
  return miss;
}

/* One SYNC round trip on c: when it returns, every MEM_ADD / MEM_DEL the peer queued
 * before answering has been applied. Lock held; released while waiting. */
static HixlStatus link_sync(HixlEngine *e, struct conn *c, uint64_t deadline, const char *fn,
                            const char *remote) {
  struct hixl_transfer_req *r = req_new(e, 1, 0);
  if (!r) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  struct chunk *ch = r->chunks;
  r->deadline_ns = deadline;
  ch->req = r;
  ch->kind = CHUNK_SYNC;
  ch->seq = c->next_seq++;
  ch->tx.chunk = ch;
  ch->tx.hdr_len = (uint32_t)wire_put_sync(ch->tx.hdr, ch->seq);
  link_enqueue(c, &ch->tx);
  link_flush(c);
  return req_wait(e, c, r, fn, remote);
}

/* How a batch moves: ops straight between registrations (direct, split into chunks of
 * ENGINE_TCP_CHUNK) and staged ops packed into units of the pool's unit size. */
struct stage_plan {
  uint64_t ndirect; /* chunks */
  uint64_t nunits;
  uint64_t nsegs;
};

/* Decide every op, fill lregs (NULL: staged) and the plan; nothing is sent. rms[i]:
 * the peer's registration holding op i's remote range, or NULL. An op is
 * staged when its local or remote range is not registered, or when it is short
 * enough to pack (StagingThreshold) on a tcp or rdma link to a peer that serves
 * staged frames. Lock held. */
static HixlStatus plan_ops(HixlEngine *e, struct conn *c, const HixlTransferOpDesc *descs, size_t count,
                           const char *fn, const char *remote, const struct remote_mem *const *rms,
                           struct hixl_mem_reg **lregs, struct stage_plan *plan) {
  const struct stage_pool *pool = &e->pool;
  uint32_t caps = c->peer->caps;
  bool pack = stage_packs(c);
  uint32_t threshold = stage_threshold(c);
  uint64_t ubytes = 0, useg = 0;
  memset(plan, 0, sizeof(*plan));
  for (size_t i = 0; i < count; i++) {
    const HixlTransferOpDesc *d = &descs[i];
    lregs[i] = (struct hixl_mem_reg *)memtab_find(&e->regs, d->local_addr, d->len);
    bool rreg = rms[i] != NULL;
    if (lregs[i] && rreg && !(pack && d->len < threshold)) {
      plan->ndirect += (d->len + ENGINE_TCP_CHUNK - 1) / ENGINE_TCP_CHUNK;
      continue;
    }
    if (pool->num == 0)
      return hixl_fail(HIXL_PARAM_INVALID,
                       "%s: op %zu %s range [0x%lx, +%zu) is not inside memory registered %s%s, and staging "
                       "is off (BufferPool 0:0); nothing was sent",
                       fn, i, lregs[i] ? "remote" : "local",
                       (unsigned long)(lregs[i] ? d->remote_addr : d->local_addr), d->len,
                       lregs[i] ? "with " : "with this engine", lregs[i] ? remote : "");
    if (!(caps & WIRE_CAP_STAGE))
      return hixl_fail(HIXL_FAILED,
                       "%s: op %zu needs staging (its %s range is not registered) but %s does not serve "
                       "staged transfers; nothing was sent",
                       fn, i, lregs[i] ? "remote" : "local", remote);
    if (!rreg && !(caps & WIRE_CAP_STAGE_ANY))
      return hixl_fail(HIXL_FAILED,
                       "%s: op %zu remote range [0x%lx, +%zu) is not inside memory registered with %s, and "
                       "%s does not let peers reach unregistered memory (its StagingUnregistered is off); "
                       "nothing was sent",
                       fn, i, (unsigned long)d->remote_addr, d->len, remote, remote);
    lregs[i] = NULL;
    /* Pieces of at most one unit; a unit holds up to pool->unit bytes in up to
     * WIRE_MAX_STAGE_SEGS ranges. plan_units packs them the same way. */
    for (size_t off = 0; off < d->len;) {
      size_t piece = d->len - off < pool->unit ? d->len - off : pool->unit;
      if (plan->nunits == 0 || ubytes + piece > pool->unit || useg == WIRE_MAX_STAGE_SEGS) {
        plan->nunits++;
        ubytes = useg = 0;
      }
      ubytes += piece;
      useg++;
      plan->nsegs++;
      off += piece;
    }
  }
  if (plan->ndirect + plan->nunits > UINT32_MAX / 2)
    return hixl_fail(HIXL_PARAM_INVALID, "%s: batch is too large", fn);
  return HIXL_SUCCESS;
}

/* Fill r's units (after its ndirect direct chunks) as plan_ops counted them. */
static void plan_units(HixlEngine *e, const HixlTransferOpDesc *descs, size_t count,
                       struct hixl_mem_reg *const *lregs, struct hixl_transfer_req *r, struct conn *c,
                       HixlTransferOp op) {
  size_t unit = e->pool.unit;
  struct chunk *ch = NULL;
  struct stage_seg *seg = r->segs;
  for (size_t i = 0; i < count; i++) {
    if (lregs[i]) continue;
    for (size_t off = 0; off < descs[i].len;) {
      size_t piece = descs[i].len - off < unit ? descs[i].len - off : unit;
      if (!ch || ch->len + piece > unit || ch->nsegs == WIRE_MAX_STAGE_SEGS) {
        ch = ch ? ch + 1 : &r->chunks[r->ndirect];
        ch->req = r;
        ch->kind = op == HIXL_READ ? CHUNK_SREAD : CHUNK_SWRITE;
        ch->segs = seg;
        ch->sconn = c;
        ch->tx.chunk = ch;
      }
      seg->laddr = descs[i].local_addr + off;
      seg->raddr = descs[i].remote_addr + off;
      seg->len = (uint32_t)piece;
      seg++;
      ch->nsegs++;
      ch->len += (uint32_t)piece;
      off += piece;
    }
  }
}

static HixlStatus transfer_submit(HixlEngine *e, const char *remote, HixlTransferOp op,
                                  const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms,
                                  const char *fn, struct hixl_transfer_req **out, struct conn **out_conn) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = check_remote(remote, fn, &sa)) != HIXL_SUCCESS) return st;
  CHECK_ARG(op == HIXL_READ || op == HIXL_WRITE, "%s: op %d is neither HIXL_READ nor HIXL_WRITE", fn,
            (int)op);
  CHECK_ARG(descs && count > 0 && count <= HIXL_MAX_BATCH, "%s: need 1 to %d op descriptors, got %zu%s", fn,
            HIXL_MAX_BATCH, count, descs ? "" : " (descs is NULL)");
  if ((st = check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint64_t nchunks = 0;
  for (size_t i = 0; i < count; i++) {
    CHECK_ARG(descs[i].len > 0, "%s: op %zu has length 0", fn, i);
    CHECK_ARG(descs[i].local_addr + descs[i].len > descs[i].local_addr &&
                  descs[i].remote_addr + descs[i].len > descs[i].remote_addr,
              "%s: op %zu range wraps around the address space", fn, i);
    nchunks += (descs[i].len + ENGINE_TCP_CHUNK - 1) / ENGINE_TCP_CHUNK;
  }
  CHECK_ARG(nchunks <= UINT32_MAX / 2, "%s: batch is too large", fn);
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = engine_enter(e, fn)) != HIXL_SUCCESS) return st;
  struct conn *c = link_for(e, remote, fn, &st);
  struct hixl_mem_reg **lregs = NULL;
  struct hixl_transfer_req *r = NULL;
  if (!c) goto unlock;
  /* An op moves directly only when its remote range lies in one registration the
   * peer advertised; otherwise it is staged (the peer checks it) or refused whole
   * before anything is sent (plan_ops). On a miss, one SYNC round trip first brings
   * the table up to date (the peer may have registered it a moment ago). */
  if (c->xp->flags & XPORT_ONE_SIDED) {
    /* The table must be current before anything is posted or copied: the frames
     * waiting on the socket are applied now, unless the transport knows nothing was
     * withdrawn since (shm: a counter the peer shares; the poll would cost ~5% of a
     * 256 KiB memcpy). */
    if (!c->xp->table_current || !c->xp->table_current(c)) link_take_pending(c);
    if (!(c = link_for(e, remote, fn, &st))) goto unlock;
  }
  lregs = malloc(count * (sizeof(*lregs) + sizeof(struct remote_mem *)));
  if (!lregs) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto unlock;
  }
  const struct remote_mem **rms = (const struct remote_mem **)(lregs + count);
  if (remote_lookup(c, descs, count, rms) > 0) {
    if ((st = link_sync(e, c, deadline, fn, remote)) != HIXL_SUCCESS) goto unlock;
    if (!(c = link_for(e, remote, fn, &st))) goto unlock;
    remote_lookup(c, descs, count, rms);
  }
  struct stage_plan plan;
  if ((st = plan_ops(e, c, descs, count, fn, remote, rms, lregs, &plan)) != HIXL_SUCCESS) goto unlock;
  r = req_new(e, plan.ndirect + plan.nunits, timeout_ms);
  if (r && plan.nsegs && !(r->segs = calloc(plan.nsegs, sizeof(*r->segs)))) {
    r->user_holds = false;
    r->outstanding = 0;
    link_req_maybe_free(r);
    r = NULL;
  }
  if (!r) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory for %llu chunks", fn,
                   (unsigned long long)(plan.ndirect + plan.nunits));
    goto unlock;
  }
  r->deadline_ns = deadline;
  r->ndirect = plan.ndirect;
  struct chunk *ch = r->chunks;
  for (size_t i = 0; i < count; i++) {
    if (!lregs[i]) continue;              /* staged */
    const struct remote_mem *rm = rms[i]; /* a direct op's: its key is there too */
    for (size_t off = 0; off < descs[i].len; off += ENGINE_TCP_CHUNK, ch++) {
      size_t len = descs[i].len - off < ENGINE_TCP_CHUNK ? descs[i].len - off : ENGINE_TCP_CHUNK;
      ch->req = r;
      ch->lreg = lregs[i];
      ch->lreg->inflight++;
      ch->laddr = (uint8_t *)(descs[i].local_addr + off);
      ch->raddr = descs[i].remote_addr + off;
      ch->len = (uint32_t)len;
      ch->seq = c->next_seq++;
      ch->kind = op == HIXL_READ ? CHUNK_READ : CHUNK_WRITE;
      ch->rkey = rm->rkey;
      ch->tx.chunk = ch;
      c->xp->post(c, ch); /* a frame (tcp), a work request (rdma), or nothing yet (shm) */
    }
  }
  if (plan.nunits > 0) {
    plan_units(e, descs, count, lregs, r, c, op);
    stage_submit(r); /* units with a free buffer go on the wire now, the rest wait in order */
  }
  if (c->dead) {
    /* A send above found the link reset (the peer closed it): what was queued on it
     * has ended with it. A copying transport's direct chunks wait in r alone until
     * driven: they end here. */
    if (c->xp->flags & XPORT_CPU_COPY)
      for (uint32_t k = 0; k < plan.ndirect; k++)
        link_chunk_end(&r->chunks[k], HIXL_FAILED, "the link was lost as the transfer started");
  } else if (c->xp->start) {
    /* shm: a sync caller copies in link_drive; an async request goes to its async hook. */
    c->xp->start(c, r);
  }
  *out = r;
  *out_conn = c;
unlock:
  free(lregs);
  if (st != HIXL_SUCCESS) pthread_mutex_unlock(&e->lock);
  return st; /* on success the lock is still held */
}

HixlStatus HixlEngineTransferSync(HixlEngine *e, const char *remote, HixlTransferOp op,
                                  const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms) {
  struct hixl_transfer_req *r;
  struct conn *c;
  HixlStatus st = transfer_submit(e, remote, op, descs, count, timeout_ms, "HixlEngineTransferSync", &r, &c);
  if (st != HIXL_SUCCESS) return st;
  st = req_wait(e, c, r, "HixlEngineTransferSync", remote);
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* r's chunks are queued on c and nobody waits in a call: its transport's async hook,
 * or, for one without (xport.h: any hook may be NULL), the progress thread takes it. */
static void xport_async(struct conn *c, struct hixl_transfer_req *r) {
  if (c->xp->async)
    c->xp->async(c, r);
  else
    link_unpark(c);
}

HixlStatus HixlEngineTransferAsync(HixlEngine *e, const char *remote, HixlTransferOp op,
                                   const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms,
                                   void *user_data, HixlTransferReq *req) {
  struct hixl_transfer_req *r;
  CHECK_ARG(req, "HixlEngineTransferAsync: req output is NULL");
  struct conn *c;
  HixlStatus st = transfer_submit(e, remote, op, descs, count, timeout_ms, "HixlEngineTransferAsync", &r, &c);
  if (st != HIXL_SUCCESS) return st;
  r->is_async = true;
  r->user_data = user_data;
  xport_async(c, r); /* nobody waits in a call; shm: copied now or queued, c may be gone after */
  pthread_mutex_lock(&e->req_lock);
  int added = ptrset_add(&e->reqs, r);
  pthread_mutex_unlock(&e->req_lock);
  if (added < 0) {
    r->cancelled = true;
    r->user_holds = false;
    link_req_maybe_free(r);
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineTransferAsync: out of memory");
  }
  *req = r;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

/* Find a request the caller still holds; returns with req_lock held on success. */
static HixlStatus req_enter(HixlEngine *e, HixlTransferReq req, const char *fn) {
  if (!e) return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is NULL", fn);
  pthread_mutex_lock(&e->req_lock);
  if (!req || !ptrset_has(&e->reqs, req)) {
    pthread_mutex_unlock(&e->req_lock);
    return hixl_fail(HIXL_PARAM_INVALID, "%s: request %p is unknown or was already released", fn,
                     (void *)req);
  }
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineGetTransferStatus(HixlEngine *e, HixlTransferReq req, HixlTransferStatus *status) {
  CHECK_ARG(status, "HixlEngineGetTransferStatus: status output is NULL");
  HixlStatus st = req_enter(e, req, "HixlEngineGetTransferStatus");
  if (st != HIXL_SUCCESS) return st;
  struct hixl_transfer_req *r = req;
  HixlTransferStatus s = HIXL_TRANSFER_WAITING;
  hixl_error_clear();
  /* Polling a request in flight must not contend with the progress thread. */
  if (__atomic_load_n(&r->outstanding, __ATOMIC_ACQUIRE) > 0 && hixl_now_ns() < r->deadline_ns) {
    pthread_mutex_unlock(&e->req_lock);
    *status = HIXL_TRANSFER_WAITING;
    return HIXL_SUCCESS;
  }
  /* Final: settle it under the engine lock (lock order: lock, then req_lock). */
  pthread_mutex_unlock(&e->req_lock);
  pthread_mutex_lock(&e->lock);
  pthread_mutex_lock(&e->req_lock);
  if (!ptrset_has(&e->reqs, r)) { /* another thread settled it meanwhile */
    pthread_mutex_unlock(&e->req_lock);
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID, "HixlEngineGetTransferStatus: request %p was already released",
                     (void *)r);
  }
  if (r->outstanding == 0) {
    s = r->status == HIXL_SUCCESS   ? HIXL_TRANSFER_COMPLETED
        : r->status == HIXL_TIMEOUT ? HIXL_TRANSFER_TIMEOUT
                                    : HIXL_TRANSFER_FAILED;
    if (s != HIXL_TRANSFER_COMPLETED) hixl_fail(r->status, "transfer failed: %s", r->err);
  } else if (hixl_now_ns() >= r->deadline_ns) {
    uint32_t starved = stage_cancel(r);
    r->cancelled = true;
    if (starved > 0) {
      s = HIXL_TRANSFER_FAILED;
      stage_exhausted(e, "HixlEngineGetTransferStatus", starved, "the peer");
    } else {
      s = HIXL_TRANSFER_TIMEOUT;
      hixl_fail(HIXL_TIMEOUT, "transfer: %u of %u chunks unanswered at the deadline", r->outstanding,
                r->nchunks);
      mods_req_timeout(e, r);
    }
  }
  if (s != HIXL_TRANSFER_WAITING) {
    ptrset_del(&e->reqs, r);
    r->user_holds = false;
    link_req_maybe_free(r);
  }
  pthread_mutex_unlock(&e->req_lock);
  *status = s;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineGetTransferUserData(HixlEngine *e, HixlTransferReq req, void **user_data) {
  CHECK_ARG(user_data, "HixlEngineGetTransferUserData: user_data output is NULL");
  HixlStatus st = req_enter(e, req, "HixlEngineGetTransferUserData");
  if (st != HIXL_SUCCESS) return st;
  *user_data = req->user_data;
  pthread_mutex_unlock(&e->req_lock);
  return HIXL_SUCCESS;
}

/* ---- notifications ---- */

HixlStatus HixlEngineSendNotify(HixlEngine *e, const char *remote, const HixlNotifyDesc *n,
                                int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = check_remote(remote, "HixlEngineSendNotify", &sa)) != HIXL_SUCCESS) return st;
  CHECK_ARG(n && n->name && n->msg, "HixlEngineSendNotify: notify, name or msg is NULL");
  size_t nl = strnlen(n->name, HIXL_MAX_NOTIFY_LEN + 1), ml = strnlen(n->msg, HIXL_MAX_NOTIFY_LEN + 1);
  CHECK_ARG(nl <= HIXL_MAX_NOTIFY_LEN && ml <= HIXL_MAX_NOTIFY_LEN,
            "HixlEngineSendNotify: name and msg are limited to %d bytes each", HIXL_MAX_NOTIFY_LEN);
  if ((st = check_timeout(timeout_ms, "HixlEngineSendNotify")) != HIXL_SUCCESS) return st;
  size_t cap = WIRE_HDR_LEN + 12 + nl + ml;
  uint8_t *frame = malloc(cap);
  if (!frame) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineSendNotify: out of memory");
  if ((st = engine_enter(e, "HixlEngineSendNotify")) != HIXL_SUCCESS) {
    free(frame);
    return st;
  }
  struct conn *c = link_for(e, remote, "HixlEngineSendNotify", &st);
  struct hixl_transfer_req *r = c ? req_new(e, 1, timeout_ms) : NULL;
  if (!r) {
    if (c) st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineSendNotify: out of memory");
    free(frame);
    pthread_mutex_unlock(&e->lock);
    return st;
  }
  struct chunk *ch = r->chunks;
  struct wire_wr w;
  ch->req = r;
  ch->kind = CHUNK_NOTIFY;
  ch->seq = c->next_seq++;
  wire_begin(&w, frame, cap, WIRE_NOTIFY);
  wire_put_u64(&w, ch->seq);
  wire_put_u16(&w, (uint16_t)nl);
  wire_put_u16(&w, (uint16_t)ml);
  wire_put_bytes(&w, n->name, nl);
  wire_put_bytes(&w, n->msg, ml);
  ch->tx.heap = frame;
  ch->tx.heap_len = wire_end(&w, 0);
  ch->tx.chunk = ch;
  link_enqueue(c, &ch->tx);
  link_flush(c);
  st = req_wait(e, c, r, "HixlEngineSendNotify", remote);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineGetNotifies(HixlEngine *e, HixlNotifyDesc **notifies, size_t *count) {
  CHECK_ARG(notifies && count, "HixlEngineGetNotifies: notifies or count output is NULL");
  HixlStatus st = engine_enter(e, "HixlEngineGetNotifies");
  if (st != HIXL_SUCCESS) return st;
  size_t n = e->n_notifies, bytes = n * sizeof(HixlNotifyDesc);
  for (size_t i = 0; i < n; i++)
    bytes += strlen(e->notifies[i].name) + strlen(e->notifies[i].msg) + strlen(e->notifies[i].remote) + 3;
  HixlNotifyDesc *out = NULL;
  if (n > 0 && !(out = malloc(bytes))) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineGetNotifies: out of memory");
  }
  char *s = (char *)(out + n);
  for (size_t i = 0; i < n; i++) {
    char *const parts[3] = {e->notifies[i].name, e->notifies[i].msg, e->notifies[i].remote};
    const char **dst[3] = {&out[i].name, &out[i].msg, &out[i].remote_engine};
    for (int k = 0; k < 3; k++) {
      size_t l = strlen(parts[k]) + 1;
      memcpy(s, parts[k], l);
      *dst[k] = s;
      s += l;
      free(parts[k]);
    }
  }
  e->n_notifies = 0;
  pthread_mutex_unlock(&e->lock);
  *notifies = out;
  *count = n;
  return HIXL_SUCCESS;
}

void HixlEngineFreeNotifies(HixlNotifyDesc *notifies) { free(notifies); }

/* ---- for the HixlCS* layer (engine_ext.h) ---- */

HixlStatus hixl_engine_listen(HixlEngine *e, uint16_t port, int backlog) {
  HixlStatus st = engine_enter(e, "HixlCSServerListen");
  if (st != HIXL_SUCCESS) return st;
  struct sockaddr_in sa = e->local_addr;
  if (e->listen_fd >= 0) {
    st = hixl_fail(HIXL_PARAM_INVALID, "HixlCSServerListen: %s is already listening", e->local_name);
    goto unlock;
  }
  sa.sin_port = htons(port);
  e->listen_fd = sock_listen(&sa, backlog, &st);
  if (e->listen_fd < 0) goto unlock;
  if (link_watch_listener(e) < 0) {
    st = hixl_fail(HIXL_FAILED, "HixlCSServerListen: epoll: %s", strerror(errno));
    close(e->listen_fd);
    e->listen_fd = -1;
    goto unlock;
  }
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  snprintf(e->local_name, sizeof(e->local_name), "%s:%u", ip, (unsigned)port);
  e->local_addr = sa;
unlock:
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_remote_mems(HixlEngine *e, const char *remote, int32_t timeout_ms,
                                   struct hixl_remote_mem **out, size_t *count) {
  const char *fn = "HixlCSClientGetRemoteMem";
  HixlStatus st;
  if ((st = check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = engine_enter(e, fn)) != HIXL_SUCCESS) return st;
  struct conn *c = link_for(e, remote, fn, &st);
  /* One round trip so the table holds everything the peer registered until now. */
  if (c && (st = link_sync(e, c, deadline, fn, remote)) == HIXL_SUCCESS) c = link_for(e, remote, fn, &st);
  if (!c || st != HIXL_SUCCESS) goto unlock; /* nothing is returned on failure */
  struct memtab *t = &c->peer->rtab;
  size_t bytes = t->count * sizeof(**out);
  for (size_t i = 0; i < t->count; i++) bytes += strlen(((struct remote_mem *)t->v[i])->tag) + 1;
  struct hixl_remote_mem *v = malloc(bytes ? bytes : 1);
  if (!v) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto unlock;
  }
  char *s = (char *)(v + t->count);
  for (size_t i = 0; i < t->count; i++) {
    struct remote_mem *rm = (struct remote_mem *)t->v[i];
    size_t l = strlen(rm->tag) + 1;
    v[i].addr = rm->range.addr;
    v[i].len = rm->range.len;
    v[i].tag = memcpy(s, rm->tag, l);
    s += l;
  }
  *out = v;
  *count = t->count;
unlock:
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_link_info(HixlEngine *e, const char *remote, struct hixl_link_info *info) {
  HixlStatus st = engine_enter(e, "hixl_engine_link_info");
  if (st != HIXL_SUCCESS) return st;
  struct conn *c = link_for(e, remote, "hixl_engine_link_info", &st);
  if (c) {
    memset(info, 0, sizeof(*info));
    snprintf(info->transport, sizeof(info->transport), "%s", c->xp->name);
    if (c->xp->info) st = c->xp->info(c, info);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_drop_peer(HixlEngine *e, const char *remote_name, const char *why, size_t *dropped) {
  CHECK_ARG(remote_name && *remote_name, "hixl_engine_drop_peer: remote_name is NULL or empty");
  HixlStatus st = engine_enter(e, "hixl_engine_drop_peer");
  if (st != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
  for (int k = 0; k < XPORT_MODS; k++) /* the peer lets go of mapped memory first */
    if (e->mods[k]->peer_drop) e->mods[k]->peer_drop(e, remote_name, deadline);
  size_t n = 0;
  for (struct conn *c = e->conns, *next; c; c = next) {
    next = c->next; /* a killed link leaves the list for the graveyard */
    bool his = strcmp(c->remote_name, remote_name) == 0 ||
               (c->peer && strcmp(c->peer->remote_name, remote_name) == 0);
    if (c->dead || !his) continue;
    link_conn_kill(c, HIXL_FAILED, why ? why : "dropped by this engine's user");
    n++;
  }
  pthread_mutex_unlock(&e->lock);
  if (dropped) *dropped = n;
  return HIXL_SUCCESS;
}

/* ---- services (engine_ext.h) ---- */

HixlStatus hixl_engine_set_service(HixlEngine *e, uint16_t service, hixl_call_fn fn, void *ctx) {
  CHECK_ARG(service > 0 && service < ENGINE_SERVICES, "hixl_engine_set_service: service %u is not in [1, %d)",
            (unsigned)service, ENGINE_SERVICES);
  HixlStatus st = engine_enter(e, "hixl_engine_set_service");
  if (st != HIXL_SUCCESS) return st;
  struct engine_service *s = &e->services[service];
  if (fn && s->fn)
    st = hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_set_service: service %u of %s already has a handler",
                   (unsigned)service, e->local_name);
  else
    *s = (struct engine_service){fn, fn ? ctx : NULL};
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* Start a CALL on remote's link: the frame leaves now; *out is the request, held for
 * the caller. Lock held on return when *out is set, released otherwise. */
static HixlStatus call_send(HixlEngine *e, const char *remote, uint16_t service, const void *req, size_t len,
                            void *resp, size_t cap, uint32_t *resp_len, int32_t timeout_ms, const char *fn,
                            struct conn **cout, struct hixl_transfer_req **out) {
  struct sockaddr_in sa;
  HixlStatus st;
  *out = NULL;
  if ((st = check_remote(remote, fn, &sa)) != HIXL_SUCCESS) return st;
  CHECK_ARG((req || len == 0) && len <= HIXL_CALL_MAX && resp && cap > 0 && resp_len,
            "%s: request (%zu bytes, at most %u), answer buffer or length output is invalid", fn, len,
            HIXL_CALL_MAX);
  if ((st = check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint8_t *frame = malloc(WIRE_CALL_REQ_AT + len);
  if (!frame) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  if ((st = engine_enter(e, fn)) != HIXL_SUCCESS) {
    free(frame);
    return st;
  }
  struct conn *c = link_for(e, remote, fn, &st);
  struct hixl_transfer_req *r = NULL;
  if (c && !(c->peer->caps & WIRE_CAP_CALL))
    st = hixl_fail(HIXL_UNSUPPORTED, "%s: %s speaks an older protocol without service calls", fn, remote);
  else if (c && !(r = req_new(e, 1, timeout_ms)))
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  if (!r) {
    free(frame);
    pthread_mutex_unlock(&e->lock);
    return st;
  }
  struct chunk *ch = r->chunks;
  ch->req = r;
  ch->kind = CHUNK_CALL;
  ch->seq = c->next_seq++;
  ch->laddr = resp;
  ch->len = cap > HIXL_CALL_MAX ? HIXL_CALL_MAX : (uint32_t)cap;
  ch->call_len = resp_len;
  if (len) memcpy(frame + WIRE_CALL_REQ_AT, req, len);
  ch->tx.heap = frame;
  ch->tx.heap_len = wire_put_call(frame, WIRE_CALL, ch->seq, service, (uint32_t)len);
  ch->tx.chunk = ch;
  link_enqueue(c, &ch->tx);
  link_flush(c);
  *cout = c;
  *out = r;
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_call(HixlEngine *e, const char *remote, uint16_t service, const void *req, size_t len,
                            void *resp, size_t cap, size_t *resp_len, int32_t timeout_ms) {
  const char *fn = "hixl_engine_call";
  uint32_t got = 0;
  struct conn *c;
  struct hixl_transfer_req *r;
  HixlStatus st =
      call_send(e, remote, service, req, len, resp, cap, resp_len ? &got : NULL, timeout_ms, fn, &c, &r);
  if (!r) return st;
  st = req_wait(e, c, r, fn, remote);
  pthread_mutex_unlock(&e->lock);
  if (st == HIXL_SUCCESS) *resp_len = got;
  return st;
}

HixlStatus hixl_engine_call_start(HixlEngine *e, const char *remote, uint16_t service, const void *req,
                                  size_t len, void *resp, size_t cap, uint32_t *resp_len, int32_t timeout_ms,
                                  hixl_call_t *call) {
  const char *fn = "hixl_engine_call_start";
  CHECK_ARG(call, "%s: call output is NULL", fn);
  struct conn *c;
  struct hixl_transfer_req *r;
  HixlStatus st = call_send(e, remote, service, req, len, resp, cap, resp_len, timeout_ms, fn, &c, &r);
  if (!r) return st;
  link_unpark(c); /* nobody drives the link for it: the progress thread reads the answer */
  pthread_mutex_unlock(&e->lock);
  *call = r;
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_transfer_then_call(HixlEngine *e, const char *remote, HixlTransferOp op,
                                          const HixlTransferOpDesc *descs, size_t count, uint16_t service,
                                          const void *req, size_t len, void *resp, size_t cap,
                                          uint32_t *resp_len, int32_t timeout_ms, hixl_call_t *call) {
  const char *fn = "hixl_engine_transfer_then_call";
  CHECK_ARG(call && (req || len == 0) && len <= HIXL_CALL_MAX && resp && cap > 0 && resp_len,
            "%s: call output, request (%zu bytes, at most %u), answer buffer or length output is invalid", fn,
            len, HIXL_CALL_MAX);
  /* Everything the CALL needs is taken before the transfer starts: once it has, the
   * CALL can no longer fail alone. */
  struct chunk *th = calloc(1, sizeof(*th));
  uint8_t *frame = th ? malloc(WIRE_CALL_AFTER_AT + len) : NULL; /* room for either frame */
  if (!frame) {
    free(th);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  if (len) memcpy(frame + WIRE_CALL_REQ_AT, req, len);
  th->laddr = resp;
  th->len = cap > HIXL_CALL_MAX ? HIXL_CALL_MAX : (uint32_t)cap;
  th->call_len = resp_len;
  th->tx.heap = frame;
  struct hixl_transfer_req *r;
  struct conn *c;
  HixlStatus st = transfer_submit(e, remote, op, descs, count, timeout_ms, fn, &r, &c);
  /* The start's own send may have found the link reset (the peer closed it): c is dead,
   * every chunk has ended with it, and so will the call attached below. */
  if (st == HIXL_SUCCESS && !c->dead && !(c->peer->caps & WIRE_CAP_CALL)) {
    /* Not before transfer_submit: it may bring the link up. The transfer goes on; its
     * end is waited for here, as nobody else would. */
    (void)req_wait(e, c, r, fn, remote);
    pthread_mutex_unlock(&e->lock);
    st = hixl_fail(HIXL_UNSUPPORTED, "%s: %s speaks an older protocol without service calls", fn, remote);
  } else if (st == HIXL_SUCCESS && op == HIXL_WRITE && (c->xp->flags & XPORT_IN_STREAM) &&
             r->ndirect == r->nchunks && (c->peer->caps & WIRE_CAP_CALL_AFTER)) {
    /* Every WRITE is a frame queued on the link's stream already: the call follows them
     * at once, and the target serves it once they have all landed, unless one was
     * refused. Waiting for their answers first would add a round trip. */
    r->is_async = true;
    memmove(frame + WIRE_CALL_AFTER_AT, frame + WIRE_CALL_REQ_AT, len);
    link_then_behind(r, c, th, service, (uint32_t)len);
    th = NULL;
    frame = NULL;
    xport_async(c, r); /* the progress thread reads the answers */
    pthread_mutex_unlock(&e->lock);
    *call = r;
  } else if (st == HIXL_SUCCESS) {
    r->is_async = true; /* its transport moves it; the wait only waits */
    link_then_attach(r, c, th, service, (uint32_t)len);
    th = NULL;
    frame = NULL;
    if (c->dead) {
      /* nothing left to move: the call ended failed when attached */
    } else if ((c->xp->flags & XPORT_CPU_COPY) && c->xp->drive) {
      /* A copy: this thread makes it now (handing it to the progress thread would cost
       * a wake-up and gain nothing), then sends the call its end released. */
      c->xp->drive(c, r); /* c may be gone afterwards */
      struct peer *p = find_peer(e, remote);
      if (p && p->conn && !p->conn->dead && p->conn->txq_head) link_flush(p->conn);
    } else {
      xport_async(c, r); /* nobody waits in a call yet: the progress thread ends it */
    }
    pthread_mutex_unlock(&e->lock);
    *call = r;
  }
  free(frame);
  free(th);
  return st;
}

HixlStatus hixl_engine_call_wait(HixlEngine *e, const char *remote, hixl_call_t call) {
  const char *fn = "hixl_engine_call_wait";
  CHECK_ARG(call && remote, "%s: call or remote is NULL", fn);
  pthread_mutex_lock(&e->lock); /* not engine_enter: a call started is waited for even while finalizing */
  struct peer *p = find_peer(e, remote);
  struct conn *c = p ? p->conn : NULL; /* NULL: the link died, and ended the call */
  HixlStatus st = req_wait(e, c, call, fn, remote);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_remote_has(HixlEngine *e, const char *remote, const uint64_t *addrs, size_t n,
                                  uint64_t len, const char *tag) {
  const char *fn = "hixl_engine_remote_has";
  CHECK_ARG(remote && tag && (addrs || n == 0), "%s: remote, addrs or tag is NULL", fn);
  HixlStatus st = engine_enter(e, fn);
  if (st != HIXL_SUCCESS) return st;
  struct conn *c = link_for(e, remote, fn, &st);
  for (size_t k = 0; c && k < n && st == HIXL_SUCCESS; k++) {
    const struct remote_mem *rm = (const struct remote_mem *)memtab_find(&c->peer->rtab, addrs[k], len);
    if (!rm || strcmp(rm->tag, tag) != 0)
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: %s no longer advertises [0x%llx, +%llu) as \"%s\"", fn, remote,
                     (unsigned long long)addrs[k], (unsigned long long)len, tag);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}
