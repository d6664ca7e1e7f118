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

}  // namespace kestrel
