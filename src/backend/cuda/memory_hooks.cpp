// Tensor's memory hooks for Device::CUDA (fill; copies between host and device
// with dtype conversion) and the float kind of a tensor: the parts of the
// runtime the kernels' host code shares with tests/cuda_emu's emulated runtime.
#include <cstring>

#include "backend/cuda/cuda_util.h"

namespace kestrel::cuda {

namespace {

uint64_t encode(float v, DType dt) {
  switch (dt) {
    case DType::F32: { uint32_t u; std::memcpy(&u, &v, 4); return u; }
    case DType::BF16: return float_to_bf16(v);
    case DType::F16: return float_to_f16(v);
    case DType::I32: return uint32_t(int32_t(v));
    case DType::I64: return uint64_t(int64_t(v));
    case DType::U8: return uint8_t(v);
  }
  return 0;
}

bool is_float_kind(DType d) { return d == DType::F32 || d == DType::BF16; }

}  // namespace

void fill_hook(Tensor& t, float v) {
  launch::fill_bits(t.raw(), t.numel(), int(dtype_size(t.dtype())), encode(v, t.dtype()), stream());
  check_launch("Tensor::fill_");
}

// dst = src for tensors of which at least one lives on the device.
void copy_hook(Tensor& dst, const Tensor& src) {
  const bool dd = dst.device() == Device::CUDA, sd = src.device() == Device::CUDA;
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dd && sd) {
      KS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    } else if (dd) {
      // From pageable host memory: the copy is staged by the driver; synchronous, so
      // the host buffer may be freed when this returns.
      KS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyHostToDevice, stream()));
      KS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    } else {
      KS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, stream()));
      KS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    return;
  }
  if (dd && sd) {
    KS_CHECK(is_float_kind(dst.dtype()) && is_float_kind(src.dtype()), "not supported yet: a CUDA copy from ",
             dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()));
    launch::convert(src.raw(), float_kind(src, "copy"), dst.raw(), float_kind(dst, "copy"), dst.numel(), stream());
    check_launch("Tensor::copy_from");
    return;
  }
  if (dd) {  // host src of another dtype: convert on the host, then upload
    Tensor staged = Tensor::empty(dst.shape(), dst.dtype(), MemCategory::Other, Device::CPU);
    staged.copy_from(src);
    copy_hook(dst, staged);
    return;
  }
  Tensor staged = Tensor::empty(src.shape(), src.dtype(), MemCategory::Other, Device::CPU);
  copy_hook(staged, src);
  dst.copy_from(staged);
}


launch::FloatKind float_kind(const Tensor& t, const char* op) {
  if (t.dtype() == DType::F32) return launch::FloatKind::F32;
  if (t.dtype() == DType::BF16) return launch::FloatKind::BF16;
  KS_FAIL("not supported yet: CUDA kernel for ops::", op, " on ", dtype_name(t.dtype()), " tensors");
}

}  // namespace kestrel::cuda
