#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// Fused log-softmax + gather: for logits[T, V] and targets i32 [T],
// logprob[t] = logits[t, target] - lse[t] and entropy[t] = -sum_v p log p, all f32,
// in one pass over each row without materialising a second [T, V] buffer.
// lse: f32 [T], saved for backward. entropy may be nullptr. Targets < 0 give logprob 0;
// a target >= V is an error. logits f32 or bf16. Special values: a NaN or +inf logit
// makes its row NaN; -inf logits (masked vocabulary) have p = 0 and add nothing to
// the entropy; an all -inf row has lse = -inf.
void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy,
                         Tensor& lse);
// dlogits[T, V] = dlogprob[t] * (onehot - p) + dentropy[t] * (-p * (log p + H)).
// dlogits may alias logits (the one [T, V] buffer is reused); dentropy may be nullptr.
// Rows with target < 0 get only the entropy term (zeros without dentropy). H is
// recomputed from logits and lse (one extra read of the row) when dentropy is given.
void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogprob,
                         const Tensor* dentropy, Tensor& dlogits);

// Masked mean cross-entropy: targets < 0 (HF's -100) are ignored; returns
// sum(-logprob) / max(1, count). lse as above.
double cross_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& lse);
// dlogits = dloss * (p - onehot) / count on counted rows, 0 on ignored rows; may alias logits.
void cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss, Tensor& dlogits);

}  // namespace kestrel::ops
