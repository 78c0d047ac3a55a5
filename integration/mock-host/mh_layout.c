/* mh_layout: the KV cache's layouts. Each is a tensor whose axes come in a named
 * order; a layer is a strided view of it, as a runtime's tensor.select(L, layer). The
 * view gives both where a token's K and V live (struct mh_view, which compute and
 * verify use) and the planes register_kv_groups is told (hixl_kv_plane), derived from
 * the view's shape and strides as a runtime would derive them from a torch tensor.
 *
 * Axes: L layers, B blocks, S K|V (2), N tokens of a block, H KV heads, C channels
 * (elements; head_dim, or 2 * head_dim where K|V are packed in C). An MLA model has
 * no K|V: its S axis is dropped and C is the latent. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mh.h"

#define MAX_AXES 6
#define PAGE     4096u

static const struct {
  const char *name;
  const char *axes; /* outermost first; L first: every layer its own tensor */
} layouts[MH_LAYOUT_COUNT] = {
    [MH_LAYOUT_KV_FIRST] = {"kv_first", "LSBNHC"}, [MH_LAYOUT_BLOCKS_FIRST] = {"blocks_first", "LBSNHC"},
    [MH_LAYOUT_PACKED] = {"packed", "LBHNC"},      [MH_LAYOUT_LBNHC] = {"LBNHC", "LBNHC"},
    [MH_LAYOUT_LBHNC] = {"LBHNC", "LBHNC"},        [MH_LAYOUT_LHBNC] = {"LHBNC", "LHBNC"},
    [MH_LAYOUT_BLNHC] = {"BLNHC", "BLNHC"},        [MH_LAYOUT_BLHNC] = {"BLHNC", "BLHNC"},
    [MH_LAYOUT_BHLNC] = {"BHLNC", "BHLNC"},        [MH_LAYOUT_CROSS_LAYER] = {"cross_layer", "BLSNHC"},
};

const char mh_layout_list[] = "kv_first, blocks_first, packed, LBNHC, LBHNC, LHBNC, BLNHC, BLHNC, BHLNC, "
                              "cross_layer";

int mh_layout_parse(const char *name, uint32_t *layout) {
  for (uint32_t i = 0; i < MH_LAYOUT_COUNT; i++)
    if (strcmp(name, layouts[i].name) == 0) {
      *layout = i;
      return 0;
    }
  return -1;
}

const char *mh_layout_name(uint32_t layout) { return layout < MH_LAYOUT_COUNT ? layouts[layout].name : "?"; }

/* The per-layer layouts (kv_first, blocks_first, packed) are a tensor per layer, each
 * page-aligned; the others one tensor for every layer. */
static bool per_layer(uint32_t layout) { return layout <= MH_LAYOUT_PACKED; }

bool mh_layout_v10(const struct mh_model *m) {
  return m->layout == MH_LAYOUT_KV_FIRST && m->kind == MH_MODEL_STANDARD;
}

bool mh_layout_head_major(uint32_t layout) {
  return layout == MH_LAYOUT_PACKED || layout == MH_LAYOUT_LBHNC || layout == MH_LAYOUT_LHBNC ||
         layout == MH_LAYOUT_BLHNC || layout == MH_LAYOUT_BHLNC;
}

bool mh_layout_check(const struct mh_model *m, char *err, size_t cap) {
  if (m->layout >= MH_LAYOUT_COUNT) {
    snprintf(err, cap, "layout %u is unknown (%s)", m->layout, mh_layout_list);
    return false;
  }
  if (m->kind == MH_MODEL_HYBRID && m->layout == MH_LAYOUT_CROSS_LAYER) {
    snprintf(err, cap, "a hybrid model's groups hold different blocks; cross_layer puts every layer in one");
    return false;
  }
  return true;
}

/* ---- tensors, as a runtime hands them over ---- */

struct tensor {
  uintptr_t data;
  uint32_t ndim;
  char axis[MAX_AXES];
  uint64_t shape[MAX_AXES];
  uint64_t stride[MAX_AXES]; /* elements, as torch's */
};

static int axis_of(const struct tensor *t, char a) {
  for (uint32_t i = 0; i < t->ndim; i++)
    if (t->axis[i] == a) return (int)i;
  return -1;
}

