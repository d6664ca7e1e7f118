// The MoE/MLA golden models (tests/golden/models/{qwen2_moe, qwen3_moe,
// deepseek_v2, deepseek_v3}[_bf16], from transformers: hidden 32, 3 layers,
// 8 experts, vocab 96, 64 positions) and prompts for the rollout tests, with
// the references the engine is compared against: a naive greedy decode that
// reruns the training forward over the whole sequence for every token, and
// the routing a training forward over a finished sequence records.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/testing.h"
#include "model/transformer.h"
#include "rollout/engine.h"

namespace kestrel::rollout::testing {

inline const std::vector<std::string>& moe_golden_names() {
  static const std::vector<std::string> names = {"qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"};
  return names;
}

// The f32 folder, or with bf16_folder the bf16 one (the f32 draw rounded), in compute dtype dt.
inline std::unique_ptr<model::CausalLM> load_golden(const std::string& name, DType dt = DType::F32,
                                                    bool bf16_folder = false) {
  model::ModelOptions o;
  o.dtype = dt;
  const std::string dir = kestrel::testing::source_path("tests/golden/models/" + name + (bf16_folder ? "_bf16" : ""));
  auto m = model::CausalLM::load(dir, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Six prompts over the 96-token vocabulary; prompts 0 and 1 share 19 tokens
// (two full blocks of 8 and a partial one), so prefix caching has hits. With
// 12 new tokens every sequence stays within the goldens' 64 positions.
inline std::vector<std::vector<int32_t>> moe_prompts() {
  std::vector<std::vector<int32_t>> ps;
  uint64_t x = 4242;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return int32_t(3 + (x >> 33) % 93);
  };
  std::vector<int32_t> shared;
  for (int i = 0; i < 19; ++i) shared.push_back(next());
  const int lens[] = {23, 27, 5, 8, 17, 1};
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = i < 2 ? shared : std::vector<int32_t>{};
    while (int(p.size()) < lens[i]) p.push_back(next());
    ps.push_back(p);
  }
  return ps;
}

inline int32_t argmax_last_row(const Tensor& logits) {
  const int64_t V = logits.size(1), last = logits.size(0) - 1;
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (logits.get(last * V + v) > logits.get(last * V + best)) best = int32_t(v);
  return best;
}

// Greedy continuation by the training forward over the whole sequence so far, token by token.
inline std::vector<int32_t> naive_greedy(const model::CausalLM& m, std::vector<int32_t> seq, int64_t new_tokens) {
  const size_t prompt = seq.size();
  for (int64_t i = 0; i < new_tokens; ++i) seq.push_back(argmax_last_row(m.forward_inference(model::pack_sequences({seq}))));
  return std::vector<int32_t>(seq.begin() + int64_t(prompt), seq.end());
}

// The routing a training forward over `seq` records: i32 [L, n_moe_layers, k] flattened.
inline std::vector<int32_t> training_routing(const model::CausalLM& m, const std::vector<int32_t>& seq) {
  model::PackedBatch b = model::pack_sequences({seq});
  Tensor rec = Tensor::empty({int64_t(seq.size()), m.num_moe_layers(), m.config().moe.top_k}, DType::I32);
  b.record_routing = &rec;
  m.forward_inference(b);
  return rec.to_host<int32_t>();
}

// Rows (tokens x MoE layers) whose recorded experts differ from a training
// forward's over the finished sequence, over every completion of `outs`;
// the last token's row must be all -1 (never fed), which is checked here.
inline int64_t routing_mismatches(const model::CausalLM& m, const std::vector<RequestOutput>& outs,
                                  const std::string& what, int64_t* rows_checked = nullptr) {
  const int64_t nm = m.num_moe_layers(), k = m.config().moe.top_k;
  int64_t bad = 0;
  for (const RequestOutput& o : outs)
    for (const CompletionOutput& c : o.outputs) {
      std::vector<int32_t> seq = o.prompt_token_ids;
      seq.insert(seq.end(), c.token_ids.begin(), c.token_ids.end());
      const int64_t L = int64_t(seq.size());
      EXPECT_EQ(int64_t(c.routed_experts.size()), L * nm * k) << what << ": request " << o.request_id;
      if (int64_t(c.routed_experts.size()) != L * nm * k) return -1;
      const std::vector<int32_t> want = training_routing(m, seq);
      for (int64_t r = 0; r < (L - 1) * nm; ++r)
        if (!std::equal(want.begin() + r * k, want.begin() + (r + 1) * k, c.routed_experts.begin() + r * k)) ++bad;
      for (int64_t j = (L - 1) * nm * k; j < L * nm * k; ++j)
        EXPECT_EQ(c.routed_experts[size_t(j)], -1) << what << ": the last token's row must be -1";
      if (rows_checked) *rows_checked += (L - 1) * nm;
    }
  return bad;
}

}  // namespace kestrel::rollout::testing
