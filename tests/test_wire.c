/* test_wire: the wire codec. Builders round-trip through wire_parse_hdr and wire_decode,
 * header bytes are checked exactly, and every malformed frame the parser must refuse is
 * built by hand here, byte by byte, independent of the builders. */
#include "wire/wire.h"

#include "test_util.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Independent big-endian writers: the tests must not trust the code under test. */
static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static void put64(uint8_t *p, uint64_t v) {
  put32(p, (uint32_t)(v >> 32));
  put32(p + 4, (uint32_t)v);
}

/* A canonical version-1 header, then the fields a test wants to spoil. */
static void raw_hdr(uint8_t *p, unsigned type, uint32_t body_len, uint32_t payload_len) {
  put32(p, WIRE_MAGIC);
  p[4] = WIRE_VERSION;
  p[5] = (uint8_t)type;
  put16(p + 6, 0);
  put32(p + 8, body_len);
  put32(p + 12, payload_len);
  put32(p + 16, 0);
}

static enum wire_err hdr_of(unsigned type, uint32_t body_len, uint32_t payload_len) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;
  raw_hdr(b, type, body_len, payload_len);
  return wire_parse_hdr(b, &h);
}

/* Parses a whole frame (header and body, payload not included) and checks the header
 * claims exactly the bytes given. */
static enum wire_err parse_frame(const uint8_t *buf, size_t len, struct wire_msg *m) {
  struct wire_hdr h;
  enum wire_err e;

  if (len < WIRE_HDR_LEN) return WIRE_ELEN;
  e = wire_parse_hdr(buf, &h);
  if (e != WIRE_OK) return e;
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + (size_t)h.body_len);
  return wire_decode(&h, buf + WIRE_HDR_LEN, m);
}

/* Decodes a hand-made body under a valid header for it; body_len is the body size. */
static enum wire_err decode_body(unsigned type, const uint8_t *body, uint32_t body_len, uint32_t payload_len,
                                 struct wire_msg *m) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;
  raw_hdr(b, type, body_len, payload_len);
  CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(b, &h), WIRE_OK);
  return wire_decode(&h, body, m);
}

/* True when [p, p + n) lies within [base, base + len). Compared as integers, since p may
 * come from a buggy decoder and point anywhere. */
static int inside(const uint8_t *p, size_t n, const uint8_t *base, size_t len) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)base;
  return a >= lo && a - lo <= len && n <= len - (a - lo);
}

/* ---- header ---- */

static void test_hdr_bytes(void) {
  uint8_t buf[WIRE_SMALL_FRAME];
  static const uint8_t want[] = {
      0x48, 0x58, 0x49, 0x4c,                         /* magic "HXIL" */
      0x01,                                           /* version */
      0x07,                                           /* READ_REQ */
      0x00, 0x00,                                     /* flags */
      0x00, 0x00, 0x00, 0x14,                         /* body_len 20 */
      0x00, 0x00, 0x00, 0x00,                         /* payload_len */
      0x00, 0x00, 0x00, 0x00,                         /* reserved */
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* seq */
      0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, /* raddr */
      0x00, 0x40, 0x00, 0x00,                         /* len 4 MiB */
  };

  CU_ASSERT_EQUAL(wire_put_read_req(buf, 0x0102030405060708ull, 0x1112131415161718ull, WIRE_MAX_PAYLOAD),
                  sizeof(want));
  CU_ASSERT_EQUAL(memcmp(buf, want, sizeof(want)), 0);

  /* The payload length is big-endian too. */
  CU_ASSERT_EQUAL(wire_put_write_req(buf, 1, 2, 0x00a1b2c3u), WIRE_HDR_LEN + 16);
  static const uint8_t pl[] = {0x00, 0xa1, 0xb2, 0xc3};
  CU_ASSERT_EQUAL(memcmp(buf + 12, pl, 4), 0);
  CU_ASSERT_EQUAL(buf[5], WIRE_WRITE_REQ);
  CU_ASSERT_EQUAL(buf[11], 16);
}

static void test_hdr_parse_fields(void) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;

  raw_hdr(b, WIRE_READ_RESP, 12, 0x00010203u);
  CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(b, &h), WIRE_OK);
  CU_ASSERT_EQUAL(h.magic, WIRE_MAGIC);
  CU_ASSERT_EQUAL(h.version, WIRE_VERSION);
  CU_ASSERT_EQUAL(h.type, WIRE_READ_RESP);
  CU_ASSERT_EQUAL(h.flags, 0);
  CU_ASSERT_EQUAL(h.body_len, 12);
  CU_ASSERT_EQUAL(h.payload_len, 0x00010203u);
  CU_ASSERT_EQUAL(h.reserved, 0);
}

static void test_hdr_bad_magic(void) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;

  for (int i = 0; i < 4; i++) {
    raw_hdr(b, WIRE_HELLO, 6, 0);
    b[i] ^= 0x20; /* "hXIL", "HxIL", ... */
    CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EMAGIC);
  }
  /* Little-endian magic is someone else. */
  raw_hdr(b, WIRE_HELLO, 6, 0);
  b[0] = 0x4c, b[1] = 0x49, b[2] = 0x58, b[3] = 0x48;
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EMAGIC);
  memset(b, 0, sizeof(b));
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EMAGIC);
  /* Magic is checked before anything else. */
  memset(b, 0xff, sizeof(b));
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EMAGIC);
}

static void test_hdr_version(void) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;
  static const uint8_t versions[] = {0, 2, 0x81, 0xff};

  for (size_t i = 0; i < sizeof(versions); i++) {
    raw_hdr(b, WIRE_HELLO, 9, 0);
    b[4] = versions[i];
    memset(&h, 0xa5, sizeof(h));
    CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EVERSION);
    /* Still filled, so the caller can answer with HELLO_ACK(VERSION). */
    CU_ASSERT_EQUAL(h.magic, WIRE_MAGIC);
    CU_ASSERT_EQUAL(h.version, versions[i]);
    CU_ASSERT_EQUAL(h.type, WIRE_HELLO);
    CU_ASSERT_EQUAL(h.flags, 0);
    CU_ASSERT_EQUAL(h.body_len, 9);
    CU_ASSERT_EQUAL(h.payload_len, 0);
    CU_ASSERT_EQUAL(h.reserved, 0);
  }
  /* A future version may change everything after the version byte. */
  raw_hdr(b, 0xee, 0xffffffffu, 0xffffffffu);
  b[4] = 2;
  b[7] = 1;
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_EVERSION);
  CU_ASSERT_EQUAL(h.type, 0xee);
  CU_ASSERT_EQUAL(h.flags, 1);
  CU_ASSERT_EQUAL(h.body_len, 0xffffffffu);
}

static void test_hdr_type(void) {
  CU_ASSERT_EQUAL(hdr_of(0, 12, 0), WIRE_ETYPE);
  CU_ASSERT_EQUAL(hdr_of(WIRE_TYPE_MAX_ + 1, 12, 0), WIRE_ETYPE);
  CU_ASSERT_EQUAL(hdr_of(0x80, 12, 0), WIRE_ETYPE);
  CU_ASSERT_EQUAL(hdr_of(0xff, 12, 0), WIRE_ETYPE);
  CU_ASSERT_EQUAL(hdr_of(WIRE_NOTIFY_ACK, 12, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, 24, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PULL, 36, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PUSH, 36, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL, 10, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_RESP, 12, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_UNMAP_ACK, 16, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_AFTER, 18, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_AUTH_PROOF, 32, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_RAILS_ACK, 18, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_WIN_DEL, 20, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_DEV_MAP, 96, 0), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_DEV_MAP, 95, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_TAG, 14, 0), WIRE_OK); /* the last type */
  CU_ASSERT_EQUAL(hdr_of(37, 37, 0), WIRE_ETYPE);
  CU_ASSERT_EQUAL(hdr_of(37, 32, 0), WIRE_ETYPE);
}

static void test_hdr_flags_reserved(void) {
  uint8_t b[WIRE_HDR_LEN];
  struct wire_hdr h;

  for (int i = 6; i < 8; i++) {
    raw_hdr(b, WIRE_WRITE_ACK, 12, 0);
    b[i] = 2; /* an unknown flag */
    CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_ELEN);
  }
  raw_hdr(b, WIRE_WRITE_ACK, 12, 0);
  b[7] = WIRE_F_TAG; /* the one flag there is: taken, and told */
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_OK);
  CU_ASSERT_EQUAL(h.flags, WIRE_F_TAG);
  b[6] = 0x80;
  CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_ELEN);
  for (int i = 16; i < 20; i++) {
    raw_hdr(b, WIRE_WRITE_ACK, 12, 0);
    b[i] = 0x80;
    CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_ELEN);
  }
}

/* The body and payload limits every type must enforce, written out independently of
 * wire.c; payload is the largest payload the type may carry (0: none). */
#define MIB(n) ((uint32_t)(n) << 20)
static const struct {
  unsigned type;
  uint32_t min, max;
  uint32_t payload;
} limits[] = {
    {WIRE_HELLO, 6, 6 + WIRE_MAX_NAME + 32 + 1 + 2 * 8 + 2 + WIRE_MAX_NAME + 1024,
     0}, /* name, the auth block, dialled, extensions */
    {WIRE_HELLO_ACK, 14, WIRE_MAX_BODY, 0},
    {WIRE_MEM_ADD, 22, 22 + WIRE_MAX_TAG, 0},
    {WIRE_MEM_DEL, 22, 22, 0},
    {WIRE_WRITE_REQ, 16, 16, MIB(4)},
    {WIRE_WRITE_ACK, 12, 12, 0},
    {WIRE_READ_REQ, 20, 20, 0},
    {WIRE_READ_RESP, 12, 12, MIB(16)}, /* also answers STAGE_READ */
    {WIRE_NOTIFY, 12, 12 + 2 * WIRE_MAX_NOTIFY, 0},
    {WIRE_NOTIFY_ACK, 12, 12, 0},
    {WIRE_SYNC, 8, 8, 0},
    {WIRE_SYNC_ACK, 12, 12, 0},
    {WIRE_RDMA_CONNECT, 25, 25, 0},
    {WIRE_RDMA_CONNECT_ACK, 29, 29, 0},
    {WIRE_SHM_HELLO, 26, 26 + 256, 0},
    {WIRE_SHM_HELLO_ACK, 54, 54 + 256, 0},
    {WIRE_STAGE_WRITE, 12 + 12, 12 + 12 * 4096, MIB(16)},
    {WIRE_STAGE_READ, 12 + 12, 12 + 12 * 4096, 0},
    {WIRE_STAGE_PULL, 24 + 12, 24 + 12 * 4096, 0}, /* the data moves by RDMA, never here */
    {WIRE_STAGE_PUSH, 24 + 12, 24 + 12 * 4096, 0},
    {WIRE_CALL, 10, 10 + 65536, 0},
    {WIRE_CALL_RESP, 12, 12 + 65536, 0},
    {WIRE_SHM_MAP_HELLO, 4, 4, 0},
    {WIRE_SHM_MAP, 24, 24, 0}, /* the memfd goes over the unix socket, never here */
    {WIRE_SHM_MAP_ACK, 4, 4 + 256, 0},
    {WIRE_SHM_UNMAP, 16, 16, 0},
    {WIRE_SHM_UNMAP_ACK, 16, 16, 0},
    {WIRE_CALL_AFTER, 18, 18 + 65536, 0},
    {WIRE_AUTH_CHALLENGE, 74, 74 + 255, 0},
    {WIRE_AUTH_PROOF, 32, 32, 0},
    {WIRE_RAILS, 8, 8, 0},
    {WIRE_RAILS_ACK, 18, 60, 0},
    {WIRE_WIN_ADD, 24, 4 + 20 * 4096, 0},
    {WIRE_WIN_DEL, 20, 4 + 16 * 4096, 0},
    {WIRE_SHM_DEV_MAP, 96, 96, 0},
    {WIRE_CALL_TAG, 14, 14 + 65536, 0},
};
#define NLIMITS (sizeof(limits) / sizeof(limits[0]))

static void test_hdr_body_limits(void) {
  CU_ASSERT_EQUAL_FATAL(NLIMITS, WIRE_TYPE_MAX_);
  for (size_t i = 0; i < NLIMITS; i++) {
    unsigned t = limits[i].type;
    CU_ASSERT_EQUAL(hdr_of(t, 0, 0), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(t, limits[i].min - 1, 0), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(t, limits[i].min, 0), WIRE_OK);
    CU_ASSERT_EQUAL(hdr_of(t, limits[i].max, 0), WIRE_OK);
    CU_ASSERT_EQUAL(hdr_of(t, limits[i].max + 1, 0), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(t, WIRE_MAX_BODY + 1, 0), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(t, 0x80000000u, 0), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(t, 0xffffffffu, 0), WIRE_ELEN);
  }
}

