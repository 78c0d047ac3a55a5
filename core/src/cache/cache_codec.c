/* cache_codec: keys (wire form, text, equality), tags, and the CACHE service's messages. */
/* Every message is big-endian, through util/be.h:
 *   request:       proto u8 (CM_PROTO), op u8, then for LOOKUP a key (HELLO: nothing)
 *   key:           kind u8, then REQ: cluster, req, model, prefix (u64 each);
 *                  ID: cluster u64, cache u64, batch u32; BLOCKS: cluster u64, model u64
 *   HELLO answer:  cluster u64, nonce u64
 *   LOOKUP answer: id u64, blocks u8, tensors u32, elem_size u32, batch u32, shape[0] u64,
 *                  tensor bytes u64, then each tensor's address u64
 * A failed call's answer is its reason, as text. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"

#define CM_TAG_PREFIX "hixl.cache/"

void cm_put_key(struct be_out *o, const HixlCacheAnyKey *k) {
  be_out_u8(o, (uint8_t)k->kind);
  switch (k->kind) {
  case HIXL_CACHE_KEY_REQ:
    be_out_u64(o, k->u.req.cluster_id);
    be_out_u64(o, k->u.req.req_id);
    be_out_u64(o, k->u.req.model_id);
    be_out_u64(o, k->u.req.prefix_id);
    break;
  case HIXL_CACHE_KEY_ID:
    be_out_u64(o, k->u.id.cluster_id);
    be_out_u64(o, k->u.id.cache_id);
    be_out_u32(o, k->u.id.batch_index);
    break;
  case HIXL_CACHE_KEY_BLOCKS:
    be_out_u64(o, k->u.blocks.cluster_id);
    be_out_u64(o, k->u.blocks.model_id);
    break;
  }
}

bool cm_get_key(struct be_in *i, HixlCacheAnyKey *k) {
  memset(k, 0, sizeof(*k));
  uint8_t kind = be_in_u8(i);
  switch (kind) {
  case HIXL_CACHE_KEY_REQ:
    k->u.req.cluster_id = be_in_u64(i);
    k->u.req.req_id = be_in_u64(i);
    k->u.req.model_id = be_in_u64(i);
    k->u.req.prefix_id = be_in_u64(i);
    break;
  case HIXL_CACHE_KEY_ID:
    k->u.id.cluster_id = be_in_u64(i);
    k->u.id.cache_id = be_in_u64(i);
    k->u.id.batch_index = be_in_u32(i);
    break;
  case HIXL_CACHE_KEY_BLOCKS:
    k->u.blocks.cluster_id = be_in_u64(i);
    k->u.blocks.model_id = be_in_u64(i);
    break;
  default: return false;
  }
  k->kind = (HixlCacheKeyKind)kind;
  return !i->bad;
}

uint64_t cm_key_cluster(const HixlCacheAnyKey *k) {
  return k->kind == HIXL_CACHE_KEY_REQ  ? k->u.req.cluster_id
         : k->kind == HIXL_CACHE_KEY_ID ? k->u.id.cluster_id
                                        : k->u.blocks.cluster_id;
}

bool cm_key_equal(const HixlCacheAnyKey *a, const HixlCacheAnyKey *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case HIXL_CACHE_KEY_REQ: return memcmp(&a->u.req, &b->u.req, sizeof(a->u.req)) == 0;
  case HIXL_CACHE_KEY_ID:
    return a->u.id.cluster_id == b->u.id.cluster_id && a->u.id.cache_id == b->u.id.cache_id &&
           a->u.id.batch_index == b->u.id.batch_index;
  case HIXL_CACHE_KEY_BLOCKS: return memcmp(&a->u.blocks, &b->u.blocks, sizeof(a->u.blocks)) == 0;
  }
  return false;
}

void cm_key_text(const HixlCacheAnyKey *k, char *out, size_t cap) {
  switch (k->kind) {
  case HIXL_CACHE_KEY_REQ:
    snprintf(out, cap,
             "CacheKey{cluster %" PRIu64 ", req %" PRIu64 ", model %" PRIu64 ", prefix %" PRIu64 "}",
             k->u.req.cluster_id, k->u.req.req_id, k->u.req.model_id, k->u.req.prefix_id);
    return;
  case HIXL_CACHE_KEY_ID:
    snprintf(out, cap, "CacheKeyByIdAndIndex{cluster %" PRIu64 ", cache %" PRIu64 ", batch %u}",
             k->u.id.cluster_id, k->u.id.cache_id, k->u.id.batch_index);
    return;
  case HIXL_CACHE_KEY_BLOCKS:
    snprintf(out, cap, "BlocksCacheKey{cluster %" PRIu64 ", model %" PRIu64 "}", k->u.blocks.cluster_id,
             k->u.blocks.model_id);
    return;
  }
  snprintf(out, cap, "key of unknown kind %d", (int)k->kind);
}

void cm_tag_of(char *tag, uint64_t nonce, uint64_t id) {
  snprintf(tag, CM_TAG_LEN, CM_TAG_PREFIX "%016" PRIx64 "/%" PRIu64, nonce, id);
}

HixlStatus cm_get_request(const uint8_t *req, size_t len, const char *peer, uint8_t *op, HixlCacheAnyKey *k,
                          char *why, size_t cap) {
  struct be_in in = be_in_of(req, len);
  uint8_t proto = be_in_u8(&in), o = be_in_u8(&in);
  if (in.bad || proto != CM_PROTO) {
    snprintf(why, cap, "cache service request of %zu bytes from %s, layout %u: this side speaks layout %u",
             len, peer, proto, CM_PROTO);
    return HIXL_UNSUPPORTED;
  }
  if (o == CM_OP_HELLO) {
    if (be_in_left(&in) != 0) {
      snprintf(why, cap, "malformed cache hello from %s: %zu bytes after the op", peer, be_in_left(&in));
      return HIXL_PARAM_INVALID;
    }
  } else if (o == CM_OP_LOOKUP) {
    if (!cm_get_key(&in, k) || be_in_left(&in) != 0) {
      snprintf(why, cap, "malformed cache lookup from %s (%zu bytes)", peer, len);
      return HIXL_PARAM_INVALID;
    }
  } else {
    snprintf(why, cap, "unknown cache service operation %u from %s", o, peer);
    return HIXL_UNSUPPORTED;
  }
  *op = o;
  return HIXL_SUCCESS;
}

void cm_put_view(struct be_out *o, const struct cm_cache *c, uint32_t batch) {
  be_out_u64(o, c->id);
  be_out_u8(o, c->blocks);
  be_out_u32(o, c->desc.num_tensors);
  be_out_u32(o, c->desc.elem_size);
  be_out_u32(o, batch);
  be_out_u64(o, c->desc.shape[0]);
  be_out_u64(o, c->tensor_bytes);
  for (uint32_t t = 0; t < c->desc.num_tensors; t++) be_out_u64(o, c->addrs[t]);
}

bool cm_get_view(const uint8_t *p, size_t n, struct cm_view *v) {
  struct be_in b = be_in_of(p, n);
  v->id = be_in_u64(&b);
  uint8_t blocks = be_in_u8(&b);
  v->blocks = blocks == 1;
  v->n = be_in_u32(&b);
  v->elem_size = be_in_u32(&b);
  v->batch_index = be_in_u32(&b);
  v->shape0 = be_in_u64(&b);
  v->tensor_bytes = be_in_u64(&b);
  if (b.bad || blocks > 1 || v->n == 0 || v->n > HIXL_CACHE_MAX_ADDRS || v->elem_size == 0 ||
      v->shape0 == 0 || v->tensor_bytes == 0 || v->tensor_bytes % v->shape0 != 0 ||
      v->tensor_bytes > (UINT64_C(1) << 48) || (!v->blocks && v->batch_index >= v->shape0) ||
      be_in_left(&b) != (size_t)v->n * 8)
    return false;
  v->item_bytes = v->tensor_bytes / v->shape0;
  if (!(v->addrs = malloc(v->n * sizeof(*v->addrs)))) return false;
  for (uint32_t t = 0; t < v->n; t++) {
    uint64_t a = be_in_u64(&b);
    if (a == 0 || a + v->tensor_bytes < a || a > UINTPTR_MAX) {
      free(v->addrs);
      v->addrs = NULL;
      return false;
    }
    v->addrs[t] = (uintptr_t)a;
  }
  return true;
}
