/* fuzz_wire: the wire parser against arbitrary bytes. The input is read as a stream of
 * frames, the way a connection delivers them: each header is parsed, a body that passed
 * is decoded from a heap copy of exactly body_len bytes (so the sanitizer sees any read
 * past it), HELLO_ACK tables and STAGE ranges are walked, and whatever was accepted is
 * rebuilt with the builders and must come out byte for byte the same. Invariants abort(). */
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_wire: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

static uint32_t get32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static uint64_t get64(const uint8_t *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

/* [p, p + n) within [base, base + len), compared as integers (p may be anything). */
static int inside(const uint8_t *p, size_t n, const uint8_t *base, size_t len) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)base;
  return a >= lo && a - lo <= len && n <= len - (a - lo);
}
/* A pointer in a refused message is either unset or still points into the body. */
static int null_or_inside(const uint8_t *p, const uint8_t *base, size_t len) {
  return p == NULL || inside(p, 0, base, len);
}

/* The body limits, written out independently of wire.c. */
static const struct {
  uint32_t min, max, payload;
} limits[WIRE_TYPE_MAX_ + 1] = {
    [WIRE_HELLO] = {6, 6 + WIRE_MAX_NAME + 32 + 1 + 2 * 8 + 2 + WIRE_MAX_NAME + 1024,
                    0}, /* name, the auth block, dialled */
    [WIRE_HELLO_ACK] = {14, WIRE_MAX_BODY, 0},
    [WIRE_MEM_ADD] = {22, 22 + WIRE_MAX_TAG, 0},
    [WIRE_MEM_DEL] = {22, 22, 0},
    [WIRE_WRITE_REQ] = {16, 16, WIRE_MAX_PAYLOAD},
    [WIRE_WRITE_ACK] = {12, 12, 0},
    [WIRE_READ_REQ] = {20, 20, 0},
    [WIRE_READ_RESP] = {12, 12, 16u << 20}, /* also answers STAGE_READ */
    [WIRE_NOTIFY] = {12, 12 + 2 * WIRE_MAX_NOTIFY, 0},
    [WIRE_NOTIFY_ACK] = {12, 12, 0},
    [WIRE_SYNC] = {8, 8, 0},
    [WIRE_SYNC_ACK] = {12, 12, 0},
    [WIRE_RDMA_CONNECT] = {25, 25, 0},
    [WIRE_RDMA_CONNECT_ACK] = {29, 29, 0},
    [WIRE_SHM_HELLO] = {26, 26 + 256, 0},
    [WIRE_SHM_HELLO_ACK] = {54, 54 + 256, 0},
    [WIRE_STAGE_WRITE] = {12 + 12, 12 + 12 * 4096, 16u << 20},
    [WIRE_STAGE_READ] = {12 + 12, 12 + 12 * 4096, 0},
    [WIRE_STAGE_PULL] = {24 + 12, 24 + 12 * 4096, 0},
    [WIRE_STAGE_PUSH] = {24 + 12, 24 + 12 * 4096, 0},
    [WIRE_CALL] = {10, 10 + 65536, 0},
    [WIRE_CALL_RESP] = {12, 12 + 65536, 0},
    [WIRE_SHM_MAP_HELLO] = {4, 4, 0},
    [WIRE_SHM_MAP] = {24, 24, 0},
    [WIRE_SHM_MAP_ACK] = {4, 4 + 256, 0},
    [WIRE_SHM_UNMAP] = {16, 16, 0},
    [WIRE_SHM_UNMAP_ACK] = {16, 16, 0},
    [WIRE_CALL_AFTER] = {18, 18 + 65536, 0},
    [WIRE_AUTH_CHALLENGE] = {74, 74 + 255, 0},
    [WIRE_AUTH_PROOF] = {32, 32, 0},
    [WIRE_RAILS] = {8, 8, 0},
    [WIRE_RAILS_ACK] = {12 + 6, 12 + 6 * 8, 0},
    [WIRE_WIN_ADD] = {4 + 20, 4 + 20 * 4096, 0},
    [WIRE_WIN_DEL] = {4 + 16, 4 + 16 * 4096, 0},
    [WIRE_SHM_DEV_MAP] = {96, 96, 0},
    [WIRE_CALL_TAG] = {14, 14 + 65536, 0},
};

