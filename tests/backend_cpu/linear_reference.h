// Shared by the linear-kernel tests (skinny_gemm_test, packed_linear_test):
// random operands from a Philox stream, NaN-filled outputs (so an unwritten
// element shows), and y = x w^T (+ b) checked against a double reference.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/testing.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace kestrel::testing {

// normal(0, 1) values from a Philox stream, as stored in dt.
inline Tensor random_linear_operand(Shape shape, DType dt, uint64_t seed, uint64_t key = 0x5eedULL) {
  Tensor t = Tensor::empty(shape, dt, MemCategory::Other);
  Philox rng{key, seed};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.normal(uint64_t(i)));
  return t;
}

inline Tensor nan_tensor(Shape shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt, MemCategory::Other);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::numeric_limits<float>::quiet_NaN());
  return t;
}

// y against sum_k x w (+ b) in double from the stored operands. Allowed
// error: f32 summation (in * 2^-24 * sum |x w|, with margin; bf16 products
// are exact in f32) plus, for a bf16 y, half an ulp of bf16 at the result.
inline ::testing::AssertionResult linear_matches_reference(const Tensor& x, const Tensor& w, const Tensor* b,
                                                            const Tensor& y) {
  const int64_t M = x.size(0), in = x.size(1), out = w.size(0);
  const std::vector<double> xv = to_double(x), wv = to_double(w), yv = to_double(y);
  const std::vector<double> bv = b ? to_double(*b) : std::vector<double>();
  for (int64_t t = 0; t < M; ++t)
    for (int64_t n = 0; n < out; ++n) {
      double ref = b ? bv[size_t(n)] : 0.0, mag = b ? std::abs(bv[size_t(n)]) : 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = xv[size_t(t * in + k)] * wv[size_t(n * in + k)];
        ref += p;
        mag += std::abs(p);
      }
      double tol = 2.0 * double(in + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
      if (y.dtype() == DType::BF16) tol += std::ldexp(std::abs(ref), -8);
      const double got = yv[size_t(t * out + n)];
      if (!(std::abs(got - ref) <= tol))
        return ::testing::AssertionFailure() << "y[" << t << ", " << n << "] = " << got << ", reference " << ref
                                             << ", allowed error " << tol;
    }
  return ::testing::AssertionSuccess();
}

}  // namespace kestrel::testing
