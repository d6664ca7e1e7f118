// Counter-based RNG (Philox-4x32-10, Salmon et al. 2011). A value is a pure
// function of (key, counter), so results never depend on thread count, batch
// composition or call order: the property sampling and dropout-free
// determinism rest on.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace kestrel {

using Philox4x32 = std::array<uint32_t, 4>;

// Ten rounds of Philox on a 128-bit counter with a 64-bit key.
inline Philox4x32 philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(kM0) * c0;
    uint64_t p1 = uint64_t(kM1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = uint32_t(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kW0; k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

// Uniform in [0, 1) with 24 bits of mantissa, from one 32-bit word.
inline float u32_to_unit_float(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }
// Uniform in [0, 1) with 53 bits, from two words.
inline double u32x2_to_unit_double(uint32_t a, uint32_t b) {
  uint64_t v = (uint64_t(a) << 21) ^ uint64_t(b >> 11);
  return double(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Stateless helpers: a stream is (key, stream id); element i is at counter (i, stream).
struct Philox {
  uint64_t key = 0;
  uint64_t stream = 0;
  double uniform_double(uint64_t i) const {
    auto r = philox4x32(i, stream, key);
    return u32x2_to_unit_double(r[0], r[1]);
  }
  float uniform(uint64_t i) const { return u32_to_unit_float(philox4x32(i, stream, key)[0]); }
  // Standard normal by Box-Muller on two independent words.
  float normal(uint64_t i) const {
    auto r = philox4x32(i, stream, key);
    double u1 = (double(r[0]) + 1.0) * (1.0 / 4294967297.0);  // (0, 1]
    double u2 = double(r[1]) * (1.0 / 4294967296.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

}  // namespace kestrel
