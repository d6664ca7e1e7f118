#include "rl/workers/ref_worker.h"

namespace kestrel::rl {

RefWorker::RefWorker(std::unique_ptr<model::CausalLM> model, LogProbOptions opt, const RlParallel& parallel,
                     bool param_offload)
    : model_(std::move(model)), opt_(opt), parallel_(parallel), param_offload_(param_offload) {
  KS_CHECK(model_ != nullptr, "RL: the reference worker needs a model");
  if (param_offload_) model_->offload_to_host(true, false);
}

void RefWorker::compute_log_probs(RolloutBatch& b) const {
  // R3: the batch's routing (the rollout's, or the actor's R2 record when it made one, as verl's batch carries).
  if (model_->num_moe_layers() > 0 && opt_.router_replay == RouterReplay::R3 && !b.has_routing())
    KS_FAIL("actor_rollout_ref.ref.router_replay.mode=R3: the batch holds no routing (the rollout records it with "
            "actor_rollout_ref.rollout.enable_rollout_routing_replay=true)");
  score_log_probs(*model_, b, opt_, *parallel_.dp, b.ref_logp);
  if (param_offload_) model_->offload_to_host(true, false);  // loaded again by the next scoring's first forward
}

}  // namespace kestrel::rl
