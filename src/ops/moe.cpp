// ops/moe.h: argument checks, the routing layout (host bookkeeping) and
// device dispatch.
#include "ops/moe.h"

#include <cmath>
#include <string>

#include "backend/cpu/moe_cpu.h"
#if KESTREL_HAVE_CUDA
#include <vector>

#include "backend/cuda/moe_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {

cpu::MoeScoreFn score_fn(MoeScore s) {
  return s == MoeScore::Sigmoid ? cpu::MoeScoreFn::Sigmoid : cpu::MoeScoreFn::Softmax;
}

// The router configuration, checked against E = logits' columns, as the backend's parameters.
cpu::MoeRouterParams router_params(const char* op, const MoeRouterConfig& c) {
  const int64_t E = c.num_experts, k = c.top_k;
  if (E < 1) KS_FAIL("ops::", op, ": num_experts must be >= 1, got ", E);
  if (k < 1 || k > E) KS_FAIL("ops::", op, ": top_k must be in [1, num_experts = ", E, "], got ", k);
  if (c.group_limit != MoeGroupLimit::None) {
    if (c.n_group < 1 || E % c.n_group != 0)
      KS_FAIL("ops::", op, ": n_group = ", c.n_group, " must divide num_experts = ", E, " for a group limit");
    if (c.topk_group < 1 || c.topk_group > c.n_group)
      KS_FAIL("ops::", op, ": topk_group must be in [1, n_group = ", c.n_group, "], got ", c.topk_group);
    const int64_t per = E / c.n_group;
    if (c.group_limit == MoeGroupLimit::SumTop2 && per < 2)
      KS_FAIL("ops::", op, ": the SumTop2 group limit needs at least 2 experts per group, got ", per, " (num_experts ",
              E, " / n_group ", c.n_group, ")");
    if (k > c.topk_group * per)
      KS_FAIL("ops::", op, ": top_k = ", k, " exceeds the ", c.topk_group * per,
              " experts of the topk_group = ", c.topk_group, " kept groups; raise topk_group or lower top_k");
  }
  if (!std::isfinite(c.scaling_factor)) KS_FAIL("ops::", op, ": scaling_factor must be finite, got ", c.scaling_factor);
  cpu::MoeRouterParams p;
  p.num_experts = E;
  p.top_k = k;
  p.score = score_fn(c.score);
  p.group = c.group_limit == MoeGroupLimit::SumTop2 ? cpu::MoeGroupRule::SumTop2
            : c.group_limit == MoeGroupLimit::Max   ? cpu::MoeGroupRule::Max
                                                    : cpu::MoeGroupRule::None;
  p.n_group = c.group_limit == MoeGroupLimit::None ? 1 : c.n_group;
  p.topk_group = c.group_limit == MoeGroupLimit::None ? 1 : c.topk_group;
  p.norm_topk_prob = c.norm_topk_prob;
  p.scaling_factor = float(c.scaling_factor);
  return p;
}

void check_logits(const char* op, const Tensor& logits) {
  check_float(op, "logits", logits);
  check_shape(op, "logits", logits, {-1, -1});
  if (logits.size(1) < 1) KS_FAIL("ops::", op, ": logits need at least one expert column, got ", logits.describe());
}

void check_top_k(const char* op, int64_t k, int64_t E) {
  if (k < 1 || k > E) KS_FAIL("ops::", op, ": top_k must be in [1, ", E, "] (the experts), got ", k);
}

void check_cu_groups(const char* op, const Tensor& cu_groups) {
  check_dtype(op, "cu_groups", cu_groups, DType::I32);
  check_shape(op, "cu_groups", cu_groups, {-1});
  if (cu_groups.size(0) < 2)
    KS_FAIL("ops::", op, ": cu_groups must hold G+1 >= 2 offsets (one group at least), got ", cu_groups.describe());
}

// r's tensors describe T tokens with k slots and N = rows() permuted rows.
void check_routing(const char* op, const MoeRouting& r) {
  check_dtype(op, "routing.dest", r.dest, DType::I32);
  check_shape(op, "routing.dest", r.dest, {r.num_tokens, r.top_k});
  check_dtype(op, "routing.source", r.source, DType::I32);
  check_shape(op, "routing.source", r.source, {r.rows()});
}

