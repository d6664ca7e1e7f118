// The memory model (rl/memory_plan.h) for mixture-of-experts and latent
// attention models: parameters per layer and per pipeline rank against
// CausalLM, the Hub models' counts, the actor update's and the scoring
// pass's allocator peaks on the tiny golden models
// (tests/golden/models/{qwen2_moe,qwen3_moe,deepseek_v2,deepseek_v3}) in f32
// and bf16 under every recompute mode, capacity dropping and padding and the
// router options, the KV cache's width, FLOPs per token, and what the plan
// refuses. The claims of docs/benchmarks.md "Memory model vs allocator".
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/process_group.h"
#include "core/allocator.h"
#include "model/moe_mlp.h"
#include "model/pipeline_params.h"
#include "parallel/pipeline_layout.h"
#include "parallel/sharding.h"
#include "common/rank_only_group.h"
#include "full_length_batch.h"
#include "rl/memory_plan.h"
#include "rl/rollout_batch.h"
#include "rl/workers/actor_worker.h"

namespace kestrel::rl {
namespace {

size_t cat(MemCategory c) { return size_t(c); }
constexpr size_t kActs = size_t(MemCategory::Activations);

io::ModelConfig golden(const std::string& name) {
  return io::load_model_config(std::string(KESTREL_SOURCE_DIR) + "/tests/golden/models/" + name).value();
}
// Trimmed Hub configs (tests/rl/plan_configs/, as tests/io/model_config_moe_test.cpp holds them).
io::ModelConfig real_shape(const std::string& name) {
  return io::load_model_config(std::string(KESTREL_SOURCE_DIR) + "/tests/rl/plan_configs/" + name).value();
}

const char* const kGoldens[] = {"qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"};

// One prompt x 4 samples of 16 + 40 tokens: one 179-row micro-batch (the
// prompt's 15-token prefix once plus 4 x 41).
PlanInputs inputs_for(const io::ModelConfig& cfg, DType dt = DType::F32) {
  PlanInputs in;
  in.model = cfg;
  in.dtype = dt;
  in.device_memory = int64_t(1) << 40;
  in.batch.prompt_len = 16;
  in.batch.response_len = 40;
  in.batch.n = 4;
  in.batch.train_batch_size = 1;
  in.batch.ppo_mini_batch_size = 1;
  in.batch.max_token_len = 200;
  return in;
}

PlanRecompute policy(const std::string& gran, const std::string& method, int64_t n,
                     std::vector<std::string> modules = {"core_attn"}, bool act = false, bool norm = false) {
  return model::make_recompute_policy(gran, method, n, modules, act, -1, norm, -1, "").value();
}

struct Mode {
  const char* name;
  PlanRecompute plan;
};
// Every recompute mode that applies to MoE/MLA blocks, and combinations
// (selective mlp drops nothing of a MoE MLP: only DeepSeek's dense layer 0 has one).
std::vector<Mode> modes() {
  return {
      {"none", PlanRecompute{}},
      {"full/uniform/1", policy("full", "uniform", 1)},
      {"full/uniform/2", policy("full", "uniform", 2)},
      {"full/block/1", policy("full", "block", 1)},
      {"selective/core_attn", policy("selective", "", -1, {"core_attn"})},
      {"selective/layernorm", policy("selective", "", -1, {"layernorm"})},
      {"selective/mlp", policy("selective", "", -1, {"mlp"})},
      {"activation_function", policy("", "", -1, {}, true)},
      {"norm", policy("", "", -1, {}, false, true)},
      {"full/block/1+act+norm", policy("full", "block", 1, {}, true, true)},
      {"selective/core_attn,mlp+act+norm", policy("selective", "", -1, {"core_attn", "mlp"}, true, true)},
  };
}

using testing::full_length_batch;

model::ModelOptions model_options(const PlanInputs& in) {
  model::ModelOptions mo;
  mo.dtype = in.dtype;
  mo.recompute = in.recompute;
  mo.moe = in.moe;
  mo.max_positions = in.max_positions;
  return mo;
}

// Zero router weights: every token's scores tie and it takes experts
// 0..k-1, so the largest expert group is the whole micro-batch.
void fix_routing(model::CausalLM& m) {
  const std::string suffix = "mlp.gate.weight";
  for (model::Param* p : m.params())
    if (p->name.size() > suffix.size() && p->name.compare(p->name.size() - suffix.size(), suffix.size(), suffix) == 0)
      p->weight.zero_();
}

struct Measured {
  CategoryBytes got{}, want{};
  std::string at;
};

// One actor update (rl::ActorWorker::update) of a randomly initialised
// model: the allocator's peaks per category (peaks reset before the update,
// the live bytes before the model was built subtracted) and the plan's
// actor-update phase.
Measured measure_update(const PlanInputs& in, bool route_fixed = false) {
  Measured out;
  const MemoryPlan plan = plan_memory(in);
  out.want = plan.phases.back().bytes;
  out.at = plan.actor.at;
  Allocator& alloc = cpu_allocator();
  const MemStats before = alloc.stats();
  auto m = model::CausalLM::init_random(in.model, model_options(in), 7);
  if (route_fixed) fix_routing(*m);
  ActorOptions ao;
  ao.n = in.batch.n;
  ao.response_length = in.batch.response_len;
  ao.ppo_mini_batch_size = in.batch.ppo_mini_batch_size;
  ao.max_token_len = in.batch.max_token_len;
  ao.share_prompts = in.batch.share_prompts;
  ao.lr.lr = 1e-5;
  ao.lr.total_steps = 1;
  ao.loss.agg.mode = AggMode::TokenMean;
  ActorWorker actor(*m, ao, RlParallel{});
  RolloutBatch b = full_length_batch(in.batch, in.batch.train_batch_size, in.model.vocab_size);
  b.advantages.assign(size_t(b.layout.num_tokens()), 0.5);  // every sequence trains
  alloc.reset_peak();
  actor.update(b, 0);
  const MemStats after = alloc.stats();
  for (size_t c = 0; c < kNumMemCategories; ++c) out.got[c] = after.peak[c] - before.live[c];
  return out;
}

const char* const kCategory[] = {"Params", "Grads", "OptimizerState", "Activations", "KVCache", "Other"};

void expect_exact(const Measured& m, const std::string& what) {
  for (size_t c = 0; c < kNumMemCategories; ++c)
    EXPECT_EQ(m.got[c], m.want[c]) << what << " " << kCategory[c] << " (plan's peak at " << m.at << ")";
}

// ---- parameters ---------------------------------------------------------------

int64_t buffer_bytes(model::CausalLM& m) {
  int64_t b = 0;
  for (model::Param* p : m.buffers()) b += p->weight.nbytes();
  return b;
}

// The plan's parameters are the model's, layer by layer: the router, every
// expert, the shared experts and Qwen2-MoE's shared gate (and its o_proj
// without bias although qkv_bias is set), the MLA projections and norms;
// DeepSeek-V3's e_score_correction_bias is a buffer, f32 in every precision.
TEST(MemoryPlanMoe, ParamsAndBuffersAreTheModels) {
  for (const char* name : kGoldens) {
    SCOPED_TRACE(name);
    const io::ModelConfig cfg = golden(name);
    auto m = model::CausalLM::init_random(cfg, model::ModelOptions{}, 1);
    PlanInputs in = inputs_for(cfg);
    const PlanShapes s = plan_shapes(in, 1, 1);
    EXPECT_EQ(s.params, m->num_parameters());
    EXPECT_EQ(s.buffers, buffer_bytes(*m));
    EXPECT_EQ(s.moe_layers, m->num_moe_layers());
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
      int64_t n = 0;
      const std::string prefix = "model.layers." + std::to_string(i) + ".";
      for (model::Param* p : m->params())
        if (p->name.rfind(prefix, 0) == 0) n += p->weight.numel();
      EXPECT_EQ(layer_params(cfg, i), n) << "layer " << i;
    }
  }
  EXPECT_GT(plan_shapes(inputs_for(golden("deepseek_v3")), 1, 1).buffers, 0);
  EXPECT_EQ(plan_shapes(inputs_for(golden("deepseek_v2")), 1, 1).buffers, 0);  // V2 has no correction bias
}

// ---- parameters under tensor parallelism ------------------------------------------

// tp rank `rank`'s CausalLM of a tp x etp layout (sequence parallel, as a MoE
// model needs under tp), built in this process on RankOnlyGroup tp/etp groups:
// building and random initialisation shard every tensor without communicating
// (the full tensor is drawn, then cut), so any collective fails.
std::unique_ptr<model::CausalLM> rank_model(const io::ModelConfig& c, int tp, int etp, int rank) {
  model::ModelOptions mo;
  mo.parallel.tp = std::make_shared<kestrel::testing::RankOnlyGroup>(rank % tp, tp, "tp");
  mo.parallel.sequence_parallel = tp > 1;
  mo.parallel.etp = std::make_shared<kestrel::testing::RankOnlyGroup>(rank % etp, etp, "etp");
  return model::CausalLM::init_random(c, mo, 1);
}

// The elements a tp rank holds by the sharding rules alone, from the whole
// model's tensor list (model::whole_model_params, nothing allocated): each
// tensor's parallel::hf_shard_spec shard over tp, a routed expert's over etp;
// a replicated tensor (norms, MLA's q_a/kv_a projections, the router, the
// shared gate) whole on every rank.
int64_t sharded_elems(const io::ModelConfig& c, int64_t tp, int64_t etp) {
  int64_t n = 0;
  for (const model::ParamInfo& p : model::whole_model_params(c, model::ModelOptions{})) {
    if (p.buffer) continue;
    parallel::ShardSpec spec = parallel::hf_shard_spec(p.name, c.num_key_value_heads);
    if (spec.kind == parallel::ShardKind::Vocab) spec.pad_multiple = 128;
    const int ranks = int(model::is_routed_expert_param(p.name) ? etp : tp);
    int64_t e = 1;
    for (int64_t d : parallel::shard_shape(p.full_shape, spec, ranks, p.name)) e *= d;
    n += e;
  }
  return n;
}

// Every rank's parameters at TP2 (experts split over the tp group), TP2 with
// whole experts (ETP1) and TP1 with experts split over ETP2: the plan's count
// equals the shards each rank of CausalLM holds, layer by layer, and the
// sharding rules' sum over the whole model's tensors; the buffers (f32
// correction bias) are whole on every rank.
TEST(MemoryPlanMoe, ParamsPerRankAreTheShardsUnderTp) {
  struct Layout {
    int tp, etp;
  };
  for (const char* name : kGoldens)
    for (const Layout& l : {Layout{2, 2}, Layout{2, 1}, Layout{1, 2}}) {
      const std::string what = std::string(name) + " tp" + std::to_string(l.tp) + " etp" + std::to_string(l.etp);
      const io::ModelConfig cfg = golden(name);
      PlanInputs in = inputs_for(cfg);
      const PlanShapes s = plan_shapes(in, l.tp, 1, false, 1, l.etp);
      EXPECT_EQ(s.params, sharded_elems(cfg, l.tp, l.etp)) << what;
      EXPECT_EQ(s.Fe, cfg.moe.moe_intermediate_size / l.etp) << what;
      EXPECT_EQ(s.Fs, cfg.moe.shared_intermediate_size / l.tp) << what;
      for (int rank = 0; rank < std::max(l.tp, l.etp); ++rank) {
        auto m = rank_model(cfg, l.tp, l.etp, rank);
        EXPECT_EQ(s.params, m->num_parameters()) << what << " rank " << rank;
        EXPECT_EQ(s.buffers, buffer_bytes(*m)) << what << " rank " << rank;
        for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
          int64_t n = 0;
          const std::string prefix = "model.layers." + std::to_string(i) + ".";
          for (model::Param* p : m->params())
            if (p->name.rfind(prefix, 0) == 0) n += p->weight.numel();
          EXPECT_EQ(layer_params(cfg, i, l.tp, 1, l.etp), n) << what << " rank " << rank << " layer " << i;
        }
      }
    }
}

