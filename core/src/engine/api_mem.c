/* api_mem: registrations, HixlEngineAllocMem and FreeMem, and the peers' registrations as known here. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/api_int.h"
#include "util/cma.h"
#include "util/handles.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- memory ---- */

/* The registration behind handle (a token, util/handles.h), or NULL when this engine
 * holds none such: a handle of a registration since dropped stays unknown, even where a
 * new registration took its memory. */
static struct hixl_mem_reg *reg_of(HixlEngine *e, HixlMemHandle handle) {
  for (size_t i = 0; i < e->regs.count; i++) {
    struct hixl_mem_reg *r = (struct hixl_mem_reg *)e->regs.v[i]; /* range is its first member */
    if (r->token == (uintptr_t)handle) return r;
  }
  return NULL;
}

/* Withdraw r from the table and from peers, then release it. Lock held. */
static void reg_drop(HixlEngine *e, struct hixl_mem_reg *r) {
  memtab_remove(&e->regs, &r->range);
  link_broadcast_mem(e, WIRE_MEM_DEL, r);
  api_reg_release(e, r);
}

/* FAILED, saying then, while transfers that touch r are in flight. */
static HixlStatus reg_idle(const struct hixl_mem_reg *r, const char *fn, const char *then) {
  if (r->inflight == 0) return HIXL_SUCCESS;
  return hixl_fail(HIXL_FAILED, "%s: %u transfer chunks on [0x%llx, +%llu) are still in flight; %s", fn,
                   r->inflight, (unsigned long long)r->range.addr, (unsigned long long)r->range.len, then);
}

static void cut_peers_in(HixlEngine *e, const struct hixl_mem_reg *r);

/* reg_idle, once peers' links moving data in r are cut (the caller takes r back: they
 * are cut even when its own transfers then keep it). Lock held. */
