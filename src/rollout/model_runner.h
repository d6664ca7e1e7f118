// One forward of the training model over a packed step (prefill chunks and
// decodes mixed, no padding), reading weights in place from the CausalLM and
// K/V through block tables. Same ops as model/forward_backward.cpp in the same
// order, so the rollout's logprobs match the trainer's.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"
#include "rollout/kv_cache.h"
#include "rollout/scheduler.h"

namespace kestrel::rollout {

// Host-side description of one step, built from the scheduler's output.
struct StepBatch {
  std::vector<int32_t> input_ids;     // [T]
  std::vector<int32_t> positions;     // [T] absolute position in its sequence
  std::vector<int32_t> slot_mapping;  // [T] cache slot of each new token's K/V
  std::vector<int32_t> cu_q;          // [B+1]
  std::vector<int32_t> seq_lens;      // [B] context including this chunk
  std::vector<int32_t> block_tables;  // [B, max_blocks], padded with the null block
  int64_t max_blocks = 0;
  std::vector<int32_t> sample_rows;   // rows whose logits are needed, in batch order
  int64_t num_tokens() const { return int64_t(input_ids.size()); }
  int64_t num_seqs() const { return int64_t(seq_lens.size()); }
};

StepBatch build_step_batch(const SchedulerOutput& so, int64_t block_size);

class ModelRunner {
 public:
  ModelRunner(const model::CausalLM& model, KVCache& kv);
  // Writes the step's K/V into the cache and returns the logits [S, V]
  // (model dtype) of the sample rows; final norm and lm_head run on those rows only.
  Tensor execute(const StepBatch& b);

 private:
  const model::CausalLM& m_;
  KVCache& kv_;
};

}  // namespace kestrel::rollout
