// Row-major single-precision GEMM over a library chosen when the process
// starts (backend/cpu/blas_loader.h, blas_select.h): OpenBLAS, BLIS or
// oneDNN, loaded at run time, per transpose pattern, by KESTREL_BLAS or by a
// micro-benchmark cached per machine. Every dense matmul of the CPU backend
// goes through here, so this is also the one place that keeps the library's
// thread pool the same size as the OpenMP team (no oversubscription).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/blas_loader.h"
#include "core/status.h"

namespace kestrel::cpu {

// C[M, N] = alpha * op(A) @ op(B) + beta * C, all row-major.
// op(A) is [M, K]: A is [M, lda>=K] when !trans_a, [K, lda>=M] when trans_a.
// op(B) is [K, N]: B is [K, ldb>=N] when !trans_b, [N, ldb>=K] when trans_b.
// beta == 0 never reads C (it may hold garbage, NaN included).
// The first call chooses the library (gemm_init); a bad KESTREL_BLAS throws.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Chooses the GEMM libraries now, once per process, and logs the choice on
// stderr ("GEMM: ..."). KESTREL_BLAS=auto|openblas|blis|dnnl (unset: auto):
//   openblas|blis|dnnl: that library for every GEMM (an error when absent);
//   auto: among the installed libraries whose kernels reach the machine's
//   ISA, the one (per transpose pattern) that is fastest on a short
//   micro-benchmark, measured once per machine and cached in
//   $KESTREL_CACHE or ~/.cache/kestrel (gemm-*.json). A user-set
//   OPENBLAS_CORETYPE means OpenBLAS with that core.
// It also settles whether f32 weights are packed (packed_choice.h: measured
// once per machine, or read from its cache; a bad KESTREL_PACKED_WEIGHTS is
// an error here).
// Call it early (the CLI does, before any thread starts): loading OpenBLAS
// may set OPENBLAS_CORETYPE for a moment (blas_loader.h).
Status gemm_init();

// The GEMM line of logs and benchmark headers, e.g. "OpenBLAS 0.3.21
// SkylakeX (openmp) for all GEMMs, 2 threads, 172 GFLOP/s measured (cached);
// rollout weights packed once per update by oneDNN matmul (gemm:jit)" (the
// last part: backend/cpu/packed_linear.h).
// Initialises like sgemm (throws on a bad KESTREL_BLAS).
std::string gemm_summary();

// The process's choice as one provider per transpose pattern (x@W^T, dY@W,
// dY^T@X), initialising like sgemm. The ranks of one job adopt rank 0's
// (cli: agree_gemm_choice), so a per-machine measurement that came out
// differently on two nodes cannot make their replicated arithmetic round
// differently.
std::array<GemmProvider, 3> gemm_choice();
// Routes every following sgemm of each pattern to these providers (an error
// when one is not loadable here); `why` goes into gemm_summary().
Status adopt_gemm_choice(const std::array<GemmProvider, 3>& choice, const std::string& why);

// The libraries this machine can load (each loaded once, on first ask).
std::vector<GemmProvider> available_gemm_providers();

// Tests and benchmarks: route every following sgemm to p (throws when p is
// not available). Not for use while GEMMs run on other threads.
void use_gemm_provider(GemmProvider p);
// Tests and benchmarks: back to the process's choice (KESTREL_BLAS / auto).
void use_default_gemm();

// Tests: use_gemm_provider(p) for a scope, then back to what ran before (the
// process's choice stays unmade if it was: no micro-benchmark is triggered).
class ScopedGemmProvider {
 public:
  explicit ScopedGemmProvider(GemmProvider p);
  ~ScopedGemmProvider();
  ScopedGemmProvider(const ScopedGemmProvider&) = delete;
  ScopedGemmProvider& operator=(const ScopedGemmProvider&) = delete;

 private:
  const void* saved_;
};

// Makes the loaded libraries use n threads (n <= 0: omp_get_max_threads()).
// sgemm calls this itself whenever the OpenMP thread count changed, so
// callers rarely need it.
void sync_blas_threads(int n = 0);

}  // namespace kestrel::cpu
