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
