// verl's reward managers (reward_model.reward_manager): dapo's overlong
// penalty against hand-computed values, its acc fallback and extra info,
// prime's batch zeroing, batch's one call per batch, refusals, and the DAPO
// recipe's config keys in both layouts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>

#include "common/testing.h"
#include "config/config.h"
#include "rl/reward_manager.h"

using namespace kestrel::rl;
using kestrel::testing::source_path;
using json = nlohmann::ordered_json;

namespace {

RewardManagerOptions quiet(RewardManagerOptions o) {
  o.stderr_sink = [](const std::string&) {};
  return o;
}

RewardRequest req(std::string ds, std::string text, std::string gt, int64_t len) {
  return {std::move(ds), std::move(text), std::move(gt), nullptr, len};
}

bool have_python3() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t a = 0; a <= dirs.size();) {
    size_t b = dirs.find(':', a);
    if (b == std::string::npos) b = dirs.size();
    if (::access(((b > a ? dirs.substr(a, b - a) : std::string(".")) + "/python3").c_str(), X_OK) == 0) return true;
    a = b + 1;
  }
  return false;
}

}  // namespace

TEST(OverlongReward, HandComputedValues) {
  // max_resp_len 20, buffer 4: expected_len 16; penalty -(L - 16) / 4 * factor, capped at 0.
  OverlongBufferConfig c{true, 4, 1.0, false};
  EXPECT_EQ(overlong_reward(c, 20, 10), 0.0);
  EXPECT_EQ(overlong_reward(c, 20, 16), 0.0);
  EXPECT_EQ(overlong_reward(c, 20, 17), -0.25);
  EXPECT_EQ(overlong_reward(c, 20, 18), -0.5);
  EXPECT_EQ(overlong_reward(c, 20, 20), -1.0);
  c.penalty_factor = 0.5;
  EXPECT_EQ(overlong_reward(c, 20, 19), -0.375);
  // The recipe's numbers: 20480 tokens, buffer 4096, factor 1: 18432 tokens -> -0.5.
  EXPECT_EQ(overlong_reward({true, 4096, 1.0, false}, 20480, 18432), -0.5);
  EXPECT_EQ(overlong_reward({false, 4096, 1.0, false}, 20480, 20480), 0.0);
}

TEST(RewardManagers, DapoAddsThePenaltyAndLogsAccAndOverlong) {
  RewardManagerOptions o;
  o.manager = "dapo";
  o.overlong = {true, 4, 1.0, true};
  o.max_resp_len = 20;
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  auto r = (*m)->score({req("math_dapo", "Answer: 42", "42", 18), req("math_dapo", "Answer: 41", "42", 10),
                        req("openai/gsm8k", "#### 7", "7", 20)});
  EXPECT_EQ(r.scores, (std::vector<double>{0.5, -1.0, 0.0}));
  EXPECT_EQ(r.extra[0], json::parse(R"({"score": 1.0, "acc": true, "pred": "42", "overlong_reward": -0.5,
                                        "overlong": true})"));
  EXPECT_EQ(r.extra[1], json::parse(R"({"score": -1.0, "acc": false, "pred": "41", "overlong_reward": 0.0,
                                        "overlong": false})"));
  // A float result: acc is the score before the penalty (verl's reward_extra_info["acc"]).
  EXPECT_EQ(r.extra[2], json::parse(R"({"acc": 1.0, "overlong_reward": -1.0, "overlong": true})"));
  EXPECT_NE((*m)->describe().find("reward_manager=dapo"), std::string::npos);
}

TEST(RewardManagers, NaiveKeepsDictKeysAndIgnoresLength) {
  auto m = RewardManager::create(quiet({}));
  ASSERT_TRUE(m.is_ok());
  auto r = (*m)->score({req("aime2024", "Answer: 7", "7", 100000), req("openai/gsm8k", "#### 7", "7", 3)});
  EXPECT_EQ(r.scores, (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(r.extra[0], json::parse(R"({"score": 1.0, "acc": true, "pred": "7"})"));
  EXPECT_TRUE(r.extra[1].empty());
}

TEST(RewardManagers, PrimeZeroesABatchWithADictResult) {
  RewardManagerOptions o;
  o.manager = "prime";
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok());
  auto r = (*m)->score({req("openai/gsm8k", "#### 7", "7", 3), req("openai/gsm8k", "#### 8", "7", 3)});
  EXPECT_EQ(r.scores, (std::vector<double>{1.0, 0.0}));
  // math_dapo returns a dict: verl's float(result[0]) fails and verify() sets every score to 0.
  r = (*m)->score({req("openai/gsm8k", "#### 7", "7", 3), req("math_dapo", "Answer: 7", "7", 3)});
  EXPECT_EQ(r.scores, (std::vector<double>{0.0, 0.0}));
  EXPECT_TRUE(r.extra[1].empty());
}

TEST(RewardManagers, RefusalsAtStartup) {
  RewardManagerOptions o;
  o.manager = "rate_limited";
  auto m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("not supported yet: reward_manager=rate_limited"), std::string::npos);

  o.manager = "batch";
  m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("reward_model.reward_manager=batch needs a batch function"), std::string::npos);

  o.manager = "naive";
  o.overlong = {true, 4, 1.0, false};
  o.max_resp_len = 20;
  m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("needs reward_model.reward_manager=dapo"), std::string::npos);
  o.manager = "dapo";
  o.max_resp_len = 3;
  m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("must be >= overlong_buffer.len"), std::string::npos) << m.status().message();
  o.overlong.len = 0;
  m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());

  auto rules = RewardManager::create(quiet({})).value();
  auto st = rules->validate_data_sources({"openai/gsm8k", "taco"});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not supported yet: data_source=taco needs a code sandbox"), std::string::npos);
}

