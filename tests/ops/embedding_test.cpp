// ops::embedding: lookup and scatter-add gradient against the double
// reference, vocab-parallel shards, special values, accumulate semantics.
#include "ops/embedding.h"

#include <gtest/gtest.h>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/ref/embedding_ref.h"

namespace kestrel {
namespace {

using namespace testing;

// Ids with repeats (scatter conflicts) and, for shards, ids owned elsewhere.
std::vector<int32_t> make_id_list(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ids[size_t(t)] = int32_t(philox4x32(uint64_t(t), seed, 7)[0] % uint32_t(vocab));
  if (n > 2) ids[size_t(n - 1)] = ids[0];
  return ids;
}

TEST(Embedding, ForwardMatchesReferenceWithShards) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [n, V, D] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 5}, {9, 11, 17}, {40, 50, 64}}) {
        SCOPED_TRACE(case_name(dev, dt) + " n=" + std::to_string(n) + " V=" + std::to_string(V) +
                     " D=" + std::to_string(D));
        const auto ids = make_id_list(n, V, 1);
        const auto table = round_to(randn(V * D, 2), dt);
        Tensor idt = make_ids(ids, dev), tab = make_tensor(table, {V, D}, dt, dev);
        Tensor y = nan_tensor({n, D}, dt, dev);
        ops::embedding_fwd(idt, tab, y);
        std::vector<double> want(size_t(n * D));
        ops::ref::embedding_fwd<double>(ids.data(), table.data(), want.data(), n, V, D, 0);
        EXPECT_TRUE(close_for(dt, values(y), want, "y"));

        // Two vocab shards [0, s) and [s, V): their outputs sum to the full lookup.
        const int64_t s = V / 2 + 1;
        Tensor y0 = nan_tensor({n, D}, dt, dev), y1 = nan_tensor({n, D}, dt, dev);
        ops::embedding_fwd(idt, make_tensor(part(table, 0, size_t(s * D)), {s, D}, dt, dev), y0, 0);
        ops::embedding_fwd(idt, make_tensor(part(table, size_t(s * D), size_t((V - s) * D)), {V - s, D}, dt, dev), y1,
                           s);
        const auto v0 = values(y0), v1 = values(y1);
        std::vector<double> sum(v0.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = v0[i] + v1[i];
        EXPECT_EQ(sum, want);
      }
}

TEST(Embedding, F32TableIntoBf16Activations) {
  const int64_t n = 6, V = 5, D = 13;
  const auto ids = make_id_list(n, V, 3);
  const auto table = round_to(randn(V * D, 4), DType::F32);
  Tensor y = nan_tensor({n, D}, DType::BF16);
  ops::embedding_fwd(make_ids(ids), make_tensor(table, {V, D}, DType::F32), y);
  std::vector<double> want(size_t(n * D));
  ops::ref::embedding_fwd<double>(ids.data(), table.data(), want.data(), n, V, D, 0);
  EXPECT_TRUE(close_for(DType::BF16, values(y), want, "y"));
}

TEST(Embedding, NanInfPropagate) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t n = 8, V = 6, D = 19;
      const std::vector<int32_t> ids = {0, 2, 5, 2, 1, 4, 3, 2};
      auto table = round_to(randn(V * D, 5), dt);
      table[2 * D + 3] = kNaN;
      table[4 * D + 0] = -kInf;
      Tensor y = nan_tensor({n, D}, dt, dev);
      ops::embedding_fwd(make_ids(ids, dev), make_tensor(table, {V, D}, dt, dev), y);
      std::vector<double> want(size_t(n * D));
      ops::ref::embedding_fwd<double>(ids.data(), table.data(), want.data(), n, V, D, 0);
      EXPECT_TRUE(close_for(dt, values(y), want, "y"));

      auto dy = round_to(randn(n * D, 6), dt);
      dy[1 * D + 7] = kInf;
      dy[3 * D + 7] = -kInf;  // same id (2) and column: inf - inf = NaN in dtable
      dy[4 * D + 2] = kNaN;
      Tensor dtab = Tensor::zeros({V, D}, DType::F32, MemCategory::Grads, dev);
      ops::embedding_bwd(make_ids(ids, dev), make_tensor(dy, {n, D}, dt, dev), dtab);
      std::vector<double> rd(size_t(V * D), 0.0);
      ops::ref::embedding_bwd<double>(ids.data(), dy.data(), rd.data(), n, V, D, 0);
      EXPECT_TRUE(std::isnan(rd[2 * D + 7]));
      EXPECT_TRUE(close_for(DType::F32, values(dtab), rd, "dtable"));
    }
}

