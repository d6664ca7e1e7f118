// Decoder-only causal LM (Llama, Qwen2, Qwen3, Mistral) with explicit forward
// and backward over packed batches. Parameters carry HF names so checkpoints
// load and save without a mapping table.
//
// A CausalLM is a slice: an optional embedding, a contiguous range of decoder
// blocks (model/block.h, the one layer body every path runs) and an optional
// head (final norm + lm_head, or the value head). The default options give the
// whole model; a pipeline stage is a slice (ModelOptions first_layer,
// num_layers, has_embedding, has_head), chained through forward_hidden /
// backward_hidden on the residual stream. A slice loads, saves, lists and
// initialises only its own tensors (HF names keep the global layer index).
//
// Precision: weights live in the compute dtype (f32, or bf16 in bf16 mode);
// gradients are always f32 and accumulate across micro-batches; the f32
// master copy in bf16 mode belongs to the optimizer (optim/), not the model.
//
// Parallelism enters through the process groups in ModelParallel (size 1 is
// the plain case); model code is written once for every layout.
//
// Tensor parallelism (tp > 1, Megatron-style): each rank keeps its shard of
// every parameter, cut from the full HF tensor (parallel/sharding.h): q/k/v,
// gate/up column-parallel, o/down row-parallel, embedding and lm_head
// vocab-parallel, norms and row biases replicated. Param::weight and
// Param::grad hold the shard; Param::full_shape and Param::shard say how to
// reassemble it. forward() then returns this rank's vocab slice of the logits,
// [T, V/tp] starting at vocab_start(): score them with the vocab-parallel
// functions of model/scoring.h (parallel/vocab_loss.h), never by gathering.
// A vocabulary tp does not divide is padded (Megatron's
// make_vocab_size_divisible_by): padded_vocab() rows, the padding rows zero,
// left out of every reduction, with zero gradients; full_tensor(), save() and
// full_shape keep the HF shape [vocab_size, D], and load() pads.
// With sequence_parallel the activations between the TP regions are split
// along the tokens; batches whose token count does not divide by tp are padded
// internally (padding rows never reach attention, the logits or the grads).
//
// Value model (ModelOptions::value_head, the PPO critic): the same backbone
// with HF's *ForTokenClassification head, num_labels = 1: "score.weight"
// [1, D] (and "score.bias" [1] when the loaded folder has one) in place of
// lm_head, untied even when the config ties embeddings. forward() then
// returns values [T, 1] and backward() takes dvalues [T, 1]. Under tp the
// head is replicated: every rank computes the full [T, 1] values from the
// (full) final hidden state, and only tp rank 0 feeds the head's input
// gradient into the tp reduction, so the sum over ranks is exact.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/packed_linear.h"
#include "comm/process_group.h"
#include "io/model_config.h"
#include "model/activations.h"
#include "model/batch.h"
#include "model/block.h"
#include "model/moe_options.h"
#include "model/param.h"
#include "model/recompute.h"
#include "ops/rope.h"
#include "parallel/cp_attention.h"
#include "parallel/sharding.h"
#include "parallel/tp_layers.h"

