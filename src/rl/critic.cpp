#include "rl/critic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "model/batch.h"
#include "model/pipeline_save.h"
#include "ops/copy.h"
#include "train/checkpoint.h"
#include "train/logging.h"
#include "train/micro_batch.h"
#include "train/sft_trainer.h"

namespace kestrel::rl {

namespace {


// Unbiased variance (torch.var); NaN below two values.
double variance(const std::vector<double>& x) {
  if (x.size() < 2) return std::nan("");
  double mean = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  double s = 0;
  for (double v : x) s += (v - mean) * (v - mean);
  return s / double(x.size() - 1);
}

}  // namespace

train::ValueObjective value_objective(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                      const std::vector<int64_t>& rows, const std::vector<double>& returns,
                                      const std::vector<double>& old_values, double cliprange_value,
                                      const AggScope& scope, ValueLossTotals* totals) {
  const size_t N = size_t(b.layout.num_tokens());
  KS_CHECK(returns.size() == N && old_values.size() == N, "critic: returns (", returns.size(), ") and old values (",
           old_values.size(), ") must have one value per response token (", N, ")");
  return [&b, seqs, rows, &returns, &old_values, cliprange_value, scope, totals](const Tensor& v, Tensor& dv) {
    std::vector<int64_t> lens;
    std::vector<double> vpred, old, G;  // [response tokens of seqs]
    vpred.reserve(rows.size());
    for (int64_t i : seqs) {
      lens.push_back(b.layout.length(i));
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) {
        old.push_back(old_values[size_t(t)]);
        G.push_back(returns[size_t(t)]);
      }
    }
    const std::vector<float> vh = v.to_float_vector();  // v: [T, 1]
    for (int64_t r : rows) vpred.push_back(double(vh[size_t(r)]));
    const Ragged L = Ragged::from_lengths(lens);
    const ValueLossOutput out = value_loss(L, vpred, old, G, nullptr, cliprange_value, scope);
    // dv [T, 1] stays 0 on prompt rows: the response rows' gradients are scattered in.
    const int64_t n = int64_t(rows.size());
    std::vector<float> d(rows.size());
    std::vector<int32_t> at(rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      d[k] = float(out.dloss_dvalue[k]);
      at[k] = int32_t(rows[k]);
    }
    // The gradient rows and their positions go where dv is (the critic's device).
    if (n > 0)
      ops::scatter_rows(Tensor::from_host(d, {n, 1}, MemCategory::Activations, dv.device()),
                        Tensor::from_host(at, {n}, MemCategory::Activations, dv.device()), dv);
    if (totals) {
      const double n = double(rows.size());
      totals->loss += out.loss;
      totals->clipfrac_tokens += out.clipfrac * n;
      for (double x : vpred) totals->vpred_sum += x;
      totals->tokens += n;
    }
    return out.loss;
  };
}

double value_forward_backward(model::CausalLM& critic, const RolloutBatch& b, const std::vector<int64_t>& seqs,
                              const std::vector<double>& returns, const std::vector<double>& old_values,
                              double cliprange_value, const AggScope& scope, ValueLossTotals* totals,
                              bool share_prompts) {
  KS_CHECK(critic.is_value_model(), "critic: the model has no value head (load it with ModelOptions::value_head)");
  const PackedSequences packed = pack_rollout_sequences(b, seqs, share_prompts);
  const model::PackedBatch pb = model::to_device(packed.batch, critic.device());
  const train::ValueObjective obj =
      value_objective(b, seqs, packed.rows, returns, old_values, cliprange_value, scope, totals);
  model::Activations acts;
  const Tensor v = critic.forward(pb, acts);  // [T, 1], compute dtype
  Tensor dv = Tensor::zeros({pb.num_tokens, 1}, DType::F32, MemCategory::Activations, critic.device());  // [T, 1]
  const double loss = obj(v, dv);
  critic.backward(pb, acts, dv);
  return loss;
}

namespace {

// Values of the sequences `seqs` of b into out ([N] over b.layout), in packed
// micro-batches of max_seqs sequences (> 0) or max_tokens tokens.
void values_of(const model::CausalLM& critic, const RolloutBatch& b, const std::vector<int64_t>& seqs,
               int64_t max_tokens, int64_t max_seqs, bool share_prompts, std::vector<double>& out) {
  std::vector<std::vector<int64_t>> groups = split_mini_batch(b, seqs, max_seqs > 0 ? 0 : max_tokens, max_seqs,
                                                              share_prompts);
  train::align_micro_batch_count(groups, critic.ep(), "critic-value");
  std::vector<train::MicroBatch> micro;
  for (auto& grp : groups) {
    PackedSequences packed = pack_rollout_sequences(b, grp, share_prompts);
    micro.push_back({std::move(packed.batch), std::move(grp), std::move(packed.rows)});
  }
  train::score_micro_batches(critic, micro, [&](size_t g, const Tensor& v) {  // v: [T, 1]
    const std::vector<int64_t>& rows = micro[g].rows;
    const std::vector<float> vh = v.to_float_vector();
    size_t k = 0;
    for (int64_t i : micro[g].seqs)
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(vh[size_t(rows[k++])]);
  });
}

}  // namespace

