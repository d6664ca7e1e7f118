// The memory model's phases of an RL step, FLOPs and communication volume,
// and the advice when a plan does not fit (see memory_plan.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "backend/cpu/packed_linear.h"
#include "parallel/pipeline_layout.h"
#include "rl/memory_plan.h"
#include "rollout/model_runner.h"

namespace kestrel::rl {

namespace {

// The rollout's weights packed for its GEMMs (rollout/decode_linear.h
// WeightPacks; 0 when the GEMM library does not pack here): every linear a
// step of more than kSkinnyRows rows multiplies by, each packed in the
// library's layout (cpu::packed_linear_bytes asks it for the size).
// Dense attention and MLP, MLA's q/kv_a/o projections, shared experts and
// the lm_head; the routed experts run the grouped GEMM and are not packed,
// and the MoE router and MLA's absorbed kv_b are not counted (small next to
// the rest).
int64_t packed_weight_bytes(const io::ModelConfig& c, const PlanShapes& rs, DType dt, bool with_head = true) {
  auto pk = [&](int64_t out, int64_t in) { return cpu::packed_linear_bytes(out, in, dt); };
  if (pk(64, 64) == 0) return 0;
  const int64_t D = rs.D;
  int64_t b = with_head ? pk(rs.V, D) : 0;  // lm_head
  for (int64_t layer : rs.layers) {
    if (c.mla.enabled) {  // this rank's heads
      const io::MlaConfig& m = c.mla;
      const int64_t H = rs.H, qk = m.qk_head_dim(), ql = m.q_lora_rank;
      b += ql > 0 ? pk(ql, D) + pk(H * qk, ql) : pk(H * qk, D);
      b += pk(m.kv_lora_rank + m.qk_rope_head_dim, D) + pk(D, H * m.v_head_dim);
    } else {
      b += pk(rs.H * rs.hd, D) + 2 * pk(rs.Hkv * rs.hd, D) + pk(D, rs.H * rs.hd);
    }
    if (c.is_moe_layer(layer)) {
      const int64_t Fs = rs.Fs;  // this rank's share
      if (c.moe.shared_intermediate_size > 0) b += 2 * pk(Fs, D) + pk(D, Fs);
    } else {
      b += 2 * pk(rs.F, D) + pk(D, rs.F);
    }
  }
  return b;
}

// A training mini-batch's packs (train/engine.cpp train_packs_apply): bf16
// weights of a dense model at tp = pp = cp = 1, micro-batches of more than
// the packed minimum of rows: every linear the blocks run, and the lm_head
// unless `value_head` (the score head stays on the BLAS).
int64_t train_packed_bytes(const PlanInputs& in, const PlanShapes& s, DType dt, const MicroBatchPlan& micro,
                           bool value_head) {
  return train_packs_planned(s, in, micro.max_tokens, dt) ? packed_weight_bytes(in.model, s, dt, !value_head) : 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }
size_t cat(MemCategory c) { return size_t(c); }

// The states one trained model keeps for the whole run (train/engine.cpp):
// weights, f32 gradients (DataParallel's flat buffer padded to dp when dp or
// tp > 1), AdamW's m, v and masters (optim/adamw.h).
struct ModelStates {
  int64_t params = 0, grads = 0, optimizer = 0;
};
// expert_elems of the N are routed experts: under expert parallelism, or
// with the experts split over another group than tp (etp != tp), they have
// their own DataParallel over the expert-data-parallel group (edp = world /
// (etp x ep x pp) ranks), whose distributed optimizer shards their state over
// edp, the dense state over dp (train/engine.cpp).
ModelStates trained_states(const PlanInputs& in, int64_t N, DType dt, bool reuse_fp32_param, int64_t expert_elems) {
  const PlanLayout& l = in.layout;
  const int64_t a = int64_t(dtype_size(dt));
  const bool distributed = l.dp > 1 || l.tp > 1 || l.ep > 1 || l.expert_tp() > 1;  // the engine runs with DataParallel
  const int64_t dense = N - expert_elems, edp = l.edp();
  auto padded_to = [](int64_t n, int64_t g) { return n > 0 ? ceil_div(n, g) * g : 0; };
  const int64_t padded = distributed ? padded_to(dense, l.dp) + padded_to(expert_elems, edp) : N;
  const bool distopt = l.distributed_optimizer && distributed;
  const int64_t owned =
      distopt ? std::min(ceil_div(dense, l.dp), dense) + std::min(ceil_div(expert_elems, edp), expert_elems) : N;
  ModelStates s;
  s.params = a * (distopt ? padded : N);  // the distributed optimizer's flat parameter buffers
  s.grads = 4 * padded;
  if (dt == DType::F32) {
    s.optimizer = 8 * owned;  // m, v; the weights are the masters
  } else {
    const int64_t master = reuse_fp32_param ? 2 : 4;  // reuse_fp32_param: a 16-bit residual next to the bf16 weight
    s.optimizer = (8 + master) * owned;
  }
  return s;
}

// Elements of this rank's routed experts when the engine keeps them apart
// (their own DataParallel: ep > 1, or etp != tp): gate, up, down of E / ep
// experts split over etp in each MoE layer of s; 0 when they train with the
// dense parameters.
int64_t routed_expert_elems(const PlanInputs& in, const PlanShapes& s) {
  const auto& m = in.model.moe;
  const PlanLayout& l = in.layout;
  if (m.num_experts <= 0 || (l.ep <= 1 && l.expert_tp() == l.tp)) return 0;
  return s.moe_layers * (m.num_experts / std::max<int64_t>(1, l.ep)) * 3 * s.D * s.Fe;
}

int64_t rope_bytes(const PlanShapes& s) { return 4 * s.rope_rows * s.hd; }  // cos, sin f32 [rows, hd/2]

// One rollout step's buffers (rollout/model_runner.cpp: one buffer per slot
// reused by every layer; the head on the sampled rows). Approximate: the
// sampler's transients are not modelled; a MoE layer's routed rows (T*k of
// xs, gate, up, act, ys) and router, an MLA layer's latents and absorbed
// query are counted at their largest.
int64_t rollout_activations(const PlanShapes& s, const io::ModelConfig& c, const PlanRollout& r) {
  const int64_t a = int64_t(dtype_size(r.dtype));
  const int64_t T = std::max<int64_t>(1, r.max_num_batched_tokens), S = std::min(T, r.max_num_seqs);
  int64_t attn = 0, mlp = 0;
  if (c.mla.enabled) {
    const io::MlaConfig& m = c.mla;
    const int64_t H = s.H, lat = m.kv_lora_rank + m.qk_rope_head_dim;  // this rank's heads
    // q [T, H*qk], the q latent and its norm, [c_kv | k_pe] and its parts, the absorbed q [T, H*lat] and output [T, H*kv_lora], o_in [T, H*v]
    attn = a * T * (H * m.qk_head_dim() + 2 * m.q_lora_rank + 2 * lat + H * lat + H * m.kv_lora_rank + H * m.v_head_dim);
  } else {
    const int64_t q = s.H * s.hd, kv = s.Hkv * s.hd;
    attn = a * T * (2 * q + 2 * kv);  // q, k, v, attn
    if (s.qk_norm) attn += a * T * (q + kv) + 4 * T * (s.H + s.Hkv);
  }
  if (c.moe.num_experts > 0) {
    const io::MoeConfig& m = c.moe;
    const int64_t N = T * m.top_k, Fs = s.Fs;  // each expert's and the shared experts' shares of this rank
    mlp = a * N * (2 * s.D + 3 * s.Fe) + 8 * T * m.num_experts + 16 * T * m.top_k + 4 * N +
          (m.shared_intermediate_size > 0 ? a * T * (3 * Fs + s.D) : 0);  // routed rows; logits, scores; topk, routing
  }
  mlp = std::max(mlp, 2 * a * T * s.F);  // a dense layer's gate, up
  int64_t b = a * T * 5 * s.D + attn + mlp + 4 * T;  // x, norm, o, x_mid, mlp out
  b += 4 * 4 * T;                                // ids, positions, slots (+ tables, roughly)
  b += a * S * (2 * s.D + s.V) + 12 * S;         // sampled rows, their norm, logits [S, V]; lse, logprobs
  if (r.dtype != DType::F32) b += 4 * (S * s.V + s.V * s.D);  // f32 widening of the lm_head GEMM
  return b;
}

// Forward FLOPs of `tokens` packed rows with `pairs` causal (query, key)
// pairs through the layers of s (layer_flops: a MoE layer's active experts
// only) and the head.
double forward_flops(const io::ModelConfig& c, const PlanShapes& s, int64_t tp, double tokens, double pairs,
                     bool value_head) {
  double per_token = value_head ? 2 * double(s.D) : 2 * double(s.D * s.V), per_pair = 0;
  for (int64_t i : s.layers) {
    const LayerFlops f = layer_flops(c, i, tp);
    per_token += f.per_token;
    per_pair += f.per_pair;
  }
  return tokens * per_token + pairs * per_pair;
}

void add_comm(MemoryPlan& p, std::string what, int64_t payload, double ring_factor, int64_t calls) {
  if (payload <= 0 || ring_factor <= 0) return;
  p.comm.push_back({std::move(what), payload, int64_t(double(payload) * ring_factor), calls});
}

// The tp and dp collectives of one step (parallel/tp_layers.cpp: forward
// row-parallel reductions in f32, SP's all-gathers of the normed input in the
// compute dtype, the backward's f32 reductions; the MoE layers' etp exchange
// at balanced routing; parallel/data_parallel.cpp).
void plan_comm(MemoryPlan& p, const PlanInputs& in, const PlanShapes& s) {
  const PlanLayout& l = in.layout;
  const int64_t a = int64_t(dtype_size(in.dtype));
  const double tp = double(l.tp), dp = double(l.dp);
  const int64_t steps = p.micro.optimizer_steps;
  const int64_t epochs = std::max<int64_t>(1, in.batch.ppo_epochs);
  const int64_t train_rows = p.micro.step_tokens * epochs;  // forward + backward rows of the update
  const int64_t score_rows = p.micro.step_tokens * ((in.batch.old_log_prob ? 1 : 0) + (in.ref ? 1 : 0));
  if (l.tp > 1) {
    const int64_t L = s.L, D = s.D;
    const int64_t mbs = std::max<int64_t>(1, p.micro.micro_batches) * steps;
    if (!(l.sequence_parallel)) {
      // 2 all-reduces per layer forward (o, down), 2 backward (the normed inputs' grads), f32.
      add_comm(p, "tp all-reduce (actor update)", 4 * train_rows * D * (4 * L + 2), 2 * (tp - 1) / tp, mbs * (4 * L + 2));
    } else {
      add_comm(p, "tp all-gather (actor update)", (a * 2 * L + 4 * 2 * L + a) * train_rows * D, (tp - 1) / tp,
               mbs * (4 * L + 1));
      add_comm(p, "tp reduce-scatter (actor update)", 4 * train_rows * D * (4 * L + 2), (tp - 1) / tp, mbs * (4 * L + 2));
    }
    add_comm(p, "tp all-reduce (scoring)", 4 * score_rows * D * (2 * L + 1), 2 * (tp - 1) / tp, 0);
  }
  const int64_t etp = l.expert_tp();
  if (s.moe_layers > 0 && etp > 1) {
    // The expert-tensor-parallel exchange of each MoE layer (parallel/etp_dispatch.h): the routed rows
    // (k per token of this rank's share) gathered over etp and the outputs reduce-scattered back, in the
    // compute dtype forward and f32 backward; each gathered buffer etp times a rank's rows.
    const int64_t rows = ceil_div(train_rows, l.tp) * in.model.moe.top_k * etp;
    const int64_t mbs = std::max<int64_t>(1, p.micro.micro_batches) * steps;
    add_comm(p, "etp all-gather + reduce-scatter (actor update)", (2 * a + 8) * rows * s.D * s.moe_layers,
             (double(etp) - 1) / double(etp), mbs * 4 * s.moe_layers);
  }
  if (l.dp > 1) {
    const int64_t N = s.params, padded = ceil_div(N, l.dp) * l.dp;
    if (l.distributed_optimizer) {
      add_comm(p, "dp gradient reduce-scatter", 4 * padded * steps, (dp - 1) / dp, steps);
      add_comm(p, "dp parameter all-gather", a * padded * steps, (dp - 1) / dp, steps);
    } else {
      add_comm(p, "dp gradient all-reduce", 4 * padded * steps, 2 * (dp - 1) / dp, steps);
    }
  }
  if (in.rollout.tp > 1) {
    // Generated tokens of one rollout group (world / rollout tp groups share the prompts); per token and
    // layer two all-reduces of the f32 row-parallel partials [D], plus the embedding's.
    const int64_t world = l.dp * l.tp * l.pp * l.cp, groups = std::max<int64_t>(1, world / in.rollout.tp);
    const int64_t tokens = ceil_div(in.batch.train_batch_size, groups) * in.batch.n * in.batch.response_len;
    add_comm(p, "rollout tp all-reduce", 4 * tokens * s.D * (2 * in.model.num_hidden_layers + 1),
             2 * (double(in.rollout.tp) - 1) / double(in.rollout.tp), 0);
  }
}

model::RecomputePolicy selective(const std::vector<std::string>& modules) {
  return model::make_recompute_policy("selective", "", -1, modules, false, -1, false, -1, "").value();
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.0f%%", 100 * x);
  return buf;
}

// The rollout's KV cache (rollout/engine.cpp kv_cache_bytes_for with
// kestrel train's weight_bytes(actor): its parameters and buffers) in the
// engine's geometry (rollout::kv_geometry): per token every layer's K and V
// of the rank's kv heads, or MLA's one latent row, and with routing
// recording the routing cache's n_moe_layers * top_k i32.
void plan_kv_cache(MemoryPlan& p, const PlanInputs& in, const PlanShapes& rs) {
  const PlanShapes& s = p.shapes;
  const int64_t a = int64_t(dtype_size(in.dtype)), ra = int64_t(dtype_size(in.rollout.dtype));
  const double budget = in.rollout.gpu_memory_utilization * double(in.device_memory);
  const int64_t kv_request = int64_t(budget - double(a * s.params + s.buffers));
  const rollout::KVGeometry g =
      rollout::kv_geometry(in.model, rs.Hkv, in.rollout.dtype, in.rollout.block_size,
                           in.rollout.record_routing && in.model.moe.num_experts > 0);
  p.kv_bytes_per_token = g.kv_bytes_per_token();
  p.kv_routing_bytes_per_token = 4 * g.routing_width;
  p.kv_bytes_per_token_gqa = in.model.num_hidden_layers * kv_values_per_token_layer_gqa(in.model, in.rollout.tp) * ra;
  const int64_t per_block = g.bytes_per_block();
  p.kv_blocks = kv_request > 0 ? kv_request / per_block : 0;
  p.kv_cache_bytes = p.kv_blocks * per_block;
  p.kv_tokens = p.kv_blocks * in.rollout.block_size;
}

// FLOPs per rank per step: the actor update (3 forwards and the recompute
// reruns), the scoring passes, the rollout; and the model's forward FLOPs
// per token.
void plan_flops(MemoryPlan& p, const PlanInputs& in, const PlanShapes& rs) {
  const PlanLayout& l = in.layout;
  const PlanShapes& s = p.shapes;
  const double epochs = double(std::max<int64_t>(1, in.batch.ppo_epochs));
  const double fwd = forward_flops(in.model, s, l.tp, double(p.micro.step_tokens), double(p.micro.attention_pairs), false);
  // Recompute reruns forward work in the backward (model/recompute.h): a
  // full block its whole forward, selective mlp the gate/up GEMMs (dense
  // MLPs only), core_attn the attention core; norms and swiglu are
  // elementwise (not counted).
  double recompute_flops = 0;
  {
    const double tokens = double(p.micro.step_tokens), pairs = double(p.micro.attention_pairs);
    const double gate_up = 2 * tokens * 2 * double(s.D * s.F);
    const std::vector<model::BlockRecompute> rc = in.recompute.plan(s.L);
    for (size_t i = 0; i < rc.size(); ++i) {
      const int64_t layer = s.layers[i];
      const LayerFlops f = layer_flops(in.model, layer, l.tp);
      const model::BlockRecompute& b = rc[i];
      recompute_flops += b.full ? tokens * f.per_token + pairs * f.per_pair
                                : (b.mlp && !in.model.is_moe_layer(layer) ? gate_up : 0) + (b.core_attn ? pairs * f.per_pair : 0);
    }
  }
  p.flops_actor = epochs * (3 * fwd + recompute_flops);
  p.flops_scoring = ((in.batch.old_log_prob ? 1 : 0) + (in.ref ? 1 : 0)) * fwd;
  {
    const int64_t rdp = std::max<int64_t>(1, l.dp * l.tp * l.pp * l.cp / in.rollout.tp);
    const double prompts = double(ceil_div(in.batch.train_batch_size, rdp));
    const double P = double(in.batch.prompt_len), R = double(in.batch.response_len), n = double(in.batch.n);
    const double tokens = prompts * (P + n * R), pairs = prompts * (P * P / 2 + n * (R * P + R * R / 2));
    p.flops_rollout = forward_flops(in.model, rs, in.rollout.tp, tokens, pairs, false) -
                      2 * prompts * (P - 1) * double(rs.D * rs.V);  // logits on sampled rows only
  }
  {
    PlanShapes whole = plan_shapes(in, 1, 1);
    p.flops_per_token = forward_flops(in.model, whole, 1, 1, 0, false);
    p.active_params = active_parameters(in.model);
  }
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  char buf[48];
  if (std::abs(b) >= double(int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (std::abs(b) >= double(1 << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  else if (std::abs(b) >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else std::snprintf(buf, sizeof buf, "%lld B", (long long)bytes);
  return buf;
}

Result<int64_t> parse_bytes(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mult = -1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "ki") mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mi") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gi") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib" || unit == "ti") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  if (pos == 0 || mult < 0 || !(v > 0))
    return KS_ERR(flag, ": expected a positive size such as 80GiB, 24GB, 512MiB or a byte count, got '", text, "'");
  return int64_t(v * mult);
}

Status validate_plan_inputs(const PlanInputs& in) {
  const io::ModelConfig& c = in.model;
  const PlanLayout& l = in.layout;
  const std::string M = "actor_rollout_ref.actor.megatron.";
  for (auto [v, key] : {std::pair{l.tp, M + "tensor_model_parallel_size"}, {l.pp, M + "pipeline_model_parallel_size"},
                        {l.cp, M + "context_parallel_size"}, {l.ep, M + "expert_model_parallel_size"},
                        {l.dp, std::string("the data-parallel size (--world / (tp x pp x cp))")},
                        {l.vpp, M + "virtual_pipeline_model_parallel_size"}})
    if (v < 1) return KS_ERR(key, " must be >= 1, got ", v);
  const bool moe = c.moe.num_experts > 0, mla = c.mla.enabled;
  if (!moe && l.ep > 1)
    return KS_ERR(M, "expert_model_parallel_size=", l.ep, " splits the routed experts of a mixture-of-experts model, "
                  "but ", io::arch_name(c.arch), " is dense; set it to 1");
  if (l.etp < 0) return KS_ERR(M, "expert_tensor_parallel_size must be >= 1 or null, got ", l.etp);
  if (moe || mla) {
    const std::string what = std::string(io::arch_name(c.arch)) + " (" +
                             (moe ? "mixture-of-experts" : "latent attention") + " layers)";
    // model/moe_mlp.cpp: a MoE layer trained under tp routes each rank's
    // sequence-parallel rows, as Megatron requires.
    if (moe && l.tp > 1 && !l.sequence_parallel)
      return KS_ERR(M, "tensor_model_parallel_size=", l.tp, " for ", what, " needs sequence parallelism (as in "
                    "Megatron): set ", M, "sequence_parallel=true");
    const int64_t etp = l.expert_tp();
    if (moe && c.moe.moe_intermediate_size % etp != 0)
      return KS_ERR(M, "expert_tensor_parallel_size=", etp, ": moe_intermediate_size ", c.moe.moe_intermediate_size,
                    " does not divide by it (each routed expert's FFN is split over it); choose a size dividing it");
    if (moe && c.moe.shared_intermediate_size % l.tp != 0)
      return KS_ERR(M, "tensor_model_parallel_size=", l.tp, ": the shared experts' intermediate size ",
                    c.moe.shared_intermediate_size, " does not divide by it; choose a tp dividing it");
    if (moe && (l.tp * l.dp) % (etp * l.ep) != 0)
      return KS_ERR(M, "expert_tensor_parallel_size=", etp, " x expert_model_parallel_size=", l.ep,
                    " must divide tensor_model_parallel_size x the data-parallel size = ", l.tp * l.dp,
                    " (the expert grid etp x ep x edp spans the same ranks)");
    // The rollout under tp splits each expert's FFN (and the shared experts')
    // over its tp group (model/moe_mlp.h) and MLA's heads; the latent cache is
    // on every rank.
    const std::string R = "actor_rollout_ref.rollout.tensor_model_parallel_size=";
    if (moe && (c.moe.moe_intermediate_size % in.rollout.tp != 0 || c.moe.shared_intermediate_size % in.rollout.tp != 0))
      return KS_ERR(R, in.rollout.tp, " must divide moe_intermediate_size ", c.moe.moe_intermediate_size,
                    " and the shared experts' intermediate size ", c.moe.shared_intermediate_size,
                    " (the rollout splits each expert's FFN over its tp group)");
    if (moe && l.ep > 1 && l.cp > 1)
      return KS_ERR("not supported yet: ", M, "expert_model_parallel_size=", l.ep, " with context_parallel_size=",
                    l.cp, " (expert parallelism runs with tensor, data and pipeline parallelism, virtual stages "
                    "included, and the distributed optimizer)");
    if (moe && c.moe.num_experts % l.ep != 0)
      return KS_ERR(M, "expert_model_parallel_size=", l.ep, " must divide num_experts ", c.moe.num_experts);
    if (moe && c.mlp_bias)
      return KS_ERR("not supported yet: MLP biases (mlp_bias in config.json) in a mixture-of-experts model");
    if (l.cp > 1)
      return KS_ERR("not supported yet: ", M, "context_parallel_size=", l.cp, " for ", what,
                    "; use context_parallel_size=1");
  }
  if (l.cp > 1 && (l.cp_ulysses < 1 || l.cp % l.cp_ulysses != 0))
    return KS_ERR(M, "override_transformer_config.ulysses_degree_in_cp=", l.cp_ulysses, " must divide ", M,
                  "context_parallel_size=", l.cp);
  if (c.intermediate_size % l.tp != 0)
    return KS_ERR(M, "tensor_model_parallel_size=", l.tp, ": intermediate_size ", c.intermediate_size,
                  " does not divide by it; choose a tp dividing it");
  if (c.num_attention_heads % l.tp != 0)
    return KS_ERR(M, "tensor_model_parallel_size=", l.tp, ": num_attention_heads ", c.num_attention_heads,
                  " does not divide by it");
  if (l.vpp > 1 && l.pp < 2)
    return KS_ERR(M, "virtual_pipeline_model_parallel_size=", l.vpp, " needs pipeline_model_parallel_size >= 2");
  if (l.pp > 1) {  // the layer split kestrel train builds (uneven first/last stages, noop layers)
    parallel::PipelineSpec spec;
    spec.pp = int(l.pp);
    spec.vpp = int(l.vpp);
    spec.first_stage_layers = l.first_stage_layers;
    spec.last_stage_layers = l.last_stage_layers;
    spec.noop_layers = l.noop_layers;
    if (auto chunks = parallel::pipeline_chunks(spec, c.num_hidden_layers); !chunks) return chunks.status();
  }
  if (in.rollout.tp < 1 || c.num_attention_heads % in.rollout.tp != 0 || c.intermediate_size % in.rollout.tp != 0)
    return KS_ERR("actor_rollout_ref.rollout.tensor_model_parallel_size=", in.rollout.tp,
                  " must divide num_attention_heads ", c.num_attention_heads, " and intermediate_size ",
                  c.intermediate_size);
  if (in.batch.ppo_mini_batch_size * in.batch.n / l.dp < 1)
    return KS_ERR("actor_rollout_ref.actor.ppo_mini_batch_size=", in.batch.ppo_mini_batch_size, " x rollout.n=",
                  in.batch.n, " is fewer sequences than the ", l.dp, " data-parallel ranks");
  if (in.batch.prompt_len < 1 || in.batch.response_len < 1)
    return KS_ERR("data.max_prompt_length and data.max_response_length must be >= 1, got ", in.batch.prompt_len, " and ",
                  in.batch.response_len);
  if (in.batch.max_token_len <= 0 && in.batch.micro_batch_size < 0)
    return KS_ERR("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must be >= 1 or null");
  if (in.device_memory <= 0) return KS_ERR("--device-memory must be positive");
  const std::string OT = M + "override_transformer_config.";
  if (Status s = in.recompute.validate(OT); !s.is_ok()) return s;
  if (in.critic) {
    if (Status s = in.critic_recompute.validate("critic.megatron.override_transformer_config."); !s.is_ok()) return s;
  }
  return Status::ok();
}

MemoryPlan plan_memory(const PlanInputs& in) {
  MemoryPlan p;
  p.inputs = in;
  const PlanLayout& l = in.layout;
  p.shapes = plan_shapes(in, l.tp, l.pp, false, l.ep, l.expert_tp());
  const PlanShapes& s = p.shapes;
  const DType dt = in.dtype;
  const int64_t a = int64_t(dtype_size(dt));
  p.micro = plan_micro_batches(in.batch, l.dp, in.batch.max_token_len, in.batch.micro_batch_size, true);

  // ---- residents of every phase ----
  CategoryBytes resident{};
  const ModelStates actor = trained_states(in, s.params, dt, in.reuse_fp32_param, routed_expert_elems(in, s));
  // Buffers (e_score_correction_bias f32) sit beside the weights in Params: no gradient, no optimizer state.
  resident[cat(MemCategory::Params)] += actor.params + rope_bytes(s) + s.buffers;
  resident[cat(MemCategory::Grads)] += actor.grads;
  resident[cat(MemCategory::OptimizerState)] += actor.optimizer;
  if (in.ref) resident[cat(MemCategory::Params)] += a * s.params + rope_bytes(s) + s.buffers;  // the frozen copy
  PlanShapes cs;
  if (in.critic) {
    cs = plan_shapes(in, l.tp, l.pp, /*value_head=*/true, l.ep, l.expert_tp());
    const ModelStates c =
        trained_states(in, cs.params, in.critic_dtype, in.critic_reuse_fp32_param, routed_expert_elems(in, cs));
    resident[cat(MemCategory::Params)] += c.params + rope_bytes(cs) + cs.buffers;
    resident[cat(MemCategory::Grads)] += c.grads;
    resident[cat(MemCategory::OptimizerState)] += c.optimizer;
  }
  CategoryBytes offloadable{};  // what phase-level offload takes off the device outside the update
  if (in.offload.grad) offloadable[cat(MemCategory::Grads)] = actor.grads;
  if (in.offload.optimizer) offloadable[cat(MemCategory::OptimizerState)] = actor.optimizer;

  // ---- the rollout's weights and KV cache (rollout/engine.cpp kv_cache_bytes_for) ----
  // A copy when the rollout's tp or dtype differs, and under pp (the rollout
  // runs the whole model: rollout/reshard.h RolloutWeights).
  const bool copy = in.rollout.tp != l.tp || in.rollout.dtype != dt || l.pp > 1 || l.ep != in.rollout.ep;
  const PlanShapes rs = plan_shapes(in, in.rollout.tp, 1, false, in.rollout.ep);
  const int64_t ra = int64_t(dtype_size(in.rollout.dtype));
  const int64_t copy_bytes = copy ? ra * rs.params + rope_bytes(rs) + rs.buffers : 0;
  if (copy && in.offload.param) offloadable[cat(MemCategory::Params)] = actor.params;
  plan_kv_cache(p, in, rs);
  if (p.kv_blocks < 2)
    p.notes.push_back("actor_rollout_ref.rollout.gpu_memory_utilization=" + std::to_string(in.rollout.gpu_memory_utilization) +
                      " of " + format_bytes(in.device_memory) + " does not hold the rollout weights and a KV cache: "
                      "kestrel train refuses it; raise it");

  const int64_t packed = packed_weight_bytes(in.model, rs, in.rollout.dtype);
  // Scoring's own packs (rl/trainer.cpp compute_log_probs, tp = 1 only): the
  // actor's when the rollout runs a copy (in place it shares the rollout's),
  // then the reference model's, one at a time.
  const bool scoring_packs = l.tp == 1 && ((copy && in.batch.old_log_prob) || in.ref);
  const int64_t scoring_packed = scoring_packs ? packed_weight_bytes(in.model, s, dt, l.pp == 1) : 0;
  auto phase = [&](std::string name, bool kv_awake, int64_t acts, int64_t other, std::string detail) {
    PhasePlan ph;
    ph.name = std::move(name);
    ph.bytes = resident;
    const bool update = ph.name == "actor update" || ph.name == "critic";
    if (!update)
      for (size_t i = 0; i < kNumMemCategories; ++i) ph.bytes[i] -= offloadable[i];
    if (kv_awake) {
      ph.bytes[cat(MemCategory::KVCache)] += p.kv_cache_bytes;
      ph.bytes[cat(MemCategory::Params)] += copy_bytes + packed;
    }
    ph.bytes[cat(MemCategory::Activations)] += acts;
    ph.bytes[cat(MemCategory::Other)] += other;
    ph.detail = std::move(detail);
    p.phases.push_back(std::move(ph));
  };
  phase("rollout", true, rollout_activations(rs, in.model, in.rollout), 0,
        "KV cache " + format_bytes(p.kv_cache_bytes) + " (" + std::to_string(p.kv_blocks) + " blocks, " +
            std::to_string(p.kv_tokens) + " tokens)" +
            (copy ? ", rollout weight copy " + format_bytes(copy_bytes) : "") +
            (packed ? ", packed weights " + format_bytes(packed) : ""));
  if (in.batch.old_log_prob || in.ref) {
    const MicroBatchPlan sm = plan_micro_batches(in.batch, l.dp, in.batch.log_prob_micro_batch_size > 0 ? 0 : in.batch.log_prob_max_token_len,
                                                 in.batch.log_prob_micro_batch_size, false);
    const int64_t acts = scoring_activations(s, in, sm.max_tokens, dt) +
                         packed_batch_bytes(in.batch, sm.mini_batch_tokens, sm.mini_batch_seqs, sm.micro_batches, sm.mini_batch_prefixes);
    phase("scoring", true, acts, 0,
          std::string(in.batch.old_log_prob ? "old log-probs" : "") + (in.batch.old_log_prob && in.ref ? " + " : "") +
              (in.ref ? "reference log-probs" : "") + ", micro-batches of " + std::to_string(sm.max_tokens) +
              " tokens" + (scoring_packed ? ", its packed weights " + format_bytes(scoring_packed) : ""));
    p.phases.back().bytes[cat(MemCategory::Params)] += scoring_packed;
  }
  if (in.critic) {
    const TrainActivations ca = train_activations(cs, in, p.micro.max_tokens, in.critic_dtype, true);
    PlanBatching values = in.batch;
    values.replay_values = 0;  // the critic routes for itself
    const int64_t critic_packed = train_packed_bytes(in, cs, in.critic_dtype, p.micro, true);
    phase("critic", false, ca.peak + packed_batch_bytes(values, p.micro.mini_batch_tokens, p.micro.mini_batch_seqs, p.micro.micro_batches,
                                                p.micro.mini_batch_prefixes), 0,
          "values and update, " + std::to_string(p.micro.max_tokens) + "-token micro-batches" +
              (critic_packed ? ", its packed weights " + format_bytes(critic_packed) : ""));
    p.phases.back().bytes[cat(MemCategory::Params)] += critic_packed;
  }
  // ---- the actor update ----
  p.actor = train_activations(s, in, p.micro.max_tokens, dt);
  int64_t acts = p.actor.peak;
  if (l.pp > 1) {
    // 1F1B: stage 0 holds pp micro-batches in flight (interleaving: x (1 + (p-1)/(p v))); the head is on the last stage.
    const double inflight = double(std::min<int64_t>(l.pp, std::max<int64_t>(1, p.micro.micro_batches))) *
                            (l.vpp > 1 ? 1.0 + double(l.pp - 1) / double(l.pp * l.vpp) : 1.0);
    const int64_t stage0 = int64_t((inflight - 1) * double(p.actor.kept_layers)) + p.actor.kept_layers +
                           p.actor.recompute_live + p.actor.backward;
    acts = std::max(stage0, p.actor.peak);
  }
  acts += packed_batch_bytes(in.batch, p.micro.mini_batch_tokens, p.micro.mini_batch_seqs, p.micro.micro_batches,
                             p.micro.mini_batch_prefixes);
  int64_t other = 0;
  if (l.distributed_optimizer) {
    // reduce_to_owners' received pieces [ranks, owned part of a bucket] f32, gather_params' copy of the
    // shard: the dense parameters' over dp, then the routed experts' kept apart over edp (a size-1 group: none).
    const int64_t experts = routed_expert_elems(in, s), bucket = in.dp_bucket_bytes / 4;
    const auto owners = [&](int64_t n, int64_t ranks) -> int64_t {
      if (n <= 0 || ranks <= 1) return 0;
      const int64_t shard = ceil_div(n, ranks);
      return std::max(4 * ranks * std::min(shard, bucket), a * shard);
    };
    other = std::max(owners(s.params - experts, l.dp), owners(experts, l.edp()));
  }
  // Megatron's aux_loss over the micro-batch: its one group's offsets, an i32 [2] host tensor (Other) while
  // the router's loss runs (model/moe_mlp.cpp aux_groups); seq_aux_loss reads the batch's cu_seqlens.
  if (s.moe_layers > 0 && in.moe.aux_loss_coeff > 0 && in.moe.load_balancing_type == "aux_loss")
    other = std::max<int64_t>(other, 8);
  const int64_t train_packed = train_packed_bytes(in, s, dt, p.micro, false);
  phase("actor update", false, acts, other,
        "largest micro-batch " + std::to_string(p.micro.max_tokens) + " tokens, peak at " + p.actor.at +
            (train_packed ? ", packed weights " + format_bytes(train_packed) : ""));
  p.phases.back().bytes[cat(MemCategory::Params)] += train_packed;
  p.peak_phase = 0;
  for (size_t i = 0; i < p.phases.size(); ++i)
    if (p.phases[i].total() > p.phases[p.peak_phase].total()) p.peak_phase = i;

  plan_flops(p, in, rs);
  plan_comm(p, in, s);

  // ---- what training cannot do yet ----
  if (in.offload.param || in.offload.grad || in.offload.optimizer)
    p.notes.push_back("param/grad/optimizer offload act on a GPU (trainer.device=cuda), modelled here as the state "
                      "leaving the device outside its update; on the CPU backend host memory is the device memory "
                      "and nothing moves");
  return p;
}

std::vector<PlanAdvice> plan_advice(const PlanInputs& in) {
  std::vector<PlanAdvice> out;
  const MemoryPlan base = plan_memory(in);
  const double base_flops = base.flops_actor + base.flops_scoring + base.flops_rollout;
  const std::string A = "actor_rollout_ref.actor.", M = A + "megatron.", OT = M + "override_transformer_config.";
  struct Candidate {
    std::string change;
    bool supported;
    std::function<void(PlanInputs&)> apply;
  };
  std::vector<Candidate> tried;
  auto evaluate = [&](const std::string& change, bool supported, const PlanInputs& x) {
    const MemoryPlan p = plan_memory(x);
    PlanAdvice adv;
    adv.change = change;
    adv.supported = supported;
    adv.peak = p.peak();
    adv.fits = p.fits();
    const double flops = p.flops_actor + p.flops_scoring + p.flops_rollout;
    adv.effect = "peak " + format_bytes(p.peak()) + " (" + p.phases[p.peak_phase].name + ")";
    if (std::abs(flops / base_flops - 1) > 0.005) adv.effect += ", " + pct(flops / base_flops - 1) + " FLOPs";
    return adv;
  };
  auto try_change = [&](const std::string& change, bool supported, const std::function<void(PlanInputs&)>& f) {
    PlanInputs x = in;
    f(x);
    if (!validate_plan_inputs(x).is_ok()) return;
    tried.push_back({change, supported, f});
    out.push_back(evaluate(change, supported, x));
  };
  const std::string R = "actor_rollout_ref.rollout.";
  // Cheapest first: the KV cache's share, the distributed optimizer (its
  // communication equals the all-reduce's), selective recompute, a smaller
  // micro-batch, full recompute, offload, then more model parallelism.
  if (base.phases[base.peak_phase].name != "actor update" && base.kv_cache_bytes > 0) {
    for (double u : {0.4, 0.3, 0.2, 0.1}) {
      if (u >= in.rollout.gpu_memory_utilization) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%sgpu_memory_utilization=%.1f", R.c_str(), u);
      try_change(buf, true, [u](PlanInputs& x) { x.rollout.gpu_memory_utilization = u; });
      if (!out.empty() && out.back().fits) break;
    }
  }
  if (in.layout.dp > 1 && !in.layout.distributed_optimizer)
    try_change(OT + "use_distributed_optimizer=true", true, [](PlanInputs& x) { x.layout.distributed_optimizer = true; });
  if (in.dtype != DType::F32 && !in.reuse_fp32_param)
    try_change(OT + "reuse_fp32_param=true", true, [](PlanInputs& x) { x.reuse_fp32_param = true; });
  if (!in.recompute.enabled()) {
    try_change(OT + "recompute_granularity=selective " + OT + "recompute_modules=[core_attn]", true,
               [](PlanInputs& x) { x.recompute = selective({"core_attn"}); });
    try_change(OT + "recompute_activation_function=true " + OT + "recompute_norm=true", true, [](PlanInputs& x) {
      x.recompute.activation_function = x.recompute.norm = true;
    });
    try_change(OT + "recompute_granularity=selective " + OT + "recompute_modules=[core_attn,mlp,layernorm]", true,
               [](PlanInputs& x) { x.recompute = selective({"core_attn", "mlp", "layernorm"}); });
  }
  const int64_t seq = in.batch.prompt_len + in.batch.response_len;
  if (in.batch.max_token_len > 0 && base.micro.max_tokens > seq) {
    // The largest halving of the token budget that fits (one full sequence at least).
    int64_t budget = in.batch.max_token_len;
    do {
      budget = std::max(seq, budget / 2);
      PlanInputs x = in;
      x.batch.max_token_len = budget;
      if (plan_memory(x).fits()) break;
    } while (budget > seq);
    try_change(A + "ppo_max_token_len_per_gpu=" + std::to_string(budget), true,
               [budget](PlanInputs& x) { x.batch.max_token_len = budget; });
  } else if (in.batch.max_token_len <= 0 && base.micro.mini_batch_seqs > 1) {
    int64_t k = in.batch.micro_batch_size > 0 ? in.batch.micro_batch_size : base.micro.mini_batch_seqs;
    do {
      k = std::max<int64_t>(1, k / 2);
      PlanInputs x = in;
      x.batch.micro_batch_size = k;
      if (plan_memory(x).fits()) break;
    } while (k > 1);
    try_change(A + "ppo_micro_batch_size_per_gpu=" + std::to_string(k), true,
               [k](PlanInputs& x) { x.batch.micro_batch_size = k; });
  }
  if (in.recompute.granularity != model::RecomputeGranularity::Full)
    try_change(OT + "recompute_granularity=full " + OT + "recompute_method=uniform " + OT + "recompute_num_layers=1",
               true, [](PlanInputs& x) {
                 x.recompute = model::make_recompute_policy("full", "uniform", 1, {}, false, -1, false, -1, "").value();
               });
  if (!in.offload.grad || !in.offload.optimizer)
    try_change(M + "grad_offload=true " + M + "optimizer_offload=true", false,
               [](PlanInputs& x) { x.offload.grad = x.offload.optimizer = true; });
  const int64_t tp2 = in.layout.tp * 2;
  if (in.layout.dp % 2 == 0)  // with sequence parallelism (a MoE model needs it under tp)
    try_change(M + "tensor_model_parallel_size=" + std::to_string(tp2) + " (dp " + std::to_string(in.layout.dp / 2) +
                   ")" + (in.layout.sequence_parallel ? "" : " " + M + "sequence_parallel=true"),
               true, [tp2](PlanInputs& x) {
                 if (x.layout.etp == x.layout.tp) x.layout.etp = 0;  // the experts keep following tp
                 x.layout.tp = tp2;
                 x.layout.dp /= 2;
                 x.layout.sequence_parallel = true;
               });
  if (in.layout.dp % 2 == 0) {
    try_change(M + "pipeline_model_parallel_size=" + std::to_string(in.layout.pp * 2), true, [](PlanInputs& x) {
      x.layout.pp *= 2;
      x.layout.dp /= 2;
    });
    try_change(M + "context_parallel_size=" + std::to_string(in.layout.cp * 2), true, [](PlanInputs& x) {
      if (x.layout.cp > 1 && x.layout.cp_ulysses == x.layout.cp) x.layout.cp_ulysses *= 2;  // Ulysses stays Ulysses
      x.layout.cp *= 2;  // the ring (and the hybrid's ring) doubles
      x.layout.dp /= 2;
    });
  }
  // No single change fits: the changes combined in the order above (cost),
  // each kept when it lowers the peak, until the plan fits.
  if (std::none_of(out.begin(), out.end(), [](const PlanAdvice& a) { return a.fits; })) {
    PlanInputs x = in;
    std::string changes;
    bool supported = true;
    int64_t peak = base.peak();
    for (const Candidate& c : tried) {
      PlanInputs y = x;
      c.apply(y);
      if (!validate_plan_inputs(y).is_ok()) continue;
      const MemoryPlan p = plan_memory(y);
      if (p.peak() >= peak) continue;
      x = y, peak = p.peak();
      changes += (changes.empty() ? "" : " + ") + c.change;
      supported = supported && c.supported;
      if (p.fits()) break;
    }
    if (!changes.empty()) out.push_back(evaluate("combined: " + changes, supported, x));
  }
  // Fitting changes first, in the order above (cost); then the rest by peak.
  std::stable_sort(out.begin(), out.end(), [](const PlanAdvice& x, const PlanAdvice& y) {
    if (x.fits != y.fits) return x.fits;
    return x.fits ? false : x.peak < y.peak;
  });
  return out;
}

}  // namespace kestrel::rl
