#include "model/train_exec.h"

#include "ops/copy.h"
#include "ops/ops.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {

// i32 [n]: t's values, then `fill` (ids -1: a zero embedding; positions 0).
Tensor pad_i32(const Tensor& t, int64_t n, int32_t fill) {
  if (t.numel() == n) return t;
  Tensor out = Tensor::empty({n}, DType::I32, MemCategory::Activations, t.device());
  ops::pad_rows(t, out, float(fill));
  return out;
}

}  // namespace

TrainExec::TrainExec(comm::ProcessGroup& tp_group, bool sequence_parallel, const PackedBatch& b,
                     const ops::RopeTable& rope_table, const parallel::TpHeads& local_heads, int64_t hd,
                     const parallel::CpGroups* cp_groups)
    : tp(tp_group), sp(sequence_parallel), T(b.num_tokens), batch(b), heads(local_heads), head_dim(hd),
      cp(cp_groups) {
  KS_CHECK(!b.cp || cp, "a context-parallel rank's batch needs the model's cp groups (ModelParallel::cp)");
  KS_CHECK(!b.cp || b.cp->cp == cp->cp->size(), "a batch split for cp ", b.cp ? b.cp->cp : 1, " on a model with cp ",
           cp ? cp->cp->size() : 1);
  device = b.input_ids.device();
  const int64_t n = tp.size();
  Tp = sp ? (T + n - 1) / n * n : T;
  Tl = sp ? Tp / n : Tp;
  rope = &rope_table;
  ids = pad_i32(b.input_ids, Tp, -1);
  positions = pad_i32(b.positions, Tp, 0);
  cu_seqlens = b.cu_seqlens;
  Tr = T;
  if (sp && n > 1) seq_tp = &tp;
  apply_capacity = true;  // MoeTrainOptions::capacity_factor applies to training and scoring forwards
  if (b.routed_experts.defined()) routing_replay = &b.routed_experts;
  routing_record = b.record_routing;
}

Tensor TrainExec::buffer(BlockBuf, Shape shape, DType dt) {
  return scratch(std::move(shape), dt);
}

Tensor TrainExec::enter(const Tensor& x) { return parallel::tp_enter_fwd(tp, sp, x); }

// The packs multiply only at tp = 1: under tp a row-parallel product is a
// partial sum to reduce (parallel/tp_layers.h).
void TrainExec::linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  if (!(packs && tp.size() == 1 && packs->linear(x, w, b, y))) ops::linear_fwd(x, w, b, y);
}

void TrainExec::row_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  if (!(packs && tp.size() == 1 && packs->linear(x, w, b, y))) parallel::row_linear_fwd(tp, sp, x, w, b, y);
}

Tensor TrainExec::attend(int64_t, const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionShape& shape,
                         LayerActivations& A) {
  const int64_t H = shape.n_heads, dt_cols = H * (shape.v_head_dim > 0 ? shape.v_head_dim : shape.head_dim);
  const DType dt = q.dtype();
  // Padding rows (SP only) stay zero: attention runs on the real tokens.
  A.attn = Tp == T ? scratch({T, dt_cols}, dt) : scratch({Tp, dt_cols}, dt, /*zeroed=*/true);
  A.lse = batch.cp ? Tensor() : scratch({H, T}, DType::F32);
  Tensor out = real_rows(A.attn);
  if (batch.cp) {
    // The cp attention keeps its own lse (of the work layout's rows and heads).
    auto saved = std::make_shared<parallel::CpAttentionSaved>();
    parallel::cp_attention_fwd(*cp, *batch.cp, shape, real_rows(q), real_rows(k), real_rows(v), out, *saved);
    A.lse = saved->lse;
    A.cp_attn = std::move(saved);
    return A.attn;
  }
  ops::attention_fwd(real_rows(q), real_rows(k), real_rows(v), batch.cu_seqlens, shape, out, A.lse, prefix_of());
  return A.attn;
}

void TrainExec::attend_bwd(const LayerActivations& A, const Tensor& dattn, const ops::AttentionShape& shape,
                           Tensor& dq, Tensor& dk, Tensor& dv) {
  Tensor dq_r = real_rows(dq), dk_r = real_rows(dk), dv_r = real_rows(dv);
  if (batch.cp) {
    KS_CHECK(A.cp_attn, "context-parallel attention backward without its forward's saved state");
    parallel::cp_attention_bwd(*cp, *batch.cp, shape, *A.cp_attn, real_rows(dattn), dq_r, dk_r, dv_r);
    return;
  }
  ops::attention_bwd(real_rows(A.q), real_rows(A.k), real_rows(A.v), real_rows(A.attn), A.lse, real_rows(dattn),
                     batch.cu_seqlens, shape, dq_r, dk_r, dv_r, prefix_of());
}

Tensor TrainExec::grad_buf(GradBuf kind, Shape shape) {
  Tensor& t = grad_bufs_[size_t(kind)];
  if (t.defined()) {
    KS_CHECK(t.shape() == shape, "TrainExec::grad_buf: kind ", int(kind), " is ", t.describe(), ", asked for ",
             shape_str(shape));
    return t;
  }
  const bool zeroed = Tp != T && (kind == GradBuf::DQ || kind == GradBuf::DK || kind == GradBuf::DV);
  t = scratch(std::move(shape), DType::F32, zeroed);
  return t;
}

void TrainExec::norm_bwd(const Tensor& x, Param& w, const Tensor& rstd, const Tensor& dy, Tensor& dx) {
  if (!sp) {
    ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, w.grad);
    return;
  }
  Tensor part = scratch(w.grad.shape(), DType::F32, /*zeroed=*/true);
  ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, part);
  parallel::reduce_replicated_grad(tp, part, w.grad);
}

}  // namespace kestrel::model
