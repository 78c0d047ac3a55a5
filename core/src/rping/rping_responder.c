/* rping_responder: a context's responder, answering HELLO and PING on its UDP port and RoCE UD QP. */
/* The responder answers HELLO and PING on the context's UDP port with the TOS byte it
 * received; every datagram is checked (rp_decode) before anything reads it. Mode
 * ROCE: PINGs and PONGs are UD SENDs; the responder answers each PING with an address
 * handle made from the received completion and GRH (ibv_create_ah_from_wc), so the
 * answer goes back with the traffic class the probe arrived with, and says which in
 * its tos. The context's device, memory and responder QP are opened and closed here. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/log.h"
#include "rping/rping_int.h"

/* "ip:port" of sa into buf, for log lines (inet_ntoa is not thread-safe). */
static const char *sa_str(const struct sockaddr_in *sa, char *buf, size_t len) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
  snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
  return buf;
}

/* ---- responder ---- */

static uint8_t *resp_slot(struct rp_ctx *ctx, uint32_t slot) {
  return ctx->mem + (size_t)slot * ctx->resp_len;
}

static void resp_repost(struct rp_ctx *ctx, uint32_t slot) {
  int rc = rdma_ud_post_recv(&ctx->resp_ud, resp_slot(ctx, slot), ctx->resp_len, ctx->lkey, slot);
  if (rc != 0)
    log_error("rping responder %s: UD QP 0x%x: cannot post a receive: %s; answering less", ctx->addr_str,
              ctx->resp_ud.qpn, strerror(rc));
}

/* The AH that answers the message of wc (GRH gi): a kept one made from an earlier
 * probe with the same GRH and SL, else a new one from ibv_create_ah_from_wc, kept when
 * there is room. *ent gets its ah_cache index, or -1 for an AH of this answer alone. */
static struct ibv_ah *answer_ah(struct rp_ctx *ctx, const struct rdma_ud_wc *wc, const uint8_t *grh,
                                const struct rdma_grh_info *gi, int *ent) {
  struct rp_ah_ent *e, *idle = NULL;
  struct ibv_ah *ah;

  *ent = -1;
  for (int k = 0; wc->grh && k < RP_AH_CACHE; k++) {
    e = &ctx->ah_cache[k];
    if (e->ah && e->sl == wc->sl && e->slid == wc->slid && !memcmp(&e->grh, gi, sizeof(*gi))) {
      e->busy++;
      e->used = ++ctx->ah_clock;
      *ent = k;
      return e->ah;
    }
    if (e->busy == 0 && (!idle || !e->ah || (idle->ah && e->used < idle->used))) idle = e;
  }
  /* ibv_create_ah_from_wc takes the traffic class from the probe's GRH: the answer
   * travels with the class the probe came with. */
  ah = rdma_ah_from_wc(&ctx->dev, wc, grh);
  if (!ah || !wc->grh || !idle) return ah;
  rdma_ah_free(idle->ah); /* the least recently used idle one */
  idle->ah = ah;
  idle->grh = *gi;
  idle->sl = wc->sl;
  idle->slid = wc->slid;
  idle->busy = 1;
  idle->used = ++ctx->ah_clock;
  *ent = (int)(idle - ctx->ah_cache);
  return ah;
}

/* An answer has left (or was never posted): let go of its AH. */
static void answer_ah_done(struct rp_ctx *ctx, uint32_t slot) {
  if (ctx->resp_ent[slot] >= 0)
    ctx->ah_cache[ctx->resp_ent[slot]].busy--;
  else
    rdma_ah_free(ctx->resp_ah[slot]);
  ctx->resp_ent[slot] = -1;
  ctx->resp_ah[slot] = NULL;
}

/* Answer the PING in slot (a UD receive) in place; false when it is dropped, so the
 * caller posts the slot again at once. */
