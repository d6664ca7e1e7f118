// The linear layer of a rollout step. Steps with few rows (decode of a small
// batch) go to the CPU skinny kernel (backend/cpu/skinny_gemm.h), which reads
// each weight row once, in its stored dtype, instead of letting the BLAS pack
// the whole matrix on every call. Larger steps (prefill chunks, decode of
// many sequences) multiply by the weight packed once per weight version
// (backend/cpu/packed_linear.h) when the engine keeps packs and the library
// can pack; every other case goes to ops::linear_fwd, and so does every
// step of a model on a device (its backend's GEMM; the skinny kernel and the
// packs are the CPU's, and the runner gives a device model no packs).
//
// TODO(ops): this belongs in ops::linear_fwd as its small-M and packed
// paths; it lives here until the ops layer takes them.
#pragma once
#include <cstdint>

#include "backend/cpu/packed_linear.h"
#include "backend/cpu/skinny_gemm.h"
#include "core/tensor.h"

namespace kestrel::rollout {

// Steps with at most this many rows take the skinny kernel, unless the
// weight packs and cpu::packed_linear_min_rows says the packed path is
// faster there (bf16 on AMX past 16 rows).
constexpr int64_t kSkinnyRows = cpu::kSkinnyMaxRows;

// The rollout's packed weights (backend/cpu/packed_linear.h WeightPacks).
using WeightPacks = cpu::WeightPacks;

// y[T, out] = x[T, in] @ w[out, in]^T (+ b[out]), same contract as ops::linear_fwd.
// packs: the engine's packed weights (nullptr: never pack).
void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, WeightPacks* packs = nullptr);

}  // namespace kestrel::rollout
