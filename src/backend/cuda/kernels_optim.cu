// CUDA kernels of ops/optim_ops.h: the AdamW step, the sum of squares of
// gradient clipping and the in-place scale. Every operation is an explicit
// IEEE intrinsic (__fmaf_rn where torch's arithmetic has a fused
// multiply-add, __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn elsewhere), so nvcc
// cannot contract anything and a step equals the CPU kernel's bit for bit.
// sum_squares sums 4096-element chunks in element order in double, one
// thread per chunk, and the host adds the chunk sums in order: the CPU
// kernel's order, so the grad norm is the CPU's to the bit too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256;

// copy_kind: 0 none, 1 bf16, 2 f16, 3 f32.
// The AdamW update of one element, every operation spelled out (the CPU's adamw_loop).
__device__ __forceinline__ float adamw_one(const AdamWArgs& s, float pk, float* m, float* v, float gk) {
  if (s.decay) pk = __fmul_rn(pk, s.decay_keep);
  const float m0 = *m;
  const float mk = __fmaf_rn(s.one_m_beta1, __fsub_rn(gk, m0), m0);
  const float vk = __fmaf_rn(__fmul_rn(s.one_m_beta2, gk), gk, __fmul_rn(*v, s.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vk), s.bc2_sqrt), s.eps);
  *m = mk;
  *v = vk;
  return __fadd_rn(pk, __fdiv_rn(__fmul_rn(s.neg_step, mk), denom));
}

// reuse_fp32_param's split and recovery of an f32 bit pattern (backend/cpu/reuse_fp32_kernels.h has the
// encoding and why bit 31 of v holds the extra bit): the same integer operations.
constexpr uint32_t kFlag = 0x80000000u;
__device__ __forceinline__ bool split_bits(uint32_t u, uint16_t* b, uint16_t* r) {
  const uint32_t lo = u & 0xffffu, hi = u >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rne = (u + 0x7fffu + (hi & 1u)) >> 16;
  const uint32_t copy = nan ? (hi | 0x40u) : rne;
  *r = uint16_t(lo);
  *b = uint16_t(copy);
  return nan ? (hi & 0x40u) == 0 : (lo == 0x8000u) & (copy != hi);
}
__device__ __forceinline__ uint32_t recover_bits(uint16_t b, uint16_t r, bool flag) {
  const uint32_t bb = b, rr = r, f = flag ? 1u : 0u;
  const uint32_t up = uint32_t(rr > 0x8000u) | (uint32_t(rr == 0x8000u) & f);
  const bool b_nan = (bb & 0x7fffu) > 0x7f80u;
  const uint32_t hi = b_nan ? (bb & ~(f << 6)) : bb - up;
  return (hi << 16) | rr;
}

__global__ void adamw_reuse_kernel(AdamWArgs s, uint16_t* b, uint16_t* r, float* m, float* v, const float* g,
                                   int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    uint32_t vb = __float_as_uint(v[k]);
    const float w = __uint_as_float(recover_bits(b[k], r[k], (vb & kFlag) != 0));
    float vk = __uint_as_float(vb & ~kFlag);  // AdamW reads the plain v
    const float wk = adamw_one(s, w, &m[k], &vk, g[k]);
    const bool f = split_bits(__float_as_uint(wk), &b[k], &r[k]);
    v[k] = __uint_as_float(__float_as_uint(vk) | (f ? kFlag : 0u));
  }
}

__global__ void reuse_split_kernel(const float* master, uint16_t* b, uint16_t* r, float* v, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const bool f = split_bits(__float_as_uint(master[k]), &b[k], &r[k]);
    v[k] = __uint_as_float((__float_as_uint(v[k]) & ~kFlag) | (f ? kFlag : 0u));
  }
}

__global__ void reuse_recover_kernel(const uint16_t* b, const uint16_t* r, const float* v, float* master,
                                     float* v_clean, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t vb = __float_as_uint(v[k]);
    master[k] = __uint_as_float(recover_bits(b[k], r[k], (vb & kFlag) != 0));
    if (v_clean) v_clean[k] = __uint_as_float(vb & ~kFlag);
  }
}

__global__ void adamw_kernel(AdamWArgs s, float* w, float* m, float* v, const float* g, int64_t n, void* copy,
                             int copy_kind) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const float wk = adamw_one(s, w[k], &m[k], &v[k], g[k]);
    w[k] = wk;
    if (copy_kind == 1)
      static_cast<__nv_bfloat16*>(copy)[k] = __float2bfloat16_rn(wk);
    else if (copy_kind == 2)
      static_cast<__half*>(copy)[k] = __float2half_rn(wk);
    else if (copy_kind == 3)
      static_cast<float*>(copy)[k] = wk;
  }
}

__global__ void chunk_squares_kernel(const float* x, int64_t n, int64_t chunk, int64_t chunks, double* part) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= chunks) return;
  const int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
  double s = 0;
  for (int64_t k = lo; k < hi; ++k) s = __dadd_rn(s, __dmul_rn(double(x[k]), double(x[k])));
  part[c] = s;
}

__global__ void scale_kernel(float* x, int64_t n, float c) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
    x[k] = __fmul_rn(x[k], c);
}

}  // namespace

void adamw(const AdamWArgs& s, float* master, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n,
           void* model_copy, int copy_kind, void* stream) {
  if (n > 0)
    KS_LAUNCH(adamw_kernel, grid_for(n), kThreads, as_stream(stream))(s, master, exp_avg, exp_avg_sq, grad, n, model_copy,
                                                                   copy_kind);
}

void adamw_reuse_fp32(const AdamWArgs& s, uint16_t* copy, uint16_t* residual, float* exp_avg, float* exp_avg_sq,
                      const float* grad, int64_t n, void* stream) {
  if (n > 0)
    KS_LAUNCH(adamw_reuse_kernel, grid_for(n), kThreads, as_stream(stream))(s, copy, residual, exp_avg, exp_avg_sq, grad,
                                                                         n);
}

void reuse_fp32_split(const float* master, uint16_t* copy, uint16_t* residual, float* exp_avg_sq, int64_t n,
                      void* stream) {
  if (n > 0) KS_LAUNCH(reuse_split_kernel, grid_for(n), kThreads, as_stream(stream))(master, copy, residual, exp_avg_sq, n);
}

void reuse_fp32_recover(const uint16_t* copy, const uint16_t* residual, const float* exp_avg_sq, float* master,
                        float* v_clean, int64_t n, void* stream) {
  if (n > 0)
    KS_LAUNCH(reuse_recover_kernel, grid_for(n), kThreads, as_stream(stream))(copy, residual, exp_avg_sq, master, v_clean,
                                                                           n);
}

void chunk_squares(const float* x, int64_t n, int64_t chunk, double* part, void* stream) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 0) KS_LAUNCH(chunk_squares_kernel, grid_for(chunks), kThreads, as_stream(stream))(x, n, chunk, chunks, part);
}

void scale(float* x, int64_t n, float c, void* stream) {
  if (n > 0) KS_LAUNCH(scale_kernel, grid_for(n), kThreads, as_stream(stream))(x, n, c);
}

}  // namespace kestrel::cuda::launch
