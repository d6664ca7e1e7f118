// The emulator's CUDA runtime API subset (copies, memsets, synchronisation,
// allocation), stream capture and graphs, and cublasGemmEx; the scheduler and
// device memory they run on are emu_runtime.cpp's.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cublas_v2.h"
#include "emu.h"

// ---- stream capture (CUDA graphs) --------------------------------------------
// One capture at a time (the backend has one stream). While it is on, work on
// the capturing stream is recorded as nodes (kernel launches, device-to-device
// copies, memsets, GEMMs) that cudaGraphLaunch runs in order; the calls CUDA
// refuses during a capture fail here too, naming the call, and invalidate it.
namespace emu {
namespace {
struct Node {
  std::string what;
  std::function<void()> run;
};
struct Capture {
  cudaStream_t stream = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::string invalidated;  // the first refused call's message; "" while valid
  std::vector<Node> nodes;
};
Capture cap;
std::atomic<bool> cap_on{false};
std::atomic<long> graph_launch_count{0};
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
thread_local std::string last_capture_error;

std::string stream_name(cudaStream_t s) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", static_cast<void*>(s));
  return s ? b : "0 (the legacy default stream)";
}
const char* code_name(cudaError_t e) {
  switch (e) {
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaError";
  }
}
thread_local cudaError_t last_error = cudaSuccess;
// A runtime call's result, kept as the thread's last error when it is one.
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}
// A call CUDA refuses while a stream captures: the capture is invalidated (its
// EndCapture fails) and the call returns `code`; the message names the call.
cudaError_t refuse(const std::string& call, const std::string& why, cudaError_t code = cudaErrorStreamCaptureUnsupported) {
  const std::string msg = "emu: " + call + " while stream " + stream_name(cap.stream) + " captures a CUDA graph: " +
                          why + " (" + code_name(code) + "; the capture is invalidated)";
  if (cap.invalidated.empty()) cap.invalidated = msg;
  last_capture_error = msg;
  std::fprintf(stderr, "%s\n", msg.c_str());
  return code;
}
// Allocation and free are "potentially unsafe" calls: refused while a capture
// runs unless it or this thread is in relaxed mode (a graph's memory pool
// allocates so, as PyTorch's does).
bool unsafe_allowed() {
  return cap.mode == cudaStreamCaptureModeRelaxed || thread_mode == cudaStreamCaptureModeRelaxed;
}
void record(std::string what, std::function<void()> run) { cap.nodes.push_back({std::move(what), std::move(run)}); }
// Work on stream s while a capture is on: true when it is to be recorded, false
// when it runs now (another stream); fails for the legacy stream.
bool recorded(cudaStream_t s, const std::string& call, cudaError_t* err) {
  *err = cudaSuccess;
  if (!cap_on) return false;
  if (s == cap.stream) return true;
  if (!s)
    *err = refuse(call + " on the legacy default stream",
                  "the legacy stream synchronises with every stream, which a capture cannot contain; use the "
                  "capturing stream", cudaErrorStreamCaptureImplicit);
  return false;
}
}  // namespace

bool capture_active() { return cap_on; }
// dev_alloc is the emulator's cudaMalloc (the backend's allocators call it directly).
void check_alloc_in_capture() {
  if (cap_on && !unsafe_allowed()) {
    refuse("a device allocation (cudaMalloc)",
           "allocate before the capture, or from a graph pool in relaxed capture mode");
    throw std::runtime_error(last_capture_error);
  }
}
long graph_launches() { return graph_launch_count; }

void capture_launch(const char* name, long long grid, long long block, cudaStream_t stream, std::function<void()> body,
                    std::vector<std::pair<int, const void*>> ptr_args) {
  cudaError_t err;
  if (!recorded(stream, std::string("launch of kernel ") + name, &err)) {
    if (err != cudaSuccess) throw std::runtime_error(last_capture_error);
    run_launch(name, grid, block, body, ptr_args);
    return;
  }
  // Checked now, as a launch into a capture is; the replay checks the pointers again
  // (memory freed since the capture is an error there).
  if (grid <= 0 || grid > 2147483647LL || block <= 0 || block > 1024 || block % 32 != 0)
    throw std::runtime_error(std::string("emu: bad launch configuration for ") + name);
  for (auto& [i, p] : ptr_args)
    if (p && !is_device(p))
      throw std::runtime_error(std::string("emu: kernel ") + name + " argument " + std::to_string(i) +
                               " is a pointer outside emulated device memory");
  record(std::string("kernel ") + name, [name = std::string(name), grid, block, body = std::move(body),
                                          ptr_args = std::move(ptr_args)] {
    run_launch(name.c_str(), grid, block, body, ptr_args);
  });
}
}  // namespace emu

using emu::cap;
using emu::cap_on;

