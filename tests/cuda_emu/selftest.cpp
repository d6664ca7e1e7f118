// Self-test of the emulator's warp semantics and diagnostics (no Kestrel code).
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>
#include "cublas_v2.h"
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
__global__ void add_one(float* x) { x[blockIdx.x * blockDim.x + threadIdx.x] += 1.f; }
__global__ void far_write(float* out, long n) { if (threadIdx.x == 0) out[n] = 1.f; }

// Child modes (run by host_access_check through fork + exec of this binary). Not
// inlined, so the backtrace of a host touch names it even without debug info.
__attribute__((noinline)) int child(const std::string& mode) {
  float* d = static_cast<float*>(emu::dev_alloc(1000 * sizeof(float)));
  cudaMemset(d, 0, 1000 * sizeof(float));
  if (mode == "--host-read") {
    volatile float* v = d;
    std::printf("read %g\n", double(v[100]));  // a host read of device memory
  } else if (mode == "--host-write") {
    volatile float* v = d;
    v[1003] = 1.f;  // past the end, inside the allocation's guard bytes
  } else if (mode == "--kernel-far") {  // a kernel writing far beyond every allocation
    emu::launch("far_write", 1, 32, [&](auto&&... a) { far_write(a...); }, d, 64L << 20);
  } else if (mode == "--null-read") {
    volatile float* v = nullptr;
    std::printf("read %g\n", double(v[1]));  // an ordinary fault: not the emulator's business
  }
  emu::dev_free(d);
  return 0;
}

// Runs this binary in `mode` (with EMU_HOST_ACCESS=allow if `allow`); returns its wait
// status and its stderr.
std::pair<int, std::string> run_child(const char* self, const char* mode, bool allow) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    if (FILE* null = std::fopen("/dev/null", "w")) dup2(fileno(null), 1);
    close(fds[0]);
    close(fds[1]);
    const rlimit no_core{0, 0};  // the deaths are expected: no core files
    setrlimit(RLIMIT_CORE, &no_core);
    if (allow) setenv("EMU_HOST_ACCESS", "allow", 1);
    else unsetenv("EMU_HOST_ACCESS");
    execl(self, self, mode, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {status, err};
}

// A host touch of device memory aborts with the message (and a backtrace); an
// ordinary fault still dies of SIGSEGV; EMU_HOST_ACCESS=allow lets the touch through.
int host_access_check(const char* self) {
  int bad = 0;
  auto expect = [&](const char* mode, bool allow, int sig, std::vector<const char*> needles) {
    const auto [st, err] = run_child(self, mode, allow);
    bool ok = sig ? WIFSIGNALED(st) && WTERMSIG(st) == sig : WIFEXITED(st) && WEXITSTATUS(st) == 0;
    for (const char* n : needles) ok = ok && err.find(n) != std::string::npos;
    if (!ok) {
      std::printf("NOT AS EXPECTED: %s%s (status %d): %s\n", mode, allow ? " with EMU_HOST_ACCESS=allow" : "", st,
                  err.c_str());
      ++bad;
    } else {
      std::printf("%s%s: as expected\n", mode, allow ? " with EMU_HOST_ACCESS=allow" : "");
    }
  };
  std::vector<const char*> read_says = {"emu: host code read device memory at ", "(allocation of 4000 bytes at +400)",
                                        "a CPU pointer dereference of a Device::CUDA tensor", "Backtrace:"};
  if (std::system("command -v addr2line >/dev/null 2>&1") == 0)
    read_says.push_back("child(std::");  // the symbolized backtrace names the culprit
  expect("--host-read", false, SIGABRT, read_says);
  expect("--host-write", false, SIGABRT, {"emu: host code wrote device memory at ", "+4012, past its end"});
  expect("--kernel-far", false, SIGABRT,
         {"emu: kernel far_write block 0 wrote unallocated device memory at ", "beyond every live allocation"});
  expect("--null-read", false, SIGSEGV, {});
  expect("--host-read", true, 0, {});
  return bad;
}

