// CUDA kernels of the dense ops, with the contracts of ops/{linear,embedding,
// norm,activation}.h and the signatures of backend/cpu/dense_ops.h (the ops
// layer names both in one kernel table). Callers have checked shapes, dtypes
// and devices. GEMMs run on cuBLAS (f32 as IEEE f32, TF32 off; bf16 operands
// on tensor cores with f32 accumulation); the rest in kernels.cu.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cuda {

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx);
void add(const Tensor& a, const Tensor& b, Tensor& y);
void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start);
void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start);
void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd);
void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);
void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h);
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup);

}  // namespace kestrel::cuda
