// The MoE keys reach model::MoeTrainOptions of the actor, the reference, the
// critic, SFT and scoring; the routing keys are checked against config.json
// and the expert bias against the model; router replay R3 needs the
// rollout's record; every refusal names the key. (The key table's own
// refusals and statuses: tests/config/moe_keys_test.cpp.)
#include <gtest/gtest.h>

#include "cli/cli_testing.h"
#include "cli/options.h"
#include "config/config.h"
#include "train/builtin_model.h"

namespace kestrel::cli {
namespace {

using testing::load;
using testing::ok;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.",
                  AO = "+actor_rollout_ref.actor.megatron.override_transformer_config.",
                  AK = "actor_rollout_ref.actor.megatron.override_transformer_config.";

io::ModelConfig builtin(const std::string& name) { return train::builtin_model_config(name, 512, 1).value(); }

TEST(MoeOptions, ActorKeysReachTheTrainOptions) {
  const auto c = ok(config::ppo_schema(),
                    {"algorithm.adv_estimator=grpo", AO + "moe_router_load_balancing_type=seq_aux_loss",
                     AO + "moe_aux_loss_coeff=0.01", AO + "moe_z_loss_coeff=0.001",
                     AO + "moe_expert_capacity_factor=1.25", AO + "moe_pad_expert_input_to_capacity=true",
                     AO + "moe_token_drop_policy=position", AO + "moe_router_enable_expert_bias=true",
                     AO + "moe_router_dtype=fp32",
                     "+actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=true"});
  const TrainInputs in = train_inputs(c);
  const model::MoeTrainOptions o = moe_train_options(in.actor_moe, builtin("tiny-deepseek-v3"), "m");
  EXPECT_EQ(o.load_balancing_type, "seq_aux_loss");
  EXPECT_DOUBLE_EQ(o.aux_loss_coeff, 0.01);
  EXPECT_DOUBLE_EQ(o.z_loss_coeff, 0.001);
  EXPECT_DOUBLE_EQ(o.capacity_factor, 1.25);
  EXPECT_TRUE(o.pad_to_capacity);
  EXPECT_EQ(o.drop_policy, ops::MoeDropPolicy::Position);
  EXPECT_DOUBLE_EQ(o.bias_update_rate, 1e-3);  // Megatron's default rate once enabled
  EXPECT_TRUE(o.router_logits_fp32);
  EXPECT_TRUE(o.freeze_router);
  // The reference follows the actor's forward keys and takes none of the training ones.
  const model::MoeTrainOptions r = moe_train_options(in.ref_moe, builtin("tiny-deepseek-v3"), "m");
  EXPECT_DOUBLE_EQ(r.capacity_factor, 1.25);
  EXPECT_TRUE(r.router_logits_fp32);
  EXPECT_EQ(r.aux_loss_coeff, 0.0);
  EXPECT_EQ(r.bias_update_rate, 0.0);
  EXPECT_FALSE(r.freeze_router);
  // The critic has its own.
  const model::MoeTrainOptions cr = moe_train_options(in.critic_moe, builtin("tiny-qwen3-moe"), "m");
  EXPECT_EQ(cr.aux_loss_coeff, 0.0);
  EXPECT_EQ(cr.capacity_factor, 0.0);
}

TEST(MoeOptions, DefaultsAreMegatronsDropless) {
  const TrainInputs in = train_inputs(ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo"}));
  const model::MoeTrainOptions o = moe_train_options(in.actor_moe, builtin("tiny-qwen3-moe"), "m");
  EXPECT_EQ(o.load_balancing_type, "aux_loss");
  EXPECT_EQ(o.aux_loss_coeff, 0.0);
  EXPECT_EQ(o.z_loss_coeff, 0.0);
  EXPECT_EQ(o.capacity_factor, 0.0);
  EXPECT_EQ(o.bias_update_rate, 0.0);
  EXPECT_FALSE(o.router_logits_fp32);
  EXPECT_FALSE(o.freeze_router);
  EXPECT_EQ(o.dispatcher, model::MoeDispatcher::AllGather);  // Megatron's moe_token_dispatcher_type
  EXPECT_FALSE(o.hierarchical_alltoallv);
  // A dense model takes them too (nothing to act on).
  EXPECT_NO_THROW(moe_train_options(in.actor_moe, builtin("tiny"), "m"));
}

TEST(MoeOptions, RoutingKeysMustEqualConfigJson) {
  const std::vector<std::string> same = {
      AO + "num_moe_experts=8",          AO + "moe_router_topk=2",       AO + "moe_router_score_function=sigmoid",
      AO + "moe_router_num_groups=4",    AO + "moe_router_group_topk=2", AO + "moe_router_topk_scaling_factor=2.5",
      AO + "moe_ffn_hidden_size=96",     AO + "moe_shared_expert_intermediate_size=96",
      AO + "moe_router_pre_softmax=true"};  // a sigmoid router ignores it
  std::vector<std::string> ov = same;
  ov.push_back("algorithm.adv_estimator=grpo");
  const TrainInputs in = train_inputs(ok(config::ppo_schema(), ov));
  EXPECT_EQ(in.actor_moe.routing.size(), same.size());
  EXPECT_NO_THROW(moe_train_options(in.actor_moe, builtin("tiny-deepseek-v3"), "m"));
  // Qwen3-MoE: softmax, no groups, no shared experts.
  const std::string e = error_of([&] { moe_train_options(in.actor_moe, builtin("tiny-qwen3-moe"), "/models/q"); });
  EXPECT_NE(e.find(AK + "moe_router_score_function=sigmoid"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json's scoring_func gives softmax"), std::string::npos) << e;
  EXPECT_NE(e.find("/models/q"), std::string::npos) << e;

  auto refused = [&](const std::string& ov1, const std::string& model, const std::string& want) {
    const TrainInputs i = train_inputs(ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo", ov1}));
    const std::string msg = error_of([&] { moe_train_options(i.actor_moe, builtin(model), "m"); });
    EXPECT_NE(msg.find(want), std::string::npos) << ov1 << ": " << msg;
  };
  refused(AO + "moe_router_topk=4", "tiny-qwen3-moe", "config.json's num_experts_per_tok gives 2");
  refused(AO + "num_moe_experts=16", "tiny-deepseek-v3", "config.json's n_routed_experts gives 8");
  refused(AO + "moe_router_num_groups=2", "tiny-qwen3-moe", "its config.json has no n_group");
  refused(AO + "moe_router_topk_scaling_factor=2", "tiny-deepseek-v3", "routed_scaling_factor gives 2.5");
  refused(AO + "moe_router_pre_softmax=true", "tiny-qwen3-moe", "norm_topk_prob gives false");
  refused(AO + "moe_ffn_hidden_size=64", "tiny", "its config.json has no moe_intermediate_size");
}

TEST(MoeOptions, ExpertBiasNeedsACorrectionBias) {
  const TrainInputs in = train_inputs(ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo",
                                                               AO + "moe_router_enable_expert_bias=true",
                                                               AO + "moe_router_bias_update_rate=0.01"}));
  EXPECT_DOUBLE_EQ(moe_train_options(in.actor_moe, builtin("tiny-deepseek-v3"), "m").bias_update_rate, 0.01);
  const std::string e = error_of([&] { moe_train_options(in.actor_moe, builtin("tiny-qwen3-moe"), "/models/q"); });
  EXPECT_NE(e.find(AK + "moe_router_enable_expert_bias=true"), std::string::npos) << e;
  EXPECT_NE(e.find("Qwen3MoeForCausalLM model /models/q has none"), std::string::npos) << e;
  // Disabled: the rate is not used.
  const TrainInputs off = train_inputs(
      ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo", AO + "moe_router_bias_update_rate=0.01"}));
  EXPECT_EQ(moe_train_options(off.actor_moe, builtin("tiny-qwen3-moe"), "m").bias_update_rate, 0.0);
}

// moe_token_dispatcher_type and moe_hierarchical_alltoallv reach the actor and the reference (both
// forwards move rows under EP); the hierarchical exchange with the allgather dispatcher is refused
// naming both keys and the fix.
TEST(MoeOptions, DispatcherKeysReachTheOptions) {
  const TrainInputs in = train_inputs(ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo",
                                                                AO + "moe_token_dispatcher_type=alltoall",
                                                                AO + "moe_hierarchical_alltoallv=true"}));
  for (const MoeKeys* k : {&in.actor_moe, &in.ref_moe}) {
    const model::MoeTrainOptions o = moe_train_options(*k, builtin("tiny-qwen3-moe"), "m");
    EXPECT_EQ(o.dispatcher, model::MoeDispatcher::AllToAll) << k->prefix;
    EXPECT_TRUE(o.hierarchical_alltoallv) << k->prefix;
  }
  const std::string e = error_of([&] {
    train_inputs(ok(config::ppo_schema(), {"algorithm.adv_estimator=grpo", AO + "moe_hierarchical_alltoallv=true"}));
  });
  EXPECT_NE(e.find(AK + "moe_hierarchical_alltoallv=true"), std::string::npos) << e;
  EXPECT_NE(e.find(AK + "moe_token_dispatcher_type=alltoall"), std::string::npos) << e;
}

TEST(MoeOptions, PaddingNeedsACapacity) {
  const std::string e = error_of(
      [&] { train_inputs(ok(config::ppo_schema(), {AO + "moe_pad_expert_input_to_capacity=true"})); });
  EXPECT_NE(e.find(AK + "moe_pad_expert_input_to_capacity=true"), std::string::npos) << e;
  EXPECT_NE(e.find(AK + "moe_expert_capacity_factor"), std::string::npos) << e;
}

TEST(MoeOptions, RouterReplayR3NeedsTheRolloutsRecord) {
  for (const std::string& key : {A + "router_replay.mode", std::string("actor_rollout_ref.ref.router_replay.mode")}) {
    const std::string e = error_of([&] { rl_options(ok(config::ppo_schema(), {key + "=R3"}), 1); });
    EXPECT_NE(e.find(key + "=R3"), std::string::npos) << e;
    EXPECT_NE(e.find(R + "enable_rollout_routing_replay=true"), std::string::npos) << e;
  }
  const auto o = rl_options(ok(config::ppo_schema(), {A + "router_replay.mode=R3", "actor_rollout_ref.ref.router_replay.mode=R3",
                                                      R + "enable_rollout_routing_replay=true"}),
                            1);
  EXPECT_EQ(o.actor_router_replay, rl::RouterReplay::R3);
  EXPECT_EQ(o.ref_router_replay, rl::RouterReplay::R3);
  EXPECT_TRUE(o.engine.record_routing);
  const auto r2 = rl_options(ok(config::ppo_schema(), {A + "router_replay.mode=R2"}), 1);
  EXPECT_EQ(r2.actor_router_replay, rl::RouterReplay::R2);
  EXPECT_FALSE(r2.engine.record_routing);
  const rl::RlWorkerOptions w = rl::split_options(o);
  EXPECT_EQ(w.actor.router_replay, rl::RouterReplay::R3);
  EXPECT_EQ(w.actor.log_prob.router_replay, rl::RouterReplay::R3);
  EXPECT_EQ(w.ref.router_replay, rl::RouterReplay::R3);
  EXPECT_EQ(rl::split_options(r2).actor.log_prob.router_replay, rl::RouterReplay::Disabled);  // R2 records there
}

TEST(MoeOptions, SftLogprobsAndGenerateTakeTheirKeys) {
  const SftInputs s = sft_inputs(ok(config::sft_schema(), {"model.override_transformer_config.moe_aux_loss_coeff=0.02",
                                                           "model.override_config.moe_config.freeze_moe_router=true"}));
  const model::MoeTrainOptions so = moe_train_options(s.moe, builtin("tiny-qwen3-moe"), "m");
  EXPECT_DOUBLE_EQ(so.aux_loss_coeff, 0.02);
  EXPECT_TRUE(so.freeze_router);
  const LogprobsSettings l = logprobs_settings(ok(config::logprobs_schema(),
                                                  {"actor_rollout_ref.model.path=/m", AK + "moe_expert_capacity_factor=2",
                                                   AK + "moe_router_dtype=fp32"}));
  const model::MoeTrainOptions lo = moe_train_options(l.moe, builtin("tiny-qwen3-moe"), "m");
  EXPECT_DOUBLE_EQ(lo.capacity_factor, 2.0);
  EXPECT_TRUE(lo.router_logits_fp32);
  const GenerateSettings g =
      generate_settings(ok(config::generate_schema(), {"actor_rollout_ref.model.path=/m", AK + "moe_router_dtype=fp32"}));
  EXPECT_TRUE(g.router_logits_fp32);
}

}  // namespace
}  // namespace kestrel::cli
