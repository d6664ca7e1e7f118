// What the forward keeps for the backward, per layer. Named fields (not a
// generic map) so that recompute (model/recompute.h) and offload policies
// choose exactly which to drop and rebuild: a dropped field is left undefined
// by the forward and rebuilt by the backward right before its use.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "model/recompute.h"

namespace kestrel::model {

struct LayerActivations {
  Tensor x_in;      // [T, D] residual stream entering the layer
  Tensor norm1;     // [T, D] input_layernorm output
  Tensor rstd1;     // f32 [T]
  Tensor q_lin;     // [T, q_dim] q projection before q_norm (Qwen3 only)
  Tensor k_lin;     // [T, kv_dim] k projection before k_norm (Qwen3 only)
  Tensor rstd_q;    // f32 [T*H] (Qwen3)
  Tensor rstd_k;    // f32 [T*Hkv] (Qwen3)
  Tensor q, k, v;   // [T, q_dim], [T, kv_dim], [T, kv_dim] as attention saw them (post-RoPE)
  Tensor attn;      // [T, q_dim] attention output
  Tensor lse;       // f32 [H, T]
  Tensor x_mid;     // [T, D] residual after attention
  Tensor norm2;     // [T, D] post_attention_layernorm output
  Tensor rstd2;     // f32 [T]
  Tensor gate, up;  // [T, F]
  Tensor act;       // [T, F] silu(gate) * up
  BlockRecompute rc;  // what this block's forward drops (training only; default: keep everything)
};

struct Activations {
  std::vector<LayerActivations> layers;
  Tensor x_final;   // [T, D] residual entering the final norm
  Tensor normf;     // [T, D] final norm output (lm_head input)
  Tensor rstdf;     // f32 [T]
  void clear() { *this = Activations(); }
};

}  // namespace kestrel::model
