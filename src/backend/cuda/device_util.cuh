// Device-side helpers shared by the CUDA kernel files (*.cu): loads and
// stores of F32/BF16 storage as f32, the bf16 rounding, warp and block
// reductions in a fixed order, the sequence of a packed row, and the launch
// arithmetic. Included inside each file's `namespace kestrel::cuda::launch`
// anonymous namespace, after cuda_runtime.h and cuda_bf16.h.
#pragma once

// KS_LAUNCH(kernel, grid, block, stream)(args...): a kernel launch. Under nvcc it is
// kernel<<<grid, block, 0, stream>>>(args...); tests/cuda_emu defines it first to run
// the kernel in its CPU emulator, so `make test` checks the kernels' logic without a GPU.
#ifndef KS_LAUNCH
#define KS_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#endif

using bf16 = __nv_bfloat16;

// KS_SHARED_FLOATS16(name, n): `float* name` to n floats of shared memory,
// 16-byte aligned for float4 loads (declared as float4, which both nvcc and
// the emulator align, where an alignas on __shared__ is not portable).
#define KS_SHARED_FLOATS16(name, n)                 \
  __shared__ float4 name##_f4[((n) + 3) / 4];       \
  float* name = reinterpret_cast<float*>(name##_f4)
constexpr float kNegInf = -__builtin_huge_valf();

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
// Blocks of `threads` for a grid-stride loop over n elements (at least one block, at most 2^20).
inline unsigned grid_for(int64_t n, int threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20));
}

