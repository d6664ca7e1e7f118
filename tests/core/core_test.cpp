#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

using namespace kestrel;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half an ulp above 1.0: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is half an ulp above 1+2^-7 (odd): rounds up to 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, F16RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + std::ldexp(1.0f, -11))), 1.0f);  // tie to even
}

TEST(Tensor, ViewsShareStorageAndOffsets) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  EXPECT_EQ(rows.get(0), 2.0f);
  rows.set(3, 42.0f);
  EXPECT_EQ(t.get(5), 42.0f);
  Tensor flat = t.view({-1});
  EXPECT_EQ(flat.numel(), 6);
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.slice_rows(2, 4), Error);
}

TEST(Tensor, ConvertsBetweenDtypes) {
  Tensor t = Tensor::from_vector({1.5f, -2.25f, 3.0f}, {3});
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  Tensor back = b.to(DType::F32);
  EXPECT_EQ(back.to_float_vector(), (std::vector<float>{1.5f, -2.25f, 3.0f}));
  Tensor i = t.to(DType::I64);
  EXPECT_EQ(i.get(1), -2.0f);
}

TEST(Allocator, AccountsLiveAndPeakByCategory) {
  auto& a = cpu_allocator();
  const auto before = a.stats();
  {
    Tensor p = Tensor::empty({1024}, DType::F32, MemCategory::OptimizerState);
    Tensor q = Tensor::empty({512}, DType::BF16, MemCategory::OptimizerState);
    auto s = a.stats();
    EXPECT_EQ(s.live_of(MemCategory::OptimizerState) - before.live_of(MemCategory::OptimizerState), 4096 + 1024);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.raw()) % CpuAllocator::kAlignment, 0u);
  }
  auto after = a.stats();
  EXPECT_EQ(after.live_of(MemCategory::OptimizerState), before.live_of(MemCategory::OptimizerState));
  EXPECT_GE(after.peak_of(MemCategory::OptimizerState), before.live_of(MemCategory::OptimizerState) + 5120);
}

TEST(Allocator, ReusesLargeActivationBlocksAndCountsOnlyLiveBytes) {
  auto& a = cpu_allocator();
  a.release_cache();
  const auto before = a.stats().live_of(MemCategory::Activations);
  const size_t n = CpuAllocator::kCacheMinBytes / 4 + 1000;  // floats: above the caching threshold
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({int64_t(n)}, DType::F32, MemCategory::Activations);
    first = t.raw();
  }
  EXPECT_GE(a.cached_bytes(), n * 4);
  EXPECT_EQ(a.stats().live_of(MemCategory::Activations), before);
  {
    // A slightly smaller request of the same size class gets the same block.
    Tensor t = Tensor::empty({int64_t(n - 100)}, DType::F32, MemCategory::Activations);
    EXPECT_EQ(t.raw(), first);
    EXPECT_EQ(a.cached_bytes(), 0u);
    EXPECT_EQ(a.stats().live_of(MemCategory::Activations) - before, int64_t(n - 100) * 4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % CpuAllocator::kAlignment, 0u);
  }
  {
    // Other categories are never cached (their memory goes back at once).
    Tensor kv = Tensor::empty({int64_t(n)}, DType::F32, MemCategory::KVCache);
  }
  EXPECT_GE(a.cached_bytes(), n * 4);
  EXPECT_LT(a.cached_bytes(), n * 4 * 5 / 4 + 64);
  a.release_cache();
  EXPECT_EQ(a.cached_bytes(), 0u);
}

TEST(Philox, MatchesPublishedKnownAnswer) {
  // Random123 kat_vectors: philox4x32_10 with counter and key all 0xffffffff.
  auto r = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
  auto z = philox4x32(0, 0, 0);
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
}

TEST(Philox, UniformAndNormalMoments) {
  Philox rng{1234, 7};
  double s = 0, s2 = 0, n1 = 0, n2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double u = rng.uniform(i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    s += u;
    s2 += u * u;
    double z = rng.normal(i);
    n1 += z;
    n2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.5, 0.005);
  EXPECT_NEAR(s2 / n - 0.25, 1.0 / 12, 0.005);
  EXPECT_NEAR(n1 / n, 0.0, 0.01);
  EXPECT_NEAR(n2 / n, 1.0, 0.02);
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = 5;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 5);
  Result<int> bad = KS_ERR("file ", "x.json", ": missing key");
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "file x.json: missing key");
  EXPECT_THROW(bad.value(), Error);
  try {
    KS_CHECK(1 == 2, "numbers ", 1, " and ", 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("numbers 1 and 2"), std::string::npos);
  }
}
