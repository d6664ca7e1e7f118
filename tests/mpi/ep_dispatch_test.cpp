// Expert parallelism's all-to-all token dispatcher under mpirun
// (tests/scripts/mpi_hier_a2a.sh, 2 and 4 ranks; parallel/ep_dispatch.h):
// every rank routes its own tokens (top-2 of 8 experts, some experts left
// empty), dispatches the permuted rows to the experts' ranks, applies each
// local expert there, and combines: the result equals applying every expert
// locally, bit for bit; the flat and the hierarchical row exchange (two
// "nodes" of two ranks) give the same bits; and combine is dispatch's
// adjoint (<dispatch(x), y> = <x, combine(y)>), so each serves as the
// other's backward. The all-gather dispatcher (parallel/ep_allgather.h)
// delivers the all-to-all's rows and combines back its bits, under random
// routings with empty experts, ranks that send some ranks nothing and an idle
// expert rank; every routed row comes back exactly once; and the bytes each
// dispatcher moves equal the closed forms (CountingGroup), the hierarchical
// exchange sending one inter-node message per node pair.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "comm/world.h"
#include "core/rng.h"
#include "mpi_testing.h"
#include "ops/moe.h"
#include "parallel/comm_counter.h"
#include "parallel/ep_allgather.h"
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

namespace {

// The raw bits of a tensor's elements as f32 (exact for f32 and bf16): equal vectors mean equal bits.
std::vector<uint32_t> bits(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();
  std::vector<uint32_t> b(f.size());
  if (!f.empty()) std::memcpy(b.data(), f.data(), f.size() * sizeof(float));
  return b;
}

// A random top-2 routing of this rank's tokens: rank 1 routes only to experts 0 and 1 (at ep 4 rank
// 0's: it sends ranks 1..3 nothing), no rank routes to experts 6 and 7 (an idle expert rank at ep
// 4, empty experts at ep 2); every rank its own token count, so the gathered blocks are padded.
Local random_tokens(int rank, uint64_t seed, DType dt) {
  Local l;
  const int64_t T = 3 + 4 * rank;
  l.x = Tensor::empty({T, kD}, DType::F32, MemCategory::Other);
  Philox p{seed, uint64_t(rank)};
  for (int64_t i = 0; i < l.x.numel(); ++i) l.x.set(i, 2 * p.uniform(uint64_t(i)) - 1);
  if (dt != DType::F32) l.x = l.x.to(dt, MemCategory::Other);
  const int32_t choices = rank == 1 ? 2 : 6;
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t a = int32_t(p.uniform(uint64_t(1000 + t)) * float(choices)) % choices;
    const int32_t b = (a + 1 + int32_t(p.uniform(uint64_t(2000 + t)) * float(choices - 1)) % (choices - 1)) % choices;
    idx.push_back(a);
    idx.push_back(b);
  }
  l.routing = ops::moe_routing(Tensor::from_host(idx, {T, kTopK}), kExperts);
  l.xs = Tensor::empty({l.routing.rows(), kD}, dt, MemCategory::Other);
  ops::moe_permute_fwd(l.x, l.routing, l.xs);
  return l;
}

}  // namespace

