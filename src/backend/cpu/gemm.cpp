#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>

#include "core/status.h"

// The thread-count setters are declared here rather than taken from blis.h /
// openblas_config.h so that only cblas.h has to be on the include path.
extern "C" {
#if defined(KESTREL_BLAS_BLIS)
void bli_thread_set_num_threads(int64_t n);  // dim_t is 64-bit in Debian's BLIS
#elif defined(KESTREL_BLAS_OPENBLAS)
void openblas_set_num_threads(int n);
#endif
}

namespace kestrel::cpu {

namespace {
std::atomic<int> g_blas_threads{-1};
}

const char* blas_name() {
#if defined(KESTREL_BLAS_BLIS)
  return "blis";
#else
  return "openblas";
#endif
}

void sync_blas_threads(int n) {
  if (n <= 0) n = omp_get_max_threads();
  if (g_blas_threads.exchange(n) == n) return;
#if defined(KESTREL_BLAS_BLIS)
  bli_thread_set_num_threads(n);
#elif defined(KESTREL_BLAS_OPENBLAS)
  // Debian's libopenblas0 is the pthread build: its own pool, sized here. The
  // pool and OpenMP's team never run at once (GEMMs are called between
  // parallel regions), so the cores are shared, not oversubscribed.
  openblas_set_num_threads(n);
#endif
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  KS_CHECK(M >= 0 && N >= 0 && K >= 0, "sgemm: negative size M=", M, " N=", N, " K=", K);
  KS_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N, "sgemm: leading dimension too small");
  KS_CHECK(M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && K < (int64_t(1) << 31),
           "sgemm: dimension over the 32-bit BLAS interface limit");
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {
    // BLAS would scale C by beta; do it here so beta == 0 also clears NaN garbage.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  // Inside a parallel region the caller owns the threads: leave the pool size alone.
  if (!omp_in_parallel()) sync_blas_threads(omp_get_max_threads());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace kestrel::cpu
