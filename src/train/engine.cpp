#include "train/engine.h"

#include <cmath>

#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "optim/checkpoint_io.h"
#include "optim/grad_clip.h"
#include "parallel/data_parallel.h"

namespace kestrel::train {

TrainingEngine::TrainingEngine(model::CausalLM& model, EngineOptions opt) : model_(model), opt_(std::move(opt)) {
  dp_group_ = opt_.parallel.dp ? opt_.parallel.dp : comm::local_group("dp");
  model_.enable_grads();
  // Under dp > 1 or tp > 1 the gradients live in DataParallel's flat buffer
  // (summed over dp: every rank's loss already carries the global
  // denominators) and the optimizer steps the owned range; one process keeps
  // the plain path.
  std::vector<model::Param*> order = model_.params();
  int64_t lo = 0, hi = -1;
  bool held_masters = false;
  if (dp_group_->size() > 1 || model_.tp().size() > 1) {
    parallel::DpOptions dpo;
    dpo.distributed_optimizer = opt_.parallel.distributed_optimizer;
    dpo.average = opt_.parallel.average_grads;
    dp_ = std::make_unique<parallel::DataParallel>(model::dp_params(model_), *dp_group_, dpo);
    order.clear();
    for (const auto& d : dp_->flat_params()) order.push_back(model_.find_param(d.name));
    std::tie(lo, hi) = dp_->owned_range();
    held_masters = dpo.distributed_optimizer;  // f32 masters of the owned range only (12/dp bytes per param)
  }
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : order) {
    optim::ParamSlot s;
    s.name = p->name;
    s.grad = p->grad;  // after DataParallel: a view into its flat buffer
    s.decay = p->weight_decay;
    if (p->weight.dtype() == DType::F32) {
      s.master = p->weight;  // updated in place: the rollout engine and the next forward read these weights
    } else {
      if (!held_masters) s.master = p->weight.to(DType::F32, MemCategory::OptimizerState);
      s.model_copy = p->weight;
    }
    slots.push_back(std::move(s));
  }
  optim_ = std::make_unique<optim::AdamW>(std::move(slots), opt_.adamw, lo, hi);
  sched_ = std::make_unique<optim::LrSchedule>(opt_.lr);
}

TrainingEngine::~TrainingEngine() = default;

double TrainingEngine::lr(int64_t step) const { return sched_->lr(step); }

void TrainingEngine::zero_grads() {
  if (dp_) dp_->zero_grads();
  else model_.zero_grads();
}

optim::ClipResult TrainingEngine::reduce_and_clip() {
  if (!dp_) return optim::clip_grad_norm(optim_->params(), opt_.clip_grad);
  dp_->start_grad_sync();
  dp_->finish_grad_sync();
  comm::ProcessGroup* tp = model_.tp().size() > 1 ? &model_.tp() : nullptr;
  optim::ClipResult clip;
  clip.norm = opt_.clip_grad > 0 ? dp_->clip_grad_norm(opt_.clip_grad, tp) : dp_->grad_norm(tp);
  clip.finite = std::isfinite(clip.norm);  // global: every rank takes the same branch
  return clip;
}

MiniBatchResult TrainingEngine::train_mini_batch(const std::vector<MicroBatch>& micro, const ObjectiveFn& objective,
                                                 double lr) {
  MiniBatchResult r;
  zero_grads();
  for (size_t i = 0; i < micro.size(); ++i) {
    const MicroBatch& mb = micro[i];
    const Objective obj = objective(mb, i);
    if (model_.is_value_model()) {
      KS_CHECK(obj.values, "training engine: a value model needs a value objective");
      model::Activations acts;
      const Tensor v = model_.forward(mb.batch, acts);  // [T, 1], compute dtype
      Tensor dv = Tensor::zeros({mb.batch.num_tokens, 1}, DType::F32, MemCategory::Activations);  // [T, 1]
      r.loss += obj.values(v, dv);
      model_.backward(mb.batch, acts, dv);
    } else {
      KS_CHECK(obj.tokens, "training engine: a token model needs a token objective");
      r.loss += forward_backward(model_, mb.batch, obj.tokens, obj.need_entropy_grad).loss;
    }
    ++r.micro_batches;
  }
  const optim::ClipResult clip = reduce_and_clip();
  r.grad_norm = clip.norm;
  r.finite = clip.finite;
  if (clip.finite) {
    optim_->step(lr);
    if (dp_) dp_->gather_params();  // the distributed optimizer stepped the owned range only
  }
  return r;
}

void score_micro_batches(const model::CausalLM& model, const std::vector<MicroBatch>& micro,
                         const std::function<void(size_t, const Tensor&)>& consume) {
  for (size_t i = 0; i < micro.size(); ++i) {
    if (model.is_value_model()) {
      consume(i, model.forward_inference(micro[i].batch));  // [T, 1]
    } else {
      consume(i, model::score_tokens(model, micro[i].batch).logprob);  // f32 [T]
    }
  }
}

void TrainingEngine::score(const std::vector<MicroBatch>& micro,
                           const std::function<void(size_t, const Tensor&)>& consume) const {
  score_micro_batches(model_, micro, consume);
}

Status TrainingEngine::save_optimizer(const std::string& path) const {
  return optim::save_optimizer_state(path, *optim_);
}

Status TrainingEngine::load_optimizer(const std::string& path) {
  KS_TRY(optim::load_optimizer_state(path, *optim_));
  if (dp_) dp_->gather_params();  // the distributed optimizer refreshed only the owned slice
  return Status::ok();
}

std::string TrainingEngine::optimizer_file_name() const {
  if (!dp_) return "optimizer.safetensors";
  return "optimizer_tp" + std::to_string(model_.tp().rank()) + "_dp" + std::to_string(dp_group_->rank()) +
         ".safetensors";
}

}  // namespace kestrel::train
