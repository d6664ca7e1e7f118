// GEMM throughput on this machine, printed as markdown tables:
//  1. FP32 FMA peak per core and for 2 cores, from a register-blocked FMA loop
//     (AVX-512 zmm and AVX2 ymm: Zen 4 runs 512-bit FMAs as two 256-bit halves).
//  2. The GEMMs of one training step of the "small" model (hidden 512, 8 heads,
//     2 KV heads of 64, ffn 1536, vocab 8192, T = 2048 tokens per micro-batch):
//     forward x @ W^T and both backward GEMMs (dX = dY @ W, dW = dY^T @ X) of
//     every linear, at 1 and 2 threads, through kestrel::cpu::sgemm (the BLAS
//     linked in) and through OpenBLAS and BLIS, both dlopen'ed into this run.
//  3. A GEMM -> OpenMP-elementwise hand-off loop (what a training step does),
//     per BLAS: the pthread OpenBLAS pool and the OpenMP team spin against
//     each other on shared cores, the OpenMP BLIS shares one pool.
// Times are the best of --reps runs of wall-clock time. Usage:
//   bench_gemm_bench [--reps N] [--quick] [--cpu-time]
#include <dlfcn.h>
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

// ---------------------------------------------------------------- BLAS back ends
enum CblasOrder { kRowMajor = 101 };
enum CblasTranspose { kNoTrans = 111, kTrans = 112 };
using cblas_sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                                float*, int);
using bli_sgemm_fn = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                              const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
using set_threads_int_fn = void (*)(int);
using set_threads_dim_fn = void (*)(int64_t);

struct Backend {
  std::string name;
  // C[M,N] = op(A) @ op(B), row-major, beta = 0.
  std::function<void(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                     int64_t)>
      gemm;
  std::function<void(int)> set_threads;
};

std::vector<Backend> load_backends() {
  std::vector<Backend> out;
  out.push_back(
      {std::string("kestrel::cpu::sgemm (") + kestrel::cpu::blas_name() + ")",
       [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc) { kestrel::cpu::sgemm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc); },
       [](int n) {
         omp_set_num_threads(n);
         g_threads_now = n;
       }});
  // The default OpenBLAS, then (when libopenblas0-openmp is installed) the
  // OpenMP build of the same version, loaded with RTLD_DEEPBIND so that its
  // internal calls bind to itself and not to the copy already loaded.
  const std::pair<const char*, const char*> openblas_builds[] = {
      {"libopenblas.so.0", "default alternative"},
      {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", "openmp build"}};
  for (const auto& [path, what] : openblas_builds) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | (path[0] == '/' ? RTLD_DEEPBIND : 0));
    if (!h) {
      std::printf("(OpenBLAS %s not loadable: %s)\n", what, dlerror());
      continue;
    }
    auto gemm = reinterpret_cast<cblas_sgemm_fn>(dlsym(h, "cblas_sgemm"));
    auto set = reinterpret_cast<set_threads_int_fn>(dlsym(h, "openblas_set_num_threads"));
    auto corename = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_corename"));
    auto parallel = reinterpret_cast<int (*)()>(dlsym(h, "openblas_get_parallel"));
    const int mode = parallel ? parallel() : -1;  // 0 serial, 1 pthread, 2 openmp
    if (gemm && set)
      out.push_back({std::string("OpenBLAS ") + (corename ? corename() : "") +
                         (mode == 2   ? " (openmp)"
                          : mode == 1 ? " (pthread)"
                                      : " (serial)"),
                     [gemm](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                            const float* B, int64_t ldb, float* C, int64_t ldc) {
                       gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(M), int(N), int(K), 1.f, A,
                            int(lda), B, int(ldb), 0.f, C, int(ldc));
                     },
                     [set](int n) {
                       omp_set_num_threads(n);
                       g_threads_now = n;
                       kestrel::cpu::sync_blas_threads(
                           n);  // keeps the wrapper's cache true when this is the linked BLAS
                       set(n);
                     }});
  }
  // BLIS through its native typed API (bli_ names are unique to BLIS, so no
  // symbol of the OpenBLAS already loaded can interpose), row-major as
  // (row stride, col stride) = (ld, 1).
  if (void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL)) {
    auto gemm = reinterpret_cast<bli_sgemm_fn>(dlsym(h, "bli_sgemm"));
    auto set = reinterpret_cast<set_threads_dim_fn>(dlsym(h, "bli_thread_set_num_threads"));
    auto arch_id = reinterpret_cast<int (*)()>(dlsym(h, "bli_arch_query_id"));
    auto arch_str = reinterpret_cast<const char* (*)(int)>(dlsym(h, "bli_arch_string"));
    if (gemm && set)
      out.push_back({std::string("BLIS ") + (arch_id && arch_str ? arch_str(arch_id()) : "") + " (openmp)",
                     [gemm](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                            const float* B, int64_t ldb, float* C, int64_t ldc) {
                       const float one = 1.f, zero = 0.f;
                       constexpr int kBlisNoTrans = 0, kBlisTrans = 8;
                       gemm(ta ? kBlisTrans : kBlisNoTrans, tb ? kBlisTrans : kBlisNoTrans, M, N, K, &one, A, lda, 1, B,
                            ldb, 1, &zero, C, ldc, 1);
                     },
                     [set](int n) {
                       omp_set_num_threads(n);
                       g_threads_now = n;
                       kestrel::cpu::sync_blas_threads(
                           n);  // keeps the wrapper's cache true when this is the linked BLAS
                       set(n);
                     }});
  } else {
    std::printf("(libblis.so.4 not loadable: %s)\n", dlerror());
  }
  return out;
}

// ---------------------------------------------------------------- training-step GEMMs
struct Linear {
  const char* name;
  int64_t in, out;
  bool fused;  // a fused alternative to separate rows above it, not counted in the step total
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
  return g;
}

double time_gemm(const Backend& b, const Gemm& g, const std::vector<float>& A, const std::vector<float>& B,
                 std::vector<float>& C, int reps) {
  const int64_t lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
  b.gemm(g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, C.data(), g.N);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    b.gemm(g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, C.data(), g.N);
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
  b.set_threads(threads);
  const int64_t M = T, N = 1536, K = 512;
  const double t0 = now();
  for (int it = 0; it < iters; ++it) {
    b.gemm(false, true, M, N, K, A.data(), K, B.data(), K, C.data(), N);
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
      backends[bi].set_threads(thread_counts[ti]);
      for (const auto& g : gemms) {
        const double t = time_gemm(backends[bi], g, A, B, C, reps);
        gf[bi][size_t(ti)].push_back(g.flops() / t * 1e-9);
        if (bi == 0 && ti == 0) continue;
        // Compare against backend 0 at 1 thread, recomputed (cheap relative to the timing).
        backends[0].set_threads(1);
        const int64_t lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
        backends[0].gemm(g.ta, g.tb, g.M, g.N, g.K, A.data(), lda, B.data(), ldb, Cref.data(), g.N);
        worst_diff = std::max(worst_diff, max_diff(C, Cref, size_t(g.M * g.N)));
        backends[bi].set_threads(thread_counts[ti]);
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
    b.set_threads(2);
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
