#include "rl/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "core/progress.h"
#include "model/moe_mlp.h"
#include "rl/distributed.h"
#include "train/checkpoint.h"
#include "train/run_control.h"

namespace kestrel::rl {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

RlWorkerOptions split_options(const RlOptions& o) {
  RlWorkerOptions w;
  LogProbOptions lp;
  lp.max_token_len = o.log_prob_max_token_len;
  lp.micro_batch_size = o.log_prob_micro_batch_size;
  lp.share_prompts = o.share_prompts;
  lp.balance_batch = o.balance_batch;
  w.ref = lp;
  w.ref.router_replay = o.ref_router_replay;

  ActorOptions& a = w.actor;
  a.n = o.n;
  a.response_length = o.response_length;
  a.ppo_mini_batch_size = o.ppo_mini_batch_size;
  a.ppo_epochs = o.ppo_epochs;
  a.shuffle = o.shuffle;
  a.data_loader_seed = o.data_loader_seed;
  a.micro_batch_size = o.micro_batch_size;
  a.max_token_len = o.max_token_len;
  a.share_prompts = o.share_prompts;
  a.balance_batch = o.balance_batch;
  a.loss = o.loss;
  a.loss_scale_factor = o.loss_scale_factor;
  a.adamw = o.adamw;
  a.lr = o.lr;
  a.clip_grad = o.clip_grad;
  a.reuse_fp32_param = o.reuse_fp32_param;
  a.optimizer_offload_pieces = o.optimizer_offload_pieces;
  a.param_offload = o.actor_param_offload;
  a.grad_offload = o.actor_grad_offload;
  a.max_consecutive_skipped_steps = o.max_consecutive_skipped_steps;
  a.log_prob = lp;
  a.rollout_corr = o.rollout_corr;
  // R3: the old-log-prob pass replays the rollout's routing; R2: it records its own (ActorWorker).
  a.router_replay = o.actor_router_replay;
  a.log_prob.router_replay = o.actor_router_replay == RouterReplay::R3 ? RouterReplay::R3 : RouterReplay::Disabled;

  RolloutOptions& r = w.rollout;
  r.n = o.n;
  r.temperature = o.temperature;
  r.top_k = o.top_k;
  r.top_p = o.top_p;
  r.response_length = o.response_length;
  r.seed = o.rollout_seed;
  r.engine = o.engine;
  r.val_n = o.val_n;
  r.val_temperature = o.val_temperature;
  r.val_top_k = o.val_top_k;
  r.val_top_p = o.val_top_p;
  return w;
}

AsyncRolloutOptions async_rollout_options(const RlOptions& o) {
  AsyncRolloutOptions ao;
  ao.batch_prompts = o.gen_batch_size > 0 ? o.gen_batch_size : o.train_batch_size;
  ao.n = o.n;
  ao.response_length = o.response_length;
  ao.seed = o.rollout_seed;
  ao.staleness_threshold = o.staleness_threshold;
  ao.partial_max_split = o.partial_max_split;
  ao.total_steps = o.total_steps;
  return ao;
}

RlTrainer::RlTrainer(model::CausalLM& actor, std::unique_ptr<model::CausalLM> ref, std::vector<RlPrompt> train,
                     std::vector<RlPrompt> val, std::unique_ptr<train::BatchSource> source, RewardManager& rewards,
                     std::function<std::string(const std::vector<int32_t>&)> decode, RlOptions opt,
                     train::MetricsLogger* logger, std::unique_ptr<Critic> critic)
    : train_(std::move(train)), val_(std::move(val)), source_(std::move(source)), decode_(std::move(decode)),
      opt_(std::move(opt)), logger_(logger) {
  KS_CHECK(!train_.empty(), "RL: no training prompts");
  KS_CHECK(opt_.total_steps > 0, "RL: total steps must be positive");
  KS_CHECK(opt_.n >= 1 && opt_.train_batch_size >= 1, "RL: train_batch_size and rollout.n must be >= 1");
  KS_CHECK(opt_.ppo_mini_batch_size >= 1 && opt_.ppo_epochs >= 1, "RL: ppo_mini_batch_size and ppo_epochs must be >= 1");
  KS_CHECK(!opt_.loss.use_kl_loss || ref, "RL: use_kl_loss needs a reference model");
  KS_CHECK(!opt_.use_kl_in_reward || ref, "RL: algorithm.use_kl_in_reward needs a reference model");
  KS_CHECK(opt_.ref_router_replay != RouterReplay::R2,
           "not supported yet: actor_rollout_ref.ref.router_replay.mode=R2 (the reference replays R3 or routes freely)");
  for (RouterReplay m : {opt_.actor_router_replay, opt_.ref_router_replay})
    KS_CHECK(m != RouterReplay::R3 || opt_.engine.record_routing, "RL: router replay R3 needs the rollout's routing: "
             "actor_rollout_ref.rollout.enable_rollout_routing_replay=true (EngineConfig::record_routing)");
  if (opt_.use_kl_in_reward) parse_kl_type(opt_.kl_penalty).value();
  KS_CHECK(opt_.adv_estimator != AdvEstimator::GAE || critic,
           "RL: algorithm.adv_estimator=gae needs a critic (critic.enable, critic.model.path)");
  const int dp = opt_.parallel.dp->size();
  KS_CHECK(opt_.train_batch_size % dp == 0, "data.train_batch_size=", opt_.train_batch_size,
           " must divide by the data-parallel size ", dp);
  KS_CHECK(opt_.gen_batch_size <= 0 || opt_.gen_batch_size % dp == 0, "data.gen_batch_size=", opt_.gen_batch_size,
           " must divide by the data-parallel size ", dp);
  KS_CHECK(!opt_.filter_groups.enable || !opt_.filter_groups.metric.empty(),
           "algorithm.filter_groups.enable needs algorithm.filter_groups.metric (acc, score, seq_reward, "
           "seq_final_reward, or a reward_extra_info key)");
  KS_CHECK(opt_.ppo_mini_batch_size % dp == 0, "actor_rollout_ref.actor.ppo_mini_batch_size=", opt_.ppo_mini_batch_size,
           " must divide by the data-parallel size ", dp);
  const RolloutCorrectionConfig& rc = opt_.rollout_corr;
  const std::string RC = "algorithm.rollout_correction.";
  // Decoupled rejection changes verl's response_mask before the advantages: GRPO and RLOO only zero the
  // rejected tokens' advantages, the others (and a critic's values and update) depend on the mask.
  KS_CHECK(!rc.active || rc.bypass_mode || !rc.rejects() ||
               ((opt_.adv_estimator == AdvEstimator::GRPO || opt_.adv_estimator == AdvEstimator::RLOO) && !critic),
           "not supported yet: ", RC, "rollout_rs with algorithm.adv_estimator=", adv_estimator_name(opt_.adv_estimator),
           critic ? " and a critic" : "", " (the masked advantages/values of GAE and REINFORCE++ are not built); use "
           "grpo or rloo, or ", RC, "bypass_mode=true");
  // Bypass mode normalises per micro-batch across dp as verl's distributed_masked_mean does; Kestrel's dp
  // ranks cut micro-batches independently, so that mean would not be verl's.
  KS_CHECK(!rc.active || !rc.bypass_mode || !rc.rollout_is_batch_normalize || dp == 1,
           "not supported yet: ", RC, "rollout_is_batch_normalize=true with ", RC,
           "bypass_mode=true under data parallelism (", dp, " dp ranks); set one of them false or run one dp rank");
  KS_CHECK(!opt_.use_rollout_log_probs || !rc.active || rc.bypass_mode ||
               (rc.rollout_is == IsLevel::None && !rc.rejects()),
           "async_training.use_rollout_log_probs=true makes the old log-probs the rollout's, so ", RC,
           "rollout_is/rollout_rs in decoupled mode would compare them with themselves; set ", RC,
           "bypass_mode=true, or use_rollout_log_probs=false (verl pairs it with compute_prox_log_prob)");
  if (opt_.lr.total_steps <= 0) opt_.lr.total_steps = opt_.total_steps;
  RlWorkerOptions w = split_options(opt_);
  actor_ = std::make_unique<ActorWorker>(actor, std::move(w.actor), opt_.parallel);
  if (ref) ref_ = std::make_unique<RefWorker>(std::move(ref), w.ref, opt_.parallel, opt_.ref_param_offload);
  if (critic)
    critic_ = std::make_unique<CriticWorker>(std::move(critic), opt_.parallel, opt_.balance_batch, actor.tp().size());
  reward_ = std::make_unique<RewardWorker>(rewards, opt_.parallel.world);
  if (opt_.disaggregated) {
    KS_CHECK(opt_.job != nullptr, "RL: a disaggregated trainer needs the job's world group");
    KS_CHECK(!opt_.filter_groups.enable, "not supported yet: algorithm.filter_groups with disaggregated rollout ranks");
    disaggregated_ = true;
    // The trainer's first rank talks to the rollout ranks; the others get each batch from it.
    if (is_world_leader()) remote_ = std::make_unique<RemoteRollout>(*opt_.job, *opt_.disaggregated);
  } else {
    rollout_ = std::make_unique<RolloutWorker>(
        actor_->model(), [a = actor_.get()] { return a->weight_version(); }, std::move(w.rollout), opt_.parallel);
  }
  const std::string AT = "async_training.staleness_threshold", PS = "algorithm.partial_rollout_max_split";
  KS_CHECK(opt_.staleness_threshold >= 0, AT, "=", opt_.staleness_threshold, " must be >= 0");
  KS_CHECK(opt_.partial_max_split >= 1, PS, "=", opt_.partial_max_split, " must be >= 1");
  const bool asynchronous = opt_.staleness_threshold > 0 || opt_.partial_max_split > 1;
  KS_CHECK(!asynchronous || !opt_.filter_groups.enable, "not supported yet: ", AT, " > 0 or ", PS,
           " > 1 with algorithm.filter_groups.enable (dynamic sampling draws and filters its own batches)");
  KS_CHECK(opt_.partial_max_split == 1 || !opt_.engine.record_routing, "not supported yet: ", PS,
           " > 1 with actor_rollout_ref.rollout.enable_rollout_routing_replay (a continued response's routing is "
           "not joined)");
  // TEST ONLY (tests/scripts/async_rl.sh): KESTREL_TEST_DIRECT_ROLLOUT=1 generates each step's batch as the
  // trainer did before the sample store existed, so a test can show the store changes nothing.
  if (const char* env = std::getenv("KESTREL_TEST_DIRECT_ROLLOUT"); env && std::string(env) == "1") {
    KS_CHECK(!asynchronous && !opt_.disaggregated, "KESTREL_TEST_DIRECT_ROLLOUT=1 is for the synchronous trainer");
    direct_rollout_ = true;
  }
  if (!opt_.filter_groups.enable && rollout_) {
    AsyncRolloutOptions ao = async_rollout_options(opt_);
    async_ = std::make_unique<AsyncRollout>(
        ao, [this] { return source_->next_batch(); },
        [this](int64_t i) -> const std::vector<int32_t>& { return train_[size_t(i)].ids; },
        [this](const std::vector<RoundRequest>& reqs, const ResponseSink& sink) { return rollout_->generate_round(reqs, sink); },
        [this] { return rollout_->version(); });
  }
  if (opt_.launch_reward_fn_async) {
    KS_CHECK(!opt_.filter_groups.enable, "not supported yet: reward_model.launch_reward_fn_async=true with "
             "algorithm.filter_groups.enable (dynamic sampling needs each generation batch's scores before it "
             "filters); set one of them false");
    if (reward_->is_leader()) {
      stream_ = std::make_unique<RewardStream>(
          [r = reward_.get()](const std::vector<RewardRequest>& q) { return r->score_here(q); }, reward_->workers());
      // Each response as it finishes: generated here, or sent by the disaggregated rollout leader
      // (run_rollout_rank's stream_responses).
      if (async_)
        async_->set_on_finished([this](const StoredGroup& g, int64_t k, const std::vector<int32_t>& response) {
          stream_response(g.stream, g.prompt, k, response);
        });
    }
  }
  if (opt_.stream_log_probs) {
    const std::string K = "async_training.stream_log_probs=true";
    KS_CHECK(disaggregated_, K, " scores log-probs while the rollout ranks generate: it needs rollout ranks "
             "(rollout.nnodes, rollout.n_gpus_per_node under mpirun); set it false");
    KS_CHECK(opt_.loss.use_kl_loss || opt_.use_kl_in_reward || stream_old_log_probs(), K, ": this run scores "
             "neither reference log-probs (actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward are "
             "false) nor old ones it could score early (only at staleness 0 without partial rollout, when several "
             "mini-batches or epochs, the in-reward KL or rollout correction need them); set it false");
    KS_CHECK(opt_.parallel.world->size() == 1, "not supported yet: ", K, " with a trainer of ",
             opt_.parallel.world->size(), " ranks (the groups are scored on the trainer's first rank as they come)");
  }
  // Disaggregated: each response the rollout leader finishes (run_rollout_rank's stream_responses).
  if (remote_ && (stream_ || opt_.stream_log_probs))
    remote_->set_on_response([this](int64_t stream, int64_t prompt, int64_t k, const std::vector<int32_t>& tokens) {
      if (stream_) stream_response(stream, prompt, k, tokens);
      if (opt_.stream_log_probs) stream_logp_response(stream, prompt, k, tokens);
    });
}

RlTrainer::~RlTrainer() = default;

std::vector<std::vector<int32_t>> RlTrainer::prompt_ids(const std::vector<int64_t>& prompt_idx) const {
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(prompt_idx.size());
  for (int64_t i : prompt_idx) ids.push_back(train_[size_t(i)].ids);
  return ids;
}

RolloutBatch RlTrainer::generate(const std::vector<int64_t>& prompt_idx) {
  KS_CHECK(rollout_ != nullptr, "RL: generate() on a disaggregated trainer (its rollout ranks generate)");
  return rollout_->generate(prompt_ids(prompt_idx), step_);
}

RewardRequest RlTrainer::reward_request(int64_t prompt, const std::vector<int32_t>& response) const {
  const RlPrompt& p = train_[size_t(prompt)];
  return {p.data_source, decode_(response), p.ground_truth, p.extra_info, int64_t(response.size())};
}

void RlTrainer::compute_rewards(RolloutBatch& b, const std::vector<int64_t>& prompt_idx,
                                std::map<std::string, double>& m, std::vector<nlohmann::ordered_json>* extra) {
  std::vector<RewardRequest> reqs;
  for (int64_t i = 0; i < b.size(); ++i)
    reqs.push_back(reward_request(prompt_idx[size_t(b.group[size_t(i)])], b.responses[size_t(i)]));
  reward_->score(b, reqs, m, extra);
}

void RlTrainer::stream_response(int64_t stream, int64_t prompt, int64_t sample, const std::vector<int32_t>& response) {
  // A batch-wise score needs its whole batch: submit_rewards sends it in one call.
  if (!reward_->batch_wise()) stream_->submit({{stream, sample}}, {reward_request(prompt, response)}, step_);
}

bool RlTrainer::stream_old_log_probs() const {
  const RolloutCorrectionConfig& rc = opt_.rollout_corr;
  const bool bypass = (rc.active && rc.bypass_mode) || opt_.use_rollout_log_probs;
  return opt_.stream_log_probs && opt_.staleness_threshold == 0 && opt_.partial_max_split == 1 && !bypass &&
         (opt_.ppo_epochs > 1 || opt_.ppo_mini_batch_size < opt_.train_batch_size || opt_.use_kl_in_reward || rc.active);
}

void RlTrainer::stream_logp_response(int64_t stream, int64_t prompt, int64_t sample,
                                     const std::vector<int32_t>& response) {
  PartialGroup& g = logp_pending_[stream];
  if (g.responses.empty()) {
    g.prompt = prompt;
    g.responses.resize(size_t(opt_.n));
  }
  KS_CHECK(sample >= 0 && sample < opt_.n && !g.responses[size_t(sample)], "disaggregated rollout: sample ", sample,
           " of stream position ", stream, " streamed twice or out of range");
  g.responses[size_t(sample)] = response;
  for (const auto& r : g.responses)
    if (!r) return;
  // The whole group: its log-probs now, as one micro-batch of its own.
  RolloutBatch gb;
  for (auto& r : g.responses) {
    gb.prompts.push_back(train_[size_t(prompt)].ids);
    gb.responses.push_back(std::move(*r));
    gb.group.push_back(0);
  }
  logp_pending_.erase(stream);
  gb.finalize_layout();
  const bool old = stream_old_log_probs(), ref = opt_.loss.use_kl_loss || opt_.use_kl_in_reward;
  compute_log_probs(gb, old, ref);
  for (int kind = 0; kind < 2; ++kind) {
    if (kind == 0 ? !ref : !old) continue;
    const std::vector<double>& lp = kind == 0 ? gb.ref_logp : gb.old_logp;
    for (int64_t k = 0; k < gb.size(); ++k)
      logp_streamed_[kind][{stream, k}] =
          std::vector<double>(lp.begin() + gb.layout.begin(k), lp.begin() + gb.layout.end(k));
  }
}

double RlTrainer::fill_log_probs(RolloutBatch& b, const std::vector<int64_t>& group_streams, bool old) {
  auto& streamed = logp_streamed_[old ? 1 : 0];
  std::vector<double>& out = old ? b.old_logp : b.ref_logp;
  out.assign(size_t(b.layout.num_tokens()), 0.0);
  RolloutBatch rest;  // the responses not streamed, scored now
  std::vector<int64_t> rest_idx;
  std::vector<int64_t> seen(group_streams.size(), 0);
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t gi = b.group[size_t(i)];
    KS_CHECK(gi >= 0 && gi < int64_t(group_streams.size()), "RL: response ", i, " of group ", gi, " outside the batch");
    auto it = streamed.find({group_streams[size_t(gi)], seen[size_t(gi)]++});
    if (it != streamed.end() && int64_t(it->second.size()) == b.layout.length(i)) {
      std::copy(it->second.begin(), it->second.end(), out.begin() + b.layout.begin(i));
      streamed.erase(it);
      continue;
    }
    rest.prompts.push_back(b.prompts[size_t(i)]);
    rest.responses.push_back(b.responses[size_t(i)]);
    rest.group.push_back(gi);
    rest_idx.push_back(i);
  }
  if (!rest_idx.empty()) {
    rest.finalize_layout();
    compute_log_probs(rest, old, !old);
    const std::vector<double>& lp = old ? rest.old_logp : rest.ref_logp;
    for (size_t j = 0; j < rest_idx.size(); ++j)
      std::copy(lp.begin() + rest.layout.begin(int64_t(j)), lp.begin() + rest.layout.end(int64_t(j)),
                out.begin() + b.layout.begin(rest_idx[j]));
  }
  // What is older than this batch never trains (dropped as too stale), or is already in it.
  if (!group_streams.empty()) {
    const int64_t oldest = *std::min_element(group_streams.begin(), group_streams.end());
    for (auto& m : logp_streamed_) m.erase(m.begin(), m.lower_bound({oldest, 0}));
  }
  return b.size() > 0 ? 1.0 - double(rest_idx.size()) / double(b.size()) : 0.0;
}

