// HF config.json parsing with the defaults of transformers' config classes
// (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig, Qwen2MoeConfig,
// Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config; checked against
// transformers 5.x, which also reads the 4.x keys rope_theta/rope_scaling).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/model_config.h"

#include "core/json_limits.h"

namespace kestrel::io {

using json = nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "LlamaForCausalLM";
    case Arch::Qwen2: return "Qwen2ForCausalLM";
    case Arch::Qwen3: return "Qwen3ForCausalLM";
    case Arch::Mistral: return "MistralForCausalLM";
    case Arch::Qwen2Moe: return "Qwen2MoeForCausalLM";
    case Arch::Qwen3Moe: return "Qwen3MoeForCausalLM";
    case Arch::DeepseekV2: return "DeepseekV2ForCausalLM";
    case Arch::DeepseekV3: return "DeepseekV3ForCausalLM";
  }
  return "?";
}

bool is_qwen_moe(Arch a) { return a == Arch::Qwen2Moe || a == Arch::Qwen3Moe; }
bool is_deepseek(Arch a) { return a == Arch::DeepseekV2 || a == Arch::DeepseekV3; }

const char* default_model_type(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Mistral: return "mistral";
    case Arch::Qwen2Moe: return "qwen2_moe";
    case Arch::Qwen3Moe: return "qwen3_moe";
    case Arch::DeepseekV2: return "deepseek_v2";
    case Arch::DeepseekV3: return "deepseek_v3";
  }
  return "?";
}

namespace {


constexpr Arch kAllArchs[] = {Arch::Llama,    Arch::Qwen2,    Arch::Qwen3,      Arch::Mistral,
                              Arch::Qwen2Moe, Arch::Qwen3Moe, Arch::DeepseekV2, Arch::DeepseekV3};

// Typed access to one JSON object; every failure throws Error with the
// origin and the dotted key, caught by parse_model_config.
class Reader {
 public:
  Reader(const json& obj, std::string origin, std::string prefix = "")
      : obj_(obj), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& msg) const { throw Error(origin_ + ": " + msg); }
  std::string key(const std::string& k) const { return prefix_ + k; }
  const std::string& origin() const { return origin_; }

