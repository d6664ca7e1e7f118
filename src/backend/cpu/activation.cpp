// SwiGLU (silu(gate) * up) forward/backward on the CPU, elementwise over the
// packed [T, F] buffers, kW lanes at a time (simd_layer.inc) with the
// lane-wise exp; bodies in activation_isa.inc, compiled per ISA level (isa.h).
// Lane-wise math only: every ISA level gives the same bits.
#include "backend/cpu/dense_ops.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/activation_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h) { KESTREL_ISA_CALL(swiglu_fwd, gate, up, h); }

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup) {
  KESTREL_ISA_CALL(swiglu_bwd, gate, up, dh, dgate, dup);
}

}  // namespace kestrel::cpu
