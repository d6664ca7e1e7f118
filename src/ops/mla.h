// Multi-head latent attention (DeepSeek-V2/V3) in the rollout: the compressed
// KV cache and the absorbed-weight attention over it.
//
// MLA's keys and values of head h are up-projections of one per-token latent:
//   k_h = [W_UK_h c_kv | k_pe],  v_h = W_UV_h c_kv
// with c_kv [kv_lora_rank] (normed) and k_pe [rope] (RoPE'd, shared by all
// heads), W_UK_h / W_UV_h the rows of kv_b_proj.weight [H*(nope+v), kv_lora]
// belonging to head h (rows h*(nope+v) .. +nope, then the next v rows). The
// cache therefore keeps only [c_kv | k_pe] per token (kv_lora + rope values
// per layer, not 2*H*head_dim), and attention runs in the latent space:
//   q_lat_h = [q_nope_h W_UK_h | q_pe_h]              [kv_lora + rope]
//   score   = q_lat_h . [c_kv | k_pe]  (= q_h . k_h)  times the softmax scale
//   o_lat_h = sum_j p_j c_kv_j                          [kv_lora]
//   o_h     = W_UV_h o_lat_h                             [v]
// which equals the decompressed attention in exact arithmetic (vLLM's and
// DeepSeek's absorbed decode path). Scalar references: ops/ref/mla_ref.h.
#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

struct MlaShape {
  int64_t n_heads = 0;
  int64_t kv_lora_rank = 0;  // latent width (c_kv)
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  float scale = 0.f;  // softmax scale; 0 = 1/sqrt(nope + rope)
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cache width
};

// q [T, H*(nope+rope)] (RoPE already applied to each head's last rope
// columns), kv_b [H*(nope+v), kv_lora] (kv_b_proj.weight) ->
// q_lat [T, H*(kv_lora+rope)]: per head, q_nope_h @ W_UK_h, then q_pe_h copied.
// f32 or bf16, each tensor independently (f32 accumulation, rounded once).
void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaShape& s, Tensor& q_lat);
// o_lat [T, H*kv_lora], kv_b as above -> o [T, H*v]: per head, o_lat_h @ W_UV_h^T.
void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaShape& s, Tensor& o);

// Writes each new token's latent [c_kv | k_pe] into its cache slot.
// c_kv [T, kv_lora], k_pe [T, rope]; slot_mapping i32 [T] (-1 skips the row);
// cache [num_blocks, block_size, kv_lora + rope] (model dtype; c_kv and k_pe
// share it: values are copied, not converted).
void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache);

// Causal attention of a packed batch of query chunks over the latent cache,
// with the chunk/sequence conventions of ops::paged_attention_fwd (cu_q,
// seq_lens, block_tables): q_lat [T, H*(kv_lora+rope)] (mla_absorb_q's),
// keys = the cache rows, values = their first kv_lora columns; o_lat
// [T, H*kv_lora]. One latent "kv head" shared by all H query heads (MQA).
void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                const Tensor& cu_q, const Tensor& seq_lens, const MlaShape& s, Tensor& o_lat);

}  // namespace kestrel::ops
