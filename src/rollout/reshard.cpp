#include "rollout/reshard.h"

#include <chrono>

#include "parallel/reshard.h"

namespace kestrel::rollout {

namespace {

std::vector<model::Param*> params_of(const model::CausalLM& m) {
  // params() is non-const only because it hands out mutable pointers.
  return const_cast<model::CausalLM&>(m).params();
}

}  // namespace

RolloutWeights::RolloutWeights(const model::CausalLM& train, std::unique_ptr<model::CausalLM> copy)
    : train_(train), copy_(std::move(copy)) {
  if (!copy_) return;
  src_ = params_of(train_);
  dst_ = params_of(*copy_);
  KS_CHECK(src_.size() == dst_.size(), "reshard: the rollout model has ", dst_.size(), " parameters, training ",
           src_.size());
  for (size_t i = 0; i < src_.size(); ++i)
    KS_CHECK(src_[i]->name == dst_[i]->name && src_[i]->full_shape == dst_[i]->full_shape &&
                 src_[i]->shard.kind == dst_[i]->shard.kind,
             "reshard: parameter ", i, " is '", src_[i]->name, "' in training but '", dst_[i]->name,
             "' in the rollout model");
}

std::unique_ptr<RolloutWeights> RolloutWeights::create(const model::CausalLM& train,
                                                       const RolloutWeightsOptions& opts) {
  comm::ProcessGroup& ttp = train.tp();
  const DType dt = opts.dtype.value_or(train.dtype());
  const bool same_group = !opts.tp || opts.tp.get() == &ttp;
  int32_t in_place = same_group || (opts.tp->size() == ttp.size() && opts.tp->rank() == ttp.rank());
  in_place = in_place && dt == train.dtype();
  // Every rank of a training tp group must take the same path: the copy
  // gathers over that group.
  ttp.all_reduce(&in_place, 1, DType::I32, comm::ReduceOp::Min);
  if (in_place) {
    std::unique_ptr<RolloutWeights> w(new RolloutWeights(train, nullptr));
    w->last_.in_place = true;
    return w;
  }
  model::ModelOptions mo;
  mo.dtype = dt;
  // The same padded vocabulary rule as the training model (a copy with another
  // rule would pad to another shape and not fit the shards).
  mo.make_vocab_size_divisible_by = train.options().make_vocab_size_divisible_by;
  mo.parallel.tp = opts.tp ? opts.tp : comm::local_group("rollout_tp");
  mo.parallel.sequence_parallel = false;  // inference has no SP
  mo.max_positions = train.rope().cos.defined() ? train.rope().cos.size(0) : train.options().max_positions;
  // TODO(model): an uninitialised CausalLM factory would skip these draws;
  // init_std 0 at least makes the throwaway values cheap to overwrite.
  auto copy = model::CausalLM::init_random(train.config(), mo, 0, 0.0);
  std::unique_ptr<RolloutWeights> w(new RolloutWeights(train, std::move(copy)));
  w->refresh();
  return w;
}

const ReshardStats& RolloutWeights::refresh() {
  const auto t0 = std::chrono::steady_clock::now();
  last_ = ReshardStats{};
  last_.in_place = in_place();
  if (in_place()) return last_;
  comm::ProcessGroup& ttp = train_.tp();
  comm::ProcessGroup& rtp = copy_->tp();
  parallel::ReshardBytes bytes;
  for (size_t i = 0; i < src_.size(); ++i) {
    const model::Param& s = *src_[i];
    model::Param& d = *dst_[i];
    if (!d.weight.defined())  // after release()
      d.weight = Tensor::empty(parallel::shard_shape(d.full_shape, d.shard, rtp.size(), d.name), copy_->dtype(),
                               MemCategory::Params);
    bytes += parallel::reshard_tensor(ttp, s.weight, s.shard, s.full_shape, rtp.rank(), rtp.size(), d.weight, s.name);
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
