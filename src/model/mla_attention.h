// Multi-head latent attention (DeepSeek-V2/V3), the attention sub-block of
// model/block.h for configs with io::MlaConfig::enabled:
//
//   q      = q_b(norm(q_a(x)))  or  q_proj(x)            [T, H*(nope+rope)]
//   ckv|kpe = kv_a_proj_with_mqa(x)                      [T, kv_lora + rope]
//   ckv    = kv_a_layernorm(ckv)
//   rope on each head's last `rope` columns of q and on kpe (one head, shared)
//   k_h    = [ (kv_b ckv)_h nope part | kpe ],  v_h = (kv_b ckv)_h v part
//   out    = o_proj(attention(q, k, v))                  scale (nope+rope)^-0.5 * yarn mscale^2
//
// Training (and scoring) decompress k and v and run the packed varlen
// attention (head dims nope+rope for q/k, v for v; prefix_of prompt sharing
// as for GQA). Executions with a latent KV cache (the rollout) keep [ckv | kpe]
// per token and attend in latent space with the absorbed kv_b weights
// (BlockExec::attend_latent, ops/mla.h).
//
// Under tensor parallelism each rank holds H / tp heads (q_b_proj or q_proj
// and kv_b_proj split by rows, o_proj by columns, the rest replicated, as
// Megatron's MLA); the replicated tensors' gradients are summed over tp. The
// rollout's latent attention runs at tp = 1 (the rollout refuses tp > 1 for MLA).
#pragma once
#include "model/block.h"

namespace kestrel::model {

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(const io::ModelConfig& cfg, const BlockDims& dims, const std::string& prefix, const ParamFactory& make);
  Tensor forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const override;
  void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) override;
  void append_params(std::vector<Param*>& out) override;
  static int64_t param_count(const io::ModelConfig& cfg);
  const ops::MlaShape& shape() const { return shape_; }

  Param q_proj;                  // [H*qk, D] when q_lora_rank is null
  Param q_a, q_a_bias, q_a_norm; // [q_lora, D], [q_lora] (attention_bias), [q_lora]
  Param q_b;                     // [H*qk, q_lora]
  Param kv_a, kv_a_bias;         // [kv_lora + rope, D], [kv_lora + rope] (attention_bias)
  Param kv_a_norm;               // [kv_lora]
  Param kv_b;                    // [H*(nope + v), kv_lora]
  Param o, o_bias;               // [D, H*v], [D] (attention_bias)

 private:
  ops::AttentionShape attn_shape() const;
  BlockDims dims_;
  ops::MlaShape shape_;
  int64_t q_lora_;
};

}  // namespace kestrel::model
