// The RL trainer (verl's RayPPOTrainer.fit, in one process): the driver of
// the RL workers (rl/workers/). Each step takes data.train_batch_size
// prompts and passes one RolloutBatch through them:
//   rollout worker   generates rollout.n responses per prompt with the
//                    in-process engine on a versioned view of the actor's
//                    weights; the batch carries the version it was made with
//   reward worker    scores them (RewardManager or an in-process function)
//   actor worker     old log-probs when needed (several mini-batches or
//                    epochs, the in-reward KL, or data of older weights)
//   ref worker       reference log-probs (KL loss / in-reward KL)
//   critic worker    values (GAE)
//   driver           in-reward KL penalty, advantages (GRPO, RLOO,
//                    REINFORCE++, GAE), data metrics
//   critic worker    value update
//   actor worker     PPO update over ppo_mini_batch_size mini-batches x
//                    ppo_epochs (micro-batched, global denominators, clipping,
//                    AdamW; the loss on response tokens only)
//   rollout worker   sync: its view to the actor's new version
//
// RlOptions is the flat user-facing struct (the config keys); split_options
// cuts it into each worker's own options.
//
// Randomness is a pure function of (seeds, global step): sampling seeds and
// the mini-batch shuffle are derived from the step, so a run resumed from a
// checkpoint (weights, optimizer, step, data-loader position) continues bit
// for bit like an uninterrupted one.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "rl/advantages.h"
#include "rl/async_rollout.h"
#include "rl/critic.h"
#include "rl/disaggregated.h"
#include "rl/distributed.h"
#include "rl/dynamic_sampling.h"
#include "rl/policy_loss.h"
#include "rl/reward_manager.h"
#include "rl/reward_stream.h"
#include "rl/rollout_batch.h"
#include "rl/rollout_correction.h"
#include "rl/workers/actor_worker.h"
#include "rl/workers/critic_worker.h"
#include "rl/workers/ref_worker.h"
#include "rl/workers/reward_worker.h"
#include "rl/workers/rollout_worker.h"
#include "rollout/engine.h"
#include "train/engine.h"
#include "train/logging.h"
#include "train/sft_trainer.h"

