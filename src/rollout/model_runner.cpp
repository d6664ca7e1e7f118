#include "rollout/model_runner.h"

#include <xxhash.h>

#include <algorithm>

#include "model/moe_mlp.h"
#include "ops/copy.h"
#include "ops/mla.h"
#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "parallel/tp_layers.h"
#include "rollout/decode_linear.h"

namespace kestrel::rollout {

namespace {

// A step's activation on `dev` (the model's device).
Tensor act(Shape s, DType dt, Device dev) { return Tensor::empty(std::move(s), dt, MemCategory::Activations, dev); }
// The host-built index vector v as an i32 tensor on `dev`, where the ops that
// read it next to the model's tensors run (one synchronous upload per tensor:
// a handful of small copies per step, against a forward over every weight).
Tensor ints(const std::vector<int32_t>& v, Shape s, Device dev) {
  return Tensor::from_host(v, std::move(s), MemCategory::Activations, dev);
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

namespace {

// The rollout's execution of the block (model/block.h's seam): the skinny
// decode GEMM, no sequence parallelism (row-parallel outputs all-reduced over
// tp), paged K/V (or MLA's latent rows) and one buffer per slot reused by
// every layer, so a decode step allocates nothing per layer but what a MoE
// MLP sizes by its routing (its expert-sorted rows). Capacity dropping stays
// off (BlockExec::apply_capacity): an inference engine never drops tokens.
class RolloutExec final : public model::BlockExec {
 public:
  // packs: the CPU weight packs (nullptr for a model on a device: packs are
  // the CPU GEMM's, and ops::linear_fwd runs the device's).
  RolloutExec(comm::ProcessGroup& tp, KVCache& kv, Tensor residual, WeightPacks* packs)
      : tp_(tp), kv_(kv), residual_(std::move(residual)), packs_(packs) {
    Tl = Tp = residual_.size(0);
    device = residual_.device();  // the model's: every buffer and scratch goes there
    if (tp_.size() > 1) replicated_tp = &tp_;
  }
  Tensor slots, cu_q, seq_lens, tables;  // i32 [T], [B+1], [B], [B, max_blocks]
  int64_t allocated = 0;                 // slot buffers allocated so far

  Tensor buffer(model::BlockBuf slot, Shape shape, DType dt) override {
    using model::BlockBuf;
    // The block's output overwrites its input (not read after), the MLP's
    // norm reuses the attention's, silu(gate) * up is written over gate.
    if (slot == BlockBuf::XOut) return residual_;
    if (slot == BlockBuf::Norm2) slot = BlockBuf::Norm1;
    if (slot == BlockBuf::Rstd2) slot = BlockBuf::Rstd1;
    if (slot == BlockBuf::Act) slot = BlockBuf::Gate;
    Tensor& t = bufs_[size_t(slot)];
    if (!t.defined()) {
      t = act(std::move(shape), dt, device);
      ++allocated;
      return t;
    }
    // Every layer gets the same tensor, so a slot must keep one shape: a
    // layer asking for another would read and write past the rows it means.
    KS_CHECK(t.dtype() == dt && t.shape() == shape, "internal: rollout buffer slot ", int(slot), " holds ",
             t.describe(), " but a layer asks for ", dtype_name(dt), shape_str(shape),
             "; give layers of another shape their own slot");
    return t;
  }
  Tensor enter(const Tensor& x) override { return x; }  // replicated activations: nothing to gather
  void linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override {
    decode_linear(x, w, b, y, packs_);
  }
  // y[T, out] = x @ w^T + b for a row-parallel weight w [out, in/tp]: the
  // partial sums are all-reduced over tp, the bias added once.
  void row_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override {
    if (tp_.size() == 1) {
      decode_linear(x, w, b, y, packs_);
      return;
    }
    // The bias enters rank 0's partial sum only, so the reduction adds it once
    // (parallel::row_linear_fwd's rule).
    const Tensor* b0 = tp_.rank() == 0 ? b : nullptr;
    if (y.dtype() == DType::F32) {
      decode_linear(x, w, b0, y, packs_);
      tp_.all_reduce(y, comm::ReduceOp::Sum);
      return;
    }
    // bf16: reduce the f32 partials and round once, as the single-process GEMM
    // and training's row_linear_fwd do.
    Tensor partial = act({x.size(0), w.size(0)}, DType::F32, device);  // [T, out]
    decode_linear(x, w, b0, partial, packs_);
    tp_.all_reduce(partial, comm::ReduceOp::Sum);
    y.copy_from(partial);
  }
  // Every new row lands in the cache before attention reads it: a chunk
  // attends to itself through the same block tables as to its prefix.
  Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionShape& shape,
                model::LayerActivations&) override {
    Tensor out = buffer(model::BlockBuf::Attn, q.shape(), q.dtype());  // [T, H*hd]
    ops::paged_kv_write(k, v, slots, kv_.k(layer), kv_.v(layer));
    ops::paged_attention_fwd(q, kv_.k(layer), kv_.v(layer), tables, cu_q, seq_lens, shape, out);
    return out;
  }

  // MLA: the cache keeps [c_kv | k_pe] per token; the query is absorbed into
  // the latent space (q_nope W_UK per head), attends there over the cached
  // rows (one latent head shared by all query heads) and comes back through
  // W_UV, so K and V are never decompressed.
  bool latent_kv() const override { return kv_.geometry().latent(); }
  Tensor attend_latent(int64_t layer, const Tensor& q, const Tensor& ckv, const Tensor& kpe, const Tensor& kv_b,
                       const ops::MlaShape& s) override {
    const int64_t T = q.size(0), H = s.n_heads;
    Tensor q_lat = buffer(model::BlockBuf::MlaQLat, {T, H * s.latent_dim()}, q.dtype());  // [T, H*(kv_lora+rope)]
    ops::mla_absorb_q(q, kv_b, s, q_lat);
    Tensor& cache = kv_.latent(layer);  // [num_blocks, block_size, kv_lora+rope]
    ops::paged_latent_write(ckv, kpe, slots, cache);
    Tensor o_lat = buffer(model::BlockBuf::MlaOLat, {T, H * s.kv_lora_rank}, q.dtype());  // [T, H*kv_lora]
    ops::paged_latent_attention_fwd(q_lat, cache, tables, cu_q, seq_lens, s, o_lat);
    Tensor o = buffer(model::BlockBuf::MlaOIn, {T, H * s.v_head_dim}, q.dtype());  // [T, H*v]: o_proj's input
    ops::mla_absorb_out(o_lat, kv_b, s, o);
    return o;
  }

 private:
  comm::ProcessGroup& tp_;
  KVCache& kv_;
  Tensor residual_;  // [T, D]
  WeightPacks* packs_;
  Tensor bufs_[size_t(model::BlockBuf::kCount)];
};

std::string describe(const KVGeometry& g) {
  std::string s = std::to_string(g.n_layers) + " layers x ";
  s += g.latent() ? "latent rows of " + std::to_string(g.latent_dim)
                  : std::to_string(g.n_kv_heads) + " kv heads x " + std::to_string(g.head_dim);
  if (g.routing_width > 0) s += ", routing rows of " + std::to_string(g.routing_width);
  return s + ", " + dtype_name(g.dtype);
}

}  // namespace

KVGeometry kv_geometry(const io::ModelConfig& c, int64_t n_kv_heads, DType dtype, int64_t block_size,
                       bool record_routing) {
  KVGeometry g;
  g.n_layers = c.num_hidden_layers;
  g.block_size = block_size;
  g.dtype = dtype;
  if (c.mla.enabled) {
    g.latent_dim = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
  } else {
    g.n_kv_heads = n_kv_heads;
    g.head_dim = c.head_dim;
  }
  if (record_routing) g.routing_width = model::num_moe_layers(c) * c.moe.top_k;
  return g;
}

KVGeometry kv_geometry(const model::CausalLM& m, int64_t block_size, bool record_routing) {
  // This tp rank's kv heads (all of them at tp = 1).
  return kv_geometry(m.config(), m.heads().n_kv_heads, m.dtype(), block_size, record_routing);
}

ModelRunner::ModelRunner(const model::CausalLM& model, KVCache& kv) : m_(model), kv_(kv) {
  KS_CHECK(model.is_whole_model(), "not supported yet: a rollout of a model slice (layers ", model.first_layer(),
           "..", model.first_layer() + model.num_blocks() - 1, ")");
  KS_CHECK(!model.is_value_model(), "the rollout samples tokens: a value model has no lm_head");
  const KVGeometry& g = kv.geometry();
  KVGeometry want = kv_geometry(model, g.block_size, g.routing_width > 0);
  want.num_blocks = g.num_blocks;
  KS_CHECK(g.n_layers == want.n_layers && g.n_kv_heads == want.n_kv_heads && g.head_dim == want.head_dim &&
               g.latent_dim == want.latent_dim && g.dtype == want.dtype && g.routing_width == want.routing_width,
           "KV cache geometry (", describe(g), ") does not match the model on this tp rank (", describe(want), ")");
  KS_CHECK(kv.device() == model.device(), "internal: the KV cache is on ", device_name(kv.device()),
           " but the model it serves is on ", device_name(model.device()),
           "; create the KVCache on the model's device (CausalLM::device())");
}

Tensor ModelRunner::gather_vocab(const Tensor& local) {
  comm::ProcessGroup& tp = m_.tp();
  if (tp.size() == 1) return local;
  const int n = tp.size();
  const int64_t S = local.size(0), Vl = local.size(1), V = m_.config().vocab_size;
  Tensor blocks = act({n, S, Vl}, local.dtype(), local.device());  // [tp, S, V/tp]: rank r's vocab slice r
  tp.all_gather(local, blocks);
  // [S, V]: the vocabulary padding columns (past V, on the last ranks) are
  // dropped, so no caller can sample them.
  Tensor full = act({S, V}, local.dtype(), local.device());
  for (int r = 0; r < n; ++r) {
    const int64_t cols = std::min<int64_t>(Vl, V - int64_t(r) * Vl);
    if (cols <= 0) break;
    ops::copy_cols(blocks.slice_rows(r, r + 1).view({S, Vl}), 0, full, int64_t(r) * Vl, cols);
  }
  return full;
}

StepTensors upload_step(const StepBatch& b, Device dev) {
  const int64_t T = b.num_tokens(), B = b.num_seqs(), S = int64_t(b.sample_rows.size());
  StepTensors in;
  in.ids = ints(b.input_ids, {T}, dev);
  in.positions = ints(b.positions, {T}, dev);
  in.slots = ints(b.slot_mapping, {T}, dev);
  in.cu_q = ints(b.cu_q, {B + 1}, dev);
  in.seq_lens = ints(b.seq_lens, {B}, dev);
  in.tables = ints(b.block_tables, {B, b.max_blocks}, dev);
  if (S > 0) in.sample_rows = ints(b.sample_rows, {S}, dev);
  return in;
}

Tensor ModelRunner::execute(const StepBatch& b) {
  KS_CHECK(b.num_tokens() > 0 && b.num_seqs() > 0, "empty step");
  return forward(upload_step(b, m_.device()));
}

Tensor ModelRunner::forward(const StepTensors& in) {
  const auto& c = m_.config();
  const DType dt = m_.dtype();
  const int64_t T = in.ids.numel(), S = in.sample_rows.defined() ? in.sample_rows.numel() : 0;
  const int64_t D = c.hidden_size;
  KS_CHECK(T > 0 && in.seq_lens.numel() > 0, "empty step");
  KS_CHECK(kv_.allocated(), "the KV cache is released (engine asleep)");
  m_.ensure_on_device(/*grads=*/false);  // the trainer's weights, read in place, back if offloaded (param_offload)

  // Buffers reused by every layer: the decode rows of all sequences share
  // each GEMM, so one step costs one read of every weight.
  const Device dev = m_.device();
  Tensor x = act({T, D}, dt, dev);  // [T, D] residual stream, replicated over tp
  RolloutExec ex(m_.tp(), kv_, x, gemm_packs());
  if (m_.ep().size() > 1) {  // the MoE layers dispatch over the model's ep group (its experts in place)
    ex.ep = &m_.ep();
    ex.ep_hier = m_.options().parallel.ep_hier.get();
  }
  ex.rope = &m_.rope();
  ex.positions = in.positions;
  ex.slots = in.slots;
  ex.cu_q = in.cu_q;
  ex.seq_lens = in.seq_lens;
  ex.tables = in.tables;
  // Vocab-parallel: each id's row lives on one rank, the others add zeros.
  parallel::vocab_embedding_fwd(m_.tp(), false, in.ids, m_.embedding().weight, m_.vocab_start(), x);
  // The routing the MoE layers use, recorded for router replay (R3) into
  // the routing cache by slot, like the K/V of the same tokens.
  Tensor record;  // i32 [T, n_moe_layers, k]
  if (kv_.has_routing()) {
    record = act({T, m_.num_moe_layers(), c.moe.top_k}, DType::I32, dev);
    ex.routing_record = &record;
  }
  model::LayerActivations scratch;  // the block's activation handles; nothing is kept
  for (int64_t li = 0; li < m_.num_blocks(); ++li) m_.block(li).forward(ex, li, x, scratch);
  last_slot_buffers_ = ex.allocated;
  if (record.defined()) {
    Tensor rows = kv_.routing_rows();  // [num_blocks * block_size, n_moe_layers * k]
    ops::scatter_rows(record.view({T, rows.size(1)}), ex.slots, rows);
  }
  if (S == 0) return Tensor();

  // Final norm and lm_head on the sampled rows only (the norm is per row).
  Tensor xs = act({S, D}, dt, dev);  // [S, D]: x's rows in.sample_rows
  ops::gather_rows(x, in.sample_rows, xs);
  Tensor normf = act({S, D}, dt, dev), rstdf = act({S}, DType::F32, dev);  // [S, D], [S]
  ops::rmsnorm_fwd(xs, m_.final_norm().weight, float(c.rms_norm_eps), normf, rstdf);
  Tensor logits = act({S, m_.local_vocab()}, dt, dev);  // [S, V/tp]: this rank's vocab rows
  decode_linear(normf, m_.lm_head().weight, nullptr, logits, gemm_packs());
  return gather_vocab(logits);  // [S, V]
}

}  // namespace kestrel::rollout
