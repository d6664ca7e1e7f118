#include "rl/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/rng.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "rl/distributed.h"
#include "rollout/reshard.h"
#include "train/checkpoint.h"
#include "train/micro_batch.h"
#include "train/token_objective.h"

namespace kestrel::rl {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

RlTrainer::RlTrainer(model::CausalLM& actor, std::unique_ptr<model::CausalLM> ref, std::vector<RlPrompt> train,
                     std::vector<RlPrompt> val, std::unique_ptr<train::BatchSource> source, RewardManager& rewards,
                     std::function<std::string(const std::vector<int32_t>&)> decode, RlOptions opt,
                     train::MetricsLogger* logger, std::unique_ptr<Critic> critic)
    : actor_(actor), ref_(std::move(ref)), train_(std::move(train)), val_(std::move(val)), source_(std::move(source)),
      rewards_(rewards), decode_(std::move(decode)), opt_(std::move(opt)), logger_(logger), critic_(std::move(critic)) {
  KS_CHECK(!train_.empty(), "RL: no training prompts");
  KS_CHECK(opt_.total_steps > 0, "RL: total steps must be positive");
  KS_CHECK(opt_.n >= 1 && opt_.train_batch_size >= 1, "RL: train_batch_size and rollout.n must be >= 1");
  KS_CHECK(opt_.ppo_mini_batch_size >= 1 && opt_.ppo_epochs >= 1, "RL: ppo_mini_batch_size and ppo_epochs must be >= 1");
  KS_CHECK(!opt_.loss.use_kl_loss || ref_, "RL: use_kl_loss needs a reference model");
  KS_CHECK(!opt_.use_kl_in_reward || ref_, "RL: algorithm.use_kl_in_reward needs a reference model");
  if (opt_.use_kl_in_reward) parse_kl_type(opt_.kl_penalty).value();
  KS_CHECK(opt_.adv_estimator != AdvEstimator::GAE || critic_,
           "RL: algorithm.adv_estimator=gae needs a critic (critic.enable, critic.model.path)");
  const int world = opt_.parallel.world->size(), dp = opt_.parallel.dp->size();
  KS_CHECK(opt_.train_batch_size % dp == 0, "data.train_batch_size=", opt_.train_batch_size,
           " must divide by the data-parallel size ", dp);
  KS_CHECK(opt_.ppo_mini_batch_size % dp == 0, "actor_rollout_ref.actor.ppo_mini_batch_size=", opt_.ppo_mini_batch_size,
           " must divide by the data-parallel size ", dp);
  if (opt_.lr.total_steps <= 0) opt_.lr.total_steps = opt_.total_steps;
  // Under mpirun (dp > 1 or tp > 1) the engine keeps the gradients in
  // DataParallel's flat buffer, summed over dp (every rank's loss already
  // carries the global denominators); one process keeps the plain path.
  train::EngineOptions eo;
  eo.adamw = opt_.adamw;
  eo.lr = opt_.lr;
  eo.clip_grad = opt_.clip_grad;
  eo.parallel.dp = opt_.parallel.dp;
  eo.parallel.distributed_optimizer = opt_.parallel.distributed_optimizer;
  actor_engine_ = std::make_unique<train::TrainingEngine>(actor_, std::move(eo));
  if (critic_ && world > 1) {
    KS_CHECK(critic_->model().tp().size() == actor_.tp().size(), "RL: the critic's tensor-parallel size ",
             critic_->model().tp().size(), " must equal the actor's ", actor_.tp().size(),
             " (critic.megatron.tensor_model_parallel_size)");
    critic_->use_parallel(opt_.parallel, opt_.balance_batch);  // the critic trains over the actor's dp group
  }
  rollout::RolloutWeightsOptions ro;
  ro.tp = opt_.parallel.rollout_tp;
  rollout_weights_ = rollout::RolloutWeights::create(actor_, ro);
  const int rtp = ro.tp ? ro.tp->size() : actor_.tp().size();
  KS_CHECK(world % rtp == 0, "rollout tensor-parallel size ", rtp, " must divide the world size ", world);
  rollout_groups_ = world / rtp;
  rollout_group_ = opt_.parallel.world->rank() / rtp;
  rollout_leader_ = opt_.parallel.world->rank() % rtp == 0;
  auto eng = rollout::Engine::create(rollout_weights_->model(), opt_.engine);
  if (!eng) KS_FAIL("RL: cannot start the rollout engine: ", eng.status().message());
  engine_ = std::move(eng).value();
}

std::vector<int64_t> RlTrainer::dp_share(const RolloutBatch& b) const {
  return rl::dp_share(b, *opt_.parallel.dp, opt_.balance_batch);
}

RlTrainer::~RlTrainer() = default;

void RlTrainer::wake_engine() {
  if (engine_->is_sleeping()) engine_->wake_up();
}

RolloutBatch RlTrainer::generate(const std::vector<int64_t>& prompt_idx) {
  wake_engine();
  rollout::SamplingParams sp;
  sp.temperature = opt_.temperature;
  sp.top_k = opt_.top_k;
  sp.top_p = opt_.top_p;
  sp.max_tokens = opt_.response_length;
  sp.n = opt_.n;
  // This rollout group's share of the prompts; the seeds use the step-wide
  // index, so the samples do not depend on the layout.
  const auto [p0, p1] = share_range(int64_t(prompt_idx.size()), rollout_group_, rollout_groups_);
  for (int64_t k = p0; k < p1; ++k) {
    sp.seed = rollout_request_seed(opt_.rollout_seed, step_, k);
    engine_->add_request(std::to_string(k), train_[size_t(prompt_idx[size_t(k)])].ids, sp).throw_if_error();
  }
  const auto outs = engine_->run_to_completion();
  KS_CHECK(int64_t(outs.size()) == p1 - p0, "rollout: ", outs.size(), " outputs for ", p1 - p0, " prompts");
  std::vector<WireResponse> mine;
  for (size_t k = 0; k < outs.size(); ++k)
    for (const auto& c : outs[k].outputs) mine.push_back({p0 + int64_t(k), c.index, c.token_ids, c.logprobs});
  const std::vector<WireResponse> all = opt_.parallel.world->size() > 1
                                            ? all_gather_responses(*opt_.parallel.world, mine, rollout_leader_)
                                            : mine;
  KS_CHECK(int64_t(all.size()) == int64_t(prompt_idx.size()) * opt_.n, "rollout: ", all.size(), " responses for ",
           prompt_idx.size(), " prompts x n=", opt_.n);
  RolloutBatch b;
  for (const WireResponse& r : all) {
    b.prompts.push_back(train_[size_t(prompt_idx[size_t(r.prompt)])].ids);
    b.responses.push_back(r.tokens);
    b.group.push_back(r.prompt);
    b.rollout_logp.insert(b.rollout_logp.end(), r.logprobs.begin(), r.logprobs.end());
  }
  b.finalize_layout();
  if (int64_t(b.rollout_logp.size()) != b.layout.num_tokens()) b.rollout_logp.clear();
  b.weight_version = rollout_version_;
  return b;
}

void RlTrainer::compute_rewards(RolloutBatch& b, const std::vector<int64_t>& prompt_idx,
                                std::map<std::string, double>& m) {
  std::vector<RewardRequest> reqs;
  for (int64_t i = 0; i < b.size(); ++i) {
    const RlPrompt& p = train_[size_t(prompt_idx[size_t(b.group[size_t(i)])])];
    reqs.push_back({p.data_source, decode_(b.responses[size_t(i)]), p.ground_truth, p.extra_info});
  }
  // Scored once, on world rank 0 (a reward program runs once per response);
  // every rank gets the scores.
  RewardBatchResult r;
  if (is_world_leader()) {
    if (reward_fn_) {
      for (const auto& q : reqs) r.scores.push_back(reward_fn_(q));
    } else {
      r = rewards_.score(reqs);
    }
  }
  broadcast_doubles(*opt_.parallel.world, r.scores);
  b.scores = r.scores;
  // verl's token_level_scores: the outcome score on the last response token.
  b.token_rewards.assign(size_t(b.layout.num_tokens()), 0.0);
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.layout.length(i) > 0) b.token_rewards[size_t(b.layout.end(i) - 1)] = b.scores[size_t(i)];
  for (const auto& [k, v] : RewardManager::metrics(r.failures)) m[k] = v;
}

