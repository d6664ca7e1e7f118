// HF config.json parsing with the defaults of transformers' config classes
// (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig; checked against
// transformers 5.x, which also reads the 4.x keys rope_theta/rope_scaling).
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
  }
  return "?";
}

namespace {

const char* default_model_type(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Mistral: return "mistral";
  }
  return "?";
}

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
  static const std::pair<const char*, Arch> by_class[] = {{"LlamaForCausalLM", Arch::Llama},
                                                          {"Qwen2ForCausalLM", Arch::Qwen2},
                                                          {"Qwen3ForCausalLM", Arch::Qwen3},
                                                          {"MistralForCausalLM", Arch::Mistral}};
  if (const json* a = r.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      r.wrong_type("architectures", "a non-empty list of class names", *a);
    const std::string name = (*a)[0].get<std::string>();
    for (auto& [n, arch] : by_class)
      if (name == n) return arch;
    unsupported(r, "architectures[0]=\"" + name + "\"",
                 "supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM");
  }
  const std::string mt = r.opt_str("model_type", "");
  if (mt.empty()) r.fail("missing required key 'architectures' (or 'model_type'): which model class this is");
  for (auto& [n, arch] : by_class)
    if (mt == default_model_type(arch)) return arch;
  unsupported(r, "model_type=\"" + mt + "\"", "supported: llama, qwen2, qwen3, mistral");
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
      if (d.find("mscale") || d.find("mscale_all_dim"))
        unsupported(r, dict_key + ".mscale", "DeepSeek-style yarn mscale");
      if (!d.opt_bool("truncate", true)) unsupported(r, dict_key + ".truncate=false", "");
    } else {
      unsupported(r, dict_key + ".rope_type=" + type, "supported: default, linear, llama3, yarn");
    }
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
// layer_types says). A window at least max_position_embeddings long never
// masks anything, so it counts as unused.
void check_sliding_window(const Reader& r, ModelConfig& cfg) {
  int64_t window = 0;
  bool any_sliding_layer = false;
  if (cfg.arch == Arch::Mistral) {
    window = r.present("sliding_window") ? r.opt_int("sliding_window", 0) : 4096;
    any_sliding_layer = true;
  } else if (cfg.arch == Arch::Qwen2 || cfg.arch == Arch::Qwen3) {
    if (r.opt_bool("use_sliding_window", false)) {
      window = r.present("sliding_window") ? r.opt_int("sliding_window", 0) : 4096;
      if (const json* lt = r.find("layer_types")) {
        if (!lt->is_array()) r.wrong_type("layer_types", "a list of strings", *lt);
        for (const auto& t : *lt) any_sliding_layer |= t.is_string() && t.get<std::string>() == "sliding_attention";
      } else {
        any_sliding_layer = r.opt_int("max_window_layers", 28) < cfg.num_hidden_layers;
      }
    }
  }
  if (window > 0 && any_sliding_layer && window < cfg.max_position_embeddings)
    unsupported(r, "sliding_window=" + std::to_string(window),
                "sliding-window attention is in use; set \"sliding_window\": null (or use_sliding_window false) "
                "only if the model was trained without it");
  cfg.sliding_window = 0;
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
    if (v <= 0) r.fail(std::string("key '") + k + "' must be positive, got " + std::to_string(v));

  // Mistral's class default is 8; the others default to num_attention_heads.
  const int64_t kv_default = cfg.arch == Arch::Mistral && !r.present("num_key_value_heads") ? 8 : cfg.num_attention_heads;
  cfg.num_key_value_heads = r.opt_int("num_key_value_heads", kv_default);
  if (cfg.num_key_value_heads <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    r.fail("num_attention_heads (" + std::to_string(cfg.num_attention_heads) +
           ") must be a positive multiple of num_key_value_heads (" + std::to_string(cfg.num_key_value_heads) +
           "); fix one of the two keys");

  // Qwen3Config's head_dim defaults to 128; the others derive it.
  if (cfg.arch == Arch::Qwen3 && !r.present("head_dim")) {
    cfg.head_dim = 128;
  } else if (r.find("head_dim")) {
    cfg.head_dim = r.opt_int("head_dim", 0);
  } else {
    if (cfg.hidden_size % cfg.num_attention_heads != 0)
      r.fail("hidden_size (" + std::to_string(cfg.hidden_size) + ") is not a multiple of num_attention_heads (" +
             std::to_string(cfg.num_attention_heads) + "); set 'head_dim' explicitly");
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  }
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0)
    r.fail("key 'head_dim' must be a positive even number (rotary embedding pairs), got " +
           std::to_string(cfg.head_dim));

  const int64_t max_pos_default = cfg.arch == Arch::Llama ? 2048 : cfg.arch == Arch::Mistral ? 4096 * 32 : 32768;
  cfg.max_position_embeddings = r.opt_int("max_position_embeddings", max_pos_default);
  if (cfg.max_position_embeddings <= 0) r.fail("key 'max_position_embeddings' must be positive");
  cfg.rms_norm_eps = r.opt_num("rms_norm_eps", 1e-6);
  if (!(cfg.rms_norm_eps > 0)) r.fail("key 'rms_norm_eps' must be positive, got " + num_str(cfg.rms_norm_eps));
  cfg.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);

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
    case Arch::Qwen3:
      cfg.attention_bias = r.opt_bool("attention_bias", false);
      cfg.o_proj_bias = cfg.attention_bias;
      cfg.qk_norm = true;
      break;
    case Arch::Mistral:  // no biases at all
      break;
  }

  cfg.hidden_act = r.opt_str("hidden_act", "silu");
  if (cfg.hidden_act == "swish") cfg.hidden_act = "silu";  // the same function in transformers' ACT2FN
  if (cfg.hidden_act != "silu") unsupported(r, "hidden_act=" + cfg.hidden_act, "only silu (SwiGLU MLP) is built");
  const double dropout = r.opt_num("attention_dropout", 0.0);
  if (dropout != 0.0) unsupported(r, "attention_dropout=" + num_str(dropout), "set it to 0.0");
  if (r.find("quantization_config")) unsupported(r, "quantization_config", "load an unquantized checkpoint");

  const bool llama_like = cfg.arch == Arch::Llama || cfg.arch == Arch::Mistral;
  // Absent: the class default; explicit null: no BOS token.
  cfg.bos_token_id = r.present("bos_token_id") ? r.opt_int("bos_token_id", -1) : llama_like ? 1 : -1;
  cfg.eos_token_ids.clear();
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& v : *e) cfg.eos_token_ids.push_back(r.as_int("eos_token_id", v));
    } else if (e->is_number_integer()) {
      cfg.eos_token_ids.push_back(e->get<int64_t>());
    } else {
      r.wrong_type("eos_token_id", "an integer or a list of integers", *e);
    }
  } else if (llama_like && !r.present("eos_token_id")) {
    cfg.eos_token_ids.push_back(2);
  }
  // transformers 5 writes "dtype"; 4.x wrote "torch_dtype".
  cfg.torch_dtype = r.opt_str("torch_dtype", r.opt_str("dtype", "float32"));

  check_sliding_window(r, cfg);
  parse_rope(r, cfg);
  return cfg;
}

}  // namespace

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  int64_t per_layer = h * q_dim() + 2 * h * kv_dim() + q_dim() * h  // q, k, v, o
                      + 3 * h * intermediate_size                    // gate, up, down
                      + 2 * h;                                       // input / post-attention norms
  if (attention_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_proj_bias) per_layer += h;
  if (mlp_bias) per_layer += 2 * intermediate_size + h;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t n = vocab_size * h + num_hidden_layers * per_layer + h;  // embeddings, layers, final norm
  if (!tie_word_embeddings) n += vocab_size * h;
  return n;
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

std::string model_config_to_json(const ModelConfig& cfg) {
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
    if (r.scaling_type == "llama3") {
      s["low_freq_factor"] = r.low_freq_factor;
      s["high_freq_factor"] = r.high_freq_factor;
      s["original_max_position_embeddings"] = r.original_max_position;
    } else if (r.scaling_type == "yarn") {
      s["original_max_position_embeddings"] = r.original_max_position;
      s["beta_fast"] = r.beta_fast;
      s["beta_slow"] = r.beta_slow;
      if (r.attention_factor != 0.0) s["attention_factor"] = r.attention_factor;
    }
    j["rope_scaling"] = s;
  }
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace kestrel::io