// The Hub models' shards per rank at TP8 (experts over the tp group, or
// whole: ETP1): the plan's count is the sharding rules' over the whole
// model's tensors; EP8 divides the routed experts' shards only, by 8.
TEST(MemoryPlanMoe, RealShapesShardPerRank) {
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3"}) {
    const io::ModelConfig c = real_shape(name);
    for (int64_t etp : {8, 1}) {
      const PlanShapes s = plan_shapes(inputs_for(c), 8, 1, false, 1, etp);
      EXPECT_EQ(s.params, sharded_elems(c, 8, etp)) << name << " etp " << etp;
    }
    const int64_t experts = int64_t(model::num_moe_layers(c)) * c.moe.num_experts * 3 * c.hidden_size *
                            (c.moe.moe_intermediate_size / 8);
    EXPECT_EQ(plan_shapes(inputs_for(c), 8, 1, false, 1, 8).params - plan_shapes(inputs_for(c), 8, 1, false, 8, 8).params,
              experts - experts / 8)
        << name;
  }
}

// The Hub models (vocabularies divisible by 128: no padding): Qwen3-30B-A3B
// 30.5B parameters of which 3.3B active, DeepSeek-V3 671B (without the MTP
// layer) of which 37B active; forward GEMM FLOPs per token are twice the
// active weights a token multiplies (the lm_head's included, the embedding,
// norms and biases not).
TEST(MemoryPlanMoe, RealShapesCountTheHubModels) {
  const io::ModelConfig q = real_shape("qwen3-30b-a3b"), d = real_shape("deepseek-v3");
  const PlanShapes qs = plan_shapes(inputs_for(q), 1, 1), ds = plan_shapes(inputs_for(d), 1, 1);
  EXPECT_EQ(qs.params, 30532122624);
  EXPECT_EQ(ds.params, 671026404352);
  EXPECT_EQ(qs.buffers, 0);
  EXPECT_EQ(ds.buffers, 58 * 256 * 4);  // e_score_correction_bias f32 [256] on each of the 58 MoE layers
  EXPECT_EQ(active_parameters(q), 30532122624 - int64_t(48) * 120 * 3 * 2048 * 768);  // 8 of 128 experts: 3.35B
  EXPECT_EQ(active_parameters(d), 671026404352 - 58 * 248 * 3 * int64_t(7168) * 2048);  // 8 of 256: 37.6B
  const MemoryPlan qp = plan_memory(inputs_for(q)), dp = plan_memory(inputs_for(d));
  const int64_t q_norms = 48 * (2 * 2048 + 2 * 128) + 2048;
  EXPECT_EQ(qp.flops_per_token, 2.0 * double(active_parameters(q) - 151936 * 2048 - q_norms));
  const int64_t d_norms = 61 * (2 * 7168 + 1536 + 512) + 7168;
  EXPECT_EQ(dp.flops_per_token, 2.0 * double(active_parameters(d) - 129280 * int64_t(7168) - d_norms));
  EXPECT_EQ(qp.active_params, active_parameters(q));
}

