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
 * the receive buffer they arrived in. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

#define LINK_IOV_MAX     256
#define LINK_READ_BUDGET (32u << 20)  /* bytes per event before other links get a turn */
#define LINK_SPAN_DIRECT (16u << 10)  /* spans at least this long are received in place */
#define LINK_FRAME_READ  (16u << 10)  /* bytes read at once while no payload is under way, */
#define LINK_PAY_LARGE   (128u << 10) /* ... once a payload was at least this long */

/* ---- requests and chunks ---- */

void link_req_maybe_free(struct hixl_transfer_req *r) {
  if (r->outstanding == 0 && !r->user_holds) {
    free(r->then);
    free(r->chunks);
    free(r->segs);
    free(r);
  }
}

static void set_want_out(struct conn *c, bool on);

/* r's transfer, which its CALL waited for, has ended: send the CALL on the link the
 * transfer went on when every chunk landed; else end it with their failure. Lock
 * held. */
static void then_release(struct hixl_transfer_req *r) {
  struct chunk *th = r->then;
  struct conn *c = NULL;
  char why[384];
  /* Only a link still in the engine's list: a caller's copy (shm) runs unlocked, and a
   * link killed meanwhile may have been freed since. */
  for (struct conn *k = r->eng->conns; k && !c; k = k->next) c = k == r->then_conn ? k : NULL;
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
  /* The progress thread sends it (EPOLLOUT) and reads the answer: this may run inside
   * a transport's completion loop, which a send failing (the link killed) must not
   * disturb. */
  link_unpark(c);
  set_want_out(c, true);
}

/* th becomes r's CALL chunk, one more outstanding; returns how many are now. */
static uint32_t then_init(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                          uint32_t len, int state) {
  th->req = r;
  th->kind = CHUNK_CALL;
  th->tx.chunk = th;
  r->then = th;
  r->then_conn = c;
  r->then_service = service;
  r->then_len = len;
  r->then_state = state;
  return __atomic_add_fetch(&r->outstanding, 1, __ATOMIC_ACQ_REL);
}

void link_then_attach(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len) {
  if (then_init(r, c, th, service, len, THEN_HELD) == 1) then_release(r);
}

void link_then_behind(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len) {
  then_init(r, c, th, service, len, THEN_SENT);
  th->seq = c->next_seq++;
  th->tx.heap_len = wire_put_call_after(th->tx.heap, th->seq, r->chunks[0].seq, service, len);
  link_enqueue(c, &th->tx);
  /* Alone on the queue (the start sent the data already): out now. Else it leaves
   * behind the data, which the progress thread is sending. */
  if (c->txq_head == &th->tx)
    link_flush(c);
  else
    set_want_out(c, true);
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
  if (ch->lreg) ch->lreg->inflight--;
  if (ch->owner && ch->owner->chunk_end) ch->owner->chunk_end(ch);
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
  c->fd = fd;
  c->role = role;
  c->next_seq = 1;
  c->xp = e->mods[XPORT_TCP];
  return c;
}

