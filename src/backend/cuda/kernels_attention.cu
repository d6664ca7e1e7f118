// CUDA kernels of causal GQA attention over packed variable-length sequences
// with shared prefixes (ops/attention.h): forward with an online softmax
// (no [T, T] scores; memory O(T)), backward recomputing the probabilities
// from q, k and lse with D_i = rowsum(dout_i * out_i) (FlashAttention-2).
//
// First version, written for correctness and determinism, not yet for speed
// (it was written without a device to measure on): one warp per (row, head).
// Scores are taken 32 keys at a time, one key per lane; the output (or the
// gradient) row is spread over the lanes, dims lane, lane + 32, ... The
// backward runs two kernels: dq per (query row, head), and dk/dv per (key
// row, kv head), each summing over its partners in a fixed order (the heads
// of the group, then the keys' own queries, then each continuation's), so
// every result is deterministic. A tiled tensor-core kernel is the next step
// once it can be measured.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kWarps = 4;              // warps per block
constexpr int kMaxDim = 256;           // head_dim and value dim limit of this kernel
constexpr int kSlots = kMaxDim / 32;   // per-lane output elements


struct Dims {
  int64_t T;
  int H, Hkv, hd, vd;
  float scale;
};

// out/lse of query row i, head h; qs: this warp's shared copy of the q row.
__global__ void fwd_kernel(const void* q, const void* k, const void* v, FloatKind kd, const int32_t* cu, int n,
                           const int32_t* prefix_of, Dims D, void* out, float* lse) {
  __shared__ float qs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= D.T * D.H) return;
  const int64_t i = w / D.H;
  const int h = int(w % D.H), g = h / (D.H / D.Hkv);
  float* qs = qs_all[warp];
  for (int d = lane; d < D.hd; d += 32) qs[d] = ld(q, kd, i * D.H * D.hd + int64_t(h) * D.hd + d);
  __syncwarp();
  const int b = seq_of(cu, n, i);
  const int p = prefix_of ? prefix_of[b] : -1;
  OnlineSoftmax<kSlots> sm;
  // Keys [k0, k1): the prefix's, then this sequence's up to i.
  auto segment = [&](int64_t k0, int64_t k1) {
    for (int64_t c = k0; c < k1; c += 32) {
      const int64_t j = c + lane;
      float s = kNegInf;
      if (j < k1) {
        const int64_t kb = j * D.Hkv * D.hd + int64_t(g) * D.hd;
        float dot = 0.f;
        for (int d = 0; d < D.hd; ++d) dot += qs[d] * ld(k, kd, kb + d);
        s = D.scale * dot;
      }
      const int nk = int(k1 - c < 32 ? k1 - c : 32);
      sm.step(s, j < k1, nk, v, kd, D.vd, [&](int kk) { return (c + kk) * D.Hkv * D.vd + int64_t(g) * D.vd; });
    }
  };
  if (p >= 0) segment(cu[p], cu[p + 1]);
  segment(cu[b], i + 1);
  const float row_lse = sm.finish(out, kd, i * D.H * D.vd + int64_t(h) * D.vd, D.vd);
  if (lane == 0) lse[int64_t(h) * D.T + i] = row_lse;
}

// Dsum[h, i] = sum_d dout[i, h, d] * out[i, h, d]. The gradients (dout, dq, dk, dv) have their own
// kind gk: bf16 training keeps activation gradients in f32 while q, k, v and out are bf16.
__global__ void dsum_kernel(const void* out, FloatKind kd, const void* dout, FloatKind gk, Dims D, float* Dsum) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= D.T * D.H) return;
  const int64_t i = w / D.H;
  const int h = int(w % D.H);
  const int64_t ob = i * D.H * D.vd + int64_t(h) * D.vd;
  float s = 0.f;
  for (int d = lane; d < D.vd; d += 32) s += ld(dout, gk, ob + d) * ld(out, kd, ob + d);
  s = warp_sum(s);
  if (lane == 0) Dsum[int64_t(h) * D.T + i] = s;
}

