#include "parallel/tp_attention.h"

#include "ops/attention.h"
#include "ops/linear.h"

namespace kestrel::parallel {

namespace {
ops::AttentionShape local_shape(const TpHeads& h, int64_t head_dim) {
  ops::AttentionShape s;
  s.n_heads = h.n_heads;
  s.n_kv_heads = h.n_kv_heads;
  s.head_dim = head_dim;
  return s;
}
}  // namespace

void tp_attention_fwd(const TpHeads& heads, int64_t head_dim, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& cu_seqlens, Tensor& out, Tensor& lse) {
  ops::attention_fwd(q, k, v, cu_seqlens, local_shape(heads, head_dim), out, lse);
}

void tp_attention_bwd(const TpHeads& heads, int64_t head_dim, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, Tensor& dq,
                      Tensor& dk, Tensor& dv) {
  ops::attention_bwd(q, k, v, out, lse, dout, cu_seqlens, local_shape(heads, head_dim), dq, dk, dv);
}

void reduce_kv_replica_grad(comm::ProcessGroup& tp, const TpHeads& heads, Tensor& partial, Tensor& grad) {
  KS_CHECK(partial.dtype() == DType::F32 && grad.dtype() == DType::F32 && partial.numel() == grad.numel(),
           "reduce_kv_replica_grad: partial ", partial.describe(), " and grad ", grad.describe(),
           " must be f32 of one size");
  if (heads.kv_replicas == 1) {
    ops::add_inplace(grad, partial);
    return;
  }
  const int64_t n_kv_total = tp.size() / heads.kv_replicas, per = partial.numel();
  // [all kv heads, per]: this rank's kv head in its row, zeros elsewhere, so
  // the sum over the group adds up the replicas of each head.
  Tensor all = Tensor::zeros({n_kv_total, per}, DType::F32, MemCategory::Activations, partial.device());
  Tensor mine = all.slice_rows(heads.kv_head_begin, heads.kv_head_begin + 1);  // [1, per]
  mine.copy_from(partial);
  tp.all_reduce(all, comm::ReduceOp::Sum);
  partial.copy_from(mine);
  ops::add_inplace(grad, partial);
}

}  // namespace kestrel::parallel
