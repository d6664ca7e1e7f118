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
// refresh() is collective over the training tp group only; the rollout group
// never communicates here. Call it after every optimizer step, at the
// train -> rollout switch, then Engine::update_weights_version().
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "comm/process_group.h"
#include "model/transformer.h"

namespace kestrel::rollout {

struct ReshardStats {
  bool in_place = false;       // the rollout reads the training weights
  int64_t tensors = 0;         // parameters refreshed
  int64_t bytes_received = 0;  // this rank: gathered over the training tp group
  int64_t bytes_copied = 0;    // this rank: written into the rollout weights
  double seconds = 0;          // wall time of the refresh on this rank
};

struct RolloutWeightsOptions {
  // The rollout's tp group; nullptr = the training model's tp group (in place).
  std::shared_ptr<comm::ProcessGroup> tp;
  // Storage dtype of the rollout weights; nullopt = the training model's.
  // A different dtype (f32 training, bf16 rollout) always copies.
  std::optional<DType> dtype;
};

class RolloutWeights {
 public:
  // Collective over the training model's tp group: the ranks agree on in
  // place vs copy, and a copy is filled by a first refresh(). `train` must
  // outlive this object (and the engine built on model()).
  static std::unique_ptr<RolloutWeights> create(const model::CausalLM& train, const RolloutWeightsOptions& opts);

  // The model to hand to rollout::Engine::create: the training model itself
  // in place, else the rollout-sharded copy.
  const model::CausalLM& model() const { return copy_ ? *copy_ : train_; }
  bool in_place() const { return copy_ == nullptr; }

  // Re-copies every parameter from the training model (collective over the
  // training tp group; allocates the copy again after release()). In place
  // it only returns zero bytes moved.
  const ReshardStats& refresh();
  // Frees the rollout copy while training runs (colocated memory); the engine
  // must not step until refresh(). No-op in place.
  void release();
  bool released() const { return released_; }

  // The latest refresh().
  const ReshardStats& last() const { return last_; }

 private:
  RolloutWeights(const model::CausalLM& train, std::unique_ptr<model::CausalLM> copy);

  const model::CausalLM& train_;
  std::unique_ptr<model::CausalLM> copy_;  // nullptr in place
  // Matching parameters, listed once: CausalLM::params() skips undefined
  // weights, and release() undefines every weight of the copy.
  std::vector<model::Param*> src_, dst_;
  bool released_ = false;
  ReshardStats last_;
};

}  // namespace kestrel::rollout
