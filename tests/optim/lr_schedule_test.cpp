#include <gtest/gtest.h>

#include <cmath>

#include "optim/lr_schedule.h"

using namespace kestrel;
using namespace kestrel::optim;

// Hand-computed from verl's lambdas (see lr_schedule.h for the formulas).

TEST(LrSchedule, ConstantWithWarmup) {
  LrSchedule s({.lr = 1e-3, .style = LrStyle::Constant, .warmup_steps = 4});
  EXPECT_EQ(s.lr(0), 0.0);  // verl: the first update with warmup runs at lr 0
  EXPECT_DOUBLE_EQ(s.lr(1), 0.25e-3);
  EXPECT_DOUBLE_EQ(s.lr(3), 0.75e-3);
  EXPECT_DOUBLE_EQ(s.lr(4), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(1000), 1e-3);
  // Without warmup the first update runs at the full lr.
  LrSchedule none({.lr = 2e-6, .style = LrStyle::Constant, .warmup_steps = 0});
  EXPECT_DOUBLE_EQ(none.lr(0), 2e-6);
  // init_lr_ratio lifts the start of the warmup ramp.
  LrSchedule init({.lr = 1.0, .style = LrStyle::Cosine, .warmup_steps = 4, .total_steps = 8, .init_lr_ratio = 0.2});
  EXPECT_DOUBLE_EQ(init.factor(0), 0.2);
  EXPECT_DOUBLE_EQ(init.factor(2), 0.2 + 0.8 * 0.5);
}

TEST(LrSchedule, CosineWithWarmupAndMinRatio) {
  LrSchedule s({.lr = 1.0, .style = LrStyle::Cosine, .warmup_steps = 2, .total_steps = 12, .min_lr_ratio = 0.1});
  EXPECT_DOUBLE_EQ(s.factor(0), 0.0);
  EXPECT_DOUBLE_EQ(s.factor(1), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(2), 1.0);
  // step 7: progress (7-2)/10 = 0.5, cos(pi/2) = 0 -> 0.1 + 0.9 * 0.5 = 0.55
  EXPECT_NEAR(s.factor(7), 0.55, 1e-15);
  // step 4: progress 0.2: 0.1 + 0.9 * 0.5 * (1 + cos(0.2 pi))
  EXPECT_NEAR(s.factor(4), 0.1 + 0.45 * (1 + std::cos(0.2 * M_PI)), 1e-15);
  EXPECT_NEAR(s.factor(12), 0.1, 1e-15);
  // verl does not clamp progress past total_steps.
  EXPECT_NEAR(s.factor(14), 0.1 + 0.45 * (1 + std::cos(1.2 * M_PI)), 1e-15);
  LrSchedule full({.lr = 3.0, .style = LrStyle::Cosine, .warmup_steps = 0, .total_steps = 4, .num_cycles = 0.5});
  EXPECT_DOUBLE_EQ(full.lr(0), 3.0);
  EXPECT_NEAR(full.lr(2), 1.5, 1e-15);
  EXPECT_NEAR(full.lr(4), 0.0, 1e-15);
}

TEST(LrSchedule, LinearDecay) {
  LrSchedule s({.lr = 1.0, .style = LrStyle::Linear, .warmup_steps = 2, .total_steps = 10, .min_lr_ratio = 0.2});
  EXPECT_DOUBLE_EQ(s.factor(1), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(2), 1.0);                  // 0.2 + 0.8 * 8/8
  EXPECT_DOUBLE_EQ(s.factor(6), 0.2 + 0.8 * 4.0 / 8);  // halfway
  EXPECT_DOUBLE_EQ(s.factor(10), 0.2);
  EXPECT_DOUBLE_EQ(s.factor(50), 0.2);
}

TEST(LrSchedule, WarmupFromRatioAndValidation) {
  EXPECT_EQ(resolve_warmup_steps(-1, 0.1, 95), 9);  // int(9.5)
  EXPECT_EQ(resolve_warmup_steps(3, 0.5, 95), 3);
  EXPECT_EQ(parse_lr_style("cosine", "x").value(), LrStyle::Cosine);
  auto bad = parse_lr_style("wsd", "config.yaml: optim.lr_scheduler_type");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "config.yaml: optim.lr_scheduler_type: unknown lr schedule 'wsd'; use constant, linear or cosine");
  EXPECT_THROW(LrSchedule({.style = LrStyle::Cosine, .total_steps = 0}), Error);
  EXPECT_THROW(LrSchedule({.min_lr_ratio = 1.5}), Error);
}

// optim.lr_decay_steps (Megatron): the decay reaches min_lr at step D instead
// of total_steps, then stays there; D = 0 (null) decays over total_steps.
TEST(LrSchedule, DecayStepsSetTheDecayLength) {
  // Linear, W = 2, D = 6, T = 10, r = 0.1: factor = r + (1 - r) * (D - s) / (D - W).
  LrSchedule lin({.lr = 1.0, .style = LrStyle::Linear, .warmup_steps = 2, .total_steps = 10, .decay_steps = 6,
                  .min_lr_ratio = 0.1});
  EXPECT_DOUBLE_EQ(lin.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(lin.lr(4), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(lin.lr(6), 0.1);
  EXPECT_DOUBLE_EQ(lin.lr(9), 0.1);
  // Cosine, W = 0, D = 4, T = 100: half-way (s = 2) is (1 + r) / 2; at and after D it is r.
  LrSchedule cos({.lr = 2.0, .style = LrStyle::Cosine, .warmup_steps = 0, .total_steps = 100, .decay_steps = 4,
                  .min_lr_ratio = 0.2});
  EXPECT_DOUBLE_EQ(cos.lr(0), 2.0);
  EXPECT_NEAR(cos.lr(2), 2.0 * 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(cos.lr(4), 2.0 * 0.2);
  EXPECT_DOUBLE_EQ(cos.lr(50), 2.0 * 0.2);
  // decay_steps = 0 is the old schedule over total_steps.
  LrSchedule over_total({.lr = 1.0, .style = LrStyle::Linear, .warmup_steps = 0, .total_steps = 4});
  EXPECT_DOUBLE_EQ(over_total.lr(2), 0.5);
  EXPECT_THROW(LrSchedule({.lr = 1.0, .style = LrStyle::Linear, .total_steps = 4, .decay_steps = -1}), Error);
}
