/* stage_target: the target side of staged transfers. A STAGE_WRITE / STAGE_READ on a
 * link is checked range by range before anything is copied (inside one registration,
 * or anywhere when StagingUnregistered allows it, then copied with the fault-safe self
 * copy), and scattered or gathered straight between the socket and the ranges, or
 * through the link's bounce buffer; a STAGE_PULL / STAGE_PUSH is moved by one post of
 * the link's transport (link.post_own) while the link stops reading frames. Every
 * frame's ranges are checked (grants, registrations) before a buffer is allocated or
 * registered for it: a peer refused allocates nothing here. The answers a target
 * queues per link are bounded (STAGE_TARGET_QUEUE). Lock held. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "engine/stage_int.h"
#include "util/cma.h"
#include "util/log.h"
#include "util/status_int.h"
#define STAGE_TARGET_QUEUE (64u << 20) /* STAGE_READ answer bytes a target queues per link */

/* A target link's staged state (c->xs[XPORT_STAGE]), made at its first staged frame. */
struct stage_link {
  struct stage_seg *tsegs;     /* the frame's ranges: raddr and len used */
  struct hixl_mem_reg **tregs; /* registrations the spans lie in, held while they fill */
  uint32_t tregs_held;
  uint32_t tsegs_n, tsegs_cap;
  uint8_t *tbuf; /* bounce buffer: unregistered ranges, and units moved by RDMA */
  size_t tbuf_cap;
  void *tbuf_mr;      /* tbuf registered (bounce_reg of the link's transport) for a STAGE_PULL / PUSH */
  uint64_t stall_seq; /* the STAGE_PULL / STAGE_PUSH whose WR is on the QP */
  bool stall_pull;
};

static struct stage_link *sl_of(struct conn *c) {
  if (!c->xs[XPORT_STAGE]) c->xs[XPORT_STAGE] = calloc(1, sizeof(struct stage_link));
  return c->xs[XPORT_STAGE];
}

/* Check every range before anything is copied: inside one registration, or, when this
 * engine allows it, anywhere (then copied with the fault-safe self copy). Returns
 * whether they all pass; *any_unreg says whether one needs the safe copy. */
static bool target_check(struct conn *c, const struct stage_seg *s, uint32_t n, bool write, bool *any_unreg) {
  struct HixlEngine *e = c->eng;
  *any_unreg = false;
  for (uint32_t i = 0; i < n; i++) {
    if (!link_granted(c, s[i].raddr, s[i].len, write ? "staged WRITE" : "staged READ")) return false;
    const struct hixl_mem_reg *r = (const struct hixl_mem_reg *)memtab_find(&e->regs, s[i].raddr, s[i].len);
    unsigned long long more;
    if (r && r->type == HIXL_MEM_DEVICE) { /* staged data is copied by this CPU: not into device memory */
      if (link_refused_say(c, &more))
        log_warn("refused staged %s of [0x%llx, +%u) from %s: device memory moves only by direct ops (%llu "
                 "more ops refused since the last such line)",
                 write ? "WRITE" : "READ", (unsigned long long)s[i].raddr, s[i].len, c->remote_name, more);
      return false;
    }
    if (r) continue;
    if (!e->opts.stage_unregistered) {
      if (link_refused_say(c, &more))
        log_warn("refused staged %s of [0x%llx, +%u) from %s: not inside memory registered here, and "
                 "StagingUnregistered is off (%llu more ops refused since the last such line)",
                 write ? "WRITE" : "READ", (unsigned long long)s[i].raddr, s[i].len, c->remote_name, more);
      return false;
    }
    *any_unreg = true;
  }
  return true;
}

/* Copy between buf (packed) and the ranges: memcpy when all are registered, else the
 * kernel's process_vm_* on this process, which reports EFAULT instead of faulting. */
static bool target_copy(struct conn *c, const struct stage_seg *s, uint32_t n, uint8_t *buf, bool write,
                        bool safe) {
  size_t off = 0;
  if (!safe) {
    for (uint32_t i = 0; i < n; off += s[i].len, i++)
      if (write)
        memcpy((void *)(uintptr_t)s[i].raddr, buf + off, s[i].len);
      else
        memcpy(buf + off, (const void *)(uintptr_t)s[i].raddr, s[i].len);
    return true;
  }
  struct cma_seg segs[256];
  for (uint32_t i = 0; i < n;) {
    size_t k = 0, bytes = 0;
    for (; i < n && k < 256; i++, k++) {
      segs[k].local = buf + off;
      segs[k].remote = s[i].raddr;
      segs[k].len = s[i].len;
      off += s[i].len;
      bytes += s[i].len;
    }
    int err = 0;
    if (cma_copy((uint32_t)getpid(), write, segs, k, &err) != bytes) {
      log_warn("staged %s from %s failed: %s (a range is not mapped in this process)",
               write ? "WRITE" : "READ", c->remote_name, strerror(err));
      return false;
    }
  }
  return true;
}

