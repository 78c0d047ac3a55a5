/* test_plugin_layouts: KV caches in every layout a runtime lays out, described to the
 * plugin as groups of planes (ABI 1.3, register_kv_groups) the way a runtime's adapter
 * describes them: from each tensor's shape, strides (in elements) and element size.
 * For each layout a producer and a consumer whose num_blocks differ (so their bases
 * and strides differ) hand a request over, pulled and pushed, into other block ids,
 * and every byte of the consumer's memory is checked: its request blocks hold what the
 * producer computed, every other byte still 0xEE. Then a hybrid model (a full-attention
 * and a sliding-window group) and peers that describe different groups. This program
 * includes only the plugin's ABI header: it links nothing of hixl. */

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hixl/hixl_kv_connector.h"
#include "kv_host.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

static void *so;
static const hixl_kv_ops *ops;

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      fprintf(stderr, "%s:%d: %s -> %u, want %u (%s)\n", __FILE__, __LINE__, #expr, st_, (unsigned)(want),   \
              ops->last_error());                                                                            \
    CU_ASSERT_EQUAL(st_, (hixl_kv_status)(want));                                                            \
  } while (0)

/* ---- the host's surroundings (no hixl) ---- */

/* A bare hixl configuration document for role and mode ("pull" or "push"). */
static char *config(char *buf, size_t cap, const char *role, const char *mode) {
  snprintf(
      buf, cap,
      "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": 10000,\n"
      " \"load_failure_policy\": \"fail\", \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000,\n"
      " \"Transport\": \"%s\"}\n",
      test_ip(), (unsigned)free_port(), role, mode, transport());
  return buf;
}

/* ---- the model: small shapes, so every byte is checked quickly ---- */

enum {
  M_LAYERS = 3,
  M_HEADS = 2,
  M_TOKENS = 4,   /* tokens per block */
  M_HEAD_DIM = 8, /* K and V apart; the named layouts pack both: C = 2 * M_HEAD_DIM */
  M_ELEM = 2,
  M_LATENT = 576, /* MLA: kv_lora_rank 512 + rope 64, one latent per token */
  P_BLOCKS = 16,  /* the producer's num_blocks */
  C_BLOCKS = 24,  /* the consumer's */
  MAX_DIMS = 6,
  MAX_TENSORS = 8,
  MAX_PLANES = 16,
  MAX_GROUPS = 2,
  GAP = 64, /* 0xEE bytes between tensors: a write past a tensor shows */
};

/* A tensor as the runtime's tensor object reports it. */
struct tensor {
  size_t off; /* from the side's memory */
  int ndim;
  uint64_t shape[MAX_DIMS];
  uint64_t stride[MAX_DIMS]; /* in elements */
  uint32_t elem;
  int block_dim, layer_dim; /* layer_dim -1: one layer's tensor */
  int kv_dim, head_dim;     /* -1: none */
  uint32_t layer[M_LAYERS]; /* the model layer of each index of layer_dim (or the one layer) */
  size_t group;
};

/* Row-major strides for the shape as stored. */
static void contiguous(struct tensor *t) {
  uint64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    t->stride[d] = s;
    s *= t->shape[d];
  }
}

static uint64_t tensor_bytes(const struct tensor *t) {
  uint64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (t->shape[d] - 1) * t->stride[d];
  return (last + 1) * t->elem;
}

/* ---- planes from a tensor's shape, strides and element size (the adapter) ---- */

/* Whether the dims of t in mask (a bit per dim) are one dense run: taken by falling
 * stride, each steps over exactly the next one's extent, the last over one element. */
static bool dense(const struct tensor *t, unsigned mask) {
  int order[MAX_DIMS], n = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (!(mask >> d & 1u) || t->shape[d] == 1) continue;
    int i = n++;
    for (; i > 0 && t->stride[order[i - 1]] < t->stride[d]; i--) order[i] = order[i - 1];
    order[i] = d;
  }
  uint64_t want = 1;
  for (int i = n - 1; i >= 0; i--) {
    if (t->stride[order[i]] != want) return false;
    want *= t->shape[order[i]];
  }
  return true;
}

/* The plane of a view of t whose `fixed` dims (a mask) are folded into base: the
 * block dim numbers the blocks, every other dim lies inside a block. When those are
 * not one dense run, the head dim cuts a block into pieces that are. 0, or -1 when no
 * plane describes the view. */
static int plane_of(const struct tensor *t, uintptr_t base, unsigned fixed, int block_dim, int head_dim,
                    hixl_kv_plane *p) {
  unsigned inner = ((1u << t->ndim) - 1) & ~fixed & ~(1u << block_dim);
  uint64_t elems = 1;
  for (int d = 0; d < t->ndim; d++)
    if (inner >> d & 1u) elems *= t->shape[d];
  *p = (hixl_kv_plane){
      .base = base, .block_stride = t->stride[block_dim] * t->elem, .block_bytes = elems * t->elem};
  if (dense(t, inner)) return 0;
  if (head_dim < 0 || !(inner >> head_dim & 1u) || !dense(t, inner & ~(1u << head_dim))) return -1;
  p->num_heads = (uint32_t)t->shape[head_dim];
  p->head_stride = t->stride[head_dim] * t->elem;
  return 0;
}

/* KV first, one layer's tensor (2, B, ...): a K plane and a V plane. Planes written,
 * or -1. */
static int planes_kv_first(const struct tensor *t, uintptr_t mem, int kv_dim, int block_dim, int head_dim,
                           hixl_kv_plane *out) {
  for (uint64_t kv = 0; kv < 2; kv++) {
    uintptr_t base = mem + t->off + kv * t->stride[kv_dim] * t->elem;
    if (plane_of(t, base, 1u << kv_dim, block_dim, head_dim, &out[kv])) return -1;
  }
  return 2;
}

/* Blocks first (B, ...): one plane; a cross-layer tensor's block holds every layer. */
static int planes_blocks_first(const struct tensor *t, uintptr_t mem, int block_dim, int head_dim,
                               hixl_kv_plane *out) {
  return plane_of(t, mem + t->off, 0, block_dim, head_dim, out) ? -1 : 1;
}

/* One buffer for every layer (vLLM's named layouts): layer li's strided view, one
 * plane. */
static int planes_layer_view(const struct tensor *t, uintptr_t mem, int layer_dim, int block_dim,
                             int head_dim, uint64_t li, hixl_kv_plane *out) {
  uintptr_t base = mem + t->off + li * t->stride[layer_dim] * t->elem;
  return plane_of(t, base, 1u << layer_dim, block_dim, head_dim, out) ? -1 : 1;
}

/* ---- layouts and the groups a case registers ---- */

enum fam {
  FAM_KV_FIRST,     /* per layer (2, B, N, H, D) */
  FAM_BLOCKS_FIRST, /* per layer (B, 2, N, H, D) */
  FAM_PACKED,       /* per layer (B, H, N, 2D) */
  FAM_MLA,          /* per layer (B, N, latent) */
  FAM_NAMED,        /* one buffer stored in the order `layout` names, seen as (L, B, H, N, C) */
  FAM_CROSS,        /* one buffer (B, L, 2, N, H, D) */
};

struct gspec {
  enum fam fam;
  const char *layout; /* the name registered (FAM_NAMED: also the storage order) */
  uint32_t kind, num_layers;
  const uint32_t *layer_ids; /* NULL: first_layer, first_layer + 1, ... */
  uint32_t first_layer, window;
  uint32_t heads; /* 0: M_HEADS; the head dim keeps M_HEADS * M_HEAD_DIM channels */
};

struct kcase {
  const char *name;
  size_t ng;
  struct gspec g[MAX_GROUPS];
  bool plugin_mem; /* the tensors in alloc_kv_memory's memory, not the host's */
  bool groups_ops; /* the scheduler's _groups ops even with one group */
};

/* One side of a hand-off: its connectors, its memory and how it described it. */
struct side {
  const struct kcase *k;
  hixl_kv_connector *sched, *worker;
  uint8_t *mem;
  size_t len;
  bool host_mem; /* mem is the host's, freed by side_down */
  struct tensor t[MAX_TENSORS];
  size_t nt;
  hixl_kv_plane planes[MAX_PLANES];
  hixl_kv_group g[MAX_GROUPS];
};

static uint32_t model_layer(const struct gspec *g, uint32_t i) {
  return g->layer_ids ? g->layer_ids[i] : g->first_layer + i;
}

static struct tensor *add_tensor(struct side *s, size_t group, int ndim, const uint64_t *shape) {
  struct tensor *t = &s->t[s->nt++];
  *t = (struct tensor){
      .ndim = ndim, .elem = M_ELEM, .layer_dim = -1, .kv_dim = -1, .head_dim = -1, .group = group};
  memcpy(t->shape, shape, sizeof(uint64_t) * (size_t)ndim);
  contiguous(t);
  return t;
}

/* vLLM's named layout, stored in the order g->layout names (its letters L, B, H, N, C)
 * and seen, as the runtime's view reports it, as (L, B, H, N, C) with the strides of
 * that storage. */
