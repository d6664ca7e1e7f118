// CUDA kernels of block attention, the steps of ring context parallelism
// (ops/attention.h attention_block_*): attention of query rows over one key
// block by position (key j visible to query i of the same sequence iff
// k_pos[j] <= q_pos[i]), the log-sum-exp merge of two partial results (the
// CPU's formula, operation for operation), and one block's backward from the
// final out and lse. Same scheme as kernels_attention.cu (a warp per (row,
// head) or (key row, kv head), 32 partners per step, fixed summation order:
// deterministic). Correctness first, not tuned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels_block.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256, kWarps = 4, kMaxDim = 256, kSlots = kMaxDim / 32;


__global__ void block_fwd_kernel(const void* q, const void* k, const void* v, FloatKind kd, BlockArgs a, void* out,
                                 FloatKind ko, float* lse) {
  __shared__ float qs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= a.Tq * a.H) return;
  const int64_t i = w / a.H;
  const int h = int(w % a.H), g = h / (a.H / a.Hkv);
  float* qs = qs_all[warp];
  for (int d = lane; d < a.hd; d += 32) qs[d] = ld(q, kd, i * a.H * a.hd + int64_t(h) * a.hd + d);
  __syncwarp();
  const int b = seq_of(a.cu_q, a.n_seqs, i);
  const int32_t qp = a.q_pos[i];
  const int64_t k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
  OnlineSoftmax<kSlots> sm;
  for (int64_t c = k0; c < k1; c += 32) {
    const int64_t j = c + lane;
    const bool vis = j < k1 && a.k_pos[j] <= qp;
    float s = kNegInf;
    if (vis) {
      const int64_t kb = j * a.Hkv * a.hd + int64_t(g) * a.hd;
      float dot = 0.f;
      for (int d = 0; d < a.hd; ++d) dot += qs[d] * ld(k, kd, kb + d);
      s = a.scale * dot;
    }
    const int nk = int(k1 - c < 32 ? k1 - c : 32);
    sm.step(s, vis, nk, v, kd, a.vd, [&](int kk) { return (c + kk) * a.Hkv * a.vd + int64_t(g) * a.vd; });
  }
  // 0 / -inf for a row that sees no key of this block.
  const float row_lse = sm.finish(out, ko, i * a.H * a.vd + int64_t(h) * a.vd, a.vd);
  if (lane == 0) lse[int64_t(h) * a.Tq + i] = row_lse;
}

// One thread per (row, head): the CPU's merge_rows formula.
__global__ void merge_kernel(void* out, FloatKind ko, float* lse, const void* out_b, FloatKind kb, const float* lse_b,
                             int H, int64_t Tq, int vd) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= Tq * H) return;
  const int64_t i = e / H;
  const int h = int(e % H);
  const float a = lse[int64_t(h) * Tq + i], b = lse_b[int64_t(h) * Tq + i];
  const int64_t base = (i * H + h) * vd;
  if (b == kNegInf) return;
  if (a == kNegInf) {
    for (int c = 0; c < vd; ++c) st(out, ko, base + c, ld(out_b, kb, base + c));
    lse[int64_t(h) * Tq + i] = b;
    return;
  }
  const bool a_max = a >= b;
  const float w = expf(a_max ? b - a : a - b), inv = 1.f / (1.f + w);
  const float wa = (a_max ? 1.f : w) * inv, wb = (a_max ? w : 1.f) * inv;
  for (int c = 0; c < vd; ++c) st(out, ko, base + c, wa * ld(out, ko, base + c) + wb * ld(out_b, kb, base + c));
  lse[int64_t(h) * Tq + i] = (a_max ? a : b) + log1pf(w);
}

__global__ void dsum_kernel(const void* out, const void* dout, FloatKind ko, BlockArgs a, float* Dsum) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= a.Tq * a.H) return;
  const int64_t i = w / a.H;
  const int h = int(w % a.H);
  const int64_t ob = i * a.H * a.vd + int64_t(h) * a.vd;
  float s = 0.f;
  for (int d = lane; d < a.vd; d += 32) s += ld(dout, ko, ob + d) * ld(out, ko, ob + d);
  s = warp_sum(s);
  if (lane == 0) Dsum[int64_t(h) * a.Tq + i] = s;
}

