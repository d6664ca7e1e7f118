// ops/vocab_loss.h: the local pieces of the vocab-parallel log-softmax
// against their double references (ops/ref/vocab_loss_ref.h), the reference
// backward against finite differences of the reference forward, two shards
// composed (max, then sums, added as the all-reduces do) against the fused
// single-shard ops::logprob_entropy_fwd, padding columns, in-place backward
// and argument errors.
#include "ops/vocab_loss.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "op_harness.h"
#include "ops/loss.h"
#include "ops/ref/vocab_loss_ref.h"

namespace kestrel {
namespace {

using namespace testing;

// {T, Vs, n_real}: every column real, padding columns, a shard of padding only.
struct Case {
  int64_t T, Vs, n_real;
};
const Case kCases[] = {{1, 1, 1}, {3, 7, 7}, {5, 37, 30}, {4, 16, 0}, {2, 600, 599}};

std::vector<double> make_logits(int64_t T, int64_t V, uint64_t seed, DType dt) {
  auto z = randn(T * V, seed, 2.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) z[size_t(t * V + v)] += (t % 2 ? 1.0 : -1.0) * 6.0 * double(v) / double(V);
  return round_to(z, dt);
}
// Global ids over a vocabulary of `vocab` around this shard's [start, start + n_real):
// some in it, some in other shards, every third row ignored (-100).
std::vector<int32_t> make_targets(int64_t T, int64_t vocab) {
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = (t % 3 == 2) ? -100 : int32_t((t * 7919 + 3) % vocab);
  return tg;
}
// Row r of an [R, n] vector.
std::vector<double> row_of(const std::vector<double>& v, int64_t r, int64_t n) {
  return part(v, size_t(r * n), size_t(n));
}

TEST(VocabLossOps, RowMaxAndSumsMatchReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : kCases)
        for (int64_t start : {int64_t(0), int64_t(5)}) {
          SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(c.T) + " Vs=" + std::to_string(c.Vs) +
                       " n_real=" + std::to_string(c.n_real) + " start=" + std::to_string(start));
          const auto z = make_logits(c.T, c.Vs, 1, dt);
          const auto tg = make_targets(c.T, start + c.Vs + 3);
          const Tensor logits = make_tensor(z, {c.T, c.Vs}, dt, dev), targets = make_ids(tg, dev);
          Tensor M = nan_tensor({c.T}, DType::F32, dev);
          ops::vocab_row_max(logits, c.n_real, M);
          std::vector<double> want_m(size_t(c.T));
          ops::ref::vocab_row_max<double>(z.data(), c.T, c.Vs, c.n_real, want_m.data());
          EXPECT_EQ(values(M), want_m);  // a max of stored values is exact
          if (c.n_real == 0) continue;   // exp(-inf - -inf): no sums over an all-padding shard's own max
          Tensor sums = nan_tensor({3, c.T}, DType::F32, dev);
          ops::vocab_row_sums(logits, targets, start, c.n_real, M, sums);
          std::vector<double> want(size_t(3 * c.T));
          ops::ref::vocab_row_sums<double>(z.data(), tg.data(), start, c.T, c.Vs, c.n_real, want_m.data(), want.data());
          const auto got = values(sums);
          EXPECT_TRUE(close_for(DType::F32, row_of(got, 0, c.T), row_of(want, 0, c.T), "sum exp"));
          EXPECT_TRUE(close_for(DType::F32, row_of(got, 1, c.T), row_of(want, 1, c.T), "sum exp * z"));
          EXPECT_EQ(row_of(got, 2, c.T), row_of(want, 2, c.T)) << "z_target is a copied logit";
        }
}

TEST(VocabLossOps, SoftmaxFinishMatchesReference) {
  for (Device dev : available_devices()) {
    const int64_t T = 6;
    auto s = randn(T, 2, 1.0), sz = randn(T, 3, 4.0), zt = randn(T, 4, 3.0), m = round_to(randn(T, 5, 3.0), DType::F32);
    for (double& x : s) x = round_to(1.0 + std::abs(x) * 10.0, DType::F32);
    sz = round_to(sz, DType::F32);
    zt = round_to(zt, DType::F32);
    const std::vector<int32_t> tg = {3, -100, 0, 7, -1, 2};
    const auto sums_v = concat({s, sz, zt});
    for (bool with_lp : {true, false})
      for (bool with_h : {true, false}) {
        SCOPED_TRACE(std::string(device_name(dev)) + (with_lp ? " logprob" : "") + (with_h ? " entropy" : ""));
        Tensor lse = make_tensor(m, {T}, DType::F32, dev);
        Tensor lp = nan_tensor({T}, DType::F32, dev), H = nan_tensor({T}, DType::F32, dev);
        ops::vocab_softmax_finish(make_tensor(sums_v, {3, T}, DType::F32, dev), make_ids(tg, dev), lse,
                                  with_lp ? &lp : nullptr, with_h ? &H : nullptr);
        std::vector<double> L = m, want_lp(static_cast<size_t>(T)), want_h(static_cast<size_t>(T));
        ops::ref::vocab_softmax_finish<double>(sums_v.data(), tg.data(), T, L.data(), want_lp.data(), want_h.data());
        EXPECT_TRUE(close_for(DType::F32, values(lse), L, "lse"));
        if (with_lp) {
          EXPECT_TRUE(close_for(DType::F32, values(lp), want_lp, "logprob"));
        }
        if (with_h) {
          EXPECT_TRUE(close_for(DType::F32, values(H), want_h, "entropy"));
        }
      }
  }
}

