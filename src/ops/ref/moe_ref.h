// Scalar reference (the test oracle) of ops/moe.h, run with T = double.
// Plain loops over packed row-major buffers, one token (or expert) at a time;
// no blocking, no threads, no rounding to storage dtypes (tests round where
// the contract says a kernel rounds). Index buffers are int32 as in the ops.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/moe.h"

namespace kestrel::ops::ref {

namespace moe_detail {

// (a, ia) ranks before (b, ib) in a top-k: larger value first (NaN above
// everything, as torch.topk), then the lower index.
template <class T>
bool ranks_before(T a, int64_t ia, T b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// Indices of the k best entries of v[0, n), best first.
template <class T>
std::vector<int64_t> top_k(const std::vector<T>& v, int64_t k) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return ranks_before(v[size_t(a)], a, v[size_t(b)], b); });
  order.resize(size_t(k));
  return order;
}

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// scores of one row: softmax or sigmoid of logits[0, E).
template <class T>
std::vector<T> score_row(const T* logits, int64_t E, MoeScore score) {
  std::vector<T> s(static_cast<size_t>(E));
  if (score == MoeScore::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = sigmoid(logits[e]);
    return s;
  }
  T mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += s[size_t(e)] = std::exp(logits[e] - mx);
  for (int64_t e = 0; e < E; ++e) s[size_t(e)] /= sum;
  return s;
}

// The group limit applied to one row of choice values (in place).
template <class T>
void apply_group_limit(std::vector<T>& choice, const MoeRouterConfig& c) {
  if (c.group_limit == MoeGroupLimit::None) return;
  const int64_t per = c.num_experts / c.n_group;
  std::vector<T> group_score(static_cast<size_t>(c.n_group));
  for (int64_t g = 0; g < c.n_group; ++g) {
    std::vector<T> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    if (c.group_limit == MoeGroupLimit::SumTop2) {
      const auto best = top_k(members, 2);
      group_score[size_t(g)] = members[size_t(best[0])] + members[size_t(best[1])];
    } else {
      group_score[size_t(g)] = members[size_t(top_k(members, 1)[0])];
    }
  }
  std::vector<bool> keep(size_t(c.n_group), false);
  for (int64_t g : top_k(group_score, c.topk_group)) keep[size_t(g)] = true;
  const T masked = c.group_limit == MoeGroupLimit::SumTop2 ? -std::numeric_limits<T>::infinity() : T(0);
  for (int64_t e = 0; e < c.num_experts; ++e)
    if (!keep[size_t(e / per)]) choice[size_t(e)] = masked;
}

}  // namespace moe_detail

// ---- router -----------------------------------------------------------------

// logits [n, E], bias [E] or nullptr; idx [n, k] (read when replay), w [n, k], scores [n, E].
template <class T>
void moe_router_fwd(const T* logits, const T* bias, const MoeRouterConfig& c, int64_t n, int32_t* idx, T* w, T* scores,
                    bool replay = false) {
  const int64_t E = c.num_experts, k = c.top_k;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<T> s = moe_detail::score_row(logits + t * E, E, c.score);
    std::copy(s.begin(), s.end(), scores + t * E);
    bool unrecorded = replay;  // a replayed row of -1s only has no record: it is routed here
    for (int64_t j = 0; replay && j < k; ++j) unrecorded = unrecorded && idx[t * k + j] < 0;
    if (!replay || unrecorded) {
      std::vector<T> choice = s;
      if (bias)
        for (int64_t e = 0; e < E; ++e) choice[size_t(e)] += bias[e];
      moe_detail::apply_group_limit(choice, c);
      const auto top = moe_detail::top_k(choice, k);
      for (int64_t j = 0; j < k; ++j) idx[t * k + j] = int32_t(top[size_t(j)]);
    }
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[t * k + j];
      w[t * k + j] = e >= 0 ? s[size_t(e)] : T(0);
      sum += w[t * k + j];
    }
    if (c.norm_topk_prob) {
      const T denom = c.score == MoeScore::Sigmoid ? sum + T(1e-20) : sum;
      if (denom != T(0))  // a replayed row with every slot dropped keeps its zeros
        for (int64_t j = 0; j < k; ++j) w[t * k + j] /= denom;
    }
    for (int64_t j = 0; j < k; ++j) w[t * k + j] *= T(c.scaling_factor);
  }
}

