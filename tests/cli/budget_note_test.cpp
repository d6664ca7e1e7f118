// The built-in run's summary says when the machine was too slow for its
// 10-minute budget, instead of reporting a short run's gain as the result.
#include <gtest/gtest.h>

#include "cli/options.h"

namespace kestrel::cli {
namespace {

TEST(BuiltinBudgetNote, SaysWhenTheBudgetHeldTooFewSteps) {
  // 711 steps in 590 s (the Prescott-GEMM machine): 0.83 s a step.
  const std::string n = builtin_budget_note(711, 711, 2000, 590, 590);
  EXPECT_NE(n.find("0.83 s a step"), std::string::npos) << n;
  EXPECT_NE(n.find("held 711 steps"), std::string::npos) << n;
  EXPECT_NE(n.find(">= 1000 (<= 0.59 s a step)"), std::string::npos) << n;
  EXPECT_NE(n.find("trainer.time_budget_s=0 runs all 2000 steps"), std::string::npos) << n;
}

TEST(BuiltinBudgetNote, SilentWhenTheRunFitOrIsNotTheBuiltInBudget) {
  EXPECT_EQ(builtin_budget_note(1977, 1977, 2000, 590, 590), "");  // this machine's demo
  EXPECT_EQ(builtin_budget_note(2000, 2000, 2000, 590, 500), "");  // all steps done
  EXPECT_EQ(builtin_budget_note(58, 58, 2000, 20, 20), "");        // a user's short budget
  EXPECT_EQ(builtin_budget_note(700, 200, 2000, 590, 590), "");    // resumed: earlier steps ran elsewhere
  EXPECT_EQ(builtin_budget_note(0, 0, 2000, 590, 590), "");
}

}  // namespace
}  // namespace kestrel::cli
