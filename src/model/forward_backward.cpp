// The transformer's forward and backward passes, layer by layer, in the same
// order as HF's modeling_llama.py so that bf16 rounding points line up.
#include "model/transformer.h"
#include "ops/ops.h"

namespace kestrel::model {

namespace {

const Tensor* bias_of(const Param& p) { return p.weight.defined() ? &p.weight : nullptr; }
Tensor* grad_of(Param& p) { return p.weight.defined() ? &p.grad : nullptr; }

Tensor act_tensor(Shape s, DType dt) { return Tensor::empty(std::move(s), dt, MemCategory::Activations); }

ops::AttentionShape attention_shape(const io::ModelConfig& c) {
  ops::AttentionShape s;
  s.n_heads = c.num_attention_heads;
  s.n_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  return s;
}

}  // namespace

// Runs the stack; when `keep` is false one LayerActivations is reused per layer
// and nothing survives for backward.
static Tensor run_forward(const CausalLM& m, const PackedBatch& b, Activations& acts, bool keep) {
  const auto& c = m.config();
  const DType dt = m.dtype();
  const int64_t T = b.num_tokens, D = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, hd = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  KS_CHECK(b.max_seqlen <= m.rope().cos.size(0), "sequence of ", b.max_seqlen,
           " tokens is longer than the RoPE table (", m.rope().cos.size(0), " positions)");

  Tensor x = act_tensor({T, D}, dt);  // [T, D] residual stream
  ops::embedding_fwd(b.input_ids, m.embedding().weight, x);
  acts.layers.resize(keep ? m.layers().size() : 1);
  for (size_t li = 0; li < m.layers().size(); ++li) {
    const LayerParams& L = m.layers()[li];
    LayerActivations& A = acts.layers[keep ? li : 0];
    A.x_in = x;
    A.norm1 = act_tensor({T, D}, dt);
    A.rstd1 = act_tensor({T}, DType::F32);
    ops::rmsnorm_fwd(x, L.input_norm.weight, eps, A.norm1, A.rstd1);

    // Attention block.
    Tensor q_lin = act_tensor({T, H * hd}, dt), k_lin = act_tensor({T, Hkv * hd}, dt);
    A.v = act_tensor({T, Hkv * hd}, dt);
    ops::linear_fwd(A.norm1, L.q.weight, bias_of(L.q_bias), q_lin);
    ops::linear_fwd(A.norm1, L.k.weight, bias_of(L.k_bias), k_lin);
    ops::linear_fwd(A.norm1, L.v.weight, bias_of(L.v_bias), A.v);
    if (c.qk_norm) {
      A.q_lin = q_lin;
      A.k_lin = k_lin;
      A.q = act_tensor({T, H * hd}, dt);
      A.k = act_tensor({T, Hkv * hd}, dt);
      A.rstd_q = act_tensor({T * H}, DType::F32);
      A.rstd_k = act_tensor({T * Hkv}, DType::F32);
      Tensor qv = A.q.view({T * H, hd}), kv = A.k.view({T * Hkv, hd});
      ops::rmsnorm_fwd(q_lin.view({T * H, hd}), L.q_norm.weight, eps, qv, A.rstd_q);
      ops::rmsnorm_fwd(k_lin.view({T * Hkv, hd}), L.k_norm.weight, eps, kv, A.rstd_k);
    } else {
      A.q = q_lin;
      A.k = k_lin;
    }
    ops::rope_fwd(A.q, b.positions, m.rope(), H);
    ops::rope_fwd(A.k, b.positions, m.rope(), Hkv);
    A.attn = act_tensor({T, H * hd}, dt);
    A.lse = act_tensor({H, T}, DType::F32);
    ops::attention_fwd(A.q, A.k, A.v, b.cu_seqlens, attention_shape(c), A.attn, A.lse);
    Tensor o = act_tensor({T, D}, dt);
    ops::linear_fwd(A.attn, L.o.weight, bias_of(L.o_bias), o);
    A.x_mid = act_tensor({T, D}, dt);
    ops::add(x, o, A.x_mid);

    // MLP block.
    A.norm2 = act_tensor({T, D}, dt);
    A.rstd2 = act_tensor({T}, DType::F32);
    ops::rmsnorm_fwd(A.x_mid, L.post_norm.weight, eps, A.norm2, A.rstd2);
    A.gate = act_tensor({T, F}, dt);
    A.up = act_tensor({T, F}, dt);
    ops::linear_fwd(A.norm2, L.gate.weight, bias_of(L.gate_bias), A.gate);
    ops::linear_fwd(A.norm2, L.up.weight, bias_of(L.up_bias), A.up);
    A.act = act_tensor({T, F}, dt);
    ops::swiglu_fwd(A.gate, A.up, A.act);
    Tensor mlp = act_tensor({T, D}, dt);
    ops::linear_fwd(A.act, L.down.weight, bias_of(L.down_bias), mlp);
    Tensor x_next = act_tensor({T, D}, dt);
    ops::add(A.x_mid, mlp, x_next);
    x = x_next;
  }
  acts.x_final = x;
  acts.normf = act_tensor({T, D}, dt);
  acts.rstdf = act_tensor({T}, DType::F32);
  ops::rmsnorm_fwd(x, m.final_norm().weight, eps, acts.normf, acts.rstdf);
  Tensor logits = act_tensor({T, c.vocab_size}, dt);  // [T, V]
  ops::linear_fwd(acts.normf, m.lm_head().weight, nullptr, logits);
  if (!keep) acts.clear();
  return logits;
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
  const int64_t T = b.num_tokens, D = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, hd = c.head_dim;
  KS_CHECK(acts.layers.size() == layers_.size(), "backward without a kept forward");
  KS_CHECK(embed_.grad.defined(), "backward before enable_grads()");
  KS_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == T * c.vocab_size, "dlogits must be f32 [T, V]");
  const auto f32 = [](Shape s) { return Tensor::empty(std::move(s), DType::F32, MemCategory::Activations); };

