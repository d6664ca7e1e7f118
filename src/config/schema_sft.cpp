// `kestrel sft`: verl's SFT trainer tree (trainer/config/sft_trainer.yaml),
// which differs from the PPO tree (data.max_length, model.partial_pretrain,
// optim.lr_scheduler, ...). Kestrel additions say "(Kestrel)"; defaults are
// Kestrel's (the built-in arith task and tiny model, so a run needs nothing
// downloaded) where verl's name a dataset or model on disk.
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, FL = Type::FloatList,
               SL = Type::StringList;
}  // namespace

void declare_sft(Builder& b) {
  b.scope("data");
  b.k("train_files", SL, "[builtin:arith]", YES, "SFT JSONL file(s); builtin:arith = the built-in task's train split.");
  b.k("val_files", SL, "[builtin:arith]", YES,
      "Validation JSONL file(s); builtin:arith = the task's test split; null = no validation.")
      .nullable = true;
  b.k("prompt_key", S, "prompt", YES, "Row field with the prompt (string or chat messages).");
  b.k("response_key", S, "response", YES, "Row field with the response text.");
  b.k("multiturn.messages_key", S, "messages", YES, "Row field with a whole conversation (loss on assistant turns).");
  b.k("max_length", I, "512", YES, "Maximum tokens per sample (prompt + response).").at_least(1);
  b.k("truncation", S, "error", YES, "What to do with a longer sample.", {"error", "left", "right", "middle"});
  b.k("train_batch_size", I, "64", YES, "Samples per optimizer step.").at_least(1);
  b.k("micro_batch_size_per_gpu", I, "8", YES, "Samples per micro-batch when use_dynamic_bsz is false.").at_least(1);
  b.k("use_dynamic_bsz", B, "true", YES, "Micro-batches by token budget (max_token_len_per_gpu) instead of count.");
  b.k("max_token_len_per_gpu", I, "4096", YES, "Token budget of one micro-batch (dynamic batch size).").at_least(1);
  b.k("shuffle", B, "true", YES, "Shuffle the training set every epoch.");
  b.k("seed", I, "null", YES, "Shuffle seed; null = trainer.seed.").any_value("a seed: any integer");
  b.k("skip_malformed", B, "false", YES, "Skip (and count) malformed rows instead of failing (Kestrel).");
  b.k("train_max_samples", I, "-1", YES, "Use at most this many training rows; -1 = all.").at_least(-1);
  b.k("val_max_samples", I, "-1", YES, "Use at most this many validation rows; -1 = all.").at_least(-1);
  b.k("max_response_length", I, "128", YES, "Generation length of the evaluation by generation (Kestrel).").at_least(1);
  b.k("arith.num_train", I, "20000", YES, "builtin:arith training problems (Kestrel).").in(1, 1e7);
  b.k("arith.num_test", I, "500", YES, "builtin:arith test problems (Kestrel).").in(0, 1e7);
  b.k("arith.seed", I, "1234", YES, "builtin:arith generator seed (Kestrel).").any_value("a seed: any integer");
  b.k("arith.min_steps", I, "1", YES, "builtin:arith fewest events per problem (Kestrel).").in(1, 1000);
  b.k("arith.max_steps", I, "2", YES, "builtin:arith most events per problem (Kestrel).").in(1, 1000);
  b.k("arith.max_operand", I, "20", YES, "builtin:arith largest +/- operand (Kestrel).").in(1, 1e9);

  b.scope("model");
  b.k("partial_pretrain", S, "builtin:tiny", YES, "HF model folder, or builtin:tiny | builtin:small | builtin:tiny-qwen3-moe | builtin:tiny-deepseek-v3 (random init).");
  b.k("tokenizer_path", S, "null", YES, "Tokenizer folder; null = the model folder.");
  b.k("dtype", S, "f32", YES, "Compute dtype; bf16 keeps f32 master weights (Kestrel).", {"f32", "bf16"});
  b.k("enable_gradient_checkpointing", B, "false", YES,
      "Activation recompute: full recompute of every layer (Megatron's full/uniform/1), bit-identical, costs "
      "time. verl's FSDP SFT default is true; Kestrel's is false (opt-in).");
  b.k("override_config.moe_config.freeze_moe_router", B, "false", YES,
      "Freeze the MoE routers (mlp.gate.weight of every MoE layer): no gradient and no weight decay (verl's "
      "model.override_config.moe_config.freeze_moe_router). A dense model has no router.");
  // Megatron's MoE router keys, as the PPO tree's actor takes them (Kestrel: verl's FSDP SFT has none).
  declare_moe_overrides(b, "model.override_transformer_config", true, "");

  b.scope("optim");
  b.k("lr", F, "1e-5", YES, "Peak learning rate.").at_least(0);
  b.k("betas", FL, "[0.9, 0.95]", YES, "AdamW betas.").in(0, 1, true, false);
  b.k("eps", F, "1e-8", YES, "AdamW epsilon.").above(0);
  b.k("weight_decay", F, "0.01", YES, "AdamW decoupled weight decay.").at_least(0);
  b.k("warmup_steps_ratio", F, "0.1", YES, "Warmup steps as a fraction of the total steps.").in(0, 1);
  b.k("clip_grad", F, "1.0", YES, "Global gradient-norm clip; 0 disables.").at_least(0);
  b.k("lr_scheduler", S, "cosine", YES, "Learning-rate schedule after warmup.", {"cosine", "constant", "linear"});
  b.k("min_lr_ratio", F, "0.0", YES, "Floor of the decayed learning rate, as a fraction of optim.lr.").in(0, 1);

  b.scope("trainer");
  b.k("default_local_dir", S, "checkpoints/sft", YES, "Checkpoint root: global_step_N folders and the latest pointer.");
  b.k("project_name", S, "kestrel-sft", NOP,
      "Names the run in verl's experiment trackers (wandb, ...); Kestrel's loggers (console, file, tensorboard) "
      "write under default_local_dir and have no run name.");
  b.k("experiment_name", S, "arith", NOP, "Names the run in verl's experiment trackers; see trainer.project_name.");
  b.k("total_epochs", I, "1", YES, "Passes over the training set.").at_least(1);
  b.k("total_training_steps", I, "null", YES, "Stop after this many steps; null = steps per epoch * total_epochs.").at_least(1);
  b.k("logger", SL, "[console]", YES, "Metric sinks: console, tensorboard; metrics.jsonl is always written in the run folder (file is accepted, the same).",
      {"console", "file", "tensorboard"});
  b.k("console_metrics", S, "compact", YES,
      "What the console logger prints per step: compact (loss, validation loss, gradient norm, seconds) or full "
      "(every metric); metrics.jsonl always gets every metric (Kestrel).",
      {"compact", "full"});
  b.k("max_consecutive_skipped_steps", I, "10", YES,
      "NaN/Inf guard: an update whose loss or gradient norm is not finite is skipped and counted "
      "(train/step_skipped); after this many skips in a row the run stops; 0 never stops (Kestrel).").at_least(0);
  b.k("seed", I, "1", YES, "Seed of the built-in model's init and the default shuffle seed.").any_value("a seed: any integer");
  b.k("save_freq", I, "-1", YES, "Checkpoint every N steps and at the end; -1 = never.").at_least(-1);
  b.k("test_freq", I, "-1", YES, "Validate every N steps and at the end; -1 = never.").at_least(-1);
  b.k("val_before_train", B, "false", YES, "Validate before the first step.");
  b.k("max_ckpt_to_keep", I, "null", YES, "Keep the newest N checkpoints; null = all.").at_least(0);
  b.k("resume_mode", S, "auto", YES, "auto: latest checkpoint in default_local_dir; disable: fresh; resume_path.",
      {"auto", "disable", "resume_path"});
  b.k("resume_from_path", S, "null", YES, "global_step_N folder for resume_mode=resume_path.");
  b.k("export_dir", S, "null", YES, "Write the final model as an HF folder here (Kestrel).");
  b.k("val_generations", I, "0", YES, "Validation prompts greedy-decoded for val/acc; 0 = off (Kestrel).").at_least(0);
  b.k("threads", I, "0", YES, "CPU threads; 0 = all cores (Kestrel).").in(0, 4096);
  // Model parallelism under mpirun. verl's FSDP SFT trainer has no such keys
  // (it shards with FSDP and splits sequences with ulysses_sequence_parallel_size);
  // these are Kestrel's, with the Megatron names. dp = world size / (tp * pp).
  b.k("tensor_model_parallel_size", I, "1", YES,
      "Tensor-parallel ranks under mpirun; dp = world / (tp * pp) (Kestrel: verl's FSDP SFT has no such key).")
      .in(1, 4096);
  b.k("pipeline_model_parallel_size", I, "1", YES,
      "Pipeline stages under mpirun (1F1B schedule; each rank holds its stage's layers) (Kestrel: verl's FSDP "
      "SFT has no such key).")
      .in(1, 4096);
  b.k("context_parallel_size", I, "1", YES,
      "Context-parallel ranks under mpirun: each sequence split over them (zigzag chunks), attention by "
      "context_parallel_algo; dp = world / (tp * pp * cp) (Kestrel: verl's FSDP SFT has "
      "ulysses_sequence_parallel_size).")
      .in(1, 65536);
  b.k("context_parallel_algo", S, "megatron_cp_algo", YES,
      "Attention under context parallelism (MindSpeed's names): megatron_cp_algo (ring), ulysses_cp_algo "
      "(all-to-all to head shards), hybrid_cp_algo (Ulysses groups of ulysses_degree_in_cp ranks, ring across) "
      "(Kestrel).",
      {"megatron_cp_algo", "ulysses_cp_algo", "hybrid_cp_algo"});
  b.k("ulysses_degree_in_cp", I, "null", YES,
      "The Ulysses group size of hybrid_cp_algo; divides context_parallel_size, strictly between 1 and it "
      "(Kestrel).")
      .at_least(1);
  b.k("virtual_pipeline_model_parallel_size", I, "null", YES,
      "Interleaved 1F1B: model chunks per pipeline rank; null = 1 (not interleaved); needs "
      "pipeline_model_parallel_size > 1 (Kestrel).")
      .in(1, 4096);
  b.scope("");
  b.k("ulysses_sequence_parallel_size", I, "1", YES,
      "verl's Ulysses sequence parallelism: context parallelism of this size with ulysses_cp_algo (as "
      "trainer.context_parallel_size with trainer.context_parallel_algo=ulysses_cp_algo; set one of them).")
      .at_least(1);
}

}  // namespace kestrel::config::schema_detail