// w holds one [out, in] float weight per group (non-null), all on x's device.
void check_expert_weights(const char* op, const std::vector<const Tensor*>& w, size_t groups, int64_t in, int64_t out,
                          const Tensor& x) {
  if (w.size() != groups) KS_FAIL("ops::", op, ": w must hold one weight per group (", groups, "), got ", w.size());
  for (size_t e = 0; e < w.size(); ++e) {
    const std::string name = "w[" + std::to_string(e) + "]";
    if (!w[e]) KS_FAIL("ops::", op, ": ", name, " is null; every group needs its expert's weight");
    check_float(op, name.c_str(), *w[e]);
    check_shape(op, name.c_str(), *w[e], {out, in});
    if (w[e]->device() != x.device())
      KS_FAIL("ops::", op, ": ", name, " is on ", device_name(w[e]->device()), ", the activations on ",
              device_name(x.device()));
  }
}

// group_sizes are >= 0 and sum to N.
void check_group_sizes(const char* op, const std::vector<int64_t>& sizes, int64_t N) {
  int64_t sum = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] < 0) KS_FAIL("ops::", op, ": group_sizes[", e, "] = ", sizes[e], " is negative");
    sum += sizes[e];
  }
  if (sum != N) KS_FAIL("ops::", op, ": group_sizes sum to ", sum, " rows, but x / dy have ", N);
}

// A tensor of `dev` holding host values (dest/source of a routing).
Tensor index_tensor(const std::vector<int32_t>& v, Shape shape, Device dev) {
  Tensor host = Tensor::from_host(v, shape, MemCategory::Activations);
  if (dev == Device::CPU) return host;
  Tensor t = Tensor::empty(std::move(shape), DType::I32, MemCategory::Activations, dev);
  t.copy_from(host);
  return t;
}

#if KESTREL_HAVE_CUDA
// The CUDA paths. The CPU kernels check index contents where they read them
// (backend/cpu/moe_cpu*.cpp); here the device metadata is read back (small
// copies) for the same checks with the same messages, before a kernel could
// read out of bounds, and what was read is passed on where the host needs it.
std::vector<int32_t> host_ints(const Tensor& t) { return t.to_host<int32_t>(); }

// Every entry of idx ([rows, k]) is an expert in [0, E) or -1 (dropped).
void check_expert_ids(const char* op, const std::vector<int32_t>& idx, int64_t k, int64_t E) {
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] < -1 || idx[i] >= E)
      KS_FAIL("ops::", op, ": topk_idx[", int64_t(i) / k, ", ", int64_t(i) % k, "] = ", idx[i],
              " is not an expert in [0, ", E, ") nor -1 (dropped)");
}

// Every entry of a routing index is a row in [0, rows) or -1.
void check_rows(const char* op, const char* name, const std::vector<int32_t>& index, int64_t rows) {
  for (size_t i = 0; i < index.size(); ++i)
    if (index[i] < -1 || index[i] >= rows)
      KS_FAIL("ops::", op, ": ", name, "[", i, "] = ", index[i], " is outside [-1, ", rows,
              "); the MoeRouting does not belong to these tensors");
}

// cu_groups runs from 0 to the T rows of logits without decreasing.
void check_cu_values(const char* op, const std::vector<int32_t>& cu, int64_t T) {
  const size_t G = cu.size() - 1;
  if (cu[0] != 0 || cu[G] != T)
    KS_FAIL("ops::", op, ": cu_groups must run from 0 to the ", T, " rows of logits, got ", cu[0], " .. ", cu[G]);
  for (size_t g = 0; g < G; ++g)
    if (cu[g + 1] < cu[g])
      KS_FAIL("ops::", op, ": cu_groups must not decrease, got cu_groups[", g, "] = ", cu[g], " > cu_groups[", g + 1,
              "] = ", cu[g + 1]);
}

cuda::MoeRouterArgs cuda_router_args(const cpu::MoeRouterParams& p) {
  cuda::MoeRouterArgs a;
  a.num_experts = p.num_experts;
  a.top_k = p.top_k;
  a.sigmoid = p.score == cpu::MoeScoreFn::Sigmoid;
  a.group = p.group == cpu::MoeGroupRule::SumTop2 ? 1 : p.group == cpu::MoeGroupRule::Max ? 2 : 0;
  a.n_group = p.n_group;
  a.topk_group = p.topk_group;
  a.norm_topk_prob = p.norm_topk_prob;
  a.scaling_factor = p.scaling_factor;
  return a;
}

