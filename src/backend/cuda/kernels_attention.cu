// CUDA kernels of causal GQA attention over packed variable-length sequences
// with shared prefixes (ops/attention.h): forward with an online softmax
// (no [T, T] scores; memory O(T)), backward recomputing the probabilities
// from q, k and lse with D_i = rowsum(dout_i * out_i) (FlashAttention-2).
//
// Two kernel families. Head and value dims up to 128 (every dense model we
// load) take the tiled kernels below the row-per-warp ones: 32 rows per block,
// keys staged in shared memory 32 at a time (measured on an H200: the
// row-per-warp forward ran at 0.85 TFLOP/s on Qwen2.5-0.5B shapes, re-reading
// each key row from global memory for every query row). Wider heads (MLA's
// 192-wide q.k) take the row-per-warp kernels: one warp per (row, head).
// Scores are taken 32 keys at a time, one key per lane; the output (or the
// gradient) row is spread over the lanes, dims lane, lane + 32, ... The
// backward runs two kernels: dq per (query row, head), and dk/dv per (key
// row, kv head), each summing over its partners in a fixed order (the heads
// of the group, then the keys' own queries, then each continuation's), so
// every result is deterministic (the tiled kernels keep that order). With bf16
// q, k, v and head and value dims that are multiples of 16 (up to 128) the
// forward and the backward's dq run on the tensor cores instead
// (kernels_attention_mma.cu); dk/dv on the tensor cores is the next step.
#include <cstdlib>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/attention_common.cuh"

constexpr int kWarps = 4;              // warps per block
constexpr int kMaxDim = 256;           // head_dim and value dim limit of this kernel
constexpr int kSlots = kMaxDim / 32;   // per-lane output elements



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

// ---- Tiled kernels (head_dim and value dim <= 128) ----------------------------
// A block takes 32 consecutive packed rows (4 warps x 8 rows) of one head and
// walks the key ranges those rows see in tiles of 32 keys, each tile staged
// once in shared memory for the whole block (the row-per-warp kernels above
// re-read every key row from global memory for every query row). A lane owns
// one key of the tile for the scores and the output dims lane + 32 t for the
// accumulation; the query (and output-gradient) rows live in registers, spread
// over the lanes the same way, and reach the other lanes by shuffles. Rows of
// one block may belong to several sequences: the key ranges are those of each
// sequence the block touches (its prefix, then its own keys up to the block's
// last row), each masked to the rows of that sequence, so every (row, key)
// pair is visited once, in the order prefix then own keys, as above.
constexpr int kTileRows = 32;              // rows (queries, or keys for dk/dv) per block
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kTileKeys = 32;              // keys (or queries) per shared-memory tile
constexpr int kTiledMaxDim = 128;
// Row stride of a staged tile of dims up to 32 kSl: lane-per-row reads hit distinct banks.
template <int kSl>
constexpr int kPadOf = 32 * kSl + 1;
// The rows' operands of tile_dots_s (publish_cols), per warp, where they fit
// the 48 KB of static shared memory beside the tiles: dims up to 64.
template <int kSl>
constexpr bool kRowsInShared = kSl <= 2;
template <int kSl>
constexpr int kColsFloats = kRowsInShared<kSl> ? kWarps * 32 * kSl * kRowsPerWarp : 4;

// rows [r0, r0 + rows) of x (row stride `stride` elements, column offset col, width w) -> dst[r][d], as f32; zero past `rows`.
__device__ void stage_rows(float* dst, int pad, const void* x, FloatKind k, int64_t r0, int rows, int64_t stride,
                           int64_t col, int w) {
  for (int e = threadIdx.x; e < kTileKeys * w; e += blockDim.x) {
    const int r = e / w, d = e % w;
    dst[r * pad + d] = r < rows ? ld(x, k, (r0 + r) * stride + col + d) : 0.f;
  }
}

// The tile a tiled block takes: block b -> head (or kv head) b / tiles and
// packed rows [first, last] of tile b % tiles, 32 rows each (the last tile shorter).
struct BlockTile {
  int head;
  int64_t first, last;
};
__device__ BlockTile block_tile(int64_t T) {
  const int64_t tiles = (T + kTileRows - 1) / kTileRows;
  BlockTile b;
  b.head = int(blockIdx.x / tiles);
  b.first = int64_t(blockIdx.x % tiles) * kTileRows;
  b.last = (b.first + kTileRows < T ? b.first + kTileRows : T) - 1;
  return b;
}

