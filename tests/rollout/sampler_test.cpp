// Sampler: greedy, filters, empirical frequencies against the filtered
// distribution, and that a draw depends only on (seed, sample, position).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "rollout/sampler.h"

using namespace kestrel::rollout;

namespace {

// Logits of p = {0.5, 0.25, 0.15, 0.1} (+ a -inf token that must never be drawn).
const std::vector<float> kLogits = {std::log(0.5f), std::log(0.25f), std::log(0.15f), std::log(0.1f),
                                    -std::numeric_limits<float>::infinity()};

std::vector<double> frequencies(const SamplingParams& p, int n = 20000) {
  SamplerScratch sc;
  std::vector<double> f(kLogits.size(), 0.0);
  for (int i = 0; i < n; ++i) f[size_t(sample_token(kLogits.data(), int64_t(kLogits.size()), p, 0, i, sc))] += 1.0 / n;
  return f;
}

void expect_freq(const std::vector<double>& f, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f[i], want[i], 0.015) << "token " << i;
}

}  // namespace

TEST(Sampler, GreedyAndDegenerateFilters) {
  SamplerScratch sc;
  const std::vector<float> z = {0.1f, 2.0f, -1.f, 2.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sample_token(z.data(), 5, p, 0, 0, sc), 1);  // first maximum on ties
  p.temperature = 1;
  p.top_k = 1;
  for (int i = 0; i < 50; ++i) {
    const int32_t t = sample_token(z.data(), 5, p, 0, i, sc);
    EXPECT_TRUE(t == 1 || t == 3);  // ties with the k-th value survive
  }
  p.top_k = -1;
  p.min_p = 1.0;
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(sample_token(z.data(), 5, p, 0, i, sc) % 2 == 1);
}

TEST(Sampler, FrequenciesFollowTheFilteredDistribution) {
  SamplingParams p;
  p.temperature = 1.0;
  expect_freq(frequencies(p), {0.5, 0.25, 0.15, 0.1, 0});
  p.top_k = 2;  // renormalised over {0.5, 0.25}
  expect_freq(frequencies(p), {2.0 / 3, 1.0 / 3, 0, 0, 0});
  p.top_k = -1;
  p.top_p = 0.7;  // 0.5 < 0.7, 0.75 >= 0.7: the crossing token is kept
  expect_freq(frequencies(p), {2.0 / 3, 1.0 / 3, 0, 0, 0});
  p.top_p = 1.0;
  p.min_p = 0.25;  // keep p >= 0.125
  expect_freq(frequencies(p), {0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0});
  p.min_p = 0;
  p.temperature = 0.5;  // p^2 renormalised
  const double s = 0.25 + 0.0625 + 0.0225 + 0.01;
  expect_freq(frequencies(p), {0.25 / s, 0.0625 / s, 0.0225 / s, 0.01 / s, 0});
  // min-p, then top-k, then top-p on the renormalised survivors: min_p 0.25
  // leaves {.5,.25,.15}; top_k 2 leaves {2/3, 1/3}; top_p 0.7 keeps both
  // (2/3 < 0.7), top_p 0.6 only the first (2/3 >= 0.6).
  p.temperature = 1.0;
  p.min_p = 0.25;
  p.top_k = 2;
  p.top_p = 0.7;
  expect_freq(frequencies(p), {2.0 / 3, 1.0 / 3, 0, 0, 0});
  p.top_p = 0.6;
  expect_freq(frequencies(p), {1, 0, 0, 0, 0});
}

TEST(Sampler, DrawDependsOnlyOnSeedSampleAndPosition) {
  SamplerScratch sc;
  SamplingParams p;
  p.seed = 1234;
  std::vector<float> z(64);
  for (size_t i = 0; i < z.size(); ++i) z[i] = float(std::sin(double(i)));
  std::map<int32_t, int> seen;
  for (int pos = 0; pos < 200; ++pos) {
    const int32_t a = sample_token(z.data(), 64, p, 3, pos, sc);
    EXPECT_EQ(a, sample_token(z.data(), 64, p, 3, pos, sc));
    ++seen[a];
  }
  EXPECT_GT(seen.size(), 10u);  // not stuck on one token
  EXPECT_EQ(sampling_uniform(1, 2, 3), sampling_uniform(1, 2, 3));
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(1, 3, 3));
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(2, 2, 3));
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(1, 2, 4));
}

TEST(Sampler, TopLogprobs) {
  const std::vector<float> z = {1.f, 3.f, 2.f, 3.f};
  const auto top = top_logprobs(z.data(), 4, 0.5f, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 2);
  EXPECT_FLOAT_EQ(top[0].second, 2.5f);
  EXPECT_FLOAT_EQ(top[2].second, 1.5f);
}
