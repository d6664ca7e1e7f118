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

#include "core/status.h"
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
