// cpu::packed_linear (weights packed once by oneDNN's matmul) against a
// double reference computed from the stored operands: row counts on both
// sides of the rollout's skinny limit, sizes that are not multiples of the
// library's blocks, f32 and bf16 (bf16 y rounded once), biases of either
// dtype; the pack is a copy; what turns packing off.
#include "backend/cpu/packed_linear.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/packed_choice.h"
#include "backend_cpu/linear_reference.h"
#include "common/testing.h"
#include "core/files.h"
#include "io/io_test_util.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace kestrel::cpu {
namespace {

Tensor random_tensor(Shape shape, DType dt, uint64_t seed) {
  return testing::random_linear_operand(std::move(shape), dt, seed, 0x9ac4ULL);
}
using testing::nan_tensor;
::testing::AssertionResult matches_reference(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
  return testing::linear_matches_reference(x, w, b, y);
}

using EnvScope = testing::ScopedEnv;

class PackedLinear : public ::testing::Test {
 protected:
  void SetUp() override {
    // The suite's own choice, whatever the test run sets (run_tests.sh's
    // OpenBLAS passes set KESTREL_BLAS).
    blas_ = std::make_unique<EnvScope>("KESTREL_BLAS", nullptr);
    // These tests check the packed product itself: packed whatever this
    // machine's measured verdict (packed_choice.h), which they test below.
    packed_ = std::make_unique<EnvScope>("KESTREL_PACKED_WEIGHTS", "1");
    std::string why;
    if (!packed_linear_enabled(&why)) GTEST_SKIP() << "packing is off here: " << why;
  }
  std::unique_ptr<EnvScope> blas_, packed_;
};

TEST_F(PackedLinear, F32MatchesTheReference) {
  struct Case {
    int64_t in, out;
  };
  const std::vector<Case> cases = {{1, 1}, {7, 3}, {13, 37}, {64, 9}, {100, 31}, {259, 65}, {512, 96}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const Tensor w = random_tensor({c.out, c.in}, DType::F32, seed++);
    const auto p = pack_linear_weight(w);
    ASSERT_TRUE(p);
    EXPECT_EQ(packed_rows(*p), c.out);
    EXPECT_EQ(packed_cols(*p), c.in);
    EXPECT_EQ(packed_bytes(*p), packed_linear_bytes(c.out, c.in, DType::F32));
    for (int64_t M : {1, 2, 31, 33, 100, 257})
      for (bool bias : {false, true}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) +
                     (bias ? " bias" : ""));
        const Tensor x = random_tensor({M, c.in}, DType::F32, seed++);
        const Tensor b = random_tensor({c.out}, DType::F32, seed++);
        Tensor y = nan_tensor({M, c.out}, DType::F32);
        ASSERT_TRUE(packed_linear_applies(*p, x, bias ? &b : nullptr, y));
        packed_linear(*p, x, bias ? &b : nullptr, y);
        EXPECT_TRUE(matches_reference(x, w, bias ? &b : nullptr, y));
      }
  }
}

TEST_F(PackedLinear, Bf16WeightsAndInputsWithF32OrBf16OutputAndBias) {
  // Without AVX-512 (or with DNNL_MAX_CPU_ISA=AVX2) oneDNN has no fast bf16
  // matmul: bf16 weights are then not packed, and the rollout widens them.
  if (packed_linear_bytes(70, 150, DType::BF16) == 0) {
    EXPECT_EQ(pack_linear_weight(random_tensor({70, 150}, DType::BF16, 1)), nullptr);
    GTEST_SKIP() << "oneDNN has no fast bf16 matmul here: bf16 weights are not packed";
  }
  uint64_t seed = 500;
  for (DType yd : {DType::F32, DType::BF16})
    for (DType bd : {DType::F32, DType::BF16})
      for (int64_t M : {3, 40, 129}) {
        SCOPED_TRACE(std::string("y ") + dtype_name(yd) + " b " + dtype_name(bd) + " M=" + std::to_string(M));
        const Tensor w = random_tensor({70, 150}, DType::BF16, seed++);
        const Tensor x = random_tensor({M, 150}, DType::BF16, seed++);
        const Tensor b = random_tensor({70}, bd, seed++);
        const auto p = pack_linear_weight(w);
        ASSERT_TRUE(p);
        EXPECT_EQ(packed_dtype(*p), DType::BF16);
        Tensor y = nan_tensor({M, 70}, yd);
        packed_linear(*p, x, &b, y);
        EXPECT_TRUE(matches_reference(x, w, &b, y));
      }
}

