// actor_rollout_ref.actor.*, actor_rollout_ref.ref.* and critic.* (verl
// actor/megatron_actor.yaml, engine/megatron.yaml, optim/megatron.yaml,
// ref/megatron_ref.yaml, critic/megatron_critic.yaml). The engine and optimizer
// blocks share one shape, declared once per owner by the helpers below.
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, IL = Type::IntList,
               FL = Type::FloatList, SL = Type::StringList, M = Type::Map;

const std::vector<std::string> kLossAgg = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                           "seq-mean-token-sum-norm"};
const std::vector<std::string> kDtypes = {"bfloat16", "float16", "float32"};
const std::vector<std::string> kDtypesOk = {"bfloat16", "float32"};

constexpr const char* kActorMeg = "actor_rollout_ref.actor.megatron";
// Bound of pipeline_model_parallel_size and virtual_pipeline_model_parallel_size (parallel::PipelineSpec holds
// them as int; no run has more stages than this).
constexpr double kMaxStages = 65536;

// Default for a ref key: follow the actor's value when it is set (verl's form).
std::string follow(const std::string& actor_path, const std::string& fallback) {
  return "${oc.select:" + actor_path + "," + fallback + "}";
}

void declare_optim(Builder& b, const std::string& owner, const char* lr) {
  b.scope(owner + ".optim");
  b.k("optimizer", S, "adam", YES,
      "Optimizer: Kestrel's AdamW (decoupled weight decay) for adam and for verl FSDP's AdamW / adamw. verl FSDP "
      "default: AdamW.",
      {"adam", "AdamW", "adamw", "Adam", "sgd"}, {"adam", "AdamW", "adamw", "Adam"});
  b.k("lr", F, lr, YES, "Peak learning rate.").at_least(0);
  b.k("lr_warmup_steps_ratio", F, "0.0", YES, "Warmup steps as a fraction of total_training_steps (used when lr_warmup_steps < 0).").in(0, 1);
  b.k("lr_warmup_steps", I, "-1", YES, "Linear warmup steps; negative uses lr_warmup_steps_ratio.").at_least(-1);
  b.k("lr_warmup_init", F, "0.0", YES, "Learning rate at the start of warmup.").at_least(0);
  b.k("total_training_steps", I, "-1", YES, "Schedule length; -1 is filled in from trainer.total_training_steps at run time.").at_least(1).or_value(-1);
  b.k("weight_decay", F, "0.01", YES, "Decoupled (AdamW) weight decay.").at_least(0);
  b.k("betas", FL, "[0.9, 0.999]", YES, "Adam beta1, beta2.").in(0, 1, true, false);
  b.k("eps", F, "1e-8", YES, "Adam epsilon.").above(0);
  b.k("clip_grad", F, "1.0", YES, "Global gradient-norm clip; 0 disables.").at_least(0);
  b.k("lr_decay_steps", I, "null", YES, "Decay steps; null decays over total_training_steps.").at_least(0);
  b.k("lr_decay_style", S, "constant", YES, "Learning-rate schedule after warmup (Megatron name).",
      {"constant", "linear", "cosine", "inverse_square_root", "WSD"}, {"constant", "linear", "cosine"});
  b.k("warmup_style", S, "null", YES, "FSDP name of the schedule; when set it replaces lr_decay_style.",
      {"constant", "cosine"});
  b.k("min_lr", F, "0.0", YES, "Floor of the decayed learning rate.").at_least(0);
  b.k("min_lr_ratio", F, "null", YES, "FSDP form of the floor: min_lr = lr * min_lr_ratio when set.").in(0, 1);
  b.k("weight_decay_incr_style", S, "constant", YES, "Weight-decay schedule.", {"constant", "linear", "cosine"},
      {"constant"});
  b.k("lr_wsd_decay_style", S, "exponential", NO, "Decay shape of the WSD schedule.",
      {"exponential", "linear", "cosine"});
  b.k("lr_wsd_decay_steps", I, "null", NO, "Decay steps of the WSD schedule.");
  b.k("use_checkpoint_opt_param_scheduler", B, "false", NO, "Restore the scheduler settings from the checkpoint.");
  b.k("override_optimizer_config", M, "{}", NO, "Extra Megatron OptimizerConfig fields.");
}

// The keys of one override_transformer_config section (the actor's, the
// reference's or the critic's) and how each kind of key is declared there.
struct OverrideKeys {
  Builder& b;
  std::string meg;  // "<owner>.megatron"
  bool is_ref, critic_meg;

