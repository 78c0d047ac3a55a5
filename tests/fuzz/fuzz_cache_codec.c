/* fuzz_cache_codec: the cache manager's CACHE service messages (core/src/cache/cache_codec.c)
 * against arbitrary bytes. Both ends come from a peer: a request (cm_get_request, the
 * service's parser, and cm_get_key under it) and a LOOKUP answer (cm_get_view, whose
 * layout and addresses the puller plans its transfers on). Whatever parses must re-encode
 * to the same bytes and hold the invariants the plan relies on; whatever does not must
 * say why and leave nothing allocated (LeakSanitizer under the libFuzzer build).
 * Invariants abort(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_cache_codec: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);         \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

static bool key_kind_ok(const HixlCacheAnyKey *k) {
  return k->kind == HIXL_CACHE_KEY_REQ || k->kind == HIXL_CACHE_KEY_ID || k->kind == HIXL_CACHE_KEY_BLOCKS;
}

/* A request, as the service parses it. */
static void fuzz_request(const uint8_t *p, size_t n) {
  char why[320];
  memset(why, 'x', sizeof(why));
  uint8_t op = 0xff;
  HixlCacheAnyKey k;
  HixlStatus st = cm_get_request(p, n, "127.0.0.1:1", &op, &k, why, sizeof(why));
  if (st != HIXL_SUCCESS) {
    CHECK(op == 0xff); /* written only on success */
    CHECK(memchr(why, '\0', sizeof(why)) != NULL && why[0] != '\0');
    return;
  }
  CHECK(n >= 2 && p[0] == CM_PROTO && p[1] == op);
  if (op == CM_OP_HELLO) {
    CHECK(n == 2);
    return;
  }
  CHECK(op == CM_OP_LOOKUP && key_kind_ok(&k));
  uint8_t out[64];
  struct be_out o = be_out_fixed(out, sizeof(out));
  be_out_u8(&o, CM_PROTO);
  be_out_u8(&o, op);
  cm_put_key(&o, &k);
  CHECK(!o.bad && o.len == n && memcmp(out, p, n) == 0);
  char text[160];
  cm_key_text(&k, text, sizeof(text));
  CHECK(cm_key_equal(&k, &k));
}

/* A key alone, at the head of the bytes. */
static void fuzz_key(const uint8_t *p, size_t n) {
  struct be_in in = be_in_of(p, n);
  HixlCacheAnyKey k;
  if (!cm_get_key(&in, &k)) return;
  CHECK(key_kind_ok(&k));
  uint8_t out[64];
  struct be_out o = be_out_fixed(out, sizeof(out));
  cm_put_key(&o, &k);
  CHECK(!o.bad && o.len == in.off && memcmp(out, p, o.len) == 0);
}

/* A LOOKUP answer, as the puller decodes it: every range it names must stay inside
 * 2^64 and inside its tensors, the batch item inside the batch. */
static void fuzz_view(const uint8_t *p, size_t n) {
  struct cm_view v;
  memset(&v, 0, sizeof(v));
  if (!cm_get_view(p, n, &v)) {
    CHECK(v.addrs == NULL);
    return;
  }
  CHECK(v.n >= 1 && v.n <= HIXL_CACHE_MAX_ADDRS && v.addrs != NULL);
  CHECK(v.elem_size > 0 && v.shape0 > 0 && v.tensor_bytes > 0 && v.item_bytes > 0);
  CHECK(v.item_bytes * v.shape0 == v.tensor_bytes && v.tensor_bytes <= (UINT64_C(1) << 48));
  CHECK(v.blocks || v.batch_index < v.shape0);
  for (uint32_t t = 0; t < v.n; t++) CHECK(v.addrs[t] != 0 && v.addrs[t] + v.tensor_bytes > v.addrs[t]);
  CHECK(n == 37 + (size_t)v.n * 8);
  struct cm_cache c;
  memset(&c, 0, sizeof(c));
  c.id = v.id;
  c.blocks = v.blocks;
  c.desc.num_tensors = v.n;
  c.desc.elem_size = v.elem_size;
  c.desc.shape[0] = v.shape0;
  c.tensor_bytes = v.tensor_bytes;
  c.addrs = v.addrs;
  struct be_out o = be_out_heap();
  cm_put_view(&o, &c, v.batch_index);
  CHECK(!o.bad && o.len == n && memcmp(o.p, p, n) == 0);
  free(o.p);
  free(v.addrs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1); /* exactly the bytes: the sanitizer sees over-reads */
  CHECK(copy != NULL);
  memcpy(copy, data, size);
  fuzz_request(copy, size);
  fuzz_key(copy, size);
  fuzz_view(copy, size);
  free(copy);
  return 0;
}
