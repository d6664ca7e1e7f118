// The MoE keys of the PPO tree (config/schema_moe.cpp): refused values name the key ("not supported yet"
// for what is not built), the switches that change nothing are accepted without a notice when they
// name what Kestrel does and with one otherwise, expert parallelism's dispatcher keys act (flex
// refused), and the reference's training keys have no effect.
#include <gtest/gtest.h>

#include "config/config.h"

namespace kestrel::config {
namespace {

Result<Config> load(const Schema& s, const std::vector<std::string>& ov) {
  LoadOptions lo;
  lo.schema = &s;
  lo.overrides = ov;
  return config::load(lo);
}

Config ok(const Schema& s, const std::vector<std::string>& ov) {
  auto c = load(s, ov);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

const std::string AO = "+actor_rollout_ref.actor.megatron.override_transformer_config.",
                  AK = "actor_rollout_ref.actor.megatron.override_transformer_config.";

TEST(MoeKeys, RefusedValuesNameTheKey) {
  auto refused = [&](const std::string& ov, const std::string& want) {
    auto c = load(ppo_schema(), {ov});
    ASSERT_FALSE(c.is_ok()) << ov;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << ov << ": " << c.status().message();
  };
  refused(AO + "moe_router_load_balancing_type=sinkhorn",
          "not supported yet: " + AK + "moe_router_load_balancing_type=sinkhorn");
  refused(AO + "moe_router_dtype=fp64", "not supported yet: " + AK + "moe_router_dtype=fp64");
  refused(AO + "moe_token_dispatcher_type=flex", "not supported yet: " + AK + "moe_token_dispatcher_type=flex");
  refused(AO + "moe_token_dispatcher_type=deepep", AK + "moe_token_dispatcher_type");
  refused(AO + "moe_token_drop_policy=random", AK + "moe_token_drop_policy");
  refused(AO + "moe_aux_loss_coeff=-0.1", AK + "moe_aux_loss_coeff");
  refused(AO + "moe_expert_capacity_factor=0", AK + "moe_expert_capacity_factor");
  refused(AO + "moe_router_score_function=relu", AK + "moe_router_score_function");
  refused(AO + "recompute_modules=[moe_act]", "not supported yet: " + AK + "recompute_modules");
  refused("actor_rollout_ref.ref.router_replay.mode=R2", "not supported yet: actor_rollout_ref.ref.router_replay.mode=R2");
}

TEST(MoeKeys, SwitchesWithoutEffectAreAcceptedQuietlyWhenTheyNameWhatKestrelDoes) {
  const auto c = ok(ppo_schema(),
                    {AO + "moe_grouped_gemm=true", AO + "moe_permute_fusion=true", AO + "fused_permute_and_unpermute=true",
                     AO + "multi_head_latent_attention=true"});
  EXPECT_TRUE(c.notices().empty()) << c.notices()[0];
  // Overlaps Kestrel does not run and DeepEP (the flex dispatcher's kernels): accepted with a notice, the
  // same values computed.
  for (const char* k : {"moe_permutation_async_comm", "moe_enable_deepep", "moe_shared_expert_overlap"}) {
    const auto n = ok(ppo_schema(), {AO + k + "=true"});
    EXPECT_EQ(n.notices().size(), 1u) << k;
    EXPECT_EQ(ppo_schema().find(AK + k)->status, Support::NoEffect) << k;
  }
  // Each says why it changes nothing.
  for (const char* k : {"moe_grouped_gemm", "moe_enable_deepep", "multi_head_latent_attention"}) {
    const KeyDecl* d = ppo_schema().find(AK + k);
    ASSERT_NE(d, nullptr) << k;
    EXPECT_EQ(d->status, Support::NoEffect) << k;
    EXPECT_FALSE(d->doc.empty());
  }
  // The reference's training keys have no effect; its forward keys act.
  const std::string RK = "actor_rollout_ref.ref.megatron.override_transformer_config.";
  EXPECT_EQ(ppo_schema().find(RK + "moe_aux_loss_coeff")->status, Support::NoEffect);
  EXPECT_EQ(ppo_schema().find(RK + "moe_expert_capacity_factor")->status, Support::Supported);
  EXPECT_EQ(ppo_schema().find(AK + "moe_aux_loss_coeff")->status, Support::Supported);
  EXPECT_EQ(ppo_schema().find("critic.megatron.override_transformer_config.moe_aux_loss_coeff")->status,
            Support::Supported);
}

// Expert parallelism's dispatch (issue 15): Megatron's moe_token_dispatcher_type and MindSpeed's
// moe_hierarchical_alltoallv act (cli/options_moe.cpp reads them); the reference follows the actor.
TEST(MoeKeys, DispatcherKeysAct) {
  for (const char* k : {"moe_token_dispatcher_type", "moe_hierarchical_alltoallv"}) {
    const KeyDecl* d = ppo_schema().find(AK + k);
    ASSERT_NE(d, nullptr) << k;
    EXPECT_EQ(d->status, Support::Supported) << k;
    EXPECT_NE(d->doc.find("expert_model_parallel_size"), std::string::npos) << k << ": the doc says when it acts";
  }
  const Config def = ok(ppo_schema(), {});
  EXPECT_EQ(def.get_string(AK + "moe_token_dispatcher_type"), "allgather");  // Megatron's default
  EXPECT_FALSE(def.get_bool(AK + "moe_hierarchical_alltoallv"));
  const Config c = ok(ppo_schema(), {AO + "moe_token_dispatcher_type=alltoall", AO + "moe_hierarchical_alltoallv=true"});
  EXPECT_TRUE(c.notices().empty()) << c.notices()[0];
  const std::string RK = "actor_rollout_ref.ref.megatron.override_transformer_config.";
  EXPECT_EQ(c.get_string(RK + "moe_token_dispatcher_type"), "alltoall");
  EXPECT_TRUE(c.get_bool(RK + "moe_hierarchical_alltoallv"));
}

TEST(MoeKeys, ReferenceKeysFollowTheActors) {
  const Config c = ok(ppo_schema(), {AO + "moe_expert_capacity_factor=1.5", AO + "moe_router_dtype=fp32",
                                     "actor_rollout_ref.actor.router_replay.mode=R2"});
  const std::string RK = "actor_rollout_ref.ref.megatron.override_transformer_config.";
  EXPECT_DOUBLE_EQ(c.get_float(RK + "moe_expert_capacity_factor"), 1.5);
  EXPECT_EQ(c.get_string(RK + "moe_router_dtype"), "fp32");
  EXPECT_TRUE(c.is_null("critic.megatron.override_transformer_config.moe_expert_capacity_factor"));
  EXPECT_EQ(c.get_string("actor_rollout_ref.actor.router_replay.mode"), "R2");
  // The SFT tree has the same keys under model.override_transformer_config (Kestrel's).
  EXPECT_DOUBLE_EQ(ok(sft_schema(), {"model.override_transformer_config.moe_z_loss_coeff=0.5"})
                       .get_float("model.override_transformer_config.moe_z_loss_coeff"),
                   0.5);
}

}  // namespace
}  // namespace kestrel::config
