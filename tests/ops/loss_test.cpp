// ops::logprob_entropy / cross_entropy: the fused one-pass kernels against the
// two-pass double reference, the reference backward against finite
// differences, in-place backward, ignored targets and special values.
#include "ops/loss.h"

#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/ref/loss_ref.h"

namespace kestrel {
namespace {

using namespace testing;

// V = 1, small odd V, and V over the kernel's 512-wide block so the running
// max moves between blocks (rows with a rising ramp put the max in the last block).
const std::pair<int64_t, int64_t> kCases[] = {{1, 1}, {3, 7}, {5, 37}, {4, 1000}, {2, 2050}};

std::vector<double> make_logits(int64_t T, int64_t V, uint64_t seed, DType dt) {
  auto z = randn(T * V, seed, 2.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) z[size_t(t * V + v)] += (t % 2 ? 1.0 : -1.0) * 8.0 * double(v) / double(V);
  return round_to(z, dt);
}
// Every third position ignored (HF's -100), the rest spread over the vocabulary.
std::vector<int32_t> make_targets(int64_t T, int64_t V) {
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = (t % 3 == 2) ? -100 : int32_t((t * 7919 + 3) % V);
  return tg;
}

struct LossRef {
  std::vector<double> logprob, entropy, lse;
};
LossRef ref_fwd(const std::vector<double>& z, const std::vector<int32_t>& tg, int64_t T, int64_t V) {
  LossRef r{std::vector<double>(static_cast<size_t>(T)), std::vector<double>(static_cast<size_t>(T)),
            std::vector<double>(static_cast<size_t>(T))};
  ops::ref::logprob_entropy_fwd<double>(z.data(), tg.data(), r.logprob.data(), r.entropy.data(), r.lse.data(), T, V);
  return r;
}

KS_ISA_SUITE(LogprobEntropy);

TEST_P(LogprobEntropy, ForwardMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [T, V] : kCases)
        for (bool with_entropy : {true, false}) {
          SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(T) + " V=" + std::to_string(V));
          const auto z = make_logits(T, V, 1, dt);
          const auto tg = make_targets(T, V);
          Tensor lp = nan_tensor({T}, DType::F32, dev), H = nan_tensor({T}, DType::F32, dev);
          Tensor lse = nan_tensor({T}, DType::F32, dev);
          ops::logprob_entropy_fwd(make_tensor(z, {T, V}, dt, dev), make_ids(tg, dev), lp, with_entropy ? &H : nullptr,
                                   lse);
          const auto want = ref_fwd(z, tg, T, V);
          // Inputs are exact in both dtypes and the math is f32: f32 tolerance either way.
          EXPECT_TRUE(close_for(DType::F32, values(lp), want.logprob, "logprob"));
          EXPECT_TRUE(close_for(DType::F32, values(lse), want.lse, "lse"));
          if (with_entropy) {
            EXPECT_TRUE(close_for(DType::F32, values(H), want.entropy, "entropy"));
          }
        }
}