std::vector<RewardStream::Key> RlTrainer::submit_rewards(const std::vector<StoredGroup>& groups,
                                                         std::map<std::string, double>& m) {
  std::vector<RewardStream::Key> keys;
  for (const StoredGroup& g : groups)
    for (int64_t k = 0; k < int64_t(g.samples.size()); ++k) keys.push_back({g.stream, k});
  if (!stream_) return keys;
  // What the rollout did not hand over as it finished (another rank's share,
  // a disaggregated rollout's, or a batch-wise manager's whole batch).
  std::vector<RewardStream::Key> todo;
  std::vector<RewardRequest> reqs;
  size_t i = 0;
  for (const StoredGroup& g : groups)
    for (const StoredSample& s : g.samples) {
      const RewardStream::Key& key = keys[i++];
      if (stream_->submitted(key)) continue;
      todo.push_back(key);
      reqs.push_back(reward_request(g.prompt, s.tokens));
    }
  m["reward/streamed_fraction"] = keys.empty() ? 0.0 : 1.0 - double(todo.size()) / double(keys.size());
  if (reward_->batch_wise()) {
    stream_->submit(std::move(todo), std::move(reqs), step_);  // one call, as the synchronous trainer makes
  } else {
    for (size_t j = 0; j < todo.size(); ++j) stream_->submit({todo[j]}, {std::move(reqs[j])}, step_);
  }
  // Scores of groups never to be trained (dropped as too stale). Colocated:
  // those the store no longer holds and this batch does not train.
  // Disaggregated (the store is on the rollout ranks): those older than the
  // staleness bound (a group trains at most max_staleness versions after its
  // first token, and its responses reached the trainer after that).
  std::set<int64_t> live;
  for (const StoredGroup& g : groups) live.insert(g.stream);
  if (async_)
    for (const StoredGroup& g : async_->store().groups()) live.insert(g.stream);
  const int64_t bound = max_staleness(opt_.staleness_threshold, opt_.partial_max_split);
  stream_->forget_unless([&](const RewardStream::Key& k, int64_t tag) {
    return live.count(k.first) > 0 || (!async_ && step_ - tag <= bound + 1);
  });
  return keys;
}

