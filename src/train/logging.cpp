#include "train/logging.h"

#include <vector>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/files.h"

namespace kestrel::train {

Result<std::unique_ptr<MetricsLogger>> MetricsLogger::open(const MetricsOptions& opt, int64_t resume_step) {
  auto m = std::unique_ptr<MetricsLogger>(new MetricsLogger());
  m->opt_ = opt;
  if (!opt.jsonl_path.empty()) {
    std::string keep;
    if (resume_step >= 0) {
      std::ifstream in(opt.jsonl_path);
      std::string line;
      while (std::getline(in, line)) {
        try {
          auto j = nlohmann::json::parse(line);
          if (j.value("step", int64_t(-1)) <= resume_step) keep += line + "\n";
        } catch (const nlohmann::json::exception&) {  // a torn last line of a killed run
        }
      }
    }
    KS_TRY(write_file_atomic(opt.jsonl_path, keep));
    m->jsonl_ = std::fopen(opt.jsonl_path.c_str(), "ab");
    if (!m->jsonl_) return KS_ERR(opt.jsonl_path, ": cannot open for appending");
  }
  if (!opt.tensorboard_dir.empty()) {
    KS_ASSIGN(EventWriter w, EventWriter::open(opt.tensorboard_dir));
    m->tb_.emplace(std::move(w));
  }
  return m;
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_) std::fclose(jsonl_);
}

void MetricsLogger::log(int64_t step, const std::map<std::string, double>& metrics) {
  if (jsonl_) {
    nlohmann::ordered_json j;
    j["step"] = step;
    for (const auto& [k, v] : metrics) j[k] = std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
    const std::string line = j.dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), jsonl_);
    std::fflush(jsonl_);
  }
  if (tb_) {
    for (const auto& [k, v] : metrics) tb_->add_scalar(k, float(v), step);
    tb_->flush();
  }
  if (opt_.console) {
    std::string line = opt_.console_full ? std::string() : compact_line(step, metrics);
    if (line.empty()) {
      std::ostringstream os;
      os << "step:" << step;
      for (const auto& [k, v] : metrics) os << " - " << k << ":" << v;
      line = os.str();
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

std::string compact_line(int64_t step, const std::map<std::string, double>& m) {
  auto get = [&](const char* k, double* v) {
    auto it = m.find(k);
    if (it == m.end()) return false;
    *v = it->second;
    return true;
  };
  std::string out;
  auto add = [&](const char* label, const char* fmt, double v) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, v);
    out += out.empty() ? "" : ", ";
    out += std::string(label) + " " + b;
  };
  double v = 0;
  if (get("critic/score/mean", &v)) add("reward", "%.3f", v);
  if (get("train/loss", &v)) add("loss", "%.4f", v);
  if (get("val/loss", &v)) add("val_loss", "%.4f", v);
  // Validation accuracy per data source: val-core/<source>/<metric>/mean@1.
  std::vector<std::pair<std::string, double>> accs;
  for (const auto& [k, x] : m)
    if (k.rfind("val-core/", 0) == 0 && k.size() > 16 && k.compare(k.size() - 7, 7, "/mean@1") == 0)
      accs.emplace_back(k.substr(9, k.size() - 16), x);
  for (const auto& [src, x] : accs) add(accs.size() == 1 ? "acc" : ("acc[" + src + "]").c_str(), "%.3f", x);
  if (get("actor/kl_loss", &v) || get("actor/ppo_kl", &v)) add("kl", "%.3g", v);
  if (get("actor/entropy", &v)) add("entropy", "%.3f", v);
  if (get("response_length/mean", &v)) add("resp_len", "%.1f", v);
  if (get("train/grad_norm", &v)) add("grad_norm", "%.3g", v);
  if (get("actor/step_skipped", &v) && v > 0) add("skipped", "%.0f", v);
  if (get("train/step_skipped", &v) && v > 0) add("skipped", "%.0f", v);
  if (out.empty()) return "";
  if (get("timing_s/step", &v) || get("perf/step_time_s", &v) || get("timing_s/testing", &v)) {
    char b[32];
    std::snprintf(b, sizeof b, ", %.2f s", v);
    out += b;
  }
  return "step " + std::to_string(step) + ": " + out;
}

ProgressBar::ProgressBar(int64_t total, int64_t start, std::FILE* out)
    : total_(total), start_(start), out_(out), tty_(::isatty(::fileno(out)) == 1),
      t0_(std::chrono::steady_clock::now()), last_print_(t0_) {}

std::string ProgressBar::format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(b, sizeof b, "%llds", (long long)t);
  return b;
}

void ProgressBar::update(int64_t step, int64_t tokens, const std::string& status) {
  tokens_ += tokens;
  const auto now = std::chrono::steady_clock::now();
  const double el = std::chrono::duration<double>(now - t0_).count();
  const int64_t done = step - start_, left = total_ - step;
  const double eta = done > 0 ? el / double(done) * double(left) : NAN;
  const double tps = el > 0 ? double(tokens_) / el : 0;
  const bool last = step >= total_;
  if (tty_) {
    constexpr int kWidth = 30;
    const int fill = total_ > 0 ? int(double(kWidth) * double(step) / double(total_)) : kWidth;
    std::string bar(size_t(fill), '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r[%s] %lld/%lld %s<%s %.0f tok/s %s\x1b[K", bar.c_str(), (long long)step,
                 (long long)total_, format_duration(el).c_str(), format_duration(eta).c_str(), tps, status.c_str());
    drawn_ = true;
  } else {
    // Plain lines: at most one every 10 s, plus the first and the last step.
    if (!(done == 1 || last || std::chrono::duration<double>(now - last_print_).count() >= 10.0)) return;
    std::fprintf(out_, "progress: step %lld/%lld elapsed %s eta %s %.0f tok/s %s\n", (long long)step,
                 (long long)total_, format_duration(el).c_str(), format_duration(eta).c_str(), tps, status.c_str());
  }
  last_print_ = now;
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace kestrel::train
