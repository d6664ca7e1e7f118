// The run report: one self-contained HTML file per run folder
// (trainer.default_local_dir), written at the end of every `kestrel train` /
// `kestrel sft` run and by `kestrel report RUN_DIR`.
//
// Contents, all from files the run already wrote: curves of the run's
// metrics (metrics.jsonl: reward, validation accuracy, KL, entropy, response
// length, gradient norm, throughput; for SFT loss, validation loss, gradient
// norm, throughput), a stage timeline of one step (its timing_s/* keys), the
// config that ran (config.yaml of the latest checkpoint) and the environment
// (run_info.json, written at start). Plots are inline SVG drawn here; the page
// has no script and fetches nothing, so it opens anywhere, offline.
//
// Every point is an SVG <circle> with data-step / data-value attributes (the
// value as metrics.jsonl holds it, %.17g) and a <title> tooltip, so tests can
// check the rendered page against metrics.jsonl.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::train {

// What ran, recorded at the start of a run (run_info.json in the run folder).
struct RunInfo {
  std::string command;  // "kestrel train" / "kestrel sft"
  std::string build;    // build type and compiler
  int threads = 0;      // OpenMP threads per rank
  int ranks = 1;        // processes in the job
  std::string gemm;     // the GEMM line
  std::string cpu;      // cpu model and ISA
  std::string started;  // UTC, ISO 8601
};

// The build type and compiler this binary was made with.
std::string build_description();

// Writes RUN_DIR/run_info.json atomically.
Status write_run_info(const std::string& run_dir, const RunInfo& info);

struct ReportOptions {
  std::string out_path;        // "" = RUN_DIR/report.html
  int64_t timeline_step = -1;  // the step whose stage timeline is shown; -1 = the last with timings
};

// Reads the run folder and writes the report atomically; returns its path.
Result<std::string> write_run_report(const std::string& run_dir, const ReportOptions& opt = {});

}  // namespace kestrel::train
