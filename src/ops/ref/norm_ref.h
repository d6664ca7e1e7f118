// Scalar reference (the test oracle) of ops/norm.h, run with T = double.
// Exact math: no intermediate rounding (the kernel's bf16 rounding of
// x * rstd sits inside the bf16 tolerance).
#pragma once
#include <cmath>
#include <cstdint>

namespace kestrel::ops::ref {

// y = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps), per row of x[N, D].
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T eps, T* y, T* rstd, int64_t N, int64_t D) {
  for (int64_t r = 0; r < N; ++r) {
    T ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += x[r * D + d] * x[r * D + d];
    const T rs = T(1) / std::sqrt(ss / T(D) + eps);
    rstd[r] = rs;
    for (int64_t d = 0; d < D; ++d) y[r * D + d] = w[d] * (x[r * D + d] * rs);
  }
}

// dx = rstd * (g - n * mean(g * n)) with g = dy * w, n = x * rstd (written);
// dw += sum over rows of dy * n.
template <class T>
void rmsnorm_bwd(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t N, int64_t D) {
  for (int64_t r = 0; r < N; ++r) {
    const T rs = rstd[r];
    T dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += dy[r * D + d] * w[d] * x[r * D + d] * rs;
    for (int64_t d = 0; d < D; ++d) {
      const T n = x[r * D + d] * rs;
      dx[r * D + d] = rs * (dy[r * D + d] * w[d] - n * dot / T(D));
      dw[d] += dy[r * D + d] * n;
    }
  }
}

}  // namespace kestrel::ops::ref
