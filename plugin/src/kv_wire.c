/* kv_wire: encoders and the whole-buffer parser of the plugin's messages. */
#include "kv_wire.h"

#include <stdlib.h>
#include <string.h>

static void grow(struct kv_out *o, size_t n) {
  if (o->bad || o->len + n <= o->cap) return;
  size_t cap = o->cap ? o->cap : 256;
  while (cap < o->len + n) cap *= 2;
  uint8_t *p = realloc(o->p, cap);
  if (!p) {
    o->bad = true;
    return;
  }
  o->p = p;
  o->cap = cap;
}

static void put_be(struct kv_out *o, uint64_t v, int bytes) {
  grow(o, (size_t)bytes);
  if (o->bad) return;
  for (int i = bytes - 1; i >= 0; i--) o->p[o->len++] = (uint8_t)(v >> (8 * i));
}

void kv_put_u8(struct kv_out *o, uint8_t v) { put_be(o, v, 1); }
void kv_put_u32(struct kv_out *o, uint32_t v) { put_be(o, v, 4); }
void kv_put_u64(struct kv_out *o, uint64_t v) { put_be(o, v, 8); }

void kv_put_str(struct kv_out *o, const char *s, size_t n) {
  if (n > UINT16_MAX) {
    o->bad = true;
    return;
  }
  put_be(o, n, 2);
  grow(o, n);
  if (o->bad) return;
  memcpy(o->p + o->len, s, n);
  o->len += n;
}

void kv_put_raw(struct kv_out *o, const uint8_t *p, size_t n) {
  grow(o, n);
  if (o->bad || n == 0) return;
  memcpy(o->p + o->len, p, n);
  o->len += n;
}

void kv_put_blocks(struct kv_out *o, const uint64_t *v, size_t n) {
  if (n > KV_MAX_BLOCKS) {
    o->bad = true;
    return;
  }
  kv_put_u32(o, (uint32_t)n);
  for (size_t i = 0; i < n; i++) kv_put_u64(o, v[i]);
}

static uint64_t get_be(struct kv_in *i, int bytes) {
  if (i->bad || i->len - i->off < (size_t)bytes) {
    i->bad = true;
    return 0;
  }
  uint64_t v = 0;
  for (int k = 0; k < bytes; k++) v = (v << 8) | i->p[i->off++];
  return v;
}

uint8_t kv_get_u8(struct kv_in *i) { return (uint8_t)get_be(i, 1); }
uint32_t kv_get_u32(struct kv_in *i) { return (uint32_t)get_be(i, 4); }
uint64_t kv_get_u64(struct kv_in *i) { return get_be(i, 8); }

bool kv_get_str(struct kv_in *i, char *out, size_t max) {
  size_t n = (size_t)get_be(i, 2);
  if (i->bad || n > max || i->len - i->off < n) {
    i->bad = true;
    out[0] = '\0';
    return false;
  }
  memcpy(out, i->p + i->off, n);
  out[n] = '\0';
  if (memchr(out, '\0', n)) { /* ids are text */
    i->bad = true;
    return false;
  }
  i->off += n;
  return true;
}

bool kv_get_blocks(struct kv_in *i, uint64_t **v, size_t *n) {
  uint32_t c = kv_get_u32(i);
  *v = NULL;
  *n = 0;
  if (i->bad || c > KV_MAX_BLOCKS || (i->len - i->off) / 8 < c) {
    i->bad = true;
    return false;
  }
  if (c == 0) return true;
  uint64_t *a = malloc(c * sizeof(*a));
  if (!a) {
    i->bad = true;
    return false;
  }
  for (uint32_t k = 0; k < c; k++) a[k] = get_be(i, 8);
  *v = a;
  *n = c;
  return true;
}

void kv_meta_begin(struct kv_out *o, uint32_t count) {
  kv_put_u32(o, KV_META_MAGIC);
  kv_put_u8(o, KV_META_VERSION);
  kv_put_u32(o, count);
}

void kv_meta_put(struct kv_out *o, const struct kv_meta_entry *e) {
  kv_put_u8(o, e->type);
  kv_put_str(o, e->req, strlen(e->req));
  switch (e->type) {
  case KV_META_LOAD:
  case KV_META_PUSH:
    kv_put_str(o, e->remote, strlen(e->remote));
    kv_put_u64(o, e->cluster);
    kv_put_str(o, e->rreq, strlen(e->rreq));
    kv_put_blocks(o, e->blocks, e->nblocks);
    kv_put_blocks(o, e->rblocks, e->nrblocks);
    if (e->type == KV_META_LOAD) {
      kv_put_u64(o, e->epoch);
      kv_put_u64(o, e->seq);
    }
    kv_put_groups(o, e->gn, e->ngroups);
    kv_put_groups(o, e->rgn, e->ngroups);
    break;
  case KV_META_HOLD:
  case KV_META_EXPECT:
    kv_put_blocks(o, e->blocks, e->nblocks);
    if (e->type == KV_META_HOLD) {
      kv_put_u64(o, e->epoch);
      kv_put_u64(o, e->seq);
    }
    kv_put_groups(o, e->gn, e->ngroups);
    break;
  case KV_META_FREE:
    kv_put_str(o, e->remote, strlen(e->remote));
    kv_put_u64(o, e->cluster);
    kv_put_str(o, e->rreq, strlen(e->rreq));
    break;
  default: o->bad = true;
  }
}

