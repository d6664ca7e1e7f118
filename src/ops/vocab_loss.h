// The local pieces of the vocab-parallel log-softmax (parallel/vocab_loss.h
// runs them with the collectives between them). Each rank holds a shard of
// the logits on the vocabulary dimension, [T, Vs] (f32 or bf16) with global
// columns [vocab_start, vocab_start + Vs); only its first n_real columns are
// real vocabulary (the rest are padding, parallel::padded_vocab_size, and
// take no part). Per row t, with z = logits[t, :n_real]:
//   vocab_row_max         M_local[t] = max z              -> all-reduce(max) -> M
//   vocab_row_sums        (sum exp(z - M), sum exp(z - M) z, z_target) -> all-reduce(sum)
//   vocab_softmax_finish  lse = M + log S, logprob = z_target - lse, H = lse - SZ / S
//   vocab_logprob_entropy_grad  dlogits from lse (no communication)
// Sums are accumulated in double per row and stored f32, so the split over
// ranks is the only change to the single-shard arithmetic.
// Scalar references: ops/ref/vocab_loss_ref.h.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::ops {

// row_max f32 [T]: the max of logits[t, :n_real] (std::max, so NaN logits are
// skipped; -inf for n_real == 0). 0 <= n_real <= Vs.
void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max);

// sums f32 [3, T] with M = row_max f32 [T] (the max over every shard):
//   sums[0, t] = sum_{v < n_real} exp(z_v - M_t), sums[1, t] = sum exp(z_v - M_t) * z_v,
//   sums[2, t] = logits[t, targets[t] - vocab_start] when targets[t] >= 0 and
//   that column is one of this shard's real ones, else 0.
// targets: i32 [T] global ids.
void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums);

// From the sums reduced over every shard: lse f32 [T] holds M on entry and
// M + log S on return; logprob f32 [T] (may be nullptr) = z_target - lse
// (0 where targets < 0); entropy f32 [T] (may be nullptr) = lse - SZ / S.
void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy);

// dlogits f32 [T, Vs] (may alias f32 logits) =
//   dlogprob * (onehot - p) + dentropy * (-p * (log p + H)) on real columns,
//   with p = exp(z - lse), the one-hot term only on rows with a target and
//   at its column in this shard; 0 on padding columns. dentropy and entropy
//   (H, the forward's) are both given or both nullptr.
void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits);

}  // namespace kestrel::ops
