// Pipeline schedules and their trace analysis (pipeline_schedule.h).
#include "train/pipeline_schedule.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "parallel/pipeline_layout.h"

namespace kestrel::train {
namespace {

void check_shape(int p, int rank, int64_t m, int v) {
  KS_CHECK(p >= 1 && rank >= 0 && rank < p && m >= 0 && v >= 1, "pipeline schedule for rank ", rank, " of p=", p,
           ", m=", m, " micro-batches, v=", v, " chunks");
}

int64_t group_or_p(int p, int64_t group_size) { return group_size > 0 ? group_size : p; }

PipeOp fwd(const std::pair<int64_t, int>& e) { return {PipeOpKind::Forward, e.first, e.second}; }
PipeOp bwd(const std::pair<int64_t, int>& e, int v) { return {PipeOpKind::Backward, e.first, v - 1 - e.second}; }

// The common shape of both 1F1B schedules over the virtual micro-batches of
// `table`: w warm-up forwards, steady (forward w+j, backward j), cool-down.
std::vector<PipeOp> one_f_one_b(const std::vector<std::pair<int64_t, int>>& table, int v, int64_t w) {
  const int64_t total = int64_t(table.size());
  std::vector<PipeOp> ops;
  ops.reserve(size_t(2 * total));
  for (int64_t k = 0; k < w; ++k) ops.push_back(fwd(table[size_t(k)]));
  for (int64_t j = 0; j < total - w; ++j) {
    ops.push_back(fwd(table[size_t(w + j)]));
    ops.push_back(bwd(table[size_t(j)], v));
  }
  for (int64_t k = total - w; k < total; ++k) ops.push_back(bwd(table[size_t(k)], v));
  return ops;
}

}  // namespace

std::string to_string(const PipeOp& op) {
  return detail::concat(op.kind == PipeOpKind::Forward ? "F" : "B", op.micro_batch, ".", op.chunk);
}

std::vector<std::pair<int64_t, int>> schedule_table(int64_t m, int v, int64_t n) {
  KS_CHECK(m >= 0 && v >= 1 && n >= 1, "schedule table for m=", m, " v=", v, " group n=", n);
  std::vector<std::pair<int64_t, int>> t;
  t.reserve(size_t(m * v));
  for (int64_t start = 0; start < m; start += n) {
    const int64_t end = std::min(m, start + n);  // the last group takes the remainder
    for (int c = 0; c < v; ++c)
      for (int64_t mb = start; mb < end; ++mb) t.emplace_back(mb, c);
  }
  return t;
}

std::vector<PipeOp> schedule_forward_only(int p, int rank, int64_t m, int v, int64_t group_size) {
  check_shape(p, rank, m, v);
  std::vector<PipeOp> ops;
  for (const auto& e : schedule_table(m, v, group_or_p(p, group_size))) ops.push_back(fwd(e));
  return ops;
}

std::vector<PipeOp> schedule_all_forward_all_backward(int p, int rank, int64_t m, int v, int64_t group_size) {
  check_shape(p, rank, m, v);
  const auto table = schedule_table(m, v, group_or_p(p, group_size));
  return one_f_one_b(table, v, int64_t(table.size()));  // all warm-up: every forward, then every backward
}

std::vector<PipeOp> schedule_1f1b(int p, int rank, int64_t m) {
  check_shape(p, rank, m, 1);
  return one_f_one_b(schedule_table(m, 1, std::max<int64_t>(m, 1)), 1, std::min<int64_t>(p - rank - 1, m));
}

Result<std::vector<PipeOp>> schedule_interleaved_1f1b(int p, int rank, int64_t m, int v, int64_t group_size) {
  if (p < 1 || rank < 0 || rank >= p || m < 0 || v < 1 || group_size < 0)
    return KS_ERR("interleaved pipeline schedule: rank ", rank, " of pipeline_model_parallel_size=", p, ", ", m,
                  " micro-batches, virtual_pipeline_model_parallel_size=", v, ", group size ", group_size,
                  ": need p >= 1, 0 <= rank < p, m >= 0, v >= 1, group size >= 0");
  if (v == 1) return schedule_1f1b(p, rank, m);
  parallel::PipelineSpec spec;
  spec.pp = p;
  spec.vpp = v;
  spec.microbatch_group_size = group_size;
  if (p < 2)
    return KS_ERR("virtual_pipeline_model_parallel_size=", v, " with pipeline_model_parallel_size=", p,
                  ": pipeline-model-parallel size should be greater than 1 with interleaved schedule");
  KS_TRY(parallel::check_interleaved_microbatches(spec, m));
  const int64_t n = parallel::microbatch_group_size(spec);
  const int64_t total = m * v;
  const int64_t w = std::min<int64_t>(int64_t(p - rank - 1) * 2 + int64_t(v - 1) * n, total);
  return one_f_one_b(schedule_table(m, v, n), v, w);
}

Status check_rank_ops(const std::vector<PipeOp>& ops, int rank, int64_t m, int v, bool with_backward) {
  // seen[kind][mb * v + c]: position of the op in the list, -1 = not yet.
  std::vector<int64_t> seen[2] = {std::vector<int64_t>(size_t(m * v), -1), std::vector<int64_t>(size_t(m * v), -1)};
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    if (op.micro_batch < 0 || op.micro_batch >= m || op.chunk < 0 || op.chunk >= v)
      return KS_ERR("pipeline rank ", rank, " op ", i, " ", to_string(op), " is outside ", m, " micro-batches x ", v,
                    " chunks");
    const bool b = op.kind == PipeOpKind::Backward;
    if (b && !with_backward)
      return KS_ERR("pipeline rank ", rank, " op ", i, " ", to_string(op), " in a forward-only schedule");
    const size_t key = size_t(op.micro_batch * v + op.chunk);
    if (seen[b][key] >= 0)
      return KS_ERR("pipeline rank ", rank, " runs ", to_string(op), " twice (ops ", seen[b][key], " and ", i, ")");
    if (b && seen[0][key] < 0)
      return KS_ERR("pipeline rank ", rank, " op ", i, " ", to_string(op), " runs before its forward");
    seen[b][key] = int64_t(i);
  }
  for (int b = 0; b < (with_backward ? 2 : 1); ++b)
    for (int64_t key = 0; key < m * v; ++key)
      if (seen[b][size_t(key)] < 0)
        return KS_ERR("pipeline rank ", rank, " never runs ",
                      to_string({b ? PipeOpKind::Backward : PipeOpKind::Forward, key / v, int(key % v)}));
  return Status::ok();
}

