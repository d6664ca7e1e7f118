// The model's forward and backward over a slice: the embedding (when the
// slice has it), the blocks (model/block.h, the one layer body), and the head
// (final norm + lm_head or value head, when the slice has it).
//
// One code path for every layout: the tensor-parallel mappings of
// parallel/tp_layers.h are the identity on a size-1 group, so at tp = 1 this
// runs exactly the ops (and rounding) of the plain single-process model.
// Shapes as model/train_exec.h: T tokens, Tp rows inside the tp regions, Tl
// rows of the residual stream on this rank (hidden_rows()).

#include "model/train_exec.h"
#include "model/transformer.h"
#include "ops/ops.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

namespace {

TrainExec exec_for(const CausalLM& m, const PackedBatch& b) {
  KS_CHECK(b.input_ids.device() == m.device(), "a batch on ", device_name(b.input_ids.device()), " for a model on ",
           device_name(m.device()), ": move it with model::to_device(batch, model.device())");
  m.ensure_on_device(/*grads=*/false);  // weights offloaded between phases (param_offload) come back
  TrainExec ex(m.tp(), m.sequence_parallel(), b, m.rope(), m.heads(), m.config().head_dim, m.cp_groups());
  if (m.ep().size() > 1) {
    ex.ep = &m.ep();
    ex.ep_hier = m.options().parallel.ep_hier.get();
  }
  if (m.etp().size() > 1) ex.etp = &m.etp();
  return ex;
}

}  // namespace

int64_t CausalLM::hidden_rows(const PackedBatch& b) const { return exec_for(*this, b).Tl; }

// Runs the slice; when `keep` is false one LayerActivations is reused per
// layer and nothing survives for backward.
Tensor CausalLM::run_forward(const PackedBatch& b, const Tensor& hidden, Activations& acts, bool keep,
                             int64_t chunk) const {
  KS_CHECK(chunk >= 0 && chunk < num_chunks(), "model chunk ", chunk, " of ", num_chunks());
  const int64_t base = chunk_begin_[size_t(chunk)], nb = chunk_num_blocks(chunk);
  const bool embed = chunk_has_embedding(chunk), head = chunk_has_head(chunk);
  const auto& c = cfg_;
  const DType dt = dtype();
  TrainExec ex = exec_for(*this, b);
  if (keep) ex.moe_stats = &moe_stats_;  // the training forward counts its routing (not scoring, not reruns)
  ex.packs = keep ? train_packs_ : forward_packs_;  // packed weights when the caller set them
  const int64_t Tp = ex.Tp, Tl = ex.Tl, D = c.hidden_size;
  KS_CHECK(b.max_seqlen <= rope_.cos.size(0), "sequence of ", b.max_seqlen, " tokens is longer than the RoPE table (",
           rope_.cos.size(0), " positions)");

  Tensor x;  // [Tl, D] residual stream
  if (embed) {
    KS_CHECK(!hidden.defined(), "forward of a slice with the embedding takes token ids, not hidden states");
    x = ex.scratch({Tl, D}, dt);
    parallel::vocab_embedding_fwd(tp(), ex.sp, ex.ids, embed_.weight, vocab_.start, x);
  } else {
    KS_CHECK(hidden.defined() && hidden.dtype() == dt && hidden.dim() == 2 && hidden.size(0) == Tl &&
                 hidden.size(1) == D,
             "forward of a slice starting at layer ", chunk_first_layer(chunk), " takes the residual stream [", Tl,
             ", ", D,
             "] ", dtype_name(dt), " of the previous slice, got ", hidden.defined() ? hidden.describe() : "none");
    x = hidden;
  }
  acts.layers.assign(keep ? size_t(nb) : 1, LayerActivations());
  // The recompute plan: training only (keep); inference reuses one record and
  // keeps nothing anyway. Per model chunk, as MindSpeed counts recompute
  // layers per virtual pipeline stage.
  const std::vector<BlockRecompute> plan = opts_.recompute.plan(keep ? nb : 0);
  for (size_t li = 0; li < size_t(nb); ++li) {
    const Block& blk = *blocks_[size_t(base) + li];
    if (keep && plan[li].full) {
      // Full recompute: the block runs into a record dropped right after;
      // only the chunk's first input survives (the checkpoint).
      LayerActivations scratch;
      if (int64_t(li) == plan[li].chunk_first) acts.layers[li].x_in = x;
      x = blk.forward(ex, int64_t(li), x, scratch);
      continue;
    }
    LayerActivations& A = acts.layers[keep ? li : 0];
    if (keep) A.rc = plan[li];
    x = blk.forward(ex, int64_t(li), x, A);
  }
  if (!head) {
    if (!keep) acts.clear();
    return x;
  }
  acts.x_final = x;
  Tensor normf = ex.scratch({Tl, D}, dt);
  acts.rstdf = ex.scratch({Tl}, DType::F32);
  ops::rmsnorm_fwd(x, final_norm_.weight, float(c.rms_norm_eps), normf, acts.rstdf);
  acts.normf = parallel::tp_enter_fwd(tp(), ex.sp, normf);  // [Tp, D] lm_head input
  if (is_value_model()) {
    // [Tp, 1]: the replicated score head gives every tp rank the full values.
    Tensor values = ex.scratch({Tp, 1}, dt);
    ops::linear_fwd(acts.normf, score_.weight, bias_of(score_bias_), values);
    if (!keep) acts.clear();
    return ex.real_rows(values);
  }
  // [Tp, V/tp]; padded vocabulary rows of lm_head are zero, so their columns are 0.
  Tensor logits = ex.scratch({Tp, local_vocab()}, dt);
  ex.linear(acts.normf, lm_head().weight, nullptr, logits);  // ops::linear_fwd unless packed (forward-only)
  if (!keep) acts.clear();
  return ex.real_rows(logits);
}