namespace kestrel::model {

struct ModelParallel {
  std::shared_ptr<comm::ProcessGroup> tp = comm::local_group("tp");
  bool sequence_parallel = false;  // ignored at tp = 1, as Megatron does
  // The pipeline group this rank's stage belongs to (size 1 = no pipeline):
  // pp rank r holds the slice(s) of stage r (ModelOptions first_layer /
  // num_layers, or chunks under the interleaved schedule).
  std::shared_ptr<comm::ProcessGroup> pp = comm::local_group("pp");
  // The interleaved schedule's micro-batch group (Megatron's
  // microbatch_group_size_per_vp_stage); 0 = the pipeline size.
  int64_t vpp_microbatch_group = 0;
  // Context parallelism (nullptr = none): the cp group and its Ulysses / ring
  // subgroups (parallel/cp_attention.h). The model then trains and scores a
  // cp rank's share of each packed batch (model/cp_batch.h); its weights are
  // replicated over cp and their gradients summed over dp x cp (the engine's
  // EngineParallel::dp_cp).
  std::shared_ptr<const parallel::CpGroups> cp;
  // Expert parallelism (size 1 = none): the routed experts of every MoE layer
  // are split over this group in consecutive blocks (model/moe_mlp.h), the
  // tokens dispatched to them (parallel/ep_dispatch.h). Each rank's params()
  // hold its own experts only.
  std::shared_ptr<comm::ProcessGroup> ep = comm::local_group("ep");
  // The ep group's hierarchical all-to-all-v (moe_hierarchical_alltoallv;
  // nullptr = the flat exchange), built once, collectively, by
  // model::set_expert_dispatch.
  std::shared_ptr<const comm::HierarchicalA2a> ep_hier;
  // Expert tensor parallelism (Megatron's expert_tensor_parallel_size): the
  // group each routed expert's FFN is split over (gate/up by rows, down by
  // columns; model/moe_mlp.h). nullptr = the tp group (Megatron's default);
  // a size-1 group keeps every expert whole.
  std::shared_ptr<comm::ProcessGroup> etp;
};

struct ModelOptions {
  DType dtype = DType::F32;  // compute/storage dtype of weights and activations
  // Where the weights, gradients, activations and RoPE table live. A device
  // other than the CPU needs its backend initialised first (cuda::init) and
  // process groups that carry device buffers (a ProcessGrid built for the
  // device: comm/device_group.h, NCCL), or of size 1; pipeline parallelism is
  // refused there (its transfers match by tag, NCCL's by order). Batches
  // go there with model::to_device; load() and init_random() copy the host
  // values over.
  Device device = Device::CPU;
  ModelParallel parallel;
  int64_t max_positions = 0;  // RoPE table length; 0 = config's max_position_embeddings
  // Value model: score head [1, D] instead of lm_head (see the file comment).
  bool value_head = false;
  bool value_head_bias = false;  // a "score.bias" [1]; load() sets it when the folder has one
  // A score head missing from a loaded folder (an actor checkpoint, as verl
  // initialises its critic) is drawn normal(0, initializer_range of
  // config.json, default 0.02) from Philox(value_head_seed); HF draws it
  // from torch's global RNG, so the values differ from HF's but the law is the same.
  uint64_t value_head_seed = 0;

  // A slice of the model (a pipeline stage): blocks [first_layer,
  // first_layer + num_layers) of config.num_hidden_layers (num_layers -1:
  // through the last layer), with the embedding and/or the head (final norm +
  // lm_head or value head). The embedding needs first_layer 0 and the head the
  // last layer. The default is the whole model.
  int64_t first_layer = 0;
  int64_t num_layers = -1;
  bool has_embedding = true;
  bool has_head = true;
  // Several slices on one rank: the model chunks of the interleaved pipeline
  // schedule (virtual pipeline, vpp > 1), ascending and disjoint, each a range
  // of blocks [first_layer, first_layer + num_layers) (num_layers may be 0: a
  // chunk of noop layers only). The embedding belongs to chunk 0 (which must
  // start at layer 0), the head to the last chunk (which must end at the last
  // layer). Empty = one chunk, first_layer / num_layers above.
  struct LayerRange {
    int64_t first_layer = 0, num_layers = 0;
  };
  std::vector<LayerRange> chunks;

  // Vocabulary padding for tensor parallelism (Megatron's
  // make_vocab_size_divisible_by): when tp > 1 and vocab_size does not divide
  // by tp, the embedding and lm_head are padded to a multiple of
  // make_vocab_size_divisible_by * tp rows. Padded rows are zero, never win
  // (excluded from the vocab-parallel logprob/entropy/loss reductions, cut from
  // the rollout's logits), get zero gradients and are stripped on export.
  int64_t make_vocab_size_divisible_by = 128;

