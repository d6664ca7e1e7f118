// Rotary embedding on packed rows, kW-lane vectors over each head's half
// (kernel_util.h's simd): with head_dim 64 a half is 32 floats, 4 AVX2 vectors.
#include "backend/cpu/rope_cpu.h"

#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {
namespace {

using simd::kW;
using simd::vf;

// sgn = +1: forward rotation; -1: its transpose (sin negated).
template <class T>
void rope_rows(T* x, int64_t T_, const int32_t* pos, const float* cos, const float* sin, int64_t n_heads,
               int64_t head_dim, float sgn) {
  const int64_t half = head_dim / 2, row = n_heads * head_dim;
  // x[i] <- x[i]*cos - x[i+half]*sin and x[i+half] <- x[i+half]*cos + x[i]*sin for the lanes of chunk i.
  const auto rotate = [&](T* x1, const float* c, const float* sn, int64_t i, int64_t n) {
    T* x2 = x1 + half;
    if (n == kW) {
      const vf a = simd::load(x1 + i), b = simd::load(x2 + i), cv = simd::load(c + i), s = sgn * simd::load(sn + i);
      simd::store(x1 + i, a * cv - b * s);
      simd::store(x2 + i, b * cv + a * s);
    } else {
      const vf a = simd::load_part(x1 + i, n), b = simd::load_part(x2 + i, n), cv = simd::load_part(c + i, n),
               s = sgn * simd::load_part(sn + i, n);
      simd::store_part(x1 + i, n, a * cv - b * s);
      simd::store_part(x2 + i, n, b * cv + a * s);
    }
  };
  parallel_blocks(T_, row, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos + int64_t(pos[t]) * half;
      const float* sn = sin + int64_t(pos[t]) * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        T* x1 = x + t * row + h * head_dim;
        int64_t i = 0;
        for (; i + kW <= half; i += kW) rotate(x1, c, sn, i, kW);
        if (i < half) rotate(x1, c, sn, i, half - i);
      }
    }
  });
}

}  // namespace

void rope_apply(Tensor& x, const int32_t* positions, const float* cos, const float* sin, int64_t n_heads,
                int64_t head_dim, bool inverse) {
  const int64_t T = x.size(0);
  const float sgn = inverse ? -1.f : 1.f;
  if (x.dtype() != DType::F32 && x.dtype() != DType::BF16)
    KS_FAIL("rope: not supported yet: dtype ", dtype_name(x.dtype()), " (use f32 or bf16)");
  dispatch_float(x.dtype(), [&](auto tag) {
    using TX = decltype(tag);
    rope_rows(ptr<TX>(x), T, positions, cos, sin, n_heads, head_dim, sgn);
  });
}

}  // namespace kestrel::cpu
