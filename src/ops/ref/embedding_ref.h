// Scalar reference (the test oracle) of ops/embedding.h, run with T = double.
#pragma once
#include <cstdint>

namespace kestrel::ops::ref {

// y[n, D] = table[ids[t] - vocab_start] when that row is in [0, V), else zeros.
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* y, int64_t n, int64_t V, int64_t D, int64_t vocab_start) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = int64_t(ids[t]) - vocab_start;
    for (int64_t d = 0; d < D; ++d) y[t * D + d] = (row >= 0 && row < V) ? table[row * D + d] : T(0);
  }
}

// dtable[V, D] += dy rows scattered by id (rows outside the shard skipped).
template <class T>
void embedding_bwd(const int32_t* ids, const T* dy, T* dtable, int64_t n, int64_t V, int64_t D, int64_t vocab_start) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = int64_t(ids[t]) - vocab_start;
    if (row < 0 || row >= V) continue;
    for (int64_t d = 0; d < D; ++d) dtable[row * D + d] += dy[t * D + d];
  }
}

}  // namespace kestrel::ops::ref
