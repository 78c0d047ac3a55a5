/* be: the one big-endian codec of hixl's wire formats (engine control plane, RPing,
 * cache manager, plugin, mock host). Header-only: fixed-offset loads and stores, and
 * two bounded cursors whose errors stick, so an encoder or a parser checks once at
 * its end:
 *   struct be_out: writes into a fixed buffer (cap set, grow false) or a heap buffer
 *                  it grows (grow true; the caller frees p); overflow or ENOMEM sets bad.
 *   struct be_in:  reads within len; a read past it sets bad and yields zeros. */
#ifndef HIXL_UTIL_BE_H
#define HIXL_UTIL_BE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline void be_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static inline void be_put32(uint8_t *p, uint32_t v) {
  be_put16(p, (uint16_t)(v >> 16));
  be_put16(p + 2, (uint16_t)v);
}
static inline void be_put64(uint8_t *p, uint64_t v) {
  be_put32(p, (uint32_t)(v >> 32));
  be_put32(p + 4, (uint32_t)v);
}
static inline uint16_t be_get16(const uint8_t *p) { return (uint16_t)((unsigned)p[0] << 8 | p[1]); }
static inline uint32_t be_get32(const uint8_t *p) { return (uint32_t)be_get16(p) << 16 | be_get16(p + 2); }
static inline uint64_t be_get64(const uint8_t *p) { return (uint64_t)be_get32(p) << 32 | be_get32(p + 4); }

struct be_out {
  uint8_t *p;
  size_t len, cap;
  bool grow; /* p is the cursor's own heap buffer, grown as needed */
  bool bad;  /* overflow of a fixed buffer, or out of memory */
};

static inline struct be_out be_out_fixed(uint8_t *buf, size_t cap) {
  return (struct be_out){.p = buf, .cap = cap};
}
static inline struct be_out be_out_heap(void) { return (struct be_out){.grow = true}; }

/* Room for n more bytes at p + len, or NULL (and bad). n 0: p + len, or NULL while
 * there is no buffer yet (not an error). */
static inline uint8_t *be_out_take(struct be_out *o, size_t n) {
  if (o->bad) return NULL;
  if (n == 0) return o->p ? o->p + o->len : NULL;
  if (n > o->cap - o->len) {
    size_t cap = o->cap ? o->cap : 256;
    uint8_t *q;
    if (!o->grow || n > SIZE_MAX / 2 - o->len) goto bad;
    while (cap < o->len + n) cap *= 2;
    if (!(q = realloc(o->p, cap))) goto bad;
    o->p = q;
    o->cap = cap;
  }
  o->len += n;
  return o->p + o->len - n;
bad:
  o->bad = true;
  return NULL;
}
static inline void be_out_u8(struct be_out *o, uint8_t v) {
  uint8_t *p = be_out_take(o, 1);
  if (p) p[0] = v;
}
static inline void be_out_u16(struct be_out *o, uint16_t v) {
  uint8_t *p = be_out_take(o, 2);
  if (p) be_put16(p, v);
}
static inline void be_out_u32(struct be_out *o, uint32_t v) {
  uint8_t *p = be_out_take(o, 4);
  if (p) be_put32(p, v);
}
static inline void be_out_u64(struct be_out *o, uint64_t v) {
  uint8_t *p = be_out_take(o, 8);
  if (p) be_put64(p, v);
}
static inline void be_out_bytes(struct be_out *o, const void *s, size_t n) {
  uint8_t *p = n ? be_out_take(o, n) : NULL; /* nothing to write: s may be NULL */
  if (p && n) memcpy(p, s, n);
}

struct be_in {
  const uint8_t *p;
  size_t len, off;
  bool bad; /* a read went past len */
};

static inline struct be_in be_in_of(const void *p, size_t len) {
  return (struct be_in){.p = (const uint8_t *)p, .len = len};
}
/* The next n bytes, or NULL (and bad) when fewer are left. n 0: where the next byte
 * would be, or NULL for a reader over no buffer (not an error). */
static inline const uint8_t *be_in_take(struct be_in *i, size_t n) {
  if (!i->bad && n == 0) return i->p ? i->p + i->off : NULL;
  if (i->bad || n > i->len - i->off) {
    i->bad = true;
    return NULL;
  }
  i->off += n;
  return i->p + i->off - n;
}
static inline uint8_t be_in_u8(struct be_in *i) {
  const uint8_t *p = be_in_take(i, 1);
  return p ? p[0] : 0;
}
static inline uint16_t be_in_u16(struct be_in *i) {
  const uint8_t *p = be_in_take(i, 2);
  return p ? be_get16(p) : 0;
}
static inline uint32_t be_in_u32(struct be_in *i) {
  const uint8_t *p = be_in_take(i, 4);
  return p ? be_get32(p) : 0;
}
static inline uint64_t be_in_u64(struct be_in *i) {
  const uint8_t *p = be_in_take(i, 8);
  return p ? be_get64(p) : 0;
}
static inline size_t be_in_left(const struct be_in *i) { return i->bad ? 0 : i->len - i->off; }

#endif
