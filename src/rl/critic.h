// The PPO critic (verl's critic worker, algorithm.adv_estimator=gae): a value
// model (model::CausalLM with ModelOptions::value_head: the policy's backbone
// and a [1, D] score head) trained by its own train::TrainingEngine (AdamW,
// learning-rate schedule, gradient clipping, data parallelism) with verl's
// clipped value loss
//   0.5 * agg(max((v - G)^2, (clip(v, v_old - c, v_old + c) - G)^2))
// over ppo_mini_batch_size mini-batches x ppo_epochs, micro-batched with the
// mini-batch's global denominators (so the update does not depend on the
// split), exactly as the actor update (rl/workers/actor_worker.cpp). The
// driver reaches it through rl::CriticWorker (rl/workers/critic_worker.h).
//
// Under mpirun (use_parallel) each dp rank computes the values of its share
// of the sequences (rl::dp_share, as the actor's log-probs) and every rank
// then holds all of them; the update trains each rank's share with the
// mini-batch denominators summed over dp and the gradients summed, so it
// equals one process's update. Tensor parallelism comes with the model (its
// tp group; the value head is replicated, the values are full on every rank).
//
// The value of response token j is the model's output at the packed row that
// predicts it (prompt length P: row P - 1 + j), i.e. the value of the state
// before the token, as verl's values[:, -response_length - 1 : -1].
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "rl/distributed.h"
#include "rl/policy_loss.h"
#include "rl/rollout_batch.h"
#include "train/engine.h"

namespace kestrel::rl {

struct CriticOptions {
  int64_t ppo_mini_batch_size = 8;  // critic.ppo_mini_batch_size, in prompts (x n sequences)
  int64_t n = 1;                    // actor_rollout_ref.rollout.n
  int64_t ppo_epochs = 1;           // critic.ppo_epochs
  bool shuffle = false;             // critic.shuffle (verl: actor's)
  uint64_t data_loader_seed = 42;   // critic.data_loader_seed
  int64_t micro_batch_size = 0;     // critic.ppo_micro_batch_size_per_gpu; 0 = the whole mini-batch
  int64_t max_token_len = 0;        // > 0: critic.use_dynamic_bsz with critic.ppo_max_token_len_per_gpu
  int64_t forward_max_token_len = 16384;  // critic.forward_max_token_len_per_gpu: values-pass budget
  // Sequences per micro-batch of the values pass (critic.forward_micro_batch_size_per_gpu);
  // > 0 takes precedence over the token budget, 0 = by forward_max_token_len only.
  int64_t forward_micro_batch_size = 0;
  double cliprange_value = 0.5;     // critic.cliprange_value
  AggMode loss_agg_mode = AggMode::TokenMean;  // critic.loss_agg_mode
  double loss_scale_factor = 0;     // seq-mean-token-sum-norm divisor; 0 = response_length
  int64_t response_length = 0;      // data.max_response_length
  optim::AdamWConfig adamw;         // critic.optim.{betas, weight_decay}
  optim::LrScheduleConfig lr;       // critic.optim.lr (verl default 1e-5), warmup, style
  double clip_grad = 1.0;           // critic.optim.clip_grad; <= 0: no clipping
  bool reuse_fp32_param = false;    // train::EngineOptions::reuse_fp32_param
  int64_t optimizer_offload_pieces = 0;  // train::EngineOptions::optimizer_offload_pieces
  // critic.megatron.{param,grad}_offload / critic.model.fsdp_config.param_offload: between the critic's
  // phases its weights / gradients wait in host memory (CausalLM::offload_to_host). CPU: nothing moves.
  bool param_offload = false;
  bool grad_offload = false;
  int64_t max_consecutive_skipped_steps = 10;  // train::EngineOptions: the NaN/Inf guard's abort; 0 = never
  bool share_prompts = false;       // pack a prompt once per micro-batch (pack_rollout_sequences)
  // critic.megatron.use_distributed_optimizer; unset = the process layout's
  // (RlParallel::distributed_optimizer, the actor's setting).
  std::optional<bool> distributed_optimizer;
};

// Sums over the micro-batches of a mini-batch.
struct ValueLossTotals {
  double loss = 0;                 // agg'd with the mini-batch scope: the sum is the mini-batch loss
  double clipfrac_tokens = 0;      // token-weighted
  double vpred_sum = 0, tokens = 0;
};

// One micro-batch `seqs` of `b`: forward, the clipped value loss on its
// response tokens (returns and old_values are flat [N] arrays over b.layout;
// `scope` carries the mini-batch denominators), backward (grads accumulate
// into the critic's Param::grad). Adds to *totals; returns the micro-batch's
// share of the mini-batch loss. share_prompts: pack_rollout_sequences's.
double value_forward_backward(model::CausalLM& critic, const RolloutBatch& b, const std::vector<int64_t>& seqs,
                              const std::vector<double>& returns, const std::vector<double>& old_values,
                              double cliprange_value, const AggScope& scope, ValueLossTotals* totals,
                              bool share_prompts = false);

// Values of every response token of `b` ([N] over b.layout), forward only, in
// packed groups of at most max_tokens tokens.
std::vector<double> compute_values(const model::CausalLM& critic, const RolloutBatch& b, int64_t max_tokens,
                                   bool share_prompts = false);

// The clipped value loss of one packed micro-batch `seqs` of `b` (response
// tokens at packed rows `rows`) as a train::ValueObjective: reads values
// [T, 1], fills dvalues [T, 1] (0 on prompt rows), adds to *totals (may be null).
train::ValueObjective value_objective(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                      const std::vector<int64_t>& rows, const std::vector<double>& returns,
                                      const std::vector<double>& old_values, double cliprange_value,
                                      const AggScope& scope, ValueLossTotals* totals);

// verl's compute_data_metrics critic entries: critic/values/{mean,max,min}
// and critic/vf_explained_var = 1 - Var(G - V) / (Var(G) + 1e-5) (unbiased
// variances, as torch.var; omitted below two tokens).
std::map<std::string, double> critic_data_metrics(const std::vector<double>& values, const std::vector<double>& returns);

class Critic {
 public:
  // `model` must be a value model (ModelOptions::value_head); its tp group
  // (ModelOptions::parallel) is the critic's tensor parallelism. `parallel`:
  // the dp group and distributed optimizer (size-1 groups = one process).
  Critic(std::unique_ptr<model::CausalLM> model, CriticOptions opt, RlParallel parallel = {},
         bool balance_batch = true);
  ~Critic();

