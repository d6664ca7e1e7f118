// The keys of verl's FSDP tree (ppo_trainer.yaml: actor/dp_actor.yaml,
// ref/dp_ref.yaml, critic/dp_critic.yaml, engine/fsdp.yaml, optim/fsdp.yaml)
// that its Megatron tree lacks. Kestrel has one training engine; `strategy`
// fsdp, fsdp2 and megatron all run it, so these keys either map onto what
// that engine does (grad_clip is the optimizer's clip, fsdp_config.dtype the
// compute dtype megatron.dtype sets), change only how verl shards and wraps
// (no effect here), or ask for what is not built yet (offload, Ulysses).
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String;

constexpr const char* kWhyShard =
    "how FSDP shards and schedules parameters; Kestrel's engine keeps whole parameters per tensor-parallel rank "
    "(optimizer state sharded by megatron.use_distributed_optimizer), so the results do not depend on it.";

// engine/fsdp.yaml under `at` ("actor_rollout_ref.actor.fsdp_config", ...).
// `owner` holds the megatron block whose dtype is Kestrel's compute dtype.
void declare_fsdp_engine(Builder& b, const std::string& at, const std::string& owner, bool forward_only) {
  b.scope(at);
  b.k("wrap_policy.min_num_params", I, "0", NOP, std::string("FSDP wrapping threshold: ") + kWhyShard);
  b.k("param_offload", B, "false", YES,
      std::string(forward_only ? "Offload parameters" : "Offload parameters and gradients (FSDP offloads the module)") +
          " to host memory between phases." + kPhaseOffload);
  b.k("optimizer_offload", B, "false", forward_only ? NOP : YES,
      forward_only ? std::string("A forward-only model has no optimizer.") : std::string(kOptimizerOffload));
  b.k("offload_policy", B, "false", NOP, std::string("FSDP2 CPU offload of parameters, gradients and optimizer state.") + kOffloadOnCpu);
  b.k("reshard_after_forward", B, "true", NOP, std::string("Free gathered parameters after the forward: ") + kWhyShard);
  b.k("fsdp_size", I, "-1", NOP, std::string("Ranks per FSDP shard group (-1 = all): ") + kWhyShard);
  b.k("forward_prefetch", B, "false", NOP, std::string("Prefetch the next all-gather: ") + kWhyShard);
  b.k("model_dtype", S, "fp32", NOP,
      "dtype the FSDP module is built in; Kestrel keeps f32 master weights and computes in megatron.dtype.",
      {"fp32", "bf16", "fp16", "float32", "bfloat16", "float16"});
  b.k("use_orig_params", B, "false", NOP, std::string("FSDP1 flat-parameter detail: ") + kWhyShard);
  b.k("seed", I, "42", NOP, "Seed of FSDP's initialisation; Kestrel loads HF weights and has no dropout.");
  const bool actor_engine = at == "actor_rollout_ref.actor.fsdp_config";
  b.k("full_determinism", B, "false", actor_engine ? YES : NOP,
      actor_engine ? "verl's full determinism: Kestrel's deterministic mode (as megatron.override_transformer_config."
                     "deterministic_mode): the same bits at any thread count, for training, scoring and rollout."
                   : "Process-wide in Kestrel: actor_rollout_ref.actor.fsdp_config.full_determinism decides.");
  b.k("ulysses_sequence_parallel_size", I, "1", actor_engine ? YES : NO,
      actor_engine ? "verl's Ulysses sequence parallelism: context parallelism of this size with ulysses_cp_algo "
                     "(as actor.ulysses_sequence_parallel_size)."
                   : "Ulysses size of this engine; Kestrel's models run on the actor's grid: set "
                     "actor_rollout_ref.actor.ulysses_sequence_parallel_size.").at_least(1);
  b.k("entropy_from_logits_with_chunking", B, "false", NOP,
      "Compute the entropy over chunks of the logits to save memory; the values are the same.");
  b.k("use_torch_compile", B, "true", NOP, "torch.compile in verl; Kestrel is compiled C++.");
  b.k("entropy_checkpointing", B, "false", NOP, "Recompute the entropy in the backward to save memory; the values are the same.");
  b.k("forward_only", B, forward_only ? "true" : "false", NOP,
      "Build the module for inference only; Kestrel builds the reference model without an optimizer anyway.");
  b.k("strategy", S, "fsdp", NOP, "FSDP version; Kestrel's one engine runs for both.", {"fsdp", "fsdp2"});
  // Older verl's FSDP mixed-precision block, added with + by some scripts;
  // verl at b178a3c no longer reads it either.
  for (const char* k : {"param_dtype", "reduce_dtype", "buffer_dtype"}) {
    KeyDecl& mp = b.k(std::string("mixed_precision.") + k, S, "null", NOP,
                      "Older verl's FSDP mixed-precision dtype (added with +); Kestrel computes in " + owner +
                          ".megatron.dtype and keeps f32 gradients and master weights.");
    mp.addable = true;
  }
  b.k("dtype", S, "${" + owner + ".megatron.dtype}", NO,
      "Mixed-precision compute dtype; Kestrel's engine computes in " + owner +
          ".megatron.dtype (set that one: this key must equal it, which its default does).",
      {"bfloat16", "float16", "float32"});
}

// optim/fsdp.yaml keys the Megatron optimizer block lacks.
void declare_fsdp_optim(Builder& b, const std::string& owner) {
  b.scope(owner + ".optim");
  b.k("optimizer_impl", S, "torch.optim", NO,
      "Python module of the optimizer class (torchao.optim, bitsandbytes.optim ...); Kestrel has its own AdamW.");
  b.k("lr_scheduler_type", S, "null", YES,
      "FSDP name of the schedule after warmup; when set it replaces lr_decay_style (warmup_style, deprecated, wins "
      "over both). verl FSDP default: constant.",
      {"constant", "cosine"});
  b.k("num_cycles", F, "0.5", NO, "Cosine cycles over the decay; Kestrel's cosine is one half cycle (0.5).");
}

}  // namespace