// Under pipeline parallelism the states are those of the rank holding the
// most parameters, with parallel::pipeline_chunks's split: even, uneven
// first/last stages, noop layers, interleaved chunks.
TEST(MemoryPlanMoe, PipelineRanksHoldTheSplit) {
  struct Split {
    int64_t pp, vpp, first, last;
    std::vector<int64_t> noop;
  };
  for (const char* name : {"deepseek_v3", "qwen3_moe"})
    for (const Split& sp : {Split{3, 1, -1, -1, {}}, Split{2, 1, 1, -1, {}}, Split{2, 1, -1, 1, {}},
                            Split{2, 1, -1, -1, {3}}, Split{2, 2, -1, -1, {3}}}) {
      SCOPED_TRACE(std::string(name) + " pp " + std::to_string(sp.pp) + " vpp " + std::to_string(sp.vpp));
      PlanInputs in = inputs_for(golden(name));
      in.layout.pp = sp.pp;
      in.layout.vpp = sp.vpp;
      in.layout.first_stage_layers = sp.first;
      in.layout.last_stage_layers = sp.last;
      in.layout.noop_layers = sp.noop;
      ASSERT_TRUE(validate_plan_inputs(in).is_ok()) << validate_plan_inputs(in).message();
      parallel::PipelineSpec spec;
      spec.pp = int(sp.pp);
      spec.vpp = int(sp.vpp);
      spec.first_stage_layers = sp.first;
      spec.last_stage_layers = sp.last;
      spec.noop_layers = sp.noop;
      const auto chunks = parallel::pipeline_chunks(spec, in.model.num_hidden_layers).value();
      int64_t most = -1, rank = -1, buffers = 0;
      for (size_t r = 0; r < chunks.size(); ++r) {
        model::ModelOptions mo;
        mo.has_embedding = r == 0;
        mo.has_head = r + 1 == chunks.size();
        for (const parallel::StageChunk& ch : chunks[r]) mo.chunks.push_back({ch.first_layer, ch.num_layers});
        auto m = model::CausalLM::init_random(in.model, mo, 1);
        if (m->num_parameters() > most) most = m->num_parameters(), rank = int64_t(r), buffers = buffer_bytes(*m);
      }
      const PlanShapes s = plan_shapes(in, 1, sp.pp);
      EXPECT_EQ(s.params, most);
      EXPECT_EQ(s.pp_rank, rank);
      EXPECT_EQ(s.buffers, buffers);
    }
  PlanInputs bad = inputs_for(golden("deepseek_v3"));
  bad.layout.pp = 2;  // 3 layers do not split evenly over 2 stages
  const Status st = validate_plan_inputs(bad);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("num_layers_in_first_pipeline_stage"), std::string::npos) << st.message();
}

