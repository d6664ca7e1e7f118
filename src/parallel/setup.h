// Building the process grid a command runs on, from the live comm::World.
// What a CLI command does for `--tp N [--sequence-parallel]` under mpirun:
//   auto grid = parallel::make_process_grid(*comm::World::current(), parallel::dims_for(N, sp), facts);
//   model::ModelOptions opts; opts.parallel = model::model_parallel_for(*grid);   (model/parallel_setup.h)
//   ... load, run; only grid->world_rank() == 0 writes outputs.
#pragma once
#include <memory>

#include "comm/world.h"
#include "parallel/grid.h"

namespace kestrel::parallel {

// tp (and sequence parallelism); dp is derived from the world size.
ParallelDims dims_for(int tp, bool sequence_parallel = false);

// Validates dims against the world and the model, rejects what the engine
// cannot run yet (check_supported), and builds the groups (collective over the
// world: every rank calls it). Errors name the sizes involved. `device`: where
// the models' tensors live (ProcessGrid: NCCL-backed groups on Device::CUDA).
Result<std::unique_ptr<ProcessGrid>> make_process_grid(const comm::World& world, const ParallelDims& dims,
                                                       const ModelFacts& facts = {}, Device device = Device::CPU);

}  // namespace kestrel::parallel