  // For the ref, each key follows the actor's value unless set.
  std::string d(const std::string& key, const std::string& def) const {
    return is_ref ? follow(std::string(kActorMeg) + ".override_transformer_config." + key, def) : def;
  }
  KeyDecl& add(const std::string& key, Type t, const std::string& def, Support s, const std::string& doc,
               std::vector<std::string> allowed = {}, std::vector<std::string> supported = {}) {
    KeyDecl& k = b.k(key, t, d(key, def), s, doc, std::move(allowed), std::move(supported));
    k.addable = true;
    return k;
  }
  // Defaults to this engine's own megatron.<key>; the ref follows the actor's override.
  KeyDecl& add_own(const std::string& key, Support s, const std::string& doc) {
    const std::string src = is_ref ? std::string(kActorMeg) + ".override_transformer_config." + key : meg + "." + key;
    KeyDecl& k = b.k(key, key == "context_parallel_size" ? I : B, "${" + src + "}", s, doc);
    k.addable = true;
    return k;
  }
  // The critic's and the reference's follow the actor's (they run on its grid).
  KeyDecl& add_grid(const std::string& key, Type t, const std::string& def, const std::string& doc,
                    std::vector<std::string> allowed = {}, std::vector<std::string> supported = {}) {
    const std::string dv =
        is_ref || critic_meg ? follow(std::string(kActorMeg) + ".override_transformer_config." + key, def) : def;
    KeyDecl& k = b.k(key, t, dv, YES, doc, std::move(allowed), std::move(supported));
    k.addable = true;
    return k;
  }
  // A MindSpeed fused-kernel switch: no effect, and true (what Kestrel's
  // kernels always are) accepted without a notice.
  void fused(const std::string& key, const std::string& doc) {
    KeyDecl& k = b.k(key, B, d(key, "false"), NOP, doc);
    k.addable = true;
    k.as_default = {"true"};
  }
};