  // Activation recompute of the training forward (model/recompute.h), decided
  // per block of the slice; bit-identical to none. Scoring and the rollout
  // ignore it (they keep nothing).
  RecomputePolicy recompute;

  // How the MoE layers train (router losses, capacity, bias update; model/moe_options.h).
  MoeTrainOptions moe;
};

class CausalLM {
 public:
  // Reads config.json and safetensors weights from an HF folder.
  static Result<std::unique_ptr<CausalLM>> load(const std::string& dir, const ModelOptions& opts = {});
  // Fresh weights: normal(0, init_std) for matrices, ones for norms, zeros for biases.
  static std::unique_ptr<CausalLM> init_random(const io::ModelConfig& cfg, const ModelOptions& opts, uint64_t seed,
                                               double init_std = 0.02);

  const io::ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  DType dtype() const { return opts_.dtype; }
  Device device() const { return opts_.device; }

  // Every parameter in HF order (embedding, layers, final norm, lm_head when
  // untied; score.weight and score.bias instead of lm_head in a value model).
  std::vector<Param*> params();
  Param* find_param(const std::string& name);  // nullptr when the model (slice) has none of that name
  // The state tensors that are not trained (DeepSeek-V3's
  // e_score_correction_bias: f32 in every precision, no gradient), in HF
  // order; load/save and every whole-model copy carry them with the params.
  std::vector<Param*> buffers();
  // params() then buffers(): everything a model folder holds for this slice.
  std::vector<Param*> state_tensors();
  const Param* find_param(const std::string& name) const {
    return const_cast<CausalLM*>(this)->find_param(name);
  }
  int64_t num_parameters() const;

  // Allocates f32 gradients (MemCategory::Grads) and zeroes them.
  void enable_grads();
  void zero_grads();

  // param_offload / grad_offload (Megatron's and verl's keys; model/residency.cpp):
  // a model on a device moves its weights (state_tensors()) and/or its
  // gradients to pinned host memory while its worker is idle, and they come
  // back on first use: every forward and backward calls ensure_on_device, so
  // a phase that forgets to load cannot compute on host memory. The tensors
  // move in place (Storage::relocate), so views of them (the optimizer's, the
  // in-place rollout's) follow; values are unchanged. A no-op on the CPU.
  void offload_to_host(bool weights, bool grads);
  void ensure_on_device(bool grads) const;
  bool weights_on_device() const { return !weights_offloaded_; }
  bool grads_on_device() const { return !grads_offloaded_; }

  // Writes config.json + safetensors (dtype on disk; single file or shards)
  // atomically, HF-shaped (a value model as <Arch>ForTokenClassification with
  // num_labels 1 and classifier_dropout 0, as verl's critic). Under tp > 1 it is collective over the tp group:
  // every rank calls it, the full tensors are gathered, and only tp rank 0
  // writes (the others return ok without touching dir). Under expert
  // parallelism (tp 1) likewise over the ep group: ep rank 0 writes every expert.
  Status save(const std::string& dir, DType disk_dtype) const;
  // The config.json text save() writes for disk dtype `disk_dtype` (a value
  // model as <Arch>ForTokenClassification with num_labels 1). score_bias: the
  // whole model's value head has a bias (a slice without the head cannot tell).
  std::string hf_config_json(DType disk_dtype, bool score_bias) const;
  // The full HF tensor of a parameter (collective over tp; a copy at tp = 1).
  Tensor full_tensor(const Param& p) const;

