#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io_test_util.h"

using namespace kestrel;
using namespace kestrel::io;
using kestrel::testing::TempDir;
using kestrel::testing::write_bytes;

namespace {

// Abridged real config.json files (values as published on the Hub).
const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 128256})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

const char* kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32768})";

ModelConfig parse_ok(const std::string& text) {
  auto r = parse_model_config(text, "config.json");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : ModelConfig{};
}

std::string parse_err(const std::string& text) {
  auto r = parse_model_config(text, "config.json");
  EXPECT_FALSE(r.is_ok());
  return r.is_ok() ? std::string() : r.status().message();
}

// A config with one key changed (null = removed).
std::string edit(const char* base, const std::string& key, const nlohmann::json& value) {
  auto j = nlohmann::json::parse(base);
  if (value.is_discarded()) j.erase(key);
  else j[key] = value;
  return j.dump();
}
const nlohmann::json kRemove = nlohmann::json::value_t::discarded;

}  // namespace

TEST(ModelConfig, Qwen25) {
  ModelConfig c = parse_ok(kQwen25_05B);
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.head_dim, 64);
  EXPECT_EQ(c.rope.scaling_type, "default");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.num_parameters(), 494032768);  // Qwen2.5-0.5B's published count
}

TEST(ModelConfig, Llama32WithLlama3Rope) {
  ModelConfig c = parse_ok(kLlama32_1B);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 512);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.rope.scaling_type, "llama3");
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.num_parameters(), 1235814400);  // Llama-3.2-1B
}

TEST(ModelConfig, Qwen3DefaultsAndQkNorm) {
  ModelConfig c = parse_ok(kQwen3_06B);
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);  // explicit; not hidden/heads = 64
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.num_parameters(), 596049920);  // Qwen3-0.6B
  // Qwen3Config's head_dim default is 128 even when hidden/heads differs.
  EXPECT_EQ(parse_ok(edit(kQwen3_06B, "head_dim", kRemove)).head_dim, 128);
  ModelConfig b = parse_ok(edit(kQwen3_06B, "attention_bias", true));
  EXPECT_TRUE(b.attention_bias);
  EXPECT_TRUE(b.o_proj_bias);
}

TEST(ModelConfig, ClassDefaults) {
  // Minimal Llama: kv heads = heads, head_dim = hidden/heads, theta 1e4, bos 1 / eos 2, untied.
  ModelConfig c = parse_ok(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.torch_dtype, "float32");
  // Mistral's class default for num_key_value_heads is 8 and null means none.
  ModelConfig m = parse_ok(edit(kMistral7B_v03, "num_key_value_heads", kRemove));
  EXPECT_EQ(m.num_key_value_heads, 8);
  EXPECT_FALSE(m.attention_bias);
  // An explicit null is "none", not the class default.
  ModelConfig nb = parse_ok(edit(edit(kMistral7B_v03, "bos_token_id", nullptr).c_str(), "eos_token_id", nullptr));
  EXPECT_EQ(nb.bos_token_id, -1);
  EXPECT_TRUE(nb.eos_token_ids.empty());
  // Qwen2 without token ids: none.
  ModelConfig q = parse_ok(edit(edit(kQwen25_05B, "eos_token_id", kRemove).c_str(), "bos_token_id", kRemove));
  EXPECT_EQ(q.bos_token_id, -1);
  EXPECT_TRUE(q.eos_token_ids.empty());
}

TEST(ModelConfig, RopeScalingAliasesAndV5Keys) {
  // "type" is the legacy spelling of "rope_type".
  ModelConfig c = parse_ok(edit(kLlama32_1B, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}));
  EXPECT_EQ(c.rope.scaling_type, "linear");
  EXPECT_EQ(c.rope.factor, 2.0);
  // transformers 5 writes rope_parameters with rope_theta inside.
  auto j = nlohmann::json::parse(kQwen3_06B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  j["dtype"] = "float16";
  j.erase("torch_dtype");
  ModelConfig v5 = parse_ok(j.dump());
  EXPECT_EQ(v5.rope.theta, 5e5);
  EXPECT_EQ(v5.torch_dtype, "float16");
  ModelConfig y = parse_ok(edit(kQwen3_06B, "rope_scaling",
                                {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}));
  EXPECT_EQ(y.rope.scaling_type, "yarn");
  EXPECT_EQ(y.rope.original_max_position, 32768);
  EXPECT_EQ(y.rope.beta_fast, 32.0);
}

TEST(ModelConfig, JsonRoundTrip) {
  for (const char* text : {kQwen25_05B, kLlama32_1B, kQwen3_06B, kMistral7B_v03}) {
    ModelConfig a = parse_ok(text);
    ModelConfig b = parse_ok(model_config_to_json(a));
    EXPECT_EQ(model_config_to_json(a), model_config_to_json(b));
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ(a.num_parameters(), b.num_parameters());
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
    EXPECT_EQ(a.rope.scaling_type, b.rope.scaling_type);
    EXPECT_EQ(a.rope.factor, b.rope.factor);
    EXPECT_EQ(a.rope.theta, b.rope.theta);
    EXPECT_EQ(a.attention_bias, b.attention_bias);
    EXPECT_EQ(a.head_dim, b.head_dim);
  }
}