void cuda_router_fwd(const Tensor& logits, const Tensor* bias, const cpu::MoeRouterParams& p, Tensor& topk_idx,
                     Tensor& topk_w, Tensor& scores, bool replay) {
  if (replay) check_expert_ids("moe_router_fwd", host_ints(topk_idx), p.top_k, p.num_experts);
  cuda::moe_router_fwd(logits, bias, cuda_router_args(p), topk_idx, topk_w, scores, replay);
}

void cuda_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& dtopk_w,
                     const cpu::MoeRouterParams& p, Tensor& dlogits) {
  check_expert_ids("moe_router_bwd", host_ints(topk_idx), p.top_k, p.num_experts);
  cuda::moe_router_bwd(scores, topk_idx, dtopk_w, cuda_router_args(p), dlogits);
}

double cuda_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, cpu::MoeScoreFn score, int64_t top_k,
                         double coeff, Tensor& counts) {
  const std::vector<int32_t> cu = host_ints(cu_groups);
  check_cu_values("moe_aux_loss_fwd", cu, logits.size(0));
  return cuda::moe_aux_loss_fwd(logits, cu_groups, cu, score == cpu::MoeScoreFn::Sigmoid, top_k, coeff, counts);
}

void cuda_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, cpu::MoeScoreFn score, int64_t top_k,
                       double coeff, double scale, Tensor& dlogits) {
  const std::vector<int32_t> cu = host_ints(cu_groups);
  check_cu_values("moe_aux_loss_bwd", cu, logits.size(0));
  cuda::moe_aux_loss_bwd(logits, cu_groups, cu, score == cpu::MoeScoreFn::Sigmoid, top_k, coeff, scale, dlogits);
}

int64_t cuda_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, int64_t num_experts, int64_t capacity,
                              bool by_probs) {
  const std::vector<int32_t> idx = host_ints(topk_idx);
  check_expert_ids("moe_drop_to_capacity", idx, topk_idx.size(1), num_experts);
  return cuda::moe_drop_to_capacity(topk_idx, topk_w, idx, num_experts, capacity, by_probs);
}

void cuda_permute_fwd(const Tensor& x, const Tensor& source, Tensor& xs) {
  check_rows("moe_permute_fwd", "source", host_ints(source), x.size(0));
  cuda::moe_permute_fwd(x, source, xs);
}

void cuda_permute_bwd(const Tensor& dxs, const Tensor& dest, Tensor& dx) {
  check_rows("moe_permute_bwd", "dest", host_ints(dest), dxs.size(0));
  cuda::moe_permute_bwd(dxs, dest, dx);
}

void cuda_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dest, Tensor& y) {
  check_rows("moe_unpermute_fwd", "dest", host_ints(dest), ys.size(0));
  cuda::moe_unpermute_fwd(ys, topk_w, dest, y);
}

void cuda_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const Tensor& dest,
                        const Tensor& source, Tensor& dys, Tensor& dtopk_w) {
  const char* op = "moe_unpermute_bwd";
  const int64_t T = dy.size(0), k = dest.size(1), N = ys.size(0);
  const std::vector<int32_t> dst = host_ints(dest), src = host_ints(source);
  check_rows(op, "dest", dst, N);
  check_rows(op, "source", src, T);
  // Each row receives one slot's gradient (the kernel finds a row's slot through source).
  std::vector<int64_t> owner(size_t(N), -1);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t r = dst[size_t(i)];
    if (r < 0) continue;
    if (owner[size_t(r)] >= 0 || src[size_t(r)] != i / k)
      KS_FAIL("ops::", op, ": dest[", i / k, ", ", i % k, "] = ", r, " is another slot's row or not a row of token ",
              i / k, "; the MoeRouting is inconsistent");
    owner[size_t(r)] = i;
  }
  cuda::moe_unpermute_bwd(ys, topk_w, dy, dest, source, dys, dtopk_w);
}
#endif

constexpr Kernels<decltype(cpu::moe_router_fwd)> kRouterFwd{.cpu = cpu::moe_router_fwd KS_CUDA_KERNEL(cuda_router_fwd)};
constexpr Kernels<decltype(cpu::moe_router_bwd)> kRouterBwd{.cpu = cpu::moe_router_bwd KS_CUDA_KERNEL(cuda_router_bwd)};
constexpr Kernels<decltype(cpu::moe_aux_loss_fwd)> kAuxFwd{
    .cpu = cpu::moe_aux_loss_fwd KS_CUDA_KERNEL(cuda_aux_loss_fwd)};
