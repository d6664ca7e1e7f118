#include "model/moe_mlp.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "model/train_exec.h"
#include "ops/copy.h"
#include "ops/moe.h"
#include "ops/ops.h"
#include "model/ep_state.h"
#include "parallel/ep_dispatch.h"
#include "parallel/etp_dispatch.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {


std::string shared_prefix(const io::ModelConfig& c) {
  // Qwen2-MoE names one shared expert, DeepSeek a block of n_shared_experts fused into one FFN.
  return c.arch == io::Arch::Qwen2Moe ? "mlp.shared_expert." : "mlp.shared_experts.";
}

}  // namespace

int64_t moe_layer_ordinal(const io::ModelConfig& cfg, int64_t layer) {
  if (!cfg.is_moe_layer(layer)) return -1;
  int64_t n = 0;
  for (int64_t i = 0; i < layer; ++i) n += cfg.is_moe_layer(i) ? 1 : 0;
  return n;
}

int64_t num_moe_layers(const io::ModelConfig& cfg) {
  int64_t n = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) n += cfg.is_moe_layer(i) ? 1 : 0;
  return n;
}

bool is_routed_expert_param(const std::string& name) { return routed_expert_index(name) >= 0; }

ops::MoeRouterConfig moe_router_config(const io::ModelConfig& cfg) {
  const auto& m = cfg.moe;
  ops::MoeRouterConfig r;
  r.num_experts = m.num_experts;
  r.top_k = m.top_k;
  r.score = m.sigmoid_scores ? ops::MoeScore::Sigmoid : ops::MoeScore::Softmax;
  using GL = io::MoeConfig::GroupLimit;
  r.group_limit = m.group_limit == GL::SumTop2 ? ops::MoeGroupLimit::SumTop2
                  : m.group_limit == GL::Max   ? ops::MoeGroupLimit::Max
                                               : ops::MoeGroupLimit::None;
  r.n_group = m.n_group;
  r.topk_group = m.topk_group;
  r.norm_topk_prob = m.norm_topk_prob;
  r.scaling_factor = m.routed_scaling_factor;
  return r;
}

MoeMlp::MoeMlp(const io::ModelConfig& c, const BlockDims& dims, int64_t layer, const std::string& p,
               const ParamFactory& make)
    : layer_(layer),
      ordinal_(moe_layer_ordinal(c, layer)),
      dims_(dims),
      rcfg_(moe_router_config(c)),
      E_(c.moe.num_experts),
      Fe_(c.moe.moe_intermediate_size),
      Fs_(c.moe.shared_intermediate_size),
      router_fp32_(c.moe.router_fp32 || dims.moe.router_logits_fp32),
      sh_gated_(c.moe.shared_expert_gate) {
  KS_CHECK(!c.mlp_bias, "not supported yet: MLP biases (mlp_bias) in a mixture-of-experts model");
  ep_ = std::max<int64_t>(1, dims.ep);
  KS_CHECK(E_ % ep_ == 0, "expert parallelism: num_experts ", E_, " of layer ", layer, " does not divide by "
           "expert_model_parallel_size ", ep_, "; choose a size dividing it");
  n_local_ = E_ / ep_;
  tp_ = std::max<int64_t>(1, dims.tp);
  etp_ = std::max<int64_t>(1, dims.etp);
  KS_CHECK(Fe_ % etp_ == 0, "expert tensor parallelism: moe_intermediate_size ", Fe_, " of layer ", layer,
           " must divide by expert_tensor_parallel_size ", etp_, " (each routed expert's FFN is split over it)");
  KS_CHECK(Fs_ % tp_ == 0, "tensor parallelism: the shared experts' intermediate size ", Fs_, " of layer ", layer,
           " must divide by tensor_model_parallel_size ", tp_, " (their FFN is split over it)");
  KS_CHECK(!(dims.moe.hierarchical_alltoallv && dims.moe.dispatcher == MoeDispatcher::AllGather),
           "moe_hierarchical_alltoallv=true exchanges the alltoall dispatcher's rows and "
           "moe_token_dispatcher_type=allgather has no all-to-all: set moe_token_dispatcher_type=alltoall or "
           "moe_hierarchical_alltoallv=false");
  first_local_ = dims.ep_rank * n_local_;
  const int64_t D = c.hidden_size;
  // A frozen router (freeze_moe_router) gets no gradient and no weight decay: it stays as loaded.
  router = make(p + "mlp.gate.weight", {E_, D}, !dims.moe.freeze_router);
  gate.reserve(size_t(E_));
  up.reserve(size_t(E_));
  down.reserve(size_t(E_));
  for (int64_t e = 0; e < E_; ++e) {
    if (!local_expert(e)) {  // another expert-parallel rank's
      gate.emplace_back();
      up.emplace_back();
      down.emplace_back();
      continue;
    }
    const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
    gate.push_back(make(ep + "gate_proj.weight", {Fe_, D}, true));
    up.push_back(make(ep + "up_proj.weight", {Fe_, D}, true));
    down.push_back(make(ep + "down_proj.weight", {D, Fe_}, true));
  }
  if (Fs_ > 0) {
    const std::string sp = p + shared_prefix(c);
    sh_gate = make(sp + "gate_proj.weight", {Fs_, D}, true);
    sh_up = make(sp + "up_proj.weight", {Fs_, D}, true);
    sh_down = make(sp + "down_proj.weight", {D, Fs_}, true);
    if (sh_gated_) sh_gate_logit = make(p + "mlp.shared_expert_gate.weight", {1, D}, true);
  }
  if (c.moe.score_correction_bias) {
    // A buffer in HF (not trained by the optimizer) and kept in f32 in every
    // precision, as HF keeps it (_keep_in_fp32_modules_strict) and Megatron its expert bias.
    bias_.name = p + "mlp.gate.e_score_correction_bias";
    bias_.full_shape = {E_};
    bias_.weight = Tensor::zeros({E_}, DType::F32, MemCategory::Params, dims.device);
    bias_.weight_decay = false;
  }
}

