// ops::rmsnorm: forward/backward against the double reference, the reference
// backward against finite differences, special values, in-place use.
#include "ops/norm.h"

#include <gtest/gtest.h>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/ref/norm_ref.h"

namespace kestrel {
namespace {

using namespace testing;

constexpr float kEps = 1e-5f;
// D = 1, D not a multiple of 16, a Qwen3 q/k-norm head (64), N = 1.
const std::pair<int64_t, int64_t> kCases[] = {{1, 1}, {3, 7}, {1, 33}, {17, 64}, {40, 150}};

struct NormRef {
  std::vector<double> y, rstd;
};
NormRef ref_fwd(const std::vector<double>& x, const std::vector<double>& w, int64_t N, int64_t D) {
  NormRef r{std::vector<double>(size_t(N * D)), std::vector<double>(size_t(N))};
  ops::ref::rmsnorm_fwd<double>(x.data(), w.data(), double(kEps), r.y.data(), r.rstd.data(), N, D);
  return r;
}

KS_ISA_SUITE(RmsNorm);

TEST_P(RmsNorm, ForwardMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (DType wdt : {dt, DType::F32})
        for (auto [N, D] : kCases) {
          SCOPED_TRACE(case_name(dev, dt) + " w " + dtype_name(wdt) + " N=" + std::to_string(N) +
                       " D=" + std::to_string(D));
          const auto x = round_to(randn(N * D, 1, 2.0), dt), w = round_to(randn(D, 2), wdt);
          Tensor y = nan_tensor({N, D}, dt, dev), rstd = nan_tensor({N}, DType::F32, dev);
          ops::rmsnorm_fwd(make_tensor(x, {N, D}, dt, dev), make_tensor(w, {D}, wdt, dev), kEps, y, rstd);
          const auto want = ref_fwd(x, w, N, D);
          EXPECT_TRUE(close_for(dt, values(y), want.y, "y"));
          EXPECT_TRUE(close_for(DType::F32, values(rstd), want.rstd, "rstd"));
        }
}

TEST_P(RmsNorm, ForwardInPlace) {
  const int64_t N = 4, D = 24;
  const auto x = round_to(randn(N * D, 3), DType::BF16), w = round_to(randn(D, 4), DType::BF16);
  Tensor xt = make_tensor(x, {N, D}, DType::BF16), rstd = Tensor::empty({N}, DType::F32);
  ops::rmsnorm_fwd(xt, make_tensor(w, {D}, DType::BF16), kEps, xt, rstd);
  EXPECT_TRUE(close_for(DType::BF16, values(xt), ref_fwd(x, w, N, D).y, "y over x"));
}

TEST_P(RmsNorm, NanInfPropagate) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t N = 5, D = 21;
      auto x = round_to(randn(N * D, 5), dt), w = round_to(randn(D, 6), dt);
      x[1 * D + 3] = kNaN;  // row 1 all NaN
      x[2 * D + 0] = kInf;  // row 2: rstd = 0, inf * 0 = NaN at [2, 0], 0 elsewhere
      w[7] = kInf;          // column 7: inf (or NaN where the row is NaN)
      Tensor xt = make_tensor(x, {N, D}, dt, dev), wt = make_tensor(w, {D}, dt, dev);
      Tensor y = nan_tensor({N, D}, dt, dev), rstd = nan_tensor({N}, DType::F32, dev);
      ops::rmsnorm_fwd(xt, wt, kEps, y, rstd);
      const auto want = ref_fwd(x, w, N, D);
      EXPECT_TRUE(close_for(dt, values(y), want.y, "y"));
      EXPECT_TRUE(close_for(DType::F32, values(rstd), want.rstd, "rstd"));

      auto dy = round_to(randn(N * D, 7), dt);
      dy[3 * D + 5] = kNaN;
      Tensor dx = nan_tensor({N, D}, dt, dev), dw = Tensor::zeros({D}, DType::F32, MemCategory::Grads, dev);
      ops::rmsnorm_bwd(xt, wt, rstd, make_tensor(dy, {N, D}, dt, dev), dx, dw);
      std::vector<double> rdx(x.size()), rdw(size_t(D), 0.0);
      ops::ref::rmsnorm_bwd<double>(x.data(), w.data(), want.rstd.data(), dy.data(), rdx.data(), rdw.data(), N, D);
      EXPECT_TRUE(close_for(dt, values(dx), rdx, "dx"));
      EXPECT_TRUE(close_for(DType::F32, values(dw), rdw, "dw"));
    }
}

