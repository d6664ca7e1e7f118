// Emulation stand-in for the CUDA runtime API (host memory) used by Kestrel's host code.
#pragma once
#include <cstddef>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorIllegalState = 401,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906
};
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
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t n);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, size_t n);
cudaError_t cudaFree(void* p);

// Stream capture and graphs (CUDA graphs). The emulator records the captured
// stream's kernel launches, device-to-device copies, memsets and GEMMs as a
// list replayed in order by cudaGraphLaunch, and enforces CUDA's capture rules:
// a synchronisation, a copy to or from host memory, an allocation or free
// outside relaxed mode, or work on the legacy stream while a stream captures
// fails with the call named, and the capture is invalidated (EndCapture then
// returns cudaErrorStreamCaptureInvalidated), as on a GPU.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

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
// Whether a stream is capturing (then launches are recorded, not run).
bool capture_active();
// Graphs launched so far (cudaGraphLaunch calls), for tests that a graph was replayed.
long graph_launches();
}  // namespace emu
