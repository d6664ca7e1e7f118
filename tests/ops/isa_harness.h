// Running kernel tests once per kernel ISA level the machine supports
// (backend/cpu/isa.h): avx2 always, avx512 where the CPU has it. Each run
// sets the level with set_kernel_isa and restores it afterwards, so every
// existing check (against the double reference, finite differences,
// thread-count independence, bitwise repeatability) holds per level.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu_features.h"

namespace kestrel::testing {

inline std::vector<IsaLevel> kernel_isas() {
  std::vector<IsaLevel> v{IsaLevel::Avx2};
  if (machine_isa() == IsaLevel::Avx512) v.push_back(IsaLevel::Avx512);
  return v;
}

// Sets the kernels' level for a scope.
struct IsaScope {
  IsaLevel prev;
  explicit IsaScope(IsaLevel isa) : prev(kernel_isa()) { set_kernel_isa(isa); }
  ~IsaScope() { set_kernel_isa(prev); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

// Fixture of a suite whose every test runs once per level (KS_ISA_SUITE).
class IsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override { scope_ = std::make_unique<IsaScope>(GetParam()); }
  void TearDown() override { scope_.reset(); }
  std::unique_ptr<IsaScope> scope_;
};

// Fixture of a suite with its own parameter P, crossed with the levels.
template <class P>
class IsaParamTest : public ::testing::TestWithParam<std::tuple<P, IsaLevel>> {
 protected:
  void SetUp() override { scope_ = std::make_unique<IsaScope>(std::get<1>(this->GetParam())); }
  void TearDown() override { scope_.reset(); }
  P param() const { return std::get<0>(this->GetParam()); }
  std::unique_ptr<IsaScope> scope_;
};

inline std::string isa_test_name(const ::testing::TestParamInfo<IsaLevel>& info) { return isa_name(info.param); }

}  // namespace kestrel::testing

// Declares suite `Suite` as running each TEST_P(Suite, ...) once per level:
// test names Isa/Suite.Name/avx2, Isa/Suite.Name/avx512.
#define KS_ISA_SUITE(Suite)                                                                     \
  class Suite : public ::kestrel::testing::IsaTest {};                                          \
  INSTANTIATE_TEST_SUITE_P(Isa, Suite, ::testing::ValuesIn(::kestrel::testing::kernel_isas()), \
                           ::kestrel::testing::isa_test_name)
