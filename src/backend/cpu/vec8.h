// 8-float vectors (one AVX2 register) written with GCC/Clang vector
// extensions, and the primitives the attention kernels share: loads and
// stores, broadcasts, fixed-order horizontal sum and max, and exp2. The build
// drops AVX-512 on GCC 12 (and Zen runs 512-bit FMAs as two 256-bit halves),
// so the kernels tile for 8-float vectors and 16 registers.
#pragma once
#include <cstdint>

namespace kestrel::cpu::vec8 {

constexpr int64_t kVec = 8;  // floats per vector

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
typedef float vf_mem __attribute__((vector_size(32), aligned(4), __may_alias__));

inline vf load(const float* p) { return *reinterpret_cast<const vf_mem*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_mem*>(p) = v; }
inline vf splat(float x) { return x - vf{}; }  // x - 0 folds to a plain broadcast (x + 0 would not: -0)
inline vi iota() { return vi{0, 1, 2, 3, 4, 5, 6, 7}; }

inline float hsum(vf v) {
  const vf4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (a[0] + a[2]) + (a[1] + a[3]);
}
// Max of the NaN-free lanes (a NaN lane loses every comparison).
inline float hmax(vf v) {
  const vf4 l = __builtin_shufflevector(v, v, 0, 1, 2, 3), h = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const vf4 a = l > h ? l : h;
  const float x = a[0] > a[2] ? a[0] : a[2], y = a[1] > a[3] ? a[1] : a[3];
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

}  // namespace kestrel::cpu::vec8
