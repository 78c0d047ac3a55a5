/* wire: the control-plane and TCP data protocol. Every frame is a fixed 20-byte
 * header, a body parsed whole before anything acts on it, on an authenticated link
 * the frame's tag (WIRE_F_TAG), and for WRITE_REQ, READ_RESP and STAGE_WRITE a raw
 * payload (straight to or from registered memory, or, staged, packed ranges).
 * All integers are big-endian; no C struct is ever sent as is. */
#ifndef HIXL_WIRE_H
#define HIXL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC           0x4858494cu /* "HXIL" */
#define WIRE_VERSION         1u
#define WIRE_HDR_LEN         20u
#define WIRE_MAX_BODY        (4u << 20) /* control bodies, as HIXL caps them */
#define WIRE_MAX_PAYLOAD     (4u << 20) /* one data chunk; larger ops are split */
#define WIRE_MAX_NAME        255u       /* engine names */
#define WIRE_MAX_TAG         255u       /* memory tags */
#define WIRE_MAX_NOTIFY      1024u      /* notify name and message, each */
#define WIRE_MAX_MEM_ENTRIES 4096u
#define WIRE_MAX_STAGE       (16u << 20) /* data of one STAGE_* frame */
#define WIRE_MAX_STAGE_SEGS  4096u       /* ranges in one STAGE_* frame */
#define WIRE_STAGE_SEG_LEN   12u         /* addr u64, len u32 */
#define WIRE_MAX_CALL        (64u << 10) /* a CALL's request, or a CALL_RESP's answer */

/* Capability bits exchanged in HELLO / HELLO_ACK. */
#define WIRE_CAP_TCP_DATA   0x1u
#define WIRE_CAP_RDMA       0x2u   /* has an RDMA device and will connect a QP (RDMA_CONNECT) */
#define WIRE_CAP_SHM        0x4u   /* answers SHM_HELLO: same-host copies (process_vm_*) welcome */
#define WIRE_CAP_STAGE      0x8u   /* serves STAGE_WRITE / STAGE_READ into registered memory */
#define WIRE_CAP_STAGE_ANY  0x10u  /* ... and into memory it did not register (StagingUnregistered on) */
#define WIRE_CAP_STAGE_RDMA 0x20u  /* serves STAGE_PULL / STAGE_PUSH on its QP */
#define WIRE_CAP_CALL       0x40u  /* answers CALL (services such as the cache manager's lookups) */
#define WIRE_CAP_CALL_AFTER 0x80u  /* answers CALL_AFTER */
#define WIRE_CAP_AUTH       0x100u /* HELLO: the auth block follows the name (a key is to be proven) */
#define WIRE_CAP_RAILS      0x200u /* answers RAILS: the addresses it accepts links on (Rails) */
#define WIRE_CAP_PROVEN     0x400u /* keyed HELLO: every frame after AUTH_PROOF carries a tag (WIRE_F_TAG) */
#define WIRE_CAP_WIN        0x800u /* HELLO: takes WIN_ADD / WIN_DEL (a scoped target's RDMA windows) */
#define WIRE_CAP_WIN_RUNS                                                                                    \
  0x1000u /* HELLO: a WIN_ADD over windows it holds replaces them (windows per run, split) */
#define WIRE_CAP_CALL_TAG                                                                                    \
  0x2000u /* HELLO_ACK: answers CALL_TAG, and keeps receives posted on its RDMA links' QPs for the tags */
#define WIRE_CAP_DEVMEM                                                                                      \
  0x4000u /* HELLO: reads a memory entry's kind byte: device memory (WIRE_MEM_DEVICE) entries welcome */

/* Header flags. WIRE_F_TAG: the frame is proven: WIRE_TAG_LEN bytes follow its body
 * (before any payload), the tag over its header and body (util/auth.h). On an
 * authenticated link every frame after AUTH_PROOF has it, and no other frame may. */
#define WIRE_F_TAG 0x1u
/* WIRE_F_PAYLOAD_TAG (only with WIRE_F_TAG and a payload): another WIRE_TAG_LEN bytes
 * follow the payload, its tag (AuthPayloadTag). */