TEST(EpDispatch, AllGatherDeliversWhatAllToAllDelivers) {
  auto& g = kestrel::testing::world_group();
  const int n = g.size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  for (DType dt : {DType::F32, DType::BF16})
    for (uint64_t seed : {3, 11, 29}) {
      const std::string what = std::string(dtype_name(dt)) + " seed " + std::to_string(seed);
      const Local l = random_tokens(g.rank(), seed, dt);
      const EpLayout a2a = ep_dispatch_layout(g, l.routing.group_sizes, EpDispatcher::AllToAll);
      const EpLayout ag = ep_dispatch_layout(g, l.routing.group_sizes, EpDispatcher::AllGather);
      EXPECT_EQ(ag.dispatcher, EpDispatcher::AllGather);
      EXPECT_EQ(ag.send_rows, a2a.send_rows) << what;
      EXPECT_EQ(ag.recv_rows, a2a.recv_rows) << what;
      EXPECT_EQ(ag.recv_counts, a2a.recv_counts) << what;
      EXPECT_EQ(ag.local_group_sizes, a2a.local_group_sizes) << what;
      // Dispatch: the same rows in the same order, bit for bit.
      Tensor xa = ep_dispatch(g, a2a, l.xs, nullptr, MemCategory::Other);
      Tensor xg = ep_dispatch(g, ag, l.xs, nullptr, MemCategory::Other);
      EXPECT_EQ(bits(xg), bits(xa)) << what << ": dispatch";
      // Tokens conserved: every routed row reaches one expert rank and comes back once, unchanged.
      EXPECT_EQ(kestrel::testing::global_sum(g, double(ag.received())),
                kestrel::testing::global_sum(g, double(l.xs.size(0))))
          << what;
      EXPECT_EQ(bits(ep_combine(g, ag, xg, nullptr, MemCategory::Other)), bits(l.xs))
          << what << ": combine(dispatch(x)) is x";
      // Combine of the experts' outputs: the same bits, equal to every expert applied here.
      if (dt == DType::F32) {
        Tensor want = l.xs.clone();
        apply_groups(want, l.routing.group_sizes, 0);
        apply_groups(xa, a2a.local_group_sizes, g.rank() * a2a.experts_per_rank);
        apply_groups(xg, ag.local_group_sizes, g.rank() * ag.experts_per_rank);
        const Tensor ya = ep_combine(g, a2a, xa, nullptr, MemCategory::Other);
        const Tensor yg = ep_combine(g, ag, xg, nullptr, MemCategory::Other);
        EXPECT_EQ(bits(yg), bits(ya)) << what << ": combine";
        EXPECT_EQ(yg.to_float_vector(), want.to_float_vector()) << what;
      }
      // Adjoint: <dispatch(x), y> = <x, combine(y)> over the ranks (the backward of each is the other).
      Tensor y = Tensor::empty({ag.received(), kD}, DType::F32, MemCategory::Other);
      Philox p{seed + 77, uint64_t(g.rank())};
      for (int64_t i = 0; i < y.numel(); ++i) y.set(i, 2 * p.uniform(uint64_t(i)) - 1);
      const Tensor xs32 = l.xs.to(DType::F32, MemCategory::Other);
      const Tensor dx = ep_dispatch(g, ag, xs32, nullptr, MemCategory::Other);
      const Tensor cy = ep_combine(g, ag, y, nullptr, MemCategory::Other);
      using kestrel::testing::dot, kestrel::testing::global_sum;
      const double lhs = global_sum(g, dot(dx.to_float_vector(), y.to_float_vector()));
      const double rhs = global_sum(g, dot(xs32.to_float_vector(), cy.to_float_vector()));
      EXPECT_NEAR(lhs, rhs, 1e-12 * std::max(1.0, std::abs(lhs))) << what;
    }
}

TEST(EpDispatch, AllGatherRefusesTheHierarchicalExchange) {
  comm::World& world = *comm::World::current();
  auto& g = *world.group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const comm::HierarchicalA2a hier(world, world.group());
  const Local l = random_tokens(g.rank(), 3, DType::F32);
  const EpLayout ag = ep_dispatch_layout(g, l.routing.group_sizes, EpDispatcher::AllGather);
  try {
    ep_dispatch(g, ag, l.xs, &hier, MemCategory::Other);
    ADD_FAILURE() << "the allgather dispatcher took a hierarchical exchange";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("moe_token_dispatcher_type=alltoall"), std::string::npos) << e.what();
  }
}

