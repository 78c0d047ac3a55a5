/* link: the control plane. The progress thread and the TCP connections it drives:
 * framing, the HELLO handshake, memory tables, SYNC, NOTIFY and CALL, and the
 * streaming of payloads. Every other frame belongs to a module behind the transport
 * interface (xport.h), which the link reaches only through its table.
 *
 * Each connection has one role. A target connection (accepted) hands its frames to
 * the module that owns their type (e->frame_owner). An initiator connection (from
 * Connect) sends request frames and matches responses, which come back in request
 * order, to a FIFO of pending chunks. Payloads move between the socket and
 * registered memory with no copy when they are large; small ones are copied out of
 * the receive buffer they arrived in.
 *
 * The layer's files call only downward (tests/check_layers.sh): this one (requests
 * and chunk ends, connections, their kill and the graveyard, what epoll watches,
 * peers' memory tables), then link_frames.c (the send queue, frame parsing, each
 * role's handling, payloads), then link_progress.c (the progress thread, a sync
 * caller driving a link). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- requests and chunks ---- */

void link_req_maybe_free(struct hixl_transfer_req *r) {
  if (r->outstanding == 0 && !r->user_holds) {
    free(r->then);
    free(r->staged); /* r->chunks is inside r's allocation (api_req_new) */
    free(r);
  }
}

struct conn *link_then_conn(struct hixl_transfer_req *r) {
  struct conn *c = NULL;
  for (struct conn *k = r->eng->conns; k && !c; k = k->next) c = k->id == r->then_link ? k : NULL;
  return c;
}

/* r's transfer, which its CALL waited for, has ended: send the CALL on the link the
 * transfer went on when every chunk landed; else end it with their failure. Lock
 * held. */
static void then_release(struct hixl_transfer_req *r) {
  struct chunk *th = r->then;
  char why[384];
  /* Only a link still in the engine's list: a caller's copy (shm) runs unlocked, and a
   * link killed meanwhile may have been freed since (its address perhaps a new link's,
   * to another peer: found by id). */
  struct conn *c = link_then_conn(r);
  HixlStatus st = r->status;
  if (st != HIXL_SUCCESS) {
    snprintf(why, sizeof(why), "the transfer before it failed: %s", r->err);
  } else if (r->cancelled) {
    st = HIXL_TIMEOUT;
    snprintf(why, sizeof(why), "the transfer before it timed out");
  } else if (!c || c->dead) {
    st = HIXL_FAILED;
    snprintf(why, sizeof(why), "its link was lost before it was sent");
  }
  if (st != HIXL_SUCCESS) {
    r->then_state = THEN_ENDED;
    free(th->tx.heap);
    th->tx.heap = NULL;
    link_chunk_end(th, st, why);
    return;
  }
  r->then_state = THEN_SENT;
  th->seq = c->next_seq++;
  th->tx.heap_len = wire_put_call(th->tx.heap, WIRE_CALL, th->seq, r->then_service, r->then_len);
  link_enqueue(c, &th->tx);
  if (r->then_caller) return; /* the caller sends it once its copy is done: link_then_flush */
  /* The progress thread sends it (EPOLLOUT) and reads the answer: this may run inside
   * a transport's completion loop, which a send failing (the link killed) must not
   * disturb. */
  link_unpark(c);
  link_set_want_out(c, true);
}

/* th becomes r's CALL chunk, one more outstanding; returns how many are now. */
uint32_t link_then_init(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                        uint32_t len, int state) {
  th->req = r;
  th->kind = CHUNK_CALL;
  th->tx.chunk = th;
  r->then = th;
  r->then_link = c->id;
  r->then_service = service;
  r->then_len = len;
  r->then_state = state;
  return __atomic_add_fetch(&r->outstanding, 1, __ATOMIC_ACQ_REL);
}

void link_then_attach(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len) {
  if (link_then_init(r, c, th, service, len, THEN_HELD) == 1) then_release(r);
}

void link_then_cancel(struct hixl_transfer_req *r, HixlStatus st, const char *why) {
  if (r->then_state != THEN_HELD) return;
  r->then_state = THEN_ENDED;
  free(r->then->tx.heap);
  r->then->tx.heap = NULL;
  link_chunk_end(r->then, st, why);
}