#define WIRE_F_PAYLOAD_TAG 0x2u
#define WIRE_TAG_LEN       16u

/* Authentication (docs/security.md). HELLO with WIRE_CAP_AUTH ends with the auth
 * block: nonce (32 bytes), a count u8 (1 or 2) and as many key ids (8 bytes each),
 * then the address the initiator dialled (u16 length, "ip:port"): it is in the
 * transcript, and the target serves the link only when it is one of its own names.
 * The target answers AUTH_CHALLENGE (its nonce, the key id it chose, its proof, its
 * name), the initiator AUTH_PROOF (its proof); only then HELLO_ACK. A refusal is a
 * HELLO_ACK with status WIRE_HELLO_AUTH and nothing else in it, or WIRE_HELLO_NOT_ME
 * and the target's name (what was dialled is not one of its names). */
#define WIRE_AUTH_NONCE   32u
#define WIRE_AUTH_MAC     32u
#define WIRE_AUTH_ID      8u
#define WIRE_AUTH_IDS_MAX 2u
/* HELLO extensions (docs/design.md, "How the protocol grows"): after HELLO's fields
 * above, entries of u16 type, u16 length and that many bytes, to the frame's end, at
 * most WIRE_HELLO_EXT_MAX bytes in all. A reader skips a type it does not know; a keyed
 * HELLO's extensions are in the auth transcript whole (auth_transcript_mac_ext). None is
 * defined yet: this lets an engine from now on take a HELLO that a later one grows. */
#define WIRE_HELLO_EXT_MAX        1024u
#define WIRE_HELLO_EXT_ENTRY      4u
#define WIRE_AUTH_BLOCK_MAX       (WIRE_AUTH_NONCE + 1u + WIRE_AUTH_ID * WIRE_AUTH_IDS_MAX + 2u + WIRE_MAX_NAME)
#define WIRE_AUTH_CHALLENGE_FIXED (WIRE_AUTH_NONCE + WIRE_AUTH_ID + WIRE_AUTH_MAC + 2u)

#define WIRE_MEM_ENTRY_FIXED 22u /* addr u64, len u64, rkey u32, kind u8, tag_len u8; then the tag */
/* A memory entry's kind: host memory, or device (accelerator) memory, which only the
 * owner's CPU moves (docs/device-memory.md). A kind 0 entry is what an engine before
 * device memory sent (the byte was the high byte of a u16 tag length). */
#define WIRE_MEM_HOST    0u
#define WIRE_MEM_DEVICE  1u
#define WIRE_QP_INFO_LEN 25u /* qpn u32, psn u32, gid 16 bytes, mtu u8 */

/* SHM_HELLO / SHM_HELLO_ACK: a layout number first; layout 1 is the fields below,
 * exactly. A later layout keeps them as a prefix and appends (at most
 * WIRE_SHM_EXT_MAX bytes), which a layout-1 reader skips. */
#define WIRE_SHM_LAYOUT 2u
#define WIRE_SHM_ID_LEN 26u /* layout u16, boot_id 16 bytes, pid u32, uid u32 */
/* Layout 2 appends: to SHM_HELLO a u32 of WIRE_SHM_F_* flags; to SHM_HELLO_ACK a u16
 * length and the name of a unix socket made for the link (abstract namespace, without
 * its leading NUL), always offered: it proves the target's pid (SO_PEERCRED), is bound
 * to the link on a keyed one, and hands the initiator memfd regions to map (SHM_MAP).
 * Length 0: none, and then no same-host copies. */
