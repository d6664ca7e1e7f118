// RL math against hand-computed values (verl's core_algos.py semantics).
#include <gtest/gtest.h>

#include <cmath>

#include "rl/advantages.h"
#include "rl/policy_loss.h"

using namespace kestrel::rl;

namespace {

// Two prompts x two samples; response lengths 2,1,3,2; outcome scores on the
// last token: 1, 0, 1, 1.
struct Fixture {
  Ragged layout = Ragged::from_lengths({2, 1, 3, 2});
  std::vector<double> rewards{0, 1, 0, 0, 0, 1, 0, 1};
  std::vector<int64_t> group{0, 0, 1, 1};
};

}  // namespace

TEST(Advantages, GrpoNormalisesWithinGroupsByUnbiasedStd) {
  Fixture f;
  AdvantageInput in;
  in.layout = &f.layout;
  in.token_rewards = &f.rewards;
  in.group = &f.group;
  auto out = compute_advantages(AdvEstimator::GRPO, in);
  // group 0: R = {1, 0}, mean 0.5, std (unbiased) = sqrt(0.5) = 0.70710678
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  std::vector<double> want{a, a, -a, 0, 0, 0, 0, 0};  // group 1: equal scores -> 0
  for (size_t t = 0; t < want.size(); ++t) EXPECT_NEAR(out.advantages[t], want[t], 1e-12) << t;
  EXPECT_EQ(out.returns, out.advantages);
  in.norm_adv_by_std_in_grpo = false;  // Dr.GRPO
  auto dr = compute_advantages(AdvEstimator::GRPO, in);
  EXPECT_NEAR(dr.advantages[0], 0.5, 1e-12);
  EXPECT_NEAR(dr.advantages[2], -0.5, 1e-12);
}

TEST(Advantages, GrpoSingleSampleGroupUsesMeanZeroStdOne) {
  Ragged L = Ragged::from_lengths({2});
  std::vector<double> r{0, 0.7};
  std::vector<int64_t> g{5};
  AdvantageInput in;
  in.layout = &L;
  in.token_rewards = &r;
  in.group = &g;
  auto out = compute_advantages(AdvEstimator::GRPO, in);
  EXPECT_NEAR(out.advantages[0], 0.7 / (1 + 1e-6), 1e-12);
}

TEST(Advantages, RlooIsLeaveOneOutBaseline) {
  Ragged L = Ragged::from_lengths({1, 1, 1});
  std::vector<double> r{3, 0, 6};
  std::vector<int64_t> g{0, 0, 0};
  AdvantageInput in;
  in.layout = &L;
  in.token_rewards = &r;
  in.group = &g;
  auto out = compute_advantages(AdvEstimator::RLOO, in);
  EXPECT_NEAR(out.advantages[0], 3 - (0 + 6) / 2.0, 1e-12);
  EXPECT_NEAR(out.advantages[1], 0 - (3 + 6) / 2.0, 1e-12);
  EXPECT_NEAR(out.advantages[2], 6 - (3 + 0) / 2.0, 1e-12);
}

TEST(Advantages, ReinforcePlusPlusWhitensDiscountedReturns) {
  Ragged L = Ragged::from_lengths({2, 2});
  std::vector<double> r{0, 1, 0, 0};
  AdvantageInput in;
  in.layout = &L;
  in.token_rewards = &r;
  in.gamma = 0.5;
  auto out = compute_advantages(AdvEstimator::ReinforcePP, in);
  // G = {0.5, 1, 0, 0}; mean 0.375; unbiased var = sum((G-mean)^2)/3
  std::vector<double> G{0.5, 1, 0, 0};
  double mean = 0.375, ss = 0;
  for (double x : G) ss += (x - mean) * (x - mean);
  const double inv = 1 / std::sqrt(ss / 4 * (4.0 / 3.0) + 1e-8);
  for (size_t t = 0; t < 4; ++t) {
    EXPECT_NEAR(out.returns[t], G[t], 1e-12);
    EXPECT_NEAR(out.advantages[t], (G[t] - mean) * inv, 1e-6);
  }
}

TEST(Advantages, ReinforcePlusPlusBaselineSubtractsGroupMeanThenWhitens) {
  Fixture f;
  AdvantageInput in;
  in.layout = &f.layout;
  in.token_rewards = &f.rewards;
  in.group = &f.group;
  auto out = compute_advantages(AdvEstimator::ReinforcePPBaseline, in);
  std::vector<double> pre{0.5, 0.5, -0.5, 0, 0, 0, 0, 0};
  std::vector<double> m(8, 1.0);
  auto want = masked_whiten(pre, m);
  for (size_t t = 0; t < 8; ++t) EXPECT_NEAR(out.advantages[t], want[t], 1e-12);
}

