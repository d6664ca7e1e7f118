// GEMM throughput on this machine, printed as markdown tables:
//  1. FP32 FMA peak per core and for 2 cores, from a register-blocked FMA loop
//     (AVX-512 zmm and AVX2 ymm: Zen 4 runs 512-bit FMAs as two 256-bit halves).
//  2. The GEMMs of one training step of the "small" model (hidden 512, 8 heads,
//     2 KV heads of 64, ffn 1536, vocab 8192, T = 2048 tokens per micro-batch):
//     forward x @ W^T and both backward GEMMs (dX = dY @ W, dW = dY^T @ X) of
//     every linear, and rollout prefill/decode rows (M = 32..256), at 1 and 2
//     threads, through kestrel::cpu::sgemm routed to each GEMM library it can
//     load (OpenBLAS, BLIS, oneDNN), then to the process's own choice.
//  3. A GEMM -> OpenMP-elementwise hand-off loop (what a training step does),
//     per library (all of them run on the one OpenMP team here).
// Times are the best of --reps runs of wall-clock time. Usage:
//   bench_gemm_bench [--reps N] [--quick] [--cpu-time]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "bench_timing.h"

namespace {

// --cpu-time: process CPU seconds divided by the thread count in use, i.e. the
// wall time the work would take if its threads were never descheduled. On a
// shared, oversubscribed machine this is the stable measure (time spent
// spin-waiting still counts, so a BLAS whose threads spin is still charged).
bool g_cpu_time = false;
int g_threads_now = 1;
double now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec)) / g_threads_now;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- FMA peak
// 16 independent accumulators cover FMA latency (4 cycles) x 2 pipes with room to spare.
__attribute__((target("avx512f"))) float fma_loop_zmm(int64_t iters) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_ps(float(j) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}
__attribute__((target("avx2,fma"))) float fma_loop_ymm(int64_t iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(float(j) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

volatile float g_sink;

// GFLOP/s of `threads` copies of the loop running at once (best of reps).
double fma_peak(bool zmm, int threads, int reps) {
  const int64_t iters = 20'000'000;
  const double flops_per_thread = double(iters) * (zmm ? 16 * 16 : 12 * 8) * 2;
  double best = 1e30;
  g_threads_now = threads;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      const float s = zmm ? fma_loop_zmm(iters) : fma_loop_ymm(iters);
      if (s == 12345.f) g_sink = s;
    }
    best = std::min(best, now() - t0);
  }
  return flops_per_thread * threads / best * 1e-9;
}

// ---------------------------------------------------------------- GEMM libraries
// Every library kestrel::cpu can load (OpenBLAS with its core checked against
// the CPU, BLIS, oneDNN), each through kestrel::cpu::sgemm with all GEMMs
// routed to it, then the process's own choice (KESTREL_BLAS / auto) last.
struct Backend {
  std::string name;
  std::function<void()> select;  // routes kestrel::cpu::sgemm to this back end
};

std::vector<Backend> load_backends() {
  std::vector<Backend> out;
  for (kestrel::cpu::GemmProvider p : kestrel::cpu::available_gemm_providers()) {
    kestrel::cpu::use_gemm_provider(p);
    std::string title = kestrel::cpu::gemm_summary();
    title = title.substr(0, title.find(", "));  // library and core, without threads/how
    out.push_back({title, [p] { kestrel::cpu::use_gemm_provider(p); }});
  }
  out.push_back({"auto/KESTREL_BLAS choice", [] { kestrel::cpu::use_default_gemm(); }});
  return out;
}

void gemm_call(const Backend& b, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc) {
  (void)b;  // selected by b.select() before the timing loop
  kestrel::cpu::sgemm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
}

void set_threads(const Backend& b, int n) {
  b.select();
  omp_set_num_threads(n);  // sgemm hands the count to the library itself
  g_threads_now = n;
}