TEST(ModelConfig, LoadFromFolder) {
  TempDir tmp;
  write_bytes(tmp.file("config.json"), kQwen3_06B);
  auto r = load_model_config(tmp.path());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->arch, Arch::Qwen3);
  auto missing = load_model_config(tmp.file("nope"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_HAS(missing.status().message(), "nope: cannot read config.json");
}

// ---- errors -----------------------------------------------------------------

TEST(ModelConfigErrors, MissingRequiredKey) {
  EXPECT_EQ(parse_err(edit(kQwen25_05B, "hidden_size", kRemove)),
            "config.json: missing required key 'hidden_size' (the model's width)");
  TempDir tmp;
  write_bytes(tmp.file("config.json"), edit(kQwen25_05B, "vocab_size", kRemove));
  auto r = load_model_config(tmp.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), tmp.file("config.json") + ": missing required key 'vocab_size' (number of token embeddings)");
}

TEST(ModelConfigErrors, WrongType) {
  EXPECT_EQ(parse_err(edit(kQwen25_05B, "num_attention_heads", "8")),
            "config.json: key 'num_attention_heads' must be an integer, got string \"8\"");
  EXPECT_EQ(parse_err(edit(kQwen25_05B, "tie_word_embeddings", 1)),
            "config.json: key 'tie_word_embeddings' must be true or false, got number 1");
  EXPECT_EQ(parse_err(edit(kQwen25_05B, "hidden_size", 896.5)),
            "config.json: key 'hidden_size' must be an integer, got number 896.5");
  EXPECT_HAS(parse_err(edit(kQwen25_05B, "eos_token_id", {1, "x"})), "key 'eos_token_id' must be an integer");
  EXPECT_HAS(parse_err(edit(kLlama32_1B, "rope_scaling", {{"rope_type", "linear"}, {"factor", "2"}})),
             "key 'rope_scaling.factor' must be a number, got string \"2\"");
}

TEST(ModelConfigErrors, MalformedJsonNamesPosition) {
  const std::string msg = parse_err("{\n  \"hidden_size\": 64,\n  \"vocab_size\": ,\n}");
  EXPECT_HAS(msg, "config.json: malformed JSON: ");
  EXPECT_HAS(msg, "line 3, column 17");
}

TEST(ModelConfigErrors, InconsistentValues) {
  EXPECT_HAS(parse_err(edit(kQwen25_05B, "num_key_value_heads", 4)),
             "num_attention_heads (14) must be a positive multiple of num_key_value_heads (4)");
  EXPECT_HAS(parse_err(edit(kMistral7B_v03, "num_attention_heads", 24)),
             "hidden_size (4096) is not a multiple of num_attention_heads (24); set 'head_dim' explicitly");
  EXPECT_HAS(parse_err(edit(kQwen25_05B, "num_hidden_layers", 0)), "key 'num_hidden_layers' must be positive, got 0");
}

TEST(ModelConfigErrors, UnsupportedFeatures) {
  EXPECT_EQ(parse_err(edit(kQwen25_05B, "hidden_act", "gelu")),
            "config.json: not supported yet: hidden_act=gelu (only silu (SwiGLU MLP) is built)");
  EXPECT_HAS(parse_err(edit(kLlama32_1B, "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}})),
             "not supported yet: rope_scaling.rope_type=dynamic");
  EXPECT_HAS(parse_err(edit(kLlama32_1B, "rope_scaling", {{"type", "longrope"}, {"factor", 2.0}})),
             "not supported yet: rope_scaling.rope_type=longrope");
  EXPECT_HAS(parse_err(edit(kLlama32_1B, "architectures", {"GPT2LMHeadModel"})),
             "not supported yet: architectures[0]=\"GPT2LMHeadModel\"");
  // Mistral 7B v0.1: a 4096 window over 32768 positions is in use.
  EXPECT_HAS(parse_err(edit(kMistral7B_v03, "sliding_window", 4096)), "not supported yet: sliding_window=4096");
  // ...and the class default (key absent) is that same 4096 window.
  EXPECT_HAS(parse_err(edit(kMistral7B_v03, "sliding_window", kRemove)), "not supported yet: sliding_window=4096");
  // Qwen2 with use_sliding_window and layers past max_window_layers.
  const std::string qwen_sw = edit(kQwen25_05B, "use_sliding_window", true);
  EXPECT_HAS(parse_err(edit(qwen_sw.c_str(), "sliding_window", 4096)), "not supported yet: sliding_window=4096");
  // Qwen2.5's own window equals max_position_embeddings: never masks anything.
  EXPECT_TRUE(parse_model_config(qwen_sw, "config.json").is_ok());
  // All layers below max_window_layers: full attention everywhere.
  EXPECT_TRUE(parse_model_config(edit(edit(qwen_sw.c_str(), "sliding_window", 4096).c_str(), "max_window_layers", 24),
                                 "config.json").is_ok());
  // A window covering every position is harmless.
  EXPECT_EQ(parse_ok(edit(kMistral7B_v03, "sliding_window", 32768)).sliding_window, 0);
  EXPECT_HAS(parse_err(edit(kQwen25_05B, "quantization_config", {{"quant_method", "awq"}})),
             "not supported yet: quantization_config");
}

// Found by fuzz_model_config: a number that overflows a double made
// nlohmann throw out_of_range (not parse_error), which escaped as a crash.
TEST(ModelConfig, OverflowingNumberIsAnErrorNotACrash) {
  auto r = kestrel::io::parse_model_config(R"({"hidden_size": 1e3333333333333333333333})", "config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("config.json: malformed JSON"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("number overflow"), std::string::npos) << r.status().message();
}