// The pack is a copy taken at packing time: later writes to the weight do
// not reach it, and the weight's fingerprint then differs from the pack's.
TEST_F(PackedLinear, ThePackIsACopyAndItsFingerprintTellsAChange) {
  Tensor w = random_tensor({48, 80}, DType::F32, 7);
  const Tensor w0 = w.clone();
  const auto p = pack_linear_weight(w);
  ASSERT_TRUE(p);
  EXPECT_EQ(packed_fingerprint(*p), weight_fingerprint(w));
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, w.get(i) * 0.5f + 0.25f);  // an update moves every element
  EXPECT_NE(packed_fingerprint(*p), weight_fingerprint(w));
  const Tensor x = random_tensor({50, 80}, DType::F32, 8);
  Tensor y = nan_tensor({50, 48}, DType::F32);
  packed_linear(*p, x, nullptr, y);
  EXPECT_TRUE(matches_reference(x, w0, nullptr, y));
}

TEST_F(PackedLinear, AgreesAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  const Tensor w = random_tensor({301, 257}, DType::F32, 21);
  const auto p = pack_linear_weight(w);
  ASSERT_TRUE(p);
  const Tensor x = random_tensor({97, 257}, DType::F32, 22);
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor y = nan_tensor({97, 301}, DType::F32);
    packed_linear(*p, x, nullptr, y);
    EXPECT_TRUE(matches_reference(x, w, nullptr, y)) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

TEST_F(PackedLinear, NanPropagatesToItsRow) {
  const Tensor w = random_tensor({40, 64}, DType::F32, 31);
  const auto p = pack_linear_weight(w);
  Tensor x = random_tensor({36, 64}, DType::F32, 32);
  x.set(5 * 64 + 3, std::numeric_limits<float>::quiet_NaN());
  Tensor y = nan_tensor({36, 40}, DType::F32);
  packed_linear(*p, x, nullptr, y);
  const std::vector<double> yv = testing::to_double(y);
  for (int64_t t = 0; t < 36; ++t)
    for (int64_t n = 0; n < 40; ++n) EXPECT_EQ(std::isnan(yv[size_t(t * 40 + n)]), t == 5) << t << ", " << n;
}

TEST_F(PackedLinear, RejectsWhatItDoesNotTake) {
  const Tensor w = random_tensor({4, 8}, DType::F32, 1);
  const auto p = pack_linear_weight(w);
  const Tensor x = random_tensor({40, 8}, DType::F32, 2);
  Tensor y = Tensor::empty({40, 4}, DType::F32);
  EXPECT_TRUE(packed_linear_applies(*p, x, nullptr, y));
  const Tensor x_bf16 = random_tensor({40, 8}, DType::BF16, 3);  // dtype other than the weight's
  EXPECT_FALSE(packed_linear_applies(*p, x_bf16, nullptr, y));
  const Tensor x_bad = random_tensor({40, 7}, DType::F32, 4);
  EXPECT_FALSE(packed_linear_applies(*p, x_bad, nullptr, y));
  const Tensor b_bad = random_tensor({3}, DType::F32, 5);
  EXPECT_FALSE(packed_linear_applies(*p, x, &b_bad, y));
  Tensor y_bad = Tensor::empty({39, 4}, DType::F32);
  EXPECT_FALSE(packed_linear_applies(*p, x, nullptr, y_bad));
  EXPECT_THROW(packed_linear(*p, x, nullptr, y_bad), Error);
  EXPECT_THROW(pack_linear_weight(Tensor::zeros({4, 8}, DType::I32)), Error);
}

// What turns packing off: the switch, a GEMM library other than oneDNN named
// by the user, and deterministic mode (whose GEMMs are fixed tiles).
TEST_F(PackedLinear, OffBySwitchByAnotherLibraryAndInDeterministicMode) {
  const Tensor w = random_tensor({4, 8}, DType::F32, 1);
  std::string why;
  {
    EnvScope off("KESTREL_PACKED_WEIGHTS", "0");
    EXPECT_FALSE(packed_linear_enabled(&why));
    EXPECT_EQ(why, "KESTREL_PACKED_WEIGHTS=0");
    EXPECT_EQ(pack_linear_weight(w), nullptr);
    EXPECT_EQ(packed_linear_bytes(4, 8, DType::F32), 0);
  }
  {
    EnvScope blas("KESTREL_BLAS", "openblas");
    EXPECT_FALSE(packed_linear_enabled(&why));
    EXPECT_EQ(why, "KESTREL_BLAS=openblas");
  }
  {
    EnvScope blas("KESTREL_BLAS", "dnnl");
    EXPECT_TRUE(packed_linear_enabled(&why));
    EXPECT_NE(why.find("oneDNN"), std::string::npos) << why;
  }
  set_deterministic(true);
  EXPECT_FALSE(packed_linear_enabled(&why));
  set_deterministic(false);
  EXPECT_TRUE(packed_linear_enabled());
  {
    EnvScope bad("KESTREL_PACKED_WEIGHTS", "yes");
    try {
      packed_linear_enabled();
      ADD_FAILURE() << "KESTREL_PACKED_WEIGHTS=yes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KESTREL_PACKED_WEIGHTS='yes'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
    }
  }
}

// f32 weights pack only where the packed product is not slower than the
// BLAS at decode rows: 1 and 0 decide at every call, auto measures once per
// machine and caches the verdict, which every later process reads.
TEST_F(PackedLinear, F32VerdictFollowsTheSwitchThenTheMeasurement) {
  // The GEMM choice from the usual cache before KESTREL_CACHE moves below (the
  // fixture's KESTREL_PACKED_WEIGHTS=1 keeps gemm_init from measuring packing).
  ASSERT_TRUE(gemm_init().is_ok());
  const Tensor w = random_tensor({4, 8}, DType::F32, 1);
  std::string why;
  {
    EnvScope on("KESTREL_PACKED_WEIGHTS", "1");
    EXPECT_TRUE(packed_f32_verdict().pack);
    EXPECT_TRUE(dtype_packs_here(DType::F32, &why));
    EXPECT_NE(why.find("KESTREL_PACKED_WEIGHTS=1"), std::string::npos) << why;
    EXPECT_NE(pack_linear_weight(w), nullptr);
  }
  testing::TempDir dir;
  EnvScope cache("KESTREL_CACHE", dir.path().c_str());
  EnvScope autos("KESTREL_PACKED_WEIGHTS", "auto");
  const PackedF32Verdict& v = packed_f32_verdict();
  EXPECT_GT(v.packed_gflops, 0);
  EXPECT_GT(v.blas_gflops, 0);
  EXPECT_EQ(v.pack, packed_wins(v.packed_gflops, v.blas_gflops));
  EXPECT_EQ(dtype_packs_here(DType::F32, &why), v.pack);
  EXPECT_NE(why.find("GFLOP/s at decode rows"), std::string::npos) << why;
  EXPECT_EQ(pack_linear_weight(w) != nullptr, v.pack);
  EXPECT_EQ(packed_linear_bytes(4, 8, DType::F32) > 0, v.pack);
  // Decided once: a second call is the same object, measured or read once.
  EXPECT_EQ(&packed_f32_verdict(), &v);
}

TEST(PackedChoice, RuleSwitchAndCache) {
  EXPECT_TRUE(packed_wins(100, 104));   // a near tie keeps the packed path
  EXPECT_FALSE(packed_wins(100, 105));  // the BLAS 5% faster: not packed
  EXPECT_TRUE(packed_wins(200, 150));
  EXPECT_EQ(pack_switch_from_env(nullptr).value(), PackSwitch::Auto);
  EXPECT_EQ(pack_switch_from_env("").value(), PackSwitch::Auto);
  EXPECT_EQ(pack_switch_from_env("auto").value(), PackSwitch::Auto);
  EXPECT_EQ(pack_switch_from_env("1").value(), PackSwitch::On);
  EXPECT_EQ(pack_switch_from_env("0").value(), PackSwitch::Off);
  EXPECT_FALSE(pack_switch_from_env("on").is_ok());

  testing::TempDir dir;
  const std::string key = packed_cache_key(2);
  EXPECT_NE(key.find("threads 2"), std::string::npos) << key;
  EXPECT_NE(key.find("DNNL_MAX_CPU_ISA="), std::string::npos) << key;
  const std::string file = packed_cache_file(dir.path(), key);
  EXPECT_NE(file.find("/packed-"), std::string::npos) << file;
  Result<std::optional<PackedF32Verdict>> none = read_packed_cache(file, key);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  PackedF32Verdict v;
  v.pack = false;
  v.packed_gflops = 105;
  v.blas_gflops = 150;
  v.cpu_share = 0.5;
  ASSERT_TRUE(write_file_atomic(file, packed_cache_text(key, v)).is_ok());
  Result<std::optional<PackedF32Verdict>> back = read_packed_cache(file, key);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  ASSERT_TRUE(back->has_value());
  EXPECT_FALSE((*back)->pack);
  EXPECT_EQ((*back)->packed_gflops, 105);
  EXPECT_EQ((*back)->blas_gflops, 150);
  EXPECT_NE(describe_packed_f32(**back).find("other processes held the cores"), std::string::npos);
  // Another key's entry is not ours; a damaged one is an error naming the file.
  Result<std::optional<PackedF32Verdict>> other = read_packed_cache(file, key + "x");
  ASSERT_TRUE(other.is_ok());
  EXPECT_FALSE(other->has_value());
  ASSERT_TRUE(write_file_atomic(file, "{\"key\": \"" + key + "\", \"pack\": 1}").is_ok());
  Result<std::optional<PackedF32Verdict>> bad = read_packed_cache(file, key);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(file), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace kestrel::cpu