// ---------------------------------------------------------------- training-step GEMMs
struct Linear {
  const char* name;
  int64_t in, out;
  bool fused;  // a fused alternative to separate rows above it, or a decode row: not in the step total
};
struct Gemm {
  std::string label;
  bool ta, tb;
  int64_t M, N, K;
  bool fused;
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

std::vector<Gemm> step_gemms(int64_t T) {
  const Linear linears[] = {{"q", 512, 512, false},          {"k", 512, 128, false},
                            {"v", 512, 128, false},          {"o", 512, 512, false},
                            {"gate", 512, 1536, false},      {"up", 512, 1536, false},
                            {"down", 1536, 512, false},      {"lm_head", 512, 8192, false},
                            {"qkv (fused)", 512, 768, true}, {"gate_up (fused)", 512, 3072, true}};
  std::vector<Gemm> g;
  for (const auto& l : linears) {
    const std::string shape = std::to_string(l.in) + "->" + std::to_string(l.out);
    // y[T,out] = x[T,in] @ W[out,in]^T
    g.push_back({std::string(l.name) + " " + shape + " fwd", false, true, T, l.out, l.in, l.fused});
    // dx[T,in] = dy[T,out] @ W[out,in]
    g.push_back({std::string(l.name) + " " + shape + " dX", false, false, T, l.in, l.out, l.fused});
    // dW[out,in] = dy^T @ x
    g.push_back({std::string(l.name) + " " + shape + " dW", true, false, l.out, l.in, T, l.fused});
  }
  // Rollout prefill / batched decode: M rows through the MLP's gate/up (not in the step total).
  for (int64_t m : {32, 64, 128, 256})
    g.push_back({"decode " + std::to_string(m) + " rows, 512->1536 fwd", false, true, m, 1536, 512, true});
  return g;
}

double time_gemm(const Backend& b, const Gemm& g, const std::vector<float>& A, const std::vector<float>& B,
                 std::vector<float>& C, int reps) {
  const int64_t lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
  gemm_call(b, g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, C.data(), g.N);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    gemm_call(b, g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, C.data(), g.N);
    best = std::min(best, now() - t0);
  }
  return best;
}

