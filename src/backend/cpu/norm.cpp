#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// RMSNorm forward/backward on the CPU: one row per iteration, rows split
// across threads; the weight gradient is a column-split second pass.
#include <cmath>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  const int64_t N = x.size(0), D = x.size(1);
  float* rp = ptr<float>(rstd);
  dispatch_float(x.dtype(), [&](auto tx) {
    dispatch_float(w.dtype(), [&](auto tw) {
      using TX = decltype(tx);
      using TW = decltype(tw);
      using TY = TX;  // activations share one dtype (checked by the caller)
      const TX* xp = ptr<const TX>(x);
      const TW* wp = ptr<const TW>(w);
      TY* yp = ptr<TY>(y);
      parallel_blocks(N, D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TX* xr = xp + r * D;
          float ss = 0.f;
#pragma omp simd reduction(+ : ss)
          for (int64_t d = 0; d < D; ++d) {
            const float v = load_f32(xr, d);
            ss += v * v;
          }
          const float rs = 1.f / std::sqrt(ss / float(D) + eps);
          rp[r] = rs;
          TY* yr = yp + r * D;
          // HF rounds x * rstd to the input dtype before the weight multiply.
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) store_f32(yr, d, load_f32(wp, d) * round_to<TX>(load_f32(xr, d) * rs));
        }
      });
    });
  });
}

void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const int64_t N = x.size(0), D = x.size(1);
  const float* rp = ptr<const float>(rstd);
  float* dwp = ptr<float>(dw);
  dispatch_float(x.dtype(), [&](auto tx) {
   dispatch_float(dy.dtype(), [&](auto tg) {
    dispatch_float(w.dtype(), [&](auto tw) {
      using TX = decltype(tx);
      using TW = decltype(tw);
      using TG = decltype(tg);  // gradients share one dtype, f32 or the activations' (checked by the caller)
      using TDX = TG;
      const TX* xp = ptr<const TX>(x);
      const TW* wp = ptr<const TW>(w);
      const TG* gp = ptr<const TG>(dy);
      TDX* dxp = ptr<TDX>(dx);
      // dw first: dx may alias dy (then dy is gone after the row pass).
      // Columns split across threads, rows summed in order.
      parallel_blocks(D, N, [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < N; ++r) {
          const TX* xr = xp + r * D;
          const TG* gr = gp + r * D;
          const float rs = rp[r];
#pragma omp simd
          for (int64_t d = c0; d < c1; ++d) dwp[d] += load_f32(gr, d) * (load_f32(xr, d) * rs);
        }
      });
      parallel_blocks(N, D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TX* xr = xp + r * D;
          const TG* gr = gp + r * D;
          const float rs = rp[r];
          // dx = rstd * (g - n * mean(g . n)), g = dy * w, n = x * rstd.
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += load_f32(gr, d) * load_f32(wp, d) * (load_f32(xr, d) * rs);
          const float c = dot / float(D);
          TDX* dr = dxp + r * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) {
            const float g = load_f32(gr, d) * load_f32(wp, d);
            store_f32(dr, d, rs * (g - load_f32(xr, d) * rs * c));
          }
        }
      });
    });
   });
  });
}

}  // namespace kestrel::cpu
