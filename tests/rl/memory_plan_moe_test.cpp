// The memory model (rl/memory_plan.h) for mixture-of-experts and latent
// attention models: parameters per layer and per pipeline rank against
// CausalLM, the actor update's allocator peaks on the tiny golden models
// (tests/golden/models/{qwen2_moe,qwen3_moe,deepseek_v2,deepseek_v3}) in f32
// and bf16 under every recompute mode, capacity dropping and padding, the
// KV cache's width, FLOPs per token, and what the plan refuses.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "config/config.h"
#include "core/allocator.h"
#include "parallel/pipeline_layout.h"
#include "rl/memory_plan.h"
#include "rl/rollout_batch.h"
#include "rl/workers/actor_worker.h"

namespace kestrel::rl {
namespace {

size_t cat(MemCategory c) { return size_t(c); }

std::string golden_dir(const std::string& name) {
  return std::string(KESTREL_SOURCE_DIR) + "/tests/golden/models/" + name;
}
io::ModelConfig golden(const std::string& name) { return io::load_model_config(golden_dir(name)).value(); }
io::ModelConfig real_shape(const std::string& name) {
  return io::load_model_config(std::string(KESTREL_SOURCE_DIR) + "/tests/rl/plan_configs/" + name).value();
}

PlanInputs inputs_for(const io::ModelConfig& cfg) {
  PlanInputs in;
  in.model = cfg;
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

// A rollout batch of `prompts` x n full-length sequences, a prompt's samples
// in a row, token ids within the vocabulary.
RolloutBatch full_length_batch(const PlanBatching& b, int64_t prompts, int64_t vocab) {
  RolloutBatch r;
  const int64_t span = vocab - 3;
  for (int64_t g = 0; g < prompts; ++g)
    for (int64_t k = 0; k < b.n; ++k) {
      std::vector<int32_t> p(size_t(b.prompt_len)), resp(size_t(b.response_len));
      for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((g * 31 + int64_t(i)) % span + 3);
      for (size_t i = 0; i < resp.size(); ++i) resp[i] = int32_t((g * 7 + k * 13 + int64_t(i)) % span + 3);
      r.prompts.push_back(p);
      r.responses.push_back(resp);
      r.group.push_back(g);
    }
  r.finalize_layout();
  return r;
}

struct Measured {
  CategoryBytes got{};
  MemoryPlan plan;
};

// One actor update (rl::ActorWorker::update) of a randomly initialised
// model, the allocator's peaks per category against the plan. route_fixed:
// the router weights are zero, so every token ties and takes experts 0..k-1
// (the largest expert group is the whole micro-batch: the plan's bound).
Measured measure_update(PlanInputs in, bool route_fixed) {
  model::ModelOptions mo;
  mo.dtype = in.dtype;
  mo.recompute = in.recompute;
  mo.moe = in.moe;
  mo.max_positions = in.max_positions;
  Measured out;
  out.plan = plan_memory(in);
  Allocator& alloc = cpu_allocator();
  const MemStats before = alloc.stats();
  {
    auto m = model::CausalLM::init_random(in.model, mo, 7);
    if (route_fixed)
      for (model::Param* p : m->params())
        if (p->name.size() > 15 && p->name.compare(p->name.size() - 15, 15, "mlp.gate.weight") == 0) p->weight.zero_();
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
    if (std::getenv("KESTREL_PROBE_ROUTING"))
      for (const auto& l : m->moe_stats().layers) {
        std::printf("layer %lld:", (long long)l.layer);
        for (int64_t t : l.tokens_per_expert) std::printf(" %lld", (long long)t);
        std::printf("\n");
      }
  }
  return out;
}

const char* kNames[] = {"Params", "Grads", "OptimizerState", "Activations", "KVCache", "Other"};

void print(const std::string& what, const Measured& m) {
  const PhasePlan& want = m.plan.phases.back();
  for (size_t c = 0; c < kNumMemCategories; ++c)
    std::printf("  %s %-14s measured %10lld predicted %10lld (%+lld)%s\n", what.c_str(), kNames[c],
                (long long)m.got[c], (long long)want.bytes[c], (long long)(m.got[c] - want.bytes[c]),
                c == cat(MemCategory::Activations) ? (", peak at " + m.plan.actor.at).c_str() : "");
}

struct Mode {
  const char* name;
  PlanRecompute plan;
};
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

// Wider experts and more of them per token: the experts' backward is the peak.
io::ModelConfig wide(io::ModelConfig c) {
  c.moe.top_k = 4;
  c.moe.moe_intermediate_size = 48;
  c.moe.shared_intermediate_size = 0;
  return c;
}

TEST(MemoryPlanMoeProbe, Modes) {
  for (const char* name : {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"})
    for (bool w : {false, true})
      for (DType dt : {DType::F32, DType::BF16})
        for (const Mode& md : modes())
          for (bool fixed : {true, false}) {
            PlanInputs in = inputs_for(w ? wide(golden(name)) : golden(name));
            in.dtype = dt;
            in.recompute = md.plan;
            const Measured m = measure_update(in, fixed);
            const size_t A = cat(MemCategory::Activations);
            std::printf("%s%s %s %s %s: measured %lld predicted %lld (%+lld) at %s\n", name, w ? "+wide" : "",
                        dtype_name(dt), md.name, fixed ? "fixed" : "random", (long long)m.got[A],
                        (long long)m.plan.phases.back().bytes[A], (long long)(m.got[A] - m.plan.phases.back().bytes[A]),
                        m.plan.actor.at.c_str());
          }
}

TEST(MemoryPlanMoeProbe, Scoring) {
  for (const char* name : {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"})
    for (DType dt : {DType::F32, DType::BF16}) {
      if (std::getenv("PROBE_ONLY") && (std::string(std::getenv("PROBE_ONLY")) != name || dt != DType::F32)) continue;
      PlanInputs in = inputs_for(golden(name));
      in.dtype = dt;
      in.batch.train_batch_size = 2;
      in.batch.old_log_prob = true;
      in.batch.log_prob_max_token_len = 300;
      const MemoryPlan plan = plan_memory(in);
      const PhasePlan* want = nullptr;
      for (const auto& ph : plan.phases)
        if (ph.name == "scoring") want = &ph;
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
      RolloutBatch b = full_length_batch(in.batch, in.batch.train_batch_size, in.model.vocab_size);
      alloc.reset_peak();
      actor.compute_log_probs(b);
      const MemStats after = alloc.stats();
      const size_t A = cat(MemCategory::Activations);
      const int64_t got = after.peak[A] - before.live[A];
      std::printf("scoring %s %s: measured %lld predicted %lld (%+.2f%%)\n", name, dtype_name(dt), (long long)got,
                  (long long)want->bytes[A], 100.0 * (double(got) / double(want->bytes[A]) - 1));
    }
}

TEST(MemoryPlanMoeProbe, Print) {
  for (const char* name : {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"})
    for (DType dt : {DType::F32, DType::BF16})
      for (bool fixed : {true, false}) {
        PlanInputs in = inputs_for(golden(name));
        in.dtype = dt;
        print(std::string(name) + " " + dtype_name(dt) + (fixed ? " fixed" : " random"), measure_update(in, fixed));
      }
}

}  // namespace
}  // namespace kestrel::rl
