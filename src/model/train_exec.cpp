#include "model/train_exec.h"

#include "ops/copy.h"
#include "ops/ops.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {

// i32 [n]: t's values, then `fill` (ids -1: a zero embedding; positions 0).
Tensor pad_i32(const Tensor& t, int64_t n, int32_t fill) {
  if (t.numel() == n) return t;
  Tensor out = Tensor::empty({n}, DType::I32, MemCategory::Activations);
  ops::pad_rows(t, out, float(fill));
  return out;
}

}  // namespace

TrainExec::TrainExec(comm::ProcessGroup& tp_group, bool sequence_parallel, const PackedBatch& b,
                     const ops::RopeTable& rope_table, const parallel::TpHeads& local_heads, int64_t hd)
    : tp(tp_group), sp(sequence_parallel), T(b.num_tokens), batch(b), heads(local_heads), head_dim(hd) {
  const int64_t n = tp.size();
  Tp = sp ? (T + n - 1) / n * n : T;
  Tl = sp ? Tp / n : Tp;
  rope = &rope_table;
  ids = pad_i32(b.input_ids, Tp, -1);
  positions = pad_i32(b.positions, Tp, 0);
  cu_seqlens = b.cu_seqlens;
  apply_capacity = true;  // MoeTrainOptions::capacity_factor applies to training and scoring forwards
  if (b.routed_experts.defined()) routing_replay = &b.routed_experts;
  routing_record = b.record_routing;
}

Tensor TrainExec::buffer(BlockBuf, Shape shape, DType dt) {
  return Tensor::empty(std::move(shape), dt, MemCategory::Activations);
}

Tensor TrainExec::enter(const Tensor& x) { return parallel::tp_enter_fwd(tp, sp, x); }

void TrainExec::linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) { ops::linear_fwd(x, w, b, y); }

void TrainExec::row_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  parallel::row_linear_fwd(tp, sp, x, w, b, y);
}

Tensor TrainExec::attend(int64_t, const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionShape& shape,
                         LayerActivations& A) {
  const int64_t H = shape.n_heads, dt_cols = H * (shape.v_head_dim > 0 ? shape.v_head_dim : shape.head_dim);
  const DType dt = q.dtype();
  // Padding rows (SP only) stay zero: attention runs on the real tokens.
  A.attn = Tp == T ? Tensor::empty({T, dt_cols}, dt, MemCategory::Activations)
                   : Tensor::zeros({Tp, dt_cols}, dt, MemCategory::Activations);
  A.lse = Tensor::empty({H, T}, DType::F32, MemCategory::Activations);
  Tensor out = real_rows(A.attn);
  ops::attention_fwd(real_rows(q), real_rows(k), real_rows(v), batch.cu_seqlens, shape, out, A.lse, prefix_of());
  return A.attn;
}

Tensor TrainExec::grad_buf(GradBuf kind, Shape shape) {
  if (kind == GradBuf::TmpL && Tl == Tp) return grad_buf(GradBuf::TmpD, std::move(shape));
  Tensor& t = grad_bufs_[size_t(kind)];
  if (t.defined()) {
    KS_CHECK(t.shape() == shape, "TrainExec::grad_buf: kind ", int(kind), " is ", t.describe(), ", asked for ",
             shape_str(shape));
    return t;
  }
  const bool zeroed = Tp != T && (kind == GradBuf::DQ || kind == GradBuf::DK || kind == GradBuf::DV);
  t = zeroed ? Tensor::zeros(std::move(shape), DType::F32, MemCategory::Activations)
             : Tensor::empty(std::move(shape), DType::F32, MemCategory::Activations);
  return t;
}

void TrainExec::norm_bwd(const Tensor& x, Param& w, const Tensor& rstd, const Tensor& dy, Tensor& dx) {
  if (!sp) {
    ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, w.grad);
    return;
  }
  Tensor part = Tensor::zeros(w.grad.shape(), DType::F32, MemCategory::Activations);
  ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, part);
  parallel::reduce_replicated_grad(tp, part, w.grad);
}

}  // namespace kestrel::model
