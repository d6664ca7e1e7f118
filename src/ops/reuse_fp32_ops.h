// Ops of reuse_fp32_param (MindSpeed's "BF16 parameter copy reuse"): an f32
// master held as its bf16 model copy (high half) plus a 16-bit residual (low
// half), with the one extra bit an exact round-to-nearest-even split needs in
// bit 31 of the element's exp_avg_sq (backend/cpu/reuse_fp32_kernels.h has
// the encoding and why the bit is needed).
//   adamw_step_reuse_fp32  one AdamW step on (copy, residual): bit-identical to
//                          ops::adamw_step on the f32 master with the copy refreshed
//   reuse_fp32_split       f32 master -> (copy, residual, flags): seeding from a checkpoint
//   reuse_fp32_recover     (copy, residual, flags) -> f32 master (and v without flags):
//                          saving, checks, tests
// The residual is a BF16-typed tensor used as 16-bit storage (its bits are
// the master's low half, not a bf16 value).
//
// Header-only (inline) for the reason ops/optim_ops.h is: src/optim does not
// link kestrel_ops yet.
#pragma once
#include <cstdint>

#include "backend/adamw_scalars.h"
#include "backend/cpu/reuse_fp32_kernels.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/optim_ops.h"
#endif
#include "core/tensor.h"
#include "ops/op_checks.h"

namespace kestrel::ops {

namespace detail {
inline void check_reuse_args(const char* op, const Tensor& copy, const Tensor& residual, const Tensor& v) {
  check_dtype(op, "copy", copy, DType::BF16);
  check_shape(op, "copy", copy, {-1});
  const int64_t n = copy.numel();
  check_dtype(op, "residual", residual, DType::BF16);
  check_shape(op, "residual", residual, {n});
  check_dtype(op, "exp_avg_sq", v, DType::F32);
  check_shape(op, "exp_avg_sq", v, {n});
}
}  // namespace detail

// copy: bf16 [n] (the model's weights), residual: 16-bit [n], exp_avg,
// exp_avg_sq, grad: f32 [n]. Recovers each master, steps it as
// ops::adamw_step does, and splits it back (the copy = RNE of the new master).
inline void adamw_step_reuse_fp32(const AdamWScalars& s, Tensor& copy, Tensor& residual, Tensor& exp_avg,
                                  Tensor& exp_avg_sq, const Tensor& grad) {
  using namespace detail;
  const char* op = "adamw_step_reuse_fp32";
  check_reuse_args(op, copy, residual, exp_avg_sq);
  const int64_t n = copy.numel();
  check_dtype(op, "exp_avg", exp_avg, DType::F32);
  check_shape(op, "exp_avg", exp_avg, {n});
  check_dtype(op, "grad", grad, DType::F32);
  check_shape(op, "grad", grad, {n});
  constexpr Kernels<decltype(cpu::adamw_step_reuse_fp32)> k{.cpu = cpu::adamw_step_reuse_fp32 KS_CUDA_KERNEL(cuda::adamw_step_reuse_fp32)};
  dispatch(op, k, {&copy, &residual, &exp_avg, &exp_avg_sq, &grad}, s, copy, residual, exp_avg, exp_avg_sq, grad);
}

// master: f32 [n] -> copy bf16 [n], residual [n], the flags into exp_avg_sq's bit 31 (its other bits kept).
inline void reuse_fp32_split(const Tensor& master, Tensor& copy, Tensor& residual, Tensor& exp_avg_sq) {
  using namespace detail;
  const char* op = "reuse_fp32_split";
  check_reuse_args(op, copy, residual, exp_avg_sq);
  check_dtype(op, "master", master, DType::F32);
  check_shape(op, "master", master, {copy.numel()});
  constexpr Kernels<decltype(cpu::reuse_fp32_split)> k{.cpu = cpu::reuse_fp32_split KS_CUDA_KERNEL(cuda::reuse_fp32_split)};
  dispatch(op, k, {&master, &copy, &residual, &exp_avg_sq}, master, copy, residual, exp_avg_sq);
}

// (copy, residual, flags) -> master f32 [n]; v_clean (optional) f32 [n]: exp_avg_sq without the flags.
inline void reuse_fp32_recover(const Tensor& copy, const Tensor& residual, const Tensor& exp_avg_sq, Tensor& master,
                               Tensor* v_clean) {
  using namespace detail;
  const char* op = "reuse_fp32_recover";
  check_reuse_args(op, copy, residual, exp_avg_sq);
  check_dtype(op, "master", master, DType::F32);
  check_shape(op, "master", master, {copy.numel()});
  if (v_clean) {
    check_dtype(op, "v_clean", *v_clean, DType::F32);
    check_shape(op, "v_clean", *v_clean, {copy.numel()});
  }
  constexpr Kernels<decltype(cpu::reuse_fp32_recover)> k{.cpu = cpu::reuse_fp32_recover KS_CUDA_KERNEL(cuda::reuse_fp32_recover)};
  dispatch(op, k, {&copy, &residual, &exp_avg_sq, &master, v_clean}, copy, residual, exp_avg_sq, master, v_clean);
}

}  // namespace kestrel::ops
