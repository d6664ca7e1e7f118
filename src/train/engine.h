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
//
// NaN/Inf guard (Megatron's skipped iteration). An update whose loss (on any
// dp/tp rank: a flag is reduced) or global gradient norm (already reduced
// over dp and tp) is not finite is skipped identically on every rank: no
// AdamW step, so the optimizer's step count (bias corrections) and
// weight_version() stay, as Megatron's optimizer.step() returns
// update_successful=false and training.py then does not advance the LR
// scheduler (SFT keeps its schedule on applied updates: lr(weight_version());
// the RL workers keep verl's once-per-RL-step schedule); the gradients are
// zeroed; MiniBatchResult says what was not finite, the trainers log it as
// */step_skipped. After max_consecutive_skipped_steps skips in a row the
// engine throws, naming the step and the quantity. A non-finite learning rate
// is an error at once (a config value, not a transient). The counts are saved
// with the optimizer state, so a resumed run skips and aborts where an
// uninterrupted one would. save_optimizer() refuses (an error naming the
// tensor) to write a state or model weights holding a NaN/Inf.
//
// Test-only fault injection (never set in production): EngineOptions::
// test_inject_nan_grad (a C++ hook for unit tests), or the environment
// variable KESTREL_TEST_INJECT_NAN_GRAD for CLI tests: "N[,M,...]" or "A-B"
// (1-based update numbers of this engine: applied + skipped updates so far,
// + 1), optionally prefixed "actor:", "critic:" or "sft:" to pick one engine
// by EngineOptions::name. The chosen update gets a NaN in the first gradient
// element of this rank after the backward, before the dp reduction.
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
#include "train/pipeline.h"
#include "train/token_objective.h"

namespace kestrel::parallel {
class DataParallel;
struct DpParam;
}

namespace kestrel::train {

struct EngineParallel {
  // The data-parallel group (nullptr = a size-1 group). Each dp rank trains
  // its share of a mini-batch; gradients are summed over it (the objectives
  // carry the mini-batch denominators summed over dp), or averaged with
  // average_grads. Under context parallelism (the model's ModelParallel::cp)
  // this is Megatron's dp-cp group: the cp ranks of a dp slice train the same
  // micro-batches, each its share of every sequence (model/cp_batch.h), so
  // the full gradient is their sum, and the distributed optimizer shards over
  // dp x cp as Megatron's does.
  std::shared_ptr<comm::ProcessGroup> dp;
  bool distributed_optimizer = false;  // megatron.use_distributed_optimizer (ZeRO-1 over dp)
  bool average_grads = false;          // DataParallel's 1/dp pre-scaling
  // Expert parallelism (the model's ModelParallel::ep): Megatron's
  // expert-data-parallel group, the ranks holding the same routed experts
  // (world / (ep x pp) of them); the experts' gradients are summed over it,
  // the dense ones over dp; with the distributed optimizer the experts'
  // AdamW state (and f32 masters) is sharded over it as the dense state is
  // over dp (Megatron's expert DDP). nullptr = a size-1 group.
  std::shared_ptr<comm::ProcessGroup> expert_dp;
};

class TrainingEngine;

struct EngineOptions {
  optim::AdamWConfig adamw;
  optim::LrScheduleConfig lr;  // total_steps must be resolved (> 0) by the caller
  double clip_grad = 1.0;      // <= 0: measure the norm, no clipping
  EngineParallel parallel;
  // MindSpeed's --reuse-fp32-param (...megatron.override_transformer_config.
  // reuse_fp32_param): in bf16 mixed precision the f32 masters are held as the
  // bf16 weights plus a 16-bit residual (optim/adamw.h), 2 bytes per parameter
  // less (2/dp with the distributed optimizer), training bit for bit the same.
  // bf16 weights only: with f32 or f16 weights the engine refuses it, as
  // MindSpeed does ("--reuse-fp32-param only support for `bf16`"; an f32
  // model has no bf16 copy to reuse).
  bool reuse_fp32_param = false;
  // Optimizer state in host memory for a model on a device (optim::AdamW::
  // offload_state): 0 keeps it on the device; 1 is Megatron's / verl's
  // optimizer_offload (streamed in for the step, out after); k > 1 is
  // MindSpeed's swap optimizer with swap_optimizer_times k (the step in k
  // pieces, two on the device at a time: one steps while the next comes in
  // and the last goes out on the transfer queue). bf16 weights' f32 masters go to
  // the host with the state. Bit-identical to 0. No effect for a model on the
  // CPU (host memory already); not with reuse_fp32_param.
  int64_t optimizer_offload_pieces = 0;
  // The NaN/Inf guard: abort after this many consecutive skipped updates
  // (0 = never abort; skips are still counted and logged).
  int64_t max_consecutive_skipped_steps = 10;
  std::string name = "training engine";  // in messages; "actor", "critic", "sft" pick the test hook's engine
  // TEST ONLY: called after the backward of every update with its 1-based
  // number; true injects a NaN gradient (see the file comment).
  std::function<bool(int64_t update)> test_inject_nan_grad;
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
  bool finite = true;     // false: the optimizer step was skipped (the loss or the norm was not finite)
  bool loss_finite = true;       // the loss was finite on every dp/tp rank
  bool grad_norm_finite = true;  // the global gradient norm was finite
  int64_t micro_batches = 0;
  // MoE routers of this rank's layers over the mini-batch's training
  // forwards, summed over the dp group (empty for a dense model).
  model::MoeStepStats moe;
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
  // Expert parallelism: the routed experts' DataParallel over the
  // expert-data-parallel group and their AdamW (its owned range, stepped with
  // optimizer() in the same step: equal step counts). optimizer() then holds
  // the dense parameters only. nullptr without ep, or on a stage without MoE layers.
  parallel::DataParallel* expert_data_parallel() const { return edp_.get(); }
  const optim::AdamW* expert_optimizer() const { return expert_optim_.get(); }
  optim::AdamW* expert_optimizer() { return expert_optim_.get(); }
  // The expert-data-parallel group (nullptr without expert parallelism).
  comm::ProcessGroup* expert_dp_group() const { return edp_group_.get(); }
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