/* tbuf's registration with the link's transport, dropped (the link's QP is gone, or
 * tbuf is about to grow). */
static void tbuf_dereg(struct conn *c, struct stage_link *t) {
  if (t->tbuf_mr) c->xp->mem.bounce_dereg(t->tbuf_mr);
  t->tbuf_mr = NULL;
}

/* t->tbuf of at least len bytes, registered when mr (for STAGE_PULL / PUSH). */
static int tbuf_reserve(struct conn *c, struct stage_link *t, size_t len, bool mr) {
  char err[384];
  if (t->tbuf_cap < len) {
    tbuf_dereg(c, t);
    free(t->tbuf);
    t->tbuf_cap = 0;
    if (!(t->tbuf = malloc(len))) return -1;
    t->tbuf_cap = len;
    c->eng->pool.stats.target_bufs++;
    c->eng->pool.stats.target_buf_bytes += len;
  }
  if (mr && !t->tbuf_mr) {
    if (!(t->tbuf_mr = c->xp->mem.bounce_reg(c->eng, t->tbuf, t->tbuf_cap, err, sizeof(err)))) {
      log_warn("staged transfer from %s: %s", c->remote_name, err[0] ? err : "no device to register with");
      return -1;
    }
    c->eng->pool.stats.target_regs++;
  }
  return 0;
}

/* Queue the WRITE_ACK that ends a STAGE_WRITE, STAGE_PULL or STAGE_PUSH. */
static void target_ack(struct conn *c, uint64_t seq, uint32_t status) {
  uint8_t frame[WIRE_SMALL_FRAME];
  if (status != HIXL_SUCCESS) link_write_refused(c, seq);
  size_t len = wire_put_ack(frame, WIRE_WRITE_ACK, seq, status, 0);
  if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
}

/* Whether every range of the frame just taken lies in one registration of host memory
 * (and, scoped, in the peer's grants); fills tregs. Otherwise the frame takes the
 * checked path, which refuses device memory: this CPU would receive into it or send
 * from it in place (on a GPU host, a fault). */
static bool regs_all(struct conn *c, struct stage_link *t) {
  for (uint32_t i = 0; i < t->tsegs_n; i++)
    if (!(t->tregs[i] =
              (struct hixl_mem_reg *)memtab_find(&c->eng->regs, t->tsegs[i].raddr, t->tsegs[i].len)) ||
        t->tregs[i]->type == HIXL_MEM_DEVICE || !link_grant_ok(c, t->tsegs[i].raddr, t->tsegs[i].len))
      return false;
  return true;
}

static int tsegs_take(struct stage_link *t, const struct wire_msg *m) {
  if (t->tsegs_cap < m->u.stage.count) {
    struct stage_seg *v = realloc(t->tsegs, m->u.stage.count * sizeof(*v));
    if (!v) return -1;
    t->tsegs = v;
    struct hixl_mem_reg **r = realloc(t->tregs, m->u.stage.count * sizeof(*r));
    if (!r) return -1;
    t->tregs = r;
    t->tsegs_cap = m->u.stage.count;
  }
  for (uint32_t i = 0; i < m->u.stage.count; i++) {
    t->tsegs[i].laddr = 0;
    wire_stage_seg(m, i, &t->tsegs[i].raddr, &t->tsegs[i].len);
  }
  t->tsegs_n = m->u.stage.count;
  return 0;
}

static void target_rdma_done(struct conn *c, bool ok, const char *status);

/* STAGE_PULL: RDMA READ the initiator's buffer into tbuf, then check and scatter.
 * STAGE_PUSH: check, gather into tbuf, RDMA WRITE it to the initiator's buffer.
 * Either way one WR is on the QP and the link reads no further frame until it
 * completes (target_rdma_done), so answers keep their order. */
