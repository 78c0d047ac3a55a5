/* mh_model: the fake model's paged KV cache, its block allocator and the function
 * that gives every byte of KV, so that whatever arrives can be checked.
 *
 * KV content: K (v = 0) or V (v = 1) of token t of layer l of a request with seed s
 * is a run of 64-bit words, word w = mix(mix(s, l, v, t) + w * golden), stored
 * little-endian; element e of the token is bytes [e * elem_size, (e + 1) *
 * elem_size) of that run, so each element is a function of (s, l, t, K/V, e). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mh.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline uint64_t token_key(uint64_t seed, uint32_t layer, int v, uint64_t token) {
  return mix64(seed ^ ((uint64_t)layer << 48) ^ ((uint64_t)v << 47) ^ (token * GOLDEN));
}

static inline void put_le64(uint8_t *p, uint64_t x) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}

/* One token's K or V bytes, as the function gives them. */
static void token_fill(uint8_t *dst, uint64_t n, uint64_t key) {
  uint64_t w = 0;
  for (; (w + 1) * 8 <= n; w++) put_le64(dst + w * 8, mix64(key + w * GOLDEN));
  if (w * 8 < n) {
    uint8_t tail[8];
    put_le64(tail, mix64(key + w * GOLDEN));
    memcpy(dst + w * 8, tail, n - w * 8);
  }
}

uint64_t mh_token_bytes(const struct mh_model *m) {
  return (uint64_t)m->kv_heads * m->head_dim * m->elem_size;
}

uint64_t mh_block_bytes(const struct mh_model *m) { return mh_token_bytes(m) * m->block_tokens; }

uint64_t mh_blocks_for(const struct mh_model *m, uint64_t tokens) {
  return (tokens + m->block_tokens - 1) / m->block_tokens;
}

int mh_cache_init(struct mh_cache *c, const struct mh_model *m, bool own_memory) {
  memset(c, 0, sizeof(*c));
  c->m = *m;
  uint64_t bb = mh_block_bytes(m), per_layer = 2 * m->num_blocks * bb;
  c->len = (size_t)(per_layer * m->layers);
  if (own_memory && !(c->mem = calloc(1, c->len))) {
    fprintf(stderr,
            "mock-host: cannot allocate a KV cache of %zu bytes (%" PRIu64 " blocks); lower --kv-mib\n",
            c->len, m->num_blocks);
    goto fail_mem;
  }
  if (!(c->layers = calloc(m->layers, sizeof(*c->layers)))) goto fail_layers;
  if (!(c->names = calloc(m->layers, sizeof(*c->names)))) goto fail_names;
  if (!(c->free_list = malloc(m->num_blocks * sizeof(*c->free_list)))) goto fail_free;
  if (!(c->owner = calloc(m->num_blocks, sizeof(*c->owner)))) goto fail_owner;
  for (uint32_t l = 0; l < m->layers; l++) {
    int n = snprintf(c->names[l], sizeof(c->names[l]), "layers.%u.attn", l);
    c->layers[l] = (hixl_kv_layer){.name = c->names[l],
                                   .name_len = (size_t)n,
                                   .base = own_memory ? (uintptr_t)(c->mem + l * per_layer) : 0,
                                   .num_blocks = m->num_blocks,
                                   .block_bytes = bb,
                                   .v_offset = m->num_blocks * bb,
                                   .layout = HIXL_KV_LAYOUT_KV_FIRST,
                                   .elem_size = m->elem_size,
                                   .block_tokens = m->block_tokens};
  }
  /* Hand out low block ids first, as a fresh runtime does. */
  for (uint64_t b = 0; b < m->num_blocks; b++) c->free_list[b] = m->num_blocks - 1 - b;
  c->nfree = m->num_blocks;
  return 0;

fail_owner:
  free(c->free_list);
fail_free:
  free(c->names);
fail_names:
  free(c->layers);
fail_layers:
  free(c->mem);
fail_mem:
  return -1;
}

void mh_cache_fini(struct mh_cache *c) {
  free(c->owner);
  free(c->free_list);
  free(c->names);
  free(c->layers);
  free(c->mem);
  memset(c, 0, sizeof(*c));
}

bool mh_alloc(struct mh_cache *c, uint64_t n, uint32_t owner, uint64_t *out) {
  if (n > c->nfree) return false;
  for (uint64_t i = 0; i < n; i++) {
    out[i] = c->free_list[--c->nfree];
    c->owner[out[i]] = owner;
  }
  return true;
}

void mh_free(struct mh_cache *c, const uint64_t *blocks, uint64_t n) {
  /* Last block first: the next allocation gets them back in the request's order, so
   * runs of adjacent blocks (one engine op each) survive reuse. */
  for (uint64_t i = n; i-- > 0;) {
    if (blocks[i] >= c->m.num_blocks || c->owner[blocks[i]] == 0) {
      fprintf(stderr, "mock-host: block %" PRIu64 " freed twice or out of range (host bug)\n", blocks[i]);
      continue;
    }
    c->owner[blocks[i]] = 0;
    c->free_list[c->nfree++] = blocks[i];
  }
}

static uint8_t *token_at(const struct mh_cache *c, uint32_t layer, int v, const uint64_t *blocks,
                         uint64_t t) {
  const hixl_kv_layer *l = &c->layers[layer];
  uint64_t tb = mh_token_bytes(&c->m);
  return (uint8_t *)l->base + (v ? l->v_offset : 0) + blocks[t / c->m.block_tokens] * l->block_bytes +
         (t % c->m.block_tokens) * tb;
}

void mh_compute_layer(const struct mh_cache *c, uint64_t seed, uint32_t layer, const uint64_t *blocks,
                      uint64_t tokens) {
  uint64_t tb = mh_token_bytes(&c->m);
  for (int v = 0; v < 2; v++)
    for (uint64_t t = 0; t < tokens; t++)
      token_fill(token_at(c, layer, v, blocks, t), tb, token_key(seed, layer, v, t));
}

uint64_t mh_verify(const struct mh_cache *c, uint64_t seed, const uint64_t *blocks, uint64_t tokens,
                   uint32_t first_layer, uint32_t nlayers, char *where, size_t cap) {
  uint64_t tb = mh_token_bytes(&c->m), bad = 0;
  uint8_t *want = malloc(tb);
  if (!want) {
    snprintf(where, cap, "out of memory");
    return 1;
  }
  for (uint32_t l = first_layer; l < first_layer + nlayers && l < c->m.layers; l++)
    for (int v = 0; v < 2; v++)
      for (uint64_t t = 0; t < tokens; t++) {
        const uint8_t *got = token_at(c, l, v, blocks, t);
        token_fill(want, tb, token_key(seed, l, v, t));
        if (memcmp(got, want, tb) == 0) continue;
        for (uint64_t i = 0; i < tb; i++) {
          if (got[i] == want[i]) continue;
          if (bad++ == 0 && where[0] == '\0')
            snprintf(where, cap,
                     "layer %u %s token %" PRIu64 " (block %" PRIu64 ") byte %" PRIu64
                     ": 0x%02x, want 0x%02x",
                     l, v ? "V" : "K", t, blocks[t / c->m.block_tokens], i, got[i], want[i]);
        }
      }
  free(want);
  return bad;
}
