// CUDA kernels of the mixture-of-experts ops (ops/moe.h). Where the CPU
// kernel (backend/cpu/moe_cpu.h) takes the backend's own router structs, or
// checks index contents itself, ops/moe.cpp wraps these: it reads the device
// metadata back, checks it as the CPU kernel does and passes what it read
// (the host copies below) on; every other function has the CPU kernel's
// signature and sits in the op's kernel table directly. Callers have checked
// shapes, dtypes and devices.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kestrel::cuda {

// The router configuration (the CPU's MoeRouterParams, translated by ops/moe.cpp).
struct MoeRouterArgs {
  int64_t num_experts = 0, top_k = 0;
  bool sigmoid = false;   // score function: sigmoid, else softmax
  int group = 0;          // 0 none, 1 SumTop2, 2 Max
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float scaling_factor = 1.f;
};

// topk_idx's expert ids already checked when replay is set.
void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterArgs& a, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay);
// topk_idx's expert ids already checked.
void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& dtopk_w, const MoeRouterArgs& a,
                    Tensor& dlogits);

// cu_host: the checked host copy of cu_groups (0 .. T, non-decreasing).
double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, const std::vector<int32_t>& cu_host,
                        bool sigmoid, int64_t top_k, double coeff, Tensor& counts);
void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, const std::vector<int32_t>& cu_host,
                      bool sigmoid, int64_t top_k, double coeff, double scale, Tensor& dlogits);
double moe_z_loss_fwd(const Tensor& logits, double coeff);
void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits);

// idx_host: the checked host copy of topk_idx (the buckets are laid out on the
// host from it; the device ranks by weight and drops). Returns the number dropped.
int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, const std::vector<int32_t>& idx_host,
                             int64_t num_experts, int64_t capacity, bool by_probs);
// bias f32 [E] += rate * sign(mean(load) - load[e]) (the steps computed on the host, as the CPU does).
void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate);

// dest / source rows already checked (and, for unpermute_bwd, their consistency).
void moe_permute_fwd(const Tensor& x, const Tensor& source, Tensor& xs);
void moe_permute_bwd(const Tensor& dxs, const Tensor& dest, Tensor& dx);
void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dest, Tensor& y);
void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const Tensor& dest,
                       const Tensor& source, Tensor& dys, Tensor& dtopk_w);

// One cuBLAS GEMM per non-empty group (dense_ops.h's linear on row slices).
void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y);
void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw);

void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y);
void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg);

}  // namespace kestrel::cuda
