// The schema table itself: every key documented, defaults valid, MindSpeed
// override_transformer_config keys present, docs and defaults file complete.
#include <set>

#include "config_testing.h"

namespace kestrel::config {
namespace {

const char* const kMindSpeedKeys[] = {
    "use_flash_attn", "use_fused_rmsnorm", "use_fused_swiglu", "sequence_parallel", "use_distributed_optimizer",
    "swap_optimizer", "noop_layers", "num_layers", "recompute_method", "recompute_granularity", "recompute_num_layers",
    "context_parallel_size", "moe_permutation_async_comm", "multi_head_latent_attention",
    "fused_permute_and_unpermute", "moe_grouped_gemm", "use_ascend_mc2"};

TEST(ConfigSchema, EveryKeyHasDocAndValidDefault) {
  std::set<std::string> seen;
  for (const auto& d : schema()) {
    EXPECT_TRUE(seen.insert(d.path).second) << "declared twice: " << d.path;
    EXPECT_FALSE(d.doc.empty()) << d.path;
    EXPECT_EQ(d.doc.find('\n'), std::string::npos) << d.path << ": doc must be one line";
  }
  EXPECT_GT(schema().size(), 300u);
  auto c = testing::load_overrides({});
  ASSERT_TRUE(c.is_ok()) << c.status().message();  // every default passes its own validation
}

TEST(ConfigSchema, CoversVerlSections) {
  for (const char* p :
       {"data.train_files", "actor_rollout_ref.model.path", "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
        "actor_rollout_ref.actor.optim.min_lr_ratio", "actor_rollout_ref.actor.optim.warmup_style",
        "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size",
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size", "actor_rollout_ref.actor.checkpoint.save_contents",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.min_p",
        "actor_rollout_ref.rollout.val_kwargs.do_sample", "actor_rollout_ref.rollout.swap_space",
        "actor_rollout_ref.rollout.preemption_mode", "actor_rollout_ref.rollout.seed", "critic.cliprange_value",
        "reward_model.enable", "custom_reward_function.path", "custom_reward_function.name",
        "algorithm.kl_ctrl.target_kl", "algorithm.filter_groups.enable", "trainer.resume_mode",
        "trainer.max_actor_ckpt_to_keep", "trainer.device"})
    EXPECT_NE(find_key(p), nullptr) << p;
}

TEST(ConfigSchema, MindSpeedOverrideKeysDeclaredForEveryEngine) {
  for (const char* owner : {"actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"}) {
    for (const char* k : kMindSpeedKeys) {
      const std::string p = std::string(owner) + ".megatron.override_transformer_config." + k;
      const KeyDecl* d = find_key(p);
      ASSERT_NE(d, nullptr) << p;
      EXPECT_TRUE(d->addable) << p;
    }
  }
  // Supported: SP and the swap optimizer (on the GPU); others need features that have not landed.
  EXPECT_EQ(find_key("actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel")->status,
            Support::Supported);
  EXPECT_EQ(find_key("actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer")->status,
            Support::Supported);
  EXPECT_EQ(find_key("actor_rollout_ref.actor.megatron.override_transformer_config."
                     "account_for_embedding_in_pipeline_split")->status,
            Support::NotSupportedYet);
  // Kestrel's kernels are the fused ones: true is what it does.
  const KeyDecl* fa = find_key("actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn");
  EXPECT_EQ(fa->status, Support::NoEffect);
  EXPECT_EQ(fa->as_default, (std::vector<std::string>{"true"}));
}

TEST(ConfigSchema, StrategyNames) {
  const KeyDecl* d = find_key("actor_rollout_ref.actor.strategy");
  EXPECT_EQ(d->allowed, (std::vector<std::string>{"megatron", "fsdp", "fsdp2"}));
  for (const char* s : {"fsdp", "fsdp2", "megatron"}) {
    auto c = testing::load_overrides({std::string("actor_rollout_ref.actor.strategy=") + s});
    ASSERT_TRUE(c.is_ok()) << s;
    EXPECT_TRUE(c->notices().empty()) << s;  // all run Kestrel's one engine
    EXPECT_EQ(c->get_string("actor_rollout_ref.ref.strategy"), s);
  }
}

TEST(ConfigSchema, DocsListEveryKey) {
  const std::string text = docs();
  for (const auto& d : schema()) {
    const std::string entry = "\n" + d.path + "\n    " + type_name(d.type) + ", default " + d.default_yaml + ", " +
                              support_name(d.status) + "\n    " + d.doc +
                              "\n";
    EXPECT_NE(text.find(entry), std::string::npos) << "docs() misses " << d.path;
  }
}

TEST(ConfigSchema, DefaultsYamlListsEveryKey) {
  const std::string text = defaults_yaml();
  for (const auto& d : schema()) {
    const std::string last = d.path.substr(d.path.rfind('.') + 1);
    EXPECT_NE(text.find(" " + last + ": "), std::string::npos) << d.path;
  }
}

TEST(ConfigSchema, Suggestions) {
  EXPECT_EQ(suggest_keys("data.train_batch_sise"), (std::vector<std::string>{"data.train_batch_size"}));
  EXPECT_EQ(suggest_keys("actor_rollout_ref.actor.megatron.tensor_parallel_size"),
            (std::vector<std::string>{"actor_rollout_ref.actor.megatron.tensor_model_parallel_size"}));
  EXPECT_TRUE(suggest_keys("completely.unrelated.thing").empty());
}

// Every command tree: its defaults pass its own validation, every key is
// documented, and a view's keys are the PPO declarations it names.
TEST(ConfigSchema, EveryTreeLoadsItsDefaultsAndDocumentsEveryKey) {
  for (const Schema* s : all_schemas()) {
    LoadOptions lo;
    lo.schema = s;
    auto c = load(lo);
    ASSERT_TRUE(c.is_ok()) << s->name() << ": " << c.status().message();
    EXPECT_TRUE(c->notices().empty()) << s->name();
    const std::string text = docs(*s);
    for (const auto& d : s->keys()) {
      EXPECT_NE(text.find("\n" + d.path + "\n"), std::string::npos) << s->name() << " docs miss " << d.path;
      if (s->parent()) { EXPECT_NE(s->parent()->find(d.path), nullptr) << s->name() << ": " << d.path; }
    }
    EXPECT_EQ(find_schema(s->name()), s);
  }
  EXPECT_EQ(find_schema("sft"), &sft_schema());
  EXPECT_EQ(find_schema("nope"), nullptr);
}

}  // namespace
}  // namespace kestrel::config

