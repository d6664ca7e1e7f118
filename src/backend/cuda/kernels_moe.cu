// CUDA kernels of the mixture-of-experts ops (ops/moe.h; launchers in
// kernels_moe.h), ports of the CPU kernels in backend/cpu/moe_cpu*.cpp with
// the same arithmetic in the same order wherever an order is visible:
//   - router forward / backward, the aux loss's probabilities and backward,
//     the z-loss's logsumexp: one thread per token, walking the token's E
//     experts serially exactly as the CPU does (softmax max and sum in expert
//     order, the insertion top-k with NaN first and ties to the lower index,
//     the group limit, the normalisation), so a top-k choice only differs from
//     the CPU's where expf's last ulp does;
//   - the aux loss's per-group sums: one thread per (group, expert), tokens in
//     order, in double as the CPU;
//   - capacity dropping: one thread per routed pair, ranking it within its
//     expert's bucket by counting the pairs ranked before it (the order of the
//     CPU's sort, which has no ties);
//   - permutation, unpermutation, the gate: one thread per output element, a
//     token's slots summed in slot order; the two dot products (dtopk_w, dg)
//     one block per output with a fixed-order block sum.
// No atomics: every result is deterministic. Math in f32 (double where the CPU
// sums in double), expf/logf, bf16 stored with __float2bfloat16_rn once.
// Correctness first, NOT yet tuned: the per-token serial loops and the
// quadratic capacity ranking (sum over experts of bucket^2) are the first
// candidates once a profile says they matter.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels_moe.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256;      // elementwise and block-sum kernels (a multiple of 32, <= 1024)
constexpr int kRowThreads = 128;   // one-thread-per-row kernels
inline unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowThreads - 1) / kRowThreads); }
// Grid of the block-per-output kernels (they loop over outputs with a stride of gridDim.x).
inline unsigned out_blocks(int64_t n) { return unsigned(n < 65535 * 8 ? n : 65535 * 8); }

// std::max(a, b) as the CPU kernels call it: (a < b) ? b : a (a NaN b is skipped, a NaN a kept).
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }


// ---- top-k, as backend/cpu/moe_cpu.cpp ------------------------------------------

// (a, ia) ranks before (b, ib): the larger value first (NaN above everything,
// as torch.topk orders it), then the lower index.
__device__ bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// out[0, k) = indices of the k best of v[0, n), best first (insertion into a sorted list of k).
__device__ void top_k(const float* v, int64_t n, int64_t k, int32_t* out) {
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

// s[0, E) = softmax (max-subtracted, times the reciprocal of the sum) or sigmoid
// of row `row` of logits [T, E].
__device__ void score_row(const void* logits, FloatKind kl, int64_t row, int64_t E, bool sig, float* s) {
  const int64_t base = row * E;
  if (sig) {
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(ld(logits, kl, base + e));
    return;
  }
  float mx = ld(logits, kl, base);
  for (int64_t e = 1; e < E; ++e) mx = std_max(mx, ld(logits, kl, base + e));
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += s[e] = expf(ld(logits, kl, base + e) - mx);
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < E; ++e) s[e] *= inv;
}

// The group limit on one row of choices (in place): SumTop2 masks the experts
// of all but the topk_group best groups (by their two best choices' sum) to
// -inf, Max (by their best choice) to 0. gs: [n_group], best: [max(2, n_group)].
__device__ void apply_group_limit(float* choice, const MoeRouterDims& d, float* gs, int32_t* best) {
  if (d.group == 0) return;
  const int64_t per = d.E / d.n_group;
  for (int64_t g = 0; g < d.n_group; ++g) {
    const float* c = choice + g * per;
    if (d.group == 1) {
      top_k(c, per, 2, best);
      gs[g] = c[best[0]] + c[best[1]];
    } else {
      top_k(c, per, 1, best);
      gs[g] = c[best[0]];
    }
  }
  top_k(gs, d.n_group, d.topk_group, best);
  const float masked = d.group == 1 ? kNegInf : 0.f;
  for (int64_t g = 0; g < d.n_group; ++g) {
    bool kept = false;
    for (int64_t i = 0; i < d.topk_group; ++i) kept = kept || best[i] == int32_t(g);
    if (kept) continue;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) choice[e] = masked;
  }
}

