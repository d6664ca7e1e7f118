// The training execution of the model (model/block.h's seam): packed varlen
// batches, the tensor-parallel layers of parallel/tp_layers.h with optional
// sequence parallelism, and the backward's context and scratch buffers.
//
// Shapes: T tokens of the batch; Tp = T rounded up to a multiple of tp under
// sequence parallelism (else T); Tl = Tp / tp under SP (else Tp). Padding rows
// (SP only) carry id -1 (a zero embedding) and position 0 and never reach
// attention, the logits or the gradients.
#pragma once
#include "backend/cpu/packed_linear.h"
#include "comm/process_group.h"
#include "model/batch.h"
#include "model/block.h"
#include "parallel/cp_attention.h"

namespace kestrel::model {

// Backward scratch buffers shared by every block of one backward.
enum class GradBuf { DNorm, TmpL, DF1, DF2, DAct, DAttn, DQ, DK, DV, kCount };

class TrainExec final : public BlockExec {
 public:
  // cp: the model's context-parallel groups, needed when batch.cp is set (a
  // cp rank's share of a batch, model/cp_batch.h).
  TrainExec(comm::ProcessGroup& tp, bool sequence_parallel, const PackedBatch& batch, const ops::RopeTable& rope,
            const parallel::TpHeads& heads, int64_t head_dim, const parallel::CpGroups* cp = nullptr);

  Tensor buffer(BlockBuf slot, Shape shape, DType dt) override;
  Tensor enter(const Tensor& x) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void row_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionShape& shape,
                LayerActivations& A) override;
  // The attention core's backward from what attend() kept in A: dattn
  // [Tp, H*vd] f32 -> dq, dk, dv (f32, [Tp, ...]; only the first T rows
  // are written). Under context parallelism the cp attention's backward.
  void attend_bwd(const LayerActivations& A, const Tensor& dattn, const ops::AttentionShape& shape, Tensor& dq,
                  Tensor& dk, Tensor& dv);

  // ---- backward context ----
  comm::ProcessGroup& tp;
  const bool sp;
  const int64_t T;
  const PackedBatch& batch;
  Tensor ids;  // i32 [Tp], padded with -1
  const parallel::TpHeads heads;
  const int64_t head_dim;
  const parallel::CpGroups* cp;  // non-null with batch.cp

  // The router losses' gradient factor of this backward (CausalLM::set_moe_loss_scale).
  double moe_loss_scale = 1.0;

  // Weights packed for linear() and row_linear() at tp = 1, past the skinny
  // size: a forward-only pass's (CausalLM::set_forward_packs) or a training
  // mini-batch's bf16 weights (CausalLM::set_train_packs; the backward's
  // recompute reruns read them too); nullptr: the plain GEMM.
  cpu::WeightPacks* packs = nullptr;

  const Tensor* prefix_of() const { return batch.prefix_of.defined() ? &batch.prefix_of : nullptr; }
  // The first T rows (the real tokens) of a possibly padded buffer.
  Tensor real_rows(const Tensor& t) const { return t.size(0) == T ? t : t.slice_rows(0, T); }
  // An f32 scratch buffer of `shape`, one per kind for the whole backward. DQ,
  // DK, DV start zeroed when padded (their padding rows stay zero).
  Tensor grad_buf(GradBuf kind, Shape shape);
  // RMSNorm backward into w.grad; under SP the norm weight sees only this
  // rank's tokens, so its grad is summed over tp.
  void norm_bwd(const Tensor& x, Param& w, const Tensor& rstd, const Tensor& dy, Tensor& dx);

 private:
  Tensor grad_bufs_[size_t(GradBuf::kCount)];
};

}  // namespace kestrel::model