void link_chunk_end(struct chunk *ch, HixlStatus st, const char *why) {
  struct hixl_transfer_req *r = ch->req;
  if (ch->dj && !ch->dj->running) link_devq_drop(r->eng, ch->dj); /* its copy had not begun */
  link_devbuf_put(r->eng, ch->bounce);
  ch->bounce = NULL;
  if (ch->lreg) ch->lreg->inflight--;
  ch->lreg = NULL; /* an ended chunk holds nothing (link_req_let_go tells them so) */
  if (ch->owner) ch->owner->link.chunk_end(ch);
  if (st != HIXL_SUCCESS && r->status == HIXL_SUCCESS) {
    r->status = st;
    snprintf(r->err, sizeof(r->err), "%s", why);
  }
  /* Atomic: GetTransferStatus reads it holding only req_lock. */
  uint32_t left = __atomic_sub_fetch(&r->outstanding, 1, __ATOMIC_ACQ_REL);
  if (left == 0) {
    pthread_cond_broadcast(&r->eng->cond);
    link_req_maybe_free(r);
  } else if (left == 1 && r->then_state == THEN_HELD) {
    then_release(r); /* only the CALL is left: the transfer has ended */
  }
}

void link_req_let_go(struct hixl_transfer_req *r) {
  for (uint32_t i = 0; i < r->ndirect + r->nsock; i++) {
    struct chunk *ch = &r->chunks[i];
    struct txitem *it = &ch->tx;
    if (!ch->lreg || ch->lreg->type != HIXL_MEM_HOST || it->hdr_len == 0) continue; /* ended; not a frame */
    if (ch->kind != CHUNK_READ && ch->kind != CHUNK_WRITE) continue;
    size_t total = it->hdr_len + it->heap_len + it->tag_len + it->payload_len + it->ptag_len;
    if (ch->kind == CHUNK_WRITE && it->payload == ch->laddr && it->sent > 0 && it->sent < total) {
      uint8_t *copy = malloc(it->payload_len);
      if (!copy) continue; /* it keeps the registration: Deregister refuses until the frame is out */
      memcpy(copy, it->payload, it->payload_len);
      it->payload = it->own_payload = copy; /* freed once sent (link_txitem_done) */
    }
    ch->lreg->inflight--;
    ch->lreg = NULL;
  }
}

/* ---- connections ---- */

struct conn *link_conn_new(struct HixlEngine *e, int fd, enum conn_role role) {
  struct conn *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->rxbuf = malloc(ENGINE_RXBUF);
  if (!c->rxbuf) {
    free(c);
    return NULL;
  }
  c->eng = e;
  c->id = ++e->conn_ids;
  c->fd = fd;
  c->role = role;
  c->next_seq = 1;
  c->xp = e->mods[XPORT_TCP];
  c->rail = -1;
  return c;
}

