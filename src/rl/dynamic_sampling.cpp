#include "rl/dynamic_sampling.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "rl/distributed.h"
#include "rl/trainer.h"

namespace kestrel::rl {

namespace {

// The per-token arrays a batch carries while it is being filtered.
std::vector<std::vector<double> RolloutBatch::*> token_arrays() {
  return {&RolloutBatch::rollout_logp, &RolloutBatch::old_logp, &RolloutBatch::ref_logp,
          &RolloutBatch::advantages,   &RolloutBatch::returns,  &RolloutBatch::token_rewards};
}

}  // namespace

Result<std::vector<double>> filter_metric_values(const std::string& metric, const RolloutBatch& b,
                                                 const std::vector<nlohmann::ordered_json>& extra) {
  std::vector<double> v(size_t(b.size()), 0.0);
  if (metric == "seq_reward" || metric == "seq_final_reward") {
    for (int64_t i = 0; i < b.size(); ++i) {
      // token_level_scores carry the score on the last token; token_level_rewards add the in-reward KL.
      double s = b.scores[size_t(i)];
      if (metric == "seq_final_reward" && b.layout.length(i) > 0 && !b.token_rewards.empty()) {
        s = 0;
        for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) s += b.token_rewards[size_t(t)];
      }
      v[size_t(i)] = s;
    }
    return v;
  }
  for (int64_t i = 0; i < b.size(); ++i) {
    const nlohmann::ordered_json* e = size_t(i) < extra.size() && extra[size_t(i)].is_object() ? &extra[size_t(i)] : nullptr;
    if (!e || !e->contains(metric)) {
      std::string keys;
      if (e)
        for (auto it = e->begin(); it != e->end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
      return KS_ERR("algorithm.filter_groups.metric=", metric, ": response ", i,
                    " has no such reward_extra_info key (it has: ", keys.empty() ? "none" : keys,
                    "); use seq_reward, seq_final_reward, or a key the reward gives (reward_manager=dapo always "
                    "gives acc)");
    }
    const auto& x = (*e)[metric];
    if (x.is_boolean()) v[size_t(i)] = x.get<bool>() ? 1.0 : 0.0;
    else if (x.is_number()) v[size_t(i)] = x.get<double>();
    else
      return KS_ERR("algorithm.filter_groups.metric=", metric, ": response ", i, " has a non-numeric value ",
                    x.dump(), "; the metric's std over a group must be computable");
  }
  return v;
}

std::vector<int64_t> groups_with_spread(const std::vector<int64_t>& group, const std::vector<double>& metric) {
  KS_CHECK(group.size() == metric.size(), "filter_groups: ", group.size(), " groups for ", metric.size(), " values");
  std::vector<int64_t> order;                       // group ids, first appearance
  std::map<int64_t, std::vector<double>> vals;
  for (size_t i = 0; i < group.size(); ++i) {
    auto [it, fresh] = vals.try_emplace(group[i]);
    if (fresh) order.push_back(group[i]);
    it->second.push_back(metric[i]);
  }
  std::vector<int64_t> keep;
  for (int64_t g : order) {
    const std::vector<double>& x = vals[g];
    double mean = 0;
    for (double a : x) mean += a;
    mean /= double(x.size());
    double var = 0;
    for (double a : x) var += (a - mean) * (a - mean);
    const double std = std::sqrt(var / double(x.size()));  // np.std: population
    if (std > 0 || x.size() == 1) keep.push_back(g);
  }
  return keep;
}

RolloutBatch select_groups(const RolloutBatch& b, const std::vector<int64_t>& keep, int64_t first_group) {
  std::map<int64_t, int64_t> renumber;
  for (int64_t g : keep) renumber.emplace(g, -1);
  RolloutBatch out;
  out.weight_version = b.weight_version;
  int64_t next = first_group;
  std::vector<int64_t> seqs;
  for (int64_t i = 0; i < b.size(); ++i) {
    auto it = renumber.find(b.group[size_t(i)]);
    if (it == renumber.end()) continue;
    if (it->second < 0) it->second = next++;
    seqs.push_back(i);
    out.prompts.push_back(b.prompts[size_t(i)]);
    out.responses.push_back(b.responses[size_t(i)]);
    out.group.push_back(it->second);
    if (!b.scores.empty()) out.scores.push_back(b.scores[size_t(i)]);
    if (b.has_routing()) out.routed_experts.push_back(b.routed_experts[size_t(i)]);
  }
  out.routed_layers = b.routed_layers, out.routed_topk = b.routed_topk, out.routing_source = b.routing_source;
  out.finalize_layout();
  for (auto arr : token_arrays()) {
    const std::vector<double>& src = b.*arr;
    if (src.empty()) continue;
    std::vector<double>& dst = out.*arr;
    for (int64_t i : seqs) dst.insert(dst.end(), src.begin() + b.layout.begin(i), src.begin() + b.layout.end(i));
  }
  return out;
}

void append_batch(RolloutBatch& acc, const RolloutBatch& b) {
  if (acc.size() == 0) {
    acc = b;
    return;
  }
  KS_CHECK(acc.weight_version == b.weight_version, "filter_groups: generation batches of different weights");
  for (auto arr : token_arrays())
    KS_CHECK((acc.*arr).empty() == (b.*arr).empty(), "filter_groups: generation batches carry different arrays");
  acc.prompts.insert(acc.prompts.end(), b.prompts.begin(), b.prompts.end());
  acc.responses.insert(acc.responses.end(), b.responses.begin(), b.responses.end());
  acc.group.insert(acc.group.end(), b.group.begin(), b.group.end());
  acc.scores.insert(acc.scores.end(), b.scores.begin(), b.scores.end());
  for (auto arr : token_arrays()) (acc.*arr).insert((acc.*arr).end(), (b.*arr).begin(), (b.*arr).end());
  KS_CHECK(acc.has_routing() == b.has_routing() && acc.routing_source == b.routing_source,
           "filter_groups: generation batches carry different MoE routing records");
  acc.routed_experts.insert(acc.routed_experts.end(), b.routed_experts.begin(), b.routed_experts.end());
  acc.finalize_layout();
}

DynamicSampler::DynamicSampler(FilterGroupsOptions opt, int64_t train_batch_size)
    : opt_(std::move(opt)), train_batch_size_(train_batch_size) {}

Result<bool> DynamicSampler::add(const RolloutBatch& b, const std::vector<double>& metric) {
  ++num_gen_batches_;
  const std::vector<int64_t> keep = groups_with_spread(b.group, metric);
  num_prompt_in_batch_ += int64_t(keep.size());
  const RolloutBatch sel = select_groups(b, keep, num_prompt_in_batch_ - int64_t(keep.size()));
  if (sel.size() > 0) append_batch(kept_, sel);
  if (num_prompt_in_batch_ >= train_batch_size_) return true;
  if (opt_.max_num_gen_batches <= 0 || num_gen_batches_ < opt_.max_num_gen_batches) return false;
  return KS_ERR("num_gen_batches=", num_gen_batches_, " >= max_num_gen_batches=", opt_.max_num_gen_batches,
                ". Generated too many. Please check if your data are too difficult. You could also try set "
                "max_num_gen_batches=0 to enable endless trials. (algorithm.filter_groups.max_num_gen_batches; ",
                num_prompt_in_batch_, " of data.train_batch_size=", train_batch_size_,
                " groups had a non-zero std of algorithm.filter_groups.metric=", opt_.metric, ")");
}

RolloutBatch DynamicSampler::take() {
  std::vector<int64_t> first;
  for (int64_t g = 0; g < train_batch_size_; ++g) first.push_back(g);
  RolloutBatch out = select_groups(kept_, first, 0);
  kept_ = RolloutBatch{};
  return out;
}

// ---- The loop (verl's fit(): `continue` to the next data-loader batch until enough groups).

bool RlTrainer::generate_filtered(RolloutBatch& out, std::map<std::string, double>& m) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  DynamicSampler sampler(opt_.filter_groups, opt_.train_batch_size);
  double t_gen = 0, t_reward = 0, t_old = 0, t_ref = 0;
  for (int64_t j = 0;; ++j) {
    const std::vector<int64_t> idx = source_->next_batch();
    // verl runs total_epochs passes over the data loader; dynamic sampling can use them up before total_steps.
    if (opt_.total_epochs > 0 && source_->epoch() >= opt_.total_epochs) return false;
    auto t0 = Clock::now();
    // The first batch samples as a step without filtering would; later ones
    // draw other seeds (the seed is a function of the step and the prompt's index).
    RolloutBatch b = rollout_->generate(prompt_ids(idx), j == 0 ? step_ : step_ + (j << 32));
    t_gen += secs(t0);
    t0 = Clock::now();
    std::vector<nlohmann::ordered_json> extra;  // world rank 0 only
    compute_rewards(b, idx, m, &extra);
    t_reward += secs(t0);
    if (opt_.use_kl_in_reward) {  // verl: the KL-related log-probs before filtering, when the reward needs them
      t0 = Clock::now();
      if (opt_.rollout_corr.active && opt_.rollout_corr.bypass_mode)
        b.old_logp = b.rollout_logp;  // bypass mode: the rollout's log-probs are the old ones
      else
        compute_log_probs(b, true, false);
      t_old += secs(t0);
      t0 = Clock::now();
      compute_log_probs(b, false, true);
      t_ref += secs(t0);
      apply_kl_penalty(b, m);
    }
    // The metric is computed on world rank 0 (the reward's extra info lives
    // there) and broadcast, so every rank keeps the same groups.
    std::vector<double> metric;
    std::string error;
    if (is_world_leader()) {
      auto v = filter_metric_values(opt_.filter_groups.metric, b, extra);
      if (v) metric = std::move(v).value();
      else error = v.status().message();
    }
    std::vector<double> failed{error.empty() ? 0.0 : 1.0};
    broadcast_doubles(*opt_.parallel.world, failed);
    if (failed[0] != 0) KS_FAIL(error.empty() ? "algorithm.filter_groups.metric: see world rank 0's error" : error);
    broadcast_doubles(*opt_.parallel.world, metric);
    auto done = sampler.add(b, metric);
    if (!done) KS_FAIL(done.status().message());
    if (*done) break;
    if (opt_.progress && is_world_leader())
      std::fprintf(stderr, "\nfilter_groups: num_prompt_in_batch=%lld < prompt_bsz=%lld; num_gen_batches=%lld. "
                           "Keep generating...\n",
                   (long long)sampler.num_prompt_in_batch(), (long long)opt_.train_batch_size,
                   (long long)sampler.num_gen_batches());
  }
  out = sampler.take();
  m["timing_s/gen"] = t_gen;
  m["timing_s/reward"] = t_reward;
  if (opt_.use_kl_in_reward) {
    m["timing_s/old_log_prob"] = t_old;
    m["timing_s/ref"] = t_ref;
  }
  m["train/num_gen_batches"] = double(sampler.num_gen_batches());
  return true;
}

}  // namespace kestrel::rl
