// ops/moe.h, the experts' side: permutation and routing layout, the grouped
// GEMM, the shared-expert gate -- CPU kernels against the double reference
// (f32 and bf16), reference backwards against central finite differences --
// and their composition, thread-count independence and errors. The router,
// its losses and capacity: moe_test.cpp.
#include "ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "backend/cpu/gemm.h"
#include "core/parallel_for.h"
#include "gemm_providers.h"
#include "moe_testing.h"
#include "op_harness.h"
#include "ops/linear.h"
#include "ops/ref/moe_ref.h"

namespace kestrel {
namespace {

using namespace testing;
using namespace moe_testing;
using ops::MoeDropPolicy;
using ops::MoeGroupLimit;
using ops::MoeRouterConfig;
using ops::MoeScore;

// ---- routing and permutation ------------------------------------------------

// A routing of T tokens with k slots over E experts: expert 2 gets no token,
// every 5th slot is dropped; distinct experts per token (k <= 3, E = 7 or 4).
std::vector<int32_t> sample_routing(int64_t T, int64_t k, int64_t E) {
  std::vector<int32_t> idx(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = int32_t((t * 3 + j * 5 + t / 4) % (E - 1));
      e = e >= 2 ? e + 1 : e;
      idx[size_t(t * k + j)] = (t * k + j) % 5 == 4 ? -1 : e;
    }
  return idx;
}

TEST(MoeRouting, LayoutMatchesReferenceAndConservesTokens) {
  for (int64_t k : {1, 3})
    for (int64_t pad : {0, 20}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " pad_to=" + std::to_string(pad));
      const int64_t T = 19, E = 7;
      const auto idx = sample_routing(T, k, E);
      const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, k}), E, pad);
      std::vector<int64_t> sizes;
      std::vector<int32_t> dest, source;
      ops::ref::moe_routing(idx.data(), T, k, E, pad, sizes, dest, source);
      EXPECT_EQ(r.group_sizes, sizes);
      EXPECT_EQ(ints(r.dest), dest);
      EXPECT_EQ(ints(r.source), source);
      EXPECT_EQ(r.group_sizes[2], pad);  // the empty expert
      const int64_t dropped = std::count(idx.begin(), idx.end(), -1);
      EXPECT_EQ(r.rows(), pad ? E * pad : T * k - dropped);
    }
  EXPECT_THROW_MSG(ops::moe_routing(i32_tensor(sample_routing(19, 3, 7), {19, 3}), 7, 4), "more than pad_to = 4");
  EXPECT_THROW_MSG(ops::moe_routing(i32_tensor({0, 7}, {2, 1}), 7), "topk_idx[1, 0] = 7 is not an expert");
}