// ---- the actor update against the allocator ------------------------------------

class MoeMeasuredPeak : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

// Every category to the byte, in every recompute mode, with the model's own
// (random) routing: dropless, so N = T*k rows per MoE layer.
TEST_P(MoeMeasuredPeak, ActorUpdateExact) {
  const auto [name, dt] = GetParam();
  for (const Mode& md : modes()) {
    PlanInputs in = inputs_for(golden(name), dt);
    in.recompute = md.plan;
    const Measured m = measure_update(in);
    for (size_t c = 0; c < kNumMemCategories; ++c)
      if (c == kActs || std::string(md.name) == "none")
        std::printf("  %s %s %s %s measured %lld predicted %lld%s\n", name, dtype_name(dt), md.name, kCategory[c],
                    (long long)m.got[c], (long long)m.want[c], c == kActs ? (", peak at " + m.at).c_str() : "");
    expect_exact(m, std::string(name) + " " + dtype_name(dt) + " " + md.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, MoeMeasuredPeak,
                         ::testing::Combine(::testing::ValuesIn(kGoldens), ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param));
                         });

// Four experts per token of width 48 and no shared expert: the MoE MLP's
// backward sets the peak (its router's, or with activation-function
// recompute its experts' gate/up and the permutation's). The plan's bound on
// the largest expert group (the whole micro-batch) enters only the bf16
// widening of the grouped GEMM, which the permutation's [T, D] f32 scratch
// right after equals: exact whether every token takes the same experts or
// the router spreads them.
TEST(MemoryPlanMoe, RoutedExpertsPeakExactUnderAnyRouting) {
  for (const char* name : {"qwen3_moe", "deepseek_v3"})
    for (DType dt : {DType::F32, DType::BF16})
      for (bool fixed : {false, true})
        for (const Mode& md : {modes()[0], modes()[1], modes()[7]}) {
          io::ModelConfig c = golden(name);
          c.moe.top_k = 4;
          c.moe.moe_intermediate_size = 48;
          c.moe.shared_intermediate_size = 0;
          PlanInputs in = inputs_for(c, dt);
          in.recompute = md.plan;
          const Measured m = measure_update(in, fixed);
          EXPECT_NE(m.at.find(" MoE "), std::string::npos) << name << " " << md.name << ": " << m.at;
          expect_exact(m, std::string(name) + " " + dtype_name(dt) + (fixed ? " fixed " : " spread ") + md.name);
        }
}