// Two shards [T, V/2] of one [T, V] logit matrix, run as parallel::vocab_loss
// runs them over two ranks (max of the maxima, sum of the sums), give the
// fused single-shard kernel's logprob, entropy and lse.
TEST(VocabLossOps, TwoShardsComposeToTheFusedLoss) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t T = 7, V = 40, half = V / 2;
      const auto z = make_logits(T, V, 6, dt);
      const auto tg = make_targets(T, V);
      const Tensor full = make_tensor(z, {T, V}, dt, dev), targets = make_ids(tg, dev);
      Tensor lp = nan_tensor({T}, DType::F32, dev), H = nan_tensor({T}, DType::F32, dev),
             lse = nan_tensor({T}, DType::F32, dev);
      ops::logprob_entropy_fwd(full, targets, lp, &H, lse);

      std::vector<Tensor> shard;
      for (int r = 0; r < 2; ++r) {
        std::vector<double> zs;
        for (int64_t t = 0; t < T; ++t) {
          auto row = part(z, size_t(t * V + r * half), size_t(half));
          zs.insert(zs.end(), row.begin(), row.end());
        }
        shard.push_back(make_tensor(zs, {T, half}, dt, dev));
      }
      std::vector<double> m(size_t(T), -kInf), sums(size_t(3 * T), 0.0);
      for (int r = 0; r < 2; ++r) {
        Tensor mr = nan_tensor({T}, DType::F32, dev);
        ops::vocab_row_max(shard[size_t(r)], half, mr);
        const auto v = values(mr);
        for (int64_t t = 0; t < T; ++t) m[size_t(t)] = std::max(m[size_t(t)], v[size_t(t)]);
      }
      const Tensor M = make_tensor(m, {T}, DType::F32, dev);
      for (int r = 0; r < 2; ++r) {
        Tensor sr = nan_tensor({3, T}, DType::F32, dev);
        ops::vocab_row_sums(shard[size_t(r)], targets, r * half, half, M, sr);
        const auto v = values(sr);
        for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
      }
      Tensor L = make_tensor(m, {T}, DType::F32, dev), lp2 = nan_tensor({T}, DType::F32, dev),
             H2 = nan_tensor({T}, DType::F32, dev);
      ops::vocab_softmax_finish(make_tensor(sums, {3, T}, DType::F32, dev), targets, L, &lp2, &H2);
      EXPECT_TRUE(close_for(DType::F32, values(L), values(lse), "lse"));
      EXPECT_TRUE(close_for(DType::F32, values(lp2), values(lp), "logprob"));
      EXPECT_TRUE(close_for(DType::F32, values(H2), values(H), "entropy"));
    }
}

// The reference forward over one shard holding the whole real vocabulary:
// L(z) = sum_t a_t logprob_t + b_t H_t.
double ref_objective(const std::vector<double>& z, const std::vector<int32_t>& tg, const std::vector<double>& a,
                     const std::vector<double>& b, int64_t T, int64_t Vs, int64_t n_real) {
  const size_t n = size_t(T);
  std::vector<double> m(n), sums(3 * n), lp(n), H(n);
  ops::ref::vocab_row_max<double>(z.data(), T, Vs, n_real, m.data());
  ops::ref::vocab_row_sums<double>(z.data(), tg.data(), 0, T, Vs, n_real, m.data(), sums.data());
  ops::ref::vocab_softmax_finish<double>(sums.data(), tg.data(), T, m.data(), lp.data(), H.data());
  double s = 0;
  for (int64_t t = 0; t < T; ++t) s += a[size_t(t)] * lp[size_t(t)] + b[size_t(t)] * H[size_t(t)];
  return s;
}

