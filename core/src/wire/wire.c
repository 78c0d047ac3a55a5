/* wire: encode and decode; see wire.h and docs/design.md for the layout. */
#include "wire/wire.h"

#include <string.h>

#include "util/be.h"

const char *wire_err_str(enum wire_err err) {
  switch (err) {
  case WIRE_OK: return "ok";
  case WIRE_EMAGIC: return "bad magic (not a hixl peer)";
  case WIRE_EVERSION: return "protocol version mismatch";
  case WIRE_ETYPE: return "unknown frame type";
  case WIRE_ELEN: return "length not allowed for the frame type";
  case WIRE_EBODY: return "malformed frame body";
  }
  return "unknown wire error";
}

const char *wire_type_name(unsigned type) {
  static const char *const names[] = {
      "?",          "HELLO",        "HELLO_ACK",        "MEM_ADD",       "MEM_DEL",       "WRITE_REQ",
      "WRITE_ACK",  "READ_REQ",     "READ_RESP",        "NOTIFY",        "NOTIFY_ACK",    "SYNC",
      "SYNC_ACK",   "RDMA_CONNECT", "RDMA_CONNECT_ACK", "SHM_HELLO",     "SHM_HELLO_ACK", "STAGE_WRITE",
      "STAGE_READ", "STAGE_PULL",   "STAGE_PUSH",       "CALL",          "CALL_RESP",     "SHM_MAP_HELLO",
      "SHM_MAP",    "SHM_MAP_ACK",  "SHM_UNMAP",        "SHM_UNMAP_ACK", "CALL_AFTER",    "AUTH_CHALLENGE",
      "AUTH_PROOF", "RAILS",        "RAILS_ACK",        "WIN_ADD",       "WIN_DEL",       "SHM_DEV_MAP",
      "CALL_TAG"};
  return type <= WIRE_TYPE_MAX_ ? names[type] : "?";
}

/* Body size limits per type: fixed types give min == max. */
static const struct {
  uint32_t min, max;
  uint32_t payload; /* the largest payload the type may carry */
} wire_limits[WIRE_TYPE_MAX_ + 1] = {
    [WIRE_HELLO] = {6, 6 + WIRE_MAX_NAME + WIRE_AUTH_BLOCK_MAX + WIRE_HELLO_EXT_MAX, 0},
    [WIRE_HELLO_ACK] = {14, WIRE_MAX_BODY, 0},
    [WIRE_MEM_ADD] = {WIRE_MEM_ENTRY_FIXED, WIRE_MEM_ENTRY_FIXED + WIRE_MAX_TAG, 0},
    [WIRE_MEM_DEL] = {WIRE_MEM_ENTRY_FIXED, WIRE_MEM_ENTRY_FIXED, 0},
    [WIRE_WRITE_REQ] = {16, 16, WIRE_MAX_PAYLOAD},
    [WIRE_WRITE_ACK] = {12, 12, 0},
    [WIRE_READ_REQ] = {20, 20, 0},
    [WIRE_READ_RESP] = {12, 12, WIRE_MAX_STAGE},
    [WIRE_NOTIFY] = {12, 12 + 2 * WIRE_MAX_NOTIFY, 0},
    [WIRE_NOTIFY_ACK] = {12, 12, 0},
    [WIRE_SYNC] = {8, 8, 0},
    [WIRE_SYNC_ACK] = {12, 12, 0},
    [WIRE_RDMA_CONNECT] = {WIRE_QP_INFO_LEN, WIRE_QP_INFO_LEN, 0},
    [WIRE_RDMA_CONNECT_ACK] = {4 + WIRE_QP_INFO_LEN, 4 + WIRE_QP_INFO_LEN, 0},
    [WIRE_SHM_HELLO] = {WIRE_SHM_HELLO_LEN, WIRE_SHM_HELLO_LEN + WIRE_SHM_EXT_MAX, 0},
    [WIRE_SHM_HELLO_ACK] = {WIRE_SHM_HELLO_ACK_LEN, WIRE_SHM_HELLO_ACK_LEN + WIRE_SHM_EXT_MAX, 0},
    [WIRE_STAGE_WRITE] = {12 + WIRE_STAGE_SEG_LEN, 12 + (WIRE_STAGE_SEG_LEN * WIRE_MAX_STAGE_SEGS),
                          WIRE_MAX_STAGE},
    [WIRE_STAGE_READ] = {12 + WIRE_STAGE_SEG_LEN, 12 + (WIRE_STAGE_SEG_LEN * WIRE_MAX_STAGE_SEGS), 0},
    [WIRE_STAGE_PULL] = {24 + WIRE_STAGE_SEG_LEN, 24 + (WIRE_STAGE_SEG_LEN * WIRE_MAX_STAGE_SEGS), 0},
    [WIRE_STAGE_PUSH] = {24 + WIRE_STAGE_SEG_LEN, 24 + (WIRE_STAGE_SEG_LEN * WIRE_MAX_STAGE_SEGS), 0},
    [WIRE_CALL] = {10, 10 + WIRE_MAX_CALL, 0},
    [WIRE_CALL_RESP] = {12, 12 + WIRE_MAX_CALL, 0},
    [WIRE_SHM_MAP_HELLO] = {4, 4, 0},
    [WIRE_SHM_MAP] = {WIRE_SHM_MAP_LEN, WIRE_SHM_MAP_LEN, 0},
    [WIRE_SHM_MAP_ACK] = {4, 4 + WIRE_SHM_REASON_MAX, 0},
    [WIRE_SHM_UNMAP] = {WIRE_SHM_UNMAP_LEN, WIRE_SHM_UNMAP_LEN, 0},
    [WIRE_SHM_UNMAP_ACK] = {WIRE_SHM_UNMAP_LEN, WIRE_SHM_UNMAP_LEN, 0},
    [WIRE_CALL_AFTER] = {18, 18 + WIRE_MAX_CALL, 0},
    [WIRE_AUTH_CHALLENGE] = {WIRE_AUTH_CHALLENGE_FIXED, WIRE_AUTH_CHALLENGE_FIXED + WIRE_MAX_NAME, 0},
    [WIRE_AUTH_PROOF] = {WIRE_AUTH_MAC, WIRE_AUTH_MAC, 0},
    [WIRE_RAILS] = {8, 8, 0},
    [WIRE_RAILS_ACK] = {12 + WIRE_RAIL_LEN, 12 + WIRE_RAIL_LEN *WIRE_MAX_RAILS, 0},
    [WIRE_WIN_ADD] = {4 + WIRE_WIN_LEN, 4 + WIRE_WIN_LEN *WIRE_MAX_WINS, 0},
    [WIRE_WIN_DEL] = {4 + WIRE_WIN_DEL_LEN, 4 + WIRE_WIN_DEL_LEN *WIRE_MAX_WINS, 0},
    [WIRE_SHM_DEV_MAP] = {WIRE_SHM_DEV_MAP_LEN, WIRE_SHM_DEV_MAP_LEN, 0},
    [WIRE_CALL_TAG] = {14, 14 + WIRE_MAX_CALL, 0},
};

