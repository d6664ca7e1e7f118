// RlTrainer is a driver over the workers: one train_step equals the workers
// composed by hand (generate -> reward -> advantages -> actor update ->
// weight sync), bit for bit on one machine, and split_options hands each
// worker the RlOptions fields it reads.
#include <gtest/gtest.h>

#include "cli/loader_source.h"
#include "rl/trainer.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

RlOptions options() {
  RlOptions o;
  o.train_batch_size = 2;
  o.n = 2;
  o.response_length = 4;
  o.rollout_seed = 3;
  o.engine.kv_cache_bytes = int64_t(8) << 20;
  o.engine.max_model_len = 64;
  o.ppo_mini_batch_size = 2;  // one update per step: on-policy, no old log-probs
  o.lr.lr = 1e-2;
  o.total_steps = 2;
  o.val_before_train = false;
  o.progress = false;
  return o;
}

std::vector<RlPrompt> prompts() {
  std::vector<RlPrompt> p(4);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4 + i; ++j) p[size_t(i)].ids.push_back(int32_t((i * 37 + j * 11) % 128));
  return p;
}

// Response text whose length varies with the first sampled token, so the
// GRPO groups have a spread (non-zero advantages).
std::string decode(const std::vector<int32_t>& ids) { return std::string(ids.empty() ? 0 : size_t(ids[0] % 7), 'a'); }
double reward(const RewardRequest& r) { return double(r.solution_str.size()); }

TEST(WorkersDriver, SplitOptionsHandsEachWorkerItsFields) {
  RlOptions o = options();
  o.lr.total_steps = 7;
  o.log_prob_micro_batch_size = 3;
  o.share_prompts = false;
  o.val_temperature = 0.5;
  const RlWorkerOptions w = split_options(o);
  EXPECT_EQ(w.actor.n, 2);
  EXPECT_EQ(w.actor.ppo_mini_batch_size, 2);
  EXPECT_EQ(w.actor.lr.total_steps, 7);
  EXPECT_EQ(w.actor.log_prob.micro_batch_size, 3);
  EXPECT_FALSE(w.actor.share_prompts);
  EXPECT_EQ(w.ref.micro_batch_size, 3);
  EXPECT_FALSE(w.ref.share_prompts);
  EXPECT_EQ(w.rollout.seed, 3u);
  EXPECT_EQ(w.rollout.response_length, 4);
  EXPECT_EQ(w.rollout.val_temperature, 0.5);
  EXPECT_EQ(w.rollout.engine.max_model_len, 64);
}

TEST(WorkersDriver, TrainStepEqualsTheWorkersComposedByHand) {
  RlOptions o = options();
  auto driven = rollout::testing::tiny_model(false, DType::F32, 11);
  auto rm = RewardManager::create({}).value();
  RlTrainer t(*driven, nullptr, prompts(), {}, std::make_unique<cli::LoaderSource>(4, 2, false, 1), *rm, decode, o, nullptr);
  t.set_reward_function(reward);
  const auto want = t.train_step();

  // The same step, worker by worker, on a second copy of the model.
  auto manual = rollout::testing::tiny_model(false, DType::F32, 11);
  o.lr.total_steps = o.total_steps;  // as the driver resolves it
  RlWorkerOptions w = split_options(o);
  ActorWorker actor(*manual, w.actor, o.parallel);
  RewardWorker rewards(*rm, o.parallel.world);
  rewards.set_function(reward);
  RolloutWorker rollout(actor.model(), [&] { return actor.weight_version(); }, w.rollout, o.parallel);
  cli::LoaderSource src(4, 2, false, 1);
  const std::vector<int64_t> idx = src.next_batch();
  const std::vector<RlPrompt> all = prompts();
  std::vector<std::vector<int32_t>> ids;
  for (int64_t i : idx) ids.push_back(all[size_t(i)].ids);
  RolloutBatch b = rollout.generate(ids, 0);
  ASSERT_EQ(b.weight_version, 0);
  std::vector<RewardRequest> reqs;
  for (int64_t i = 0; i < b.size(); ++i) reqs.push_back({"", decode(b.responses[size_t(i)]), "", {}});
  std::map<std::string, double> m;
  rewards.score(b, reqs, m);
  AdvantageInput in;
  in.layout = &b.layout;
  in.token_rewards = &b.token_rewards;
  in.group = &b.group;
  AdvantageOutput adv = compute_advantages(AdvEstimator::GRPO, in);
  b.advantages = std::move(adv.advantages);
  b.returns = std::move(adv.returns);
  rollout.sleep(true);
  for (const auto& [k, v] : actor.update(b, 0)) m[k] = v;
  rollout.sync();

  // Every actor metric of the driver's step, bit for bit.
  int64_t compared = 0;
  for (const auto& [k, v] : want)
    if (k.rfind("actor/", 0) == 0) {
      ASSERT_TRUE(m.count(k)) << k;
      EXPECT_EQ(m.at(k), v) << k;
      ++compared;
    }
  EXPECT_GE(compared, 5);
  EXPECT_GT(want.at("actor/grad_norm"), 0.0);
  EXPECT_EQ(t.actor_weight_version(), actor.weight_version());
  EXPECT_EQ(t.rollout_weight_version(), rollout.version());
  // The next step's rollouts agree token for token (same weights, same seeds).
  const RolloutBatch next_driven = t.generate({2, 3});
  const RolloutBatch next_manual = rollout.generate({all[2].ids, all[3].ids}, 1);
  EXPECT_EQ(next_driven.responses, next_manual.responses);
  EXPECT_EQ(next_driven.rollout_logp, next_manual.rollout_logp);
  EXPECT_EQ(next_driven.weight_version, next_manual.weight_version);
}

}  // namespace
}  // namespace kestrel::rl
