#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// y[T, D] = table[ids[t] - vocab_start] for ids in [vocab_start, vocab_start + V_local),
// zero rows otherwise (vocab-parallel shards sum their outputs). ids: i32 [T].
// table and y may be f32 or bf16 independently (e.g. an f32 table feeding bf16 activations).
void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start = 0);
// dtable[V_local, D] (f32) += scatter of dy rows by id (ids outside the shard skipped);
// the summation order per element is token order, whatever the thread count.
void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start = 0);

}  // namespace kestrel::ops
