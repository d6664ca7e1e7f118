// Multi-head latent attention on the CPU: the absorbed-weight projections,
// the latent cache write and the paged attention over latent rows.
// Contracts as in ops/mla.h; ops/mla.cpp has validated shapes, dtypes and
// indices.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cpu {

struct MlaParams {
  int64_t n_heads = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  float scale = 0.f;       // resolved (never 0 here)
  int64_t block_size = 0;  // cache rows per block
  int64_t max_blocks = 0;  // row length of block_tables
};

// Per-head GEMMs through the backend GEMM (gemm.h); bf16 operands widened to
// f32, results rounded once.
void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaParams& p, Tensor& q_lat);
void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaParams& p, Tensor& o);

// slots: T entries, -1 = skip, else a row of the cache (checked by the caller).
void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const int32_t* slots, Tensor& cache);

// Work is split over (sequence, tile of query rows, group of query heads),
// at most 32 query vectors (row, head) per task, so one read of a latent row
// serves all of them. Online softmax in f32 over 64-key chunks; each output
// element is computed by one task in a fixed order, so results do not depend
// on the thread count or on which other sequences share the batch.
void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const int32_t* block_tables,
                                const int32_t* cu_q, const int32_t* seq_lens, int64_t n_seqs, const MlaParams& p,
                                Tensor& o_lat);

}  // namespace kestrel::cpu
