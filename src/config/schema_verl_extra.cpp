// The rest of verl's two generated trees (_generated_ppo_trainer.yaml and
// _generated_ppo_megatron_trainer.yaml) beyond the per-section files:
// profilers (profiler/profiler.yaml, global_profiler), Ray (ray_kwargs),
// transfer_queue, reward_manager.yaml, the reward model's engine blocks
// (reward_model.rollout.*, reward_model.megatron.*), LoRA and MTP details,
// and the amendments of earlier declarations for values verl scripts pass
// that Kestrel honours (amend_for_verl).
#include <tuple>

#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, IL = Type::IntList,
               SL = Type::StringList, M = Type::Map;

constexpr const char* kProf =
    "verl's profiler (nsys / npu / torch / torch_memory); Kestrel has none built in: profile the process from "
    "outside (perf, nsys, valgrind).";
constexpr const char* kGP = "global_profiler";
constexpr const char* kNoRm = " (the reward model is not built: reward_model.enable=true is not supported yet).";

std::string sel(const std::string& path, const std::string& fallback) {
  return "${oc.select:" + path + "," + fallback + "}";
}

// profiler/profiler.yaml at `owner`.profiler. A component that follows the
// actor's settings (rollout, reward model) takes them as its defaults.
void declare_profiler(Builder& b, const std::string& owner, bool follow_actor, bool follow_switches) {
  const std::string act = "actor_rollout_ref.actor.profiler.";
  auto d = [&](bool follow, const std::string& rel, const std::string& def) {
    return follow ? sel(act + rel, def) : def;
  };
  b.scope(owner + ".profiler");
  const std::string why = std::string("Profiler setting: ") + kProf;
  b.k("tool", S, sel(std::string(kGP) + ".tool", "null"), NOP, why, {"nsys", "npu", "torch", "torch_memory"});
  b.k("enable", B, d(follow_switches, "enable", "false"), NOP, why);
  b.k("all_ranks", B, d(follow_switches, "all_ranks", "false"), NOP, why);
  b.k("ranks", IL, d(follow_switches, "ranks", "[]"), NOP, why);
  b.k("save_path", S, sel(std::string(kGP) + ".save_path", "null"), NOP, why);
  b.k("tool_config.nsys.discrete", B,
      d(follow_actor, "tool_config.nsys.discrete", "${oc.select:global_profiler.global_tool_config.nsys.discrete,false}"),
      NOP, why);
  b.k("tool_config.npu.contents", SL, d(follow_actor, "tool_config.npu.contents", "[]"), NOP, why);
  b.k("tool_config.npu.level", S, d(follow_actor, "tool_config.npu.level", "level0"), NOP, why);
  b.k("tool_config.npu.analysis", B, d(follow_actor, "tool_config.npu.analysis", "true"), NOP, why);
  b.k("tool_config.npu.discrete", B, d(follow_actor, "tool_config.npu.discrete", "false"), NOP, why);
  b.k("tool_config.torch.contents", SL, d(follow_actor, "tool_config.torch.contents", "[]"), NOP, why);
  b.k("tool_config.torch.discrete", B, d(follow_actor, "tool_config.torch.discrete", "false"), NOP, why);
  b.k("tool_config.torch_memory.trace_alloc_max_entries", I,
      d(follow_actor, "tool_config.torch_memory.trace_alloc_max_entries",
        "${oc.select:global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries,100000}"),
      NOP, why);
  b.k("tool_config.torch_memory.stack_depth", I,
      d(follow_actor, "tool_config.torch_memory.stack_depth",
        "${oc.select:global_profiler.global_tool_config.torch_memory.stack_depth,32}"),
      NOP, why);
}

