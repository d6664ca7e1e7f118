// CUDA graphs (cuda_graph.h): stream capture into a graph-private memory pool,
// instantiation and replay. Shared by the CUDA build and the emulator (whose
// runtime records and replays the captured work and enforces the capture rules).
#include <atomic>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_util.h"
#include "core/device_hooks.h"

namespace kestrel::cuda {
namespace {

std::atomic<int64_t> replay_count{0};

// The pool grows during captures: cudaMalloc is refused in a capture's global
// mode (it may synchronise), so this thread switches to relaxed mode for the
// call, as PyTorch's allocator does for its graph pools. The new memory is
// only used by the work being captured, in stream order.
void* pool_alloc(size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
// Only when the pool is destroyed (never during a capture): the graphs are gone by then.
void pool_free(void* p) {
  cudaStreamSynchronize(stream());
  cudaFree(p);
}

// cuBLAS allocates a workspace on first use of a GEMM kind unless it is given
// one; inside a capture that allocation would be refused. One buffer, set
// before the first capture and kept for the process (cuBLAS's recommended
// size on Hopper).
void set_cublas_workspace() {
  static bool done = false;
  if (done) return;
  constexpr size_t kBytes = size_t(32) << 20;
  static Tensor ws = Tensor::empty({int64_t(kBytes)}, DType::U8, MemCategory::Other, Device::CUDA);
  KS_CUBLAS_CHECK(cublasSetWorkspace(cublas(), ws.raw(), kBytes));
  done = true;
}

}  // namespace

bool capturing() {
  cudaStream_t s;
  try {
    s = stream();
  } catch (const std::exception&) {
    return false;  // not initialised: nothing can capture
  }
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  KS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

GraphPool::GraphPool()
    : alloc_(std::make_unique<CachingDeviceAllocator>(Device::CUDA, RawDeviceMemory{pool_alloc, pool_free})) {}
GraphPool::~GraphPool() = default;
Allocator& GraphPool::allocator() { return *alloc_; }
size_t GraphPool::reserved_bytes() const { return alloc_->reserved_bytes(); }

Graph::~Graph() { reset(); }
Graph::Graph(Graph&& o) noexcept : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

void Graph::capture(GraphPool& pool, const std::function<void()>& work) {
  KS_CHECK(!capturing(), "cuda::Graph::capture: the stream is already capturing (captures do not nest)");
  reset();
  set_cublas_workspace();
  Allocator* eager = device_allocator(Device::CUDA);
  // Every device tensor allocated meanwhile comes from the pool (and goes back
  // to it when freed: a Storage frees through the allocator that made it).
  register_device_allocator(Device::CUDA, &pool.allocator());
  cudaGraph_t g = nullptr;
  try {
    KS_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
    try {
      work();
    } catch (...) {
      cudaStreamEndCapture(stream(), &g);  // ends the (invalidated) capture; nothing to keep
      if (g) cudaGraphDestroy(g);
      // The refused call and the invalidated capture leave their errors as the
      // runtime's last error; the next kernel launch's check would report them
      // as its own (seen on an H200: "operation failed due to a previous error
      // during capture" from the first copy after a refused capture).
      (void)cudaGetLastError();
      throw;
    }
    const cudaError_t e = cudaStreamEndCapture(stream(), &g);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // as above: the failure is reported here, not by the next launch
      KS_FAIL("CUDA graph capture failed: ", cudaGetErrorString(e),
              ". The captured work must stay on the device: no synchronisation, no copy to or from host memory, "
              "no allocation outside the graph's pool");
    }
  } catch (...) {
    register_device_allocator(Device::CUDA, eager);
    throw;
  }
  register_device_allocator(Device::CUDA, eager);
  graph_ = g;
  cudaGraphExec_t exec = nullptr;
  KS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  exec_ = exec;
}

void Graph::replay() {
  KS_CHECK(exec_, "cuda::Graph::replay: nothing captured");
  KS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()));
  ++replay_count;
}

int64_t Graph::replays() { return replay_count; }

}  // namespace kestrel::cuda
