#include "core/caching_allocator.h"

#include <bit>

#include "core/status.h"

namespace kestrel {

size_t CachingDeviceAllocator::size_class(size_t bytes) {
  constexpr size_t kSmall = size_t(1) << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  // Quarter powers of two: 2^k * {1, 1.25, 1.5, 1.75}.
  const int k = int(std::bit_width(bytes)) - 1;  // 2^k <= bytes < 2^(k+1)
  const size_t quarter = size_t(1) << (k - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

CachingDeviceAllocator::~CachingDeviceAllocator() { release_cache(); }

void* CachingDeviceAllocator::allocate(size_t bytes, MemCategory cat) {
  const size_t cls = size_class(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= cls;
    }
  }
  if (!p) {
    p = raw_.alloc(cls);
    if (!p) {
      release_cache();
      p = raw_.alloc(cls);
    }
    if (!p) {
      KS_FAIL("out of ", device_name(dev_), " memory: asked ", bytes, " bytes (", cls, " with its size class); live: ",
              stats().to_string(), "; reserved ", reserved_bytes(),
              " bytes. Lower the batch (ppo_micro_batch_size_per_gpu, max_num_batched_tokens) or "
              "gpu_memory_utilization, or turn on offload/recompute");
    }
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ += cls;
    ++raw_allocs_;
  }
  account(cat, int64_t(bytes));
  return p;
}

void CachingDeviceAllocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  account(cat, -int64_t(bytes));
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_[cls].push_back(p);
  cached_ += cls;
}

void CachingDeviceAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) raw_.free(p);
    reserved_ -= cls * blocks.size();
  }
  free_.clear();
  cached_ = 0;
}

size_t CachingDeviceAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}
size_t CachingDeviceAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}
int64_t CachingDeviceAllocator::raw_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return raw_allocs_;
}

}  // namespace kestrel
