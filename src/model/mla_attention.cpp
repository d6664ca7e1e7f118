#include "model/mla_attention.h"

#include "model/train_exec.h"
#include "ops/copy.h"
#include "ops/ops.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {
// The gradient of a replicated tensor inside the tp region: under tp each
// rank sees only its heads' part (a partial sum), summed over the group into
// the grad; at tp = 1 the grad itself.
struct ReplicatedGrad {
  ReplicatedGrad(comm::ProcessGroup& tp, Tensor* grad) : tp_(tp), grad_(grad) {
    if (grad_ && tp_.size() > 1)
      part_ = Tensor::zeros(grad_->shape(), DType::F32, MemCategory::Activations, grad_->device());
  }
  Tensor* get() { return !grad_ ? nullptr : part_.defined() ? &part_ : grad_; }
  void reduce() {
    if (part_.defined()) parallel::reduce_replicated_grad(tp_, part_, *grad_);
  }
  comm::ProcessGroup& tp_;
  Tensor* grad_;
  Tensor part_;
};
}  // namespace

MlaAttention::MlaAttention(const io::ModelConfig& c, const BlockDims& dims, const std::string& p,
                           const ParamFactory& make)
    : dims_(dims), q_lora_(c.mla.q_lora_rank) {
  const auto& m = c.mla;
  // Under tensor parallelism this rank holds H / tp heads: q_b_proj (or
  // q_proj) and kv_b_proj split by output rows, o_proj by input columns, as
  // Megatron's MLA; the down projections and their norms are replicated.
  const int64_t D = c.hidden_size, H = c.num_attention_heads, qk = m.qk_head_dim();
  shape_.n_heads = dims.heads.n_heads;
  shape_.kv_lora_rank = m.kv_lora_rank;
  shape_.qk_nope_head_dim = m.qk_nope_head_dim;
  shape_.qk_rope_head_dim = m.qk_rope_head_dim;
  shape_.v_head_dim = m.v_head_dim;
  shape_.scale = float(m.softmax_scale);
  const std::string a = p + "self_attn.";
  if (q_lora_ > 0) {
    q_a = make(a + "q_a_proj.weight", {q_lora_, D}, true);
    if (c.attention_bias) q_a_bias = make(a + "q_a_proj.bias", {q_lora_}, false);
    q_a_norm = make(a + "q_a_layernorm.weight", {q_lora_}, false);
    q_b = make(a + "q_b_proj.weight", {H * qk, q_lora_}, true);
  } else {
    q_proj = make(a + "q_proj.weight", {H * qk, D}, true);
  }
  kv_a = make(a + "kv_a_proj_with_mqa.weight", {shape_.latent_dim(), D}, true);
  if (c.attention_bias) kv_a_bias = make(a + "kv_a_proj_with_mqa.bias", {shape_.latent_dim()}, false);
  kv_a_norm = make(a + "kv_a_layernorm.weight", {m.kv_lora_rank}, false);
  kv_b = make(a + "kv_b_proj.weight", {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}, true);
  o = make(a + "o_proj.weight", {D, H * m.v_head_dim}, true);
  if (c.attention_bias) o_bias = make(a + "o_proj.bias", {D}, false);
}

int64_t MlaAttention::param_count(const io::ModelConfig& c) {
  const int64_t q = c.mla.q_lora_rank > 0 ? 3 + (c.attention_bias ? 1 : 0) : 1;
  return q + 4 + (c.attention_bias ? 2 : 0);
}

void MlaAttention::append_params(std::vector<Param*>& out) {
  for (Param* p : {&q_proj, &q_a, &q_a_bias, &q_a_norm, &q_b, &kv_a, &kv_a_bias, &kv_a_norm, &kv_b, &o, &o_bias})
    if (!p->name.empty()) out.push_back(p);
}

ops::AttentionShape MlaAttention::attn_shape() const {
  ops::AttentionShape s;
  s.n_heads = s.n_kv_heads = shape_.n_heads;
  s.head_dim = shape_.qk_nope_head_dim + shape_.qk_rope_head_dim;
  s.v_head_dim = shape_.v_head_dim;
  s.scale = shape_.scale;
  return s;
}

