// The emulator's scheduler (fibers, warp/block barriers, shuffles), device memory,
// the CUDA runtime API subset and cublasGemmEx.
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

#include "core/dtype.h"
#include "cublas_v2.h"
#include "emu.h"

namespace emu {
namespace {

enum class St : uint8_t { Run, Warp, Block, Done };
enum Kind : int { kSyncwarp = 100 };

struct Fiber {
  ucontext_t ctx;
  St st = St::Run;
  Site site;
  int kind = 0;  // at a warp point: 0 = syncwarp, else shuffle type code
  unsigned mask = 0;
  uint64_t val = 0, out = 0;
  int src = 0;
  char* stack = nullptr;
};

constexpr size_t kStack = 256 * 1024;

struct Sched {
  ucontext_t main;
  std::vector<Fiber> f;
  int cur = -1;
  int n = 0;
  const std::function<void()>* body = nullptr;
  std::string error;
  const char* name = "";
  long long block = 0;
};
thread_local Sched* S = nullptr;
thread_local Sched sched_storage;

std::string where(const Site& s) { return std::string(s.file_name()) + ":" + std::to_string(s.line()); }

void fail(const std::string& msg) {
  Sched* s = S;
  if (s->error.empty())
    s->error = std::string("emu: kernel ") + s->name + " block " + std::to_string(s->block) + ": " + msg;
}

void trampoline() {
  Sched* s = S;
  try {
    (*s->body)();
  } catch (const std::exception& e) {
    fail(std::string("exception in device code: ") + e.what());
  } catch (...) {
    fail("unknown exception in device code");
  }
  s->f[s->cur].st = St::Done;
  swapcontext(&s->f[s->cur].ctx, &s->main);
  std::abort();  // never resumed
}

void yield(St st) {
  Sched* s = S;
  Fiber& me = s->f[s->cur];
  me.st = st;
  swapcontext(&me.ctx, &s->main);
}

std::map<std::string, long> launch_counts;
std::mutex launch_mu;
bool reverse_order() {
  static const bool r = [] {
    const char* e = std::getenv("EMU_REVERSE");
    return e && e[0] == '1';
  }();
  return r;
}

// Releases warp w if every non-exited lane waits at a warp point; returns whether it did.
bool try_release_warp(Sched& s, int w) {
  const int base = w * 32;
  int waiting = 0, done = 0, first = -1;
  for (int l = 0; l < 32; ++l) {
    const St st = s.f[base + l].st;
    if (st == St::Warp) {
      ++waiting;
      if (first < 0) first = base + l;
    } else if (st == St::Done) {
      ++done;
    }
  }
  if (waiting == 0 || waiting + done != 32) return false;
  const Fiber& f0 = s.f[first];
  for (int l = 0; l < 32; ++l) {
    const Fiber& fl = s.f[base + l];
    if (fl.st != St::Warp) continue;
    if (fl.kind != f0.kind || fl.site.line() != f0.site.line() ||
        std::strcmp(fl.site.file_name(), f0.site.file_name()) != 0 || fl.mask != f0.mask) {
      fail("divergent warp sync in warp " + std::to_string(w) + ": lane " + std::to_string(first - base) + " at " +
           where(f0.site) + (f0.kind == kSyncwarp ? " (__syncwarp)" : " (shuffle)") + ", lane " + std::to_string(l) +
           " at " + where(fl.site) + (fl.kind == kSyncwarp ? " (__syncwarp)" : " (shuffle)"));
      return false;
    }
  }
  if (f0.kind != kSyncwarp && done > 0 && f0.mask == 0xffffffffu)
    fail("full-mask shuffle at " + where(f0.site) + " in warp " + std::to_string(w) + " with " + std::to_string(done) +
         " exited lane(s) (undefined behaviour)");
  if (f0.kind != kSyncwarp) {
    for (int l = 0; l < 32; ++l) {
      Fiber& fl = s.f[base + l];
      if (fl.st != St::Warp) continue;
      const Fiber& src = s.f[base + fl.src];
      if (src.st != St::Warp) {
        fail("shuffle at " + where(fl.site) + ": lane " + std::to_string(l) + " reads exited lane " +
             std::to_string(fl.src));
        fl.out = 0x7fc00000u;
      } else {
        fl.out = src.val;
      }
    }
  }
  for (int l = 0; l < 32; ++l)
    if (s.f[base + l].st == St::Warp) s.f[base + l].st = St::Run;
  return true;
}

bool try_release_block(Sched& s) {
  int waiting = 0, first = -1;
  for (int t = 0; t < s.n; ++t) {
    if (s.f[t].st == St::Block) {
      ++waiting;
      if (first < 0) first = t;
    } else if (s.f[t].st != St::Done) {
      return false;
    }
  }
  if (waiting == 0) return false;
  for (int t = 0; t < s.n; ++t) {
    const Fiber& ft = s.f[t];
    if (ft.st == St::Block && (ft.site.line() != s.f[first].site.line())) {
      fail("__syncthreads at different sites: thread " + std::to_string(first) + " at " + where(s.f[first].site) +
           ", thread " + std::to_string(t) + " at " + where(ft.site));
      return false;
    }
  }
  for (int t = 0; t < s.n; ++t)
    if (s.f[t].st == St::Block) s.f[t].st = St::Run;
  return true;
}

std::string describe_states(const Sched& s) {
  std::string r;
  int shown = 0;
  for (int t = 0; t < s.n && shown < 8; ++t) {
    const Fiber& f = s.f[t];
    if (f.st == St::Done) continue;
    r += " [t" + std::to_string(t) + (f.st == St::Warp ? " warp-sync at " : " __syncthreads at ") + where(f.site) + "]";
    ++shown;
  }
  return r;
}

void check_guards();

}  // namespace
namespace { thread_local long block_serial = 0; }

void run_launch(const char* name, long long grid, long long block, const std::function<void()>& body,
                const std::vector<std::pair<int, const void*>>& ptr_args) {
  if (grid <= 0 || grid > 2147483647LL || block <= 0 || block > 1024)
    throw std::runtime_error(std::string("emu: bad launch configuration for ") + name + ": grid " +
                             std::to_string(grid) + " block " + std::to_string(block));
  if (block % 32 != 0)
    throw std::runtime_error(std::string("emu: block size not a multiple of 32 for ") + name);
  for (auto& [i, p] : ptr_args)
    if (p && !is_device(p))
      throw std::runtime_error(std::string("emu: kernel ") + name + " argument " + std::to_string(i) +
                               " is a pointer outside emulated device memory");
  {
    std::lock_guard<std::mutex> g(launch_mu);
    ++launch_counts[name];
  }
  Sched& s = sched_storage;
  S = &s;
  s.name = name;
  s.body = &body;
  s.n = int(block);
  if (s.f.size() < size_t(block)) s.f.resize(size_t(block));
  for (auto& f : s.f)
    if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStack));
  gridDim = {unsigned(grid), 1, 1};
  blockDim = {unsigned(block), 1, 1};
  const bool rev = reverse_order();
  for (long long b = 0; b < grid && s.error.empty(); ++b) {
    s.block = b;
    ++block_serial;
    blockIdx = {unsigned(b), 1, 1};
    for (int t = 0; t < s.n; ++t) {
      Fiber& f = s.f[t];
      f.st = St::Run;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack;
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, trampoline, 0);
    }
    for (;;) {
      for (int k = 0; k < s.n && s.error.empty(); ++k) {
        const int t = rev ? s.n - 1 - k : k;
        if (s.f[t].st != St::Run) continue;
        s.cur = t;
        threadIdx = {unsigned(t), 1, 1};
        swapcontext(&s.main, &s.f[t].ctx);
      }
      if (!s.error.empty()) break;
      bool released = false, all_done = true;
      for (int t = 0; t < s.n; ++t)
        if (s.f[t].st != St::Done) all_done = false;
      if (all_done) break;
      for (int w = 0; w < s.n / 32; ++w) released |= try_release_warp(s, w);
      if (!s.error.empty()) break;
      if (!released) released = try_release_block(s);
      if (!s.error.empty()) break;
      if (!released) {
        fail("deadlock:" + describe_states(s));
        break;
      }
    }
  }
  S = nullptr;
  if (!s.error.empty()) {
    std::string e = s.error;
    s.error.clear();
    std::fprintf(stderr, "%s\n", e.c_str());
    throw std::runtime_error(e);
  }
  check_guards();
  (void)name;
}

