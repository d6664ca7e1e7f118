#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// linear (x @ W^T + b) and the residual add on the CPU. bf16 operands are
// widened to f32 scratch, multiplied by the f32 BLAS, and rounded once on output.
#include <cstring>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

Tensor f32_view(const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  Tensor out = Tensor::empty(t.shape(), DType::F32, MemCategory::Activations);
  float* dst = ptr<float>(out);
  dispatch_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = ptr<const T>(t);
    parallel_blocks(t.numel(), 1, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) dst[i] = load_f32(src, i);
    });
  });
  return out;
}

void store_from_f32(const float* src, Tensor& dst) {
  dispatch_float(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* d = ptr<T>(dst);
    if constexpr (std::is_same_v<T, float>) {
      if (d == src) return;
    }
    parallel_blocks(dst.numel(), 1, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) store_f32(d, i, src[i]);
    });
  });
}

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

void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db) {
  const int64_t T = dy.size(0), out = dy.size(1), in = w.size(1);
  const Tensor dyf = f32_view(dy);
  const float* dyp = ptr<const float>(dyf);
  if (dx) {
    const Tensor wf = f32_view(w);
    Tensor dxf = dx->dtype() == DType::F32 ? *dx : Tensor::empty({T, in}, DType::F32, MemCategory::Activations);
    sgemm(false, false, T, in, out, 1.f, dyp, out, ptr<const float>(wf), in, 0.f, ptr<float>(dxf), in);
    if (dx->dtype() != DType::F32) store_from_f32(ptr<const float>(dxf), *dx);
  }
  if (dw) {
    const Tensor xf = f32_view(x);
    sgemm(true, false, out, in, T, 1.f, dyp, out, ptr<const float>(xf), in, 1.f, ptr<float>(*dw), in);
  }
  if (db) {
    // Column sums, threads split the columns: each column is summed over t in
    // order, so the result does not depend on the thread count.
    float* dbp = ptr<float>(*db);
    parallel_blocks(out, T, [&](int64_t c0, int64_t c1) {
      constexpr int64_t kChunk = 256;
      float acc[kChunk];
      for (int64_t j0 = c0; j0 < c1; j0 += kChunk) {
        const int64_t n = std::min(kChunk, c1 - j0);
        for (int64_t j = 0; j < n; ++j) acc[j] = 0.f;
        for (int64_t t = 0; t < T; ++t) {
          const float* row = dyp + t * out + j0;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) acc[j] += row[j];
        }
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) dbp[j0 + j] += acc[j];
      }
    });
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  dispatch_float(a.dtype(), [&](auto ta) {
    dispatch_float(b.dtype(), [&](auto tb) {
      dispatch_float(y.dtype(), [&](auto ty) {
        using A = decltype(ta);
        using B = decltype(tb);
        using Y = decltype(ty);
        const A* ap = ptr<const A>(a);
        const B* bp = ptr<const B>(b);
        Y* yp = ptr<Y>(y);
        // y may alias a or b: each element is read before it is written.
        parallel_blocks(y.numel(), 1, [&](int64_t i0, int64_t i1) {
#pragma omp simd
          for (int64_t i = i0; i < i1; ++i) store_f32(yp, i, load_f32(ap, i) + load_f32(bp, i));
        });
      });
    });
  });
}

}  // namespace kestrel::cpu
