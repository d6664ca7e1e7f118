#include "rl/rollout_correction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace kestrel::rl {

namespace {

// verl's SAFETY_BOUND: log ratios are clamped to +-20 before exponentiating.
constexpr double kSafety = 20.0;
const std::string kIs = "algorithm.rollout_correction.rollout_is";
const std::string kRs = "algorithm.rollout_correction.rollout_rs";
const std::string kRsT = "algorithm.rollout_correction.rollout_rs_threshold";

double clamp20(double x) { return std::clamp(x, -kSafety, kSafety); }

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, e - a + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');)
    if (!trim(part).empty()) out.push_back(trim(part));
  return out;
}

Result<double> positive(const std::string& text, const std::string& option) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    return KS_ERR(kRsT, ": invalid numeric threshold '", text, "' for option '", option, "'");
  if (v <= 0) return KS_ERR(kRsT, ": thresholds for option '", option, "' must be positive, got ", text);
  return v;
}

// Per-sequence masked reductions (verl_F.masked_sum / masked_mean over axis -1;
// masked_mean divides by count + 1e-8, so an empty sequence gives 0).
struct SeqView {
  const Ragged& L;
  const std::vector<double>& m;
  double count(int64_t i) const {
    double n = 0;
    for (int64_t t = L.begin(i); t < L.end(i); ++t) n += m[size_t(t)];
    return n;
  }
  double sum(int64_t i, const std::vector<double>& x) const {
    double s = 0;
    for (int64_t t = L.begin(i); t < L.end(i); ++t) s += x[size_t(t)] * m[size_t(t)];
    return s;
  }
  double mean(int64_t i, const std::vector<double>& x) const { return sum(i, x) / (count(i) + 1e-8); }
};

double masked_mean(const std::vector<double>& x, const std::vector<double>& m) {
  double s = 0, n = 0;
  for (size_t t = 0; t < x.size(); ++t) s += x[t] * m[t], n += m[t];
  return s / (n + 1e-8);
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// torch's Tensor.std(): unbiased.
double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double mu = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - mu) * (x - mu);
  return std::sqrt(s / double(v.size() - 1));
}

// sqrt(max(E[c^2] - E[c]^2, 0)) of x clamped to [lo, hi], masked (verl's *_std metrics); 0 for <= 1 valid token.
double clamped_std(const std::vector<double>& x, const std::vector<double>& m, double lo, double hi) {
  double n = 0;
  for (double v : m) n += v;
  if (n <= 1) return 0.0;
  std::vector<double> c(x.size()), c2(x.size());
  for (size_t t = 0; t < x.size(); ++t) c[t] = std::clamp(x[t], lo, hi), c2[t] = c[t] * c[t];
  const double mu = masked_mean(c, m);
  return std::sqrt(std::max(masked_mean(c2, m) - mu * mu, 0.0));
}

double masked_max(const std::vector<double>& x, const std::vector<double>& m) {
  double r = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < x.size(); ++t)
    if (m[t] > 0) r = std::max(r, x[t]);
  return r;
}
double masked_min(const std::vector<double>& x, const std::vector<double>& m) {
  double r = std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < x.size(); ++t)
    if (m[t] > 0) r = std::min(r, x[t]);
  return r;
}

