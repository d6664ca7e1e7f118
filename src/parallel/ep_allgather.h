// Expert parallelism's all-gather token dispatcher (Megatron's
// MoEAllGatherTokenDispatcher, moe_token_dispatcher_type=allgather): the
// simple reference next to the all-to-all one (parallel/ep_dispatch.h), with
// the same EpLayout and the same results bit for bit.
//
//   layout   one all-gather of every rank's [E] per-expert counts -> [ep, E]
//   dispatch xs [N, D] (expert-major over all E experts) padded to [Nb, D],
//            Nb = the largest rank's N; all-gathered to [ep * Nb, D]
//            (rank s's block at rows s*Nb ..); this rank keeps its local
//            experts' rows -> [Nr, D] sorted by local expert, within an
//            expert source rank 0's rows first: exactly what the all-to-all
//            delivers (EpLayout::sort_index's order).
//   combine  yr [Nr, D] scattered into a zero [ep * Nb, D] at the rows the
//            dispatch took them from, reduce-scattered (sum) back: each rank
//            gets its own [Nb, D] block, of which the first N rows are its
//            rows. Every gathered row has exactly one non-zero contribution
//            (its expert's rank), so the sum adds exact zeros: bit-identical
//            to the all-to-all's combine.
//
// The combine is the dispatch's adjoint (the adjoint of an all-gather is a
// sum reduce-scatter, of a row gather a row scatter into zeros), so, as with
// the all-to-all, the backward of one is the other.
//
// Megatron gathers the tokens [T, D] with the routing map and probabilities
// and permutes on the expert side; Kestrel gathers the permuted rows
// [N = T x topk, D] so the combine weights stay on the tokens' rank and the
// arithmetic is the all-to-all path's. Either way every rank receives every
// rank's data: (ep - 1) x Nb x D elements per rank each way, against the
// all-to-all's rows addressed to other ranks only.
#pragma once
#include "parallel/ep_dispatch.h"

namespace kestrel::parallel {

// Collective over the ep group: one all-gather of the [E] counts. The
// layout's common fields equal ep_dispatch_layout's; block_rows and
// keep_index are the gathered buffer's.
// keep_index is uploaded to `dev`, the rows' device.
EpLayout ep_allgather_layout(comm::ProcessGroup& ep, const std::vector<int64_t>& tokens_per_expert,
                             Device dev = Device::CPU);

// xs [N, D] -> [Nr, D] sorted by local expert. Collective (one all-gather of [Nb, D] per rank).
Tensor ep_allgather_dispatch(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& xs,
                             MemCategory cat = MemCategory::Activations);
// yr [Nr, D] -> [N, D] in xs's order. Collective (one reduce-scatter of [ep * Nb, D]).
Tensor ep_allgather_combine(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& yr,
                            MemCategory cat = MemCategory::Activations);

}  // namespace kestrel::parallel
