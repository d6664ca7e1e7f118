#include "rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/sampling_cpu.h"
#include "core/rng.h"

namespace kestrel::rollout {

namespace {
constexpr int64_t kSumBlock = 64;  // weights per block of the two-level inverse CDF
}  // namespace

double sampling_uniform(uint64_t seed, uint64_t sample, int64_t position) {
  const auto r = philox4x32(uint64_t(position), sample, seed);
  return u32x2_to_unit_double(r[0], r[1]);
}

int32_t sample_token(const float* z, int64_t V, const SamplingParams& p, uint64_t sample, int64_t position,
                     SamplerScratch& sc) {
  // First maximum wins; NaN never compares greater.
  if (p.temperature < 1e-5) return cpu::sampling_argmax(z, V);
  const int32_t top = cpu::sampling_argmax(z, V);
  const float mx = z[top];
  if (!std::isfinite(mx)) return top;
  const float inv_t = float(1.0 / p.temperature);
  auto& w = sc.w;
  w.resize(size_t(V));
  // Relative to the most likely token (weight exp(0) = 1), so min-p is a
  // plain threshold: p_i >= min_p * p_max  <=>  w_i >= min_p.
  const float min_w = p.min_p > 0 ? float(p.min_p) : 0.f;
  // w_i = exp((z_i - max) / T), 0 below min-p (and for -inf logits), in
  // vector lanes: the same bits at every ISA level.
  int64_t alive = cpu::sampling_weights(z, V, mx, inv_t, min_w, w.data());
  // Descending weight, ties by token id: a total order, so results are unique.
  auto before = [&](int32_t a, int32_t b) { return w[size_t(a)] != w[size_t(b)] ? w[size_t(a)] > w[size_t(b)] : a < b; };
  auto& ord = sc.order;
  auto collect = [&] {
    ord.clear();
    for (int64_t i = 0; i < V; ++i)
      if (w[size_t(i)] > 0.f) ord.push_back(int32_t(i));
  };
  if (p.top_k > 0 && p.top_k < alive) {
    collect();
    std::nth_element(ord.begin(), ord.begin() + (p.top_k - 1), ord.end(), before);
    const float kth = w[size_t(ord[size_t(p.top_k - 1)])];
    alive = 0;
    for (int64_t i = 0; i < V; ++i) {  // ties with the k-th value survive, as in vLLM
      if (w[size_t(i)] < kth) w[size_t(i)] = 0.f;
      alive += w[size_t(i)] > 0.f;
    }
  }
  if (p.top_p < 1.0) {
    collect();
    std::sort(ord.begin(), ord.end(), before);
    double total = 0;
    for (int32_t i : ord) total += w[size_t(i)];
    // Keep the smallest prefix whose mass reaches top_p: a token survives when
    // the mass strictly before it is below top_p (the crossing token is kept).
    const double limit = p.top_p * total;
    double cum = 0;
    for (int32_t i : ord) {
      if (cum >= limit) w[size_t(i)] = 0.f;
      else cum += w[size_t(i)];
    }
  }
  // The inverse CDF in two levels: sums of blocks of kSumBlock weights (each
  // in 8 partial sums, a fixed order: no serial chain of V dependent adds),
  // then the running sum over blocks finds the block where the mass crosses
  // the target, and only that block is walked token by token.
  const int64_t nb = (V + kSumBlock - 1) / kSumBlock;
  auto& bsum = sc.block_sums;
  bsum.resize(size_t(nb));
  double total = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i0 = b * kSumBlock, i1 = std::min(V, i0 + kSumBlock);
    double part[8] = {};
    for (int64_t i = i0; i < i1; ++i) part[(i - i0) % 8] += w[size_t(i)];
    bsum[size_t(b)] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    total += bsum[size_t(b)];
  }
  const double target = sampling_uniform(p.seed, sample, position) * total;
  double acc = 0;
  for (int64_t b = 0; b < nb; ++b) {
    if (acc + bsum[size_t(b)] <= target) {
      acc += bsum[size_t(b)];
      continue;
    }
    for (int64_t i = b * kSumBlock, i1 = std::min(V, i + kSumBlock); i < i1; ++i) {
      if (w[size_t(i)] <= 0.f) continue;
      acc += w[size_t(i)];
      if (acc > target) return int32_t(i);
    }
  }
  // Rounding left the target at the very end of the mass: the last token with weight.
  for (int64_t i = V - 1; i >= 0; --i)
    if (w[size_t(i)] > 0.f) return int32_t(i);
  return top;
}

std::vector<std::pair<int32_t, float>> top_logprobs(const float* z, int64_t V, float lse, int64_t k) {
  k = std::min(k, V);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
  auto before = [&](int32_t a, int32_t b) { return z[a] != z[b] ? z[a] > z[b] : a < b; };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  std::vector<std::pair<int32_t, float>> out;
  for (int64_t i = 0; i < k; ++i) out.emplace_back(idx[size_t(i)], z[idx[size_t(i)]] - lse);
  return out;
}

}  // namespace kestrel::rollout