static void add_named(struct side *s, size_t group, const struct gspec *g, uint64_t nb, uint64_t heads) {
  const char *logical = "LBHNC";
  uint64_t size[5] = {g->num_layers, nb, heads, M_TOKENS, 2 * M_HEADS * M_HEAD_DIM / heads}, stored[5];
  for (int i = 0; i < 5; i++) stored[i] = size[strchr(logical, g->layout[i]) - logical];
  struct tensor *t = add_tensor(s, group, 5, stored); /* the storage's strides ... */
  uint64_t st[5];
  for (int i = 0; i < 5; i++) st[strchr(logical, g->layout[i]) - logical] = t->stride[i];
  memcpy(t->shape, size, sizeof(size)); /* ... seen in the logical order */
  memcpy(t->stride, st, sizeof(st));
  t->layer_dim = 0, t->block_dim = 1, t->head_dim = 2;
  for (uint32_t i = 0; i < g->num_layers; i++) t->layer[i] = model_layer(g, i);
}

/* The tensors of every group, placed one after the other with GAP bytes between. */
static void side_layout(struct side *s, const struct kcase *k, uint64_t nb) {
  for (size_t gi = 0; gi < k->ng; gi++) {
    const struct gspec *g = &k->g[gi];
    uint64_t h = g->heads ? g->heads : M_HEADS, hd = M_HEADS * M_HEAD_DIM / h;
    if (g->fam == FAM_NAMED) {
      add_named(s, gi, g, nb, h);
    } else if (g->fam == FAM_CROSS) {
      struct tensor *t = add_tensor(s, gi, 6, (uint64_t[]){nb, g->num_layers, 2, M_TOKENS, h, hd});
      t->block_dim = 0, t->layer_dim = 1, t->head_dim = 4;
      for (uint32_t i = 0; i < g->num_layers; i++) t->layer[i] = model_layer(g, i);
    } else {
      for (uint32_t i = 0; i < g->num_layers; i++) {
        struct tensor *t;
        switch (g->fam) {
        case FAM_KV_FIRST:
          t = add_tensor(s, gi, 5, (uint64_t[]){2, nb, M_TOKENS, h, hd});
          t->kv_dim = 0, t->block_dim = 1, t->head_dim = 3;
          break;
        case FAM_BLOCKS_FIRST:
          t = add_tensor(s, gi, 5, (uint64_t[]){nb, 2, M_TOKENS, h, hd});
          t->block_dim = 0, t->head_dim = 3;
          break;
        case FAM_PACKED:
          t = add_tensor(s, gi, 4, (uint64_t[]){nb, h, M_TOKENS, 2 * hd});
          t->block_dim = 0, t->head_dim = 1;
          break;
        default: /* FAM_MLA */
          t = add_tensor(s, gi, 3, (uint64_t[]){nb, M_TOKENS, M_LATENT});
          t->block_dim = 0;
          break;
        }
        t->layer[0] = model_layer(g, i);
      }
    }
  }
  for (size_t i = 0; i < s->nt; i++) {
    s->t[i].off = s->len;
    s->len += tensor_bytes(&s->t[i]) + GAP;
  }
}

/* Each group's planes from its tensors at mem, and the groups around them. 0, or -1
 * when a tensor is one no plane describes. */
static int side_planes(struct side *s, const struct kcase *k, uintptr_t mem, uint64_t nb) {
  size_t np = 0;
  for (size_t gi = 0; gi < k->ng; gi++) {
    const struct gspec *g = &k->g[gi];
    size_t first = np;
    for (size_t i = 0; i < s->nt; i++) {
      const struct tensor *t = &s->t[i];
      int got = 0;
      if (t->group != gi) continue;
      if (g->fam == FAM_KV_FIRST) {
        got = planes_kv_first(t, mem, t->kv_dim, t->block_dim, t->head_dim, &s->planes[np]);
      } else if (g->fam == FAM_NAMED) {
        for (uint64_t li = 0; li < t->shape[t->layer_dim] && got >= 0; li++)
          got = planes_layer_view(t, mem, t->layer_dim, t->block_dim, t->head_dim, li, &s->planes[np + li]);
        got = got < 0 ? -1 : (int)t->shape[t->layer_dim];
      } else {
        got = planes_blocks_first(t, mem, t->block_dim, t->head_dim, &s->planes[np]);
      }
      if (got < 0) return -1;
      np += (size_t)got;
    }
    bool cross = g->fam == FAM_CROSS;
    s->g[gi] = (hixl_kv_group){
        .size = sizeof(hixl_kv_group),
        .kind = g->kind,
        .flags = cross ? HIXL_KV_GROUP_CROSS_LAYER : 0,
        .num_layers = g->num_layers,
        .layer_ids = g->layer_ids,
        .first_layer = g->first_layer,
        .planes_per_layer = (uint32_t)(cross ? np - first : (np - first) / g->num_layers),
        .planes = &s->planes[first],
        .num_blocks = nb,
        .block_tokens = M_TOKENS,
        .elem_size = M_ELEM,
        .window_tokens = g->window,
        .layout = g->layout,
        .layout_len = strlen(g->layout),
    };
  }
  return 0;
}

/* ---- the pattern: what the producer computed, by (layer, position in the request,
 * element of the block, byte) ---- */

static uint8_t pat(uint64_t seed, uint32_t layer, uint64_t pos, uint64_t rest, uint32_t byte) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)layer << 56 ^ pos << 44 ^ rest << 3 ^ byte;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (uint8_t)(x >> 24);
}

typedef bool (*visit_fn)(void *ctx, size_t off, uint32_t layer, uint64_t rest, uint32_t byte);

/* Every byte of block `block` of t (of layer index li only, when t holds layers and
 * li >= 0), in logical order: its offset in the side's memory, model layer, index
 * among the block's elements of that layer, and byte of the element. False when fn
 * stopped the walk. */
