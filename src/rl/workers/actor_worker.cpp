#include "rl/workers/actor_worker.h"

#include <algorithm>
#include <filesystem>

#include "model/pipeline_save.h"
#include "train/checkpoint.h"
#include "train/micro_batch.h"

namespace kestrel::rl {

namespace {

// Adds one mini-batch's totals to the step's sums (the max stays per mini-batch).
void accumulate(LossTotals& sum, const LossTotals& t) {
  sum.loss += t.loss;
  sum.pg_loss += t.pg_loss;
  sum.kl_loss += t.kl_loss;
  sum.clipfrac_tokens += t.clipfrac_tokens;
  sum.clipfrac_lower_tokens += t.clipfrac_lower_tokens;
  sum.ppo_kl_tokens += t.ppo_kl_tokens;
  sum.entropy_tokens += t.entropy_tokens;
  sum.tokens += t.tokens;
}

}  // namespace

ActorWorker::ActorWorker(model::CausalLM& model, ActorOptions opt, const RlParallel& parallel)
    : model_(model), opt_(std::move(opt)), parallel_(parallel) {
  // Under mpirun (dp > 1 or tp > 1) the engine keeps the gradients in
  // DataParallel's flat buffer, summed over dp (every rank's loss already
  // carries the global denominators); one process keeps the plain path.
  train::EngineOptions eo;
  eo.adamw = opt_.adamw;
  eo.lr = opt_.lr;
  eo.clip_grad = opt_.clip_grad;
  eo.parallel.dp = parallel_.dp;
  eo.parallel.distributed_optimizer = parallel_.distributed_optimizer;
  eo.reuse_fp32_param = opt_.reuse_fp32_param;
  eo.max_consecutive_skipped_steps = opt_.max_consecutive_skipped_steps;
  eo.name = "actor";
  engine_ = std::make_unique<train::TrainingEngine>(model_, std::move(eo));
}

void ActorWorker::compute_log_probs(RolloutBatch& b) const {
  score_log_probs(model_, b, opt_.log_prob, *parallel_.dp, b.old_logp);
}

std::map<std::string, double> ActorWorker::update(const RolloutBatch& b, int64_t step) {
  // This dp rank's sequences; mini-batches are this rank's part of the global ones.
  const std::vector<int64_t> local = dp_share(b, *parallel_.dp, opt_.balance_batch);
  const int dp = parallel_.dp->size();
  const int64_t B = int64_t(local.size());
  const int64_t mini = std::min(B, opt_.ppo_mini_batch_size * opt_.n / dp);
  const double scale = opt_.loss_scale_factor > 0 ? opt_.loss_scale_factor : double(opt_.response_length);
  const double lr = engine_->lr(step);
  LossTotals sum;    // over all mini-batches of all epochs
  LossTotals first;  // the first mini-batch: trained on the policy that sampled it
  double grad_norm = 0, skipped = 0, zero_adv_seqs = 0;
  int64_t n_updates = 0, n_micro = 0;
  for (int64_t e = 0; e < opt_.ppo_epochs; ++e) {
    std::vector<int64_t> order = local;
    if (opt_.shuffle) {
      const std::vector<int64_t> perm = ppo_epoch_order(B, opt_.data_loader_seed, step, e);
      for (int64_t i = 0; i < B; ++i) order[size_t(i)] = local[size_t(perm[size_t(i)])];
    }
    for (int64_t s0 = 0; s0 < B; s0 += mini) {
      const std::vector<int64_t> mb(order.begin() + s0, order.begin() + std::min(B, s0 + mini));
      PolicyLossConfig cfg = opt_.loss;
      cfg.agg = mini_batch_scope(b, mb, opt_.loss.agg.mode, scale);
      if (dp > 1) {  // the mini-batch's denominators span every dp rank's part
        std::vector<double> d = {cfg.agg.global_tokens, cfg.agg.global_seqs};
        sum_doubles(*parallel_.dp, d);
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
      train::maybe_crash("train_step", step + 1);
      const train::MiniBatchResult r = engine_->train_mini_batch(
          micro,
          [&](const train::MicroBatch& mbt, size_t) {
            train::Objective o;
            o.tokens = micro_batch_objective(b, mbt.seqs, mbt.rows, cfg, &t);
            o.need_entropy_grad = cfg.entropy_coeff != 0;
            return o;
          },
          lr, step + 1);
      n_micro += r.micro_batches;
      broadcast_from_last_stage(model_.pp(), t);  // the loss ran on the last pipeline stage only
      all_reduce_totals(*parallel_.dp, t);
      if (n_updates == 0) first = t;
      if (!r.finite) skipped += 1;
      grad_norm += r.grad_norm;
      ++n_updates;
      accumulate(sum, t);
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
    sum_doubles(*parallel_.dp, z);
    m["actor/zero_adv_seq_frac"] = z[0] / (z[1] * double(opt_.ppo_epochs));
  }
  if (first.rollout_diff_tokens > 0) {
    // verl's rollout_probs_diff: the engine and the actor must agree on the policy.
    m["training/rollout_probs_diff_mean"] = first.rollout_diff_sum / first.rollout_diff_tokens;
    m["training/rollout_probs_diff_max"] = first.rollout_diff_max;
  }
  return m;
}

Status ActorWorker::save(const std::string& dir) const {
  // One HF folder of the whole model: under pp the stages stream their tensors to pp rank 0.
  if (parallel_.dp->rank() == 0) KS_TRY(model::save_pipelined_model(model_, dir + "/model", model_.dtype()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return engine_->save_optimizer_dir(dir);  // one file per pipeline stage, any layout can resume it
}

Status ActorWorker::load(const std::string& dir, const std::string& context) {
  KS_TRY(train::load_weights_into(model_, dir + "/model"));
  // Any (tp, pp, dp, distributed optimizer) layout resumes the stage files;
  // a checkpoint of the old per-rank format only its own layout.
  return engine_->load_optimizer_dir(dir).with_context(context);
}

}  // namespace kestrel::rl
