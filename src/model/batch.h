// A packed batch: sequences concatenated token-major with no padding, the
// layout every layer and the attention kernel consume.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kestrel::model {

struct PackedBatch {
  Tensor input_ids;   // i32 [T]
  Tensor positions;   // i32 [T], position of each token within its sequence
  Tensor cu_seqlens;  // i32 [B+1]
  Tensor targets;     // i32 [T], next token within the sequence, -1 on each sequence's last row
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t max_seqlen = 0;
};

// Packs token sequences; `start_positions` (optional) offsets positions, for
// continuing a sequence whose prefix is elsewhere (rollout chunks).
PackedBatch pack_sequences(const std::vector<std::vector<int32_t>>& seqs);

}  // namespace kestrel::model
