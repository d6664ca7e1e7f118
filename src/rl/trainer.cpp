#include "rl/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/files.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/scoring.h"
#include "optim/grad_clip.h"
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

// Fisher-Yates from Philox(seed, stream): the mini-batch order of one PPO epoch.
std::vector<int64_t> shuffled(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = philox4x32(uint64_t(i), stream, seed);
    const int64_t j = int64_t(u32x2_to_unit_double(r[0], r[1]) * double(i + 1));
    std::swap(order[size_t(i)], order[size_t(std::min(j, i))]);
  }
  return order;
}

constexpr const char* kMasterPrefix = "master.";

}  // namespace

uint64_t rollout_request_seed(uint64_t seed, int64_t step, int64_t index) {
  return splitmix64(splitmix64(seed) ^ splitmix64(uint64_t(step) * 0x100000001B3ull + uint64_t(index)));
}

RlTrainer::RlTrainer(model::CausalLM& actor, std::unique_ptr<model::CausalLM> ref, std::vector<RlPrompt> train,
                     std::vector<RlPrompt> val, std::unique_ptr<train::BatchSource> source, RewardManager& rewards,
                     std::function<std::string(const std::vector<int32_t>&)> decode, RlOptions opt,
                     train::MetricsLogger* logger)
    : actor_(actor), ref_(std::move(ref)), train_(std::move(train)), val_(std::move(val)), source_(std::move(source)),
      rewards_(rewards), decode_(std::move(decode)), opt_(std::move(opt)), logger_(logger) {
  KS_CHECK(!train_.empty(), "RL: no training prompts");
  KS_CHECK(opt_.total_steps > 0, "RL: total steps must be positive");
  KS_CHECK(opt_.n >= 1 && opt_.train_batch_size >= 1, "RL: train_batch_size and rollout.n must be >= 1");
  KS_CHECK(opt_.ppo_mini_batch_size >= 1 && opt_.ppo_epochs >= 1, "RL: ppo_mini_batch_size and ppo_epochs must be >= 1");
  KS_CHECK(!opt_.loss.use_kl_loss || ref_, "RL: use_kl_loss needs a reference model");
  if (opt_.adv_estimator == AdvEstimator::GAE)
    KS_FAIL("not supported yet: algorithm.adv_estimator=gae (no critic model yet); use grpo, rloo or reinforce_plus_plus");
  actor_.enable_grads();
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : actor_.params()) {
    optim::ParamSlot s;
    s.name = p->name;
    s.grad = p->grad;
    s.decay = p->weight_decay;
    if (p->weight.dtype() == DType::F32) {
      s.master = p->weight;  // updated in place: the rollout engine reads these weights
    } else {
      s.master = p->weight.to(DType::F32, MemCategory::OptimizerState);
      s.model_copy = p->weight;
    }
    slots.push_back(std::move(s));
  }
  optim_ = std::make_unique<optim::AdamW>(std::move(slots), opt_.adamw);
  if (opt_.lr.total_steps <= 0) opt_.lr.total_steps = opt_.total_steps;
  sched_ = std::make_unique<optim::LrSchedule>(opt_.lr);
  auto eng = rollout::Engine::create(actor_, opt_.engine);
  if (!eng) KS_FAIL("RL: cannot start the rollout engine: ", eng.status().message());
  engine_ = std::move(eng).value();
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
  for (size_t k = 0; k < prompt_idx.size(); ++k) {
    sp.seed = rollout_request_seed(opt_.rollout_seed, step_, int64_t(k));
    engine_->add_request(std::to_string(k), train_[size_t(prompt_idx[k])].ids, sp).throw_if_error();
  }
  const auto outs = engine_->run_to_completion();
  KS_CHECK(outs.size() == prompt_idx.size(), "rollout: ", outs.size(), " outputs for ", prompt_idx.size(), " prompts");
  RolloutBatch b;
  for (size_t k = 0; k < outs.size(); ++k) {
    for (const auto& c : outs[k].outputs) {
      b.prompts.push_back(train_[size_t(prompt_idx[k])].ids);
      b.responses.push_back(c.token_ids);
      b.group.push_back(int64_t(k));
      b.rollout_logp.insert(b.rollout_logp.end(), c.logprobs.begin(), c.logprobs.end());
    }
  }
  b.finalize_layout();
  if (int64_t(b.rollout_logp.size()) != b.layout.num_tokens()) b.rollout_logp.clear();
  return b;
}

