// Scalar causal GQA attention reference (the oracle for the kernels): naive
// loops in any element type F, run with double in tests. The backward is the
// textbook softmax backward on the full per-sequence probability matrix.
// prefix_of (optional, one entry per sequence; see ops/attention.h): sequence
// b with prefix_of[b] = p >= 0 attends to all of p's keys, then causally to
// its own, as if p's rows were prepended to it.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kestrel::ops::ref {

struct AttnRefShape {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  double scale = 0;        // 0 = 1/sqrt(head_dim)
  int64_t v_head_dim = 0;  // 0 = head_dim
  double resolved_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(double(head_dim)); }
  int64_t dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

namespace detail {
// The key rows sequence b sees: its prefix's rows, then its own (query i of
// b sees the first P + i + 1 of them, P = the prefix length).
inline std::vector<int64_t> key_rows(const int32_t* cu, const int32_t* prefix_of, int64_t b, int64_t* P) {
  std::vector<int64_t> rows;
  const int64_t p = prefix_of ? prefix_of[b] : -1;
  if (p >= 0)
    for (int64_t r = cu[p]; r < cu[p + 1]; ++r) rows.push_back(r);
  *P = int64_t(rows.size());
  for (int64_t r = cu[b]; r < cu[b + 1]; ++r) rows.push_back(r);
  return rows;
}

// P [L, Lk] (row i over visible keys j < P + i + 1) of head h for the
// sequence whose queries start at row s0 and whose key rows are `keys`.
template <class F>
std::vector<F> attention_probs(const F* q, const F* k, int64_t s0, int64_t L, const std::vector<int64_t>& keys,
                               int64_t P, int64_t h, const AttnRefShape& s, F* lse_out /* [L] or null */) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d, Lk = int64_t(keys.size());
  const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
  const F scale = F(s.resolved_scale());
  std::vector<F> Pm(L * Lk, F(0));
  for (int64_t i = 0; i < L; ++i) {
    F m = -std::numeric_limits<F>::infinity();
    const int64_t n = P + i + 1;
    for (int64_t j = 0; j < n; ++j) {
      F dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[(s0 + i) * ldq + h * d + c] * k[keys[j] * ldk + kvh * d + c];
      Pm[i * Lk + j] = dot * scale;
      if (Pm[i * Lk + j] > m) m = Pm[i * Lk + j];
    }
    F sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (Pm[i * Lk + j] = std::exp(Pm[i * Lk + j] - m));
    for (int64_t j = 0; j < n; ++j) Pm[i * Lk + j] /= sum;
    if (lse_out) lse_out[i] = m + std::log(sum);
  }
  return Pm;
}
}  // namespace detail

// q [T, n_heads*d]; k [T, n_kv_heads*d]; v [T, n_kv_heads*dv]; cu [n_seqs+1];
// out [T, n_heads*dv] (dv = s.dv());
// lse [n_heads, T] (natural log of the sum of exp of the scaled scores);
// prefix_of [n_seqs] or null.
template <class F>
void attention_fwd_ref(const F* q, const F* k, const F* v, const int32_t* cu, int64_t n_seqs, const AttnRefShape& s,
                       F* out, F* lse, const int32_t* prefix_of = nullptr) {
  const int64_t dv = s.dv(), ldv = s.n_kv_heads * dv, ldo = s.n_heads * dv, T = cu[n_seqs];
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t s0 = cu[b], L = cu[b + 1] - cu[b];
    int64_t P = 0;
    const auto keys = detail::key_rows(cu, prefix_of, b, &P);
    const int64_t Lk = int64_t(keys.size());
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
      const auto Pm = detail::attention_probs(q, k, s0, L, keys, P, h, s, lse ? lse + h * T + s0 : nullptr);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < dv; ++c) {
          F acc = 0;
          for (int64_t j = 0; j < P + i + 1; ++j) acc += Pm[i * Lk + j] * v[keys[j] * ldv + kvh * dv + c];
          out[(s0 + i) * ldo + h * dv + c] = acc;
        }
    }
  }
}

