// The transformer's forward and backward passes, layer by layer, in the same
// order as HF's modeling_llama.py so that bf16 rounding points line up.
//
// One code path for every layout: the tensor-parallel mappings of
// parallel/tp_layers.h are the identity on a size-1 group, so at tp = 1 this
// runs exactly the ops (and rounding) of the plain single-process model.
// Shapes: T tokens of the batch; Tp = T rounded up to a multiple of tp under
// sequence parallelism (else T); Tl = Tp / tp under SP (else Tp): the rows of
// the residual stream this rank holds. Local sizes: H, Hkv heads, F/tp, V/tp.
#include <cstring>

#include "model/transformer.h"
#include "ops/ops.h"
#include "parallel/tp_attention.h"

namespace kestrel::model {

namespace {

const Tensor* bias_of(const Param& p) { return p.weight.defined() ? &p.weight : nullptr; }
Tensor* grad_of(Param& p) { return p.weight.defined() ? &p.grad : nullptr; }

Tensor act_tensor(Shape s, DType dt) { return Tensor::empty(std::move(s), dt, MemCategory::Activations); }

// The first T rows (the real tokens) of a possibly padded buffer.
Tensor rows(const Tensor& t, int64_t T) { return t.size(0) == T ? t : t.slice_rows(0, T); }

// Token layout of one batch on this rank.
struct Layout {
  comm::ProcessGroup* tp;
  bool sp;
  int64_t T, Tp, Tl;
  Tensor ids, positions;  // i32 [Tp]: padded with id -1 (zero embedding) and position 0
};

Tensor pad_i32(const Tensor& t, int64_t n, int32_t fill) {
  if (t.numel() == n) return t;
  Tensor out = Tensor::empty({n}, DType::I32, MemCategory::Activations);
  const int32_t* src = t.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) dst[i] = i < t.numel() ? src[i] : fill;
  return out;
}

Layout layout_of(const CausalLM& m, const PackedBatch& b) {
  Layout l;
  l.tp = &m.tp();
  l.sp = m.sequence_parallel();
  const int64_t n = l.tp->size();
  l.T = b.num_tokens;
  l.Tp = l.sp ? (l.T + n - 1) / n * n : l.T;
  l.Tl = l.sp ? l.Tp / n : l.Tp;
  l.ids = pad_i32(b.input_ids, l.Tp, -1);
  l.positions = pad_i32(b.positions, l.Tp, 0);
  return l;
}

const Tensor* prefix_of(const PackedBatch& b) { return b.prefix_of.defined() ? &b.prefix_of : nullptr; }

ops::AttentionShape local_attention(const CausalLM& m) {
  return ops::AttentionShape{m.heads().n_heads, m.heads().n_kv_heads, m.config().head_dim, 0.f};
}

}  // namespace

