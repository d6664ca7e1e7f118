// The rollout's copy of the training weights when rollout and training use
// different tensor-parallel sizes (MindSpeed-RL's MegatronShardingManager,
// verl's rollout_mode weight sync), and the zero-copy case when they match.
//
//   train tp == rollout tp (same size, each rank the same tp rank in both):
//     the rollout engine reads the training model in place (no copy; the
//     engine's collectives run over the training tp group). refresh() moves
//     nothing.
//   otherwise: a second CausalLM, sharded over the rollout tp group (its own
//     heads, kv heads, F/tp and V/tp), whose every parameter is the full HF
//     tensor (CausalLM::full_tensor: an all-gather over the training tp group)
//     cut with the rollout layout's ShardSpec. A training TP2 model feeding a
//     TP1 rollout gives every rank a full copy; a TP1 (data-parallel)
//     training model feeding a TP2 rollout cuts each rank's half locally.
//
// The copy carries the model's buffers with its parameters
// (CausalLM::state_tensors(): DeepSeek-V3's e_score_correction_bias, f32 in
// every precision, which training's aux-loss-free balancing moves), so a
// refreshed copy routes as the training model does.
//
// The copy lives on the training model's device (CausalLM::device()); a
// model on a device is a single process (tp, pp and ep 1), so there the copy
// is the other-dtype case, refreshed by device-to-device copies.
//
// refresh() is collective over the training tp group only; the rollout group
// never communicates here. Call it after every optimizer step, at the
// train -> rollout switch, then Engine::update_weights_version().
//
// Pipeline parallelism (train.pp().size() > 1): the training model is a
// stage (a slice, or several chunks under the interleaved schedule) while the
// rollout runs the whole model, never pipelined. The copy is then always a
// whole model (every layer, the embedding and the head), sharded over the
// rollout tp group as above. Each parameter's owner stage is decided once
// (model/pipeline_params.h: the lowest pp rank holding it, so a tied
// embedding comes from the first stage); refresh() walks the whole model's
// parameters in order: the owner gathers the full tensor over its training
// tp group, broadcasts it over the pp group (in the smaller of the training
// and rollout dtypes: converting before or after the wire rounds the same,
// so the copy equals one process's bit for bit) and every rank cuts its
// rollout shard. Collective over the training tp and pp groups then: every
// rank of the pipeline calls create() and refresh() together.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/process_group.h"
#include "model/ep_state.h"
#include "model/pipeline_params.h"
#include "model/transformer.h"

namespace kestrel::rollout {

struct ReshardStats {
  bool in_place = false;       // the rollout reads the training weights
  int64_t tensors = 0;         // state tensors refreshed (parameters and buffers)
  int64_t bytes_received = 0;  // this rank: gathered over the training tp group, plus over pp below
  int64_t bytes_received_pp = 0;  // of which: broadcast from other pipeline stages (pp > 1)
  int64_t bytes_copied = 0;    // this rank: written into the rollout weights
  double seconds = 0;          // wall time of the refresh on this rank
};

struct RolloutWeightsOptions {
  // The rollout's tp group; nullptr = the training model's tp group (in place;
  // under pp, a whole-model copy sharded over the training tp group).
  std::shared_ptr<comm::ProcessGroup> tp;
  // Storage dtype of the rollout weights; nullopt = the training model's.
  // A different dtype (f32 training, bf16 rollout) always copies.
  std::optional<DType> dtype;
  // The rollout's expert-parallel size (rollout.expert_parallel_size): 1 =
  // every expert on each rank (a copy, gathered from the training ep group);
  // the training model's ep size = its experts in place, the rollout's MoE
  // layers dispatching over the training ep group (rollout::Engine runs its
  // steps in lockstep over that group).
  int64_t ep = 1;
};

class RolloutWeights {
 public:
  // Collective over the training model's tp group: the ranks agree on in
  // place vs copy, and a copy is filled by a first refresh(). `train` must
  // outlive this object (and the engine built on model()).
  // Under pp > 1 also collective over train.pp(), and `train` is this rank's
  // stage; the copy is the whole model.
  static std::unique_ptr<RolloutWeights> create(const model::CausalLM& train, const RolloutWeightsOptions& opts);
  // The interleaved schedule: this rank's chunks (sharing the tp and pp
  // groups, pp size > 1), which must outlive this object.
  static std::unique_ptr<RolloutWeights> create(const std::vector<const model::CausalLM*>& chunks,
                                                const RolloutWeightsOptions& opts);

  // The model to hand to rollout::Engine::create: the training model itself
  // in place, else the rollout-sharded copy.
  const model::CausalLM& model() const { return copy_ ? *copy_ : train_; }
  bool in_place() const { return copy_ == nullptr; }

  // Re-copies every parameter and buffer from the training model (collective over the
  // training tp group, and the pp group under pp; allocates the copy again
  // after release()). In place it only returns zero bytes moved.
  const ReshardStats& refresh();
  // Frees the rollout copy while training runs (colocated memory); the engine
  // must not step until refresh(). No-op in place.
  void release();
  bool released() const { return released_; }

  // The latest refresh().
  const ReshardStats& last() const { return last_; }

 private:
  RolloutWeights(const model::CausalLM& train, std::unique_ptr<model::CausalLM> copy, bool pipelined = false);
  void refresh_pipelined();
  void list_expert_parallel_sources();
  void refresh_expert_parallel();

  const model::CausalLM& train_;
  std::unique_ptr<model::CausalLM> copy_;  // nullptr in place
  // Matching state tensors (parameters, then buffers), listed once:
  // CausalLM::params() skips undefined weights, and release() undefines every
  // weight of the copy. Under pp src_ is empty and pipe_[i] says where dst_[i]
  // comes from. dst_dtype_[i]: dst_[i]'s storage dtype (the rollout dtype, f32
  // for a buffer), to allocate it again after release().
  std::vector<model::Param*> src_, dst_;
  std::vector<DType> dst_dtype_;
  std::vector<model::PipelineParam> pipe_;
  // Under expert parallelism (train.ep() size > 1; tp and pp 1) the copy holds
  // every expert: src_[i] is this rank's tensor of dst_[i] (nullptr for
  // another rank's expert) and experts_[i] the routed expert dst_[i] is
  // (owner -1: not an expert), broadcast over the ep group from its owner.
  std::vector<model::RoutedExpertTensor> experts_;
  bool released_ = false;
  ReshardStats last_;
};

}  // namespace kestrel::rollout
