// How a MoE model trains (Megatron's router keys under
// override_transformer_config), and what its routers did in a step. The
// routing itself (experts, top-k, score function, groups, scaling) is the
// model's: config.json (io::MoeConfig).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/moe.h"

namespace kestrel::model {

// How expert parallelism moves the permuted rows to the experts' ranks
// (Megatron's moe_token_dispatcher_type; parallel/ep_dispatch.h and
// ep_allgather.h): the same bits either way. flex (DeepEP) is not built.
enum class MoeDispatcher { AllToAll, AllGather };

struct MoeTrainOptions {
  // Megatron's moe_router_load_balancing_type: "aux_loss" (over each
  // micro-batch's tokens), "seq_aux_loss" (per sequence, DeepSeek-V2/V3's
  // sequence-wise balance loss), "none".
  std::string load_balancing_type = "aux_loss";
  double aux_loss_coeff = 0.0;  // moe_aux_loss_coeff; 0 = no load-balancing loss
  double z_loss_coeff = 0.0;    // moe_z_loss_coeff; 0 = none
  // moe_expert_capacity_factor; <= 0 = dropless (every routed token is
  // computed, Megatron's default). Applied in training and scoring forwards,
  // never in the rollout (vLLM does not drop tokens).
  double capacity_factor = 0.0;
  bool pad_to_capacity = false;  // moe_pad_expert_input_to_capacity
  ops::MoeDropPolicy drop_policy = ops::MoeDropPolicy::Probs;  // moe_token_drop_policy
  // Aux-loss-free balancing (moe_router_enable_expert_bias with
  // moe_router_bias_update_rate): after each optimizer step every MoE layer's
  // e_score_correction_bias moves by rate * sign(mean load - expert load),
  // the loads counted over the step's training forwards on all dp ranks.
  // Needs a model with the correction bias (DeepSeek-V3). 0 = frozen.
  double bias_update_rate = 0.0;
  // verl's model.override_config.moe_config.freeze_moe_router: the router
  // weights get no gradient (they stay as loaded).
  bool freeze_router = false;
  // Megatron's moe_router_dtype fp32: the router's logits in f32 for every
  // architecture (DeepSeek's always are, as HF computes them; Qwen's otherwise
  // take the model dtype, as HF's do). Applies to every forward, the rollout's
  // included, so the rollout routes as training does.
  bool router_logits_fp32 = false;
  // Under expert parallelism (ModelParallel::ep > 1; no effect without):
  // the token dispatcher. The library's default is the all-to-all; the config
  // key's is Megatron's allgather (cli/options_moe.cpp sets it).
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  // MindSpeed's moe_hierarchical_alltoallv: the all-to-all's row exchange in
  // three steps through the nodes' leaders (comm/hierarchical_a2a.h), built
  // once by model::set_expert_dispatch into ModelParallel::ep_hier. Needs the
  // all-to-all dispatcher.
  bool hierarchical_alltoallv = false;
};

// What one MoE layer's router did over a step's training forwards (summed
// over micro-batches; recompute reruns are not counted twice).
struct MoeLayerStats {
  int64_t layer = 0;                        // global layer index
  std::vector<int64_t> tokens_per_expert;   // [E] routed (kept) token slots
  int64_t dropped = 0;                      // slots dropped by the capacity
  int64_t tokens = 0;                       // tokens routed
  double aux_loss = 0;                      // sum over micro-batches of the load-balancing loss (with its coefficient)
  double z_loss = 0;                        // same for the z-loss
  int64_t micro_batches = 0;
};

// The step's statistics of a model (slice): one entry per MoE layer it holds,
// in layer order. The training forward adds to it; the engine reads and
// resets it per optimizer step.
struct MoeStepStats {
  std::vector<MoeLayerStats> layers;
  void reset() {
    for (auto& l : layers) {
      const size_t e = l.tokens_per_expert.size();
      l = MoeLayerStats{l.layer, std::vector<int64_t>(e, 0), 0, 0, 0, 0, 0};
    }
  }
};

}  // namespace kestrel::model