// dlogits [n, E] += d(sum_j dw[t, j] * w[t, j]) / d logits, the selection idx fixed.
template <class T>
void moe_router_bwd(const T* scores, const int32_t* idx, const T* dw, const MoeRouterConfig& c, int64_t n, T* dlogits) {
  const int64_t E = c.num_experts, k = c.top_k;
  const T scale = T(c.scaling_factor);
  for (int64_t t = 0; t < n; ++t) {
    const T* p = scores + t * E;
    std::vector<T> ds(size_t(E), T(0));  // d L / d scores of this row
    T sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[t * k + j];
      if (e < 0) continue;
      sum += p[e];
      dot += dw[t * k + j] * p[e];
    }
    const T Z = c.score == MoeScore::Sigmoid ? sum + T(1e-20) : sum;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[t * k + j];
      if (e < 0) continue;
      ds[size_t(e)] += c.norm_topk_prob ? scale * (dw[t * k + j] / Z - dot / (Z * Z)) : scale * dw[t * k + j];
    }
    if (c.score == MoeScore::Sigmoid) {
      for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] += ds[size_t(e)] * p[e] * (T(1) - p[e]);
    } else {
      T pd = 0;
      for (int64_t e = 0; e < E; ++e) pd += p[e] * ds[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] += p[e] * (ds[size_t(e)] - pd);
    }
  }
}

// ---- load balancing ---------------------------------------------------------

namespace moe_detail {
// p of the aux loss for one row: softmax, or sigmoid normalised by (sum + 1e-20).
template <class T>
std::vector<T> aux_probs(const T* logits, int64_t E, MoeScore score) {
  std::vector<T> p = score_row(logits, E, score);
  if (score == MoeScore::Sigmoid) {
    T sum = 0;
    for (T v : p) sum += v;
    for (T& v : p) v /= sum + T(1e-20);
  }
  return p;
}
// c[g, e]: tokens of group g whose plain top-k of p holds e.
template <class T>
std::vector<int64_t> aux_counts(const T* logits, const int32_t* cu, int64_t G, int64_t E, MoeScore score, int64_t k) {
  std::vector<int64_t> c(size_t(G * E), 0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = cu[g]; t < cu[g + 1]; ++t)
      for (int64_t e : top_k(aux_probs(logits + t * E, E, score), k)) ++c[size_t(g * E + e)];
  return c;
}
}  // namespace moe_detail

// logits [n, E]; cu [G+1]; counts [E] (summed over groups). Returns the loss.
template <class T>
T moe_aux_loss_fwd(const T* logits, const int32_t* cu, int64_t G, int64_t E, MoeScore score, int64_t k, T coeff,
                   int32_t* counts) {
  const auto c = moe_detail::aux_counts(logits, cu, G, E, score, k);
  for (int64_t e = 0; e < E; ++e) {
    int64_t total = 0;
    for (int64_t g = 0; g < G; ++g) total += c[size_t(g * E + e)];
    counts[e] = int32_t(total);
  }
  T loss = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t Tg = cu[g + 1] - cu[g];
    if (Tg == 0) continue;
    std::vector<T> P(size_t(E), T(0));
    for (int64_t t = cu[g]; t < cu[g + 1]; ++t) {
      const auto p = moe_detail::aux_probs(logits + t * E, E, score);
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += p[size_t(e)];
    }
    T acc = 0;
    for (int64_t e = 0; e < E; ++e) acc += T(c[size_t(g * E + e)]) * P[size_t(e)];
    loss += acc * T(E) / (T(k) * T(Tg) * T(Tg));
  }
  return coeff * loss / T(G);
}