// Stream capture: work recorded, not run; the graph replays it in order; CUDA's
// capture rules enforced (each refused call names itself and invalidates the capture).
int capture_check() {
  int bad = 0;
  auto fail = [&](const std::string& what) { std::printf("capture: %s\n", what.c_str()); ++bad; };
  int stream_storage = 0;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(&stream_storage);
  float* x = static_cast<float*>(emu::dev_alloc(64 * sizeof(float)));
  float* y = static_cast<float*>(emu::dev_alloc(64 * sizeof(float)));
  float* c = static_cast<float*>(emu::dev_alloc(4 * sizeof(float)));
  std::vector<float> h(64, 1.f), back(64);
  cudaMemcpy(x, h.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
  const float one = 1.f, zero = 0.f;
  int handle = 0;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) fail("begin refused");
  cudaStreamCaptureStatus st;
  cudaStreamIsCapturing(s, &st);
  if (st != cudaStreamCaptureStatusActive) fail("not capturing after begin");
  emu::launch_on("add_one", 1, 64, s, [](auto&&... a) { add_one(a...); }, x);   // x += 1
  cudaMemcpyAsync(y, x, 64 * sizeof(float), cudaMemcpyDeviceToDevice, s);       // y = x
  cudaMemsetAsync(x + 32, 0, 32 * sizeof(float), s);                           // x[32:] = 0
  // c (1x1) = x[0:2] . y[0:2]
  cublasGemmEx(reinterpret_cast<cublasHandle_t>(&handle), CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 2, &one, x, CUDA_R_32F, 2,
               y, CUDA_R_32F, 2, &zero, c, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || !g) fail("end failed");
  cudaMemcpy(back.data(), x, 64 * sizeof(float), cudaMemcpyDeviceToHost);
  if (back[0] != 1.f || back[40] != 1.f) fail("captured work ran during the capture");
  cudaGraphExec_t ex = nullptr;
  cudaGraphInstantiate(&ex, g, 0);
  const long before = emu::graph_launches();
  for (int r = 0; r < 2; ++r) cudaGraphLaunch(ex, s);
  if (emu::graph_launches() != before + 2) fail("graph launches not counted");
  cudaMemcpy(back.data(), x, 64 * sizeof(float), cudaMemcpyDeviceToHost);
  float cv = 0;
  cudaMemcpy(&cv, c, sizeof(float), cudaMemcpyDeviceToHost);
  // Replay 1: x[:32] = 2, y = 2 (x[32:] was 1 when copied, then zeroed); replay 2: x[:32] = 3, y[:32] = 3.
  if (back[0] != 3.f || back[40] != 0.f) fail("replays did not rerun the launch and memset in order");
  if (cv != 18.f) fail("replayed GEMM gave " + std::to_string(cv) + ", want 18");
  std::printf("capture: recorded launch, copy, memset and GEMM replayed twice\n");

  // Each refused call: its error, the capture invalidated, the message naming the call.
  auto refused = [&](const char* what, auto fn, cudaError_t want) {
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaError_t e = cudaSuccess;
    bool threw = false;
    try {
      e = fn();
    } catch (const std::exception& ex) {
      threw = true;
    }
    cudaGraph_t gg = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &gg);
    const std::string msg = cudaGetErrorString(end);
    if ((!threw && e != want) || end != cudaErrorStreamCaptureInvalidated || gg)
      fail(std::string(what) + ": not refused (error " + std::to_string(int(e)) + ", end " + std::to_string(int(end)) + ")");
    else
      std::printf("capture: refused %s: %s\n", what, msg.c_str());
  };
  std::vector<float> hh(4);
  refused("cudaStreamSynchronize", [&] { return cudaStreamSynchronize(s); }, cudaErrorStreamCaptureUnsupported);
  refused("device-to-host copy", [&] { return cudaMemcpyAsync(hh.data(), x, 16, cudaMemcpyDeviceToHost, s); },
          cudaErrorStreamCaptureUnsupported);
  refused("host-to-device copy", [&] { return cudaMemcpyAsync(x, hh.data(), 16, cudaMemcpyHostToDevice, s); },
          cudaErrorStreamCaptureUnsupported);
  refused("cudaMemcpy", [&] { return cudaMemcpy(y, x, 16, cudaMemcpyDeviceToDevice); }, cudaErrorStreamCaptureUnsupported);
  refused("cudaMalloc", [&] { void* p; return cudaMalloc(&p, 16); }, cudaErrorStreamCaptureUnsupported);
  refused("dev_alloc", [&] { emu::dev_alloc(16); return cudaSuccess; }, cudaSuccess);
  refused("cudaFree", [&] { return cudaFree(c); }, cudaErrorStreamCaptureUnsupported);
  refused("legacy-stream launch", [&] { emu::launch("add_one", 1, 64, [](auto&&... a) { add_one(a...); }, x); return cudaSuccess; },
          cudaSuccess);
  refused("legacy-stream copy", [&] { return cudaMemcpyAsync(y, x, 16, cudaMemcpyDeviceToDevice, nullptr); },
          cudaErrorStreamCaptureImplicit);
  {  // Relaxed mode (a graph pool's allocation): allowed, the capture stays valid.
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, 16);
    cudaThreadExchangeStreamCaptureMode(&m);
    cudaGraph_t gg = nullptr;
    if (e != cudaSuccess || cudaStreamEndCapture(s, &gg) != cudaSuccess) fail("relaxed-mode cudaMalloc refused");
    cudaGraphDestroy(gg);
    cudaFree(p);
  }
  if (cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) != cudaErrorStreamCaptureUnsupported)
    fail("capture of the legacy stream allowed");
  // Memory a graph uses, freed before its replay: the replay fails instead of writing freed memory.
  float* z = static_cast<float*>(emu::dev_alloc(64 * sizeof(float)));
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  emu::launch_on("add_one", 1, 64, s, [](auto&&... a) { add_one(a...); }, z);
  cudaGraph_t gz = nullptr;
  cudaStreamEndCapture(s, &gz);
  cudaGraphExec_t exz = nullptr;
  cudaGraphInstantiate(&exz, gz, 0);
  emu::dev_free(z);
  try {
    cudaGraphLaunch(exz, s);
    fail("replay over freed memory not detected");
  } catch (const std::exception& e) {
    std::printf("capture: replay over freed memory detected\n");
  }
  cudaGraphExecDestroy(exz);
  cudaGraphDestroy(gz);
  cudaGraphExecDestroy(ex);
  cudaGraphDestroy(g);
  emu::dev_free(x);
  emu::dev_free(y);
  emu::dev_free(c);
  return bad;
}