  // Absent and JSON null both mean "use the default", as in transformers.
  const json* find(const std::string& k) const {
    auto it = obj_.find(k);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool present(const std::string& k) const { return obj_.contains(k); }

  [[noreturn]] void wrong_type(const std::string& k, const char* want, const json& v) const {
    fail("key '" + key(k) + "' must be " + want + ", got " + v.type_name() + " " + v.dump());
  }
  int64_t as_int(const std::string& k, const json& v) const {
    if (!v.is_number_integer()) wrong_type(k, "an integer", v);
    return v.get<int64_t>();
  }
  int64_t req_int(const std::string& k, const char* what) const {
    const json* v = find(k);
    if (!v) fail("missing required key '" + key(k) + "' (" + what + ")");
    return as_int(k, *v);
  }
  int64_t opt_int(const std::string& k, int64_t def) const {
    const json* v = find(k);
    return v ? as_int(k, *v) : def;
  }
  double opt_num(const std::string& k, double def) const {
    const json* v = find(k);
    if (!v) return def;
    if (!v->is_number()) wrong_type(k, "a number", *v);
    return v->get<double>();
  }
  bool opt_bool(const std::string& k, bool def) const {
    const json* v = find(k);
    if (!v) return def;
    if (!v->is_boolean()) wrong_type(k, "true or false", *v);
    return v->get<bool>();
  }
  std::string opt_str(const std::string& k, const std::string& def) const {
    const json* v = find(k);
    if (!v) return def;
    if (!v->is_string()) wrong_type(k, "a string", *v);
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::string origin_, prefix_;
};

[[noreturn]] void unsupported(const Reader& r, const std::string& what, const std::string& hint) {
  r.fail("not supported yet: " + what + (hint.empty() ? "" : " (" + hint + ")"));
}

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Arch detect_arch(const Reader& r) {
  std::string classes, types;
  for (Arch a : kAllArchs) {
    classes += std::string(classes.empty() ? "" : ", ") + arch_name(a);
    types += std::string(types.empty() ? "" : ", ") + default_model_type(a);
  }
  if (const json* a = r.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      r.wrong_type("architectures", "a non-empty list of class names", *a);
    const std::string name = (*a)[0].get<std::string>();
    for (Arch arch : kAllArchs)
      if (name == arch_name(arch)) return arch;
    unsupported(r, "architectures[0]=\"" + name + "\"", "supported: " + classes);
  }
  const std::string mt = r.opt_str("model_type", "");
  if (mt.empty()) r.fail("missing required key 'architectures' (or 'model_type'): which model class this is");
  for (Arch arch : kAllArchs)
    if (mt == default_model_type(arch)) return arch;
  unsupported(r, "model_type=\"" + mt + "\"", "supported: " + types);
}

// rope_theta and rope_scaling (4.x keys) or rope_parameters (5.x), merged
// with the priorities of transformers' convert_rope_params_to_dict.
void parse_rope(const Reader& r, ModelConfig& cfg) {
  ops::RopeConfig& rope = cfg.rope;
  rope.head_dim = cfg.head_dim;
  const json* dict = nullptr;
  std::string dict_key;
  if (const json* s = r.find("rope_scaling")) dict = s, dict_key = "rope_scaling";
  else if (const json* p = r.find("rope_parameters")) dict = p, dict_key = "rope_parameters";
  const double top_theta = r.opt_num("rope_theta", 10000.0);  // RotaryEmbeddingConfigMixin.default_theta
  rope.theta = top_theta;
  if (!dict) {
    rope.scaling_type = "default";
  } else {
    if (!dict->is_object()) r.wrong_type(dict_key, "an object", *dict);
    const Reader d(*dict, r.origin(), dict_key + ".");
    rope.theta = d.opt_num("rope_theta", top_theta);
    // "type" is the pre-4.45 name of "rope_type".
    std::string type = d.opt_str("rope_type", d.opt_str("type", "default"));
    if (type == "default") {
      // nothing more
    } else if (type == "linear") {
      if (!d.find("factor")) d.fail("missing required key '" + dict_key + ".factor' (the linear scaling factor)");
      rope.factor = d.opt_num("factor", 1.0);
    } else if (type == "llama3") {
      for (const char* k : {"factor", "low_freq_factor", "high_freq_factor"})
        if (!d.find(k)) d.fail(std::string("missing required key '") + dict_key + "." + k + "' (llama3 rope scaling)");
      rope.factor = d.opt_num("factor", 1.0);
      rope.low_freq_factor = d.opt_num("low_freq_factor", 1.0);
      rope.high_freq_factor = d.opt_num("high_freq_factor", 4.0);
      rope.original_max_position = d.opt_int("original_max_position_embeddings", cfg.max_position_embeddings);
      if (!(rope.high_freq_factor > rope.low_freq_factor))
        d.fail("key '" + dict_key + ".high_freq_factor' (" + num_str(rope.high_freq_factor) +
               ") must exceed low_freq_factor (" + num_str(rope.low_freq_factor) + ")");
    } else if (type == "yarn") {
      if (!d.find("factor")) d.fail("missing required key '" + dict_key + ".factor' (the yarn scaling factor)");
      rope.factor = d.opt_num("factor", 1.0);
      rope.original_max_position = d.opt_int("original_max_position_embeddings", cfg.max_position_embeddings);
      rope.beta_fast = d.opt_num("beta_fast", 32.0);
      rope.beta_slow = d.opt_num("beta_slow", 1.0);
      rope.attention_factor = d.opt_num("attention_factor", 0.0);
      // The default attention factor is get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are
      // non-zero (ops::RopeConfig); DeepSeek's attention also scales its softmax by mscale_all_dim.
      rope.mscale = d.opt_num("mscale", 0.0);
      rope.mscale_all_dim = d.opt_num("mscale_all_dim", 0.0);
      if (!d.opt_bool("truncate", true)) unsupported(r, dict_key + ".truncate=false", "");
    } else {
      unsupported(r, dict_key + ".rope_type=" + type, "supported: default, linear, llama3, yarn");
    }
    if (is_deepseek(cfg.arch) && type != "yarn" && type != "default" && d.opt_num("mscale_all_dim", 0.0) != 0.0)
      unsupported(r, dict_key + ".mscale_all_dim with rope_type " + type,
                  "DeepSeek's softmax-scale mscale is computed under yarn only");
    if (type != "default" && !(rope.factor > 0))
      d.fail("key '" + dict_key + ".factor' must be positive, got " + num_str(rope.factor));
    rope.scaling_type = type;
    const double prf = d.opt_num("partial_rotary_factor", 1.0);
    if (prf != 1.0) unsupported(r, dict_key + ".partial_rotary_factor=" + num_str(prf), "");
  }
  const double prf = r.opt_num("partial_rotary_factor", 1.0);
  if (prf != 1.0) unsupported(r, "partial_rotary_factor=" + num_str(prf), "");
  if (!(rope.theta > 0)) r.fail("key 'rope_theta' must be positive, got " + num_str(rope.theta));
}

// Sliding-window attention: Mistral applies `sliding_window` to every layer;
// Qwen2/3 only with use_sliding_window, to layers >= max_window_layers (or as
// layer_types says); Qwen3-MoE with use_sliding_window to every layer;
// Qwen2-MoE with use_sliding_window to the even layers below max_window_layers
// (or as layer_types says); DeepSeek never. A window at least
// max_position_embeddings long never masks anything, so it counts as unused.
void check_sliding_window(const Reader& r, ModelConfig& cfg) {
  int64_t window = 0;
  bool any_sliding_layer = false;
  if (cfg.arch == Arch::Mistral) {
    window = r.present("sliding_window") ? r.opt_int("sliding_window", 0) : 4096;
    any_sliding_layer = true;
  } else if (cfg.arch == Arch::Qwen2 || cfg.arch == Arch::Qwen3 || cfg.arch == Arch::Qwen2Moe) {
    if (r.opt_bool("use_sliding_window", false)) {
      window = r.present("sliding_window") ? r.opt_int("sliding_window", 0) : 4096;
      if (const json* lt = r.find("layer_types")) {
        if (!lt->is_array()) r.wrong_type("layer_types", "a list of strings", *lt);
        for (const auto& t : *lt) any_sliding_layer |= t.is_string() && t.get<std::string>() == "sliding_attention";
      } else if (cfg.arch == Arch::Qwen2Moe) {
        any_sliding_layer = r.opt_int("max_window_layers", 28) > 0;  // layer 0 is below it
      } else {
        any_sliding_layer = r.opt_int("max_window_layers", 28) < cfg.num_hidden_layers;
      }
    }
  } else if (cfg.arch == Arch::Qwen3Moe) {
    if (r.opt_bool("use_sliding_window", false)) {
      window = r.present("sliding_window") ? r.opt_int("sliding_window", 0) : 4096;
      any_sliding_layer = true;
    }
  }
  if (window > 0 && any_sliding_layer && window < cfg.max_position_embeddings)
    unsupported(r, "sliding_window=" + std::to_string(window),
                "sliding-window attention is in use; set \"sliding_window\": null (or use_sliding_window false) "
                "only if the model was trained without it");
  cfg.sliding_window = 0;
}

std::string i2s(int64_t v) { return std::to_string(v); }

// The class default of num_key_value_heads when the key is absent (null: num_attention_heads).
int64_t kv_heads_default(Arch a, int64_t heads) {
  switch (a) {
    case Arch::Mistral: return 8;
    case Arch::Qwen2Moe: return 16;
    case Arch::Qwen3Moe: return 4;
    case Arch::DeepseekV3: return 128;
    default: return heads;
  }
}

void parse_heads(const Reader& r, ModelConfig& cfg) {
  const int64_t heads = cfg.num_attention_heads;
  cfg.num_key_value_heads =
      r.opt_int("num_key_value_heads", r.present("num_key_value_heads") ? heads : kv_heads_default(cfg.arch, heads));
  if (is_deepseek(cfg.arch)) {
    // MLA expands its latent to keys and values for every head; HF's attention then assumes one kv head per
    // query head (its repeat_kv would break any other count).
    if (cfg.num_key_value_heads != heads)
      r.fail("num_key_value_heads (" + i2s(cfg.num_key_value_heads) + ") must equal num_attention_heads (" +
             i2s(heads) + ") for " + arch_name(cfg.arch) + " (multi-head latent attention); set it to " + i2s(heads));
    // DeepseekV2Config's validate_architecture refuses this; head_dim itself is qk_rope_head_dim (parse_mla).
    if (cfg.arch == Arch::DeepseekV2 && cfg.hidden_size % heads != 0)
      r.fail("hidden_size (" + i2s(cfg.hidden_size) + ") is not a multiple of num_attention_heads (" + i2s(heads) +
             "); DeepseekV2Config refuses it");
    return;
  }
  if (cfg.num_key_value_heads <= 0 || heads % cfg.num_key_value_heads != 0)
    r.fail("num_attention_heads (" + i2s(heads) + ") must be a positive multiple of num_key_value_heads (" +
           i2s(cfg.num_key_value_heads) + "); fix one of the two keys");

  // Qwen3Config's head_dim defaults to 128; the others (Qwen-MoE included) derive it.
  if (cfg.arch == Arch::Qwen3 && !r.present("head_dim")) {
    cfg.head_dim = 128;
  } else if (r.find("head_dim")) {
    cfg.head_dim = r.opt_int("head_dim", 0);
  } else {
    if (cfg.hidden_size % heads != 0)
      r.fail("hidden_size (" + i2s(cfg.hidden_size) + ") is not a multiple of num_attention_heads (" + i2s(heads) +
             "); set 'head_dim' explicitly");
    cfg.head_dim = cfg.hidden_size / heads;
  }
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0)
    r.fail("key 'head_dim' must be a positive even number (rotary embedding pairs), got " + i2s(cfg.head_dim));
}

void parse_biases(const Reader& r, ModelConfig& cfg) {
  switch (cfg.arch) {
    case Arch::Llama:
      cfg.attention_bias = r.opt_bool("attention_bias", false);
      cfg.o_proj_bias = cfg.attention_bias;
      cfg.mlp_bias = r.opt_bool("mlp_bias", false);
      break;
    case Arch::Qwen2:  // q/k/v always have bias, o_proj never (modeling_qwen2.py)
      cfg.attention_bias = true;
      cfg.o_proj_bias = false;
      break;
    case Arch::Qwen2Moe:  // q/k/v biases unless qkv_bias false, o_proj never, MLPs never
      cfg.attention_bias = r.opt_bool("qkv_bias", true);
      cfg.o_proj_bias = false;
      break;
    case Arch::Qwen3:
    case Arch::Qwen3Moe:
      cfg.attention_bias = r.opt_bool("attention_bias", false);
      cfg.o_proj_bias = cfg.attention_bias;
      cfg.qk_norm = true;
      break;
    case Arch::DeepseekV2:  // attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj; mlp_bias: dense and shared MLPs
      cfg.mlp_bias = r.opt_bool("mlp_bias", false);
      [[fallthrough]];
    case Arch::DeepseekV3:  // DeepseekV3MLP has no biases
      cfg.attention_bias = r.opt_bool("attention_bias", false);
      cfg.o_proj_bias = cfg.attention_bias;
      break;
    case Arch::Mistral:  // no biases at all
      break;
  }
}

void parse_token_ids(const Reader& r, ModelConfig& cfg) {
  // Absent: the class default; explicit null: none.
  int64_t bos = -1, eos = -1;
  if (cfg.arch == Arch::Llama || cfg.arch == Arch::Mistral || cfg.arch == Arch::DeepseekV2) bos = 1, eos = 2;
  if (cfg.arch == Arch::DeepseekV3) bos = 0, eos = 1;
  cfg.bos_token_id = r.present("bos_token_id") ? r.opt_int("bos_token_id", -1) : bos;
  cfg.eos_token_ids.clear();
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& v : *e) cfg.eos_token_ids.push_back(r.as_int("eos_token_id", v));
    } else if (e->is_number_integer()) {
      cfg.eos_token_ids.push_back(e->get<int64_t>());
    } else {
      r.wrong_type("eos_token_id", "an integer or a list of integers", *e);
    }
  } else if (eos >= 0 && !r.present("eos_token_id")) {
    cfg.eos_token_ids.push_back(eos);
  }
}

