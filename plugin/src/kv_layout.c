/* kv_layout: the KV cache a worker registered, as groups of planes (hixl_kv_group,
 * ABI 1.3; register_kv_caches' layers become one group): the checks, the
 * compatibility digest, the memory registered with the engine, the plane table a peer
 * learns from the KV service, and the op lists that move a request's blocks between
 * this layout and a peer's.
 *
 * Op lists: each paired block of each plane is one piece per head (one when the
 * plane has no head dimension or its heads are adjacent); pieces are sorted by local
 * address and merged where both sides are contiguous, so runs of adjacent blocks, and
 * a block-major layout's layers of one block, become one op. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"

/* ---- building a layout ---- */

/* Planes by base (qsort_r; ctx: the layout). */
static int cmp_by_base(const void *a, const void *b, void *ctx) {
  const struct kv_layout *l = ctx;
  const struct kv_plane_at *x = a, *y = b;
  uint64_t u = l->g[x->group].planes[x->plane].base, v = l->g[y->group].planes[y->plane].base;
  return u < v ? -1 : u > v;
}

static const char *kind_name(uint32_t kind) {
  switch (kind) {
  case HIXL_KV_GROUP_FULL_ATTENTION: return "full";
  case HIXL_KV_GROUP_SLIDING_WINDOW: return "sliding";
  case HIXL_KV_GROUP_MLA: return "mla";
  case HIXL_KV_GROUP_MAMBA: return "mamba";
  default: return NULL;
  }
}

/* The bytes block 0 of plane p spans from its base: the end of its last piece. */
static uint64_t piece_span(const struct kv_plane *p) {
  return p->heads ? (uint64_t)(p->heads - 1) * p->head_stride + p->bytes / p->heads : p->bytes;
}

/* A plane's checks; why on failure. */
static bool plane_ok(const hixl_kv_plane *p, uint64_t nb, uint32_t elem, bool need_base, char *why,
                     size_t cap) {
  if ((need_base && !p->base) || !p->block_bytes || p->block_bytes % elem || p->reserved) {
    snprintf(why, cap, "base, block_bytes (a multiple of elem_size %u) must be set and reserved 0", elem);
    return false;
  }
  if (p->num_heads && (p->block_bytes % p->num_heads || p->block_bytes / p->num_heads % elem ||
                       p->head_stride < p->block_bytes / p->num_heads)) {
    snprintf(why, cap,
             "%u heads: block_bytes %" PRIu64 " must divide into them, each a multiple of elem_size %u, and "
             "head_stride %" PRIu64 " hold one",
             p->num_heads, p->block_bytes, elem, p->head_stride);
    return false;
  }
  if (p->num_heads > 1 && p->head_stride > (UINT64_C(1) << 46) / (p->num_heads - 1)) { /* before it wraps */
    snprintf(why, cap, "%u heads of head_stride %" PRIu64 " overflow the address space", p->num_heads,
             p->head_stride);
    return false;
  }
  struct kv_plane q = {p->base, p->block_stride, p->block_bytes, p->head_stride, p->num_heads};
  uint64_t span = piece_span(&q), len = q.heads ? q.bytes / q.heads : q.bytes;
  if (nb > 1 && p->block_stride == 0) {
    snprintf(why, cap, "block_stride is 0");
    return false;
  }
  if (span > (UINT64_C(1) << 46) || p->block_stride > (UINT64_C(1) << 46) / nb ||
      p->base + (nb - 1) * p->block_stride + span < p->base) {
    snprintf(why, cap, "%" PRIu64 " blocks of stride %" PRIu64 " overflow the address space", nb,
             p->block_stride);
    return false;
  }
  /* No two pieces share a byte: blocks lie apart (stride past a block's last head), or
   * heads do (a head-major layout: each head's blocks end before the next head). */
  if (nb > 1 && p->block_stride < span &&
      (q.heads <= 1 || p->block_stride < len || p->head_stride < (nb - 1) * p->block_stride + len)) {
    snprintf(why, cap,
             "blocks overlap: block_stride %" PRIu64 " is below the %" PRIu64 " bytes a block spans, and its "
             "heads do not lie apart (head_stride at least (num_blocks - 1) x block_stride + %" PRIu64 ")",
             p->block_stride, span, len);
    return false;
  }
  return true;
}

/* Floor of x / y, y > 0. */
static int64_t floor_div(int64_t x, int64_t y) { return x / y - (x % y < 0); }