TEST(MoePermute, KernelsMatchReference) {
  const int64_t T = 19, E = 7, D = 21;
  for (DType dt : float_dtypes())
    for (int64_t k : {1, 3})
      for (int64_t pad : {0, 20}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " k=" + std::to_string(k) + " pad_to=" + std::to_string(pad));
        const auto idx = sample_routing(T, k, E);
        const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, k}), E, pad);
        const int64_t N = r.rows();
        const auto dest = ints(r.dest), source = ints(r.source);
        const auto x = round_to(randn(T * D, 90), dt), ys = round_to(randn(N * D, 91), dt),
                   dy = round_to(randn(T * D, 92), dt), dxs = round_to(randn(N * D, 93), dt);
        auto w = round_to(randn(T * k, 94), DType::F32);
        for (int64_t i = 0; i < T * k; ++i)
          if (idx[size_t(i)] < 0) w[size_t(i)] = 0;

        Tensor xs = nan_tensor({N, D}, dt);
        ops::moe_permute_fwd(make_tensor(x, {T, D}, dt), r, xs);
        std::vector<double> want(size_t(N * D));
        ops::ref::moe_permute_fwd<double>(x.data(), source.data(), N, D, want.data());
        EXPECT_EQ(values(xs), want);  // a copy: exact

        Tensor dx = nan_tensor({T, D}, DType::F32);
        ops::moe_permute_bwd(make_tensor(dxs, {N, D}, dt), r, dx);
        std::vector<double> want_dx(size_t(T * D));
        ops::ref::moe_permute_bwd<double>(dxs.data(), dest.data(), T, k, D, want_dx.data());
        EXPECT_TRUE(close_for(DType::F32, values(dx), want_dx, "dx"));

        Tensor wt = make_tensor(w, {T, k}, DType::F32), y = nan_tensor({T, D}, dt);
        ops::moe_unpermute_fwd(make_tensor(ys, {N, D}, dt), wt, r, y);
        std::vector<double> want_y(size_t(T * D));
        ops::ref::moe_unpermute_fwd<double>(ys.data(), w.data(), dest.data(), T, k, D, want_y.data());
        EXPECT_TRUE(close_for(dt, values(y), want_y, "y"));

        Tensor dys = nan_tensor({N, D}, DType::F32), dw = nan_tensor({T, k}, DType::F32);
        ops::moe_unpermute_bwd(make_tensor(ys, {N, D}, dt), wt, make_tensor(dy, {T, D}, dt), r, dys, dw);
        std::vector<double> want_dys(size_t(N * D)), want_dw(size_t(T * k));
        ops::ref::moe_unpermute_bwd<double>(ys.data(), w.data(), dy.data(), dest.data(), T, k, N, D, want_dys.data(),
                                            want_dw.data());
        EXPECT_TRUE(close_for(DType::F32, values(dys), want_dys, "dys"));
        EXPECT_TRUE(close_for(DType::F32, values(dw), want_dw, "dtopk_w"));
      }
}

TEST(MoePermute, UnpermuteOfPermuteIsIdentityForOneExpertPerToken) {
  const int64_t T = 23, E = 5, D = 13;
  for (DType dt : float_dtypes())
    for (int64_t pad : {0, 9}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " pad_to=" + std::to_string(pad));
      std::vector<int32_t> idx(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) idx[size_t(t)] = int32_t((t * 7) % 4);  // expert 4 empty
      const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, 1}), E, pad);
      const auto x = round_to(randn(T * D, 100), dt);
      Tensor xs = Tensor::empty({r.rows(), D}, dt), y = nan_tensor({T, D}, dt);
      ops::moe_permute_fwd(make_tensor(x, {T, D}, dt), r, xs);
      ops::moe_unpermute_fwd(xs, make_tensor(std::vector<double>(size_t(T), 1.0), {T, 1}, DType::F32), r, y);
      EXPECT_EQ(values(y), x);
    }
}

TEST(MoePermute, ReferenceBackwardsMatchFiniteDifferences) {
  const int64_t T = 5, E = 4, k = 2, D = 3;
  const auto idx = sample_routing(T, k, E);
  for (int64_t pad : {0, 4}) {
    std::vector<int64_t> sizes;
    std::vector<int32_t> dest, source;
    ops::ref::moe_routing(idx.data(), T, k, E, pad, sizes, dest, source);
    const int64_t N = int64_t(source.size());
    const auto x = randn(T * D, 110), ys = randn(N * D, 111), w = randn(T * k, 112), r1 = randn(N * D, 113),
               r2 = randn(T * D, 114);
    auto Lp = [&](const std::vector<double>& xv) {
      std::vector<double> out(size_t(N * D));
      ops::ref::moe_permute_fwd<double>(xv.data(), source.data(), N, D, out.data());
      return dot(r1, out);
    };
    std::vector<double> dx(size_t(T * D));
    ops::ref::moe_permute_bwd<double>(r1.data(), dest.data(), T, k, D, dx.data());
    EXPECT_TRUE(matches_finite_difference(Lp, x, dx, "permute dx"));
    auto Lu = [&](const std::vector<double>& p) {
      std::vector<double> out(size_t(T * D));
      ops::ref::moe_unpermute_fwd<double>(p.data(), p.data() + N * D, dest.data(), T, k, D, out.data());
      return dot(r2, out);
    };
    std::vector<double> dys(size_t(N * D)), dw(size_t(T * k));
    ops::ref::moe_unpermute_bwd<double>(ys.data(), w.data(), r2.data(), dest.data(), T, k, N, D, dys.data(),
                                        dw.data());
    EXPECT_TRUE(matches_finite_difference(Lu, concat({ys, w}), concat({dys, dw}), "unpermute d(ys, w)"));
  }
}

