#include "rl/workers/rollout_worker.h"

#include <string>

#include "model/moe_mlp.h"

namespace kestrel::rl {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t rollout_request_seed(uint64_t seed, int64_t step, int64_t index) {
  return splitmix64(splitmix64(seed) ^ splitmix64(uint64_t(step) * 0x100000001B3ull + uint64_t(index)));
}

RolloutWeightView::RolloutWeightView(const model::CausalLM& actor, const rollout::RolloutWeightsOptions& opts,
                                     std::function<int64_t()> actor_version)
    : weights_(rollout::RolloutWeights::create(actor, opts)), actor_version_(std::move(actor_version)) {
  KS_CHECK(actor_version_ != nullptr, "rollout view: no actor version source");
  version_ = actor_version_();  // create() fills a copy from the actor's current weights
}

const rollout::ReshardStats& RolloutWeightView::refresh() {
  const rollout::ReshardStats& rs = weights_->refresh();
  version_ = actor_version_();
  return rs;
}

RolloutWorker::RolloutWorker(const model::CausalLM& actor, std::function<int64_t()> actor_version,
                             RolloutOptions opt, const RlParallel& parallel)
    : opt_(std::move(opt)),
      parallel_(parallel),
      view_(actor, rollout::RolloutWeightsOptions{parallel.rollout_tp, opt_.weights_dtype, parallel.rollout_ep}, std::move(actor_version)) {
  const int world = parallel_.world->size();
  const int rtp = parallel_.rollout_tp ? parallel_.rollout_tp->size() : actor.tp().size();
  KS_CHECK(world % rtp == 0, "rollout tensor-parallel size ", rtp, " must divide the world size ", world);
  groups_ = world / rtp;
  group_ = parallel_.world->rank() / rtp;
  leader_ = parallel_.world->rank() % rtp == 0;
  auto eng = rollout::Engine::create(view_.model(), opt_.engine);
  if (!eng) KS_FAIL("RL: cannot start the rollout engine: ", eng.status().message());
  engine_ = std::move(eng).value();
  engine_version_ = view_.version();
}

void RolloutWorker::reset_cache_if_moved() {
  // In place the view follows the actor at once: KV cached from older
  // weights must not be reused.
  if (engine_version_ == view_.version()) return;
  engine_->update_weights_version();
  engine_version_ = view_.version();
}

std::vector<WireResponse> RolloutWorker::run(const std::vector<std::vector<int32_t>>& prompts,
                                             rollout::SamplingParams sp, const std::function<uint64_t(int64_t)>& seed,
                                             bool logprobs) {
  return run_requests(
      prompts,
      [&](int64_t k) {
        rollout::SamplingParams p = sp;
        p.seed = seed(k);
        return p;
      },
      logprobs, [](int64_t, const rollout::CompletionOutput&) { return true; });
}

std::vector<WireResponse> RolloutWorker::run_requests(
    const std::vector<std::vector<int32_t>>& prompts, const std::function<rollout::SamplingParams(int64_t)>& params,
    bool logprobs, const std::function<bool(int64_t, const rollout::CompletionOutput&)>& finished,
    const ResponseSink& sink) {
  KS_CHECK(!view_.released(), "rollout: its weight copy was released while the actor trained; sync() first");
  wake();
  reset_cache_if_moved();
  // This rollout group's share of the prompts; the seeds use the step-wide
  // index, so the samples do not depend on the layout.
  const auto [p0, p1] = share_range(int64_t(prompts.size()), group_, groups_);
  for (int64_t k = p0; k < p1; ++k) engine_->add_request(std::to_string(k), prompts[size_t(k)], params(k)).throw_if_error();
  auto wire = [&](int64_t k, const rollout::CompletionOutput& c) {
    return WireResponse{k, c.index, c.token_ids, logprobs ? c.logprobs : std::vector<float>{},
                        logprobs ? c.routed_experts : std::vector<int32_t>{}, finished(k, c)};
  };
  rollout::Engine::FinishedFn on_finished;
  if (sink)
    on_finished = [&](const rollout::RequestOutput& o) {
      const int64_t k = std::stoll(o.request_id);  // add_request's id: the request's index
      for (const auto& c : o.outputs) sink(wire(k, c));
    };
  const auto outs = engine_->run_to_completion(on_finished);
  KS_CHECK(int64_t(outs.size()) == p1 - p0, "rollout: ", outs.size(), " outputs for ", p1 - p0, " prompts");
  std::vector<WireResponse> mine;
  for (size_t k = 0; k < outs.size(); ++k)
    for (const auto& c : outs[k].outputs) mine.push_back(wire(p0 + int64_t(k), c));
  return parallel_.world->size() > 1 ? all_gather_responses(*parallel_.world, mine, leader_) : mine;
}

std::vector<WireResponse> RolloutWorker::generate_round(const std::vector<RoundRequest>& reqs,
                                                        const ResponseSink& sink) {
  const bool record = opt_.engine.record_routing;
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(reqs.size());
  for (const RoundRequest& r : reqs) {
    KS_CHECK(!record || !r.may_continue, "not supported yet: partial rollout with MoE routing replay "
             "(actor_rollout_ref.rollout.enable_rollout_routing_replay): a continued response's routing is not joined");
    prompts.push_back(r.tokens);
  }
  return run_requests(
      prompts,
      [&](int64_t k) {
        const RoundRequest& r = reqs[size_t(k)];
        rollout::SamplingParams sp = training_sampling(r.max_tokens, r.n);
        sp.seed = r.seed;
        sp.sample_offset = r.sample_offset;
        return sp;
      },
      true,
      [&](int64_t k, const rollout::CompletionOutput& c) {
        // Unfinished: stopped by this round's budget (not EOS, not the model's length limit).
        const RoundRequest& r = reqs[size_t(k)];
        return !(r.may_continue && c.finish_reason == "length" && int64_t(c.token_ids.size()) == r.max_tokens);
      },
      sink);
}

rollout::SamplingParams RolloutWorker::training_sampling(int64_t max_tokens, int64_t n) const {
  rollout::SamplingParams sp;
  sp.temperature = opt_.temperature;
  sp.top_k = opt_.top_k;
  sp.top_p = opt_.top_p;
  sp.max_tokens = max_tokens;
  sp.n = n;
  return sp;
}

RolloutBatch RolloutWorker::generate(const std::vector<std::vector<int32_t>>& prompts, int64_t step) {
  const rollout::SamplingParams sp = training_sampling(opt_.response_length, opt_.n);
  const std::vector<WireResponse> all =
      run(prompts, sp, [&](int64_t k) { return rollout_request_seed(opt_.seed, step, k); }, true);
  KS_CHECK(int64_t(all.size()) == int64_t(prompts.size()) * opt_.n, "rollout: ", all.size(), " responses for ",
           prompts.size(), " prompts x n=", opt_.n);
  RolloutBatch b;
  for (const WireResponse& r : all) {
    b.prompts.push_back(prompts[size_t(r.prompt)]);
    b.responses.push_back(r.tokens);
    b.group.push_back(r.prompt);
    b.rollout_logp.insert(b.rollout_logp.end(), r.logprobs.begin(), r.logprobs.end());
  }
  b.finalize_layout();
  if (int64_t(b.rollout_logp.size()) != b.layout.num_tokens()) b.rollout_logp.clear();
  // Router replay R3: each response's routing over its prompt and response tokens.
  const io::ModelConfig& cfg = view_.model().config();
  const int64_t moe_layers = model::num_moe_layers(cfg);
  if (opt_.engine.record_routing && moe_layers > 0) {
    b.routed_layers = moe_layers;
    b.routed_topk = cfg.moe.top_k;
    for (const WireResponse& r : all) {
      KS_CHECK(!r.routed_experts.empty(), "rollout: actor_rollout_ref.rollout.enable_rollout_routing_replay=true "
               "but the rollout engine returned no routing for a response of prompt ", r.prompt, " (an engine that "
               "does not record MoE routing yet); set it false, or the router replay that needs it to disabled");
      b.routed_experts.push_back(r.routed_experts);
    }
    b.routing_source = RouterReplay::R3;
    b.check_routing("the rollout's routing");
  }
  b.weight_version = view_.version();
  return b;
}

std::vector<WireResponse> RolloutWorker::generate_validation(const std::vector<std::vector<int32_t>>& prompts) {
  rollout::SamplingParams sp;
  sp.temperature = opt_.val_temperature;
  sp.top_k = opt_.val_top_k;
  sp.top_p = opt_.val_top_p;
  sp.max_tokens = opt_.response_length;
  sp.n = opt_.val_n;
  // Fixed seeds: comparable across steps.
  std::vector<WireResponse> all =
      run(prompts, sp, [&](int64_t k) { return rollout_request_seed(opt_.seed ^ 0x76616c69ull, 0, k); }, false);
  // Training rollouts never reuse validation KV: prefix-cached blocks are not
  // bit-identical to recomputed ones, so a step after a validation would
  // otherwise depend on whether the run was resumed in between.
  engine_->update_weights_version();
  return all;
}

void RolloutWorker::sleep(bool release_weights) {
  engine_->sleep();
  if (release_weights) view_.release();  // no-op in place
}

void RolloutWorker::wake() {
  if (engine_->is_sleeping()) engine_->wake_up();
}

const rollout::ReshardStats& RolloutWorker::sync() {
  const rollout::ReshardStats& rs = view_.refresh();  // train -> rollout layout (no-op in place)
  engine_->wake_up();
  engine_->update_weights_version();
  engine_version_ = view_.version();
  return rs;
}

void RolloutWorker::reload() {
  view_.refresh();
  engine_->update_weights_version();  // the prefix cache holds KV of the old weights
  engine_version_ = view_.version();
}

}  // namespace kestrel::rl
