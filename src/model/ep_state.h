// The routed experts of a model under expert parallelism, as the layers that
// need the whole model see them: saving an HF folder, the optimizer's
// layout-independent checkpoint and the rollout's whole-model copy. Each rank
// of the ep group holds its block of every MoE layer's experts
// (ModelParallel::ep); these list every expert of the group and carry one
// from its owner to the other ranks.
#pragma once
#include <string>
#include <vector>

#include "model/transformer.h"

namespace kestrel::model {

struct RoutedExpertTensor {
  std::string name;              // HF name, global expert index
  Shape full_shape;              // the HF tensor's shape
  int owner = 0;                 // the ep rank holding it
  const Param* local = nullptr;  // this rank's parameter when it is the owner, else nullptr
};

// Every routed expert tensor of m's MoE layers over its whole ep group, in one
// order equal on every rank of the group (this rank's expert tensors in
// params() order, each followed by its counterparts on ranks 1..ep-1: the same
// local index in their blocks). Empty for a dense model; at ep = 1 m's own.
std::vector<RoutedExpertTensor> routed_expert_tensors(const CausalLM& m);

// The global expert index of a routed expert tensor's name, -1 for any other.
int64_t routed_expert_index(const std::string& name);

// t's value on every rank of m.ep(): `value_on_owner` (the owner's tensor of
// t's full shape: its weight, or an optimizer moment) sent in `wire`.
// Collective over m.ep(): every rank calls it for the same t in the same order;
// the others' value_on_owner is ignored.
Tensor broadcast_expert_tensor(const CausalLM& m, const RoutedExpertTensor& t, const Tensor& value_on_owner, DType wire,
                               MemCategory cat = MemCategory::Other);

}  // namespace kestrel::model