static void test_hdr_payload(void) {
  for (size_t i = 0; i < NLIMITS; i++) {
    unsigned t = limits[i].type;
    uint32_t body = limits[i].min, cap = limits[i].payload;
    if (cap) {
      CU_ASSERT_EQUAL(hdr_of(t, body, 1), WIRE_OK);
      CU_ASSERT_EQUAL(hdr_of(t, body, cap), WIRE_OK);
      CU_ASSERT_EQUAL(hdr_of(t, body, cap + 1), WIRE_ELEN);
      CU_ASSERT_EQUAL(hdr_of(t, body, 0xffffffffu), WIRE_ELEN);
    } else {
      CU_ASSERT_EQUAL(hdr_of(t, body, 1), WIRE_ELEN);
      CU_ASSERT_EQUAL(hdr_of(t, body, 0x80000000u), WIRE_ELEN);
    }
  }
  /* WRITE_REQ stays at one 4 MiB chunk; READ_RESP may carry a whole staged unit. */
  CU_ASSERT_EQUAL(hdr_of(WIRE_WRITE_REQ, 16, MIB(4) + 1), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_WRITE_REQ, 16, MIB(16)), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_READ_RESP, 12, MIB(4) + 1), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_READ_RESP, 12, MIB(16)), WIRE_OK);
  CU_ASSERT_EQUAL(hdr_of(WIRE_READ_RESP, 12, MIB(16) + 1), WIRE_ELEN);
}

/* Numbers that are part of the protocol: a change here breaks peers already deployed. */
static void test_constants(void) {
  CU_ASSERT_EQUAL(WIRE_STAGE_WRITE, 17);
  CU_ASSERT_EQUAL(WIRE_STAGE_READ, 18);
  CU_ASSERT_EQUAL(WIRE_STAGE_PULL, 19);
  CU_ASSERT_EQUAL(WIRE_STAGE_PUSH, 20);
  CU_ASSERT_EQUAL(WIRE_CALL, 21);
  CU_ASSERT_EQUAL(WIRE_CALL_RESP, 22);
  CU_ASSERT_EQUAL(WIRE_SHM_MAP_HELLO, 23);
  CU_ASSERT_EQUAL(WIRE_SHM_UNMAP_ACK, 27);
  CU_ASSERT_EQUAL(WIRE_CALL_AFTER, 28);
  CU_ASSERT_EQUAL(WIRE_AUTH_CHALLENGE, 29);
  CU_ASSERT_EQUAL(WIRE_AUTH_PROOF, 30);
  CU_ASSERT_EQUAL(WIRE_RAILS, 31);
  CU_ASSERT_EQUAL(WIRE_RAILS_ACK, 32);
  CU_ASSERT_EQUAL(WIRE_WIN_ADD, 33);
  CU_ASSERT_EQUAL(WIRE_WIN_DEL, 34);
  CU_ASSERT_EQUAL(WIRE_SHM_DEV_MAP, 35);
  CU_ASSERT_EQUAL(WIRE_CALL_TAG, 36);
  CU_ASSERT_EQUAL(WIRE_TYPE_MAX_, 36);
  CU_ASSERT_EQUAL(WIRE_SHM_F_DEVMAP, 0x2u);
  CU_ASSERT_EQUAL(WIRE_CAP_WIN, 0x800u);
  CU_ASSERT_EQUAL(WIRE_CAP_RAILS, 0x200u);
  CU_ASSERT_EQUAL(WIRE_CAP_AUTH, 0x100);
  CU_ASSERT_EQUAL(WIRE_SHM_LAYOUT, 2);
  CU_ASSERT_EQUAL(WIRE_MAX_CALL, 65536);
  CU_ASSERT_EQUAL(WIRE_CAP_CALL, 0x40);
  CU_ASSERT_EQUAL(WIRE_CAP_CALL_AFTER, 0x80);
  CU_ASSERT_EQUAL(WIRE_CAP_CALL_TAG, 0x2000);
  CU_ASSERT_EQUAL(WIRE_MAX_PAYLOAD, MIB(4));
  CU_ASSERT_EQUAL(WIRE_MAX_STAGE, MIB(16));
  CU_ASSERT_EQUAL(WIRE_MAX_STAGE_SEGS, 4096);
  CU_ASSERT_EQUAL(WIRE_STAGE_SEG_LEN, 12);
  CU_ASSERT_EQUAL(WIRE_CAP_TCP_DATA, 0x1);
  CU_ASSERT_EQUAL(WIRE_CAP_RDMA, 0x2);
  CU_ASSERT_EQUAL(WIRE_CAP_SHM, 0x4);
  CU_ASSERT_EQUAL(WIRE_CAP_STAGE, 0x8);
  CU_ASSERT_EQUAL(WIRE_CAP_STAGE_ANY, 0x10);
  CU_ASSERT_EQUAL(WIRE_CAP_STAGE_RDMA, 0x20);
}

/* RAILS_ACK: built and read back; its count must say exactly how long it is. */
static void test_rails_ack(void) {
  uint8_t b[WIRE_HDR_LEN + 12 + WIRE_RAIL_LEN * WIRE_MAX_RAILS + 8];
  uint32_t addr[WIRE_MAX_RAILS + 1] = {0x0a580001u, 0x0a580101u, 0x0a580201u};
  uint16_t port[WIRE_MAX_RAILS + 1] = {5000, 5001, 5002};
  struct wire_hdr h;
  struct wire_msg m;
  CU_ASSERT_EQUAL(wire_put_rails_ack(b, sizeof(b), 7, addr, port, 0), 0);
  CU_ASSERT_EQUAL(wire_put_rails_ack(b, sizeof(b), 7, addr, port, WIRE_MAX_RAILS + 1), 0);
  CU_ASSERT_EQUAL(wire_put_rails_ack(b, WIRE_HDR_LEN + 12, 7, addr, port, 1), 0);
  size_t len = wire_put_rails_ack(b, sizeof(b), 7, addr, port, 3);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 12 + 3 * WIRE_RAIL_LEN);
  CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(b, &h), WIRE_OK);
  CU_ASSERT_EQUAL_FATAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.rails.seq, 7);
  CU_ASSERT_EQUAL(m.u.rails.count, 3);
  for (uint32_t i = 0; i < 3; i++) {
    uint32_t a;
    uint16_t p;
    wire_rail_at(&m, i, &a, &p);
    CU_ASSERT_EQUAL(a, addr[i]);
    CU_ASSERT_EQUAL(p, port[i]);
  }
  /* a count that disagrees with the body's length, or 0 */
  put32(b + WIRE_HDR_LEN + 8, 2);
  CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
  put32(b + WIRE_HDR_LEN + 8, 0);
  CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(wire_put_rails(b, 9), WIRE_HDR_LEN + 8);
  CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(b, &h), WIRE_OK);
  CU_ASSERT_EQUAL_FATAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.rails.seq, 9);
}

/* WIN_ADD / WIN_DEL: built, decoded, and refused when a count disagrees with the
 * body, is 0, or an entry is empty or wraps. */
static void test_wins(void) {
  uint8_t b[WIRE_HDR_LEN + 4 + 3 * WIRE_WIN_LEN];
  const uint64_t r[3][2] = {{0x1000, 0x100}, {0x2000, 0x2000}, {0xffff0000, 0x10000}};
  const uint32_t key[3] = {0x11, 0x2233, 0xdeadbeef};
  struct wire_hdr h;
  struct wire_msg m;
  CU_ASSERT_EQUAL(wire_put_wins(b, sizeof(b), r, key, 0), 0);
  CU_ASSERT_EQUAL(wire_put_wins(b, WIRE_HDR_LEN + 4 + 2 * WIRE_WIN_LEN, r, key, 3), 0);
  for (int add = 1; add >= 0; add--) {
    size_t each = add ? WIRE_WIN_LEN : WIRE_WIN_DEL_LEN;
    size_t len = wire_put_wins(b, sizeof(b), r, add ? key : NULL, 3);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 4 + 3 * each);
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(b, &h), WIRE_OK);
    CU_ASSERT_EQUAL(h.type, add ? WIRE_WIN_ADD : WIRE_WIN_DEL);
    CU_ASSERT_EQUAL_FATAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_OK);
    CU_ASSERT_EQUAL_FATAL(m.u.win.count, 3);
    for (uint32_t i = 0; i < 3; i++) {
      uint64_t a, l;
      uint32_t k;
      wire_win(&m, i, &a, &l, &k);
      CU_ASSERT_EQUAL(a, r[i][0]);
      CU_ASSERT_EQUAL(l, r[i][1]);
      CU_ASSERT_EQUAL(k, add ? key[i] : 0);
    }
    put32(b + WIRE_HDR_LEN, 2); /* a count that disagrees with the body */
    CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
    put32(b + WIRE_HDR_LEN, 0);
    CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
    put32(b + WIRE_HDR_LEN, 3);
    memset(b + WIRE_HDR_LEN + 4 + each + 8, 0, 8); /* the second entry empty */
    CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
    wire_put_wins(b, sizeof(b), r, add ? key : NULL, 3);
    memset(b + WIRE_HDR_LEN + 4 + 2 * each, 0xff, 8); /* the third wraps */
    CU_ASSERT_EQUAL(wire_decode(&h, b + WIRE_HDR_LEN, &m), WIRE_EBODY);
  }
}

static void test_names(void) {
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_HELLO), "HELLO");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_READ_RESP), "READ_RESP");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_NOTIFY_ACK), "NOTIFY_ACK");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SYNC), "SYNC");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SYNC_ACK), "SYNC_ACK");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SHM_HELLO), "SHM_HELLO");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SHM_HELLO_ACK), "SHM_HELLO_ACK");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_STAGE_WRITE), "STAGE_WRITE");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_STAGE_READ), "STAGE_READ");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_STAGE_PULL), "STAGE_PULL");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_STAGE_PUSH), "STAGE_PUSH");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_CALL), "CALL");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_CALL_RESP), "CALL_RESP");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SHM_MAP_HELLO), "SHM_MAP_HELLO");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SHM_UNMAP_ACK), "SHM_UNMAP_ACK");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_CALL_AFTER), "CALL_AFTER");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_CALL_TAG), "CALL_TAG");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_AUTH_CHALLENGE), "AUTH_CHALLENGE");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_AUTH_PROOF), "AUTH_PROOF");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_RAILS), "RAILS");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_RAILS_ACK), "RAILS_ACK");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_WIN_ADD), "WIN_ADD");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_WIN_DEL), "WIN_DEL");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_SHM_DEV_MAP), "SHM_DEV_MAP");
  CU_ASSERT_STRING_EQUAL(wire_type_name(37), "?");
  /* Every type has its own name. */
  for (unsigned t = 1; t <= WIRE_TYPE_MAX_; t++) {
    CU_ASSERT_STRING_NOT_EQUAL(wire_type_name(t), "?");
    for (unsigned u = 1; u < t; u++) CU_ASSERT_STRING_NOT_EQUAL(wire_type_name(t), wire_type_name(u));
  }
  CU_ASSERT_STRING_EQUAL(wire_type_name(0), "?");
  CU_ASSERT_STRING_EQUAL(wire_type_name(WIRE_TYPE_MAX_ + 1), "?");
  CU_ASSERT_STRING_EQUAL(wire_type_name(~0u), "?");
  for (int e = WIRE_OK; e <= WIRE_EBODY; e++) {
    CU_ASSERT_PTR_NOT_NULL(wire_err_str((enum wire_err)e));
    CU_ASSERT_STRING_NOT_EQUAL(wire_err_str((enum wire_err)e), "unknown wire error");
  }
  CU_ASSERT_STRING_EQUAL(wire_err_str((enum wire_err)99), "unknown wire error");
}

/* ---- round trips ---- */

static void test_rt_hello(void) {
  uint8_t buf[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME];
  struct wire_wr w;
  struct wire_msg m;
  char name[WIRE_MAX_NAME];
  static const uint16_t lens[] = {0, 1, 7, WIRE_MAX_NAME};

  memset(name, 'n', sizeof(name));
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    wire_begin(&w, buf, sizeof(buf), WIRE_HELLO);
    wire_put_u32(&w, WIRE_CAP_TCP_DATA);
    wire_put_u16(&w, lens[i]);
    wire_put_bytes(&w, name, lens[i]);
    size_t len = wire_end(&w, 0);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 6u + lens[i]);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.hdr.type, WIRE_HELLO);
    CU_ASSERT_EQUAL(m.hdr.body_len, 6u + lens[i]);
    CU_ASSERT_EQUAL(m.u.hello.caps, WIRE_CAP_TCP_DATA);
    CU_ASSERT_EQUAL(m.u.hello.name_len, lens[i]);
    CU_ASSERT_PTR_EQUAL(m.u.hello.name, buf + WIRE_HDR_LEN + 6);
    CU_ASSERT_EQUAL(memcmp(m.u.hello.name, name, lens[i]), 0);
  }
}

struct ent {
  uint64_t addr, len;
  const char *tag;
};

static size_t build_hello_ack(uint8_t *buf, size_t cap, uint32_t status, const char *name,
                              const struct ent *e, uint32_t n) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, WIRE_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA);
  wire_put_u16(&w, (uint16_t)strlen(name));
  wire_put_bytes(&w, name, strlen(name));
  wire_put_u32(&w, n);
  for (uint32_t i = 0; i < n; i++) wire_put_mem_entry(&w, e[i].addr, e[i].len, (uint32_t)i + 7, e[i].tag);
  return wire_end(&w, 0);
}