// ---- router -----------------------------------------------------------------

__global__ void router_fwd_kernel(const void* logits, FloatKind kl, const float* bias, MoeRouterDims d, bool replay,
                                  int32_t* idx, float* w, float* scores, float* choice_all, float* gs_all,
                                  int32_t* best_all) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= d.T) return;
  const int64_t E = d.E, k = d.k;
  float* s = scores + t * E;
  int32_t* ix = idx + t * k;
  float* wt = w + t * k;
  score_row(logits, kl, t, E, d.sigmoid, s);
  bool unrecorded = replay;  // a replayed row of -1s only has no record: it is routed here
  for (int64_t j = 0; replay && j < k; ++j) unrecorded = unrecorded && ix[j] < 0;
  if (!replay || unrecorded) {
    float* choice = choice_all + t * E;  // this token's row of the [T, E] scratch
    for (int64_t e = 0; e < E; ++e) choice[e] = bias ? s[e] + bias[e] : s[e];
    const int64_t best_stride = d.n_group > 2 ? d.n_group : 2;  // moe_router_best_stride (a host function)
    apply_group_limit(choice, d, gs_all + t * d.n_group, best_all + t * best_stride);
    top_k(choice, E, k, ix);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    wt[j] = ix[j] >= 0 ? s[ix[j]] : 0.f;
    sum += wt[j];
  }
  if (d.norm_topk_prob) {
    // (A replayed row whose slots are all dropped keeps its zeros, not 0/0.)
    const float denom = d.sigmoid ? sum + 1e-20f : sum;
    if (denom != 0.f)
      for (int64_t j = 0; j < k; ++j) wt[j] /= denom;
  }
  for (int64_t j = 0; j < k; ++j) {
    if (d.scaling_factor != 1.f) wt[j] *= d.scaling_factor;
    wt[j] = round_to(wt[j], kl);  // the weights take the logits' dtype, as HF's and Megatron's
  }
}

// The CPU's ds[e] (the gradient reaching score e, summed over the slots that
// chose e in slot order) recomputed per expert: no [E] scratch per thread.
__device__ __forceinline__ float router_ds(int64_t e, const int32_t* ix, const float* g, int64_t k,
                                           const MoeRouterDims& d, float Z, float dot) {
  float ds = 0.f;
  for (int64_t j = 0; j < k; ++j)
    if (ix[j] == int32_t(e))
      ds += d.norm_topk_prob ? d.scaling_factor * (g[j] / Z - dot / (Z * Z)) : d.scaling_factor * g[j];
  return ds;
}

__global__ void router_bwd_kernel(const float* scores, const int32_t* idx, const float* dw, MoeRouterDims d,
                                  float* dlogits) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= d.T) return;
  const int64_t E = d.E, k = d.k;
  const float* s = scores + t * E;
  const int32_t* ix = idx + t * k;
  const float* g = dw + t * k;
  float sum = 0.f, dot = 0.f;
  for (int64_t j = 0; j < k; ++j)
    if (ix[j] >= 0) {
      sum += s[ix[j]];
      dot += g[j] * s[ix[j]];
    }
  const float Z = d.sigmoid ? sum + 1e-20f : sum;
  float* dl = dlogits + t * E;
  if (d.sigmoid) {
    for (int64_t e = 0; e < E; ++e) dl[e] += router_ds(e, ix, g, k, d, Z, dot) * s[e] * (1.f - s[e]);
  } else {
    float pd = 0.f;
    for (int64_t e = 0; e < E; ++e) pd += s[e] * router_ds(e, ix, g, k, d, Z, dot);
    for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (router_ds(e, ix, g, k, d, Z, dot) - pd);
  }
}

