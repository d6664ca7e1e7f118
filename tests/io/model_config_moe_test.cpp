// config.json of the MoE / MLA architectures (Qwen2-MoE, Qwen3-MoE,
// DeepSeek-V2, DeepSeek-V3): Hub configs, HF class defaults, the MoE-layer
// rules, exact parameter counts, round trips, save_pretrained's key set (the
// tiny golden models' config.json), and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/testing.h"
#include "io/model_config.h"
#include "io_test_util.h"

using namespace kestrel;
using namespace kestrel::io;
using Group = MoeConfig::GroupLimit;

namespace {

// Trimmed Hub configs as transformers 5.24 writes them (AutoConfig.from_pretrained + save_pretrained of the
// published config.json: dtype, rope_parameters, Qwen3-MoE's num_local_experts; layer_types and
// transformers_version dropped). DeepSeek's keep the keys HF ignores (aux_loss_alpha, ep_size, moe_layer_freq,
// scoring_func, seq_aux, topk_method); DeepSeek-V3's fp8 quantization_config is left out.
const char* kQwen15MoeA27B = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "mlp_only_layers": [], "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": null, "qkv_bias": true,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632, "sliding_window": 0,
  "tie_word_embeddings": false, "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "num_local_experts": 128, "output_router_logits": false,
  "pad_token_id": null, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kDeepSeekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "dtype": "bfloat16", "eos_token_id": 100001,
  "first_k_dense_replace": 1, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840, "mlp_bias": false,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
  "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "output_router_logits": false,
  "pad_token_id": null, "pretraining_tp": 1, "q_lora_rank": null, "qk_head_dim": 192, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_parameters": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                      "original_max_position_embeddings": 4096, "rope_theta": 10000, "rope_type": "yarn"},
  "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true, "tie_word_embeddings": false,
  "topk_group": 1, "topk_method": "greedy", "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})";

const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "dtype": "bfloat16", "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "head_dim": 64, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "output_router_logits": false, "pad_token_id": null,
  "pretraining_tp": 1, "q_lora_rank": 1536, "qk_head_dim": 192, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06, "rope_interleave": true,
  "rope_parameters": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "rope_theta": 10000, "rope_type": "yarn"},
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true, "tie_word_embeddings": false,
  "topk_group": 4, "topk_method": "noaux_tc", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

const char* const kHubConfigs[] = {kQwen15MoeA27B, kQwen3_30B_A3B, kDeepSeekV2Lite, kDeepSeekV3};
const char* const kGoldenCases[] = {"qwen2_moe",      "qwen3_moe",      "deepseek_v2",      "deepseek_v3",
                                    "qwen2_moe_bf16", "qwen3_moe_bf16", "deepseek_v2_bf16", "deepseek_v3_bf16"};

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

const nlohmann::json kRemove = nlohmann::json::value_t::discarded;
// A config with keys changed (kRemove: removed).
std::string edit(const std::string& base, std::initializer_list<std::pair<const char*, nlohmann::json>> changes) {
  auto j = nlohmann::json::parse(base);
  for (const auto& [k, v] : changes) {
    if (v.is_discarded()) j.erase(k);
    else j[k] = v;
  }
  return j.dump();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.o_proj_bias, b.o_proj_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  const ops::RopeConfig &r = a.rope, &s = b.rope;
  EXPECT_EQ(r.head_dim, s.head_dim);
  EXPECT_EQ(r.theta, s.theta);
  EXPECT_EQ(r.scaling_type, s.scaling_type);
  EXPECT_EQ(r.factor, s.factor);
  EXPECT_EQ(r.low_freq_factor, s.low_freq_factor);
  EXPECT_EQ(r.high_freq_factor, s.high_freq_factor);
  EXPECT_EQ(r.original_max_position, s.original_max_position);
  EXPECT_EQ(r.beta_fast, s.beta_fast);
  EXPECT_EQ(r.beta_slow, s.beta_slow);
  EXPECT_EQ(r.attention_factor, s.attention_factor);
  EXPECT_EQ(r.mscale, s.mscale);
  EXPECT_EQ(r.mscale_all_dim, s.mscale_all_dim);
  EXPECT_EQ(r.truncate, s.truncate);
  EXPECT_TRUE(a.moe == b.moe);
  EXPECT_TRUE(a.mla == b.mla);
  EXPECT_EQ(a.num_parameters(), b.num_parameters());
}

