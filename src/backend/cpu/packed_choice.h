// Whether f32 weights are packed (packed_linear.h) on this machine: measured,
// not assumed. oneDNN's packed f32 matmul beats the BLAS at decode sizes on
// some machines and trails it on others (docs/benchmarks.md, "Packed rollout
// weights"): 1.2-1.5x OpenBLAS SkylakeX on an Intel Xeon with AVX-512, a tie
// with OpenBLAS Haswell under the AVX2 setting there, and 0.7x OpenBLAS
// Haswell under the AVX2 setting on an AMD EPYC (Zen 4), where packing cost
// the rollout 17%. So the first f32 pack of a process times both on a decode
// micro-benchmark (64 and 256 rows through a layer's linears; about 0.1 s)
// and packs only when the packed product is not slower; the verdict is cached
// per machine next to the GEMM choice (packed-*.json in $KESTREL_CACHE or
// ~/.cache/kestrel), so every later process rounds the same way (a resumed
// run matches an uninterrupted one) and pays nothing.
//
// KESTREL_PACKED_WEIGHTS: unset or "auto" measures; "1" packs without
// measuring; "0" never packs. bf16 weights are not measured: they pack where
// oneDNN has fast bf16 kernels (AVX-512), where the widening BLAS path is
// 2-2.5x slower (the same section).
#pragma once
#include <optional>
#include <string>

#include "core/status.h"

namespace kestrel::cpu {

enum class PackSwitch { Auto, On, Off };
// KESTREL_PACKED_WEIGHTS: null / "" / "auto" -> Auto, "1" -> On, "0" -> Off;
// anything else is an error naming the variable and its values.
Result<PackSwitch> pack_switch_from_env(const char* value);
// The switch now (read at every call); throws Error on a bad value.
PackSwitch pack_switch();

struct PackedF32Verdict {
  bool pack = true;
  double packed_gflops = 0;  // decode micro-benchmark rates; 0: not measured (forced)
  double blas_gflops = 0;
  double cpu_share = 1.0;    // as GemmChoice::cpu_share: below 0.85 other processes held the cores
  std::string how;           // "measured in 0.1 s", "cached in <file>", "KESTREL_PACKED_WEIGHTS=1"
};

// The rule: pack unless the BLAS is at least 5% faster (a near tie keeps the
// packed path, which also saves the per-call packing memory traffic).
bool packed_wins(double packed_gflops, double blas_gflops);

// The verdict now: KESTREL_PACKED_WEIGHTS is read at every call (1 and 0
// decide without measuring); under auto, the cache or a measurement
// (published first-writer-wins, as the GEMM choice is) decides once per
// process. Call only when packing is enabled at all (packed_linear_enabled).
const PackedF32Verdict& packed_f32_verdict();

// For the log line: "packed 217 vs BLAS 141 GFLOP/s at decode rows, cached
// in ...", or the switch that decided.
std::string describe_packed_f32(const PackedF32Verdict& v);

// ---- parts, for tests
// Cache key: CPU identity, the x@W^T library's and oneDNN's versions, the
// OPENBLAS_CORETYPE / DNNL_MAX_CPU_ISA in force, the thread count.
std::string packed_cache_key(int threads);
std::string packed_cache_file(const std::string& dir, const std::string& key);
// nullopt: no file or another key's; an error: not a valid entry.
Result<std::optional<PackedF32Verdict>> read_packed_cache(const std::string& path, const std::string& key);
std::string packed_cache_text(const std::string& key, const PackedF32Verdict& v);

}  // namespace kestrel::cpu
