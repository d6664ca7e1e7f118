// CUDA kernels of ops/optim_ops.h (signatures of backend/cpu/optim_kernels.h).
// Each equals the CPU kernel bit for bit (kernels_optim.cu says how).
#pragma once
#include "backend/adamw_scalars.h"
#include "core/tensor.h"

namespace kestrel::cuda {

void adamw_step(const AdamWScalars& s, Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                Tensor* model_copy);
double sum_squares(const Tensor& x);
void scale_(Tensor& x, float c);
// reuse_fp32_param (ops/reuse_fp32_ops.h), bit for bit the CPU kernels.
void adamw_step_reuse_fp32(const AdamWScalars& s, Tensor& copy, Tensor& residual, Tensor& exp_avg, Tensor& exp_avg_sq,
                           const Tensor& grad);
void reuse_fp32_split(const Tensor& master, Tensor& copy, Tensor& residual, Tensor& v);
void reuse_fp32_recover(const Tensor& copy, const Tensor& residual, const Tensor& v, Tensor& master, Tensor* v_clean);

}  // namespace kestrel::cuda