// Largest |difference| between two backends' results for one shape (sanity: same math).
double max_diff(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

// One "layer step" of hand-offs: GEMM (gate fwd), then an OpenMP elementwise pass over its output.
double handoff_loop(const Backend& b, int threads, int iters, const std::vector<float>& A, const std::vector<float>& B,
                    std::vector<float>& C, std::vector<float>& D, int64_t T) {
  set_threads(b, threads);
  const int64_t M = T, N = 1536, K = 512;
  const double t0 = now();
  for (int it = 0; it < iters; ++it) {
    gemm_call(b, false, true, M, N, K, A.data(), K, B.data(), K, C.data(), N);
    float* c = C.data();
    float* d = D.data();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < M * N; ++i) d[i] = c[i] / (1.f + std::exp(-c[i]));
  }
  return (now() - t0) / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--cpu-time"))
      g_cpu_time = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--quick] [--cpu-time]\n", argv[0]);
      return 2;
    }
  }
  const int64_t T = quick ? 512 : 2048;
  const int hw = omp_get_num_procs();

  std::printf("# GEMM benchmark (T=%lld tokens, best of %d, %s; %d logical CPUs)\n\n", (long long)T, reps,
              g_cpu_time ? "CPU time / threads" : "wall clock", hw);
  kestrel::bench::print_machine_header("    ");
  std::printf("\n");
  std::printf(
      "## FP32 FMA peak (register-blocked FMA loop)\n\n| kernel | 1 core GFLOP/s | 2 cores GFLOP/s "
      "|\n|---|---:|---:|\n");
  for (bool zmm : {true, false})
    std::printf("| %s | %.1f | %.1f |\n", zmm ? "AVX-512 zmm, 16 acc" : "AVX2 ymm, 12 acc", fma_peak(zmm, 1, reps),
                fma_peak(zmm, 2, reps));

  auto backends = load_backends();
  const auto gemms = step_gemms(T);
  size_t maxA = 0, maxB = 0, maxC = 0;
  for (const auto& g : gemms) {
    maxA = std::max(maxA, size_t(g.M * g.K));
    maxB = std::max(maxB, size_t(g.K * g.N));
    maxC = std::max(maxC, size_t(g.M * g.N));
  }
  std::vector<float> A(maxA), B(maxB), C(maxC), Cref(maxC);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float((i * 40503u) % 997) * 1e-3f - 0.5f;

  const int thread_counts[] = {1, 2};
  // gflops[backend][threads][gemm]
  std::vector<std::vector<std::vector<double>>> gf(backends.size(), std::vector<std::vector<double>>(2));
  double worst_diff = 0;
  for (size_t bi = 0; bi < backends.size(); ++bi)
    for (int ti = 0; ti < 2; ++ti) {
      set_threads(backends[bi], thread_counts[ti]);
      for (const auto& g : gemms) {
        const double t = time_gemm(backends[bi], g, A, B, C, reps);
        gf[bi][size_t(ti)].push_back(g.flops() / t * 1e-9);
        if (bi == 0 && ti == 0) continue;
        // Compare against backend 0 at 1 thread, recomputed (cheap relative to the timing).
        set_threads(backends[0], 1);
        const int64_t lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
        gemm_call(backends[0], g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, Cref.data(), g.N);
        worst_diff = std::max(worst_diff, max_diff(C, Cref, size_t(g.M * g.N)));
        set_threads(backends[bi], thread_counts[ti]);
      }
    }

  std::printf(
      "\n## Training-step GEMMs, GFLOP/s (M x N x K; fwd: x@W^T, dX: dY@W, dW: dY^T@X)\n\n| GEMM | M x N x K |");
  for (const auto& b : backends) std::printf(" %s 1T | %s 2T |", b.name.c_str(), b.name.c_str());
  std::printf("\n|---|---|");
  for (size_t i = 0; i < backends.size(); ++i) std::printf("---:|---:|");
  std::printf("\n");
  for (size_t gi = 0; gi < gemms.size(); ++gi) {
    const auto& g = gemms[gi];
    std::printf("| %s | %lldx%lldx%lld |", g.label.c_str(), (long long)g.M, (long long)g.N, (long long)g.K);
    for (size_t bi = 0; bi < backends.size(); ++bi) std::printf(" %.1f | %.1f |", gf[bi][0][gi], gf[bi][1][gi]);
    std::printf("\n");
  }
  // Step totals: flop-weighted (total flops / total time) over the unfused GEMMs.
  std::printf("| **step total (unfused, 1 layer + lm_head)** | |");
  for (size_t bi = 0; bi < backends.size(); ++bi)
    for (int ti = 0; ti < 2; ++ti) {
      double fl = 0, sec = 0;
      for (size_t gi = 0; gi < gemms.size(); ++gi)
        if (!gemms[gi].fused) {
          fl += gemms[gi].flops();
          sec += gemms[gi].flops() / (gf[bi][size_t(ti)][gi] * 1e9);
        }
      std::printf(" **%.1f** |", fl / sec * 1e-9);
    }
  std::printf("\n\nlargest |difference| between back ends' results: %.3g\n", worst_diff);

  // Hand-off cost: GEMM then an OpenMP elementwise pass, 2 threads.
  std::vector<float> D(size_t(T * 1536));
  const int iters = quick ? 5 : 20;
  std::printf("\n## GEMM -> OpenMP hand-off (gate fwd %lldx1536x512 + silu pass, 2 threads), ms per iteration\n\n",
              (long long)T);
  std::printf("| back end | GEMM alone | silu pass alone | GEMM + pass alternating |\n|---|---:|---:|---:|\n");
  for (const auto& b : backends) {
    set_threads(b, 2);
    const Gemm g{"", false, true, T, 1536, 512, false};
    const double tg = time_gemm(b, g, A, B, C, reps);
    double tp = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now();
      float* c = C.data();
      float* d = D.data();
#pragma omp parallel for schedule(static) num_threads(2)
      for (int64_t i = 0; i < T * 1536; ++i) d[i] = c[i] / (1.f + std::exp(-c[i]));
      tp = std::min(tp, now() - t0);
    }
    double ta = 1e30;
    for (int r = 0; r < reps; ++r) ta = std::min(ta, handoff_loop(b, 2, iters, A, B, C, D, T));
    std::printf("| %s | %.2f | %.2f | %.2f |\n", b.name.c_str(), tg * 1e3, tp * 1e3, ta * 1e3);
  }
  return 0;
}