constexpr Kernels<decltype(cpu::moe_aux_loss_bwd)> kAuxBwd{
    .cpu = cpu::moe_aux_loss_bwd KS_CUDA_KERNEL(cuda_aux_loss_bwd)};
constexpr Kernels<decltype(cpu::moe_z_loss_fwd)> kZFwd{.cpu = cpu::moe_z_loss_fwd KS_CUDA_KERNEL(cuda::moe_z_loss_fwd)};
constexpr Kernels<decltype(cpu::moe_z_loss_bwd)> kZBwd{.cpu = cpu::moe_z_loss_bwd KS_CUDA_KERNEL(cuda::moe_z_loss_bwd)};
constexpr Kernels<decltype(cpu::moe_drop_to_capacity)> kDrop{
    .cpu = cpu::moe_drop_to_capacity KS_CUDA_KERNEL(cuda_drop_to_capacity)};
constexpr Kernels<decltype(cpu::moe_update_expert_bias)> kBiasUpdate{
    .cpu = cpu::moe_update_expert_bias KS_CUDA_KERNEL(cuda::moe_update_expert_bias)};
constexpr Kernels<decltype(cpu::moe_permute_fwd)> kPermuteFwd{
    .cpu = cpu::moe_permute_fwd KS_CUDA_KERNEL(cuda_permute_fwd)};
constexpr Kernels<decltype(cpu::moe_permute_bwd)> kPermuteBwd{
    .cpu = cpu::moe_permute_bwd KS_CUDA_KERNEL(cuda_permute_bwd)};
constexpr Kernels<decltype(cpu::moe_unpermute_fwd)> kUnpermuteFwd{
    .cpu = cpu::moe_unpermute_fwd KS_CUDA_KERNEL(cuda_unpermute_fwd)};
constexpr Kernels<decltype(cpu::moe_unpermute_bwd)> kUnpermuteBwd{
    .cpu = cpu::moe_unpermute_bwd KS_CUDA_KERNEL(cuda_unpermute_bwd)};
constexpr Kernels<decltype(cpu::grouped_linear_fwd)> kGroupedFwd{
    .cpu = cpu::grouped_linear_fwd KS_CUDA_KERNEL(cuda::grouped_linear_fwd)};
constexpr Kernels<decltype(cpu::grouped_linear_bwd)> kGroupedBwd{
    .cpu = cpu::grouped_linear_bwd KS_CUDA_KERNEL(cuda::grouped_linear_bwd)};
constexpr Kernels<decltype(cpu::sigmoid_gate_add_fwd)> kGateFwd{
    .cpu = cpu::sigmoid_gate_add_fwd KS_CUDA_KERNEL(cuda::sigmoid_gate_add_fwd)};
constexpr Kernels<decltype(cpu::sigmoid_gate_add_bwd)> kGateBwd{
    .cpu = cpu::sigmoid_gate_add_bwd KS_CUDA_KERNEL(cuda::sigmoid_gate_add_bwd)};

}  // namespace

// ---- router -----------------------------------------------------------------

void moe_router_fwd(const Tensor& logits, const Tensor* bias, const MoeRouterConfig& cfg, Tensor& topk_idx,
                    Tensor& topk_w, Tensor& scores, bool replay) {
  const char* op = "moe_router_fwd";
  check_logits(op, logits);
  const int64_t T = logits.size(0), E = logits.size(1);
  if (E != cfg.num_experts)
    KS_FAIL("ops::", op, ": logits have ", E, " expert columns, the config num_experts = ", cfg.num_experts);
  const cpu::MoeRouterParams p = router_params(op, cfg);
  if (bias) {
    check_dtype(op, "bias", *bias, DType::F32);
    check_shape(op, "bias", *bias, {E});
  }
  check_dtype(op, "topk_idx", topk_idx, DType::I32);
  check_shape(op, "topk_idx", topk_idx, {T, p.top_k});
  check_dtype(op, "topk_w", topk_w, DType::F32);
  check_shape(op, "topk_w", topk_w, {T, p.top_k});
  check_dtype(op, "scores", scores, DType::F32);
  check_shape(op, "scores", scores, {T, E});
  check_no_partial_alias(op, "scores", scores, "logits", logits);
  if (same_buffer(scores, logits)) KS_FAIL("ops::", op, ": scores must not alias logits");
  dispatch(op, kRouterFwd, {&logits, bias, &topk_idx, &topk_w, &scores}, logits, bias, p, topk_idx, topk_w, scores,
           replay);
}