__device__ __forceinline__ float ld(const void* p, FloatKind k, int64_t i) {
  return k == FloatKind::F32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
}
// f32 stored as is, bf16 rounded to nearest even once (the CPU's float_to_bf16).
__device__ __forceinline__ void st(void* p, FloatKind k, int64_t i, float v) {
  if (k == FloatKind::F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
}
// v rounded to kind k's precision (the CPU's round_to<T>).
__device__ __forceinline__ float round_to(float v, FloatKind k) {
  return k == FloatKind::F32 ? v : __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// fmaxf: a NaN operand loses, as a NaN-skipping compare does on the CPU.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a fixed
// tree order; every thread gets it. Called by every thread of the block.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  float s = lane < nwarps ? warp_sums[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The sequence holding packed row i: the b with cu[b] <= i < cu[b+1] (empty sequences skipped).
__device__ int seq_of(const int32_t* cu, int n, int64_t i) {
  int lo = 0, hi = n;  // cu[lo] <= i < cu[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

// One warp's online softmax over keys taken 32 at a time (one key per lane),
// the weighted sum of their value rows spread over the lanes: element
// d = lane + 32 t of the output row is acc[t]. The attention forward kernels
// (training, block, paged, latent) share it.
template <int kSlots>
struct OnlineSoftmax {
  float m = kNegInf, l = 0.f, acc[kSlots] = {};
  // One step over nk keys: this lane's score s and whether its key is visible (masked
  // lanes carry no weight); the value row of key kk (< nk) starts at vsrc[row_of(kk)],
  // vd elements wide. A step in which no lane is visible leaves the state as it was.
  template <class RowOf>
  __device__ void step(float s, bool visible, int nk, const void* vsrc, FloatKind kd, int vd, RowOf row_of) {
    const int lane = threadIdx.x & 31;
    if (warp_sum(visible ? 1.f : 0.f) == 0.f) return;
    const float m_new = fmaxf(m, warp_max(visible ? s : kNegInf));
    const float corr = expf(m - m_new);  // 0 while m is -inf
    const float pr = visible ? expf(s - m_new) : 0.f;
    l = l * corr + warp_sum(pr);
#pragma unroll
    for (int t = 0; t < kSlots; ++t) acc[t] *= corr;
    for (int kk = 0; kk < nk; ++kk) {
      const float pk = __shfl_sync(0xffffffffu, pr, kk);
      if (__shfl_sync(0xffffffffu, visible ? 1 : 0, kk) == 0) continue;  // a masked key: uniform over the warp
      const int64_t vb = row_of(kk);
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int d = lane + 32 * t;
        if (d < vd) acc[t] += pk * ld(vsrc, kd, vb + d);
      }
    }
    m = m_new;
  }
  // Writes the normalised row to out[base, base + vd) (0 when no key was seen) and
  // returns its log-sum-exp (-inf when no key was seen).
  __device__ float finish(void* out, FloatKind ko, int64_t base, int vd) const {
    const int lane = threadIdx.x & 31;
    const bool none = l == 0.f;
#pragma unroll
    for (int t = 0; t < kSlots; ++t) {
      const int d = lane + 32 * t;
      if (d < vd) st(out, ko, base + d, none ? 0.f : acc[t] / l);
    }
    return none ? kNegInf : m + logf(l);
  }
};

// out[r] = sum over d < width of x[r][d] * tile[lane * pad + d], d in order:
// R rows held in registers spread over the lanes (element d = 32 t + lane in
// x[r][t], reaching the other lanes by shuffles) against the tile row of this
// lane's key (or query), staged in shared memory.
template <int R, int kSl>
__device__ void tile_dots(const float (&x)[R][kSl], const float* tile, int pad, int width, float (&out)[R]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
#pragma unroll
  for (int t = 0; t < kSl; ++t)
    for (int dd = 0; dd < 32; ++dd) {
      const int d = 32 * t + dd;
      if (d >= width) break;  // uniform over the warp
      const float y = tile[lane * pad + d];
#pragma unroll
      for (int r = 0; r < R; ++r) out[r] += __shfl_sync(0xffffffffu, x[r][t], dd) * y;
    }
}

// A warp's per-row values made readable by every lane through shared memory
// (the tiled attention kernels), where R shuffles per partner lane were the
// kernels' bottleneck: each lane writes its R values to pb[lane * R + r]
// (pb: this warp's 32 * R floats, 16-byte aligned); then read_rows(pb, kk)
// gives every lane lane kk's values with R / 4 broadcast vector loads.
template <int R>
__device__ void publish_rows(float* pb, const float (&v)[R]) {
  const int lane = threadIdx.x & 31;
  __syncwarp();  // every lane is done reading the previous values
#pragma unroll
  for (int r = 0; r < R; ++r) pb[lane * R + r] = v[r];
  __syncwarp();
}

template <int R>
__device__ __forceinline__ void read_rows(const float* pb, int kk, float (&v)[R]) {
  if constexpr (R % 4 == 0) {
    const float4* p4 = reinterpret_cast<const float4*>(pb + kk * R);
#pragma unroll
    for (int r4 = 0; r4 < R / 4; ++r4) {
      const float4 t = p4[r4];
      v[4 * r4] = t.x;
      v[4 * r4 + 1] = t.y;
      v[4 * r4 + 2] = t.z;
      v[4 * r4 + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = pb[kk * R + r];
  }
}

// tile_dots with the R rows in shared memory instead of registers:
// xs[d * R + r] (this warp's rows, 16-byte aligned, written once by
// publish_cols), read by broadcast vector loads; the same sums in the same order.
template <int R>
__device__ void tile_dots_s(const float* xs, const float* tile, int pad, int width, float (&out)[R]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
  const float* trow = tile + lane * pad;
#pragma unroll 4
  for (int d = 0; d < width; ++d) {
    const float y = trow[d];
    float x[R];
    read_rows<R>(xs, d, x);
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] += x[r] * y;
  }
}

// Writes R rows held in registers (element d = 32 t + lane in x[r][t]) to
// this warp's xs[d * R + r] for tile_dots_s, zero past width.
template <int R, int kSl>
__device__ void publish_cols(float* xs, const float (&x)[R][kSl]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < kSl; ++t)
#pragma unroll
    for (int r = 0; r < R; ++r) xs[(lane + 32 * t) * R + r] = x[r][t];
  __syncwarp();
}

// One step of R rows' online softmax over a tile of nk keys staged in shared
// memory, one key per lane (the tiled attention and grouped paged-decode
// kernels): sc[r] is this lane's scaled score for row r and vis[r] whether its
// key counts; acc[r][t] accumulates dims lane + 32 t of the value rows
// vs[kk * pad + d]. A row with no visible key in the tile stays as it was.
// pb: this warp's 32 * R floats of shared memory (publish_rows).
template <int R, int kSl>
__device__ void tile_softmax_step(const float (&sc)[R], const bool (&vis)[R], float (&m)[R], float (&l)[R],
                                  float (&acc)[R][kSl], const float* vs, int pad, int nk, float* pb) {
  const int lane = threadIdx.x & 31;
  float p[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    p[r] = 0.f;
    if (warp_sum(vis[r] ? 1.f : 0.f) == 0.f) continue;  // uniform over the warp
    const float m_new = fmaxf(m[r], warp_max(vis[r] ? sc[r] : kNegInf));
    const float corr = expf(m[r] - m_new);
    p[r] = vis[r] ? expf(sc[r] - m_new) : 0.f;
    l[r] = l[r] * corr + warp_sum(p[r]);
#pragma unroll
    for (int t = 0; t < kSl; ++t) acc[r][t] *= corr;
    m[r] = m_new;
  }
  publish_rows<R>(pb, p);
  for (int kk = 0; kk < nk; ++kk) {
    float vv[kSl], pk[R];
#pragma unroll
    for (int t = 0; t < kSl; ++t) vv[t] = vs[kk * pad + lane + 32 * t];
    read_rows<R>(pb, kk, pk);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < kSl; ++t) acc[r][t] += pk[r] * vv[t];
  }
}
