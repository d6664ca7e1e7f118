// The whole model's state tensors as a pipeline holds them: which pipeline
// rank provides each one. Under pipeline parallelism every rank holds a slice
// of the model (one stage, or several chunks under the interleaved schedule);
// whatever needs the whole model on some rank (the rollout's copy of the
// weights, rollout/reshard.h; one HF folder, model/pipeline_save.h) walks the
// whole model's state tensors in state_tensors() order -- the parameters in
// params() order, then the untrained f32 buffers (DeepSeek-V3's
// e_score_correction_bias) in buffers() order -- and takes each from its owner.
//
// The owner of a parameter is the lowest pp rank whose chunks hold it: a tied
// embedding, held by the first stage and (as the lm_head's copy) by the last,
// comes from the first. Owners are decided by one all-reduce MIN over the pp
// group of (holds ? pp rank : INT32_MAX) in the whole model's order, so every
// rank agrees without exchanging names.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"

namespace kestrel::model {

// The whole model's state tensor list from config and options, without
// allocating the weights: names and full HF shapes in CausalLM::state_tensors()
// order of the whole model (opts' slice fields are ignored): params() order,
// then the buffers. A value model lists "score.bias" only when opts.value_head_bias.
struct ParamInfo {
  std::string name;
  Shape full_shape;
  bool buffer = false;  // a CausalLM::buffers() tensor: f32 in every precision, never sharded
};
std::vector<ParamInfo> whole_model_params(const io::ModelConfig& cfg, const ModelOptions& opts);

struct PipelineParam {
  std::string name;
  Shape full_shape;
  bool buffer = false;              // a buffer (f32 in every precision, replicated), after every parameter
  int owner = -1;                   // the pp rank that provides it
  // Under expert parallelism a routed expert of the owner stage's layers: the
  // ep rank of that stage holding it (-1: not a routed expert, or ep = 1).
  // Every ep rank of the owner stage lists it; `local` only on its holder.
  int ep_owner = -1;
  const Param* local = nullptr;     // this rank's copy (any chunk), nullptr when it has none
  const CausalLM* chunk = nullptr;  // the chunk holding `local` (its full_tensor gathers over tp)
};

// Collective over the chunks' pp group (every rank of it calls, with its own
// chunks; all chunks of a rank share the pp and tp groups and the dtype). The
// whole model's state tensors in state_tensors() order with their owners. A value
// model's "score.bias" is listed when some stage holds it. Fails on every
// rank of the pp group alike when the stages disagree (another config, dtype,
// a tensor of another shape, a name not in the whole model) or no stage holds
// a parameter.
Result<std::vector<PipelineParam>> pipeline_params(const std::vector<const CausalLM*>& chunks);

}  // namespace kestrel::model
