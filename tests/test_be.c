/* test_be: util/be.h, the one big-endian codec. Values against byte patterns written
 * out by hand, the fixed and the heap writer at and past their limits, and the reader
 * past its end (errors stick, reads yield zeros). */
#include "util/be.h"

#include "test_util.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t bytes8[8] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
static const uint8_t high8[8] = {0xf1, 0xe2, 0xd3, 0xc4, 0xb5, 0xa6, 0x97, 0x88}; /* every top bit set */

static void test_fixed_offsets(void) {
  uint8_t b[10];
  memset(b, 0xcc, sizeof(b));
  be_put16(b + 1, 0x0102);
  CU_ASSERT(memcmp(b + 1, bytes8, 2) == 0);
  CU_ASSERT(b[0] == 0xcc && b[3] == 0xcc);
  memset(b, 0xcc, sizeof(b));
  be_put32(b + 1, 0x01020304u);
  CU_ASSERT(memcmp(b + 1, bytes8, 4) == 0);
  CU_ASSERT(b[0] == 0xcc && b[5] == 0xcc);
  memset(b, 0xcc, sizeof(b));
  be_put64(b + 1, 0x0102030405060708ull);
  CU_ASSERT(memcmp(b + 1, bytes8, 8) == 0);
  CU_ASSERT(b[0] == 0xcc && b[9] == 0xcc);

  CU_ASSERT_EQUAL(be_get16(bytes8), 0x0102);
  CU_ASSERT_EQUAL(be_get32(bytes8), 0x01020304u);
  CU_ASSERT_EQUAL(be_get64(bytes8), 0x0102030405060708ull);
  CU_ASSERT_EQUAL(be_get16(high8), 0xf1e2);
  CU_ASSERT_EQUAL(be_get32(high8), 0xf1e2d3c4u);
  CU_ASSERT_EQUAL(be_get64(high8), 0xf1e2d3c4b5a69788ull);
  be_put64(b, 0xf1e2d3c4b5a69788ull);
  CU_ASSERT(memcmp(b, high8, 8) == 0);
}

static void test_round_trip(void) {
  static const uint64_t v64[] = {0, 1, 0x80, 0xff, 0x8000000000000000ull, UINT64_MAX, 0x0102030405060708ull};
  uint8_t b[8];
  for (size_t k = 0; k < sizeof(v64) / sizeof(v64[0]); k++) {
    uint64_t v = v64[k];
    be_put16(b, (uint16_t)v);
    CU_ASSERT_EQUAL(be_get16(b), (uint16_t)v);
    be_put32(b, (uint32_t)v);
    CU_ASSERT_EQUAL(be_get32(b), (uint32_t)v);
    be_put64(b, v);
    CU_ASSERT_EQUAL(be_get64(b), v);
  }
}

/* The cursors: what be_out writes, be_in reads back. */
static void test_cursors(void) {
  uint8_t buf[15];
  struct be_out o = be_out_fixed(buf, sizeof(buf));
  be_out_u8(&o, 0x01);
  be_out_u16(&o, 0x0203);
  be_out_u32(&o, 0x04050607u);
  be_out_u64(&o, 0x08090a0b0c0d0e0full);
  CU_ASSERT_FALSE(o.bad);
  CU_ASSERT_EQUAL(o.len, sizeof(buf));
  for (size_t k = 0; k < sizeof(buf); k++) CU_ASSERT_EQUAL(buf[k], (uint8_t)(k + 1));

  struct be_in in = be_in_of(buf, sizeof(buf));
  CU_ASSERT_EQUAL(be_in_u8(&in), 0x01);
  CU_ASSERT_EQUAL(be_in_u16(&in), 0x0203);
  CU_ASSERT_EQUAL(be_in_u32(&in), 0x04050607u);
  CU_ASSERT_EQUAL(be_in_left(&in), 8);
  CU_ASSERT_EQUAL(be_in_u64(&in), 0x08090a0b0c0d0e0full);
  CU_ASSERT_FALSE(in.bad);
  CU_ASSERT_EQUAL(be_in_left(&in), 0);
}

