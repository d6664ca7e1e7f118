// A rollout batch of full-length sequences for the memory plan's measured
// tests (tests/rl/memory_plan_moe_test.cpp, tests/mpi/moe_tp_memory_test.cpp):
// `prompts` x n sequences, a prompt's samples in a row, every prompt and
// response at the batching's full length, tokens inside the vocabulary.
#pragma once
#include <cstdint>
#include <vector>

#include "rl/memory_plan.h"
#include "rl/rollout_batch.h"

namespace kestrel::rl::testing {

inline RolloutBatch full_length_batch(const PlanBatching& b, int64_t prompts, int64_t vocab) {
  RolloutBatch r;
  const int64_t span = vocab - 3;
  for (int64_t g = 0; g < prompts; ++g)
    for (int64_t k = 0; k < b.n; ++k) {
      std::vector<int32_t> p(size_t(b.prompt_len)), resp(size_t(b.response_len));
      for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((g * 31 + int64_t(i)) % span + 3);
      for (size_t i = 0; i < resp.size(); ++i) resp[i] = int32_t((g * 7 + k * 13 + int64_t(i)) % span + 3);
      r.prompts.push_back(p);
      r.responses.push_back(resp);
      r.group.push_back(g);
    }
  r.finalize_layout();
  return r;
}

}  // namespace kestrel::rl::testing
