#include "train/logging.h"

#include <algorithm>
#include <cstring>
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

void MoeMetrics::add(const model::MoeStepStats& s) {
  for (const model::MoeLayerStats& l : s.layers) {
    auto [it, fresh] = layers_.try_emplace(l.layer, l);
    if (fresh) continue;
    model::MoeLayerStats& a = it->second;
    KS_CHECK(a.tokens_per_expert.size() == l.tokens_per_expert.size(), "MoE metrics: layer ", l.layer, " has ",
             l.tokens_per_expert.size(), " experts, before ", a.tokens_per_expert.size());
    for (size_t e = 0; e < a.tokens_per_expert.size(); ++e) a.tokens_per_expert[e] += l.tokens_per_expert[e];
    a.dropped += l.dropped;
    a.tokens += l.tokens;
    a.aux_loss += l.aux_loss;
    a.z_loss += l.z_loss;
    a.micro_batches += l.micro_batches;
  }
}

void MoeMetrics::gather_stages(comm::ProcessGroup& pp) {
  if (pp.size() == 1) return;
  // Each layer as i64 words: [layer, E, tokens_per_expert[E], dropped, tokens, micro_batches, aux bits, z bits].
  std::vector<int64_t> mine;
  for (const auto& [layer, l] : layers_) {
    mine.push_back(layer);
    mine.push_back(int64_t(l.tokens_per_expert.size()));
    mine.insert(mine.end(), l.tokens_per_expert.begin(), l.tokens_per_expert.end());
    int64_t aux, z;
    std::memcpy(&aux, &l.aux_loss, 8);
    std::memcpy(&z, &l.z_loss, 8);
    mine.insert(mine.end(), {l.dropped, l.tokens, l.micro_batches, aux, z});
  }
  const int n = pp.size();
  int64_t len = int64_t(mine.size());
  std::vector<int64_t> lens(size_t(n), 0);
  pp.all_gather(&len, lens.data(), 1, DType::I64);
  int64_t longest = 0;
  for (int64_t x : lens) longest = std::max(longest, x);
  mine.resize(size_t(longest), 0);
  std::vector<int64_t> all(size_t(longest) * size_t(n));
  if (longest > 0) pp.all_gather(mine.data(), all.data(), longest, DType::I64);
  for (int r = 0; r < n; ++r) {
    const int64_t* w = all.data() + size_t(r) * size_t(longest);
    for (int64_t at = 0; at < lens[size_t(r)];) {
      model::MoeLayerStats l;
      l.layer = w[at];
      const int64_t E = w[at + 1];
      l.tokens_per_expert.assign(w + at + 2, w + at + 2 + E);
      at += 2 + E;
      l.dropped = w[at], l.tokens = w[at + 1], l.micro_batches = w[at + 2];
      std::memcpy(&l.aux_loss, &w[at + 3], 8);
      std::memcpy(&l.z_loss, &w[at + 4], 8);
      at += 5;
      layers_[l.layer] = std::move(l);  // a stage's own layers come back unchanged
    }
  }
}

std::map<std::string, double> MoeMetrics::metrics(const std::string& prefix, int64_t ep) const {
  if (layers_.empty()) return {};
  double aux = 0, z = 0, max_load = 0, min_load = INFINITY, dropped = 0, routed = 0;
  double max_rank = 0, min_rank = INFINITY;
  for (const auto& [layer, l] : layers_) {
    if (l.micro_batches > 0) {
      aux += l.aux_loss / double(l.micro_batches);
      z += l.z_loss / double(l.micro_batches);
    }
    double kept = 0;
    for (int64_t c : l.tokens_per_expert) kept += double(c);
    const double E = double(l.tokens_per_expert.size());
    if (kept > 0)
      for (int64_t c : l.tokens_per_expert) {
        const double load = double(c) / kept * E;  // the share over the fair share 1/E
        max_load = std::max(max_load, load);
        min_load = std::min(min_load, load);
      }
    const int64_t per_rank = ep > 1 ? int64_t(l.tokens_per_expert.size()) / ep : 0;
    if (kept > 0 && per_rank > 0)
      for (int64_t r = 0; r < ep; ++r) {
        double c = 0;
        for (int64_t e = r * per_rank; e < (r + 1) * per_rank; ++e) c += double(l.tokens_per_expert[size_t(e)]);
        max_rank = std::max(max_rank, c / kept * double(ep));
        min_rank = std::min(min_rank, c / kept * double(ep));
      }
    dropped += double(l.dropped);
    routed += kept + double(l.dropped);
  }
  std::map<std::string, double> m = {{prefix + "/moe_aux_loss", aux},
                                     {prefix + "/moe_z_loss", z},
                                     {prefix + "/moe_dropped_tokens", routed > 0 ? dropped / routed : 0.0}};
  if (std::isfinite(min_load)) {
    m[prefix + "/moe_max_load"] = max_load;
    m[prefix + "/moe_min_load"] = min_load;
  }
  if (std::isfinite(min_rank)) {
    m[prefix + "/moe_ep_max_rank_load"] = max_rank;
    m[prefix + "/moe_ep_min_rank_load"] = min_rank;
  }
  return m;
}

}  // namespace kestrel::train