static void test_rt_hello_ack(void) {
  uint8_t buf[1024];
  struct wire_msg m;
  struct wire_mem_entry e;
  char tag255[WIRE_MAX_TAG + 1];
  memset(tag255, 't', WIRE_MAX_TAG);
  tag255[WIRE_MAX_TAG] = 0;
  const struct ent ents[] = {
      {0x00007f0012345000ull, 4096, "kv.layer0"},
      {0xffffffffffffffffull, 0xffffffffffffffffull, ""},
      {0, 1, NULL},
      {0x1000, 1ull << 40, tag255},
  };
  const uint32_t n = sizeof(ents) / sizeof(ents[0]);

  size_t len = build_hello_ack(buf, sizeof(buf), WIRE_HELLO_OK, "prefill-0", ents, n);
  CU_ASSERT_FATAL(len > 0);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.hello_ack.status, WIRE_HELLO_OK);
  CU_ASSERT_EQUAL(m.u.hello_ack.caps, WIRE_CAP_TCP_DATA);
  CU_ASSERT_EQUAL_FATAL(m.u.hello_ack.name_len, 9);
  CU_ASSERT_EQUAL(memcmp(m.u.hello_ack.name, "prefill-0", 9), 0);
  CU_ASSERT_EQUAL(m.u.hello_ack.count, n);
  CU_ASSERT_PTR_EQUAL(m.u.hello_ack.entries, buf + WIRE_HDR_LEN + 14 + 9);
  CU_ASSERT_EQUAL(m.u.hello_ack.entries_len, len - WIRE_HDR_LEN - 14 - 9);

  const uint8_t *cur = m.u.hello_ack.entries;
  size_t left = m.u.hello_ack.entries_len;
  uint32_t seen = 0;
  while (wire_mem_entry_next(&cur, &left, &e)) {
    CU_ASSERT_FATAL(seen < n);
    const char *tag = ents[seen].tag ? ents[seen].tag : "";
    CU_ASSERT_EQUAL(e.addr, ents[seen].addr);
    CU_ASSERT_EQUAL(e.len, ents[seen].len);
    CU_ASSERT_EQUAL(e.rkey, seen + 7);
    CU_ASSERT_EQUAL_FATAL(e.tag_len, strlen(tag));
    CU_ASSERT_EQUAL(memcmp(e.tag, tag, e.tag_len), 0);
    CU_ASSERT(inside(e.tag, e.tag_len, buf, len));
    seen++;
  }
  CU_ASSERT_EQUAL(seen, n);
  CU_ASSERT_EQUAL(left, 0);
  CU_ASSERT_PTR_EQUAL(cur, buf + len);
  /* Past the end it stays false and leaves the cursor alone. */
  CU_ASSERT_FALSE(wire_mem_entry_next(&cur, &left, &e));
  CU_ASSERT_PTR_EQUAL(cur, buf + len);
}

static void test_rt_hello_ack_empty(void) {
  uint8_t buf[64];
  struct wire_msg m;
  struct wire_mem_entry e;

  size_t len = build_hello_ack(buf, sizeof(buf), WIRE_HELLO_VERSION, "", NULL, 0);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 14);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.hello_ack.status, WIRE_HELLO_VERSION);
  CU_ASSERT_EQUAL(m.u.hello_ack.name_len, 0);
  CU_ASSERT_EQUAL(m.u.hello_ack.count, 0);
  CU_ASSERT_EQUAL(m.u.hello_ack.entries_len, 0);
  const uint8_t *cur = m.u.hello_ack.entries;
  size_t left = m.u.hello_ack.entries_len;
  CU_ASSERT_FALSE(wire_mem_entry_next(&cur, &left, &e));
}

/* The largest table: WIRE_MAX_MEM_ENTRIES entries decode, one more does not. */
static void test_rt_hello_ack_max(void) {
  const size_t cap = WIRE_HDR_LEN + 14 + 4 + (WIRE_MAX_MEM_ENTRIES + 1) * (22 + 8);
  uint8_t *buf = malloc(cap);
  struct ent *ents = calloc(WIRE_MAX_MEM_ENTRIES + 1, sizeof(*ents));
  struct wire_msg m;
  struct wire_mem_entry e;
  CU_ASSERT_FATAL(buf && ents);

  for (uint32_t i = 0; i <= WIRE_MAX_MEM_ENTRIES; i++)
    ents[i] = (struct ent){0x100000ull * i, 4096 + i, "blk"};
  size_t len = build_hello_ack(buf, cap, 0, "big", ents, WIRE_MAX_MEM_ENTRIES);
  CU_ASSERT_FATAL(len > 0);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.hello_ack.count, WIRE_MAX_MEM_ENTRIES);
  const uint8_t *cur = m.u.hello_ack.entries;
  size_t left = m.u.hello_ack.entries_len;
  uint32_t seen = 0;
  while (wire_mem_entry_next(&cur, &left, &e)) {
    CU_ASSERT_EQUAL(e.addr, ents[seen].addr);
    CU_ASSERT_EQUAL(e.len, ents[seen].len);
    seen++;
  }
  CU_ASSERT_EQUAL(seen, WIRE_MAX_MEM_ENTRIES);

  len = build_hello_ack(buf, cap, 0, "big", ents, WIRE_MAX_MEM_ENTRIES + 1);
  CU_ASSERT_FATAL(len > 0);
  CU_ASSERT_EQUAL(parse_frame(buf, len, &m), WIRE_EBODY);
  free(ents);
  free(buf);
}

static void test_rt_mem(void) {
  uint8_t buf[WIRE_HDR_LEN + 22 + WIRE_MAX_TAG];
  struct wire_wr w;
  struct wire_msg m;

  wire_begin(&w, buf, sizeof(buf), WIRE_MEM_ADD);
  wire_put_mem_entry(&w, 0xdeadbeef000ull, 123456789, 0xabcdef01u, "kv.v");
  size_t len = wire_end(&w, 0);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 22 + 4);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.mem.addr, 0xdeadbeef000ull);
  CU_ASSERT_EQUAL(m.u.mem.len, 123456789);
  CU_ASSERT_EQUAL_FATAL(m.u.mem.tag_len, 4);
  CU_ASSERT_EQUAL(memcmp(m.u.mem.tag, "kv.v", 4), 0);
  CU_ASSERT_PTR_EQUAL(m.u.mem.tag, buf + WIRE_HDR_LEN + 22);
  CU_ASSERT_EQUAL(m.u.mem.rkey, 0xabcdef01u);

  wire_begin(&w, buf, sizeof(buf), WIRE_MEM_DEL);
  wire_put_mem_entry(&w, 0xdeadbeef000ull, 123456789, 0, NULL);
  len = wire_end(&w, 0);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 22);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.hdr.type, WIRE_MEM_DEL);
  CU_ASSERT_EQUAL(m.u.mem.addr, 0xdeadbeef000ull);
  CU_ASSERT_EQUAL(m.u.mem.len, 123456789);
  CU_ASSERT_EQUAL(m.u.mem.tag_len, 0);
}

static void test_rt_write_req(void) {
  uint8_t a[WIRE_SMALL_FRAME], b[WIRE_SMALL_FRAME];
  struct wire_wr w;
  struct wire_msg m;

  size_t len = wire_put_write_req(a, 0xfedcba9876543210ull, 0x7f0000001000ull, 65536);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 16);
  CU_ASSERT_EQUAL_FATAL(parse_frame(a, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.hdr.payload_len, 65536);
  CU_ASSERT_EQUAL(m.u.write_req.seq, 0xfedcba9876543210ull);
  CU_ASSERT_EQUAL(m.u.write_req.raddr, 0x7f0000001000ull);

  /* The hot-path helper and the generic builder agree byte for byte. */
  wire_begin(&w, b, sizeof(b), WIRE_WRITE_REQ);
  wire_put_u64(&w, 0xfedcba9876543210ull);
  wire_put_u64(&w, 0x7f0000001000ull);
  CU_ASSERT_EQUAL_FATAL(wire_end(&w, 65536), len);
  CU_ASSERT_EQUAL(memcmp(a, b, len), 0);

  len = wire_put_write_req(a, 1, 2, WIRE_MAX_PAYLOAD);
  CU_ASSERT_EQUAL(parse_frame(a, len, &m), WIRE_OK);
}

static void test_rt_read_req(void) {
  uint8_t buf[WIRE_SMALL_FRAME];
  struct wire_msg m;
  static const uint32_t lens[] = {1, 4096, WIRE_MAX_PAYLOAD};

  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    size_t len = wire_put_read_req(buf, 42 + i, 0xabcdef000ull, lens[i]);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 20);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.hdr.payload_len, 0);
    CU_ASSERT_EQUAL(m.u.read_req.seq, 42 + i);
    CU_ASSERT_EQUAL(m.u.read_req.raddr, 0xabcdef000ull);
    CU_ASSERT_EQUAL(m.u.read_req.len, lens[i]);
  }
}

static void test_rt_acks(void) {
  uint8_t buf[WIRE_SMALL_FRAME];
  struct wire_msg m;
  static const struct {
    enum wire_type type;
    uint32_t status, payload;
  } cases[] = {
      {WIRE_WRITE_ACK, 0, 0},     {WIRE_WRITE_ACK, 503900, 0},           {WIRE_READ_RESP, 0, 0},
      {WIRE_READ_RESP, 0, 1},     {WIRE_READ_RESP, 0, WIRE_MAX_PAYLOAD}, {WIRE_READ_RESP, 103900, 0},
      {WIRE_NOTIFY_ACK, 0, 0},    {WIRE_NOTIFY_ACK, 0xffffffffu, 0},     {WIRE_SYNC_ACK, 0, 0},
      {WIRE_SYNC_ACK, 503900, 0},
  };

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint64_t seq = 0x8000000000000000ull | i;
    size_t len = wire_put_ack(buf, cases[i].type, seq, cases[i].status, cases[i].payload);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 12);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.hdr.type, cases[i].type);
    CU_ASSERT_EQUAL(m.hdr.payload_len, cases[i].payload);
    CU_ASSERT_EQUAL(m.u.ack.seq, seq);
    CU_ASSERT_EQUAL(m.u.ack.status, cases[i].status);
  }
}

static void test_rt_sync(void) {
  uint8_t buf[WIRE_SMALL_FRAME];
  struct wire_msg m;
  size_t len = wire_put_sync(buf, 0x0102030405060708ull);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 8);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.hdr.type, WIRE_SYNC);
  CU_ASSERT_EQUAL(m.hdr.payload_len, 0);
  CU_ASSERT_EQUAL(m.u.ack.seq, 0x0102030405060708ull);
  CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN], 0x01); /* big-endian on the wire */
  CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 7], 0x08);
}

static void test_rt_qp(void) {
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_QP_INFO_LEN], gid[16];
  struct wire_msg m;
  struct wire_wr w;
  for (int i = 0; i < 16; i++) gid[i] = (uint8_t)(0xf0 + i);
  for (int ack = 0; ack < 2; ack++) {
    wire_begin(&w, buf, sizeof(buf), ack ? WIRE_RDMA_CONNECT_ACK : WIRE_RDMA_CONNECT);
    if (ack) wire_put_u32(&w, 1);
    wire_put_qp_info(&w, 0x123456, 0xabcdef, gid, 3);
    size_t len = wire_end(&w, 0);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + (ack ? 4u : 0u) + WIRE_QP_INFO_LEN);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.qp.status, ack ? 1u : 0u);
    CU_ASSERT_EQUAL(m.u.qp.qpn, 0x123456);
    CU_ASSERT_EQUAL(m.u.qp.psn, 0xabcdef);
    CU_ASSERT_EQUAL(memcmp(m.u.qp.gid, gid, 16), 0);
    CU_ASSERT_EQUAL(m.u.qp.mtu, 3);
    /* a QP number over 24 bits, or an MTU code outside 1..5, is refused */
    buf[len - 1] = 6;
    CU_ASSERT_EQUAL(parse_frame(buf, len, &m), WIRE_EBODY);
    buf[len - 1] = 3;
    buf[WIRE_HDR_LEN + (ack ? 4 : 0)] = 1;
    CU_ASSERT_EQUAL(parse_frame(buf, len, &m), WIRE_EBODY);
  }
}

/* SHM_HELLO and SHM_HELLO_ACK: layout 1 (what an older peer sends) with every
 * field, checked byte by byte. */
static void test_rt_shm(void) {
  uint8_t buf[WIRE_HDR_LEN + 54], boot[16], nonce[16];
  struct wire_msg m;
  struct wire_wr w;
  for (int i = 0; i < 16; i++) boot[i] = (uint8_t)(0xb0 + i), nonce[i] = (uint8_t)(0x50 + i);
  for (int ack = 0; ack < 2; ack++) {
    wire_begin(&w, buf, sizeof(buf), ack ? WIRE_SHM_HELLO_ACK : WIRE_SHM_HELLO);
    if (ack) wire_put_u32(&w, WIRE_HELLO_REFUSED);
    wire_put_shm_id(&w, 1, boot, 0x01020304, 0x0a0b0c0d);
    if (ack) {
      wire_put_u64(&w, 0x00007f1122334455ull);
      wire_put_bytes(&w, nonce, 16);
    }
    size_t len = wire_end(&w, 0);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + (ack ? 54u : 26u));
    const uint8_t *b = buf + WIRE_HDR_LEN + (ack ? 4 : 0);
    CU_ASSERT(b[0] == 0 && b[1] == 1); /* layout 1, big-endian */
    CU_ASSERT(b[18] == 1 && b[21] == 4 && b[22] == 0x0a && b[25] == 0x0d);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.shm.status, ack ? (uint32_t)WIRE_HELLO_REFUSED : 0u);
    CU_ASSERT_EQUAL(m.u.shm.layout, 1);
    CU_ASSERT(inside(m.u.shm.boot_id, 16, buf + WIRE_HDR_LEN, len - WIRE_HDR_LEN));
    CU_ASSERT_EQUAL(memcmp(m.u.shm.boot_id, boot, 16), 0);
    CU_ASSERT_EQUAL(m.u.shm.pid, 0x01020304u);
    CU_ASSERT_EQUAL(m.u.shm.uid, 0x0a0b0c0du);
    CU_ASSERT_EQUAL(m.u.shm.ext_len, 0);
    if (ack) {
      CU_ASSERT_EQUAL(m.u.shm.probe_addr, 0x00007f1122334455ull);
      CU_ASSERT_EQUAL(memcmp(m.u.shm.nonce, nonce, 16), 0);
    } else {
      CU_ASSERT_PTR_NULL(m.u.shm.nonce);
    }
  }
}