// verl's compute_rollout_correction_weights + compute_is_metrics. lr: [N] log(pi_train / pi_rollout).
std::vector<double> is_weights(const RolloutCorrectionConfig& cfg, const Ragged& L, const std::vector<double>& lr,
                               const std::vector<double>& m, std::map<std::string, double>& out) {
  const SeqView sv{L, m};
  const double T = cfg.rollout_is_threshold, Tlo = 1.0 / T;
  const size_t N = lr.size();
  const int64_t B = L.num_seqs();
  std::vector<double> w(N, 0.0);
  std::vector<double> seq_lr;  // [B] sequence level: sum of the log ratios (unclamped)
  if (cfg.rollout_is == IsLevel::Token) {
    for (size_t t = 0; t < N; ++t) w[t] = std::exp(clamp20(lr[t])) * m[t];
  } else {
    for (int64_t i = 0; i < B; ++i) {
      seq_lr.push_back(sv.sum(i, lr));
      const double wi = std::exp(clamp20(seq_lr.back()));
      for (int64_t t = L.begin(i); t < L.end(i); ++t) w[size_t(t)] = wi * m[size_t(t)];
    }
  }
  // Metrics on the weights before truncation.
  auto& M = out;
  M["rollout_is_mean"] = masked_mean(w, m);
  if (cfg.rollout_is == IsLevel::Sequence) {
    const double lmax = *std::max_element(seq_lr.begin(), seq_lr.end());
    const double lmin = *std::min_element(seq_lr.begin(), seq_lr.end());
    M["rollout_is_max"] = std::exp(std::min(lmax, kSafety));
    M["rollout_is_min"] = std::exp(lmin);
    double hi = 0, lo = 0;
    for (double s : seq_lr) hi += s > std::log(T) ? 1 : 0, lo += s < std::log(Tlo) ? 1 : 0;
    M["rollout_is_ratio_fraction_high"] = hi / double(B);
    M["rollout_is_ratio_fraction_low"] = lo / double(B);
  } else {
    std::vector<double> hi(N), lo(N);
    for (size_t t = 0; t < N; ++t) hi[t] = w[t] > T ? 1 : 0, lo[t] = w[t] < Tlo ? 1 : 0;
    M["rollout_is_ratio_fraction_high"] = masked_mean(hi, m);
    M["rollout_is_ratio_fraction_low"] = masked_mean(lo, m);
    M["rollout_is_max"] = masked_max(w, m);
    M["rollout_is_min"] = masked_min(w, m);
  }
  M["rollout_is_std"] = clamped_std(w, m, Tlo, T);
  {  // effective sample size of the weights clamped to [1/T, T], normalised to mean 1
    std::vector<double> c(N), c2(N);
    for (size_t t = 0; t < N; ++t) c[t] = std::clamp(w[t], Tlo, T);
    const double mu = masked_mean(c, m);
    for (size_t t = 0; t < N; ++t) c2[t] = (c[t] / (mu + 1e-8)) * (c[t] / (mu + 1e-8));
    M["rollout_is_eff_sample_size"] = 1.0 / masked_mean(c2, m);
  }
  std::vector<double> seq_w(static_cast<size_t>(B));  // [B] per-sequence mean weight
  for (int64_t i = 0; i < B; ++i) seq_w[size_t(i)] = sv.mean(i, w);
  M["rollout_is_seq_mean"] = mean_of(seq_w);
  M["rollout_is_seq_std"] = std_of(seq_w);
  M["rollout_is_seq_max"] = *std::max_element(seq_w.begin(), seq_w.end());
  M["rollout_is_seq_min"] = *std::min_element(seq_w.begin(), seq_w.end());
  double dev = 0, fh = 0, fl = 0;
  for (double s : seq_w) dev = std::max(dev, std::abs(s - 1.0)), fh += s > T ? 1 : 0, fl += s < Tlo ? 1 : 0;
  M["rollout_is_seq_max_deviation"] = dev;
  M["rollout_is_seq_fraction_high"] = fh / double(B);
  M["rollout_is_seq_fraction_low"] = fl / double(B);

  for (double& x : w) x = std::min(x, T);  // truncation (TIS)
  if (cfg.rollout_is_batch_normalize) {
    double mean = 0;
    if (cfg.rollout_is == IsLevel::Token) {
      mean = masked_mean(w, m);
    } else {  // one weight per sequence with a valid token
      double s = 0, n = 0;
      for (int64_t i = 0; i < B; ++i)
        if (sv.count(i) > 0) s += sv.mean(i, w), n += 1;
      mean = s / std::max(n, 1e-8);
    }
    if (mean > 1e-8) {
      for (double& x : w) x /= mean;
      M["rollout_is_batch_norm_factor"] = mean;
    } else {
      M["rollout_is_batch_norm_factor"] = 1.0;
    }
  }
  return w;
}

