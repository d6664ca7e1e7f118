// kestrel report RUN_DIR [--out FILE] [--step N]: the run report
// (train/run_report.h) of a run folder, the same page kestrel train and
// kestrel sft write at the end of every run.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "train/run_report.h"

namespace kestrel::cli {

namespace {

const char* kUsage =
    "usage: kestrel report RUN_DIR [--out FILE] [--step N]\n\n"
    "Writes one self-contained HTML page for a run folder (trainer.default_local_dir): curves of the\n"
    "run's metrics (reward, validation accuracy, KL, entropy, response length, gradient norm,\n"
    "throughput; for SFT loss, validation loss, gradient norm, learning rate, throughput), the stage\n"
    "timeline of one step, the environment (run_info.json) and the config of the latest checkpoint.\n"
    "No scripts, no network: it opens in any browser, offline.\n\n"
    "options:\n"
    "  --out FILE   where to write (default RUN_DIR/report.html)\n"
    "  --step N     the step whose stage timeline is shown (default: the last)\n";

}  // namespace

int cmd_report(const Args& argv) {
  const ParsedArgs args("report", {{"out", "output file", true, ""}, {"step", "timeline step", true, "-1"}}, argv);
  const auto& pos = args.positional();
  if (args.help() || pos.size() != 1) {
    std::fputs(kUsage, args.help() ? stdout : stderr);
    if (!args.help() && pos.size() > 1) std::fprintf(stderr, "kestrel report: one RUN_DIR, got %zu arguments\n", pos.size());
    return args.help() ? 0 : 2;
  }
  train::ReportOptions opt;
  opt.out_path = args.get("out");
  opt.timeline_step = args.get_int("step");
  Result<std::string> out = train::write_run_report(pos[0], opt);
  if (!out.is_ok()) {
    std::fprintf(stderr, "kestrel report: %s\n", out.status().message().c_str());
    return 1;
  }
  std::printf("%s\n", out->c_str());
  return 0;
}

}  // namespace kestrel::cli
