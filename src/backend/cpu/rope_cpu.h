// Rotary position embedding kernels (HF rotate_half layout) on packed rows.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

// In place on x[T, n_heads*head_dim] (f32 or bf16); positions i32 [T];
// cos/sin f32 [P, head_dim/2]. inverse = true applies the transpose rotation
// (the backward). Positions must already be validated to lie in [0, P).
void rope_apply(Tensor& x, const int32_t* positions, const float* cos, const float* sin, int64_t n_heads,
                int64_t head_dim, bool inverse);

}  // namespace kestrel::cpu
