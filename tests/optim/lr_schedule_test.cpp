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
