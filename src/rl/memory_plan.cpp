// The memory model's shapes: parameters per layer and per pipeline rank,
// FLOPs, the KV cache's width, and the micro-batch plan (see memory_plan.h;
// the activation terms are in memory_plan_activations.cpp).
#include "rl/memory_plan.h"

#include <algorithm>

#include "parallel/pipeline_layout.h"
#include "parallel/sharding.h"
#include "rollout/model_runner.h"

namespace kestrel::rl {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

}  // namespace

int64_t total_of(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t x : b) t += x;
  return t;
}

int64_t PlanLayout::edp() const {
  const int64_t experts = expert_tp() * std::max<int64_t>(1, ep);
  return std::max<int64_t>(1, tp * cp * dp / experts);
}

int64_t layer_params(const io::ModelConfig& c, int64_t layer, int64_t tp, int64_t ep, int64_t etp) {
  const int n = int(std::max<int64_t>(1, tp));
  const int64_t en = etp > 0 ? etp : n;  // the group a routed expert is split over
  const int64_t D = c.hidden_size;
  int64_t p = 2 * D;  // input_layernorm, post_attention_layernorm
  if (c.mla.enabled) {
    // model/mla_attention.cpp: q_b_proj (or q_proj) and kv_b_proj column-split
    // (H / tp heads), o_proj row-split; q_a_proj, kv_a_proj_with_mqa, their
    // norms and every bias replicated (o_proj's bias is a row-parallel one).
    const io::MlaConfig& m = c.mla;
    const int64_t H = c.num_attention_heads / n, qk = m.qk_head_dim(), ql = m.q_lora_rank;
    const int64_t lat = m.kv_lora_rank + m.qk_rope_head_dim;
    p += ql > 0 ? D * ql + ql + ql * H * qk : D * H * qk;  // q_a_proj, q_a_layernorm, q_b_proj | q_proj
    p += D * lat + m.kv_lora_rank + m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim);  // kv_a, its norm, kv_b
    p += H * m.v_head_dim * D;  // o_proj
    if (c.attention_bias) p += (ql > 0 ? ql : 0) + lat + D;
  } else {  // model/dense_blocks.cpp: q/k/v column-parallel, o row-parallel (its bias replicated)
    const parallel::TpHeads h = parallel::tp_heads(c.num_attention_heads, c.num_key_value_heads, 0, n);
    const int64_t q = h.n_heads * c.head_dim, kv = h.n_kv_heads * c.head_dim;
    p += 2 * q * D + 2 * kv * D;
    if (c.attention_bias) p += q + 2 * kv;
    if (c.o_proj_bias) p += D;
    if (c.qk_norm) p += 2 * c.head_dim;
  }
  if (c.is_moe_layer(layer)) {
    // model/moe_mlp.cpp: the router [E, D] replicated; E / ep routed experts,
    // each gate/up [Fe/etp, D] and down [D, Fe/etp]; the shared experts
    // column/row-split over tp; Qwen2-MoE's shared gate [1, D] replicated.
    const io::MoeConfig& m = c.moe;
    p += m.num_experts * D + m.num_experts / std::max<int64_t>(1, ep) * 3 * D * (m.moe_intermediate_size / en);
    if (m.shared_intermediate_size > 0) p += 3 * D * (m.shared_intermediate_size / n) + (m.shared_expert_gate ? D : 0);
  } else {
    const int64_t F = c.intermediate_size / n;
    p += 3 * F * D + (c.mlp_bias ? 2 * F + D : 0);
  }
  return p;
}