void declare_verl_fsdp(Builder& b) {
  const std::string A = "actor_rollout_ref.actor", R = "actor_rollout_ref.ref", C = "critic";
  for (const std::string& owner : {A, C}) {
    b.scope(owner);
    b.k("grad_clip", F, "null", YES,
        "Gradient-norm clip, verl's FSDP name (dp_actor/dp_critic read it); when set it replaces optim.clip_grad. "
        "verl FSDP default: 1.0, as optim.clip_grad's.").at_least(0);
    const bool critic = owner == C;
    b.k("ulysses_sequence_parallel_size", I, critic ? "${oc.select:" + A + ".ulysses_sequence_parallel_size,1}" : "1",
        YES,
        critic ? "verl FSDP's Ulysses size of the critic; it runs on the actor's grid, so this must equal the actor's "
                 "(the default follows it)."
               : "verl FSDP's Ulysses sequence parallelism: context parallelism of this size with ulysses_cp_algo "
                 "(the same as megatron.context_parallel_size with override_transformer_config.context_parallel_algo="
                 "ulysses_cp_algo; set one of them).").at_least(1);
  }
  b.scope(A);
  b.k("entropy_from_logits_with_chunking", B, "false", NOP,
      "Compute the entropy over chunks of the logits to save memory; the values are the same.");
  b.k("entropy_checkpointing", B, "false", NOP, "Recompute the entropy in the backward to save memory; the values are the same.");
  b.k("use_remove_padding", B, "${oc.select:actor_rollout_ref.model.use_remove_padding,true}", NOP,
      "Packed inputs without padding; Kestrel always packs (false gives the same values).");
  b.k("calculate_sum_pi_squared", B, "false", NO, "Compute sum(pi^2) per token (optimal-token-baseline estimators).");
  b.k("sum_pi_squared_checkpointing", B, "false", NO, "Recompute sum(pi^2) in the backward.");
  declare_fsdp_engine(b, A + ".fsdp_config", A, false);
  declare_fsdp_optim(b, A);

  b.scope(R);
  b.k("ulysses_sequence_parallel_size", I, "${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}", YES,
      "Ulysses size of the reference model; it is the actor's copy on the actor's grid, so this must equal the "
      "actor's (the default follows it).").at_least(1);
  b.k("entropy_from_logits_with_chunking", B, "false", NOP,
      "Compute the entropy over chunks of the logits to save memory; the values are the same.");
  b.k("entropy_checkpointing", B, "false", NOP, "Recompute the entropy in the backward to save memory; the values are the same.");
  declare_fsdp_engine(b, R + ".fsdp_config", R, true);

  b.scope(C + ".model");
  b.k("use_shm", B, "false", NO, "Copy the critic's weights through /dev/shm before loading.");
  b.k("enable_gradient_checkpointing", B, "false", YES,
      "Activation recompute of the critic (verl's FSDP switch): true is full recompute of every layer when "
      "critic.megatron.override_transformer_config.recompute_granularity is null. verl default: true (FSDP tree); "
      "Kestrel takes the Megatron tree's opt-in.");
  b.k("enable_activation_offload", B, "false", NOP, std::string("Offload the critic's activations to host memory.") + kOffloadOnCpu);
  b.k("use_remove_padding", B, "true", NOP,
      "Packed critic inputs without padding; Kestrel always packs (false gives the same values). verl default: false.");
  b.k("lora_rank", I, "0", NO, "LoRA rank of the critic (legacy FSDP form); LoRA is not built.");
  b.k("lora_alpha", I, "16", NO, "LoRA alpha of the critic (legacy FSDP form).");
  b.k("target_modules", S, "all-linear", NO, "LoRA target modules of the critic (legacy FSDP form).");
  b.k("tiled_mlp.enabled", B, "false", NO, "Tile the critic's MLP over the sequence to save activation memory.");
  b.k("tiled_mlp.num_shards", I, "4", NO, "Tiles of the tiled MLP.");
  declare_fsdp_engine(b, C + ".model.fsdp_config", C, false);
  declare_fsdp_optim(b, C);

  // The reward model's FSDP block (reward_model/dp_reward_model.yaml); the reward model is not built.
  b.scope("reward_model.model");
  b.k("use_shm", B, "false", NO, "Copy the reward model's weights through /dev/shm before loading.");
  b.k("use_remove_padding", B, "false", NO, "Packed reward-model inputs (the reward model is not built).");
  b.k("use_fused_kernels", B, "${oc.select:actor_rollout_ref.model.use_fused_kernels,false}", NO,
      "Fused kernels in the reward model (the reward model is not built).");
  b.k("override_config", Type::Map, "{}", NO, "Fields overriding the reward model's HF config.json.");
  b.scope("reward_model.model.fsdp_config");
  b.k("wrap_policy.min_num_params", I, "0", NO, "FSDP wrapping threshold of the reward model (the reward model is not built).");
  b.k("param_offload", B, "false", NO, "Offload the reward model's parameters (not built).");
  b.k("reshard_after_forward", B, "true", NO, "FSDP resharding of the reward model (the reward model is not built).");
  b.k("fsdp_size", I, "-1", NO, "FSDP shard group of the reward model (the reward model is not built).");
  b.k("forward_prefetch", B, "false", NO, "FSDP prefetch of the reward model (the reward model is not built).");
}

}  // namespace kestrel::config::schema_detail
