// TEMPORARY stand-in for train/pipeline_schedule.h (the schedules unit being
// built in parallel): Megatron's op orders, as ../shared/reference/tools/pp_schedule_sim.py.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace kestrel::train {

enum class PipeOpKind { Forward, Backward };
struct PipeOp {
  PipeOpKind kind;
  int64_t micro_batch;
  int chunk;
};

namespace tmp_detail {
inline std::vector<std::pair<int64_t, int>> table(int64_t m, int v, int64_t N) {
  std::vector<std::pair<int64_t, int>> t;
  for (int64_t s = 0; s < m; s += N) {
    const int64_t e = std::min(m, s + N);
    for (int c = 0; c < v; ++c)
      for (int64_t mb = s; mb < e; ++mb) t.push_back({mb, c});
  }
  return t;
}
}  // namespace tmp_detail

inline std::vector<PipeOp> schedule_forward_only(int p, int rank, int64_t m, int v) {
  (void)p, (void)rank;
  std::vector<PipeOp> ops;
  for (auto [mb, c] : tmp_detail::table(m, v, p)) ops.push_back({PipeOpKind::Forward, mb, c});
  return ops;
}

inline Result<std::vector<PipeOp>> schedule_interleaved_1f1b(int p, int rank, int64_t m, int v, int64_t group) {
  const int64_t N = group > 0 ? group : p;
  const auto t = tmp_detail::table(m, v, N);
  const int64_t total = m * v;
  const int64_t w = v == 1 ? std::min<int64_t>(p - rank - 1, m) : std::min<int64_t>((p - rank - 1) * 2 + (v - 1) * N, total);
  std::vector<PipeOp> ops;
  auto F = [&](int64_t k) { ops.push_back({PipeOpKind::Forward, t[size_t(k)].first, t[size_t(k)].second}); };
  auto B = [&](int64_t k) { ops.push_back({PipeOpKind::Backward, t[size_t(k)].first, v - 1 - t[size_t(k)].second}); };
  for (int64_t k = 0; k < w; ++k) F(k);
  for (int64_t j = 0; j < total - w; ++j) F(w + j), B(j);
  for (int64_t k = total - w; k < total; ++k) B(k);
  return ops;
}

inline std::vector<PipeOp> schedule_1f1b(int p, int rank, int64_t m) {
  return schedule_interleaved_1f1b(p, rank, m, 1, 0).value();
}

}  // namespace kestrel::train