TEST_P(LogprobEntropy, SpecialValues) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t T = 6, V = 700;
      auto z = make_logits(T, V, 2, dt);
      z[0 * V + 600] = kNaN;                                           // row 0: NaN everywhere
      z[1 * V + 5] = kInf;                                             // row 1: +inf -> NaN
      for (int64_t v = 0; v < 650; ++v) z[size_t(2 * V + v)] = -kInf;  // row 2: masked vocab, finite
      z[3 * V + 10] = -kInf;                                           // row 3: the target is -inf: logprob -inf
      for (int64_t v = 0; v < V; ++v) z[size_t(4 * V + v)] = -kInf;    // row 4: all -inf
      z[5 * V + 3] = 1e30;                                             // row 5: a huge logit: finite, one-hot
      z = round_to(z, dt);                                             // the huge logit as the kernel stores it
      std::vector<int32_t> tg = {1, 2, 660, 10, 0, 3};
      Tensor zt = make_tensor(z, {T, V}, dt, dev), tt = make_ids(tg, dev);
      Tensor lp = nan_tensor({T}, DType::F32, dev), H = nan_tensor({T}, DType::F32, dev);
      Tensor lse = nan_tensor({T}, DType::F32, dev);
      ops::logprob_entropy_fwd(zt, tt, lp, &H, lse);
      const auto want = ref_fwd(z, tg, T, V);
      EXPECT_TRUE(std::isnan(want.lse[0]) && std::isnan(want.lse[1]) && std::isfinite(want.entropy[2]));
      EXPECT_TRUE(std::isinf(want.logprob[3]) && std::isinf(want.lse[4]));
      EXPECT_TRUE(close_for(DType::F32, values(lp), want.logprob, "logprob"));
      EXPECT_TRUE(close_for(DType::F32, values(lse), want.lse, "lse"));
      EXPECT_TRUE(close_for(DType::F32, values(H), want.entropy, "entropy"));

      const auto dlp = randn(T, 3), dH = randn(T, 4);
      Tensor dz = nan_tensor({T, V}, dt, dev);
      Tensor dlpt = make_tensor(dlp, {T}, DType::F32, dev), dHt = make_tensor(dH, {T}, DType::F32, dev);
      ops::logprob_entropy_bwd(zt, tt, lse, dlpt, &dHt, dz);
      std::vector<double> rdz(z.size());
      const auto lse_f32 = values(lse), dlp32 = round_to(dlp, DType::F32), dH32 = round_to(dH, DType::F32);
      ops::ref::logprob_entropy_bwd<double>(z.data(), tg.data(), lse_f32.data(), dlp32.data(), dH32.data(), rdz.data(),
                                            T, V);
      EXPECT_TRUE(close_for(dt, values(dz), rdz, "dlogits"));
    }
}

TEST_P(LogprobEntropy, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t T = 4, V = 6;
  const auto z = make_logits(T, V, 5, DType::F32);
  const std::vector<int32_t> tg = {2, -100, 5, 0};
  const auto rl = randn(T, 6), rh = randn(T, 7);  // L = sum rl * logprob + rh * entropy
  auto L = [&](const std::vector<double>& x) {
    const auto f = ref_fwd(x, tg, T, V);
    return dot(rl, f.logprob) + dot(rh, f.entropy);
  };
  const auto f = ref_fwd(z, tg, T, V);
  std::vector<double> dz(z.size());
  ops::ref::logprob_entropy_bwd<double>(z.data(), tg.data(), f.lse.data(), rl.data(), rh.data(), dz.data(), T, V);
  EXPECT_TRUE(matches_finite_difference(L, z, dz, "dlogits"));
}

TEST_P(LogprobEntropy, BackwardMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [T, V] : kCases)
        for (bool with_entropy : {true, false})
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(T) + " V=" + std::to_string(V) +
                         (with_entropy ? " entropy" : "") + (in_place ? " in-place" : ""));
            const auto z = make_logits(T, V, 8, dt);
            const auto tg = make_targets(T, V);
            const auto dlp = round_to(randn(T, 9), DType::F32), dH = round_to(randn(T, 10), DType::F32);
            Tensor zt = make_tensor(z, {T, V}, dt, dev), tt = make_ids(tg, dev);
            Tensor lp = Tensor::empty({T}, DType::F32), H = Tensor::empty({T}, DType::F32);
            Tensor lse = Tensor::empty({T}, DType::F32);
            ops::logprob_entropy_fwd(zt, tt, lp, &H, lse);
            Tensor dlpt = make_tensor(dlp, {T}, DType::F32, dev), dHt = make_tensor(dH, {T}, DType::F32, dev);
            Tensor dz = in_place ? zt : nan_tensor({T, V}, dt, dev);
            ops::logprob_entropy_bwd(zt, tt, lse, dlpt, with_entropy ? &dHt : nullptr, dz);
            std::vector<double> rdz(z.size());
            const auto lse_f32 = values(lse);
            ops::ref::logprob_entropy_bwd<double>(z.data(), tg.data(), lse_f32.data(), dlp.data(),
                                                  with_entropy ? dH.data() : nullptr, rdz.data(), T, V);
            EXPECT_TRUE(close_for(dt, values(dz), rdz, "dlogits"));
          }
}

KS_ISA_SUITE(CrossEntropy);

