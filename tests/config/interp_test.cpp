// ${path}, ${.relative}, ${oc.select:path,default}, embedded strings, cycles.
#include "config_testing.h"

namespace kestrel::config {
namespace {

using testing::load_error;
using testing::load_overrides;
using testing::TempYaml;

TEST(ConfigInterp, DefaultsFollowOtherKeys) {
  auto c = load_overrides({"data.max_prompt_length=1000", "actor_rollout_ref.rollout.n=5",
                           "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                           "actor_rollout_ref.actor.checkpoint.save_contents=[model]"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_int("actor_rollout_ref.rollout.prompt_length"), 1000);    // ${oc.select:data.max_prompt_length,512}
  EXPECT_EQ(c->get_int("actor_rollout_ref.actor.rollout_n"), 5);            // ${actor_rollout_ref.rollout.n}
  EXPECT_EQ(c->get_int("actor_rollout_ref.ref.megatron.tensor_model_parallel_size"), 4);  // follows the actor
  EXPECT_EQ(c->get_string_list("actor_rollout_ref.actor.checkpoint.load_contents"),
            (std::vector<std::string>{"model"}));  // ${.save_contents}
  EXPECT_EQ(c->get_int("critic.forward_max_token_len_per_gpu"), 32768);     // ${.ppo_max_token_len_per_gpu}
}

TEST(ConfigInterp, EmbeddedInString) {
  auto c = load_overrides({"trainer.project_name=proj", "trainer.experiment_name=run1"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_string("trainer.default_local_dir"), "checkpoints/proj/run1");
  auto d = load_overrides({"trainer.default_local_dir=${trainer.project_name}/ckpt-${data.train_batch_size}"});
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d->get_string("trainer.default_local_dir"), "verl_examples/ckpt-1024");
}

TEST(ConfigInterp, TypedWhenWholeString) {
  auto c = load_overrides({"data.val_batch_size=${data.train_batch_size}", "trainer.test_freq=${trainer.save_freq}",
                           "trainer.save_freq=7"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_int("data.val_batch_size"), 1024);
  EXPECT_EQ(c->get_int("trainer.test_freq"), 7);  // resolved after merging, so the later override counts
}

TEST(ConfigInterp, SelectDefault) {
  // An unset free-form entry falls back to the default; a set one is used.
  auto c = load_overrides({"data.val_batch_size=${oc.select:actor_rollout_ref.rollout.engine_kwargs.vllm.x,64}",
                           "trainer.experiment_name=${oc.select:trainer.project_name,zzz}"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_int("data.val_batch_size"), 64);
  EXPECT_EQ(c->get_string("trainer.experiment_name"), "verl_examples");
  auto n = load_overrides({"data.seed=${oc.select:actor_rollout_ref.rollout.engine_kwargs.vllm.x,${trainer.nnodes}}"});
  ASSERT_TRUE(n.is_ok()) << n.status().message();
  EXPECT_EQ(n->get_int("data.seed"), 1);  // nested default
}

TEST(ConfigInterp, InYamlFile) {
  TempYaml f("interp", "trainer:\n  project_name: p\n  experiment_name: \"${trainer.project_name}-e\"\n");
  auto c = load_overrides({}, {f.path()});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_string("trainer.experiment_name"), "p-e");
  EXPECT_EQ(c->get_string("trainer.default_local_dir"), "checkpoints/p/p-e");
}

TEST(ConfigInterp, UnknownPath) {
  EXPECT_EQ(load_error({"trainer.default_local_dir=${trainer.projct_name}/x"}),
            "bad interpolation '${trainer.projct_name}/x' in config key 'trainer.default_local_dir' (from command line): "
            "unknown config key 'trainer.projct_name' (did you mean 'trainer.project_name'?)");
  EXPECT_EQ(load_error({"trainer.project_name=${oc.env:HOME}"}),
            "bad interpolation '${oc.env:HOME}' in config key 'trainer.project_name' (from command line): "
            "unknown resolver 'oc.env' (supported: oc.select)");
  EXPECT_EQ(load_error({"trainer.project_name=${trainer.experiment_name"}),
            "bad interpolation '${trainer.experiment_name' in config key 'trainer.project_name' (from command line): "
            "missing '}'");
}

TEST(ConfigInterp, Cycle) {
  EXPECT_EQ(load_error({"trainer.project_name=${trainer.experiment_name}", "trainer.experiment_name=${trainer.project_name}"}),
            "interpolation cycle: trainer.project_name -> trainer.experiment_name -> trainer.project_name");
  EXPECT_EQ(load_error({"trainer.project_name=a${trainer.project_name}"}),
            "interpolation cycle: trainer.project_name -> trainer.project_name");
}

TEST(ConfigInterp, TypeCheckedAfterResolution) {
  EXPECT_EQ(load_error({"data.train_batch_size=${trainer.project_name}"}),
            "config key 'data.train_batch_size' expects int, got 'verl_examples' (from default)");
}

TEST(ConfigInterp, EscapedDollarIsLiteral) {
  auto c = load_overrides({"trainer.project_name=cost\\${x}"});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->get_string("trainer.project_name"), "cost${x}");
}

}  // namespace
}  // namespace kestrel::config
