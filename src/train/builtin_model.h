// Built-in model configurations and a materialiser for them, so `kestrel sft`
// and the RL trainer run with nothing downloaded: an HF folder with
// config.json, random-initialised model.safetensors and the tokenizer files.
//   tiny:  hidden 128, 4 layers, 4 heads (2 kv), ffn 384   (~0.9M params at vocab 512)
//   small: hidden 512, 8 layers, 8 heads (2 kv), ffn 1536  (~25M params at vocab 512)
// Both are LlamaForCausalLM with tied embeddings. Two mixture-of-experts
// models try the MoE/MLA paths at the tiny size:
//   tiny-qwen3-moe:    Qwen3MoeForCausalLM, hidden 128, 4 layers (all MoE), 4 heads (2 kv, q/k norms),
//                      8 experts of width 96, top-2 (normalised softmax)
//   tiny-deepseek-v3:  DeepseekV3ForCausalLM, hidden 128, 4 layers (layer 0 dense, 1-3 MoE), multi-head
//                      latent attention (4 heads, q_lora 64, kv_lora 32, nope 32 + rope 16, v 32),
//                      8 routed experts of width 96 in 4 groups (top-2 groups), top-2 sigmoid routing with
//                      the e_score_correction_bias, one shared expert
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace kestrel::train {

// {"tiny", "small", "tiny-qwen3-moe", "tiny-deepseek-v3"}
const std::vector<std::string>& builtin_model_names();

// The config for `name` with the tokenizer's vocab size and special ids.
Result<io::ModelConfig> builtin_model_config(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                             int64_t max_positions = 1024);
// Its config.json text (what builtin_model_config parses).
Result<std::string> builtin_model_config_json(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                              int64_t max_positions = 1024);

// Writes dir/config.json, dir/model.safetensors (f32, CausalLM::init_random
// with `seed`, std 0.02) and every (file name -> content) of extra_files
// (tokenizer.json, tokenizer_config.json, ...). Each file is written atomically.
Status materialize_model(const std::string& dir, const io::ModelConfig& cfg,
                         const std::map<std::string, std::string>& extra_files, uint64_t seed);

}  // namespace kestrel::train