TEST(Advantages, GaeMatchesHandComputedRecursion) {
  Ragged L = Ragged::from_lengths({3});
  std::vector<double> r{0, 0, 1}, V{0.1, 0.2, 0.3};
  AdvantageInput in;
  in.layout = &L;
  in.token_rewards = &r;
  in.values = &V;
  in.gamma = 0.9;
  in.lam = 0.8;
  auto out = compute_advantages(AdvEstimator::GAE, in);
  const double d2 = 1 - 0.3, d1 = 0 + 0.9 * 0.3 - 0.2, d0 = 0 + 0.9 * 0.2 - 0.1;
  const double a2 = d2, a1 = d1 + 0.72 * a2, a0 = d0 + 0.72 * a1;
  EXPECT_NEAR(out.returns[0], a0 + 0.1, 1e-12);
  EXPECT_NEAR(out.returns[1], a1 + 0.2, 1e-12);
  EXPECT_NEAR(out.returns[2], a2 + 0.3, 1e-12);
  std::vector<double> raw{a0, a1, a2}, m(3, 1.0);
  auto w = masked_whiten(raw, m);
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(out.advantages[size_t(t)], w[size_t(t)], 1e-12);
}

TEST(AggLoss, WeightsOfEveryMode) {
  Ragged L = Ragged::from_lengths({1, 3});
  std::vector<double> m{1, 1, 1, 0};
  auto tm = agg_weights(L, m, {AggMode::TokenMean});
  EXPECT_NEAR(tm[0], 1.0 / 3, 1e-12);
  EXPECT_EQ(tm[3], 0.0);
  auto sts = agg_weights(L, m, {AggMode::SeqMeanTokenSum});
  EXPECT_NEAR(sts[0], 0.5, 1e-12);
  EXPECT_NEAR(sts[1], 0.5, 1e-12);
  auto stm = agg_weights(L, m, {AggMode::SeqMeanTokenMean});
  EXPECT_NEAR(stm[0], 0.5, 1e-8);
  EXPECT_NEAR(stm[1], 0.25, 1e-8);  // valid length 2
  auto norm = agg_weights(L, m, {AggMode::SeqMeanTokenSumNorm, 0, 0, 8});
  EXPECT_NEAR(norm[2], 1.0 / 8, 1e-12);
  AggScope global{AggMode::TokenMean, 12};
  EXPECT_NEAR(agg_weights(L, m, global)[0], 1.0 / 12, 1e-12);
}

TEST(PolicyLoss, ClipDualClipMetricsAndGradient) {
  Ragged L = Ragged::from_lengths({4});
  // ratios: e^0.5 (clipped high, A>0), e^-0.5 (clipped low, A<0 -> L2 wins), 1 (A>0), e^2 with A<0 (dual clip).
  std::vector<double> old{0, 0, 0, 0}, logp{0.5, -0.5, 0.0, 2.0}, A{1.0, -1.0, 2.0, -1.0};
  PolicyLossConfig cfg;
  PolicyLossInput in;
  in.layout = &L;
  in.logp = &logp;
  in.old_logp = &old;
  in.advantages = &A;
  auto out = policy_loss_vanilla(cfg, in);
  // token 0: L1=-1.6487, L2=-1.2 -> max=-1.2 (clipped, grad 0)
  // token 1: ratio .6065, L1=.6065, L2=.8 -> .8 (clipped, grad 0)
  // token 2: ratio 1 -> -2, grad -2
  // token 3: ratio 7.389, L1=7.389, L2=1.2 -> 7.389; L3 = 3 -> 3 (dual clip, grad 0)
  const double want = (-1.2 + 0.8 - 2.0 + 3.0) / 4;
  EXPECT_NEAR(out.pg_loss, want, 1e-9);
  EXPECT_NEAR(out.loss, want, 1e-9);
  EXPECT_NEAR(out.pg_clipfrac, 2.0 / 4, 1e-8);  // tokens 0, 1 (token 3: L2 < L1)
  EXPECT_NEAR(out.pg_clipfrac_lower, 1.0 / 4, 1e-8);
  EXPECT_NEAR(out.ppo_kl, -(0.5 - 0.5 + 0 + 2) / 4, 1e-8);
  EXPECT_NEAR(out.dloss_dlogp[0], 0, 1e-12);
  EXPECT_NEAR(out.dloss_dlogp[1], 0, 1e-12);
  EXPECT_NEAR(out.dloss_dlogp[2], -2.0 / 4, 1e-12);
  EXPECT_NEAR(out.dloss_dlogp[3], 0, 1e-12);
}

