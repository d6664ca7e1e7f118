// Saving a pipelined model as one Hugging Face folder: exactly the folder
// CausalLM::save of the whole model writes (the same config.json, tensor
// names, values, file names and sharding rule, io::save_weights_dir's), from
// the stages of a pipeline-parallel run (the actor's checkpoint model/
// folder, HF export).
//
// Design: streaming, one shard file at a time. The writer is pp rank 0's tp
// rank 0. Every rank walks the whole model's parameters in params() order
// (model/pipeline_params.h decides each one's owner stage once); the owner
// stage gathers the full tensor over its tp group (CausalLM::full_tensor) and
// its tp rank 0 sends it to the writer over the pp group (point to point: the
// stages in between move nothing). The shapes follow from config.json on
// every rank, so nothing but the data travels; the writer sizes each receive
// from the whole model's shape and the stages check theirs against it first.
// The writer splits the tensors into shard files by the rule of
// io::save_weights_dir (sizes known from the shapes beforehand), keeps the
// tensors of the shards still open and writes each shard file as soon as its
// last tensor arrives: it never holds more than the open shard (<=
// max_shard_bytes) plus one tensor, so a model that fits on no single rank
// still exports. A tensor travels in the disk dtype when that is smaller than
// the training dtype (f32 training, bf16 folder: half the bytes; the
// conversion is the one the writer would apply, so the bytes on disk are the
// same). A tied embedding is taken from the first stage and written once.
// The model's buffers (CausalLM::buffers(): DeepSeek-V3's
// e_score_correction_bias) follow the parameters, as CausalLM::save writes
// them: in f32 whatever the disk dtype, sent in f32.
//
// Collective over the pp and tp groups: every rank of the pipeline calls it
// with its own chunks. Only the writer touches `dir`; an error there is
// returned on the writer (the others return ok, as CausalLM::save's tp ranks
// do), after it has received every tensor, so no sender is left blocked.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"

namespace kestrel::model {

// io::save_weights_dir's default shard limit (what CausalLM::save uses).
inline constexpr size_t kHfShardBytes = size_t(5) << 30;

// `stage`: this rank's pipeline stage (a slice over stage.pp(), sharded over
// stage.tp()). With pp size 1 and the default shard limit it is
// stage.save(dir, disk_dtype). max_shard_bytes: io::save_weights_dir's
// (tests use small limits to get several shard files from a tiny model).
Status save_pipelined_model(const CausalLM& stage, const std::string& dir, DType disk_dtype,
                            size_t max_shard_bytes = kHfShardBytes);
// The interleaved schedule: this rank's chunks (any order; they share the
// pp and tp groups).
Status save_pipelined_model(const std::vector<const CausalLM*>& chunks, const std::string& dir, DType disk_dtype,
                            size_t max_shard_bytes = kHfShardBytes);

}  // namespace kestrel::model
