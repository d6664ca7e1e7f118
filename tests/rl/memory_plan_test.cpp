// The memory model (rl/memory_plan.h): its formulas, its micro-batch plan
// against the actor's own split, and the key claim: the allocator's measured
// peak per category during a real actor-update step (rl::ActorWorker::update
// on the built-in small model, the micro-batch shapes kestrel train forms)
// equals the prediction to the byte, in every recompute mode. MoE and MLA
// models: tests/rl/memory_plan_moe_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "common/testing.h"
#include "config/config.h"
#include "core/allocator.h"
#include "data/builtin_tokenizer.h"
#include "rl/memory_plan.h"
#include "rl/rollout_batch.h"
#include "rl/workers/actor_worker.h"
#include "train/builtin_model.h"

namespace kestrel::rl {
namespace {

io::ModelConfig small_config() {
  const auto tf = data::arith_tokenizer();
  return train::builtin_model_config("small", tf.vocab_size, tf.eos_id).value();
}

PlanInputs base_inputs() {
  PlanInputs in;
  in.model = small_config();
  in.device_memory = int64_t(1) << 40;
  in.batch.prompt_len = 16;
  in.batch.response_len = 40;
  in.batch.n = 4;
  in.batch.train_batch_size = 2;
  in.batch.ppo_mini_batch_size = 2;
  in.batch.max_token_len = 200;
  return in;
}

size_t cat(MemCategory c) { return size_t(c); }

TEST(MemoryPlan, BytesPerParameterMatchMegatronsTable) {
  // Kestrel keeps f32 gradients in full even with the distributed optimizer
  // (DataParallel's flat buffer), so bf16 is 2 + 4 + 12/dp: Megatron's 6 + 12/d.
  // The states alone: without the packed weights of a mini-batch of several
  // micro-batches (PackedTrainingWeightsAreCountedInTheUpdate).
  const testing::ScopedEnv no_packs("KESTREL_PACKED_WEIGHTS", "0");
  struct Case {
    DType dt;
    int64_t dp;
    bool distopt, reuse;
    double bytes_per_param;
  };
  for (const Case& k : {Case{DType::F32, 1, false, false, 16}, Case{DType::BF16, 1, false, false, 18},
                        Case{DType::BF16, 4, true, false, 6 + 12.0 / 4}, Case{DType::F32, 4, true, false, 8 + 8.0 / 4},
                        Case{DType::BF16, 1, false, true, 16}, Case{DType::BF16, 4, true, true, 6 + 10.0 / 4}}) {
    PlanInputs in = base_inputs();
    in.dtype = k.dt;
    in.layout.dp = k.dp;
    in.layout.distributed_optimizer = k.distopt;
    in.reuse_fp32_param = k.reuse;
    in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 4;
    const MemoryPlan p = plan_memory(in);
    const PhasePlan& up = p.phases.back();
    const double rope = 4.0 * double(p.shapes.rope_rows * p.shapes.hd);
    const double states = double(up.bytes[cat(MemCategory::Params)]) - rope + double(up.bytes[cat(MemCategory::Grads)]) +
                          double(up.bytes[cat(MemCategory::OptimizerState)]);
    EXPECT_NEAR(states / double(p.shapes.params), k.bytes_per_param, 0.01)
        << dtype_name(k.dt) << " dp " << k.dp << " distopt " << k.distopt << " reuse " << k.reuse;
  }
}

TEST(MemoryPlan, ParameterCountIsTheModelsAndShardsByTp) {
  PlanInputs in = base_inputs();
  EXPECT_EQ(plan_shapes(in, 1, 1).params, in.model.num_parameters());
  const PlanShapes s2 = plan_shapes(in, 2, 1);
  EXPECT_EQ(s2.H, 4);
  EXPECT_EQ(s2.Hkv, 1);
  EXPECT_EQ(s2.F, 768);
  EXPECT_LT(s2.params, in.model.num_parameters());
}

// The policy the config keys give (cli::recompute_policy builds it the same way).
PlanRecompute policy(const std::string& gran, const std::string& method, int64_t n,
                     std::vector<std::string> modules = {"core_attn"}, bool act = false, bool norm = false,
                     int64_t act_n = -1, int64_t norm_n = -1) {
  return model::make_recompute_policy(gran, method, n, modules, act, act_n, norm, norm_n, "").value();
}

TEST(MemoryPlan, RecomputeDropsWhatItsFormulaSays) {
  PlanInputs in = base_inputs();
  const PlanShapes s = plan_shapes(in, 1, 1);
  const int64_t T = 1000, D = s.D, q = s.H * s.hd, F = s.F, L = s.L;
  const TrainActivations none = train_activations(s, in, T, DType::F32);
  EXPECT_EQ(none.kept_layers, L * none.per_layer);
  EXPECT_EQ(none.recompute_live, 0);
  auto kept = [&](const PlanRecompute& rc) {
    in.recompute = rc;
    EXPECT_TRUE(validate_plan_inputs(in).is_ok()) << rc.describe();
    return train_activations(s, in, T, DType::F32);
  };
  EXPECT_EQ(none.kept_layers - kept(policy("selective", "", -1, {"core_attn"})).kept_layers, L * (4 * T * q + 4 * s.H * T));
  EXPECT_EQ(none.kept_layers - kept(policy("selective", "", -1, {"layernorm"})).kept_layers, L * 2 * 4 * T * D);
  EXPECT_EQ(none.kept_layers - kept(policy("selective", "", -1, {"mlp"})).kept_layers, L * 3 * 4 * T * F);
  EXPECT_EQ(none.kept_layers - kept(policy("", "", -1, {}, true)).kept_layers, L * 4 * T * F);
  EXPECT_EQ(none.kept_layers - kept(policy("", "", -1, {}, true, false, 3)).kept_layers, 3 * 4 * T * F);
  EXPECT_EQ(none.kept_layers - kept(policy("", "", -1, {}, false, true)).kept_layers, L * 2 * 4 * T * D);
  const TrainActivations full = kept(policy("full", "uniform", 2));
  EXPECT_EQ(full.kept_layers, (L / 2) * 4 * T * D);  // each chunk's input
  EXPECT_EQ(full.recompute_live, 2 * none.per_layer - 4 * T * D);
  EXPECT_LT(full.peak, none.peak);
  const TrainActivations block = kept(policy("full", "block", 2));
  EXPECT_EQ(block.kept_layers, 2 * 4 * T * D + (L - 2) * none.per_layer);
  // block + MindSpeed's act and norm: the blocks after the full ones drop act and both norms.
  const TrainActivations mixed = kept(policy("full", "block", 2, {}, true, true));
  EXPECT_EQ(mixed.kept_layers, 2 * 4 * T * D + (L - 2) * (none.per_layer - 4 * T * F - 2 * 4 * T * D));
  // Every mode lowers the peak, and a refused combination is refused by validate_plan_inputs.
  for (const PlanRecompute& rc : {policy("selective", "", -1, {"core_attn"}), policy("selective", "", -1, {"mlp"}),
                                  policy("", "", -1, {}, true, true), policy("full", "uniform", 1)})
    EXPECT_LT(kept(rc).peak, none.peak) << rc.describe();
  in.recompute = PlanRecompute{};
  in.recompute.granularity = model::RecomputeGranularity::Full;
  in.recompute.method = model::RecomputeMethod::Uniform;
  in.recompute.num_layers = 1;
  in.recompute.norm = true;
  const Status bad = validate_plan_inputs(in);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("recompute_method=block"), std::string::npos) << bad.message();
}

// Pipeline parallelism is built (train/pipeline.h): planned, not marked. The
// layer split (uneven stages, noop layers) is pipeline_chunks's, checked by
// validate_plan_inputs; the states are the rank's holding the most
// parameters. Context parallelism is modelled and marked.
TEST(MemoryPlan, PipelineAndContextParallelArePlanned) {
  PlanInputs in = base_inputs();
  in.layout.pp = 2;
  in.layout.dp = 1;
  ASSERT_TRUE(validate_plan_inputs(in).is_ok());
  const MemoryPlan p = plan_memory(in);
  for (const std::string& s : p.not_supported) EXPECT_EQ(s.find("pipeline"), std::string::npos) << s;
  EXPECT_LT(p.shapes.params, plan_memory(base_inputs()).shapes.params);  // a stage holds part of the layers
  in.layout.pp = 3;  // 8 layers over 3 stages: uneven, so Megatron's first/last stage sizes must say how
  const Status uneven = validate_plan_inputs(in);
  ASSERT_FALSE(uneven.is_ok());
  EXPECT_NE(uneven.message().find("num_layers_in_first_pipeline_stage"), std::string::npos) << uneven.message();
  in.layout.first_stage_layers = 2;  // 2 + 3 + 3: the last rank, with the head, holds the most
  ASSERT_TRUE(validate_plan_inputs(in).is_ok());
  const PlanShapes s3 = plan_shapes(in, 1, 3);
  EXPECT_EQ(s3.pp_rank, 2);
  EXPECT_EQ(s3.L, 3);
  EXPECT_EQ(s3.params, 3 * layer_params(in.model, 7) + s3.D + s3.V * s3.D);  // the final norm, lm_head or the tied copy
  in.layout.first_stage_layers = -1;
  in.layout.pp = 1;
  in.layout.cp = 2;  // built (model/cp_batch.h): half the tokens per rank, the ring's buffers at the attention core
  const MemoryPlan c = plan_memory(in);
  EXPECT_LT(c.actor.peak, plan_memory(base_inputs()).actor.peak);
  for (const std::string& s : c.not_supported) EXPECT_EQ(s.find("context"), std::string::npos) << s;
  in.layout.cp_ulysses = 2;  // Ulysses keeps the work copies of q, k, v and the output: more than the ring
  EXPECT_GT(plan_memory(in).actor.per_layer, c.actor.per_layer);
  in.layout.cp_ulysses = 3;
  EXPECT_FALSE(validate_plan_inputs(in).is_ok());
  // The measured side: tests/mpi/cp_memory_test.cpp (one 4,096-token sequence at cp = 1, 2, 4).
}

TEST(MemoryPlan, ParseBytesNamesTheFlag) {
  EXPECT_EQ(parse_bytes("80GiB", "--device-memory").value(), int64_t(80) << 30);
  EXPECT_EQ(parse_bytes("24 GB", "--device-memory").value(), int64_t(24000000000));
  EXPECT_EQ(parse_bytes("1024", "--device-memory").value(), 1024);
  auto bad = parse_bytes("lots", "--device-memory");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--device-memory"), std::string::npos);
}

// A rollout batch of `prompts` x n full-length sequences, a prompt's samples in a row.
RolloutBatch full_length_batch(const PlanBatching& b, int64_t prompts) {
  RolloutBatch r;
  for (int64_t g = 0; g < prompts; ++g)
    for (int64_t k = 0; k < b.n; ++k) {
      std::vector<int32_t> p(size_t(b.prompt_len)), resp(size_t(b.response_len));
      for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((g * 31 + int64_t(i)) % 400 + 3);
      for (size_t i = 0; i < resp.size(); ++i) resp[i] = int32_t((g * 7 + k * 13 + int64_t(i)) % 400 + 3);
      r.prompts.push_back(p);
      r.responses.push_back(resp);
      r.group.push_back(g);
    }
  r.finalize_layout();
  return r;
}

TEST(MemoryPlan, MicroBatchPlanIsTheActorsSplit) {
  for (bool share : {true, false})
    for (int64_t budget : {0, 100, 150, 400}) {
      PlanBatching b = base_inputs().batch;
      b.share_prompts = share;
      b.max_token_len = budget;
      b.micro_batch_size = budget > 0 ? 0 : 3;
      b.train_batch_size = b.ppo_mini_batch_size = 3;
      const RolloutBatch rb = full_length_batch(b, 3);
      std::vector<int64_t> all(size_t(rb.size()));
      for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
      int64_t max_rows = 0, rows = 0;
      const auto groups = split_mini_batch(rb, all, budget, b.micro_batch_size, share);
      for (const auto& g : groups) {
        const int64_t t = pack_rollout_sequences(rb, g, share).batch.num_tokens;
        max_rows = std::max(max_rows, t);
        rows += t;
      }
      const MicroBatchPlan m = plan_micro_batches(b, 1, budget, b.micro_batch_size, true);
      EXPECT_EQ(m.max_tokens, max_rows) << "share " << share << " budget " << budget;
      EXPECT_EQ(m.micro_batches, int64_t(groups.size())) << "share " << share << " budget " << budget;
      EXPECT_EQ(m.mini_batch_tokens, rows) << "share " << share << " budget " << budget;
    }
}

// ---- measured against the allocator ----------------------------------------

struct RecomputeMode {
  const char* name;
  std::vector<std::string> overrides;  // the config keys that ask for it
  PlanRecompute plan;
};

// Every mode and the combinations the config allows (model/recompute.h).
std::vector<RecomputeMode> recompute_modes() {
  const std::string OT = "actor_rollout_ref.actor.megatron.override_transformer_config.";
  const std::string full = OT + "recompute_granularity=full", sel = OT + "recompute_granularity=selective";
  return {
      {"none", {}, PlanRecompute{}},
      {"full/uniform/1", {full, OT + "recompute_method=uniform", OT + "recompute_num_layers=1"},
       policy("full", "uniform", 1)},
      {"full/uniform/3", {full, OT + "recompute_method=uniform", OT + "recompute_num_layers=3"},
       policy("full", "uniform", 3)},
      {"full/block/2", {full, OT + "recompute_method=block", OT + "recompute_num_layers=2"}, policy("full", "block", 2)},
      {"selective/core_attn", {sel, OT + "recompute_modules=[core_attn]"}, policy("selective", "", -1, {"core_attn"})},
      {"selective/layernorm", {sel, OT + "recompute_modules=[layernorm]"}, policy("selective", "", -1, {"layernorm"})},
      {"selective/mlp", {sel, OT + "recompute_modules=[mlp]"}, policy("selective", "", -1, {"mlp"})},
      {"activation_function", {OT + "recompute_activation_function=true"}, policy("", "", -1, {}, true)},
      {"norm", {OT + "recompute_norm=true"}, policy("", "", -1, {}, false, true)},
      {"full/block/2+act+norm",
       {full, OT + "recompute_method=block", OT + "recompute_num_layers=2", OT + "recompute_activation_function=true",
        OT + "recompute_norm=true"},
       policy("full", "block", 2, {}, true, true)},
      {"selective/core_attn+act+norm",
       {sel, OT + "recompute_modules=[core_attn]", OT + "recompute_activation_function=true", OT + "recompute_norm=true"},
       policy("selective", "", -1, {"core_attn"}, true, true)},
  };
}

void apply_recompute(model::ModelOptions& mo, const PlanRecompute& r) { mo.recompute = r; }

void measure_update(PlanInputs in, const RecomputeMode& mode) {
  const DType dt = in.dtype;
  {
    config::LoadOptions lo;
    lo.overrides = mode.overrides;
    auto c = config::load(lo);
    ASSERT_TRUE(c.is_ok()) << mode.name << ": the config refuses it: " << c.status().message();
  }
  model::ModelOptions mo;
  mo.dtype = dt;
  apply_recompute(mo, mode.plan);

  in.recompute = mode.plan;
  const MemoryPlan plan = plan_memory(in);
  const PhasePlan& want = plan.phases.back();
  ASSERT_EQ(want.name, "actor update");

  Allocator& alloc = cpu_allocator();
  const MemStats before = alloc.stats();
  mo.max_positions = in.max_positions;
  auto m = model::CausalLM::init_random(in.model, mo, 7);
  ActorOptions ao;
  ao.n = in.batch.n;
  ao.response_length = in.batch.response_len;
  ao.ppo_mini_batch_size = in.batch.ppo_mini_batch_size;
  ao.max_token_len = in.batch.max_token_len;
  ao.share_prompts = in.batch.share_prompts;
  ao.reuse_fp32_param = in.reuse_fp32_param;
  ao.lr.lr = 1e-5;
  ao.lr.total_steps = 1;
  ao.loss.agg.mode = AggMode::TokenMean;
  RlParallel par;
  ActorWorker actor(*m, ao, par);
  RolloutBatch b = full_length_batch(in.batch, in.batch.train_batch_size);
  b.advantages.assign(size_t(b.layout.num_tokens()), 0.5);  // every sequence trains
  alloc.reset_peak();
  actor.update(b, 0);
  const MemStats after = alloc.stats();
  const char* names[] = {"Params", "Grads", "OptimizerState", "Activations", "KVCache", "Other"};
  std::printf("  %s %s: %lld micro-batch(es) of <= %lld tokens\n", mode.name, dtype_name(dt),
              (long long)plan.micro.micro_batches, (long long)plan.micro.max_tokens);
  for (size_t c = 0; c < kNumMemCategories; ++c) {
    const double got = double(after.peak[c] - before.live[c]), pred = double(want.bytes[c]);
    std::printf("  %s %-14s measured %12.0f predicted %12.0f (%+.2f%%)%s\n", mode.name, names[c], got, pred,
                pred > 0 ? 100 * (got / pred - 1) : 0.0,
                c == cat(MemCategory::Activations) ? (", peak at " + plan.actor.at).c_str() : "");
    EXPECT_EQ(after.peak[c] - before.live[c], want.bytes[c]) << mode.name << " " << dtype_name(dt) << " " << names[c];
  }
}

// The scoring phase's activations: old log-probs of the whole batch (forward
// only, one layer's buffers at a time, then the head), by the token budget.
void measure_scoring(DType dt) {
  PlanInputs in = base_inputs();
  in.dtype = dt;
  in.batch.old_log_prob = true;
  in.batch.log_prob_max_token_len = 300;
  const MemoryPlan plan = plan_memory(in);
  const PhasePlan* want = nullptr;
  for (const auto& ph : plan.phases)
    if (ph.name == "scoring") want = &ph;
  ASSERT_NE(want, nullptr);
  const PhasePlan& rollout = plan.phases.front();
  model::ModelOptions mo;
  mo.dtype = dt;
  Allocator& alloc = cpu_allocator();
  const MemStats before = alloc.stats();
  auto m = model::CausalLM::init_random(in.model, mo, 7);
  ActorOptions ao;
  ao.n = in.batch.n;
  ao.lr.total_steps = 1;
  ao.log_prob.max_token_len = in.batch.log_prob_max_token_len;
  ao.log_prob.share_prompts = in.batch.share_prompts;
  ActorWorker actor(*m, ao, RlParallel{});
  RolloutBatch b = full_length_batch(in.batch, in.batch.train_batch_size);
  alloc.reset_peak();
  actor.compute_log_probs(b);
  const MemStats after = alloc.stats();
  const size_t A = cat(MemCategory::Activations);
  // The engine's KV cache is not part of this harness: compare the activations.
  const double got = double(after.peak[A] - before.live[A]);
  const double pred = double(want->bytes[A]);
  std::printf("  scoring %s Activations measured %.0f predicted %.0f (%+.2f%%); rollout phase KV %lld\n", dtype_name(dt),
              got, pred, 100 * (got / pred - 1), (long long)rollout.bytes[cat(MemCategory::KVCache)]);
  EXPECT_EQ(after.peak[A] - before.live[A], want->bytes[A]) << dtype_name(dt);
}

TEST(MemoryPlanScoring, OldLogProbActivationsExactF32) { measure_scoring(DType::F32); }
TEST(MemoryPlanScoring, OldLogProbActivationsExactBf16) { measure_scoring(DType::BF16); }

class MeasuredPeak : public ::testing::TestWithParam<size_t> {};

// none: two prompts, two 179-token micro-batches (the second reuses what the
// first freed); a recompute mode: one prompt, one 179-token micro-batch (the
// same peak, half the time: 22 updates run in make test).
PlanInputs mode_inputs(DType dt, size_t mode) {
  PlanInputs in = base_inputs();
  in.dtype = dt;
  if (mode != 0) in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 1;
  return in;
}

TEST_P(MeasuredPeak, ActorUpdateF32Exact) {
  measure_update(mode_inputs(DType::F32, GetParam()), recompute_modes()[GetParam()]);
}
TEST_P(MeasuredPeak, ActorUpdateBf16Exact) {
  measure_update(mode_inputs(DType::BF16, GetParam()), recompute_modes()[GetParam()]);
}

// reuse_fp32_param through the engine (train::EngineOptions): the bf16
// masters held as the weights plus a 16-bit residual, -2 B/param of
// OptimizerState, the other categories unchanged.
TEST(MemoryPlanReuseFp32, ActorUpdateBf16Exact) {
  PlanInputs in = mode_inputs(DType::BF16, 1);
  in.reuse_fp32_param = true;
  const PlanInputs plain = mode_inputs(DType::BF16, 1);
  const int64_t O = int64_t(cat(MemCategory::OptimizerState));
  EXPECT_EQ(plan_memory(plain).phases.back().bytes[size_t(O)] - plan_memory(in).phases.back().bytes[size_t(O)],
            2 * plan_shapes(in, 1, 1).params);
  measure_update(in, {"reuse_fp32_param", {}, PlanRecompute{}});
}

// docs/benchmarks.md "Memory model vs allocator": the Qwen2.5-0.5B-shaped
// config (random weights), one actor-update step. ~10 GiB and minutes on 2
// cores, so only on request:
//   KESTREL_PLAN_MEASURE_QWEN=bf16 [KESTREL_PLAN_QWEN_MODE=full/uniform/1] build/dev/test_rl --gtest_filter='MemoryPlanQwen*'
TEST(MemoryPlanQwen, ActorUpdateExact) {
  const char* e = std::getenv("KESTREL_PLAN_MEASURE_QWEN");
  if (!e || !*e) GTEST_SKIP() << "set KESTREL_PLAN_MEASURE_QWEN=f32|bf16 to measure (about 10 GiB)";
  PlanInputs in = base_inputs();
  in.model = io::load_model_config(std::string(KESTREL_SOURCE_DIR) + "/configs/models/qwen2.5-0.5b-shape").value();
  in.max_positions = 1024;
  in.dtype = std::string(e) == "f32" ? DType::F32 : DType::BF16;
  in.batch.prompt_len = 64;
  in.batch.response_len = 192;
  in.batch.n = 2;
  in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 2;
  in.batch.max_token_len = 512;
  // KESTREL_PLAN_QWEN_MODE=<a recompute_modes() name> (default none), e.g. full/uniform/1.
  const char* want = std::getenv("KESTREL_PLAN_QWEN_MODE");
  for (const RecomputeMode& mode : recompute_modes())
    if (mode.name == std::string(want && *want ? want : "none")) return measure_update(in, mode);
  FAIL() << "KESTREL_PLAN_QWEN_MODE=" << want << " is not one of recompute_modes()";
}

INSTANTIATE_TEST_SUITE_P(Modes, MeasuredPeak, ::testing::Range<size_t>(0, recompute_modes().size()), [](const auto& info) {
  std::string n = recompute_modes()[info.param].name;
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

}  // namespace
}  // namespace kestrel::rl
