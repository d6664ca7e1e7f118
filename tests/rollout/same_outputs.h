// Two rollouts' outputs compared request by request, sample by sample: the
// same request ids, token ids and finish reasons, and log-probs within
// logprob_tol (0: bit for bit); and the run that makes them.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rollout/engine.h"

namespace kestrel::rollout::testing {

struct RunOut {
  std::vector<RequestOutput> outs;
  EngineStats stats;
};

// A fresh engine on m runs every prompt (params cycled; ids "r<i>" unless
// given) to completion and must give back every KV block.
inline RunOut run(const model::CausalLM& m, const EngineConfig& cfg, const std::vector<std::vector<int32_t>>& prompts,
                  const std::vector<SamplingParams>& params, const std::vector<std::string>& ids = {}) {
  RunOut r;
  auto e = Engine::create(m, cfg);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return r;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = ids.empty() ? "r" + std::to_string(i) : ids[i];
    const Status st = (*e)->add_request(id, prompts[i], params[i % params.size()]);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  r.outs = (*e)->run_to_completion();
  r.stats = (*e)->stats();
  EXPECT_EQ(r.stats.free_blocks, r.stats.num_blocks - 1) << "blocks leaked";
  return r;
}

inline void expect_same_outputs(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b,
                                double logprob_tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].request_id, b[i].request_id) << what;
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << what;
    for (size_t k = 0; k < a[i].outputs.size(); ++k) {
      const auto& x = a[i].outputs[k];
      const auto& y = b[i].outputs[k];
      EXPECT_EQ(x.token_ids, y.token_ids) << what << ": request " << i << " sample " << k;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what << ": request " << i << " sample " << k;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what;
      for (size_t t = 0; t < x.logprobs.size(); ++t)
        EXPECT_NEAR(x.logprobs[t], y.logprobs[t], logprob_tol) << what << ": request " << i << " token " << t;
    }
  }
}

}  // namespace kestrel::rollout::testing
