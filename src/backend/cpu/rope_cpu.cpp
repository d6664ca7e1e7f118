#include "backend/cpu/rope_cpu.h"

#include <vector>

namespace kestrel::cpu {
namespace {

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) { return bf16_to_float(x.bits); }
template <class T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) { return bf16{float_to_bf16(x)}; }

// sgn = +1: forward rotation; -1: its transpose (sin negated).
template <class T>
void rope_rows(T* x, int64_t T_, const int32_t* pos, const float* cos, const float* sin, int64_t n_heads,
               int64_t head_dim, float sgn) {
  const int64_t half = head_dim / 2, row = n_heads * head_dim;
#pragma omp parallel
  {
    // f32 staging so the inner loop is plain float math the compiler vectorizes.
    std::vector<float> a(half), b(half), s(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
      const float* c = cos + int64_t(pos[t]) * half;
      const float* sn = sin + int64_t(pos[t]) * half;
      for (int64_t i = 0; i < half; ++i) s[i] = sgn * sn[i];
      for (int64_t h = 0; h < n_heads; ++h) {
        T* x1 = x + t * row + h * head_dim;
        T* x2 = x1 + half;
        for (int64_t i = 0; i < half; ++i) { a[i] = to_f(x1[i]); b[i] = to_f(x2[i]); }
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float y1 = a[i] * c[i] - b[i] * s[i];
          const float y2 = b[i] * c[i] + a[i] * s[i];
          a[i] = y1;
          b[i] = y2;
        }
        for (int64_t i = 0; i < half; ++i) { x1[i] = from_f<T>(a[i]); x2[i] = from_f<T>(b[i]); }
      }
    }
  }
}

}  // namespace

void rope_apply(Tensor& x, const int32_t* positions, const float* cos, const float* sin, int64_t n_heads,
                int64_t head_dim, bool inverse) {
  const int64_t T = x.size(0);
  const float sgn = inverse ? -1.f : 1.f;
  if (x.dtype() == DType::F32)
    rope_rows(x.data<float>(), T, positions, cos, sin, n_heads, head_dim, sgn);
  else if (x.dtype() == DType::BF16)
    rope_rows(x.data<bf16>(), T, positions, cos, sin, n_heads, head_dim, sgn);
  else
    KS_FAIL("rope: not supported yet: dtype ", dtype_name(x.dtype()), " (use f32 or bf16)");
}

}  // namespace kestrel::cpu