int64_t MoeMlp::param_count(const io::ModelConfig& c) {
  const bool shared = c.moe.shared_intermediate_size > 0;
  return 1 + 3 * c.moe.num_experts + (shared ? 3 : 0) + (shared && c.moe.shared_expert_gate ? 1 : 0);
}

void MoeMlp::append_params(std::vector<Param*>& out) {
  out.push_back(&router);
  for (int64_t e = first_local_; e < first_local_ + n_local_; ++e)
    for (Param* q : {&gate[size_t(e)], &up[size_t(e)], &down[size_t(e)]}) out.push_back(q);
  for (Param* q : {&sh_gate, &sh_up, &sh_down, &sh_gate_logit})
    if (!q->name.empty()) out.push_back(q);
}

void MoeMlp::append_buffers(std::vector<Param*>& out) {
  if (!bias_.name.empty()) out.push_back(&bias_);
}

std::vector<const Tensor*> MoeMlp::expert_weights(const std::vector<Param>& ps) const {
  std::vector<const Tensor*> w;
  w.reserve(size_t(n_local_));
  for (int64_t e = first_local_; e < first_local_ + n_local_; ++e) w.push_back(&ps[size_t(e)].weight);
  return w;
}

const comm::HierarchicalA2a* MoeMlp::ep_hier(const BlockExec& ex) const {
  if (!dims_.moe.hierarchical_alltoallv) return nullptr;
  KS_CHECK(ex.ep_hier, "layer ", layer_, ": moe_hierarchical_alltoallv=true needs the ep group's hierarchical "
           "exchange (ModelParallel::ep_hier, built by model::set_expert_dispatch)");
  // On one node the three steps would only route every row through the leader: the flat exchange is the same.
  if (!ex.ep_hier->worth_it()) return nullptr;
  // Its leaders regroup the rows in host buffers (comm/hierarchical_a2a.cpp).
  KS_CHECK(ex.device == Device::CPU, "layer ", layer_, ": not supported yet: moe_hierarchical_alltoallv=true across ",
           ex.ep_hier->nodes(), " nodes with the model on ", device_name(ex.device), " (its leaders regroup the rows "
           "in host memory): set moe_hierarchical_alltoallv=false; the flat all-to-all runs over NCCL");
  return ex.ep_hier;
}

Tensor MoeMlp::ep_dispatch(BlockExec& ex, const LayerActivations& A, const Tensor& rows) const {
  return parallel::ep_dispatch(*ex.ep, *A.moe.ep, rows, ep_hier(ex));
}

Tensor MoeMlp::ep_combine(BlockExec& ex, const LayerActivations& A, const Tensor& rows) const {
  return parallel::ep_combine(*ex.ep, *A.moe.ep, rows, ep_hier(ex));
}