Tensor MlaAttention::forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const {
  const int64_t T = ex.Tp, H = shape_.n_heads, nope = shape_.qk_nope_head_dim, rope = shape_.qk_rope_head_dim;
  const int64_t vd = shape_.v_head_dim, kvl = shape_.kv_lora_rank, qk = nope + rope;
  const DType dt = dims_.dtype;
  MlaActivations& M = A.mla;
  // Queries [T, H*qk]: through the compressed q latent and its norm, or directly.
  Tensor q = ex.buffer(BlockBuf::Q, {T, H * qk}, dt);
  if (q_lora_ > 0) {
    M.cq = ex.buffer(BlockBuf::MlaCq, {T, q_lora_}, dt);
    ex.linear(x, q_a.weight, bias_of(q_a_bias), M.cq);
    M.cq_n = ex.buffer(BlockBuf::MlaCqN, {T, q_lora_}, dt);
    M.rstd_q = ex.buffer(BlockBuf::MlaRstdQ, {T}, DType::F32);
    ops::rmsnorm_fwd(M.cq, q_a_norm.weight, dims_.eps, M.cq_n, M.rstd_q);
    ex.linear(M.cq_n, q_b.weight, nullptr, q);
  } else {
    ex.linear(x, q_proj.weight, nullptr, q);
  }
  // The kv latent [T, kv_lora] and the shared rope key [T, rope].
  Tensor kva = ex.buffer(BlockBuf::MlaKvA, {T, kvl + rope}, dt);
  ex.linear(x, kv_a.weight, bias_of(kv_a_bias), kva);
  M.ckv = ex.buffer(BlockBuf::MlaCkv, {T, kvl}, dt);
  ops::copy_cols(kva, 0, M.ckv, 0, kvl);
  Tensor kpe = ex.buffer(BlockBuf::MlaKpe, {T, rope}, dt);
  ops::copy_cols(kva, kvl, kpe, 0, rope);
  M.ckv_n = ex.buffer(BlockBuf::MlaCkvN, {T, kvl}, dt);
  M.rstd_kv = ex.buffer(BlockBuf::MlaRstdKv, {T}, DType::F32);
  ops::rmsnorm_fwd(M.ckv, kv_a_norm.weight, dims_.eps, M.ckv_n, M.rstd_kv);
  ops::rope_fwd(q, ex.positions, *ex.rope, H, /*rot_offset=*/nope);
  ops::rope_fwd(kpe, ex.positions, *ex.rope, 1);
  Tensor out = ex.buffer(BlockBuf::O, {ex.Tl, dims_.D}, dt);
  if (ex.latent_kv()) {
    Tensor o_in = ex.attend_latent(layer, q, M.ckv_n, kpe, kv_b.weight, shape_);  // [T, H*v]
    ex.row_linear(o_in, o.weight, bias_of(o_bias), out);
    return out;
  }
  // Decompressed keys and values: k_h = [(kv_b ckv)_h nope | kpe], v_h = (kv_b ckv)_h v.
  Tensor kv = ex.scratch({T, H * (nope + vd)}, dt);
  ex.linear(M.ckv_n, kv_b.weight, nullptr, kv);
  A.k = ex.buffer(BlockBuf::K, {T, H * qk}, dt);
  ops::copy_head_cols(kv, H, 0, A.k, H, 0, nope);
  ops::copy_head_cols(kpe, 1, 0, A.k, H, nope, rope);
  A.v = ex.buffer(BlockBuf::V, {T, H * vd}, dt);
  ops::copy_head_cols(kv, H, nope, A.v, H, 0, vd);
  A.q = q;
  A.attn = ex.attend(layer, A.q, A.k, A.v, attn_shape(), A);  // [T, H*v]
  ex.row_linear(A.attn, o.weight, bias_of(o_bias), out);
  if (A.rc.core_attn) {  // selective core_attn: rebuilt from q, k, v before o_proj's backward
    A.attn = Tensor();
    A.lse = Tensor();
    A.cp_attn.reset();
  }
  return out;
}

