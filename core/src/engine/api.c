/* api: the public HixlEngine* API. Validates every argument, then works on the
 * engine state under its lock. The wire and socket work lives in the link layer
 * (link.c and its files); the data paths in the modules behind the transport
 * interface (xport.h), which this file wires to the engine (engine_mods) and
 * reaches only through their tables.
 *
 * This file: the engine's life (create, initialize, finalize, destroy, listen), the
 * module table, and the checks and peer list that api_mem.c, api_link.c, api_xfer.c
 * and api_call.c share with it (api_int.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "engine/stage.h"
#include "transport/rdma/xport_rdma.h"
#include "transport/shm/xport_shm.h"
#include "transport/tcp/xport_tcp.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

HixlStatus api_not_serving(HixlEngine *e, const char *fn) {
  if (link_serving_engine != e) return HIXL_SUCCESS;
  return hixl_fail(HIXL_PARAM_INVALID,
                   "%s: called from a service handler of engine %s, which runs holding the engine's lock: a "
                   "handler must not call its engine",
                   fn, e->local_name);
}

/* Lock e and check it is initialized; on failure the lock is not held. */
HixlStatus api_enter(HixlEngine *e, const char *fn) {
  if (!e) return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is NULL", fn);
  HixlStatus st = api_not_serving(e, fn); /* its lock is this thread's already: waiting would hang */
  if (st != HIXL_SUCCESS) return st;
  engine_lock_caller(e);
  if (!e->initialized) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is not initialized; call HixlEngineInitialize first",
                     fn);
  }
  return HIXL_SUCCESS;
}

void api_out(HixlEngine *e) { e->outside++; }

void api_back(HixlEngine *e) {
  if (--e->outside == 0) engine_signal(e);
}

/* The modules, by id: the transports in the order Connect tries them, then staging. */
static const struct xport_ops *const engine_mods[XPORT_MODS] = {[XPORT_SHM] = &xport_shm,
                                                                [XPORT_RDMA] = &xport_rdma,
                                                                [XPORT_TCP] = &xport_tcp,
                                                                [XPORT_STAGE] = &xport_stage};

/* Close modules [0, n) in reverse order (staging's MR before the RDMA device). */
static void mods_close(HixlEngine *e, int n) {
  while (n-- > 0) e->mods[n]->iface.close(e);
}

HixlStatus api_check_timeout(int32_t timeout_ms, const char *fn) {
  CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %d is negative (0 means the default %d ms)", fn, timeout_ms,
            HIXL_DEFAULT_TIMEOUT_MS);
  return HIXL_SUCCESS;
}

/* remote_engine must be "ip:port"; returns its address. */
HixlStatus api_check_remote(const char *remote, const char *fn, struct sockaddr_in *sa) {
  bool has_port;
  HixlStatus st;
  CHECK_ARG(remote && strnlen(remote, ENGINE_NAME_MAX) < ENGINE_NAME_MAX,
            "%s: remote_engine is NULL or too long", fn);
  if ((st = sock_parse_endpoint(remote, "remote_engine", sa, &has_port)) != HIXL_SUCCESS)
    return hixl_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  CHECK_ARG(has_port, "%s: remote_engine \"%s\" needs a port (\"ip:port\")", fn, remote);
  return HIXL_SUCCESS;
}