int main(int argc, char** argv) {
  if (argc > 1) return child(argv[1]);
  int bad = 0;
  float* out = static_cast<float*>(emu::dev_alloc(4 * 1024));
  double* dout = static_cast<double*>(emu::dev_alloc(8 * 1024));
  emu::launch("varied", 2, 128, [&](auto&&... a) { varied(a...); }, out, dout);
  // Host code reads device memory through cudaMemcpy, as on a GPU (a direct read would abort).
  std::vector<float> hout(1024);
  std::vector<double> hdout(1024);
  cudaMemcpy(hout.data(), out, 4 * 1024, cudaMemcpyDeviceToHost);
  cudaMemcpy(hdout.data(), dout, 8 * 1024, cudaMemcpyDeviceToHost);
  for (int b = 0; b < 2; ++b) {
    float want = 0;
    for (int w = 0; w < 3; ++w) for (int it = 0; it < w + 1 + b; ++it) want += 32.f * 15.5f + 32.f * it;
    for (int t = 0; t < 128; ++t) {
      const int w = t >> 5;
      if (w == 3) { if (!std::isnan(hout[b * 128 + t])) { std::printf("warp 3 wrote\n"); ++bad; } continue; }
      if (hout[b * 128 + t] != want) { std::printf("varied b%d t%d: %g want %g\n", b, t, hout[b*128+t], want); ++bad; break; }
      if (hdout[b * 128 + t] != 496.0 * (w + 1 + b)) { std::printf("double shfl wrong\n"); ++bad; break; }
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
  {  // Copies both ways, memset, a launch and a GEMM with device memory closed to host code.
    if (!emu::host_access_protected()) std::printf("note: EMU_HOST_ACCESS=allow, device memory is open\n");
    std::vector<float> h(256), back(256);
    for (int i = 0; i < 256; ++i) h[size_t(i)] = float(i);
    float* x = static_cast<float*>(emu::dev_alloc(256 * sizeof(float)));
    float* y = static_cast<float*>(emu::dev_alloc(256 * sizeof(float)));
    cudaMemcpy(x, h.data(), 256 * sizeof(float), cudaMemcpyHostToDevice);
    emu::launch("add_one", 4, 64, [&](auto&&... a) { add_one(a...); }, x);
    cudaMemcpy(y, x, 256 * sizeof(float), cudaMemcpyDeviceToDevice);
    cudaMemcpy(back.data(), y, 256 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 256; ++i)
      if (back[size_t(i)] != float(i) + 1.f) { std::printf("copy/launch round trip wrong at %d\n", i); ++bad; break; }
    cudaMemset(y, 0, 256 * sizeof(float));
    cudaMemcpy(back.data(), y, 256 * sizeof(float), cudaMemcpyDeviceToHost);
    if (back[7] != 0.f) { std::printf("cudaMemset wrong\n"); ++bad; }
    // C (2x2) = A (2x3) B (3x2), column-major, from x = 1..256: A = [1 3 5; 2 4 6], B = [7 10; 8 11; 9 12].
    const float one = 1.f, zero = 0.f;
    int dummy = 0;
    const auto st = cublasGemmEx(reinterpret_cast<cublasHandle_t>(&dummy), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x,
                                 CUDA_R_32F, 2, x + 6, CUDA_R_32F, 3, &zero, y, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(back.data(), y, 4 * sizeof(float), cudaMemcpyDeviceToHost);
    if (st != CUBLAS_STATUS_SUCCESS || back[0] != 76.f || back[1] != 100.f || back[2] != 103.f || back[3] != 136.f) {
      std::printf("cublasGemmEx wrong: %g %g %g %g\n", back[0], back[1], back[2], back[3]);
      ++bad;
    }
    emu::dev_free(x);
    emu::dev_free(y);
  }
  bad += capture_check();
  bad += host_access_check(argv[0]);
  std::printf(bad ? "SELFTEST FAILED (%d)\n" : "SELFTEST OK\n", bad);
  return bad != 0;
}
