// MoE router, load-balancing losses and capacity dropping on the CPU (the
// permutation and shared-expert gate: moe_cpu_permute.cpp; the grouped GEMM:
// moe_cpu_gemm.cpp). All math in f32 like PyTorch's f32 router (std::exp,
// not the vectorised approximation: a choice between near-equal experts must
// come out as HF's does); the losses' sums over tokens in double, in token
// order.
#include "backend/cpu/moe_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

namespace {

// (a, ia) ranks before (b, ib) in a top-k: the larger value first (NaN above
// everything, as torch.topk orders it), then the lower index.
inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// out[0, k) = indices of the k best of v[0, n), best first (insertion into a
// sorted list of k: one comparison for most entries when k << n).
void top_k(const float* v, int64_t n, int64_t k, int32_t* out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (m == k && !ranks_before(v[i], i, v[out[m - 1]], out[m - 1])) continue;
    int64_t pos = m < k ? m++ : k - 1;
    while (pos > 0 && ranks_before(v[i], i, v[out[pos - 1]], out[pos - 1])) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = int32_t(i);
  }
}

// s[0, E) = softmax(l) (max-subtracted, times the reciprocal of the sum, as
// ATen's last-dim softmax) or sigmoid(l).
void score_row(const float* l, int64_t E, MoeScoreFn fn, float* s) {
  if (fn == MoeScoreFn::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-l[e]));
    return;
  }
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += s[e] = std::exp(l[e] - mx);
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < E; ++e) s[e] *= inv;
}

// Row t of a float tensor [T, E] as f32 into dst.
void load_row(const Tensor& t, int64_t row, float* dst) {
  const int64_t E = t.size(1);
  dispatch_float(t.dtype(), [&](auto tag) {
    using L = decltype(tag);
    const L* src = ptr<const L>(t) + row * E;
    for (int64_t e = 0; e < E; ++e) dst[e] = load_f32(src, e);
  });
}

// The group limit on one row of choice values (in place): SumTop2 masks the
// experts of all but the topk_group best groups (by the sum of their two best
// choices) to -inf, Max (by their best choice) to 0.
void apply_group_limit(float* choice, const MoeRouterParams& p, float* group_score, int32_t* best) {
  if (p.group == MoeGroupRule::None) return;
  const int64_t per = p.num_experts / p.n_group;
  for (int64_t g = 0; g < p.n_group; ++g) {
    const float* c = choice + g * per;
    if (p.group == MoeGroupRule::SumTop2) {
      top_k(c, per, 2, best);
      group_score[g] = c[best[0]] + c[best[1]];
    } else {
      top_k(c, per, 1, best);
      group_score[g] = c[best[0]];
    }
  }
  top_k(group_score, p.n_group, p.topk_group, best);
  const float masked = p.group == MoeGroupRule::SumTop2 ? -std::numeric_limits<float>::infinity() : 0.f;
  for (int64_t g = 0; g < p.n_group; ++g) {
    if (std::find(best, best + p.topk_group, int32_t(g)) != best + p.topk_group) continue;
    std::fill(choice + g * per, choice + (g + 1) * per, masked);
  }
}

// Every entry of idx is an expert in [0, E) or -1 (dropped).
void check_expert_ids(const char* op, const Tensor& idx, int64_t E) {
  const int32_t* ix = ptr<const int32_t>(idx);
  for (int64_t i = 0; i < idx.numel(); ++i)
    if (ix[i] < -1 || ix[i] >= E)
      KS_FAIL("ops::", op, ": topk_idx[", i / idx.size(1), ", ", i % idx.size(1), "] = ", ix[i],
              " is not an expert in [0, ", E, ") nor -1 (dropped)");
}

}  // namespace

// ---- router -----------------------------------------------------------------