enum wire_err wire_parse_hdr(const uint8_t buf[WIRE_HDR_LEN], struct wire_hdr *hdr) {
  hdr->magic = be_get32(buf);
  hdr->version = buf[4];
  hdr->type = buf[5];
  hdr->flags = be_get16(buf + 6);
  hdr->body_len = be_get32(buf + 8);
  hdr->payload_len = be_get32(buf + 12);
  hdr->reserved = be_get32(buf + 16);
  if (hdr->magic != WIRE_MAGIC) return WIRE_EMAGIC;
  if (hdr->version != WIRE_VERSION) return WIRE_EVERSION;
  if (hdr->type == 0 || hdr->type > WIRE_TYPE_MAX_) return WIRE_ETYPE;
  if ((hdr->flags & ~(WIRE_F_TAG | WIRE_F_PAYLOAD_TAG)) != 0 || hdr->reserved != 0) return WIRE_ELEN;
  if ((hdr->flags & WIRE_F_PAYLOAD_TAG) && (!(hdr->flags & WIRE_F_TAG) || hdr->payload_len == 0))
    return WIRE_ELEN;
  if (hdr->body_len < wire_limits[hdr->type].min || hdr->body_len > wire_limits[hdr->type].max)
    return WIRE_ELEN;
  if (hdr->payload_len > wire_limits[hdr->type].payload) return WIRE_ELEN;
  return WIRE_OK;
}

/* Reads one memory entry; false when the bytes left cannot hold it. */
static bool mem_entry_get(const uint8_t **p, size_t *left, struct wire_mem_entry *e) {
  if (*left < WIRE_MEM_ENTRY_FIXED) return false;
  e->addr = be_get64(*p);
  e->len = be_get64(*p + 8);
  e->rkey = be_get32(*p + 16);
  e->kind = (*p)[20];
  e->tag_len = (*p)[21];
  if (e->kind > WIRE_MEM_DEVICE || *left - WIRE_MEM_ENTRY_FIXED < e->tag_len) return false;
  e->tag = *p + WIRE_MEM_ENTRY_FIXED;
  *p += WIRE_MEM_ENTRY_FIXED + e->tag_len;
  *left -= WIRE_MEM_ENTRY_FIXED + e->tag_len;
  return true;
}

bool wire_mem_entry_next(const uint8_t **cursor, size_t *left, struct wire_mem_entry *entry) {
  return *left > 0 && mem_entry_get(cursor, left, entry);
}

/* HELLO's extensions, from at to the body's end n: well formed entries (a type this
 * reader does not know is skipped), WIRE_HELLO_EXT_MAX bytes at most. */
