// Shared by the NCCL transport's tests (tests/nccl): the process's device
// (local rank % devices, as trainer.device=cuda picks it) and the world as a
// group that moves device buffers.
#pragma once
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "comm/device_group.h"
#include "comm/nodes.h"
#include "comm/world.h"

namespace kestrel::testing {

// Initialises the CUDA backend on this rank's device; false (on every rank
// alike, when no rank has one) where none can be used.
inline bool device_ready() {
  static const bool ok = [] {
    if (!cuda::available()) return false;
    cuda::init(comm::local_rank(*comm::World::current()) % cuda::device_count());
    return true;
  }();
  return ok;
}

// The world group, NCCL-backed for device buffers (made once; its communicator at its first device call).
inline comm::ProcessGroup& device_world() {
  static const std::shared_ptr<comm::ProcessGroup> g = comm::device_group(comm::World::current()->group());
  return *g;
}

}  // namespace kestrel::testing