void MoeMlp::route(BlockExec& ex, const Tensor& x, LayerActivations& A) const {
  MoeActivations& M = A.moe;
  const int64_t T = x.size(0), k = rcfg_.top_k;
  // [T, E]: DeepSeek's router runs in f32 (HF casts x and the weight to f32);
  // Qwen's in the model dtype, its softmax then in f32.
  M.logits = ex.scratch({T, E_}, router_fp32_ ? DType::F32 : dims_.dtype);
  ex.linear(x, router.weight, nullptr, M.logits);
  M.topk_idx = ex.scratch({T, k}, DType::I32);
  M.topk_w = ex.scratch({T, k}, DType::F32);
  M.scores = ex.scratch({T, E_}, DType::F32);
  const bool replay = ex.routing_replay != nullptr;
  if (replay) {
    const Tensor& r = *ex.routing_replay;  // [T, n_moe_layers, k] (or [Tp, ...]: the padding rows are not read)
    KS_CHECK(r.dim() == 3 && (r.size(0) == T || r.size(0) == ex.Tp) && r.size(2) == k && ordinal_ < r.size(1) &&
                 r.dtype() == DType::I32,
             "routing replay of layer ", layer_, ": expected i32 [", T, ", n_moe_layers, ", k, "], got ",
             r.describe());
    ops::copy_cols(r.view({r.size(0), r.size(1) * k}).slice_rows(0, T), ordinal_ * k, M.topk_idx, 0, k);
  }
  ops::moe_router_fwd(M.logits, bias_.weight.defined() ? &bias_.weight : nullptr, rcfg_, M.topk_idx, M.topk_w,
                      M.scores, replay);
  if (ex.routing_record) {
    Tensor& rec = *ex.routing_record;
    KS_CHECK(rec.dim() == 3 && (rec.size(0) == T || rec.size(0) == ex.Tp) && rec.size(2) == k &&
                 ordinal_ < rec.size(1),
             "routing record of layer ", layer_, ": expected i32 [", T, ", n_moe_layers, ", k, "], got ",
             rec.describe());
    Tensor flat = rec.view({rec.size(0), rec.size(1) * k}).slice_rows(0, T);
    ops::copy_cols(M.topk_idx, 0, flat, ordinal_ * k, k);
  }
  int64_t dropped = 0, pad_to = 0;
  const MoeTrainOptions& o = dims_.moe;
  if (ex.apply_capacity && o.capacity_factor > 0) {
    const int64_t cap = ops::moe_expert_capacity(T, k, E_, o.capacity_factor);
    // The router's backward needs the choice before the drop: its
    // normalisation saw the dropped experts' scores (ops::moe_router_bwd).
    M.chosen_idx = M.topk_idx.clone(MemCategory::Activations);
    dropped = ops::moe_drop_to_capacity(M.topk_idx, M.topk_w, E_, cap, o.drop_policy);
    if (o.pad_to_capacity) pad_to = cap;
  }
  // Under tp every rank routed every real token alike; it runs the experts on
  // its own rows only (the statistics count them all, as one process).
  const bool split = M.row_lo != 0 || M.row_hi != T;
  M.routing = ops::moe_routing(split ? M.topk_idx.slice_rows(M.row_lo, M.row_hi) : M.topk_idx, E_, pad_to);
  if (!ex.moe_stats) return;
  const std::vector<int64_t> tokens_per_expert =
      split ? ops::moe_routing(M.topk_idx, E_).tokens_per_expert : M.routing.tokens_per_expert;
  auto& layers = ex.moe_stats->layers;
  auto it = std::find_if(layers.begin(), layers.end(), [&](const MoeLayerStats& s) { return s.layer == layer_; });
  if (it == layers.end()) {
    layers.push_back(MoeLayerStats{layer_, std::vector<int64_t>(size_t(E_), 0), 0, 0, 0, 0, 0});
    it = layers.end() - 1;
  }
  for (int64_t e = 0; e < E_; ++e) it->tokens_per_expert[size_t(e)] += tokens_per_expert[size_t(e)];
  it->dropped += dropped;
  it->tokens += T;
  it->micro_batches += 1;
  double aux = 0, z = 0;
  router_losses(ex, A, &aux, &z);
  it->aux_loss += aux;
  it->z_loss += z;
}

