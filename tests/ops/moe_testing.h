// Helpers shared by the MoE op tests (moe_test.cpp, moe_experts_test.cpp).
#pragma once
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/moe.h"

namespace kestrel::moe_testing {

inline std::vector<int32_t> ints(const Tensor& t) { return t.to_host<int32_t>(); }
inline Tensor i32_tensor(const std::vector<int32_t>& v, Shape shape) { return Tensor::from_host(v, std::move(shape)); }

inline ops::MoeRouterConfig router_cfg(int64_t E, int64_t k, ops::MoeScore score,
                                      ops::MoeGroupLimit limit = ops::MoeGroupLimit::None, int64_t n_group = 1,
                                      int64_t topk_group = 1, bool norm = false, double scaling = 1.0) {
  ops::MoeRouterConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.score = score;
  c.group_limit = limit;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.norm_topk_prob = norm;
  c.scaling_factor = scaling;
  return c;
}

}  // namespace kestrel::moe_testing