static enum wire_err hello_ext(const uint8_t *b, size_t at, size_t n, struct wire_msg *m) {
  if (at > n || n - at > WIRE_HELLO_EXT_MAX) return WIRE_EBODY;
  m->u.hello.ext_len = (uint16_t)(n - at);
  m->u.hello.ext = n > at ? b + at : NULL;
  for (size_t i = at; i < n;) {
    if (n - i < WIRE_HELLO_EXT_ENTRY || n - i - WIRE_HELLO_EXT_ENTRY < be_get16(b + i + 2)) return WIRE_EBODY;
    i += WIRE_HELLO_EXT_ENTRY + be_get16(b + i + 2);
  }
  return WIRE_OK;
}

enum wire_err wire_decode(const struct wire_hdr *hdr, const uint8_t *b, struct wire_msg *m) {
  size_t n = hdr->body_len;
  memset(m, 0, sizeof(*m));
  m->hdr = *hdr;
  switch (hdr->type) {
  case WIRE_HELLO:
    m->u.hello.caps = be_get32(b);
    m->u.hello.name_len = be_get16(b + 4);
    m->u.hello.name = b + 6;
    if (m->u.hello.name_len > WIRE_MAX_NAME) return WIRE_EBODY;
    if (!(m->u.hello.caps & WIRE_CAP_AUTH)) return hello_ext(b, 6u + m->u.hello.name_len, n, m);
    if (n < 6u + m->u.hello.name_len + WIRE_AUTH_NONCE + 1u) return WIRE_EBODY;
    m->u.hello.nonce = b + 6 + m->u.hello.name_len;
    m->u.hello.n_ids = m->u.hello.nonce[WIRE_AUTH_NONCE];
    m->u.hello.ids = m->u.hello.nonce + WIRE_AUTH_NONCE + 1;
    if (m->u.hello.n_ids < 1 || m->u.hello.n_ids > WIRE_AUTH_IDS_MAX) return WIRE_EBODY;
    {
      size_t at = 6u + m->u.hello.name_len + WIRE_AUTH_NONCE + 1u + (size_t)m->u.hello.n_ids * WIRE_AUTH_ID;
      if (n < at + 2u) return WIRE_EBODY;
      m->u.hello.dialled_len = be_get16(b + at);
      m->u.hello.dialled = b + at + 2u;
      if (m->u.hello.dialled_len == 0 || m->u.hello.dialled_len > WIRE_MAX_NAME) return WIRE_EBODY;
      return hello_ext(b, at + 2u + m->u.hello.dialled_len, n, m);
    }
  case WIRE_AUTH_CHALLENGE:
    m->u.auth.nonce = b;
    m->u.auth.id = b + WIRE_AUTH_NONCE;
    m->u.auth.mac = b + WIRE_AUTH_NONCE + WIRE_AUTH_ID;
    m->u.auth.name_len = be_get16(b + WIRE_AUTH_CHALLENGE_FIXED - 2);
    m->u.auth.name = b + WIRE_AUTH_CHALLENGE_FIXED;
    return n == WIRE_AUTH_CHALLENGE_FIXED + (size_t)m->u.auth.name_len ? WIRE_OK : WIRE_EBODY;
  case WIRE_AUTH_PROOF: m->u.auth.mac = b; return WIRE_OK;
  case WIRE_HELLO_ACK: {
    m->u.hello_ack.status = be_get32(b);
    m->u.hello_ack.caps = be_get32(b + 4);
    uint16_t nl = be_get16(b + 8);
    if (nl > WIRE_MAX_NAME || n < 14u + nl) return WIRE_EBODY;
    m->u.hello_ack.name_len = nl;
    m->u.hello_ack.name = b + 10;
    m->u.hello_ack.count = be_get32(b + 10 + nl);
    if (m->u.hello_ack.count > WIRE_MAX_MEM_ENTRIES) return WIRE_EBODY;
    const uint8_t *p = b + 14 + nl;
    size_t left = n - 14u - nl;
    m->u.hello_ack.entries = p;
    m->u.hello_ack.entries_len = left;
    struct wire_mem_entry e;
    for (uint32_t i = 0; i < m->u.hello_ack.count; i++)
      if (!mem_entry_get(&p, &left, &e)) return WIRE_EBODY;
    return left == 0 ? WIRE_OK : WIRE_EBODY;
  }
  case WIRE_MEM_ADD:
  case WIRE_MEM_DEL: {
    const uint8_t *p = b;
    size_t left = n;
    if (!mem_entry_get(&p, &left, &m->u.mem) || left != 0) return WIRE_EBODY;
    return WIRE_OK;
  }
  case WIRE_RDMA_CONNECT:
  case WIRE_RDMA_CONNECT_ACK: {
    const uint8_t *p = b;
    if (hdr->type == WIRE_RDMA_CONNECT_ACK) {
      m->u.qp.status = be_get32(p);
      p += 4;
    }
    m->u.qp.qpn = be_get32(p);
    m->u.qp.psn = be_get32(p + 4);
    m->u.qp.gid = p + 8;
    m->u.qp.mtu = p[24];
    return m->u.qp.qpn <= 0xffffff && m->u.qp.psn <= 0xffffff && m->u.qp.mtu >= 1 && m->u.qp.mtu <= 5
               ? WIRE_OK
               : WIRE_EBODY;
  }
  case WIRE_SHM_HELLO:
  case WIRE_SHM_HELLO_ACK: {
    const uint8_t *p = b;
    size_t fixed = hdr->type == WIRE_SHM_HELLO ? WIRE_SHM_HELLO_LEN : WIRE_SHM_HELLO_ACK_LEN;
    if (hdr->type == WIRE_SHM_HELLO_ACK) {
      m->u.shm.status = be_get32(p);
      p += 4;
    }
    m->u.shm.layout = be_get16(p);
    m->u.shm.boot_id = p + 2;
    m->u.shm.pid = be_get32(p + 18);
    m->u.shm.uid = be_get32(p + 22);
    if (hdr->type == WIRE_SHM_HELLO_ACK) {
      m->u.shm.probe_addr = be_get64(p + 26);
      m->u.shm.nonce = p + 34;
    }
    /* Layout 1 is exactly the fixed fields; layout 2 appends its own exactly; a later
     * one starts with layout 2's and may append more. */
    if (m->u.shm.layout == 0 || (m->u.shm.layout == 1 && n != fixed)) return WIRE_EBODY;
    m->u.shm.ext = b + fixed;
    m->u.shm.ext_len = (uint32_t)(n - fixed);
    m->u.shm.flags = 0;
    m->u.shm.sock = NULL;
    m->u.shm.sock_len = 0;
    if (m->u.shm.layout >= 2) {
      size_t need = hdr->type == WIRE_SHM_HELLO ? 4 : 2;
      if (m->u.shm.ext_len < need) return WIRE_EBODY;
      if (hdr->type == WIRE_SHM_HELLO) {
        m->u.shm.flags = be_get32(m->u.shm.ext);
      } else {
        m->u.shm.sock_len = be_get16(m->u.shm.ext);
        m->u.shm.sock = m->u.shm.ext + 2;
        need += m->u.shm.sock_len;
        if (m->u.shm.sock_len > WIRE_SHM_SOCK_MAX || m->u.shm.ext_len < need) return WIRE_EBODY;
        for (uint16_t i = 0; i < m->u.shm.sock_len; i++) /* inside the body: checked just above */
          if (m->u.shm.sock[i] < 0x21 || m->u.shm.sock[i] > 0x7e)
            return WIRE_EBODY; /* printable names only */
      }
      if (m->u.shm.ext_len < need || (m->u.shm.layout == 2 && m->u.shm.ext_len != need)) return WIRE_EBODY;
    }
    return WIRE_OK;
  }
  case WIRE_WRITE_REQ:
    m->u.write_req.seq = be_get64(b);
    m->u.write_req.raddr = be_get64(b + 8);
    return hdr->payload_len > 0 ? WIRE_OK : WIRE_EBODY;
  case WIRE_READ_REQ:
    m->u.read_req.seq = be_get64(b);
    m->u.read_req.raddr = be_get64(b + 8);
    m->u.read_req.len = be_get32(b + 16);
    return m->u.read_req.len > 0 && m->u.read_req.len <= WIRE_MAX_PAYLOAD ? WIRE_OK : WIRE_EBODY;
  case WIRE_WRITE_ACK:
  case WIRE_READ_RESP:
  case WIRE_NOTIFY_ACK:
  case WIRE_SYNC_ACK:
    m->u.ack.seq = be_get64(b);
    m->u.ack.status = be_get32(b + 8);
    /* A failed READ_RESP carries no data. */
    if (hdr->type == WIRE_READ_RESP && m->u.ack.status != 0 && hdr->payload_len != 0) return WIRE_EBODY;
    return WIRE_OK;
  case WIRE_SYNC: m->u.ack.seq = be_get64(b); return WIRE_OK;
  case WIRE_RAILS: m->u.rails.seq = be_get64(b); return WIRE_OK;
  case WIRE_WIN_ADD:
  case WIRE_WIN_DEL: {
    size_t each = hdr->type == WIRE_WIN_ADD ? WIRE_WIN_LEN : WIRE_WIN_DEL_LEN;
    m->u.win.count = be_get32(b);
    m->u.win.ents = b + 4;
    if (m->u.win.count < 1 || m->u.win.count > WIRE_MAX_WINS || hdr->body_len != 4 + each * m->u.win.count)
      return WIRE_EBODY;
    for (uint32_t i = 0; i < m->u.win.count; i++) {
      uint64_t addr = be_get64(b + 4 + each * i), len = be_get64(b + 12 + each * i);
      if (len == 0 || addr + len < addr) return WIRE_EBODY; /* a window is never empty and never wraps */
    }
    return WIRE_OK;
  }
  case WIRE_RAILS_ACK:
    m->u.rails.seq = be_get64(b);
    m->u.rails.count = be_get32(b + 8);
    m->u.rails.addrs = b + 12;
    /* the count says exactly how long the body is */
    if (m->u.rails.count < 1 || m->u.rails.count > WIRE_MAX_RAILS ||
        hdr->body_len != 12 + WIRE_RAIL_LEN * m->u.rails.count)
      return WIRE_EBODY;
    return WIRE_OK;
  case WIRE_SHM_MAP_HELLO: m->u.map.flags = be_get32(b); return m->u.map.flags == 0 ? WIRE_OK : WIRE_EBODY;
  case WIRE_SHM_MAP:
  case WIRE_SHM_UNMAP:
  case WIRE_SHM_UNMAP_ACK:
    m->u.map.addr = be_get64(b);
    m->u.map.len = be_get64(b + 8);
    m->u.map.map_len = hdr->type == WIRE_SHM_MAP ? be_get64(b + 16) : m->u.map.len;
    /* A region is never empty, never wraps, and its mapping holds all of it. */
    if (m->u.map.len == 0 || m->u.map.addr + m->u.map.len < m->u.map.addr || m->u.map.map_len < m->u.map.len)
      return WIRE_EBODY;
    return WIRE_OK;
  case WIRE_SHM_DEV_MAP:
    m->u.map.addr = be_get64(b);
    m->u.map.len = be_get64(b + 8);
    m->u.map.map_len = m->u.map.len;
    m->u.map.alloc_len = be_get64(b + 16);
    m->u.map.offset = be_get64(b + 24);
    m->u.map.blob = b + 32;
    /* A region never empty, never wrapping, inside its allocation (the opener checks it again). */
    if (m->u.map.len == 0 || m->u.map.addr + m->u.map.len < m->u.map.addr ||
        m->u.map.offset > m->u.map.alloc_len || m->u.map.len > m->u.map.alloc_len - m->u.map.offset)
      return WIRE_EBODY;
    return WIRE_OK;
  case WIRE_SHM_MAP_ACK:
    m->u.map.status = be_get32(b);
    m->u.map.text = b + 4;
    m->u.map.text_len = (uint32_t)(n - 4);
    return m->u.map.status == WIRE_HELLO_OK || m->u.map.status == WIRE_HELLO_REFUSED ? WIRE_OK : WIRE_EBODY;
  case WIRE_STAGE_WRITE:
  case WIRE_STAGE_READ:
  case WIRE_STAGE_PULL:
  case WIRE_STAGE_PUSH: {
    /* STAGE_PULL / STAGE_PUSH put the buffer's address and key after seq. */
    size_t fixed = hdr->type == WIRE_STAGE_PULL || hdr->type == WIRE_STAGE_PUSH ? 24u : 12u;
    m->u.stage.seq = be_get64(b);
    if (fixed == 24u) {
      m->u.stage.buf = be_get64(b + 8);
      m->u.stage.rkey = be_get32(b + 16);
    }
    m->u.stage.count = be_get32(b + fixed - 4);
    m->u.stage.segs = b + fixed;
    if (m->u.stage.count == 0 || m->u.stage.count > WIRE_MAX_STAGE_SEGS ||
        n != fixed + m->u.stage.count * WIRE_STAGE_SEG_LEN)
      return WIRE_EBODY;
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->u.stage.count; i++) {
      const uint8_t *s = m->u.stage.segs + (size_t)i * WIRE_STAGE_SEG_LEN;
      uint64_t addr = be_get64(s);
      uint32_t len = be_get32(s + 8);
      if (len == 0 || addr + len < addr) return WIRE_EBODY;
      total += len;
    }
    m->u.stage.total = total;
    if (total > WIRE_MAX_STAGE) return WIRE_EBODY;
    if (fixed == 24u && m->u.stage.buf + total < m->u.stage.buf) return WIRE_EBODY;
    /* STAGE_WRITE carries exactly the ranges' bytes; the others none (wire_parse_hdr). */
    if (hdr->type == WIRE_STAGE_WRITE && total != hdr->payload_len) return WIRE_EBODY;
    return WIRE_OK;
  }
  case WIRE_CALL:
    m->u.call.seq = be_get64(b);
    m->u.call.service = be_get16(b + 8);
    m->u.call.data = b + 10;
    m->u.call.len = (uint32_t)(n - 10);
    return WIRE_OK; /* wire_parse_hdr bounded the body */
  case WIRE_CALL_AFTER:
    m->u.call.seq = be_get64(b);
    m->u.call.after = be_get64(b + 8);
    m->u.call.service = be_get16(b + 16);
    m->u.call.data = b + 18;
    m->u.call.len = (uint32_t)(n - 18);
    /* It follows WRITEs sent before it: none can come from its own seq on. */
    return m->u.call.after < m->u.call.seq ? WIRE_OK : WIRE_EBODY;
  case WIRE_CALL_TAG:
    m->u.call.seq = be_get64(b);
    m->u.call.after = be_get32(b + 8);
    m->u.call.service = be_get16(b + 12);
    m->u.call.data = b + 14;
    m->u.call.len = (uint32_t)(n - 14);
    return WIRE_OK;
  case WIRE_CALL_RESP:
    m->u.call.seq = be_get64(b);
    m->u.call.status = be_get32(b + 8);
    m->u.call.data = b + 12;
    m->u.call.len = (uint32_t)(n - 12);
    return WIRE_OK;
  case WIRE_NOTIFY:
    m->u.notify.seq = be_get64(b);
    m->u.notify.name_len = be_get16(b + 8);
    m->u.notify.msg_len = be_get16(b + 10);
    if (m->u.notify.name_len > WIRE_MAX_NOTIFY || m->u.notify.msg_len > WIRE_MAX_NOTIFY ||
        n != 12u + m->u.notify.name_len + m->u.notify.msg_len)
      return WIRE_EBODY;
    /* Only now are both inside the body; msg would otherwise point past it. */
    m->u.notify.name = b + 12;
    m->u.notify.msg = b + 12 + m->u.notify.name_len;
    return WIRE_OK;
  }
  return WIRE_ETYPE;
}