void moe_router_bwd(const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_w, const Tensor& dtopk_w,
                    const MoeRouterConfig& cfg, Tensor& dlogits) {
  const char* op = "moe_router_bwd";
  const cpu::MoeRouterParams p = router_params(op, cfg);
  const int64_t E = p.num_experts, k = p.top_k;
  check_dtype(op, "scores", scores, DType::F32);
  check_shape(op, "scores", scores, {-1, E});
  const int64_t T = scores.size(0);
  check_dtype(op, "topk_idx", topk_idx, DType::I32);
  check_shape(op, "topk_idx", topk_idx, {T, k});
  check_dtype(op, "topk_w", topk_w, DType::F32);
  check_shape(op, "topk_w", topk_w, {T, k});
  check_dtype(op, "dtopk_w", dtopk_w, DType::F32);
  check_shape(op, "dtopk_w", dtopk_w, {T, k});
  check_dtype(op, "dlogits", dlogits, DType::F32);
  check_shape(op, "dlogits", dlogits, {T, E});
  dispatch(op, kRouterBwd, {&scores, &topk_idx, &topk_w, &dtopk_w, &dlogits}, scores, topk_idx, dtopk_w, p, dlogits);
}

// ---- load balancing ---------------------------------------------------------

double moe_aux_loss_fwd(const Tensor& logits, const Tensor& cu_groups, MoeScore score, int64_t top_k, double coeff,
                        Tensor& counts) {
  const char* op = "moe_aux_loss_fwd";
  check_logits(op, logits);
  check_top_k(op, top_k, logits.size(1));
  check_cu_groups(op, cu_groups);
  check_dtype(op, "counts", counts, DType::I32);
  check_shape(op, "counts", counts, {logits.size(1)});
  return dispatch(op, kAuxFwd, {&logits, &cu_groups, &counts}, logits, cu_groups, score_fn(score), top_k, coeff,
                  counts);
}

void moe_aux_loss_bwd(const Tensor& logits, const Tensor& cu_groups, MoeScore score, int64_t top_k, double coeff,
                      double scale, Tensor& dlogits) {
  const char* op = "moe_aux_loss_bwd";
  check_logits(op, logits);
  check_top_k(op, top_k, logits.size(1));
  check_cu_groups(op, cu_groups);
  check_dtype(op, "dlogits", dlogits, DType::F32);
  check_shape(op, "dlogits", dlogits, {logits.size(0), logits.size(1)});
  if (same_buffer(dlogits, logits)) KS_FAIL("ops::", op, ": dlogits must not alias logits");
  dispatch(op, kAuxBwd, {&logits, &cu_groups, &dlogits}, logits, cu_groups, score_fn(score), top_k, coeff, scale,
           dlogits);
}

double moe_z_loss_fwd(const Tensor& logits, double coeff) {
  const char* op = "moe_z_loss_fwd";
  check_logits(op, logits);
  return dispatch(op, kZFwd, {&logits}, logits, coeff);
}

void moe_z_loss_bwd(const Tensor& logits, double coeff, double scale, Tensor& dlogits) {
  const char* op = "moe_z_loss_bwd";
  check_logits(op, logits);
  check_dtype(op, "dlogits", dlogits, DType::F32);
  check_shape(op, "dlogits", dlogits, {logits.size(0), logits.size(1)});
  if (same_buffer(dlogits, logits)) KS_FAIL("ops::", op, ": dlogits must not alias logits");
  dispatch(op, kZBwd, {&logits, &dlogits}, logits, coeff, scale, dlogits);
}

void moe_update_expert_bias(Tensor& bias, const std::vector<int64_t>& load, double rate) {
  const char* op = "moe_update_expert_bias";
  check_dtype(op, "bias", bias, DType::F32);
  check_shape(op, "bias", bias, {int64_t(load.size())});
  if (load.empty()) KS_FAIL("ops::", op, ": no experts");
  if (!std::isfinite(rate) || rate < 0)
    KS_FAIL("ops::", op, ": the update rate (moe_router_bias_update_rate) must be a finite number >= 0, got ", rate);
  dispatch(op, kBiasUpdate, {&bias}, bias, load, rate);
}

