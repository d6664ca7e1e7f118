// The run folder's run_info.json (at start) and report.html (at the end) for
// kestrel train and kestrel sft (train/run_report.h).
#include <cstdio>
#include <ctime>

#include "backend/cpu/gemm.h"
#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/parallel_for.h"
#include "train/run_report.h"

namespace kestrel::cli {

void write_run_info_file(const std::string& run_dir, const char* command, int ranks) {
  train::RunInfo info;
  info.command = command;
  info.build = train::build_description();
  info.threads = num_threads();
  info.ranks = ranks;
  info.gemm = cpu::gemm_summary();
  info.cpu = cpu_summary();
  char t[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  info.started = t;
  info.build += deterministic() ? ", deterministic mode" : "";
  // The report is a convenience: a run folder that cannot take it still trains.
  if (Status s = train::write_run_info(run_dir, info); !s.is_ok())
    std::fprintf(stderr, "%s: warning: %s\n", command, s.message().c_str());
}

void write_run_report_file(const std::string& run_dir, const char* command) {
  Result<std::string> out = train::write_run_report(run_dir);
  if (out.is_ok())
    std::fprintf(stderr, "%s: run report: %s\n", command, out->c_str());
  else
    std::fprintf(stderr, "%s: warning: no run report: %s\n", command, out.status().message().c_str());
}

}  // namespace kestrel::cli
