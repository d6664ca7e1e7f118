// ops/moe.h, the parts the training engine and router replay lean on: the
// aux-loss-free expert-bias update (against the reference and Megatron's
// formula by hand), replayed rows without a record routed as without replay,
// and the routing's kept-token counts beside its padded group sizes.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/moe.h"
#include "ops/ref/moe_ref.h"

namespace kestrel {
namespace {

using namespace testing;

TEST(MoeExpertBias, UpdateMovesAgainstTheLoadAsMegatron) {
  // load 3, 1, 2, 2 (mean 2): expert 0 is overloaded (bias down), expert 1
  // underloaded (up), experts 2 and 3 at the mean (sign 0: unchanged).
  Tensor bias = make_tensor({0.5, -0.25, 0.0, 1.0}, {4}, DType::F32);
  ops::moe_update_expert_bias(bias, {3, 1, 2, 2}, 1e-3);
  const std::vector<double> got = values(bias);
  EXPECT_EQ(got[0], double(0.5f - 1e-3f));
  EXPECT_EQ(got[1], double(-0.25f + 1e-3f));
  EXPECT_EQ(got[2], 0.0);
  EXPECT_EQ(got[3], 1.0);
}

TEST(MoeExpertBias, KernelMatchesReference) {
  const int64_t E = 13;
  std::vector<double> b0 = round_to(randn(E, 71, 0.1), DType::F32);
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) load[size_t(e)] = (e * 7919) % 23;
  Tensor bias = make_tensor(b0, {E}, DType::F32);
  ops::moe_update_expert_bias(bias, load, 2.5e-3);
  std::vector<double> want = b0;
  ops::ref::moe_update_expert_bias(want.data(), load.data(), E, 2.5e-3);
  EXPECT_TRUE(all_close(values(bias), want, {1e-7, 1e-6}, "bias"));
}

TEST(MoeExpertBias, RejectsBadRatesAndShapes) {
  Tensor bias = make_tensor({0, 0}, {2}, DType::F32);
  EXPECT_ANY_THROW(ops::moe_update_expert_bias(bias, {1, 2, 3}, 1e-3));
  EXPECT_ANY_THROW(ops::moe_update_expert_bias(bias, {1, 2}, -1.0));
}

TEST(MoeReplay, RowsWithoutARecordAreRouted) {
  ops::MoeRouterConfig c;
  c.num_experts = 6;
  c.top_k = 2;
  c.norm_topk_prob = true;
  const int64_t T = 3;
  const std::vector<double> lg = round_to(randn(T * 6, 5), DType::F32);
  // Routed: the router's own choice of every row.
  Tensor logits = make_tensor(lg, {T, 6}, DType::F32);
  Tensor idx = Tensor::empty({T, 2}, DType::I32), w = Tensor::empty({T, 2}, DType::F32);
  Tensor sc = Tensor::empty({T, 6}, DType::F32);
  ops::moe_router_fwd(logits, nullptr, c, idx, w, sc);
  const std::vector<int32_t> routed = idx.to_host<int32_t>();
  // Replayed: row 0 forced to experts 4, 5; row 1 has no record (-1, -1); row 2 replays its own choice.
  std::vector<int32_t> rep = {4, 5, -1, -1, routed[4], routed[5]};
  Tensor ridx = Tensor::from_host(rep, {T, 2});
  Tensor rw = Tensor::empty({T, 2}, DType::F32);
  ops::moe_router_fwd(logits, nullptr, c, ridx, rw, sc, /*replay=*/true);
  const std::vector<int32_t> got = ridx.to_host<int32_t>();
  EXPECT_EQ(got[0], 4);
  EXPECT_EQ(got[1], 5);
  EXPECT_EQ(got[2], routed[2]) << "an unrecorded row takes the router's choice";
  EXPECT_EQ(got[3], routed[3]);
  const std::vector<double> wv = values(rw), wr = values(w);
  EXPECT_EQ(wv[2], wr[2]);
  EXPECT_EQ(wv[4], wr[4]);
  EXPECT_NEAR(wv[0] + wv[1], 1.0, 1e-6);  // normalised over the replayed experts
}

TEST(MoeRouting, KeptCountsBesidePaddedGroups) {
  // Token slots: expert 0 twice, expert 2 once, one dropped slot.
  Tensor idx = Tensor::from_host(std::vector<int32_t>{0, 2, 0, -1}, {2, 2});
  const ops::MoeRouting r = ops::moe_routing(idx, 3, /*pad_to=*/2);
  EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(r.group_sizes, (std::vector<int64_t>{2, 2, 2}));
  const ops::MoeRouting u = ops::moe_routing(idx, 3);
  EXPECT_EQ(u.tokens_per_expert, u.group_sizes);
}

}  // namespace
}  // namespace kestrel
