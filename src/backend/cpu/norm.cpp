// RMSNorm forward/backward on the CPU: one row per iteration, rows split
// across threads, kW-lane vectors along the row (kernel_util.h's simd); the
// weight gradient is a column-split second pass.
#include <cmath>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

namespace {

using simd::kW;
using simd::vf;

// sum_d f(d, n) over [0, D) in kW-lane chunks; f returns the lanes' terms,
// and must give 0 in lanes >= n (zero-padded loads do).
template <class F>
float row_sum(int64_t D, F&& f) {
  vf acc{};
  int64_t d = 0;
  for (; d + kW <= D; d += kW) acc += f(d, kW);
  if (d < D) acc += f(d, D - d);
  return simd::hsum(acc);
}

// p[d0:d1] chunk at d: a full vector, or the zero-padded tail.
template <class T>
inline vf load_n(const T* p, int64_t n) {
  return n == kW ? simd::load(p) : simd::load_part(p, n);
}
template <class T>
inline void store_n(T* p, int64_t n, vf v) {
  if (n == kW)
    simd::store(p, v);
  else
    simd::store_part(p, n, v);
}
// Calls f(d, n) for the chunks of [d0, d1).
template <class F>
inline void for_chunks(int64_t d0, int64_t d1, F&& f) {
  int64_t d = d0;
  for (; d + kW <= d1; d += kW) f(d, kW);
  if (d < d1) f(d, d1 - d);
}

}  // namespace

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
          const float ss = row_sum(D, [&](int64_t d, int64_t n) {
            const vf v = load_n(xr + d, n);
            return v * v;
          });
          const float rs = 1.f / std::sqrt(ss / float(D) + eps);
          rp[r] = rs;
          TY* yr = yp + r * D;
          // HF rounds x * rstd to the input dtype before the weight multiply.
          // y may be x: each chunk is loaded before it is stored.
          for_chunks(0, D, [&](int64_t d, int64_t n) {
            store_n(yr + d, n, load_n(wp + d, n) * simd::round_to<TX>(load_n(xr + d, n) * rs));
          });
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
          for_chunks(c0, c1, [&](int64_t d, int64_t n) {
            store_n(dwp + d, n, load_n(dwp + d, n) + load_n(gr + d, n) * (load_n(xr + d, n) * rs));
          });
        }
      });
      parallel_blocks(N, D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TX* xr = xp + r * D;
          const TG* gr = gp + r * D;
          const float rs = rp[r];
          // dx = rstd * (g - n * mean(g . n)), g = dy * w, n = x * rstd.
          const float dot = row_sum(D, [&](int64_t d, int64_t n) {
            return load_n(gr + d, n) * load_n(wp + d, n) * (load_n(xr + d, n) * rs);
          });
          const float c = dot / float(D);
          TDX* dr = dxp + r * D;
          for_chunks(0, D, [&](int64_t d, int64_t n) {
            const vf g = load_n(gr + d, n) * load_n(wp + d, n);
            store_n(dr + d, n, rs * (g - load_n(xr + d, n) * rs * c));
          });
        }
      });
    });
   });
  });
}

}  // namespace kestrel::cpu
