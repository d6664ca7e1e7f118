// Scalar RoPE reference (the oracle for the kernels): naive loops in any
// element type F, run with double in tests. HF rotate_half layout.
#pragma once
#include <cstdint>

namespace kestrel::ops::ref {

// In place on x [T, n_heads*head_dim]; cos/sin [P, head_dim/2]; pos [T].
// inverse = false: y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin (HF apply_rotary_pos_emb).
// inverse = true: the transpose (rope_bwd), y1 = x1*cos + x2*sin, y2 = x2*cos - x1*sin.
template <class F>
void rope_ref(F* x, int64_t T, const int32_t* pos, const F* cos, const F* sin, int64_t n_heads, int64_t head_dim,
              bool inverse) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        F* x1 = x + (t * n_heads + h) * head_dim + i;
        F* x2 = x1 + half;
        const F c = cos[pos[t] * half + i];
        const F s = inverse ? -sin[pos[t] * half + i] : sin[pos[t] * half + i];
        const F a = *x1, b = *x2;
        *x1 = a * c - b * s;
        *x2 = b * c + a * s;
      }
}

}  // namespace kestrel::ops::ref
