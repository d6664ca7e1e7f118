// The grouped GEMM of the MoE experts on the CPU: one op call walks the
// experts' row groups and runs the backend's linear on each non-empty one,
// so every group gets exactly ops::linear_fwd / linear_bwd's arithmetic
// (bf16 operands widened to f32, the BLAS chosen by gemm.h, f32 accumulation,
// outputs rounded once; deterministic mode's fixed tiles). Groups of at most
// kSkinnyMaxRows rows (decode steps, rare experts) take the skinny kernel,
// which streams the expert's weights once instead of packing them.
//
// Scheduling. A training step's groups are mid-sized (Qwen3-MoE-small: 16
// groups of ~512 rows x 256..512 columns): split over the team, each GEMM
// ends in a barrier, and the team idles while its slowest thread (or one the
// OS descheduled) finishes. So when oneDNN runs every pattern (its calls run
// concurrently, one thread each, inside a parallel region; OpenBLAS 0.3's
// OpenMP build serialises such calls, and BLIS's threading there is not
// verified here), the operands are f32 (no widened scratch, so
// the activation peak stays what the memory plan counts) and deterministic
// mode is off, the groups are handed out whole, largest first, each one a
// single-threaded library call on one thread; a group too large to balance
// (more than 1/threads of the rows) and groups of at most kSkinnyMaxRows rows
// (see plan_groups) still run on the whole team.
// Each group is one call with the same operands either way, and oneDNN 2.6
// computes such a call's elements alike at 1, 2 and 3 threads (checked
// bitwise against per-expert ops::linear_fwd/bwd calls on the team, f32 and
// bf16, balanced, skewed and mixed group sizes of 33..3000 rows; a one-row
// call differs, hence the row floor), so the results are the same bits as
// when every group ran on the team. (oneDNN may split K from 8 threads on;
// there the per-thread path is the one whose bits do not depend on the team.)
//
// dW of an expert is one GEMM accumulating into its own buffer, so its
// summation order does not depend on the other groups or the thread count.
#include <omp.h>

#include <algorithm>
#include <exception>
#include <numeric>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/moe_cpu.h"
#include "backend/cpu/skinny_gemm.h"
#include "core/parallel_for.h"

