/* cache_index: the manager's keys, hashed: a CacheKey (req, model, prefix) to its cache
 * and batch item, a BlocksCacheKey's model to its cache. */
/* Open addressing with linear probing, at most half full, doubling as it grows; a key
 * is deleted by shifting the run after it back (no tombstones), so lookups stay short
 * however many caches came and went. Growing is the one step that allocates: a caller
 * reserves room for all it will add first, so an out of memory leaves the index as it
 * was. Nothing here locks: the manager's lock covers the index. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"

#define CM_INDEX_MIN 16 /* slots of a first table */

static uint64_t cm_mix(uint64_t x) { /* splitmix64's finalizer */
  x ^= x >> 30;
  x *= UINT64_C(0xbf58476d1ce4e5b9);
  x ^= x >> 27;
  x *= UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}

static size_t cm_home(const struct cm_index *ix, uint32_t kind, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = cm_mix(ix->seed ^ kind);
  h = cm_mix(h ^ a);
  h = cm_mix(h ^ b);
  return (size_t)cm_mix(h ^ c) & (ix->cap - 1);
}

static bool cm_slot_is(const struct cm_slot *s, const struct cm_ixkey *k) {
  return s->kind == k->kind && s->a == k->a && s->b == k->b && s->c == k->c;
}

/* The slot holding k, or the empty one where a probe for it ends. */
static size_t cm_probe(const struct cm_index *ix, const struct cm_ixkey *k) {
  size_t i = cm_home(ix, k->kind, k->a, k->b, k->c);
  while (ix->slots[i].cache && !cm_slot_is(&ix->slots[i], k)) i = (i + 1) & (ix->cap - 1);
  return i;
}

bool cm_index_reserve(struct cm_index *ix, size_t more) {
  if (more > SIZE_MAX / 4 - ix->n) return false;
  size_t need = ix->n + more, cap = ix->cap ? ix->cap : CM_INDEX_MIN;
  if (need <= ix->cap / 2) return true; /* an empty table too, when nothing is added */
  while (cap / 2 < need) {
    if (cap > SIZE_MAX / 2 / sizeof(struct cm_slot)) return false;
    cap *= 2;
  }
  struct cm_slot *slots = ix->calloc_fn ? ix->calloc_fn(cap, sizeof(*slots)) : calloc(cap, sizeof(*slots));
  if (!slots) return false;
  struct cm_index grown = *ix;
  grown.slots = slots;
  grown.cap = cap;
  for (size_t i = 0; i < ix->cap; i++) {
    const struct cm_slot *s = &ix->slots[i];
    if (!s->cache) continue;
    size_t j = cm_home(&grown, s->kind, s->a, s->b, s->c);
    while (slots[j].cache) j = (j + 1) & (cap - 1);
    slots[j] = *s;
  }
  free(ix->slots);
  *ix = grown;
  return true;
}

void cm_index_put(struct cm_index *ix, const struct cm_ixkey *k, struct cm_cache *c, uint32_t batch) {
  size_t i = cm_probe(ix, k); /* room was reserved, and k is not there */
  ix->slots[i] = (struct cm_slot){k->a, k->b, k->c, c, batch, k->kind};
  ix->n++;
}

struct cm_cache *cm_index_get(const struct cm_index *ix, const struct cm_ixkey *k, uint32_t *batch) {
  if (!ix->n) return NULL;
  const struct cm_slot *s = &ix->slots[cm_probe(ix, k)];
  if (s->cache && batch) *batch = s->batch;
  return s->cache;
}

void cm_index_del(struct cm_index *ix, const struct cm_ixkey *k, const struct cm_cache *c) {
  if (!ix->n) return;
  size_t mask = ix->cap - 1, i = cm_probe(ix, k);
  if (ix->slots[i].cache != c) return;
  ix->n--;
  /* Shift back each key after i in its run that would no longer be found past the hole:
   * one whose home is not cyclically in (i, j]. */
  for (size_t j = i;;) {
    ix->slots[i].cache = NULL;
    for (;;) {
      j = (j + 1) & mask;
      const struct cm_slot *s = &ix->slots[j];
      if (!s->cache) return;
      size_t h = cm_home(ix, s->kind, s->a, s->b, s->c);
      if (i <= j ? (h <= i || h > j) : (h <= i && h > j)) break;
    }
    ix->slots[i] = ix->slots[j];
    i = j;
  }
}

void cm_index_free(struct cm_index *ix) {
  free(ix->slots);
  ix->slots = NULL;
  ix->cap = ix->n = 0;
}

/* ---- a cache's keys ---- */

bool cm_index_add(struct cm_index *ix, struct cm_cache *c) {
  if (!cm_index_reserve(ix, c->nkeys + c->has_bkey)) return false;
  for (size_t b = 0; b < c->nkeys; b++) {
    struct cm_ixkey k = cm_ixkey_req(&c->keys[b]);
    cm_index_put(ix, &k, c, (uint32_t)b);
  }
  if (c->has_bkey) {
    struct cm_ixkey k = cm_ixkey_blocks(c->bkey.model_id);
    cm_index_put(ix, &k, c, 0);
  }
  return true;
}

void cm_index_drop(struct cm_index *ix, const struct cm_cache *c) {
  for (size_t b = 0; b < c->nkeys; b++) {
    struct cm_ixkey k = cm_ixkey_req(&c->keys[b]);
    cm_index_del(ix, &k, c);
  }
  if (c->has_bkey) {
    struct cm_ixkey k = cm_ixkey_blocks(c->bkey.model_id);
    cm_index_del(ix, &k, c);
  }
}
