// Host side of the CUDA MoE kernels (kernels_moe.cu), and the grouped GEMM as
// one cuBLAS GEMM per non-empty expert group (dense_ops.h's linear on row
// slices, so every group gets ops::linear's arithmetic, as on the CPU). What
// the CPU kernels keep per thread (a token's choice row, a loss's group sums)
// lives in device buffers allocated per call; what they return to the host
// (losses, the dropped count) is read back and finished in double on the host
// in the CPU kernel's order.
#include "backend/cuda/moe_ops.h"

#include <algorithm>
#include <limits>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/kernels_moe.h"

namespace kestrel::cuda {
namespace {

using launch::FloatKind;

const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }
int32_t* i32_mut(const Tensor& t) { return static_cast<int32_t*>(t.raw()); }
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }

// A device buffer of n elements of dt (scratch the kernels fill).
Tensor device_buffer(int64_t n, DType dt) { return Tensor::empty({n}, dt, MemCategory::Activations, Device::CUDA); }

// A device copy of host values (dtype of T).
template <class T>
Tensor upload(const std::vector<T>& v) {
  const int64_t n = int64_t(v.size());
  Tensor d = device_buffer(n, dtype_of<T>::value);
  d.copy_from(Tensor::from_host(v, {n}));
  return d;
}

launch::MoeRouterDims dims(const MoeRouterArgs& a, int64_t T) {
  return {T, a.num_experts, a.top_k, a.sigmoid, a.group, a.n_group, a.topk_group, a.norm_topk_prob, a.scaling_factor};
}

// The aux loss's shared first half on the device: p f32 [T, E] and sel i32
// [T, k] per token, then per group the sums P (double [G, E]; skipped when
// P == nullptr) and counts c (int64 [G, E]).
struct AuxDevice {
  Tensor p, sel, P, c;
};
AuxDevice aux_group_sums(const char* op, const Tensor& logits, const Tensor& cu_groups, int64_t G, bool sigmoid,
                         int64_t k, bool with_P) {
  const int64_t T = logits.size(0), E = logits.size(1);
  AuxDevice a;
  a.p = device_buffer(T * E, DType::F32);
  a.sel = device_buffer(T * k, DType::I32);
  if (with_P) a.P = device_buffer(2 * G * E, DType::F32);  // G*E doubles (no f64 dtype; raw storage)
  a.c = device_buffer(G * E, DType::I64);
  launch::moe_aux_probs(logits.raw(), float_kind(logits, op), T, E, sigmoid, k, f32(a.p), i32_mut(a.sel), stream());
  launch::moe_aux_group_sums(f32(a.p), i32(a.sel), i32(cu_groups), G, E, k,
                             with_P ? static_cast<double*>(a.P.raw()) : nullptr, static_cast<int64_t*>(a.c.raw()),
                             stream());
  check_launch(op);
  return a;
}

}  // namespace

// ---- router -----------------------------------------------------------------

void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterArgs& a, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay) {
  const int64_t T = logits.size(0);
  if (T == 0) return;
  // The CPU kernel's per-thread working rows, one per token.
  Tensor choice = device_buffer(T * a.num_experts, DType::F32);                              // [T, E]
  Tensor group_score = device_buffer(T * a.n_group, DType::F32);                             // [T, n_group]
  Tensor best = device_buffer(T * launch::moe_router_best_stride(a.n_group), DType::I32);  // [T, max(2, n_group)]
  launch::moe_router_fwd(logits.raw(), float_kind(logits, "moe_router_fwd"), bias ? f32(*bias) : nullptr, dims(a, T),
                         replay, i32_mut(topk_idx), f32(topk_w), f32(scores), f32(choice), f32(group_score),
                         i32_mut(best), stream());
  check_launch("moe_router_fwd");
}

void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& dtopk_w, const MoeRouterArgs& a,
                    Tensor& dlogits) {
  launch::moe_router_bwd(f32(scores), i32(topk_idx), f32(dtopk_w), dims(a, scores.size(0)), f32(dlogits), stream());
  check_launch("moe_router_bwd");
}

// ---- load balancing ---------------------------------------------------------

