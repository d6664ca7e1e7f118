#include "train/builtin_model.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "model/transformer.h"

namespace kestrel::train {

const std::vector<std::string>& builtin_model_names() {
  static const std::vector<std::string> n = {"tiny", "small"};
  return n;
}

Result<io::ModelConfig> builtin_model_config(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                             int64_t max_positions) {
  int64_t hidden, layers, heads, kv, ffn;
  if (name == "tiny") {
    hidden = 128, layers = 4, heads = 4, kv = 2, ffn = 384;
  } else if (name == "small") {
    hidden = 512, layers = 8, heads = 8, kv = 2, ffn = 1536;
  } else {
    return KS_ERR("unknown built-in model '", name, "' (built-in models: tiny, small)");
  }
  // Built through config.json text so every derived field (head_dim, rope) is
  // filled exactly as for a downloaded model.
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", vocab_size},
                      {"hidden_size", hidden},
                      {"intermediate_size", ffn},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", heads},
                      {"num_key_value_heads", kv},
                      {"head_dim", hidden / heads},
                      {"max_position_embeddings", max_positions},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", true},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"bos_token_id", nullptr},
                      {"eos_token_id", eos_id},
                      {"torch_dtype", "float32"}};
  return io::parse_model_config(j.dump(), "built-in model '" + name + "'");
}

Status materialize_model(const std::string& dir, const io::ModelConfig& cfg,
                         const std::map<std::string, std::string>& extra_files, uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create the model folder: ", ec.message());
  auto m = model::CausalLM::init_random(cfg, model::ModelOptions{}, seed);
  KS_TRY(m->save(dir, DType::F32));
  for (const auto& [name, content] : extra_files) KS_TRY(write_file_atomic(dir + "/" + name, content));
  return Status::ok();
}

}  // namespace kestrel::train
