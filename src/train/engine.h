// The training engine: one optimizer step of one model, written once for SFT,
// the RL actor and the PPO critic.
//
// A TrainingEngine owns, for one model::CausalLM (whose parameters it trains):
//   - the AdamW state (optim::AdamW; f32 masters of bf16/f16 weights),
//   - the learning-rate schedule (optim::LrSchedule),
//   - data parallelism (parallel::DataParallel: gradients summed or averaged
//     over the dp group, optionally the distributed optimizer, ZeRO-1),
//   - gradient clipping (optim::clip_grad_norm, or DataParallel's over dp and tp),
//   - the micro-batch loop of a mini-batch (gradient accumulation), where a
//     pipeline schedule will later take its place,
//   - optimizer-state save/load (optim/checkpoint_io.h's file format).
//
// Parallelism enters only through EngineParallel. With a dp group of size 1 and
// a model whose tp group has size 1, the engine takes the plain
// single-process path (no DataParallel: Param::grad accumulates in place,
// clip_grad_norm over the AdamW slots, full f32 masters), bit for bit the path
// the trainers took before the engine existed. Otherwise (dp > 1 or tp > 1)
// the gradients live in DataParallel's flat buffer; the optimizer steps the
// owned range and gather_params() redistributes it.
//
// The objective of a micro-batch is a loss on the model's outputs, never a
// forward/backward of its own: the engine runs forward and backward (so a
// pipeline schedule can interleave them). Token models take a TokenObjective
// (next-token logprobs and entropies, train/token_objective.h), value models
// (ModelOptions::value_head) a ValueObjective on their [T, 1] values.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "train/token_objective.h"

namespace kestrel::parallel {
class DataParallel;
}

namespace kestrel::train {

struct EngineParallel {
  // The data-parallel group (nullptr = a size-1 group). Each dp rank trains
  // its share of a mini-batch; gradients are summed over it (the objectives
  // carry the mini-batch denominators summed over dp), or averaged with
  // average_grads.
  std::shared_ptr<comm::ProcessGroup> dp;
  bool distributed_optimizer = false;  // megatron.use_distributed_optimizer (ZeRO-1 over dp)
  bool average_grads = false;          // DataParallel's 1/dp pre-scaling
};

struct EngineOptions {
  optim::AdamWConfig adamw;
  optim::LrScheduleConfig lr;  // total_steps must be resolved (> 0) by the caller
  double clip_grad = 1.0;      // <= 0: measure the norm, no clipping
  EngineParallel parallel;
};

// One micro-batch as the engine trains or scores it: packed sequences (no
// padding). `rows` and `seqs` are the caller's bookkeeping for its objective
// (e.g. the packed rows of response tokens and the sequences of a rollout batch).
struct MicroBatch {
  model::PackedBatch batch;
  std::vector<int64_t> seqs;
  std::vector<int64_t> rows;
};

// A loss on a value model's outputs: values [T, 1] in the compute dtype (the
// forward's result, the full values on every tp rank); fills dvalues, f32
// [T, 1] zeroed on entry (the same on every tp rank); returns the micro-batch's
// share of the mini-batch loss.
using ValueObjective = std::function<double(const Tensor& values, Tensor& dvalues)>;

// The objective of one micro-batch: exactly one of tokens / values is set,
// matching the model kind.
struct Objective {
  TokenObjective tokens;
  bool need_entropy_grad = true;  // tokens only: false skips the entropy backward
  ValueObjective values;
};
// Builds micro-batch `index`'s objective (called right before its forward).
using ObjectiveFn = std::function<Objective(const MicroBatch& mb, size_t index)>;

struct MiniBatchResult {
  double loss = 0;        // sum of the micro-batch objectives' values (this rank's share)
  double grad_norm = 0;   // the global pre-clip L2 norm (over dp and tp)
  bool finite = true;     // false: non-finite norm, the optimizer step was skipped
  int64_t micro_batches = 0;
};

class TrainingEngine {
 public:
  // Enables the model's gradients and builds the optimizer (and, under dp > 1
  // or tp > 1, DataParallel, which re-points Param::grad — and, with the
  // distributed optimizer, the weights — into its flat buffers).
  TrainingEngine(model::CausalLM& model, EngineOptions opt);
  ~TrainingEngine();
  TrainingEngine(const TrainingEngine&) = delete;
  TrainingEngine& operator=(const TrainingEngine&) = delete;

  model::CausalLM& model() { return model_; }
  const model::CausalLM& model() const { return model_; }
  const EngineOptions& options() const { return opt_; }
  const optim::AdamW& optimizer() const { return *optim_; }
  optim::AdamW& optimizer() { return *optim_; }
  // nullptr on the single-process path.
  parallel::DataParallel* data_parallel() const { return dp_.get(); }
  comm::ProcessGroup& dp_group() const { return *dp_group_; }
  // True when the engine runs with DataParallel (dp > 1 or tp > 1).
  bool distributed() const { return dp_ != nullptr; }

  // The version of the model's weights: the optimizer steps applied so far
  // (a skipped step leaves it; restored by load_optimizer). Data generated
  // from these weights (a rollout) carries it, so a consumer can tell
  // on-policy data from data of older weights.
  int64_t weight_version() const { return optim_->step_count(); }

  // The schedule's learning rate at optimizer-step index `step` (0-based).
  double lr(int64_t step) const;

  // One optimizer step: zero the gradients, forward + backward of every
  // micro-batch with objective(mb, i) (gradients accumulate), reduce over dp,
  // clip, and step AdamW at `lr` when the norm is finite. An empty `micro` is
  // a step on zero gradients of this rank (other dp ranks may contribute).
  // Collective over the dp group (and the model's tp group).
  MiniBatchResult train_mini_batch(const std::vector<MicroBatch>& micro, const ObjectiveFn& objective, double lr);

  // Forward only over `micro` (no gradients); consume(i, out) receives
  // micro-batch i's output: f32 [T] next-token logprobs for a token model
  // (model::score_tokens), [T, 1] values in the compute dtype for a value model.
  void score(const std::vector<MicroBatch>& micro, const std::function<void(size_t, const Tensor&)>& consume) const;

  // Optimizer state (exp_avg, exp_avg_sq, step, f32 masters) as one
  // .safetensors file (optim::save_optimizer_state); under dp/tp each rank
  // writes its own file (optimizer_file_name()). Load restores it and, with
  // the distributed optimizer, re-gathers the parameters.
  Status save_optimizer(const std::string& path) const;
  Status load_optimizer(const std::string& path);
  // "optimizer.safetensors" on the single-process path, else
  // "optimizer_tp{t}_dp{d}.safetensors" (this rank's tp and dp ranks).
  std::string optimizer_file_name() const;

 private:
  void zero_grads();
  optim::ClipResult reduce_and_clip();

  model::CausalLM& model_;
  EngineOptions opt_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<optim::AdamW> optim_;
  std::unique_ptr<optim::LrSchedule> sched_;
};

// score() for any model (e.g. a frozen reference policy that has no engine).
void score_micro_batches(const model::CausalLM& model, const std::vector<MicroBatch>& micro,
                         const std::function<void(size_t, const Tensor&)>& consume);

}  // namespace kestrel::train