// An integer under its key or its alias (HF attribute_map); both present must agree.
int64_t int_or_alias(const Reader& r, const char* key, const char* alias, int64_t def) {
  const int64_t v = r.opt_int(key, def);
  if (!r.find(alias)) return v;
  const int64_t a = r.opt_int(alias, def);
  if (r.find(key) && a != v)
    r.fail(std::string("keys '") + key + "' (" + i2s(v) + ") and '" + alias + "' (" + i2s(a) +
           ") name the same number and differ; keep one");
  return a;
}

// A string key that HF does not read, refused unless it says what HF computes anyway.
void expect_str(const Reader& r, const std::string& k, const std::string& want, const std::string& why) {
  const std::string v = r.opt_str(k, want);
  if (v != want) unsupported(r, k + "=" + v, why);
}

void parse_qwen_moe(const Reader& r, ModelConfig& cfg) {
  MoeConfig& m = cfg.moe;
  const bool q2 = cfg.arch == Arch::Qwen2Moe;
  m.num_experts = q2 ? r.opt_int("num_experts", 60) : int_or_alias(r, "num_experts", "num_local_experts", 128);
  m.top_k = r.opt_int("num_experts_per_tok", q2 ? 4 : 8);
  m.moe_intermediate_size = r.opt_int("moe_intermediate_size", q2 ? 1408 : 768);
  if (q2) {
    m.shared_intermediate_size = r.opt_int("shared_expert_intermediate_size", 5632);
    m.shared_expert_gate = true;
    if (m.shared_intermediate_size < 0)
      r.fail("key 'shared_expert_intermediate_size' must be >= 0, got " + i2s(m.shared_intermediate_size));
  }
  m.norm_topk_prob = r.opt_bool("norm_topk_prob", false);
  m.decoder_sparse_step = r.opt_int("decoder_sparse_step", 1);
  if (m.decoder_sparse_step <= 0)
    r.fail("key 'decoder_sparse_step' must be positive (every step-th layer is MoE), got " +
           i2s(m.decoder_sparse_step));
  m.mlp_only_layers.clear();
  if (const json* l = r.find("mlp_only_layers")) {
    if (!l->is_array()) r.wrong_type("mlp_only_layers", "a list of layer indices", *l);
    for (const auto& v : *l) m.mlp_only_layers.push_back(r.as_int("mlp_only_layers", v));
  }
  m.router_aux_loss_coef = r.opt_num("router_aux_loss_coef", 0.001);
  r.opt_bool("output_router_logits", false);  // only asks HF's forward to return the router logits
  if (m.num_experts < 0) r.fail("key 'num_experts' must be >= 0 (0: no MoE layer), got " + i2s(m.num_experts));
}

