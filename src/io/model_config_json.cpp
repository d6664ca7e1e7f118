// ModelConfig -> config.json text, as transformers' save_pretrained writes it
// (model_config.h's model_config_to_json); the parsing side is model_config.cpp.
#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace kestrel::io {

using json = nlohmann::json;

namespace {

// The keys of a llama3 or yarn scaling, in transformers' order (both the
// rope_parameters of transformers 5 and the older rope_scaling carry them).
template <class Json>
void add_rope_type_keys(Json& s, const ops::RopeConfig& r) {
  if (r.scaling_type == "llama3") {
    s["low_freq_factor"] = r.low_freq_factor;
    s["high_freq_factor"] = r.high_freq_factor;
    s["original_max_position_embeddings"] = r.original_max_position;
  } else if (r.scaling_type == "yarn") {
    s["original_max_position_embeddings"] = r.original_max_position;
    s["beta_fast"] = r.beta_fast;
    s["beta_slow"] = r.beta_slow;
    if (r.attention_factor != 0.0) s["attention_factor"] = r.attention_factor;
    if (r.mscale != 0.0) s["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0.0) s["mscale_all_dim"] = r.mscale_all_dim;
  }
}

// transformers 5's rope_parameters: rope_theta and rope_type, then the keys of the type.
json rope_parameters_json(const ops::RopeConfig& r) {
  json s;
  s["rope_theta"] = r.theta;
  s["rope_type"] = r.scaling_type.empty() ? "default" : r.scaling_type;
  if (r.scaling_type == "linear" || r.scaling_type == "llama3" || r.scaling_type == "yarn") s["factor"] = r.factor;
  add_rope_type_keys(s, r);
  return s;
}

json token_id_json(int64_t id) { return id >= 0 ? json(id) : json(nullptr); }

// save_pretrained's config.json of Qwen2Moe/Qwen3Moe/DeepseekV2/DeepseekV3Config: its keys sorted (json's
// std::map, as json.dumps(sort_keys=True)), the ones Kestrel does not keep at their class defaults.
std::string moe_config_to_json(const ModelConfig& cfg) {
  const MoeConfig& m = cfg.moe;
  json j;
  j["architectures"] = {arch_name(cfg.arch)};
  j["model_type"] = cfg.model_type.empty() ? default_model_type(cfg.arch) : cfg.model_type;
  j["dtype"] = cfg.torch_dtype;
  j["vocab_size"] = cfg.vocab_size;
  j["hidden_size"] = cfg.hidden_size;
  j["intermediate_size"] = cfg.intermediate_size;
  j["num_hidden_layers"] = cfg.num_hidden_layers;
  j["num_attention_heads"] = cfg.num_attention_heads;
  j["num_key_value_heads"] = cfg.num_key_value_heads;
  j["max_position_embeddings"] = cfg.max_position_embeddings;
  j["rms_norm_eps"] = cfg.rms_norm_eps;
  j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  j["hidden_act"] = cfg.hidden_act;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["pad_token_id"] = nullptr;
  j["bos_token_id"] = token_id_json(cfg.bos_token_id);
  if (cfg.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else if (cfg.eos_token_ids.size() == 1) j["eos_token_id"] = cfg.eos_token_ids[0];
  else j["eos_token_id"] = cfg.eos_token_ids;
  j["rope_parameters"] = rope_parameters_json(cfg.rope);
  j["output_router_logits"] = false;
  j["num_experts_per_tok"] = m.top_k;
  j["moe_intermediate_size"] = m.moe_intermediate_size;
  j["norm_topk_prob"] = m.norm_topk_prob;
  if (is_qwen_moe(cfg.arch)) {
    // head_dim is no field of these classes: HF writes it only when the config.json it came from had it.
    if (cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size) j["head_dim"] = cfg.head_dim;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    j["router_aux_loss_coef"] = m.router_aux_loss_coef;
    j["use_sliding_window"] = false;
  }
  if (cfg.arch == Arch::Qwen2Moe) {
    j["num_experts"] = m.num_experts;
    j["shared_expert_intermediate_size"] = m.shared_intermediate_size;
    j["qkv_bias"] = cfg.attention_bias;
    j["sliding_window"] = 0;  // Qwen2MoeConfig: 0 unless use_sliding_window
    j["max_window_layers"] = 28;
    j["layer_types"] = std::vector<std::string>(size_t(cfg.num_hidden_layers), "full_attention");
  } else if (cfg.arch == Arch::Qwen3Moe) {
    j["num_local_experts"] = m.num_experts;  // Qwen3MoeConfig's attribute_map saves num_experts so
    j["attention_bias"] = cfg.attention_bias;
    j["sliding_window"] = nullptr;
  } else {
    const MlaConfig& a = cfg.mla;
    const bool grouped = m.group_limit != MoeConfig::GroupLimit::None || m.n_group != 1 || m.topk_group != 1;
    j["attention_bias"] = cfg.attention_bias;
    j["first_k_dense_replace"] = m.first_k_dense_replace;
    j["head_dim"] = a.qk_rope_head_dim;
    j["qk_head_dim"] = a.qk_head_dim();
    j["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = a.kv_lora_rank;
    j["qk_nope_head_dim"] = a.qk_nope_head_dim;
    j["qk_rope_head_dim"] = a.qk_rope_head_dim;
    j["v_head_dim"] = a.v_head_dim;
    j["n_routed_experts"] = m.num_experts;
    j["n_shared_experts"] = m.moe_intermediate_size > 0 ? m.shared_intermediate_size / m.moe_intermediate_size : 0;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
    j["n_group"] = grouped || cfg.arch == Arch::DeepseekV3 ? json(m.n_group) : json(nullptr);
    j["topk_group"] = grouped || cfg.arch == Arch::DeepseekV3 ? json(m.topk_group) : json(nullptr);
    j["pretraining_tp"] = 1;
    if (m.router_aux_loss_coef != 0.0) j["aux_loss_alpha"] = m.router_aux_loss_coef;
    if (cfg.arch == Arch::DeepseekV2) {
      j["mlp_bias"] = cfg.mlp_bias;
      j["topk_method"] = m.group_limit == MoeConfig::GroupLimit::Max ? "group_limited_greedy" : "greedy";
    } else {
      j["rope_interleave"] = a.rope_interleave;
      j["num_nextn_predict_layers"] = 1;  // MTP modules: HF builds none (it skips their weights on load)
    }
  }
  return j.dump(2) + "\n";
}

}  // namespace

std::string model_config_to_json(const ModelConfig& cfg) {
  if (is_qwen_moe(cfg.arch) || is_deepseek(cfg.arch)) return moe_config_to_json(cfg);
  nlohmann::ordered_json j;
  j["architectures"] = {arch_name(cfg.arch)};
  j["model_type"] = cfg.model_type.empty() ? default_model_type(cfg.arch) : cfg.model_type;
  j["torch_dtype"] = cfg.torch_dtype;
  j["vocab_size"] = cfg.vocab_size;
  j["hidden_size"] = cfg.hidden_size;
  j["intermediate_size"] = cfg.intermediate_size;
  j["num_hidden_layers"] = cfg.num_hidden_layers;
  j["num_attention_heads"] = cfg.num_attention_heads;
  j["num_key_value_heads"] = cfg.num_key_value_heads;
  j["head_dim"] = cfg.head_dim;
  j["max_position_embeddings"] = cfg.max_position_embeddings;
  j["rms_norm_eps"] = cfg.rms_norm_eps;
  j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  j["hidden_act"] = cfg.hidden_act;
  if (cfg.arch == Arch::Llama || cfg.arch == Arch::Qwen3) j["attention_bias"] = cfg.attention_bias;
  if (cfg.arch == Arch::Llama) j["mlp_bias"] = cfg.mlp_bias;
  j["attention_dropout"] = 0.0;
  if (cfg.arch == Arch::Qwen2 || cfg.arch == Arch::Qwen3) j["use_sliding_window"] = false;
  if (cfg.arch != Arch::Llama) j["sliding_window"] = nullptr;
  j["bos_token_id"] = cfg.bos_token_id >= 0 ? nlohmann::ordered_json(cfg.bos_token_id) : nullptr;
  if (cfg.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else if (cfg.eos_token_ids.size() == 1) j["eos_token_id"] = cfg.eos_token_ids[0];
  else j["eos_token_id"] = cfg.eos_token_ids;
  j["rope_theta"] = cfg.rope.theta;
  const auto& r = cfg.rope;
  if (r.scaling_type == "default" || r.scaling_type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json s;
    s["rope_type"] = r.scaling_type;
    s["factor"] = r.factor;
    add_rope_type_keys(s, r);
    j["rope_scaling"] = s;
  }
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace kestrel::io
