#include "rl/critic.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "optim/grad_clip.h"
#include "train/checkpoint.h"

namespace kestrel::rl {

namespace {

constexpr const char* kMasterPrefix = "master.";


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

double value_forward_backward(model::CausalLM& critic, const RolloutBatch& b, const std::vector<int64_t>& seqs,
                              const std::vector<double>& returns, const std::vector<double>& old_values,
                              double cliprange_value, const AggScope& scope, ValueLossTotals* totals,
                              bool share_prompts) {
  KS_CHECK(critic.is_value_model(), "critic: the model has no value head (load it with ModelOptions::value_head)");
  const size_t N = size_t(b.layout.num_tokens());
  KS_CHECK(returns.size() == N && old_values.size() == N, "critic: returns (", returns.size(), ") and old values (",
           old_values.size(), ") must have one value per response token (", N, ")");
  const PackedSequences packed = pack_rollout_sequences(b, seqs, share_prompts);
  const model::PackedBatch& pb = packed.batch;
  model::Activations acts;
  const Tensor v = critic.forward(pb, acts);  // [T, 1], compute dtype
  const std::vector<int64_t>& rows = packed.rows;
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
  for (int64_t r : rows) vpred.push_back(double(v.get(r)));
  const Ragged L = Ragged::from_lengths(lens);
  const ValueLossOutput out = value_loss(L, vpred, old, G, nullptr, cliprange_value, scope);
  Tensor dv = Tensor::zeros({pb.num_tokens, 1}, DType::F32, MemCategory::Activations);  // [T, 1]: 0 on prompt rows
  float* d = dv.data<float>();
  for (size_t k = 0; k < rows.size(); ++k) d[rows[k]] = float(out.dloss_dvalue[k]);
  critic.backward(pb, acts, dv);
  if (totals) {
    const double n = double(rows.size());
    totals->loss += out.loss;
    totals->clipfrac_tokens += out.clipfrac * n;
    for (double x : vpred) totals->vpred_sum += x;
    totals->tokens += n;
  }
  return out.loss;
}

std::vector<double> compute_values(const model::CausalLM& critic, const RolloutBatch& b, int64_t max_tokens,
                                   bool share_prompts) {
  KS_CHECK(critic.is_value_model(), "critic: the model has no value head (load it with ModelOptions::value_head)");
  std::vector<int64_t> all(static_cast<size_t>(b.size()), 0);
  for (int64_t i = 0; i < b.size(); ++i) all[size_t(i)] = i;
  std::vector<double> out(size_t(b.layout.num_tokens()), 0.0);
  for (const auto& grp : split_mini_batch(b, all, max_tokens, 0, share_prompts)) {
    const PackedSequences packed = pack_rollout_sequences(b, grp, share_prompts);
    const Tensor v = critic.forward_inference(packed.batch);  // [T, 1]
    const std::vector<int64_t>& rows = packed.rows;
    size_t k = 0;
    for (int64_t i : grp)
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(v.get(rows[k++]));
  }
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

Critic::Critic(std::unique_ptr<model::CausalLM> model, CriticOptions opt)
    : model_(std::move(model)), opt_(std::move(opt)) {
  KS_CHECK(model_ != nullptr, "critic: no model");
  if (!model_->is_value_model())
    KS_FAIL("critic: the model has no value head; load critic.model.path with ModelOptions::value_head");
  if (model_->tp().size() > 1)
    KS_FAIL("not supported yet: the critic update under tensor parallelism (its optimizer and clipping are "
            "single-process); use critic.megatron.tensor_model_parallel_size=1");
  KS_CHECK(opt_.ppo_mini_batch_size >= 1 && opt_.ppo_epochs >= 1 && opt_.n >= 1,
           "critic: ppo_mini_batch_size, ppo_epochs and rollout.n must be >= 1");
  KS_CHECK(opt_.cliprange_value >= 0, "critic.cliprange_value must be >= 0, got ", opt_.cliprange_value);
  model_->enable_grads();
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : model_->params()) {
    optim::ParamSlot s;
    s.name = p->name;
    s.grad = p->grad;
    s.decay = p->weight_decay;
    if (p->weight.dtype() == DType::F32) {
      s.master = p->weight;  // updated in place
    } else {
      s.master = p->weight.to(DType::F32, MemCategory::OptimizerState);
      s.model_copy = p->weight;
    }
    slots.push_back(std::move(s));
  }
  optim_ = std::make_unique<optim::AdamW>(std::move(slots), opt_.adamw);
  sched_ = std::make_unique<optim::LrSchedule>(opt_.lr);
}

Critic::~Critic() = default;

std::vector<double> Critic::values(const RolloutBatch& b) const {
  return compute_values(*model_, b, opt_.forward_max_token_len, opt_.share_prompts);
}

std::map<std::string, double> Critic::update(const RolloutBatch& b, const std::vector<double>& returns,
                                             const std::vector<double>& old_values, int64_t step) {
  const int64_t B = b.size();
  KS_CHECK(B > 0, "critic update: empty batch");
  const int64_t mini = std::min(B, opt_.ppo_mini_batch_size * opt_.n);
  const double scale = opt_.loss_scale_factor > 0 ? opt_.loss_scale_factor : double(opt_.response_length);
  const double lr = sched_->lr(step);
  ValueLossTotals sum;
  double grad_norm = 0, skipped = 0;
  int64_t n_updates = 0;
  for (int64_t e = 0; e < opt_.ppo_epochs; ++e) {
    std::vector<int64_t> order(static_cast<size_t>(B), 0);
    for (int64_t i = 0; i < B; ++i) order[size_t(i)] = i;
    if (opt_.shuffle) order = ppo_epoch_order(B, opt_.data_loader_seed, step, e);
    for (int64_t s0 = 0; s0 < B; s0 += mini) {
      const std::vector<int64_t> mb(order.begin() + s0, order.begin() + std::min(B, s0 + mini));
      model_->zero_grads();
      const AggScope scope = mini_batch_scope(b, mb, opt_.loss_agg_mode, scale);
      ValueLossTotals t;
      const auto micro = split_mini_batch(b, mb, opt_.max_token_len,
                                          opt_.micro_batch_size > 0 ? opt_.micro_batch_size : int64_t(mb.size()),
                                          opt_.share_prompts);
      for (const auto& g : micro)
        value_forward_backward(*model_, b, g, returns, old_values, opt_.cliprange_value, scope, &t, opt_.share_prompts);
      const optim::ClipResult clip = optim::clip_grad_norm(optim_->params(), opt_.clip_grad);
      if (clip.finite) optim_->step(lr);
      else skipped += 1;
      grad_norm += clip.norm;
      ++n_updates;
      sum.loss += t.loss;
      sum.clipfrac_tokens += t.clipfrac_tokens;
      sum.vpred_sum += t.vpred_sum;
      sum.tokens += t.tokens;
    }
  }
  const double tokens = sum.tokens > 0 ? sum.tokens : 1.0;
  return {{"critic/vf_loss", sum.loss / double(n_updates)},
          {"critic/vf_clipfrac", sum.clipfrac_tokens / tokens},
          {"critic/vpred_mean", sum.vpred_sum / tokens},
          {"critic/grad_norm", grad_norm / double(n_updates)},
          {"critic/lr", lr},
          {"critic/num_updates", double(n_updates)},
          {"critic/step_skipped", skipped}};
}

Status Critic::save(const std::string& dir) const {
  KS_TRY(model_->save(dir + "/model", model_->dtype()));
  optim::OptimizerState st = optim_->state();
  std::vector<io::NamedTensor> tensors;
  for (auto& [name, t] : st.tensors) tensors.push_back({name, t});
  for (const auto& s : optim_->params())
    if (s.model_copy.defined()) tensors.push_back({kMasterPrefix + s.name, s.master});
  return io::save_safetensors(dir + "/optimizer.safetensors", tensors, st.metadata);
}

Status Critic::load(const std::string& dir) {
  KS_TRY(train::load_weights_into(*model_, dir + "/model").with_context("critic"));
  const std::string opath = dir + "/optimizer.safetensors";
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
      if (!found) return KS_ERR(opath, ": master weight ", info.name, " matches no parameter of this critic");
    } else {
      tensors.emplace(info.name, t);
    }
  }
  KS_TRY(optim_->load_state(tensors, of->metadata(), opath));
  if (masters) optim_->refresh_model_copies(0, optim_->numel());
  return Status::ok();
}

}  // namespace kestrel::rl
