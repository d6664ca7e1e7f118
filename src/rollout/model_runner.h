// One forward of the training model over a packed step (prefill chunks and
// decodes mixed, no padding), reading weights in place from the CausalLM and
// K/V through block tables. It runs the model's own blocks (model/block.h)
// through a rollout execution (paged attention, the skinny decode GEMM), so
// the ops and their order are the trainer's and the rollout's logprobs match.
// MLA models (DeepSeek-V2/V3) keep one latent row [c_kv | k_pe] per token and
// layer and attend in the latent space with the absorbed kv_b_proj (ops/mla.h);
// MoE layers route every token (never dropping one) and run their experts
// through the grouped GEMM; with a routing cache the experts each token used
// are written into it by slot, for router replay R3.
//
// Tensor parallelism (the model's tp group, size 1 = the plain case): every
// rank runs the step on its local query/kv heads (m.heads()), its F/tp MLP
// columns and its V/tp vocabulary rows, Megatron-style. The vocab-parallel
// embedding and the row-parallel o_proj / down_proj outputs are all-reduced
// over tp, as training's parallel/tp_layers do (no sequence parallelism: an
// inference step has no backward to save memory for). The lm_head's [S, V/tp]
// slices are all-gathered to the full [S, V] on every rank (S is small; vLLM
// gathers too), so every rank samples the same tokens from the same logits and
// the schedulers stay in lockstep; a padded vocabulary's columns past vocab_size
// are dropped there (they can never be sampled).
//
// A model on a device (CausalLM::device(); under tp its groups carry device
// buffers over NCCL, comm/device_group.h) runs the step there: the cache, every buffer and the step's index
// tensors (positions, slots, block tables, cu_q, seq_lens) are on the model's
// device, uploaded from the host-built StepBatch, and the logits come back on
// it too; no CPU weight packs are made.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"
#include "rollout/decode_linear.h"
#include "rollout/kv_cache.h"
#include "rollout/scheduler.h"

namespace kestrel::rollout {

// The cache a model needs on this tp rank (num_blocks left 0 for the caller):
// GQA K/V of its local kv heads, or MLA's latent rows (kv_lora_rank +
// qk_rope_head_dim values per token and layer); with record_routing a
// routing cache of n_moe_layers * top_k experts per slot (a MoE model only).
KVGeometry kv_geometry(const model::CausalLM& m, int64_t block_size, bool record_routing);
// The same from config.json alone (memory plans): n_kv_heads is one tp
// rank's kv heads (parallel::tp_heads), ignored for MLA.
KVGeometry kv_geometry(const io::ModelConfig& cfg, int64_t n_kv_heads, DType dtype, int64_t block_size,
                       bool record_routing);

// Host-side description of one step, built from the scheduler's output.
struct StepBatch {
  std::vector<int32_t> input_ids;     // [T]
  std::vector<int32_t> positions;     // [T] absolute position in its sequence
  std::vector<int32_t> slot_mapping;  // [T] cache slot of each new token's K/V
  std::vector<int32_t> cu_q;          // [B+1]
  std::vector<int32_t> seq_lens;      // [B] context including this chunk
  std::vector<int32_t> block_tables;  // [B, max_blocks], padded with the null block
  int64_t max_blocks = 0;
  std::vector<int32_t> sample_rows;   // rows whose logits are needed, in batch order
  int64_t num_tokens() const { return int64_t(input_ids.size()); }
  int64_t num_seqs() const { return int64_t(seq_lens.size()); }
};

StepBatch build_step_batch(const SchedulerOutput& so, int64_t block_size);

// A step's index tensors (i32) on the model's device: what execute() uploads
// from a StepBatch, and what a decode graph keeps in persistent buffers
// (rollout/decode_graphs.h).
struct StepTensors {
  Tensor ids, positions, slots;  // [T]
  Tensor cu_q;                   // [B+1]
  Tensor seq_lens;               // [B]
  Tensor tables;                 // [B, max_blocks]
  Tensor sample_rows;            // [S]; undefined when no row samples
};
// b's index vectors uploaded to `dev` (one synchronous copy each).
StepTensors upload_step(const StepBatch& b, Device dev);

// A 64-bit digest of everything that decides a step's collectives and outputs
// (token ids, positions, slots, block tables, sample rows). Equal on every tp
// rank exactly when the schedulers agree.
uint64_t step_fingerprint(const StepBatch& b);

class ModelRunner {
 public:
  // kv is kv_geometry(model, ...)'s: this rank's kv heads (m.heads().n_kv_heads
  // per layer), or the latent rows of an MLA model.
  ModelRunner(const model::CausalLM& model, KVCache& kv);
  // Writes the step's K/V (and, with a routing cache, the experts each token
  // was routed to, by slot_mapping) into the cache and returns the logits
  // [S, V] (model dtype, the full vocabulary on every tp rank) of the sample
  // rows; final norm and lm_head run on those rows only. Collective over the
  // model's tp group: every rank calls it with the same batch.
  Tensor execute(const StepBatch& b);
  // The same step on index tensors already on the model's device (execute() is
  // forward(upload_step(b))). It only queues device work (no upload, no read
  // back, nothing that waits), so a CUDA graph can record it; the index checks
  // that read device values are skipped while one captures, and the graph's
  // owner makes them on its host copies (decode_graphs.cpp).
  Tensor forward(const StepTensors& in);
  // Slot buffers the last execute() allocated: one per BlockBuf slot the
  // blocks asked for, however many layers ran (the MoE MLP's variable-size
  // expert buffers are its own and not counted).
  int64_t last_slot_buffers() const { return last_slot_buffers_; }
  // The weights packed for this runner's GEMMs (rollout/decode_linear.h):
  // the engine drops them when the weights change or it sleeps. Always empty
  // for a model on a device (packs are the CPU GEMM's).
  WeightPacks& packs() { return packs_; }
  const WeightPacks& packs() const { return packs_; }

 private:
  // What the GEMMs may pack into: packs_ for a model on the CPU, nullptr on a device.
  WeightPacks* gemm_packs() { return m_.device() == Device::CPU ? &packs_ : nullptr; }
  // [S, V/tp] on every rank -> [S, V] on every rank (vocabulary padding dropped).
  Tensor gather_vocab(const Tensor& local);

  const model::CausalLM& m_;
  KVCache& kv_;
  int64_t last_slot_buffers_ = 0;
  WeightPacks packs_;
};

}  // namespace kestrel::rollout
