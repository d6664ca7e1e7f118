// A caching allocator for device memory (the CUDA backend's; PyTorch's
// CUDACachingAllocator in function, without block splitting): a freed block
// goes to a free list of its size class and the next request of that class
// takes it, so a training step or a decode step never calls the device's
// malloc/free once the first step has run. Requests are rounded up to 512 B
// below 1 MiB and to a quarter power of two above (at most 25% slack), the
// CPU allocator's classes. When the raw allocator fails, the cache is freed
// and the request tried once more; then it fails naming the request, the live
// bytes per category and the cached bytes.
//
// One stream per device: a block freed on the stream may be reused by the next
// kernel on the same stream without a synchronisation (stream order).
// The raw functions are injected, so the caching and accounting logic is
// tested on the host (tests/core/caching_allocator_test.cpp).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"

namespace kestrel {

struct RawDeviceMemory {
  void* (*alloc)(size_t bytes) = nullptr;  // nullptr when out of memory
  void (*free)(void* p) = nullptr;
};

class CachingDeviceAllocator final : public Allocator {
 public:
  CachingDeviceAllocator(Device dev, RawDeviceMemory raw) : dev_(dev), raw_(raw) {}
  ~CachingDeviceAllocator() override;
  void* allocate(size_t bytes, MemCategory cat) override;
  void deallocate(void* p, size_t bytes, MemCategory cat) override;
  Device device() const override { return dev_; }

  // Frees every cached block (sleep level 1, or before another user of the device).
  void release_cache();
  size_t cached_bytes() const;
  // Bytes held from the device: live blocks at their class size plus the cache.
  size_t reserved_bytes() const;
  // How many times the raw allocator was called (a steady state adds none).
  int64_t raw_allocations() const;

  // The size a request is served with.
  static size_t size_class(size_t bytes);

 private:
  Device dev_;
  RawDeviceMemory raw_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  size_t cached_ = 0;
  size_t reserved_ = 0;
  int64_t raw_allocs_ = 0;
};

}  // namespace kestrel
