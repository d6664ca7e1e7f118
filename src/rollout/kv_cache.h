// K/V storage of the paged cache: per layer, K and V arrays
// [num_blocks, block_size, n_kv_heads, head_dim] in the model dtype
// (MemCategory::KVCache), plus the host swap area preemption copies blocks
// into. Sleep frees both; wake re-allocates the device arrays. Under tensor
// parallelism each rank's cache holds only its own kv heads
// (CausalLM::heads().n_kv_heads: Hkv/tp, or 1 replicated head when Hkv < tp),
// with the same block ids on every rank (the schedulers run in lockstep).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kestrel::rollout {

struct KVGeometry {
  int64_t n_layers = 0, num_blocks = 0, block_size = 0, n_kv_heads = 0, head_dim = 0;  // n_kv_heads: per tp rank
  DType dtype = DType::F32;
  // K and V of one block over all layers.
  int64_t bytes_per_block() const {
    return 2 * n_layers * block_size * n_kv_heads * head_dim * int64_t(dtype_size(dtype));
  }
};

class KVCache {
 public:
  explicit KVCache(const KVGeometry& g);
  const KVGeometry& geometry() const { return g_; }

  bool allocated() const { return !k_.empty(); }
  void allocate();
  void release();   // device arrays and swap area

  Tensor& k(int64_t layer) { return k_[size_t(layer)]; }
  Tensor& v(int64_t layer) { return v_[size_t(layer)]; }

  // Host swap area of `capacity_blocks` blocks (allocated on first use).
  void set_swap_capacity(int64_t capacity_blocks) { swap_capacity_ = capacity_blocks; }
  int64_t swap_capacity() const { return swap_capacity_; }
  int64_t swap_free() const;
  // Reserves n host blocks (nullopt-like empty result when fewer are free).
  std::vector<int32_t> swap_reserve(int64_t n);
  void swap_release(const std::vector<int32_t>& ids);
  // Batched copies, one call per layer and direction: (device block, host block).
  void swap_out(const std::vector<std::pair<int32_t, int32_t>>& dev_to_host);
  void swap_in(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev);
  // Device block copies (a forked sample's copy of the partial last block).
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_to_dst);

 private:
  void ensure_swap_area();

  KVGeometry g_;
  std::vector<Tensor> k_, v_;            // per layer, device
  std::vector<Tensor> swap_k_, swap_v_;  // per layer, host [capacity, block_size, n_kv_heads, head_dim]
  int64_t swap_capacity_ = 0;
  std::vector<int32_t> swap_free_list_;
};

}  // namespace kestrel::rollout
