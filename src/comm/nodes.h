// Which machine each rank runs on, for communication that treats links
// within a node and across nodes differently (comm/hierarchical_a2a.h).
#pragma once
#include <vector>

#include "comm/world.h"

namespace kestrel::comm {

// Collective over the world: the node (machine) of every world rank, numbered
// 0, 1, ... in the order of each node's lowest rank. Under MPI the ranks that
// share memory (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED); one process:
// {0}. TEST ONLY: KESTREL_TEST_NODES="0,0,1,1" (one node id per world rank)
// stands in for the machines, so tests run several "nodes" on one; a list
// that does not give every rank a node is an error.
std::vector<int> node_ids(const World& world);

// This rank's place among the ranks of its node (0, 1, ...): what picks its
// GPU (local rank % devices). From the launcher when it says
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID), else counted
// from node_ids(world), which makes it collective over the world then.
int local_rank(const World& world);

}  // namespace kestrel::comm