/* Whatever wire_parse_hdr says must agree with the raw bytes. */
static void check_hdr(const uint8_t *raw, enum wire_err e, const struct wire_hdr *h) {
  CHECK(e >= WIRE_OK && e <= WIRE_EBODY && e != WIRE_EBODY);
  CHECK(wire_err_str(e) != NULL);
  if (e == WIRE_EMAGIC) {
    CHECK(get32(raw) != WIRE_MAGIC);
    return;
  }
  /* From here on the whole header is filled (WIRE_EVERSION included). */
  CHECK(h->magic == WIRE_MAGIC && get32(raw) == WIRE_MAGIC);
  CHECK(h->version == raw[4] && h->type == raw[5] && h->flags == get16(raw + 6));
  CHECK(h->body_len == get32(raw + 8) && h->payload_len == get32(raw + 12));
  CHECK(h->reserved == get32(raw + 16));
  if (e == WIRE_EVERSION) {
    CHECK(h->version != WIRE_VERSION);
    return;
  }
  CHECK(h->version == WIRE_VERSION);
  int type_ok = h->type >= 1 && h->type <= WIRE_TYPE_MAX_;
  if (e == WIRE_ETYPE) {
    CHECK(!type_ok);
    return;
  }
  CHECK(type_ok);
  CHECK(wire_type_name(h->type)[0] != '?');
  int flags_ok = (h->flags & ~(WIRE_F_TAG | WIRE_F_PAYLOAD_TAG)) == 0 &&
                 (!(h->flags & WIRE_F_PAYLOAD_TAG) || ((h->flags & WIRE_F_TAG) && h->payload_len > 0));
  int len_ok = flags_ok && h->reserved == 0 && h->body_len >= limits[h->type].min &&
               h->body_len <= limits[h->type].max && h->payload_len <= limits[h->type].payload;
  CHECK(len_ok == (e == WIRE_OK));
}

/* Walks a memory table; returns the number of entries, all checked inside [b, b + n). */
static uint32_t walk_entries(const uint8_t *p, size_t left, const uint8_t *b, size_t n) {
  struct wire_mem_entry e;
  uint32_t count = 0;
  while (wire_mem_entry_next(&p, &left, &e)) {
    CHECK(e.tag_len <= WIRE_MAX_TAG);
    CHECK(inside(e.tag, e.tag_len, b, n));
    CHECK(inside(p, left, b, n));
    CHECK(count < n); /* every entry consumes bytes */
    count++;
  }
  CHECK(inside(p, left, b, n));
  return count;
}

