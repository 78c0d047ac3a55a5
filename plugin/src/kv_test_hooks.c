/* kv_test_hooks: allocation failures a white-box test injects (kv_int.h, KV_ALLOC),
 * and points it waits for or parks a thread at (KV_TEST_POINT). Compiled into
 * hixl_kv_test only, never into the shipped plugin. The pusher's thread and the
 * engine's progress thread allocate too: the counters are atomic. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

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

/* Points a test waits for or parks threads at (KV_TEST_POINT): a mutex and a condition
 * variable, never a sleep. */
static pthread_mutex_t point_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t point_cv = PTHREAD_COND_INITIALIZER;
static unsigned passes[KV_TEST_POINTS];
static bool armed[KV_TEST_POINTS];

void kv_test_point(enum kv_test_point p) {
  pthread_mutex_lock(&point_mu);
  passes[p]++;
  pthread_cond_broadcast(&point_cv);
  while (armed[p]) pthread_cond_wait(&point_cv, &point_mu);
  pthread_mutex_unlock(&point_mu);
}

void kv_test_park(enum kv_test_point p, bool on) {
  pthread_mutex_lock(&point_mu);
  armed[p] = on;
  pthread_cond_broadcast(&point_cv);
  pthread_mutex_unlock(&point_mu);
}

void kv_test_point_reset(enum kv_test_point p) {
  pthread_mutex_lock(&point_mu);
  passes[p] = 0;
  pthread_mutex_unlock(&point_mu);
}

bool kv_test_point_wait(enum kv_test_point p, unsigned n, int timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&point_mu);
  int rc = 0;
  while (passes[p] < n && rc == 0) rc = pthread_cond_timedwait(&point_cv, &point_mu, &ts);
  bool ok = passes[p] >= n;
  pthread_mutex_unlock(&point_mu);
  return ok;
}
