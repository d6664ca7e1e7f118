// Helpers for the tensor/data-parallel tests: full tensors every rank can
// build identically (so the single-process reference runs on every rank),
// slicing by rows or columns, and the "relative to scale" comparison.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/testing.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "mpi_testing.h"
#include "parallel/sharding.h"

namespace kestrel::testing {

// Uniform in [-scale, scale), identical on every rank.
inline Tensor rand_full(Shape s, uint64_t seed, float scale = 1.0f, DType dt = DType::F32) {
  Tensor t = Tensor::empty(s, dt, MemCategory::Other);
  Philox p{seed, 77};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * (2.0f * p.uniform(uint64_t(i)) - 1.0f));
  return t;
}

// Rows [b, e) of a 2-D (or 1-D) tensor, copied.
inline Tensor rows_of(const Tensor& t, int64_t b, int64_t e) { return t.slice_rows(b, e).clone(); }
// Block r of n along dim 0 / dim 1.
inline Tensor row_block(const Tensor& t, int r, int n) {
  return parallel::shard_tensor(t, {parallel::ShardKind::Column, 0}, r, n, "", MemCategory::Other);
}
inline Tensor col_block(const Tensor& t, int r, int n) {
  return parallel::shard_tensor(t, {parallel::ShardKind::Row, 0}, r, n, "", MemCategory::Other);
}
// Columns [b, e) of a 2-D tensor.
inline Tensor cols_of(const Tensor& t, int64_t b, int64_t e) {
  const int64_t R = t.size(0), C = t.size(1);
  Tensor out = Tensor::empty({R, e - b}, t.dtype(), MemCategory::Other);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = b; c < e; ++c) out.set(r * (e - b) + (c - b), t.get(r * C + c));
  return out;
}

inline double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.numel(), want.numel()) << got.describe() << " vs " << want.describe();
  if (got.numel() != want.numel()) return 1e30;
  return rel_to_scale(to_double(got), to_double(want));
}

// The criterion: fp32 within 1e-5 relative (to each tensor's scale).
constexpr double kTpTol = 1e-5;
#define EXPECT_CLOSE(got, want, what) \
  EXPECT_LE(::kestrel::testing::rel_err(got, want), ::kestrel::testing::kTpTol) << (what)

}  // namespace kestrel::testing
