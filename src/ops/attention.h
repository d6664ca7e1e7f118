#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

struct AttentionShape {
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // GQA: n_heads % n_kv_heads == 0
  int64_t head_dim = 0;
  float scale = 0.f;       // 0 = 1/sqrt(head_dim)
  int64_t v_head_dim = 0;  // 0 = head_dim (MLA: values narrower than the query/key heads)
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

// Causal self-attention over packed variable-length sequences. With dv =
// s.value_dim() (head_dim unless v_head_dim is set, e.g. MLA's decompressed
// heads: q/k heads of qk_nope + qk_rope = 192, value heads of 128):
// q: [T, n_heads*head_dim]; k: [T, n_kv_heads*head_dim]; v: [T, n_kv_heads*dv];
// cu_seqlens: i32 [B+1] (sequence b is rows cu_seqlens[b]..cu_seqlens[b+1];
// starts at 0, ends at T, non-decreasing; empty sequences allowed);
// out: [T, n_heads*dv], caller-allocated;
// lse: f32 [n_heads, T], natural log-sum-exp of the scaled scores, kept for backward.
// q, k, v, out (and dout, dq, dk, dv) share one dtype, f32 or bf16; math is f32,
// outputs rounded once. Query head h reads kv head h / (n_heads / n_kv_heads).
// Flash-style: no [T, T] score matrix is ever materialized.
//
// Shared prefixes (prefix_of, optional): i32 [B] on the device of q, B = number
// of sequences of cu_seqlens. prefix_of[b] = -1: plain causal sequence.
// prefix_of[b] = p >= 0: sequence b continues sequence p: each query i of b
// sees every key of p, then keys 0..i of b, exactly as if p's rows were
// prepended to b (the caller gives b's rows positions that continue p's, e.g.
// for RoPE). Needs p < b and prefix_of[p] == -1 (one level); several sequences
// may continue one p; an empty p acts as no prefix. p's own queries never see
// b. This packs a GRPO group as one prompt prefix plus n branches instead of n
// copies of the prompt. Backward: dk/dv of p's rows sum the contributions of
// p's own queries and of all its continuations' queries; dq of b's rows
// include the part through p's keys. Results are deterministic and do not
// depend on the thread count (fixed summation order).
void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                   const AttentionShape& s, Tensor& out, Tensor& lse, const Tensor* prefix_of = nullptr);
// dq, dk, dv written (=), caller-allocated, same shapes as q, k, v; dout like out
// ([T, n_heads*dv]). out and lse must
// be this forward's; probabilities are recomputed from q, k and lse, with
// D_i = rowsum(dout_i * out_i) (FlashAttention-2). dk/dv sum over the heads of a group
// (and, with prefix_of, over a prefix's continuations). prefix_of as in attention_fwd.
void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const Tensor& cu_seqlens, const AttentionShape& s, Tensor& dq, Tensor& dk,
                   Tensor& dv, const Tensor* prefix_of = nullptr);

// ---- Block attention: the steps of ring context parallelism ----
// Ring context parallelism (megatron_cp_algo) keeps each rank's query rows
// and passes key/value blocks around the ring; each step attends the local
// queries to one block by position in the sequence, the partial results are
// merged by log-sum-exp, and the backward runs the ring again from the final
// out and lse. These three ops are those steps.
//
// The rows of one block pairing, per sequence of a packed batch: sequence b
// is q rows cu_q[b]..cu_q[b+1] and k/v rows cu_k[b]..cu_k[b+1] (each starts
// at 0, ends at Tq resp. Tk, non-decreasing; empty sequences allowed). Key j
// is visible to query i of the same sequence iff k_pos[j] <= q_pos[i] (the
// rows' positions in their sequence: causal attention by position, so any
// split of a sequence's rows over q and k blocks, e.g. the zigzag chunks,
// works). Positions need not be sorted; the kernels are fastest when they
// are (the order in which CP ranks hold their rows).
struct AttentionBlock {
  Tensor cu_q, cu_k;    // i32 [B+1] row ranges of each sequence in q and in k/v
  Tensor q_pos, k_pos;  // i32 [Tq], [Tk] position of each row in its sequence
};

// Attention of q [Tq, H*hd] over k [Tk, Hkv*hd], v [Tk, Hkv*vd] (hd =
// s.head_dim, vd = s.value_dim(); q, k, v one dtype, f32 or bf16; GQA as
// attention_fwd). Writes out [Tq, H*vd], normalised over this block's visible
// keys (0 for a row that sees none), in q's dtype or f32 (f32 keeps a ring's
// partial results unrounded until the last merge), and lse f32 [H, Tq] (-inf
// for a row that sees none). f32 math; deterministic, thread-count independent.
void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                         const AttentionShape& s, Tensor& out, Tensor& lse);

// (out, lse) <- the softmax over the union of both blocks' keys:
// out = (e^lse out + e^lse_b out_b) / (e^lse + e^lse_b), lse = log(e^lse + e^lse_b),
// computed in f32 and stored in out's dtype. out, out_b [Tq, H*vd] (f32 or
// bf16, each its own); lse, lse_b f32 [H, Tq]. A side whose lse is -inf has
// no visible key and weight 0: merging a block no query sees leaves out and
// lse bit-identical, and merging into out = 0, lse = -inf (an empty
// accumulator) copies out_b and lse_b. Rows where both are -inf keep out.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);

// Backward of one block from the FINAL out and lse of the query rows (after
// every block has been merged; FlashAttention-2 with D_i = rowsum(dout_i *
// out_i)): dq f32 [Tq, H*hd] accumulated (+=), so the sum over the blocks is
// the full dq; dk f32 [Tk, Hkv*hd] and dv f32 [Tk, Hkv*vd] written (=), the
// block's share of its keys' gradients (0 for keys no query sees). out and
// dout [Tq, H*vd] in q's dtype or f32; lse f32 [H, Tq].
void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const AttentionBlock& blk, const AttentionShape& s, Tensor& dq,
                         Tensor& dk, Tensor& dv);

}  // namespace kestrel::ops
