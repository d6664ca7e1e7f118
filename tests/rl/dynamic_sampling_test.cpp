// DAPO dynamic sampling (algorithm.filter_groups.*): which groups are kept,
// how generation batches accumulate and are cut to train_batch_size groups,
// the max_num_gen_batches bound and its message, and the loop in the trainer.
#include <gtest/gtest.h>

#include <stdexcept>

#include "cli/loader_source.h"
#include "rl/dynamic_sampling.h"
#include "rl/trainer.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

// groups.size() groups; response j of group g has length 1 + j and token values 10 * g + j.
RolloutBatch batch_of(const std::vector<int64_t>& group, const std::vector<double>& scores) {
  RolloutBatch b;
  for (size_t i = 0; i < group.size(); ++i) {
    b.prompts.push_back({int32_t(100 + group[i])});
    b.responses.push_back(std::vector<int32_t>(i % 3 + 1, int32_t(10 * group[i] + int64_t(i))));
    b.group.push_back(group[i]);
  }
  b.scores = scores;
  b.finalize_layout();
  for (int64_t i = 0; i < b.size(); ++i)
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) b.token_rewards.push_back(double(i) + 0.5);
  return b;
}

TEST(DynamicSampling, KeepsGroupsWithSpreadOrOneResponse) {
  // np.std over each group: {1, 0} > 0 kept, {1, 1} and {0, 0} dropped, a group of one kept.
  EXPECT_EQ(groups_with_spread({0, 0, 1, 1, 2, 2, 3}, {1, 0, 1, 1, 0, 0, 5}), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(groups_with_spread({4, 4, 4, 7, 7, 7}, {-1, -1, 1, 0.5, 0.5, 0.5}), (std::vector<int64_t>{4}));
  EXPECT_TRUE(groups_with_spread({0, 0}, {2, 2}).empty());
}

TEST(DynamicSampling, SelectRenumbersGroupsAndCarriesTokenArrays) {
  const RolloutBatch b = batch_of({0, 0, 1, 1, 2, 2}, {1, 0, 1, 1, 0, 1});
  const RolloutBatch s = select_groups(b, {0, 2}, 5);
  ASSERT_EQ(s.size(), 4);
  EXPECT_EQ(s.group, (std::vector<int64_t>{5, 5, 6, 6}));
  EXPECT_EQ(s.scores, (std::vector<double>{1, 0, 0, 1}));
  EXPECT_EQ(s.responses[2], b.responses[4]);
  // Token rewards of responses 0, 1, 4, 5 (lengths 1, 2, 2, 3).
  EXPECT_EQ(s.token_rewards, (std::vector<double>{0.5, 1.5, 1.5, 4.5, 4.5, 5.5, 5.5, 5.5}));
  EXPECT_EQ(s.layout.num_tokens(), 8);
}

TEST(DynamicSampling, AccumulatesUntilTrainBatchSizeGroupsThenCuts) {
  FilterGroupsOptions o{true, "acc", 0};
  DynamicSampler ds(o, /*train_batch_size=*/3);
  // Batch 1: only group 1 varies.
  auto r = ds.add(batch_of({0, 0, 1, 1, 2, 2}, {}), {1, 1, 0, 1, 0, 0});
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(ds.num_prompt_in_batch(), 1);
  // Batch 2: all three vary -> 4 kept, cut to 3.
  RolloutBatch b2 = batch_of({0, 0, 1, 1, 2, 2}, {});
  for (auto& resp : b2.responses) resp[0] += 1000;
  r = ds.add(b2, {0, 1, 1, 0, 0, 1});
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(*r);
  EXPECT_EQ(ds.num_gen_batches(), 2);
  EXPECT_EQ(ds.num_prompt_in_batch(), 4);
  const RolloutBatch out = ds.take();
  ASSERT_EQ(out.size(), 6);
  EXPECT_EQ(out.group, (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(out.responses[0][0], 12);    // batch 1, group 1, response 2
  EXPECT_EQ(out.responses[2][0], 1000);  // batch 2, group 0
  EXPECT_EQ(out.responses[5][0], 1013);  // batch 2, group 1; its group 2 is cut
  EXPECT_EQ(out.layout.num_tokens(), int64_t(out.token_rewards.size()));
}

TEST(DynamicSampling, StopsAtMaxNumGenBatchesWithVerlsMessage) {
  FilterGroupsOptions o{true, "acc", 2};
  DynamicSampler ds(o, 2);
  const RolloutBatch flat = batch_of({0, 0, 1, 1}, {});
  auto r = ds.add(flat, {1, 1, 0, 0});
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(*r);
  r = ds.add(flat, {1, 1, 0, 0});
  ASSERT_FALSE(r.is_ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("num_gen_batches=2 >= max_num_gen_batches=2. Generated too many. Please check if your data are "
                     "too difficult. You could also try set max_num_gen_batches=0 to enable endless trials."),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("algorithm.filter_groups.max_num_gen_batches"), std::string::npos) << msg;
  // max_num_gen_batches <= 0: no bound.
  DynamicSampler endless(FilterGroupsOptions{true, "acc", 0}, 2);
  for (int i = 0; i < 50; ++i) {
    auto e = endless.add(flat, {1, 1, 0, 0});
    ASSERT_TRUE(e.is_ok());
    ASSERT_FALSE(*e);
  }
}

TEST(DynamicSampling, MetricValues) {
  RolloutBatch b = batch_of({0, 0}, {0.25, -1});
  std::vector<nlohmann::ordered_json> extra = {{{"acc", true}, {"score", 0.25}}, {{"acc", false}, {"score", -1.0}}};
  EXPECT_EQ(filter_metric_values("acc", b, extra).value(), (std::vector<double>{1, 0}));
  EXPECT_EQ(filter_metric_values("score", b, extra).value(), (std::vector<double>{0.25, -1}));
  EXPECT_EQ(filter_metric_values("seq_reward", b, extra).value(), (std::vector<double>{0.25, -1}));
  // seq_final_reward: token rewards summed (0.5 on 1 token, 1.5 on 2).
  EXPECT_EQ(filter_metric_values("seq_final_reward", b, extra).value(), (std::vector<double>{0.5, 3.0}));
  auto missing = filter_metric_values("overlong", b, extra);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("algorithm.filter_groups.metric=overlong: response 0 has no such "
                                            "reward_extra_info key (it has: acc, score)"),
            std::string::npos)
      << missing.status().message();
  extra[0]["pred"] = "42";
  extra[1]["pred"] = "41";
  EXPECT_FALSE(filter_metric_values("pred", b, extra).is_ok());
}

// A trainer on the tiny model whose reward is constant for prompts with
// ground truth "same" and alternates 0, 1, 0, ... for the others.
struct FilterRun {
  std::unique_ptr<model::CausalLM> m = rollout::testing::tiny_model(false, DType::F32, 11);
  std::unique_ptr<RewardManager> rm = RewardManager::create({}).value();
  std::unique_ptr<RlTrainer> t;
  int counter = 0;
  explicit FilterRun(RlOptions o, std::vector<std::string> truths) {
    std::vector<RlPrompt> prompts(truths.size());
    for (size_t i = 0; i < truths.size(); ++i) {
      for (int j = 0; j < 4 + int(i); ++j) prompts[i].ids.push_back(int32_t((i * 37 + size_t(j) * 11) % 128));
      prompts[i].ground_truth = truths[i];
    }
    t = std::make_unique<RlTrainer>(*m, nullptr, prompts, std::vector<RlPrompt>{},
                                    std::make_unique<cli::LoaderSource>(int64_t(truths.size()), 2, false, 1), *rm,
                                    [](const std::vector<int32_t>& ids) { return std::string(ids.size(), 'a'); }, o,
                                    nullptr);
    t->set_reward_function(
        [this](const RewardRequest& r) { return r.ground_truth == "same" ? 1.0 : double(counter++ % 2); });
  }
};

RlOptions filter_options() {
  RlOptions o;
  o.train_batch_size = 2;
  o.gen_batch_size = 2;
  o.n = 4;
  o.response_length = 4;
  o.rollout_seed = 3;
  o.engine.kv_cache_bytes = int64_t(8) << 20;
  o.engine.max_model_len = 64;
  o.ppo_mini_batch_size = 2;
  o.lr.lr = 1e-3;
  o.total_steps = 1;
  o.val_before_train = false;
  o.progress = false;
  o.filter_groups = {true, "seq_reward", 0};
  return o;
}

TEST(DynamicSampling, TrainerGeneratesUntilEnoughGroupsVary) {
  FilterRun run(filter_options(), {"same", "vary", "same", "vary"});
  const auto m = run.t->train_step();
  EXPECT_EQ(m.at("train/num_gen_batches"), 2.0);
  // Only the two "vary" groups are trained on: 8 responses scoring 0, 1, 0, 1, ...
  EXPECT_DOUBLE_EQ(m.at("critic/score/mean"), 0.5);
  EXPECT_EQ(run.counter, 8);
}

TEST(DynamicSampling, TrainerStopsAtTheBoundWithTheKeysInTheMessage) {
  RlOptions o = filter_options();
  o.filter_groups.max_num_gen_batches = 1;
  FilterRun run(o, {"same", "vary", "same", "vary"});
  try {
    run.t->train_step();
    FAIL() << "expected the max_num_gen_batches error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Generated too many"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("algorithm.filter_groups.max_num_gen_batches"), std::string::npos);
  }
}

TEST(DynamicSampling, TrainerEndsWhenTheEpochsRunOut) {
  RlOptions o = filter_options();
  o.total_steps = 5;
  o.total_epochs = 1;
  FilterRun run(o, {"same", "same", "same", "vary"});  // one group with spread per epoch: never enough
  ASSERT_TRUE(run.t->fit().is_ok());
  EXPECT_EQ(run.t->global_step(), 0);
}

}  // namespace
}  // namespace kestrel::rl