struct peer *api_find_peer(HixlEngine *e, const char *name) {
  for (struct peer *p = e->peers; p; p = p->next)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

void api_peer_release(struct peer *p) {
  link_peer_rtab_free(&p->rtab);
  for (int k = 1; k < HIXL_RAILS_MAX; k++) link_peer_rtab_free(&p->rails[k].rtab);
  auth_wipe(p->session, sizeof(p->session));
  auth_frames_free(&p->proof);
  free(p);
}

void api_peer_free(HixlEngine *e, struct peer *p) {
  p->closing = true; /* its rails end with it, none failed over */
  for (uint32_t k = 0; k < p->n_rails; k++)
    if (p->rails[k].conn) link_conn_kill(p->rails[k].conn, HIXL_FAILED, "disconnected by the local engine");
  for (struct peer **pp = &e->peers; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  api_peer_release(p);
}

HixlStatus HixlEngineCreate(HixlEngine **engine) {
  pthread_condattr_t ca;
  CHECK_ARG(engine, "HixlEngineCreate: engine output is NULL");
  hixl_log_init();
  HixlEngine *e = calloc(1, sizeof(*e));
  if (!e) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineCreate: out of memory");
  pthread_mutex_init(&e->lock, NULL);
  pthread_mutex_init(&e->req_lock, NULL);
  pthread_mutex_init(&e->nonce_lock, NULL);
  pthread_mutex_init(&e->devq.stream_lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cond, &ca);
  pthread_cond_init(&e->rail_cond, &ca);
  pthread_condattr_destroy(&ca);
  e->listen_fd = e->epfd = e->evfd = e->devq.evfd = e->devq.copier_fd = -1;
  for (int k = 0; k < HIXL_RAILS_MAX; k++) e->rail_fds[k] = -1;
  auth_init(&e->auth);
  *engine = e;
  return HIXL_SUCCESS;
}

static void rails_close(HixlEngine *e) {
  for (int k = 0; k < HIXL_RAILS_MAX; k++) {
    if (e->rail_fds[k] >= 0) close(e->rail_fds[k]);
    e->rail_fds[k] = -1;
  }
  e->n_rail_addrs = 0;
}

/* Rails as a target: the listen address, then every other rail address (the list, or
 * with "auto" each IPv4 address of an interface that is up, loopback only when the
 * engine's own address is), each listened on at the engine's port. */
static HixlStatus rails_listen(HixlEngine *e) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof(sa);
  uint32_t cand[64];
  size_t nc = 0;
  if (getsockname(e->listen_fd, (struct sockaddr *)&sa, &sl) < 0)
    return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: Rails: getsockname: %s", strerror(errno));
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY))
    return hixl_fail(
        HIXL_PARAM_INVALID,
        "HixlEngineInitialize: Rails needs the engine's own address, not 0.0.0.0 (%s): each rail "
        "is one address",
        e->local_name);
  if (e->opts.rails_auto) {
    int got = sock_if_addrs(cand, 64, (ntohl(sa.sin_addr.s_addr) >> 24) == 127);
    if (got < 0)
      return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: Rails auto: getifaddrs: %s", strerror(errno));
    nc = (size_t)got;
  } else {
    for (uint32_t k = 0; k < e->opts.rails_n; k++) cand[nc++] = e->opts.rail_addr[k];
  }
  e->rail_addrs[0] = sa.sin_addr.s_addr;
  e->rail_ports[0] = ntohs(sa.sin_port);
  e->n_rail_addrs = 1;
  for (size_t k = 0; k < nc && e->n_rail_addrs < HIXL_RAILS_MAX; k++) {
    if (cand[k] == sa.sin_addr.s_addr) continue;
    struct sockaddr_in ra = sa;
    HixlStatus st;
    ra.sin_addr.s_addr = cand[k];
    int fd = sock_listen(&ra, 0, &st);
    if (fd < 0) {
      hixl_fail(st, "HixlEngineInitialize: Rails: %s", HixlGetLastErrorMessage());
      rails_close(e);
      return st;
    }
    e->rail_fds[e->n_rail_addrs - 1] = fd;
    e->rail_addrs[e->n_rail_addrs] = cand[k];
    e->rail_ports[e->n_rail_addrs++] = ntohs(sa.sin_port);
  }
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineInitialize(HixlEngine *e, const char *local_engine, const HixlOption *options,
                                size_t num_options) {
  struct hixl_options opts;
  struct sockaddr_in sa;
  bool has_port;
  HixlStatus st;
  CHECK_ARG(e, "HixlEngineInitialize: engine is NULL");
  /* From a handler of e: e's lock is this thread's already (waiting would hang). */
  if ((st = api_not_serving(e, "HixlEngineInitialize")) != HIXL_SUCCESS) return st;
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
  if (opts.stage_unregistered && !opts.auth_key_file[0]) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID,
                     "HixlEngineInitialize: StagingUnregistered on lets a peer read and write any address of "
                     "this process: it needs AuthKeyFile (or HIXL_AUTH_KEY_FILE), so that only peers holding "
                     "the key can connect");
  }
  if ((opts.auth_payload_tag || opts.alias_n) && !opts.auth_key_file[0]) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID,
                     "HixlEngineInitialize: %s acts on authenticated links only: it needs AuthKeyFile (or "
                     "HIXL_AUTH_KEY_FILE); without a key it would protect nothing",
                     opts.auth_payload_tag ? "AuthPayloadTag on" : "AuthAliases");
  }
  if ((st = auth_open(&e->auth, opts.auth_key_file)) != HIXL_SUCCESS) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(st, "HixlEngineInitialize: %s", HixlGetLastErrorMessage());
  }
  e->opts = opts;
  size_t sockbuf_cap = opts.sockbuf_kib > 0 ? sock_buf_cap() : 0;
  if (opts.sockbuf_kib > 0 && sockbuf_cap < (size_t)opts.sockbuf_kib << 10) {
    if (opts.sockbuf_auto) /* capped, a fixed buffer would be smaller than what autotuning reaches */
      e->opts.sockbuf_kib = 0;
    else
      log_warn("SocketBufferKiB %u: the kernel caps a socket's buffers at %zu KiB (net.core.rmem_max, "
               "wmem_max): each link of %s gets that, fixed",
               opts.sockbuf_kib, sockbuf_cap >> 10, local_engine);
  }
  e->local_addr = sa;
  e->stopping = false;
  snprintf(e->local_name, sizeof(e->local_name), "%s", local_engine);
  int opened = 0;
  for (int i = 0; i < XPORT_MODS; i++)
    if ((st = xport_check(engine_mods[i])) != HIXL_SUCCESS) goto close_mods;
  for (; opened < XPORT_MODS; opened++) {
    e->mods[opened] = engine_mods[opened];
    if ((st = e->mods[opened]->iface.open(e)) != HIXL_SUCCESS) goto close_mods;
  }
  e->listen_fd = has_port ? sock_listen(&sa, 0, &st) : -1;
  if (has_port && e->listen_fd < 0) goto close_mods;
  if (has_port && opts.rails_on && (st = rails_listen(e)) != HIXL_SUCCESS) goto close_listen;
  if (link_start(e, &st) < 0) {
    st =
        hixl_fail(HIXL_FAILED, "HixlEngineInitialize: cannot start the progress thread: %s", strerror(errno));
    goto close_listen;
  }
  e->initialized = true;
  log_info("engine %s up (%s, transport %s, %s)", e->local_name, has_port ? "listening" : "client only",
           hixl_transport_name(opts.transport), auth_enabled(&e->auth) ? "authenticated links" : "no key");
  /* Said once per process, at the error level that a default log shows. */
  static atomic_bool told_open;
  if (has_port && !auth_enabled(&e->auth) && !atomic_exchange(&told_open, true))
    log_error("engine %s accepts links from anyone who reaches its port: they read and write its registered "
              "memory. Set AuthKeyFile (docs/security.md); this is said once per process",
              e->local_name);
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
close_listen:
  if (e->listen_fd >= 0) close(e->listen_fd);
  e->listen_fd = -1;
  rails_close(e);
