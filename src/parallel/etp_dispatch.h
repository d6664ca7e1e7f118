// Expert tensor parallelism's row exchange (Megatron's ETP inside the MoE
// token dispatcher): each expert's FFN is split over the etp group (gate/up
// by output columns, down by input columns), so every rank of the group must
// run its shard on every row routed to the expert from any rank of the group.
//
//   layout = etp_layout(etp, local_group_sizes)   one all-gather of the counts
//   xa     = etp_gather(etp, layout, xr)          [Nr, D] -> [Na, D]: every rank's rows,
//                                                  sorted by local expert, then source rank
//   ... grouped GEMMs of the expert shards on xa (layout.group_sizes): partial outputs ...
//   yr     = etp_reduce_scatter(etp, layout, ya)  [Na, D] partial sums -> [Nr, D] this
//                                                  rank's rows, summed over the group
//
// etp_reduce_scatter is etp_gather's adjoint: the backward of a gather is a
// reduce-scatter of the gradients and the other way round. Within an expert
// the rows keep their source ranks' order (rank 0's first), so the grouped
// GEMM sees them in a fixed order whatever the timing.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace kestrel::parallel {

struct EtpLayout {
  int etp = 1, rank = 0;
  std::vector<int64_t> rows;         // [etp] rows each rank brings
  int64_t block_rows = 0;            // each rank's block in the padded all-gather (the largest rank's rows)
  std::vector<int64_t> group_sizes;  // [experts] rows of each local expert over the group
  Tensor sort_index;                 // i32 [Na]: row of the padded gathered buffer of each sorted row
  int64_t gathered() const;          // Na
};

// Collective over etp: all-gathers each rank's local_group_sizes [experts]
// (the rows it holds per local expert, sorted by local expert; host counts
// over the host transport). sort_index is uploaded to `dev`, the rows' device.
EtpLayout etp_layout(comm::ProcessGroup& etp, const std::vector<int64_t>& local_group_sizes,
                     Device dev = Device::CPU);
// rows [Nr, D] sorted by local expert -> [Na, D] on rows' device. Collective.
Tensor etp_gather(comm::ProcessGroup& etp, const EtpLayout& L, const Tensor& rows,
                  MemCategory cat = MemCategory::Activations);
// all [Na, D] (this rank's partial values of every row) -> [Nr, D] the sum
// over the group of this rank's rows. Collective. Any float dtype (summed in it).
Tensor etp_reduce_scatter(comm::ProcessGroup& etp, const EtpLayout& L, const Tensor& all,
                          MemCategory cat = MemCategory::Activations);

}  // namespace kestrel::parallel