void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterParams& p, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay) {
  const int64_t T = logits.size(0), E = p.num_experts, k = p.top_k;
  if (replay) check_expert_ids("moe_router_fwd", topk_idx, E);
  const float* bp = bias ? ptr<const float>(*bias) : nullptr;
  int32_t* idx = ptr<int32_t>(topk_idx);
  float* w = ptr<float>(topk_w);
  float* sc = ptr<float>(scores);
  const bool bf16_out = logits.dtype() == DType::BF16;  // weights take the logits' dtype, as HF's and Megatron's
  parallel_blocks(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> lrow(static_cast<size_t>(E)), choice(static_cast<size_t>(E)),
        group_score(static_cast<size_t>(p.n_group));
    std::vector<int32_t> best(size_t(std::max<int64_t>(2, p.n_group)));
    for (int64_t t = t0; t < t1; ++t) {
      float* s = sc + t * E;
      int32_t* ix = idx + t * k;
      float* wt = w + t * k;
      load_row(logits, t, lrow.data());
      score_row(lrow.data(), E, p.score, s);
      bool unrecorded = replay;  // a replayed row of -1s only has no record: it is routed here
      for (int64_t j = 0; replay && j < k; ++j) unrecorded = unrecorded && ix[j] < 0;
      if (!replay || unrecorded) {
        for (int64_t e = 0; e < E; ++e) choice[size_t(e)] = bp ? s[e] + bp[e] : s[e];
        apply_group_limit(choice.data(), p, group_score.data(), best.data());
        top_k(choice.data(), E, k, ix);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        wt[j] = ix[j] >= 0 ? s[ix[j]] : 0.f;
        sum += wt[j];
      }
      if (p.norm_topk_prob) {
        // (A replayed row whose slots are all dropped keeps its zeros, not 0/0.)
        const float denom = p.score == MoeScoreFn::Sigmoid ? sum + 1e-20f : sum;
        if (denom != 0.f)
          for (int64_t j = 0; j < k; ++j) wt[j] /= denom;
      }
      for (int64_t j = 0; j < k; ++j) {
        if (p.scaling_factor != 1.f) wt[j] *= p.scaling_factor;
        if (bf16_out) wt[j] = round_to<bf16_bits>(wt[j]);
      }
    }
  });
}

void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& dtopk_w, const MoeRouterParams& p,
                    Tensor& dlogits) {
  const int64_t T = scores.size(0), E = p.num_experts, k = p.top_k;
  check_expert_ids("moe_router_bwd", topk_idx, E);
  const float* sc = ptr<const float>(scores);
  const int32_t* idx = ptr<const int32_t>(topk_idx);
  const float* dw = ptr<const float>(dtopk_w);
  float* dl = ptr<float>(dlogits);
  parallel_blocks(T, E * 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> ds(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      const float* s = sc + t * E;
      const int32_t* ix = idx + t * k;
      const float* g = dw + t * k;
      float sum = 0.f, dot = 0.f;
      for (int64_t j = 0; j < k; ++j)
        if (ix[j] >= 0) {
          sum += s[ix[j]];
          dot += g[j] * s[ix[j]];
        }
      const float Z = p.score == MoeScoreFn::Sigmoid ? sum + 1e-20f : sum;
      std::fill(ds.begin(), ds.end(), 0.f);
      for (int64_t j = 0; j < k; ++j)
        if (ix[j] >= 0)
          ds[size_t(ix[j])] +=
              p.norm_topk_prob ? p.scaling_factor * (g[j] / Z - dot / (Z * Z)) : p.scaling_factor * g[j];
      float* d = dl + t * E;
      if (p.score == MoeScoreFn::Sigmoid) {
        for (int64_t e = 0; e < E; ++e) d[e] += ds[size_t(e)] * s[e] * (1.f - s[e]);
      } else {
        float pd = 0.f;
        for (int64_t e = 0; e < E; ++e) pd += s[e] * ds[size_t(e)];
        for (int64_t e = 0; e < E; ++e) d[e] += s[e] * (ds[size_t(e)] - pd);
      }
    }
  });
}

// ---- load balancing ---------------------------------------------------------