// dq of query row i, head h: sum over its visible keys j of scale * ds_ij * k_j.
__global__ void dq_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout, FloatKind gk,
                          const float* lse, const float* Dsum, const int32_t* cu, int n, const int32_t* prefix_of,
                          Dims D, void* dq) {
  __shared__ float qs_all[kWarps][kMaxDim];
  __shared__ float gs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= D.T * D.H) return;
  const int64_t i = w / D.H;
  const int h = int(w % D.H), g = h / (D.H / D.Hkv);
  float* qs = qs_all[warp];
  float* gs = gs_all[warp];
  for (int d = lane; d < D.hd; d += 32) qs[d] = ld(q, kd, i * D.H * D.hd + int64_t(h) * D.hd + d);
  for (int d = lane; d < D.vd; d += 32) gs[d] = ld(dout, gk, i * D.H * D.vd + int64_t(h) * D.vd + d);
  __syncwarp();
  const float L = lse[int64_t(h) * D.T + i], Di = Dsum[int64_t(h) * D.T + i];
  const int b = seq_of(cu, n, i);
  const int p = prefix_of ? prefix_of[b] : -1;
  float acc[kSlots];
#pragma unroll
  for (int t = 0; t < kSlots; ++t) acc[t] = 0.f;
  auto segment = [&](int64_t k0, int64_t k1) {
    for (int64_t c = k0; c < k1; c += 32) {
      const int64_t j = c + lane;
      float ds = 0.f;
      if (j < k1) {
        const int64_t kb = j * D.Hkv * D.hd + int64_t(g) * D.hd, vb = j * D.Hkv * D.vd + int64_t(g) * D.vd;
        float dot = 0.f, dp = 0.f;
        for (int d = 0; d < D.hd; ++d) dot += qs[d] * ld(k, kd, kb + d);
        for (int d = 0; d < D.vd; ++d) dp += gs[d] * ld(v, kd, vb + d);
        const float pr = expf(D.scale * dot - L);
        ds = pr * (dp - Di);
      }
      const int nk = int(k1 - c < 32 ? k1 - c : 32);
      for (int kk = 0; kk < nk; ++kk) {
        const float dk = __shfl_sync(0xffffffffu, ds, kk);
        const int64_t kb = (c + kk) * D.Hkv * D.hd + int64_t(g) * D.hd;
#pragma unroll
        for (int t = 0; t < kSlots; ++t) {
          const int d = lane + 32 * t;
          if (d < D.hd) acc[t] += dk * ld(k, kd, kb + d);
        }
      }
    }
  };
  if (p >= 0) segment(cu[p], cu[p + 1]);
  segment(cu[b], i + 1);
  const int64_t qb = i * D.H * D.hd + int64_t(h) * D.hd;
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {
    const int d = lane + 32 * t;
    if (d < D.hd) st(dq, gk, qb + d, D.scale * acc[t]);
  }
}

// dk, dv of key row j, kv head g: sums over the heads of the group, then over the
// queries that see j (its own sequence's from j on, then every continuation's).
__global__ void dkdv_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout, FloatKind gk,
                            const float* lse, const float* Dsum, const int32_t* cu, int n, const int32_t* prefix_of,
                            Dims D, void* dk, void* dv) {
  __shared__ float ks_all[kWarps][kMaxDim];
  __shared__ float vs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= D.T * D.Hkv) return;
  const int64_t j = w / D.Hkv;
  const int g = int(w % D.Hkv), rep = D.H / D.Hkv;
  float* ks = ks_all[warp];
  float* vs = vs_all[warp];
  for (int d = lane; d < D.hd; d += 32) ks[d] = ld(k, kd, j * D.Hkv * D.hd + int64_t(g) * D.hd + d);
  for (int d = lane; d < D.vd; d += 32) vs[d] = ld(v, kd, j * D.Hkv * D.vd + int64_t(g) * D.vd + d);
  __syncwarp();
  const int b = seq_of(cu, n, j);
  float ak[kSlots], av[kSlots];
