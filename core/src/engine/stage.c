/* stage: the staging pool ("BufferPool") and staged transfers.
 *
 * An op whose local or remote memory is not registered, or a small op worth packing
 * (StagingThreshold), becomes part of a staged *unit*: up to one pool buffer's worth
 * of ranges, sent as one frame the target scatters or gathers itself, checking every
 * range first. On the socket (STAGE_WRITE with the ranges' data gathered after it,
 * STAGE_READ answered by one READ_RESP received straight into the caller's ranges)
 * the buffer is a token that bounds how much is staged at once; on a QP (STAGE_PULL
 * / STAGE_PUSH) it holds the packed data that the target moves with one RDMA work
 * request. Units wait in order for a free buffer; a request whose units never got
 * one by its deadline ends RESOURCE_EXHAUSTED. Lock held everywhere. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/engine_int.h"
#include "engine/stage.h"
#include "engine/stage_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

static void stage_open_rdma(struct HixlEngine *e);

static HixlStatus stage_open(struct HixlEngine *e) {
  struct stage_pool *p = &e->pool;
  memset(p, 0, sizeof(*p));
  if (e->opts.pool_num == 0) return HIXL_SUCCESS; /* "0:0": staging off */
  p->num = e->opts.pool_num;
  p->buf_size = (size_t)e->opts.pool_size_mb << 20;
  p->unit = p->buf_size < WIRE_MAX_STAGE ? p->buf_size : WIRE_MAX_STAGE;
  p->mem_len = (size_t)p->num * p->buf_size;
  p->mem = mmap(NULL, p->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  p->free = malloc(p->num * sizeof(*p->free));
  if (p->mem == MAP_FAILED || !p->free) {
    HixlStatus st = hixl_fail(HIXL_RESOURCE_EXHAUSTED,
                              "HixlEngineInitialize: cannot allocate BufferPool %u:%u (%zu MiB): %s",
                              e->opts.pool_num, e->opts.pool_size_mb, p->mem_len >> 20, strerror(errno));
    if (p->mem != MAP_FAILED) munmap(p->mem, p->mem_len);
    free(p->free);
    memset(p, 0, sizeof(*p));
    return st;
  }
  for (uint32_t i = 0; i < p->num; i++) p->free[i] = p->mem + (size_t)(p->num - 1 - i) * p->buf_size;
  p->nfree = p->num;
  stage_open_rdma(e); /* the pool's MR, when the locked-memory limit allows it */
  return HIXL_SUCCESS;
}

/* The pool registered with the transport that moves staged units itself (its bounce
 * hooks: rdma), when this engine has one. */
static void stage_open_rdma(struct HixlEngine *e) {
  struct stage_pool *p = &e->pool;
  char err[384];
  if (!p->mem) return;
  for (int i = 0; i < XPORT_MODS && !p->mr; i++) {
    const struct xport_ops *x = e->mods[i];
    if (!(x->flags & XPORT_STAGE_RDMA)) continue;
    p->mr = x->mem.bounce_reg(e, p->mem, p->mem_len, err, sizeof(err));
    if (p->mr)
      p->mr_mod = x;
    else if (err[0]) /* not fatal: staged units on its links go over the socket, small ops unpacked */
      log_warn("engine %s: BufferPool %u:%u is not registered with %s, so staged data on its links goes "
               "over the socket: %s",
               e->local_name, e->opts.pool_num, e->opts.pool_size_mb, x->name, err);
  }
}

/* Before the RDMA device closes (modules close in reverse order): the pool's MR first. */
static void stage_close(struct HixlEngine *e) {
  struct stage_pool *p = &e->pool;
  if (p->mr) p->mr_mod->mem.bounce_dereg(p->mr);
  if (p->mem) munmap(p->mem, p->mem_len);
  free(p->free);
  memset(p, 0, sizeof(*p));
}

static void stage_enqueue(struct chunk *ch) {
  struct stage_pool *p = &ch->req->eng->pool;
  ch->owner = &xport_stage;
  ch->unit->waiting = true;
  ch->unit->next_wait = NULL;
  if (p->wait_tail)
    p->wait_tail->unit->next_wait = ch;
  else
    p->wait_head = ch;
  p->wait_tail = ch;
}