namespace {
// The row ranges of the load-balancing loss: the whole micro-batch, or each sequence.
Tensor aux_groups(const MoeTrainOptions& o, const Tensor& cu_seqlens, int64_t T) {
  if (o.load_balancing_type == "seq_aux_loss") return cu_seqlens;
  // MemCategory::Other, as the memory plan counts it (rl/memory_plan_*: 8 bytes at the router backward).
  return Tensor::from_host(std::vector<int32_t>{0, int32_t(T)}, {2}, MemCategory::Other, cu_seqlens.device());
}
bool aux_on(const MoeTrainOptions& o) { return o.aux_loss_coeff > 0 && o.load_balancing_type != "none"; }
}  // namespace

void MoeMlp::router_losses(BlockExec& ex, const LayerActivations& A, double* aux, double* z) const {
  const MoeTrainOptions& o = dims_.moe;
  const int64_t T = A.moe.logits.size(0);
  if (aux_on(o)) {
    KS_CHECK(ex.cu_seqlens.defined(), "internal: the load-balancing loss needs the batch's sequences");
    Tensor counts = ex.scratch({E_}, DType::I32);
    *aux = ops::moe_aux_loss_fwd(A.moe.logits, aux_groups(o, ex.cu_seqlens, T), rcfg_.score, rcfg_.top_k,
                                 o.aux_loss_coeff, counts);
  }
  if (o.z_loss_coeff > 0) *z = ops::moe_z_loss_fwd(A.moe.logits, o.z_loss_coeff);
}

std::pair<int64_t, int64_t> MoeMlp::own_rows(const BlockExec& ex, int64_t rows) const {
  if (!ex.seq_tp) return {0, rows};
  const int64_t lo = std::min(rows, ex.seq_tp->rank() * ex.Tl);
  return {lo, std::min(rows, lo + ex.Tl)};
}