TEST_P(RmsNorm, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, D = 5;
  const auto x = randn(N * D, 8), w = randn(D, 9), r = randn(N * D, 10);
  auto L = [&](const std::vector<double>& p) {
    return dot(r, ref_fwd(part(p, 0, x.size()), part(p, x.size(), w.size()), N, D).y);
  };
  const auto f = ref_fwd(x, w, N, D);
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  ops::ref::rmsnorm_bwd<double>(x.data(), w.data(), f.rstd.data(), r.data(), dx.data(), dw.data(), N, D);
  EXPECT_TRUE(matches_finite_difference(L, concat({x, w}), concat({dx, dw}), "d(x, w)"));
}

TEST_P(RmsNorm, BackwardMatchesReferenceAndAccumulates) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [N, D] : kCases) {
        SCOPED_TRACE(case_name(dev, dt) + " N=" + std::to_string(N) + " D=" + std::to_string(D));
        const auto x = round_to(randn(N * D, 11, 1.5), dt), w = round_to(randn(D, 12), dt);
        const auto dy = round_to(randn(N * D, 13), dt), dw0 = randn(D, 14);
        const auto f = ref_fwd(x, w, N, D);
        Tensor xt = make_tensor(x, {N, D}, dt, dev), wt = make_tensor(w, {D}, dt, dev);
        Tensor rstd = make_tensor(f.rstd, {N}, DType::F32, dev), dyt = make_tensor(dy, {N, D}, dt, dev);
        Tensor dx = nan_tensor({N, D}, dt, dev), dw = make_tensor(dw0, {D}, DType::F32, dev);
        std::vector<double> rdx(x.size()), rdw = round_to(dw0, DType::F32);
        const auto rstd_f32 = values(rstd);  // the kernel sees rstd as stored
        for (int call = 0; call < 2; ++call) {
          ops::rmsnorm_bwd(xt, wt, rstd, dyt, dx, dw);
          ops::ref::rmsnorm_bwd<double>(x.data(), w.data(), rstd_f32.data(), dy.data(), rdx.data(), rdw.data(), N, D);
          EXPECT_TRUE(close_for(dt, values(dx), rdx, "dx, call " + std::to_string(call)));
          EXPECT_TRUE(close_for(DType::F32, values(dw), rdw, "dw (+=), call " + std::to_string(call)));
        }
        // dx may overwrite dy.
        Tensor dy_inplace = make_tensor(dy, {N, D}, dt, dev),
               dw2 = Tensor::zeros({D}, DType::F32, MemCategory::Grads, dev);
        ops::rmsnorm_bwd(xt, wt, rstd, dy_inplace, dy_inplace, dw2);
        EXPECT_TRUE(close_for(dt, values(dy_inplace), rdx, "dx written over dy"));
      }
}

TEST_P(RmsNorm, WeightGradientIndependentOfThreadCount) {
  const int64_t N = 300, D = 128;
  Tensor x = make_tensor(randn(N * D, 15), {N, D}, DType::F32), w = make_tensor(randn(D, 16), {D}, DType::F32);
  Tensor dy = make_tensor(randn(N * D, 17), {N, D}, DType::F32), rstd = Tensor::empty({N}, DType::F32);
  Tensor y = Tensor::empty({N, D}, DType::F32), dx = Tensor::empty({N, D}, DType::F32);
  ops::rmsnorm_fwd(x, w, kEps, y, rstd);
  const int saved = num_threads();
  std::vector<std::vector<double>> got;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor dw = Tensor::zeros({D}, DType::F32);
    ops::rmsnorm_bwd(x, w, rstd, dy, dx, dw);
    got.push_back(values(dw));
  }
  set_num_threads(saved);
  EXPECT_EQ(got[0], got[1]);
}

TEST_P(RmsNorm, RejectsBadArguments) {
  Tensor x = Tensor::zeros({4, 8}, DType::BF16), w = Tensor::zeros({8}, DType::F32);
  Tensor y32 = Tensor::zeros({4, 8}, DType::F32), rstd = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(ops::rmsnorm_fwd(x, w, kEps, y32, rstd), Error);  // y takes x's dtype
  Tensor y = Tensor::zeros({4, 8}, DType::BF16), w7 = Tensor::zeros({7}, DType::F32);
  EXPECT_THROW(ops::rmsnorm_fwd(x, w7, kEps, y, rstd), Error);
  EXPECT_THROW(ops::rmsnorm_fwd(x, w, -1.f, y, rstd), Error);
  Tensor dw_bf16 = Tensor::zeros({8}, DType::BF16), dx = Tensor::zeros({4, 8}, DType::BF16);
  EXPECT_THROW(ops::rmsnorm_bwd(x, w, rstd, y, dx, dw_bf16), Error);
}

}  // namespace
}  // namespace kestrel
