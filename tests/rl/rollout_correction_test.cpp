// verl's rollout correction (rollout_corr_helper.py) against hand-computed
// values. One fixture: two responses of 2 tokens, the second's last token
// padding (mask 0); per-token ratios r = pi_old / pi_rollout = {2, 2 | 0.5, pad}.
#include <gtest/gtest.h>

#include <cmath>

#include "rl/policy_loss.h"
#include "rl/rollout_correction.h"

using namespace kestrel::rl;

namespace {

constexpr double kTol = 1e-6;  // verl's masked means divide by count + 1e-8

struct Fixture {
  Ragged L = Ragged::from_lengths({2, 2});
  std::vector<double> mask{1, 1, 1, 0};
  std::vector<double> old{std::log(0.5), std::log(0.4), std::log(0.2), std::log(0.9)};
  std::vector<double> rollout{std::log(0.25), std::log(0.2), std::log(0.4), std::log(0.1)};
  RolloutCorrectionResult run(const RolloutCorrectionConfig& c) const {
    return compute_rollout_correction(c, L, old, rollout, &mask);
  }
};

RolloutCorrectionConfig with_is(IsLevel lvl, double threshold, bool normalize = false) {
  RolloutCorrectionConfig c;
  c.active = true;
  c.rollout_is = lvl;
  c.rollout_is_threshold = threshold;
  c.rollout_is_batch_normalize = normalize;
  return c;
}

RolloutCorrectionConfig with_rs(const std::string& opts, const std::string& thresholds) {
  RolloutCorrectionConfig c;
  c.active = true;
  c.rollout_rs = parse_rollout_rs(opts, thresholds).value();
  return c;
}

double at(const RolloutCorrectionResult& r, const std::string& k) {
  auto it = r.metrics.find("rollout_corr/" + k);
  EXPECT_NE(it, r.metrics.end()) << k;
  return it == r.metrics.end() ? NAN : it->second;
}

void expect_vec(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) EXPECT_NEAR(got[t], want[t], kTol) << t;
}

}  // namespace

TEST(RolloutCorrection, TokenTisWeightsAndMetrics) {
  Fixture f;
  auto r = f.run(with_is(IsLevel::Token, 1.5));
  expect_vec(r.is_weights, {1.5, 1.5, 0.5, 0});  // min(r, 1.5), 0 on padding
  expect_vec(r.mask, f.mask);                      // no rejection
  EXPECT_NEAR(at(r, "rollout_is_mean"), 1.5, kTol);  // (2 + 2 + 0.5) / 3, before truncation
  EXPECT_NEAR(at(r, "rollout_is_max"), 2.0, kTol);
  EXPECT_NEAR(at(r, "rollout_is_min"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_is_ratio_fraction_high"), 2.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_is_ratio_fraction_low"), 1.0 / 3, kTol);  // 0.5 < 1/1.5
  // Clamped to [2/3, 3/2]: {3/2, 3/2, 2/3}; mean 11/9, E[c^2] 89/54.
  EXPECT_NEAR(at(r, "rollout_is_std"), std::sqrt(25.0 / 162), kTol);
  EXPECT_NEAR(at(r, "rollout_is_eff_sample_size"), (121.0 / 81) / (89.0 / 54), kTol);
  // Per-sequence mean weights {2, 0.5}.
  EXPECT_NEAR(at(r, "rollout_is_seq_mean"), 1.25, kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_std"), 1.5 / std::sqrt(2.0), kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_max"), 2.0, kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_min"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_max_deviation"), 1.0, kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_fraction_high"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_is_seq_fraction_low"), 0.5, kTol);
  EXPECT_EQ(r.metrics.count("rollout_corr/rollout_is_batch_norm_factor"), 0u);
}