  // Activation gradients stay f32 in both precisions; only parameters are bf16.
  Param& head = cfg_.tie_word_embeddings ? embed_ : lm_head_;
  Tensor dnorm = f32({T, D});
  ops::linear_bwd(acts.normf, head.weight, dlogits, &dnorm, &head.grad, nullptr);
  Tensor dx = f32({T, D});  // gradient of the residual stream
  ops::rmsnorm_bwd(acts.x_final, final_norm_.weight, acts.rstdf, dnorm, dx, final_norm_.grad);

  Tensor tmp_d = f32({T, D}), dF1 = f32({T, F}), dF2 = f32({T, F}), dact = f32({T, F});
  Tensor dattn = f32({T, H * hd}), dq = f32({T, H * hd}), dk = f32({T, Hkv * hd}), dv = f32({T, Hkv * hd});
  for (size_t li = layers_.size(); li-- > 0;) {
    LayerParams& L = layers_[li];
    LayerActivations& A = acts.layers[li];
    // MLP: x_out = x_mid + down(silu(gate(n2)) * up(n2)), n2 = norm(x_mid).
    ops::linear_bwd(A.act, L.down.weight, dx, &dact, &L.down.grad, grad_of(L.down_bias));
    ops::swiglu_bwd(A.gate, A.up, dact, dF1, dF2);
    ops::linear_bwd(A.norm2, L.gate.weight, dF1, &dnorm, &L.gate.grad, grad_of(L.gate_bias));
    ops::linear_bwd(A.norm2, L.up.weight, dF2, &tmp_d, &L.up.grad, grad_of(L.up_bias));
    ops::add_inplace(dnorm, tmp_d);
    ops::rmsnorm_bwd(A.x_mid, L.post_norm.weight, A.rstd2, dnorm, tmp_d, L.post_norm.grad);
    ops::add_inplace(dx, tmp_d);  // dx is now d x_mid

    // Attention: x_mid = x_in + o(attn(rope(q), rope(k), v)).
    ops::linear_bwd(A.attn, L.o.weight, dx, &dattn, &L.o.grad, grad_of(L.o_bias));
    ops::attention_bwd(A.q, A.k, A.v, A.attn, A.lse, dattn, b.cu_seqlens,
                       ops::AttentionShape{H, Hkv, hd, 0.f}, dq, dk, dv);
    ops::rope_bwd(dq, b.positions, rope_, H);
    ops::rope_bwd(dk, b.positions, rope_, Hkv);
    if (c.qk_norm) {
      Tensor dq_lin = f32({T, H * hd}), dk_lin = f32({T, Hkv * hd});
      Tensor dql = dq_lin.view({T * H, hd}), dkl = dk_lin.view({T * Hkv, hd});
      ops::rmsnorm_bwd(A.q_lin.view({T * H, hd}), L.q_norm.weight, A.rstd_q, dq.view({T * H, hd}), dql,
                       L.q_norm.grad);
      ops::rmsnorm_bwd(A.k_lin.view({T * Hkv, hd}), L.k_norm.weight, A.rstd_k, dk.view({T * Hkv, hd}), dkl,
                       L.k_norm.grad);
      dq = dq_lin;
      dk = dk_lin;
    }
    ops::linear_bwd(A.norm1, L.q.weight, dq, &dnorm, &L.q.grad, grad_of(L.q_bias));
    ops::linear_bwd(A.norm1, L.k.weight, dk, &tmp_d, &L.k.grad, grad_of(L.k_bias));
    ops::add_inplace(dnorm, tmp_d);
    ops::linear_bwd(A.norm1, L.v.weight, dv, &tmp_d, &L.v.grad, grad_of(L.v_bias));
    ops::add_inplace(dnorm, tmp_d);
    ops::rmsnorm_bwd(A.x_in, L.input_norm.weight, A.rstd1, dnorm, tmp_d, L.input_norm.grad);
    ops::add_inplace(dx, tmp_d);  // dx is now d x_in
    if (c.qk_norm) {  // restore the shared buffers' shapes for the next layer
      dq = f32({T, H * hd});
      dk = f32({T, Hkv * hd});
    }
  }
  ops::embedding_bwd(b.input_ids, dx, embed_.grad);
}

}  // namespace kestrel::model
