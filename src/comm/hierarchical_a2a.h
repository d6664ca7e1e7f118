// Hierarchical all-to-all-v (MindSpeed's moe-hierarchical-alltoallv): the
// exchange of expert parallelism's tokens done in three steps so that only one
// message crosses each pair of nodes.
//
//   1. Gather within the node: every rank's send buffer goes to its node's
//      leader (the node's lowest group rank), over the node's group.
//   2. Exchange across nodes: each leader sends every other leader, in one
//      message, everything its node's ranks send to that node's ranks.
//   3. Scatter within the node: each leader hands its ranks what arrived for
//      them, ordered by source rank.
//
// What each rank receives is exactly group.all_to_allv's (the same bytes in
// the same order: blocks by source group rank), so the flat call is the
// reference. The element counts of every pair travel first, in one
// all-gather of the counts matrix over the group (n^2 integers).
//
// Nodes come from node_ids (comm/nodes.h) (MPI's shared-memory split; tests
// give several "nodes" on one machine with KESTREL_TEST_NODES). A group on
// one node degenerates to gather + scatter through its leader; use the flat
// call there (HierarchicalA2a::worth_it).
#pragma once
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "comm/world.h"
#include "core/tensor.h"

namespace kestrel::comm {

// What one exchange sent, by this rank, for the measurements: messages and
// bytes to ranks on other nodes (the leaders' step 2), and within the node.
struct A2aTraffic {
  int64_t inter_node_messages = 0;
  double inter_node_bytes = 0;
  int64_t intra_node_messages = 0;
  double intra_node_bytes = 0;
};

class HierarchicalA2a {
 public:
  // Collective over the world (every world rank calls it, in the same order;
  // ranks outside `group` pass nullptr): the node structure of `group`.
  HierarchicalA2a(const World& world, std::shared_ptr<ProcessGroup> group);

  int nodes() const { return num_nodes_; }
  bool is_leader() const { return leaders_ != nullptr; }
  // More than one node: the three steps save messages.
  bool worth_it() const { return num_nodes_ > 1; }
  const std::vector<int>& node_of() const { return node_of_; }  // [group size] node of each group rank

  // group.all_to_allv's semantics: send holds sum(send_counts) elements,
  // blocks by destination group rank; recv_counts[s] elements arrive from
  // group rank s, blocks by source rank. Collective over the group. traffic
  // (optional) receives this rank's messages.
  void all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DType dtype, A2aTraffic* traffic = nullptr) const;
  // The same on tensors' buffers (counts in elements of their dtype; send and recv hold their sums).
  void all_to_allv(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                   const std::vector<int64_t>& recv_counts, A2aTraffic* traffic = nullptr) const;

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<ProcessGroup> node_;     // this rank's node's ranks of the group, by group rank
  std::shared_ptr<ProcessGroup> leaders_;  // the nodes' leaders, by node; nullptr on other ranks
  std::vector<int> node_of_;                     // [n] node of each group rank
  std::vector<std::vector<int>> members_;        // [nodes] group ranks of each node, ascending
  int num_nodes_ = 1;
};

// The flat exchange's traffic by this rank (what group.all_to_allv sends):
// one message per destination rank with a non-empty block, counted as
// inter-node when the destination's node differs.
A2aTraffic flat_a2a_traffic(const std::vector<int>& node_of, int rank, const std::vector<int64_t>& send_counts,
                            DType dtype);

}  // namespace kestrel::comm
