// Launchers of the mixture-of-experts kernels (kernels_moe.cu): the router
// and its backward, the load-balancing and z-losses, capacity dropping, the
// permutation into expert-major rows and back, and the shared-expert gate of
// ops/moe.h. Raw device pointers, enqueued on `stream`, no synchronisation.
// Index contents (expert ids, rows, group offsets) have been checked by the
// caller; the kernels trust them. The grouped GEMM is cuBLAS (moe_ops.cpp).
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {

// The router's configuration as plain values (ops/moe.h MoeRouterConfig, checked).
struct MoeRouterDims {
  int64_t T, E, k;
  bool sigmoid;               // score function: sigmoid, else softmax
  int group;                  // 0 none, 1 SumTop2 (others masked -inf), 2 Max (others masked 0)
  int64_t n_group, topk_group;  // 1, 1 without a group limit
  bool norm_topk_prob;
  float scaling_factor;
};
// Scratch of moe_router_fwd per token: choice f32 [T, E], group_score f32
// [T, n_group], best i32 [T, max(2, n_group)] (the CPU kernel's row vectors).
inline int64_t moe_router_best_stride(int64_t n_group) { return n_group > 2 ? n_group : 2; }

// scores f32 [T, E], topk_w f32 [T, k] written; topk_idx i32 [T, k] written
// (or, with replay, read, and written only for rows whose k entries are all -1).
void moe_router_fwd(const void* logits, FloatKind kl, const float* bias, const MoeRouterDims& d, bool replay,
                    int32_t* topk_idx, float* topk_w, float* scores, float* choice, float* group_score, int32_t* best,
                    void* stream);
// dlogits f32 [T, E] += the gradient through the weights (entries of topk_idx < 0 carry none).
void moe_router_bwd(const float* scores, const int32_t* topk_idx, const float* dtopk_w, const MoeRouterDims& d,
                    float* dlogits, void* stream);

// The aux loss's probabilities p f32 [T, E] (softmax, or sigmoid over its sum
// + 1e-20) and their plain top-k sel i32 [T, k].
void moe_aux_probs(const void* logits, FloatKind kl, int64_t T, int64_t E, bool sigmoid, int64_t k, float* p,
                   int32_t* sel, void* stream);
// Per group g of the rows [cu[g], cu[g+1]) and expert e: P[g, e] = sum of
// p[t, e] in double, in token order (P may be nullptr), c[g, e] = the tokens
// whose sel holds e. P, c: [G, E].
void moe_aux_group_sums(const float* p, const int32_t* sel, const int32_t* cu, int64_t G, int64_t E, int64_t k,
                        double* P, int64_t* c, void* stream);
// dlogits f32 [T, E] += scale * d(aux loss)/d logits; group_of i32 [T] (the
// group of each row), cu i32 [G+1], c int64 [G, E] from moe_aux_group_sums.
void moe_aux_loss_bwd(const void* logits, FloatKind kl, const float* p, const int32_t* group_of, const int32_t* cu,
                      const int64_t* c, int64_t T, int64_t E, int64_t G, int64_t k, bool sigmoid, double coeff,
                      double scale, float* dlogits, void* stream);

// lse f32 [T] = logsumexp of each row of logits [T, E].
void moe_row_lse(const void* logits, FloatKind kl, int64_t T, int64_t E, float* lse, void* stream);
// dlogits[t, e] += (c * lse[t]) * exp(logits[t, e] - lse[t]), c = float(scale * coeff * 2 / T).
void moe_z_loss_bwd(const void* logits, FloatKind kl, const float* lse, int64_t T, int64_t E, float c, float* dlogits,
                    void* stream);

// Capacity dropping. pairs i32 [n_pairs]: the flat (t*k + j) entries routed
// to an expert, bucketed by expert (bucket e = [start[e], start[e+1]), token
// order within); start i32 [E+1]. drop i32 [T*k] (zeroed by the caller) gets
// 1 for every pair ranked at or past `capacity` in its bucket (by_probs: the
// larger weight first, ties to the lower entry; else the bucket's order).
void moe_drop_rank(const int32_t* topk_idx, const float* topk_w, const int32_t* pairs, int64_t n_pairs,
                   const int32_t* start, int64_t capacity, bool by_probs, int32_t* drop, void* stream);
// topk_idx = -1, topk_w = 0 where drop is set (n = T*k entries).
void moe_drop_apply(const int32_t* drop, int64_t n, int32_t* topk_idx, float* topk_w, void* stream);

// xs[r] = x[source[r]] (zero rows for source -1); rows of D elements of elem_bytes 2 or 4.
void moe_permute_fwd(const void* x, const int32_t* source, int64_t N, int64_t D, int elem_bytes, void* xs,
                     void* stream);
// dx f32 [T, D] = sum over the kept slots j of dxs[dest[t, j]], in slot order.
void moe_permute_bwd(const void* dxs, FloatKind kg, const int32_t* dest, int64_t T, int64_t k, int64_t D, float* dx,
                     void* stream);
// y [T, D] = sum over the kept slots of topk_w[t, j] * ys[dest[t, j]], f32 in slot order, rounded once.
void moe_unpermute_fwd(const void* ys, FloatKind ky, const float* topk_w, const int32_t* dest, int64_t T, int64_t k,
                       int64_t D, void* y, FloatKind ko, void* stream);
// dys f32 [N, D] = topk_w[t, j] * dy[t] at row dest[t, j] (0 for padding rows);
// dtopk_w f32 [T, k] = <dy[t], ys[dest[t, j]]> (0 for dropped slots).
void moe_unpermute_bwd(const void* ys, FloatKind ky, const float* topk_w, const void* dy, FloatKind kg,
                       const int32_t* dest, const int32_t* source, int64_t T, int64_t k, int64_t N, int64_t D,
                       float* dys, float* dtopk_w, void* stream);

// y[t] += sigmoid(g[t]) * s[t] with HF's roundings (ops/moe.h); g [T], s and y [T, D].
void sigmoid_gate_add_fwd(const void* g, FloatKind kg, const void* s, FloatKind ks, int64_t T, int64_t D, void* y,
                          FloatKind ky, void* stream);
// ds f32 [T, D] = sigmoid(g) * dy; dg f32 [T] = sigmoid'(g) * <dy[t], s[t]>.
void sigmoid_gate_add_bwd(const void* g, FloatKind kg, const void* s, FloatKind ks, const void* dy, FloatKind kd,
                          int64_t T, int64_t D, float* ds, float* dg, void* stream);

}  // namespace kestrel::cuda::launch