// dlogits [n, E] += scale * d loss / d logits (counts constant).
template <class T>
void moe_aux_loss_bwd(const T* logits, const int32_t* cu, int64_t G, int64_t E, MoeScore score, int64_t k, T coeff,
                      T scale, T* dlogits) {
  const auto c = moe_detail::aux_counts(logits, cu, G, E, score, k);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t Tg = cu[g + 1] - cu[g];
    for (int64_t t = cu[g]; t < cu[g + 1]; ++t) {
      std::vector<T> a(static_cast<size_t>(E));  // d loss / d p[t, e]
      for (int64_t e = 0; e < E; ++e)
        a[size_t(e)] = scale * coeff / T(G) * T(E) / (T(k) * T(Tg) * T(Tg)) * T(c[size_t(g * E + e)]);
      const T* l = logits + t * E;
      const std::vector<T> q = moe_detail::score_row(l, E, score);
      if (score == MoeScore::Softmax) {
        T pa = 0;
        for (int64_t e = 0; e < E; ++e) pa += q[size_t(e)] * a[size_t(e)];
        for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] += q[size_t(e)] * (a[size_t(e)] - pa);
      } else {
        T S = T(1e-20), qa = 0;
        for (int64_t e = 0; e < E; ++e) S += q[size_t(e)];
        for (int64_t e = 0; e < E; ++e) qa += q[size_t(e)] * a[size_t(e)];
        for (int64_t e = 0; e < E; ++e) {
          const T dq = a[size_t(e)] / S - qa / (S * S);
          dlogits[t * E + e] += dq * q[size_t(e)] * (T(1) - q[size_t(e)]);
        }
      }
    }
  }
}

// coeff * mean_t logsumexp(logits[t])^2.
template <class T>
T moe_z_loss_fwd(const T* logits, int64_t n, int64_t E, T coeff) {
  if (n == 0) return T(0);
  T acc = 0;
  for (int64_t t = 0; t < n; ++t) {
    const T* l = logits + t * E;
    T mx = l[0], s = 0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    for (int64_t e = 0; e < E; ++e) s += std::exp(l[e] - mx);
    const T lse = mx + std::log(s);
    acc += lse * lse;
  }
  return coeff * acc / T(n);
}

template <class T>
void moe_z_loss_bwd(const T* logits, int64_t n, int64_t E, T coeff, T scale, T* dlogits) {
  for (int64_t t = 0; t < n; ++t) {
    const T* l = logits + t * E;
    T mx = l[0], s = 0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    for (int64_t e = 0; e < E; ++e) s += std::exp(l[e] - mx);
    const T lse = mx + std::log(s);
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] += scale * coeff * T(2) * lse / T(n) * std::exp(l[e] - mx) / s;
  }
}

// Per expert, keeps `capacity` of its (token, slot) pairs: the largest w (then
// the lower token) for Probs, the earliest tokens for Position. Returns the count dropped.
template <class T>
int64_t moe_drop_to_capacity(int32_t* idx, T* w, int64_t n, int64_t k, int64_t E, int64_t capacity,
                             MoeDropPolicy policy) {
  int64_t dropped = 0;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;  // flat t * k + j, in token order
    for (int64_t i = 0; i < n * k; ++i)
      if (idx[i] == e) pairs.push_back(i);
    if (int64_t(pairs.size()) <= capacity) continue;
    if (policy == MoeDropPolicy::Probs)
      std::stable_sort(pairs.begin(), pairs.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
    for (size_t i = size_t(capacity); i < pairs.size(); ++i) {
      idx[pairs[i]] = -1;
      w[pairs[i]] = T(0);
      ++dropped;
    }
  }
  return dropped;
}

// ---- permutation ------------------------------------------------------------

// The expert-major layout of moe_routing: sizes [E], dest [n, k], source [N].
inline void moe_routing(const int32_t* idx, int64_t n, int64_t k, int64_t E, int64_t pad_to,
                        std::vector<int64_t>& sizes, std::vector<int32_t>& dest, std::vector<int32_t>& source) {
  sizes.assign(size_t(E), 0);
  dest.assign(size_t(n * k), -1);
  source.clear();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (idx[t * k + j] == e) {
          dest[size_t(t * k + j)] = int32_t(source.size());
          source.push_back(int32_t(t));
          ++sizes[size_t(e)];
        }
    for (; pad_to > 0 && sizes[size_t(e)] < pad_to; ++sizes[size_t(e)]) source.push_back(-1);
  }
}

