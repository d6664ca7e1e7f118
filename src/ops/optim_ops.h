// Ops of the optimizer and of gradient clipping / data-parallel scaling:
//   adamw_step    torch.optim.AdamW over a flat f32 range (+ the model-copy refresh)
//   sum_squares   sum of g^2 of an f32 tensor, in double (grad-norm clipping)
//   scale_        x *= c in place (clip coefficient, DP averaging)
// Scalar references in ops/ref/optim_ref.h, CPU kernels in
// backend/cpu/optim_kernels.h.
//
// Header-only (inline) because src/optim links kestrel_comm and kestrel_io but
// not kestrel_ops (CMakeLists.txt): once it links kestrel_ops these bodies move
// unchanged to ops/optim_ops.cpp and backend/cpu/optim_kernels.cpp.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/adamw_scalars.h"
#include "backend/cpu/optim_kernels.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/optim_ops.h"
#endif
#include "core/tensor.h"
#include "ops/op_checks.h"

namespace kestrel::ops {

// The per-step scalars (backend/adamw_scalars.h, shared by every backend).
using kestrel::AdamWScalars;

// One AdamW step over a flat range, per element k:
//   p <- p * decay_keep                        (if s.decay)
//   m <- m + (1 - beta1) * (g - m)             (torch.lerp, one fma)
//   v <- beta2 * v + (1 - beta2) * g * g       (one fma)
//   p <- p + neg_step * m / (sqrt(v) / bc2_sqrt + eps)
// master, exp_avg, exp_avg_sq, grad: f32 [n]. model_copy (optional): bf16,
// f16 or f32 [n], written with the rounded (round-to-nearest-even) new master;
// an f32 model copy that is the master itself is left alone.
inline void adamw_step(const AdamWScalars& s, Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                       Tensor* model_copy) {
  using namespace detail;
  const char* op = "adamw_step";
  check_dtype(op, "master", master, DType::F32);
  check_shape(op, "master", master, {-1});
  const int64_t n = master.numel();
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq},
                         {"grad", &grad}}) {
    check_dtype(op, name, *t, DType::F32);
    check_shape(op, name, *t, {n});
  }
  Tensor* copy = model_copy && !same_buffer(*model_copy, master) ? model_copy : nullptr;
  if (copy) {
    check_defined(op, "model_copy", *copy);
    if (copy->dtype() != DType::BF16 && copy->dtype() != DType::F16 && copy->dtype() != DType::F32)
      KS_FAIL("ops::", op, ": model_copy must be bf16, f16 or f32, got ", copy->describe());
    check_shape(op, "model_copy", *copy, {n});
  }
  constexpr Kernels<decltype(cpu::adamw_step)> k{.cpu = cpu::adamw_step KS_CUDA_KERNEL(cuda::adamw_step)};
  dispatch(op, k, {&master, &exp_avg, &exp_avg_sq, &grad, copy}, s, master, exp_avg, exp_avg_sq, grad, copy);
}

// sum over x of double(x)^2. The CPU kernel sums 4096-element chunks in
// element order and adds the chunk sums in order: the result does not depend
// on the thread count.
inline double sum_squares(const Tensor& x) {
  using namespace detail;
  check_dtype("sum_squares", "x", x, DType::F32);
  constexpr Kernels<decltype(cpu::sum_squares)> k{.cpu = cpu::sum_squares KS_CUDA_KERNEL(cuda::sum_squares)};
  return dispatch("sum_squares", k, {&x}, x);
}

// x *= c elementwise (f32 product, as torch multiplies f32 grads by an f32 coefficient).
inline void scale_(Tensor& x, float c) {
  using namespace detail;
  check_dtype("scale_", "x", x, DType::F32);
  constexpr Kernels<decltype(cpu::scale_)> k{.cpu = cpu::scale_ KS_CUDA_KERNEL(cuda::scale_)};
  dispatch("scale_", k, {&x}, x, c);
}

}  // namespace kestrel::ops
