// Device dispatch shared by every op: an op names its kernels per backend once,
//   constexpr Kernels<decltype(cpu::rmsnorm_fwd)> kRmsnormFwd{.cpu = cpu::rmsnorm_fwd};
// and runs them with
//   dispatch("rmsnorm_fwd", kRmsnormFwd, {&x, &w, &y, &rstd}, x, w, eps, y, rstd);
// which checks that every defined tensor lives on one device and calls that
// device's kernel. A device whose backend has no kernel for the op fails with
// "not supported yet: CUDA kernel for ops::rmsnorm_fwd". A CUDA backend adds
// `.cuda = cuda::rmsnorm_fwd` to the op's table and nothing else.
#pragma once
#include <initializer_list>
#include <utility>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_profile.h"

// KS_CUDA_KERNEL(cuda::f) adds ", .cuda = cuda::f" to a kernel table in a
// build with the CUDA backend (KESTREL_HAVE_CUDA) and nothing otherwise.
#if KESTREL_HAVE_CUDA
#define KS_CUDA_KERNEL(f) , .cuda = f
#else
#define KS_CUDA_KERNEL(f)
#endif

namespace kestrel::ops::detail {

// The kernels of one op, one per backend; nullptr = not written yet.
template <class Fn>
struct Kernels {
  Fn* cpu = nullptr;
  Fn* cuda = nullptr;
};

// The device of the defined tensors of ts (nullptr and undefined entries are
// skipped; none defined: the host). Fails for tensors on different devices.
inline Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) first = t;
    if (t->device() != first->device())
      KS_FAIL("ops::", op, ": tensors on different devices (", device_name(first->device()), " and ",
              device_name(t->device()), ")");
  }
  return first ? first->device() : Device::CPU;
}

// The kernel of op for the device ts live on.
template <class Fn>
Fn* kernel_for(const char* op, const Kernels<Fn>& k, std::initializer_list<const Tensor*> ts) {
  const Device dev = common_device(op, ts);
  Fn* f = dev == Device::CPU ? k.cpu : dev == Device::CUDA ? k.cuda : nullptr;
  if (!f)
    KS_FAIL("not supported yet: ", dev == Device::CUDA ? "CUDA" : device_name(dev), " kernel for ops::", op);
  return f;
}

// Runs op's kernel for the device of ts with args (timed under KESTREL_OP_PROFILE, ops/op_profile.h).
template <class Fn, class... A>
decltype(auto) dispatch(const char* op, const Kernels<Fn>& k, std::initializer_list<const Tensor*> ts, A&&... args) {
  Fn* f = kernel_for(op, k, ts);
  OpTimer timer(op, op_profile_enabled() ? common_device(op, ts) : Device::CPU, ts);
  return f(std::forward<A>(args)...);
}

}  // namespace kestrel::ops::detail
