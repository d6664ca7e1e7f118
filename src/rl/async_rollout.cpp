#include "rl/async_rollout.h"

#include <algorithm>
#include <cmath>

namespace kestrel::rl {

AsyncRollout::AsyncRollout(AsyncRolloutOptions opt, std::function<std::vector<int64_t>()> draw_batch,
                           std::function<const std::vector<int32_t>&(int64_t)> prompt_ids, RoundGenerateFn generate,
                           std::function<int64_t()> weight_version)
    : opt_(opt),
      draw_batch_(std::move(draw_batch)),
      prompt_ids_(std::move(prompt_ids)),
      generate_(std::move(generate)),
      weight_version_(std::move(weight_version)) {
  KS_CHECK(opt_.batch_prompts >= 1 && opt_.n >= 1 && opt_.response_length >= 1, "async rollout: B=",
           opt_.batch_prompts, " n=", opt_.n, " response_length=", opt_.response_length, " must be >= 1");
  KS_CHECK(opt_.staleness_threshold >= 0 && std::isfinite(opt_.staleness_threshold),
           "async_training.staleness_threshold must be >= 0, got ", opt_.staleness_threshold);
  KS_CHECK(opt_.partial_max_split >= 1, "algorithm.partial_rollout_max_split must be >= 1, got ",
           opt_.partial_max_split);
}

int64_t AsyncRollout::pipeline_target(int64_t step) const {
  // A hair below the exact product so t * B = 2.0000000001 is 2 prompts.
  const double prompts = (double(step) + 1.0 + opt_.staleness_threshold) * double(opt_.batch_prompts);
  int64_t target = int64_t(std::floor(prompts + 1e-9));
  if (opt_.total_steps > 0) target = std::min(target, opt_.total_steps * opt_.batch_prompts);
  return std::max(target, (step + 1) * opt_.batch_prompts);
}

int64_t max_staleness(double staleness_threshold, int64_t partial_max_split) {
  return int64_t(std::ceil(staleness_threshold - 1e-9)) + partial_max_split - 1;
}

int64_t AsyncRollout::max_staleness() const {
  return rl::max_staleness(opt_.staleness_threshold, opt_.partial_max_split);
}

void AsyncRollout::draw_groups(int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (store_.drawn().empty()) {
      const std::vector<int64_t> batch = draw_batch_();
      KS_CHECK(int64_t(batch.size()) == opt_.batch_prompts, "async rollout: the prompt source gave ", batch.size(),
               " prompts for a batch of ", opt_.batch_prompts);
      for (int64_t d : batch) store_.drawn().push_back(d);
    }
    StoredGroup g;
    g.stream = store_.next_stream();
    g.prompt = store_.drawn().front();
    store_.drawn().pop_front();
    store_.set_next_stream(g.stream + 1);
    // The synchronous trainer's seeds: prompt k of step j.
    g.seed = rollout_request_seed(opt_.seed, g.stream / opt_.batch_prompts, g.stream % opt_.batch_prompts);
    g.samples.resize(size_t(opt_.n));
    store_.add(std::move(g));
  }
}

