#include "rl/workers/reward_worker.h"

#include "rl/distributed.h"

namespace kestrel::rl {

RewardWorker::RewardWorker(RewardManager& rewards, std::shared_ptr<comm::ProcessGroup> world)
    : rewards_(rewards), world_(std::move(world)) {}

RewardBatchResult RewardWorker::score_here(const std::vector<RewardRequest>& reqs) const {
  if (!fn_) return rewards_.score(reqs);  // thread-safe itself (its programs are a pool)
  std::lock_guard<std::mutex> lock(mu_);
  RewardBatchResult r;
  for (const auto& q : reqs) r.scores.push_back(fn_(q));
  r.extra.resize(reqs.size());
  return r;
}

void RewardWorker::score(RolloutBatch& b, const std::vector<RewardRequest>& reqs, std::map<std::string, double>& m,
                         std::vector<nlohmann::ordered_json>* extra) const {
  KS_CHECK(int64_t(reqs.size()) == b.size(), "reward: ", reqs.size(), " requests for ", b.size(), " responses");
  RewardBatchResult r;
  if (is_leader()) r = score_here(reqs);
  publish(b, std::move(r), m, extra);
}

bool RewardWorker::batch_wise() const { return !fn_ && rewards_.batch_wise(); }

void RewardWorker::publish(RolloutBatch& b, RewardBatchResult r, std::map<std::string, double>& m,
                           std::vector<nlohmann::ordered_json>* extra) const {
  KS_CHECK(!is_leader() || int64_t(r.scores.size()) == b.size(), "reward: ", r.scores.size(), " scores for ",
           b.size(), " responses");
  broadcast_doubles(*world_, r.scores);
  b.scores = r.scores;
  b.token_rewards.assign(size_t(b.layout.num_tokens()), 0.0);
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.layout.length(i) > 0) b.token_rewards[size_t(b.layout.end(i) - 1)] = b.scores[size_t(i)];
  for (const auto& [k, v] : RewardManager::metrics(r.failures)) m[k] = v;
  if (extra) *extra = std::move(r.extra);
}

}  // namespace kestrel::rl