#define WIRE_SHM_F_MAP     0x1u /* SHM_HELLO: the initiator maps memfd regions a target offers */
#define WIRE_SHM_F_DEVMAP  0x2u /* SHM_HELLO: ... and opens device memory by IPC handle (SHM_DEV_MAP) */
#define WIRE_SHM_SOCK_MAX  100u /* bytes of that socket name: sun_path is 108, one is the NUL */
#define WIRE_SHM_MAP_LEN   24u  /* SHM_MAP: addr u64, len u64, map_len u64 */
#define WIRE_SHM_UNMAP_LEN 16u  /* SHM_UNMAP, SHM_UNMAP_ACK: addr u64, len u64 */
#define WIRE_SHM_IPC_BLOB  64u  /* SHM_DEV_MAP: the provider's handle (devmem.h DEVMEM_IPC_BLOB) */
/* SHM_DEV_MAP: addr u64, len u64, alloc_len u64, offset u64, the handle's 64 bytes */
#define WIRE_SHM_DEV_MAP_LEN   (32u + WIRE_SHM_IPC_BLOB)
#define WIRE_SHM_REASON_MAX    256u /* SHM_MAP_ACK's reason text */
#define WIRE_SHM_HELLO_LEN     WIRE_SHM_ID_LEN
#define WIRE_SHM_HELLO_ACK_LEN (4u + WIRE_SHM_ID_LEN + 8u + 16u) /* status, id, probe addr, nonce */
#define WIRE_SHM_EXT_MAX       256u

enum wire_type {
  WIRE_HELLO = 1,             /* initiator -> target: caps, name */
  WIRE_HELLO_ACK = 2,         /* target -> initiator: status, caps, name, memory table */
  WIRE_MEM_ADD = 3,           /* target -> initiator: a new registration */
  WIRE_MEM_DEL = 4,           /* target -> initiator: a registration is gone */
  WIRE_WRITE_REQ = 5,         /* seq, remote addr; payload = data */
  WIRE_WRITE_ACK = 6,         /* seq, status */
  WIRE_READ_REQ = 7,          /* seq, remote addr, len */
  WIRE_READ_RESP = 8,         /* seq, status; payload = data when status is 0 */
  WIRE_NOTIFY = 9,            /* seq, name, msg */
  WIRE_NOTIFY_ACK = 10,       /* seq, status */
  WIRE_SYNC = 11,             /* seq: answered after every MEM_ADD/MEM_DEL queued before it */
  WIRE_SYNC_ACK = 12,         /* seq, status */
  WIRE_RDMA_CONNECT = 13,     /* initiator -> target: its QP info */
  WIRE_RDMA_CONNECT_ACK = 14, /* target -> initiator: status, its QP info */
  WIRE_SHM_HELLO = 15,        /* initiator -> target: its host identity */
  WIRE_SHM_HELLO_ACK = 16,    /* target -> initiator: status, its identity, a probe to read */
  WIRE_STAGE_WRITE = 17,      /* seq, count, count x (addr, len); payload = the data, packed */
  WIRE_STAGE_READ = 18,       /* seq, count, count x (addr, len); answered by READ_RESP, packed */
  WIRE_STAGE_PULL = 19,       /* seq, buf addr, rkey, count, ranges: RDMA READ the packed data, scatter */
  WIRE_STAGE_PUSH = 20,       /* seq, buf addr, rkey, count, ranges: gather, RDMA WRITE it to buf */
  WIRE_CALL = 21,             /* seq, service u16, request bytes: a service's question */
  WIRE_CALL_RESP = 22,        /* seq, status, answer bytes (on failure: the reason, as text) */
  WIRE_SHM_MAP_HELLO = 23,    /* initiator -> target: flags u32 (0): I connected to your unix socket */
  WIRE_SHM_MAP = 24,          /* target -> initiator: addr, len, map_len: its memfd waits on that socket */
  WIRE_SHM_MAP_ACK = 25,      /* target -> initiator: status u32, reason text: the regions it had are sent */
  WIRE_SHM_UNMAP = 26,        /* target -> initiator: addr, len: unmap it, the target frees it */
  WIRE_SHM_UNMAP_ACK = 27,    /* initiator -> target: addr, len: unmapped, no copy touches it any more */
  WIRE_CALL_AFTER = 28,       /* seq, after u64, service u16, request bytes: a CALL served only if no
                                 WRITE on this link with a seq from after on was refused */
  WIRE_AUTH_CHALLENGE = 29,   /* target -> initiator: nonce, key id, proof, name (after a HELLO with auth) */
  WIRE_AUTH_PROOF = 30,       /* initiator -> target: proof */
  WIRE_RAILS = 31,            /* initiator -> target: seq: which addresses do you accept links on? */
  WIRE_RAILS_ACK = 32,        /* seq, count u32, count x (IPv4 address u32, port u16) */
  WIRE_WIN_ADD = 33,     /* target -> initiator: count u32, count x (addr, len, rkey): RDMA windows on this
                            link's QP over ranges granted to the peer (scoped memory) */
  WIRE_WIN_DEL = 34,     /* target -> initiator: count u32, count x (addr, len): those windows are gone */
  WIRE_SHM_DEV_MAP = 35, /* target -> initiator: addr, len, alloc_len, offset, IPC handle: a device
                            registration to open (only to an initiator that set WIRE_SHM_F_DEVMAP);
                            taken back with SHM_UNMAP */
  WIRE_CALL_TAG = 36,    /* seq, tag u32, service u16, request bytes: a CALL served once this link's QP
                            received an RDMA WRITE with immediate data tag (what the initiator posted
                            before that on the QP has landed); only on an RDMA link */
  WIRE_TYPE_MAX_ = 36,
};