/* Rebuilds an accepted frame from the decoded message; it must equal the original. */
static void check_rebuild(const uint8_t *frame, const struct wire_msg *m) {
  const struct wire_hdr *h = &m->hdr;
  size_t len = WIRE_HDR_LEN + (size_t)h->body_len;
  uint8_t *buf = malloc(len);
  struct wire_wr w;
  size_t got;

  CHECK(buf != NULL);
  switch (h->type) {
  case WIRE_WRITE_REQ:
    got = wire_put_write_req(buf, m->u.write_req.seq, m->u.write_req.raddr, h->payload_len);
    break;
  case WIRE_READ_REQ:
    got = wire_put_read_req(buf, m->u.read_req.seq, m->u.read_req.raddr, m->u.read_req.len);
    break;
  case WIRE_SYNC: got = wire_put_sync(buf, m->u.ack.seq); break;
  case WIRE_RAILS: got = wire_put_rails(buf, m->u.rails.seq); break;
  case WIRE_RAILS_ACK: {
    uint32_t addr[WIRE_MAX_RAILS];
    uint16_t port[WIRE_MAX_RAILS];
    CHECK(m->u.rails.count >= 1 && m->u.rails.count <= WIRE_MAX_RAILS);
    for (uint32_t i = 0; i < m->u.rails.count; i++) wire_rail_at(m, i, &addr[i], &port[i]);
    got = wire_put_rails_ack(buf, len, m->u.rails.seq, addr, port, m->u.rails.count);
    break;
  }
  case WIRE_WIN_ADD:
  case WIRE_WIN_DEL: {
    uint32_t n = m->u.win.count;
    uint64_t(*r)[2] = malloc(n * sizeof(*r));
    uint32_t *key = malloc(n * sizeof(*key));
    CHECK(n >= 1 && n <= WIRE_MAX_WINS && r && key && h->payload_len == 0);
    for (uint32_t i = 0; i < n; i++) {
      wire_win(m, i, &r[i][0], &r[i][1], &key[i]);
      CHECK(r[i][1] > 0 && r[i][0] + r[i][1] > r[i][0]); /* never empty, never wraps */
    }
    got = wire_put_wins(buf, len, (const uint64_t(*)[2])r, h->type == WIRE_WIN_ADD ? key : NULL, n);
    free(r);
    free(key);
    break;
  }
  case WIRE_WRITE_ACK:
  case WIRE_READ_RESP:
  case WIRE_NOTIFY_ACK:
  case WIRE_SYNC_ACK:
    got = wire_put_ack(buf, (enum wire_type)h->type, m->u.ack.seq, m->u.ack.status, h->payload_len);
    break;
  case WIRE_STAGE_WRITE:
  case WIRE_STAGE_READ:
    got = wire_put_stage(buf, (enum wire_type)h->type, m->u.stage.seq, m->u.stage.count, h->payload_len);
    for (uint32_t i = 0; i < m->u.stage.count; i++) {
      uint64_t addr;
      uint32_t seg_len;
      wire_stage_seg(m, i, &addr, &seg_len);
      wire_put_stage_seg(buf, false, i, addr, seg_len);
    }
    break;
  case WIRE_CALL:
  case WIRE_CALL_RESP:
    CHECK(h->payload_len == 0);
    got = wire_put_call(buf, (enum wire_type)h->type, m->u.call.seq,
                        h->type == WIRE_CALL ? m->u.call.service : m->u.call.status, m->u.call.len);
    memcpy(buf + (h->type == WIRE_CALL ? WIRE_CALL_REQ_AT : WIRE_CALL_RESP_AT), m->u.call.data,
           m->u.call.len);
    break;
  case WIRE_CALL_AFTER:
    CHECK(h->payload_len == 0);
    got = wire_put_call_after(buf, m->u.call.seq, m->u.call.after, m->u.call.service, m->u.call.len);
    memcpy(buf + WIRE_CALL_AFTER_AT, m->u.call.data, m->u.call.len);
    break;
  case WIRE_CALL_TAG:
    CHECK(h->payload_len == 0 && m->u.call.after <= UINT32_MAX);
    got = wire_put_call_tag(buf, m->u.call.seq, (uint32_t)m->u.call.after, m->u.call.service, m->u.call.len);
    memcpy(buf + WIRE_CALL_TAG_AT, m->u.call.data, m->u.call.len);
    break;
  case WIRE_STAGE_PULL:
  case WIRE_STAGE_PUSH:
    CHECK(h->payload_len == 0); /* wire_put_stage_rdma has no payload to give */
    got = wire_put_stage_rdma(buf, (enum wire_type)h->type, m->u.stage.seq, m->u.stage.buf, m->u.stage.rkey,
                              m->u.stage.count);
    for (uint32_t i = 0; i < m->u.stage.count; i++) {
      uint64_t addr;
      uint32_t seg_len;
      wire_stage_seg(m, i, &addr, &seg_len);
      wire_put_stage_seg(buf, true, i, addr, seg_len);
    }
    break;
  default:
    wire_begin(&w, buf, len, (enum wire_type)h->type);
    switch (h->type) {
    case WIRE_HELLO:
      wire_put_u32(&w, m->u.hello.caps);
      wire_put_u16(&w, m->u.hello.name_len);
      wire_put_bytes(&w, m->u.hello.name, m->u.hello.name_len);
      if (m->u.hello.nonce) {
        wire_put_bytes(&w, m->u.hello.nonce, WIRE_AUTH_NONCE);
        wire_put_bytes(&w, &m->u.hello.n_ids, 1);
        wire_put_bytes(&w, m->u.hello.ids, (size_t)m->u.hello.n_ids * WIRE_AUTH_ID);
        wire_put_u16(&w, m->u.hello.dialled_len);
        wire_put_bytes(&w, m->u.hello.dialled, m->u.hello.dialled_len);
      }
      wire_put_bytes(&w, m->u.hello.ext, m->u.hello.ext_len);
      break;
    case WIRE_AUTH_CHALLENGE:
      wire_put_bytes(&w, m->u.auth.nonce, WIRE_AUTH_NONCE);
      wire_put_bytes(&w, m->u.auth.id, WIRE_AUTH_ID);
      wire_put_bytes(&w, m->u.auth.mac, WIRE_AUTH_MAC);
      wire_put_u16(&w, m->u.auth.name_len);
      wire_put_bytes(&w, m->u.auth.name, m->u.auth.name_len);
      break;
    case WIRE_AUTH_PROOF: wire_put_bytes(&w, m->u.auth.mac, WIRE_AUTH_MAC); break;
    case WIRE_HELLO_ACK: {
      const uint8_t *p = m->u.hello_ack.entries;
      size_t left = m->u.hello_ack.entries_len;
      struct wire_mem_entry e;
      wire_put_u32(&w, m->u.hello_ack.status);
      wire_put_u32(&w, m->u.hello_ack.caps);
      wire_put_u16(&w, m->u.hello_ack.name_len);
      wire_put_bytes(&w, m->u.hello_ack.name, m->u.hello_ack.name_len);
      wire_put_u32(&w, m->u.hello_ack.count);
      /* Raw u16 + bytes, since wire_put_mem_entry takes a C string and tags may hold 0. */
      while (wire_mem_entry_next(&p, &left, &e)) {
        wire_put_u64(&w, e.addr);
        wire_put_u64(&w, e.len);
        wire_put_u32(&w, e.rkey);
        wire_put_u16(&w, (uint16_t)(e.kind << 8 | e.tag_len));
        wire_put_bytes(&w, e.tag, e.tag_len);
      }
      break;
    }
    case WIRE_MEM_ADD:
    case WIRE_MEM_DEL: {
      char tag[WIRE_MAX_TAG + 1];
      if (!memchr(m->u.mem.tag, 0, m->u.mem.tag_len)) {
        /* A tag without NUL bytes goes through the C-string builder. */
        memcpy(tag, m->u.mem.tag, m->u.mem.tag_len);
        tag[m->u.mem.tag_len] = 0;
        wire_put_mem_entry_kind(&w, m->u.mem.addr, m->u.mem.len, m->u.mem.rkey, tag, m->u.mem.kind);
        break;
      }
      wire_put_u64(&w, m->u.mem.addr);
      wire_put_u64(&w, m->u.mem.len);
      wire_put_u32(&w, m->u.mem.rkey);
      wire_put_u16(&w, (uint16_t)(m->u.mem.kind << 8 | m->u.mem.tag_len));
      wire_put_bytes(&w, m->u.mem.tag, m->u.mem.tag_len);
      break;
    }
    case WIRE_NOTIFY:
      wire_put_u64(&w, m->u.notify.seq);
      wire_put_u16(&w, m->u.notify.name_len);
      wire_put_u16(&w, m->u.notify.msg_len);
      wire_put_bytes(&w, m->u.notify.name, m->u.notify.name_len);
      wire_put_bytes(&w, m->u.notify.msg, m->u.notify.msg_len);
      break;
    case WIRE_RDMA_CONNECT:
    case WIRE_RDMA_CONNECT_ACK:
      if (h->type == WIRE_RDMA_CONNECT_ACK) wire_put_u32(&w, m->u.qp.status);
      wire_put_qp_info(&w, m->u.qp.qpn, m->u.qp.psn, m->u.qp.gid, m->u.qp.mtu);
      break;
    case WIRE_SHM_HELLO:
    case WIRE_SHM_HELLO_ACK:
      if (h->type == WIRE_SHM_HELLO_ACK) wire_put_u32(&w, m->u.shm.status);
      /* Rebuilt field by field; the builder of the identity must agree (below). */
      wire_put_u16(&w, m->u.shm.layout);
      wire_put_bytes(&w, m->u.shm.boot_id, 16);
      wire_put_u32(&w, m->u.shm.pid);
      wire_put_u32(&w, m->u.shm.uid);
      if (h->type == WIRE_SHM_HELLO_ACK) {
        wire_put_u64(&w, m->u.shm.probe_addr);
        wire_put_bytes(&w, m->u.shm.nonce, 16);
      }
      wire_put_bytes(&w, m->u.shm.ext, m->u.shm.ext_len);
      {
        uint8_t id[WIRE_HDR_LEN + WIRE_SHM_ID_LEN];
        struct wire_wr w2;
        wire_begin(&w2, id, sizeof(id), WIRE_SHM_HELLO);
        wire_put_shm_id(&w2, m->u.shm.layout, m->u.shm.boot_id, m->u.shm.pid, m->u.shm.uid);
        CHECK(wire_end(&w2, 0) == sizeof(id));
        CHECK(memcmp(id + WIRE_HDR_LEN, frame + WIRE_HDR_LEN + (h->type == WIRE_SHM_HELLO_ACK ? 4 : 0),
                     WIRE_SHM_ID_LEN) == 0);
      }
      break;
    case WIRE_SHM_MAP_HELLO: wire_put_u32(&w, m->u.map.flags); break;
    case WIRE_SHM_MAP:
    case WIRE_SHM_UNMAP:
    case WIRE_SHM_UNMAP_ACK:
      wire_put_u64(&w, m->u.map.addr);
      wire_put_u64(&w, m->u.map.len);
      if (h->type == WIRE_SHM_MAP) wire_put_u64(&w, m->u.map.map_len);
      break;
    case WIRE_SHM_DEV_MAP:
      wire_put_u64(&w, m->u.map.addr);
      wire_put_u64(&w, m->u.map.len);
      wire_put_u64(&w, m->u.map.alloc_len);
      wire_put_u64(&w, m->u.map.offset);
      wire_put_bytes(&w, m->u.map.blob, WIRE_SHM_IPC_BLOB);
      break;
    case WIRE_SHM_MAP_ACK:
      wire_put_u32(&w, m->u.map.status);
      wire_put_bytes(&w, m->u.map.text, m->u.map.text_len);
      break;
    default: CHECK(!"type accepted by wire_decode but unknown here");
    }
    got = wire_end(&w, h->payload_len);
    break;
  }
  CHECK(got == len);
  buf[7] |= (uint8_t)h->flags; /* the builders write no flags; the link layer sets WIRE_F_TAG */
  CHECK(memcmp(buf, frame, len) == 0);
  free(buf);

  /* One byte short must overflow, and never write past the buffer. */
  buf = malloc(len - 1);
  CHECK(buf != NULL);
  wire_begin(&w, buf, len - 1, (enum wire_type)h->type);
  wire_put_bytes(&w, frame + WIRE_HDR_LEN, h->body_len);
  CHECK(wire_end(&w, h->payload_len) == 0 && w.overflow);
  free(buf);
}