void RlTrainer::take_rewards(RolloutBatch& b, const std::vector<RewardStream::Key>& keys,
                             std::map<std::string, double>& m) {
  RewardBatchResult r;
  if (stream_) r = stream_->take(keys);
  reward_->publish(b, std::move(r), m);
}

// Scoring multiplies by packed weights (backend/cpu/packed_linear.h): the
// actor by the rollout engine's when the engine reads the actor's weights in
// place (packed during the rollout, same version), otherwise by packs made
// for this call and freed after it; the reference model by packs made for
// its call. kestrel plan counts them in the scoring phase.
// A model on a device takes no packs (they are the CPU GEMM's).
void RlTrainer::compute_log_probs(RolloutBatch& b, bool old, bool ref) {
  const auto on_cpu = [](const model::CausalLM& m) { return m.device() == Device::CPU; };
  if (old) {
    cpu::WeightPacks local;
    cpu::WeightPacks* shared = rollout_ ? rollout_->actor_packs() : nullptr;
    model::ForwardPacksScope scope(actor_->model(), !on_cpu(actor_->model()) ? nullptr : shared ? shared : &local);
    actor_->compute_log_probs(b);
  }
  if (ref) {
    KS_CHECK(ref_ != nullptr, "RL: reference log-probs need a reference model");
    cpu::WeightPacks local;
    model::ForwardPacksScope scope(ref_->model(), on_cpu(ref_->model()) ? &local : nullptr);
    ref_->compute_log_probs(b);
  }
}

