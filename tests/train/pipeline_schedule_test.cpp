// Pipeline schedules (train/pipeline_schedule.h) against the reference
// oracle (tests/golden/pp_schedule/schedules.json, written by make_golden.py
// from reference/tools/pp_schedule_sim.py): op orders op for op, makespan,
// idle slots and peak in-flight exactly; then the properties every schedule
// must have and the closed forms of the bubble and the activation peak.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/pipeline_layout.h"
#include "train/pipeline_schedule.h"

using namespace kestrel;
using namespace kestrel::train;

namespace {

std::string join(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const auto& op : ops) s += (s.empty() ? "" : " ") + to_string(op);
  return s;
}

bool interleaved_valid(int p, int64_t m, int v, int64_t n = 0) {
  parallel::PipelineSpec s;
  s.pp = p;
  s.vpp = v;
  s.microbatch_group_size = n;
  return (v == 1 || p >= 2) && parallel::check_interleaved_microbatches(s, m).is_ok();
}

std::vector<std::vector<PipeOp>> all_ranks_interleaved(int p, int64_t m, int v, int64_t n = 0) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < p; ++r) {
    auto o = schedule_interleaved_1f1b(p, r, m, v, n);
    EXPECT_TRUE(o.is_ok()) << o.status().message();
    ops.push_back(o.is_ok() ? o.value() : std::vector<PipeOp>{});
  }
  return ops;
}

template <class F>
std::vector<std::vector<PipeOp>> all_ranks(int p, F f) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < p; ++r) ops.push_back(f(r));
  return ops;
}

