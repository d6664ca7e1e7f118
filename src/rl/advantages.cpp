#include "rl/advantages.h"

#include <cmath>
#include <map>

namespace kestrel::rl {

Result<AdvEstimator> parse_adv_estimator(const std::string& n) {
  if (n == "grpo") return AdvEstimator::GRPO;
  if (n == "rloo") return AdvEstimator::RLOO;
  if (n == "reinforce_plus_plus") return AdvEstimator::ReinforcePP;
  if (n == "reinforce_plus_plus_baseline") return AdvEstimator::ReinforcePPBaseline;
  if (n == "gae") return AdvEstimator::GAE;
  return KS_ERR("algorithm.adv_estimator: '", n,
                "' is not supported yet; supported: grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, gae");
}

const char* adv_estimator_name(AdvEstimator e) {
  switch (e) {
    case AdvEstimator::GRPO: return "grpo";
    case AdvEstimator::RLOO: return "rloo";
    case AdvEstimator::ReinforcePP: return "reinforce_plus_plus";
    case AdvEstimator::ReinforcePPBaseline: return "reinforce_plus_plus_baseline";
    case AdvEstimator::GAE: return "gae";
  }
  return "?";
}

double masked_mean(const std::vector<double>& x, const std::vector<double>& m) {
  double s = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += x[i] * m[i];
    n += m[i];
  }
  return s / (n + 1e-8);
}

double masked_var(const std::vector<double>& x, const std::vector<double>& m) {
  const double mean = masked_mean(x, m);
  double s = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += (x[i] - mean) * (x[i] - mean) * m[i];
    n += m[i];
  }
  KS_CHECK(n > 1, "masked_var needs at least 2 unmasked values (verl raises here too)");
  return s / (n + 1e-8) * (n / (n - 1));
}

std::vector<double> masked_whiten(const std::vector<double>& x, const std::vector<double>& m, bool shift_mean) {
  const double mean = masked_mean(x, m), var = masked_var(x, m);
  const double inv = 1.0 / std::sqrt(var + 1e-8);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = (x[i] - mean) * inv + (shift_mean ? 0.0 : mean);
  return out;
}

namespace {

struct GroupStats {
  double mean = 0, std = 1;
  int64_t n = 0;
};

// Per-sequence outcome score R_i = sum_t r_{i,t} (the whole score sits on the last token).
std::vector<double> sequence_scores(const AdvantageInput& in) {
  const Ragged& L = *in.layout;
  std::vector<double> R(size_t(L.num_seqs()), 0.0);
  for (int64_t i = 0; i < L.num_seqs(); ++i)
    for (int64_t t = L.begin(i); t < L.end(i); ++t) R[size_t(i)] += (*in.token_rewards)[size_t(t)];
  return R;
}

std::map<int64_t, GroupStats> group_stats(const std::vector<double>& R, const std::vector<int64_t>& group) {
  std::map<int64_t, std::vector<double>> members;
  for (size_t i = 0; i < R.size(); ++i) members[group[i]].push_back(R[i]);
  std::map<int64_t, GroupStats> out;
  for (auto& [g, v] : members) {
    GroupStats s;
    s.n = int64_t(v.size());
    if (v.size() == 1) {  // verl: a single sample has mean 0 and std 1
      s.mean = 0;
      s.std = 1;
    } else {
      double sum = 0;
      for (double x : v) sum += x;
      s.mean = sum / double(v.size());
      double ss = 0;
      for (double x : v) ss += (x - s.mean) * (x - s.mean);
      s.std = std::sqrt(ss / double(v.size() - 1));  // torch.std: unbiased
    }
    out[g] = s;
  }
  return out;
}

std::vector<double> ones_or(const std::vector<double>* m, size_t n) { return m ? *m : std::vector<double>(n, 1.0); }

}  // namespace

AdvantageOutput compute_advantages(AdvEstimator est, const AdvantageInput& in) {
  KS_CHECK(in.layout && in.token_rewards, "compute_advantages: layout and token_rewards are required");
  const Ragged& L = *in.layout;
  const size_t T = size_t(L.num_tokens());
  KS_CHECK(in.token_rewards->size() == T, "token_rewards has ", in.token_rewards->size(), " values for ", T, " tokens");
  const std::vector<double> m = ones_or(in.mask, T);
  AdvantageOutput out;
  out.advantages.assign(T, 0.0);

  auto broadcast = [&](const std::vector<double>& per_seq) {
    for (int64_t i = 0; i < L.num_seqs(); ++i)
      for (int64_t t = L.begin(i); t < L.end(i); ++t) out.advantages[size_t(t)] = per_seq[size_t(i)] * m[size_t(t)];
  };

  switch (est) {
    case AdvEstimator::GRPO:
    case AdvEstimator::RLOO:
    case AdvEstimator::ReinforcePPBaseline: {
      KS_CHECK(in.group && int64_t(in.group->size()) == L.num_seqs(), "group ids required, one per response");
      const auto R = sequence_scores(in);
      const auto stats = group_stats(R, *in.group);
      std::vector<double> A(R.size());
      for (size_t i = 0; i < R.size(); ++i) {
        const GroupStats& s = stats.at((*in.group)[i]);
        if (est == AdvEstimator::GRPO) {
          A[i] = in.norm_adv_by_std_in_grpo ? (R[i] - s.mean) / (s.std + 1e-6) : R[i] - s.mean;
        } else if (est == AdvEstimator::RLOO) {
          const double n = double(s.n);
          A[i] = s.n > 1 ? R[i] * n / (n - 1) - s.mean * n / (n - 1) : R[i];
        } else {
          A[i] = R[i] - s.mean;
        }
      }
      broadcast(A);
      if (est == AdvEstimator::ReinforcePPBaseline) {
        out.advantages = masked_whiten(out.advantages, m);
        for (size_t t = 0; t < T; ++t) out.advantages[t] *= m[t];
      }
      out.returns = out.advantages;
      break;
    }
    case AdvEstimator::ReinforcePP: {
      std::vector<double> G(T, 0.0);
      for (int64_t i = 0; i < L.num_seqs(); ++i) {
        double running = 0;
        for (int64_t t = L.end(i) - 1; t >= L.begin(i); --t) {
          running = (*in.token_rewards)[size_t(t)] + in.gamma * running;
          G[size_t(t)] = running;
          running *= m[size_t(t)];  // reset after EOS, as verl does
        }
      }
      out.returns = G;
      out.advantages = masked_whiten(G, m);
      for (size_t t = 0; t < T; ++t) out.advantages[t] *= m[t];
      break;
    }
    case AdvEstimator::GAE: {
      KS_CHECK(in.values && in.values->size() == T, "gae needs critic values, one per token");
      const auto& V = *in.values;
      const auto& r = *in.token_rewards;
      std::vector<double> A(T, 0.0);
      for (int64_t i = 0; i < L.num_seqs(); ++i) {
        double nextvalues = 0, lastgaelam = 0;
        for (int64_t t = L.end(i) - 1; t >= L.begin(i); --t) {
          const size_t k = size_t(t);
          const double delta = r[k] + in.gamma * nextvalues - V[k];
          const double gae = delta + in.gamma * in.lam * lastgaelam;
          nextvalues = V[k] * m[k] + (1 - m[k]) * nextvalues;
          lastgaelam = gae * m[k] + (1 - m[k]) * lastgaelam;
          A[k] = lastgaelam;
        }
      }
      out.returns.resize(T);
      for (size_t t = 0; t < T; ++t) out.returns[t] = A[t] + V[t];
      out.advantages = masked_whiten(A, m);
      break;
    }
  }
  return out;
}

}  // namespace kestrel::rl
