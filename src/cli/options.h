// Config -> option structs, one builder per command: the only code in cli/
// that reads config keys. Each builder reads its keys through the Config
// getters, which record every read; tests/cli/consumers_test.cpp calls the
// builders on the default config (and with each optional branch on) and fails
// for a Supported key nothing read. The commands (train.cpp, sft.cpp,
// generate.cpp, logprobs.cpp) call the builders and then do the work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/arith.h"
#include "data/dataset.h"
#include "io/model_config.h"
#include "model/moe_options.h"
#include "parallel/cp_split.h"
#include "parallel/pipeline_layout.h"
#include "rl/critic.h"
#include "rl/reward_manager.h"
#include "rl/trainer.h"
#include "rollout/engine.h"
#include "train/sft_trainer.h"

namespace kestrel::cli {

// Loads the command's configuration (cli/args: --config FILE, -cp/-cn,
// key=value overrides) in the tree `s`; `first` overrides come before the
// user's (flags that name keys). Throws kestrel::Error with every problem;
// prints the "no effect in Kestrel" notices on stderr.
config::Config load_command_config(const config::Schema& s, const std::vector<std::string>& args,
                                   const std::vector<std::string>& first = {});

// Processes of this job on this machine (OpenMPI / MPICH / Slurm env), >= 1.
int64_t local_ranks();

// ---- mixture-of-experts keys (options_moe.cpp) ----------------------------

// The MoE keys of one model (<prefix>moe_*: Megatron's override_transformer_config names,
// config/schema_moe.cpp), read before config.json: the router training options and the
// routing values Megatron takes from its own arguments (num_moe_experts, moe_router_topk, ...),
// which Kestrel takes from config.json (checked by moe_train_options).
struct MoeKeys {
  std::string prefix;            // "<meg>.override_transformer_config."
  model::MoeTrainOptions train;  // bias_update_rate is 0 unless moe_router_enable_expert_bias
  bool expert_bias = false;      // moe_router_enable_expert_bias
  std::string expert_bias_origin;
  struct Routing {
    std::string key, value, origin;  // key relative to prefix; value as config.json's is written
  };
  std::vector<Routing> routing;  // the routing keys that are set
};
// `trained` false (the reference model: forwards only) reads only the keys a forward acts on
// (capacity, drop policy, router dtype, routing). `freeze_key`: the key of verl's
// freeze_moe_router for this model ("" = none). Fails naming the key for a padding without a
// capacity factor.
MoeKeys read_moe_keys(const config::Config& c, const std::string& prefix, const std::string& freeze_key,
                      bool trained);
// The options of the model whose config.json is `cfg` (`model` names it in messages): fails naming
// the key and the model when a routing key differs from config.json's or the expert bias is enabled
// on a model without a correction bias. A dense model takes the options and never uses them.
model::MoeTrainOptions moe_train_options(const MoeKeys& k, const io::ModelConfig& cfg, const std::string& model);

// Context parallelism of one model (model/cp_batch.h): <ot>context_parallel_size (the megatron key's value unless
// overridden), <ot>context_parallel_algo, <ot>ulysses_degree_in_cp (hybrid only; checked against the size), and
// verl FSDP's Ulysses keys `fsdp_keys` (each > 1 means Ulysses CP of that size; set together with a different
// megatron size it fails naming both). ot: "<owner>.megatron.override_transformer_config." (or the SFT trainer's
// "trainer."). cp_attention_mask_type is checked by the schema (causal and general are the same packed causal
// masks in Kestrel).
struct CpSettings {
  int64_t cp = 1;
  parallel::CpAlgo algo = parallel::CpAlgo::Ring;
  int64_t ulysses_degree = 0;  // ulysses_degree_in_cp (hybrid); 0 = not set
  std::string size_key;        // the key that set cp, for messages
};
CpSettings read_context_parallel(const config::Config& c, const std::string& ot,
                                 const std::vector<std::string>& fsdp_keys = {});

// Expert parallelism of kestrel train: actor_rollout_ref.actor.megatron.expert_model_parallel_size (the reference's
// and the critic's, when on, must equal it: they run on the actor's grid); expert_tensor_parallel_size (null: the
// tensor-parallel size; the reference's and the critic's must equal the actor's).
struct EpSettings {
  int64_t ep = 1;
  int64_t etp = 1;       // expert_tensor_parallel_size (null: the tensor-parallel size)
  std::string size_key;  // the key that set ep, for messages
  int64_t rollout_ep = 1;  // actor_rollout_ref.rollout.expert_parallel_size: 1 or ep
};
EpSettings read_expert_parallel(const config::Config& c, int64_t tp, bool ref, bool critic);
// Fails naming the key when ep > 1 with a dense model or a count of routed experts it does not divide.
void check_expert_parallel_model(const config::Config& c, const EpSettings& s, const io::ModelConfig& cfg,
                                 const std::string& model);

// ---- kestrel train (ppo_trainer) ------------------------------------------

// What is read before the data and the model are loaded.
struct TrainInputs {
  std::string model_path, tokenizer_path;  // tokenizer_path "" = the model folder
  std::vector<std::string> train_files, val_files;  // val_files empty = no validation
  data::RlDatasetOptions train_data, val_data;
  int64_t train_batch_size = 0;
  bool shuffle = true;
  uint64_t data_seed = 1;
  rl::RewardManagerOptions reward;
  DType dtype = DType::F32;
  int64_t tp = 1, rollout_tp = 1;
  int64_t vocab_divisible_by = 128;  // megatron.override_transformer_config.make_vocab_size_divisible_by
  bool sequence_parallel = false, distributed_optimizer = false;
  double gpu_memory_utilization = 0.5;
  // Disaggregated placement: rollout.nnodes x rollout.n_gpus_per_node rollout
  // ranks (0 = colocated), the weight sync's bucket in bytes.
  int64_t rollout_ranks = 0;
  int64_t weight_bucket_bytes = int64_t(2048) << 20;
  double collective_timeout_s = 600;  // actor_rollout_ref.nccl_timeout (comm/mpi/health.h)
  bool deterministic = false;  // megatron deterministic_mode / fsdp full_determinism (core/parallel_for.h)
  bool console_full = false;   // trainer.console_metrics=full
  bool console_logger = true, val_only = false;
  // The critic (critic.enable, or null = exactly for adv_estimator=gae).
  bool critic = false;
  std::string critic_model_path;  // == model_path: the actor's folder
  uint64_t critic_seed = 0;
  DType critic_dtype = DType::F32;  // critic.megatron.dtype
  // Activation recompute of the actor / critic (megatron.override_transformer_config.recompute_*, or
  // model.enable_gradient_checkpointing=true); the reference and the rollout have no backward.
  model::RecomputePolicy recompute, critic_recompute;
  // Pipeline layout of the actor (the reference's must equal it: it is the actor's copy on its stages) and of the
  // critic (its pp must equal the actor's: the same process grid; its split is its own): megatron.
  // pipeline_model_parallel_size, virtual_pipeline_model_parallel_size (null -> 1) and override_transformer_config.
  // {num_layers_in_first,last}_pipeline_stage (null -> -1), noop_layers, microbatch_group_size_per_vp_stage
  // (null -> 0). Checked here without the model (pp, vpp >= 1, vpp > 1 needs pp >= 2, noop ids >= 0 and
  // distinct); the split against num_hidden_layers is parallel::pipeline_chunks's.
  parallel::PipelineSpec actor_pipeline, critic_pipeline;
  // override_transformer_config.num_layers: Megatron's total layer count (num_hidden_layers + |noop_layers|);
  // -1 = not set. check_num_layers compares it with config.json's.
  int64_t actor_num_layers = -1, critic_num_layers = -1;
  // MoE router options of the actor, the reference model and the critic (<meg>.override_transformer_config.moe_*,
  // actor_rollout_ref.model.override_config.moe_config.freeze_moe_router); moe_train_options checks them against
  // config.json once it is read.
  MoeKeys actor_moe, ref_moe, critic_moe;
  // Context parallelism of the actor (the reference and the critic run on its grid: theirs must equal it).
  CpSettings cp;
  EpSettings ep;  // expert parallelism of the actor (likewise)
};
// Fails with "not supported yet: ..." for settings the config layer accepts
// but the trainer does not build.
TrainInputs train_inputs(const config::Config& c);
// The process grid fits the world: tp x pp of the actor (and of the critic when on) and the rollout's tp divide
// world_size; an error naming the keys and their origins and a -np that fits. For kestrel train, in place of
// its tp-only check (train.cpp's check_sizes_divide).
void check_layout_divides(const config::Config& c, const TrainInputs& in, int world_size);
// override_transformer_config.num_layers of the actor (and of the critic when on), when set, equals
// num_hidden_layers + |noop_layers| (config.json's layers plus the noop slots: Megatron's total); an error naming
// both keys otherwise. Called once config.json is read, before parallel::pipeline_chunks.
void check_num_layers(const config::Config& c, const TrainInputs& in, int64_t num_hidden_layers);
// verl's names for equivalent paths (strategy, rollout.name/mode, load_format,
// optimizer spelling): read and checked; trainer.device=cuda set on a build
// whose trainer runs on the CPU fails saying what to do. train_inputs calls
// it (options_verl.cpp).
void read_verl_choices(const config::Config& c);
// trainer.device as this build and machine can honour it: cpu is the CPU;
// cuda (verl's default) is the GPU where the build has the CUDA backend and a
// device is present (initialised here: device local_rank % devices, so the
// ranks of a node share its GPUs round robin; the process groups then carry
// device buffers over NCCL), the CPU otherwise when left at the default; an
// explicit cuda that cannot run (no backend, no device, several processes in
// a build without NCCL) is an error naming the key.
Device trainer_device(const config::Config& c, int world_size, int local_rank = 0);
// The parameter, gradient and activation offload keys (Megatron's, verl
// FSDP's): no effect on the CPU; true on a device fails "not supported yet".
void check_offload_on_device(const config::Config& c, Device dev);
// The device's memory in bytes (KESTREL_DEVICE_MEMORY overrides it), which
// rollout.gpu_memory_utilization is a fraction of on the GPU.
Result<int64_t> device_total_memory();
// A set trainer.n_gpus_per_node x nnodes other than the process count fails
// saying what to do.
void check_launch(const config::Config& c, int world_size);
// The RL options; the schedule lengths need the data set (batches per epoch).
// engine.kv_cache_bytes is left for rollout_kv_cache_bytes once the model is loaded.
rl::RlOptions rl_options(const config::Config& c, int64_t batches_per_epoch);
rl::CriticOptions critic_options(const config::Config& c, const rl::RlOptions& o);
// The learning-rate schedule of `<prefix>optim.*` (actor or critic).
optim::LrScheduleConfig lr_schedule_config(const config::Config& c, const std::string& prefix, int64_t total_steps);

// ---- kestrel sft (sft_trainer) --------------------------------------------

struct SftInputs {
  std::string model_spec, tokenizer_path;  // model.partial_pretrain; "" = the model folder
  std::string ckpt_root;                   // trainer.default_local_dir
  std::vector<std::string> train_files, val_files;  // val_files empty = none
  data::SftDatasetOptions data;               // max_samples = data.train_max_samples
  int64_t val_max_samples = -1;
  data::ArithOptions arith;
  int64_t arith_num_train = 0, arith_num_test = 0;
  DType dtype = DType::F32;
  int64_t train_batch_size = 0;
  bool shuffle = true;
  uint64_t seed = 1, data_seed = 1;
  int threads = 0;
  std::vector<std::string> loggers;
  bool console_full = false;  // trainer.console_metrics=full
  int64_t val_generations = 0, max_response_length = 0;
  model::RecomputePolicy recompute;  // model.enable_gradient_checkpointing: full/uniform/1
  // trainer.tensor_model_parallel_size / pipeline_model_parallel_size /
  // virtual_pipeline_model_parallel_size (Kestrel's keys; dp = world / (tp * pp)).
  int64_t tp = 1;
  parallel::PipelineSpec pipeline;
  MoeKeys moe;  // model.override_transformer_config.moe_*, model.override_config.moe_config.freeze_moe_router
  CpSettings cp;  // trainer.context_parallel_size / context_parallel_algo / ulysses_degree_in_cp, ulysses_sequence_parallel_size
};
SftInputs sft_inputs(const config::Config& c);
train::SftOptions sft_options(const config::Config& c, int64_t batches_per_epoch);

// ---- kestrel generate / kestrel logprobs (views of the PPO tree) -----------

struct GenerateSettings {
  std::string model_path, tokenizer_path;  // tokenizer_path "" = the model folder
  DType dtype = DType::F32;
  double gpu_memory_utilization = 0.5;
  rollout::EngineConfig engine;  // kv_cache_bytes set from gpu_memory_utilization by the command
  rollout::SamplingParams sampling;
  uint64_t base_seed = 0;
  bool router_logits_fp32 = false;  // the actor's override_transformer_config.moe_router_dtype=fp32
};
GenerateSettings generate_settings(const config::Config& c);

// The rollout engine's settings (actor_rollout_ref.rollout.*), for train and
// generate alike. kv_cache_bytes is 0: the command sizes it from
// gpu_memory_utilization and the model; max_model_len 0 when null.
rollout::EngineConfig rollout_engine_config(const config::Config& c);

struct LogprobsSettings {
  std::string model_path;
  DType dtype = DType::F32;
  int64_t tp = 1;
  parallel::PipelineSpec pipeline;  // pp (--pp), vpp, uneven split, noop layers
  bool sequence_parallel = false;
  int64_t max_batch_tokens = 4096;
  int64_t vocab_divisible_by = 128;  // megatron.override_transformer_config.make_vocab_size_divisible_by
  MoeKeys moe;  // the actor's capacity, drop policy and router dtype (scoring forwards)
  CpSettings cp;  // the actor's context parallelism (--cp, --cp-algo)
};
LogprobsSettings logprobs_settings(const config::Config& c);
// The pipeline layout of a forward-only command (kestrel logprobs) under `meg`
// ("actor_rollout_ref.actor.megatron"): pp, vpp, the uneven split and noop
// layers (no schedule keys: scoring runs all forwards), checked as
// train_inputs checks the actor's.
parallel::PipelineSpec scoring_pipeline_spec(const config::Config& c, const std::string& meg);

// "bfloat16" | "float32" (PPO names) or "bf16" | "f32" (flag names) -> DType.
DType parse_compute_dtype(const std::string& name, const std::string& key);
// The recompute policy of one trained model from <meg>.override_transformer_config.recompute_* and, when those
// leave it off, verl FSDP's gc_key (enable_gradient_checkpointing) when true: full/uniform/1.
// Fails naming the key and the fix.
model::RecomputePolicy recompute_policy(const config::Config& c, const std::string& meg, const std::string& gc_key);

// kestrel train's summary line for the built-in run on a machine too slow for
// its budget (cli/train.cpp): "" unless a run from step 0 was cut by a budget
// of the built-in run's 590 s or more before the 1000 steps it is sized for.
std::string builtin_budget_note(int64_t steps, int64_t steps_run, int64_t total_steps, double budget_s, double fit_s);

}  // namespace kestrel::cli
