// The rollout's packed weights (rollout/decode_linear.h WeightPacks): steps
// past the skinny size multiply by weights packed once per weight version.
// Outputs equal the unpacked engine's (to f32 rounding: same tokens); a
// weight update repacks, and so does a change nobody announced (the
// fingerprint guard); sleep frees the packs. Scoring passes multiply by
// packs too (model::ForwardPacksScope), the rollout's when they share the
// weights (a training mini-batch's: tests/train/packed_training_test.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "backend/cpu/packed_linear.h"
#include "common/testing.h"
#include "model/scoring.h"
#include "rollout/engine.h"
#include "same_outputs.h"
#include "tiny_model.h"

using namespace kestrel;
using namespace kestrel::rollout;
using rollout::testing::tiny_model;
using rollout::testing::tiny_prompts;

namespace {

using EnvScope = kestrel::testing::ScopedEnv;

// An in-place update of a weight, as an optimizer step makes (every element moves).
void scale(model::Param* p, float s) {
  ASSERT_NE(p, nullptr);
  for (int64_t i = 0; i < p->weight.numel(); ++i) p->weight.set(i, p->weight.get(i) * s);
}

EngineConfig config() {
  EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 128;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = false;
  return c;
}

SamplingParams greedy_n(int64_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 16;
  p.n = n;
  return p;
}

struct Generated {
  std::vector<RequestOutput> outs;
  EngineStats stats;
};

// Every tiny prompt, 8 greedy samples each: decode steps of ~48 rows and
// prefill chunks of up to 256 take the packed path.
Generated generate(Engine& e, const std::string& tag) {
  const auto prompts = tiny_prompts();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_TRUE(e.add_request(tag + std::to_string(i), prompts[i], greedy_n(8)).is_ok());
  Generated r;
  r.outs = e.run_to_completion();
  r.stats = e.stats();
  return r;
}

Generated generate(const model::CausalLM& m, const std::string& tag = "r") {
  auto e = Engine::create(m, config());
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return generate(**e, tag);
}

void expect_same(const Generated& a, const Generated& b, double logprob_tol, const std::string& what) {
  rollout::testing::expect_same_outputs(a.outs, b.outs, logprob_tol, what);
}

class PackedWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::packed_linear_enabled(&why_)) GTEST_SKIP() << "packing is off here: " << why_;
  }
  // The packed path whatever this machine's f32 verdict (cpu::packed_f32_verdict).
  EnvScope packed_{"KESTREL_PACKED_WEIGHTS", "1"};
  std::string why_;
};

TEST_F(PackedWeights, OutputsEqualTheUnpackedEngine) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto m = tiny_model(/*qwen3=*/true, dt);
    const Generated packed = generate(*m);
    // bf16 is packed only where oneDNN multiplies it fast (AVX-512).
    const bool packs = cpu::packed_linear_bytes(64, 64, dt) > 0;
    EXPECT_EQ(packed.stats.packed_weights > 0, packs);
    EXPECT_EQ(packed.stats.packed_weight_bytes > 0, packs);
    EXPECT_EQ(packed.stats.stale_weight_repacks, 0);
    Generated plain;
    {
      EnvScope off("KESTREL_PACKED_WEIGHTS", "0");
      plain = generate(*m);
    }
    EXPECT_EQ(plain.stats.packed_weights, 0);
    // f32: the same sums in another order (measured here: 2e-6). bf16: every
    // product exact in f32 and y rounded to bf16 once on both paths, but
    // another summation order can round a bf16 logit one ulp apart: 2^-8
    // relative, 0.04 at the tiny model's largest logits (|z| < 10), which a
    // log-prob follows (measured here: 2e-6, no flip).
    expect_same(packed, plain, dt == DType::F32 ? 2e-5 : 5e-2, "packed vs unpacked");
  }
}

// The trainer's update, announced: the packs of the old weights go, and the
// next steps pack the new ones (bit for bit what a fresh engine computes).
TEST_F(PackedWeights, AnnouncedUpdateRepacks) {
  auto m = tiny_model();
  auto e = Engine::create(*m, config());
  ASSERT_TRUE(e.is_ok());
  const Generated before = generate(**e, "a");
  ASSERT_GT(before.stats.packed_weights, 0);
  scale(m->find_param("model.layers.0.mlp.down_proj.weight"), 0.5f);
  scale(m->find_param("model.layers.1.self_attn.q_proj.weight"), -1.0f);
  (*e)->update_weights_version();
  EXPECT_EQ((*e)->stats().packed_weights, 0);
  EXPECT_EQ((*e)->stats().packed_weight_bytes, 0);
  const Generated after = generate(**e, "b");
  EXPECT_EQ(after.stats.stale_weight_repacks, 0);
  EXPECT_GT(after.stats.packed_weights, 0);
  expect_same(after, generate(*m, "b"), 0.0, "after the update vs a fresh engine");
}

