#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// linear (x @ W^T + b) and the residual add on the CPU. bf16 operands are
// widened to f32 scratch, multiplied by the f32 BLAS, and rounded once on output.
// The conversions, bias column sums and add are compiled per ISA level
// (linear_isa.inc, isa.h).
#include <cstring>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/linear_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

Tensor f32_view(const Tensor& t) { return KESTREL_ISA_CALL(f32_view, t); }

void store_from_f32(const float* src, Tensor& dst) { KESTREL_ISA_CALL(store_from_f32, src, dst); }

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t T = x.size(0), in = x.size(1), out = w.size(0);
  const Tensor xf = f32_view(x), wf = f32_view(w);
  // [T, out] f32 accumulator: y itself when f32, else scratch rounded at the end.
  Tensor yf = y.dtype() == DType::F32 ? y : Tensor::empty({T, out}, DType::F32, MemCategory::Activations);
  float* yp = ptr<float>(yf);
  float beta = 0.f;
  if (b) {
    // Seed every row with the bias and let the GEMM accumulate onto it (beta = 1).
    const Tensor bf = f32_view(*b);
    const float* bp = ptr<const float>(bf);
    parallel_blocks(T, out, [&](int64_t r0, int64_t r1) {
      for (int64_t t = r0; t < r1; ++t) std::memcpy(yp + t * out, bp, size_t(out) * 4);
    });
    beta = 1.f;
  }
  sgemm(false, true, T, out, in, 1.f, ptr<const float>(xf), in, ptr<const float>(wf), in, beta, yp, out);
  if (y.dtype() != DType::F32) store_from_f32(yp, y);
}

void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx) {
  const int64_t T = dy.size(0), out = dy.size(1), in = w.size(1);
  const Tensor dyf = f32_view(dy);
  const float* dyp = ptr<const float>(dyf);
  if (dx) {
    const Tensor wf = f32_view(w);
    // accumulate_dx: an f32 dx (ops::linear_bwd checks), summed by the GEMM
    // itself (beta = 1): no zeroing pass over dx and no separate add.
    Tensor dxf = dx->dtype() == DType::F32 ? *dx : Tensor::empty({T, in}, DType::F32, MemCategory::Activations);
    sgemm(false, false, T, in, out, 1.f, dyp, out, ptr<const float>(wf), in, accumulate_dx ? 1.f : 0.f,
          ptr<float>(dxf), in);
    if (dx->dtype() != DType::F32) store_from_f32(ptr<const float>(dxf), *dx);
  }
  if (dw) {
    const Tensor xf = f32_view(x);
    sgemm(true, false, out, in, T, 1.f, dyp, out, ptr<const float>(xf), in, 1.f, ptr<float>(*dw), in);
  }
  if (db) KESTREL_ISA_CALL(bias_grad, dyp, T, out, ptr<float>(*db));
}

void add(const Tensor& a, const Tensor& b, Tensor& y) { KESTREL_ISA_CALL(add, a, b, y); }

}  // namespace kestrel::cpu