// ---- load balancing ---------------------------------------------------------

__global__ void aux_probs_kernel(const void* logits, FloatKind kl, int64_t T, int64_t E, bool sig, int64_t k,
                                 float* probs, int32_t* sel) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  float* p = probs + t * E;
  score_row(logits, kl, t, E, sig, p);
  if (sig) {
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += p[e];
    for (int64_t e = 0; e < E; ++e) p[e] /= sum + 1e-20f;
  }
  top_k(p, E, k, sel + t * k);
}

__global__ void aux_group_sums_kernel(const float* p, const int32_t* sel, const int32_t* cu, int64_t G, int64_t E,
                                      int64_t k, double* P, int64_t* c) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // (g, e) = (i / E, i % E)
  if (i >= G * E) return;
  const int64_t g = i / E, e = i % E;
  double acc = 0.0;
  int64_t n = 0;
  for (int64_t t = cu[g]; t < cu[g + 1]; ++t) {
    acc += double(p[t * E + e]);
    for (int64_t j = 0; j < k; ++j) n += sel[t * k + j] == int32_t(e);
  }
  if (P) P[i] = acc;
  c[i] = n;
}

__global__ void aux_bwd_kernel(const void* logits, FloatKind kl, const float* probs, const int32_t* group_of,
                               const int32_t* cu, const int64_t* c, int64_t T, int64_t E, int64_t G, int64_t k,
                               bool sig, double coeff, double scale, float* dlogits) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const int64_t g = group_of[t];
  const double Tg = double(cu[g + 1] - cu[g]);  // >= 1: t is one of the group's rows
  const double per_count = scale * coeff / double(G) * double(E) / (double(k) * Tg * Tg);
  const int64_t* cg = c + g * E;  // the group's counts [E]
  float* dl = dlogits + t * E;
  const int64_t base = t * E;
  if (!sig) {
    const float* p = probs + base;
    float pa = 0.f;
    for (int64_t e = 0; e < E; ++e) pa += p[e] * float(per_count * double(cg[e]));
    for (int64_t e = 0; e < E; ++e) dl[e] += p[e] * (float(per_count * double(cg[e])) - pa);
    return;
  }
  // p = q / S with q = sigmoid(l), S = sum q + 1e-20: back through the
  // normalisation, then the sigmoid (q recomputed per pass: no [E] scratch).
  float S = 0.f, qa = 0.f;
  for (int64_t e = 0; e < E; ++e) S += sigmoid(ld(logits, kl, base + e));
  S += 1e-20f;
  for (int64_t e = 0; e < E; ++e) qa += sigmoid(ld(logits, kl, base + e)) * float(per_count * double(cg[e]));
  for (int64_t e = 0; e < E; ++e) {
    const float q = sigmoid(ld(logits, kl, base + e)), da = float(per_count * double(cg[e]));
    const float dq = da / S - qa / (S * S);
    dl[e] += dq * q * (1.f - q);
  }
}

__global__ void row_lse_kernel(const void* logits, FloatKind kl, int64_t T, int64_t E, float* lse) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const int64_t base = t * E;
  float mx = ld(logits, kl, base), s = 0.f;
  for (int64_t e = 1; e < E; ++e) mx = std_max(mx, ld(logits, kl, base + e));
  for (int64_t e = 0; e < E; ++e) s += expf(ld(logits, kl, base + e) - mx);
  lse[t] = mx + logf(s);
}

__global__ void z_loss_bwd_kernel(const void* logits, FloatKind kl, const float* lse, int64_t T, int64_t E, float c,
                                  float* dlogits) {
  const int64_t n = T * E;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float l = lse[i / E];
    dlogits[i] += (c * l) * expf(ld(logits, kl, i) - l);
  }
}

// ---- capacity ---------------------------------------------------------------