namespace {

struct OpKey {
  PipeOpKind kind;
  int rank;
  int64_t mb;
  int chunk;
};

// The (rank, chunk) of virtual stage s + step (virtual stage s = chunk * p +
// rank, for rank r's chunk c); none past either end of the pipeline.
std::optional<std::pair<int, int>> virtual_neighbour(int r, int c, int p, int v, int step) {
  const int s = c * p + r + step;
  if (s < 0 || s >= p * v) return std::nullopt;
  return std::pair<int, int>{s % p, s / p};
}

// The cross-rank dependency of op (kind, r, mb, c) (see simulate_schedule):
// a forward waits for the previous virtual stage's, a backward for the next
// one's; none for the first virtual stage's forward and the last one's backward.
std::optional<OpKey> cross_dep(const PipeOp& op, int r, int p, int v) {
  const auto n = virtual_neighbour(r, op.chunk, p, v, op.kind == PipeOpKind::Forward ? -1 : 1);
  if (!n) return std::nullopt;
  return OpKey{op.kind, n->first, op.micro_batch, n->second};
}

std::string key_text(const OpKey& k) {
  return detail::concat(k.kind == PipeOpKind::Forward ? "F" : "B", k.mb, ".", k.chunk, " on rank ", k.rank);
}

}  // namespace

namespace {

// simulate_schedule's body; also records when each op starts ((*starts)[r][i], in slots) when starts is given.
Result<ScheduleStats> simulate(const std::vector<std::vector<PipeOp>>& ops, int v, PipeCosts costs,
                               std::vector<std::vector<int64_t>>* starts) {
  const int p = int(ops.size());
  if (p < 1 || v < 1 || costs.forward < 0 || costs.backward < 0)
    return KS_ERR("pipeline trace: ", p, " ranks, v=", v, " chunks, costs ", costs.forward, "/", costs.backward,
                  ": need at least one rank, v >= 1 and costs >= 0");
  int64_t m = 0;
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < ops[size_t(r)].size(); ++i) {
      const PipeOp& op = ops[size_t(r)][i];
      if (op.micro_batch < 0 || op.chunk < 0 || op.chunk >= v)
        return KS_ERR("pipeline trace: rank ", r, " op ", i, " ", to_string(op), " has a micro-batch < 0 or a chunk ",
                      "outside [0, ", v, ")");
      m = std::max(m, op.micro_batch + 1);
    }
  // done[kind][r][mb * v + c]: the slot its op ends, -1 = not run (yet).
  auto index = [&](int64_t mb, int c) { return size_t(mb * v + c); };
  std::vector<std::vector<int64_t>> done[2];
  for (auto& d : done) d.assign(size_t(p), std::vector<int64_t>(size_t(m * v), -1));
  auto end_of = [&](const OpKey& k) {
    return done[k.kind == PipeOpKind::Backward][size_t(k.rank)][index(k.mb, k.chunk)];
  };

