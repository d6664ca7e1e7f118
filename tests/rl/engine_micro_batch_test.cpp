// Scoring micro-batches by sequence count (RlOptions::log_prob_micro_batch_size,
// CriticOptions::forward_micro_batch_size) gives the values of the token-budget
// split, and the critic on the training engine keeps its single-process path.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/loader_source.h"
#include "rl/trainer.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

using rollout::testing::tiny_model;

// 3 prompts x 2 samples sharing their prompt, responses of 1..6 tokens.
RolloutBatch batch() {
  RolloutBatch b;
  uint64_t x = 99;
  auto next = [&x]() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(x >> 33);
  };
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(size_t(3 + next() % 4)), r(size_t(1 + next() % 6));
    for (auto& t : p) t = int32_t(next() % 128);
    for (auto& t : r) t = int32_t(next() % 128);
    if (i % 2 == 1) p = b.prompts.back();
    b.prompts.push_back(p);
    b.responses.push_back(r);
    b.group.push_back(i / 2);
  }
  b.finalize_layout();
  return b;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t t = 0; t < got.size(); ++t) EXPECT_NEAR(got[t], want[t], 1e-5 * (1 + std::abs(want[t]))) << what << " " << t;
}

TEST(EngineMicroBatches, LogProbMicroBatchSizeGivesTheTokenBudgetLogProbs) {
  const RolloutBatch base = batch();
  std::vector<double> want;
  for (int64_t count : {0, 1, 4}) {
    auto m = tiny_model(false, DType::F32, 5);
    RlOptions o;
    o.train_batch_size = 3;
    o.n = 2;
    o.ppo_mini_batch_size = 3;
    o.response_length = 6;
    o.engine.kv_cache_bytes = int64_t(8) << 20;
    o.engine.max_model_len = 64;
    o.progress = false;
    o.log_prob_micro_batch_size = count;
    o.log_prob_max_token_len = 20;  // several token-budget groups when count = 0
    std::vector<RlPrompt> prompts(3);
    for (int i = 0; i < 3; ++i) prompts[size_t(i)].ids = base.prompts[size_t(2 * i)];
    auto rm = RewardManager::create({}).value();
    RlTrainer t(*m, nullptr, prompts, {}, std::make_unique<cli::LoaderSource>(3, 3, false, 1), *rm,
                [](const std::vector<int32_t>&) { return std::string(); }, o, nullptr);
    RolloutBatch b = base;
    t.compute_log_probs(b, true, false);
    ASSERT_EQ(int64_t(b.old_logp.size()), b.layout.num_tokens());
    if (count == 0) want = b.old_logp;
    else expect_close(b.old_logp, want, "count " + std::to_string(count));
  }
  for (double v : want) EXPECT_LT(v, 0.0);
}

TEST(EngineMicroBatches, ForwardMicroBatchSizeGivesTheTokenBudgetValues) {
  const RolloutBatch b = batch();
  std::vector<double> want;
  for (int64_t count : {0, 1, 2, 5}) {
    model::ModelOptions mo;
    mo.value_head = true;
    CriticOptions co;
    co.n = 2;
    co.ppo_mini_batch_size = 3;
    co.forward_micro_batch_size = count;
    co.forward_max_token_len = 16;
    co.share_prompts = count == 2;  // the shared-prompt packing gives the same values too
    Critic c(model::CausalLM::init_random(rollout::testing::tiny_config(), mo, 3, 0.1), co);
    EXPECT_FALSE(c.engine().distributed());
    EXPECT_EQ(c.engine().optimizer_file_name(), "optimizer.safetensors");
    const std::vector<double> v = c.values(b);
    if (count == 0) want = v;
    else expect_close(v, want, "count " + std::to_string(count));
  }
  // Scored by the value model directly, in one packed group: the same numbers.
  model::ModelOptions mo;
  mo.value_head = true;
  auto m = model::CausalLM::init_random(rollout::testing::tiny_config(), mo, 3, 0.1);
  expect_close(compute_values(*m, b, 0), want, "compute_values");
}

}  // namespace
}  // namespace kestrel::rl
