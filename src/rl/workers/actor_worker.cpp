#include "rl/workers/actor_worker.h"

#include <algorithm>
#include <exception>
#include <filesystem>

#include "model/pipeline_save.h"
#include "train/checkpoint.h"
#include "train/logging.h"
#include "train/micro_batch.h"
#include "train/sft_trainer.h"

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
  for (const auto& [k, v] : t.corr) sum.corr[k] += v;
  sum.corr_batches += t.corr_batches;
}

// The rollout_corr/ metrics the loss reports (rollout_batch.h micro_batch_objective): the whole set of a
// micro-batch in bypass mode, the off-policy ones of the current policy in decoupled mode.
std::vector<std::string> actor_corr_keys(const RolloutCorrectionConfig& c) {
  if (!c.active) return {};
  if (c.bypass_mode) return rollout_correction_metric_keys(c);
  std::vector<std::string> keys;
  for (const auto& [k, v] : offpolicy_metrics(Ragged::from_lengths({1}), {0.0}, {0.0}, {1.0})) keys.push_back(k);
  return keys;
}

// Ends an actor phase on any normal return (an exception leaves the memory where it is).
struct PhaseEnd {
  const ActorWorker& w;
  ~PhaseEnd() {
    if (std::uncaught_exceptions() == 0) w.release_device_memory();
  }
};

}  // namespace

void ActorWorker::release_device_memory() const {
  if (opt_.param_offload || opt_.grad_offload) model_.offload_to_host(opt_.param_offload, opt_.grad_offload);
}

ActorWorker::ActorWorker(model::CausalLM& model, ActorOptions opt, const RlParallel& parallel)
    : model_(model), opt_(std::move(opt)), parallel_(parallel) {
  // Under mpirun (dp > 1 or tp > 1) the engine keeps the gradients in
  // DataParallel's flat buffer, summed over dp (every rank's loss already
  // carries the global denominators); one process keeps the plain path.
  train::EngineOptions eo;
  eo.adamw = opt_.adamw;
  eo.lr = opt_.lr;
  eo.clip_grad = opt_.clip_grad;
  eo.parallel.dp = parallel_.grad_group_ptr();
  eo.parallel.distributed_optimizer = parallel_.distributed_optimizer;
  eo.parallel.expert_dp = parallel_.expert_dp;  // nullptr without expert parallelism
  eo.reuse_fp32_param = opt_.reuse_fp32_param;
  eo.optimizer_offload_pieces = opt_.optimizer_offload_pieces;
  eo.max_consecutive_skipped_steps = opt_.max_consecutive_skipped_steps;
  eo.name = "actor";
  engine_ = std::make_unique<train::TrainingEngine>(model_, std::move(eo));
  release_device_memory();  // as verl's workers offload right after building the model
}

void ActorWorker::compute_log_probs(RolloutBatch& b) const {
  const PhaseEnd phase_end{*this};
  const bool moe = model_.num_moe_layers() > 0;
  if (moe && opt_.log_prob.router_replay == RouterReplay::R3 && b.routing_source != RouterReplay::R3)
    KS_FAIL("actor_rollout_ref.actor.router_replay.mode=R3: the batch holds no rollout routing (the rollout "
            "records it with actor_rollout_ref.rollout.enable_rollout_routing_replay=true)");
  if (!moe || opt_.router_replay != RouterReplay::R2) {
    score_log_probs(model_, b, opt_.log_prob, *parallel_.dp, b.old_logp);
    return;
  }
  // R2: this pass's routing is what the update replays (verl records it here).
  std::vector<std::vector<int32_t>> routed;
  score_log_probs(model_, b, opt_.log_prob, *parallel_.dp, b.old_logp, &routed);
  b.routed_experts = std::move(routed);
  b.routed_layers = model_.num_moe_layers();
  b.routed_topk = model_.config().moe.top_k;
  b.routing_source = RouterReplay::R2;
}

