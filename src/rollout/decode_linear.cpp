#if defined(__GNUC__) && !defined(__clang__)
// As in backend/cpu/linear.cpp: vectorise the `omp simd` reductions at -O2.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "rollout/decode_linear.h"

#include <omp.h>

#include <algorithm>

#include "ops/linear.h"

namespace kestrel::rollout {

namespace {

// Four weight rows at a time: four independent accumulators per input row
// hide the FMA latency; the rows stay in L1 while every input row uses them.
void skinny(const float* x, const float* w, const float* b, float* y, int64_t T, int64_t in, int64_t out) {
  const int64_t nblk = (out + 3) / 4;
  const bool par = out * in >= (int64_t(1) << 16) && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t n0 = blk * 4, nn = std::min<int64_t>(4, out - n0);
    const float* w0 = w + n0 * in;
    const float* w1 = w0 + (nn > 1 ? in : 0);
    const float* w2 = w0 + (nn > 2 ? 2 * in : 0);
    const float* w3 = w0 + (nn > 3 ? 3 * in : 0);
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * in;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < in; ++k) {
        s0 += xr[k] * w0[k];
        s1 += xr[k] * w1[k];
        s2 += xr[k] * w2[k];
        s3 += xr[k] * w3[k];
      }
      const float s[4] = {s0, s1, s2, s3};
      for (int64_t j = 0; j < nn; ++j) y[t * out + n0 + j] = s[j] + (b ? b[n0 + j] : 0.f);
    }
  }
}

}  // namespace

void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const bool f32 = x.dtype() == DType::F32 && w.dtype() == DType::F32 && y.dtype() == DType::F32 &&
                   (!b || b->dtype() == DType::F32);
  const bool shapes = x.dim() == 2 && w.dim() == 2 && y.dim() == 2 && x.size(1) == w.size(1) &&
                      y.size(0) == x.size(0) && y.size(1) == w.size(0) && (!b || b->numel() == w.size(0));
  const bool cpu = x.device() == Device::CPU && w.device() == Device::CPU && y.device() == Device::CPU;
  if (!f32 || !shapes || !cpu || x.size(0) == 0 || x.size(0) > kSkinnyRows) {
    ops::linear_fwd(x, w, b, y);  // also reports bad arguments
    return;
  }
  skinny(x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr, y.data<float>(), x.size(0), x.size(1),
         w.size(0));
}

}  // namespace kestrel::rollout