__global__ void drop_rank_kernel(const int32_t* idx, const float* w, const int32_t* pairs, int64_t n_pairs,
                                 const int32_t* start, int64_t capacity, bool by_probs, int32_t* drop) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // a slot of the bucketed pairs
  if (b >= n_pairs) return;
  const int32_t x = pairs[b];
  const int32_t e = idx[x];
  const int64_t begin = start[e], end = start[e + 1];
  if (end - begin <= capacity) return;
  int64_t rank = b - begin;  // "position": the bucket is in token order
  if (by_probs) {
    rank = 0;
    const float wx = w[x];
    for (int64_t y = begin; y < end; ++y) rank += ranks_before(w[pairs[y]], pairs[y], wx, x);
  }
  if (rank >= capacity) drop[x] = 1;
}

__global__ void drop_apply_kernel(const int32_t* drop, int64_t n, int32_t* idx, float* w) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (drop[i]) {
      idx[i] = -1;
      w[i] = 0.f;
    }
}

// ---- permutation ------------------------------------------------------------

template <class Elem>
__global__ void permute_fwd_kernel(const Elem* x, const int32_t* source, int64_t N, int64_t D, Elem* xs) {
  const int64_t n = N * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = source[i / D];
    xs[i] = s >= 0 ? x[s * D + i % D] : Elem(0);  // the bits of 0.0 in f32 and bf16
  }
}

__global__ void permute_bwd_kernel(const void* dxs, FloatKind kg, const int32_t* dest, int64_t T, int64_t k,
                                   int64_t D, float* dx) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, c = i % D;
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = dest[t * k + j];
      if (r >= 0) acc += ld(dxs, kg, r * D + c);
    }
    dx[i] = acc;
  }
}

__global__ void unpermute_fwd_kernel(const void* ys, FloatKind ky, const float* w, const int32_t* dest, int64_t T,
                                     int64_t k, int64_t D, void* y, FloatKind ko) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, c = i % D;
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = dest[t * k + j];
      if (r >= 0) acc += w[t * k + j] * ld(ys, ky, r * D + c);
    }
    st(y, ko, i, acc);
  }
}

// dys [N, D]: row r belongs to the slot j of token source[r] with dest[t, j] == r (unique: checked by the caller).
__global__ void unpermute_dys_kernel(const float* w, const void* dy, FloatKind kg, const int32_t* dest,
                                     const int32_t* source, int64_t k, int64_t N, int64_t D, float* dys) {
  const int64_t n = N * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, c = i % D;
    const int64_t t = source[r];
    float v = 0.f;  // padding rows (and, in a routing the caller accepted, no other row) get no slot
    if (t >= 0)
      for (int64_t j = 0; j < k; ++j)
        if (dest[t * k + j] == int32_t(r)) {
          v = w[t * k + j] * ld(dy, kg, t * D + c);
          break;
        }
    dys[i] = v;
  }
}

// One block per slot (t, j): dtopk_w[t, j] = <dy[t], ys[dest[t, j]]>.
__global__ void unpermute_dw_kernel(const void* ys, FloatKind ky, const void* dy, FloatKind kg, const int32_t* dest,
                                    int64_t T, int64_t k, int64_t D, float* dw) {
  for (int64_t slot = blockIdx.x; slot < T * k; slot += gridDim.x) {  // uniform over the block
    const int64_t r = dest[slot], t = slot / k;
    if (r < 0) {
      if (threadIdx.x == 0) dw[slot] = 0.f;
      continue;
    }
    float dot = 0.f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) dot += ld(dy, kg, t * D + c) * ld(ys, ky, r * D + c);
    dot = block_sum(dot);
    if (threadIdx.x == 0) dw[slot] = dot;
  }
}

// ---- shared-expert gate -----------------------------------------------------

