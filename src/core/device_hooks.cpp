#include "core/device_hooks.h"

#include <array>

#include "core/status.h"

namespace kestrel {

namespace {
std::array<DeviceMemoryHooks, 2>& table() {
  static std::array<DeviceMemoryHooks, 2> t{};  // indexed by Device
  return t;
}
}  // namespace

void register_device_memory_hooks(Device dev, const DeviceMemoryHooks& hooks) {
  KS_CHECK(dev != Device::CPU, "register_device_memory_hooks: host memory needs no hooks");
  table()[size_t(dev)] = hooks;
}

const DeviceMemoryHooks& device_memory_hooks(Device dev, const char* what) {
  const DeviceMemoryHooks& h = table()[size_t(dev)];
  if (!h.fill || !h.copy)
    KS_FAIL("not supported yet: ", dev == Device::CUDA ? "CUDA" : device_name(dev), " kernel for ", what);
  return h;
}

}  // namespace kestrel
