#include "rollout/model_runner.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "parallel/tp_layers.h"
#include "rollout/decode_linear.h"

namespace kestrel::rollout {

namespace {

const Tensor* bias_of(const model::Param& p) { return p.weight.defined() ? &p.weight : nullptr; }
Tensor act(Shape s, DType dt) { return Tensor::empty(std::move(s), dt, MemCategory::Activations); }
Tensor ints(const std::vector<int32_t>& v, Shape s) {
  Tensor t = Tensor::empty(std::move(s), DType::I32, MemCategory::Activations);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

}  // namespace

StepBatch build_step_batch(const SchedulerOutput& so, int64_t block_size) {
  StepBatch b;
  b.cu_q.push_back(0);
  for (const auto& ss : so.seqs) b.max_blocks = std::max<int64_t>(b.max_blocks, int64_t(ss.seq->blocks.size()));
  b.max_blocks = std::max<int64_t>(b.max_blocks, 1);
  b.input_ids.reserve(size_t(so.num_tokens));
  b.positions.reserve(size_t(so.num_tokens));
  b.slot_mapping.reserve(size_t(so.num_tokens));
  b.block_tables.assign(so.seqs.size() * size_t(b.max_blocks), BlockPool::kNullBlock);
  for (size_t i = 0; i < so.seqs.size(); ++i) {
    const ScheduledSeq& ss = so.seqs[i];
    const Sequence& s = *ss.seq;
    for (int64_t p = ss.start; p < ss.start + ss.num_tokens; ++p) {
      b.input_ids.push_back(s.tokens[size_t(p)]);
      b.positions.push_back(int32_t(p));
      b.slot_mapping.push_back(int32_t(s.blocks[size_t(p / block_size)] * block_size + p % block_size));
    }
    b.cu_q.push_back(int32_t(b.input_ids.size()));
    b.seq_lens.push_back(int32_t(ss.start + ss.num_tokens));
    std::copy(s.blocks.begin(), s.blocks.end(), b.block_tables.begin() + int64_t(i) * b.max_blocks);
    if (ss.samples) b.sample_rows.push_back(b.cu_q.back() - 1);
  }
  return b;
}

uint64_t step_fingerprint(const StepBatch& b) {
  uint64_t h = XXH3_64bits_withSeed(nullptr, 0, uint64_t(b.max_blocks));
  for (const std::vector<int32_t>* v : {&b.input_ids, &b.positions, &b.slot_mapping, &b.cu_q, &b.seq_lens,
                                        &b.block_tables, &b.sample_rows})
    h = XXH3_64bits_withSeed(v->data(), v->size() * sizeof(int32_t), h ^ v->size());
  return h;
}

ModelRunner::ModelRunner(const model::CausalLM& model, KVCache& kv) : m_(model), kv_(kv) {
  const auto& g = kv.geometry();
  KS_CHECK(g.n_kv_heads == model.heads().n_kv_heads && g.head_dim == model.config().head_dim &&
               g.n_layers == model.config().num_hidden_layers,
           "KV cache geometry (", g.n_layers, " layers x ", g.n_kv_heads, " kv heads x ", g.head_dim,
           ") does not match the model on this tp rank (", model.config().num_hidden_layers, " x ",
           model.heads().n_kv_heads, " x ", model.config().head_dim, ")");
}

void ModelRunner::row_parallel(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  comm::ProcessGroup& tp = m_.tp();
  if (tp.size() == 1) {
    decode_linear(x, w, b, y);
    return;
  }
  // The bias enters rank 0's partial sum only, so the reduction adds it once
  // (parallel::row_linear_fwd's rule).
  const Tensor* b0 = tp.rank() == 0 ? b : nullptr;
  if (y.dtype() == DType::F32) {
    decode_linear(x, w, b0, y);
    tp.all_reduce(y, comm::ReduceOp::Sum);
    return;
  }
  // bf16: reduce the f32 partials and round once, as the single-process GEMM
  // and training's row_linear_fwd do.
  Tensor partial = act({x.size(0), w.size(0)}, DType::F32);  // [T, out]
  decode_linear(x, w, b0, partial);
  tp.all_reduce(partial, comm::ReduceOp::Sum);
  y.copy_from(partial);
}

Tensor ModelRunner::gather_vocab(const Tensor& local) {
  comm::ProcessGroup& tp = m_.tp();
  if (tp.size() == 1) return local;
  const int n = tp.size();
  const int64_t S = local.size(0), Vl = local.size(1);
  Tensor blocks = act({n, S, Vl}, local.dtype());  // [tp, S, V/tp]: rank r's vocab slice r
  tp.all_gather(local.raw(), blocks.raw(), local.numel(), local.dtype());
  Tensor full = act({S, n * Vl}, local.dtype());  // [S, V]
  const size_t es = dtype_size(local.dtype()), row = size_t(Vl) * es;
  const char* src = static_cast<const char*>(blocks.raw());
  char* dst = static_cast<char*>(full.raw());
  for (int r = 0; r < n; ++r)
    for (int64_t s = 0; s < S; ++s)
      std::memcpy(dst + (size_t(s) * size_t(n) + size_t(r)) * row, src + (size_t(r) * size_t(S) + size_t(s)) * row,
                  row);
  return full;
}

Tensor ModelRunner::execute(const StepBatch& b) {
  const auto& c = m_.config();
  const DType dt = m_.dtype();
  comm::ProcessGroup& tp = m_.tp();
  const int64_t T = b.num_tokens(), B = b.num_seqs(), S = int64_t(b.sample_rows.size());
  // Local sizes on this tp rank (the full model at tp = 1).
  const int64_t D = c.hidden_size, F = m_.local_ffn();
  const int64_t H = m_.heads().n_heads, Hkv = m_.heads().n_kv_heads, hd = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  KS_CHECK(T > 0 && B > 0, "empty step");
  KS_CHECK(kv_.allocated(), "the KV cache is released (engine asleep)");
  const ops::AttentionShape shape{H, Hkv, hd, 0.f};

  const Tensor ids = ints(b.input_ids, {T});
  const Tensor pos = ints(b.positions, {T});
  const Tensor slots = ints(b.slot_mapping, {T});
  const Tensor cu_q = ints(b.cu_q, {B + 1});
  const Tensor seq_lens = ints(b.seq_lens, {B});
  const Tensor tables = ints(b.block_tables, {B, b.max_blocks});

  // Buffers reused by every layer: the decode rows of all sequences share
  // each GEMM, so one step costs one read of every weight.
  Tensor x = act({T, D}, dt);  // [T, D] residual stream, replicated over tp
  // Vocab-parallel: each id's row lives on one rank, the others add zeros.
  parallel::vocab_embedding_fwd(tp, false, ids, m_.embedding().weight, m_.vocab_start(), x);
  Tensor norm = act({T, D}, dt), rstd = act({T}, DType::F32);
  Tensor q = act({T, H * hd}, dt), k = act({T, Hkv * hd}, dt), v = act({T, Hkv * hd}, dt);  // local heads
  Tensor q_lin, k_lin, rstd_q, rstd_k;
  if (c.qk_norm) {
    q_lin = act({T, H * hd}, dt);
    k_lin = act({T, Hkv * hd}, dt);
    rstd_q = act({T * H}, DType::F32);
    rstd_k = act({T * Hkv}, DType::F32);
  }
  Tensor attn = act({T, H * hd}, dt), o = act({T, D}, dt), x_mid = act({T, D}, dt);
  Tensor gate = act({T, F}, dt), up = act({T, F}, dt), mlp = act({T, D}, dt);  // [T, F/tp]

  for (size_t li = 0; li < m_.layers().size(); ++li) {
    const model::LayerParams& L = m_.layers()[li];
    ops::rmsnorm_fwd(x, L.input_norm.weight, eps, norm, rstd);
    // Column-parallel q/k/v: this rank's heads only, no communication.
    if (c.qk_norm) {
      decode_linear(norm, L.q.weight, bias_of(L.q_bias), q_lin);
      decode_linear(norm, L.k.weight, bias_of(L.k_bias), k_lin);
      Tensor qv = q.view({T * H, hd}), kv = k.view({T * Hkv, hd});
      ops::rmsnorm_fwd(q_lin.view({T * H, hd}), L.q_norm.weight, eps, qv, rstd_q);
      ops::rmsnorm_fwd(k_lin.view({T * Hkv, hd}), L.k_norm.weight, eps, kv, rstd_k);
    } else {
      decode_linear(norm, L.q.weight, bias_of(L.q_bias), q);
      decode_linear(norm, L.k.weight, bias_of(L.k_bias), k);
    }
    decode_linear(norm, L.v.weight, bias_of(L.v_bias), v);
    ops::rope_fwd(q, pos, m_.rope(), H);
    ops::rope_fwd(k, pos, m_.rope(), Hkv);
    // Every new row lands in the cache before attention reads it: a chunk
    // attends to itself through the same block tables as to its prefix.
    ops::paged_kv_write(k, v, slots, kv_.k(int64_t(li)), kv_.v(int64_t(li)));
    ops::paged_attention_fwd(q, kv_.k(int64_t(li)), kv_.v(int64_t(li)), tables, cu_q, seq_lens, shape, attn);
    row_parallel(attn, L.o.weight, bias_of(L.o_bias), o);
    ops::add(x, o, x_mid);
    ops::rmsnorm_fwd(x_mid, L.post_norm.weight, eps, norm, rstd);
    decode_linear(norm, L.gate.weight, bias_of(L.gate_bias), gate);
    decode_linear(norm, L.up.weight, bias_of(L.up_bias), up);
    ops::swiglu_fwd(gate, up, gate);  // in place: gate becomes silu(gate) * up
    row_parallel(gate, L.down.weight, bias_of(L.down_bias), mlp);
    ops::add(x_mid, mlp, x);  // x is not read after this: the next layer's residual
  }
  if (S == 0) return Tensor();

  // Final norm and lm_head on the sampled rows only (the norm is per row).
  Tensor xs = act({S, D}, dt);
  const size_t row = size_t(D) * dtype_size(dt);
  for (int64_t i = 0; i < S; ++i)
    std::memcpy(static_cast<char*>(xs.raw()) + size_t(i) * row,
                static_cast<const char*>(x.raw()) + size_t(b.sample_rows[size_t(i)]) * row, row);
  Tensor normf = act({S, D}, dt), rstdf = act({S}, DType::F32);
  ops::rmsnorm_fwd(xs, m_.final_norm().weight, eps, normf, rstdf);
  Tensor logits = act({S, m_.local_vocab()}, dt);  // [S, V/tp]: this rank's vocab rows
  decode_linear(normf, m_.lm_head().weight, nullptr, logits);
  return gather_vocab(logits);  // [S, V]
}

}  // namespace kestrel::rollout
