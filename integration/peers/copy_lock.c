/* copy_lock: what a mutex around a memcpy costs, the same-host sync path's shape (issue
 * 46). A hixl same-host op is a memcpy inside the engine's lock; UCX's single-threaded
 * worker takes none. On x86 the lock's atomic (and the unlock's) waits until the copy's
 * stores have drained, so the lock costs more next to a copy than alone. Rounds of
 * `iters` copies of `size` bytes, one buffer each side (they stay in the cache, as
 * ucx_perftest's), alternating no lock and a lock/unlock pair around each copy:
 *
 *   copy_lock SIZE ITERS ROUNDS     one line per round and mode: ns an op, GB/s
 *
 * Built and run by profile_peers.sh. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t size = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096;
  long iters = argc > 2 ? atol(argv[2]) : 1000000;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  uint8_t *src = aligned_alloc(4096, size), *dst = aligned_alloc(4096, size);
  if (size == 0 || iters <= 0 || rounds <= 0 || !src || !dst) {
    fprintf(stderr, "usage: copy_lock SIZE ITERS ROUNDS (each above 0)\n");
    return 2;
  }
  memset(src, 1, size);
  memset(dst, 2, size);
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  for (int r = 0; r < rounds; r++) {
    for (int locked = 0; locked < 2; locked++) {
      double t0 = now_s();
      for (long i = 0; i < iters; i++) {
        if (locked) pthread_mutex_lock(&m);
        memcpy(dst, src, size);
        if (locked) pthread_mutex_unlock(&m);
        __asm__ volatile("" ::: "memory"); /* each copy happens */
      }
      double t = now_s() - t0;
      printf("COPY size=%zu mode=%s ns_per_op=%.2f gbps=%.2f\n", size, locked ? "lock" : "none",
             t / (double)iters * 1e9, (double)size * (double)iters / t / 1e9);
    }
  }
  if (dst[0] != 1) return 1;
  free(src);
  free(dst);
  return 0;
}
