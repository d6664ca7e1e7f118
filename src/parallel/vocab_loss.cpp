#include "parallel/vocab_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/loss.h"

namespace kestrel::parallel {

using comm::ReduceOp;

namespace {

// Row t of the logits widened to f32 (bf16 rows are converted into `tmp`).
const float* row_f32(const Tensor& logits, int64_t t, std::vector<float>& tmp) {
  const int64_t V = logits.size(1);
  if (logits.dtype() == DType::F32) return logits.data<float>() + t * V;
  KS_CHECK(logits.dtype() == DType::BF16, "vocab-parallel loss: logits must be f32 or bf16, got ",
           logits.describe());
  const uint16_t* src = static_cast<const uint16_t*>(logits.raw()) + t * V;
  tmp.resize(size_t(V));
  for (int64_t v = 0; v < V; ++v) tmp[size_t(v)] = bf16_to_float(src[v]);
  return tmp.data();
}

void check_args(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& lse) {
  KS_CHECK(logits.dim() == 2, op, ": logits must be [T, V/n], got ", logits.describe());
  const int64_t T = logits.size(0);
  KS_CHECK(targets.dtype() == DType::I32 && targets.numel() == T, op, ": targets must be i32 [", T, "], got ",
           targets.describe());
  KS_CHECK(lse.dtype() == DType::F32 && lse.numel() == T, op, ": lse must be f32 [", T, "], got ", lse.describe());
}

// Columns of this rank's [T, V/n] logits that are real vocabulary: those past
// vocab_size (padding, parallel::padded_vocab_size) never take part.
int64_t real_cols(const Tensor& logits, int64_t vocab_start, int64_t vocab_size) {
  const int64_t V = logits.size(1);
  if (vocab_size < 0) return V;
  return std::clamp<int64_t>(vocab_size - vocab_start, 0, V);
}

// Global lse per row and, per row, the reduced (sum exp(z-M), sum exp(z-M) z, z_target).
struct RowStats {
  std::vector<float> sums;  // [3, T]
};

RowStats row_stats(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                   int64_t vocab_size, Tensor& lse) {
  const int64_t T = logits.size(0), V = real_cols(logits, vocab_start, vocab_size);
  const int32_t* tg = targets.data<int32_t>();
  float* L = lse.data<float>();
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
      L[t] = m;  // the local max for now
    }
  }
  tp.all_reduce(L, T, DType::F32, ReduceOp::Max);
  RowStats st;
  st.sums.assign(size_t(3 * T), 0.f);
  float* S = st.sums.data();
  float* SZ = S + T;
  float* ZT = S + 2 * T;
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);
      const float m = L[t];
      double s = 0, sz = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double e = std::exp(double(z[v]) - double(m));
        s += e;
        sz += e * double(z[v]);
      }
      S[t] = float(s);
      SZ[t] = float(sz);
      const int64_t local = int64_t(tg[t]) - vocab_start;
      ZT[t] = (tg[t] >= 0 && local >= 0 && local < V) ? z[local] : 0.f;
    }
  }
  tp.all_reduce(S, 3 * T, DType::F32, ReduceOp::Sum);
  for (int64_t t = 0; t < T; ++t) L[t] = float(double(L[t]) + std::log(double(S[t])));
  return st;
}

}  // namespace

void vocab_logprob_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& logprob, Tensor* entropy, Tensor& lse,
                               int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1)) {
    ops::logprob_entropy_fwd(logits, targets, logprob, entropy, lse);
    return;
  }
  check_args("vocab_logprob_entropy_fwd", logits, targets, lse);
  const int64_t T = logits.size(0);
  RowStats st = row_stats(tp, logits, targets, vocab_start, vocab_size, lse);
  const int32_t* tg = targets.data<int32_t>();
  const float* L = lse.data<float>();
  float* lp = logprob.data<float>();
  float* en = entropy ? entropy->data<float>() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    lp[t] = tg[t] >= 0 ? float(double(st.sums[size_t(2 * T + t)]) - double(L[t])) : 0.f;
    // sum p z = (sum e z) / S with e = exp(z - M); H = lse - sum p z.
    if (en) en[t] = float(double(L[t]) - double(st.sums[size_t(T + t)]) / double(st.sums[size_t(t)]));
  }
}

