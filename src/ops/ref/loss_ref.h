// Scalar reference (the test oracle) of ops/loss.h, run with T = double.
// Two plain passes per row (max, then sums). Special values follow the
// kernel's conventions: NaN logits are skipped by the max but poison the
// sums; -inf logits have p = 0 and add 0 (not 0 * -inf) to the entropy; a
// +inf logit makes the row NaN; an all -inf row has lse = -inf.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

namespace kestrel::ops::ref {

// lse, logprob (0 where target < 0) and entropy (may be nullptr) per row of logits[n, V].
template <class T>
void logprob_entropy_fwd(const T* logits, const int32_t* targets, T* logprob, T* entropy, T* lse, int64_t n,
                         int64_t V) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < n; ++r) {
    const T* z = logits + r * V;
    T m = neg_inf;
    for (int64_t v = 0; v < V; ++v)
      if (z[v] > m) m = z[v];
    T s = 0, a = 0;  // sum e, sum e * (z - m)
    for (int64_t v = 0; v < V; ++v) {
      if (z[v] == neg_inf) continue;
      const T e = std::exp(z[v] - m);
      s += e;
      if (e != T(0)) a += e * (z[v] - m);
    }
    lse[r] = m + std::log(s);
    logprob[r] = targets[r] >= 0 ? z[targets[r]] - lse[r] : T(0);
    if (entropy) entropy[r] = std::log(s) - a / s;  // -sum p log p
  }
}

// dlogits[r, v] = dlogprob[r] * (onehot - p) (rows with a target only)
//               + dentropy[r] * (-p * (log p + H)) (when dentropy != nullptr).
// A row with neither term is written as zeros.
template <class T>
void logprob_entropy_bwd(const T* logits, const int32_t* targets, const T* lse, const T* dlogprob, const T* dentropy,
                         T* dlogits, int64_t n, int64_t V) {
  for (int64_t r = 0; r < n; ++r) {
    const T* z = logits + r * V;
    T* g = dlogits + r * V;
    T H = 0;
    if (dentropy)
      for (int64_t v = 0; v < V; ++v) {
        const T p = std::exp(z[v] - lse[r]);
        if (p != T(0)) H -= p * (z[v] - lse[r]);
      }
    for (int64_t v = 0; v < V; ++v) {
      const T lp = z[v] - lse[r], p = std::exp(lp);
      T acc = 0;
      if (targets[r] >= 0) acc += dlogprob[r] * ((v == targets[r] ? T(1) : T(0)) - p);
      if (dentropy && p != T(0)) acc -= dentropy[r] * p * (lp + H);
      g[v] = acc;
    }
  }
}

// Mean over rows with target >= 0 of -logprob (0 when there are none); lse as above.
template <class T>
T cross_entropy_fwd(const T* logits, const int32_t* targets, T* lse, T* scratch_logprob, int64_t n, int64_t V) {
  logprob_entropy_fwd<T>(logits, targets, scratch_logprob, nullptr, lse, n, V);
  T sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r)
    if (targets[r] >= 0) {
      sum -= scratch_logprob[r];
      ++count;
    }
  return sum / T(count > 0 ? count : 1);
}

// dlogits = dloss * (p - onehot) / count on counted rows, 0 on ignored rows.
template <class T>
void cross_entropy_bwd(const T* logits, const int32_t* targets, const T* lse, T dloss, T* dlogits, int64_t n,
                       int64_t V) {
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) count += targets[r] >= 0;
  const T c = -dloss / T(count > 0 ? count : 1);
  for (int64_t r = 0; r < n; ++r) {
    const T* z = logits + r * V;
    for (int64_t v = 0; v < V; ++v) {
      if (targets[r] < 0) {
        dlogits[r * V + v] = 0;
        continue;
      }
      const T p = std::exp(z[v] - lse[r]);
      dlogits[r * V + v] = c * ((v == targets[r] ? T(1) : T(0)) - p);
    }
  }
}

}  // namespace kestrel::ops::ref
