// Pipeline schedules as data: the order of forward and backward passes each
// pipeline rank runs over its model chunks (Megatron-Core's
// pipeline_parallel/schedules.py), and the analysis of executed op lists
// (makespan, idle slots, peak in-flight activations, deadlock) that the
// engine's recorded traces and the benchmarks go through.
//
// A rank's ops name (micro-batch, local chunk); with v chunks per rank the
// chunk c of rank r is virtual stage c * p + r (parallel/pipeline_layout.h).
// No communication here: the engine runs these ops, receiving a chunk's
// input from the previous virtual stage and its output gradient from the next.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::train {

enum class PipeOpKind { Forward, Backward };

struct PipeOp {
  PipeOpKind kind = PipeOpKind::Forward;
  int64_t micro_batch = 0;
  int chunk = 0;  // the local model chunk on this rank, 0..v-1
  bool operator==(const PipeOp&) const = default;
};

// "F3.1" / "B0.0": kind, micro-batch, chunk (the golden files' spelling).
std::string to_string(const PipeOp& op);

// Megatron's schedule table (get_schedule_table): virtual micro-batch k ->
// (micro-batch, chunk), over groups of n micro-batches: for each group, every
// chunk in order, the group's micro-batches in order (the last group takes
// the remainder). Forward chunk of entry k; the backward of entry k uses
// chunk v-1-c.
std::vector<std::pair<int64_t, int>> schedule_table(int64_t m, int v, int64_t n);

// Forward only (scoring), every (mb, chunk) once in the schedule table's
// order (group n = group_size, 0 = p; v = 1: micro-batch order). Megatron's
// forward-only interleaved pass also applies the micro-batch group check;
// forward-only has no backward dependency, so any m runs without deadlock and
// we leave the check to the caller (parallel::check_interleaved_microbatches).
std::vector<PipeOp> schedule_forward_only(int p, int rank, int64_t m, int v, int64_t group_size = 0);

// GPipe: every forward (table order), then every backward (the same entries,
// chunks reversed: v-1-c). Peak in flight m * v chunk activations.
std::vector<PipeOp> schedule_all_forward_all_backward(int p, int rank, int64_t m, int v, int64_t group_size = 0);

// Megatron forward_backward_pipelining_without_interleaving on rank `rank` of
// p: w = min(p - rank - 1, m) warm-up forwards, m - w steady pairs (forward
// mb w+j, then backward mb j), w cool-down backwards. Chunk 0 throughout.
std::vector<PipeOp> schedule_1f1b(int p, int rank, int64_t m);

// Megatron forward_backward_pipelining_with_interleaving: the schedule table
// over groups of N = group_size (0 = p) micro-batches; warm-up
// w = min((p - rank - 1) * 2 + (v - 1) * N, m * v) forwards, then steady
// pairs (forward entry w+j, backward entry j), then the remaining backwards.
// Errors: bad sizes, v > 1 with p < 2, and Megatron's micro-batch group check
// (parallel::check_interleaved_microbatches). v == 1 is no interleaving: the
// plain 1F1B (Megatron turns a vpp of 1 into None).
Result<std::vector<PipeOp>> schedule_interleaved_1f1b(int p, int rank, int64_t m, int v, int64_t group_size = 0);

// Every (mb, chunk) of m x v forwarded exactly once (and, with_backward,
// backwarded exactly once, after its forward); an error names the first
// missing, repeated or misordered op and the rank.
Status check_rank_ops(const std::vector<PipeOp>& ops, int rank, int64_t m, int v, bool with_backward);

// Integer op costs in slots. The default (forward 1, backward 2 per chunk
// pass) is Megatron's tf = 1, tb = 2 per layer with equal layers and v chunks
// per rank scaled by v, so a chunk's passes cost whole slots: with zero
// communication 1F1B then takes 3 (m + p - 1) slots and interleaved 1F1B
// 3 (v m + p - 1), of which each rank is busy 3 v m; the bubble
// idle / makespan is exactly (p-1)/(m+p-1) and (p-1)/(v m+p-1).
struct PipeCosts {
  int64_t forward = 1;
  int64_t backward = 2;
};

struct ScheduleStats {
  int64_t makespan_slots = 0;          // when the last op of any rank ends
  std::vector<int64_t> busy_slots;     // per rank: the sum of its ops' costs
  std::vector<int64_t> idle_slots;     // per rank: makespan - busy (waits and the tail after its last op)
  std::vector<int64_t> peak_in_flight; // per rank: max over its op list of forwards - backwards so far
                                       // (chunk activations held; / v = stage-activation units)
};

// Simulates per-rank op lists (ops[r] for rank r of p = ops.size(), v chunks
// per rank) with the costs above and these dependencies (zero communication):
//   F(r, mb, c) after F(r-1, mb, c), or F(p-1, mb, c-1) when r == 0 (c > 0);
//   B(r, mb, c) after B(r+1, mb, c), or B(0, mb, c+1) when r == p-1 (c < v-1),
//   and after F(r, mb, c).
// Each rank runs its ops in order, each as soon as the rank is free and its
// dependencies are done. Errors: an op out of range or repeated on a rank, and
// deadlock (an op waiting on one that never runs or that waits on it), naming
// each stuck rank's next op and what it waits for.
Result<ScheduleStats> simulate_schedule(const std::vector<std::vector<PipeOp>>& ops, int v, PipeCosts costs = {});

// idle / makespan of one rank (the pipeline bubble fraction).
double bubble_fraction(const ScheduleStats& stats, int rank);

// One point-to-point transfer of the pipeline: the output of an op on pp
// rank `from` (a forward's activations, a backward's input gradient) to pp
// rank `to`, for its op `consumer` (kind, micro-batch, the receiver's chunk).
struct PipeTransfer {
  int from = 0, to = 0;
  PipeOp consumer;
  bool operator==(const PipeTransfer&) const = default;
};

// The transfer op (run on pp rank `rank` of p, v chunks per rank) produces:
// a forward's output to the next virtual stage's forward, a backward's to
// the previous one's backward; none from the last virtual stage's forward
// (the head's output stays for the loss) or the first one's backward.
std::optional<PipeTransfer> transfer_of(const PipeOp& op, int rank, int p, int v);

// When rank `rank` posts each of its transfers, given every rank's op list
// (ops[r], all from the same schedule call, v chunks per rank): slots[k] are
// the sends and receives it posts, in this order and as one group, before
// its op k; slots[ops[rank].size()] after its last op. Every transfer runs
// on its two ranks in one global order, so it suits transports without tags
// or buffering (NCCL: a pair's messages match in posting order, and a send
// may wait on the stream until its receiver posts): no pair's messages
// cross, and no rank waits in a group on one that waits on it.
//
// The order: the op lists are timed as simulate_schedule times them
// (forward 1, backward 2 slots), each transfer at the end of the op that
// produces it, ties by the sender's rank and op index. A rank posts a
// transfer in the slot of its first op starting at or after that time; a
// send so comes right after the op producing it and a receive at the latest
// before the op consuming it (which starts after its producer ends). Each
// rank's sequence of groups and ops is then sorted by that time, so the
// earliest unfinished transfer always has both ends posted (no deadlock),
// and a pair's transfers are posted in the same order on both sides.
// Errors: the op lists deadlock (simulate_schedule's message), or rank is out of range.
Result<std::vector<std::vector<PipeTransfer>>> plan_transfers(const std::vector<std::vector<PipeOp>>& ops, int v,
                                                              int rank);

}  // namespace kestrel::train