/* Take ch out of the waiting queue (it is in it). */
static void wait_remove(struct stage_pool *p, struct chunk *ch) {
  struct chunk *prev = NULL;
  for (struct chunk *w = p->wait_head; w; prev = w, w = w->unit->next_wait) {
    if (w != ch) continue;
    if (prev)
      prev->unit->next_wait = w->unit->next_wait;
    else
      p->wait_head = w->unit->next_wait;
    if (p->wait_tail == w) p->wait_tail = prev;
    break;
  }
  ch->unit->waiting = false;
  ch->unit->next_wait = NULL;
}

/* The unit touches the caller's ranges no more: the registrations it held go back. */
static void unit_let_go(struct chunk *ch) {
  for (uint32_t k = 0; k < ch->unit->nregs; k++) ch->unit->regs[k]->inflight--;
  ch->unit->nregs = 0;
}

/* The unit ended: its buffer is free. */
static void stage_release(struct chunk *ch) {
  struct stage_pool *p = &ch->req->eng->pool;
  if (ch->unit->waiting) wait_remove(p, ch);
  if (!ch->unit->sbuf) return;
  p->free[p->nfree++] = ch->unit->sbuf;
  ch->unit->sbuf = NULL;
  if (p->wait_head) link_wake(ch->req->eng); /* the progress thread hands it on after its batch */
}

HixlStatus stage_exhausted(struct HixlEngine *e, const char *fn, uint32_t units, const char *remote,
                           bool reset) {
  return hixl_fail(HIXL_RESOURCE_EXHAUSTED,
                   "%s: BufferPool %u:%u (%u staging buffers of %u MiB) stayed busy until the deadline: "
                   "%u staged units of this batch to %s never got a buffer and none of their data was "
                   "sent; give the call more time, the pool more buffers, or wait for transfers in flight%s",
                   fn, e->opts.pool_num, e->opts.pool_size_mb, e->opts.pool_num, e->opts.pool_size_mb, units,
                   remote,
                   reset ? "; RDMA work requests of its other ops were still posted, so the link was reset "
                           "(Connect again)"
                         : "");
}

/* How a unit that never got a buffer ends. */
static void starved_why(const struct HixlEngine *e, char *why, size_t len) {
  snprintf(why, len, "staged unit never got a buffer of BufferPool %u:%u before the deadline",
           e->opts.pool_num, e->opts.pool_size_mb);
}

/* A socket WRITE unit part-sent at its deadline: the rest of its frame would be read
 * from the caller's ranges after the call returned TIMEOUT, when they are the caller's
 * again (to reuse, or free: the send then fails and takes the link). Its ranges are
 * copied now, while they still hold the data, and the frame ends from the copy; the
 * peer applies it as it would have, and its answer is dropped. A unit not started yet
 * is dropped from the queue unsent (link_frames.c). Out of memory, the link is cut. */
static void unit_detach(struct chunk *ch) {
  struct txitem *it = &ch->tx;
  struct conn *c = ch->unit->sconn;
  if (!it->gather || it->sent == 0 || !c || c->dead || c->txq_head != it) return;
  uint8_t *copy = malloc(it->payload_len);
  if (!copy) {
    link_conn_kill(c, HIXL_FAILED, "out of memory for the rest of a staged WRITE that timed out part-sent");
    return;
  }
  size_t off = 0;
  for (uint32_t g = 0; g < it->ngather && off < it->payload_len; g++) {
    size_t n = it->gather[g].len < it->payload_len - off ? it->gather[g].len : it->payload_len - off;
    memcpy(copy + off, (const void *)(uintptr_t)it->gather[g].laddr, n);
    off += n;
  }
  it->payload = it->own_payload = copy; /* freed once sent (link_txitem_done) */
  it->gather = NULL;
  it->ngather = 0;
}