void RlTrainer::apply_kl_penalty(RolloutBatch& b, std::map<std::string, double>& m) {
  KS_CHECK(!b.ref_logp.empty(), "RL: the in-reward KL needs reference log-probs");
  const std::vector<double>& cur = b.old_logp.empty() ? b.rollout_logp : b.old_logp;
  KS_CHECK(!cur.empty(), "RL: the in-reward KL needs the actor's log-probs");
  const double beta = opt_.kl_ctrl.value;
  double current_kl = 0;  // mean over sequences of the per-sequence token mean
  for (int64_t i = 0; i < b.size(); ++i) {
    double s = 0;
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) {
      const double kl = kl_estimate(opt_.kl_penalty, cur[size_t(t)], b.ref_logp[size_t(t)]).value;
      b.token_rewards[size_t(t)] -= beta * kl;
      s += kl;
    }
    current_kl += s / (double(b.layout.length(i)) + 1e-8);  // verl's masked_mean
  }
  current_kl /= double(std::max<int64_t>(1, b.size()));
  opt_.kl_ctrl.update(current_kl, b.size());
  m["actor/reward_kl_penalty"] = current_kl;
  m["actor/reward_kl_penalty_coeff"] = beta;
}

void RlTrainer::compute_advantage(RolloutBatch& b, const std::vector<double>* values) {
  AdvantageInput in;
  in.values = values;
  in.layout = &b.layout;
  in.token_rewards = &b.token_rewards;
  in.group = &b.group;
  in.gamma = opt_.gamma;
  in.lam = opt_.lam;
  in.norm_adv_by_std_in_grpo = opt_.norm_adv_by_std_in_grpo;
  AdvantageOutput out = compute_advantages(opt_.adv_estimator, in);
  b.advantages = std::move(out.advantages);
  b.returns = std::move(out.returns);
}

