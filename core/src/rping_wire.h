/* rping_wire: the RPing probe packet. One UDP datagram is a fixed 32-byte header and
 * an optional payload; all integers are big-endian and no C struct is sent as is.
 *
 *  0       4     5      6     7       8        10            12       16        20    24          32
 *  | magic | ver | type | tos | flags | length | payload_len | batch | target | seq | stamp | payload
 *  magic = 0x48585250 ("HXRP"), ver = 1, flags = 0, length = 32 + payload_len
 *
 * A request (HELLO, PING) is answered by the responder with the same header and
 * payload, type turned into its answer and tos set to the IP TOS byte it received. */
#ifndef HIXL_RPING_WIRE_H
#define HIXL_RPING_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define RP_MAGIC       0x48585250u /* "HXRP" */
#define RP_VERSION     1u
#define RP_HDR_LEN     32u
#define RP_MAX_PAYLOAD 1500u
#define RP_MAX_PKT     (RP_HDR_LEN + RP_MAX_PAYLOAD)

enum rp_type {
  RP_HELLO = 1,     /* client -> responder: are you there? target = nonce */
  RP_HELLO_ACK = 2, /* responder -> client: yes */
  RP_PING = 3,      /* client -> responder: one probe, with the target's payload */
  RP_PONG = 4,      /* responder -> client: the probe echoed */
};

/* Why rp_decode refused a datagram. */
enum rp_err {
  RP_OK = 0,
  RP_ESHORT,   /* shorter than the header */
  RP_EMAGIC,   /* not an RPing packet */
  RP_EVERSION, /* another protocol version */
  RP_ETYPE,    /* unknown type */
  RP_EFLAGS,   /* flags not zero */
  RP_ELEN,     /* length fields disagree with the datagram or the limits */
};

struct rp_pkt {
  uint8_t type;
  uint8_t tos; /* answers: the TOS byte the responder saw; requests: 0 */
  uint32_t batch;
  uint32_t target;
  uint32_t seq;
  uint64_t stamp;         /* client's send time; echoed, never trusted */
  uint16_t payload_len;   /* <= RP_MAX_PAYLOAD; 0 for HELLO and HELLO_ACK */
  const uint8_t *payload; /* points into the decoded buffer */
};

/* Write pkt (header, then payload_len bytes of pkt->payload) into buf; returns the
 * datagram length, or 0 when cap is too small or the packet is not valid. */
size_t rp_encode(const struct rp_pkt *pkt, uint8_t *buf, size_t cap);
/* Check and decode one datagram of n bytes; pkt is written only on RP_OK. */
enum rp_err rp_decode(const uint8_t *buf, size_t n, struct rp_pkt *pkt);
const char *rp_err_str(enum rp_err err);

#endif
