// Head-sharded causal attention with GQA: rank r computes query heads
// [r*H/n, (r+1)*H/n) against its kv heads (tp_heads in sharding.h). Attention
// is independent per head, so no communication happens inside: the column-
// parallel q/k/v projections before it produce exactly these heads, and the
// row-parallel o projection after it reduces over them.
// When kv heads are replicated (n_kv_heads < n), every replica sees the
// gradient of only its own query heads; reduce_kv_replica_grad sums them.
#pragma once
#include "comm/process_group.h"
#include "core/tensor.h"
#include "parallel/sharding.h"

namespace kestrel::parallel {

// q: [T, heads.n_heads*head_dim]; k, v: [T, heads.n_kv_heads*head_dim]; out
// [T, heads.n_heads*head_dim]; lse f32 [heads.n_heads, T]. Shapes as ops::attention_fwd.
void tp_attention_fwd(const TpHeads& heads, int64_t head_dim, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& cu_seqlens, Tensor& out, Tensor& lse);
// dq, dk, dv written. With replicated kv heads dk/dv hold this rank's part only;
// summing their effect is left to the linear backward (dx is all-reduced
// anyway) and to reduce_kv_replica_grad for the k/v weight gradients.
void tp_attention_bwd(const TpHeads& heads, int64_t head_dim, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, Tensor& dq,
                      Tensor& dk, Tensor& dv);

// partial: this rank's f32 gradient of a kv-head tensor (k/v weight or bias);
// sums it over the replicas of the same kv head (an all-reduce over tp of an
// [all kv heads] buffer: small under GQA) and accumulates into grad. Without
// replication it only adds partial to grad.
void reduce_kv_replica_grad(comm::ProcessGroup& tp, const TpHeads& heads, Tensor& partial, Tensor& grad);

}  // namespace kestrel::parallel
