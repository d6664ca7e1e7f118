// The critic worker (verl's CriticWorker): rl::Critic, the value model with
// its own training engine, trained over the driver's dp group. Its options
// are rl::CriticOptions (rl/critic.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rl/critic.h"
#include "rl/distributed.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl {

class CriticWorker {
 public:
  // Under mpirun (world > 1) the critic is rebuilt over `parallel` (it trains
  // over the actor's dp group) and must have the actor's tp size `actor_tp`.
  CriticWorker(std::unique_ptr<Critic> critic, const RlParallel& parallel, bool balance_batch, int actor_tp);

  Critic& critic() { return *critic_; }
  const Critic& critic() const { return *critic_; }

  // [N] values per response token of b (every rank all of them).
  std::vector<double> values(const RolloutBatch& b) const { return critic_->values(b); }
  // The clipped value-loss update toward b.returns; `values`: values(b)
  // before it. Metrics critic/{vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr}.
  std::map<std::string, double> update(const RolloutBatch& b, const std::vector<double>& values, int64_t step) {
    return critic_->update(b, b.returns, values, step);
  }

  Status save(const std::string& dir) const { return critic_->save(dir); }
  Status load(const std::string& dir) { return critic_->load(dir); }

 private:
  std::unique_ptr<Critic> critic_;
};

}  // namespace kestrel::rl
