// The rollout engine on MoE and MLA models (the transformers goldens
// Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, DeepSeek-V3; MLA in the last two, with
// the latent KV cache): greedy output equals a naive full-recompute decode
// with the training forward, and is invariant to prefix caching, chunked
// prefill and preemption (recompute and swap); seeded n > 1 sampling is
// invariant likewise and its logprobs equal the trainer's scoring; the
// routing the engine records for router replay R3 equals a training
// forward's over the same sequence for every computed token, whatever path
// (cache hits, chunks, swaps, recomputes, forks) produced the K/V; bf16
// tracks bf16 scoring, and replaying the recorded routing in the scorer
// brings it closer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/scoring.h"
#include "moe_models.h"
#include "rollout/engine.h"
#include "same_outputs.h"

using namespace kestrel;
using namespace kestrel::rollout;
using namespace kestrel::rollout::testing;

namespace {

EngineConfig base_config() {
  EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = false;
  c.record_routing = true;
  return c;
}

SamplingParams greedy(int64_t max_tokens = 12) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;  // the DeepSeek goldens have EOS ids; every run makes the same number of tokens
  return p;
}

SamplingParams sampled(int64_t n, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 20;
  p.n = n;
  p.seed = seed;
  p.max_tokens = 10;
  p.ignore_eos = true;
  return p;
}

void expect_same_tokens(const RunOut& a, const RunOut& b, const std::string& what, double logprob_tol = 1e-5) {
  expect_same_outputs(a.outs, b.outs, logprob_tol, what);
}

// Max |rollout logprob - trainer logprob| over every sampled token; with
// `replay` the scorer replays the rollout's recorded routing (R3).
double max_logprob_diff(const model::CausalLM& m, const std::vector<RequestOutput>& outs, bool replay = false) {
  double worst = 0;
  for (const auto& o : outs)
    for (const auto& c : o.outputs) {
      std::vector<int32_t> seq = o.prompt_token_ids;
      seq.insert(seq.end(), c.token_ids.begin(), c.token_ids.end());
      model::PackedBatch b = model::pack_sequences({seq});
      if (replay)
        b.routed_experts = Tensor::from_host(c.routed_experts, {int64_t(seq.size()), m.num_moe_layers(),
                                                                m.config().moe.top_k});
      const auto sc = model::score_tokens(m, b);
      const int64_t P = int64_t(o.prompt_token_ids.size());
      for (size_t j = 0; j < c.token_ids.size(); ++j)
        worst = std::max(worst, std::abs(double(c.logprobs[j]) - double(sc.logprob.get(P - 1 + int64_t(j)))));
    }
  return worst;
}

void expect_routing_equals_training(const model::CausalLM& m, const RunOut& r, const std::string& what) {
  int64_t rows = 0;
  EXPECT_EQ(routing_mismatches(m, r.outs, what, &rows), 0) << what << " (" << rows << " rows checked)";
}

}  // namespace

TEST(MoeRollout, GreedyMatchesNaiveFullRecompute) {
  for (const std::string& name : moe_golden_names()) {
    SCOPED_TRACE(name);
    auto m = load_golden(name);
    ASSERT_TRUE(m);
    const auto prompts = moe_prompts();
    const RunOut r = run(*m, base_config(), prompts, {greedy()});
    ASSERT_EQ(r.outs.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(r.outs[i].outputs[0].token_ids, naive_greedy(*m, prompts[i], 12)) << name << " prompt " << i;
      EXPECT_EQ(r.outs[i].outputs[0].finish_reason, "length");
    }
    EXPECT_LE(max_logprob_diff(*m, r.outs), 1e-5) << name;
    expect_routing_equals_training(*m, r, name);
    // Recording changes nothing else, and is off by default (no rows then).
    EngineConfig off = base_config();
    off.record_routing = false;
    const RunOut plain = run(*m, off, prompts, {greedy()});
    expect_same_tokens(r, plain, name + " record_routing off");
    for (const auto& o : plain.outs) EXPECT_TRUE(o.outputs[0].routed_experts.empty());
  }
}