TEST(RolloutCorrection, SequenceTisUsesTheProductOfRatios) {
  Fixture f;
  auto r = f.run(with_is(IsLevel::Sequence, 3.0));
  // Sequence ratios 2 * 2 = 4 (capped at 3) and 0.5.
  expect_vec(r.is_weights, {3, 3, 0.5, 0});
  EXPECT_NEAR(at(r, "rollout_is_max"), 4.0, kTol);
  EXPECT_NEAR(at(r, "rollout_is_min"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_is_mean"), 8.5 / 3, kTol);  // token-weighted, untruncated
  EXPECT_NEAR(at(r, "rollout_is_ratio_fraction_high"), 0.5, kTol);  // log 4 > log 3
  EXPECT_NEAR(at(r, "rollout_is_ratio_fraction_low"), 0.0, kTol);   // log 0.5 > log(1/3)
}

TEST(RolloutCorrection, BatchNormalizeToMeanOne) {
  Fixture f;
  // Token level: truncated {1.8, 1.8, 0.5}, mean 4.1 / 3.
  auto t = f.run(with_is(IsLevel::Token, 1.8, true));
  const double mt = 4.1 / 3;
  expect_vec(t.is_weights, {1.8 / mt, 1.8 / mt, 0.5 / mt, 0});
  EXPECT_NEAR(at(t, "rollout_is_batch_norm_factor"), mt, kTol);
  EXPECT_NEAR(at(t, "rollout_is_mean"), 1.5, kTol);  // metrics are of the weights before normalisation
  // Sequence level: one weight per sequence, {3, 0.5}, mean 1.75.
  auto s = f.run(with_is(IsLevel::Sequence, 3.0, true));
  expect_vec(s.is_weights, {3 / 1.75, 3 / 1.75, 0.5 / 1.75, 0});
  EXPECT_NEAR(at(s, "rollout_is_batch_norm_factor"), 1.75, kTol);
}

TEST(RolloutCorrection, TokenK1RejectsOutsideRatioBounds) {
  Fixture f;
  // k1 = -log r = {-ln2, -ln2, ln2}; kept in [ln 0.4, ln 1.5] = [-0.916, 0.405].
  auto r = f.run(with_rs("token_k1", "0.4_1.5"));
  expect_vec(r.mask, {1, 1, 0, 0});
  EXPECT_TRUE(r.is_weights.empty());
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_mean"), -std::log(2.0) / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_max"), std::log(2.0), kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_min"), -std::log(2.0), kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_fraction_high"), 1.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_fraction_low"), 0.0, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_masked_fraction"), 1.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_seq_masked_fraction"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_masked_fraction"), 1.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_seq_masked_fraction"), 0.5, kTol);
  // Sequence means of k1: {-ln2, ln2}.
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_seq_mean"), 0.0, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_seq_fraction_low"), 0.0, kTol);
}

TEST(RolloutCorrection, K1UpperAloneMeansLowerIsItsReciprocal) {
  auto o = parse_rollout_rs("seq_mean_k1", "1.5").value();
  ASSERT_EQ(o.size(), 1u);
  EXPECT_NEAR(o[0].lower, 1 / 1.5, 1e-15);
  EXPECT_NEAR(o[0].upper, 1.5, 1e-15);
  Fixture f;
  // Geometric-mean rejection: sequence means of k1 {-ln2, ln2} both outside [-ln1.5, ln1.5].
  auto r = f.run(with_rs("seq_mean_k1", "1.5"));
  expect_vec(r.mask, {0, 0, 0, 0});
  EXPECT_NEAR(at(r, "rollout_rs_seq_mean_k1_fraction_high"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_seq_mean_k1_fraction_low"), 0.5, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_masked_fraction"), 1.0, kTol);
}