int link_conn_watch(struct conn *c) {
  struct epoll_event ev = {.events = c->rx == RX_PROGRESS ? EPOLLIN : EPOLLRDHUP, .data.ptr = c};
  if (sock_set_nonblock(c->fd, true) < 0 || epoll_ctl(c->eng->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) return -1;
  c->next = c->eng->conns;
  c->eng->conns = c;
  return 0;
}

void link_txitem_done(struct conn *c, struct txitem *it) {
  free(it->heap);
  it->heap = NULL;
  c->answers_queued -= it->queued;
  c->answers_items -= it->owed;
  it->queued = 0;
  it->owed = false;
  if (it->pool_payload)
    link_devbuf_put(c->eng, it->own_payload);
  else
    free(it->own_payload);
  it->own_payload = NULL;
  it->pool_payload = false;
  for (uint32_t i = 0; i < it->n_own_regs; i++) it->own_regs[i]->inflight--;
  it->n_own_regs = 0;
  free(it->own_block);
  it->own_block = NULL;
  if (it->reg) it->reg->inflight--;
  if (!it->chunk) free(it);
}

/* Close a dead link and queue it to be freed after the current event batch. */
void link_conn_bury(struct conn *c) {
  close(c->fd);
  c->fd = -1;
  /* The progress thread frees it after its round: woken, else a link a caller killed
   * (Disconnect; a drive that found the peer gone) stayed, with its 256 KiB receive
   * buffer and a same-host peer's page mapped, until some event woke the thread. */
  if (!c->eng->graveyard) link_wake(c->eng);
  c->next = c->eng->graveyard;
  c->eng->graveyard = c;
}

/* ---- rails ---- */

struct memtab *link_peer_rtab(struct peer *p, int rail) {
  return rail > 0 && rail < HIXL_RAILS_MAX ? &p->rails[rail].rtab : &p->rtab;
}

struct memtab *link_rtab(const struct conn *c) {
  return link_peer_rtab(c->peer, c->rail);
}

/* rm's range in rail link c's own table, or NULL. */
static const struct remote_mem *rail_own(const struct conn *c, const struct remote_mem *rm) {
  return (const struct remote_mem *)memtab_find_exact(link_rtab(c), rm->range.addr, rm->range.len);
}

bool link_rail_keyed(const struct conn *c, const struct remote_mem *rm) {
  return !rm || !(c->xp->flags & XPORT_ONE_SIDED) || c->rail < 0 || !c->peer || rail_own(c, rm);
}

uint32_t link_rail_rkey(const struct conn *c, const struct remote_mem *rm) {
  const struct remote_mem *own =
      c->rail >= 0 && c->peer && (c->xp->flags & XPORT_ONE_SIDED) ? rail_own(c, rm) : NULL;
  return own ? own->rkey : rm->rkey;
}

struct conn *link_rail_pick(struct peer *p, const struct conn *except, const struct remote_mem *rm) {
  struct conn *best = NULL;
  if (p->closing) return NULL;
  for (uint32_t k = 0; k < p->n_rails; k++) {
    struct conn *r = p->rails[k].conn;
    if (!r || r == except || r->dead || !link_rail_keyed(r, rm)) continue;
    if (!best || r->rail_load < best->rail_load || (r->rail_load == best->rail_load && r == p->conn))
      best = r;
  }
  return best;
}

void link_chunk_moved(struct conn *c, struct chunk *ch) {
  struct peer *p = c->peer;
  if (c->rail < 0 || (ch->kind != CHUNK_READ && ch->kind != CHUNK_WRITE)) return;
  c->rail_load -= c->rail_load < ch->len ? c->rail_load : ch->len;
  c->last_io_ns = hixl_now_ns();
  if (p && (uint32_t)c->rail < p->n_rails) {
    p->rails[c->rail].bytes += ch->len;
    p->rails[c->rail].ops++;
  }
}

void link_rail_charge(struct conn *c, uint32_t len) {
  if (c->rail_load == 0) c->last_io_ns = hixl_now_ns(); /* idle until now: the stall clock starts here */
  c->rail_load += len;
}

void link_rail_post(struct conn *to, struct chunk *ch, const struct remote_mem *rm) {
  if (rm) ch->rkey = link_rail_rkey(to, rm);
  link_rail_charge(to, ch->len);
  ch->seq = to->next_seq++;
  to->xp->link.post(to, ch);
  link_unpark(to);
  link_set_want_out(to, true);
}

/* A chunk of c's that c can no longer answer: posted again on another rail of the same
 * peer when there is one and the request has time left (tcp chunks, which say in full
 * what to move; a WRITE moves the same bytes again). false: it ends with c. */
static bool rail_retry(struct conn *c, struct chunk *ch) {
  struct peer *p = c->peer;
  struct hixl_transfer_req *r = ch->req;
  if (!p || c->rail < 0 || c->eng->stopping || ch->owner ||
      (ch->kind != CHUNK_READ && ch->kind != CHUNK_WRITE) || r->cancelled || hixl_now_ns() >= r->deadline_ns)
    return false;
  /* Another rail's device may know the peer's range by another key (rdma): the range as
   * c's table holds it, then looked up in the other rail's. */
  const struct remote_mem *rm = (const struct remote_mem *)memtab_find(link_rtab(c), ch->raddr, ch->len);
  struct conn *to = link_rail_pick(p, c, rm);
  if (!to || ((to->xp->flags & XPORT_ONE_SIDED) && !rm)) return false;
  p->rails[c->rail].retried++;
  r->railed = true;
  link_rail_post(to, ch, rm);
  return true;
}

void link_chunk_lost(struct conn *c, struct chunk *ch, HixlStatus st, const char *msg) {
  if (!rail_retry(c, ch)) link_chunk_end(ch, st, msg);
}

/* c's peer lets go of it; a railed peer's control frames move to its lowest live rail. */
static void peer_detach(struct conn *c, const char *why) {
  struct peer *p = c->peer;
  if (c->rail >= 0 && (uint32_t)c->rail < p->n_rails && p->rails[c->rail].conn == c) {
    struct rail *rl = &p->rails[c->rail];
    rl->conn = NULL;
    rl->failures++;
    snprintf(rl->last_down, sizeof(rl->last_down), "%s", why);
    rl->next_probe_ns = hixl_now_ns() + (uint64_t)c->eng->opts.rail_probe_ms * 1000000u;
    if (c->eng->rail_thread_on) pthread_cond_signal(&c->eng->rail_cond);
  }
  if (p->conn == c) {
    p->conn = NULL;
    for (uint32_t k = 0; k < p->n_rails && !p->conn && !p->closing; k++)
      if (p->rails[k].conn && !p->rails[k].conn->dead) p->conn = p->rails[k].conn;
    if (p->conn)
      log_warn("link to %s: rail %d is down (%s); rail %d carries its control frames now", p->name, c->rail,
               why, p->conn->rail);
    else
      snprintf(p->broken_why, sizeof(p->broken_why), "%s", why);
  } else if (c->rail >= 0) {
    log_warn("link to %s: rail %d is down (%s)", p->name, c->rail, why);
  }
  if (c->rail <= 0) { /* the link whose handshake made the session secret: it dies with it */
    p->authed = false;
    auth_wipe(p->session, sizeof(p->session));
  }
  c->peer = NULL;
}

bool link_rails_tick(struct HixlEngine *e) {
  bool any = false;
  uint64_t now = hixl_now_ns(), stall = (uint64_t)e->opts.rail_stall_ms * 1000000u;
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));) {
    if (c->rail < 0 || c->dead) continue;
    any = true;
    /* Quiet for RailStallMs with work out, and the kernel says why: what it sent has
     * gone unacknowledged that long. A peer that is only slow (its kernel acknowledges,
     * its engine has not answered yet) is not a failed rail: its deadline rules. */
    uint32_t unacked = 0;
    /* last_io_ns may be later than now: a rail killed earlier in this pass moved chunks here */
    bool busy = c->rail_load > 0 || c->pay_left > 0; /* a READ's data still arriving counts */
    if (!busy || c->last_io_ns + stall > now || !sock_path_dead(c->fd, e->opts.rail_stall_ms, &unacked))
      continue;
    char why[160];
    snprintf(why, sizeof(why), "rail %d stalled: %u segment(s) unacknowledged for %u ms (RailStallMs)",
             c->rail, unacked, e->opts.rail_stall_ms);
    link_conn_kill(c, HIXL_FAILED, why);
  }
  return any;
}

