/* xport_tcp: the data path every link has. A direct chunk is one frame on the link's
 * socket: WRITE_REQ with the data after it, answered by WRITE_ACK; READ_REQ,
 * answered by READ_RESP with the data. The target checks every range against its
 * registrations before a byte lands or leaves, and holds the registration while the
 * payload streams straight between the socket and it. Device memory goes through the
 * engine's pool of pinned host buffers, copied by the link layer without the lock. The link layer frames,
 * sends, streams and matches answers; this module builds the requests and serves them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/xport_link.h"
#include "transport/tcp/xport_tcp.h"
#include "util/log.h"

static uint32_t tcp_caps(const struct HixlEngine *e) {
  (void)e;
  return WIRE_CAP_TCP_DATA;
}

/* Every link can carry its data on its socket: tcp takes what shm and rdma passed on. */
static HixlStatus tcp_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                              struct peer *p, bool *taken, void **link) {
  (void)e, (void)fd, (void)deadline, (void)p;
  log_info("link to %s: tcp", remote);
  *taken = true;
  *link = NULL;
  return HIXL_SUCCESS;
}

static struct hixl_mem_reg *target_range(struct conn *c, uint64_t addr, uint64_t len, const char *what) {
  struct hixl_mem_reg *r = engine_reg_find(link_engine(c), addr, len);
  unsigned long long more;
  if (!r && link_refused_say(c, &more))
    log_warn("refused %s of [0x%llx, +%llu) from %s: not inside memory registered here (%llu more ops "
             "refused since the last such line)",
             what, (unsigned long long)addr, (unsigned long long)len, link_remote(c), more);
  return r && link_granted(c, addr, len, what) ? r : NULL;
}

static void tcp_target_frame(struct conn *c, const struct wire_msg *m) {
  if (m->hdr.type == WIRE_WRITE_REQ) {
    struct hixl_mem_reg *r = target_range(c, m->u.write_req.raddr, m->hdr.payload_len, "WRITE");
    struct link_pay *pay = link_pay_of(c, &xport_tcp);
    uint8_t *dst = r ? (uint8_t *)(uintptr_t)m->u.write_req.raddr : NULL, *bounce = NULL;
    uint32_t st = r ? HIXL_SUCCESS : HIXL_FAILED;
    /* Device memory lands in a host buffer first; none (no memory, or the frame is longer
     * than one): dropped. */
    if (r && r->type == HIXL_MEM_DEVICE && !(dst = bounce = link_dev_landing(c, r, m->hdr.payload_len)))
      st = HIXL_RESOURCE_EXHAUSTED;
    link_pay_single(c, dst, m->hdr.payload_len);
    *pay = (struct link_pay){.seq = m->u.write_req.seq,
                             .reg = r,
                             .status = st,
                             .bounce = bounce,
                             .dst = m->u.write_req.raddr,
                             .len = m->hdr.payload_len};
    if (r) r->inflight++;
    return;
  }
  /* READ_REQ: answered from where the range lies, the registration held until sent */
  uint8_t frame[WIRE_SMALL_FRAME];
  struct hixl_mem_reg *r = target_range(c, m->u.read_req.raddr, m->u.read_req.len, "READ");
  if (r && r->type == HIXL_MEM_DEVICE) { /* copied out into a pool buffer, then answered */
    link_dev_read(c, r, m->u.read_req.seq, m->u.read_req.raddr, m->u.read_req.len);
    return;
  }
  size_t len = wire_put_ack(frame, WIRE_READ_RESP, m->u.read_req.seq, r ? HIXL_SUCCESS : HIXL_FAILED,
                            r ? m->u.read_req.len : 0);
  if (link_queue_small(c, frame, len, r ? (const uint8_t *)(uintptr_t)m->u.read_req.raddr : NULL,
                       r ? m->u.read_req.len : 0, r) < 0) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  if (r) r->inflight++;
}

/* A WRITE_REQ's payload has been received (or dropped, when refused). */
static void tcp_payload_done(struct conn *c) {
  uint8_t frame[WIRE_SMALL_FRAME];
  struct link_pay *pay = link_pay_of(c, NULL);
  if (pay->bounce) { /* a WRITE into device memory: copied in, then acknowledged, in order */
    link_dev_landed(c, pay);
    return;
  }
  if (pay->reg) pay->reg->inflight--;
  pay->reg = NULL;
  if (pay->status != HIXL_SUCCESS) link_write_refused(c, pay->seq);
  size_t len = wire_put_ack(frame, WIRE_WRITE_ACK, pay->seq, pay->status, 0);
  if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
}

static void tcp_post(struct conn *c, struct chunk *ch) {
  if (ch->kind == CHUNK_WRITE) {
    ch->tx.hdr_len = (uint32_t)wire_put_write_req(ch->tx.hdr, ch->seq, ch->raddr, ch->len);
    ch->tx.payload = ch->laddr;
    ch->tx.payload_len = ch->len;
  } else {
    ch->tx.hdr_len = (uint32_t)wire_put_read_req(ch->tx.hdr, ch->seq, ch->raddr, ch->len);
  }
  if (ch->lreg && ch->lreg->type == HIXL_MEM_DEVICE) { /* through a pool buffer, copied without the lock */
    link_dev_post(c, ch);
    return;
  }
  link_enqueue(c, &ch->tx);
}

/* Start sending from the submitting thread; the progress thread or a driver goes on. */
static void tcp_start(struct conn *c, struct hixl_transfer_req *r) {
  (void)r;
  link_flush_some(c, LINK_CALLER_SEND);
}

static const uint8_t tcp_frames[] = {WIRE_WRITE_REQ, WIRE_READ_REQ, 0};

const struct xport_ops xport_tcp = {
    .name = "tcp",
    .id = XPORT_TCP,
    .flags = XPORT_STAGE_PACK | XPORT_IN_STREAM | XPORT_DEVMEM,
    .stage_threshold = STAGE_AUTO_TCP,
    .frames = tcp_frames,
    .iface = {.open = xport_no_open,
              .quiesce = xport_no_engine,
              .close = xport_no_engine,
              .caps = tcp_caps,
              .event_fd = xport_no_event_fd,
              .on_event = xport_no_engine,
              .progress = xport_no_progress,
              .grant = xport_no_grant},
    .mem = XPORT_MEM_NONE,
    .link = {.connect = tcp_connect,
             .attach = xport_no_attach,
             .discard = xport_no_discard,
             .target_frame = tcp_target_frame,
             .initiator_frame = xport_no_frame,
             .payload_done = tcp_payload_done,
             .kill = xport_no_kill,
             .closed = xport_no_link,
             .free = xport_no_link,
             .info = xport_no_info,
             .table_current = xport_no_table_current,
             .reach = xport_reach_all,
             .post = tcp_post,
             .start = tcp_start,
             .async = link_async_unpark,
             .drive = link_drive_socket,
             .req_timeout = xport_no_req_timeout,
             .answer = xport_no_answer,
             .chunk_end = xport_no_chunk_end,
             .post_own = xport_no_post_own,
             .dev_reach = xport_no_dev_reach,
             .copy_now = xport_no_copy_now,
             .mem_added = xport_no_mem_added,
             .post_tag = xport_no_post_tag},
};