/* The layout's tensor for the whole model, contiguous, at data. */
static struct tensor tensor_make(const struct mh_model *m, uintptr_t data) {
  struct tensor t = {.data = data};
  bool kv = mh_kv_parts(m) == 2, packed = kv && !strchr(layouts[m->layout].axes, 'S');
  for (const char *a = layouts[m->layout].axes; *a; a++) {
    uint64_t n = *a == 'L'   ? m->layers
                 : *a == 'B' ? m->num_blocks
                 : *a == 'S' ? 2
                 : *a == 'N' ? m->block_tokens
                 : *a == 'H' ? m->kv_heads
                             : (uint64_t)m->head_dim * (packed ? 2 : 1);
    if (*a == 'S' && !kv) continue; /* MLA: one latent, no K|V */
    t.axis[t.ndim] = *a;
    t.shape[t.ndim++] = n;
  }
  for (uint32_t i = t.ndim; i-- > 0;) t.stride[i] = i + 1 == t.ndim ? 1 : t.stride[i + 1] * t.shape[i + 1];
  return t;
}

/* tensor.select(axis, index): the view without that axis. */
static struct tensor tensor_select(const struct tensor *t, char a, uint64_t index, uint32_t elem) {
  struct tensor v = {.data = t->data};
  int k = axis_of(t, a);
  v.data += index * t->stride[k] * elem;
  for (uint32_t i = 0; i < t->ndim; i++) {
    if ((int)i == k) continue;
    v.axis[v.ndim] = t->axis[i];
    v.shape[v.ndim] = t->shape[i];
    v.stride[v.ndim++] = t->stride[i];
  }
  return v;
}

static uint64_t stride_bytes(const struct tensor *t, char a, uint32_t elem) {
  int k = axis_of(t, a);
  return k < 0 ? 0 : t->stride[k] * elem;
}

/* A layer's view: the address of each token's K, V (an S axis, or the halves of a
 * packed C) and head. */
static int view_of(const struct mh_model *m, const struct tensor *t, struct mh_view *out, char *err,
                   size_t cap) {
  uint32_t e = m->elem_size;
  if (stride_bytes(t, 'C', e) != e) {
    snprintf(err, cap, "layout %s: channels are not contiguous", mh_layout_name(m->layout));
    return -1;
  }
  *out = (struct mh_view){.base = t->data,
                          .block = stride_bytes(t, 'B', e),
                          .kv = axis_of(t, 'S') >= 0 ? stride_bytes(t, 'S', e) : (uint64_t)m->head_dim * e,
                          .token = stride_bytes(t, 'N', e),
                          .head = stride_bytes(t, 'H', e)};
  return 0;
}

/* The planes of a tensor whose B axis indexes blocks, as a runtime derives them from
 * shape and strides: the other axes, innermost first, must form one contiguous run
 * (a block of block_bytes), except an S axis outside it (then a plane for K and one
 * for V) and an H axis outside it (then num_heads pieces, head_stride apart: the heads
 * of a block lie apart when H is outside B, as in LHBNC, or outside L, as in BHLNC).
 * Axes of one element take no part. Writes at most cap planes. */
