// HF config.json for decoder-only models, parsed and validated. Every error
// names the file and the key, and says what would fix it. Dense: Llama, Qwen2,
// Qwen3, Mistral; mixture of experts: Qwen2-MoE, Qwen3-MoE; MoE with
// multi-head latent attention: DeepSeek-V2, DeepSeek-V3 (transformers 5.x
// semantics: what its modeling_*.py computes, not a checkpoint's remote code).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/rope.h"

namespace kestrel::io {

enum class Arch { Llama, Qwen2, Qwen3, Mistral, Qwen2Moe, Qwen3Moe, DeepseekV2, DeepseekV3 };
const char* arch_name(Arch a);  // the HF class name, e.g. "Qwen2ForCausalLM", "DeepseekV3ForCausalLM"
const char* default_model_type(Arch a);  // transformers' model_type, e.g. "qwen2", "deepseek_v3"
bool is_qwen_moe(Arch a);                // Qwen2-MoE or Qwen3-MoE
bool is_deepseek(Arch a);                // DeepSeek-V2 or V3

// Routed experts (num_experts == 0: a dense model).
struct MoeConfig {
  int64_t num_experts = 0;               // Qwen num_experts (Qwen3-MoE's v5 name: num_local_experts);
                                         // DeepSeek n_routed_experts
  int64_t top_k = 0;                     // num_experts_per_tok
  int64_t moe_intermediate_size = 0;     // one routed expert's FFN width
  int64_t shared_intermediate_size = 0;  // Qwen2-MoE shared_expert_intermediate_size; DeepSeek
                                         // moe_intermediate_size * n_shared_experts; 0 = no shared expert
                                         // (Qwen2-MoE still has its gate: HF builds it, it scales zeros)
  bool shared_expert_gate = false;       // Qwen2-MoE: sigmoid(shared_expert_gate(x)) scales the shared expert
  bool norm_topk_prob = false;           // divide the k weights by their sum (V3: sum + 1e-20); V2 never
  bool sigmoid_scores = false;           // DeepSeek-V3 (scoring_func sigmoid); else softmax
  // V3 noaux_tc: a group's score is the sum of its top-2 (scores + bias), the top topk_group groups kept, the
  // others -inf; V2 group_limited_greedy: a group's score is its max score, the others' scores set to 0.
  enum class GroupLimit { None, SumTop2, Max } group_limit = GroupLimit::None;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;    // multiplies the k weights, after norm_topk_prob
  bool score_correction_bias = false;    // V3: gate.e_score_correction_bias f32 [E] (a buffer; selection only)
  bool router_fp32 = false;              // V2/V3: the router's logits are computed in f32 from an f32 weight
  int64_t decoder_sparse_step = 1;       // Qwen: layer i is MoE when i not in mlp_only_layers and (i+1) % step == 0
  std::vector<int64_t> mlp_only_layers;  // Qwen
  int64_t first_k_dense_replace = 0;     // DeepSeek: layers [0, k) are dense
  double router_aux_loss_coef = 0.0;     // HF's key (DeepSeek: aux_loss_alpha), kept for round trips (Kestrel trains
                                         // with Megatron's moe_aux_loss_coeff)
  bool operator==(const MoeConfig&) const = default;
};

// Multi-head latent attention (DeepSeek-V2/V3). Per layer: q = q_b_proj(q_a_layernorm(q_a_proj(x))) (or
// q_proj(x) when q_lora_rank is 0) [T, H*(nope+rope)]; [c_kv | k_pe] = kv_a_proj_with_mqa(x)
// [T, kv_lora + rope]; kv_b_proj(kv_a_layernorm(c_kv)) [T, H*(nope+v)]; o_proj [H*v -> hidden].
struct MlaConfig {
  bool enabled = false;
  int64_t q_lora_rank = 0;  // 0 = no query compression (q_lora_rank null: q_proj)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rotate interleaved pairs (V3 rope_interleave, default true; V2 always)
  // (nope+rope)^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 under yarn with mscale_all_dim (HF's
  // DeepseekV2/V3Attention.scaling, the same double).
  double softmax_scale = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool operator==(const MlaConfig&) const = default;
};

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
  // DeepSeek: num_key_value_heads = num_attention_heads, head_dim = rope.head_dim = qk_rope_head_dim (HF's
  // head_dim; the rope table covers only the rope dims), attention_bias = o_proj_bias gives q_a_proj,
  // kv_a_proj_with_mqa and o_proj their biases, mlp_bias the dense and shared-expert MLPs' (V2 only).
  MoeConfig moe;
  MlaConfig mla;

  int64_t q_dim() const { return num_attention_heads * head_dim; }   // not MLA's: see MlaConfig
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // HF's rule of the architecture: Qwen-MoE layer i not in mlp_only_layers with (i+1) % decoder_sparse_step
  // == 0, DeepSeek i >= first_k_dense_replace; never when moe.num_experts == 0.
  bool is_moe_layer(int64_t layer) const;
  // Parameter count of the HF model (embeddings, lm_head when untied, biases, norms, MLA projections, routers,
  // routed and shared experts, shared-expert gates), as sum(p.numel() for p in model.parameters()). Buffers are
  // not parameters: DeepSeek-V3's e_score_correction_bias (E floats per MoE layer) is not counted.
  int64_t num_parameters() const;
};

// Parses config.json text; `origin` (a path) prefixes every error message.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& origin);
Result<ModelConfig> load_model_config(const std::string& path);  // a file or a folder holding config.json
// The config.json transformers would write for this config (round-trips through parse). For the MoE/MLA
// architectures: the keys and values of transformers 5's save_pretrained (dtype, rope_parameters), keys Kestrel
// does not keep (initializer_range, max_window_layers, ...) at their class defaults.
std::string model_config_to_json(const ModelConfig& cfg);

}  // namespace kestrel::io