/* Layout 2: SHM_HELLO's flags and SHM_HELLO_ACK's socket name, exactly; a name with
 * a space or longer than WIRE_SHM_SOCK_MAX, or missing bytes, is refused. */
static void test_rt_shm_layout2(void) {
  uint8_t buf[WIRE_HDR_LEN + 54 + 2 + 128], boot[16] = {0}, nonce[16] = {0};
  struct wire_msg m;
  struct wire_wr w;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, boot, 7, 8);
  wire_put_u32(&w, WIRE_SHM_F_MAP);
  size_t len = wire_end(&w, 0);
  CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 30u);
  CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.shm.layout, 2);
  CU_ASSERT_EQUAL(m.u.shm.flags, WIRE_SHM_F_MAP);
  /* layout 2 without its flags, or with a byte more: refused */
  CU_ASSERT_EQUAL(decode_body(WIRE_SHM_HELLO, buf + WIRE_HDR_LEN, 29, 0, &m), WIRE_EBODY);
  for (size_t name_len = 0; name_len <= WIRE_SHM_SOCK_MAX + 1; name_len += WIRE_SHM_SOCK_MAX / 2 + 1) {
    char name[WIRE_SHM_SOCK_MAX + 2];
    memset(name, 'n', sizeof(name));
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
    wire_put_u32(&w, WIRE_HELLO_OK);
    wire_put_shm_id(&w, WIRE_SHM_LAYOUT, boot, 7, 8);
    wire_put_u64(&w, 0x1000);
    wire_put_bytes(&w, nonce, 16);
    wire_put_u16(&w, (uint16_t)name_len);
    wire_put_bytes(&w, name, name_len);
    len = wire_end(&w, 0);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 56u + name_len);
    if (name_len > WIRE_SHM_SOCK_MAX) {
      CU_ASSERT_EQUAL(parse_frame(buf, len, &m), WIRE_EBODY);
      continue;
    }
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.shm.sock_len, name_len);
    CU_ASSERT(m.u.shm.sock == buf + WIRE_HDR_LEN + 56);
    if (name_len > 0) {
      /* a name longer than the bytes that follow: refused without reading past the body
       * (the fuzzer found such a read; the exact-size copy lets ASan see one) */
      uint8_t *cut = malloc(56 + name_len - 1);
      CU_ASSERT_PTR_NOT_NULL_FATAL(cut);
      memcpy(cut, buf + WIRE_HDR_LEN, 56 + name_len - 1);
      CU_ASSERT_EQUAL(decode_body(WIRE_SHM_HELLO_ACK, cut, (uint32_t)(56 + name_len - 1), 0, &m), WIRE_EBODY);
      free(cut);
      buf[len - 1] = ' '; /* names are printable, without spaces */
      CU_ASSERT_EQUAL(parse_frame(buf, len, &m), WIRE_EBODY);
    }
  }
}

/* SHM_MAP, SHM_UNMAP(_ACK), SHM_MAP_HELLO, SHM_MAP_ACK: fields by value; an empty or
 * wrapping region, a mapping shorter than its region, unknown flags or status: refused. */
static void test_rt_shm_map(void) {
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_SHM_REASON_MAX];
  struct wire_msg m;
  struct wire_wr w;
  static const struct {
    uint64_t addr, len, map_len;
    enum wire_err want;
  } cases[] = {{0x7f0000000000ull, 4096, 8192, WIRE_OK},
               {0x1000, 4096, 4096, WIRE_OK},
               {0x1000, 0, 4096, WIRE_EBODY},
               {UINT64_MAX - 10, 4096, 4096, WIRE_EBODY},
               {0x1000, 8192, 4096, WIRE_EBODY}};
  for (int t = 0; t < 3; t++) {
    enum wire_type type = t == 0 ? WIRE_SHM_MAP : t == 1 ? WIRE_SHM_UNMAP : WIRE_SHM_UNMAP_ACK;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
      if (type != WIRE_SHM_MAP && cases[i].map_len != cases[i].len && cases[i].map_len != 4096) continue;
      wire_begin(&w, buf, sizeof(buf), type);
      wire_put_u64(&w, cases[i].addr);
      wire_put_u64(&w, cases[i].len);
      if (type == WIRE_SHM_MAP) wire_put_u64(&w, cases[i].map_len);
      size_t len = wire_end(&w, 0);
      enum wire_err want = cases[i].want;
      if (type != WIRE_SHM_MAP && cases[i].len > 0 && cases[i].addr < UINT64_MAX - cases[i].len)
        want = WIRE_OK;
      CU_ASSERT_EQUAL(parse_frame(buf, len, &m), want);
      if (want != WIRE_OK) continue;
      CU_ASSERT_EQUAL(m.u.map.addr, cases[i].addr);
      CU_ASSERT_EQUAL(m.u.map.len, cases[i].len);
      CU_ASSERT_EQUAL(m.u.map.map_len, type == WIRE_SHM_MAP ? cases[i].map_len : cases[i].len);
    }
  }
  for (uint32_t flags = 0; flags < 2; flags++) {
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_HELLO);
    wire_put_u32(&w, flags);
    CU_ASSERT_EQUAL(parse_frame(buf, wire_end(&w, 0), &m), flags == 0 ? WIRE_OK : WIRE_EBODY);
  }
  for (uint32_t status = 0; status < 4; status++) {
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
    wire_put_u32(&w, status);
    wire_put_bytes(&w, "uid 65534", 9);
    size_t len = wire_end(&w, 0);
    bool ok = status == WIRE_HELLO_OK || status == WIRE_HELLO_REFUSED;
    CU_ASSERT_EQUAL(parse_frame(buf, len, &m), ok ? WIRE_OK : WIRE_EBODY);
    if (ok) CU_ASSERT(m.u.map.text_len == 9 && memcmp(m.u.map.text, "uid 65534", 9) == 0);
  }
}

/* SHM_DEV_MAP: fields by value, the handle pointing into the body; an empty or wrapping
 * region, or one past its allocation (offset, length), refused. */
static void test_rt_shm_dev_map(void) {
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_DEV_MAP_LEN], blob[WIRE_SHM_IPC_BLOB];
  struct wire_msg m;
  struct wire_wr w;
  static const struct {
    uint64_t addr, len, alloc_len, offset;
    enum wire_err want;
  } cases[] = {{0x7f0000400000ull, 4096, 65536, 8192, WIRE_OK},
               {0x1000, 65536, 65536, 0, WIRE_OK},
               {0x1000, 0, 65536, 0, WIRE_EBODY},
               {UINT64_MAX - 10, 4096, 65536, 0, WIRE_EBODY},
               {0x1000, 4096, 65536, 65000, WIRE_EBODY},
               {0x1000, 4096, 4096, UINT64_MAX, WIRE_EBODY},
               {0x1000, 65537, 65536, 0, WIRE_EBODY}};
  for (size_t k = 0; k < sizeof(blob); k++) blob[k] = (uint8_t)(k * 7 + 1);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_DEV_MAP);
    wire_put_u64(&w, cases[i].addr);
    wire_put_u64(&w, cases[i].len);
    wire_put_u64(&w, cases[i].alloc_len);
    wire_put_u64(&w, cases[i].offset);
    wire_put_bytes(&w, blob, sizeof(blob));
    size_t len = wire_end(&w, 0);
    CU_ASSERT_EQUAL_FATAL(len, sizeof(buf));
    CU_ASSERT_EQUAL(parse_frame(buf, len, &m), cases[i].want);
    if (cases[i].want != WIRE_OK) continue;
    CU_ASSERT_EQUAL(m.u.map.addr, cases[i].addr);
    CU_ASSERT_EQUAL(m.u.map.len, cases[i].len);
    CU_ASSERT_EQUAL(m.u.map.alloc_len, cases[i].alloc_len);
    CU_ASSERT_EQUAL(m.u.map.offset, cases[i].offset);
    CU_ASSERT(memcmp(m.u.map.blob, blob, sizeof(blob)) == 0);
  }
}

/* CALL and CALL_RESP: fixed fields, then the bytes, pointing into the body; empty
 * requests and the largest answer decode too. */
static void test_rt_call(void) {
  static uint8_t buf[WIRE_CALL_RESP_AT + WIRE_MAX_CALL];
  const size_t lens[] = {0, 1, 33, WIRE_MAX_CALL};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    struct wire_hdr h;
    struct wire_msg m;
    memset(buf + WIRE_CALL_REQ_AT, 0x5a, lens[i]);
    size_t len = wire_put_call(buf, WIRE_CALL, 0x0102030405060708ull, 0xbeef, (uint32_t)lens[i]);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_CALL_REQ_AT + lens[i]);
    CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 8], 0xbe);
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf, &h), WIRE_OK);
    CU_ASSERT_EQUAL_FATAL(wire_decode(&h, buf + WIRE_HDR_LEN, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.call.seq, 0x0102030405060708ull);
    CU_ASSERT_EQUAL(m.u.call.service, 0xbeef);
    CU_ASSERT_EQUAL(m.u.call.len, lens[i]);
    CU_ASSERT_PTR_EQUAL(m.u.call.data, buf + WIRE_CALL_REQ_AT);
    memset(buf + WIRE_CALL_RESP_AT, 0xa5, lens[i]);
    len = wire_put_call(buf, WIRE_CALL_RESP, 9, 103900u, (uint32_t)lens[i]);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_CALL_RESP_AT + lens[i]);
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf, &h), WIRE_OK);
    CU_ASSERT_EQUAL_FATAL(wire_decode(&h, buf + WIRE_HDR_LEN, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.call.seq, 9);
    CU_ASSERT_EQUAL(m.u.call.status, 103900u);
    CU_ASSERT_EQUAL(m.u.call.len, lens[i]);
    CU_ASSERT_PTR_EQUAL(m.u.call.data, buf + WIRE_CALL_RESP_AT);
    CU_ASSERT(lens[i] == 0 || (m.u.call.data[0] == 0xa5 && m.u.call.data[lens[i] - 1] == 0xa5));
  }
  /* One byte past the cap, and a payload, are refused by the header. */
  struct wire_hdr h;
  wire_put_call(buf, WIRE_CALL, 1, 1, WIRE_MAX_CALL);
  buf[11] = (uint8_t)(buf[11] + 1); /* body_len + 1 */
  CU_ASSERT_EQUAL(wire_parse_hdr(buf, &h), WIRE_ELEN);
  wire_put_call(buf, WIRE_CALL_RESP, 1, 0, 4);
  buf[15] = 1; /* payload_len 1 */
  CU_ASSERT_EQUAL(wire_parse_hdr(buf, &h), WIRE_ELEN);
}

/* CALL_TAG: seq, tag (u32), service, then the bytes; any tag is well formed (what
 * it names is the link's business). */
static void test_rt_call_tag(void) {
  static uint8_t buf[WIRE_CALL_TAG_AT + WIRE_MAX_CALL];
  const size_t lens[] = {0, 1, 33, WIRE_MAX_CALL};
  const uint32_t tags[] = {0, 1, 0x89abcdefu, UINT32_MAX};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    struct wire_hdr h;
    struct wire_msg m;
    memset(buf + WIRE_CALL_TAG_AT, 0x5a, lens[i]);
    size_t len = wire_put_call_tag(buf, 0x0102030405060708ull, tags[i], 0xcafe, (uint32_t)lens[i]);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_CALL_TAG_AT + lens[i]);
    CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 8], (uint8_t)(tags[i] >> 24)); /* tag, big-endian */
    CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 12], 0xca);                    /* service, big-endian */
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf, &h), WIRE_OK);
    CU_ASSERT_EQUAL(h.type, WIRE_CALL_TAG);
    CU_ASSERT_EQUAL_FATAL(wire_decode(&h, buf + WIRE_HDR_LEN, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.call.seq, 0x0102030405060708ull);
    CU_ASSERT_EQUAL(m.u.call.after, tags[i]);
    CU_ASSERT_EQUAL(m.u.call.service, 0xcafe);
    CU_ASSERT_EQUAL(m.u.call.len, lens[i]);
    CU_ASSERT_PTR_EQUAL(m.u.call.data, buf + WIRE_CALL_TAG_AT);
    CU_ASSERT(lens[i] == 0 || (m.u.call.data[0] == 0x5a && m.u.call.data[lens[i] - 1] == 0x5a));
  }
  /* Shorter than its fixed part, or longer than its cap: refused by the header. */
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_TAG, 13, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_TAG, 14 + WIRE_MAX_CALL + 1, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_CALL_TAG, 14, 1), WIRE_ELEN);
}

/* CALL_AFTER: seq, after, service, then the bytes; after must come before seq (a CALL
 * can follow only WRITEs sent before it). */
