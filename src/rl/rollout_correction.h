// verl's rollout correction (algorithm.rollout_correction.*,
// verl/trainer/ppo/rollout_corr_helper.py): the rollout engine samples with its
// own log-probs pi_rollout, the trainer scores the same tokens with pi_old; the
// log ratio log(pi_old / pi_rollout) per token gives
//   truncated importance-sampling weights (rollout_is = token | sequence,
//     capped at rollout_is_threshold, optionally normalised to mean 1 over the
//     batch: rollout_is_batch_normalize),
//   rejection sampling (rollout_rs: comma list of token_k{1,2,3},
//     seq_sum_k{1,2,3}, seq_mean_k{1,2,3}, seq_max_k{2,3}; a rejected token
//     leaves the response mask),
//   mismatch metrics (rollout_corr/kl, k3_kl, training_ppl, rollout_ppl,
//     log_ppl_diff, chi2_token, chi2_seq, ...).
// In bypass mode (bypass_mode) the rollout's log-probs are the old log-probs
// and the same math runs per micro-batch inside the loss on the current
// policy's log-probs (verl's compute_policy_loss_bypass_mode).
//
// All arrays are flat per response token over a Ragged layout ([N] tokens,
// [B] sequences), host doubles; the mask is verl's response_mask (1 = valid).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "rl/ragged.h"

namespace kestrel::rl {

enum class IsLevel { None, Token, Sequence };
enum class BypassLoss { PpoClip, Reinforce };

// One rejection criterion of rollout_rs with its threshold (verl's
// _parse_rollout_rs_thresholds): k1 options keep lower <= -log r <= upper in log
// space of the ratio bounds (lower, upper); k2/k3 keep stat <= upper.
struct RsOption {
  enum class Agg { Token, SeqSum, SeqMean, SeqMax };
  std::string name;  // "token_k1", "seq_mean_k3", ...
  Agg agg = Agg::Token;
  int k = 1;
  double lower = 0, upper = 0;  // ratio bounds (k1); upper only for k2/k3
};

struct RolloutCorrectionConfig {
  // actor_rollout_ref.rollout.calculate_log_probs: the batch carries the
  // rollout's log-probs (verl's rollout_log_probs); off = no correction at all.
  bool active = false;
  IsLevel rollout_is = IsLevel::None;
  double rollout_is_threshold = 2.0;
  bool rollout_is_batch_normalize = false;
  std::vector<RsOption> rollout_rs;  // empty = no rejection sampling
  bool bypass_mode = false;
  BypassLoss loss_type = BypassLoss::PpoClip;
  bool rejects() const { return !rollout_rs.empty(); }
};

// "token" | "sequence" | "" / "null" (off); an error naming the key otherwise.
Result<IsLevel> parse_rollout_is(const std::string& s);
// "ppo_clip" | "reinforce".
Result<BypassLoss> parse_bypass_loss(const std::string& s);
// rollout_rs (comma list, duplicates dropped, order kept) with
// rollout_rs_threshold (one spec for all options or one per option;
// "lower_upper" or "upper" for k1, where upper alone means lower = 1/upper).
// Empty options = no rejection; options without a threshold are an error.
Result<std::vector<RsOption>> parse_rollout_rs(const std::string& options, const std::string& thresholds);

struct RolloutCorrectionResult {
  std::vector<double> is_weights;  // [N] truncated (and normalised) weights, 0 on padding; empty = rollout_is off
  std::vector<double> mask;        // [N] the response mask with rejected tokens 0
  std::map<std::string, double> metrics;  // "rollout_corr/..." (verl's names)
};

// verl's compute_rollout_correction_and_rejection_mask: logp [N] the training
// policy's log-probs (old in decoupled mode, current in bypass mode),
// rollout_logp [N] the engine's, mask [N] (nullptr = every token valid).
// Sequence statistics and the batch normalisation run over the given batch: the
// caller passes the global batch (decoupled mode) or one micro-batch (bypass).
// A batch without a valid token returns the mask unchanged and no metrics.
RolloutCorrectionResult compute_rollout_correction(const RolloutCorrectionConfig& cfg, const Ragged& layout,
                                                   const std::vector<double>& logp,
                                                   const std::vector<double>& rollout_logp,
                                                   const std::vector<double>* mask);

// verl's compute_offpolicy_metrics with the "rollout_corr/" prefix
// (compute_rollout_corr_metrics_from_logprobs): training_ppl, training_log_ppl,
// kl, k3_kl, rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff,
// log_ppl_diff_max, log_ppl_diff_min, ppl_ratio, chi2_token, chi2_seq.
std::map<std::string, double> offpolicy_metrics(const Ragged& layout, const std::vector<double>& logp,
                                                const std::vector<double>& rollout_logp, const std::vector<double>& mask);

// The metric names compute_rollout_correction reports for cfg (all ranks and
// micro-batches report the same set, so their values can be summed by position).
std::vector<std::string> rollout_correction_metric_keys(const RolloutCorrectionConfig& cfg);

}  // namespace kestrel::rl
