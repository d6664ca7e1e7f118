// Tensor-core attention kernels (mma.sync m16n8k16 bf16, mma.cuh) for bf16
// q, k, v with head and value dims that are multiples of 16 up to 128: the
// forward (FlashAttention-2's) and the backward's dq. Every product is exact
// in f32 (bf16 times bf16, and an f32 operand split exactly into three bf16
// parts), so results are the CUDA-core kernels' (kernels_attention.cu) up to
// summation order. The backward's dk/dv stay on the CUDA cores for now.
#include <cstdlib>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/mma.cuh"

constexpr int kWarps = 4;  // warps per block

// ---- Pieces the forward and dq share ----
// This warp's q rows row[0] (g) and row[1] (g + 8) of head h as A fragments of
// the q.k product's 16-wide steps (a row with sq < 0, past the block, reads zero).
template <int kQk>
__device__ void load_q_frags(const void* q, const int64_t (&row)[2], const int (&sq)[2], int h, const Dims& D,
                             uint32_t (&qa)[kQk][4]) {
  const uint32_t* q32 = static_cast<const uint32_t*>(q);
  const int tq = threadIdx.x & 3, nqk = D.hd / 16;
#pragma unroll
  for (int s = 0; s < kQk; ++s)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e & 1, col = 16 * s + 2 * tq + 8 * (e >> 1);
      qa[s][e] = s < nqk && sq[r] >= 0 ? q32[(row[r] * D.H * D.hd + int64_t(h) * D.hd + col) / 2] : 0u;
    }
}

// Rows [c, c + nk) of head `head` of a bf16 [T, heads * width] tensor into
// dst (32-bit words, `stride` bf16 per row), zero from row nk to `rows`.
__device__ void stage_rows_bf16(uint32_t* dst, int stride, const void* src, int64_t c, int nk, int rows, int heads,
                                int head, int width) {
  const uint32_t* src32 = static_cast<const uint32_t*>(src);
  const int words = width / 2;
  for (int e = threadIdx.x; e < rows * words; e += blockDim.x) {
    const int kk = e / words, w = e % words;
    dst[kk * (stride / 2) + w] = kk < nk ? src32[((c + kk) * heads * width + int64_t(head) * width) / 2 + w] : 0u;
  }
}

// The same rows transposed: dst[d * stride + row] (bf16).
__device__ void stage_cols_bf16(uint16_t* dst, int stride, const void* src, int64_t c, int nk, int rows, int heads,
                                int head, int width) {
  const uint16_t* src16 = static_cast<const uint16_t*>(src);
  for (int e = threadIdx.x; e < rows * width; e += blockDim.x) {
    const int kk = e / width, d = e % width;
    dst[d * stride + kk] = kk < nk ? src16[(c + kk) * heads * width + int64_t(head) * width + d] : uint16_t(0);
  }
}

// S = q k^T for kB blocks of 8 staged key rows (ks32: `stride` bf16 per key).
template <int kQk, int kB>
__device__ void score_blocks(const uint32_t (&qa)[kQk][4], const uint32_t* ks32, int stride, int nqk,
                             float (&sc)[kB][4]) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int b = 0; b < kB; ++b) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[b][e] = 0.f;
    const uint32_t* krow = ks32 + (8 * b + gq) * (stride / 2) + tq;
#pragma unroll
    for (int s = 0; s < kQk; ++s)
      if (s < nqk) mma_bf16_16816(sc[b], qa[s], krow[8 * s], krow[8 * s + 4]);
  }
}

