// Mixture-of-experts keys of one model's override_transformer_config
// (Megatron's TransformerConfig names, which verl scripts pass with +): the
// router training options (model::MoeTrainOptions), expert parallelism's
// token dispatcher, the performance switches that change nothing, and the
// routing keys Megatron takes from its own arguments while Kestrel
// takes them from config.json. Declared for the actor, the reference, the
// critic (schema_actor.cpp) and the SFT model (schema_sft.cpp);
// cli/options_moe.cpp reads them.
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String;

constexpr const char* kAtEp1 =
    " Acts under expert parallelism (expert_model_parallel_size > 1) only: at 1 every expert is on its rank, no "
    "token moves, and the value changes nothing.";
constexpr const char* kFromJson =
    " Kestrel takes the routing from config.json: a value equal to config.json's is accepted, another is refused "
    "naming both; null = config.json's.";
}  // namespace

void declare_moe_overrides(Builder& b, const std::string& scope, bool trained, const std::string& follow) {
  b.scope(scope);
  auto d = [&](const std::string& key, const std::string& def) {
    return follow.empty() ? def : "${oc.select:" + follow + "." + key + "," + def + "}";
  };
  auto add = [&](const std::string& key, Type t, const std::string& def, Support s, const std::string& doc,
                 std::vector<std::string> allowed = {}, std::vector<std::string> supported = {}) -> KeyDecl& {
    KeyDecl& k = b.k(key, t, d(key, def), s, doc, std::move(allowed), std::move(supported));
    k.addable = true;
    return k;
  };
  // The router losses and the bias update act through a backward and an optimizer step.
  const Support TR = trained ? YES : NOP;
  const std::string fwd_only =
      trained ? "" : " The reference model is not trained: no effect here (the default follows the actor's).";
  const std::string metric = trained ? " Logged per step as <actor|critic|train>/" : "";
  add("moe_router_load_balancing_type", S, "aux_loss", TR,
      "Megatron's load-balancing loss of the MoE routers (with moe_aux_loss_coeff > 0): aux_loss over each "
      "micro-batch's tokens, seq_aux_loss per sequence (DeepSeek-V2/V3's sequence-wise balance loss), none." +
          fwd_only,
      {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"}, {"aux_loss", "seq_aux_loss", "none"});
  add("moe_aux_loss_coeff", F, "0.0", TR,
      "Coefficient of the load-balancing loss, added per MoE layer, entering the update as its mean over the "
      "mini-batch's micro-batches; 0 = none." + (trained ? metric + "moe_aux_loss." : fwd_only))
      .at_least(0);
  add("moe_z_loss_coeff", F, "null", TR,
      "Coefficient of the router z-loss (mean of logsumexp(logits)^2 per MoE layer); null or 0 = none." +
          (trained ? metric + "moe_z_loss." : fwd_only))
      .at_least(0);
  add("moe_expert_capacity_factor", F, "null", YES,
      "Expert capacity: each expert computes at most ceil(tokens x topk / experts x factor) token slots of a "
      "forward, the rest are dropped (moe_token_drop_policy); in the training and scoring forwards, never in the "
      "rollout (vLLM does not drop). null = dropless (Megatron's default)." +
          (trained ? metric + "moe_dropped_tokens (the dropped fraction)." : ""))
      .above(0);
  add("moe_pad_expert_input_to_capacity", B, "false", YES,
      "Pad every expert's tokens to its capacity (needs moe_expert_capacity_factor): the same values, the shapes "
      "of a fixed capacity.");
  add("moe_token_drop_policy", S, "probs", YES,
      "Which token slots an expert over its capacity drops: probs (the lowest routing weights) or position (the "
      "latest tokens).",
      {"probs", "position"});
  add("moe_router_enable_expert_bias", B, "false", TR,
      "Aux-loss-free load balancing (DeepSeek-V3): after each applied optimizer step every MoE layer's "
      "mlp.gate.e_score_correction_bias (f32, saved with the weights) moves by moe_router_bias_update_rate x "
      "sign(mean load - expert load), the loads of the step's training forwards over all dp ranks. Needs a model "
      "whose config.json has the correction bias (DeepSeek-V3); any other is refused." +
          fwd_only);
  add("moe_router_bias_update_rate", F, "1e-3", TR,
      "Step of the expert-bias update when moe_router_enable_expert_bias is true (Megatron's default 1e-3)." +
          fwd_only)
      .at_least(0);
  add("moe_router_dtype", S, "null", YES,
      "fp32: the router's logits in f32 for every architecture (DeepSeek's always are, as HF computes them), in "
      "training, scoring and the rollout alike; null = the model's (Qwen's routers run in the model dtype, as "
      "HF's). fp64 is not built.",
      {"fp32", "fp64"}, {"fp32"});

  // Kernel and dispatch choices: Kestrel's experts always run as one grouped GEMM per projection over the
  // tokens sorted by expert, permuted and unpermuted by its own fused ops.
  auto always = [&](const std::string& key, const std::string& doc) {
    KeyDecl& k = add(key, B, "false", NOP, doc);
    k.as_default = {"true"};
  };
  always("moe_grouped_gemm",
         "Grouped GEMM over the local experts: Kestrel always computes its experts as one grouped GEMM per "
         "projection, so true is what it does and false changes nothing.");
  always("moe_permute_fusion",
         "Fused MoE token permutation: Kestrel always permutes and unpermutes tokens with its own fused ops.");
  always("fused_permute_and_unpermute",
         "MindSpeed: fused MoE token permute/unpermute; Kestrel's permutation is always fused.");
  add("moe_token_dispatcher_type", S, "allgather", YES,
      std::string("How the routed rows reach their experts' ranks: alltoall (each rank sends every other rank the "
                  "rows of its experts, counts first; parallel/ep_dispatch.h) or allgather (Megatron's default: "
                  "every rank gathers all ranks' rows and keeps its experts', the combine reduce-scatters; "
                  "parallel/ep_allgather.h). Both give the same bits; allgather moves (ep-1) x the largest rank's "
                  "rows each way. flex (DeepEP) is not built.") +
          kAtEp1,
      {"allgather", "alltoall", "flex"}, {"allgather", "alltoall"});
  add("moe_hierarchical_alltoallv", B, "false", YES,
      std::string("MindSpeed: the alltoall dispatcher's row exchange in three steps (gather to each node's leader, "
                  "one message per node pair between leaders, scatter within the node; comm/hierarchical_a2a.h), "
                  "the same rows delivered. Needs moe_token_dispatcher_type=alltoall (refused with allgather); on "
                  "one node the flat exchange is used, the same.") +
          kAtEp1);
  add("moe_permutation_async_comm", B, "false", NOP,
      "MindSpeed: overlap the alltoall dispatch's communication with the permutation. Kestrel's dispatch is "
      "synchronous (permute, then exchange); true would compute the same values, so it changes nothing.");
  add("moe_enable_deepep", B, "false", NOP,
      "DeepEP's all-to-all kernels, which serve the flex dispatcher (moe_token_dispatcher_type=flex, not built and "
      "refused); with alltoall or allgather Kestrel's own exchange moves the same rows, so it changes nothing.");
  add("moe_shared_expert_overlap", B, "false", NOP,
      "Overlap the shared experts' compute with the token dispatch: a schedule with the same values. Kestrel "
      "computes the shared experts after the combine, so it changes nothing.");
  always("multi_head_latent_attention",
         "MindSpeed: multi-head latent attention. Kestrel builds MLA exactly when config.json describes it "
         "(DeepSeek-V2/V3: kv_lora_rank, qk_rope_head_dim, ...), so the value changes nothing.");

  // Routing structure: Megatron's arguments, config.json's in Kestrel.
  add("num_moe_experts", I, "null", YES,
      std::string("Routed experts per MoE layer (config.json num_experts / n_routed_experts).") + kFromJson)
      .at_least(1);
  add("moe_router_topk", I, "null", YES,
      std::string("Experts per token (config.json num_experts_per_tok).") + kFromJson)
      .at_least(1);
  add("moe_router_score_function", S, "null", YES,
      std::string("Router score: softmax (Qwen-MoE, DeepSeek-V2) or sigmoid (DeepSeek-V3's scoring_func).") +
          kFromJson,
      {"softmax", "sigmoid"});
  add("moe_router_pre_softmax", B, "null", YES,
      std::string("Softmax over all experts before the top-k (softmax routers whose top-k weights are not "
                  "renormalised: config.json norm_topk_prob false); false = renormalised (norm_topk_prob true). "
                  "Any value with a sigmoid router, which ignores it.") +
          kFromJson);
  add("moe_router_num_groups", I, "null", YES,
      std::string("Expert groups of group-limited routing (config.json n_group of DeepSeek's noaux_tc / "
                  "group_limited_greedy; a model without group-limited routing has none).") +
          kFromJson)
      .at_least(1);
  add("moe_router_group_topk", I, "null", YES,
      std::string("Groups each token may route to (config.json topk_group).") + kFromJson)
      .at_least(1);
  add("moe_router_topk_scaling_factor", F, "null", YES,
      std::string("Factor of the top-k weights (config.json routed_scaling_factor; 1 = none).") + kFromJson)
      .above(0);
  add("moe_ffn_hidden_size", I, "null", YES,
      std::string("FFN width of one routed expert (config.json moe_intermediate_size).") + kFromJson)
      .at_least(1);
  add("moe_shared_expert_intermediate_size", I, "null", YES,
      std::string("FFN width of the shared experts (config.json shared_expert_intermediate_size, or DeepSeek's "
                  "moe_intermediate_size x n_shared_experts; a model without shared experts has none).") +
          kFromJson)
      .at_least(1);
}

}  // namespace kestrel::config::schema_detail