  // Under pipeline parallelism: record what this rank executes in each
  // mini-batch (the op trace, memory in flight, bytes sent) for the
  // schedule's measurements; pipeline_trace() is the last mini-batch's.
  void record_pipeline_trace(bool on);
  const PipelineTrace* pipeline_trace() const { return last_trace_.get(); }

  // The NaN/Inf guard's counts: updates skipped in all, and in a row (0 after an applied one).
  int64_t skipped_steps() const { return skipped_; }
  int64_t consecutive_skipped_steps() const { return consecutive_skipped_; }

  // One optimizer step: zero the gradients, forward + backward of every
  // micro-batch with objective(mb, i) (gradients accumulate), reduce over dp,
  // clip, and step AdamW at `lr` when the loss and the norm are finite (else
  // skip: see the NaN/Inf guard above). An empty `micro` is a step on zero
  // gradients of this rank (other dp ranks may contribute). `step` (>= 1, or
  // -1 = unknown) is the caller's step, named in the guard's messages.
  // Collective over the dp group (and the model's tp group).
  MiniBatchResult train_mini_batch(const std::vector<MicroBatch>& micro, const ObjectiveFn& objective, double lr,
                                   int64_t step = -1);

  // Forward only over `micro` (no gradients); consume(i, out) receives
  // micro-batch i's output: f32 [T] next-token logprobs for a token model
  // (model::score_tokens), [T, 1] values in the compute dtype for a value model.
  void score(const std::vector<MicroBatch>& micro, const std::function<void(size_t, const Tensor&)>& consume) const;

