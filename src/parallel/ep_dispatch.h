// Expert parallelism's all-to-all token dispatcher (Megatron's
// MoEAlltoAllTokenDispatcher), as data movement between ranks: the routed
// experts are split over the ep group in consecutive blocks (rank j holds
// experts j*E/ep .. (j+1)*E/ep - 1), and each rank's tokens, already permuted
// into expert-major order over all E experts (ops::moe_permute_fwd), go to
// the ranks holding their experts and come back.
//
//   layout   = ep_dispatch_layout(ep, tokens_per_expert)   one all-to-all of the counts
//   xr       = ep_dispatch(ep, layout, xs)                 [N, D] -> [Nr, D] rows of this rank's
//                                                          experts, sorted by local expert
//   ... grouped GEMMs of the local experts on xr (layout.local_group_sizes) ...
//   ys       = ep_combine(ep, layout, yr)                  [Nr, D] -> [N, D] back in xs's order
//
// Within a local expert the received rows keep their source ranks' order
// (rank 0's rows first), so the local experts see their tokens in a fixed
// order whatever the timing. Both calls only move rows: ep_combine is
// ep_dispatch's adjoint (and inverse), so the backward of a dispatch is a
// combine of the gradients and the other way round.
//
// With a HierarchicalA2a of the ep group the row exchange goes through its
// three steps (moe_hierarchical_alltoallv); what arrives is the same.
//
// A layout made for the all-gather dispatcher (parallel/ep_allgather.h,
// moe_token_dispatcher_type=allgather) makes ep_dispatch / ep_combine
// all-gather and reduce-scatter instead; the rows delivered are the same bits.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "comm/hierarchical_a2a.h"

namespace kestrel::parallel {

// Megatron's moe_token_dispatcher_type (flex, DeepEP's, is not built).
enum class EpDispatcher { AllToAll, AllGather };

struct EpLayout {
  EpDispatcher dispatcher = EpDispatcher::AllToAll;
  int ep = 1, rank = 0;
  int64_t experts_per_rank = 0;         // E / ep
  std::vector<int64_t> send_rows;       // [ep] rows this rank sends each rank (its tokens for that rank's experts)
  std::vector<int64_t> recv_rows;       // [ep] rows each rank sends this one
  std::vector<int64_t> local_group_sizes;  // [E/ep] rows of each local expert after the sort
  std::vector<int64_t> recv_counts;     // [ep * E/ep] rows rank s sends for local expert e (s-major)
  Tensor sort_index;    // i32 [Nr]: received row of each sorted row (a gather_rows index)
  Tensor unsort_index;  // i32 [Nr]: sorted row of each received row
  // All-gather dispatcher only (sort_index / unsort_index undefined):
  int64_t block_rows = 0;  // Nb: each rank's block in the gathered buffer (the largest rank's N)
  Tensor keep_index;       // i32 [Nr]: row of the gathered [ep * Nb, D] buffer of each sorted row
  int64_t received() const;  // Nr
};

// Collective over the ep group (AllToAll: one all-to-all of E/ep counts per
// rank; AllGather: one all-gather of E counts, ep_allgather_layout).
// tokens_per_expert: [E] rows of xs per expert (ops::MoeRouting::group_sizes);
// E must divide by the group size.
// E / ep, the routed experts each rank holds; fails naming both when E does not split over the group.
int64_t experts_per_rank(int64_t num_experts, int ep);

// The counts both dispatchers derive alike (no communication): ep, rank,
// experts_per_rank, send_rows from this rank's tokens_per_expert [E], and
// recv_counts [ep * E/ep] (rank s's rows for local expert e, s-major) with
// recv_rows and local_group_sizes summed from them. Fails naming the sizes
// when E does not split over the group.
EpLayout ep_layout_from_counts(int ep, int rank, const std::vector<int64_t>& tokens_per_expert,
                               std::vector<int64_t> recv_counts);

// The sort tables (computed on the host from the host counts) are uploaded
// to `dev`, the device of the rows they will move.
EpLayout ep_dispatch_layout(comm::ProcessGroup& ep, const std::vector<int64_t>& tokens_per_expert,
                            EpDispatcher dispatcher = EpDispatcher::AllToAll, Device dev = Device::CPU);

// xs [N, D] expert-major over all E experts -> [Nr, D] sorted by local expert,
// on xs's device (the layout's tables must be there). Collective. hier: the all-to-all's exchange only (an all-gather layout refuses one).
Tensor ep_dispatch(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& xs,
                   const comm::HierarchicalA2a* hier = nullptr, MemCategory cat = MemCategory::Activations);
// yr [Nr, D] sorted by local expert -> [N, D] in xs's order. Collective.
Tensor ep_combine(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& yr,
                  const comm::HierarchicalA2a* hier = nullptr, MemCategory cat = MemCategory::Activations);

}  // namespace kestrel::parallel