__global__ void gate_fwd_kernel(const void* g, FloatKind kg, const void* s, FloatKind ks, int64_t T, int64_t D,
                                void* y, FloatKind ky) {
  // HF: sigmoid(gate(x)) * shared in the activations' dtype, then the add: in
  // bf16 the sigmoid and the product are each rounded to bf16.
  const bool round_product = kg == FloatKind::BF16 && ks == FloatKind::BF16;
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float sg = round_to(sigmoid(ld(g, kg, i / D)), kg);
    float prod = sg * ld(s, ks, i);
    if (round_product) prod = round_to(prod, FloatKind::BF16);
    st(y, ky, i, ld(y, ky, i) + prod);
  }
}

// One block per token: ds[t] = sg * dy[t]; dg[t] = sg (1 - sg) <dy[t], s[t]> (sg unrounded, as the CPU).
__global__ void gate_bwd_kernel(const void* g, FloatKind kg, const void* s, FloatKind ks, const void* dy,
                                FloatKind kd, int64_t T, int64_t D, float* ds, float* dg) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {  // uniform over the block
    const float sg = sigmoid(ld(g, kg, t));
    float dot = 0.f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      const float gd = ld(dy, kd, t * D + c);
      ds[t * D + c] = sg * gd;
      dot += gd * ld(s, ks, t * D + c);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dg[t] = sg * (1.f - sg) * dot;
  }
}

}  // namespace

void moe_router_fwd(const void* logits, FloatKind kl, const float* bias, const MoeRouterDims& d, bool replay,
                    int32_t* topk_idx, float* topk_w, float* scores, float* choice, float* group_score, int32_t* best,
                    void* stream) {
  if (d.T > 0)
    KS_LAUNCH(router_fwd_kernel, row_blocks(d.T), kRowThreads, as_stream(stream))(
        logits, kl, bias, d, replay, topk_idx, topk_w, scores, choice, group_score, best);
}

void moe_router_bwd(const float* scores, const int32_t* topk_idx, const float* dtopk_w, const MoeRouterDims& d,
                    float* dlogits, void* stream) {
  if (d.T > 0)
    KS_LAUNCH(router_bwd_kernel, row_blocks(d.T), kRowThreads, as_stream(stream))(scores, topk_idx, dtopk_w, d, dlogits);
}

void moe_aux_probs(const void* logits, FloatKind kl, int64_t T, int64_t E, bool sigmoid, int64_t k, float* p,
                   int32_t* sel, void* stream) {
  if (T > 0)
    KS_LAUNCH(aux_probs_kernel, row_blocks(T), kRowThreads, as_stream(stream))(logits, kl, T, E, sigmoid, k, p, sel);
}

void moe_aux_group_sums(const float* p, const int32_t* sel, const int32_t* cu, int64_t G, int64_t E, int64_t k,
                        double* P, int64_t* c, void* stream) {
  if (G * E > 0)
    KS_LAUNCH(aux_group_sums_kernel, row_blocks(G * E), kRowThreads, as_stream(stream))(p, sel, cu, G, E, k, P, c);
}

void moe_aux_loss_bwd(const void* logits, FloatKind kl, const float* p, const int32_t* group_of, const int32_t* cu,
                      const int64_t* c, int64_t T, int64_t E, int64_t G, int64_t k, bool sigmoid, double coeff,
                      double scale, float* dlogits, void* stream) {
  if (T > 0)
    KS_LAUNCH(aux_bwd_kernel, row_blocks(T), kRowThreads, as_stream(stream))(logits, kl, p, group_of, cu, c, T, E, G, k,
                                                                         sigmoid, coeff, scale, dlogits);
}

void moe_row_lse(const void* logits, FloatKind kl, int64_t T, int64_t E, float* lse, void* stream) {
  if (T > 0) KS_LAUNCH(row_lse_kernel, row_blocks(T), kRowThreads, as_stream(stream))(logits, kl, T, E, lse);
}

void moe_z_loss_bwd(const void* logits, FloatKind kl, const float* lse, int64_t T, int64_t E, float c, float* dlogits,
                    void* stream) {
  if (T * E > 0)
    KS_LAUNCH(z_loss_bwd_kernel, grid_for(T * E), kThreads, as_stream(stream))(logits, kl, lse, T, E, c, dlogits);
}