namespace kestrel::rl {

struct RlPrompt {
  std::vector<int32_t> ids;  // chat template with the generation prompt, tokenized
  std::string data_source, ground_truth;
  nlohmann::ordered_json extra_info;
};

struct RlOptions {
  // Data / rollout (data.*, actor_rollout_ref.rollout.*).
  int64_t train_batch_size = 8;  // prompts per step
  // data.gen_batch_size: prompts per generation batch (what the source gives
  // per next_batch); 0 = train_batch_size. Without filter_groups a step trains
  // on the whole generation batch, as verl's.
  int64_t gen_batch_size = 0;
  // algorithm.filter_groups.*: DAPO dynamic sampling (rl/dynamic_sampling.h).
  FilterGroupsOptions filter_groups;
  // trainer.total_epochs: dynamic sampling ends the run when the source enters
  // this epoch (verl's loops over the data run out); 0 = no bound.
  int64_t total_epochs = 0;
  int64_t n = 4;                 // responses per prompt
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  int64_t response_length = 64;
  int64_t max_prompt_length = 512;  // for prompt_length/clip_ratio
  uint64_t rollout_seed = 0;
  rollout::EngineConfig engine;
  // Validation (actor_rollout_ref.rollout.val_kwargs.*).
  int64_t val_n = 1;
  double val_temperature = 0.0;  // 0 = greedy
  int64_t val_top_k = -1;
  double val_top_p = 1.0;
  // MoE router replay (actor_rollout_ref.{actor,ref}.router_replay.mode; RolloutBatch::routed_experts).
  // R3 (actor or ref) needs the rollout to record its routing: engine.record_routing
  // (rollout.enable_rollout_routing_replay). The reference takes Disabled or R3.
  RouterReplay actor_router_replay = RouterReplay::Disabled;
  RouterReplay ref_router_replay = RouterReplay::Disabled;
  // Actor update (actor_rollout_ref.actor.*).
  int64_t ppo_mini_batch_size = 8;  // prompts; x n sequences
  int64_t ppo_epochs = 1;
  bool shuffle = false;
  uint64_t data_loader_seed = 42;
  int64_t micro_batch_size = 0;    // sequences per micro-batch (0 = whole mini-batch)
  int64_t max_token_len = 0;       // > 0: dynamic micro-batches by token budget
  int64_t log_prob_max_token_len = 16384;  // budget of old/ref log-prob forwards
  // Sequences per micro-batch of the old/ref log-prob forwards
  // (actor_rollout_ref.{actor,ref,rollout}.log_prob_micro_batch_size_per_gpu);
  // > 0 takes precedence over the token budget, 0 = by log_prob_max_token_len only.
  int64_t log_prob_micro_batch_size = 0;
  // actor_rollout_ref.actor.use_prefix_grouper: the samples of a prompt in a
  // micro-batch share one copy of it (rl::pack_rollout_sequences), in the
  // actor update, the old/ref log-probs and the critic.
  bool share_prompts = true;
  PolicyLossConfig loss;           // agg.mode set; denominators filled per mini-batch
  double loss_scale_factor = 0;    // seq-mean-token-sum-norm divisor; 0 = response_length
  AdvEstimator adv_estimator = AdvEstimator::GRPO;
  bool norm_adv_by_std_in_grpo = true;
  double gamma = 1.0, lam = 1.0;
  // KL in the reward (algorithm.use_kl_in_reward, kl_penalty, kl_ctrl.*):
  // token rewards -= beta * kl(old, ref), beta from the controller.
  bool use_kl_in_reward = false;
  std::string kl_penalty = "kl";
  KlController kl_ctrl;
  // algorithm.rollout_correction.* with rollout.calculate_log_probs (active):
  // decoupled mode recomputes the old log-probs every step and, over the whole
  // batch (every rank holds all of it), derives the IS weights, the rejection
  // mask and the rollout_corr/ metrics before the advantages; bypass mode takes
  // the rollout's log-probs as the old ones and corrects inside the loss.
  RolloutCorrectionConfig rollout_corr;
  // Asynchronous rollout (rl/async_rollout.h): async_training.staleness_threshold
  // (the rollout runs up to ceil(t) versions ahead; 0 = synchronous) and
  // algorithm.partial_rollout_max_split (1 = off).
  double staleness_threshold = 0;
  int64_t partial_max_split = 1;
  // async_training.use_rollout_log_probs: the rollout's log-probs are the old
  // log-probs (no recompute), as verl's fully-async trainer by default.
  bool use_rollout_log_probs = false;
  // reward_model.launch_reward_fn_async: rewards scored on a background
  // thread (rl/reward_stream.h), each response as soon as it finishes
  // generating, the rest while the old/ref log-probs run; scores unchanged.
  bool launch_reward_fn_async = false;
  // async_training.stream_log_probs (Kestrel): disaggregated, the trainer
  // scores each group's reference log-probs (and, at staleness 0 without
  // partial rollout, its old log-probs) as soon as its responses are in,
  // while the rollout ranks go on generating (its cores are idle then).
  bool stream_log_probs = false;
  // Disaggregated placement (rl/disaggregated.h): this process is the
  // trainer (parallel.world its own ranks) and these world ranks of `job` generate.
  std::optional<DisaggregatedLayout> disaggregated;
  std::shared_ptr<comm::ProcessGroup> job;  // the whole mpirun job (disaggregated only)
  int64_t critic_warmup = 0;       // trainer.critic_warmup: steps before the actor is updated
  // trainer.balance_batch: under dp > 1 each rank trains a Karmarkar-Karp
  // partition of the sequences with balanced token counts (parallel/balance.h)
  // instead of its contiguous share of the prompts.
  bool balance_batch = true;
  optim::AdamWConfig adamw;
  optim::LrScheduleConfig lr;      // total_steps filled from total_steps when 0
  double clip_grad = 1.0;          // <= 0: no clipping
  bool reuse_fp32_param = false;   // the actor's train::EngineOptions::reuse_fp32_param
  int64_t optimizer_offload_pieces = 0;  // the actor's train::EngineOptions::optimizer_offload_pieces
  bool actor_param_offload = false;  // ActorOptions::param_offload
  bool actor_grad_offload = false;   // ActorOptions::grad_offload
  bool ref_param_offload = false;    // RefWorker's param_offload
  int64_t max_consecutive_skipped_steps = 10;  // the actor's NaN/Inf guard (train::EngineOptions); 0 = never
  // Trainer (trainer.*).
  int64_t total_steps = 1;
  double time_budget_s = 0;  // trainer.time_budget_s: > 0 stops early (validated, saved) to stay within it
  int64_t save_freq = -1;
  int64_t test_freq = -1;
  bool val_before_train = true;
  int64_t max_ckpt_to_keep = 0;
  std::string ckpt_root;
  std::string resume_mode = "auto";
  std::string resume_from_path;
  bool progress = true;
  std::string resolved_config_yaml;
  std::map<std::string, std::string> model_extra_files;  // tokenizer files saved with the weights
  RlParallel parallel;
};

// Each worker's options, cut out of RlOptions (the critic's, CriticOptions,
// come with its Critic).
struct RlWorkerOptions {
  ActorOptions actor;
  LogProbOptions ref;
  RolloutOptions rollout;
};
// `opt.lr.total_steps` must be resolved (> 0).
RlWorkerOptions split_options(const RlOptions& opt);
// The rollout schedule's options (a colocated trainer's, and a disaggregated rollout rank's).
AsyncRolloutOptions async_rollout_options(const RlOptions& opt);

class RlTrainer {
 public:
  // `ref` (may be null): frozen reference policy, needed when loss.use_kl_loss
  // or use_kl_in_reward. `critic` (may be null): the value model, needed by
  // adv_estimator gae. `decode`: response ids -> text for the reward (special
  // tokens skipped).
  RlTrainer(model::CausalLM& actor, std::unique_ptr<model::CausalLM> ref, std::vector<RlPrompt> train,
            std::vector<RlPrompt> val, std::unique_ptr<train::BatchSource> source, RewardManager& rewards,
            std::function<std::string(const std::vector<int32_t>&)> decode, RlOptions opt,
            train::MetricsLogger* logger, std::unique_ptr<Critic> critic = nullptr);
  ~RlTrainer();

