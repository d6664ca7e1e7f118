// CPU kernels of ops/optim_ops.h (AdamW step, sum of squares, in-place scale).
// Callers (the ops layer) have checked dtypes, shapes and devices.
//
// Inline for now: src/optim does not link the backend library yet (see
// ops/optim_ops.h). No implicit fused multiply-adds here: -O3 unswitches the
// AdamW loop on `decay`, which let GCC fuse the weight-decay product into the
// update where -O2 rounds it first, so builds disagreed in the last bit after
// one step. The two fused multiply-adds torch's arithmetic has are written
// out (std::fma). Every element is independent and every reduction has a
// fixed order, so the static OpenMP split cannot change any result.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/adamw_scalars.h"
#include "core/dtype.h"
#include "core/tensor.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace kestrel::cpu {

namespace optim_detail {
template <class Store>
inline void adamw_loop(const AdamWScalars& s, float* w, float* m, float* v, const float* g, int64_t n, Store store) {
  const bool decay = s.decay;
  const float decay_keep = s.decay_keep, one_m_beta1 = s.one_m_beta1, beta2 = s.beta2, one_m_beta2 = s.one_m_beta2;
  const float neg_step = s.neg_step, bc2_sqrt = s.bc2_sqrt, eps = s.eps;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t k = 0; k < n; ++k) {
    float pk = w[k];
    if (decay) pk = pk * decay_keep;
    const float gk = g[k];
    // torch.lerp for weight < 0.5: self + weight * (end - self).
    const float mk = std::fma(one_m_beta1, gk - m[k], m[k]);
    const float vk = std::fma(one_m_beta2 * gk, gk, v[k] * beta2);
    const float denom = std::sqrt(vk) / bc2_sqrt + eps;
    m[k] = mk;
    v[k] = vk;
    const float wk = pk + neg_step * mk / denom;
    w[k] = wk;
    store(k, wk);
  }
}
}  // namespace optim_detail

// master, m, v, grad: f32 [n]; model_copy (nullptr: none): bf16/f16/f32 [n], not the master.
inline void adamw_step(const AdamWScalars& s, Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                       Tensor* model_copy) {
  float* w = master.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = master.numel();
  if (!model_copy) return optim_detail::adamw_loop(s, w, m, v, g, n, [](int64_t, float) {});
  switch (model_copy->dtype()) {
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(model_copy->raw());
      return optim_detail::adamw_loop(s, w, m, v, g, n, [d](int64_t k, float x) { d[k] = float_to_bf16(x); });
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(model_copy->raw());
      return optim_detail::adamw_loop(s, w, m, v, g, n, [d](int64_t k, float x) { d[k] = float_to_f16(x); });
    }
    default: {
      float* d = model_copy->data<float>();
      return optim_detail::adamw_loop(s, w, m, v, g, n, [d](int64_t k, float x) { d[k] = x; });
    }
  }
}

// Squares summed in double over 4096-element chunks in order, the chunk sums added in order.
inline double sum_squares(const Tensor& x) {
  constexpr int64_t kChunk = 4096;
  const float* g = x.data<float>();
  const int64_t n = x.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 8)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0;
    for (int64_t k = lo; k < hi; ++k) s += double(g[k]) * double(g[k]);
    part[size_t(c)] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

inline void scale_(Tensor& x, float c) {
  float* p = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t k = 0; k < n; ++k) p[k] *= c;
}

}  // namespace kestrel::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