TEST(VocabLossOps, ReferenceGradMatchesFiniteDifferences) {
  const int64_t T = 4, Vs = 9, n_real = 7;
  const auto z = make_logits(T, Vs, 7, DType::F32);
  const auto tg = make_targets(T, n_real);
  const auto a = randn(T, 8), b = randn(T, 9);
  const size_t n = size_t(T);
  std::vector<double> m(n), sums(3 * n), lse(n), lp(n), H(n);
  ops::ref::vocab_row_max<double>(z.data(), T, Vs, n_real, m.data());
  ops::ref::vocab_row_sums<double>(z.data(), tg.data(), 0, T, Vs, n_real, m.data(), sums.data());
  lse = m;
  ops::ref::vocab_softmax_finish<double>(sums.data(), tg.data(), T, lse.data(), lp.data(), H.data());
  std::vector<double> g(size_t(T * Vs));
  ops::ref::vocab_logprob_entropy_grad<double>(z.data(), tg.data(), 0, T, Vs, n_real, lse.data(), a.data(), b.data(),
                                               H.data(), g.data());
  EXPECT_TRUE(matches_finite_difference(
      [&](const std::vector<double>& x) { return ref_objective(x, tg, a, b, T, Vs, n_real); }, z, g, "dlogits"));
}

TEST(VocabLossOps, GradMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : kCases)
        for (bool with_h : {true, false})
          for (bool in_place : {false, true}) {
            if (in_place && dt != DType::F32) continue;  // dlogits is f32: only f32 logits can share it
            SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(c.T) + " Vs=" + std::to_string(c.Vs) +
                         " n_real=" + std::to_string(c.n_real) + (with_h ? " entropy" : "") +
                         (in_place ? " in place" : ""));
            const int64_t start = 3;
            const auto z = make_logits(c.T, c.Vs, 10, dt);
            const auto tg = make_targets(c.T, start + c.Vs);
            // lse / entropy as a forward over all shards would leave them: any finite values do.
            const auto lse = round_to(randn(c.T, 11, 1.0), DType::F32);
            auto L = lse;
            for (double& x : L) x += 8.0;
            const auto H = round_to(randn(c.T, 12, 1.0), DType::F32), dl = round_to(randn(c.T, 13), DType::F32),
                       de = round_to(randn(c.T, 14), DType::F32);
            Tensor logits = make_tensor(z, {c.T, c.Vs}, dt, dev);
            Tensor d = in_place ? logits : nan_tensor({c.T, c.Vs}, DType::F32, dev);
            const Tensor de_t = make_tensor(de, {c.T}, DType::F32, dev), H_t = make_tensor(H, {c.T}, DType::F32, dev);
            ops::vocab_logprob_entropy_grad(logits, make_ids(tg, dev), start, c.n_real,
                                            make_tensor(L, {c.T}, DType::F32, dev),
                                            make_tensor(dl, {c.T}, DType::F32, dev), with_h ? &de_t : nullptr,
                                            with_h ? &H_t : nullptr, d);
            std::vector<double> want(size_t(c.T * c.Vs));
            ops::ref::vocab_logprob_entropy_grad<double>(z.data(), tg.data(), start, c.T, c.Vs, c.n_real, L.data(),
                                                         dl.data(), with_h ? de.data() : nullptr,
                                                         with_h ? H.data() : nullptr, want.data());
            const auto got = values(d);
            EXPECT_TRUE(close_for(DType::F32, got, want, "dlogits"));
            for (int64_t t = 0; t < c.T; ++t)
              for (int64_t v = c.n_real; v < c.Vs; ++v)
                EXPECT_EQ(got[size_t(t * c.Vs + v)], 0.0) << "padding column " << v << " of row " << t;
          }
}

TEST(VocabLossOps, ArgumentErrors) {
  const Tensor logits = make_tensor(std::vector<double>(12, 0.0), {3, 4}, DType::F32);
  const Tensor targets = make_ids({0, 1, -100});
  Tensor M = nan_tensor({3}, DType::F32), sums = nan_tensor({3, 3}, DType::F32), d = nan_tensor({3, 4}, DType::F32);
  EXPECT_THROW_MSG(ops::vocab_row_max(logits, 5, M), "n_real 5");
  Tensor M_bad = nan_tensor({2}, DType::F32);
  EXPECT_THROW_MSG(ops::vocab_row_max(logits, 4, M_bad), "row_max must have shape [3]");
  Tensor sums_bad = nan_tensor({2, 3}, DType::F32);
  EXPECT_THROW_MSG(ops::vocab_row_sums(logits, targets, 0, 4, M, sums_bad), "sums must have shape [3, 3]");
  EXPECT_THROW_MSG(ops::vocab_softmax_finish(sums, make_ids({0, 1}), M, nullptr, nullptr), "targets must have shape");
  EXPECT_THROW_MSG(ops::vocab_logprob_entropy_grad(logits, targets, 0, 4, M, M, &M, nullptr, d), "given together");
  Tensor d_bf16 = nan_tensor({3, 4}, DType::BF16);
  EXPECT_THROW_MSG(ops::vocab_logprob_entropy_grad(logits, targets, 0, 4, M, M, nullptr, nullptr, d_bf16),
                   "dlogits must be f32");
}

}  // namespace
}  // namespace kestrel
