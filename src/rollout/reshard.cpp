#include "rollout/reshard.h"

#include <chrono>
#include <map>

#include "parallel/reshard.h"

namespace kestrel::rollout {

namespace {

// Parameters then buffers: everything a whole-model copy must carry.
std::vector<model::Param*> state_of(const model::CausalLM& m) {
  // state_tensors() is non-const only because it hands out mutable pointers.
  return const_cast<model::CausalLM&>(m).state_tensors();
}

// The rollout copy: the whole model in dtype `dt`, sharded over `tp`, on the
// training model's device (a device model is one process: tp 1, and the
// copy's weights are refreshed by device copies, Tensor::copy_from).
model::ModelOptions copy_options(const model::CausalLM& train, DType dt, std::shared_ptr<comm::ProcessGroup> tp) {
  model::ModelOptions mo;
  mo.dtype = dt;
  mo.device = train.device();
  // The same padded vocabulary rule as the training model (a copy with another
  // rule would pad to another shape and not fit the shards).
  mo.make_vocab_size_divisible_by = train.options().make_vocab_size_divisible_by;
  mo.parallel.tp = std::move(tp);
  mo.parallel.sequence_parallel = false;  // inference has no SP
  mo.max_positions = train.rope().cos.defined() ? train.rope().cos.size(0) : train.options().max_positions;
  mo.moe = train.options().moe;  // the routers' options (moe_router_dtype: the rollout routes as training does)
  return mo;
}

}  // namespace

RolloutWeights::RolloutWeights(const model::CausalLM& train, std::unique_ptr<model::CausalLM> copy, bool pipelined)
    : train_(train), copy_(std::move(copy)) {
  if (!copy_) return;
  dst_ = state_of(*copy_);
  for (model::Param* p : dst_) dst_dtype_.push_back(p->weight.dtype());
  if (pipelined) return;  // create() lists pipe_
  if (train_.ep().size() > 1) {
    list_expert_parallel_sources();
    return;
  }
  src_ = state_of(train_);
  KS_CHECK(src_.size() == dst_.size(), "reshard: the rollout model has ", dst_.size(), " state tensors, training ",
           src_.size());
  for (size_t i = 0; i < src_.size(); ++i)
    KS_CHECK(src_[i]->name == dst_[i]->name && src_[i]->full_shape == dst_[i]->full_shape &&
                 src_[i]->shard.kind == dst_[i]->shard.kind,
             "reshard: state tensor ", i, " is '", src_[i]->name, "' in training but '", dst_[i]->name,
             "' in the rollout model");
}

std::unique_ptr<RolloutWeights> RolloutWeights::create(const model::CausalLM& train,
                                                       const RolloutWeightsOptions& opts) {
  if (train.pp().size() > 1) return create(std::vector<const model::CausalLM*>{&train}, opts);
  comm::ProcessGroup& ttp = train.tp();
  const DType dt = opts.dtype.value_or(train.dtype());
  const bool same_group = !opts.tp || opts.tp.get() == &ttp;
  int32_t in_place = same_group || (opts.tp->size() == ttp.size() && opts.tp->rank() == ttp.rank());
  // Under expert parallelism the rollout holds every expert (a copy) unless
  // it runs on the training ep group (the sizes are equal on all its ranks,
  // so they all take one branch).
  const int64_t tep = train.ep().size();
  // The rollout runs each expert's shards over its own tp group: an actor
  // with experts split apart from tp (etp != tp) is read through a copy.
  const bool apart = train.experts_split_apart();
  KS_CHECK(!apart || opts.ep == 1, "not supported yet: actor_rollout_ref.rollout.expert_parallel_size=", opts.ep,
           " with an actor whose experts are split over expert_tensor_parallel_size ", train.etp().size(),
           " other than tensor_model_parallel_size ", ttp.size(), " (the expert-parallel rollout reads the actor's "
           "experts in place)");
  KS_CHECK(opts.ep == 1 || opts.ep == tep, "not supported yet: actor_rollout_ref.rollout.expert_parallel_size=",
           opts.ep, " other than 1 or the actor's expert_model_parallel_size ", tep);
  in_place = in_place && dt == train.dtype() && (tep == 1 || opts.ep == tep) && !apart;
  // Every rank of a training tp group must take the same path: the copy
  // gathers over that group.
  ttp.all_reduce(&in_place, 1, DType::I32, comm::ReduceOp::Min);
  KS_CHECK(in_place || opts.ep == 1, "not supported yet: actor_rollout_ref.rollout.expert_parallel_size=", opts.ep,
           " with a rollout copy (another dtype or tensor-parallel size than the actor's): the expert-parallel "
           "rollout reads the actor's experts in place");
  if (in_place) {
    std::unique_ptr<RolloutWeights> w(new RolloutWeights(train, nullptr));
    w->last_.in_place = true;
    return w;
  }
  // A copy on the training tp group itself when the experts' split differs from it (etp != tp).
  const model::ModelOptions mo = copy_options(train, dt,
                                              opts.tp  ? opts.tp
                                              : apart  ? train.options().parallel.tp
                                                       : comm::local_group("rollout_tp"));
  // TODO(model): an uninitialised CausalLM factory would skip these draws;
  // init_std 0 at least makes the throwaway values cheap to overwrite.
  auto copy = model::CausalLM::init_random(train.config(), mo, 0, 0.0);
  std::unique_ptr<RolloutWeights> w(new RolloutWeights(train, std::move(copy)));
  w->refresh();
  return w;
}

std::unique_ptr<RolloutWeights> RolloutWeights::create(const std::vector<const model::CausalLM*>& chunks,
                                                       const RolloutWeightsOptions& opts) {
  KS_CHECK(!chunks.empty() && chunks[0], "RolloutWeights::create: no training model chunk given");
  const model::CausalLM& first = *chunks[0];
  if (first.pp().size() == 1) {
    KS_CHECK(chunks.size() == 1, "RolloutWeights::create: ", chunks.size(),
             " model chunks on one rank need a pipeline group (pp size > 1)");
    return create(first, opts);
  }
  KS_CHECK(!first.is_value_model(), "RolloutWeights: the training model is a value model (critic); the rollout "
           "generates with the actor's causal LM");
  KS_CHECK(opts.ep == 1, "not supported yet: actor_rollout_ref.rollout.expert_parallel_size=", opts.ep,
           " under pipeline parallelism (the rollout runs the whole model: its copy holds every expert)");
  KS_CHECK((first.ep().size() == 1 || first.tp().size() == 1) && !first.experts_split_apart(),
           "not supported yet: rollout weights from an actor under pipeline, expert (", first.ep().size(),
           ") and tensor (", first.tp().size(), ", experts over ", first.etp().size(), ") parallelism at once");
  // Collective over pp: every rank learns each parameter's owner stage.
  auto pipe = model::pipeline_params(chunks);
  KS_CHECK(pipe.is_ok(), "RolloutWeights (pipeline parallel): ", pipe.status().message());
  // The rollout tp group: the given one, else the training tp group (each
  // stage's tp group then runs a whole-model engine of its own).
  const DType dt = opts.dtype.value_or(first.dtype());
  const model::ModelOptions mo = copy_options(first, dt, opts.tp ? opts.tp : first.options().parallel.tp);
  // TODO(model): as above, an uninitialised factory would skip the draws.
  auto copy = model::CausalLM::init_random(first.config(), mo, 0, 0.0);
  std::unique_ptr<RolloutWeights> w(new RolloutWeights(first, std::move(copy), /*pipelined=*/true));
  w->pipe_ = std::move(pipe).value();
  KS_CHECK(w->pipe_.size() == w->dst_.size(), "reshard: the whole rollout model has ", w->dst_.size(),
           " state tensors, the pipeline stages ", w->pipe_.size());
  for (size_t i = 0; i < w->dst_.size(); ++i)
    KS_CHECK(w->pipe_[i].name == w->dst_[i]->name && w->pipe_[i].full_shape == w->dst_[i]->full_shape,
             "reshard: whole-model state tensor ", i, " is '", w->pipe_[i].name, "' in the pipeline but '",
             w->dst_[i]->name, "' in the rollout model");
  w->refresh();
  return w;
}

void RolloutWeights::refresh_pipelined() {
  comm::ProcessGroup& ttp = train_.tp();
  comm::ProcessGroup& pp = train_.pp();
  comm::ProcessGroup& rtp = copy_->tp();
  // The smaller dtype on the wire: rounding f32 -> bf16 before the broadcast
  // or when cutting the shard is the same copy_from, so the bytes are equal.
  const DType wire = dtype_size(copy_->dtype()) < dtype_size(train_.dtype()) ? copy_->dtype() : train_.dtype();
  for (size_t i = 0; i < pipe_.size(); ++i) {
    const model::PipelineParam& s = pipe_[i];
    model::Param& d = *dst_[i];
    if (!d.weight.defined())  // after release()
      d.weight = Tensor::empty(parallel::shard_shape(d.full_shape, d.shard, rtp.size(), d.name), dst_dtype_[i],
                               MemCategory::Params, copy_->device());
    // A buffer is f32 on both sides: it travels in f32, never rounded.
    const DType on_wire = s.buffer ? DType::F32 : wire;
    Tensor buf;  // the full HF tensor [full_shape], in `on_wire`
    if (s.owner == pp.rank() && s.ep_owner >= 0) {  // a routed expert: first to every ep rank of its stage (tp 1)
      const model::RoutedExpertTensor t{s.name, s.full_shape, s.ep_owner, s.local};
      buf = model::broadcast_expert_tensor(train_, t, s.local ? s.local->weight : Tensor(), on_wire);
      if (s.ep_owner != train_.ep().rank()) last_.bytes_received += int64_t(buf.nbytes());
    } else if (s.owner == pp.rank()) {
      Tensor full = s.local->weight;  // replicated tensors and tp 1 hold the full tensor already
      if (ttp.size() > 1 && s.local->shard.kind != parallel::ShardKind::Replicated) {
        full = s.chunk->full_tensor(*s.local);  // collective over this stage's training tp group
        last_.bytes_received += int64_t(ttp.size() - 1) * int64_t(s.local->weight.nbytes());
      }
      KS_CHECK(full.shape() == s.full_shape, "reshard of '", s.name, "': the stage holds ", full.describe(),
               ", expected the full shape ", shape_str(s.full_shape));
      buf = full.dtype() == on_wire ? full : full.to(on_wire, MemCategory::Other);
    } else {
      buf = Tensor::empty(s.full_shape, on_wire, MemCategory::Other, train_.device());  // where the owner sends from
      last_.bytes_received_pp += int64_t(buf.nbytes());
    }
    pp.broadcast(buf, s.owner);  // every rank of the pp group, in the whole model's order
    parallel::cut_shard_into(buf, d.shard, rtp.rank(), rtp.size(), d.weight, d.name);
    last_.bytes_copied += int64_t(d.weight.nbytes());
    ++last_.tensors;
  }
  last_.bytes_received += last_.bytes_received_pp;
}

void RolloutWeights::list_expert_parallel_sources() {
  std::map<std::string, model::Param*> mine;
  for (model::Param* p : state_of(train_)) mine[p->name] = p;
  std::map<std::string, model::RoutedExpertTensor> experts;
  for (model::RoutedExpertTensor& t : model::routed_expert_tensors(train_)) experts[t.name] = std::move(t);
  src_.assign(dst_.size(), nullptr);
  experts_.assign(dst_.size(), model::RoutedExpertTensor{});
  for (size_t i = 0; i < dst_.size(); ++i) {
    const std::string& name = dst_[i]->name;
    if (auto e = experts.find(name); e != experts.end()) {
      experts_[i] = e->second;
      src_[i] = const_cast<model::Param*>(e->second.local);
      experts.erase(e);
      continue;
    }
    experts_[i].owner = -1;
    auto m = mine.find(name);
    KS_CHECK(m != mine.end(), "reshard: the rollout model's '", name, "' is neither this rank's nor a routed expert");
    KS_CHECK(m->second->full_shape == dst_[i]->full_shape, "reshard: '", name, "' is ",
             shape_str(m->second->full_shape), " in training, ", shape_str(dst_[i]->full_shape), " in the rollout");
    src_[i] = m->second;
  }
  KS_CHECK(experts.empty(), "reshard: ", experts.size(), " routed expert tensors of the ep group (e.g. '",
           experts.empty() ? "" : experts.begin()->first, "') are not in the rollout model");
}

void RolloutWeights::refresh_expert_parallel() {
  comm::ProcessGroup& rtp = copy_->tp();
  // The smaller dtype on the wire, as refresh_pipelined.
  const DType wire = dtype_size(copy_->dtype()) < dtype_size(train_.dtype()) ? copy_->dtype() : train_.dtype();
  for (size_t i = 0; i < dst_.size(); ++i) {
    model::Param& d = *dst_[i];
    if (!d.weight.defined())  // after release()
      d.weight = Tensor::empty(parallel::shard_shape(d.full_shape, d.shard, rtp.size(), d.name), dst_dtype_[i],
                               MemCategory::Params, copy_->device());
    const model::RoutedExpertTensor& e = experts_[i];
    if (e.owner < 0) {  // every ep rank holds it (under tp its shard: gathered over the training tp group)
      const model::Param& s = *src_[i];
      last_.bytes_received += parallel::reshard_tensor(train_.shard_group(s), s.weight, s.shard, s.full_shape,
                                                       rtp.rank(), rtp.size(), d.weight, s.name)
                                  .received;
    } else {  // collective over the ep group, in dst_'s order on every rank
      // Under etp the owners (a whole etp group) first gather it over etp.
      const Tensor mine = !src_[i]                        ? Tensor()
                          : train_.etp().size() > 1 ? train_.full_tensor(*src_[i])
                                                    : src_[i]->weight;
      const Tensor buf = model::broadcast_expert_tensor(train_, e, mine, wire);
      if (e.owner != train_.ep().rank()) last_.bytes_received += int64_t(buf.nbytes());
      parallel::cut_shard_into(buf, d.shard, rtp.rank(), rtp.size(), d.weight, d.name);
    }
    last_.bytes_copied += int64_t(d.weight.nbytes());
    ++last_.tensors;
  }
}

const ReshardStats& RolloutWeights::refresh() {
  const auto t0 = std::chrono::steady_clock::now();
  last_ = ReshardStats{};
  last_.in_place = in_place();
  if (in_place()) return last_;
  if (!pipe_.empty() || !experts_.empty()) {
    if (pipe_.empty()) refresh_expert_parallel();
    else refresh_pipelined();
    released_ = false;
    last_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return last_;
  }
  comm::ProcessGroup& rtp = copy_->tp();
  parallel::ReshardBytes bytes;
  for (size_t i = 0; i < src_.size(); ++i) {
    const model::Param& s = *src_[i];
    model::Param& d = *dst_[i];
    if (!d.weight.defined())  // after release()
      d.weight = Tensor::empty(parallel::shard_shape(d.full_shape, d.shard, rtp.size(), d.name), dst_dtype_[i],
                               MemCategory::Params, copy_->device());
    bytes += parallel::reshard_tensor(train_.shard_group(s), s.weight, s.shard, s.full_shape, rtp.rank(), rtp.size(),
                                      d.weight, s.name);
    ++last_.tensors;
  }
  released_ = false;
  last_.bytes_received = bytes.received;
  last_.bytes_copied = bytes.copied;
  last_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return last_;
}

void RolloutWeights::release() {
  if (in_place() || released_) return;
  for (model::Param* p : dst_) p->weight = Tensor();
  released_ = true;
}

}  // namespace kestrel::rollout