void parse_deepseek_moe(const Reader& r, ModelConfig& cfg) {
  MoeConfig& m = cfg.moe;
  const bool v3 = cfg.arch == Arch::DeepseekV3;
  m.num_experts = int_or_alias(r, "n_routed_experts", v3 ? "num_local_experts" : "num_experts", v3 ? 256 : 64);
  // V2's class default is None (no router would build): required once a layer is MoE (validate_moe).
  m.top_k = r.opt_int("num_experts_per_tok", v3 ? 8 : 0);
  m.moe_intermediate_size = r.opt_int("moe_intermediate_size", v3 ? 2048 : 1407);
  const int64_t n_shared = r.opt_int("n_shared_experts", v3 ? 1 : 2);
  if (n_shared < 0) r.fail("key 'n_shared_experts' must be >= 0, got " + i2s(n_shared));
  m.shared_intermediate_size = m.moe_intermediate_size * n_shared;
  m.routed_scaling_factor = r.opt_num("routed_scaling_factor", v3 ? 2.5 : 1.0);
  m.first_k_dense_replace = r.opt_int("first_k_dense_replace", v3 ? 3 : 0);
  if (m.first_k_dense_replace < 0)
    r.fail("key 'first_k_dense_replace' must be >= 0, got " + i2s(m.first_k_dense_replace));
  if (m.num_experts <= 0 && m.first_k_dense_replace < cfg.num_hidden_layers)  // HF builds its routers regardless
    r.fail("key 'n_routed_experts' must be positive, got " + i2s(m.num_experts) +
           " (layers from first_k_dense_replace on are MoE)");
  m.n_group = r.opt_int("n_group", v3 ? 8 : 1);
  m.topk_group = r.opt_int("topk_group", v3 ? 4 : 1);
  m.router_fp32 = true;
  m.router_aux_loss_coef = r.opt_num("aux_loss_alpha", 0.0);
  r.opt_bool("output_router_logits", false);
  // Keys of DeepSeek's own configs that HF's classes ignore: accepted when they say what HF computes.
  if (r.opt_int("moe_layer_freq", 1) != 1)
    unsupported(r, "moe_layer_freq=" + i2s(r.opt_int("moe_layer_freq", 1)),
                std::string(arch_name(cfg.arch)) + " makes every layer from first_k_dense_replace on MoE; set it to 1");
  if (v3) {
    m.sigmoid_scores = true;
    m.score_correction_bias = true;
    m.group_limit = MoeConfig::GroupLimit::SumTop2;
    m.norm_topk_prob = r.opt_bool("norm_topk_prob", true);
    expect_str(r, "scoring_func", "sigmoid", "DeepseekV3ForCausalLM scores with sigmoid");
    expect_str(r, "topk_method", "noaux_tc", "DeepseekV3ForCausalLM routes with noaux_tc (group top-2 sums)");
  } else {
    const std::string method = r.opt_str("topk_method", "greedy");
    if (method == "group_limited_greedy") {
      m.group_limit = MoeConfig::GroupLimit::Max;
      for (const char* k : {"n_group", "topk_group"})
        if (!r.find(k)) r.fail(std::string("missing required key '") + k + "' (topk_method group_limited_greedy)");
    } else if (method != "greedy") {
      unsupported(r, "topk_method=" + method, "DeepseekV2ForCausalLM computes greedy and group_limited_greedy");
    }
    if (r.opt_bool("norm_topk_prob", false))
      unsupported(r, "norm_topk_prob=true",
                  "DeepseekV2ForCausalLM never normalises the top-k weights (DeepSeek's remote code would); "
                  "set it false");
    expect_str(r, "scoring_func", "softmax", "DeepseekV2ForCausalLM scores with softmax");
  }
}