  // Forward through the final norm and lm_head: fills acts (everything
  // backward needs) and returns logits [T, V] (compute dtype); under tp > 1
  // this rank's vocab columns [T, local_vocab()] (padded_vocab() / tp; the
  // padding columns are zero). A value model returns values [T, 1] (compute
  // dtype; the full values on every tp rank). Needs the embedding and the head.
  Tensor forward(const PackedBatch& batch, Activations& acts) const;
  // Logits only, keeping nothing for backward (scoring, generation prefill).
  Tensor forward_inference(const PackedBatch& batch) const;
  // Backward from dlogits [T, V] (f32; [T, local_vocab()] under tp);
  // accumulates into every Param::grad. A value model takes dvalues [T, 1] f32
  // (the same on every tp rank). Needs the embedding and the head.
  void backward(const PackedBatch& batch, Activations& acts, const Tensor& dlogits);

  // The same passes for any slice, on hidden states at the slice boundaries.
  // hidden: the residual stream [hidden_rows(batch), D] (compute dtype) out of
  // the previous slice, undefined when this slice has the embedding. Returns
  // what forward() returns when the slice has the head, else the residual
  // stream [hidden_rows(batch), D] entering the next slice. forward_hidden
  // keeps `hidden` (not a copy) in acts for the backward: leave it unchanged.
  // `chunk` picks the model chunk (ModelOptions::chunks) on a rank holding
  // several; the embedding runs in chunk 0 and the head in the last one.
  Tensor forward_hidden(const PackedBatch& batch, const Tensor& hidden, Activations& acts, int64_t chunk = 0) const;
  Tensor forward_hidden_inference(const PackedBatch& batch, const Tensor& hidden, int64_t chunk = 0) const;
  // dout: dlogits / dvalues as backward() takes them when the slice has the
  // head, else the f32 gradient of the returned residual stream
  // [hidden_rows(batch), D]. Returns the f32 gradient of `hidden` (undefined
  // when the slice has the embedding).
  Tensor backward_hidden(const PackedBatch& batch, Activations& acts, const Tensor& dout, int64_t chunk = 0);
  // Rows of the residual stream on this rank: T, or under sequence
  // parallelism T padded to a multiple of tp, divided by tp.
  int64_t hidden_rows(const PackedBatch& batch) const;

  // Called during backward each time a group of gradients is final (for
  // data-parallel buckets, parallel/data_parallel.h): stage n_layers after the
  // lm_head and final norm, stage i after layer i (global index), stage -1
  // after the embedding (which a tied lm_head shares). A slice reports only
  // its stages; a head slice's own copy of a tied embedding (no embedding in
  // the slice) is final at stage n_layers. grad_stage() gives a param's stage.
  void set_grad_ready_hook(std::function<void(int64_t stage)> hook) { grad_hook_ = std::move(hook); }
  int64_t grad_stage(const Param& p) const;

  // MoE routers: the statistics of the training forwards since the last
  // reset (one entry per MoE layer of the slice; recompute reruns are not
  // counted), and the aux-loss-free balancing step: each MoE layer's
  // correction bias moves by `rate` against its load in `step` (loads summed
  // over dp by the caller). No-ops on a dense model.
  MoeStepStats& moe_stats() const { return moe_stats_; }
  // The factor of the router losses' gradients in each backward: 1 /
  // (micro-batches of the mini-batch over all dp ranks), so the losses enter
  // the update as their mean over micro-batches, as Megatron's
  // MoEAuxLossAutoScaler scales them. Set by the training engine per mini-batch.
  void set_moe_loss_scale(double s) { moe_loss_scale_ = s; }
  void update_moe_correction_bias(const MoeStepStats& step, double rate);
  int64_t num_moe_layers() const;  // in the whole model (the routing replay layout)

