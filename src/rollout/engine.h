// The in-process rollout engine's public API (vLLM's LLMEngine, in C++): add
// requests, step, collect finished outputs. It reads the training model's
// weights in place (zero copy), so a trainer and its rollout share one copy.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/packed_linear.h"
#include "core/status.h"
#include "model/transformer.h"

namespace kestrel::rollout {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = -1;        // -1 = off
  double top_p = 1.0;
  double min_p = 0.0;
  int64_t max_tokens = 512;  // rollout.response_length's default
  int64_t n = 1;             // samples per prompt, sharing the prompt's KV blocks
  uint64_t seed = 0;         // with (sample index, position): output independent of batching
  // Added to each sample's index in the sampler's key (not in the output's
  // index): a request that continues one sample of an earlier request (partial
  // rollout: prompt + the tokens so far) draws as that sample would have.
  uint64_t sample_offset = 0;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  std::vector<std::string> stop;        // stop strings (need a detokenizer, see EngineConfig)
  bool ignore_eos = false;
  int64_t logprobs = 0;      // top-k logprobs per sampled token (0 = only the sampled token's)
};

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_blocks = 0;               // 0 = derive from kv_cache_bytes
  int64_t kv_cache_bytes = int64_t(1) << 30;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_num_seqs = 256;
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  std::string preemption_mode = "recompute";  // or "swap"
  double swap_space_gib = 4.0;
  int64_t max_model_len = 0;            // 0 = model's max_position_embeddings
  // MoE models: record the experts every computed token was routed to in
  // every MoE layer (verl's enable_rollout_routing_replay, router replay R3),
  // returned with each completion (CompletionOutput::routed_experts). The
  // routing is kept per KV slot beside the cache (i32 [num_blocks *
  // block_size, n_moe_layers * k], counted in kv_cache_bytes' blocks), so
  // prefix-cache hits, swaps, forks and recomputes carry it like the K/V they
  // belong to. Engine::create refuses it for a model without MoE layers.
  bool record_routing = false;
  // CUDA graphs for decode steps (verl's rollout.enforce_eager and
  // cudagraph_capture_sizes; vLLM's cudagraph_mode FULL_DECODE_ONLY): with
  // enforce_eager false and the model on a CUDA device, uniform decode steps
  // of up to the largest capture size replay a graph captured per size,
  // padded to the nearest one; everything else runs eagerly. Same outputs as
  // eager (rollout/decode_graphs.h). No effect on the CPU (graphs are a device
  // feature). Capture sizes: empty = vLLM's defaults up to max_num_seqs.
  bool enforce_eager = true;
  std::vector<int64_t> cudagraph_capture_sizes;
  // Turns token ids into text for stop strings; may be empty when none are used.
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
};

// Memory sizing of the engine (verl/vLLM gpu_memory_utilization): the engine
// may use utilization x device memory for weights + KV cache, so
//   kv_cache_bytes = utilization * memory_bytes - weight_bytes.
// An error names actor_rollout_ref.rollout.gpu_memory_utilization when that
// leaves nothing (or utilization is outside (0, 1]).
Result<int64_t> kv_cache_bytes_for(double utilization, int64_t memory_bytes, int64_t weight_bytes);
// The memory one engine plans with: KESTREL_DEVICE_MEMORY (bytes) when set;
// else, on the CPU, MemTotal of /proc/meminfo divided by `ranks_sharing`
// (processes of one job on this machine, which share its memory).
Result<int64_t> device_memory_bytes(int64_t ranks_sharing = 1);
// Parses the text of /proc/meminfo: MemTotal in bytes.
Result<int64_t> parse_meminfo_total(const std::string& meminfo_text);
// Bytes of the model's weights in its compute dtype (this rank's shard),
// plus its f32 buffers (DeepSeek-V3's e_score_correction_bias).
int64_t weight_bytes(const model::CausalLM& model);
// Bytes of a whole model's f32 buffers (DeepSeek-V3's correction biases: one [E] per MoE layer).
int64_t buffer_bytes(const io::ModelConfig& cfg);
// Bytes the KV cache keeps per token over all layers on this tp rank, in the
// model dtype: 2 * n_kv_heads * head_dim per layer for GQA, kv_lora_rank +
// qk_rope_head_dim per layer for MLA's latent cache. (With record_routing
// each token slot also keeps n_moe_layers * top_k i32 experts; the cache
// sized from kv_cache_bytes counts them.)
int64_t kv_bytes_per_token(const model::CausalLM& model);

