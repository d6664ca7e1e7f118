// The decoder block, the unit every model path runs: training forward and
// backward, scoring, and the rollout's prefill/decode all call Block::forward
// (and training Block::backward), so the layer body exists once.
//
//   x_mid = x + attention(enter(rmsnorm(x)))        (attention sub-block)
//   x_out = x_mid + mlp(enter(rmsnorm(x_mid)))      (MLP sub-block)
//
// The ops run in the order of HF's modeling_llama.py, so bf16 rounding points
// line up with transformers.
//
// Where training and inference differ, the block asks a BlockExec (the
// execution seam) instead of branching:
//  - which kernel a column-/row-parallel GEMM uses (training: ops::linear_fwd
//    and parallel/tp_layers with sequence parallelism; the rollout: the skinny
//    decode GEMM, its row-parallel outputs all-reduced over tp);
//  - how a column-parallel region is entered (tp_enter_fwd, or the identity);
//  - the attention core (packed varlen attention over the batch, or paged
//    K/V write + paged attention through block tables);
//  - buffer lifetimes (training keeps each in the activation store; the
//    rollout reuses one buffer per slot across layers).
//
// Attention and MLP are sub-blocks behind AttentionBlock / MlpBlock: dense
// GQA attention with optional q/k/v/o biases and Qwen3 q/k norms, and the
// dense SwiGLU MLP (model/dense_blocks.h); multi-head latent attention
// (DeepSeek-V2/V3, model/mla_attention.h); the mixture-of-experts MLP with
// its router and shared experts (Qwen2/3-MoE, DeepSeek, model/moe_mlp.h).
// Which a layer gets is config.json's (io::ModelConfig::is_moe_layer, mla).
//
// Shapes: Tl rows of the residual stream on this rank (T / tp under SP), Tp
// rows inside the tensor-parallel regions (T, padded to a multiple of tp under
// SP). Local sizes: H, Hkv heads, F/tp.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/activations.h"
#include "model/moe_options.h"
#include "model/param.h"
#include "ops/attention.h"
#include "ops/mla.h"
#include "ops/rope.h"
#include "parallel/sharding.h"

namespace kestrel::comm {
class ProcessGroup;  // comm/process_group.h
class HierarchicalA2a;  // comm/hierarchical_a2a.h
}

namespace kestrel::model {

class TrainExec;

// A block's forward buffers, named so that an execution can choose their
// lifetime (BlockExec::buffer).
enum class BlockBuf {
  Norm1, Rstd1, QLin, KLin, Q, K, V, RstdQ, RstdK, Attn, O, XMid, Norm2, Rstd2, Gate, Up, Act, Mlp, XOut,
  // MLA (model/mla_attention.h): q latent and its norm, the kv projection,
  // the kv latent and its norm, the rope key, the absorbed query and output.
  MlaCq, MlaCqN, MlaRstdQ, MlaKvA, MlaCkv, MlaCkvN, MlaRstdKv, MlaKpe, MlaQLat, MlaOLat, MlaOIn,
  kCount
};

// The execution seam between the block body and the way it runs.
class BlockExec {
 public:
  virtual ~BlockExec() = default;
  int64_t Tl = 0;                       // rows of the residual stream on this rank
  int64_t Tp = 0;                       // rows inside the tp regions
  const ops::RopeTable* rope = nullptr;  // the model's RoPE table
  Tensor positions;                     // i32 [Tp] RoPE position of each row
  Tensor cu_seqlens;                    // i32 [B+1] the batch's sequences (training and scoring only)
  // Where the block's tensors live (the model's ModelOptions::device): every
  // buffer, scratch and partial sum a block allocates goes there.
  Device device = Device::CPU;
  // A tensor for one op's scratch on the exec's device, zeroed when asked.
  Tensor scratch(Shape shape, DType dt, bool zeroed = false) const {
    return zeroed ? Tensor::zeros(std::move(shape), dt, MemCategory::Activations, device)
                  : Tensor::empty(std::move(shape), dt, MemCategory::Activations, device);
  }