TEST(Embedding, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 5, V = 4, D = 3;
  const std::vector<int32_t> ids = {1, 3, 1, 0, 7};  // 7 is outside: no gradient
  const auto table = randn(V * D, 7), r = randn(n * D, 8);
  auto L = [&](const std::vector<double>& tab) {
    std::vector<double> y(size_t(n * D));
    ops::ref::embedding_fwd<double>(ids.data(), tab.data(), y.data(), n, V, D, 0);
    return dot(r, y);
  };
  std::vector<double> g(table.size(), 0.0);
  ops::ref::embedding_bwd<double>(ids.data(), r.data(), g.data(), n, V, D, 0);
  EXPECT_TRUE(matches_finite_difference(L, table, g, "dtable"));
}

TEST(Embedding, BackwardMatchesReferenceAndAccumulates) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [n, V, D, start] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 3, 5, 0}, {33, 7, 17, 0}, {64, 20, 40, 10}}) {
        SCOPED_TRACE(case_name(dev, dt) + " n=" + std::to_string(n) + " D=" + std::to_string(D) +
                     " vocab_start=" + std::to_string(start));
        const auto ids = make_id_list(n, V + start + 5, 9);  // some ids fall outside the shard
        const auto dy = round_to(randn(n * D, 10), dt);
        const auto d0 = randn(V * D, 11);
        Tensor idt = make_ids(ids, dev), dyt = make_tensor(dy, {n, D}, dt, dev);
        Tensor dtab = make_tensor(d0, {V, D}, DType::F32, dev);
        std::vector<double> want = round_to(d0, DType::F32);
        for (int call = 0; call < 2; ++call) {
          ops::embedding_bwd(idt, dyt, dtab, start);
          ops::ref::embedding_bwd<double>(ids.data(), dy.data(), want.data(), n, V, D, start);
          EXPECT_TRUE(close_for(DType::F32, values(dtab), want, "dtable (+=), call " + std::to_string(call)));
        }
      }
}

TEST(Embedding, BackwardIndependentOfThreadCount) {
  const int64_t n = 512, V = 30, D = 96;
  const auto ids = make_id_list(n, V, 12);
  Tensor idt = make_ids(ids), dyt = make_tensor(randn(n * D, 13), {n, D}, DType::F32);
  const int saved = num_threads();
  std::vector<std::vector<double>> got;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor dtab = Tensor::zeros({V, D}, DType::F32);
    ops::embedding_bwd(idt, dyt, dtab);
    got.push_back(values(dtab));
  }
  set_num_threads(saved);
  EXPECT_EQ(got[0], got[1]);
}

TEST(Embedding, RejectsBadArguments) {
  Tensor ids = make_ids({0, 1}), tab = Tensor::zeros({4, 8}, DType::F32), y = Tensor::zeros({2, 7}, DType::F32);
  EXPECT_THROW(ops::embedding_fwd(ids, tab, y), Error);
  Tensor y8 = Tensor::zeros({2, 8}, DType::F32);
  EXPECT_THROW(ops::embedding_fwd(Tensor::zeros({2}, DType::I64), tab, y8), Error);
  Tensor dtab_bf16 = Tensor::zeros({4, 8}, DType::BF16);
  EXPECT_THROW(ops::embedding_bwd(ids, y8, dtab_bf16), Error);
  EXPECT_THROW(ops::embedding_fwd(ids, tab, y8, -1), Error);
}

}  // namespace
}  // namespace kestrel
