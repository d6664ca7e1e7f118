// balance_batch: Karmarkar–Karp partitions identical to verl's
// seqlen_balancing.karmarkar_karp. The expected partitions were produced by
// running verl's algorithm (Python heapq, same tie rules) on these inputs.
#include <gtest/gtest.h>

#include <numeric>

#include "core/status.h"
#include "parallel/balance.h"

using namespace kestrel::parallel;
using Parts = std::vector<std::vector<int64_t>>;

TEST(BalanceBatch, MatchesVerlPartitions) {
  EXPECT_EQ(seqlen_balanced_partitions({5, 1, 9, 3, 7, 2, 8, 4}, 2, true), (Parts{{0, 2, 5, 7}, {1, 3, 4, 6}}));
  EXPECT_EQ(seqlen_balanced_partitions({10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120}, 4, true),
            (Parts{{3, 7, 8}, {2, 6, 9}, {1, 5, 10}, {0, 4, 11}}));
  EXPECT_EQ(seqlen_balanced_partitions({3, 3, 3, 3, 3, 3}, 3, true), (Parts{{0, 5}, {1, 4}, {2, 3}}));
  EXPECT_EQ(seqlen_balanced_partitions({100, 1, 1, 1, 1, 1, 50, 49}, 3, false), (Parts{{0}, {1, 3, 5, 7}, {2, 4, 6}}));
  EXPECT_EQ(seqlen_balanced_partitions({17, 4, 29, 8, 8, 13, 21, 5, 2, 40, 11, 6, 9, 33, 1, 12}, 4, true),
            (Parts{{9, 10, 11, 14}, {3, 8, 13, 15}, {1, 2, 4, 5}, {0, 6, 7, 12}}));
}

TEST(BalanceBatch, OrderIsAPermutationWithBalancedChunks) {
  std::vector<int64_t> lens;
  for (int i = 0; i < 64; ++i) lens.push_back((i * 37) % 101 + 1);
  const auto order = balance_batch_order(lens, 4);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(64);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  int64_t lo = INT64_MAX, hi = 0;
  for (int r = 0; r < 4; ++r) {
    int64_t s = 0;
    for (int i = 0; i < 16; ++i) s += lens[size_t(order[size_t(r * 16 + i)])];
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
  EXPECT_LE(hi - lo, 101);  // within one sequence of each other (here: far better than round-robin)
}

TEST(BalanceBatch, Errors) {
  EXPECT_THROW(seqlen_balanced_partitions({1, 2, 3}, 2, true), kestrel::Error);
  EXPECT_THROW(seqlen_balanced_partitions({1}, 2, false), kestrel::Error);
}