void RlTrainer::apply_rollout_correction(RolloutBatch& b, std::map<std::string, double>& m) const {
  KS_CHECK(b.old_logp.size() == b.rollout_logp.size(), "rollout correction: the old log-probs are missing");
  RolloutCorrectionResult r =
      compute_rollout_correction(opt_.rollout_corr, b.layout, b.old_logp, b.rollout_logp, nullptr);
  if (opt_.rollout_corr.rejects()) b.response_mask = std::move(r.mask);
  b.rollout_is_weights = std::move(r.is_weights);
  for (const auto& [k, v] : r.metrics) m[k] = v;
}

std::map<std::string, double> RlTrainer::update_actor(const RolloutBatch& b) {
  if (rollout_) rollout_->sleep(true);  // colocated: the KV cache (and a resharded copy) released while training
  return actor_->update(b, step_);
}

std::map<std::string, double> RlTrainer::train_step() {
  const auto t_step = Clock::now();
  std::map<std::string, double> m;
  RolloutBatch b;
  std::vector<RewardStream::Key> reward_keys;  // launch_reward_fn_async: the batch's rewards, scoring meanwhile
  std::vector<int64_t> streams;  // stream positions of the batch's groups, in batch order (from the sample store)
  auto t0 = Clock::now();
  // With filter_groups the batch comes scored (and KL-penalised when the reward needs it).
  const bool filtered = opt_.filter_groups.enable;
  const int64_t gstep = step_ + 1;  // verl's global_steps of this step, for messages (core/progress.h)
  set_progress(gstep, "gen");
  if (filtered) {
    if (!generate_filtered(b, m)) {
      data_exhausted_ = true;
      return {};
    }
  } else {
    std::vector<int64_t> idx;
    if (direct_rollout_) {  // TEST ONLY: the trainer before the sample store, for the equality test
      idx = source_->next_batch();
      b = generate(idx);
    } else {
      // The step's groups from the sample store, generated now or ahead (rl/async_rollout.h).
      const std::vector<StoredGroup> groups = disaggregated_ ? receive_remote_batch(m) : async_->next_groups(step_, m);
      for (const StoredGroup& g : groups) {
        idx.push_back(g.prompt);
        streams.push_back(g.stream);
      }
      const io::ModelConfig& cfg = actor_->model().config();
      const bool routing = opt_.engine.record_routing && model::num_moe_layers(cfg) > 0;
      b = assemble_batch(
          groups, [this](int64_t i) -> const std::vector<int32_t>& { return train_[size_t(i)].ids; },
          routing ? model::num_moe_layers(cfg) : 0, routing ? cfg.moe.top_k : 0);
      if (opt_.launch_reward_fn_async) reward_keys = submit_rewards(groups, m);  // taken before the advantages
    }
    m["timing_s/gen"] = seconds_since(t0);
    if (!opt_.launch_reward_fn_async || direct_rollout_) {
      t0 = Clock::now();
      set_progress(gstep, "reward");
      compute_rewards(b, idx, m);
      m["timing_s/reward"] = seconds_since(t0);
    }
  }
  actor_->release_device_memory();  // param_offload: the rollout read the weights in place; idle until scored
  const bool kl_done = filtered && opt_.use_kl_in_reward;
  const RolloutCorrectionConfig& rc = opt_.rollout_corr;
  KS_CHECK(!rc.active || !b.rollout_logp.empty(), "actor_rollout_ref.rollout.calculate_log_probs=true: the rollout "
           "engine returned no log-probs for this batch (rollout correction needs them)");

  // Old log-probs are needed when the policy moves before a sequence is
  // trained on (several epochs or mini-batches) and by the in-reward KL; else
  // old = current, detached.
  // Data of older weights than the actor's (weight_version) is off-policy too.
  // Decoupled rollout correction compares them with the rollout's every step
  // (verl always recomputes them there); bypass mode takes the rollout's instead.
  const bool bypass = (rc.active && rc.bypass_mode) || opt_.use_rollout_log_probs;
  KS_CHECK(!opt_.use_rollout_log_probs || !b.rollout_logp.empty(), "async_training.use_rollout_log_probs=true: the "
           "rollout engine returned no log-probs for this batch");
  const bool need_old = !bypass && (opt_.ppo_epochs > 1 || opt_.ppo_mini_batch_size * opt_.n < b.size() ||
                                    opt_.use_kl_in_reward || b.weight_version != actor_weight_version() || rc.active);
  if (bypass) b.old_logp = b.rollout_logp;
  if (!kl_done) {  // else computed per generation batch, before filtering
    t0 = Clock::now();
    set_progress(gstep, "old_log_prob");
    if (need_old && stream_old_log_probs())  // the groups' scored as they came in (Kestrel's metric: the share)
      m["old_log_prob/streamed_fraction"] = fill_log_probs(b, streams, true);
    else
      compute_log_probs(b, need_old, false);
    m["timing_s/old_log_prob"] = seconds_since(t0);
    t0 = Clock::now();
    set_progress(gstep, "ref");
    if (opt_.stream_log_probs && (opt_.loss.use_kl_loss || opt_.use_kl_in_reward))
      m["ref/streamed_fraction"] = fill_log_probs(b, streams, false);
    else
      compute_log_probs(b, false, opt_.loss.use_kl_loss || opt_.use_kl_in_reward);
    m["timing_s/ref"] = seconds_since(t0);
  }

  std::vector<double> values;
  if (critic_) {
    if (rollout_) rollout_->sleep(false);  // colocated: the KV cache is released while the critic runs
    t0 = Clock::now();
    set_progress(gstep, "values");
    values = critic_->values(b);
    m["timing_s/values"] = seconds_since(t0);
  }

  if (!reward_keys.empty()) {  // what is still being scored, waited for here (verl: before the advantages)
    t0 = Clock::now();
    set_progress(gstep, "reward");
    take_rewards(b, reward_keys, m);
    m["timing_s/reward"] = seconds_since(t0);
  }

  t0 = Clock::now();
  set_progress(gstep, "adv");
  if (opt_.use_kl_in_reward && !kl_done) apply_kl_penalty(b, m);
  if (rc.active && !rc.bypass_mode) apply_rollout_correction(b, m);  // verl: after the KL penalty, before the advantages
  compute_advantage(b, critic_ ? &values : nullptr);
  if (!b.response_mask.empty())  // verl's GRPO/RLOO advantages are scores * response_mask
    for (size_t t = 0; t < b.advantages.size(); ++t) {
      b.advantages[t] *= b.response_mask[t];
      b.returns[t] *= b.response_mask[t];
    }
  m["timing_s/adv"] = seconds_since(t0);

  if (critic_) {
    t0 = Clock::now();
    set_progress(gstep, "update_critic");
    for (const auto& [k, v] : critic_->update(b, values, step_)) m[k] = v;
    m["timing_s/update_critic"] = seconds_since(t0);
    for (const auto& [k, v] : critic_data_metrics(values, b.returns)) m[k] = v;
  }

  // verl: the actor is updated once global_steps (1-based) reaches critic_warmup.
  if (opt_.critic_warmup <= step_ + 1) {
    t0 = Clock::now();
    set_progress(gstep, "update_actor");
    for (const auto& [k, v] : update_actor(b)) m[k] = v;
    m["timing_s/update_actor"] = seconds_since(t0);
  }
  ++step_;

  t0 = Clock::now();
  set_progress(gstep, "update_weights");
  if (disaggregated_) {
    // The rollout ranks' next weights, sent by the trainer leader while the next step runs (none after the
    // last step). A validation due after this step runs on the rollout ranks with these weights (fit()
    // receives it).
    const bool validate = !val_.empty() && opt_.test_freq > 0 &&
                          (step_ % opt_.test_freq == 0 || step_ == opt_.total_steps);
    if (remote_ && (step_ < opt_.total_steps || validate)) {
      remote_version_ = actor_weight_version();
      m["perf/reshard_bytes"] = double(remote_->publish(actor_->model(), step_, remote_version_, validate));
    }
    m["timing_s/update_weights"] = seconds_since(t0);
  } else {
    const rollout::ReshardStats& rs = rollout_->sync();  // the view to the actor's new version
    m["timing_s/update_weights"] = seconds_since(t0);
    if (!rollout_->view().in_place()) m["perf/reshard_bytes"] = double(rs.bytes_received);
  }

  add_data_metrics(b, seconds_since(t_step), m);
  if (remote_ && m["timing_s/step"] > 0)  // verl's trainer/idle_ratio: the share of the step spent waiting for data
    m["trainer/idle_ratio"] = m["fully_async/trainer/wait_rollout_s"] / m["timing_s/step"];
  return m;
}