std::vector<int64_t> moe_layers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_moe_layer(l)) out.push_back(l);
  return out;
}

}  // namespace

// ---- Hub configs ----------------------------------------------------------------

TEST(ModelConfigMoe, Qwen15MoeA27B) {
  ModelConfig c = parse_ok(kQwen15MoeA27B);
  EXPECT_EQ(c.arch, Arch::Qwen2Moe);
  EXPECT_STREQ(arch_name(c.arch), "Qwen2MoeForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.attention_bias);  // qkv_bias
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.mla.enabled);
  EXPECT_EQ(c.moe.num_experts, 60);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.moe_intermediate_size, 1408);
  EXPECT_EQ(c.moe.shared_intermediate_size, 5632);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.moe.sigmoid_scores);
  EXPECT_EQ(c.moe.group_limit, Group::None);
  EXPECT_FALSE(c.moe.router_fp32);
  EXPECT_EQ(c.moe.router_aux_loss_coef, 0.001);
  EXPECT_EQ(moe_layers(c).size(), 24u);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.num_parameters(), 14315784192);  // "14.3B"; sum(p.numel()) of Qwen2MoeForCausalLM on the meta device
}

TEST(ModelConfigMoe, Qwen3_30B_A3B) {
  ModelConfig c = parse_ok(kQwen3_30B_A3B);
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_EQ(c.head_dim, 128);  // explicit; hidden/heads would be 64
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.moe.num_experts, 128);  // from num_local_experts, the name transformers 5 saves it under
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 768);
  EXPECT_EQ(c.moe.shared_intermediate_size, 0);
  EXPECT_FALSE(c.moe.shared_expert_gate);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(moe_layers(c).size(), 48u);
  EXPECT_EQ(c.num_parameters(), 30532122624);  // "30.5B"
  // The 4.x name of the key.
  const std::string v4_name = edit(kQwen3_30B_A3B, {{"num_local_experts", kRemove}, {"num_experts", 128}});
  EXPECT_EQ(parse_ok(v4_name).moe.num_experts, 128);
}

TEST(ModelConfigMoe, DeepSeekV2Lite) {
  ModelConfig c = parse_ok(kDeepSeekV2Lite);
  EXPECT_EQ(c.arch, Arch::DeepseekV2);
  EXPECT_TRUE(c.mla.enabled);
  EXPECT_EQ(c.mla.q_lora_rank, 0);  // null: q_proj
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(c.mla.qk_head_dim(), 192);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.rope.scaling_type, "yarn");
  EXPECT_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.mscale, 0.707);
  EXPECT_EQ(c.rope.mscale_all_dim, 0.707);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  // HF's DeepseekV2Attention.scaling: 192**-0.5 * yarn_get_mscale(40, 0.707)**2 (Python's doubles)
  EXPECT_EQ(c.mla.softmax_scale, 0.1147213867929261);
  EXPECT_EQ(c.moe.num_experts, 64);
  EXPECT_EQ(c.moe.top_k, 6);
  EXPECT_EQ(c.moe.shared_intermediate_size, 2 * 1408);
  EXPECT_FALSE(c.moe.shared_expert_gate);
  EXPECT_FALSE(c.moe.sigmoid_scores);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.group_limit, Group::None);  // greedy
  EXPECT_TRUE(c.moe.router_fp32);
  EXPECT_FALSE(c.moe.score_correction_bias);
  EXPECT_EQ(c.moe.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe.router_aux_loss_coef, 0.001);  // aux_loss_alpha
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.bos_token_id, 100000);
  EXPECT_EQ(c.num_parameters(), 15706484224);  // "15.7B"
}

