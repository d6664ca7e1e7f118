// AdamW over f32 master parameters, with the optimizer state kept as flat
// contiguous buffers so a distributed optimizer can shard the flat element
// space across data-parallel ranks (ZeRO-1 style): each rank owns a
// [state_begin, state_end) range of the flat space, allocates m and v only
// for that range, and steps only it.
//
// Masters. In f32 training the model's weights are the masters (stepped in
// place). In bf16/f16 mixed precision a slot carries a model_copy and an f32
// master either
//   - full, in ParamSlot::master (the single-process trainers: 4 + 4 + 4 =
//     12 bytes of optimizer state per parameter), or
//   - held by the optimizer (ParamSlot::master left undefined): one flat f32
//     buffer over the owned range only, initialised from the model copies (or
//     from full masters through set_master()). With the distributed optimizer
//     this cuts the state to 12/dp bytes per parameter (Megatron's
//     DistributedOptimizer: fp32 main params, exp_avg, exp_avg_sq all sharded).
//     After a step only the owned elements of the model copy are refreshed;
//     the others arrive through parallel::DataParallel::gather_params().
// memory() reports the resulting bytes per parameter.
//
// reuse_fp32_param (MindSpeed's "BF16 parameter copy reuse"; the constructor's
// last argument): every bf16 slot without a master keeps its f32 master as
// the bf16 model copy itself (the high half) plus a 16-bit residual (the low
// half) over the owned range, instead of an f32 master: 2 bytes per owned
// parameter instead of 4, i.e. 12 -> 10 bytes of optimizer state per
// parameter in one process and 12/dp -> 10/dp with the distributed optimizer.
// The split is exact round-to-nearest-even, so the copy is bit for bit what
// the plain path rounds to, and recovery is exact for every f32 pattern; the
// one bit a 16-bit residual cannot carry (which of two ties rounded to an even
// copy; whether a NaN's quiet bit was forced) lives in bit 31 of the element's
// exp_avg_sq, as MindSpeed keeps it in v's sign (backend/cpu/reuse_fp32_kernels.h).
// Every step equals the plain path's bit for bit (the same kernel loop runs on
// the recovered masters). With the distributed optimizer the model copy is
// DataParallel's full bf16 parameter buffer and the residuals cover the owned
// range only: the all-gather moves the bf16 halves (2 bytes per parameter, as
// without reuse) and rewrites each rank's own slice with its own bits, so the
// (copy, residual) pairs stay intact; residuals never travel. Only bf16 model
// copies can be reused (f16 fails; f32 slots have no copy and are stepped in place).
//
// Update, per element, exactly as torch.optim.AdamW (foreach=False,
// capturable=False), with t the step count after increment:
//   p <- p * (1 - lr * wd)                       (decoupled decay, if enabled)
//   m <- m + (1 - beta1) * (g - m)               (torch's lerp)
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Scalars (bias corrections, step size) are computed in double and applied in
// f32, as torch does for f32 tensors. Where the master lives does not change
// any number: a held master steps bit-identically to a full one.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kestrel::optim {

// One trainable parameter as the optimizer sees it.
struct ParamSlot {
  std::string name;
  Tensor master;      // f32, updated in place; undefined (with a model_copy) = the optimizer holds the
                      // master for the owned elements only (see the file comment)
  Tensor grad;        // f32, same numel as the parameter
  Tensor model_copy;  // the copy the model computes with (bf16/f16/f32), refreshed from master
                      // by round-to-nearest-even after each step; undefined = the model uses master
  bool decay = true;  // weight decay on (false for norms and biases, by convention)
};

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// Optimizer state as named tensors plus metadata, for checkpoints. Written
// with io::save_safetensors(path, tensors, metadata) by the caller.
struct OptimizerState {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

// Bytes of optimizer state this optimizer keeps, against the parameters of
// the flat space (this rank's model shard). Mixed precision, one process:
// 12 bytes/param; with held masters over an owned range of 1/dp: 12/dp (plus
// the rounding of the padded flat space). f32: 8 and 8/dp.
struct OptimizerMemory {
  int64_t params = 0;            // elements of the flat space
  int64_t owned = 0;             // elements this rank steps (state_end - state_begin)
  int64_t exp_avg_bytes = 0;     // f32 m over the owned range
  int64_t exp_avg_sq_bytes = 0;  // f32 v over the owned range
  int64_t master_bytes = 0;      // f32 masters apart from the model weights: the held owned slice plus the
                                 // full masters of slots that carry both a master and a model copy
  int64_t residual_bytes = 0;    // reuse_fp32_param: the 16-bit low halves over the owned range (the high
                                 // halves are the bf16 model weights, counted as Params, not here)
  int64_t total_bytes() const { return exp_avg_bytes + exp_avg_sq_bytes + master_bytes + residual_bytes; }
  double bytes_per_param() const { return params ? double(total_bytes()) / double(params) : 0.0; }
  // "12.000 B/param (m 4.000, v 4.000, master 4.000) over N params, M owned"; with reuse_fp32_param
  // "10.000 B/param (m 4.000, v 4.000, master 0.000, residual 2.000; reuse_fp32_param) over ...".
  std::string to_string() const;
};

class AdamW {
 public:
  // state_begin/state_end: the owned slice of the flat space; -1 = everything.
  // Slots without a master get one held by the optimizer for the owned range
  // (an f32 model copy is simply used as the master).
  // reuse_fp32: hold the masters of master-less bf16 slots as (model copy, residual) (see the file comment).
  // offload_pieces: 0 keeps the state on the parameters' device; k >= 1 keeps
  // it in host memory and streams each step through the device in k pieces
  // (offload_chunks() below).
  AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, int64_t state_begin = 0, int64_t state_end = -1,
        bool reuse_fp32 = false, int64_t offload_pieces = 0);

