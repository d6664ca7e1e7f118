// The memory model of an RL step, computed from shapes before anything loads
// (`kestrel plan`, and the check `kestrel train` runs at start).
//
// It predicts what Kestrel itself allocates, per rank and per allocator
// category (core/allocator.h: Params, Grads, OptimizerState, Activations,
// KVCache, Other), in each phase of a step:
//   rollout       actor (+ ref, critic) states, the KV cache at
//                 gpu_memory_utilization, a resharded weight copy, one step's buffers;
//   scoring       the same residents (the engine is still awake) plus one
//                 old-log-prob / reference micro-batch's forward (logits [T, V]);
//   critic        values and update of the PPO critic (KV cache released);
//   actor update  the residents plus the largest micro-batch's forward and
//                 backward (what each layer's LayerActivations keeps under the
//                 recompute policy, logits and their f32 gradient, the
//                 backward's f32 scratch buffers), at the backward's largest
//                 moment, block by block as model/forward_backward.cpp runs it.
// The activation terms follow the code, not a textbook: model/block.cpp,
// model/dense_blocks.cpp, model/moe_mlp.cpp and model/mla_attention.cpp (what
// LayerActivations keeps, at [Tl, D] or [Tp, ...], and each backward's locals
// in their order), model/forward_backward.cpp (the head, dx, full recompute's
// reruns), model/train_exec.cpp (GradBuf scratch, f32, at first use),
// train/token_objective.cpp (logits, dlogits: f32 logits are overwritten by
// their gradient, bf16 ones get an f32 copy; logprob and entropy kept through
// the backward), the CPU backend's f32 widening of bf16 GEMM operands
// (backend/cpu/linear.cpp; the grouped GEMM's per expert group, the skinny
// kernel's none), parallel/data_parallel.cpp (the flat f32 gradient buffer
// padded to dp) and optim/adamw.h (m, v, masters). tests/rl/memory_plan_test.cpp
// (dense) and tests/rl/memory_plan_moe_test.cpp (MoE/MLA) hold the prediction
// against the allocator's measured peaks, equal to the byte, in one process;
// tests/mpi/moe_tp_memory_test.cpp under tp, etp, dp and ep (every category
// of every rank, the largest rank's activations).
//
// Mixture-of-experts and latent-attention models (Qwen2/3-MoE, DeepSeek-V2/V3)
// are planned layer by layer (io::ModelConfig::is_moe_layer): a MoE layer's
// router, E routed experts (each its own Param), shared experts and
// DeepSeek-V3's f32 e_score_correction_bias (a buffer: Params, no grad, no
// optimizer state); an MLA layer's projections and norms. Their activations
// follow model/moe_mlp.cpp and model/mla_attention.cpp at N routed rows per
// MoE layer: T*k without capacity dropping (exact: every token has k slots),
// E*capacity when padded to capacity (exact), T*k as the bound when dropping
// to capacity. The CPU backend's bf16 widening of the grouped GEMM depends on
// the largest expert group; the plan takes its bound (every token of the
// micro-batch on one expert, or the capacity), which is exact when the
// routing puts every token on the same k experts.
//
// Under tensor parallelism (model/mla_attention.cpp, model/moe_mlp.cpp) an
// MLA layer holds H/tp heads: q_b_proj (or q_proj) and kv_b_proj split by
// output rows, o_proj by input columns, its down projections and their norms
// replicated (their f32 partial gradients in the backward), its buffers
// [Tp, ...] of local heads. A MoE layer (sequence parallel, as Megatron
// requires) routes every real token on every tp rank (router tensors [T, E],
// [T, k]), runs the experts on its own sequence-parallel rows (Tl*k pairs on
// all but the last rank, which holds fewer), gathers the rows of the
// expert-tensor-parallel group (etp, default tp: Na rows, each expert's FFN
// split to Fe/etp) and reduce-scatters the outputs back; its shared experts
// are column/row parallel over tp ([Tp, Fs/tp]). The activations are the
// largest rank's. Router, shared_expert_gate and replicated MLA tensors count
// fully on every rank; routed experts kept apart from the dense parameters
// (ep > 1, or etp != tp) train over the expert data-parallel group. Expert
// parallelism's dispatch is planned at balanced routing (each rank's tokens
// spread evenly over the ep ranks): a skewed routing sends a rank more rows
// than planned. The rollout of MoE and MLA models under tp splits heads and
// experts like the dense tensors (its MLA latent cache is whole on every rank);
// that phase's terms are not yet held against the allocator at rollout tp > 1.
//
// Pipeline parallelism is built: the states are those of the pipeline rank
// holding the most parameters (parallel::pipeline_chunks's split, uneven
// stages and noop layers included). The virtual pipeline is modelled from
// Megatron's formula (1F1B keeps p micro-batches in flight on stage 0,
// interleaving adds (p-1)/(p v)). Context parallelism (model/cp_batch.h):
// each rank holds 2 ceil(T / 2cp) rows of a T-token sequence, plus the cp
// attention's own terms (Ulysses's work copies of q, k, v, out in place of
// q, k, v; the backward's work gradients, ring buffers and all-to-alls at the
// attention core), dense models only (MoE and MLA refuse cp).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "io/model_config.h"
#include "model/moe_options.h"
#include "model/recompute.h"

