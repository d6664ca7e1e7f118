// configs/examples/gsm8k_grpo.sh is a verl example script with only the
// launcher changed. bash runs it here with `kestrel` standing for a stub that
// records its arguments, and those arguments load as Kestrel's configuration:
// accepted, with one notice per value Kestrel honours its own way.
// (tests/scripts/verl_gsm8k_example.sh runs it for real, 2 steps.)
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/testing.h"
#include "config_testing.h"

namespace kestrel::config {
namespace {

namespace fs = std::filesystem;

// The arguments the script passes to `kestrel` (bash expands its variables).
std::vector<std::string> script_args(const std::vector<std::string>& script_args) {
  const fs::path dir = fs::path(::testing::TempDir()) / "kestrel_example_stub";
  fs::create_directories(dir);
  const fs::path out = dir / "args";
  {
    std::ofstream stub(dir / "kestrel");
    stub << "#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > " << out.string() << "\n";
  }
  fs::permissions(dir / "kestrel", fs::perms::owner_all);
  std::string cmd = "cd " + dir.string() + " && PATH=" + dir.string() + ":/usr/bin:/bin HOME=/home/user bash " +
                    kestrel::testing::source_path("configs/examples/gsm8k_grpo.sh");
  for (const auto& a : script_args) cmd += " '" + a + "'";
  cmd += " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out, std::ios::binary);
  std::vector<std::string> words;
  for (std::string w; std::getline(in, w, '\0');) words.push_back(w);
  return words;
}

TEST(GsmExample, VerlScriptLoadsWithNoticesOnly) {
  const auto words = script_args({});
  ASSERT_GE(words.size(), 40u);
  EXPECT_EQ(words[0], "train");
  auto opts = options_from_args(std::vector<std::string>(words.begin() + 1, words.end()));
  ASSERT_TRUE(opts.is_ok()) << opts.status().message();
  // --config-path=config --config-name=ppo_megatron_trainer.yaml: no such file here, the built-in tree.
  ASSERT_EQ(opts->config_files, (std::vector<std::string>{"builtin:ppo_megatron_trainer"}));
  auto c = load(*opts);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_string("algorithm.adv_estimator"), "grpo");
  EXPECT_EQ(c->get_string_list("data.train_files").size(), 2u);  // gsm8k and MATH
  EXPECT_EQ(c->get_int("actor_rollout_ref.rollout.n"), 5);
  EXPECT_EQ(c->get_int("actor_rollout_ref.rollout.prompt_length"), 2048);
  EXPECT_EQ(c->get_int("actor_rollout_ref.rollout.tensor_model_parallel_size"), 4);  // the script's $1, default 4
  EXPECT_EQ(c->get_int("actor_rollout_ref.ref.megatron.tensor_model_parallel_size"), 4);
  EXPECT_EQ(c->get_string("actor_rollout_ref.actor.strategy"), "megatron");
  EXPECT_EQ(c->get_string("trainer.project_name"), "verl_grpo_example_gsm8k_math");
  std::string notes;
  for (const auto& n : c->notices()) notes += n + "\n";
  for (const char* want : {"rollout.name has 'trtllm'", "rollout.mode has 'async'", "trainer.logger has 'wandb'"})
    EXPECT_NE(notes.find(want), std::string::npos) << want << " missing from the notices:\n" << notes;

  // Overrides after the script's first argument (its rollout TP) win, as in verl.
  const auto more = script_args({"1", "actor_rollout_ref.rollout.n=3"});
  auto o2 = options_from_args(std::vector<std::string>(more.begin() + 1, more.end()));
  ASSERT_TRUE(o2.is_ok());
  auto c2 = load(*o2);
  ASSERT_TRUE(c2.is_ok()) << c2.status().message();
  EXPECT_EQ(c2->get_int("actor_rollout_ref.rollout.n"), 3);
  EXPECT_EQ(c2->get_int("actor_rollout_ref.rollout.tensor_model_parallel_size"), 1);
}

}  // namespace
}  // namespace kestrel::config
