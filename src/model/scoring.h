// Per-token log-probabilities and entropies of next tokens, the quantity RL
// and `kestrel logprobs` are built on.
#pragma once
#include "model/batch.h"
#include "model/transformer.h"

namespace kestrel::model {

// Rows are the full batch's: a context-parallel rank's share of a batch
// (PackedBatch::cp) scores its rows and gathers every cp rank's (collective
// over the cp group), so every rank gets the full [T].
struct TokenScores {
  Tensor logprob;  // f32 [T]: log p(targets[t] | tokens up to t); 0 where targets[t] < 0
  Tensor entropy;  // f32 [T]: entropy of the next-token distribution at row t
};

// Inference only: nothing is kept for backward. Under tp it is collective over
// the tp group and every rank gets the full [T] results.
TokenScores score_tokens(const CausalLM& model, const PackedBatch& batch);
// The same scores of logits the caller computed (a pipeline's last stage).
TokenScores score_logits(const CausalLM& model, const PackedBatch& batch, const Tensor& logits);

// The logprob/entropy of model.forward()'s logits for any layout: at tp = 1
// exactly ops::logprob_entropy_fwd/bwd; under tp the vocab-parallel versions
// (parallel/vocab_loss.h) over this rank's [T, V/tp] logits. lse: f32 [T],
// kept for the backward; entropy is needed by the backward when dentropy is
// given. Trainers call these instead of ops:: so they work under tp. A padded
// vocabulary's columns (past config().vocab_size) are left out of the
// reductions and get zero dlogits, so they never win.
void logprob_entropy_fwd(const CausalLM& model, const Tensor& logits, const Tensor& targets, Tensor& logprob,
                         Tensor* entropy, Tensor& lse);
void logprob_entropy_bwd(const CausalLM& model, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                         const Tensor& dlogprob, const Tensor* dentropy, const Tensor* entropy, Tensor& dlogits);

}  // namespace kestrel::model
