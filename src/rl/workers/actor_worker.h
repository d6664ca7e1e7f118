// The actor worker (verl's ActorRolloutRefWorker, actor role): the policy
// model trained by its train::TrainingEngine. It scores old log-probs and
// runs the PPO update of a rollout batch: ppo_mini_batch_size mini-batches x
// ppo_epochs, micro-batched with the mini-batch's global denominators (summed
// over dp), the loss on response tokens only (prompt rows carry no weight).
//
// Its weight version (TrainingEngine::weight_version: optimizer steps
// applied) is what a rollout view follows (rl::RolloutWeightView).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "rl/distributed.h"
#include "rl/policy_loss.h"
#include "rl/rollout_batch.h"
#include "rl/workers/log_probs.h"
#include "train/engine.h"

namespace kestrel::rl {

struct ActorOptions {
  int64_t n = 4;                    // rollout.n: sequences per prompt
  int64_t response_length = 64;     // data.max_response_length (the default loss_scale_factor)
  int64_t ppo_mini_batch_size = 8;  // prompts; x n sequences
  int64_t ppo_epochs = 1;
  bool shuffle = false;
  uint64_t data_loader_seed = 42;
  int64_t micro_batch_size = 0;     // sequences per micro-batch (0 = whole mini-batch)
  int64_t max_token_len = 0;        // > 0: dynamic micro-batches by token budget
  bool share_prompts = true;        // actor.use_prefix_grouper
  bool balance_batch = true;        // trainer.balance_batch (rl::dp_share)
  PolicyLossConfig loss;            // agg.mode set; denominators filled per mini-batch
  double loss_scale_factor = 0;     // seq-mean-token-sum-norm divisor; 0 = response_length
  optim::AdamWConfig adamw;
  optim::LrScheduleConfig lr;       // total_steps resolved (> 0)
  double clip_grad = 1.0;           // <= 0: no clipping
  bool reuse_fp32_param = false;    // train::EngineOptions::reuse_fp32_param
  int64_t optimizer_offload_pieces = 0;  // train::EngineOptions::optimizer_offload_pieces
  // param_offload / grad_offload (megatron.* or fsdp_config.*): between its
  // phases the actor's weights / gradients wait in host memory
  // (CausalLM::offload_to_host) and come back on first use. A model on the CPU ignores them.
  bool param_offload = false;
  bool grad_offload = false;
  int64_t max_consecutive_skipped_steps = 10;  // train::EngineOptions: the NaN/Inf guard's abort; 0 = never
  LogProbOptions log_prob;          // the old log-prob pass
  // algorithm.rollout_correction.* (rl/rollout_correction.h). Active: the loss
  // reads the batch's IS weights and rejection mask (decoupled) or computes
  // them per micro-batch (bypass); rollout_corr/ metrics are averaged over the
  // micro-batches of every rank, and every sequence is trained (no zero-advantage
  // skipping), so the metrics cover the batch as verl's actor's do.
  RolloutCorrectionConfig rollout_corr;
  // MoE router replay (actor.router_replay.mode): R2 records the old-log-prob pass's routing
  // (compute_log_probs) and replays it in the update; R3 replays the rollout's in both (log_prob.router_replay
  // R3 too). A dense model ignores it.
  RouterReplay router_replay = RouterReplay::Disabled;
};

class ActorWorker {
 public:
  // `model` must outlive the worker. parallel: the dp group and distributed
  // optimizer (size-1 groups = one process).
  ActorWorker(model::CausalLM& model, ActorOptions opt, const RlParallel& parallel);

  model::CausalLM& model() { return model_; }
  const model::CausalLM& model() const { return model_; }
  train::TrainingEngine& engine() { return *engine_; }
  const train::TrainingEngine& engine() const { return *engine_; }
  const ActorOptions& options() const { return opt_; }
  int64_t weight_version() const { return engine_->weight_version(); }
  // The end of an actor phase (its own scoring and update call it; the
  // trainer after generation, which reads the weights in place): with
  // param_offload / grad_offload the weights / gradients go to host memory
  // until the next phase brings them back. Otherwise nothing.
  void release_device_memory() const;

  // b.old_logp: the current weights' log-probs of b's response tokens
  // (collective over dp). Router replay R2 (a MoE model): b.routed_experts becomes the routing this pass
  // used (routing_source R2), which the update replays; R3 replays the rollout's (b must hold it).
  void compute_log_probs(RolloutBatch& b) const;

  // The PPO update at global step `step` (the lr schedule's and the shuffle's
  // step). Metrics actor/{pg_loss, grad_norm, lr, num_updates, ...}; a MoE model adds
  // actor/moe_{aux_loss, z_loss, max_load, min_load, dropped_tokens} (train::MoeMetrics). Router replay
  // R3 replays the rollout's routing, R2 the old-log-prob pass's when it ran (else the routers choose).
  std::map<std::string, double> update(const RolloutBatch& b, int64_t step);

  // Tests: record the routing of the update's training forwards. update_routing()[i] is then sequence i's
  // routing in the last forward that trained it during the latest update() (RolloutBatch::routed_experts's
  // layout; empty for a sequence this dp rank did not train).
  void record_update_routing(bool on) { record_update_ = on; }
  const std::vector<std::vector<int32_t>>& update_routing() const { return update_routing_; }

  // A checkpoint's actor folder (verl: global_step_N/actor/): model/ (one HF
  // folder of the whole model: gathered over tp, streamed from the pipeline
  // stages) and optimizer_pp{s}.safetensors per stage (the full HF-shaped
  // state by name, train/optimizer_checkpoint.h). Collective under mpirun.
  Status save(const std::string& dir) const;
  // Restores both, in any (tp, pp, dp, distributed optimizer) layout (same
  // model shape). `context`: the checkpoint folder, for messages.
  Status load(const std::string& dir, const std::string& context);

 private:
  model::CausalLM& model_;
  ActorOptions opt_;
  RlParallel parallel_;
  std::unique_ptr<train::TrainingEngine> engine_;
  bool record_update_ = false;
  std::vector<std::vector<int32_t>> update_routing_;
};

}  // namespace kestrel::rl
