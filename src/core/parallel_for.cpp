#include "core/parallel_for.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kestrel {

namespace {
// -1: not decided yet (KESTREL_DETERMINISTIC is read on first use).
std::atomic<int> g_deterministic{-1};
}  // namespace

void set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}
int num_threads() { return omp_get_max_threads(); }

void set_deterministic(bool on) { g_deterministic.store(on ? 1 : 0, std::memory_order_relaxed); }

bool deterministic() {
  int v = g_deterministic.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("KESTREL_DETERMINISTIC");
    v = (e && std::strcmp(e, "1") == 0) ? 1 : 0;
    int expected = -1;
    g_deterministic.compare_exchange_strong(expected, v);
    v = g_deterministic.load(std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace kestrel
