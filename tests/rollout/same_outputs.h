// Two rollouts' outputs compared request by request, sample by sample: the
// same request ids, token ids and finish reasons, and log-probs within
// logprob_tol (0: bit for bit).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rollout/engine.h"

namespace kestrel::rollout::testing {

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