namespace {

// The aux loss's view of a micro-batch: per token the probabilities p (softmax,
// or sigmoid over its sum + 1e-20) and their plain top-k; per group g and
// expert e the count c[g, e] of its tokens choosing e.
struct AuxRouting {
  int64_t T = 0, E = 0, G = 0;
  std::vector<int32_t> cu;      // [G+1] token offsets
  std::vector<float> p;         // [T, E]
  std::vector<int64_t> counts;  // [G, E]
};

AuxRouting aux_routing(const char* op, const Tensor& logits, const Tensor& cu_groups, MoeScoreFn score, int64_t k) {
  AuxRouting a;
  a.T = logits.size(0);
  a.E = logits.size(1);
  a.G = cu_groups.numel() - 1;
  const int32_t* cu = ptr<const int32_t>(cu_groups);
  a.cu.assign(cu, cu + a.G + 1);
  if (a.cu[0] != 0 || a.cu[size_t(a.G)] != a.T)
    KS_FAIL("ops::", op, ": cu_groups must run from 0 to the ", a.T, " rows of logits, got ", a.cu[0], " .. ",
            a.cu[size_t(a.G)]);
  for (int64_t g = 0; g < a.G; ++g)
    if (a.cu[size_t(g + 1)] < a.cu[size_t(g)])
      KS_FAIL("ops::", op, ": cu_groups must not decrease, got cu_groups[", g, "] = ", a.cu[size_t(g)], " > cu_groups[",
              g + 1, "] = ", a.cu[size_t(g + 1)]);
  const int64_t T = a.T, E = a.E;
  a.p.resize(size_t(T * E));
  std::vector<int32_t> sel(size_t(T * k));  // [T, k]
  parallel_blocks(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> l(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      float* p = a.p.data() + t * E;
      load_row(logits, t, l.data());
      score_row(l.data(), E, score, p);
      if (score == MoeScoreFn::Sigmoid) {
        float sum = 0.f;
        for (int64_t e = 0; e < E; ++e) sum += p[e];
        for (int64_t e = 0; e < E; ++e) p[e] /= sum + 1e-20f;
      }
      top_k(p, E, k, sel.data() + t * k);
    }
  });
  a.counts.assign(size_t(a.G * E), 0);
  for (int64_t g = 0; g < a.G; ++g)
    for (int64_t t = a.cu[size_t(g)]; t < a.cu[size_t(g + 1)]; ++t)
      for (int64_t j = 0; j < k; ++j) ++a.counts[size_t(g * E + sel[size_t(t * k + j)])];
  return a;
}

}  // namespace

double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, MoeScoreFn score, int64_t top_k, double coeff,
                        Tensor& counts) {
  const AuxRouting a = aux_routing("moe_aux_loss_fwd", logits, cu_groups, score, top_k);
  const int64_t E = a.E, G = a.G;
  // P[g, e] = sum over the group's tokens of p[t, e]: columns split over threads, tokens summed in order.
  std::vector<double> P(size_t(G * E), 0.0);
  parallel_blocks(E, a.T, [&](int64_t e0, int64_t e1) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t e = e0; e < e1; ++e) {
        double acc = 0.0;
        for (int64_t t = a.cu[size_t(g)]; t < a.cu[size_t(g + 1)]; ++t) acc += double(a.p[size_t(t * E + e)]);
        P[size_t(g * E + e)] = acc;
      }
  });
  int32_t* cnt = ptr<int32_t>(counts);
  for (int64_t e = 0; e < E; ++e) {
    int64_t total = 0;
    for (int64_t g = 0; g < G; ++g) total += a.counts[size_t(g * E + e)];
    cnt[e] = int32_t(total);
  }
  double loss = 0.0;
  for (int64_t g = 0; g < G; ++g) {
    const double Tg = double(a.cu[size_t(g + 1)] - a.cu[size_t(g)]);
    if (Tg == 0) continue;  // an empty group adds 0 (and still counts in the mean)
    double acc = 0.0;
    for (int64_t e = 0; e < E; ++e) acc += double(a.counts[size_t(g * E + e)]) * P[size_t(g * E + e)];
    loss += acc * double(E) / (double(top_k) * Tg * Tg);
  }
  return coeff * loss / double(G);
}

void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, MoeScoreFn score, int64_t top_k, double coeff,
                      double scale, Tensor& dlogits) {
  const AuxRouting a = aux_routing("moe_aux_loss_bwd", logits, cu_groups, score, top_k);
  const int64_t T = a.T, E = a.E, G = a.G;
  std::vector<int32_t> group_of(static_cast<size_t>(T));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = a.cu[size_t(g)]; t < a.cu[size_t(g + 1)]; ++t) group_of[size_t(t)] = int32_t(g);
  float* dl = ptr<float>(dlogits);
  parallel_blocks(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> l(static_cast<size_t>(E)), q(static_cast<size_t>(E)), da(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = group_of[size_t(t)];
      const double Tg = double(a.cu[size_t(g + 1)] - a.cu[size_t(g)]);
      const double per_count = scale * coeff / double(G) * double(E) / (double(top_k) * Tg * Tg);
      for (int64_t e = 0; e < E; ++e) da[size_t(e)] = float(per_count * double(a.counts[size_t(g * E + e)]));
      float* d = dl + t * E;
      if (score == MoeScoreFn::Softmax) {
        const float* p = a.p.data() + t * E;
        float pa = 0.f;
        for (int64_t e = 0; e < E; ++e) pa += p[e] * da[size_t(e)];
        for (int64_t e = 0; e < E; ++e) d[e] += p[e] * (da[size_t(e)] - pa);
      } else {
        // p = q / S with q = sigmoid(l), S = sum q + 1e-20: back through the normalisation, then the sigmoid.
        load_row(logits, t, l.data());
        score_row(l.data(), E, MoeScoreFn::Sigmoid, q.data());
        float S = 0.f, qa = 0.f;
        for (int64_t e = 0; e < E; ++e) S += q[size_t(e)];
        S += 1e-20f;
        for (int64_t e = 0; e < E; ++e) qa += q[size_t(e)] * da[size_t(e)];
        for (int64_t e = 0; e < E; ++e) {
          const float dq = da[size_t(e)] / S - qa / (S * S);
          d[e] += dq * q[size_t(e)] * (1.f - q[size_t(e)]);
        }
      }
    }
  });
}

