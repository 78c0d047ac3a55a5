/* xport_rdma: the RDMA data path of a link. The TCP control plane exchanges QP info
 * (RDMA_CONNECT / RDMA_CONNECT_ACK) and memory keys (in memory entries); data then
 * moves as one-sided RDMA WRITE and READ posted by the initiator, with no work on the
 * target's CPU. Every chunk is one work request; every RDMA_SIGNAL_EVERY-th one, the
 * last one posted and the one that fills the send queue are signaled, and a signaled
 * completion ends every chunk posted before it (RC completes in order). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

HixlStatus erdma_open(struct HixlEngine *e) {
  char err[384];
  const char *dev = e->opts.rdma_device[0] ? e->opts.rdma_device : NULL;
  bool must = e->opts.transport == HIXL_TRANSPORT_RDMA;
  if (!rdma_available()) {
    if (must)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineInitialize: Transport rdma: this host has no RDMA device (looked for %s, "
                       "and for one owning %s through librdmacm); use Transport auto or tcp",
                       dev ? dev : "any device", e->local_name);
    log_info("engine %s: no RDMA device on this host: data goes over tcp", e->local_name);
    return HIXL_SUCCESS;
  }
  if (rdma_dev_open(&e->rdma, &e->local_addr, dev, e->opts.rdma_gid_index, err, sizeof(err)) != 0) {
    if (must) return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: Transport rdma: %s", err);
    log_info("engine %s: RDMA not usable (%s): data goes over tcp", e->local_name, err);
    return HIXL_SUCCESS;
  }
  int fl = fcntl(rdma_chan_fd(&e->rdma), F_GETFL);
  fcntl(rdma_chan_fd(&e->rdma), F_SETFL, fl | O_NONBLOCK);
  e->has_rdma = true;
  log_info("engine %s: RDMA on %s (GID index %d), traffic class %u, service level %u", e->local_name,
           e->rdma.name, e->rdma.gid_index, e->opts.rdma_tc, e->opts.rdma_sl);
  return HIXL_SUCCESS;
}

void erdma_close(struct HixlEngine *e) {
  if (!e->has_rdma) return;
  rdma_dev_close(&e->rdma);
  e->has_rdma = false;
}

HixlStatus erdma_reg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  char err[384];
  if (!e->has_rdma) return HIXL_SUCCESS;
  r->mr = rdma_reg(&e->rdma, (void *)(uintptr_t)r->range.addr, r->range.len, err, sizeof(err));
  return r->mr ? HIXL_SUCCESS : hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineRegisterMem: %s", err);
}

uint32_t erdma_rkey(const struct hixl_mem_reg *r) { return r->mr ? rdma_mr_rkey(r->mr) : 0; }

static size_t put_qp_frame(uint8_t *buf, size_t cap, enum wire_type type, uint32_t status,
                           const struct rdma_qp_info *qi) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, type);
  if (type == WIRE_RDMA_CONNECT_ACK) wire_put_u32(&w, status);
  wire_put_qp_info(&w, qi->qpn, qi->psn, qi->gid, qi->mtu);
  return wire_end(&w, 0);
}

static void qp_info_of(const struct wire_msg *m, struct rdma_qp_info *qi) {
  qi->qpn = m->u.qp.qpn;
  qi->psn = m->u.qp.psn;
  memcpy(qi->gid, m->u.qp.gid, 16);
  qi->mtu = m->u.qp.mtu;
}

/* Initiator, during Connect (blocking socket, no lock held). */
HixlStatus erdma_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote, struct peer *p,
                         struct ibv_qp **out) {
  struct rdma_qp_info local, peer;
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_QP_INFO_LEN];
  struct wire_hdr h;
  struct wire_msg m;
  char err[384];
  HixlStatus st;
  struct ibv_qp *qp = rdma_qp_new(&e->rdma, &local, err, sizeof(err));
  if (!qp) return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s: %s", remote, err);
  size_t n = put_qp_frame(buf, sizeof(buf), WIRE_RDMA_CONNECT, 0, &local);
  if ((st = sock_send_all(fd, buf, n, deadline)) != HIXL_SUCCESS) goto fail_io;
  /* Registrations the target makes meanwhile may come first (MEM_ADD / MEM_DEL). */
  for (;;) {
    uint8_t body[WIRE_MEM_ENTRY_FIXED + WIRE_MAX_TAG];
    if ((st = sock_recv_all(fd, buf, WIRE_HDR_LEN, deadline)) != HIXL_SUCCESS) goto fail_io;
    if (wire_parse_hdr(buf, &h) != WIRE_OK || (h.type != WIRE_MEM_ADD && h.type != WIRE_MEM_DEL)) break;
    if ((st = sock_recv_all(fd, body, h.body_len, deadline)) != HIXL_SUCCESS) goto fail_io;
    if (wire_decode(&h, body, &m) != WIRE_OK) break;
    if (h.type == WIRE_MEM_ADD) {
      link_peer_add_mem(p, &m.u.mem);
    } else {
      struct memtab_entry *ent = memtab_find_exact(&p->rtab, m.u.mem.addr, m.u.mem.len);
      if (ent && memtab_remove(&p->rtab, ent)) free(ent);
    }
  }
  if (wire_parse_hdr(buf, &h) != WIRE_OK || h.type != WIRE_RDMA_CONNECT_ACK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s answered the QP exchange with %s", remote,
                   wire_type_name(h.type));
    goto free_qp;
  }
  if ((st = sock_recv_all(fd, buf + WIRE_HDR_LEN, h.body_len, deadline)) != HIXL_SUCCESS) goto fail_io;
  if (wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK || m.u.qp.status != 0) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s could not connect its QP (see its log)", remote);
    goto free_qp;
  }
  qp_info_of(&m, &peer);
  if (rdma_qp_connect(&e->rdma, qp, &local, &peer, (uint8_t)e->opts.rdma_tc, (uint8_t)e->opts.rdma_sl, err,
                      sizeof(err)) != 0) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s: %s", remote, err);
    goto free_qp;
  }
  log_info("link to %s: rdma, QP 0x%x <-> 0x%x on %s", remote, local.qpn, peer.qpn, e->rdma.name);
  *out = qp;
  return HIXL_SUCCESS;
