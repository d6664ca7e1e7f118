// CPU kernels of the mixture-of-experts ops (ops/moe.h: same contracts).
// The ops layer has checked shapes, dtypes and devices; index contents
// (expert ids, routing rows, group offsets) are checked here, where they are
// read, so a bad index fails with a message instead of touching memory out of
// bounds. Work is split over tokens (router, losses, permutation) or experts
// (capacity dropping) in static blocks; every sum runs in an order fixed by
// the data, never by the thread count.
//
// The backend cannot see ops/, so the router's configuration comes as its own
// plain struct (ops/moe.cpp translates it).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kestrel::cpu {

enum class MoeScoreFn { Softmax, Sigmoid };
enum class MoeGroupRule { None, SumTop2, Max };

struct MoeRouterParams {
  int64_t num_experts = 0, top_k = 0;
  MoeScoreFn score = MoeScoreFn::Softmax;
  MoeGroupRule group = MoeGroupRule::None;
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float scaling_factor = 1.f;
};

// logits [T, E] f32/bf16, bias f32 [E] or nullptr; topk_idx i32 [T, k],
// topk_w f32 [T, k] (rounded to the logits' dtype), scores f32 [T, E].
void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterParams& p, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay);
// dlogits f32 [T, E] += the gradient through the weights, recomputed from scores.
void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& dtopk_w, const MoeRouterParams& p,
                    Tensor& dlogits);

// cu_groups i32 [G+1]; counts i32 [E]; dlogits f32 [T, E] (+=).
double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, MoeScoreFn score, int64_t top_k, double coeff,
                        Tensor& counts);
void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, MoeScoreFn score, int64_t top_k, double coeff,
                      double scale, Tensor& dlogits);
double moe_z_loss_fwd(const Tensor& logits, double coeff);
void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits);

// In place on topk_idx i32 [T, k] / topk_w f32 [T, k]; by_probs: the "probs"
// policy, else "position". Returns the number of pairs dropped.
int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, int64_t num_experts, int64_t capacity, bool by_probs);

// dest i32 [T, k] (-1: dropped), source i32 [N] (-1: padding row).
void moe_permute_fwd(const Tensor& x, const Tensor& source, Tensor& xs);
void moe_permute_bwd(const Tensor& dxs, const Tensor& dest, Tensor& dx);
void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dest, Tensor& y);
void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const Tensor& dest,
                       const Tensor& source, Tensor& dys, Tensor& dtopk_w);

// One backend GEMM per non-empty group (moe_cpu_gemm.cpp).
void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y);
void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw);

// g [T, 1], s / y [T, D]; ds f32 [T, D], dg f32 [T, 1].
void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y);
void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg);

// bias f32 [E] += rate * sign(mean(load) - load[e]); load: [E] host counts.
void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate);

}  // namespace kestrel::cpu
