/* kv_test_hooks: allocation failures a white-box test injects (kv_int.h, KV_ALLOC).
 * Compiled into hixl_kv_test only, never into the shipped plugin. The pusher's thread
 * and the engine's progress thread allocate too: the counters are atomic. */
#include <stdatomic.h>

#include "kv_int.h"

static _Atomic unsigned fail_nth[KV_TEST_SITES]; /* the nth allocation from now fails; 0: none */
static _Atomic unsigned failed[KV_TEST_SITES];

void kv_test_fail_nth(enum kv_test_site site, unsigned nth) { atomic_store(&fail_nth[site], nth); }

unsigned kv_test_failed(enum kv_test_site site) { return atomic_load(&failed[site]); }

bool kv_test_alloc_fails(enum kv_test_site site) {
  unsigned n = atomic_load(&fail_nth[site]);
  while (n > 0 && !atomic_compare_exchange_weak(&fail_nth[site], &n, n - 1)) {
  }
  if (n != 1) return false;
  atomic_fetch_add(&failed[site], 1);
  return true;
}
