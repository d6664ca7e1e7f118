#pragma once
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/allocator.h"
#include "core/status.h"

namespace kestrel::cli {

using Args = std::vector<std::string>;  // arguments after the subcommand name

struct Command {
  const char* name;
  const char* summary;
  std::function<int(const Args&)> run;
};

// Every subcommand, in --help order. Defined in cli/commands.cpp.
const std::vector<Command>& commands();
int run_main(int argc, char** argv);

// Subcommand entry points, one file each.
int cmd_logprobs(const Args& args);
int cmd_config(const Args& args);
// kestrel sft: cmd_sft_world is the command (every rank of an mpirun launch
// joins); cmd_sft runs in the calling process alone (kestrel train's SFT warm
// start, which world rank 0 runs while the other ranks wait).
int cmd_sft(const Args& args);
int cmd_sft_world(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_builtin(const Args& args);
int cmd_generate(const Args& args);
int cmd_train(const Args& args);
int cmd_data(const Args& args);
int cmd_report(const Args& args);
int cmd_plan(const Args& args);

// kestrel train's built-in run layer: the overrides that come before the
// user's when a command names neither --config nor data.train_files
// (`kestrel train --help` lists them), else none (verl's defaults). kestrel
// plan applies the same layer; `command` names the caller in an error.
std::vector<std::string> train_first_layer(const std::vector<std::string>& args, const char* command);
const std::vector<std::string>& builtin_train_layer();  // the layer itself

// A model path of kestrel train, generate and logprobs: builtin:<name> (tiny, small, tiny-qwen3-moe,
// tiny-deepseek-v3: random-init with the arith tokenizer; arith-sft: the tiny model after SFT, trained once)
// materialised under $KESTREL_CACHE (or ~/.cache/kestrel), else the path with ~ and $VARS expanded.
std::string resolve_model_folder(const std::string& spec);

// kestrel train's start-up memory check (cli/plan.cpp, rl/memory_plan.h):
// ok when the planned per-rank peak of every phase of a step fits
// device_memory_bytes; else an error with the peak, its phase and the
// cheapest changes that fit. model_dir: the actor's folder (config.json is
// read, no weights) or a builtin: spec. Plans only what training builds.
Status check_layout_fits(const config::Config& c, const std::string& model_dir, int world_size,
                         int64_t device_memory_bytes, Device device = Device::CPU);

// Chooses the GEMM library once per process (cli/gemm_setup.cpp): call after
// the thread count is set and before threads start; under MPI a collective
// (every rank calls it), after which all ranks use rank 0's choice.
void init_gemm_for_job();

// The run folder's run_info.json, written at start, and report.html, at the
// end (cli/run_files.cpp; train/run_report.h). Failures are warnings.
void write_run_info_file(const std::string& run_dir, const char* command, int ranks);
void write_run_report_file(const std::string& run_dir, const char* command);

}  // namespace kestrel::cli