void declare_global_profiler(Builder& b) {
  const std::string why = std::string("Global profiler setting: ") + kProf;
  b.scope(kGP);
  b.k("tool", S, "null", NOP, why, {"nsys", "npu", "torch", "torch_memory"});
  b.k("steps", IL, "null", NOP, why);
  b.k("profile_continuous_steps", B, "false", NOP, why);
  b.k("save_path", S, "outputs/profile", NOP, why);
  b.scope(std::string(kGP) + ".global_tool_config.nsys");
  b.k("discrete", B, "false", NOP, why);
  for (const char* side : {"controller_nsight_options", "worker_nsight_options"}) {
    const std::string p = side;
    b.k(p + ".trace", S, "cuda,nvtx,cublas,ucx", NOP, "nsys option: " + std::string(kProf));
    b.k(p + ".cuda-memory-usage", S, "\"true\"", NOP, "nsys option: " + std::string(kProf));
    b.k(p + ".cuda-graph-trace", S, "graph", NOP, "nsys option: " + std::string(kProf));
  }
  b.k("worker_nsight_options.capture-range", S, "cudaProfilerApi", NOP, "nsys option: " + std::string(kProf));
  b.k("worker_nsight_options.capture-range-end", S, "null", NOP, "nsys option: " + std::string(kProf));
  b.k("worker_nsight_options.kill", S, "none", NOP, "nsys option: " + std::string(kProf));
  b.scope(std::string(kGP) + ".global_tool_config.torch_memory");
  b.k("trace_alloc_max_entries", I, "100000", NOP, why);
  b.k("stack_depth", I, "32", NOP, why);
  b.k("context", S, "all", NOP, why);
  b.k("stacks", S, "all", NOP, why);
  b.k("kw_args", M, "{}", NOP, why);
}

// Megatron LoRA (model.lora.*) beyond the keys schema_data_model.cpp declares.
void declare_lora_details(Builder& b, const std::string& at) {
  b.scope(at);
  const std::string why = "LoRA setting; LoRA is not built.";
  b.k("a2a_experimental", B, "false", NO, why);
  b.k("adapter_path", S, "null", NO, "LoRA adapter to start from; LoRA is not built.");
  b.k("dropout_position", S, "pre", NO, why, {"pre", "post"});
  b.k("dtype", S, "null", NO, why);
  b.k("exclude_modules", SL, "[]", NO, why);
  b.k("freeze_language_model", B, "true", NO, why);
  b.k("freeze_vision_model", B, "true", NO, why);
  b.k("freeze_vision_projection", B, "true", NO, why);
  b.k("lora_A_init_method", S, "xavier", NO, why);
  b.k("lora_B_init_method", S, "zero", NO, why);
}

void declare_reward_model_engines(Builder& b) {
  b.scope("reward_model");
  b.k("micro_batch_size", I, "null", NO, std::string("Deprecated global micro-batch of the reward model") + kNoRm);
  b.k("forward_max_token_len_per_gpu", I, sel("critic.forward_max_token_len_per_gpu", "32768"), NO,
      std::string("Token budget per reward-model forward") + kNoRm);
  b.k("use_dynamic_bsz", B, sel("critic.use_dynamic_bsz", "false"), NO, std::string("Token-budget micro-batches") + kNoRm);
  b.k("ulysses_sequence_parallel_size", I, "1", NO, std::string("Ulysses size of the reward model") + kNoRm);
  b.k("load_weight", B, "true", NO, std::string("Load the reward model's weights") + kNoRm);
  b.k("nccl_timeout", I, "600", NOP, "NCCL timeout of the reward model's group; Kestrel's collectives run over MPI.");
  b.k("reward_loop_source", S, "register", NO, std::string("Where verl's reward loop class comes from") + kNoRm,
      {"register", "importlib"});
  b.k("reward_loop_module_path", S, "null", NO, std::string("Python module of a custom reward loop") + kNoRm);
  b.k("reward_loop_class_name", S, "null", NO, std::string("Class of a custom reward loop") + kNoRm);
  declare_profiler(b, "reward_model", true, false);

  // reward_model/dp_reward_loop.yaml: the generative reward model's rollout server.
  b.scope("reward_model.rollout");
  const std::string r = std::string("Rollout server of a generative reward model") + kNoRm;
  b.k("name", S, "null", NO, r + " verl default: ??? (required).", {"vllm", "sglang", "trtllm", "hf"});
  b.k("dtype", S, "bfloat16", NO, r, {"bfloat16", "float16", "float32"});
  b.k("gpu_memory_utilization", F, "0.5", NO, r);
  b.k("enforce_eager", B, "true", NO, r);
  b.k("cudagraph_capture_sizes", IL, "null", NO, r);
  b.k("free_cache_engine", B, "true", NO, r);
  b.k("data_parallel_size", I, "1", NO, r);
  b.k("expert_parallel_size", I, "1", NO, r);
  b.k("tensor_model_parallel_size", I, "2", NO, r);
  b.k("max_num_batched_tokens", I, "8192", NO, r);
  b.k("max_model_len", I, "null", NO, r);
  b.k("max_num_seqs", I, "1024", NO, r);
  b.k("load_format", S, "auto", NO, r);
  b.k("engine_kwargs", M, "{}", NO, r);
  b.k("limit_images", I, "null", NO, r);
  b.k("enable_chunked_prefill", B, "true", NO, r);
  b.k("enable_prefix_caching", B, "true", NO, r);
  b.k("disable_log_stats", B, "true", NO, r);
  b.k("skip_tokenizer_init", B, "false", NO, r);
  b.k("prompt_length", I, "2048", NO, r);
  b.k("response_length", I, "2048", NO, r);

  // reward_model/megatron_reward_model.yaml.
  b.scope("reward_model.megatron");
  const std::string m = std::string("Megatron setting of the reward model") + kNoRm;
  const std::string A = "actor_rollout_ref.actor.megatron.";
  b.k("param_offload", B, "false", NO, m);
  b.k("tensor_model_parallel_size", I, "1", NO, m);
  b.k("expert_model_parallel_size", I, "1", NO, m);
  b.k("expert_tensor_parallel_size", I, "null", NO, m);
  b.k("pipeline_model_parallel_size", I, "1", NO, m);
  b.k("virtual_pipeline_model_parallel_size", I, "null", NO, m);
  b.k("context_parallel_size", I, "1", NO, m);
  b.k("sequence_parallel", B, "true", NO, m);
  b.k("use_distributed_optimizer", B, "false", NO, m);
  b.k("use_dist_checkpointing", B, "false", NO, m);
  b.k("dist_checkpointing_path", S, "null", NO, m);
  b.k("dist_checkpointing_prefix", S, "\"\"", NO, m);
  b.k("seed", I, sel(A + "seed", "42"), NO, m);
  b.k("override_transformer_config", M, "{}", NO, m + " verl default: the actor's.");
  b.k("use_mbridge", B, sel(A + "use_mbridge", "false"), NO, m);
  b.k("vanilla_mbridge", B, sel(A + "vanilla_mbridge", "true"), NO, m);
  b.k("use_remove_padding", B, sel(A + "use_remove_padding", "true"), NO, m);
  b.k("dtype", S, "bfloat16", NO, m, {"bfloat16", "float16", "float32"});
}

