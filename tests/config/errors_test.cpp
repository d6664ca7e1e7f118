// Exact messages for every class of bad configuration.
#include "config_testing.h"

namespace kestrel::config {
namespace {

using testing::load_error;
using testing::TempYaml;

TEST(ConfigErrors, UnknownKeySuggestsNearestFullPath) {
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.ppo_mini_batchsize=4"}),
            "unknown config key 'actor_rollout_ref.actor.ppo_mini_batchsize' "
            "(did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?)");
  EXPECT_EQ(load_error({"trainer.totl_epochs=3"}), "unknown config key 'trainer.totl_epochs' (did you mean 'trainer.total_epochs'?)");
}

TEST(ConfigErrors, UnknownKeySuggestsByLastComponent) {
  // Right name, wrong section: matched on the last component.
  EXPECT_EQ(load_error({"trainer.train_batch_size=8"}),
            "unknown config key 'trainer.train_batch_size' (did you mean 'data.train_batch_size'?)");
  EXPECT_EQ(load_error({"actor_rollout_ref.rollout.clip_ratio_hgh=0.3"}),
            "unknown config key 'actor_rollout_ref.rollout.clip_ratio_hgh' (did you mean "
            "'actor_rollout_ref.actor.clip_ratio_high'?)");
}

TEST(ConfigErrors, UnknownKeyWithoutNeighbour) {
  EXPECT_EQ(load_error({"zzz.qqq=1"}), "unknown config key 'zzz.qqq' (see 'kestrel config docs' for every key)");
}

TEST(ConfigErrors, WrongTypeFromCommandLine) {
  EXPECT_EQ(load_error({"data.train_batch_size=abc"}),
            "config key 'data.train_batch_size' expects int, got 'abc' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim.lr=fast"}),
            "config key 'actor_rollout_ref.actor.optim.lr' expects float, got 'fast' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.use_kl_loss=2"}),
            "config key 'actor_rollout_ref.actor.use_kl_loss' expects bool, got '2' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.ppo_epochs=1.5"}),
            "config key 'actor_rollout_ref.actor.ppo_epochs' expects int, got '1.5' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim.betas=[0.9,x]"}),
            "config key 'actor_rollout_ref.actor.optim.betas' expects list of float, got '[0.9, x]' (from command line)");
  EXPECT_EQ(load_error({"data.train_batch_size=null"}),
            "config key 'data.train_batch_size' expects int, got null (from command line)");
}

TEST(ConfigErrors, WrongTypeFromYamlNamesFileAndLine) {
  TempYaml f("wrong_type", "data:\n  shuffle: true\n  train_batch_size: lots\n");
  EXPECT_EQ(load_error({}, {f.path()}),
            "config key 'data.train_batch_size' expects int, got 'lots' (from " + f.path() + ":3)");
}

TEST(ConfigErrors, UnknownKeyInYamlNamesFileAndLine) {
  TempYaml f("unknown", "trainer:\n  total_epochs: 2\n  project_nam: x\n");
  EXPECT_EQ(load_error({}, {f.path()}),
            f.path() + ":3: unknown config key 'trainer.project_nam' (did you mean 'trainer.project_name'?)");
}

TEST(ConfigErrors, MissingFile) {
  EXPECT_EQ(load_error({}, {"/nonexistent/kestrel.yaml"}), "config file not found: /nonexistent/kestrel.yaml");
}

TEST(ConfigErrors, YamlSyntaxError) {
  TempYaml f("syntax", "data:\n  train_batch_size: [1, 2\n");
  const std::string msg = load_error({}, {f.path()});
  EXPECT_EQ(msg.rfind(f.path() + ":", 0), 0u) << msg;
  EXPECT_NE(msg.find("YAML parse error"), std::string::npos) << msg;
}

TEST(ConfigErrors, ValueNotInAllowedSet) {
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.loss_agg_mode=mean"}),
            "config key 'actor_rollout_ref.actor.loss_agg_mode' must be one of [token-mean, seq-mean-token-sum, "
            "seq-mean-token-mean, seq-mean-token-sum-norm], got 'mean' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.strategy=deepspeed"}),
            "config key 'actor_rollout_ref.actor.strategy' must be one of [megatron, fsdp, fsdp2], got 'deepspeed' (from "
            "command line)");
  EXPECT_EQ(load_error({"trainer.logger=[console,tensorbord]"}),
            "config key 'trainer.logger' must be one of [console, wandb, swanlab, mlflow, tensorboard, trackio, "
            "vemlp_wandb, clearml, file], got 'tensorbord' (from command line)");
}

TEST(ConfigErrors, UnsupportedValueOfSupportedKey) {
  EXPECT_EQ(load_error({"actor_rollout_ref.rollout.logprobs_mode=raw_logits"}),
            "not supported yet: actor_rollout_ref.rollout.logprobs_mode=raw_logits (from command line; supported: "
            "processed_logprobs)");
  EXPECT_EQ(load_error({"algorithm.adv_estimator=remax"}),
            "not supported yet: algorithm.adv_estimator=remax (from command line; supported: gae, grpo, rloo, "
            "reinforce_plus_plus)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.policy_loss.loss_mode=gspo"}),
            "not supported yet: actor_rollout_ref.actor.policy_loss.loss_mode=gspo (from command line; supported: vanilla)");
}

TEST(ConfigErrors, UnsupportedKeyAtNonDefault) {
  EXPECT_EQ(load_error({"reward_model.rollout.expert_parallel_size=2"}),
            "not supported yet: reward_model.rollout.expert_parallel_size=2 "
            "(from command line; only the default 1 works)");
  EXPECT_EQ(load_error({"+actor_rollout_ref.actor.megatron.override_transformer_config."
                        "account_for_embedding_in_pipeline_split=True"}),
            "not supported yet: actor_rollout_ref.actor.megatron.override_transformer_config."
            "account_for_embedding_in_pipeline_split=true (from command line; only the default false works)");
}

TEST(ConfigErrors, UnsupportedKeyAtItsDefaultLoads) {
  EXPECT_TRUE(testing::load_overrides({"actor_rollout_ref.actor.megatron.context_parallel_size=1",
                                       "data.filter_overlong_prompts=false"})
                  .is_ok());
}

TEST(ConfigErrors, AllErrorsReportedTogether) {
  EXPECT_EQ(load_error({"data.train_batch_size=x", "algorithm.adv_estimator=remax"}),
            "config key 'data.train_batch_size' expects int, got 'x' (from command line)\n"
            "not supported yet: algorithm.adv_estimator=remax (from command line; supported: gae, grpo, rloo, "
            "reinforce_plus_plus)");
}

TEST(ConfigErrors, SectionGivenAScalar) {
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim=5"}),
            "config key 'actor_rollout_ref.actor.optim' is a section, not a value; set one of its keys, e.g. "
            "'actor_rollout_ref.actor.optim.optimizer=...'");
}

TEST(ConfigErrors, GettersRejectProgrammingErrors) {
  auto c = testing::load_overrides({});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_THROW(c->get_int("data.train_batchsize"), Error);
  EXPECT_THROW(c->get_string("data.train_batch_size"), Error);  // wrong type
  EXPECT_THROW(c->get_int("data.val_batch_size"), Error);       // null
  EXPECT_EQ(c->get_int_or("data.val_batch_size", -7), -7);
}

}  // namespace
}  // namespace kestrel::config