static int planes_of(const struct mh_model *m, const struct tensor *t, hixl_kv_plane *out, uint32_t cap,
                     uint32_t *n, char *err, size_t errcap) {
  uint32_t e = m->elem_size, order[MAX_AXES], k = 0;
  int ib = axis_of(t, 'B'), is = -1, ih = -1;
  for (uint32_t i = 0; i < t->ndim; i++)
    if ((int)i != ib && t->shape[i] > 1) order[k++] = i;
  for (uint32_t i = 1; i < k; i++) /* by stride, innermost first */
    for (uint32_t j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; j--) {
      uint32_t x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  uint64_t run = 1; /* elements */
  int outer = -1;   /* the outermost axis of the run */
  for (uint32_t i = 0; i < k; i++) {
    uint32_t a = order[i];
    if (t->stride[a] == run) {
      run *= t->shape[a];
      outer = (int)a;
    } else if (t->axis[a] == 'S' && is < 0)
      is = (int)a;
    else if (t->axis[a] == 'H' && ih < 0)
      ih = (int)a;
    else {
      snprintf(err, errcap,
               "layout %s: axis %c (stride %" PRIu64 ") lies apart from the axes inside a block "
               "(contiguous for %" PRIu64 " elements), and a plane splits only by K|V and by head",
               mh_layout_name(m->layout), t->axis[a], t->stride[a], run);
      return -1;
    }
  }
  uint32_t heads = ih < 0 ? 0 : (uint32_t)t->shape[ih];
  uint64_t bytes = run * e * (heads ? heads : 1), head_stride = ih < 0 ? 0 : t->stride[ih] * e;
  /* A TP run names a block's heads where they lie side by side too (H the outermost axis
   * of the block's run: packed, LBHNC, BLHNC), so that a peer of another TP size can cut
   * head slices; a rank's one head is one piece. */
  if (m->tp && m->kind != MH_MODEL_MLA && !heads && outer >= 0 && t->axis[outer] == 'H') {
    heads = (uint32_t)t->shape[outer];
    head_stride = t->stride[outer] * e;
  } else if (m->tp && m->kind != MH_MODEL_MLA && !heads && m->kv_heads == 1) {
    heads = 1;
    head_stride = bytes;
  }
  uint32_t np = is < 0 ? 1 : (uint32_t)t->shape[is];
  if (np > cap) {
    snprintf(err, errcap, "layout %s: %u planes a layer, room for %u", mh_layout_name(m->layout), np, cap);
    return -1;
  }
  for (uint32_t p = 0; p < np; p++)
    out[p] = (hixl_kv_plane){.base = t->data + (is < 0 ? 0 : p * t->stride[is] * e),
                             .block_stride = t->stride[ib] * e,
                             .block_bytes = bytes,
                             .head_stride = head_stride,
                             .num_heads = heads};
  *n = np;
  return 0;
}

/* Bytes the layout needs from one region: a per-layer layout's tensors each start on
 * a page, as separate allocations would. */
static uint64_t layer_bytes(const struct mh_model *m) {
  uint64_t b = m->num_blocks * mh_block_bytes(m) * mh_kv_parts(m);
  return (b + PAGE - 1) / PAGE * PAGE;
}

static uint64_t layout_bytes(const struct mh_model *m) {
  uint64_t all = per_layer(m->layout) ? layer_bytes(m) * m->layers : m->num_blocks * mh_pool_block_bytes(m);
  return (all + PAGE - 1) / PAGE * PAGE;
}

/* Lay the layout out at base: every layer's view, and the groups of planes. */
static int layout_place(struct mh_cache *c, uintptr_t base, char *err, size_t cap) {
  const struct mh_model *m = &c->m;
  uint32_t L = m->layers, ng = mh_num_groups(m), ppl = 2; /* planes a layer, at most */
  bool cross = m->layout == MH_LAYOUT_CROSS_LAYER;
  if (!(c->views = calloc(L, sizeof(*c->views))) ||
      !(c->planes = calloc((size_t)L * ppl, sizeof(*c->planes))) ||
      !(c->layer_ids = calloc(L, sizeof(*c->layer_ids)))) {
    snprintf(err, cap, "out of memory describing %u layers", L);
    return -1;
  }
  struct tensor whole = tensor_make(m, base);
  uint32_t np = 0, nplanes = 0, nids = 0;
  for (uint32_t g = 0; g < ng; g++) {
    hixl_kv_group *gr = &c->groups[g];
    *gr = (hixl_kv_group){.size = sizeof(*gr),
                          .kind = m->kind == MH_MODEL_MLA ? HIXL_KV_GROUP_MLA
                                  : g == 1                ? HIXL_KV_GROUP_SLIDING_WINDOW
                                                          : HIXL_KV_GROUP_FULL_ATTENTION,
                          .flags = cross ? HIXL_KV_GROUP_CROSS_LAYER : 0,
                          .layer_ids = ng > 1 ? c->layer_ids + nids : NULL,
                          .planes = c->planes + nplanes,
                          .num_blocks = m->num_blocks,
                          .block_tokens = m->block_tokens,
                          .elem_size = m->elem_size,
                          .window_tokens = g == 1 ? m->window_tokens : 0,
                          .layout = mh_layout_name(m->layout),
                          .layout_len = strlen(mh_layout_name(m->layout)),
                          .total_kv_heads = m->tp && m->kind != MH_MODEL_MLA ? m->total_heads : 0};
    if (cross) { /* one plane for every layer: the whole tensor, blocks outermost */
      if (planes_of(m, &whole, c->planes + nplanes, ppl, &np, err, cap) < 0) return -1;
      gr->num_layers = L;
      gr->planes_per_layer = np;
      nplanes += np;
    }
    for (uint32_t l = 0; l < L; l++) {
      if (mh_layer_group(m, l) != g) continue;
      struct tensor v;
      if (per_layer(m->layout)) { /* its own tensor, in a page-aligned region of its own */
        struct mh_model one = *m;
        one.layers = 1;
        struct tensor t = tensor_make(&one, base + l * layer_bytes(m));
        v = tensor_select(&t, 'L', 0, m->elem_size);
      } else {
        v = tensor_select(&whole, 'L', l, m->elem_size);
      }
      if (view_of(m, &v, &c->views[l], err, cap) < 0) return -1;
      if (cross) continue;
      if (planes_of(m, &v, c->planes + nplanes, ppl, &np, err, cap) < 0) return -1;
      if (gr->num_layers && np != gr->planes_per_layer) {
        snprintf(err, cap, "layout %s: layer %u has %u planes, layer %u %u", mh_layout_name(m->layout), l, np,
                 c->layer_ids[nids - 1], gr->planes_per_layer);
        return -1;
      }
      gr->planes_per_layer = np;
      gr->num_layers++;
      c->layer_ids[nids++] = l;
      nplanes += np;
    }
  }
  c->ngroups = ng;
  return 0;
}

/* ABI 1.0's kv_first views, from the layers' base and v_offset. */
static void views_v10(struct mh_cache *c) {
  const struct mh_model *m = &c->m;
  for (uint32_t l = 0; l < m->layers; l++)
    c->views[l] = (struct mh_view){.base = c->layers[l].base,
                                   .block = c->layers[l].block_bytes,
                                   .kv = c->layers[l].v_offset,
                                   .token = mh_token_bytes(m),
                                   .head = (uint64_t)m->head_dim * m->elem_size};
}

static bool has_op(const hixl_kv_ops *ops, size_t off, size_t size) { return ops->size >= off + size; }
#define HAS(ops, op) has_op((ops), offsetof(hixl_kv_ops, op), sizeof((ops)->op))

/* ABI 1.0: alloc_kv_caches, else the host's memory and register_kv_caches. */
static int attach_v10(struct mh_cache *c, const hixl_kv_ops *ops, hixl_kv_connector *w, bool host_memory,
                      enum mh_dev dev, const char *who, char *err, size_t cap) {
  const struct mh_model *m = &c->m;
  uint64_t per_layer_bytes = 2 * m->num_blocks * mh_block_bytes(m);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  host_memory = host_memory || dev != MH_DEV_NONE || !HAS(ops, alloc_kv_caches);
  if (!host_memory && (st = ops->alloc_kv_caches(w, c->layers, m->layers)) != HIXL_KV_SUCCESS) {
    /* As a runtime would: say why, then allocate the caches itself. */
    fprintf(stderr, "mock-host: %s: alloc_kv_caches failed (%s): %s; allocating the KV caches here instead\n",
            who, mh_status_name(st), ops->last_error());
    host_memory = true;
  }
  if (host_memory) {
    c->len = (size_t)(per_layer_bytes * m->layers);
    if (!(c->mem = calloc(1, c->len))) {
      snprintf(err, cap, "cannot allocate a KV cache of %zu bytes (%" PRIu64 " blocks); lower --kv-mib",
               c->len, m->num_blocks);
      return -1;
    }
    /* Device memory: the plugin gets the device's layers (zeroed as the host's copy is,
     * so both start alike); the host computes and checks in its copy (views below). */
    uintptr_t base = (uintptr_t)c->mem;
    if (dev != MH_DEV_NONE) {
      if (!(c->dev_base = mh_dev_alloc(dev, c->len, err, cap)) ||
          mh_dev_copy(dev, c->dev_base, c->mem, c->len, true, err, cap) < 0)
        return -1;
      c->dev = dev;
      base = c->dev_base;
    }
    for (uint32_t l = 0; l < m->layers; l++) {
      c->layers[l].base = base + l * per_layer_bytes;
      c->layers[l].v_offset = m->num_blocks * mh_block_bytes(m);
    }
    st = ops->register_kv_caches(w, c->layers, m->layers);
  }
  if (st != HIXL_KV_SUCCESS) {
    snprintf(err, cap, "%s(%u layers) failed (%s): %s",
             host_memory ? "register_kv_caches" : "alloc_kv_caches", m->layers, mh_status_name(st),
             ops->last_error());
    return -1;
  }
  if (!(c->views = calloc(m->layers, sizeof(*c->views)))) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  views_v10(c);
  for (uint32_t l = 0; c->dev != MH_DEV_NONE && l < m->layers; l++)
    c->views[l].base = (uintptr_t)c->mem + l * per_layer_bytes; /* the host's copy */
  return 0;
}

int mh_cache_mirror(const struct mh_cache *c, const uint64_t *blocks, uint64_t tokens, uint32_t first,
                    uint32_t n, bool to_device, char *err, size_t cap) {
  if (c->dev == MH_DEV_NONE) return 0;
  const struct mh_model *m = &c->m;
  uint64_t bb = mh_block_bytes(m), per_layer = 2 * m->num_blocks * bb;
  uint64_t nb = (tokens + m->block_tokens - 1) / m->block_tokens;
  for (uint32_t l = first; l < first + n && l < m->layers; l++)
    for (uint64_t i = 0; i < nb; i++)
      for (int v = 0; v < 2; v++) { /* K's block, then V's, v_offset after it */
        uint64_t off = l * per_layer + (uint64_t)v * m->num_blocks * bb + blocks[i] * bb;
        if (mh_dev_copy(c->dev, c->dev_base + off, c->mem + off, bb, to_device, err, cap) < 0) return -1;
      }
  return 0;
}

/* ABI 1.3: alloc_kv_memory, else the host's memory, then register_kv_groups. */
static int attach_groups(struct mh_cache *c, const hixl_kv_ops *ops, hixl_kv_connector *w, bool host_memory,
                         const char *who, char *err, size_t cap) {
  const struct mh_model *m = &c->m;
  if (!HAS(ops, register_kv_groups)) {
    snprintf(err, cap, "layout %s needs register_kv_groups (ABI 1.3); the plugin's table is ABI %u.%u",
             mh_layout_name(m->layout), ops->abi_version >> 16, ops->abi_version & 0xffff);
    return -1;
  }
  uint64_t len = layout_bytes(m);
  uintptr_t base = 0;
  hixl_kv_status st;
  if (!host_memory && HAS(ops, alloc_kv_memory) &&
      (st = ops->alloc_kv_memory(w, len, &base)) != HIXL_KV_SUCCESS) {
    fprintf(stderr,
            "mock-host: %s: alloc_kv_memory(%" PRIu64
            " bytes) failed (%s): %s; allocating the KV caches here "
            "instead\n",
            who, len, mh_status_name(st), ops->last_error());
    base = 0;
  }
  if (!base) {
    if (!(c->mem = aligned_alloc(PAGE, (size_t)len))) {
      snprintf(err, cap,
               "cannot allocate a KV cache of %" PRIu64 " bytes (%" PRIu64 " blocks); lower --kv-mib", len,
               m->num_blocks);
      return -1;
    }
    memset(c->mem, 0, (size_t)len);
    c->len = (size_t)len;
    base = (uintptr_t)c->mem;
  }
  if (layout_place(c, base, err, cap) < 0) return -1;
  if ((st = ops->register_kv_groups(w, c->groups, c->ngroups)) != HIXL_KV_SUCCESS) {
    snprintf(err, cap, "register_kv_groups(%u groups, layout %s, %s memory) failed (%s): %s", c->ngroups,
             mh_layout_name(m->layout), c->mem ? "the host's" : "hixl's", mh_status_name(st),
             ops->last_error());
    return -1;
  }
  return 0;
}

int mh_cache_attach(struct mh_cache *c, const hixl_kv_ops *ops, hixl_kv_connector *worker, bool host_memory,
                    enum mh_dev dev, const char *who, char *err, size_t cap) {
  if (!mh_layout_check(&c->m, err, cap)) return -1;
  if (dev != MH_DEV_NONE && !mh_layout_v10(&c->m)) {
    snprintf(err, cap, "KV caches in device memory: layout kv_first only (this host's copy follows it)");
    return -1;
  }
  return mh_layout_v10(&c->m) ? attach_v10(c, ops, worker, host_memory, dev, who, err, cap)
                              : attach_groups(c, ops, worker, host_memory, who, err, cap);
}

void mh_cache_describe(const struct mh_cache *c, const char *who) {
  if (!c->ngroups) {
    fprintf(stderr, "%s: KV cache: %u kv_first layers (register_kv_caches), layer 0 at 0x%" PRIxPTR "\n", who,
            c->m.layers, c->layers[0].base);
    return;
  }
  for (uint32_t g = 0; g < c->ngroups; g++) {
    const hixl_kv_group *gr = &c->groups[g];
    uint32_t np =
        gr->flags & HIXL_KV_GROUP_CROSS_LAYER ? gr->planes_per_layer : gr->num_layers * gr->planes_per_layer;
    fprintf(stderr,
            "%s: group %u: kind %u flags 0x%x, %u layers (first %u), %u planes a layer, %" PRIu64
            " blocks of %u tokens, window %u, layout %.*s\n",
            who, g, gr->kind, gr->flags, gr->num_layers, gr->layer_ids ? gr->layer_ids[0] : gr->first_layer,
            gr->planes_per_layer, gr->num_blocks, gr->block_tokens, gr->window_tokens, (int)gr->layout_len,
            gr->layout);
    for (uint32_t p = 0; p < np; p++)
      fprintf(stderr,
              "%s:   plane %u: base 0x%" PRIxPTR " block_stride %" PRIu64 " block_bytes %" PRIu64
              " heads %u head_stride %" PRIu64 "\n",
              who, p, gr->planes[p].base, gr->planes[p].block_stride, gr->planes[p].block_bytes,
              gr->planes[p].num_heads, gr->planes[p].head_stride);
  }
}
