// One forward + backward of the policy on a packed micro-batch, driven by a
// per-token objective over next-token logprobs and entropies. SFT (masked
// cross-entropy) and every RL loss are such objectives, so both trainers share
// this path and its memory profile (one [T, V] buffer, reused for dlogits).
#pragma once
#include <functional>

#include "model/transformer.h"

namespace kestrel::train {

struct TokenView {
  const float* logprob = nullptr;  // [T] log p(target_t); 0 where target < 0
  const float* entropy = nullptr;  // [T]
  int64_t num_tokens = 0;
};

// Fills dlogprob/dentropy ([T], zeroed on entry) and returns the objective's value.
using TokenObjective = std::function<double(const TokenView& tokens, float* dlogprob, float* dentropy)>;

struct ForwardBackwardResult {
  double loss = 0;
  Tensor logprob;  // f32 [T], as the objective saw them
  Tensor entropy;  // f32 [T]
};

// The objective on logits the caller's forward produced ([T, V], this rank's
// [T, V/tp] under tp): the loss, and the f32 gradient of the logits the
// backward takes (written over f32 logits: one [T, V] buffer). The plain
// loop and a pipeline's last stage share it.
struct HeadLoss {
  ForwardBackwardResult result;
  Tensor dlogits;
};
HeadLoss token_head_loss(const model::CausalLM& model, const model::PackedBatch& batch, Tensor logits,
                         const TokenObjective& objective, bool need_entropy_grad);

// Accumulates parameter gradients (+=) into model.params()[i].grad.
ForwardBackwardResult forward_backward(model::CausalLM& model, const model::PackedBatch& batch,
                                       const TokenObjective& objective, bool need_entropy_grad = true);

// Masked next-token cross-entropy as an objective: weight[t] per token
// (e.g. 1/num_loss_tokens on response tokens, 0 on prompts).
TokenObjective cross_entropy_objective(const std::vector<float>& weights);

}  // namespace kestrel::train
