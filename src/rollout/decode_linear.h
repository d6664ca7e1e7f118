// The linear layer of a rollout step. Steps with few rows (decode of a small
// batch) go to the CPU skinny kernel (backend/cpu/skinny_gemm.h), which reads
// each weight row once, in its stored dtype, instead of letting the BLAS pack
// the whole matrix on every call. Larger steps (prefill chunks, decode of
// many sequences) multiply by the weight packed once per weight version
// (backend/cpu/packed_linear.h) when the engine keeps packs and the library
// can pack; every other case goes to ops::linear_fwd.
//
// TODO(ops): this belongs in ops::linear_fwd as its small-M and packed
// paths; it lives here until the ops layer takes them.
#pragma once
#include <cstdint>

#include "backend/cpu/packed_linear.h"
#include "backend/cpu/skinny_gemm.h"
#include "core/tensor.h"

namespace kestrel::rollout {

// Steps with at most this many rows take the skinny kernel.
constexpr int64_t kSkinnyRows = cpu::kSkinnyMaxRows;
// Except bf16 weights on a CPU with AMX, where the packed matmul (AMX tiles)
// overtakes the skinny kernel past this many rows: 1.1x at 20 rows, 1.4x at
// 28, 1.5x at 32 on the small config (bench_skinny_gemm_bench --dtype bf16,
// docs/benchmarks.md "Packed rollout weights").
constexpr int64_t kPackedBf16AmxMinRows = 16;
// Steps of more than this many rows take the packed path (where the weight packs).
int64_t packed_min_rows(DType weight_dtype);

// The rollout's packed weights (backend/cpu/packed_linear.h WeightPacks).
using WeightPacks = cpu::WeightPacks;

// Bytes WeightPacks holds for an [out, in] weight of dtype dt (0 when
// packing is off here): for memory plans.
int64_t packed_weight_bytes(int64_t out, int64_t in, DType dt);

// y[T, out] = x[T, in] @ w[out, in]^T (+ b[out]), same contract as ops::linear_fwd.
// packs: the engine's packed weights (nullptr: never pack).
void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, WeightPacks* packs = nullptr);

}  // namespace kestrel::rollout
