#include "train/builtin_model.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "model/transformer.h"

namespace kestrel::train {

namespace {

using json = nlohmann::ordered_json;

// The keys every built-in model shares.
json common_keys(const char* arch, const char* type, int64_t vocab_size, int64_t eos_id, int64_t max_positions) {
  return {{"architectures", {arch}},
          {"model_type", type},
          {"vocab_size", vocab_size},
          {"max_position_embeddings", max_positions},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"bos_token_id", nullptr},
          {"eos_token_id", eos_id},
          {"torch_dtype", "float32"}};
}

json dense_json(int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn, json j) {
  j.update({{"hidden_size", hidden},
            {"intermediate_size", ffn},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv},
            {"head_dim", hidden / heads},
            {"tie_word_embeddings", true},
            {"mlp_bias", false}});
  return j;
}

// Every layer MoE (decoder_sparse_step 1): 8 experts, top-2, normalised (Qwen3-MoE's own settings, scaled down).
json qwen3_moe_json(json j) {
  j.update({{"hidden_size", 128},
            {"intermediate_size", 384},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 32},
            {"tie_word_embeddings", false},
            {"num_experts", 8},
            {"num_experts_per_tok", 2},
            {"moe_intermediate_size", 96},
            {"norm_topk_prob", true},
            {"decoder_sparse_step", 1},
            {"mlp_only_layers", json::array()},
            {"router_aux_loss_coef", 0.001},
            {"use_sliding_window", false},
            {"sliding_window", nullptr}});
  return j;
}

// DeepSeek-V3's structure at the tiny size: MLA, a dense first layer, grouped sigmoid routing with the
// correction bias (noaux_tc), one shared expert, the routed scaling factor.
json deepseek_v3_json(json j) {
  j.update({{"hidden_size", 128},
            {"intermediate_size", 384},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 4},
            {"tie_word_embeddings", false},
            {"q_lora_rank", 64},
            {"kv_lora_rank", 32},
            {"qk_nope_head_dim", 32},
            {"qk_rope_head_dim", 16},
            {"v_head_dim", 32},
            {"rope_interleave", true},
            {"first_k_dense_replace", 1},
            {"moe_layer_freq", 1},
            {"n_routed_experts", 8},
            {"n_shared_experts", 1},
            {"num_experts_per_tok", 2},
            {"moe_intermediate_size", 96},
            {"n_group", 4},
            {"topk_group", 2},
            {"norm_topk_prob", true},
            {"routed_scaling_factor", 2.5},
            {"scoring_func", "sigmoid"},
            {"topk_method", "noaux_tc"}});
  return j;
}

}  // namespace

const std::vector<std::string>& builtin_model_names() {
  static const std::vector<std::string> n = {"tiny", "small", "tiny-qwen3-moe", "tiny-deepseek-v3"};
  return n;
}

Result<std::string> builtin_model_config_json(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                              int64_t max_positions) {
  // Built through config.json text so every derived field (head_dim, rope) is
  // filled exactly as for a downloaded model.
  if (name == "tiny")
    return dense_json(128, 4, 4, 2, 384,
                      common_keys("LlamaForCausalLM", "llama", vocab_size, eos_id, max_positions)).dump(2);
  if (name == "small")
    return dense_json(512, 8, 8, 2, 1536,
                      common_keys("LlamaForCausalLM", "llama", vocab_size, eos_id, max_positions)).dump(2);
  if (name == "tiny-qwen3-moe")
    return qwen3_moe_json(common_keys("Qwen3MoeForCausalLM", "qwen3_moe", vocab_size, eos_id, max_positions)).dump(2);
  if (name == "tiny-deepseek-v3")
    return deepseek_v3_json(common_keys("DeepseekV3ForCausalLM", "deepseek_v3", vocab_size, eos_id, max_positions))
        .dump(2);
  std::string names;
  for (const auto& n : builtin_model_names()) names += (names.empty() ? "" : ", ") + n;
  return KS_ERR("unknown built-in model '", name, "' (built-in models: ", names, ")");
}

Result<io::ModelConfig> builtin_model_config(const std::string& name, int64_t vocab_size, int64_t eos_id,
                                             int64_t max_positions) {
  KS_ASSIGN(const std::string text, builtin_model_config_json(name, vocab_size, eos_id, max_positions));
  return io::parse_model_config(text, "built-in model '" + name + "'");
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
