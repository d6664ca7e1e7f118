// CPU emulation of the CUDA device features the Kestrel kernels use.
// Every CUDA thread of a block is a fiber (ucontext) on the launching host
// thread; blocks run one after another. A fiber runs until it reaches a sync
// point (__syncthreads, __syncwarp, a shuffle) or returns; then the scheduler
// releases a WARP when all its non-exited lanes wait at warp sync points, and
// the BLOCK when all its non-exited threads wait at __syncthreads. Shuffles
// are computed by the scheduler at release time from the values every lane
// deposited. Checked (an error fails the launch with a message):
//  - lanes of one warp waiting at different warp sync sites (divergence),
//  - a shuffle reading from an exited lane, a full-mask shuffle/syncwarp
//    with exited lanes in the warp (undefined behaviour in CUDA),
//  - __syncthreads reached at different sites, deadlock (e.g. some lanes at
//    a shuffle while others are at __syncthreads),
//  - kernel pointer arguments that are not emulated device memory,
//  - writes past the end of device allocations (guard bytes, after each launch),
//  - host code touching device memory (PROT_NONE outside the emulator's own
//    accesses; emu_runtime.cpp, EMU_HOST_ACCESS=allow turns it off).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_runtime_api.h"
#include "core/dtype.h"

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };
inline thread_local emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
using std::isnan;
using std::isinf;
using std::isfinite;

struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) { return kestrel::bf16_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {kestrel::float_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return {kestrel::float_to_bf16(f)}; }
struct __half { uint16_t bits; };
inline float __half2float(__half h) { return kestrel::f16_to_float(h.bits); }
inline __half __float2half_rn(float f) { return {kestrel::float_to_f16(f)}; }
inline __half __float2half(float f) { return {kestrel::float_to_f16(f)}; }

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int u) { return std::bit_cast<float>(u); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

namespace emu {
using Site = std::source_location;
// One launch: body runs kernel(args...) for the current fiber.
void run_launch(const char* name, long long grid, long long block, const std::function<void()>& body,
                const std::vector<std::pair<int, const void*>>& ptr_args);
void syncthreads(Site s);
void shared_poison(void* p, size_t n);
void syncwarp(unsigned mask, Site s);
uint64_t shfl(unsigned mask, uint64_t bits, int typ, int lane_arg, bool is_xor, int width, Site s);

template <class A>
void collect_ptr(std::vector<std::pair<int, const void*>>& v, int i, const A& a) {
  if constexpr (std::is_pointer_v<std::decay_t<A>>) v.push_back({i, static_cast<const void*>(a)});
}
// A launch while a stream captures: recorded into that stream's graph (checked
// as run_launch checks it, and again when the graph replays), not run. A launch
// on another stream runs now, except on the legacy stream (nullptr), which
// CUDA refuses while any stream captures.
void capture_launch(const char* name, long long grid, long long block, cudaStream_t stream,
                    std::function<void()> body, std::vector<std::pair<int, const void*>> ptr_args);
// kernel f(args...) on `stream`; the arguments are copied, as a launch copies them.
template <class F, class... A>
void launch_on(const char* name, long long grid, long long block, cudaStream_t stream, F f, A... args) {
  std::vector<std::pair<int, const void*>> ptrs;
  int i = 0;
  (collect_ptr(ptrs, i++, args), ...);
  if (capture_active()) {
    capture_launch(name, grid, block, stream, [f, args...] { f(args...); }, std::move(ptrs));
    return;
  }
  run_launch(name, grid, block, [&] { f(args...); }, ptrs);
}
// The same on the legacy default stream.
template <class F, class... A>
void launch(const char* name, long long grid, long long block, F f, A... args) {
  launch_on(name, grid, block, nullptr, f, args...);
}
template <class T>
constexpr int type_code() {
  if constexpr (std::is_same_v<T, float>) return 1;
  else if constexpr (std::is_same_v<T, double>) return 2;
  else if constexpr (std::is_same_v<T, int>) return 3;
  else if constexpr (std::is_same_v<T, unsigned>) return 4;
  else if constexpr (std::is_same_v<T, long long>) return 5;
  else if constexpr (std::is_same_v<T, unsigned long long>) return 6;
  else if constexpr (std::is_same_v<T, long>) return 7;
  else return 0;
}
template <class T>
T do_shfl(unsigned mask, T v, int lane_arg, bool is_xor, int width, Site s) {
  static_assert(type_code<T>() != 0, "emu: shuffle of an unsupported type");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shfl(mask, bits, type_code<T>(), lane_arg, is_xor, width, s);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
}  // namespace emu

// Kestrel's launch macro (backend/cuda/device_util.cuh): the kernel runs in the emulator.
namespace emu {
template <class F>
struct Launcher {
  const char* name;
  long long grid, block;
  cudaStream_t stream;
  F f;
  template <class... A>
  void operator()(A... args) const { launch_on(name, grid, block, stream, f, args...); }
};
template <class F>
Launcher<F> make_launcher(const char* name, long long grid, long long block, cudaStream_t stream, F f) {
  return {name, grid, block, stream, f};
}
}  // namespace emu
// The kernel is named, never a local variable: a recorded launch keeps the lambda.
#define KS_LAUNCH(kernel, grid, block, stream) \
  ::emu::make_launcher(#kernel, (grid), (block), (stream), [](auto&&... a_) { kernel(a_...); })

inline void __syncthreads(emu::Site s = emu::Site::current()) { emu::syncthreads(s); }
inline void __syncwarp(unsigned mask = 0xffffffffu, emu::Site s = emu::Site::current()) { emu::syncwarp(mask, s); }
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, emu::Site s = emu::Site::current()) {
  return emu::do_shfl(mask, v, lane_mask, true, width, s);
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, emu::Site s = emu::Site::current()) {
  return emu::do_shfl(mask, v, src, false, width, s);
}
