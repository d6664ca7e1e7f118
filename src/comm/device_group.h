// Process groups for a run whose tensors live on a GPU: device buffers move
// over NCCL, host buffers (metrics, scalars, counts) over the host transport
// (MPI) they wrap, through one ProcessGroup, so the parallel code above calls
// the same interface on the CPU and on the device. No CUDA or NCCL header
// here: every layer may include it; the implementation is src/comm/nccl.
#pragma once
#include <memory>

#include "comm/process_group.h"

namespace kestrel::comm {

// True when this build can move device buffers between processes (the CUDA
// backend, or its emulator with the fake NCCL of tests/cuda_emu).
bool built_with_nccl();

// A group with `host`'s ranks and name that sends every call whose buffers
// are device memory through NCCL (one communicator per group, created at the
// group's first device call: collective over `host`, whose rank 0 makes the
// NCCL unique id and broadcasts it over `host`) and every other call through
// `host`. A size-1 `host` (or nullptr) is returned as it is: a single process
// never loads NCCL. Fails naming the build when built_with_nccl() is false.
// The CUDA backend must be initialised (cuda::init) before the first device call.
std::shared_ptr<ProcessGroup> device_group(std::shared_ptr<ProcessGroup> host);

}  // namespace kestrel::comm
