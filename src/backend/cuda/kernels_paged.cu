// CUDA kernels of the paged KV cache (ops/paged_attention.h): the slot
// writes of new tokens' K/V, the attention of a packed batch of query chunks
// against the cache through each sequence's block table, and block copies
// within a cache. The attention is the training kernel's scheme (one warp per
// (query row, head), 32 keys per step, an online softmax), walking the block
// table instead of contiguous rows; head dims up to 128 with up to 8 query
// heads per kv head take the grouped kernel (a block per row and kv head, the
// group's heads sharing each staged key tile). A split-K decode kernel (many
// blocks per long context) is the next tuning step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256, kWarps = 4, kMaxDim = 256, kSlots = kMaxDim / 32;


// Element e of row t: cache[slot[t], e] = src[t, e] (rows with slot < 0 skipped); elem bytes 2 or 4.
template <class E>
__global__ void kv_write_kernel(const E* k, const E* v, const int32_t* slots, int64_t T, int64_t width, E* kc, E* vc) {
  const int64_t total = T * width;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, c = e % width;
    const int64_t s = slots[t];
    if (s < 0) continue;
    kc[s * width + c] = k[e];
    vc[s * width + c] = v[e];
  }
}

struct PagedDims {
  int64_t T;
  int H, Hkv, hd, block_size, max_blocks;
  float scale;
};

__global__ void paged_fwd_kernel(const void* q, const void* kc, const void* vc, FloatKind kd, const int32_t* bt,
                                 const int32_t* cu, const int32_t* seq_lens, int B, PagedDims D, void* out) {
  __shared__ float qs_all[kWarps][kMaxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  if (w >= D.T * D.H) return;
  const int64_t i = w / D.H;
  const int h = int(w % D.H), g = h / (D.H / D.Hkv);
  int b = 0, hi = B;  // cu[b] <= i < cu[b+1]
  while (hi - b > 1) {
    const int mid = (b + hi) / 2;
    if (cu[mid] <= i) b = mid; else hi = mid;
  }
  const int64_t q_len = cu[b + 1] - cu[b];
  const int64_t pos = int64_t(seq_lens[b]) - q_len + (i - cu[b]);  // this row's absolute position
  float* qs = qs_all[warp];
  for (int d = lane; d < D.hd; d += 32) qs[d] = ld(q, kd, i * D.H * D.hd + int64_t(h) * D.hd + d);
  __syncwarp();
  const int32_t* table = bt + int64_t(b) * D.max_blocks;
  const int64_t row = int64_t(D.Hkv) * D.hd;  // a cache slot's width
  // Cache row of key j of this sequence, through the block table.
  auto slot_of = [&](int64_t j) { return int64_t(table[j / D.block_size]) * D.block_size + j % D.block_size; };
  OnlineSoftmax<kSlots> sm;
  const int64_t n_keys = pos + 1;
  for (int64_t c = 0; c < n_keys; c += 32) {
    const int64_t j = c + lane;
    float s = kNegInf;
    if (j < n_keys) {
      const int64_t kb = slot_of(j) * row + int64_t(g) * D.hd;
      float dot = 0.f;
      for (int d = 0; d < D.hd; ++d) dot += qs[d] * ld(kc, kd, kb + d);
      s = D.scale * dot;
    }
    const int nk = int(n_keys - c < 32 ? n_keys - c : 32);
    sm.step(s, j < n_keys, nk, vc, kd, D.hd, [&](int kk) { return slot_of(c + kk) * row + int64_t(g) * D.hd; });
  }
  sm.finish(out, kd, i * D.H * D.hd + int64_t(h) * D.hd, D.hd);
}

// The grouped kernel (head dim <= 128, at most 8 query heads per kv head): one
// block of 4 warps per (query row, kv head), the group's query heads spread
// over the warps (head g * rep + warp + 4 r), so each key and value row is read
// from the cache once per group instead of once per query head, 32 keys at a
// time, staged in shared memory with coalesced loads (the row-per-warp kernel
// read each key row per lane, one element at a time: 46 GB/s on an H200).
constexpr int kGroupRows = 2;   // query heads per warp: up to 8 per kv head
constexpr int kPad = 128 + 1;   // staged row stride: lane-per-key reads hit distinct banks

template <int kSl>
__global__ void paged_fwd_grouped_kernel(const void* q, const void* kc, const void* vc, FloatKind kd,
                                         const int32_t* bt, const int32_t* cu, const int32_t* seq_lens, int B,
                                         PagedDims D, void* out) {
  __shared__ float ks[32 * kPad];
  __shared__ float vs[32 * kPad];
  KS_SHARED_FLOATS16(probs, kWarps * 32 * kGroupRows);  // tile_softmax_step's broadcasts, per warp
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = blockIdx.x / D.Hkv;
  const int g = int(blockIdx.x % D.Hkv), rep = D.H / D.Hkv;
  const int b = seq_of(cu, B, i);
  const int64_t q_len = cu[b + 1] - cu[b];
  const int64_t n_keys = int64_t(seq_lens[b]) - q_len + (i - cu[b]) + 1;  // keys up to this row's position
  const int32_t* table = bt + int64_t(b) * D.max_blocks;
  const int64_t row = int64_t(D.Hkv) * D.hd;
  constexpr int R = kGroupRows;
  float qr[R][kSl], acc[R][kSl], m[R], l[R];
  int hh[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int within = warp + 4 * r;
    hh[r] = within < rep ? g * rep + within : -1;
    m[r] = kNegInf;
    l[r] = 0.f;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      qr[r][t] = hh[r] >= 0 && d < D.hd ? ld(q, kd, i * D.H * D.hd + int64_t(hh[r]) * D.hd + d) : 0.f;
      acc[r][t] = 0.f;
    }
  }
  for (int64_t c = 0; c < n_keys; c += 32) {
    const int nk = int(n_keys - c < 32 ? n_keys - c : 32);
    __syncthreads();  // the previous chunk is no longer read
    for (int e = threadIdx.x; e < 32 * D.hd; e += blockDim.x) {
      const int kk = e / D.hd, d = e % D.hd;
      float kv = 0.f, vv = 0.f;
      if (kk < nk) {
        const int64_t j = c + kk;
        const int64_t base = (int64_t(table[j / D.block_size]) * D.block_size + j % D.block_size) * row +
                             int64_t(g) * D.hd + d;
        kv = ld(kc, kd, base);
        vv = ld(vc, kd, base);
      }
      ks[kk * kPad + d] = kv;
      vs[kk * kPad + d] = vv;
    }
    __syncthreads();
    float s[R];
    tile_dots<R, kSl>(qr, ks, kPad, D.hd, s);
    float sc[R];
    bool vis[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      vis[r] = hh[r] >= 0 && lane < nk;  // a warp's unused head slot sees no key
      sc[r] = D.scale * s[r];
    }
    tile_softmax_step<R, kSl>(sc, vis, m, l, acc, vs, kPad, nk, probs + warp * 32 * R);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (hh[r] < 0) continue;
    const int64_t base = i * D.H * D.hd + int64_t(hh[r]) * D.hd;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      if (d < D.hd) st(out, kd, base + d, l[r] == 0.f ? 0.f : acc[r][t] / l[r]);
    }
  }
}