// ---- capacity ---------------------------------------------------------------

int64_t moe_expert_capacity(int64_t T, int64_t top_k, int64_t num_experts, double capacity_factor) {
  if (T < 0 || top_k < 1 || num_experts < 1)
    KS_FAIL("ops::moe_expert_capacity: needs T >= 0, top_k >= 1, num_experts >= 1, got T = ", T, ", top_k = ", top_k,
            ", num_experts = ", num_experts);
  if (!(capacity_factor > 0) || !std::isfinite(capacity_factor))
    KS_FAIL("ops::moe_expert_capacity: capacity_factor must be a positive number, got ", capacity_factor);
  // Megatron's get_capacity(num_tokens = T * k): ceil((T*k / E) * factor), in double as Python computes it.
  return int64_t(std::ceil(double(T * top_k) / double(num_experts) * capacity_factor));
}

int64_t moe_drop_to_capacity(Tensor& topk_idx, Tensor& topk_w, int64_t num_experts, int64_t capacity,
                             MoeDropPolicy policy) {
  const char* op = "moe_drop_to_capacity";
  check_dtype(op, "topk_idx", topk_idx, DType::I32);
  check_shape(op, "topk_idx", topk_idx, {-1, -1});
  check_dtype(op, "topk_w", topk_w, DType::F32);
  check_shape(op, "topk_w", topk_w, {topk_idx.size(0), topk_idx.size(1)});
  if (num_experts < 1) KS_FAIL("ops::", op, ": num_experts must be >= 1, got ", num_experts);
  if (capacity < 0) KS_FAIL("ops::", op, ": capacity must be >= 0, got ", capacity);
  return dispatch(op, kDrop, {&topk_idx, &topk_w}, topk_idx, topk_w, num_experts, capacity,
                  policy == MoeDropPolicy::Probs);
}

// ---- permutation ------------------------------------------------------------

int64_t MoeRouting::rows() const {
  int64_t n = 0;
  for (int64_t s : group_sizes) n += s;
  return n;
}

MoeRouting moe_routing(const Tensor& topk_idx, int64_t num_experts, int64_t pad_to) {
  const char* op = "moe_routing";
  check_dtype(op, "topk_idx", topk_idx, DType::I32);
  check_shape(op, "topk_idx", topk_idx, {-1, -1});
  if (num_experts < 1) KS_FAIL("ops::", op, ": num_experts must be >= 1, got ", num_experts);
  if (pad_to < 0) KS_FAIL("ops::", op, ": pad_to must be >= 0 (0: no padding), got ", pad_to);
  const int64_t T = topk_idx.size(0), k = topk_idx.size(1), E = num_experts;
  const std::vector<int32_t> idx = topk_idx.to_host<int32_t>();  // [T, k]
  MoeRouting r;
  r.num_tokens = T;
  r.top_k = k;
  r.num_experts = E;
  r.group_sizes.assign(size_t(E), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = idx[size_t(i)];
    if (e < -1 || e >= E)
      KS_FAIL("ops::", op, ": topk_idx[", i / k, ", ", i % k, "] = ", e, " is not an expert in [0, ", E,
              ") nor -1 (dropped)");
    if (e >= 0) ++r.group_sizes[size_t(e)];
  }
  r.tokens_per_expert = r.group_sizes;  // before padding: the kept (token, slot) pairs
  if (pad_to > 0)
    for (int64_t e = 0; e < E; ++e) {
      if (r.group_sizes[size_t(e)] > pad_to)
        KS_FAIL("ops::", op, ": expert ", e, " has ", r.group_sizes[size_t(e)], " rows, more than pad_to = ", pad_to,
                "; drop to capacity (moe_drop_to_capacity) before padding to it");
      r.group_sizes[size_t(e)] = pad_to;
    }
  // Counting sort: each expert's rows start at the sum of the sizes before it;
  // walking (t, j) in order keeps every group in token order.
  std::vector<int64_t> next(size_t(E), 0);
  for (int64_t e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e - 1)] + r.group_sizes[size_t(e - 1)];
  const int64_t N = r.rows();
  std::vector<int32_t> dest(size_t(T * k), -1), source(size_t(N), -1);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = idx[size_t(i)];
    if (e < 0) continue;
    const int64_t row = next[size_t(e)]++;
    dest[size_t(i)] = int32_t(row);
    source[size_t(row)] = int32_t(i / k);
  }
  r.dest = index_tensor(dest, {T, k}, topk_idx.device());
  r.source = index_tensor(source, {N}, topk_idx.device());
  return r;
}