/* HELLO_ACK status values. */
enum wire_hello_status {
  WIRE_HELLO_OK = 0,
  WIRE_HELLO_VERSION = 1,
  WIRE_HELLO_REFUSED = 2,
  WIRE_HELLO_AUTH = 3,   /* authentication required, or it failed */
  WIRE_HELLO_NOT_ME = 4, /* what the initiator dialled is not one of this engine's names (its name follows) */
};

/* Why wire_parse_hdr refused a header. */
enum wire_err {
  WIRE_OK = 0,
  WIRE_EMAGIC,   /* not a hixl peer */
  WIRE_EVERSION, /* a hixl peer speaking another protocol version; hdr is filled */
  WIRE_ETYPE,    /* unknown frame type */
  WIRE_ELEN,     /* body or payload length not allowed for the type */
  WIRE_EBODY,    /* body does not decode exactly */
};

struct wire_hdr {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t flags; /* WIRE_F_TAG or zero */
  uint32_t body_len;
  uint32_t payload_len;
  uint32_t reserved; /* zero in version 1 */
};

struct wire_mem_entry {
  uint64_t addr;
  uint64_t len;
  uint32_t rkey; /* RDMA remote key, 0 without RDMA */
  uint8_t kind;  /* WIRE_MEM_HOST or WIRE_MEM_DEVICE */
  uint16_t tag_len;
  const uint8_t *tag; /* points into the body; not NUL-terminated */
};

