// CUDA kernels of the fused log-softmax + gather (+ entropy) (ops/loss.h) and
// of the vocab-parallel pieces (ops/vocab_loss.h). One block per row of
// logits; the row is read from global memory once per pass (max, then the
// exp sums; the backward recomputes p), and no [T, V] buffer other than the
// output exists. Conventions of the CPU kernels: NaN logits never win the
// max but poison the sums; -inf logits add nothing (p = 0, 0 log 0 = 0).
// Block sums run in a fixed tree order (deterministic for a given launch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256;  // a multiple of 32, <= 1024: block_reduce's assumption


struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {  // fmaxf: a NaN operand loses (std::max over a NaN-skipping compare in the CPU kernels)
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction of v over the block; every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T warp_vals[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();  // a previous call's reads of warp_vals are done
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  T r = warp_vals[0];
  for (int w = 1; w < nwarps; ++w) r = op(r, warp_vals[w]);  // same order in every thread
  return r;
}


__global__ void logprob_entropy_fwd_kernel(const void* logits, FloatKind k, const int32_t* tgt, int64_t V,
                                           float* logprob, float* entropy, float* lse) {
  const int64_t r = blockIdx.x;
  const int64_t base = r * V;
  float m = kNegInf;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, ld(logits, k, base + v));
  m = block_reduce(m, Max{});
  float s = 0.f, a = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = ld(logits, k, base + v);
    if (x == kNegInf) continue;
    const float d = x - m, e = expf(d);
    s += e;
    if (e != 0.f) a += e * d;
  }
  s = block_reduce(s, Sum{});
  a = block_reduce(a, Sum{});
  if (threadIdx.x == 0) {
    const float log_s = logf(s), l = m + log_s;
    lse[r] = l;
    logprob[r] = tgt[r] >= 0 ? ld(logits, k, base + tgt[r]) - l : 0.f;
    if (entropy) entropy[r] = log_s - a / s;
  }
}

__global__ void logprob_entropy_bwd_kernel(const void* logits, FloatKind ki, const int32_t* tgt, const float* lse,
                                           const float* cp, const float* ch, int64_t V, void* dlogits, FloatKind ko) {
  const int64_t r = blockIdx.x;
  const int64_t base = r * V;
  const int64_t target = tgt[r];
  const float c_lp = target >= 0 ? cp[r] : 0.f;
  const bool with_entropy = ch != nullptr;
  const float c_h = with_entropy ? ch[r] : 0.f;
  if (target < 0 && !with_entropy) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) st(dlogits, ko, base + v, 0.f);
    return;
  }
  const float l = lse[r];
  float H = 0.f;
  if (with_entropy) {
    float acc = 0.f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float lp = ld(logits, ki, base + v) - l, p = expf(lp);
      if (p != 0.f) acc += p * lp;
    }
    H = -block_reduce(acc, Sum{});  // also orders every read of the row before the writes below
  }
  // dlogits may be the logits' buffer: each element is read, then written, by one thread.
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float lp = ld(logits, ki, base + v) - l, p = expf(lp);
    float g = (v == target ? c_lp : 0.f) - c_lp * p;
    if (with_entropy && p != 0.f) g -= c_h * (p * (lp + H));
    st(dlogits, ko, base + v, g);
  }
}

__global__ void vocab_row_max_kernel(const void* logits, FloatKind k, int64_t V, int64_t n_real, float* M) {
  const int64_t r = blockIdx.x;
  float m = kNegInf;
  for (int64_t v = threadIdx.x; v < n_real; v += blockDim.x) m = fmaxf(m, ld(logits, k, r * V + v));
  m = block_reduce(m, Max{});
  if (threadIdx.x == 0) M[r] = m;
}

__global__ void vocab_row_sums_kernel(const void* logits, FloatKind k, const int32_t* tg, int64_t V,
                                      int64_t vocab_start, int64_t n_real, const float* M, float* S, int64_t T) {
  const int64_t r = blockIdx.x;
  const double m = M[r];
  double s = 0, sz = 0;
  for (int64_t v = threadIdx.x; v < n_real; v += blockDim.x) {
    const double z = ld(logits, k, r * V + v);
    const double e = exp(z - m);
    s += e;
    sz += e * z;
  }
  s = block_reduce(s, Sum{});
  sz = block_reduce(sz, Sum{});
  if (threadIdx.x == 0) {
    S[r] = float(s);
    S[T + r] = float(sz);
    const int64_t local = int64_t(tg[r]) - vocab_start;
    S[2 * T + r] = (tg[r] >= 0 && local >= 0 && local < n_real) ? ld(logits, k, r * V + local) : 0.f;
  }
}