std::vector<double> compute_values(const model::CausalLM& critic, const RolloutBatch& b, int64_t max_tokens,
                                   bool share_prompts) {
  KS_CHECK(critic.is_value_model(), "critic: the model has no value head (load it with ModelOptions::value_head)");
  std::vector<int64_t> all(static_cast<size_t>(b.size()), 0);
  for (int64_t i = 0; i < b.size(); ++i) all[size_t(i)] = i;
  std::vector<double> out(size_t(b.layout.num_tokens()), 0.0);
  values_of(critic, b, all, max_tokens, 0, share_prompts, out);
  return out;
}

std::map<std::string, double> critic_data_metrics(const std::vector<double>& values,
                                                  const std::vector<double>& returns) {
  KS_CHECK(values.size() == returns.size(), "critic metrics: ", values.size(), " values for ", returns.size(),
           " returns");
  std::map<std::string, double> m;
  add_stats(m, "critic/values", values);
  if (values.size() >= 2) {
    std::vector<double> diff(values.size());
    for (size_t t = 0; t < values.size(); ++t) diff[t] = returns[t] - values[t];
    m["critic/vf_explained_var"] = 1.0 - variance(diff) / (variance(returns) + 1e-5);
  }
  return m;
}

namespace {

train::EngineOptions engine_options(const CriticOptions& o, const RlParallel& par) {
  train::EngineOptions eo;
  eo.adamw = o.adamw;
  eo.lr = o.lr;
  eo.clip_grad = o.clip_grad;
  eo.parallel.dp = par.grad_group_ptr();
  eo.parallel.distributed_optimizer = o.distributed_optimizer.value_or(par.distributed_optimizer);
  eo.parallel.expert_dp = par.expert_dp;  // nullptr without expert parallelism
  eo.reuse_fp32_param = o.reuse_fp32_param;
  eo.optimizer_offload_pieces = o.optimizer_offload_pieces;
  eo.max_consecutive_skipped_steps = o.max_consecutive_skipped_steps;
  eo.name = "critic";
  return eo;
}

}  // namespace

Critic::Critic(std::unique_ptr<model::CausalLM> model, CriticOptions opt, RlParallel parallel, bool balance_batch)
    : model_(std::move(model)), opt_(std::move(opt)), parallel_(std::move(parallel)), balance_batch_(balance_batch) {
  KS_CHECK(model_ != nullptr, "critic: no model");
  if (!model_->is_value_model())
    KS_FAIL("critic: the model has no value head; load critic.model.path with ModelOptions::value_head");
  KS_CHECK(opt_.ppo_mini_batch_size >= 1 && opt_.ppo_epochs >= 1 && opt_.n >= 1,
           "critic: ppo_mini_batch_size, ppo_epochs and rollout.n must be >= 1");
  KS_CHECK(opt_.cliprange_value >= 0, "critic.cliprange_value must be >= 0, got ", opt_.cliprange_value);
  KS_CHECK(opt_.ppo_mini_batch_size % parallel_.dp->size() == 0, "critic.ppo_mini_batch_size=",
           opt_.ppo_mini_batch_size, " must divide by the data-parallel size ", parallel_.dp->size());
  engine_ = std::make_unique<train::TrainingEngine>(*model_, engine_options(opt_, parallel_));
  release_device_memory();
}

Critic::~Critic() = default;

void Critic::release_device_memory() const {
  if (opt_.param_offload || opt_.grad_offload) model_->offload_to_host(opt_.param_offload, opt_.grad_offload);
}

void Critic::use_parallel(RlParallel parallel, bool balance_batch) {
  KS_CHECK(engine_->optimizer().step_count() == 0, "critic: the process layout can change only before the first update");
  KS_CHECK(opt_.ppo_mini_batch_size % parallel.dp->size() == 0, "critic.ppo_mini_batch_size=",
           opt_.ppo_mini_batch_size, " must divide by the data-parallel size ", parallel.dp->size());
  parallel_ = std::move(parallel);
  balance_batch_ = balance_batch;
  engine_.reset();  // the old engine lets go of the gradients before the new one re-points them
  engine_ = std::make_unique<train::TrainingEngine>(*model_, engine_options(opt_, parallel_));
}

std::vector<int64_t> Critic::share(const RolloutBatch& b) const {
  return dp_share(b, *parallel_.dp, balance_batch_);
}

std::vector<double> Critic::values(const RolloutBatch& b) const {
  const std::vector<int64_t> mine = share(b);
  std::vector<double> out(size_t(b.layout.num_tokens()), 0.0);
  values_of(*model_, b, mine, opt_.forward_max_token_len, opt_.forward_micro_batch_size, opt_.share_prompts, out);
  release_device_memory();
  all_gather_token_values(*parallel_.dp, b, mine, out);
  return out;
}

