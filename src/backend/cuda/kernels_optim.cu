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

constexpr int kThreads = 256;
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20));
}

// copy_kind: 0 none, 1 bf16, 2 f16, 3 f32.
__global__ void adamw_kernel(AdamWArgs s, float* w, float* m, float* v, const float* g, int64_t n, void* copy,
                             int copy_kind) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    float pk = w[k];
    if (s.decay) pk = __fmul_rn(pk, s.decay_keep);
    const float gk = g[k], m0 = m[k];
    const float mk = __fmaf_rn(s.one_m_beta1, __fsub_rn(gk, m0), m0);
    const float vk = __fmaf_rn(__fmul_rn(s.one_m_beta2, gk), gk, __fmul_rn(v[k], s.beta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vk), s.bc2_sqrt), s.eps);
    m[k] = mk;
    v[k] = vk;
    const float wk = __fadd_rn(pk, __fdiv_rn(__fmul_rn(s.neg_step, mk), denom));
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
    adamw_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(s, master, exp_avg, exp_avg_sq, grad, n, model_copy,
                                                                   copy_kind);
}

void chunk_squares(const float* x, int64_t n, int64_t chunk, double* part, void* stream) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 0) chunk_squares_kernel<<<grid_for(chunks), kThreads, 0, as_stream(stream)>>>(x, n, chunk, chunks, part);
}

void scale(float* x, int64_t n, float c, void* stream) {
  if (n > 0) scale_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, n, c);
}

}  // namespace kestrel::cuda::launch
