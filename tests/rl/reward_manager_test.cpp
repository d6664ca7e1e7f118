// Reward manager: rule scoring by data_source, external program precedence,
// startup validation, the Python adapter (skipped without python3), metrics.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/testing.h"
#include "config/config.h"
#include "rl/reward_manager.h"

using namespace kestrel::rl;
using kestrel::testing::source_path;

namespace {

// python3 on PATH (not run: a pyenv shim alone costs more than a test).
bool have_python3() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t a = 0; a <= dirs.size();) {
    size_t b = dirs.find(':', a);
    if (b == std::string::npos) b = dirs.size();
    const std::string p = (b > a ? dirs.substr(a, b - a) : std::string(".")) + "/python3";
    if (::access(p.c_str(), X_OK) == 0) return true;
    a = b + 1;
  }
  return false;
}

RewardManagerOptions quiet(RewardManagerOptions o, std::vector<std::string>* lines = nullptr) {
  o.stderr_sink = [lines](const std::string& l) {
    if (lines) lines->push_back(l);
  };
  return o;
}

}  // namespace

TEST(RewardManager, RulesByDataSource) {
  auto m = RewardManager::create(quiet({}));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_FALSE((*m)->external());
  std::vector<RewardRequest> b = {
      {"openai/gsm8k", "so 3+4 = 7\n#### 7", "7", nullptr},
      {"openai/gsm8k", "#### 8", "7", nullptr},
      {"arith", "12 + 30 = 42 #### 42", "42", nullptr},
      {"lighteval/MATH", "thus \\boxed{\\frac12}", "\\frac{1}{2}", nullptr},
  };
  auto r = (*m)->score(b);
  EXPECT_EQ(r.scores, (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(r.failures.total(), 0);
  ASSERT_EQ(r.extra.size(), 4u);

  EXPECT_TRUE((*m)->validate_data_sources({"openai/gsm8k", "arith"}).is_ok());
  auto st = (*m)->validate_data_sources({"arith", "my/custom_task"});
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.message(),
            "no reward function for data_source 'my/custom_task' (set custom_reward_function.path or "
            "reward_model.reward_command)");
  // Mid-run an unknown source never throws: it scores 0 and is counted.
  r = (*m)->score({{"my/custom_task", "#### 1", "1", nullptr}, {"arith", "#### 1", "1", nullptr}});
  EXPECT_EQ(r.scores, (std::vector<double>{0, 1}));
  EXPECT_EQ(r.failures.no_rule, 1);
  EXPECT_EQ((*m)->total_failures().no_rule, 1);
}

TEST(RewardManager, ArithStepCreditScoresPartlyAndKeepsExactAcc) {
  RewardManagerOptions o;
  o.arith_step_credit = 0.5;
  auto m = RewardManager::create(o).value();
  const auto r = m->score({{"arith", "3 * 3 = 9\n3 + 9 = 13\n#### 13", "12", nullptr},
                           {"arith", "3 * 3 = 9\n3 + 9 = 12\n#### 12", "12", nullptr},
                           {"openai/gsm8k", "#### 5", "5", nullptr}});
  EXPECT_EQ(r.scores, (std::vector<double>{0.25, 1.0, 1.0}));
  EXPECT_EQ(r.extra[0]["acc"].get<double>(), 0.0);
  EXPECT_EQ(r.extra[1]["acc"].get<double>(), 1.0);
  EXPECT_FALSE(r.extra[2].contains("acc"));  // only arith gets step credit
}

TEST(RewardManager, ExternalCommandTakesPrecedenceOverRules) {
  RewardManagerOptions o;
  o.command_argv = {"bash", source_path("tests/rl/fixtures/echo_scores.sh")};
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_TRUE((*m)->external());
  EXPECT_NE((*m)->describe().find("reward_model.reward_command"), std::string::npos);
  // An arith row the rule would score 1 gets the program's answer instead.
  auto r = (*m)->score({{"arith", "#### 5", "0.25", nullptr}, {"anything", "x", "dict:0.5", nullptr}});
  EXPECT_EQ(r.scores, (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(r.extra[1]["ds"], "anything");
  // Every data_source is covered by the program.
  EXPECT_TRUE((*m)->validate_data_sources({"anything"}).is_ok());
}

// reward_model.num_workers: that many copies of the program score a batch's
// contiguous shares at once. The fixture proves they ran together (each copy
// answers its ground truths only after all three have started scoring,
// whatever the machine's speed); the scores are in request order, each
// share from one copy.
TEST(RewardManager, WorkersScoreSharesOfABatchAtOnce) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kestrel_rendezvous_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RewardManagerOptions o;
  o.command_argv = {"bash", source_path("tests/rl/fixtures/rendezvous_scores.sh"), dir.string(), "3"};
  o.num_workers = 3;
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ((*m)->workers(), 3);
  std::vector<RewardRequest> b;
  for (int i = 0; i < 8; ++i) b.push_back({"any", "x", std::to_string(i) + ".5", nullptr});
  const RewardBatchResult r = (*m)->score(b);
  ASSERT_EQ(r.scores.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(r.scores[size_t(i)], i + 0.5) << "response " << i;
  // Shares [0, 2), [2, 5), [5, 8): one copy each, three copies.
  std::set<int64_t> pids;
  for (const auto& e : r.extra) pids.insert(e.at("pid").get<int64_t>());
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_EQ(r.extra[0].at("pid"), r.extra[1].at("pid"));
  EXPECT_EQ(r.extra[2].at("pid"), r.extra[4].at("pid"));
  EXPECT_EQ(r.extra[5].at("pid"), r.extra[7].at("pid"));
  EXPECT_EQ(r.failures.total(), 0);
  std::filesystem::remove_all(dir);
}

TEST(RewardManager, WorkersAreRefusedWithABatchFunction) {
  RewardManagerOptions o;
  o.manager = "batch";
  o.command_shell = "cat";
  o.num_workers = 2;
  auto m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("not supported yet: reward_model.num_workers=2 with reward_manager=batch"),
            std::string::npos)
      << m.status().message();
  o.manager = "naive";
  o.num_workers = 0;
  m = RewardManager::create(quiet(o));
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("reward_model.num_workers must be >= 1"), std::string::npos);
}

TEST(RewardManager, CrashCountsReachMetricsAndRunContinues) {
  RewardManagerOptions o;
  o.command_shell = "bash " + source_path("tests/rl/fixtures/crash_third.sh");
  auto m = RewardManager::create(quiet(o));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  // 5, not 4: GCC 12.2 with -march=native (AVX-512) miscompiles some 4 x 64-bit
  // constants {a, a, 0, 0} into a broadcast {a, a, a, a} (reported to the integrator).
  std::vector<RewardRequest> b(5, RewardRequest{"arith", "#### 1", "1", nullptr});
  auto r = (*m)->score(b);
  EXPECT_EQ(r.scores, (std::vector<double>{1, 1, 0, 0, 0}));
  auto metrics = RewardManager::metrics(r.failures);
  EXPECT_EQ(metrics.at("reward/failures/crash"), 3.0);
  EXPECT_EQ(metrics.at("reward/failures/timeout"), 0.0);
  EXPECT_EQ(metrics.at("reward/failures/garbage"), 0.0);
  r = (*m)->score({b[0]});
  EXPECT_EQ(r.scores, (std::vector<double>{1}));
  EXPECT_EQ(RewardManager::metrics(r.failures).at("reward/restarts"), 1.0);
  EXPECT_EQ((*m)->total_failures().crash, 3);
}

TEST(RewardManager, OptionErrorsAtStartup) {
  RewardManagerOptions o;
  o.custom_path = source_path("tests/rl/fixtures/py_reward.py");
  o.command_shell = "cat";
  auto m = RewardManager::create(o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("set only one"), std::string::npos) << m.status().message();

  o.command_shell.clear();
  o.custom_path = source_path("tests/rl/fixtures/no_such_reward.py");
  m = RewardManager::create(o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("no such file"), std::string::npos) << m.status().message();

  o.custom_path = source_path("tests/rl/fixtures/echo_scores.sh");
  m = RewardManager::create(o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("not a .py file"), std::string::npos) << m.status().message();
}

TEST(RewardManager, OptionsFromDefaultConfig) {
  auto cfg = kestrel::config::load({});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  RewardManagerOptions o = reward_options_from_config(*cfg);
  EXPECT_EQ(o.custom_path, "");
  EXPECT_EQ(o.custom_name, "compute_score");
  EXPECT_TRUE(o.command_argv.empty());
  EXPECT_EQ(o.command_shell, "");
  EXPECT_GT(o.timeout_s, 0.0);
  EXPECT_EQ(o.num_workers, 1);
  kestrel::config::LoadOptions lo;
  lo.overrides = {"reward_model.num_workers=4"};
  auto cfg4 = kestrel::config::load(lo);
  ASSERT_TRUE(cfg4.is_ok()) << cfg4.status().message();
  EXPECT_EQ(reward_options_from_config(*cfg4).num_workers, 4);
}

TEST(RewardManager, LocatesAdapterThroughKestrelHome) {
  ::setenv("KESTREL_HOME", KESTREL_SOURCE_DIR, 1);
  auto p = locate_reward_adapter();
  ::unsetenv("KESTREL_HOME");
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(std::filesystem::equivalent(*p, source_path("scripts/reward_adapter.py")));
}

TEST(RewardExtraColumns, FillsMissingKeysWithNull) {
  using J = nlohmann::ordered_json;
  auto cols = reward_extra_columns({J::parse(R"({"acc": 1})"), J::object(), J::parse(R"({"pred": "x", "acc": 0})")});
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[0].first, "acc");
  EXPECT_EQ(cols[0].second, (std::vector<J>{1, nullptr, 0}));
  EXPECT_EQ(cols[1].first, "pred");
  EXPECT_EQ(cols[1].second, (std::vector<J>{nullptr, nullptr, "x"}));
}

