// Training metrics sinks (console, JSONL file, TensorBoard event file) and a
// progress bar on stderr with ETA and tokens/s (a redrawn bar on a TTY, plain
// periodic lines otherwise, so logs stay readable).
#pragma once
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "core/status.h"
#include "model/moe_options.h"
#include "train/tensorboard.h"

namespace kestrel::train {

struct MetricsOptions {
  bool console = true;
  // The console line per step: false = compact (the few numbers a person
  // follows: reward, accuracy when validated, KL, entropy, response length,
  // seconds; for SFT loss, validation loss, gradient norm, seconds), true =
  // every metric as verl's console logger prints them. metrics.jsonl and
  // TensorBoard always get every metric.
  bool console_full = false;
  std::string jsonl_path;       // "" = off
  std::string tensorboard_dir;  // "" = off
};

// The compact console line of one step ("step 3: reward 0.250, acc 0.400, kl
// 0.0012, entropy 1.234, resp_len 15.2, 1.25 s"); "" when none of its metrics
// is present (then the full line is printed).
std::string compact_line(int64_t step, const std::map<std::string, double>& metrics);

class MetricsLogger {
 public:
  // resume_step >= 0 keeps the JSONL lines of steps <= resume_step (a resumed
  // run rewrites what came after its checkpoint); -1 starts the file afresh.
  static Result<std::unique_ptr<MetricsLogger>> open(const MetricsOptions& opt, int64_t resume_step = -1);
  void log(int64_t step, const std::map<std::string, double>& metrics);

 private:
  MetricsOptions opt_;
  std::FILE* jsonl_ = nullptr;
  std::optional<EventWriter> tb_;

 public:
  ~MetricsLogger();
};

// Router metrics of a MoE model over one or more optimizer steps (an RL step's mini-batches): add() sums
// each step's MiniBatchResult::moe, which holds this pipeline stage's MoE layers summed over dp.
class MoeMetrics {
 public:
  void add(const model::MoeStepStats& s);
  // Under pipeline parallelism each stage saw its own layers: afterwards every stage holds every stage's
  // (world rank 0 logs the whole model). Collective over pp; no-op on a size-1 group.
  void gather_stages(comm::ProcessGroup& pp);
  bool empty() const { return layers_.empty(); }
  // <prefix>/moe_aux_loss and moe_z_loss: per layer the mean over its micro-batch forwards of the loss (with
  // its coefficient), summed over the layers; moe_max_load / moe_min_load: over layers and experts, an
  // expert's share of its layer's kept token slots times the number of experts (1 = balanced);
  // moe_dropped_tokens: slots dropped by the capacity / slots routed. Nothing for a dense model.
  // Under expert parallelism (ep > 1: E/ep consecutive experts per rank) also moe_ep_max_rank_load /
  // moe_ep_min_rank_load: over layers and ep ranks, a rank's share of its layer's kept slots times ep (the
  // token counts the dispatcher sends each rank; 1 = balanced).
  std::map<std::string, double> metrics(const std::string& prefix, int64_t ep = 1) const;

 private:
  std::map<int64_t, model::MoeLayerStats> layers_;  // by global layer index
};

class ProgressBar {
 public:
  // Steps [start, total); out is normally stderr.
  ProgressBar(int64_t total, int64_t start, std::FILE* out = stderr);
  // After a step: its number (1-based), tokens it processed, and a short status.
  void update(int64_t step, int64_t tokens, const std::string& status);
  void finish();

  static std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

 private:
  int64_t total_, start_;
  std::FILE* out_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_, last_print_;
  int64_t tokens_ = 0;
  bool drawn_ = false;
};

}  // namespace kestrel::train
