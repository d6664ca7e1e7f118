// Per-token log-probabilities and entropies of next tokens, the quantity RL
// and `kestrel logprobs` are built on.
#pragma once
#include "model/batch.h"
#include "model/transformer.h"

namespace kestrel::model {

struct TokenScores {
  Tensor logprob;  // f32 [T]: log p(targets[t] | tokens up to t); 0 where targets[t] < 0
  Tensor entropy;  // f32 [T]: entropy of the next-token distribution at row t
};

// Inference only: nothing is kept for backward.
TokenScores score_tokens(const CausalLM& model, const PackedBatch& batch);

}  // namespace kestrel::model
