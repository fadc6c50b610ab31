// The §1 proxy-map and §2 JSD rules of src/plan/proxy.h against direct computations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "plan/proxy.h"

namespace crisp {
namespace {

const auto kExp = [](float x) { return std::exp(x); };

TEST(ProxyRules, FirstDistanceBlockOfKeyBlockIsTheSmallestReached) {
  for (int32_t B : {64, 128})
    for (int64_t n : {int64_t{3} * B, int64_t{3} * B + 1, int64_t{5} * B - 7, int64_t{9} * B}) {
      const int64_t L = rules::proxy_rows(n, B);
      const int32_t N = rules::num_blocks(n, B);
      for (int64_t kb = 0; kb < N; ++kb) {
        int64_t smallest = -1;
        for (int64_t i = 0; i < L; ++i) {
          const int64_t p = rules::proxy_position(n, L, i);
          for (int64_t j = kb * B; j < std::min<int64_t>((kb + 1) * B, n); ++j) {
            if (!proxy::in_row(j, p)) continue;
            const int64_t c = proxy::distance_block(proxy::slash_distance(p, j), B);
            if (smallest < 0 || c < smallest) smallest = c;
          }
        }
        ASSERT_GE(smallest, 0);
        EXPECT_EQ(proxy::first_distance_block_of_key_block(n, L, B, kb), smallest) << "n=" << n << " B=" << B << " kb=" << kb;
        EXPECT_EQ(proxy::first_distance_block_of_key_block<int>(n, L, B, kb), static_cast<int>(smallest));
      }
    }
}

TEST(ProxyRules, OnlineStatisticsAndTheirMergeMatchTheDirectSoftmax) {
  const std::vector<float> scores = {0.5f, -2.f, 3.25f, 1.f, 3.f, -7.5f, 2.f, 0.f};
  const float max = *std::max_element(scores.begin(), scores.end());
  double sum = 0.0;
  for (float x : scores) sum += std::exp(x - max);

  float m_all = -INFINITY, l_all = 0.f, m_lo = -INFINITY, l_lo = 0.f, m_hi = -INFINITY, l_hi = 0.f;
  for (size_t k = 0; k < scores.size(); ++k) {
    proxy::online_add(m_all, l_all, scores[k], kExp);
    if (k < scores.size() / 2) proxy::online_add(m_lo, l_lo, scores[k], kExp);
    else proxy::online_add(m_hi, l_hi, scores[k], kExp);
  }
  EXPECT_EQ(m_all, max);
  EXPECT_NEAR(l_all, sum, 1e-5 * sum);
  proxy::merge_row_stats(m_lo, l_lo, m_hi, l_hi, kExp);
  EXPECT_EQ(m_lo, max);
  EXPECT_NEAR(l_lo, sum, 1e-5 * sum);
  // An empty partial (no key seen) changes nothing, on either side.
  float m = m_lo, l = l_lo;
  proxy::merge_row_stats(m, l, -INFINITY, 0.f, kExp);
  EXPECT_EQ(m, m_lo);
  EXPECT_EQ(l, l_lo);
  float m_empty = -INFINITY, l_empty = 0.f;
  proxy::merge_row_stats(m_empty, l_empty, m_lo, l_lo, kExp);
  EXPECT_EQ(m_empty, m_lo);
  EXPECT_EQ(l_empty, l_lo);
}

TEST(ProxyRules, MassKeptRelativeToARunningMaximumRescalesToTheSoftmaxShare) {
  // Two key blocks of one row: the first block's mass is kept relative to the running maximum
  // after it, then brought to the row's statistics by row_share.
  const std::vector<float> first = {1.f, 4.f, -1.f}, second = {6.f, 2.f};
  float run_max = -INFINITY, run_sum = 0.f;
  for (float x : first) proxy::online_add(run_max, run_sum, x, kExp);
  const float first_max = run_max, first_mass = run_sum;
  for (float x : second) proxy::online_add(run_max, run_sum, x, kExp);
  const double row_inv = 1.0 / run_sum;
  double expected = 0.0, den = 0.0;
  for (float x : first) expected += std::exp(static_cast<double>(x) - run_max);
  for (float x : second) den += std::exp(static_cast<double>(x) - run_max);
  den += expected;
  expected /= den;
  EXPECT_NEAR(first_mass * proxy::row_share<double>(first_max, run_max, row_inv, kExp), expected, 1e-6);
  EXPECT_EQ(proxy::rescaled(first_mass, -INFINITY, run_max, kExp), 0.f);
  EXPECT_EQ(proxy::rescale_factor(-INFINITY, run_max, kExp), 0.f);
  float raised = first_max;
  EXPECT_FLOAT_EQ(proxy::raise_max(raised, run_max, kExp), std::exp(first_max - run_max));
  EXPECT_EQ(raised, run_max);
}

TEST(ProxyRules, JsTermsGiveZeroForEqualAndLn2ForDisjointDistributions) {
  const std::vector<double> a = {0.5, 0.25, 0.25, 0.0}, b = {0.0, 0.0, 0.0, 1.0};
  double kl_a = 0.0, kl_b = 0.0;
  for (size_t c = 0; c < a.size(); ++c) proxy::add_js_terms(a[c], a[c], kl_a, kl_b);
  EXPECT_EQ(rules::js_distance(kl_a, kl_b), 0.0);
  kl_a = kl_b = 0.0;
  for (size_t c = 0; c < a.size(); ++c) proxy::add_js_terms(a[c], b[c], kl_a, kl_b);
  EXPECT_NEAR(rules::js_distance(kl_a, kl_b), std::sqrt(std::log(2.0)), 1e-12);
  // ā from exponentials and their sum.
  EXPECT_EQ(proxy::abar_share(2.f, 8.0), 0.25);
  EXPECT_EQ(proxy::mean_query_component<float>(6.0, 4), 1.5f);
}

}  // namespace
}  // namespace crisp
