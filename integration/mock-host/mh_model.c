/* mh_model: the fake model's paged KV cache, its block allocator and the function
 * that gives every byte of KV, so that whatever arrives can be checked.
 *
 * KV content: K (v = 0) or V (v = 1) of token t of layer l of a request with seed s
 * is a run of 64-bit words, word w = mix(mix(s, l, v, t) + w * golden), stored
 * little-endian; element e of the token is bytes [e * elem_size, (e + 1) *
 * elem_size) of that run, so each element is a function of (s, l, t, K/V, e). Head h
 * is elements [h * head_dim, (h + 1) * head_dim) of the run, stored where the layout
 * puts that head (mh_kv_at); an MLA layer's latent is the K run of one head. Heads are
 * the model's (global): a tensor-parallel rank holding heads [head0, head0 + n) holds
 * bytes [head0 * head bytes, (head0 + n) * head bytes) of the run, so each rank's
 * bytes are checked against its own heads and a wrong head slice shows. */
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

/* Bytes [off, off + n) of a token's run: word w of the run is mix(key + w * golden). */
static void run_fill(uint8_t *dst, uint64_t off, uint64_t n, uint64_t key) {
  if (off % 8 == 0) {
    token_fill(dst, n, key + off / 8 * GOLDEN);
    return;
  }
  uint8_t word[8];
  for (uint64_t w = off / 8, skip = off % 8; n; w++, skip = 0) {
    uint64_t take = 8 - skip < n ? 8 - skip : n;
    put_le64(word, mix64(key + w * GOLDEN));
    memcpy(dst, word + skip, take);
    dst += take;
    n -= take;
  }
}

/* The presets: name, shape, and the largest prompt by default. */
static const struct {
  struct mh_model m;
  uint64_t max_prompt;
} presets[] = {
    {{"tiny", 2, 2, 16, 2, 4, 64, MH_MODEL_STANDARD, MH_LAYOUT_KV_FIRST, 0, 0, 0, 0}, 64},
    {{"llama8b-like", 32, 8, 128, 2, 16, 0, MH_MODEL_STANDARD, MH_LAYOUT_KV_FIRST, 0, 0, 0, 0}, 4096},
    /* DeepSeek's latent: 512 + 64 rope elements of 2 bytes per token and layer. */
    {{"mla", 4, 1, 576, 2, 16, 256, MH_MODEL_MLA, MH_LAYOUT_BLOCKS_FIRST, 0, 0, 0, 0}, 1024},
    {{"hybrid", 4, 2, 16, 2, 4, 128, MH_MODEL_HYBRID, MH_LAYOUT_KV_FIRST, 0, 0, 0, 0}, 64},
    /* Grouped-query attention's 8 KV heads, small: tensor parallelism's shape, head-major. */
    {{"gqa8", 2, 8, 16, 2, 4, 64, MH_MODEL_STANDARD, MH_LAYOUT_PACKED, 0, 0, 0, 0}, 64},
};

void mh_rank_heads(uint32_t total, uint32_t rank, uint32_t world, uint32_t *first, uint32_t *count) {
  if (world <= total) {
    *count = total / world;
    *first = rank * *count;
  } else {
    *count = 1;
    *first = rank / (world / total);
  }
}

struct mh_model mh_rank_model(const struct mh_model *m, uint32_t rank, uint32_t world) {
  struct mh_model r = *m;
  r.total_heads = m->kv_heads;
  if (m->kind == MH_MODEL_MLA) /* every rank holds the whole latent */
    r.head0 = 0;
  else
    mh_rank_heads(m->kv_heads, rank, world, &r.head0, &r.kv_heads);
  return r;
}

int mh_model_preset(const char *name, struct mh_model *m, uint64_t *max_prompt) {
  if (strcmp(name, "llama8b") == 0) name = "llama8b-like";
  for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
    if (strcmp(name, presets[i].m.name) == 0) {
      *m = presets[i].m;
      *max_prompt = presets[i].max_prompt;
      return 0;
    }
  return -1;
}

uint64_t mh_token_bytes(const struct mh_model *m) {
  return (uint64_t)m->kv_heads * m->head_dim * m->elem_size;
}

uint64_t mh_block_bytes(const struct mh_model *m) { return mh_token_bytes(m) * m->block_tokens; }

uint64_t mh_blocks_for(const struct mh_model *m, uint64_t tokens) {
  return (tokens + m->block_tokens - 1) / m->block_tokens;
}

void mh_model_window(struct mh_model *m, uint64_t max_prompt) {
  if (m->kind == MH_MODEL_HYBRID) /* a quarter of the largest prompt, in whole blocks */
    m->window_tokens = (uint32_t)((mh_blocks_for(m, max_prompt) + 3) / 4 * m->block_tokens);
}

uint32_t mh_kv_parts(const struct mh_model *m) { return m->kind == MH_MODEL_MLA ? 1 : 2; }

uint32_t mh_num_groups(const struct mh_model *m) { return m->kind == MH_MODEL_HYBRID ? 2 : 1; }

uint32_t mh_layer_group(const struct mh_model *m, uint32_t layer) {
  return m->kind == MH_MODEL_HYBRID ? layer % 2 : 0;
}

void mh_group_span(const struct mh_model *m, uint32_t g, uint64_t tokens, uint64_t *offset, uint64_t *count) {
  uint64_t nb = mh_blocks_for(m, tokens), w = m->window_tokens;
  *offset = g == 0 ? 0 : nb;
  *count = g == 0 || tokens <= w ? nb : nb - (tokens - w) / m->block_tokens; /* the blocks of the last w */
}

uint64_t mh_request_blocks(const struct mh_model *m, uint64_t tokens) {
  uint64_t off = 0, n = 0;
  mh_group_span(m, mh_num_groups(m) - 1, tokens, &off, &n);
  return off + n;
}