  // The flat space: params end to end in construction order; param i covers
  // [offsets()[i], offsets()[i+1]).
  int64_t numel() const { return offsets_.back(); }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t state_begin() const { return state_begin_; }
  int64_t state_end() const { return state_end_; }
  const std::vector<ParamSlot>& params() const { return params_; }
  std::vector<ParamSlot>& params() { return params_; }
  const AdamWConfig& config() const { return cfg_; }

  // One optimizer step over the owned range at learning rate lr.
  void step(double lr) { step_range(state_begin_, state_end_, lr); }
  // One optimizer step over [begin, end) only, which must lie inside the owned
  // range. Call it once per optimizer step (the step count advances each call;
  // to update several disjoint ranges in one step, use step_ranges).
  void step_range(int64_t begin, int64_t end, double lr);
  void step_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges, double lr);
  int64_t step_count() const { return step_; }

  // Rounds master into model_copy for the elements of [begin, end) (done by
  // step_range for the stepped range; exposed for loads and DP all-gathers).
  // Slots with a held master refresh only the owned part of the range.
  void refresh_model_copies(int64_t begin, int64_t end);

  // m and v over the owned range: f32 [state_end - state_begin], OptimizerState category.
  // With reuse_fp32_param bit 31 of exp_avg_sq carries the split's flags: read
  // v through state() (or exp_avg_sq_clean()), which clears them.
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  Tensor exp_avg_sq_clean() const;  // a copy without the flags (= exp_avg_sq() without reuse)

  // Held masters: true when some slot's master is held by the optimizer
  // (as f32, or with reuse_fp32_param as residuals).
  bool holds_masters() const { return held_any_; }
  bool reuses_fp32() const { return reuse_; }
  // The held masters end to end: f32 [owned elements of the held slots]
  // (= [state_end - state_begin] when every slot is held), OptimizerState category.
  // With reuse_fp32_param: the residuals, 16-bit (BF16-typed) of the same layout.
  const Tensor& held_masters() const { return held_; }
  // The flat range [lo, hi) of param i this rank steps (empty: lo == hi).
  std::pair<int64_t, int64_t> owned_of(size_t i) const;
  // Param i's f32 master over owned_of(i), as a view (the slot's master or
  // the held buffer): what this rank can read or save of the master. With
  // reuse_fp32_param: a recovered copy (MemCategory::Other), not a view.
  Tensor master_view(size_t i) const;
  // The first optimizer-state tensor holding a NaN or Inf ("exp_avg",
  // "exp_avg_sq", "master.<name>"), "" when all are finite.
  std::string first_non_finite() const;
  // Seeds param i's master from a full f32 tensor of its numel (a checkpoint's
  // "master.<name>", or a master kept elsewhere): copies the whole tensor into
  // a full master, or the owned slice into the held one, and refreshes the
  // model copy over it.
  void set_master(size_t i, const Tensor& full);
  // Layout-free checkpoints (train/optimizer_checkpoint.h): writes param i's
  // moments over owned_of(i), m and v f32 of (hi - lo) elements each (v
  // without reuse_fp32_param's flags). With reuse_fp32_param call it before
  // set_master(i, ...), whose split writes the flags into v.
  void set_moments(size_t i, const Tensor& m, const Tensor& v);
  // Restores the step count (the bias corrections' t) of a checkpoint.
  void set_step_count(int64_t step);

  OptimizerMemory memory() const;

  // Optimizer-state offload (Megatron's optimizer_offload) and MindSpeed's
  // swap optimizer, for parameters on a device: m, v and the held masters move
  // to host memory, and every step streams them through the device in
  // `chunks` pieces of the owned range (each piece copied in, stepped, copied
  // out), so the device holds 1/chunks of the state during a step and none
  // between steps. The same kernel on the same values: bit-identical to the
  // state kept on the device. chunks = 1 is plain offload. Full masters a slot
  // brings (an f32 weight is its own master) stay where they are, so the
  // caller holds bf16 weights' masters here (masters left undefined) to move
  // them too. A no-op for parameters on the CPU (host memory already). Not
  // with reuse_fp32_param (MindSpeed refuses the pair). Set by the
  // constructor's offload_pieces, so the state is never whole on the device.
  // 0: the state lives on the parameters' device; else the pieces a step streams.
  int64_t offload_chunks() const { return swap_chunks_; }

  // Checkpoint state: "exp_avg", "exp_avg_sq" (f32 [owned numel], borrowed, not
  // copied), "step" (i64 [1]) and, with held masters, "master" (f32
  // [held_masters().numel()], borrowed: the owned master slice; full masters
  // are saved by the caller as "master.<name>"). With reuse_fp32_param the
  // same names and format: "master" is the recovered f32 slice and
  // "exp_avg_sq" v without the flags (both fresh copies), so the file is the
  // one the distributed optimizer writes without reuse. Metadata records the layout
  // (parameter names and sizes, owned range, "master": "held" with the held
  // parameter set) and hyperparameters so a load into a different layout
  // (another dp size, or with/without the distributed optimizer) fails clearly.
  OptimizerState state() const;
  // Copies a saved state in (held masters included, refreshing the owned
  // model copy elements); `origin` (a path) prefixes error messages.
  Status load_state(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata,
                    const std::string& origin);

 private:
  // Where step_one finds the state: m and v from flat index `begin`, and
  // the held elements from held_ index `held_begin`. The whole state is one
  // window (whole()); the swap optimizer steps device copies of pieces of it.
  struct StateWindow {
    Tensor m, v;   // [elements from begin]
    Tensor held;   // [held elements from held_begin]; undefined when none
    int64_t begin = 0, held_begin = 0;
  };
  StateWindow whole() const { return {m_, v_, held_, state_begin_, 0}; }
  void step_one(int64_t begin, int64_t end, double lr, const StateWindow& w);
  // step_one over [begin, end) with the state in host memory, piece by piece
  // through the device, the copies overlapped with the steps (TransferQueue).
  void step_swapped(int64_t begin, int64_t end, double lr);
  // View of the held elements of param i over the flat range [lo, hi) in window w.
  Tensor held_range(const StateWindow& w, size_t i, int64_t lo, int64_t hi) const;
  // The held_ indices [h0, h1) of the held elements of the flat range [lo, hi) (contiguous: held_ is in flat order).
  std::pair<int64_t, int64_t> held_span(int64_t lo, int64_t hi) const;
  // View of param i's f32 master over the flat range [lo, hi) (inside owned_of(i) for held slots).
  Tensor master_range(size_t i, int64_t lo, int64_t hi) const;
  // reuse_fp32_param: views over the flat range [lo, hi) (inside owned_of(i)) of
  // param i's model copy, residual and exp_avg_sq.
  Tensor copy_range(size_t i, int64_t lo, int64_t hi) const;
  Tensor residual_range(size_t i, int64_t lo, int64_t hi) const;
  Tensor recovered_masters() const;  // reuse_fp32_param: the held slots' f32 masters, laid out as held_
  Tensor v_range(int64_t lo, int64_t hi) const { return v_.slice_rows(lo - state_begin_, hi - state_begin_); }
  std::string layout_string() const;
  std::string held_string() const;
  // An uninitialised state tensor where the state lives: the device, or with
  // offload pinned host memory (the pieces stream from it at full speed).
  Tensor state_tensor(Shape shape, DType dt) const {
    return swap_chunks_ > 0 ? Tensor::empty_pinned(std::move(shape), dt, MemCategory::OptimizerState)
                            : Tensor::empty(std::move(shape), dt, MemCategory::OptimizerState, state_device_);
  }

  std::vector<ParamSlot> params_;
  AdamWConfig cfg_;
  std::vector<int64_t> offsets_;
  int64_t state_begin_ = 0, state_end_ = 0;
  Tensor m_, v_;                   // [state_end - state_begin]
  Tensor held_;                    // [sum of owned elements of held slots]: f32 masters, or residuals (reuse_)
  std::vector<int64_t> held_off_;  // per param: offset in held_ of owned_of(i).first; -1 = not held
  bool held_any_ = false;          // some slot is held (possibly with no owned elements on this rank)
  bool reuse_ = false;             // held slots keep (bf16 model copy, residual) instead of an f32 master
  int64_t step_ = 0;
  // Where the slots' tensors live (one device for all, checked): the moments,
  // held masters and every scratch buffer go there too.
  Device device_ = Device::CPU;
  int64_t swap_chunks_ = 0;           // the constructor's offload_pieces (0 on the CPU)
  Device state_device_ = Device::CPU;  // where m_, v_ and held_ live

};

}  // namespace kestrel::optim