  // Weights packed for the GEMMs of forward-only passes (scoring:
  // forward_inference, forward_hidden_inference), backend/cpu/packed_linear.h:
  // at tp = 1 their linears and the lm_head multiply by packs from `packs`
  // (nullptr: never). The packs' owner decides their lifetime (a scoring
  // call's, or the rollout engine's when it reads these weights in place);
  // the fingerprint guard repacks a weight that changed since. The training
  // forward never uses them. See ForwardPacksScope.
  void set_forward_packs(cpu::WeightPacks* packs) const {
    check_packs_on_host(packs);
    forward_packs_ = packs;
  }
  cpu::WeightPacks* forward_packs() const { return forward_packs_; }
  // Weights packed for the training forward's x @ W^T (and recompute's
  // reruns of it) at tp = 1: the training engine packs bf16 weights once per
  // mini-batch and drops the packs before the optimizer step
  // (train/engine.cpp). nullptr: never.
  void set_train_packs(cpu::WeightPacks* packs) {
    check_packs_on_host(packs);
    train_packs_ = packs;
  }
  cpu::WeightPacks* train_packs() const { return train_packs_; }

  // Tensor parallelism.
  comm::ProcessGroup& tp() const { return *opts_.parallel.tp; }
  comm::ProcessGroup& pp() const { return *opts_.parallel.pp; }
  comm::ProcessGroup& ep() const { return *opts_.parallel.ep; }
  // The expert-tensor-parallel group (ModelParallel::etp, else tp).
  comm::ProcessGroup& etp() const { return opts_.parallel.etp ? *opts_.parallel.etp : tp(); }
  // The group p's shard spec splits it over: etp() for a routed expert's tensors, else tp().
  comm::ProcessGroup& shard_group(const Param& p) const;
  // Whether the routed experts are split over another group than the dense tensors.
  bool experts_split_apart() const { return etp().size() != tp().size(); }
  // The context-parallel groups, or nullptr without context parallelism (cp = 1).
  const parallel::CpGroups* cp_groups() const {
    return opts_.parallel.cp && opts_.parallel.cp->cp->size() > 1 ? opts_.parallel.cp.get() : nullptr;
  }
  int cp_size() const { return cp_groups() ? cp_groups()->cp->size() : 1; }
  bool sequence_parallel() const { return opts_.parallel.sequence_parallel && tp().size() > 1; }
  int64_t vocab_start() const { return vocab_.start; }
  int64_t local_vocab() const { return vocab_.size(); }  // padded_vocab() / tp
  // Rows of the embedding / lm_head over all tp ranks: vocab_size, padded
  // when tp > 1 does not divide it (ModelOptions::make_vocab_size_divisible_by).
  int64_t padded_vocab() const { return padded_vocab_; }
  int64_t local_ffn() const { return cfg_.intermediate_size / tp().size(); }
  const parallel::TpHeads& heads() const { return heads_; }  // this rank's query / kv heads

  const ops::RopeTable& rope() const { return rope_; }
  const Param& embedding() const { return embed_; }
  const Param& lm_head() const {
    KS_CHECK(!opts_.value_head, "a value model (value_head) has no lm_head: it scores states, not tokens");
    return cfg_.tie_word_embeddings ? embed_ : lm_head_;
  }
  bool is_value_model() const { return opts_.value_head; }
  int64_t output_dim() const { return opts_.value_head ? 1 : local_vocab(); }  // columns of forward()'s result
  const Param& value_head() const { return score_; }          // [1, D]; undefined unless value_head
  const Param& value_head_bias() const { return score_bias_; }  // [1]; undefined unless value_head_bias
  const Param& final_norm() const { return final_norm_; }
  // The slice: blocks [first_layer(), first_layer() + num_blocks()).
  int64_t first_layer() const { return opts_.first_layer; }
  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  const Block& block(int64_t i) const { return *blocks_[size_t(i)]; }  // local index
  bool has_embedding() const { return opts_.has_embedding; }
  bool has_head() const { return opts_.has_head; }
  // Model chunks (ModelOptions::chunks; 1 without them) and what each holds.
  int64_t num_chunks() const { return int64_t(chunk_begin_.size()) - 1; }
  int64_t chunk_first_layer(int64_t c) const { return opts_.chunks[size_t(c)].first_layer; }
  int64_t chunk_num_blocks(int64_t c) const { return chunk_begin_[size_t(c) + 1] - chunk_begin_[size_t(c)]; }
  bool chunk_has_embedding(int64_t c) const { return has_embedding() && c == 0; }
  bool chunk_has_head(int64_t c) const { return has_head() && c == num_chunks() - 1; }
  bool is_whole_model() const {
    return has_embedding() && has_head() && num_blocks() == cfg_.num_hidden_layers;
  }

