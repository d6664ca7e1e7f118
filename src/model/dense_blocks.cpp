#include "model/dense_blocks.h"

#include "model/train_exec.h"
#include "ops/ops.h"
#include "parallel/tp_attention.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {
bool has_o_bias(const io::ModelConfig& c) { return c.o_proj_bias; }
}  // namespace

// ---- attention ---------------------------------------------------------------

DenseAttention::DenseAttention(const io::ModelConfig& c, const BlockDims& dims, const std::string& p,
                               const ParamFactory& make)
    : dims_(dims), qk_norm_(c.qk_norm) {
  const int64_t D = c.hidden_size;
  q = make(p + "self_attn.q_proj.weight", {c.q_dim(), D}, true);
  k = make(p + "self_attn.k_proj.weight", {c.kv_dim(), D}, true);
  v = make(p + "self_attn.v_proj.weight", {c.kv_dim(), D}, true);
  o = make(p + "self_attn.o_proj.weight", {D, c.q_dim()}, true);
  if (c.attention_bias) {
    q_bias = make(p + "self_attn.q_proj.bias", {c.q_dim()}, false);
    k_bias = make(p + "self_attn.k_proj.bias", {c.kv_dim()}, false);
    v_bias = make(p + "self_attn.v_proj.bias", {c.kv_dim()}, false);
  }
  if (has_o_bias(c)) o_bias = make(p + "self_attn.o_proj.bias", {D}, false);
  if (c.qk_norm) {
    q_norm = make(p + "self_attn.q_norm.weight", {c.head_dim}, false);
    k_norm = make(p + "self_attn.k_norm.weight", {c.head_dim}, false);
  }
}

int64_t DenseAttention::param_count(const io::ModelConfig& c) {
  return 4 + (c.attention_bias ? 3 : 0) + (has_o_bias(c) ? 1 : 0) + (c.qk_norm ? 2 : 0);
}

void DenseAttention::append_params(std::vector<Param*>& out) {
  for (Param* p : {&q, &q_bias, &k, &k_bias, &v, &v_bias, &o, &o_bias, &q_norm, &k_norm})
    if (!p->name.empty()) out.push_back(p);  // allocated (its weight may be released)
}

Tensor DenseAttention::forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const {
  const int64_t Tp = ex.Tp, hd = dims_.hd, H = dims_.heads.n_heads, Hkv = dims_.heads.n_kv_heads;
  const DType dt = dims_.dtype;
  // [Tp, H*hd], [Tp, Hkv*hd]: this rank's heads (column-parallel, no communication).
  Tensor q_lin = ex.buffer(BlockBuf::QLin, {Tp, H * hd}, dt), k_lin = ex.buffer(BlockBuf::KLin, {Tp, Hkv * hd}, dt);
  A.v = ex.buffer(BlockBuf::V, {Tp, Hkv * hd}, dt);
  ex.linear(x, q.weight, bias_of(q_bias), q_lin);
  ex.linear(x, k.weight, bias_of(k_bias), k_lin);
  ex.linear(x, v.weight, bias_of(v_bias), A.v);
  if (qk_norm_) {
    A.q_lin = q_lin;
    A.k_lin = k_lin;
    A.q = ex.buffer(BlockBuf::Q, {Tp, H * hd}, dt);
    A.k = ex.buffer(BlockBuf::K, {Tp, Hkv * hd}, dt);
    A.rstd_q = ex.buffer(BlockBuf::RstdQ, {Tp * H}, DType::F32);
    A.rstd_k = ex.buffer(BlockBuf::RstdK, {Tp * Hkv}, DType::F32);
    Tensor qv = A.q.view({Tp * H, hd}), kv = A.k.view({Tp * Hkv, hd});
    ops::rmsnorm_fwd(q_lin.view({Tp * H, hd}), q_norm.weight, dims_.eps, qv, A.rstd_q);
    ops::rmsnorm_fwd(k_lin.view({Tp * Hkv, hd}), k_norm.weight, dims_.eps, kv, A.rstd_k);
  } else {
    A.q = q_lin;
    A.k = k_lin;
  }
  ops::rope_fwd(A.q, ex.positions, *ex.rope, H);
  ops::rope_fwd(A.k, ex.positions, *ex.rope, Hkv);
  A.attn = ex.attend(layer, A.q, A.k, A.v, ops::AttentionShape{H, Hkv, hd, 0.f}, A);  // [Tp, H*hd]
  // Context parallelism keeps what its backward needs in A.cp_attn (Ulysses:
  // the work layout's copies), so q, k, v go unless core_attn recompute
  // reruns the attention from them.
  if (A.cp_attn && !A.rc.core_attn) A.q = A.k = A.v = Tensor();
  Tensor out = ex.buffer(BlockBuf::O, {ex.Tl, dims_.D}, dt);
  ex.row_linear(A.attn, o.weight, bias_of(o_bias), out);
  if (A.rc.core_attn) {  // selective core_attn: rebuilt from q, k, v before o_proj's backward
    A.attn = Tensor();
    A.lse = Tensor();
    A.cp_attn.reset();
  }
  return out;
}

