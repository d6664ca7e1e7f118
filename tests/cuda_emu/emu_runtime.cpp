// The emulator's scheduler (fibers, warp/block barriers, shuffles), device memory
// (an arena closed to host code: PROT_NONE outside the emulator's own accesses)
// and kernel launches; the runtime API, stream capture and cuBLAS are emu_api.cpp's.
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
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

namespace {
// run_launch's work, inside its DeviceAccess. Separate because getcontext returns twice:
// the guard's cleanup in the same function would make GCC fear for the loop's locals.
void run_open(const char* name, long long grid, long long block, const std::function<void()>& body) {
  Sched& s = sched_storage;
  S = &s;
  s.name = name;
  s.body = &body;
  s.n = int(block);
  if (s.f.size() < size_t(block)) s.f.resize(size_t(block));
  // Fiber stacks are host memory (malloc), outside the device arena: they stay usable while it is closed.
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
}
}  // namespace

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
  // Device memory is readable and writable for the launch (the kernel and the guard check after it).
  const DeviceAccess device_access;
  run_open(name, grid, block, body);
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
// On a GPU, device memory is not host memory: host code that dereferences a
// Device::CUDA tensor's pointer segfaults or reads garbage there. So here all
// device memory lives in one reserved arena that is PROT_NONE while host code
// runs; the emulator opens it (DeviceAccess) only while it legitimately touches
// device memory (kernel launches, cudaMemcpy/cudaMemset, cublasGemmEx, the
// poisoning of fresh allocations), and the SIGSEGV handler below turns a host
// touch into a message naming the allocation, plus a backtrace. One arena,
// sub-allocated, rather than an mmap per allocation: opening and closing it is
// one mprotect each over its used part, however many allocations are live.
// The cost is that there are no guard pages (an open arena is read/write as a
// whole), so writes past an allocation's end are still caught by its guard
// bytes (checked after every launch). EMU_HOST_ACCESS=allow keeps it open.
namespace {
constexpr size_t kGuard = 256;
// Freed runs at least this big go back to the kernel (as glibc's malloc unmaps
// big blocks), so holes cost neither memory nor page-table work on each mprotect.
constexpr size_t kReturnBytes = 256 * 1024;
struct Alloc { size_t bytes, total, span; };  // requested; guarded (0xFF, checked); owned (whole pages)

struct Arena {
  char* base = nullptr;
  size_t reserved = 0;
  size_t used = 0;  // [base, base + used) holds every allocation; above it: unpopulated, PROT_NONE
  size_t page = 4096;
  bool protect = true;        // false with EMU_HOST_ACCESS=allow
  std::atomic<int> open{0};   // DeviceAccess depth, process-wide; > 0: [base, base + used) read/write
  std::map<uintptr_t, Alloc> allocs;
  std::map<uintptr_t, size_t> free_by_addr;             // free runs below `used`, coalesced
  std::set<std::pair<size_t, uintptr_t>> free_by_size;  // the same runs, for best fit
};
std::mutex mem_mu;  // the arena's bookkeeping and its protection state
// Set once before the SIGSEGV handler is installed, read by it. Never destroyed:
// device memory may be freed by other objects' destructors at exit.
Arena* arena_ptr = nullptr;
struct sigaction prev_segv;

void say(const char* s) {
  if (write(2, s, std::strlen(s)) < 0) {}  // nothing to do about a failed diagnostic
}

// The backtrace's frames in this executable as function and file:line (addr2line,
// if installed): backtrace_symbols_fd names only exported symbols, and the test
// binaries export none. Called from the SIGSEGV handler just before abort.
void symbolize(void* const* frames, int n) {
  Dl_info self{};
  if (!dladdr(reinterpret_cast<void*>(&symbolize), &self) || !self.dli_fbase) return;
  // A position-independent executable's frames are offsets from its load address.
  const bool pie = static_cast<const Elf64_Ehdr*>(self.dli_fbase)->e_type == ET_DYN;
  static char addrs[64][24], exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);  // here: in addr2line it is addr2line
  if (len <= 0) return;
  exe[len] = 0;
  const char* argv[64 + 8] = {"addr2line", "-C", "-f", "-p", "-i", "-e", exe};
  int argc = 7;
  for (int i = 0; i < n && i < 64; ++i) {
    Dl_info d{};
    if (!dladdr(frames[i], &d) || d.dli_fbase != self.dli_fbase) continue;
    const uintptr_t pc = reinterpret_cast<uintptr_t>(frames[i]) - 1;  // inside the call, not after it
    std::snprintf(addrs[i], sizeof addrs[i], "0x%zx", size_t(pie ? pc - reinterpret_cast<uintptr_t>(d.dli_fbase) : pc));
    argv[argc++] = addrs[i];
  }
  if (argc == 7) return;
  argv[argc] = nullptr;
  say("emu: the frames in this executable:\n");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(2, 1);
    execvp("addr2line", const_cast<char* const*>(argv));
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

void set_access(char* p, size_t n, bool rw) {
  if (n == 0) return;
  if (mprotect(p, n, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    std::fprintf(stderr, "emu: mprotect of emulated device memory failed: %s\n", std::strerror(errno));
    std::abort();  // the protection state would no longer be known
  }
}

// Host code touched the arena (or the emulator went beyond its used part): say
// where and what, with a backtrace, and abort. Anything else goes to the previous
// disposition (the default: a core dump). Not strictly async-signal-safe
// (snprintf, a try_lock): the process is about to abort anyway.
void on_segv(int, siginfo_t* si, void* ctx) {
  const Arena* a = arena_ptr;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(si->si_addr), lo = reinterpret_cast<uintptr_t>(a->base);
  if (si->si_code > 0 && addr >= lo && addr - lo < a->reserved) {
    const char* access = "touched";
#if defined(__x86_64__)
    // The page-fault error code: bit 1 is set for a write.
    access = (static_cast<const ucontext_t*>(ctx)->uc_mcontext.gregs[REG_ERR] & 2) ? "wrote" : "read";
#endif
    // Open: the fault is beyond the open part, so the emulator's own access (a launch, copy or GEMM).
    const bool emulating = a->open.load() > 0;
    char where[160];
    std::snprintf(where, sizeof where, "%s",
                  emulating ? "beyond every live allocation" : "not inside any live allocation: freed device memory?");
    if (mem_mu.try_lock()) {  // not when another thread is changing the bookkeeping
      auto it = a->allocs.upper_bound(addr);
      if (it != a->allocs.begin()) {
        --it;
        const size_t off = addr - it->first;
        if (off < it->second.span)
          std::snprintf(where, sizeof where, "allocation of %zu bytes at +%zu%s", it->second.bytes, off,
                        off >= it->second.bytes ? ", past its end" : "");
      }
      mem_mu.unlock();
    }
    char msg[640];
    if (emulating && S)  // on this thread's fiber: the kernel
      std::snprintf(msg, sizeof msg, "emu: kernel %s block %lld %s unallocated device memory at %p (%s)\n", S->name,
                    S->block, access, si->si_addr, where);
    else if (emulating)
      std::snprintf(msg, sizeof msg,
                    "emu: the emulator %s unallocated device memory at %p (%s): a copy or GEMM out of bounds\n",
                    access, si->si_addr, where);
    else
      std::snprintf(msg, sizeof msg,
                    "emu: host code %s device memory at %p (%s): a CPU pointer dereference of a Device::CUDA "
                    "tensor; on a GPU this segfaults or reads garbage. Read it with to_host()/to_float_vector()/"
                    "copy_from, or run the op on the device (EMU_HOST_ACCESS=allow turns this check off). "
                    "Backtrace:\n", access, si->si_addr, where);
    say(msg);
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
    symbolize(frames, n);
    std::abort();
  }
  sigaction(SIGSEGV, &prev_segv, nullptr);
  if (si->si_code <= 0) raise(SIGSEGV);  // sent by kill/raise: returning would not repeat it
  // else returning re-executes the faulting access under the previous disposition
}

void install_segv_handler() {
  // The handler runs on an alternate stack (for this thread; threads without one
  // use their own stack, which is fine for anything but a stack overflow).
  static char alt[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, nullptr);
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now: its first call allocates, which the handler must not
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &prev_segv);
}

Arena& arena() {
  static Arena* a = [] {
    auto* r = new Arena;
    r->page = size_t(sysconf(_SC_PAGESIZE));
    const char* e = std::getenv("EMU_HOST_ACCESS");
    r->protect = !(e && std::strcmp(e, "allow") == 0);
    r->open = r->protect ? 0 : 1;  // allow: open for good (pages become read/write as they come into use)
    // Address space only (PROT_NONE, MAP_NORESERVE): a page costs memory once written.
    for (size_t n = size_t(1) << 40; n >= (size_t(1) << 32) && !r->base; n /= 2) {
      void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) r->base = static_cast<char*>(p), r->reserved = n;
    }
    if (!r->base) throw std::runtime_error("emu: cannot reserve address space for emulated device memory");
    arena_ptr = r;
    if (r->protect) install_segv_handler();
    return r;
  }();
  return *a;
}