// is_moe_layer summed over the layers without visiting each (num_hidden_layers comes from the file).
int64_t count_moe_layers(const ModelConfig& cfg) {
  const MoeConfig& m = cfg.moe;
  const int64_t L = cfg.num_hidden_layers;
  if (m.num_experts <= 0 || L <= 0) return 0;
  if (is_deepseek(cfg.arch)) return std::max<int64_t>(0, L - m.first_k_dense_replace);
  if (!is_qwen_moe(cfg.arch) || m.decoder_sparse_step <= 0) return 0;
  std::vector<int64_t> dense = m.mlp_only_layers;
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  int64_t n = L / m.decoder_sparse_step;
  for (int64_t l : dense) n -= (l >= 0 && l < L && (l + 1) % m.decoder_sparse_step == 0) ? 1 : 0;
  return n;
}

bool any_moe_layer(const ModelConfig& cfg) { return count_moe_layers(cfg) > 0; }

// What every router needs once some layer is MoE.
void validate_moe(const Reader& r, const ModelConfig& cfg) {
  const MoeConfig& m = cfg.moe;
  if (!any_moe_layer(cfg)) return;
  const std::string e_key = is_deepseek(cfg.arch) ? "n_routed_experts" : "num_experts";
  if (m.num_experts <= 0) r.fail("key '" + e_key + "' must be positive, got " + i2s(m.num_experts));
  if (m.top_k <= 0 && !r.find("num_experts_per_tok"))
    r.fail("missing required key 'num_experts_per_tok' (experts per token; " + std::string(arch_name(cfg.arch)) +
           " has no default)");
  if (m.top_k <= 0 || m.top_k > m.num_experts)
    r.fail("key 'num_experts_per_tok' (" + i2s(m.top_k) + ") must be in [1, " + e_key + " = " + i2s(m.num_experts) +
           "]");
  if (m.moe_intermediate_size <= 0)
    r.fail("key 'moe_intermediate_size' must be positive, got " + i2s(m.moe_intermediate_size));
  if (!(m.routed_scaling_factor > 0) || !std::isfinite(m.routed_scaling_factor))
    r.fail("key 'routed_scaling_factor' must be positive, got " + num_str(m.routed_scaling_factor));
  if (m.group_limit == MoeConfig::GroupLimit::None) return;
  if (m.n_group <= 0 || m.num_experts % m.n_group != 0)
    r.fail(e_key + " (" + i2s(m.num_experts) + ") must be divisible by n_group (" + i2s(m.n_group) +
           "): experts are grouped evenly; fix n_group");
  if (m.topk_group <= 0 || m.topk_group > m.n_group)
    r.fail("key 'topk_group' (" + i2s(m.topk_group) + ") must be in [1, n_group = " + i2s(m.n_group) + "]");
  const int64_t per_group = m.num_experts / m.n_group;
  if (m.group_limit == MoeConfig::GroupLimit::SumTop2 && per_group < 2)
    r.fail("n_group (" + i2s(m.n_group) + ") leaves " + i2s(per_group) +
           " expert per group; noaux_tc scores a group by its top 2, so use n_group <= " + i2s(m.num_experts / 2));
  if (m.top_k > m.topk_group * per_group)
    r.fail("num_experts_per_tok (" + i2s(m.top_k) + ") exceeds the experts of the topk_group (" + i2s(m.topk_group) +
           ") kept groups (" + i2s(m.topk_group * per_group) + "); raise topk_group");
}

