#include "parallel/vocab_loss.h"

#include <algorithm>
#include <vector>

#include "ops/loss.h"
#include "ops/vocab_loss.h"

namespace kestrel::parallel {

using comm::ReduceOp;

namespace {

void check_args(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& lse) {
  KS_CHECK(logits.dim() == 2, op, ": logits must be [T, V/n], got ", logits.describe());
  KS_CHECK(logits.dtype() == DType::F32 || logits.dtype() == DType::BF16, op, ": logits must be f32 or bf16, got ",
           logits.describe());
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

// The global max per row in lse (flat [T] view of it) and the reduced
// [3, T] = (sum exp(z - M), sum exp(z - M) z, z_target), returned.
Tensor row_stats(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                 int64_t vocab_size, Tensor& lse) {
  const int64_t T = logits.size(0), Vr = real_cols(logits, vocab_start, vocab_size);
  ops::vocab_row_max(logits, Vr, lse);  // the local max for now
  tp.all_reduce(lse, ReduceOp::Max);
  Tensor sums = Tensor::empty({3, T}, DType::F32, MemCategory::Activations, logits.device());  // [3, T]
  ops::vocab_row_sums(logits, targets, vocab_start, Vr, lse, sums);
  tp.all_reduce(sums, ReduceOp::Sum);
  return sums;
}

// [T] views of per-row tensors (callers may pass any shape of T elements).
Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

}  // namespace

void vocab_logprob_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& logprob, Tensor* entropy, Tensor& lse,
                               int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1)) {
    ops::logprob_entropy_fwd(logits, targets, logprob, entropy, lse);
    return;
  }
  check_args("vocab_logprob_entropy_fwd", logits, targets, lse);
  Tensor tg = flat(targets), L = flat(lse), lp = flat(logprob), en;
  if (entropy) en = flat(*entropy);
  Tensor sums = row_stats(tp, logits, tg, vocab_start, vocab_size, L);
  ops::vocab_softmax_finish(sums, tg, L, &lp, entropy ? &en : nullptr);
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
  Tensor d = dlogits.view(logits.shape()), de, H;
  if (dentropy) {
    de = flat(*dentropy);
    H = flat(*entropy);
  }
  ops::vocab_logprob_entropy_grad(logits, flat(targets), vocab_start, real_cols(logits, vocab_start, vocab_size),
                                  flat(lse), flat(dlogprob), dentropy ? &de : nullptr, dentropy ? &H : nullptr, d);
}

double vocab_cross_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& lse, int64_t vocab_size) {
  if (tp.size() == 1 && vocab_start == 0 && real_cols(logits, 0, vocab_size) == logits.size(1))
    return ops::cross_entropy_fwd(logits, targets, lse);
  check_args("vocab_cross_entropy_fwd", logits, targets, lse);
  const int64_t T = logits.size(0);
  Tensor tg = flat(targets), L = flat(lse);
  Tensor sums = row_stats(tp, logits, tg, vocab_start, vocab_size, L);
  ops::vocab_softmax_finish(sums, tg, L, nullptr, nullptr);
  // The mean is a host scalar: read the [T] vectors back and add in row order.
  const std::vector<int32_t> t_host = tg.to_host<int32_t>();
  const std::vector<float> l_host = L.to_host<float>();
  const std::vector<float> zt_host = sums.slice_rows(2, 3).to_host<float>();  // z_target
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t)
    if (t_host[size_t(t)] >= 0) {
      sum += double(l_host[size_t(t)]) - double(zt_host[size_t(t)]);
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
  KS_CHECK(targets.dtype() == DType::I32 && targets.numel() == T, "vocab_cross_entropy_bwd: targets must be i32 [",
           T, "], got ", targets.describe());
  const std::vector<int32_t> tg = flat(targets).to_host<int32_t>();
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) count += tg[size_t(t)] >= 0;
  // d loss / d logprob[t] = -dloss / count on counted rows.
  const float g = float(-dloss / double(std::max<int64_t>(1, count)));
  std::vector<float> dlp(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) dlp[size_t(t)] = tg[size_t(t)] >= 0 ? g : 0.f;
  const Tensor dlp_t = Tensor::from_host(dlp, {T}, MemCategory::Activations, logits.device());
  vocab_logprob_entropy_bwd(tp, logits, targets, vocab_start, lse, dlp_t, nullptr, nullptr, dlogits, vocab_size);
}

}  // namespace kestrel::parallel
