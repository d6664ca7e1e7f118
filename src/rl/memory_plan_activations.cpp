// The memory model's activation terms (see memory_plan.h): what one forward +
// backward of a micro-batch keeps and allocates, layer by layer, and what a
// scoring forward holds. Every term names the tensor of the code it stands for.
//
// A layer is dense (model/dense_blocks.cpp) or MoE (model/moe_mlp.cpp) in its
// MLP, dense GQA or MLA (model/mla_attention.cpp) in its attention. The
// backward's moments are walked in the order the code allocates: the blocks
// top down (model/forward_backward.cpp), each block's MLP then its attention
// (model/block.cpp), each sub-block's locals in the order of its backward.
#include <algorithm>

#include "backend/cpu/packed_linear.h"
#include "backend/cpu/skinny_gemm.h"
#include "ops/moe.h"
#include "rl/memory_plan.h"
#include "train/engine.h"

namespace kestrel::rl {

bool train_packs_planned(const PlanShapes& s, const PlanInputs& in, int64_t T, DType dt) {
  const PlanLayout& l = in.layout;
  // The engine's rule, and micro-batches long enough to take the packed path (WeightPacks::linear).
  return train::train_packs_apply(Device::CPU, dt, l.tp, l.pp, l.cp, s.moe_layers > 0, in.model.mla.enabled) &&
         T > cpu::packed_linear_min_rows(dt);
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

// Rows of the residual stream (Tl) and inside the tp regions (Tp) of a
// T-token batch, as model/train_exec.cpp: SP pads T to a multiple of tp.
struct Rows {
  int64_t T = 0, Tp = 0, Tl = 0;
};
Rows rows_of(int64_t T, int64_t tp, bool sp) {
  Rows r;
  r.T = T;
  r.Tp = sp ? ceil_div(T, tp) * tp : T;
  r.Tl = sp ? r.Tp / tp : r.Tp;
  return r;
}

bool sp_on(const PlanInputs& in) { return in.layout.sequence_parallel && in.layout.tp > 1; }

// The backward's f32 scratch buffers (model/train_exec.h GradBuf, one per kind
// for the whole backward, made at first use). DNorm comes with the head.
enum Buf : unsigned { kTmpL = 2, kDF1 = 4, kDF2 = 8, kDAct = 16, kDAttn = 32, kDQ = 64, kDK = 128, kDV = 256 };

// One moment of a block's backward or forward: the block's bytes beyond what
// is alive around it, the transient part of them (workspace), the GradBufs
// allocated by then, and where it is.
struct Moment {
  int64_t bytes = 0, ws = 0;
  unsigned bufs = 0;
  const char* at = "";
};

// The shapes and options every layer term reads.
struct Ctx {
  const PlanShapes& s;
  const PlanInputs& in;
  const io::ModelConfig& c;
  Rows r;
  int64_t a = 4;  // compute dtype bytes
  bool bf = false, sp = false, tp = false;
  // The training forward's linears multiply by packed weights (train_packs_planned): no widening scratch.
  bool packed = false;
  // MoE (model/moe_mlp.cpp). own: the real rows this rank sends to the
  // experts (its sequence-parallel share under tp; every row at tp = 1); N:
  // its (token, slot) rows after routing; ep: expert parallelism's exchange
  // (1: none), Nr the rows this rank's experts receive from it (planned
  // balanced: each ep rank's tokens spread evenly over the ep ranks,
  // parallel/ep_dispatch.cpp; N without ep); etp: the expert-tensor-parallel
  // exchange's size (1: none), blk its padded block (the largest rank's Nr),
  // Na the rows this rank's expert shards run (every etp rank's, gathered);
  // G the largest expert group of those (its bound); capacity on.
  int64_t own = 0, N = 0, ep = 1, Nr = 0, etp = 1, blk = 0, Na = 0, G = 0;
  bool capacity = false;
  // Context parallelism (parallel/cp_attention.h): cp, its Ulysses degree u
  // and ring size R = cp / u; the attention's work layout holds u * T rows of
  // H/u query heads and Hkw kv heads (one, replicated, when Hkv < u).
  int64_t cp = 1, u = 1, R = 1, Hkw = 0;
};

// The context-parallel attention's extra bytes over the plain attention
// (parallel/cp_attention.cpp), a: the compute dtype's size.
struct CpAttn {
  int64_t kept = 0;  // per layer, beyond q, k, v, attn, lse (Ulysses: the work copies of q, k, v, out; q, k, v released)
  int64_t work = 0;  // the work copies of q, k, v, out themselves (Ulysses; the ring keeps q, k, v, attn)
  int64_t fwd = 0;   // the forward's transients (all-to-alls, ring buffers and f32 merge accumulators)
  int64_t bwd = 0;   // the backward's transients at the attention core (work gradients, ring buffers, all-to-alls)
};
CpAttn cp_attn(const Ctx& x) {
  CpAttn c;
  if (x.cp <= 1) return c;
  const int64_t a = x.a, T = x.r.T, hd = x.s.hd, q = x.s.H * hd, kv = x.s.Hkv * hd;
  const int64_t Tg = x.u * T, qw = q / x.u, kvw = x.Hkw * hd;  // work rows, a work row's q and kv columns
  if (x.u > 1) {
    // dense_blocks.cpp drops A.q/k/v (the cp attention keeps its work copies): + the work q, k, v, out - q, k, v.
    c.work = a * Tg * (2 * qw + 2 * kvw);
    c.kept = c.work - a * x.r.Tp * (q + 2 * kv);
  }
  // The forward: each Ulysses all-to-all's send and receive [Tg, qw] at most;
  // the ring's double k/v blocks, its f32 accumulator and block output [Tg, qw]
  // and block lse [Hw, Tg].
  c.fwd = std::max(x.u > 1 ? 2 * a * Tg * qw : 0,
                   x.R > 1 ? 4 * a * Tg * kvw + 8 * Tg * qw + 4 * (x.s.H / x.u) * Tg : 0);
  // The backward (f32 activation gradients, cp_attention_bwd): Ulysses
  // scatters dout to the work layout and makes the work dq, dk, dv [Tg, ...];
  // the ring (R > 1) adds its double k/v blocks (compute dtype), two f32
  // travelling dK and dV accumulators, this step's dK/dV share and the local
  // dq accumulator; after the ring, each Ulysses gather sends and receives
  // [Tg, qw] at most.
  const int64_t work = x.u > 1 ? 4 * Tg * (2 * qw + 2 * kvw) : 0;
  const int64_t ring = x.R > 1 ? 4 * a * Tg * kvw + 24 * Tg * kvw + 4 * Tg * qw : 0;
  const int64_t gather = x.u > 1 ? 8 * Tg * qw : 0;
  c.bwd = work + std::max(ring, gather);
  return c;
}

// The MoE rows of a T-token micro-batch on tp rank `rank` (sets the MoE
// fields of Ctx above): dropless N = own*k; padded to capacity N = E*cap (the
// capacity of all T routed tokens, model/moe_mlp.cpp route); dropping to it
// N <= own*k (the bound). The groups are Megatron's expert grid
// (etp-ep-edp-pp over the world ranks, parallel/grid.h): world rank r's etp
// group is r - r % etp .. +etp-1, its ep group r % etp + etp*i + etp*ep*(r /
// (etp*ep)); a rank holds the sequence-parallel share of tp rank r % tp of
// its dp rank's micro-batch, every dp rank's taken at the same (largest) size.
void set_moe_rows(Ctx& x, bool apply_capacity, int64_t rank = 0) {
  const io::MoeConfig& m = x.c.moe;
  if (m.num_experts <= 0) return;
  const int64_t T = x.r.T, k = std::max<int64_t>(1, m.top_k), E = m.num_experts;
  const int64_t tp = std::max<int64_t>(1, x.in.layout.tp);
  x.etp = x.s.etp;
  x.ep = std::max<int64_t>(1, x.in.layout.ep);
  const int64_t etp = x.etp, ep = x.ep;
  const int64_t cap = apply_capacity && x.in.moe.capacity_factor > 0
                          ? ops::moe_expert_capacity(T, k, E, x.in.moe.capacity_factor) : 0;
  x.capacity = cap > 0;
  const bool pad = x.capacity && x.in.moe.pad_to_capacity;
  // World rank r's real rows under sequence parallelism: [j Tl, (j+1) Tl) of the T, j = r % tp.
  const auto own_of = [&](int64_t r) { return x.sp ? std::clamp<int64_t>(T - (r % tp) * x.r.Tl, 0, x.r.Tl) : T; };
  const auto sent = [&](int64_t r) { return pad ? E * cap : own_of(r) * k; };
  // A token visits an expert once: an expert's group from one rank is at most its rows (or the capacity).
  const auto group = [&](int64_t r) { return pad ? cap : x.capacity ? std::min(own_of(r), cap) : own_of(r); };
  const auto ep_member = [&](int64_t r, int64_t i) { return r % etp + etp * i + etp * ep * (r / (etp * ep)); };
  const auto received = [&](int64_t r) {  // balanced: 1/ep of every ep rank's rows
    int64_t n = 0;
    for (int64_t i = 0; i < ep; ++i) n += sent(ep_member(r, i));
    return ep > 1 ? n / ep : n;
  };
  const auto group_bound = [&](int64_t r) {
    int64_t g = 0;
    for (int64_t i = 0; i < ep; ++i) g += group(ep_member(r, i));
    return g;
  };
  x.own = own_of(rank);
  x.N = sent(rank);
  x.Nr = received(rank);
  x.blk = x.Na = x.G = 0;
  const int64_t first = rank - rank % etp;
  for (int64_t i = 0; i < etp; ++i) {
    x.Na += received(first + i);
    x.blk = std::max(x.blk, received(first + i));  // the padded block of the exchange: the largest rank's rows
    x.G += group_bound(first + i);
  }
}

int64_t buf_bytes(const Ctx& x, unsigned mask) {
  const int64_t Tp = x.r.Tp, Tl = x.r.Tl, D = x.s.D, F = x.s.F, q = x.s.H * x.s.hd, kv = x.s.Hkv * x.s.hd;
  int64_t b = 0;
  if (mask & kTmpL) b += 4 * Tl * D;
  for (unsigned k : {kDF1, kDF2, kDAct})
    if (mask & k) b += 4 * Tp * F;
  if (mask & kDAttn) b += 4 * Tp * q;
  if (mask & kDQ) b += 4 * Tp * q;
  if (mask & kDK) b += 4 * Tp * kv;
  if (mask & kDV) b += 4 * Tp * kv;
  return b;
}

// ---- what a layer's forward keeps (model/activations.h) -----------------------

// One layer's LayerActivations without recompute, and what each recompute
// flag drops from it.
struct LayerStore {
  int64_t full = 0;
  int64_t core_attn = 0;  // attn, lse
  int64_t norm = 0;       // norm1, norm2 [Tp, D]
  int64_t mlp = 0;        // selective mlp (dense MLP only): gate, up, act
  int64_t act = 0;        // activation function: the dense act [Tp, F]; MoE the experts' act [N, Fe] and the shared act [T, Fs]
  int64_t attn_part = 0;  // the attention sub-block's own fields (q, k, v, attn, lse, q/k-norm or MLA latents)
  int64_t mlp_part = 0;   // the MLP sub-block's own fields
};

int64_t moe_route_bytes(const Ctx& x) {
  const io::MoeConfig& m = x.c.moe;
  const int64_t T = x.r.T, E = m.num_experts, k = m.top_k;
  const int64_t logit = (m.router_fp32 || x.in.moe.router_logits_fp32) ? 4 : x.a;
  // Every real token's: logits [T, E], scores f32 [T, E], topk_idx i32 /
  // topk_w f32 [T, k], chosen_idx i32 [T, k] under capacity; this rank's
  // routing: dest i32 [own, k], source i32 [N]; the ep exchange's sort_index
  // and unsort_index i32 [Nr]; the etp exchange's sort_index i32 [Na].
  return logit * T * E + 4 * T * E + 8 * T * k + (x.capacity ? 4 * T * k : 0) + 4 * x.own * k + 4 * x.N +
         (x.ep > 1 ? 8 * x.Nr : 0) + (x.etp > 1 ? 4 * x.Na : 0);
}

LayerStore layer_store_full(const Ctx& x, int64_t layer) {
  const PlanShapes& s = x.s;
  const int64_t a = x.a, T = x.r.T, Tp = x.r.Tp, Tl = x.r.Tl, D = s.D;
  LayerStore st;
  // x_in, x_mid [Tl, D]; norm1, norm2 [Tp, D] (the gathered copies under SP); rstd1, rstd2 f32 [Tl].
  const int64_t block = a * (2 * Tl * D + 2 * Tp * D) + 8 * Tl;
  st.norm = 2 * a * Tp * D;
  if (x.c.mla.enabled) {
    const io::MlaConfig& m = x.c.mla;
    const int64_t H = s.H, qk = m.qk_head_dim(), vd = m.v_head_dim, ql = m.q_lora_rank;  // H: this rank's heads
    // q, k [Tp, H*qk], v, attn [Tp, H*v], lse f32 [H, T]; cq, cq_n [Tp, q_lora], rstd_q f32 [Tp]; ckv, ckv_n
    // [Tp, kv_lora], rstd_kv f32 [Tp] (the latents of every row: their projections are replicated).
    st.attn_part = a * Tp * (2 * H * qk + 2 * H * vd) + 4 * H * T + (ql > 0 ? 2 * a * Tp * ql + 4 * Tp : 0) +
                   2 * a * Tp * m.kv_lora_rank + 4 * Tp;
    st.core_attn = a * Tp * H * vd + 4 * H * T;
  } else {
    const int64_t q = s.H * s.hd, kv = s.Hkv * s.hd;
    // q (post-RoPE; q_lin itself without qk_norm), k, v, attn [Tp, H*hd], lse f32 [H, T].
    st.attn_part = a * Tp * (2 * q + 2 * kv) + 4 * s.H * T;
    if (s.qk_norm) st.attn_part += a * Tp * (q + kv) + 4 * Tp * (s.H + s.Hkv);  // q_lin, k_lin; rstd_q, rstd_k f32
    st.core_attn = a * Tp * q + 4 * s.H * T;
    // Context parallelism: Ulysses's work copies replace q, k, v; selective
    // core_attn drops them with attn and lse and keeps q, k, v instead.
    const int64_t cp_kept = cp_attn(x).kept;
    st.attn_part += cp_kept;
    st.core_attn += cp_kept;
  }
  if (x.c.is_moe_layer(layer)) {
    const io::MoeConfig& m = x.c.moe;
    const int64_t Fe = s.Fe, Fs = s.Fs, N = x.N, Na = x.Na;  // Fe, Fs: this rank's shares
    // The routing, xs [Na, D] (the rows this rank's expert shards run), gate,
    // up, act [Na, Fe], ys [N, D] (this rank's rows, back); shared gate, up,
    // act [Tp, Fs], its output [Tp, D] (a partial sum under tp) and Qwen2-MoE's gate logit [Tp, 1].
    st.mlp_part = moe_route_bytes(x) + a * Na * (D + 3 * Fe) + a * N * D;
    if (m.shared_intermediate_size > 0) st.mlp_part += a * Tp * (3 * Fs + D) + (m.shared_expert_gate ? a * Tp : 0);
    st.act = a * Na * Fe + (m.shared_intermediate_size > 0 ? a * Tp * Fs : 0);
  } else {
    st.mlp_part = 3 * a * Tp * s.F;  // gate, up, act [Tp, F]
    st.mlp = 3 * a * Tp * s.F;
    st.act = a * Tp * s.F;
  }
  st.full = block + st.attn_part + st.mlp_part;
  return st;
}

// What block `index` keeps under p (model/block.cpp, dense_blocks.cpp,
// moe_mlp.cpp, forward_backward.cpp): everything less its selective drops; a
// block of a full-recompute chunk keeps only the chunk's input x_in [Tl, D]
// (on its first block). Selective mlp applies to dense MLPs only.
int64_t layer_store(const Ctx& x, const LayerStore& st, const model::BlockRecompute& p, int64_t index) {
  if (p.full) return p.chunk_first == index ? x.a * x.r.Tl * x.s.D : 0;
  int64_t b = st.full;
  if (p.core_attn) b -= st.core_attn;
  if (p.norm) b -= st.norm;
  if (p.mlp && st.mlp > 0) b -= st.mlp;
  else if (p.act) b -= st.act;
  return b;
}

// ---- the backward's moments of one block ------------------------------------

// The dense block's transients (CPU backend: bf16 GEMM operands widened to
// f32 scratch, backend/cpu/linear.cpp; a weight's f32 copy for dx, then the
// input's for dW).
struct DenseWs {
  int64_t mlp = 0, att_o = 0, att_qkv = 0, fwd_gemm = 0;
};
DenseWs dense_ws(const Ctx& x) {
  const PlanShapes& s = x.s;
  const int64_t Tp = x.r.Tp, D = s.D, F = s.F, q = s.H * s.hd, kv = s.Hkv * s.hd;
  DenseWs w;
  // Under SP the row-parallel backward's dy gathered f32 [Tp, D]
  // (parallel/tp_layers.cpp row_linear_bwd), beside its GEMM's widening.
  const int64_t dy_full = x.sp ? 4 * Tp * D : 0;
  // down (its weight, then act widened), then gate/up (their weights, then norm2).
  w.mlp = x.bf ? std::max(dy_full + 4 * std::max(D * F, Tp * F), 4 * std::max(F * D, Tp * D)) : dy_full;
  // The attention's backward: o's (its weight, then attn widened) with a
  // selective core_attn's attn and lse still alive; then q/k/v's (their
  // weights, then norm1), with qk_norm beside dq_in, dk_in f32.
  w.att_o = dy_full + (x.bf ? 4 * std::max(D * q, Tp * q) : 0);
  w.att_qkv = x.bf ? 4 * std::max({q * D, kv * D, Tp * D}) : 0;
  if (s.Hkv * x.in.layout.tp > x.c.num_key_value_heads && x.tp) {
    // A kv head replicated over tp ranks (dense_blocks.cpp kv_linear_bwd):
    // k's (then v's) partial weight gradient f32 [kv, D] beside its widening,
    // then summed over tp through every kv head's f32 [Hkv, kv*D] (parallel/tp_attention.cpp).
    const int64_t wid_k = x.bf ? 4 * std::max(kv * D, Tp * D) : 0;
    w.att_qkv = std::max(w.att_qkv, 4 * kv * D + std::max(wid_k, 4 * x.c.num_key_value_heads * kv * D));
  }
  if (s.qk_norm) w.att_qkv += 4 * Tp * (q + kv);  // dq_in, dk_in f32 through q/k/v's backward
  // Selective mlp's gate/up GEMMs again (column-parallel: no communication): x, W, y widened to f32 (bf16).
  w.fwd_gemm = x.bf && !x.packed ? 4 * (Tp * F + D * F + Tp * D) : 0;
  return w;
}

// f32 widening of a bf16 linear_bwd with dx: the weight [out, in], then (with
// dW) the input [rows, in]; nothing in f32.
int64_t ws_bwd(const Ctx& x, int64_t rows, int64_t out, int64_t in, bool dw = true) {
  return x.bf ? 4 * std::max(out * in, dw ? rows * in : 0) : 0;
}
// f32 widening of a bf16 linear_fwd: x [rows, in], W [out, in], y [rows, out] (bf16 y), the bias [out].
int64_t ws_fwd(const Ctx& x, int64_t rows, int64_t out, int64_t in, bool f32_out = false, bool bias = false) {
  return x.bf ? 4 * (rows * in + out * in + (f32_out ? 0 : rows * out) + (bias ? out : 0)) : 0;
}

// The dense MLP's backward (dense_blocks.cpp DenseMlp::backward): its
// GradBufs, norm2 rebuilt, selective mlp's gate/up/act or act rebuilt, the
// down and gate/up backward's widening (or selective mlp's forward GEMMs).
Moment dense_mlp_bwd(const Ctx& x, const model::BlockRecompute& k, int64_t* rebuilt) {
  const DenseWs w = dense_ws(x);
  const int64_t a = x.a, Tp = x.r.Tp, D = x.s.D, F = x.s.F;
  const int64_t n2 = k.norm ? a * Tp * D : 0;
  const int64_t again = k.mlp ? 3 * a * Tp * F : (k.act ? a * Tp * F : 0);
  int64_t ws = w.mlp;
  if (k.mlp) ws = std::max(ws, w.fwd_gemm - a * Tp * F);  // gate/up GEMMs run before act exists
  *rebuilt = std::max(*rebuilt, n2 + again);
  return {n2 + again + ws, ws, kTmpL | kDF1 | kDF2 | kDAct, " MLP"};
}

// The dense attention's backward: norm1 rebuilt, selective core_attn's attn
// and lse rebuilt until the core's backward, the GEMMs' widening.
void dense_att_bwd(const Ctx& x, const model::BlockRecompute& k, int64_t* rebuilt, std::vector<Moment>& out) {
  const DenseWs w = dense_ws(x);
  const int64_t a = x.a, Tp = x.r.Tp, T = x.r.T, D = x.s.D;
  // Selective core_attn reruns the attention (under context parallelism with
  // its work copies and the forward's transients) before o_proj's backward.
  const CpAttn cpa = cp_attn(x);
  const int64_t n1 = k.norm ? a * Tp * D : 0;
  const int64_t core = k.core_attn ? a * Tp * x.s.H * x.s.hd + 4 * x.s.H * T + cpa.work : 0;
  *rebuilt = std::max(*rebuilt, n1 + core);
  const unsigned bufs = kTmpL | kDAttn | kDQ | kDK | kDV;
  if (k.core_attn && x.cp > 1) out.push_back({n1 + core + cpa.fwd, cpa.fwd, bufs, " attention core rerun (context parallel)"});
  out.push_back({n1 + core + w.att_o, w.att_o, bufs, " attention"});
  if (x.cp > 1) out.push_back({n1 + core + cpa.bwd, cpa.bwd, bufs, " attention core (context parallel)"});
  out.push_back({n1 + w.att_qkv, w.att_qkv, bufs, " attention"});
}

// The MoE MLP's backward (moe_mlp.cpp MoeMlp::backward): its locals in
// allocation order; it uses no GradBuf of its own (TmpL is Block::backward's).
// Under tp the router's terms are every real token's [T, ...], the routed
// ones this rank's N rows and, past the etp exchange, the group's Na rows;
// the shared experts' [Tp, Fs/tp] with dy gathered over the sequence.
void moe_mlp_bwd(const Ctx& x, const model::BlockRecompute& k, int64_t* rebuilt, std::vector<Moment>& out) {
  const io::MoeConfig& m = x.c.moe;
  const int64_t a = x.a, T = x.r.T, Tp = x.r.Tp, D = x.s.D, N = x.N, Nr = x.Nr, Na = x.Na, G = x.G;
  const int64_t E = m.num_experts, kk = m.top_k, Fe = x.s.Fe, Fs = x.s.Fs, etp = x.etp, blk = x.blk;
  const bool shared = m.shared_intermediate_size > 0, split = x.sp;  // split: each tp rank its own rows
  const unsigned bufs = kTmpL;
  const int64_t n2 = k.norm ? a * Tp * D : 0;                                 // norm2 rebuilt (Block::norm_again)
  const int64_t again = k.act ? a * Na * Fe + (shared ? a * Tp * Fs : 0) : 0;  // act, sh_act rebuilt
  *rebuilt = std::max(*rebuilt, n2 + again);
  const int64_t pre = n2 + again + 4 * x.own * kk;  // dw f32 [own, k] from the unpermute's backward on
  // dys f32 [N, D]; under ep sent to the experts' ranks (the received and
  // the sorted [Nr, D]); under etp gathered (parallel/etp_dispatch.cpp: its
  // padded block [blk, D] and the group's [etp*blk, D], then the sorted [Na, D]).
  if (x.ep > 1) out.push_back({pre + 4 * D * (N + 2 * Nr), 0, bufs, " MoE ep dispatch backward"});
  if (etp > 1)
    out.push_back({pre + 4 * D * (Nr + blk + etp * blk + Na), 0, bufs, " MoE etp gather backward"});
  // down: dys [Na, D], dact f32 [Na, Fe]; the grouped backward's widening of a group's down weight, then its act rows.
  const int64_t ws_down = ws_bwd(x, G, D, Fe);
  out.push_back({pre + 4 * Na * D + 4 * Na * Fe + ws_down, ws_down, bufs, " MoE experts' down backward"});
  out.push_back({pre + 12 * Na * Fe, 0, bufs, " MoE SwiGLU backward"});  // dact, dg, du
  // gate/up: dg, du [Na, Fe], dxs, tmp_s f32 [Na, D]; a group's gate/up weight widened, then its xs rows.
  const int64_t ws_gu = ws_bwd(x, G, Fe, D);
  const int64_t gu = pre + 8 * Na * Fe + 8 * Na * D;
  out.push_back({gu + ws_gu, ws_gu, bufs, " MoE experts' gate/up backward"});
  int64_t routed = gu;  // what stays to the end: dg, du, tmp_s [Na, ...] and dxs
  if (etp > 1) {
    // dxs reduce-scattered to this rank's [Nr, D]: the zeroed [etp*blk, D], the block [blk, D] and, on a
    // rank with fewer rows than the block (the last sequence-parallel rank), its rows cloned out of it.
    out.push_back({gu + 4 * D * (etp * blk + blk + (Nr != blk ? Nr : 0)), 0, bufs, " MoE etp reduce-scatter backward"});
    routed = gu - 4 * Na * D + 4 * Nr * D;
  }
  if (x.ep > 1) {  // dxs [Nr, D] back to this rank's [N, D]: the unsorted [Nr, D], then the received [N, D]
    out.push_back({routed + 4 * D * (Nr + N), 0, bufs, " MoE ep combine backward"});
    routed += 4 * D * (N - Nr);
  }
  const int64_t shared_base = routed + 4 * Tp * D;  // tmp f32 [Tp, D] after the permute's backward
  out.push_back({shared_base, 0, bufs, " MoE permute backward"});
  if (shared) {
    // Under sequence parallelism dy gathered [Tp, D] f32 (dy_all), alive through the shared experts.
    int64_t g = split ? 4 * Tp * D : 0;
    if (m.shared_expert_gate) {  // ds f32 [Tp, D], dgl f32 [Tp, 1] (its scope); the gate's [1, D] weight, then norm2 widened
      g += 4 * Tp * D;
      const int64_t ws = ws_bwd(x, Tp, 1, D);
      out.push_back({shared_base + g + 4 * Tp + ws, ws, bufs, " MoE shared gate backward"});
    }
    const int64_t ws_d = ws_bwd(x, Tp, D, Fs);  // dsa f32 [Tp, Fs]
    out.push_back({shared_base + g + 4 * Tp * Fs + ws_d, ws_d, bufs, " MoE shared down backward"});
    const int64_t ws_gu2 = ws_bwd(x, Tp, Fs, D);  // dsg, dsu f32 [Tp, Fs]
    out.push_back({shared_base + g + 12 * Tp * Fs + ws_gu2, ws_gu2, bufs, " MoE shared gate/up backward"});
  }
  // The router (act rebuilt is dropped before it): under tp every rank's dw
  // gathered (f32 [Tp, k]) and, with padding rows, its own dx [T, D]; dlogits
  // f32 [T, E]; the router weight widened, then norm2 (no dW when frozen).
  const int64_t ws_r = ws_bwd(x, T, E, D, !x.in.moe.freeze_router);
  const int64_t router = (split ? 4 * Tp * kk + (T != Tp ? 4 * T * D : 0) : 0) + 4 * T * E;
  out.push_back({shared_base - again + router + ws_r, ws_r, bufs, " MoE router backward"});
}

// MLA's backward (mla_attention.cpp MlaAttention::backward): its locals in
// allocation order, no GradBuf of its own. Under tp H is this rank's heads,
// every buffer [Tp, ...], dy gathered for o_proj (sequence parallel), and the
// replicated down projections and norms take f32 partial gradients.
void mla_att_bwd(const Ctx& x, const model::BlockRecompute& k, int64_t* rebuilt, std::vector<Moment>& out) {
  const io::MlaConfig& m = x.c.mla;
  const int64_t a = x.a, T = x.r.T, Tp = x.r.Tp, D = x.s.D, H = x.s.H, nope = m.qk_nope_head_dim;
  const int64_t rope = m.qk_rope_head_dim, vd = m.v_head_dim, kvl = m.kv_lora_rank, ql = m.q_lora_rank, qk = nope + rope;
  const bool bias = x.c.attention_bias;
  const unsigned bufs = kTmpL;
  const int64_t n1 = k.norm ? a * Tp * D : 0;
  const int64_t core = k.core_attn ? a * Tp * H * vd + 4 * H * T : 0;  // attn, lse rebuilt
  *rebuilt = std::max(*rebuilt, n1 + core);
  // dattn f32 [Tp, H*v]; under SP dy gathered f32 [Tp, D]; o's weight, then attn widened.
  const int64_t ws_o = ws_bwd(x, Tp, D, H * vd), dy_full = x.sp ? 4 * Tp * D : 0;
  out.push_back({n1 + core + 4 * Tp * H * vd + dy_full + ws_o, ws_o, bufs, " MLA o_proj backward"});
  // dattn, dq, dk f32 [Tp, H*qk], dv f32 [Tp, H*v] at the attention core's backward.
  out.push_back({n1 + core + 8 * Tp * H * vd + 8 * Tp * H * qk, 0, bufs, " MLA attention core backward"});
  // attn, lse (core_attn) and dattn freed; dkv f32 [Tp, H*(nope+v)], dkpe f32 [Tp, rope].
  const int64_t dkv = 4 * Tp * H * (nope + vd) + 4 * Tp * rope;
  out.push_back({n1 + 8 * Tp * H * qk + 4 * Tp * H * vd + dkv, 0, bufs, " MLA kv_b gradient"});
  // dk, dv freed: dq, dkv, dkpe live; dckv_n f32 [Tp, kv_lora]; kv_b's weight, then ckv_n widened.
  const int64_t live = n1 + 4 * Tp * H * qk + dkv;
  const int64_t ws_kvb = ws_bwd(x, Tp, H * (nope + vd), kvl);
  out.push_back({live + 4 * Tp * kvl + ws_kvb, ws_kvb, bufs, " MLA kv_b_proj backward"});
  // dckv f32 [Tp, kv_lora], dkva f32 [Tp, kv_lora + rope]; under tp the f32
  // partial gradients of kv_a_layernorm [kv_lora], kv_a_proj [kv_lora + rope,
  // D] (and its bias), alive to the end; kv_a's weight, then norm1 widened.
  const int64_t rg_kv = x.tp ? 4 * (kvl + (kvl + rope) * D + (bias ? kvl + rope : 0)) : 0;
  const int64_t live2 = live + 8 * Tp * kvl + 4 * Tp * (kvl + rope) + rg_kv;
  const int64_t ws_kva = ws_bwd(x, Tp, kvl + rope, D);
  out.push_back({live2 + ws_kva, ws_kva, bufs, " MLA kv_a_proj backward"});
  const int64_t live3 = live2 + 4 * Tp * D;  // tmp f32 [Tp, D]
  if (ql > 0) {
    // dcq_n, dcq f32 [Tp, q_lora]; then under tp the partial gradients of q_a_layernorm and q_a_proj [q_lora, D].
    const int64_t rg_q = x.tp ? 4 * (ql + ql * D + (bias ? ql : 0)) : 0;
    const int64_t ws_qb = ws_bwd(x, Tp, H * qk, ql), ws_qa = ws_bwd(x, Tp, ql, D);
    out.push_back({live3 + 8 * Tp * ql + ws_qb, ws_qb, bufs, " MLA q_b_proj backward"});
    out.push_back({live3 + 8 * Tp * ql + rg_q + ws_qa, ws_qa, bufs, " MLA q_a_proj backward"});
  } else {
    const int64_t ws_q = ws_bwd(x, Tp, H * qk, D);
    out.push_back({live3 + ws_q, ws_q, bufs, " MLA q_proj backward"});
  }
}

// The moments of block `layer`'s backward under k (model/block.cpp: the MLP
// sub-block first, then the attention).
std::vector<Moment> block_backward(const Ctx& x, int64_t layer, const model::BlockRecompute& k, int64_t* rebuilt) {
  std::vector<Moment> out;
  // After each sub-block (its locals and rebuilt fields freed) under SP the
  // norm's backward: dnorm reduce-scattered f32 [Tl, D] and the norm
  // weight's partial gradient f32 [D] (Block::backward, TrainExec::norm_bwd).
  const Moment norm{x.sp ? 4 * x.r.Tl * x.s.D + 4 * x.s.D : 0, 0, 0, " norm backward"};
  if (x.c.is_moe_layer(layer)) moe_mlp_bwd(x, k, rebuilt, out);
  else out.push_back(dense_mlp_bwd(x, k, rebuilt));
  out.push_back(norm);
  if (x.c.mla.enabled) mla_att_bwd(x, k, rebuilt, out);
  else dense_att_bwd(x, k, rebuilt, out);
  out.push_back(norm);
  return out;
}

// ---- a rerun block's forward moments (full recompute) -----------------------

// The transients of a row-parallel forward [Tp, in] x [out, in]^T into
// [Tl, out] (TrainExec::row_linear, parallel/tp_layers.cpp): at tp = 1 the
// GEMM's widening (bf16); under tp its f32 partial [Tp, out] (the widening
// writes it: f32 out; the bias on rank 0), then under SP the reduce-scattered
// [Tl, out] f32; f32 without SP is all-reduced in place.
int64_t row_fwd(const Ctx& x, int64_t out, int64_t in, bool bias) {
  const int64_t Tp = x.r.Tp;
  if (!x.tp) return x.packed ? 0 : ws_fwd(x, Tp, out, in, false, bias);
  if (!x.sp && !x.bf) return 0;
  return 4 * Tp * out + std::max(ws_fwd(x, Tp, out, in, true, bias), x.sp ? 4 * x.r.Tl * out : 0);
}

// The forward of block `layer` keeping everything (a rerun of a full chunk):
// the bytes of its own LayerActivations allocated by each moment, plus the
// forward's transients.
std::vector<Moment> block_forward(const Ctx& x, int64_t layer, const LayerStore& st) {
  const int64_t a = x.a, T = x.r.T, Tp = x.r.Tp, Tl = x.r.Tl, D = x.s.D;
  std::vector<Moment> out;
  const int64_t O = a * Tl * D;  // the attention's output [Tl, D], alive until the block returns
  // Under SP Block::forward's local norm1 (then norm2) [Tl, D] stays beside its gathered copy.
  const int64_t local_norm = x.sp ? a * Tl * D : 0;
  if (!x.c.mla.enabled && x.cp == 1) {
    // The dense attention's o_proj with its whole attention part, after O [Tl, D].
    const int64_t pre = a * (Tl * D + Tp * D) + 4 * Tl + local_norm;  // x_in, norm1, rstd1
    const int64_t ws = row_fwd(x, D, x.s.H * x.s.hd, x.c.o_proj_bias);
    out.push_back({pre + st.attn_part + O + ws, ws, 0, " attention o_proj forward"});
  }
  if (x.c.mla.enabled) {
    const io::MlaConfig& m = x.c.mla;
    const int64_t H = x.s.H, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
    const int64_t vd = m.v_head_dim, kvl = m.kv_lora_rank, ql = m.q_lora_rank, qk = nope + rope;
    const int64_t pre = a * (Tl * D + Tp * D) + 4 * Tl + local_norm;  // x_in, norm1, rstd1
    // The decompression: q, (cq, cq_n, rstd_q), kva [Tp, kv_lora+rope], ckv, kpe [Tp, rope], ckv_n, rstd_kv,
    // kv [Tp, H*(nope+v)].
    const int64_t q_part = a * Tp * H * qk + (ql > 0 ? 2 * a * Tp * ql + 4 * Tp : 0);
    const int64_t lat = a * Tp * (kvl + rope) + 2 * a * Tp * kvl + a * Tp * rope + 4 * Tp;
    const int64_t kv = a * Tp * H * (nope + vd);
    const int64_t ws_kvb = ws_fwd(x, Tp, H * (nope + vd), kvl);  // O [Tl, D] is allocated before the decompression
    out.push_back({pre + q_part + lat + O + kv + ws_kvb, ws_kvb, 0, " MLA kv_b_proj forward"});
    // o_proj with the whole attention part, kva, kpe and kv still in scope.
    // Its transients: row_fwd's.
    const int64_t scope = a * Tp * (kvl + rope) + a * Tp * rope + kv;
    const int64_t ws_o = row_fwd(x, D, H * vd, x.c.attention_bias);
    out.push_back({pre + st.attn_part + scope + O + ws_o, ws_o, 0, " MLA o_proj forward"});
  }
  if (x.c.is_moe_layer(layer)) {
    const io::MoeConfig& m = x.c.moe;
    const int64_t N = x.N, Nr = x.Nr, Na = x.Na, G = x.G, E = m.num_experts, Fe = x.s.Fe, Fs = x.s.Fs;
    const int64_t etp = x.etp, blk = x.blk;
    const int64_t pre = st.full - st.mlp_part + O + 2 * local_norm;
    const bool f32_logits = m.router_fp32 || x.in.moe.router_logits_fp32;
    const int64_t logit = f32_logits ? 4 : a;
    const int64_t ws_r = ws_fwd(x, T, E, D, f32_logits);  // every real token routed
    out.push_back({pre + logit * T * E + ws_r, ws_r, 0, " MoE router forward"});
    // Groups of at most kSkinnyMaxRows rows take the skinny kernel (no tensor scratch).
    const bool wide = x.bf && G > cpu::kSkinnyMaxRows;
    const int64_t route = moe_route_bytes(x);
    // Under ep xs [N, D] goes to the experts' ranks (the received and the sorted [Nr, D]); under etp it is
    // gathered: its padded block, the group's blocks, the sorted [Na, D].
    if (x.ep > 1) out.push_back({pre + route + a * D * (N + 2 * Nr), 0, 0, " MoE ep dispatch forward"});
    if (etp > 1) out.push_back({pre + route + a * D * (Nr + blk + etp * blk + Na), 0, 0, " MoE etp gather forward"});
    const int64_t ws_gu = wide ? ws_fwd(x, G, Fe, D) : 0;
    out.push_back({pre + route + a * Na * (D + 2 * Fe) + ws_gu, ws_gu, 0, " MoE experts' up forward"});
    const int64_t ws_d = wide ? ws_fwd(x, G, D, Fe) : 0;
    const int64_t experts = route + a * Na * (2 * D + 3 * Fe);  // xs, gate, up, act, ys [Na, D]
    out.push_back({pre + experts + ws_d, ws_d, 0, " MoE experts' down forward"});
    if (etp > 1)  // ys reduce-scattered: the zeroed [etp*blk, D], this rank's block [blk, D] (and its clone)
      out.push_back({pre + experts + a * D * (etp * blk + blk + (Nr != blk ? Nr : 0)), 0, 0,
                     " MoE etp reduce-scatter forward"});
    // ys [Nr, D]; under ep back to this rank's [N, D]: the unsorted [Nr, D], then the received [N, D].
    if (x.ep > 1) out.push_back({pre + experts - a * Na * D + a * D * (2 * Nr + N), 0, 0, " MoE ep combine forward"});
    const int64_t routed = experts - a * Na * D + a * N * D;  // ys is this rank's [N, D]
    if (m.shared_intermediate_size > 0) {
      const int64_t mlp = a * Tl * D;  // the combined output [Tl, D]
      const int64_t ws_gu2 = ws_fwd(x, Tp, Fs, D);
      out.push_back({pre + routed + mlp + 2 * a * Tp * Fs + ws_gu2, ws_gu2, 0, " MoE shared up forward"});
      const int64_t ws_d2 = ws_fwd(x, Tp, D, Fs);
      out.push_back({pre + routed + mlp + a * Tp * (3 * Fs + D) + ws_d2, ws_d2, 0, " MoE shared down forward"});
      if (m.shared_expert_gate) {
        const int64_t ws_g = ws_fwd(x, Tp, 1, D);
        out.push_back({pre + st.mlp_part + mlp + ws_g, ws_g, 0, " MoE shared gate forward"});
      }
      // Under sequence parallelism the partial sum (Qwen2-MoE: gated, a
      // zeroed [Tp, D]) is reduce-scattered to [Tl, D] before it is added.
      if (x.sp)
        out.push_back({pre + st.mlp_part + mlp + (m.shared_expert_gate ? a * Tp * D : 0) + a * Tl * D, 0, 0,
                       " MoE shared reduce-scatter"});
    }
    // The attention and MLP outputs and the block output (under SP the norms' local copies too).
    out.push_back({st.full + 3 * a * Tl * D + 2 * local_norm, 0, 0, ""});
  } else {
    // The end of a dense MLP: the attention and MLP outputs and the block
    // output [Tl, D] (and under SP the norms' local [Tl, D]), or, earlier, the
    // down projection's GEMM with the first two.
    const int64_t end = 3 * a * Tl * D + 2 * local_norm;
    const int64_t gemm = 2 * a * Tl * D + 2 * local_norm + row_fwd(x, D, x.s.F, x.c.mlp_bias);
    out.push_back({st.full + std::max(end, gemm), std::max(end, gemm), 0, ""});
  }
  return out;
}

// train_activations on tp rank `rank` (its MoE rows: set_moe_rows).
TrainActivations rank_activations(const PlanShapes& s, const PlanInputs& in, int64_t T_in, DType dt, bool value_head,
                                  int64_t rank) {
  TrainActivations r;
  // CP: this rank's share of the tokens, a sequence padded to a multiple of 2 cp (parallel/cp_split.h).
  const int64_t cp = std::max<int64_t>(1, in.layout.cp);
  const int64_t T = cp > 1 ? 2 * ceil_div(T_in, 2 * cp) : T_in;
  Ctx x{s, in, in.model, rows_of(T, in.layout.tp, sp_on(in))};
  x.cp = cp;
  x.u = cp > 1 ? std::max<int64_t>(1, in.layout.cp_ulysses) : 1;
  x.R = cp / x.u;
  x.Hkw = s.Hkv >= x.u ? s.Hkv / x.u : 1;
  x.a = int64_t(dtype_size(dt));
  x.bf = dt != DType::F32;
  x.sp = sp_on(in);
  x.tp = in.layout.tp > 1;
  x.packed = train_packs_planned(s, in, T, dt);
  set_moe_rows(x, true, rank);  // MoE rows (ops/moe.h): own*k dropless; E*capacity padded; at most own*k dropping
  const int64_t a = x.a, Tp = x.r.Tp, Tl = x.r.Tl, D = s.D, V = s.V, L = s.L;
  const bool bf = x.bf, sp = x.sp;
  const std::vector<model::BlockRecompute> plan = (value_head ? in.critic_recompute : in.recompute).plan(L);

  std::vector<LayerStore> whole(static_cast<size_t>(L));  // each block's LayerActivations without recompute
  std::vector<int64_t> store(static_cast<size_t>(L));  // what each block keeps through the forward
  for (int64_t i = 0; i < L; ++i) {
    whole[size_t(i)] = layer_store_full(x, s.layers[size_t(i)]);
    r.per_layer = std::max(r.per_layer, whole[size_t(i)].full);
    store[size_t(i)] = layer_store(x, whole[size_t(i)], plan[size_t(i)], i);
    r.kept_layers += store[size_t(i)];
  }
  r.head = a * Tl * D + a * Tp * D + 4 * Tl;  // x_final [Tl, D], normf [Tp, D], rstdf f32 [Tl]
  if (value_head) {
    r.logits = a * Tp + 4 * T;  // values [Tp, 1], dvalues f32 [T, 1]
    r.loss = 0;
  } else {
    // logits [Tp, V]; f32 logits are overwritten by their gradient, bf16 ones
    // get an f32 dlogits [T, V] (train/token_objective.cpp).
    r.logits = a * Tp * V + (bf ? 4 * T * V : 0);
    r.loss = 5 * 4 * T;  // logprob, entropy, lse, dlogprob, dentropy f32 [T]
  }
  // The backward's f32 buffers from the head on: dx [Tl, D] and DNorm [Tp, D];
  // under SP the backward TrainExec's padded ids and positions (i32 [Tp]).
  // The GradBufs of the blocks come at their first use (Buf).
  const int64_t g_head = 4 * (Tl * D + Tp * D) + (sp ? 8 * Tp : 0);

  // Transients of the head (bf16: lm_head's GEMM operands widened to f32).
  const int64_t ws_head_fwd = bf && !(x.packed && !value_head) ? 4 * (Tp * D + V * D + Tp * V) : 0;  // xf, wf, yf of lm_head
  const int64_t ws_head_bwd = bf ? 4 * std::max(V * D, Tp * D) : 0;   // wf (dx), then xf (dW)
  const int64_t sums = (in.layout.tp > 1 || V * in.layout.tp != in.model.vocab_size) ? 12 * T : 0;

  struct Best {
    int64_t bytes = -1, ws = 0;
    std::string at;
  };
  Best best;
  auto consider = [&](int64_t bytes, int64_t ws, std::string at) {
    if (bytes > best.bytes) best = {bytes, ws, std::move(at)};
  };
  const int64_t base = r.kept_layers + r.head;
  consider(base + a * Tp * V * !value_head + ws_head_fwd, ws_head_fwd, "forward, lm_head");
  consider(base + r.logits + r.loss + sums, sums, "loss");
  // Through the whole backward: the head, the logits (and dlogits) and the
  // result's logprob and entropy f32 [T] (train/token_objective.cpp: lse,
  // dlogprob and dentropy are freed when the loss's backward returns).
  const int64_t fixed = r.head + r.logits + (value_head ? 0 : 2 * 4 * T);
  // The head's backward (forward_backward.cpp): under SP with padding rows
  // the f32 gradient padded to [Tp, V] (or [Tp, 1]) for its scope; the
  // GEMMs' widening, then the reduce-scattered dnorm f32 [Tl, D] and the
  // final norm's partial weight gradient f32 [D].
  const int64_t head_pad = Tp != T ? 4 * Tp * (value_head ? 1 : V) : 0;
  const int64_t head_ws = std::max(ws_head_bwd, sp ? 4 * Tl * D + 4 * D : 0);
  consider(r.kept_layers + fixed + g_head + head_pad + head_ws, head_ws, "backward, lm_head");
  // The blocks' backward, top down (forward_backward.cpp): blocks above i are
  // spent (freed), a full chunk is rerun keeping everything before its last
  // block's backward, selective drops are rebuilt right before their use;
  // GradBufs are allocated at their first use and kept.
  unsigned bufs = 0;
  for (int64_t i = L - 1; i >= 0; --i) {
    const model::BlockRecompute& p = plan[size_t(i)];
    const std::string layer = "backward, layer " + std::to_string(s.layers[size_t(i)]);
    int64_t alive = 0, rebuilt = 0;
    for (int64_t j = 0; j <= i; ++j) {
      const bool rerun = p.full && plan[size_t(j)].full && plan[size_t(j)].chunk_first == p.chunk_first;
      alive += rerun ? whole[size_t(j)].full : store[size_t(j)];
      if (rerun) rebuilt += whole[size_t(j)].full - store[size_t(j)];
    }
    if (p.full && p.chunk_last == i) {
      // The rerun of the chunk (forward_backward.cpp rerun_chunk): block j's
      // forward with the chunk's blocks before it complete.
      int64_t before = alive;
      for (int64_t j = p.chunk_first; j <= i; ++j) before -= whole[size_t(j)].full;
      for (int64_t j = p.chunk_first; j <= i; ++j) {
        for (const Moment& m : block_forward(x, s.layers[size_t(j)], whole[size_t(j)]))
          consider(before + m.bytes + fixed + g_head + buf_bytes(x, bufs), m.ws, layer + " rerun" + m.at);
        before += whole[size_t(j)].full;
      }
    }
    const model::BlockRecompute k = p.full ? model::BlockRecompute{} : p;  // a rerun block keeps everything
    int64_t again = 0;
    for (const Moment& m : block_backward(x, s.layers[size_t(i)], k, &again)) {
      bufs |= m.bufs;
      consider(alive + fixed + g_head + buf_bytes(x, bufs) + m.bytes, m.ws, layer + m.at);
    }
    r.recompute_live = std::max(r.recompute_live, rebuilt + again);
  }
  r.backward = g_head + buf_bytes(x, bufs);
  r.peak = best.bytes;
  r.at = best.at;
  r.workspace = best.ws;
  return r;
}

}  // namespace

TrainActivations train_activations(const PlanShapes& s, const PlanInputs& in, int64_t T_in, DType dt,
                                   bool value_head) {
  TrainActivations r = rank_activations(s, in, T_in, dt, value_head, 0);
  // Under sequence parallelism the MoE layers' rows differ by tp rank (the
  // last one holds fewer real rows, and under etp clones them out of the
  // exchange's block): the rank with the largest peak, each distinct share once.
  if (s.moe_layers > 0 && sp_on(in)) {
    const int64_t cp = std::max<int64_t>(1, in.layout.cp), T = cp > 1 ? 2 * ceil_div(T_in, 2 * cp) : T_in;
    const Rows rr = rows_of(T, in.layout.tp, true);
    int64_t seen = std::min(T, rr.Tl);  // rank 0's share
    for (int64_t j = 1; j < in.layout.tp; ++j) {
      const int64_t own = std::clamp<int64_t>(T - j * rr.Tl, 0, rr.Tl);
      if (own == seen) continue;
      seen = own;
      const TrainActivations o = rank_activations(s, in, T_in, dt, value_head, j);
      if (o.peak > r.peak) r = o;
    }
  }
  return r;
}

int64_t scoring_activations(const PlanShapes& s, const PlanInputs& in, int64_t T_in, DType dt) {
  // forward_inference: one LayerActivations reused by every layer (each
  // buffer replaced as the next layer allocates its own), then the head.
  const int64_t a = int64_t(dtype_size(dt));
  const bool sp = sp_on(in), bf = dt != DType::F32;
  const int64_t T = ceil_div(T_in, std::max<int64_t>(1, in.layout.cp));
  Ctx x{s, in, in.model, rows_of(T, in.layout.tp, sp)};
  x.a = a;
  x.bf = bf;
  x.sp = sp;
  x.tp = in.layout.tp > 1;
  set_moe_rows(x, false);
  x.capacity = in.model.moe.num_experts > 0 && in.moe.capacity_factor > 0;
  const int64_t Tp = x.r.Tp, Tl = x.r.Tl, D = s.D, F = s.F, V = s.V;
  const io::ModelConfig& c = in.model;
  // The record after each layer: that layer's fields, and those of the
  // other MLP kind that persist from an earlier layer (a dense MLP's
  // gate/up/act stay through the MoE layers after it, a MoE MLP's fields
  // through dense layers: neither writes the other's).
  int64_t rec = 0, dense_mlp = 0, moe_mlp = 0, in_layer = 0;
  for (size_t idx = 0; idx < s.layers.size(); ++idx) {
    const int64_t i = s.layers[idx];
    const bool moe = c.is_moe_layer(i);
    const LayerStore st = layer_store_full(x, i);
    if (c.mla.enabled && idx > 0) {
      // MLA's new q (a local until A.q = q), its output O [Tl, D] (allocated
      // before the decompression) and its kva, kpe, kv locals beside the
      // previous layer's record; then the new k (or v) allocated before the
      // old one is replaced; before that the kv_b GEMM's widening.
      // Under tp: this rank's heads, [Tp, ...] rows.
      const io::MlaConfig& m = c.mla;
      const int64_t H = s.H, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
      const int64_t vd = m.v_head_dim, kvl = m.kv_lora_rank;
      const int64_t qn = a * Tp * H * (nope + rope), scope = a * Tp * (kvl + 2 * rope + H * (nope + vd)) + a * Tl * D;
      in_layer = std::max({in_layer, rec + qn + scope + ws_fwd(x, Tp, H * (nope + vd), kvl),
                           rec + qn + scope + std::max(qn, a * Tp * H * vd)});
    }
    rec = st.full + (moe ? dense_mlp : moe_mlp);
    (moe ? moe_mlp : dense_mlp) = st.mlp_part;
    // At the end of a block: its new buffers and four [Tl, D] besides them
    // (the attention and MLP outputs O, Mlp alive until Block::forward
    // returns, x_out, and one more found by measurement: MemoryPlanScoring.*
    // pins it); in bf16 the down projection's f32 operand scratch (a MoE
    // layer's: its shared experts' or its largest group's), before x_out exists.
    int64_t ws_layer = bf ? 4 * (Tp * D + F * D + Tp * F) : 0;
    if (moe) {  // this rank's FFN shares: the shared experts' on its [Tp] rows, a group of its experts' rows
      const int64_t Fe = s.Fe, Fs = s.Fs;
      ws_layer = std::max(c.moe.shared_intermediate_size > 0 ? ws_fwd(x, Tp, D, Fs) : 0,
                          x.G > cpu::kSkinnyMaxRows ? ws_fwd(x, x.G, D, Fe) : 0);
    }
    in_layer = std::max(in_layer, rec + std::max(4 * a * Tl * D, 2 * a * Tl * D + ws_layer));
  }
  const int64_t layer = rec;  // the last layer's record, at the head
  const int64_t ws_head = bf ? 4 * (Tp * D + V * D + Tp * V) : 0;
  const int64_t at_head = layer + a * Tl * D + a * Tp * D + 4 * Tl + a * Tp * V + ws_head;
  const int64_t after = a * Tp * V + 3 * 4 * T + 12 * T;  // logits, logprob/entropy/lse, sums
  return std::max({in_layer, at_head, after});
}

}  // namespace kestrel::rl
