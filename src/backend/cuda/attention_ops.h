// CUDA kernels of causal GQA attention (ops/attention.h). cu_seqlens and
// prefix_of are device tensors whose values the ops layer has checked.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cuda {

struct AttnDims {
  int64_t n_heads, n_kv_heads, head_dim;
  float scale;  // resolved (> 0)
  int64_t v_head_dim;
};

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens, const AttnDims& s,
                   Tensor& out, Tensor& lse, const Tensor* prefix_of);
void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const Tensor& cu_seqlens, const AttnDims& s, Tensor& dq, Tensor& dk, Tensor& dv,
                   const Tensor* prefix_of);

// Block attention of ring context parallelism (ops/attention.h attention_block_*): the row
// metadata tensors cu_q, cu_k, q_pos, k_pos are on the device (checked by the ops layer).
struct BlockMeta {
  const Tensor *cu_q, *cu_k, *q_pos, *k_pos;
  int64_t n_seqs;
};
void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const BlockMeta& m, const AttnDims& s,
                         Tensor& out, Tensor& lse);
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const BlockMeta& m, const AttnDims& s, Tensor& dq, Tensor& dk,
                         Tensor& dv);

}  // namespace kestrel::cuda