void moe_permute_fwd(const Tensor& x, const MoeRouting& r, Tensor& xs) {
  const char* op = "moe_permute_fwd";
  check_routing(op, r);
  check_float(op, "x", x);
  check_shape(op, "x", x, {r.num_tokens, -1});
  const int64_t D = x.size(1);
  check_shape(op, "xs", xs, {r.rows(), D});
  check_same_dtype(op, "xs", xs, "x", x);
  check_no_partial_alias(op, "xs", xs, "x", x);
  if (same_buffer(xs, x)) KS_FAIL("ops::", op, ": xs must not alias x");
  dispatch(op, kPermuteFwd, {&x, &r.source, &xs}, x, r.source, xs);
}

void moe_permute_bwd(const Tensor& dxs, const MoeRouting& r, Tensor& dx) {
  const char* op = "moe_permute_bwd";
  check_routing(op, r);
  check_float(op, "dxs", dxs);
  check_shape(op, "dxs", dxs, {r.rows(), -1});
  check_dtype(op, "dx", dx, DType::F32);
  check_shape(op, "dx", dx, {r.num_tokens, dxs.size(1)});
  check_no_partial_alias(op, "dx", dx, "dxs", dxs);
  if (same_buffer(dx, dxs)) KS_FAIL("ops::", op, ": dx must not alias dxs");
  dispatch(op, kPermuteBwd, {&dxs, &r.dest, &dx}, dxs, r.dest, dx);
}

void moe_unpermute_fwd(const Tensor& ys, const Tensor& topk_w, const MoeRouting& r, Tensor& y) {
  const char* op = "moe_unpermute_fwd";
  check_routing(op, r);
  check_float(op, "ys", ys);
  check_shape(op, "ys", ys, {r.rows(), -1});
  check_dtype(op, "topk_w", topk_w, DType::F32);
  check_shape(op, "topk_w", topk_w, {r.num_tokens, r.top_k});
  check_float(op, "y", y);
  check_shape(op, "y", y, {r.num_tokens, ys.size(1)});
  check_no_partial_alias(op, "y", y, "ys", ys);
  if (same_buffer(y, ys)) KS_FAIL("ops::", op, ": y must not alias ys");
  dispatch(op, kUnpermuteFwd, {&ys, &topk_w, &r.dest, &y}, ys, topk_w, r.dest, y);
}

void moe_unpermute_bwd(const Tensor& ys, const Tensor& topk_w, const Tensor& dy, const MoeRouting& r, Tensor& dys,
                       Tensor& dtopk_w) {
  const char* op = "moe_unpermute_bwd";
  check_routing(op, r);
  check_float(op, "ys", ys);
  check_shape(op, "ys", ys, {r.rows(), -1});
  const int64_t D = ys.size(1);
  check_dtype(op, "topk_w", topk_w, DType::F32);
  check_shape(op, "topk_w", topk_w, {r.num_tokens, r.top_k});
  check_float(op, "dy", dy);
  check_shape(op, "dy", dy, {r.num_tokens, D});
  check_dtype(op, "dys", dys, DType::F32);
  check_shape(op, "dys", dys, {r.rows(), D});
  check_dtype(op, "dtopk_w", dtopk_w, DType::F32);
  check_shape(op, "dtopk_w", dtopk_w, {r.num_tokens, r.top_k});
  check_no_partial_alias(op, "dys", dys, "ys", ys);
  if (same_buffer(dys, ys)) KS_FAIL("ops::", op, ": dys must not alias ys");
  dispatch(op, kUnpermuteBwd, {&ys, &topk_w, &dy, &r.dest, &r.source, &dys, &dtopk_w}, ys, topk_w, dy, r.dest, r.source,
           dys, dtopk_w);
}

// ---- grouped GEMM -----------------------------------------------------------