void RlTrainer::add_data_metrics(const RolloutBatch& b, double secs, std::map<std::string, double>& m) const {
  // Data metrics (verl's compute_data_metrics), over response tokens.
  add_stats(m, "critic/score", b.scores);
  {
    std::vector<double> seq_rewards;  // verl's sequence_reward: token rewards summed
    for (int64_t i = 0; i < b.size(); ++i) {
      double s = 0;
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) s += b.token_rewards[size_t(t)];
      seq_rewards.push_back(b.layout.length(i) > 0 ? s : b.scores[size_t(i)]);
    }
    add_stats(m, "critic/rewards", seq_rewards);
  }
  {  // verl: over the tokens of response_mask (rejection sampling leaves some out)
    std::vector<double> adv, ret;
    for (size_t t = 0; t < b.advantages.size(); ++t)
      if (b.mask_at(int64_t(t)) > 0) adv.push_back(b.advantages[t]), ret.push_back(b.returns[t]);
    add_stats(m, "critic/advantages", adv);
    add_stats(m, "critic/returns", ret);
  }
  std::vector<double> rlen, plen;
  double rclip = 0, pclip = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t R = int64_t(b.responses[size_t(i)].size()), P = int64_t(b.prompts[size_t(i)].size());
    rlen.push_back(double(R));
    plen.push_back(double(P));
    rclip += R >= opt_.response_length ? 1 : 0;
    pclip += P >= opt_.max_prompt_length ? 1 : 0;
    tokens += P + R;
  }
  add_stats(m, "response_length", rlen);
  add_stats(m, "prompt_length", plen);
  m["response_length/clip_ratio"] = rclip / double(b.size());
  m["prompt_length/clip_ratio"] = pclip / double(b.size());
  m["training/global_step"] = double(step_);
  m["training/epoch"] = double(source_->epoch());
  m["timing_s/step"] = secs;
  m["perf/total_num_tokens"] = double(tokens);
  m["perf/time_per_step"] = secs;
  m["perf/throughput"] = secs > 0 ? double(tokens) / secs : 0.0;
}