static void test_rt_call_after(void) {
  static uint8_t buf[WIRE_CALL_AFTER_AT + WIRE_MAX_CALL];
  const size_t lens[] = {0, 1, 33, WIRE_MAX_CALL};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    struct wire_hdr h;
    struct wire_msg m;
    memset(buf + WIRE_CALL_AFTER_AT, 0x3c, lens[i]);
    size_t len =
        wire_put_call_after(buf, 0x0102030405060708ull, 0x0102030405060700ull, 0xcafe, (uint32_t)lens[i]);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_CALL_AFTER_AT + lens[i]);
    CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 8], 0x01);  /* after, big-endian */
    CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + 16], 0xca); /* service, big-endian */
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf, &h), WIRE_OK);
    CU_ASSERT_EQUAL_FATAL(wire_decode(&h, buf + WIRE_HDR_LEN, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.call.seq, 0x0102030405060708ull);
    CU_ASSERT_EQUAL(m.u.call.after, 0x0102030405060700ull);
    CU_ASSERT_EQUAL(m.u.call.service, 0xcafe);
    CU_ASSERT_EQUAL(m.u.call.len, lens[i]);
    CU_ASSERT_PTR_EQUAL(m.u.call.data, buf + WIRE_CALL_AFTER_AT);
    CU_ASSERT(lens[i] == 0 || (m.u.call.data[0] == 0x3c && m.u.call.data[lens[i] - 1] == 0x3c));
  }
  /* after equal to or past its own seq: refused. */
  const uint64_t bad[][2] = {{5, 5}, {5, 6}, {1, ~0ull}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    struct wire_hdr h;
    struct wire_msg m;
    wire_put_call_after(buf, bad[i][0], bad[i][1], 1, 4);
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf, &h), WIRE_OK);
    CU_ASSERT_EQUAL(wire_decode(&h, buf + WIRE_HDR_LEN, &m), WIRE_EBODY);
  }
}

static size_t build_notify(uint8_t *buf, size_t cap, uint64_t seq, const char *name, size_t nl,
                           const char *msg, size_t ml) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, WIRE_NOTIFY);
  wire_put_u64(&w, seq);
  wire_put_u16(&w, (uint16_t)nl);
  wire_put_u16(&w, (uint16_t)ml);
  wire_put_bytes(&w, name, nl);
  wire_put_bytes(&w, msg, ml);
  return wire_end(&w, 0);
}

static void test_rt_notify(void) {
  static uint8_t buf[WIRE_HDR_LEN + 12 + 2 * WIRE_MAX_NOTIFY];
  static char name[WIRE_MAX_NOTIFY], msg[WIRE_MAX_NOTIFY];
  struct wire_msg m;
  static const size_t sizes[][2] = {{0, 0}, {5, 0}, {0, 9}, {3, 11}, {WIRE_MAX_NOTIFY, WIRE_MAX_NOTIFY}};

  for (size_t i = 0; i < sizeof(name); i++) {
    name[i] = (char)('a' + i % 26);
    msg[i] = (char)('A' + i % 26);
  }
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t nl = sizes[i][0], ml = sizes[i][1];
    size_t len = build_notify(buf, sizeof(buf), 77 + i, name, nl, msg, ml);
    CU_ASSERT_EQUAL_FATAL(len, WIRE_HDR_LEN + 12 + nl + ml);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, len, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.notify.seq, 77 + i);
    CU_ASSERT_EQUAL_FATAL(m.u.notify.name_len, nl);
    CU_ASSERT_EQUAL_FATAL(m.u.notify.msg_len, ml);
    CU_ASSERT_PTR_EQUAL(m.u.notify.name, buf + WIRE_HDR_LEN + 12);
    CU_ASSERT_PTR_EQUAL(m.u.notify.msg, buf + WIRE_HDR_LEN + 12 + nl);
    CU_ASSERT_EQUAL(memcmp(m.u.notify.name, name, nl), 0);
    CU_ASSERT_EQUAL(memcmp(m.u.notify.msg, msg, ml), 0);
  }
}

/* Range i of the STAGE round trips: count 1 is one 16 MiB range ending at the top of
 * the address space, count 4096 fills 16 MiB exactly, others are small and uneven. */
static void stage_seg_of(uint32_t count, uint32_t i, uint64_t *addr, uint32_t *len) {
  *len = count == 1 ? MIB(16) : count == 4096 ? 4096 : 1 + i * 1000;
  *addr = i == 0 ? UINT64_MAX - *len : 0x00007f0000000000ull + (uint64_t)i * 0x100000 + i;
}

/* STAGE_WRITE / STAGE_READ: the builders give exactly the bytes written out by hand,
 * and wire_decode gives back every range. */
static void test_rt_stage(void) {
  static const uint32_t counts[] = {1, 2, 7, 100, 4096};
  static const enum wire_type types[] = {WIRE_STAGE_WRITE, WIRE_STAGE_READ};
  const size_t cap = WIRE_HDR_LEN + 12 + 12 * 4096 + 1; /* + 1: checked untouched */
  uint8_t *buf = malloc(cap), *want = malloc(cap);
  struct wire_msg m;
  CU_ASSERT_FATAL(buf && want);

  for (size_t t = 0; t < 2; t++) {
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      uint32_t count = counts[c];
      uint64_t seq = 0x8877665544332211ull + c, total = 0, addr;
      uint32_t len, body = 12 + 12 * count;

      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count, i, &addr, &len);
        total += len;
      }
      CU_ASSERT_FATAL(total <= MIB(16));
      uint32_t payload = types[t] == WIRE_STAGE_WRITE ? (uint32_t)total : 0;

      memset(buf, 0xee, cap);
      CU_ASSERT_EQUAL_FATAL(wire_put_stage(buf, types[t], seq, count, payload), WIRE_HDR_LEN + body);
      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count, i, &addr, &len);
        wire_put_stage_seg(buf, false, i, addr, len);
      }
      raw_hdr(want, types[t], body, payload);
      put64(want + WIRE_HDR_LEN, seq);
      put32(want + WIRE_HDR_LEN + 8, count);
      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count, i, &addr, &len);
        put64(want + WIRE_HDR_LEN + 12 + 12 * i, addr);
        put32(want + WIRE_HDR_LEN + 12 + 12 * i + 8, len);
      }
      CU_ASSERT_EQUAL(memcmp(buf, want, WIRE_HDR_LEN + body), 0);
      CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + body], 0xee); /* nothing written past the frame */

      CU_ASSERT_EQUAL_FATAL(parse_frame(buf, WIRE_HDR_LEN + body, &m), WIRE_OK);
      CU_ASSERT_EQUAL(m.hdr.type, types[t]);
      CU_ASSERT_EQUAL(m.hdr.payload_len, payload);
      CU_ASSERT_EQUAL(m.u.stage.seq, seq);
      CU_ASSERT_EQUAL_FATAL(m.u.stage.count, count);
      CU_ASSERT_EQUAL(m.u.stage.total, total);
      CU_ASSERT_PTR_EQUAL(m.u.stage.segs, buf + WIRE_HDR_LEN + 12);
      uint32_t bad = 0;
      for (uint32_t i = 0; i < count; i++) {
        uint64_t a, wa;
        uint32_t l, wl;
        stage_seg_of(count, i, &wa, &wl);
        wire_stage_seg(&m, i, &a, &l);
        bad += a != wa || l != wl;
      }
      CU_ASSERT_EQUAL(bad, 0);
    }
  }

  /* One range more than WIRE_MAX_STAGE_SEGS: the body is too long for the header. */
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_WRITE, 12 + 12 * 4097, 4097), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, 12 + 12 * 4097, 0), WIRE_ELEN);
  free(want);
  free(buf);
}

/* STAGE_PULL / STAGE_PUSH: one small frame against its bytes written out in full. */
static void test_rt_stage_rdma_bytes(void) {
  static const uint8_t want[] = {
      0x48, 0x58, 0x49, 0x4c,                         /* magic "HXIL" */
      0x01,                                           /* version */
      0x13,                                           /* STAGE_PULL */
      0x00, 0x00,                                     /* flags */
      0x00, 0x00, 0x00, 0x30,                         /* body_len 48 */
      0x00, 0x00, 0x00, 0x00,                         /* payload_len: never any */
      0x00, 0x00, 0x00, 0x00,                         /* reserved */
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* seq */
      0x00, 0x00, 0x7f, 0x11, 0x22, 0x33, 0x40, 0x00, /* buf */
      0xa1, 0xb2, 0xc3, 0xd4,                         /* rkey */
      0x00, 0x00, 0x00, 0x02,                         /* count */
      0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, /* range 0: addr */
      0x00, 0x00, 0x01, 0x00,                         /*          len 256 */
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0, 0x00, /* range 1: addr */
      0x00, 0x00, 0x0f, 0xff,                         /*          len 4095, ending at the top */
  };
  static const enum wire_type types[] = {WIRE_STAGE_PULL, WIRE_STAGE_PUSH};
  uint8_t buf[sizeof(want) + 1], exp[sizeof(want)];
  struct wire_msg m;
  uint64_t a;
  uint32_t l;

  for (size_t t = 0; t < 2; t++) {
    memcpy(exp, want, sizeof(want));
    exp[5] = (uint8_t)types[t];
    memset(buf, 0xee, sizeof(buf));
    CU_ASSERT_EQUAL_FATAL(
        wire_put_stage_rdma(buf, types[t], 0x0102030405060708ull, 0x00007f1122334000ull, 0xa1b2c3d4u, 2),
        sizeof(want));
    wire_put_stage_seg(buf, true, 0, 0x00007f0000001000ull, 256);
    wire_put_stage_seg(buf, true, 1, 0xfffffffffffff000ull, 4095);
    CU_ASSERT_EQUAL(memcmp(buf, exp, sizeof(exp)), 0);
    CU_ASSERT_EQUAL(buf[sizeof(want)], 0xee); /* nothing written past the frame */

    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, sizeof(want), &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.hdr.type, types[t]);
    CU_ASSERT_EQUAL(m.hdr.payload_len, 0);
    CU_ASSERT_EQUAL(m.u.stage.seq, 0x0102030405060708ull);
    CU_ASSERT_EQUAL(m.u.stage.buf, 0x00007f1122334000ull);
    CU_ASSERT_EQUAL(m.u.stage.rkey, 0xa1b2c3d4u);
    CU_ASSERT_EQUAL_FATAL(m.u.stage.count, 2);
    CU_ASSERT_EQUAL(m.u.stage.total, 256 + 4095);
    CU_ASSERT_PTR_EQUAL(m.u.stage.segs, buf + WIRE_HDR_LEN + 24);
    wire_stage_seg(&m, 0, &a, &l);
    CU_ASSERT(a == 0x00007f0000001000ull && l == 256);
    wire_stage_seg(&m, 1, &a, &l);
    CU_ASSERT(a == 0xfffffffffffff000ull && l == 4095);
  }
}

/* STAGE_PULL / STAGE_PUSH at counts from 1 to 4096: the builders give exactly the bytes
 * written out by hand, and wire_decode gives back every field. */
static void test_rt_stage_rdma(void) {
  static const uint32_t counts[] = {1, 2, 7, 100, 4095, 4096};
  static const enum wire_type types[] = {WIRE_STAGE_PULL, WIRE_STAGE_PUSH};
  const size_t cap = WIRE_HDR_LEN + 24 + 12 * 4096 + 1; /* + 1: checked untouched */
  uint8_t *buf = malloc(cap), *want = malloc(cap);
  struct wire_msg m;
  CU_ASSERT_FATAL(buf && want);

  for (size_t t = 0; t < 2; t++) {
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      uint32_t count = counts[c], rkey = 0x80000000u | (uint32_t)(t << 8 | c);
      uint64_t seq = 0x1122334455667788ull + c, total = 0, addr;
      uint32_t len, body = 24 + 12 * count;

      /* 4095 ranges of 1 + i * 1000 bytes would be far over 16 MiB: 4096 bytes each. */
      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count == 4095 ? 4096 : count, i, &addr, &len);
        total += len;
      }
      CU_ASSERT_FATAL(total <= MIB(16));
      /* count 1 (16 MiB) puts the buffer right below the top of the address space. */
      uint64_t sbuf = count == 1 ? UINT64_MAX - total : 0x00007f8000000000ull + c * 0x1000000;

      memset(buf, 0xee, cap);
      CU_ASSERT_EQUAL_FATAL(wire_put_stage_rdma(buf, types[t], seq, sbuf, rkey, count), WIRE_HDR_LEN + body);
      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count == 4095 ? 4096 : count, i, &addr, &len);
        wire_put_stage_seg(buf, true, i, addr, len);
      }
      raw_hdr(want, types[t], body, 0);
      put64(want + WIRE_HDR_LEN, seq);
      put64(want + WIRE_HDR_LEN + 8, sbuf);
      put32(want + WIRE_HDR_LEN + 16, rkey);
      put32(want + WIRE_HDR_LEN + 20, count);
      for (uint32_t i = 0; i < count; i++) {
        stage_seg_of(count == 4095 ? 4096 : count, i, &addr, &len);
        put64(want + WIRE_HDR_LEN + 24 + 12 * i, addr);
        put32(want + WIRE_HDR_LEN + 24 + 12 * i + 8, len);
      }
      CU_ASSERT_EQUAL(memcmp(buf, want, WIRE_HDR_LEN + body), 0);
      CU_ASSERT_EQUAL(buf[WIRE_HDR_LEN + body], 0xee); /* nothing written past the frame */

      CU_ASSERT_EQUAL_FATAL(parse_frame(buf, WIRE_HDR_LEN + body, &m), WIRE_OK);
      CU_ASSERT_EQUAL(m.hdr.type, types[t]);
      CU_ASSERT_EQUAL(m.hdr.payload_len, 0);
      CU_ASSERT_EQUAL(m.u.stage.seq, seq);
      CU_ASSERT_EQUAL(m.u.stage.buf, sbuf);
      CU_ASSERT_EQUAL(m.u.stage.rkey, rkey);
      CU_ASSERT_EQUAL_FATAL(m.u.stage.count, count);
      CU_ASSERT_EQUAL(m.u.stage.total, total);
      CU_ASSERT_PTR_EQUAL(m.u.stage.segs, buf + WIRE_HDR_LEN + 24);
      uint32_t bad = 0;
      for (uint32_t i = 0; i < count; i++) {
        uint64_t a, wa;
        uint32_t l, wl;
        stage_seg_of(count == 4095 ? 4096 : count, i, &wa, &wl);
        wire_stage_seg(&m, i, &a, &l);
        bad += a != wa || l != wl;
      }
      CU_ASSERT_EQUAL(bad, 0);
    }
  }

  /* One range more than WIRE_MAX_STAGE_SEGS: the body is too long for the header. */
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PULL, 24 + 12 * 4097, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PUSH, 24 + 12 * 4097, 0), WIRE_ELEN);
  free(want);
  free(buf);
}