void declare_model_details(Builder& b) {
  const std::string M_ = "actor_rollout_ref.model";
  b.scope(M_);
  b.k("exclude_modules", S, "null", NO, "Modules LoRA leaves out (FSDP form); LoRA is not built.");
  b.k("lora_adapter_path", S, "null", NO, "LoRA adapter to start from (FSDP form); LoRA is not built.");
  // model.override_config takes +key=value additions (verl scripts add dropout
  // rates); Kestrel's models have no dropout, so 0 is what they do.
  for (const char* p : {"attention_dropout", "embd_pdrop", "resid_pdrop"})
    b.k(std::string("override_config.") + p, F, "0.0", NO,
        "HF config dropout rate (added with +); Kestrel's models have no dropout, so only 0 works.")
        .addable = true;
  declare_lora_details(b, M_ + ".lora");
  b.scope(M_ + ".mtp");
  const std::string mtp = "Multi-token prediction; MTP is not built.";
  b.k("enable_train", B, "false", NO, mtp);
  b.k("enable_rollout", B, "false", NO, mtp);
  b.k("detach_encoder", B, "false", NO, mtp);
  b.k("mtp_loss_scaling_factor", F, "0.1", NO, mtp);
  b.k("speculative_algorithm", S, "EAGLE", NO, mtp);
  b.k("speculative_num_steps", I, "2", NO, mtp);
  b.k("speculative_eagle_topk", I, "2", NO, mtp);
  b.k("speculative_num_draft_tokens", I, "4", NO, mtp);
  b.k("method", S, "mtp", NO, mtp);
  b.k("num_speculative_tokens", I, "1", NO, mtp);

  // The rollout's copy of model.mtp (verl: ${oc.select:actor_rollout_ref.model.mtp, null}).
  b.scope("actor_rollout_ref.rollout.mtp");
  for (const auto& [k, t, def] : std::vector<std::tuple<std::string, Type, std::string>>{
           {"enable", B, "false"}, {"enable_train", B, "false"}, {"enable_rollout", B, "false"},
           {"detach_encoder", B, "false"}, {"mtp_loss_scaling_factor", F, "0.1"}, {"speculative_algorithm", S, "EAGLE"},
           {"speculative_num_steps", I, "2"}, {"speculative_eagle_topk", I, "2"}, {"speculative_num_draft_tokens", I, "4"},
           {"method", S, "mtp"}, {"num_speculative_tokens", I, "1"}})
    b.k(k, t, sel(M_ + ".mtp." + k, def), NO, "The rollout's MTP setting (follows model.mtp); MTP is not built.");

  b.scope("critic.model");
  b.k("lora.type", S, "lora", NO, "LoRA type of the critic; LoRA is not built.", {"lora", "canonical_lora", "dora"});
  b.k("lora.rank", I, "0", NO, "LoRA rank of the critic; 0 disables LoRA.");
  b.k("lora.alpha", I, "32", NO, "LoRA alpha of the critic.");
  b.k("lora.dropout", F, "0.0", NO, "LoRA dropout of the critic.");
  b.k("lora.target_modules", SL, "[linear_qkv, linear_proj, linear_fc1, linear_fc2]", NO, "LoRA target modules of the critic.");
  declare_lora_details(b, "critic.model.lora");
}

}  // namespace

