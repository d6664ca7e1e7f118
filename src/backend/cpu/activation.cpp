#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// SwiGLU (silu(gate) * up) forward/backward on the CPU, elementwise over the
// packed [T, F] buffers with a vectorised exp.
#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h) {
  dispatch_float(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);  // gate, up, h share one dtype (checked by the caller)
    const T* g = ptr<const T>(gate);
    const T* u = ptr<const T>(up);
    T* hp = ptr<T>(h);
    parallel_blocks(h.numel(), 8, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const float x = load_f32(g, i);
        // HF: act_fn(gate) is a tensor of the activation dtype, then * up.
        const float silu = round_to<T>(x / (1.f + exp_f32(-x)));
        store_f32(hp, i, silu * load_f32(u, i));
      }
    });
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
    parallel_blocks(gate.numel(), 8, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const float x = load_f32(g, i), y = load_f32(u, i), d = load_f32(dhp, i);
        const float e1 = 1.f + exp_f32(-x);
        const float s = 1.f / e1;
        // d silu / dx = s * (1 + x * (1 - s)); up's grad uses silu as the forward stored it.
        store_f32(dg, i, d * y * (s * (1.f + x * (1.f - s))));
        store_f32(du, i, d * round_to<T>(x / e1));
      }
    });
   });
  });
}

}  // namespace kestrel::cpu
