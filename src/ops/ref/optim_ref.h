// Scalar reference (the test oracle) of ops/optim_ops.h. Run with T = double
// it is the exact math; run with T = float it is the f32 arithmetic the
// kernels must match bit for bit (same operations, same order, the same two
// explicit fused multiply-adds, nothing else fused: hence fp-contract off).
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/optim_ops.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace kestrel::ops::ref {

// torch.optim.AdamW per element (see ops/optim_ops.h): w, m, v updated in place.
template <class T>
void adamw_step(const AdamWScalars& s, T* w, T* m, T* v, const T* g, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    T pk = w[k];
    if (s.decay) pk = pk * T(s.decay_keep);
    const T gk = g[k];
    const T mk = std::fma(T(s.one_m_beta1), gk - m[k], m[k]);
    const T vk = std::fma(T(s.one_m_beta2) * gk, gk, v[k] * T(s.beta2));
    const T denom = std::sqrt(vk) / T(s.bc2_sqrt) + T(s.eps);
    m[k] = mk;
    v[k] = vk;
    w[k] = pk + T(s.neg_step) * mk / denom;
  }
}

// sum of x^2 in double, in element order.
inline double sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += double(x[k]) * double(x[k]);
  return s;
}

template <class T>
void scale(T* x, T c, int64_t n) {
  for (int64_t k = 0; k < n; ++k) x[k] = x[k] * c;
}

}  // namespace kestrel::ops::ref

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
