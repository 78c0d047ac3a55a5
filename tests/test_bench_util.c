/* test_bench_util: the benchmarks' statistics (integration/bench/bench_util.h). The 95%
 * confidence interval of a median from order statistics, against published ranks and
 * against the binomial distribution summed here another way (lgamma); nearest-rank
 * percentiles of bench_stats_ns. */
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

int main(void) {
  CU_TestInfo tests[] = {{"median CI: published ranks", test_median_ci_published_ranks},
                         {"median CI: the binomial tail for every n to 300", test_median_ci_every_n},
                         {"median CI: under 6 values, min and max", test_median_ci_small},
                         {"stats: nearest-rank percentiles", test_stats_nearest_rank},
                         CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"bench_util", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_bench_util", suites);
}