// tile_dots over this warp's rows: from shared memory (xs, publish_cols) where
// they fit, else from the registers x by shuffles; the same sums either way.
template <int R, int kSl>
__device__ void row_dots(const float (&x)[R][kSl], const float* xs, const float* tile, int pad, int width,
                         float (&out)[R]) {
  if constexpr (kRowsInShared<kSl>) tile_dots_s<R>(xs, tile, pad, width, out);
  else tile_dots<R, kSl>(x, tile, pad, width, out);
}


template <int kSl>
__global__ void fwd_tiled_kernel(const void* q, const void* k, const void* v, FloatKind kd, const int32_t* cu, int n,
                                 const int32_t* prefix_of, Dims D, void* out, float* lse) {
  constexpr int kPad = kPadOf<kSl>;
  __shared__ float ks[kTileKeys * kPad];
  __shared__ float vs[kTileKeys * kPad];
  KS_SHARED_FLOATS16(qcols, kColsFloats<kSl>);               // publish_cols of each warp's q rows
  KS_SHARED_FLOATS16(probs, kWarps * kTileKeys * kRowsPerWarp);  // tile_softmax_step's broadcasts
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const BlockTile bt = block_tile(D.T);
  const int h = bt.head, g = h / (D.H / D.Hkv);
  const int64_t i0 = bt.first, i1 = bt.last;
  constexpr int R = kRowsPerWarp;
  float* qx = qcols + (kRowsInShared<kSl> ? warp * 32 * kSl * R : 0);
  float* pb = probs + warp * kTileKeys * R;
  float qr[R][kSl], acc[R][kSl], m[R], l[R];
  int64_t row[R];
  int sq[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row[r] = i0 + warp * R + r;
    const bool live = row[r] <= i1;
    sq[r] = live ? seq_of(cu, n, row[r]) : -1;
    m[r] = kNegInf;
    l[r] = 0.f;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      qr[r][t] = live && d < D.hd ? ld(q, kd, row[r] * D.H * D.hd + int64_t(h) * D.hd + d) : 0.f;
      acc[r][t] = 0.f;
    }
  }
  if constexpr (kRowsInShared<kSl>) publish_cols<R, kSl>(qx, qr);
  for_each_key_range(cu, n, prefix_of, i0, i1, [&](int64_t k0, int64_t k1, int owner, bool causal) {
    for (int64_t c = k0; c < k1; c += kTileKeys) {
      const int nk = int(k1 - c < kTileKeys ? k1 - c : kTileKeys);
      __syncthreads();  // the previous tile is no longer read
      stage_rows(ks, kPad, k, kd, c, nk, int64_t(D.Hkv) * D.hd, int64_t(g) * D.hd, D.hd);
      stage_rows(vs, kPad, v, kd, c, nk, int64_t(D.Hkv) * D.vd, int64_t(g) * D.vd, D.vd);
      __syncthreads();
      const int64_t j = c + lane;
      float s[R];
      row_dots<R, kSl>(qr, qx, ks, kPad, D.hd, s);
      float sc[R];
      bool vis[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        vis[r] = score_visible(lane < nk, sq[r], owner, causal, j, row[r]);
        sc[r] = D.scale * s[r];
      }
      tile_softmax_step<R, kSl>(sc, vis, m, l, acc, vs, kPad, nk, pb);
    }
  });
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row[r] > i1) continue;
    const bool none = l[r] == 0.f;
    const int64_t base = row[r] * D.H * D.vd + int64_t(h) * D.vd;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      if (d < D.vd) st(out, kd, base + d, none ? 0.f : acc[r][t] / l[r]);
    }
    if (lane == 0) lse[int64_t(h) * D.T + row[r]] = none ? kNegInf : m[r] + logf(l[r]);
  }
}