double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, const std::vector<int32_t>& cu_host,
                        bool sigmoid, int64_t top_k, double coeff, Tensor& counts) {
  const char* op = "moe_aux_loss_fwd";
  const int64_t T = logits.size(0), E = logits.size(1), G = int64_t(cu_host.size()) - 1;
  std::vector<double> P(size_t(G * E), 0.0);  // [G, E]
  std::vector<int64_t> c(size_t(G * E), 0);   // [G, E]
  if (T > 0) {
    const AuxDevice a = aux_group_sums(op, logits, cu_groups, G, sigmoid, top_k, /*with_P=*/true);
    KS_CUDA_CHECK(cudaMemcpyAsync(P.data(), a.P.raw(), P.size() * sizeof(double), cudaMemcpyDeviceToHost, stream()));
    KS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    c = a.c.to_host<int64_t>();
  }
  // The CPU kernel's finish, in its order.
  std::vector<int32_t> cnt(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    int64_t total = 0;
    for (int64_t g = 0; g < G; ++g) total += c[size_t(g * E + e)];
    cnt[size_t(e)] = int32_t(total);
  }
  counts.copy_from(Tensor::from_host(cnt, {E}));
  double loss = 0.0;
  for (int64_t g = 0; g < G; ++g) {
    const double Tg = double(cu_host[size_t(g + 1)] - cu_host[size_t(g)]);
    if (Tg == 0) continue;  // an empty group adds 0 (and still counts in the mean)
    double acc = 0.0;
    for (int64_t e = 0; e < E; ++e) acc += double(c[size_t(g * E + e)]) * P[size_t(g * E + e)];
    loss += acc * double(E) / (double(top_k) * Tg * Tg);
  }
  return coeff * loss / double(G);
}

void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, const std::vector<int32_t>& cu_host,
                      bool sigmoid, int64_t top_k, double coeff, double scale, Tensor& dlogits) {
  const char* op = "moe_aux_loss_bwd";
  const int64_t T = logits.size(0), E = logits.size(1), G = int64_t(cu_host.size()) - 1;
  if (T == 0) return;
  std::vector<int32_t> group_of(static_cast<size_t>(T));  // [T]: the group of each row
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = cu_host[size_t(g)]; t < cu_host[size_t(g + 1)]; ++t) group_of[size_t(t)] = int32_t(g);
  const Tensor group_of_d = upload(group_of);
  const AuxDevice a = aux_group_sums(op, logits, cu_groups, G, sigmoid, top_k, /*with_P=*/false);
  launch::moe_aux_loss_bwd(logits.raw(), float_kind(logits, op), f32(a.p), i32(group_of_d), i32(cu_groups),
                           static_cast<const int64_t*>(a.c.raw()), T, E, G, top_k, sigmoid, coeff, scale,
                           f32(dlogits), stream());
  check_launch(op);
}

double moe_z_loss_fwd(const Tensor& logits, double coeff) {
  const int64_t T = logits.size(0);
  if (T == 0) return 0.0;
  Tensor lse = device_buffer(T, DType::F32);  // [T]
  launch::moe_row_lse(logits.raw(), float_kind(logits, "moe_z_loss_fwd"), T, logits.size(1), f32(lse), stream());
  check_launch("moe_z_loss_fwd");
  double acc = 0.0;  // in token order, as the CPU kernel
  for (float v : lse.to_host<float>()) acc += double(v) * double(v);
  return coeff * acc / double(T);
}

void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits) {
  const int64_t T = logits.size(0), E = logits.size(1);
  if (T == 0) return;
  const FloatKind kl = float_kind(logits, "moe_z_loss_bwd");
  Tensor lse = device_buffer(T, DType::F32);  // [T]
  launch::moe_row_lse(logits.raw(), kl, T, E, f32(lse), stream());
  // d/dl_e of coeff * mean lse^2 = coeff * 2 lse / T * softmax(l)_e
  launch::moe_z_loss_bwd(logits.raw(), kl, f32(lse), T, E, float(scale * coeff * 2.0 / double(T)), f32(dlogits),
                         stream());
  check_launch("moe_z_loss_bwd");
}

// ---- capacity ---------------------------------------------------------------

int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, const std::vector<int32_t>& idx, int64_t num_experts,
                             int64_t capacity, bool by_probs) {
  const int64_t E = num_experts, n = topk_idx.numel();
  KS_CHECK(n <= std::numeric_limits<int32_t>::max(), "moe_drop_to_capacity: ", n,
           " routed entries exceed the CUDA kernel's 32-bit indices");
  // Pairs (flat t * k + j) bucketed by expert, in token order within a bucket (the CPU kernel's layout).
  std::vector<int32_t> start(size_t(E + 1), 0);  // [E+1]
  for (int64_t i = 0; i < n; ++i)
    if (idx[size_t(i)] >= 0) ++start[size_t(idx[size_t(i)] + 1)];
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] += start[size_t(e)];
  int64_t dropped = 0;
  for (int64_t e = 0; e < E; ++e)
    dropped += std::max<int64_t>(0, int64_t(start[size_t(e + 1)]) - start[size_t(e)] - capacity);
  if (dropped == 0) return 0;  // no bucket over capacity: nothing changes
  std::vector<int32_t> pairs(size_t(start[size_t(E)]));  // [routed pairs]
  {
    std::vector<int32_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i)
      if (idx[size_t(i)] >= 0) pairs[size_t(fill[size_t(idx[size_t(i)])]++)] = int32_t(i);
  }
  const Tensor pairs_d = upload(pairs), start_d = upload(start);
  // [T*k] flags: ranking reads every weight of a bucket, so the drops are applied after it, not in place.
  const Tensor drop = Tensor::zeros({n}, DType::I32, MemCategory::Activations, Device::CUDA);
  launch::moe_drop_rank(i32(topk_idx), f32(topk_w), i32(pairs_d), int64_t(pairs.size()), i32(start_d), capacity,
                        by_probs, i32_mut(drop), stream());
  launch::moe_drop_apply(i32(drop), n, i32_mut(topk_idx), f32(topk_w), stream());
  check_launch("moe_drop_to_capacity");
  return dropped;
}

