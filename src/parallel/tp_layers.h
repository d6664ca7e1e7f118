// Tensor-parallel building blocks (Megatron-Core tensor_parallel/layers.py and
// mappings.py), forward and backward, over any comm::ProcessGroup. A size-1
// group is the plain case: every function then calls exactly the ops/ kernel
// the single-process model calls, with no extra arithmetic.
//
// Layouts. T is the number of token rows the TP region works on. Without
// sequence parallelism (SP) activations outside the TP GEMMs are replicated
// [T, D] on every rank; with SP they are split along the tokens, rank r holding
// rows [r*T/n, (r+1)*T/n) as [T/n, D] (T must then be divisible by n; the
// model pads to that). Parameter gradients are f32 and accumulated (+=), as in
// ops/; activation gradients are written (=).
//
// The conjugate mappings (Megatron's f/g and their SP forms):
//   enter: fwd identity | all-gather(seq)     bwd all-reduce | reduce-scatter(seq)
//   exit:  fwd all-reduce | reduce-scatter(seq)  bwd identity | all-gather(seq)
#pragma once
#include <cstdint>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace kestrel::parallel {

// ---- sequence-parallel helpers ---------------------------------------------
// [T/n, D] -> [T, D]: rank blocks in rank order.
Tensor gather_sequence(comm::ProcessGroup& tp, const Tensor& local);
// [T, D] -> [T/n, D]: the sum over ranks of each rank's rows block. Any float dtype.
Tensor reduce_scatter_sequence(comm::ProcessGroup& tp, const Tensor& full);
// This rank's rows of a replicated [T, D] (a view, no copy); the inverse of gather_sequence.
Tensor split_sequence(comm::ProcessGroup& tp, const Tensor& full);

// ---- conjugate mappings ----------------------------------------------------
// Into a column-parallel region: x as the caller holds it -> [T, D] input of the GEMMs.
Tensor tp_enter_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x);
// Its backward: the GEMMs' partial dx [T, D] (f32) -> dx in the caller's layout.
// Without SP the all-reduce is in place and the same tensor is returned.
Tensor tp_enter_bwd(comm::ProcessGroup& tp, bool sp, Tensor& dx_partial);
// Out of a row-parallel region: partial sums [T, D] -> reduced output in the
// caller's layout (all-reduce in place without SP).
Tensor tp_exit_fwd(comm::ProcessGroup& tp, bool sp, Tensor& y_partial);
// Its backward: dy in the caller's layout -> [T, D].
Tensor tp_exit_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& dy);

// ---- linear layers ---------------------------------------------------------
// Column-parallel: w [out/n, in] holds rows [r*out/n, (r+1)*out/n) of the full
// weight, b [out/n] likewise. x: [T, in] (replicated) or [T/n, in] (SP).
// y: [T, out/n]. Returns the [T, in] input the GEMM saw (x itself without SP,
// the gathered copy with SP): keep it for backward.
Tensor column_linear_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor* b,
                         Tensor& y);
// dy [T, out/n] (f32) -> dx [T, in] all-reduced (or [T/n, in] reduce-scattered
// with SP); dw, db accumulated for this rank's rows. x_full: what forward returned.
void column_linear_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& x_full, const Tensor& w, const Tensor& dy,
                       Tensor* dx, Tensor* dw, Tensor* db);

// Row-parallel: w [out, in/n] holds columns [r*in/n, (r+1)*in/n); x [T, in/n]
// is this rank's slice of the input features (a column-parallel output); b [out]
// is replicated and added once, after the reduction. y: [T, out] (all-reduced)
// or [T/n, out] (SP, reduce-scattered). bf16 outputs are reduced in f32 and
// rounded once, as the single-process GEMM rounds once.
void row_linear_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
// dy: [T, out] or [T/n, out] (f32) -> dx [T, in/n]; dw accumulated; db
// accumulated with the full-batch sum on every rank (with SP, from the gathered dy).
void row_linear_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                    Tensor* dw, Tensor* db);

// ---- vocab-parallel embedding ----------------------------------------------
struct VocabRange {
  int64_t start = 0, end = 0;  // [start, end) of the global vocabulary
  int64_t size() const { return end - start; }
};
// Rank r of n holds rows [r*V/n, (r+1)*V/n); V must divide by n (else an error
// naming vocab_size: pass the padded vocabulary, parallel::padded_vocab_size).
VocabRange vocab_range(int64_t vocab, int rank, int size);

// ids: i32 [T] global ids (ids < 0 give zero rows: padding); table [V/n, D]
// holds vocab rows starting at vocab_start. y: [T, D] (summed over ranks by
// all-reduce) or [T/n, D] (SP: reduce-scattered).
void vocab_embedding_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& ids, const Tensor& table,
                         int64_t vocab_start, Tensor& y);
// dy: [T, D] or [T/n, D] -> dtable [V/n, D] (f32) accumulated for this rank's ids.
void vocab_embedding_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& ids, const Tensor& dy, Tensor& dtable,
                         int64_t vocab_start);

// ---- gradients of replicated parameters ------------------------------------
// Sums a partial f32 gradient over the ranks (all-reduce of `partial`, in
// place) and accumulates it into grad. Used for parameters every rank holds in
// full but that see only part of the data: norm weights under SP, Qwen3's
// per-head q/k norms. Summing a scratch (not the accumulated grad) keeps
// micro-batch accumulation correct.
void reduce_replicated_grad(comm::ProcessGroup& tp, Tensor& partial, Tensor& grad);

}  // namespace kestrel::parallel