uint64_t mh_pool_block_bytes(const struct mh_model *m) {
  return (uint64_t)mh_kv_parts(m) * m->layers * mh_block_bytes(m);
}

/* The first token layer l holds of a request of tokens, and its block list. */
static const uint64_t *layer_table(const struct mh_model *m, uint32_t l, const uint64_t *blocks,
                                   uint64_t tokens, uint64_t *first_token) {
  uint64_t off, n;
  mh_group_span(m, mh_layer_group(m, l), tokens, &off, &n);
  *first_token = (mh_blocks_for(m, tokens) - n) * m->block_tokens;
  return blocks + off;
}

uint64_t mh_request_kv_bytes(const struct mh_model *m, uint64_t tokens) {
  uint64_t bytes = 0, first;
  for (uint32_t l = 0; l < m->layers; l++) {
    layer_table(m, l, NULL, tokens, &first);
    bytes += (tokens - first) * mh_token_bytes(m) * mh_kv_parts(m);
  }
  return bytes;
}

int mh_cache_init(struct mh_cache *c, const struct mh_model *m) {
  memset(c, 0, sizeof(*c));
  c->m = *m;
  uint64_t bb = mh_block_bytes(m);
  if (!(c->layers = calloc(m->layers, sizeof(*c->layers)))) goto fail_layers;
  if (!(c->names = calloc(m->layers, sizeof(*c->names)))) goto fail_names;
  if (!(c->free_list = malloc(m->num_blocks * sizeof(*c->free_list)))) goto fail_free;
  if (!(c->owner = calloc(m->num_blocks, sizeof(*c->owner)))) goto fail_owner;
  for (uint32_t l = 0; l < m->layers; l++) {
    int n = snprintf(c->names[l], sizeof(c->names[l]), "layers.%u.attn", l);
    c->layers[l] = (hixl_kv_layer){.name = c->names[l],
                                   .name_len = (size_t)n,
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
  return -1;
}

void mh_cache_fini(struct mh_cache *c) {
  free(c->owner);
  free(c->free_list);
  free(c->layer_ids);
  free(c->planes);
  free(c->views);
  free(c->names);
  free(c->layers);
  free(c->mem);
  if (c->dev_base) mh_dev_free(c->dev, c->dev_base);
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

void mh_compute_layer(const struct mh_cache *c, uint64_t seed, uint32_t layer, const uint64_t *blocks,
                      uint64_t tokens) {
  const struct mh_model *m = &c->m;
  uint64_t tb = mh_token_bytes(m), hb = (uint64_t)m->head_dim * m->elem_size, first;
  const uint64_t *table = layer_table(m, layer, blocks, tokens, &first);
  uint64_t off = (uint64_t)m->head0 * hb;                      /* this cache's heads in the token's run */
  bool whole = m->kv_heads == 1 || c->views[layer].head == hb; /* a token's heads lie side by side */
  uint8_t *buf = whole ? NULL : malloc(tb);
  if (!whole && !buf) {
    fprintf(stderr, "mock-host: out of memory computing layer %u\n", layer);
    return;
  }
  for (int v = 0; v < (int)mh_kv_parts(m); v++)
    for (uint64_t t = first; t < tokens; t++) {
      uint64_t b = table[t / m->block_tokens - first / m->block_tokens], n = t % m->block_tokens;
      if (whole) {
        run_fill(mh_kv_at(c, layer, v, b, n, 0), off, tb, token_key(seed, layer, v, t));
        continue;
      }
      run_fill(buf, off, tb, token_key(seed, layer, v, t));
      for (uint32_t h = 0; h < m->kv_heads; h++) memcpy(mh_kv_at(c, layer, v, b, n, h), buf + h * hb, hb);
    }
  free(buf);
}

uint64_t mh_verify(const struct mh_cache *c, uint64_t seed, const uint64_t *blocks, uint64_t tokens,
                   uint32_t first_layer, uint32_t nlayers, char *where, size_t cap) {
  const struct mh_model *m = &c->m;
  uint64_t tb = mh_token_bytes(m), hb = (uint64_t)m->head_dim * m->elem_size, bad = 0, first;
  uint8_t *want = malloc(tb);
  if (!want) {
    snprintf(where, cap, "out of memory");
    return 1;
  }
  for (uint32_t l = first_layer; l < first_layer + nlayers && l < m->layers; l++) {
    const uint64_t *table = layer_table(m, l, blocks, tokens, &first);
    for (int v = 0; v < (int)mh_kv_parts(m); v++) {
      const char *part = mh_kv_parts(m) == 1 ? "latent" : v ? "V" : "K";
      for (uint64_t t = first; t < tokens; t++) {
        uint64_t b = table[t / m->block_tokens - first / m->block_tokens], n = t % m->block_tokens;
        run_fill(want, (uint64_t)m->head0 * hb, tb, token_key(seed, l, v, t));
        for (uint32_t h = 0; h < m->kv_heads; h++) {
          const uint8_t *got = mh_kv_at(c, l, v, b, n, h), *w = want + h * hb;
          if (memcmp(got, w, hb) == 0) continue;
          for (uint64_t i = 0; i < hb; i++) {
            if (got[i] == w[i]) continue;
            if (bad++ == 0 && where[0] == '\0')
              snprintf(where, cap,
                       "layer %u %s token %" PRIu64 " (block %" PRIu64 ") head %u byte %" PRIu64
                       ": 0x%02x, want 0x%02x",
                       l, part, t, b, m->head0 + h, (m->head0 + h) * hb + i, got[i], w[i]);
          }
        }
      }
    }
  }
  free(want);
  return bad;
}
