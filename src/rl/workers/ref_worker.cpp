#include "rl/workers/ref_worker.h"

namespace kestrel::rl {

RefWorker::RefWorker(std::unique_ptr<model::CausalLM> model, LogProbOptions opt, const RlParallel& parallel)
    : model_(std::move(model)), opt_(opt), parallel_(parallel) {
  KS_CHECK(model_ != nullptr, "RL: the reference worker needs a model");
}

void RefWorker::compute_log_probs(RolloutBatch& b) const {
  score_log_probs(*model_, b, opt_, *parallel_.dp, b.ref_logp);
}

}  // namespace kestrel::rl
