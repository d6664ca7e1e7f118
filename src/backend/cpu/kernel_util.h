// Helpers shared by the CPU kernels: element load/store for f32 and bf16
// storage (math is always f32), dtype dispatch, a branch-free exp, native
// width vectors (namespace simd) for the elementwise and row kernels, and the
// OpenMP row-partition rule. Simple loops over the scalar helpers still
// vectorise under `#pragma omp simd`; anything with exp or bf16 rounding in
// it uses simd:: explicitly (GCC left those scalar).
#pragma once
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

// ---------------------------------------------------------------------------
// Native-width float vectors (GCC/Clang vector extensions, as in
// attention_cpu_tiles.h) for the elementwise and row kernels. GCC's
// auto-vectoriser leaves loops whose bodies hold exp_f32's selects and the
// templated bf16 load/store scalar, even under `omp simd`; these spell the
// same math out lane-wise. The width is the widest the target has (16 floats
// with AVX-512, 8 with AVX/AVX2, else 4): GCC lowers a vector select or
// compare wider than the hardware's lane by lane, so no wider type is used.
//
// Tails: a row's last n < kW elements go through the same vector math on a
// zero-padded copy (load_part/store_part), so every element gets
// bit-identical arithmetic wherever it sits.
namespace simd {

#if defined(__AVX512F__)
constexpr int64_t kW = 16;  // floats per vf
#elif defined(__AVX__)
constexpr int64_t kW = 8;
#else
constexpr int64_t kW = 4;
#endif
typedef float vf __attribute__((vector_size(kW * 4)));
typedef int32_t vi __attribute__((vector_size(kW * 4)));
typedef uint32_t vu __attribute__((vector_size(kW * 4)));
typedef uint16_t vh __attribute__((vector_size(kW * 2)));
typedef float vf_mem __attribute__((vector_size(kW * 4), aligned(4), __may_alias__));
typedef uint16_t vh_mem __attribute__((vector_size(kW * 2), aligned(2), __may_alias__));

inline vf splat(float x) { return x - vf{}; }  // x - 0 folds to a broadcast and keeps -0 (x + 0 would not)
inline vi iota() {
  vi v{};
  for (int i = 0; i < int(kW); ++i) v[i] = i;
  return v;
}

inline vf load(const float* p) { return *reinterpret_cast<const vf_mem*>(p); }
typedef uint16_t vh2 __attribute__((vector_size(kW * 4)));  // a vf's bits as 16-bit halves
// Shuffles written as index packs so they hold for every kW.
template <size_t... I>
inline vf widen_bf16(vh h, std::index_sequence<I...>) {
  // Lane i's high half is h[i], its low half 0 (index kW picks from the zero vector).
  return __builtin_bit_cast(vf, __builtin_shufflevector(h, vh{}, (I % 2 ? I / 2 : kW)...));
}
template <size_t... I>
inline vh high_halves(vu u, std::index_sequence<I...>) {
  const vh2 h = __builtin_bit_cast(vh2, u);
  return __builtin_shufflevector(h, h, (2 * I + 1)...);  // little-endian: the high half is the odd one
}
inline vf load(const bf16_bits* p) {
  return widen_bf16(*reinterpret_cast<const vh_mem*>(p), std::make_index_sequence<2 * kW>());
}
// f32_to_bf16 lane-wise (round to nearest even, NaN kept quiet) in the high
// 16 bits of each lane; the low 16 bits are left as they fall.
inline vu bf16_round_hi(vf v) {
  const vu u = __builtin_bit_cast(vu, v);
  return v != v ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
}
inline void store(float* p, vf v) { *reinterpret_cast<vf_mem*>(p) = v; }
inline void store(bf16_bits* p, vf v) {
  *reinterpret_cast<vh_mem*>(p) = high_halves(bf16_round_hi(v), std::make_index_sequence<kW>());
}
// round_to<T> lane-wise.
template <class T>
inline vf round_to(vf v) {
  if constexpr (std::is_same_v<T, bf16_bits>) return __builtin_bit_cast(vf, bf16_round_hi(v) & 0xffff0000u);
  return v;
}

// Lanes [0, n) from p (0 < n <= kW), zeros above.
template <class T>
inline vf load_part(const T* p, int64_t n) {
  T buf[kW] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(T));
  return load(buf);
}
// Stores lanes [0, n) of v to p.
template <class T>
inline void store_part(T* p, int64_t n, vf v) {
  T buf[kW];
  store(buf, v);
  std::memcpy(p, buf, size_t(n) * sizeof(T));
}

// Halving-tree reductions: a fixed order for a given width, so results do
// not depend on where a row starts or on the thread count.
inline float hsum(vf v) {
  float a[kW];
  std::memcpy(a, &v, sizeof(a));
  for (int w = int(kW) / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}
// Max of NaN-free lanes.
inline float hmax(vf v) {
  float a[kW];
  std::memcpy(a, &v, sizeof(a));
  for (int w = int(kW) / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i + w] > a[i] ? a[i + w] : a[i];
  return a[0];
}

// exp_f32 lane-wise: the same operations in the same order, so it returns
// bit-identical results (tests/ops checks), specials included.
inline vf exp(vf x) {
  constexpr float kHi = 88.72283f, kLo = -86.6f, kRound = 12582912.f;
  vf xc = x < kLo ? splat(kLo) : x;
  xc = xc > kHi ? splat(kHi) : xc;
  xc = x != x ? vf{} : xc;
  const vf n = (xc * 1.44269504088896341f + kRound) - kRound;
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const vi e = (__builtin_convertvector(n, vi) + 126) << 23;
  vf y = p * __builtin_bit_cast(vf, e) * 2.f;
  y = x > kHi ? splat(std::numeric_limits<float>::infinity()) : y;
  y = x < kLo ? vf{} : y;
  return x != x ? x : y;
}

}  // namespace simd

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
