// Kestrel's own CPU kernels at the machine's vector width, chosen at run time.
//
// The build targets x86-64-v3 (AVX2+FMA) so one binary runs everywhere. A
// kernel file that has wider variants compiles its kernel bodies twice in the
// same translation unit, through isa_each.inc:
//  - namespace kestrel::cpu::isa_avx2: the build's own flags, 8-float vectors;
//  - namespace kestrel::cpu::isa_avx512: under `#pragma GCC target("avx512f,
//    avx512bw,avx512vl,avx512dq,prefer-vector-width=512")`, 16-float vectors.
// Each copy sees its own simd_layer.inc (namespace simd, kW floats), so the
// same source serves both widths. A thin front end per op calls one of the
// two, chosen by kernel_isa() once per call of the op (KESTREL_ISA_CALL):
// the per-element code never branches on the ISA.
//
// Why a target pragma region rather than compiling a kernel file twice with
// -mavx512f (per-ISA translation units) or GCC function multiversioning:
//  - per-ISA TUs put AVX-512 code into the inline functions and templates
//    they instantiate from headers (std::vector<float>::resize, std::sort,
//    parallel_blocks, ...). Those are emitted as weak symbols that the linker
//    merges with the AVX2 TUs' copies, keeping one at random: an AVX-512 copy
//    then runs on the AVX2 path and dies with SIGILL on a machine without
//    AVX-512. A pragma region only applies to functions *defined* inside it:
//    headers included before it keep the build's flags, and everything
//    defined inside is in an ISA namespace of its own, so no symbol is shared.
//    Checked on the GCC 12 build: objdump of every backend object shows zmm,
//    k-register and EVEX-only instructions in kestrel::cpu::isa_avx512::*
//    functions only, none in parallel_blocks<...>/dispatch_float<...>
//    instantiated with their lambdas, nor in std:: code.
//  - target_clones multiversions one function at a time; the kernels are
//    families of templates and lambdas whose vector width must change
//    together, which the namespace copy does in one place.
//
// GCC 12.2 (Debian 12's) miscompiles some constants wherever AVX-512 is
// enabled, whatever -mtune, target pragma included: std::vector<double>{1,
// 1, 1, 0} is stored as four 1.0 by one vpbroadcastq from a general register
// (and with -mtune=icelake-* or later even without AVX-512, as CMakeLists.txt
// notes for KESTREL_NATIVE). The wrong code is the x86 back end rewriting a
// wide constant into a broadcast of its low 64-bit word (likely its
// ix86_convert_const_wide_int_to_broadcast, which does not see the constant's
// implicit zero high words); that rewrite needs inter-unit moves to vector
// registers, and with -mtune-ctrl=^inter_unit_moves_to_vec every failing flag
// set above compiles it right (measured). The backend library is compiled
// with that flag (CMakeLists.txt, "Per-ISA kernels");
// tests/backend_cpu/gcc12_avx512_test.cpp keeps the reproducer under the same
// pragma and flag. See docs/benchmarks.md "AVX-512 kernels".
#pragma once
#include "core/cpu_features.h"

// Calls isa_avx512::fn(args...) or isa_avx2::fn(args...) (both in the current
// namespace) by kernel_isa(): one atomic load per call of an op.
#define KESTREL_ISA_CALL(fn, ...)                                                    \
  (::kestrel::kernel_isa() == ::kestrel::IsaLevel::Avx512 ? isa_avx512::fn(__VA_ARGS__) \
                                                           : isa_avx2::fn(__VA_ARGS__))