static void put_hdr(uint8_t *p, uint8_t type, uint32_t body_len, uint32_t payload_len) {
  be_put32(p, WIRE_MAGIC);
  p[4] = WIRE_VERSION;
  p[5] = type;
  be_put16(p + 6, 0);
  be_put32(p + 8, body_len);
  be_put32(p + 12, payload_len);
  be_put32(p + 16, 0);
}

void wire_begin(struct wire_wr *w, uint8_t *buf, size_t cap, enum wire_type type) {
  w->buf = buf;
  w->cap = cap;
  w->len = WIRE_HDR_LEN;
  w->overflow = cap < WIRE_HDR_LEN;
  if (!w->overflow) buf[5] = (uint8_t)type;
}

size_t wire_end(struct wire_wr *w, uint32_t payload_len) {
  if (w->overflow || w->len - WIRE_HDR_LEN > WIRE_MAX_BODY) return 0;
  put_hdr(w->buf, w->buf[5], (uint32_t)(w->len - WIRE_HDR_LEN), payload_len);
  return w->len;
}

static uint8_t *wr_room(struct wire_wr *w, size_t n) {
  if (w->overflow || w->cap - w->len < n) {
    w->overflow = true;
    return NULL;
  }
  uint8_t *p = w->buf + w->len;
  w->len += n;
  return p;
}

