/* bench_util: small helpers shared by hixl-bench, hixl-tcp-ref and the other benches and
 * examples (clock, number and size parsing, latency statistics, data pattern, a key
 * file). Header-only, static inline. */
#ifndef HIXL_BENCH_UTIL_H
#define HIXL_BENCH_UTIL_H

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_LIST 64 /* entries in a --block-sizes / --batch list */

static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline bool bench_parse_u64(const char *s, uint64_t *out) {
  char *end = NULL;
  if (s == NULL || *s == '\0' || *s == '-') return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0') return false;
  *out = (uint64_t)v;
  return true;
}

/* "4096", "4K", "4KiB", "4M", "1G" (binary multiples); *end_out gets the stop point. */
static inline bool bench_parse_size_prefix(const char *s, size_t *out, const char **end_out) {
  char *end = NULL;
  if (s == NULL || *s < '0' || *s > '9') return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return false;
  static const char units[] = "kKmMgG";
  const char *u = *end ? strchr(units, *end) : NULL;
  unsigned shift = u ? 10 * (unsigned)((u - units) / 2 + 1) : 0;
  if (shift != 0) {
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
  }
  if (v > (SIZE_MAX >> shift)) return false;
  *out = (size_t)(v << shift);
  *end_out = end;
  return true;
}

static inline bool bench_parse_size(const char *s, size_t *out) {
  const char *end = NULL;
  size_t v = 0;
  if (!bench_parse_size_prefix(s, &v, &end) || *end != '\0') return false;
  *out = v;
  return true;
}

static inline int bench_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

/* The median of v[0..n) (sorted), and a distribution-free 95% confidence interval for
 * it from order statistics: [v(k), v(n+1-k)] (1-based) with the largest k such that a
 * Binomial(n, 1/2) draw falls below k with probability at most 2.5%. With fewer than 6
 * values no such k exists: the interval is then [min, max] and covers less. */
static inline double bench_median_ci(const double *v, size_t n, double *lo, double *hi) {
  if (n == 0) return *lo = *hi = 0;
  double pi = 1, below = 0; /* P(X = i), P(X < i + 1) for X ~ Binomial(n, 1/2) */
  for (size_t i = 0; i < n; i++) pi /= 2;
  size_t k = 0;
  for (size_t i = 0; i < n / 2; i++) {
    below += pi;
    if (below > 0.025) break;
    k = i + 1;
    pi = pi * (double)(n - i) / (double)(i + 1);
  }
  k = k ? k : 1;
  *lo = v[k - 1];
  *hi = v[n - k];
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define BENCH_PLACES_MAX 8

/* The median of v[0..n), which it sorts: the middle value, or the mean of the two middle
 * ones when n is even; 0 when n is 0. */
static inline double bench_median_sorting(double *v, size_t n) {
  if (n == 0) return 0;
  qsort(v, n, sizeof(*v), bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The same of integers (times in ns), the mean of the two middle ones rounded down. */
static inline uint64_t bench_median_u64(uint64_t *v, size_t n) {
  if (n == 0) return 0;
  qsort(v, n, sizeof(*v), bench_cmp_u64);
  return n % 2 ? v[n / 2] : v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2;
}

/* The median of v[0..n) (unsorted; not changed), which is at most 256 values. */
static inline double bench_median(const double *v, size_t n) {
  double w[256];
  if (n == 0 || n > 256) return 0;
  memcpy(w, v, n * sizeof(*w));
  return bench_median_sorting(w, n);
}

/* The geometric mean of the medians of `places` groups, v[i] in group i % places (the
 * place a run took in its round), and a 95% bootstrap interval for it (`resamples` draws,
 * each group resampled within itself, a fixed seed: the same data, the same interval).
 * Neutral where a plain median is not, when one place is slow (docs/performance-tp.md).
 * Groups with no value are left out (their median, into medians[p] when medians is not
 * NULL, is 0); n at most 256, places 1 to BENCH_PLACES_MAX. */
static inline double bench_places_median(const double *v, size_t n, unsigned places, unsigned resamples,
                                         double *lo, double *hi, double *medians) {
  double g[BENCH_PLACES_MAX][256], w[256], est[4096];
  size_t gn[BENCH_PLACES_MAX] = {0};
  *lo = *hi = 0;
  if (n == 0 || n > 256 || places == 0 || places > BENCH_PLACES_MAX) return 0;
  for (size_t i = 0; i < n; i++) g[i % places][gn[i % places]++] = v[i];
  if (resamples > 4096) resamples = 4096;
  uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64 */
  double point = 0;
  unsigned used = 0;
  for (unsigned p = 0; p < places; p++) {
    double m = gn[p] ? bench_median(g[p], gn[p]) : 0;
    if (medians) medians[p] = m;
    if (gn[p]) point += log(m), used++;
  }
  for (unsigned b = 0; b < resamples; b++) {
    double s = 0;
    for (unsigned p = 0; p < places; p++) {
      if (!gn[p]) continue;
      for (size_t i = 0; i < gn[p]; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = g[p][x % gn[p]];
      }
      s += log(bench_median(w, gn[p]));
    }
    est[b] = exp(s / used);
  }
  if (resamples) {
    qsort(est, resamples, sizeof(*est), bench_cmp_double);
    *lo = est[(size_t)(0.025 * resamples)];
    *hi = est[(size_t)(0.975 * resamples)]; /* < resamples, as 0.975 < 1 */
  }
  return exp(point / used);
}

struct bench_stats {
  double avg_us, p50_us, p99_us, min_us, max_us;
};

/* Sorts v in place; nearest-rank percentiles (the ceil(n p / 100)-th value). */
static inline struct bench_stats bench_stats_ns(uint64_t *v, size_t n) {
  long double sum = 0;
  if (n == 0) return (struct bench_stats){0, 0, 0, 0, 0};
  qsort(v, n, sizeof(*v), bench_cmp_u64);
  for (size_t i = 0; i < n; i++) sum += (long double)v[i];
  return (struct bench_stats){(double)(sum / (long double)n) / 1e3, (double)v[(n * 50 + 99) / 100 - 1] / 1e3,
                              (double)v[(n * 99 + 99) / 100 - 1] / 1e3, (double)v[0] / 1e3,
                              (double)v[n - 1] / 1e3};
}

/* Pattern word i depends only on (seed, i): any side regenerates or checks any range. */
static inline uint64_t bench_pattern_word(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Fill len bytes (len a multiple of 8 or not) with the pattern starting at word 0. */
static inline void bench_pattern_fill(uint8_t *buf, size_t len, uint64_t seed) {
  size_t words = len / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = bench_pattern_word(seed, i);
    memcpy(buf + i * 8, &w, 8);
  }
  if (len % 8 != 0) {
    uint64_t w = bench_pattern_word(seed, words);
    memcpy(buf + words * 8, &w, len % 8);
  }
}

/* True when a and b agree; otherwise *bad is the first differing offset. */
static inline bool bench_same(const uint8_t *a, const uint8_t *b, size_t len, size_t *bad) {
  size_t i = 0;
  if (memcmp(a, b, len) == 0) return true;
  while (a[i] == b[i]) i++;
  *bad = i;
  return false;
}

/* Pin the calling thread (and the threads it creates later) to one CPU. */
static inline bool bench_pin_cpu(int cpu) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) == 0) return true;
  fprintf(stderr, "cannot pin to CPU %d: %s\n", cpu, strerror(errno));
  return false;
}

