/* link_progress: reading links: the progress thread, a sync caller driving a link, start and stop. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/thread.h"

#define LINK_READ_BUDGET (32u << 20)  /* bytes per event before other links get a turn */
#define LINK_SPAN_DIRECT (16u << 10)  /* spans at least this long are received in place */
#define LINK_FRAME_READ  (16u << 10)  /* bytes read at once while no payload is under way, */
#define LINK_PAY_LARGE   (128u << 10) /* ... once a payload was at least this long */

/* ---- reading a link ---- */

static void conn_on_readable(struct conn *c) {
  size_t budget = LINK_READ_BUDGET;
  if (c->rail >= 0) c->last_io_ns = hixl_now_ns(); /* a rail that stalls gets no events at all */
  while (!c->dead && !c->stall && budget > 0) {
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
        link_payload_land(c, dst, (size_t)k);
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
          link_payload_take(c, c->rxbuf + c->rx_start - n, n);
        }
        link_parse_frames(c);
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
  if (!c->dead) link_conn_arm(c);
}

void link_resume(struct conn *c) {
  link_conn_arm(c);
  link_parse_frames(c);
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

/* ---- device copies (docs/device-memory.md) ---- */

#define DEVQ_STEP_JOBS 8 /* copies per step (8 MiB at most), then events get a turn */

/* A target job's answer, ready to go (with buf, its payload, from the pool). */
static void devq_answer(struct conn *c, struct txitem *it, enum wire_type type, uint64_t seq, uint32_t st,
                        uint8_t *buf, uint32_t len) {
  it->hdr_len = (uint32_t)wire_put_ack(it->hdr, type, seq, st, buf ? len : 0);
  if (buf) {
    it->payload = it->own_payload = buf;
    it->payload_len = len;
    it->pool_payload = true;
    it->queued += len; /* what the link owes counts its payload too */
    c->answers_queued += len;
  }
  it->unready = false;
}

/* A job that got no buffer (no memory, pinning failed) ends with st. */
static void devq_fail(struct HixlEngine *e, struct devjob *j, HixlStatus st, const char *why) {
  struct conn *c = j->c;
  struct chunk *ch = j->ch;
  if (j->kind == DJ_T_READ) {
    log_warn("READ of device memory [0x%llx, +%u) for %s failed: %s", (unsigned long long)j->dev, j->len,
             c->remote_name, why);
    devq_answer(c, j->it, WIRE_READ_RESP, j->seq, HIXL_FAILED, NULL, 0);
    link_devq_drop(e, j);
    link_flush(c);
    return;
  }
  link_txq_unlink(c, &ch->tx); /* its frame never leaves */
  link_devq_drop(e, j);
  link_chunk_end(ch, st, why);
}

/* Buffers for the jobs waiting for one, in order: the first that finds none holds back
 * the rest. An initiator READ's frame then goes (nothing to copy first). A flush here
 * may kill a link, and with it jobs: the walk starts again from the head. */
static void devq_feed(struct HixlEngine *e) {
  struct devq *q = &e->devq;
again:
  for (struct devjob *j = q->head; j && q->waiting > 0; j = j->next) {
    if (!j->needs_buf) continue;
    if (link_devbuf_capped(j->c)) { /* its link holds its share: others' jobs go on */
      devmem_pool_waited(q->pool);
      continue;
    }
    char why[256] = "";
    uint8_t *b = link_devbuf_get(j->c, j->reg->device, false, why, sizeof(why));
    if (!b && q->pool && devmem_pool_empty(q->pool)) return; /* all in use: it waits */
    if (!b) {
      devq_fail(e, j, HIXL_RESOURCE_EXHAUSTED, why);
      goto again;
    }
    j->buf = b;
    j->needs_buf = false;
    q->waiting--;
    if (j->kind == DJ_ASK) { /* the buffer is its chunk's now, its frame can go */
      struct conn *c = j->c;
      j->ch->bounce = b;
      j->ch->tx.unready = false;
      j->buf = NULL;
      link_devq_drop(e, j);
      link_flush(c);
      goto again;
    }
  }
}

/* A copy made with the lock released has returned (cst, cwhy): its frame goes, or its
 * chunk ends; a job whose link died meanwhile (lost) ends as the link did. */
static void devq_done(struct HixlEngine *e, struct devjob *j, HixlStatus cst, const char *cwhy) {
  struct conn *c = j->c;
  struct chunk *ch = j->ch;
  struct txitem *it = j->it;
  bool ok = cst == HIXL_SUCCESS, lost = j->lost;
  HixlStatus st = lost ? j->st : cst;
  char why[256];
  snprintf(why, sizeof(why), "%s", lost ? j->why : cwhy);
  j->running = false;
  switch (j->kind) {
  case DJ_SEND:
    if (!lost && ok) {
      ch->tx.payload = ch->tx.own_payload = j->buf;
      ch->tx.pool_payload = true;
      ch->tx.unready = false;
      j->buf = NULL;
      link_devq_drop(e, j);
      link_flush(c);
      return;
    }
    if (!lost) link_txq_unlink(c, &ch->tx);
    link_devq_drop(e, j);
    link_chunk_end(ch, st, why);
    return;
  case DJ_LAND:
    link_devq_drop(e, j);
    link_chunk_end(ch, cst, cwhy); /* the bytes are in device memory even if the link went since */
    return;
  case DJ_T_LAND:
  case DJ_T_READ:
    if (!lost && !ok)
      log_warn("%s device memory [0x%llx, +%u) for %s failed: %s",
               j->kind == DJ_T_LAND ? "WRITE into" : "READ of", (unsigned long long)j->dev, j->len,
               c->remote_name, cwhy);
    if (!lost && j->kind == DJ_T_LAND) {
      if (!ok) link_write_refused(c, j->seq);
      devq_answer(c, it, WIRE_WRITE_ACK, j->seq, ok ? HIXL_SUCCESS : HIXL_FAILED, NULL, 0);
    } else if (!lost) {
      devq_answer(c, it, WIRE_READ_RESP, j->seq, ok ? HIXL_SUCCESS : HIXL_FAILED, ok ? j->buf : NULL, j->len);
      if (ok) j->buf = NULL; /* the answer's until sent */
    }
    link_devq_drop(e, j);
    if (lost)
      link_txitem_done(c, it);
    else
      link_flush(c);
    return;
  case DJ_ASK: return; /* never copied */
  }
}

/* Target links stalled while the pool was empty read again, while it has buffers. */
static void devq_resume(struct HixlEngine *e) {
  struct devq *q = &e->devq;
  q->resume = false;
  uint32_t walk = ++e->walks;
  for (struct conn *c; q->stalls > 0 && !devmem_pool_empty(q->pool) && (c = link_next(e, walk));) {
    if (!(c->stall & LINK_STALL_DEVMEM) || link_devbuf_capped(c)) continue;
    c->stall &= (uint8_t)~LINK_STALL_DEVMEM;
    q->stalls--;
    link_resume(c);
  }
}

/* Target link c took a buffer: with none left in the pool, or its share of them held,
 * it reads no more frames until one is back. */
static void devq_pause(struct conn *c) {
  struct devq *q = &c->eng->devq;
  if (c->dead || (c->stall & LINK_STALL_DEVMEM) || !q->pool) return;
  if (!devmem_pool_empty(q->pool) && !link_devbuf_capped(c)) return;
  c->stall |= LINK_STALL_DEVMEM;
  q->stalls++;
  link_conn_arm(c);
}

/* Whether the thread reaping for only (a sync caller's link; NULL: the copier or the
 * progress thread, for the links no caller drives) runs or ends j. A lost job's link
 * is dead: anyone ends it. */
static bool devq_ours(const struct devjob *j, const struct conn *only) {
  return only ? j->c == only : j->lost || j->c->rx != RX_CALLER;
}

/* The stream c copies on for device, made at its first asynchronous copy there; NULL:
 * none could be made (said once), and its copies there are synchronous. Without the
 * engine lock (a stream is made by a thread copying with it released). */
static void *devq_stream(struct HixlEngine *e, const struct devmem_ops *dm, struct conn *c, int device) {
  void *s = NULL;
  pthread_mutex_lock(&e->devq.stream_lock);
  uint32_t i = 0;
  while (i < c->ndevstreams && c->devstream[i].device != device) i++;
  if (i < c->ndevstreams) {
    s = c->devstream[i].stream;
  } else if (i < LINK_DEV_STREAMS) {
    char why[256] = "";
    if (dm->stream_new(device, &s, why, sizeof(why)) != HIXL_SUCCESS) {
      s = NULL;
      log_warn("engine %s: no stream for device %d on the link to %s (%s): its copies there are synchronous",
               engine_name(e), device, c->remote_name, why);
    }
    c->devstream[i].device = device;
    c->devstream[i].stream = s;
    c->ndevstreams++;
  }
  pthread_mutex_unlock(&e->devq.stream_lock);
  return s;
}

/* A stream's copy ended, on the provider's thread: no lock taken here (a callback must
 * not wait on anything that may wait on device work). j goes on the copied stack for
 * its reaper; the copier and sync callers are rung; inflight drops last. */
static void devq_copied(void *arg, HixlStatus st, const char *why) {
  struct devjob *j = arg;
  struct HixlEngine *e = j->c->eng;
  struct devq *q = &e->devq;
  uint64_t one = 1;
  j->cst = st;
  snprintf(j->cwhy, sizeof(j->cwhy), "%s", why ? why : "");
  struct devjob *h = __atomic_load_n(&q->copied, __ATOMIC_RELAXED);
  do j->copied_next = h;
  while (!__atomic_compare_exchange_n(&q->copied, &h, j, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
  /* j is its reaper's from here on */
  (void)!write(q->copier_fd, &one, sizeof(one));
  (void)!write(q->evfd, &one, sizeof(one));
  if (!__atomic_load_n(&q->copier_up, __ATOMIC_ACQUIRE)) link_wake(e); /* the progress thread starts it */
  __atomic_sub_fetch(&q->inflight, 1, __ATOMIC_RELEASE); /* the last touch: Finalize may end the engine */
}

/* The jobs of only's (as devq_ours) whose stream copy ended: their frames go, their
 * chunks end. Ending one may end links and jobs: the walk starts again each time. */
static void devq_reap(struct HixlEngine *e, struct conn *only) {
  for (struct devjob *j = __atomic_exchange_n(&e->devq.copied, NULL, __ATOMIC_ACQUIRE); j; j = j->copied_next)
    j->copied = true; /* each reaper ends its own links' below; the others wait for theirs */
again:
  for (struct devjob *j = e->devq.head; j; j = j->next)
    if (j->copied && devq_ours(j, only)) {
      j->copied = false;
      devq_done(e, j, j->cst, j->cwhy);
      goto again;
    }
}

/* Up to DEVQ_STEP_JOBS copies of only's jobs (as devq_ours), the lock released: started
 * on the link's stream where the provider has streams (a stream per link and device,
 * so links' copies run at once and each link's in order; their ends are reaped later),
 * else made here, one after another. Then the copies that ended are reaped. */
bool link_devq_step(struct HixlEngine *e, struct conn *only) {
  struct devq *q = &e->devq;
  struct devjob *mine[DEVQ_STEP_JOBS];
  size_t n = 0;
  devq_feed(e);
  for (struct devjob *j = q->head; j && n < DEVQ_STEP_JOBS; j = j->next)
    if (!j->running && j->buf && devq_ours(j, only) && !j->lost) {
      j->running = true;
      mine[n++] = j;
    }
  if (n > 0) {
    HixlStatus st[DEVQ_STEP_JOBS];
    char why[DEVQ_STEP_JOBS][256];
    bool started[DEVQ_STEP_JOBS];
    const struct devmem_ops *dm = devmem_get(NULL, 0);
    bool async = dm && dm->copy_async;
    q->copying++;
    if (async)
      __atomic_add_fetch(&q->inflight, (uint32_t)n, __ATOMIC_RELAXED); /* those not started come off below */
    pthread_mutex_unlock(&e->lock); /* the jobs are this thread's; their links may die meanwhile */
    for (size_t k = 0; k < n; k++) {
      struct devjob *j = mine[k];
      bool out = j->kind == DJ_SEND || j->kind == DJ_T_READ;
      void *s = async ? devq_stream(e, dm, j->c, j->reg->device) : NULL;
      why[k][0] = '\0';
      started[k] = s && dm->copy_async(s, j->reg->device, !out, j->dev, j->buf, j->len, devq_copied, j,
                                       why[k], sizeof(why[k])) == HIXL_SUCCESS;
      if (started[k]) continue; /* j is its stream's now: not touched here again */
      if (s) log_debug("a device copy did not start on its stream (%s): made here", why[k]);
      why[k][0] = '\0';
      if (out)
        st[k] = xport_devmem_out(j->reg, j->dev, j->buf, j->len, why[k], sizeof(why[k]));
      else
        st[k] = xport_devmem_in(j->reg, j->dev, j->buf, j->len, why[k], sizeof(why[k]));
    }
    pthread_mutex_lock(&e->lock);
    for (size_t k = 0; k < n; k++)
      if (!started[k]) {
        if (async) __atomic_sub_fetch(&q->inflight, 1, __ATOMIC_RELAXED);
        devq_done(e, mine[k], st[k], why[k]);
      }
    if (--q->copying == 0) pthread_cond_broadcast(&e->cond);
  }
  devq_reap(e, only);
  /* Stalled target links read again where frames may be parsed: a sync caller here, the
   * progress thread in link_devq_kick (link_devbuf_put woke it); never the copier. */
  if (q->resume && only) devq_resume(e);
  for (struct devjob *j = q->head; j; j = j->next)
    if (!j->running && j->buf && devq_ours(j, only) && !j->lost) return true;
  return false;
}

/* Wait, the engine lock released, until copier_fd rings (at most ms; -1: no bound),
 * and take its rings. */
static void devq_wait_ring(struct HixlEngine *e, int ms) {
  struct pollfd p = {.fd = e->devq.copier_fd, .events = POLLIN};
  uint64_t v;
  pthread_mutex_unlock(&e->lock);
  if (poll(&p, 1, ms) > 0) (void)!read(e->devq.copier_fd, &v, sizeof(v));
  pthread_mutex_lock(&e->lock);
}

/* The copier: steps while jobs can run, then waits to be rung (a kick, a copy's end). */
static void *devq_copier_main(void *arg) {
  struct HixlEngine *e = arg;
  struct devq *q = &e->devq;
  pthread_mutex_lock(&e->lock);
  while (!q->copier_stop) /* a step releases the lock: stop may have come meanwhile (it rings too) */
    if (!link_devq_step(e, NULL) && !q->copier_stop) devq_wait_ring(e, -1);
  pthread_mutex_unlock(&e->lock);
  return NULL;
}

static void devq_ring(struct devq *q) {
  uint64_t one = 1;
  (void)!write(q->copier_fd, &one, sizeof(one));
}

void link_devq_kick(struct HixlEngine *e) {
  struct devq *q = &e->devq;
  if (q->resume) devq_resume(e); /* frames waiting on stalled links parsed here, not by the copier */
  if (q->copier_stop || !q->head) return;
  if (!q->copier_up) {
    int rc = pthread_create(&q->copier, NULL, devq_copier_main, e);
    if (rc != 0) { /* the progress thread copies, as it can */
      log_warn("engine %s: no thread for device copies (%s): the progress thread runs them", engine_name(e),
               strerror(rc));
      link_devq_step(e, NULL);
      return;
    }
    __atomic_store_n(&q->copier_up, true, __ATOMIC_RELEASE);
    thread_name(q->copier, "hixl-devcopy");
  }
  if (!q->news) return; /* nothing it has not seen: it steps on, or a copy's end wakes it */
  q->news = false;
  devq_ring(q);
}

void link_devq_fini(struct HixlEngine *e) {
  struct devq *q = &e->devq;
  q->copier_stop = true;
  if (q->copier_up) { /* its step ends (the jobs of links killed since end as lost), then it sees stop */
    devq_ring(q);
    pthread_mutex_unlock(&e->lock);
    pthread_join(q->copier, NULL);
    pthread_mutex_lock(&e->lock);
    __atomic_store_n(&q->copier_up, false, __ATOMIC_RELEASE);
  }
  while (q->copying > 0) pthread_cond_wait(&e->cond, &e->lock); /* a sync caller's copy returns first */
  /* The streams' copies end (a device's copy always does), each ringing copier_fd; their
   * links are dead: the jobs are lost, and end here as their links did. */
  while (__atomic_load_n(&q->inflight, __ATOMIC_ACQUIRE) > 0) devq_wait_ring(e, 100);
  devq_reap(e, NULL);
  while (q->head) link_devq_drop(e, q->head); /* none: every link is gone, and its jobs with it */
  devmem_pool_free(q->pool);
  q->pool = NULL;
}

void link_dev_post(struct conn *c, struct chunk *ch) {
  struct HixlEngine *e = c->eng;
  struct devjob *j = calloc(1, sizeof(*j));
  if (!j) {
    link_chunk_end(ch, HIXL_RESOURCE_EXHAUSTED, "out of memory for a device op's copy");
    return;
  }
  *j = (struct devjob){.c = c,
                       .kind = ch->kind == CHUNK_WRITE ? DJ_SEND : DJ_ASK,
                       .ch = ch,
                       .it = &ch->tx,
                       .reg = ch->lreg,
                       .dev = (uintptr_t)ch->laddr,
                       .len = ch->len};
  ch->dj = j;
  link_enqueue(c, &ch->tx);
  ch->tx.unready = true;
  link_devq_add(e, j);
  if (j->kind == DJ_ASK && (ch->bounce || (e->devq.waiting == 1 && !link_devbuf_capped(c) &&
                                           (!e->devq.pool || !devmem_pool_empty(e->devq.pool))))) {
    char why[256] = "";
    uint8_t *b = ch->bounce ? ch->bounce : link_devbuf_get(c, ch->lreg->device, false, why, sizeof(why));
    if (b) { /* its frame can go now (a chunk posted again on a rail keeps its buffer): the submitter sends it
              */
      ch->bounce = b;
      ch->tx.unready = false;
      link_devq_drop(e, j);
      return;
    }
  }
  link_wake(e); /* the progress thread, or the caller driving c, copies it */
}

uint8_t *link_dev_landing(struct conn *c, const struct hixl_mem_reg *r, uint32_t len) {
  char why[256] = "";
  /* A pool buffer holds one chunk, as hixl's initiators split device ops: a longer
   * frame (a peer's own; the wire takes 4 MiB) would overrun it. Refused, unlogged: the
   * peer hears it in the answer. */
  if (len > ENGINE_TCP_CHUNK) return NULL;
  /* Never refused for want of a pool buffer: one beyond the pool when it is out or this
   * link holds its share (the link then stalls until one is back, devq_pause), so no
   * link's WRITE fails and none takes more than its share of the pool. */
  uint8_t *b = link_devbuf_get(c, r->device, true, why, sizeof(why));
  if (!b) log_warn("a WRITE into device memory from %s is refused: %s", c->remote_name, why);
  return b;
}

void link_dev_landed(struct conn *c, struct link_pay *pay) {
  struct HixlEngine *e = c->eng;
  struct devjob *j = calloc(1, sizeof(*j));
  struct txitem *it = j ? calloc(1, sizeof(*it)) : NULL;
  if (!it) {
    free(j);
    link_conn_kill(c, HIXL_FAILED, "out of memory"); /* it releases what pay holds */
    return;
  }
  *j = (struct devjob){.c = c,
                       .kind = DJ_T_LAND,
                       .it = it,
                       .reg = pay->reg, /* held until copied */
                       .dev = pay->dst,
                       .buf = pay->bounce,
                       .len = pay->len,
                       .seq = pay->seq};
  pay->reg = NULL;
  pay->bounce = NULL;
  it->hdr_len = (uint32_t)wire_put_ack(it->hdr, WIRE_WRITE_ACK, j->seq, HIXL_SUCCESS, 0);
  link_enqueue(c, it);
  it->unready = true; /* answers behind it wait: they keep their order */
  link_devq_add(e, j);
  devq_pause(c);
  link_wake(e);
}

void link_dev_read(struct conn *c, struct hixl_mem_reg *r, uint64_t seq, uint64_t raddr, uint32_t len) {
  struct HixlEngine *e = c->eng;
  if (len > ENGINE_TCP_CHUNK) { /* a pool buffer holds one chunk: a longer copy would overrun it */
    uint8_t frame[WIRE_SMALL_FRAME];
    if (link_queue_small(c, frame, wire_put_ack(frame, WIRE_READ_RESP, seq, HIXL_FAILED, 0), NULL, 0, NULL) <
        0)
      link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  struct devjob *j = calloc(1, sizeof(*j));
  struct txitem *it = j ? calloc(1, sizeof(*it)) : NULL;
  if (!it) {
    free(j);
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  *j = (struct devjob){.c = c, .kind = DJ_T_READ, .it = it, .reg = r, .dev = raddr, .len = len, .seq = seq};
  it->hdr_len = (uint32_t)wire_put_ack(it->hdr, WIRE_READ_RESP, seq, HIXL_FAILED, 0);
  it->reg = r; /* held until its answer is sent */
  r->inflight++;
  link_enqueue(c, it);
  it->unready = true;
  link_devq_add(e, j);
  devq_pause(c);
  link_wake(e);
}

/* ---- a sync caller receiving its own answers ---- */

/* A sync caller waits for r on c: a data transfer goes to its transport's drive hook
 * (which moves it, watches it move, or reads the socket: link_drive_socket); frames of
 * the link's own (notifications, syncs, calls) are read from the socket. */
void link_drive(struct conn *c, struct hixl_transfer_req *r) {
  enum chunk_kind k0 = r->chunks[0].kind;
  bool data = k0 != CHUNK_NOTIFY && k0 != CHUNK_SYNC && k0 != CHUNK_CALL;
  if (data && !c->dead)
    c->xp->link.drive(c, r); /* c may be gone afterwards */
  else
    link_drive_socket(c, r);
}

#define POLL_SKIP_MAX   64u               /* PollUs back-off: at most this many sleeps between two polls */
#define POLL_YIELD_LONG (1000u * 1000u)   /* a yield this long gave the CPU to another task */
#define POLL_CONTENDED  (100u * 1000000u) /* then no polling for this long */

/* A poller's yield between two empty polls, timed: true when it lasted POLL_YIELD_LONG
 * or more, so another task that wanted this CPU had it, and *quiet becomes the end of a
 * POLL_CONTENDED pause of polling. While such a task runs, a poller is runnable but not
 * running when its event comes, and the event waits for the rest of that task's time
 * slice (milliseconds), where a thread asleep in epoll or poll is woken ahead of it: a
 * sync READ of 4 KiB over loopback with a CPU-bound process beside the target moved
 * 0.001 GB/s polling against 0.049 sleeping. */
static bool poll_yield(uint64_t *quiet) {
  uint64_t t0 = hixl_now_ns();
  sched_yield();
  uint64_t t1 = hixl_now_ns();
  if (t1 - t0 < POLL_YIELD_LONG) return false;
  *quiet = t1 + POLL_CONTENDED;
  return true;
}

/* PollUs back-off, after a poll window (HIT: what was awaited came within it). A miss
 * doubles the windows skipped (1, 3, 7, ... POLL_SKIP_MAX), so sparse traffic, whose
 * windows only burn the CPU, soon opens one in 64 at most; a hit opens the next. */
static void poll_backoff(uint32_t *skip, uint32_t *left, bool hit) {
  *skip = hit ? 0 : *skip * 2u + 1u < POLL_SKIP_MAX ? *skip * 2u + 1u : POLL_SKIP_MAX;
  *left = *skip;
}

/* Receive on c from the calling thread until r ends, c dies or r's deadline passes.
 * The answer then wakes the caller directly instead of the progress thread, which
 * would have to wake the caller in turn. Lock held; released while polling. Only one
 * caller drives a link; others wait on the condition variable as usual. */
void link_drive_socket(struct conn *c, struct hixl_transfer_req *r) {
  struct HixlEngine *e = c->eng;
  if (c->dead || c->rx == RX_CALLER) return;
  bool was_progress = c->rx == RX_PROGRESS;
  c->rx = RX_CALLER;
  if (was_progress) link_conn_arm(c); /* a parked link needs no epoll change */
  /* PollUs: for that long the caller polls its socket with no wait, yielding the CPU
   * between polls, so that an answer within it finds the caller awake (no wake-up). Not
   * while this engine's progress thread or copier has copies to run (the answer waits
   * for them, and they may need this CPU), nor for the next spin_left calls after
   * answers that came too late for it (the back-off doubles at each, up to
   * POLL_SKIP_MAX calls; an answer within it clears it), nor while another task wants
   * this CPU (poll_yield: the link's spin_quiet). */
  uint64_t poll_end = 0, t0 = e->opts.poll_us ? hixl_now_ns() : 0;
  if (e->opts.poll_us && c->spin_left > 0)
    c->spin_left--;
  else if (e->opts.poll_us && t0 >= c->spin_quiet)
    poll_end = t0 + (uint64_t)e->opts.poll_us * 1000u;
  while (r->outstanding > 0 && !c->dead) {
    uint64_t now = hixl_now_ns();
    if (now >= r->deadline_ns) break;
    if (c->devjobs > 0) { /* its device copies, the lock released meanwhile */
      bool more = link_devq_step(e, c);
      if (more || r->outstanding == 0 || c->dead) continue;
    }
    int ms = (int)((r->deadline_ns - now + 999999) / 1000000);
    if (c->rail >= 0 && ms > 10) ms = 10; /* a rail that fails moves r's chunks to others: look again soon */
    if (c->devjobs > 0 && ms > 1) ms = 1; /* copies another thread runs, or buffers awaited */
    bool out = c->txq_head && !c->txq_head->unready;
    /* The socket, and where copies run on streams the eventfd their ends ring. */
    struct pollfd p[2] = {{.fd = c->fd, .events = (short)(POLLIN | (out ? POLLOUT : 0))},
                          {.fd = e->devq.evfd, .events = POLLIN}};
    nfds_t np = c->devjobs > 0 && __atomic_load_n(&e->devq.inflight, __ATOMIC_RELAXED) > 0 ? 2 : 1;
    bool spin = now < poll_end && !e->prog_busy && c->devjobs == 0;
    uint64_t quiet = 0;
    pthread_mutex_unlock(&e->lock);
    int n = poll(p, np, spin ? 0 : ms);
    bool contended = n == 0 && spin && poll_yield(&quiet);
    engine_lock_caller(e);
    if (contended) { /* the call sleeps from now on, and the link's next ones too for a while */
      c->spin_quiet = quiet;
      poll_end = 0;
      e->pstats.contended++;
    }
    if (np == 2 && (p[1].revents & POLLIN)) {
      uint64_t v;
      (void)!read(e->devq.evfd, &v, sizeof(v)); /* its jobs are reaped at the loop's top */
    }
    if (n <= 0 || c->dead) continue;
    if (p[0].revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) conn_on_readable(c);
    if (!c->dead && (p[0].revents & POLLOUT)) link_flush(c);
    const struct xport_ops *sx = e->mods[XPORT_STAGE];
    sx->iface.progress(e); /* buffers our answers freed go to the next units at once */
  }
  if (c->dead) {
    link_conn_bury(c);
    return;
  }
  if (poll_end && r->outstanding == 0) poll_backoff(&c->spin_skip, &c->spin_left, hixl_now_ns() < poll_end);
  /* Park when nothing is owed to anyone; otherwise the progress thread reads on. */
  c->rx = c->pend_head || c->pay_left || c->txq_head || c->always_read ? RX_PROGRESS : RX_PARKED;
  if (c->rx == RX_PROGRESS) link_conn_arm(c);
  if (c->devjobs > 0) { /* copies of other requests on c: the copier's now */
    e->devq.news = true;
    link_wake(e);
  }
}

/* ---- progress thread ---- */

/* ---- accepting: caps, handshake deadlines, back-off ---- */

#define LINK_TICK_NS      (100u * 1000000u)  /* the timer's period while a deadline or a back-off waits */
#define LINK_ACCEPT_PAUSE (100u * 1000000u)  /* out of descriptors: no accept for this long */
#define LINK_REFUSAL_LOG  (1000u * 1000000u) /* at most one line a second about refused links */

static void timer_set(struct HixlEngine *e, bool on) {
  if (e->tfd < 0 || e->tfd_armed == on) return;
  struct itimerspec t = {{0, on ? LINK_TICK_NS : 0}, {0, on ? LINK_TICK_NS : 0}};
  if (timerfd_settime(e->tfd, 0, &t, NULL) == 0) e->tfd_armed = on;
}

/* A link refused or deferred: counted, and said at most once a second. */
static void refusal(struct HixlEngine *e, const char *why) {
  uint64_t now = hixl_now_ns();
  e->accept_refusals++;
  if (now - e->accept_logged < LINK_REFUSAL_LOG) return;
  log_warn("engine %s: %s (%llu connection(s) refused or deferred since the last such line)", e->local_name,
           why, (unsigned long long)e->accept_refusals);
  e->accept_refusals = 0;
  e->accept_logged = now;
}

/* Out of descriptors (or kernel memory): stop watching the listener for a while rather
 * than be woken for it again at once (it stays readable). The timer resumes it. */
static void accept_pause(struct HixlEngine *e, int err) {
  char why[160];
  epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->listen_fd, NULL);
  for (uint32_t k = 0; k < HIXL_RAILS_MAX; k++)
    if (e->rail_fds[k] >= 0) epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->rail_fds[k], NULL);
  e->accept_resume = hixl_now_ns() + LINK_ACCEPT_PAUSE;
  timer_set(e, true);
  snprintf(why, sizeof(why), "accept: %s: not accepting for %u ms", strerror(err),
           LINK_ACCEPT_PAUSE / 1000000u);
  refusal(e, why);
}

/* Links accepted now, in all and from addr. */
static void links_from(const struct HixlEngine *e, struct in_addr addr, uint32_t *all, uint32_t *same) {
  *all = *same = 0;
  for (const struct conn *c = e->conns; c; c = c->next)
    if (c->role != CONN_INITIATOR) {
      (*all)++;
      *same += c->from.s_addr == addr.s_addr;
    }
}

/* The connection accepted longest ago that has not said HELLO yet, or NULL. */
static struct conn *oldest_unproven(const struct HixlEngine *e) {
  struct conn *old = NULL;
  for (struct conn *c = e->conns; c; c = c->next)
    if ((c->role == CONN_TARGET_HELLO || c->role == CONN_TARGET_AUTH) &&
        (!old || c->hello_deadline < old->hello_deadline))
      old = c;
  return old;
}

/* Make room for a newcomer: close the oldest connection that has not said HELLO, so
 * connections that never will cannot lock out those that would (a link that said
 * HELLO is never closed for room). false: there is none to close, or this round
 * closed LINK_EVICT_MAX already. */
#define LINK_EVICT_MAX 256
static bool evict_unproven(struct HixlEngine *e, uint32_t *evicted, const char *why) {
  struct conn *old = *evicted < LINK_EVICT_MAX ? oldest_unproven(e) : NULL;
  if (!old) return false;
  (*evicted)++;
  refusal(e, why);
  link_conn_kill(old, HIXL_SUCCESS, why); /* it holds nothing; its descriptor is closed now */
  return true;
}

static void accept_all(struct HixlEngine *e, int lfd) {
  uint32_t evicted = 0;
  while (!e->accept_resume) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* accept4 says so before it looks at the queue: with no connection waiting there
         * is nobody to make room for (the one closed would be the one just taken). */
        int err = errno;
        struct pollfd pl = {.fd = lfd, .events = POLLIN};
        if (poll(&pl, 1, 0) != 1) return;
        errno = err;
        if (evict_unproven(e, &evicted,
                           "out of descriptors: the oldest connection without HELLO closed for a new one"))
          continue;
        accept_pause(e, errno);
      } else if (errno == ECONNABORTED || errno == EPERM || errno == EPROTO || errno == EINTR)
        continue; /* that connection only */
      else if (errno != EAGAIN && errno != EWOULDBLOCK)
        log_warn("accept on %s: %s", e->local_name, strerror(errno));
      return;
    }
    uint32_t all, same;
    links_from(e, sa.sin_addr, &all, &same);
    if (all >= e->opts.max_links && same < e->opts.max_links_addr &&
        evict_unproven(e, &evicted,
                       "MaxLinks reached: the oldest connection without HELLO closed for a new one"))
      all--;
    if (all >= e->opts.max_links || same >= e->opts.max_links_addr) {
      char why[160], ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
      if (all >= e->opts.max_links)
        snprintf(why, sizeof(why), "a connection from %s closed: MaxLinks %u links are up", ip,
                 e->opts.max_links);
      else
        snprintf(why, sizeof(why),
                 "a connection from %s closed: MaxLinksPerAddress %u links from there are up", ip,
                 e->opts.max_links_addr);
      refusal(e, why);
      close(fd);
      continue;
    }
    sock_tune(fd);
    sock_set_buffers(fd, (size_t)e->opts.sockbuf_kib << 10);
    struct conn *c = link_conn_new(e, fd, CONN_TARGET_HELLO);
    if (c) {
      c->from = sa.sin_addr;
      c->hello_deadline = hixl_now_ns() + (uint64_t)e->opts.handshake_ms * 1000000u;
    }
    if (!c || link_conn_watch(c) < 0) {
      log_error("cannot take a new link on %s: out of resources", e->local_name);
      if (c) {
        free(c->rxbuf);
        free(c);
      }
      close(fd);
      continue;
    }
    timer_set(e, true); /* its HELLO has a deadline */
  }
}

