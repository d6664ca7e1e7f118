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
  // MoE router replay of this pass: R3 replays b.routed_experts (the rollout's, or the actor's R2 record);
  // R2 is the actor's old-log-prob pass recording its routing (ActorWorker::compute_log_probs).
  RouterReplay router_replay = RouterReplay::Disabled;
};

// Next-token log-probs of every response token of `b` under `model` ([N] over
// b.layout, into `out`). Each dp rank scores its share (rl::dp_share); every
// rank then holds all of them. Collective over `dp` (and the model's tp and pp groups).
// With opt.router_replay R3 the forwards replay b.routed_experts (b must hold them).
// `record` (may be null): the routing the forwards used, per sequence of b, as
// RolloutBatch::routed_experts lays it out (every rank all of them); a dense model records nothing.
void score_log_probs(const model::CausalLM& model, const RolloutBatch& b, const LogProbOptions& opt,
                     comm::ProcessGroup& dp, std::vector<double>& out,
                     std::vector<std::vector<int32_t>>* record = nullptr);

// The routing recorded over packed micro-batches (PackedBatch::record_routing: i32 [T, L, k] each, -1
// where a pipeline stage holds no layer) -> per-sequence records of b (`records`, b.size() entries, only
// those of each micro-batch's seqs written). Under pipeline parallelism each stage recorded its own layers:
// the records are combined over `pp` first, so every stage holds the whole model's.
void unpack_micro_batch_routing(const RolloutBatch& b, const std::vector<std::vector<int64_t>>& seqs,
                                bool share_prompts, const std::vector<Tensor>& recorded, comm::ProcessGroup& pp,
                                std::vector<std::vector<int32_t>>& records);

// A record tensor for a packed batch of T rows of `model`: i32 [T, n_moe_layers, k] of -1.
Tensor routing_record_tensor(const model::CausalLM& model, int64_t T);

}  // namespace kestrel::rl
