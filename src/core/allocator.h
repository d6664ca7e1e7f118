// Memory accounting by category. Every tensor allocation names what it is for,
// so memory features (offload, recompute, distributed optimizer, KV sleep) can be
// judged by live and peak bytes per category.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <string>

namespace kestrel {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

enum class MemCategory : uint8_t { Params, Grads, OptimizerState, Activations, KVCache, Other };
constexpr size_t kNumMemCategories = 6;
const char* mem_category_name(MemCategory c);

struct MemStats {
  std::array<int64_t, kNumMemCategories> live{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_live = 0;
  int64_t total_peak = 0;
  int64_t live_of(MemCategory c) const { return live[size_t(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[size_t(c)]; }
  std::string to_string() const;  // one line per category, MiB
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, MemCategory cat) = 0;
  virtual void deallocate(void* p, size_t bytes, MemCategory cat) = 0;
  virtual Device device() const = 0;
  MemStats stats() const;
  void reset_peak();  // peaks restart from the current live values

 protected:
  void account(MemCategory cat, int64_t delta);

 private:
  std::array<std::atomic<int64_t>, kNumMemCategories> live_{};
  std::array<std::atomic<int64_t>, kNumMemCategories> peak_{};
  std::atomic<int64_t> total_live_{0};
  std::atomic<int64_t> total_peak_{0};
};

// Host memory, 64-byte aligned (one cache line, one AVX-512 vector).
//
// Activation buffers of at least kCacheMinBytes are kept on free for reuse,
// in size classes of a quarter power of two (at most 25% slack): a training
// step allocates and frees the same large buffers every micro-batch, and
// glibc returns such blocks to the OS (they are mmap'ed), so each reuse would
// page-fault and zero them again (~15% of an RL step on the tiny model). At
// most cache_limit() bytes are held (KESTREL_CPU_CACHE_MB, default 2048);
// release_cache() frees them. Only live bytes count in stats().
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMinBytes = size_t(256) << 10;
  CpuAllocator();
  ~CpuAllocator() override;
  void* allocate(size_t bytes, MemCategory cat) override;
  void deallocate(void* p, size_t bytes, MemCategory cat) override;
  Device device() const override { return Device::CPU; }
  void release_cache();
  size_t cached_bytes() const;
  size_t cache_limit() const { return cache_limit_; }

 private:
  struct Cache;
  Cache* cache_;
  size_t cache_limit_;
};

CpuAllocator& cpu_allocator();

}  // namespace kestrel
