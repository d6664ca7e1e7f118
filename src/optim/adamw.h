// AdamW over f32 master parameters, with the optimizer state kept as flat
// contiguous buffers so a distributed optimizer can shard the flat element
// space across data-parallel ranks (ZeRO-1 style): each rank owns a
// [state_begin, state_end) range of the flat space, allocates m and v only
// for that range, and steps only it.
//
// Update, per element, exactly as torch.optim.AdamW (foreach=False,
// capturable=False), with t the step count after increment:
//   p <- p * (1 - lr * wd)                       (decoupled decay, if enabled)
//   m <- m + (1 - beta1) * (g - m)               (torch's lerp)
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Scalars (bias corrections, step size) are computed in double and applied in
// f32, as torch does for f32 tensors.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kestrel::optim {

// One trainable parameter as the optimizer sees it.
struct ParamSlot {
  std::string name;
  Tensor master;      // f32, updated in place
  Tensor grad;        // f32, same numel as master
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

class AdamW {
 public:
  // state_begin/state_end: the owned slice of the flat space; -1 = everything.
  AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, int64_t state_begin = 0, int64_t state_end = -1);

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
  void refresh_model_copies(int64_t begin, int64_t end);

  // m and v over the owned range: f32 [state_end - state_begin], OptimizerState category.
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

  // Checkpoint state: "exp_avg", "exp_avg_sq" (f32 [owned numel], borrowed, not
  // copied) and "step" (i64 [1]); metadata records the layout (parameter
  // names and sizes, owned range) and hyperparameters so a load into a
  // different layout fails clearly.
  OptimizerState state() const;
  // Copies a saved state in; `origin` (a path) prefixes error messages.
  Status load_state(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata,
                    const std::string& origin);

 private:
  void step_one(int64_t begin, int64_t end, float lr_wd_keep, float beta1, float beta2, float step_size,
                float bc2_sqrt, float eps, double lr);
  std::string layout_string() const;

  std::vector<ParamSlot> params_;
  AdamWConfig cfg_;
  std::vector<int64_t> offsets_;
  int64_t state_begin_ = 0, state_end_ = 0;
  Tensor m_, v_;  // [state_end - state_begin]
  int64_t step_ = 0;
};

}  // namespace kestrel::optim
