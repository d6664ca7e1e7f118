// Advantage estimators with verl's semantics (verl/trainer/ppo/core_algos.py):
// GRPO, RLOO, REINFORCE++, REINFORCE++-baseline and GAE. All arithmetic in
// double; outputs are flat per-token arrays over a Ragged layout.
#pragma once
#include <string>
#include <vector>

#include "rl/ragged.h"

namespace kestrel::rl {

enum class AdvEstimator { GRPO, RLOO, ReinforcePP, ReinforcePPBaseline, GAE };
Result<AdvEstimator> parse_adv_estimator(const std::string& name);  // verl's names
const char* adv_estimator_name(AdvEstimator e);

struct AdvantageInput {
  const Ragged* layout = nullptr;
  const std::vector<double>* token_rewards = nullptr;  // [tokens]; outcome score on the last valid token
  const std::vector<double>* mask = nullptr;           // [tokens] 1 = response token (nullptr: all ones)
  const std::vector<int64_t>* group = nullptr;         // [seqs] prompt id shared by its n samples
  const std::vector<double>* values = nullptr;         // [tokens] critic values (GAE only)
  double gamma = 1.0;
  double lam = 1.0;
  bool norm_adv_by_std_in_grpo = true;
};

struct AdvantageOutput {
  std::vector<double> advantages;  // [tokens]
  std::vector<double> returns;     // [tokens]
};

AdvantageOutput compute_advantages(AdvEstimator est, const AdvantageInput& in);

// Masked statistics as verl's torch_functional: mean = sum(x*m)/(sum(m)+1e-8),
// unbiased variance, whiten = (x-mean)*rsqrt(var+1e-8).
double masked_mean(const std::vector<double>& x, const std::vector<double>& m);
double masked_var(const std::vector<double>& x, const std::vector<double>& m);
std::vector<double> masked_whiten(const std::vector<double>& x, const std::vector<double>& m, bool shift_mean = true);

}  // namespace kestrel::rl
