#include "train/engine.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "model/cp_batch.h"
#include "model/moe_mlp.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "optim/checkpoint_io.h"
#include "train/optimizer_checkpoint.h"
#include "ops/copy.h"
#include "ops/linear.h"
#include "ops/optim_ops.h"
#include "optim/grad_clip.h"
#include "parallel/data_parallel.h"
#include "train/pipeline.h"

namespace kestrel::train {

namespace {

// reuse_fp32_param's preconditions, as MindSpeed's _validate_optimizer checks them.
void check_reuse_fp32(const EngineOptions& o, model::CausalLM& m) {
  if (!o.reuse_fp32_param) return;
  for (const model::Param* p : m.params())
    if (p->weight.dtype() != DType::BF16)
      KS_FAIL(o.name, ": reuse_fp32_param=true needs bf16 weights (MindSpeed: \"--reuse-fp32-param only support for "
              "`bf16`\"), but '", p->name, "' is ", dtype_name(p->weight.dtype()),
              p->weight.dtype() == DType::F32 ? ": f32 training keeps no separate bf16 copy, so there is nothing to "
                                                "reuse" : "",
              "; set reuse_fp32_param=false or train in bf16");
  // MindSpeed refuses reuse with --swap-optimizer (and with its fused EMA AdamW, which Kestrel has not).
  if (o.optimizer_offload_pieces > 0 && m.device() != Device::CPU)
    KS_FAIL(o.name, ": reuse_fp32_param=true cannot be combined with the swap optimizer or optimizer offload "
            "(MindSpeed: \"--swap-optimizer dose not support --reuse-fp32-param\"); turn one of them off");
}

// "3", "3,5", "2-4", optionally "actor:" first: does update `n` of engine `name` match?
bool inject_spec_matches(const std::string& spec, const std::string& name, int64_t n) {
  std::string list = spec;
  if (const size_t colon = spec.find(':'); colon != std::string::npos) {
    if (spec.substr(0, colon) != name) return false;
    list = spec.substr(colon + 1);
  }
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t dash = item.find('-');
    char* end = nullptr;
    const long long a = std::strtoll(item.c_str(), &end, 10);
    const long long b = dash == std::string::npos ? a : std::strtoll(item.c_str() + dash + 1, &end, 10);
    if (a <= n && n <= b) return true;
  }
  return false;
}

// The micro-batches as this rank runs them: under context parallelism each
// one's cp share (model/cp_batch.h; seqs and rows, the objective's
// bookkeeping, stay the full batch's); for a model on a device, each one's
// tensors moved there (the host mirrors stay); else the caller's own (empty).
std::vector<MicroBatch> rank_micro_batches(const model::CausalLM& m, const std::vector<MicroBatch>& micro) {
  std::vector<MicroBatch> out;
  if (!m.cp_groups() && m.device() == Device::CPU) return out;
  out.reserve(micro.size());
  for (const MicroBatch& mb : micro)
    out.push_back({m.cp_groups() ? model::cp_local_batch(m, mb.batch) : model::to_device(mb.batch, m.device()),
                   mb.seqs, mb.rows});
  return out;
}

// A value objective on this rank's values [Tl, 1] of a (possibly cp-split)
// batch: the objective sees the full batch's values, the rank keeps its rows
// of the gradient.
double value_loss(const model::CausalLM& m, const model::PackedBatch& run, const ValueObjective& objective,
                  const Tensor& values, Tensor& dvalues_local) {
  const Tensor full = model::cp_full_rows(m, run, values);  // [T, 1]
  Tensor dv = Tensor::zeros({full.size(0), 1}, DType::F32, MemCategory::Activations, full.device());
  const double loss = objective(full, dv);
  dvalues_local = model::cp_rank_rows(run, dv, 0.f);
  return loss;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

TrainingEngine::TrainingEngine(model::CausalLM& model, EngineOptions opt) : model_(model), opt_(std::move(opt)) {
  dp_group_ = opt_.parallel.dp ? opt_.parallel.dp : comm::local_group("dp");
  // The routed experts take their own data-parallel group (Megatron's expert
  // DDP) under expert parallelism, and when expert_tensor_parallel_size
  // splits them over another group than tp (their replicas are then not the dense ones').
  const bool experts_apart = model_.ep().size() > 1 || model_.experts_split_apart();
  if (experts_apart) edp_group_ = opt_.parallel.expert_dp ? opt_.parallel.expert_dp : comm::local_group("edp");
  check_reuse_fp32(opt_, model_);
  if (const char* env = std::getenv("KESTREL_TEST_INJECT_NAN_GRAD")) inject_env_ = env;  // test-only
  model_.enable_grads();
  // Under dp > 1 or tp > 1 the gradients live in DataParallel's flat buffer
  // (summed over dp: every rank's loss already carries the global
  // denominators) and the optimizer steps the owned range; one process keeps
  // the plain path.
  std::vector<model::Param*> order = model_.params();
  int64_t lo = 0, hi = -1;
  // Offloaded state takes the bf16 weights' masters with it: the optimizer holds them (held masters).
  const bool offload = opt_.optimizer_offload_pieces > 0 && model_.device() != Device::CPU;
  bool held_masters = offload;
  if (dp_group_->size() > 1 || model_.tp().size() > 1 || model_.pp().size() > 1 || experts_apart) {
    parallel::DpOptions dpo;
    dpo.distributed_optimizer = opt_.parallel.distributed_optimizer;
    dpo.average = opt_.parallel.average_grads;
    // Under expert parallelism the routed experts differ by rank: DataParallel
    // takes the dense parameters (the same on every dp rank), a second one
    // the experts over the expert-data-parallel group (build_expert_optimizer).
    std::vector<parallel::DpParam> dense, experts;
    for (const parallel::DpParam& d : model::dp_params(model_))
      (experts_apart && model::is_routed_expert_param(d.name) ? experts : dense).push_back(d);
    dp_ = std::make_unique<parallel::DataParallel>(std::move(dense), *dp_group_, dpo);
    order.clear();
    for (const auto& d : dp_->flat_params()) order.push_back(model_.find_param(d.name));
    std::tie(lo, hi) = dp_->owned_range();
    held_masters = dpo.distributed_optimizer || offload;  // f32 masters of the owned range only (12/dp bytes per param)
    if (experts_apart) build_expert_optimizer(std::move(experts));
  }
  optim_ = std::make_unique<optim::AdamW>(make_slots(order, held_masters), opt_.adamw, lo, hi, opt_.reuse_fp32_param,
                                          offload ? opt_.optimizer_offload_pieces : 0);
  sched_ = std::make_unique<optim::LrSchedule>(opt_.lr);
}

std::vector<optim::ParamSlot> TrainingEngine::make_slots(const std::vector<model::Param*>& order,
                                                         bool held_masters) const {
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : order) {
    optim::ParamSlot s;
    s.name = p->name;
    s.grad = p->grad;  // after DataParallel: a view into its flat buffer
    s.decay = p->weight_decay;
    if (p->weight.dtype() == DType::F32) {
      s.master = p->weight;  // updated in place: the rollout engine and the next forward read these weights
    } else {
      // reuse_fp32_param: the optimizer holds the master as (this copy, a residual) over the owned range.
      if (!held_masters && !opt_.reuse_fp32_param) s.master = p->weight.to(DType::F32, MemCategory::OptimizerState);
      s.model_copy = p->weight;
    }
    slots.push_back(std::move(s));
  }
  return slots;
}

void TrainingEngine::build_expert_optimizer(std::vector<parallel::DpParam> experts) {
  // Megatron's expert DDP: the routed experts' gradients are summed over the
  // ranks holding the same experts (edp) and, with the distributed optimizer,
  // their AdamW state and f32 masters are sharded over edp as the dense ones
  // are over dp. Never averaged: each rank's loss carries the global
  // denominators (the experts were summed whole over edp before). A stage
  // without MoE layers holds no experts: no second optimizer, it only joins
  // the norm's sums (reduce_and_clip_experts).
  if (experts.empty()) return;
  parallel::DpOptions eo;
  eo.distributed_optimizer = opt_.parallel.distributed_optimizer;
  eo.average = false;
  edp_ = std::make_unique<parallel::DataParallel>(std::move(experts), *edp_group_, eo);
  std::vector<model::Param*> order;
  for (const auto& d : edp_->flat_params()) order.push_back(model_.find_param(d.name));
  const auto [lo, hi] = edp_->owned_range();
  expert_optim_ = std::make_unique<optim::AdamW>(make_slots(order, eo.distributed_optimizer), opt_.adamw, lo, hi,
                                                 opt_.reuse_fp32_param);
}

TrainingEngine::~TrainingEngine() = default;

double TrainingEngine::lr(int64_t step) const { return sched_->lr(step); }

void TrainingEngine::zero_grads() {
  if (dp_) dp_->zero_grads();
  else model_.zero_grads();
  if (edp_) edp_->zero_grads();
}

optim::ClipResult TrainingEngine::reduce_and_clip() {
  if (!dp_) return optim::clip_grad_norm(optim_->params(), opt_.clip_grad);
  sum_tied_embedding_grads();
  dp_->start_grad_sync();
  dp_->finish_grad_sync();
  comm::ProcessGroup* tp = model_.tp().size() > 1 ? &model_.tp() : nullptr;
  comm::ProcessGroup* pp = model_.pp().size() > 1 ? &model_.pp() : nullptr;
  optim::ClipResult clip;
  if (edp_group_) return reduce_and_clip_experts();
  clip.norm = opt_.clip_grad > 0 ? dp_->clip_grad_norm(opt_.clip_grad, tp, pp) : dp_->grad_norm(tp, pp);
  clip.finite = std::isfinite(clip.norm);  // global: every rank takes the same branch
  return clip;
}

optim::ClipResult TrainingEngine::reduce_and_clip_experts() {
  // Every rank of the ep group holds other experts, each expert once per ep
  // group; the expert-data-parallel ranks hold the same ones, so their
  // gradients are summed there (onto their owners with the distributed optimizer).
  if (edp_) {
    edp_->start_grad_sync();
    edp_->finish_grad_sync();
  }
  // The global norm: the dense part as DataParallel reduces it (over dp with
  // the distributed optimizer, then the pipeline stages), plus every expert
  // element once: the squares of the edp-owned shards summed over edp (with
  // the distributed optimizer; else each edp rank holds them all), then over
  // the ep group (other experts), then the stages (other layers), in double.
  // Under tp each rank holds its shard of the dense weights (the replicated
  // ones count on tp rank 0) and under etp of every expert: the squares are
  // summed over those groups too.
  comm::ProcessGroup* pp = model_.pp().size() > 1 ? &model_.pp() : nullptr;
  comm::ProcessGroup* tp = model_.tp().size() > 1 ? &model_.tp() : nullptr;
  const double dense = dp_->grad_norm(tp, pp);
  // (A stage without MoE layers holds no experts on any of its tp ranks.)
  // The experts' shards are over etp (tp unless expert_tensor_parallel_size says otherwise).
  comm::ProcessGroup* etp = model_.etp().size() > 1 ? &model_.etp() : nullptr;
  double experts = parallel::sum_over(model_.ep(), edp_ ? edp_->grad_sq(etp) : 0.0);
  if (pp) experts = parallel::sum_over(*pp, experts);
  optim::ClipResult clip;
  clip.norm = std::sqrt(dense * dense + experts);
  clip.finite = std::isfinite(clip.norm);
  if (clip.finite && opt_.clip_grad > 0) {
    const double coef = opt_.clip_grad / (clip.norm + 1e-6);  // torch's clip_grad_norm_, as DataParallel clips
    if (coef < 1.0) {
      dp_->scale_grads(float(coef));
      if (edp_) edp_->scale_grads(float(coef));  // the owned range: the only part stepped
    }
  }
  return clip;
}

void TrainingEngine::sum_tied_embedding_grads() {
  // Megatron's embedding group: with tied embeddings the first stage's
  // embedding and the last stage's lm_head are one parameter held twice; each
  // copy's gradient becomes the sum of both before the dp reduction, so the
  // two copies take identical updates (a + b == b + a in floating point).
  comm::ProcessGroup& pp = model_.pp();
  const int p = pp.size(), r = pp.rank();
  if (p == 1 || model_.is_value_model() || !model_.config().tie_word_embeddings || (r != 0 && r != p - 1)) return;
  model::Param* e = model_.find_param("model.embed_tokens.weight");
  KS_CHECK(e && e->grad.defined(), "tied embedding missing on pipeline stage ", r);
  const int peer = r == 0 ? p - 1 : 0;
  Tensor other = Tensor::empty(e->grad.shape(), DType::F32, MemCategory::Other, e->grad.device());
  auto sent = pp.isend(e->grad, peer, 0);
  pp.recv(other, peer, 0);
  sent->wait();
  ops::add_inplace(e->grad, other);
}

bool TrainingEngine::loss_finite_everywhere(double loss) const {
  // One flag reduced over dp and tp: a NaN on one rank makes every rank skip.
  int32_t ok = std::isfinite(loss) ? 1 : 0;
  for (comm::ProcessGroup* g : {dp_group_.get(), &model_.tp(), &model_.pp()})
    if (g->size() > 1) g->all_reduce(&ok, 1, DType::I32, comm::ReduceOp::Min);
  return ok == 1;
}

bool TrainingEngine::inject_nan_grad(int64_t update) const {
  if (opt_.test_inject_nan_grad && opt_.test_inject_nan_grad(update)) return true;
  return !inject_env_.empty() && inject_spec_matches(inject_env_, opt_.name, update);
}

void TrainingEngine::after_skip(const MiniBatchResult& r, int64_t update, int64_t step) {
  ++skipped_;
  ++consecutive_skipped_;
  zero_grads();  // nothing non-finite stays in the gradient buffers
  std::string what;
  if (!r.loss_finite) what = "the loss is NaN/Inf (on at least one rank)";
  if (!r.grad_norm_finite) what += std::string(what.empty() ? "" : " and ") + "the gradient norm is " + num(r.grad_norm);
  const std::string at = (step >= 1 ? "step " + std::to_string(step) + " (update " + std::to_string(update) + ")"
                                    : "update " + std::to_string(update));
  const int64_t k = opt_.max_consecutive_skipped_steps;
  if (k > 0 && consecutive_skipped_ >= k)
    KS_FAIL(opt_.name, ": aborting at ", at, ": ", consecutive_skipped_,
            " consecutive optimizer updates skipped because ", what,
            " (max_consecutive_skipped_steps=", k, "); the weights are those of the last finite update and no "
            "checkpoint holds a NaN/Inf: lower the learning rate or check the data, then resume from the last "
            "checkpoint");
  if (dp_group_->rank() == 0 && model_.tp().rank() == 0)
    std::fprintf(stderr, "warning: %s: %s skipped: %s (%lld in a row%s)\n", opt_.name.c_str(), at.c_str(),
                 what.c_str(), (long long)consecutive_skipped_,
                 k > 0 ? (", abort at " + std::to_string(k)).c_str() : "");
}

MiniBatchResult TrainingEngine::train_mini_batch(const std::vector<MicroBatch>& micro, const ObjectiveFn& objective,
                                                 double lr, int64_t step) {
  MiniBatchResult r;
  const int64_t update = optim_->step_count() + skipped_ + 1;  // 1-based, survives resume (both counts are saved)
  if (!std::isfinite(lr))
    KS_FAIL(opt_.name, ": the learning rate is ", num(lr), " at ",
            step >= 1 ? "step " + std::to_string(step) : "update " + std::to_string(update),
            "; the learning rate and its schedule (optim.lr, warmup, min_lr) must be finite");
  model_.ensure_on_device(/*grads=*/true);  // param_offload / grad_offload: back for the update
  zero_grads();
  const bool moe = model_.num_moe_layers() > 0;
  if (moe) begin_moe_mini_batch(int64_t(micro.size()));
  // The micro-batch loop: the pipeline schedule over the stages, or one
  // micro-batch after another.
  const std::vector<MicroBatch> cp_micro = rank_micro_batches(model_, micro);
  const std::vector<MicroBatch>& run = cp_micro.empty() ? micro : cp_micro;
  r.loss = model_.pp().size() > 1 ? train_pipelined(micro, run, objective) : train_sequential(micro, run, objective);
  r.micro_batches = int64_t(micro.size());
  if (moe) r.moe = reduced_moe_stats();
  if (inject_nan_grad(update)) {  // TEST ONLY (EngineOptions::test_inject_nan_grad, KESTREL_TEST_INJECT_NAN_GRAD)
    Tensor g0 = optim_->params()[0].grad.view({-1}).slice_rows(0, 1);
    ops::fill(g0, NAN);
  }
  const optim::ClipResult clip = reduce_and_clip();
  r.grad_norm = clip.norm;
  r.grad_norm_finite = clip.finite;  // global: every rank takes the same branch
  r.loss_finite = loss_finite_everywhere(r.loss);
  r.finite = r.grad_norm_finite && r.loss_finite;
  if (!r.finite) {
    after_skip(r, update, step);
    return r;
  }
  optim_->step(lr);
  if (expert_optim_) expert_optim_->step(lr);  // same step count: the two step together
  if (dp_) dp_->gather_params();  // the distributed optimizer stepped the owned range only
  if (edp_) edp_->gather_params();
  // Aux-loss-free balancing: after the step, from the loads of its forwards
  // (identical on every dp rank: the loads are summed over dp).
  const double rate = model_.options().moe.bias_update_rate;
  if (moe && rate > 0) model_.update_moe_correction_bias(r.moe, rate);
  consecutive_skipped_ = 0;
  return r;
}

void TrainingEngine::begin_moe_mini_batch(int64_t local_micro_batches) {
  // The router losses enter as their mean over the mini-batch's micro-batches on every dp rank.
  int64_t n = local_micro_batches;
  dp_group_->all_reduce(&n, 1, DType::I64, comm::ReduceOp::Sum);
  model_.set_moe_loss_scale(n > 0 ? 1.0 / double(n) : 1.0);
  model_.moe_stats().reset();
}

model::MoeStepStats TrainingEngine::reduced_moe_stats() const {
  model::MoeStepStats s = model_.moe_stats();
  if (dp_group_->size() == 1) return s;
  for (model::MoeLayerStats& l : s.layers) {
    dp_group_->all_reduce(l.tokens_per_expert.data(), int64_t(l.tokens_per_expert.size()), DType::I64,
                          comm::ReduceOp::Sum);
    int64_t counts[3] = {l.dropped, l.tokens, l.micro_batches};
    dp_group_->all_reduce(counts, 3, DType::I64, comm::ReduceOp::Sum);
    l.dropped = counts[0];
    l.tokens = counts[1];
    l.micro_batches = counts[2];
    float losses[2] = {float(l.aux_loss), float(l.z_loss)};  // metrics only: f32 is enough
    dp_group_->all_reduce(losses, 2, DType::F32, comm::ReduceOp::Sum);
    l.aux_loss = losses[0];
    l.z_loss = losses[1];
  }
  return s;
}

// bf16 weights packed once per mini-batch (backend/cpu/packed_linear.h):
// every micro-batch's forward x @ W^T runs on the CPU's bf16 units (AMX,
// AVX512-BF16) from the packs, where the unpacked path widens each weight to
// f32 on every call: +11% on a step of one 2048-token micro-batch, +15-20%
// with four (docs/benchmarks.md "Packed training weights"). f32 weights stay
// on the chosen GEMM: packing them gained 0-2% at 256-512-row micro-batches
// (oneDNN's unpacked matmul already runs these shapes at about the packed
// rate), not worth a second copy of the weights. Freed before the optimizer step.
bool train_packs_apply(Device device, DType dtype, int64_t tp, int64_t pp, int64_t cp, bool moe, bool mla) {
  return device == Device::CPU && dtype == DType::BF16 && tp == 1 && pp == 1 && cp <= 1 && !moe && !mla &&
         cpu::packed_linear_bytes(64, 64, DType::BF16) > 0;
}

double TrainingEngine::train_sequential(const std::vector<MicroBatch>& micro, const std::vector<MicroBatch>& run,
                                        const ObjectiveFn& objective) {
  double loss = 0;
  cpu::WeightPacks packs;
  const bool packed = train_packs_apply(model_.device(), model_.dtype(), model_.tp().size(), model_.pp().size(), model_.cp_size(),
                                        model_.num_moe_layers() > 0, model_.config().mla.enabled);
  model::TrainPacksScope scope(model_, packed ? &packs : nullptr);
  for (size_t i = 0; i < micro.size(); ++i) {
    const model::PackedBatch& b = run[i].batch;  // what this rank runs (its cp share)
    const Objective obj = objective(micro[i], i);
    if (model_.is_value_model()) {
      KS_CHECK(obj.values, "training engine: a value model needs a value objective");
      model::Activations acts;
      const Tensor v = model_.forward(b, acts);  // [T, 1], compute dtype
      Tensor dv;  // f32 [T, 1]
      loss += value_loss(model_, b, obj.values, v, dv);
      model_.backward(b, acts, dv);
    } else {
      KS_CHECK(obj.tokens, "training engine: a token model needs a token objective");
      loss += forward_backward(model_, b, obj.tokens, obj.need_entropy_grad).loss;
    }
  }
  return loss;
}

double TrainingEngine::train_pipelined(const std::vector<MicroBatch>& micro, const std::vector<MicroBatch>& run,
                                       const ObjectiveFn& objective) {
  // The loss runs on the last stage only, as each micro-batch's head output
  // appears (the objective is built there, right before its use).
  const HeadLossFn head = [&](size_t i, const Tensor& out) -> std::pair<double, Tensor> {
    const Objective obj = objective(micro[i], i);
    if (model_.is_value_model()) {
      KS_CHECK(obj.values, "training engine: a value model needs a value objective");
      Tensor dv;  // f32 [T, 1]
      const double l = value_loss(model_, run[i].batch, obj.values, out, dv);
      return {l, dv};
    }
    KS_CHECK(obj.tokens, "training engine: a token model needs a token objective");
    HeadLoss h = token_head_loss(model_, run[i].batch, out, obj.tokens, obj.need_entropy_grad);
    return {h.result.loss, h.dlogits};
  };
  if (last_trace_) *last_trace_ = PipelineTrace();
  return pipeline_train(model_, run, head, model_.options().parallel.vpp_microbatch_group, last_trace_.get());
}

void TrainingEngine::record_pipeline_trace(bool on) {
  if (on && !last_trace_) last_trace_ = std::make_unique<PipelineTrace>();
  if (!on) last_trace_.reset();
}

void score_micro_batches(const model::CausalLM& model, const std::vector<MicroBatch>& micro,
                         const std::function<void(size_t, const Tensor&)>& consume) {
  const std::vector<MicroBatch> cp_micro = rank_micro_batches(model, micro);
  const std::vector<MicroBatch>& run = cp_micro.empty() ? micro : cp_micro;
  if (model.pp().size() > 1) {
    // Token scores come back gathered (model::score_logits); values are gathered here.
    return pipeline_score(model, run, [&](size_t i, const Tensor& out) {
      consume(i, model.is_value_model() ? model::cp_full_rows(model, run[i].batch, out) : out);
    });
  }
  for (size_t i = 0; i < run.size(); ++i) {
    const model::PackedBatch& b = run[i].batch;
    if (model.is_value_model()) {
      consume(i, model::cp_full_rows(model, b, model.forward_inference(b)));  // [T, 1]
    } else {
      consume(i, model::score_tokens(model, b).logprob);  // f32 [T] (the full batch's rows)
    }
  }
}

void TrainingEngine::score(const std::vector<MicroBatch>& micro,
                           const std::function<void(size_t, const Tensor&)>& consume) const {
  score_micro_batches(model_, micro, consume);
}

Status TrainingEngine::check_finite() const {
  // sum_squares is finite exactly when every element is (an f32 square is below 2^256).
  for (const model::Param* p : model_.params()) {
    const Tensor w = p->weight.dtype() == DType::F32 ? p->weight : p->weight.to(DType::F32, MemCategory::Other);
    if (w.numel() > 0 && !std::isfinite(ops::sum_squares(w)))
      return KS_ERR(opt_.name, ": refusing to save: model weight '", p->name,
                    "' holds a NaN or Inf; nothing is written and the previous checkpoint and its pointer stay");
  }
  std::string t = optim_->first_non_finite();
  if (t.empty() && expert_optim_) t = expert_optim_->first_non_finite();
  if (!t.empty())
    return KS_ERR(opt_.name, ": refusing to save: optimizer state '", t,
                  "' holds a NaN or Inf; nothing is written and the previous checkpoint and its pointer stay");
  return Status::ok();
}

Status TrainingEngine::save_optimizer(const std::string& path) const {
  if (edp_group_)
    return KS_ERR(path, ": not supported yet: per-rank optimizer files under expert parallelism (save with "
                  "save_optimizer_dir, the layout-independent checkpoint)");
  KS_TRY(check_finite());
  return optim::save_optimizer_state(path, *optim_,
                                     {{"skipped_steps", std::to_string(skipped_)},
                                      {"consecutive_skipped_steps", std::to_string(consecutive_skipped_)}});
}

Status TrainingEngine::load_optimizer(const std::string& path) {
  if (edp_group_)
    return KS_ERR(path, ": not supported yet: per-rank optimizer files under expert parallelism (save with "
                  "save_optimizer_dir, the layout-independent checkpoint)");
  std::map<std::string, std::string> md;
  KS_TRY(optim::load_optimizer_state(path, *optim_, &md));
  if (dp_) dp_->gather_params();  // the distributed optimizer refreshed only the owned slice
  auto count = [&](const char* k) -> int64_t {  // files written before the guard have none: 0
    auto it = md.find(k);
    return it == md.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
  };
  skipped_ = count("skipped_steps");
  consecutive_skipped_ = count("consecutive_skipped_steps");
  return Status::ok();
}

Status TrainingEngine::save_optimizer_dir(const std::string& dir) const {
  // Under expert parallelism collective over the ep group too: the experts' state is gathered to the writer.
  return save_optimizer_checkpoint(*this, dir,
                                   {{"skipped_steps", std::to_string(skipped_)},
                                    {"consecutive_skipped_steps", std::to_string(consecutive_skipped_)}});
}

Status TrainingEngine::load_optimizer_dir(const std::string& dir) {
  std::map<std::string, std::string> md;
  KS_TRY(load_optimizer_checkpoint(*this, dir, &md));  // re-gathers the distributed optimizer's parameters
  auto count = [&](const char* k) -> int64_t {
    auto it = md.find(k);
    return it == md.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
  };
  skipped_ = count("skipped_steps");
  consecutive_skipped_ = count("consecutive_skipped_steps");
  return Status::ok();
}

std::string TrainingEngine::optimizer_file_name() const {
  if (!dp_) return "optimizer.safetensors";
  const std::string pp = model_.pp().size() > 1 ? "_pp" + std::to_string(model_.pp().rank()) : "";
  return "optimizer_tp" + std::to_string(model_.tp().rank()) + pp + "_dp" + std::to_string(dp_group_->rank()) +
         ".safetensors";
}

}  // namespace kestrel::train