static bool walk(const struct tensor *t, uint64_t block, int li, visit_fn fn, void *ctx) {
  uint64_t idx[MAX_DIMS] = {0};
  bool one_layer = t->layer_dim >= 0 && li >= 0;
  idx[t->block_dim] = block;
  if (one_layer) idx[t->layer_dim] = (uint64_t)li;
  for (;;) {
    uint64_t el = 0, rest = 0;
    for (int d = 0; d < t->ndim; d++) {
      el += idx[d] * t->stride[d];
      if (d != t->block_dim && d != t->layer_dim) rest = rest * t->shape[d] + idx[d];
    }
    uint32_t layer = t->layer[t->layer_dim >= 0 ? idx[t->layer_dim] : 0];
    for (uint32_t b = 0; b < t->elem; b++)
      if (!fn(ctx, t->off + el * t->elem + b, layer, rest, b)) return false;
    int d = t->ndim - 1;
    for (; d >= 0; d--) {
      if (d == t->block_dim || (one_layer && d == t->layer_dim)) continue;
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return true;
  }
}

struct paint {
  uint8_t *image;
  uint64_t seed, pos;
  int64_t as_layer; /* check: compare with this layer's pattern; -1: the byte's own */
  size_t bad;
};

static bool paint_byte(void *ctx, size_t off, uint32_t layer, uint64_t rest, uint32_t byte) {
  struct paint *p = ctx;
  p->image[off] = pat(p->seed, layer, p->pos, rest, byte);
  return true;
}

static bool check_byte(void *ctx, size_t off, uint32_t layer, uint64_t rest, uint32_t byte) {
  struct paint *p = ctx;
  p->bad +=
      p->image[off] != pat(p->seed, p->as_layer >= 0 ? (uint32_t)p->as_layer : layer, p->pos, rest, byte);
  return p->bad == 0;
}

/* Which layer index of t holds model layer `layer`: -1 the whole tensor (layer -1:
 * every layer), -2 none. */
static int layer_index(const struct tensor *t, int layer) {
  if (layer < 0) return -1;
  if (t->layer_dim < 0) return t->layer[0] == (uint32_t)layer ? -1 : -2;
  for (uint64_t li = 0; li < t->shape[t->layer_dim]; li++)
    if (t->layer[li] == (uint32_t)layer) return (int)li;
  return -2;
}

/* Into image (laid out as s's memory): group g's blocks[0..n) hold the request's
 * positions pos0, pos0 + 1, ..., of model layer `layer` (-1: every layer). */
static void paint_group(const struct side *s, size_t g, uint8_t *image, uint64_t seed, const uint64_t *blocks,
                        size_t n, size_t pos0, int layer) {
  for (size_t i = 0; i < s->nt; i++) {
    int li = layer_index(&s->t[i], layer);
    for (size_t j = 0; s->t[i].group == g && li > -2 && j < n; j++) {
      struct paint p = {image, seed, pos0 + j, -1, 0};
      walk(&s->t[i], blocks[j], li, paint_byte, &p);
    }
  }
}

/* ---- saying precisely what landed where when memory differs from what it should ---- */

struct diff {
  const uint8_t *got, *want;
  size_t bad, written; /* bytes that differ; bytes not 0xEE */
};

static bool diff_byte(void *ctx, size_t off, uint32_t layer, uint64_t rest, uint32_t byte) {
  struct diff *x = ctx;
  (void)layer, (void)rest, (void)byte;
  x->bad += x->got[off] != x->want[off];
  x->written += x->got[off] != 0xEE;
  return true;
}

/* Model layer `layer` of s's memory, every block: as want has it (1), all 0xEE (0), or
 * neither (-1). */
static int layer_state(const struct side *s, const uint8_t *want, int layer) {
  struct diff x = {s->mem, want, 0, 0};
  for (size_t i = 0; i < s->nt; i++) {
    int li = layer_index(&s->t[i], layer);
    for (uint64_t b = 0; li > -2 && b < s->t[i].shape[s->t[i].block_dim]; b++)
      walk(&s->t[i], b, li, diff_byte, &x);
  }
  return x.bad == 0 ? 1 : x.written == 0 ? 0 : -1;
}

/* Block `block` (layer index li) of t as got holds it: which producer layer and
 * request position's pattern, if any. */
static bool whose(const struct tensor *t, uint64_t block, int li, const uint8_t *got, uint64_t seed,
                  uint32_t *layer, uint64_t *pos) {
  for (uint32_t l = 0; l < M_LAYERS; l++)
    for (uint64_t p = 0; p < C_BLOCKS; p++) {
      struct paint c = {(uint8_t *)got, seed, p, l, 0};
      if (walk(t, block, li, check_byte, &c)) {
        *layer = l, *pos = p;
        return true;
      }
    }
  return false;
}

/* Compares s's memory with want; on a difference prints, per block of each tensor
 * (and layer) that differs, what it holds instead, and the bytes between tensors that
 * changed. True when equal. */
static bool memory_is(const struct side *s, const uint8_t *want, uint64_t seed, const char *who) {
  if (memcmp(s->mem, want, s->len) == 0) return true;
  size_t total = 0, in_blocks = 0, lines = 0;
  for (size_t i = 0; i < s->len; i++) total += s->mem[i] != want[i];
  for (size_t i = 0; i < s->nt; i++) {
    const struct tensor *t = &s->t[i];
    int nl = t->layer_dim >= 0 ? (int)t->shape[t->layer_dim] : 1;
    for (uint64_t b = 0; b < t->shape[t->block_dim]; b++)
      for (int li = 0; li < nl; li++) {
        struct diff x = {s->mem, want, 0, 0};
        walk(t, b, t->layer_dim >= 0 ? li : -1, diff_byte, &x);
        if (!x.bad) continue;
        in_blocks += x.bad;
        if (lines++ >= 24) continue;
        uint32_t l = 0;
        uint64_t p = 0;
        char what[96] = "untouched (0xEE), a block it should hold";
        if (x.written && whose(t, b, t->layer_dim >= 0 ? li : -1, s->mem, seed, &l, &p))
          snprintf(what, sizeof(what), "holds the producer's layer %u, request position %llu", l,
                   (unsigned long long)p);
        else if (x.written)
          snprintf(what, sizeof(what), "%zu bytes written, no layer's or position's pattern", x.written);
        fprintf(stderr, "  %s %s: tensor %zu (group %zu) layer %u block %llu: %zu bytes differ: %s\n",
                s->k->name, who, i, t->group, t->layer[t->layer_dim >= 0 ? li : 0], (unsigned long long)b,
                x.bad, what);
      }
  }
  if (total > in_blocks)
    fprintf(stderr, "  %s %s: %zu bytes between tensors changed\n", s->k->name, who, total - in_blocks);
  fprintf(stderr, "  %s %s: %zu bytes differ in all\n", s->k->name, who, total);
  return false;
}

/* ---- a side: a scheduler and a worker connector, and the KV memory ---- */

/* Lays k's tensors out in memory of num_blocks nb (from alloc_kv_memory on worker
 * when k->plugin_mem, else the host's), fills it with 0xEE and derives the planes. */
static hixl_kv_status side_mem(struct side *s, const struct kcase *k, uint64_t nb,
                               hixl_kv_connector *worker) {
  s->k = k;
  side_layout(s, k, nb);
  if (k->plugin_mem && worker) {
    uintptr_t base = 0;
    hixl_kv_status st = ops->alloc_kv_memory(worker, s->len, &base);
    if (st != HIXL_KV_SUCCESS) {
      fprintf(stderr, "alloc_kv_memory %s: %s\n", k->name, ops->last_error());
      return st;
    }
    s->mem = (uint8_t *)base;
  } else {
    s->mem = aligned_alloc(4096, (s->len + 4095) / 4096 * 4096);
    if (!s->mem) return HIXL_KV_RESOURCE_EXHAUSTED;
    s->host_mem = true;
  }
  memset(s->mem, 0xEE, s->len);
  if (side_planes(s, k, (uintptr_t)s->mem, nb) != 0) {
    fprintf(stderr, "%s: a tensor no plane describes\n", k->name);
    return HIXL_KV_PARAM_INVALID;
  }
  return HIXL_KV_SUCCESS;
}

/* Creates s's connectors, its memory (side_mem) and registers the planes. */
static hixl_kv_status side_up(struct side *s, const struct kcase *k, uint64_t nb, const char *role,
                              const char *mode) {
  char cfg[512], err[256] = "";
  memset(s, 0, sizeof(*s));
  s->k = k;
  config(cfg, sizeof(cfg), role, mode);
  hixl_kv_status st =
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s->sched, err, sizeof(err));
  if (st == HIXL_KV_SUCCESS)
    st = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &s->worker, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    fprintf(stderr, "create %s: %s\n", role, err);
    return st;
  }
  st = side_mem(s, k, nb, s->worker);
  if (st != HIXL_KV_SUCCESS) return st;
  st = ops->register_kv_groups(s->worker, s->g, k->ng);
  if (st != HIXL_KV_SUCCESS)
    fprintf(stderr, "register_kv_groups %s %s: %s\n", k->name, role, ops->last_error());
  return st;
}

static void side_down(struct side *s) {
  if (s->worker) ST_IS(ops->destroy(s->worker), HIXL_KV_SUCCESS);
  if (s->sched) ST_IS(ops->destroy(s->sched), HIXL_KV_SUCCESS);
  if (s->host_mem) free(s->mem);
}

/* One step of metadata from the scheduler to the worker. */
static void step(struct side *s) { kv_host_step(ops, s->sched, s->worker); }

enum { SENDING, RECVING };

/* Steps s until id shows in its worker's sending or receiving list, waiting on the
 * event fd between steps; false after timeout_ms. */
static bool wait_finished(struct side *s, const char *id, int which, int timeout_ms) {
  int32_t fd = -1;
  ST_IS(ops->get_event_fd(s->worker, &fd), HIXL_KV_SUCCESS);
  int64_t end = now_ms() + timeout_ms;
  do {
    hixl_kv_ids sent = {0}, recv = {0};
    step(s);
    if (ops->get_finished(s->worker, NULL, &sent, &recv) != HIXL_KV_SUCCESS) return false;
    bool got = ids_have(which == RECVING ? &recv : &sent, id);
    ops->free_ids(&sent);
    ops->free_ids(&recv);
    if (got) return true;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    poll(&pfd, 1, 50);
  } while (now_ms() < end);
  return false;
}

static hixl_kv_request request(const char *id, uint64_t tokens, const char *params) {
  return (hixl_kv_request){id, strlen(id), tokens, params, params ? strlen(params) : 0, 0};
}

/* A request's block ids, one list per group. */
struct lists {
  const uint64_t *ids[MAX_GROUPS];
  size_t n[MAX_GROUPS];
};

/* b as the _groups ops take it; true when s's scheduler uses them (several groups, or
 * the case asks), false for the 1.0 ops (one group). */
static bool as_groups(const struct side *s, const struct lists *b, hixl_kv_block_ids *g) {
  for (size_t i = 0; i < s->k->ng; i++) g[i] = (hixl_kv_block_ids){b->ids[i], b->n[i]};
  return s->k->groups_ops || s->k->ng > 1;
}

static hixl_kv_status sched_alloc(struct side *s, const hixl_kv_request *r, const struct lists *b,
                                  uint64_t tokens) {
  hixl_kv_block_ids g[MAX_GROUPS];
  if (as_groups(s, b, g)) return ops->update_state_after_alloc_groups(s->sched, r, g, s->k->ng, tokens);
  return ops->update_state_after_alloc(s->sched, r, b->ids[0], b->n[0], tokens);
}

static hixl_kv_status sched_finished(struct side *s, const hixl_kv_request *r, const struct lists *b,
                                     int32_t *delay, hixl_kv_buffer *params) {
  hixl_kv_block_ids g[MAX_GROUPS];
  if (as_groups(s, b, g)) return ops->request_finished_groups(s->sched, r, g, s->k->ng, delay, params);
  return ops->request_finished(s->sched, r, b->ids[0], b->n[0], delay, params);
}

/* The kv_transfer_params the plugin returned, as a string of the host's. */
static char *take_text(hixl_kv_buffer *b) {
  char *t = b->data ? strndup((char *)b->data, b->len) : NULL;
  ops->free_buffer(b);
  return t;
}

/* The matched tokens of a consumer's request: (tokens, async 1). */
static int64_t matched(struct side *d, const hixl_kv_request *r, uint64_t computed) {
  int64_t tokens = -2;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, r, computed, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(async, 1);
  return tokens;
}

/* ---- hand-offs ---- */

struct plan {
  const struct kcase *prod, *cons;
  bool push;
  struct lists pb, cb; /* the producer's and the consumer's blocks of the request */
  bool mismatch;       /* they describe different groups: the load fails, nothing moves */
};

/* Which of group g's blocks move where: the consumer's [*c0, *c0 + n) receive the
 * producer's [*p0, *p0 + n). Pull: the consumer's blocks get the producer's last ones
 * (its leading blocks are cached locally); push: the producer's go into the consumer's
 * first, a sliding window's into its last. */
static size_t pairing(const struct plan *pl, size_t g, size_t *p0, size_t *c0) {
  size_t np = pl->pb.n[g], nc = pl->cb.n[g], n = np < nc ? np : nc;
  bool sliding = pl->cons->g[g].kind == HIXL_KV_GROUP_SLIDING_WINDOW;
  *p0 = pl->push ? 0 : np - n;
  *c0 = pl->push && sliding ? nc - n : 0;
  return n;
}

