/* rping_wire: encode and check RPing probe packets (see rping_wire.h). */
#include "rping_wire.h"

#include <string.h>

static void be16_put(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void be32_put(uint8_t *p, uint32_t v) {
  be16_put(p, (uint16_t)(v >> 16));
  be16_put(p + 2, (uint16_t)v);
}

static void be64_put(uint8_t *p, uint64_t v) {
  be32_put(p, (uint32_t)(v >> 32));
  be32_put(p + 4, (uint32_t)v);
}

static uint16_t be16_get(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static uint32_t be32_get(const uint8_t *p) { return ((uint32_t)be16_get(p) << 16) | be16_get(p + 2); }
static uint64_t be64_get(const uint8_t *p) { return ((uint64_t)be32_get(p) << 32) | be32_get(p + 4); }

static int type_ok(uint8_t type, uint16_t payload_len) {
  switch (type) {
  case RP_HELLO:
  case RP_HELLO_ACK: return payload_len == 0;
  case RP_PING:
  case RP_PONG: return payload_len <= RP_MAX_PAYLOAD;
  default: return 0;
  }
}

size_t rp_encode(const struct rp_pkt *pkt, uint8_t *buf, size_t cap) {
  size_t len = RP_HDR_LEN + pkt->payload_len;
  if (!type_ok(pkt->type, pkt->payload_len) || len > cap || (pkt->payload_len && !pkt->payload)) return 0;
  be32_put(buf, RP_MAGIC);
  buf[4] = RP_VERSION;
  buf[5] = pkt->type;
  buf[6] = pkt->tos;
  buf[7] = 0;
  be16_put(buf + 8, (uint16_t)len);
  be16_put(buf + 10, pkt->payload_len);
  be32_put(buf + 12, pkt->batch);
  be32_put(buf + 16, pkt->target);
  be32_put(buf + 20, pkt->seq);
  be64_put(buf + 24, pkt->stamp);
  if (pkt->payload_len) memmove(buf + RP_HDR_LEN, pkt->payload, pkt->payload_len);
  return len;
}

enum rp_err rp_decode(const uint8_t *buf, size_t n, struct rp_pkt *pkt) {
  uint16_t len, payload_len;
  if (n < RP_HDR_LEN) return RP_ESHORT;
  if (be32_get(buf) != RP_MAGIC) return RP_EMAGIC;
  if (buf[4] != RP_VERSION) return RP_EVERSION;
  if (buf[5] < RP_HELLO || buf[5] > RP_PONG) return RP_ETYPE;
  if (buf[7] != 0) return RP_EFLAGS;
  len = be16_get(buf + 8);
  payload_len = be16_get(buf + 10);
  if (len != n || payload_len != n - RP_HDR_LEN || !type_ok(buf[5], payload_len)) return RP_ELEN;
  pkt->type = buf[5];
  pkt->tos = buf[6];
  pkt->payload_len = payload_len;
  pkt->batch = be32_get(buf + 12);
  pkt->target = be32_get(buf + 16);
  pkt->seq = be32_get(buf + 20);
  pkt->stamp = be64_get(buf + 24);
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
  };
  return (unsigned)err < sizeof(s) / sizeof(s[0]) ? s[err] : "unknown error";
}
