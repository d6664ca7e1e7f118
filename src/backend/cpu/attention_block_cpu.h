// Block attention on CPU, the steps of ring context parallelism (see
// ops/attention.h attention_block_*): flash-style attention of query rows
// over one key/value block by position, the log-sum-exp merge of two blocks'
// partial results, and one block's backward from the final out and lse.
// Shapes, dtypes and the row metadata are validated by ops/attention.cpp;
// these assume them.
#pragma once
#include <cstdint>

#include "backend/cpu/attention_cpu.h"
#include "core/tensor.h"

namespace kestrel::cpu {

// Host copies of ops::AttentionBlock: sequence b is q rows cu_q[b]..cu_q[b+1]
// and k/v rows cu_k[b]..cu_k[b+1]; key j is visible to query i of the same
// sequence iff k_pos[j] <= q_pos[i].
struct BlockRows {
  const int32_t* cu_q;   // [n_seqs+1]
  const int32_t* cu_k;   // [n_seqs+1]
  const int32_t* q_pos;  // [Tq]
  const int32_t* k_pos;  // [Tk]
  int64_t n_seqs;
};

// q [Tq, H*hd]; k [Tk, Hkv*hd]; v [Tk, Hkv*vd] (one dtype, f32 or bf16);
// out [Tq, H*vd] in q's dtype or f32 (written: 0 where a row sees no key);
// lse f32 [H, Tq] (written: -inf where a row sees no key).
// Work is split over (sequence, kv head, up to 256 queries); no [Tq, Tk] scores exist.
void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const BlockRows& rows,
                         const AttnParams& p, Tensor& out, Tensor& lse);

// out, out_b [Tq, H*vd] (f32 or bf16 each); lse, lse_b f32 [H, Tq]: out and
// lse become those of the union of both blocks' keys. Elementwise per (row, head).
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);

// One block's backward from the final out and lse (out, dout [Tq, H*vd] in
// q's dtype or f32): dq f32 [Tq, H*hd] += ; dk f32 [Tk, Hkv*hd], dv f32
// [Tk, Hkv*vd] = . A task per (sequence, kv head) owns its keys' dK/dV and
// its queries' dQ for the heads of the group, summed in a fixed order: results
// do not depend on the thread count.
void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const BlockRows& rows, const AttnParams& p, Tensor& dq, Tensor& dk,
                         Tensor& dv);

}  // namespace kestrel::cpu
