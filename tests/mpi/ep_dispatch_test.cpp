// Expert parallelism's all-to-all token dispatcher under mpirun
// (tests/scripts/mpi_hier_a2a.sh, 2 and 4 ranks; parallel/ep_dispatch.h):
// every rank routes its own tokens (top-2 of 8 experts, some experts left
// empty), dispatches the permuted rows to the experts' ranks, applies each
// local expert there, and combines: the result equals applying every expert
// locally, bit for bit; the flat and the hierarchical row exchange (two
// "nodes" of two ranks) give the same bits; and combine is dispatch's
// adjoint (<dispatch(x), y> = <x, combine(y)>), so each serves as the
// other's backward.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "comm/world.h"
#include "core/rng.h"
#include "mpi_testing.h"
#include "ops/moe.h"
#include "parallel/ep_dispatch.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {

constexpr int64_t kExperts = 8, kTopK = 2, kD = 6;

// Expert e's function on one row: exact and the same wherever it runs.
void apply_expert(int64_t e, Tensor row) {
  for (int64_t c = 0; c < row.numel(); ++c) row.set(c, row.get(c) * float(1 + e) + 0.25f * float(e));
}

struct Local {
  Tensor x;                 // [T, D]
  ops::MoeRouting routing;  // over all experts
  Tensor xs;                // [N, D] expert-major
};

Local local_tokens(int rank, uint64_t seed) {
  Local l;
  const int64_t T = 5 + 3 * rank;  // every rank its own count
  l.x = Tensor::empty({T, kD}, DType::F32, MemCategory::Other);
  Philox p{seed, uint64_t(rank)};
  for (int64_t i = 0; i < l.x.numel(); ++i) l.x.set(i, 2 * p.uniform(uint64_t(i)) - 1);
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < T; ++t) {
    // Experts 6 and 7 get nothing on any rank: empty groups and an idle expert rank at ep 4.
    const int32_t a = int32_t((t * 3 + rank) % 6), b = int32_t((a + 1 + t % 4) % 6);
    idx.push_back(a);
    idx.push_back(b == a ? int32_t((a + 1) % 6) : b);
  }
  l.routing = ops::moe_routing(Tensor::from_host(idx, {T, kTopK}), kExperts);
  l.xs = Tensor::empty({l.routing.rows(), kD}, DType::F32, MemCategory::Other);
  ops::moe_permute_fwd(l.x, l.routing, l.xs);
  return l;
}

// Applies the experts to rows grouped as `sizes` (experts first_expert, first_expert + 1, ...), in place.
void apply_groups(Tensor& rows, const std::vector<int64_t>& sizes, int64_t first_expert) {
  int64_t r = 0;
  for (size_t e = 0; e < sizes.size(); ++e)
    for (int64_t i = 0; i < sizes[e]; ++i, ++r) apply_expert(first_expert + int64_t(e), rows.slice_rows(r, r + 1));
}

}  // namespace

TEST(EpDispatch, AllToAllEqualsLocalExpertsAndCombineIsTheAdjoint) {
  comm::World& world = *comm::World::current();
  auto& g = *world.group();
  const int n = g.size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  setenv("KESTREL_TEST_NODES", n == 4 ? "0,0,1,1" : "0,1", 1);
  const comm::HierarchicalA2a hier(world, world.group());
  unsetenv("KESTREL_TEST_NODES");
  const Local l = local_tokens(g.rank(), 5);
  // One process: every expert here.
  Tensor want = l.xs.clone();
  apply_groups(want, l.routing.group_sizes, 0);
  for (const comm::HierarchicalA2a* h : {static_cast<const comm::HierarchicalA2a*>(nullptr), &hier}) {
    const EpLayout L = ep_dispatch_layout(g, l.routing.group_sizes);
    EXPECT_EQ(L.experts_per_rank, kExperts / n);
    Tensor xr = ep_dispatch(g, L, l.xs, h, MemCategory::Other);
    apply_groups(xr, L.local_group_sizes, g.rank() * L.experts_per_rank);
    const Tensor got = ep_combine(g, L, xr, h, MemCategory::Other);
    EXPECT_EQ(got.to_float_vector(), want.to_float_vector()) << (h ? "hierarchical" : "flat");
    // Adjoint: <dispatch(x), y> over the ranks equals <x, combine(y)>.
    Tensor y = Tensor::empty({L.received(), kD}, DType::F32, MemCategory::Other);
    Philox p{77, uint64_t(g.rank())};
    for (int64_t i = 0; i < y.numel(); ++i) y.set(i, 2 * p.uniform(uint64_t(i)) - 1);
    const Tensor dx = ep_dispatch(g, L, l.xs, h, MemCategory::Other), cy = ep_combine(g, L, y, h, MemCategory::Other);
    const double lhs = kestrel::testing::global_sum(g, kestrel::testing::dot(dx.to_float_vector(), y.to_float_vector()));
    const double rhs =
        kestrel::testing::global_sum(g, kestrel::testing::dot(l.xs.to_float_vector(), cy.to_float_vector()));
    EXPECT_NEAR(lhs, rhs, 1e-12 * std::max(1.0, std::abs(lhs)));
  }
}

TEST(EpDispatch, ExpertsMustSplitOverTheGroup) {
  auto& g = kestrel::testing::world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  try {
    ep_dispatch_layout(g, std::vector<int64_t>(size_t(2 * g.size() + 1), 1));
    ADD_FAILURE() << "an expert count the group does not divide was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expert_model_parallel_size"), std::string::npos) << e.what();
  }
}
