// Helpers shared by the CPU kernels: element load/store for f32 and bf16
// storage (math is always f32), dtype dispatch, a branch-free exp, native
// width vectors (namespace simd) for the elementwise and row kernels, and the
// OpenMP row-partition rule. Simple loops over the scalar helpers still
// vectorise under `#pragma omp simd`; anything with exp or bf16 rounding in
// it uses simd:: explicitly (GCC left those scalar).
#pragma once
#include <immintrin.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kestrel::cpu {

// bf16 storage is handled as its raw uint16 bit pattern.
using bf16_bits = uint16_t;

inline float load_f32(const float* p, int64_t i) { return p[i]; }
inline float load_f32(const bf16_bits* p, int64_t i) { return std::bit_cast<float>(uint32_t(p[i]) << 16); }

// Round to nearest even, NaN kept quiet: bit-identical to core's float_to_bf16,
// but branch-free so it vectorises.
inline bf16_bits f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16_bits((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline void store_f32(float* p, int64_t i, float v) { p[i] = v; }
inline void store_f32(bf16_bits* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }
// The value an f32 result takes once stored as T (bf16 mode rounds intermediates as HF does).
template <class T>
inline float round_to(float v) {
  if constexpr (std::is_same_v<T, bf16_bits>) return std::bit_cast<float>(uint32_t(f32_to_bf16(v)) << 16);
  return v;
}

template <class T>
inline T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// Calls f(T{}) with T = float for f32 tensors and bf16_bits for bf16 tensors.
template <class F>
inline void dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(bf16_bits{});
      return;
    default:
      KS_FAIL("not supported yet: CPU kernel for dtype ", dtype_name(dt), " (f32 and bf16 only)");
  }
}

// exp(x) in f32 with ~2 ulp error, branch-free so `omp simd` loops vectorise it
// (glibc's expf does not vectorise without -ffast-math). Cephes polynomial on
// the reduced argument; exact specials: exp(NaN) = NaN, exp(-inf) = 0,
// exp(x > ln(FLT_MAX)) = inf; results below 2^-125 flush to 0.
inline float exp_f32(float x) {
  constexpr float kHi = 88.72283f, kLo = -86.6f;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  xc = x != x ? 0.f : xc;  // keep NaN out of the float->int conversion
  // Round to nearest with the 1.5 * 2^23 trick: std::floor/nearbyint do not
  // vectorise at -O2 with trapping math on. |x * log2e| < 2^22, so it is exact.
  constexpr float kRound = 12582912.f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  // 2^(n-1) * 2 keeps n = 128 (x near ln(FLT_MAX)) representable.
  const float pow2 = std::bit_cast<float>(uint32_t(int32_t(n) + 126) << 23);
  float y = p * pow2 * 2.f;
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  y = x < kLo ? 0.f : y;
  return x != x ? x : y;
}

// Native-width float vectors (GCC/Clang vector extensions) for the
// elementwise and row kernels: simd_layer.inc at the width this translation
// unit is compiled for (16 floats with AVX-512, 8 with AVX2). GCC's
// auto-vectoriser leaves loops whose bodies hold exp_f32's selects and the
// templated bf16 load/store scalar, even under `omp simd`; these spell the
// same math out lane-wise. Kernels with an AVX-512 variant get their own copy
// per ISA level instead (isa.h, isa_each.inc); this one serves the rest.
#if defined(__AVX512F__)
#define KESTREL_ISA_W 16
#else
#define KESTREL_ISA_W 8
#endif
#include "backend/cpu/simd_layer.inc"
#undef KESTREL_ISA_W

// Parallelise only when there is enough work to pay for waking the team.
inline bool worth_parallel(int64_t elements) { return elements >= (int64_t(1) << 15) && omp_get_max_threads() > 1; }

// Runs f(begin, end) on contiguous, static blocks of [0, n) (one per thread), or
// f(0, n) inline when the work (n * cost_per_item elements) is small. f must not throw.
template <class F>
inline void parallel_blocks(int64_t n, int64_t cost_per_item, F&& f) {
  if (n <= 0) return;
  if (!worth_parallel(n * cost_per_item)) {
    f(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t b = n * id / nt, e = n * (id + 1) / nt;
    if (b < e) f(b, e);
  }
}

// An f32 view of a float tensor: the tensor itself when f32, else a converted
// scratch copy (MemCategory::Activations, freed with the returned Tensor).
Tensor f32_view(const Tensor& t);
// dst (f32 or bf16) = src (f32), rounding once; same element count.
void store_from_f32(const float* src, Tensor& dst);

}  // namespace kestrel::cpu