Tensor MoeMlp::forward(BlockExec& ex, const Tensor& x, LayerActivations& A) const {
  const int64_t Tp = ex.Tp, Tr = ex.real_tokens(), D = dims_.D, Fe = Fe_ / etp_, Fs = Fs_ / tp_;
  const DType dt = dims_.dtype;
  comm::ProcessGroup* tp = ex.seq_tp;
  // Under tp: sequence parallelism (training; each rank its rows), or every
  // row on every rank (the rollout; the experts split over that same group).
  comm::ProcessGroup* rep = ex.replicated_tp;
  KS_CHECK(tp_ == 1 || (tp && tp->size() == tp_) || (rep && rep->size() == tp_), "layer ", layer_,
           ": a mixture-of-experts model trains with tensor_model_parallel_size ", tp_, " under sequence "
           "parallelism only (as in Megatron): set actor_rollout_ref.actor.megatron.sequence_parallel=true");
  KS_CHECK(!rep || etp_ == tp_, "layer ", layer_, ": not supported yet: a rollout with experts split over "
           "expert_tensor_parallel_size ", etp_, " other than its tensor_model_parallel_size ", tp_);
  KS_CHECK(rep || ((etp_ > 1) == (ex.etp != nullptr) && (!ex.etp || ex.etp->size() == etp_)), "layer ", layer_,
           ": experts split over expert_tensor_parallel_size ", etp_, " need the execution's etp group "
           "(ModelParallel::etp)");
  MoeActivations& M = A.moe;
  std::tie(M.row_lo, M.row_hi) = own_rows(ex, Tr);
  route(ex, Tr == Tp ? x : x.slice_rows(0, Tr), A);
  // This rank's rows to their experts: [N, D] sorted by expert.
  const Tensor x_own = M.row_lo == 0 && M.row_hi == Tp ? x : x.slice_rows(M.row_lo, M.row_hi);
  const int64_t N = M.routing.rows();
  M.xs = ex.scratch({N, D}, dt);
  ops::moe_permute_fwd(x_own, M.routing, M.xs);
  if (ep_ > 1) {  // the rows go to their experts' ranks: [Nr, D] sorted by local expert
    KS_CHECK(ex.ep && ex.ep->size() == ep_, "layer ", layer_, ": expert parallelism over ", ep_,
             " ranks needs the execution's ep group (ModelParallel::ep)");
    const auto kind = dims_.moe.dispatcher == MoeDispatcher::AllGather ? parallel::EpDispatcher::AllGather
                                                                        : parallel::EpDispatcher::AllToAll;
    M.ep = std::make_shared<parallel::EpLayout>(
        parallel::ep_dispatch_layout(*ex.ep, M.routing.group_sizes, kind, M.xs.device()));
    M.xs = ep_dispatch(ex, A, M.xs);
  }
  if (ex.etp && !rep) {  // every etp rank's rows of these experts: each rank runs its shard of the FFNs on all of them
    M.etp = std::make_shared<parallel::EtpLayout>(
        parallel::etp_layout(*ex.etp, ep_ > 1 ? M.ep->local_group_sizes : M.routing.group_sizes, M.xs.device()));
    M.xs = parallel::etp_gather(*ex.etp, *M.etp, M.xs);
  }
  const std::vector<int64_t>& gs = expert_group_sizes(M);
  const int64_t Nr = M.xs.size(0);  // the rows this rank's experts run (N without expert or tensor parallelism)
  M.gate = ex.scratch({Nr, Fe}, dt);
  M.up = ex.scratch({Nr, Fe}, dt);
  ops::grouped_linear_fwd(M.xs, gs, expert_weights(gate), M.gate);
  ops::grouped_linear_fwd(M.xs, gs, expert_weights(up), M.up);
  M.act = ex.scratch({Nr, Fe}, dt);
  ops::swiglu_fwd(M.gate, M.up, M.act);
  M.ys = ex.scratch({Nr, D}, dt);
  ops::grouped_linear_fwd(M.act, gs, expert_weights(down), M.ys);
  // This rank's rows summed over the shards (replicated rows: the partial sums stay, reduced with the output).
  if (M.etp) M.ys = parallel::etp_reduce_scatter(*ex.etp, *M.etp, M.ys);
  if (ep_ > 1) M.ys = ep_combine(ex, A, M.ys);  // back to this rank's [N, D]
  Tensor out = ex.buffer(BlockBuf::Mlp, {ex.Tl, D}, dt);  // [Tl, D]
  if (!tp) {
    ops::moe_unpermute_fwd(M.ys, M.topk_w, M.routing, out);
  } else {  // this rank's rows lead its Tl; padding rows are zero
    ops::zero(out);
    Tensor mine = out.slice_rows(0, M.row_hi - M.row_lo);
    ops::moe_unpermute_fwd(M.ys, M.topk_w.slice_rows(M.row_lo, M.row_hi), M.routing, mine);
  }
  if (Fs_ > 0) {  // under tp column/row parallel like the dense MLP: sh_out is this rank's partial sum
    M.sh_gate = ex.scratch({Tp, Fs}, dt);
    M.sh_up = ex.scratch({Tp, Fs}, dt);
    ex.linear(x, sh_gate.weight, nullptr, M.sh_gate);
    ex.linear(x, sh_up.weight, nullptr, M.sh_up);
    M.sh_act = ex.scratch({Tp, Fs}, dt);
    ops::swiglu_fwd(M.sh_gate, M.sh_up, M.sh_act);
    M.sh_out = ex.scratch({Tp, D}, dt);
    ex.linear(M.sh_act, sh_down.weight, nullptr, M.sh_out);
    if (sh_gated_) {
      M.sh_gate_logit = ex.scratch({Tp, 1}, dt);
      ex.linear(x, sh_gate_logit.weight, nullptr, M.sh_gate_logit);
    }
    if (!tp) {  // (replicated rows: sh_out, like the routed part, is this rank's partial sum)
      if (sh_gated_) ops::sigmoid_gate_add_fwd(M.sh_gate_logit, M.sh_out, out);
      else ops::add(out, M.sh_out, out);
    } else {
      Tensor part = M.sh_out;
      if (sh_gated_) {  // sigmoid(g) * sum of partials = sum of sigmoid(g) * partial
        part = ex.scratch({Tp, D}, dt, /*zeroed=*/true);
        ops::sigmoid_gate_add_fwd(M.sh_gate_logit, M.sh_out, part);
      }
      ops::add(out, parallel::reduce_scatter_sequence(*tp, part), out);
    }
  }
  if (rep) reduce_replicated(*rep, out);  // the routed and shared experts' partial sums
  // Activation-function recompute: the SwiGLU outputs are rebuilt in backward.
  if (A.rc.act) M.act = M.sh_act = Tensor();
  return out;
}

void MoeMlp::reduce_replicated(comm::ProcessGroup& tp, Tensor& out) const {
  if (out.dtype() == DType::F32) return tp.all_reduce(out, comm::ReduceOp::Sum);
  // bf16: the partial sums reduced in f32 and rounded once, as the rollout's row-parallel GEMMs do.
  Tensor sum = out.to(DType::F32, MemCategory::Activations);
  tp.all_reduce(sum, comm::ReduceOp::Sum);
  out.copy_from(sum);
}

