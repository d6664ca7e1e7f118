// The memory kernels Tensor's own methods need on a device other than the
// host (zero_, fill_, copy_from, reading values back), registered by that
// device's backend at start-up. Core cannot include the ops or backend
// layers, so Tensor calls through this table; host tensors never use it
// (core/tensor.cpp handles host memory itself). A device without registered
// hooks fails with "not supported yet: CUDA kernel for Tensor::zero_".
#pragma once
#include "core/allocator.h"

namespace kestrel {

class Tensor;

struct DeviceMemoryHooks {
  // Every element of t = v, converted to t's dtype as Tensor::set does.
  void (*fill)(Tensor& t, float v) = nullptr;
  // dst = src element by element, converting dtype; equal numel; either side
  // may be a host tensor (the transfers between host and device).
  void (*copy)(Tensor& dst, const Tensor& src) = nullptr;
};

// Installs the hooks of dev (a backend calls it once, before any tensor of dev is used).
void register_device_memory_hooks(Device dev, const DeviceMemoryHooks& hooks);
// The hooks of dev for `what` ("Tensor::zero_", ...); fails when dev has none.
const DeviceMemoryHooks& device_memory_hooks(Device dev, const char* what);

// The allocator Tensor::empty uses for dev (the backend registers it with its hooks;
// it must outlive every tensor of dev). nullptr until registered.
void register_device_allocator(Device dev, Allocator* allocator);
Allocator* device_allocator(Device dev);

// Host memory the device copies from and to at full speed (page-locked: CUDA's
// cudaHostAlloc), for what is offloaded to the host between uses (param_offload,
// grad_offload, optimizer_offload). A backend with such memory registers its
// allocator (device() == CPU); until then, and on a CPU-only build, this is the
// plain host allocator.
void register_pinned_host_allocator(Allocator* allocator);
Allocator* pinned_host_allocator();

// Copies between host and device on a queue of their own beside the compute
// queue (CUDA: a second stream, ordered against the first by events), so that
// one piece of offloaded state moves while another is computed on (the swap
// optimizer: piece k + 1 comes in and piece k - 1 goes out while piece k
// steps). Tickets are positions in the queue; copies finish in queue order.
class TransferQueue {
 public:
  virtual ~TransferQueue() = default;
  // Queues dst = src (same dtype and numel; one on the
  // queue's device, the other host memory, pinned for the copy to overlap)
  // behind every compute kernel queued so far, so a download sees the kernels
  // that wrote src and an upload cannot overwrite what they still read. The
  // queue keeps both tensors alive until the copy is waited for; neither may
  // be touched by the host or by compute until then. Returns its ticket.
  int64_t copy(Tensor& dst, const Tensor& src);
  // Compute work queued from now on runs after copy `ticket` and every
  // copy before it (the host does not wait).
  virtual void compute_after(int64_t ticket) = 0;
  // The host waits for copy `ticket` and every copy before it.
  virtual void wait(int64_t ticket) = 0;

 protected:
  virtual int64_t enqueue(Tensor& dst, const Tensor& src) = 0;
};

// The queue of dev, registered by its backend (it must outlive every use).
void register_transfer_queue(Device dev, TransferQueue* queue);
// dev's queue; without one (the CPU, or a backend that registered none) a
// queue whose copies complete at once (Tensor::copy_from), so callers have one path.
TransferQueue& transfer_queue(Device dev);

}  // namespace kestrel