fail_io:
  st = hixl_fail(st, "HixlEngineConnect: QP exchange with %s: %s", remote, HixlGetLastErrorMessage());
free_qp:
  rdma_qp_free(qp);
  return st;
}

/* Target, in the progress thread: connect a QP to the initiator's and answer. */
void erdma_target_connect(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  struct rdma_qp_info local = {0}, peer;
  char err[384] = "this engine has no RDMA device";
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_QP_INFO_LEN];
  uint32_t status = 1;
  qp_info_of(m, &peer);
  if (e->has_rdma && !c->qp && (c->qp = rdma_qp_new(&e->rdma, &local, err, sizeof(err)))) {
    if (rdma_qp_connect(&e->rdma, c->qp, &local, &peer, (uint8_t)e->opts.rdma_tc, (uint8_t)e->opts.rdma_sl,
                        err, sizeof(err)) == 0) {
      status = 0;
      log_info("link from %s: rdma, QP 0x%x <-> 0x%x", c->remote_name, local.qpn, peer.qpn);
    } else {
      rdma_qp_free(c->qp);
      c->qp = NULL;
    }
  }
  if (status != 0) log_error("link from %s: cannot connect a QP: %s", c->remote_name, err);
  link_queue_copy(c, buf, put_qp_frame(buf, sizeof(buf), WIRE_RDMA_CONNECT_ACK, status, &local));
}

static void fifo_push(struct chunk **head, struct chunk **tail, struct chunk *ch) {
  ch->next_pending = NULL;
  if (*tail)
    (*tail)->next_pending = ch;
  else
    *head = ch;
  *tail = ch;
}

static struct chunk *fifo_pop(struct chunk **head, struct chunk **tail) {
  struct chunk *ch = *head;
  if (ch && !(*head = ch->next_pending)) *tail = NULL;
  return ch;
}

/* Post waiting chunks while the send queue has room, at most budget bytes: a
 * provider may do the transfer's work in the posting thread (rxe does), so a caller
 * posts a little and completions post the rest in steps. The last WR posted in a
 * step is signaled, so its completion comes back and the next step follows. */
