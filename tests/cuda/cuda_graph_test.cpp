// CUDA graphs (backend/cuda/cuda_graph.h): a captured sequence of ops replays
// to what the same ops compute eagerly, on new input values copied into the
// same buffers; its allocations come from the graph's pool; what a capture
// cannot contain (a read back to the host) fails the capture and leaves the
// backend as it was. On the emulator (cuda-emu) and on a GPU.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "core/device_hooks.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace kestrel {
namespace {

class CudaGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::describe();
    cuda::init();
  }
};

std::vector<float> ramp(int64_t n, float scale, float shift) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float((i * 37) % 23) + shift;
  return v;
}
Tensor on_device(const std::vector<float>& v, Shape s) {
  Tensor t = Tensor::empty(s, DType::F32, MemCategory::Other, Device::CUDA);
  t.copy_from(Tensor::from_host(v, s));
  return t;
}

// y = rmsnorm(x @ w^T) * 1: a GEMM, a kernel, buffers allocated inside.
Tensor work(const Tensor& x, const Tensor& w, const Tensor& g) {
  Tensor h = Tensor::empty({x.size(0), w.size(0)}, DType::F32, MemCategory::Activations, Device::CUDA);
  ops::linear_fwd(x, w, nullptr, h);
  Tensor y = Tensor::empty(h.shape(), DType::F32, MemCategory::Activations, Device::CUDA);
  Tensor rstd = Tensor::empty({x.size(0)}, DType::F32, MemCategory::Activations, Device::CUDA);
  ops::rmsnorm_fwd(h, g, 1e-6f, y, rstd);
  return y;
}

TEST_F(CudaGraph, ReplayEqualsEagerOnNewInputsAndAllocatesFromItsPool) {
  const Tensor w = on_device(ramp(6 * 8, 0.1f, -1.f), {6, 8});
  const Tensor g = on_device(ramp(6, 0.05f, 0.5f), {6});
  Tensor x = on_device(ramp(4 * 8, 0.2f, -2.f), {4, 8});  // the graph's input buffer
  cuda::GraphPool pool;
  cuda::Graph graph;
  Tensor out;
  cuda::Graph().capture(pool, [] {});  // the first capture sets cuBLAS's workspace up (eager memory, once)
  const int64_t live_before = device_allocator(Device::CUDA)->stats().total_live;
  graph.capture(pool, [&] { out = work(x, w, g); });
  EXPECT_TRUE(graph.captured());
  EXPECT_FALSE(cuda::capturing());
  EXPECT_GT(pool.reserved_bytes(), 0u) << "the captured buffers come from the graph's pool";
  EXPECT_EQ(device_allocator(Device::CUDA)->stats().total_live, live_before) << "nothing from the eager allocator";
  const int64_t replays = cuda::Graph::replays();
  for (float shift : {-2.f, 3.f}) {
    const std::vector<float> xv = ramp(4 * 8, 0.3f, shift);
    x.copy_from(Tensor::from_host(xv, {4, 8}));
    graph.replay();
    const Tensor want = work(on_device(xv, {4, 8}), w, g);
    EXPECT_EQ(out.to_host<float>(), want.to_host<float>()) << "shift " << shift;
  }
  EXPECT_EQ(cuda::Graph::replays(), replays + 2);
}

TEST_F(CudaGraph, AReadBackFailsTheCaptureAndRestoresTheAllocator) {
  Tensor x = on_device(ramp(16, 1.f, 0.f), {16});
  Allocator* eager = device_allocator(Device::CUDA);
  cuda::GraphPool pool;
  cuda::Graph graph;
  try {
    graph.capture(pool, [&] { (void)x.to_host<float>(); });
    ADD_FAILURE() << "a read back to the host was captured";
  } catch (const std::exception& e) {
    std::printf("refused as expected: %s\n", e.what());
    if (cuda::describe().rfind("emulated", 0) == 0) {
      EXPECT_NE(std::string(e.what()).find("captures a CUDA graph"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::capturing());
  EXPECT_EQ(device_allocator(Device::CUDA), eager);
  EXPECT_EQ(x.to_host<float>(), ramp(16, 1.f, 0.f)) << "the backend works after the failed capture";
  // A kernel launch checks the runtime's last error: the failed capture must not have left one behind.
  Tensor y = Tensor::empty({16}, DType::F32, MemCategory::Other, Device::CUDA);
  y.fill_(2.f);
  EXPECT_EQ(y.to_host<float>(), std::vector<float>(16, 2.f)) << "a kernel launches after the failed capture";
}

}  // namespace
}  // namespace kestrel
