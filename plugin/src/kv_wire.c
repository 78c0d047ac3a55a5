/* kv_wire: encoders and the whole-buffer parser of the plugin's messages. */
#include "kv_wire.h"

#include <stdlib.h>
#include <string.h>

#include "util/be.h"

/* kv_out and kv_in keep their own fields (the plugin's files read p, len, off and bad,
 * and a zeroed kv_out is an empty heap buffer); every byte goes through be.h's
 * cursors, run over those fields. */
static uint8_t *take_out(struct kv_out *o, size_t n) {
  struct be_out b = {.p = o->p, .len = o->len, .cap = o->cap, .grow = true, .bad = o->bad};
  uint8_t *q = be_out_take(&b, n);
  *o = (struct kv_out){.p = b.p, .len = b.len, .cap = b.cap, .bad = b.bad};
  return q;
}

static const uint8_t *take_in(struct kv_in *i, size_t n) {
  struct be_in b = {.p = i->p, .len = i->len, .off = i->off, .bad = i->bad};
  const uint8_t *q = be_in_take(&b, n);
  *i = (struct kv_in){.p = b.p, .len = b.len, .off = b.off, .bad = b.bad};
  return q;
}

void kv_put_u8(struct kv_out *o, uint8_t v) {
  uint8_t *q = take_out(o, 1);
  if (q) q[0] = v;
}
void kv_put_u32(struct kv_out *o, uint32_t v) {
  uint8_t *q = take_out(o, 4);
  if (q) be_put32(q, v);
}
void kv_put_u64(struct kv_out *o, uint64_t v) {
  uint8_t *q = take_out(o, 8);
  if (q) be_put64(q, v);
}

void kv_put_str(struct kv_out *o, const char *s, size_t n) {
  if (n > UINT16_MAX) {
    o->bad = true;
    return;
  }
  uint8_t *q = take_out(o, 2);
  if (q) be_put16(q, (uint16_t)n);
  kv_put_raw(o, (const uint8_t *)s, n);
}

void kv_put_raw(struct kv_out *o, const uint8_t *p, size_t n) {
  uint8_t *q = n ? take_out(o, n) : NULL; /* nothing to take: p may be NULL */
  if (q) memcpy(q, p, n);
}

void kv_put_blocks(struct kv_out *o, const uint64_t *v, size_t n) {
  if (n > KV_MAX_BLOCKS) {
    o->bad = true;
    return;
  }
  kv_put_u32(o, (uint32_t)n);
  for (size_t i = 0; i < n; i++) kv_put_u64(o, v[i]);
}

uint8_t kv_get_u8(struct kv_in *i) {
  const uint8_t *q = take_in(i, 1);
  return q ? q[0] : 0;
}
uint32_t kv_get_u32(struct kv_in *i) {
  const uint8_t *q = take_in(i, 4);
  return q ? be_get32(q) : 0;
}
uint64_t kv_get_u64(struct kv_in *i) {
  const uint8_t *q = take_in(i, 8);
  return q ? be_get64(q) : 0;
}

bool kv_get_str(struct kv_in *i, char *out, size_t max) {
  const uint8_t *q = take_in(i, 2);
  size_t n = q ? be_get16(q) : 0;
  const uint8_t *s = n <= max ? take_in(i, n) : NULL;
  if (!s) {
    i->bad = true;
    out[0] = '\0';
    return false;
  }
  memcpy(out, s, n);
  out[n] = '\0';
  if (memchr(out, '\0', n)) { /* ids are text */
    i->bad = true;
    return false;
  }
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
  for (uint32_t k = 0; k < c; k++) a[k] = kv_get_u64(i);
  *v = a;
  *n = c;
  return true;
}

void kv_put_cap(struct kv_out *o, const struct kv_cap *c) {
  if (c->len != 0 && c->len != KV_CAP_LEN) {
    o->bad = true;
    return;
  }
  kv_put_u8(o, c->len);
  kv_put_raw(o, c->b, c->len);
}

bool kv_get_cap(struct kv_in *i, struct kv_cap *c) {
  uint8_t n = kv_get_u8(i);
  const uint8_t *q = n == KV_CAP_LEN ? take_in(i, n) : NULL;
  memset(c, 0, sizeof(*c));
  if (i->bad || (n != 0 && !q)) {
    i->bad = true;
    return false;
  }
  if (q) memcpy(c->b, q, n);
  c->len = n;
  return true;
}

void kv_meta_begin(struct kv_out *o, const uint8_t key[KV_CAP_KEY_LEN], uint32_t count) {
  kv_put_u32(o, KV_META_MAGIC);
  kv_put_u8(o, KV_META_VERSION);
  kv_put_raw(o, key, KV_CAP_KEY_LEN);
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
    kv_put_cap(o, &e->rcap);
    kv_put_u32(o, e->rtp);
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
  case KV_META_RENEW:
    kv_put_str(o, e->remote, strlen(e->remote));
    kv_put_u64(o, e->cluster);
    kv_put_str(o, e->rreq, strlen(e->rreq));
    kv_put_cap(o, &e->rcap);
    kv_put_u32(o, e->rtp);
    if (e->type == KV_META_RENEW) {
      kv_put_u64(o, e->epoch);
      kv_put_u64(o, e->seq);
    }
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

bool kv_meta_parse(const uint8_t *p, size_t len, uint8_t key[KV_CAP_KEY_LEN], struct kv_meta_entry **entries,
                   size_t *count) {
  struct kv_in in = {p, len, 0, false};
  if (kv_get_u32(&in) != KV_META_MAGIC || kv_get_u8(&in) != KV_META_VERSION) return false;
  const uint8_t *kp = take_in(&in, KV_CAP_KEY_LEN); /* the scheduler's capability key */
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
      kv_get_cap(&in, &e->rcap);
      e->rtp = kv_get_u32(&in);
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
    case KV_META_RENEW:
      kv_get_str(&in, e->remote, KV_MAX_ENGINE);
      e->cluster = kv_get_u64(&in);
      kv_get_str(&in, e->rreq, KV_MAX_ID);
      kv_get_cap(&in, &e->rcap);
      e->rtp = kv_get_u32(&in);
      if (e->type == KV_META_RENEW) {
        e->epoch = kv_get_u64(&in);
        e->seq = kv_get_u64(&in);
      }
      break;
    default: in.bad = true;
    }
    if (!in.bad && e->req[0] == '\0') in.bad = true;
    if ((e->type == KV_META_LOAD || e->type == KV_META_PUSH || e->type == KV_META_FREE ||
         e->type == KV_META_RENEW) &&
        (e->rtp == 0 || e->rtp > KV_TP_MAX))
      in.bad = true;
  }
  if (in.bad || in.off != len) {
    kv_meta_free(v, n);
    return false;
  }
  memcpy(key, kp, KV_CAP_KEY_LEN);
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