// q_lora_rank: absent means the class default (1536), null means no query compression.
void parse_mla(const Reader& r, ModelConfig& cfg) {
  MlaConfig& a = cfg.mla;
  a.enabled = true;
  if (!r.present("q_lora_rank")) {
    a.q_lora_rank = 1536;
  } else if (r.find("q_lora_rank")) {
    a.q_lora_rank = r.opt_int("q_lora_rank", 0);
    if (a.q_lora_rank <= 0)
      r.fail("key 'q_lora_rank' must be positive, got " + i2s(a.q_lora_rank) + "; null means no query compression");
  }
  a.kv_lora_rank = r.opt_int("kv_lora_rank", 512);
  a.qk_nope_head_dim = r.opt_int("qk_nope_head_dim", 128);
  a.qk_rope_head_dim = r.opt_int("qk_rope_head_dim", 64);
  a.v_head_dim = r.opt_int("v_head_dim", 128);
  for (auto [k, v] : {std::pair<const char*, int64_t>{"kv_lora_rank", a.kv_lora_rank},
                      {"qk_nope_head_dim", a.qk_nope_head_dim},
                      {"v_head_dim", a.v_head_dim}})
    if (v <= 0) r.fail(std::string("key '") + k + "' must be positive, got " + i2s(v));
  if (a.qk_rope_head_dim <= 0 || a.qk_rope_head_dim % 2 != 0)
    r.fail("key 'qk_rope_head_dim' must be a positive even number (rotary embedding pairs), got " +
           i2s(a.qk_rope_head_dim));
  // HF: rope_interleave null is falsy (rotate_half); V2 always rotates interleaved (complex) pairs.
  a.rope_interleave = cfg.arch == Arch::DeepseekV2 ||
                      (r.present("rope_interleave") ? r.opt_bool("rope_interleave", false) : true);
  cfg.head_dim = a.qk_rope_head_dim;
}

