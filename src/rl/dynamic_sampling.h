// DAPO's dynamic sampling (verl recipe/dapo/dapo_ray_trainer.py, fit()):
// with algorithm.filter_groups.enable each step generates batches of
// data.gen_batch_size prompts, scores them, and keeps only the groups whose
// filter metric varies over their rollout.n responses (np.std > 0, or a group
// of one), until data.train_batch_size groups are kept; the kept batch is cut
// to train_batch_size groups. After max_num_gen_batches generation batches
// (<= 0: no bound) without enough groups the run stops with verl's message.
// The pieces here are free of the model, for unit tests; the loop is
// RlTrainer::generate_filtered (dynamic_sampling.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl {

struct FilterGroupsOptions {
  bool enable = false;
  std::string metric;               // acc, score, seq_reward, seq_final_reward, or a reward_extra_info key
  int64_t max_num_gen_batches = 0;  // <= 0: unbounded
};

// The metric per response, as verl's non_tensor_batch[metric] holds it:
// seq_reward = the sequence's token-level scores summed (its score),
// seq_final_reward = its token-level rewards summed (after the in-reward KL),
// anything else = that reward_extra_info key (a number or a bool). An error
// names the key and what the responses have when a value is missing or not a number.
Result<std::vector<double>> filter_metric_values(const std::string& metric, const RolloutBatch& b,
                                                 const std::vector<nlohmann::ordered_json>& extra);

// The groups of b (b.group ids, in order of first appearance) whose metric
// has population std > 0, or that have a single response.
std::vector<int64_t> groups_with_spread(const std::vector<int64_t>& group, const std::vector<double>& metric);

// The responses of b whose group is in `keep` (in b's order), their groups
// renumbered first_group, first_group + 1, ... in order of appearance; the
// per-token arrays and the layout follow.
RolloutBatch select_groups(const RolloutBatch& b, const std::vector<int64_t>& keep, int64_t first_group);
// Appends b's responses to acc (b's groups must already be numbered after acc's).
void append_batch(RolloutBatch& acc, const RolloutBatch& b);

// Collects the kept groups of generation batches.
class DynamicSampler {
 public:
  DynamicSampler(FilterGroupsOptions opt, int64_t train_batch_size);
  // One scored generation batch and its metric per response. Returns true
  // once train_batch_size groups are kept; an error (verl's message, with the
  // config keys) when max_num_gen_batches batches did not give enough.
  Result<bool> add(const RolloutBatch& b, const std::vector<double>& metric);
  // The kept batch, cut to train_batch_size groups (verl's batch[:train_batch_size * n]).
  RolloutBatch take();
  int64_t num_gen_batches() const { return num_gen_batches_; }
  int64_t num_prompt_in_batch() const { return num_prompt_in_batch_; }

 private:
  FilterGroupsOptions opt_;
  int64_t train_batch_size_;
  int64_t num_gen_batches_ = 0, num_prompt_in_batch_ = 0;
  RolloutBatch kept_;
};

}  // namespace kestrel::rl
