// Continuous batching with a token budget (vLLM's v1 scheduler, plus v0's
// swap preemption and n-sample forks). Each step assigns every running
// sequence the tokens it still needs (1 for a decode, a chunk for a prefill)
// within max_num_batched_tokens, running sequences first in admission order,
// then swapped-out ones, then waiting ones. When blocks run out, the most
// recently admitted running sequence is preempted: its blocks are freed and
// it re-queues at the front (recompute; its full blocks usually stay cached),
// or its blocks are first copied to the host swap area (swap).
#pragma once
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "rollout/block_pool.h"
#include "rollout/sequence.h"

namespace kestrel::rollout {

struct SchedulerConfig {
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_num_seqs = 256;
  bool enable_chunked_prefill = true;
  bool swap_mode = false;  // preemption: false = recompute, true = swap
};

// Where swapped blocks go: the scheduler only reserves/releases host ids;
// the copies themselves run before the step's forward.
class SwapSpace {
 public:
  virtual ~SwapSpace() = default;
  virtual std::vector<int32_t> reserve(int64_t n) = 0;  // empty when not enough room
  virtual void release(const std::vector<int32_t>& ids) = 0;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t start = 0;       // first position computed this step
  int64_t num_tokens = 0;  // positions [start, start + num_tokens)
  bool samples = false;    // the chunk reaches the last token: its last row is sampled
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;  // in batch order
  int64_t num_tokens = 0;
  // Block copies to run before the forward, swap-outs first: (device, host), (host, device).
  std::vector<std::pair<int32_t, int32_t>> swap_out, swap_in;
  int64_t num_preempted = 0;
  bool empty() const { return seqs.empty(); }
};

struct SchedulerCounters {
  int64_t prefix_queries = 0, prefix_hits = 0;  // in tokens, first admissions only
  int64_t preemptions = 0, swapped_out_blocks = 0, swapped_in_blocks = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockPool& pool, SwapSpace* swap);

  void add(Sequence* s);  // to the back of the waiting queue
  SchedulerOutput schedule();

  // Samples 1..n-1 of a request start from sample 0 once its prompt is in the
  // cache: they reference its full blocks and get their own copy of the
  // partial last block (returned as (src, dst) device copies to run now).
  // A child that finds no free block waits to be recomputed instead.
  std::vector<std::pair<int32_t, int32_t>> fork(Sequence* parent, const std::vector<Sequence*>& children);
  // A sequence finished: its blocks are freed and it leaves every queue.
  void finish(Sequence* s);
  // Preempts everything by recompute (sleep, abort-all); waiting order is kept
  // as running, swapped, waiting.
  void preempt_all();

  bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::deque<Sequence*>& swapped() const { return swapped_; }
  const SchedulerCounters& counters() const { return counters_; }

  // Blocks a sequence of n tokens occupies.
  int64_t blocks_for(int64_t n) const { return (n + cfg_.block_size - 1) / cfg_.block_size; }

 private:
  // vLLM's allocate_slots: adds the prefix-cache hits and enough new blocks
  // for positions up to num_computed + n, then registers newly full blocks.
  bool allocate_slots(Sequence* s, int64_t n, const std::vector<int32_t>& hits);
  std::vector<int32_t> prefix_hits(Sequence* s);
  void register_full_blocks(Sequence* s, int64_t upto_tokens);
  void preempt(Sequence* victim, SchedulerOutput& out);
  void preempt_recompute(Sequence* s);
  int64_t group_size(const Sequence* s) const;

  SchedulerConfig cfg_;
  BlockPool& pool_;
  SwapSpace* swap_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_, swapped_;
  SchedulerCounters counters_;
};

}  // namespace kestrel::rollout