  // Resumes per resume_mode, validates before training when asked, runs to
  // total_steps with periodic validation and checkpoints.
  Status fit();
  // One RL step (generate, reward, log-probs, advantages, update); its metrics.
  std::map<std::string, double> train_step();
  // Generation on the validation prompts; val-core/<data_source>/acc/mean@N ...
  std::map<std::string, double> validate();

  Status save_checkpoint();
  Status load_checkpoint(const std::string& dir);

  // An in-process reward function used instead of the RewardManager (tests,
  // embedding programs); score of one response.
  void set_reward_function(std::function<double(const RewardRequest&)> fn) { reward_->set_function(std::move(fn)); }

  int64_t global_step() const { return step_; }
  // The step fit() started from: > 0 when it resumed from a checkpoint.
  int64_t fit_start_step() const { return fit_start_step_; }
  // Metrics of the first and the latest validation (for the CLI summary).
  const std::map<std::string, double>& first_validation() const { return first_val_; }
  const std::map<std::string, double>& last_validation() const { return last_val_; }

  // The actor's weight version (optimizer steps applied) and the version the
  // rollout's weight view holds (in place: always the actor's; a copy: its
  // latest sync, behind between an update and the next sync). generate()
  // tags its batch with the latter.
  int64_t actor_weight_version() const { return actor_->weight_version(); }
  int64_t rollout_weight_version() const { return rollout_ ? rollout_->version() : remote_version_; }
  // The sample store between the rollout and the trainer (null with dynamic sampling).
  const SampleStore* sample_store() const { return async_ ? &async_->store() : nullptr; }

  // Pieces of a step, public for tests.
  RolloutBatch generate(const std::vector<int64_t>& prompt_idx);
  // extra (may be null): each response's reward_extra_info, filled on world rank 0.
  void compute_rewards(RolloutBatch& b, const std::vector<int64_t>& prompt_idx, std::map<std::string, double>& m,
                       std::vector<nlohmann::ordered_json>* extra = nullptr);
  // DAPO dynamic sampling (dynamic_sampling.cpp): generation batches until
  // train_batch_size groups with spread are kept, scored (and with the
  // in-reward KL applied); false when the data ran out (total_epochs).
  bool generate_filtered(RolloutBatch& out, std::map<std::string, double>& m);
  void compute_log_probs(RolloutBatch& b, bool old, bool ref);
  // verl's apply_kl_penalty: token rewards -= beta * kl(old_logp, ref_logp);
  // metrics actor/reward_kl_penalty{,_coeff}; then the controller updates.
  void apply_kl_penalty(RolloutBatch& b, std::map<std::string, double>& m);
  // values: critic values per response token (GAE), or nullptr.
  void compute_advantage(RolloutBatch& b, const std::vector<double>* values = nullptr);
  // Decoupled rollout correction (verl's compute_rollout_correction_and_add_to_batch) on the whole batch:
  // b.rollout_is_weights, b.response_mask (rejection), rollout_corr/ metrics into m. Needs b.old_logp.
  void apply_rollout_correction(RolloutBatch& b, std::map<std::string, double>& m) const;
  std::map<std::string, double> update_actor(const RolloutBatch& b);

