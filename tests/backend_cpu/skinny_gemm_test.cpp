// cpu::skinny_linear against a double reference computed from the stored
// (dtype-rounded) operands: every M = 1..kSkinnyMaxRows, sizes that are not
// multiples of the vector width, every f32/bf16 mix, and the thread split.
#include "backend/cpu/skinny_gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_cpu/linear_reference.h"
#include "common/testing.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/isa_harness.h"

namespace kestrel::cpu {
namespace {

Tensor random_tensor(Shape shape, DType dt, uint64_t seed) {
  return testing::random_linear_operand(std::move(shape), dt, seed, 0x5eedULL);
}
using testing::nan_tensor;
::testing::AssertionResult matches_reference(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
  return testing::linear_matches_reference(x, w, b, y);
}

struct Case {
  int64_t in, out;
};

KS_ISA_SUITE(SkinnyLinear);

TEST_P(SkinnyLinear, F32EveryRowCountAndOddSizes) {
  // in: below one vector, not a multiple of 8, not of 32 (the 4x unrolled
  // step), and a multiple of 32; out: odd (an unpaired last row), tiny, even.
  const std::vector<Case> cases = {{1, 1}, {7, 3}, {8, 16}, {13, 37}, {33, 2}, {64, 9}, {100, 31}, {259, 5}};
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (int64_t M = 1; M <= kSkinnyMaxRows; ++M)
      for (bool bias : {false, true}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) +
                     (bias ? " bias" : ""));
        const Tensor x = random_tensor({M, c.in}, DType::F32, seed++);
        const Tensor w = random_tensor({c.out, c.in}, DType::F32, seed++);
        const Tensor b = random_tensor({c.out}, DType::F32, seed++);
        Tensor y = nan_tensor({M, c.out}, DType::F32);
        skinny_linear(x, w, bias ? &b : nullptr, y);
        EXPECT_TRUE(matches_reference(x, w, bias ? &b : nullptr, y));
      }
}

TEST_P(SkinnyLinear, EveryDtypeMix) {
  const DType dts[2] = {DType::F32, DType::BF16};
  uint64_t seed = 100;
  for (DType xd : dts)
    for (DType wd : dts)
      for (DType bd : dts)
        for (DType yd : dts)
          for (int64_t M : {1, 3, 6}) {
            SCOPED_TRACE(std::string("x ") + dtype_name(xd) + " w " + dtype_name(wd) + " b " + dtype_name(bd) +
                         " y " + dtype_name(yd) + " M=" + std::to_string(M));
            const Tensor x = random_tensor({M, 45}, xd, seed++);
            const Tensor w = random_tensor({11, 45}, wd, seed++);
            const Tensor b = random_tensor({11}, bd, seed++);
            Tensor y = nan_tensor({M, 11}, yd);
            skinny_linear(x, w, &b, y);
            EXPECT_TRUE(matches_reference(x, w, &b, y));
          }
}

// Large enough to run on the OpenMP team: the threads split the output rows,
// and every row's dot is summed in the same order however the rows are
// paired, so the result is bitwise the same at 1 and 2 threads.
TEST_P(SkinnyLinear, ThreadSplitIsBitwiseStable) {
  const int saved = omp_get_max_threads();
  for (DType wd : {DType::F32, DType::BF16})
    for (int64_t M : {1, 2, 5, 13}) {
      SCOPED_TRACE(std::string("w ") + dtype_name(wd) + " M=" + std::to_string(M));
      const Tensor x = random_tensor({M, 131}, DType::F32, 7 + uint64_t(M));
      const Tensor w = random_tensor({301, 131}, wd, 8);
      const Tensor b = random_tensor({301}, DType::F32, 9);
      Tensor y1 = nan_tensor({M, 301}, DType::F32), y2 = nan_tensor({M, 301}, DType::F32);
      omp_set_num_threads(1);
      skinny_linear(x, w, &b, y1);
      omp_set_num_threads(2);
      skinny_linear(x, w, &b, y2);
      EXPECT_TRUE(matches_reference(x, w, &b, y2));
      EXPECT_EQ(testing::to_double(y1), testing::to_double(y2));
    }
  omp_set_num_threads(saved);
}

TEST_P(SkinnyLinear, NanAndInfPropagateToTheirRows) {
  Tensor x = random_tensor({3, 20}, DType::F32, 11);
  const Tensor w = random_tensor({5, 20}, DType::F32, 12);
  x.set(1 * 20 + 17, std::numeric_limits<float>::quiet_NaN());  // row 1: all NaN
  Tensor y = nan_tensor({3, 5}, DType::F32);
  skinny_linear(x, w, nullptr, y);
  const std::vector<double> yv = testing::to_double(y);
  for (int64_t n = 0; n < 5; ++n) {
    EXPECT_TRUE(std::isfinite(yv[size_t(n)]));
    EXPECT_TRUE(std::isnan(yv[size_t(5 + n)]));
    EXPECT_TRUE(std::isfinite(yv[size_t(10 + n)]));
  }
}

TEST_P(SkinnyLinear, RejectsWhatItDoesNotTake) {
  const Tensor w = random_tensor({4, 8}, DType::F32, 1);
  const Tensor x_big = random_tensor({kSkinnyMaxRows + 1, 8}, DType::F32, 2);
  Tensor y_big = Tensor::empty({kSkinnyMaxRows + 1, 4}, DType::F32);
  EXPECT_FALSE(skinny_linear_applies(x_big, w, nullptr, y_big));
  EXPECT_THROW(skinny_linear(x_big, w, nullptr, y_big), Error);
  const Tensor x_bad = random_tensor({2, 7}, DType::F32, 3);  // in mismatch
  Tensor y = Tensor::empty({2, 4}, DType::F32);
  EXPECT_FALSE(skinny_linear_applies(x_bad, w, nullptr, y));
  const Tensor x = random_tensor({2, 8}, DType::F32, 4);
  const Tensor b_bad = random_tensor({3}, DType::F32, 5);
  EXPECT_FALSE(skinny_linear_applies(x, w, &b_bad, y));
  const Tensor x_i32 = Tensor::zeros({2, 8}, DType::I32);
  EXPECT_FALSE(skinny_linear_applies(x_i32, w, nullptr, y));
  EXPECT_TRUE(skinny_linear_applies(x, w, nullptr, y));
}

}  // namespace
}  // namespace kestrel::cpu
