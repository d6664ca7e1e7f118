// The grouped GEMM of the MoE experts on the CPU: one op call walks the
// experts' row groups and runs the backend's linear on each non-empty one,
// so every group gets exactly ops::linear_fwd / linear_bwd's arithmetic
// (bf16 operands widened to f32, the BLAS chosen by gemm.h, f32 accumulation,
// outputs rounded once; deterministic mode's fixed tiles). Groups of at most
// kSkinnyMaxRows rows (decode steps, rare experts) take the skinny kernel,
// which streams the expert's weights once instead of packing them.
//
// Groups run one after another, each GEMM on the whole OpenMP team; dW of an
// expert is one GEMM accumulating into its own buffer, so its summation order
// does not depend on the other groups or the thread count.
#include "backend/cpu/dense_ops.h"
#include "backend/cpu/moe_cpu.h"
#include "backend/cpu/skinny_gemm.h"

namespace kestrel::cpu {

void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y) {
  int64_t r0 = 0;
  for (size_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t n = group_sizes[e];
    if (n == 0) continue;
    const Tensor xe = x.slice_rows(r0, r0 + n);  // [n, in]
    Tensor ye = y.slice_rows(r0, r0 + n);        // [n, out]
    if (n <= kSkinnyMaxRows && skinny_linear_applies(xe, *w[e], nullptr, ye))
      skinny_linear(xe, *w[e], nullptr, ye);
    else
      linear_fwd(xe, *w[e], nullptr, ye);
    r0 += n;
  }
}

void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw) {
  int64_t r0 = 0;
  for (size_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t n = group_sizes[e];
    if (n == 0) continue;
    Tensor* dwe = dw.empty() ? nullptr : dw[e];
    const Tensor dye = dy.slice_rows(r0, r0 + n);  // [n, out]
    Tensor dxe;
    if (dx) dxe = dx->slice_rows(r0, r0 + n);  // [n, in]
    // x is read only for dW (the ops layer checked it then).
    const Tensor xe = dwe ? x.slice_rows(r0, r0 + n) : Tensor();
    if (dx || dwe) linear_bwd(xe, *w[e], dye, dx ? &dxe : nullptr, dwe, nullptr);
    r0 += n;
  }
}

}  // namespace kestrel::cpu
