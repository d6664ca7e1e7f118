#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// h[T, F] = silu(gate) * up, the SwiGLU of Llama/Qwen MLPs. Elementwise, so h may be
// gate's or up's buffer (in place). bf16 mode rounds silu(gate) before the product, as HF does.
void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h);
// dgate, dup written; each may reuse an input's buffer, but not each other's.
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup);

}  // namespace kestrel::ops