// dq of 32 query rows of one head: the key tiles as in the forward, K and V staged.
template <int kSl>
__global__ void dq_tiled_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout,
                                FloatKind gk, const float* lse, const float* Dsum, const int32_t* cu, int n,
                                const int32_t* prefix_of, Dims D, void* dq) {
  constexpr int kPad = kPadOf<kSl>;
  __shared__ float ks[kTileKeys * kPad];
  __shared__ float vs[kTileKeys * kPad];
  KS_SHARED_FLOATS16(qcols, kColsFloats<kSl>);  // publish_cols of each warp's q rows
  KS_SHARED_FLOATS16(gcols, kColsFloats<kSl>);  // and of its output-gradient rows
  KS_SHARED_FLOATS16(dsb, kWarps * kTileKeys * kRowsPerWarp);  // ds broadcasts (publish_rows)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const BlockTile bt = block_tile(D.T);
  const int h = bt.head, g = h / (D.H / D.Hkv);
  const int64_t i0 = bt.first, i1 = bt.last;
  constexpr int R = kRowsPerWarp;
  float* qx = qcols + (kRowsInShared<kSl> ? warp * 32 * kSl * R : 0);
  float* gx = gcols + (kRowsInShared<kSl> ? warp * 32 * kSl * R : 0);
  float* pb = dsb + warp * kTileKeys * R;
  float qr[R][kSl], gr[R][kSl], acc[R][kSl], L[R], Di[R];
  int64_t row[R];
  int sq[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row[r] = i0 + warp * R + r;
    const bool live = row[r] <= i1;
    sq[r] = live ? seq_of(cu, n, row[r]) : -1;
    L[r] = live ? lse[int64_t(h) * D.T + row[r]] : 0.f;
    Di[r] = live ? Dsum[int64_t(h) * D.T + row[r]] : 0.f;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      qr[r][t] = live && d < D.hd ? ld(q, kd, row[r] * D.H * D.hd + int64_t(h) * D.hd + d) : 0.f;
      gr[r][t] = live && d < D.vd ? ld(dout, gk, row[r] * D.H * D.vd + int64_t(h) * D.vd + d) : 0.f;
      acc[r][t] = 0.f;
    }
  }
  if constexpr (kRowsInShared<kSl>) {
    publish_cols<R, kSl>(qx, qr);
    publish_cols<R, kSl>(gx, gr);
  }
  for_each_key_range(cu, n, prefix_of, i0, i1, [&](int64_t k0, int64_t k1, int owner, bool causal) {
    for (int64_t c = k0; c < k1; c += kTileKeys) {
      const int nk = int(k1 - c < kTileKeys ? k1 - c : kTileKeys);
      __syncthreads();
      stage_rows(ks, kPad, k, kd, c, nk, int64_t(D.Hkv) * D.hd, int64_t(g) * D.hd, D.hd);
      stage_rows(vs, kPad, v, kd, c, nk, int64_t(D.Hkv) * D.vd, int64_t(g) * D.vd, D.vd);
      __syncthreads();
      const int64_t j = c + lane;
      float s[R], dp[R];
      row_dots<R, kSl>(qr, qx, ks, kPad, D.hd, s);
      row_dots<R, kSl>(gr, gx, vs, kPad, D.vd, dp);
      float ds[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool vis = score_visible(lane < nk, sq[r], owner, causal, j, row[r]);
        ds[r] = vis ? expf(D.scale * s[r] - L[r]) * (dp[r] - Di[r]) : 0.f;
      }
      publish_rows<R>(pb, ds);
      for (int kk = 0; kk < nk; ++kk) {
        float kv[kSl], dk[R];
#pragma unroll
        for (int t = 0; t < kSl; ++t) kv[t] = ks[kk * kPad + lane + 32 * t];
        read_rows<R>(pb, kk, dk);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < kSl; ++t) acc[r][t] += dk[r] * kv[t];
      }
    }
  });
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row[r] > i1) continue;
    const int64_t qb = row[r] * D.H * D.hd + int64_t(h) * D.hd;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      if (d < D.hd) st(dq, gk, qb + d, D.scale * acc[r][t]);
    }
  }
}