static void test_out_fixed_overflow(void) {
  uint8_t buf[16];
  memset(buf, 0xcc, sizeof(buf));
  struct be_out o = be_out_fixed(buf, 6);
  be_out_u32(&o, 0x01020304u);
  CU_ASSERT_FALSE(o.bad);
  be_out_u32(&o, 0x05060708u); /* 4 bytes into 2 left: none of them written */
  CU_ASSERT_TRUE(o.bad);
  CU_ASSERT_EQUAL(o.len, 4);
  be_out_u8(&o, 0x09); /* would fit, but the error sticks */
  be_out_u16(&o, 0x0a0b);
  be_out_bytes(&o, bytes8, 1);
  CU_ASSERT_PTR_NULL(be_out_take(&o, 0));
  CU_ASSERT_TRUE(o.bad);
  CU_ASSERT_EQUAL(o.len, 4);
  CU_ASSERT_EQUAL(o.cap, 6);
  CU_ASSERT_PTR_EQUAL(o.p, buf);
  CU_ASSERT(memcmp(buf, bytes8, 4) == 0);
  for (size_t k = 4; k < sizeof(buf); k++) CU_ASSERT_EQUAL(buf[k], 0xcc);

  /* Exactly full is not an overflow; one byte more is. */
  memset(buf, 0xcc, sizeof(buf));
  o = be_out_fixed(buf, 8);
  be_out_u64(&o, 0x0102030405060708ull);
  CU_ASSERT_FALSE(o.bad);
  CU_ASSERT_EQUAL(o.len, 8);
  be_out_u8(&o, 0x09);
  CU_ASSERT_TRUE(o.bad);
  CU_ASSERT_EQUAL(o.len, 8);
  CU_ASSERT(memcmp(buf, bytes8, 8) == 0);
  for (size_t k = 8; k < sizeof(buf); k++) CU_ASSERT_EQUAL(buf[k], 0xcc);
}

static void test_out_heap_grows(void) {
  struct be_out o = be_out_heap();
  CU_ASSERT_TRUE(o.grow);
  CU_ASSERT_PTR_NULL(o.p);
  be_out_u8(&o, 0xa5);
  for (uint32_t k = 0; k < 100; k++) be_out_u32(&o, 0x01020300u + k); /* 401 bytes: past 256 */
  be_out_bytes(&o, bytes8, sizeof(bytes8));
  CU_ASSERT_FALSE(o.bad);
  CU_ASSERT_EQUAL(o.len, 1 + 400 + 8);
  CU_ASSERT(o.cap >= o.len);
  CU_ASSERT_FATAL(o.p != NULL);
  CU_ASSERT_EQUAL(o.p[0], 0xa5);
  for (uint32_t k = 0; k < 100; k++) {
    const uint8_t *q = o.p + 1 + 4 * k;
    CU_ASSERT(q[0] == 0x01 && q[1] == 0x02 && q[2] == 0x03 && q[3] == (uint8_t)k);
  }
  CU_ASSERT(memcmp(o.p + 401, bytes8, 8) == 0);

  /* A size the heap cannot hold: bad, and what it had is kept. */
  CU_ASSERT_PTR_NULL(be_out_take(&o, SIZE_MAX - 4));
  CU_ASSERT_TRUE(o.bad);
  CU_ASSERT_EQUAL(o.len, 409);
  CU_ASSERT_EQUAL(o.p[0], 0xa5);
  free(o.p);
}

static void test_in_past_end(void) {
  static const uint8_t b[6] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06};
  struct be_in in = be_in_of(b, sizeof(b));
  CU_ASSERT_EQUAL(be_in_u32(&in), 0x01020304u);
  CU_ASSERT_EQUAL(be_in_left(&in), 2);
  CU_ASSERT_EQUAL(be_in_u32(&in), 0); /* 4 bytes from 2 left */
  CU_ASSERT_TRUE(in.bad);
  CU_ASSERT_EQUAL(in.off, 4);
  CU_ASSERT_EQUAL(be_in_left(&in), 0);
  CU_ASSERT_EQUAL(be_in_u8(&in), 0); /* a byte is there, but the error sticks */
  CU_ASSERT_EQUAL(be_in_u16(&in), 0);
  CU_ASSERT_EQUAL(be_in_u64(&in), 0);
  CU_ASSERT_PTR_NULL(be_in_take(&in, 0));
  CU_ASSERT_TRUE(in.bad);
  CU_ASSERT_EQUAL(in.off, 4);

  in = be_in_of(b, sizeof(b));
  CU_ASSERT_EQUAL(be_in_u64(&in), 0); /* longer than the whole buffer */
  CU_ASSERT_TRUE(in.bad);
  in = be_in_of(b, sizeof(b));
  CU_ASSERT_PTR_EQUAL(be_in_take(&in, 6), b);
  CU_ASSERT_FALSE(in.bad);
  CU_ASSERT_EQUAL(be_in_u8(&in), 0);
  CU_ASSERT_TRUE(in.bad);
  in = be_in_of(b, sizeof(b));
  CU_ASSERT_PTR_NULL(be_in_take(&in, SIZE_MAX)); /* no wrap of off + n */
  CU_ASSERT_TRUE(in.bad);
}

static CU_TestInfo be_tests[] = {
    {"fixed offsets", test_fixed_offsets},
    {"round trip", test_round_trip},
    {"cursors", test_cursors},
    {"fixed writer overflow", test_out_fixed_overflow},
    {"heap writer grows", test_out_heap_grows},
    {"reader past the end", test_in_past_end},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "be", .pTests = be_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) { return tu_run_suites("test_be", suites); }
