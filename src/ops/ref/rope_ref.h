// Scalar RoPE reference (the oracle for the kernels): naive loops in any
// element type F, run with double in tests. HF rotate_half layout, or
// DeepSeek's interleaved pairs, on all or part of each head (ops/rope.h).
#pragma once
#include <cstdint>

namespace kestrel::ops::ref {

// In place on x [T, n_heads*width] (width 0 = head_dim); columns
// [rot_offset, rot_offset + head_dim) of each head rotate; cos/sin
// [P, head_dim/2]; pos [T]. Pair i is (i, i + head_dim/2), or (2i, 2i+1)
// when interleaved.
// inverse = false: y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin (HF apply_rotary_pos_emb).
// inverse = true: the transpose (rope_bwd), y1 = x1*cos + x2*sin, y2 = x2*cos - x1*sin.
template <class F>
void rope_ref(F* x, int64_t T, const int32_t* pos, const F* cos, const F* sin, int64_t n_heads, int64_t head_dim,
              bool inverse, int64_t width = 0, int64_t rot_offset = 0, bool interleaved = false) {
  const int64_t half = head_dim / 2, W = width > 0 ? width : head_dim;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        F* r = x + (t * n_heads + h) * W + rot_offset;
        F* x1 = interleaved ? r + 2 * i : r + i;
        F* x2 = interleaved ? r + 2 * i + 1 : r + i + half;
        const F c = cos[pos[t] * half + i];
        const F s = inverse ? -sin[pos[t] * half + i] : sin[pos[t] * half + i];
        const F a = *x1, b = *x2;
        *x1 = a * c - b * s;
        *x2 = b * c + a * s;
      }
}

}  // namespace kestrel::ops::ref