// ---- Tensor-core forward (bf16, head and value dims multiples of 16, <= 128) ----
// FlashAttention-2's forward on mma.sync m16n8k16 (mma.cuh): a block of 4 warps
// takes 64 packed rows of one head, 16 per warp; the warp's q rows stay in
// registers as A fragments; key tiles of 64 are staged in shared memory as bf16
// (K row-major, V transposed, rows padded by 8 so a fragment's 32-bit loads
// hit distinct banks); S = q k^T lands in C fragments whose lanes own rows g
// and g + 8, so the online softmax reduces over the 4 lanes of a row; P, split
// exactly into three bf16 parts, gives the A fragments of O += P V. The key
// ranges and masks are the tiled kernels' (for_each_key_range). Every product
// is exact in f32 and sums run in the tensor cores' order, not the CPU's:
// results agree up to summation order, not bit for bit.
constexpr int kMmaRows = 64;   // query rows per block (16 per warp)
constexpr int kMmaKeys = 64;   // keys per staged tile
constexpr int kMmaMaxDim = 128;
constexpr int kKStride = kMmaMaxDim + 8;  // bf16 per staged key row
constexpr int kVStride = kMmaKeys + 8;    // bf16 per staged (transposed) value column

// kQk: 16-wide steps of the q.k product (head dim / 16, at most); kVn: 8-wide column blocks of the output.
template <int kQk, int kVn>
__device__ void fwd_mma_body(const void* q, const void* k, const void* v, const int32_t* cu, int n,
                             const int32_t* prefix_of, Dims D, void* out, float* lse) {
  __shared__ uint32_t ks32[kMmaKeys * kKStride / 2];   // [key][dim] bf16 pairs
  // [dim][key] bf16, declared as 32-bit words so the fragments' 32-bit loads are aligned.
  __shared__ uint32_t vt32[kMmaMaxDim * kVStride / 2];
  uint16_t* vt16 = reinterpret_cast<uint16_t*>(vt32);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t tiles = (D.T + kMmaRows - 1) / kMmaRows;
  const int h = int(blockIdx.x / tiles), g = h / (D.H / D.Hkv);
  const int64_t i0 = int64_t(blockIdx.x % tiles) * kMmaRows, i1 = (i0 + kMmaRows < D.T ? i0 + kMmaRows : D.T) - 1;
  const int nqk = D.hd / 16, nvn = D.vd / 8;
  int64_t row[2];
  int sq[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * 16 + gq + 8 * r;
    sq[r] = row[r] <= i1 ? seq_of(cu, n, row[r]) : -1;
  }
  // q rows g and g + 8 of this warp as A fragments (zero for rows past the block).
  uint32_t qa[kQk][4];
  load_q_frags<kQk>(q, row, sq, h, D, qa);
  float o[kVn][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int b = 0; b < kVn; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[b][e] = 0.f;
  for_each_key_range(cu, n, prefix_of, i0, i1, [&](int64_t k0, int64_t k1, int owner, bool causal) {
    for (int64_t c = k0; c < k1; c += kMmaKeys) {
      const int nk = int(k1 - c < kMmaKeys ? k1 - c : kMmaKeys);
      __syncthreads();  // the previous tile is no longer read
      stage_rows_bf16(ks32, kKStride, k, c, nk, kMmaKeys, D.Hkv, g, D.hd);
      stage_cols_bf16(vt16, kVStride, v, c, nk, kMmaKeys, D.Hkv, g, D.vd);
      __syncthreads();
      // S = q k^T for the tile's 8 blocks of 8 keys.
      float sc[kMmaKeys / 8][4];
      score_blocks<kQk, kMmaKeys / 8>(qa, ks32, kKStride, nqk, sc);
      // Mask, scale and the online softmax of rows g (r = 0) and g + 8 (r = 1).
      float tmax[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int b = 0; b < kMmaKeys / 8; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, kk = 8 * b + 2 * tq + (e & 1);
          const int64_t j = c + kk;
          const bool vis = score_visible(kk < nk, sq[r], owner, causal, j, row[r]);
          sc[b][e] = vis ? D.scale * sc[b][e] : kNegInf;
          tmax[r] = fmaxf(tmax[r], sc[b][e]);
        }
      float corr[2], rsum[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
        const float m_new = fmaxf(m[r], tmax[r]);
        corr[r] = m_new == kNegInf ? 1.f : expf(m[r] - m_new);  // m = -inf: nothing to rescale
        tmax[r] = m_new;
        m[r] = m_new;
      }
#pragma unroll
      for (int b = 0; b < kMmaKeys / 8; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          sc[b][e] = sc[b][e] == kNegInf ? 0.f : expf(sc[b][e] - tmax[r]);
          rsum[r] += sc[b][e];
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        rsum[r] += __shfl_xor_sync(0xffffffffu, rsum[r], 1);
        rsum[r] += __shfl_xor_sync(0xffffffffu, rsum[r], 2);
        l[r] = l[r] * corr[r] + rsum[r];
      }
#pragma unroll
      for (int b = 0; b < kVn; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[b][e] *= corr[e >> 1];
      // O += P V: keys 16 s .. 16 s + 15 are S blocks 2 s and 2 s + 1. P is
      // split exactly into three bf16 parts (split3_bf16x2), so the products are
      // the f32 ones and the output is the CPU's up to summation order (a P
      // rounded to bf16, as FlashAttention multiplies, would add a rounding the
      // CPU does not make, and the device runs are compared with the CPU's).
#pragma unroll
      for (int s = 0; s < kMmaKeys / 16; ++s)
        mma_split_x_bt<kVn>(sc[2 * s], sc[2 * s + 1], vt32, kVStride, 16 * s, nvn, o);
    }
  });
  uint32_t* out32 = static_cast<uint32_t*>(out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (sq[r] < 0) continue;
    const bool none = l[r] == 0.f;
    const float inv = none ? 0.f : 1.f / l[r];
#pragma unroll
    for (int b = 0; b < kVn; ++b)
      if (b < nvn)
        out32[(row[r] * D.H * D.vd + int64_t(h) * D.vd + 8 * b + 2 * tq) / 2] =
            pack_bf16x2(o[b][2 * r] * inv, o[b][2 * r + 1] * inv);
    if (tq == 0) lse[int64_t(h) * D.T + row[r]] = none ? kNegInf : m[r] + logf(l[r]);
  }
}

// The two widths as plain kernels (a template's comma would split KS_LAUNCH's arguments).
__global__ void fwd_mma64_kernel(const void* q, const void* k, const void* v, const int32_t* cu, int n,
                                 const int32_t* prefix_of, Dims D, void* out, float* lse) {
  fwd_mma_body<4, 8>(q, k, v, cu, n, prefix_of, D, out, lse);
}
__global__ void fwd_mma128_kernel(const void* q, const void* k, const void* v, const int32_t* cu, int n,
                                  const int32_t* prefix_of, Dims D, void* out, float* lse) {
  fwd_mma_body<8, 16>(q, k, v, cu, n, prefix_of, D, out, lse);
}

// ---- Tensor-core dq (the backward's query gradient) ----
// A block of 4 warps takes 64 packed rows of one head (16 per warp) and
// walks the key tiles the forward walked, 32 keys at a time: S = q k^T and
// dP = dO v^T on the tensor cores, dS = P (dP - D_i) with P from the forward's
// lse, then dq += dS k. dO (f32 in bf16 training) and dS are split exactly
// into three bf16 parts (split3_bf16x2) for their products; K staged twice,
// row-major for S and transposed for dS k, V row-major for dP.
constexpr int kDqKeys = 32;
constexpr int kDqKStride = kMmaMaxDim + 8;  // bf16 per staged key (or value) row
constexpr int kDqTStride = kDqKeys + 8;     // bf16 per staged transposed key column

template <int kQk, int kVk, int kHn>
__device__ void dq_mma_body(const void* q, const void* k, const void* v, const float* lse, const float* dsum,
                            const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, Dims D,
                            void* dq) {
  __shared__ uint32_t ks32[kDqKeys * kDqKStride / 2];  // [key][dim] bf16 pairs
  __shared__ uint32_t vs32[kDqKeys * kDqKStride / 2];  // [key][value dim] bf16 pairs
  __shared__ uint32_t kt32[kMmaMaxDim * kDqTStride / 2];  // [dim][key] bf16, as aligned 32-bit words
  uint16_t* kt16 = reinterpret_cast<uint16_t*>(kt32);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t tiles = (D.T + kMmaRows - 1) / kMmaRows;
  const int h = int(blockIdx.x / tiles), g = h / (D.H / D.Hkv);
  const int64_t i0 = int64_t(blockIdx.x % tiles) * kMmaRows, i1 = (i0 + kMmaRows < D.T ? i0 + kMmaRows : D.T) - 1;
  const int nqk = D.hd / 16, nvk = D.vd / 16, nhn = D.hd / 8;
  int64_t row[2];
  int sq[2];
  float L[2], Di[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * 16 + gq + 8 * r;
    const bool live = row[r] <= i1;
    sq[r] = live ? seq_of(cu, n, row[r]) : -1;
    L[r] = live ? lse[int64_t(h) * D.T + row[r]] : 0.f;
    Di[r] = live ? dsum[int64_t(h) * D.T + row[r]] : 0.f;
  }
  uint32_t qa[kQk][4];
  load_q_frags<kQk>(q, row, sq, h, D, qa);
  float acc[kHn][4];
#pragma unroll
  for (int b = 0; b < kHn; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[b][e] = 0.f;
  const int dparts = gk == FloatKind::F32 ? 3 : 1;  // a bf16 dO is its own single part
  for_each_key_range(cu, n, prefix_of, i0, i1, [&](int64_t k0, int64_t k1, int owner, bool causal) {
    for (int64_t c = k0; c < k1; c += kDqKeys) {
      const int nk = int(k1 - c < kDqKeys ? k1 - c : kDqKeys);
      __syncthreads();  // the previous tile is no longer read
      stage_rows_bf16(ks32, kDqKStride, k, c, nk, kDqKeys, D.Hkv, g, D.hd);
      stage_rows_bf16(vs32, kDqKStride, v, c, nk, kDqKeys, D.Hkv, g, D.vd);
      stage_cols_bf16(kt16, kDqTStride, k, c, nk, kDqKeys, D.Hkv, g, D.hd);
      __syncthreads();
      // S = q k^T and dP = dO v^T for the tile's 4 blocks of 8 keys.
      float sc[kDqKeys / 8][4], dp[kDqKeys / 8][4] = {};
      score_blocks<kQk, kDqKeys / 8>(qa, ks32, kDqKStride, nqk, sc);
#pragma unroll
      for (int s = 0; s < kVk; ++s) {
        if (s >= nvk) continue;
        // This warp's dO rows g and g + 8, value dims 16 s .. 16 s + 15, as split A fragments.
        uint32_t da[4][3];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e & 1, col = 16 * s + 2 * tq + 8 * (e >> 1);
          const int64_t at = row[r] * D.H * D.vd + int64_t(h) * D.vd + col;
          const bool live = sq[r] >= 0;
          split3_bf16x2(live ? ld(dout, gk, at) : 0.f, live ? ld(dout, gk, at + 1) : 0.f, da[e]);
        }
        for (int p = 0; p < dparts; ++p) {
          const uint32_t a[4] = {da[0][p], da[1][p], da[2][p], da[3][p]};
#pragma unroll
          for (int b = 0; b < kDqKeys / 8; ++b) {
            const uint32_t* vrow = vs32 + (8 * b + gq) * (kDqKStride / 2) + tq;
            mma_bf16_16816(dp[b], a, vrow[8 * s], vrow[8 * s + 4]);
          }
        }
      }
      // dS = P (dP - D_i), P = exp(scale s - lse) where the key is visible, else 0.
#pragma unroll
      for (int b = 0; b < kDqKeys / 8; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, kk = 8 * b + 2 * tq + (e & 1);
          const int64_t j = c + kk;
          const bool vis = score_visible(kk < nk, sq[r], owner, causal, j, row[r]);
          sc[b][e] = vis ? expf(D.scale * sc[b][e] - L[r]) * (dp[b][e] - Di[r]) : 0.f;
        }
      // dq += dS k: keys 16 s .. 16 s + 15 are dS blocks 2 s and 2 s + 1.
#pragma unroll
      for (int s = 0; s < kDqKeys / 16; ++s)
        mma_split_x_bt<kHn>(sc[2 * s], sc[2 * s + 1], kt32, kDqTStride, 16 * s, nhn, acc);
    }
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (sq[r] < 0) continue;
    const int64_t base = row[r] * D.H * D.hd + int64_t(h) * D.hd + 2 * tq;
#pragma unroll
    for (int b = 0; b < kHn; ++b)
      if (b < nhn) {
        st(dq, gk, base + 8 * b, D.scale * acc[b][2 * r]);
        st(dq, gk, base + 8 * b + 1, D.scale * acc[b][2 * r + 1]);
      }
  }
}

__global__ void dq_mma64_kernel(const void* q, const void* k, const void* v, const float* lse, const float* dsum,
                                const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of,
                                Dims D, void* dq) {
  dq_mma_body<4, 4, 8>(q, k, v, lse, dsum, dout, gk, cu, n, prefix_of, D, dq);
}
__global__ void dq_mma128_kernel(const void* q, const void* k, const void* v, const float* lse, const float* dsum,
                                 const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of,
                                 Dims D, void* dq) {
  dq_mma_body<8, 8, 16>(q, k, v, lse, dsum, dout, gk, cu, n, prefix_of, D, dq);
}

// One warp: c[16 x 8] = a[16 x 16] b[16 x 8], every lane loading its fragments
// by the PTX ISA's formulas for m16n8k16 (mma.cuh) and storing its C elements.
__global__ void mma_tile_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); };
  const uint32_t fa[4] = {pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b0 = pair(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  const uint32_t b1 = pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  mma_bf16_16816(acc, fa, b0, b1);
  c[g * 8 + 2 * t] = acc[0];
  c[g * 8 + 2 * t + 1] = acc[1];
  c[(g + 8) * 8 + 2 * t] = acc[2];
  c[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

}  // namespace

void mma_tile_product(const uint16_t* a, const uint16_t* b, float* c, void* stream) {
  KS_LAUNCH(mma_tile_kernel, 1u, 32, as_stream(stream))(a, b, c);
}

bool attention_mma(FloatKind kd, int hd, int vd) {
  static const bool off = [] {
    const char* e = std::getenv("KESTREL_CUDA_ATTENTION");
    return e && std::string(e) == "tiled";
  }();
  return !off && kd == FloatKind::BF16 && hd % 16 == 0 && vd % 16 == 0 && hd <= kMmaMaxDim && vd <= kMmaMaxDim;
}

void attention_fwd_mma(const void* q, const void* k, const void* v, const int32_t* cu, int n, const int32_t* prefix_of,
                       int64_t T, int H, int Hkv, int hd, int vd, float scale, void* out, float* lse, void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  const unsigned blocks = unsigned((T + kMmaRows - 1) / kMmaRows * H);
  if (hd <= 64 && vd <= 64)
    KS_LAUNCH(fwd_mma64_kernel, blocks, kWarps * 32, as_stream(stream))(q, k, v, cu, n, prefix_of, D, out, lse);
  else
    KS_LAUNCH(fwd_mma128_kernel, blocks, kWarps * 32, as_stream(stream))(q, k, v, cu, n, prefix_of, D, out, lse);
}

void attention_dq_mma(const void* q, const void* k, const void* v, const float* lse, const float* dsum,
                      const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, int64_t T,
                      int H, int Hkv, int hd, int vd, float scale, void* dq, void* stream) {
  if (T <= 0) return;
  const Dims D{T, H, Hkv, hd, vd, scale};
  const unsigned blocks = unsigned((T + kMmaRows - 1) / kMmaRows * H);
  if (hd <= 64 && vd <= 64)
    KS_LAUNCH(dq_mma64_kernel, blocks, kWarps * 32, as_stream(stream))(q, k, v, lse, dsum, dout, gk, cu, n, prefix_of,
                                                                       D, dq);
  else
    KS_LAUNCH(dq_mma128_kernel, blocks, kWarps * 32, as_stream(stream))(q, k, v, lse, dsum, dout, gk, cu, n,
                                                                        prefix_of, D, dq);
}

}  // namespace kestrel::cuda::launch