namespace {
thread_local std::map<void*, long> poisoned_in;
}  // namespace
void shared_poison(void* p, size_t n) {
  long& b = poisoned_in[p];
  if (b != block_serial) {
    std::memset(p, 0xFF, n);
    b = block_serial;
  }
}

void syncthreads(Site site) {
  Fiber& me = S->f[S->cur];
  me.site = site;
  yield(St::Block);
}

void syncwarp(unsigned mask, Site site) {
  Fiber& me = S->f[S->cur];
  me.site = site;
  me.kind = kSyncwarp;
  me.mask = mask;
  yield(St::Warp);
}

uint64_t shfl(unsigned mask, uint64_t bits, int typ, int lane_arg, bool is_xor, int width, Site site) {
  Sched* s = S;
  Fiber& me = s->f[s->cur];
  if (width != 32) fail("shuffle width != 32 not emulated at " + where(site));
  const int lane = s->cur & 31;
  me.site = site;
  me.kind = typ;
  me.mask = mask;
  me.val = bits;
  me.src = is_xor ? (lane ^ lane_arg) & 31 : (lane_arg & 31);
  if (is_xor && (lane ^ lane_arg) > 31) fail("xor shuffle partner outside the warp at " + where(site));
  yield(St::Warp);
  return s->f[s->cur].out;
}

