// The PPO critic (verl's critic worker, algorithm.adv_estimator=gae): a value
// model (model::CausalLM with ModelOptions::value_head: the policy's backbone
// and a [1, D] score head) with its own AdamW, learning-rate schedule and
// gradient clipping, trained with verl's clipped value loss
//   0.5 * agg(max((v - G)^2, (clip(v, v_old - c, v_old + c) - G)^2))
// over ppo_mini_batch_size mini-batches x ppo_epochs, micro-batched with the
// mini-batch's global denominators (so the update does not depend on the
// split), exactly as the actor update of rl/trainer.cpp.
//
// The value of response token j is the model's output at the packed row that
// predicts it (prompt length P: row P - 1 + j), i.e. the value of the state
// before the token, as verl's values[:, -response_length - 1 : -1].
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "rl/policy_loss.h"
#include "rl/rollout_batch.h"

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
  double cliprange_value = 0.5;     // critic.cliprange_value
  AggMode loss_agg_mode = AggMode::TokenMean;  // critic.loss_agg_mode
  double loss_scale_factor = 0;     // seq-mean-token-sum-norm divisor; 0 = response_length
  int64_t response_length = 0;      // data.max_response_length
  optim::AdamWConfig adamw;         // critic.optim.{betas, weight_decay}
  optim::LrScheduleConfig lr;       // critic.optim.lr (verl default 1e-5), warmup, style
  double clip_grad = 1.0;           // critic.optim.clip_grad; <= 0: no clipping
  bool share_prompts = false;       // pack a prompt once per micro-batch (pack_rollout_sequences)
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

// verl's compute_data_metrics critic entries: critic/values/{mean,max,min}
// and critic/vf_explained_var = 1 - Var(G - V) / (Var(G) + 1e-5) (unbiased
// variances, as torch.var; omitted below two tokens).
std::map<std::string, double> critic_data_metrics(const std::vector<double>& values, const std::vector<double>& returns);

class Critic {
 public:
  // `model` must be a value model (ModelOptions::value_head).
  Critic(std::unique_ptr<model::CausalLM> model, CriticOptions opt);
  ~Critic();

  model::CausalLM& model() { return *model_; }
  const CriticOptions& options() const { return opt_; }
  const optim::AdamW& optimizer() const { return *optim_; }

  // verl's compute_values: [N] per response token over b.layout.
  std::vector<double> values(const RolloutBatch& b) const;

  // verl's update_critic at global step `step` (the lr schedule's step):
  // returns / old_values are [N] over b.layout (old_values: values() before
  // this update). Metrics critic/vf_loss, critic/vf_clipfrac,
  // critic/vpred_mean, critic/grad_norm, critic/lr (loss and grad norm
  // averaged over the optimizer steps, fractions and means token-weighted).
  std::map<std::string, double> update(const RolloutBatch& b, const std::vector<double>& returns,
                                       const std::vector<double>& old_values, int64_t step);

  // A checkpoint's critic folder (verl: global_step_N/critic/):
  //   model/                    HF <Arch>ForTokenClassification folder (config.json + safetensors)
  //   optimizer.safetensors     AdamW state, plus f32 master weights ("master.<name>") in bf16 mode
  Status save(const std::string& dir) const;
  // Restores both into this critic (same model shape and optimizer layout).
  Status load(const std::string& dir);

 private:
  std::unique_ptr<model::CausalLM> model_;
  CriticOptions opt_;
  std::unique_ptr<optim::AdamW> optim_;
  std::unique_ptr<optim::LrSchedule> sched_;
};

}  // namespace kestrel::rl
