// Rotary position embedding kernels on packed rows: HF's rotate_half layout
// or DeepSeek's interleaved pairs, on all or part of each head.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

// Where the rotation applies within x [T, n_heads*width]: columns
// [rot_offset, rot_offset + rot_dim) of each head; pairs (i, i + rot_dim/2)
// or, interleaved, (2i, 2i+1), rotated by frequency i (see ops/rope.h).
struct RopeLayout {
  int64_t n_heads = 0, width = 0, rot_offset = 0, rot_dim = 0;
  bool interleaved = false;
};

// In place on x (f32 or bf16); positions i32 [T]; cos/sin f32 [P, rot_dim/2].
// inverse = true applies the transpose rotation (the backward). Positions
// must already be validated to lie in [0, P).
void rope_apply(Tensor& x, const int32_t* positions, const float* cos, const float* sin, const RopeLayout& layout,
                bool inverse);

}  // namespace kestrel::cpu