namespace kestrel::config {
namespace {

// verl's renames first, then typos within the section the path names (not
// the nearest spelling anywhere in the tree).
TEST(ConfigSchema, SuggestionsFromRenamesAndTheSameSubtree) {
  EXPECT_EQ(suggest_keys("actor_rollout_ref.actor.optim.grad_clip"),
            (std::vector<std::string>{"actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"}));
  EXPECT_EQ(suggest_keys("trainer.val_generations_to_log_to_wandb"),
            (std::vector<std::string>{"trainer.log_val_generations"}));
  // A typo under actor.fsdp_config suggests the actor's fsdp_config key, not the ref's or megatron's.
  EXPECT_EQ(suggest_keys("actor_rollout_ref.actor.fsdp_config.param_ofload"),
            (std::vector<std::string>{"actor_rollout_ref.actor.fsdp_config.param_offload"}));
  EXPECT_EQ(suggest_keys("actor_rollout_ref.ref.fsdp_config.param_ofload"),
            (std::vector<std::string>{"actor_rollout_ref.ref.fsdp_config.param_offload"}));
  EXPECT_EQ(unknown_key_message("actor_rollout_ref.actor.optim.grad_clip"),
            "unknown config key 'actor_rollout_ref.actor.optim.grad_clip' (did you mean "
            "'actor_rollout_ref.actor.optim.clip_grad' or 'actor_rollout_ref.actor.grad_clip'?)");
}

}  // namespace
}  // namespace kestrel::config
