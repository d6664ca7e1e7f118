// Launchers of the block-attention kernels of ring context parallelism
// (kernels_block.cu; ops/attention.h attention_block_*). Row metadata
// (cu_q, cu_k, q_pos, k_pos) on the device, already checked.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {

struct BlockArgs {
  const int32_t *cu_q, *cu_k, *q_pos, *k_pos;
  int n_seqs;
  int64_t Tq, Tk;
  int H, Hkv, hd, vd;
  float scale;
};
// out [Tq, H*vd] (kind ko) and lse f32 [H, Tq] written; 0 / -inf for rows that see no key.
void attention_block_fwd(const void* q, const void* k, const void* v, FloatKind kd, const BlockArgs& a, void* out,
                         FloatKind ko, float* lse, void* stream);
// (out, lse) <- the log-sum-exp merge with (out_b, lse_b); rows of H*vd.
void attention_merge(void* out, FloatKind ko, float* lse, const void* out_b, FloatKind kb, const float* lse_b, int H,
                     int64_t Tq, int vd, void* stream);
// dq f32 += ; dk, dv f32 written; out/dout of kind ko; dsum_scratch f32 [H, Tq].
void attention_block_bwd(const void* q, const void* k, const void* v, FloatKind kd, const void* out, const void* dout,
                         FloatKind ko, const float* lse, const BlockArgs& a, float* dsum_scratch, float* dq, float* dk,
                         float* dv, void* stream);

}  // namespace kestrel::cuda::launch