 private:
  bool is_world_leader() const { return opt_.parallel.world->rank() == 0; }
  // The training prompts of a step, by index within the step.
  std::vector<std::vector<int32_t>> prompt_ids(const std::vector<int64_t>& prompt_idx) const;
  // A response's reward request (its prompt's data source, ground truth and extra info; the decoded text).
  RewardRequest reward_request(int64_t prompt, const std::vector<int32_t>& response) const;
  // launch_reward_fn_async: a response the rollout just finished, queued for
  // scoring (per-response managers; a batch-wise one waits for submit_rewards).
  void stream_response(int64_t stream, int64_t prompt, int64_t sample, const std::vector<int32_t>& response);
  // stream_log_probs: a finished response into its group; a whole group's log-probs scored now.
  void stream_logp_response(int64_t stream, int64_t prompt, int64_t sample, const std::vector<int32_t>& response);
  // Whether old log-probs may be scored as groups come in: staleness 0 without partial rollout (the groups
  // received while the trainer waits for step j's batch are step j's, and the actor is at version j) and
  // needed whatever the batch (several mini-batches or epochs, in-reward KL, decoupled rollout correction).
  bool stream_old_log_probs() const;
  // b's reference (old: old) log-probs: the streamed ones where its responses were scored as they came in
  // (group_streams: the stream position of each of b's groups), the rest scored now. Returns the share
  // streamed; forgets what b trains and what is older.
  double fill_log_probs(RolloutBatch& b, const std::vector<int64_t>& group_streams, bool old);
  // launch_reward_fn_async: queues the rewards of `groups` not yet submitted
  // (world rank 0); returns the batch's keys, in batch order.
  // reward/streamed_fraction (Kestrel) into m: the share scored from the moment it finished.
  std::vector<RewardStream::Key> submit_rewards(const std::vector<StoredGroup>& groups,
                                                std::map<std::string, double>& m);
  // ... then waits for them and publishes them into b (collective over the world).
  void take_rewards(RolloutBatch& b, const std::vector<RewardStream::Key>& keys, std::map<std::string, double>& m);
  // verl's compute_data_metrics (scores, rewards, advantages, returns,
  // lengths) and the step's throughput.
  void add_data_metrics(const RolloutBatch& b, double step_seconds, std::map<std::string, double>& m) const;

  std::vector<RlPrompt> train_, val_;
  std::unique_ptr<train::BatchSource> source_;
  std::function<std::string(const std::vector<int32_t>&)> decode_;
  RlOptions opt_;
  train::MetricsLogger* logger_;
  // The workers (ref_ and critic_ may be null). The rollout worker is built
  // last: its view reads the actor's parameters where the engine placed them.
  std::unique_ptr<ActorWorker> actor_;
  std::unique_ptr<RefWorker> ref_;
  std::unique_ptr<CriticWorker> critic_;
  std::unique_ptr<RewardWorker> reward_;
  // launch_reward_fn_async, on world rank 0 (where rewards are scored); after
  // reward_, so its worker thread stops before the reward worker goes.
  std::unique_ptr<RewardStream> stream_;
  // stream_log_probs: responses of groups not yet whole (by stream
  // position: prompt, responses by sample), and each scored response's
  // reference [0] and old [1] log-probs by (stream position, sample).
  struct PartialGroup {
    int64_t prompt = -1;
    std::vector<std::optional<std::vector<int32_t>>> responses;
  };
  std::map<int64_t, PartialGroup> logp_pending_;
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> logp_streamed_[2];
  std::unique_ptr<RolloutWorker> rollout_;
  // The prompt stream, the sample store and the schedule of generation
  // (null with dynamic sampling, which draws and filters its own batches).
  std::unique_ptr<AsyncRollout> async_;
  // Disaggregated: the rollout ranks' end of the channel, on the trainer leader (rollout_ and async_ are null).
  std::unique_ptr<RemoteRollout> remote_;
  int64_t remote_version_ = 0;  // the actor weight version last published to them
  bool direct_rollout_ = false;  // TEST ONLY: KESTREL_TEST_DIRECT_ROLLOUT (trainer.cpp)
  nlohmann::json resume_state_;  // the rollout's state from the checkpoint resumed (disaggregated)
  void start_remote_rollout();
  // Disaggregated: step_'s groups, received by the trainer leader and passed to the other trainer ranks.
  std::vector<StoredGroup> receive_remote_batch(std::map<std::string, double>& m);
  bool disaggregated_ = false;  // rollout ranks generate (remote_ is set on the trainer leader only)
  int64_t step_ = 0;
  int64_t fit_start_step_ = 0;
  bool data_exhausted_ = false;  // dynamic sampling used up trainer.total_epochs
  std::map<std::string, double> first_val_, last_val_;
};

// maj@N of one prompt (verl's calc_maj_val): the answer ("pred") most of its
// samples gave, the first seen among ties, scores as its first sample did.
double majority_vote_accuracy(const std::vector<std::pair<std::string, double>>& samples);

}  // namespace kestrel::rl
