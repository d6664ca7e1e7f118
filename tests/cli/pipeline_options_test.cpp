// Pipeline-parallel keys -> TrainInputs::{actor,critic}_pipeline (parallel::PipelineSpec) and
// {actor,critic}_num_layers: what the config alone decides (ranges, vpp needs pp >= 2, distinct noop ids, the
// reference equal to the actor, the critic on the actor's grid), check_layout_divides (tp x pp divides the
// world) and check_num_layers (Megatron's total = num_hidden_layers + |noop_layers|), each error naming the key
// and where its value came from.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "config/config.h"

namespace kestrel::cli {
namespace {

const std::string M = "actor_rollout_ref.actor.megatron.", OT = M + "override_transformer_config.",
                  RM = "actor_rollout_ref.ref.megatron.", CM = "critic.megatron.";

Result<config::Config> load(std::vector<std::string> ov) {
  config::LoadOptions lo;
  lo.overrides = std::move(ov);
  return config::load(lo);
}

// GRPO (no critic) unless the overrides say otherwise.
config::Config ok(std::vector<std::string> ov) {
  ov.insert(ov.begin(), "algorithm.adv_estimator=grpo");
  auto c = load(ov);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

// The message of what `f` throws ("" when it does not throw).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty());
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(PipelineOptions, DefaultsAreNoPipeline) {
  const TrainInputs in = train_inputs(ok({}));
  for (const parallel::PipelineSpec* p : {&in.actor_pipeline, &in.critic_pipeline}) {
    EXPECT_EQ(p->pp, 1);
    EXPECT_EQ(p->vpp, 1);
    EXPECT_EQ(p->first_stage_layers, -1);
    EXPECT_EQ(p->last_stage_layers, -1);
    EXPECT_TRUE(p->noop_layers.empty());
    EXPECT_EQ(p->microbatch_group_size, 0);
  }
  EXPECT_EQ(in.actor_num_layers, -1);
  EXPECT_EQ(in.critic_num_layers, -1);
}

TEST(PipelineOptions, EveryLayoutKeyReachesTheSpec) {
  const TrainInputs in = train_inputs(ok({M + "pipeline_model_parallel_size=4", M + "virtual_pipeline_model_parallel_size=2",
                                          "+" + OT + "num_layers_in_first_pipeline_stage=6",
                                          "+" + OT + "num_layers_in_last_pipeline_stage=8", "+" + OT + "noop_layers=[0,29]",
                                          "+" + OT + "microbatch_group_size_per_vp_stage=3", "+" + OT + "num_layers=30"}));
  const parallel::PipelineSpec& p = in.actor_pipeline;
  EXPECT_EQ(p.pp, 4);
  EXPECT_EQ(p.vpp, 2);
  EXPECT_EQ(p.first_stage_layers, 6);
  EXPECT_EQ(p.last_stage_layers, 8);
  EXPECT_EQ(p.noop_layers, (std::vector<int64_t>{0, 29}));
  EXPECT_EQ(p.microbatch_group_size, 3);
  EXPECT_EQ(in.actor_num_layers, 30);
  // Without the + too (the keys are declared), and a single id is a one-element list.
  const TrainInputs one = train_inputs(ok({OT + "noop_layers=5", M + "virtual_pipeline_model_parallel_size=1"}));
  EXPECT_EQ(one.actor_pipeline.noop_layers, (std::vector<int64_t>{5}));
  EXPECT_EQ(one.actor_pipeline.vpp, 1);
  EXPECT_EQ(train_inputs(ok({M + "virtual_pipeline_model_parallel_size=null"})).actor_pipeline.vpp, 1);
}

TEST(PipelineOptions, RangesAreCheckedWhereDeclared) {
  for (const std::string& bad : {M + "pipeline_model_parallel_size=0", M + "virtual_pipeline_model_parallel_size=0",
                                 CM + "pipeline_model_parallel_size=-1", OT + "num_layers_in_first_pipeline_stage=0",
                                 OT + "num_layers_in_last_pipeline_stage=-2", OT + "num_layers=0",
                                 OT + "microbatch_group_size_per_vp_stage=0"}) {
    auto c = load({bad});
    ASSERT_FALSE(c.is_ok()) << bad;
    expect_has(c.status().message(), {bad.substr(0, bad.find('=')), "command line"});
  }
  auto c = load({OT + "noop_layers=[3,-1]"});
  ASSERT_FALSE(c.is_ok());
  expect_has(c.status().message(), {OT + "noop_layers", "element 1", "-1", "command line"});
}

TEST(PipelineOptions, NoopLayersTakeAListOfIntsOnly) {
  // MindSpeed's "0,127" string form: the key takes a list ([0,127]); anything else names the key.
  for (const char* v : {"'0,127'", "abc", "[0,x]", "1.5"}) {
    auto c = load({OT + "noop_layers=" + std::string(v)});
    ASSERT_FALSE(c.is_ok()) << v;
    expect_has(c.status().message(), {OT + "noop_layers", "expects list of int", "command line"});
  }
  const std::string m = thrown([] { train_inputs(ok({OT + "noop_layers=[4,2,4]"})); });
  expect_has(m, {OT + "noop_layers", "[4, 2, 4]", "4 twice", "command line"});
}

TEST(PipelineOptions, InterleavingNeedsTwoStages) {
  const std::string m = thrown([] { train_inputs(ok({M + "virtual_pipeline_model_parallel_size=2"})); });
  expect_has(m, {M + "virtual_pipeline_model_parallel_size=2", M + "pipeline_model_parallel_size >= 2", "command line",
                 "(it is 1, from default)"});
  EXPECT_NO_THROW(train_inputs(ok({M + "virtual_pipeline_model_parallel_size=2", M + "pipeline_model_parallel_size=2"})));
}

TEST(PipelineOptions, TheReferenceFollowsTheActorAndMustEqualIt) {
  const std::string kl = "actor_rollout_ref.actor.use_kl_loss=true";
  // Unset ref keys follow the actor's (verl's oc.select defaults).
  EXPECT_NO_THROW(train_inputs(ok({kl, M + "pipeline_model_parallel_size=2", M + "virtual_pipeline_model_parallel_size=2",
                                   OT + "noop_layers=[0]", OT + "num_layers_in_first_pipeline_stage=3"})));
  EXPECT_NO_THROW(train_inputs(ok({kl, M + "pipeline_model_parallel_size=2", RM + "pipeline_model_parallel_size=2"})));
  struct Case {
    std::vector<std::string> ov;
    std::string key;
  };
  const std::vector<Case> cases = {
      {{M + "pipeline_model_parallel_size=2", RM + "pipeline_model_parallel_size=4"}, RM + "pipeline_model_parallel_size=4"},
      {{M + "pipeline_model_parallel_size=2", RM + "virtual_pipeline_model_parallel_size=2"},
       RM + "virtual_pipeline_model_parallel_size=2"},
      {{RM + "override_transformer_config.noop_layers=[1]"}, RM + "override_transformer_config.noop_layers=[1]"},
      {{RM + "override_transformer_config.num_layers_in_last_pipeline_stage=2"},
       RM + "override_transformer_config.num_layers_in_last_pipeline_stage=2"},
      {{OT + "num_layers=30", RM + "override_transformer_config.num_layers=31"},
       RM + "override_transformer_config.num_layers=31"},
  };
  for (const auto& cs : cases) {
    std::vector<std::string> ov = cs.ov;
    ov.push_back(kl);
    expect_has(thrown([&] { train_inputs(ok(ov)); }), {"not supported yet: " + cs.key, "(from command line)",
                                                       "actor_rollout_ref.actor.megatron.", "the actor's copy"});
    // Without a reference model (no KL loss or KL reward) the ref's keys are not used.
    EXPECT_NO_THROW(train_inputs(ok(cs.ov))) << cs.key;
  }
}

TEST(PipelineOptions, TheCriticRunsOnTheActorsGrid) {
  const std::string gae = "algorithm.adv_estimator=gae";
  const TrainInputs in = train_inputs(ok({gae, M + "pipeline_model_parallel_size=2", CM + "pipeline_model_parallel_size=2",
                                          CM + "virtual_pipeline_model_parallel_size=2",
                                          CM + "override_transformer_config.noop_layers=[7]"}));
  EXPECT_TRUE(in.critic);
  EXPECT_EQ(in.critic_pipeline.pp, 2);
  EXPECT_EQ(in.critic_pipeline.vpp, 2);  // its own split over the same grid
  EXPECT_EQ(in.critic_pipeline.noop_layers, (std::vector<int64_t>{7}));
  // Unset, the critic's grid sizes follow the actor's (verl's default 1 would refuse every actor layout but 1 x 1).
  const TrainInputs follows = train_inputs(ok({gae, M + "pipeline_model_parallel_size=2", M + "tensor_model_parallel_size=2"}));
  EXPECT_EQ(follows.critic_pipeline.pp, 2);
  EXPECT_EQ(follows.critic_pipeline.vpp, 1);
  expect_has(thrown([&] { train_inputs(ok({gae, M + "pipeline_model_parallel_size=2", CM + "pipeline_model_parallel_size=1"})); }),
             {"not supported yet: " + CM + "pipeline_model_parallel_size=1", "(from command line)", "actor's 2"});
  expect_has(thrown([&] {
               train_inputs(ok({gae, M + "pipeline_model_parallel_size=2", CM + "pipeline_model_parallel_size=2",
                                CM + "override_transformer_config.noop_layers=[1,1]"}));
             }),
             {CM + "override_transformer_config.noop_layers", "1 twice"});
}

TEST(PipelineOptions, TheRolloutDoesNotPipeline) {
  auto c = load({"actor_rollout_ref.rollout.pipeline_model_parallel_size=2"});
  ASSERT_FALSE(c.is_ok());
  expect_has(c.status().message(), {"not supported yet: actor_rollout_ref.rollout.pipeline_model_parallel_size=2"});
  const config::KeyDecl* d = config::find_key("actor_rollout_ref.rollout.pipeline_model_parallel_size");
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d->doc.find("pipelined decode"), std::string::npos) << d->doc;
  for (const char* k : {"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"}) {
    auto r = load({"+" + OT + k + "=true"});
    ASSERT_FALSE(r.is_ok()) << k;
    expect_has(r.status().message(), {"not supported yet: " + OT + k + "=true"});
  }
}

TEST(PipelineOptions, TpTimesPpDividesTheWorld) {
  const config::Config c = ok({M + "tensor_model_parallel_size=2", M + "pipeline_model_parallel_size=2",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2"});
  const TrainInputs in = train_inputs(c);
  EXPECT_NO_THROW(check_layout_divides(c, in, 4));
  EXPECT_NO_THROW(check_layout_divides(c, in, 8));
  expect_has(thrown([&] { check_layout_divides(c, in, 6); }),
             {M + "tensor_model_parallel_size=2 (from command line)", M + "pipeline_model_parallel_size=2 (from command line)",
              "= 4", "(6)", "mpirun -np <a multiple of 4>"});
  expect_has(thrown([&] { check_layout_divides(c, in, 2); }), {"mpirun -np <a multiple of 4>"});
  // Sizes far beyond the world (no overflow in tp x pp).
  const config::Config big = ok({M + "tensor_model_parallel_size=4611686018427387904", M + "pipeline_model_parallel_size=4",
                                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1"});
  expect_has(thrown([&] { check_layout_divides(big, train_inputs(big), 8); }), {M + "tensor_model_parallel_size"});
  auto huge = load({M + "pipeline_model_parallel_size=4294967297"});
  ASSERT_FALSE(huge.is_ok());
  expect_has(huge.status().message(), {M + "pipeline_model_parallel_size", "65536"});
  // The rollout's tp alone, as before.
  const config::Config r = ok({"actor_rollout_ref.rollout.tensor_model_parallel_size=4"});
  expect_has(thrown([&] { check_layout_divides(r, train_inputs(r), 2); }),
             {"actor_rollout_ref.rollout.tensor_model_parallel_size=4", "mpirun -np <a multiple of 4>"});
  // The critic's grid.
  const config::Config g = ok({"algorithm.adv_estimator=gae", M + "pipeline_model_parallel_size=3",
                               CM + "pipeline_model_parallel_size=3", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"});
  EXPECT_NO_THROW(check_layout_divides(g, train_inputs(g), 3));
  expect_has(thrown([&] { check_layout_divides(g, train_inputs(g), 4); }), {M + "pipeline_model_parallel_size=3"});
}

// Until the engine runs the pipeline, kestrel train (check_launch) refuses pp > 1 instead of training without it.
TEST(PipelineOptions, TrainLaunchesPp) {  // the engine runs the pipeline (train/pipeline.h)
  EXPECT_NO_THROW(check_launch(ok({}), 2));
  EXPECT_NO_THROW(check_launch(ok({M + "pipeline_model_parallel_size=2"}), 2));
}

TEST(PipelineOptions, NumLayersIsMegatronsTotal) {
  const config::Config c = ok({OT + "noop_layers=[0,29]", OT + "num_layers=30"});
  const TrainInputs in = train_inputs(c);
  EXPECT_NO_THROW(check_num_layers(c, in, 28));
  expect_has(thrown([&] { check_num_layers(c, in, 27); }),
             {OT + "num_layers=30", "num_hidden_layers (27, config.json)", OT + "noop_layers (2)", "= 29",
              "command line"});
  const config::Config unset = ok({OT + "noop_layers=[0,29]"});
  EXPECT_NO_THROW(check_num_layers(unset, train_inputs(unset), 5));  // null: nothing to compare
  const config::Config g = ok({"algorithm.adv_estimator=gae", CM + "override_transformer_config.num_layers=12"});
  expect_has(thrown([&] { check_num_layers(g, train_inputs(g), 28); }), {CM + "override_transformer_config.num_layers=12"});
}

// A verl example script's launcher line (tests/verl_compat/lines.jsonl), loaded as `kestrel config show` does.
config::Config verl_script(const std::string& script) {
  std::ifstream f(std::string(KESTREL_SOURCE_DIR) + "/tests/verl_compat/lines.jsonl");
  EXPECT_TRUE(f.good());
  std::vector<std::string> args;
  for (std::string line; std::getline(f, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.value("script", "") == script) args = row["args"].get<std::vector<std::string>>();
  }
  EXPECT_FALSE(args.empty()) << script;
  auto lo = config::options_from_args(args);
  EXPECT_TRUE(lo.is_ok()) << lo.status().message();
  auto c = config::load(lo.value());
  EXPECT_TRUE(c.is_ok()) << script << ": " << c.status().message();
  return std::move(c).value();
}

// verl's examples/grpo_trainer/run_qwen2-7b_math_megatron.sh (tp 2 x pp 2 for the actor and the reference, 8
// processes): its launcher line reads into TrainInputs with the pipeline on and fits 8 processes.
TEST(PipelineOptions, VerlQwen2_7bMegatronScriptReadsItsPipeline) {
  const config::Config c = verl_script("verl:examples/grpo_trainer/run_qwen2-7b_math_megatron.sh");
  const TrainInputs in = train_inputs(c);
  EXPECT_EQ(in.tp, 2);
  EXPECT_EQ(in.actor_pipeline.pp, 2);
  EXPECT_EQ(in.actor_pipeline.vpp, 1);
  EXPECT_FALSE(in.critic);
  EXPECT_NO_THROW(check_layout_divides(c, in, 8));
  expect_has(thrown([&] { check_layout_divides(c, in, 6); }), {"mpirun -np <a multiple of 4>"});
  EXPECT_NO_THROW(check_num_layers(c, in, 28));  // Qwen2-7B: 28 layers
}

// verl's PPO example (examples/ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh): the actor and the reference at
// tp 2 x pp 2, the critic's megatron block left at verl's defaults: the critic takes the actor's grid.
TEST(PipelineOptions, VerlPpoMegatronScriptPutsTheCriticOnTheActorsGrid) {
  const config::Config c = verl_script("verl:examples/ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh");
  const TrainInputs in = train_inputs(c);
  EXPECT_TRUE(in.critic);
  EXPECT_EQ(in.critic_pipeline.pp, 2);
  EXPECT_EQ(c.get_int(CM + "tensor_model_parallel_size"), 2);
  EXPECT_NO_THROW(check_layout_divides(c, in, 8));
}

}  // namespace
}  // namespace kestrel::cli
