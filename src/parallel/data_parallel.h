// Data parallelism over a dp group (Megatron's DistributedDataParallel +
// DistributedOptimizer, distributed/param_and_grad_buffer.py and
// optimizer/distrib_optimizer.py, on blocking collectives).
//
// Gradients live in one flat f32 buffer, parameters in REVERSE registration
// order (that approximates the order backward finishes them), padded at the
// end to a multiple of dp. The model's Param::grad tensors become views into
// it. The buffer is cut into buckets of ~bucket_bytes in that order. Each
// parameter names the backward "stage" after which its gradient is final; the
// model reports stages through a hook (CausalLM::set_grad_ready_hook) and
// grads_ready() launches every bucket whose parameters are all final, so the
// collectives of the last layers run while (with blocking MPI: between) the
// backward of the earlier layers. finish_grad_sync() launches what is left.
//
// Gradients are pre-scaled by 1/dp (average) or summed. Without the
// distributed optimizer a bucket is all-reduced. With it (ZeRO-1), rank r owns
// the contiguous range [r*S, (r+1)*S) of the padded flat space (S = padded/dp):
// a bucket is reduced onto its owners by an all-to-all-v of the owners' pieces
// followed by a local sum in rank order (a reduce-scatter whose blocks follow
// the ownership, not the bucket), the optimizer keeps state only for the owned
// range (optim::AdamW's state_begin/state_end), and gather_params() all-gathers
// the updated parameters from their owners. Ownership is contiguous (not
// Megatron's per-bucket shards) because AdamW's m/v are one contiguous range.
//
// Mixed precision (bf16/f16 weights): the flat parameter buffer is in the
// model dtype, so gather_params() moves 2 bytes per parameter. Build the
// AdamW slots with model_copy = *weight and no master: the optimizer then
// holds the f32 master for the owned range only (optim/adamw.h), and the
// optimizer state is 12/dp bytes per parameter instead of 4 + 8/dp
// (AdamW::memory() reports it). Without the distributed optimizer every rank
// keeps full masters (12 bytes per parameter).
//
// reuse_fp32_param (optim/adamw.h): the masters are the bf16 buffer's values
// plus a 16-bit residual the optimizer holds for the owned range only
// (10/dp bytes per parameter). Nothing changes here: gather_params() still
// all-gathers the bf16 buffer, i.e. only the high halves travel; each rank's
// own shard comes back with the bits it sent, so its (bf16, residual) pairs
// stay exact, and the residuals never leave their rank.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace kestrel::parallel {

struct DpParam {
  std::string name;
  Tensor* weight = nullptr;    // the model's parameter tensor (a view into the flat parameter buffer
                               // replaces it when the distributed optimizer is on)
  Tensor* grad = nullptr;      // replaced by a view into the flat gradient buffer
  int64_t ready_stage = 0;     // backward stage after which this gradient is final
  bool count_in_norm = true;   // false for tensor-parallel duplicates on all but one rank
};

struct DpOptions {
  int64_t bucket_bytes = 25 << 20;     // Megatron/PyTorch DDP default order of magnitude
  bool distributed_optimizer = false;  // use_distributed_optimizer
  bool average = true;                 // pre-scale grads by 1/dp (Megatron's gradient_scaling_factor)
};

class DataParallel {
 public:
  // Allocates the flat buffers and re-points every param's grad (and, with the
  // distributed optimizer, weight) into them, copying current values.
  DataParallel(std::vector<DpParam> params, comm::ProcessGroup& dp, DpOptions opts = {});
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  comm::ProcessGroup& group() const { return *dp_; }
  const DpOptions& options() const { return opts_; }
  // Parameters in flat order (build optim::AdamW's ParamSlots in this order so
  // its flat space is this one) and each one's flat offset.
  const std::vector<DpParam>& flat_params() const { return flat_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t numel() const { return offsets_.back(); }
  int64_t padded_numel() const { return padded_; }
  // The range this rank reduces and steps: the owned shard clipped to numel()
  // with the distributed optimizer, else everything.
  std::pair<int64_t, int64_t> owned_range() const;

  struct Bucket {
    int64_t begin = 0, end = 0;  // flat range (the last bucket includes the padding)
    size_t first = 0, last = 0;  // flat_params() indices [first, last)
    bool launched = false;
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Zeroes the flat gradient buffer.
  void zero_grads();
  // Call before the backward of the last micro-batch of a step (earlier
  // micro-batches only accumulate); resets which buckets were launched.
  void start_grad_sync();
  // The backward reports that every gradient of `stage` is final.
  void grads_ready(int64_t stage);
  // Reduces every bucket not yet launched. Afterwards the owned range holds
  // the gradient averaged (or summed) over dp.
  void finish_grad_sync();

  // Global L2 norm of the gradients of the whole model: squares of the owned
  // range (tp duplicates skipped) summed over dp (distributed optimizer only:
  // without it every dp rank holds the same full gradients) and over `tp`
  // (nullptr: no tensor parallelism), then over the pipeline stages `pp`
  // (nullptr: no pipeline). Sums in double (ops::sum_squares per
  // parameter segment, as optim::clip_grad_norm sums per tensor), combined in
  // rank order.
  double grad_norm(comm::ProcessGroup* tp, comm::ProcessGroup* pp = nullptr) const;
  // grad_norm's sum of squares before the root (for callers that add other
  // parts, e.g. the experts' under expert parallelism).
  double grad_sq(comm::ProcessGroup* tp, comm::ProcessGroup* pp = nullptr) const;
  // grads *= coef over the owned range.
  void scale_grads(float coef);
  // Clips like torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6),
  // applied when < 1. Returns the pre-clip norm (non-finite: grads untouched).
  double clip_grad_norm(double max_norm, comm::ProcessGroup* tp, comm::ProcessGroup* pp = nullptr);

  // Distributed optimizer: after the optimizer stepped the owned range (and
  // rounded its held masters into the owned model-copy elements), sends every
  // rank the updated parameters (all-gather of the flat parameter buffer, in
  // the model dtype). A no-op without the distributed optimizer.
  void gather_params();
  // Checking/saving: all-gathers the owned gradient shards so every rank holds
  // the full reduced gradient. A no-op without the distributed optimizer.
  void gather_grads();

  const Tensor& grad_buffer() const { return grads_; }

 private:
  void launch(Bucket& b);
  void reduce_to_owners(int64_t begin, int64_t end);

  comm::ProcessGroup* dp_;
  DpOptions opts_;
  std::vector<DpParam> flat_;
  std::vector<int64_t> offsets_;
  int64_t padded_ = 0, shard_ = 0;
  Tensor grads_;   // f32 [padded]
  Tensor params_;  // [padded] in the parameters' dtype, distributed optimizer only
  std::vector<Bucket> buckets_;
  std::vector<int64_t> done_stages_;
  bool syncing_ = false;
};

// The sum over the group of one double per rank, added in rank order (identical
// on every rank; the doubles travel as raw 8-byte patterns).
double sum_over(comm::ProcessGroup& g, double local);

}  // namespace kestrel::parallel
