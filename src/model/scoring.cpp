#include "model/scoring.h"

#include "model/cp_batch.h"

#include "parallel/vocab_loss.h"

namespace kestrel::model {

void logprob_entropy_fwd(const CausalLM& m, const Tensor& logits, const Tensor& targets, Tensor& logprob,
                         Tensor* entropy, Tensor& lse) {
  parallel::vocab_logprob_entropy_fwd(m.tp(), logits, targets, m.vocab_start(), logprob, entropy, lse,
                                      m.config().vocab_size);
}

void logprob_entropy_bwd(const CausalLM& m, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                         const Tensor& dlogprob, const Tensor* dentropy, const Tensor* entropy, Tensor& dlogits) {
  parallel::vocab_logprob_entropy_bwd(m.tp(), logits, targets, m.vocab_start(), lse, dlogprob, dentropy, entropy,
                                      dlogits, m.config().vocab_size);
}

TokenScores score_tokens(const CausalLM& model, const PackedBatch& batch) {
  return score_logits(model, batch, model.forward_inference(batch));  // [T, V] ([T, V/tp] under tp)
}

TokenScores score_logits(const CausalLM& model, const PackedBatch& batch, const Tensor& logits) {
  TokenScores s;
  const int64_t T = batch.num_tokens;
  const Device dev = logits.device();
  s.logprob = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  s.entropy = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  Tensor lse = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  logprob_entropy_fwd(model, logits, batch.targets, s.logprob, &s.entropy, lse);
  s.logprob = cp_full_rows(model, batch, s.logprob);  // the full batch's rows under context parallelism
  s.entropy = cp_full_rows(model, batch, s.entropy);
  return s;
}

}  // namespace kestrel::model
