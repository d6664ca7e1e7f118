// CPU kernels of the dense ops (linear, embedding, rmsnorm, swiglu, loss).
// Same contracts as ops/{linear,embedding,norm,activation,loss}.h; callers
// (the ops dispatch layer) have already checked shapes, dtypes and devices.
// f32 or bf16 storage, f32 math; parallel over rows with OpenMP, static
// partitions, and parameter-gradient reductions whose summation order does
// not depend on the thread count (bitwise-reproducible across --threads).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx);
void add(const Tensor& a, const Tensor& b, Tensor& y);

void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start);
void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start);

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd);
void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h);
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup);

// Per-row log-sum-exp, gathered target logit and (optionally) entropy, one pass per row.
void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse);
// dlogits[t, v] = cp[t] * (onehot - p) + ch[t] * (-p * (log p + H_t)); cp = dlogprob (or, for
// cross-entropy, -dloss/count on counted rows); ch = dentropy or nullptr. May alias logits.
void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const float* coef_logprob,
                         const float* coef_entropy, Tensor& dlogits);

}  // namespace kestrel::cpu