void declare_verl_extra(Builder& b) {
  const std::string A = "actor_rollout_ref.actor", R = "actor_rollout_ref.ref", RO = "actor_rollout_ref.rollout";
  b.scope(A);
  b.k("load_weight", B, "true", NO, "Load the HF weights (false: random initialisation).");
  b.k("use_fused_kernels", B, sel("actor_rollout_ref.model.use_fused_kernels", "false"), NOP,
      "The actor's copy of model.use_fused_kernels (same values either way; Kestrel runs its own kernels).");
  declare_profiler(b, A, false, false);
  b.scope(R);
  b.k("load_weight", B, "true", NO, "Load the HF weights of the reference model.");
  b.k("rollout_n", I, sel(RO + ".n", "1"), NOP,
      "Responses per prompt, a copy of rollout.n that verl fills in; Kestrel reads actor_rollout_ref.rollout.n.");
  b.k("router_replay.mode", S, "disabled", YES,
      "MoE routing replay of the reference model: R3 replays the rollout's routing (needs "
      "actor_rollout_ref.rollout.enable_rollout_routing_replay=true; with the actor's R2, the actor's old-log-prob "
      "record, as verl's batch carries it), so the KL compares policies over the same experts; disabled routes "
      "freely. R2 (the reference recording for itself) is not built.",
      {"disabled", "R2", "R3"}, {"disabled", "R3"});
  b.k("router_replay.record_file", S, "null", NO,
      "A file to save the recorded routing to; Kestrel keeps the routing with the batch in memory.");
  b.k("router_replay.replay_file", S, "null", NO,
      "A file of routing decisions to replay; Kestrel replays the batch's own record (router_replay.mode).");
  declare_profiler(b, R, false, false);
  b.scope(RO);
  b.k("layered_summon", B, "false", NOP,
      "FSDP: gather the weights layer by layer for the rollout; Kestrel's rollout reads the trainer's weights in place.");
  b.k("quantization_config_file", S, "null", NO, "Quantization settings of the rollout weights.");
  b.k("prometheus.file", S, "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml", NO, "Prometheus config file.");
  b.k("prometheus.served_model_name", S, sel("actor_rollout_ref.model.path", "null"), NOP,
      "Model name in the Prometheus metrics; Kestrel exports none (rollout.prometheus.enable).");
  b.k("trace.token2text", B, "false", NO, "Decode token ids in rollout traces.");
  b.k("trace.max_samples_per_step_per_worker", I, "null", NO, "Rollout traces kept per step and worker.");
  declare_profiler(b, RO, true, true);

  b.scope("critic");
  b.k("load_weight", B, "true", NO, "Load the critic's HF weights.");
  b.k("nccl_timeout", I, "600", NOP, "NCCL timeout of the critic's group; Kestrel's collectives run over MPI.");
  declare_profiler(b, "critic", false, false);

  declare_model_details(b);
  declare_reward_model_engines(b);
  declare_global_profiler(b);

  b.scope("data");
  b.k("trust_remote_code", B, "false", NO, "Run Python code of the tokenizer/processor repository.");

  // verl's keys before its rollout-correction refactor (volcengine/verl#4511, #4544), still in recipes; the
  // current verl has neither: its k1 options take "lower_upper" in rollout_rs_threshold, and seq_max_k2/k3
  // reject a response for its worst token.
  b.scope("algorithm.rollout_correction");
  b.k("rollout_rs_threshold_lower", F, "null", NO,
      "Removed from verl: give the lower bound in rollout_rs_threshold as lower_upper with a *_k1 rollout_rs option.");
  b.k("rollout_token_veto_threshold", F, "null", NO,
      "Removed from verl: reject responses by their worst token with rollout_rs=seq_max_k2 or seq_max_k3.");

  b.scope("reward_manager");
  const std::string rm = "verl's newer spelling of reward_model.reward_manager (reward_manager.yaml); ";
  b.k("source", S, "register", NO, rm + "register: a built-in manager by name; importlib: module.path.",
      {"register", "importlib"});
  b.k("name", S, sel("reward_model.reward_manager", "naive"), NO,
      rm + "must equal reward_model.reward_manager (its default), which Kestrel reads.");
  b.k("module.path", S, "null", NO, rm + "Python file of a custom reward manager.");
  b.k("module.name", S, "custom_reward_manager", NO, rm + "class in module.path.");

  b.scope("transfer_queue");
  b.k("enable", B, "false", NOP, "verl's TransferQueue data plane between Ray workers; Kestrel's workers share batches in-process.");
  b.scope("ray_kwargs");
  b.k("ray_init", M, "{num_cpus: null}", NOP, "ray.init() arguments; Kestrel has no Ray (mpirun/srun start its processes).");
  b.k("timeline_json_file", S, "null", NOP, "Ray timeline dump; Kestrel has no Ray.");
}