// yarn_apply_mscale of modeling_deepseek_v3.py, in its double arithmetic.
double mla_softmax_scale(const ModelConfig& cfg) {
  double scale = std::pow(double(cfg.mla.qk_head_dim()), -0.5);
  const ops::RopeConfig& rope = cfg.rope;
  if (rope.scaling_type != "default" && rope.mscale_all_dim != 0.0) {
    const double m = rope.factor <= 1 ? 1.0 : 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale = scale * m * m;
  }
  return scale;
}

ModelConfig parse_impl(const json& j, const std::string& origin) {
  Reader r(j, origin);
  if (!j.is_object()) r.fail(std::string("config.json must be a JSON object, got ") + j.type_name());
  ModelConfig cfg;
  cfg.arch = detect_arch(r);
  cfg.model_type = r.opt_str("model_type", default_model_type(cfg.arch));

  cfg.vocab_size = r.req_int("vocab_size", "number of token embeddings");
  cfg.hidden_size = r.req_int("hidden_size", "the model's width");
  cfg.intermediate_size = r.req_int("intermediate_size", "the MLP's inner width");
  cfg.num_hidden_layers = r.req_int("num_hidden_layers", "number of decoder layers");
  cfg.num_attention_heads = r.req_int("num_attention_heads", "number of query heads");
  for (auto [k, v] : {std::pair<const char*, int64_t>{"vocab_size", cfg.vocab_size},
                      {"hidden_size", cfg.hidden_size},
                      {"intermediate_size", cfg.intermediate_size},
                      {"num_hidden_layers", cfg.num_hidden_layers},
                      {"num_attention_heads", cfg.num_attention_heads}})
    if (v <= 0) r.fail(std::string("key '") + k + "' must be positive, got " + i2s(v));

  parse_heads(r, cfg);
  if (is_deepseek(cfg.arch)) parse_mla(r, cfg);

  int64_t max_pos_default = 32768;
  if (cfg.arch == Arch::Llama || cfg.arch == Arch::DeepseekV2) max_pos_default = 2048;
  if (cfg.arch == Arch::Mistral) max_pos_default = 4096 * 32;
  if (cfg.arch == Arch::DeepseekV3) max_pos_default = 4096;
  cfg.max_position_embeddings = r.opt_int("max_position_embeddings", max_pos_default);
  if (cfg.max_position_embeddings <= 0) r.fail("key 'max_position_embeddings' must be positive");
  cfg.rms_norm_eps = r.opt_num("rms_norm_eps", 1e-6);
  if (!(cfg.rms_norm_eps > 0)) r.fail("key 'rms_norm_eps' must be positive, got " + num_str(cfg.rms_norm_eps));
  cfg.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  parse_biases(r, cfg);

  cfg.hidden_act = r.opt_str("hidden_act", "silu");
  if (cfg.hidden_act == "swish") cfg.hidden_act = "silu";  // the same function in transformers' ACT2FN
  if (cfg.hidden_act != "silu") unsupported(r, "hidden_act=" + cfg.hidden_act, "only silu (SwiGLU MLP) is built");
  const double dropout = r.opt_num("attention_dropout", 0.0);
  if (dropout != 0.0) unsupported(r, "attention_dropout=" + num_str(dropout), "set it to 0.0");
  if (r.find("quantization_config")) unsupported(r, "quantization_config", "load an unquantized checkpoint");

  parse_token_ids(r, cfg);
  // transformers 5 writes "dtype"; 4.x wrote "torch_dtype".
  cfg.torch_dtype = r.opt_str("torch_dtype", r.opt_str("dtype", "float32"));

  check_sliding_window(r, cfg);
  parse_rope(r, cfg);
  if (is_qwen_moe(cfg.arch)) parse_qwen_moe(r, cfg);
  if (is_deepseek(cfg.arch)) {
    parse_deepseek_moe(r, cfg);
    cfg.mla.softmax_scale = mla_softmax_scale(cfg);
  }
  validate_moe(r, cfg);
  return cfg;
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (moe.num_experts <= 0 || layer < 0 || layer >= num_hidden_layers) return false;
  if (is_deepseek(arch)) return layer >= moe.first_k_dense_replace;
  if (!is_qwen_moe(arch)) return false;
  for (int64_t l : moe.mlp_only_layers)
    if (l == layer) return false;
  return moe.decoder_sparse_step > 0 && (layer + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  int64_t attn = 0;
  if (mla.enabled) {
    const int64_t H = num_attention_heads, qk = mla.qk_head_dim(), kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim;
    const int64_t qr = mla.q_lora_rank;
    attn = qr > 0 ? h * qr + qr + qr * H * qk  // q_a_proj, q_a_layernorm, q_b_proj
                  : h * H * qk;               // q_proj
    attn += h * kv_a + mla.kv_lora_rank                          // kv_a_proj_with_mqa, kv_a_layernorm
            + mla.kv_lora_rank * H * (mla.qk_nope_head_dim + mla.v_head_dim)  // kv_b_proj
            + H * mla.v_head_dim * h;                            // o_proj
    if (attention_bias) attn += (qr > 0 ? qr : 0) + kv_a + h;
  } else {
    attn = h * q_dim() + 2 * h * kv_dim() + q_dim() * h;  // q, k, v, o
    if (attention_bias) attn += q_dim() + 2 * kv_dim();
    if (o_proj_bias) attn += h;
    if (qk_norm) attn += 2 * head_dim;
  }
  auto swiglu = [&](int64_t inter) { return 3 * h * inter + (mlp_bias ? 2 * inter + h : 0); };
  const int64_t dense_mlp = swiglu(intermediate_size);
  const int64_t moe_mlp = moe.num_experts * h                                  // router
                          + moe.num_experts * 3 * h * moe.moe_intermediate_size  // routed experts (no biases)
                          + swiglu(moe.shared_intermediate_size)                // shared expert(s)
                          + (moe.shared_expert_gate ? h : 0);
  int64_t n = vocab_size * h + h;  // embeddings, final norm
  if (!tie_word_embeddings) n += vocab_size * h;
  const int64_t n_moe = count_moe_layers(*this);
  return n + num_hidden_layers * (attn + 2 * h) + n_moe * moe_mlp + (num_hidden_layers - n_moe) * dense_mlp;
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& origin) {
  if (json_nesting_depth(json_text) > kMaxJsonDepth)
    return KS_ERR(origin, ": JSON nested deeper than ", kMaxJsonDepth, " levels (a config.json nests fewer than 5)");
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number that overflows (1e999999)
    // e.what() names the position: "parse error at line 3, column 5: ..."
    return KS_ERR(origin, ": malformed JSON: ", e.what());
  }
  try {
    return parse_impl(j, origin);
  } catch (const Error& e) {
    return Status::error(e.what());
  }
}

Result<ModelConfig> load_model_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  std::ifstream in(file, std::ios::binary);
  if (!in) return KS_ERR(file, ": cannot read config.json; point at a Hugging Face model folder");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), file);
}

}  // namespace kestrel::io
