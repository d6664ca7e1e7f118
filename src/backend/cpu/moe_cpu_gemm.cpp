// The grouped GEMM of the MoE experts on the CPU: one op call walks the
// experts' row groups and runs the backend's linear on each non-empty one,
// so every group gets exactly ops::linear_fwd / linear_bwd's arithmetic
// (bf16 operands widened to f32, the BLAS chosen by gemm.h, f32 accumulation,
// outputs rounded once; deterministic mode's fixed tiles). Groups of at most
// kSkinnyMaxRows rows (decode steps, rare experts) take the skinny kernel,
// which streams the expert's weights once instead of packing them.
//
// BLAS groups run one after another, each GEMM on the whole OpenMP team
// (many skinny groups share one parallel region instead, a group per thread);
// dW of an expert is one GEMM accumulating into its own buffer, so its
// summation order does not depend on the other groups or the thread count.
#include <omp.h>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/moe_cpu.h"
#include "backend/cpu/skinny_gemm.h"

namespace kestrel::cpu {

void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y) {
  const int64_t E = int64_t(group_sizes.size());
  std::vector<int64_t> first(size_t(E) + 1, 0);  // first row of each group
  for (int64_t e = 0; e < E; ++e) first[size_t(e + 1)] = first[size_t(e)] + group_sizes[size_t(e)];
  auto rows = [&](const Tensor& t, int64_t e) { return t.slice_rows(first[size_t(e)], first[size_t(e + 1)]); };
  std::vector<int64_t> small;  // groups for the skinny kernel
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = group_sizes[size_t(e)];
    if (n == 0) continue;
    const Tensor xe = rows(x, e);
    Tensor ye = rows(y, e);
    if (n <= kSkinnyMaxRows && skinny_linear_applies(xe, *w[size_t(e)], nullptr, ye))
      small.push_back(e);
    else
      linear_fwd(xe, *w[size_t(e)], nullptr, ye);
  }
  // Many small groups (a decode step, rare experts): one parallel region
  // hands whole groups to threads, each running the skinny kernel on its own
  // thread, instead of waking the team once per group. Few: each call splits
  // its expert's rows over the team itself. A group's result is the same
  // either way (each output is one thread's dot product in a fixed order).
  const int64_t n_small = int64_t(small.size());
  if (n_small >= omp_get_max_threads() && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_small; ++i) {
      const int64_t e = small[size_t(i)];
      Tensor ye = rows(y, e);
      skinny_linear(rows(x, e), *w[size_t(e)], nullptr, ye);
    }
  } else {
    for (int64_t e : small) {
      Tensor ye = rows(y, e);
      skinny_linear(rows(x, e), *w[size_t(e)], nullptr, ye);
    }
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
    if (dx || dwe) linear_bwd(xe, *w[e], dye, dx ? &dxe : nullptr, dwe, nullptr, /*accumulate_dx=*/false);
    r0 += n;
  }
}

}  // namespace kestrel::cpu
