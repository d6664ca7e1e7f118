// data.* settings from a verl-style run configuration.
#include "common/testing.h"
#include "config/config.h"
#include "data/config_options.h"

namespace kestrel::data {
namespace {

TEST(ConfigOptions, RlDatasetOptionsFromVerlKeys) {
  config::LoadOptions lo;
  lo.overrides = {"data.max_prompt_length=64", "data.prompt_key=question", "data.train_max_samples=10",
                  "data.val_max_samples=5", "data.seed=7"};
  const auto cfg = config::load(lo).value();
  const auto o = rl_dataset_options(cfg).value();
  EXPECT_EQ(o.prompt_key, "question");
  EXPECT_EQ(o.max_prompt_length, 64);
  EXPECT_EQ(o.truncation, Truncation::Error);
  EXPECT_FALSE(o.filter_overlong_prompts);
  EXPECT_EQ(o.max_samples, 10);
  EXPECT_EQ(rl_dataset_options(cfg, true).value().max_samples, 5);
  EXPECT_EQ(data_seed(cfg), 7u);
  EXPECT_EQ(data_seed(config::load({}).value()), 1u);
}

TEST(ConfigOptions, ExpandsHome) {
  setenv("HOME", "/home/k", 1);
  EXPECT_EQ(expand_paths({"~/data/a.jsonl", "/abs.jsonl"}), (std::vector<std::string>{"/home/k/data/a.jsonl", "/abs.jsonl"}));
}

}  // namespace
}  // namespace kestrel::data