// dout like out; dq like q; dk like k; dv like v (written, =). A prefix's
// dk/dv sum over its own queries and those of every sequence continuing it.
template <class F>
void attention_bwd_ref(const F* q, const F* k, const F* v, const F* dout, const int32_t* cu, int64_t n_seqs,
                       const AttnRefShape& s, F* dq, F* dk, F* dv, const int32_t* prefix_of = nullptr) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d, T = cu[n_seqs];
  const int64_t dvw = s.dv(), ldv = s.n_kv_heads * dvw, ldo = s.n_heads * dvw;
  const F scale = F(s.resolved_scale());
  for (int64_t i = 0; i < T * ldq; ++i) dq[i] = 0;
  for (int64_t i = 0; i < T * ldk; ++i) dk[i] = 0;
  for (int64_t i = 0; i < T * ldv; ++i) dv[i] = 0;
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t s0 = cu[b], L = cu[b + 1] - cu[b];
    int64_t P = 0;
    const auto keys = detail::key_rows(cu, prefix_of, b, &P);
    const int64_t Lk = int64_t(keys.size());
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
      const auto Pm = detail::attention_probs(q, k, s0, L, keys, P, h, s, static_cast<F*>(nullptr));
      auto Q = [&](int64_t i, int64_t c) { return q[(s0 + i) * ldq + h * d + c]; };
      auto K = [&](int64_t j, int64_t c) { return k[keys[j] * ldk + kvh * d + c]; };
      auto V = [&](int64_t j, int64_t c) { return v[keys[j] * ldv + kvh * dvw + c]; };
      auto dO = [&](int64_t i, int64_t c) { return dout[(s0 + i) * ldo + h * dvw + c]; };
      std::vector<F> dP(L * Lk, F(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < P + i + 1; ++j) {
          F acc = 0;
          for (int64_t c = 0; c < dvw; ++c) acc += dO(i, c) * V(j, c);
          dP[i * Lk + j] = acc;
          for (int64_t c = 0; c < dvw; ++c) dv[keys[j] * ldv + kvh * dvw + c] += Pm[i * Lk + j] * dO(i, c);
        }
      for (int64_t i = 0; i < L; ++i) {
        F rowdot = 0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < P + i + 1; ++j) rowdot += Pm[i * Lk + j] * dP[i * Lk + j];
        for (int64_t j = 0; j < P + i + 1; ++j) {
          const F ds = Pm[i * Lk + j] * (dP[i * Lk + j] - rowdot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            dq[(s0 + i) * ldq + h * d + c] += ds * K(j, c);
            dk[keys[j] * ldk + kvh * d + c] += ds * Q(i, c);
          }
        }
      }
    }
  }
}

// ---- Block attention (context parallelism: ops/attention.h attention_block_*) ----
// q [Tq, n_heads*d] and k [Tk, n_kv_heads*d], v [Tk, n_kv_heads*dv] hold rows
// of the same n_seqs sequences: sequence b is q rows cu_q[b]..cu_q[b+1] and
// k/v rows cu_k[b]..cu_k[b+1]; key j is visible to query i of its sequence
// iff k_pos[j] <= q_pos[i].
struct BlockRef {
  const int32_t* cu_q;   // [n_seqs+1]
  const int32_t* cu_k;   // [n_seqs+1]
  const int32_t* q_pos;  // [Tq]
  const int32_t* k_pos;  // [Tk]
  int64_t n_seqs;
  int64_t Tq() const { return cu_q[n_seqs]; }
  int64_t Tk() const { return cu_k[n_seqs]; }
};

namespace detail {
// The k rows visible to q row i of sequence b.
inline std::vector<int64_t> visible_keys(const BlockRef& blk, int64_t b, int64_t i) {
  std::vector<int64_t> rows;
  for (int64_t j = blk.cu_k[b]; j < blk.cu_k[b + 1]; ++j)
    if (blk.k_pos[j] <= blk.q_pos[i]) rows.push_back(j);
  return rows;
}
// Scaled scores of q row i, head h, against the k rows `keys`.
template <class F>
std::vector<F> block_scores(const F* q, const F* k, int64_t i, int64_t h, const std::vector<int64_t>& keys,
                            const AttnRefShape& s) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d;
  const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
  std::vector<F> sc(keys.size());
  for (size_t j = 0; j < keys.size(); ++j) {
    F dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += q[i * ldq + h * d + c] * k[keys[j] * ldk + kvh * d + c];
    sc[j] = dot * F(s.resolved_scale());
  }
  return sc;
}
}  // namespace detail