void moe_drop_rank(const int32_t* topk_idx, const float* topk_w, const int32_t* pairs, int64_t n_pairs,
                   const int32_t* start, int64_t capacity, bool by_probs, int32_t* drop, void* stream) {
  if (n_pairs > 0)
    KS_LAUNCH(drop_rank_kernel, row_blocks(n_pairs), kRowThreads, as_stream(stream))(topk_idx, topk_w, pairs, n_pairs,
                                                                                 start, capacity, by_probs, drop);
}

void moe_drop_apply(const int32_t* drop, int64_t n, int32_t* topk_idx, float* topk_w, void* stream) {
  if (n > 0) KS_LAUNCH(drop_apply_kernel, grid_for(n), kThreads, as_stream(stream))(drop, n, topk_idx, topk_w);
}

void moe_permute_fwd(const void* x, const int32_t* source, int64_t N, int64_t D, int elem_bytes, void* xs,
                     void* stream) {
  if (N * D <= 0) return;
  if (elem_bytes == 4)
    KS_LAUNCH(permute_fwd_kernel, grid_for(N * D), kThreads, as_stream(stream))(
        static_cast<const uint32_t*>(x), source, N, D, static_cast<uint32_t*>(xs));
  else
    KS_LAUNCH(permute_fwd_kernel, grid_for(N * D), kThreads, as_stream(stream))(
        static_cast<const uint16_t*>(x), source, N, D, static_cast<uint16_t*>(xs));
}

void moe_permute_bwd(const void* dxs, FloatKind kg, const int32_t* dest, int64_t T, int64_t k, int64_t D, float* dx,
                     void* stream) {
  if (T * D > 0)
    KS_LAUNCH(permute_bwd_kernel, grid_for(T * D), kThreads, as_stream(stream))(dxs, kg, dest, T, k, D, dx);
}

void moe_unpermute_fwd(const void* ys, FloatKind ky, const float* topk_w, const int32_t* dest, int64_t T, int64_t k,
                       int64_t D, void* y, FloatKind ko, void* stream) {
  if (T * D > 0)
    KS_LAUNCH(unpermute_fwd_kernel, grid_for(T * D), kThreads, as_stream(stream))(ys, ky, topk_w, dest, T, k, D, y, ko);
}

void moe_unpermute_bwd(const void* ys, FloatKind ky, const float* topk_w, const void* dy, FloatKind kg,
                       const int32_t* dest, const int32_t* source, int64_t T, int64_t k, int64_t N, int64_t D,
                       float* dys, float* dtopk_w, void* stream) {
  auto s = as_stream(stream);
  if (N * D > 0)
    KS_LAUNCH(unpermute_dys_kernel, grid_for(N * D), kThreads, s)(topk_w, dy, kg, dest, source, k, N, D, dys);
  if (T * k > 0) KS_LAUNCH(unpermute_dw_kernel, out_blocks(T * k), kThreads, s)(ys, ky, dy, kg, dest, T, k, D, dtopk_w);
}

void sigmoid_gate_add_fwd(const void* g, FloatKind kg, const void* s, FloatKind ks, int64_t T, int64_t D, void* y,
                          FloatKind ky, void* stream) {
  if (T * D > 0) KS_LAUNCH(gate_fwd_kernel, grid_for(T * D), kThreads, as_stream(stream))(g, kg, s, ks, T, D, y, ky);
}

void sigmoid_gate_add_bwd(const void* g, FloatKind kg, const void* s, FloatKind ks, const void* dy, FloatKind kd,
                          int64_t T, int64_t D, float* ds, float* dg, void* stream) {
  if (T > 0) KS_LAUNCH(gate_bwd_kernel, out_blocks(T), kThreads, as_stream(stream))(g, kg, s, ks, dy, kd, T, D, ds, dg);
}

}  // namespace kestrel::cuda::launch