static bool roce_answer(struct rp_ctx *ctx, uint32_t slot, const struct rdma_ud_wc *wc) {
  uint8_t *grh = resp_slot(ctx, slot), *msg = grh + RDMA_GRH_LEN;
  struct rdma_grh_info gi;
  size_t n, len;
  struct rp_pkt pkt;
  enum rp_err err;
  struct ibv_ah *ah;
  int rc, ent;

  if (wc->byte_len < RDMA_GRH_LEN || wc->byte_len > ctx->resp_len) return false;
  n = wc->byte_len - RDMA_GRH_LEN;
  err = rp_decode(msg, n, &pkt);
  if (err != RP_OK || pkt.type != RP_PING) {
    log_debug("rping responder %s: dropped a %zu-byte UD message from QP 0x%x: %s", ctx->addr_str, n,
              wc->src_qp, err != RP_OK ? rp_err_str(err) : "not a PING");
    return false;
  }
  memset(&gi, 0, sizeof(gi));
  if (wc->grh && rdma_grh_read(grh, &gi) < 0) {
    log_debug("rping responder %s: a PING from QP 0x%x has a GRH of no known kind", ctx->addr_str,
              wc->src_qp);
    return false;
  }
  ah = answer_ah(ctx, wc, grh, &gi, &ent);
  if (!ah) {
    log_debug("rping responder %s: no address handle back to QP 0x%x: %s", ctx->addr_str, wc->src_qp,
              strerror(errno));
    return false;
  }
  ctx->resp_ah[slot] = ah;
  ctx->resp_ent[slot] = (int16_t)ent;
  pkt.type = RP_PONG;
  pkt.tos = gi.tc;                                          /* the traffic class the probe arrived with */
  len = rp_encode(&pkt, msg, ctx->resp_len - RDMA_GRH_LEN); /* in place */
  rc = len ? rdma_ud_post_send(&ctx->resp_ud, ah, wc->src_qp, RP_QKEY, msg, (uint32_t)len, ctx->lkey,
                               RP_WR_SEND | slot)
           : EINVAL;
  if (rc != 0) {
    log_debug("rping responder %s: answer to QP 0x%x: %s", ctx->addr_str, wc->src_qp, strerror(rc));
    answer_ah_done(ctx, slot);
    return false;
  }
  return true; /* the AH is let go when the send completes */
}

/* Drain the responder's CQ, RP_DRAIN_MAX completions at most: answer PINGs; a slot whose
 * answer left receives again. True when it stopped with completions maybe left. */
static bool roce_answer_all(struct rp_ctx *ctx) {
  struct rdma_ud_wc wc[RP_WC_BATCH];
  int n = 0;

  for (int taken = 0; taken < RP_DRAIN_MAX && (n = rdma_ud_poll(&ctx->resp_ud, wc, RP_WC_BATCH)) > 0;
       taken += n) {
    for (int i = 0; i < n; i++) {
      uint32_t slot = (uint32_t)wc[i].wr_id;
      if (slot >= RP_RESP_SLOTS) continue;
      if (wc[i].wr_id & RP_WR_SEND) {
        answer_ah_done(ctx, slot);
        if (!wc[i].ok && !wc[i].flushed)
          log_debug("rping responder %s: an answer failed: %s", ctx->addr_str, wc[i].status);
      } else if (!wc[i].ok) {
        if (!wc[i].flushed)
          log_error("rping responder %s: UD QP 0x%x: receive failed: %s", ctx->addr_str, ctx->resp_ud.qpn,
                    wc[i].status);
        continue; /* the QP is in error: nothing more arrives */
      } else if (roce_answer(ctx, slot, &wc[i])) {
        continue; /* the slot receives again once its answer has left */
      }
      resp_repost(ctx, slot);
    }
  }
  if (n < 0) log_error("rping responder %s: ibv_poll_cq failed", ctx->addr_str);
  return n > 0;
}