/* The decoded message must stay inside the body and agree with the type's rules. */
static void check_msg(enum wire_err e, const struct wire_hdr *h, const uint8_t *b, const struct wire_msg *m) {
  size_t n = h->body_len;

  CHECK(e == WIRE_OK || e == WIRE_EBODY);
  CHECK(memcmp(&m->hdr, h, sizeof(*h)) == 0);
  switch (h->type) {
  case WIRE_HELLO:
    CHECK(null_or_inside(m->u.hello.name, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.hello.name_len <= WIRE_MAX_NAME);
    CHECK(inside(m->u.hello.name, m->u.hello.name_len, b, n));
    CHECK((m->u.hello.nonce != NULL) == ((m->u.hello.caps & WIRE_CAP_AUTH) != 0));
    CHECK(m->u.hello.ext_len <= 1024 && (m->u.hello.ext != NULL) == (m->u.hello.ext_len > 0));
    CHECK(m->u.hello.ext == NULL || m->u.hello.ext + m->u.hello.ext_len == b + n); /* to the end */
    for (size_t i = 0; i < m->u.hello.ext_len;) { /* whole entries, exactly */
      CHECK(m->u.hello.ext_len - i >= 4);
      i += 4u + get16(m->u.hello.ext + i + 2);
      CHECK(i <= m->u.hello.ext_len);
    }
    if (!m->u.hello.nonce) {
      CHECK(n == 6u + m->u.hello.name_len + m->u.hello.ext_len);
      break;
    }
    CHECK(m->u.hello.n_ids >= 1 && m->u.hello.n_ids <= WIRE_AUTH_IDS_MAX);
    CHECK(inside(m->u.hello.nonce, WIRE_AUTH_NONCE, b, n));
    CHECK(inside(m->u.hello.ids, (size_t)m->u.hello.n_ids * WIRE_AUTH_ID, b, n));
    CHECK(m->u.hello.dialled_len >= 1 && m->u.hello.dialled_len <= WIRE_MAX_NAME);
    CHECK(inside(m->u.hello.dialled, m->u.hello.dialled_len, b, n));
    CHECK(n == 6u + m->u.hello.name_len + WIRE_AUTH_NONCE + 1u + (size_t)m->u.hello.n_ids * WIRE_AUTH_ID +
                   2u + m->u.hello.dialled_len + m->u.hello.ext_len);
    break;
  case WIRE_AUTH_CHALLENGE:
    CHECK((e == WIRE_OK) == (n == 74u + get16(b + 72)));
    if (e == WIRE_OK) CHECK(m->u.auth.name == b + 74 && m->u.auth.mac == b + 40 && m->u.auth.id == b + 32);
    break;
  case WIRE_AUTH_PROOF: CHECK(e == WIRE_OK && m->u.auth.mac == b); break;
  case WIRE_HELLO_ACK:
    CHECK(null_or_inside(m->u.hello_ack.name, b, n));
    CHECK(null_or_inside(m->u.hello_ack.entries, b, n));
    if (m->u.hello_ack.entries) {
      CHECK(inside(m->u.hello_ack.entries, m->u.hello_ack.entries_len, b, n));
      /* Walking never leaves the body, accepted or not. */
      uint32_t count = walk_entries(m->u.hello_ack.entries, m->u.hello_ack.entries_len, b, n);
      if (e == WIRE_OK) CHECK(count == m->u.hello_ack.count);
    }
    if (e != WIRE_OK) break;
    CHECK(m->u.hello_ack.name_len <= WIRE_MAX_NAME);
    CHECK(inside(m->u.hello_ack.name, m->u.hello_ack.name_len, b, n));
    CHECK(m->u.hello_ack.count <= WIRE_MAX_MEM_ENTRIES);
    CHECK(m->u.hello_ack.entries == b + 14 + m->u.hello_ack.name_len);
    CHECK(m->u.hello_ack.entries_len == n - 14 - m->u.hello_ack.name_len);
    CHECK(m->u.hello_ack.count > 0 || m->u.hello_ack.entries_len == 0);
    break;
  case WIRE_MEM_ADD:
  case WIRE_MEM_DEL:
    CHECK(null_or_inside(m->u.mem.tag, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.mem.tag_len <= WIRE_MAX_TAG);
    CHECK(inside(m->u.mem.tag, m->u.mem.tag_len, b, n));
    CHECK(n == 22u + m->u.mem.tag_len);
    if (h->type == WIRE_MEM_DEL) CHECK(m->u.mem.tag_len == 0);
    break;
  case WIRE_WRITE_REQ:
    if (e == WIRE_OK) CHECK(h->payload_len > 0 && h->payload_len <= WIRE_MAX_PAYLOAD);
    break;
  case WIRE_READ_REQ:
    if (e == WIRE_OK) CHECK(m->u.read_req.len > 0 && m->u.read_req.len <= WIRE_MAX_PAYLOAD);
    break;
  case WIRE_READ_RESP:
    if (e == WIRE_OK) CHECK(m->u.ack.status == 0 || h->payload_len == 0);
    break;
  case WIRE_WRITE_ACK:
  case WIRE_NOTIFY_ACK:
  case WIRE_SYNC:
  case WIRE_SYNC_ACK: CHECK(e == WIRE_OK && h->payload_len == 0); break;
  case WIRE_CALL:
  case WIRE_CALL_RESP: /* any bytes are a request or an answer: the service judges them */
    CHECK(e == WIRE_OK && h->payload_len == 0 && m->u.call.len <= WIRE_MAX_CALL);
    CHECK(inside(m->u.call.data, m->u.call.len, b, n));
    break;
  case WIRE_CALL_AFTER: /* a request as CALL's, behind WRITEs that came before it */
    if (e != WIRE_OK) break;
    CHECK(h->payload_len == 0 && m->u.call.len <= WIRE_MAX_CALL && m->u.call.after < m->u.call.seq);
    CHECK(m->u.call.len == n - 18 && inside(m->u.call.data, m->u.call.len, b, n));
    break;
  case WIRE_CALL_TAG: /* a request as CALL's, with the tag of the data it waits for: any value */
    CHECK(e == WIRE_OK && h->payload_len == 0 && m->u.call.len <= WIRE_MAX_CALL);
    CHECK(m->u.call.seq == get64(b) && m->u.call.after == get32(b + 8) && m->u.call.service == get16(b + 12));
    CHECK(m->u.call.len == n - 14 && inside(m->u.call.data, m->u.call.len, b, n));
    break;
  case WIRE_RDMA_CONNECT:
  case WIRE_RDMA_CONNECT_ACK:
    CHECK(null_or_inside(m->u.qp.gid, b, n));
    if (e == WIRE_OK)
      CHECK(m->u.qp.qpn <= 0xffffff && m->u.qp.psn <= 0xffffff && m->u.qp.mtu >= 1 && m->u.qp.mtu <= 5);
    break;
  case WIRE_SHM_HELLO:
  case WIRE_SHM_HELLO_ACK: {
    size_t fixed = h->type == WIRE_SHM_HELLO ? WIRE_SHM_HELLO_LEN : WIRE_SHM_HELLO_ACK_LEN;
    CHECK(null_or_inside(m->u.shm.boot_id, b, n));
    CHECK(null_or_inside(m->u.shm.nonce, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.shm.layout >= 1);
    CHECK(inside(m->u.shm.boot_id, 16, b, n));
    CHECK(h->type == WIRE_SHM_HELLO ? m->u.shm.nonce == NULL : inside(m->u.shm.nonce, 16, b, n));
    CHECK(m->u.shm.ext == b + fixed && m->u.shm.ext_len == n - fixed);
    CHECK(m->u.shm.layout > 1 || m->u.shm.ext_len == 0);
    if (m->u.shm.layout >= 2 && h->type == WIRE_SHM_HELLO) {
      CHECK(m->u.shm.ext_len >= 4 && m->u.shm.flags == get32(m->u.shm.ext));
      CHECK(m->u.shm.layout > 2 || m->u.shm.ext_len == 4);
    } else if (m->u.shm.layout >= 2) {
      CHECK(m->u.shm.sock_len <= WIRE_SHM_SOCK_MAX && m->u.shm.sock == m->u.shm.ext + 2);
      CHECK(inside(m->u.shm.sock, m->u.shm.sock_len, b, n));
      CHECK(m->u.shm.layout > 2 || m->u.shm.ext_len == 2u + m->u.shm.sock_len);
      for (uint16_t i = 0; i < m->u.shm.sock_len; i++)
        CHECK(m->u.shm.sock[i] > 0x20 && m->u.shm.sock[i] < 0x7f);
    } else {
      CHECK(m->u.shm.flags == 0 && m->u.shm.sock_len == 0);
    }
    break;
  }
  case WIRE_RAILS: CHECK(e == WIRE_OK && m->u.rails.seq == get64(b)); break;
  case WIRE_RAILS_ACK: {
    uint32_t count = get32(b + 8);
    CHECK((e == WIRE_OK) == (count >= 1 && count <= 8 && n == 12 + 6u * count));
    CHECK(null_or_inside(m->u.rails.addrs, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.rails.seq == get64(b) && m->u.rails.count == count && m->u.rails.addrs == b + 12);
    for (uint32_t i = 0; i < count; i++) {
      uint32_t a;
      uint16_t port;
      wire_rail_at(m, i, &a, &port);
      CHECK(a == get32(b + 12 + 6 * i) && port == get16(b + 16 + 6 * i));
    }
    break;
  }
  case WIRE_WIN_ADD:
  case WIRE_WIN_DEL: {
    uint32_t count = get32(b), each = h->type == WIRE_WIN_ADD ? 20 : 16;
    int ok = count >= 1 && count <= 4096 && n == 4 + (size_t)each * count;
    for (uint32_t i = 0; ok && i < count; i++) {
      uint64_t a = get64(b + 4 + each * i), l = get64(b + 12 + each * i);
      ok = l > 0 && a + l > a;
    }
    CHECK((e == WIRE_OK) == ok);
    CHECK(null_or_inside(m->u.win.ents, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.win.count == count && m->u.win.ents == b + 4);
    for (uint32_t i = 0; i < count; i++) {
      uint64_t a, l;
      uint32_t k;
      wire_win(m, i, &a, &l, &k);
      CHECK(a == get64(b + 4 + each * i) && l == get64(b + 12 + each * i));
      CHECK(k == (h->type == WIRE_WIN_ADD ? get32(b + 20 + each * i) : 0));
    }
    break;
  }
  case WIRE_SHM_MAP_HELLO: CHECK((e == WIRE_OK) == (get32(b) == 0)); break;
  case WIRE_SHM_MAP:
  case WIRE_SHM_UNMAP:
  case WIRE_SHM_UNMAP_ACK: {
    uint64_t addr = get64(b), len = get64(b + 8), map_len = h->type == WIRE_SHM_MAP ? get64(b + 16) : len;
    CHECK((e == WIRE_OK) == (len > 0 && addr <= UINT64_MAX - len && map_len >= len));
    if (e == WIRE_OK) CHECK(m->u.map.addr == addr && m->u.map.len == len && m->u.map.map_len == map_len);
    break;
  }
  case WIRE_SHM_DEV_MAP: {
    uint64_t addr = get64(b), len = get64(b + 8), alen = get64(b + 16), off = get64(b + 24);
    CHECK((e == WIRE_OK) == (len > 0 && addr <= UINT64_MAX - len && off <= alen && len <= alen - off));
    if (e == WIRE_OK)
      CHECK(m->u.map.addr == addr && m->u.map.len == len && m->u.map.alloc_len == alen &&
            m->u.map.offset == off && m->u.map.blob == b + 32);
    break;
  }
  case WIRE_SHM_MAP_ACK:
    CHECK((e == WIRE_OK) == (get32(b) <= 2 && get32(b) != 1));
    if (e == WIRE_OK) CHECK(m->u.map.text == b + 4 && m->u.map.text_len == n - 4);
    break;
  case WIRE_STAGE_WRITE:
  case WIRE_STAGE_READ:
  case WIRE_STAGE_PULL:
  case WIRE_STAGE_PUSH: {
    /* The rules, checked independently on the raw body: accepted exactly when they hold.
     * STAGE_PULL / STAGE_PUSH put buf u64 and rkey u32 between seq and count. */
    int rdma = h->type == WIRE_STAGE_PULL || h->type == WIRE_STAGE_PUSH;
    size_t fixed = rdma ? 24 : 12;
    uint64_t sbuf = rdma ? get64(b + 8) : 0;
    uint32_t count = get32(b + fixed - 4);
    int ok = count >= 1 && count <= 4096 && n == fixed + 12u * (size_t)count;
    uint64_t sum = 0;
    for (uint32_t i = 0; ok && i < count; i++) {
      uint64_t addr = get64(b + fixed + 12 * (size_t)i);
      uint32_t seg_len = get32(b + fixed + 8 + 12 * (size_t)i);
      ok = seg_len >= 1 && addr <= UINT64_MAX - seg_len;
      sum += seg_len;
    }
    ok = ok && sum <= (16u << 20) && h->payload_len == (h->type == WIRE_STAGE_WRITE ? sum : 0);
    ok = ok && (!rdma || sbuf <= UINT64_MAX - sum);
    CHECK(ok == (e == WIRE_OK));
    CHECK(null_or_inside(m->u.stage.segs, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.stage.seq == get64(b) && m->u.stage.count == count);
    if (rdma) CHECK(m->u.stage.buf == sbuf && m->u.stage.rkey == get32(b + 16));
    CHECK(m->u.stage.count >= 1 && m->u.stage.count <= WIRE_MAX_STAGE_SEGS);
    CHECK(m->u.stage.segs == b + fixed);
    CHECK(inside(m->u.stage.segs, (size_t)m->u.stage.count * WIRE_STAGE_SEG_LEN, b, n));
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->u.stage.count; i++) {
      uint64_t addr;
      uint32_t seg_len;
      wire_stage_seg(m, i, &addr, &seg_len);
      CHECK(addr == get64(b + fixed + 12 * (size_t)i) && seg_len == get32(b + fixed + 8 + 12 * (size_t)i));
      CHECK(seg_len >= 1 && addr + seg_len > addr);
      total += seg_len;
    }
    CHECK(total == m->u.stage.total && total <= WIRE_MAX_STAGE);
    CHECK(h->payload_len == (h->type == WIRE_STAGE_WRITE ? total : 0));
    if (rdma) CHECK(m->u.stage.buf + total > m->u.stage.buf); /* total >= 1 here */
    break;
  }
  case WIRE_NOTIFY:
    CHECK(null_or_inside(m->u.notify.name, b, n));
    CHECK(null_or_inside(m->u.notify.msg, b, n));
    if (e != WIRE_OK) break;
    CHECK(m->u.notify.name_len <= WIRE_MAX_NOTIFY && m->u.notify.msg_len <= WIRE_MAX_NOTIFY);
    CHECK(inside(m->u.notify.name, m->u.notify.name_len, b, n));
    CHECK(inside(m->u.notify.msg, m->u.notify.msg_len, b, n));
    CHECK(m->u.notify.msg == m->u.notify.name + m->u.notify.name_len);
    CHECK(n == 12u + m->u.notify.name_len + m->u.notify.msg_len);
    break;
  default: CHECK(!"wire_parse_hdr accepted an unknown type");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t off = 0;

  while (size - off >= WIRE_HDR_LEN) {
    /* Heap copies of exactly the bytes each call may read. */
    uint8_t *raw = malloc(WIRE_HDR_LEN);
    struct wire_hdr h;
    CHECK(raw != NULL);
    memcpy(raw, data + off, WIRE_HDR_LEN);
    enum wire_err e = wire_parse_hdr(raw, &h);
    check_hdr(raw, e, &h);
    free(raw);
    off += WIRE_HDR_LEN;
    if (e != WIRE_OK) continue; /* resynchronise on the next 20 bytes */
    if (size - off < h.body_len) break;

    uint8_t *body = malloc(h.body_len);
    struct wire_msg m;
    CHECK(body != NULL);
    memcpy(body, data + off, h.body_len);
    e = wire_decode(&h, body, &m);
    check_msg(e, &h, body, &m);
    if (e == WIRE_OK) check_rebuild(data + off - WIRE_HDR_LEN, &m);
    free(body);
    off += h.body_len;

    /* Skip the payload that streams after the frame, as much of it as is here. */
    off += size - off < h.payload_len ? size - off : h.payload_len;
  }
  return 0;
}