/* The timer fired: close links whose HELLO is overdue, resume accepting after a
 * back-off, and stop the timer when nothing waits. Lock held. */
static void timer_tick(struct HixlEngine *e) {
  uint64_t v, now = hixl_now_ns();
  bool waiting = false;
  (void)!read(e->tfd, &v, sizeof(v));
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));) {
    if (c->role != CONN_TARGET_HELLO && c->role != CONN_TARGET_AUTH) continue;
    if (now < c->hello_deadline) {
      waiting = true;
      continue;
    }
    char why[96];
    snprintf(why, sizeof(why), "a connection closed: no %s within HandshakeTimeout %u ms",
             c->role == CONN_TARGET_HELLO ? "HELLO" : "AUTH_PROOF", e->opts.handshake_ms);
    refusal(e, why);
    link_conn_kill(c, HIXL_SUCCESS,
                   why); /* it holds nothing; the refusal line says it, once a second at most */
  }
  bool rails = link_rails_tick(e);
  if (e->accept_resume && now >= e->accept_resume) {
    e->accept_resume = 0;
    if (link_watch_listener(e) < 0) log_error("engine %s: cannot watch its listener again", e->local_name);
  }
  timer_set(e, waiting || e->accept_resume || rails);
}

void link_tick_start(struct HixlEngine *e) { timer_set(e, true); }

