// CUDA kernels of multi-head latent attention in the rollout (ops/mla.h).
// Correctness first, not tuned (no device to measure on when written): the
// absorbed projections are one thread per output element with an f32 dot
// product (a strided-batched cuBLAS GEMM is the tuned form), and the latent
// attention is the paged kernel's scheme (one warp per (query row, head),
// 32 keys per step, online softmax) with the latent width in place of
// head_dim: keys are whole cache rows [c_kv | k_pe], values their first
// kv_lora columns, one kv head shared by every query head.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels_mla.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256, kWarps = 4;
constexpr int kMaxLatent = 1024;          // kv_lora + rope limit (DeepSeek-V3: 512 + 64)
constexpr int kSlots = kMaxLatent / 32;   // per-lane output elements of o_lat


// One thread per q_lat element (t, h, c), c < kv_lora + rope.
__global__ void absorb_q_kernel(const void* q, FloatKind kq, const void* kv_b, FloatKind kw, MlaDims d, void* q_lat,
                                FloatKind ko) {
  const int lat = d.kv_lora + d.rope;
  const int64_t total = d.T * d.H * lat;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(e % lat), h = int((e / lat) % d.H);
    const int64_t t = e / (int64_t(lat) * d.H);
    const int64_t qb = t * d.H * (d.nope + d.rope) + int64_t(h) * (d.nope + d.rope);
    float r;
    if (c < d.kv_lora) {
      // W_UK_h: rows h*(nope+v) .. + nope of kv_b [*, kv_lora].
      const int64_t wb = int64_t(h) * (d.nope + d.v) * d.kv_lora + c;
      r = 0.f;
      for (int n = 0; n < d.nope; ++n) r += ld(q, kq, qb + n) * ld(kv_b, kw, wb + int64_t(n) * d.kv_lora);
    } else {
      r = ld(q, kq, qb + d.nope + (c - d.kv_lora));  // q_pe copied
    }
    st(q_lat, ko, e, r);
  }
}

// One thread per o element (t, h, j), j < v.
__global__ void absorb_out_kernel(const void* o_lat, FloatKind ki, const void* kv_b, FloatKind kw, MlaDims d, void* o,
                                  FloatKind ko) {
  const int64_t total = d.T * d.H * d.v;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(e % d.v), h = int((e / d.v) % d.H);
    const int64_t t = e / (int64_t(d.v) * d.H);
    const int64_t ib = t * d.H * d.kv_lora + int64_t(h) * d.kv_lora;
    // W_UV_h row j: row h*(nope+v) + nope + j of kv_b.
    const int64_t wb = (int64_t(h) * (d.nope + d.v) + d.nope + j) * d.kv_lora;
    float r = 0.f;
    for (int c = 0; c < d.kv_lora; ++c) r += ld(o_lat, ki, ib + c) * ld(kv_b, kw, wb + c);
    st(o, ko, e, r);
  }
}

__global__ void latent_write_kernel(const void* c_kv, const void* k_pe, FloatKind k, const int32_t* slots, int64_t T,
                                    int kv_lora, int rope, void* cache) {
  const int lat = kv_lora + rope;
  const int64_t total = T * lat;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / lat;
    const int c = int(e % lat);
    const int64_t s = slots[t];
    if (s < 0) continue;
    const float x = c < kv_lora ? ld(c_kv, k, t * kv_lora + c) : ld(k_pe, k, t * rope + (c - kv_lora));
    st(cache, k, s * lat + c, x);  // same kind: the value is copied exactly
  }
}

__global__ void latent_attention_kernel(const void* q_lat, const void* cache, FloatKind k, const int32_t* bt,
                                        const int32_t* cu, const int32_t* seq_lens, int B, MlaDims d, int block_size,
                                        int max_blocks, void* o_lat) {
  __shared__ float qs_all[kWarps][kMaxLatent];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= d.T * d.H) return;
  const int64_t i = w / d.H;
  const int h = int(w % d.H);
  const int lat = d.kv_lora + d.rope;
  int b = 0, hi = B;
  while (hi - b > 1) {
    const int mid = (b + hi) / 2;
    if (cu[mid] <= i) b = mid; else hi = mid;
  }
  const int64_t n_keys = int64_t(seq_lens[b]) - (cu[b + 1] - cu[b]) + (i - cu[b]) + 1;
  float* qs = qs_all[warp];
  for (int c = lane; c < lat; c += 32) qs[c] = ld(q_lat, k, i * d.H * lat + int64_t(h) * lat + c);
  __syncwarp();
  const int32_t* table = bt + int64_t(b) * max_blocks;
  // Cache row offset of key j of this sequence, through the block table.
  auto row_of = [&](int64_t j) { return (int64_t(table[j / block_size]) * block_size + j % block_size) * lat; };
  OnlineSoftmax<kSlots> sm;
  for (int64_t c0 = 0; c0 < n_keys; c0 += 32) {
    const int64_t j = c0 + lane;
    float s = kNegInf;
    if (j < n_keys) {
      const int64_t row = row_of(j);
      float dot = 0.f;
      for (int c = 0; c < lat; ++c) dot += qs[c] * ld(cache, k, row + c);
      s = d.scale * dot;
    }
    const int nk = int(n_keys - c0 < 32 ? n_keys - c0 : 32);
    // Values: the first kv_lora columns of the same cache rows.
    sm.step(s, j < n_keys, nk, cache, k, d.kv_lora, [&](int kk) { return row_of(c0 + kk); });
  }
  sm.finish(o_lat, k, i * d.H * d.kv_lora + int64_t(h) * d.kv_lora, d.kv_lora);
}

}  // namespace

void mla_absorb_q(const void* q, FloatKind kq, const void* kv_b, FloatKind kw, const MlaDims& d, void* q_lat,
                  FloatKind ko, void* stream) {
  const int64_t n = d.T * d.H * (d.kv_lora + d.rope);
  if (n > 0) KS_LAUNCH(absorb_q_kernel, grid_for(n), kThreads, as_stream(stream))(q, kq, kv_b, kw, d, q_lat, ko);
}

void mla_absorb_out(const void* o_lat, FloatKind ki, const void* kv_b, FloatKind kw, const MlaDims& d, void* o,
                    FloatKind ko, void* stream) {
  const int64_t n = d.T * d.H * d.v;
  if (n > 0) KS_LAUNCH(absorb_out_kernel, grid_for(n), kThreads, as_stream(stream))(o_lat, ki, kv_b, kw, d, o, ko);
}

void paged_latent_write(const void* c_kv, const void* k_pe, FloatKind k, const int32_t* slots, int64_t T, int kv_lora,
                        int rope, void* cache, void* stream) {
  const int64_t n = T * (kv_lora + rope);
  if (n > 0)
    KS_LAUNCH(latent_write_kernel, grid_for(n), kThreads, as_stream(stream))(c_kv, k_pe, k, slots, T, kv_lora, rope,
                                                                         cache);
}

int mla_max_latent_dim() { return kMaxLatent; }

void paged_latent_attention_fwd(const void* q_lat, const void* cache, FloatKind k, const int32_t* block_tables,
                                const int32_t* cu_q, const int32_t* seq_lens, int B, const MlaDims& d, int block_size,
                                int max_blocks, void* o_lat, void* stream) {
  if (d.T <= 0) return;
  KS_LAUNCH(latent_attention_kernel, unsigned((d.T * d.H + kWarps - 1) / kWarps), kWarps * 32, as_stream(stream))(
      q_lat, cache, k, block_tables, cu_q, seq_lens, B, d, block_size, max_blocks, o_lat);
}

}  // namespace kestrel::cuda::launch