// Vocabulary padding, recompute, fused kernels, sequence parallelism, the
// optimizer's memory features and deterministic mode.
void declare_compute_overrides(OverrideKeys& o) {
  o.add("make_vocab_size_divisible_by", I, "128", YES,
      "Megatron's vocabulary padding: under tp > 1 a vocabulary tp does not divide is padded to a multiple of this "
      "x tp (rows that never win, stripped on export); tp = 1 and divisible vocabularies are not padded.");
  // verl's defaults (engine/megatron.yaml).
  // Activation recompute (model/recompute.h); bit-identical to none. The ref
  // has no backward, so there they have no effect.
  const Support RC = o.is_ref ? NOP : YES;
  const std::string no_bwd = o.is_ref ? " The reference model has no backward: no effect here." : "";
  o.add("recompute_granularity", S, "null", RC,
      "Activation recompute: full (keep only each chunk's input, rerun its forward in backward; needs "
      "recompute_method and recompute_num_layers) or selective (recompute_modules).",
      {"full", "selective"});
  o.add("recompute_modules", SL, "[core_attn]", RC,
      "Modules recomputed by selective recompute: core_attn (attention core output and lse, from q/k/v), "
      "layernorm (both norms' outputs), mlp (the dense MLP's gate/up/act, from its norm); moe_act, moe, "
      "shared_experts, mla_up_proj (recompute inside the MoE and MLA sub-blocks) are not built yet." + no_bwd,
      {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"},
      {"core_attn", "layernorm", "mlp"});
  o.add("recompute_method", S, "null", RC,
      "How full recompute picks layers: uniform (chunks of recompute_num_layers, one checkpoint each) or block "
      "(the first recompute_num_layers layers of the stage, one checkpoint each)." + no_bwd,
      {"uniform", "block"});
  o.add("recompute_num_layers", I, "null", RC,
      "Layers per recompute chunk (uniform) or recomputed layers per stage (block); >= 1 with full." + no_bwd).at_least(1);
  o.add("recompute_activation_function", B, "false", RC,
      "MindSpeed: drop the SwiGLU output once the down projection used it, recompute it before the down "
      "projection's weight gradient; with full recompute only with recompute_method=block (its layers come after "
      "the full ones)." + no_bwd);
  o.add("recompute_activation_function_num_layers", I, "null", RC,
      "MindSpeed: layers (after the full-recompute ones) with activation-function recompute; null = all." + no_bwd).at_least(1);
  o.add("recompute_norm", B, "false", RC,
      "MindSpeed: drop both RMSNorm outputs once q/k/v and gate/up used them, recompute them (an all-gather "
      "under sequence parallelism) before their backward; with full recompute only with recompute_method=block." +
          no_bwd);
  o.add("recompute_norm_num_layers", I, "null", RC,
      "MindSpeed: layers (after the full-recompute ones) with norm recompute; null = all." + no_bwd).at_least(1);
  o.add("attention_backend", S, "flash", NOP,
      "Megatron attention implementation; Kestrel runs its own fused (flash-style) attention for every value.",
      {"flash", "fused", "unfused", "local", "auto"});
  // MindSpeed (verl MindSpeed backend guide). Kestrel's kernels are always
  // the fused ones, so true is what it does (accepted without a notice).
  o.fused("use_flash_attn", "MindSpeed fused flash attention; Kestrel's attention is always fused (flash-style).");
  o.fused("use_fused_rmsnorm", "MindSpeed fused RMSNorm kernel; Kestrel's RMSNorm is always its single-pass kernel.");
  o.fused("use_fused_swiglu", "MindSpeed fused SwiGLU kernel; Kestrel's SwiGLU is always fused.");
  o.add_own("sequence_parallel", YES,
      o.is_ref ? "Sequence parallelism of the reference model; must equal the actor's (it runs on the actor's grid)."
             : "Sequence parallelism inside TP regions; defaults to megatron.sequence_parallel.");
  o.add_own("use_distributed_optimizer", o.is_ref ? NOP : YES,
      o.is_ref ? "The reference model has no optimizer."
             : "Shard optimizer state over DP ranks; defaults to megatron.use_distributed_optimizer.");
  o.add("swap_optimizer", B, "false", o.is_ref ? NOP : YES,
      o.is_ref ? "The reference model has no optimizer."
             : "MindSpeed: AdamW's moments and f32 masters live in host memory and each step swaps them through the "
               "device in swap_optimizer_times pieces, copies overlapped with the steps (the device holds two pieces at most: one stepping while the next comes in and the last goes out; bit-identical). Acts on the GPU "
               "(trainer.device=cuda); on the CPU backend the state is in host memory already. Not with "
               "reuse_fp32_param (as MindSpeed).");
  o.add("swap_optimizer_times", I, "16", o.is_ref ? NOP : YES,
      o.is_ref ? "The reference model has no optimizer."
             : "MindSpeed: the pieces of one swap-optimizer step (swap_optimizer).").at_least(1);
  // BF16 parameter-copy reuse (optim/adamw.h): the f32 master held as the bf16 weights + a 16-bit residual.
  o.add("reuse_fp32_param", B, "false", o.is_ref ? NOP : YES,
      o.is_ref ? "The reference model has no optimizer (it follows the actor's value)."
             : "MindSpeed: hold each f32 master as the bf16 weight plus a 16-bit residual (exact round-to-nearest-even "
               "split), 2 bytes per parameter less (/dp with the distributed optimizer); training is bit-identical. "
               "bf16 only (megatron.dtype).");
  // Deterministic computation (core/parallel_for.h): process-wide, so the actor's key decides.
  o.add("deterministic_mode", B, "false", o.is_ref || o.critic_meg ? NOP : YES,
      o.is_ref || o.critic_meg
          ? "Process-wide in Kestrel: actor_rollout_ref.actor.megatron.override_transformer_config.deterministic_mode "
            "(or KESTREL_DETERMINISTIC=1) decides for every model."
          : "Megatron's deterministic mode: GEMMs in fixed tiles of one pinned library, so training, scoring and "
            "rollout give the same bits at any thread count (Kestrel's own kernels always do); also "
            "actor.fsdp_config.full_determinism or KESTREL_DETERMINISTIC=1.");
}

// The pipeline split (noop layers, uneven stages, the interleaved schedule)
// and context parallelism.
void declare_layout_overrides(OverrideKeys& o) {
  // Pipeline layout (parallel/pipeline_layout.h); the reference's must equal the actor's.
  const std::string pp_same = o.is_ref ? " Must equal the actor's: the reference model is the actor's copy on its "
                                       "pipeline stages (the default follows the actor's)."
                                     : "";
  o.add("noop_layers", IL, "null", YES,
      "MindSpeed: layer slots (0-based, in [0, num_hidden_layers + the list's length)) that are identity layers "
      "without parameters, to even out the pipeline split (e.g. [0, 29] pads 28 layers to 30 slots); a list of "
      "distinct ints >= 0." + pp_same).at_least(0);
  o.add("num_layers", I, "null", YES,
      "Megatron's total layer count; Kestrel takes the layers from config.json, so this must equal "
      "num_hidden_layers + the length of noop_layers (null: that value)." + pp_same).at_least(1);
  o.add_own("context_parallel_size", YES,
      "Context-parallel size; defaults to megatron.context_parallel_size." +
          std::string(o.is_ref ? " Must equal the actor's (the reference model runs on the actor's grid)." : ""))
      .in(1, kMaxStages);
  const std::string cp_same = o.is_ref || o.critic_meg ? " Must equal the actor's (this model runs on the actor's grid)."
                                                   : "";
  o.add_grid("context_parallel_algo", S, "megatron_cp_algo",
      "MindSpeed: how attention runs under context parallelism: megatron_cp_algo (ring attention, K/V blocks "
      "circulating with causal load balancing), ulysses_cp_algo (all-to-all from sequence to head shards; heads "
      "per tp rank divisible by cp), hybrid_cp_algo (Ulysses inside groups of ulysses_degree_in_cp ranks, ring "
      "across them). Whole sequences only: use_prefix_grouper is off under cp." + cp_same,
      {"megatron_cp_algo", "ulysses_cp_algo", "hybrid_cp_algo", "adaptive_cp_algo", "hybrid_adaptive_cp_algo"},
      {"megatron_cp_algo", "ulysses_cp_algo", "hybrid_cp_algo"});
  o.add_grid("ulysses_degree_in_cp", I, "null",
      "MindSpeed: the Ulysses group size of hybrid_cp_algo; divides context_parallel_size, strictly between 1 and "
      "it. Read for hybrid_cp_algo only." + cp_same).at_least(1);
  o.add("cp_attention_mask_type", S, "causal", YES,
      "MindSpeed's attention mask under context parallelism. Kestrel trains packed sequences, causal within each: "
      "'general' (MindSpeed's explicit-mask path, which MindSpeed-RL uses for the same packed causal masks) "
      "computes the same attention as 'causal'.",
      {"causal", "general"});
  {
    KeyDecl& k = o.b.k("use_cp_send_recv_overlap", B, o.d("use_cp_send_recv_overlap", "false"), NOP,
                     "MindSpeed: overlap ring attention's block send/receive with compute. Kestrel's ring always "
                     "posts the next block's transfer before the current block's attention.");
    k.addable = true;
    k.as_default = {"true"};
  }
  o.add("use_ascend_mc2", B, "false", NO, "MindSpeed: Ascend MC2 fused matmul + communication.");
  // Megatron TransformerConfig fields commonly passed by verl scripts.
  o.add("num_layers_in_first_pipeline_stage", I, "null", YES,
      "Uneven PP split: layer slots (noop_layers included) on the first pipeline stage; null = an even split. The "
      "other stages share the rest evenly." + pp_same).at_least(1);
  o.add("num_layers_in_last_pipeline_stage", I, "null", YES,
      "Uneven PP split: layer slots (noop_layers included) on the last pipeline stage; null = an even split." +
          pp_same).at_least(1);
  o.add("microbatch_group_size_per_vp_stage", I, "null", YES,
      "Interleaved (virtual_pipeline_model_parallel_size > 1) schedule: micro-batches run on one model chunk before "
      "the next; null = pipeline_model_parallel_size (Megatron's default)." + pp_same).at_least(1);
  o.add("account_for_embedding_in_pipeline_split", B, "false", NO,
      "Count the embedding as a layer when splitting PP stages (Kestrel's split counts decoder layers and noop_layers "
      "only).");
  o.add("account_for_loss_in_pipeline_split", B, "false", NO,
      "Count the loss as a layer when splitting PP stages (Kestrel's split counts decoder layers and noop_layers "
      "only).");
  o.add("deallocate_pipeline_outputs", B, "false", NOP,
      "Megatron frees a sent pipeline activation's data early when true. Kestrel always does: each stage's sent "
      "output is released as soon as its send completes (train/pipeline.cpp), so the value changes nothing.");
}

// Megatron kernel choices and dropout, and the MoE routers.
void declare_kernel_and_moe_overrides(OverrideKeys& o) {
  o.add("apply_rope_fusion", B, "false", NOP, "Fused RoPE kernel: a Megatron kernel choice with the same math; Kestrel runs its own kernels.");
  o.add("gradient_accumulation_fusion", B, "false", NOP, "Fuse weight-gradient accumulation into the GEMM: a Megatron kernel choice with the same math; Kestrel runs its own kernels.");
  o.add("persist_layer_norm", B, "false", NOP, "Persistent LayerNorm kernel: a Megatron kernel choice with the same math; Kestrel runs its own kernels.");
  o.add("bias_activation_fusion", B, "false", NOP, "Fused bias + activation: a Megatron kernel choice with the same math; Kestrel runs its own kernels.");
  o.add("bias_dropout_fusion", B, "false", NOP,
      "Fused bias + dropout + add: a Megatron kernel choice with the same math; Kestrel has no dropout.");
  o.add("masked_softmax_fusion", B, "false", NOP, "Fused masked softmax: a Megatron kernel choice with the same math; Kestrel runs its own kernels.");
  o.add("attention_dropout", F, "0.0", NO, "Attention dropout probability.");
  o.add("hidden_dropout", F, "0.0", NO, "Hidden-state dropout probability.");
  // Mixture-of-experts routers (schema_moe.cpp); the reference's follow the actor's.
  declare_moe_overrides(o.b, o.meg + ".override_transformer_config", !o.is_ref,
                        o.is_ref ? std::string(kActorMeg) + ".override_transformer_config" : std::string());
}

// override_transformer_config: the MindSpeed keys of verl's MindSpeed backend
// guide plus the Megatron TransformerConfig fields verl scripts pass. For the
// ref, each key follows the actor's value unless set.
void declare_transformer_overrides(Builder& b, const std::string& meg, bool is_ref) {
  b.scope(meg + ".override_transformer_config");
  OverrideKeys o{b, meg, is_ref, meg.rfind("critic", 0) == 0};
  declare_compute_overrides(o);
  declare_layout_overrides(o);
  declare_kernel_and_moe_overrides(o);
}

void declare_megatron(Builder& b, const std::string& owner, bool is_ref) {
  const std::string meg = owner + ".megatron";
  b.scope(meg);
  auto d = [&](const std::string& key, const std::string& def) {
    return is_ref ? follow(std::string(kActorMeg) + "." + key, def) : def;
  };
  b.k("param_offload", B, "false", YES, std::string("Offload parameters to host memory between phases.") + kPhaseOffload);
  b.k("grad_offload", B, "false", is_ref ? NOP : YES,
      is_ref ? std::string("The reference model has no gradients.")
             : std::string("Offload gradients to host memory between phases.") + kPhaseOffload);
  b.k("optimizer_offload", B, "false", is_ref ? NOP : YES,
      is_ref ? std::string("The reference model has no optimizer.") : std::string(kOptimizerOffload));
  const bool critic = owner == "critic";
  // The reference model is built with the actor's layout and dtype; its keys follow the actor's.
  const Support own = YES;
  const std::string as_actor = " Must equal the actor's: the reference model runs on the actor's process grid in its "
                               "dtype (the default follows the actor's).";
  const std::string critic_same = critic ? " Must equal the actor's: the critic runs on the actor's process grid." : "";
  // The critic's grid sizes default to the actor's (verl's default, 1, would refuse every actor layout but 1 x 1).
  const std::string critic_grid = " Must equal the actor's: the critic runs on the actor's process grid (the default "
                                  "follows the actor's; verl default: 1).";
  auto grid_default = [&](const std::string& key) {
    return critic ? "${" + std::string(kActorMeg) + "." + key + "}" : d(key, "1");
  };
  b.k("tensor_model_parallel_size", I, grid_default("tensor_model_parallel_size"), own,
      "Tensor-parallel size (TP)." + (is_ref ? as_actor : critic ? critic_grid : std::string())).at_least(1);
  b.k("expert_model_parallel_size", I, grid_default("expert_model_parallel_size"), own,
      "Expert-parallel size (EP) of a mixture-of-experts model: each MoE layer's routed experts are split over this "
      "many ranks in consecutive blocks and every token goes to its experts' ranks and back (the alltoall "
      "dispatcher); the router and the shared experts are replicated. The expert grid is etp x ep x edp over the "
      "same ranks, the experts' gradients summed over edp = world / (ep x pp). Runs with data and pipeline "
      "parallelism and the distributed optimizer (the experts' optimizer state sharded over edp; tensor and context "
      "parallel sizes 1, no virtual stages): the world size "
      "must divide by it "
      "and it must divide num_experts; the rollout holds every expert (gathered after each update)." +
          (is_ref ? as_actor : critic ? critic_grid : std::string())).at_least(1);
  b.k("expert_tensor_parallel_size", I, d("expert_tensor_parallel_size", "null"), own,
      "Tensor-parallel size inside experts (ETP); null = tensor_model_parallel_size (Megatron's default). A value "
      "equal to tensor_model_parallel_size is the same layout; another is refused (not supported yet).").at_least(1);
  b.k("pipeline_model_parallel_size", I, grid_default("pipeline_model_parallel_size"), own,
      "Pipeline-parallel size (PP): the decoder layers are split over this many stages (Megatron's rules; uneven "
      "splits: override_transformer_config.num_layers_in_{first,last}_pipeline_stage, noop_layers); the processes "
      "form a tp x pp x dp grid, so tensor_model_parallel_size x this divides the world size." +
          (is_ref ? as_actor : critic ? critic_grid : std::string())).in(1, kMaxStages);
  b.k("virtual_pipeline_model_parallel_size", I, d("virtual_pipeline_model_parallel_size", "null"), own,
      "Virtual pipeline stages (model chunks) per PP rank, interleaved 1F1B; null or 1 = none; > 1 needs "
      "pipeline_model_parallel_size >= 2." + (is_ref ? as_actor : std::string())).in(1, kMaxStages);
  b.k("context_parallel_size", I, grid_default("context_parallel_size"), own,
      "Context-parallel size (CP): each sequence is split over this many ranks (zigzag chunks for causal load "
      "balance), attention by override_transformer_config.context_parallel_algo; the processes form a tp x cp x pp "
      "x dp grid." + (is_ref ? as_actor : critic ? critic_grid : std::string())).in(1, kMaxStages);
  b.k("sequence_parallel", B, d("sequence_parallel", "true"), own,
      "Sequence parallelism: shard norm/dropout activations over TP ranks." + (is_ref ? as_actor : critic_same));
  b.k("use_distributed_optimizer", B,
      critic ? "${" + std::string(kActorMeg) + ".use_distributed_optimizer}" : d("use_distributed_optimizer", "false"),
      is_ref ? NOP : YES,
      is_ref ? "The reference model has no optimizer."
             : critic ? "Shard the critic's optimizer state over DP ranks (ZeRO-1); defaults to the actor's. verl "
                        "default: true."
                      : "Shard optimizer state over DP ranks (ZeRO-1). verl default: true.");
  b.k("use_dist_checkpointing", B, d("use_dist_checkpointing", "false"), NO, "Load Megatron dist checkpoints instead of HF weights.");
  b.k("dist_checkpointing_path", S, d("dist_checkpointing_path", "null"), NO, "Megatron dist checkpoint directory.");
  b.k("dist_checkpointing_prefix", S, "\"\"", NO, "Key prefix inside the dist checkpoint.");
  b.k("seed", I, d("seed", "42"), critic ? YES : NOP,
      critic ? "Seed of the value head's initialisation."
             : "Seed of parameter init and dropout; this model loads its weights from HF and Kestrel has no dropout.").any_value("a seed: any integer");
  b.k("override_ddp_config", M, "{}", NO, "Extra Megatron DistributedDataParallelConfig fields.");
  declare_transformer_overrides(b, meg, is_ref);
  b.scope(meg);
  b.k("override_mcore_model_config", M, "{}", NO, "Extra fields for the Megatron model constructor.");
  b.k("use_mbridge", B, d("use_mbridge", "true"), NOP, "HF<->Megatron weight bridge; Kestrel always reads HF weights directly.");
  b.k("vanilla_mbridge", B, d("vanilla_mbridge", "true"), NOP, "Use the vanilla mbridge; Kestrel has no mbridge.");
  b.k("use_remove_padding", B, "true", NOP, "Packed (THD) sequences without padding; Kestrel always packs (false, "
      "padded BSHD in Megatron, gives the same values).");
  b.k("forward_only", B, is_ref ? "true" : "false", NO, "Build the engine for inference only (set for the reference model).");
  b.k("dtype", S, is_ref ? follow(std::string(kActorMeg) + ".dtype", "bfloat16") : "bfloat16", own,
      "Compute dtype of the training engine." + (is_ref ? as_actor : std::string()), kDtypes, kDtypesOk);
}

void declare_checkpoint(Builder& b, const std::string& owner) {
  b.scope(owner + ".checkpoint");
  b.k("save_contents", SL, "[model, optimizer, extra]", NOP,
      "What a checkpoint holds; Kestrel always saves the model, optimizer and trainer state (a resume needs them all).",
      {"model", "optimizer", "extra", "hf_model"});
  b.k("load_contents", SL, "${.save_contents}", NOP, "What resuming loads; Kestrel always loads all of it.",
      {"model", "optimizer", "extra", "hf_model"});
  b.k("async_save", B, "false", NO, "Save checkpoints in the background.");
}

}  // namespace

