// The device a benchmark runs on (--device cpu|cuda), shared by the benchmarks
// that take one: CUDA initialised on GPU 0 where the build has the backend and
// a device is present, and the stream drained before a wall-clock reading.
#pragma once
#include <cstdio>
#include <string>

#include "core/allocator.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kestrel::bench {

// Parses and initialises --device; false (with a message on stderr) when it cannot run here.
inline bool init_device(const std::string& name, Device* dev) {
  if (name == "cpu") {
    *dev = Device::CPU;
    return true;
  }
  if (name != "cuda") {
    std::fprintf(stderr, "--device %s: cpu or cuda\n", name.c_str());
    return false;
  }
#if KESTREL_HAVE_CUDA
  if (!cuda::available()) {
    std::fprintf(stderr, "--device cuda: %s\n", cuda::describe().c_str());
    return false;
  }
  cuda::init(0);
  *dev = Device::CUDA;
  return true;
#else
  std::fprintf(stderr, "--device cuda: this build has no CUDA backend (cmake --preset cuda)\n");
  return false;
#endif
}

// The device's queued work finished, so a wall-clock time covers it.
inline void sync_device(Device dev) {
#if KESTREL_HAVE_CUDA
  if (dev == Device::CUDA) cuda::synchronize();
#else
  (void)dev;
#endif
}

}  // namespace kestrel::bench
