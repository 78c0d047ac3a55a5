/* rping_wire: the RPing probe packet. One UDP datagram (or one RoCE UD message) is a
 * fixed 32-byte header and an optional payload; all integers are big-endian and no C
 * struct is sent as is.
 *
 *  0       4     5      6     7       8        10            12       16        20    24          32
 *  | magic | ver | type | tos | flags | length | payload_len | batch | target | seq | stamp | payload
 *  magic = 0x48585250 ("HXRP"), ver = 1 or 2, flags = 0, length = 32 + payload_len
 *
 * A request (HELLO, PING) is answered by the responder with the same header and
 * payload, type turned into its answer and tos set to the IP TOS byte (RoCE: the GRH
 * traffic class) it received.
 *
 * Version 1 is what UDP contexts send, byte for byte as before version 2 existed.
 * Version 2 is what RoCE contexts send; it differs in one rule: a HELLO_ACK may carry
 * the responder's RoCE endpoint (RP_EP_LEN bytes, below) as its payload. Responders
 * answer in the version they were asked in, so a version-1 peer never sees version 2.
 *
 *  RoCE endpoint: 0 kind (1 = RoCE UD) | 1 reserved[3] = 0 | 4 qpn | 8 qkey | 12 mtu | 16 gid[16] | 32
 *  A receiver takes it only from the target it dialled and only when gid is that
 *  target's own address, IPv4-mapped (::ffff:a.b.c.d): what every responder sends. */
#ifndef HIXL_RPING_WIRE_H
#define HIXL_RPING_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define RP_MAGIC       0x48585250u /* "HXRP" */
#define RP_VERSION1    1u          /* UDP contexts */
#define RP_VERSION2    2u          /* RoCE contexts: HELLO_ACK may carry an endpoint */
#define RP_HDR_LEN     32u
#define RP_MAX_PAYLOAD 1500u
#define RP_MAX_PKT     (RP_HDR_LEN + RP_MAX_PAYLOAD)
#define RP_EP_LEN      32u /* a RoCE endpoint in a version-2 HELLO_ACK */
#define RP_EP_ROCE_UD  1u  /* endpoint kind: a RoCE UD queue pair */

enum rp_type {
  RP_HELLO = 1,     /* client -> responder: are you there? target = nonce */
  RP_HELLO_ACK = 2, /* responder -> client: yes (version 2: and here is my RoCE endpoint) */
  RP_PING = 3,      /* client -> responder: one probe, with the target's payload */
  RP_PONG = 4,      /* responder -> client: the probe echoed */
};

/* Why rp_decode refused a datagram. */
enum rp_err {
  RP_OK = 0,
  RP_ESHORT,    /* shorter than the header */
  RP_EMAGIC,    /* not an RPing packet */
  RP_EVERSION,  /* another protocol version */
  RP_ETYPE,     /* unknown type */
  RP_EFLAGS,    /* flags not zero */
  RP_ELEN,      /* length fields disagree with the datagram or the limits */
  RP_EENDPOINT, /* a HELLO_ACK's RoCE endpoint has a field out of range */
};

/* A responder's RoCE UD endpoint: where probes go and what they may carry. */
struct rp_ep {
  uint32_t qpn;    /* UD queue pair number, 2..0xfffffe (0xffffff is the multicast QPN) */
  uint32_t qkey;   /* the Q_Key probes must carry */
  uint32_t mtu;    /* bytes one message may carry: 256, 512, 1024, 2048 or 4096 */
  uint8_t gid[16]; /* the responder's GID (RoCE v2: its IPv4-mapped address) */
};

struct rp_pkt {
  uint8_t version; /* RP_VERSION1 or RP_VERSION2; rp_encode takes 0 as 1 */
  uint8_t type;
  uint8_t tos; /* answers: the TOS byte / traffic class the responder saw; requests: 0 */
  uint32_t batch;
  uint32_t target;
  uint32_t seq;
  uint64_t stamp;         /* client's send time; echoed, never trusted */
  uint16_t payload_len;   /* <= RP_MAX_PAYLOAD; 0 for HELLO, 0 or RP_EP_LEN for HELLO_ACK */
  const uint8_t *payload; /* points into the decoded buffer */
};

/* Write pkt (header, then payload_len bytes of pkt->payload) into buf; returns the
 * datagram length, or 0 when cap is too small or the packet is not valid. */
size_t rp_encode(const struct rp_pkt *pkt, uint8_t *buf, size_t cap);
/* Check and decode one datagram of n bytes; pkt is written only on RP_OK. A version-2
 * HELLO_ACK's endpoint is checked too (rp_ep_get reads it). */
enum rp_err rp_decode(const uint8_t *buf, size_t n, struct rp_pkt *pkt);
const char *rp_err_str(enum rp_err err);

/* Write ep as RP_EP_LEN bytes into out; 0 when a field is out of range. */
size_t rp_ep_put(const struct rp_ep *ep, uint8_t *out);
/* Check and read an endpoint of n bytes; ep is written only on RP_OK. */
enum rp_err rp_ep_get(const uint8_t *p, size_t n, struct rp_ep *ep);

#endif
