// Layout-independent optimizer checkpoints: AdamW state that resumes under
// another (tp, pp, dp, distributed optimizer) layout, bit for bit in what it
// restores.
//
// Format (format_version 1). One file per pipeline stage,
// `<dir>/optimizer_pp{stage}.safetensors` (stage = the model's pp().rank();
// "optimizer_pp0.safetensors" without a pipeline), holding for every
// parameter of the stage its FULL Hugging Face-shaped f32 state, keyed by the
// HF name (global layer indices):
//   exp_avg.<name>     f32 [HF shape]  AdamW's m
//   exp_avg_sq.<name>  f32 [HF shape]  AdamW's v (without reuse_fp32_param's flag bits)
//   master.<name>      f32 [HF shape]  the f32 master of a bf16/f16 weight (reuse_fp32_param's
//                                      (copy, residual) pair recovered exactly); absent for f32
//                                      weights, whose master is the weight itself (in model/)
// and metadata: format "kestrel_optimizer", format_version, optimizer
// "adamw" with its hyperparameters, step_count, pp_rank, pp_size, the
// layout it was written under (for messages), then the caller's extra
// entries (the engine's skipped-step counts). Vocabulary padding rows are not
// stored (their state is zero: zero gradients, zero weights) and a tied
// embedding appears in the first and the last stage's file (the head slice's
// copy, trained identically); a load takes the lowest stage's.
//
// Save gathers each parameter's state over the dp group (the distributed
// optimizer's owned ranges, onto dp rank 0) and over the tp group (the
// parameter's ShardSpec), and tp rank 0 of dp rank 0 of each stage writes its
// stage's file atomically (io::save_safetensors). Under expert parallelism
// the routed experts have their own optimizer (TrainingEngine::
// expert_optimizer()): each expert's state is gathered over the
// expert-data-parallel group (the distributed optimizer's edp-owned ranges,
// onto edp rank 0), then broadcast over the ep group to the writer; the file
// keys them by their global HF names like any parameter. Load: every rank reads
// every stage file of the folder (mmap), takes the parameters its model (slice)
// holds by name, cuts its tp shard and its owned range (dp's, or edp's for
// an expert), and fills AdamW
// (moments, masters, step count), then re-gathers the distributed optimizer's
// parameters. Everything is validated before anything is written, so a
// refused load leaves the engine as it was.
//
// The old per-rank format (optim/checkpoint_io.h: optimizer.safetensors,
// optimizer_tp{t}_dp{d}.safetensors) is still read when the folder has no
// stage file: under the layout that wrote it only (its own checks refuse
// another), with an error naming the format and the fix otherwise.
#pragma once
#include <map>
#include <string>

#include "core/status.h"
#include "train/engine.h"

namespace kestrel::train {

inline constexpr const char* kOptimizerCheckpointFormat = "kestrel_optimizer";
inline constexpr int kOptimizerCheckpointVersion = 1;

// "optimizer_pp{stage}.safetensors".
std::string optimizer_stage_file_name(int64_t stage);

// Writes this stage's file into dir (an existing folder, e.g. the temp folder
// train::write_checkpoint hands each rank). Collective over the engine's dp
// group and the model's tp group (every rank calls it; every rank returns the
// same status). Refuses (writing nothing) when a weight or the optimizer state
// of any rank holds a NaN/Inf (TrainingEngine::check_finite). extra_metadata
// entries are stored with the file (reserved keys above take precedence).
Status save_optimizer_checkpoint(const TrainingEngine& engine, const std::string& dir,
                                 const std::map<std::string, std::string>& extra_metadata = {});

// Restores the engine's AdamW state from dir (the new format, or the old
// per-rank file of this rank's layout). Collective over the engine's dp group
// and the model's tp group. metadata (optional) receives the lowest stage
// file's metadata (the caller's extra entries included); with the old format,
// the rank's file's. The model's weights are not read here: load them first
// (train::load_weights_into); bf16/f16 weights are then re-rounded from the
// restored masters (equal to the saved weights).
Status load_optimizer_checkpoint(TrainingEngine& engine, const std::string& dir,
                                 std::map<std::string, std::string>* metadata = nullptr);

}  // namespace kestrel::train
