// Atomic training checkpoints in verl's layout:
//   {root}/global_step_{N}/...                 one folder per saved step
//   {root}/latest_checkpointed_iteration.txt   "N", rewritten last
// A folder is filled under a temporary name ({root}/.tmp.global_step_{N}.{pid}),
// every file and the folder are fsynced, the folder is renamed into place and
// the root fsynced; only then is the pointer replaced (atomically). A crash at
// any point therefore leaves the pointer at a complete checkpoint, and a
// leftover temp folder is ignored (and cleaned) by the next run.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "core/status.h"
#include "model/transformer.h"

namespace kestrel::train {

inline constexpr const char* kLatestCheckpointFile = "latest_checkpointed_iteration.txt";

// Copies a saved model folder's weights into the model's existing parameters
// (shapes checked, converted to each parameter's dtype), for resume. Under
// tensor parallelism each rank reads the full tensors and keeps its shard.
Status load_weights_into(model::CausalLM& model, const std::string& dir);

std::string checkpoint_dir(const std::string& root, int64_t step);  // {root}/global_step_{step}

// fill(dir) writes the checkpoint's files into dir (a fresh, empty folder).
// keep_last > 0 then removes all but the newest keep_last global_step_* folders.
// With a group of several ranks it is collective: rank 0 makes the temp
// folder, every rank's fill writes its own files into it, and only when all
// succeeded does rank 0 publish it (fsync, rename, pointer); every rank
// returns the same status.
Status write_checkpoint(const std::string& root, int64_t step, const std::function<Status(const std::string& dir)>& fill,
                        int64_t keep_last = 0, comm::ProcessGroup* group = nullptr);

// The step the pointer names; nullopt when the root or the pointer does not
// exist. A pointer naming a missing folder, or unreadable, is an error.
Result<std::optional<int64_t>> latest_checkpoint_step(const std::string& root);

// N of a ".../global_step_N" path (trainer.resume_from_path).
Result<int64_t> checkpoint_step_of(const std::string& path);

// {dir}/trainer_state.json of a checkpoint, parsed, with its global_step and
// the presence of its data_loader state checked; an error names the file.
struct TrainerState {
  std::string path;  // {dir}/trainer_state.json, for the messages of what reads it further
  int64_t global_step = 0;
  nlohmann::json json;
};
Result<TrainerState> read_trainer_state(const std::string& dir);

// Deletes temp folders left by interrupted writes; returns how many.
int64_t remove_stale_checkpoint_temps(const std::string& root);

// fsync of every regular file below dir, then of each folder (deepest first).
Status fsync_tree(const std::string& dir);

// Test-only fault injection: when the environment variable KESTREL_CRASH_AT
// equals "<point>:<step>", the process kills itself with SIGKILL there, the
// way a preempted job dies (used by tests/scripts/sft_resume.sh). Points:
// "ckpt_files" (temp folder half written), "ckpt_pointer" (folder renamed,
// pointer not yet updated), "train_step" (between micro-batches of a step).
void maybe_crash(const char* point, int64_t step);

}  // namespace kestrel::train