// ---- grouped GEMM -----------------------------------------------------------

// Empty groups, groups for the skinny kernel (<= 32 rows) and for the BLAS.
const std::vector<int64_t> kGroupSizes = {0, 5, 40, 0, 1, 33, 17};

TEST(MoeGroupedLinear, ForwardBackwardMatchReference) {
  const int64_t in = 37, out = 29, E = int64_t(kGroupSizes.size());
  const int64_t N = std::accumulate(kGroupSizes.begin(), kGroupSizes.end(), int64_t(0));
  for_each_gemm_provider([&] {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(dtype_name(dt));
      const auto x = round_to(randn(N * in, 120), dt), dy = round_to(randn(N * out, 121), dt);
      std::vector<std::vector<double>> wv, dw0;
      std::vector<Tensor> wt, dwt;
      for (int64_t e = 0; e < E; ++e) {
        wv.push_back(round_to(randn(out * in, 130 + uint64_t(e), 0.3), dt));
        dw0.push_back(round_to(randn(out * in, 150 + uint64_t(e)), DType::F32));
        wt.push_back(make_tensor(wv.back(), {out, in}, dt));
        dwt.push_back(make_tensor(dw0.back(), {out, in}, DType::F32));
      }
      std::vector<const Tensor*> wp;
      std::vector<Tensor*> dwp;
      std::vector<const double*> wref;
      std::vector<double*> dwref;
      for (int64_t e = 0; e < E; ++e) {
        wp.push_back(&wt[size_t(e)]);
        dwp.push_back(e == 2 ? nullptr : &dwt[size_t(e)]);  // expert 2 frozen
        wref.push_back(wv[size_t(e)].data());
        dwref.push_back(e == 2 ? nullptr : dw0[size_t(e)].data());
      }
      Tensor xt = make_tensor(x, {N, in}, dt), y = nan_tensor({N, out}, dt);
      ops::grouped_linear_fwd(xt, kGroupSizes, wp, y);
      std::vector<double> want_y(size_t(N * out));
      ops::ref::grouped_linear_fwd<double>(x.data(), kGroupSizes, wref, in, out, want_y.data());
      EXPECT_TRUE(close_for(dt, values(y), want_y, "y"));

      Tensor dx = nan_tensor({N, in}, dt);
      ops::grouped_linear_bwd(xt, kGroupSizes, wp, make_tensor(dy, {N, out}, dt), &dx, dwp);
      std::vector<double> want_dx(size_t(N * in));
      ops::ref::grouped_linear_bwd<double>(x.data(), kGroupSizes, wref, dy.data(), in, out, want_dx.data(), dwref);
      EXPECT_TRUE(close_for(dt, values(dx), want_dx, "dx"));
      for (int64_t e = 0; e < E; ++e)
        EXPECT_TRUE(
            close_for(DType::F32, values(dwt[size_t(e)]), dw0[size_t(e)], "dw[" + std::to_string(e) + "] (+=)"));
    }
  });
}