TEST(RolloutCorrection, SequenceSumK2AndMeanK3AndMaxK3) {
  Fixture f;
  const double k2 = 0.5 * std::log(2.0) * std::log(2.0);  // per token for r = 2 and r = 0.5
  // seq_sum_k2: {2 k2 = 0.480, k2 = 0.240}; upper 0.3 rejects the first response.
  auto s = f.run(with_rs("seq_sum_k2", "0.3"));
  expect_vec(s.mask, {0, 0, 1, 0});
  EXPECT_NEAR(at(s, "rollout_rs_seq_sum_k2_mean"), (2 * k2 * 2 + k2) / 3, kTol);  // token-weighted
  EXPECT_NEAR(at(s, "rollout_rs_seq_sum_k2_max"), 2 * k2, kTol);
  EXPECT_NEAR(at(s, "rollout_rs_seq_sum_k2_min"), k2, kTol);
  EXPECT_NEAR(at(s, "rollout_rs_seq_sum_k2_fraction_high"), 0.5, kTol);
  EXPECT_NEAR(at(s, "rollout_rs_seq_sum_k2_seq_mean"), 1.5 * k2, kTol);
  EXPECT_NEAR(at(s, "rollout_rs_masked_fraction"), 2.0 / 3, kTol);
  EXPECT_EQ(s.metrics.count("rollout_corr/rollout_rs_seq_sum_k2_seq_fraction_low"), 0u);  // k1 options only
  // k3 = r - 1 - log r: 0.3069 for r = 2, 0.1931 for r = 0.5.
  const double k3a = 1 - std::log(2.0), k3b = -0.5 + std::log(2.0);
  auto m = f.run(with_rs("seq_mean_k3", "0.2"));
  expect_vec(m.mask, {0, 0, 1, 0});
  EXPECT_NEAR(at(m, "rollout_rs_seq_mean_k3_seq_max"), k3a, kTol);
  EXPECT_NEAR(at(m, "rollout_rs_seq_mean_k3_seq_min"), k3b, kTol);
  // seq_max_k3 (a response rejected for its worst token): same split at 0.25.
  auto x = f.run(with_rs("seq_max_k3", "0.25"));
  expect_vec(x.mask, {0, 0, 1, 0});
  EXPECT_NEAR(at(x, "rollout_rs_seq_max_k3_max"), k3a, kTol);
  EXPECT_NEAR(at(x, "rollout_rs_seq_max_k3_seq_masked_fraction"), 0.5, kTol);
}

TEST(RolloutCorrection, SeveralOptionsMustAllPass) {
  Fixture f;
  // token_k1 rejects the 0.5 token, seq_max_k3 the first response: nothing is left.
  auto r = f.run(with_rs("token_k1, seq_max_k3,token_k1", "0.4_1.5,0.25"));
  expect_vec(r.mask, {0, 0, 0, 0});
  EXPECT_NEAR(at(r, "rollout_rs_token_k1_masked_fraction"), 1.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_seq_max_k3_masked_fraction"), 2.0 / 3, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_masked_fraction"), 1.0, kTol);
  EXPECT_NEAR(at(r, "rollout_rs_seq_masked_fraction"), 1.0, kTol);
}

TEST(RolloutCorrection, ThresholdParsingErrorsNameTheKeys) {
  auto msg = [](const std::string& o, const std::string& t) { return parse_rollout_rs(o, t).status().message(); };
  EXPECT_NE(msg("geometric", "1.01").find("seq_mean_k1"), std::string::npos);
  EXPECT_NE(msg("seq_max_k1", "2").find("rollout_rs"), std::string::npos);
  EXPECT_NE(msg("token_k2", "0.1_0.2").find("single upper bound"), std::string::npos);
  EXPECT_NE(msg("token_k1,token_k2", "1,2,3").find("rollout_rs_threshold"), std::string::npos);
  EXPECT_NE(msg("token_k3", "").find("rollout_rs_threshold must be set"), std::string::npos);
  EXPECT_NE(msg("token_k3", "-1").find("positive"), std::string::npos);
  EXPECT_TRUE(parse_rollout_rs("null", "").value().empty());
  EXPECT_FALSE(parse_rollout_is("geometric").is_ok());
  EXPECT_FALSE(parse_bypass_loss("vanilla").is_ok());
}