/* A stream of frames back to back parses frame by frame. */
static void test_rt_stream(void) {
  uint8_t buf[256];
  size_t off = 0;
  struct wire_wr w;
  struct wire_msg m;
  struct wire_hdr h;
  static const uint8_t types[] = {WIRE_HELLO, WIRE_READ_REQ, WIRE_WRITE_ACK, WIRE_NOTIFY};

  wire_begin(&w, buf, sizeof(buf), WIRE_HELLO);
  wire_put_u32(&w, 0);
  wire_put_u16(&w, 1);
  wire_put_bytes(&w, "x", 1);
  off += wire_end(&w, 0);
  off += wire_put_read_req(buf + off, 1, 0x1000, 8);
  off += wire_put_ack(buf + off, WIRE_WRITE_ACK, 2, 0, 0);
  off += build_notify(buf + off, sizeof(buf) - off, 3, "n", 1, "m", 1);

  size_t at = 0;
  for (size_t i = 0; i < sizeof(types); i++) {
    CU_ASSERT_FATAL(off - at >= WIRE_HDR_LEN);
    CU_ASSERT_EQUAL_FATAL(wire_parse_hdr(buf + at, &h), WIRE_OK);
    CU_ASSERT_EQUAL(h.type, types[i]);
    CU_ASSERT_FATAL(off - at - WIRE_HDR_LEN >= h.body_len);
    CU_ASSERT_EQUAL(wire_decode(&h, buf + at + WIRE_HDR_LEN, &m), WIRE_OK);
    at += WIRE_HDR_LEN + h.body_len;
  }
  CU_ASSERT_EQUAL(at, off);
}

/* ---- malformed bodies ---- */

static void test_bad_hello(void) {
  uint8_t body[6 + 10];
  struct wire_msg m;

  memset(body, 'z', sizeof(body));
  put32(body, 0);
  put16(body + 4, 10);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, 16, 0, &m), WIRE_OK);
  put16(body + 4, 11); /* claims more than the body has */
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, 16, 0, &m), WIRE_EBODY);
  put16(body + 4, 9); /* one byte of garbage after the name */
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, 16, 0, &m), WIRE_EBODY);
  put16(body + 4, 0xffff);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, 16, 0, &m), WIRE_EBODY);
  put16(body + 4, 10);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, 6, 0, &m), WIRE_EBODY);
}

/* HELLO's extensions: entries of u16 type, u16 length, bytes, after its fields (keyed
 * or not), skipped whatever their type; entries that do not fill the rest exactly, or
 * more than WIRE_HELLO_EXT_MAX bytes of them, are refused. */
static void test_hello_ext(void) {
  uint8_t buf[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME + WIRE_AUTH_BLOCK_MAX + WIRE_HELLO_EXT_MAX + 64];
  uint8_t nonce[WIRE_AUTH_NONCE], id[WIRE_AUTH_ID], big[WIRE_HELLO_EXT_MAX];
  static const uint8_t want[11] = {0xbe, 0xef, 0, 3, 'a', 'b', 'c', 0, 1, 0, 0};
  struct wire_msg m;
  memset(nonce, 1, sizeof(nonce));
  memset(id, 2, sizeof(id));
  memset(big, 3, sizeof(big));
  for (int keyed = 0; keyed < 2; keyed++) {
    size_t n =
        keyed ? wire_put_hello_auth(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "i", nonce, id, 1, "127.0.0.1:9")
              : wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "i");
    size_t fields = n - WIRE_HDR_LEN;
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, n, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.hello.ext_len, 0);
    CU_ASSERT_PTR_NULL(m.u.hello.ext);
    n = wire_hello_add_ext(buf, sizeof(buf), n, 0xbeef, "abc", 3);
    n = n ? wire_hello_add_ext(buf, sizeof(buf), n, 1, NULL, 0) : 0;
    CU_ASSERT_EQUAL_FATAL(n, WIRE_HDR_LEN + fields + 7 + 4);
    CU_ASSERT_EQUAL_FATAL(parse_frame(buf, n, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.hello.ext_len, 11);
    CU_ASSERT_PTR_EQUAL(m.u.hello.ext, buf + WIRE_HDR_LEN + fields);
    CU_ASSERT_EQUAL(memcmp(m.u.hello.ext, want, sizeof(want)), 0);
    CU_ASSERT_EQUAL(m.u.hello.name_len, 1);
    CU_ASSERT_EQUAL(m.u.hello.dialled_len, keyed ? 11 : 0);
    /* Room for 1,013 more bytes of extensions, not 1,014. */
    CU_ASSERT_EQUAL(wire_hello_add_ext(buf, sizeof(buf), n, 2, big, WIRE_HELLO_EXT_MAX - 11 - 4 + 1), 0);
    size_t full = wire_hello_add_ext(buf, sizeof(buf), n, 2, big, WIRE_HELLO_EXT_MAX - 11 - 4);
    CU_ASSERT_EQUAL_FATAL(full, n + WIRE_HELLO_EXT_MAX - 11);
    CU_ASSERT_EQUAL(parse_frame(buf, full, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.hello.ext_len, WIRE_HELLO_EXT_MAX);
    /* Each of these bodies the decoder refuses: an entry past the end, a stub. */
    uint8_t *body = buf + WIRE_HDR_LEN;
    put16(body + fields + 2, 4); /* one byte too many: the next entry is left 3 bytes */
    CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, (uint32_t)(n - WIRE_HDR_LEN), 0, &m), WIRE_EBODY);
    put16(body + fields + 2, 8);
    CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, (uint32_t)(n - WIRE_HDR_LEN), 0, &m), WIRE_EBODY);
    put16(body + fields + 2, 3);
    for (uint32_t stub = 1; stub < 4; stub++) /* fewer bytes than an entry's type and length */
      CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, (uint32_t)(n - WIRE_HDR_LEN - 4 + stub), 0, &m),
                      WIRE_EBODY);
    put16(body + fields + 2, WIRE_HELLO_EXT_MAX - 4 + 1); /* one entry of 1,025 bytes in all */
    CU_ASSERT_EQUAL(decode_body(WIRE_HELLO, body, (uint32_t)(fields + WIRE_HELLO_EXT_MAX + 1), 0, &m),
                    WIRE_EBODY);
  }
  /* Only a HELLO, whole, grows. */
  size_t n = wire_put_sync(buf, 1);
  CU_ASSERT_EQUAL(wire_hello_add_ext(buf, sizeof(buf), n, 1, NULL, 0), 0);
  n = wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, "i");
  CU_ASSERT_EQUAL(wire_hello_add_ext(buf, sizeof(buf), n - 1, 1, NULL, 0), 0);
  CU_ASSERT_EQUAL(wire_hello_add_ext(buf, n + 3, n, 1, NULL, 0), 0);
}

/* HELLO_ACK body: status, caps, name_len, name, count, then entries. */
static size_t raw_hello_ack(uint8_t *b, uint16_t nl, uint32_t count) {
  put32(b, 0);
  put32(b + 4, WIRE_CAP_TCP_DATA);
  put16(b + 8, nl);
  memset(b + 10, 'n', nl);
  put32(b + 10 + nl, count);
  return 14u + nl;
}
static size_t raw_entry(uint8_t *b, uint64_t addr, uint64_t len, uint16_t tl) {
  put64(b, addr);
  put64(b + 8, len);
  put32(b + 16, 0x5eed);
  put16(b + 20, tl);
  memset(b + 22, 'T', tl);
  return 22u + tl;
}

static void test_bad_hello_ack(void) {
  static uint8_t b[2048];
  struct wire_msg m;
  size_t n;

  /* count larger than the entries present */
  n = raw_hello_ack(b, 3, 3);
  n += raw_entry(b + n, 1, 2, 3);
  n += raw_entry(b + n, 3, 4, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  put32(b + 10 + 3, 2);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_OK);
  /* count smaller: the last entry becomes trailing bytes */
  put32(b + 10 + 3, 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  put32(b + 10 + 3, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  /* one trailing byte after complete entries */
  put32(b + 10 + 3, 2);
  b[n] = 0;
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n + 1, 0, &m), WIRE_EBODY);
  /* a truncated last entry */
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n - 1, 0, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n - 22, 0, &m), WIRE_EBODY);
  /* a huge count with no entries at all */
  n = raw_hello_ack(b, 0, 0xffffffffu);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  n = raw_hello_ack(b, 0, WIRE_MAX_MEM_ENTRIES + 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);

  /* tag_len over WIRE_MAX_TAG, even though the body holds every byte of it */
  n = raw_hello_ack(b, 0, 1);
  size_t at = n;
  n += raw_entry(b + n, 1, 2, WIRE_MAX_TAG);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_OK);
  n = raw_hello_ack(b, 0, 1);
  n += raw_entry(b + at, 1, 2, WIRE_MAX_TAG + 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  /* tag_len running past the body */
  n = raw_hello_ack(b, 0, 1);
  n += raw_entry(b + n, 1, 2, 10);
  put16(b + at + 20, 11);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  put16(b + at + 20, 0xffff);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);

  /* name_len over WIRE_MAX_NAME, or leaving no room for count */
  n = raw_hello_ack(b, WIRE_MAX_NAME, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_OK);
  n = raw_hello_ack(b, WIRE_MAX_NAME + 1, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  n = raw_hello_ack(b, 1, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, 14, 0, &m), WIRE_EBODY);
  n = raw_hello_ack(b, 4, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_HELLO_ACK, b, (uint32_t)n - 1, 0, &m), WIRE_EBODY);
}

static void test_bad_mem(void) {
  uint8_t b[22 + WIRE_MAX_TAG + 1];
  struct wire_msg m;

  size_t n = raw_entry(b, 1, 2, 5);
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_ADD, b, (uint32_t)n, 0, &m), WIRE_OK);
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_ADD, b, (uint32_t)n - 1, 0, &m), WIRE_EBODY);
  b[n] = 0;
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_ADD, b, (uint32_t)n + 1, 0, &m), WIRE_EBODY);
  /* The largest MEM_ADD body with a tag_len one over the limit. */
  n = raw_entry(b, 1, 2, WIRE_MAX_TAG);
  put16(b + 20, WIRE_MAX_TAG + 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_ADD, b, (uint32_t)n, 0, &m), WIRE_EBODY);
  /* MEM_DEL carries no tag. */
  n = raw_entry(b, 1, 2, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_DEL, b, (uint32_t)n, 0, &m), WIRE_OK);
  put16(b + 20, 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_MEM_DEL, b, (uint32_t)n, 0, &m), WIRE_EBODY);
}

static void test_bad_notify(void) {
  static uint8_t b[12 + 2 * WIRE_MAX_NOTIFY];
  struct wire_msg m;

  memset(b, 'x', sizeof(b));
  put64(b, 9);
  /* name or msg over 1024 although the body holds exactly that many bytes */
  put16(b + 8, WIRE_MAX_NOTIFY + 1);
  put16(b + 10, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 12 + WIRE_MAX_NOTIFY + 1, 0, &m), WIRE_EBODY);
  put16(b + 8, 0);
  put16(b + 10, WIRE_MAX_NOTIFY + 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 12 + WIRE_MAX_NOTIFY + 1, 0, &m), WIRE_EBODY);
  put16(b + 8, WIRE_MAX_NOTIFY + 1);
  put16(b + 10, WIRE_MAX_NOTIFY - 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, sizeof(b), 0, &m), WIRE_EBODY);
  put16(b + 8, 0xffff);
  put16(b + 10, 0xffff);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, sizeof(b), 0, &m), WIRE_EBODY);
  /* lengths not adding up to the body */
  put16(b + 8, 10);
  put16(b + 10, 10);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 32, 0, &m), WIRE_OK);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 31, 0, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 33, 0, &m), WIRE_EBODY);
}

/* A refused body must not leave pointers in the message that point outside it:
 * before the fix, NOTIFY set msg = body + 12 + name_len before checking name_len
 * against the body, so a 12-byte body claiming a 1024-byte name left msg 1024
 * bytes past the end (and computing it is undefined behaviour). */
