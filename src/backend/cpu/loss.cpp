#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// Fused log-softmax + gather (+ entropy) over the vocabulary on the CPU.
// Each row of logits[T, V] is read once from memory: an online log-sum-exp
// over blocks that stay in L1 (block max, then the exp sums of that block
// against the running max), so no second [T, V] buffer ever exists. The
// backward writes dlogits row by row and may overwrite the logits in place.
//
// Conventions (the reference ops/ref/loss_ref.h follows them exactly):
// NaN logits are skipped by the max but poison the sums (row -> NaN);
// -inf logits contribute p = 0 and 0 * log 0 = 0 to the entropy; a +inf
// logit makes the row NaN.
#include <cmath>
#include <limits>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RowStats {
  float m = kNegInf;  // running max (NaN-free)
  float s = 0.f;      // sum exp(z - m)
  float a = 0.f;      // sum exp(z - m) * (z - m): entropy = log s - a / s
};

template <class T>
RowStats row_stats(const T* z, int64_t V) {
  constexpr int64_t kBlock = 512;  // 2 KiB of f32: the second look at a block hits L1
  RowStats st;
  for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
    const int64_t v1 = std::min(V, v0 + kBlock);
    float bm = kNegInf;
#pragma omp simd reduction(max : bm)
    for (int64_t v = v0; v < v1; ++v) {
      const float x = load_f32(z, v);
      bm = x > bm ? x : bm;
    }
    if (bm > st.m) {
      if (st.s > 0.f) {
        // Re-base the sums on the new max: sum e'(z - m') = c * (sum e (z - m) + (m - m') * sum e).
        const float c = std::exp(st.m - bm);
        st.a = c * (st.a + (st.m - bm) * st.s);
        st.s *= c;
      }
      st.m = bm;
    }
    const float m = st.m;
    float bs = 0.f, ba = 0.f;
#pragma omp simd reduction(+ : bs, ba)
    for (int64_t v = v0; v < v1; ++v) {
      const float x = load_f32(z, v);
      const float d = x - m;
      const float e = exp_f32(d);
      const bool skip = x == kNegInf;
      bs += skip ? 0.f : e;
      ba += (skip || e == 0.f) ? 0.f : e * d;
    }
    st.s += bs;
    st.a += ba;
  }
  return st;
}

template <class T>
void fwd_rows(const T* logits, const int32_t* tgt, int64_t T_, int64_t V, float* logprob, float* entropy, float* lse) {
  parallel_blocks(T_, V, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* z = logits + r * V;
      const RowStats st = row_stats(z, V);
      const float log_s = std::log(st.s);
      const float l = st.m + log_s;
      lse[r] = l;
      logprob[r] = tgt[r] >= 0 ? load_f32(z, tgt[r]) - l : 0.f;
      if (entropy) entropy[r] = log_s - st.a / st.s;
    }
  });
}

template <class TI, class TO>
void bwd_rows(const TI* logits, const int32_t* tgt, const float* lse, const float* cp, const float* ch, int64_t T_,
              int64_t V, TO* dlogits) {
  parallel_blocks(T_, V, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const TI* z = logits + r * V;
      TO* out = dlogits + r * V;
      const int64_t target = tgt[r];
      // A row without a target has a constant logprob: only entropy flows back.
      const float c_lp = target >= 0 ? cp[r] : 0.f;
      const float c_h = ch ? ch[r] : 0.f;
      const bool with_entropy = ch != nullptr;
      if (target < 0 && !with_entropy) {
#pragma omp simd
        for (int64_t v = 0; v < V; ++v) store_f32(out, v, 0.f);
        continue;
      }
      const float l = lse[r];
      float H = 0.f;
      if (with_entropy) {
        // Recomputed rather than saved: one extra read of a row that is hot anyway.
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t v = 0; v < V; ++v) {
          const float lp = load_f32(z, v) - l;
          const float p = exp_f32(lp);
          acc += p == 0.f ? 0.f : p * lp;
        }
        H = -acc;
      }
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) {
        const float lp = load_f32(z, v) - l;
        const float p = exp_f32(lp);
        float g = (v == target ? c_lp : 0.f) - c_lp * p;
        if (with_entropy) g -= c_h * (p == 0.f ? 0.f : p * (lp + H));
        store_f32(out, v, g);
      }
    }
  });
}

}  // namespace

void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse) {
  const int64_t T = logits.size(0), V = logits.size(1);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using TL = decltype(tag);
    fwd_rows(ptr<const TL>(logits), ptr<const int32_t>(targets), T, V, ptr<float>(logprob),
             entropy ? ptr<float>(*entropy) : nullptr, ptr<float>(lse));
  });
}

void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const float* coef_logprob,
                         const float* coef_entropy, Tensor& dlogits) {
  const int64_t T = logits.size(0), V = logits.size(1);
  dispatch_float(logits.dtype(), [&](auto ti) {
    dispatch_float(dlogits.dtype(), [&](auto to) {
      using TI = decltype(ti);
      using TO = decltype(to);
      bwd_rows(ptr<const TI>(logits), ptr<const int32_t>(targets), ptr<const float>(lse), coef_logprob, coef_entropy, T,
               V, ptr<TO>(dlogits));
    });
  });
}

}  // namespace kestrel::cpu