ScheduleStats sim_ok(const std::vector<std::vector<PipeOp>>& ops, int v) {
  auto s = simulate_schedule(ops, v);
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  return s.is_ok() ? s.value() : ScheduleStats{};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(PipelineSchedule, GoldenMatchesOracleOpForOp) {
  std::ifstream f(std::string(KESTREL_SOURCE_DIR) + "/tests/golden/pp_schedule/schedules.json");
  ASSERT_TRUE(f) << "tests/golden/pp_schedule/schedules.json (run make_golden.py)";
  const auto golden = nlohmann::json::parse(f);
  ASSERT_GE(golden["cases"].size(), 40u);
  for (const auto& c : golden["cases"]) {
    const int p = c["p"], v = c["v"];
    const int64_t m = c["m"], n = c["group"];
    const std::string where = "p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" + std::to_string(v) +
                              " N=" + std::to_string(n);
    const auto ops = v == 1 ? all_ranks(p, [&](int r) { return schedule_1f1b(p, r, m); })
                            : all_ranks_interleaved(p, m, v, n);
    for (int r = 0; r < p; ++r)
      EXPECT_EQ(join(ops[size_t(r)]), c["ops"][size_t(r)].get<std::string>()) << where << " rank " << r;
    const ScheduleStats st = sim_ok(ops, v);
    EXPECT_EQ(st.makespan_slots, c["makespan"].get<int64_t>()) << where;
    EXPECT_EQ(st.idle_slots, c["idle"].get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(st.peak_in_flight, c["peak_in_flight"].get<std::vector<int64_t>>()) << where;
    EXPECT_NEAR(bubble_fraction(st, 0), c["bubble"].get<double>(), 1e-9) << where;
    // The closed forms, exact in integer slots: makespan 3 (v m + p - 1),
    // bubble idle / makespan = (p-1) / (v m + p - 1) on every rank.
    EXPECT_EQ(st.makespan_slots, 3 * (v * m + p - 1)) << where;
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(st.busy_slots[size_t(r)], 3 * v * m) << where;
      EXPECT_EQ(st.idle_slots[size_t(r)] * (v * m + p - 1), st.makespan_slots * (p - 1)) << where;
    }
  }
}

// Every rank runs each (mb, chunk) forward and backward exactly once, each
// forward before its backward; the schedules never deadlock.
TEST(PipelineSchedule, EveryOpOnceForwardBeforeBackward) {
  for (int p = 1; p <= 8; ++p)
    for (int64_t m = 1; m <= 17; ++m)
      for (int v = 1; v <= 4; ++v) {
        const std::string where = "p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" + std::to_string(v);
        const auto fo = all_ranks(p, [&](int r) { return schedule_forward_only(p, r, m, v); });
        const auto gp = all_ranks(p, [&](int r) { return schedule_all_forward_all_backward(p, r, m, v); });
        for (int r = 0; r < p; ++r) {
          EXPECT_TRUE(check_rank_ops(fo[size_t(r)], r, m, v, false).is_ok()) << where;
          EXPECT_TRUE(check_rank_ops(gp[size_t(r)], r, m, v, true).is_ok()) << where;
        }
        EXPECT_TRUE(simulate_schedule(fo, v).is_ok()) << where;
        EXPECT_TRUE(simulate_schedule(gp, v).is_ok()) << where;
        if (v == 1) {
          const auto ob = all_ranks(p, [&](int r) { return schedule_1f1b(p, r, m); });
          for (int r = 0; r < p; ++r) EXPECT_TRUE(check_rank_ops(ob[size_t(r)], r, m, 1, true).is_ok()) << where;
          EXPECT_TRUE(simulate_schedule(ob, 1).is_ok()) << where;
        }
        if (!interleaved_valid(p, m, v)) continue;
        const auto il = all_ranks_interleaved(p, m, v);
        for (int r = 0; r < p; ++r) {
          const Status s = check_rank_ops(il[size_t(r)], r, m, v, true);
          EXPECT_TRUE(s.is_ok()) << where << ": " << s.message();
        }
        EXPECT_TRUE(simulate_schedule(il, v).is_ok()) << where;
      }
}

// 1F1B holds min(p - r, m) micro-batches on rank r (Megatron: w + 1).
TEST(PipelineSchedule, OneFOneBPeakInFlight) {
  for (int p = 1; p <= 8; ++p)
    for (int64_t m = 1; m <= 16; ++m) {
      const auto st = sim_ok(all_ranks(p, [&](int r) { return schedule_1f1b(p, r, m); }), 1);
      for (int r = 0; r < p; ++r) EXPECT_EQ(st.peak_in_flight[size_t(r)], std::min<int64_t>(p - r, m)) << p << " " << m;
      EXPECT_EQ(st.makespan_slots, 3 * (m + p - 1));
    }
}

// Interleaved rank 0 holds p (1 + (p-1)/(p v)) stage activations, i.e.
// v p + p - 1 chunk activations, once the warm-up fits (m v > w_0); every
// rank holds min(w_r + 1, m v).
TEST(PipelineSchedule, InterleavedPeakInFlight) {
  int checked = 0;
  for (int p = 2; p <= 8; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int64_t m = p; m <= 32; ++m) {
        if (!interleaved_valid(p, m, v)) continue;
        const auto st = sim_ok(all_ranks_interleaved(p, m, v), v);
        for (int r = 0; r < p; ++r) {
          const int64_t w = std::min<int64_t>(2 * (p - r - 1) + (v - 1) * p, m * v);
          EXPECT_EQ(st.peak_in_flight[size_t(r)], std::min(w + 1, m * v)) << p << " " << m << " " << v << " " << r;
        }
        if (m * v > 2 * (p - 1) + (v - 1) * p) {
          EXPECT_EQ(st.peak_in_flight[0], int64_t(v) * p + p - 1) << p << " " << m << " " << v;
          // In stage units: peak / v == p * (1 + (p-1)/(p v)).
          EXPECT_DOUBLE_EQ(double(st.peak_in_flight[0]) / v, p * (1.0 + double(p - 1) / (p * v)));
          ++checked;
        }
      }
  EXPECT_GT(checked, 50);
}

TEST(PipelineSchedule, ForwardOnlyAndGpipe) {
  // Forward only: the schedule table's order (here PP2 N2 M5 V2), no bubble
  // but the fill: makespan v m + p - 1 for forwards of 1 slot.
  EXPECT_EQ(join(schedule_forward_only(2, 0, 5, 2)), "F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 F2.1 F3.1 F4.0 F4.1");
  EXPECT_EQ(join(schedule_forward_only(2, 1, 5, 2, 3)), "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 F3.0 F4.0 F3.1 F4.1");
  EXPECT_EQ(join(schedule_forward_only(4, 2, 3, 1)), "F0.0 F1.0 F2.0");
  for (int p : {2, 4, 8})
    for (int v : {1, 2, 4})
      for (int64_t m : {int64_t(p), int64_t(2 * p), int64_t(4 * p)}) {
        const auto st = sim_ok(all_ranks(p, [&](int r) { return schedule_forward_only(p, r, m, v); }), v);
        EXPECT_EQ(st.makespan_slots, v * m + p - 1);
        EXPECT_EQ(st.peak_in_flight[0], m * v);
      }
  // GPipe: all forwards, then the backwards with chunks reversed.
  EXPECT_EQ(join(schedule_all_forward_all_backward(2, 0, 2, 2)), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  for (int p : {2, 4, 8})
    for (int64_t m : {1, 3, 8}) {
      const auto st = sim_ok(all_ranks(p, [&](int r) { return schedule_all_forward_all_backward(p, r, m, 1); }), 1);
      EXPECT_EQ(st.makespan_slots, 3 * (m + p - 1));  // the same bubble as 1F1B ...
      for (int r = 0; r < p; ++r) EXPECT_EQ(st.peak_in_flight[size_t(r)], m);  // ... with m micro-batches held
    }
}

TEST(PipelineSchedule, MegatronTableExample) {
  // schedules.py: PP2 N3 M5 VP2: micro-batch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
  const auto t = schedule_table(5, 2, 3);
  std::vector<std::pair<int64_t, int>> want = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                               {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  EXPECT_EQ(t, want);
  // v = 1 is no interleaving: the plain 1F1B.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(schedule_interleaved_1f1b(4, r, 6, 1).value(), schedule_1f1b(4, r, 6));
  EXPECT_EQ(join(schedule_1f1b(4, 1, 5)), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 B3.0 B4.0");
}

TEST(PipelineSchedule, InterleavedErrors) {
  auto err = [](int p, int r, int64_t m, int v, int64_t n = 0) {
    auto s = schedule_interleaved_1f1b(p, r, m, v, n);
    EXPECT_FALSE(s.is_ok()) << p << " " << r << " " << m << " " << v << " " << n;
    return s.status().message();
  };
  std::string e = err(4, 0, 3, 2);
  EXPECT_TRUE(has(e, "should range in [PP=4, M=3]")) << e;
  e = err(4, 0, 6, 2);
  EXPECT_TRUE(has(e, "remainder of M=6")) << e;
  EXPECT_TRUE(has(e, "but it is 2")) << e;
  e = err(4, 0, 8, 2, 3);
  EXPECT_TRUE(has(e, "microbatch_group_size_per_vp_stage=3")) << e;
  e = err(1, 0, 8, 2);
  EXPECT_TRUE(has(e, "should be greater than 1 with interleaved schedule")) << e;
  EXPECT_TRUE(has(e, "pipeline_model_parallel_size=1")) << e;
  e = err(4, 4, 8, 2);
  EXPECT_TRUE(has(e, "rank 4 of pipeline_model_parallel_size=4")) << e;
  e = err(4, 0, 8, 0);
  EXPECT_TRUE(has(e, "virtual_pipeline_model_parallel_size=0")) << e;
  EXPECT_THROW(schedule_1f1b(2, 2, 4), Error);
  EXPECT_THROW(schedule_forward_only(0, 0, 4, 1), Error);
}

TEST(PipelineSchedule, TraceErrors) {
  using K = PipeOpKind;
  // Rank 1 wants B0 before it has run F0: its own forward never comes first.
  std::vector<std::vector<PipeOp>> ops = {{{K::Forward, 0, 0}, {K::Backward, 0, 0}},
                                          {{K::Backward, 0, 0}, {K::Forward, 0, 0}}};
  auto s = simulate_schedule(ops, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(has(s.status().message(), "deadlocks")) << s.status().message();
  EXPECT_TRUE(has(s.status().message(), "rank 1 at op 0 (B0.0) waits for its own F0.0")) << s.status().message();
  EXPECT_TRUE(has(s.status().message(), "rank 0 at op 1 (B0.0) waits for B0.0 on rank 1")) << s.status().message();
  // Rank 0 waits on a backward rank 1 never runs.
  ops = {{{K::Forward, 0, 0}, {K::Backward, 0, 0}}, {{K::Forward, 0, 0}}};
  s = simulate_schedule(ops, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(has(s.status().message(), "B0.0 on rank 1 (which that rank never runs)")) << s.status().message();
  // Another order than Megatron's that has no cycle still runs (rank 0 backwards mb 1 first).
  ops = {{{K::Forward, 0, 0}, {K::Forward, 1, 0}, {K::Backward, 1, 0}, {K::Backward, 0, 0}},
         {{K::Forward, 0, 0}, {K::Backward, 0, 0}, {K::Forward, 1, 0}, {K::Backward, 1, 0}}};
  EXPECT_TRUE(simulate_schedule(ops, 1).is_ok());
  // A cycle over chunks (v = 2): rank 0 runs F0.1, which needs rank 1's F0.0, before its F0.0,
  // which rank 1's F0.0 needs.
  ops = {{{K::Forward, 0, 1}, {K::Forward, 0, 0}}, {{K::Forward, 0, 0}, {K::Forward, 0, 1}}};
  s = simulate_schedule(ops, 2);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(has(s.status().message(), "rank 0 at op 0 (F0.1) waits for F0.0 on rank 1")) << s.status().message();
  EXPECT_TRUE(has(s.status().message(), "rank 1 at op 0 (F0.0) waits for F0.0 on rank 0")) << s.status().message();
  // Repeated and out-of-range ops.
  s = simulate_schedule({{{K::Forward, 0, 0}, {K::Forward, 0, 0}}}, 1);
  EXPECT_TRUE(has(s.status().message(), "rank 0 runs F0.0 twice")) << s.status().message();
  s = simulate_schedule({{{K::Forward, 0, 2}}}, 2);
  EXPECT_TRUE(has(s.status().message(), "outside [0, 2)")) << s.status().message();
  // check_rank_ops names what is wrong.
  EXPECT_TRUE(has(check_rank_ops({{K::Forward, 0, 0}}, 3, 2, 1, false).message(), "rank 3 never runs F1.0"));
  EXPECT_TRUE(has(check_rank_ops({{K::Backward, 0, 0}, {K::Forward, 0, 0}}, 0, 1, 1, true).message(),
                  "B0.0 runs before its forward"));
  EXPECT_TRUE(has(check_rank_ops({{K::Forward, 0, 0}, {K::Backward, 0, 0}, {K::Backward, 0, 0}}, 0, 1, 1, true)
                      .message(),
                  "runs B0.0 twice"));
  EXPECT_TRUE(has(check_rank_ops({{K::Forward, 0, 0}, {K::Backward, 0, 0}}, 0, 1, 1, false).message(),
                  "forward-only"));
}

TEST(PipelineSchedule, CostsAreParameters) {
  // Forward 2, backward 4 (the same ratio): every slot count doubles.
  const auto ops = all_ranks(4, [](int r) { return schedule_1f1b(4, r, 8); });
  const auto a = sim_ok(ops, 1);
  const auto b = simulate_schedule(ops, 1, {2, 4}).value();
  EXPECT_EQ(b.makespan_slots, 2 * a.makespan_slots);
  EXPECT_EQ(b.peak_in_flight, a.peak_in_flight);
  EXPECT_DOUBLE_EQ(bubble_fraction(a, 0), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(b, 3), 3.0 / 11.0);
}
