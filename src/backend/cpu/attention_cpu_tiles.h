// Register-tiled building blocks of the flash-attention CPU kernels, written
// with GCC/Clang vector extensions: 16-float vectors map to one AVX-512
// register with -march=native and split into narrower ones elsewhere, so the
// code stays portable. Internal to attention_cpu.cpp.
//
// Every tile works on f32 rows padded to dp = round_up(head_dim, 16) floats,
// and on a score block of kBlock x kBlock (queries x keys).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

// Without AVX-512 the 64-byte vectors are passed between these (inlined,
// internal) helpers in memory; GCC notes the ABI difference, which is moot here.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace kestrel::cpu::attn {

constexpr int64_t kBlock = 64;  // queries per query block == keys per key block
constexpr int64_t kVec = 16;

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float vf_mem __attribute__((vector_size(64), aligned(4), __may_alias__));

inline vf load(const float* p) { return *reinterpret_cast<const vf_mem*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_mem*>(p) = v; }
inline vf splat(float x) { return x - vf{}; }  // x - 0 folds to a plain broadcast (x + 0 would not: -0)

// Pins a loaded vector in a register so the compiler does not re-load it as a
// memory operand of every FMA that uses it (one load per use is the
// bottleneck of these tiles on cores with one 512-bit load per cycle).
#if defined(__GNUC__) && defined(__AVX512F__)
#define KS_IN_REG(x) asm("" : "+v"(x))
#else  // a 64-byte vector spans several registers: leave it to the compiler
#define KS_IN_REG(x) (void)0
#endif
inline vi iota() { return vi{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
// Halving tree reductions (shuffles, no scalar loop, no intrinsics).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
inline vf4 halve(vf v, bool max) {
  const vf8 l8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const vf8 h8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf8 a = max ? (l8 > h8 ? l8 : h8) : l8 + h8;
  const vf4 l4 = __builtin_shufflevector(a, a, 0, 1, 2, 3), h4 = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return max ? (l4 > h4 ? l4 : h4) : l4 + h4;
}
inline float hsum(vf v) {
  const vf4 b = halve(v, false);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
inline float hmax(vf v) {
  const vf4 b = halve(v, true);
  const float x = b[0] > b[2] ? b[0] : b[2], y = b[1] > b[3] ? b[1] : b[3];
  return x > y ? x : y;
}

// 2^x, relative error ~2e-7; -inf (and anything below -127) -> 0, +inf -> inf,
// NaN -> NaN. Cephes exp2f polynomial on [-0.5, 0.5].
inline vf exp2v(vf x) {
  x = x < -127.0f ? splat(-127.0f) : x;
  x = x > 128.0f ? splat(128.0f) : x;
  const vf n = (x + 12582912.0f) - 12582912.0f;  // round to nearest (|x| < 2^22)
  const vf r = x - n;
  vf p = splat(1.535336188319500e-4f);
  p = p * r + 1.339887440266574e-3f;
  p = p * r + 9.618437357674640e-3f;
  p = p * r + 5.550332471162809e-2f;
  p = p * r + 2.402264791363012e-1f;
  p = p * r + 6.931472028550421e-1f;
  p = p * r + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * __builtin_bit_cast(vf, e);
}

// C[r][0:64] = sum_{c < depth} A[r][c] * BT[c][0:64] for r < R: a row tile of
// a score block, keys vectorized (BT is the key-major transpose of K or V).
template <int R>
inline void tile_abt(const float* A, int64_t lda, const float* BT, int64_t ldbt, int64_t depth, float* C,
                     int64_t ldc) {
  vf acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = vf{};
  for (int64_t c = 0; c < depth; ++c) {
    const float* b = BT + c * ldbt;
    vf b0 = load(b), b1 = load(b + 16), b2 = load(b + 32), b3 = load(b + 48);
    KS_IN_REG(b0);
    KS_IN_REG(b1);
    KS_IN_REG(b2);
    KS_IN_REG(b3);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf a = splat(A[r * lda + c]);
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
      acc[r][2] += a * b2;
      acc[r][3] += a * b3;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) store(C + r * ldc + 16 * j, acc[r][j]);
}

// Score block for rows [0, nr) (rounded up to 4: A must hold those rows).
inline void block_abt(const float* A, int64_t lda, const float* BT, int64_t ldbt, int64_t depth, int64_t nr,
                      float* C) {
  for (int64_t r = 0; r < nr; r += 4) tile_abt<4>(A + r * lda, lda, BT, ldbt, depth, C + r * kBlock, kBlock);
}

// Out[r][0:16NV] += sum_{j < n} W[r][j] * B[j][0:16NV] for r < R.
// TW = true reads W transposed (W[j][r]): the P^T dO and dS^T Q products.
template <int R, int NV, bool TW>
inline void tile_wb(const float* W, int64_t ldw, const float* B, int64_t ldb, int64_t n, float* Out,
                    int64_t ldo) {
  vf acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = load(Out + r * ldo + 16 * v);
  for (int64_t j = 0; j < n; ++j) {
    vf b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      b[v] = load(B + j * ldb + 16 * v);
      KS_IN_REG(b[v]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf w = splat(TW ? W[j * ldw + r] : W[r * ldw + j]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += w * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(Out + r * ldo + 16 * v, acc[r][v]);
}

// tile_wb over the full padded width dp, in chunks of up to 4 vectors.
template <int R, bool TW>
inline void rows_wb(const float* W, int64_t ldw, const float* B, int64_t dp, int64_t n, float* Out) {
  if (n <= 0) return;
  for (int64_t v0 = 0; v0 < dp / kVec; v0 += 4) {
    const float* b = B + v0 * kVec;
    float* o = Out + v0 * kVec;
    switch (std::min<int64_t>(4, dp / kVec - v0)) {
      case 1: tile_wb<R, 1, TW>(W, ldw, b, dp, n, o, dp); break;
      case 2: tile_wb<R, 2, TW>(W, ldw, b, dp, n, o, dp); break;
      case 3: tile_wb<R, 3, TW>(W, ldw, b, dp, n, o, dp); break;
      default: tile_wb<R, 4, TW>(W, ldw, b, dp, n, o, dp); break;
    }
  }
}

// Out[r] += sum_j W[r][j] * B[j] over one score block: W [kBlock x kBlock]
// (rows r < nr, keys j < nk), B rows [nk x dp], Out rows [nr x dp].
// causal: the block is on the diagonal and only j <= r contribute; masked
// pairs are skipped outright (not multiplied by 0) so a NaN/Inf in a later
// token never reaches an earlier one.
inline void block_wb(const float* W, const float* B, int64_t dp, int64_t nr, int64_t nk, bool causal,
                     float* Out) {
  int64_t r = 0;
  for (; r + 4 <= nr; r += 4) {
    const float* w = W + r * kBlock;
    float* o = Out + r * dp;
    if (!causal) {
      rows_wb<4, false>(w, kBlock, B, dp, nk, o);
      continue;
    }
    rows_wb<4, false>(w, kBlock, B, dp, r + 1, o);  // keys every row of the tile sees
    for (int64_t i = 1; i < 4; ++i)                 // the triangle above them
      rows_wb<1, false>(w + i * kBlock + r + 1, kBlock, B + (r + 1) * dp, dp, i, o + i * dp);
  }
  for (; r < nr; ++r) rows_wb<1, false>(W + r * kBlock, kBlock, B, dp, causal ? r + 1 : nk, Out + r * dp);
}

// Out[j] += sum_r W[r][j] * A[r] over one score block (the transposed product
// for dK, dV): keys j < nk, rows r < nr; causal: only r >= j.
inline void block_wtb(const float* W, const float* A, int64_t dp, int64_t nr, int64_t nk, bool causal,
                      float* Out) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float* w = W + j;
    float* o = Out + j * dp;
    if (!causal) {
      rows_wb<4, true>(w, kBlock, A, dp, nr, o);
      continue;
    }
    if (nr > j + 3) rows_wb<4, true>(w + (j + 3) * kBlock, kBlock, A + (j + 3) * dp, dp, nr - (j + 3), o);
    for (int64_t i = 0; i < 3; ++i) {  // rows j+i .. j+2 that only some keys of the tile see
      const int64_t r1 = std::min<int64_t>(j + 3, nr);
      if (r1 > j + i)
        rows_wb<1, true>(w + (j + i) * kBlock + i, kBlock, A + (j + i) * dp, dp, r1 - (j + i), o + i * dp);
    }
  }
  for (; j < nk; ++j) {
    const int64_t r0 = causal ? j : 0;
    if (nr > r0) rows_wb<1, true>(W + r0 * kBlock + j, kBlock, A + r0 * dp, dp, nr - r0, Out + j * dp);
  }
}

}  // namespace kestrel::cpu::attn
