// Deterministic mode's GEMM (core/parallel_for.h, backend/cpu/gemm.cpp): the
// same bits at 1, 2, 3 and 8 threads with every installed library and every
// transpose pattern, including shapes with partial tiles and oneDNN's
// K-splitting shapes; and still the right product (to f32 rounding).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/blas_select.h"
#include "backend/cpu/gemm.h"
#include "core/parallel_for.h"

namespace kestrel::cpu {
namespace {

struct DeterministicScope {
  DeterministicScope() { set_deterministic(true); }
  ~DeterministicScope() { set_deterministic(false); }
};

struct Shape3 {
  int64_t M, N, K;
};

TEST(DeterministicGemm, SameBitsAtEveryThreadCount) {
  const int saved = omp_get_max_threads();
  DeterministicScope det;
  // Partial tiles on both sides; one row (decode); a long K with a small
  // output (where oneDNN splits K when threaded); the training step's dW.
  const Shape3 shapes[] = {{300, 700, 129}, {1, 513, 64}, {64, 48, 4096}, {513, 257, 2048}};
  for (GemmProvider p : available_gemm_providers()) {
    ScopedGemmProvider scope(p);
    for (const Shape3& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          if (ta && tb) continue;  // no kernel uses op(A)^T op(B)^T
          SCOPED_TRACE(std::string(provider_key(p)) + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                       " K=" + std::to_string(s.K) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
          const int64_t M = s.M, N = s.N, K = s.K, lda = ta ? M : K, ldb = tb ? K : N;
          std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C0(size_t(M * N));
          for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.013f * float(i) + 0.1f);
          for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.007f * float(i));
          for (size_t i = 0; i < C0.size(); ++i) C0[i] = 0.25f * std::sin(float(i));
          std::vector<float> first;
          for (int t : {1, 2, 3, 8}) {
            omp_set_num_threads(t);
            std::vector<float> C = C0;  // beta = 1: the dW accumulation
            sgemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 1.f, C.data(), N);
            if (first.empty()) {
              first = C;
              // A spot check that the tiles add up to the product.
              for (int64_t i : {int64_t(0), M / 2, M - 1})
                for (int64_t j : {int64_t(0), N / 3, N - 1}) {
                  double acc = 0, mag = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const double a = A[size_t(ta ? k * lda + i : i * lda + k)];
                    const double b = B[size_t(tb ? j * ldb + k : k * ldb + j)];
                    acc += a * b;
                    mag += std::abs(a * b);
                  }
                  const double want = 0.5 * acc + C0[size_t(i * N + j)];
                  EXPECT_NEAR(C[size_t(i * N + j)], want, 2 * K * std::ldexp(1.0, -24) * mag + 1e-6);
                }
            } else {
              EXPECT_EQ(std::memcmp(C.data(), first.data(), C.size() * sizeof(float)), 0) << t << " threads";
            }
          }
        }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace kestrel::cpu
