// Next-token sampling (vLLM's Sampler, one row at a time).
//
// Order: temperature 0 (or < 1e-5) is greedy argmax; otherwise logits are
// divided by the temperature, then min-p, top-k and top-p mask the
// distribution in that order (vLLM applies min-p as a logits processor
// before its top-k/top-p sampler), each later filter seeing the survivors of
// the earlier ones renormalised. The draw is an inverse CDF over the
// surviving tokens in vocabulary order with ONE uniform from Philox keyed by
// (seed, sample index, position): a token depends only on its own logits and
// that triple, never on batch composition, chunking or preemption.
//
// Logprobs reported for RL are those of the *unmodified* distribution
// (temperature 1, no filtering): log_softmax(logits)[token]. That is what the
// trainer recomputes (verl's old_log_prob), so the two agree to rounding;
// the processed distribution's logprob would differ by the temperature and
// the filters' renormalisation.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "rollout/engine.h"

namespace kestrel::rollout {

// The uniform in [0, 1) that draws token `position` of sample `sample`.
double sampling_uniform(uint64_t seed, uint64_t sample, int64_t position);

struct SamplerScratch {
  std::vector<float> w;        // unnormalised weights exp((z - max) / T), 0 where filtered
  std::vector<int32_t> order;  // indices, for the sorts of top-k / top-p
  std::vector<double> block_sums;  // the inverse CDF's per-block weight sums
};

// logits: [V] f32 (one row). Returns the sampled token id.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t sample, int64_t position,
                     SamplerScratch& scratch);

// The k most likely tokens with their logprobs (logits[i] - lse), by
// descending logprob, ties by token id.
std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t V, float lse, int64_t k);

}  // namespace kestrel::rollout
