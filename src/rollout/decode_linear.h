// The linear layer for steps with only a few rows (batch-1 .. batch-8
// decode). The BLAS packs the whole weight matrix into a scratch panel on
// every call, which for a handful of rows costs more than the product and
// doubles the memory traffic of a memory-bound step; this path streams each
// weight row once and dots it with every input row (f32 accumulation, like
// the BLAS). Anything else goes to ops::linear_fwd.
//
// TODO(ops): this belongs in backend/cpu/linear.cpp as a small-M path of
// linear_fwd; it lives here until the ops layer takes it.
#pragma once
#include "core/tensor.h"

namespace kestrel::rollout {

constexpr int64_t kSkinnyRows = 8;

// y[T, out] = x[T, in] @ w[out, in]^T (+ b[out]), same contract as ops::linear_fwd.
void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);

}  // namespace kestrel::rollout