TEST(PolicyLoss, GradientMatchesFiniteDifferencesWithKlAndEntropy) {
  Ragged L = Ragged::from_lengths({2, 3});
  std::vector<double> old{-1.0, -2.0, -0.5, -1.5, -0.7}, A{0.3, 0.3, -0.8, -0.8, -0.8};
  std::vector<double> ref{-1.1, -1.8, -0.6, -1.2, -0.9}, H{1.0, 2.0, 0.5, 0.7, 1.1};
  std::vector<double> logp{-0.95, -2.05, -0.52, -1.45, -0.72};  // inside the clip range
  for (const char* kl : {"low_var_kl", "k1", "abs", "k2", "low_var_kl+"}) {
    for (AggMode mode : {AggMode::TokenMean, AggMode::SeqMeanTokenMean, AggMode::SeqMeanTokenSum}) {
      PolicyLossConfig cfg;
      cfg.entropy_coeff = 0.01;
      cfg.use_kl_loss = true;
      cfg.kl_loss_coef = 0.1;
      cfg.kl_loss_type = kl;
      cfg.agg.mode = mode;
      auto f = [&](const std::vector<double>& lp) {
        PolicyLossInput in{&L, &lp, &old, &A, nullptr, &H, &ref};
        return policy_loss_vanilla(cfg, in).loss;
      };
      PolicyLossInput in{&L, &logp, &old, &A, nullptr, &H, &ref};
      auto out = policy_loss_vanilla(cfg, in);
      for (size_t t = 0; t < logp.size(); ++t) {
        auto lp = logp;
        lp[t] += 1e-6;
        double fp = f(lp);
        lp[t] -= 2e-6;
        double fm = f(lp);
        double fd = (fp - fm) / 2e-6;
        // The straight-through variant's gradient is k2's by design, not its value's derivative.
        if (std::string(kl) != "low_var_kl+") { EXPECT_NEAR(out.dloss_dlogp[t], fd, 1e-6) << kl << " t=" << t; }
      }
      // d loss / d H = -entropy_coeff * weight
      auto w = agg_weights(L, std::vector<double>(5, 1.0), cfg.agg);
      for (size_t t = 0; t < 5; ++t) EXPECT_NEAR(out.dloss_dentropy[t], -0.01 * w[t], 1e-12);
    }
  }
}

TEST(Kl, EstimatorsAndStraightThrough) {
  EXPECT_NEAR(kl_estimate("k1", -1.0, -1.5).value, 0.5, 1e-12);
  EXPECT_NEAR(kl_estimate("abs", -1.5, -1.0).value, 0.5, 1e-12);
  EXPECT_NEAR(kl_estimate("mse", -1.0, -1.5).value, 0.125, 1e-12);
  const double k = -1.5 - (-1.0);
  EXPECT_NEAR(kl_estimate("low_var_kl", -1.0, -1.5).value, std::exp(k) - k - 1, 1e-12);
  auto st = kl_estimate("low_var_kl+", -1.0, -1.5);
  EXPECT_NEAR(st.value, std::exp(k) - k - 1, 1e-12);
  EXPECT_NEAR(st.dvalue_dlogp, 0.5, 1e-12);  // k2's gradient: delta
  EXPECT_NEAR(kl_estimate("k3", 0.0, 30.0).value, 10.0, 1e-12);  // clamped
  EXPECT_FALSE(parse_kl_type("k4").is_ok());
}

TEST(ValueLoss, ClippedValueLoss) {
  Ragged L = Ragged::from_lengths({2});
  std::vector<double> v{1.0, 0.0}, vold{0.0, 0.0}, G{2.0, 1.0};
  auto out = value_loss(L, v, vold, G, nullptr, 0.5, {AggMode::TokenMean});
  // t0: vclip=0.5, e1=1, e2=2.25 -> 2.25 ; t1: vclip=0, e1=e2=1 -> 1
  EXPECT_NEAR(out.loss, 0.5 * (2.25 + 1) / 2, 1e-12);
  EXPECT_NEAR(out.clipfrac, 0.5, 1e-8);
  EXPECT_NEAR(out.dloss_dvalue[0], 0.0, 1e-12);  // clipped: no gradient
  EXPECT_NEAR(out.dloss_dvalue[1], 0.5 * 0.5 * 2 * (0 - 1), 1e-12);
}

TEST(KlController, AdaptiveMovesTowardTarget) {
  KlController c{"adaptive", 0.1, 0.05, 100};
  c.update(0.1, 10);  // kl above target: e = clip(1, .2) = .2 -> value *= 1.02
  EXPECT_NEAR(c.value, 0.1 * 1.02, 1e-12);
  KlController f{"fixed", 0.1};
  f.update(5.0, 10);
  EXPECT_EQ(f.value, 0.1);
}
