// Flash-style causal GQA attention over packed variable-length sequences,
// optionally with shared prefixes. Shapes, dtypes and prefix_of are validated
// by ops/attention.cpp; these assume them.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

struct AttnParams {
  int64_t n_heads = 0;     // query heads; head h reads kv head h / (n_heads / n_kv_heads)
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.f;       // applied to q.k (already resolved: never 0 here)
  int64_t v_head_dim = 0;  // value head width (already resolved: head_dim when the model has no other)
};

// q [T, n_heads*head_dim]; k [T, n_kv_heads*head_dim]; v [T, n_kv_heads*v_head_dim];
// out [T, n_heads*v_head_dim] (all one dtype, f32 or bf16); cu_seqlens: n_seqs+1
// row offsets; lse f32 [n_heads, T].
// prefix_of: null, or n_seqs entries: -1 (plain causal sequence) or the index
// p < b of a plain sequence whose keys sequence b's queries all see before
// b's own causal keys (see ops/attention.h).
// Work is split over (sequence, kv head, up to 256 queries); no [T, T] scores exist.
void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* cu_seqlens,
                   int64_t n_seqs, const AttnParams& p, Tensor& out, Tensor& lse,
                   const int32_t* prefix_of = nullptr);

// FlashAttention-2 backward: probabilities recomputed from q, k and lse,
// D_i = rowsum(dO_i * O_i). Writes dq, dk, dv (=). Work is split over
// (root sequence, kv head): one task owns a plain sequence and every
// sequence continuing it, and sums dK/dV over their queries and the heads of
// the group in a fixed order, so results do not depend on the thread count.
void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const int32_t* cu_seqlens, int64_t n_seqs, const AttnParams& p,
                   Tensor& dq, Tensor& dk, Tensor& dv, const int32_t* prefix_of = nullptr);

}  // namespace kestrel::cpu