TEST(MoeRollout, GreedyAndRoutingInvariantToCachingChunkingAndPreemption) {
  for (const std::string& name : moe_golden_names()) {
    auto m = load_golden(name);
    ASSERT_TRUE(m);
    const auto prompts = moe_prompts();
    const RunOut base = run(*m, base_config(), prompts, {greedy()});
    {
      EngineConfig c = base_config();
      c.enable_prefix_caching = true;
      const RunOut r = run(*m, c, prompts, {greedy()});
      const std::string what = name + " prefix caching";
      expect_same_tokens(base, r, what);
      // Prompts 0 and 1 share 19 tokens: prompt 1 hits 2 full blocks of 8,
      // whose routing rows prompt 0's forward wrote.
      EXPECT_EQ(r.outs[1].num_cached_prompt_tokens, 16) << what;
      expect_routing_equals_training(*m, r, what);
    }
    for (int64_t budget : {1, 3, 16}) {
      EngineConfig c = base_config();
      c.max_num_batched_tokens = budget;
      c.enable_prefix_caching = budget == 3;
      const RunOut r = run(*m, c, prompts, {greedy()});
      const std::string what = name + " chunked prefill, budget " + std::to_string(budget);
      expect_same_tokens(base, r, what);
      expect_routing_equals_training(*m, r, what);
    }
    {
      EngineConfig c = base_config();
      c.enable_chunked_prefill = false;
      c.max_num_batched_tokens = 32;  // prompts run whole or wait
      expect_same_tokens(base, run(*m, c, prompts, {greedy()}), name + " no chunking");
    }
    for (const char* mode : {"recompute", "swap"}) {
      for (bool caching : {false, true}) {
        EngineConfig c = base_config();
        c.num_blocks = 8;  // 7 usable blocks of 8 for six sequences of up to 39 tokens
        c.preemption_mode = mode;
        c.enable_prefix_caching = caching;
        c.max_num_batched_tokens = 16;
        const RunOut r = run(*m, c, prompts, {greedy()});
        const std::string what = name + " " + mode + (caching ? " + caching" : "");
        expect_same_tokens(base, r, what);
        EXPECT_GT(r.stats.preemptions, 0) << what;
        if (std::string(mode) == "swap") {
          EXPECT_GT(r.stats.swapped_out_blocks, 0) << what;
          EXPECT_EQ(r.stats.swapped_in_blocks, r.stats.swapped_out_blocks) << what;
        }
        expect_routing_equals_training(*m, r, what);
      }
    }
  }
}

TEST(MoeRollout, SeededSamplesInvariantAndScoredAndRouted) {
  for (const std::string& name : moe_golden_names()) {
    auto m = load_golden(name);
    ASSERT_TRUE(m);
    const auto prompts = moe_prompts();
    const std::vector<SamplingParams> ps = {sampled(3, 1), sampled(2, 5), sampled(4, 9)};
    const RunOut base = run(*m, base_config(), prompts, ps);
    ASSERT_EQ(base.outs.size(), prompts.size());
    EXPECT_LE(max_logprob_diff(*m, base.outs), 1e-5) << name;
    expect_routing_equals_training(*m, base, name + " n > 1");
    // n > 1 samples fork the prompt's blocks (a partial last block is copied
    // with its routing rows); caching, small chunks and a tiny cache in both
    // preemption modes give the same samples and the same routing.
    for (const char* mode : {"recompute", "swap"}) {
      EngineConfig c = base_config();
      c.enable_prefix_caching = true;
      c.max_num_batched_tokens = 5;
      c.num_blocks = 12;
      c.preemption_mode = mode;
      const RunOut r = run(*m, c, prompts, ps);
      const std::string what = name + " n > 1, caching, chunks of 5, " + mode;
      expect_same_tokens(base, r, what);
      EXPECT_GT(r.stats.preemptions, 0) << what;
      expect_routing_equals_training(*m, r, what);
    }
  }
}

TEST(MoeRollout, ForkedSampleThatStopsAtOnceKeepsThePromptRouting) {
  // max_tokens 1 with n > 1: each sample ends at its first token, some
  // before they got blocks of their own (a full cache), reading the prompt's
  // rows through the parent's table.
  auto m = load_golden("deepseek_v3");
  ASSERT_TRUE(m);
  SamplingParams p = sampled(4, 3);
  p.max_tokens = 1;
  for (int64_t blocks : {64, 4}) {
    EngineConfig c = base_config();
    c.num_blocks = blocks;  // 4: 3 usable blocks, the 19-token prompt takes all of them
    const RunOut r = run(*m, c, {moe_prompts()[4]}, {p});
    ASSERT_EQ(r.outs.size(), 1u);
    EXPECT_EQ(r.outs[0].outputs.size(), 4u);
    expect_routing_equals_training(*m, r, "max_tokens 1, " + std::to_string(blocks) + " blocks");
  }
}