void vocab_logprob_entropy_bwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, const Tensor& lse, const Tensor& dlogprob,
                               const Tensor* dentropy, const Tensor* entropy, Tensor& dlogits,
                               int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1)) {
    ops::logprob_entropy_bwd(logits, targets, lse, dlogprob, dentropy, dlogits);
    return;
  }
  check_args("vocab_logprob_entropy_bwd", logits, targets, lse);
  KS_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == logits.numel(),
           "vocab_logprob_entropy_bwd: dlogits must be f32 ", shape_str(logits.shape()), ", got ", dlogits.describe());
  KS_CHECK(!dentropy || (entropy && entropy->numel() == logits.size(0)),
           "vocab_logprob_entropy_bwd: a dentropy needs the forward's entropy");
  const int64_t T = logits.size(0), V = logits.size(1), Vr = real_cols(logits, vocab_start, vocab_size);
  const int32_t* tg = targets.data<int32_t>();
  const float* L = lse.data<float>();
  const float* dl = dlogprob.data<float>();
  const float* de = dentropy ? dentropy->data<float>() : nullptr;
  const float* H = entropy ? entropy->data<float>() : nullptr;
  float* out = dlogits.data<float>();
#pragma omp parallel
  {
    std::vector<float> tmp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* z = row_f32(logits, t, tmp);  // read before the (possibly aliased) write
      float* d = out + t * V;
      const double g = tg[t] >= 0 ? double(dl[t]) : 0.0;
      const double ge = de ? double(de[t]) : 0.0;
      const double h = de ? double(H[t]) : 0.0;
      const int64_t local = int64_t(tg[t]) - vocab_start;
      for (int64_t v = 0; v < Vr; ++v) {
        const double logp = double(z[v]) - double(L[t]);
        const double p = std::exp(logp);
        double r = -g * p;
        if (de) r += ge * (-p * (logp + h));
        if (v == local && tg[t] >= 0) r += g;
        d[v] = float(r);
      }
      for (int64_t v = Vr; v < V; ++v) d[v] = 0.f;  // padding columns: not in the softmax
    }
  }
}

double vocab_cross_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& lse, int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1))
    return ops::cross_entropy_fwd(logits, targets, lse);
  check_args("vocab_cross_entropy_fwd", logits, targets, lse);
  const int64_t T = logits.size(0);
  RowStats st = row_stats(tp, logits, targets, vocab_start, vocab_size, lse);
  const int32_t* tg = targets.data<int32_t>();
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t)
    if (tg[t] >= 0) {
      sum += double(lse.data<float>()[t]) - double(st.sums[size_t(2 * T + t)]);
      ++count;
    }
  return sum / double(std::max<int64_t>(1, count));
}

void vocab_cross_entropy_bwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_start, const Tensor& lse, double dloss, Tensor& dlogits,
                             int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1)) {
    ops::cross_entropy_bwd(logits, targets, lse, dloss, dlogits);
    return;
  }
  const int64_t T = logits.size(0);
  const int32_t* tg = targets.data<int32_t>();
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) count += tg[t] >= 0;
  // d loss / d logprob[t] = -dloss / count on counted rows.
  Tensor dlp = Tensor::empty({T}, DType::F32, MemCategory::Activations);
  const float g = float(-dloss / double(std::max<int64_t>(1, count)));
  for (int64_t t = 0; t < T; ++t) dlp.data<float>()[t] = tg[t] >= 0 ? g : 0.f;
  vocab_logprob_entropy_bwd(tp, logits, targets, vocab_start, lse, dlp, nullptr, nullptr, dlogits, vocab_size);
}

}  // namespace kestrel::parallel
