// Pipeline bubble and activation peak from the op trace (docs/benchmarks.md,
// "Pipeline bubble (op trace)"):
//
//   build/<b>/bench_pp_schedule_bench
//
// For each (p, m, v) it builds every rank's schedule (1F1B for v = 1,
// interleaved 1F1B otherwise, Megatron's order), runs the trace simulator
// (train/pipeline_schedule.h: chunk forward 1 slot, chunk backward 2, zero
// communication) and prints the bubble idle / makespan and rank 0's peak
// in-flight activations next to the closed forms (p-1)/(v m + p - 1) and
// p (1 + (p-1)/(p v)) stage units (p for 1F1B). Pure arithmetic: no timing,
// so the numbers do not depend on the machine.
#include <cstdio>
#include <string>
#include <vector>

#include "train/pipeline_schedule.h"

using namespace kestrel;
using namespace kestrel::train;

int main() {
  struct Case {
    int p;
    int64_t m;
    int v;
  };
  const Case cases[] = {{2, 4, 1}, {4, 8, 1}, {4, 16, 1}, {4, 8, 2}, {4, 16, 2}, {8, 32, 4}};
  std::printf("| p | m | v | schedule | makespan (slots) | bubble (trace) | (p-1)/(v m+p-1) | peak in flight rank 0 "
              "(trace, stage units) | formula | peak per rank (chunks) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    std::vector<std::vector<PipeOp>> ops;
    for (int r = 0; r < c.p; ++r) {
      auto o = schedule_interleaved_1f1b(c.p, r, c.m, c.v);  // v = 1: the plain 1F1B
      if (!o.is_ok()) {
        std::fprintf(stderr, "%s\n", o.status().message().c_str());
        return 1;
      }
      ops.push_back(o.value());
    }
    auto st = simulate_schedule(ops, c.v);
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.status().message().c_str());
      return 1;
    }
    const double formula = double(c.p - 1) / double(c.v * c.m + c.p - 1);
    const double peak_formula = c.v == 1 ? double(c.p) : c.p * (1.0 + double(c.p - 1) / (c.p * c.v));
    std::string per_rank;
    for (int64_t k : st->peak_in_flight) per_rank += (per_rank.empty() ? "" : ", ") + std::to_string(k);
    std::printf("| %d | %lld | %d | %s | %lld | %.4f | %.4f | %.3g | %.3g | %s |\n", c.p, (long long)c.m, c.v,
                c.v == 1 ? "1F1B" : "interleaved 1F1B", (long long)st->makespan_slots, bubble_fraction(st.value(), 0),
                formula, double(st->peak_in_flight[0]) / c.v, peak_formula, per_rank.c_str());
  }
  return 0;
}