// ---- device memory -------------------------------------------------------
namespace {
constexpr size_t kGuard = 256;
struct Alloc { size_t bytes, total; };
std::mutex mem_mu;
std::map<uintptr_t, Alloc> allocs;
void check_guards() {
  std::lock_guard<std::mutex> g(mem_mu);
  for (auto& [p, a] : allocs) {
    const unsigned char* c = reinterpret_cast<const unsigned char*>(p);
    for (size_t i = a.bytes; i < a.total; ++i)
      if (c[i] != 0xFF) {
        const std::string e = "emu: write past the end of a device allocation of " + std::to_string(a.bytes) +
                              " bytes (byte " + std::to_string(i) + ") after a kernel launch";
        std::fprintf(stderr, "%s\n", e.c_str());
        std::memset(const_cast<unsigned char*>(c) + a.bytes, 0xFF, a.total - a.bytes);
        throw std::runtime_error(e);
      }
  }
}
}  // namespace

void* dev_alloc(size_t bytes) {
  const size_t total = (bytes + kGuard + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, total);
  std::memset(p, 0xFF, total);
  std::lock_guard<std::mutex> g(mem_mu);
  allocs[reinterpret_cast<uintptr_t>(p)] = {bytes, total};
  return p;
}
void dev_free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> g(mem_mu);
    allocs.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}
bool is_device(const void* p, size_t n) {
  std::lock_guard<std::mutex> g(mem_mu);
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = allocs.upper_bound(u);
  if (it == allocs.begin()) return false;
  --it;
  // pointers one past the end of an allocation (empty views) count as device pointers
  return u >= it->first && u + (n ? n : 0) <= it->first + it->second.total;
}

struct Report {
  ~Report() {
    if (const char* f = std::getenv("EMU_LAUNCH_REPORT")) {
      if (FILE* o = std::fopen(f, "w")) {
        for (auto& [k, v] : launch_counts) std::fprintf(o, "%s %ld\n", k.c_str(), v);
        std::fclose(o);
      }
    }
  }
} report;

}  // namespace emu

// ---- runtime API ------------------------------------------------------------
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument (emu)" : "emu error";
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
  if (n == 0) return cudaSuccess;
  const bool dd = emu::is_device(dst, n), sd = emu::is_device(src, n);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    default: break;
  }
  if (!ok) {
    std::fprintf(stderr, "emu: cudaMemcpyAsync kind %d with dst %s, src %s (%zu bytes)\n", int(kind),
                 dd ? "device" : "host/out of range", sd ? "device" : "host/out of range", n);
    return cudaErrorInvalidValue;
  }
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t) {
  if (n == 0) return cudaSuccess;
  if (!emu::is_device(dst, n)) {
    std::fprintf(stderr, "emu: cudaMemsetAsync on memory outside device allocations (%zu bytes)\n", n);
    return cudaErrorInvalidValue;
  }
  std::memset(dst, value, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t n) { return cudaMemsetAsync(dst, value, n, nullptr); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

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

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t At, int lda, const void* B,
                            cudaDataType_t Bt, int ldb, const void* beta, void* C, cudaDataType_t Ct, int ldc,
                            cublasComputeType_t ct, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
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
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
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
