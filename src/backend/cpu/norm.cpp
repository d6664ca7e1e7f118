// RMSNorm forward/backward on the CPU: one row per iteration, rows split
// across threads, kW-lane vectors along the row (simd_layer.inc); the weight
// gradient is a column-split second pass. Bodies in norm_isa.inc, compiled
// per ISA level (isa.h). The row sums (hsum) are width-dependent: rstd and dx
// differ between ISA levels by f32 rounding; y and dw's per-element math do not.
#include <cmath>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/norm_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  KESTREL_ISA_CALL(rmsnorm_fwd, x, w, eps, y, rstd);
}

void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  KESTREL_ISA_CALL(rmsnorm_bwd, x, w, rstd, dy, dx, dw);
}

}  // namespace kestrel::cpu
