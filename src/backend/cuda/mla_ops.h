// CUDA kernels of ops/mla.h. Metadata tensors (slots, tables) are on the
// device and already checked by the ops layer (from host copies).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cuda {

struct MlaArgs {
  int64_t n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  float scale;  // resolved (> 0)
};

void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaArgs& a, Tensor& q_lat);
void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaArgs& a, Tensor& o);
void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache);
void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                const Tensor& cu_q, const Tensor& seq_lens, const MlaArgs& a, Tensor& o_lat);

}  // namespace kestrel::cuda