TEST(MoeGroupedLinear, ReferenceBackwardMatchesFiniteDifferences) {
  const std::vector<int64_t> sizes = {2, 0, 3};
  const int64_t in = 3, out = 2, N = 5;
  const auto x = randn(N * in, 160), w = randn(3 * out * in, 161), r = randn(N * out, 162);
  auto ptrs = [&](const std::vector<double>& p) {
    return std::vector<const double*>{p.data() + N * in, p.data() + N * in + out * in,
                                      p.data() + N * in + 2 * out * in};
  };
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> y(size_t(N * out));
    ops::ref::grouped_linear_fwd<double>(p.data(), sizes, ptrs(p), in, out, y.data());
    return dot(r, y);
  };
  const auto p0 = concat({x, w});
  std::vector<double> dx(size_t(N * in)), dw(size_t(3 * out * in), 0.0);
  ops::ref::grouped_linear_bwd<double>(x.data(), sizes, ptrs(p0), r.data(), in, out, dx.data(),
                                       {dw.data(), dw.data() + out * in, dw.data() + 2 * out * in});
  EXPECT_TRUE(matches_finite_difference(L, p0, concat({dx, dw}), "d(x, w)"));
}

// ---- shared-expert gate -----------------------------------------------------

TEST(MoeSigmoidGate, MatchesReferenceAndHfRounding) {
  const int64_t T = 9, D = 19;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const auto g = round_to(randn(T, 170, 2.0), dt), s = round_to(randn(T * D, 171), dt),
               y0 = round_to(randn(T * D, 172), dt), dy = round_to(randn(T * D, 173), dt);
    Tensor y = make_tensor(y0, {T, D}, dt);
    ops::sigmoid_gate_add_fwd(make_tensor(g, {T, 1}, dt), make_tensor(s, {T, D}, dt), y);
    std::vector<double> want = y0;
    ops::ref::sigmoid_gate_add_fwd<double>(g.data(), s.data(), T, D, want.data());
    EXPECT_TRUE(close_for(dt, values(y), want, "y (+=)"));
    if (dt == DType::BF16) {  // HF: bf16(bf16(sigmoid(g)) * s), then bf16(y + that)
      std::vector<double> hf(size_t(T * D));
      for (int64_t t = 0; t < T; ++t) {
        const double sg = round_to(1.0 / (1.0 + std::exp(-double(float(g[size_t(t)])))), dt);
        for (int64_t d = 0; d < D; ++d)
          hf[size_t(t * D + d)] = round_to(y0[size_t(t * D + d)] + round_to(sg * s[size_t(t * D + d)], dt), dt);
      }
      EXPECT_EQ(values(y), hf);
    }
    Tensor ds = nan_tensor({T, D}, DType::F32), dg = nan_tensor({T, 1}, DType::F32);
    ops::sigmoid_gate_add_bwd(make_tensor(g, {T, 1}, dt), make_tensor(s, {T, D}, dt), make_tensor(dy, {T, D}, dt), ds,
                              dg);
    std::vector<double> want_ds(size_t(T * D)), want_dg(static_cast<size_t>(T));
    ops::ref::sigmoid_gate_add_bwd<double>(g.data(), s.data(), dy.data(), T, D, want_ds.data(), want_dg.data());
    EXPECT_TRUE(close_for(DType::F32, values(ds), want_ds, "ds"));
    EXPECT_TRUE(close_for(DType::F32, values(dg), want_dg, "dg"));
  }
  const int64_t n = 3, d = 4;
  const auto g = randn(n, 180), s = randn(n * d, 181), r = randn(n * d, 182);
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> y(size_t(n * d), 0.0);
    ops::ref::sigmoid_gate_add_fwd<double>(p.data(), p.data() + n, n, d, y.data());
    return dot(r, y);
  };
  std::vector<double> ds(size_t(n * d)), dg(static_cast<size_t>(n));
  ops::ref::sigmoid_gate_add_bwd<double>(g.data(), s.data(), r.data(), n, d, ds.data(), dg.data());
  EXPECT_TRUE(matches_finite_difference(L, concat({g, s}), concat({dg, ds}), "d(g, s)"));
}