// verl's compute_rs_metrics for one option. stat: [N] per-token statistic (a
// sequence's value on each of its tokens at sequence level); seq: [B] per-sequence values.
void rs_metrics(const RsOption& o, const std::vector<double>& stat, const std::vector<double>& seq,
                const std::vector<double>& seq_valid, const std::vector<double>& m, double upper, double lower,
                std::map<std::string, double>& M) {
  const std::string p = "rollout_rs_" + o.name;
  const bool k1 = o.k == 1, seq_level = o.agg != RsOption::Agg::Token;
  std::vector<double> sv;  // values of the sequences with a valid token
  for (size_t i = 0; i < seq.size(); ++i)
    if (seq_valid[i] > 0) sv.push_back(seq[i]);
  M[p + "_mean"] = masked_mean(stat, m);
  auto frac = [](const std::vector<double>& v, auto pred) {
    double n = 0;
    for (double x : v) n += pred(x) ? 1 : 0;
    return n / double(v.size());
  };
  if (seq_level && !sv.empty()) {
    M[p + "_max"] = *std::max_element(sv.begin(), sv.end());
    M[p + "_min"] = *std::min_element(sv.begin(), sv.end());
    M[p + "_fraction_high"] = frac(sv, [&](double x) { return x > upper; });
    M[p + "_fraction_low"] = k1 ? frac(sv, [&](double x) { return x < lower; }) : 0.0;
  } else {
    M[p + "_max"] = masked_max(stat, m);
    M[p + "_min"] = masked_min(stat, m);
    std::vector<double> hi(stat.size()), lo(stat.size());
    for (size_t t = 0; t < stat.size(); ++t) hi[t] = stat[t] > upper ? 1 : 0, lo[t] = stat[t] < lower ? 1 : 0;
    M[p + "_fraction_high"] = masked_mean(hi, m);
    M[p + "_fraction_low"] = k1 ? masked_mean(lo, m) : 0.0;
  }
  M[p + "_std"] = clamped_std(stat, m, k1 ? lower : 0.0, upper);
  if (!sv.empty()) {
    M[p + "_seq_mean"] = mean_of(sv);
    M[p + "_seq_std"] = std_of(sv);
    M[p + "_seq_max"] = *std::max_element(sv.begin(), sv.end());
    M[p + "_seq_min"] = *std::min_element(sv.begin(), sv.end());
    double dev = 0;
    for (double x : sv) dev = std::max(dev, std::abs(x));
    M[p + "_seq_max_deviation"] = dev;
    M[p + "_seq_fraction_high"] = frac(sv, [&](double x) { return x > upper; });
    if (k1) M[p + "_seq_fraction_low"] = frac(sv, [&](double x) { return x < lower; });
  } else {
    for (const char* s : {"_seq_mean", "_seq_std", "_seq_max", "_seq_min", "_seq_max_deviation",
                          "_seq_fraction_high", "_seq_fraction_low"})
      M[p + s] = 0.0;
  }
}

