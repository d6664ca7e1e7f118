// The PPO keys `kestrel generate` and `kestrel logprobs` take: each command
// runs one piece of the PPO tree (the rollout engine; scoring), so it takes
// the keys of that piece with their PPO declarations. A default restated here
// is the command's own, and its doc says so.
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr const char* R = "actor_rollout_ref.rollout.";
constexpr const char* kModelDoc = "HF model folder (config.json + safetensors); the --model flag sets it.";
}  // namespace

std::vector<ViewKey> generate_view() {
  const std::string r = R;
  std::vector<ViewKey> v = {
      {"actor_rollout_ref.model.path", "null", kModelDoc},
      {"actor_rollout_ref.model.tokenizer_path", "", "Tokenizer folder for text and chat prompts; null = model.path."},
      {r + "dtype", "float32",
       "Compute dtype of the engine; the --dtype flag (f32 | bf16) sets it. kestrel generate: float32 (train: bfloat16)."},
      {r + "max_model_len", "", "Longest prompt + response; null = the model's max_position_embeddings."},
  };
  // The engine's own sampling options, which the trainer does not pass yet.
  v.push_back({r + "min_p", "", "Min-p sampling: drop tokens with p < min_p * p_max; 0 disables.", Support::Supported});
  v.push_back({r + "ignore_eos", "", "Keep generating past EOS until response_length; --ignore_eos sets it.",
               Support::Supported});
  // A MoE router's dtype acts in the rollout as in training (the actor's key).
  v.push_back({"actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype", "", ""});
  for (const char* k : {"temperature", "top_k", "top_p", "do_sample", "n", "seed",
                        "response_length", "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs",
                        "enable_chunked_prefill", "enable_prefix_caching", "block_size", "swap_space", "preemption_mode",
                        "enforce_eager", "cudagraph_capture_sizes"})
    v.push_back({r + k, "", ""});
  // The rollout keys Kestrel refuses or ignores: refused or noticed here too.
  for (const auto& d : ppo_schema().keys())
    if (d.path.rfind(r, 0) == 0 && d.status != Support::Supported && d.path.find(".val_kwargs.") == std::string::npos &&
        d.path != r + "min_p" && d.path != r + "ignore_eos")
      v.push_back({d.path, "", ""});
  return v;
}

std::vector<ViewKey> logprobs_view() {
  const std::string m = "actor_rollout_ref.actor.megatron.";
  std::vector<ViewKey> v = {
      {"actor_rollout_ref.model.path", "null", kModelDoc},
      {m + "dtype", "float32",
       "Compute dtype of scoring; the --dtype flag (f32 | bf16) sets it. kestrel logprobs: float32 (train: bfloat16)."},
      {m + "tensor_model_parallel_size", "1", "Tensor-parallel size (run under mpirun -np N, N a multiple); --tp sets it."},
      {m + "pipeline_model_parallel_size", "1",
       "Pipeline-parallel size: each rank scores through its stage of the layers (mpirun -np N, N a multiple of "
       "tp x pp); --pp sets it."},
      {m + "virtual_pipeline_model_parallel_size", "null", "Model chunks per pipeline rank (interleaved layout)."},
      {m + "context_parallel_size", "1",
       "Context-parallel size: each sequence is split over this many ranks (mpirun -np N, N a multiple of "
       "tp x pp x cp); --cp sets it."},
      {m + "override_transformer_config.context_parallel_size", "", ""},
      {m + "override_transformer_config.context_parallel_algo", "",
       "Attention under context parallelism: megatron_cp_algo (ring), ulysses_cp_algo, hybrid_cp_algo; --cp-algo "
       "sets it."},
      {m + "override_transformer_config.ulysses_degree_in_cp", "", ""},
      {m + "override_transformer_config.cp_attention_mask_type", "", ""},
      {m + "override_transformer_config.num_layers_in_first_pipeline_stage", "null",
       "Uneven pipeline split: layers of the first stage."},
      {m + "override_transformer_config.num_layers_in_last_pipeline_stage", "null",
       "Uneven pipeline split: layers of the last stage."},
      {m + "override_transformer_config.noop_layers", "null", "MindSpeed: identity layer slots padding the split."},
      {m + "sequence_parallel", "false",
       "Shard activations along the sequence between TP regions; --sequence-parallel sets it. "
       "kestrel logprobs: false (train: true)."},
      {m + "override_transformer_config.make_vocab_size_divisible_by", "128",
       "Under --tp N a vocabulary N does not divide is padded to a multiple of this x N (Megatron's rule)."},
      {std::string(R) + "log_prob_max_token_len_per_gpu", "4096",
       "Tokens packed into one scoring forward; --max-batch-tokens sets it. kestrel logprobs: 4096."},
  };
  // MoE scoring forwards: the capacity, the router dtype, and the routing keys checked against config.json.
  for (const char* k : {"moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_token_drop_policy",
                        "moe_router_dtype", "num_moe_experts", "moe_router_topk", "moe_router_score_function",
                        "moe_router_pre_softmax", "moe_router_num_groups", "moe_router_group_topk",
                        "moe_router_topk_scaling_factor", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"})
    v.push_back({m + "override_transformer_config." + k, "", ""});
  return v;
}

}  // namespace kestrel::config::schema_detail
