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
  std::string jsonl_path;       // "" = off
  std::string tensorboard_dir;  // "" = off
};

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
