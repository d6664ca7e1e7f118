// The device caching allocator's logic on host memory (the CUDA backend plugs
// in cudaMalloc/cudaFree; tests/backend_cuda runs it on a device).
#include "core/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/status.h"
#include "core/tensor.h"

namespace kestrel {
namespace {

// A raw allocator with a budget, counting calls.
size_t g_budget = 0, g_used = 0;
int g_frees = 0;
std::map<void*, size_t> g_sizes;
void* budget_alloc(size_t n) {
  if (g_used + n > g_budget) return nullptr;
  g_used += n;
  void* p = std::malloc(n);
  g_sizes[p] = n;
  return p;
}
void budget_free(void* p) {
  g_used -= g_sizes.at(p);
  g_sizes.erase(p);
  ++g_frees;
  std::free(p);
}
void reset(size_t budget) { g_budget = budget, g_used = 0, g_frees = 0; }

TEST(CachingAllocator, SizeClassesHaveAtMostAQuarterSlack) {
  EXPECT_EQ(CachingDeviceAllocator::size_class(0), 512u);
  EXPECT_EQ(CachingDeviceAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingDeviceAllocator::size_class(513), 1024u);
  EXPECT_EQ(CachingDeviceAllocator::size_class(size_t(1) << 20), size_t(1) << 20);
  EXPECT_EQ(CachingDeviceAllocator::size_class((size_t(1) << 20) + 1), (size_t(1) << 20) + (size_t(1) << 18));
  for (size_t b : {size_t(3) << 20, size_t(5'000'001), size_t(123'456'789), size_t(1) << 33}) {
    const size_t c = CachingDeviceAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(double(c), 1.25 * double(b)) << b;
    EXPECT_EQ(CachingDeviceAllocator::size_class(c), c) << "a class is its own class";
  }
}

TEST(CachingAllocator, SteadyStateReusesBlocksAndAccountsLiveBytes) {
  reset(size_t(1) << 30);
  {
    CachingDeviceAllocator a(Device::CUDA, {budget_alloc, budget_free});
    for (int step = 0; step < 5; ++step) {
      void* x = a.allocate(3'000'000, MemCategory::Activations);
      void* y = a.allocate(1000, MemCategory::Grads);
      EXPECT_EQ(a.stats().live_of(MemCategory::Activations), 3'000'000);
      EXPECT_EQ(a.stats().live_of(MemCategory::Grads), 1000);
      a.deallocate(y, 1000, MemCategory::Grads);
      a.deallocate(x, 3'000'000, MemCategory::Activations);
    }
    EXPECT_EQ(a.raw_allocations(), 2) << "steps after the first take cached blocks";
    EXPECT_EQ(a.stats().total_live, 0);
    EXPECT_EQ(a.stats().peak_of(MemCategory::Activations), 3'000'000);
    EXPECT_EQ(a.cached_bytes(), CachingDeviceAllocator::size_class(3'000'000) + 1024);
    EXPECT_EQ(a.reserved_bytes(), a.cached_bytes());
    a.release_cache();
    EXPECT_EQ(a.cached_bytes(), 0u);
    EXPECT_EQ(a.reserved_bytes(), 0u);
    EXPECT_EQ(g_used, 0u);
  }
  EXPECT_EQ(g_frees, 2);
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheOnceThenNamesTheRequest) {
  reset(size_t(4) << 20);
  CachingDeviceAllocator a(Device::CUDA, {budget_alloc, budget_free});
  void* x = a.allocate(size_t(3) << 20, MemCategory::Params);
  a.deallocate(x, size_t(3) << 20, MemCategory::Params);  // cached: 3 MiB held
  // 2 MiB does not fit next to the cached 3 MiB; the cache is released and the retry fits.
  void* y = a.allocate(size_t(2) << 20, MemCategory::KVCache);
  EXPECT_NE(y, nullptr);
  EXPECT_EQ(a.cached_bytes(), 0u);
  try {
    a.allocate(size_t(3) << 20, MemCategory::Activations);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of cuda memory: asked 3145728 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("gpu_memory_utilization"), std::string::npos) << m;
  }
  a.deallocate(y, size_t(2) << 20, MemCategory::KVCache);
}

}  // namespace
}  // namespace kestrel