TEST(ModelConfigMoe, DeepSeekV3) {
  ModelConfig c = parse_ok(kDeepSeekV3);
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_EQ(c.mla.softmax_scale, 0.1352337788608801);  // 192**-0.5 * yarn_get_mscale(40, 1.0)**2
  EXPECT_EQ(c.rope.mscale, 1.0);
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 2048);
  EXPECT_EQ(c.moe.shared_intermediate_size, 2048);
  EXPECT_TRUE(c.moe.sigmoid_scores);
  EXPECT_TRUE(c.moe.score_correction_bias);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.group_limit, Group::SumTop2);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.moe.first_k_dense_replace, 3);
  EXPECT_EQ(moe_layers(c).size(), 58u);
  EXPECT_FALSE(c.mlp_bias);
  // "671B": the 61 layers without the MTP module (HF builds none); the 58 x 256 e_score_correction_bias
  // floats are buffers, not counted.
  EXPECT_EQ(c.num_parameters(), 671026404352);
}

// ---- rules and defaults -------------------------------------------------------------

TEST(ModelConfigMoe, IsMoeLayerRules) {
  // Qwen: not in mlp_only_layers and (i+1) % decoder_sparse_step == 0.
  ModelConfig q = parse_ok(edit(kQwen15MoeA27B, {{"num_hidden_layers", 6}, {"decoder_sparse_step", 2},
                                                 {"mlp_only_layers", {3, 9}}}));
  EXPECT_EQ(moe_layers(q), (std::vector<int64_t>{1, 5}));
  // num_parameters counts the MoE layers without visiting each: repeated and dense-anyway entries count once.
  ModelConfig q_dup = parse_ok(edit(kQwen15MoeA27B, {{"num_hidden_layers", 6}, {"decoder_sparse_step", 2},
                                                     {"mlp_only_layers", {3, 3, 0, 9, -1}}}));
  EXPECT_EQ(moe_layers(q_dup), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(q_dup.num_parameters(), q.num_parameters());
  // ...and validating a file's layer count does not loop over it.
  EXPECT_TRUE(parse_model_config(edit(kDeepSeekV3, {{"num_hidden_layers", int64_t(1) << 60}}), "c").is_ok());
  EXPECT_TRUE(parse_model_config(edit(kQwen3_30B_A3B, {{"num_hidden_layers", int64_t(1) << 60}}), "c").is_ok());
  EXPECT_EQ(moe_layers(parse_ok(edit(kQwen3_30B_A3B, {{"num_hidden_layers", 4}, {"mlp_only_layers", {0, 2}}}))),
            (std::vector<int64_t>{1, 3}));
  // num_experts 0: a dense model with intermediate_size MLPs.
  ModelConfig dense = parse_ok(edit(kQwen15MoeA27B, {{"num_experts", 0}}));
  EXPECT_TRUE(moe_layers(dense).empty());
  EXPECT_FALSE(dense.is_moe_layer(-1));
  EXPECT_FALSE(q.is_moe_layer(6));  // past the last layer
  // DeepSeek: layers from first_k_dense_replace on.
  ModelConfig d = parse_ok(edit(kDeepSeekV2Lite, {{"num_hidden_layers", 4}, {"first_k_dense_replace", 2}}));
  EXPECT_EQ(moe_layers(d), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(moe_layers(parse_ok(edit(kDeepSeekV3, {{"first_k_dense_replace", 61}}))).empty());
  // Dense architectures never.
  ModelConfig llama = parse_ok(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2})");
  EXPECT_TRUE(moe_layers(llama).empty());
  EXPECT_FALSE(llama.mla.enabled);
}

TEST(ModelConfigMoe, ClassDefaults) {
  const std::string base = R"({"vocab_size": 100, "hidden_size": 256, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 16)";
  ModelConfig q2 = parse_ok(base + R"(, "model_type": "qwen2_moe"})");
  EXPECT_EQ(q2.arch, Arch::Qwen2Moe);
  EXPECT_EQ(q2.num_key_value_heads, 16);  // Qwen2MoeConfig: 16, whatever num_attention_heads is
  EXPECT_EQ(q2.head_dim, 16);
  EXPECT_EQ(q2.moe.num_experts, 60);
  EXPECT_EQ(q2.moe.top_k, 4);
  EXPECT_EQ(q2.moe.moe_intermediate_size, 1408);
  EXPECT_EQ(q2.moe.shared_intermediate_size, 5632);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_EQ(q2.max_position_embeddings, 32768);
  EXPECT_EQ(q2.bos_token_id, -1);
  EXPECT_EQ(q2.moe.router_aux_loss_coef, 0.001);
  ModelConfig q3 = parse_ok(base + R"(, "model_type": "qwen3_moe"})");
  EXPECT_EQ(q3.num_key_value_heads, 4);
  EXPECT_EQ(q3.head_dim, 16);  // hidden/heads: Qwen3MoeConfig has no head_dim default of 128
  EXPECT_EQ(q3.moe.num_experts, 128);
  EXPECT_EQ(q3.moe.top_k, 8);
  EXPECT_EQ(q3.moe.moe_intermediate_size, 768);
  ModelConfig v3 = parse_ok(base + R"(, "model_type": "deepseek_v3", "num_key_value_heads": 16})");
  EXPECT_EQ(v3.mla.q_lora_rank, 1536);
  EXPECT_EQ(v3.mla.kv_lora_rank, 512);
  EXPECT_EQ(v3.head_dim, 64);
  EXPECT_EQ(v3.moe.num_experts, 256);
  EXPECT_EQ(v3.moe.n_group, 8);
  EXPECT_EQ(v3.moe.topk_group, 4);
  EXPECT_EQ(v3.moe.first_k_dense_replace, 3);
  EXPECT_EQ(v3.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(v3.max_position_embeddings, 4096);
  EXPECT_EQ(v3.bos_token_id, 0);
  EXPECT_EQ(v3.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_DOUBLE_EQ(v3.mla.softmax_scale, 1.0 / std::sqrt(192.0));
  EXPECT_TRUE(moe_layers(v3).empty());  // first_k_dense_replace 3 > 2 layers
  // DeepseekV2Config: num_key_value_heads = heads; num_experts_per_tok has no default.
  const std::string v2 = base + R"(, "model_type": "deepseek_v2", "num_experts_per_tok": 6})";
  ModelConfig c2 = parse_ok(v2);
  EXPECT_EQ(c2.num_key_value_heads, 16);
  EXPECT_EQ(c2.moe.num_experts, 64);
  EXPECT_EQ(c2.moe.moe_intermediate_size, 1407);
  EXPECT_EQ(c2.moe.shared_intermediate_size, 2 * 1407);
  EXPECT_EQ(c2.moe.first_k_dense_replace, 0);
  EXPECT_EQ(c2.max_position_embeddings, 2048);
  EXPECT_EQ(c2.bos_token_id, 1);
  EXPECT_EQ(parse_err(edit(v2, {{"num_experts_per_tok", kRemove}})),
            "config.json: missing required key 'num_experts_per_tok' (experts per token; DeepseekV2ForCausalLM has no "
            "default)");
  // q_lora_rank: absent is the default 1536, null is none.
  EXPECT_EQ(parse_ok(edit(kDeepSeekV2Lite, {{"q_lora_rank", kRemove}})).mla.q_lora_rank, 1536);
  // rope_interleave false: rotate_half on the rope dims (V3 only; V2 always interleaves).
  EXPECT_FALSE(parse_ok(edit(kDeepSeekV3, {{"rope_interleave", false}})).mla.rope_interleave);
  EXPECT_TRUE(parse_ok(edit(kDeepSeekV2Lite, {{"rope_interleave", false}})).mla.rope_interleave);
  // group_limited_greedy: the max-score group limit.
  ModelConfig g = parse_ok(edit(kDeepSeekV2Lite, {{"topk_method", "group_limited_greedy"}, {"n_group", 8},
                                                  {"topk_group", 3}}));
  EXPECT_EQ(g.moe.group_limit, Group::Max);
  EXPECT_EQ(g.moe.n_group, 8);
  EXPECT_EQ(g.moe.topk_group, 3);
  // attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj; mlp_bias: dense + shared MLPs (V2).
  ModelConfig b = parse_ok(edit(kDeepSeekV2Lite, {{"attention_bias", true}, {"mlp_bias", true}}));
  const ModelConfig lite = parse_ok(kDeepSeekV2Lite);
  const int64_t kv_a = 512 + 64, h = 2048, L = 27;
  EXPECT_EQ(b.num_parameters() - lite.num_parameters(),
            L * (kv_a + h)                      // q_proj has none (no query compression)
                + (2 * 10944 + h)               // layer 0's dense MLP
                + (L - 1) * (2 * 2 * 1408 + h));  // the shared experts
  // A Qwen3-MoE with attention_bias: q/k/v/o biases.
  ModelConfig qb = parse_ok(edit(kQwen3_30B_A3B, {{"attention_bias", true}}));
  EXPECT_TRUE(qb.o_proj_bias);
  EXPECT_EQ(qb.num_parameters() - parse_ok(kQwen3_30B_A3B).num_parameters(), 48 * (4096 + 2 * 512 + 2048));
}

// ---- round trips -----------------------------------------------------------------

TEST(ModelConfigMoe, JsonRoundTrip) {
  std::vector<std::string> texts(std::begin(kHubConfigs), std::end(kHubConfigs));
  texts.push_back(edit(kQwen15MoeA27B, {{"mlp_only_layers", {1, 3}}, {"decoder_sparse_step", 2}, {"qkv_bias", false},
                                        {"head_dim", 64}, {"eos_token_id", {1, 2}}}));
  texts.push_back(edit(kDeepSeekV2Lite, {{"topk_method", "group_limited_greedy"}, {"n_group", 8}, {"topk_group", 3},
                                         {"mlp_bias", true}, {"q_lora_rank", 384}, {"rope_parameters", nullptr}}));
  texts.push_back(edit(kDeepSeekV3, {{"rope_interleave", false}, {"n_group", 1}, {"topk_group", 1},
                                     {"attention_bias", true}, {"aux_loss_alpha", kRemove}}));
  // A dense model's yarn with mscale keys (the attention factor is their ratio) keeps them too.
  texts.push_back(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "mscale": 0.707, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}})");
  for (const std::string& text : texts) {
    ModelConfig a = parse_ok(text);
    const std::string out = model_config_to_json(a);
    ModelConfig b = parse_ok(out);
    SCOPED_TRACE(out);
    expect_same(a, b);
    EXPECT_EQ(out, model_config_to_json(b));
  }
}

// The tiny golden models' config.json is what save_pretrained wrote: Kestrel writes the same keys and values
// back, and counts the parameters meta.json lists (all tensors of model.safetensors but the correction bias).
TEST(ModelConfigMoe, GoldenConfigsAreWhatSavePretrainedWrites) {
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    const std::string dir = kestrel::testing::source_path(std::string("tests/golden/models/") + name);
    auto r = load_model_config(dir);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    auto hf = nlohmann::json::parse(read_text(dir + "/config.json"));
    hf.erase("transformers_version");
    EXPECT_EQ(nlohmann::json::parse(model_config_to_json(*r)), hf) << model_config_to_json(*r);

    const auto meta = nlohmann::json::parse(read_text(dir + "/meta.json"));
    int64_t params = 0;
    for (const auto& [tensor, shape] : meta.at("shapes").items()) {
      int64_t n = 1;
      for (const auto& d : shape) n *= d.get<int64_t>();
      if (tensor.find("e_score_correction_bias") == std::string::npos) params += n;
    }
    EXPECT_EQ(r->num_parameters(), params);
    std::vector<int64_t> want;
    for (const auto& l : meta.at("moe_layers")) want.push_back(l.get<int64_t>());
    EXPECT_EQ(moe_layers(*r), want);
  }
  ModelConfig v3 = load_model_config(kestrel::testing::source_path("tests/golden/models/deepseek_v3")).value();
  EXPECT_EQ(v3.mla.softmax_scale, 0.32411924819517657);  // 16**-0.5 * (0.1 ln 4 + 1)**2
  EXPECT_EQ(v3.rope.scaling_type, "yarn");
  EXPECT_EQ(v3.rope.original_max_position, 16);
}