uint32_t stage_cancel(struct hixl_transfer_req *r) {
  uint32_t n = 0;
  char why[160];
  starved_why(r->eng, why, sizeof(why));
  for (uint32_t i = link_req_first_staged(r); i < r->nchunks; i++) {
    struct chunk *ch = &r->chunks[i];
    /* From here nothing of it reads or writes the caller's ranges (a part-sent frame
     * ends from its copy, one unsent is dropped, late data is discarded, an RDMA unit's
     * data was packed already and is not scattered): its registrations go back. */
    unit_let_go(ch);
    if (ch->unit->waiting) {
      n++;
      link_chunk_end(ch, HIXL_RESOURCE_EXHAUSTED, why);
    } else if (ch->unit->sbuf && !ch->unit->srdma) {
      unit_detach(ch);
      /* On the socket, unanswered at the deadline: its buffer was only a token (the data
       * goes from, and an answer lands in, the caller's ranges; a late answer is dropped,
       * the request cancelled), so it goes back now. A peer that stops answering kept
       * it, and so the whole pool from every other peer, until its link died. By RDMA the
       * target may still move the buffer's bytes: it stays until the answer or the link's
       * death. */
      stage_release(ch);
    }
  }
  return n;
}

/* The link is dying: its waiting units end, a target lets go of what it held. */
static void stage_kill(struct conn *c, HixlStatus st, const char *msg) {
  struct stage_pool *p = &c->eng->pool;
  stage_target_release(c);
  struct chunk *w = p->wait_head;
  while (w) {
    struct chunk *next = w->unit->next_wait;
    if (w->unit->sconn == c) link_chunk_end(w, st, msg); /* takes it out of the queue */
    w = next;
  }
}

/* Build ch's frame and queue it on c; ch holds its buffer. Returns -1 (ch ended)
 * when memory runs out. */
static int unit_queue(struct stage_pool *p, struct chunk *ch, struct conn *c) {
  bool write = ch->kind == CHUNK_SWRITE;
  size_t flen = WIRE_HDR_LEN + 24 + (size_t)ch->unit->nsegs * WIRE_STAGE_SEG_LEN; /* room for either form */
  uint8_t *frame = malloc(flen);
  if (!frame) {
    link_chunk_end(ch, HIXL_RESOURCE_EXHAUSTED, "out of memory for a staged frame");
    return -1;
  }
  ch->seq = c->next_seq++; /* numbered now: frames go out, and answers come back, in this order */
  /* On a QP the target moves the packed data itself (one RDMA READ or WRITE of this
   * buffer); otherwise the data follows the frame on the socket. */
  ch->unit->srdma = c->xp == p->mr_mod && c->peer && (c->peer->caps & WIRE_CAP_STAGE_RDMA);
  ch->answer = ch->unit->srdma ? WIRE_WRITE_ACK : 0; /* STAGE_PULL / STAGE_PUSH are answered by WRITE_ACK */
  if (ch->unit->srdma)
    flen = wire_put_stage_rdma(frame, write ? WIRE_STAGE_PULL : WIRE_STAGE_PUSH, ch->seq,
                               (uint64_t)(uintptr_t)ch->unit->sbuf, p->mr_mod->mem.bounce_key(c, p->mr),
                               ch->unit->nsegs);
  else
    flen = wire_put_stage(frame, write ? WIRE_STAGE_WRITE : WIRE_STAGE_READ, ch->seq, ch->unit->nsegs,
                          write ? ch->len : 0);
  for (uint32_t i = 0; i < ch->unit->nsegs; i++)
    wire_put_stage_seg(frame, ch->unit->srdma, i, ch->unit->segs[i].raddr, ch->unit->segs[i].len);
  /* By RDMA the target takes the data from the buffer: pack it there. On the socket
   * the ranges are sent as they are (gathered) and a READ's answer lands straight in
   * the caller's ranges; the buffer then only bounds how much is staged at once. */
  size_t off = 0;
  for (uint32_t i = 0; ch->unit->srdma && write && i < ch->unit->nsegs; i++) {
    memcpy(ch->unit->sbuf + off, (const void *)(uintptr_t)ch->unit->segs[i].laddr, ch->unit->segs[i].len);
    off += ch->unit->segs[i].len;
  }
  ch->tx.heap = frame;
  ch->tx.heap_len = flen;
  ch->tx.payload = NULL;
  ch->tx.payload_len = write && !ch->unit->srdma ? ch->len : 0;
  ch->tx.gather = write && !ch->unit->srdma ? ch->unit->segs : NULL;
  ch->tx.ngather = write && !ch->unit->srdma ? ch->unit->nsegs : 0;
  ch->tx.chunk = ch;
  link_enqueue(c, &ch->tx);
  return 0;
}