// xs [N, D] = x[source] (0 for source -1).
template <class T>
void moe_permute_fwd(const T* x, const int32_t* source, int64_t N, int64_t D, T* xs) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t d = 0; d < D; ++d) xs[r * D + d] = source[r] >= 0 ? x[source[r] * D + d] : T(0);
}
// dx [n, D] = sum over the token's rows of dxs.
template <class T>
void moe_permute_bwd(const T* dxs, const int32_t* dest, int64_t n, int64_t k, int64_t D, T* dx) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; ++d) {
      T acc = 0;
      for (int64_t j = 0; j < k; ++j)
        if (dest[t * k + j] >= 0) acc += dxs[dest[t * k + j] * D + d];
      dx[t * D + d] = acc;
    }
}
// y [n, D] = sum_j w[t, j] * ys[dest[t, j]].
template <class T>
void moe_unpermute_fwd(const T* ys, const T* w, const int32_t* dest, int64_t n, int64_t k, int64_t D, T* y) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; ++d) {
      T acc = 0;
      for (int64_t j = 0; j < k; ++j)
        if (dest[t * k + j] >= 0) acc += w[t * k + j] * ys[dest[t * k + j] * D + d];
      y[t * D + d] = acc;
    }
}
// dys [N, D] (0 on padding rows), dw [n, k] (0 on dropped slots).
template <class T>
void moe_unpermute_bwd(const T* ys, const T* w, const T* dy, const int32_t* dest, int64_t n, int64_t k, int64_t N,
                       int64_t D, T* dys, T* dw) {
  std::fill(dys, dys + N * D, T(0));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = dest[t * k + j];
      T acc = 0;
      if (r >= 0)
        for (int64_t d = 0; d < D; ++d) {
          dys[r * D + d] = w[t * k + j] * dy[t * D + d];
          acc += dy[t * D + d] * ys[r * D + d];
        }
      dw[t * k + j] = acc;
    }
}

// ---- grouped GEMM -----------------------------------------------------------

// y[rows of e] = x[rows of e] @ w[e]^T; x [N, in], w[e] [out, in], y [N, out].
template <class T>
void grouped_linear_fwd(const T* x, const std::vector<int64_t>& sizes, const std::vector<const T*>& w, int64_t in,
                        int64_t out, T* y) {
  int64_t r0 = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    for (int64_t r = r0; r < r0 + sizes[e]; ++r)
      for (int64_t o = 0; o < out; ++o) {
        T acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[e][o * in + i];
        y[r * out + o] = acc;
      }
    r0 += sizes[e];
  }
}
// dx = dy @ w[e] (written, when dx), dw[e] += dy^T @ x (when dw non-empty and dw[e]).
template <class T>
void grouped_linear_bwd(const T* x, const std::vector<int64_t>& sizes, const std::vector<const T*>& w, const T* dy,
                        int64_t in, int64_t out, T* dx, const std::vector<T*>& dw) {
  int64_t r0 = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    const int64_t r1 = r0 + sizes[e];
    if (dx)
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t i = 0; i < in; ++i) {
          T acc = 0;
          for (int64_t o = 0; o < out; ++o) acc += dy[r * out + o] * w[e][o * in + i];
          dx[r * in + i] = acc;
        }
    if (!dw.empty() && dw[e])
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          T acc = 0;
          for (int64_t r = r0; r < r1; ++r) acc += dy[r * out + o] * x[r * in + i];
          dw[e][o * in + i] += acc;
        }
    r0 = r1;
  }
}

// ---- shared-expert gate -----------------------------------------------------

// y[t] += sigmoid(g[t]) * s[t]; g [n], s / y [n, D].
template <class T>
void sigmoid_gate_add_fwd(const T* g, const T* s, int64_t n, int64_t D, T* y) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; ++d) y[t * D + d] += moe_detail::sigmoid(g[t]) * s[t * D + d];
}
// ds = sigmoid(g) * dy, dg = sigmoid'(g) * <dy, s> (both written).
template <class T>
void sigmoid_gate_add_bwd(const T* g, const T* s, const T* dy, int64_t n, int64_t D, T* ds, T* dg) {
  for (int64_t t = 0; t < n; ++t) {
    const T sg = moe_detail::sigmoid(g[t]);
    T acc = 0;
    for (int64_t d = 0; d < D; ++d) {
      ds[t * D + d] = sg * dy[t * D + d];
      acc += dy[t * D + d] * s[t * D + d];
    }
    dg[t] = sg * (T(1) - sg) * acc;
  }
}

// bias [E] += rate * sign(mean(load) - load[e]) (Megatron's get_updated_expert_bias).
template <class T>
void moe_update_expert_bias(T* bias, const int64_t* load, int64_t E, T rate) {
  T mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += T(load[e]);
  mean /= T(E);
  for (int64_t e = 0; e < E; ++e) {
    const T off = mean - T(load[e]);
    bias[e] += rate * T((off > 0) - (off < 0));
  }
}

}  // namespace kestrel::ops::ref
