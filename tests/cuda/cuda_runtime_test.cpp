// The CUDA backend's runtime on a device: the caching allocator, Tensor's
// memory hooks (fill, copies both ways with dtype conversion) and the error
// path. Skipped, with the reason, where no device is present (every CPU
// machine, CI included); run by scripts/device_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "core/device_hooks.h"
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

// The transfer queue's copies beside the compute stream: an upload the
// compute stream waits for, kernels on what arrived, a download queued behind
// them that the host waits for. On the emulator under both of its copy
// schedules (tests/cuda_emu/fake_runtime.cpp): as late and as early as a GPU
// could run each copy.
TEST_F(Cuda, TransferQueueCopiesInOrderWithTheKernels) {
  const char* before = std::getenv("KESTREL_EMU_TRANSFERS");
  for (const char* policy : {"lazy", "eager"}) {
    if (emulated()) setenv("KESTREL_EMU_TRANSFERS", policy, 1);
    TransferQueue& q = transfer_queue(Device::CUDA);
    std::vector<float> v(4096);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f - 7.f;
    Tensor up = Tensor::empty_pinned({int64_t(v.size())}, DType::F32, MemCategory::Other);
    up.copy_from(Tensor::from_host(v, {int64_t(v.size())}));
    Tensor d = Tensor::empty(up.shape(), DType::F32, MemCategory::Other, Device::CUDA);
    Tensor d2 = Tensor::empty(up.shape(), DType::F32, MemCategory::Other, Device::CUDA);
    Tensor filled = Tensor::empty(up.shape(), DType::F32, MemCategory::Other, Device::CUDA);
    q.compute_after(q.copy(d, up));
    d2.copy_from(d);  // a device kernel on the compute stream, after the upload
    filled.fill_(3.f);
    Tensor down = Tensor::empty_pinned(up.shape(), DType::F32, MemCategory::Other);
    Tensor down_filled = Tensor::empty_pinned(up.shape(), DType::F32, MemCategory::Other);
    q.copy(down, d2);
    q.wait(q.copy(down_filled, filled));  // the later ticket covers the earlier copy
    EXPECT_EQ(down.to_float_vector(), v) << policy;
    EXPECT_EQ(down_filled.to_float_vector(), std::vector<float>(v.size(), 3.f)) << policy;
    EXPECT_THROW(q.copy(d, d2), Error) << "a device-to-device copy is not a transfer";
  }
  if (emulated()) {
    if (before) setenv("KESTREL_EMU_TRANSFERS", before, 1);
    else unsetenv("KESTREL_EMU_TRANSFERS");
  }
}

}  // namespace
}  // namespace kestrel