// out [Tq, n_heads*dv]: softmax over the visible keys of this block times v
// (0 for a row that sees none); lse [n_heads, Tq] (or null): log-sum-exp of
// the visible scaled scores (-inf for a row that sees none).
template <class F>
void attention_block_fwd_ref(const F* q, const F* k, const F* v, const BlockRef& blk, const AttnRefShape& s, F* out,
                             F* lse) {
  const int64_t dv = s.dv(), ldv = s.n_kv_heads * dv, ldo = s.n_heads * dv, Tq = blk.Tq();
  for (int64_t b = 0; b < blk.n_seqs; ++b)
    for (int64_t i = blk.cu_q[b]; i < blk.cu_q[b + 1]; ++i) {
      const auto keys = detail::visible_keys(blk, b, i);
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
        auto p = detail::block_scores(q, k, i, h, keys, s);
        F m = -std::numeric_limits<F>::infinity(), sum = 0;
        for (F x : p) m = x > m ? x : m;
        for (F& x : p) sum += (x = std::exp(x - m));
        for (int64_t c = 0; c < dv; ++c) {
          F acc = 0;
          for (size_t j = 0; j < keys.size(); ++j) acc += p[j] / sum * v[keys[j] * ldv + kvh * dv + c];
          out[i * ldo + h * dv + c] = acc;
        }
        if (lse) lse[h * Tq + i] = keys.empty() ? -std::numeric_limits<F>::infinity() : m + std::log(sum);
      }
    }
}

// The softmax over the union of two blocks' keys from each block's (out, lse):
// out, lse <- (w_a out + w_b out_b) / (w_a + w_b), log(e^lse + e^lse_b) with
// w = e^lse; a side with lse = -inf (no visible key) has weight 0.
// out, out_b [Tq, n_heads*dv]; lse, lse_b [n_heads, Tq].
template <class F>
void attention_merge_ref(F* out, F* lse, const F* out_b, const F* lse_b, int64_t Tq, int64_t n_heads, int64_t dv) {
  const F neg_inf = -std::numeric_limits<F>::infinity();
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const F a = lse[h * Tq + i], b = lse_b[h * Tq + i];
      const F m = a > b ? a : b;
      if (m == neg_inf) continue;  // neither block has a visible key
      const F wa = std::exp(a - m), wb = std::exp(b - m);
      for (int64_t c = 0; c < dv; ++c) {
        F& o = out[i * n_heads * dv + h * dv + c];
        o = (wa * (a == neg_inf ? F(0) : o) + wb * (b == neg_inf ? F(0) : out_b[i * n_heads * dv + h * dv + c])) /
            (wa + wb);
      }
      lse[h * Tq + i] = m + std::log(wa + wb);
    }
}

// The backward of one block given the FINAL out and lse of the query rows
// (after merging every block): P_ij = exp(score_ij - lse_i) over this
// block's visible keys, D_i = sum_c dout_ic out_ic, dS_ij = P_ij (dout_i .
// v_j - D_i). dq += scale dS k (accumulated); dk = scale dS^T q, dv = P^T dout
// (written; summed over the query heads of a kv head). Shapes as the forward.
template <class F>
void attention_block_bwd_ref(const F* q, const F* k, const F* v, const F* out, const F* lse, const F* dout,
                             const BlockRef& blk, const AttnRefShape& s, F* dq, F* dk, F* dv) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d, Tq = blk.Tq(), Tk = blk.Tk();
  const int64_t dvw = s.dv(), ldv = s.n_kv_heads * dvw, ldo = s.n_heads * dvw;
  const F scale = F(s.resolved_scale());
  for (int64_t i = 0; i < Tk * ldk; ++i) dk[i] = 0;
  for (int64_t i = 0; i < Tk * ldv; ++i) dv[i] = 0;
  for (int64_t b = 0; b < blk.n_seqs; ++b)
    for (int64_t i = blk.cu_q[b]; i < blk.cu_q[b + 1]; ++i) {
      const auto keys = detail::visible_keys(blk, b, i);
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
        const F* dO = dout + i * ldo + h * dvw;
        F D = 0;
        for (int64_t c = 0; c < dvw; ++c) D += dO[c] * out[i * ldo + h * dvw + c];
        const auto sc = detail::block_scores(q, k, i, h, keys, s);
        for (size_t jj = 0; jj < keys.size(); ++jj) {
          const int64_t j = keys[jj];
          const F p = std::exp(sc[jj] - lse[h * Tq + i]);
          F dp = 0;
          for (int64_t c = 0; c < dvw; ++c) {
            dp += dO[c] * v[j * ldv + kvh * dvw + c];
            dv[j * ldv + kvh * dvw + c] += p * dO[c];
          }
          const F ds = p * (dp - D) * scale;
          for (int64_t c = 0; c < d; ++c) {
            dq[i * ldq + h * d + c] += ds * k[j * ldk + kvh * d + c];
            dk[j * ldk + kvh * d + c] += ds * q[i * ldq + h * d + c];
          }
        }
      }
    }
}

}  // namespace kestrel::ops::ref
