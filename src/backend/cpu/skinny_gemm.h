// Linear layer for a few input rows (decode steps: batch 1 .. ~16 tokens).
//
// At these sizes the product is bound by reading the weights once, and the
// BLAS is a poor fit: it packs the whole weight matrix into a panel on every
// call, which reads and writes it again. This kernel streams each weight row
// straight from memory exactly once and dots it with every input row while
// the row sits in L1 (AVX2 or AVX-512 FMAs by kernel_isa(), f32 accumulation
// like the BLAS; the kernels are in skinny_gemm_isa.inc).
//
// Measured on the build machine (Zen 4 VM, 1 thread, CPU time, 113 MB of
// small-config weights): one sequential stream per weight row reads at ~20
// GB/s with 4 KiB pages, whereas interleaving several adjacent rows (2 KiB
// apart) drops to 10-13 GB/s; two far-apart streams are a little faster than
// one. So each thread walks two halves of its output rows side by side (four
// quarters past 4 input rows, where the FMAs, not memory, set the pace).
//
// bf16 weights are widened in registers (no converted copy), which halves the
// bytes read per token. bf16 inputs are widened once into a per-thread
// scratch that is reused across calls; bf16 outputs are rounded once.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

// The most input rows skinny_linear takes. Past ~16 rows both paths are bound
// by the FMAs; OpenBLAS's AVX-512 kernel overtakes this one's AVX2 variant
// (no packing) between 32 and 48 rows on the build machine
// (bench_skinny_gemm_bench).
constexpr int64_t kSkinnyMaxRows = 32;

// y[M, out] = x[M, in] @ w[out, in]^T (+ b[out]); 1 <= M <= kSkinnyMaxRows.
// x, w, b, y are CPU tensors, each f32 or bf16 (any mix); y is written, must
// not alias x. Same contract and rounding as ops::linear_fwd (f32 math, y
// rounded once); the summation order differs, so results agree to f32
// rounding, not bitwise. Runs on the OpenMP team when the matrix is large.
void skinny_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);

// True when skinny_linear takes these operands (dtypes, devices, shapes, M).
bool skinny_linear_applies(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y);

}  // namespace kestrel::cpu
