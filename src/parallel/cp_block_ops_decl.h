// SCRATCH, to be deleted when wt-cpops lands: the block attention ops'
// declarations as the context-parallel design fixes them (they will live in
// ops/attention.h). Not implemented here; the ring attention is written
// against these.
#pragma once
#include "core/tensor.h"
#include "ops/attention.h"

namespace kestrel::ops {

struct AttentionBlock {  // the rows of one block pairing, per sequence
  Tensor cu_q, cu_k;     // i32 [B+1] row ranges of each sequence in q and in k/v
  Tensor q_pos, k_pos;   // i32 [Tq], [Tk] position of each row in its sequence
};

void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                         const AttentionShape& s, Tensor& out, Tensor& lse);
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const AttentionBlock& blk, const AttentionShape& s, Tensor& dq,
                         Tensor& dk, Tensor& dv);

}  // namespace kestrel::ops