// Bytes each dispatcher sends per rank for one dispatch + combine (the ring cost model of
// parallel/comm_counter.h; b = 4 bytes, D = kD, k = E / ep experts per rank, Nb = the largest rank's rows):
//   alltoall:  all_to_all of the counts (ep-1) k 8  +  rows to other ranks x D b (dispatch) + rows
//              from other ranks x D b (combine)
//   allgather: all_gather of the counts (ep-1) E 8  +  (ep-1) Nb D b (all-gather) + (ep-1) Nb D b
//              (reduce-scatter)
// and the hierarchical exchange's inter-node traffic: one message per other node from each node's
// leader, carrying what its node's ranks send that node's ranks, against one per remote rank flat.
TEST(EpDispatch, BytesEqualTheFormulas) {
  comm::World& world = *comm::World::current();
  const int n = world.group()->size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  CountingGroup g(world.group());
  const int me = g.rank();
  const Local l = random_tokens(me, 17, DType::F32);
  const int64_t E = kExperts, k = E / n, b = 4, D = kD;
  for (EpDispatcher d : {EpDispatcher::AllToAll, EpDispatcher::AllGather}) {
    g.reset();
    const EpLayout L = ep_dispatch_layout(g, l.routing.group_sizes, d);
    const Tensor xr = ep_dispatch(g, L, l.xs, nullptr, MemCategory::Other);
    ep_combine(g, L, xr, nullptr, MemCategory::Other);
    const CommStats& s = g.stats();
    double want = 0;
    if (d == EpDispatcher::AllToAll) {
      double rows_out = 0, rows_in = 0;
      for (int j = 0; j < n; ++j)
        if (j != me) rows_out += double(L.send_rows[size_t(j)]), rows_in += double(L.recv_rows[size_t(j)]);
      want = double((n - 1) * k * 8) + (rows_out + rows_in) * double(D * b);
      EXPECT_EQ(s.of(CollectiveKind::AllToAll).calls, 3);
      EXPECT_EQ(s.of(CollectiveKind::AllToAll).wire_bytes, want);
    } else {
      want = double((n - 1) * E * 8) + 2.0 * double((n - 1) * L.block_rows * D * b);
      EXPECT_EQ(s.of(CollectiveKind::AllGather).calls, 2);
      EXPECT_EQ(s.of(CollectiveKind::ReduceScatter).calls, 1);
      EXPECT_EQ(s.of(CollectiveKind::AllGather).wire_bytes + s.of(CollectiveKind::ReduceScatter).wire_bytes, want);
    }
    EXPECT_EQ(s.total_wire_bytes(), want) << (d == EpDispatcher::AllToAll ? "alltoall" : "allgather");
  }
  // Hierarchical vs flat over two "nodes": messages and bytes crossing nodes for the dispatch's exchange.
  setenv("KESTREL_TEST_NODES", n == 4 ? "0,0,1,1" : "0,1", 1);
  const comm::HierarchicalA2a hier(world, world.group());
  unsetenv("KESTREL_TEST_NODES");
  const EpLayout L = ep_dispatch_layout(g, l.routing.group_sizes);
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) sc[size_t(j)] = L.send_rows[size_t(j)] * D, rc[size_t(j)] = L.recv_rows[size_t(j)] * D;
  Tensor recv = Tensor::empty({L.received(), D}, DType::F32, MemCategory::Other);
  comm::A2aTraffic h;
  hier.all_to_allv(l.xs, sc, recv, rc, &h);
  const comm::A2aTraffic flat = comm::flat_a2a_traffic(hier.node_of(), me, sc, DType::F32);
  // Node-level counts: elements node a's ranks send node c's ranks, all gathered.
  std::vector<int64_t> all(size_t(n * n));
  world.group()->all_gather(sc.data(), all.data(), n, DType::I64);
  const std::vector<int>& node = hier.node_of();
  int64_t want_msgs = 0;
  double want_bytes = 0;
  const bool leader = std::find(node.begin(), node.end(), node[size_t(me)]) - node.begin() == me;
  for (int c = 0; c < hier.nodes() && leader; ++c) {
    if (c == node[size_t(me)]) continue;
    int64_t e = 0;
    for (int s = 0; s < n; ++s)
      for (int t = 0; t < n; ++t)
        if (node[size_t(s)] == node[size_t(me)] && node[size_t(t)] == c) e += all[size_t(s * n + t)];
    want_msgs += e > 0;
    want_bytes += double(e * b);
  }
  EXPECT_EQ(h.inter_node_messages, want_msgs);
  EXPECT_EQ(h.inter_node_bytes, want_bytes);
  int64_t flat_msgs = 0;
  for (int t = 0; t < n; ++t) flat_msgs += node[size_t(t)] != node[size_t(me)] && sc[size_t(t)] > 0;
  EXPECT_EQ(flat.inter_node_messages, flat_msgs);
  std::printf("[ep bytes] rank %d: flat %lld inter-node messages (%.0f B), hierarchical %lld (%.0f B)\n", me,
              (long long)flat.inter_node_messages, flat.inter_node_bytes, (long long)h.inter_node_messages,
              h.inter_node_bytes);
}