/* PollUs: after a round that found events the thread goes on polling (epoll with no
 * wait, the CPU yielded between polls, the lock not taken for an empty poll) until
 * nothing came for poll_us, then sleeps; not at all for POLL_CONTENDED after a yield
 * that another task took the CPU in (poll_yield). A request or answer that comes
 * meanwhile is taken at once: no wake-up of a sleeping thread, which on a VM's idle
 * vCPU costs tens of microseconds. Anything that would wake the thread (a socket, the event fd the API
 * writes, the timer) is an event of the same epoll, so an empty poll has nothing to do. */
/* The progress thread's release of the lock between rounds. While a caller is blocked on
 * the lock, or one it woke waits on cond, it lets that caller take the lock before it
 * takes it again (at most 1 ms): a mutex favours the thread that just released it, and a
 * peer that keeps this thread busy (a stream of small frames) kept callers out for
 * seconds past their timeouts. */
static void progress_unlock(struct HixlEngine *e) {
  bool woke = __atomic_exchange_n(&e->signalled, false, __ATOMIC_RELAXED);
  bool hand = __atomic_load_n(&e->lock_wanted, __ATOMIC_RELAXED) > 0 ||
              (woke && __atomic_load_n(&e->cond_waiters, __ATOMIC_RELAXED) > 0);
  uint32_t gen = __atomic_load_n(&e->lock_gen, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&e->lock);
  for (uint64_t end = hand ? hixl_now_ns() + 1000000u : 0;
       hand && __atomic_load_n(&e->lock_gen, __ATOMIC_RELAXED) == gen && hixl_now_ns() < end;)
    sched_yield();
}

