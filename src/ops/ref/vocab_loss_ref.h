// Scalar reference (the test oracle) of ops/vocab_loss.h over plain arrays,
// run with T = double: the same formulas, one plain loop per row.
// logits [n, Vs] row-major; only columns v < n_real are real.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

namespace kestrel::ops::ref {

template <class T>
void vocab_row_max(const T* logits, int64_t n, int64_t Vs, int64_t n_real, T* row_max) {
  for (int64_t r = 0; r < n; ++r) {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < n_real; ++v)
      if (logits[r * Vs + v] > m) m = logits[r * Vs + v];
    row_max[r] = m;
  }
}

// sums [3, n]: S, SZ, z_target (see ops::vocab_row_sums).
template <class T>
void vocab_row_sums(const T* logits, const int32_t* targets, int64_t vocab_start, int64_t n, int64_t Vs,
                    int64_t n_real, const T* row_max, T* sums) {
  for (int64_t r = 0; r < n; ++r) {
    const T* z = logits + r * Vs;
    T s = 0, sz = 0;
    for (int64_t v = 0; v < n_real; ++v) {
      const T e = std::exp(z[v] - row_max[r]);
      s += e;
      sz += e * z[v];
    }
    const int64_t local = int64_t(targets[r]) - vocab_start;
    sums[r] = s;
    sums[n + r] = sz;
    sums[2 * n + r] = targets[r] >= 0 && local >= 0 && local < n_real ? z[local] : T(0);
  }
}

// lse holds M on entry; logprob / entropy may be nullptr.
template <class T>
void vocab_softmax_finish(const T* sums, const int32_t* targets, int64_t n, T* lse, T* logprob, T* entropy) {
  for (int64_t r = 0; r < n; ++r) {
    lse[r] = lse[r] + std::log(sums[r]);
    if (logprob) logprob[r] = targets[r] >= 0 ? sums[2 * n + r] - lse[r] : T(0);
    if (entropy) entropy[r] = lse[r] - sums[n + r] / sums[r];
  }
}

// dentropy and entropy both given or both nullptr.
template <class T>
void vocab_logprob_entropy_grad(const T* logits, const int32_t* targets, int64_t vocab_start, int64_t n, int64_t Vs,
                                int64_t n_real, const T* lse, const T* dlogprob, const T* dentropy, const T* entropy,
                                T* dlogits) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t local = int64_t(targets[r]) - vocab_start;
    for (int64_t v = 0; v < Vs; ++v) {
      T g = 0;
      if (v < n_real) {
        const T logp = logits[r * Vs + v] - lse[r], p = std::exp(logp);
        if (targets[r] >= 0) g += dlogprob[r] * ((v == local ? T(1) : T(0)) - p);
        if (dentropy) g -= dentropy[r] * p * (logp + entropy[r]);
      }
      dlogits[r * Vs + v] = g;
    }
  }
}

}  // namespace kestrel::ops::ref
