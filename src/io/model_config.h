// HF config.json for decoder-only models, parsed and validated. Every error
// names the file and the key, and says what would fix it.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/rope.h"

namespace kestrel::io {

enum class Arch { Llama, Qwen2, Qwen3, Mistral };
const char* arch_name(Arch a);  // the HF class name, e.g. "Qwen2ForCausalLM"

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string model_type;  // "llama", "qwen2", ...
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // from config or hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have bias (Qwen2: always)
  bool o_proj_bias = false;     // o_proj has bias: Llama/Qwen3 follow attention_bias, Qwen2/Mistral never
  bool mlp_bias = false;
  bool qk_norm = false;         // Qwen3: RMSNorm on q and k per head
  std::string hidden_act = "silu";
  int64_t sliding_window = 0;   // 0 = none; non-zero and in use -> not supported yet
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";
  ops::RopeConfig rope;         // head_dim, theta, scaling

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // Parameter count of the HF model (embeddings, lm_head when untied, biases, norms).
  int64_t num_parameters() const;
};

// Parses config.json text; `origin` (a path) prefixes every error message.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& origin);
Result<ModelConfig> load_model_config(const std::string& path);  // a file or a folder holding config.json
// The config.json transformers would write for this config (round-trips through parse).
std::string model_config_to_json(const ModelConfig& cfg);

}  // namespace kestrel::io
