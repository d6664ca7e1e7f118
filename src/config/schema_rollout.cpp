// actor_rollout_ref.rollout.* (verl rollout/rollout.yaml, RolloutConfig). The
// built-in engine ("kestrel") plays vLLM's part: paged KV cache, continuous
// batching, prefix caching, chunked prefill.
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, IL = Type::IntList, M = Type::Map;
}  // namespace

void declare_rollout(Builder& b) {
  b.scope("actor_rollout_ref.rollout");
  b.k("name", S, "kestrel", YES,
      "Rollout engine: Kestrel's built-in engine (paged KV cache, continuous batching, prefix caching, chunked "
      "prefill), which also runs for vllm and sglang (with a notice). verl default: ??? (required).",
      {"kestrel", "vllm", "sglang", "hf", "trtllm"}, {"kestrel"})
      .noted = {{"vllm", "Kestrel runs its built-in engine in vLLM's place (same sampling settings)"},
                {"sglang", "Kestrel runs its built-in engine in SGLang's place (same sampling settings)"},
                {"trtllm", "Kestrel runs its built-in engine in TensorRT-LLM's place (same sampling settings)"},
                {"hf", "Kestrel runs its built-in engine in place of HF generate (same sampling settings)"}};
  b.k("mode", S, "sync", YES,
      "sync: batch generation in the training process; async (verl's server + agent loop) runs the same "
      "generation here, with a notice. verl default: async.",
      {"sync", "async"}, {"sync"})
      .noted = {{"async", "Kestrel generates in the training process (sync); single-turn results are the same"}};
  b.k("temperature", F, "1.0", YES, "Sampling temperature.").at_least(0);
  b.k("top_k", I, "-1", YES, "Top-k sampling; -1 (or 0) disables.").at_least(-1);
  b.k("top_p", F, "1.0", YES, "Nucleus sampling mass; 1 disables.").in(0, 1, false, true);
  b.k("min_p", F, "0.0", NO, "Min-p sampling: drop tokens with p < min_p * p_max; 0 disables (kestrel generate only so far).").in(0, 1);
  b.k("do_sample", B, "true", YES, "Sample; false decodes greedily.");
  b.k("ignore_eos", B, "false", NO, "Keep generating past EOS until response_length (kestrel generate only so far).");
  b.k("n", I, "1", YES, "Responses per prompt (group size; > 1 for GRPO/RLOO).").at_least(1);
  b.k("seed", I, "0", YES, "Seed of the sampler's random streams.").any_value("a seed: any integer");
  b.k("prompt_length", I, "${oc.select:data.max_prompt_length,512}", YES, "Maximum prompt tokens.").at_least(1);
  b.k("response_length", I, "${oc.select:data.max_response_length,512}", YES, "Maximum generated tokens.").at_least(1);
  b.k("dtype", S, "bfloat16", YES,
      "Compute dtype of the rollout engine; in kestrel train it must equal actor.megatron.dtype (the rollout reads "
      "the actor's weights in place).",
      {"bfloat16", "float16", "float32"}, {"bfloat16", "float32"});
  b.k("gpu_memory_utilization", F, "0.5", YES,
      "Fraction of device memory for rollout weights + KV cache: kv_cache = this x memory - weights (CPU: "
      "MemTotal / processes on the machine; KESTREL_DEVICE_MEMORY=bytes overrides).").in(0, 1, false, true);
  b.k("enforce_eager", B, "true", YES,
      "Run without CUDA graphs. false: on a CUDA rollout, uniform decode steps (one token per sequence, up to the "
      "largest capture size) replay a CUDA graph captured per batch size, padded to the nearest size (vLLM's "
      "cudagraph_mode FULL_DECODE_ONLY); prefill and mixed steps, larger batches, MoE and tensor-parallel models "
      "run eagerly; outputs as eager. No effect on the CPU (graphs are a device feature). Kestrel keeps eager as "
      "its default; verl default: false (CUDA graphs on).");
  b.k("cudagraph_capture_sizes", IL, "null", YES,
      "Batch sizes captured as CUDA graphs with enforce_eager=false; null = vLLM's list (1, 2, 4, then every 8 "
      "to 256, every 16 after) up to min(512, max_num_seqs, max_num_batched_tokens). Sizes above max_num_seqs "
      "are dropped (no decode batch is that large).").at_least(1);
  b.k("free_cache_engine", B, "true", NOP,
      "Release the KV cache after generation so training can use the memory; Kestrel always does (memory, not "
      "results).");
  b.k("load_format", S, "dummy", YES,
      "Initial rollout weights. Kestrel's rollout reads the trainer's weights (loaded from model.path) in place, so "
      "dummy, safetensors, auto and hf all start from them.",
      {"dummy", "hf", "megatron", "dtensor", "safetensors", "auto"}, {"dummy", "safetensors", "auto", "hf"});
  b.k("tensor_model_parallel_size", I, "2", YES, "Tensor-parallel size of the rollout engine.").at_least(1);
  b.k("data_parallel_size", I, "1", YES, "Data-parallel replicas of the rollout engine.").at_least(1);
  b.k("expert_parallel_size", I, "1", YES,
      "Expert-parallel size of the rollout engine: 1 = every expert on each rank (under training expert parallelism "
      "a copy, gathered after each update); the actor's megatron.expert_model_parallel_size = the actor's experts "
      "read in place, each step's tokens dispatched to their experts' ranks and back, the ranks of an ep group "
      "stepping in lockstep (a rank without work runs a one-token step on the null block). Other sizes: not "
      "supported yet.").at_least(1);
  b.k("pipeline_model_parallel_size", I, "1", NO,
      "Pipeline-parallel size of the rollout engine; only 1: pipelined decode is not supported yet (the rollout runs "
      "the full or TP-sharded model, whatever the actor's pipeline_model_parallel_size).");
  b.k("max_num_batched_tokens", I, "8192", YES, "Token budget of one scheduler step (prefill chunks + decodes).").at_least(1);
  b.k("max_model_len", I, "null", YES, "Maximum sequence length; null = prompt_length + response_length.").at_least(1);
  b.k("max_num_seqs", I, "256", YES, "Maximum sequences running at once.").at_least(1);
  b.k("enable_chunked_prefill", B, "true", YES, "Split long prefills across scheduler steps.");
  b.k("enable_prefix_caching", B, "true", YES, "Reuse KV blocks of shared prompt prefixes (GRPO groups share prompts).");
  b.k("scheduling_policy", S, "fcfs", YES, "Scheduler queue order.", {"fcfs", "priority"}, {"fcfs"});
  b.k("block_size", I, "16", YES, "Tokens per KV-cache block.").at_least(1);
  b.k("swap_space", I, "4", YES,
      "Host memory (GiB) for swapped-out KV blocks when preemption_mode is swap: caps the blocks swapped out at once.").at_least(0);
  b.k("preemption_mode", S, "recompute", YES,
      "What happens to a preempted sequence's KV cache: dropped and recomputed, or swapped to host memory (vLLM's modes).",
      {"recompute", "swap"});
  b.k("logprobs_mode", S, "processed_logprobs", YES, "Which log-probs the engine reports.",
      {"raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"}, {"processed_logprobs"});
  b.k("calculate_log_probs", B, "false", YES,
      "Put the rollout's log-probs of the sampled tokens in the batch (verl's rollout_log_probs): the "
      "rollout_corr/ metrics every step (decoupled mode recomputes the old log-probs for them) and "
      "algorithm.rollout_correction.*. The engine records them either way (training/rollout_probs_diff_* uses them).");
  b.k("disable_log_stats", B, "true", NOP,
      "Do not print vLLM's periodic engine statistics; Kestrel's engine prints none (rollout metrics are logged).");
  b.k("log_prob_micro_batch_size", I, "null", NO, "Deprecated global micro-batch; use log_prob_micro_batch_size_per_gpu.");
  b.k("log_prob_micro_batch_size_per_gpu", I, "null", YES, "Sequences per old-log-prob forward on one rank.").at_least(1);
  b.k("log_prob_use_dynamic_bsz", B, "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}", YES,
      "Token-budget micro-batches for old log-probs.");
  b.k("log_prob_max_token_len_per_gpu", I, "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}", YES,
      "Token budget per old-log-prob micro-batch.").at_least(1);
  b.k("over_sample_rate", F, "0.0", NO, "Abort the remaining requests once (1 - rate) of them finished.");
  b.k("multi_stage_wake_up", B, "false", NOP,
      "Wake weights and KV cache in stages (SGLang, to lower peak memory); Kestrel's rollout reads the trainer's "
      "weights in place and sizes its cache once.");
  b.k("skip_rollout", B, "false", NO, "Replay dumped rollouts instead of generating.");
  b.k("skip_dump_dir", S, "/tmp/rollout_dump", NO, "Directory of dumped rollouts for skip_rollout.");
  b.k("skip_tokenizer_init", B, "true", NOP, "vLLM tokenizer start-up; Kestrel's engine takes token ids.");
  b.k("enable_rollout_routing_replay", B, "false", YES,
      "MoE models: the rollout records the experts of every prompt and response token in every MoE layer and "
      "hands them to training with the responses, for router replay R3 (actor_rollout_ref.actor.router_replay.mode,"
      " ref.router_replay.mode); a dense model records nothing.");
  b.k("quantization", S, "null", NO, "Rollout weight quantization (e.g. fp8).", {"fp8"});
  b.k("engine_kwargs.vllm", M, "{}", NOP, "Extra vLLM engine arguments; Kestrel runs its own engine in vLLM's place, which takes none of them.");
  b.k("engine_kwargs.sglang", M, "{}", NOP, "Extra SGLang engine arguments; Kestrel runs its own engine in SGLang's place, which takes none of them.");
  b.k("engine_kwargs.trtllm", M, "{}", NOP, "Extra TensorRT-LLM engine arguments; Kestrel runs its own engine in TensorRT-LLM's place, which takes none of them.");

  b.k("val_kwargs.top_k", I, "-1", YES, "Validation top-k.").at_least(-1);
  b.k("val_kwargs.top_p", F, "1.0", YES, "Validation top-p.").in(0, 1, false, true);
  b.k("val_kwargs.temperature", F, "0", YES, "Validation temperature.").at_least(0);
  b.k("val_kwargs.n", I, "1", YES, "Validation responses per prompt.").at_least(1);
  b.k("val_kwargs.do_sample", B, "false", YES, "Sample during validation; false decodes greedily.");

  b.k("multi_turn.enable", B, "false", NO, "Multi-turn rollouts with tools or interactions.");
  b.k("multi_turn.max_assistant_turns", I, "null", NO, "Maximum assistant turns.");
  b.k("multi_turn.max_user_turns", I, "null", NO, "Maximum user turns.");
  b.k("multi_turn.tool_config_path", S, "null", NO, "Tool definitions.");
  b.k("multi_turn.interaction_config_path", S, "null", NO, "Interaction definitions.");
  b.k("multi_turn.max_parallel_calls", I, "1", NO, "Tool calls run in parallel per turn.");
  b.k("multi_turn.max_tool_response_length", I, "256", NO, "Maximum tool response length in tokens.");
  b.k("multi_turn.tool_response_truncate_side", S, "middle", NO, "Where long tool responses are cut.",
      {"left", "right", "middle"});
  b.k("multi_turn.use_inference_chat_template", B, "false", NO, "Use the inference chat template for training.");
  b.k("multi_turn.format", S, "hermes", NO, "Tool-call format.");
  b.k("multi_turn.num_repeat_rollouts", I, "null", NO, "Rollouts per interaction.");
  b.k("multi_turn.tokenization_sanity_check_mode", S, "strict", NO, "Check incremental tokenization against full tokenization.",
      {"strict", "disable", "ignore_strippable"});

  b.k("agent.num_workers", I, "8", NO, "Agent-loop workers (async mode).");
  b.k("agent.default_agent_loop", S, "single_turn_agent", NO, "Agent loop for rows without agent_name.");
  b.k("agent.agent_loop_config_path", S, "null", NO, "Agent-loop definitions.");
  b.k("agent.custom_async_server.path", S, "null", NO, "Python file with a custom async server.");
  b.k("agent.custom_async_server.name", S, "null", NO, "Name of the custom async server class.");

  b.k("checkpoint_engine.backend", S, "naive", YES, "Trainer -> rollout weight sync.", {"naive", "nccl", "nixl", "hccl"},
      {"naive"});
  b.k("checkpoint_engine.update_weights_bucket_megabytes", I, "2048", YES,
      "Bucket size of the weight sync to disaggregated rollout ranks (rollout.nnodes); colocated, Kestrel's rollout "
      "reads the trainer's weights in place (or one resharded copy).").at_least(1);
  b.k("checkpoint_engine.engine_kwargs", M, "{}", NO, "Extra weight-sync arguments.");
  b.k("trace.backend", S, "null", NO, "Rollout tracing backend.", {"mlflow", "weave"});
  b.k("prometheus.enable", B, "false", NO, "Export engine metrics to Prometheus.");
  b.k("prometheus.port", I, "9090", NO, "Prometheus port.");
  b.k("layer_name_map.qkv_layer_name", S, "qkv", NO, "Fused QKV weight name for the rollout engine.");
  b.k("layer_name_map.gate_proj_layer_name", S, "gate_up", NO, "Fused gate/up weight name for the rollout engine.");
}

}  // namespace kestrel::config::schema_detail
