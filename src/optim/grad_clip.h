// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ (L2):
// total = sqrt(sum over all grads of g^2), coef = max_norm / (total + 1e-6),
// grads *= min(coef, 1). Squares are accumulated in double in fixed-size
// chunks summed in order, so the norm does not depend on the thread count.
#pragma once
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "optim/adamw.h"

namespace kestrel::optim {

struct ClipResult {
  double norm = 0;      // the pre-clip global L2 norm
  double coef = 1;      // the factor applied to the grads (1 when not clipped)
  bool finite = true;   // false: the norm is NaN/Inf, grads left untouched; skip the step
  bool clipped = false;
};

// Sum of squares of f32 grads on this rank, in double.
double grad_sq_sum(const std::vector<Tensor>& grads);

// The global L2 norm. With `pg`, every rank's squared sum is combined in rank
// order (identical on all ranks); the grads must be disjoint across the ranks
// of pg (e.g. the DP shards of a distributed optimizer, or TP shards with the
// replicated parameters counted on one rank only).
double global_grad_norm(const std::vector<Tensor>& grads, comm::ProcessGroup* pg = nullptr);

// Computes the global norm and scales the grads in place when it exceeds
// max_norm (max_norm <= 0: measure only). A non-finite norm is reported, not
// applied: the caller decides to skip the optimizer step.
ClipResult clip_grad_norm(const std::vector<Tensor>& grads, double max_norm, comm::ProcessGroup* pg = nullptr);
ClipResult clip_grad_norm(const std::vector<ParamSlot>& params, double max_norm, comm::ProcessGroup* pg = nullptr);

}  // namespace kestrel::optim
