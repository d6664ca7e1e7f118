#if defined(__GNUC__) && !defined(__clang__)
// The row loops below are `omp simd` over the inline load/store helpers: GCC's
// -O2 cost model leaves them scalar (see linear.cpp).
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// MoE permutation (tokens into expert-major rows and back) and the Qwen2-MoE
// shared-expert gate on the CPU. Parallel over tokens (or permuted rows);
// a token's slots are summed in slot order, so results do not depend on the
// thread count.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/moe_cpu.h"

namespace kestrel::cpu {

namespace {

// Every entry of a routing index is a row in [0, rows) or -1.
void check_rows(const char* op, const char* name, const Tensor& index, int64_t rows) {
  const int32_t* ix = ptr<const int32_t>(index);
  for (int64_t i = 0; i < index.numel(); ++i)
    if (ix[i] < -1 || ix[i] >= rows)
      KS_FAIL("ops::", op, ": ", name, "[", i, "] = ", ix[i], " is outside [-1, ", rows,
              "); the MoeRouting does not belong to these tensors");
}

// acc[0, D) += a * row[0, D) for a float row of dtype T.
template <class T>
inline void axpy_row(float a, const T* row, int64_t D, float* acc) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] += a * load_f32(row, d);
}

}  // namespace

void moe_permute_fwd(const Tensor& x, const Tensor& source, Tensor& xs) {
  const int64_t N = xs.size(0), T = x.size(0);
  check_rows("moe_permute_fwd", "source", source, T);
  const int32_t* src = ptr<const int32_t>(source);
  const size_t rb = N ? xs.nbytes() / size_t(N) : 0;
  const char* xp = static_cast<const char*>(x.raw());
  char* out = static_cast<char*>(xs.raw());
  parallel_blocks(N, int64_t(rb / 4), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (src[r] >= 0)
        std::memcpy(out + size_t(r) * rb, xp + size_t(src[r]) * rb, rb);
      else
        std::memset(out + size_t(r) * rb, 0, rb);  // 0.0 in f32 and bf16
    }
  });
}

void moe_permute_bwd(const Tensor& dxs, const Tensor& dest, Tensor& dx) {
  const int64_t T = dx.size(0), D = dx.size(1), k = dest.size(1);
  check_rows("moe_permute_bwd", "dest", dest, dxs.size(0));
  const int32_t* dst = ptr<const int32_t>(dest);
  float* out = ptr<float>(dx);
  dispatch_float(dxs.dtype(), [&](auto tag) {
    using G = decltype(tag);
    const G* g = ptr<const G>(dxs);
    parallel_blocks(T, k * D, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* o = out + t * D;
        std::fill(o, o + D, 0.f);
        for (int64_t j = 0; j < k; ++j)
          if (dst[t * k + j] >= 0) axpy_row(1.f, g + dst[t * k + j] * D, D, o);
      }
    });
  });
}

void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dest, Tensor& y) {
  const int64_t T = y.size(0), D = y.size(1), k = dest.size(1);
  check_rows("moe_unpermute_fwd", "dest", dest, ys.size(0));
  const int32_t* dst = ptr<const int32_t>(dest);
  const float* w = ptr<const float>(topk_w);
  dispatch_float(ys.dtype(), [&](auto ty) {
    dispatch_float(y.dtype(), [&](auto to) {
      using Y = decltype(ty);
      using O = decltype(to);
      const Y* src = ptr<const Y>(ys);
      O* out = ptr<O>(y);
      parallel_blocks(T, k * D, [&](int64_t t0, int64_t t1) {
        std::vector<float> acc(static_cast<size_t>(D));
        for (int64_t t = t0; t < t1; ++t) {
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = 0; j < k; ++j)
            if (dst[t * k + j] >= 0) axpy_row(w[t * k + j], src + dst[t * k + j] * D, D, acc.data());
          O* o = out + t * D;
          const float* a = acc.data();
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) store_f32(o, d, a[d]);
        }
      });
    });
  });
}