// x_mid = x_in + o(attn(q, k, v)); dy is d x_mid, dx (written) the d of the normed input.
void MlaAttention::backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) {
  const int64_t T = ex.Tp, D = dims_.D, H = shape_.n_heads, nope = shape_.qk_nope_head_dim;
  const int64_t rope = shape_.qk_rope_head_dim, vd = shape_.v_head_dim, kvl = shape_.kv_lora_rank, qk = nope + rope;
  MlaActivations& M = A.mla;
  const Tensor& x = A.norm1;
  if (A.rc.core_attn) ex.attend(0, A.q, A.k, A.v, attn_shape(), A);
  Tensor dattn = ex.scratch({T, H * vd}, DType::F32);
  parallel::row_linear_bwd(ex.tp, ex.sp, A.attn, o.weight, dy, &dattn, &o.grad, grad_of(o_bias));
  // attend_bwd writes the real rows only: sequence parallelism's padding rows start (and stay) zero.
  const auto grad = [&](Shape sh) { return ex.scratch(std::move(sh), DType::F32, /*zeroed=*/T != ex.T); };
  Tensor dq = grad({T, H * qk}), dk = grad({T, H * qk}), dv = grad({T, H * vd});
  ex.attend_bwd(A, dattn, attn_shape(), dq, dk, dv);
  if (A.rc.core_attn) {
    A.attn = Tensor();
    A.lse = Tensor();
    A.cp_attn.reset();
  }
  dattn = Tensor();
  ops::rope_bwd(dq, ex.positions, *ex.rope, H, nope);
  // Back into kv_b's output [T, H*(nope+v)] and the shared rope key (summed over heads).
  Tensor dkv = ex.scratch({T, H * (nope + vd)}, DType::F32);
  ops::copy_head_cols(dk, H, 0, dkv, H, 0, nope);
  ops::copy_head_cols(dv, H, 0, dkv, H, nope, vd);
  Tensor dkpe = ex.scratch({T, rope}, DType::F32);
  ops::sum_head_cols(dk, H, nope, dkpe, rope);
  ops::rope_bwd(dkpe, ex.positions, *ex.rope, 1);
  dk = dv = Tensor();
  Tensor dckv_n = ex.scratch({T, kvl}, DType::F32);
  ops::linear_bwd(M.ckv_n, kv_b.weight, dkv, &dckv_n, &kv_b.grad, nullptr);
  // Under tp dckv_n and dkpe are this rank's heads' part: so are the
  // gradients of the replicated kv_a_layernorm and kv_a_proj (summed over
  // tp) and dx (summed by the caller's tp_enter_bwd).
  Tensor dckv = ex.scratch({T, kvl}, DType::F32);
  ReplicatedGrad g_kv_norm(ex.tp, &kv_a_norm.grad), g_kv_a(ex.tp, &kv_a.grad), g_kv_a_b(ex.tp, grad_of(kv_a_bias));
  ops::rmsnorm_bwd(M.ckv, kv_a_norm.weight, M.rstd_kv, dckv_n, dckv, *g_kv_norm.get());
  Tensor dkva = ex.scratch({T, kvl + rope}, DType::F32);
  ops::copy_cols(dckv, 0, dkva, 0, kvl);
  ops::copy_cols(dkpe, 0, dkva, kvl, rope);
  ops::linear_bwd(x, kv_a.weight, dkva, &dx, g_kv_a.get(), g_kv_a_b.get());
  for (ReplicatedGrad* g : {&g_kv_norm, &g_kv_a, &g_kv_a_b}) g->reduce();
  Tensor tmp = ex.scratch({T, D}, DType::F32);
  if (q_lora_ > 0) {
    Tensor dcq_n = ex.scratch({T, q_lora_}, DType::F32), dcq = ex.scratch({T, q_lora_}, DType::F32);
    ops::linear_bwd(M.cq_n, q_b.weight, dq, &dcq_n, &q_b.grad, nullptr);
    ReplicatedGrad g_q_norm(ex.tp, &q_a_norm.grad), g_q_a(ex.tp, &q_a.grad), g_q_a_b(ex.tp, grad_of(q_a_bias));
    ops::rmsnorm_bwd(M.cq, q_a_norm.weight, M.rstd_q, dcq_n, dcq, *g_q_norm.get());
    ops::linear_bwd(x, q_a.weight, dcq, &tmp, g_q_a.get(), g_q_a_b.get());
    for (ReplicatedGrad* g : {&g_q_norm, &g_q_a, &g_q_a_b}) g->reduce();
  } else {
    ops::linear_bwd(x, q_proj.weight, dq, &tmp, &q_proj.grad, nullptr);
  }
  ops::add_inplace(dx, tmp);
}

}  // namespace kestrel::model
