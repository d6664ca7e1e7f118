// Context-parallel causal attention over a cp group, on the rows a CpLayout
// gives each rank (parallel/cp_split.h). q, k, v, out and their gradients are
// the rank's local rows with all of the rank's heads (after tensor
// parallelism): q [Tl, H*hd], k [Tl, Hkv*hd], v [Tl, Hkv*vd], out [Tl, H*vd]
// (vd = s.value_dim()), one dtype (f32 or bf16), like ops::attention_fwd.
//
//  - Ulysses (u = cp, MindSpeed ulysses_cp_algo): an all-to-all per tensor
//    scatters the heads and gathers the sequence, so each rank holds H/u heads
//    of the whole padded batch in natural order; ops::attention_fwd/bwd runs
//    there; the inverse all-to-all brings the output (or the gradients) back.
//    With fewer kv heads than u, each rank receives a copy of the kv head of
//    its query heads; the backward sums the copies' gradients.
//  - Ring (u = 1, megatron_cp_algo): each rank keeps its queries; the k/v
//    blocks travel around the ring (the next block's isend/irecv posted
//    before the current block computes), ops::attention_block_fwd attends the
//    queries to each block by position, ops::attention_merge combines them by
//    log-sum-exp. The backward runs the ring again from the final out and
//    lse with each block's dK/dV accumulator travelling with it (FlashAttention-2
//    backward per block, dQ accumulating locally).
//  - Hybrid (hybrid_cp_algo): Ulysses inside groups of u consecutive cp
//    ranks, the ring across the cp/u groups, on the Ulysses head shard.
// Results equal one process's ops::attention_fwd/bwd over the full batch on
// every real row (f32 to rounding); pad rows give zero gradients when their
// dout is zero (it is: pad rows never reach a loss).
#pragma once
#include <memory>

#include "comm/process_group.h"
#include "comm/world.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "parallel/cp_split.h"
#include "parallel/grid.h"

namespace kestrel::parallel {

// The groups one context-parallel attention talks over.
struct CpGroups {
  std::shared_ptr<comm::ProcessGroup> cp;       // the whole cp group (scoring's cp_gather_rows)
  std::shared_ptr<comm::ProcessGroup> ulysses;  // the u consecutive cp ranks of this rank's Ulysses group
  std::shared_ptr<comm::ProcessGroup> ring;     // the cp/u ranks at this rank's place in every Ulysses group
  int ulysses_degree() const { return ulysses->size(); }
};
// Collective over the world (every rank calls it with the same u): the cp
// group itself serves as the Ulysses group (u = cp) or the ring (u = 1);
// otherwise two world splits make the hybrid's groups. Names "cp_ulysses", "cp_ring".
CpGroups make_cp_groups(const comm::World& world, const GridLayout& layout, std::shared_ptr<comm::ProcessGroup> cp,
                        int ulysses_degree);
// The hybrid's own splits carry the grid's device's buffers as its groups do (ProcessGrid::adopt).
inline CpGroups make_cp_groups(const comm::World& world, const ProcessGrid& grid, int ulysses_degree) {
  CpGroups g = make_cp_groups(world, grid.layout(), grid.group(GroupKind::Cp), ulysses_degree);
  g.ulysses = grid.adopt(g.ulysses);
  g.ring = grid.adopt(g.ring);
  return g;
}

// The head shape each rank attends with: H/u query heads, Hkv/u kv heads (or
// one, replicated, when Hkv < u), the same head widths and scale.
ops::AttentionShape cp_work_shape(const ops::AttentionShape& s, int ulysses_degree);

// What the backward needs from the forward, in the work layout (cp_split.h):
// Tg = u * Tl rows, the Ulysses head shard. With u = 1 q, k, v and out are the
// caller's own tensors (no copy).
struct CpAttentionSaved {
  Tensor q, k, v;  // [Tg, Hw*hd], [Tg, Hkw*hd], [Tg, Hkw*vd]
  Tensor out;      // [Tg, Hw*vd]
  Tensor lse;      // f32 [Hw, Tg], log-sum-exp over every visible key of the full sequence
};

// out [Tl, H*vd] written (caller-allocated); saved filled.
void cp_attention_fwd(const CpGroups& groups, const CpLayout& layout, const ops::AttentionShape& s, const Tensor& q,
                      const Tensor& k, const Tensor& v, Tensor& out, CpAttentionSaved& saved);
// dq, dk, dv [Tl, ...] written (caller-allocated) from dout [Tl, H*vd]; dout
// and the gradients in q's dtype or all f32 (bf16 training's activation grads).
void cp_attention_bwd(const CpGroups& groups, const CpLayout& layout, const ops::AttentionShape& s,
                      const CpAttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

// The Ulysses all-to-all (collective over the Ulysses group): x [Tl, n_heads*w]
// (heads of width w) -> [Tg, nw*w], this rank's n_heads/u heads (nw = 1, a
// copy of head j / (u / n_heads), when n_heads < u) of every row of its group
// in work order. Returns x itself when u = 1.
Tensor ulysses_scatter_heads(comm::ProcessGroup& ulysses, const CpLayout& layout, const Tensor& x, int64_t n_heads,
                             MemCategory cat = MemCategory::Activations);
// The inverse: work [Tg, nw*w] -> out [Tl, n_heads*w] (written). With
// n_heads < u the copies of each head are summed in f32 (the adjoint of the
// scatter's copies: gradients), so that round trip gives (u / n_heads) * x.
void ulysses_gather_heads(comm::ProcessGroup& ulysses, const CpLayout& layout, const Tensor& work, int64_t n_heads,
                          Tensor& out);

// Ring attention on the work layout (collective over the ring group; its size
// and rank are the layout's ring() and ring_index()): q [Tg, H*hd], k/v
// [Tg, Hkv*hd / Hkv*vd] of this rank's group, s the work shape. out written
// (q's dtype), lse f32 [H, Tg] written.
void ring_attention_fwd(comm::ProcessGroup& ring, const CpLayout& layout, const ops::AttentionShape& s,
                        const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse);
// dq, dk, dv written (dout's dtype: q's or f32) from the forward's final out and lse.
void ring_attention_bwd(comm::ProcessGroup& ring, const CpLayout& layout, const ops::AttentionShape& s,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

// Bytes one rank sends to other ranks in one attention call (the closed form
// of the algorithms above, for the communication model and its test).
struct CpAttentionBytes {
  double ulysses_fwd = 0, ulysses_bwd = 0;  // all-to-alls: q, k, v, out / dout, dq, dk, dv
  double ring_fwd = 0, ring_bwd = 0;        // isends: k/v blocks / (R-1) k/v blocks and R f32 dK/dV blocks
  int64_t ulysses_calls_fwd = 0, ulysses_calls_bwd = 0, ring_sends_fwd = 0, ring_sends_bwd = 0;
};
CpAttentionBytes cp_attention_bytes(const CpLayout& layout, const ops::AttentionShape& s, DType dtype);

}  // namespace kestrel::parallel
