// The sampler's row passes (cpu::sampling_argmax, cpu::sampling_weights) at
// each ISA level against the scalar loops they replace: the weights bit for
// bit against exp_f32 lane by lane (so every level draws the same tokens),
// within exp_f32's error of std::exp, and the first-maximum rule with ties,
// NaN, -inf and the row's tail.
#include "backend/cpu/sampling_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "core/rng.h"
#include "ops/isa_harness.h"

namespace kestrel::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> logits(int64_t V, uint64_t seed) {
  Philox rng{seed, 7};
  std::vector<float> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) z[size_t(i)] = float(4.0 * rng.normal(uint64_t(i)));
  return z;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

KS_ISA_SUITE(SamplingCpu);

TEST_P(SamplingCpu, WeightsAreTheScalarLoopBitForBit) {
  for (int64_t V : {1, 7, 16, 17, 33, 100, 8195}) {
    std::vector<float> z = logits(V, uint64_t(V));
    if (V > 5) {  // specials: a masked token, a NaN, one far below the maximum
      z[2] = -kInf;
      z[3] = kNaN;
      z[size_t(V - 1)] = -200.f;
    }
    float mx = -kInf;
    for (float x : z) mx = x > mx ? x : mx;
    for (float temperature : {1.f, 0.7f})
      for (float min_w : {0.f, 0.05f}) {
        SCOPED_TRACE("V=" + std::to_string(V) + " T=" + std::to_string(temperature) + " min_w=" + std::to_string(min_w));
        const float inv_t = float(1.0 / temperature);
        std::vector<float> w(size_t(V), -1.f);
        const int64_t alive = sampling_weights(z.data(), V, mx, inv_t, min_w, w.data());
        int64_t want_alive = 0;
        for (int64_t i = 0; i < V; ++i) {
          const float e = exp_f32((z[size_t(i)] - mx) * inv_t);
          const float want = (e >= min_w && e > 0.f) ? e : 0.f;
          ASSERT_EQ(bits(w[size_t(i)]), bits(want)) << "i=" << i << " z=" << z[size_t(i)];
          want_alive += want > 0.f;
          const double ref = std::exp(double((z[size_t(i)] - mx) * inv_t));  // exp_f32's ~2 ulp
          if (want > 0.f) { EXPECT_NEAR(w[size_t(i)], ref, 4e-7 * ref) << "i=" << i; }
        }
        EXPECT_EQ(alive, want_alive);
        EXPECT_GE(alive, 1);  // the maximum itself weighs 1
      }
  }
}

TEST_P(SamplingCpu, ArgmaxIsTheFirstMaximum) {
  for (int64_t V : {1, 5, 16, 17, 100, 8195}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    std::vector<float> z = logits(V, 40 + uint64_t(V));
    int32_t want = 0;
    for (int64_t i = 1; i < V; ++i)
      if (z[size_t(i)] > z[size_t(want)]) want = int32_t(i);
    EXPECT_EQ(sampling_argmax(z.data(), V), want);
    if (V < 5) continue;
    z[size_t(V - 1)] = 1e6f;  // in the tail past the last full vector
    EXPECT_EQ(sampling_argmax(z.data(), V), V - 1);
    z[size_t(V / 2)] = 1e6f;  // a tie: the first wins
    z[1] = kNaN;              // NaN never compares greater
    EXPECT_EQ(sampling_argmax(z.data(), V), V / 2);
    z[size_t(V / 3)] = kInf;
    EXPECT_EQ(sampling_argmax(z.data(), V), V / 3);
  }
  std::vector<float> masked(20, -kInf);
  masked[7] = kNaN;
  EXPECT_EQ(sampling_argmax(masked.data(), 20), 0);  // nothing above -inf: token 0, as before
}

}  // namespace
}  // namespace kestrel::cpu
