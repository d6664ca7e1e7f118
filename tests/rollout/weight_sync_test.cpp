// rollout/weight_sync.h in one process: the bucket packing and the checksum's
// definition (the transfer itself needs two ranks: tests/mpi/weight_sync_test.cpp).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include "rollout/weight_sync.h"

using namespace kestrel;
using namespace kestrel::rollout;

namespace {

std::vector<std::vector<int64_t>> buckets_of(const std::vector<WeightBucket>& plan) {
  std::vector<std::vector<int64_t>> out;  // per bucket: first, count, bytes
  for (const WeightBucket& b : plan) out.push_back({b.first, b.count, b.bytes});
  return out;
}

model::Param param(const std::string& name, Tensor w) {
  model::Param p;
  p.name = name;
  p.weight = std::move(w);
  return p;
}

}  // namespace

TEST(WeightSyncPlan, GreedyWholeTensors) {
  // 40 + 50 fit in 100; 30 would make 120, so a new bucket; 70 fits with 30.
  EXPECT_EQ(buckets_of(plan_weight_buckets({40, 50, 30, 70}, 100)),
            (std::vector<std::vector<int64_t>>{{0, 2, 90}, {2, 2, 100}}));
  // Exactly full stays one bucket.
  EXPECT_EQ(buckets_of(plan_weight_buckets({50, 50}, 100)), (std::vector<std::vector<int64_t>>{{0, 2, 100}}));
  EXPECT_TRUE(plan_weight_buckets({}, 100).empty());
}

TEST(WeightSyncPlan, OversizedTensorTravelsAlone) {
  // 250 > 100: closes the bucket before it and is closed by the next tensor,
  // even a zero-byte one.
  EXPECT_EQ(buckets_of(plan_weight_buckets({10, 250, 0, 20, 250}, 100)),
            (std::vector<std::vector<int64_t>>{{0, 1, 10}, {1, 1, 250}, {2, 2, 20}, {4, 1, 250}}));
  // Buckets of one byte: every 4-byte tensor alone, and the zero-byte tensor
  // after one starts a bucket of its own (an overfull bucket takes nothing more).
  EXPECT_EQ(buckets_of(plan_weight_buckets({0, 4, 0, 4}, 1)),
            (std::vector<std::vector<int64_t>>{{0, 1, 0}, {1, 1, 4}, {2, 1, 0}, {3, 1, 4}}));
}

TEST(WeightSyncPlan, RejectsBadSizes) {
  EXPECT_THROW(plan_weight_buckets({1}, 0), Error);
  EXPECT_THROW(plan_weight_buckets({-1}, 10), Error);
}

TEST(WeightSyncChecksum, EmptyListIsXxh3OfNothing) {
  // XXH3-64 (seed 0) of zero bytes, the published value of xxHash's sanity test.
  EXPECT_EQ(weights_checksum(std::vector<const model::Param*>{}), 0x2D06800538D394C2ull);
}

TEST(WeightSyncChecksum, HashOfPerTensorDigests) {
  model::Param a = param("a", Tensor::from_vector({1.f, 2.f, 3.f}, {3}));
  model::Param b = param("b", Tensor::from_vector({-0.5f, 0.25f}, {2, 1}).to(DType::BF16));
  model::Param absent = param("absent", Tensor());  // undefined: skipped
  // The bytes spelled out: f32 1, 2, 3 and bf16 -0.5, 0.25 (little-endian).
  const uint8_t a_bytes[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40};
  const uint8_t b_bytes[] = {0x00, 0xbf, 0x80, 0x3e};
  const uint64_t digests[] = {XXH3_64bits(a_bytes, sizeof(a_bytes)), XXH3_64bits(b_bytes, sizeof(b_bytes))};
  const uint64_t want = XXH3_64bits(digests, sizeof(digests));
  EXPECT_EQ(weights_checksum(std::vector<const model::Param*>{&a, &absent, &b}), want);
  EXPECT_EQ(weights_checksum(std::vector<model::Param*>{&a, &b}), want);
  // Order matters, and one changed bit changes it.
  EXPECT_NE(weights_checksum(std::vector<const model::Param*>{&b, &a}), want);
  a.weight.set(1, 2.0000002f);
  EXPECT_NE(weights_checksum(std::vector<const model::Param*>{&a, &b}), want);
}