void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const Tensor& dest,
                       const Tensor& source, Tensor& dys, Tensor& dtopk_w) {
  const int64_t T = dy.size(0), D = dy.size(1), k = dest.size(1), N = ys.size(0);
  const char* op = "moe_unpermute_bwd";
  check_rows(op, "dest", dest, N);
  check_rows(op, "source", source, T);
  const int32_t* dst = ptr<const int32_t>(dest);
  const int32_t* src = ptr<const int32_t>(source);
  // Each row receives one slot's gradient: two slots sharing a row would race.
  std::vector<int64_t> owner(size_t(N), -1);
  for (int64_t i = 0; i < T * k; ++i) {
    if (dst[i] < 0) continue;
    if (owner[size_t(dst[i])] >= 0 || src[dst[i]] != i / k)
      KS_FAIL("ops::", op, ": dest[", i / k, ", ", i % k, "] = ", dst[i],
              " is another slot's row or not a row of token ", i / k, "; the MoeRouting is inconsistent");
    owner[size_t(dst[i])] = i;
  }
  const float* w = ptr<const float>(topk_w);
  float* dsp = ptr<float>(dys);
  float* dwp = ptr<float>(dtopk_w);
  dispatch_float(ys.dtype(), [&](auto ty) {
    dispatch_float(dy.dtype(), [&](auto tg) {
      using Y = decltype(ty);
      using G = decltype(tg);
      const Y* yp = ptr<const Y>(ys);
      const G* gp = ptr<const G>(dy);
      parallel_blocks(T, k * D, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const G* g = gp + t * D;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t r = dst[t * k + j];
            if (r < 0) {
              dwp[t * k + j] = 0.f;
              continue;
            }
            const float wj = w[t * k + j];
            const Y* yr = yp + int64_t(r) * D;
            float* o = dsp + int64_t(r) * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) {
              const float gd = load_f32(g, d);
              o[d] = wj * gd;
              dot += gd * load_f32(yr, d);
            }
            dwp[t * k + j] = dot;
          }
        }
      });
    });
  });
  // Padding rows (source -1) get no slot: their gradient is 0.
  parallel_blocks(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (src[r] < 0) std::fill(dsp + r * D, dsp + (r + 1) * D, 0.f);
  });
}

// ---- shared-expert gate -----------------------------------------------------

void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y) {
  const int64_t T = y.size(0), D = y.size(1);
  // HF: F.sigmoid(gate(x)) * shared in the activations' dtype, then the add:
  // in bf16 the sigmoid and the product are each rounded to bf16.
  const bool round_product = g.dtype() == DType::BF16 && s.dtype() == DType::BF16;
  dispatch_float(g.dtype(), [&](auto tg) {
    dispatch_float(s.dtype(), [&](auto ts) {
      dispatch_float(y.dtype(), [&](auto ty) {
        using Gt = decltype(tg);
        using S = decltype(ts);
        using Y = decltype(ty);
        const Gt* gp = ptr<const Gt>(g);
        const S* sp = ptr<const S>(s);
        Y* yp = ptr<Y>(y);
        parallel_blocks(T, D, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const float sg = round_to<Gt>(1.f / (1.f + std::exp(-load_f32(gp, t))));
            const S* sr = sp + t * D;
            Y* yr = yp + t * D;
            if (round_product) {
#pragma omp simd
              for (int64_t d = 0; d < D; ++d)
                store_f32(yr, d, load_f32(yr, d) + round_to<bf16_bits>(sg * load_f32(sr, d)));
            } else {
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) store_f32(yr, d, load_f32(yr, d) + sg * load_f32(sr, d));
            }
          }
        });
      });
    });
  });
}

void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg) {
  const int64_t T = dy.size(0), D = dy.size(1);
  float* dsp = ptr<float>(ds);
  float* dgp = ptr<float>(dg);
  dispatch_float(g.dtype(), [&](auto tg) {
    dispatch_float(s.dtype(), [&](auto ts) {
      dispatch_float(dy.dtype(), [&](auto td) {
        using Gt = decltype(tg);
        using S = decltype(ts);
        using Dy = decltype(td);
        const Gt* gp = ptr<const Gt>(g);
        const S* sp = ptr<const S>(s);
        const Dy* dp = ptr<const Dy>(dy);
        parallel_blocks(T, D, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const float sg = 1.f / (1.f + std::exp(-load_f32(gp, t)));
            const S* sr = sp + t * D;
            const Dy* dr = dp + t * D;
            float* o = dsp + t * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) {
              const float gd = load_f32(dr, d);
              o[d] = sg * gd;
              dot += gd * load_f32(sr, d);
            }
            dgp[t] = sg * (1.f - sg) * dot;
          }
        });
      });
    });
  });
}

}  // namespace kestrel::cpu