void AsyncRollout::run_round(int64_t step, int64_t budget) {
  struct Target {
    StoredGroup* group;
    int64_t sample;  // -1: the whole group (a new one, its n samples forked from one prompt)
    int32_t rounds;  // the targeted samples' rounds before this one
  };
  std::vector<RoundRequest> reqs;
  std::vector<Target> targets;
  const int64_t L = opt_.response_length;
  for (StoredGroup& g : store_.groups()) {
    if (g.finished()) continue;
    const bool fresh = std::all_of(g.samples.begin(), g.samples.end(),
                                   [](const StoredSample& s) { return s.rounds == 0; });
    if (fresh) {
      g.weight_version = weight_version_();
      RoundRequest r;
      r.tokens = prompt_ids_(g.prompt);
      r.n = opt_.n;
      r.seed = g.seed;
      r.max_tokens = std::min(budget, L);
      r.may_continue = L > budget;
      reqs.push_back(std::move(r));
      targets.push_back({&g, -1, 0});
      continue;
    }
    for (int64_t k = 0; k < int64_t(g.samples.size()); ++k) {
      const StoredSample& s = g.samples[size_t(k)];
      if (s.finished) continue;
      const int64_t left = L - int64_t(s.tokens.size());
      KS_CHECK(left > 0, "async rollout: an unfinished response already holds response_length tokens");
      RoundRequest r;
      r.tokens = prompt_ids_(g.prompt);
      r.tokens.insert(r.tokens.end(), s.tokens.begin(), s.tokens.end());
      r.n = 1;
      r.seed = g.seed;
      r.sample_offset = uint64_t(k);
      r.max_tokens = std::min(budget, left);
      r.may_continue = left > budget;
      reqs.push_back(std::move(r));
      targets.push_back({&g, k, s.rounds});
    }
  }
  if (reqs.empty()) return;
  ResponseSink sink;
  if (on_finished_)
    sink = [&](const WireResponse& o) {
      if (o.prompt < 0 || o.prompt >= int64_t(targets.size())) return;  // checked below, with the gathered ones
      const Target& t = targets[size_t(o.prompt)];
      const int64_t k = t.sample < 0 ? o.sample : t.sample;
      if (k < 0 || k >= int64_t(t.group->samples.size())) return;
      const StoredSample& s = t.group->samples[size_t(k)];
      if (!o.finished && int64_t(s.tokens.size() + o.tokens.size()) < L) return;  // continues next round
      std::vector<int32_t> response = s.tokens;
      response.insert(response.end(), o.tokens.begin(), o.tokens.end());
      on_finished_(*t.group, k, response);
    };
  const std::vector<WireResponse> outs = generate_(reqs, sink);
  for (const WireResponse& o : outs) {
    KS_CHECK(o.prompt >= 0 && o.prompt < int64_t(targets.size()), "async rollout: a response to request ", o.prompt,
             " of ", targets.size());
    const Target& t = targets[size_t(o.prompt)];
    const int64_t k = t.sample < 0 ? o.sample : t.sample;
    KS_CHECK(k >= 0 && k < int64_t(t.group->samples.size()), "async rollout: sample index ", k, " out of range");
    StoredSample& s = t.group->samples[size_t(k)];
    KS_CHECK(!s.finished, "async rollout: two responses for sample ", k, " of stream position ", t.group->stream);
    KS_CHECK(o.logprobs.empty() || o.logprobs.size() == o.tokens.size(), "async rollout: log-probs do not match tokens");
    // Log-probs are kept only while every round returned them.
    if (!o.logprobs.empty() && s.logprobs.size() == s.tokens.size())
      s.logprobs.insert(s.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    else
      s.logprobs.clear();
    s.tokens.insert(s.tokens.end(), o.tokens.begin(), o.tokens.end());
    s.versions.insert(s.versions.end(), o.tokens.size(), int32_t(step));
    if (!o.routed_experts.empty()) s.routed_experts = o.routed_experts;
    s.finished = o.finished || int64_t(s.tokens.size()) >= L;
    ++s.rounds;
  }
  // Every targeted response came back exactly once (a lost one would stall its group forever).
  for (const Target& t : targets)
    for (int64_t k = 0; k < int64_t(t.group->samples.size()); ++k)
      if (t.sample < 0 || t.sample == k)
        KS_CHECK(t.group->samples[size_t(k)].rounds == t.rounds + 1, "async rollout: ",
                 t.group->samples[size_t(k)].rounds - t.rounds, " responses for sample ", k, " of stream position ",
                 t.group->stream, " in one round");
}

bool AsyncRollout::trainable_at(const StoredGroup& g, int64_t step) const {
  return g.finished() && step - g.first_version() <= max_staleness();
}

int64_t AsyncRollout::trainable(int64_t step) const {
  return std::count_if(store_.groups().begin(), store_.groups().end(),
                       [&](const StoredGroup& g) { return trainable_at(g, step); });
}

bool AsyncRollout::ready(int64_t step) const {
  const int64_t B = opt_.batch_prompts;
  if (opt_.partial_max_split <= 1) return store_.next_stream() >= (step + 1) * B;
  // Partial rollout with staleness: the previous step's rounds finished this
  // step's batch (within the bound, as take() checks). Without staleness
  // every step trains only after a round at its own version.
  return opt_.staleness_threshold > 0 && trainable(step) >= B;
}

bool AsyncRollout::rounds_done(int64_t step, bool batch_taken) const {
  const int64_t B = opt_.batch_prompts;
  if (opt_.staleness_threshold <= 0) return store_.num_finished() >= B;
  // With staleness the rounds run until the next step's batch is finished
  // as well (so that step hands it over first), unless this is the last step.
  // Not taken yet, take(step) will remove the B oldest groups trainable at
  // `step`: the next batch comes from the groups after them.
  if (!batch_taken && trainable(step) < B) return false;
  if (opt_.total_steps > 0 && step + 1 >= opt_.total_steps) return true;
  int64_t taken = batch_taken ? B : 0, next = 0;
  for (const StoredGroup& g : store_.groups()) {
    if (taken < B && trainable_at(g, step)) {
      ++taken;
      continue;
    }
    if (trainable_at(g, step + 1)) ++next;
  }
  return next >= B;
}

int64_t AsyncRollout::generate(int64_t step, bool batch_taken) {
  const int64_t B = opt_.batch_prompts;
  const int64_t finished_before = store_.num_finished();
  int64_t rounds = 0;
  if (opt_.partial_max_split <= 1) {
    // The pipeline: everything up to this step's target, generated whole at this version.
    const int64_t target = pipeline_target(step);
    if (store_.next_stream() < target) {
      draw_groups(target - store_.next_stream());
      run_round(step, opt_.response_length);
      rounds = 1;
    }
  } else {
    const int64_t budget = (opt_.response_length + opt_.partial_max_split - 1) / opt_.partial_max_split;
    // New prompts up to the pipeline's target (with t = 0: the step's own B,
    // carried groups counting), plus one for each group dropped as stale, so
    // a drop does not shrink what later steps find (positions, not the
    // store's size: a batch handed over before the rounds has left it).
    const int64_t target = pipeline_target(step) + store_.counters().dropped_groups;
    if (store_.next_stream() < target) draw_groups(target - store_.next_stream());
    for (;;) {
      if (store_.num_unfinished() > 0) {
        run_round(step, budget);
        ++rounds;
      }
      if (rounds_done(step, batch_taken)) break;
      draw_groups(B);  // more prompts for the next round: training needs B finished groups
    }
  }
  store_.counters().generated_groups += store_.num_finished() - finished_before;
  store_.counters().rounds_since_take += rounds;
  return rounds;
}

std::vector<StoredGroup> AsyncRollout::take(int64_t step, std::map<std::string, double>& m) {
  const int64_t B = opt_.batch_prompts;
  store_.drop_stale(step, max_staleness());
  KS_CHECK(store_.num_finished() >= B, "async rollout: ", store_.num_finished(), " finished groups for a batch of ", B,
           " at step ", step, " (the pipeline's target ", pipeline_target(step), ")");
  std::vector<StoredGroup> groups = store_.take_finished(B);
  for (const StoredGroup& g : groups) {
    if (step > g.first_version()) {
      ++store_.counters().stale_groups_trained;
      store_.counters().stale_responses_trained += int64_t(g.samples.size());
    }
    KS_CHECK(step - g.first_version() <= max_staleness(), "async rollout: the group at stream position ", g.stream,
             " would train ", step - g.first_version(), " versions after it was generated (bound ", max_staleness(),
             ")");
  }
  // The synchronous trainer logs none of them (verl's colocated trainer has no fully_async/ metrics).
  if (opt_.staleness_threshold > 0 || opt_.partial_max_split > 1)
    add_metrics(groups, step, store_.counters().rounds_since_take, m);
  store_.counters().rounds_since_take = 0;
  return groups;
}

std::vector<StoredGroup> AsyncRollout::next_groups(int64_t step, std::map<std::string, double>& m) {
  // A batch generated ahead is handed over first, as a disaggregated rollout
  // does (the same groups either way; the metrics then say the same).
  if (ready(step)) {
    std::vector<StoredGroup> groups = take(step, m);
    generate(step, /*batch_taken=*/true);
    return groups;
  }
  generate(step);
  return take(step, m);
}

void AsyncRollout::add_metrics(const std::vector<StoredGroup>& groups, int64_t step, int64_t rounds,
                               std::map<std::string, double>& m) {
  const StoreCounters& c = store_.counters();
  int64_t partial = 0, responses = 0, max_span = 0, max_stale = 0;
  double sum_stale = 0;
  for (const StoredGroup& g : groups) {
    const int64_t stale = step - g.first_version();
    max_stale = std::max(max_stale, stale);
    sum_stale += double(stale);
    for (const StoredSample& s : g.samples) {
      ++responses;
      if (s.rounds > 1) {
        ++partial;
        if (!s.versions.empty()) max_span = std::max<int64_t>(max_span, s.versions.back() - s.versions.front());
      }
    }
  }
  // verl's fully_async/* names (counts are totals over the run, as verl's).
  m["fully_async/count/current_param_version"] = double(step);
  m["fully_async/count/total_generated_samples"] = double(c.generated_groups);
  m["fully_async/count/stale_samples_processed"] = double(c.stale_groups_trained);
  m["fully_async/count/stale_trajectory_processed"] = double(c.stale_responses_trained);
  m["fully_async/count/dropped_stale_samples"] = double(c.dropped_groups);
  m["fully_async/partial/total_partial_num"] = double(partial);
  m["fully_async/partial/partial_ratio"] = responses > 0 ? double(partial) / double(responses) : 0.0;
  m["fully_async/partial/max_partial_span"] = double(max_span);
  // Kestrel's: the staleness of this step's groups, the rounds it ran, what waits in the store.
  m["fully_async/staleness/max"] = double(max_stale);
  m["fully_async/staleness/mean"] = groups.empty() ? 0.0 : sum_stale / double(groups.size());
  m["fully_async/rollout_rounds"] = double(rounds);
  m["fully_async/store/groups"] = double(store_.size());
}

RolloutBatch assemble_batch(const std::vector<StoredGroup>& groups,
                            const std::function<const std::vector<int32_t>&(int64_t)>& prompt_ids,
                            int64_t routed_layers, int64_t routed_topk) {
  RolloutBatch b;
  bool all_logp = true;
  const bool all_routing = routed_layers > 0;
  int64_t wv = -1;
  for (size_t i = 0; i < groups.size(); ++i) {
    const StoredGroup& g = groups[i];
    KS_CHECK(g.finished(), "assemble_batch: the group at stream position ", g.stream, " is unfinished");
    wv = wv < 0 ? g.weight_version : std::min(wv, g.weight_version);
    for (const StoredSample& s : g.samples) {
      b.prompts.push_back(prompt_ids(g.prompt));
      b.responses.push_back(s.tokens);
      b.group.push_back(int64_t(i));
      if (s.logprobs.size() != s.tokens.size()) all_logp = false;
      b.rollout_logp.insert(b.rollout_logp.end(), s.logprobs.begin(), s.logprobs.end());
      KS_CHECK(routed_layers == 0 || !s.routed_experts.empty(), "rollout: actor_rollout_ref.rollout."
               "enable_rollout_routing_replay=true but the rollout engine returned no routing for a response of the "
               "prompt at stream position ", g.stream, "; set it false, or the router replay that needs it to disabled");
    }
  }
  b.finalize_layout();
  if (!all_logp || int64_t(b.rollout_logp.size()) != b.layout.num_tokens()) b.rollout_logp.clear();
  if (all_routing) {
    b.routed_layers = routed_layers;
    b.routed_topk = routed_topk;
    for (const StoredGroup& g : groups)
      for (const StoredSample& s : g.samples) b.routed_experts.push_back(s.routed_experts);
    b.routing_source = RouterReplay::R3;
    b.check_routing("the rollout's routing");
  }
  b.weight_version = wv;
  return b;
}

}  // namespace kestrel::rl
