// The mixture-of-experts MLP (Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3), a
// sub-block of the one decoder block (model/block.h):
//
//   logits = router(x)                          [T, E]  (f32 for DeepSeek's f32 router)
//   idx, w = top-k routing of the logits        [T, k]  (ops::moe_router_fwd; replayed when asked)
//   y      = sum_j w[t, j] * expert_{idx[t, j]}(x[t])     every expert a SwiGLU FFN
//          + shared(x)                          DeepSeek: plain; Qwen2-MoE: times sigmoid(shared_gate(x))
//
// The experts run as one grouped GEMM per projection over the tokens sorted
// by expert (ops::moe_permute_fwd -> grouped_linear_fwd x3 with SwiGLU ->
// moe_unpermute_fwd with the combine weights). Each expert's tensors are
// their own Params under the Hub's names (model.layers.N.mlp.experts.E.
// {gate,up,down}_proj.weight), so loading, saving, the optimizer, data
// parallelism and checkpoints treat them as any weight; the grouped GEMM
// takes all of them in one call.
//
// Training adds Megatron's router losses (MoeTrainOptions): the
// load-balancing loss (per micro-batch, or per sequence), the z-loss, token
// dropping by capacity, and the step's routing statistics for metrics and the
// aux-loss-free bias update.
//
// Under tensor parallelism (with sequence parallelism, as Megatron requires)
// every tp rank routes every real token alike (the router losses, capacity and
// statistics are one process's), then runs the experts on its own
// sequence-parallel rows; the shared experts are column/row parallel like the
// dense MLP. Each routed expert's FFN is split over the etp group
// (expert_tensor_parallel_size, by default the tp group; gate/up by output
// rows, down by input columns), so the rows of the etp group's ranks are
// gathered to every shard and the partial outputs reduce-scattered back
// (parallel/etp_dispatch.h). The rollout (no sequence parallelism: every row
// on every tp rank, BlockExec::replicated_tp) runs each expert's shard on all
// rows and all-reduces the partial output with the shared experts'. Under
// expert parallelism
// (BlockDims::ep > 1) the permuted rows go to their experts' ranks and back
// through MoeTrainOptions::dispatcher's exchange (all-to-all, optionally
// hierarchical, or all-gather); every choice computes the same bits.
#pragma once
#include <vector>

#include "model/block.h"

namespace kestrel::model {

// The MoE layers of cfg in order: ordinal of layer `layer` among them (-1
// for a dense layer), and their count. The routing replay tensors are laid
// out by this ordinal.
int64_t moe_layer_ordinal(const io::ModelConfig& cfg, int64_t layer);
int64_t num_moe_layers(const io::ModelConfig& cfg);
// Whether a parameter name is a routed expert's (model.layers.N.mlp.experts.E.*): the
// tensors expert parallelism splits over ranks.
bool is_routed_expert_param(const std::string& name);
// The routing of a MoE config as the router op takes it.
ops::MoeRouterConfig moe_router_config(const io::ModelConfig& cfg);

class MoeMlp final : public MlpBlock {
 public:
  MoeMlp(const io::ModelConfig& cfg, const BlockDims& dims, int64_t layer, const std::string& prefix,
         const ParamFactory& make);
  Tensor forward(BlockExec& ex, const Tensor& x, LayerActivations& A) const override;
  void backward(TrainExec& ex, LayerActivations& A, const Tensor& dy, Tensor& dx) override;
  void append_params(std::vector<Param*>& out) override;
  void append_buffers(std::vector<Param*>& out) override;
  static int64_t param_count(const io::ModelConfig& cfg);

  // The aux-loss-free balancing step (MoeTrainOptions::bias_update_rate):
  // bias[e] += rate * sign(mean(load) - load[e]). load: [E] token counts
  // summed over the step (and the dp ranks).
  void update_correction_bias(const std::vector<int64_t>& load, double rate);
  bool has_correction_bias() const { return bias_.weight.defined(); }

  Param router;                       // [E, D] mlp.gate.weight
  // Per routed expert: [Fe, D], [Fe, D], [D, Fe]; under expert parallelism
  // only this rank's (first_local() ..) are made, the others have no name.
  std::vector<Param> gate, up, down;
  Param sh_gate, sh_up, sh_down;      // shared experts: [Fs, D], [Fs, D], [D, Fs] (undefined without)
  Param sh_gate_logit;                // Qwen2-MoE shared_expert_gate.weight [1, D]

 private:
  // Routes x: fills A.moe's logits, scores, topk_idx/w, routing (token
  // dropping applied); records/replays per ex; adds to the step statistics.
  void route(BlockExec& ex, const Tensor& x, LayerActivations& A) const;
  // The load-balancing and z losses' value of this forward (with coefficients).
  void router_losses(BlockExec& ex, const LayerActivations& A, double* aux, double* z) const;
  // The weights of this rank's experts (all of them without expert parallelism), in expert order.
  std::vector<const Tensor*> expert_weights(const std::vector<Param>& ps) const;
  bool local_expert(int64_t e) const { return e >= first_local_ && e < first_local_ + n_local_; }
  // Expert parallelism's moves of permuted rows (parallel/ep_dispatch.h): to the experts' ranks and back.
  Tensor ep_dispatch(BlockExec& ex, const LayerActivations& A, const Tensor& rows) const;
  Tensor ep_combine(BlockExec& ex, const LayerActivations& A, const Tensor& rows) const;
  // The hierarchical exchange when moe_hierarchical_alltoallv asks for it and the ep group spans nodes.
  const comm::HierarchicalA2a* ep_hier(const BlockExec& ex) const;
  // This rank's rows [lo, hi) of the first `rows` (its sequence-parallel share under tp, else all).
  std::pair<int64_t, int64_t> own_rows(const BlockExec& ex, int64_t rows) const;
  // All-reduces the MoE output's partial sums over tp (the rollout's replicated rows).
  void reduce_replicated(comm::ProcessGroup& tp, Tensor& out) const;
  // The group sizes of the grouped GEMMs of this forward (after any ep / etp exchange).
  const std::vector<int64_t>& expert_group_sizes(const MoeActivations& M) const;

  int64_t layer_, ordinal_;  // global layer index, ordinal among MoE layers
  int64_t ep_ = 1, first_local_ = 0, n_local_ = 0;  // expert parallelism: group size, this rank's experts
  int64_t tp_ = 1;   // tensor parallelism: the shared experts' FFN split over tp_ ranks, the rows over SP
  int64_t etp_ = 1;  // expert tensor parallelism: each routed expert's FFN split over etp_ ranks
  BlockDims dims_;
  ops::MoeRouterConfig rcfg_;
  int64_t E_, Fe_, Fs_;
  bool router_fp32_;   // logits in f32 (DeepSeek), else the model dtype (Qwen)
  bool sh_gated_;      // Qwen2-MoE's sigmoid gate on the shared expert
  Param bias_;         // f32 [E] mlp.gate.e_score_correction_bias (DeepSeek-V3), a buffer
};

}  // namespace kestrel::model
