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

}  // namespace kestrel::cuda
