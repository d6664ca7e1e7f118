// Mixture-of-experts ops: the router's top-k, its load-balancing losses, the
// permutation of tokens into expert-major order and back, and the grouped
// GEMM over all experts' token groups (Megatron's moe_grouped_gemm and
// fused_permute_and_unpermute, as single calls).
//
// Shapes: T tokens, E routed experts, k experts per token (top-k), D hidden,
// N = rows routed to experts (T*k minus dropped, or E*capacity when padded to
// capacity). Scalar references: ops/ref/moe_ref.h.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kestrel::ops {

// ---- router -----------------------------------------------------------------

enum class MoeScore { Softmax, Sigmoid };
// How experts are pre-selected by group (n_group groups of E/n_group experts).
enum class MoeGroupLimit {
  None,
  // DeepSeek-V3 / Megatron: a group's score is the sum of its top-2 choice
  // scores (scores + bias), the top topk_group groups are kept, the rest masked -inf.
  // (Megatron sums the top k/topk_group: the same for DeepSeek-V3's k = 8, topk_group = 4.)
  SumTop2,
  // DeepSeek-V2 group_limited_greedy: a group's score is its max score, the
  // others' scores set to 0 before the top-k.
  Max,
};

struct MoeRouterConfig {
  int64_t num_experts = 0;  // E
  int64_t top_k = 0;        // k
  MoeScore score = MoeScore::Softmax;  // softmax over all E (Qwen, DeepSeek-V2) or sigmoid (DeepSeek-V3)
  MoeGroupLimit group_limit = MoeGroupLimit::None;
  int64_t n_group = 1, topk_group = 1;
  // Normalise the k chosen weights to sum to 1 (HF norm_topk_prob). Sigmoid
  // divides by (sum + 1e-20) as DeepSeek-V3 does; softmax by the plain sum as Qwen does.
  bool norm_topk_prob = false;
  double scaling_factor = 1.0;  // routed_scaling_factor, applied last
};

// Top-k routing of f32 or bf16 logits [T, E] (read as f32):
//   scores = softmax(logits) or sigmoid(logits)                      f32 [T, E]
//   choice = scores + bias (bias: f32 [E] or nullptr; the DeepSeek-V3
//            e_score_correction_bias / Megatron's expert bias: selection only)
//   group limit on choice, then the k largest choices per token (ties: the
//   lower expert index first), in descending order of choice;
//   weights = scores at the chosen experts, normalised if norm_topk_prob,
//            times scaling_factor, then rounded to the logits' dtype (bf16
//            logits give bf16-valued weights: HF's .to(router_logits.dtype),
//            Megatron's probs.type_as(logits)).
// Writes topk_idx i32 [T, k], topk_w f32 [T, k] and scores f32 [T, E] (kept
// for the backward). Replay (router_replay, capacity re-runs): with
// replay = true the given topk_idx is read, not chosen, and only the weights
// (and scores) are computed from it; its -1 entries get weight 0 and stay out
// of the normalisation, except that a row whose k entries are all -1 has no
// record (e.g. a sequence's last token, never fed to the rollout's model) and
// is routed as without replay.
void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterConfig& cfg, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay = false);
// dlogits f32 [T, E] += the gradient through topk_w: dtopk_w f32 [T, k] back
// through the normalisation and the score function (the selection is a
// constant, as in PyTorch's topk). Entries of topk_idx < 0 (dropped) carry no gradient.
// The weights are recomputed from scores in f32 (topk_w is checked for its
// shape only, so bf16-rounded weights cost the gradient nothing). After
// capacity dropping, pass the topk_idx from before the drop (dtopk_w is 0 at
// the dropped slots, as moe_unpermute_bwd writes it): the normalisation saw
// the dropped experts' scores, and Megatron's gradient flows into them.
void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_w, const Tensor& dtopk_w,
                    const MoeRouterConfig& cfg, Tensor& dlogits);

// ---- load balancing ---------------------------------------------------------

// Megatron's switch load-balancing loss over the tokens of each sequence
// group g (cu_groups: i32 [G+1] rows; one group = the whole micro-batch for
// Megatron's aux_loss, one group per sequence for seq_aux_loss):
//   p      = softmax(logits) (softmax routers) or sigmoid(logits) / (sum + 1e-20) (sigmoid)
//   c_ge   = number of tokens t of g whose plain top-k of p (no bias, no
//            group limit) holds e
//   aux_g  = E / (k * T_g^2) * sum_e c_ge * sum_{t in g} p_te
//   result = coeff * mean over the G groups of aux_g   (coeff = moe_aux_loss_coeff;
//            an empty group's aux_g is 0, and it still counts in G)
// Returns the result; writes counts i32 [E] (c summed over the groups) for
// metrics. Backward: dlogits += scale * d result / d logits (the counts are
// constants, as in Megatron).
double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, MoeScore score, int64_t top_k, double coeff,
                        Tensor& counts);
void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, MoeScore score, int64_t top_k, double coeff,
                      double scale, Tensor& dlogits);
