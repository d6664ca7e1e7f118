// Data-parallel gradient reduction under mpirun (world group as the dp group):
// bucketed all-reduce launched from the backward hook, the distributed
// optimizer's reduce-to-owners and parameter all-gather, and the global grad
// norm, against values every rank computes for every other rank.
#include <cmath>

#include "ops/optim_ops.h"
#include "parallel/data_parallel.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::parallel;
using namespace kestrel::testing;

namespace {

struct Params {
  std::vector<Tensor> w, g;
  std::vector<DpParam> dp;
};
// Three parameters registered in "model order"; stage = the layer that finishes them.
Params make_params() {
  Params p;
  const Shape shapes[] = {{5}, {7, 3}, {300}};
  for (int i = 0; i < 3; ++i) {
    p.w.push_back(rand_full(shapes[i], 100 + i));
    p.g.push_back(Tensor());
  }
  for (int i = 0; i < 3; ++i) p.dp.push_back({"p" + std::to_string(i), &p.w[size_t(i)], &p.g[size_t(i)], i, true});
  return p;
}
float grad_value(int rank, int param, int64_t i) { return uniform_value(900 + uint64_t(param), rank, i); }

}  // namespace

class DpGrads : public ::testing::TestWithParam<bool> {};  // param: distributed optimizer

TEST_P(DpGrads, BucketedReductionFromHook) {
  auto& g = world_group();
  const int n = g.size();
  Params p = make_params();
  DpOptions o;
  o.bucket_bytes = 64;  // several buckets
  o.distributed_optimizer = GetParam();
  DataParallel dp(p.dp, g, o);
  EXPECT_GE(dp.buckets().size(), 2u);
  EXPECT_EQ(dp.flat_params().front().name, "p2");  // reverse registration order
  EXPECT_EQ(dp.padded_numel() % n, 0);
  for (int i = 0; i < 3; ++i)
    for (int64_t k = 0; k < p.g[size_t(i)].numel(); ++k) p.g[size_t(i)].set(k, grad_value(g.rank(), i, k));
  dp.start_grad_sync();
  for (int stage = 2; stage >= 0; --stage) dp.grads_ready(stage);  // backward order
  for (const auto& b : dp.buckets()) EXPECT_TRUE(b.launched);
  dp.finish_grad_sync();

  auto [lo, hi] = dp.owned_range();
  double sq = 0;
  double max_err = 0;
  for (size_t fi = 0; fi < dp.flat_params().size(); ++fi) {
    const int param = 2 - int(fi);
    const int64_t off = dp.offsets()[fi];
    for (int64_t k = 0; k < p.g[size_t(param)].numel(); ++k) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += grad_value(r, param, k) / double(n);
      sq += want * want;
      if (off + k >= lo && off + k < hi) max_err = std::max(max_err, std::abs(p.g[size_t(param)].get(k) - want));
    }
  }
  EXPECT_LE(max_err, 1e-6);
  EXPECT_NEAR(dp.grad_norm(nullptr), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  dp.gather_grads();
  double err_all = 0;
  for (int param = 0; param < 3; ++param)
    for (int64_t k = 0; k < p.g[size_t(param)].numel(); ++k) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += grad_value(r, param, k) / double(n);
      err_all = std::max(err_all, std::abs(p.g[size_t(param)].get(k) - want));
    }
  EXPECT_LE(err_all, 1e-6);
}

TEST_P(DpGrads, ParamGatherFromOwners) {
  auto& g = world_group();
  Params p = make_params();
  DpOptions o;
  o.distributed_optimizer = GetParam();
  DataParallel dp(p.dp, g, o);
  // Each owner writes its range (as the optimizer step would); the gather spreads it.
  auto [lo, hi] = dp.owned_range();
  for (size_t fi = 0; fi < dp.flat_params().size(); ++fi) {
    Tensor& w = *dp.flat_params()[fi].weight;
    for (int64_t k = 0; k < w.numel(); ++k)
      if (dp.offsets()[fi] + k >= lo && dp.offsets()[fi] + k < hi) w.set(k, float(dp.offsets()[fi] + k));
  }
  dp.gather_params();
  if (GetParam()) {
    for (size_t fi = 0; fi < dp.flat_params().size(); ++fi) {
      const Tensor& w = *dp.flat_params()[fi].weight;
      for (int64_t k = 0; k < w.numel(); ++k) EXPECT_EQ(w.get(k), float(dp.offsets()[fi] + k));
    }
  }
}

// The norm is ops::sum_squares per counted parameter segment of the owned
// range, in flat order, summed over dp in rank order (distributed optimizer);
// the clip multiplies the owned range by the f32 coefficient. Bit for bit.
TEST_P(DpGrads, NormAndClipThroughOps) {
  auto& g = world_group();
  Params p = make_params();
  p.dp[1].count_in_norm = false;  // as a tensor-parallel duplicate
  DpOptions o;
  o.distributed_optimizer = GetParam();
  DataParallel dp(p.dp, g, o);
  for (int i = 0; i < 3; ++i)
    for (int64_t k = 0; k < p.g[size_t(i)].numel(); ++k) p.g[size_t(i)].set(k, 3.f * grad_value(g.rank(), i, k));
  dp.finish_grad_sync();
  auto [lo, hi] = dp.owned_range();
  double sq = 0;
  for (size_t fi = 0; fi < dp.flat_params().size(); ++fi) {
    if (!dp.flat_params()[fi].count_in_norm) continue;
    const int64_t a = std::max(lo, dp.offsets()[fi]), b = std::min(hi, dp.offsets()[fi + 1]);
    if (a < b) sq += ops::sum_squares(dp.grad_buffer().slice_rows(a, b));
  }
  if (GetParam()) sq = sum_over(g, sq);
  const double norm = std::sqrt(sq);
  EXPECT_EQ(dp.grad_norm(nullptr), norm);

  const std::vector<float> before = dp.grad_buffer().to_host<float>();
  const double max_norm = norm / 4;
  EXPECT_EQ(dp.clip_grad_norm(max_norm, nullptr), norm);
  const float coef = float(max_norm / (norm + 1e-6));
  const std::vector<float> after = dp.grad_buffer().to_host<float>();
  for (int64_t k = 0; k < int64_t(before.size()); ++k) {
    const float want = k >= lo && k < hi ? before[size_t(k)] * coef : before[size_t(k)];
    ASSERT_EQ(after[size_t(k)], want) << "flat element " << k << " (owned [" << lo << ", " << hi << "))";
  }
}

INSTANTIATE_TEST_SUITE_P(Dp, DpGrads, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "DistributedOptimizer" : "AllReduce"; });
