// The RL trainer over several processes (mpirun): how a step's data moves.
//
// Layout (verl's, in one program): the world is cut into rollout groups of
// rollout.tensor_model_parallel_size consecutive ranks; each generates a
// contiguous share of the step's prompts. Every rank then receives every
// response (token ids are small), so rewards, advantages and the data metrics
// are computed once on identical data and equal the single-process values.
// The actor update is data parallel: dp rank d trains the sequences of its
// contiguous share of the prompts (the GRPO groups stay whole) with the
// mini-batch loss denominators summed over dp, and the gradients are summed
// (parallel/data_parallel.h), so the update equals one process's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl {

// The trainer's process layout; size-1 groups = one process. The trainer hands
// it to the critic (Critic::use_parallel), which trains over the same dp group.
struct RlParallel {
  std::shared_ptr<comm::ProcessGroup> world = comm::local_group("world");
  std::shared_ptr<comm::ProcessGroup> dp = comm::local_group("dp");  // the actor's (and critic's) data-parallel group
  // Under context parallelism (model::ModelParallel::cp) Megatron's dp-cp
  // group: the engines reduce gradients over it (the cp ranks of a dp slice
  // train the same sequences, each its share of them), and its rank 0 writes
  // the model folders. nullptr = dp (no context parallelism).
  std::shared_ptr<comm::ProcessGroup> dp_cp;
  comm::ProcessGroup& grad_group() const { return dp_cp ? *dp_cp : *dp; }
  std::shared_ptr<comm::ProcessGroup> grad_group_ptr() const { return dp_cp ? dp_cp : dp; }
  // Expert parallelism (model::ModelParallel::ep): Megatron's expert-data-parallel
  // group, over which the routed experts' gradients are summed; nullptr = none.
  std::shared_ptr<comm::ProcessGroup> expert_dp;
  bool distributed_optimizer = false;  // megatron.use_distributed_optimizer
  // The rollout's tensor-parallel group (consecutive world ranks); nullptr =
  // the actor's own tp group, whose weights the engine then reads in place.
  std::shared_ptr<comm::ProcessGroup> rollout_tp;
  // rollout.expert_parallel_size: 1 = the rollout holds every expert (a copy
  // under training EP); the actor's ep size = its experts read in place.
  int64_t rollout_ep = 1;

  // Whether this rank takes part in writing a model folder (model::save_pipelined_model): the ranks of
  // grad_group() rank 0's tp and pp groups and, under expert (tensor) parallelism, of their etp and ep
  // groups, which gather the experts' shards and the experts (the expert grid is etp x ep: one pass over
  // each reaches all of it). Collective over `etp` and `ep` (the model's groups).
  bool writes_model(comm::ProcessGroup& ep, comm::ProcessGroup& etp) const {
    int32_t w = grad_group().rank() == 0 ? 1 : 0;
    if (etp.size() > 1) etp.all_reduce(&w, 1, DType::I32, comm::ReduceOp::Max);
    if (ep.size() > 1) ep.all_reduce(&w, 1, DType::I32, comm::ReduceOp::Max);
    return w != 0;
  }
};

// This dp rank's sequences of b (ascending): with balance (trainer.balance_batch)
// and dp > 1 a Karmarkar-Karp partition of equal sizes with balanced token
// counts (parallel/balance.h), else the sequences of its contiguous share of
// the prompts (b.group). Every sequence belongs to exactly one rank; at dp = 1
// all of them, in order.
std::vector<int64_t> dp_share(const RolloutBatch& b, comm::ProcessGroup& dp, bool balance);

// [begin, end) of part `part` of `parts` contiguous parts of n items (the
// first n % parts parts one longer).
std::pair<int64_t, int64_t> share_range(int64_t n, int part, int parts);

// One generated response as it travels between ranks.
struct WireResponse {
  int64_t prompt = 0;  // index of its prompt within the step
  int64_t sample = 0;  // sample index within the prompt
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // empty or one per token
  // MoE routing replay R3: the experts of every prompt and response token (rollout::CompletionOutput::
  // routed_experts, [(P + R) x n_moe_layers x k] flattened); empty when not recorded.
  std::vector<int32_t> routed_experts;
  // False when the engine stopped it at the request's max_tokens below the
  // response length it may reach (a partial rollout round's budget).
  bool finished = true;
};

// The wire form of responses (all_gather_responses, and what disaggregated
// rollout ranks send the trainer): int32 words, decoded in the same order.
std::vector<int32_t> encode_responses(const std::vector<WireResponse>& rs);
std::vector<WireResponse> decode_responses(const std::vector<int32_t>& words);

// Every rank's responses to every rank: `mine` is what this rank produced
// (ranks of one rollout group hold the same responses: only its first rank,
// leader = true, contributes). Result sorted by (prompt, sample). Collective
// over `world`.
std::vector<WireResponse> all_gather_responses(comm::ProcessGroup& world, const std::vector<WireResponse>& mine,
                                               bool leader);

// Per-token values of b computed by dp shares (this rank filled the tokens of
// `mine`, the rest are zero) -> every rank holds all of them. Collective over dp
// (the shares are disjoint and together cover b).
void all_gather_token_values(comm::ProcessGroup& dp, const RolloutBatch& b, const std::vector<int64_t>& mine,
                             std::vector<double>& values);

// Per-sequence records (RolloutBatch::routed_experts) filled by dp shares (this rank filled those of
// `mine`) -> every rank holds all of them. Collective over dp (the shares are disjoint and cover b).
void all_gather_sequence_ints(comm::ProcessGroup& dp, const RolloutBatch& b, const std::vector<int64_t>& mine,
                              std::vector<std::vector<int32_t>>& records);

// Sums LossTotals over dp (the max stays a max): each field is already a share
// of the mini-batch value, so the sums are the mini-batch values.
void all_reduce_totals(comm::ProcessGroup& dp, LossTotals& t);

// Under pipeline parallelism the loss (and its totals) is computed on the
// last stage only: every stage of the pp group takes the last stage's values
// (raw 8-byte patterns, exact). No-op on a size-1 group.
void broadcast_from_last_stage(comm::ProcessGroup& pp, std::vector<double>& v);
void broadcast_from_last_stage(comm::ProcessGroup& pp, LossTotals& t);

// Element-wise sums over the group, in rank order (bit-identical on every rank).
void sum_doubles(comm::ProcessGroup& g, std::vector<double>& v);

// Every rank's copy of rank 0's doubles (rewards are scored on rank 0 only, so a
// reward program runs once per response).
void broadcast_doubles(comm::ProcessGroup& world, std::vector<double>& v);

}  // namespace kestrel::rl
