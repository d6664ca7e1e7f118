#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// HF LlamaRMSNorm over the last dim: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps),
// computed in f32 (in bf16 mode the normalized value is rounded before the weight
// multiply, as HF does). x, y: [N, D]; w: [D]; rstd: f32 [N], saved for backward.
// Qwen3's per-head q/k norm is this op on a [T*H, head_dim] view.
// y has x's dtype and may be x itself (in place); w may be f32 or bf16.
void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd);
// dx written (x's dtype; may be dy's or x's buffer), dw (f32) accumulated. dy has x's dtype.
void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);

}  // namespace kestrel::ops
