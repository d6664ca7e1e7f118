// The rollout side of asynchronous RL: what a training step gets to train
// on, drawn from the prompt stream into the sample store (rl/sample_store.h)
// and generated ahead of training or in rounds.
//
// Bounded staleness (verl's async_training.staleness_threshold = t): between
// two parameter syncs the rollout may generate up to (1 + t) batches of B
// prompts (verl's rollout_num). Kestrel runs this as a fixed pipeline: prompt
// p of the stream (batch p / B, index p % B: its seeds) is generated with
// policy version r(p) = the least v with p < floor((v + 1 + t) * B), so the
// prompts of step j's batch were generated at most ceil(t) versions before
// j, and a run is reproducible bit for bit. t = 0 is the synchronous trainer;
// t = 1 is verl's one-step-off-policy (the rollout of step k+1 runs with the
// weights step k trains from). Colocated, generation and training alternate
// on the same ranks; disaggregated, rollout ranks run the same schedule
// while the trainer trains.
//
// Partial rollout (MindSpeed's partial_rollout_max_split = s, verl_npu's
// algorithm.partial_rollout_max_split): generation runs in rounds of at
// most ceil(response_length / s) new tokens per response. A step runs a
// round over every unfinished response (the oldest groups first; a
// continued response is re-prefilled from its prompt and its tokens so far
// under the current weights, drawing with its own seed and sample index, so
// at fixed weights it continues exactly where it stopped) and, while fewer
// than B groups are finished, draws the next batch of prompts and runs
// another round; it trains the B oldest finished groups, the rest stay in the
// store for the next step. A response finishes within s rounds; s = 1 is the
// synchronous trainer. Groups trained more than ceil(t) + s - 1 versions after
// their first token are dropped and counted (verl's dropped_stale_samples).
//
// Both together (verl's fully-async trainer with partial rollout): the store
// holds up to floor((1 + t) * B) groups before a step's rounds, as the
// pipeline would, and a step whose batch the previous rounds already
// finished hands it over before its own rounds run (so disaggregated rollout
// ranks generate while the trainer trains). A response still finishes within
// s rounds, and no group trains more than ceil(t) + s - 1 versions late.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "rl/distributed.h"
#include "rl/rollout_batch.h"
#include "rl/sample_store.h"
#include "rl/workers/rollout_worker.h"

namespace kestrel::rl {

struct AsyncRolloutOptions {
  int64_t batch_prompts = 8;  // B: prompts per training step (what the prompt source gives per draw)
  int64_t n = 4;              // responses per prompt
  int64_t response_length = 64;
  uint64_t seed = 0;                // rollout_request_seed's
  double staleness_threshold = 0;  // async_training.staleness_threshold
  int64_t partial_max_split = 1;   // algorithm.partial_rollout_max_split
  // Steps the run trains (trainer.total_training_steps): the pipeline
  // generates no prompt past the last step's batch. 0 = no bound.
  int64_t total_steps = 0;
};

// The largest staleness a trained group may have under staleness threshold t
// and partial_rollout_max_split s: ceil(t) + s - 1.
int64_t max_staleness(double staleness_threshold, int64_t partial_max_split);

// What generation runs on: the colocated rollout worker, or the
// disaggregated rollout ranks. Returns the responses to reqs (prompt = index
// into reqs, sample = index within its request), with log-probs and finished.
// `sink` (may be empty) is given this rank's responses as they finish (ResponseSink).
using RoundGenerateFn =
    std::function<std::vector<WireResponse>(const std::vector<RoundRequest>&, const ResponseSink& sink)>;

// A response complete while its round still runs: its group (samples not yet
// updated by the round), its sample index, and its whole response.
using FinishedResponseFn =
    std::function<void(const StoredGroup& group, int64_t sample, const std::vector<int32_t>& response)>;

class AsyncRollout {
 public:
  // draw_batch: the next B dataset indices of the prompt source; prompt_ids:
  // a dataset index's tokens; weight_version: the actor weight version the
  // generator holds now.
  AsyncRollout(AsyncRolloutOptions opt, std::function<std::vector<int64_t>()> draw_batch,
               std::function<const std::vector<int32_t>&(int64_t)> prompt_ids, RoundGenerateFn generate,
               std::function<int64_t()> weight_version);

  // The B groups step `step` (0-based; the policy is at version `step`)
  // trains on, in stream order, after generating what the schedule asks.
  // Step metrics (fully_async/*) into m.
  std::vector<StoredGroup> next_groups(int64_t step, std::map<std::string, double>& m);
  // next_groups in its two halves, for a rollout that hands a batch over
  // before it generates ahead (disaggregated ranks, rl/disaggregated.h):
  // ready: step's batch is already generated (the pipeline ran ahead; under
  // partial rollout only with staleness t > 0, else every step runs a round
  // first); generate: what the
  // schedule asks at version `step`, returning the rounds run; take: the
  // batch, its metrics (fully_async/rollout_rounds: the rounds run since the
  // previous take; store/groups: what the store holds after this take).
  bool ready(int64_t step) const;
  // batch_taken: step's batch was handed over before (ready).
  int64_t generate(int64_t step, bool batch_taken = false);
  std::vector<StoredGroup> take(int64_t step, std::map<std::string, double>& m);

  // Stream positions the pipeline has generated by the end of step `step`'s
  // rollout: floor((step + 1 + t) * B), capped at total_steps * B.
  int64_t pipeline_target(int64_t step) const;
  // The largest staleness a trained group may have (rl::max_staleness of its options).
  int64_t max_staleness() const;

  // Called on this rank for each response its rollout group finishes, while
  // the round still runs (streaming rewards: reward_model.launch_reward_fn_async).
  void set_on_finished(FinishedResponseFn fn) { on_finished_ = std::move(fn); }

  SampleStore& store() { return store_; }
  const AsyncRolloutOptions& options() const { return opt_; }

 private:
  void draw_groups(int64_t count);  // the next `count` prompts of the stream into the store, nothing generated yet
  // One generation round over the store's unfinished responses at policy
  // version `step`; `budget` new tokens at most per response.
  void run_round(int64_t step, int64_t budget);
  // Whether g is finished and may train at `step` (within the staleness
  // bound); how many of the store's groups are.
  bool trainable_at(const StoredGroup& g, int64_t step) const;
  int64_t trainable(int64_t step) const;
  // Whether a partial-rollout step has run enough rounds: B finished groups
  // for this step (unless batch_taken) and, with staleness, B more for the next.
  bool rounds_done(int64_t step, bool batch_taken) const;
  void add_metrics(const std::vector<StoredGroup>& groups, int64_t step, int64_t rounds,
                   std::map<std::string, double>& m);

  AsyncRolloutOptions opt_;
  std::function<std::vector<int64_t>()> draw_batch_;
  std::function<const std::vector<int32_t>&(int64_t)> prompt_ids_;
  RoundGenerateFn generate_;
  std::function<int64_t()> weight_version_;
  FinishedResponseFn on_finished_;
  SampleStore store_;
};

// The RolloutBatch of `groups` as RolloutWorker::generate builds one: group
// i's responses in sample order with GRPO group i, the rollout log-probs
// (dropped unless every token has one), the routing when every response has
// one, weight_version the oldest group's.
RolloutBatch assemble_batch(const std::vector<StoredGroup>& groups,
                            const std::function<const std::vector<int32_t>&(int64_t)>& prompt_ids,
                            int64_t routed_layers, int64_t routed_topk);

}  // namespace kestrel::rl
