// The compact console line (train/logging.h): the few numbers a person
// follows per step, picked by key; "" (then the full line) when none is there.
#include <gtest/gtest.h>

#include "train/logging.h"

using namespace kestrel;

TEST(CompactLine, RlStepShowsRewardAccuracyKlEntropyLengthSeconds) {
  const std::map<std::string, double> m = {{"critic/score/mean", 0.25},      {"val-core/arith/acc/mean@1", 0.4},
                                           {"actor/kl_loss", 0.0012},         {"actor/entropy", 1.2345},
                                           {"response_length/mean", 15.25},   {"timing_s/step", 1.254},
                                           {"actor/pg_loss", 3.0},            {"perf/throughput", 900.0}};
  EXPECT_EQ(train::compact_line(3, m),
            "step 3: reward 0.250, acc 0.400, kl 0.0012, entropy 1.234, resp_len 15.2, 1.25 s");
}

TEST(CompactLine, SeveralValidationSourcesAreNamed) {
  const std::map<std::string, double> m = {{"val-core/gsm8k/acc/mean@1", 0.5}, {"val-core/math/acc/mean@1", 0.25}};
  EXPECT_EQ(train::compact_line(0, m), "step 0: acc[gsm8k/acc] 0.500, acc[math/acc] 0.250");
}

TEST(CompactLine, SftAndSkippedSteps) {
  const std::map<std::string, double> m = {{"train/loss", 6.28183}, {"val/loss", 6.27898}, {"train/grad_norm", 6.2455},
                                           {"train/step_skipped", 1.0}, {"perf/step_time_s", 1.799}};
  EXPECT_EQ(train::compact_line(2, m), "step 2: loss 6.2818, val_loss 6.2790, grad_norm 6.25, skipped 1, 1.80 s");
}

TEST(CompactLine, UnknownMetricsGiveTheFullLine) {
  EXPECT_EQ(train::compact_line(1, {{"something/else", 1.0}}), "");
}