  // Optimizer state (exp_avg, exp_avg_sq, step, f32 masters) as one
  // .safetensors file (optim::save_optimizer_state); under dp/tp each rank
  // writes its own file (optimizer_file_name()). Load restores it and, with
  // the distributed optimizer, re-gathers the parameters. Save first checks
  // the model's weights and the optimizer state for NaN/Inf and fails (naming
  // the tensor, writing nothing) when one holds any: check_finite().
  Status save_optimizer(const std::string& path) const;
  // An error naming the first model weight or optimizer-state tensor holding a NaN or Inf.
  Status check_finite() const;
  Status load_optimizer(const std::string& path);
  // A checkpoint folder's optimizer state in the layout-independent format
  // (train/optimizer_checkpoint.h: one file per pipeline stage, the full
  // HF-shaped f32 state by parameter name), so a run resumes under another
  // tp / pp / dp / distributed-optimizer layout. Collective over dp and tp
  // (every rank calls them); load restores the skip counts too, and reads the
  // per-rank files of save_optimizer() when the folder has only those (same
  // layout). Load the model weights first (load_weights_into).
  Status save_optimizer_dir(const std::string& dir) const;
  Status load_optimizer_dir(const std::string& dir);
  // "optimizer.safetensors" on the single-process path, else
  // "optimizer_tp{t}_dp{d}.safetensors" (this rank's tp and dp ranks).
  std::string optimizer_file_name() const;

 private:
  // MoE models: the router losses' scale for this mini-batch and fresh statistics.
  void begin_moe_mini_batch(int64_t local_micro_batches);
  model::MoeStepStats reduced_moe_stats() const;
  // AdamW slots over `order` (grads already in place); held_masters: no full f32 masters.
  std::vector<optim::ParamSlot> make_slots(const std::vector<model::Param*>& order, bool held_masters) const;
  void build_expert_optimizer(std::vector<parallel::DpParam> experts);
  void zero_grads();
  optim::ClipResult reduce_and_clip();
  void sum_tied_embedding_grads();
  // micro: the caller's micro-batches (the objectives' bookkeeping); run: what
  // this rank runs of each (its cp share under context parallelism, else micro).
  double train_sequential(const std::vector<MicroBatch>& micro, const std::vector<MicroBatch>& run,
                          const ObjectiveFn& objective);
  // reduce_and_clip under expert parallelism: the experts' gradients summed
  // over the expert-data-parallel group, the norm over dense and expert parts.
  optim::ClipResult reduce_and_clip_experts();
  double train_pipelined(const std::vector<MicroBatch>& micro, const std::vector<MicroBatch>& run,
                         const ObjectiveFn& objective);
  bool loss_finite_everywhere(double loss) const;
  bool inject_nan_grad(int64_t update) const;
  void after_skip(const MiniBatchResult& r, int64_t update, int64_t step);

  model::CausalLM& model_;
  EngineOptions opt_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;
  std::unique_ptr<parallel::DataParallel> dp_;
  // Expert parallelism: the expert-data-parallel group (set iff ep > 1), and
  // this rank's routed experts (outside dp_) in their own DataParallel over
  // it with their own AdamW (both unset on a stage without MoE layers).
  std::shared_ptr<comm::ProcessGroup> edp_group_;
  std::unique_ptr<parallel::DataParallel> edp_;
  std::unique_ptr<optim::AdamW> expert_optim_;
  std::unique_ptr<optim::AdamW> optim_;
  std::unique_ptr<optim::LrSchedule> sched_;
  int64_t skipped_ = 0, consecutive_skipped_ = 0;
  std::unique_ptr<PipelineTrace> last_trace_;  // set by record_pipeline_trace()
  std::string inject_env_;  // KESTREL_TEST_INJECT_NAN_GRAD, read once
};

// Whether a mini-batch's forward multiplies by weights packed once for it
// (model::TrainPacksScope): bf16 weights of a dense model (no MoE layer, no
// MLA) on the CPU at tp = pp = cp = 1, where this CPU packs bf16 (AMX,
// AVX512-BF16); never for a model on a device (the packs are the CPU GEMM's).
// The training engine decides by it, and the memory plan counts the packs by
// it (rl/memory_plan_activations.cpp train_packs_planned).
bool train_packs_apply(Device device, DType dtype, int64_t tp, int64_t pp, int64_t cp, bool moe, bool mla);

// score() for any model (e.g. a frozen reference policy that has no engine).
void score_micro_batches(const model::CausalLM& model, const std::vector<MicroBatch>& micro,
                         const std::function<void(size_t, const Tensor&)>& consume);

}  // namespace kestrel::train