// ---- composition, threads, errors -------------------------------------------

TEST(MoePipeline, RoutedExpertsEqualTheDenseMixture) {
  // router -> drop -> routing -> permute -> grouped GEMM -> unpermute against
  // y[t] = sum over kept slots of w * (x[t] @ W[e]^T), computed per token.
  const int64_t T = 45, D = 17, F = 11, E = 6, k = 2;
  const auto x = round_to(randn(T * D, 190), DType::F32), logits = randn(T * E, 191);
  const MoeRouterConfig cfg = router_cfg(E, k, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true);
  Tensor idx = Tensor::empty({T, k}, DType::I32), w = Tensor::empty({T, k}, DType::F32),
         sc = Tensor::empty({T, E}, DType::F32);
  ops::moe_router_fwd(make_tensor(logits, {T, E}, DType::F32), nullptr, cfg, idx, w, sc);
  const int64_t dropped =
      ops::moe_drop_to_capacity(idx, w, E, ops::moe_expert_capacity(T, k, E, 1.0), MoeDropPolicy::Probs);
  const ops::MoeRouting r = ops::moe_routing(idx, E);
  EXPECT_EQ(r.rows(), T * k - dropped);
  std::vector<std::vector<double>> wv;
  std::vector<Tensor> wt;
  std::vector<const Tensor*> wp;
  for (int64_t e = 0; e < E; ++e) {
    wv.push_back(round_to(randn(F * D, 200 + uint64_t(e)), DType::F32));
    wt.push_back(make_tensor(wv.back(), {F, D}, DType::F32));
  }
  for (auto& t : wt) wp.push_back(&t);
  Tensor xs = Tensor::empty({r.rows(), D}, DType::F32), ys = Tensor::empty({r.rows(), F}, DType::F32),
         y = nan_tensor({T, F}, DType::F32);
  ops::moe_permute_fwd(make_tensor(x, {T, D}, DType::F32), r, xs);
  ops::grouped_linear_fwd(xs, r.group_sizes, wp, ys);
  ops::moe_unpermute_fwd(ys, w, r, y);
  const auto ix = ints(idx);
  const auto wvals = values(w);
  std::vector<double> want(size_t(T * F), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ix[size_t(t * k + j)];
      if (e < 0) continue;
      for (int64_t f = 0; f < F; ++f) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += x[size_t(t * D + d)] * wv[size_t(e)][size_t(f * D + d)];
        want[size_t(t * F + f)] += wvals[size_t(t * k + j)] * acc;
      }
    }
  EXPECT_TRUE(close_for(DType::F32, values(y), want, "y"));
}

