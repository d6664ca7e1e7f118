#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

struct AttentionShape {
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // GQA: n_heads % n_kv_heads == 0
  int64_t head_dim = 0;
  float scale = 0.f;       // 0 = 1/sqrt(head_dim)
};

// Causal self-attention over packed variable-length sequences.
// q: [T, n_heads*head_dim]; k, v: [T, n_kv_heads*head_dim]; cu_seqlens: i32 [B+1]
// (sequence b is rows cu_seqlens[b]..cu_seqlens[b+1]); out: [T, n_heads*head_dim];
// lse: f32 [n_heads, T], log-sum-exp of the scaled scores, kept for backward.
void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                   const AttentionShape& s, Tensor& out, Tensor& lse);
// dq, dk, dv written (same shapes as q, k, v).
void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const Tensor& cu_seqlens, const AttentionShape& s, Tensor& dq, Tensor& dk,
                   Tensor& dv);

}  // namespace kestrel::ops
