// The memory model's shapes and activation terms (see memory_plan.h). Every
// term names the tensor of the code it stands for.
#include "rl/memory_plan.h"

#include <algorithm>

#include "parallel/sharding.h"

namespace kestrel::rl {

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

// One layer's LayerActivations without recompute (model/activations.h),
// bytes, at compute dtype size a.
int64_t layer_full(const PlanShapes& s, const Rows& r, int64_t a) {
  const int64_t q = s.H * s.hd, kv = s.Hkv * s.hd;
  int64_t b = a * (r.Tl * s.D       // x_in [Tl, D]
                   + r.Tp * s.D     // norm1 [Tp, D] (the gathered copy under SP)
                   + r.Tp * q       // q (post-RoPE; q_lin itself without qk_norm)
                   + 2 * r.Tp * kv  // k, v
                   + r.Tp * q       // attn [Tp, H*hd]
                   + r.Tl * s.D     // x_mid [Tl, D]
                   + r.Tp * s.D     // norm2 [Tp, D]
                   + 3 * r.Tp * s.F);  // gate, up, act [Tp, F]
  b += 4 * (2 * r.Tl + s.H * r.T);   // rstd1, rstd2 f32 [Tl]; lse f32 [H, T]
  if (s.qk_norm) b += a * r.Tp * (q + kv) + 4 * r.Tp * (s.H + s.Hkv);  // q_lin, k_lin; rstd_q, rstd_k f32
  return b;
}

// What block p's forward keeps (model/block.cpp, dense_blocks.cpp,
// forward_backward.cpp): everything less its selective drops; a block of a
// full-recompute chunk keeps only the chunk's input x_in [Tl, D] (on its first block).
int64_t layer_store(const PlanShapes& s, const Rows& r, int64_t a, int64_t full_store, const model::BlockRecompute& p,
                    int64_t index) {
  if (p.full) return p.chunk_first == index ? a * r.Tl * s.D : 0;
  int64_t b = full_store;
  if (p.core_attn) b -= a * r.Tp * s.H * s.hd + 4 * s.H * r.T;  // attn [Tp, H*hd], lse f32 [H, T]
  if (p.norm) b -= 2 * a * r.Tp * s.D;                           // norm1, norm2 [Tp, D]
  if (p.mlp) b -= 3 * a * r.Tp * s.F;                            // gate, up, act [Tp, F]
  else if (p.act) b -= a * r.Tp * s.F;                           // act [Tp, F]
  return b;
}

}  // namespace

int64_t total_of(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t x : b) t += x;
  return t;
}

PlanShapes plan_shapes(const PlanInputs& in, int64_t tp, int64_t pp, bool value_head) {
  const io::ModelConfig& c = in.model;
  PlanShapes s;
  const int n = int(std::max<int64_t>(1, tp));
  const parallel::TpHeads h = parallel::tp_heads(c.num_attention_heads, c.num_key_value_heads, 0, n);
  s.D = c.hidden_size;
  s.F = c.intermediate_size / n;
  s.hd = c.head_dim;
  s.H = h.n_heads;
  s.Hkv = h.n_kv_heads;
  s.qk_norm = c.qk_norm;
  s.L = ceil_div(c.num_hidden_layers, std::max<int64_t>(1, pp));
  s.V = parallel::padded_vocab_size(c.vocab_size, in.vocab_divisible_by, n) / n;
  s.rope_rows = in.max_positions > 0 ? in.max_positions : c.max_position_embeddings;
  // Parameters of one block on this tp rank (model/block.cpp, dense_blocks.cpp).
  const int64_t q = s.H * s.hd, kv = s.Hkv * s.hd;
  int64_t layer = 2 * s.D + q * s.D + 2 * kv * s.D + s.D * q + 3 * s.F * s.D;
  if (c.attention_bias) layer += q + 2 * kv;
  if (c.attention_bias && c.arch != io::Arch::Qwen2) layer += s.D;  // o_proj.bias (replicated)
  if (c.mlp_bias) layer += 2 * s.F + s.D;
  if (c.qk_norm) layer += 2 * s.hd;
  const int64_t embed = s.V * s.D;
  const int64_t head = s.D + (value_head ? s.D : (c.tie_word_embeddings ? 0 : s.V * s.D));
  if (pp <= 1) {
    s.params = embed + c.num_hidden_layers * layer + head;
  } else {
    // Stage 0 holds the embedding, the last stage the head (and a tied
    // embedding's copy): the heavier of the two.
    const int64_t last_embed = (!value_head && c.tie_word_embeddings) ? embed : 0;
    s.params = s.L * layer + std::max(embed, head + last_embed);
  }
  return s;
}

