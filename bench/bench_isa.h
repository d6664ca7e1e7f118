// --isa for the kernel benchmarks: which kernel ISA levels (KESTREL_ISA) to
// compare in one run, interleaved per case so a busy machine hurts both alike.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "core/cpu_features.h"

namespace kestrel::bench {

// "all" (default): every level this machine runs; else a comma list of
// avx2/avx512. Returns an empty list (after printing why) on a bad value.
inline std::vector<IsaLevel> parse_isas(const std::string& v) {
  std::vector<IsaLevel> out;
  if (v == "all") {
    out.push_back(IsaLevel::Avx2);
    if (machine_isa() == IsaLevel::Avx512) out.push_back(IsaLevel::Avx512);
    return out;
  }
  size_t b = 0;
  while (b <= v.size()) {
    const size_t e = std::min(v.find(',', b), v.size());
    const std::string one = v.substr(b, e - b);
    const Result<IsaLevel> r = isa_from_env(one.c_str());
    if (!r.is_ok() || one.empty() || one == "auto") {
      std::fprintf(stderr, "--isa: '%s' is not avx2, avx512 (on a machine that has it) or all\n", one.c_str());
      return {};
    }
    out.push_back(r.value());
    b = e + 1;
  }
  return out;
}

}  // namespace kestrel::bench