void *rp_responder_main(void *arg) {
  struct rp_ctx *ctx = arg;
  uint8_t buf[RP_MAX_PKT + 1]; /* one spare byte: longer datagrams show as MSG_TRUNC */
  struct pollfd pfd[3] = {{.fd = ctx->resp_fd, .events = POLLIN},
                          {.fd = ctx->close_efd, .events = POLLIN},
                          {.fd = ctx->roce ? rdma_ud_chan_fd(&ctx->resp_ud) : -1, .events = POLLIN}};

  bool roce_more = false; /* the CQ drain stopped at RP_DRAIN_MAX: go on without its event */
  for (;;) {
    if (poll(pfd, 3, roce_more ? 0 : -1) < 0 && errno != EINTR) {
      log_error("rping responder %s:%u: poll: %s; no longer answering", ctx->addr_str, ctx->port,
                strerror(errno));
      break;
    }
    if (pfd[1].revents) break; /* Deinit: looked at after every RP_DRAIN_MAX datagrams */
    if (pfd[2].revents || roce_more) {
      if (pfd[2].revents && rdma_ud_rearm(&ctx->resp_ud) != 0)
        log_error("rping responder %s: UD QP 0x%x: cannot re-arm its CQ: %s", ctx->addr_str, ctx->resp_ud.qpn,
                  strerror(errno));
      roce_more = roce_answer_all(ctx);
    }
    for (int taken = 0; taken < RP_DRAIN_MAX; taken++) {
      struct sockaddr_in from;
      struct rp_pkt pkt;
      uint8_t tos;
      char who[RP_NAME_LEN];
      enum rp_err err;
      ssize_t n = rp_recv_tos(ctx->resp_fd, buf, sizeof(buf), &from, &tos);
      size_t len;

      if (n == -1) break;
      if (n == -2) continue;
      err = rp_decode(buf, (size_t)n, &pkt);
      if (err != RP_OK || (pkt.type != RP_HELLO && pkt.type != RP_PING)) {
        log_debug("rping responder %s:%u: dropped %zd bytes from %s: %s", ctx->addr_str, ctx->port, n,
                  sa_str(&from, who, sizeof(who)), err != RP_OK ? rp_err_str(err) : "not a request");
        continue;
      }
      uint8_t ep[RP_EP_LEN];
      if (pkt.type == RP_HELLO && pkt.version >= RP_VERSION2 && ctx->roce && rp_ep_put(&ctx->ep, ep)) {
        pkt.payload = ep; /* a version-2 client learns where to send RoCE probes */
        pkt.payload_len = RP_EP_LEN;
      }
      pkt.type = pkt.type == RP_HELLO ? RP_HELLO_ACK : RP_PONG;
      pkt.tos = tos;
      len = rp_encode(&pkt, buf, sizeof(buf)); /* in place: the payload stays where it is */
      if (len && rp_send_tos(ctx->resp_fd, buf, len, &from, tos) < 0)
        log_debug("rping responder %s:%u: answer to %s: %s", ctx->addr_str, ctx->port,
                  sa_str(&from, who, sizeof(who)), strerror(errno));
    }
  }
  return NULL;
}

/* ---- mode ROCE: the context's device, memory and responder QP ---- */

uint32_t rp_roce_max_payload(const struct rp_ctx *ctx) {
  uint32_t mtu = rdma_mtu_bytes(&ctx->dev);
  uint32_t room = mtu > RP_HDR_LEN ? mtu - RP_HDR_LEN : 0;
  return room < RP_MAX_PAYLOAD ? room : RP_MAX_PAYLOAD;
}