  // A buffer for `slot` of `shape`: fresh (training, kept by the activation
  // store) or one per slot reused by every layer (rollout).
  virtual Tensor buffer(BlockBuf slot, Shape shape, DType dt) = 0;
  // Into a column-parallel region: [Tl, D] -> [Tp, D].
  virtual Tensor enter(const Tensor& x) = 0;
  // Column-parallel GEMM, no communication: y[Tp, out/tp] = x[Tp, in] w^T (+ b).
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) = 0;
  // Row-parallel GEMM, reduced over tp: x[Tp, in/tp] -> y[Tl, out]; b added once.
  virtual void row_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) = 0;
  // The attention core of local layer `layer`: q [Tp, H*hd], k [Tp, Hkv*hd],
  // v [Tp, Hkv*vd] (post-RoPE; vd = shape.v_head_dim or hd) -> out [Tp, H*vd].
  // Training also fills A.lse for the backward.
  virtual Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                        const ops::AttentionShape& shape, LayerActivations& A) = 0;

  // MLA in the rollout: executions with a latent KV cache attend in latent
  // space (ops/mla.h) instead of decompressing k and v. q [Tp, H*(nope+rope)]
  // post-RoPE, ckv [Tp, kv_lora] normed, kpe [Tp, rope] post-RoPE, kv_b the
  // kv_b_proj weight -> [Tp, H*v], the input of o_proj.
  virtual bool latent_kv() const { return false; }
  virtual Tensor attend_latent(int64_t layer, const Tensor& q, const Tensor& ckv, const Tensor& kpe, const Tensor& kv_b,
                               const ops::MlaShape& shape);

  // ---- mixture of experts ----
  // Routing replay (verl's router_replay R2/R3): i32 [Tp, n_moe_layers, k]
  // experts to use instead of the router's choice, per token and MoE layer
  // (model::moe_layer_ordinal); null = route.
  const Tensor* routing_replay = nullptr;
  // Where to record the routing actually used, same layout; null = don't.
  Tensor* routing_record = nullptr;
  // Token dropping by MoeTrainOptions::capacity_factor (training and scoring, not the rollout).
  bool apply_capacity = false;
  // The step's router statistics (training forwards only; null elsewhere and in recompute reruns).
  MoeStepStats* moe_stats = nullptr;
  // Expert parallelism (BlockDims::ep > 1): the group the routed experts are
  // split over; each MoE layer dispatches its rows to their experts' ranks
  // through it (parallel/ep_dispatch.h). Null = every expert here.
  comm::ProcessGroup* ep = nullptr;
  // Its hierarchical all-to-all-v (ModelParallel::ep_hier; null = none built),
  // used when MoeTrainOptions::hierarchical_alltoallv asks for it.
  const comm::HierarchicalA2a* ep_hier = nullptr;
  // Tensor parallelism as the MoE layer sees it (BlockDims::tp > 1, training
  // only): the tp group the residual stream is split over by sequence
  // parallelism, each rank's Tl rows its share of the routed tokens. Null:
  // every row is this rank's.
  comm::ProcessGroup* seq_tp = nullptr;
  // The tp group when every tp rank holds every row (the rollout: no sequence
  // parallelism): the MoE layer then runs each expert's shard (etp = tp) on
  // all rows and all-reduces its partial output. Null at tp = 1 and in training.
  comm::ProcessGroup* replicated_tp = nullptr;
  // The expert-tensor-parallel group (BlockDims::etp > 1; ModelParallel::etp):
  // the rows of its ranks' experts are gathered to every shard and the
  // partial outputs reduce-scattered back (parallel/etp_dispatch.h). Null = size 1.
  comm::ProcessGroup* etp = nullptr;
  // The real tokens among the Tp rows (sequence parallelism pads Tp up to a
  // multiple of tp); 0 = all of them. The router sees only these.
  int64_t Tr = 0;
  int64_t real_tokens() const { return Tr > 0 ? Tr : Tp; }
};