PlanShapes plan_shapes(const PlanInputs& in, int64_t tp, int64_t pp, bool value_head, int64_t ep, int64_t etp) {
  const io::ModelConfig& c = in.model;
  PlanShapes s;
  const int n = int(std::max<int64_t>(1, tp));
  const parallel::TpHeads h = parallel::tp_heads(c.num_attention_heads, c.num_key_value_heads, 0, n);
  s.tp = n;
  s.etp = etp > 0 ? etp : n;
  s.D = c.hidden_size;
  s.F = c.intermediate_size / n;
  s.Fe = c.moe.moe_intermediate_size / s.etp;
  s.Fs = c.moe.shared_intermediate_size / n;
  s.hd = c.head_dim;
  s.H = h.n_heads;
  s.Hkv = h.n_kv_heads;
  s.qk_norm = c.qk_norm;
  s.V = parallel::padded_vocab_size(c.vocab_size, in.vocab_divisible_by, n) / n;
  s.rope_rows = in.max_positions > 0 ? in.max_positions : c.max_position_embeddings;
  // Each pipeline rank's layers (every chunk of the interleaved schedule):
  // parallel::pipeline_chunks's split, the one kestrel train builds; an
  // unusable split (validate_plan_inputs refuses it) falls back to even ranges.
  std::vector<std::vector<int64_t>> ranks(size_t(std::max<int64_t>(1, pp)));
  parallel::PipelineSpec spec;
  spec.pp = int(std::max<int64_t>(1, pp));
  spec.vpp = int(pp > 1 ? std::max<int64_t>(1, in.layout.vpp) : 1);
  spec.first_stage_layers = pp > 1 ? in.layout.first_stage_layers : -1;
  spec.last_stage_layers = pp > 1 ? in.layout.last_stage_layers : -1;
  if (pp > 1) spec.noop_layers = in.layout.noop_layers;
  auto chunks = parallel::pipeline_chunks(spec, c.num_hidden_layers);
  if (chunks.is_ok()) {
    for (size_t r = 0; r < ranks.size(); ++r)
      for (const parallel::StageChunk& ch : (*chunks)[r])
        for (int64_t i = ch.first_layer; i < ch.first_layer + ch.num_layers; ++i) ranks[r].push_back(i);
  } else {
    const int64_t per = ceil_div(c.num_hidden_layers, int64_t(ranks.size()));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) ranks[size_t(i / per)].push_back(i);
  }
  // Stage 0 holds the embedding, the last stage the final norm and the head
  // (and a tied embedding's copy, Megatron's shared embedding).
  const int64_t embed = s.V * s.D;
  const int64_t head = s.D + (value_head ? s.D : (c.tie_word_embeddings ? 0 : s.V * s.D));
  const bool tied_head = !value_head && c.tie_word_embeddings;
  int64_t best = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const bool first = r == 0, last = r + 1 == ranks.size();
    int64_t params = (first || (last && tied_head) ? embed : 0) + (last ? head : 0);
    for (int64_t i : ranks[r]) params += layer_params(c, i, n, ep, s.etp);
    if (params > best) {
      best = params;
      s.pp_rank = int64_t(r);
    }
  }
  s.params = best;
  s.layers = ranks[size_t(s.pp_rank)];
  s.L = int64_t(s.layers.size());
  for (int64_t i : s.layers)
    if (c.is_moe_layer(i)) {
      ++s.moe_layers;
      if (c.moe.score_correction_bias) s.buffers += 4 * c.moe.num_experts;  // f32 [E] in every precision
    }
  return s;
}

