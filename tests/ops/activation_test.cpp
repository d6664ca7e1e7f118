// ops::swiglu against the double reference, the reference backward against
// finite differences, special values; and the CPU backend's vectorised exp.
#include "ops/activation.h"

#include <gtest/gtest.h>

#include <bit>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "op_harness.h"
#include "ops/ref/activation_ref.h"

namespace kestrel {
namespace {

using namespace testing;

const std::pair<int64_t, int64_t> kCases[] = {{1, 1}, {1, 17}, {5, 33}, {48, 150}};

KS_ISA_SUITE(SwiGlu);

TEST_P(SwiGlu, ForwardMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [T, F] : kCases) {
        SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(T) + " F=" + std::to_string(F));
        const auto g = round_to(randn(T * F, 1, 3.0), dt), u = round_to(randn(T * F, 2), dt);
        Tensor h = nan_tensor({T, F}, dt, dev);
        ops::swiglu_fwd(make_tensor(g, {T, F}, dt, dev), make_tensor(u, {T, F}, dt, dev), h);
        std::vector<double> want(g.size());
        ops::ref::swiglu_fwd<double>(g.data(), u.data(), want.data(), T * F);
        EXPECT_TRUE(close_for(dt, values(h), want, "h"));
      }
}

TEST_P(SwiGlu, ForwardInPlaceOverUp) {
  const int64_t T = 3, F = 20;
  const auto g = randn(T * F, 3), u = randn(T * F, 4);
  Tensor ut = make_tensor(u, {T, F}, DType::F32);
  ops::swiglu_fwd(make_tensor(g, {T, F}, DType::F32), ut, ut);
  std::vector<double> want(g.size());
  ops::ref::swiglu_fwd<double>(round_to(g, DType::F32).data(), round_to(u, DType::F32).data(), want.data(), T * F);
  EXPECT_TRUE(close_for(DType::F32, values(ut), want, "h over up"));
}

TEST_P(SwiGlu, NanInfPropagate) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t T = 2, F = 19;
      auto g = round_to(randn(T * F, 5), dt), u = round_to(randn(T * F, 6), dt), dh = round_to(randn(T * F, 7), dt);
      g[0] = kNaN;
      g[1] = kInf;    // silu(+inf) = inf
      g[2] = -kInf;   // silu(-inf) = -inf / inf = NaN (x / (1 + exp(-x)), as in the reference)
      g[3] = -100.0;  // silu -> -0, exp(100) overflows f32: must still be finite
      g[4] = 95.0;    // exp(-95) underflows: silu = x
      u[5] = kInf;
      u[6] = kNaN;
      dh[7] = kNaN;
      dh[8] = kInf;
      Tensor gt = make_tensor(g, {T, F}, dt, dev), ut = make_tensor(u, {T, F}, dt, dev);
      Tensor h = nan_tensor({T, F}, dt, dev);
      ops::swiglu_fwd(gt, ut, h);
      std::vector<double> want(g.size());
      ops::ref::swiglu_fwd<double>(g.data(), u.data(), want.data(), T * F);
      EXPECT_TRUE(close_for(dt, values(h), want, "h"));

      Tensor dg = nan_tensor({T, F}, dt, dev), du = nan_tensor({T, F}, dt, dev);
      ops::swiglu_bwd(gt, ut, make_tensor(dh, {T, F}, dt, dev), dg, du);
      std::vector<double> rdg(g.size()), rdu(g.size());
      ops::ref::swiglu_bwd<double>(g.data(), u.data(), dh.data(), rdg.data(), rdu.data(), T * F);
      EXPECT_TRUE(close_for(dt, values(dg), rdg, "dgate"));
      EXPECT_TRUE(close_for(dt, values(du), rdu, "dup"));
    }
}

TEST_P(SwiGlu, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 12;
  const auto g = randn(n, 8, 3.0), u = randn(n, 9), r = randn(n, 10);
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> h(static_cast<size_t>(n));
    ops::ref::swiglu_fwd<double>(p.data(), p.data() + n, h.data(), n);
    return dot(r, h);
  };
  std::vector<double> dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
  ops::ref::swiglu_bwd<double>(g.data(), u.data(), r.data(), dg.data(), du.data(), n);
  EXPECT_TRUE(matches_finite_difference(L, concat({g, u}), concat({dg, du}), "d(gate, up)"));
}

TEST_P(SwiGlu, BackwardMatchesReference) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes())
      for (auto [T, F] : kCases) {
        SCOPED_TRACE(case_name(dev, dt) + " T=" + std::to_string(T) + " F=" + std::to_string(F));
        const auto g = round_to(randn(T * F, 11, 3.0), dt), u = round_to(randn(T * F, 12), dt);
        const auto dh = round_to(randn(T * F, 13), dt);
        Tensor dg = nan_tensor({T, F}, dt, dev), du = nan_tensor({T, F}, dt, dev);
        ops::swiglu_bwd(make_tensor(g, {T, F}, dt, dev), make_tensor(u, {T, F}, dt, dev),
                        make_tensor(dh, {T, F}, dt, dev), dg, du);
        std::vector<double> rdg(g.size()), rdu(g.size());
        ops::ref::swiglu_bwd<double>(g.data(), u.data(), dh.data(), rdg.data(), rdu.data(), T * F);
        EXPECT_TRUE(close_for(dt, values(dg), rdg, "dgate"));
        EXPECT_TRUE(close_for(dt, values(du), rdu, "dup"));
      }
}

