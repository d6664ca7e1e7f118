// CPU kernels of ops/vocab_loss.h. Same contracts; the ops layer has checked
// dtypes, shapes and devices. Rows are split over OpenMP threads; within a
// row the arithmetic is sequential (double accumulation), so results do not
// depend on the thread count.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max);
void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums);
void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy);
void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits);

}  // namespace kestrel::cpu