// Capacity (Megatron's moe_expert_capacity_factor): padded to capacity, N =
// E * capacity exactly; dropping without padding, N <= T*k and the plan is
// the bound (every token fixed on the same k experts: most of them dropped).
TEST(MemoryPlanMoe, CapacityPaddedIsExactDroppingIsBounded) {
  for (const char* name : {"qwen3_moe", "deepseek_v3"})
    for (DType dt : {DType::F32, DType::BF16})
      for (bool fixed : {false, true}) {
        const std::string what = std::string(name) + " " + dtype_name(dt) + (fixed ? " fixed" : " spread");
        PlanInputs in = inputs_for(golden(name), dt);
        in.moe.capacity_factor = 1.0;
        in.moe.pad_to_capacity = true;
        expect_exact(measure_update(in, fixed), what + " padded");
        in.moe.pad_to_capacity = false;
        const Measured d = measure_update(in, fixed);
        EXPECT_LE(d.got[kActs], d.want[kActs]) << what << " dropping";
        if (fixed) {
          EXPECT_LT(d.got[kActs], d.want[kActs]) << what << " dropping (tokens dropped)";
        }
        for (size_t c = 0; c < kNumMemCategories; ++c) {
          if (c == kActs) continue;
          EXPECT_EQ(d.got[c], d.want[c]) << what << " dropping " << kCategory[c];
        }
      }
}

