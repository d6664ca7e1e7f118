// Self-test of the emulator's warp semantics and diagnostics (no Kestrel code).
#include <cstdio>
#include <stdexcept>
#include "emu.h"

// Warps do different numbers of shuffles; warp 3 returns early; block sync afterwards.
__global__ void varied(float* out, double* dout) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 3) return;
  float acc = 0.f;
  double dacc = 0;
  for (int it = 0; it < warp + 1 + int(blockIdx.x); ++it) {
    float v = float(lane + it);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    acc += __shfl_sync(0xffffffffu, v, (lane + 1) & 31);
    double d = lane;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    dacc += d;
  }
  __syncwarp();
  __shared__ float s[4];
  if (lane == 0) s[warp] = acc;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[0] + s[1] + s[2];
  dout[blockIdx.x * blockDim.x + threadIdx.x] = dacc;
}
__global__ void divergent(float* out) {
  const int lane = threadIdx.x & 31;
  float v = 1.f;
  if (lane < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else v = __shfl_xor_sync(0xffffffffu, v, 2);
  out[threadIdx.x] = v;
}
__global__ void partial_exit(float* out) {
  const int lane = threadIdx.x & 31;
  if (lane >= 20) return;
  float v = lane;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}
__global__ void deadlock(float* out) {
  if (threadIdx.x < 16) { out[0] = __shfl_xor_sync(0xffffffffu, 1.f, 1); return; }
  __syncthreads();
}
__global__ void overrun(float* out, int n) { if (threadIdx.x == 0) out[n] = 1.f; }

int main() {
  int bad = 0;
  float* out = static_cast<float*>(emu::dev_alloc(4 * 1024));
  double* dout = static_cast<double*>(emu::dev_alloc(8 * 1024));
  emu::launch("varied", 2, 128, [&](auto&&... a) { varied(a...); }, out, dout);
  for (int b = 0; b < 2; ++b) {
    float want = 0;
    for (int w = 0; w < 3; ++w) for (int it = 0; it < w + 1 + b; ++it) want += 32.f * 15.5f + 32.f * it;
    for (int t = 0; t < 128; ++t) {
      const int w = t >> 5;
      if (w == 3) { if (!std::isnan(out[b * 128 + t])) { std::printf("warp 3 wrote\n"); ++bad; } continue; }
      if (out[b * 128 + t] != want) { std::printf("varied b%d t%d: %g want %g\n", b, t, out[b*128+t], want); ++bad; break; }
      if (dout[b * 128 + t] != 496.0 * (w + 1 + b)) { std::printf("double shfl wrong\n"); ++bad; break; }
    }
  }
  auto expect_error = [&](const char* what, auto fn) {
    try { fn(); std::printf("NOT DETECTED: %s\n", what); ++bad; }
    catch (const std::exception& e) { std::printf("detected %s\n", what); }
  };
  expect_error("divergent shuffle", [&] { emu::launch("divergent", 1, 64, [&](auto&&... a) { divergent(a...); }, out); });
  expect_error("shuffle after partial warp exit", [&] { emu::launch("partial_exit", 1, 32, [&](auto&&... a) { partial_exit(a...); }, out); });
  expect_error("deadlock", [&] { emu::launch("deadlock", 1, 64, [&](auto&&... a) { deadlock(a...); }, out); });
  expect_error("write past the end", [&] { emu::launch("overrun", 1, 32, [&](auto&&... a) { overrun(a...); }, out, 1024); });
  float host[4];
  expect_error("host pointer argument", [&] { emu::launch("overrun", 1, 32, [&](auto&&... a) { overrun(a...); }, host, 0); });
  std::printf(bad ? "SELFTEST FAILED (%d)\n" : "SELFTEST OK\n", bad);
  return bad != 0;
}