// verl's compute_rollout_rejection_mask: the mask with rejected tokens 0.
std::vector<double> rejection_mask(const std::vector<RsOption>& opts, const Ragged& L, const std::vector<double>& lr,
                                   const std::vector<double>& m, std::map<std::string, double>& M) {
  const size_t N = lr.size();
  const int64_t B = L.num_seqs();
  const SeqView sv{L, m};
  std::vector<double> k[4];  // k[1..3]: [N] per-token divergences of the clamped log ratio
  for (int j = 1; j <= 3; ++j) k[j].resize(N);
  for (size_t t = 0; t < N; ++t) {
    const double x = clamp20(lr[t]);
    k[1][t] = -x;
    k[2][t] = 0.5 * x * x;
    k[3][t] = std::exp(x) - 1.0 - x;
  }
  std::vector<double> seq_valid(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) seq_valid[size_t(i)] = sv.count(i) > 0 ? 1 : 0;
  std::vector<double> combined(N, 1.0);
  for (const RsOption& o : opts) {
    const bool k1 = o.k == 1;
    const double upper = k1 ? std::log(o.upper) : o.upper, lower = k1 ? std::log(o.lower) : 0.0;
    auto keep = [&](double s) { return k1 ? (s >= lower && s <= upper) : s <= upper; };
    const std::vector<double>& tok = k[o.k];
    std::vector<double> stat(N), seq(static_cast<size_t>(B)), keep_t(N);
    if (o.agg == RsOption::Agg::Token) {
      stat = tok;
      for (int64_t i = 0; i < B; ++i) seq[size_t(i)] = sv.mean(i, tok);
      for (size_t t = 0; t < N; ++t) keep_t[t] = keep(tok[t]) ? 1 : 0;
    } else {
      for (int64_t i = 0; i < B; ++i) {
        double s = 0;
        if (o.agg == RsOption::Agg::SeqSum) {
          s = sv.sum(i, tok);
        } else if (o.agg == RsOption::Agg::SeqMean) {
          s = sv.mean(i, tok);
        } else {  // max over valid tokens, 0 for an empty sequence
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t t = L.begin(i); t < L.end(i); ++t)
            if (m[size_t(t)] > 0) mx = std::max(mx, tok[size_t(t)]);
          s = std::isinf(mx) ? 0.0 : mx;
        }
        seq[size_t(i)] = s;
        for (int64_t t = L.begin(i); t < L.end(i); ++t) stat[size_t(t)] = s, keep_t[size_t(t)] = keep(s) ? 1 : 0;
      }
    }
    rs_metrics(o, stat, seq, seq_valid, m, upper, lower, M);
    std::vector<double> rej(N);
    for (size_t t = 0; t < N; ++t) combined[t] *= keep_t[t], rej[t] = 1.0 - keep_t[t];
    double seq_rej = 0, nvalid = 0;
    for (int64_t i = 0; i < B; ++i) {
      if (seq_valid[size_t(i)] <= 0) continue;
      nvalid += 1;
      bool any = false;
      for (int64_t t = L.begin(i); t < L.end(i); ++t) any |= m[size_t(t)] > 0 && keep_t[size_t(t)] <= 0;
      seq_rej += any ? 1 : 0;
    }
    M["rollout_rs_" + o.name + "_masked_fraction"] = masked_mean(rej, m);
    M["rollout_rs_" + o.name + "_seq_masked_fraction"] = nvalid > 0 ? seq_rej / nvalid : 0.0;
  }
  std::vector<double> rej(N), out(N);
  for (size_t t = 0; t < N; ++t) rej[t] = 1.0 - combined[t], out[t] = m[t] * combined[t];
  M["rollout_rs_masked_fraction"] = masked_mean(rej, m);
  double seq_rej = 0;  // over every sequence (verl's .float().mean() over the batch rows)
  for (int64_t i = 0; i < B; ++i) {
    bool any = false;
    for (int64_t t = L.begin(i); t < L.end(i); ++t) any |= m[size_t(t)] > 0 && combined[size_t(t)] <= 0.5;
    seq_rej += any ? 1 : 0;
  }
  M["rollout_rs_seq_masked_fraction"] = B > 0 ? seq_rej / double(B) : 0.0;
  return out;
}

}  // namespace

Result<IsLevel> parse_rollout_is(const std::string& s) {
  if (s.empty() || s == "null") return IsLevel::None;
  if (s == "token") return IsLevel::Token;
  if (s == "sequence") return IsLevel::Sequence;
  return KS_ERR(kIs, ": '", s, "' is not valid; use token, sequence or null (no importance weights)");
}