// ---- runtime API ------------------------------------------------------------
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emu)";
    case cudaErrorStreamCaptureInvalidated: {
      thread_local std::string text;
      text = std::string("operation failed due to a previous error during capture (") + emu::last_capture_error + ")";
      return text.c_str();
    }
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorIllegalState: {
      thread_local std::string text;
      text = std::string("operation not permitted when stream is capturing (") + emu::last_capture_error + ")";
      return text.c_str();
    }
    default: return "emu error";
  }
}
// The thread's last error, as CUDA keeps it: set by every call that fails
// (a launch check after a refused capture sees the refusal unless someone
// cleared it), returned and cleared by cudaGetLastError.
cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return emu::last_error; }
namespace {
// The copy's direction matches where dst and src live.
bool copy_ok(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  const bool dd = emu::is_device(dst, n), sd = emu::is_device(src, n);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    default: break;
  }
  if (!ok)
    std::fprintf(stderr, "emu: cudaMemcpyAsync kind %d with dst %s, src %s (%zu bytes)\n", int(kind),
                 dd ? "device" : "host/out of range", sd ? "device" : "host/out of range", n);
  return ok;
}
}  // namespace
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  cudaError_t err;
  if (emu::recorded(s, "cudaMemcpyAsync", &err)) {
    if (kind != cudaMemcpyDeviceToDevice)
      return emu::refuse("cudaMemcpyAsync from or to host memory",
                         "a graph would read or write that host address at every replay (and a pageable copy "
                         "synchronises); copy into a persistent device buffer before the replay, read results "
                         "after it");
    if (!copy_ok(dst, src, n, kind)) return emu::fail(cudaErrorInvalidValue);
    emu::record("cudaMemcpyAsync", [dst, src, n, kind] {
      if (!copy_ok(dst, src, n, kind)) throw std::runtime_error("emu: a replayed copy's memory was freed");
      const emu::DeviceAccess device_access;
      std::memmove(dst, src, n);
    });
    return cudaSuccess;
  }
  if (err != cudaSuccess) return emu::fail(err);
  if (!copy_ok(dst, src, n, kind)) return emu::fail(cudaErrorInvalidValue);
  const emu::DeviceAccess device_access;
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (cap_on) return emu::refuse("cudaMemcpy", "a synchronous copy waits for the device, which a capture cannot");
  return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (!emu::is_device(dst, n)) {
    std::fprintf(stderr, "emu: cudaMemsetAsync on memory outside device allocations (%zu bytes)\n", n);
    return emu::fail(cudaErrorInvalidValue);
  }
  cudaError_t err;
  if (emu::recorded(s, "cudaMemsetAsync", &err)) {
    emu::record("cudaMemsetAsync", [dst, value, n] {
      if (!emu::is_device(dst, n)) throw std::runtime_error("emu: a replayed memset's memory was freed");
      const emu::DeviceAccess device_access;
      std::memset(dst, value, n);
    });
    return cudaSuccess;
  }
  if (err != cudaSuccess) return emu::fail(err);
  const emu::DeviceAccess device_access;
  std::memset(dst, value, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t n) {
  if (cap_on) return emu::refuse("cudaMemset", "a synchronous memset waits for the device, which a capture cannot");
  return cudaMemsetAsync(dst, value, n, nullptr);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (cap_on && (s == cap.stream || !emu::unsafe_allowed()))
    return emu::refuse("cudaStreamSynchronize(" + emu::stream_name(s) + ")",
                       "a capture records work without running it, so there is nothing to wait for; a host read "
                       "of device memory (to_host, a check of device values) cannot be part of a graph");
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (cap_on) return emu::refuse("cudaDeviceSynchronize", "a capture records work without running it");
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  if (cap_on && !emu::unsafe_allowed())
    return emu::refuse("cudaMalloc", "allocate before the capture, or from a graph pool in relaxed capture mode");
  *p = emu::dev_alloc(n ? n : 1);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (cap_on && !emu::unsafe_allowed())
    return emu::refuse("cudaFree", "free after the capture (a graph may still use the memory)");
  emu::dev_free(p);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) {
    emu::last_capture_error = "emu: cudaStreamBeginCapture on the legacy default stream, which cannot be captured";
    return emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (cap_on) {
    emu::last_capture_error = "emu: cudaStreamBeginCapture while stream " + emu::stream_name(cap.stream) +
                              " already captures (the emulator runs one capture at a time)";
    return emu::fail(cudaErrorIllegalState);
  }
  cap = emu::Capture{};
  cap.stream = s;
  cap.mode = mode;
  cap_on = true;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!cap_on || s != cap.stream) {
    emu::last_capture_error = "emu: cudaStreamEndCapture on stream " + emu::stream_name(s) + ", which is not capturing";
    return emu::fail(cudaErrorIllegalState);
  }
  cap_on = false;
  emu::Capture done = std::move(cap);
  cap = emu::Capture{};
  if (!done.invalidated.empty()) {
    emu::last_capture_error = done.invalidated;
    return emu::fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = reinterpret_cast<cudaGraph_t>(new std::vector<emu::Node>(std::move(done.nodes)));
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = !cap_on || s != cap.stream ? cudaStreamCaptureStatusNone
            : cap.invalidated.empty()  ? cudaStreamCaptureStatusActive
                                       : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, emu::thread_mode);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return emu::fail(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(new std::vector<emu::Node>(*reinterpret_cast<std::vector<emu::Node>*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return emu::fail(cudaErrorInvalidValue);
  if (cap_on) return emu::refuse("cudaGraphLaunch", "graphs inside graphs are not emulated");
  if (!s) {
    emu::last_capture_error = "emu: cudaGraphLaunch on the legacy default stream (use the backend's stream)";
    return emu::fail(cudaErrorInvalidValue);
  }
  ++emu::graph_launch_count;
  for (const emu::Node& n : *reinterpret_cast<std::vector<emu::Node>*>(exec)) n.run();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<std::vector<emu::Node>*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<std::vector<emu::Node>*>(graph);
  return cudaSuccess;
}

// ---- cuBLAS -------------------------------------------------------------------
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emu)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emu)";
    default: return "cuBLAS error (emu)";
  }
}

