// Vocab-parallel log-softmax quantities (Megatron's vocab_parallel_cross_entropy,
// extended to entropy): the logits are sharded on the vocabulary dimension,
// rank r holding columns [vocab_start, vocab_start + V/n) as [T, V/n]. Per row
// only [T]-sized vectors travel: one all-reduce(max) of the row maxima, then one
// all-reduce(sum) of [3, T] = (sum exp(z - M), sum exp(z - M) * z, target
// logit) — the full [T, V] logits are never gathered. From those:
//   lse = M + log S,  logprob = z_target - lse,  entropy = lse - (sum p z).
// Backward needs no communication: p = exp(z - lse) is local.
// With a size-1 group these call ops::logprob_entropy_* / cross_entropy_*
// directly, so the single-process results are the op's, bit for bit.
#pragma once
#include "comm/process_group.h"
#include "core/tensor.h"

namespace kestrel::parallel {

// logits [T, V/n] (f32 or bf16); targets i32 [T] global ids (< 0: no target,
// logprob 0); logprob, entropy (may be nullptr), lse: f32 [T].
// vocab_size >= 0: the real vocabulary; columns at global index >= vocab_size
// are padding (parallel::padded_vocab_size) and take no part: not in the
// softmax, the entropy or the max, and their dlogits are 0. -1: every column is real.
void vocab_logprob_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& logprob, Tensor* entropy, Tensor& lse,
                               int64_t vocab_size = -1);
// dlogits [T, V/n] (f32; may alias f32 logits) = dlogprob * (onehot - p)
// + dentropy * (-p * (log p + H)); dentropy may be nullptr. Needs the entropy
// of the forward when dentropy is given (H per row).
void vocab_logprob_entropy_bwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, const Tensor& lse, const Tensor& dlogprob,
                               const Tensor* dentropy, const Tensor* entropy, Tensor& dlogits,
                               int64_t vocab_size = -1);

// Masked mean cross-entropy over the sharded logits: sum(-logprob) / max(1, count)
// over rows with target >= 0; identical on every rank.
double vocab_cross_entropy_fwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_start, Tensor& lse, int64_t vocab_size = -1);
// dlogits = dloss * (p - onehot) / count on counted rows, 0 elsewhere; may alias f32 logits.
void vocab_cross_entropy_bwd(comm::ProcessGroup& tp, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_start, const Tensor& lse, double dloss, Tensor& dlogits,
                             int64_t vocab_size = -1);

}  // namespace kestrel::parallel