close_mods:
  mods_close(e, opened);
  auth_close(&e->auth);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineFinalize(HixlEngine *e) {
  HixlStatus st = api_enter(e, "HixlEngineFinalize");
  if (st != HIXL_SUCCESS) return st;
  e->initialized = false; /* new calls are refused from here on */
  engine_signal(e);       /* a revoke waiting for its recalls stops waiting */
  pthread_mutex_unlock(&e->lock);
  if (e->rail_stop) e->rail_stop(e); /* the rail prober, if a railed Connect started it */
  link_stop(e);
  pthread_mutex_lock(&e->lock);
  /* Calls out of the lock end first: a Connect's handshake fails on its socket cut here
   * (one still dialling sees the engine finalized once dialled), the others are short. */
  while (e->revoke_waiters > 0 || e->outside > 0) {
    for (struct api_dial *d = e->dials; d; d = d->next)
      if (d->fd >= 0) shutdown(d->fd, SHUT_RDWR);
    engine_wait(e, 0);
  }
  /* Work still running without the lock (an shm copy) ends before what it holds goes. */
  for (int i = 0; i < XPORT_MODS; i++) e->mods[i]->iface.quiesce(e);
  link_free_graveyard(e);
  while (e->peers) api_peer_free(e, e->peers);
  for (size_t i = 0; i < e->regs.count; i++) {
    api_reg_release(e, (struct hixl_mem_reg *)e->regs.v[i]);
  }
  memtab_free(&e->regs);
  grant_free_all(e);
  __atomic_store_n(&e->dev_local, 0, __ATOMIC_RELAXED);
  e->scoped = false;
  e->grant_refusals = 0;
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
  rails_close(e);
  auth_close(&e->auth);
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineDestroy(HixlEngine *e) {
  CHECK_ARG(e, "HixlEngineDestroy: engine is NULL");
  HixlStatus st = api_not_serving(e, "HixlEngineDestroy"); /* its Finalize would be refused, not waited for */
  if (st != HIXL_SUCCESS) return st;
  if (e->initialized) HixlEngineFinalize(e);
  /* Async requests never queried: every chunk ended when the links closed. */
  for (size_t i = 0; i < e->reqs.cap; i++) {
    struct hixl_transfer_req *r = e->reqs.slots[i].obj;
    if (r) {
      free(r->staged);
      free(r);
    }
  }
  handles_free(&e->reqs);
  link_free_graveyard(e); /* a link a caller was still driving at Finalize */
  auth_destroy(&e->auth);
  pthread_cond_destroy(&e->cond);
  pthread_cond_destroy(&e->rail_cond);
  pthread_mutex_destroy(&e->nonce_lock);
  pthread_mutex_destroy(&e->devq.stream_lock);
  pthread_mutex_destroy(&e->req_lock);
  pthread_mutex_destroy(&e->lock);
  free(e);
  return HIXL_SUCCESS;
}

/* ---- memory: a registration let go (Finalize here, the rest in api_mem.c) ---- */

/* Unmap and close what HixlEngineAllocMem made (nothing for the caller's memory). */
static void alloc_release(struct hixl_mem_reg *r) {
  if (r->memfd < 0) return;
  munmap((void *)(uintptr_t)r->range.addr, r->map_len);
  close(r->memfd);
  r->memfd = -1;
}

/* Let go of r: every transport's hold on it, the memory if the engine allocated it. */
void api_reg_release(HixlEngine *e, struct hixl_mem_reg *r) {
  for (int k = 0; k < XPORT_MODS; k++) e->mods[k]->mem.dereg(e, r);
  alloc_release(r);
  free(r);
}

/* ---- for the HixlCS* layer (engine_ext.h) ---- */

HixlStatus hixl_engine_listen(HixlEngine *e, uint16_t port, int backlog) {
  HixlStatus st = api_enter(e, "HixlCSServerListen");
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
