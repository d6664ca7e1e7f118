// RlTrainer::validate (verl's _validate): the rollout worker generates on the
// validation prompts with val_kwargs, scored on world rank 0, reported per data source as
// mean@N, best@N, worst@N, maj@N and std@N.
#include "rl/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "rl/distributed.h"
#include "rl/reward_rules.h"

namespace kestrel::rl {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

double majority_vote_accuracy(const std::vector<std::pair<std::string, double>>& samples) {
  KS_CHECK(!samples.empty(), "majority vote over no samples");
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> votes;  // pred -> (count, first acc)
  for (const auto& [pred, acc] : samples) {
    auto it = std::find_if(votes.begin(), votes.end(), [&](const auto& e) { return e.first == pred; });
    if (it == votes.end()) votes.push_back({pred, {1, acc}});
    else ++it->second.first;
  }
  auto top = votes.begin();
  for (auto it = votes.begin(); it != votes.end(); ++it)
    if (it->second.first > top->second.first) top = it;
  return top->second.second;
}

std::map<std::string, double> RlTrainer::validate() {
  std::map<std::string, double> out;
  if (val_.empty()) return out;
  const auto t0 = Clock::now();
  std::vector<std::vector<int32_t>> prompts;
  for (const RlPrompt& v : val_) prompts.push_back(v.ids);
  // Each rollout group generates a share; world rank 0 scores everything
  // (the other ranks return no metrics: only rank 0 logs).
  // Disaggregated: the rollout ranks generate them with the weights last sent (rl/disaggregated.h).
  // (only the trainer leader talks to them; the other trainer ranks return no metrics either way).
  const std::vector<WireResponse> all = rollout_  ? rollout_->generate_validation(prompts)
                                        : remote_ ? remote_->receive_validation()
                                                  : std::vector<WireResponse>{};
  actor_->release_device_memory();  // param_offload: generation read the actor's weights in place
  if (!is_world_leader()) return out;
  std::vector<RewardRequest> reqs;
  std::vector<size_t> owner;
  double len = 0;
  for (const WireResponse& w : all) {
    const RlPrompt& v = val_[size_t(w.prompt)];
    reqs.push_back({v.data_source, decode_(w.tokens), v.ground_truth, v.extra_info, int64_t(w.tokens.size())});
    owner.push_back(size_t(w.prompt));
    len += double(w.tokens.size());
  }
  const RewardBatchResult r = reward_->score_here(reqs);
  // Per data source: the accuracy and the extracted answer ("pred", the
  // majority-vote key) of every sample, grouped by prompt.
  struct Sample {
    double acc;
    std::string pred;
  };
  std::map<std::string, std::map<size_t, std::vector<Sample>>> acc;
  // verl's other validation variables: the reward and each numeric
  // reward_extra_info key (score, overlong_reward, ...), as mean@N per data source.
  std::map<std::string, std::map<std::string, std::pair<double, double>>> aux;  // ds -> var -> (sum, count)
  for (size_t j = 0; j < reqs.size(); ++j) {
    auto& vars = aux[reqs[j].data_source];
    vars["reward"].first += r.scores[j];
    vars["reward"].second += 1;
    if (r.extra[j].is_object())
      for (auto it = r.extra[j].begin(); it != r.extra[j].end(); ++it) {
        if (it.key() == "acc" || !(it.value().is_number() || it.value().is_boolean())) continue;
        vars[it.key()].first += it.value().is_boolean() ? (it.value().get<bool>() ? 1.0 : 0.0) : it.value().get<double>();
        vars[it.key()].second += 1;
      }
  }
  for (size_t j = 0; j < reqs.size(); ++j) {
    double a = r.scores[j];
    std::string pred;
    if (r.extra[j].is_object() && r.extra[j].contains("acc")) {
      const auto& x = r.extra[j]["acc"];  // math_dapo gives a bool, as verl's dict does
      if (x.is_number()) a = x.get<double>();
      else if (x.is_boolean()) a = x.get<bool>() ? 1.0 : 0.0;
    }
    if (r.extra[j].is_object() && r.extra[j].contains("pred"))
      pred = r.extra[j]["pred"].is_string() ? r.extra[j]["pred"].get<std::string>() : r.extra[j]["pred"].dump();
    else if (auto p = rule_prediction(reqs[j].data_source, reqs[j].solution_str))
      pred = *p;
    acc[reqs[j].data_source][owner[j]].push_back({a, pred});
  }
  const std::string N = std::to_string(opt_.val_n);
  for (const auto& [src, groups] : acc) {
    double mean = 0, best = 0, worst = 0, maj = 0, std_sum = 0, count = 0;
    for (const auto& [k, v] : groups) {
      double lo = v[0].acc, hi = v[0].acc, m1 = 0, m2 = 0;
      for (const Sample& x : v) {
        mean += x.acc, count += 1, m1 += x.acc, m2 += x.acc * x.acc;
        lo = std::min(lo, x.acc), hi = std::max(hi, x.acc);
      }
      best += hi;
      worst += lo;
      m1 /= double(v.size());
      std_sum += std::sqrt(std::max(0.0, m2 / double(v.size()) - m1 * m1));  // np.std (population)
      std::vector<std::pair<std::string, double>> pv;
      for (const Sample& x : v) pv.push_back({x.pred, x.acc});
      maj += majority_vote_accuracy(pv);
    }
    const std::string p = "val-core/" + src + "/acc/";
    const double G = double(groups.size());
    out[p + "mean@" + N] = mean / count;
    if (opt_.val_n > 1) {
      out[p + "best@" + N + "/mean"] = best / G;
      out[p + "maj@" + N + "/mean"] = maj / G;
      out["val-aux/" + src + "/acc/worst@" + N + "/mean"] = worst / G;
      out["val-aux/" + src + "/acc/std@" + N] = std_sum / G;
    }
  }
  for (const auto& [src, vars] : aux)
    for (const auto& [k, sc] : vars) out["val-aux/" + src + "/" + k + "/mean@" + N] = sc.first / sc.second;
  out["val-aux/response_length/mean"] = reqs.empty() ? 0.0 : len / double(reqs.size());
  for (const auto& [k, v] : RewardManager::metrics(r.failures)) out["val-aux/" + k] = v;
  out["timing_s/testing"] = seconds_since(t0);
  if (first_val_.empty()) first_val_ = out;
  last_val_ = out;
  return out;
}

}  // namespace kestrel::rl
