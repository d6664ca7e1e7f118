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
// Bodies in loss_isa.inc, compiled per ISA level (isa.h); the row sums are
// vector partial sums folded by hsum, so the levels differ by f32 rounding.
//
// Conventions (the reference ops/ref/loss_ref.h follows them exactly):
// NaN logits are skipped by the max but poison the sums (row -> NaN);
// -inf logits contribute p = 0 and 0 * log 0 = 0 to the entropy; a +inf
// logit makes the row NaN.
#include <cmath>
#include <limits>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/loss_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse) {
  KESTREL_ISA_CALL(logprob_entropy_fwd, logits, targets, logprob, entropy, lse);
}

void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const float* coef_logprob,
                         const float* coef_entropy, Tensor& dlogits) {
  KESTREL_ISA_CALL(logprob_entropy_bwd, logits, targets, lse, coef_logprob, coef_entropy, dlogits);
}

}  // namespace kestrel::cpu
