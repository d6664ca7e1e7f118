// Pipeline-parallel layer layout: which decoder layers each pipeline stage
// (and each virtual-pipeline chunk of a stage) holds, Megatron-Core's rules
// (transformer_block.get_num_layers_to_build, get_transformer_layer_offset)
// with MindSpeed's noop layers.
//
// Layers are counted in "slots": the model's num_hidden_layers real layers
// plus |noop_layers| identity layers (MindSpeed --noop-layers: the listed slot
// ids, 0-based, carry no parameters). The slots are split over pp * vpp
// virtual stages; virtual stage s = chunk * pp + rank holds a contiguous slot
// range. Removing the noop slots, each chunk holds a contiguous (possibly
// empty) range of real layers, so a chunk is a model slice
// (model::ModelOptions first_layer / num_layers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::parallel {

struct PipelineSpec {
  int pp = 1;   // pipeline_model_parallel_size
  int vpp = 1;  // virtual_pipeline_model_parallel_size (null -> 1; 1 = no interleaving)
  // Megatron's uneven split (override_transformer_config.num_layers_in_{first,last}_pipeline_stage),
  // in slots; -1 = not set (the slots divide evenly).
  int64_t first_stage_layers = -1;
  int64_t last_stage_layers = -1;
  // MindSpeed's noop_layers: slot ids in [0, num_hidden_layers + noop_layers.size()).
  std::vector<int64_t> noop_layers;
  // Megatron's microbatch_group_size_per_vp_stage; 0 = pp (its default).
  int64_t microbatch_group_size = 0;
};

// What one chunk of one pipeline rank holds.
struct StageChunk {
  int64_t first_layer = 0;  // first real (HF) layer index
  int64_t num_layers = 0;   // real layers; 0 when its slots are all noop layers
  int64_t first_slot = 0;   // its slot range, noop layers included
  int64_t num_slots = 0;
  bool has_embedding = false;  // virtual stage 0
  bool has_head = false;       // the last virtual stage
};

// chunks[rank][chunk] for every pipeline rank, or an error naming the keys and
// the numbers that do not fit (slots not divisible, uneven sizes too large,
// noop ids out of range or repeated, pp * vpp stages with no slot, ...).
//
// Megatron's rules, in slots (S = num_hidden_layers + |noop_layers|):
// - even split: S % pp == 0 and (S / pp) % vpp == 0;
// - uneven: the first (last) rank takes first_stage_layers (last_stage_layers)
//   slots, the pp - (number set) middle ranks split the rest evenly; each set
//   size > 0 and divisible by vpp, the middle ranks' share too; leftover slots
//   with no middle rank (or middle ranks with no slot) are an error. With
//   pp == 1 the single rank is first and last: Megatron accepts one of them
//   equal to S (no effect) and rejects anything else, and so do we;
// - vpp > 1 needs pp >= 2 (Megatron parallel_state's RuntimeError);
// - each rank's slots are split evenly over its vpp chunks; virtual stage
//   s = chunk * pp + rank holds the s-th contiguous slot range.
Result<std::vector<std::vector<StageChunk>>> pipeline_chunks(const PipelineSpec& spec, int64_t num_hidden_layers);

// Slots held by each pipeline rank (all its chunks), after the checks of
// pipeline_chunks: the split the layout uses, for plans and messages.
Result<std::vector<int64_t>> pipeline_stage_slots(const PipelineSpec& spec, int64_t num_hidden_layers);

// Megatron's micro-batch group of the interleaved schedule:
// microbatch_group_size, or pp when it is 0.
int64_t microbatch_group_size(const PipelineSpec& spec);

// Megatron's check in forward_backward_pipelining_with_interleaving for m
// micro-batches per step, with N = microbatch_group_size(spec):
// p <= N <= m (else its ValueError), and m % N == 0 or m % N >= p (else its
// RuntimeError: the last group would leave dependency bubbles). OK when
// vpp == 1 (no interleaving: any m >= 1 runs the plain 1F1B); with vpp > 1
// also the size errors (pp < 2, a negative group).
Status check_interleaved_microbatches(const PipelineSpec& spec, int64_t num_micro_batches);

}  // namespace kestrel::parallel