// dk, dv of 32 key rows of one kv head: for each head of the group, the query
// ranges that see the block's keys (each key sequence's own rows from the
// block's first key on, then its continuations'), staged 32 query rows at a time.
template <int kSl>
__global__ void dkdv_tiled_kernel(const void* q, const void* k, const void* v, FloatKind kd, const void* dout,
                                  FloatKind gk, const float* lse, const float* Dsum, const int32_t* cu, int n,
                                  const int32_t* prefix_of, Dims D, void* dk, void* dv) {
  constexpr int kPad = kPadOf<kSl>;
  __shared__ float qs[kTileKeys * kPad];
  __shared__ float gs[kTileKeys * kPad];
  __shared__ float ls[kTileKeys], dsum_s[kTileKeys];
  KS_SHARED_FLOATS16(kcols, kColsFloats<kSl>);  // publish_cols of each warp's key rows
  KS_SHARED_FLOATS16(vcols, kColsFloats<kSl>);  // and of its value rows
  KS_SHARED_FLOATS16(pbuf, kWarps * kTileKeys * kRowsPerWarp);   // p broadcasts (publish_rows)
  KS_SHARED_FLOATS16(dsbuf, kWarps * kTileKeys * kRowsPerWarp);  // ds broadcasts
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const BlockTile bt = block_tile(D.T);
  const int g = bt.head, rep = D.H / D.Hkv;
  const int64_t j0 = bt.first, j1 = bt.last;
  constexpr int R = kRowsPerWarp;
  float* kx = kcols + (kRowsInShared<kSl> ? warp * 32 * kSl * R : 0);
  float* vx = vcols + (kRowsInShared<kSl> ? warp * 32 * kSl * R : 0);
  float* pw = pbuf + warp * kTileKeys * R;
  float* dw = dsbuf + warp * kTileKeys * R;
  float kr[R][kSl], vr[R][kSl], ak[R][kSl], av[R][kSl];
  int64_t key[R];
  int sk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    key[r] = j0 + warp * R + r;
    const bool live = key[r] <= j1;
    sk[r] = live ? seq_of(cu, n, key[r]) : -1;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      kr[r][t] = live && d < D.hd ? ld(k, kd, key[r] * D.Hkv * D.hd + int64_t(g) * D.hd + d) : 0.f;
      vr[r][t] = live && d < D.vd ? ld(v, kd, key[r] * D.Hkv * D.vd + int64_t(g) * D.vd + d) : 0.f;
      ak[r][t] = av[r][t] = 0.f;
    }
  }
  if constexpr (kRowsInShared<kSl>) {
    publish_cols<R, kSl>(kx, kr);
    publish_cols<R, kSl>(vx, vr);
  }
  const int b0 = seq_of(cu, n, j0), b1 = seq_of(cu, n, j1);
  // Queries [q0, q1) of head h, all in one sequence; owner: the key sequence they see; causal: only i >= key.
  auto range = [&](int h, int64_t q0, int64_t q1, int owner, bool causal) {
    for (int64_t c = q0; c < q1; c += kTileKeys) {
      const int nq = int(q1 - c < kTileKeys ? q1 - c : kTileKeys);
      __syncthreads();
      stage_rows(qs, kPad, q, kd, c, nq, int64_t(D.H) * D.hd, int64_t(h) * D.hd, D.hd);
      stage_rows(gs, kPad, dout, gk, c, nq, int64_t(D.H) * D.vd, int64_t(h) * D.vd, D.vd);
      if (threadIdx.x < kTileKeys) {
        ls[threadIdx.x] = threadIdx.x < unsigned(nq) ? lse[int64_t(h) * D.T + c + threadIdx.x] : 0.f;
        dsum_s[threadIdx.x] = threadIdx.x < unsigned(nq) ? Dsum[int64_t(h) * D.T + c + threadIdx.x] : 0.f;
      }
      __syncthreads();
      const int64_t i = c + lane;
      float s[R], dp[R];
      row_dots<R, kSl>(kr, kx, qs, kPad, D.hd, s);
      row_dots<R, kSl>(vr, vx, gs, kPad, D.vd, dp);
      float p[R], ds[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool vis = score_visible(lane < nq, sk[r], owner, causal, key[r], i);
        p[r] = vis ? expf(D.scale * s[r] - ls[lane]) : 0.f;
        ds[r] = vis ? p[r] * (dp[r] - dsum_s[lane]) : 0.f;
      }
      publish_rows<R>(pw, p);
      publish_rows<R>(dw, ds);
      for (int qq = 0; qq < nq; ++qq) {
        float gv[kSl], qv[kSl], pq[R], dq[R];
#pragma unroll
        for (int t = 0; t < kSl; ++t) {
          gv[t] = gs[qq * kPad + lane + 32 * t];
          qv[t] = qs[qq * kPad + lane + 32 * t];
        }
        read_rows<R>(pw, qq, pq);
        read_rows<R>(dw, qq, dq);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < kSl; ++t) {
            av[r][t] += pq[r] * gv[t];
            ak[r][t] += dq[r] * qv[t];
          }
      }
    }
  };
  for (int h = g * rep; h < (g + 1) * rep; ++h)
    for (int b = b0; b <= b1; ++b) {
      range(h, j0 > cu[b] ? j0 : cu[b], cu[b + 1], b, true);
      if (prefix_of)
        for (int c = b + 1; c < n; ++c)
          if (prefix_of[c] == b) range(h, cu[c], cu[c + 1], b, false);
    }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (key[r] > j1) continue;
    const int64_t kb = key[r] * D.Hkv * D.hd + int64_t(g) * D.hd, vb = key[r] * D.Hkv * D.vd + int64_t(g) * D.vd;
