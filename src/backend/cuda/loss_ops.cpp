// Host side of the CUDA loss kernels (kernels_loss.cu).
#include "backend/cuda/loss_ops.h"

#include "backend/cuda/cuda_util.h"

namespace kestrel::cuda {
namespace {
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }
float* f32_or_null(const Tensor* t) { return t ? f32(*t) : nullptr; }
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }
}  // namespace

void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse) {
  launch::logprob_entropy_fwd(logits.raw(), float_kind(logits, "logprob_entropy_fwd"), i32(targets), logits.size(0),
                              logits.size(1), f32(logprob), f32_or_null(entropy), f32(lse), stream());
  check_launch("logprob_entropy_fwd");
}

void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const float* coef_logprob,
                         const float* coef_entropy, Tensor& dlogits) {
  launch::logprob_entropy_bwd(logits.raw(), float_kind(logits, "logprob_entropy_bwd"), i32(targets), f32(lse),
                              coef_logprob, coef_entropy, logits.size(0), logits.size(1), dlogits.raw(),
                              float_kind(dlogits, "logprob_entropy_bwd"), stream());
  check_launch("logprob_entropy_bwd");
}

void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max) {
  launch::vocab_row_max(logits.raw(), float_kind(logits, "vocab_row_max"), logits.size(0), logits.size(1), n_real,
                        f32(row_max), stream());
  check_launch("vocab_row_max");
}

void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums) {
  launch::vocab_row_sums(logits.raw(), float_kind(logits, "vocab_row_sums"), i32(targets), logits.size(0),
                         logits.size(1), vocab_start, n_real, f32(row_max), f32(sums), stream());
  check_launch("vocab_row_sums");
}

void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy) {
  launch::vocab_softmax_finish(f32(sums), i32(targets), lse.numel(), f32(lse), f32_or_null(logprob),
                               f32_or_null(entropy), stream());
  check_launch("vocab_softmax_finish");
}

void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits) {
  launch::vocab_logprob_entropy_grad(logits.raw(), float_kind(logits, "vocab_logprob_entropy_grad"), i32(targets),
                                     logits.size(0), logits.size(1), vocab_start, n_real, f32(lse), f32(dlogprob),
                                     f32_or_null(dentropy), f32_or_null(entropy), f32(dlogits), stream());
  check_launch("vocab_logprob_entropy_grad");
}

}  // namespace kestrel::cuda