/* End everything the connection holds, close it and queue it for freeing. */
void link_conn_kill(struct conn *c, HixlStatus st, const char *why) {
  struct HixlEngine *e = c->eng;
  char msg[384];
  if (c->dead) return;
  c->dead = true;
  snprintf(msg, sizeof(msg), "link %s %s: %s", c->role == CONN_INITIATOR ? "to" : "from",
           c->remote_name[0] ? c->remote_name : "(handshaking peer)", why);
  if (c->pay.reg) c->pay.reg->inflight--;
  c->pay.reg = NULL;
  link_devbuf_put(e, c->pay.bounce);
  c->pay.bounce = NULL;
  link_devq_kill(c, st, msg); /* its device copies: dropped, or ended by their copier */
  if (c->stall & LINK_STALL_DEVMEM) e->devq.stalls--;
  c->stall &= (uint8_t)~LINK_STALL_DEVMEM;
  if (c->pay_chunk) link_chunk_lost(c, c->pay_chunk, st, msg); /* READ data cut off mid-payload */
  c->pay_chunk = NULL;
  for (int i = 0; i < XPORT_MODS; i++) e->mods[i]->link.kill(c, st, msg);
  c->pay_left = 0;
  /* Unsent frames: chunks end with the link's fate, responses are dropped. */
  while (c->txq_head) {
    struct txitem *it = c->txq_head;
    c->txq_head = it->next;
    struct chunk *ch = it->chunk;
    link_txitem_done(c, it);
    if (ch) link_chunk_lost(c, ch, st, msg);
  }
  c->txq_tail = NULL;
  while (c->pend_head) {
    struct chunk *ch = c->pend_head;
    c->pend_head = ch->next_pending;
    link_chunk_lost(c, ch, st, msg);
  }
  c->pend_tail = NULL;
  c->rail_load = 0;
  if (c->peer) peer_detach(c, why);
  for (struct conn **pp = &e->conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  if (st != HIXL_SUCCESS) log_warn("%s", msg);
  epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  if (c->rx == RX_CALLER)
    shutdown(c->fd, SHUT_RDWR); /* wakes the caller polling it; it buries the link */
  else
    link_conn_bury(c); /* c stays readable until the graveyard is freed */
  for (int i = 0; i < XPORT_MODS; i++) e->mods[i]->link.closed(c);
}

void link_free_graveyard(struct HixlEngine *e) {
  for (struct conn **pc = &e->graveyard; *pc;) {
    struct conn *c = *pc;
    if (c->devjobs > 0) { /* a job of its the copier runs still reads it: freed after */
      pc = &c->next;
      continue;
    }
    *pc = c->next;
    link_devbuf_disown(c); /* a chunk still holding a buffer it took on c puts it back later */
    link_devq_streams_free(c);
    for (int i = 0; i < XPORT_MODS; i++) e->mods[i]->link.free(c);
    auth_frames_free(&c->proof);
    auth_wipe(c->auth_expect, sizeof(c->auth_expect)); /* target: the link's secrets die with it */
    auth_wipe(c->session, sizeof(c->session));
    free(c->tag_park); /* a CALL_TAG whose tag never came: it dies with its link */
    free(c->rxbuf);
    free(c);
  }
}

/* ---- device copies: their queue and the pool (link_progress.c runs them) ---- */

void *link_devbuf_get(struct conn *c, int device, bool spill, char *why, size_t cap) {
  struct HixlEngine *e = c->eng;
  struct devq *q = &e->devq;
  if (!q->pool) { /* the first device op: the pool, its buffers made as they are needed */
    const struct devmem_ops *dm = devmem_get(why, cap);
    if (!dm) return NULL;
    q->pool = devmem_pool_new(dm, device, ENGINE_TCP_CHUNK, ENGINE_DEV_BUFS);
    if (!q->pool) {
      snprintf(why, cap, "out of memory for the device buffer pool");
      return NULL;
    }
  }
  if (!spill && link_devbuf_capped(c)) {
    snprintf(why, cap, "the link holds its %d device buffers", ENGINE_DEV_LINK_BUFS);
    return NULL;
  }
  void *b = spill && link_devbuf_capped(c) ? devmem_pool_extra(q->pool, why, cap)
            : spill                        ? devmem_pool_spill(q->pool, why, cap)
                                           : devmem_pool_get(q->pool, why, cap);
  if (!b || !devmem_pool_owns(q->pool, b)) return b; /* a spill is charged to no link */
  for (int i = 0; i < ENGINE_DEV_BUFS; i++)
    if (!q->held[i]) {
      q->held[i] = b;
      q->held_by[i] = c;
      c->devbufs++;
      break;
    }
  return b;
}

bool link_devbuf_capped(const struct conn *c) { return c->devbufs >= ENGINE_DEV_LINK_BUFS; }

void link_devbuf_disown(struct conn *c) {
  struct devq *q = &c->eng->devq;
  for (int i = 0; i < ENGINE_DEV_BUFS; i++)
    if (q->held_by[i] == c) q->held_by[i] = NULL;
  c->devbufs = 0;
  q->news = true;
}

void link_devbuf_put(struct HixlEngine *e, void *buf) {
  struct devq *q = &e->devq;
  if (!buf) return;
  for (int i = 0; i < ENGINE_DEV_BUFS; i++)
    if (q->held[i] == buf) {
      if (q->held_by[i]) q->held_by[i]->devbufs--;
      q->held[i] = NULL;
      q->held_by[i] = NULL;
      break;
    }
  devmem_pool_put(q->pool, buf);
  q->news = true;
  if (q->waiting || q->stalls) { /* jobs or stalled links wait for it */
    q->resume = q->stalls > 0;
    link_wake(e);
  }
}

void link_devq_streams_free(struct conn *c) {
  const struct devmem_ops *dm = c->ndevstreams ? devmem_get(NULL, 0) : NULL;
  for (uint32_t i = 0; i < c->ndevstreams; i++)
    if (dm && c->devstream[i].stream) dm->stream_free(c->devstream[i].stream, c->devstream[i].device);
  c->ndevstreams = 0;
}

void link_devq_add(struct HixlEngine *e, struct devjob *j) {
  struct devq *q = &e->devq;
  j->next = NULL;
  if (q->tail)
    q->tail->next = j;
  else
    q->head = j;
  q->tail = j;
  j->c->devjobs++;
  j->needs_buf = !j->buf;
  q->waiting += j->needs_buf;
  q->news = true;
}

static void devq_unlink(struct HixlEngine *e, struct devjob *j) {
  struct devq *q = &e->devq;
  struct devjob *prev = NULL;
  for (struct devjob *x = q->head; x && x != j; x = x->next) prev = x;
  if (prev)
    prev->next = j->next;
  else
    q->head = j->next;
  if (q->tail == j) q->tail = prev;
  j->c->devjobs--;
  q->waiting -= j->needs_buf;
}

void link_devq_drop(struct HixlEngine *e, struct devjob *j) {
  devq_unlink(e, j);
  if (j->ch) j->ch->dj = NULL;
  if (j->kind != DJ_LAND) link_devbuf_put(e, j->buf); /* a LAND's is its chunk's bounce */
  if (j->kind == DJ_T_LAND) j->reg->inflight--;
  free(j);
}

/* Take it out of c's send queue (its copy ends it, not the link's death). */
void link_txq_unlink(struct conn *c, struct txitem *it) {
  struct txitem *prev = NULL;
  for (struct txitem *x = c->txq_head; x && x != it; x = x->next) prev = x;
  if (prev)
    prev->next = it->next;
  else if (c->txq_head == it)
    c->txq_head = it->next;
  else
    return;
  if (c->txq_tail == it) c->txq_tail = prev;
}

void link_devq_kill(struct conn *c, HixlStatus st, const char *why) {
  struct HixlEngine *e = c->eng;
again: /* ending a chunk may end others' links and their jobs: the walk starts over */
  for (struct devjob *j = e->devq.head, *next; j && c->devjobs > 0; j = next) {
    next = j->next;
    if (j->c != c || j->lost) continue;
    if (j->running) { /* its copier ends it; the link's walk must not */
      j->lost = true;
      j->st = st;
      snprintf(j->why, sizeof(j->why), "%s", why);
      if (j->kind != DJ_LAND) link_txq_unlink(c, j->it);
      continue;
    }
    struct chunk *ch = j->kind == DJ_LAND ? j->ch : NULL;
    link_devq_drop(e, j); /* a frame of its stays queued: the link's walk ends it */
    if (ch) {
      link_chunk_end(ch, st, why);
      goto again;
    }
  }
}

void link_devq_land(struct conn *c, struct chunk *ch) {
  struct devjob *j = calloc(1, sizeof(*j));
  if (!j) {
    link_chunk_end(ch, HIXL_RESOURCE_EXHAUSTED, "out of memory for a device READ's copy");
    return;
  }
  *j = (struct devjob){.c = c,
                       .kind = DJ_LAND,
                       .ch = ch,
                       .reg = ch->lreg,
                       .dev = (uintptr_t)ch->laddr,
                       .buf = ch->bounce,
                       .len = ch->len};
  ch->dj = j;
  link_devq_add(c->eng, j);
  link_wake(c->eng);
}

void link_enqueue(struct conn *c, struct txitem *it) {
  it->next = NULL;
  it->sent = 0;
  it->sealed = false; /* tagged as it first goes out (link_frames.c) */
  it->tag_len = 0;
  it->ptag_len = 0;
  if (c->role == CONN_TARGET) { /* an answer this engine owes its peer: counted against the bound */
    it->queued = it->heap_len + it->payload_len; /* the inline header is the item's own cost */
    it->owed = true;
    c->answers_queued += it->queued;
    c->answers_items++;
  }
  if (c->txq_tail)
    c->txq_tail->next = it;
  else
    c->txq_head = it;
  c->txq_tail = it;
}

/* Tell epoll what the progress thread should watch on c. */
void link_conn_arm(struct conn *c) {
  uint32_t in = c->rx == RX_PROGRESS && !c->stall ? EPOLLIN : EPOLLRDHUP;
  struct epoll_event ev = {.events = in | (c->want_out ? EPOLLOUT : 0), .data.ptr = c};
  epoll_ctl(c->eng->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Hand reading back to the progress thread (async work was queued, or it ended). */
void link_unpark(struct conn *c) {
  if (c->dead || c->rx != RX_PARKED) return;
  c->rx = RX_PROGRESS;
  link_conn_arm(c);
}

/* xport.h's default async hook: nobody waits in a call, the progress thread reads. */
void link_async_unpark(struct conn *c, struct hixl_transfer_req *r) {
  (void)r;
  link_unpark(c);
}

void link_set_want_out(struct conn *c, bool on) {
  if (c->want_out == on || c->dead) return;
  c->want_out = on;
  link_conn_arm(c);
}

uint32_t link_caps(const struct HixlEngine *e) {
  uint32_t caps =
      WIRE_CAP_CALL | WIRE_CAP_CALL_AFTER | WIRE_CAP_DEVMEM | (e->n_rail_addrs > 1 ? WIRE_CAP_RAILS : 0u);
#ifdef HIXL_DEVMEM_TEST
  if (getenv("HIXL_TEST_NO_DEVMEM_CAP")) caps &= ~WIRE_CAP_DEVMEM; /* test builds: an engine from before it */
#endif
  for (int i = 0; i < XPORT_MODS; i++) caps |= e->mods[i]->iface.caps(e);
  return caps;
}

uint32_t link_mem_key(const struct conn *c, const struct hixl_mem_reg *r) {
  uint32_t key = 0;
  for (int i = 0; i < XPORT_MODS && !key; i++) key = c->eng->mods[i]->mem.key(c, r);
  return key;
}

void link_wake(struct HixlEngine *e) {
  uint64_t one = 1;
  (void)!write(e->evfd, &one, sizeof(one));
}

HixlStatus link_handshake_send(int fd, struct peer *p, uint8_t *frame, size_t len, uint64_t deadline) {
  uint8_t tag[WIRE_TAG_LEN];
  if (!p->proof.on) return sock_send_all(fd, frame, len, deadline);
  frame[7] |= WIRE_F_TAG;
  auth_seal_frame(&p->proof.tx, frame, len, NULL, 0, tag);
  HixlStatus st = sock_send_all(fd, frame, len, deadline);
  return st == HIXL_SUCCESS ? sock_send_all(fd, tag, sizeof(tag), deadline) : st;
}

HixlStatus link_handshake_tag(int fd, uint64_t deadline, struct peer *p, const uint8_t *frame,
                              const struct wire_hdr *h) {
  uint8_t tag[WIRE_TAG_LEN];
  HixlStatus st;
  if ((h->flags & WIRE_F_TAG) != (p->proof.on ? WIRE_F_TAG : 0u))
    return hixl_fail(HIXL_FAILED, "%s %s on %s link%s", p->proof.on ? "an unproven" : "a proven",
                     wire_type_name(h->type),
                     p->proof.on ? "an authenticated" : "a link that was not authenticated",
                     p->proof.on && h->type == WIRE_HELLO_ACK
                         ? " (the target is a hixl from before every frame was proven, f97fb9a: upgrade it; "
                           "docs/security.md)"
                         : "");
  if (!p->proof.on) return HIXL_SUCCESS;
  if ((st = sock_recv_all(fd, tag, sizeof(tag), deadline)) != HIXL_SUCCESS) return st;
  if (!auth_check_frame(&p->proof.rx, frame, WIRE_HDR_LEN + h->body_len, NULL, 0, tag))
    return hixl_fail(HIXL_FAILED,
                     "%s (frame %llu) failed its proof: inserted, replayed, reordered or altered on the way",
                     wire_type_name(h->type), (unsigned long long)p->proof.rx.seq);
  return HIXL_SUCCESS;
}

HixlStatus link_handshake_recv(int fd, uint64_t deadline, struct peer *p, uint8_t *buf, size_t cap,
                               struct wire_hdr *h) {
  /* A MEM_ADD / MEM_DEL is read here, whatever cap (sized for the answer awaited) holds:
   * its tag may be WIRE_MAX_TAG bytes. */
  uint8_t ent[WIRE_HDR_LEN + WIRE_MEM_ENTRY_FIXED + WIRE_MAX_TAG];
  HixlStatus st;
  for (;;) {
    struct wire_msg m;
    if ((st = sock_recv_all(fd, buf, WIRE_HDR_LEN, deadline)) != HIXL_SUCCESS) return st;
    enum wire_err err = wire_parse_hdr(buf, h);
    bool mem = err == WIRE_OK && (h->type == WIRE_MEM_ADD || h->type == WIRE_MEM_DEL);
    uint8_t *f = mem ? memcpy(ent, buf, WIRE_HDR_LEN) : buf;
    if (err == WIRE_ELEN) /* the header names a known type */
      return hixl_fail(HIXL_FAILED, "malformed frame: a %s header: %s (%u body bytes)",
                       wire_type_name(h->type), wire_err_str(err), h->body_len);
    if (err != WIRE_OK) return hixl_fail(HIXL_FAILED, "malformed frame: %s", wire_err_str(err));
    if (WIRE_HDR_LEN + h->body_len > (mem ? sizeof(ent) : cap))
      return hixl_fail(HIXL_FAILED,
                       "malformed frame: a %s of %u body bytes, more than the %zu it may have here",
                       wire_type_name(h->type), h->body_len, (mem ? sizeof(ent) : cap) - WIRE_HDR_LEN);
    if ((st = sock_recv_all(fd, f + WIRE_HDR_LEN, h->body_len, deadline)) != HIXL_SUCCESS) return st;
    if ((st = link_handshake_tag(fd, deadline, p, f, h)) != HIXL_SUCCESS) return st;
    if (!mem) return HIXL_SUCCESS;
    if ((err = wire_decode(h, f + WIRE_HDR_LEN, &m)) != WIRE_OK)
      return hixl_fail(HIXL_FAILED, "malformed frame: a %s: %s", wire_type_name(h->type), wire_err_str(err));
    if (h->type == WIRE_MEM_ADD) {
      /* The live link's bound holds here too: a peer streaming MEM_ADDs before its
       * answer would grow the table until the deadline. */
      if (p->rtab.count >= LINK_PEER_MEM_MAX && !memtab_find_exact(&p->rtab, m.u.mem.addr, m.u.mem.len))
        return hixl_fail(HIXL_FAILED, "the peer advertised more than %u registrations (LINK_PEER_MEM_MAX)",
                         LINK_PEER_MEM_MAX);
      link_peer_add_mem(p, &m.u.mem, 0);
    } else {
      link_peer_del_mem(p, m.u.mem.addr, m.u.mem.len, 0);
    }
  }
}

size_t link_mem_entry_len(const struct hixl_mem_reg *r) { return WIRE_MEM_ENTRY_FIXED + strlen(r->tag); }

/* Record one registration a peer advertised (handshake or MEM_ADD). */
void link_peer_add_mem(struct peer *p, const struct wire_mem_entry *me, int rail) {
  /* No registration is empty or wraps past 2^64: such an entry is not kept (nor handed
   * on by hixl_engine_remote_mems); memtab_find's arithmetic would never match it. */
  if (me->len == 0 || me->addr + me->len < me->addr) return;
  struct memtab *t = link_peer_rtab(p, rail);
  struct remote_mem *rm = (struct remote_mem *)memtab_find_exact(t, me->addr, me->len);
  struct memtab_entry *clash;
  if (!rm) {
    if (!(rm = calloc(1, sizeof(*rm)))) return; /* the table is a cache: a miss costs a SYNC */
    rm->range.addr = me->addr;
    rm->range.len = me->len;
    rm->kind = me->kind;
    snprintf(rm->tag, sizeof(rm->tag), "%.*s", (int)me->tag_len, (const char *)me->tag);
    if (memtab_add(t, &rm->range, &clash) < 0) {
      free(rm);
      return;
    }
  }
  rm->rkey = me->rkey;
}

void link_peer_del_mem(struct peer *p, uint64_t addr, uint64_t len, int rail) {
  struct memtab *t = link_peer_rtab(p, rail);
  struct memtab_entry *ent = memtab_find_exact(t, addr, len);
  if (ent && memtab_remove(t, ent)) free(ent);
}

void link_peer_rtab_free(struct memtab *t) {
  for (size_t i = 0; i < t->count; i++) free(t->v[i]);
  memtab_free(t);
}