static void target_rdma(struct conn *c, struct stage_link *t, const struct wire_msg *m) {
  bool pull = m->hdr.type == WIRE_STAGE_PULL, unreg = false;
  uint32_t st = HIXL_SUCCESS;
  unsigned long long more;
  if (!(c->xp->flags & XPORT_STAGE_RDMA)) {
    if (link_refused_say(c, &more)) /* a peer's every frame: not a line each */
      log_warn("%s sent %s on a %s link, which cannot move it: refused (%llu more ops refused since the last "
               "such line)",
               c->remote_name, wire_type_name(m->hdr.type), c->xp->name, more);
    st = HIXL_FAILED;
  } else if (tsegs_take(t, m) < 0) {
    st = HIXL_RESOURCE_EXHAUSTED;
  } else if (!target_check(c, t->tsegs, t->tsegs_n, pull, &unreg)) {
    st = HIXL_FAILED; /* refused before the bounce buffer is grown or registered */
  } else if (tbuf_reserve(c, t, m->u.stage.total, true) < 0) {
    st = HIXL_RESOURCE_EXHAUSTED;
  } else if (!pull && !target_copy(c, t->tsegs, t->tsegs_n, t->tbuf, false, unreg)) {
    st = HIXL_FAILED;
  }
  if (st != HIXL_SUCCESS) {
    target_ack(c, m->u.stage.seq, st);
    return;
  }
  int rc = c->xp->link.post_own(c, !pull, t->tbuf, (uint32_t)m->u.stage.total, t->tbuf_mr, m->u.stage.buf,
                                m->u.stage.rkey, target_rdma_done);
  if (rc != 0) {
    char why[160];
    snprintf(why, sizeof(why), "posting a staged %s on the %s link failed: %s", pull ? "READ" : "WRITE",
             c->xp->name, strerror(errno));
    link_conn_kill(c, HIXL_FAILED, why);
    return;
  }
  c->stall |= LINK_STALL_MODULE;
  t->stall_seq = m->u.stage.seq;
  t->stall_pull = pull;
  link_rearm(c);
}

/* The target's STAGE_PULL / STAGE_PUSH work request completed. */
static void target_rdma_done(struct conn *c, bool ok, const char *status) {
  struct stage_link *t = c->xs[XPORT_STAGE];
  bool unreg;
  if (!(c->stall & LINK_STALL_MODULE) || !t) return;
  c->stall &= (uint8_t)~LINK_STALL_MODULE;
  if (!ok) {
    char why[192];
    snprintf(why, sizeof(why), "%s %s of a staged unit failed: %s", c->xp->name,
             t->stall_pull ? "READ" : "WRITE", status);
    link_conn_kill(c, HIXL_FAILED, why); /* a QP in error is a broken link */
    return;
  }
  uint32_t st = HIXL_SUCCESS;
  /* Checked again: a range may have been deregistered while the data was in flight. */
  if (t->stall_pull && (!target_check(c, t->tsegs, t->tsegs_n, true, &unreg) ||
                        !target_copy(c, t->tsegs, t->tsegs_n, t->tbuf, true, unreg)))
    st = HIXL_FAILED;
  target_ack(c, t->stall_seq, st);
  if (!c->dead) link_resume(c);
}

