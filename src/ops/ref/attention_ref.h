// Scalar causal GQA attention reference (the oracle for the kernels): naive
// loops in any element type F, run with double in tests. The backward is the
// textbook softmax backward on the full per-sequence probability matrix.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kestrel::ops::ref {

struct AttnRefShape {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  double scale = 0;  // 0 = 1/sqrt(head_dim)
  double resolved_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(double(head_dim)); }
};

namespace detail {
// P [L, L] (row i over keys j <= i) of head h for the sequence starting at row s0.
template <class F>
std::vector<F> attention_probs(const F* q, const F* k, int64_t s0, int64_t L, int64_t h, const AttnRefShape& s,
                               F* lse_out /* [L] or null */) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d;
  const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
  const F scale = F(s.resolved_scale());
  std::vector<F> P(L * L, F(0));
  for (int64_t i = 0; i < L; ++i) {
    F m = -std::numeric_limits<F>::infinity();
    for (int64_t j = 0; j <= i; ++j) {
      F dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[(s0 + i) * ldq + h * d + c] * k[(s0 + j) * ldk + kvh * d + c];
      P[i * L + j] = dot * scale;
      if (P[i * L + j] > m) m = P[i * L + j];
    }
    F sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (P[i * L + j] = std::exp(P[i * L + j] - m));
    for (int64_t j = 0; j <= i; ++j) P[i * L + j] /= sum;
    if (lse_out) lse_out[i] = m + std::log(sum);
  }
  return P;
}
}  // namespace detail

// q [T, n_heads*d]; k, v [T, n_kv_heads*d]; cu [n_seqs+1]; out [T, n_heads*d];
// lse [n_heads, T] (natural log of the sum of exp of the scaled scores).
template <class F>
void attention_fwd_ref(const F* q, const F* k, const F* v, const int32_t* cu, int64_t n_seqs, const AttnRefShape& s,
                       F* out, F* lse) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d, T = cu[n_seqs];
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t s0 = cu[b], L = cu[b + 1] - cu[b];
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
      const auto P = detail::attention_probs(q, k, s0, L, h, s, lse ? lse + h * T + s0 : nullptr);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < d; ++c) {
          F acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[i * L + j] * v[(s0 + j) * ldk + kvh * d + c];
          out[(s0 + i) * ldq + h * d + c] = acc;
        }
    }
  }
}

// dq like q; dk, dv like k (written, =).
template <class F>
void attention_bwd_ref(const F* q, const F* k, const F* v, const F* dout, const int32_t* cu, int64_t n_seqs,
                       const AttnRefShape& s, F* dq, F* dk, F* dv) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d, T = cu[n_seqs];
  const F scale = F(s.resolved_scale());
  for (int64_t i = 0; i < T * ldq; ++i) dq[i] = 0;
  for (int64_t i = 0; i < T * ldk; ++i) dk[i] = dv[i] = 0;
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t s0 = cu[b], L = cu[b + 1] - cu[b];
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
      const auto P = detail::attention_probs(q, k, s0, L, h, s, static_cast<F*>(nullptr));
      auto Q = [&](int64_t i, int64_t c) { return q[(s0 + i) * ldq + h * d + c]; };
      auto K = [&](int64_t j, int64_t c) { return k[(s0 + j) * ldk + kvh * d + c]; };
      auto V = [&](int64_t j, int64_t c) { return v[(s0 + j) * ldk + kvh * d + c]; };
      auto dO = [&](int64_t i, int64_t c) { return dout[(s0 + i) * ldq + h * d + c]; };
      std::vector<F> dP(L * L, F(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          F acc = 0;
          for (int64_t c = 0; c < d; ++c) acc += dO(i, c) * V(j, c);
          dP[i * L + j] = acc;
          for (int64_t c = 0; c < d; ++c) dv[(s0 + j) * ldk + kvh * d + c] += P[i * L + j] * dO(i, c);
        }
      for (int64_t i = 0; i < L; ++i) {
        F rowdot = 0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j <= i; ++j) rowdot += P[i * L + j] * dP[i * L + j];
        for (int64_t j = 0; j <= i; ++j) {
          const F ds = P[i * L + j] * (dP[i * L + j] - rowdot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            dq[(s0 + i) * ldq + h * d + c] += ds * K(j, c);
            dk[(s0 + j) * ldk + kvh * d + c] += ds * Q(i, c);
          }
        }
      }
    }
  }
}

}  // namespace kestrel::ops::ref
