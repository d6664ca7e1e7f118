#include "model/scoring.h"

#include "ops/loss.h"

namespace kestrel::model {

TokenScores score_tokens(const CausalLM& model, const PackedBatch& batch) {
  Tensor logits = model.forward_inference(batch);  // [T, V]
  TokenScores s;
  const int64_t T = batch.num_tokens;
  s.logprob = Tensor::empty({T}, DType::F32, MemCategory::Activations);
  s.entropy = Tensor::empty({T}, DType::F32, MemCategory::Activations);
  Tensor lse = Tensor::empty({T}, DType::F32, MemCategory::Activations);
  ops::logprob_entropy_fwd(logits, batch.targets, s.logprob, &s.entropy, lse);
  return s;
}

}  // namespace kestrel::model
