// The CUDA backend's runtime on a device: the caching allocator, Tensor's
// memory hooks (fill, copies both ways with dtype conversion) and the error
// path. Skipped, with the reason, where no device is present (every CPU
// machine, CI included); run by scripts/device_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kestrel {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::describe();
    cuda::init();
  }
  // The CPU emulator of tests/cuda_emu (the cuda-emu preset) in place of a GPU.
  static bool emulated() { return cuda::describe().rfind("emulated", 0) == 0; }
};

TEST_F(Cuda, DescribesTheDevice) {
  const std::string d = cuda::describe();
  if (!emulated()) {
    EXPECT_NE(d.find("sm_"), std::string::npos) << d;
  }
  std::printf("device: %s\n", d.c_str());
}

TEST_F(Cuda, HostDeviceRoundTripsKeepEveryDtypeBitForBit) {
  const std::vector<float> v = {1.f, -2.5f, 3.1415927f, 1e-20f, -0.f, 65504.f, 1e30f};
  Tensor h = Tensor::from_host(v, {int64_t(v.size())});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor host_dt = h.to(dt);
    Tensor d = Tensor::empty(h.shape(), dt, MemCategory::Other, Device::CUDA);
    d.copy_from(host_dt);
    EXPECT_EQ(d.to_float_vector(), host_dt.to_float_vector()) << dtype_name(dt);
  }
  // f32 host -> bf16 device converts on the host (round to nearest even), as copy_from does on the host.
  Tensor d = Tensor::empty(h.shape(), DType::BF16, MemCategory::Other, Device::CUDA);
  d.copy_from(h);
  EXPECT_EQ(d.to_float_vector(), h.to(DType::BF16).to_float_vector());
  // Device to device f32 -> bf16 runs the conversion kernel: the same rounding.
  Tensor d32 = Tensor::empty(h.shape(), DType::F32, MemCategory::Other, Device::CUDA);
  d32.copy_from(h);
  Tensor d16 = Tensor::empty(h.shape(), DType::BF16, MemCategory::Other, Device::CUDA);
  d16.copy_from(d32);
  EXPECT_EQ(d16.to_float_vector(), h.to(DType::BF16).to_float_vector());
}

TEST_F(Cuda, FillAndZeroWriteEveryElement) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32, DType::I64, DType::U8}) {
    Tensor t = Tensor::empty({1000, 3}, dt, MemCategory::Other, Device::CUDA);
    t.fill_(7.f);
    for (float x : t.to_float_vector()) ASSERT_EQ(x, 7.f) << dtype_name(dt);
    t.zero_();
    for (float x : t.to_float_vector()) ASSERT_EQ(x, 0.f) << dtype_name(dt);
  }
}

TEST_F(Cuda, SteadyStateAllocatesNothingNew) {
  // The emulator hands out fresh poisoned memory per tensor, so a missing write is never hidden by stale data.
  if (emulated()) GTEST_SKIP() << "the emulated device's tensors do not go through the caching allocator";
  auto& a = cuda::allocator();
  auto step = [] {
    Tensor x = Tensor::empty({1024, 1024}, DType::F32, MemCategory::Activations, Device::CUDA);
    Tensor y = Tensor::empty({333}, DType::BF16, MemCategory::Grads, Device::CUDA);
    x.zero_();
    y.zero_();
  };
  step();
  const int64_t raw = a.raw_allocations();
  for (int i = 0; i < 10; ++i) step();
  cuda::synchronize();
  EXPECT_EQ(a.raw_allocations(), raw);
  EXPECT_GE(a.stats().peak_of(MemCategory::Activations), 4 << 20);
}

}  // namespace
}  // namespace kestrel
