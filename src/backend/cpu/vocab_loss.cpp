// CPU kernels of the vocab-parallel log-softmax pieces (ops/vocab_loss.h).
// Logit rows are widened to f32 (bf16 rows into a per-thread buffer) and every
// sum runs in double in column order, as the single loop these were split
// from did, so tensor-parallel results stay bit for bit what they were.
#include "backend/cpu/vocab_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

namespace {

// Row t of logits [T, Vs] as f32 (bf16 rows are converted into `tmp`).
const float* row_f32(const Tensor& logits, int64_t t, std::vector<float>& tmp) {
  const int64_t V = logits.size(1);
  if (logits.dtype() == DType::F32) return ptr<const float>(logits) + t * V;
  const bf16_bits* src = ptr<const bf16_bits>(logits) + t * V;
  tmp.resize(size_t(V));
  for (int64_t v = 0; v < V; ++v) tmp[size_t(v)] = load_f32(src, v);
  return tmp.data();
}

}  // namespace

void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max) {
  const int64_t T = logits.size(0);
  float* M = ptr<float>(row_max);
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < n_real; ++v) m = std::max(m, z[v]);
      M[t] = m;
    }
  }
}

void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums) {
  const int64_t T = logits.size(0);
  const int32_t* tg = ptr<const int32_t>(targets);
  const float* M = ptr<const float>(row_max);
  float* S = ptr<float>(sums);  // [3, T]: S, SZ, z_target
  float* SZ = S + T;
  float* ZT = S + 2 * T;
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);
      const float m = M[t];
      double s = 0, sz = 0;
      for (int64_t v = 0; v < n_real; ++v) {
        const double e = std::exp(double(z[v]) - double(m));
        s += e;
        sz += e * double(z[v]);
      }
      S[t] = float(s);
      SZ[t] = float(sz);
      const int64_t local = int64_t(tg[t]) - vocab_start;
      ZT[t] = (tg[t] >= 0 && local >= 0 && local < n_real) ? z[local] : 0.f;
    }
  }
}

void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy) {
  const int64_t T = lse.numel();
  const float* S = ptr<const float>(sums);
  const float* SZ = S + T;
  const float* ZT = S + 2 * T;
  const int32_t* tg = ptr<const int32_t>(targets);
  float* L = ptr<float>(lse);
  float* lp = logprob ? ptr<float>(*logprob) : nullptr;
  float* en = entropy ? ptr<float>(*entropy) : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    L[t] = float(double(L[t]) + std::log(double(S[t])));
    if (lp) lp[t] = tg[t] >= 0 ? float(double(ZT[t]) - double(L[t])) : 0.f;
    // sum p z = (sum e z) / S with e = exp(z - M); H = lse - sum p z.
    if (en) en[t] = float(double(L[t]) - double(SZ[t]) / double(S[t]));
  }
}

void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits) {
  const int64_t T = logits.size(0), V = logits.size(1);
  const int32_t* tg = ptr<const int32_t>(targets);
  const float* L = ptr<const float>(lse);
  const float* dl = ptr<const float>(dlogprob);
  const float* de = dentropy ? ptr<const float>(*dentropy) : nullptr;
  const float* H = entropy ? ptr<const float>(*entropy) : nullptr;
  float* out = ptr<float>(dlogits);
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);  // z[v] is read before the (possibly aliased) d[v] is written
      float* d = out + t * V;
      const double g = tg[t] >= 0 ? double(dl[t]) : 0.0;
      const double ge = de ? double(de[t]) : 0.0;
      const double h = de ? double(H[t]) : 0.0;
      const int64_t local = int64_t(tg[t]) - vocab_start;
      for (int64_t v = 0; v < n_real; ++v) {
        const double logp = double(z[v]) - double(L[t]);
        const double p = std::exp(logp);
        double r = -g * p;
        if (de) r += ge * (-p * (logp + h));
        if (v == local && tg[t] >= 0) r += g;
        d[v] = float(r);
      }
      for (int64_t v = n_real; v < V; ++v) d[v] = 0.f;  // padding columns: not in the softmax
    }
  }
}

}  // namespace kestrel::cpu
