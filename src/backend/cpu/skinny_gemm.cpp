#if defined(__GNUC__) && !defined(__clang__)
// as_f32's `omp simd` loop vectorises only with the dynamic cost model at
// -O2 (as in linear.cpp).
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "backend/cpu/skinny_gemm.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/skinny_gemm_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

namespace {

// f32 copies of bf16 inputs and biases, kept per thread so a decode step
// allocates nothing after the first call.
const float* as_f32(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::F32) return ptr<const float>(t);
  scratch.resize(size_t(t.numel()));
  const bf16_bits* src = ptr<const bf16_bits>(t);
  float* dst = scratch.data();
  const int64_t n = t.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(src, i);
  return dst;
}

bool float_dtype(DType d) { return d == DType::F32 || d == DType::BF16; }

}  // namespace


bool skinny_linear_applies(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
  if (!x.defined() || !w.defined() || !y.defined() || (b && !b->defined())) return false;
  if (!float_dtype(x.dtype()) || !float_dtype(w.dtype()) || !float_dtype(y.dtype()) || (b && !float_dtype(b->dtype())))
    return false;
  if (x.device() != Device::CPU || w.device() != Device::CPU || y.device() != Device::CPU ||
      (b && b->device() != Device::CPU))
    return false;
  if (x.dim() != 2 || w.dim() != 2 || y.dim() != 2) return false;
  const int64_t M = x.size(0);
  return M >= 1 && M <= kSkinnyMaxRows && x.size(1) == w.size(1) && y.size(0) == M && y.size(1) == w.size(0) &&
         (!b || b->numel() == w.size(0));
}

void skinny_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  KS_CHECK(skinny_linear_applies(x, w, b, y), "skinny_linear: needs CPU f32/bf16 x[M, in] with 1 <= M <= ",
           kSkinnyMaxRows, ", w[out, in], b[out], y[M, out]; got x", shape_str(x.shape()), " w",
           shape_str(w.shape()), " y", shape_str(y.shape()), " (use ops::linear_fwd for other cases)");
  const int64_t M = x.size(0), in = x.size(1), out = w.size(0);
  thread_local std::vector<float> x_scratch, b_scratch;
  const float* xp = as_f32(x, x_scratch);  // [M, in]
  const float* bp = b ? as_f32(*b, b_scratch) : nullptr;
  // Split the output rows across the team: each thread streams its own
  // contiguous slice of the weights.
  const bool par = !omp_in_parallel() && out >= 16 && worth_parallel(out * in);
  KESTREL_ISA_CALL(skinny_rows, xp, bp, w, y, M, in, out, par);
}

}  // namespace kestrel::cpu