/* Give ch a buffer and put its frame on its link. */
static void unit_start(struct stage_pool *p, struct chunk *ch) {
  ch->unit->sbuf = p->free[--p->nfree];
  if (unit_queue(p, ch, ch->unit->sconn) < 0) return;
  p->stats.units++;
  p->stats.ops += ch->unit->nsegs;
  p->stats.bytes += ch->len;
}

static bool stage_rdma_refused(struct conn *c, struct chunk *ch) {
  if (!ch->unit->srdma || ch->req->cancelled || !c->peer) return false;
  /* The target could not take the unit by RDMA (out of locked memory for its bounce
   * buffer): this unit and every later one to that peer go on the socket. */
  log_info("link to %s: the peer cannot take staged units by RDMA (RESOURCE_EXHAUSTED); they go over the "
           "socket from now on",
           c->remote_name);
  c->peer->caps &= ~WIRE_CAP_STAGE_RDMA;
  if (unit_queue(&c->eng->pool, ch, c) == 0) link_flush_some(c, LINK_CALLER_SEND);
  return true;
}

/* Give free buffers to waiting units. */
static void stage_pump(struct HixlEngine *e) {
  struct stage_pool *p = &e->pool;
  uint64_t now = 0;
  while (p->wait_head && p->nfree > 0) {
    struct chunk *ch = p->wait_head;
    wait_remove(p, ch);
    struct hixl_transfer_req *r = ch->req;
    if (!now) now = hixl_now_ns();
    if (r->cancelled || now >= r->deadline_ns) {
      char why[160];
      starved_why(e, why, sizeof(why));
      link_chunk_end(ch, HIXL_RESOURCE_EXHAUSTED, why);
      continue;
    }
    struct conn *c = ch->unit->sconn;
    bool own = r == p->submitting; /* its caller reads the answer (sync) or unparks (async) */
    unit_start(p, ch);
    if (!c->dead) {
      if (!own) link_unpark(c); /* the answer needs a reader: the progress thread */
      link_flush_some(c, LINK_CALLER_SEND);
    }
  }
}

void stage_submit(struct hixl_transfer_req *r) {
  struct stage_pool *p = &r->eng->pool;
  for (uint32_t i = link_req_first_staged(r); i < r->nchunks; i++) stage_enqueue(&r->chunks[i]);
  p->submitting = r;
  stage_pump(r->eng);
  p->submitting = NULL;
  for (uint32_t i = link_req_first_staged(r); i < r->nchunks; i++)
    p->stats.waits += r->chunks[i].unit->waiting;
}

static bool stage_progress(struct HixlEngine *e) {
  stage_pump(e);
  return false;
}

/* ---- planning a batch's staged ops ---- */

HixlStatus stage_plan_op(const struct conn *c, struct stage_plan *sp, const HixlTransferOpDesc *d, size_t i,
                         bool lreg, bool rreg, const char *fn, const char *remote) {
  const struct stage_pool *pool = &c->eng->pool;
  uint32_t caps = c->peer->caps;
  if (pool->num == 0)
    return hixl_fail(HIXL_PARAM_INVALID,
                     "%s: op %zu %s range [0x%lx, +%zu) is not inside memory registered %s%s, and staging "
                     "is off (BufferPool 0:0); nothing was sent",
                     fn, i, lreg ? "remote" : "local", (unsigned long)(lreg ? d->remote_addr : d->local_addr),
                     d->len, lreg ? "with " : "with this engine", lreg ? remote : "");
  char why[256];
  if (!lreg && devmem_host_check(d->local_addr, d->len, why, sizeof(why)) != HIXL_SUCCESS)
    return hixl_fail(HIXL_PARAM_INVALID,
                     "%s: op %zu local range [0x%lx, +%zu) is not registered, so it would be staged through "
                     "this CPU, but %s; nothing was sent",
                     fn, i, (unsigned long)d->local_addr, d->len, why);
  if (!(caps & WIRE_CAP_STAGE))
    return hixl_fail(HIXL_FAILED,
                     "%s: op %zu needs staging (its %s range is not registered) but %s does not serve "
                     "staged transfers; nothing was sent",
                     fn, i, lreg ? "remote" : "local", remote);
  if (!rreg && !(caps & WIRE_CAP_STAGE_ANY))
    return hixl_fail(HIXL_FAILED,
                     "%s: op %zu remote range [0x%lx, +%zu) is not inside memory registered with %s, and "
                     "%s does not let peers reach unregistered memory (its StagingUnregistered is off); "
                     "nothing was sent",
                     fn, i, (unsigned long)d->remote_addr, d->len, remote, remote);
  /* Pieces of at most one unit; a unit holds up to pool->unit bytes in up to
   * WIRE_MAX_STAGE_SEGS ranges. stage_plan_fill packs them the same way. */
  for (size_t off = 0; off < d->len;) {
    size_t piece = d->len - off < pool->unit ? d->len - off : pool->unit;
    if (sp->nunits == 0 || sp->ubytes + piece > pool->unit || sp->useg == WIRE_MAX_STAGE_SEGS) {
      sp->nunits++;
      sp->ubytes = sp->useg = 0;
    }
    sp->ubytes += piece;
    sp->useg++;
    sp->nsegs++;
    off += piece;
  }
  return HIXL_SUCCESS;
}