/* One '\n'-terminated line from a pipe or socket within timeout_ms, NUL-terminated
 * without its '\n' (cap at least 1): 1 a line, 0 end of file, -1 timeout or error.
 * Byte by byte: control channels carry a few short lines. */
static inline int bench_read_line(int fd, char *line, size_t cap, int timeout_ms) {
  size_t n = 0;
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    uint64_t now = bench_now_ns();
    if (now >= deadline) return -1;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, (int)((deadline - now + 999999ull) / 1000000ull));
    if (r < 0 && errno != EINTR) return -1;
    if (r <= 0) continue;
    char c;
    ssize_t got = read(fd, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0 || c == '\n') { /* a last line may end at the end of file, with no '\n' */
      line[n] = '\0';
      return got == 0 && n == 0 ? 0 : 1;
    }
    if (n + 1 < cap) line[n++] = c;
  }
}

/* Read exactly len bytes from fd (EINTR retried); 0, or -1 on error or end of file. */
static inline int bench_read_full(int fd, void *buf, size_t len) {
  for (uint8_t *p = buf; len > 0;) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* A key file for AuthKeyFile that only this user reads (mkstemp in $TMPDIR or /tmp, mode
 * 0600): 32 random bytes as 64 hex digits and a newline; its path in path. 0, or -1
 * (said on stderr, prog first). The caller unlinks it. */
static inline int bench_key_file(char *path, size_t cap, const char *prog) {
  uint8_t key[32];
  char hex[2 * sizeof(key) + 1];
  const char *dir = getenv("TMPDIR");
  snprintf(path, cap, "%s/hixl-key-XXXXXX", dir && *dir ? dir : "/tmp");
  if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) {
    fprintf(stderr, "%s: getrandom for the key: %s\n", prog, strerror(errno));
    return -1;
  }
  for (size_t i = 0; i < sizeof(key); i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  hex[2 * sizeof(key)] = '\n';
  int fd = mkstemp(path); /* O_EXCL, mode 0600 (umask can only take bits away) */
  bool ok = fd >= 0 && write(fd, hex, sizeof(hex)) == (ssize_t)sizeof(hex);
  if (!ok)
    fprintf(stderr, "%s: %s %s: %s\n", prog, fd < 0 ? "mkstemp" : "writing the key file", path,
            strerror(errno));
  if (fd >= 0) close(fd);
  if (fd >= 0 && !ok) unlink(path);
  memset(key, 0, sizeof(key));
  memset(hex, 0, sizeof(hex));
  return ok ? 0 : -1;
}

#endif /* HIXL_BENCH_UTIL_H */