__global__ void vocab_softmax_finish_kernel(const float* S, const int32_t* tg, int64_t T, float* L, float* lp,
                                            float* en) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  L[t] = float(double(L[t]) + log(double(S[t])));
  if (lp) lp[t] = tg[t] >= 0 ? float(double(S[2 * T + t]) - double(L[t])) : 0.f;
  if (en) en[t] = float(double(L[t]) - double(S[T + t]) / double(S[t]));
}

__global__ void vocab_grad_kernel(const void* logits, FloatKind k, const int32_t* tg, int64_t vocab_start,
                                  int64_t n_real, int64_t V, const float* L, const float* dl, const float* de,
                                  const float* H, float* out) {
  const int64_t t = blockIdx.x;
  const double g = tg[t] >= 0 ? double(dl[t]) : 0.0;
  const double ge = de ? double(de[t]) : 0.0, h = de ? double(H[t]) : 0.0;
  const int64_t local = int64_t(tg[t]) - vocab_start;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    if (v >= n_real) {
      out[t * V + v] = 0.f;  // padding columns: not in the softmax
      continue;
    }
    const double logp = double(ld(logits, k, t * V + v)) - double(L[t]);
    const double p = exp(logp);
    double r = -g * p;
    if (de) r += ge * (-p * (logp + h));
    if (v == local && tg[t] >= 0) r += g;
    out[t * V + v] = float(r);
  }
}

}  // namespace

void logprob_entropy_fwd(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V, float* logprob,
                         float* entropy, float* lse, void* stream) {
  if (T > 0)
    KS_LAUNCH(logprob_entropy_fwd_kernel, unsigned(T), kThreads, as_stream(stream))(logits, k, targets, V, logprob,
                                                                               entropy, lse);
}

void logprob_entropy_bwd(const void* logits, FloatKind ki, const int32_t* targets, const float* lse,
                         const float* coef_logprob, const float* coef_entropy, int64_t T, int64_t V, void* dlogits,
                         FloatKind ko, void* stream) {
  if (T > 0)
    KS_LAUNCH(logprob_entropy_bwd_kernel, unsigned(T), kThreads, as_stream(stream))(logits, ki, targets, lse, coef_logprob,
                                                                               coef_entropy, V, dlogits, ko);
}

void vocab_row_max(const void* logits, FloatKind k, int64_t T, int64_t V, int64_t n_real, float* row_max,
                   void* stream) {
  if (T > 0) KS_LAUNCH(vocab_row_max_kernel, unsigned(T), kThreads, as_stream(stream))(logits, k, V, n_real, row_max);
}

void vocab_row_sums(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V, int64_t vocab_start,
                    int64_t n_real, const float* row_max, float* sums, void* stream) {
  if (T > 0)
    KS_LAUNCH(vocab_row_sums_kernel, unsigned(T), kThreads, as_stream(stream))(logits, k, targets, V, vocab_start, n_real,
                                                                          row_max, sums, T);
}

void vocab_softmax_finish(const float* sums, const int32_t* targets, int64_t T, float* lse, float* logprob,
                          float* entropy, void* stream) {
  if (T > 0)
    KS_LAUNCH(vocab_softmax_finish_kernel, unsigned((T + kThreads - 1) / kThreads), kThreads, as_stream(stream))(
        sums, targets, T, lse, logprob, entropy);
}

void vocab_logprob_entropy_grad(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V,
                                int64_t vocab_start, int64_t n_real, const float* lse, const float* dlogprob,
                                const float* dentropy, const float* entropy, float* dlogits, void* stream) {
  if (T > 0)
    KS_LAUNCH(vocab_grad_kernel, unsigned(T), kThreads, as_stream(stream))(logits, k, targets, vocab_start, n_real, V, lse,
                                                                      dlogprob, dentropy, entropy, dlogits);
}

}  // namespace kestrel::cuda::launch
