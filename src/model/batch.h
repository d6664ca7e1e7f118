// A packed batch: sequences concatenated token-major with no padding, the
// layout every layer and the attention kernel consume.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace kestrel::parallel {
struct CpLayout;  // parallel/cp_split.h
}

namespace kestrel::model {

struct PackedBatch {
  Tensor input_ids;   // i32 [T]
  Tensor positions;   // i32 [T], position of each token within its sequence (its prefix's rows first)
  Tensor cu_seqlens;  // i32 [B+1]
  Tensor targets;     // i32 [T], next token within the sequence, -1 on each sequence's last row
  // i32 [B], or undefined when no sequence continues another. prefix_of[b] = p
  // >= 0: sequence b continues sequence p (ops::attention_fwd's prefix_of):
  // its queries see all of p's keys first and its positions continue p's. The
  // samples of one prompt share the prompt's rows this way.
  Tensor prefix_of;
  // Routing replay of a MoE model (verl's routed_experts, router_replay
  // R2/R3): i32 [T, n_moe_layers, k], the experts each row's token used in
  // each MoE layer (model::moe_layer_ordinal) when it was recorded;
  // the routers use these instead of choosing. Undefined = route.
  Tensor routed_experts;
  // When set, a forward over this batch writes the routing its MoE layers
  // used there (i32 [T, n_moe_layers, k], caller-allocated): the record that
  // routing replay R2 replays in the update (verl records it while computing
  // old log-probs), and what tests compare with transformers'.
  Tensor* record_routing = nullptr;
  // Context parallelism: set on a cp rank's share of a packed batch (its rows
  // of chunks r and 2cp-1-r of every sequence, parallel/cp_split.h). Then
  // cu_seqlens gives each sequence's local rows, which are NOT contiguous
  // positions: attention must go through parallel/cp_attention.h with this
  // layout, never ops::attention_fwd on the local rows. Null = not split.
  std::shared_ptr<const parallel::CpLayout> cp;
  // Host mirrors of the tensors above, equal to them element for element
  // (pack_sequences / pack_prefix_groups fill both; the tensors are built
  // from these). Code on the host -- loss bookkeeping, row selections, index
  // checks -- reads the mirror, never the tensor, which may live on a device.
  struct Host {
    std::vector<int32_t> input_ids;   // [T]
    std::vector<int32_t> positions;   // [T]
    std::vector<int32_t> cu_seqlens;  // [B+1]
    std::vector<int32_t> targets;     // [T]
    std::vector<int32_t> prefix_of;   // [B], or empty when prefix_of is undefined
  } host;
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t max_seqlen = 0;  // the largest position + 1 (a continuation counts its prefix)
};

// Packs token sequences.
PackedBatch pack_sequences(const std::vector<std::vector<int32_t>>& seqs);

// A prefix followed by continuations that each see it (a prompt and its samples).
struct PrefixGroup {
  std::vector<int32_t> prefix;                     // may be empty: the continuations are then plain sequences
  std::vector<std::vector<int32_t>> continuations; // each non-empty
};

// Packs groups in order: each group's prefix (when non-empty) as one sequence,
// then its continuations, each with prefix_of pointing at the prefix and
// positions starting at the prefix's length. Targets stay within a packed
// sequence, so the prefix's last row has none (-1): whatever follows the
// prefix differs per continuation. Continuation c's row j holds token j of c
// and predicts token j + 1 of c.
PackedBatch pack_prefix_groups(const std::vector<PrefixGroup>& groups);

// The batch with its tensors on device dev (the model's, CausalLM::device()):
// ids, positions, targets, cu_seqlens, prefix_of and routed_experts copied
// there, the host mirrors and counts kept. The batch itself when already
// there. Not for a context-parallel share (its layout's tensors stay on the host).
PackedBatch to_device(const PackedBatch& b, Device dev);

}  // namespace kestrel::model