// ---- refusals -------------------------------------------------------------------

TEST(ModelConfigMoeErrors, RoutingHfDoesNotCompute) {
  EXPECT_EQ(parse_err(edit(kDeepSeekV3, {{"scoring_func", "softmax"}})),
            "config.json: not supported yet: scoring_func=softmax (DeepseekV3ForCausalLM scores with sigmoid)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"scoring_func", "sqrtsoftplus"}})),
             "not supported yet: scoring_func=sqrtsoftplus (DeepseekV2ForCausalLM scores with softmax)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"topk_method", "noaux_tc"}})),
             "not supported yet: topk_method=noaux_tc (DeepseekV2ForCausalLM computes greedy and "
             "group_limited_greedy)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"topk_method", "greedy"}})), "not supported yet: topk_method=greedy");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"norm_topk_prob", true}})),
             "not supported yet: norm_topk_prob=true (DeepseekV2ForCausalLM never normalises");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"moe_layer_freq", 2}})),
             "not supported yet: moe_layer_freq=2 (DeepseekV3ForCausalLM makes every layer from "
             "first_k_dense_replace on MoE; set it to 1)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"topk_method", "group_limited_greedy"}, {"n_group", kRemove}})),
             "missing required key 'n_group' (topk_method group_limited_greedy)");
}

