// ops::rmsnorm: argument checks and device dispatch.
#include "ops/norm.h"

#include <cmath>

#include "backend/cpu/dense_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {
constexpr Kernels<decltype(cpu::rmsnorm_fwd)> kRmsnormFwd{.cpu = cpu::rmsnorm_fwd KS_CUDA_KERNEL(cuda::rmsnorm_fwd)};
constexpr Kernels<decltype(cpu::rmsnorm_bwd)> kRmsnormBwd{.cpu = cpu::rmsnorm_bwd KS_CUDA_KERNEL(cuda::rmsnorm_bwd)};
}  // namespace

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_fwd";
  check_float(op, "x", x);
  check_shape(op, "x", x, {-1, -1});
  const int64_t N = x.size(0), D = x.size(1);
  check_float(op, "w", w);
  check_shape(op, "w", w, {D});
  check_float(op, "y", y);
  check_same_dtype(op, "y", y, "x", x);
  check_shape(op, "y", y, {N, D});
  check_dtype(op, "rstd", rstd, DType::F32);
  check_shape(op, "rstd", rstd, {N});
  check_no_partial_alias(op, "y", y, "x", x);
  if (!(eps >= 0.f) || !std::isfinite(eps)) KS_FAIL("ops::", op, ": eps must be finite and >= 0, got ", eps);
  dispatch(op, kRmsnormFwd, {&x, &w, &y, &rstd}, x, w, eps, y, rstd);
}

void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const char* op = "rmsnorm_bwd";
  check_float(op, "x", x);
  check_shape(op, "x", x, {-1, -1});
  const int64_t N = x.size(0), D = x.size(1);
  check_float(op, "w", w);
  check_shape(op, "w", w, {D});
  check_dtype(op, "rstd", rstd, DType::F32);
  check_shape(op, "rstd", rstd, {N});
  check_float(op, "dy", dy);
  check_shape(op, "dy", dy, {N, D});
  check_float(op, "dx", dx);
  // Gradients share one dtype, which may be f32 under bf16 activations.
  check_same_dtype(op, "dx", dx, "dy", dy);
  check_shape(op, "dx", dx, {N, D});
  check_dtype(op, "dw", dw, DType::F32);
  check_shape(op, "dw", dw, {D});
  check_no_partial_alias(op, "dx", dx, "dy", dy);
  check_no_partial_alias(op, "dx", dx, "x", x);
  dispatch(op, kRmsnormBwd, {&x, &w, &rstd, &dy, &dx, &dw}, x, w, rstd, dy, dx, dw);
}

}  // namespace kestrel::ops
