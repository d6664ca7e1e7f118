#include "train/run_report.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "train/run_report_svg.h"

namespace kestrel::train {

namespace fs = std::filesystem;
using report::Series;

namespace {

// One figure: its title and the metric keys it draws (each present key a
// series); `prefix` adds every key that starts with it (validation accuracy
// per data source).
struct PlotSpec {
  const char* id;
  const char* title;
  std::vector<const char*> keys;
  const char* prefix = nullptr;
  const char* suffix = nullptr;
};

const std::vector<PlotSpec>& rl_plots() {
  static const std::vector<PlotSpec> p = {
      {"reward", "Reward (mean score per response)", {"critic/score/mean"}},
      {"val_acc", "Validation accuracy", {}, "val-core/", "/mean@1"},
      {"kl", "KL to the reference", {"actor/kl_loss", "actor/ppo_kl", "critic/kl"}},
      {"entropy", "Entropy", {"actor/entropy"}},
      {"response_length", "Response length (tokens)", {"response_length/mean"}},
      {"grad_norm", "Gradient norm", {"actor/grad_norm", "critic/grad_norm"}},
      {"throughput", "Throughput (tokens/s)", {"perf/throughput"}},
  };
  return p;
}

const std::vector<PlotSpec>& sft_plots() {
  static const std::vector<PlotSpec> p = {
      {"loss", "Training loss", {"train/loss"}},
      {"val_loss", "Validation loss", {"val/loss"}},
      {"grad_norm", "Gradient norm", {"train/grad_norm"}},
      {"lr", "Learning rate", {"train/lr"}},
      {"throughput", "Throughput (tokens/s)", {"perf/tokens_per_s"}},
  };
  return p;
}

// The stages of an RL step in the order they run (rl/trainer.cpp's timing_s keys).
const char* const kStageOrder[] = {"gen", "reward", "old_log_prob", "ref", "values", "adv",
                                   "update_critic", "update_actor", "update_weights", "testing"};

using Metrics = std::map<std::string, std::vector<std::pair<int64_t, double>>>;

Result<Metrics> read_metrics(const std::string& path) {
  Metrics m;
  KS_TRY(for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) -> Status {
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
      return KS_ERR(path, ":", line, ": a metrics line needs an integer \"step\"");
    const int64_t step = j["step"].get<int64_t>();
    for (const auto& [k, v] : j.items())
      if (k != "step" && v.is_number()) m[k].emplace_back(step, v.get<double>());
    return Status::ok();
  }));
  for (auto& [k, pts] : m) std::stable_sort(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return m;
}

std::vector<Series> series_for(const PlotSpec& spec, const Metrics& m) {
  std::vector<Series> out;
  for (const char* k : spec.keys)
    if (auto it = m.find(k); it != m.end()) out.push_back({k, it->second});
  if (spec.prefix)
    for (const auto& [k, pts] : m)
      if (k.rfind(spec.prefix, 0) == 0 && (!spec.suffix || (k.size() >= std::string(spec.suffix).size() &&
                                                             k.compare(k.size() - std::string(spec.suffix).size(),
                                                                       std::string::npos, spec.suffix) == 0)))
        out.push_back({k, pts});
  return out;
}

// The config of the run's latest checkpoint, "" when it has none.
std::string latest_config(const std::string& run_dir) {
  int64_t best = -1;
  std::error_code ec;
  for (auto it = fs::directory_iterator(run_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("global_step_", 0) != 0) continue;
    try {
      best = std::max(best, int64_t(std::stoll(n.substr(12))));
    } catch (...) {
    }
  }
  if (best < 0) return "";
  auto text = read_file((fs::path(run_dir) / ("global_step_" + std::to_string(best)) / "config.yaml").string());
  return text.is_ok() ? *text : "";
}

std::string stage_section(const Metrics& m, int64_t want_step) {
  // The steps that have stage timings; the chosen one, or the last.
  std::map<int64_t, std::vector<std::pair<std::string, double>>> by_step;
  for (const auto& [k, pts] : m) {
    if (k.rfind("timing_s/", 0) != 0 || k == "timing_s/step") continue;
    for (const auto& [s, v] : pts) by_step[s].emplace_back(k.substr(9), v);
  }
  if (by_step.empty())
    if (auto it = m.find("perf/step_time_s"); it != m.end())  // SFT: one stage per step
      for (const auto& [s, v] : it->second) by_step[s].emplace_back("step", v);
  if (by_step.empty()) return "<p class=\"empty\">No stage timings in metrics.jsonl.</p>\n";
  auto it = want_step >= 0 ? by_step.find(want_step) : std::prev(by_step.end());
  if (it == by_step.end())
    return "<p class=\"empty\">Step " + std::to_string(want_step) + " has no stage timings.</p>\n";
  auto stages = it->second;
  auto rank = [](const std::string& n) {
    for (size_t i = 0; i < std::size(kStageOrder); ++i)
      if (n == kStageOrder[i]) return int(i);
    return int(std::size(kStageOrder));
  };
  std::stable_sort(stages.begin(), stages.end(), [&](auto& a, auto& b) { return rank(a.first) < rank(b.first); });
  double total = 0;
  for (auto& s : stages) total += s.second;
  return "<p>Step " + std::to_string(it->first) + ": " + report::fmt_short(total) + " s in " +
         std::to_string(stages.size()) + " stages.</p>\n" + report::stage_bar(stages);
}

std::string environment_section(const std::string& run_dir) {
  std::string rows;
  auto text = read_file((fs::path(run_dir) / "run_info.json").string());
  nlohmann::ordered_json j = text.is_ok() ? nlohmann::ordered_json::parse(*text, nullptr, false) : nlohmann::ordered_json();
  auto row = [&](const std::string& k, const std::string& v) {
    rows += "<tr><th>" + report::html_escape(k) + "</th><td>" + report::html_escape(v) + "</td></tr>\n";
  };
  row("run folder", fs::absolute(run_dir).string());
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) row(k, v.is_string() ? v.get<std::string>() : v.dump());
  } else {
    row("run_info.json", "absent (written by kestrel train / sft at start since this version)");
  }
  return "<table class=\"env\">\n" + rows + "</table>\n";
}

