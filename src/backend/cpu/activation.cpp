// SwiGLU (silu(gate) * up) forward/backward on the CPU, elementwise over the
// packed [T, F] buffers, kW lanes at a time (kernel_util.h's simd) with the
// lane-wise exp.
#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

namespace {

using simd::kW;
using simd::vf;

// h = silu(gate) * up over [i0, i1). h may be gate's or up's buffer: each
// vector is loaded before the same lanes are stored.
template <class T>
void swiglu_fwd_range(const T* g, const T* u, T* h, int64_t i0, int64_t i1) {
  const auto f = [](vf x, vf up) {
    // HF: act_fn(gate) is a tensor of the activation dtype, then * up.
    return simd::round_to<T>(x / (1.f + simd::exp(-x))) * up;
  };
  int64_t i = i0;
  for (; i + kW <= i1; i += kW) simd::store(h + i, f(simd::load(g + i), simd::load(u + i)));
  if (const int64_t n = i1 - i; n > 0) simd::store_part(h + i, n, f(simd::load_part(g + i, n), simd::load_part(u + i, n)));
}

template <class T, class G>
void swiglu_bwd_range(const T* g, const T* u, const G* dh, G* dg, G* du, int64_t i0, int64_t i1) {
  const auto f = [](vf x, vf y, vf d, vf& dgv, vf& duv) {
    const vf e1 = 1.f + simd::exp(-x);
    const vf s = 1.f / e1;
    // d silu / dx = s * (1 + x * (1 - s)); up's grad uses silu as the forward stored it.
    dgv = d * y * (s * (1.f + x * (1.f - s)));
    duv = d * simd::round_to<T>(x / e1);
  };
  int64_t i = i0;
  vf a, b;
  for (; i + kW <= i1; i += kW) {
    f(simd::load(g + i), simd::load(u + i), simd::load(dh + i), a, b);
    simd::store(dg + i, a);
    simd::store(du + i, b);
  }
  if (const int64_t n = i1 - i; n > 0) {
    f(simd::load_part(g + i, n), simd::load_part(u + i, n), simd::load_part(dh + i, n), a, b);
    simd::store_part(dg + i, n, a);
    simd::store_part(du + i, n, b);
  }
}

}  // namespace

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h) {
  dispatch_float(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);  // gate, up, h share one dtype (checked by the caller)
    const T* g = ptr<const T>(gate);
    const T* u = ptr<const T>(up);
    T* hp = ptr<T>(h);
    parallel_blocks(h.numel(), 8, [&](int64_t i0, int64_t i1) { swiglu_fwd_range(g, u, hp, i0, i1); });
  });
}

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup) {
  dispatch_float(gate.dtype(), [&](auto tag) {
    dispatch_float(dh.dtype(), [&](auto gtag) {
      using T = decltype(tag);
      using G = decltype(gtag);  // gradient storage: f32, or T
      const T* g = ptr<const T>(gate);
      const T* u = ptr<const T>(up);
      const G* dhp = ptr<const G>(dh);
      G* dg = ptr<G>(dgate);
      G* du = ptr<G>(dup);
      parallel_blocks(gate.numel(), 8, [&](int64_t i0, int64_t i1) { swiglu_bwd_range(g, u, dhp, dg, du, i0, i1); });
    });
  });
}

}  // namespace kestrel::cpu
