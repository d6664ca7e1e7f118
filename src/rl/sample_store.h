// The sample store between the rollout and the trainer (MindSpeed-RL's
// TransferDock in function, for the rollout's fields): prompt groups drawn
// from the prompt stream, each with its rollout.n responses as far as they
// have been generated, the rollout log-prob and the policy version of every
// token, and whether each response is finished. The asynchronous rollout
// (rl/async_rollout.h) fills it ahead of training (bounded staleness) and in
// rounds (partial rollout); a step takes the oldest finished groups. It is
// part of the checkpoint (sample_store.json): a resumed run neither loses a
// generated sample nor trains one twice.
//
// Versions: the policy version of a token is the number of training steps
// (parameter syncs) done when it was generated, verl's param_version; the
// staleness of a group when trained is the trainer's version minus the
// version of its oldest token.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::rl {

struct StoredSample {
  std::vector<int32_t> tokens;    // the response so far
  std::vector<float> logprobs;    // the rollout's log p of each token (empty: not recorded)
  std::vector<int32_t> versions;  // policy version that generated each token
  std::vector<int32_t> routed_experts;  // router replay R3 (whole responses only)
  bool finished = false;
  int32_t rounds = 0;  // generation rounds it took part in (> 1: a partial response)
};

struct StoredGroup {
  int64_t stream = 0;  // position in the prompt stream: batch stream / B, index stream % B (its seeds)
  int64_t prompt = 0;  // index into the training prompts
  uint64_t seed = 0;   // the request seed of its samples (rollout_request_seed)
  // The actor weight version (train::TrainingEngine::weight_version) of its
  // first round: data older than the actor's current weights has its old
  // log-probs recomputed.
  int64_t weight_version = 0;
  std::vector<StoredSample> samples;  // rollout.n, by sample index

  bool finished() const;
  // Policy version of its oldest token (that of its first round when no token was generated yet).
  int64_t first_version() const;
  int32_t max_rounds() const;
};

// One group as JSON (log-probs as their float bits: restored exactly), and back; `where` names the source.
nlohmann::ordered_json group_to_json(const StoredGroup& g);
Result<StoredGroup> group_from_json(const nlohmann::json& j, const std::string& where);

// Counters carried across steps (and checkpoints), verl's fully_async/count/*.
struct StoreCounters {
  int64_t generated_groups = 0;        // groups whose generation finished
  int64_t stale_groups_trained = 0;    // trained with staleness > 0 (verl's stale_samples_processed)
  int64_t stale_responses_trained = 0; // their responses (stale_trajectory_processed)
  int64_t dropped_groups = 0;          // beyond the staleness bound, never trained
  int64_t rounds_since_take = 0;       // generation rounds run since a batch was last taken
};

class SampleStore {
 public:
  void add(StoredGroup g) { groups_.push_back(std::move(g)); }
  int64_t size() const { return int64_t(groups_.size()); }
  int64_t num_finished() const;
  int64_t num_unfinished() const { return size() - num_finished(); }
  // Groups in stream order (oldest first); the rollout appends to their samples.
  std::deque<StoredGroup>& groups() { return groups_; }
  const std::deque<StoredGroup>& groups() const { return groups_; }
  // Removes and returns the `count` oldest finished groups (stream order).
  std::vector<StoredGroup> take_finished(int64_t count);
  // Removes the finished groups older than the bound (trainer version - first
  // version > max_staleness): they are counted, never trained.
  int64_t drop_stale(int64_t trainer_version, int64_t max_staleness);

  // Dataset indices drawn from the prompt source but not yet in a group (a
  // source batch is drawn whole; staleness may generate part of it).
  std::deque<int64_t>& drawn() { return drawn_; }
  int64_t next_stream() const { return next_stream_; }
  void set_next_stream(int64_t s) { next_stream_ = s; }
  StoreCounters& counters() { return counters_; }
  const StoreCounters& counters() const { return counters_; }

  nlohmann::ordered_json to_json() const;
  // `where` names the file in messages.
  static Result<SampleStore> from_json(const nlohmann::json& j, const std::string& where);

 private:
  std::deque<StoredGroup> groups_;
  std::deque<int64_t> drawn_;
  int64_t next_stream_ = 0;  // stream position of the next prompt taken from drawn_
  StoreCounters counters_;
};

}  // namespace kestrel::rl
