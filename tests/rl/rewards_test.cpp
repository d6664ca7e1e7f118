#include <gtest/gtest.h>

#include "rl/reward_rules.h"

using namespace kestrel::rl;

TEST(Gsm8kReward, StrictAndFlexibleExtraction) {
  EXPECT_EQ(gsm8k_score("so the answer is 7\n#### 72", "72"), 1.0);
  EXPECT_EQ(gsm8k_score("#### 1,234", "1234"), 1.0);
  EXPECT_EQ(gsm8k_score("#### $5", "5"), 0.0);  // "$" is not in the number pattern
  EXPECT_EQ(gsm8k_score("#### 3 then #### 4", "4"), 1.0);  // last match
  EXPECT_EQ(gsm8k_score("the answer is 72", "72"), 0.0);   // strict needs ####
  EXPECT_EQ(gsm8k_score("the answer is 72.", "72.", false), 1.0);
  EXPECT_EQ(*gsm8k_extract("a 1 b 2 c", false), "2");
  EXPECT_FALSE(gsm8k_extract("no number here", true).has_value());
  // Only the last 300 characters count.
  EXPECT_EQ(gsm8k_score("#### 9" + std::string(400, ' '), "9"), 0.0);
}

TEST(MathReward, BoxedAndNormalisation) {
  EXPECT_EQ(*last_boxed_content("x \\boxed{1} y \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(math_score("so \\boxed{\\dfrac{1}{2}}", "\\frac12"), 1.0);
  EXPECT_EQ(math_score("\\boxed{0.5}", "\\frac{1}{2}"), 1.0);
  EXPECT_EQ(math_score("\\boxed{x = 3}", "3"), 1.0);
  EXPECT_EQ(math_score("\\boxed{3/4}", "\\frac{3}{4}"), 1.0);
  EXPECT_EQ(math_score("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"), 1.0);
  EXPECT_EQ(math_score("\\boxed{90^\\circ}", "90"), 1.0);
  EXPECT_EQ(math_score("\\boxed{\\sqrt2}", "\\sqrt{2}"), 1.0);
  EXPECT_EQ(math_score("\\boxed{4}", "5"), 0.0);
  EXPECT_EQ(math_score("no box", "5"), 0.0);
}

TEST(ArithReward, IntegerAfterLastMarker) {
  EXPECT_EQ(arith_score("3 + 4 = 7\n#### 7", "7"), 1.0);
  EXPECT_EQ(arith_score("#### -12", "-12"), 1.0);
  EXPECT_EQ(arith_score("#### 12", "-12"), 0.0);
  EXPECT_EQ(arith_score("#### 70", "7"), 0.0);
  EXPECT_EQ(arith_score("7", "7"), 0.0);
  EXPECT_EQ(*rule_score("openai/gsm8k", "#### 5", "5"), 1.0);
  EXPECT_FALSE(rule_score("unknown/source", "x", "y").has_value());
}

TEST(ArithReward, StepCreditForRightArithmetic) {
  const std::string right = "Ruth starts with 3.\n3 boxes hold 3 * 3 = 9.\nSo 3 + 9 = 12.\n#### 12";
  EXPECT_EQ(arith_step_credit_score(right, "12", 0.5), 1.0);
  // A misread number with right arithmetic: both equations right, answer wrong.
  EXPECT_EQ(arith_step_credit_score("4 * 3 = 12\n3 + 12 = 15\n#### 15", "12", 0.5), 0.5);
  // One of two equations wrong.
  EXPECT_EQ(arith_step_credit_score("3 * 3 = 9\n3 + 9 = 13\n#### 13", "12", 0.5), 0.25);
  EXPECT_EQ(arith_step_credit_score("17 - 7 = 10 and 10 - 4 = 7\n#### 7", "3", 0.4), 0.2);
  EXPECT_EQ(arith_step_credit_score("no equations\n#### 3", "4", 0.5), 0.0);
  EXPECT_EQ(arith_step_credit_score("", "4", 0.5), 0.0);
  EXPECT_EQ(rule_prediction("arith", "2 + 2 = 4\n#### 4"), std::optional<std::string>("4"));
  EXPECT_EQ(rule_prediction("arith", "no marker"), std::nullopt);
}