// dq[i, h] += scale * sum over the block's visible keys of ds_ij k_j.
__global__ void block_dq_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout,
                                FloatKind ko, const float* lse, const float* Dsum, BlockArgs a, float* dq) {
  __shared__ float qs_all[kWarps][kMaxDim];
  __shared__ float gs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= a.Tq * a.H) return;
  const int64_t i = w / a.H;
  const int h = int(w % a.H), g = h / (a.H / a.Hkv);
  float* qs = qs_all[warp];
  float* gs = gs_all[warp];
  for (int d = lane; d < a.hd; d += 32) qs[d] = ld(q, kd, i * a.H * a.hd + int64_t(h) * a.hd + d);
  for (int d = lane; d < a.vd; d += 32) gs[d] = ld(dout, ko, i * a.H * a.vd + int64_t(h) * a.vd + d);
  __syncwarp();
  const float L = lse[int64_t(h) * a.Tq + i], Di = Dsum[int64_t(h) * a.Tq + i];
  const int b = seq_of(a.cu_q, a.n_seqs, i);
  const int32_t qp = a.q_pos[i];
  const int64_t k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
  float acc[kSlots];
#pragma unroll
  for (int t = 0; t < kSlots; ++t) acc[t] = 0.f;
  for (int64_t c = k0; c < k1; c += 32) {
    const int64_t j = c + lane;
    float ds = 0.f;
    if (j < k1 && a.k_pos[j] <= qp) {
      const int64_t kb = j * a.Hkv * a.hd + int64_t(g) * a.hd, vb = j * a.Hkv * a.vd + int64_t(g) * a.vd;
      float dot = 0.f, dp = 0.f;
      for (int d = 0; d < a.hd; ++d) dot += qs[d] * ld(k, kd, kb + d);
      for (int d = 0; d < a.vd; ++d) dp += gs[d] * ld(v, kd, vb + d);
      ds = expf(a.scale * dot - L) * (dp - Di);
    }
    const int nk = int(k1 - c < 32 ? k1 - c : 32);
    for (int kk = 0; kk < nk; ++kk) {
      const float dsk = __shfl_sync(0xffffffffu, ds, kk);
      if (dsk == 0.f) continue;
      const int64_t kb = (c + kk) * a.Hkv * a.hd + int64_t(g) * a.hd;
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int d = lane + 32 * t;
        if (d < a.hd) acc[t] += dsk * ld(k, kd, kb + d);
      }
    }
  }
  const int64_t qb = i * a.H * a.hd + int64_t(h) * a.hd;
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {
    const int d = lane + 32 * t;
    if (d < a.hd) dq[qb + d] += a.scale * acc[t];
  }
}

// dk[j, g], dv[j, g] = sums over the group's heads and the sequence's queries that see j.
__global__ void block_dkdv_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout,
                                  FloatKind ko, const float* lse, const float* Dsum, BlockArgs a, float* dk,
                                  float* dv) {
  __shared__ float ks_all[kWarps][kMaxDim];
  __shared__ float vs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= a.Tk * a.Hkv) return;
  const int64_t j = w / a.Hkv;
  const int g = int(w % a.Hkv), rep = a.H / a.Hkv;
  float* ks = ks_all[warp];
  float* vs = vs_all[warp];
  for (int d = lane; d < a.hd; d += 32) ks[d] = ld(k, kd, j * a.Hkv * a.hd + int64_t(g) * a.hd + d);
  for (int d = lane; d < a.vd; d += 32) vs[d] = ld(v, kd, j * a.Hkv * a.vd + int64_t(g) * a.vd + d);
  __syncwarp();
  const int b = seq_of(a.cu_k, a.n_seqs, j);
  const int32_t kp = a.k_pos[j];
  const int64_t q0 = a.cu_q[b], q1 = a.cu_q[b + 1];
  float ak[kSlots], av[kSlots];
