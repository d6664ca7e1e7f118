#if defined(__GNUC__) && !defined(__clang__)
// The portable fallback's `omp simd` reductions vectorise only with the
// dynamic cost model at -O2 (as in linear.cpp).
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "backend/cpu/skinny_gemm.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/kernel_util.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KESTREL_SKINNY_AVX2 1
#endif

namespace kestrel::cpu {

namespace {

// At most this many input rows share one pass over a weight row: their
// accumulators and the row's vectors must fit the 16 ymm registers.
constexpr int kGroup = 4;

#if KESTREL_SKINNY_AVX2

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// 8 bf16 -> 8 f32: the bf16 bits are the high half of the f32 bits.
inline __m256 load8(const bf16_bits* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// The first n < 8 elements, the rest zero (never reads past p[n-1]).
template <class E>
inline __m256 load_tail(const E* p, int64_t n) {
  alignas(32) float t[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < n; ++i) t[i] = load_f32(p, i);
  return _mm256_load_ps(t);
}
inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// sums[s * G + g] = dot(wr[s][0, in), x[g * in ..][0, in)) for S weight rows
// and G input rows. U independent accumulators per pair along k hide the FMA
// latency when S * G alone is too few chains; S * G * U <= 8 keeps every
// accumulator, the G input vectors and one weight vector in registers.
template <class W, int S, int G, int U>
inline void dots(const W* const* wr, const float* x, int64_t in, float* sums) {
  __m256 acc[S][G][U];
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < U; ++u) acc[s][g][u] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 * U <= in; k += 8 * U) {
    for (int u = 0; u < U; ++u) {
      __m256 xv[G];
      for (int g = 0; g < G; ++g) xv[g] = _mm256_loadu_ps(x + g * in + k + 8 * u);
      for (int s = 0; s < S; ++s) {
        const __m256 wv = load8(wr[s] + k + 8 * u);
        for (int g = 0; g < G; ++g) acc[s][g][u] = _mm256_fmadd_ps(wv, xv[g], acc[s][g][u]);
      }
    }
  }
  for (; k + 8 <= in; k += 8) {
    for (int s = 0; s < S; ++s) {
      const __m256 wv = load8(wr[s] + k);
      for (int g = 0; g < G; ++g) acc[s][g][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + g * in + k), acc[s][g][0]);
    }
  }
  if (k < in) {
    const int64_t n = in - k;
    for (int s = 0; s < S; ++s) {
      const __m256 wv = load_tail(wr[s] + k, n);
      for (int g = 0; g < G; ++g) acc[s][g][0] = _mm256_fmadd_ps(wv, load_tail(x + g * in + k, n), acc[s][g][0]);
    }
  }
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g) {
      __m256 v = acc[s][g][0];
      for (int u = 1; u < U; ++u) v = _mm256_add_ps(v, acc[s][g][u]);
      sums[s * G + g] = hsum(v);
    }
}

#else  // portable fallback (KESTREL_NATIVE=OFF on a machine without AVX2)

template <class W, int S, int G, int U>
inline void dots(const W* const* wr, const float* x, int64_t in, float* sums) {
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g) {
      const W* w = wr[s];
      const float* xr = x + g * in;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < in; ++k) acc += load_f32(w, k) * xr[k];
      sums[s * G + g] = acc;
    }
}

#endif

// S weight rows against g input rows. Two regimes, fixed by M alone:
//  - few rows (M <= kGroup), bound by memory: two streams (S <= 2), groups of
//    up to 4 rows, U = 4 / 2 / 1 / 1 accumulators along k for g = 1 / 2 / 3 / 4;
//  - more rows, bound by the FMAs: four streams (S <= 4) against groups of 3
//    (or 2) rows, U = 1: 12 accumulators with 3 + 4 loads per 12 FMAs, ~10%
//    faster at M = 12 than 2 x 4 (measured).
// U depends on (regime, g) only, so a row's dot is summed in the same order
// whichever rows it is grouped with: the result does not depend on the
// thread count.
template <class W, int S>
inline void dots_for(bool wide, const W* const* wr, const float* x, int64_t in, int g, float* sums) {
  if constexpr (S > 2) wide = true;  // four streams only occur in the wide regime
  if (wide) {
    if (g == 2)
      dots<W, S, 2, 1>(wr, x, in, sums);
    else
      dots<W, S, 3, 1>(wr, x, in, sums);
    return;
  }
  switch (g) {
    case 1:
      dots<W, S, 1, 4>(wr, x, in, sums);
      return;
    case 2:
      dots<W, S, 2, 2>(wr, x, in, sums);
      return;
    case 3:
      dots<W, S, 3, 1>(wr, x, in, sums);
      return;
    default:
      dots<W, S, 4, 1>(wr, x, in, sums);
      return;
  }
}

