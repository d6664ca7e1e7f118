// Attention over a paged KV cache (vLLM's PagedAttention): the rollout
// engine's attention. K/V of every sequence live in fixed-size blocks of a
// per-layer cache, found through each sequence's block table, so sequences
// grow without copies and share prefix blocks.
//
// Cache layout, per layer: k_cache, v_cache [num_blocks, block_size, n_kv_heads, head_dim]
// (token slot s of block b is row b*block_size + s of a [num_blocks*block_size, kv_dim] matrix).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/attention.h"

namespace kestrel::ops {

// Writes the new tokens' K/V rows into their cache slots.
// k, v: [T, n_kv_heads*head_dim]; slot_mapping: i32 [T] (slot = block*block_size + offset;
// -1 skips the row, vLLM's PAD_SLOT_ID); caches as above, same dtype as k/v.
void paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache);

// Causal GQA attention of a packed batch of query chunks against the cache.
// q: [T, n_heads*head_dim]; sequence b owns query rows cu_q[b]..cu_q[b+1]
// (cu_q: i32 [B+1]) and has seq_lens[b] tokens of context including this
// chunk (seq_lens: i32 [B]), so its query row i sits at absolute position
// seq_lens[b] - q_len_b + i and attends to keys 0..that position.
// block_tables: i32 [B, max_blocks] (row b lists the blocks holding
// positions 0, block_size, 2*block_size, ...; entries past the context are
// ignored). The chunk's own K/V must already be in the cache (paged_kv_write).
// out: like q. Scale as in AttentionShape (0 = 1/sqrt(head_dim)).
void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                         const Tensor& cu_q, const Tensor& seq_lens, const AttentionShape& s, Tensor& out);

// Copies whole blocks between two caches of the same geometry and dtype
// (device <-> host swap, fork of a partial block): for each pair (src, dst),
// dst_cache[dst] = src_cache[src]. One batched call per layer and direction,
// not one transfer per block. src and dst may be the same tensor when no
// pair's destination is another pair's source.
void copy_kv_blocks(const Tensor& src_cache, Tensor& dst_cache, const std::vector<std::pair<int32_t, int32_t>>& pairs);

}  // namespace kestrel::ops
