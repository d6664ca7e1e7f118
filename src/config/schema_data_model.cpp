// data.* (verl data/legacy_data.yaml) and actor_rollout_ref.model.* (hf_model.yaml).
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, SL = Type::StringList, M = Type::Map;
}  // namespace

void declare_data_and_model(Builder& b) {
  b.scope("data");
  b.k("tokenizer", S, "null", YES, "Tokenizer path; null uses actor_rollout_ref.model.tokenizer_path or the model path.");
  b.k("use_shm", B, "false", NO, "Copy the dataset through /dev/shm before loading.");
  b.k("train_files", SL, "[~/data/rlhf/gsm8k/train.parquet]", YES,
      "Training data file(s): one path or a list; rows hold data.prompt_key and reward_model.ground_truth.");
  b.k("val_files", SL, "[~/data/rlhf/gsm8k/test.parquet]", YES, "Validation data file(s): one path or a list.");
  b.k("train_max_samples", I, "-1", YES, "Use at most this many training rows; -1 uses all.").at_least(-1);
  b.k("val_max_samples", I, "-1", YES, "Use at most this many validation rows; -1 uses all.").at_least(-1);
  b.k("prompt_key", S, "prompt", YES, "Row field holding the chat messages of the prompt.");
  b.k("reward_fn_key", S, "data_source", NO,
      "Row field that selects the rule-based reward function; Kestrel's loader reads data_source.");
  b.k("max_prompt_length", I, "512", YES, "Maximum prompt length in tokens (after the chat template).").at_least(1);
  b.k("max_response_length", I, "512", YES, "Maximum generated response length in tokens.").at_least(1);
  b.k("train_batch_size", I, "1024", YES,
      "Prompts per training step; responses per step = train_batch_size * actor_rollout_ref.rollout.n.").at_least(1);
  b.k("gen_batch_size", I, "${data.train_batch_size}", YES,
      "Prompts per generation batch (DAPO recipe): each batch the data loader gives; with "
      "algorithm.filter_groups.enable batches are generated until data.train_batch_size groups are kept, else a step "
      "trains on the whole generation batch.").at_least(1);
  b.k("val_batch_size", I, "null", NOP,
      "Prompts per validation batch; deprecated in verl, where validation runs the whole set in one batch, as "
      "Kestrel's does.");
  b.k("return_raw_input_ids", B, "false", NO, "Also return prompt ids before the chat template (for a separate RM tokenizer).");
  b.k("return_raw_chat", B, "true", NO, "Keep the raw chat messages next to the tokenized prompt (Kestrel always does).");
  b.k("return_full_prompt", B, "false", NO, "Also return the full templated prompt text.");
  b.k("shuffle", B, "true", YES, "Shuffle the training set every epoch.");
  b.k("seed", I, "null", YES, "Shuffle seed; null uses a fixed default seed.").any_value("a seed: any integer");
  b.k("validation_shuffle", B, "false", NOP,
      "Shuffle the validation set; Kestrel validates the whole set at once and its metrics (means over the set) "
      "do not depend on the order.");
  b.k("dataloader_num_workers", I, "8", NOP, "Python dataloader workers; Kestrel loads the data in-process.");
  b.k("filter_overlong_prompts", B, "false", YES, "Drop prompts longer than max_prompt_length before training.");
  b.k("skip_malformed", B, "false", YES,
      "Skip (and count) dataset lines that fail to parse instead of stopping with file:line (Kestrel).");
  b.k("filter_overlong_prompts_workers", I, "1", NOP,
      "Python workers for filter_overlong_prompts; Kestrel filters in-process while loading.");
  b.k("truncation", S, "error", YES, "What to do with a prompt longer than max_prompt_length.",
      {"error", "left", "right", "middle"});
  b.k("image_key", S, "images", NO, "Row field with images (multimodal).");
  b.k("video_key", S, "videos", NO, "Row field with videos (multimodal).");
  b.k("image_patch_size", I, "14", NO, "Vision patch size (multimodal).");
  b.k("return_multi_modal_inputs", B, "true", NO, "Return processed multimodal inputs.");
  b.k("custom_cls.path", S, "null", NO, "Python file with a custom dataset class.");
  b.k("custom_cls.name", S, "null", NO, "Name of the custom dataset class.");
  b.k("sampler.class_path", S, "null", NO, "Python file with a curriculum sampler.");
  b.k("sampler.class_name", S, "null", NO, "Name of the curriculum sampler class.");
  b.k("datagen.path", S, "null", NO, "Python file with a dynamic data generator.");
  b.k("datagen.name", S, "null", NO, "Name of the data generator class.");
  b.k("apply_chat_template_kwargs", M, "{}", NO, "Extra keyword arguments for the chat template (e.g. enable_thinking).");
  b.k("tool_config_path", S, "${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path,null}", NO,
      "Tool definitions for tool-calling prompts.");

  b.scope("actor_rollout_ref");
  b.k("hybrid_engine", B, "true", YES,
      "Actor, rollout and reference share devices (colocated); false (verl's one-step-off-policy scripts) needs "
      "rollout.nnodes x rollout.n_gpus_per_node rollout processes, which disaggregated placement uses either way.");
  b.k("nccl_timeout", I, "600", YES,
      "Seconds any collective may wait (over MPI, or NCCL for device tensors): past it the job aborts naming the "
      "call and group (over MPI also the ranks that did not answer and the step); <= 0 waits forever. The start-up "
      "window (rank 0's GEMM measurement, built-in data and SFT warm start) waits without it.").any_value("seconds; <= 0 waits forever");

  b.scope("actor_rollout_ref.model");
  b.k("path", S, "~/models/deepseek-llm-7b-chat", YES, "HuggingFace model directory (config.json + safetensors).");
  b.k("hf_config_path", S, "null", NO, "Separate directory for config.json.");
  b.k("tokenizer_path", S, "null", YES, "Tokenizer directory; null uses model.path.");
  b.k("use_shm", B, "false", NO, "Copy model weights through /dev/shm before loading.");
  b.k("trust_remote_code", B, "false", NO, "Run Python modelling code from the model repository.");
  b.k("custom_chat_template", S, "null", NO, "Jinja chat template that replaces the tokenizer's.");
  b.k("external_lib", S, "null", NO, "Python module imported to register custom models.");
  b.k("override_config.model_config", M, "{}", NO, "Fields overriding the HF config.json.");
  b.k("override_config.moe_config.freeze_moe_router", B, "false", YES,
      "Freeze the actor's MoE routers (mlp.gate.weight of every MoE layer): no gradient and no weight decay, they "
      "stay as loaded (the expert-bias update, moe_router_enable_expert_bias, still moves the correction bias). A "
      "dense model has no router.");
  b.k("enable_gradient_checkpointing", B, "true", NO,
      "FSDP activation recompute; Megatron-style recompute uses megatron.override_transformer_config.recompute_*.");
  b.k("enable_activation_offload", B, "false", NOP, std::string("Offload activations to host memory.") + kOffloadOnCpu);
  b.k("use_remove_padding", B, "false", NO, "FSDP packed (remove-padding) inputs; the Megatron engine has its own flag.");
  b.k("use_fused_kernels", B, "false", NO, "Fused logprob/entropy kernels from the output projection.");
  b.k("fused_kernel_options.impl_backend", S, "torch", NO, "Backend of the fused kernels.", {"torch", "triton"});
  b.k("use_liger", B, "false", NO, "Use Liger kernels.");
  b.k("lora_rank", I, "0", NO, "LoRA rank (legacy FSDP form); 0 disables LoRA.");
  b.k("lora_alpha", I, "16", NO, "LoRA alpha (legacy FSDP form).");
  b.k("target_modules", S, "all-linear", NO, "LoRA target modules (legacy FSDP form).");
  b.k("lora.type", S, "lora", NO, "Megatron LoRA type.", {"lora", "canonical_lora", "dora"});
  b.k("lora.rank", I, "0", NO, "Megatron LoRA rank; 0 disables LoRA.");
  b.k("lora.alpha", I, "32", NO, "Megatron LoRA alpha.");
  b.k("lora.dropout", F, "0.0", NO, "Megatron LoRA dropout.");
  b.k("lora.target_modules", SL, "[linear_qkv, linear_proj, linear_fc1, linear_fc2]", NO, "Megatron LoRA target modules.");
  b.k("lora.merge", B, "false", NO, "Merge LoRA weights before syncing them to the rollout.");
  b.k("tiled_mlp.enabled", B, "false", NO, "Tile the MLP over the sequence to save activation memory.");
  b.k("tiled_mlp.num_shards", I, "4", NO, "Tiles of the tiled MLP.");
  b.k("mtp.enable", B, "false", NO, "Multi-token prediction heads.");
}

}  // namespace kestrel::config::schema_detail
