// Rotary embedding on packed rows, kW-lane vectors over each head's half
// (simd_layer.inc): with head_dim 64 a half is 32 floats, 4 AVX2 or 2 AVX-512
// vectors. Interleaved pairs (DeepSeek) run over whole vectors of the rotated
// range instead: each vector times cos duplicated per pair, plus its
// pair-swapped copy times (-sin, sin) per pair, the cos/sin vectors built once
// per token. Bodies in rope_cpu_isa.inc, compiled per ISA level (isa.h);
// lane-wise math only, so every level gives the same bits.
#include "backend/cpu/rope_cpu.h"

#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/rope_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void rope_apply(Tensor& x, const int32_t* positions, const float* cos, const float* sin, const RopeLayout& layout,
                bool inverse) {
  KESTREL_ISA_CALL(rope_apply, x, positions, cos, sin, layout, inverse);
}

}  // namespace kestrel::cpu