// A change nobody announced (a caller's bug) is caught by the weight's
// fingerprint: the engine repacks and counts it instead of multiplying by
// stale weights.
TEST_F(PackedWeights, UnannouncedChangeIsCaughtAndRepacked) {
  auto m = tiny_model();
  auto e = Engine::create(*m, config());
  ASSERT_TRUE(e.is_ok());
  generate(**e, "a");
  scale(m->find_param("model.layers.1.mlp.gate_proj.weight"), 0.25f);
  const Generated after = generate(**e, "b");
  EXPECT_GE(after.stats.stale_weight_repacks, 1);
  expect_same(after, generate(*m, "b"), 0.0, "after the silent change vs a fresh engine");
}

TEST_F(PackedWeights, SleepFreesThePacks) {
  auto m = tiny_model();
  auto e = Engine::create(*m, config());
  ASSERT_TRUE(e.is_ok());
  const int64_t params_before = cpu_allocator().stats().live_of(MemCategory::Params);
  const Generated r = generate(**e, "a");
  ASSERT_GT(r.stats.packed_weight_bytes, 0);
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::Params) - params_before, r.stats.packed_weight_bytes);
  (*e)->sleep();
  EXPECT_EQ((*e)->stats().packed_weights, 0);
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::Params), params_before);
  (*e)->wake_up();
}

// Sequences of the tiny prompts with a few continuation tokens: 45-61 rows each.
model::PackedBatch scoring_batch() {
  std::vector<std::vector<int32_t>> seqs;
  for (auto p : tiny_prompts()) {
    for (int32_t t = 0; t < 11; ++t) p.push_back((t * 37 + 5) % 128);
    seqs.push_back(p);
  }
  return model::pack_sequences(seqs);
}

TEST_F(PackedWeights, ScoringThroughPacksMatchesPlainScoring) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto m = tiny_model(/*qwen3=*/true, dt);
    const model::PackedBatch b = scoring_batch();
    const model::TokenScores plain = model::score_tokens(*m, b);
    cpu::WeightPacks packs;
    model::TokenScores packed;
    {
      model::ForwardPacksScope scope(*m, &packs);
      packed = model::score_tokens(*m, b);
    }
    EXPECT_EQ(m->forward_packs(), nullptr);  // the scope ended
    EXPECT_EQ(packs.count() > 0, cpu::packed_linear_bytes(64, 64, dt) > 0);
    // The same tolerance argument as the engine's (f32: summation order; bf16:
    // one bf16 rounding flip of a logit). Measured here: 0 and 9e-5.
    const double tol = dt == DType::F32 ? 2e-5 : 5e-2;
    for (int64_t i = 0; i < b.num_tokens - 1; ++i)
      ASSERT_NEAR(packed.logprob.get(i), plain.logprob.get(i), tol) << "token " << i;
  }
}

// The actor's scoring after a rollout over the same weights multiplies by
// the engine's packs: nothing is packed again. That it consults them shows
// when a weight changes unannounced: the scoring repacks that one (counted)
// and scores what plain scoring of the new weights gives.
TEST_F(PackedWeights, ScoringSharesTheEnginesPacks) {
  auto m = tiny_model();
  auto e = Engine::create(*m, config());
  ASSERT_TRUE(e.is_ok());
  generate(**e, "a");
  cpu::WeightPacks& packs = (*e)->weight_packs();
  const int64_t count = packs.count(), bytes = packs.bytes();
  ASSERT_GT(count, 0);
  {
    model::ForwardPacksScope scope(*m, &packs);
    model::score_tokens(*m, scoring_batch());
  }
  EXPECT_EQ(packs.count(), count);
  EXPECT_EQ(packs.bytes(), bytes);
  EXPECT_EQ(packs.stale_repacks(), 0);

  scale(m->find_param("model.layers.0.mlp.up_proj.weight"), 0.5f);
  const model::TokenScores plain = model::score_tokens(*m, scoring_batch());
  model::TokenScores shared;
  {
    model::ForwardPacksScope scope(*m, &packs);
    shared = model::score_tokens(*m, scoring_batch());
  }
  EXPECT_EQ(packs.stale_repacks(), 1);
  EXPECT_EQ(packs.count(), count);
  for (int64_t i = 0; i < shared.logprob.numel(); ++i)
    ASSERT_NEAR(shared.logprob.get(i), plain.logprob.get(i), 2e-5) << "token " << i;
}

}  // namespace
