// The epoch-aware loader: seeded shuffles, drop_last, save/restore of the position.
#include <algorithm>
#include <numeric>

#include "common/testing.h"
#include "data/loader.h"

namespace kestrel::data {
namespace {

TEST(EpochLoader, ShuffleIsASeededPermutationPerEpoch) {
  EpochLoader a(10, 3, true, 42), b(10, 3, true, 42), c(10, 3, true, 43);
  const auto e0 = a.epoch_order(0), e1 = a.epoch_order(1);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(10);
  std::iota(iota.begin(), iota.end(), int64_t(0));
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(e0, iota);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(b.epoch_order(1), e1);
  EXPECT_NE(c.epoch_order(0), e0);
  EXPECT_EQ(EpochLoader(10, 3, false, 42).epoch_order(5), iota);
}

TEST(EpochLoader, DropLastAndEpochRollover) {
  EpochLoader l(10, 3, true, 7);
  EXPECT_EQ(l.batches_per_epoch(), 3);
  const auto e0 = l.epoch_order(0), e1 = l.epoch_order(1);
  std::vector<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    auto b = l.next_batch();
    ASSERT_EQ(b.size(), 3u);
    seen.insert(seen.end(), b.begin(), b.end());
  }
  EXPECT_EQ(seen, std::vector<int64_t>(e0.begin(), e0.begin() + 9));
  EXPECT_EQ(l.epoch(), 0);
  auto b = l.next_batch();  // the 10th row of epoch 0 is dropped
  EXPECT_EQ(l.epoch(), 1);
  EXPECT_EQ(b, std::vector<int64_t>(e1.begin(), e1.begin() + 3));
}

TEST(EpochLoader, RestoreContinuesExactly) {
  EpochLoader a(11, 4, true, 5);
  for (int i = 0; i < 4; ++i) a.next_batch();
  const LoaderState st = a.state();
  auto j = st.to_json();
  EpochLoader b(11, 4, true, 5);
  ASSERT_TRUE(b.restore(LoaderState::from_json(j, "x").value(), "x").is_ok());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(a.next_batch(), b.next_batch()) << i;
  EpochLoader other(11, 4, true, 6);
  auto s = other.restore(st, "ckpt/trainer_state.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("ckpt/trainer_state.json"), std::string::npos);
  EXPECT_NE(s.message().find("seed 5"), std::string::npos);
  EXPECT_FALSE(LoaderState::from_json(nlohmann::json{{"seed", 1}}, "x").is_ok());
  // A corrupt state with a float where an integer belongs is refused by name, not converted.
  nlohmann::json bad = st.to_json();
  bad["index"] = 1e300;
  auto r = LoaderState::from_json(bad, "ckpt/trainer_state.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("ckpt/trainer_state.json: data-loader state key 'index' must be an integer"),
            std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kestrel::data