TEST_P(CrossEntropy, MatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [T, V] : kCases) {
        SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(T) + " V=" + std::to_string(V));
        const auto z = make_logits(T, V, 11, dt);
        const auto tg = make_targets(T, V);
        Tensor zt = make_tensor(z, {T, V}, dt, dev), tt = make_ids(tg, dev);
        Tensor lse = nan_tensor({T}, DType::F32, dev);
        const double loss = ops::cross_entropy_fwd(zt, tt, lse);
        std::vector<double> rlse(static_cast<size_t>(T)), scratch(static_cast<size_t>(T));
        const double want = ops::ref::cross_entropy_fwd<double>(z.data(), tg.data(), rlse.data(), scratch.data(), T, V);
        EXPECT_NEAR(loss, want, 1e-5 + 1e-5 * std::abs(want));
        EXPECT_TRUE(close_for(DType::F32, values(lse), rlse, "lse"));

        const double dloss = 0.75;
        Tensor dz = nan_tensor({T, V}, dt, dev);
        ops::cross_entropy_bwd(zt, tt, lse, dloss, dz);
        std::vector<double> rdz(z.size());
        const auto lse_f32 = values(lse);
        ops::ref::cross_entropy_bwd<double>(z.data(), tg.data(), lse_f32.data(), dloss, rdz.data(), T, V);
        EXPECT_TRUE(close_for(dt, values(dz), rdz, "dlogits"));
        ops::cross_entropy_bwd(zt, tt, lse, dloss, zt);  // in place over the logits
        EXPECT_TRUE(close_for(dt, values(zt), rdz, "dlogits in place"));
      }
}

TEST_P(CrossEntropy, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t T = 4, V = 5;
  const auto z = make_logits(T, V, 12, DType::F32);
  const std::vector<int32_t> tg = {4, -100, 0, 2};
  const double dloss = 1.7;
  auto L = [&](const std::vector<double>& x) {
    std::vector<double> lse(static_cast<size_t>(T)), scratch(static_cast<size_t>(T));
    return dloss * ops::ref::cross_entropy_fwd<double>(x.data(), tg.data(), lse.data(), scratch.data(), T, V);
  };
  std::vector<double> lse(static_cast<size_t>(T)), scratch(static_cast<size_t>(T)), dz(z.size());
  ops::ref::cross_entropy_fwd<double>(z.data(), tg.data(), lse.data(), scratch.data(), T, V);
  ops::ref::cross_entropy_bwd<double>(z.data(), tg.data(), lse.data(), dloss, dz.data(), T, V);
  EXPECT_TRUE(matches_finite_difference(L, z, dz, "dlogits"));
}

TEST_P(CrossEntropy, AllIgnoredIsZero) {
  const int64_t T = 3, V = 4;
  Tensor z = make_tensor(randn(T * V, 13), {T, V}, DType::F32), tt = make_ids({-100, -1, -100});
  Tensor lse = Tensor::empty({T}, DType::F32), dz = nan_tensor({T, V}, DType::F32);
  EXPECT_EQ(ops::cross_entropy_fwd(z, tt, lse), 0.0);
  ops::cross_entropy_bwd(z, tt, lse, 1.0, dz);
  for (double v : values(dz)) EXPECT_EQ(v, 0.0);
}

TEST_P(LogprobEntropy, RejectsBadArguments) {
  const int64_t T = 2, V = 5;
  Tensor z = Tensor::zeros({T, V}, DType::F32), lp = Tensor::zeros({T}, DType::F32),
         lse = Tensor::zeros({T}, DType::F32);
  try {
    ops::logprob_entropy_fwd(z, make_ids({1, 5}), lp, nullptr, lse);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("targets[1] = 5 is outside the vocabulary [0, 5)"), std::string::npos)
        << e.what();
  }
  Tensor lp_bf16 = Tensor::zeros({T}, DType::BF16);
  EXPECT_THROW(ops::logprob_entropy_fwd(z, make_ids({1, 2}), lp_bf16, nullptr, lse), Error);
  Tensor dz_bad = Tensor::zeros({T, V + 1}, DType::F32);
  EXPECT_THROW(ops::cross_entropy_bwd(z, make_ids({1, 2}), lse, 1.0, dz_bad), Error);
}

}  // namespace
}  // namespace kestrel
