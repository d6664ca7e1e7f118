// The bf16/f16 reduction kernels behind the MPI user ops, and the Avg divide.
// They only exist in MPI builds (src/comm/mpi/), hence the guard.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#if defined(KESTREL_HAVE_MPI)
#include "comm/mpi/reduce_kernels.h"

using namespace kestrel;
using namespace kestrel::comm;

namespace {
uint16_t bf(float f) { return float_to_bf16(f); }
}  // namespace

TEST(HalfReduce, Bf16SumRoundsToNearestEvenAfterEachStep) {
  // 256 + 1 = 257 lies halfway between bf16 neighbours 256 and 258: ties to even (256).
  // 1 + 2^-8 likewise ties back to 1; 1 + 3*2^-8 rounds up to 1 + 2^-6.
  const uint16_t in[4] = {bf(1.0f), bf(std::ldexp(1.0f, -8)), bf(3 * std::ldexp(1.0f, -8)), bf(-2.5f)};
  uint16_t io[4] = {bf(256.0f), bf(1.0f), bf(1.0f), bf(2.5f)};
  reduce_half_into(in, io, 4, DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(bf16_to_float(io[0]), 256.0f);
  EXPECT_EQ(bf16_to_float(io[1]), 1.0f);
  EXPECT_EQ(bf16_to_float(io[2]), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16_to_float(io[3]), 0.0f);
}

TEST(HalfReduce, MaxMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t in[3] = {bf(1.0f), bf(nan), bf(-3.0f)};
  uint16_t mx[3] = {bf(2.0f), bf(5.0f), bf(nan)};
  uint16_t mn[3] = {bf(2.0f), bf(5.0f), bf(nan)};
  reduce_half_into(in, mx, 3, DType::BF16, ReduceOp::Max);
  reduce_half_into(in, mn, 3, DType::BF16, ReduceOp::Min);
  EXPECT_EQ(bf16_to_float(mx[0]), 2.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(mx[1])));
  EXPECT_TRUE(std::isnan(bf16_to_float(mx[2])));
  EXPECT_EQ(bf16_to_float(mn[0]), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(mn[1])));
  EXPECT_TRUE(std::isnan(bf16_to_float(mn[2])));
}

TEST(HalfReduce, F16SumAndOverflow) {
  // f16 has 10 mantissa bits: 2048 + 1 ties to even (2048); 65504 + 65504 overflows to inf.
  const uint16_t in[3] = {float_to_f16(1.0f), float_to_f16(65504.0f), float_to_f16(0.25f)};
  uint16_t io[3] = {float_to_f16(2048.0f), float_to_f16(65504.0f), float_to_f16(-1.0f)};
  reduce_half_into(in, io, 3, DType::F16, ReduceOp::Sum);
  EXPECT_EQ(f16_to_float(io[0]), 2048.0f);
  EXPECT_TRUE(std::isinf(f16_to_float(io[1])));
  EXPECT_EQ(f16_to_float(io[2]), -0.75f);
  EXPECT_THROW(reduce_half_into(in, io, 3, DType::F32, ReduceOp::Sum), Error);
}

TEST(HalfReduce, DivideInPlaceForAvg) {
  float f[2] = {3.0f, -1.0f};
  divide_inplace(f, 2, DType::F32, 4);
  EXPECT_EQ(f[0], 0.75f);
  EXPECT_EQ(f[1], -0.25f);
  uint16_t b[1] = {bf(1.0f)};
  divide_inplace(b, 1, DType::BF16, 3);
  EXPECT_EQ(bf16_to_float(b[0]), round_bf16(1.0f / 3.0f));
  uint16_t h[1] = {float_to_f16(1.0f)};
  divide_inplace(h, 1, DType::F16, 3);
  EXPECT_EQ(f16_to_float(h[0]), f16_to_float(float_to_f16(1.0f / 3.0f)));
  int32_t i[2] = {7, -7};
  divide_inplace(i, 2, DType::I32, 2);  // truncates toward zero, like ncclAvg on integers
  EXPECT_EQ(i[0], 3);
  EXPECT_EQ(i[1], -3);
  int64_t l[1] = {int64_t(1) << 40};
  divide_inplace(l, 1, DType::I64, 4);
  EXPECT_EQ(l[0], int64_t(1) << 38);
}
#endif
