// CUDA kernels of the paged KV cache (ops/paged_attention.h): the slot
// writes of new tokens' K/V, the attention of a packed batch of query chunks
// against the cache through each sequence's block table, and block copies
// within a cache. The attention is the training kernel's scheme (one warp per
// (query row, head), 32 keys per step, an online softmax), walking the block
// table instead of contiguous rows. Correctness first: a split-K decode
// kernel (many warps per long context) is the tuning step once measurable.
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
  KS_LAUNCH(paged_fwd_kernel, unsigned((T * H + kWarps - 1) / kWarps), kWarps * 32, as_stream(stream))(
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
