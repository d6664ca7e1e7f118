// Today's sub-blocks: dense GQA attention (Llama/Qwen2/Qwen3/Mistral: q/k/v
// biases when attention_bias, o bias for Llama's attention_bias, Qwen3's
// per-head q/k RMSNorm) and the dense SwiGLU MLP (Llama's mlp_bias).
// Tensor parallel as Megatron: q/k/v and gate/up column-parallel, o and down
// row-parallel; kv heads replicated when fewer than the tp ranks.
#pragma once
#include "model/block.h"

namespace kestrel::model {

class DenseAttention final : public AttentionBlock {
 public:
  DenseAttention(const io::ModelConfig& cfg, const BlockDims& dims, const std::string& prefix,
                 const ParamFactory& make);
  Tensor forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const override;
  void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) override;
  void append_params(std::vector<Param*>& out) override;
  static int64_t param_count(const io::ModelConfig& cfg);  // tensors append_params lists

  Param q, k, v, o;                      // [q_dim, D], [kv_dim, D], [kv_dim, D], [D, q_dim] (local shards)
  Param q_bias, k_bias, v_bias, o_bias;  // optional: [q_dim], [kv_dim], [kv_dim], [D]
  Param q_norm, k_norm;                  // Qwen3: [head_dim]

 private:
  // Backward of a k/v projection; sums the grads of kv heads replicated over tp ranks.
  // dx += x's gradient through w (the q projection wrote dx first).
  void kv_linear_bwd(TrainExec& ex, const Tensor& x, Param& w, Param& bias, const Tensor& dy, Tensor& dx);
  BlockDims dims_;
  bool qk_norm_;
};

class DenseMlp final : public MlpBlock {
 public:
  DenseMlp(const io::ModelConfig& cfg, const BlockDims& dims, const std::string& prefix, const ParamFactory& make);
  Tensor forward(BlockExec& ex, const Tensor& x, LayerActivations& A) const override;
  void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) override;
  void append_params(std::vector<Param*>& out) override;
  static int64_t param_count(const io::ModelConfig& cfg);

  Param gate, up, down;                 // [F, D], [F, D], [D, F] (local shards)
  Param gate_bias, up_bias, down_bias;  // optional (Llama mlp_bias)

 private:
  BlockDims dims_;
};

}  // namespace kestrel::model
