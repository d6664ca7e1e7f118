// Supervised fine-tuning: packed sequences (no padding), loss on response
// tokens only (token-mean over the whole mini-batch: each trained token
// weighs 1/num_response_tokens of its optimizer step), micro-batches by token
// budget with gradient accumulation, AdamW with warmup + cosine/constant/linear
// schedule and global-norm clipping, periodic validation, atomic checkpoints
// and resume that reproduces an uninterrupted run bit for bit. Under mpirun
// it runs data, tensor and pipeline parallel (SftOptions::world / dp and the
// model's groups), equal to one process (tests/scripts/mpi_sft.sh).
//
// train/ does not link data/ or rollout/: the batch order comes through
// BatchSource and generation-based evaluation through SftHooks, both wired
// by the CLI (cli/sft.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/engine.h"
#include "train/logging.h"

namespace kestrel::train {

struct SftExample {
  std::vector<int32_t> ids;        // [L]
  std::vector<uint8_t> loss_mask;  // [L], 1 on trained tokens
};

// The order in which training rows are visited; its state goes into checkpoints.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual std::vector<int64_t> next_batch() = 0;  // indices into the training examples
  virtual int64_t batches_per_epoch() const = 0;
  virtual int64_t epoch() const = 0;
  virtual nlohmann::json state() const = 0;
  virtual Status restore(const nlohmann::json& state, const std::string& origin) = 0;
};

struct SftOptions {
  // Batching (verl sft names: data.train_batch_size, micro_batch_size_per_gpu,
  // use_dynamic_bsz / max_token_len_per_gpu).
  int64_t micro_batch_size = 4;
  int64_t max_token_len_per_micro = 0;  // > 0: dynamic micro-batches by token budget
  int64_t total_steps = 0;              // resolved by the caller (> 0)
  // Optimizer (optim.*).
  optim::AdamWConfig adamw;
  optim::LrScheduleConfig lr;  // total_steps filled from total_steps when 0
  double clip_grad = 1.0;      // <= 0: no clipping
  bool reuse_fp32_param = false;              // EngineOptions::reuse_fp32_param (bf16 only)
  int64_t max_consecutive_skipped_steps = 10; // EngineOptions: the NaN/Inf guard's abort; 0 = never
  // Trainer (trainer.*).
  int64_t save_freq = -1;      // also saves at the last step when > 0
  int64_t test_freq = -1;      // also validates at the last step when > 0
  bool val_before_train = false;
  int64_t max_ckpt_to_keep = 0;  // 0: keep all
  std::string ckpt_root;         // trainer.default_local_dir
  std::string resume_mode = "auto";  // auto | disable | resume_path
  std::string resume_from_path;
  std::string export_dir;        // HF folder written at the end; "" = none
  int64_t val_micro_tokens = 8192;  // validation forward budget per micro-batch
  bool progress = true;
  // Under mpirun (cli/sft.cpp): the world and the grid's data-parallel group;
  // nullptr = one process. Tensor and pipeline parallelism come with the
  // model (CausalLM::tp() / pp()). Each dp rank trains a contiguous share of
  // every mini-batch with the whole mini-batch's loss denominator (the
  // engine sums the gradients over dp); only world rank 0 logs; checkpoints
  // and the export are collective (every rank calls fit()).
  std::shared_ptr<comm::ProcessGroup> world, dp;
  // Under context parallelism the dp-cp group (the engine's gradient group,
  // TrainingEngine's EngineParallel::dp); its rank 0 writes the model folders.
  // nullptr = dp.
  std::shared_ptr<comm::ProcessGroup> dp_cp;
  // Saved into each checkpoint and export.
  std::string resolved_config_yaml;
  std::map<std::string, std::string> model_extra_files;  // tokenizer files
};

struct SftHooks {
  // Evaluation by generation (greedy decoding + reward rule) on the model as
  // trained so far; returns metrics such as "val/acc". Optional.
  std::function<std::map<std::string, double>(const model::CausalLM&)> generate_eval;
};

class SftTrainer {
 public:
  SftTrainer(model::CausalLM& model, std::vector<SftExample> train, std::vector<SftExample> val,
             std::unique_ptr<BatchSource> source, SftOptions opt, MetricsLogger* logger, SftHooks hooks = {});

  // Resumes per resume_mode, trains to total_steps, saves and exports.
  Status fit();
  // One optimizer step on the next mini-batch; returns its metrics.
  std::map<std::string, double> train_step();
  // Validation loss (token-mean NLL over response tokens) plus hook metrics.
  std::map<std::string, double> validate();

  Status save_checkpoint();
  // Loads a global_step_N folder: weights, optimizer, schedule and data position.
  Status load_checkpoint(const std::string& dir);
  Status export_hf(const std::string& dir) const;

  int64_t global_step() const { return step_; }
  // World rank 0 (or one process): the rank that logs and writes the trainer state.
  bool leader() const { return !opt_.world || opt_.world->rank() == 0; }
  const optim::AdamW& optimizer() const { return engine_->optimizer(); }

 private:
  // dp (or dp-cp) rank 0: the ranks that stream the model folders (collective over tp and pp).
  bool writes_model_folder() const {
    const auto& g = opt_.dp_cp ? opt_.dp_cp : opt_.dp;
    return !g || g->rank() == 0;
  }
  model::CausalLM& model_;
  std::vector<SftExample> train_, val_;
  std::unique_ptr<BatchSource> source_;
  SftOptions opt_;
  MetricsLogger* logger_;
  SftHooks hooks_;
  std::unique_ptr<TrainingEngine> engine_;  // AdamW, schedule, clipping, the micro-batch loop
  int64_t step_ = 0;             // optimizer steps taken
};

}  // namespace kestrel::train