std::map<std::string, double> Critic::update(const RolloutBatch& b, const std::vector<double>& returns,
                                             const std::vector<double>& old_values, int64_t step) {
  KS_CHECK(b.size() > 0, "critic update: empty batch");
  // This dp rank's sequences; mini-batches are this rank's part of the global ones.
  const std::vector<int64_t> local = share(b);
  comm::ProcessGroup& dpg = *parallel_.dp;
  const int dp = dpg.size();
  const int64_t B = int64_t(local.size());
  const int64_t mini = std::min(B, opt_.ppo_mini_batch_size * opt_.n / dp);
  const double scale = opt_.loss_scale_factor > 0 ? opt_.loss_scale_factor : double(opt_.response_length);
  const double lr = engine_->lr(step);
  ValueLossTotals sum;
  double grad_norm = 0, skipped = 0;
  int64_t n_updates = 0;
  train::MoeMetrics moe;  // a MoE critic's routers over the step's mini-batches
  for (int64_t e = 0; e < opt_.ppo_epochs; ++e) {
    std::vector<int64_t> order = local;
    if (opt_.shuffle) {
      const std::vector<int64_t> perm = ppo_epoch_order(B, opt_.data_loader_seed, step, e);
      for (int64_t i = 0; i < B; ++i) order[size_t(i)] = local[size_t(perm[size_t(i)])];
    }
    for (int64_t s0 = 0; s0 < B; s0 += mini) {
      const std::vector<int64_t> mb(order.begin() + s0, order.begin() + std::min(B, s0 + mini));
      AggScope scope = mini_batch_scope(b, mb, opt_.loss_agg_mode, scale);
      if (dp > 1) {  // the mini-batch's denominators span every dp rank's part
        std::vector<double> d = {scope.global_tokens, scope.global_seqs};
        sum_doubles(dpg, d);
        scope.global_tokens = d[0], scope.global_seqs = d[1];
      }
      ValueLossTotals t;
      std::vector<std::vector<int64_t>> groups =
          split_mini_batch(b, mb, opt_.max_token_len,
                           opt_.micro_batch_size > 0 ? opt_.micro_batch_size : int64_t(mb.size()), opt_.share_prompts);
      train::align_micro_batch_count(groups, engine_->model().ep(), "critic-update");
      std::vector<train::MicroBatch> micro;
      for (auto& g : groups) {
        PackedSequences packed = pack_rollout_sequences(b, g, opt_.share_prompts);
        micro.push_back({std::move(packed.batch), std::move(g), std::move(packed.rows)});
      }
      const train::MiniBatchResult r = engine_->train_mini_batch(
          micro,
          [&](const train::MicroBatch& m, size_t) {
            train::Objective o;
            o.values = value_objective(b, m.seqs, m.rows, returns, old_values, opt_.cliprange_value, scope, &t);
            return o;
          },
          lr, step + 1);
      if (dp > 1 || engine_->model().pp().size() > 1) {  // each field is this rank's share of the mini-batch value
        std::vector<double> v = {t.loss, t.clipfrac_tokens, t.vpred_sum, t.tokens};
        broadcast_from_last_stage(engine_->model().pp(), v);  // the value loss ran on the last pipeline stage only
        sum_doubles(dpg, v);
        t.loss = v[0], t.clipfrac_tokens = v[1], t.vpred_sum = v[2], t.tokens = v[3];
      }
      if (!r.finite) skipped += 1;
      grad_norm += r.grad_norm;
      ++n_updates;
      moe.add(r.moe);
      sum.loss += t.loss;
      sum.clipfrac_tokens += t.clipfrac_tokens;
      sum.vpred_sum += t.vpred_sum;
      sum.tokens += t.tokens;
    }
  }
  release_device_memory();
  const double tokens = sum.tokens > 0 ? sum.tokens : 1.0;
  if (model_->num_moe_layers() > 0) moe.gather_stages(model_->pp());
  std::map<std::string, double> m = moe.metrics("critic", model_->ep().size());
  m.insert({{"critic/vf_loss", sum.loss / double(n_updates)},
            {"critic/vf_clipfrac", sum.clipfrac_tokens / tokens},
            {"critic/vpred_mean", sum.vpred_sum / tokens},
            {"critic/grad_norm", grad_norm / double(n_updates)},
            {"critic/lr", lr},
            {"critic/num_updates", double(n_updates)},
            {"critic/step_skipped", skipped}});
  return m;
}

Status Critic::save(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create the critic folder: ", ec.message());
  // Under mpirun the weights are written as one HF folder (gathered over tp,
  // streamed from the pipeline stages), the optimizer state as one file per
  // stage (train/optimizer_checkpoint.h); every rank takes part in both.
  if (parallel_.writes_model(model_->ep(), model_->etp())) KS_TRY(model::save_pipelined_model(*model_, dir + "/model", model_->dtype()));
  return engine_->save_optimizer_dir(dir);
}

Status Critic::load(const std::string& dir) {
  KS_TRY(train::load_weights_into(*model_, dir + "/model").with_context("critic"));
  return engine_->load_optimizer_dir(dir).with_context("critic");
}

}  // namespace kestrel::rl