/* Whether a piece of plane a and one of plane b (nb blocks of one stride each) share a
 * byte: heads h, k at d = (a's head h) - (b's head k) apart, blocks t apart, overlap
 * where -len(a) < d + t * stride < len(b) for some |t| < nb; heads adjacent are one
 * piece. Planes of different strides whose spans meet are taken as sharing (no layout
 * interleaves them). */
static bool planes_share(const struct kv_plane *a, const struct kv_plane *b, uint64_t nb) {
  if (a->stride != b->stride && nb > 1) return true;
  const struct kv_plane *q[2] = {a, b};
  int64_t n[2], step[2], len[2];
  for (int i = 0; i < 2; i++) {
    bool one = q[i]->heads <= 1 || q[i]->head_stride == q[i]->bytes / q[i]->heads;
    n[i] = one ? 1 : q[i]->heads;
    step[i] = one ? 0 : (int64_t)q[i]->head_stride;
    len[i] = one ? (int64_t)q[i]->bytes : (int64_t)(q[i]->bytes / q[i]->heads);
  }
  /* Their spans meet (the caller checked), so |d0| < 2^47 and nothing below wraps. */
  int64_t s = (int64_t)a->stride, far = (int64_t)nb - 1, d0 = (int64_t)(a->base - b->base);
  bool same = step[0] == step[1]; /* then d hangs on h - k only: each difference once */
  for (int64_t h = 0; h < n[0]; h++)
    for (int64_t k = 0; k < (same && h ? 1 : n[1]); k++) {
      int64_t d = d0 + h * step[0] - k * step[1];
      int64_t t = s ? floor_div(-len[0] - d, s) + 1 : 0; /* the least t with d + t * s > -len(a) */
      if (t < -far) t = -far;
      if (t <= far && d + t * s < len[1] && d + t * s > -len[0]) return true;
    }
  return false;
}

/* Whether two planes of group g share a byte (a load into one would overwrite the
 * other); which, into *pa and *pb. Planes of different groups may: vLLM's hybrid
 * allocator shares each tensor among layers of several groups, whose blocks come from
 * one pool. */
static bool group_planes_share(const struct kv_group *g, uint32_t *pa, uint32_t *pb) {
  for (uint32_t i = 0; i < g->nplanes; i++) {
    const struct kv_plane *a = &g->planes[i];
    uint64_t ahi = a->base + (g->num_blocks - 1) * a->stride + piece_span(a);
    for (uint32_t j = i + 1; j < g->nplanes; j++) {
      const struct kv_plane *b = &g->planes[j];
      uint64_t bhi = b->base + (g->num_blocks - 1) * b->stride + piece_span(b);
      if (a->base < bhi && b->base < ahi && planes_share(a, b, g->num_blocks)) {
        *pa = i;
        *pb = j;
        return true;
      }
    }
  }
  return false;
}

void kv_layout_free(struct kv_layout *l) {
  for (uint32_t g = 0; g < l->ng; g++) {
    free(l->g[g].layer_ids);
    free(l->g[g].planes);
  }
  free(l->g);
  free(l->map);
  free(l->by_base);
  memset(l, 0, sizeof(*l));
}

/* A plane's bytes and heads as the model has them (every rank's heads), the same for
 * any tensor-parallel size: what the digest shows. */
static uint64_t model_bytes(const struct kv_group *g, const struct kv_plane *q) {
  return g->kheads && q->heads ? q->bytes / q->heads * g->kheads : q->bytes;
}
static uint32_t model_heads(const struct kv_group *g, const struct kv_plane *q) {
  return g->kheads && q->heads ? g->kheads : q->heads;
}

/* The digest: everything two sides must agree on, as text (the PIN and ACCEPT
 * answers carry it; a mismatch names both). Plane sizes per group: layer 0's, and a
 * hash of every layer's when they differ, each as the model has it (all KV heads: a
 * head's bytes times the heads). " tp=N" last: two sides of different world sizes
 * share everything before it (kv_tp_check says whether they can map). Whether it fit. */
