// CUDA kernels of ops/paged_attention.h. Metadata tensors are on the device
// and already checked by the ops layer (from host copies).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kestrel::cuda {

void paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache);
// scale resolved (> 0); block_size and max_blocks from the cache and the table.
void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                         const Tensor& cu_q, const Tensor& seq_lens, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim, float scale, Tensor& out);
// Both caches on the device (the ops layer moves blocks between host and device with copies).
void copy_kv_blocks(const Tensor& src_cache, Tensor& dst_cache, const std::vector<std::pair<int32_t, int32_t>>& pairs);

}  // namespace kestrel::cuda
