#include "rl/workers/critic_worker.h"

namespace kestrel::rl {

CriticWorker::CriticWorker(std::unique_ptr<Critic> critic, const RlParallel& parallel, bool balance_batch,
                           int actor_tp)
    : critic_(std::move(critic)) {
  KS_CHECK(critic_ != nullptr, "RL: the critic worker needs a critic");
  if (parallel.world->size() > 1) {
    KS_CHECK(critic_->model().tp().size() == actor_tp, "RL: the critic's tensor-parallel size ",
             critic_->model().tp().size(), " must equal the actor's ", actor_tp,
             " (critic.megatron.tensor_model_parallel_size)");
    critic_->use_parallel(parallel, balance_batch);  // the critic trains over the actor's dp group
  }
}

}  // namespace kestrel::rl