namespace kestrel::cpu {

namespace {

// First row of each group: [E + 1].
std::vector<int64_t> group_starts(const std::vector<int64_t>& group_sizes) {
  std::vector<int64_t> first(group_sizes.size() + 1, 0);
  for (size_t e = 0; e < group_sizes.size(); ++e) first[e + 1] = first[e] + group_sizes[e];
  return first;
}

// Whether whole f32 groups may run one per thread (see the file comment).
bool groups_may_run_per_thread() {
  if (deterministic() || omp_in_parallel() || omp_get_max_threads() < 2) return false;
  for (GemmProvider p : gemm_choice())
    if (p != GemmProvider::OneDNN) return false;
  return true;
}

// Runs task(i) for every i of `order` (indices into the caller's groups,
// largest first) on the team, one whole task per thread at a time; the
// first exception is rethrown after the region.
template <class F>
void run_per_thread(const std::vector<int64_t>& order, F&& task) {
  std::exception_ptr error;
  const int64_t n = int64_t(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      task(order[size_t(i)]);
    } catch (...) {
#pragma omp critical(kestrel_moe_gemm_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Splits the non-empty groups into those run on the whole team (too large to
// balance, or all of them when per-thread runs are off or too few) and
// those handed out one per thread, largest first.
void plan_groups(const std::vector<int64_t>& group_sizes, bool per_thread_ok, std::vector<int64_t>& team,
                 std::vector<int64_t>& pool) {
  const int64_t threads = omp_get_max_threads();
  const int64_t total = std::accumulate(group_sizes.begin(), group_sizes.end(), int64_t(0));
  for (size_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t n = group_sizes[e];
    if (n == 0) continue;
    // A few rows (a rare expert's, a decode step's in the backward) stay on the
    // team: oneDNN runs a one-row product there (a GEMV) with another
    // summation order at 2 threads than at 1.
    const bool balanced = n * threads <= total && n > kSkinnyMaxRows;
    (per_thread_ok && balanced ? pool : team).push_back(int64_t(e));
  }
  if (int64_t(pool.size()) < threads) {  // nothing to balance: the team runs them all
    team.insert(team.end(), pool.begin(), pool.end());
    std::sort(team.begin(), team.end());
    pool.clear();
  }
  std::stable_sort(pool.begin(), pool.end(),
                   [&](int64_t a, int64_t b) { return group_sizes[size_t(a)] > group_sizes[size_t(b)]; });
}

bool f32(const Tensor& t) { return t.dtype() == DType::F32; }

}  // namespace

void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y) {
  const int64_t E = int64_t(group_sizes.size());
  const std::vector<int64_t> first = group_starts(group_sizes);
  auto rows = [&](const Tensor& t, int64_t e) { return t.slice_rows(first[size_t(e)], first[size_t(e + 1)]); };
  bool all_f32 = f32(x) && f32(y);
  for (int64_t e = 0; e < E && all_f32; ++e) all_f32 = group_sizes[size_t(e)] == 0 || f32(*w[size_t(e)]);
  const bool per_thread = all_f32 && groups_may_run_per_thread();
  // Skinny groups (decode steps, rare experts) are one thread's work in any
  // case; BLAS groups join them when per-thread runs are on.
  std::vector<char> thin(size_t(E), 0);
  std::vector<int64_t> skinny, sizes(size_t(E), 0);  // sizes: of the BLAS groups, 0 for the others
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = group_sizes[size_t(e)];
    if (n == 0) continue;
    const Tensor ye = rows(y, e);
    thin[size_t(e)] = n <= kSkinnyMaxRows && skinny_linear_applies(rows(x, e), *w[size_t(e)], nullptr, ye);
    if (thin[size_t(e)])
      skinny.push_back(e);
    else
      sizes[size_t(e)] = n;
  }
  std::vector<int64_t> team, pool;
  plan_groups(sizes, per_thread, team, pool);
  for (int64_t e : team) {
    Tensor ye = rows(y, e);
    linear_fwd(rows(x, e), *w[size_t(e)], nullptr, ye);
  }
  // Skinny groups after the BLAS ones, in the same region when there is one.
  pool.insert(pool.end(), skinny.begin(), skinny.end());
  auto run = [&](int64_t e) {
    Tensor ye = rows(y, e);
    if (thin[size_t(e)])
      skinny_linear(rows(x, e), *w[size_t(e)], nullptr, ye);
    else
      linear_fwd(rows(x, e), *w[size_t(e)], nullptr, ye);
  };
  // Few skinny groups and no BLAS pool: each skinny call splits its expert's
  // rows over the team itself instead (a group's result is the same either
  // way: each output is one thread's dot product in a fixed order).
  const int threads = omp_get_max_threads();
  if (int64_t(pool.size()) >= threads && threads > 1 && !omp_in_parallel())
    run_per_thread(pool, run);
  else
    for (int64_t e : pool) run(e);
}

void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw) {
  const std::vector<int64_t> first = group_starts(group_sizes);
  auto run = [&](int64_t e) {
    const int64_t r0 = first[size_t(e)], r1 = first[size_t(e + 1)];
    Tensor* dwe = dw.empty() ? nullptr : dw[size_t(e)];
    if (!dx && !dwe) return;
    const Tensor dye = dy.slice_rows(r0, r1);  // [n, out]
    Tensor dxe;
    if (dx) dxe = dx->slice_rows(r0, r1);  // [n, in]
    // x is read only for dW (the ops layer checked it then).
    const Tensor xe = dwe ? x.slice_rows(r0, r1) : Tensor();
    linear_bwd(xe, *w[size_t(e)], dye, dx ? &dxe : nullptr, dwe, nullptr);
  };
  bool all_f32 = f32(dy) && (!dx || f32(*dx)) && (dw.empty() || f32(x));
  for (size_t e = 0; e < group_sizes.size() && all_f32; ++e) all_f32 = group_sizes[e] == 0 || f32(*w[e]);
  std::vector<int64_t> team, pool;
  plan_groups(group_sizes, all_f32 && groups_may_run_per_thread(), team, pool);
  for (int64_t e : team) run(e);
  if (!pool.empty()) run_per_thread(pool, run);
}

}  // namespace kestrel::cpu
