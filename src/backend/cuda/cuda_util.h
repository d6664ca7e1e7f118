// Internals of the CUDA backend's host code: error checks that fail with the
// runtime's message and the call site, the process's stream and cuBLAS handle.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels.h"
#include "core/status.h"
#include "core/tensor.h"

#define KS_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                \
    const cudaError_t ks_err_ = (expr);                                                               \
    if (ks_err_ != cudaSuccess) KS_FAIL("CUDA error in ", #expr, ": ", cudaGetErrorString(ks_err_)); \
  } while (0)

#define KS_CUBLAS_CHECK(expr)                                                                               \
  do {                                                                                                      \
    const cublasStatus_t ks_st_ = (expr);                                                                   \
    if (ks_st_ != CUBLAS_STATUS_SUCCESS) KS_FAIL("cuBLAS error in ", #expr, ": ", cublasGetStatusString(ks_st_)); \
  } while (0)

namespace kestrel::cuda {

cudaStream_t stream();
cublasHandle_t cublas();
// Checks the last launch (launch errors are reported at once; faults inside
// a kernel surface at the next synchronisation).
void check_launch(const char* what);

// Tensor's memory hooks for Device::CUDA (memory_hooks.cpp; runtime.cpp registers them).
void fill_hook(Tensor& t, float v);
void copy_hook(Tensor& dst, const Tensor& src);

// The FloatKind of a float tensor (F32 or BF16; anything else fails naming `op`).
launch::FloatKind float_kind(const Tensor& t, const char* op);
// A device tensor's data pointer.
inline void* dptr(const Tensor& t) { return t.raw(); }

}  // namespace kestrel::cuda