TEST(ModelConfigMoeErrors, InconsistentExperts) {
  EXPECT_EQ(parse_err(edit(kDeepSeekV3, {{"n_group", 6}})),
            "config.json: n_routed_experts (256) must be divisible by n_group (6): experts are grouped evenly; fix "
            "n_group");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"topk_group", 9}})), "key 'topk_group' (9) must be in [1, n_group = 8]");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"n_group", 256}, {"topk_group", 8}})),
             "n_group (256) leaves 1 expert per group; noaux_tc scores a group by its top 2, so use n_group <= 128");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"topk_group", 1}, {"num_experts_per_tok", 40}})),
             "num_experts_per_tok (40) exceeds the experts of the topk_group (1) kept groups (32); raise topk_group");
  EXPECT_EQ(parse_err(edit(kQwen3_30B_A3B, {{"num_experts_per_tok", 129}})),
            "config.json: key 'num_experts_per_tok' (129) must be in [1, num_experts = 128]");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"num_experts_per_tok", 0}})),
             "key 'num_experts_per_tok' (0) must be in [1, n_routed_experts = 64]");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"n_routed_experts", 0}})), "key 'n_routed_experts' must be positive");
  EXPECT_HAS(parse_err(edit(kQwen15MoeA27B, {{"decoder_sparse_step", 0}})),
             "key 'decoder_sparse_step' must be positive");
  EXPECT_HAS(parse_err(edit(kQwen15MoeA27B, {{"moe_intermediate_size", 0}})),
             "key 'moe_intermediate_size' must be positive, got 0");
  EXPECT_HAS(parse_err(edit(kQwen3_30B_A3B, {{"num_experts", 64}})),
             "keys 'num_experts' (64) and 'num_local_experts' (128) name the same number and differ; keep one");
  EXPECT_HAS(parse_err(edit(kQwen15MoeA27B, {{"mlp_only_layers", 3}})),
             "key 'mlp_only_layers' must be a list of layer indices, got number 3");
  // No MoE layer at all: the router keys are not needed.
  EXPECT_TRUE(parse_model_config(edit(kDeepSeekV3, {{"first_k_dense_replace", 61}, {"n_group", 6}}), "c").is_ok());
}