int stage_plan_fill(struct hixl_transfer_req *r, const struct stage_plan *sp, struct conn *c,
                    HixlTransferOp op, const HixlTransferOpDesc *descs, size_t count,
                    struct hixl_mem_reg *const *lregs) {
  if (sp->nunits == 0) return 0;
  struct stage_unit *u = calloc(1, sp->nunits * sizeof(*u) + sp->nsegs * sizeof(struct stage_seg) +
                                       sp->nsegs * sizeof(struct hixl_mem_reg *));
  if (!u) return -1;
  r->staged = u;
  size_t unit = r->eng->pool.unit;
  struct chunk *ch = NULL;
  struct stage_seg *seg0 = (struct stage_seg *)(u + sp->nunits), *seg = seg0;
  struct hixl_mem_reg **held = (struct hixl_mem_reg **)(seg0 + sp->nsegs), *reg = NULL;
  for (size_t i = 0; i < count; i++) {
    if (lregs[i]) continue;
    /* A short op's local range may be registered (packed all the same): held, as a
     * direct chunk holds its own, so DeregisterMem refuses while the unit may touch it. */
    reg = (struct hixl_mem_reg *)memtab_find_near(&r->eng->regs, reg ? &reg->range : NULL,
                                                  descs[i].local_addr, descs[i].len);
    for (size_t off = 0; off < descs[i].len;) {
      size_t piece = descs[i].len - off < unit ? descs[i].len - off : unit;
      if (!ch || ch->len + piece > unit || ch->unit->nsegs == WIRE_MAX_STAGE_SEGS) {
        ch = ch ? ch + 1 : &r->chunks[link_req_first_staged(r)];
        ch->req = r;
        ch->kind = op == HIXL_READ ? CHUNK_SREAD : CHUNK_SWRITE;
        ch->unit = u++;
        ch->unit->segs = seg;
        ch->unit->regs = held + (seg - seg0); /* at most one a range */
        ch->unit->sconn = c;
        ch->tx.chunk = ch;
      }
      if (reg && (ch->unit->nregs == 0 || ch->unit->regs[ch->unit->nregs - 1] != reg)) {
        ch->unit->regs[ch->unit->nregs++] = reg;
        reg->inflight++;
      }
      seg->laddr = descs[i].local_addr + off;
      seg->raddr = descs[i].remote_addr + off;
      seg->len = (uint32_t)piece;
      seg++;
      ch->unit->nsegs++;
      ch->len += (uint32_t)piece;
      off += piece;
    }
  }
  return 0;
}

bool stage_packs(const struct conn *c) {
  const struct stage_pool *pool = &c->eng->pool;
  uint32_t caps = c->peer->caps;
  /* On the socket; on rdma when units travel by RDMA (STAGE_PULL / PUSH). shm
   * already copies many ops per call. */
  return pool->num > 0 && (caps & WIRE_CAP_STAGE) &&
         ((c->xp->flags & XPORT_STAGE_PACK) || (c->xp == pool->mr_mod && (caps & WIRE_CAP_STAGE_RDMA)));
}

uint32_t stage_threshold(const struct conn *c) {
  const struct HixlEngine *e = c->eng;
  return e->opts.stage_threshold_auto ? c->xp->stage_threshold : e->opts.stage_threshold;
}

