// The CUDA backend's entry points for the layers above (no CUDA header here:
// callers compile with the host compiler and never see cuda_runtime.h).
//
// A process uses one device (the launcher gives each rank its GPU, as
// torchrun/srun do with CUDA_VISIBLE_DEVICES or LOCAL_RANK), one stream on it
// for every kernel and copy, and one cuBLAS handle bound to that stream.
// Device memory comes from a caching allocator (core/caching_allocator.h):
// after the first step no cudaMalloc/cudaFree runs. Kernels are asynchronous;
// Tensor::to_host and copies into host memory synchronise the stream.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/caching_allocator.h"

namespace kestrel::cuda {

// True when this build has the CUDA backend and a device can be used. Never throws.
bool available();
// "NVIDIA H200 (sm_90, 139.8 GiB, driver 13.0)" for the device init() would take,
// or the reason there is none ("no CUDA device: <runtime error>").
std::string describe();
// Selects device `ordinal`, creates the stream and the cuBLAS handle, and
// registers the allocator and Tensor's memory hooks for Device::CUDA.
// Idempotent; fails with the runtime's message when no device can be used.
void init(int ordinal = 0);
// Waits for every kernel and copy queued so far; fails with the first
// asynchronous error a kernel raised.
void synchronize();
// The device allocator (init() first).
CachingDeviceAllocator& allocator();
// The device's memory in bytes (init() first): what gpu_memory_utilization is a fraction of.
int64_t total_memory();
// Whether `p` points into device memory of this process (cudaPointerGetAttributes:
// device or managed memory); host, pinned-host and null pointers are not. Lets
// a transport that takes raw pointers (comm/nccl) route device buffers to NCCL
// and host buffers to MPI. Never throws.
bool is_device_pointer(const void* p);
// The number of devices this process sees (0 without one). Never throws.
int device_count();

// c[16 x 8] = a[16 x 16] b[16 x 8] (row-major, a and b as bf16 bits) computed by
// one warp's tensor-core instruction (mma.sync m16n8k16) with its fragments
// loaded as the PTX ISA lays them out, the layout the tensor-core attention
// kernels build on: a device self-check (tests/cuda). init() first.
std::vector<float> mma_tile_product(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b);

// A point in the stream's queued work (an event recorded on it at
// construction), for watching device work from another thread: the NCCL
// transport's collective timeout (comm/nccl). cuda::init() first.
class StreamMark {
 public:
  StreamMark();
  ~StreamMark();
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;
  // Whether every kernel, copy and collective queued before the mark has
  // finished. Never blocks or throws; a failed query counts as finished (the
  // next synchronisation reports the error).
  bool done() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

}  // namespace kestrel::cuda