TrainActivations train_activations(const PlanShapes& s, const PlanInputs& in, int64_t T_in, DType dt,
                                   bool value_head) {
  TrainActivations r;
  const int64_t a = int64_t(dtype_size(dt));
  const bool sp = sp_on(in), bf = dt != DType::F32;
  const int64_t T = ceil_div(T_in, std::max<int64_t>(1, in.layout.cp));  // CP: this rank's share of the tokens
  const Rows rw = rows_of(T, in.layout.tp, sp);
  const int64_t Tp = rw.Tp, Tl = rw.Tl, D = s.D, F = s.F, q = s.H * s.hd, kv = s.Hkv * s.hd, V = s.V, L = s.L;
  const std::vector<model::BlockRecompute> plan = (value_head ? in.critic_recompute : in.recompute).plan(L);

  r.per_layer = layer_full(s, rw, a);
  std::vector<int64_t> store(static_cast<size_t>(L));  // what each block keeps through the forward
  for (int64_t i = 0; i < L; ++i) {
    store[size_t(i)] = layer_store(s, rw, a, r.per_layer, plan[size_t(i)], i);
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
    if (Tp != T) r.logits += 4 * Tp * V;  // the padded f32 copy of dlogits under SP (forward_backward.cpp)
    r.loss = 5 * 4 * T;  // logprob, entropy, lse, dlogprob, dentropy f32 [T]
  }
  // The backward's f32 buffers (model/train_exec.h GradBuf, one per kind for
  // the whole backward, made at first use): dx [Tl, D] and DNorm [Tp, D] from
  // the head on; TmpD [Tp, D], TmpL [Tl, D] (TmpD itself without SP), DF1, DF2,
  // DAct [Tp, F] from the top block's MLP backward on; DAttn, DQ [Tp, q], DK,
  // DV [Tp, kv] from its attention backward on. Under SP the backward
  // TrainExec's padded ids and positions (i32 [Tp]).
  const int64_t g_head = 4 * (Tl * D + Tp * D) + (sp ? 8 * Tp : 0);
  const int64_t g_mlp = 4 * (Tp * D + (Tl != Tp ? Tl * D : 0) + 3 * Tp * F);
  const int64_t g_att = 4 * (2 * Tp * q + 2 * Tp * kv);
  r.backward = g_head + g_mlp + g_att;

  // Transients of the backward's moments. The CPU backend widens bf16 GEMM
  // operands to f32 scratch (backend/cpu/linear.cpp: a weight's f32 copy for
  // dx, then the input's for dW; a forward GEMM holds x, W and y in f32).
  const int64_t ws_head_fwd = bf ? 4 * (Tp * D + V * D + Tp * V) : 0;   // xf, wf, yf of lm_head
  const int64_t ws_head_bwd = bf ? 4 * std::max(V * D, Tp * D) : 0;    // wf (dx), then xf (dW)
  int64_t ws_mlp = bf ? 4 * std::max({D * F, Tp * F, Tp * D}) : 0;      // down, gate/up backward
  int64_t ws_att = bf ? 4 * std::max({D * q, Tp * q, Tp * D, kv * D}) : 0;  // o, q/k/v backward
  if (s.qk_norm) ws_att = std::max(ws_att, 4 * Tp * (q + kv));          // dq_in, dk_in f32
  if (sp) {  // gathered dy, reduce-scattered dnorm
    ws_mlp = std::max(ws_mlp, 4 * Tp * D + 4 * Tl * D);
    ws_att = std::max(ws_att, 4 * Tp * D + 4 * Tl * D);
  }
  if (s.Hkv * in.layout.tp > in.model.num_key_value_heads && in.layout.tp > 1)
    ws_att = std::max(ws_att, 4 * kv * D);  // a replicated kv head's summed grad
  // A forward GEMM of a rerun or of selective mlp's gate/up: x, W, y in f32
  // (bf16), or the row-parallel f32 partial under tp.
  const int64_t ws_fwd_gemm = bf ? 4 * (Tp * F + D * F + Tp * D) : (in.layout.tp > 1 ? 4 * Tp * D : 0);
  // The end of a block's forward in a rerun: the attention and MLP outputs
  // and the block output [Tl, D] (and under SP the norms' local [Tl, D]),
  // or, earlier, the down projection's GEMM with the first two.
  const int64_t ws_rerun = std::max(3 * a * Tl * D + (sp ? 2 * a * Tl * D : 0), 2 * a * Tl * D + ws_fwd_gemm);
  const int64_t sums = (in.layout.tp > 1 || V * in.layout.tp != in.model.vocab_size) ? 12 * T : 0;

  struct Moment {
    int64_t bytes = -1, ws = 0;
    std::string at;
  };
  Moment best;
  auto consider = [&](int64_t bytes, int64_t ws, std::string at) {
    if (bytes > best.bytes) best = {bytes, ws, std::move(at)};
  };
  const int64_t base = r.kept_layers + r.head;
  consider(base + a * Tp * V * !value_head + ws_head_fwd, ws_head_fwd, "forward, lm_head");
  consider(base + r.logits + r.loss + sums, sums, "loss");
  const int64_t fixed = r.head + r.logits + r.loss;  // through the whole backward
  consider(r.kept_layers + fixed + g_head + ws_head_bwd, ws_head_bwd, "backward, lm_head");
  // The blocks' backward, top down (forward_backward.cpp): blocks above i are
  // spent (freed), a full chunk is rerun keeping everything before its last
  // block's backward, selective drops are rebuilt right before their use.
  for (int64_t i = L - 1; i >= 0; --i) {
    const model::BlockRecompute& p = plan[size_t(i)];
    int64_t alive = 0, rebuilt = 0;
    for (int64_t j = 0; j <= i; ++j) {
      const bool rerun = p.full && plan[size_t(j)].full && plan[size_t(j)].chunk_first == p.chunk_first;
      alive += rerun ? r.per_layer : store[size_t(j)];
      if (rerun) rebuilt += r.per_layer - store[size_t(j)];
    }
    const bool top = i == L - 1;
    const int64_t bufs = g_head + (top ? 0 : g_mlp + g_att);
    const std::string layer = "backward, layer " + std::to_string(i);
    if (p.full && p.chunk_last == i) consider(alive + fixed + bufs + ws_rerun, ws_rerun, layer + " rerun");
    const model::BlockRecompute k = p.full ? model::BlockRecompute{} : p;  // a rerun block keeps everything
    const int64_t n2 = k.norm ? a * Tp * D : 0;                              // norm2 rebuilt
    const int64_t mlp_again = k.mlp ? 3 * a * Tp * F : (k.act ? a * Tp * F : 0);
    // MLP backward: the rebuilt norm2 and gate/up/act, or act; selective mlp's
    // gate/up GEMMs run before act exists.
    int64_t mlp_ws = ws_mlp;
    if (k.mlp) mlp_ws = std::max(mlp_ws, ws_fwd_gemm - a * Tp * F);
    consider(alive + fixed + bufs + (top ? g_mlp : 0) + n2 + mlp_again + mlp_ws, mlp_ws, layer + " MLP");
    const int64_t att_again = (k.norm ? a * Tp * D : 0) + (k.core_attn ? a * Tp * q + 4 * s.H * T : 0);
    consider(alive + fixed + bufs + (top ? g_mlp + g_att : 0) + att_again + ws_att, ws_att, layer + " attention");
    r.recompute_live = std::max(r.recompute_live, rebuilt + std::max(n2 + mlp_again, att_again));
  }
  r.peak = best.bytes;
  r.at = best.at;
  r.workspace = best.ws;
  return r;
}