const char* kStyle =
    "body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}"
    ".grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;border:1px solid #e3e3e3;padding:6px}"
    "figcaption{font-size:13px;font-weight:bold;margin-bottom:4px}.empty{color:#888;font-size:13px}"
    "table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}"
    "pre{font-size:11px;background:#f6f6f6;padding:8px;max-height:480px;overflow:auto}";

}  // namespace

std::string build_description() {
#if defined(NDEBUG)
  std::string b = "optimised";
#else
  std::string b = "debug checks";
#endif
#if defined(__clang__)
  b += ", clang " __clang_version__;
#elif defined(__GNUC__)
  b += ", GCC " __VERSION__;
#endif
  return b;
}

Status write_run_info(const std::string& run_dir, const RunInfo& info) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return KS_ERR(run_dir, ": cannot create the run folder: ", ec.message());
  nlohmann::ordered_json j;
  j["command"] = info.command;
  j["build"] = info.build;
  j["threads per rank"] = info.threads;
  j["ranks"] = info.ranks;
  j["GEMM"] = info.gemm;
  j["CPU"] = info.cpu;
  j["started (UTC)"] = info.started;
  return write_file_atomic((fs::path(run_dir) / "run_info.json").string(), j.dump(2) + "\n");
}

Result<std::string> write_run_report(const std::string& run_dir, const ReportOptions& opt) {
  const std::string mpath = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::exists(mpath))
    return KS_ERR(mpath, " does not exist: is ", run_dir, " a run folder (trainer.default_local_dir)? kestrel train "
                  "always writes metrics.jsonl there; kestrel sft when trainer.logger includes file");
  KS_ASSIGN(Metrics m, read_metrics(mpath));
  const bool rl = m.count("critic/score/mean") > 0;
  const auto& specs = rl ? rl_plots() : sft_plots();
  int64_t last_step = 0;
  for (const auto& [k, pts] : m)
    if (!pts.empty()) last_step = std::max(last_step, pts.back().first);

  std::string plots;
  for (const PlotSpec& spec : specs) {
    const std::vector<Series> s = series_for(spec, m);
    plots += "<figure class=\"metric\" data-plot=\"" + std::string(spec.id) + "\"><figcaption>" + spec.title +
             "</figcaption>\n";
    const std::string svg = s.empty() ? "" : report::line_plot(spec.id, s);
    plots += svg.empty() ? "<p class=\"empty\">Not logged by this run.</p>\n" : svg;
    plots += "</figure>\n";
  }
  const std::string cfg = latest_config(run_dir);
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Kestrel run report: " +
                     report::html_escape(fs::path(run_dir).filename().string()) + "</title><style>" + kStyle +
                     "</style></head><body>\n";
  html += "<h1>Kestrel run report</h1>\n<p>" + std::string(rl ? "RL (kestrel train)" : "SFT (kestrel sft)") + ", " +
          std::to_string(last_step) + " steps logged in <code>" + report::html_escape(mpath) + "</code>.</p>\n";
  html += "<h2>Metrics</h2>\n<div class=\"grid\">\n" + plots + "</div>\n";
  html += "<h2>Stage timeline</h2>\n" + stage_section(m, opt.timeline_step);
  html += "<h2>Environment</h2>\n" + environment_section(run_dir);
  html += "<h2>Config</h2>\n";
  html += cfg.empty() ? "<p class=\"empty\">No checkpoint with a config.yaml in the run folder.</p>\n"
                      : "<details open><summary>config.yaml of the latest checkpoint</summary><pre id=\"config\">" +
                            report::html_escape(cfg) + "</pre></details>\n";
  html += "</body></html>\n";
  const std::string out = opt.out_path.empty() ? (fs::path(run_dir) / "report.html").string() : opt.out_path;
  KS_TRY(write_file_atomic(out, html));
  return out;
}

}  // namespace kestrel::train
