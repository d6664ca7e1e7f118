// The rollout worker (verl's rollout role): the in-process rollout engine
// over a versioned view of the actor's weights. It generates a step's
// responses (each rollout tp group its share of the prompts, every rank then
// all of them) as a RolloutBatch tagged with the actor weight version its
// view holds, sleeps (KV memory, and a copy's weights, freed while training
// runs) and wakes, and syncs to a newer actor version.
//
// The view (RolloutWeightView) over rollout::RolloutWeights:
//   in place (colocated, rollout tp == train tp): the engine reads the actor's
//     parameters, so the view always holds the actor's current version;
//   a copy (another tp layout or dtype): holds the version of its latest
//     refresh(), stale after an actor update until refreshed.
// Data generated from a stale view is off-policy: the driver recomputes its
// old log-probs (RolloutBatch::weight_version < the actor's).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/transformer.h"
#include "rl/distributed.h"
#include "rl/rollout_batch.h"
#include "rollout/engine.h"
#include "rollout/reshard.h"

namespace kestrel::rl {

class RolloutWeightView {
 public:
  // `actor` (whose weights the view reads or copies) must outlive the view;
  // actor_version() is its current weight version. Collective over the
  // actor's tp group (RolloutWeights::create).
  RolloutWeightView(const model::CausalLM& actor, const rollout::RolloutWeightsOptions& opts,
                    std::function<int64_t()> actor_version);

  const model::CausalLM& model() const { return weights_->model(); }
  bool in_place() const { return weights_->in_place(); }
  // The actor weight version the view's model holds.
  int64_t version() const { return in_place() ? actor_version_() : version_; }
  int64_t actor_version() const { return actor_version_(); }
  bool stale() const { return version() != actor_version(); }

  // Brings the view to the actor's current version (a copy re-copies every
  // parameter, collective over the actor's tp group; in place nothing moves).
  const rollout::ReshardStats& refresh();
  // Frees a copy while training runs (no-op in place); refresh() before use.
  void release() { weights_->release(); }
  bool released() const { return weights_->released(); }

 private:
  std::unique_ptr<rollout::RolloutWeights> weights_;
  std::function<int64_t()> actor_version_;
  int64_t version_ = 0;  // a copy's version (its latest refresh)
};

// Sampling seed of prompt `index` of step `step` (its n samples differ by sample index).
uint64_t rollout_request_seed(uint64_t seed, int64_t step, int64_t index);

// One request of a partial-rollout round (rl/async_rollout.h): a prompt with
// the tokens its sample generated so far appended, drawing as sample
// sample_offset of the original request (rollout_request_seed's seed), at most
// max_tokens new tokens. may_continue: max_tokens is this round's budget, below
// what the response may still reach, so stopping there leaves it unfinished.
struct RoundRequest {
  std::vector<int32_t> tokens;
  int64_t n = 1;
  uint64_t seed = 0;
  uint64_t sample_offset = 0;
  int64_t max_tokens = 1;
  bool may_continue = false;
};

// Sees each response of this rank's rollout group as its request finishes,
// before the round returns (every sample of a request at once): the trainer
// scores it while the rest still generate. WireResponse::prompt is the
// request's index. Called on every rank of the group that generated it.
using ResponseSink = std::function<void(const WireResponse&)>;

struct RolloutOptions {
  int64_t n = 4;  // responses per prompt
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  int64_t response_length = 64;
  uint64_t seed = 0;  // rollout_request_seed's
  rollout::EngineConfig engine;
  // Storage dtype of the rollout's weights; nullopt = the actor's. Another
  // dtype (f32 training, bf16 rollout) makes the view a copy.
  std::optional<DType> weights_dtype;
  // Validation sampling (rollout.val_kwargs.*).
  int64_t val_n = 1;
  double val_temperature = 0.0;  // 0 = greedy
  int64_t val_top_k = -1;
  double val_top_p = 1.0;
};

class RolloutWorker {
 public:
  // Builds the view over `actor` (rollout tp group parallel.rollout_tp, else
  // the actor's own: in place) and the engine on it.
  RolloutWorker(const model::CausalLM& actor, std::function<int64_t()> actor_version, RolloutOptions opt,
                const RlParallel& parallel);

  const RolloutWeightView& view() const { return view_; }
  rollout::Engine& engine() { return *engine_; }
  // The engine's packed weights when they are the actor's (the rollout reads
  // the actor's weights in place and is awake), for the actor's scoring
  // passes; nullptr otherwise, and for a model on a device (packs are the CPU GEMM's).
  cpu::WeightPacks* actor_packs() {
    return view_.in_place() && !engine_->is_sleeping() && view_.model().device() == Device::CPU
               ? &engine_->weight_packs()
               : nullptr;
  }
  const RolloutOptions& options() const { return opt_; }
  // The version the rollout generates with (the view's).
  int64_t version() const { return view_.version(); }

  // Responses to prompts[k] (k: index within the step; rollout.n each,
  // seeds rollout_request_seed(seed, step, k)), with the engine's
  // log-probs, as a batch tagged with version(). Collective over the world.
  RolloutBatch generate(const std::vector<std::vector<int32_t>>& prompts, int64_t step);
  // val_n greedy/val_kwargs responses to every prompt (fixed seeds: comparable
  // across steps), sorted by (prompt, sample). Collective over the world.
  std::vector<WireResponse> generate_validation(const std::vector<std::vector<int32_t>>& prompts);
  // A partial-rollout round: responses to reqs[k] (WireResponse::prompt = k,
  // sample = the request's own sample index), with log-probs and `finished`;
  // `sink` (may be empty) sees this rank's as they finish. Collective over the world.
  std::vector<WireResponse> generate_round(const std::vector<RoundRequest>& reqs, const ResponseSink& sink = {});

  // Frees the KV cache (colocated: training runs meanwhile) and, with
  // release_weights, a copy's weights.
  void sleep(bool release_weights);
  void wake();
  // After an actor update: the view to the actor's version, the engine awake
  // with its prefix cache reset. Returns the refresh's stats.
  const rollout::ReshardStats& sync();
  // After the actor's weights were loaded (a resume): as sync(), the engine
  // left asleep or awake as it is.
  void reload();

 private:
  std::vector<WireResponse> run(const std::vector<std::vector<int32_t>>& prompts, rollout::SamplingParams sp,
                                const std::function<uint64_t(int64_t)>& seed, bool logprobs);
  // Request k: prompts[k] with params(k). `finished(k, out)` says whether a
  // response of request k is complete; `sink` (may be empty) sees this rank's responses as they finish.
  std::vector<WireResponse> run_requests(
      const std::vector<std::vector<int32_t>>& prompts, const std::function<rollout::SamplingParams(int64_t)>& params,
      bool logprobs, const std::function<bool(int64_t, const rollout::CompletionOutput&)>& finished,
      const ResponseSink& sink = {});
  void reset_cache_if_moved();
  // The training rollout's sampling (rollout.temperature/top_k/top_p) for max_tokens and n samples.
  rollout::SamplingParams training_sampling(int64_t max_tokens, int64_t n) const;

  RolloutOptions opt_;
  RlParallel parallel_;
  RolloutWeightView view_;
  std::unique_ptr<rollout::Engine> engine_;
  int groups_ = 1, group_ = 0;  // rollout tp groups, and this rank's
  bool leader_ = true;          // first rank of its rollout group
  int64_t engine_version_ = 0;  // the view version the engine's prefix cache was computed with
};

}  // namespace kestrel::rl