// k/v weights of a kv head replicated over several tp ranks: each replica
// holds the gradient of its own query heads only, so the replicas are summed.
void DenseAttention::kv_linear_bwd(TrainExec& ex, const Tensor& x, Param& w, Param& bias, const Tensor& dy,
                                   Tensor& dx) {
  if (dims_.heads.kv_replicas == 1) {
    ops::linear_bwd(x, w.weight, dy, &dx, &w.grad, grad_of(bias), /*accumulate_dx=*/true);
    return;
  }
  Tensor sw = ex.scratch(w.grad.shape(), DType::F32, /*zeroed=*/true);
  Tensor sb = bias.weight.defined() ? ex.scratch(bias.grad.shape(), DType::F32, /*zeroed=*/true) : Tensor();
  ops::linear_bwd(x, w.weight, dy, &dx, &sw, bias.weight.defined() ? &sb : nullptr, /*accumulate_dx=*/true);
  parallel::reduce_kv_replica_grad(ex.tp, dims_.heads, sw, w.grad);
  if (bias.weight.defined()) parallel::reduce_kv_replica_grad(ex.tp, dims_.heads, sb, bias.grad);
}

// x_mid = x_in + o(attn(rope(q), rope(k), v)); dy is d x_mid, dx the partial d of the normed input.
void DenseAttention::backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) {
  const int64_t T = ex.T, Tp = ex.Tp, hd = dims_.hd;
  const int64_t H = dims_.heads.n_heads, Hkv = dims_.heads.n_kv_heads;
  const bool tp_on = ex.tp.size() > 1;
  Tensor dattn = ex.grad_buf(GradBuf::DAttn, {Tp, H * hd});
  Tensor dq = ex.grad_buf(GradBuf::DQ, {Tp, H * hd}), dk = ex.grad_buf(GradBuf::DK, {Tp, Hkv * hd});
  Tensor dv = ex.grad_buf(GradBuf::DV, {Tp, Hkv * hd});
  // Selective core_attn: the forward's attention core again (the training
  // core does not depend on the layer index: no KV cache). Same kernel, same
  // q/k/v: the same attn and lse bits.
  if (A.rc.core_attn) ex.attend(0, A.q, A.k, A.v, ops::AttentionShape{H, Hkv, hd, 0.f}, A);
  parallel::row_linear_bwd(ex.tp, ex.sp, A.attn, o.weight, dy, &dattn, &o.grad, grad_of(o_bias));
  ex.attend_bwd(A, dattn, ops::AttentionShape{H, Hkv, hd, 0.f}, dq, dk, dv);
  if (A.rc.core_attn) {
    A.attn = Tensor();
    A.lse = Tensor();
    A.cp_attn.reset();
  }
  ops::rope_bwd(dq, ex.positions, *ex.rope, H);
  ops::rope_bwd(dk, ex.positions, *ex.rope, Hkv);
  Tensor dq_in = dq, dk_in = dk;  // gradients of the q/k projections' outputs
  if (qk_norm_) {
    const auto f32 = [&](Shape s) { return ex.scratch(std::move(s), DType::F32); };
    dq_in = f32({Tp, H * hd});
    dk_in = f32({Tp, Hkv * hd});
    Tensor dql = dq_in.view({Tp * H, hd}), dkl = dk_in.view({Tp * Hkv, hd});
    if (!tp_on) {
      ops::rmsnorm_bwd(A.q_lin.view({T * H, hd}), q_norm.weight, A.rstd_q, dq.view({T * H, hd}), dql, q_norm.grad);
      ops::rmsnorm_bwd(A.k_lin.view({T * Hkv, hd}), k_norm.weight, A.rstd_k, dk.view({T * Hkv, hd}), dkl,
                       k_norm.grad);
    } else {
      // Each rank normalises only its own heads: the per-head norm weights' grads are summed over tp.
      Tensor pq = ex.scratch({hd}, DType::F32, /*zeroed=*/true);
      Tensor pk = ex.scratch({hd}, DType::F32, /*zeroed=*/true);
      ops::rmsnorm_bwd(A.q_lin.view({Tp * H, hd}), q_norm.weight, A.rstd_q, dq.view({Tp * H, hd}), dql, pq);
      ops::rmsnorm_bwd(A.k_lin.view({Tp * Hkv, hd}), k_norm.weight, A.rstd_k, dk.view({Tp * Hkv, hd}), dkl, pk);
      parallel::reduce_replicated_grad(ex.tp, pq, q_norm.grad);
      parallel::reduce_replicated_grad(ex.tp, pk, k_norm.grad);
    }
  }
  // dx = dq Wq + dk Wk + dv Wv, the k and v terms summed by their GEMMs (beta = 1).
  ops::linear_bwd(A.norm1, q.weight, dq_in, &dx, &q.grad, grad_of(q_bias));
  kv_linear_bwd(ex, A.norm1, k, k_bias, dk_in, dx);
  kv_linear_bwd(ex, A.norm1, v, v_bias, dv, dx);
}

