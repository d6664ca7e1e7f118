#include "model/block.h"

#include "model/dense_blocks.h"
#include "model/mla_attention.h"
#include "model/moe_mlp.h"
#include "model/train_exec.h"
#include "ops/ops.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

Block::Block(const io::ModelConfig& cfg, const BlockDims& dims, int64_t index, const ParamFactory& make)
    : index_(index), dims_(dims) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  input_norm_ = make(p + "input_layernorm.weight", {cfg.hidden_size}, false);
  post_norm_ = make(p + "post_attention_layernorm.weight", {cfg.hidden_size}, false);
  if (cfg.mla.enabled)
    attn_ = std::make_unique<MlaAttention>(cfg, dims, p, make);
  else
    attn_ = std::make_unique<DenseAttention>(cfg, dims, p, make);
  if (cfg.is_moe_layer(index))
    mlp_ = std::make_unique<MoeMlp>(cfg, dims, index, p, make);
  else
    mlp_ = std::make_unique<DenseMlp>(cfg, dims, p, make);
}

int64_t Block::param_count(const io::ModelConfig& c, int64_t index) {
  const int64_t attn = c.mla.enabled ? MlaAttention::param_count(c) : DenseAttention::param_count(c);
  return 2 + attn + (c.is_moe_layer(index) ? MoeMlp::param_count(c) : DenseMlp::param_count(c));
}

std::vector<Param*> Block::buffers() {
  std::vector<Param*> out;
  mlp_->append_buffers(out);
  return out;
}

Tensor BlockExec::attend_latent(int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const ops::MlaShape&) {
  KS_FAIL("internal: attend_latent on an execution without a latent KV cache");
}

std::vector<Param*> Block::params() {
  std::vector<Param*> out{&input_norm_};
  attn_->append_params(out);
  out.push_back(&post_norm_);
  mlp_->append_params(out);
  return out;
}

Tensor Block::forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const {
  const int64_t Tl = ex.Tl, D = dims_.D;
  const DType dt = dims_.dtype;
  A.x_in = x;
  Tensor norm1 = ex.buffer(BlockBuf::Norm1, {Tl, D}, dt);
  A.rstd1 = ex.buffer(BlockBuf::Rstd1, {Tl}, DType::F32);
  ops::rmsnorm_fwd(x, input_norm_.weight, dims_.eps, norm1, A.rstd1);
  A.norm1 = ex.enter(norm1);  // [Tp, D] input of the column-parallel q/k/v
  Tensor attn = attn_->forward(ex, layer, A.norm1, A);  // [Tl, D]
  if (A.rc.norm) A.norm1 = Tensor();  // norm recompute: rebuilt from x_in before q/k/v's backward
  A.x_mid = ex.buffer(BlockBuf::XMid, {Tl, D}, dt);
  ops::add(x, attn, A.x_mid);

  Tensor norm2 = ex.buffer(BlockBuf::Norm2, {Tl, D}, dt);
  A.rstd2 = ex.buffer(BlockBuf::Rstd2, {Tl}, DType::F32);
  ops::rmsnorm_fwd(A.x_mid, post_norm_.weight, dims_.eps, norm2, A.rstd2);
  A.norm2 = ex.enter(norm2);  // [Tp, D]
  Tensor mlp = mlp_->forward(ex, A.norm2, A);  // [Tl, D]
  if (A.rc.norm) A.norm2 = Tensor();  // rebuilt from x_mid before gate/up's backward
  Tensor out = ex.buffer(BlockBuf::XOut, {Tl, D}, dt);  // may be x itself in inference: x is not read after this
  ops::add(A.x_mid, mlp, out);
  return out;
}

// Norm recompute: the [Tp, D] entered norm output of x [Tl, D], as the
// forward made it (same kernel, same input; under SP the same all-gather,
// which every tp rank runs at the same point of its backward).
Tensor Block::norm_again(TrainExec& ex, BlockBuf slot, const Tensor& x, const Param& w) const {
  Tensor n = ex.buffer(slot, {ex.Tl, dims_.D}, dims_.dtype);
  Tensor rstd = ex.scratch({ex.Tl}, DType::F32);  // equals the kept one; dropped
  ops::rmsnorm_fwd(x, w.weight, dims_.eps, n, rstd);
  return ex.enter(n);
}

void Block::backward(TrainExec& ex, LayerActivations& A, Tensor& dx) {
  const int64_t D = dims_.D;
  Tensor dnorm = ex.grad_buf(GradBuf::DNorm, {ex.Tp, D});  // [Tp, D] partial under tp
  Tensor tmp_l = ex.grad_buf(GradBuf::TmpL, {ex.Tl, D});
  if (A.rc.norm) A.norm2 = norm_again(ex, BlockBuf::Norm2, A.x_mid, post_norm_);
  mlp_->backward(ex, A, dx, dnorm);
  if (A.rc.norm) A.norm2 = Tensor();
  ex.norm_bwd(A.x_mid, post_norm_, A.rstd2, parallel::tp_enter_bwd(ex.tp, ex.sp, dnorm), tmp_l);
  ops::add_inplace(dx, tmp_l);  // dx is now d x_mid
  if (A.rc.norm) A.norm1 = norm_again(ex, BlockBuf::Norm1, A.x_in, input_norm_);
  attn_->backward(ex, A, dx, dnorm);
  if (A.rc.norm) A.norm1 = Tensor();
  ex.norm_bwd(A.x_in, input_norm_, A.rstd1, parallel::tp_enter_bwd(ex.tp, ex.sp, dnorm), tmp_l);
  ops::add_inplace(dx, tmp_l);  // dx is now d x_in
}

}  // namespace kestrel::model
