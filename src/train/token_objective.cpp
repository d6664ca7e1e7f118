#include "train/token_objective.h"

#include "model/cp_batch.h"
#include "model/scoring.h"

namespace kestrel::train {

HeadLoss token_head_loss(const model::CausalLM& m, const model::PackedBatch& b, Tensor logits,
                         const TokenObjective& objective, bool need_entropy_grad) {
  const int64_t T = b.num_tokens;  // this rank's rows (a cp rank's share under context parallelism)
  HeadLoss h;
  ForwardBackwardResult& r = h.result;
  const Device dev = logits.device();
  Tensor logprob = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  Tensor entropy = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  Tensor lse = Tensor::empty({T}, DType::F32, MemCategory::Activations, dev);
  model::logprob_entropy_fwd(m, logits, b.targets, logprob, &entropy, lse);
  // The objective sees the full batch's rows: under context parallelism every
  // cp rank gathers them and runs the same objective (model/cp_batch.h).
  r.logprob = model::cp_full_rows(m, b, logprob);
  r.entropy = model::cp_full_rows(m, b, entropy);
  const int64_t Tf = r.logprob.numel();

  // The objective runs on the host: [T] copies of the scores in, of the gradients out.
  const std::vector<float> lp = r.logprob.to_host<float>(), ent = r.entropy.to_host<float>();
  std::vector<float> dlp(size_t(Tf), 0.f), dent(size_t(Tf), 0.f);
  TokenView view{lp.data(), ent.data(), Tf};
  r.loss = objective(view, dlp.data(), dent.data());
  // This rank's rows of the gradients (pad rows: none), where the logits are.
  const Tensor dlogprob = model::cp_rank_rows(b, Tensor::from_host(dlp, {Tf}, MemCategory::Activations, dev), 0.f);
  const Tensor dentropy = model::cp_rank_rows(b, Tensor::from_host(dent, {Tf}, MemCategory::Activations, dev), 0.f);

  bool any_entropy = false;
  if (need_entropy_grad)
    for (int64_t t = 0; t < Tf && !any_entropy; ++t) any_entropy = dent[size_t(t)] != 0.f;
  // f32 logits are overwritten by their gradient: the single [T, V] buffer
  // (under tensor parallelism, this rank's [T, V/tp] shard).
  h.dlogits = logits.dtype() == DType::F32 ? logits
                                           : Tensor::empty(logits.shape(), DType::F32, MemCategory::Activations, dev);
  model::logprob_entropy_bwd(m, logits, b.targets, lse, dlogprob, any_entropy ? &dentropy : nullptr, &entropy,
                             h.dlogits);
  return h;
}

ForwardBackwardResult forward_backward(model::CausalLM& m, const model::PackedBatch& b, const TokenObjective& objective,
                                       bool need_entropy_grad) {
  model::Activations acts;
  // [T, V]; alive through the backward (the memory model counts it there).
  const Tensor logits = m.forward(b, acts);
  HeadLoss h = token_head_loss(m, b, logits, objective, need_entropy_grad);
  m.backward(b, acts, h.dlogits);
  return std::move(h.result);
}

TokenObjective cross_entropy_objective(const std::vector<float>& weights) {
  return [weights](const TokenView& v, float* dlogprob, float*) {
    KS_CHECK(int64_t(weights.size()) == v.num_tokens, "cross-entropy weights: ", weights.size(), " for ",
             v.num_tokens, " tokens");
    double loss = 0;
    for (int64_t t = 0; t < v.num_tokens; ++t) {
      loss -= double(weights[size_t(t)]) * v.logprob[t];
      dlogprob[t] = -weights[size_t(t)];
    }
    return loss;
  };
}

}  // namespace kestrel::train
