// The adjoint property behind tensor parallelism's conjugate mappings: for a
// communication pattern A (forward) and the collective used as its backward,
// <A x, y> == <x, A^T y> with the distributed vectors viewed as one global
// vector (the concatenation of every rank's buffer; a replicated vector counts
// once). If a backward were not the transpose of its forward, gradients of
// TP/SP layers would be wrong while the forward looked right.
#include <cmath>

#include "mpi_testing.h"

using namespace kestrel;
using namespace kestrel::comm;
using kestrel::testing::dot;
using kestrel::testing::global_sum;
using kestrel::testing::uniform_value;
using kestrel::testing::world_group;

namespace {

std::vector<float> random_vec(uint64_t seed, int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = uniform_value(seed, rank, i);
  return v;
}

// Pure data movement (gather, all-to-all) is exact, so both sides agree to
// double rounding; sums computed in f32 by a reduction round each element
// (relative 2^-24 per addition), so they get that much of `scale` = sum |terms|.
void expect_adjoint(double lhs, double rhs, const char* what, double scale, bool f32_reduction) {
  const double tol = (f32_reduction ? 1e-6 : 1e-12) * (1.0 + scale);
  EXPECT_NEAR(lhs, rhs, tol) << what << ": <Ax,y>=" << lhs << " <x,A^T y>=" << rhs;
}

double abs_dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) * double(b[i]));
  return s;
}

}  // namespace

// gather_from_sequence_parallel_region: all-gather forward, reduce-scatter backward.
TEST(Adjoint, AllGatherAndReduceScatter) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  const int64_t m = 257;
  const auto x = random_vec(1, r, m);      // this rank's shard
  const auto y = random_vec(2, r, n * m);  // this rank's copy of the gathered space
  std::vector<float> ax(n * m), aty(m);
  g.all_gather(x.data(), ax.data(), m, DType::F32);
  g.reduce_scatter(y.data(), aty.data(), m, DType::F32, ReduceOp::Sum);
  expect_adjoint(global_sum(g, dot(ax, y)), global_sum(g, dot(x, aty)), "all_gather vs reduce_scatter",
                 global_sum(g, abs_dot(ax, y)), true);
}

// Broadcast from root; its transpose is a sum-reduce to the root (zero elsewhere).
TEST(Adjoint, BroadcastAndReduceToRoot) {
  auto& g = world_group();
  const int r = g.rank();
  const int64_t m = 300;
  for (int root = 0; root < g.size(); ++root) {
    const auto x = random_vec(3, r, m);  // only the root's buffer is an input of A
    const auto y = random_vec(4, r, m);
    std::vector<float> ax = x;
    g.broadcast(ax.data(), m, DType::F32, root);
    std::vector<float> aty = y;
    g.all_reduce(aty.data(), m, DType::F32, ReduceOp::Sum);
    if (r != root) std::fill(aty.begin(), aty.end(), 0.0f);
    expect_adjoint(global_sum(g, dot(ax, y)), global_sum(g, dot(x, aty)), "broadcast vs reduce-to-root",
                   global_sum(g, abs_dot(ax, y)), true);
  }
}

// all_to_all is a block transpose; its adjoint is all_to_all again.
TEST(Adjoint, AllToAllIsSelfAdjoint) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  const int64_t m = 64;
  const auto x = random_vec(5, r, n * m), y = random_vec(6, r, n * m);
  std::vector<float> ax(n * m), aty(n * m);
  g.all_to_all(x.data(), ax.data(), m, DType::F32);
  g.all_to_all(y.data(), aty.data(), m, DType::F32);
  expect_adjoint(global_sum(g, dot(ax, y)), global_sum(g, dot(x, aty)), "all_to_all",
                 global_sum(g, abs_dot(ax, y)), false);
}

// all_to_allv with in/out counts swapped is the adjoint (the MoE dispatcher's backward).
TEST(Adjoint, AllToAllvWithSwappedCounts) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  auto count = [](int src, int dst) { return int64_t(5 + (3 * src + dst) % 4); };
  std::vector<int64_t> sc(n), rc(n);
  int64_t ns = 0, nr = 0;
  for (int q = 0; q < n; ++q) {
    ns += sc[q] = count(r, q);
    nr += rc[q] = count(q, r);
  }
  const auto x = random_vec(7, r, ns), y = random_vec(8, r, nr);
  std::vector<float> ax(nr), aty(ns);
  g.all_to_allv(x.data(), sc, ax.data(), rc, DType::F32);
  g.all_to_allv(y.data(), rc, aty.data(), sc, DType::F32);
  expect_adjoint(global_sum(g, dot(ax, y)), global_sum(g, dot(x, aty)), "all_to_allv",
                 global_sum(g, abs_dot(ax, y)), false);
}

// copy_to_tensor_model_parallel_region: identity forward (a replicated x, one
// logical vector, fanned out to every rank), all-reduce backward.
TEST(Adjoint, IdentityForwardAllReduceBackward) {
  auto& g = world_group();
  const int r = g.rank();
  const int64_t m = 500;
  const auto x = random_vec(9, /*same on every rank*/ 0, m);
  const auto y = random_vec(10, r, m);
  std::vector<float> aty = y;
  g.all_reduce(aty.data(), m, DType::F32, ReduceOp::Sum);
  const double lhs = global_sum(g, dot(x, y));  // <A x, y>: every rank's copy of x against its y
  const double rhs = dot(x, aty);               // x counted once
  expect_adjoint(lhs, rhs, "identity vs all_reduce", global_sum(g, abs_dot(x, y)), true);
}

// reduce_from_tensor_model_parallel_region: all-reduce forward (per-rank
// partial sums to one replicated vector), identity backward.
TEST(Adjoint, AllReduceForwardIdentityBackward) {
  auto& g = world_group();
  const int r = g.rank();
  const int64_t m = 500;
  const auto x = random_vec(11, r, m);
  const auto y = random_vec(12, /*same on every rank*/ 0, m);
  std::vector<float> ax = x;
  g.all_reduce(ax.data(), m, DType::F32, ReduceOp::Sum);
  const double lhs = dot(ax, y);                // the replicated output counted once
  const double rhs = global_sum(g, dot(x, y));  // A^T y = y on every rank
  expect_adjoint(lhs, rhs, "all_reduce vs identity", global_sum(g, abs_dot(x, y)), true);
}
