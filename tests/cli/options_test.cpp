// The option builders act on the keys that used to be read by nothing, and
// every command's tree refuses what it does not know.
#include <gtest/gtest.h>

#include "cli/cli_testing.h"
#include "cli/options.h"
#include "config/config.h"

namespace kestrel::cli {
namespace {

using testing::load;
using testing::ok;

const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.";

// verl: clip_ratio_low/high fall back to clip_ratio.
TEST(TrainOptions, ClipRatioFeedsLowAndHigh) {
  auto o = rl_options(ok(config::ppo_schema(), {A + "clip_ratio=0.3"}), 1);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_low, 0.3);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_high, 0.3);
  o = rl_options(ok(config::ppo_schema(), {A + "clip_ratio=0.3", A + "clip_ratio_high=0.28"}), 1);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_low, 0.3);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_high, 0.28);
  o = rl_options(ok(config::ppo_schema(), {A + "clip_ratio=0.1", A + "clip_ratio_low=null"}), 1);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_low, 0.1);
  o = rl_options(ok(config::ppo_schema(), {}), 1);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_low, 0.2);
  EXPECT_DOUBLE_EQ(o.loss.clip_ratio_high, 0.2);
}

TEST(TrainOptions, SwapSpaceAndPreemptionReachTheEngine) {
  const auto o = rl_options(ok(config::ppo_schema(), {R + "swap_space=2", R + "preemption_mode=swap"}), 1);
  EXPECT_DOUBLE_EQ(o.engine.swap_space_gib, 2.0);
  EXPECT_EQ(o.engine.preemption_mode, "swap");
}

TEST(TrainOptions, LrDecayStepsSetTheSchedule) {
  auto o = rl_options(ok(config::ppo_schema(), {A + "optim.lr_decay_steps=7", A + "optim.lr_decay_style=linear",
                                                "trainer.total_training_steps=20"}),
                      1);
  EXPECT_EQ(o.lr.decay_steps, 7);
  EXPECT_EQ(o.lr.total_steps, 20);
  o = rl_options(ok(config::ppo_schema(), {"trainer.total_training_steps=20"}), 1);
  EXPECT_EQ(o.lr.decay_steps, 0);  // null: over total_training_steps
  const auto c = ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo", "critic.optim.lr_decay_steps=3"});
  EXPECT_EQ(critic_options(c, rl_options(c, 1)).lr.decay_steps, 3);
}

TEST(TrainOptions, RolloutAndReferenceFollowTheActor) {
  EXPECT_THROW(train_inputs(ok(config::ppo_schema(), {R + "dtype=float32", "algorithm.adv_estimator=grpo"})), Error);
  EXPECT_NO_THROW(train_inputs(ok(config::ppo_schema(), {R + "dtype=float32", A + "megatron.dtype=float32",
                                                         "algorithm.adv_estimator=grpo"})));
  // The reference copies the actor's dtype by default; a different one is refused when it is used.
  const std::vector<std::string> kl = {A + "use_kl_loss=true", "algorithm.adv_estimator=grpo"};
  EXPECT_NO_THROW(train_inputs(ok(config::ppo_schema(), kl)));
  auto bad = kl;
  bad.push_back("actor_rollout_ref.ref.megatron.dtype=float32");
  EXPECT_THROW(train_inputs(ok(config::ppo_schema(), bad)), Error);
  // The critic runs on the actor's grid.
  EXPECT_THROW(train_inputs(ok(config::ppo_schema(), {"critic.megatron.tensor_model_parallel_size=2"})), Error);
  EXPECT_EQ(train_inputs(ok(config::ppo_schema(), {"critic.megatron.dtype=float32"})).critic_dtype, DType::F32);
}

// NoEffect keys load with a notice when set to a non-default value.
TEST(ConfigNoEffect, NoticeOnlyForNonDefaultValues) {
  EXPECT_TRUE(ok(config::ppo_schema(), {}).notices().empty());
  EXPECT_TRUE(ok(config::ppo_schema(), {"data.val_batch_size=null"}).notices().empty());
  const auto c = ok(config::ppo_schema(), {"data.val_batch_size=64", A + "use_torch_compile=false"});
  ASSERT_EQ(c.notices().size(), 2u);
  EXPECT_NE(c.notices()[0].find("data.val_batch_size=64"), std::string::npos) << c.notices()[0];
  EXPECT_NE(c.notices()[0].find("no effect in Kestrel"), std::string::npos);
  EXPECT_NE(c.notices()[0].find("deprecated"), std::string::npos) << c.notices()[0];
  EXPECT_NE(config::docs().find("no effect in Kestrel"), std::string::npos);
}

TEST(CommandTrees, GenerateTakesRolloutKeysAndRefusesOthers) {
  const auto g = generate_settings(ok(config::generate_schema(), {"actor_rollout_ref.model.path=/m", R + "temperature=0.5",
                                                                  R + "min_p=0.1", R + "gpu_memory_utilization=0.3"}));
  EXPECT_DOUBLE_EQ(g.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(g.sampling.min_p, 0.1);
  EXPECT_DOUBLE_EQ(g.gpu_memory_utilization, 0.3);
  EXPECT_EQ(g.dtype, DType::F32);  // generate's own default
  auto r = load(config::generate_schema(), {"data.train_batch_size=4"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("does not apply to kestrel generate"), std::string::npos) << r.status().message();
  r = load(config::generate_schema(), {R + "temprature=0"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("did you mean '" + R + "temperature'"), std::string::npos) << r.status().message();
  r = load(config::logprobs_schema(), {"bogus.key=3"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("unknown config key 'bogus.key'"), std::string::npos);
  // min_p does not reach the trainer yet: kestrel train refuses it.
  r = load(config::ppo_schema(), {R + "min_p=0.1"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("not supported yet: " + R + "min_p=0.1", 0), 0u) << r.status().message();
}

TEST(CommandTrees, SftTreeHasItsOwnKeys) {
  const auto c = ok(config::sft_schema(), {"optim.lr=3e-3", "data.val_files=null", "data.train_files=builtin:arith"});
  const auto in = sft_inputs(c);
  EXPECT_TRUE(in.val_files.empty());
  EXPECT_EQ(in.train_files, (std::vector<std::string>{"builtin:arith"}));
  EXPECT_DOUBLE_EQ(sft_options(c, 10).lr.lr, 3e-3);
  auto r = load(config::sft_schema(), {"optim.lr_schedular=cosine"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("did you mean 'optim.lr_scheduler'"), std::string::npos) << r.status().message();
  r = load(config::sft_schema(), {"trainer.logger=[wandb]"});
  ASSERT_FALSE(r.is_ok());
  // The PPO tree's keys are not the SFT tree's.
  EXPECT_FALSE(load(config::sft_schema(), {"actor_rollout_ref.actor.optim.lr=1"}).is_ok());
  EXPECT_NE(config::docs(config::sft_schema()).find("model.partial_pretrain"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::cli
