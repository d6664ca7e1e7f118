// Flash attention on CPU over packed sequences, with shared prefixes.
//
// A sequence b that continues p (prefix_of[b] = p) is computed in "key
// coordinates" [p's rows | b's rows]: its query i sits at position P + i
// (P = p's length) and sees keys 0 .. P + i, which is the prefix's keys
// unmasked and then b's own keys causally. A plain sequence is the case P = 0.
//
// Forward: a task per (sequence, kv head, chunk of up to kFwdChunk queries)
// packs the keys it can see (prefix then own, K key-major for the score
// products, V as padded rows) into thread-local buffers, then for each query
// head of the group and each 64-query block runs an online softmax over
// 64-key blocks up to the diagonal; the score tiles stop at the last key the
// tile's rows can see (2-vector granularity: 16 keys with AVX2, 32 with
// AVX-512), so short sequences do not pay for whole 64x64 blocks.
//
// Backward (FlashAttention-2 recompute): a task per (root sequence, kv head)
// owns the root and every sequence continuing it. It keeps dK/dV of the root
// rows in a thread-local buffer while it runs the root's own queries and then
// each continuation's (in sequence order, the continuation's keys packed right
// after the root's), so the root's dK/dV sum all of them without races, and
// the query heads of the group are summed in head order. The summation order
// is fixed by the task, never by the thread that runs it: results do not
// depend on the thread count.
//
// Values may be narrower or wider than queries and keys (v_head_dim, MLA's
// decompressed heads): K / Q rows are padded to dp = round_up(head_dim, kVec),
// V / dO / the output accumulators to dvp = round_up(v_head_dim, kVec); with
// v_head_dim == head_dim this is the same code and arithmetic as before.
#include "backend/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/attention_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* cu_seqlens, int64_t n_seqs,
                   const AttnParams& p, Tensor& out, Tensor& lse, const int32_t* prefix_of) {
  KESTREL_ISA_CALL(attention_fwd, q, k, v, cu_seqlens, n_seqs, p, out, lse, prefix_of);
}

void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const int32_t* cu_seqlens, int64_t n_seqs, const AttnParams& p, Tensor& dq,
                   Tensor& dk, Tensor& dv, const int32_t* prefix_of) {
  KESTREL_ISA_CALL(attention_bwd, q, k, v, out, lse, dout, cu_seqlens, n_seqs, p, dq, dk, dv, prefix_of);
}

}  // namespace kestrel::cpu
