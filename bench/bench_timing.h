// Best-of-N timing shared by the kernel benchmarks: wall time and process CPU
// time per thread. On a shared machine the wall time includes time
// descheduled; the CPU time per thread does not. And the machine header every
// benchmark prints, so that a number always comes with what produced it.
#pragma once
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "backend/cpu/gemm.h"
#include "core/cpu_features.h"

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

// The three facts a benchmark number depends on, one line each:
//   cpu:  Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167), ISA avx512 (...)
//   isa:  avx512 (the width Kestrel's own kernels run at, KESTREL_ISA)
//   gemm: the GEMM library line (KESTREL_BLAS / auto choice), thread count
// The GEMM choice is made here if it was not yet (it may run the one-time
// micro-benchmark, before any timing starts).
struct MachineInfo {
  std::string cpu, isa, gemm;
  int threads;
};
inline MachineInfo machine_info() {
  return {kestrel::cpu_summary(), kestrel::isa_name(kestrel::kernel_isa()), kestrel::cpu::gemm_summary(),
          omp_get_max_threads()};
}

// Markdown-friendly header lines, prefixed by `prefix` ("# " or "").
inline void print_machine_header(const char* prefix = "", FILE* out = stdout) {
  const MachineInfo m = machine_info();
  std::fprintf(out, "%scpu: %s\n%sisa: %s (Kestrel kernels)\n%sgemm: %s\n%sthreads: %d\n", prefix, m.cpu.c_str(),
               prefix, m.isa.c_str(), prefix, m.gemm.c_str(), prefix, m.threads);
}

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o;
}

// `"cpu": "...", "isa": "...", "gemm": "..."` for a JSON line (no braces, no trailing comma).
inline std::string machine_json_fields() {
  const MachineInfo m = machine_info();
  return "\"cpu\": \"" + json_escape(m.cpu) + "\", \"isa\": \"" + json_escape(m.isa) + "\", \"gemm\": \"" +
         json_escape(m.gemm) + "\"";
}

}  // namespace kestrel::bench