void stage_target_frame(struct conn *c, const struct wire_msg *m) {
  struct stage_link *t = sl_of(c);
  bool unreg;
  if (!t) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  if (m->hdr.type == WIRE_STAGE_WRITE) {
    /* Receive the data whole, then check and scatter it (stage_payload_done). */
    struct link_pay *pay = link_pay_of(c, c->eng->mods[XPORT_STAGE]);
    pay->seq = m->u.stage.seq;
    c->pay_left = m->hdr.payload_len;
    pay->reg = NULL;
    pay->status = HIXL_SUCCESS;
    if (tsegs_take(t, m) < 0) {
      c->pay.status = HIXL_RESOURCE_EXHAUSTED;
      link_pay_single(c, NULL, m->hdr.payload_len);
      return;
    }
    /* Every range registered: received in place, each registration held meanwhile.
     * Otherwise (StagingUnregistered on) into tbuf, checked and copied at the end. */
    if (regs_all(c, t)) {
      for (uint32_t k = 0; k < t->tsegs_n; k++) t->tregs[k]->inflight++;
      t->tregs_held = t->tsegs_n;
      link_pay_spans(c, t->tsegs, t->tsegs_n, true, m->hdr.payload_len, false);
      return;
    }
    if (!target_check(c, t->tsegs, t->tsegs_n, true, &unreg))
      c->pay.status = HIXL_FAILED; /* refused before a byte lands: the data is dropped */
    else if (tbuf_reserve(c, t, m->hdr.payload_len, false) < 0)
      c->pay.status = HIXL_RESOURCE_EXHAUSTED;
    link_pay_single(c, c->pay.status == HIXL_SUCCESS ? t->tbuf : NULL, m->hdr.payload_len);
    return;
  }
  if (m->hdr.type == WIRE_STAGE_PULL || m->hdr.type == WIRE_STAGE_PUSH) {
    target_rdma(c, t, m);
    return;
  }
  /* STAGE_READ, answered as one READ_RESP: registered ranges are sent from where they
   * lie (each registration held until sent); otherwise (StagingUnregistered on) they
   * are gathered into an owned buffer with the fault-safe copy. */
  uint32_t st = HIXL_SUCCESS, n = m->u.stage.count;
  uint8_t *buf = NULL;
  struct txitem *it = calloc(1, sizeof(*it));
  if (!it) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  if (c->answers_queued + m->u.stage.total > STAGE_TARGET_QUEUE || tsegs_take(t, m) < 0) {
    st = HIXL_RESOURCE_EXHAUSTED;
  } else if (regs_all(c, t)) {
    struct stage_seg *g = malloc(n * (sizeof(*g) + sizeof(struct hixl_mem_reg *)));
    if (!g) {
      st = HIXL_RESOURCE_EXHAUSTED;
    } else {
      it->own_block = g;
      it->own_regs = (struct hixl_mem_reg **)(g + n);
      for (uint32_t i = 0; i < n; i++) {
        g[i].laddr = t->tsegs[i].raddr; /* sent from here */
        g[i].len = t->tsegs[i].len;
        it->own_regs[i] = t->tregs[i];
        t->tregs[i]->inflight++;
      }
      it->n_own_regs = n;
      it->gather = g;
      it->ngather = n;
    }
  } else if (!target_check(c, t->tsegs, t->tsegs_n, false, &unreg)) {
    st = HIXL_FAILED; /* refused before its answer's buffer is allocated */
  } else if (!(buf = malloc(m->u.stage.total))) {
    st = HIXL_RESOURCE_EXHAUSTED;
  } else {
    c->eng->pool.stats.target_bufs++;
    c->eng->pool.stats.target_buf_bytes += m->u.stage.total;
    if (!target_copy(c, t->tsegs, t->tsegs_n, buf, false, unreg)) {
      st = HIXL_FAILED;
      free(buf);
      buf = NULL;
    }
  }
  uint32_t len = st == HIXL_SUCCESS ? (uint32_t)m->u.stage.total : 0;
  it->hdr_len = (uint32_t)wire_put_ack(it->hdr, WIRE_READ_RESP, m->u.stage.seq, st, len);
  it->payload = buf;
  it->payload_len = len;
  it->own_payload = buf;
  link_enqueue(c, it);
}

/* Let go of the registrations a STAGE_WRITE fills. */
void stage_target_release(struct conn *c) {
  struct stage_link *t = c->xs[XPORT_STAGE];
  if (!t) return;
  for (uint32_t i = 0; i < t->tregs_held; i++) t->tregs[i]->inflight--;
  t->tregs_held = 0;
}

/* A STAGE_WRITE's data arrived (or was dropped). */
void stage_payload_done(struct conn *c) {
  struct stage_link *t = c->xs[XPORT_STAGE];
  bool unreg;
  if (t->tregs_held > 0) { /* received in place */
    stage_target_release(c);
    target_ack(c, c->pay.seq, c->pay.status);
    return;
  }
  if (c->pay.status == HIXL_SUCCESS && (!target_check(c, t->tsegs, t->tsegs_n, true, &unreg) ||
                                        !target_copy(c, t->tsegs, t->tsegs_n, t->tbuf, true, unreg)))
    c->pay.status = HIXL_FAILED;
  target_ack(c, c->pay.seq, c->pay.status);
}

void stage_free(struct conn *c) {
  struct stage_link *t = c->xs[XPORT_STAGE];
  if (!t) return;
  tbuf_dereg(c, t); /* the QP is gone by now: nothing DMAs into tbuf */
  free(t->tsegs);
  free(t->tregs);
  free(t->tbuf);
  free(t);
  c->xs[XPORT_STAGE] = NULL;
}
