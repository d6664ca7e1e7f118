// Helpers for the multi-rank tests: the world group, and values every rank
// can compute for every other rank (so expected results need no communication).
// Bodies must call collectives on every rank: use EXPECT_*, not ASSERT_*,
// between collectives, or a failing rank returns early and the others hang.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/world.h"
#include "core/rng.h"

namespace kestrel::testing {

inline comm::ProcessGroup& world_group() { return *comm::World::current()->group(); }

// Small integers in [-5, 5]: sums over <= 4 ranks are exact in bf16, f16, f32 and ints.
inline int small_value(int rank, int64_t i) { return int((rank * 7 + i * 3 + (i * i) % 5) % 11) - 5; }

// Uniform in [-1, 1) from (seed, rank, i).
inline float uniform_value(uint64_t seed, int rank, int64_t i) {
  Philox p{seed, uint64_t(rank)};
  return 2.0f * p.uniform(uint64_t(i)) - 1.0f;
}

// Sum over ranks of a per-rank double, exactly: the doubles travel as raw
// 8-byte patterns (there is no f64 DType) and are added in rank order locally.
inline double global_sum(comm::ProcessGroup& g, double local) {
  int64_t bits;
  std::memcpy(&bits, &local, 8);
  std::vector<int64_t> all(g.size());
  g.all_gather(&bits, all.data(), 1, DType::I64);
  double s = 0;
  for (int64_t b : all) {
    double v;
    std::memcpy(&v, &b, 8);
    s += v;
  }
  return s;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

}  // namespace kestrel::testing