// dst block pairs[p].second = src block pairs[p].first, words of 4 bytes (block bytes are a multiple of 4).
__global__ void copy_blocks_kernel(const uint32_t* src, uint32_t* dst, const int32_t* pairs, int n_pairs,
                                   int64_t block_words) {
  const int64_t total = int64_t(n_pairs) * block_words;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = e / block_words, o = e % block_words;
    dst[int64_t(pairs[2 * p + 1]) * block_words + o] = src[int64_t(pairs[2 * p]) * block_words + o];
  }
}


}  // namespace

void paged_kv_write(const void* k, const void* v, const int32_t* slots, int64_t T, int64_t width, int elem_bytes,
                    void* k_cache, void* v_cache, void* stream) {
  if (T <= 0 || width <= 0) return;
  auto s = as_stream(stream);
  if (elem_bytes == 4)
    KS_LAUNCH(kv_write_kernel, grid_for(T * width), kThreads, s)(static_cast<const uint32_t*>(k),
                                                             static_cast<const uint32_t*>(v), slots, T, width,
                                                             static_cast<uint32_t*>(k_cache),
                                                             static_cast<uint32_t*>(v_cache));
  else
    KS_LAUNCH(kv_write_kernel, grid_for(T * width), kThreads, s)(static_cast<const uint16_t*>(k),
                                                             static_cast<const uint16_t*>(v), slots, T, width,
                                                             static_cast<uint16_t*>(k_cache),
                                                             static_cast<uint16_t*>(v_cache));
}

void paged_attention_fwd(const void* q, const void* k_cache, const void* v_cache, FloatKind kd,
                         const int32_t* block_tables, const int32_t* cu_q, const int32_t* seq_lens, int B, int64_t T,
                         int H, int Hkv, int hd, int block_size, int max_blocks, float scale, void* out,
                         void* stream) {
  if (T <= 0) return;
  const PagedDims D{T, H, Hkv, hd, block_size, max_blocks, scale};
  auto s = as_stream(stream);
  const int rep = H / Hkv;
  if (hd <= 64 && rep <= kWarps * kGroupRows)
    KS_LAUNCH(paged_fwd_grouped_kernel<2>, unsigned(T * Hkv), kWarps * 32, s)(q, k_cache, v_cache, kd, block_tables,
                                                                             cu_q, seq_lens, B, D, out);
  else if (hd <= 128 && rep <= kWarps * kGroupRows)
    KS_LAUNCH(paged_fwd_grouped_kernel<4>, unsigned(T * Hkv), kWarps * 32, s)(q, k_cache, v_cache, kd, block_tables,
                                                                             cu_q, seq_lens, B, D, out);
  else
    KS_LAUNCH(paged_fwd_kernel, unsigned((T * H + kWarps - 1) / kWarps), kWarps * 32, s)(
        q, k_cache, v_cache, kd, block_tables, cu_q, seq_lens, B, D, out);
}

void copy_kv_blocks(const void* src, void* dst, const int32_t* pairs, int n_pairs, int64_t block_bytes,
                    void* stream) {
  if (n_pairs <= 0) return;
  const int64_t words = block_bytes / 4;
  KS_LAUNCH(copy_blocks_kernel, grid_for(n_pairs * words), kThreads, as_stream(stream))(
      static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), pairs, n_pairs, words);
}

}  // namespace kestrel::cuda::launch