// ---- MLP ---------------------------------------------------------------------

DenseMlp::DenseMlp(const io::ModelConfig& c, const BlockDims& dims, const std::string& p, const ParamFactory& make)
    : dims_(dims) {
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  gate = make(p + "mlp.gate_proj.weight", {F, D}, true);
  up = make(p + "mlp.up_proj.weight", {F, D}, true);
  down = make(p + "mlp.down_proj.weight", {D, F}, true);
  if (c.mlp_bias) {
    gate_bias = make(p + "mlp.gate_proj.bias", {F}, false);
    up_bias = make(p + "mlp.up_proj.bias", {F}, false);
    down_bias = make(p + "mlp.down_proj.bias", {D}, false);
  }
}

int64_t DenseMlp::param_count(const io::ModelConfig& c) { return 3 + (c.mlp_bias ? 3 : 0); }

void DenseMlp::append_params(std::vector<Param*>& out) {
  for (Param* p : {&gate, &gate_bias, &up, &up_bias, &down, &down_bias})
    if (!p->name.empty()) out.push_back(p);  // allocated (its weight may be released)
}

Tensor DenseMlp::forward(BlockExec& ex, const Tensor& x, LayerActivations& A) const {
  const int64_t Tp = ex.Tp, F = dims_.F;
  const DType dt = dims_.dtype;
  A.gate = ex.buffer(BlockBuf::Gate, {Tp, F}, dt);  // [Tp, F/tp]
  A.up = ex.buffer(BlockBuf::Up, {Tp, F}, dt);
  ex.linear(x, gate.weight, bias_of(gate_bias), A.gate);
  ex.linear(x, up.weight, bias_of(up_bias), A.up);
  A.act = ex.buffer(BlockBuf::Act, {Tp, F}, dt);  // silu(gate) * up (may be gate itself in inference)
  ops::swiglu_fwd(A.gate, A.up, A.act);
  Tensor out = ex.buffer(BlockBuf::Mlp, {ex.Tl, dims_.D}, dt);
  ex.row_linear(A.act, down.weight, bias_of(down_bias), out);
  // Activation-function recompute drops act once down consumed it; selective
  // mlp drops gate and up too (rebuilt from norm2 in backward).
  if (A.rc.act || A.rc.mlp) A.act = Tensor();
  if (A.rc.mlp) A.gate = A.up = Tensor();
  return out;
}

// x_out = x_mid + down(silu(gate(n2)) * up(n2)); dy is d x_out, dx the partial d n2.
void DenseMlp::backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) {
  const int64_t Tp = ex.Tp, F = dims_.F;
  Tensor dF1 = ex.grad_buf(GradBuf::DF1, {Tp, F}), dF2 = ex.grad_buf(GradBuf::DF2, {Tp, F});
  Tensor dact = ex.grad_buf(GradBuf::DAct, {Tp, F});
  const DType dt = dims_.dtype;
  if (A.rc.mlp) {  // gate/up projections again, the forward's kernels on the same norm2
    A.gate = ex.buffer(BlockBuf::Gate, {Tp, F}, dt);
    A.up = ex.buffer(BlockBuf::Up, {Tp, F}, dt);
    ex.linear(A.norm2, gate.weight, bias_of(gate_bias), A.gate);
    ex.linear(A.norm2, up.weight, bias_of(up_bias), A.up);
  }
  if (A.rc.act || A.rc.mlp) {  // swiglu again, before the down projection's weight gradient reads it
    A.act = ex.buffer(BlockBuf::Act, {Tp, F}, dt);
    ops::swiglu_fwd(A.gate, A.up, A.act);
  }
  parallel::row_linear_bwd(ex.tp, ex.sp, A.act, down.weight, dy, &dact, &down.grad, grad_of(down_bias));
  if (A.rc.act || A.rc.mlp) A.act = Tensor();
  ops::swiglu_bwd(A.gate, A.up, dact, dF1, dF2);
  if (A.rc.mlp) A.gate = A.up = Tensor();
  ops::linear_bwd(A.norm2, gate.weight, dF1, &dx, &gate.grad, grad_of(gate_bias));
  ops::linear_bwd(A.norm2, up.weight, dF2, &dx, &up.grad, grad_of(up_bias), /*accumulate_dx=*/true);
}

}  // namespace kestrel::model
