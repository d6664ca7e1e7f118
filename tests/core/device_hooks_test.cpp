// Tensor's device-aware methods (zero_, fill_, copy_from, to_host,
// to_float_vector) go through the hooks a backend registers for its device,
// and fail with "not supported yet" where none are registered. The "device"
// here is host memory tagged CUDA, with hooks that count their calls.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/device_hooks.h"
#include "core/tensor.h"

namespace kestrel {
namespace {

int g_fills = 0, g_copies = 0;

// The tagged tensor's memory seen as a host tensor.
Tensor host_alias(const Tensor& t) { return Tensor::from_blob(t.raw(), t.shape(), t.dtype()); }

void fake_fill(Tensor& t, float v) {
  ++g_fills;
  host_alias(t).fill_(v);
}
void fake_copy(Tensor& dst, const Tensor& src) {
  ++g_copies;
  Tensor d = dst.device() == Device::CPU ? dst : host_alias(dst);
  d.copy_from(src.device() == Device::CPU ? src : host_alias(src));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DeviceHooks, TensorMethodsDispatchToTheRegisteredBackend) {
  std::vector<float> mem(6, 5.f);
  Tensor dev = Tensor::from_blob(mem.data(), {2, 3}, DType::F32, nullptr, Device::CUDA);

  register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{});  // none
  EXPECT_NE(error_of([&] { dev.zero_(); }).find("not supported yet: CUDA kernel for Tensor::zero_"), std::string::npos);
  EXPECT_NE(error_of([&] { dev.fill_(1.f); }).find("CUDA kernel for Tensor::fill_"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)dev.to_float_vector(); }).find("CUDA kernel for Tensor::copy_from"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)dev.get(0); }).find("element access reads host memory"), std::string::npos);
  EXPECT_NE(error_of([&] { dev.set(0, 1.f); }).find("element access writes host memory"), std::string::npos);
  EXPECT_EQ(mem, std::vector<float>(6, 5.f));  // nothing touched the "device" memory

  register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{fake_fill, fake_copy});
  dev.zero_();
  EXPECT_EQ(mem, std::vector<float>(6, 0.f));
  dev.fill_(2.5f);
  EXPECT_EQ(mem, std::vector<float>(6, 2.5f));
  EXPECT_EQ(g_fills, 2);

  dev.copy_from(Tensor::from_vector({1, 2, 3, 4, 5, 6}, {6}));  // host -> device
  EXPECT_EQ(mem, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(dev.to_host<float>(), mem);                        // device -> host
  EXPECT_EQ(dev.to_float_vector(), mem);
  Tensor back = Tensor::empty({6}, DType::BF16);
  back.copy_from(dev);  // device -> host, converting
  EXPECT_EQ(back.to_float_vector(), mem);
  EXPECT_GE(g_copies, 4);
  register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{});
}

// Host memory tagged CUDA, counting live bytes: a stand-in for the device allocator.
class TaggedAllocator final : public Allocator {
 public:
  explicit TaggedAllocator(Device dev) : dev_(dev) {}
  void* allocate(size_t bytes, MemCategory cat) override {
    account(cat, int64_t(bytes));
    return std::malloc(bytes ? bytes : 1);
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    account(cat, -int64_t(bytes));
    std::free(p);
  }
  Device device() const override { return dev_; }

 private:
  Device dev_;
};

// param_offload's move: a storage relocates between allocators (and devices) in
// place, so every view follows with its values; the old allocation is freed.
TEST(DeviceHooks, StorageRelocatesInPlaceAndViewsFollow) {
  register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{fake_fill, fake_copy});
  TaggedAllocator device(Device::CUDA), pinned(Device::CPU);
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, MemCategory::Params);
  const Tensor row = w.slice_rows(1, 2), flat = w.view({6});  // views, as the optimizer and the rollout hold
  w.storage()->relocate(&device);  // host -> "device" through the copy hook
  EXPECT_EQ(w.device(), Device::CUDA);
  EXPECT_EQ(row.device(), Device::CUDA);
  EXPECT_EQ(device.stats().live_of(MemCategory::Params), 24);
  EXPECT_EQ(row.to_float_vector(), (std::vector<float>{4, 5, 6}));
  w.storage()->relocate(&pinned);  // "device" -> pinned host memory
  EXPECT_EQ(device.stats().live_of(MemCategory::Params), 0);
  EXPECT_EQ(pinned.stats().live_of(MemCategory::Params), 24);
  EXPECT_EQ(flat.device(), Device::CPU);
  EXPECT_EQ(flat.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const void* at = w.storage()->data();
  w.storage()->relocate(&pinned);  // already there: nothing moves
  EXPECT_EQ(w.storage()->data(), at);
  EXPECT_EQ(pinned.stats().live_of(MemCategory::Params), 24);
  w.storage()->relocate(&cpu_allocator());  // host to host: memcpy
  EXPECT_EQ(pinned.stats().live_of(MemCategory::Params), 0);
  EXPECT_EQ(row.to_float_vector(), (std::vector<float>{4, 5, 6}));
  std::vector<float> mem(2, 1.f);
  Tensor borrowed = Tensor::from_blob(mem.data(), {2}, DType::F32);
  EXPECT_NE(error_of([&] { borrowed.storage()->relocate(&pinned); }).find("borrowed memory"), std::string::npos);
  // Without a backend's pinned memory, offloads land in the plain host allocator.
  EXPECT_EQ(pinned_host_allocator(), &cpu_allocator());
  register_pinned_host_allocator(&pinned);
  EXPECT_EQ(pinned_host_allocator(), &pinned);
  EXPECT_EQ(Tensor::empty_pinned({4}, DType::F32, MemCategory::Grads).storage()->allocator(), &pinned);
  register_pinned_host_allocator(nullptr);
  register_device_memory_hooks(Device::CUDA, DeviceMemoryHooks{});
}

TEST(DeviceHooks, HostMemoryNeedsNone) {
  EXPECT_THROW(register_device_memory_hooks(Device::CPU, DeviceMemoryHooks{fake_fill, fake_copy}), Error);
  Tensor t = Tensor::from_host(std::vector<int64_t>{1, -2, int64_t(1) << 40}, {3});
  EXPECT_EQ(t.dtype(), DType::I64);
  EXPECT_EQ(t.to_host<int64_t>(), (std::vector<int64_t>{1, -2, int64_t(1) << 40}));
  EXPECT_THROW((void)t.to_host<float>(), Error);
  Tensor u = Tensor::from_vector({1, 2, 3, 4}, {4});
  EXPECT_TRUE(u.same_data(u.view({2, 2})));
  EXPECT_FALSE(u.same_data(u.slice_rows(1, 3)));
  EXPECT_FALSE(u.same_data(u.clone()));
  // The f32 -> bf16 copy rounds to nearest even as set() does.
  Tensor w = Tensor::from_vector({1.00390625f, 1.01171875f, -3.3f}, {3}), b = Tensor::empty({3}, DType::BF16);
  b.copy_from(w);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(b.get(i), round_bf16(w.get(i)));
}

}  // namespace
}  // namespace kestrel