static void *progress_main(void *arg) {
  struct HixlEngine *e = arg;
  struct epoll_event evs[64];
  int wait_ms = -1; /* 0 while async shm copies are queued, or while polling */
  bool more = false;
  uint64_t poll_ns = (uint64_t)e->opts.poll_us * 1000u, poll_end = 0, missed = 0, contended = 0;
  uint64_t quiet = 0;          /* no window opens before this (poll_yield) */
  uint32_t skip = 0, left = 0; /* poll_backoff's */
  for (;;) {
    int n = epoll_wait(e->epfd, evs, 64, wait_ms);
    if (n < 0 && errno != EINTR) {
      log_error("epoll_wait: %s", strerror(errno));
      break;
    }
    bool polling = wait_ms == 0 && !more;
    if (poll_ns && n <= 0 && polling) {
      bool over = hixl_now_ns() >= poll_end; /* nothing came for poll_us */
      if (!over && poll_yield(&quiet)) over = true, contended++;
      if (over) { /* sleep */
        wait_ms = -1;
        missed++;
        poll_backoff(&skip, &left, false);
      }
      continue;
    }
    pthread_mutex_lock(&e->lock);
    e->pstats.missed += missed;
    e->pstats.contended += contended;
    missed = contended = 0;
    bool open = false; /* events came: a window opens once they are handled */
    if (e->stopping) {
      pthread_mutex_unlock(&e->lock);
      break;
    }
    for (int i = 0; i < n; i++) {
      void *ptr = evs[i].data.ptr;
      if (ptr == &e->listen_fd) {
        accept_all(e, e->listen_fd);
      } else if (ptr >= (void *)e->rail_fds && ptr < (void *)(e->rail_fds + HIXL_RAILS_MAX)) {
        accept_all(e, *(int *)ptr);
      } else if (ptr >= (void *)e->mods && ptr < (void *)(e->mods + XPORT_MODS)) {
        const struct xport_ops *x = *(const struct xport_ops *const *)ptr;
        x->iface.on_event(e);
      } else if (ptr == &e->tfd) {
        timer_tick(e);
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
    if (n > 0) { /* events: counted, and with PollUs the thread polls on (unless backing off) */
      if (polling)
        e->pstats.polled++;
      else
        e->pstats.woken += wait_ms != 0;
      if (polling) poll_backoff(&skip, &left, true); /* polling: a window was open (PollUs set) */
      if (left > 0 && wait_ms != 0)
        left--; /* woken: this window is one the back-off skips */
      else
        open = poll_ns != 0;
    }
    more = false; /* one step per link, then events get a turn */
    for (int m = 0; m < XPORT_MODS; m++) more |= e->mods[m]->iface.progress(e);
    if (e->devq.head || e->devq.resume) link_devq_kick(e); /* the copier runs them, the wire goes on */
    e->prog_busy = more;
    uint64_t now = hixl_now_ns();
    if (open && now >= quiet) poll_end = now + poll_ns; /* from the end of this round's work */
    wait_ms = more || now < poll_end ? 0 : -1;
    link_free_graveyard(e);
    progress_unlock(e);
  }
  return NULL;
}

int link_watch_listener(struct HixlEngine *e) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &e->listen_fd};
  if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->listen_fd, &ev) < 0) return -1;
  for (uint32_t k = 0; k < HIXL_RAILS_MAX; k++) {
    ev.data.ptr = &e->rail_fds[k];
    if (e->rail_fds[k] >= 0 && epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->rail_fds[k], &ev) < 0) return -1;
  }
  return 0;
}

