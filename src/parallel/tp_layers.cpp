#include "parallel/tp_layers.h"

#include "ops/embedding.h"
#include "ops/linear.h"

namespace kestrel::parallel {

using comm::ReduceOp;

namespace {

// Activations on the device of the tensor they come from (`like`).
Tensor act(Shape s, DType dt, const Tensor& like) {
  return Tensor::empty(std::move(s), dt, MemCategory::Activations, like.device());
}

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

void check_rows_divisible(comm::ProcessGroup& tp, const Tensor& t, const char* what) {
  KS_CHECK(t.dim() >= 1 && t.size(0) % tp.size() == 0, what, ": ", t.size(0), " token rows do not divide by the ",
           tp.name(), " group size ", tp.size(), " (sequence parallelism splits tokens evenly; pad the batch)");
}

}  // namespace

Tensor gather_sequence(comm::ProcessGroup& tp, const Tensor& local) {
  if (tp.size() == 1) return local;
  Tensor full = act(with_rows(local, local.size(0) * tp.size()), local.dtype(), local);
  tp.all_gather(local, full);
  return full;
}

Tensor reduce_scatter_sequence(comm::ProcessGroup& tp, const Tensor& full) {
  if (tp.size() == 1) return full;
  check_rows_divisible(tp, full, "reduce_scatter_sequence");
  Tensor local = act(with_rows(full, full.size(0) / tp.size()), full.dtype(), full);
  tp.reduce_scatter(full, local, ReduceOp::Sum);
  return local;
}

Tensor split_sequence(comm::ProcessGroup& tp, const Tensor& full) {
  if (tp.size() == 1) return full;
  check_rows_divisible(tp, full, "split_sequence");
  const int64_t n = full.size(0) / tp.size();
  return full.slice_rows(tp.rank() * n, (tp.rank() + 1) * n);
}

Tensor tp_enter_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x) {
  if (tp.size() == 1 || !sp) return x;
  return gather_sequence(tp, x);
}

Tensor tp_enter_bwd(comm::ProcessGroup& tp, bool sp, Tensor& dx_partial) {
  if (tp.size() == 1) return dx_partial;
  if (!sp) {
    tp.all_reduce(dx_partial, ReduceOp::Sum);
    return dx_partial;
  }
  return reduce_scatter_sequence(tp, dx_partial);
}

Tensor tp_exit_fwd(comm::ProcessGroup& tp, bool sp, Tensor& y_partial) {
  if (tp.size() == 1) return y_partial;
  if (!sp) {
    tp.all_reduce(y_partial, ReduceOp::Sum);
    return y_partial;
  }
  return reduce_scatter_sequence(tp, y_partial);
}

Tensor tp_exit_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& dy) {
  if (tp.size() == 1 || !sp) return dy;
  return gather_sequence(tp, dy);
}

Tensor column_linear_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor* b,
                         Tensor& y) {
  Tensor x_full = tp_enter_fwd(tp, sp, x);
  ops::linear_fwd(x_full, w, b, y);
  return x_full;
}

void column_linear_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& x_full, const Tensor& w, const Tensor& dy,
                       Tensor* dx, Tensor* dw, Tensor* db) {
  if (tp.size() == 1 || !dx || !sp) {
    ops::linear_bwd(x_full, w, dy, dx, dw, db);
    if (dx && tp.size() > 1) tp.all_reduce(*dx, ReduceOp::Sum);
    return;
  }
  Tensor partial = act(with_rows(x_full, x_full.size(0)), DType::F32, x_full);  // [T, in]
  ops::linear_bwd(x_full, w, dy, &partial, dw, db);
  KS_CHECK(dx->dtype() == DType::F32 && dx->numel() * tp.size() == partial.numel(),
           "column_linear_bwd: dx must be f32 [T/n, in], got ", dx->describe());
  tp.reduce_scatter(partial, *dx, ReduceOp::Sum);
}

void row_linear_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  if (tp.size() == 1) {
    ops::linear_fwd(x, w, b, y);
    return;
  }
  // The bias enters rank 0's partial sum only, so the reduction adds it once.
  const Tensor* b0 = tp.rank() == 0 ? b : nullptr;
  if (!sp && y.dtype() == DType::F32) {
    ops::linear_fwd(x, w, b0, y);
    tp.all_reduce(y, ReduceOp::Sum);
    return;
  }
  Tensor partial = act({x.size(0), w.size(0)}, DType::F32, x);  // [T, out]
  ops::linear_fwd(x, w, b0, partial);
  Tensor reduced = tp_exit_fwd(tp, sp, partial);
  KS_CHECK(y.numel() == reduced.numel(), "row_linear_fwd: y is ", y.describe(), ", the reduced output is ",
           reduced.describe());
  y.copy_from(reduced);
}

void row_linear_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                    Tensor* dw, Tensor* db) {
  Tensor dy_full = tp_exit_bwd(tp, sp, dy);
  ops::linear_bwd(x, w, dy_full, dx, dw, db);
}

VocabRange vocab_range(int64_t vocab, int rank, int size) {
  if (vocab % size != 0)
    KS_FAIL("vocab_size ", vocab, " does not divide by tensor_model_parallel_size ", size,
            "; pad it first (parallel::padded_vocab_size, as the model does with make_vocab_size_divisible_by)");
  const int64_t n = vocab / size;
  return {rank * n, (rank + 1) * n};
}

void vocab_embedding_fwd(comm::ProcessGroup& tp, bool sp, const Tensor& ids, const Tensor& table,
                         int64_t vocab_start, Tensor& y) {
  if (tp.size() == 1) {
    ops::embedding_fwd(ids, table, y, vocab_start);
    return;
  }
  if (!sp) {
    ops::embedding_fwd(ids, table, y, vocab_start);
    tp.all_reduce(y, ReduceOp::Sum);  // exactly one rank holds each id: the sum is exact
    return;
  }
  Tensor e = act({ids.size(0), table.size(1)}, y.dtype(), table);  // [T, D]
  ops::embedding_fwd(ids, table, e, vocab_start);
  KS_CHECK(y.numel() * tp.size() == e.numel(), "vocab_embedding_fwd: y must be [T/n, D], got ", y.describe());
  tp.reduce_scatter(e, y, ReduceOp::Sum);
}

void vocab_embedding_bwd(comm::ProcessGroup& tp, bool sp, const Tensor& ids, const Tensor& dy, Tensor& dtable,
                         int64_t vocab_start) {
  Tensor dy_full = tp_exit_bwd(tp, sp, dy);
  ops::embedding_bwd(ids, dy_full, dtable, vocab_start);
}

void reduce_replicated_grad(comm::ProcessGroup& tp, Tensor& partial, Tensor& grad) {
  KS_CHECK(partial.dtype() == DType::F32 && grad.dtype() == DType::F32 && partial.numel() == grad.numel(),
           "reduce_replicated_grad: partial ", partial.describe(), " and grad ", grad.describe(),
           " must be f32 of one size");
  if (tp.size() > 1) tp.all_reduce(partial, ReduceOp::Sum);
  ops::add_inplace(grad, partial);
}

}  // namespace kestrel::parallel
