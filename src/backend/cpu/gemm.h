// Row-major single-precision GEMM over the BLAS chosen at configure time
// (KESTREL_BLAS=openblas|blis). Every dense matmul of the CPU backend goes
// through here, so this is also the one place that keeps the BLAS thread
// pool the same size as the OpenMP team (no oversubscription of the cores).
#pragma once
#include <cstdint>

namespace kestrel::cpu {

// C[M, N] = alpha * op(A) @ op(B) + beta * C, all row-major.
// op(A) is [M, K]: A is [M, lda>=K] when !trans_a, [K, lda>=M] when trans_a.
// op(B) is [K, N]: B is [K, ldb>=N] when !trans_b, [N, ldb>=K] when trans_b.
// beta == 0 never reads C (it may hold garbage, NaN included).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// "openblas" or "blis": the library linked in.
const char* blas_name();

// Makes the BLAS use n threads (n <= 0: omp_get_max_threads()). sgemm calls this
// itself whenever the OpenMP thread count changed, so callers rarely need it.
void sync_blas_threads(int n = 0);

}  // namespace kestrel::cpu
