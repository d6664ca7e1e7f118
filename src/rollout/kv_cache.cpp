#include "rollout/kv_cache.h"

#include <algorithm>

#include "ops/paged_attention.h"

namespace kestrel::rollout {

KVCache::KVCache(const KVGeometry& g) : g_(g) {
  KS_CHECK(g.n_layers > 0 && g.num_blocks >= 2 && g.block_size > 0 && g.n_kv_heads > 0 && g.head_dim > 0,
           "bad KV cache geometry");
}

void KVCache::allocate() {
  if (allocated()) return;
  const Shape s{g_.num_blocks, g_.block_size, g_.n_kv_heads, g_.head_dim};
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    // Not zeroed: attention reads only slots written before it (the causal
    // limit), and untouched pages of a large cache then cost no time.
    k_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache));
    v_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache));
  }
}

void KVCache::release() {
  k_.clear();
  v_.clear();
  swap_k_.clear();
  swap_v_.clear();
  swap_free_list_.clear();
}

void KVCache::ensure_swap_area() {
  if (!swap_k_.empty() || swap_capacity_ <= 0) return;
  // On a GPU this is pinned host memory; on the CPU backend it is plain host
  // memory of the same category, so sleep() accounts it too.
  const Shape s{swap_capacity_, g_.block_size, g_.n_kv_heads, g_.head_dim};
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    swap_k_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, Device::CPU));
    swap_v_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, Device::CPU));
  }
  swap_free_list_.clear();
  for (int32_t i = int32_t(swap_capacity_); i-- > 0;) swap_free_list_.push_back(i);  // pops 0, 1, 2, ...
}

int64_t KVCache::swap_free() const {
  return swap_k_.empty() ? swap_capacity_ : int64_t(swap_free_list_.size());
}

std::vector<int32_t> KVCache::swap_reserve(int64_t n) {
  ensure_swap_area();
  if (n > int64_t(swap_free_list_.size())) return {};
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(swap_free_list_.back());
    swap_free_list_.pop_back();
  }
  return out;
}

void KVCache::swap_release(const std::vector<int32_t>& ids) {
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) swap_free_list_.push_back(*it);
}

void KVCache::swap_out(const std::vector<std::pair<int32_t, int32_t>>& dev_to_host) {
  if (dev_to_host.empty()) return;
  KS_CHECK(allocated() && !swap_k_.empty(), "swap_out without KV arrays");
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    ops::copy_kv_blocks(k_[size_t(l)], swap_k_[size_t(l)], dev_to_host);
    ops::copy_kv_blocks(v_[size_t(l)], swap_v_[size_t(l)], dev_to_host);
  }
}

void KVCache::swap_in(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev) {
  if (host_to_dev.empty()) return;
  KS_CHECK(allocated() && !swap_k_.empty(), "swap_in without KV arrays");
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    ops::copy_kv_blocks(swap_k_[size_t(l)], k_[size_t(l)], host_to_dev);
    ops::copy_kv_blocks(swap_v_[size_t(l)], v_[size_t(l)], host_to_dev);
  }
}

void KVCache::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_to_dst) {
  if (src_to_dst.empty()) return;
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    ops::copy_kv_blocks(k_[size_t(l)], k_[size_t(l)], src_to_dst);
    ops::copy_kv_blocks(v_[size_t(l)], v_[size_t(l)], src_to_dst);
  }
}

}  // namespace kestrel::rollout