#pragma unroll
  for (int t = 0; t < kSlots; ++t) ak[t] = av[t] = 0.f;
  for (int h = g * rep; h < (g + 1) * rep; ++h) {
    for (int64_t c = q0; c < q1; c += 32) {
      const int64_t i = c + lane;
      float pr = 0.f, ds = 0.f;
      if (i < q1 && kp <= a.q_pos[i]) {
        const int64_t qb = i * a.H * a.hd + int64_t(h) * a.hd, ob = i * a.H * a.vd + int64_t(h) * a.vd;
        float dot = 0.f, dp = 0.f;
        for (int d = 0; d < a.hd; ++d) dot += ks[d] * ld(q, kd, qb + d);
        for (int d = 0; d < a.vd; ++d) dp += vs[d] * ld(dout, ko, ob + d);
        pr = expf(a.scale * dot - lse[int64_t(h) * a.Tq + i]);
        ds = pr * (dp - Dsum[int64_t(h) * a.Tq + i]);
      }
      const int nq = int(q1 - c < 32 ? q1 - c : 32);
      for (int qq = 0; qq < nq; ++qq) {
        const float pq = __shfl_sync(0xffffffffu, pr, qq), dq = __shfl_sync(0xffffffffu, ds, qq);
        if (pq == 0.f && dq == 0.f) continue;
        const int64_t qb = (c + qq) * a.H * a.hd + int64_t(h) * a.hd, ob = (c + qq) * a.H * a.vd + int64_t(h) * a.vd;
#pragma unroll
        for (int t = 0; t < kSlots; ++t) {
          const int d = lane + 32 * t;
          if (d < a.vd) av[t] += pq * ld(dout, ko, ob + d);
          if (d < a.hd) ak[t] += dq * ld(q, kd, qb + d);
        }
      }
    }
  }
  const int64_t kb = j * a.Hkv * a.hd + int64_t(g) * a.hd, vb = j * a.Hkv * a.vd + int64_t(g) * a.vd;
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {
    const int d = lane + 32 * t;
    if (d < a.hd) dk[kb + d] = a.scale * ak[t];
    if (d < a.vd) dv[vb + d] = av[t];
  }
}

unsigned warps_grid(int64_t warps) { return unsigned((warps + kWarps - 1) / kWarps); }

}  // namespace

void attention_block_fwd(const void* q, const void* k, const void* v, FloatKind kd, const BlockArgs& a, void* out,
                         FloatKind ko, float* lse, void* stream) {
  if (a.Tq <= 0) return;
  KS_LAUNCH(block_fwd_kernel, warps_grid(a.Tq * a.H), kWarps * 32, as_stream(stream))(q, k, v, kd, a, out, ko, lse);
}

void attention_merge(void* out, FloatKind ko, float* lse, const void* out_b, FloatKind kb, const float* lse_b, int H,
                     int64_t Tq, int vd, void* stream) {
  const int64_t n = Tq * H;
  if (n > 0)
    KS_LAUNCH(merge_kernel, unsigned((n + kThreads - 1) / kThreads), kThreads, as_stream(stream))(out, ko, lse, out_b, kb,
                                                                                              lse_b, H, Tq, vd);
}

void attention_block_bwd(const void* q, const void* k, const void* v, FloatKind kd, const void* out, const void* dout,
                         FloatKind ko, const float* lse, const BlockArgs& a, float* dsum_scratch, float* dq, float* dk,
                         float* dv, void* stream) {
  auto s = as_stream(stream);
  if (a.Tq > 0) {
    KS_LAUNCH(dsum_kernel, warps_grid(a.Tq * a.H), kWarps * 32, s)(out, dout, ko, a, dsum_scratch);
    KS_LAUNCH(block_dq_kernel, warps_grid(a.Tq * a.H), kWarps * 32, s)(q, k, v, kd, dout, ko, lse, dsum_scratch, a, dq);
  }
  if (a.Tk > 0)
    KS_LAUNCH(block_dkdv_kernel, warps_grid(a.Tk * a.Hkv), kWarps * 32, s)(q, k, v, kd, dout, ko, lse, dsum_scratch, a, dk,
                                                                       dv);
}

}  // namespace kestrel::cuda::launch