TEST(MoeRollout, Bf16AsCloseToExactAsBf16ScoringAndReplayRemovesRoutingFlips) {
  // bf16 rounds every op output and the rollout's GEMMs (and MLA's absorbed
  // attention) round at other points than the trainer's, so a near-tie in a
  // router can pick another expert. Judged against exact arithmetic (the f32
  // model replaying the same routing), the rollout's bf16 logprobs must be as
  // close as the trainer's own bf16 scoring is; and replaying the rollout's
  // routing in the bf16 scorer (R3) removes the routing flips' share of the
  // rollout/trainer mismatch. (The goldens' weights are large, init_std 0.2,
  // so bf16's error is larger here than on a trained model.)
  for (const std::string& name : moe_golden_names()) {
    auto m = load_golden(name, DType::BF16, /*bf16_folder=*/true);
    auto exact = load_golden(name, DType::F32, /*bf16_folder=*/true);  // the same bf16 weights, f32 arithmetic
    ASSERT_TRUE(m && exact);
    EngineConfig c = base_config();
    c.enable_prefix_caching = true;
    c.max_num_batched_tokens = 16;
    const RunOut r = run(*m, c, moe_prompts(), {sampled(2, 5)});
    ASSERT_EQ(r.outs.size(), 6u);
    int64_t rows = 0;
    const int64_t flips = routing_mismatches(*m, r.outs, name + " bf16", &rows);
    double rollout_err = 0, scoring_err = 0;  // max |bf16 - exact| of the rollout's and the scorer's logprobs
    for (const auto& o : r.outs)
      for (const auto& cc : o.outputs) {
        std::vector<int32_t> seq = o.prompt_token_ids;
        seq.insert(seq.end(), cc.token_ids.begin(), cc.token_ids.end());
        model::PackedBatch b = model::pack_sequences({seq});
        b.routed_experts = Tensor::from_host(cc.routed_experts, {int64_t(seq.size()), m->num_moe_layers(),
                                                                 m->config().moe.top_k});
        const auto s16 = model::score_tokens(*m, b), s32 = model::score_tokens(*exact, b);
        const int64_t P = int64_t(o.prompt_token_ids.size());
        for (size_t j = 0; j < cc.token_ids.size(); ++j) {
          const double f = s32.logprob.get(P - 1 + int64_t(j));
          rollout_err = std::max(rollout_err, std::abs(double(cc.logprobs[j]) - f));
          scoring_err = std::max(scoring_err, std::abs(double(s16.logprob.get(P - 1 + int64_t(j))) - f));
        }
      }
    const double plain = max_logprob_diff(*m, r.outs), replayed = max_logprob_diff(*m, r.outs, /*replay=*/true);
    std::printf("[ %s bf16 ] routing rows differing from bf16 scoring: %lld of %lld; max |logprob - exact|: rollout "
                "%.4f, bf16 scoring %.4f; max |rollout - bf16 scoring| %.4f, with the recorded routing replayed %.4f\n",
                name.c_str(), (long long)flips, (long long)rows, rollout_err, scoring_err, plain, replayed);
    EXPECT_LE(double(flips), 0.05 * double(rows)) << name;
    EXPECT_LE(rollout_err, 1.25 * scoring_err + 0.01) << name;
    EXPECT_LE(replayed, scoring_err + 0.01) << name;
    EXPECT_LE(replayed, plain + 1e-6) << name;
  }
}

TEST(MoeRollout, RecordRoutingNeedsAMoeModel) {
  model::ModelOptions o;
  auto dense = model::CausalLM::load(kestrel::testing::source_path("tests/golden/models/qwen3"), o);
  ASSERT_TRUE(dense.is_ok());
  EngineConfig c = base_config();
  auto e = Engine::create(**dense, c);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("record_routing"), std::string::npos) << e.status().message();
  c.record_routing = false;
  EXPECT_TRUE(Engine::create(**dense, c).is_ok());
}