TEST(MoeThreads, SameResultsAtAnyThreadCount) {
  const int64_t T = 3000, E = 16, k = 4, D = 40;  // past the parallel thresholds
  const MoeRouterConfig cfg = router_cfg(E, k, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, true, 2.5);
  const auto logits = randn(T * E, 210, 2.0), x = randn(T * D, 211), dy = randn(T * D, 212);
  std::vector<int32_t> cu = {0, 1000, 1700, 3000};
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<double>> out;
    Tensor lt = make_tensor(logits, {T, E}, DType::BF16), idx = Tensor::empty({T, k}, DType::I32),
           w = Tensor::empty({T, k}, DType::F32), sc = Tensor::empty({T, E}, DType::F32),
           dl = Tensor::zeros({T, E}, DType::F32), counts = Tensor::empty({E}, DType::I32);
    ops::moe_router_fwd(lt, nullptr, cfg, idx, w, sc);
    ops::moe_router_bwd(sc, idx, w, w, cfg, dl);
    Tensor cut = i32_tensor(cu, {4});
    out.push_back({ops::moe_aux_loss_fwd(lt, cut, MoeScore::Sigmoid, k, 0.01, counts),
                   ops::moe_z_loss_fwd(lt, 0.001)});
    ops::moe_aux_loss_bwd(lt, cut, MoeScore::Sigmoid, k, 0.01, 1.0, dl);
    ops::moe_z_loss_bwd(lt, 0.001, 1.0, dl);
    ops::moe_drop_to_capacity(idx, w, E, ops::moe_expert_capacity(T, k, E, 0.8), MoeDropPolicy::Probs);
    const ops::MoeRouting r = ops::moe_routing(idx, E);
    Tensor xs = Tensor::empty({r.rows(), D}, DType::BF16), y = Tensor::empty({T, D}, DType::F32),
           dx = Tensor::empty({T, D}, DType::F32), dys = Tensor::empty({r.rows(), D}, DType::F32),
           dw = Tensor::empty({T, k}, DType::F32);
    ops::moe_permute_fwd(make_tensor(x, {T, D}, DType::BF16), r, xs);
    ops::moe_unpermute_fwd(xs, w, r, y);
    ops::moe_unpermute_bwd(xs, w, make_tensor(dy, {T, D}, DType::F32), r, dys, dw);
    ops::moe_permute_bwd(dys, r, dx);
    for (const Tensor* t : {&w, &sc, &dl, &y, &dx, &dys, &dw}) out.push_back(values(*t));
    const auto ix = ints(idx);
    out.emplace_back(ix.begin(), ix.end());
    // Groups small enough for the skinny kernel: one thread per group, or the
    // team inside each group's call; the same bits either way.
    const std::vector<int64_t> sizes = {3, 1, 0, 5, 2, 4, 1, 1, 2, 3};
    const int64_t rows = 22, in = 300, out_f = 200;
    std::vector<Tensor> ws;
    std::vector<const Tensor*> wp;
    for (size_t e = 0; e < sizes.size(); ++e)
      ws.push_back(make_tensor(randn(out_f * in, 220 + e), {out_f, in}, DType::BF16));
    for (const Tensor& t : ws) wp.push_back(&t);
    Tensor gy = Tensor::empty({rows, out_f}, DType::F32);
    ops::grouped_linear_fwd(make_tensor(randn(rows * in, 219), {rows, in}, DType::F32), sizes, wp, gy);
    out.push_back(values(gy));
    return out;
  };
  const int saved = num_threads();
  const auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(MoeOps, EmptyBatchesAndFullyDroppedRows) {
  // No tokens (an empty micro-batch shard): every op runs and writes nothing.
  const MoeRouterConfig cfg = router_cfg(4, 2, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true);
  Tensor idx = Tensor::empty({0, 2}, DType::I32), w = Tensor::empty({0, 2}, DType::F32),
         sc = Tensor::empty({0, 4}, DType::F32), dl = Tensor::empty({0, 4}, DType::F32);
  ops::moe_router_fwd(Tensor::empty({0, 4}, DType::BF16), nullptr, cfg, idx, w, sc);
  ops::moe_router_bwd(sc, idx, w, w, cfg, dl);
  const ops::MoeRouting r = ops::moe_routing(idx, 4);
  EXPECT_EQ(r.rows(), 0);
  Tensor x = Tensor::empty({0, 6}, DType::BF16), xs = Tensor::empty({0, 6}, DType::BF16),
         ys = Tensor::empty({0, 5}, DType::BF16), y = Tensor::empty({0, 5}, DType::BF16);
  ops::moe_permute_fwd(x, r, xs);
  Tensor w0 = Tensor::zeros({5, 6}, DType::BF16);
  ops::grouped_linear_fwd(xs, r.group_sizes, {&w0, &w0, &w0, &w0}, ys);
  ops::moe_unpermute_fwd(ys, w, r, y);
  EXPECT_EQ(ops::moe_drop_to_capacity(idx, w, 4, 0, MoeDropPolicy::Probs), 0);
  // A row whose slots are all dropped (by capacity, after routing): weights 0 (not 0/0), no gradient.
  Tensor given = i32_tensor({-1, -1, 1, 3}, {2, 2}), w2 = nan_tensor({2, 2}, DType::F32),
         sc2 = Tensor::empty({2, 4}, DType::F32), dl2 = Tensor::zeros({2, 4}, DType::F32);
  ops::moe_router_fwd(make_tensor(randn(8, 230), {2, 4}, DType::F32), nullptr, cfg, given, w2, sc2, true);
  Tensor dropped = i32_tensor({-1, -1, 1, 3}, {2, 2});
  ops::moe_drop_to_capacity(dropped, w2, 4, 4, MoeDropPolicy::Probs);  // capacity 4: keeps what is there
  w2 = nan_tensor({2, 2}, DType::F32);
  ops::moe_router_fwd(make_tensor(randn(8, 230), {2, 4}, DType::F32), nullptr, cfg, given, w2, sc2, true);
  EXPECT_NE(ints(given)[0], -1) << "a replayed row of -1s only has no record: it is routed";
  ops::moe_router_bwd(sc2, dropped, w2, make_tensor({1, 1, 1, 1}, {2, 2}, DType::F32), cfg, dl2);
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(values(dl2)[size_t(e)], 0.0);
}

