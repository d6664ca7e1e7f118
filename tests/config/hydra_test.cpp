// Hydra as verl scripts use it: verl's tree names without a file, YAML
// `defaults:` lists composed like Hydra (groups, @package, ../group, _self_,
// hydra.searchpath naming verl's package), sections given as copies, "???".
#include <filesystem>
#include <fstream>

#include "config_testing.h"

namespace kestrel::config {
namespace {

namespace fs = std::filesystem;

// A folder of YAML files under the test temp dir, removed with the object.
class ConfigDir {
 public:
  explicit ConfigDir(const std::string& name) : dir_(fs::path(::testing::TempDir()) / ("kestrel_hydra_" + name)) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ConfigDir() { fs::remove_all(dir_); }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

Result<Config> load_args(const std::vector<std::string>& args) {
  auto o = options_from_args(args);
  if (!o) return o.status();
  return load(*o);
}

TEST(HydraCompose, VerlTreeNamesWithoutAFileAreTheBuiltInTree) {
  for (const std::string name : {"ppo_megatron_trainer", "ppo_megatron_trainer.yaml", "'ppo_trainer'", "ppo_trainer"}) {
    const std::string bare = name[0] == '\'' ? name.substr(1, name.size() - 2) : name;
    auto c = load_args({"--config-path=config", "--config-name=" + bare, "algorithm.adv_estimator=grpo"});
    ASSERT_TRUE(c.is_ok()) << name << ": " << c.status().message();
    EXPECT_TRUE(c->notices().empty()) << name << ": " << c->notices().front();
    const bool fsdp = bare.rfind("ppo_trainer", 0) == 0;
    EXPECT_EQ(c->get_string("actor_rollout_ref.actor.strategy"), fsdp ? "fsdp" : "megatron") << name;
    EXPECT_EQ(c->get_string("actor_rollout_ref.ref.strategy"), fsdp ? "fsdp" : "megatron") << name;
    EXPECT_EQ(c->get_string("critic.optim.optimizer"), fsdp ? "AdamW" : "adam") << name;
  }
  // Any other missing name is still a missing file.
  auto bad = load_args({"--config-path=config", "--config-name=my_trainer"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "config file not found: config/my_trainer.yaml");
}

// The DAPO recipe's main_dapo lines pass --config-path=config --config-name=dapo_trainer
// from the recipe folder; without it, the recipe's trees are built in.
TEST(HydraCompose, DapoRecipeTreeNamesWithoutAFileAreBuiltIn) {
  struct Case {
    const char* name;
    const char* strategy;
    const char* manager_key;
    const char* project;
  };
  for (const Case& k : {Case{"dapo_trainer", "fsdp", "reward.reward_manager.name", "verl-dapo"},
                        Case{"dapo_megatron_trainer.yaml", "megatron", "reward.reward_manager.name", "verl-dapo"},
                        Case{"dapo_transfer_queue_trainer", "megatron", "reward_model.reward_manager",
                             "verl-dapo-transferqueue"}}) {
    auto c = load_args({"--config-path=config", std::string("--config-name=") + k.name, "data.train_batch_size=32"});
    ASSERT_TRUE(c.is_ok()) << k.name << ": " << c.status().message();
    EXPECT_EQ(c->get_string("actor_rollout_ref.actor.strategy"), k.strategy) << k.name;
    EXPECT_EQ(c->get_string(k.manager_key), "dapo") << k.name;
    EXPECT_EQ(c->get_string("trainer.project_name"), k.project) << k.name;
    EXPECT_EQ(c->get_int("data.gen_batch_size"), 32) << k.name;  // ${data.train_batch_size}, as in the recipe
  }
}

// The recipe's run scripts add the DAPO manager's kwargs under reward_model.reward_kwargs with '+'.
TEST(HydraCompose, OlderRewardKwargsLayoutIsAccepted) {
  auto c = load_args({"reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                      "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512",
                      "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                      "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
                      "+reward_model.reward_kwargs.max_resp_len=2048"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_TRUE(c->get_bool("reward_model.reward_kwargs.overlong_buffer_cfg.enable"));
  EXPECT_EQ(c->get_int("reward_model.reward_kwargs.max_resp_len"), 2048);
}

// verl's own layout: verl/trainer/config/ppo_trainer.yaml with per-component groups.
TEST(HydraCompose, DefaultsListOfGroupsPackagesAndSelf) {
  ConfigDir d("verl_layout");
  d.write("ppo_trainer.yaml",
          "defaults:\n"
          "  - actor@actor_rollout_ref.actor: dp_actor\n"
          "  - data@data: legacy_data\n"
          "  - reward_manager@reward_manager\n"
          "  - _self_\n"
          "actor_rollout_ref:\n  actor:\n    ppo_epochs: 3\n"
          "trainer:\n  project_name: from_primary\n");
  d.write("actor/dp_actor.yaml",
          "defaults:\n  - ../optim@optim: fsdp\n  - ../engine@fsdp_config: fsdp\n  - actor\n  - _self_\n"
          "_target_: verl.workers.config.FSDPActorConfig\nstrategy: fsdp\ngrad_clip: 0.5\nppo_epochs: 2\n");
  d.write("actor/actor.yaml", "ppo_epochs: 1\nclip_ratio: 0.3\nppo_mini_batch_size: 64\n");
  d.write("optim/fsdp.yaml", "_target_: x\noptimizer: AdamW\nlr: 1e-3\nlr_scheduler_type: cosine\n");
  d.write("engine/fsdp.yaml", "param_offload: false\nfsdp_size: -1\nwrap_policy:\n  min_num_params: 0\n");
  d.write("data/legacy_data.yaml", "max_prompt_length: 333\n");
  d.write("reward_manager.yaml", "source: register\nname: ${oc.select:reward_model.reward_manager,naive}\n");
  auto c = load_args({"--config-path=" + d.path(), "--config-name=ppo_trainer"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  const std::string A = "actor_rollout_ref.actor.";
  EXPECT_EQ(c->get_int(A + "ppo_epochs"), 3);            // primary's _self_ last
  EXPECT_DOUBLE_EQ(c->get_float(A + "clip_ratio"), 0.3);  // actor.yaml, below dp_actor's _self_
  EXPECT_EQ(c->get_int(A + "ppo_mini_batch_size"), 64);
  EXPECT_DOUBLE_EQ(c->get_float(A + "grad_clip"), 0.5);
  EXPECT_EQ(c->get_string(A + "strategy"), "fsdp");
  EXPECT_DOUBLE_EQ(c->get_float(A + "optim.lr"), 1e-3);  // ../optim@optim -> actor's optim
  EXPECT_EQ(c->get_string(A + "optim.lr_scheduler_type"), "cosine");
  EXPECT_EQ(c->get_int(A + "fsdp_config.fsdp_size"), -1);
  EXPECT_EQ(c->get_int("data.max_prompt_length"), 333);
  EXPECT_EQ(c->get_string("reward_manager.name"), "naive");
  EXPECT_EQ(c->get_string("trainer.project_name"), "from_primary");
  EXPECT_EQ(c->origin(A + "grad_clip"), d.path() + "/actor/dp_actor.yaml:8");
  // Command-line overrides still win.
  auto o = load_args({"--config-path=" + d.path(), "--config-name=ppo_trainer", A + "ppo_epochs=5"});
  ASSERT_TRUE(o.is_ok());
  EXPECT_EQ(o->get_int(A + "ppo_epochs"), 5);
}

// The DAPO recipe's dapo_trainer.yaml extends verl's ppo_trainer found on the search path.
TEST(HydraCompose, RecipeExtendsTheBuiltInTreeThroughTheSearchPath) {
  for (const std::string sp : {"pkg://verl/trainer/config", "file://verl/trainer/config"}) {
    ConfigDir d("recipe");
    d.write("dapo_like.yaml", "hydra:\n  searchpath:\n    - " + sp +
                                  "\ndefaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  project_name: verl-dapo\n"
                                  "algorithm:\n  adv_estimator: grpo\n");
    auto c = load_args({"--config-path=" + d.path(), "--config-name=dapo_like", "data.train_batch_size=8"});
    ASSERT_TRUE(c.is_ok()) << sp << ": " << c.status().message();
    EXPECT_EQ(c->get_string("trainer.project_name"), "verl-dapo");
    EXPECT_EQ(c->get_string("actor_rollout_ref.actor.strategy"), "fsdp");  // verl's FSDP tree underneath
    EXPECT_EQ(c->get_int("data.train_batch_size"), 8);
  }
  ConfigDir d("recipe_missing");
  d.write("r.yaml", "defaults:\n  - base_trainer\n  - _self_\n");
  auto bad = load_args({"--config-path=" + d.path(), "--config-name=r"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("Hydra defaults entry 'base_trainer': no base_trainer.yaml"), std::string::npos)
      << bad.status().message();
}

// verl's yaml writes some sections as copies of others and leaves some values "???".
TEST(HydraCompose, SectionCopiesAndMissingValues) {
  testing::TempYaml y("copies",
             "actor_rollout_ref:\n"
             "  actor:\n    megatron:\n      override_transformer_config:\n        make_vocab_size_divisible_by: 64\n"
             "  ref:\n    megatron:\n      override_transformer_config: "
             "${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}\n"
             "  rollout:\n    name: ???\n    mtp: ${oc.select:actor_rollout_ref.model.mtp, null}\n"
             "reward_model:\n  megatron:\n    override_transformer_config: "
             "${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}\n"
             "global_profiler:\n  global_tool_config:\n    torch_memory:\n      trace_alloc_max_entries: 100_000\n");
  auto c = testing::load_overrides({}, {y.path()});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_int("actor_rollout_ref.ref.megatron.override_transformer_config.make_vocab_size_divisible_by"), 64);
  EXPECT_EQ(c->get_string("actor_rollout_ref.rollout.name"), "kestrel");
  EXPECT_FALSE(c->get_bool("actor_rollout_ref.rollout.mtp.enable"));
  EXPECT_EQ(c->get_int("global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries"), 100000);
}

// `+key=value` into open sections: declared keys act, others are not supported yet.
TEST(HydraCompose, AddedKeysOfOpenSections) {
  auto c = testing::load_overrides({"+actor_rollout_ref.model.override_config.attention_dropout=0.",
                                    "+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=True"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_TRUE(c->notices().empty());  // dropout 0 and fused attention are what Kestrel does
  EXPECT_EQ(testing::load_error({"+actor_rollout_ref.model.override_config.attention_dropout=0.1"}),
            "not supported yet: actor_rollout_ref.model.override_config.attention_dropout=0.1 (from command line; "
            "only the default 0.0 works)");
  EXPECT_EQ(testing::load_error({"+actor_rollout_ref.model.override_config.max_position_embeddings=32768"}),
            "not supported yet: actor_rollout_ref.model.override_config.max_position_embeddings=32768 (Kestrel acts on "
            "the keys of actor_rollout_ref.model.override_config that 'kestrel config docs' lists; this one it does "
            "not know)");
}

}  // namespace
}  // namespace kestrel::config
