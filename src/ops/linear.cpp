// ops::linear / add: argument checks and device dispatch.
#include "ops/linear.h"

#include "backend/cpu/dense_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {
constexpr Kernels<decltype(cpu::linear_fwd)> kLinearFwd{.cpu = cpu::linear_fwd KS_CUDA_KERNEL(cuda::linear_fwd)};
constexpr Kernels<decltype(cpu::linear_bwd)> kLinearBwd{.cpu = cpu::linear_bwd KS_CUDA_KERNEL(cuda::linear_bwd)};
constexpr Kernels<decltype(cpu::add)> kAdd{.cpu = cpu::add KS_CUDA_KERNEL(cuda::add)};
}  // namespace

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_fwd";
  check_float(op, "x", x);
  check_float(op, "w", w);
  check_float(op, "y", y);
  check_shape(op, "x", x, {-1, -1});
  const int64_t T = x.size(0), in = x.size(1);
  check_shape(op, "w", w, {-1, in});
  const int64_t out = w.size(0);
  if (b) {
    check_float(op, "b", *b);
    check_shape(op, "b", *b, {out});
  }
  check_shape(op, "y", y, {T, out});
  check_no_partial_alias(op, "y", y, "x", x);
  if (same_buffer(y, x)) KS_FAIL("ops::", op, ": y must not alias x (the GEMM reads x while writing y)");
  dispatch(op, kLinearFwd, {&x, &w, b, &y}, x, w, b, y);
}

void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx) {
  const char* op = "linear_bwd";
  check_float(op, "dy", dy);
  check_float(op, "w", w);
  check_shape(op, "dy", dy, {-1, -1});
  const int64_t T = dy.size(0), out = dy.size(1);
  check_shape(op, "w", w, {out, -1});
  const int64_t in = w.size(1);
  if (dx) {
    check_float(op, "dx", *dx);
    check_shape(op, "dx", *dx, {T, in});
    if (same_buffer(*dx, dy)) KS_FAIL("ops::", op, ": dx must not alias dy");
    if (accumulate_dx && dx->dtype() != DType::F32)
      KS_FAIL("ops::", op, ": accumulate_dx needs an f32 dx (got ", dx->describe(), "): sums are kept in f32");
  }
  if (dw) {
    check_float(op, "x", x);
    check_shape(op, "x", x, {T, in});
    check_dtype(op, "dw", *dw, DType::F32);
    check_shape(op, "dw", *dw, {out, in});
  }
  if (db) {
    check_dtype(op, "db", *db, DType::F32);
    check_shape(op, "db", *db, {out});
  }
  dispatch(op, kLinearBwd, {&x, &w, &dy, dx, dw, db}, x, w, dy, dx, dw, db, accumulate_dx);
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  const char* op = "add";
  check_float(op, "a", a);
  check_float(op, "b", b);
  check_float(op, "y", y);
  if (a.shape() != b.shape() || a.shape() != y.shape())
    KS_FAIL("ops::", op, ": shapes must match, got a ", a.describe(), ", b ", b.describe(), ", y ", y.describe());
  check_no_partial_alias(op, "y", y, "a", a);
  check_no_partial_alias(op, "y", y, "b", b);
  dispatch(op, kAdd, {&a, &b, &y}, a, b, y);
}

void add_inplace(Tensor& y, const Tensor& x) { add(y, x, y); }

}  // namespace kestrel::ops