void declare_actor_ref_critic(Builder& b) {
  const std::string actor = "actor_rollout_ref.actor";
  b.scope(actor);
  b.k("strategy", S, "megatron", YES, "Training backend name; megatron, fsdp and fsdp2 all run Kestrel's one training "
      "engine (--config-name=ppo_trainer gives verl's FSDP default: fsdp).",
      {"megatron", "fsdp", "fsdp2"});
  b.k("rollout_n", I, "${actor_rollout_ref.rollout.n}", NOP,
      "Responses per prompt, a copy of rollout.n that verl fills in; Kestrel reads actor_rollout_ref.rollout.n.");
  b.k("ppo_mini_batch_size", I, "256", YES,
      "Prompts per optimizer step (global); train_batch_size / ppo_mini_batch_size steps per PPO epoch.").at_least(1);
  b.k("ppo_micro_batch_size", I, "null", NO, "Deprecated global micro-batch; use ppo_micro_batch_size_per_gpu.");
  b.k("ppo_micro_batch_size_per_gpu", I, "null", YES, "Sequences per forward/backward on one rank (gradient accumulation unit).").at_least(1);
  b.k("use_dynamic_bsz", B, "false", YES, "Form micro-batches by token count (ppo_max_token_len_per_gpu) instead of sequence count.");
  b.k("ppo_max_token_len_per_gpu", I, "16384", YES, "Token budget of one micro-batch when use_dynamic_bsz.").at_least(1);
  b.k("ppo_epochs", I, "1", YES, "Passes over each training batch.").at_least(1);
  b.k("shuffle", B, "false", YES, "Shuffle the batch between PPO epochs.");
  b.k("data_loader_seed", I, "42", YES, "Seed of the mini-batch shuffle.").any_value("a seed: any integer");
  b.k("clip_ratio", F, "0.2", YES, "PPO clip epsilon (default for clip_ratio_low/high).").at_least(0);
  b.k("clip_ratio_low", F, "${.clip_ratio}", YES,
      "Lower clip epsilon: ratio >= 1 - clip_ratio_low; null or unset = clip_ratio (verl default: 0.2).").at_least(0);
  b.k("clip_ratio_high", F, "${.clip_ratio}", YES,
      "Upper clip epsilon: ratio <= 1 + clip_ratio_high (DAPO clip-higher); null or unset = clip_ratio (verl default: 0.2).").at_least(0);
  b.k("clip_ratio_c", F, "3.0", YES, "Dual-clip constant for negative advantages; must be > 1.").above(1);
  b.k("tau_pos", F, "1.0", NO, "SAPO temperature for positive advantages (policy_loss.loss_mode=sapo).");
  b.k("tau_neg", F, "1.05", NO, "SAPO temperature for negative advantages (policy_loss.loss_mode=sapo).");
  b.k("policy_loss.loss_mode", S, "vanilla", YES, "Policy loss.",
      {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "bypass_mode"}, {"vanilla"});
  b.k("policy_loss.clip_cov_ratio", F, "0.0002", NO, "clip_cov: fraction of tokens clipped.");
  b.k("policy_loss.clip_cov_lb", F, "1.0", NO, "clip_cov: lower covariance bound.");
  b.k("policy_loss.clip_cov_ub", F, "5.0", NO, "clip_cov: upper covariance bound.");
  b.k("policy_loss.kl_cov_ratio", F, "0.0002", NO, "kl_cov: fraction of tokens with the KL penalty.");
  b.k("policy_loss.ppo_kl_coef", F, "0.1", NO, "kl_cov: KL coefficient.");
  b.k("loss_agg_mode", S, "token-mean", YES, "How per-token losses are reduced.", kLossAgg);
  b.k("loss_scale_factor", F, "null", YES, "Divisor for seq-mean-token-sum-norm; null = response length.").above(0);
  b.k("entropy_coeff", F, "0", YES, "Entropy bonus coefficient.").any_value("signed: verl subtracts entropy_coeff x entropy, a negative value penalises entropy");
  b.k("calculate_entropy", B, "false", NO,
      "Compute entropy in the update even when entropy_coeff is 0 (Kestrel computes it only for entropy_coeff != 0).");
  b.k("use_kl_loss", B, "false", YES, "Add a KL(actor || ref) loss term (GRPO); builds the reference model.");
  b.k("kl_loss_coef", F, "0.001", YES, "Coefficient of the KL loss.").at_least(0);
  b.k("kl_loss_type", S, "low_var_kl", YES, "KL estimator of the KL loss; a '+' suffix uses a straight-through k2 gradient.",
      {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full", "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"},
      {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"});
  b.k("use_torch_compile", B, "true", NOP, "torch.compile in verl; Kestrel is compiled C++.");
  b.k("use_prefix_grouper", B, "true", YES,
      "Pack each prompt once per micro-batch, its responses continuing it (actor update, old/ref log-probs, critic): "
      "the same loss and gradients, the prompt computed once instead of rollout.n times. Off under context "
      "parallelism (each sequence is split whole over the cp ranks). verl's default: false.");
  b.k("freeze_vision_tower", B, "false", NO, "Freeze the vision encoder (multimodal).");
  b.k("router_replay.mode", S, "disabled", YES,
      "MoE routing replay (verl's router_replay; a dense model ignores it). R2: the old-log-prob forward records "
      "the experts of every token and the update replays them, so the policy ratio compares the same experts even "
      "after an earlier mini-batch moved the routers; when old log-probs are not computed (on-policy: one "
      "mini-batch, one epoch, no in-reward KL, the rollout's weights) there is no record and R2 changes nothing. "
      "R3: the rollout's routing (needs actor_rollout_ref.rollout.enable_rollout_routing_replay=true) is replayed "
      "by the old-log-prob forward and the update. Capacity dropping still applies to the replayed experts.",
      {"disabled", "R2", "R3"});
  b.k("router_replay.record_file", S, "null", NO,
      "A file to save the recorded routing to; Kestrel keeps the routing with the batch in memory.");
  b.k("router_replay.replay_file", S, "null", NO,
      "A file of routing decisions to replay; Kestrel replays the batch's own record (router_replay.mode).");
  declare_checkpoint(b, actor);
  declare_optim(b, actor, "1e-6");
  declare_megatron(b, actor, false);

  const std::string ref = "actor_rollout_ref.ref";
  b.scope(ref);
  b.k("strategy", S, "${actor_rollout_ref.actor.strategy}", YES,
      "Backend of the reference model; megatron, fsdp and fsdp2 all run Kestrel's one engine.",
      {"megatron", "fsdp", "fsdp2"});
  b.k("use_torch_compile", B, follow("actor_rollout_ref.actor.use_torch_compile", "true"), NOP,
      "torch.compile in verl; Kestrel is compiled C++.");
  b.k("log_prob_micro_batch_size", I, "null", NO, "Deprecated global micro-batch; use log_prob_micro_batch_size_per_gpu.");
  b.k("log_prob_micro_batch_size_per_gpu", I, "null", YES, "Sequences per reference log-prob forward on one rank.").at_least(1);
  b.k("log_prob_use_dynamic_bsz", B, follow("actor_rollout_ref.actor.use_dynamic_bsz", "false"), NOP,
      "Token-budget micro-batches for reference log-probs; Kestrel batches the reference pass as the old-log-prob "
      "pass (actor_rollout_ref.rollout.log_prob_*).");
  b.k("log_prob_max_token_len_per_gpu", I, follow("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "16384"), NOP,
      "Token budget per reference log-prob micro-batch; Kestrel uses actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu.");
  declare_megatron(b, ref, true);

  const std::string critic = "critic";
  b.scope(critic);
  b.k("enable", B, "null", YES, "Train a value model; null enables it exactly when algorithm.adv_estimator is gae.");
  b.k("strategy", S, "megatron", YES, "Critic backend name; megatron, fsdp and fsdp2 all run Kestrel's one engine.",
      {"megatron", "fsdp", "fsdp2"});
  b.k("rollout_n", I, "${oc.select:actor_rollout_ref.rollout.n,1}", NOP,
      "Responses per prompt, a copy of rollout.n that verl fills in; Kestrel reads actor_rollout_ref.rollout.n.");
  b.k("model.path", S, "${actor_rollout_ref.model.path}", YES,
      "HF model directory the value model starts from (verl: ~/models/deepseek-llm-7b-chat; Kestrel: the actor's).");
  b.k("model.tokenizer_path", S, "${oc.select:actor_rollout_ref.model.path,null}", NOP,
      "Tokenizer directory; Kestrel's critic scores the actor's token ids and needs none.");
  b.k("model.override_config", M, "{model_config: {}, moe_config: {freeze_moe_router: false}}", NO,
      "Fields overriding the critic's HF config.json (verl's Megatron shape; its FSDP tree writes {}).");
  b.k("model.external_lib", S, "null", NO, "Python module imported to register custom models.");
  b.k("model.trust_remote_code", B, "false", NO, "Run Python modelling code from the model repository.");
  b.k("ppo_mini_batch_size", I, follow("actor_rollout_ref.actor.ppo_mini_batch_size", "256"), YES,
      "Prompts per critic optimizer step (global).").at_least(1);
  b.k("ppo_micro_batch_size", I, "null", NO, "Deprecated global micro-batch; use ppo_micro_batch_size_per_gpu.");
  b.k("ppo_micro_batch_size_per_gpu", I, "null", YES, "Sequences per critic forward/backward on one rank.").at_least(1);
  b.k("forward_micro_batch_size", I, "null", NO, "Deprecated global micro-batch; use forward_micro_batch_size_per_gpu.");
  b.k("forward_micro_batch_size_per_gpu", I, "${oc.select:.ppo_micro_batch_size_per_gpu,null}", YES,
      "Sequences per value forward (no gradient) on one rank; null = ppo_micro_batch_size_per_gpu.").at_least(1);
  b.k("use_dynamic_bsz", B, follow("actor_rollout_ref.actor.use_dynamic_bsz", "false"), YES, "Token-budget micro-batches.");
  b.k("ppo_max_token_len_per_gpu", I, "32768", YES, "Token budget per critic micro-batch.").at_least(1);
  b.k("forward_max_token_len_per_gpu", I, "${.ppo_max_token_len_per_gpu}", YES, "Token budget per value forward micro-batch.").at_least(1);
  b.k("ppo_epochs", I, follow("actor_rollout_ref.actor.ppo_epochs", "1"), YES, "Passes over each batch.").at_least(1);
  b.k("shuffle", B, follow("actor_rollout_ref.actor.shuffle", "false"), YES, "Shuffle between epochs.");
  b.k("data_loader_seed", I, "42", YES, "Seed of the mini-batch shuffle.").any_value("a seed: any integer");
  b.k("cliprange_value", F, "0.5", YES, "Value clip range around the old values.").at_least(0);
  b.k("loss_agg_mode", S, follow("actor_rollout_ref.actor.loss_agg_mode", "token-mean"), YES,
      "How per-token value losses are reduced.", kLossAgg);
  declare_checkpoint(b, critic);
  declare_optim(b, critic, "1e-5");
  declare_megatron(b, critic, false);
}

}  // namespace kestrel::config::schema_detail