namespace {
// Ctrl-C: every rank stops after the same step (rank 0's flag decides), then
// the process ends as SIGINT does (train/run_control.h).
void stop_if_interrupted(comm::ProcessGroup& world, int64_t step, const std::string& ckpt_root, bool leader) {
  int32_t stop = train::interrupt_requested() ? 1 : 0;
  if (world.size() > 1) world.broadcast(&stop, 1, DType::I32, 0);
  if (stop) train::end_interrupted(step, ckpt_root, "kestrel train", leader);
}
}  // namespace

Status RlTrainer::fit() {
  if (!opt_.ckpt_root.empty() && is_world_leader()) train::remove_stale_checkpoint_temps(opt_.ckpt_root);
  opt_.parallel.world->barrier();
  std::string resume_dir;
  if (opt_.resume_mode == "auto") {
    if (!opt_.ckpt_root.empty()) {
      KS_ASSIGN(auto latest, train::latest_checkpoint_step(opt_.ckpt_root));
      if (latest) resume_dir = train::checkpoint_dir(opt_.ckpt_root, *latest);
    }
  } else if (opt_.resume_mode == "resume_path") {
    if (opt_.resume_from_path.empty())
      return KS_ERR("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)");
    resume_dir = opt_.resume_from_path;
  } else if (opt_.resume_mode != "disable") {
    return KS_ERR("trainer.resume_mode: '", opt_.resume_mode, "' is not one of auto, disable, resume_path");
  }
  if (!resume_dir.empty()) {
    KS_TRY(load_checkpoint(resume_dir).with_context("resuming from " + resume_dir));
    std::fprintf(stderr, "resumed from %s (step %lld)\n", resume_dir.c_str(), (long long)step_);
    if (is_world_leader())
      train::report_if_finished(step_, opt_.total_steps, resume_dir, "trainer.total_training_steps",
                                "trainer.default_local_dir");
  }
  if (remote_) start_remote_rollout();
  train::install_interrupt_handler();
  fit_start_step_ = step_;
  const auto t_fit = Clock::now();
  if (step_ == 0 && opt_.val_before_train) {
    auto v = validate();
    if (logger_) logger_->log(0, v);
  }
  train::ProgressBar bar(opt_.total_steps, step_);
  double val_secs = seconds_since(t_fit);  // the latest validation's duration (the first: all so far)
  while (step_ < opt_.total_steps) {
    const auto t_step = Clock::now();
    auto m = train_step();
    if (data_exhausted_) {  // verl: the data loader's total_epochs passes are spent
      if (opt_.progress) bar.finish();
      if (is_world_leader())
        std::fprintf(stderr, "train: dynamic sampling used up trainer.total_epochs=%lld passes over the data after "
                             "step %lld of %lld; stopping\n",
                     (long long)opt_.total_epochs, (long long)step_, (long long)opt_.total_steps);
      if (opt_.save_freq > 0 && !opt_.ckpt_root.empty() && step_ > 0 && step_ % opt_.save_freq != 0)
        KS_TRY(save_checkpoint());
      break;
    }
    // trainer.time_budget_s: stop after this step when another step and the
    // final validation would overrun the budget (rank 0 decides for all).
    int32_t out_of_time = 0;
    if (opt_.time_budget_s > 0) {
      out_of_time = seconds_since(t_fit) + seconds_since(t_step) + val_secs > opt_.time_budget_s ? 1 : 0;
      opt_.parallel.world->broadcast(&out_of_time, 1, DType::I32, 0);
      if (out_of_time && is_world_leader() && step_ < opt_.total_steps) {
        if (opt_.progress) bar.finish();
        std::fprintf(stderr, "train: trainer.time_budget_s=%g reached: stopping after step %lld of %lld\n",
                     opt_.time_budget_s, (long long)step_, (long long)opt_.total_steps);
      }
    }
    const bool last = step_ == opt_.total_steps || out_of_time;
    if (opt_.progress) {
      char status[96];
      std::snprintf(status, sizeof status, "score %.3f len %.1f", m["critic/score/mean"], m["response_length/mean"]);
      bar.update(step_, int64_t(m["perf/total_num_tokens"]), status);
    }
    if (opt_.test_freq > 0 && (step_ % opt_.test_freq == 0 || last)) {
      if (opt_.progress) bar.finish();
      const auto t_val = Clock::now();
      set_progress(step_, "validate");
      for (const auto& [k, v] : validate()) m[k] = v;
      val_secs = seconds_since(t_val);
    }
    if (logger_) logger_->log(step_, m);
    if (opt_.save_freq > 0 && !opt_.ckpt_root.empty() && (step_ % opt_.save_freq == 0 || last)) {
      const auto t0 = Clock::now();
      set_progress(step_, "save_checkpoint");
      KS_TRY(save_checkpoint());
      (void)seconds_since(t0);
    }
    if (out_of_time) break;
    stop_if_interrupted(*opt_.parallel.world, step_, opt_.ckpt_root, is_world_leader());
  }
  if (opt_.progress) bar.finish();
  if (remote_) remote_->stop();  // the rollout ranks end (after the last step, or early), nothing left in flight
  return Status::ok();
}

