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

// What selective recompute drops from one layer (and rebuilds in its backward).
int64_t layer_dropped(const PlanShapes& s, const Rows& r, int64_t a, const PlanRecompute& rc) {
  int64_t b = 0;
  if (rc.core_attn) b += a * r.Tp * s.H * s.hd + 4 * s.H * r.T;  // attn, lse
  if (rc.activation_function) b += a * r.Tp * s.F;               // act
  if (rc.norm) b += 2 * a * r.Tp * s.D;                           // norm1, norm2
  return b;
}

}  // namespace

int64_t total_of(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t x : b) t += x;
  return t;
}

std::string PlanRecompute::describe() const {
  std::string s;
  if (granularity == RecomputeGranularity::Full)
    s = std::string("full/") + (method == RecomputeMethod::Uniform ? "uniform/" : "block/") + std::to_string(num_layers);
  std::vector<std::string> parts;
  if (core_attn) parts.push_back("core_attn");
  if (activation_function) parts.push_back("activation_function");
  if (norm) parts.push_back("norm");
  for (const auto& p : parts) s += (s.empty() ? "" : "+") + p;
  return s.empty() ? "none" : s;
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
  const int64_t Tp = rw.Tp, Tl = rw.Tl, D = s.D, F = s.F, q = s.H * s.hd, kv = s.Hkv * s.hd;
  const PlanRecompute& rc = in.recompute;

  r.per_layer = layer_full(s, rw, a);
  const int64_t dropped = layer_dropped(s, rw, a, rc);
  const int64_t layer_sel = r.per_layer - dropped;  // with the selective drops
  const int64_t x_in = a * Tl * D;
  const int64_t L = s.L;
  if (rc.granularity == RecomputeGranularity::Full) {
    const int64_t n = std::clamp<int64_t>(rc.num_layers, 1, L);
    if (rc.method == RecomputeMethod::Uniform) {
      r.kept_layers = ceil_div(L, n) * x_in;        // each chunk's input only
      r.recompute_live = n * layer_sel - x_in;      // one chunk rebuilt in the backward
    } else {
      r.kept_layers = n * x_in + (L - n) * layer_sel;  // the first n blocks keep only x_in
      r.recompute_live = layer_sel - x_in;             // one block rebuilt at a time
    }
  } else {
    r.kept_layers = L * layer_sel;
    r.recompute_live = dropped;  // one layer's dropped tensors rebuilt for its backward
  }
  r.head = x_in + a * Tp * D + 4 * Tl;  // x_final [Tl, D], normf [Tp, D], rstdf f32 [Tl]
  const int64_t V = s.V;
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
  // The backward's f32 buffers: dx [Tl, D]; GradBuf DNorm, TmpD [Tp, D], TmpL
  // [Tl, D] (TmpD itself without SP), DF1, DF2, DAct [Tp, F], DAttn, DQ [Tp, q], DK, DV [Tp, kv].
  r.backward = 4 * (Tl * D + 2 * Tp * D + (Tl != Tp ? Tl * D : 0) + 3 * Tp * F + 2 * Tp * q + 2 * Tp * kv);
  if (sp) r.backward += 8 * Tp;  // the backward TrainExec's padded ids and positions (i32 [Tp])

  // Transients at each candidate moment (the CPU backend widens bf16 GEMM
  // operands to f32 scratch, backend/cpu/linear.cpp).
  const int64_t ws_head_fwd = bf ? 4 * (Tp * D + V * D + Tp * V) : 0;         // xf, wf, yf of lm_head
  const int64_t ws_head_bwd = bf ? 4 * std::max(V * D, Tp * D) : 0;          // wf (dx), then xf (dW)
  int64_t ws_layer = 0;
  if (bf) ws_layer = 4 * std::max({Tp * F, D * F, Tp * D, Tp * q, D * q});  // the largest f32 view of a block GEMM
  if (s.qk_norm) ws_layer = std::max(ws_layer, 4 * Tp * (q + kv));          // dq_in, dk_in f32
  if (sp) ws_layer = std::max(ws_layer, 4 * Tp * D + 4 * Tl * D);           // gathered dy, reduce-scattered dnorm
  if (s.Hkv * in.layout.tp > in.model.num_key_value_heads && in.layout.tp > 1)
    ws_layer = std::max(ws_layer, 4 * kv * D);  // a replicated kv head's summed grad
  const int64_t sums = (in.layout.tp > 1 || V * in.layout.tp != in.model.vocab_size) ? 12 * T : 0;

  const int64_t base = r.kept_layers + r.head;
  struct Cand {
    int64_t bytes;
    const char* at;
  };
  const Cand cands[] = {
      {base + a * Tp * V * !value_head + ws_head_fwd, "forward, lm_head"},
      {base + r.logits + r.loss + sums, "loss"},
      {base + r.logits + r.loss + 4 * Tl * D + 4 * Tp * D + ws_head_bwd, "backward, lm_head"},
      {base + r.recompute_live + r.logits + r.loss + r.backward + ws_layer, "backward, top layer"},
  };
  const Cand* best = &cands[0];
  for (const Cand& c : cands)
    if (c.bytes > best->bytes) best = &c;
  r.peak = best->bytes;
  r.at = best->at;
  if (best == &cands[0]) r.workspace = ws_head_fwd;
  if (best == &cands[1]) r.workspace = sums;
  if (best == &cands[2]) r.workspace = ws_head_bwd + 4 * Tl * D + 4 * Tp * D;
  if (best == &cands[3]) r.workspace = ws_layer;
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

int64_t packed_batch_bytes(const PlanBatching& b, int64_t tokens, int64_t seqs) {
  // input_ids, positions, targets i32 [T]; cu_seqlens i32 [B+1]; prefix_of i32 [B] (shared prompts).
  const int64_t packed_seqs = b.share_prompts ? seqs + ceil_div(seqs, std::max<int64_t>(1, b.n)) : seqs;
  return 12 * tokens + 4 * (packed_seqs + 1) + (b.share_prompts ? 4 * packed_seqs : 0);
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
