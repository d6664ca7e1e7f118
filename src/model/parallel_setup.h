// Glue between the process grid (parallel/) and the model: the ModelParallel
// a grid implies, and the model's parameters as the data-parallel layer sees
// them (flat gradient buckets, backward stages, grad-norm counting).
#pragma once
#include <vector>

#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/pipeline_layout.h"

namespace kestrel::model {

// tp group and sequence parallelism of the grid.
ModelParallel model_parallel_for(const parallel::ProcessGrid& grid);

// Context parallelism of the grid (cp > 1; nothing at cp = 1): the cp group
// and the algorithm's Ulysses / ring groups (parallel::make_cp_groups).
// ulysses_degree_in_cp is read for the hybrid only. Collective over the world.
void set_context_parallel(ModelParallel& p, const comm::World& world, const parallel::ProcessGrid& grid,
                          parallel::CpAlgo algo, int ulysses_degree_in_cp);

// Every parameter with its backward stage (CausalLM::grad_stage) and whether it
// counts in the global grad norm on this rank (Param::norm_counted).
std::vector<parallel::DpParam> dp_params(CausalLM& model);

// This pipeline rank's slice(s) (parallel::pipeline_chunks()[pp rank]) as
// model options: the chunks' layer ranges, the embedding and the head.
void set_pipeline_stage(ModelOptions& o, const std::vector<parallel::StageChunk>& mine);

// What validate() needs to know about the model. pipelined: the layer
// split is checked by parallel::pipeline_chunks (uneven stages, noop
// layers), so the plain "layers divide by pp" rule is left out.
parallel::ModelFacts model_facts(const io::ModelConfig& cfg, bool pipelined = false);

// Expert parallelism's token dispatch (moe_token_dispatcher_type,
// moe_hierarchical_alltoallv), after p.ep is set: refuses the hierarchical
// exchange with the allgather dispatcher, and with hierarchical_alltoallv
// builds p.ep_hier over p.ep's nodes (comm::node_ids). Collective over the
// world when p.ep has more than one rank (every rank calls it with the same
// options); nothing to build at ep = 1, where the options change nothing.
void set_expert_dispatch(ModelParallel& p, const comm::World& world, const MoeTrainOptions& moe);

}  // namespace kestrel::model
