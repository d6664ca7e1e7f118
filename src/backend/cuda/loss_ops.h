// CUDA kernels of ops/loss.h and ops/vocab_loss.h (signatures of the CPU
// kernels in backend/cpu/dense_ops.h and backend/cpu/vocab_loss.h); the
// per-row coefficient arrays of logprob_entropy_bwd are device pointers.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cuda {

void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse);
void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const float* coef_logprob,
                         const float* coef_entropy, Tensor& dlogits);

void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max);
void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums);
void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy);
void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits);

}  // namespace kestrel::cuda
