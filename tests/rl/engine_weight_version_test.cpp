// The actor's weight version (train::TrainingEngine::weight_version) counts
// the optimizer steps applied; the rollout batch generated in a step carries
// the version the rollout engine read, synced after each update.
#include <gtest/gtest.h>

#include "cli/loader_source.h"
#include "rl/trainer.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

TEST(EngineWeightVersion, RolloutBatchesCarryTheWeightsThatGeneratedThem) {
  auto m = rollout::testing::tiny_model(false, DType::F32, 11);
  RlOptions o;
  o.train_batch_size = 2;
  o.n = 2;
  o.response_length = 4;
  o.rollout_seed = 3;
  o.engine.kv_cache_bytes = int64_t(8) << 20;
  o.engine.max_model_len = 64;
  o.ppo_mini_batch_size = 1;  // two actor updates per step
  o.lr.lr = 1e-2;
  o.total_steps = 2;
  o.val_before_train = false;
  o.progress = false;
  std::vector<RlPrompt> prompts(4);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4 + i; ++j) prompts[size_t(i)].ids.push_back(int32_t((i * 37 + j * 11) % 128));
  auto rm = RewardManager::create({}).value();
  RlTrainer t(*m, nullptr, prompts, {}, std::make_unique<cli::LoaderSource>(4, 2, false, 1), *rm,
              [](const std::vector<int32_t>& ids) { return std::string(ids.size() % 3, 'a'); }, o, nullptr);
  t.set_reward_function([](const RewardRequest& r) { return double(r.solution_str.size()); });
  EXPECT_EQ(t.actor_weight_version(), 0);
  EXPECT_EQ(t.generate({0, 1}).weight_version, 0);
  const auto m1 = t.train_step();
  EXPECT_EQ(m1.at("actor/num_updates"), 2.0);
  EXPECT_EQ(t.actor_weight_version(), int64_t(2 - m1.at("actor/step_skipped")));
  EXPECT_EQ(t.rollout_weight_version(), t.actor_weight_version());  // synced after the update
  EXPECT_EQ(t.generate({2, 3}).weight_version, t.actor_weight_version());
}

}  // namespace
}  // namespace kestrel::rl