  ScheduleStats st;
  st.busy_slots.assign(size_t(p), 0);
  st.peak_in_flight.assign(size_t(p), 0);
  std::vector<size_t> next(size_t(p), 0);
  std::vector<int64_t> clock(size_t(p), 0), in_flight(size_t(p), 0);
  if (starts) {
    starts->assign(size_t(p), {});
    for (int r = 0; r < p; ++r) (*starts)[size_t(r)].assign(ops[size_t(r)].size(), -1);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = ops[size_t(r)];
      for (size_t& i = next[size_t(r)]; i < list.size(); ++i) {
        const PipeOp& op = list[i];
        const bool b = op.kind == PipeOpKind::Backward;
        if (done[b][size_t(r)][index(op.micro_batch, op.chunk)] >= 0)
          return KS_ERR("pipeline trace: rank ", r, " runs ", to_string(op), " twice (op ", i, ")");
        int64_t start = clock[size_t(r)];
        const auto dep = cross_dep(op, r, p, v);
        if (dep) {
          if (end_of(*dep) < 0) break;
          start = std::max(start, end_of(*dep));
        }
        if (b) {
          const int64_t f = done[0][size_t(r)][index(op.micro_batch, op.chunk)];
          if (f < 0) break;
          start = std::max(start, f);
        }
        const int64_t cost = b ? costs.backward : costs.forward;
        if (starts) (*starts)[size_t(r)][i] = start;
        clock[size_t(r)] = start + cost;
        done[b][size_t(r)][index(op.micro_batch, op.chunk)] = clock[size_t(r)];
        st.busy_slots[size_t(r)] += cost;
        in_flight[size_t(r)] += b ? -1 : 1;
        st.peak_in_flight[size_t(r)] = std::max(st.peak_in_flight[size_t(r)], in_flight[size_t(r)]);
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    const size_t i = next[size_t(r)];
    if (i == ops[size_t(r)].size()) continue;
    const PipeOp& op = ops[size_t(r)][i];
    const auto dep = cross_dep(op, r, p, v);
    const bool own_fwd = op.kind == PipeOpKind::Backward && done[0][size_t(r)][index(op.micro_batch, op.chunk)] < 0;
    std::string waits = "nothing";
    if (own_fwd) {
      waits = detail::concat("its own F", op.micro_batch, ".", op.chunk);
    } else if (dep) {
      const PipeOp want{dep->kind, dep->mb, dep->chunk};
      const auto& theirs = ops[size_t(dep->rank)];
      waits = key_text(*dep) +
              (std::find(theirs.begin(), theirs.end(), want) == theirs.end() ? " (which that rank never runs)" : "");
    }
    stuck += detail::concat("; rank ", r, " at op ", i, " (", to_string(op), ") waits for ", waits);
  }
  if (!stuck.empty()) return KS_ERR("pipeline trace deadlocks", stuck);
  st.makespan_slots = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < p; ++r) st.idle_slots.push_back(st.makespan_slots - st.busy_slots[size_t(r)]);
  return st;
}

}  // namespace

std::optional<PipeTransfer> transfer_of(const PipeOp& op, int r, int p, int v) {
  // The op that depends on this one (cross_dep's inverse): a forward feeds
  // the next virtual stage's forward, a backward the previous one's backward.
  const auto n = virtual_neighbour(r, op.chunk, p, v, op.kind == PipeOpKind::Forward ? 1 : -1);
  if (!n) return std::nullopt;
  return PipeTransfer{r, n->first, {op.kind, op.micro_batch, n->second}};
}

Result<ScheduleStats> simulate_schedule(const std::vector<std::vector<PipeOp>>& ops, int v, PipeCosts costs) {
  return simulate(ops, v, costs, nullptr);
}

Result<std::vector<std::vector<PipeTransfer>>> plan_transfers(const std::vector<std::vector<PipeOp>>& ops, int v,
                                                              int rank) {
  const int p = int(ops.size());
  if (rank < 0 || rank >= p) return KS_ERR("plan_transfers: rank ", rank, " of ", p, " op lists");
  const PipeCosts costs;  // any positive costs give a valid order; these are simulate_schedule's
  std::vector<std::vector<int64_t>> start;  // [rank][op]: when the op starts
  auto sim = simulate(ops, v, costs, &start);
  if (!sim.is_ok()) return sim.status();
  // This rank's transfers keyed by (time, sender, sender's op): one total
  // order that both ends of every transfer compute alike.
  struct Timed {
    int64_t time;
    int from;
    size_t op;
    PipeTransfer t;
    bool operator<(const Timed& o) const { return std::tie(time, from, op) < std::tie(o.time, o.from, o.op); }
  };
  std::vector<Timed> mine;
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < ops[size_t(r)].size(); ++i) {
      const PipeOp& op = ops[size_t(r)][i];
      const auto t = transfer_of(op, r, p, v);
      if (!t || (t->from != rank && t->to != rank)) continue;
      mine.push_back({start[size_t(r)][i] + (op.kind == PipeOpKind::Forward ? costs.forward : costs.backward), r, i,
                      *t});
    }
  std::sort(mine.begin(), mine.end());
  const std::vector<int64_t>& own = start[size_t(rank)];  // non-decreasing: a rank runs its ops in order
  std::vector<std::vector<PipeTransfer>> slots(own.size() + 1);
  for (const Timed& x : mine)
    slots[size_t(std::lower_bound(own.begin(), own.end(), x.time) - own.begin())].push_back(x.t);
  return slots;
}

double bubble_fraction(const ScheduleStats& stats, int rank) {
  if (stats.makespan_slots == 0) return 0.0;
  return double(stats.idle_slots.at(size_t(rank))) / double(stats.makespan_slots);
}

}  // namespace kestrel::train