// ST-MoE router z-loss: coeff * mean_t (logsumexp_e logits[t, e])^2; the
// backward adds scale * its gradient into dlogits f32 [T, E].
double moe_z_loss_fwd(const Tensor& logits, double coeff);
void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits);

// Token dropping (Megatron's moe_expert_capacity_factor): capacity =
// ceil(T*k/E * capacity_factor). Per expert, at most `capacity` of the
// (token, slot) pairs routed to it are kept: policy "probs" keeps the largest
// weights (ties: lower token index), "position" the earliest tokens. Dropped
// pairs get topk_idx = -1 and topk_w = 0, in place. Returns the number
// dropped.
enum class MoeDropPolicy { Probs, Position };
int64_t moe_expert_capacity(int64_t T, int64_t top_k, int64_t num_experts, double capacity_factor);
int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, int64_t num_experts, int64_t capacity,
                             MoeDropPolicy policy);

// Aux-loss-free load balancing (DeepSeek-V3, Megatron's
// get_updated_expert_bias): bias[e] += rate * sign(mean(load) - load[e]),
// bias f32 [E] in place; load [E] are the step's token counts per expert
// (summed over the data-parallel ranks by the caller). sign(0) = 0.
void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate);

// ---- permutation ------------------------------------------------------------

// The expert-major layout of a routing (host-side bookkeeping, computed once
// per layer from topk_idx and shared by permute, the grouped GEMM and unpermute).
struct MoeRouting {
  int64_t num_tokens = 0, top_k = 0, num_experts = 0;
  std::vector<int64_t> group_sizes;  // [E] rows of each expert's group (padded to capacity when asked)
  std::vector<int64_t> tokens_per_expert;  // [E] kept (token, slot) pairs of each expert (group_sizes before padding)
  Tensor dest;                       // i32 [T, k]: row of the permuted buffer for (t, j); -1 = dropped
  Tensor source;                     // i32 [N]: token of each permuted row; -1 = a padding row (zero)
  int64_t rows() const;              // N = sum of group_sizes
};
// Builds the layout: each expert's rows hold its tokens in increasing token
// order (stable), experts in index order. pad_to > 0 pads every group with
// zero rows up to pad_to rows (Megatron's moe_pad_expert_input_to_capacity;
// no group may exceed it).
MoeRouting moe_routing(const Tensor& topk_idx, int64_t num_experts, int64_t pad_to = 0);

// xs[n] = x[source[n]] (zero rows for padding). x: [T, D]; xs: [N, D], same dtype.
void moe_permute_fwd(const Tensor& x, const MoeRouting& r, Tensor& xs);
// dx[t] = sum of dxs over the rows of token t, written (=; f32 [T, D]).
void moe_permute_bwd(const Tensor& dxs, const MoeRouting& r, Tensor& dx);
// y[t] = sum_j topk_w[t, j] * ys[dest[t, j]] over the kept slots, in slot
// order, accumulated in f32 and rounded once. ys: [N, D]; topk_w f32 [T, k]; y: [T, D] written.
void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const MoeRouting& r, Tensor& y);
// dys[n] = topk_w[t, j] * dy[t] for the row n = dest[t, j] (0 for padding
// rows), written f32 [N, D]; dtopk_w[t, j] = <dy[t], ys[dest[t, j]]> written
// f32 [T, k] (0 for dropped slots).
void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const MoeRouting& r, Tensor& dys,
                       Tensor& dtopk_w);

// ---- grouped GEMM -----------------------------------------------------------

// One call for every expert's group: rows [o_e, o_e + group_sizes[e]) of x
// (o_e = sum of the sizes before e) times expert e's weight:
//   y[rows of e] = x[rows of e] @ w[e]^T          w[e]: [out, in], HF's nn.Linear layout
// x [N, in], y [N, out]; x, w[e], y f32 or bf16 (as ops::linear_fwd: bf16
// widened, f32 accumulation, y rounded once). Empty groups are skipped.
void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y);
// dx[rows of e] = dy[rows of e] @ w[e]   (written; skipped when dx == nullptr)
// dw[e] += dy[rows of e]^T @ x[rows of e] (f32; skipped when dw is empty or
// dw[e] is null (a frozen expert); an empty group adds nothing). dy f32 or bf16.
void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw);

// ---- shared-expert gate (Qwen2-MoE) ---------------------------------------------

// y[t] += sigmoid(g[t]) * s[t]: g [T, 1] (the shared_expert_gate's logits), s, y [T, D].
// The sigmoid is rounded to g's dtype and, when g and s are bf16, the product
// to bf16 before the add, as HF computes sigmoid(g) * s in bf16 and adds in bf16.
void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y);
// ds[t] = sigmoid(g[t]) * dy[t] (written, f32 [T, D]); dg[t] = sigmoid'(g[t]) * <dy[t], s[t]> (written, f32 [T, 1]).
void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg);

}  // namespace kestrel::ops
