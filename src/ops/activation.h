#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// h[T, F] = silu(gate) * up, the SwiGLU of Llama/Qwen MLPs. h may alias neither input.
void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h);
// dgate, dup written.
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup);

}  // namespace kestrel::ops