namespace {
size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : 2; }
double load(const void* p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16BF: return kestrel::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16F: return kestrel::f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}
void store(void* p, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = float(v); return;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; return;
    case CUDA_R_16BF: static_cast<uint16_t*>(p)[i] = kestrel::float_to_bf16(float(v)); return;
    case CUDA_R_16F: static_cast<uint16_t*>(p)[i] = kestrel::float_to_f16(float(v)); return;
  }
}
cublasStatus_t bad(const char* why) {
  std::fprintf(stderr, "emu cublasGemmEx: %s\n", why);
  return CUBLAS_STATUS_INVALID_VALUE;
}
}  // namespace

namespace {
// The GEMM's checks and, with run, its computation (alpha and beta by value: the
// host pointer mode reads them when the call is made, also into a capture).
cublasStatus_t gemm(bool run, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float a, const void* A,
                    cudaDataType_t At, int lda, const void* B, cudaDataType_t Bt, int ldb, float b, void* C,
                    cudaDataType_t Ct, int ldc, cublasComputeType_t ct) {
  if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_PEDANTIC) return CUBLAS_STATUS_NOT_SUPPORTED;
  // COMPUTE_32F with scale type f32: A/B of one type (32F, 16BF, 16F), C of that type or 32F.
  const bool types_ok = At == Bt && (At == CUDA_R_32F || At == CUDA_R_16BF || At == CUDA_R_16F) &&
                        (Ct == At || Ct == CUDA_R_32F);
  if (!types_ok) {
    std::fprintf(stderr, "emu cublasGemmEx: unsupported type combination A %d B %d C %d\n", int(At), int(Bt), int(Ct));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m < 0 || n < 0 || k < 0) return bad("negative dimension");
  if (ta > CUBLAS_OP_T || tb > CUBLAS_OP_T) return bad("op C not emulated");
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k)) return bad("lda too small");
  if (ldb < std::max(1, tb == CUBLAS_OP_N ? k : n)) return bad("ldb too small");
  if (ldc < std::max(1, m)) return bad("ldc too small");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Every element each operand's extent covers must be device memory.
  auto extent = [](int rows, int cols, int ld, cudaDataType_t t) {
    return (size_t(cols - 1) * size_t(ld) + size_t(rows)) * type_size(t);
  };
  if (k > 0) {
    if (!emu::is_device(A, extent(ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, At)))
      return bad("A outside device memory");
    if (!emu::is_device(B, extent(tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, Bt)))
      return bad("B outside device memory");
  }
  if (!emu::is_device(C, extent(m, n, ldc, Ct))) return bad("C outside device memory");
  if (!run) return CUBLAS_STATUS_SUCCESS;
  const emu::DeviceAccess device_access;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double av = load(A, At, ta == CUBLAS_OP_N ? int64_t(i) + int64_t(p) * lda : int64_t(p) + int64_t(i) * lda);
        const double bv = load(B, Bt, tb == CUBLAS_OP_N ? int64_t(p) + int64_t(j) * ldb : int64_t(j) + int64_t(p) * ldb);
        acc += av * bv;
      }
      double r = double(a) * acc;
      if (b != 0.f) r += double(b) * load(C, Ct, int64_t(i) + int64_t(j) * ldc);  // beta == 0: C not read
      store(C, Ct, int64_t(i) + int64_t(j) * ldc, r);
    }
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

// On the handle's stream (the backend binds its one stream): recorded while it captures.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t At, int lda, const void* B,
                            cudaDataType_t Bt, int ldb, const void* beta, void* C, cudaDataType_t Ct, int ldc,
                            cublasComputeType_t ct, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  if (!cap_on) return gemm(true, ta, tb, m, n, k, a, A, At, lda, B, Bt, ldb, b, C, Ct, ldc, ct);
  const cublasStatus_t st = gemm(false, ta, tb, m, n, k, a, A, At, lda, B, Bt, ldb, b, C, Ct, ldc, ct);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  emu::record("cublasGemmEx", [=] {
    if (gemm(true, ta, tb, m, n, k, a, A, At, lda, B, Bt, ldb, b, C, Ct, ldc, ct) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("emu: a replayed cublasGemmEx failed (its memory freed since the capture?)");
  });
  return CUBLAS_STATUS_SUCCESS;
}