void RlTrainer::compute_rewards(RolloutBatch& b, const std::vector<int64_t>& prompt_idx,
                                std::map<std::string, double>& m) {
  std::vector<RewardRequest> reqs;
  for (int64_t i = 0; i < b.size(); ++i) {
    const RlPrompt& p = train_[size_t(prompt_idx[size_t(b.group[size_t(i)])])];
    reqs.push_back({p.data_source, decode_(b.responses[size_t(i)]), p.ground_truth, p.extra_info});
  }
  RewardBatchResult r;
  if (reward_fn_) {
    for (const auto& q : reqs) r.scores.push_back(reward_fn_(q));
  } else {
    r = rewards_.score(reqs);
  }
  b.scores = r.scores;
  // verl's token_level_scores: the outcome score on the last response token.
  b.token_rewards.assign(size_t(b.layout.num_tokens()), 0.0);
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.layout.length(i) > 0) b.token_rewards[size_t(b.layout.end(i) - 1)] = b.scores[size_t(i)];
  for (const auto& [k, v] : RewardManager::metrics(r.failures)) m[k] = v;
}

void RlTrainer::compute_log_probs(RolloutBatch& b, bool old, bool ref) {
  std::vector<int64_t> all(static_cast<size_t>(b.size()), 0);
  for (int64_t i = 0; i < b.size(); ++i) all[size_t(i)] = i;
  auto score = [&](const model::CausalLM& m, std::vector<double>& out) {
    out.assign(size_t(b.layout.num_tokens()), 0.0);
    for (const auto& grp : split_mini_batch(b, all, opt_.log_prob_max_token_len, 0)) {
      std::vector<std::vector<int32_t>> seqs;
      for (int64_t i : grp) seqs.push_back(b.sequence(i));
      const model::PackedBatch pb = model::pack_sequences(seqs);
      const model::TokenScores s = model::score_tokens(m, pb);
      const float* lp = s.logprob.data<float>();
      const std::vector<int64_t> rows = response_rows(b, grp);
      size_t k = 0;
      for (int64_t i : grp)
        for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(lp[rows[k++]]);
    }
  };
  if (old) score(actor_, b.old_logp);
  if (ref) score(*ref_, b.ref_logp);
}