TEST(RewardManagers, BatchCallsTheFunctionOncePerBatch) {
  if (!have_python3()) GTEST_SKIP() << "python3 not found: the reward adapter runs the user's Python code";
  RewardManagerOptions o;
  o.manager = "batch";
  o.custom_path = source_path("tests/rl/fixtures/py_batch_reward.py");
  o.adapter_path = source_path("scripts/reward_adapter.py");
  o.reward_kwargs = {{"bonus", 0.5}};
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  auto r = (*m)->score({req("x", "a", "a", 1), req("dict", "abc", "a", 1), req("x", "b", "a", 1)});
  EXPECT_EQ(r.scores, (std::vector<double>{1.5, 3.5, 0.5}));
  EXPECT_EQ(r.extra[1], json::parse(R"({"score": 3.5, "batch_size": 3})"));
  r = (*m)->score({req("dict", "ab", "a", 1)});
  EXPECT_EQ(r.extra[0], json::parse(R"({"score": 2.5, "batch_size": 1})"));
  EXPECT_EQ(r.failures.total(), 0);
  // A per-response function cannot serve the batch manager: its signature is checked at startup.
  o.custom_path = source_path("tests/rl/fixtures/py_reward.py");
  auto bad = RewardManager::create(quiet(o));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("data_sources=..."), std::string::npos) << bad.status().message();
}

TEST(RewardManagers, DapoRecipeKeysInBothLayouts) {
  namespace config = kestrel::config;
  auto load = [](std::vector<std::string> ov) {
    config::LoadOptions lo;
    lo.overrides = std::move(ov);
    return config::load(lo);
  };
  // The recipe's run scripts: reward_model.reward_manager + reward_model.overlong_buffer.*.
  auto a = load({"reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true",
                 "reward_model.overlong_buffer.len=4096", "reward_model.overlong_buffer.penalty_factor=1.0",
                 "data.max_response_length=20480"});
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  RewardManagerOptions o = reward_options_from_config(*a);
  EXPECT_EQ(o.manager, "dapo");
  EXPECT_TRUE(o.overlong.enable);
  EXPECT_EQ(o.overlong.len, 4096);
  EXPECT_EQ(o.overlong.penalty_factor, 1.0);
  EXPECT_FALSE(o.overlong.log);
  EXPECT_EQ(o.max_resp_len, 20480);
  EXPECT_TRUE(o.config_error.empty());
  // The recipe's newer yaml: reward.reward_manager.name + reward.reward_kwargs.*.
  auto b = load({"reward.reward_manager.name=dapo", "reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                 "reward.reward_kwargs.overlong_buffer_cfg.len=512", "reward.reward_kwargs.overlong_buffer_cfg.log=true",
                 "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5", "reward.reward_kwargs.max_resp_len=1024"});
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  o = reward_options_from_config(*b);
  EXPECT_EQ(o.manager, "dapo");
  EXPECT_EQ(o.overlong.len, 512);
  EXPECT_TRUE(o.overlong.log);
  EXPECT_EQ(o.overlong.penalty_factor, 0.5);
  EXPECT_EQ(o.max_resp_len, 1024);
  // verl's older reward-manager kwargs, added with '+' by the recipe's run scripts.
  auto d = load({"reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                 "+reward_model.reward_kwargs.overlong_buffer_cfg.len=256",
                 "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.25",
                 "+reward_model.reward_kwargs.max_resp_len=768"});
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  o = reward_options_from_config(*d);
  EXPECT_TRUE(o.overlong.enable);
  EXPECT_EQ(o.overlong.len, 256);
  EXPECT_EQ(o.overlong.penalty_factor, 0.25);
  EXPECT_EQ(o.max_resp_len, 768);
  EXPECT_TRUE(o.config_error.empty());
  // Two layouts enabling the buffer at once: which one is meant is unclear.
  auto e = load({"reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=8",
                 "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true"});
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_NE(reward_options_from_config(*e).config_error.find("configure one of them"), std::string::npos);
  // Both layouts naming different managers: an error at create().
  auto c = load({"reward.reward_manager.name=dapo", "reward_model.reward_manager=prime"});
  ASSERT_TRUE(c.is_ok());
  auto m = RewardManager::create(quiet(reward_options_from_config(*c)));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("disagree"), std::string::npos);
}