Result<BypassLoss> parse_bypass_loss(const std::string& s) {
  if (s == "ppo_clip") return BypassLoss::PpoClip;
  if (s == "reinforce") return BypassLoss::Reinforce;
  return KS_ERR("algorithm.rollout_correction.loss_type: '", s, "' is not valid; use ppo_clip or reinforce");
}

Result<std::vector<RsOption>> parse_rollout_rs(const std::string& options, const std::string& thresholds) {
  std::vector<RsOption> out;
  if (options.empty() || options == "null") return out;
  const std::vector<std::string> names = split_commas(options);
  if (names.empty()) return KS_ERR(kRs, ": must contain at least one option");
  static const std::vector<std::string> kSupported = {"token_k1",    "token_k2",    "token_k3",  "seq_sum_k1",
                                                      "seq_sum_k2",  "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                                      "seq_mean_k3", "seq_max_k2", "seq_max_k3"};
  for (const std::string& n : names) {
    if (std::find(kSupported.begin(), kSupported.end(), n) == kSupported.end()) {
      std::string hint;
      if (n == "token" || n == "sequence" || n == "geometric")
        hint = " (verl's earlier levels: token -> token_k1, sequence -> seq_sum_k1, geometric -> seq_mean_k1, with "
               "rollout_rs_threshold=lower_upper)";
      return KS_ERR(kRs, ": invalid option '", n, "'", hint, "; use a comma list of token_k1, token_k2, token_k3, "
                    "seq_sum_k1, seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3, seq_max_k2, seq_max_k3");
    }
    bool seen = false;
    for (const RsOption& o : out) seen |= o.name == n;
    if (seen) continue;
    RsOption o;
    o.name = n;
    o.k = n.back() - '0';
    o.agg = n.rfind("token", 0) == 0      ? RsOption::Agg::Token
            : n.rfind("seq_sum", 0) == 0  ? RsOption::Agg::SeqSum
            : n.rfind("seq_mean", 0) == 0 ? RsOption::Agg::SeqMean
                                          : RsOption::Agg::SeqMax;
    out.push_back(o);
  }
  if (thresholds.empty() || thresholds == "null")
    return KS_ERR(kRsT, " must be set when ", kRs, "=", options, " (e.g. 0.999_1.001 for a k1 option, 0.01 for k2/k3)");
  std::vector<std::string> specs = split_commas(thresholds);
  if (specs.empty()) return KS_ERR(kRsT, ": must contain at least one threshold value");
  if (specs.size() != 1 && specs.size() != out.size())
    return KS_ERR(kRsT, "=", thresholds, ": give one threshold shared by all options or exactly ", out.size(),
                  " (one per option of ", kRs, ")");
  if (specs.size() == 1) specs.assign(out.size(), specs[0]);
  for (size_t j = 0; j < out.size(); ++j) {
    RsOption& o = out[j];
    const std::string& spec = specs[j];
    const size_t us = spec.find('_');
    if (o.k == 1) {
      KS_ASSIGN(o.upper, positive(us == std::string::npos ? spec : spec.substr(us + 1), o.name));
      if (us == std::string::npos) {
        o.lower = 1.0 / o.upper;
      } else {
        KS_ASSIGN(o.lower, positive(spec.substr(0, us), o.name));
      }
    } else {
      if (us != std::string::npos)
        return KS_ERR(kRsT, ": option '", o.name, "' takes a single upper bound without '_', got '", spec, "'");
      KS_ASSIGN(o.upper, positive(spec, o.name));
    }
  }
  return out;
}

std::map<std::string, double> offpolicy_metrics(const Ragged& L, const std::vector<double>& logp,
                                                const std::vector<double>& rollout_logp, const std::vector<double>& m) {
  const SeqView sv{L, m};
  const int64_t B = L.num_seqs();
  const size_t N = logp.size();
  std::map<std::string, double> M;
  std::vector<double> lr(N), diff(N), k3(N), rho2(N);
  for (size_t t = 0; t < N; ++t) {
    lr[t] = logp[t] - rollout_logp[t];
    diff[t] = rollout_logp[t] - logp[t];
    k3[t] = std::exp(lr[t]) - lr[t] - 1.0;
    const double rho = std::exp(clamp20(lr[t]));
    rho2[t] = rho * rho;
  }
  double ppl_t = 0, lppl_t = 0, ppl_r = 0, lppl_r = 0, d = 0, ad = 0, ratio = 0, chi2s = 0;
  double dmax = -std::numeric_limits<double>::infinity(), dmin = -dmax;
  for (int64_t i = 0; i < B; ++i) {
    const double mt = sv.mean(i, logp), mr = sv.mean(i, rollout_logp), di = mr - mt;
    ppl_t += std::exp(-mt), lppl_t += -mt, ppl_r += std::exp(-mr), lppl_r += -mr;
    d += di, ad += std::abs(di), ratio += std::exp(di);
    dmax = std::max(dmax, di), dmin = std::min(dmin, di);
    chi2s += std::exp(2.0 * clamp20(sv.sum(i, lr)));
  }
  const double nb = double(std::max<int64_t>(B, 1));
  M["rollout_corr/training_ppl"] = ppl_t / nb;
  M["rollout_corr/training_log_ppl"] = lppl_t / nb;
  M["rollout_corr/kl"] = masked_mean(diff, m);
  M["rollout_corr/k3_kl"] = masked_mean(k3, m);
  M["rollout_corr/rollout_ppl"] = ppl_r / nb;
  M["rollout_corr/rollout_log_ppl"] = lppl_r / nb;
  M["rollout_corr/log_ppl_diff"] = d / nb;
  M["rollout_corr/log_ppl_abs_diff"] = ad / nb;
  M["rollout_corr/log_ppl_diff_max"] = dmax;
  M["rollout_corr/log_ppl_diff_min"] = dmin;
  M["rollout_corr/ppl_ratio"] = ratio / nb;
  M["rollout_corr/chi2_token"] = masked_mean(rho2, m) - 1.0;
  M["rollout_corr/chi2_seq"] = chi2s / nb - 1.0;
  return M;
}

RolloutCorrectionResult compute_rollout_correction(const RolloutCorrectionConfig& cfg, const Ragged& L,
                                                   const std::vector<double>& logp,
                                                   const std::vector<double>& rollout_logp,
                                                   const std::vector<double>* mask) {
  const size_t N = size_t(L.num_tokens());
  KS_CHECK(logp.size() == N && rollout_logp.size() == N && (!mask || mask->size() == N),
           "rollout correction: per-token arrays must have ", N, " values");
  RolloutCorrectionResult r;
  r.mask = mask ? *mask : std::vector<double>(N, 1.0);
  double valid = 0;
  for (double x : r.mask) valid += x;
  if (valid <= 0) return r;
  const std::vector<double> m = r.mask;
  std::vector<double> lr(N);
  for (size_t t = 0; t < N; ++t) lr[t] = logp[t] - rollout_logp[t];
  std::map<std::string, double> M;
  if (cfg.rollout_is != IsLevel::None) r.is_weights = is_weights(cfg, L, lr, m, M);
  if (cfg.rejects()) r.mask = rejection_mask(cfg.rollout_rs, L, lr, m, M);
  for (const auto& [k, v] : M) r.metrics["rollout_corr/" + k] = v;
  for (const auto& [k, v] : offpolicy_metrics(L, logp, rollout_logp, m)) r.metrics[k] = v;
  return r;
}

std::vector<std::string> rollout_correction_metric_keys(const RolloutCorrectionConfig& cfg) {
  const Ragged L = Ragged::from_lengths({1});
  std::vector<std::string> keys;
  for (const auto& [k, v] : compute_rollout_correction(cfg, L, {0.0}, {0.0}, nullptr).metrics) keys.push_back(k);
  return keys;
}

}  // namespace kestrel::rl