const std::vector<int64_t>& MoeMlp::expert_group_sizes(const MoeActivations& M) const {
  if (M.etp) return M.etp->group_sizes;
  return ep_ > 1 ? M.ep->local_group_sizes : M.routing.group_sizes;
}

// y = unpermute(experts(permute(x)), w) + shared(x); dy is d y, dx (written) the d of the normed input x.
// Under tp: dy [Tl, D] is this rank's rows; dx [Tp, D] its partial (the caller reduce-scatters it).
void MoeMlp::backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) {
  MoeActivations& M = A.moe;
  const Tensor& x = A.norm2;  // [Tp, D] the MLP's input
  comm::ProcessGroup* tp = ex.seq_tp;
  const int64_t Tp = ex.Tp, Tr = M.topk_idx.size(0), D = dims_.D, N = M.routing.rows(), k = rcfg_.top_k;
  const int64_t Fe = Fe_ / etp_, Fs = Fs_ / tp_, lo = M.row_lo, hi = M.row_hi;
  // Under expert (tensor) parallelism the experts' rows are the received (gathered) ones: [Nr, ...].
  const std::vector<int64_t>& gs = expert_group_sizes(M);
  const int64_t Nr = M.xs.size(0);
  const DType dt = dims_.dtype;
  KS_CHECK(!ex.replicated_tp, "internal: the MoE backward under tp runs with sequence parallelism");
  if (A.rc.act) {  // the forward's SwiGLU again, on the same gate/up
    M.act = ex.scratch({Nr, Fe}, dt);
    ops::swiglu_fwd(M.gate, M.up, M.act);
    if (Fs_ > 0) {
      M.sh_act = ex.scratch({Tp, Fs}, dt);
      ops::swiglu_fwd(M.sh_gate, M.sh_up, M.sh_act);
    }
  }
  // Routed experts, back through the combine, the down, SwiGLU and gate/up
  // projections and the permutation.
  Tensor dys = ex.scratch({N, D}, DType::F32), dw = ex.scratch({hi - lo, k}, DType::F32);
  if (!tp) {
    ops::moe_unpermute_bwd(M.ys, M.topk_w, dy, M.routing, dys, dw);
  } else {
    const Tensor dy_own = dy.slice_rows(0, hi - lo);
    ops::moe_unpermute_bwd(M.ys, M.topk_w.slice_rows(lo, hi), dy_own, M.routing, dys, dw);
  }
  if (ep_ > 1) dys = ep_dispatch(ex, A, dys);  // the combine's adjoint: to the experts' ranks, [Nr, D]
  if (M.etp) dys = parallel::etp_gather(*ex.etp, *M.etp, dys);  // the reduce-scatter's adjoint
  const auto grads = [&](std::vector<Param>& ps) {
    std::vector<Tensor*> g;
    for (int64_t e = first_local_; e < first_local_ + n_local_; ++e) g.push_back(&ps[size_t(e)].grad);
    return g;
  };
  Tensor dact = ex.scratch({Nr, Fe}, DType::F32);
  ops::grouped_linear_bwd(M.act, gs, expert_weights(down), dys, &dact, grads(down));
  dys = Tensor();
  Tensor dg = ex.scratch({Nr, Fe}, DType::F32), du = ex.scratch({Nr, Fe}, DType::F32);
  ops::swiglu_bwd(M.gate, M.up, dact, dg, du);
  dact = Tensor();
  Tensor dxs = ex.scratch({Nr, D}, DType::F32), tmp_s = ex.scratch({Nr, D}, DType::F32);
  ops::grouped_linear_bwd(M.xs, gs, expert_weights(gate), dg, &dxs, grads(gate));
  ops::grouped_linear_bwd(M.xs, gs, expert_weights(up), du, &tmp_s, grads(up));
  ops::add_inplace(dxs, tmp_s);
  if (M.etp) dxs = parallel::etp_reduce_scatter(*ex.etp, *M.etp, dxs);  // the gather's adjoint: this rank's rows
  if (ep_ > 1) dxs = ep_combine(ex, A, dxs);  // the dispatch's adjoint: back to this rank's [N, D]
  if (!tp) {
    ops::moe_permute_bwd(dxs, M.routing, dx);  // written: dx starts here
  } else {
    ops::zero(dx);
    Tensor dx_own = dx.slice_rows(lo, hi);
    ops::moe_permute_bwd(dxs, M.routing, dx_own);
  }
  // A replicated tensor's contribution [rows, D] to dx: the same on every tp
  // rank, so each adds its own sequence-parallel rows once.
  const auto add_replicated = [&](const Tensor& t) {
    if (!tp) return ops::add_inplace(dx, t);
    const auto [a, b] = own_rows(ex, t.size(0));
    if (b <= a) return;
    Tensor d = dx.slice_rows(a, b);
    ops::add_inplace(d, t.slice_rows(a, b));
  };
  Tensor tmp = ex.scratch({Tp, D}, DType::F32);
  // Shared experts (under tp: dy of every row, column/row parallel like the dense MLP).
  if (Fs_ > 0) {
    const Tensor dy_all = tp ? parallel::gather_sequence(*tp, dy) : dy;  // [Tp, D]
    Tensor ds = dy_all;  // d of the shared output
    if (sh_gated_) {
      ds = ex.scratch({Tp, D}, DType::F32);
      Tensor dgl = ex.scratch({Tp, 1}, DType::F32);
      ops::sigmoid_gate_add_bwd(M.sh_gate_logit, M.sh_out, dy_all, ds, dgl);
      if (tp) tp->all_reduce(dgl);  // sh_out was this rank's partial sum
      ops::linear_bwd(x, sh_gate_logit.weight, dgl, &tmp, &sh_gate_logit.grad, nullptr);
      add_replicated(tmp);
    }
    Tensor dsa = ex.scratch({Tp, Fs}, DType::F32);
    ops::linear_bwd(M.sh_act, sh_down.weight, ds, &dsa, &sh_down.grad, nullptr);
    Tensor dsg = ex.scratch({Tp, Fs}, DType::F32), dsu = ex.scratch({Tp, Fs}, DType::F32);
    ops::swiglu_bwd(M.sh_gate, M.sh_up, dsa, dsg, dsu);
    ops::linear_bwd(x, sh_gate.weight, dsg, &tmp, &sh_gate.grad, nullptr);
    ops::add_inplace(dx, tmp);
    ops::linear_bwd(x, sh_up.weight, dsu, &tmp, &sh_up.grad, nullptr);
    ops::add_inplace(dx, tmp);
  }
  if (A.rc.act) M.act = M.sh_act = Tensor();
  // The router: the combine weights' gradient (every rank's rows: under tp
  // gathered, so each rank's router backward is one process's), plus the
  // load-balancing and z losses'.
  Tensor dw_all = dw;  // [Tr, k]
  if (tp) {
    Tensor block = ex.scratch({ex.Tl, k}, DType::F32);
    ops::pad_rows(dw, block);
    dw_all = parallel::gather_sequence(*tp, block).slice_rows(0, Tr);
  }
  Tensor dlogits = ex.scratch({Tr, E_}, DType::F32, /*zeroed=*/true);
  ops::moe_router_bwd(M.scores, M.chosen_idx.defined() ? M.chosen_idx : M.topk_idx, M.topk_w, dw_all, rcfg_, dlogits);
  const MoeTrainOptions& o = dims_.moe;
  if (aux_on(o))
    ops::moe_aux_loss_bwd(M.logits, aux_groups(o, ex.batch.cu_seqlens, Tr), rcfg_.score, rcfg_.top_k,
                          o.aux_loss_coeff, ex.moe_loss_scale, dlogits);
  if (o.z_loss_coeff > 0) ops::moe_z_loss_bwd(M.logits, o.z_loss_coeff, ex.moe_loss_scale, dlogits);
  Tensor tmp_r = Tr == Tp ? tmp : ex.scratch({Tr, D}, DType::F32);
  ops::linear_bwd(Tr == Tp ? x : x.slice_rows(0, Tr), router.weight, dlogits, &tmp_r,
                  o.freeze_router ? nullptr : &router.grad, nullptr);
  add_replicated(tmp_r);
}

void MoeMlp::update_correction_bias(const std::vector<int64_t>& load, double rate) {
  KS_CHECK(bias_.weight.defined(), "layer ", layer_, " has no e_score_correction_bias to update");
  KS_CHECK(int64_t(load.size()) == E_, "expert load of ", load.size(), " experts for ", E_);
  ops::moe_update_expert_bias(bias_.weight, load, rate);
}

}  // namespace kestrel::model
