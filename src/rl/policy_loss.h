// The actor objective with verl's semantics (megatron_actor.py, core_algos.py):
//   loss = agg(pg_token_loss) - entropy_coeff * agg(H) + kl_loss_coef * agg(kl(logp, ref))
// returned with its per-token gradients d loss / d logp and d loss / d H, which
// the model's backward turns into parameter gradients.
#pragma once
#include <string>
#include <vector>

#include "rl/ragged.h"

namespace kestrel::rl {

enum class AggMode { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm };
Result<AggMode> parse_agg_mode(const std::string& s);

// Denominators over the whole mini-batch (all micro-batches and DP ranks), so
// the loss does not depend on how a batch is split. 0 = use the local value.
struct AggScope {
  AggMode mode = AggMode::TokenMean;
  double global_tokens = 0;  // token-mean
  double global_seqs = 0;    // seq-mean-*
  double scale_factor = 0;   // seq-mean-token-sum-norm (verl: the max response length)
};

// Per-token weights w such that agg(L) = sum_t w_t L_t (every mode is linear in L).
std::vector<double> agg_weights(const Ragged& layout, const std::vector<double>& mask, const AggScope& scope);

// KL estimators on delta = logp - ref_logp: k1/kl, abs, k2/mse, k3/low_var_kl;
// a trailing '+' keeps the value but takes k2's gradient (straight-through).
struct KlEstimate {
  double value = 0;
  double dvalue_dlogp = 0;
};
Result<int> parse_kl_type(const std::string& s);  // validated id, for config checks
KlEstimate kl_estimate(const std::string& type, double logp, double ref_logp);

struct PolicyLossConfig {
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;  // dual-clip bound for negative advantages, > 1
  double entropy_coeff = 0.0;
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  std::string kl_loss_type = "low_var_kl";
  // verl's compute_policy_loss_reinforce (rollout_correction.bypass_mode with
  // loss_type=reinforce): pg_t = -A_t * logp_t * w_t, no ratio, no clipping
  // (pg_clipfrac{,_lower} stay 0); old_logp is the rollout's, for ppo_kl only.
  bool reinforce = false;
  AggScope agg;
};

struct PolicyLossInput {
  const Ragged* layout = nullptr;
  const std::vector<double>* logp = nullptr;      // [tokens] current policy
  const std::vector<double>* old_logp = nullptr;  // [tokens] behaviour policy (== logp when on-policy)
  const std::vector<double>* advantages = nullptr;
  const std::vector<double>* mask = nullptr;      // nullptr: all ones
  const std::vector<double>* entropy = nullptr;   // needed when entropy_coeff != 0
  const std::vector<double>* ref_logp = nullptr;  // needed when use_kl_loss
  // Rollout correction (rl/rollout_correction.h): [tokens] truncated IS weights
  // multiplying each token's policy-gradient loss (verl's pg_losses *
  // rollout_is_weights; nullptr = none), and the mask of the policy-gradient
  // term alone (bypass mode's rejection mask, which verl applies inside the
  // policy loss while entropy and KL keep the response mask; nullptr = mask).
  const std::vector<double>* is_weights = nullptr;
  const std::vector<double>* pg_mask = nullptr;
};

struct PolicyLossOutput {
  double loss = 0;
  double pg_loss = 0, pg_clipfrac = 0, pg_clipfrac_lower = 0, ppo_kl = 0;
  double entropy = 0;  // agg(H)
  double kl_loss = 0;  // agg(kl)
  std::vector<double> dloss_dlogp;     // [tokens]
  std::vector<double> dloss_dentropy;  // [tokens], zeros when entropy_coeff == 0
};

PolicyLossOutput policy_loss_vanilla(const PolicyLossConfig& cfg, const PolicyLossInput& in);

// verl's compute_value_loss: 0.5 * agg(max((v-G)^2, (clip(v, v_old±c)-G)^2)).
struct ValueLossOutput {
  double loss = 0, clipfrac = 0;
  std::vector<double> dloss_dvalue;
};
ValueLossOutput value_loss(const Ragged& layout, const std::vector<double>& values, const std::vector<double>& old_values,
                           const std::vector<double>& returns, const std::vector<double>* mask, double cliprange_value,
                           const AggScope& agg);

// KL-in-reward controllers (Ziegler et al.): fixed, or adaptive toward target_kl.
struct KlController {
  std::string type = "fixed";
  double value = 0.001;
  double target_kl = 0.1;
  int64_t horizon = 10000;
  void update(double current_kl, int64_t n_steps);
};

}  // namespace kestrel::rl