static bool layout_text(struct kv_layout *l, uint32_t world) {
  size_t n = (size_t)snprintf(l->text, sizeof(l->text), "abi=%u.5 layers=%u", HIXL_KV_ABI_MAJOR, l->nlayers);
  for (uint32_t gi = 0; gi < l->ng && n < sizeof(l->text); gi++) {
    const struct kv_group *g = &l->g[gi];
    n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, " [%s%s%s layers=%u tokens=%u elem=%u", g->layout,
                          g->layout[0] ? " " : "", kind_name(g->kind), g->nlayers, g->block_tokens,
                          g->elem_size);
    if (g->window && n < sizeof(l->text))
      n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, " window=%u", g->window);
    if (g->flags & HIXL_KV_GROUP_CROSS_LAYER && n < sizeof(l->text))
      n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, " cross_layer");
    uint32_t shown = g->flags & HIXL_KV_GROUP_CROSS_LAYER ? g->nplanes : g->ppl;
    uint64_t h = 0xcbf29ce484222325ull;
    bool differ = false;
    for (uint32_t p = 0; p < g->nplanes; p++) {
      const struct kv_plane *q = &g->planes[p], *first = &g->planes[p % g->ppl];
      differ |= q->bytes != first->bytes || q->heads != first->heads;
      h = (h ^ model_bytes(g, q)) * 0x100000001b3ull;
      h = (h ^ model_heads(g, q)) * 0x100000001b3ull;
    }
    for (uint32_t p = 0; p < shown && n < sizeof(l->text); p++)
      n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, "%s%" PRIu64,
                            p ? "," : " planes=", model_bytes(g, &g->planes[p]));
    for (uint32_t p = 0; p < shown && g->planes[0].heads && n < sizeof(l->text); p++)
      n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, "%s%u",
                            p ? "," : " heads=", model_heads(g, &g->planes[p]));
    if (differ && n < sizeof(l->text))
      n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, " sizes#%016" PRIx64, h);
    if (n < sizeof(l->text)) n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, "]");
  }
  if (n < sizeof(l->text)) n += (size_t)snprintf(l->text + n, sizeof(l->text) - n, " tp=%u", world);
  return n < sizeof(l->text); /* else cut: no " tp=", and no peer would match it */
}

/* A group's KV heads over every rank (kv_tp.c): total (0: the planes' heads times the
 * world size); its planes must hold this rank's share. MLA: none (every rank holds the
 * same latent). */
static hixl_kv_status group_heads(struct kv_group *d, size_t gi, uint32_t total, uint32_t world,
                                  const char *fn) {
  uint32_t heads = d->planes[0].heads;
  CHECK_ARG(d->kind != HIXL_KV_GROUP_MLA || total == 0,
            "%s: group %zu: an MLA group holds the same latent on every rank: total_kv_heads must be 0", fn,
            gi);
  if (d->kind == HIXL_KV_GROUP_MLA || heads == 0) return HIXL_KV_SUCCESS;
  for (uint32_t p = 1; p < d->nplanes; p++)
    CHECK_ARG(d->planes[p].heads == heads,
              "%s: group %zu: plane %u has %u heads, plane 0 %u (every plane of a "
              "group holds this rank's heads)",
              fn, gi, p, d->planes[p].heads, heads);
  uint64_t k = total ? total : (uint64_t)heads * world;
  CHECK_ARG(k <= UINT32_MAX, "%s: group %zu: %u heads per rank over %u ranks: more KV heads than %u", fn, gi,
            heads, world, UINT32_MAX);
  d->kheads = (uint32_t)k;
  uint32_t want = world <= d->kheads ? d->kheads / world : 1;
  CHECK_ARG((world <= d->kheads ? d->kheads % world == 0 : world % d->kheads == 0) && heads == want,
            "%s: group %zu: %u KV heads over %u ranks: a rank holds %s%u, its planes %u", fn, gi, d->kheads,
            world,
            (world <= d->kheads ? d->kheads % world : world % d->kheads) ? "(they do not divide) " : "", want,
            heads);
  return HIXL_KV_SUCCESS;
}

size_t kv_layout_core_len(const char *text) {
  const char *t = strstr(text, " tp=");
  return t ? (size_t)(t - text) : strlen(text);
}

uint32_t kv_layout_world(const char *text) {
  const char *t = strstr(text, " tp=");
  unsigned long w = t ? strtoul(t + 4, NULL, 10) : 0;
  return w <= KV_TP_MAX ? (uint32_t)w : 0;
}

/* A layout name the digest and the handshake metadata's JSON carry as they are. */
static bool name_ok(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\') return false;
  return true;
}

/* Group i of the host's array: its elements are the host's sizeof(hixl_kv_group)
 * (groups[0].size, checked), 80 bytes for a host built against 1.3 or 1.4. */
