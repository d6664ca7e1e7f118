// Block pool unit tests in the spirit of vLLM's tests/v1/core/test_prefix_caching.py:
// exact block ids, hash chains, reference counts, free-queue (LRU) order.
#include <gtest/gtest.h>

#include "core/status.h"
#include "rollout/block_pool.h"

using namespace kestrel::rollout;

namespace {

std::vector<int32_t> iota_tokens(int32_t from, int32_t n) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(from + i);
  return t;
}

}  // namespace

TEST(BlockHash, ChainsParentTokensAndExtraKey) {
  const auto t = iota_tokens(0, 8);
  const BlockHash h0 = hash_block_tokens(nullptr, t.data(), 4, 0);
  const BlockHash h1 = hash_block_tokens(&h0, t.data() + 4, 4, 0);
  // Same tokens, same parent: same hash (deterministic, no per-process salt).
  EXPECT_EQ(h0, hash_block_tokens(nullptr, t.data(), 4, 0));
  // The parent matters: block [4..8) as a first block hashes differently.
  EXPECT_NE(h1, hash_block_tokens(nullptr, t.data() + 4, 4, 0));
  // The extra key (weight version) matters.
  EXPECT_NE(h0, hash_block_tokens(nullptr, t.data(), 4, 1));
  // Every token matters.
  auto u = t;
  u[3] = 99;
  EXPECT_NE(h0, hash_block_tokens(nullptr, u.data(), 4, 0));

  std::vector<BlockHash> chain;
  extend_block_hashes(iota_tokens(0, 10), 4, 0, chain);  // 2 full blocks, the partial one is not hashed
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0], h0);
  EXPECT_EQ(chain[1], h1);
  extend_block_hashes(iota_tokens(0, 12), 4, 0, chain);
  ASSERT_EQ(chain.size(), 3u);
  const auto t12 = iota_tokens(0, 12);
  EXPECT_EQ(chain[2], hash_block_tokens(&h1, t12.data() + 8, 4, 0));
}

TEST(BlockPool, AllocatesInIdOrderAndNeverHandsOutTheNullBlock) {
  BlockPool pool(6, true);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  auto a = pool.allocate(3);
  EXPECT_EQ(a, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(pool.ref_cnt(1), 1);
  auto b = pool.allocate(2);
  EXPECT_EQ(b, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_THROW(pool.allocate(1), kestrel::Error);
  pool.free({BlockPool::kNullBlock});  // ignored
  EXPECT_EQ(pool.num_free(), 0);
  pool.check_invariants();
}

TEST(BlockPool, PrefixHitsRefCountsAndFreeOrder) {
  // Block size 4: request A has 10 tokens -> blocks 1, 2 full (cached), 3 partial.
  BlockPool pool(11, true);
  const auto ta = iota_tokens(0, 10);
  std::vector<BlockHash> ha;
  extend_block_hashes(ta, 4, 0, ha);
  auto a = pool.allocate(3);
  ASSERT_EQ(a, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(pool.cache_block(a[0], ha[0]));
  EXPECT_TRUE(pool.cache_block(a[1], ha[1]));
  EXPECT_EQ(pool.lookup(ha[0]), std::optional<int32_t>(1));
  EXPECT_EQ(pool.lookup(ha[1]), std::optional<int32_t>(2));
  EXPECT_EQ(pool.num_cached_blocks(), 2);

  // Request B shares the first 8 tokens: two hits, ref counts 2, one new block.
  auto tb = iota_tokens(0, 8);
  tb.push_back(77);
  std::vector<BlockHash> hb;
  extend_block_hashes(tb, 4, 0, hb);
  EXPECT_EQ(hb[0], ha[0]);
  EXPECT_EQ(hb[1], ha[1]);
  pool.touch({*pool.lookup(hb[0]), *pool.lookup(hb[1])});
  EXPECT_EQ(pool.ref_cnt(1), 2);
  EXPECT_EQ(pool.ref_cnt(2), 2);
  auto b_new = pool.allocate(1);
  EXPECT_EQ(b_new, (std::vector<int32_t>{4}));
  pool.check_invariants();

  // Free A (blocks 1 2 3): 1 and 2 are still used by B, 3 (unhashed) goes to the head.
  pool.free(a);
  EXPECT_EQ(pool.ref_cnt(1), 1);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{3, 5, 6, 7, 8, 9, 10}));
  // Free B (1 2 4): reverse order; hashed 2, 1 go to the tail, unhashed 4 to the head.
  pool.free({1, 2, 4});
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{4, 3, 5, 6, 7, 8, 9, 10, 2, 1}));
  EXPECT_EQ(pool.num_free(), 10);
  // Freed cached blocks stay hashed and can be revived from the middle of the queue.
  EXPECT_TRUE(pool.is_cached(1));
  pool.touch({1});
  EXPECT_EQ(pool.ref_cnt(1), 1);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{4, 3, 5, 6, 7, 8, 9, 10, 2}));
  pool.free({1});
  pool.check_invariants();

  // LRU eviction: a request needing 9 blocks takes the head first; the ninth
  // pops block 2, evicting its hash; block 1 (tail) survives.
  auto c = pool.allocate(9);
  EXPECT_EQ(c, (std::vector<int32_t>{4, 3, 5, 6, 7, 8, 9, 10, 2}));
  EXPECT_FALSE(pool.lookup(ha[1]).has_value());
  EXPECT_EQ(pool.lookup(ha[0]), std::optional<int32_t>(1));
  EXPECT_FALSE(pool.is_cached(2));
  pool.check_invariants();
}

TEST(BlockPool, DuplicateHashKeepsTheFirstBlock) {
  BlockPool pool(4, true);
  const auto t = iota_tokens(0, 4);
  const BlockHash h = hash_block_tokens(nullptr, t.data(), 4, 0);
  auto a = pool.allocate(2);
  EXPECT_TRUE(pool.cache_block(a[0], h));
  EXPECT_FALSE(pool.cache_block(a[1], h));  // same tokens computed twice: not registered
  EXPECT_FALSE(pool.is_cached(a[1]));
  EXPECT_EQ(pool.lookup(h), std::optional<int32_t>(a[0]));
  pool.check_invariants();
}

TEST(BlockPool, ResetOnlyWhenNothingIsReferenced) {
  BlockPool pool(4, true);
  const auto t = iota_tokens(0, 4);
  const BlockHash h = hash_block_tokens(nullptr, t.data(), 4, 0);
  auto a = pool.allocate(1);
  pool.cache_block(a[0], h);
  EXPECT_FALSE(pool.reset_prefix_cache());
  EXPECT_TRUE(pool.lookup(h).has_value());
  pool.free(a);
  EXPECT_TRUE(pool.lookup(h).has_value());  // free but revivable
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_FALSE(pool.lookup(h).has_value());
  EXPECT_FALSE(pool.is_cached(a[0]));
  pool.check_invariants();
}

TEST(BlockPool, CachingDisabledNeverHits) {
  BlockPool pool(4, false);
  const auto t = iota_tokens(0, 4);
  const BlockHash h = hash_block_tokens(nullptr, t.data(), 4, 0);
  auto a = pool.allocate(1);
  EXPECT_FALSE(pool.cache_block(a[0], h));
  EXPECT_FALSE(pool.lookup(h).has_value());
}