void wire_put_u16(struct wire_wr *w, uint16_t v) {
  uint8_t *p = wr_room(w, 2);
  if (p) be_put16(p, v);
}
void wire_put_u32(struct wire_wr *w, uint32_t v) {
  uint8_t *p = wr_room(w, 4);
  if (p) be_put32(p, v);
}
void wire_put_u64(struct wire_wr *w, uint64_t v) {
  uint8_t *p = wr_room(w, 8);
  if (p) be_put64(p, v);
}
void wire_put_bytes(struct wire_wr *w, const void *src, size_t n) {
  uint8_t *p = wr_room(w, n);
  if (p && n) memcpy(p, src, n);
}
void wire_put_mem_entry_kind(struct wire_wr *w, uint64_t addr, uint64_t len, uint32_t rkey, const char *tag,
                             uint8_t kind) {
  size_t tl = tag ? strnlen(tag, WIRE_MAX_TAG) : 0;
  wire_put_u64(w, addr);
  wire_put_u64(w, len);
  wire_put_u32(w, rkey);
  wire_put_u16(w, (uint16_t)((unsigned)kind << 8 | tl));
  wire_put_bytes(w, tag, tl);
}

void wire_put_mem_entry(struct wire_wr *w, uint64_t addr, uint64_t len, uint32_t rkey, const char *tag) {
  wire_put_mem_entry_kind(w, addr, len, rkey, tag, WIRE_MEM_HOST);
}