int link_start(struct HixlEngine *e, HixlStatus *st) {
  (void)st;
  e->tfd = -1;
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
  e->devq.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  e->devq.copier_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->devq.evfd < 0 || e->devq.copier_fd < 0) goto close_ev;
  e->devq.copier_stop = e->devq.copier_up = false;
  ev.data.ptr = &e->evfd;
  if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->evfd, &ev) < 0) goto close_ev;
  e->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  e->tfd_armed = false;
  e->accept_resume = 0;
  ev.data.ptr = &e->tfd;
  if (e->tfd < 0 || epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->tfd, &ev) < 0) goto close_ev;
  if (e->listen_fd >= 0 && link_watch_listener(e) < 0) goto close_ev;
  for (int i = 0; i < XPORT_MODS; i++) {
    const struct xport_ops *x = e->mods[i];
    int fd = x->iface.event_fd(e);
    if (fd < 0) continue;
    ev.data.ptr = (void *)&e->mods[i];
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) goto close_ev;
  }
  if (pthread_create(&e->thread, NULL, progress_main, e) != 0) goto close_ev;
  thread_name(e->thread, "hixl-progress");
  return 0;
close_ev:
  if (e->tfd >= 0) close(e->tfd);
  e->tfd = -1;
  if (e->devq.evfd >= 0) close(e->devq.evfd);
  if (e->devq.copier_fd >= 0) close(e->devq.copier_fd);
  e->devq.evfd = e->devq.copier_fd = -1;
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
  link_devq_fini(e);
  link_free_graveyard(e);
  pthread_mutex_unlock(&e->lock);
  close(e->evfd);
  close(e->devq.evfd);
  close(e->devq.copier_fd);
  close(e->epfd);
  if (e->tfd >= 0) close(e->tfd);
  e->evfd = e->devq.evfd = e->devq.copier_fd = e->epfd = e->tfd = -1;
}