int link_conn_watch(struct conn *c) {
  struct epoll_event ev = {.events = c->rx == RX_PROGRESS ? EPOLLIN : EPOLLRDHUP, .data.ptr = c};
  if (sock_set_nonblock(c->fd, true) < 0 || epoll_ctl(c->eng->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) return -1;
  c->next = c->eng->conns;
  c->eng->conns = c;
  return 0;
}

static void txitem_done(struct conn *c, struct txitem *it) {
  free(it->heap);
  it->heap = NULL;
  c->stage_queued -= it->queued;
  it->queued = 0;
  free(it->own_payload);
  it->own_payload = NULL;
  for (uint32_t i = 0; i < it->n_own_regs; i++) it->own_regs[i]->inflight--;
  it->n_own_regs = 0;
  free(it->own_block);
  it->own_block = NULL;
  if (it->reg) it->reg->inflight--;
  if (!it->chunk) free(it);
}

/* Close a dead link and queue it to be freed after the current event batch. */
static void conn_bury(struct conn *c) {
  close(c->fd);
  c->fd = -1;
  c->next = c->eng->graveyard;
  c->eng->graveyard = c;
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
  if (c->pay_chunk) link_chunk_end(c->pay_chunk, st, msg); /* READ data cut off mid-payload */
  c->pay_chunk = NULL;
  for (int i = 0; i < XPORT_MODS; i++)
    if (e->mods[i] && e->mods[i]->kill) e->mods[i]->kill(c, st, msg);
  c->pay_left = 0;
  /* Unsent frames: chunks end with the link's fate, responses are dropped. */
  while (c->txq_head) {
    struct txitem *it = c->txq_head;
    c->txq_head = it->next;
    struct chunk *ch = it->chunk;
    txitem_done(c, it);
    if (ch) link_chunk_end(ch, st, msg);
  }
  c->txq_tail = NULL;
  while (c->pend_head) {
    struct chunk *ch = c->pend_head;
    c->pend_head = ch->next_pending;
    link_chunk_end(ch, st, msg);
  }
  c->pend_tail = NULL;
  if (c->peer) {
    snprintf(c->peer->broken_why, sizeof(c->peer->broken_why), "%s", why);
    c->peer->conn = NULL;
    c->peer = NULL;
  }
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
    conn_bury(c); /* c stays readable until the graveyard is freed */
  for (int i = 0; i < XPORT_MODS; i++)
    if (e->mods[i] && e->mods[i]->closed) e->mods[i]->closed(c);
}

void link_free_graveyard(struct HixlEngine *e) {
  while (e->graveyard) {
    struct conn *c = e->graveyard;
    e->graveyard = c->next;
    for (int i = 0; i < XPORT_MODS; i++)
      if (e->mods[i] && e->mods[i]->free) e->mods[i]->free(c);
    free(c->rxbuf);
    free(c);
  }
}

void link_enqueue(struct conn *c, struct txitem *it) {
  it->next = NULL;
  it->sent = 0;
  if (c->txq_tail)
    c->txq_tail->next = it;
  else
    c->txq_head = it;
  c->txq_tail = it;
}

/* Tell epoll what the progress thread should watch on c. */
static void conn_arm(struct conn *c) {
  uint32_t in = c->rx == RX_PROGRESS && !c->stalled ? EPOLLIN : EPOLLRDHUP;
  struct epoll_event ev = {.events = in | (c->want_out ? EPOLLOUT : 0), .data.ptr = c};
  epoll_ctl(c->eng->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Hand reading back to the progress thread (async work was queued, or it ended). */
void link_unpark(struct conn *c) {
  if (c->dead || c->rx != RX_PARKED) return;
  c->rx = RX_PROGRESS;
  conn_arm(c);
}

static void set_want_out(struct conn *c, bool on) {
  if (c->want_out == on || c->dead) return;
  c->want_out = on;
  conn_arm(c);
}

/* Drop a chunk of a timed-out request that has not started on the wire. */
static bool drop_if_cancelled(struct conn *c) {
  struct txitem *it = c->txq_head;
  if (!it->chunk || it->sent || !it->chunk->req->cancelled) return false;
  struct chunk *ch = it->chunk;
  c->txq_head = it->next;
  if (!c->txq_head) c->txq_tail = NULL;
  txitem_done(c, it); /* a CALL's frame, what a payload held */
  link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was sent");
  return true;
}

/* Append iovecs for what is left of it (header, heap, then its payload or its
 * gathered ranges) from iov[n] on, within budget; returns the new n. */
static int item_iov(const struct txitem *it, struct iovec *iov, int n, size_t budget, size_t *bytes) {
  size_t off = it->sent;
  const struct stage_seg one = {.laddr = (uintptr_t)it->payload, .len = (uint32_t)it->payload_len};
  const struct stage_seg head[2] = {{.laddr = (uintptr_t)it->hdr, .len = it->hdr_len},
                                    {.laddr = (uintptr_t)it->heap, .len = (uint32_t)it->heap_len}};
  const struct stage_seg *parts[2] = {head, it->gather ? it->gather : &one};
  uint32_t nparts[2] = {2, it->gather ? it->ngather : 1};
  for (int p = 0; p < 2; p++)
    for (uint32_t g = 0; g < nparts[p] && n < LINK_IOV_MAX && *bytes < budget; g++) {
      size_t len = parts[p][g].len;
      if (off >= len) {
        off -= len;
        continue;
      }
      iov[n].iov_base = (uint8_t *)(uintptr_t)parts[p][g].laddr + off;
      iov[n].iov_len = len - off < budget - *bytes ? len - off : budget - *bytes;
      *bytes += iov[n++].iov_len;
      off = 0;
    }
  return n;
}

static void parse_frames(struct conn *c);
static void fence_release(struct conn *c);

/* Send as much of the queue as the socket takes, in gathered writes. */
void link_flush_some(struct conn *c, size_t budget) {
  while (c->txq_head && !c->dead && budget > 0) {
    struct iovec iov[LINK_IOV_MAX];
    int n = 0;
    size_t bytes = 0;
    if (drop_if_cancelled(c)) continue;
    for (struct txitem *it = c->txq_head; it && n + 3 <= LINK_IOV_MAX && bytes < budget; it = it->next) {
      n = item_iov(it, iov, n, budget, &bytes);
      if (it->gather) break; /* its ranges may fill the vector: one such item per call */
      if (it->next && it->next->chunk && it->next->chunk->req->cancelled) break;
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sock_sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      char why[128];
      snprintf(why, sizeof(why), "send failed: %s", strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    size_t done = (size_t)k;
    budget -= done;
    while (c->txq_head) {
      struct txitem *it = c->txq_head;
      size_t total = it->hdr_len + it->heap_len + it->payload_len;
      size_t take = total - it->sent < done ? total - it->sent : done;
      it->sent += take;
      done -= take;
      if (it->sent < total) break;
      c->txq_head = it->next;
      if (!c->txq_head) c->txq_tail = NULL;
      struct chunk *ch = it->chunk;
      txitem_done(c, it);
      if (ch) {
        ch->next_pending = NULL;
        if (c->pend_tail)
          c->pend_tail->next_pending = ch;
        else
          c->pend_head = ch;
        c->pend_tail = ch;
      }
    }
  }
  if (!c->dead) set_want_out(c, c->txq_head != NULL);
  if (!c->dead && c->call_fenced && !c->txq_head) fence_release(c);
}

void link_flush(struct conn *c) { link_flush_some(c, SIZE_MAX); }

/* Everything queued before the waiting CALL has been sent: serve it and read on, in a
 * loop rather than by recursion (each CALL answered may fence the next). */
static void fence_release(struct conn *c) {
  if (c->in_fence) return;
  c->in_fence = true;
  while (!c->dead && c->call_fenced && !c->txq_head) {
    c->call_fenced = c->stalled = false;
    conn_arm(c);
    parse_frames(c);
    if (!c->dead && c->txq_head) link_flush_some(c, SIZE_MAX);
  }
  c->in_fence = false;
}

/* Queue a small frame built by one of the wire_put_* helpers. */
int link_queue_small(struct conn *c, const uint8_t *frame, size_t len, const uint8_t *payload,
                     size_t payload_len, struct hixl_mem_reg *reg) {
  struct txitem *it = calloc(1, sizeof(*it));
  if (!it) return -1;
  memcpy(it->hdr, frame, len);
  it->hdr_len = (uint32_t)len;
  it->payload = payload;
  it->payload_len = payload_len;
  it->reg = reg;
  link_enqueue(c, it);
  return 0;
}

static int queue_heap(struct conn *c, uint8_t *frame, size_t len);

void link_queue_copy(struct conn *c, const uint8_t *frame, size_t len) {
  uint8_t *heap = malloc(len);
  if (!heap || queue_heap(c, heap, len) < 0) {
    free(heap);
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  memcpy(heap, frame, len);
}

static int queue_heap(struct conn *c, uint8_t *frame, size_t len) {
  struct txitem *it = calloc(1, sizeof(*it));
  if (!it) return -1;
  it->heap = frame;
  it->heap_len = len;
  link_enqueue(c, it);
  return 0;
}

uint32_t link_caps(const struct HixlEngine *e) {
  uint32_t caps = WIRE_CAP_CALL | WIRE_CAP_CALL_AFTER;
  for (int i = 0; i < XPORT_MODS; i++)
    if (e->mods[i] && e->mods[i]->caps) caps |= e->mods[i]->caps(e);
  return caps;
}

uint32_t link_mem_key(const struct HixlEngine *e, const struct hixl_mem_reg *r) {
  uint32_t key = 0;
  for (int i = 0; i < XPORT_MODS && !key; i++)
    if (e->mods[i] && e->mods[i]->mem_key) key = e->mods[i]->mem_key(r);
  return key;
}

void link_wake(struct HixlEngine *e) {
  uint64_t one = 1;
  (void)!write(e->evfd, &one, sizeof(one));
}

HixlStatus link_handshake_recv(int fd, uint64_t deadline, struct peer *p, uint8_t *buf, size_t cap,
                               struct wire_hdr *h) {
  HixlStatus st;
  for (;;) {
    struct wire_msg m;
    if ((st = sock_recv_all(fd, buf, WIRE_HDR_LEN, deadline)) != HIXL_SUCCESS) return st;
    if (wire_parse_hdr(buf, h) != WIRE_OK || WIRE_HDR_LEN + h->body_len > cap)
      return hixl_fail(HIXL_FAILED, "malformed frame");
    if ((st = sock_recv_all(fd, buf + WIRE_HDR_LEN, h->body_len, deadline)) != HIXL_SUCCESS) return st;
    if (h->type != WIRE_MEM_ADD && h->type != WIRE_MEM_DEL) return HIXL_SUCCESS;
    if (wire_decode(h, buf + WIRE_HDR_LEN, &m) != WIRE_OK) return hixl_fail(HIXL_FAILED, "malformed frame");
    if (h->type == WIRE_MEM_ADD) {
      link_peer_add_mem(p, &m.u.mem);
    } else {
      struct memtab_entry *ent = memtab_find_exact(&p->rtab, m.u.mem.addr, m.u.mem.len);
      if (ent && memtab_remove(&p->rtab, ent)) free(ent);
    }
  }
}

size_t link_mem_entry_len(const struct hixl_mem_reg *r) { return WIRE_MEM_ENTRY_FIXED + strlen(r->tag); }

/* Record one registration a peer advertised (handshake or MEM_ADD). */
void link_peer_add_mem(struct peer *p, const struct wire_mem_entry *me) {
  struct remote_mem *rm = malloc(sizeof(*rm));
  struct memtab_entry *clash;
  if (!rm) return; /* the table is a cache: a miss costs a SYNC, never correctness */
  rm->range.addr = me->addr;
  rm->range.len = me->len;
  rm->rkey = me->rkey;
  snprintf(rm->tag, sizeof(rm->tag), "%.*s", (int)me->tag_len, (const char *)me->tag);
  if (memtab_add(&p->rtab, &rm->range, &clash) < 0) free(rm);
}

void link_broadcast_mem(struct HixlEngine *e, enum wire_type type, const struct hixl_mem_reg *r) {
  for (struct conn *c = e->conns; c; c = c->next) {
    if (c->role != CONN_TARGET) continue;
    size_t cap = WIRE_HDR_LEN + link_mem_entry_len(r);
    uint8_t *buf = malloc(cap);
    struct wire_wr w;
    if (!buf) continue;
    wire_begin(&w, buf, cap, type);
    wire_put_mem_entry(&w, r->range.addr, r->range.len, link_mem_key(e, r),
                       type == WIRE_MEM_ADD ? r->tag : NULL);
    size_t len = wire_end(&w, 0);
    if (queue_heap(c, buf, len) < 0) {
      free(buf);
      link_conn_kill(c, HIXL_FAILED, "out of memory");
      continue;
    }
    link_flush(c);
  }
}

/* ---- target side ---- */

static void send_hello_ack(struct conn *c, uint32_t status) {
  struct HixlEngine *e = c->eng;
  size_t cap = WIRE_HDR_LEN + 14 + strlen(e->local_name);
  for (size_t i = 0; i < e->regs.count; i++) cap += link_mem_entry_len((struct hixl_mem_reg *)e->regs.v[i]);
  uint8_t *buf = malloc(cap);
  struct wire_wr w;
  if (!buf) {
    link_conn_kill(c, HIXL_FAILED, "out of memory building HELLO_ACK");
    return;
  }
  wire_begin(&w, buf, cap, WIRE_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_u32(&w, link_caps(e));
  wire_put_u16(&w, (uint16_t)strlen(e->local_name));
  wire_put_bytes(&w, e->local_name, strlen(e->local_name));
  wire_put_u32(&w, status == WIRE_HELLO_OK ? (uint32_t)e->regs.count : 0);
  for (size_t i = 0; status == WIRE_HELLO_OK && i < e->regs.count; i++)
    wire_put_mem_entry(&w, e->regs.v[i]->addr, e->regs.v[i]->len,
                       link_mem_key(e, (struct hixl_mem_reg *)e->regs.v[i]),
                       ((struct hixl_mem_reg *)e->regs.v[i])->tag);
  size_t len = wire_end(&w, 0);
  if (len == 0 || queue_heap(c, buf, len) < 0) {
    free(buf);
    link_conn_kill(c, HIXL_FAILED, "cannot build HELLO_ACK");
    return;
  }
  link_flush(c);
}

/* A CALL: the service's handler answers at once (in order with every other answer on
 * the link); no handler is UNSUPPORTED. A failing handler's answer is its reason. */
static void target_call(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  uint16_t sv = m->u.call.service;
  uint8_t *frame = malloc(WIRE_CALL_RESP_AT + WIRE_MAX_CALL);
  if (!frame) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  uint8_t *resp = frame + WIRE_CALL_RESP_AT;
  size_t n = 0;
  HixlStatus st;
  if (sv < ENGINE_SERVICES && e->services[sv].fn) {
    st = e->services[sv].fn(e->services[sv].ctx, c->remote_name, m->u.call.data, m->u.call.len, resp,
                            WIRE_MAX_CALL, &n);
    if (n > WIRE_MAX_CALL) n = 0;
  } else {
    st = HIXL_UNSUPPORTED;
    n = (size_t)snprintf((char *)resp, WIRE_MAX_CALL, "%s offers no service %u", e->local_name, (unsigned)sv);
  }
  link_queue_copy(c, frame, wire_put_call(frame, WIRE_CALL_RESP, m->u.call.seq, st, (uint32_t)n));
  free(frame);
}

static void target_handle(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  uint8_t frame[WIRE_SMALL_FRAME];
  switch (m->hdr.type) {
  case WIRE_HELLO:
    snprintf(c->remote_name, sizeof(c->remote_name), "%.*s", (int)m->u.hello.name_len,
             (const char *)m->u.hello.name);
    c->role = CONN_TARGET;
    send_hello_ack(c, WIRE_HELLO_OK);
    log_info("accepted link from %s", c->remote_name);
    return;
  case WIRE_SYNC: {
    size_t len = wire_put_ack(frame, WIRE_SYNC_ACK, m->u.ack.seq, HIXL_SUCCESS, 0);
    if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  case WIRE_CALL: target_call(c, m); return;
  case WIRE_CALL_AFTER:
    /* Every WRITE before it has landed or been refused (one ordered stream): served
     * only if none from its first on was refused. */
    if (c->write_refused >= m->u.call.after) {
      uint8_t resp[WIRE_CALL_RESP_AT + 160];
      int n = snprintf((char *)resp + WIRE_CALL_RESP_AT, 160,
                       "a WRITE it followed (seq %llu) was refused: the call was not served",
                       (unsigned long long)c->write_refused);
      link_queue_copy(c, resp, wire_put_call(resp, WIRE_CALL_RESP, m->u.call.seq, HIXL_FAILED, (uint32_t)n));
      return;
    }
    target_call(c, m);
    return;
  case WIRE_NOTIFY: {
    uint32_t st = HIXL_SUCCESS;
    if (e->n_notifies >= HIXL_MAX_NOTIFY_QUEUE) {
      st = HIXL_NOTIFY_FAILED;
    } else {
      if (e->n_notifies == e->cap_notifies) {
        size_t cap = e->cap_notifies ? e->cap_notifies * 2 : 16;
        struct notify_item *nv = realloc(e->notifies, cap * sizeof(*nv));
        if (nv) {
          e->notifies = nv;
          e->cap_notifies = cap;
        }
      }
      struct notify_item *it = e->n_notifies < e->cap_notifies ? &e->notifies[e->n_notifies] : NULL;
      if (it) {
        it->name = strndup((const char *)m->u.notify.name, m->u.notify.name_len);
        it->msg = strndup((const char *)m->u.notify.msg, m->u.notify.msg_len);
        it->remote = strdup(c->remote_name);
      }
      if (it && it->name && it->msg && it->remote) {
        e->n_notifies++;
      } else {
        if (it) {
          free(it->name);
          free(it->msg);
          free(it->remote);
        }
        st = HIXL_NOTIFY_FAILED;
      }
    }
    size_t len = wire_put_ack(frame, WIRE_NOTIFY_ACK, m->u.notify.seq, st, 0);
    if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  default: {
    const struct xport_ops *x = e->frame_owner[m->hdr.type]; /* type_allowed: there is one */
    if (x) x->target_frame(c, m);
    return;
  }
  }
}

void link_pay_single(struct conn *c, uint8_t *dst, size_t len) {
  c->pay_dst = dst;
  c->pay_left = c->pay_cur = c->pay_last = len;
  c->pay_span = NULL;
  c->pay_nspan = 0;
  c->pay_discard = dst == NULL;
}

void link_pay_spans(struct conn *c, const struct stage_seg *s, uint32_t n, bool remote, size_t len,
                    bool discard) {
  c->pay_left = c->pay_last = len;
  c->pay_cur = s[0].len;
  c->pay_span_remote = remote;
  c->pay_discard = discard;
  c->pay_dst = discard ? NULL : (uint8_t *)(uintptr_t)(remote ? s[0].raddr : s[0].laddr);
  c->pay_span = s + 1;
  c->pay_nspan = n - 1;
}

static void payload_done(struct conn *c);

/* k bytes of the current destination arrived: move on, to the next span or the end. */
static void payload_advance(struct conn *c, size_t k) {
  c->pay_left -= k;
  c->pay_cur -= k;
  if (c->pay_dst) c->pay_dst += k;
  if (c->pay_left == 0) {
    payload_done(c);
    return;
  }
  if (c->pay_cur > 0) return;
  if (c->pay_nspan == 0) { /* spans shorter than the payload: cannot happen (lengths checked) */
    c->pay_cur = c->pay_left;
    c->pay_dst = NULL;
    c->pay_discard = true;
    return;
  }
  const struct stage_seg *s = c->pay_span++;
  c->pay_nspan--;
  c->pay_cur = s->len;
  c->pay_dst = c->pay_discard ? NULL : (uint8_t *)(uintptr_t)(c->pay_span_remote ? s->raddr : s->laddr);
}

/* ---- initiator side ---- */

/* A CALL's answer: its bytes into the caller's buffer (unless it gave up), or a failure
 * whose reason is the peer's text, shown printable. */
static void call_answered(struct conn *c, struct chunk *ch, const struct wire_msg *m) {
  uint32_t st = m->u.call.status, n = m->u.call.len;
  char why[1024];
  if (st == HIXL_SUCCESS && n > ch->len) {
    snprintf(why, sizeof(why), "%s answered %u bytes; at most %u were expected", c->remote_name, n, ch->len);
    link_chunk_end(ch, HIXL_FAILED, why);
  } else if (st == HIXL_SUCCESS) {
    if (!ch->req->cancelled) {
      if (n) memcpy(ch->laddr, m->u.call.data, n);
      *ch->call_len = n;
    }
    link_chunk_end(ch, HIXL_SUCCESS, "");
  } else {
    char text[200];
    size_t k = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
    for (size_t i = 0; i < k; i++) {
      uint8_t b = m->u.call.data[i];
      text[i] = b >= 0x20 && b < 0x7f ? (char)b : '?';
    }
    text[k] = '\0';
    /* Only a status hixl knows is passed on; anything else is FAILED. */
    bool known = strcmp(HixlStatusName(st), "HIXL_UNKNOWN_STATUS") != 0;
    snprintf(why, sizeof(why), "%s answered %s: %s", c->remote_name, known ? HixlStatusName(st) : "?", text);
    link_chunk_end(ch, known ? (HixlStatus)st : HIXL_FAILED, why);
  }
}

static void initiator_handle(struct conn *c, const struct wire_msg *m) {
  struct peer *p = c->peer;
  const struct xport_ops *owner = c->eng->init_owner[m->hdr.type];
  if (owner) {
    owner->initiator_frame(c, m);
    return;
  }
  if (m->hdr.type == WIRE_MEM_ADD || m->hdr.type == WIRE_MEM_DEL) {
    if (!p) return;
    if (m->hdr.type == WIRE_MEM_ADD) {
      link_peer_add_mem(p, &m->u.mem);
    } else {
      struct memtab_entry *ent = memtab_find_exact(&p->rtab, m->u.mem.addr, m->u.mem.len);
      if (ent && memtab_remove(&p->rtab, ent)) free(ent);
    }
    return;
  }
  struct chunk *ch = c->pend_head;
  static const enum wire_type expect[] = {
      [CHUNK_WRITE] = WIRE_WRITE_ACK, [CHUNK_READ] = WIRE_READ_RESP,   [CHUNK_NOTIFY] = WIRE_NOTIFY_ACK,
      [CHUNK_SYNC] = WIRE_SYNC_ACK,   [CHUNK_SWRITE] = WIRE_WRITE_ACK, [CHUNK_SREAD] = WIRE_READ_RESP,
      [CHUNK_CALL] = WIRE_CALL_RESP};
  if (!ch || m->u.ack.seq != ch->seq || m->hdr.type != (ch->answer ? ch->answer : expect[ch->kind]) ||
      (m->hdr.type == WIRE_READ_RESP && m->u.ack.status == HIXL_SUCCESS && m->hdr.payload_len != ch->len)) {
    char why[192];
    snprintf(why, sizeof(why), "protocol error: unexpected %s seq %llu", wire_type_name(m->hdr.type),
             (unsigned long long)m->u.ack.seq);
    link_conn_kill(c, HIXL_FAILED, why);
    return;
  }
  c->pend_head = ch->next_pending;
  if (!c->pend_head) c->pend_tail = NULL;
  if (m->hdr.type == WIRE_CALL_RESP) {
    call_answered(c, ch, m);
    return;
  }
  if (m->hdr.type == WIRE_READ_RESP && m->hdr.payload_len > 0) {
    c->pay_chunk = ch;
    if (ch->nsegs > 0) /* a staged READ: straight into the caller's ranges, in order */
      link_pay_spans(c, ch->segs, ch->nsegs, false, m->hdr.payload_len, ch->req->cancelled);
    else
      link_pay_single(c, ch->req->cancelled ? NULL : ch->laddr, m->hdr.payload_len);
    return;
  }
  if (ch->owner && ch->owner->answer && ch->owner->answer(c, ch, m)) return;
  if (m->u.ack.status == HIXL_SUCCESS) {
    link_chunk_end(ch, HIXL_SUCCESS, "");
    return;
  }
  char why[512];
  if (ch->kind == CHUNK_NOTIFY)
    snprintf(why, sizeof(why), "%s refused the notification (%s; %d undrained at most)", c->remote_name,
             HixlStatusName(m->u.ack.status), HIXL_MAX_NOTIFY_QUEUE);
  else
    snprintf(why, sizeof(why), "%s refused %s of remote [0x%llx, +%u): not inside memory registered there",
             c->remote_name, ch->kind == CHUNK_READ ? "READ" : "WRITE", (unsigned long long)ch->raddr,
             ch->len);
  link_chunk_end(ch,
                 m->u.ack.status == HIXL_NOTIFY_FAILED || m->u.ack.status == HIXL_RESOURCE_EXHAUSTED
                     ? (HixlStatus)m->u.ack.status
                     : HIXL_FAILED,
                 why);
}

static void payload_done(struct conn *c) {
  if (c->role == CONN_INITIATOR) {
    struct chunk *ch = c->pay_chunk;
    c->pay_chunk = NULL;
    link_chunk_end(ch, HIXL_SUCCESS, "");
  } else {
    const struct xport_ops *x = c->pay_module;
    c->pay_module = NULL;
    if (x) x->payload_done(c);
  }
}

/* Take payload bytes from buf into the current destination. */
static void payload_take(struct conn *c, const uint8_t *buf, size_t n) {
  while (n > 0 && c->pay_left > 0) {
    size_t k = n < c->pay_cur ? n : c->pay_cur;
    if (c->pay_dst) memcpy(c->pay_dst, buf, k);
    buf += k;
    n -= k;
    payload_advance(c, k);
  }
}

/* Which frame types each role accepts; anything else is a protocol error. */
static bool type_allowed(const struct HixlEngine *e, enum conn_role role, unsigned type) {
  switch (role) {
  case CONN_TARGET_HELLO: return type == WIRE_HELLO;
  case CONN_TARGET:
    return type == WIRE_NOTIFY || type == WIRE_SYNC || type == WIRE_CALL || type == WIRE_CALL_AFTER ||
           (type <= WIRE_TYPE_MAX_ && e->frame_owner[type] != NULL);
  case CONN_INITIATOR:
    return type == WIRE_WRITE_ACK || type == WIRE_READ_RESP || type == WIRE_NOTIFY_ACK ||
           type == WIRE_SYNC_ACK || type == WIRE_MEM_ADD || type == WIRE_MEM_DEL || type == WIRE_CALL_RESP ||
           (type <= WIRE_TYPE_MAX_ && e->init_owner[type] != NULL);
  }
  return false;
}

/* Parse and act on every whole frame in the receive buffer. */
static void parse_frames(struct conn *c) {
  while (!c->dead && c->pay_left == 0 && !c->stalled) {
    size_t avail = c->rx_end - c->rx_start;
    uint8_t *p = c->rxbuf + c->rx_start;
    struct wire_hdr h;
    struct wire_msg m;
    if (avail < WIRE_HDR_LEN) return;
    enum wire_err err = wire_parse_hdr(p, &h);
    if (err == WIRE_EVERSION && c->role == CONN_TARGET_HELLO && h.type == WIRE_HELLO) {
      log_error("peer speaks hixl protocol version %u, this engine speaks %u: refusing it", h.version,
                WIRE_VERSION);
      send_hello_ack(c, WIRE_HELLO_VERSION);
      link_conn_kill(c, HIXL_FAILED, "protocol version mismatch");
      return;
    }
    if (err == WIRE_OK && !type_allowed(c->eng, c->role, h.type)) {
      char why[160];
      snprintf(why, sizeof(why), "protocol error: %s is not allowed on %s link: closing this link",
               wire_type_name(h.type),
               c->role == CONN_INITIATOR ? "an initiator"
               : c->role == CONN_TARGET  ? "a target"
                                         : "a handshaking");
      log_error("%s: %s", c->remote_name[0] ? c->remote_name : "handshaking peer", why);
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    if (err != WIRE_OK) {
      char why[160];
      snprintf(why, sizeof(why), "malformed frame (%s, type %s): closing this link", wire_err_str(err),
               wire_type_name(h.type));
      log_error("%s: %s", c->remote_name[0] ? c->remote_name : "handshaking peer", why);
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    if (avail < WIRE_HDR_LEN + h.body_len) return; /* body not here yet; fits ENGINE_RXBUF */
    /* A CALL is served once every answer queued before it on this link has been sent:
     * a handler that lets memory go (the plugin's FREE) knows no earlier answer still
     * reads it. The link reads nothing more until then (fence_release). */
    if ((h.type == WIRE_CALL || h.type == WIRE_CALL_AFTER) && c->role == CONN_TARGET && c->txq_head) {
      c->call_fenced = c->stalled = true;
      conn_arm(c);
      return;
    }
    err = wire_decode(&h, p + WIRE_HDR_LEN, &m);
    if (err != WIRE_OK) {
      char why[160];
      snprintf(why, sizeof(why), "malformed %s body (%s): closing this link", wire_type_name(h.type),
               wire_err_str(err));
      log_error("%s: %s", c->remote_name[0] ? c->remote_name : "handshaking peer", why);
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    c->rx_start += WIRE_HDR_LEN + h.body_len;
    if (c->role == CONN_INITIATOR)
      initiator_handle(c, &m);
    else
      target_handle(c, &m);
    if (c->dead) return;
    if (c->pay_left > 0) {
      size_t have = c->rx_end - c->rx_start;
      size_t n = have < c->pay_left ? have : c->pay_left;
      c->rx_start += n;
      payload_take(c, c->rxbuf + c->rx_start - n, n);
    }
  }
}

static void conn_on_readable(struct conn *c) {
  size_t budget = LINK_READ_BUDGET;
  while (!c->dead && !c->stalled && budget > 0) {
    ssize_t k;
    /* Stream the payload straight into its destination; many small spans (a staged
     * unit of small ops) go through the receive buffer instead: one recv, not one per span. */
    if (c->pay_left > 0 && !c->pay_discard && c->pay_chunk && c->pay_chunk->req->cancelled) {
      c->pay_dst = NULL; /* the caller gave up: the rest is dropped */
      c->pay_discard = true;
    }
    if (c->pay_left > 0 && c->rx_start == c->rx_end &&
        (c->pay_nspan == 0 || c->pay_cur >= LINK_SPAN_DIRECT)) {
      size_t want = c->pay_cur;
      uint8_t *dst = c->pay_dst;
      if (!dst) {
        dst = c->eng->scratch;
        if (want > sizeof(c->eng->scratch)) want = sizeof(c->eng->scratch);
      }
      k = recv(c->fd, dst, want, MSG_DONTWAIT);
      if (k > 0) {
        sock_hb_received(c->fd);
        payload_advance(c, (size_t)k);
        budget = (size_t)k > budget ? 0 : budget - (size_t)k;
        if ((size_t)k < want) break; /* drained: epoll or the driver's poll says when there is more */
        continue;
      }
    } else {
      if (c->rx_start > 0) {
        memmove(c->rxbuf, c->rxbuf + c->rx_start, c->rx_end - c->rx_start);
        c->rx_end -= c->rx_start;
        c->rx_start = 0;
      }
      size_t room = ENGINE_RXBUF - c->rx_end;
      /* No payload under way: the next bytes begin a frame. While payloads are large,
       * read a little, so that one behind its header is received in place rather than
       * copied out of here (a full buffer read would take most of a 256 KiB op's bytes,
       * and a receiver behind its sender would copy nearly every byte twice). While
       * they are small, read all there is: many frames per recv, not one per op (a
       * batch of 16 KiB ops lost half its throughput to one recv per frame). */
      if (c->pay_left == 0 && c->pay_last >= LINK_PAY_LARGE && room > LINK_FRAME_READ) room = LINK_FRAME_READ;
      k = recv(c->fd, c->rxbuf + c->rx_end, room, MSG_DONTWAIT);
      if (k > 0) {
        sock_hb_received(c->fd);
        c->rx_end += (size_t)k;
        if (c->pay_left > 0) { /* the rest of a payload first */
          size_t have = c->rx_end - c->rx_start, n = have < c->pay_left ? have : c->pay_left;
          c->rx_start += n;
          payload_take(c, c->rxbuf + c->rx_start - n, n);
        }
        parse_frames(c);
        budget = (size_t)k > budget ? 0 : budget - (size_t)k;
        if ((size_t)k < room && c->pay_left == 0) break; /* drained */
        continue;
      }
    }
    if (k == 0) {
      link_conn_kill(c, HIXL_FAILED, "peer closed the connection");
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      char why[128];
      snprintf(why, sizeof(why), "receive failed: %s", strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
    }
    break;
  }
  if (!c->dead && c->txq_head) link_flush(c);
}

void link_rearm(struct conn *c) {
  if (!c->dead) conn_arm(c);
}

void link_resume(struct conn *c) {
  conn_arm(c);
  parse_frames(c);
  if (!c->dead) link_flush(c);
}

/* Apply control frames already waiting on c's socket (MEM_ADD / MEM_DEL above all)
 * unless a driving caller reads it. An RDMA initiator must not post against a
 * registration the target has already withdrawn: the NIC would answer with a remote
 * access error, which breaks the QP. Lock held. */
void link_take_pending(struct conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN};
  if (c->dead || c->rx == RX_CALLER || poll(&p, 1, 0) <= 0) return;
  conn_on_readable(c);
}

/* Whether c is still up, looking at the socket now rather than waiting for the
 * progress thread to see a hang-up (a parked link is read by nobody). Lock held. */
bool link_alive(struct conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
  if (c->dead) return false;
  if (c->rx == RX_CALLER || poll(&p, 1, 0) <= 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
    return true;
  if (c->rx == RX_PARKED) link_unpark(c);
  conn_on_readable(c); /* takes what is left, then the end of the stream */
  return !c->dead;
}

/* ---- a sync caller receiving its own answers ---- */

/* Receive on c from the calling thread until r ends, c dies or r's deadline passes.
 * The answer then wakes the caller directly instead of the progress thread, which
 * would have to wake the caller in turn. Lock held; released while polling. Only one
 * caller drives a link; others wait on the condition variable as usual. */
void link_drive(struct conn *c, struct hixl_transfer_req *r) {
  struct HixlEngine *e = c->eng;
  enum chunk_kind k0 = r->chunks[0].kind;
  bool data = k0 != CHUNK_NOTIFY && k0 != CHUNK_SYNC && k0 != CHUNK_CALL;
  if (data && c->xp->drive && !c->dead) { /* the transport moves it, or watches it move */
    c->xp->drive(c, r);                   /* c may be gone afterwards */
    return;
  }
  if (c->dead || c->rx == RX_CALLER) return;
  bool was_progress = c->rx == RX_PROGRESS;
  c->rx = RX_CALLER;
  if (was_progress) conn_arm(c); /* a parked link needs no epoll change */
  while (r->outstanding > 0 && !c->dead) {
    uint64_t now = hixl_now_ns();
    if (now >= r->deadline_ns) break;
    int ms = (int)((r->deadline_ns - now + 999999) / 1000000);
    struct pollfd p = {.fd = c->fd, .events = (short)(POLLIN | (c->txq_head ? POLLOUT : 0))};
    pthread_mutex_unlock(&e->lock);
    int n = poll(&p, 1, ms);
    pthread_mutex_lock(&e->lock);
    if (n <= 0 || c->dead) continue;
    if (p.revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) conn_on_readable(c);
    if (!c->dead && (p.revents & POLLOUT)) link_flush(c);
    const struct xport_ops *sx = e->mods[XPORT_STAGE];
    if (sx && sx->progress) sx->progress(e); /* buffers our answers freed go to the next units at once */
  }
  if (c->dead) {
    conn_bury(c);
    return;
  }
  /* Park when nothing is owed to anyone; otherwise the progress thread reads on. */
  c->rx = c->pend_head || c->pay_left || c->txq_head || c->always_read ? RX_PROGRESS : RX_PARKED;
  if (c->rx == RX_PROGRESS) conn_arm(c);
}

/* ---- progress thread ---- */

static void accept_all(struct HixlEngine *e) {
  for (;;) {
    int fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        log_warn("accept on %s: %s", e->local_name, strerror(errno));
      return;
    }
    sock_tune(fd);
    struct conn *c = link_conn_new(e, fd, CONN_TARGET_HELLO);
    if (!c || link_conn_watch(c) < 0) {
      log_error("cannot take a new link on %s: out of resources", e->local_name);
      if (c) {
        free(c->rxbuf);
        free(c);
      }
      close(fd);
    }
  }
}

static void *progress_main(void *arg) {
  struct HixlEngine *e = arg;
  struct epoll_event evs[64];
  int wait_ms = -1; /* 0 while async shm copies are queued */
  for (;;) {
    int n = epoll_wait(e->epfd, evs, 64, wait_ms);
    if (n < 0 && errno != EINTR) {
      log_error("epoll_wait: %s", strerror(errno));
      break;
    }
    pthread_mutex_lock(&e->lock);
    if (e->stopping) {
      pthread_mutex_unlock(&e->lock);
      break;
    }
    for (int i = 0; i < n; i++) {
      void *ptr = evs[i].data.ptr;
      if (ptr == &e->listen_fd) {
        accept_all(e);
      } else if (ptr >= (void *)e->mods && ptr < (void *)(e->mods + XPORT_MODS)) {
        const struct xport_ops *x = *(const struct xport_ops *const *)ptr;
        x->on_event(e);
      } else if (ptr == &e->evfd) {
        uint64_t v;
        (void)!read(e->evfd, &v, sizeof(v));
      } else {
        struct conn *c = ptr;
        if (c->dead) continue;
        uint32_t ev = evs[i].events;
        if (c->rx == RX_PARKED && (ev & (EPOLLRDHUP | EPOLLERR | EPOLLHUP))) link_unpark(c); /* hung up */
        if (c->rx == RX_PROGRESS && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP))) conn_on_readable(c);
        if (!c->dead && (ev & EPOLLOUT)) link_flush(c);
      }
    }
    bool more = false; /* one step per link, then events get a turn */
    for (int m = 0; m < XPORT_MODS; m++)
      if (e->mods[m] && e->mods[m]->progress) more |= e->mods[m]->progress(e);
    wait_ms = more ? 0 : -1;
    link_free_graveyard(e);
    pthread_mutex_unlock(&e->lock);
  }
  return NULL;
}

int link_watch_listener(struct HixlEngine *e) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &e->listen_fd};
  return epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->listen_fd, &ev);
}

int link_start(struct HixlEngine *e, HixlStatus *st) {
  (void)st;
  struct epoll_event ev = {.events = EPOLLIN};
  memset(e->frame_owner, 0, sizeof(e->frame_owner));
  for (int i = 0; i < XPORT_MODS; i++)
    for (const uint8_t *t = e->mods[i]->frames; t && *t; t++) e->frame_owner[*t] = e->mods[i];
  memset(e->init_owner, 0, sizeof(e->init_owner));
  for (int i = 0; i < XPORT_MODS; i++)
    for (const uint8_t *t = e->mods[i]->init_frames; t && *t; t++) e->init_owner[*t] = e->mods[i];
  e->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (e->epfd < 0) goto err;
  e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->evfd < 0) goto close_ep;
  ev.data.ptr = &e->evfd;
  if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->evfd, &ev) < 0) goto close_ev;
  if (e->listen_fd >= 0 && link_watch_listener(e) < 0) goto close_ev;
  for (int i = 0; i < XPORT_MODS; i++) {
    const struct xport_ops *x = e->mods[i];
    int fd = x && x->event_fd ? x->event_fd(e) : -1;
    if (fd < 0) continue;
    ev.data.ptr = (void *)&e->mods[i];
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) goto close_ev;
  }
  if (pthread_create(&e->thread, NULL, progress_main, e) != 0) goto close_ev;
  return 0;
close_ev:
  close(e->evfd);
  e->evfd = -1;
close_ep:
  close(e->epfd);
  e->epfd = -1;
err:
  return -1;
}

/* Stop the thread, then end every link. Called with the lock NOT held. */
void link_stop(struct HixlEngine *e) {
  uint64_t one = 1;
  pthread_mutex_lock(&e->lock);
  e->stopping = true;
  (void)!write(e->evfd, &one, sizeof(one));
  pthread_mutex_unlock(&e->lock);
  pthread_join(e->thread, NULL);
  pthread_mutex_lock(&e->lock);
  while (e->conns) link_conn_kill(e->conns, HIXL_FAILED, "local engine finalized");
  link_free_graveyard(e);
  pthread_mutex_unlock(&e->lock);
  close(e->evfd);
  close(e->epfd);
  e->evfd = e->epfd = -1;
}
