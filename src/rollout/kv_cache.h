// K/V storage of the paged cache, in the model dtype (MemCategory::KVCache),
// plus the host swap area preemption copies blocks into. Two kinds:
//  - GQA (dense attention): per layer, K and V arrays
//    [num_blocks, block_size, n_kv_heads, head_dim]. Under tensor parallelism
//    each rank's cache holds only its own kv heads (CausalLM::heads().n_kv_heads:
//    Hkv/tp, or 1 replicated head when Hkv < tp), with the same block ids on
//    every rank (the schedulers run in lockstep).
//  - latent (MLA, DeepSeek-V2/V3): per layer one array
//    [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] holding each
//    token's [c_kv | k_pe] (ops/mla.h), no V array.
// With routing recording on (EngineConfig::record_routing) a routing cache
// sits beside them: i32 [num_blocks, block_size, n_moe_layers * top_k], the
// experts each cached token was routed to, so swaps, forks and prefix-cache
// hits move it with the K/V it belongs to.
// The K/V arrays and the routing cache live on the device of the model the
// cache serves (KVCache's `device`: Device::CUDA for a model on the GPU); the
// swap area always lives on the host (Device::CPU), which is what swapping
// buys: ops::copy_kv_blocks moves blocks between the two.
// Sleep frees everything; wake re-allocates the device arrays.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kestrel::rollout {

struct KVGeometry {
  int64_t n_layers = 0, num_blocks = 0, block_size = 0;
  int64_t n_kv_heads = 0, head_dim = 0;  // GQA: kv heads on this tp rank; 0 for a latent cache
  DType dtype = DType::F32;
  int64_t latent_dim = 0;                // MLA: kv_lora_rank + qk_rope_head_dim; 0 for GQA
  int64_t routing_width = 0;             // i32 values per token slot (n_moe_layers * top_k); 0 = no routing cache

  bool latent() const { return latent_dim > 0; }
  // Cached values of one token in one layer: 2 * n_kv_heads * head_dim (K and V), or latent_dim.
  int64_t values_per_token_layer() const { return latent() ? latent_dim : 2 * n_kv_heads * head_dim; }
  // K/V bytes of one token over all layers (the routing cache not included).
  int64_t kv_bytes_per_token() const { return n_layers * values_per_token_layer() * int64_t(dtype_size(dtype)); }
  // One block over all layers, its routing rows included: what the engine sizes the cache by.
  int64_t bytes_per_block() const {
    return block_size * (kv_bytes_per_token() + routing_width * int64_t(sizeof(int32_t)));
  }
};

class KVCache {
 public:
  // device: where the K/V arrays and routing cache go (the model's, CausalLM::device()).
  explicit KVCache(const KVGeometry& g, Device device = Device::CPU);
  const KVGeometry& geometry() const { return g_; }
  Device device() const { return device_; }

  bool allocated() const { return !k_.empty(); }
  void allocate();
  void release();   // device arrays and swap area

  // GQA caches. A latent cache has no K/V arrays (KS_CHECK).
  Tensor& k(int64_t layer);
  Tensor& v(int64_t layer);
  // A latent cache's array of `layer` [num_blocks, block_size, latent_dim].
  Tensor& latent(int64_t layer);
  bool has_routing() const { return g_.routing_width > 0; }
  // The routing cache as rows by slot: i32 [num_blocks * block_size, routing_width]
  // (slot = block * block_size + offset, as slot_mapping).
  Tensor routing_rows();

  // Host swap area of `capacity_blocks` blocks (allocated on first use).
  void set_swap_capacity(int64_t capacity_blocks) { swap_capacity_ = capacity_blocks; }
  int64_t swap_capacity() const { return swap_capacity_; }
  int64_t swap_free() const;
  // Reserves n host blocks (nullopt-like empty result when fewer are free).
  std::vector<int32_t> swap_reserve(int64_t n);
  void swap_release(const std::vector<int32_t>& ids);
  // Batched copies, one call per array and direction: (device block, host block).
  void swap_out(const std::vector<std::pair<int32_t, int32_t>>& dev_to_host);
  void swap_in(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev);
  // Device block copies (a forked sample's copy of the partial last block).
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_to_dst);

 private:
  void ensure_swap_area();
  // Every array of a block in the same order on device and host: K (or the
  // latent) and V of each layer, then the routing cache.
  std::vector<Tensor*> device_arrays();
  std::vector<Tensor*> host_arrays();

  KVGeometry g_;
  Device device_;
  // Per layer, device: K and V (GQA), or the latent array in k_ and v_ empty (MLA).
  std::vector<Tensor> k_, v_;
  Tensor routing_;                       // i32 [num_blocks, block_size, routing_width], device
  std::vector<Tensor> swap_k_, swap_v_;  // per layer, host [capacity, <block shape>]
  Tensor swap_routing_;                  // host [capacity, block_size, routing_width]
  int64_t swap_capacity_ = 0;
  std::vector<int32_t> swap_free_list_;
};

}  // namespace kestrel::rollout
