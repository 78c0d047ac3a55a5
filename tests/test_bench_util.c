/* test_bench_util: the benchmarks' statistics (integration/bench/bench_util.h). The 95%
 * confidence interval of a median from order statistics, against published ranks and
 * against the binomial distribution summed here another way (lgamma); the ratio of runs
 * rotated through the places of a round (bench_places_median); nearest-rank percentiles
 * of bench_stats_ns; the medians, even counts included; bench_read_line's lines. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>

#include "bench_util.h"
#include "test_util.h"

static double v[300];

static void fill_ranks(size_t n) {
  for (size_t i = 0; i < n; i++) v[i] = (double)(i + 1); /* v[i] is its own 1-based rank */
}

/* Published distribution-free 95% intervals for the median (ranks k and n + 1 - k). */
static void test_median_ci_published_ranks(void) {
  static const struct { size_t n, k; } t[] = {{6, 1}, {9, 2}, {10, 2}, {20, 6}, {25, 8}, {41, 14}, {100, 40}};
  for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
    double lo, hi;
    fill_ranks(t[i].n);
    double m = bench_median_ci(v, t[i].n, &lo, &hi);
    CU_ASSERT_DOUBLE_EQUAL(lo, (double)t[i].k, 0);
    CU_ASSERT_DOUBLE_EQUAL(hi, (double)(t[i].n + 1 - t[i].k), 0);
    CU_ASSERT_DOUBLE_EQUAL(m, (double)(t[i].n + 1) / 2, 0);
  }
}

/* The medians: the middle value, or the mean of the two middle ones (not the upper one,
 * which the bench harness returned for an even count until it used these). */
static void test_medians_even_and_odd(void) {
  double d[] = {5, 1, 4, 2}, odd[] = {3, 9, 1};
  uint64_t u[] = {40, 10, 30, 20}, uo[] = {7, 3, 5}, big[] = {UINT64_MAX - 1, UINT64_MAX};
  double c[300];
  for (size_t i = 0; i < 300; i++) c[i] = (double)(300 - i);
  CU_ASSERT_DOUBLE_EQUAL(bench_median_sorting(d, 4), 3.0, 0);
  CU_ASSERT_DOUBLE_EQUAL(d[0], 1.0, 0); /* sorted in place */
  CU_ASSERT_DOUBLE_EQUAL(bench_median_sorting(odd, 3), 3.0, 0);
  CU_ASSERT_DOUBLE_EQUAL(bench_median_sorting(d, 0), 0.0, 0);
  CU_ASSERT_EQUAL(bench_median_u64(u, 4), 25);
  CU_ASSERT_EQUAL(bench_median_u64(uo, 3), 5);
  CU_ASSERT_EQUAL(bench_median_u64(big, 2), UINT64_MAX - 1); /* no overflow in the mean */
  CU_ASSERT_EQUAL(bench_median_u64(u, 0), 0);
  CU_ASSERT_DOUBLE_EQUAL(bench_median(c, 4), 298.5, 0); /* a copy: c is not sorted */
  CU_ASSERT_DOUBLE_EQUAL(c[0], 300.0, 0);
  CU_ASSERT_DOUBLE_EQUAL(bench_median_sorting(c, 300), 150.5, 0); /* more than bench_median's 256 */
}

/* P(X <= j) for X ~ Binomial(n, 1/2), term by term from lgamma. */
static double binom_cdf(size_t n, size_t j) {
  double s = 0;
  for (size_t i = 0; i <= j; i++)
    s +=
        exp(lgamma((double)n + 1) - lgamma((double)i + 1) - lgamma((double)(n - i) + 1) - (double)n * log(2));
  return s;
}

/* For every n from 6 to 300: k is the largest rank whose tail P(X <= k - 1) is 2.5% or
 * less, so the interval covers at least 95% and one rank narrower would not. */
static void test_median_ci_every_n(void) {
  for (size_t n = 6; n <= 300; n++) {
    double lo, hi;
    fill_ranks(n);
    bench_median_ci(v, n, &lo, &hi);
    size_t k = (size_t)lo;
    CU_ASSERT_DOUBLE_EQUAL(hi, (double)(n + 1 - k), 0);
    CU_ASSERT_TRUE(k >= 1 && binom_cdf(n, k - 1) <= 0.025 + 1e-12);
    CU_ASSERT_TRUE(binom_cdf(n, k) > 0.025);
  }
}

/* Fewer than 6 values have no 95% interval: [min, max]; none, zeros. */
static void test_median_ci_small(void) {
  double lo = -1, hi = -1;
  CU_ASSERT_DOUBLE_EQUAL(bench_median_ci(v, 0, &lo, &hi), 0, 0);
  CU_ASSERT_DOUBLE_EQUAL(lo, 0, 0);
  CU_ASSERT_DOUBLE_EQUAL(hi, 0, 0);
  for (size_t n = 1; n < 6; n++) {
    fill_ranks(n);
    double m = bench_median_ci(v, n, &lo, &hi);
    CU_ASSERT_DOUBLE_EQUAL(lo, 1, 0);
    CU_ASSERT_DOUBLE_EQUAL(hi, (double)n, 0);
    CU_ASSERT_DOUBLE_EQUAL(m, (double)(n + 1) / 2, 0);
  }
}

/* Three places, the third 0.7 of the others: the estimate is the geometric mean of the
 * places (1 * 1 * 0.7)^(1/3), where a plain median would say 1; noise-free, the
 * bootstrap interval is that one value. */