/* A decoded frame. Pointers point into the body buffer given to wire_decode. */
struct wire_msg {
  struct wire_hdr hdr;
  union {
    struct {
      uint32_t caps;
      uint16_t name_len;
      const uint8_t *name;
      const uint8_t *nonce; /* WIRE_CAP_AUTH: WIRE_AUTH_NONCE bytes; else NULL */
      uint8_t n_ids;        /* ... and key ids, WIRE_AUTH_ID bytes each, 1..WIRE_AUTH_IDS_MAX */
      const uint8_t *ids;
      uint16_t dialled_len; /* ... and the address the initiator dialled */
      const uint8_t *dialled;
      uint16_t ext_len; /* extensions after the fields above (WIRE_HELLO_EXT_MAX), 0: none */
      const uint8_t *ext;
    } hello;
    struct {
      const uint8_t *nonce; /* AUTH_CHALLENGE */
      const uint8_t *id;    /* AUTH_CHALLENGE: the key the target chose */
      const uint8_t *mac;   /* both */
      uint16_t name_len;    /* AUTH_CHALLENGE: the target's name */
      const uint8_t *name;
    } auth;
    struct {
      uint32_t status;
      uint32_t caps;
      uint16_t name_len;
      const uint8_t *name;
      uint32_t count;         /* memory entries, validated by wire_decode */
      const uint8_t *entries; /* walk with wire_mem_entry_next */
      size_t entries_len;
    } hello_ack;
    struct wire_mem_entry mem; /* MEM_ADD, MEM_DEL (tag empty) */
    struct {
      uint64_t seq;
      uint32_t count;       /* 1..WIRE_MAX_RAILS */
      const uint8_t *addrs; /* count x WIRE_RAIL_LEN: address (network order as sent), port */
    } rails;
    struct {
      uint32_t count;      /* 1..WIRE_MAX_WINS, each checked: len >= 1, no wrap */
      const uint8_t *ents; /* walk with wire_win */
    } win;
    struct {
      uint32_t status; /* RDMA_CONNECT_ACK only */
      uint32_t qpn;
      uint32_t psn;
      const uint8_t *gid; /* 16 bytes */
      uint8_t mtu;
    } qp;
    struct {
      uint32_t status;        /* SHM_HELLO_ACK only: WIRE_HELLO_OK, or WIRE_HELLO_REFUSED */
      uint16_t layout;        /* >= 1 */
      const uint8_t *boot_id; /* 16 bytes */
      uint32_t pid;
      uint32_t uid;
      uint64_t probe_addr;  /* SHM_HELLO_ACK only: where the nonce lies in the target */
      const uint8_t *nonce; /* SHM_HELLO_ACK only: 16 bytes */
      const uint8_t *ext;   /* fields of a later layout, not interpreted */
      uint32_t ext_len;
      uint32_t flags;      /* SHM_HELLO, layout >= 2: WIRE_SHM_F_*; else 0 */
      const uint8_t *sock; /* SHM_HELLO_ACK, layout >= 2: the socket name (sock_len bytes) */
      uint16_t sock_len;   /* 0: none */
    } shm;
    struct {
      uint64_t addr, len;  /* SHM_MAP, SHM_UNMAP, SHM_UNMAP_ACK, SHM_DEV_MAP: the target's region */
      uint64_t map_len;    /* SHM_MAP: bytes to map from the memfd; >= len */
      uint64_t alloc_len;  /* SHM_DEV_MAP: the device allocation's bytes ... */
      uint64_t offset;     /* ... and where the region starts in it (offset + len <= alloc_len) */
      const uint8_t *blob; /* SHM_DEV_MAP: the provider's handle, WIRE_SHM_IPC_BLOB bytes */
      uint32_t status;     /* SHM_MAP_ACK: WIRE_HELLO_OK or WIRE_HELLO_REFUSED */
      uint32_t flags;      /* SHM_MAP_HELLO */
      const uint8_t *text; /* SHM_MAP_ACK: why it refused (text_len bytes) */
      uint32_t text_len;
    } map;
    struct {
      uint64_t seq;
      uint64_t raddr;
    } write_req;
    struct {
      uint64_t seq;
      uint64_t raddr;
      uint32_t len;
    } read_req;
    struct {
      uint64_t seq;
      uint32_t status;
    } ack; /* WRITE_ACK, READ_RESP, NOTIFY_ACK, SYNC_ACK; SYNC (status 0) */
    struct {
      uint64_t seq;
      uint64_t buf;        /* STAGE_PULL / STAGE_PUSH: the initiator's staging buffer */
      uint32_t rkey;       /* ... and its RDMA key */
      uint32_t count;      /* ranges, each checked: len >= 1 */
      uint64_t total;      /* sum of the lengths; = payload_len for STAGE_WRITE */
      const uint8_t *segs; /* walk with wire_stage_seg */
    } stage;
    struct {
      uint64_t seq;
      uint16_t name_len;
      uint16_t msg_len;
      const uint8_t *name;
      const uint8_t *msg;
    } notify;
    struct {
      uint64_t seq;
      uint32_t status;     /* CALL_RESP only */
      uint16_t service;    /* CALL and CALL_AFTER */
      uint64_t after;      /* CALL_AFTER: the first seq of the WRITEs it follows; CALL_TAG: the tag */
      const uint8_t *data; /* the request or the answer, inside the body */
      uint32_t len;        /* <= WIRE_MAX_CALL */
    } call;
  } u;
};