// Runs the stack; when `keep` is false one LayerActivations is reused per layer
// and nothing survives for backward.
static Tensor run_forward(const CausalLM& m, const PackedBatch& b, Activations& acts, bool keep) {
  const auto& c = m.config();
  const DType dt = m.dtype();
  const Layout lay = layout_of(m, b);
  comm::ProcessGroup& tp = *lay.tp;
  const bool sp = lay.sp;
  const int64_t T = lay.T, Tp = lay.Tp, Tl = lay.Tl;
  const int64_t D = c.hidden_size, F = m.local_ffn(), hd = c.head_dim;
  const int64_t H = m.heads().n_heads, Hkv = m.heads().n_kv_heads;
  const float eps = float(c.rms_norm_eps);
  KS_CHECK(b.max_seqlen <= m.rope().cos.size(0), "sequence of ", b.max_seqlen,
           " tokens is longer than the RoPE table (", m.rope().cos.size(0), " positions)");

  Tensor x = act_tensor({Tl, D}, dt);  // [Tl, D] residual stream
  parallel::vocab_embedding_fwd(tp, sp, lay.ids, m.embedding().weight, m.vocab_start(), x);
  acts.layers.resize(keep ? m.layers().size() : 1);
  for (size_t li = 0; li < m.layers().size(); ++li) {
    const LayerParams& L = m.layers()[li];
    LayerActivations& A = acts.layers[keep ? li : 0];
    A.x_in = x;
    Tensor norm1 = act_tensor({Tl, D}, dt);
    A.rstd1 = act_tensor({Tl}, DType::F32);
    ops::rmsnorm_fwd(x, L.input_norm.weight, eps, norm1, A.rstd1);
    A.norm1 = parallel::tp_enter_fwd(tp, sp, norm1);  // [Tp, D] input of the column-parallel q/k/v

    // Attention block.
    Tensor q_lin = act_tensor({Tp, H * hd}, dt), k_lin = act_tensor({Tp, Hkv * hd}, dt);
    A.v = act_tensor({Tp, Hkv * hd}, dt);
    ops::linear_fwd(A.norm1, L.q.weight, bias_of(L.q_bias), q_lin);
    ops::linear_fwd(A.norm1, L.k.weight, bias_of(L.k_bias), k_lin);
    ops::linear_fwd(A.norm1, L.v.weight, bias_of(L.v_bias), A.v);
    if (c.qk_norm) {
      A.q_lin = q_lin;
      A.k_lin = k_lin;
      A.q = act_tensor({Tp, H * hd}, dt);
      A.k = act_tensor({Tp, Hkv * hd}, dt);
      A.rstd_q = act_tensor({Tp * H}, DType::F32);
      A.rstd_k = act_tensor({Tp * Hkv}, DType::F32);
      Tensor qv = A.q.view({Tp * H, hd}), kv = A.k.view({Tp * Hkv, hd});
      ops::rmsnorm_fwd(q_lin.view({Tp * H, hd}), L.q_norm.weight, eps, qv, A.rstd_q);
      ops::rmsnorm_fwd(k_lin.view({Tp * Hkv, hd}), L.k_norm.weight, eps, kv, A.rstd_k);
    } else {
      A.q = q_lin;
      A.k = k_lin;
    }
    ops::rope_fwd(A.q, lay.positions, m.rope(), H);
    ops::rope_fwd(A.k, lay.positions, m.rope(), Hkv);
    // Padding rows (SP only) stay zero: attention runs on the real tokens.
    A.attn = Tp == T ? act_tensor({T, H * hd}, dt) : Tensor::zeros({Tp, H * hd}, dt, MemCategory::Activations);
    A.lse = act_tensor({H, T}, DType::F32);
    Tensor attn_rows = rows(A.attn, T);
    ops::attention_fwd(rows(A.q, T), rows(A.k, T), rows(A.v, T), b.cu_seqlens, local_attention(m), attn_rows, A.lse,
                       prefix_of(b));
    Tensor o = act_tensor({Tl, D}, dt);
    parallel::row_linear_fwd(tp, sp, A.attn, L.o.weight, bias_of(L.o_bias), o);
    A.x_mid = act_tensor({Tl, D}, dt);
    ops::add(x, o, A.x_mid);

    // MLP block.
    Tensor norm2 = act_tensor({Tl, D}, dt);
    A.rstd2 = act_tensor({Tl}, DType::F32);
    ops::rmsnorm_fwd(A.x_mid, L.post_norm.weight, eps, norm2, A.rstd2);
    A.norm2 = parallel::tp_enter_fwd(tp, sp, norm2);  // [Tp, D]
    A.gate = act_tensor({Tp, F}, dt);
    A.up = act_tensor({Tp, F}, dt);
    ops::linear_fwd(A.norm2, L.gate.weight, bias_of(L.gate_bias), A.gate);
    ops::linear_fwd(A.norm2, L.up.weight, bias_of(L.up_bias), A.up);
    A.act = act_tensor({Tp, F}, dt);
    ops::swiglu_fwd(A.gate, A.up, A.act);
    Tensor mlp = act_tensor({Tl, D}, dt);
    parallel::row_linear_fwd(tp, sp, A.act, L.down.weight, bias_of(L.down_bias), mlp);
    Tensor x_next = act_tensor({Tl, D}, dt);
    ops::add(A.x_mid, mlp, x_next);
    x = x_next;
  }
  acts.x_final = x;
  Tensor normf = act_tensor({Tl, D}, dt);
  acts.rstdf = act_tensor({Tl}, DType::F32);
  ops::rmsnorm_fwd(x, m.final_norm().weight, eps, normf, acts.rstdf);
  acts.normf = parallel::tp_enter_fwd(tp, sp, normf);  // [Tp, D] lm_head input
  if (m.is_value_model()) {
    // [Tp, 1]: the replicated score head gives every tp rank the full values.
    Tensor values = act_tensor({Tp, 1}, dt);
    ops::linear_fwd(acts.normf, m.value_head().weight, bias_of(m.value_head_bias()), values);
    if (!keep) acts.clear();
    return rows(values, T);
  }
  Tensor logits = act_tensor({Tp, m.local_vocab()}, dt);  // [Tp, V/tp]
  ops::linear_fwd(acts.normf, m.lm_head().weight, nullptr, logits);
  if (!keep) acts.clear();
  return rows(logits, T);
}

Tensor CausalLM::forward(const PackedBatch& batch, Activations& acts) const {
  return run_forward(*this, batch, acts, /*keep=*/true);
}

Tensor CausalLM::forward_inference(const PackedBatch& batch) const {
  Activations scratch;
  return run_forward(*this, batch, scratch, /*keep=*/false);
}