void RlTrainer::compute_advantage(RolloutBatch& b) {
  AdvantageInput in;
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
  const int64_t B = b.size();
  const int64_t mini = std::min(B, opt_.ppo_mini_batch_size * opt_.n);
  const double scale = opt_.loss_scale_factor > 0 ? opt_.loss_scale_factor : double(opt_.response_length);
  const double lr = sched_->lr(step_);
  LossTotals sum;    // over all mini-batches of all epochs
  LossTotals first;  // the first mini-batch: trained on the policy that sampled it
  double grad_norm = 0, skipped = 0;
  int64_t n_updates = 0, n_micro = 0;
  for (int64_t e = 0; e < opt_.ppo_epochs; ++e) {
    std::vector<int64_t> order(static_cast<size_t>(B), 0);
    for (int64_t i = 0; i < B; ++i) order[size_t(i)] = i;
    if (opt_.shuffle) order = shuffled(B, opt_.data_loader_seed, uint64_t(step_) * 1024 + uint64_t(e));
    for (int64_t s0 = 0; s0 < B; s0 += mini) {
      const std::vector<int64_t> mb(order.begin() + s0, order.begin() + std::min(B, s0 + mini));
      actor_.zero_grads();
      PolicyLossConfig cfg = opt_.loss;
      cfg.agg = mini_batch_scope(b, mb, opt_.loss.agg.mode, scale);
      LossTotals t;
      const auto micro = split_mini_batch(b, mb, opt_.max_token_len,
                                          opt_.micro_batch_size > 0 ? opt_.micro_batch_size : int64_t(mb.size()));
      for (size_t g = 0; g < micro.size(); ++g) {
        std::vector<std::vector<int32_t>> seqs;
        for (int64_t i : micro[g]) seqs.push_back(b.sequence(i));
        const model::PackedBatch pb = model::pack_sequences(seqs);
        train::forward_backward(actor_, pb, micro_batch_objective(b, micro[g], cfg, &t), cfg.entropy_coeff != 0);
        if (g == 0) train::maybe_crash("train_step", step_ + 1);
      }
      n_micro += int64_t(micro.size());
      if (n_updates == 0) first = t;
      const optim::ClipResult clip = optim::clip_grad_norm(optim_->params(), opt_.clip_grad);
      if (clip.finite) optim_->step(lr);
      else skipped += 1;
      grad_norm += clip.norm;
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
  // trained on (several epochs or mini-batches); else old = current, detached.
  const bool need_old = opt_.ppo_epochs > 1 || opt_.ppo_mini_batch_size * opt_.n < b.size();
  t0 = Clock::now();
  compute_log_probs(b, need_old, false);
  m["timing_s/old_log_prob"] = seconds_since(t0);
  t0 = Clock::now();
  compute_log_probs(b, false, opt_.loss.use_kl_loss);
  m["timing_s/ref"] = seconds_since(t0);

  t0 = Clock::now();
  compute_advantage(b);
  m["timing_s/adv"] = seconds_since(t0);

  t0 = Clock::now();
  for (const auto& [k, v] : update_actor(b)) m[k] = v;
  m["timing_s/update_actor"] = seconds_since(t0);
  ++step_;

  t0 = Clock::now();
  engine_->wake_up();
  engine_->update_weights_version();
  m["timing_s/update_weights"] = seconds_since(t0);

  // Data metrics (verl's compute_data_metrics), over response tokens.
  add_stats(m, "critic/score", b.scores);
  add_stats(m, "critic/rewards", b.scores);  // no KL in reward: rewards == scores
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

std::map<std::string, double> RlTrainer::validate() {
  std::map<std::string, double> out;
  if (val_.empty()) return out;
  const auto t0 = Clock::now();
  wake_engine();
  rollout::SamplingParams sp;
  sp.temperature = opt_.val_temperature;
  sp.top_k = opt_.val_top_k;
  sp.top_p = opt_.val_top_p;
  sp.max_tokens = opt_.response_length;
  sp.n = opt_.val_n;
  for (size_t k = 0; k < val_.size(); ++k) {
    sp.seed = rollout_request_seed(opt_.rollout_seed ^ 0x76616c69ull, 0, int64_t(k));  // fixed: comparable across steps
    engine_->add_request(std::to_string(k), val_[k].ids, sp).throw_if_error();
  }
  const auto outs = engine_->run_to_completion();
  std::vector<RewardRequest> reqs;
  std::vector<size_t> owner;
  double len = 0;
  for (size_t k = 0; k < outs.size(); ++k)
    for (const auto& c : outs[k].outputs) {
      reqs.push_back({val_[k].data_source, decode_(c.token_ids), val_[k].ground_truth, val_[k].extra_info});
      owner.push_back(k);
      len += double(c.token_ids.size());
    }
  RewardBatchResult r;
  if (reward_fn_) {
    for (const auto& q : reqs) r.scores.push_back(reward_fn_(q));
    r.extra.resize(reqs.size());
  } else {
    r = rewards_.score(reqs);
  }
  // Per data source: the accuracy of every sample, grouped by prompt.
  std::map<std::string, std::map<size_t, std::vector<double>>> acc;
  for (size_t j = 0; j < reqs.size(); ++j) {
    double a = r.scores[j];
    if (r.extra[j].is_object() && r.extra[j].contains("acc") && r.extra[j]["acc"].is_number())
      a = r.extra[j]["acc"].get<double>();
    acc[reqs[j].data_source][owner[j]].push_back(a);
  }
  const std::string N = std::to_string(opt_.val_n);
  for (const auto& [src, groups] : acc) {
    double mean = 0, best = 0, worst = 0, count = 0;
    for (const auto& [k, v] : groups) {
      for (double a : v) mean += a, count += 1;
      best += *std::max_element(v.begin(), v.end());
      worst += *std::min_element(v.begin(), v.end());
    }
    const std::string p = "val-core/" + src + "/acc/";
    out[p + "mean@" + N] = mean / count;
    if (opt_.val_n > 1) {
      out[p + "best@" + N + "/mean"] = best / double(groups.size());
      out["val-aux/" + src + "/acc/worst@" + N + "/mean"] = worst / double(groups.size());
    }
  }
  out["val-aux/response_length/mean"] = reqs.empty() ? 0.0 : len / double(reqs.size());
  for (const auto& [k, v] : RewardManager::metrics(r.failures)) out["val-aux/" + k] = v;
  out["timing_s/testing"] = seconds_since(t0);
  if (first_val_.empty()) first_val_ = out;
  last_val_ = out;
  return out;
}

Status RlTrainer::save_checkpoint() {
  return train::write_checkpoint(
      opt_.ckpt_root, step_,
      [&](const std::string& dir) -> Status {
        KS_TRY(actor_.save(dir + "/actor/model", actor_.dtype()));
        for (const auto& [name, content] : opt_.model_extra_files)
          KS_TRY(write_file_atomic(dir + "/actor/model/" + name, content));
        optim::OptimizerState st = optim_->state();
        std::vector<io::NamedTensor> tensors;
        for (auto& [name, t] : st.tensors) tensors.push_back({name, t});
        for (const auto& s : optim_->params())
          if (s.model_copy.defined()) tensors.push_back({kMasterPrefix + s.name, s.master});
        KS_TRY(io::save_safetensors(dir + "/actor/optimizer.safetensors", tensors, st.metadata));
        nlohmann::ordered_json ts;
        ts["global_step"] = step_;
        ts["total_steps"] = opt_.total_steps;
        ts["lr_scheduler"] = {{"last_step", step_}, {"base_lr", opt_.lr.lr}, {"total_steps", opt_.lr.total_steps}};
        ts["data_loader"] = source_->state();
        // Sampling seeds and the mini-batch shuffle are functions of (seed, step):
        // these and global_step are the whole random state.
        ts["rng"] = {{"kind", "philox/splitmix64 by step"},
                     {"rollout_seed", opt_.rollout_seed},
                     {"data_loader_seed", opt_.data_loader_seed}};
        KS_TRY(write_file_atomic(dir + "/trainer_state.json", ts.dump(2) + "\n"));
        return write_file_atomic(dir + "/config.yaml", opt_.resolved_config_yaml);
      },
      opt_.max_ckpt_to_keep);
}

Status RlTrainer::load_checkpoint(const std::string& dir) {
  KS_TRY(train::load_weights_into(actor_, dir + "/actor/model"));
  const std::string opath = dir + "/actor/optimizer.safetensors";
  KS_ASSIGN(auto of, io::SafetensorsFile::open(opath));
  std::map<std::string, Tensor> tensors;
  bool masters = false;
  for (const auto& info : of->tensors()) {
    KS_ASSIGN(Tensor t, of->get(info.name));
    if (info.name.rfind(kMasterPrefix, 0) == 0) {
      bool found = false;
      for (auto& s : optim_->params())
        if (s.model_copy.defined() && kMasterPrefix + s.name == info.name) {
          s.master.copy_from(t);
          found = masters = true;
        }
      if (!found) return KS_ERR(opath, ": master weight ", info.name, " matches no parameter of this model");
    } else {
      tensors.emplace(info.name, t);
    }
  }
  KS_TRY(optim_->load_state(tensors, of->metadata(), opath));
  if (masters) optim_->refresh_model_copies(0, optim_->numel());
  const std::string tpath = dir + "/trainer_state.json";
  KS_ASSIGN(std::string text, read_file(tpath));
  nlohmann::json ts;
  try {
    ts = nlohmann::json::parse(text);
    step_ = ts.at("global_step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return KS_ERR(tpath, ": ", e.what());
  }
  if (!ts.contains("data_loader")) return KS_ERR(tpath, ": data_loader state missing");
  KS_TRY(source_->restore(ts["data_loader"], tpath));
  engine_->update_weights_version();  // the prefix cache holds KV of the old weights
  return Status::ok();
}

Status RlTrainer::fit() {
  if (!opt_.ckpt_root.empty()) train::remove_stale_checkpoint_temps(opt_.ckpt_root);
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
  if (step_ == 0 && opt_.val_before_train) {
    auto v = validate();
    if (logger_) logger_->log(0, v);
  }
  train::ProgressBar bar(opt_.total_steps, step_);
  while (step_ < opt_.total_steps) {
    auto m = train_step();
    const bool last = step_ == opt_.total_steps;
    if (opt_.progress) {
      char status[96];
      std::snprintf(status, sizeof status, "score %.3f len %.1f", m["critic/score/mean"], m["response_length/mean"]);
      bar.update(step_, int64_t(m["perf/total_num_tokens"]), status);
    }
    if (opt_.test_freq > 0 && (step_ % opt_.test_freq == 0 || last)) {
      if (opt_.progress) bar.finish();
      for (const auto& [k, v] : validate()) m[k] = v;
    }
    if (logger_) logger_->log(step_, m);
    if (opt_.save_freq > 0 && !opt_.ckpt_root.empty() && (step_ % opt_.save_freq == 0 || last)) {
      const auto t0 = Clock::now();
      KS_TRY(save_checkpoint());
      (void)seconds_since(t0);
    }
  }
  if (opt_.progress) bar.finish();
  return Status::ok();
}

}  // namespace kestrel::rl