Tensor CausalLM::forward(const PackedBatch& batch, Activations& acts) const {
  KS_CHECK(has_embedding() && has_head() && num_chunks() == 1, "forward() runs ids to logits; a slice uses forward_hidden()");
  return run_forward(batch, Tensor(), acts, /*keep=*/true, 0);
}

Tensor CausalLM::forward_inference(const PackedBatch& batch) const {
  KS_CHECK(has_embedding() && has_head() && num_chunks() == 1, "forward_inference() runs ids to logits; a slice uses "
           "forward_hidden_inference()");
  Activations scratch;
  return run_forward(batch, Tensor(), scratch, /*keep=*/false, 0);
}

Tensor CausalLM::forward_hidden(const PackedBatch& batch, const Tensor& hidden, Activations& acts,
                                int64_t chunk) const {
  return run_forward(batch, hidden, acts, /*keep=*/true, chunk);
}

Tensor CausalLM::forward_hidden_inference(const PackedBatch& batch, const Tensor& hidden, int64_t chunk) const {
  Activations scratch;
  return run_forward(batch, hidden, scratch, /*keep=*/false, chunk);
}

void CausalLM::backward(const PackedBatch& b, Activations& acts, const Tensor& dlogits) {
  KS_CHECK(has_embedding() && has_head() && num_chunks() == 1, "backward() runs logits to the embedding; a slice uses backward_hidden()");
  backward_hidden(b, acts, dlogits);
}

void CausalLM::rerun_chunk(TrainExec& ex, Activations& acts, int64_t base, int64_t first, int64_t last) const {
  Tensor x = acts.layers[size_t(first)].x_in;  // [Tl, D] the checkpoint
  for (int64_t j = first; j <= last; ++j) {
    LayerActivations& A = acts.layers[size_t(j)];
    A = LayerActivations();  // keep everything (rc: none) for this chunk's backward
    x = blocks_[size_t(base + j)]->forward(ex, j, x, A);
  }
}