static HixlStatus reg_take_back(HixlEngine *e, struct hixl_mem_reg *r, const char *fn, const char *then) {
  cut_peers_in(e, r);
  return reg_idle(r, fn, then);
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
  HixlStatus st = api_enter(e, "HixlEngineAllocMem"); /* fail before allocating */
  if (st != HIXL_SUCCESS) return st;
  api_out(e); /* Finalize waits: h stays until this call has made it whole */
  pthread_mutex_unlock(&e->lock);
  int fd = -1;
  void *p = NULL;
  size_t map_len = 0;
  bool huge = false;
  HixlMemHandle h = NULL;
  if ((st = alloc_map(len, &fd, &p, &map_len, &huge)) == HIXL_SUCCESS) {
    HixlMemDesc m = {(uintptr_t)p, map_len};
    if ((st = hixl_engine_register_tagged(e, &m, HIXL_MEM_HOST, tag, &h)) != HIXL_SUCCESS) {
      munmap(p, map_len);
      close(fd);
      st = hixl_fail(st, "HixlEngineAllocMem: %s", HixlGetLastErrorMessage());
    }
  }
  /* Sealed at its size: a peer that maps it can trust every page stays (no SIGBUS). */
  bool sealed = st == HIXL_SUCCESS && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
  if (st == HIXL_SUCCESS && !sealed)
    log_warn("HixlEngineAllocMem: cannot seal the memfd (%s): peers copy it, not map it", strerror(errno));
  pthread_mutex_lock(&e->lock); /* h stays: only FreeMem or Finalize drop it, and Finalize waits */
  struct hixl_mem_reg *r = st == HIXL_SUCCESS ? reg_of(e, h) : NULL;
  if (r) {
    r->memfd = fd; /* Finalize's release unmaps it, when Finalize came meanwhile */
    r->map_len = map_len;
    r->sealed = sealed;
    if (!e->initialized)
      st = hixl_fail(HIXL_PARAM_INVALID, "HixlEngineAllocMem: the engine was finalized during the call");
    for (int k = 0; k < XPORT_MODS && st == HIXL_SUCCESS; k++) e->mods[k]->mem.share(e, r);
  }
  api_back(e);
  pthread_mutex_unlock(&e->lock);
  if (st != HIXL_SUCCESS) return st;
  log_info("engine %s: allocated %zu bytes at %p (memfd, %s pages)", e->local_name, map_len, p,
           huge ? "huge" : "normal");
  *addr = p;
  *handle = h;
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineFreeMem(HixlEngine *e, HixlMemHandle handle) {
  CHECK_ARG(handle, "HixlEngineFreeMem: handle is NULL");
  HixlStatus st = api_enter(e, "HixlEngineFreeMem");
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
  } else if ((st = reg_take_back(e, r, "HixlEngineFreeMem", "nothing was released")) == HIXL_SUCCESS) {
    /* Peers that mapped it let go first (a round trip; silent ones are cut off). */
    uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
    r->freeing = true; /* the hooks may release the lock while they wait (api_out: r stays) */
    api_out(e);
    for (int k = 0; k < XPORT_MODS; k++) e->mods[k]->mem.unshare(e, r, deadline);
    api_back(e);
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
  /* strnlen: a tag may lack a NUL (the CS API's check reads no further either) */
  CHECK_ARG(!tag || strnlen(tag, WIRE_MAX_TAG + 1) <= WIRE_MAX_TAG,
            "HixlEngineRegisterMem: mem_tag is longer than %u bytes", WIRE_MAX_TAG);
  CHECK_ARG(mem->addr != 0 && mem->len > 0, "HixlEngineRegisterMem: empty range [0x%lx, +%zu)",
            (unsigned long)mem->addr, mem->len);
  CHECK_ARG(mem->addr + mem->len > mem->addr, "HixlEngineRegisterMem: range [0x%lx, +%zu) wraps around",
            (unsigned long)mem->addr, mem->len);
  CHECK_ARG(type == HIXL_MEM_HOST || type == HIXL_MEM_DEVICE, "HixlEngineRegisterMem: unknown memory type %d",
            (int)type);
  int device = -1;
  if (type == HIXL_MEM_HOST) { /* device memory called host memory: this CPU would touch it */
    char why[320];
    HixlStatus hs = devmem_host_check(mem->addr, mem->len, why, sizeof(why));
    if (hs == HIXL_SUCCESS && !cma_range_rw(mem->addr, mem->len, why, sizeof(why)))
      hs = HIXL_PARAM_INVALID; /* else the first peer op on it would kill this process */
    if (hs != HIXL_SUCCESS)
      return hixl_fail(hs, "HixlEngineRegisterMem: HIXL_MEM_HOST [0x%lx, +%zu): %s", (unsigned long)mem->addr,
                       mem->len, why);
  }
  if (type == HIXL_MEM_DEVICE) { /* the provider tells what it is, and which device */
    char why[320];
    const struct devmem_ops *dm = devmem_get(why, sizeof(why));
    if (!dm) return hixl_fail(HIXL_UNSUPPORTED, "HixlEngineRegisterMem: device memory: %s", why);
    if (devmem_notice_take(why, sizeof(why))) { /* once a process: quotes the host's setting, escaped */
      char esc[sizeof(why) * 4];
      log_escape(esc, sizeof(esc), why, strlen(why));
      log_error("%s", esc);
    }
    HixlStatus qs = dm->query(mem->addr, mem->len, &device, why, sizeof(why));
    if (qs != HIXL_SUCCESS)
      return hixl_fail(qs, "HixlEngineRegisterMem: HIXL_MEM_DEVICE [0x%lx, +%zu): %s",
                       (unsigned long)mem->addr, mem->len, why);
  }
  HixlStatus st = api_enter(e, "HixlEngineRegisterMem");
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
  r->token = handle_token();
  r->range.addr = mem->addr;
  r->range.len = mem->len;
  r->type = type;
  r->device = device;
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
  if (device >= 0 && __atomic_load_n(&e->dev_local, __ATOMIC_RELAXED) == 0)
    __atomic_store_n(&e->dev_local, device + 1, __ATOMIC_RELAXED); /* the first: this side's device */
  for (int k = 0; k < XPORT_MODS; k++) {
    if ((st = e->mods[k]->mem.reg(e, r)) == HIXL_SUCCESS) continue;
    while (k-- > 0) e->mods[k]->mem.dereg(e, r);
    memtab_remove(&e->regs, &r->range);
    free(r);
    goto unlock;
  }
  link_broadcast_mem(e, WIRE_MEM_ADD, r);
  /* Device memory is offered to same-host peers (shm: an IPC handle), after its MEM_ADD. */
  for (int k = 0; type == HIXL_MEM_DEVICE && k < XPORT_MODS; k++) e->mods[k]->mem.share(e, r);
  *handle = (HixlMemHandle)r->token;
unlock:
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineDeregisterMem(HixlEngine *e, HixlMemHandle handle) {
  CHECK_ARG(handle, "HixlEngineDeregisterMem: handle is NULL");
  HixlStatus st = api_enter(e, "HixlEngineDeregisterMem");
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
  } else if (r->freeing) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineDeregisterMem: another call is deregistering [0x%llx, +%llu)",
                   (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
  } else if (
      (st = reg_take_back(
           e, r, "HixlEngineDeregisterMem",
           "wait for the transfers on it to end (this engine's own by their timeouts, an async one once "
           "HixlEngineGetTransferStatus has answered it; a peer's data already taken in, once copied)")) ==
          HIXL_SUCCESS &&
      r->type == HIXL_MEM_DEVICE) {
    /* Peers that opened it by IPC handle close it first (a round trip; silent ones are cut off). */
    uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
    r->freeing = true; /* the hooks may release the lock while they wait (api_out: r stays) */
    api_out(e);
    for (int k = 0; k < XPORT_MODS; k++) e->mods[k]->mem.unshare(e, r, deadline);
    api_back(e);
    r->freeing = false;
    /* A transfer may have started on it while the peers answered (lock released). */
    if ((st = reg_idle(r, "HixlEngineDeregisterMem", "nothing was released")) == HIXL_SUCCESS) reg_drop(e, r);
  } else if (st == HIXL_SUCCESS) {
    reg_drop(e, r);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* ---- a peer's registrations, as this engine knows them (engine_ext.h) ---- */

HixlStatus hixl_engine_remote_mems(HixlEngine *e, const char *remote, int32_t timeout_ms,
                                   struct hixl_remote_mem **out, size_t *count) {
  const char *fn = "HixlCSClientGetRemoteMem";
  HixlStatus st;
  if ((st = api_check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = api_enter(e, fn)) != HIXL_SUCCESS) return st;
  struct conn *c = api_link_for(e, remote, fn, &st);
  /* One round trip so the table holds everything the peer registered until now. */
  if (c && (st = api_link_sync(e, c, deadline, fn, remote)) == HIXL_SUCCESS)
    c = api_link_for(e, remote, fn, &st);
  if (!c || st != HIXL_SUCCESS) goto unlock; /* nothing is returned on failure */
  struct memtab *t = link_rtab(c);           /* the control link's, which the SYNC brought up to date */
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
    v[i].device = rm->kind == WIRE_MEM_DEVICE;
    s += l;
  }
  *out = v;
  *count = t->count;
unlock:
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_remote_has(HixlEngine *e, const char *remote, const uint64_t *addrs, size_t n,
                                  uint64_t len, const char *tag) {
  const char *fn = "hixl_engine_remote_has";
  CHECK_ARG(remote && tag && (addrs || n == 0), "%s: remote, addrs or tag is NULL", fn);
  HixlStatus st = api_enter(e, fn);
  if (st != HIXL_SUCCESS) return st;
  struct conn *c = api_link_for(e, remote, fn, &st);
  for (size_t k = 0; c && k < n && st == HIXL_SUCCESS; k++) {
    const struct remote_mem *rm = (const struct remote_mem *)memtab_find(link_rtab(c), addrs[k], len);
    if (!rm || strcmp(rm->tag, tag) != 0)
      st = hixl_fail(HIXL_PARAM_INVALID, "%s: %s no longer advertises [0x%llx, +%llu) as \"%s\"", fn, remote,
                     (unsigned long long)addrs[k], (unsigned long long)len, tag);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* ---- scoped memory (engine_ext.h) ---- */

/* The lock, unless this thread holds it already as e's service handler. */
static HixlStatus grant_enter(HixlEngine *e, const char *fn, bool *took) {
  *took = !(e && link_serving_engine == e);
  return *took ? api_enter(e, fn) : HIXL_SUCCESS;
}

HixlStatus hixl_engine_set_scoped(HixlEngine *e, bool on) {
  bool took;
  HixlStatus st = grant_enter(e, "hixl_engine_set_scoped", &took);
  if (st != HIXL_SUCCESS) return st;
  /* With an RDMA device a registration's keys depend on it (scoped: none that reaches
   * anything from the wire, windows per grant instead): it is chosen before any. */
  if (on != e->scoped && engine_xe(e, XPORT_RDMA) && engine_reg_count(e) > 0) {
    st = hixl_fail(HIXL_PARAM_INVALID,
                   "hixl_engine_set_scoped: engine %s has an RDMA device and %zu registrations already: "
                   "scope it before registering memory (a registration made %s carries %s)",
                   e->local_name, engine_reg_count(e), e->scoped ? "scoped" : "unscoped",
                   e->scoped ? "no remote key" : "a remote key its peers hold");
    if (took) pthread_mutex_unlock(&e->lock);
    return st;
  }
  e->scoped = on;
  if (took) pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_set_devmap_scoped(HixlEngine *e, bool on) {
  bool took;
  HixlStatus st = grant_enter(e, "hixl_engine_set_devmap_scoped", &took);
  if (st != HIXL_SUCCESS) return st;
  /* Handovers already made follow the choice they were made under: chosen before any. */
  if (on == e->devmap_unscoped && engine_reg_count(e) > 0) {
    st =
        hixl_fail(HIXL_PARAM_INVALID,
                  "hixl_engine_set_devmap_scoped: engine %s has %zu registrations already: choose how device "
                  "memory goes to same-host peers before registering memory",
                  e->local_name, engine_reg_count(e));
    if (took) pthread_mutex_unlock(&e->lock);
    return st;
  }
  e->devmap_unscoped = !on;
  if (took) pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_devmem_stats(HixlEngine *e, struct hixl_devmem_stats *out) {
  if (!out) return hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_devmem_stats: out is NULL");
  HixlStatus st = api_enter(e, "hixl_engine_devmem_stats");
  if (st != HIXL_SUCCESS) return st;
  *out = e->dstats;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

/* Whether a live link of peer still has recalls of a revoke unanswered. Lock held. */
static bool recalls_pending(HixlEngine *e, const char *peer) {
  for (struct conn *c = e->conns; c; c = c->next)
    if (!c->dead && c->recalls > 0 && strcmp(c->remote_name, peer) == 0) return true;
  return false;
}

/* A revoke's end: what the modules asked peer to let go of (a same-host peer's device
 * mapping) is let go of, its copies running ended, before the revoke returns; up to
 * HIXL_DEFAULT_TIMEOUT_MS, lock released, then the links that did not answer are cut
 * (as FreeMem does). Lock held on entry and return. */
static void revoke_wait(HixlEngine *e, const char *peer) {
  uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
  if (!recalls_pending(e, peer)) return;
  e->revoke_waiters++;
  while (e->initialized && recalls_pending(e, peer) && hixl_now_ns() < deadline) engine_wait(e, deadline);
  uint32_t walk = ++e->walks;
  for (struct conn *c; e->initialized && (c = link_next(e, walk));) {
    if (c->dead || c->recalls == 0 || strcmp(c->remote_name, peer) != 0) continue;
    char why[160];
    snprintf(why, sizeof(why), "it did not let go of memory a revoke took back within %u ms: cut off",
             (unsigned)HIXL_DEFAULT_TIMEOUT_MS);
    log_warn("link from %s: %s", c->remote_name, why);
    link_conn_kill(c, HIXL_TIMEOUT, why);
  }
  if (--e->revoke_waiters == 0) engine_signal(e);
}

/* What a revoke took back from a peer: its ranges, and what the peer still holds after
 * it (another grant may hold the same bytes: two requests sharing blocks). */
struct revoked {
  const uint64_t (*r)[2];
  size_t n;
  const struct grant_set *left;
};

/* Whether some byte of [a, a + len) is in one of the ranges and no longer granted. */
static bool lost(const struct revoked *v, uint64_t a, uint64_t len) {
  for (size_t i = 0; i < v->n && len > 0; i++) {
    uint64_t end = v->r[i][0] + v->r[i][1];
    uint64_t lo = a > v->r[i][0] ? a : v->r[i][0], hi = a + len < end ? a + len : end;
    if (lo < hi && !grant_covers(v->left, lo, hi - lo)) return true;
  }
  return false;
}

/* Whether target link c still moves data in memory v took back: a WRITE's payload
 * landing (in place, or its device bounce copied in at its end), an answer queued that
 * a send reads from memory (READ_RESP, STAGE_READ's gather). Lock held. */
static bool link_in_revoked(const struct conn *c, const struct revoked *v) {
  if (c->pay_left > 0 && !c->pay_discard) {
    if (c->pay_dst && lost(v, (uintptr_t)c->pay_dst, c->pay_cur)) return true;
    for (uint32_t i = 0; i < c->pay_nspan; i++)
      if (lost(v, c->pay_span_remote ? c->pay_span[i].raddr : c->pay_span[i].laddr, c->pay_span[i].len))
        return true;
    if (c->pay.bounce && lost(v, c->pay.dst, c->pay.len)) return true;
  }
  for (const struct txitem *it = c->txq_head; it; it = it->next) {
    if (it->payload && lost(v, (uintptr_t)it->payload, it->payload_len)) return true;
    for (uint32_t i = 0; i < it->ngather; i++)
      if (lost(v, it->gather[i].laddr, it->gather[i].len)) return true;
  }
  return false;
}

/* A revoke's ranges taken back: peer's links that still move data in bytes no grant of
 * its holds any more are cut, so none lands there or leaves once the revoke returns (over
 * tcp the data of an op checked at its header streams on; the memory may be reused at
 * once). Lock held. */
static void revoke_cut(HixlEngine *e, const char *peer, const uint64_t (*r)[2], size_t n) {
  struct revoked v = {r, n, grant_set_of(e, peer, false)};
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));)
    if (!c->dead && c->role == CONN_TARGET && strcmp(c->remote_name, peer) == 0 && link_in_revoked(c, &v))
      link_conn_kill(c, HIXL_FAILED,
                     "an op of its was still moving data in memory a revoke took back: cut off");
}

/* DeregisterMem or FreeMem takes r back: peers' links that still move data in it (a
 * WRITE's payload landing, READ answers queued) are cut, as an RDMA peer's ops fail once
 * the MR is gone; a peer that stalls (does not read its answers, or sends half a
 * payload) kept them so, and the memory held, for as long as it liked. Lock held. */
static void cut_peers_in(HixlEngine *e, const struct hixl_mem_reg *r) {
  const uint64_t range[1][2] = {{r->range.addr, r->range.len}};
  struct revoked v = {range, 1, NULL}; /* none of it left to anyone */
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));)
    if (!c->dead && c->role == CONN_TARGET && link_in_revoked(c, &v))
      link_conn_kill(c, HIXL_FAILED,
                     "an op of its was still moving data in memory its owner deregistered: cut off");
}

static HixlStatus grant_call(HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                             bool add) {
  const char *fn = add ? "hixl_engine_grant" : "hixl_engine_revoke";
  CHECK_ARG(peer && *peer && strlen(peer) <= WIRE_MAX_NAME, "%s: peer is NULL, empty or longer than %u bytes",
            fn, WIRE_MAX_NAME);
  CHECK_ARG(n == 0 || ranges, "%s: ranges is NULL but n is %zu", fn, n);
  for (size_t i = 0; i < n; i++)
    CHECK_ARG(ranges[i][1] > 0 && ranges[i][0] <= UINT64_MAX - ranges[i][1],
              "%s: range %zu [0x%llx, +%llu) is empty or wraps", fn, i, (unsigned long long)ranges[i][0],
              (unsigned long long)ranges[i][1]);
  bool took;
  HixlStatus st = grant_enter(e, fn, &took);
  if (st != HIXL_SUCCESS) return st;
  st = add ? grant_add(e, peer, ranges, n) : grant_remove(e, peer, ranges, n);
  if (!add && st == HIXL_SUCCESS) revoke_cut(e, peer, ranges, n);
  /* A service handler runs on the progress thread, which reads the answers: it cannot
   * wait for them (the recalls are sent, and the peer starts no copy there once it has
   * read them; a copy already running may still end after). */
  if (!add && took) revoke_wait(e, peer);
  if (took) pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_grant(HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  return grant_call(e, peer, ranges, n, true);
}

HixlStatus hixl_engine_revoke(HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  return grant_call(e, peer, ranges, n, false);
}

HixlStatus hixl_engine_grant_peers(HixlEngine *e, size_t *peers) {
  bool took;
  CHECK_ARG(peers, "hixl_engine_grant_peers: peers is NULL");
  HixlStatus st = grant_enter(e, "hixl_engine_grant_peers", &took);
  if (st != HIXL_SUCCESS) return st;
  *peers = grant_peers(e);
  if (took) pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_grant_stats(HixlEngine *e, const char *peer, size_t *granted, uint64_t *refused) {
  bool took;
  CHECK_ARG(peer, "hixl_engine_grant_stats: peer is NULL");
  HixlStatus st = grant_enter(e, "hixl_engine_grant_stats", &took);
  if (st != HIXL_SUCCESS) return st;
  if (granted) *granted = grant_count(e, peer);
  if (refused) *refused = e->grant_refusals;
  if (took) pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}