void erdma_post(struct conn *c, size_t budget) {
  struct HixlEngine *e = c->eng;
  size_t posted = 0;
  while (c->rq_head && !c->dead && c->sq_used < e->rdma.max_qp_wr && posted < budget) {
    struct chunk *ch = fifo_pop(&c->rq_head, &c->rq_tail);
    if (ch->req->cancelled) { /* timed out before it reached the wire */
      link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was posted");
      continue;
    }
    posted += ch->len;
    bool last = !c->rq_head || c->sq_used + 1 == e->rdma.max_qp_wr || posted >= budget;
    bool signaled = last || c->unsignaled + 1 >= RDMA_SIGNAL_EVERY;
    int rc = rdma_post(c->qp, ch->kind == CHUNK_WRITE, ch->laddr, ch->len, rdma_mr_lkey(ch->lreg->mr),
                       ch->raddr, ch->rkey, (uint64_t)(uintptr_t)ch, signaled);
    if (rc != 0) {
      char why[192];
      fifo_push(&c->rpend_head, &c->rpend_tail, ch); /* ended by the kill below */
      snprintf(why, sizeof(why), "ibv_post_send on QP 0x%x failed: %s", rdma_qp_num(c->qp), strerror(rc));
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    fifo_push(&c->rpend_head, &c->rpend_tail, ch);
    c->sq_used++;
    c->unsignaled = signaled ? 0 : c->unsignaled + 1;
  }
}

static struct conn *conn_of_qpn(struct HixlEngine *e, uint32_t qpn) {
  for (struct conn *c = e->conns; c; c = c->next)
    if (c->qp && rdma_qp_num(c->qp) == qpn) return c;
  return NULL; /* a link already killed: its chunks were ended then */
}

/* Progress thread: the completion channel fired. */
void erdma_on_cq(struct HixlEngine *e) {
  struct rdma_wc wc[32];
  int n;
  rdma_cq_rearm(&e->rdma);
  while ((n = rdma_cq_poll(&e->rdma, wc, 32)) > 0) {
    for (int i = 0; i < n; i++) {
      struct conn *c = conn_of_qpn(e, wc[i].qpn);
      if (!c || c->dead) continue;
      if (c->role != CONN_INITIATOR) { /* a target's STAGE_PULL / STAGE_PUSH */
        stage_target_cq(c, wc[i].ok, wc[i].status);
        continue;
      }
      if (!wc[i].ok) {
        char why[256];
        struct chunk *ch = (struct chunk *)(uintptr_t)wc[i].wr_id;
        bool known = false;
        for (struct chunk *p = c->rpend_head; p && !known; p = p->next_pending) known = p == ch;
        snprintf(why, sizeof(why), "RDMA %s failed: %s (QP 0x%x)",
                 known ? (ch->kind == CHUNK_WRITE ? "WRITE" : "READ") : "work request", wc[i].status,
                 wc[i].qpn);
        link_conn_kill(c, HIXL_FAILED, why); /* a QP in error is a broken link */
        continue;
      }
      /* RC completes in order: this ends every chunk posted up to it. */
      struct chunk *target = (struct chunk *)(uintptr_t)wc[i].wr_id, *ch;
      do {
        ch = fifo_pop(&c->rpend_head, &c->rpend_tail);
        if (!ch) break;
        c->sq_used--;
        link_chunk_end(ch, HIXL_SUCCESS, "");
      } while (ch != target);
      erdma_post(c, ERDMA_STEP);
    }
  }
}

/* A request timed out. Chunks still waiting for a send-queue slot are dropped as they
 * come up; but work requests already posted cannot be taken back, and a READ among
 * them could still write the caller's memory after the call returned. So a link
 * holding posted WRs of r is reset: its QP is destroyed (no DMA after that), every
 * chunk on it ends, and the next Connect builds a new QP. Lock held. */
bool erdma_req_timeout(struct HixlEngine *e, struct hixl_transfer_req *r) {
  for (struct conn *c = e->conns; c; c = c->next) {
    if (c->dead || !c->qp || c->role != CONN_INITIATOR) continue;
    for (struct chunk *ch = c->rpend_head; ch; ch = ch->next_pending)
      if (ch->req == r) {
        char why[192];
        snprintf(why, sizeof(why),
                 "RDMA work requests of a transfer were still posted at its deadline: QP 0x%x reset so "
                 "none touches memory afterwards; call HixlEngineConnect again",
                 rdma_qp_num(c->qp));
        link_conn_kill(c, HIXL_TIMEOUT, why);
        return true; /* a request's chunks are on one link */
      }
  }
  return false;
}

/* The link is dying: end what it holds and destroy the QP (no DMA after this). */
void erdma_conn_kill(struct conn *c, HixlStatus st, const char *msg) {
  struct chunk *ch;
  if (c->qp) rdma_qp_free(c->qp);
  c->qp = NULL;
  while ((ch = fifo_pop(&c->rq_head, &c->rq_tail))) link_chunk_end(ch, st, msg);
  while ((ch = fifo_pop(&c->rpend_head, &c->rpend_tail))) link_chunk_end(ch, st, msg);
  c->sq_used = 0;
}