void insert_free(Arena& a, uintptr_t p, size_t n) {
  a.free_by_addr[p] = n;
  a.free_by_size.insert({n, p});
}
void erase_free(Arena& a, std::map<uintptr_t, size_t>::iterator it) {
  a.free_by_size.erase({it->second, it->first});
  a.free_by_addr.erase(it);
}

// A run of `span` bytes (whole pages): the best-fitting free run, else the top of the arena.
char* take(Arena& a, size_t span) {
  auto it = a.free_by_size.lower_bound({span, 0});
  if (it != a.free_by_size.end()) {
    const auto [n, p] = *it;
    erase_free(a, a.free_by_addr.find(p));
    if (n > span) insert_free(a, p + span, n - span);
    return reinterpret_cast<char*>(p);
  }
  if (span > a.reserved - a.used)
    throw std::runtime_error("emu: emulated device memory exhausted (" + std::to_string(a.used) + " bytes in use, " +
                             std::to_string(span) + " more asked)");
  char* p = a.base + a.used;
  if (a.open > 0) set_access(p, span, true);  // the open part is all of [base, base + used)
  a.used += span;
  return p;
}

void give_back(Arena& a, uintptr_t p, size_t n) {
  if (n >= kReturnBytes) madvise(reinterpret_cast<char*>(p), n, MADV_DONTNEED);
  auto next = a.free_by_addr.find(p + n);
  if (next != a.free_by_addr.end()) n += next->second, erase_free(a, next);
  auto prev = a.free_by_addr.lower_bound(p);
  if (prev != a.free_by_addr.begin() && std::prev(prev)->first + std::prev(prev)->second == p) {
    --prev;
    p = prev->first, n += prev->second;
    erase_free(a, prev);
  }
  if (reinterpret_cast<char*>(p + n) == a.base + a.used) {  // the top: back to the reserve
    madvise(reinterpret_cast<char*>(p), n, MADV_DONTNEED);
    if (a.open > 0) set_access(reinterpret_cast<char*>(p), n, false);
    a.used -= n;
    return;
  }
  insert_free(a, p, n);
}