void grouped_linear_fwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        Tensor& y) {
  const char* op = "grouped_linear_fwd";
  check_float(op, "x", x);
  check_shape(op, "x", x, {-1, -1});
  check_float(op, "y", y);
  check_shape(op, "y", y, {x.size(0), -1});
  check_group_sizes(op, group_sizes, x.size(0));
  check_expert_weights(op, w, group_sizes.size(), x.size(1), y.size(1), x);
  check_no_partial_alias(op, "y", y, "x", x);
  if (same_buffer(y, x)) KS_FAIL("ops::", op, ": y must not alias x (the GEMM reads x while writing y)");
  dispatch(op, kGroupedFwd, {&x, &y}, x, group_sizes, w, y);
}

void grouped_linear_bwd(const Tensor& x, const std::vector<int64_t>& group_sizes, const std::vector<const Tensor*>& w,
                        const Tensor& dy, Tensor* dx, const std::vector<Tensor*>& dw) {
  const char* op = "grouped_linear_bwd";
  check_float(op, "dy", dy);
  check_shape(op, "dy", dy, {-1, -1});
  const int64_t N = dy.size(0), out = dy.size(1);
  check_group_sizes(op, group_sizes, N);
  if (w.empty() || !w[0]) KS_FAIL("ops::", op, ": w must hold one non-null weight per group");
  const int64_t in = w[0]->dim() == 2 ? w[0]->size(1) : -1;
  check_expert_weights(op, w, group_sizes.size(), in, out, dy);
  if (dx) {
    check_float(op, "dx", *dx);
    check_shape(op, "dx", *dx, {N, in});
    if (same_buffer(*dx, dy)) KS_FAIL("ops::", op, ": dx must not alias dy");
    if (dx->device() != dy.device()) KS_FAIL("ops::", op, ": dx and dy are on different devices");
  }
  if (!dw.empty()) {
    if (dw.size() != group_sizes.size())
      KS_FAIL("ops::", op, ": dw must be empty or hold one gradient per group (", group_sizes.size(), "), got ",
              dw.size());
    check_float(op, "x", x);
    check_shape(op, "x", x, {N, in});
    for (size_t e = 0; e < dw.size(); ++e) {
      if (!dw[e]) continue;  // a frozen expert
      const std::string name = "dw[" + std::to_string(e) + "]";
      check_dtype(op, name.c_str(), *dw[e], DType::F32);
      check_shape(op, name.c_str(), *dw[e], {out, in});
      if (dw[e]->device() != dy.device()) KS_FAIL("ops::", op, ": ", name, " and dy are on different devices");
    }
  }
  dispatch(op, kGroupedBwd, {&x, &dy, dx}, x, group_sizes, w, dy, dx, dw);
}

// ---- shared-expert gate -----------------------------------------------------

void sigmoid_gate_add_fwd(const Tensor& g, const Tensor& s, Tensor& y) {
  const char* op = "sigmoid_gate_add_fwd";
  check_float(op, "s", s);
  check_shape(op, "s", s, {-1, -1});
  const int64_t T = s.size(0), D = s.size(1);
  check_float(op, "g", g);
  check_shape(op, "g", g, {T, 1});
  check_float(op, "y", y);
  check_shape(op, "y", y, {T, D});
  check_no_partial_alias(op, "y", y, "s", s);
  if (same_buffer(y, s)) KS_FAIL("ops::", op, ": y must not alias s");
  check_no_partial_alias(op, "y", y, "g", g);
  dispatch(op, kGateFwd, {&g, &s, &y}, g, s, y);
}

void sigmoid_gate_add_bwd(const Tensor& g, const Tensor& s, const Tensor& dy, Tensor& ds, Tensor& dg) {
  const char* op = "sigmoid_gate_add_bwd";
  check_float(op, "s", s);
  check_shape(op, "s", s, {-1, -1});
  const int64_t T = s.size(0), D = s.size(1);
  check_float(op, "g", g);
  check_shape(op, "g", g, {T, 1});
  check_float(op, "dy", dy);
  check_shape(op, "dy", dy, {T, D});
  check_dtype(op, "ds", ds, DType::F32);
  check_shape(op, "ds", ds, {T, D});
  check_dtype(op, "dg", dg, DType::F32);
  check_shape(op, "dg", dg, {T, 1});
  if (same_buffer(ds, s)) KS_FAIL("ops::", op, ": ds must not alias s");
  dispatch(op, kGateBwd, {&g, &s, &dy, &ds, &dg}, g, s, dy, ds, dg);
}

}  // namespace kestrel::ops