Tensor CausalLM::backward_hidden(const PackedBatch& b, Activations& acts, const Tensor& dout, int64_t chunk) {
  KS_CHECK(chunk >= 0 && chunk < num_chunks(), "model chunk ", chunk, " of ", num_chunks());
  const int64_t base = chunk_begin_[size_t(chunk)], nb = chunk_num_blocks(chunk);
  const bool embed = chunk_has_embedding(chunk), head = chunk_has_head(chunk);
  ensure_on_device(/*grads=*/true);
  TrainExec ex = exec_for(*this, b);
  ex.moe_loss_scale = moe_loss_scale_;
  ex.packs = train_packs_;  // recompute's reruns multiply as the forward did (the same bits)
  comm::ProcessGroup& g = tp();
  const bool sp = ex.sp, tp_on = g.size() > 1;
  const int64_t T = ex.T, Tp = ex.Tp, Tl = ex.Tl, D = cfg_.hidden_size;
  KS_CHECK(int64_t(acts.layers.size()) == nb, "backward without a kept forward");
  const std::vector<Param*> ps = params();
  KS_CHECK(ps.empty() || ps.front()->grad.defined(), "backward before enable_grads()");
  const auto f32 = [&](Shape s) { return ex.scratch(std::move(s), DType::F32); };

  // Activation gradients stay f32 in both precisions; only parameters are bf16.
  Tensor dx = f32({Tl, D});  // gradient of the residual stream
  if (head) {
    KS_CHECK(dout.dtype() == DType::F32 && dout.numel() == T * output_dim(),
             opts_.value_head ? "dvalues must be f32 [T, " : "dlogits must be f32 [T, ", output_dim(),
             opts_.value_head ? "]" : "] (this rank's vocab columns)", ", got ", dout.describe());
    Tensor dlog = dout;  // [Tp, V/tp] ([Tp, 1] for values): padding rows get zero gradient
    if (Tp != T) {
      dlog = f32({Tp, output_dim()});
      ops::pad_rows(dout.view({T, output_dim()}), dlog);
    }
    Tensor dnorm = ex.grad_buf(GradBuf::DNorm, {Tp, D});  // [Tp, D] (partial under tp)
    if (opts_.value_head) {
      // Every tp rank holds the whole head and the same dvalues, so each has
      // the full input gradient and the same head grads; the tp reduction of
      // tp_enter_bwd sums the ranks' dnorm, so only rank 0 contributes.
      ops::linear_bwd(acts.normf, score_.weight, dlog, &dnorm, &score_.grad, grad_of(score_bias_));
      if (tp_on && g.rank() != 0) dnorm.zero_();
    } else {
      Param& head = cfg_.tie_word_embeddings ? embed_ : lm_head_;
      ops::linear_bwd(acts.normf, head.weight, dlog, &dnorm, &head.grad, nullptr);
    }
    ex.norm_bwd(acts.x_final, final_norm_, acts.rstdf, parallel::tp_enter_bwd(g, sp, dnorm), dx);
    ready(cfg_.num_hidden_layers);
  } else {
    KS_CHECK(dout.dtype() == DType::F32 && dout.dim() == 2 && dout.size(0) == Tl && dout.size(1) == D,
             "backward of a slice ending at layer ", chunk_first_layer(chunk) + nb - 1,
             " takes the f32 gradient of its residual stream [", Tl, ", ", D, "], got ", dout.describe());
    dx.copy_from(dout);  // accumulated in place below
  }
  const std::vector<BlockRecompute> plan = opts_.recompute.plan(nb);
  for (size_t li = size_t(nb); li-- > 0;) {
    if (plan[li].full && int64_t(li) == plan[li].chunk_last)
      rerun_chunk(ex, acts, base, plan[li].chunk_first, int64_t(li));
    Block& blk = *blocks_[size_t(base) + li];
    blk.backward(ex, acts.layers[li], dx);
    acts.layers[li] = LayerActivations();  // this block's activations are spent
    ready(blk.index());
  }
  if (!embed) return dx;
  parallel::vocab_embedding_bwd(g, sp, ex.ids, dx, embed_.grad, vocab_.start);
  ready(-1);
  return Tensor();
}

}  // namespace kestrel::model