std::map<std::string, double> ActorWorker::update(const RolloutBatch& b, int64_t step) {
  const PhaseEnd phase_end{*this};
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
  // Router replay: R3 always (the rollout's record), R2 when the old-log-prob pass recorded one.
  const bool moe = model_.num_moe_layers() > 0;
  if (moe && opt_.router_replay == RouterReplay::R3 && b.routing_source != RouterReplay::R3)
    KS_FAIL("actor_rollout_ref.actor.router_replay.mode=R3: the batch holds no rollout routing (the rollout "
            "records it with actor_rollout_ref.rollout.enable_rollout_routing_replay=true)");
  const bool replay = moe && opt_.router_replay != RouterReplay::Disabled && b.routing_source == opt_.router_replay;
  train::MoeMetrics moe_metrics;
  // A MoE model's router losses, bias update and capacity dropping depend on every token of a micro-batch:
  // no sequence is left out for a zero policy gradient then.
  const model::MoeTrainOptions& mo = model_.options().moe;
  const bool every_sequence =
      opt_.rollout_corr.active ||
      (moe && ((mo.aux_loss_coeff > 0 && mo.load_balancing_type != "none") || mo.z_loss_coeff > 0 ||
               mo.bias_update_rate > 0 || mo.capacity_factor > 0));
  const std::vector<std::string> corr_keys = actor_corr_keys(opt_.rollout_corr);
  if (record_update_) update_routing_.assign(size_t(b.size()), {});
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
      for (const std::string& k : corr_keys) t.corr[k] = 0.0;  // the same keys on every rank and stage
      const std::vector<int64_t> active = every_sequence ? mb : sequences_with_gradient(b, mb, cfg);
      zero_adv_seqs += double(mb.size() - active.size());
      std::vector<std::vector<int64_t>> groups;
      if (!active.empty())
        groups = split_mini_batch(b, active, opt_.max_token_len,
                                  opt_.micro_batch_size > 0 ? opt_.micro_batch_size : int64_t(active.size()),
                                  opt_.share_prompts);
      if (moe) train::align_micro_batch_count(groups, model_.ep(), "actor-update");
      std::vector<train::MicroBatch> micro;
      for (auto& g : groups) {
        PackedSequences packed = pack_rollout_sequences(b, g, opt_.share_prompts, replay);
        micro.push_back({std::move(packed.batch), std::move(g), std::move(packed.rows)});
      }
      std::vector<Tensor> recorded;  // tests: the routing of each micro-batch's training forward
      if (record_update_ && moe) {
        recorded.reserve(micro.size());  // the batches point into it
        for (train::MicroBatch& m : micro) {
          recorded.push_back(routing_record_tensor(model_, m.batch.num_tokens));
          m.batch.record_routing = &recorded.back();
        }
      }
      train::maybe_crash("train_step", step + 1);
      const train::MiniBatchResult r = engine_->train_mini_batch(
          micro,
          [&](const train::MicroBatch& mbt, size_t) {
            train::Objective o;
            o.tokens = micro_batch_objective(b, mbt.seqs, mbt.rows, cfg, &t, &opt_.rollout_corr);
            o.need_entropy_grad = cfg.entropy_coeff != 0;
            return o;
          },
          lr, step + 1);
      n_micro += r.micro_batches;
      moe_metrics.add(r.moe);
      if (!recorded.empty()) {
        std::vector<std::vector<int64_t>> seqs;
        for (const train::MicroBatch& m : micro) seqs.push_back(m.seqs);
        unpack_micro_batch_routing(b, seqs, opt_.share_prompts, recorded, model_.pp(), update_routing_);
      }
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
  if (moe) {  // every stage's MoE layers, for world rank 0's log
    moe_metrics.gather_stages(model_.pp());
    for (const auto& [k, v] : moe_metrics.metrics("actor", model_.ep().size())) m[k] = v;
  }
  // verl's actor: rollout_corr/ metrics of each micro-batch, averaged (they replace the driver's same names).
  if (sum.corr_batches > 0)
    for (const auto& [k, v] : sum.corr) m[k] = v / sum.corr_batches;
  if (first.rollout_diff_tokens > 0) {
    // verl's rollout_probs_diff: the engine and the actor must agree on the policy.
    m["training/rollout_probs_diff_mean"] = first.rollout_diff_sum / first.rollout_diff_tokens;
    m["training/rollout_probs_diff_max"] = first.rollout_diff_max;
  }
  return m;
}

Status ActorWorker::save(const std::string& dir) const {
  // One HF folder of the whole model: under pp the stages stream their tensors to pp rank 0.
  if (parallel_.writes_model(model_.ep(), model_.etp())) KS_TRY(model::save_pipelined_model(model_, dir + "/model", model_.dtype()));
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
