// One RL step's batch of (prompt, response) pairs and the pieces of the actor
// update that depend only on its layout: how sequences are packed and which
// packed rows carry response tokens, how a mini-batch is split into
// micro-batches, the global loss denominators, and the per-micro-batch
// objective. Kept free of the model's code and the engine so the
// split-invariance of the loss is unit-testable.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/batch.h"
#include "rl/policy_loss.h"
#include "rl/ragged.h"
#include "rl/rollout_correction.h"
#include "train/token_objective.h"

namespace kestrel::rl {

// MoE router replay (verl's actor_rollout_ref.{actor,ref}.router_replay.mode): Disabled routes freely; R2
// replays the routing the actor's old-log-prob forward recorded; R3 the rollout's.
enum class RouterReplay { Disabled, R2, R3 };
// "disabled" | "R2" | "R3"; an error naming `key` otherwise.
Result<RouterReplay> parse_router_replay(const std::string& mode, const std::string& key);
const char* router_replay_name(RouterReplay r);

struct RolloutBatch {
  std::vector<std::vector<int32_t>> prompts;    // [B] prompt ids (chat template applied)
  std::vector<std::vector<int32_t>> responses;  // [B] generated ids, EOS included when generated
  std::vector<int64_t> group;                   // [B] prompt index within the step (GRPO group)
  std::vector<double> scores;                   // [B] outcome reward of each response
  // Flat per-response-token arrays over `layout` (response tokens only).
  Ragged layout;
  std::vector<double> rollout_logp;  // [N] the engine's log p of each sampled token (empty = not recorded)
  std::vector<double> old_logp;  // [N] empty = on-policy (old = current, detached)
  std::vector<double> ref_logp;  // [N] empty = no reference model
  std::vector<double> advantages, returns, token_rewards;  // [N]
  // Rollout correction in decoupled mode (rl/rollout_correction.h, verl's
  // response_mask and rollout_is_weights): [N] 1 = trained, 0 = rejected by
  // rollout_rs (empty = every token); [N] truncated IS weights (empty = none).
  std::vector<double> response_mask;
  std::vector<double> rollout_is_weights;
  // The actor weight version (train::TrainingEngine::weight_version) that
  // generated the responses; -1 = unknown (built by hand). The actor's old
  // log-probs must be recomputed when it differs from the actor's version.
  int64_t weight_version = -1;
  // MoE routing of each sequence (router replay): per sequence i, the expert each of its P + R prompt and
  // response tokens used in each MoE layer (model::moe_layer_ordinal) and top-k slot, i32
  // [(P + R) x routed_layers x routed_topk] flattened row-major (rollout::CompletionOutput::routed_experts's
  // layout; a row of -1s is routed by the router). R3: the rollout's record; R2: the actor's old-log-prob
  // forward's. Empty = none recorded.
  std::vector<std::vector<int32_t>> routed_experts;
  int64_t routed_layers = 0, routed_topk = 0;
  RouterReplay routing_source = RouterReplay::Disabled;  // R3: the rollout recorded it; R2: the old-log-prob pass

