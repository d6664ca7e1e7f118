// One trainable tensor of the model, as every layer (embedding, blocks, head)
// and the layers above (optimizer, data parallelism, checkpoints) see it.
#pragma once
#include <string>

#include "core/tensor.h"
#include "parallel/sharding.h"

namespace kestrel::model {

// One trainable tensor: its HF name, the weight (compute dtype) and its f32 gradient.
struct Param {
  std::string name;
  Tensor weight;
  Tensor grad;             // f32, same shape; undefined until enable_grads()
  bool weight_decay = true;  // false for norms and biases, as Megatron/verl do
  Shape full_shape;          // the HF tensor's shape (== weight's shape at tp = 1)
  parallel::ShardSpec shard; // how weight is cut from it over the tp group
  // False on all but one tp rank for parameters every tp rank holds in full
  // (norms, row-linear biases, replicated kv heads), so the global grad norm
  // counts each element once.
  bool norm_counted = true;
};

// The bias (or any optional tensor) when the model has it, else nullptr.
inline const Tensor* bias_of(const Param& p) { return p.weight.defined() ? &p.weight : nullptr; }
inline Tensor* grad_of(Param& p) { return p.weight.defined() ? &p.grad : nullptr; }

}  // namespace kestrel::model