void RlTrainer::compute_log_probs(RolloutBatch& b, bool old, bool ref) {
  // Each dp rank scores its share; every rank then holds all of them.
  const std::vector<int64_t> all = dp_share(b);
  // log_prob_micro_batch_size > 0: micro-batches of that many sequences, else by token budget.
  const int64_t count = opt_.log_prob_micro_batch_size;
  const int64_t budget = count > 0 ? 0 : opt_.log_prob_max_token_len;
  auto score = [&](const model::CausalLM& m, std::vector<double>& out) {
    out.assign(size_t(b.layout.num_tokens()), 0.0);
    std::vector<train::MicroBatch> micro;
    for (auto& grp : split_mini_batch(b, all, budget, count, opt_.share_prompts)) {
      PackedSequences packed = pack_rollout_sequences(b, grp, opt_.share_prompts);
      micro.push_back({std::move(packed.batch), std::move(grp), std::move(packed.rows)});
    }
    train::score_micro_batches(m, micro, [&](size_t g, const Tensor& logprob) {  // f32 [T]
      const float* lp = logprob.data<float>();
      const std::vector<int64_t>& rows = micro[g].rows;
      size_t k = 0;
      for (int64_t i : micro[g].seqs)
        for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(lp[rows[k++]]);
    });
    all_gather_token_values(*opt_.parallel.dp, b, all, out);
  };
  if (old) score(actor_, b.old_logp);
  if (ref) score(*ref_, b.ref_logp);
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

std::map<std::string, double> RlTrainer::update_actor(const RolloutBatch& b) {
  engine_->sleep();  // colocated: the KV cache is released while training
  rollout_weights_->release();  // a resharded rollout copy too (no-op in place)
  // This dp rank's sequences; mini-batches are this rank's part of the global ones.
  const std::vector<int64_t> local = dp_share(b);
  const int dp = opt_.parallel.dp->size();
  const int64_t B = int64_t(local.size());
  const int64_t mini = std::min(B, opt_.ppo_mini_batch_size * opt_.n / dp);
  const double scale = opt_.loss_scale_factor > 0 ? opt_.loss_scale_factor : double(opt_.response_length);
  const double lr = actor_engine_->lr(step_);
  LossTotals sum;    // over all mini-batches of all epochs
  LossTotals first;  // the first mini-batch: trained on the policy that sampled it
  double grad_norm = 0, skipped = 0, zero_adv_seqs = 0;
  int64_t n_updates = 0, n_micro = 0;
  for (int64_t e = 0; e < opt_.ppo_epochs; ++e) {
    std::vector<int64_t> order = local;
    if (opt_.shuffle) {
      const std::vector<int64_t> perm = ppo_epoch_order(B, opt_.data_loader_seed, step_, e);
      for (int64_t i = 0; i < B; ++i) order[size_t(i)] = local[size_t(perm[size_t(i)])];
    }
    for (int64_t s0 = 0; s0 < B; s0 += mini) {
      const std::vector<int64_t> mb(order.begin() + s0, order.begin() + std::min(B, s0 + mini));
      PolicyLossConfig cfg = opt_.loss;
      cfg.agg = mini_batch_scope(b, mb, opt_.loss.agg.mode, scale);
      if (dp > 1) {  // the mini-batch's denominators span every dp rank's part
        std::vector<double> d = {cfg.agg.global_tokens, cfg.agg.global_seqs};
        sum_doubles(*opt_.parallel.dp, d);
        cfg.agg.global_tokens = d[0], cfg.agg.global_seqs = d[1];
      }
      LossTotals t;
      const std::vector<int64_t> active = sequences_with_gradient(b, mb, cfg);
      zero_adv_seqs += double(mb.size() - active.size());
      std::vector<train::MicroBatch> micro;
      if (!active.empty())
        for (auto& g : split_mini_batch(b, active, opt_.max_token_len,
                                        opt_.micro_batch_size > 0 ? opt_.micro_batch_size : int64_t(active.size()),
                                        opt_.share_prompts)) {
          PackedSequences packed = pack_rollout_sequences(b, g, opt_.share_prompts);
          micro.push_back({std::move(packed.batch), std::move(g), std::move(packed.rows)});
        }
      train::maybe_crash("train_step", step_ + 1);
      const train::MiniBatchResult r = actor_engine_->train_mini_batch(
          micro,
          [&](const train::MicroBatch& mbt, size_t) {
            train::Objective o;
            o.tokens = micro_batch_objective(b, mbt.seqs, mbt.rows, cfg, &t);
            o.need_entropy_grad = cfg.entropy_coeff != 0;
            return o;
          },
          lr);
      n_micro += r.micro_batches;
      all_reduce_totals(*opt_.parallel.dp, t);
      if (n_updates == 0) first = t;
      if (!r.finite) skipped += 1;
      grad_norm += r.grad_norm;
      ++n_updates;
      sum.loss += t.loss;
      sum.pg_loss += t.pg_loss;
      sum.kl_loss += t.kl_loss;
      sum.clipfrac_tokens += t.clipfrac_tokens;
      sum.clipfrac_lower_tokens += t.clipfrac_lower_tokens;
      sum.ppo_kl_tokens += t.ppo_kl_tokens;
      sum.entropy_tokens += t.entropy_tokens;
      sum.tokens += t.tokens;
    }
  }
  // Loss-like metrics are per mini-batch values averaged over the updates;
  // fractions are token-weighted over everything trained this step.
  sum.loss /= double(n_updates);
  sum.pg_loss /= double(n_updates);
  sum.kl_loss /= double(n_updates);
  auto m = sum.metrics();
  m["actor/grad_norm"] = grad_norm / double(n_updates);
  m["actor/lr"] = lr;
  m["actor/kl_coef"] = opt_.loss.use_kl_loss ? opt_.loss.kl_loss_coef : 0.0;
  m["actor/num_updates"] = double(n_updates);
  m["actor/num_micro_batches"] = double(n_micro);
  m["actor/step_skipped"] = skipped;
  // Sequences left out of the forward/backward because their gradient is zero
  // (sequences_with_gradient); token metrics above are over the trained ones.
  {
    std::vector<double> z = {zero_adv_seqs, double(B)};
    sum_doubles(*opt_.parallel.dp, z);
    m["actor/zero_adv_seq_frac"] = z[0] / (z[1] * double(opt_.ppo_epochs));
  }
  if (first.rollout_diff_tokens > 0) {
    // verl's rollout_probs_diff: the engine and the actor must agree on the policy.
    m["training/rollout_probs_diff_mean"] = first.rollout_diff_sum / first.rollout_diff_tokens;
    m["training/rollout_probs_diff_max"] = first.rollout_diff_max;
  }
  return m;
}

std::map<std::string, double> RlTrainer::train_step() {
  const auto t_step = Clock::now();
  std::map<std::string, double> m;
  const std::vector<int64_t> idx = source_->next_batch();

  auto t0 = Clock::now();
  RolloutBatch b = generate(idx);
  m["timing_s/gen"] = seconds_since(t0);

  t0 = Clock::now();
  compute_rewards(b, idx, m);
  m["timing_s/reward"] = seconds_since(t0);

  // Old log-probs are needed when the policy moves before a sequence is
  // trained on (several epochs or mini-batches) and by the in-reward KL; else
  // old = current, detached.
  // Data of older weights than the actor's (weight_version) is off-policy too.
  const bool need_old = opt_.ppo_epochs > 1 || opt_.ppo_mini_batch_size * opt_.n < b.size() ||
                        opt_.use_kl_in_reward || b.weight_version != actor_weight_version();
  t0 = Clock::now();
  compute_log_probs(b, need_old, false);
  m["timing_s/old_log_prob"] = seconds_since(t0);
  t0 = Clock::now();
  compute_log_probs(b, false, opt_.loss.use_kl_loss || opt_.use_kl_in_reward);
  m["timing_s/ref"] = seconds_since(t0);

  std::vector<double> values;
  if (critic_) {
    engine_->sleep();  // colocated: the KV cache is released while the critic runs
    t0 = Clock::now();
    values = critic_->values(b);
    m["timing_s/values"] = seconds_since(t0);
  }

  t0 = Clock::now();
  if (opt_.use_kl_in_reward) apply_kl_penalty(b, m);
  compute_advantage(b, critic_ ? &values : nullptr);
  m["timing_s/adv"] = seconds_since(t0);

  if (critic_) {
    t0 = Clock::now();
    for (const auto& [k, v] : critic_->update(b, b.returns, values, step_)) m[k] = v;
    m["timing_s/update_critic"] = seconds_since(t0);
    for (const auto& [k, v] : critic_data_metrics(values, b.returns)) m[k] = v;
  }

  // verl: the actor is updated once global_steps (1-based) reaches critic_warmup.
  if (opt_.critic_warmup <= step_ + 1) {
    t0 = Clock::now();
    for (const auto& [k, v] : update_actor(b)) m[k] = v;
    m["timing_s/update_actor"] = seconds_since(t0);
  }
  ++step_;

  t0 = Clock::now();
  const rollout::ReshardStats& rs = rollout_weights_->refresh();  // train -> rollout layout (no-op in place)
  engine_->wake_up();
  engine_->update_weights_version();
  rollout_version_ = actor_weight_version();
  m["timing_s/update_weights"] = seconds_since(t0);
  if (!rollout_weights_->in_place()) m["perf/reshard_bytes"] = double(rs.bytes_received);

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
  add_stats(m, "critic/advantages", b.advantages);
  add_stats(m, "critic/returns", b.returns);
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
  const double secs = seconds_since(t_step);
  m["timing_s/step"] = secs;
  m["perf/total_num_tokens"] = double(tokens);
  m["perf/time_per_step"] = secs;
  m["perf/throughput"] = secs > 0 ? double(tokens) / secs : 0.0;
  return m;
}

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
  }
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
      for (const auto& [k, v] : validate()) m[k] = v;
      val_secs = seconds_since(t_val);
    }
    if (logger_) logger_->log(step_, m);
    if (opt_.save_freq > 0 && !opt_.ckpt_root.empty() && (step_ % opt_.save_freq == 0 || last)) {
      const auto t0 = Clock::now();
      KS_TRY(save_checkpoint());
      (void)seconds_since(t0);
    }
    if (out_of_time) break;
  }
  if (opt_.progress) bar.finish();
  return Status::ok();
}

}  // namespace kestrel::rl