static const hixl_kv_group *group_at(const hixl_kv_group *groups, size_t i) {
  return (const hixl_kv_group *)(const void *)((const uint8_t *)groups + i * groups[0].size);
}

hixl_kv_status kv_layout_build(struct kv_layout *out, const hixl_kv_group *groups, size_t ng, uint32_t world,
                               bool need_base, const char *fn) {
  CHECK_ARG(groups && ng > 0 && ng <= KV_MAX_GROUPS, "%s: %zu groups; 1 to %u", fn, ng, KV_MAX_GROUPS);
  CHECK_ARG(groups[0].size >= HIXL_KV_GROUP_SIZE_1_3 && groups[0].size % _Alignof(hixl_kv_group) == 0,
            "%s: group 0: size %u; set it to sizeof(hixl_kv_group) (%zu)", fn, groups[0].size,
            sizeof(hixl_kv_group));
  struct kv_layout l = {0};
  char why[256];
  uint32_t total = 0, maxid = 0;
  for (size_t gi = 0; gi < ng; gi++) {
    const hixl_kv_group *g = group_at(groups, gi);
    CHECK_ARG(g->size == groups[0].size, "%s: group %zu: size %u where group 0's is %u: one host, one size",
              fn, gi, g->size, groups[0].size);
    CHECK_ARG(kind_name(g->kind), "%s: group %zu: kind %u is unknown", fn, gi, g->kind);
    CHECK_ARG((g->flags & ~HIXL_KV_GROUP_CROSS_LAYER) == 0 && g->reserved == 0 &&
                  (g->size < sizeof(hixl_kv_group) || g->reserved2 == 0), /* a 1.3 host's ends before it */
              "%s: group %zu: flags 0x%x has unknown bits, or reserved or reserved2 is not 0", fn, gi,
              g->flags);
    CHECK_ARG(g->num_layers > 0 && g->num_layers <= KV_MAX_LAYERS && g->planes_per_layer > 0 && g->planes &&
                  g->num_blocks > 0 && g->block_tokens > 0 && g->elem_size > 0,
              "%s: group %zu: num_layers (1 to %u), planes_per_layer, planes, num_blocks, block_tokens and "
              "elem_size must be set",
              fn, gi, KV_MAX_LAYERS);
    CHECK_ARG((g->kind == HIXL_KV_GROUP_SLIDING_WINDOW) == (g->window_tokens > 0),
              "%s: group %zu: window_tokens %u goes with kind sliding window, and only with it", fn, gi,
              g->window_tokens);
    CHECK_ARG(
        !g->layout_len ||
            (g->layout && g->layout_len < sizeof(l.g[0].layout) && name_ok(g->layout, g->layout_len)),
        "%s: group %zu: layout name must be 1 to %zu bytes of printable ASCII without spaces, quotes or "
        "backslashes",
        fn, gi, sizeof(l.g[0].layout) - 1);
    uint64_t np = (uint64_t)g->planes_per_layer * (g->flags & HIXL_KV_GROUP_CROSS_LAYER ? 1 : g->num_layers);
    CHECK_ARG(total + np <= KV_MAX_PLANES, "%s: %" PRIu64 " planes in group %zu; at most %u in all", fn, np,
              gi, KV_MAX_PLANES);
    for (uint64_t p = 0; p < np; p++)
      if (!plane_ok(&g->planes[p], g->num_blocks, g->elem_size, need_base, why, sizeof(why)))
        return kv_fail(HIXL_KV_PARAM_INVALID, "%s: group %zu, plane %" PRIu64 ": %s", fn, gi, p, why);
    for (uint32_t i = 0; i < g->num_layers; i++) {
      uint64_t id = g->layer_ids ? g->layer_ids[i] : (uint64_t)g->first_layer + i;
      CHECK_ARG(id < KV_MAX_LAYERS, "%s: group %zu: layer id %" PRIu64 " is not below %u", fn, gi, id,
                KV_MAX_LAYERS);
      if (id > maxid) maxid = (uint32_t)id;
    }
    total += (uint32_t)np;
  }
  l.nlayers = maxid + 1;
  l.nplanes = total;
  if (!(l.g = calloc(ng, sizeof(*l.g))) || !(l.map = malloc(l.nlayers * sizeof(*l.map)))) {
    kv_layout_free(&l);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  for (uint32_t i = 0; i < l.nlayers; i++) l.map[i].group = UINT32_MAX;
  for (size_t gi = 0; gi < ng; gi++, l.ng++) {
    const hixl_kv_group *g = group_at(groups, gi);
    struct kv_group *d = &l.g[gi];
    d->kind = g->kind;
    d->flags = g->flags;
    d->nlayers = g->num_layers;
    d->ppl = g->planes_per_layer;
    d->nplanes = g->planes_per_layer * (g->flags & HIXL_KV_GROUP_CROSS_LAYER ? 1 : g->num_layers);
    d->num_blocks = g->num_blocks;
    d->block_tokens = g->block_tokens;
    d->elem_size = g->elem_size;
    d->window = g->window_tokens;
    if (g->layout_len) memcpy(d->layout, g->layout, g->layout_len);
    if (!(d->layer_ids = malloc(d->nlayers * sizeof(*d->layer_ids))) ||
        !(d->planes = malloc(d->nplanes * sizeof(*d->planes)))) {
      l.ng++;
      kv_layout_free(&l);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    }
    for (uint32_t p = 0; p < d->nplanes; p++) {
      const hixl_kv_plane *s = &g->planes[p];
      d->planes[p] = (struct kv_plane){s->base, s->block_stride, s->block_bytes,
                                       s->num_heads ? s->head_stride : 0, s->num_heads};
      d->bytes_per_block += s->block_bytes;
    }
    uint32_t pa, pb;
    if (group_planes_share(d, &pa, &pb)) {
      l.ng++;
      kv_layout_free(&l);
      return kv_fail(HIXL_KV_PARAM_INVALID,
                     "%s: group %zu: planes %u and %u share bytes (or interleave with different "
                     "block_strides): a load into one would overwrite the other",
                     fn, gi, pa, pb);
    }
    uint32_t kheads = g->size >= sizeof(hixl_kv_group) ? g->total_kv_heads : 0;
    hixl_kv_status hst = group_heads(d, gi, kheads, world, fn);
    if (hst != HIXL_KV_SUCCESS) {
      l.ng++;
      kv_layout_free(&l);
      return hst;
    }
    for (uint32_t i = 0; i < d->nlayers; i++) {
      uint32_t id = g->layer_ids ? g->layer_ids[i] : g->first_layer + i;
      d->layer_ids[i] = id;
      if (l.map[id].group != UINT32_MAX) {
        kv_layout_free(&l);
        return kv_fail(HIXL_KV_PARAM_INVALID, "%s: layer %u is in two groups (%u and %zu)", fn, id,
                       l.map[id].group, gi);
      }
      l.map[id].group = (uint32_t)gi;
      l.map[id].index = i;
      if (id > d->last_layer) d->last_layer = id;
    }
  }
  for (uint32_t i = 0; i < l.nlayers; i++)
    if (l.map[i].group == UINT32_MAX) {
      kv_layout_free(&l);
      return kv_fail(HIXL_KV_PARAM_INVALID, "%s: layer %u is in no group (layers 0 to %u must all be)", fn, i,
                     l.nlayers - 1);
    }
  if (!(l.by_base = malloc((l.nplanes ? l.nplanes : 1) * sizeof(*l.by_base)))) {
    kv_layout_free(&l);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  for (uint32_t gi = 0, k = 0; gi < l.ng; gi++)
    for (uint32_t p = 0; p < l.g[gi].nplanes; p++) l.by_base[k++] = (struct kv_plane_at){gi, p};
  qsort_r(l.by_base, l.nplanes, sizeof(*l.by_base), cmp_by_base, &l);
  if (!layout_text(&l, world)) {
    uint32_t np = l.nplanes;
    kv_layout_free(&l);
    return kv_fail(
        HIXL_KV_PARAM_INVALID,
        "%s: %zu groups of %u planes: the compatibility digest (each group's plane sizes and heads) "
        "is longer than %u bytes; describe fewer planes (a cross-layer group: one per block)",
        fn, ng, np, KV_LAYOUT_TEXT - 1);
  }
  *out = l;
  return HIXL_KV_SUCCESS;
}

uint64_t kv_request_bytes(const hixl_kv_connector *c, const uint32_t *gn, uint32_t ngroups) {
  uint64_t b = 0;
  for (uint32_t g = 0; g < ngroups && g < c->lay.ng; g++) b += gn[g] * c->lay.g[g].bytes_per_block;
  return b;
}

/* ---- the plane table a peer learns (PIN and ACCEPT answers) ---- */

void kv_layout_put_planes(struct kv_out *o, const struct kv_layout *l) {
  kv_put_u32(o, l->nplanes);
  for (uint32_t g = 0; g < l->ng; g++) {
    kv_put_u64(o, l->g[g].num_blocks);
    for (uint32_t p = 0; p < l->g[g].nplanes; p++) {
      const struct kv_plane *q = &l->g[g].planes[p];
      kv_put_u64(o, q->base);
      kv_put_u64(o, q->stride);
      kv_put_u64(o, q->head_stride);
    }
  }
}

bool kv_layout_get_planes(struct kv_in *in, const struct kv_layout *l, uint32_t world,
                          struct kv_remote *out) {
  if (kv_get_u32(in) != l->nplanes || in->bad) return false;
  struct kv_plane *v = malloc((l->nplanes ? l->nplanes : 1) * sizeof(*v));
  if (!v) return false;
  uint32_t k = 0;
  for (uint32_t g = 0; g < l->ng; g++) {
    out->num_blocks[g] = kv_get_u64(in);
    if (out->num_blocks[g] == 0 || out->num_blocks[g] > KV_MAX_NUM_BLOCKS) in->bad = true;
    /* Its heads: a head-split group's share of world ranks (the digests matched). */
    uint32_t theirs = l->g[g].kheads ? kv_tp_heads(&l->g[g], world) : 0;
    for (uint32_t p = 0; p < l->g[g].nplanes; p++, k++) {
      const struct kv_plane *mine = &l->g[g].planes[p];
      v[k].base = kv_get_u64(in);
      v[k].stride = kv_get_u64(in);
      v[k].head_stride = kv_get_u64(in);
      v[k].bytes = theirs ? mine->bytes / mine->heads * theirs : mine->bytes;
      v[k].heads = theirs ? theirs : mine->heads;
      if (!v[k].base || v[k].stride > (UINT64_C(1) << 46) ||
          (v[k].heads ? v[k].head_stride < v[k].bytes / v[k].heads || v[k].head_stride > (UINT64_C(1) << 46)
                      : v[k].head_stride != 0))
        in->bad = true;
    }
  }
  if (in->bad) {
    free(v);
    return false;
  }
  out->planes = v;
  return true;
}

/* ---- op lists ---- */

static int cmp_piece(const void *a, const void *b) {
  uintptr_t x = ((const HixlTransferOpDesc *)a)->local_addr, y = ((const HixlTransferOpDesc *)b)->local_addr;
  return x < y ? -1 : x > y;
}

static int cmp_run(const void *a, const void *b) {
  uint64_t x = ((const struct kv_run *)a)->local, y = ((const struct kv_run *)b)->local;
  return x < y ? -1 : x > y;
}

void kv_runs_free(struct kv_runs *runs) {
  for (uint32_t g = 0; g < KV_MAX_GROUPS; g++) {
    free(runs->v[g]);
    runs->v[g] = NULL;
    runs->n[g] = 0;
  }
}

hixl_kv_status kv_runs_build(struct kv_runs *out, const struct kv_layout *l, const struct kv_remote *r,
                             const struct kv_pairs *pairs, char *why, size_t cap) {
  memset(out, 0, sizeof(*out));
  for (uint32_t gi = 0; gi < l->ng; gi++) {
    const struct kv_group *g = &l->g[gi];
    const struct kv_pairs *pr = &pairs[gi];
    struct kv_run *v = pr->n ? malloc(pr->n * sizeof(*v)) : NULL;
    if (pr->n && !v) {
      kv_runs_free(out);
      snprintf(why, cap, "out of memory");
      return HIXL_KV_RESOURCE_EXHAUSTED;
    }
    bool sorted = true;
    for (size_t j = 0; j < pr->n; j++) {
      if (pr->local[j] >= g->num_blocks || pr->remote[j] >= r->num_blocks[gi]) {
        snprintf(why, cap,
                 "group %u: block %" PRIu64 " here or %" PRIu64 " there is past its %" PRIu64 " or %" PRIu64
                 " blocks",
                 gi, pr->local[j], pr->remote[j], g->num_blocks, r->num_blocks[gi]);
        free(v);
        kv_runs_free(out);
        return HIXL_KV_PARAM_INVALID;
      }
      v[j] = (struct kv_run){pr->local[j], pr->remote[j], 1};
      sorted = sorted && (j == 0 || v[j - 1].local <= v[j].local);
    }
    if (!sorted) qsort(v, pr->n, sizeof(*v), cmp_run);
    size_t k = 0; /* join blocks adjacent on both sides */
    for (size_t j = 0; j < pr->n; j++)
      if (k && v[k - 1].local + v[k - 1].n == v[j].local && v[k - 1].remote + v[k - 1].n == v[j].remote)
        v[k - 1].n++;
      else
        v[k++] = v[j];
    out->v[gi] = v;
    out->n[gi] = k;
  }
  return HIXL_KV_SUCCESS;
}

/* Append [lo, +len) <-> [ro, +len), extending the last op where both run on (opvec_add,
 * without its call for each piece). */
static int piece_add(struct opvec *o, uint64_t lo, uint64_t ro, uint64_t len) {
  HixlTransferOpDesc *last = o->n ? &o->v[o->n - 1] : NULL;
  if (last && last->local_addr + last->len == lo && last->remote_addr + last->len == ro) {
    last->len += (size_t)len;
    o->bytes += len;
    return 0;
  }
  return opvec_add(o, lo, ro, len, false);
}

/* Plane p of both sides over a group's runs: whole blocks (the same bytes and heads on
 * both), or hs's heads (a head's bytes the same on both). A run is one piece where its
 * blocks' bytes lie end to end on both sides (every head moved, heads adjacent, blocks
 * back to back); else a piece per block per head, adjacent ones joined. */
static int plane_pieces(struct opvec *o, const struct kv_plane *lp, const struct kv_plane *rp,
                        const struct kv_run *runs, size_t nruns, const struct kv_heads *hs) {
  bool whole = !hs || hs->whole;
  uint32_t heads = whole ? (lp->heads ? lp->heads : 1) : hs->n;
  uint64_t len = lp->bytes / (lp->heads ? lp->heads : 1);
  uint32_t lh = whole ? 0 : hs->local, rh = whole ? 0 : hs->remote;
  bool flat = whole && (heads == 1 || (lp->head_stride == len && rp->head_stride == len)) &&
              lp->stride == heads * len && rp->stride == heads * len;
  for (size_t k = 0; k < nruns; k++) {
    const struct kv_run *u = &runs[k];
    if (flat) {
      if (piece_add(o, lp->base + u->local * lp->stride, rp->base + u->remote * rp->stride,
                    u->n * heads * len) < 0)
        return -1;
      continue;
    }
    for (uint64_t j = 0; j < u->n; j++)
      for (uint32_t h = 0; h < heads; h++) {
        uint64_t lo = lp->base + (u->local + j) * lp->stride + (lh + h) * lp->head_stride;
        uint64_t ro = rp->base + (u->remote + j) * rp->stride + (rh + h) * rp->head_stride;
        if (piece_add(o, lo, ro, len) < 0) return -1;
      }
  }
  return 0;
}

hixl_kv_status kv_ops_runs(struct opvec *o, const struct kv_layout *l, const struct kv_remote *r,
                           uint32_t first, uint32_t count, const struct kv_runs *runs,
                           const struct kv_heads *hs, char *why, size_t cap) {
  uint32_t off[KV_MAX_GROUPS]; /* group g's first plane in r->planes */
  for (uint32_t gi = 0, k = 0; gi < l->ng; k += l->g[gi++].nplanes) off[gi] = k;
  /* Planes by base, each over its runs (ascending): the pieces come out ascending
   * unless planes interleave (a block-major layout) or a plane's heads lie past its
   * next block; only then are they sorted. */
  bool sorted = true;
  for (uint32_t i = 0; i < l->nplanes; i++) {
    uint32_t gi = l->by_base[i].group, p = l->by_base[i].plane;
    const struct kv_group *g = &l->g[gi];
    if (!runs->n[gi]) continue;
    bool cross = g->flags & HIXL_KV_GROUP_CROSS_LAYER;
    uint32_t id = cross ? g->last_layer : g->layer_ids[p / g->ppl]; /* a cross-layer group moves whole, */
    if (id < first || id - first >= count) continue;                /* with its last layer */
    size_t before = o->n;
    if (plane_pieces(o, &g->planes[p], &r->planes[off[gi] + p], runs->v[gi], runs->n[gi],
                     hs ? &hs[gi] : NULL) < 0) {
      snprintf(why, cap, "out of memory");
      return HIXL_KV_RESOURCE_EXHAUSTED;
    }
    for (size_t j = before ? before : 1; j < o->n && sorted; j++)
      sorted = o->v[j - 1].local_addr < o->v[j].local_addr;
  }
  if (o->n > 1) { /* across planes: a block-major layout's layers of one block are adjacent */
    if (!sorted) qsort(o->v, o->n, sizeof(*o->v), cmp_piece);
    size_t k = 0;
    for (size_t j = 1; j < o->n; j++) {
      HixlTransferOpDesc *a = &o->v[k], *b = &o->v[j];
      if (a->local_addr + a->len == b->local_addr && a->remote_addr + a->len == b->remote_addr)
        a->len += b->len;
      else
        o->v[++k] = *b;
    }
    o->n = k + 1;
  }
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_ops_build(struct opvec *o, const struct kv_layout *l, const struct kv_remote *r,
                            uint32_t first, uint32_t count, const struct kv_pairs *pairs,
                            const struct kv_heads *hs, char *why, size_t cap) {
  struct kv_runs runs;
  hixl_kv_status st = kv_runs_build(&runs, l, r, pairs, why, cap);
  if (st == HIXL_KV_SUCCESS) st = kv_ops_runs(o, l, r, first, count, &runs, hs, why, cap);
  kv_runs_free(&runs);
  return st;
}

/* ---- the memory behind the planes ---- */

struct kv_span {
  uint64_t lo, hi;
};

static int cmp_span(const void *a, const void *b) {
  uint64_t x = ((const struct kv_span *)a)->lo, y = ((const struct kv_span *)b)->lo;
  return x < y ? -1 : x > y;
}

hixl_kv_status kv_layout_register(hixl_kv_connector *c, const struct kv_layout *l, const char *fn) {
  struct kv_span *s = malloc((l->nplanes ? l->nplanes : 1) * sizeof(*s));
  if (!s) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  size_t n = 0;
  pthread_mutex_lock(&c->lock); /* alloc_kv_memory on another thread grows c->mems */
  for (uint32_t gi = 0; gi < l->ng; gi++)
    for (uint32_t p = 0; p < l->g[gi].nplanes; p++) {
      const struct kv_plane *q = &l->g[gi].planes[p];
      uint64_t lo = q->base, hi = q->base + (l->g[gi].num_blocks - 1) * q->stride + piece_span(q);
      bool inside = false; /* in memory alloc_kv_memory gave: registered already */
      for (size_t a = 0; a < c->nmems; a++) {
        const struct kv_mem *m = &c->mems[a];
        bool in = lo >= m->base && hi <= m->base + m->len;
        if (!in && lo < m->base + m->len && hi > m->base) { /* across its start or its end */
          pthread_mutex_unlock(&c->lock);
          free(s);
          return kv_fail(HIXL_KV_PARAM_INVALID,
                         "%s: group %u, plane %u [0x%" PRIx64 ", 0x%" PRIx64
                         ") runs across the alloc_kv_memory region [0x%" PRIx64 ", +%" PRIu64
                         "): a plane lies wholly inside one or outside all",
                         fn, gi, p, lo, hi, m->base, m->len);
        }
        inside |= in;
      }
      if (!inside) s[n++] = (struct kv_span){lo, hi};
    }
  pthread_mutex_unlock(&c->lock);
  qsort(s, n, sizeof(*s), cmp_span);
  size_t m = 0; /* spans that overlap or touch: one registration (one MR over rdma) */
  for (size_t j = 0; j < n; j++)
    if (m && s[j].lo <= s[m - 1].hi) {
      if (s[j].hi > s[m - 1].hi) s[m - 1].hi = s[j].hi;
    } else {
      s[m++] = s[j];
    }
  HixlMemHandle *h = calloc(m ? m : 1, sizeof(*h));
  if (!h) {
    free(s);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  for (size_t j = 0; j < m; j++) {
    HixlMemDesc md = {(uintptr_t)s[j].lo, (size_t)(s[j].hi - s[j].lo)};
    HixlStatus st =
        HixlEngineRegisterMem(c->eng, &md, c->cfg.kv_device ? HIXL_MEM_DEVICE : HIXL_MEM_HOST, &h[j]);
    if (st != HIXL_SUCCESS) {
      hixl_kv_status r = kv_fail(st, "%s: registering [0x%" PRIx64 ", +%" PRIu64 "): %s", fn, s[j].lo,
                                 s[j].hi - s[j].lo, HixlGetLastErrorMessage());
      while (j--) HixlEngineDeregisterMem(c->eng, h[j]);
      free(h);
      free(s);
      return r;
    }
  }
  free(s);
  c->regs = h;
  c->nregs = m;
  return HIXL_KV_SUCCESS;
}
