// The linear layer of a rollout step. Steps with few rows (decode of a small
// batch) go to the CPU skinny kernel (backend/cpu/skinny_gemm.h), which reads
// each weight row once, in its stored dtype, instead of letting the BLAS pack
// the whole matrix on every call; every other case goes to ops::linear_fwd.
//
// TODO(ops): this belongs in ops::linear_fwd as its small-M path; it lives
// here until the ops layer takes it.
#pragma once
#include "backend/cpu/skinny_gemm.h"
#include "core/tensor.h"

namespace kestrel::rollout {

// Steps with at most this many rows take the skinny kernel.
constexpr int64_t kSkinnyRows = cpu::kSkinnyMaxRows;

// y[T, out] = x[T, in] @ w[out, in]^T (+ b[out]), same contract as ops::linear_fwd.
void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);

}  // namespace kestrel::rollout
