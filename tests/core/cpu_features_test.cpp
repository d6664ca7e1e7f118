#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace kestrel {
namespace {

// The flags Linux derives from the same cpuid bits: the two readings agree.
std::string proc_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return line + " ";
  return "";
}

bool has_flag(const std::string& flags, const std::string& f) { return flags.find(" " + f + " ") != std::string::npos; }

TEST(CpuFeatures, AgreesWithProcCpuinfo) {
  const std::string flags = proc_cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx2, has_flag(flags, "avx2"));
  EXPECT_EQ(f.fma, has_flag(flags, "fma"));
  EXPECT_EQ(f.avx512f, has_flag(flags, "avx512f"));
  EXPECT_EQ(f.avx512bw, has_flag(flags, "avx512bw"));
  EXPECT_EQ(f.avx512vl, has_flag(flags, "avx512vl"));
  EXPECT_EQ(f.avx512dq, has_flag(flags, "avx512dq"));
  EXPECT_EQ(f.avx512_bf16, has_flag(flags, "avx512_bf16"));
  EXPECT_EQ(f.amx_tile, has_flag(flags, "amx_tile"));
  // The build's floor: every machine that runs this binary has AVX2+FMA.
  EXPECT_TRUE(f.has_avx2_fma());
  EXPECT_FALSE(f.vendor.empty());
}

TEST(CpuFeatures, IsaFromEnv) {
  EXPECT_EQ(isa_from_env(nullptr).value(), machine_isa());
  EXPECT_EQ(isa_from_env("auto").value(), machine_isa());
  EXPECT_EQ(isa_from_env("avx2").value(), IsaLevel::Avx2);
  const Result<IsaLevel> bad = isa_from_env("sse2");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("KESTREL_ISA='sse2'"), std::string::npos);
  const Result<IsaLevel> wide = isa_from_env("avx512");
  EXPECT_EQ(wide.is_ok(), machine_isa() == IsaLevel::Avx512);
}

TEST(CpuFeatures, SetKernelIsaRoundTrips) {
  const IsaLevel before = kernel_isa();
  set_kernel_isa(IsaLevel::Avx2);
  EXPECT_EQ(kernel_isa(), IsaLevel::Avx2);
  set_kernel_isa(before);
  EXPECT_EQ(kernel_isa(), before);
  EXPECT_NE(cpu_summary().find(isa_name(before)), std::string::npos);
}

}  // namespace
}  // namespace kestrel
