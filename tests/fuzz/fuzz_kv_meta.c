/* fuzz_kv_meta: the plugin's metadata parser (kv_meta_parse) against arbitrary bytes.
 * The metadata comes from a host, which may hand over anything: whatever parses must
 * re-encode to the same bytes, and whatever does not must leave nothing allocated
 * (LeakSanitizer under the libFuzzer build). Invariants abort(). */
#include "kv_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_kv_meta: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);             \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1); /* exactly the bytes: the sanitizer sees over-reads */
  CHECK(copy != NULL);
  memcpy(copy, data, size);
  struct kv_meta_entry *v = NULL;
  size_t n = 0;
  uint8_t key[KV_CAP_KEY_LEN];
  if (kv_meta_parse(copy, size, key, &v, &n)) {
    struct kv_out o = {0};
    kv_meta_begin(&o, key, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
      const struct kv_meta_entry *e = &v[i];
      CHECK(e->req[0] != '\0' && strlen(e->req) <= KV_MAX_ID);
      CHECK(e->type >= KV_META_LOAD && e->type <= KV_META_EXPECT);
      if (e->type == KV_META_LOAD) CHECK(e->nblocks == e->nrblocks && e->nblocks > 0);
      if (e->type == KV_META_PUSH) CHECK(e->nblocks > 0 && e->nrblocks > 0);
      CHECK(e->nblocks <= KV_MAX_BLOCKS && e->nrblocks <= KV_MAX_BLOCKS);
      CHECK(e->rcap.len == 0 || e->rcap.len == KV_CAP_LEN);
      kv_meta_put(&o, e);
    }
    CHECK(!o.bad && o.len == size && memcmp(o.p, copy, size) == 0);
    free(o.p);
    kv_meta_free(v, n);
  }
  free(copy);
  return 0;
}
