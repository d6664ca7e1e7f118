// A tiny random Llama/Qwen3 for the rollout tests: hidden 64, 2 layers, 4
// heads, 2 kv heads (GQA), vocab 128. init_std 0.1 makes the next-token
// distributions peaked enough that greedy paths have no near-ties.
#pragma once
#include <memory>
#include <vector>

#include "io/model_config.h"
#include "model/transformer.h"

namespace kestrel::rollout::testing {

inline io::ModelConfig tiny_config(bool qwen3 = false) {
  io::ModelConfig c;
  c.arch = qwen3 ? io::Arch::Qwen3 : io::Arch::Llama;
  c.model_type = qwen3 ? "qwen3" : "llama";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.qk_norm = qwen3;
  c.attention_bias = false;
  c.eos_token_ids = {};
  c.rope.head_dim = 16;
  c.rope.theta = 10000.0;
  return c;
}

inline std::unique_ptr<model::CausalLM> tiny_model(bool qwen3 = false, DType dt = DType::F32, uint64_t seed = 7) {
  model::ModelOptions o;
  o.dtype = dt;
  return model::CausalLM::init_random(tiny_config(qwen3), o, seed, 0.1);
}

// Deterministic pseudo-random prompts; prompts 0 and 1 share a 37-token prefix
// (two full blocks of 16 and a partial one) so prefix caching has hits.
inline std::vector<std::vector<int32_t>> tiny_prompts() {
  std::vector<std::vector<int32_t>> ps;
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return int32_t((x >> 33) % 128);
  };
  std::vector<int32_t> shared;
  for (int i = 0; i < 37; ++i) shared.push_back(next());
  const int lens[] = {45, 50, 7, 16, 33, 1};
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = i < 2 ? shared : std::vector<int32_t>{};
    while (int(p.size()) < lens[i]) p.push_back(next());
    ps.push_back(p);
  }
  return ps;
}

}  // namespace kestrel::rollout::testing