void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate) {
  const int64_t E = int64_t(load.size());
  // The CPU kernel's steps (mean in double, sign(0) = 0), added on the device in f32.
  double mean = 0;
  for (int64_t c : load) mean += double(c);
  mean /= double(E);
  std::vector<float> step(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double off = mean - double(load[size_t(e)]);
    step[size_t(e)] = float(rate) * float((off > 0) - (off < 0));
  }
  const Tensor step_d = upload(step);
  launch::add(bias.raw(), FloatKind::F32, step_d.raw(), FloatKind::F32, bias.raw(), FloatKind::F32, E, stream());
  check_launch("moe_update_expert_bias");
}

// ---- permutation ------------------------------------------------------------

void moe_permute_fwd(const Tensor& x, const Tensor& source, Tensor& xs) {
  (void)float_kind(x, "moe_permute_fwd");  // f32 or bf16 (the copy moves 4- or 2-byte elements)
  launch::moe_permute_fwd(x.raw(), i32(source), xs.size(0), xs.size(1), int(dtype_size(x.dtype())), xs.raw(),
                          stream());
  check_launch("moe_permute_fwd");
}

void moe_permute_bwd(const Tensor& dxs, const Tensor& dest, Tensor& dx) {
  launch::moe_permute_bwd(dxs.raw(), float_kind(dxs, "moe_permute_bwd"), i32(dest), dx.size(0), dest.size(1),
                          dx.size(1), f32(dx), stream());
  check_launch("moe_permute_bwd");
}

void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dest, Tensor& y) {
  launch::moe_unpermute_fwd(ys.raw(), float_kind(ys, "moe_unpermute_fwd"), f32(topk_w), i32(dest), y.size(0),
                            dest.size(1), y.size(1), y.raw(), float_kind(y, "moe_unpermute_fwd"), stream());
  check_launch("moe_unpermute_fwd");
}

void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const Tensor& dest,
                       const Tensor& source, Tensor& dys, Tensor& dtopk_w) {
  const char* op = "moe_unpermute_bwd";
  launch::moe_unpermute_bwd(ys.raw(), float_kind(ys, op), f32(topk_w), dy.raw(), float_kind(dy, op), i32(dest),
                            i32(source), dy.size(0), dest.size(1), ys.size(0), dy.size(1), f32(dys), f32(dtopk_w),
                            stream());
  check_launch(op);
}

// ---- grouped GEMM -----------------------------------------------------------

void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y) {
  int64_t r0 = 0;  // first row of the group
  for (size_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t n = group_sizes[e];
    if (n == 0) continue;
    Tensor ye = y.slice_rows(r0, r0 + n);  // [n, out]
    linear_fwd(x.slice_rows(r0, r0 + n), *w[e], nullptr, ye);
    r0 += n;
  }
}

void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw) {
  int64_t r0 = 0;
  for (size_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t n = group_sizes[e];
    if (n == 0) continue;
    Tensor* dwe = dw.empty() ? nullptr : dw[e];
    const Tensor dye = dy.slice_rows(r0, r0 + n);  // [n, out]
    Tensor dxe;
    if (dx) dxe = dx->slice_rows(r0, r0 + n);  // [n, in]
    // x is read only for dW (the ops layer checked it then).
    const Tensor xe = dwe ? x.slice_rows(r0, r0 + n) : Tensor();
    if (dx || dwe) linear_bwd(xe, *w[e], dye, dx ? &dxe : nullptr, dwe, nullptr, /*accumulate_dx=*/false);
    r0 += n;
  }
}

// ---- shared-expert gate -----------------------------------------------------

void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y) {
  const char* op = "sigmoid_gate_add_fwd";
  launch::sigmoid_gate_add_fwd(g.raw(), float_kind(g, op), s.raw(), float_kind(s, op), y.size(0), y.size(1), y.raw(),
                               float_kind(y, op), stream());
  check_launch(op);
}

void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg) {
  const char* op = "sigmoid_gate_add_bwd";
  launch::sigmoid_gate_add_bwd(g.raw(), float_kind(g, op), s.raw(), float_kind(s, op), dy.raw(), float_kind(dy, op),
                               dy.size(0), dy.size(1), f32(ds), f32(dg), stream());
  check_launch(op);
}

}  // namespace kestrel::cuda