/* One hand-off under way. */
struct run {
  const struct plan *pl;
  struct side *p, *d;
  uint64_t seed;
  const uint8_t *d_want; /* the consumer's memory once the request landed */
  const char *id;
};

/* The producer's forward pass computes model layer l of the request into its blocks. */
static void compute_layer(const struct run *r, int l) {
  for (size_t g = 0; g < r->pl->prod->ng; g++)
    paint_group(r->p, g, r->p->mem, r->seed, r->pl->pb.ids[g], r->pl->pb.n[g], 0, l);
}

/* Pull: the producer computes and saves every layer, finishes the request and holds
 * its blocks; the consumer matches, allocates and loads. */
static void pull_run(const struct run *x) {
  const struct plan *pl = x->pl;
  uint64_t prompt = pl->pb.n[0] * M_TOKENS, computed = (pl->pb.n[0] - pl->cb.n[0]) * M_TOKENS;
  hixl_kv_request r = request(x->id, prompt, NULL);
  int32_t delay = 0;
  hixl_kv_buffer params = {0};
  for (int l = 0; l < M_LAYERS; l++) {
    compute_layer(x, l);
    ST_IS(ops->save_kv_layer(x->p->worker, (uint32_t)l), HIXL_KV_SUCCESS);
  }
  ST_IS(ops->wait_for_save(x->p->worker), HIXL_KV_SUCCESS);
  ST_IS(sched_finished(x->p, &r, &pl->pb, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  step(x->p); /* the producer's worker holds the blocks */
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  hixl_kv_request q = request(x->id, prompt, text);
  int64_t tokens = matched(x->d, &q, computed);
  CU_ASSERT_EQUAL(tokens, (int64_t)(prompt - computed));
  ST_IS(sched_alloc(x->d, &q, &pl->cb, (uint64_t)tokens), HIXL_KV_SUCCESS);
  step(x->d);
  CU_ASSERT_TRUE(wait_finished(x->d, x->id, RECVING, 20000));
  CU_ASSERT_TRUE(wait_finished(x->p, x->id, SENDING, 20000)); /* freed by the consumer (or told to) */
  free(text);
}

/* Push: the consumer allocates first and hands its blocks to the producer, which
 * computes layer by layer; a layer-wise group's layer l has landed once
 * wait_for_layer_load(l) returns, before l + 1 is computed (so a layer sent early would
 * carry what was not computed yet). A cross-layer group lands after the last layer. */
static void push_run(const struct run *x) {
  const struct plan *pl = x->pl;
  bool cross = false;
  for (size_t g = 0; g < pl->cons->ng; g++) cross |= pl->cons->g[g].fam == FAM_CROSS;
  hixl_kv_request r = request(x->id, pl->cb.n[0] * M_TOKENS, "{\"do_remote_prefill\": true}");
  int64_t tokens = matched(x->d, &r, 0);
  CU_ASSERT_EQUAL(tokens, (int64_t)(pl->cb.n[0] * M_TOKENS));
  ST_IS(sched_alloc(x->d, &r, &pl->cb, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(x->d->sched, x->id, strlen(x->id), &params), HIXL_KV_SUCCESS);
  step(x->d); /* the consumer's worker expects the push */
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  hixl_kv_request q = request(x->id, pl->pb.n[0] * M_TOKENS, text);
  int64_t none = -2;
  int32_t async = 1;
  ST_IS(ops->get_num_new_matched_tokens(x->p->sched, &q, 0, &none, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(none, 0);
  ST_IS(sched_alloc(x->p, &q, &pl->pb, 0), HIXL_KV_SUCCESS);
  step(x->p); /* the producer's worker pushes as layers are saved */
  for (int l = 0; l < M_LAYERS; l++) {
    compute_layer(x, l);
    ST_IS(ops->save_kv_layer(x->p->worker, (uint32_t)l), HIXL_KV_SUCCESS);
    if (cross) continue;
    ST_IS(ops->wait_for_layer_load(x->d->worker, (uint32_t)l), HIXL_KV_SUCCESS);
    int now = layer_state(x->d, x->d_want, l),
        next = l + 1 < M_LAYERS ? layer_state(x->d, x->d_want, l + 1) : 0;
    if (now != 1 || next != 0) /* 1: landed, 0: untouched, -1: neither */
      fprintf(stderr, "  %s: after layer %d: layer %d state %d, layer %d state %d\n", x->id, l, l, now, l + 1,
              next);
    CU_ASSERT(now == 1 && next == 0);
  }
  ST_IS(ops->wait_for_save(x->p->worker), HIXL_KV_SUCCESS);
  for (uint32_t l = 0; cross && l < M_LAYERS; l++)
    ST_IS(ops->wait_for_layer_load(x->d->worker, l), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(wait_finished(x->d, x->id, RECVING, 20000));
  int32_t delay = -1;
  hixl_kv_buffer unused = {0};
  ST_IS(sched_finished(x->p, &q, &pl->pb, &delay, &unused), HIXL_KV_SUCCESS);
  ops->free_buffer(&unused);
  CU_ASSERT_TRUE(wait_finished(x->p, x->id, SENDING, 20000));
  free(text);
}

/* The consumer's load errors are exactly its request's blocks (n 0: none). */
static bool load_errors_are(struct side *d, const struct lists *b, size_t ng) {
  hixl_kv_blocks e = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d->worker, &e), HIXL_KV_SUCCESS);
  size_t want = 0, found = 0;
  for (size_t g = 0; g < ng; g++) {
    want += b->n[g];
    for (size_t i = 0; i < b->n[g]; i++)
      for (size_t j = 0; j < e.count; j++) found += e.ids[j] == b->ids[g][i];
  }
  bool ok = e.count == want && found >= want;
  if (!ok) fprintf(stderr, "  load errors: %zu blocks, want %zu\n", e.count, want);
  ops->free_buffer(&e.raw);
  return ok;
}

static size_t plane_count(const hixl_kv_group *g) {
  return g->flags & HIXL_KV_GROUP_CROSS_LAYER ? g->planes_per_layer
                                              : (size_t)g->planes_per_layer * g->num_layers;
}

/* Bytes the consumer receives: the moved blocks of every plane. */
static uint64_t moved_bytes(const struct side *d, const struct plan *pl) {
  uint64_t bytes = 0;
  for (size_t g = 0; g < pl->cons->ng; g++) {
    size_t p0, c0, n = pairing(pl, g, &p0, &c0);
    for (size_t i = 0; i < plane_count(&d->g[g]); i++) bytes += n * d->g[g].planes[i].block_bytes;
  }
  return bytes;
}

static uint64_t next_seed = 1000;

/* What each side's memory must hold after the hand-off: p_want the request as the
 * producer computes it, d_want what lands of it. */
static void expect(const struct plan *pl, const struct side *p, const struct side *d, uint64_t seed,
                   uint8_t **p_want, uint8_t **d_want) {
  *p_want = malloc(p->len);
  *d_want = malloc(d->len);
  CU_ASSERT_FATAL(*p_want && *d_want);
  memcpy(*p_want, p->mem, p->len);
  for (size_t g = 0; g < pl->prod->ng; g++)
    paint_group(p, g, *p_want, seed, pl->pb.ids[g], pl->pb.n[g], 0, -1);
  memset(*d_want, 0xEE, d->len);
  for (size_t g = 0; !pl->mismatch && g < pl->cons->ng; g++) {
    size_t p0, c0, n = pairing(pl, g, &p0, &c0);
    paint_group(d, g, *d_want, seed, pl->cb.ids[g] + c0, n, p0, -1);
  }
}

/* A request from a producer of P_BLOCKS blocks to a consumer of C_BLOCKS, as pl says,
 * and every byte of both sides' memory checked. */
static void handoff(const struct plan *pl) {
  struct side p, d;
  const char *mode = pl->push ? "push" : "pull";
  uint64_t seed = ++next_seed;
  char id[96];
  if (!HIXL_KV_HAS_OP(ops, request_finished_groups)) {
    CU_FAIL("the plugin's table ends before the 1.3 ops");
    return;
  }
  snprintf(id, sizeof(id), "%s-%s-%llu", pl->cons->name, mode, (unsigned long long)seed);
  hixl_kv_status st = side_up(&d, pl->cons, C_BLOCKS, "consumer", mode);
  ST_IS(st, HIXL_KV_SUCCESS);
  if (st != HIXL_KV_SUCCESS) goto down_consumer;
  st = side_up(&p, pl->prod, P_BLOCKS, "producer", mode);
  ST_IS(st, HIXL_KV_SUCCESS);
  if (st != HIXL_KV_SUCCESS) goto down_producer;
  uint8_t *p_want, *d_want;
  expect(pl, &p, &d, seed, &p_want, &d_want);
  struct run x = {pl, &p, &d, seed, d_want, id};
  if (pl->push)
    push_run(&x);
  else
    pull_run(&x);
  CU_ASSERT_TRUE(load_errors_are(&d, &pl->cb, pl->mismatch ? pl->cons->ng : 0));
  CU_ASSERT_TRUE(memory_is(&d, d_want, seed, "consumer"));
  CU_ASSERT_TRUE(memory_is(&p, p_want, seed, "producer"));
  hixl_kv_stats s;
  ST_IS(ops->get_stats(d.worker, &s), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(s.loads_done, pl->mismatch ? 0 : 1);
  CU_ASSERT_EQUAL(s.loads_failed, pl->mismatch ? 1 : 0);
  if (!pl->mismatch && s.bytes_loaded != moved_bytes(&d, pl))
    fprintf(stderr, "  %s: bytes_loaded %llu, want %llu\n", id, (unsigned long long)s.bytes_loaded,
            (unsigned long long)moved_bytes(&d, pl));
  CU_ASSERT_EQUAL(s.bytes_loaded, pl->mismatch ? 0 : moved_bytes(&d, pl));
  if (pl->push) {
    hixl_kv_stats_ex e = {.size = sizeof(e)};
    ST_IS(ops->get_stats_ex(p.worker, &e), HIXL_KV_SUCCESS);
    CU_ASSERT(e.pushes_done == 1 && e.blocks_held == 0);
    CU_ASSERT_EQUAL(e.bytes_pushed, moved_bytes(&d, pl));
  }
  free(p_want);
  free(d_want);
down_producer:
  side_down(&p);
down_consumer:
  side_down(&d);
}

/* ---- the layouts ---- */

/* A request of 8 blocks: the producer's (of 16) and the consumer's (of 24, out of
 * order, the first and last included). */
static const uint64_t p_blocks[] = {2, 3, 7, 11, 12, 13, 14, 15};
static const uint64_t c_blocks[] = {0, 9, 8, 17, 18, 19, 5, 23};

static struct plan layout_plan(const struct kcase *k, bool push) {
  return (struct plan){.prod = k, .cons = k, .push = push, .pb = {{p_blocks}, {8}}, .cb = {{c_blocks}, {8}}};
}

static void layout_case(const struct kcase *k, bool push) {
  struct plan pl = layout_plan(k, push);
  handoff(&pl);
}

#define ONE_GROUP(fam_, name_, kind_)                                                                        \
  { .fam = fam_, .layout = name_, .kind = kind_, .num_layers = M_LAYERS }

static const struct kcase k_kv_first = {
    .name = "kv_first", .ng = 1, .g = {ONE_GROUP(FAM_KV_FIRST, "kv_first", 0)}};
static const struct kcase k_blocks_first = {
    .name = "blocks_first", .ng = 1, .g = {ONE_GROUP(FAM_BLOCKS_FIRST, "blocks_first", 0)}};
static const struct kcase k_packed = {.name = "packed", .ng = 1, .g = {ONE_GROUP(FAM_PACKED, "packed", 0)}};
static const struct kcase k_lbnhc = {.name = "LBNHC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "LBNHC", 0)}};
static const struct kcase k_lbhnc = {.name = "LBHNC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "LBHNC", 0)}};
static const struct kcase k_lhbnc = {.name = "LHBNC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "LHBNC", 0)}};
static const struct kcase k_blnhc = {.name = "BLNHC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "BLNHC", 0)}};
/* Its memory from alloc_kv_memory (a same-host peer maps it). */
static const struct kcase k_blhnc = {
    .name = "BLHNC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "BLHNC", 0)}, .plugin_mem = true};
static const struct kcase k_bhlnc = {.name = "BHLNC", .ng = 1, .g = {ONE_GROUP(FAM_NAMED, "BHLNC", 0)}};
static const struct kcase k_mla = {
    .name = "mla", .ng = 1, .g = {ONE_GROUP(FAM_MLA, "mla", HIXL_KV_GROUP_MLA)}};
/* One group through the scheduler's _groups ops. */
static const struct kcase k_cross = {
    .name = "cross_layer", .ng = 1, .g = {ONE_GROUP(FAM_CROSS, "cross_layer", 0)}, .groups_ops = true};

#define LAYOUT_TESTS(id)                                                                                     \
  static void test_pull_##id(void) { layout_case(&k_##id, false); }                                          \
  static void test_push_##id(void) { layout_case(&k_##id, true); }

LAYOUT_TESTS(kv_first)
LAYOUT_TESTS(blocks_first)
LAYOUT_TESTS(packed)
LAYOUT_TESTS(lbnhc)
LAYOUT_TESTS(lbhnc)
LAYOUT_TESTS(lhbnc)
LAYOUT_TESTS(blnhc)
LAYOUT_TESTS(blhnc)
LAYOUT_TESTS(bhlnc)
LAYOUT_TESTS(mla)
LAYOUT_TESTS(cross)

/* Pull of a request whose first 2 blocks the consumer has cached: its 6 blocks get
 * the producer's last 6. */
static struct plan prefix_plan(void) {
  struct plan pl = layout_plan(&k_lbnhc, false);
  pl.cb = (struct lists){{c_blocks + 2}, {6}};
  return pl;
}

static void test_pull_cached_prefix(void) {
  struct plan pl = prefix_plan();
  handoff(&pl);
}

/* A hybrid model: layers 0 and 2 attend fully, layer 1 in a sliding window of 8 tokens
 * (a quarter of the request's 32), so the request holds fewer blocks there. */
static const uint32_t full_layers[] = {0, 2};
static const struct kcase k_hybrid = {
    .name = "hybrid",
    .ng = 2,
    .g = {{.fam = FAM_KV_FIRST,
           .layout = "kv_first",
           .kind = HIXL_KV_GROUP_FULL_ATTENTION,
           .num_layers = 2,
           .layer_ids = full_layers},
          {.fam = FAM_KV_FIRST,
           .layout = "kv_first",
           .kind = HIXL_KV_GROUP_SLIDING_WINDOW,
           .num_layers = 1,
           .first_layer = 1,
           .window = 2 * M_TOKENS}},
};
static const uint64_t p_window[] = {0, 4, 9}; /* the producer's window blocks (pull: 3, push: the last 2) */
static const uint64_t c_window[] = {22, 1, 10};

/* Pull: the consumer's 2 window blocks get the producer's last 2 of 3. Push: the
 * producer's 2 go into the consumer's last 2 of 3. */
static struct plan hybrid_plan(bool push) {
  struct plan pl = layout_plan(&k_hybrid, push);
  pl.pb = (struct lists){{p_blocks, p_window + push}, {8, push ? 2 : 3}};
  pl.cb = (struct lists){{c_blocks, c_window}, {8, push ? 3 : 2}};
  return pl;
}

static void test_pull_hybrid(void) {
  struct plan pl = hybrid_plan(false);
  handoff(&pl);
}

static void test_push_hybrid(void) {
  struct plan pl = hybrid_plan(true);
  handoff(&pl);
}

/* ---- push params that name too few of the consumer's blocks in a group ---- */

/* text (kv_transfer_params) with its remote_block_ids replaced by ids (JSON), malloc'ed;
 * NULL when it has none. */
static char *with_block_ids(const char *text, const char *ids) {
  const char *key = strstr(text, "\"remote_block_ids\"");
  const char *open = key ? strchr(key, '[') : NULL, *end = open;
  for (int depth = 0; end && *end; end++)
    if (*end == '[')
      depth++;
    else if (*end == ']' && --depth == 0)
      break;
  if (!end || !*end) return NULL;
  size_t n = strlen(text) - (size_t)(end + 1 - open) + strlen(ids) + 1;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%.*s%s%s", (int)(open - text), text, ids, end + 1);
  return out;
}

/* Whether the producer's trace of id says why (drain_traces, one JSON line a request). */
static bool trace_says(struct side *s, const char *id, const char *why) {
  hixl_kv_buffer b = {0};
  ST_IS(ops->drain_traces(s->worker, &b), HIXL_KV_SUCCESS);
  char *t = b.data ? strndup((char *)b.data, b.len) : NULL, want_id[128];
  ops->free_buffer(&b);
  snprintf(want_id, sizeof(want_id), "\"req\":\"%s\"", id);
  bool found = false;
  for (char *line = t ? strtok(t, "\n") : NULL; line && !found; line = strtok(NULL, "\n"))
    found = strstr(line, want_id) && strstr(line, why);
  if (!found) fprintf(stderr, "  no trace of %s says \"%s\"; the traces:\n%s\n", id, why, t ? t : "(none)");
  free(t);
  return found;
}

/* A push of the hybrid model's request (the producer writes 8 blocks of group 0 and 2
 * of the window, group 1) whose params, as they reach the producer, name only `named`
 * of the consumer's blocks in `group` (ids: their remote_block_ids). The push fails,
 * naming the request, the group and both counts, before any byte moves: the consumer's
 * memory stays 0xEE byte for byte, its request fails with its blocks as load errors,
 * the producer issued no write and reports the request finished-sending. Issue 43: the
 * pusher paired each group's blocks with the consumer's ids without checking the
 * counts, so a short group took the next group's ids (group 0: block 22 of group 0,
 * another request's) or read past the end of the ids (the last group). */
static void short_group(const char *ids, unsigned group, unsigned named, unsigned writes) {
  struct plan pl = hybrid_plan(true);
  struct side p, d;
  uint64_t seed = ++next_seed;
  char id[64], why[160];
  snprintf(id, sizeof(id), "short-group-%u-%llu", group, (unsigned long long)seed);
  hixl_kv_status st = side_up(&d, pl.cons, C_BLOCKS, "consumer", "push");
  ST_IS(st, HIXL_KV_SUCCESS);
  if (st != HIXL_KV_SUCCESS) goto down_consumer;
  st = side_up(&p, pl.prod, P_BLOCKS, "producer", "push");
  ST_IS(st, HIXL_KV_SUCCESS);
  if (st != HIXL_KV_SUCCESS) goto down_producer;
  uint8_t *untouched = malloc(d.len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(untouched);
  memset(untouched, 0xEE, d.len);
  hixl_kv_request r = request(id, pl.cb.n[0] * M_TOKENS, "{\"do_remote_prefill\": true}");
  int64_t tokens = matched(&d, &r, 0);
  ST_IS(sched_alloc(&d, &r, &pl.cb, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
  step(&d); /* the consumer's worker expects the push */
  char *text = take_text(&params), *bad = text ? with_block_ids(text, ids) : NULL;
  CU_ASSERT_PTR_NOT_NULL_FATAL(bad);
  hixl_kv_request q = request(id, pl.pb.n[0] * M_TOKENS, bad);
  int64_t none = -2;
  int32_t async = 1;
  ST_IS(ops->get_num_new_matched_tokens(p.sched, &q, 0, &none, &async), HIXL_KV_SUCCESS);
  ST_IS(sched_alloc(&p, &q, &pl.pb, 0), HIXL_KV_SUCCESS);
  step(&p);
  struct run x = {&pl, &p, &d, seed, untouched, id};
  for (int l = 0; l < M_LAYERS; l++) {
    compute_layer(&x, l);
    ST_IS(ops->save_kv_layer(p.worker, (uint32_t)l), HIXL_KV_SUCCESS);
  }
  ST_IS(ops->wait_for_save(p.worker), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(wait_finished(&p, id, SENDING, 20000));
  CU_ASSERT_TRUE(wait_finished(&d, id, RECVING, 20000)); /* the producer told it (ABORT) */
  CU_ASSERT_TRUE(load_errors_are(&d, &pl.cb, pl.cons->ng));
  CU_ASSERT_TRUE(memory_is(&d, untouched, seed, "consumer"));
  hixl_kv_stats ps, ds;
  ST_IS(ops->get_stats(p.worker, &ps), HIXL_KV_SUCCESS);
  ST_IS(ops->get_stats(d.worker, &ds), HIXL_KV_SUCCESS);
  CU_ASSERT(ps.pushes_failed == 1 && ps.pushes_done == 0 && ps.engine_ops == 0 && ps.blocks_held == 0);
  CU_ASSERT(ds.loads_failed == 1 && ds.loads_done == 0 && ds.bytes_loaded == 0);
  snprintf(why, sizeof(why), "push params name %u blocks in group %u of request %s, this producer writes %u",
           named, group, id, writes);
  CU_ASSERT_TRUE(trace_says(&p, id, why));
  int32_t delay = -1;
  hixl_kv_buffer unused = {0};
  ST_IS(sched_finished(&p, &q, &pl.pb, &delay, &unused), HIXL_KV_SUCCESS);
  ops->free_buffer(&unused);
  free(untouched);
  free(text);
  free(bad);
down_producer:
  side_down(&p);
down_consumer:
  side_down(&d);
}

/* Group 0 (8 blocks written) named with 7 ids: its 8th block would take group 1's
 * first id, 22, a block of group 0 that is not this request's. */
static void test_push_short_first_group(void) {
  short_group("[[0, 9, 8, 17, 18, 19, 5], [22, 1, 10]]", 0, 7, 8);
}

/* The window, the last group (2 blocks written), named with 1 id: its 2nd block would
 * take an id past the end of the list. */
static void test_push_short_last_group(void) { short_group("[[0, 9, 8, 17, 18, 19, 5, 23], [22]]", 1, 1, 2); }

/* Peers that describe different groups: the load fails, its blocks come back as load
 * errors, nothing moves, the producer frees. */
static void mismatch(const struct kcase *prod, const struct kcase *cons) {
  struct plan pl = layout_plan(cons, false);
  pl.prod = prod;
  pl.mismatch = true;
  handoff(&pl);
}

/* The same planes' sizes, another layout name. */
static void test_mismatch_layout_name(void) { mismatch(&k_lbnhc, &k_blnhc); }

/* The same name and block bytes, 4 heads of 4 channels against 2 of 8. */
static const struct kcase k_lhbnc_4 = {
    .name = "LHBNC_4_heads",
    .ng = 1,
    .g = {{.fam = FAM_NAMED, .layout = "LHBNC", .num_layers = M_LAYERS, .heads = 4}}};
static void test_mismatch_heads(void) { mismatch(&k_lhbnc, &k_lhbnc_4); }

/* ---- the adapter itself: planes as a reviewer works them out from each layout ---- */

struct want_plane {
  const struct kcase *k;
  uint64_t layer_step; /* bytes from layer l's first plane to layer l + 1's */
  uint64_t block_stride, block_bytes, head_stride;
  uint32_t planes_per_layer, num_heads;
};

static void test_planes_from_strides(void) {
  enum { B = P_BLOCKS, NC = M_TOKENS * 2 * M_HEAD_DIM * M_ELEM, BLK = M_HEADS * NC }; /* one head's block */
  const struct want_plane want[] = {
      {&k_kv_first, 2 * B * BLK / 2 + GAP, BLK / 2, BLK / 2, 0, 2, 0},
      {&k_blocks_first, B * BLK + GAP, BLK, BLK, 0, 1, 0},
      {&k_packed, B * BLK + GAP, BLK, BLK, 0, 1, 0},
      {&k_lbnhc, B * BLK, BLK, BLK, 0, 1, 0},
      {&k_lbhnc, B * BLK, BLK, BLK, 0, 1, 0},
      {&k_lhbnc, B * BLK, NC, BLK, B * NC, 1, M_HEADS}, /* heads num_blocks apart */
      {&k_blnhc, BLK, M_LAYERS * BLK, BLK, 0, 1, 0},    /* stride skips the other layers */
      {&k_blhnc, BLK, M_LAYERS * BLK, BLK, 0, 1, 0},
      {&k_bhlnc, NC, M_LAYERS * BLK, BLK, M_LAYERS * NC, 1, M_HEADS}, /* layers between heads */
      {&k_mla, B * M_TOKENS * M_LATENT * M_ELEM + GAP, M_TOKENS * M_LATENT * M_ELEM,
       M_TOKENS * M_LATENT * M_ELEM, 0, 1, 0},
      {&k_cross, 0, M_LAYERS * BLK, M_LAYERS * BLK, 0, 1, 0},
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    const struct want_plane *w = &want[i];
    struct side s = {.k = w->k};
    side_layout(&s, w->k, B);
    CU_ASSERT_EQUAL_FATAL(side_planes(&s, w->k, 0x100000, B), 0);
    const hixl_kv_group *g = &s.g[0];
    bool cross = w->k == &k_cross;
    CU_ASSERT_EQUAL(g->planes_per_layer, w->planes_per_layer);
    CU_ASSERT_EQUAL(g->flags, cross ? HIXL_KV_GROUP_CROSS_LAYER : 0u);
    for (uint32_t l = 0; l < (cross ? 1u : M_LAYERS); l++)
      for (uint32_t j = 0; j < g->planes_per_layer; j++) {
        const hixl_kv_plane *p = &g->planes[l * g->planes_per_layer + j];
        uint64_t base = 0x100000 + l * w->layer_step + j * (uint64_t)B * w->block_stride; /* V after K */
        bool ok = p->base == base && p->block_stride == w->block_stride && p->block_bytes == w->block_bytes &&
                  p->num_heads == w->num_heads && p->head_stride == w->head_stride && p->reserved == 0;
        if (!ok)
          fprintf(stderr, "  %s layer %u plane %u: base +%llu stride %llu bytes %llu heads %u x %llu\n",
                  w->k->name, l, j, (unsigned long long)(p->base - 0x100000),
                  (unsigned long long)p->block_stride, (unsigned long long)p->block_bytes, p->num_heads,
                  (unsigned long long)p->head_stride);
        CU_ASSERT_TRUE(ok);
      }
  }
}

/* ---- a reference mover: the header's rules by hand, no plugin ---- */

/* Block fb of plane from into block tb of plane to, head by head. */
static void ref_copy(const hixl_kv_plane *from, uint64_t fb, const hixl_kv_plane *to, uint64_t tb) {
  uint32_t pieces = from->num_heads ? from->num_heads : 1;
  for (uint32_t h = 0; h < pieces; h++)
    memcpy((uint8_t *)to->base + tb * to->block_stride + h * to->head_stride,
           (const uint8_t *)from->base + fb * from->block_stride + h * from->head_stride,
           from->block_bytes / pieces);
}

static void ref_move(const struct plan *pl, const struct side *p, const struct side *d) {
  for (size_t g = 0; g < pl->cons->ng; g++) {
    size_t p0, c0, n = pairing(pl, g, &p0, &c0);
    for (size_t i = 0; i < plane_count(&d->g[g]); i++)
      for (size_t k = 0; k < n; k++)
        ref_copy(&p->g[g].planes[i], pl->pb.ids[g][p0 + k], &d->g[g].planes[i], pl->cb.ids[g][c0 + k]);
  }
}

static const struct kcase *const layouts[] = {&k_kv_first, &k_blocks_first, &k_packed, &k_lbnhc,
                                              &k_lbhnc,    &k_lhbnc,        &k_blnhc,  &k_blhnc,
                                              &k_bhlnc,    &k_mla,          &k_cross};
enum { NUM_LAYOUTS = sizeof(layouts) / sizeof(layouts[0]) };

/* The planes say what the tensors hold: blocks moved plane by plane as the header
 * defines planes land exactly what each hand-off of this file checks. */
static void test_planes_move_the_tensors(void) {
  struct plan plans[2 * NUM_LAYOUTS + 3];
  size_t n = 0;
  for (size_t i = 0; i < NUM_LAYOUTS; i++) {
    plans[n++] = layout_plan(layouts[i], false);
    plans[n++] = layout_plan(layouts[i], true);
  }
  plans[n++] = prefix_plan();
  plans[n++] = hybrid_plan(false);
  plans[n++] = hybrid_plan(true);
  for (size_t i = 0; i < n; i++) {
    struct side p = {0}, d = {0};
    uint8_t *p_want, *d_want;
    ST_IS(side_mem(&p, plans[i].prod, P_BLOCKS, NULL), HIXL_KV_SUCCESS);
    ST_IS(side_mem(&d, plans[i].cons, C_BLOCKS, NULL), HIXL_KV_SUCCESS);
    expect(&plans[i], &p, &d, 7 + i, &p_want, &d_want);
    memcpy(p.mem, p_want, p.len); /* the producer computed */
    ref_move(&plans[i], &p, &d);
    CU_ASSERT_TRUE(
        memory_is(&d, d_want, 7 + i, plans[i].push ? "consumer (push by hand)" : "consumer (pull by hand)"));
    CU_ASSERT_TRUE(memory_is(&p, p_want, 7 + i, "producer (by hand)"));
    free(p_want);
    free(d_want);
    free(p.mem);
    free(d.mem);
  }
}

/* ---- a careless host's descriptions: refused by name, before anything is registered ---- */

/* A fresh worker (rank 0 of 1). */
static hixl_kv_connector *worker_up(void) {
  char cfg[512], err[256];
  hixl_kv_connector *w = NULL;
  config(cfg, sizeof(cfg), "both", "pull");
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  return w;
}

/* register_kv_groups of one plane p (num_blocks nb, elem_size 2) on w: its status,
 * and whether the error names what. */
/* A full-attention group of one layer of the one plane p, nb blocks. */
static hixl_kv_group group_of(hixl_kv_plane *p, uint64_t nb) {
  return (hixl_kv_group){.size = sizeof(hixl_kv_group),
                         .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                         .num_layers = 1,
                         .planes_per_layer = 1,
                         .planes = p,
                         .num_blocks = nb,
                         .block_tokens = M_TOKENS,
                         .elem_size = M_ELEM};
}

static hixl_kv_status one_plane(hixl_kv_connector *w, hixl_kv_plane p, uint64_t nb, const char *what) {
  hixl_kv_group g = group_of(&p, nb);
  hixl_kv_status st = ops->register_kv_groups(w, &g, 1);
  if (st != HIXL_KV_SUCCESS && what && !strstr(ops->last_error(), what)) {
    fprintf(stderr, "  the error does not name %s: %s\n", what, ops->last_error());
    CU_FAIL("the error does not name what is wrong");
  }
  return st;
}

/* The same on a worker of its own, destroyed after. */
static hixl_kv_status alone(hixl_kv_plane p, uint64_t nb, const char *what) {
  hixl_kv_connector *w = worker_up();
  if (!w) return HIXL_KV_FAILED;
  hixl_kv_status st = one_plane(w, p, nb, what);
  ops->destroy(w);
  return st;
}

/* Planes whose blocks or heads overlap, whose heads lie past the address space
 * (head_stride times the heads wrapped 64 bits), and whose heads split an element
 * (before: each registered, and the op lists read and wrote wherever they pointed);
 * then a group's reserved2 not 0, and V before K (register_kv_caches' v_offset wrapped
 * 64 bits, V over K). Each is refused, naming what, and leaves nothing registered: a
 * good description then registers, once. */
static void test_bad_planes_refused(void) {
  uint8_t *mem = aligned_alloc(4096, 65536);
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  uintptr_t b = (uintptr_t)mem;
  /* Blocks 128 bytes long, 64 apart: block 1 is half of block 0. */
  ST_IS(alone((hixl_kv_plane){.base = b, .block_stride = 64, .block_bytes = 128}, 4, "overlap"),
        HIXL_KV_PARAM_INVALID);
  /* Heads adjacent (64 bytes each), blocks 64 apart: block 1's head 0 is block 0's head 1. */
  ST_IS(alone(
            (hixl_kv_plane){
                .base = b, .block_stride = 64, .block_bytes = 128, .head_stride = 64, .num_heads = 2},
            4, "overlap"),
        HIXL_KV_PARAM_INVALID);
  /* 3 heads 2^63 apart: head 1 at base + 2^63, head 2 at base + 2^64 (base). */
  ST_IS(alone((hixl_kv_plane){.base = b,
                              .block_stride = 192,
                              .block_bytes = 192,
                              .head_stride = UINT64_C(1) << 63,
                              .num_heads = 3},
              4, "head_stride"),
        HIXL_KV_PARAM_INVALID);
  /* 8 bytes in 8 heads: a head of 1 byte, half an element. */
  ST_IS(
      alone((hixl_kv_plane){.base = b, .block_stride = 8, .block_bytes = 8, .head_stride = 1, .num_heads = 8},
            4, "elem_size"),
      HIXL_KV_PARAM_INVALID);
  /* A 1.5 group whose reserved2 is not 0 (before: ignored, so a later version could not give it a
   * meaning). */
  hixl_kv_connector *w = worker_up();
  CU_ASSERT_PTR_NOT_NULL_FATAL(w);
  hixl_kv_plane pl = {.base = b, .block_stride = 128, .block_bytes = 128};
  hixl_kv_group g = group_of(&pl, 4);
  g.reserved2 = 1;
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "reserved2"));
  ops->destroy(w);
  CU_ASSERT_PTR_NOT_NULL_FATAL(w = worker_up());
  /* KV-first with V before K: v_offset -2048 wraps to base - 2048, and V's 4 blocks of 1024
   * cover K's first 2. */
  hixl_kv_layer ly = {.base = b + 8192,
                      .num_blocks = 4,
                      .block_bytes = 1024,
                      .v_offset = (uint64_t)0 - 2048,
                      .layout = HIXL_KV_LAYOUT_KV_FIRST,
                      .elem_size = M_ELEM,
                      .block_tokens = M_TOKENS};
  ST_IS(ops->register_kv_caches(w, &ly, 1), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "V at offset"));
  /* The good one still registers on the same worker: an LHBNC plane (heads num_blocks
   * apart), once. */
  ST_IS(one_plane(w,
                  (hixl_kv_plane){
                      .base = b, .block_stride = 64, .block_bytes = 128, .head_stride = 256, .num_heads = 2},
                  4, NULL),
        HIXL_KV_SUCCESS);
  ST_IS(
      one_plane(w, (hixl_kv_plane){.base = b + 8192, .block_stride = 128, .block_bytes = 128}, 4, "already"),
      HIXL_KV_PARAM_INVALID);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS);
  free(mem);
}

/* register_kv_groups of groups g[0..n) on a worker of its own: its status, and whether
 * the error names what. */
static hixl_kv_status groups_alone(hixl_kv_group *g, size_t n, const char *what) {
  hixl_kv_connector *w = worker_up();
  if (!w) return HIXL_KV_FAILED;
  hixl_kv_status st = ops->register_kv_groups(w, g, n);
  if (st != HIXL_KV_SUCCESS && what && !strstr(ops->last_error(), what)) {
    fprintf(stderr, "  the error does not name %s: %s\n", what, ops->last_error());
    CU_FAIL("the error does not name what is wrong");
  }
  ops->destroy(w);
  return st;
}

/* Two planes of one group that share bytes: V given K's base, layers of a block-major
 * layout 64 bytes apart where a layer's piece is 128, and a head-major plane whose second
 * head lies on the next plane's blocks (before: registered, and a load into one plane
 * wrote the other's bytes; only a plane's own pieces were compared). Refused, naming
 * both planes. Planes that interleave without sharing a byte (BLNHC's layers, heads
 * apart) register, and so does one tensor in two groups (vLLM's hybrid allocator: the
 * groups' blocks come from one pool). */
static void test_planes_sharing_refused(void) {
  uint8_t *mem = aligned_alloc(4096, 65536);
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  uintptr_t b = (uintptr_t)mem;
  hixl_kv_plane kv[2] = {{.base = b, .block_stride = 128, .block_bytes = 128},
                         {.base = b, .block_stride = 128, .block_bytes = 128}}; /* V over K */
  hixl_kv_group g = group_of(kv, 4);
  g.planes_per_layer = 2;
  ST_IS(groups_alone(&g, 1, "planes 0 and 1 share bytes"), HIXL_KV_PARAM_INVALID);
  kv[1].base = b + 4 * 128 - 64; /* V's block 0 over K's block 3 */
  ST_IS(groups_alone(&g, 1, "share bytes"), HIXL_KV_PARAM_INVALID);
  kv[1].base = b + 4 * 128; /* V after K: taken */
  ST_IS(groups_alone(&g, 1, NULL), HIXL_KV_SUCCESS);
  /* Block-major, 2 layers: each block 256 bytes, a layer's piece 128. */
  hixl_kv_plane bl[2] = {{.base = b, .block_stride = 256, .block_bytes = 128},
                         {.base = b + 64, .block_stride = 256, .block_bytes = 128}};
  g = group_of(bl, 4);
  g.num_layers = 2;
  ST_IS(groups_alone(&g, 1, "share bytes"), HIXL_KV_PARAM_INVALID);
  bl[1].base = b + 128; /* BLNHC: the layers side by side in a block */
  ST_IS(groups_alone(&g, 1, NULL), HIXL_KV_SUCCESS);
  /* Head-major (LHBNC), 2 layers: a layer's head h of block j at + h * 512 + j * 128; the
   * next layer 1024 on. Given 512 on, its head 0 is the first layer's head 1. */
  hixl_kv_plane hm[2] = {
      {.base = b, .block_stride = 128, .block_bytes = 256, .head_stride = 512, .num_heads = 2},
      {.base = b + 512, .block_stride = 128, .block_bytes = 256, .head_stride = 512, .num_heads = 2}};
  g = group_of(hm, 4);
  g.num_layers = 2;
  ST_IS(groups_alone(&g, 1, "share bytes"), HIXL_KV_PARAM_INVALID);
  hm[1].base = b + 1024;
  ST_IS(groups_alone(&g, 1, NULL), HIXL_KV_SUCCESS);
  /* One tensor, layer 0 in group 0 and layer 1 in group 1: taken. */
  hixl_kv_plane one = {.base = b, .block_stride = 128, .block_bytes = 128};
  hixl_kv_group two[2] = {group_of(&one, 4), group_of(&one, 4)};
  two[1].first_layer = 1;
  ST_IS(groups_alone(two, 2, NULL), HIXL_KV_SUCCESS);
  /* register_kv_caches: layer 1 given layer 0's tensor (one group: refused too). */
  hixl_kv_connector *w = worker_up();
  CU_ASSERT_PTR_NOT_NULL_FATAL(w);
  hixl_kv_layer ly = {.base = b,
                      .num_blocks = 4,
                      .block_bytes = 128,
                      .v_offset = 512,
                      .layout = HIXL_KV_LAYOUT_KV_FIRST,
                      .elem_size = M_ELEM,
                      .block_tokens = M_TOKENS};
  hixl_kv_layer two_layers[2] = {ly, ly};
  ST_IS(ops->register_kv_caches(w, two_layers, 2), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "share bytes"));
  two_layers[1].base = b + 1024;
  ST_IS(ops->register_kv_caches(w, two_layers, 2), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS);
  free(mem);
}

/* A plane that runs across the start of alloc_kv_memory's region, or over all of it,
 * from host memory just below it (before: only a plane starting inside the region and
 * running past its end was refused; these were registered again over the region).
 * Refused, naming the region; a plane inside it still registers. */
static void test_plane_across_alloc_refused(void) {
  hixl_kv_connector *w = worker_up();
  CU_ASSERT_PTR_NOT_NULL_FATAL(w);
  uintptr_t base = 0;
  ST_IS(ops->alloc_kv_memory(w, 8192, &base), HIXL_KV_SUCCESS);
  void *below = mmap((void *)(base - 4096), 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (below == MAP_FAILED || below != (void *)(base - 4096)) { /* the page below is taken: nothing to show */
    if (below != MAP_FAILED) munmap(below, 4096);
    fprintf(stderr, "  the page below alloc_kv_memory's region is taken; not run\n");
    ops->destroy(w);
    return;
  }
  /* Its 4 blocks of 2048 from 4 KiB below the region: across its start. */
  ST_IS(one_plane(w, (hixl_kv_plane){.base = base - 4096, .block_stride = 2048, .block_bytes = 2048}, 4,
                  "alloc_kv_memory region"),
        HIXL_KV_PARAM_INVALID);
  /* 7 blocks: over all of it. */
  ST_IS(one_plane(w, (hixl_kv_plane){.base = base - 4096, .block_stride = 2048, .block_bytes = 2048}, 7,
                  "alloc_kv_memory region"),
        HIXL_KV_PARAM_INVALID);
  ST_IS(one_plane(w, (hixl_kv_plane){.base = base, .block_stride = 2048, .block_bytes = 2048}, 4, NULL),
        HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS);
  munmap(below, 4096);
}

/* Layout names the handshake metadata's JSON and the digest cannot carry: a quote (before:
 * get_handshake_metadata gave {"layout":"abi=1.5 ... [a"b ...} , JSON that does not
 * parse), a backslash, a newline. Refused, naming the layout name. */
static void test_layout_name_refused(void) {
  uint8_t *mem = aligned_alloc(4096, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  hixl_kv_plane p = {.base = (uintptr_t)mem, .block_stride = 128, .block_bytes = 128};
  const char *names[] = {"a\"b", "a\\b", "a\nb"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    hixl_kv_connector *w = worker_up();
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    hixl_kv_group g = group_of(&p, 4);
    g.layout = names[i];
    g.layout_len = 3;
    ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "layout name"));
    ops->destroy(w);
  }
  free(mem);
}

/* A cross-layer group of 200 planes: their sizes overran the 1 KiB compatibility digest,
 * which lost its " tp=1" (before: registered, and every hand-off with a peer of the same
 * layout failed "layout mismatch"). Refused at registration, naming the digest. */
static void test_digest_overrun_refused(void) {
  enum { N = 200, BYTES = 1024 };
  uint8_t *mem = aligned_alloc(4096, N * BYTES);
  hixl_kv_plane *p = calloc(N, sizeof(*p));
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  for (int i = 0; i < N; i++) /* block-major: plane i is bytes i * 1024.. of each 200 KiB block */
    p[i] = (hixl_kv_plane){
        .base = (uintptr_t)mem + (size_t)i * BYTES, .block_stride = N * BYTES, .block_bytes = BYTES};
  hixl_kv_connector *w = worker_up();
  CU_ASSERT_PTR_NOT_NULL_FATAL(w);
  hixl_kv_group g = {.size = sizeof(g),
                     .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                     .flags = HIXL_KV_GROUP_CROSS_LAYER,
                     .num_layers = 1,
                     .planes_per_layer = N,
                     .planes = p,
                     .num_blocks = 1,
                     .block_tokens = M_TOKENS,
                     .elem_size = M_ELEM};
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "digest"));
  hixl_kv_buffer hs = {0};
  if (ops->get_handshake_metadata(w, &hs) == HIXL_KV_SUCCESS) { /* what a peer would be told */
    if (strstr((const char *)hs.data, "planes=") && !strstr((const char *)hs.data, " tp=1"))
      fprintf(stderr, "  registered, and its digest has no tp=: %.80s...\n", (const char *)hs.data);
    ops->free_buffer(&hs);
  }
  ops->destroy(w);
  free(p);
  free(mem);
}

/* The table this host was built against holds the 1.3 ops. */
static void test_ops_present(void) {
  CU_ASSERT_TRUE(ops->abi_version >= HIXL_KV_ABI_VERSION);
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, register_kv_groups));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, alloc_kv_memory));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, update_state_after_alloc_groups));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, request_finished_groups));
}

