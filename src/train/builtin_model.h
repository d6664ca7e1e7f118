// Built-in model configurations and a materialiser for them, so `kestrel sft`
// and the RL trainer run with nothing downloaded: an HF folder with
// config.json, random-initialised model.safetensors and the tokenizer files.
//   tiny:  hidden 128, 4 layers, 4 heads (2 kv), ffn 384   (~0.9M params at vocab 512)
//   small: hidden 512, 8 layers, 8 heads (2 kv), ffn 1536  (~25M params at vocab 512)
// Both are LlamaForCausalLM with tied embeddings.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace kestrel::train {

const std::vector<std::string>& builtin_model_names();  // {"tiny", "small"}

// The config for `name` with the tokenizer's vocab size and special ids.
Result<io::ModelConfig> builtin_model_config(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                             int64_t max_positions = 1024);

// Writes dir/config.json, dir/model.safetensors (f32, CausalLM::init_random
// with `seed`, std 0.02) and every (file name -> content) of extra_files
// (tokenizer.json, tokenizer_config.json, ...). Each file is written atomically.
Status materialize_model(const std::string& dir, const io::ModelConfig& cfg,
                         const std::map<std::string, std::string>& extra_files, uint64_t seed);

}  // namespace kestrel::train
