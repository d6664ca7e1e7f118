#include "core/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>
#include <new>
#include <sstream>

#include "core/status.h"

namespace kestrel {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Params: return "params";
    case MemCategory::Grads: return "grads";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::Activations: return "activations";
    case MemCategory::KVCache: return "kv_cache";
    case MemCategory::Other: return "other";
  }
  return "?";
}

std::string MemStats::to_string() const {
  std::ostringstream os;
  char buf[128];
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    std::snprintf(buf, sizeof buf, "%-16s live %10.3f MiB  peak %10.3f MiB\n",
                  mem_category_name(MemCategory(i)), live[i] / 1048576.0, peak[i] / 1048576.0);
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "%-16s live %10.3f MiB  peak %10.3f MiB\n", "total",
                total_live / 1048576.0, total_peak / 1048576.0);
  os << buf;
  return os.str();
}

static void atomic_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void Allocator::account(MemCategory cat, int64_t delta) {
  auto i = size_t(cat);
  int64_t now = live_[i].fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t tot = total_live_.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta > 0) {
    atomic_max(peak_[i], now);
    atomic_max(total_peak_, tot);
  }
}

MemStats Allocator::stats() const {
  MemStats s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    s.live[i] = live_[i].load();
    s.peak[i] = peak_[i].load();
  }
  s.total_live = total_live_.load();
  s.total_peak = total_peak_.load();
  return s;
}

void Allocator::reset_peak() {
  for (size_t i = 0; i < kNumMemCategories; ++i) peak_[i].store(live_[i].load());
  total_peak_.store(total_live_.load());
}

struct CpuAllocator::Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // size class -> blocks of exactly that many bytes
  size_t bytes = 0;
};

namespace {

// Rounded-up size of a cached block: 2^k, 1.25, 1.5 or 1.75 x 2^k bytes.
size_t size_class(size_t bytes) {
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  if (p == bytes) return p;
  const size_t q = p / 4;
  return (bytes + q - 1) / q * q;
}

bool cacheable(size_t bytes, MemCategory cat) {
  return cat == MemCategory::Activations && bytes >= CpuAllocator::kCacheMinBytes;
}

size_t cache_limit_from_env() {
  if (const char* e = std::getenv("KESTREL_CPU_CACHE_MB"); e && *e) {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(e, &end, 10);
    if (end && *end == 0) return size_t(mb) << 20;
  }
  return size_t(2048) << 20;
}

}  // namespace

CpuAllocator::CpuAllocator() : cache_(new Cache), cache_limit_(cache_limit_from_env()) {}

CpuAllocator::~CpuAllocator() {
  release_cache();
  delete cache_;
}

void* CpuAllocator::allocate(size_t bytes, MemCategory cat) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = nullptr;
  if (cacheable(rounded, cat)) {
    rounded = size_class(rounded);
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->free.find(rounded);
    if (it != cache_->free.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cache_->bytes -= rounded;
    }
  }
  if (!p) p = std::aligned_alloc(kAlignment, rounded);
  if (!p) KS_FAIL("out of host memory allocating ", bytes, " bytes for ", mem_category_name(cat));
  account(cat, int64_t(bytes));
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  account(cat, -int64_t(bytes));
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  if (cacheable(rounded, cat)) {
    rounded = size_class(rounded);
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->bytes + rounded <= cache_limit_) {
      cache_->free[rounded].push_back(p);
      cache_->bytes += rounded;
      return;
    }
  }
  std::free(p);
}

void CpuAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(cache_->mu);
  for (auto& [size, blocks] : cache_->free)
    for (void* p : blocks) std::free(p);
  cache_->free.clear();
  cache_->bytes = 0;
}

size_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  return cache_->bytes;
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace kestrel