// Called inside run_launch's DeviceAccess.
void check_guards() {
  std::lock_guard<std::mutex> g(mem_mu);
  for (auto& [p, a] : arena().allocs) {
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

DeviceAccess::DeviceAccess() {
  Arena& a = arena();
  std::lock_guard<std::mutex> g(mem_mu);
  if (a.open++ == 0) set_access(a.base, a.used, true);
}
DeviceAccess::~DeviceAccess() {
  Arena& a = arena();
  std::lock_guard<std::mutex> g(mem_mu);
  if (--a.open == 0) set_access(a.base, a.used, false);
}
bool host_access_protected() { return arena().protect; }

void check_alloc_in_capture();  // below, with the capture state

void* dev_alloc(size_t bytes) {
  check_alloc_in_capture();
  Arena& a = arena();
  const size_t total = (bytes + kGuard + 255) / 256 * 256;
  const size_t span = (total + a.page - 1) / a.page * a.page;
  std::lock_guard<std::mutex> g(mem_mu);
  char* p = take(a, span);
  // Poisoned, so a missing write is never hidden by stale data; opened just for that
  // (not the whole arena) when closed. Under mem_mu: no DeviceAccess changes it meanwhile.
  const bool closed = a.open == 0;
  if (closed) set_access(p, span, true);
  std::memset(p, 0xFF, total);
  if (closed) set_access(p, span, false);
  a.allocs[reinterpret_cast<uintptr_t>(p)] = {bytes, total, span};
  return p;
}
void dev_free(void* p) {
  if (!p) return;
  Arena& a = arena();
  std::lock_guard<std::mutex> g(mem_mu);
  auto it = a.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == a.allocs.end()) {
    std::fprintf(stderr, "emu: dev_free(%p): not a live device allocation (double free?)\n", p);
    std::abort();
  }
  const size_t span = it->second.span;
  a.allocs.erase(it);
  give_back(a, reinterpret_cast<uintptr_t>(p), span);
}
bool is_device(const void* p, size_t n) {
  Arena& a = arena();
  std::lock_guard<std::mutex> g(mem_mu);
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = a.allocs.upper_bound(u);
  if (it == a.allocs.begin()) return false;
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