  int64_t size() const { return int64_t(responses.size()); }
  // response_mask at token t (1 when no mask is set).
  double mask_at(int64_t t) const { return response_mask.empty() ? 1.0 : response_mask[size_t(t)]; }
  bool has_routing() const { return !routed_experts.empty(); }
  // Checks routed_experts against the sequences and the sizes; `what` names the record in messages.
  void check_routing(const std::string& what) const;
  // Builds layout from the responses; call after filling prompts/responses.
  void finalize_layout();
  // prompt + response of sequence i, as the actor scores it.
  std::vector<int32_t> sequence(int64_t i) const;
};

// Packed rows of the response tokens of `seqs` (in that order, packed
// back to back): response token j of a sequence with prompt length P is
// predicted by row P - 1 + j of that sequence. Returns [sum of response lengths].
std::vector<int64_t> response_rows(const RolloutBatch& b, const std::vector<int64_t>& seqs);

// Sequences `seqs` packed for the actor, the reference or the critic, and the
// packed row whose output scores each response token (in `seqs` order).
// With share_prompts the samples of one prompt (equal prompt ids) in `seqs`
// share one copy of it: the prompt minus its last token is packed once, and
// each sample continues it (model::PackedBatch::prefix_of) with its last
// prompt token and its response, so response token j is scored by the
// sample's row j. Every response token sees the same context as in the
// unshared packing (response_rows), so log-probs, values and gradients are
// the same up to float summation order; the prompt's rows are computed once
// instead of once per sample. Prompts appear in order of first use.
//
// With replay_routing the batch replays b.routed_experts (PackedBatch::routed_experts, i32
// [T, routed_layers, routed_topk]): each packed row takes its token's routing (a shared prompt row the first
// of its samples'); b must hold a routing (an error otherwise).
struct PackedSequences {
  model::PackedBatch batch;
  std::vector<int64_t> rows;  // [response tokens of seqs]
};
PackedSequences pack_rollout_sequences(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts,
                                       bool replay_routing = false);

// The packed row of every token of `seqs` (each sequence's P + R prompt and response tokens, sequences in
// `seqs` order) in pack_rollout_sequences's layout: [sum over seqs of P + R]. With share_prompts a prompt's
// tokens but its last map to the rows of its one shared copy.
std::vector<int64_t> sequence_token_rows(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts);

// A routing recorded over a packed batch (PackedBatch::record_routing, host i32 [T, L, k]) back to
// per-sequence records: routed[i] for each i of `seqs` (resized to b's size when smaller), [(P + R) x L x k].
void unpack_routing(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts,
                    const std::vector<int32_t>& packed, int64_t L, int64_t k,
                    std::vector<std::vector<int32_t>>& routed);

// Denominators of one mini-batch (verl's global_batch_info): every
// micro-batch's loss is a share of the mini-batch's loss, so the sum over
// micro-batches, and hence the gradient, does not depend on the split. Tokens
// and sequences count under b.response_mask (rejected tokens, and sequences
// with no token left, are not counted).
AggScope mini_batch_scope(const RolloutBatch& b, const std::vector<int64_t>& seqs, AggMode mode,
                          double scale_factor);

// The sequences of `seqs` whose loss has a gradient. Under the vanilla PPO
// loss a response whose every advantage is 0 (a GRPO group with equal scores)
// contributes exactly zero gradient when neither the entropy bonus nor the KL
// loss is on, so the actor update skips its forward and backward; the
// mini-batch denominators (mini_batch_scope) still count it, so the update is
// the one the whole mini-batch gives, at the cost of the rest. (A MoE model whose router losses,
// expert-bias update or capacity dropping see every token, or any MoE model under dp > 1, trains all of
// them: ActorWorker::update.)
std::vector<int64_t> sequences_with_gradient(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                             const PolicyLossConfig& cfg);

// The order of the n sequences in PPO epoch `epoch` of global step `step`
// with shuffling on: Fisher-Yates from Philox(seed, step * 1024 + epoch). The
// actor and the critic draw the same order, so both see the same mini-batches
// (as verl's two workers do).
std::vector<int64_t> ppo_epoch_order(int64_t n, uint64_t seed, int64_t step, int64_t epoch);

// Micro-batches of a mini-batch, in order: by token budget (max_tokens > 0,
// verl's use_dynamic_bsz + ppo_max_token_len_per_gpu) or max_seqs sequences
// each. With share_prompts the budget counts packed tokens as
// pack_rollout_sequences lays them out (a prompt once per micro-batch).
std::vector<std::vector<int64_t>> split_mini_batch(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                                   int64_t max_tokens, int64_t max_seqs, bool share_prompts = false);

// Sums of the policy-loss outputs over the micro-batches of one mini-batch.
struct LossTotals {
  double loss = 0, pg_loss = 0, kl_loss = 0;  // agg'd with the mini-batch scope: sums are the mini-batch values
  // Token-weighted sums; divided by tokens for the mini-batch value.
  double clipfrac_tokens = 0, clipfrac_lower_tokens = 0, ppo_kl_tokens = 0, entropy_tokens = 0, tokens = 0;
  // |p_actor - p_rollout| of the sampled tokens (when b.rollout_logp is set):
  // the sampler and the trainer must see one policy; a gap means off-policy data.
  double rollout_diff_sum = 0, rollout_diff_max = 0, rollout_diff_tokens = 0;
  // Rollout-correction metrics of each micro-batch summed (verl averages them
  // over micro-batches): keys preset by the caller, identical on every rank.
  std::map<std::string, double> corr;
  double corr_batches = 0;
  std::map<std::string, double> metrics() const;  // actor/pg_loss, actor/pg_clipfrac, ...
};

// The objective of one micro-batch `seqs` of `b`, packed with its response
// tokens at `rows` (pack_rollout_sequences, or response_rows): the vanilla PPO
// loss on its response tokens with `cfg` (whose agg scope carries the
// mini-batch denominators); adds its outputs to *totals.
// corr (active, b.rollout_logp set): decoupled mode weights the loss by
// b.rollout_is_weights under b.response_mask and adds verl's actor-side
// rollout_corr/ off-policy metrics of the current policy; bypass mode
// (old = rollout log-probs) computes IS weights, rejection and metrics of this
// micro-batch from the current log-probs (verl's compute_policy_loss_bypass_mode):
// ppo_clip masks the rejected tokens out of the clipped loss, reinforce also
// weights -A * logp by the IS weights.
train::TokenObjective micro_batch_objective(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                            std::vector<int64_t> rows, const PolicyLossConfig& cfg,
                                            LossTotals* totals, const RolloutCorrectionConfig* corr = nullptr);

// min/mean/max of x into m["<prefix>/mean"] etc.; nothing when x is empty.
void add_stats(std::map<std::string, double>& m, const std::string& prefix, const std::vector<double>& x);

}  // namespace kestrel::rl