// Sizes of one block on this tp rank.
struct BlockDims {
  int64_t D = 0;        // hidden size
  int64_t F = 0;        // local intermediate size (F / tp)
  int64_t hd = 0;       // head dim
  parallel::TpHeads heads;  // local query / kv heads
  float eps = 0;        // rms_norm_eps
  DType dtype = DType::F32;
  Device device = Device::CPU;  // where the block's params and buffers live (ModelOptions::device)
  MoeTrainOptions moe;  // MoE layers' training knobs
  int64_t tp = 1;        // tensor-parallel size (F, heads and the shared experts' FFN are this rank's share)
  int64_t etp = 1;       // expert-tensor-parallel size (each routed expert's FFN is this rank's share)
  // Expert parallelism: this rank holds routed experts ep_rank*E/ep ..
  // (ep_rank+1)*E/ep - 1 of every MoE layer (BlockExec::ep at run time).
  int64_t ep = 1, ep_rank = 0;
};

// Makes the Param of a full HF tensor (its shard on this tp rank).
using ParamFactory = std::function<Param(std::string name, Shape full_shape, bool weight_decay)>;

// Attention sub-block: the normed residual in, its contribution to the residual out.
class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // x: [Tp, D] input of the column-parallel projections. Returns [Tl, D].
  virtual Tensor forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const = 0;
  // dy: [Tl, D] f32 gradient of forward's result. Writes dx [Tp, D] f32 (this
  // rank's partial; the caller's tp_enter_bwd sums it) and accumulates grads.
  virtual void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) = 0;
  virtual void append_params(std::vector<Param*>& out) = 0;  // HF order
};

// MLP sub-block, same contract.
class MlpBlock {
 public:
  virtual ~MlpBlock() = default;
  virtual Tensor forward(BlockExec& ex, const Tensor& x, LayerActivations& A) const = 0;
  virtual void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) = 0;
  virtual void append_params(std::vector<Param*>& out) = 0;
  virtual void append_buffers(std::vector<Param*>&) {}  // untrained state tensors (Block::buffers)
};

class Block {
 public:
  // Layer `index` (global: its HF names are model.layers.<index>.*) of cfg.
  Block(const io::ModelConfig& cfg, const BlockDims& dims, int64_t index, const ParamFactory& make);

  // x: [Tl, D] residual stream in; returns the residual stream out [Tl, D].
  // `layer` is the block's position in the executing stack (the KV cache's
  // layer). Fills A with what backward needs.
  Tensor forward(BlockExec& ex, int64_t layer, const Tensor& x, LayerActivations& A) const;
  // dx: [Tl, D] f32, the gradient of forward's result on entry and of its
  // input x on return. Accumulates into every Param::grad.
  void backward(TrainExec& ex, LayerActivations& A, Tensor& dx);

  int64_t index() const { return index_; }
  // Number of tensors params() lists for layer `index` of cfg.
  static int64_t param_count(const io::ModelConfig& cfg, int64_t index);
  std::vector<Param*> params();  // HF order: input norm, attention, post norm, MLP
  // Tensors of the layer's state that are not trained (DeepSeek-V3's
  // e_score_correction_bias): f32, HF names, no gradient; saved and loaded with the weights.
  std::vector<Param*> buffers();
  const AttentionBlock& attention() const { return *attn_; }
  const MlpBlock& mlp() const { return *mlp_; }
  MlpBlock& mlp() { return *mlp_; }

 private:
  Tensor norm_again(TrainExec& ex, BlockBuf slot, const Tensor& x, const Param& w) const;
  int64_t index_;
  BlockDims dims_;
  Param input_norm_, post_norm_;  // [D]
  std::unique_ptr<AttentionBlock> attn_;
  std::unique_ptr<MlpBlock> mlp_;
};

}  // namespace kestrel::model