namespace kestrel::rl {

// Process layout of the actor (Megatron order tp-cp-ep-dp-pp).
struct PlanLayout {
  int64_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, dp = 1;
  // expert_tensor_parallel_size: each routed expert's FFN is split over etp
  // ranks (gate/up by rows, down by columns); 0 = tp, Megatron's default.
  int64_t etp = 0;
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  // Megatron's expert data-parallel size (parallel::ProcessGrid::edp): world / (etp x ep x pp).
  int64_t edp() const;
  // Context parallelism's Ulysses degree (parallel::cp_ulysses_degree): cp for
  // ulysses_cp_algo, 1 for megatron_cp_algo (ring), the hybrid's
  // ulysses_degree_in_cp in between.
  int64_t cp_ulysses = 1;
  bool sequence_parallel = false;       // ignored at tp = 1, as Megatron does
  bool distributed_optimizer = false;   // ZeRO-1 over dp
  // The pipeline split (parallel::PipelineSpec): Megatron's uneven first/last
  // stages (-1: even) and MindSpeed's noop layers.
  int64_t first_stage_layers = -1, last_stage_layers = -1;
  std::vector<int64_t> noop_layers;
};

// Activation recompute: model/'s own policy (model/recompute.h), so the plan
// follows what the training forward keeps block by block (RecomputePolicy::plan):
// full/uniform/n and full/block/n keep only each chunk's input x_in [Tl, D] and
// rerun the chunk in the backward; selective core_attn / layernorm / mlp,
// MindSpeed's activation-function and norm recompute drop single fields that
// the block's backward rebuilds right before their use.
using PlanRecompute = model::RecomputePolicy;

// Phase-level offload (verl's megatron param/grad/optimizer_offload): the
// state leaves the device outside the phase that needs it.
struct PlanOffload {
  bool param = false, grad = false, optimizer = false;
};

// How the actor forms micro-batches (rl/workers/actor_worker.cpp,
// rl/rollout_batch.cpp split_mini_batch): the planned worst case has every
// sequence at max_prompt + max_response tokens and a prompt's n samples in a row.
struct PlanBatching {
  int64_t prompt_len = 0, response_len = 0;  // data.max_prompt_length / max_response_length
  int64_t n = 1;                             // rollout.n
  int64_t train_batch_size = 1;              // prompts per step (data.gen_batch_size)
  int64_t ppo_mini_batch_size = 1;           // prompts per optimizer step
  int64_t ppo_epochs = 1;
  int64_t micro_batch_size = 0;  // ppo_micro_batch_size_per_gpu sequences; 0 = the mini-batch
  int64_t max_token_len = 0;     // > 0: use_dynamic_bsz with ppo_max_token_len_per_gpu
  bool share_prompts = true;     // use_prefix_grouper: a prompt packed once for its samples
  // The old-log-prob / reference scoring pass (LogProbOptions).
  int64_t log_prob_micro_batch_size = 0;  // sequences; 0 = by log_prob_max_token_len
  int64_t log_prob_max_token_len = 0;
  bool old_log_prob = false;  // the actor scores old log-probs (several mini-batches or epochs, in-reward KL)
  // Router replay (actor.router_replay.mode R2/R3): the i32 routed experts
  // each token of the actor's PackedBatches carries (n_moe_layers x top_k,
  // model/batch.h routed_experts); 0 = none.
  int64_t replay_values = 0;
};

struct PlanRollout {
  int64_t tp = 1;                   // rollout.tensor_model_parallel_size
  int64_t ep = 1;                   // rollout.expert_parallel_size (the actor's: its experts read in place)
  DType dtype = DType::F32;         // rollout weights dtype (a copy when it differs from the actor's)
  double gpu_memory_utilization = 0.5;
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_num_seqs = 256;
  // rollout.enable_rollout_routing_replay (router replay R3): the engine's
  // routing cache beside the KV cache, n_moe_layers * top_k i32 per token slot.
  bool record_routing = false;
};

struct PlanInputs {
  io::ModelConfig model;
  PlanLayout layout;
  DType dtype = DType::F32;          // actor compute/storage dtype (bf16: f32 masters in the optimizer)
  bool reuse_fp32_param = false;     // bf16: master as bf16 param + 16-bit residual (-2 B/param, /dp with distopt)
  bool critic_reuse_fp32_param = false;  // the critic's (critic.megatron...reuse_fp32_param)
  PlanRecompute recompute;           // the actor's (ModelOptions::recompute)
  PlanRecompute critic_recompute;    // the critic's
  model::MoeTrainOptions moe;        // the MoE layers' training options (capacity, router losses, router dtype)
  PlanOffload offload;
  PlanBatching batch;
  PlanRollout rollout;
  bool ref = false;                  // a reference model (use_kl_loss or use_kl_in_reward)
  bool critic = false;               // a PPO critic (value model on the actor's grid)
  DType critic_dtype = DType::F32;
  int64_t max_positions = 0;         // RoPE table rows; 0 = model.max_position_embeddings
  int64_t vocab_divisible_by = 128;  // make_vocab_size_divisible_by
  int64_t device_memory = 0;         // bytes per rank the plan must fit; also sizes the KV cache
  int64_t dp_bucket_bytes = 25 << 20;  // parallel::DpOptions::bucket_bytes
};

using CategoryBytes = std::array<int64_t, kNumMemCategories>;
int64_t total_of(const CategoryBytes& b);

// Per-rank shapes of the actor on its tp rank (what CausalLM allocates).
struct PlanShapes {
  int64_t D = 0, F = 0, hd = 0, H = 0, Hkv = 0;  // F, H, Hkv local to the tp rank (H: MLA's heads too)
  int64_t tp = 1, etp = 1;  // the tp and expert-tp sizes these shapes are split by
  int64_t Fe = 0, Fs = 0;   // a routed expert's FFN (moe_intermediate_size / etp), the shared experts' (/ tp)
  int64_t L = 0;          // layers on this pipeline stage
  int64_t V = 0;          // local vocabulary rows (padded vocab / tp)
  int64_t params = 0;     // elements of this rank's parameters
  int64_t rope_rows = 0;  // RoPE table positions
  bool qk_norm = false;
  std::vector<int64_t> layers;  // global (HF) indices of the L layers, in order
  int64_t moe_layers = 0;       // of which mixture-of-experts layers
  int64_t buffers = 0;          // bytes of untrained f32 state (e_score_correction_bias f32 [E] per MoE layer)
  int64_t pp_rank = 0;          // the pipeline rank planned (the one holding the most parameters)
};
// The shapes of the pipeline rank holding the most parameters (all layers at pp = 1).
// ep: expert parallelism (each rank holds E / ep routed experts of every MoE
// layer); etp: each expert's FFN split over etp ranks (0 = tp).
PlanShapes plan_shapes(const PlanInputs& in, int64_t tp, int64_t pp, bool value_head = false, int64_t ep = 1,
                       int64_t etp = 0);
// Parameters of decoder layer `layer` on a tp rank, each tensor's shard as
// CausalLM holds it (parallel::hf_shard_spec): norms, attention (dense or MLA:
// q_b/q_proj, kv_b column-split, o_proj row-split, the rest replicated), MLP
// (dense, or the replicated router, E / ep experts split over etp (0 = tp),
// shared experts split over tp, the replicated shared gate).
int64_t layer_params(const io::ModelConfig& c, int64_t layer, int64_t tp = 1, int64_t ep = 1, int64_t etp = 0);

// Forward FLOPs of one decoder layer: per token (its GEMMs; a MoE layer the
// router, the k routed experts and the shared experts a token uses, not all
// E) and per causal (query, key) pair (the attention core: QK^T and PV).
struct LayerFlops {
  double per_token = 0, per_pair = 0;
};
LayerFlops layer_flops(const io::ModelConfig& c, int64_t layer, int64_t tp = 1);
// Parameters a token uses (the embedding row excluded, lm_head included): the
// dense count, or for MoE the k routed experts of E (Megatron's "active parameters").
int64_t active_parameters(const io::ModelConfig& c);

// The rollout's KV cache per token and layer, in values (rollout/kv_cache.h
// KVGeometry, rollout::kv_geometry from config.json): K and V of the rank's
// kv heads (2 * Hkv/tp * head_dim), or for MLA one latent row [c_kv | k_pe]
// (kv_lora_rank + qk_rope_head_dim, ops/mla.h).
int64_t kv_values_per_token_layer(const io::ModelConfig& c, int64_t rollout_tp);
// MLA's decompressed K and V per token and layer (H * (qk_nope + qk_rope + v)
// values), what a GQA cache of the same attention would hold; the dense count otherwise.
int64_t kv_values_per_token_layer_gqa(const io::ModelConfig& c, int64_t rollout_tp);

// What one forward + backward of a T-token micro-batch keeps and uses (bytes).
struct TrainActivations {
  int64_t per_layer = 0;      // one layer's LayerActivations without recompute
  int64_t kept_layers = 0;    // every layer's kept activations after the forward (with recompute)
  int64_t recompute_live = 0; // the most activations rebuilt in the backward live at once (a rerun chunk, drops)
  int64_t head = 0;           // x_final, normf, rstdf
  int64_t logits = 0;         // logits [Tp, V] and (bf16) their f32 gradient; values [T, 1] for a critic
  int64_t loss = 0;           // logprob, entropy, lse, dlogprob, dentropy f32 [T]
  int64_t backward = 0;       // dx and the GradBuf scratch, f32
  int64_t workspace = 0;      // the largest transient at the peak (bf16 GEMM widening, qk-norm grads)
  int64_t peak = 0;           // the peak of the Activations category during the pass
  std::string at;             // where the peak is reached ("backward, layer 7 MLP", "backward, layer 6 rerun")
};
// The actor's (in.recompute) or, with value_head, the critic's (in.critic_recompute).
TrainActivations train_activations(const PlanShapes& s, const PlanInputs& in, int64_t T, DType dt,
                                   bool value_head = false);

// Forward only, nothing kept (scoring): one layer's buffers at a time, then the head.
int64_t scoring_activations(const PlanShapes& s, const PlanInputs& in, int64_t T, DType dt);
// Whether the training engine packs the weights of a mini-batch whose largest
// micro-batch has T rows (train/engine.cpp train_packs_apply: bf16 weights
// of a dense model at tp = pp = cp = 1, where the packs exist here): its
// forward GEMMs then widen nothing to f32 scratch.
bool train_packs_planned(const PlanShapes& s, const PlanInputs& in, int64_t T, DType dt);

// Micro-batch sizes the actor forms in the planned worst case (every sequence
// at full length, a prompt's n samples consecutive).
struct MicroBatchPlan {
  int64_t seqs_per_rank = 0;      // sequences of one step on this dp rank
  int64_t mini_batch_seqs = 0;    // sequences of one optimizer step on this rank
  int64_t optimizer_steps = 0;    // per RL step (mini-batches x epochs)
  int64_t max_tokens = 0;         // packed rows of the largest micro-batch
  int64_t micro_batches = 0;      // per mini-batch
  int64_t mini_batch_tokens = 0;  // packed rows of one mini-batch (its PackedBatch tensors live together)
  int64_t mini_batch_prefixes = 0;  // shared prompts' prefixes packed in one mini-batch (once per micro-batch)
  int64_t step_tokens = 0;        // packed rows of one step on this rank (one epoch)
  int64_t attention_pairs = 0;    // causal (query, key) pairs of one step on this rank (one epoch)
};
MicroBatchPlan plan_micro_batches(const PlanBatching& b, int64_t dp, int64_t max_token_len, int64_t micro_batch_size,
                                  bool whole_mini_batch);
// Bytes of a mini-batch's PackedBatch tensors (input_ids, positions, targets i32 [T], cu_seqlens, prefix_of,
// routed experts i32 [T, replay_values]), `micro_batches` PackedBatches together.
// `prefixes`: the shared prompts' prefixes packed (MicroBatchPlan::mini_batch_prefixes); -1 = one per prompt.
int64_t packed_batch_bytes(const PlanBatching& b, int64_t tokens, int64_t seqs, int64_t micro_batches,
                           int64_t prefixes = -1);

struct PhasePlan {
  std::string name;       // "rollout", "scoring", "critic", "actor update"
  CategoryBytes bytes{};  // per rank
  int64_t total() const { return total_of(bytes); }
  std::string detail;     // what dominates
};

struct CommVolume {
  std::string what;       // "tp all-reduce (train)", "dp gradient all-reduce", ...
  int64_t payload = 0;    // bytes handed to the collective per step
  int64_t traffic = 0;    // bytes each rank sends per step (ring algorithms)
  int64_t calls = 0;      // collectives per step
};

struct MemoryPlan {
  PlanInputs inputs;
  PlanShapes shapes;
  MicroBatchPlan micro;
  TrainActivations actor;   // the actor update's largest micro-batch
  std::vector<PhasePlan> phases;
  size_t peak_phase = 0;
  int64_t peak() const { return phases.empty() ? 0 : phases[peak_phase].total(); }
  bool fits() const { return peak() <= inputs.device_memory; }
  int64_t kv_cache_bytes = 0;     // the engine's cache (num_blocks * bytes_per_block)
  int64_t kv_blocks = 0;
  int64_t kv_tokens = 0;          // tokens the cache holds (kv_blocks * block_size)
  int64_t kv_bytes_per_token = 0;      // all layers, the rollout dtype (the routing cache not included)
  int64_t kv_routing_bytes_per_token = 0;  // the routing cache's i32 per token (record_routing)
  int64_t kv_bytes_per_token_gqa = 0;  // MLA: its decompressed K/V (GQA-equivalent); else kv_bytes_per_token
  double flops_actor = 0, flops_scoring = 0, flops_rollout = 0;  // per rank per step
  double flops_per_token = 0;     // forward FLOPs per token of the whole model's GEMMs (active experts only)
  int64_t active_params = 0;      // parameters a token uses (active_parameters)
  std::vector<CommVolume> comm;
  std::vector<std::string> not_supported;  // "not supported yet: ..." lines for training
  std::vector<std::string> notes;
};

// The plan of one layout; call validate_plan_inputs first (the formulas
// assume a layout the model divides). not_supported lists what training does
// not build yet (cp, offload), notes the rest (ep on a dense model, a KV
// share that holds no cache).
MemoryPlan plan_memory(const PlanInputs& in);
// Checks the layout against the model (divisibility of heads, ffn, experts,
// layers, world; the pipeline split; MoE models under tp with sequence
// parallelism; the rollout's tp dividing the experts' FFNs; no cp for MoE/MLA)
// and returns an error naming the key or flag to change.
Status validate_plan_inputs(const PlanInputs& in);

// A change that makes a plan fit, cheapest first.
struct PlanAdvice {
  std::string change;     // "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=selective"
  std::string effect;     // "peak 61.2 GiB (actor update), +4% FLOPs"
  bool supported = true;  // false: "not supported yet" for training
  int64_t peak = 0;
  bool fits = false;
};
std::vector<PlanAdvice> plan_advice(const PlanInputs& in);

std::string format_bytes(int64_t bytes);  // "1.23 GiB", "512.0 MiB", "12.0 KiB"
// "80GiB", "80 GB", "1.5T", "1024" (bytes) -> bytes; error names `flag`.
Result<int64_t> parse_bytes(const std::string& text, const std::string& flag);

}  // namespace kestrel::rl