  // Rebuilds the training engine over `parallel` (the trainer hands its own
  // layout over: the critic then trains over the actor's dp group). Only
  // before the first update. balance_batch: rl::dp_share's.
  void use_parallel(RlParallel parallel, bool balance_batch);

  model::CausalLM& model() { return *model_; }
  // The end of a critic phase (values, update): with param_offload / grad_offload the weights /
  // gradients go to host memory until the next phase's first forward brings them back.
  void release_device_memory() const;
  const CriticOptions& options() const { return opt_; }
  const optim::AdamW& optimizer() const { return engine_->optimizer(); }
  const train::TrainingEngine& engine() const { return *engine_; }

  // verl's compute_values: [N] per response token over b.layout (every rank
  // all of them; collective over the dp group).
  std::vector<double> values(const RolloutBatch& b) const;

  // verl's update_critic at global step `step` (the lr schedule's step):
  // returns / old_values are [N] over b.layout (old_values: values() before
  // this update). Metrics critic/vf_loss, critic/vf_clipfrac,
  // critic/vpred_mean, critic/grad_norm, critic/lr (loss and grad norm
  // averaged over the optimizer steps, fractions and means token-weighted).
  std::map<std::string, double> update(const RolloutBatch& b, const std::vector<double>& returns,
                                       const std::vector<double>& old_values, int64_t step);

  // A checkpoint's critic folder (verl: global_step_N/critic/):
  //   model/                    HF <Arch>ForTokenClassification folder (config.json + safetensors),
  //                             one folder of the whole model whatever the layout (model/pipeline_save.h)
  //   optimizer_pp{s}.safetensors  AdamW state of pipeline stage s by parameter name, full HF shapes, plus
  //                             f32 masters in bf16 mode (train/optimizer_checkpoint.h)
  // Collective under mpirun.
  Status save(const std::string& dir) const;
  // Restores both into this critic, in any process layout (same model shape).
  Status load(const std::string& dir);

 private:
  std::vector<int64_t> share(const RolloutBatch& b) const;  // this dp rank's sequences

  std::unique_ptr<model::CausalLM> model_;
  CriticOptions opt_;
  RlParallel parallel_;
  bool balance_batch_ = true;
  std::unique_ptr<train::TrainingEngine> engine_;
};

}  // namespace kestrel::rl