TEST(ModelConfigMoeErrors, AttentionShapes) {
  EXPECT_EQ(parse_err(edit(kDeepSeekV2Lite, {{"num_key_value_heads", 8}})),
            "config.json: num_key_value_heads (8) must equal num_attention_heads (16) for DeepseekV2ForCausalLM "
            "(multi-head latent attention); set it to 16");
  // DeepseekV3Config's num_key_value_heads default is 128 whatever num_attention_heads is.
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"num_attention_heads", 64}, {"num_key_value_heads", kRemove}})),
             "num_key_value_heads (128) must equal num_attention_heads (64)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV2Lite, {{"num_attention_heads", 15}, {"num_key_value_heads", 15}})),
             "hidden_size (2048) is not a multiple of num_attention_heads (15); DeepseekV2Config refuses it");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"qk_rope_head_dim", 63}})),
             "key 'qk_rope_head_dim' must be a positive even number (rotary embedding pairs), got 63");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"q_lora_rank", 0}})),
             "key 'q_lora_rank' must be positive, got 0; null means no query compression");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"kv_lora_rank", 0}})), "key 'kv_lora_rank' must be positive, got 0");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0},
                                                               {"mscale_all_dim", 1.0}}}})),
             "not supported yet: rope_parameters.mscale_all_dim with rope_type linear");
  EXPECT_HAS(parse_err(edit(kQwen15MoeA27B, {{"num_key_value_heads", 5}})),
             "num_attention_heads (16) must be a positive multiple of num_key_value_heads (5)");
}

