// GCC 12.2 wrong code with AVX-512 on, and the flag that avoids it (isa.h).
//
// Reproducer (tests/rl AggLoss.WeightsOfEveryMode first caught it): a
// function compiled with AVX-512 that builds std::vector<double>{1, 1, 1, 0}.
// GCC 12.2 (-O2 and -O3) turns the 32-byte constant into one vpbroadcastq of
// 1.0 from a general register, so m[3] reads 1. Measured on this project's
// build machine (Debian 12, g++ 12.2.0), each with -std=c++20:
//   wrong: -march=x86-64-v3 -mavx512f -mavx512bw -mavx512vl -mavx512dq
//          (also with -mtune=generic, -mtune=skylake-avx512,
//          -mprefer-vector-width=512), -march=skylake-avx512, -march=native
//          (Sapphire Rapids), -march=native -mtune=generic,
//          -march=x86-64-v3 -mtune=icelake-server|sapphirerapids (no AVX-512),
//          and the `#pragma GCC target("avx512f,...")` region of isa_each.inc;
//   right: -march=x86-64-v3 (generic tuning), and every one of the above plus
//          -mtune-ctrl=^inter_unit_moves_to_vec, which CMakeLists.txt gives
//          this file and the whole backend library.
// This test compiles the reproducer under the kernels' pragma with the
// backend's flags; it fails if the flag stops applying (or stops helping).
#include <gtest/gtest.h>

#include <vector>

#include "core/cpu_features.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
#endif
namespace kestrel::gcc12_repro {
// noinline + a runtime index: the vector must really be built in memory.
__attribute__((noinline)) double last_weight(volatile int* k) {
  std::vector<double> m{1, 1, 1, 0};
  return m[size_t(*k)];
}
__attribute__((noinline)) double second_of(volatile int* k) {
  std::vector<double> m{2, 0, 0, 0};  // the same pattern, one stored word
  return m[size_t(*k)];
}
}  // namespace kestrel::gcc12_repro
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

namespace kestrel {
namespace {

TEST(Gcc12Avx512, ConstantVectorsUnderTheKernelPragma) {
  if (machine_isa() != IsaLevel::Avx512) GTEST_SKIP() << "this CPU has no AVX-512: " << cpu_summary();
  volatile int three = 3, one = 1;
  EXPECT_EQ(gcc12_repro::last_weight(&three), 0.0) << "GCC stored {1, 1, 1, 0} as four 1.0 (see this file)";
  EXPECT_EQ(gcc12_repro::second_of(&one), 0.0);
}

}  // namespace
}  // namespace kestrel