TEST(RewardAdapter, ServesVerlStyleFunction) {
  if (!have_python3()) GTEST_SKIP() << "python3 not found: the reward adapter runs the user's Python code";
  RewardManagerOptions o;
  o.custom_path = source_path("tests/rl/fixtures/py_reward.py");
  o.adapter_path = source_path("scripts/reward_adapter.py");
  o.reward_kwargs = {{"bonus", 0.5}};
  std::vector<std::string> lines;
  {
  auto m = RewardManager::create(quiet(o, &lines));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_TRUE((*m)->external());
  auto r = (*m)->score({
      {"plain", "the answer is 42", "42", nullptr},
      {"dict", "the answer is 41", "42", {{"index", 7}}},
      {"plain", "x", "raise", nullptr},  // the function raises: garbage, the adapter keeps serving
      {"plain", "x", "nan", nullptr},    // non-finite: garbage
      {"dict", "so \xe2\x86\x92 42", "42", nullptr},
  });
  EXPECT_EQ(r.scores, (std::vector<double>{1.5, 0.5, 0, 0, 1.5}));
  EXPECT_EQ(r.failures.garbage, 2);
  EXPECT_EQ(r.failures.crash + r.failures.timeout, 0);
  // verl's reward_extra_info of a dict result: all its keys, "score" first.
  EXPECT_EQ(r.extra[1], nlohmann::ordered_json::parse(R"({"score": 0.5, "acc": false, "index": 7})"));
  // No restart was needed: errors answered in-protocol keep the stream in step.
  r = (*m)->score({{"plain", "42", "42", nullptr}});
  EXPECT_EQ(r.scores, (std::vector<double>{1.5}));
  EXPECT_EQ(r.failures.restarts, 0);
  }  // the manager stops the child, flushing its stderr
  // The user's print() went to stderr, not into the protocol.
  EXPECT_NE(std::find(lines.begin(), lines.end(), "debug: scoring plain"), lines.end());
}

TEST(RewardAdapter, ImportErrorAndMissingFunctionFailAtStartup) {
  if (!have_python3()) GTEST_SKIP() << "python3 not found: the reward adapter runs the user's Python code";
  RewardManagerOptions o;
  o.custom_path = source_path("tests/rl/fixtures/py_broken.py");
  o.adapter_path = source_path("scripts/reward_adapter.py");
  auto m = RewardManager::create(o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("this_module_does_not_exist_kestrel"), std::string::npos)
      << m.status().message();
  o.custom_path = source_path("tests/rl/fixtures/py_reward.py");
  o.custom_name = "nope";
  m = RewardManager::create(o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("defines no 'nope'"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("compute_score"), std::string::npos) << m.status().message();
}