TEST(ModelConfigMoeErrors, SlidingWindowAndQuantization) {
  // Qwen3-MoE: use_sliding_window applies the window to every layer.
  EXPECT_HAS(parse_err(edit(kQwen3_30B_A3B, {{"use_sliding_window", true}, {"sliding_window", 4096}})),
             "not supported yet: sliding_window=4096");
  // Qwen2-MoE: to the even layers below max_window_layers (layer 0 is one of them).
  EXPECT_HAS(parse_err(edit(kQwen15MoeA27B, {{"use_sliding_window", true}, {"sliding_window", 4096}})),
             "not supported yet: sliding_window=4096");
  EXPECT_TRUE(parse_model_config(edit(kQwen15MoeA27B, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                                       {"max_window_layers", 0}}),
                                 "c").is_ok());
  EXPECT_TRUE(parse_model_config(edit(kQwen15MoeA27B, {{"use_sliding_window", true}, {"sliding_window", 8192}}),
                                 "c").is_ok());  // covers every position
  // Without use_sliding_window the window is off (Qwen2MoeConfig stores 0, Qwen3MoeConfig null).
  EXPECT_EQ(parse_ok(edit(kQwen3_30B_A3B, {{"sliding_window", 4096}})).sliding_window, 0);
  // DeepSeek-V3's Hub checkpoint is fp8.
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"quantization_config", {{"quant_method", "fp8"}}}})),
             "not supported yet: quantization_config (load an unquantized checkpoint)");
  EXPECT_HAS(parse_err(edit(kDeepSeekV3, {{"architectures", {"DeepseekV32ForCausalLM"}}})),
             "not supported yet: architectures[0]=\"DeepseekV32ForCausalLM\" (supported: LlamaForCausalLM, "
             "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, "
             "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
}
