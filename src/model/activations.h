// What the forward keeps for the backward, per layer. Named fields (not a
// generic map) so that recompute (model/recompute.h) and offload policies
// choose exactly which to drop and rebuild: a dropped field is left undefined
// by the forward and rebuilt by the backward right before its use.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "model/recompute.h"
#include "ops/moe.h"

namespace kestrel::parallel {
struct CpAttentionSaved;  // parallel/cp_attention.h
struct EpLayout;          // parallel/ep_dispatch.h
struct EtpLayout;         // parallel/etp_dispatch.h
}

namespace kestrel::model {

// A MoE MLP's forward state (model/moe_mlp.h). N rows routed to experts
// (expert-major), Fe one expert's width, Fs the shared experts' width.
struct MoeActivations {
  Tensor logits;        // [T, E] router logits (f32, or the model dtype for Qwen routers)
  Tensor scores;        // f32 [T, E] softmax / sigmoid of the logits
  Tensor topk_idx;      // i32 [T, k] chosen experts (-1: dropped by capacity)
  Tensor chosen_idx;    // i32 [T, k] the choice before capacity dropping (undefined: nothing dropped)
  Tensor topk_w;        // f32 [T, k] their combine weights
  ops::MoeRouting routing;  // expert-major layout of topk_idx
  Tensor xs;            // [N, D] the tokens permuted to their experts
  Tensor gate, up;      // [N, Fe]
  Tensor act;           // [N, Fe] silu(gate) * up
  Tensor ys;            // [N, D] the experts' outputs before the combine
  Tensor sh_gate, sh_up, sh_act;  // [T, Fs] the shared experts' SwiGLU
  Tensor sh_out;        // [T, D] shared experts' output (Qwen2-MoE: before its sigmoid gate)
  Tensor sh_gate_logit; // [T, 1] Qwen2-MoE shared_expert_gate(x)
  // Expert parallelism: the dispatch of this forward (rows per rank and local
  // expert); then xs, gate, up, act hold the rows this rank's experts
  // received (sorted by local expert, [Nr, ...]) and ys the combined outputs [N, D].
  std::shared_ptr<parallel::EpLayout> ep;
  // Tensor parallelism (BlockExec::seq_tp): the real-token rows [row_lo,
  // row_hi) this rank routes to the experts (routing, xs and ys are theirs;
  // the router tensors above cover every real token on every rank), and the
  // etp exchange of this forward: xs, gate, up, act then hold every rank's
  // rows of this rank's experts ([Na, ...], parallel/etp_dispatch.h).
  int64_t row_lo = 0, row_hi = 0;
  std::shared_ptr<parallel::EtpLayout> etp;
};

// An MLA attention's forward state (model/mla_attention.h): the query and
// key/value latents before their norms, the norms' outputs, and the
// decompressed q, k, v the attention core saw (in LayerActivations::q/k/v).
struct MlaActivations {
  Tensor cq;      // [T, q_lora] q_a_proj output (q_lora only)
  Tensor cq_n;    // [T, q_lora] q_a_layernorm output
  Tensor rstd_q;  // f32 [T]
  Tensor ckv;     // [T, kv_lora] the kv latent before kv_a_layernorm
  Tensor ckv_n;   // [T, kv_lora] after it (kv_b_proj's input)
  Tensor rstd_kv; // f32 [T]
};

struct LayerActivations {
  Tensor x_in;      // [T, D] residual stream entering the layer
  Tensor norm1;     // [T, D] input_layernorm output
  Tensor rstd1;     // f32 [T]
  Tensor q_lin;     // [T, q_dim] q projection before q_norm (Qwen3 only)
  Tensor k_lin;     // [T, kv_dim] k projection before k_norm (Qwen3 only)
  Tensor rstd_q;    // f32 [T*H] (Qwen3)
  Tensor rstd_k;    // f32 [T*Hkv] (Qwen3)
  Tensor q, k, v;   // [T, q_dim], [T, kv_dim], [T, kv_dim] as attention saw them (post-RoPE)
  Tensor attn;      // [T, q_dim] attention output
  Tensor lse;       // f32 [H, T]
  // Under context parallelism: what the cp attention's backward needs, in its
  // work layout (Ulysses: the head shard of the group's rows; ring: q, k, v,
  // attn themselves, no copy). lse is then its lse.
  std::shared_ptr<parallel::CpAttentionSaved> cp_attn;
  Tensor x_mid;     // [T, D] residual after attention
  Tensor norm2;     // [T, D] post_attention_layernorm output
  Tensor rstd2;     // f32 [T]
  Tensor gate, up;  // [T, F]
  Tensor act;       // [T, F] silu(gate) * up
  MoeActivations moe;  // MoE layers only
  MlaActivations mla;  // MLA attention only
  BlockRecompute rc;  // what this block's forward drops (training only; default: keep everything)
};

struct Activations {
  std::vector<LayerActivations> layers;
  Tensor x_final;   // [T, D] residual entering the final norm
  Tensor normf;     // [T, D] final norm output (lm_head input)
  Tensor rstdf;     // f32 [T]
  void clear() { *this = Activations(); }
};

}  // namespace kestrel::model
