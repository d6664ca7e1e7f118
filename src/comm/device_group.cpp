// device_group() where the build has no NCCL transport (no CUDA backend).
#include "comm/device_group.h"

#include "core/status.h"

#if !KESTREL_HAVE_NCCL
namespace kestrel::comm {

bool built_with_nccl() { return false; }

std::shared_ptr<ProcessGroup> device_group(std::shared_ptr<ProcessGroup> host) {
  if (!host || host->size() == 1) return host;
  KS_FAIL("group '", host->name(), "' of ", host->size(),
          " processes on a device: this Kestrel build has no CUDA backend and so no NCCL transport (build it with "
          "cmake --preset cuda)");
}

}  // namespace kestrel::comm
#endif