void kv_meta_free(struct kv_meta_entry *v, size_t count) {
  for (size_t k = 0; v && k < count; k++) {
    free(v[k].blocks);
    free(v[k].rblocks);
  }
  free(v);
}

bool kv_meta_parse(const uint8_t *p, size_t len, struct kv_meta_entry **entries, size_t *count) {
  struct kv_in in = {p, len, 0, false};
  if (kv_get_u32(&in) != KV_META_MAGIC || kv_get_u8(&in) != KV_META_VERSION) return false;
  uint32_t n = kv_get_u32(&in);
  if (in.bad || n > KV_MAX_ENTRIES) return false;
  struct kv_meta_entry *v = calloc(n ? n : 1, sizeof(*v));
  if (!v) return false;
  for (uint32_t k = 0; k < n && !in.bad; k++) {
    struct kv_meta_entry *e = &v[k];
    e->type = kv_get_u8(&in);
    kv_get_str(&in, e->req, KV_MAX_ID);
    switch (e->type) {
    case KV_META_LOAD:
    case KV_META_PUSH:
      kv_get_str(&in, e->remote, KV_MAX_ENGINE);
      e->cluster = kv_get_u64(&in);
      kv_get_str(&in, e->rreq, KV_MAX_ID);
      kv_get_blocks(&in, &e->blocks, &e->nblocks);
      kv_get_blocks(&in, &e->rblocks, &e->nrblocks);
      if (e->type == KV_META_LOAD) {
        e->epoch = kv_get_u64(&in);
        e->seq = kv_get_u64(&in);
      }
      uint32_t nrg = 0;
      if (!kv_get_groups(&in, e->gn, &e->ngroups, e->nblocks) ||
          !kv_get_groups(&in, e->rgn, &nrg, e->nrblocks) || nrg != e->ngroups)
        in.bad = true;
      for (uint32_t g = 0; g < e->ngroups && e->type == KV_META_LOAD; g++)
        if (e->gn[g] != e->rgn[g]) in.bad = true; /* a LOAD pairs each group's blocks one to one */
      /* A LOAD pairs blocks one to one; a PUSH names every block the consumer gave
       * (the pusher refuses a shortfall and tells the consumer). */
      if (e->nblocks == 0 || (e->type == KV_META_LOAD ? e->nrblocks != e->nblocks : e->nrblocks == 0))
        in.bad = true;
      break;
    case KV_META_HOLD:
    case KV_META_EXPECT:
      kv_get_blocks(&in, &e->blocks, &e->nblocks);
      if (e->type == KV_META_HOLD) {
        e->epoch = kv_get_u64(&in);
        e->seq = kv_get_u64(&in);
      }
      if (!kv_get_groups(&in, e->gn, &e->ngroups, e->nblocks)) in.bad = true;
      if (e->nblocks == 0) in.bad = true;
      break;
    case KV_META_FREE:
      kv_get_str(&in, e->remote, KV_MAX_ENGINE);
      e->cluster = kv_get_u64(&in);
      kv_get_str(&in, e->rreq, KV_MAX_ID);
      break;
    default: in.bad = true;
    }
    if (!in.bad && e->req[0] == '\0') in.bad = true;
  }
  if (in.bad || in.off != len) {
    kv_meta_free(v, n);
    return false;
  }
  *entries = v;
  *count = n;
  return true;
}

uint64_t kv_blocks_digest(const uint64_t *v, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) {
      h ^= (v[i] >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  return h;
}

uint64_t kv_groups_digest(const uint64_t *v, size_t n, const uint32_t *gn, uint32_t ngroups) {
  uint64_t h = kv_blocks_digest(v, n);
  for (uint32_t g = 0; g < ngroups; g++)
    for (int b = 0; b < 4; b++) {
      h ^= (gn[g] >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  return h;
}

void kv_put_groups(struct kv_out *o, const uint32_t *gn, uint32_t ngroups) {
  kv_put_u8(o, (uint8_t)ngroups);
  for (uint32_t g = 0; g < ngroups; g++) kv_put_u32(o, gn[g]);
}

bool kv_get_groups(struct kv_in *i, uint32_t *gn, uint32_t *ngroups, size_t total) {
  uint32_t n = kv_get_u8(i);
  uint64_t sum = 0;
  if (i->bad || n == 0 || n > KV_MAX_GROUPS) return false;
  for (uint32_t g = 0; g < n; g++) sum += gn[g] = kv_get_u32(i);
  *ngroups = n;
  return !i->bad && sum == total;
}
