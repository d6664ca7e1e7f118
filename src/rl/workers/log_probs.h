// Old / reference log-probs of a rollout batch: the forward-only scoring pass
// the actor worker and the reference worker share (verl's compute_log_prob /
// compute_ref_log_prob).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "model/transformer.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl {

struct LogProbOptions {
  // Token budget of one scoring micro-batch (log_prob_max_token_len_per_gpu).
  int64_t max_token_len = 16384;
  // Sequences per scoring micro-batch (log_prob_micro_batch_size_per_gpu);
  // > 0 takes precedence over the token budget, 0 = by max_token_len only.
  int64_t micro_batch_size = 0;
  bool share_prompts = true;  // pack a prompt once per micro-batch (pack_rollout_sequences)
  bool balance_batch = true;  // rl::dp_share's
};

// Next-token log-probs of every response token of `b` under `model` ([N] over
// b.layout, into `out`). Each dp rank scores its share (rl::dp_share); every
// rank then holds all of them. Collective over `dp` (and the model's tp group).
void score_log_probs(const model::CausalLM& model, const RolloutBatch& b, const LogProbOptions& opt,
                     comm::ProcessGroup& dp, std::vector<double>& out);

}  // namespace kestrel::rl