int64_t scoring_activations(const PlanShapes& s, const PlanInputs& in, int64_t T_in, DType dt) {
  // forward_inference: one LayerActivations reused by every layer (each
  // buffer replaced as the next layer allocates its own), then the head.
  const int64_t a = int64_t(dtype_size(dt));
  const bool sp = sp_on(in), bf = dt != DType::F32;
  const int64_t T = ceil_div(T_in, std::max<int64_t>(1, in.layout.cp));
  const Rows rw = rows_of(T, in.layout.tp, sp);
  const int64_t Tp = rw.Tp, Tl = rw.Tl, D = s.D, F = s.F, V = s.V;
  const int64_t layer = layer_full(s, rw, a);
  // At the end of a block: its new buffers and four [Tl, D] besides them
  // (the attention and MLP outputs O, Mlp alive until Block::forward returns,
  // x_out, and one more found by measurement: MemoryPlanScoring.* pins it);
  // in bf16 the down projection's f32 operand scratch, before x_out exists.
  const int64_t ws_layer = bf ? 4 * (Tp * D + F * D + Tp * F) : 0;
  const int64_t in_layer = layer + std::max(4 * a * Tl * D, 2 * a * Tl * D + ws_layer);
  const int64_t ws_head = bf ? 4 * (Tp * D + V * D + Tp * V) : 0;
  const int64_t at_head = layer + a * Tl * D + a * Tp * D + 4 * Tl + a * Tp * V + ws_head;
  const int64_t after = a * Tp * V + 3 * 4 * T + 12 * T;  // logits, logprob/entropy/lse, sums
  return std::max({in_layer, at_head, after});
}

