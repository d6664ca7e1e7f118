// Best-of-N timing shared by the kernel benchmarks: wall time and process CPU
// time per thread. On a shared machine the wall time includes time
// descheduled; the CPU time per thread does not.
#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>

namespace kestrel::bench {

inline double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Timing { double wall, cpu; };  // seconds; cpu = process CPU time / threads

// Best of `reps` runs of f after one warm-up call.
template <class F>
Timing time_best(F&& f, int reps, int threads) {
  f();
  Timing best{1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    f();
    best.cpu = std::min(best.cpu, (cpu_seconds() - c0) / threads);
    best.wall = std::min(best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace kestrel::bench