#pragma unroll
  for (int t = 0; t < kSlots; ++t) ak[t] = av[t] = 0.f;
  auto segment = [&](int h, int64_t q0, int64_t q1) {
    for (int64_t c = q0; c < q1; c += 32) {
      const int64_t i = c + lane;
      float pr = 0.f, ds = 0.f;
      if (i < q1) {
        const int64_t qb = i * D.H * D.hd + int64_t(h) * D.hd, ob = i * D.H * D.vd + int64_t(h) * D.vd;
        float dot = 0.f, dp = 0.f;
        for (int d = 0; d < D.hd; ++d) dot += ks[d] * ld(q, kd, qb + d);
        for (int d = 0; d < D.vd; ++d) dp += vs[d] * ld(dout, gk, ob + d);
        pr = expf(D.scale * dot - lse[int64_t(h) * D.T + i]);
        ds = pr * (dp - Dsum[int64_t(h) * D.T + i]);
      }
      const int nq = int(q1 - c < 32 ? q1 - c : 32);
      for (int qq = 0; qq < nq; ++qq) {
        const float pq = __shfl_sync(0xffffffffu, pr, qq), dq = __shfl_sync(0xffffffffu, ds, qq);
        const int64_t qb = (c + qq) * D.H * D.hd + int64_t(h) * D.hd, ob = (c + qq) * D.H * D.vd + int64_t(h) * D.vd;
#pragma unroll
        for (int t = 0; t < kSlots; ++t) {
          const int d = lane + 32 * t;
          if (d < D.vd) av[t] += pq * ld(dout, gk, ob + d);
          if (d < D.hd) ak[t] += dq * ld(q, kd, qb + d);
        }
      }
    }
  };
  for (int h = g * rep; h < (g + 1) * rep; ++h) {
    segment(h, j, cu[b + 1]);
    if (prefix_of)
      for (int c = b + 1; c < n; ++c)
        if (prefix_of[c] == b) segment(h, cu[c], cu[c + 1]);
  }
  const int64_t kb = j * D.Hkv * D.hd + int64_t(g) * D.hd, vb = j * D.Hkv * D.vd + int64_t(g) * D.vd;
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {
    const int d = lane + 32 * t;
    if (d < D.hd) st(dk, gk, kb + d, D.scale * ak[t]);
    if (d < D.vd) st(dv, gk, vb + d, av[t]);
  }
}

unsigned blocks_for(int64_t warps) { return unsigned((warps + kWarps - 1) / kWarps); }

}  // namespace

int attention_max_head_dim() { return kMaxDim; }

void attention_fwd(const void* q, const void* k, const void* v, FloatKind kd, const int32_t* cu, int n,
                   const int32_t* prefix_of, int64_t T, int H, int Hkv, int hd, int vd, float scale, void* out,
                   float* lse, void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  KS_LAUNCH(fwd_kernel, blocks_for(T * H), kWarps * 32, as_stream(stream))(q, k, v, kd, cu, n, prefix_of, D, out, lse);
}

void attention_bwd(const void* q, const void* k, const void* v, const void* out, FloatKind kd, const float* lse,
                   const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, int64_t T, int H,
                   int Hkv, int hd, int vd, float scale, float* dsum_scratch, void* dq, void* dk, void* dv,
                   void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  auto s = as_stream(stream);
  KS_LAUNCH(dsum_kernel, blocks_for(T * H), kWarps * 32, s)(out, kd, dout, gk, D, dsum_scratch);
  KS_LAUNCH(dq_kernel, blocks_for(T * H), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu, n, prefix_of, D,
                                                        dq);
  KS_LAUNCH(dkdv_kernel, blocks_for(T * Hkv), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu, n,
                                                          prefix_of, D, dk, dv);
}

}  // namespace kestrel::cuda::launch
