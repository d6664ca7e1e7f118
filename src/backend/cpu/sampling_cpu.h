// The rollout sampler's passes over one row of logits (rollout/sampler.cpp),
// in vector lanes at the machine's width (sampling_cpu_isa.inc, isa.h). A
// row of the vocabulary is 10^4..10^5 floats drawn from for every sampled
// token, and glibc's scalar expf does not vectorise: the weight pass was ~4%
// of a rollout's cycles (docs/benchmarks.md, issue 21).
//
// Both are lane-wise exact images of a scalar loop (exp_f32 of
// kernel_util.h, the same selects), so every ISA level returns the same bits
// and a token never depends on the machine's vector width.
#pragma once
#include <cstdint>

namespace kestrel::cpu {

// The index of the first maximum of z[0, V) (V >= 1); NaN never compares
// greater; 0 when no element exceeds -inf.
int32_t sampling_argmax(const float* z, int64_t V);

// w[i] = e = exp_f32((z[i] - mx) * inv_t) where e >= min_w and e > 0, else 0
// (a -inf or NaN logit weighs 0). Returns how many w[i] > 0.
int64_t sampling_weights(const float* z, int64_t V, float mx, float inv_t, float min_w, float* w);

}  // namespace kestrel::cpu
