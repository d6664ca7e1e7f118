// The RL workers on their own (rl/workers/): the rollout's versioned weight
// view follows the actor in place and is stale as a copy until refreshed,
// and the rollout worker tags its batches with the version its view holds.
#include <gtest/gtest.h>

#include <cmath>

#include "rl/advantages.h"
#include "rl/workers/actor_worker.h"
#include "rl/workers/log_probs.h"
#include "rl/workers/rollout_worker.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

// Prompts longer than a KV block, so the prefix cache keeps their KV.
std::vector<std::vector<int32_t>> test_prompts() {
  std::vector<std::vector<int32_t>> p(2);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 37 + i; ++j) p[size_t(i)].push_back(int32_t((i * 37 + j * 11) % 128));
  return p;
}

RolloutOptions rollout_options() {
  RolloutOptions r;
  r.n = 2;
  r.response_length = 4;
  r.seed = 5;
  r.engine.kv_cache_bytes = int64_t(8) << 20;
  r.engine.max_model_len = 64;
  return r;
}

ActorOptions actor_options() {
  ActorOptions a;
  a.n = 2;
  a.response_length = 4;
  a.ppo_mini_batch_size = 2;
  a.lr.lr = 5e-2;
  a.lr.total_steps = 4;
  return a;
}

// GRPO advantages from a score that prefers longer responses (some spread
// in a group, so the update moves the weights).
void add_advantages(RolloutBatch& b) {
  b.scores.clear();
  b.token_rewards.assign(size_t(b.layout.num_tokens()), 0.0);
  for (int64_t i = 0; i < b.size(); ++i) {
    b.scores.push_back(double(b.responses[size_t(i)].size()) + 0.25 * double(i % 2));
    if (b.layout.length(i) > 0) b.token_rewards[size_t(b.layout.end(i) - 1)] = b.scores.back();
  }
  AdvantageInput in;
  in.layout = &b.layout;
  in.token_rewards = &b.token_rewards;
  in.group = &b.group;
  AdvantageOutput out = compute_advantages(AdvEstimator::GRPO, in);
  b.advantages = std::move(out.advantages);
  b.returns = std::move(out.returns);
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) d = std::max(d, std::abs(a[k] - b[k]));
  return d;
}

TEST(WorkersRolloutView, InPlaceFollowsTheActorAndACopyIsStaleUntilRefreshed) {
  auto m = rollout::testing::tiny_model(false, DType::F32, 11);
  RlParallel par;
  ActorWorker actor(*m, actor_options(), par);
  auto version = [&] { return actor.weight_version(); };
  RolloutWorker rollout(actor.model(), version, rollout_options(), par);
  ASSERT_TRUE(rollout.view().in_place());
  rollout::RolloutWeightsOptions copy_opts;
  copy_opts.dtype = DType::BF16;  // another storage dtype: always a copy
  RolloutWeightView copy(actor.model(), copy_opts, version);
  ASSERT_FALSE(copy.in_place());
  EXPECT_EQ(copy.version(), 0);
  EXPECT_FALSE(copy.stale());

  RolloutBatch b = rollout.generate(test_prompts(), 0);
  EXPECT_EQ(b.weight_version, 0);
  add_advantages(b);
  LogProbOptions lp;
  std::vector<double> copy_before, actor_before;
  score_log_probs(copy.model(), b, lp, *par.dp, copy_before);
  score_log_probs(actor.model(), b, lp, *par.dp, actor_before);
  EXPECT_LT(max_abs_diff(copy_before, actor_before), 0.05);  // bf16 rounding only

  // The engine stays awake (its prefix cache holds KV of version 0).
  const auto metrics = actor.update(b, 0);
  ASSERT_EQ(metrics.at("actor/step_skipped"), 0.0);
  ASSERT_EQ(actor.weight_version(), 1);
  // In place the view holds the actor's weights: its version follows at once.
  EXPECT_EQ(rollout.version(), 1);
  EXPECT_FALSE(rollout.view().stale());
  // The copy still holds version 0, and its log-probs are the old policy's.
  EXPECT_EQ(copy.version(), 0);
  EXPECT_TRUE(copy.stale());
  std::vector<double> copy_stale, actor_after;
  score_log_probs(copy.model(), b, lp, *par.dp, copy_stale);
  score_log_probs(actor.model(), b, lp, *par.dp, actor_after);
  EXPECT_EQ(copy_stale, copy_before);
  const double moved = max_abs_diff(actor_after, actor_before);
  ASSERT_GT(moved, 0.2);  // the update moved the policy well past bf16 rounding

  const rollout::ReshardStats& rs = copy.refresh();
  EXPECT_GT(rs.bytes_copied, 0);
  EXPECT_EQ(copy.version(), 1);
  EXPECT_FALSE(copy.stale());
  std::vector<double> copy_after;
  score_log_probs(copy.model(), b, lp, *par.dp, copy_after);
  EXPECT_LT(max_abs_diff(copy_after, actor_after), 0.05);

  // The rollout generates with (and tags) the version its view holds: in
  // place the new weights even before the sync, with no KV cached from the
  // old ones (the same tokens as after the sync).
  const RolloutBatch unsynced = rollout.generate(test_prompts(), 1);
  EXPECT_EQ(unsynced.weight_version, 1);
  rollout.sync();
  const RolloutBatch synced = rollout.generate(test_prompts(), 1);
  EXPECT_EQ(synced.weight_version, 1);
  EXPECT_EQ(synced.responses, unsynced.responses);
  EXPECT_EQ(synced.rollout_logp, unsynced.rollout_logp);
}

TEST(WorkersRolloutView, ACopyRolloutTagsItsBatchesWithTheVersionItHolds) {
  auto m = rollout::testing::tiny_model(false, DType::F32, 11);
  RlParallel par;
  ActorWorker actor(*m, actor_options(), par);
  RolloutOptions ro = rollout_options();
  ro.weights_dtype = DType::BF16;  // the rollout reads a bf16 copy
  RolloutWorker rollout(actor.model(), [&] { return actor.weight_version(); }, ro, par);
  ASSERT_FALSE(rollout.view().in_place());
  RolloutBatch b = rollout.generate(test_prompts(), 0);
  EXPECT_EQ(b.weight_version, 0);
  add_advantages(b);
  rollout.sleep(true);  // the copy is released while the actor trains
  actor.update(b, 0);
  ASSERT_EQ(actor.weight_version(), 1);
  EXPECT_TRUE(rollout.view().stale());
  EXPECT_EQ(rollout.version(), 0);
  EXPECT_THROW(rollout.generate(test_prompts(), 1), std::exception);  // released: sync first
  const rollout::ReshardStats& rs = rollout.sync();
  EXPECT_GT(rs.bytes_copied, 0);
  EXPECT_EQ(rollout.version(), 1);
  EXPECT_EQ(rollout.generate(test_prompts(), 1).weight_version, 1);
}

}  // namespace
}  // namespace kestrel::rl
