// Device selection, the stream, the cuBLAS handle and the caching allocator for
// Device::CUDA; registers Tensor's memory hooks (memory_hooks.cpp) and the
// transfer queue (a second stream for host<->device copies).
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "core/device_hooks.h"

namespace kestrel::cuda {
namespace {

struct State {
  std::once_flag once;
  int ordinal = -1;
  cudaStream_t stream = nullptr;
  cudaStream_t transfer_stream = nullptr;  // the transfer queue's copies (core/device_hooks.h)
  cublasHandle_t cublas = nullptr;
  CachingDeviceAllocator* allocator = nullptr;
};
State& state() {
  static State s;
  return s;
}

// Before memory goes back to the driver, neither stream may still use it.
void sync_streams() {
  cudaStreamSynchronize(state().stream);
  if (state().transfer_stream) cudaStreamSynchronize(state().transfer_stream);
}

// The transfer queue on its own stream. A copy waits for an event recorded on
// the compute stream when it is queued (the caching allocator reuses blocks in
// compute-stream order, so a block handed out after a free may still be in
// use by queued kernels: the copy must not start before them); compute_after
// makes the compute stream wait for a copy's event. Events are pooled.
class CudaTransferQueue final : public TransferQueue {
 public:
  void compute_after(int64_t ticket) override {
    reap();
    for (const Copy& c : pending_)
      if (c.ticket == ticket) KS_CUDA_CHECK(cudaStreamWaitEvent(state().stream, c.done, 0));
    // An earlier ticket's copy finished before a later one's (one stream), so
    // waiting for the ticket covers them; a ticket no longer pending has finished.
  }
  void wait(int64_t ticket) override {
    while (!pending_.empty() && pending_.front().ticket <= ticket) {
      KS_CUDA_CHECK(cudaEventSynchronize(pending_.front().done));
      release(pending_.front().done);
      pending_.pop_front();
    }
  }

 protected:
  int64_t enqueue(Tensor& dst, const Tensor& src) override {
    reap();
    cudaEvent_t after = event();
    KS_CUDA_CHECK(cudaEventRecord(after, state().stream));
    KS_CUDA_CHECK(cudaStreamWaitEvent(state().transfer_stream, after, 0));
    release(after);  // the wait holds what it needs
    KS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, state().transfer_stream));
    Copy c{++last_, event(), dst, src};
    KS_CUDA_CHECK(cudaEventRecord(c.done, state().transfer_stream));
    pending_.push_back(std::move(c));
    return last_;
  }

 private:
  struct Copy {
    int64_t ticket;
    cudaEvent_t done;
    Tensor dst, src;  // kept alive until the copy has finished
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    KS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void release(cudaEvent_t e) { free_.push_back(e); }
  // Drops finished copies from the front (never blocks).
  void reap() {
    while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
      release(pending_.front().done);
      pending_.pop_front();
    }
  }

  std::deque<Copy> pending_;
  std::vector<cudaEvent_t> free_;
  int64_t last_ = 0;
};

void* raw_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so the retry can succeed
    return nullptr;
  }
  return p;
}
void raw_free(void* p) {
  // Blocks are reused in stream order; before one goes back to the driver the
  // streams must be done with it.
  sync_streams();
  cudaFree(p);
}

// Page-locked host memory: what is offloaded between phases streams to and
// from it at the link's full speed (pageable memory is staged by the driver).
void* raw_host_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
void raw_host_free(void* p) {
  sync_streams();  // no copy in flight reads or writes it
  cudaFreeHost(p);
}

}  // namespace

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::string describe() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device: the runtime sees none";
  const int ord = state().ordinal >= 0 ? state().ordinal : 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, ord) != cudaSuccess) return "no CUDA device: cannot read its properties";
  int driver = 0;
  cudaDriverGetVersion(&driver);
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", double(p.totalGlobalMem) / double(1ull << 30));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + gib +
         " GiB, driver " + std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10) + ")";
}

void init(int ordinal) {
  State& s = state();
  std::call_once(s.once, [&] {
    int n = 0;
    KS_CUDA_CHECK(cudaGetDeviceCount(&n));
    KS_CHECK(ordinal >= 0 && ordinal < n, "CUDA device ", ordinal, " asked; this process sees ", n,
             " (check CUDA_VISIBLE_DEVICES)");
    KS_CUDA_CHECK(cudaSetDevice(ordinal));
    KS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    KS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.transfer_stream, cudaStreamNonBlocking));
    KS_CUBLAS_CHECK(cublasCreate(&s.cublas));
    KS_CUBLAS_CHECK(cublasSetStream(s.cublas, s.stream));
    // f32 GEMMs stay IEEE f32 (no TF32), so f32 results are comparable to the CPU's.
    KS_CUBLAS_CHECK(cublasSetMathMode(s.cublas, CUBLAS_DEFAULT_MATH));
    s.ordinal = ordinal;
    // Never destroyed: tensors of static lifetime may outlive any owner.
    s.allocator = new CachingDeviceAllocator(Device::CUDA, RawDeviceMemory{raw_alloc, raw_free});
    register_device_allocator(Device::CUDA, s.allocator);
    register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{fill_hook, copy_hook});
    register_pinned_host_allocator(
        new CachingDeviceAllocator(Device::CPU, RawDeviceMemory{raw_host_alloc, raw_host_free}));
    register_transfer_queue(Device::CUDA, new CudaTransferQueue);
  });
  KS_CHECK(s.ordinal == ordinal, "cuda::init(", ordinal, "): this process already uses device ", s.ordinal);
}

void synchronize() {
  KS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  KS_CUDA_CHECK(cudaStreamSynchronize(state().transfer_stream));
}

CachingDeviceAllocator& allocator() {
  KS_CHECK(state().allocator, "cuda::allocator(): call cuda::init() first");
  return *state().allocator;
}

int64_t total_memory() {
  KS_CHECK(state().ordinal >= 0, "cuda::total_memory(): call cuda::init() first");
  size_t free_bytes = 0, total_bytes = 0;
  KS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return int64_t(total_bytes);
}

bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unregistered host pointer is not an error to keep
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

StreamMark::StreamMark() {
  cudaEvent_t e = nullptr;
  KS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t r = cudaEventRecord(e, stream());
  if (r != cudaSuccess) {
    cudaEventDestroy(e);
    KS_FAIL("CUDA error in cudaEventRecord: ", cudaGetErrorString(r));
  }
  event_ = e;
}

StreamMark::~StreamMark() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

bool StreamMark::done() const { return cudaEventQuery(static_cast<cudaEvent_t>(event_)) != cudaErrorNotReady; }

cudaStream_t stream() {
  KS_CHECK(state().ordinal >= 0, "the CUDA backend is not initialised (cuda::init())");
  return state().stream;
}
cublasHandle_t cublas() {
  KS_CHECK(state().ordinal >= 0, "the CUDA backend is not initialised (cuda::init())");
  return state().cublas;
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) KS_FAIL("CUDA kernel launch in ", what, ": ", cudaGetErrorString(e));
}


}  // namespace kestrel::cuda
