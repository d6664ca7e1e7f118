// Device timings of the CUDA backend's main kernels at Qwen2.5-0.5B shapes,
// for scripts/device_check.sh (bench/peers/torch_cuda_ops.py times the same
// shapes with PyTorch in the same run). One JSON line per measurement:
// {"op", "dtype", "ms", "tflops" or "gbps"}. Each time is the median of
// --reps runs after two warm-ups, the stream synchronised around each run.
//   build/cuda/bench_cuda_ops [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/paged_attention.h"

using namespace kestrel;

namespace {

int g_reps = 10;

double median_ms(const std::function<void()>& f) {
  f();
  f();
  cuda::synchronize();
  std::vector<double> t;
  for (int r = 0; r < g_reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    cuda::synchronize();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A device tensor of uniform values in [-scale, scale] (filled on the host, copied once).
Tensor dev_rand(Shape shape, DType dt, uint64_t seed, float scale = 1.f) {
  Tensor h = Tensor::empty(shape, DType::F32, MemCategory::Other);
  Philox rng{seed, 0};
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, scale * (2.f * rng.uniform(uint64_t(i)) - 1.f));
  Tensor d = Tensor::empty(std::move(shape), dt, MemCategory::Other, Device::CUDA);
  d.copy_from(h);
  return d;
}

void report(const char* op, DType dt, double ms, const char* unit, double amount) {
  std::printf("{\"engine\": \"kestrel\", \"op\": \"%s\", \"dtype\": \"%s\", \"ms\": %.4f, \"%s\": %.2f}\n", op,
              dtype_name(dt), ms, unit, amount / (ms * 1e-3) / (std::strcmp(unit, "tflops") == 0 ? 1e12 : 1e9));
  std::fflush(stdout);
}

void bench_linear(DType dt) {
  const int64_t T = 8192, in = 896, out = 4864;  // Qwen2.5-0.5B gate/up projection over 8k tokens
  Tensor x = dev_rand({T, in}, dt, 1), w = dev_rand({out, in}, dt, 2, 0.05f);
  Tensor y = Tensor::empty({T, out}, dt, MemCategory::Other, Device::CUDA);
  report("linear_fwd", dt, median_ms([&] { ops::linear_fwd(x, w, nullptr, y); }), "tflops", 2.0 * T * in * out);
  Tensor dx = Tensor::empty({T, in}, DType::F32, MemCategory::Other, Device::CUDA);
  Tensor dw = Tensor::zeros({out, in}, DType::F32, MemCategory::Other, Device::CUDA);
  report("linear_bwd", dt, median_ms([&] { ops::linear_bwd(x, w, y, &dx, &dw, nullptr, false); }), "tflops",
         4.0 * T * in * out);
}

void bench_attention(DType dt) {
  const int64_t T = 8192, H = 14, Hkv = 2, hd = 64;  // 4 sequences of 2048
  const ops::AttentionShape s{H, Hkv, hd, 0.f, 0};
  Tensor q = dev_rand({T, H * hd}, dt, 3), k = dev_rand({T, Hkv * hd}, dt, 4), v = dev_rand({T, Hkv * hd}, dt, 5);
  Tensor cu_h = Tensor::from_ints({0, 2048, 4096, 6144, 8192}, {5});
  Tensor cu = Tensor::empty({5}, DType::I32, MemCategory::Other, Device::CUDA);
  cu.copy_from(cu_h);
  Tensor out = Tensor::empty({T, H * hd}, dt, MemCategory::Other, Device::CUDA);
  Tensor lse = Tensor::empty({H, T}, DType::F32, MemCategory::Other, Device::CUDA);
  const double causal_flops = 4.0 * 4 * (2048.0 * 2049 / 2) * H * hd;  // QK^T and PV over the causal half
  report("attention_fwd", dt, median_ms([&] { ops::attention_fwd(q, k, v, cu, s, out, lse); }), "tflops",
         causal_flops);
  Tensor dout = dev_rand({T, H * hd}, dt, 6);
  Tensor dq = Tensor::empty(q.shape(), dt, MemCategory::Other, Device::CUDA);
  Tensor dk = Tensor::empty(k.shape(), dt, MemCategory::Other, Device::CUDA);
  Tensor dv = Tensor::empty(v.shape(), dt, MemCategory::Other, Device::CUDA);
  report("attention_bwd", dt, median_ms([&] { ops::attention_bwd(q, k, v, out, lse, dout, cu, s, dq, dk, dv); }),
         "tflops", 2.5 * causal_flops);
}

void bench_decode(DType dt) {
  const int64_t B = 64, ctx = 1024, H = 14, Hkv = 2, hd = 64, bs = 16, per = ctx / bs;  // 64 sequences decoding
  const ops::AttentionShape s{H, Hkv, hd, 0.f, 0};
  Tensor kc = dev_rand({B * per, bs, Hkv, hd}, dt, 7), vc = dev_rand({B * per, bs, Hkv, hd}, dt, 8);
  std::vector<int32_t> table, cu, lens;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < per; ++j) table.push_back(int32_t(b * per + j));
    cu.push_back(int32_t(b));
    lens.push_back(int32_t(ctx));
  }
  cu.push_back(int32_t(B));
  auto up = [](const std::vector<int32_t>& v, Shape sh) {
    Tensor d = Tensor::empty(sh, DType::I32, MemCategory::Other, Device::CUDA);
    d.copy_from(Tensor::from_ints(v, sh));
    return d;
  };
  Tensor bt = up(table, {B, per}), cut = up(cu, {B + 1}), lt = up(lens, {B});
  Tensor q = dev_rand({B, H * hd}, dt, 9), out = Tensor::empty({B, H * hd}, dt, MemCategory::Other, Device::CUDA);
  const double kv_bytes = 2.0 * B * ctx * Hkv * hd * double(dtype_size(dt));
  report("paged_decode_64x1024", dt, median_ms([&] { ops::paged_attention_fwd(q, kc, vc, bt, cut, lt, s, out); }),
         "gbps", kv_bytes);
}

void bench_elementwise(DType dt) {
  const int64_t T = 8192, D = 4864;
  Tensor g = dev_rand({T, D}, dt, 10), u = dev_rand({T, D}, dt, 11);
  Tensor h = Tensor::empty({T, D}, dt, MemCategory::Other, Device::CUDA);
  report("swiglu_fwd", dt, median_ms([&] { ops::swiglu_fwd(g, u, h); }), "gbps", 3.0 * T * D * dtype_size(dt));
  const int64_t N = 8192, E = 896;
  Tensor x = dev_rand({N, E}, dt, 12), w = dev_rand({E}, dt, 13), y = Tensor::empty({N, E}, dt, MemCategory::Other,
                                                                                     Device::CUDA);
  Tensor rstd = Tensor::empty({N}, DType::F32, MemCategory::Other, Device::CUDA);
  report("rmsnorm_fwd", dt, median_ms([&] { ops::rmsnorm_fwd(x, w, 1e-6f, y, rstd); }), "gbps",
         2.0 * N * E * dtype_size(dt));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
  if (!cuda::available()) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", cuda::describe().c_str());
    return 2;
  }
  cuda::init();
  std::printf("{\"device\": \"%s\"}\n", cuda::describe().c_str());
  for (DType dt : {DType::BF16, DType::F32}) {
    bench_linear(dt);
    bench_attention(dt);
    bench_decode(dt);
    bench_elementwise(dt);
  }
  return 0;
}