static void test_bad_notify_pointers(void) {
  /* The body is the last 12 bytes of an allocation, so anything past it is foreign. */
  uint8_t *b = malloc(12);
  struct wire_msg m;
  CU_ASSERT_FATAL(b != NULL);

  put64(b, 1);
  put16(b + 8, WIRE_MAX_NOTIFY);
  put16(b + 10, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 12, 0, &m), WIRE_EBODY);
  CU_ASSERT(m.u.notify.name == NULL || inside(m.u.notify.name, 0, b, 12));
  CU_ASSERT(m.u.notify.msg == NULL || inside(m.u.notify.msg, 0, b, 12));
  put16(b + 8, 0xffff);
  put16(b + 10, 0xffff);
  CU_ASSERT_EQUAL(decode_body(WIRE_NOTIFY, b, 12, 0, &m), WIRE_EBODY);
  CU_ASSERT(m.u.notify.name == NULL || inside(m.u.notify.name, 0, b, 12));
  CU_ASSERT(m.u.notify.msg == NULL || inside(m.u.notify.msg, 0, b, 12));
  free(b);
}

static void test_bad_read_req(void) {
  uint8_t b[20];
  struct wire_msg m;

  put64(b, 1);
  put64(b + 8, 0x1000);
  put32(b + 16, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_REQ, b, 20, 0, &m), WIRE_EBODY);
  put32(b + 16, WIRE_MAX_PAYLOAD + 1);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_REQ, b, 20, 0, &m), WIRE_EBODY);
  put32(b + 16, 0xffffffffu);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_REQ, b, 20, 0, &m), WIRE_EBODY);
  put32(b + 16, WIRE_MAX_PAYLOAD);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_REQ, b, 20, 0, &m), WIRE_OK);
}

static void test_bad_read_resp(void) {
  uint8_t b[12];
  struct wire_msg m;

  put64(b, 5);
  put32(b + 8, 503900); /* a failure carries no data */
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_RESP, b, 12, 1, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_RESP, b, 12, WIRE_MAX_PAYLOAD, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_RESP, b, 12, 0, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.ack.status, 503900);
  put32(b + 8, 0);
  CU_ASSERT_EQUAL(decode_body(WIRE_READ_RESP, b, 12, 4096, &m), WIRE_OK);
}

/* Layout 0 is refused, layouts 1 and 2 must be exact, a later layout starts with
 * layout 2's fields and may append more (kept as ext, not interpreted). */
static void test_bad_shm(void) {
  uint8_t b[54 + 256 + 1];
  struct wire_msg m;
  for (int ack = 0; ack < 2; ack++) {
    unsigned type = ack ? WIRE_SHM_HELLO_ACK : WIRE_SHM_HELLO;
    uint32_t fixed = ack ? 54 : 26, at = ack ? 4 : 0;
    memset(b, 0x11, sizeof(b));
    put32(b, 0);
    put16(b + at, 1);
    CU_ASSERT_EQUAL(decode_body(type, b, fixed, 0, &m), WIRE_OK);
    CU_ASSERT_EQUAL(decode_body(type, b, fixed + 1, 0, &m), WIRE_EBODY); /* layout 1 plus garbage */
    put16(b + at, 0);
    CU_ASSERT_EQUAL(decode_body(type, b, fixed, 0, &m), WIRE_EBODY);
    put16(b + at, 2);
    CU_ASSERT_EQUAL(decode_body(type, b, fixed, 0, &m), WIRE_EBODY); /* layout 2 without its fields */
    put16(b + fixed, 4);                                             /* ack: a 4-byte socket name */
    memcpy(b + fixed + 2, "sock", 4);
    uint32_t l2 = fixed + 4 + (ack ? 2 : 0);
    CU_ASSERT_EQUAL(decode_body(type, b, l2, 0, &m), WIRE_OK);
    CU_ASSERT_EQUAL(decode_body(type, b, l2 + 1, 0, &m), WIRE_EBODY); /* layout 2 plus garbage */
    put16(b + at, 3);
    memset(b + l2, 0x11, 256 - (l2 - fixed));
    CU_ASSERT_EQUAL(decode_body(type, b, fixed + 256, 0, &m), WIRE_OK);
    CU_ASSERT_EQUAL(m.u.shm.layout, 3);
    CU_ASSERT_EQUAL(m.u.shm.ext_len, 256);
    CU_ASSERT(m.u.shm.ext == b + fixed);
    CU_ASSERT_EQUAL(m.u.shm.pid, 0x11111111u);
    if (ack) {
      CU_ASSERT(m.u.shm.sock_len == 4 && memcmp(m.u.shm.sock, "sock", 4) == 0);
    } else {
      CU_ASSERT_EQUAL(m.u.shm.flags, 0x00040000u | 0x736fu); /* the bytes put there, as flags */
    }
  }
  /* Too short or too long for the type: refused by the header already. */
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_HELLO, 25, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_HELLO_ACK, 53, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_HELLO_ACK, 54 + 257, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_SHM_HELLO, 26, 1), WIRE_ELEN);
}

static void test_bad_write_req(void) {
  uint8_t b[16];
  struct wire_msg m;

  put64(b, 5);
  put64(b + 8, 0x2000);
  CU_ASSERT_EQUAL(decode_body(WIRE_WRITE_REQ, b, 16, 0, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_WRITE_REQ, b, 16, 1, &m), WIRE_OK);
}

/* A STAGE body written by hand: seq, count, then the ranges given (count may lie). */
static uint32_t raw_stage(uint8_t *b, uint32_t count, const uint64_t *addr, const uint32_t *len, uint32_t n) {
  put64(b, 0x5747);
  put32(b + 8, count);
  for (uint32_t i = 0; i < n; i++) {
    put64(b + 12 + 12 * i, addr[i]);
    put32(b + 20 + 12 * i, len[i]);
  }
  return 12 + 12 * n;
}

/* Decodes a STAGE body under both types; STAGE_WRITE's payload_len is the sum given. */
static void stage_both(const uint8_t *b, uint32_t n, uint32_t sum, enum wire_err want) {
  struct wire_msg m;
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, sum, &m), want);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_READ, b, n, 0, &m), want);
}

static void test_bad_stage(void) {
  static uint8_t b[12 + 12 * 4096];
  static uint64_t addr[4096];
  static uint32_t len[4096];
  struct wire_msg m;
  uint32_t n;

  for (uint32_t i = 0; i < 4096; i++) addr[i] = 0x10000ull * (i + 1), len[i] = 10 + i;
  /* The baseline: two ranges, 10 + 11 bytes. */
  n = raw_stage(b, 2, addr, len, 2);
  stage_both(b, n, 21, WIRE_OK);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, 21, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.stage.count, 2);
  CU_ASSERT_EQUAL(m.u.stage.total, 21);

  /* count 0, with a range present (the smallest body the header allows) */
  n = raw_stage(b, 0, addr, len, 1);
  stage_both(b, n, 10, WIRE_EBODY);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_WRITE, 12, 0), WIRE_ELEN); /* no range at all */
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, 12, 0), WIRE_ELEN);

  /* body length other than 12 + 12 * count */
  n = raw_stage(b, 2, addr, len, 3); /* a range more than counted */
  stage_both(b, n, 21, WIRE_EBODY);
  stage_both(b, n, 33, WIRE_EBODY);
  n = raw_stage(b, 3, addr, len, 2); /* a range fewer */
  stage_both(b, n, 33, WIRE_EBODY);
  stage_both(b, n, 21, WIRE_EBODY);
  n = raw_stage(b, 2, addr, len, 3);
  stage_both(b, 12 + 24 + 1, 21, WIRE_EBODY); /* trailing byte */
  stage_both(b, 12 + 24 - 1, 21, WIRE_EBODY); /* last range cut short */
  n = raw_stage(b, 0xffffffffu, addr, len, 1);
  stage_both(b, n, 10, WIRE_EBODY);
  n = raw_stage(b, 4097, addr, len, 4096); /* more than fits the largest body */
  stage_both(b, n, MIB(16), WIRE_EBODY);
  /* 12 + 12 * count wraps to 24 in 32 bits: a decoder computing it in 32 bits (or in a
   * 32-bit size_t) would walk 2^30 + 1 ranges off the end of a 24-byte body. */
  n = raw_stage(b, 0x40000001u, addr, len, 1);
  stage_both(b, n, 10, WIRE_EBODY);

  /* a zero-length range, first, in the middle, last */
  for (uint32_t at = 0; at < 3; at++) {
    uint32_t l = len[at];
    len[at] = 0;
    n = raw_stage(b, 3, addr, len, 3);
    stage_both(b, n, 10 + 11 + 12 - l, WIRE_EBODY);
    len[at] = l;
  }
  n = raw_stage(b, 3, addr, len, 3);
  stage_both(b, n, 33, WIRE_OK);

  /* a range wrapping past the top of the address space; ending at the very top is fine */
  uint64_t top[2] = {0x1000, UINT64_MAX - 99};
  uint32_t tl[2] = {1, 99};
  n = raw_stage(b, 2, top, tl, 2);
  stage_both(b, n, 100, WIRE_OK);
  tl[1] = 100; /* addr + len == 2^64 */
  n = raw_stage(b, 2, top, tl, 2);
  stage_both(b, n, 101, WIRE_EBODY);
  top[1] = UINT64_MAX, tl[1] = 1;
  n = raw_stage(b, 2, top, tl, 2);
  stage_both(b, n, 2, WIRE_EBODY);
  top[1] = UINT64_MAX, tl[1] = 0xffffffffu;
  n = raw_stage(b, 2, top, tl, 2);
  stage_both(b, n, MIB(16), WIRE_EBODY);

  /* the sum of the lengths over 16 MiB; exactly 16 MiB is fine */
  uint32_t big[2] = {MIB(8), MIB(8)};
  n = raw_stage(b, 2, addr, big, 2);
  stage_both(b, n, MIB(16), WIRE_OK);
  big[1]++;
  n = raw_stage(b, 2, addr, big, 2);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_READ, b, n, 0, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, MIB(16), &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_WRITE, n, MIB(16) + 1), WIRE_ELEN);
  big[0] = 0xffffffffu, big[1] = 1; /* one range alone over the cap */
  n = raw_stage(b, 1, addr, big, 1);
  stage_both(b, n, 0, WIRE_EBODY);
  /* A sum of exactly 2^32 would be 0 in 32 bits, and match a STAGE_WRITE payload_len 0. */
  for (uint32_t i = 0; i < 16; i++) len[i] = 0x10000000u;
  n = raw_stage(b, 16, addr, len, 16);
  stage_both(b, n, 0, WIRE_EBODY);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 4096 + (i & 1); /* 16 MiB + 2048 */
  n = raw_stage(b, 4096, addr, len, 4096);
  stage_both(b, n, MIB(16), WIRE_EBODY);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 4096;
  n = raw_stage(b, 4096, addr, len, 4096);
  stage_both(b, n, MIB(16), WIRE_OK);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 10 + i;

  /* STAGE_WRITE's payload is exactly the sum of the lengths */
  n = raw_stage(b, 2, addr, len, 2);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, 21, &m), WIRE_OK);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, 20, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, 22, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, 0, &m), WIRE_EBODY);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_WRITE, b, n, MIB(16), &m), WIRE_EBODY);

  /* STAGE_READ carries no payload: refused by the header already */
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, n, 1), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, n, 21), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, n, MIB(16)), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_READ, n, 0), WIRE_OK);
}

/* A refused STAGE body leaves segs unset or inside the body. The body is an exact
 * allocation, so a decoder that reads a range past it is caught by the sanitizer. */
static void test_bad_stage_pointers(void) {
  static const uint32_t counts[] = {0, 1, 2, 0x40000001u, 0xffffffffu};
  uint8_t *b = malloc(24);
  struct wire_msg m;
  CU_ASSERT_FATAL(b != NULL);

  for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
    put64(b, 1);
    put32(b + 8, counts[i]);
    put64(b + 12, 0x1000);
    put32(b + 20, 0); /* a zero length, so even count 1 is refused */
    CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_READ, b, 24, 0, &m), WIRE_EBODY);
    CU_ASSERT(m.u.stage.segs == NULL || inside(m.u.stage.segs, 0, b, 24));
  }
  free(b);
}

/* A STAGE_PULL / STAGE_PUSH body written by hand: seq, buf, rkey, count, then the ranges
 * given (count may lie). */
static uint32_t raw_stage_rdma(uint8_t *b, uint64_t sbuf, uint32_t count, const uint64_t *addr,
                               const uint32_t *len, uint32_t n) {
  put64(b, 0x5055);
  put64(b + 8, sbuf);
  put32(b + 16, 0x0badcafeu);
  put32(b + 20, count);
  for (uint32_t i = 0; i < n; i++) {
    put64(b + 24 + 12 * i, addr[i]);
    put32(b + 32 + 12 * i, len[i]);
  }
  return 24 + 12 * n;
}

/* Decodes a STAGE_PULL / STAGE_PUSH body under both types; neither carries a payload. */
static void rdma_both(const uint8_t *b, uint32_t n, enum wire_err want) {
  struct wire_msg m;
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_PULL, b, n, 0, &m), want);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_PUSH, b, n, 0, &m), want);
}