struct CompletionOutput {
  int64_t index = 0;                // sample index within its request
  std::vector<int32_t> token_ids;
  // log p(token) under the model's unmodified distribution (temperature 1,
  // no top-k/top-p/min-p), the quantity a trainer recomputes; see sampler.h.
  std::vector<float> logprobs;      // of each sampled token
  std::string finish_reason;        // "stop" (EOS/stop token/stop string) or "length"
  // With SamplingParams::logprobs = k > 0: per sampled token, the k most
  // likely (token, logprob) pairs of the same unmodified distribution.
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // With EngineConfig::record_routing: i32 [prompt + generated tokens,
  // n_moe_layers, k] flattened, the experts each token of the sequence
  // (prompt and response) was routed to when its K/V was computed; the last
  // sampled token is never fed to the model, so its row is -1 (a replaying
  // router chooses for itself there).
  std::vector<int32_t> routed_experts;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;  // n of them, by index
  int64_t num_cached_prompt_tokens = 0;   // prefix-cache hits
};

struct EngineStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
  int64_t preemptions = 0, swapped_out_blocks = 0, swapped_in_blocks = 0;
  int64_t steps = 0;
  int64_t idle_steps = 0;             // expert parallelism: one-token steps while other ep ranks still work
  int64_t computed_tokens = 0;        // rows forwarded (prefill chunks, recomputes, decodes)
  int64_t num_blocks = 0, free_blocks = 0;  // KV blocks (null block included in num_blocks)
  int64_t weights_version = 0;
  // Weights packed for the GEMMs of steps past the skinny size (rollout/decode_linear.h):
  // how many and their bytes now, and repacks forced by a weight that changed
  // without update_weights_version (a caller's bug the fingerprint caught).
  int64_t packed_weights = 0, packed_weight_bytes = 0, stale_weight_repacks = 0;
  // CUDA-graph decode: capture rounds (every size each; again after a
  // sleep/wake), decode steps run by replaying a graph, and decode steps of
  // more sequences than the largest capture size (run eagerly: raise
  // cudagraph_capture_sizes if they are many).
  // Padding rows replayed (sizes far apart waste work).
  int64_t cuda_graph_captures = 0, cuda_graph_replays = 0, cuda_graph_too_large = 0, cuda_graph_padding_rows = 0;
};

class Engine {
 public:
  // The model must outlive the engine: its weights are read in place, so a
  // trainer's update is visible to the next step (call update_weights_version).
  static Result<std::unique_ptr<Engine>> create(const model::CausalLM& model, const EngineConfig& cfg);
  virtual ~Engine() = default;

  virtual Status add_request(const std::string& request_id, std::vector<int32_t> prompt, const SamplingParams& params) = 0;
  // One scheduler iteration: schedule, one forward over the packed batch, sample.
  // Returns the requests that finished during this step. Under expert
  // parallelism (the model's ep group) every step is collective over the
  // group: call it on all its ranks alike (run_to_completion does; a rank
  // without work then runs a one-token step on the null block).
  virtual std::vector<RequestOutput> step() = 0;
  virtual bool has_unfinished() const = 0;
  // Called with each request's output as it finishes, before the run ends
  // (the RL trainer scores a finished response while others still generate).
  using FinishedFn = std::function<void(const RequestOutput&)>;
  // Runs step() until every request has finished; outputs in request order of
  // addition. on_finished (may be empty) sees each one when its step ends.
  virtual std::vector<RequestOutput> run_to_completion(const FinishedFn& on_finished) = 0;
  std::vector<RequestOutput> run_to_completion() { return run_to_completion(FinishedFn{}); }

  // The trainer changed the weights: bump the version (prefix cache reset,
  // packed weights dropped).
  virtual void update_weights_version() = 0;
  // The weights this engine packed for its GEMMs (rollout/decode_linear.h),
  // keyed by weight tensor: a scoring pass over the same weights (the actor
  // the engine reads in place) may multiply by them too. Always empty for a
  // model on a device: do not hand them to CausalLM::set_forward_packs there.
  virtual cpu::WeightPacks& weight_packs() = 0;
  // Frees KV memory (colocated training runs meanwhile) / allocates it again.
  virtual void sleep() = 0;
  virtual void wake_up() = 0;

  virtual EngineStats stats() const = 0;
  virtual bool is_sleeping() const = 0;
  virtual const EngineConfig& config() const = 0;
};

}  // namespace kestrel::rollout