void wire_put_qp_info(struct wire_wr *w, uint32_t qpn, uint32_t psn, const uint8_t gid[16], uint8_t mtu) {
  wire_put_u32(w, qpn);
  wire_put_u32(w, psn);
  wire_put_bytes(w, gid, 16);
  wire_put_bytes(w, &mtu, 1);
}

void wire_put_shm_id(struct wire_wr *w, uint16_t layout, const uint8_t boot_id[16], uint32_t pid,
                     uint32_t uid) {
  wire_put_u16(w, layout);
  wire_put_bytes(w, boot_id, 16);
  wire_put_u32(w, pid);
  wire_put_u32(w, uid);
}

size_t wire_put_write_req(uint8_t *buf, uint64_t seq, uint64_t raddr, uint32_t len) {
  put_hdr(buf, WIRE_WRITE_REQ, 16, len);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put64(buf + WIRE_HDR_LEN + 8, raddr);
  return WIRE_HDR_LEN + 16;
}

size_t wire_put_read_req(uint8_t *buf, uint64_t seq, uint64_t raddr, uint32_t len) {
  put_hdr(buf, WIRE_READ_REQ, 20, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put64(buf + WIRE_HDR_LEN + 8, raddr);
  be_put32(buf + WIRE_HDR_LEN + 16, len);
  return WIRE_HDR_LEN + 20;
}

size_t wire_put_hello(uint8_t *buf, size_t cap, uint32_t caps, const char *name) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, WIRE_HELLO);
  wire_put_u32(&w, caps);
  wire_put_u16(&w, (uint16_t)strlen(name));
  wire_put_bytes(&w, name, strlen(name));
  return wire_end(&w, 0);
}