template <class W>
inline void dots_n(int ns, bool wide, const W* const* wr, const float* x, int64_t in, int g, float* sums) {
  switch (ns) {
    case 1:
      dots_for<W, 1>(wide, wr, x, in, g, sums);
      return;
    case 2:
      dots_for<W, 2>(wide, wr, x, in, g, sums);
      return;
    case 3:
      dots_for<W, 3>(wide, wr, x, in, g, sums);
      return;
    default:
      dots_for<W, 4>(wide, wr, x, in, g, sums);
      return;
  }
}

// Output rows [n0, n1) of y[M, out]: the range is cut into S equal parts
// walked side by side (S far-apart sequential streams), each weight row read
// from memory once; the second and later groups of input rows find it in L1.
template <class W, class Y>
void rows(const W* w, int64_t in, const float* x, int64_t M, const float* b, Y* y, int64_t out, int64_t n0,
          int64_t n1) {
  const bool wide = M > kGroup;
  const int S = wide ? 4 : 2;
  const int64_t q = (n1 - n0 + S - 1) / S;
  float sums[4 * kGroup];
  for (int64_t i = 0; i < q; ++i) {
    int64_t r[4];
    const W* wr[4];
    int ns = 0;  // rows s * q + i that exist: always a prefix, never empty
    for (int s = 0; s < S; ++s)
      if (n0 + s * q + i < n1) {
        r[ns] = n0 + s * q + i;
        wr[ns] = w + r[ns] * in;
        ++ns;
      }
    for (int64_t t = 0; t < M;) {
      // Wide: groups of 3, ending in 2 + 2 or 2 (M > 4 never leaves 1).
      const int64_t left = M - t;
      const int g = wide ? (left == 4 || left == 2 ? 2 : 3) : int(std::min<int64_t>(kGroup, left));
      dots_n(ns, wide, wr, x + t * in, in, g, sums);
      for (int s = 0; s < ns; ++s) {
        const float bias = b ? b[r[s]] : 0.f;
        for (int j = 0; j < g; ++j) store_f32(y, (t + j) * out + r[s], sums[s * g + j] + bias);
      }
      t += g;
    }
  }
}

// f32 copies of bf16 inputs and biases, kept per thread so a decode step
// allocates nothing after the first call.
const float* as_f32(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::F32) return ptr<const float>(t);
  scratch.resize(size_t(t.numel()));
  const bf16_bits* src = ptr<const bf16_bits>(t);
  float* dst = scratch.data();
  const int64_t n = t.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(src, i);
  return dst;
}

bool float_dtype(DType d) { return d == DType::F32 || d == DType::BF16; }

}  // namespace

bool skinny_linear_applies(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
  if (!x.defined() || !w.defined() || !y.defined() || (b && !b->defined())) return false;
  if (!float_dtype(x.dtype()) || !float_dtype(w.dtype()) || !float_dtype(y.dtype()) || (b && !float_dtype(b->dtype())))
    return false;
  if (x.device() != Device::CPU || w.device() != Device::CPU || y.device() != Device::CPU ||
      (b && b->device() != Device::CPU))
    return false;
  if (x.dim() != 2 || w.dim() != 2 || y.dim() != 2) return false;
  const int64_t M = x.size(0);
  return M >= 1 && M <= kSkinnyMaxRows && x.size(1) == w.size(1) && y.size(0) == M && y.size(1) == w.size(0) &&
         (!b || b->numel() == w.size(0));
}

void skinny_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  KS_CHECK(skinny_linear_applies(x, w, b, y), "skinny_linear: needs CPU f32/bf16 x[M, in] with 1 <= M <= ",
           kSkinnyMaxRows, ", w[out, in], b[out], y[M, out]; got x", shape_str(x.shape()), " w",
           shape_str(w.shape()), " y", shape_str(y.shape()), " (use ops::linear_fwd for other cases)");
  const int64_t M = x.size(0), in = x.size(1), out = w.size(0);
  thread_local std::vector<float> x_scratch, b_scratch;
  const float* xp = as_f32(x, x_scratch);  // [M, in]
  const float* bp = b ? as_f32(*b, b_scratch) : nullptr;
  // Split the output rows across the team: each thread streams its own
  // contiguous slice of the weights.
  const bool par = !omp_in_parallel() && out >= 16 && worth_parallel(out * in);
  dispatch_float(w.dtype(), [&](auto wtag) {
    using W = decltype(wtag);
    dispatch_float(y.dtype(), [&](auto ytag) {
      using Y = decltype(ytag);
      const W* wp = ptr<const W>(w);
      Y* yp = ptr<Y>(y);
#pragma omp parallel if (par)
      {
        const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t n0 = out * id / nt, n1 = out * (id + 1) / nt;
        if (n0 < n1) rows(wp, in, xp, M, bp, yp, out, n0, n1);
      }
    });
  });
}

}  // namespace kestrel::cpu