// The router's training options: the load-balancing loss over the
// micro-batch holds its offsets in an i32 [2] host tensor (Other, 8 bytes);
// per sequence it reads cu_seqlens; the z-loss, Megatron's fp32 router
// logits on a bf16 Qwen model, a frozen router.
TEST(MemoryPlanMoe, RouterOptionsExact) {
  for (const char* name : {"qwen3_moe", "deepseek_v3"}) {
    for (const char* type : {"aux_loss", "seq_aux_loss"}) {
      PlanInputs in = inputs_for(golden(name), DType::BF16);
      in.moe.load_balancing_type = type;
      in.moe.aux_loss_coeff = 0.01;
      in.moe.z_loss_coeff = 0.001;
      const Measured m = measure_update(in);
      expect_exact(m, std::string(name) + " " + type);
      EXPECT_EQ(m.want[cat(MemCategory::Other)], std::string(type) == "aux_loss" ? 8 : 0);
    }
    PlanInputs in = inputs_for(golden(name), DType::BF16);
    in.moe.router_logits_fp32 = true;
    in.moe.freeze_router = true;
    expect_exact(measure_update(in), std::string(name) + " fp32 router, frozen");
  }
}

// ---- scoring ---------------------------------------------------------------------

// Old log-probs of two prompts by a 300-token budget (micro-batches of 276
// and 82 rows, the second prompt's prefix packed in both): forward only, one
// LayerActivations record reused by every layer.
TEST(MemoryPlanMoe, ScoringActivationsExact) {
  for (const char* name : kGoldens)
    for (DType dt : {DType::F32, DType::BF16}) {
      PlanInputs in = inputs_for(golden(name), dt);
      in.batch.train_batch_size = 2;
      in.batch.old_log_prob = true;
      in.batch.log_prob_max_token_len = 300;
      const MemoryPlan plan = plan_memory(in);
      const PhasePlan* want = nullptr;
      for (const auto& ph : plan.phases)
        if (ph.name == "scoring") want = &ph;
      ASSERT_NE(want, nullptr);
      Allocator& alloc = cpu_allocator();
      const MemStats before = alloc.stats();
      model::ModelOptions mo;
      mo.dtype = dt;
      auto m = model::CausalLM::init_random(in.model, mo, 7);
      ActorOptions ao;
      ao.n = in.batch.n;
      ao.lr.total_steps = 1;
      ao.log_prob.max_token_len = in.batch.log_prob_max_token_len;
      ao.log_prob.share_prompts = in.batch.share_prompts;
      ActorWorker actor(*m, ao, RlParallel{});
      RolloutBatch b = full_length_batch(in.batch, in.batch.train_batch_size, in.model.vocab_size);
      alloc.reset_peak();
      actor.compute_log_probs(b);
      const MemStats after = alloc.stats();
      EXPECT_EQ(after.peak[kActs] - before.live[kActs], want->bytes[kActs]) << name << " " << dtype_name(dt);
    }
}

// ---- the rollout's KV cache, FLOPs, refusals ---------------------------------------

// MLA keeps one latent row [c_kv | k_pe] per token and layer; dense models K
// and V of the kv heads; the blocks and tokens that fit follow that width.
TEST(MemoryPlanMoe, KvCacheWidthPerToken) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const io::ModelConfig d = golden("deepseek_v3"), q = golden("qwen3_moe");
    PlanInputs in = inputs_for(d, dt);
    in.rollout.dtype = dt;
    in.device_memory = int64_t(1) << 30;
    const int64_t a = int64_t(dtype_size(dt));
    const MemoryPlan p = plan_memory(in);
    EXPECT_EQ(p.kv_bytes_per_token, 3 * (16 + 8) * a);                   // layers x (kv_lora + rope)
    EXPECT_EQ(p.kv_bytes_per_token_gqa, 3 * 4 * ((8 + 8) + 12) * a);       // layers x H x (qk + v)
    const int64_t kv = int64_t(0.5 * double(in.device_memory)) - a * p.shapes.params - p.shapes.buffers;  // weight_bytes
    EXPECT_EQ(p.kv_blocks, kv / (16 * p.kv_bytes_per_token));
    EXPECT_EQ(p.kv_tokens, p.kv_blocks * 16);
    EXPECT_EQ(p.kv_cache_bytes, p.kv_tokens * p.kv_bytes_per_token);
    PlanInputs qin = inputs_for(q, dt);
    qin.rollout.dtype = dt;
    const MemoryPlan qp = plan_memory(qin);
    EXPECT_EQ(qp.kv_bytes_per_token, 3 * 2 * 2 * 16 * a);  // layers x K, V x 2 kv heads x head_dim 16
    EXPECT_EQ(qp.kv_bytes_per_token_gqa, qp.kv_bytes_per_token);
  }
  EXPECT_EQ(kv_values_per_token_layer(real_shape("deepseek-v3"), 1), 576);
  // Routing recording (router replay R3): the engine's routing cache, n_moe_layers x top_k i32 per slot, shares
  // the budget (rollout/kv_cache.h bytes_per_block).
  PlanInputs in = inputs_for(golden("deepseek_v3"), DType::BF16);
  in.rollout.dtype = DType::BF16;
  in.device_memory = int64_t(1) << 30;
  const MemoryPlan plain = plan_memory(in);
  in.rollout.record_routing = true;
  const MemoryPlan rec = plan_memory(in);
  EXPECT_EQ(rec.kv_routing_bytes_per_token, 2 * 2 * 4);  // 2 MoE layers x top-2 x i32
  EXPECT_EQ(rec.kv_bytes_per_token, plain.kv_bytes_per_token);
  const int64_t kv = int64_t(0.5 * double(in.device_memory)) - 2 * rec.shapes.params - rec.shapes.buffers;
  EXPECT_EQ(rec.kv_blocks, kv / (16 * (rec.kv_bytes_per_token + rec.kv_routing_bytes_per_token)));
  EXPECT_LT(rec.kv_blocks, plain.kv_blocks);
}