TEST(RolloutCorrection, OffPolicyMetrics) {
  Fixture f;
  auto r = f.run(with_is(IsLevel::None, 2.0));
  const double ln2 = std::log(2.0);
  // Per-sequence mean log-probs: old {log(0.2)/2, log 0.2}, rollout {log(0.05)/2, log 0.4}.
  EXPECT_NEAR(at(r, "training_ppl"), (1 / std::sqrt(0.2) + 5) / 2, kTol);
  EXPECT_NEAR(at(r, "training_log_ppl"), (-std::log(0.2) / 2 - std::log(0.2)) / 2, kTol);
  EXPECT_NEAR(at(r, "rollout_ppl"), (1 / std::sqrt(0.05) + 2.5) / 2, kTol);
  EXPECT_NEAR(at(r, "rollout_log_ppl"), (-std::log(0.05) / 2 - std::log(0.4)) / 2, kTol);
  EXPECT_NEAR(at(r, "kl"), -ln2 / 3, kTol);
  EXPECT_NEAR(at(r, "k3_kl"), (2 * (1 - ln2) + (ln2 - 0.5)) / 3, kTol);
  EXPECT_NEAR(at(r, "log_ppl_diff"), 0.0, kTol);  // {-ln2, ln2}
  EXPECT_NEAR(at(r, "log_ppl_abs_diff"), ln2, kTol);
  EXPECT_NEAR(at(r, "log_ppl_diff_max"), ln2, kTol);
  EXPECT_NEAR(at(r, "log_ppl_diff_min"), -ln2, kTol);
  EXPECT_NEAR(at(r, "ppl_ratio"), 1.25, kTol);    // (0.5 + 2) / 2
  EXPECT_NEAR(at(r, "chi2_token"), 1.75, kTol);   // (4 + 4 + 0.25) / 3 - 1
  EXPECT_NEAR(at(r, "chi2_seq"), 7.125, kTol);    // (16 + 0.25) / 2 - 1
  EXPECT_TRUE(r.is_weights.empty());
  EXPECT_EQ(r.metrics.count("rollout_corr/rollout_is_mean"), 0u);
  // The key list the actor presets covers exactly what a batch reports.
  auto full = with_is(IsLevel::Token, 2.0);
  full.rollout_rs = parse_rollout_rs("token_k1,seq_max_k2", "1.5,0.1").value();
  std::vector<std::string> got;
  for (const auto& [k, v] : f.run(full).metrics) got.push_back(k);
  EXPECT_EQ(got, rollout_correction_metric_keys(full));
}

TEST(RolloutCorrection, PolicyLossTakesWeightsAndReinforce) {
  Ragged L = Ragged::from_lengths({2});
  std::vector<double> logp{std::log(0.5), std::log(0.25)}, adv{1.0, -2.0}, w{0.5, 2.0}, pg_mask{1, 0};
  PolicyLossConfig cfg;
  PolicyLossInput in;
  in.layout = &L;
  in.logp = &logp;
  in.old_logp = &logp;  // ratio 1: the clipped loss is -A
  in.advantages = &adv;
  in.is_weights = &w;
  auto out = policy_loss_vanilla(cfg, in);
  EXPECT_NEAR(out.pg_loss, (-1 * 0.5 + 2 * 2.0) / 2, 1e-12);  // token-mean of -A * ratio * w
  EXPECT_NEAR(out.dloss_dlogp[0], -0.5 / 2, 1e-12);
  EXPECT_NEAR(out.dloss_dlogp[1], 4.0 / 2, 1e-12);
  cfg.reinforce = true;  // -A * logp * w; the pg mask drops the second token
  in.pg_mask = &pg_mask;
  auto rf = policy_loss_vanilla(cfg, in);
  EXPECT_NEAR(rf.pg_loss, -1 * std::log(0.5) * 0.5, 1e-12);
  EXPECT_NEAR(rf.dloss_dlogp[0], -0.5, 1e-12);
  EXPECT_NEAR(rf.dloss_dlogp[1], 0.0, 1e-12);
  EXPECT_EQ(rf.pg_clipfrac, 0.0);
}
