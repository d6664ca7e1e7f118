// What the CPU this process runs on can execute, read once with cpuid/xgetbv,
// and which width Kestrel's own kernels use (KESTREL_ISA).
//
// The build targets x86-64-v3 (AVX2+FMA) so one binary runs on every
// supported machine; kernels that have wider variants pick them at run time
// from kernel_isa(). AVX-512 counts only when F, BW, VL and DQ are all there
// and the OS saves the zmm state (XCR0), as on every AVX-512 server since
// Skylake-SP and on Zen 4.
#pragma once
#include <string>

#include "core/status.h"

namespace kestrel {

struct CpuFeatures {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;  // brand string, e.g. "Intel(R) Xeon(R) Processor"
  int family = 0, model = 0, stepping = 0;  // display family/model (extended fields folded in)
  bool fma = false, avx2 = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_ymm = false, os_zmm = false, os_amx = false;  // XCR0 enables the register state

  bool is_intel() const { return vendor == "GenuineIntel"; }
  bool is_amd() const { return vendor == "AuthenticAMD"; }
  bool has_avx2_fma() const { return avx2 && fma && os_ymm; }
  bool has_avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && os_zmm; }
  bool has_amx() const { return amx_tile && os_amx; }
};

// Read once (thread-safe), never fails: a field the CPU does not report stays false.
const CpuFeatures& cpu_features();

// Vector width of Kestrel's own kernels. Avx2 is the floor of the build.
enum class IsaLevel { Avx2 = 0, Avx512 = 1 };

const char* isa_name(IsaLevel isa);  // "avx2", "avx512"

// The widest level this machine runs.
IsaLevel machine_isa();

// KESTREL_ISA parsed: "" / "auto" = machine_isa(); "avx2"; "avx512" (an error
// when the machine lacks it). Any other value is an error naming the variable.
Result<IsaLevel> isa_from_env(const char* value);

// The level the kernels run at: KESTREL_ISA from the environment, read once.
// A bad KESTREL_ISA throws (kestrel::Error) at the first kernel call; the CLI
// checks it with isa_from_env at startup, so users see the message up front.
IsaLevel kernel_isa();

// Tests and benchmarks: run every following kernel call at `isa` (must be
// supported by the machine; throws otherwise). Not for use while kernels run.
void set_kernel_isa(IsaLevel isa);

// One line for logs and benchmark headers:
// "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167), ISA avx512 (AVX-512 F/BW/VL/DQ VNNI BF16 FP16, AMX)".
std::string cpu_summary();

}  // namespace kestrel
