// Scalar reference (the test oracle) of ops/activation.h, run with T = double.
// silu(x) = x / (1 + exp(-x)), the formula the kernel uses, so the special
// values agree: silu(-inf) = NaN, silu(+inf) = +inf.
#pragma once
#include <cmath>
#include <cstdint>

namespace kestrel::ops::ref {

template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t count) {
  for (int64_t i = 0; i < count; ++i) h[i] = gate[i] / (T(1) + std::exp(-gate[i])) * up[i];
}

template <class T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, T* dgate, T* dup, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T x = gate[i], s = T(1) / (T(1) + std::exp(-x));
    dgate[i] = dh[i] * up[i] * s * (T(1) + x * (T(1) - s));
    dup[i] = dh[i] * x / (T(1) + std::exp(-x));
  }
}

}  // namespace kestrel::ops::ref
