#if defined(__GNUC__) && !defined(__clang__)
// GCC's -O2 "very cheap" vectoriser cost model leaves `omp simd` reductions
// whose bodies call inline helpers scalar; the dynamic model (the -O3 default)
// vectorises them. First line of the file so every function here agrees.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// Token embedding lookup and its scatter-add gradient on the CPU.
#include <cstring>

#include "backend/cpu/dense_ops.h"
#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {

void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start) {
  const int64_t T = ids.numel(), V = table.size(0), D = table.size(1);
  const int32_t* idp = ptr<const int32_t>(ids);
  dispatch_float(table.dtype(), [&](auto tt) {
    dispatch_float(y.dtype(), [&](auto ty) {
      using TT = decltype(tt);
      using TY = decltype(ty);
      const TT* tab = ptr<const TT>(table);
      TY* yp = ptr<TY>(y);
      parallel_blocks(T, D, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t row = int64_t(idp[t]) - vocab_start;
          TY* dst = yp + t * D;
          if (row < 0 || row >= V) {
            // Another vocab shard owns this id; shards' outputs are summed.
            std::memset(dst, 0, size_t(D) * sizeof(TY));
          } else if constexpr (std::is_same_v<TT, TY>) {
            std::memcpy(dst, tab + row * D, size_t(D) * sizeof(TY));
          } else {
            const TT* src = tab + row * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) store_f32(dst, d, load_f32(src, d));
          }
        }
      });
    });
  });
}

void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start) {
  const int64_t T = ids.numel(), V = dtable.size(0), D = dtable.size(1);
  const int32_t* idp = ptr<const int32_t>(ids);
  float* tab = ptr<float>(dtable);
  dispatch_float(dy.dtype(), [&](auto tg) {
    using TG = decltype(tg);
    const TG* g = ptr<const TG>(dy);
    // Threads split the columns, and every thread walks all tokens in order:
    // repeated ids never race, and each element's sum order is fixed.
    parallel_blocks(D, T, [&](int64_t c0, int64_t c1) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = int64_t(idp[t]) - vocab_start;
        if (row < 0 || row >= V) continue;
        float* dst = tab + row * D;
        const TG* src = g + t * D;
#pragma omp simd
        for (int64_t d = c0; d < c1; ++d) dst[d] += load_f32(src, d);
      }
    });
  });
}

}  // namespace kestrel::cpu