std::vector<StoredGroup> RlTrainer::receive_remote_batch(std::map<std::string, double>& m) {
  comm::ProcessGroup& world = *opt_.parallel.world;
  std::vector<StoredGroup> groups;
  std::string wire;  // the trainer leader's batch for the other trainer ranks: {groups, metrics} as JSON
  if (remote_) {
    groups = remote_->receive_batch(step_, m);
    m["fully_async/trainer/wait_rollout_s"] = remote_->take_wait_seconds();
    if (world.size() == 1) return groups;
    nlohmann::ordered_json j;
    j["groups"] = nlohmann::ordered_json::array();
    for (const StoredGroup& g : groups) j["groups"].push_back(group_to_json(g));
    j["metrics"] = m;
    wire = j.dump();
  }
  int64_t n = int64_t(wire.size());
  world.broadcast(&n, 1, DType::I64, 0);
  wire.resize(size_t(n));
  world.broadcast(wire.data(), n, DType::U8, 0);
  if (remote_) return groups;
  const nlohmann::json j = nlohmann::json::parse(wire);
  for (const auto& jg : j.at("groups")) groups.push_back(group_from_json(jg, "the trainer leader's batch").value());
  for (const auto& [k, v] : j.at("metrics").items()) m[k] = v.get<double>();
  return groups;
}

void RlTrainer::start_remote_rollout() {
  remote_version_ = actor_weight_version();
  remote_->start(step_, resume_state_, actor_->model(), remote_version_,
                 step_ == 0 && opt_.val_before_train && !val_.empty());
}

}  // namespace kestrel::rl
