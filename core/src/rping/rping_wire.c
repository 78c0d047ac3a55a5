/* rping_wire: encode and check RPing probe packets (see rping_wire.h). */
#include "rping/rping_wire.h"

#include <string.h>

#include "util/be.h"

static int ep_ok(const struct rp_ep *ep) {
  /* QPN 0 and 1 are the SMI and GSI QPs, 0xffffff the multicast QPN: none is a responder's. */
  return ep->qpn >= 2 && ep->qpn < 0xffffff &&
         (ep->mtu == 256 || ep->mtu == 512 || ep->mtu == 1024 || ep->mtu == 2048 || ep->mtu == 4096);
}

size_t rp_ep_put(const struct rp_ep *ep, uint8_t *out) {
  if (!ep_ok(ep)) return 0;
  out[0] = RP_EP_ROCE_UD;
  out[1] = out[2] = out[3] = 0;
  be_put32(out + 4, ep->qpn);
  be_put32(out + 8, ep->qkey);
  be_put32(out + 12, ep->mtu);
  memcpy(out + 16, ep->gid, 16);
  return RP_EP_LEN;
}

enum rp_err rp_ep_get(const uint8_t *p, size_t n, struct rp_ep *ep) {
  struct rp_ep e;
  if (n != RP_EP_LEN) return RP_ELEN;
  if (p[0] != RP_EP_ROCE_UD || p[1] || p[2] || p[3]) return RP_EENDPOINT;
  e.qpn = be_get32(p + 4);
  e.qkey = be_get32(p + 8);
  e.mtu = be_get32(p + 12);
  memcpy(e.gid, p + 16, 16);
  if (!ep_ok(&e)) return RP_EENDPOINT;
  *ep = e;
  return RP_OK;
}

/* The payload a packet of this version and type may carry. */
static enum rp_err payload_ok(uint8_t version, uint8_t type, uint16_t payload_len, const uint8_t *payload) {
  struct rp_ep ep;
  switch (type) {
  case RP_HELLO: return payload_len == 0 ? RP_OK : RP_ELEN;
  case RP_HELLO_ACK:
    if (payload_len == 0) return RP_OK;
    if (version < RP_VERSION2 || payload_len != RP_EP_LEN || !payload) return RP_ELEN;
    return rp_ep_get(payload, payload_len, &ep);
  case RP_PING:
  case RP_PONG: return payload_len <= RP_MAX_PAYLOAD ? RP_OK : RP_ELEN;
  default: return RP_ETYPE;
  }
}

size_t rp_encode(const struct rp_pkt *pkt, uint8_t *buf, size_t cap) {
  size_t len = RP_HDR_LEN + pkt->payload_len;
  uint8_t version = pkt->version ? pkt->version : RP_VERSION1;
  if (version > RP_VERSION2 || len > cap || (pkt->payload_len && !pkt->payload) ||
      payload_ok(version, pkt->type, pkt->payload_len, pkt->payload) != RP_OK)
    return 0;
  be_put32(buf, RP_MAGIC);
  buf[4] = version;
  buf[5] = pkt->type;
  buf[6] = pkt->tos;
  buf[7] = 0;
  be_put16(buf + 8, (uint16_t)len);
  be_put16(buf + 10, pkt->payload_len);
  be_put32(buf + 12, pkt->batch);
  be_put32(buf + 16, pkt->target);
  be_put32(buf + 20, pkt->seq);
  be_put64(buf + 24, pkt->stamp);
  if (pkt->payload_len) memmove(buf + RP_HDR_LEN, pkt->payload, pkt->payload_len);
  return len;
}

enum rp_err rp_decode(const uint8_t *buf, size_t n, struct rp_pkt *pkt) {
  uint16_t len, payload_len;
  enum rp_err err;
  if (n < RP_HDR_LEN) return RP_ESHORT;
  if (be_get32(buf) != RP_MAGIC) return RP_EMAGIC;
  if (buf[4] != RP_VERSION1 && buf[4] != RP_VERSION2) return RP_EVERSION;
  if (buf[5] < RP_HELLO || buf[5] > RP_PONG) return RP_ETYPE;
  if (buf[7] != 0) return RP_EFLAGS;
  len = be_get16(buf + 8);
  payload_len = be_get16(buf + 10);
  if (len != n || payload_len != n - RP_HDR_LEN) return RP_ELEN;
  if ((err = payload_ok(buf[4], buf[5], payload_len, buf + RP_HDR_LEN)) != RP_OK) return err;
  pkt->version = buf[4];
  pkt->type = buf[5];
  pkt->tos = buf[6];
  pkt->payload_len = payload_len;
  pkt->batch = be_get32(buf + 12);
  pkt->target = be_get32(buf + 16);
  pkt->seq = be_get32(buf + 20);
  pkt->stamp = be_get64(buf + 24);
  pkt->payload = payload_len ? buf + RP_HDR_LEN : NULL;
  return RP_OK;
}

const char *rp_err_str(enum rp_err err) {
  static const char *const s[] = {
      [RP_OK] = "ok",
      [RP_ESHORT] = "shorter than the 32-byte header",
      [RP_EMAGIC] = "bad magic (not an RPing packet)",
      [RP_EVERSION] = "unsupported protocol version",
      [RP_ETYPE] = "unknown packet type",
      [RP_EFLAGS] = "flags not zero",
      [RP_ELEN] = "length fields do not match the datagram",
      [RP_EENDPOINT] = "RoCE endpoint field out of range",
  };
  return (unsigned)err < sizeof(s) / sizeof(s[0]) ? s[err] : "unknown error";
}