void CausalLM::backward(const PackedBatch& b, Activations& acts, const Tensor& dlogits) {
  const auto& c = cfg_;
  const Layout lay = layout_of(*this, b);
  comm::ProcessGroup& tp = *lay.tp;
  const bool sp = lay.sp, tp_on = tp.size() > 1;
  const int64_t T = lay.T, Tp = lay.Tp, Tl = lay.Tl;
  const int64_t D = c.hidden_size, F = local_ffn(), hd = c.head_dim;
  const int64_t H = heads_.n_heads, Hkv = heads_.n_kv_heads;
  KS_CHECK(acts.layers.size() == layers_.size(), "backward without a kept forward");
  KS_CHECK(embed_.grad.defined(), "backward before enable_grads()");
  KS_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == T * output_dim(),
           opts_.value_head ? "dvalues must be f32 [T, " : "dlogits must be f32 [T, ", output_dim(),
           opts_.value_head ? "]" : "] (this rank's vocab columns)", ", got ", dlogits.describe());
  const auto f32 = [](Shape s) { return Tensor::empty(std::move(s), DType::F32, MemCategory::Activations); };
  // Norm weights see only this rank's tokens under SP: their grads are summed over tp.
  const auto norm_bwd = [&](const Tensor& x, Param& w, const Tensor& rstd, const Tensor& dy, Tensor& dx) {
    if (!sp) {
      ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, w.grad);
      return;
    }
    Tensor part = Tensor::zeros(w.grad.shape(), DType::F32, MemCategory::Activations);
    ops::rmsnorm_bwd(x, w.weight, rstd, dy, dx, part);
    parallel::reduce_replicated_grad(tp, part, w.grad);
  };

  // Activation gradients stay f32 in both precisions; only parameters are bf16.
  Tensor dlog = dlogits;  // [Tp, V/tp] ([Tp, 1] for values): padding rows get zero gradient
  if (Tp != T) {
    dlog = Tensor::zeros({Tp, output_dim()}, DType::F32, MemCategory::Activations);
    std::memcpy(dlog.raw(), dlogits.raw(), dlogits.nbytes());
  }
  Tensor dnorm = f32({Tp, D});  // [Tp, D] gradient of a column-parallel region's input (partial under tp)
  if (opts_.value_head) {
    // Every tp rank holds the whole head and the same dvalues, so each has
    // the full input gradient and the same head grads; the tp reduction of
    // tp_enter_bwd sums the ranks' dnorm, so only rank 0 contributes.
    ops::linear_bwd(acts.normf, score_.weight, dlog, &dnorm, &score_.grad, grad_of(score_bias_));
    if (tp_on && tp.rank() != 0) dnorm.zero_();
  } else {
    Param& head = cfg_.tie_word_embeddings ? embed_ : lm_head_;
    ops::linear_bwd(acts.normf, head.weight, dlog, &dnorm, &head.grad, nullptr);
  }
  Tensor dx = f32({Tl, D});  // gradient of the residual stream
  norm_bwd(acts.x_final, final_norm_, acts.rstdf, parallel::tp_enter_bwd(tp, sp, dnorm), dx);
  ready(c.num_hidden_layers);

  Tensor tmp_d = f32({Tp, D}), tmp_l = Tp == Tl ? tmp_d : f32({Tl, D});
  Tensor dF1 = f32({Tp, F}), dF2 = f32({Tp, F}), dact = f32({Tp, F});
  const auto padded_zero = [&](Shape s) { return Tp == T ? f32(std::move(s)) : Tensor::zeros(s, DType::F32); };
  Tensor dattn = f32({Tp, H * hd});
  Tensor dq = padded_zero({Tp, H * hd}), dk = padded_zero({Tp, Hkv * hd}), dv = padded_zero({Tp, Hkv * hd});
  // k/v weights of a kv head replicated over several tp ranks: each replica
  // holds the gradient of its own query heads only, so the replicas are summed.
  const auto kv_linear_bwd = [&](const Tensor& x, Param& w, Param& bias, const Tensor& dy, Tensor* dxp) {
    if (heads_.kv_replicas == 1) {
      ops::linear_bwd(x, w.weight, dy, dxp, &w.grad, grad_of(bias));
      return;
    }
    Tensor sw = Tensor::zeros(w.grad.shape(), DType::F32, MemCategory::Activations);
    Tensor sb = bias.weight.defined() ? Tensor::zeros(bias.grad.shape(), DType::F32, MemCategory::Activations) : Tensor();
    ops::linear_bwd(x, w.weight, dy, dxp, &sw, bias.weight.defined() ? &sb : nullptr);
    parallel::reduce_kv_replica_grad(tp, heads_, sw, w.grad);
    if (bias.weight.defined()) parallel::reduce_kv_replica_grad(tp, heads_, sb, bias.grad);
  };
  for (size_t li = layers_.size(); li-- > 0;) {
    LayerParams& L = layers_[li];
    LayerActivations& A = acts.layers[li];
    // MLP: x_out = x_mid + down(silu(gate(n2)) * up(n2)), n2 = norm(x_mid).
    parallel::row_linear_bwd(tp, sp, A.act, L.down.weight, dx, &dact, &L.down.grad, grad_of(L.down_bias));
    ops::swiglu_bwd(A.gate, A.up, dact, dF1, dF2);
    ops::linear_bwd(A.norm2, L.gate.weight, dF1, &dnorm, &L.gate.grad, grad_of(L.gate_bias));
    ops::linear_bwd(A.norm2, L.up.weight, dF2, &tmp_d, &L.up.grad, grad_of(L.up_bias));
    ops::add_inplace(dnorm, tmp_d);
    norm_bwd(A.x_mid, L.post_norm, A.rstd2, parallel::tp_enter_bwd(tp, sp, dnorm), tmp_l);
    ops::add_inplace(dx, tmp_l);  // dx is now d x_mid

    // Attention: x_mid = x_in + o(attn(rope(q), rope(k), v)).
    parallel::row_linear_bwd(tp, sp, A.attn, L.o.weight, dx, &dattn, &L.o.grad, grad_of(L.o_bias));
    Tensor dq_r = rows(dq, T), dk_r = rows(dk, T), dv_r = rows(dv, T);
    ops::attention_bwd(rows(A.q, T), rows(A.k, T), rows(A.v, T), rows(A.attn, T), A.lse, rows(dattn, T),
                       b.cu_seqlens, ops::AttentionShape{H, Hkv, hd, 0.f}, dq_r, dk_r, dv_r, prefix_of(b));
    ops::rope_bwd(dq, lay.positions, rope_, H);
    ops::rope_bwd(dk, lay.positions, rope_, Hkv);
    if (c.qk_norm) {
      Tensor dq_lin = f32({Tp, H * hd}), dk_lin = f32({Tp, Hkv * hd});
      Tensor dql = dq_lin.view({Tp * H, hd}), dkl = dk_lin.view({Tp * Hkv, hd});
      if (!tp_on) {
        ops::rmsnorm_bwd(A.q_lin.view({T * H, hd}), L.q_norm.weight, A.rstd_q, dq.view({T * H, hd}), dql,
                         L.q_norm.grad);
        ops::rmsnorm_bwd(A.k_lin.view({T * Hkv, hd}), L.k_norm.weight, A.rstd_k, dk.view({T * Hkv, hd}), dkl,
                         L.k_norm.grad);
      } else {
        // Each rank normalises only its own heads: the per-head norm weights' grads are summed over tp.
        Tensor pq = Tensor::zeros({hd}, DType::F32, MemCategory::Activations);
        Tensor pk = Tensor::zeros({hd}, DType::F32, MemCategory::Activations);
        ops::rmsnorm_bwd(A.q_lin.view({Tp * H, hd}), L.q_norm.weight, A.rstd_q, dq.view({Tp * H, hd}), dql, pq);
        ops::rmsnorm_bwd(A.k_lin.view({Tp * Hkv, hd}), L.k_norm.weight, A.rstd_k, dk.view({Tp * Hkv, hd}), dkl, pk);
        parallel::reduce_replicated_grad(tp, pq, L.q_norm.grad);
        parallel::reduce_replicated_grad(tp, pk, L.k_norm.grad);
      }
      dq = dq_lin;
      dk = dk_lin;
    }
    ops::linear_bwd(A.norm1, L.q.weight, dq, &dnorm, &L.q.grad, grad_of(L.q_bias));
    kv_linear_bwd(A.norm1, L.k, L.k_bias, dk, &tmp_d);
    ops::add_inplace(dnorm, tmp_d);
    kv_linear_bwd(A.norm1, L.v, L.v_bias, dv, &tmp_d);
    ops::add_inplace(dnorm, tmp_d);
    norm_bwd(A.x_in, L.input_norm, A.rstd1, parallel::tp_enter_bwd(tp, sp, dnorm), tmp_l);
    ops::add_inplace(dx, tmp_l);  // dx is now d x_in
    if (c.qk_norm) {  // restore the shared buffers' shapes for the next layer
      dq = padded_zero({Tp, H * hd});
      dk = padded_zero({Tp, Hkv * hd});
    }
    ready(int64_t(li));
  }
  parallel::vocab_embedding_bwd(tp, sp, lay.ids, dx, embed_.grad, vocab_.start);
  ready(-1);
}

}  // namespace kestrel::model
