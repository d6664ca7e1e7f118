// Launchers of the MLA kernels (kernels_mla.cu): the absorbed-weight
// projections, the latent cache writes and the latent attention of
// ops/mla.h. Raw device pointers, enqueued on `stream`, no synchronisation.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {

struct MlaDims {
  int64_t T;
  int H, kv_lora, nope, rope, v;
  float scale;  // resolved (> 0)
};
// q_lat[t, h] = [q_nope[t, h] @ W_UK_h | q_pe[t, h]]; kv_b [H*(nope+v), kv_lora].
void mla_absorb_q(const void* q, FloatKind kq, const void* kv_b, FloatKind kw, const MlaDims& d, void* q_lat,
                  FloatKind ko, void* stream);
// o[t, h] = o_lat[t, h] @ W_UV_h^T.
void mla_absorb_out(const void* o_lat, FloatKind ki, const void* kv_b, FloatKind kw, const MlaDims& d, void* o,
                    FloatKind ko, void* stream);
// cache[slot[t]] = [c_kv[t] | k_pe[t]] for slot >= 0 (one kind: copied).
void paged_latent_write(const void* c_kv, const void* k_pe, FloatKind k, const int32_t* slots, int64_t T, int kv_lora,
                        int rope, void* cache, void* stream);
// o_lat [T, H*kv_lora] from q_lat [T, H*(kv_lora+rope)] over the latent cache (one shared kv head).
int mla_max_latent_dim();
void paged_latent_attention_fwd(const void* q_lat, const void* cache, FloatKind k, const int32_t* block_tables,
                                const int32_t* cu_q, const int32_t* seq_lens, int B, const MlaDims& d, int block_size,
                                int max_blocks, void* o_lat, void* stream);

}  // namespace kestrel::cuda::launch