// A MoE layer's FLOPs count the k routed experts a token visits and the
// shared ones, not all E: the actor update is 3 forwards of the step's tokens.
TEST(MemoryPlanMoe, FlopsCountActiveExperts) {
  const io::ModelConfig c = golden("deepseek_v3");
  const LayerFlops moe = layer_flops(c, 2), dense = layer_flops(c, 0);
  const double D = 32, Fe = 16, E = 8, k = 2, Fs = 16, F = 64;
  EXPECT_EQ(moe.per_token - dense.per_token, 2 * D * (E + k * 3 * Fe + 3 * Fs) - 2 * 3 * D * F);
  EXPECT_EQ(moe.per_pair, 2 * 4 * (16 + 12));  // H x (QK^T over nope+rope, PV over v)
  const MemoryPlan p = plan_memory(inputs_for(c));
  double per_token = 2 * 32 * 96, per_pair = 0;  // lm_head
  for (int64_t i = 0; i < 3; ++i) per_token += layer_flops(c, i).per_token, per_pair += layer_flops(c, i).per_pair;
  EXPECT_DOUBLE_EQ(p.flops_actor,
                   3 * (double(p.micro.step_tokens) * per_token + double(p.micro.attention_pairs) * per_pair));
}

// What the plan refuses for MoE and MLA models, naming the key and what to
// set: tensor parallelism of a MoE model without sequence parallelism
// (Megatron's rule, model/moe_mlp.cpp's training forward), an expert split that does not
// divide moe_intermediate_size, an expert grid that does not fit the ranks,
// the rollout at tp > 1 (it runs MoE/MLA models whole), expert parallelism
// with virtual pipeline stages, context parallelism; a dense model with ep.
// Under sequence parallelism tp > 1 is planned (MoE and MLA), with ep and etp;
// the advice may offer tp, with sequence parallelism when it is off.
TEST(MemoryPlanMoe, RefusesWhatKestrelCannotRun) {
  const std::string M = "actor_rollout_ref.actor.megatron.";
  PlanInputs in = inputs_for(golden("qwen3_moe"));
  in.layout.tp = 2;
  Status s = validate_plan_inputs(in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(M + "tensor_model_parallel_size=2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("set " + M + "sequence_parallel=true"), std::string::npos) << s.message();
  in.layout.sequence_parallel = true;
  EXPECT_TRUE(validate_plan_inputs(in)) << validate_plan_inputs(in).message();
  in.layout.etp = 3;  // moe_intermediate_size 16 does not split in 3
  s = validate_plan_inputs(in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(M + "expert_tensor_parallel_size=3"), std::string::npos) << s.message();
  in.layout.etp = 4;  // etp x ep = 4 > tp x dp = 2 ranks
  s = validate_plan_inputs(in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(M + "expert_tensor_parallel_size=4 x expert_model_parallel_size=1"), std::string::npos)
      << s.message();
  // MLA and MoE at tp 2 with sequence parallelism, with ep and whole experts; ETP2 at TP1 plans too, marked
  // not supported yet for an RL step (the rollout's weights).
  for (const char* name : {"deepseek_v2", "deepseek_v3", "qwen2_moe"}) {
    in = inputs_for(golden(name));
    in.layout.tp = in.layout.dp = 2;
    in.layout.ep = 2;
    in.layout.sequence_parallel = true;
    in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 2;
    EXPECT_TRUE(validate_plan_inputs(in)) << name << ": " << validate_plan_inputs(in).message();
    EXPECT_EQ(plan_memory(in).not_supported.size(), 0u) << name;
    in.layout.etp = 1;  // whole experts (kestrel train runs it: tests/scripts/mpi_ep_train.sh)
    EXPECT_TRUE(validate_plan_inputs(in)) << name << ": " << validate_plan_inputs(in).message();
    EXPECT_TRUE(plan_memory(in).not_supported.empty()) << name;
  }
  in = inputs_for(golden("qwen3_moe"));
  in.layout.etp = in.layout.dp = 2;
  in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 2;
  ASSERT_TRUE(validate_plan_inputs(in)) << validate_plan_inputs(in).message();
  EXPECT_EQ(in.layout.edp(), 1);
  EXPECT_TRUE(plan_memory(in).not_supported.empty());
  // Expert parallelism runs with data parallelism: each rank plans half the experts.
  in = inputs_for(golden("deepseek_v3"));
  in.layout.ep = 2;
  in.layout.dp = 2;
  EXPECT_TRUE(validate_plan_inputs(in)) << validate_plan_inputs(in).message();
  const PlanShapes full = plan_shapes(in, 1, 1), half = plan_shapes(in, 1, 1, false, 2);
  int64_t experts = 0;
  for (int64_t i = 0; i < in.model.num_hidden_layers; ++i)
    if (in.model.is_moe_layer(i)) experts += in.model.moe.num_experts * 3 * in.model.hidden_size * in.model.moe.moe_intermediate_size;
  EXPECT_EQ(full.params - half.params, experts / 2);
  in.layout.pp = 3;  // EP x PP runs (a stage per layer of the 3)
  EXPECT_TRUE(validate_plan_inputs(in)) << validate_plan_inputs(in).message();
  in.layout.pp = 1;  // EP x CP: not yet
  in.layout.cp = 2;
  s = validate_plan_inputs(in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("not supported yet: " + M + "expert_model_parallel_size=2 with context_parallel_size=2"),
            std::string::npos) << s.message();
  in.layout.cp = 1;
  in.model.num_hidden_layers = 4;  // EP x PP2 x VPP2 runs (tests/scripts/mpi_ep_train.sh)
  in.layout.pp = 2;
  in.layout.vpp = 2;
  EXPECT_TRUE(validate_plan_inputs(in)) << validate_plan_inputs(in).message();
  for (const char* name : {"qwen3_moe", "deepseek_v2"}) {  // context parallelism: MoE and MLA
    in = inputs_for(golden(name));
    in.layout.cp = 2;
    s = validate_plan_inputs(in);
    ASSERT_FALSE(s.is_ok()) << name;
    EXPECT_NE(s.message().find("not supported yet: " + M + "context_parallel_size=2"), std::string::npos) << s.message();
  }
  in = inputs_for(golden("qwen2"));  // dense
  in.layout.ep = 2;
  s = validate_plan_inputs(in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(M + "expert_model_parallel_size=2 splits the routed experts"), std::string::npos) << s.message();
  for (const char* name : {"deepseek_v2", "qwen3_moe"}) {  // the rollout under tp splits heads and experts
    in = inputs_for(golden(name));
    in.layout.tp = 2;
    in.layout.sequence_parallel = true;
    in.rollout.tp = 2;
    EXPECT_TRUE(validate_plan_inputs(in).is_ok()) << name;
    in.rollout.tp = 32;  // more than the experts' FFN width (16)
    s = validate_plan_inputs(in);
    ASSERT_FALSE(s.is_ok()) << name;
    EXPECT_NE(s.message().find("actor_rollout_ref.rollout.tensor_model_parallel_size=32 must divide"),
              std::string::npos) << s.message();
  }
  // Too small a device: the advice may double tp (dp 4 -> 2), and says to turn sequence parallelism on.
  in = inputs_for(golden("qwen3_moe"));
  in.layout.dp = 4;
  in.batch.train_batch_size = in.batch.ppo_mini_batch_size = 4;
  in.device_memory = 2 << 20;
  bool tp_offered = false;
  for (const PlanAdvice& a : plan_advice(in))
    if (a.change.rfind(M + "tensor_model_parallel_size=2", 0) == 0) {
      tp_offered = true;
      EXPECT_NE(a.change.find(M + "sequence_parallel=true"), std::string::npos) << a.change;
    }
  EXPECT_TRUE(tp_offered);
}

}  // namespace
}  // namespace kestrel::rl
