// The reward worker (verl's reward manager role): scores responses with the
// RewardManager (rule scorers, reward programs) or an in-process function,
// once, on world rank 0 (a reward program runs once per response), and hands
// every rank the scores.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "rl/reward_manager.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl {

class RewardWorker {
 public:
  // `rewards` must outlive the worker.
  RewardWorker(RewardManager& rewards, std::shared_ptr<comm::ProcessGroup> world);

  // An in-process reward function used instead of the RewardManager.
  void set_function(std::function<double(const RewardRequest&)> fn) { fn_ = std::move(fn); }

  // Scores `reqs` here (no communication): scores, extra (one per request)
  // and failures. Called by world rank 0 only; safe from several threads (the
  // background reward stream's workers and the trainer's validation).
  RewardBatchResult score_here(const std::vector<RewardRequest>& reqs) const;

  // Scores b's responses (reqs[i] describes response i) on world rank 0 and
  // broadcasts them: b.scores, and b.token_rewards with the outcome score on
  // each response's last token (verl's token_level_scores). Adds the failure
  // metrics to m. extra (may be null) gets each response's reward_extra_info
  // on world rank 0 (empty elsewhere). Collective over the world.
  void score(RolloutBatch& b, const std::vector<RewardRequest>& reqs, std::map<std::string, double>& m,
             std::vector<nlohmann::ordered_json>* extra = nullptr) const;
  // score()'s second half: `r` (world rank 0's result for b's responses,
  // ignored elsewhere) broadcast and written into b, m and extra. Collective over the world.
  void publish(RolloutBatch& b, RewardBatchResult r, std::map<std::string, double>& m,
               std::vector<nlohmann::ordered_json>* extra = nullptr) const;
  // Whether a response's score depends on the rest of its batch (the batch and
  // prime managers): then it cannot be scored alone as it finishes.
  bool batch_wise() const;
  // Parallel scorers (reward_model.num_workers; 1 for an in-process function).
  int64_t workers() const { return fn_ ? 1 : rewards_.workers(); }

  bool is_leader() const { return world_->rank() == 0; }

 private:
  RewardManager& rewards_;
  std::shared_ptr<comm::ProcessGroup> world_;
  std::function<double(const RewardRequest&)> fn_;
  mutable std::mutex mu_;  // score_here's with an in-process function
};

}  // namespace kestrel::rl