/* Builds frames into a caller's buffer; overflow is sticky and reported by end. */
struct wire_wr {
  uint8_t *buf;
  size_t cap;
  size_t len;
  bool overflow;
};

const char *wire_err_str(enum wire_err err);
const char *wire_type_name(unsigned type);

/* Parse and check a 20-byte header: magic, version, type, and lengths allowed for
 * the type. On WIRE_EVERSION the header is still filled so the caller can answer. */
enum wire_err wire_parse_hdr(const uint8_t buf[WIRE_HDR_LEN], struct wire_hdr *hdr);

/* Decode a whole body (hdr->body_len bytes) for hdr->type; every length inside must
 * add up to the body exactly. */
enum wire_err wire_decode(const struct wire_hdr *hdr, const uint8_t *body, struct wire_msg *msg);

/* Step through a HELLO_ACK's entries; returns false after the last. */
bool wire_mem_entry_next(const uint8_t **cursor, size_t *left, struct wire_mem_entry *entry);

/* Range i of a decoded STAGE_WRITE / STAGE_READ / STAGE_PULL / STAGE_PUSH (i < count). */
void wire_stage_seg(const struct wire_msg *m, uint32_t i, uint64_t *addr, uint32_t *len);

/* Frame builders: wire_begin reserves the header, wire_end fills it in with the
 * body length written since and the payload length that follows the frame. */
void wire_begin(struct wire_wr *w, uint8_t *buf, size_t cap, enum wire_type type);
size_t wire_end(struct wire_wr *w, uint32_t payload_len); /* 0 on overflow */
void wire_put_u16(struct wire_wr *w, uint16_t v);
void wire_put_u32(struct wire_wr *w, uint32_t v);
void wire_put_u64(struct wire_wr *w, uint64_t v);
void wire_put_bytes(struct wire_wr *w, const void *p, size_t n);
void wire_put_mem_entry(struct wire_wr *w, uint64_t addr, uint64_t len, uint32_t rkey, const char *tag);
/* ... of a kind (WIRE_MEM_*). */
void wire_put_mem_entry_kind(struct wire_wr *w, uint64_t addr, uint64_t len, uint32_t rkey, const char *tag,
                             uint8_t kind);
void wire_put_qp_info(struct wire_wr *w, uint32_t qpn, uint32_t psn, const uint8_t gid[16], uint8_t mtu);
/* The identity that opens SHM_HELLO and follows the status in SHM_HELLO_ACK, layout 1. */
/* The identity SHM_HELLO and SHM_HELLO_ACK start with; layout: WIRE_SHM_LAYOUT, or 1
 * for a frame without the layout-2 fields. */
void wire_put_shm_id(struct wire_wr *w, uint16_t layout, const uint8_t boot_id[16], uint32_t pid,
                     uint32_t uid);

/* Header-only builder for the hot path (WRITE_REQ, READ_REQ, acks): returns length. */
size_t wire_put_write_req(uint8_t *buf, uint64_t seq, uint64_t raddr, uint32_t len);
size_t wire_put_read_req(uint8_t *buf, uint64_t seq, uint64_t raddr, uint32_t len);
size_t wire_put_sync(uint8_t *buf, uint64_t seq);
/* RAILS (seq) and its answer: n (1..WIRE_MAX_RAILS) IPv4 addresses (host order) and ports. */
#define WIRE_MAX_RAILS 8
#define WIRE_RAIL_LEN  6
/* WIN_ADD / WIN_DEL entries; a frame holds at most WIRE_MAX_WINS. */
#define WIRE_WIN_LEN     20u /* addr u64, len u64, rkey u32 */
#define WIRE_WIN_DEL_LEN 16u /* addr u64, len u64 */
#define WIRE_MAX_WINS    4096u
/* Build a WIN_ADD (rkey non-NULL) or WIN_DEL frame of n entries into buf; 0 when cap is too small. */
size_t wire_put_wins(uint8_t *buf, size_t cap, const uint64_t (*range)[2], const uint32_t *rkey, uint32_t n);
/* Entry i of a decoded WIN_ADD / WIN_DEL (i < count; rkey 0 for WIN_DEL). */
void wire_win(const struct wire_msg *m, uint32_t i, uint64_t *addr, uint64_t *len, uint32_t *rkey);
size_t wire_put_rails(uint8_t *buf, uint64_t seq);
size_t wire_put_rails_ack(uint8_t *buf, size_t cap, uint64_t seq, const uint32_t *addr, const uint16_t *port,
                          uint32_t n);