int64_t packed_batch_bytes(const PlanBatching& b, int64_t tokens, int64_t seqs, int64_t micro_batches) {
  // input_ids, positions, targets i32 [T]; cu_seqlens i32 [B+1] per micro-batch; prefix_of i32 [B] (shared prompts).
  const int64_t packed_seqs = b.share_prompts ? seqs + ceil_div(seqs, std::max<int64_t>(1, b.n)) : seqs;
  return 12 * tokens + 4 * (packed_seqs + std::max<int64_t>(1, micro_batches)) + (b.share_prompts ? 4 * packed_seqs : 0);
}

MicroBatchPlan plan_micro_batches(const PlanBatching& b, int64_t dp, int64_t max_token_len, int64_t micro_batch_size,
                                  bool whole_mini_batch) {
  MicroBatchPlan m;
  const int64_t P = b.prompt_len, R = b.response_len, n = std::max<int64_t>(1, b.n);
  dp = std::max<int64_t>(1, dp);
  m.seqs_per_rank = ceil_div(b.train_batch_size * n, dp);
  m.mini_batch_seqs = whole_mini_batch ? std::min(m.seqs_per_rank, b.ppo_mini_batch_size * n / dp) : m.seqs_per_rank;
  if (m.mini_batch_seqs <= 0) return m;
  m.optimizer_steps = ceil_div(m.seqs_per_rank, m.mini_batch_seqs) * std::max<int64_t>(1, b.ppo_epochs);
  // One pass over `count` sequences (sequence i samples prompt i / n), split
  // as rl/rollout_batch.cpp split_mini_batch does.
  auto split = [&](int64_t count, int64_t& max_rows, int64_t& groups, int64_t& rows_total, int64_t& pairs) {
    int64_t open_rows = 0, open_tokens = 0, open_last = -1;  // open micro-batch: rows, budget tokens, last prompt
    bool open = false;
    auto close = [&]() {
      if (!open) return;
      max_rows = std::max(max_rows, open_rows);
      rows_total += open_rows;
      ++groups;
      open = false;
    };
    const int64_t k_fixed = micro_batch_size > 0 ? micro_batch_size : std::max<int64_t>(1, count);
    int64_t in_open = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t prompt = i / n;
      const bool known = open && b.share_prompts && open_last == prompt;
      bool fresh;
      if (max_token_len > 0) {
        const int64_t cost = known ? R + 1 : P + R;
        fresh = !open || open_tokens + cost > max_token_len;
      } else {
        fresh = !open || in_open >= k_fixed;
      }
      if (fresh) {
        close();
        open = true;
        open_rows = open_tokens = in_open = 0;
        open_last = -1;
      }
      const bool shares = b.share_prompts && open_last == prompt;
      const int64_t rows = !b.share_prompts ? P + R : (shares ? R + 1 : P + R);  // prefix P-1 + (R+1) per sample
      open_rows += rows;
      open_tokens += rows;
      ++in_open;
      // Causal (query, key) pairs: a shared prompt's prefix once, each
      // continuation over the prefix and itself.
      if (!b.share_prompts) pairs += (P + R) * (P + R + 1) / 2;
      else pairs += (shares ? 0 : (P - 1) * P / 2) + (R + 1) * (P - 1) + (R + 1) * (R + 2) / 2;
      open_last = prompt;
    }
    close();
  };
  int64_t max_rows = 0, groups = 0, rows = 0, pairs = 0;
  split(m.mini_batch_seqs, max_rows, groups, rows, pairs);
  m.max_tokens = max_rows;
  m.micro_batches = groups;
  m.mini_batch_tokens = rows;
  // The whole step (every mini-batch of one epoch) on this rank.
  int64_t srows = 0, spairs = 0;
  for (int64_t done = 0; done < m.seqs_per_rank; done += m.mini_batch_seqs) {
    int64_t mr = 0, g = 0, r2 = 0, p2 = 0;
    split(std::min(m.mini_batch_seqs, m.seqs_per_rank - done), mr, g, r2, p2);
    srows += r2, spairs += p2;
  }
  m.step_tokens = srows;
  m.attention_pairs = spairs;
  return m;
}

}  // namespace kestrel::rl