void amend_for_verl(Builder& b) {
  // Kestrel always packs sequences without padding; verl's default (false in
  // the Megatron tree, true in the FSDP tree) is either way the same result.
  KeyDecl& rp = b.existing("actor_rollout_ref.model.use_remove_padding");
  rp.default_yaml = "true";
  rp.status = NOP;
  rp.doc = "Packed (remove-padding) inputs; Kestrel always packs, false gives the same values. verl default: false "
           "(Megatron tree), true (FSDP tree).";
  for (const char* k : {"actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.model.fused_kernel_options.impl_backend"}) {
    KeyDecl& fk = b.existing(k);
    fk.status = NOP;
    fk.doc += " verl's fused log-prob/entropy path has the same values as its plain one; Kestrel computes both in "
              "one pass over the logits (ops/vocab_loss.h).";
  }
  KeyDecl& gc = b.existing("actor_rollout_ref.model.enable_gradient_checkpointing");
  gc.status = YES;
  gc.default_yaml = "false";
  gc.doc = "Activation recompute (verl's FSDP switch): true is full recompute of every layer (recompute_granularity="
           "full, recompute_method=uniform, recompute_num_layers=1) when actor.megatron.override_transformer_config."
           "recompute_granularity is null; bit-identical, costs step time. verl default: true (FSDP tree), false "
           "(Megatron tree, whose defaults Kestrel takes).";
  KeyDecl& raw = b.existing("data.return_raw_chat");
  raw.status = NOP;
  raw.doc = "Keep the raw chat messages next to the tokenized prompt; Kestrel always keeps them.";
  KeyDecl& rs = b.existing("reward_model.strategy");
  rs.allowed.push_back("fsdp2");
  KeyDecl& lg = b.existing("trainer.logger");
  for (const char* l : {"wandb", "swanlab", "mlflow", "trackio", "clearml", "vemlp_wandb"})
    lg.noted.emplace_back(l, std::string("this build has no ") + l +
                                 " client; metrics go to the console (when listed), metrics.jsonl and TensorBoard "
                                 "events under trainer.default_local_dir");
  lg.doc = "Metric sinks: console prints them; metrics.jsonl and TensorBoard events are always written under "
           "trainer.default_local_dir; wandb, swanlab, mlflow ... are accepted with a notice. verl default: "
           "[console, wandb].";
  KeyDecl& dev = b.existing("trainer.device");
  dev.status = YES;
  dev.doc = "Device type. cuda: the actor, reference, critic and rollout engine on the GPU (a build with the CUDA "
            "backend, cmake --preset cuda, and a device; under mpirun each rank takes device local rank % devices and the "
            "process groups move device tensors over NCCL, loaded from libnccl.so.2 at run time); left at verl's "
            "default on a machine without either, the CPU. cpu: the CPU backend. An explicit cuda that cannot run is an error "
            "naming the reason.";
  for (const char* k : {"trainer.n_gpus_per_node", "trainer.nnodes"}) {
    KeyDecl& d = b.existing(k);
    d.status = YES;
    d.at_least(1);
    d.doc = std::string(k == std::string("trainer.nnodes") ? "Nodes" : "Processes per node") +
            ": when n_gpus_per_node or nnodes is set, n_gpus_per_node x nnodes must equal the processes mpirun/srun "
            "starts (kestrel train checks it).";
  }
}

}  // namespace kestrel::config::schema_detail