 private:
  CausalLM(io::ModelConfig cfg, ModelOptions opts);
  void allocate_params();
  void build_rope();
  Tensor run_forward(const PackedBatch& b, const Tensor& hidden, Activations& acts, bool keep, int64_t chunk) const;
  // Full recompute: reruns the forward of blocks [first, last] (indices in
  // the model chunk starting at blocks_[base]) from the recompute chunk's
  // kept input, filling acts.layers[first..last] completely.
  void rerun_chunk(TrainExec& ex, Activations& acts, int64_t base, int64_t first, int64_t last) const;
  void check_chunks();
  void ready(int64_t stage) const {
    if (grad_hook_) grad_hook_(stage);
  }

  io::ModelConfig cfg_;
  ModelOptions opts_;
  // [V, D]; in a slice with the head but no embedding, a tied lm_head's own
  // copy (Megatron's word embeddings on the last stage); else undefined there.
  Param embed_;
  std::vector<std::unique_ptr<Block>> blocks_;  // the slice's layers, all chunks in order
  std::vector<int64_t> chunk_begin_;             // chunk c is blocks_[chunk_begin_[c], chunk_begin_[c + 1])
  Param final_norm_;  // [D]
  Param lm_head_;     // [V, D], undefined when tied or in a value model
  Param score_;       // [1, D] value head, value models only
  Param score_bias_;  // [1], value models with value_head_bias only
  ops::RopeTable rope_;
  parallel::TpHeads heads_;
  parallel::VocabRange vocab_;
  int64_t padded_vocab_ = 0;
  std::function<void(int64_t)> grad_hook_;
  double moe_loss_scale_ = 1.0;
  mutable MoeStepStats moe_stats_;  // filled by the training forward (a router's running counts, as Megatron's)
  // Packed weights are the CPU GEMM's: a model on a device never takes them.
  void check_packs_on_host(const cpu::WeightPacks* packs) const {
    KS_CHECK(!packs || opts_.device == Device::CPU, "weight packs are for a model on the cpu; this one is on ",
             device_name(opts_.device));
  }
  mutable bool weights_offloaded_ = false, grads_offloaded_ = false;  // offload_to_host / ensure_on_device
  mutable cpu::WeightPacks* forward_packs_ = nullptr;  // set_forward_packs
  cpu::WeightPacks* train_packs_ = nullptr;            // set_train_packs
};

// Packs for a model's forward-only passes for a scope, then none again.
class ForwardPacksScope {
 public:
  ForwardPacksScope(const CausalLM& m, cpu::WeightPacks* packs) : m_(m), prev_(m.forward_packs()) {
    m.set_forward_packs(packs);
  }
  ~ForwardPacksScope() { m_.set_forward_packs(prev_); }
  ForwardPacksScope(const ForwardPacksScope&) = delete;
  ForwardPacksScope& operator=(const ForwardPacksScope&) = delete;

 private:
  const CausalLM& m_;
  cpu::WeightPacks* prev_;
};

// Packs for a model's training forward and backward for a scope, then none again.
class TrainPacksScope {
 public:
  TrainPacksScope(CausalLM& m, cpu::WeightPacks* packs) : m_(m), prev_(m.train_packs()) { m.set_train_packs(packs); }
  ~TrainPacksScope() { m_.set_train_packs(prev_); }
  TrainPacksScope(const TrainPacksScope&) = delete;
  TrainPacksScope& operator=(const TrainPacksScope&) = delete;

 private:
  CausalLM& m_;
  cpu::WeightPacks* prev_;
};

}  // namespace kestrel::model
