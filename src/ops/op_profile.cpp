// Per-op timing (KESTREL_OP_PROFILE=1): see op_profile.h.
#include "ops/op_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kestrel::ops {
namespace {

struct Totals {
  long long calls = 0;
  double seconds = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Totals> by_key;  // "op shapes" -> totals
  ~Registry() {
    // Whatever a program recorded and never reported goes to stderr at exit.
    if (!by_key.empty()) report_locked(stderr, "op profile at exit");
  }
  void report_locked(std::FILE* out, const char* title) {
    std::vector<std::pair<std::string, Totals>> rows(by_key.begin(), by_key.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (const auto& r : rows) total += r.second.seconds;
    std::fprintf(out, "# %s (KESTREL_OP_PROFILE): %.1f ms in %zu op kinds\n", title, total * 1e3, rows.size());
    std::fprintf(out, "# %8s %10s %10s %6s  op and shapes\n", "calls", "total ms", "mean us", "share");
    for (const auto& [key, t] : rows)
      std::fprintf(out, "# %8lld %10.2f %10.1f %5.1f%%  %s\n", t.calls, t.seconds * 1e3, t.seconds * 1e6 / double(t.calls),
                   total > 0 ? 100.0 * t.seconds / total : 0.0, key.c_str());
    std::fflush(out);
    by_key.clear();
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

// The outermost op being timed on this thread (nested dispatches are part of it).
thread_local int tl_depth = 0;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void drain(Device dev) {
#if KESTREL_HAVE_CUDA
  if (dev == Device::CUDA) cuda::synchronize();
#else
  (void)dev;
#endif
}

}  // namespace

std::atomic<int>& profile_state() {  // -1: not read yet; 0 off; 1 on
  static std::atomic<int> state{-1};
  return state;
}

bool op_profile_enabled() {
  int st = profile_state().load(std::memory_order_relaxed);
  if (st < 0) {
    const char* v = std::getenv("KESTREL_OP_PROFILE");
    st = v && *v && std::strcmp(v, "0") != 0 ? 1 : 0;
    int unread = -1;
    if (!profile_state().compare_exchange_strong(unread, st)) st = unread;  // set meanwhile
  }
  return st == 1;
}

void op_profile_set_enabled(bool on) { profile_state().store(on ? 1 : 0); }

void op_profile_reset() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_key.clear();
}

void op_profile_report(std::FILE* out, const char* title) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.report_locked(out, title);
}

namespace detail {

void OpTimer::start(const char* op, Device dev, std::initializer_list<const Tensor*> ts) {
  counted_ = true;
  if (tl_depth++ > 0) return;  // inside another op: counted as part of it
  active_ = true;
  exceptions_ = std::uncaught_exceptions();
  dev_ = dev;
  op_ = op;
  // The first three defined tensors' shapes and the first one's dtype.
  size_t n = 0;
  int shown = 0;
  for (const Tensor* t : ts) {
    if (!t || !t->defined() || shown == 3) continue;
    std::string s = shape_str(t->shape());
    if (shown == 0) s += std::string(" ") + dtype_name(t->dtype());
    const int w = std::snprintf(shapes_ + n, sizeof(shapes_) - n, "%s%s", shown ? " " : "", s.c_str());
    if (w < 0 || size_t(w) >= sizeof(shapes_) - n) break;
    n += size_t(w);
    ++shown;
  }
  drain(dev_);
  t0_ = now_s();
}

void OpTimer::stop() {
  --tl_depth;
  // An op that threw is not timed (and its queue is not drained from a destructor).
  if (!active_ || std::uncaught_exceptions() > exceptions_) return;
  double s = 0;
  try {
    drain(dev_);
    s = now_s() - t0_;
  } catch (...) {
    return;
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Totals& t = r.by_key[std::string(op_) + " " + shapes_];
  ++t.calls;
  t.seconds += s;
}

}  // namespace detail
}  // namespace kestrel::ops