LayerFlops layer_flops(const io::ModelConfig& c, int64_t layer, int64_t tp) {
  const int n = int(std::max<int64_t>(1, tp));
  const double D = double(c.hidden_size);
  LayerFlops f;
  if (c.mla.enabled) {  // under tp each rank's H / tp heads; the replicated down projections on every rank
    const io::MlaConfig& m = c.mla;
    const double H = double(c.num_attention_heads / n), qk = double(m.qk_head_dim()), ql = double(m.q_lora_rank);
    const double kvl = double(m.kv_lora_rank), vd = double(m.v_head_dim);
    f.per_token = 2 * (m.q_lora_rank > 0 ? D * ql + ql * H * qk : D * H * qk)  // q
                  + 2 * D * (kvl + double(m.qk_rope_head_dim))                 // kv_a_proj_with_mqa
                  + 2 * kvl * H * (double(m.qk_nope_head_dim) + vd)            // kv_b_proj (decompressed k, v)
                  + 2 * H * vd * D;                                            // o_proj
    f.per_pair = 2 * H * (qk + vd);  // QK^T over nope+rope, PV over v
  } else {
    const parallel::TpHeads h = parallel::tp_heads(c.num_attention_heads, c.num_key_value_heads, 0, n);
    const double q = double(h.n_heads * c.head_dim), kv = double(h.n_kv_heads * c.head_dim);
    f.per_token = 2 * D * (2 * q + 2 * kv);  // q, k, v, o
    f.per_pair = 4 * q;
  }
  if (c.is_moe_layer(layer)) {
    // Under tp every rank routes every token; the routed experts' work is
    // split over tp (each rank's rows, or every row of the etp group on Fe /
    // etp), the shared experts' too; the router and the shared gate are whole.
    const io::MoeConfig& m = c.moe;
    const double Fe = double(m.moe_intermediate_size) / n, Fs = double(m.shared_intermediate_size / n);
    f.per_token += 2 * D * (double(m.num_experts)                    // router
                            + double(m.top_k) * 3 * Fe               // the k routed experts a token visits
                            + 3 * Fs + (m.shared_expert_gate ? 1 : 0));  // shared experts (and Qwen2-MoE's gate)
  } else {
    f.per_token += 2 * 3 * D * double(c.intermediate_size / n);  // gate, up, down
  }
  return f;
}

int64_t active_parameters(const io::ModelConfig& c) {
  int64_t idle = 0;  // the experts a token does not visit
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_moe_layer(i))
      idle += (c.moe.num_experts - c.moe.top_k) * 3 * c.hidden_size * c.moe.moe_intermediate_size;
  return c.num_parameters() - idle;
}

int64_t kv_values_per_token_layer(const io::ModelConfig& c, int64_t rollout_tp) {
  const parallel::TpHeads h =
      parallel::tp_heads(c.num_attention_heads, c.num_key_value_heads, 0, int(std::max<int64_t>(1, rollout_tp)));
  return rollout::kv_geometry(c, h.n_kv_heads, DType::F32, 1, false).values_per_token_layer();
}

int64_t kv_values_per_token_layer_gqa(const io::ModelConfig& c, int64_t rollout_tp) {
  if (c.mla.enabled) return c.num_attention_heads * (c.mla.qk_head_dim() + c.mla.v_head_dim);
  return kv_values_per_token_layer(c, rollout_tp);
}

int64_t packed_batch_bytes(const PlanBatching& b, int64_t tokens, int64_t seqs, int64_t micro_batches, int64_t prefixes) {
  // input_ids, positions, targets i32 [T]; cu_seqlens i32 [B+1] per micro-batch; prefix_of i32 [B] (shared
  // prompts: B counts a prompt's prefix once per micro-batch holding its samples).
  if (prefixes < 0) prefixes = ceil_div(seqs, std::max<int64_t>(1, b.n));
  const int64_t packed_seqs = b.share_prompts ? seqs + prefixes : seqs;
  return 12 * tokens + 4 * (packed_seqs + std::max<int64_t>(1, micro_batches)) + (b.share_prompts ? 4 * packed_seqs : 0) +
         4 * tokens * b.replay_values;
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
  int64_t prefixes = 0;  // of the last split: a prompt packed once per micro-batch holding its samples
  auto split = [&](int64_t count, int64_t& max_rows, int64_t& groups, int64_t& rows_total, int64_t& pairs) {
    prefixes = 0;
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
      if (b.share_prompts && !shares) ++prefixes;
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
  m.mini_batch_prefixes = prefixes;
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