namespace {
// lse[t] = logsumexp of row t of logits [T, E].
void row_lse(const Tensor& logits, std::vector<float>& lse) {
  const int64_t T = logits.size(0), E = logits.size(1);
  lse.resize(size_t(T));
  parallel_blocks(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> l(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      load_row(logits, t, l.data());
      float mx = l[0], s = 0.f;
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[size_t(e)]);
      for (int64_t e = 0; e < E; ++e) s += std::exp(l[size_t(e)] - mx);
      lse[size_t(t)] = mx + std::log(s);
    }
  });
}
}  // namespace

double moe_z_loss_fwd(const Tensor& logits, double coeff) {
  const int64_t T = logits.size(0);
  if (T == 0) return 0.0;
  std::vector<float> lse;
  row_lse(logits, lse);
  double acc = 0.0;
  for (float v : lse) acc += double(v) * double(v);
  return coeff * acc / double(T);
}

void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits) {
  const int64_t T = logits.size(0), E = logits.size(1);
  std::vector<float> lse;
  row_lse(logits, lse);
  float* dl = ptr<float>(dlogits);
  parallel_blocks(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> l(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      load_row(logits, t, l.data());
      // d/dl_e of coeff * mean lse^2 = coeff * 2 lse / T * softmax(l)_e
      const float c = float(scale * coeff * 2.0 / double(T)) * lse[size_t(t)];
      for (int64_t e = 0; e < E; ++e) dl[t * E + e] += c * std::exp(l[size_t(e)] - lse[size_t(t)]);
    }
  });
}

// ---- capacity ---------------------------------------------------------------

int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, int64_t num_experts, int64_t capacity, bool by_probs) {
  const int64_t E = num_experts, n = topk_idx.numel();
  check_expert_ids("moe_drop_to_capacity", topk_idx, E);
  int32_t* idx = ptr<int32_t>(topk_idx);
  float* w = ptr<float>(topk_w);
  // Pairs (flat t * k + j) bucketed by expert, in token order within a bucket.
  std::vector<int64_t> start(size_t(E + 1), 0), pairs;
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] >= 0) ++start[size_t(idx[i] + 1)];
  std::partial_sum(start.begin(), start.end(), start.begin());
  pairs.resize(size_t(start[size_t(E)]));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i)
      if (idx[i] >= 0) pairs[size_t(fill[size_t(idx[i])]++)] = i;
  }
  int64_t dropped = 0;
  for (int64_t e = 0; e < E; ++e) dropped += std::max<int64_t>(0, start[size_t(e + 1)] - start[size_t(e)] - capacity);
  // Each expert owns its pairs' entries: experts split over threads write disjoint entries.
  parallel_blocks(E, std::max<int64_t>(1, n / std::max<int64_t>(1, E)) * 16, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      int64_t* b = pairs.data() + start[size_t(e)];
      int64_t* end = pairs.data() + start[size_t(e + 1)];
      if (end - b <= capacity) continue;
      if (by_probs) std::sort(b, end, [&](int64_t x, int64_t y) { return ranks_before(w[x], x, w[y], y); });
      for (int64_t* it = b + capacity; it < end; ++it) {
        idx[*it] = -1;
        w[*it] = 0.f;
      }
    }
  });
  return dropped;
}

void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate) {
  const int64_t E = int64_t(load.size());
  // The mean in double (Megatron: tokens_per_expert.sum() / E in the count's
  // float dtype); counts up to 2^53 are exact.
  double mean = 0;
  for (int64_t c : load) mean += double(c);
  mean /= double(E);
  float* b = ptr<float>(bias);
  for (int64_t e = 0; e < E; ++e) {
    const double off = mean - double(load[size_t(e)]);
    const float step = float(rate) * float((off > 0) - (off < 0));
    b[e] += step;
  }
}

}  // namespace kestrel::cpu
