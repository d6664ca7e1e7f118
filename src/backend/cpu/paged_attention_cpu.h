// Paged attention, KV-slot writes and block copies on the CPU. Contracts as
// in ops/paged_attention.h; ops/paged_attention.cpp has validated shapes,
// dtypes and indices.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kestrel::cpu {

struct PagedAttnParams {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0.f;  // resolved (never 0 here)
  int64_t block_size = 0;
  int64_t max_blocks = 0;  // row length of block_tables
};

void paged_kv_write(const Tensor& k, const Tensor& v, const int32_t* slots, Tensor& k_cache, Tensor& v_cache);

// Work is split over (sequence, tile of 16 query rows, kv heads: all of them
// for a decode row, one for a large prefill tile); each task handles every
// query head of its kv groups so one read of a K/V row serves the whole group
// (GQA). Online softmax in f32, one rescale per chunk of up to 512 keys; each
// output element is computed by one task in a fixed order, so results do not
// depend on the thread count or on which other sequences share the batch.
void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const int32_t* block_tables,
                         const int32_t* cu_q, const int32_t* seq_lens, int64_t n_seqs, const PagedAttnParams& p,
                         Tensor& out);

void copy_kv_blocks(const Tensor& src, Tensor& dst, const std::vector<std::pair<int32_t, int32_t>>& pairs);

}  // namespace kestrel::cpu
