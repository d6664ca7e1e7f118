// Hydra override syntax: =, +, ++, ~, YAML scalars, quoting and lists.
#include "config_testing.h"

namespace kestrel::config {
namespace {

using testing::load_error;
using testing::load_overrides;

Config must_load(const std::vector<std::string>& overrides) {
  auto r = load_overrides(overrides);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : Config{};
}

TEST(ConfigOverrides, DefaultsAreVerls) {
  Config c = must_load({});
  EXPECT_EQ(c.get_int("data.train_batch_size"), 1024);
  EXPECT_EQ(c.get_int("actor_rollout_ref.actor.ppo_mini_batch_size"), 256);
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.optim.lr"), 1e-6);
  EXPECT_DOUBLE_EQ(c.get_float("critic.optim.lr"), 1e-5);
  EXPECT_EQ(c.get_float_list("actor_rollout_ref.actor.optim.betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.get_string("actor_rollout_ref.actor.kl_loss_type"), "low_var_kl");
  EXPECT_EQ(c.get_string("algorithm.adv_estimator"), "gae");
  EXPECT_EQ(c.get_int("trainer.total_epochs"), 30);
  EXPECT_TRUE(c.is_null("trainer.total_training_steps"));
  EXPECT_TRUE(c.get_bool("actor_rollout_ref.actor.megatron.sequence_parallel"));
  EXPECT_EQ(c.get_string_list("actor_rollout_ref.actor.checkpoint.save_contents"),
            (std::vector<std::string>{"model", "optimizer", "extra"}));
  EXPECT_EQ(c.origin("data.train_batch_size"), "default");
}

TEST(ConfigOverrides, ScalarsParseAsYaml) {
  Config c = must_load({"actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.use_kl_loss=True",
                        "data.val_batch_size=null", "actor_rollout_ref.actor.entropy_coeff=0",
                        "trainer.experiment_name=123", "trainer.project_name='true'", "data.max_prompt_length=2048",
                        "actor_rollout_ref.rollout.temperature=.7"});
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.optim.lr"), 1e-6);
  EXPECT_TRUE(c.get_bool("actor_rollout_ref.actor.use_kl_loss"));
  EXPECT_TRUE(c.is_null("data.val_batch_size"));
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.entropy_coeff"), 0.0);  // int into a float key
  EXPECT_EQ(c.get_string("trainer.experiment_name"), "123");                    // int text into a string key
  EXPECT_EQ(c.get_string("trainer.project_name"), "true");                       // quoted: a string
  EXPECT_EQ(c.get_int("data.max_prompt_length"), 2048);
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.rollout.temperature"), 0.7);
  EXPECT_EQ(c.origin("data.max_prompt_length"), "command line");
}

TEST(ConfigOverrides, QuotedStringsKeepTheirText) {
  Config c = must_load({"trainer.experiment_name=\"a b: c\"", "trainer.project_name='x,y'", "data.prompt_key="});
  EXPECT_EQ(c.get_string("trainer.experiment_name"), "a b: c");
  EXPECT_EQ(c.get_string("trainer.project_name"), "x,y");
  EXPECT_EQ(c.get_string("data.prompt_key"), "");  // Hydra: key= is the empty string
}

TEST(ConfigOverrides, Lists) {
  Config c = must_load({"actor_rollout_ref.actor.optim.betas=[0.8,0.95]", "trainer.logger=['console']",
                        "data.train_files=[\"a.parquet\", 'b.parquet']", "data.val_files=c.parquet"});
  EXPECT_EQ(c.get_float_list("actor_rollout_ref.actor.optim.betas"), (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(c.get_string_list("trainer.logger"), (std::vector<std::string>{"console"}));
  EXPECT_EQ(c.get_string_list("data.train_files"), (std::vector<std::string>{"a.parquet", "b.parquet"}));
  EXPECT_EQ(c.get_string_list("data.val_files"), (std::vector<std::string>{"c.parquet"}));  // one path = one-element list
}

TEST(ConfigOverrides, LaterOverrideWins) {
  Config c = must_load({"data.train_batch_size=8", "data.train_batch_size=16"});
  EXPECT_EQ(c.get_int("data.train_batch_size"), 16);
}

TEST(ConfigOverrides, PlusAddsToFreeFormMaps) {
  // The add and the later set both land in the map; the map itself is not
  // supported yet, so the message shows the merged content.
  auto r = load_overrides({"+actor_rollout_ref.model.override_config.model_config.rope_theta=1000000",
                           "actor_rollout_ref.model.override_config.model_config.rope_theta=500000"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "not supported yet: actor_rollout_ref.model.override_config.model_config={rope_theta: 500000} "
            "(from command line; only the default {} works)");
}

// Hydra refuses `+` of an existing key and a map entry set without `+`; verl
// scripts written for an older tree do both, so Kestrel takes them with a notice.
TEST(ConfigOverrides, PlusLeniencyAndErrors) {
  auto c = load_overrides({"+data.train_batch_size=4"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_int("data.train_batch_size"), 4);
  ASSERT_EQ(c->notices().size(), 1u);
  EXPECT_NE(c->notices()[0].find("adds a key that exists (Hydra refuses this)"), std::string::npos) << c->notices()[0];
  auto m = load_overrides({"actor_rollout_ref.rollout.engine_kwargs.vllm.a=1", "+actor_rollout_ref.rollout.engine_kwargs.vllm.a=2"});
  ASSERT_TRUE(m.is_ok()) << m.status().message();  // engine_kwargs have no effect in Kestrel: a third notice
  EXPECT_EQ(m->get_map("actor_rollout_ref.rollout.engine_kwargs.vllm")["a"], 2);
  ASSERT_EQ(m->notices().size(), 3u);
  EXPECT_NE(m->notices()[0].find("Kestrel adds it"), std::string::npos) << m->notices()[0];
  // A near miss of a declared key of an open section is a typo.
  EXPECT_EQ(load_error({"+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_atn=True"}),
            "unknown config key 'actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_atn' "
            "(did you mean 'actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn'?)");
  // Any other added key of an open section: Kestrel does not act on it.
  EXPECT_EQ(load_error({"+actor_rollout_ref.actor.megatron.override_transformer_config.apply_residual_connection_post_layernorm=True"}),
            "not supported yet: actor_rollout_ref.actor.megatron.override_transformer_config.apply_residual_connection_post_layernorm=true "
            "(Kestrel acts on the keys of actor_rollout_ref.actor.megatron.override_transformer_config that 'kestrel "
            "config docs' lists; this one it does not know)");
  // Added elsewhere (verl recipes add keys their own code reads): nothing would read it.
  EXPECT_EQ(load_error({"+data.min_response_length=4096"}),
            "not supported yet: data.min_response_length=4096 (added with '+'; Kestrel has no such key, so nothing "
            "would read it; did you mean 'data.max_response_length'?)");
  // Without '+' an unknown key stays a mistake.
  EXPECT_EQ(load_error({"data.min_response_length=4096"}),
            "unknown config key 'data.min_response_length' (did you mean 'data.max_response_length'?)");
}

TEST(ConfigOverrides, MindSpeedKeysAddable) {
  // verl's MindSpeed guide adds these with '+'; the supported ones load.
  Config c = must_load({"+actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel=False",
                        "+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=False"});
  EXPECT_FALSE(c.get_bool("actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel"));
  // The ref follows the actor's override_transformer_config unless set itself.
  EXPECT_FALSE(c.get_bool("actor_rollout_ref.ref.megatron.override_transformer_config.sequence_parallel"));
  EXPECT_TRUE(c.get_bool("critic.megatron.override_transformer_config.sequence_parallel"));
}

TEST(ConfigOverrides, DoublePlusAddsOrOverrides) {
  Config c = must_load({"++data.train_batch_size=4", "++trainer.project_name=p"});
  EXPECT_EQ(c.get_int("data.train_batch_size"), 4);
  EXPECT_EQ(c.get_string("trainer.project_name"), "p");
  auto r = load_overrides({"++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.a=1"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("not supported yet: actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={a: 1}", 0), 0u)
      << r.status().message();
}

TEST(ConfigOverrides, TildeDeletes) {
  // A declared key cannot vanish: deleting restores its default.
  Config c = must_load({"data.train_batch_size=4", "~data.train_batch_size"});
  EXPECT_EQ(c.get_int("data.train_batch_size"), 1024);
  // Entries of free-form maps are removed.
  Config m = must_load({"+actor_rollout_ref.rollout.engine_kwargs.vllm.a=1", "~actor_rollout_ref.rollout.engine_kwargs.vllm.a"});
  EXPECT_TRUE(m.get_map("actor_rollout_ref.rollout.engine_kwargs.vllm").empty());
  EXPECT_EQ(load_error({"~actor_rollout_ref.rollout.engine_kwargs.vllm.b"}),
            "cannot delete config key 'actor_rollout_ref.rollout.engine_kwargs.vllm.b': it is not set");
}

TEST(ConfigOverrides, SectionTakesAMap) {
  Config c = must_load({"actor_rollout_ref.actor.optim={lr: 3e-6, weight_decay: 0.1}"});
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.optim.lr"), 3e-6);
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.optim.weight_decay"), 0.1);
  EXPECT_DOUBLE_EQ(c.get_float("actor_rollout_ref.actor.optim.clip_grad"), 1.0);  // untouched
}

TEST(ConfigOverrides, BadSyntax) {
  EXPECT_EQ(load_error({"data.train_batch_size"}),
            "bad override 'data.train_batch_size': expected key=value, +key=value, ++key=value or ~key");
  EXPECT_EQ(load_error({"=5"}), "bad override '=5': expected key=value, +key=value, ++key=value or ~key");
  EXPECT_EQ(load_error({"trainer.logger=[console"}).rfind("cannot parse value '[console' (command line)", 0), 0u);
}

TEST(ConfigOverrides, OptionsFromArgs) {
  auto o = options_from_args({"--config-path=cfgdir", "--config-name", "ppo", "--config", "extra.yaml", "a.b=1", "+c=2"});
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_EQ(o->config_files, (std::vector<std::string>{"cfgdir/ppo.yaml", "extra.yaml"}));
  EXPECT_EQ(o->overrides, (std::vector<std::string>{"a.b=1", "+c=2"}));
  auto bad = options_from_args({"--verbose"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(),
            "unknown option '--verbose' (config options: --config FILE, --config-path DIR, --config-name NAME)");
  std::vector<std::string> rest;
  auto ok = options_from_args({"--verbose", "-cn", "x.yml"}, &rest);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(rest, (std::vector<std::string>{"--verbose"}));
  EXPECT_EQ(ok->config_files, (std::vector<std::string>{"configs/x.yml"}));
}

}  // namespace
}  // namespace kestrel::config