TEST_P(SwiGlu, BackwardInPlace) {
  // dgate over gate and dup over dh: the activation-memory-saving layout.
  const int64_t T = 4, F = 9;
  const auto g = randn(T * F, 14), u = randn(T * F, 15), dh = randn(T * F, 16);
  Tensor gt = make_tensor(g, {T, F}, DType::F32), ut = make_tensor(u, {T, F}, DType::F32);
  Tensor dht = make_tensor(dh, {T, F}, DType::F32);
  ops::swiglu_bwd(gt, ut, dht, gt, dht);
  std::vector<double> rdg(g.size()), rdu(g.size());
  ops::ref::swiglu_bwd<double>(round_to(g, DType::F32).data(), round_to(u, DType::F32).data(),
                               round_to(dh, DType::F32).data(), rdg.data(), rdu.data(), T * F);
  EXPECT_TRUE(close_for(DType::F32, values(gt), rdg, "dgate over gate"));
  EXPECT_TRUE(close_for(DType::F32, values(dht), rdu, "dup over dh"));
  EXPECT_THROW(ops::swiglu_bwd(gt, ut, dht, dht, dht), Error);
}

TEST_P(SwiGlu, RejectsBadArguments) {
  Tensor g = Tensor::zeros({2, 4}, DType::F32), u = Tensor::zeros({2, 4}, DType::BF16),
         h = Tensor::zeros({2, 4}, DType::F32);
  EXPECT_THROW(ops::swiglu_fwd(g, u, h), Error);
  Tensor u2 = Tensor::zeros({2, 5}, DType::F32);
  EXPECT_THROW(ops::swiglu_fwd(g, u2, h), Error);
}

TEST(CpuExp, AccurateAndExactSpecials) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = float(i) * 4.4e-4f;  // [-88, 88]
    const double want = std::exp(double(x));
    if (want < 1.2e-37) continue;  // below 2^-122 the kernel may flush to zero
    worst = std::max(worst, std::abs(double(cpu::exp_f32(x)) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);  // ~3 ulp
  EXPECT_EQ(cpu::exp_f32(0.f), 1.f);
  EXPECT_EQ(cpu::exp_f32(-kInf), 0.f);
  EXPECT_EQ(cpu::exp_f32(float(kInf)), float(kInf));
  EXPECT_EQ(cpu::exp_f32(89.f), float(kInf));
  EXPECT_EQ(cpu::exp_f32(-200.f), 0.f);
  EXPECT_TRUE(std::isnan(cpu::exp_f32(float(kNaN))));
  EXPECT_TRUE(std::isfinite(cpu::exp_f32(88.72f)));
}

// The kernels' lane-wise exp and bf16 conversions (kernel_util.h simd::) must
// give the scalar helpers' bits, specials included: elements in a vector body
// and in a row's tail then round identically.
TEST(CpuSimd, LaneWiseHelpersMatchScalarBitwise) {
  using cpu::simd::kW;
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  std::vector<float> xs = {0.f, -0.f, float(kNaN), -float(kNaN), float(kInf), -float(kInf), 88.72283f, 88.73f,
                           -86.6f, -86.7f, -87.5f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 1.00390625f, 1.01171875f};
  for (int i = 0; i < 20000; ++i) xs.push_back(float(randn(1, uint64_t(i) + 7)[0]) * float(1 << (i % 8)) * 4.f);
  while (xs.size() % size_t(kW)) xs.push_back(0.5f);
  for (size_t i = 0; i < xs.size(); i += size_t(kW)) {
    float e[kW], r[kW], back[kW];
    cpu::bf16_bits h[kW];
    cpu::simd::store(e, cpu::simd::exp(cpu::simd::load(xs.data() + i)));
    cpu::simd::store(r, cpu::simd::round_to<cpu::bf16_bits>(cpu::simd::load(xs.data() + i)));
    cpu::simd::store(h, cpu::simd::load(xs.data() + i));
    cpu::simd::store(back, cpu::simd::load(h));
    for (int64_t j = 0; j < kW; ++j) {
      const float x = xs[i + size_t(j)];
      ASSERT_EQ(bits(e[j]), bits(cpu::exp_f32(x))) << x;
      ASSERT_EQ(bits(r[j]), bits(cpu::round_to<cpu::bf16_bits>(x))) << x;
      ASSERT_EQ(h[j], cpu::f32_to_bf16(x)) << x;
      ASSERT_EQ(bits(back[j]), bits(cpu::load_f32(h, j))) << x;
    }
  }
  // Partial loads zero the lanes past n; partial stores leave memory past n alone.
  for (int64_t n = 1; n <= kW; ++n) {
    std::vector<float> src(size_t(kW), 2.f), dst(size_t(kW) + 1, -1.f);
    float got[kW];
    cpu::simd::store(got, cpu::simd::load_part(src.data(), n));
    for (int64_t j = 0; j < kW; ++j) EXPECT_EQ(got[j], j < n ? 2.f : 0.f);
    cpu::simd::store_part(dst.data(), n, cpu::simd::splat(3.f));
    for (int64_t j = 0; j <= kW; ++j) EXPECT_EQ(dst[size_t(j)], j < n ? 3.f : -1.f);
  }
}

TEST(CpuBf16, RoundingMatchesCore) {
  for (float f : {1.f, 1.00390625f, 1.01171875f, -3.3e38f, 3.4e38f, 1e-40f, float(kNaN), float(kInf), -0.f}) {
    EXPECT_EQ(cpu::f32_to_bf16(f), float_to_bf16(f)) << f;
  }
  for (int i = 0; i < 100000; ++i) {
    const float f = float(randn(1, uint64_t(i) + 100)[0]) * float(1 << (i % 20));
    ASSERT_EQ(cpu::f32_to_bf16(f), float_to_bf16(f)) << f;
  }
}

}  // namespace
}  // namespace kestrel
