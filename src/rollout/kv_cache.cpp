#include "rollout/kv_cache.h"

#include <algorithm>

#include "ops/paged_attention.h"

namespace kestrel::rollout {

namespace {

// One layer's array of `blocks` blocks: [blocks, block_size, n_kv_heads, head_dim] or [blocks, block_size, latent_dim].
Shape layer_shape(const KVGeometry& g, int64_t blocks) {
  if (g.latent()) return {blocks, g.block_size, g.latent_dim};
  return {blocks, g.block_size, g.n_kv_heads, g.head_dim};
}

}  // namespace

KVCache::KVCache(const KVGeometry& g, Device device) : g_(g), device_(device) {
  const bool gqa = g.n_kv_heads > 0 && g.head_dim > 0 && g.latent_dim == 0;
  const bool mla = g.latent_dim > 0 && g.n_kv_heads == 0 && g.head_dim == 0;
  KS_CHECK(g.n_layers > 0 && g.num_blocks >= 2 && g.block_size > 0 && g.routing_width >= 0 && (gqa || mla),
           "bad KV cache geometry: ", g.n_layers, " layers, ", g.num_blocks, " blocks of ", g.block_size,
           ", kv heads ", g.n_kv_heads, " x ", g.head_dim, ", latent ", g.latent_dim,
           " (give kv heads and head_dim for GQA, or latent_dim alone for MLA)");
}

Tensor& KVCache::k(int64_t layer) {
  KS_CHECK(!g_.latent(), "internal: K of a latent (MLA) KV cache");
  return k_[size_t(layer)];
}

Tensor& KVCache::v(int64_t layer) {
  KS_CHECK(!g_.latent(), "internal: V of a latent (MLA) KV cache");
  return v_[size_t(layer)];
}

Tensor& KVCache::latent(int64_t layer) {
  KS_CHECK(g_.latent(), "internal: the latent array of a GQA KV cache");
  return k_[size_t(layer)];
}

Tensor KVCache::routing_rows() {
  KS_CHECK(has_routing() && routing_.defined(), "internal: no routing cache (record_routing off, or asleep)");
  return routing_.view({g_.num_blocks * g_.block_size, g_.routing_width});
}

void KVCache::allocate() {
  if (allocated()) return;
  const Shape s = layer_shape(g_, g_.num_blocks);
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    // Not zeroed: attention reads only slots written before it (the causal
    // limit), and untouched pages of a large cache then cost no time.
    k_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, device_));
    if (!g_.latent()) v_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, device_));
  }
  // Rows are read only for positions a forward wrote (a finished sequence's computed tokens).
  if (has_routing())
    routing_ = Tensor::empty({g_.num_blocks, g_.block_size, g_.routing_width}, DType::I32, MemCategory::KVCache,
                             device_);
}

void KVCache::release() {
  k_.clear();
  v_.clear();
  routing_ = Tensor();
  swap_k_.clear();
  swap_v_.clear();
  swap_routing_ = Tensor();
  swap_free_list_.clear();
}

std::vector<Tensor*> KVCache::device_arrays() {
  std::vector<Tensor*> out;
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    out.push_back(&k_[size_t(l)]);
    if (!g_.latent()) out.push_back(&v_[size_t(l)]);
  }
  if (has_routing()) out.push_back(&routing_);
  return out;
}

std::vector<Tensor*> KVCache::host_arrays() {
  std::vector<Tensor*> out;
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    out.push_back(&swap_k_[size_t(l)]);
    if (!g_.latent()) out.push_back(&swap_v_[size_t(l)]);
  }
  if (has_routing()) out.push_back(&swap_routing_);
  return out;
}

void KVCache::ensure_swap_area() {
  if (!swap_k_.empty() || swap_capacity_ <= 0) return;
  // Host memory whatever device the cache is on (plain, not yet pinned: the
  // block copies are synchronous), of the same category, so sleep() accounts
  // it too.
  const Shape s = layer_shape(g_, swap_capacity_);
  for (int64_t l = 0; l < g_.n_layers; ++l) {
    swap_k_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, Device::CPU));
    if (!g_.latent()) swap_v_.push_back(Tensor::empty(s, g_.dtype, MemCategory::KVCache, Device::CPU));
  }
  if (has_routing())
    swap_routing_ = Tensor::empty({swap_capacity_, g_.block_size, g_.routing_width}, DType::I32, MemCategory::KVCache,
                                  Device::CPU);
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
  const auto dev = device_arrays(), host = host_arrays();
  for (size_t i = 0; i < dev.size(); ++i) ops::copy_kv_blocks(*dev[i], *host[i], dev_to_host);
}

void KVCache::swap_in(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev) {
  if (host_to_dev.empty()) return;
  KS_CHECK(allocated() && !swap_k_.empty(), "swap_in without KV arrays");
  const auto dev = device_arrays(), host = host_arrays();
  for (size_t i = 0; i < dev.size(); ++i) ops::copy_kv_blocks(*host[i], *dev[i], host_to_dev);
}

void KVCache::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_to_dst) {
  if (src_to_dst.empty()) return;
  for (Tensor* t : device_arrays()) ops::copy_kv_blocks(*t, *t, src_to_dst);
}

}  // namespace kestrel::rollout