static void test_bad_stage_rdma(void) {
  static uint8_t b[24 + 12 * 4096];
  static uint64_t addr[4096];
  static uint32_t len[4096];
  const uint64_t sbuf = 0x00007f5500000000ull;
  struct wire_msg m;
  uint32_t n;

  for (uint32_t i = 0; i < 4096; i++) addr[i] = 0x10000ull * (i + 1), len[i] = 10 + i;
  /* The baseline: two ranges, 10 + 11 bytes. */
  n = raw_stage_rdma(b, sbuf, 2, addr, len, 2);
  rdma_both(b, n, WIRE_OK);
  CU_ASSERT_EQUAL(decode_body(WIRE_STAGE_PUSH, b, n, 0, &m), WIRE_OK);
  CU_ASSERT_EQUAL(m.u.stage.seq, 0x5055);
  CU_ASSERT_EQUAL(m.u.stage.buf, sbuf);
  CU_ASSERT_EQUAL(m.u.stage.rkey, 0x0badcafeu);
  CU_ASSERT_EQUAL(m.u.stage.count, 2);
  CU_ASSERT_EQUAL(m.u.stage.total, 21);
  CU_ASSERT_PTR_EQUAL(m.u.stage.segs, b + 24);

  /* count 0, with a range present (the smallest body the header allows) */
  n = raw_stage_rdma(b, sbuf, 0, addr, len, 1);
  rdma_both(b, n, WIRE_EBODY);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PULL, 24, 0), WIRE_ELEN); /* no range at all */
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PUSH, 24, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PULL, 35, 0), WIRE_ELEN);
  CU_ASSERT_EQUAL(hdr_of(WIRE_STAGE_PUSH, 35, 0), WIRE_ELEN);

  /* body length other than 24 + 12 * count */
  n = raw_stage_rdma(b, sbuf, 2, addr, len, 3); /* a range more than counted */
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, sbuf, 3, addr, len, 2); /* a range fewer: 12 + 12 * count, the STAGE_READ rule */
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, sbuf, 2, addr, len, 3);
  rdma_both(b, 24 + 24 + 1, WIRE_EBODY); /* trailing byte */
  rdma_both(b, 24 + 24 - 1, WIRE_EBODY); /* last range cut short */
  n = raw_stage_rdma(b, sbuf, 0xffffffffu, addr, len, 1);
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, sbuf, 4097, addr, len, 4096); /* more than fits the largest body */
  rdma_both(b, n, WIRE_EBODY);
  /* 24 + 12 * count wraps to 36 in 32 bits: exactly the body of one range. */
  n = raw_stage_rdma(b, sbuf, 0x40000001u, addr, len, 1);
  rdma_both(b, n, WIRE_EBODY);
  /* A STAGE_READ body (12-byte fixed part) under these types: count is read from
   * where the first range's length sits, and the lengths no longer add up. */
  n = raw_stage(b, 2, addr, len, 2);
  rdma_both(b, n, WIRE_EBODY);

  /* a zero-length range, first, in the middle, last */
  for (uint32_t at = 0; at < 3; at++) {
    uint32_t l = len[at];
    len[at] = 0;
    n = raw_stage_rdma(b, sbuf, 3, addr, len, 3);
    rdma_both(b, n, WIRE_EBODY);
    len[at] = l;
  }
  n = raw_stage_rdma(b, sbuf, 3, addr, len, 3);
  rdma_both(b, n, WIRE_OK);

  /* a range wrapping past the top of the address space; ending at the very top is fine */
  uint64_t top[2] = {0x1000, UINT64_MAX - 99};
  uint32_t tl[2] = {1, 99};
  n = raw_stage_rdma(b, sbuf, 2, top, tl, 2);
  rdma_both(b, n, WIRE_OK);
  tl[1] = 100; /* addr + len == 2^64 */
  n = raw_stage_rdma(b, sbuf, 2, top, tl, 2);
  rdma_both(b, n, WIRE_EBODY);
  top[1] = UINT64_MAX, tl[1] = 1;
  n = raw_stage_rdma(b, sbuf, 2, top, tl, 2);
  rdma_both(b, n, WIRE_EBODY);
  top[1] = UINT64_MAX, tl[1] = 0xffffffffu;
  n = raw_stage_rdma(b, sbuf, 2, top, tl, 2);
  rdma_both(b, n, WIRE_EBODY);

  /* the sum of the lengths over 16 MiB; exactly 16 MiB is fine */
  uint32_t big[2] = {MIB(8), MIB(8)};
  n = raw_stage_rdma(b, sbuf, 2, addr, big, 2);
  rdma_both(b, n, WIRE_OK);
  big[1]++;
  n = raw_stage_rdma(b, sbuf, 2, addr, big, 2);
  rdma_both(b, n, WIRE_EBODY);
  big[0] = 0xffffffffu, big[1] = 1; /* one range alone over the cap */
  n = raw_stage_rdma(b, sbuf, 1, addr, big, 1);
  rdma_both(b, n, WIRE_EBODY);
  for (uint32_t i = 0; i < 16; i++) len[i] = 0x10000000u; /* 2^32: 0 in 32 bits */
  n = raw_stage_rdma(b, sbuf, 16, addr, len, 16);
  rdma_both(b, n, WIRE_EBODY);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 4096 + (i & 1); /* 16 MiB + 2048 */
  n = raw_stage_rdma(b, sbuf, 4096, addr, len, 4096);
  rdma_both(b, n, WIRE_EBODY);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 4096;
  n = raw_stage_rdma(b, sbuf, 4096, addr, len, 4096);
  rdma_both(b, n, WIRE_OK);
  for (uint32_t i = 0; i < 4096; i++) len[i] = 10 + i;

  /* buf + the sum must not wrap: as for a range, ending at the very top is fine */
  n = raw_stage_rdma(b, UINT64_MAX - 21, 2, addr, len, 2);
  rdma_both(b, n, WIRE_OK);
  n = raw_stage_rdma(b, UINT64_MAX - 20, 2, addr, len, 2); /* buf + 21 == 2^64 */
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, UINT64_MAX, 2, addr, len, 2);
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, 0, 2, addr, len, 2);
  rdma_both(b, n, WIRE_OK);
  big[0] = MIB(8), big[1] = MIB(8);
  n = raw_stage_rdma(b, UINT64_MAX - MIB(16), 2, addr, big, 2);
  rdma_both(b, n, WIRE_OK);
  n = raw_stage_rdma(b, UINT64_MAX - MIB(16) + 1, 2, addr, big, 2);
  rdma_both(b, n, WIRE_EBODY);
  n = raw_stage_rdma(b, 0xffffffffff000001ull, 2, addr, big, 2); /* + 16 MiB wraps to 1 */
  rdma_both(b, n, WIRE_EBODY);

  /* No payload, ever: refused by the header already */
  n = raw_stage_rdma(b, sbuf, 2, addr, len, 2);
  static const enum wire_type types[] = {WIRE_STAGE_PULL, WIRE_STAGE_PUSH};
  for (size_t t = 0; t < 2; t++) {
    CU_ASSERT_EQUAL(hdr_of(types[t], n, 1), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(types[t], n, 21), WIRE_ELEN); /* the sum, as a STAGE_WRITE would carry */
    CU_ASSERT_EQUAL(hdr_of(types[t], n, MIB(16)), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(types[t], n, 0xffffffffu), WIRE_ELEN);
    CU_ASSERT_EQUAL(hdr_of(types[t], n, 0), WIRE_OK);
  }
}

/* As for STAGE_READ: a refused STAGE_PULL / STAGE_PUSH leaves segs unset or inside an
 * exactly allocated body. */
static void test_bad_stage_rdma_pointers(void) {
  static const uint32_t counts[] = {0, 1, 2, 0x40000001u, 0xffffffffu};
  static const enum wire_type types[] = {WIRE_STAGE_PULL, WIRE_STAGE_PUSH};
  uint8_t *b = malloc(36);
  struct wire_msg m;
  CU_ASSERT_FATAL(b != NULL);

  for (size_t t = 0; t < 2; t++) {
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
      put64(b, 1);
      put64(b + 8, 0x2000);
      put32(b + 16, 7);
      put32(b + 20, counts[i]);
      put64(b + 24, 0x1000);
      put32(b + 32, 0); /* a zero length, so even count 1 is refused */
      CU_ASSERT_EQUAL(decode_body(types[t], b, 36, 0, &m), WIRE_EBODY);
      CU_ASSERT(m.u.stage.segs == NULL || inside(m.u.stage.segs, 0, b, 36));
    }
  }
  free(b);
}

/* ---- builder ---- */

static void test_builder_overflow(void) {
  uint8_t buf[64];
  struct wire_wr w;

  /* Too small for the header. */
  wire_begin(&w, buf, WIRE_HDR_LEN - 1, WIRE_WRITE_ACK);
  wire_put_u64(&w, 1);
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);
  wire_begin(&w, buf, 0, WIRE_WRITE_ACK);
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);

  /* Exact fit works; one byte short does not. */
  wire_begin(&w, buf, WIRE_HDR_LEN + 12, WIRE_WRITE_ACK);
  wire_put_u64(&w, 1);
  wire_put_u32(&w, 0);
  CU_ASSERT_EQUAL(wire_end(&w, 0), WIRE_HDR_LEN + 12);
  wire_begin(&w, buf, WIRE_HDR_LEN + 11, WIRE_WRITE_ACK);
  wire_put_u64(&w, 1);
  wire_put_u32(&w, 0);
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);
  CU_ASSERT(w.overflow);

  /* Overflow is sticky: a later write that would fit does not clear it. */
  wire_begin(&w, buf, WIRE_HDR_LEN + 4, WIRE_WRITE_ACK);
  wire_put_u64(&w, 1);
  wire_put_u16(&w, 2);
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);

  /* Overflowing writes leave the bytes past cap untouched. */
  memset(buf, 0xcc, sizeof(buf));
  wire_begin(&w, buf, WIRE_HDR_LEN + 2, WIRE_HELLO);
  wire_put_bytes(&w, "abcdef", 6);
  wire_put_mem_entry(&w, 1, 2, 3, "tag");
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);
  for (size_t i = WIRE_HDR_LEN; i < sizeof(buf); i++) CU_ASSERT_EQUAL(buf[i], 0xcc);
}

/* A body larger than WIRE_MAX_BODY is refused by wire_end, even when it fits the buffer. */
static void test_builder_max_body(void) {
  size_t cap = WIRE_HDR_LEN + WIRE_MAX_BODY + 1;
  uint8_t *buf = calloc(1, cap);
  struct wire_wr w;
  CU_ASSERT_FATAL(buf != NULL);

  wire_begin(&w, buf, cap, WIRE_HELLO_ACK);
  wire_put_bytes(&w, buf + WIRE_HDR_LEN, WIRE_MAX_BODY);
  CU_ASSERT_EQUAL(wire_end(&w, 0), cap - 1);
  wire_put_bytes(&w, "x", 1);
  CU_ASSERT_FALSE(w.overflow);
  CU_ASSERT_EQUAL(wire_end(&w, 0), 0);
  free(buf);
}

static CU_TestInfo hdr_tests[] = {
    {"bytes", test_hdr_bytes},
    {"fields", test_hdr_parse_fields},
    {"bad magic", test_hdr_bad_magic},
    {"version", test_hdr_version},
    {"type", test_hdr_type},
    {"flags and reserved", test_hdr_flags_reserved},
    {"body limits", test_hdr_body_limits},
    {"payload", test_hdr_payload},
    {"constants", test_constants},
    {"names", test_names},
    {"rails ack", test_rails_ack},
    {"memory windows", test_wins},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo rt_tests[] = {
    {"hello", test_rt_hello},
    {"hello extensions", test_hello_ext},
    {"hello_ack", test_rt_hello_ack},
    {"hello_ack empty", test_rt_hello_ack_empty},
    {"hello_ack max entries", test_rt_hello_ack_max},
    {"mem add/del", test_rt_mem},
    {"write_req", test_rt_write_req},
    {"read_req", test_rt_read_req},
    {"acks", test_rt_acks},
    {"sync", test_rt_sync},
    {"rdma qp info", test_rt_qp},
    {"shm hello and ack", test_rt_shm},
    {"shm hello and ack, layout 2", test_rt_shm_layout2},
    {"shm map, unmap and their acks", test_rt_shm_map},
    {"shm device map: fields, the handle, refused ranges", test_rt_shm_dev_map},
    {"notify", test_rt_notify},
    {"call and call_resp", test_rt_call},
    {"call_after", test_rt_call_after},
    {"call_tag", test_rt_call_tag},
    {"stage write and read", test_rt_stage},
    {"stage pull and push bytes", test_rt_stage_rdma_bytes},
    {"stage pull and push", test_rt_stage_rdma},
    {"stream", test_rt_stream},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo bad_tests[] = {
    {"hello", test_bad_hello},
    {"hello_ack", test_bad_hello_ack},
    {"mem", test_bad_mem},
    {"notify", test_bad_notify},
    {"notify pointers", test_bad_notify_pointers},
    {"read_req", test_bad_read_req},
    {"read_resp", test_bad_read_resp},
    {"write_req", test_bad_write_req},
    {"shm hello and ack", test_bad_shm},
    {"stage write and read", test_bad_stage},
    {"stage pointers", test_bad_stage_pointers},
    {"stage pull and push", test_bad_stage_rdma},
    {"stage pull and push pointers", test_bad_stage_rdma_pointers},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo builder_tests[] = {
    {"overflow", test_builder_overflow},
    {"max body", test_builder_max_body},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "wire header", .pTests = hdr_tests},
    {.pName = "wire round trip", .pTests = rt_tests},
    {.pName = "wire malformed", .pTests = bad_tests},
    {.pName = "wire builder", .pTests = builder_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) { return tu_run_suites("test_wire", suites); }
