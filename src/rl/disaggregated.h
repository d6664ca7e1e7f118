// Disaggregated placement (verl's fully-async / one-step-off-policy layout,
// rollout.nnodes x rollout.n_gpus_per_node rollout ranks): under mpirun the
// last R world ranks only generate, the others train (by data parallelism;
// world rank 0, the trainer leader, talks to the rollout ranks and passes
// each batch to the other trainer ranks). The rollout
// ranks run the same schedule as a colocated trainer (rl/async_rollout.h:
// the pipeline with staleness t, or partial rollout) on their own copy of the
// weights, so a disaggregated run trains on the batches a colocated run of
// the same settings would; with t >= 1 the rollout of step k+1 runs while
// the trainer trains step k.
//
// The channel, over the world's point-to-point messages (comm::ProcessGroup;
// never files):
//   trainer -> every rollout rank: a control word per step (what follows:
//     weights, weights then a validation, a validation alone, or stop; the
//     policy version and the actor's weight version), then the weights in buckets (rollout/weight_sync.h, verl's
//     checkpoint_engine.update_weights_bucket_megabytes), published without
//     blocking the trainer;
//   rollout leader -> trainer, in order: each step's batch (its groups and
//     fully_async/ metrics), then the rollout's state after that step (the
//     sample store and the prompt source's position: the trainer saves it
//     with a checkpoint, and sends it back to the rollout when it resumes),
//     the validation responses when asked (generated between two steps, as a
//     colocated trainer validates), and an end marker after a stop.
// At start the trainer sends the step it starts from, the saved rollout
// state (empty for a fresh run) and its weights: the rollout ranks never
// read a checkpoint themselves.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "model/transformer.h"
#include "rl/async_rollout.h"
#include "rollout/weight_sync.h"
#include "train/sft_trainer.h"

namespace kestrel::rl {

// The world ranks the trainer leader talks to: itself (rank 0) and the rollout ranks (the last R).
struct DisaggregatedLayout {
  int trainer = 0;
  std::vector<int> rollout;  // world ranks; rollout[0] is the rollout leader
  int64_t bucket_bytes = int64_t(2048) << 20;
};

// The trainer's end of the channel.
class RemoteRollout {
 public:
  RemoteRollout(comm::ProcessGroup& world, DisaggregatedLayout layout);
  ~RemoteRollout();

  // Starts the rollout ranks at `step` with `state` (null: a fresh run) and the trainer's weights;
  // `validate`: they validate with them first (val_before_train).
  void start(int64_t step, const nlohmann::json& state, model::CausalLM& actor, int64_t actor_version, bool validate);
  // Step `step`'s groups and the rollout's metrics (blocks until they arrive).
  std::vector<StoredGroup> receive_batch(int64_t step, std::map<std::string, double>& m);
  // After the update that made policy version `version`: the weights to every rollout rank (the trainer
  // goes on while they travel). Returns the bytes one rollout rank receives.
  // `validate`: they validate with these weights before generating on.
  int64_t publish(model::CausalLM& actor, int64_t version, int64_t actor_version, bool validate);
  // The validation responses (rl/distributed.h WireResponse, sorted by prompt and sample) generated with the
  // latest weights sent; asks for them first unless a publish already did.
  std::vector<WireResponse> receive_validation();
  // The rollout's state after step `step` (blocks until it arrives); for the checkpoint.
  const nlohmann::ordered_json& state_after(int64_t step);
  // Tells the rollout ranks to stop and drains what they still send; idempotent.
  void stop();
  // Seconds receive_batch waited (the trainer idle, verl's trainer/idle_ratio) since the last call.
  double take_wait_seconds();
  // Streamed responses (RolloutRankInputs::stream_responses): each one the
  // rollout leader finished, as the trainer receives it, before the batch
  // that trains it (stream position and dataset index of its group, sample, tokens).
  using ResponseFn = std::function<void(int64_t stream, int64_t prompt, int64_t sample, const std::vector<int32_t>&)>;
  void set_on_response(ResponseFn fn) { on_response_ = std::move(fn); }

 private:
  struct Message {
    int64_t kind = 0, step = 0;
    std::string payload;
  };
  Message receive();
  // Receives the rollout leader's next message and files it (a batch, a state, the validation asked for);
  // `awaited` names what the caller waits for, in the error when the rollout ranks ended first.
  void receive_and_file(const std::string& awaited);
  void send_control(int64_t kind, int64_t version, int64_t actor_version);

  comm::ProcessGroup& world_;
  DisaggregatedLayout layout_;
  std::unique_ptr<rollout::WeightPublisher> publisher_;
  std::deque<std::pair<std::vector<int64_t>, std::unique_ptr<comm::PendingTransfer>>> controls_;
  std::map<int64_t, nlohmann::ordered_json> states_;
  std::map<int64_t, Message> batches_;
  bool stopped_ = false;
  double wait_s_ = 0;
  ResponseFn on_response_;
  int64_t publishes_ = 0;
  bool validation_asked_ = false;  // a validation was asked for and its responses not yet received
  std::optional<Message> validation_;  // its responses, once received
  int64_t version_ = 0, actor_version_ = 0;  // the latest weights sent
};

struct RolloutRankInputs {
  comm::ProcessGroup* world = nullptr;     // the whole job
  DisaggregatedLayout layout;
  model::CausalLM* model = nullptr;        // this rank's whole copy of the policy (tp 1)
  RolloutOptions rollout;                  // the engine over it
  RlParallel parallel;                     // its world: the rollout ranks (each a whole copy, tp 1)
  AsyncRolloutOptions async;
  train::BatchSource* source = nullptr;    // the prompt stream
  const std::vector<std::vector<int32_t>>* prompts = nullptr;  // token ids per dataset index
  const std::vector<std::vector<int32_t>>* val_prompts = nullptr;  // the validation set's, in order
  int64_t total_steps = 0;
  // reward_model.launch_reward_fn_async: the leader sends each response it
  // finishes to the trainer at once (scored there while generation goes on).
  bool stream_responses = false;
};

// A rollout rank's whole life: waits for the start, then generates and hands
// over each step's batch until total_steps or the trainer's stop.
Status run_rollout_rank(const RolloutRankInputs& in);

}  // namespace kestrel::rl