/* STAGE_READ data arrived by RDMA in the unit's buffer: scatter it. */
static void stage_read_done(struct chunk *ch) {
  size_t off = 0;
  if (ch->req->cancelled) return; /* the caller gave up: its memory is its own again */
  for (uint32_t i = 0; i < ch->unit->nsegs; i++) {
    memcpy((void *)(uintptr_t)ch->unit->segs[i].laddr, ch->unit->sbuf + off, ch->unit->segs[i].len);
    off += ch->unit->segs[i].len;
  }
}

/* An answer to one of our units, matched by the link. */
static bool stage_answer(struct conn *c, struct chunk *ch, const struct wire_msg *m) {
  uint32_t st = m->u.ack.status;
  if (m->hdr.type == WIRE_READ_RESP && m->hdr.payload_len > 0) {
    c->pay_chunk = ch; /* a READ's data on the socket: straight into the caller's ranges, in order */
    link_pay_spans(c, ch->unit->segs, ch->unit->nsegs, false, m->hdr.payload_len, ch->req->cancelled);
    return true;
  }
  if (st == HIXL_RESOURCE_EXHAUSTED && stage_rdma_refused(c, ch)) return true;
  if (st == HIXL_SUCCESS) {
    if (ch->kind == CHUNK_SREAD) stage_read_done(ch); /* pushed into its buffer by RDMA */
    return false;
  }
  char why[512];
  snprintf(why, sizeof(why),
           "%s refused a staged %s of %u ranges, the first remote [0x%llx, +%u) (%s: a range is not "
           "registered there and its StagingUnregistered is off, or is not mapped, or it ran out of memory)",
           c->remote_name, ch->kind == CHUNK_SREAD ? "READ" : "WRITE", ch->unit->nsegs,
           (unsigned long long)ch->unit->segs[0].raddr, ch->unit->segs[0].len, HixlStatusName(st));
  link_chunk_end(ch, st == HIXL_RESOURCE_EXHAUSTED ? HIXL_RESOURCE_EXHAUSTED : HIXL_FAILED, why);
  return true;
}

static void stage_chunk_end(struct chunk *ch) {
  unit_let_go(ch);
  if (ch->unit->sbuf || ch->unit->waiting) stage_release(ch);
}

static uint32_t stage_caps(const struct HixlEngine *e) {
  return WIRE_CAP_STAGE | (e->opts.stage_unregistered ? WIRE_CAP_STAGE_ANY : 0);
}

static const uint8_t stage_frames[] = {WIRE_STAGE_WRITE, WIRE_STAGE_READ, WIRE_STAGE_PULL, WIRE_STAGE_PUSH,
                                       0};

/* No transport: it packs ops into units that ride on the link's transport. */
const struct xport_ops xport_stage = {
    .name = "stage",
    .id = XPORT_STAGE,
    .frames = stage_frames,
    .iface = {.open = stage_open,
              .quiesce = xport_no_engine,
              .close = stage_close,
              .caps = stage_caps,
              .event_fd = xport_no_event_fd,
              .on_event = xport_no_engine,
              .progress = stage_progress,
              .grant = xport_no_grant},
    .mem = XPORT_MEM_NONE,
    .link = {.connect = xport_no_connect, /* it takes no link: units ride on the link's transport */
             .attach = xport_no_attach,
             .discard = xport_no_discard,
             .target_frame = stage_target_frame,
             .initiator_frame = xport_no_frame,
             .payload_done = stage_payload_done,
             .kill = stage_kill,
             .closed = xport_no_link,
             .free = stage_free,
             .info = xport_no_info,
             .table_current = xport_no_table_current,
             .reach = xport_reach_all,
             .post = xport_no_post,
             .start = xport_no_req,
             .async = link_async_unpark,
             .drive = link_drive_socket,
             .req_timeout = xport_no_req_timeout,
             .answer = stage_answer,
             .chunk_end = stage_chunk_end,
             .post_own = xport_no_post_own,
             .dev_reach = xport_no_dev_reach,
             .copy_now = xport_no_copy_now,
             .mem_added = xport_no_mem_added,
             .post_tag = xport_no_post_tag},
};

HixlStatus hixl_engine_stage_stats(HixlEngine *e, struct hixl_stage_stats *out) {
  if (!e || !out) return hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_stage_stats: engine or out is NULL");
  bool take = link_serving_engine != e; /* a handler of e holds e's lock already: waiting would hang */
  if (take) pthread_mutex_lock(&e->lock);
  *out = e->pool.stats;
  if (take) pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}
