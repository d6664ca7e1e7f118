#include "core/device_hooks.h"

#include <array>

#include "core/status.h"
#include "core/tensor.h"

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

namespace {
std::array<Allocator*, 2>& allocators() {
  static std::array<Allocator*, 2> a{};
  return a;
}
}  // namespace

void register_device_allocator(Device dev, Allocator* allocator) {
  KS_CHECK(dev != Device::CPU, "register_device_allocator: the host allocator is built in");
  KS_CHECK(allocator && allocator->device() == dev, "register_device_allocator: an allocator of another device");
  allocators()[size_t(dev)] = allocator;
}

Allocator* device_allocator(Device dev) {
  return dev == Device::CPU ? &cpu_allocator() : allocators()[size_t(dev)];
}

namespace {
Allocator*& pinned() {
  static Allocator* a = nullptr;
  return a;
}
}  // namespace

void register_pinned_host_allocator(Allocator* allocator) {
  KS_CHECK(!allocator || allocator->device() == Device::CPU,
           "register_pinned_host_allocator: pinned memory is host memory (device() must be CPU)");
  pinned() = allocator;
}

Allocator* pinned_host_allocator() { return pinned() ? pinned() : &cpu_allocator(); }

int64_t TransferQueue::copy(Tensor& dst, const Tensor& src) {
  KS_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "TransferQueue::copy: ", src.describe(),
           " into ", dst.describe(), " (same dtype and size)");
  KS_CHECK((dst.device() == Device::CPU) != (src.device() == Device::CPU), "TransferQueue::copy: ", src.describe(),
           " into ", dst.describe(), ": one side on the host, the other on the device");
  return enqueue(dst, src);
}

namespace {

// No second queue: each copy is done when copy() returns.
class ImmediateTransfers final : public TransferQueue {
 public:
  void compute_after(int64_t) override {}
  void wait(int64_t) override {}

 protected:
  int64_t enqueue(Tensor& dst, const Tensor& src) override {
    dst.copy_from(src);
    return ++last_;
  }

 private:
  int64_t last_ = 0;
};

std::array<TransferQueue*, 2>& queues() {
  static std::array<TransferQueue*, 2> q{};
  return q;
}

}  // namespace

void register_transfer_queue(Device dev, TransferQueue* queue) {
  KS_CHECK(dev != Device::CPU, "register_transfer_queue: host memory needs no transfers");
  queues()[size_t(dev)] = queue;
}

TransferQueue& transfer_queue(Device dev) {
  static ImmediateTransfers immediate;
  TransferQueue* q = queues()[size_t(dev)];
  return q ? *q : immediate;
}

const DeviceMemoryHooks& device_memory_hooks(Device dev, const char* what) {
  const DeviceMemoryHooks& h = table()[size_t(dev)];
  if (!h.fill || !h.copy)
    KS_FAIL("not supported yet: ", dev == Device::CUDA ? "CUDA" : device_name(dev), " kernel for ", what);
  return h;
}

}  // namespace kestrel