static void test_places_slow_place_counts_once(void) {
  double r[45], lo, hi;
  for (size_t i = 0; i < 45; i++) r[i] = i % 3 == 2 ? 0.7 : 1.0;
  double m = bench_places_median(r, 45, 3, 2000, &lo, &hi, NULL);
  CU_ASSERT_DOUBLE_EQUAL(m, cbrt(0.7), 1e-12);
  CU_ASSERT_DOUBLE_EQUAL(lo, m, 1e-12);
  CU_ASSERT_DOUBLE_EQUAL(hi, m, 1e-12);
  qsort(r, 45, sizeof(*r), bench_cmp_double);
  CU_ASSERT_DOUBLE_EQUAL(r[22], 1.0, 0); /* the plain median */
}

/* Each place's median, not its mean: one wild round in a place moves nothing; the
 * interval holds the estimate, lies inside the data and is the same on every call
 * (a fixed seed). A place with no rounds (n < places) is left out. */
static void test_places_median_and_interval(void) {
  double r[30], lo, hi, lo2, hi2;
  for (size_t i = 0; i < 30; i++)
    r[i] = 0.9 + 0.01 * (double)(i % 7) + (i % 3 == 1 ? 0.1 : 0); /* places differ */
  double m = bench_places_median(r, 30, 3, 2000, &lo, &hi, NULL);
  r[4] = 50; /* a wild round in place 1 */
  double m2 = bench_places_median(r, 30, 3, 2000, &lo2, &hi2, NULL);
  double g[3];
  for (size_t p = 0; p < 3; p++) {
    double w[10];
    for (size_t i = 0; i < 10; i++) w[i] = r[p + 3 * i];
    g[p] = bench_median(w, 10);
  }
  CU_ASSERT_DOUBLE_EQUAL(m2, cbrt(g[0] * g[1] * g[2]), 1e-12);
  CU_ASSERT_DOUBLE_EQUAL(m, m2, 0.006);
  CU_ASSERT_TRUE(lo <= m && m <= hi && lo >= 0.9 && hi <= 1.06);
  bench_places_median(r, 30, 3, 2000, &lo, &hi, NULL);
  CU_ASSERT_DOUBLE_EQUAL(lo, lo2, 0);
  CU_ASSERT_DOUBLE_EQUAL(hi, hi2, 0);
  double two[2] = {0.8, 1.25};
  CU_ASSERT_DOUBLE_EQUAL(bench_places_median(two, 2, 3, 100, &lo, &hi, NULL), 1.0,
                         1e-12); /* sqrt(0.8 * 1.25) */
  CU_ASSERT_DOUBLE_EQUAL(bench_places_median(two, 0, 3, 100, &lo, &hi, NULL), 0, 0);
}

static void test_stats_nearest_rank(void) {
  uint64_t ns[100];
  for (size_t i = 0; i < 100; i++) ns[i] = (uint64_t)(100 - i) * 1000; /* 100..1 us, reversed */
  struct bench_stats s = bench_stats_ns(ns, 100);
  CU_ASSERT_DOUBLE_EQUAL(s.min_us, 1, 1e-9);
  CU_ASSERT_DOUBLE_EQUAL(s.max_us, 100, 1e-9);
  CU_ASSERT_DOUBLE_EQUAL(s.p50_us, 50, 1e-9);
  CU_ASSERT_DOUBLE_EQUAL(s.p99_us, 99, 1e-9);
  CU_ASSERT_DOUBLE_EQUAL(s.avg_us, 50.5, 1e-9);
}

/* A line is NUL-terminated whether it ended with '\n' or at the end of file (a peer
 * that wrote its last line without one); too long a line is cut at cap - 1 bytes. */
static void test_read_line(void) {
  int fds[2];
  char line[8];
  CU_ASSERT_FATAL(pipe(fds) == 0);
  CU_ASSERT_FATAL(write(fds[1], "ab\ncdefghijk\nxyz", 16) == 16); /* no NUL */
  close(fds[1]);
  memset(line, 'Q', sizeof(line));
  CU_ASSERT_EQUAL(bench_read_line(fds[0], line, sizeof(line), 1000), 1);
  CU_ASSERT_STRING_EQUAL(line, "ab");
  CU_ASSERT_EQUAL(bench_read_line(fds[0], line, sizeof(line), 1000), 1);
  CU_ASSERT_STRING_EQUAL(line, "cdefghi");
  memset(line, 'Q', sizeof(line));
  CU_ASSERT_EQUAL(bench_read_line(fds[0], line, sizeof(line), 1000), 1);
  CU_ASSERT_STRING_EQUAL(line, "xyz");
  CU_ASSERT_EQUAL(bench_read_line(fds[0], line, sizeof(line), 1000), 0);
  close(fds[0]);
}

int main(void) {
  CU_TestInfo tests[] = {{"median CI: published ranks", test_median_ci_published_ranks},
                         {"median CI: the binomial tail for every n to 300", test_median_ci_every_n},
                         {"median CI: under 6 values, min and max", test_median_ci_small},
                         {"places: a slow place counts once", test_places_slow_place_counts_once},
                         {"places: medians, a fixed interval, empty places", test_places_median_and_interval},
                         {"stats: nearest-rank percentiles", test_stats_nearest_rank},
                         {"medians: even and odd counts, in place or a copy", test_medians_even_and_odd},
                         {"read_line: lines with and without a last newline", test_read_line},
                         CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"bench_util", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_bench_util", suites);
}
