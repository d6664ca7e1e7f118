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

using simd::kW;
using simd::vf;
using simd::vi;

// Lanes of a row chunk at v with n valid elements (n = kW except at the tail).
inline vi valid_lanes(int64_t n) { return simd::iota() < int32_t(n); }

template <class T>
RowStats row_stats(const T* z, int64_t V) {
  constexpr int64_t kBlock = 512;  // 2 KiB of f32: the second look at a block hits L1
  static_assert(kBlock % kW == 0);
  const vf neg_inf = simd::splat(kNegInf);
  RowStats st;
  for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
    const int64_t v1 = std::min(V, v0 + kBlock);
    // Block max; NaN never wins a compare, so it is skipped.
    vf bmv = neg_inf;
    int64_t v = v0;
    for (; v + kW <= v1; v += kW) {
      const vf x = simd::load(z + v);
      bmv = x > bmv ? x : bmv;
    }
    if (const int64_t n = v1 - v; n > 0) {
      const vf x = simd::load_part(z + v, n);
      bmv = (valid_lanes(n) & (x > bmv)) ? x : bmv;
    }
    const float bm = simd::hmax(bmv);
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
    vf bs{}, ba{};
    // -inf logits (and lanes past the row) add nothing; e == 0 keeps 0 * -inf out of ba.
    const auto accumulate = [&](vf x, vi valid) {
      const vf d = x - m;
      const vf e = simd::exp(d);
      const vi take = valid & (x != neg_inf);
      bs += take ? e : vf{};
      ba += (take & (e != 0.f)) ? e * d : vf{};
    };
    for (v = v0; v + kW <= v1; v += kW) accumulate(simd::load(z + v), simd::iota() >= 0);
    if (const int64_t n = v1 - v; n > 0) accumulate(simd::load_part(z + v, n), valid_lanes(n));
    st.s += simd::hsum(bs);
    st.a += simd::hsum(ba);
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
        vf acc{};
        const auto accumulate = [&](vf x, vi valid) {
          const vf lp = x - l;
          const vf p = simd::exp(lp);
          acc += (valid & (p != 0.f)) ? p * lp : vf{};
        };
        int64_t v = 0;
        for (; v + kW <= V; v += kW) accumulate(simd::load(z + v), simd::iota() >= 0);
        if (const int64_t n = V - v; n > 0) accumulate(simd::load_part(z + v, n), valid_lanes(n));
        H = -simd::hsum(acc);
      }
      // Lane j of the chunk at v is vocabulary entry v + j; V < 2^31 (i32 targets).
      const auto grad = [&](vf x, int64_t v) {
        const vf lp = x - l;
        const vf p = simd::exp(lp);
        vf g = ((simd::iota() + int32_t(v)) == int32_t(target) ? simd::splat(c_lp) : vf{}) - c_lp * p;
        if (with_entropy) g -= c_h * ((p == 0.f) ? vf{} : p * (lp + H));
        return g;
      };
      // out may be z's buffer: each chunk is loaded before it is overwritten.
      int64_t v = 0;
      for (; v + kW <= V; v += kW) simd::store(out + v, grad(simd::load(z + v), v));
      if (const int64_t n = V - v; n > 0) simd::store_part(out + v, n, grad(simd::load_part(z + v, n), v));
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