TEST(MoeOps, BadArgumentsFailWithAMessage) {
  Tensor logits = Tensor::zeros({4, 8}, DType::F32), idx = Tensor::zeros({4, 2}, DType::I32),
         w = Tensor::zeros({4, 2}, DType::F32), sc = Tensor::zeros({4, 8}, DType::F32);
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(6, 2, MoeScore::Softmax), idx, w, sc),
                   "logits have 8 expert columns, the config num_experts = 6");
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(8, 2, MoeScore::Softmax, MoeGroupLimit::Max, 3, 1),
                                       idx, w, sc),
                   "n_group = 3 must divide num_experts = 8");
  Tensor idx3 = Tensor::zeros({4, 3}, DType::I32), w3 = Tensor::zeros({4, 3}, DType::F32);
  EXPECT_THROW_MSG(
      ops::moe_router_fwd(logits, nullptr, router_cfg(8, 3, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 1), idx3,
                          w3, sc),
      "top_k = 3 exceeds the 2 experts");
  Tensor bad = i32_tensor({0, 1, 2, 9, 0, 1, 2, 3}, {4, 2});
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(8, 2, MoeScore::Softmax), bad, w, sc, true),
                   "topk_idx[1, 1] = 9 is not an expert in [0, 8)");
  Tensor counts = Tensor::zeros({8}, DType::I32);
  EXPECT_THROW_MSG(ops::moe_aux_loss_fwd(logits, i32_tensor({0, 3}, {2}), MoeScore::Softmax, 2, 0.1, counts),
                   "cu_groups must run from 0 to the 4 rows");
  const ops::MoeRouting r = ops::moe_routing(i32_tensor({0, 1, 1, 2, 2, 3, 3, 4}, {4, 2}), 8);
  Tensor xs = Tensor::zeros({8, 5}, DType::BF16);
  EXPECT_THROW_MSG(ops::moe_permute_fwd(Tensor::zeros({4, 5}, DType::F32), r, xs), "xs must have the dtype of x");
  Tensor x8 = Tensor::zeros({8, 5}, DType::F32), y8 = Tensor::zeros({8, 3}, DType::F32),
         w35 = Tensor::zeros({3, 5}, DType::F32), w34 = Tensor::zeros({3, 4}, DType::F32);
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {3, 4}, {&w35, &w35}, y8), "group_sizes sum to 7 rows");
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {4, 4}, {&w35, &w34}, y8), "w[1] must have shape [3, 5]");
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {4, 4}, {&w35}, y8), "one weight per group (2)");
}

}  // namespace
}  // namespace kestrel