#define LAYOUT_INFO(id, name)                                                                                \
  {"pull " name, test_pull_##id}, { "push " name, test_push_##id }

static CU_TestInfo adapter_tests[] = {
    {"the 1.3 ops are in the table", test_ops_present},
    {"planes from shapes, strides and element size", test_planes_from_strides},
    {"planes moved by the header's rules land each hand-off's bytes", test_planes_move_the_tensors},
    {"a careless host's planes: refused by name, nothing registered", test_bad_planes_refused},
    {"two planes of a group that share bytes: refused; interleaved, or of two groups: taken",
     test_planes_sharing_refused},
    {"a plane across alloc_kv_memory's region: refused", test_plane_across_alloc_refused},
    {"layout names JSON and the digest cannot carry: refused", test_layout_name_refused},
    {"a group past the compatibility digest: refused", test_digest_overrun_refused},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo layout_tests[] = {
    LAYOUT_INFO(kv_first, "kv_first (2, B, N, H, D) per layer"),
    LAYOUT_INFO(blocks_first, "blocks_first (B, 2, N, H, D) per layer"),
    LAYOUT_INFO(packed, "packed (B, H, N, 2D) per layer"),
    LAYOUT_INFO(lbnhc, "LBNHC"),
    LAYOUT_INFO(lbhnc, "LBHNC"),
    LAYOUT_INFO(lhbnc, "LHBNC (heads num_blocks apart)"),
    LAYOUT_INFO(blnhc, "BLNHC"),
    LAYOUT_INFO(blhnc, "BLHNC, in alloc_kv_memory's memory"),
    LAYOUT_INFO(bhlnc, "BHLNC (layers between heads)"),
    LAYOUT_INFO(mla, "mla (B, N, 576) per layer"),
    LAYOUT_INFO(cross, "cross-layer (B, L, 2, N, H, D), _groups ops"),
    {"pull LBNHC, the first 2 blocks cached on the consumer", test_pull_cached_prefix},
    {"pull hybrid: full attention and a sliding window", test_pull_hybrid},
    {"push hybrid: full attention and a sliding window", test_push_hybrid},
    {"push hybrid, params with a group short of ids (the first): refused, nothing written",
     test_push_short_first_group},
    {"push hybrid, params with a group short of ids (the last): refused, nothing read past them",
     test_push_short_last_group},
    {"mismatch: LBNHC against BLNHC", test_mismatch_layout_name},
    {"mismatch: 2 heads against 4", test_mismatch_heads},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "planes from tensors", .pTests = adapter_tests},
    {.pName = "layouts, producer to consumer", .pTests = layout_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) {
  const char *path = getenv("HIXL_KV_PLUGIN") ? getenv("HIXL_KV_PLUGIN") : HIXL_KV_PLUGIN_PATH;
  signal(SIGPIPE, SIG_IGN);
  if (!(so = kv_host_open("test_plugin_layouts", path, &ops))) return 1;
  return kv_host_run("test_plugin_layouts", suites, so);
}
