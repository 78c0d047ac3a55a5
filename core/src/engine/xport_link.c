/* xport_link: the functions through which a transport sees the engine and its links
 * (xport_link.h); the structs stay the link layer's. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "devmem/devmem.h"
#include "engine/engine_int.h"

const struct hixl_options *engine_opts(const struct HixlEngine *e) { return &e->opts; }
const char *engine_name(const struct HixlEngine *e) { return e->local_name; }
const struct sockaddr_in *engine_addr(const struct HixlEngine *e) { return &e->local_addr; }
void *engine_xe(const struct HixlEngine *e, enum xport_id id) { return e->xe[id]; }
void engine_set_xe(struct HixlEngine *e, enum xport_id id, void *state) { e->xe[id] = state; }

struct hixl_mem_reg *engine_reg_find(const struct HixlEngine *e, uint64_t addr, uint64_t len) {
  return (struct hixl_mem_reg *)memtab_find(&e->regs, addr, len);
}
size_t engine_reg_count(const struct HixlEngine *e) { return e->regs.count; }
struct hixl_mem_reg *engine_reg_at(const struct HixlEngine *e, size_t i) {
  return (struct hixl_mem_reg *)e->regs.v[i];
}

int engine_cond_wait(struct HixlEngine *e, uint64_t deadline) {
  __atomic_add_fetch(&e->cond_waiters, 1, __ATOMIC_RELAXED);
  int rc;
  if (deadline == 0) {
    rc = pthread_cond_wait(&e->cond, &e->lock);
  } else { /* e->cond runs on CLOCK_MONOTONIC (HixlEngineCreate), as the deadlines do */
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                          .tv_nsec = (long)(deadline % 1000000000u)};
    rc = pthread_cond_timedwait(&e->cond, &e->lock, &ts);
  }
  __atomic_sub_fetch(&e->cond_waiters, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&e->lock_gen, 1, __ATOMIC_RELAXED);
  return rc;
}
void engine_wait(struct HixlEngine *e, uint64_t deadline) { (void)engine_cond_wait(e, deadline); }
void engine_signal(struct HixlEngine *e) {
  __atomic_store_n(&e->signalled, true, __ATOMIC_RELAXED); /* some signal without the lock */
  pthread_cond_broadcast(&e->cond);
}
void engine_lock_caller(struct HixlEngine *e) {
  __atomic_add_fetch(&e->lock_wanted, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&e->lock);
  __atomic_sub_fetch(&e->lock_wanted, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&e->lock_gen, 1, __ATOMIC_RELAXED);
}
void engine_unlock(struct HixlEngine *e) { pthread_mutex_unlock(&e->lock); }
void engine_lock(struct HixlEngine *e) { pthread_mutex_lock(&e->lock); }

struct HixlEngine *link_engine(const struct conn *c) {
  return c->eng;
}
const char *link_remote(const struct conn *c) { return c->remote_name; }
bool link_is_target(const struct conn *c) { return c->role != CONN_INITIATOR; }
bool link_dead(const struct conn *c) { return c->dead; }
bool link_unsent(const struct conn *c) { return c->txq_head != NULL; }
void *link_xs(const struct conn *c, enum xport_id id) { return c->xs[id]; }
void link_set_xs(struct conn *c, enum xport_id id, void *state) { c->xs[id] = state; }
void link_use(struct conn *c, const struct xport_ops *xp) { c->xp = xp; }
const struct xport_ops *link_transport(const struct conn *c) { return c->xp; }
uint32_t link_peer_caps(const struct conn *c) { return c->peer ? c->peer->caps : 0; }
uint32_t link_hello_caps(const struct conn *c) { return c->peer ? 0 : c->hello_caps; }
bool engine_scoped(const struct HixlEngine *e) { return e->scoped; }
bool engine_devmap_scoped(const struct HixlEngine *e) { return e->scoped && !e->devmap_unscoped; }
void link_recall_begin(struct conn *c) { c->recalls++; }
void link_recall_end(struct conn *c) {
  if (c->recalls > 0 && --c->recalls == 0) engine_signal(c->eng);
}
struct hixl_window_stats *engine_win_stats(struct HixlEngine *e) {
  return &e->wstats;
}
struct hixl_devmem_stats *engine_dev_stats(struct HixlEngine *e) {
  return &e->dstats;
}
int engine_local_device(const struct HixlEngine *e) {
  int d = __atomic_load_n(&e->dev_local, __ATOMIC_RELAXED);
  return d > 0 ? d - 1 : 0;
}
uint32_t peer_caps(const struct peer *p) { return p->caps; }
uint32_t link_local_ip(const struct conn *c) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof(sa);
  if (getsockname(c->fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET) return 0;
  return sa.sin_addr.s_addr;
}
const uint8_t *peer_session(const struct peer *p) { return p->authed ? p->session : NULL; }
const uint8_t *link_session(const struct conn *c) {
  if (c->peer) return peer_session(c->peer);
  return c->authed ? c->session : NULL;
}
void link_read_always(struct conn *c) {
  c->always_read = true;
  link_unpark(c); /* a link made parked is read from now on */
}

const struct remote_mem *peer_remote_find(const struct peer *p, uint64_t addr, uint64_t len) {
  if (!p) return NULL;
  return (const struct remote_mem *)memtab_find(p->conn ? link_rtab(p->conn) : &p->rtab, addr, len);
}
const struct remote_mem *link_remote_find(const struct conn *c, uint64_t addr, uint64_t len) {
  return c->peer ? (const struct remote_mem *)memtab_find(link_rtab(c), addr, len) : NULL;
}
bool link_grant_covers(struct conn *c, uint64_t addr, uint64_t len) { return link_grant_ok(c, addr, len); }

void link_peer_forget(struct conn *c, uint64_t addr, uint64_t len) {
  if (c->peer) link_peer_del_mem(c->peer, addr, len, c->rail);
}

struct link_pay *link_pay_of(struct conn *c, const struct xport_ops *module) {
  if (module) c->pay_module = module;
  return &c->pay;
}

void link_write_refused(struct conn *c, uint64_t seq) {
  if (seq > c->write_refused) c->write_refused = seq;
}

struct chunk *link_req_direct(struct hixl_transfer_req *r, uint32_t *n) {
  *n = r->ndirect;
  return r->chunks;
}
bool link_req_staged(const struct hixl_transfer_req *r) { return r->ndirect < r->nchunks; }
uint32_t link_req_first_staged(const struct hixl_transfer_req *r) { return r->ndirect + r->nsock; }
uint64_t link_req_deadline(const struct hixl_transfer_req *r) { return r->deadline_ns; }
bool link_req_cancelled(const struct hixl_transfer_req *r) { return r->cancelled; }

/* ---- device memory ---- */

HixlStatus xport_devmem_out(const struct hixl_mem_reg *r, uint64_t src, void *dst, size_t n, char *why,
                            size_t cap) {
  const struct devmem_ops *dm = devmem_get(why, cap);
  return dm ? dm->to_host(dst, src, n, r->device, why, cap) : HIXL_UNSUPPORTED;
}

HixlStatus xport_devmem_in(const struct hixl_mem_reg *r, uint64_t dst, const void *src, size_t n, char *why,
                           size_t cap) {
  const struct devmem_ops *dm = devmem_get(why, cap);
  return dm ? dm->to_device(dst, src, n, r->device, why, cap) : HIXL_UNSUPPORTED;
}