void wire_rail_at(const struct wire_msg *m, uint32_t i, uint32_t *addr, uint16_t *port);
/* HELLO of an engine called name offering caps (WIRE_CAP_*); 0 when cap is too small. */
size_t wire_put_hello(uint8_t *buf, size_t cap, uint32_t caps, const char *name);
/* ... with the auth block: nonce and n_ids key ids (caps gains WIRE_CAP_AUTH). */
size_t wire_put_hello_auth(uint8_t *buf, size_t cap, uint32_t caps, const char *name,
                           const uint8_t nonce[WIRE_AUTH_NONCE], const uint8_t *ids, unsigned n_ids,
                           const char *dialled);
/* Append one HELLO extension entry (type, len bytes of val) to the HELLO of len bytes in
 * buf: the new length, or 0 when cap or WIRE_HELLO_EXT_MAX is too small. */
size_t wire_hello_add_ext(uint8_t *buf, size_t cap, size_t len, uint16_t type, const void *val,
                          uint16_t vlen);
/* STAGE_WRITE / STAGE_READ header and seq/count: the caller then appends count ranges
 * with wire_put_stage_seg into buf (WIRE_HDR_LEN + 12 + count * 12 bytes in all). */
size_t wire_put_stage(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t count, uint32_t payload_len);
/* STAGE_PULL / STAGE_PUSH: the same with the buffer's address and key after seq
 * (WIRE_HDR_LEN + 24 + count * 12 bytes in all); ranges with wire_put_stage_seg. */
size_t wire_put_stage_rdma(uint8_t *buf, enum wire_type type, uint64_t seq, uint64_t sbuf, uint32_t rkey,
                           uint32_t count);
/* Range i of a frame built by wire_put_stage (rdma false) or wire_put_stage_rdma. */
void wire_put_stage_seg(uint8_t *buf, bool rdma, uint32_t i, uint64_t addr, uint32_t len);
size_t wire_put_ack(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t status, uint32_t payload_len);
/* CALL (seq, service, then len bytes) or CALL_RESP (seq, status, then len bytes):
 * writes the header and the fixed fields; the len bytes go at buf + WIRE_CALL_REQ_AT
 * (CALL) or buf + WIRE_CALL_RESP_AT (CALL_RESP). Returns the frame's whole length. */
#define WIRE_CALL_REQ_AT  (WIRE_HDR_LEN + 10u)
#define WIRE_CALL_RESP_AT (WIRE_HDR_LEN + 12u)
size_t wire_put_call(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t service_or_status,
                     uint32_t len);
/* CALL_AFTER (seq, after, service, then len bytes at buf + WIRE_CALL_AFTER_AT). */
#define WIRE_CALL_AFTER_AT (WIRE_HDR_LEN + 18u)
size_t wire_put_call_after(uint8_t *buf, uint64_t seq, uint64_t after, uint16_t service, uint32_t len);
/* CALL_TAG (seq, tag, service, then len bytes at buf + WIRE_CALL_TAG_AT). */
#define WIRE_CALL_TAG_AT (WIRE_HDR_LEN + 14u)
size_t wire_put_call_tag(uint8_t *buf, uint64_t seq, uint32_t tag, uint16_t service, uint32_t len);

#define WIRE_SMALL_FRAME 48u /* the largest frame built by wire_put_write_req / read_req / sync / ack */

#endif