HccnResult rp_roce_open(struct rp_ctx *c) {
  const char *fn = "HccnRpingInit";
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = c->addr};
  char err[512];
  HccnResult r;

  if (!rdma_available())
    return rp_fail(HCCN_E_FAIL,
                   "%s: mode HCCN_RPING_MODE_ROCE probes over RDMA, and this host has no RDMA device; "
                   "use HCCN_RPING_MODE_UDP",
                   fn);
  if (!rdma_ip_has_device(&sa))
    return rp_fail(HCCN_E_FAIL,
                   "%s: mode HCCN_RPING_MODE_ROCE: no RDMA device owns %s (librdmacm found none); name the "
                   "address of a RoCE device, or use HCCN_RPING_MODE_UDP",
                   fn, c->addr_str);
  if (rdma_dev_open(&c->dev, &sa, NULL, -1, err, sizeof(err)) != 0)
    return rp_fail(HCCN_E_FAIL, "%s: mode HCCN_RPING_MODE_ROCE on %s: %s", fn, c->addr_str, err);
  /* A receive holds the GRH and the largest message the port carries. */
  c->resp_len = (RDMA_GRH_LEN + rdma_mtu_bytes(&c->dev) + RP_SLOT - 1) / RP_SLOT * RP_SLOT;
  c->mem_len = (size_t)RP_RESP_SLOTS * c->resp_len + c->buffer_size;
  c->mem = aligned_alloc(HCCN_RPING_BUFFER_ALIGN, c->mem_len);
  c->resp_ah = calloc(RP_RESP_SLOTS, sizeof(*c->resp_ah));
  c->resp_ent = malloc(RP_RESP_SLOTS * sizeof(*c->resp_ent));
  if (!c->mem || !c->resp_ah || !c->resp_ent) {
    r = rp_fail(HCCN_E_MEM, "%s: out of memory for %zu bytes of probe buffers", fn, c->mem_len);
    goto free_mem;
  }
  memset(c->mem, 0, c->mem_len);
  for (uint32_t k = 0; k < RP_RESP_SLOTS; k++) c->resp_ent[k] = -1;
  c->mr = rdma_reg_local(&c->dev, c->mem, c->mem_len, err, sizeof(err));
  if (!c->mr) {
    r = rp_fail(HCCN_E_FAIL, "%s: %s", fn, err);
    goto free_mem;
  }
  c->lkey = rdma_mr_lkey(c->mr);
  if (rdma_ud_open(&c->dev, &c->resp_ud, RP_QKEY, RP_RESP_SLOTS, RP_RESP_SLOTS, err, sizeof(err)) != 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: %s", fn, err);
    goto dereg;
  }
  for (uint32_t k = 0; k < c->resp_ud.max_recv; k++) {
    int rc = rdma_ud_post_recv(&c->resp_ud, c->mem + (size_t)k * c->resp_len, c->resp_len, c->lkey, k);
    if (rc != 0) {
      r = rp_fail(HCCN_E_FAIL, "%s: UD QP 0x%x: cannot post receive %u: %s", fn, c->resp_ud.qpn, k,
                  strerror(rc));
      goto close_ud;
    }
  }
  c->ep.qpn = c->resp_ud.qpn;
  c->ep.qkey = RP_QKEY;
  c->ep.mtu = rdma_mtu_bytes(&c->dev);
  memcpy(c->ep.gid, c->dev.gid, 16);
  log_info("rping: %s answers RoCE probes on %s UD QP 0x%x (GID index %d, MTU %u)", c->addr_str, c->dev.name,
           c->ep.qpn, c->dev.gid_index, c->ep.mtu);
  return HCCN_SUCCESS;

close_ud:
  rdma_ud_close(&c->resp_ud);
dereg:
  rdma_dereg(c->mr);
  c->mr = NULL;
free_mem:
  free(c->resp_ent);
  free(c->resp_ah);
  free(c->mem);
  c->resp_ent = NULL;
  c->resp_ah = NULL;
  c->mem = NULL;
  rdma_dev_close(&c->dev);
  return r;
}

/* Teardown in reverse: the QP (no DMA after it), the answers' AHs, the MR, the CQ and
 * channel, the memory, then the device's CQ, channel, PD and context. */
void rp_roce_close(struct rp_ctx *c) {
  rdma_ud_destroy_qp(&c->resp_ud);
  for (uint32_t k = 0; k < RP_RESP_SLOTS; k++)
    if (c->resp_ent[k] < 0) rdma_ah_free(c->resp_ah[k]);
  for (int k = 0; k < RP_AH_CACHE; k++) rdma_ah_free(c->ah_cache[k].ah);
  memset(c->ah_cache, 0, sizeof(c->ah_cache));
  rdma_dereg(c->mr);
  rdma_ud_close(&c->resp_ud);
  free(c->resp_ent);
  free(c->resp_ah);
  free(c->mem);
  rdma_dev_close(&c->dev);
  c->resp_ent = NULL;
  c->resp_ah = NULL;
  c->mem = NULL;
  c->mr = NULL;
}