#pragma unroll
    for (int t = 0; t < kSl; ++t) {
      const int d = lane + 32 * t;
      if (d < D.hd) st(dk, gk, kb + d, D.scale * ak[r][t]);
      if (d < D.vd) st(dv, gk, vb + d, av[r][t]);
    }
  }
}

unsigned tiled_blocks(int64_t T, int heads) { return unsigned((T + kTileRows - 1) / kTileRows * heads); }

unsigned blocks_for(int64_t warps) { return unsigned((warps + kWarps - 1) / kWarps); }

}  // namespace

int attention_max_head_dim() { return kMaxDim; }

void attention_fwd(const void* q, const void* k, const void* v, FloatKind kd, const int32_t* cu, int n,
                   const int32_t* prefix_of, int64_t T, int H, int Hkv, int hd, int vd, float scale, void* out,
                   float* lse, void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  auto s = as_stream(stream);
  if (attention_mma(kd, hd, vd))
    attention_fwd_mma(q, k, v, cu, n, prefix_of, T, H, Hkv, hd, vd, scale, out, lse, stream);
  else if (hd <= 64 && vd <= 64)
    KS_LAUNCH(fwd_tiled_kernel<2>, tiled_blocks(T, H), kWarps * 32, s)(q, k, v, kd, cu, n, prefix_of, D, out, lse);
  else if (hd <= kTiledMaxDim && vd <= kTiledMaxDim)
    KS_LAUNCH(fwd_tiled_kernel<4>, tiled_blocks(T, H), kWarps * 32, s)(q, k, v, kd, cu, n, prefix_of, D, out, lse);
  else
    KS_LAUNCH(fwd_kernel, blocks_for(T * H), kWarps * 32, s)(q, k, v, kd, cu, n, prefix_of, D, out, lse);
}

void attention_bwd(const void* q, const void* k, const void* v, const void* out, FloatKind kd, const float* lse,
                   const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, int64_t T, int H,
                   int Hkv, int hd, int vd, float scale, float* dsum_scratch, void* dq, void* dk, void* dv,
                   void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  auto s = as_stream(stream);
  KS_LAUNCH(dsum_kernel, blocks_for(T * H), kWarps * 32, s)(out, kd, dout, gk, D, dsum_scratch);
  const bool mma = attention_mma(kd, hd, vd);  // dq on the tensor cores; dk/dv below
  if (mma)
    attention_dq_mma(q, k, v, lse, dsum_scratch, dout, gk, cu, n, prefix_of, T, H, Hkv, hd, vd, scale, dq, stream);
  if (hd <= 64 && vd <= 64) {
    if (!mma)
      KS_LAUNCH(dq_tiled_kernel<2>, tiled_blocks(T, H), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu,
                                                                       n, prefix_of, D, dq);
    KS_LAUNCH(dkdv_tiled_kernel<2>, tiled_blocks(T, Hkv), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu,
                                                                         n, prefix_of, D, dk, dv);
  } else if (hd <= kTiledMaxDim && vd <= kTiledMaxDim) {
    if (!mma)
      KS_LAUNCH(dq_tiled_kernel<4>, tiled_blocks(T, H), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu,
                                                                       n, prefix_of, D, dq);
    KS_LAUNCH(dkdv_tiled_kernel<4>, tiled_blocks(T, Hkv), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu,
                                                                         n, prefix_of, D, dk, dv);
  } else {
    KS_LAUNCH(dq_kernel, blocks_for(T * H), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu, n, prefix_of,
                                                          D, dq);
    KS_LAUNCH(dkdv_kernel, blocks_for(T * Hkv), kWarps * 32, s)(q, k, v, kd, dout, gk, lse, dsum_scratch, cu, n,
                                                            prefix_of, D, dk, dv);
  }
}

}  // namespace kestrel::cuda::launch
