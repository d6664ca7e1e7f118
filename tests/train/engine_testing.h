// Helpers shared by the engine tests of this folder: a tiny Llama, packed
// micro-batches and a token-mean cross-entropy objective.
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "common/testing.h"
#include "model/batch.h"
#include "train/engine.h"

namespace kestrel::train::engine_testing {

inline io::ModelConfig tiny_config() {
  const std::string j = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 24,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "eos_token_id": 1})";
  return io::parse_model_config(j, "test").value();
}

inline std::vector<std::vector<int32_t>> sequences(int n, int salt = 0) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> s;
    for (int t = 0; t < 4 + (i + salt) % 5; ++t) s.push_back(int32_t(2 + (i * 7 + t * 3 + salt) % 22));
    out.push_back(std::move(s));
  }
  return out;
}

inline std::vector<MicroBatch> split(const std::vector<std::vector<int32_t>>& seqs, size_t per) {
  std::vector<MicroBatch> out;
  for (size_t i = 0; i < seqs.size(); i += per) {
    std::vector<std::vector<int32_t>> part(seqs.begin() + long(i), seqs.begin() + long(std::min(seqs.size(), i + per)));
    MicroBatch mb;
    mb.batch = model::pack_sequences(part);
    out.push_back(std::move(mb));
  }
  return out;
}

inline ObjectiveFn mean_nll(const std::vector<std::vector<int32_t>>& seqs) {
  int64_t n = 0;
  for (const auto& s : seqs) n += int64_t(s.size()) - 1;
  const float w = 1.f / float(n);
  return [w](const MicroBatch& mb, size_t) {
    std::vector<float> weights;
    for (int64_t t = 0; t < mb.batch.num_tokens; ++t) weights.push_back(mb.batch.targets.get(t) >= 0 ? w : 0.f);
    Objective o;
    o.tokens = cross_entropy_objective(weights);
    o.need_entropy_grad = false;
    return o;
  };
}

inline EngineOptions options(double clip = 1.0) {
  EngineOptions o;
  o.lr.lr = 1e-2;
  o.lr.total_steps = 10;
  o.clip_grad = clip;
  o.adamw.weight_decay = 0.01;
  return o;
}

// Every weight's raw bits, parameter after parameter (bf16: 2 bytes, f32: 4 bytes per element).
inline std::vector<uint8_t> weight_bytes(model::CausalLM& m) {
  std::vector<uint8_t> out;
  for (const model::Param* p : m.params()) {
    const size_t n = p->weight.nbytes();
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p->weight.raw(), n);
  }
  return out;
}

inline std::vector<uint32_t> f32_bits(const Tensor& t) {
  std::vector<uint32_t> out(size_t(t.numel()));
  std::memcpy(out.data(), t.raw(), out.size() * 4);
  return out;
}

}  // namespace kestrel::train::engine_testing