size_t wire_put_hello_auth(uint8_t *buf, size_t cap, uint32_t caps, const char *name,
                           const uint8_t nonce[WIRE_AUTH_NONCE], const uint8_t *ids, unsigned n_ids,
                           const char *dialled) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, WIRE_HELLO);
  wire_put_u32(&w, caps | WIRE_CAP_AUTH);
  wire_put_u16(&w, (uint16_t)strlen(name));
  wire_put_bytes(&w, name, strlen(name));
  wire_put_bytes(&w, nonce, WIRE_AUTH_NONCE);
  wire_put_bytes(&w, &(uint8_t){(uint8_t)n_ids}, 1);
  wire_put_bytes(&w, ids, (size_t)n_ids * WIRE_AUTH_ID);
  wire_put_u16(&w, (uint16_t)strlen(dialled));
  wire_put_bytes(&w, dialled, strlen(dialled));
  return wire_end(&w, 0);
}

size_t wire_hello_add_ext(uint8_t *buf, size_t cap, size_t len, uint16_t type, const void *val,
                          uint16_t vlen) {
  struct wire_hdr h;
  struct wire_msg m;
  if (len < WIRE_HDR_LEN || wire_parse_hdr(buf, &h) != WIRE_OK || h.type != WIRE_HELLO ||
      len != WIRE_HDR_LEN + (size_t)h.body_len || wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
    return 0;
  size_t add = WIRE_HELLO_EXT_ENTRY + vlen;
  if (cap < len || cap - len < add || m.u.hello.ext_len + add > WIRE_HELLO_EXT_MAX) return 0;
  be_put16(buf + len, type);
  be_put16(buf + len + 2, vlen);
  if (vlen) memcpy(buf + len + WIRE_HELLO_EXT_ENTRY, val, vlen);
  put_hdr(buf, WIRE_HELLO, h.body_len + (uint32_t)add, 0);
  return len + add;
}

size_t wire_put_sync(uint8_t *buf, uint64_t seq) {
  put_hdr(buf, WIRE_SYNC, 8, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  return WIRE_HDR_LEN + 8;
}

size_t wire_put_rails(uint8_t *buf, uint64_t seq) {
  put_hdr(buf, WIRE_RAILS, 8, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  return WIRE_HDR_LEN + 8;
}

size_t wire_put_rails_ack(uint8_t *buf, size_t cap, uint64_t seq, const uint32_t *addr, const uint16_t *port,
                          uint32_t n) {
  size_t body = 12 + (size_t)WIRE_RAIL_LEN * n;
  if (n < 1 || n > WIRE_MAX_RAILS || cap < WIRE_HDR_LEN + body) return 0;
  put_hdr(buf, WIRE_RAILS_ACK, (uint32_t)body, 0);
  uint8_t *b = buf + WIRE_HDR_LEN;
  be_put64(b, seq);
  be_put32(b + 8, n);
  for (uint32_t i = 0; i < n; i++) {
    be_put32(b + 12 + WIRE_RAIL_LEN * i, addr[i]);
    be_put16(b + 16 + WIRE_RAIL_LEN * i, port[i]);
  }
  return WIRE_HDR_LEN + body;
}

size_t wire_put_wins(uint8_t *buf, size_t cap, const uint64_t (*range)[2], const uint32_t *rkey, uint32_t n) {
  size_t each = rkey ? WIRE_WIN_LEN : WIRE_WIN_DEL_LEN, body = 4 + each * n;
  if (n < 1 || n > WIRE_MAX_WINS || cap < WIRE_HDR_LEN + body) return 0;
  put_hdr(buf, rkey ? WIRE_WIN_ADD : WIRE_WIN_DEL, (uint32_t)body, 0);
  uint8_t *b = buf + WIRE_HDR_LEN;
  be_put32(b, n);
  for (uint32_t i = 0; i < n; i++) {
    be_put64(b + 4 + each * i, range[i][0]);
    be_put64(b + 12 + each * i, range[i][1]);
    if (rkey) be_put32(b + 20 + each * i, rkey[i]);
  }
  return WIRE_HDR_LEN + body;
}

void wire_win(const struct wire_msg *m, uint32_t i, uint64_t *addr, uint64_t *len, uint32_t *rkey) {
  size_t each = m->hdr.type == WIRE_WIN_ADD ? WIRE_WIN_LEN : WIRE_WIN_DEL_LEN;
  const uint8_t *e = m->u.win.ents + each * i;
  *addr = be_get64(e);
  *len = be_get64(e + 8);
  *rkey = m->hdr.type == WIRE_WIN_ADD ? be_get32(e + 16) : 0;
}

void wire_rail_at(const struct wire_msg *m, uint32_t i, uint32_t *addr, uint16_t *port) {
  const uint8_t *r = m->u.rails.addrs + (size_t)WIRE_RAIL_LEN * i;
  *addr = be_get32(r);
  *port = be_get16(r + 4);
}

void wire_stage_seg(const struct wire_msg *m, uint32_t i, uint64_t *addr, uint32_t *len) {
  const uint8_t *s = m->u.stage.segs + (size_t)i * WIRE_STAGE_SEG_LEN;
  *addr = be_get64(s);
  *len = be_get32(s + 8);
}

size_t wire_put_stage(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t count, uint32_t payload_len) {
  put_hdr(buf, (uint8_t)type, 12 + count * WIRE_STAGE_SEG_LEN, payload_len);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put32(buf + WIRE_HDR_LEN + 8, count);
  return WIRE_HDR_LEN + 12 + (size_t)count * WIRE_STAGE_SEG_LEN;
}

size_t wire_put_stage_rdma(uint8_t *buf, enum wire_type type, uint64_t seq, uint64_t sbuf, uint32_t rkey,
                           uint32_t count) {
  put_hdr(buf, (uint8_t)type, 24 + count * WIRE_STAGE_SEG_LEN, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put64(buf + WIRE_HDR_LEN + 8, sbuf);
  be_put32(buf + WIRE_HDR_LEN + 16, rkey);
  be_put32(buf + WIRE_HDR_LEN + 20, count);
  return WIRE_HDR_LEN + 24 + (size_t)count * WIRE_STAGE_SEG_LEN;
}

void wire_put_stage_seg(uint8_t *buf, bool rdma, uint32_t i, uint64_t addr, uint32_t len) {
  uint8_t *s = buf + WIRE_HDR_LEN + (rdma ? 24 : 12) + (size_t)i * WIRE_STAGE_SEG_LEN;
  be_put64(s, addr);
  be_put32(s + 8, len);
}

size_t wire_put_ack(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t status, uint32_t payload_len) {
  put_hdr(buf, (uint8_t)type, 12, payload_len);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put32(buf + WIRE_HDR_LEN + 8, status);
  return WIRE_HDR_LEN + 12;
}

size_t wire_put_call(uint8_t *buf, enum wire_type type, uint64_t seq, uint32_t service_or_status,
                     uint32_t len) {
  bool resp = type == WIRE_CALL_RESP;
  uint32_t fixed = resp ? 12u : 10u;
  put_hdr(buf, (uint8_t)type, fixed + len, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  if (resp) {
    be_put32(buf + WIRE_HDR_LEN + 8, service_or_status);
  } else {
    be_put16(buf + WIRE_HDR_LEN + 8, (uint16_t)service_or_status);
  }
  return WIRE_HDR_LEN + fixed + len;
}

size_t wire_put_call_after(uint8_t *buf, uint64_t seq, uint64_t after, uint16_t service, uint32_t len) {
  put_hdr(buf, (uint8_t)WIRE_CALL_AFTER, 18u + len, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put64(buf + WIRE_HDR_LEN + 8, after);
  be_put16(buf + WIRE_HDR_LEN + 16, service);
  return WIRE_CALL_AFTER_AT + len;
}

size_t wire_put_call_tag(uint8_t *buf, uint64_t seq, uint32_t tag, uint16_t service, uint32_t len) {
  put_hdr(buf, (uint8_t)WIRE_CALL_TAG, 14u + len, 0);
  be_put64(buf + WIRE_HDR_LEN, seq);
  be_put32(buf + WIRE_HDR_LEN + 8, tag);
  be_put16(buf + WIRE_HDR_LEN + 12, service);
  return WIRE_CALL_TAG_AT + len;
}
