// Emulation stand-in for the CUDA runtime API (host memory) used by Kestrel's host code.
#pragma once
#include <cstddef>

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
typedef struct CUstream_st* cudaStream_t;

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t n);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();

namespace emu {
// Emulated device memory: allocations poisoned with 0xFF, guard bytes checked after launches.
// It is inaccessible to host code (PROT_NONE; a touch aborts with a message and a backtrace)
// except inside a DeviceAccess, which the emulator holds while a launch, copy, memset or GEMM
// runs, unless EMU_HOST_ACCESS=allow.
void* dev_alloc(size_t bytes);
void dev_free(void* p);
bool is_device(const void* p, size_t n = 1);
// Device memory readable and writable for the guard's lifetime (process-wide; nests).
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
// Whether host access to device memory is trapped (false with EMU_HOST_ACCESS=allow).
bool host_access_protected();
}  // namespace emu
