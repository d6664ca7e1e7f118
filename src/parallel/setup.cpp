#include "parallel/setup.h"

namespace kestrel::parallel {

ParallelDims dims_for(int tp, bool sequence_parallel) {
  ParallelDims d;
  d.tp = tp;
  d.sequence_parallel = sequence_parallel && tp > 1;  // Megatron disables SP at tp=1
  return d;
}

Result<std::unique_ptr<ProcessGrid>> make_process_grid(const comm::World& world, const ParallelDims& dims,
                                                       const ModelFacts& facts, Device device) {
  Status s = validate(dims, world.size(), facts);
  if (!s.is_ok()) return s;
  s = check_supported(dims);
  if (!s.is_ok()) return s;
  return std::make_unique<ProcessGrid>(world, dims, device);
}

}  // namespace kestrel::parallel
