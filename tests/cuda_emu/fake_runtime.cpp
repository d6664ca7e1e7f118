// Emulated replacement for src/backend/cuda/runtime.cpp: Device::CUDA is emulated device
// memory (emu::dev_alloc: one arena closed to host code outside kernel launches, copies and
// GEMMs; poisoned with 0xFF on every allocation, guard bytes after each block).
// Tensor's fill/copy hooks and float_kind are the real ones (memory_hooks.cpp).
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "core/device_hooks.h"

namespace kestrel::cuda {
namespace {

struct State {
  std::once_flag once;
  int ordinal = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  CachingDeviceAllocator* allocator = nullptr;
};
State& state() {
  static State s;
  return s;
}

void* raw_alloc(size_t bytes) { return emu::dev_alloc(bytes); }
void raw_free(void* p) { emu::dev_free(p); }
// "Pinned" host memory: ordinary host memory here (the emulator's copies are synchronous).
void* raw_host_alloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void raw_host_free(void* p) { std::free(p); }

// Not caching: every allocation is fresh poisoned memory, so stale data never hides a missing write.
// Live bytes are accounted by category as the caching allocator does, so memory tests run here too.
class EmuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override {
    void* p = emu::dev_alloc(bytes ? bytes : 1);
    account(cat, int64_t(bytes));
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    if (!p) return;
    account(cat, -int64_t(bytes));
    emu::dev_free(p);
  }
  Device device() const override { return Device::CUDA; }
};

// The transfer queue (core/device_hooks.h). The emulated compute stream runs
// each kernel when it is launched, so the copy stream's freedom is what a test
// can vary, between two extremes (KESTREL_EMU_TRANSFERS, read at each copy):
//  - "lazy" (the default): a copy runs only when compute_after or wait needs
//    it, as late as a GPU could run it, so a kernel that reads an upload it
//    did not wait for, or a host that reads a download it did not wait for,
//    sees stale (poisoned) memory;
//  - "eager": a copy runs when it is queued, as early as a GPU could, so a
//    copy queued before the kernels it should follow (a download before the
//    kernel that writes its source, an upload before the kernel that last
//    reads its destination) moves the wrong bytes.
// A swapped optimizer step that is bit-identical under both is ordered right.
class EmuTransferQueue final : public TransferQueue {
 public:
  void compute_after(int64_t ticket) override { run_to(ticket); }
  void wait(int64_t ticket) override { run_to(ticket); }

 protected:
  int64_t enqueue(Tensor& dst, const Tensor& src) override {
    const char* policy = std::getenv("KESTREL_EMU_TRANSFERS");
    const std::string p = policy ? policy : "lazy";
    KS_CHECK(p == "lazy" || p == "eager", "emu: KESTREL_EMU_TRANSFERS=", p, " (lazy or eager)");
    pending_.push_back(Copy{++last_, dst, src});
    if (p == "eager") run_to(last_);
    return last_;
  }

 private:
  struct Copy {
    int64_t ticket;
    Tensor dst, src;
  };
  void run_to(int64_t ticket) {
    while (!pending_.empty() && pending_.front().ticket <= ticket) {
      Copy& c = pending_.front();
      const cudaMemcpyKind kind = c.dst.device() == Device::CPU ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
      KS_CUDA_CHECK(cudaMemcpyAsync(c.dst.raw(), c.src.raw(), c.dst.nbytes(), kind, state().stream));
      pending_.pop_front();
    }
  }
  std::deque<Copy> pending_;
  int64_t last_ = 0;
};

}  // namespace

bool available() { return true; }
std::string describe() { return "emulated CUDA device (host fibers)"; }

void init(int ordinal) {
  State& s = state();
  std::call_once(s.once, [&] {
    KS_CHECK(ordinal == 0, "emu: one device");
    s.cublas = reinterpret_cast<cublasHandle_t>(&s);
    // A stream of its own (a non-null handle): the legacy stream cannot be captured.
    static int stream_storage = 0;
    s.stream = reinterpret_cast<cudaStream_t>(&stream_storage);
    s.ordinal = ordinal;
    s.allocator = new CachingDeviceAllocator(Device::CUDA, RawDeviceMemory{raw_alloc, raw_free});
    register_device_allocator(Device::CUDA, new EmuAllocator);
    register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{fill_hook, copy_hook});
    register_pinned_host_allocator(
        new CachingDeviceAllocator(Device::CPU, RawDeviceMemory{raw_host_alloc, raw_host_free}));
    register_transfer_queue(Device::CUDA, new EmuTransferQueue);
  });
  KS_CHECK(s.ordinal == ordinal, "cuda::init(", ordinal, "): this process already uses device ", s.ordinal);
}

void synchronize() {}

CachingDeviceAllocator& allocator() {
  KS_CHECK(state().allocator, "cuda::allocator(): call cuda::init() first");
  return *state().allocator;
}

// 2 GiB unless KESTREL_DEVICE_MEMORY (bytes) says otherwise: the emulated device's memory is this
// machine's, and every allocation is poisoned, so a KV cache sized as on an H200 would not fit.
int64_t total_memory() {
  KS_CHECK(state().ordinal >= 0, "cuda::total_memory(): call cuda::init() first");
  const char* env = std::getenv("KESTREL_DEVICE_MEMORY");
  return env && *env ? std::stoll(env) : int64_t(2) << 30;
}

// The arena's live allocations are the device memory.
bool is_device_pointer(const void* p) { return p && emu::is_device(p); }
int device_count() { return 1; }

// The emulated stream is synchronous: whatever was queued before a mark has finished.
StreamMark::StreamMark() {}
StreamMark::~StreamMark() {}
bool StreamMark::done() const { return true; }

cudaStream_t stream() {
  KS_CHECK(state().ordinal >= 0, "the CUDA backend is not initialised (cuda::init())");
  return state().stream;
}
cublasHandle_t cublas() {
  KS_CHECK(state().ordinal >= 0, "the CUDA backend is not initialised (cuda::init())");
  return state().cublas;
}

// As runtime.cpp's: the launch reports the thread's last error (emu_api.cpp keeps it as CUDA does).
void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) KS_FAIL("CUDA kernel launch in ", what, ": ", cudaGetErrorString(e));
}

}  // namespace kestrel::cuda
