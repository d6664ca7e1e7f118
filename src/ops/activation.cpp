// ops::swiglu: argument checks and device dispatch.
#include "ops/activation.h"

#include "backend/cpu/dense_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {
constexpr Kernels<decltype(cpu::swiglu_fwd)> kSwigluFwd{.cpu = cpu::swiglu_fwd KS_CUDA_KERNEL(cuda::swiglu_fwd)};
constexpr Kernels<decltype(cpu::swiglu_bwd)> kSwigluBwd{.cpu = cpu::swiglu_bwd KS_CUDA_KERNEL(cuda::swiglu_bwd)};
}  // namespace

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h) {
  const char* op = "swiglu_fwd";
  check_float(op, "gate", gate);
  check_shape(op, "gate", gate, {-1, -1});
  const int64_t T = gate.size(0), F = gate.size(1);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"up", &up}, {"h", &h}}) {
    check_float(op, name, *t);
    check_same_dtype(op, name, *t, "gate", gate);
    check_shape(op, name, *t, {T, F});
  }
  check_no_partial_alias(op, "h", h, "gate", gate);
  check_no_partial_alias(op, "h", h, "up", up);
  dispatch(op, kSwigluFwd, {&gate, &up, &h}, gate, up, h);
}

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup) {
  const char* op = "swiglu_bwd";
  check_float(op, "gate", gate);
  check_shape(op, "gate", gate, {-1, -1});
  const int64_t T = gate.size(0), F = gate.size(1);
  check_float(op, "up", up);
  check_same_dtype(op, "up", up, "gate", gate);
  check_shape(op, "up", up, {T, F});
  // Gradients share one dtype, which may be f32 under bf16 activations.
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dh", &dh}, {"dgate", &dgate}, {"dup", &dup}}) {
    check_float(op, name, *t);
    check_same_dtype(op, name, *t, "dh", dh);
    check_shape(op, name, *t, {T, F});
  }
  if (same_buffer(dgate, dup)) KS_FAIL("ops::", op, ": dgate and dup must be different buffers");
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up}, {"dh", &dh}}) {
    check_no_partial_alias(op, "dgate", dgate, name, *t);
    check_no_partial_alias(op, "dup", dup, name, *t);
  }
  check_no_partial_alias(op, "dgate", dgate, "dup", dup);
  dispatch(op, kSwigluBwd, {&gate, &up, &dh, &dgate, &dup}, gate, up, dh, dgate, dup);
}

}  // namespace kestrel::ops
