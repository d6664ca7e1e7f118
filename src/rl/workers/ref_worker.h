// The reference worker (verl's ref role): a frozen copy of the initial
// policy that scores reference log-probs for the KL loss or the in-reward KL.
#pragma once
#include <memory>

#include "model/transformer.h"
#include "rl/distributed.h"
#include "rl/rollout_batch.h"
#include "rl/workers/log_probs.h"

namespace kestrel::rl {

class RefWorker {
 public:
  // param_offload (ref.megatron.param_offload / ref.fsdp_config.param_offload):
  // the frozen weights wait in host memory except while they score.
  RefWorker(std::unique_ptr<model::CausalLM> model, LogProbOptions opt, const RlParallel& parallel,
            bool param_offload = false);

  const model::CausalLM& model() const { return *model_; }
  // b.ref_logp: the reference policy's log-probs of b's response tokens
  // (collective over dp).
  void compute_log_probs(RolloutBatch& b) const;

 private:
  std::unique_ptr<model::CausalLM> model_;
  LogProbOptions opt_;
  RlParallel parallel_;
  bool param_offload_ = false;
};

}  // namespace kestrel::rl
