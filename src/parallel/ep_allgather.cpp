#include "parallel/ep_allgather.h"

#include <algorithm>
#include <numeric>

#include "ops/copy.h"

namespace kestrel::parallel {

EpLayout ep_allgather_layout(comm::ProcessGroup& ep, const std::vector<int64_t>& tpe, Device dev) {
  const int n = ep.size();
  const int64_t E = int64_t(tpe.size()), k = experts_per_rank(E, n);
  // counts[s * E + g]: rank s's rows for expert g. [ep, E]
  std::vector<int64_t> counts(size_t(n * E), 0);
  ep.all_gather(tpe.data(), counts.data(), E, DType::I64);
  // The all-to-all's fields from the same counts: what it would send and receive.
  std::vector<int64_t> recv_counts(static_cast<size_t>(E), 0);  // [ep * k]: rank s's rows for local expert e
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < k; ++e) recv_counts[size_t(s * k + e)] = counts[size_t(s * E + ep.rank() * k + e)];
  EpLayout L = ep_layout_from_counts(n, ep.rank(), tpe, std::move(recv_counts));
  L.dispatcher = EpDispatcher::AllGather;
  std::vector<int64_t> rows_of(size_t(n), 0);  // [ep] N of each rank
  for (int s = 0; s < n; ++s)
    for (int64_t g = 0; g < E; ++g) rows_of[size_t(s)] += counts[size_t(s * E + g)];
  L.block_rows = *std::max_element(rows_of.begin(), rows_of.end());
  // keep[pos]: gathered row of sorted row pos (local expert-major, then source rank).
  const int64_t Nr = L.received();
  std::vector<int32_t> keep(static_cast<size_t>(Nr));
  int64_t pos = 0;
  for (int64_t e = 0; e < k; ++e) {
    const int64_t g = L.rank * k + e;
    for (int s = 0; s < L.ep; ++s) {
      // Rank s's rows are expert-major: expert g's start after its rows of experts 0 .. g-1.
      const int64_t* c = counts.data() + s * E;
      const int64_t first = int64_t(s) * L.block_rows + std::accumulate(c, c + g, int64_t(0));
      for (int64_t r = 0; r < c[g]; ++r) keep[size_t(pos++)] = int32_t(first + r);
    }
  }
  KS_CHECK(int64_t(L.ep) * L.block_rows < (int64_t(1) << 31), "allgather dispatcher: ", L.ep, " x ", L.block_rows,
           " gathered rows exceed an i32 row index; use moe_token_dispatcher_type=alltoall");
  L.keep_index = Tensor::from_host(keep, {Nr}, MemCategory::Activations, dev);
  return L;
}

namespace {
int64_t own_rows(const EpLayout& L) { return std::accumulate(L.send_rows.begin(), L.send_rows.end(), int64_t(0)); }
}  // namespace

Tensor ep_allgather_dispatch(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& xs, MemCategory cat) {
  KS_CHECK(L.dispatcher == EpDispatcher::AllGather, "internal: ep_allgather_dispatch with an all-to-all layout");
  const int64_t N = own_rows(L), Nb = L.block_rows, Nr = L.received();
  KS_CHECK(xs.dim() == 2 && xs.size(0) == N, "ep_allgather_dispatch: ", xs.describe(), " is not the ", N,
           " permuted rows of the layout");
  const int64_t D = xs.size(1);
  Tensor block = xs;  // [Nb, D]: xs, zero rows below
  if (N < Nb) {
    block = Tensor::empty({Nb, D}, xs.dtype(), cat, xs.device());
    ops::pad_rows(xs, block, 0.f);
  }
  Tensor gathered = Tensor::empty({int64_t(L.ep) * Nb, D}, xs.dtype(), cat, xs.device());  // [ep * Nb, D]
  ep.all_gather(block, gathered);
  Tensor sorted = Tensor::empty({Nr, D}, xs.dtype(), cat, xs.device());  // [Nr, D]
  ops::gather_rows(gathered, L.keep_index, sorted);
  return sorted;
}

Tensor ep_allgather_combine(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& yr, MemCategory cat) {
  KS_CHECK(L.dispatcher == EpDispatcher::AllGather, "internal: ep_allgather_combine with an all-to-all layout");
  const int64_t N = own_rows(L), Nb = L.block_rows, Nr = L.received();
  KS_CHECK(yr.dim() == 2 && yr.size(0) == Nr, "ep_allgather_combine: ", yr.describe(), " is not the ", Nr,
           " rows this rank's experts received");
  const int64_t D = yr.size(1);
  Tensor full = Tensor::zeros({int64_t(L.ep) * Nb, D}, yr.dtype(), cat, yr.device());  // [ep * Nb, D]
  ops::scatter_rows(yr, L.keep_index, full);
  Tensor block = Tensor::empty({Nb, D}, yr.dtype(), cat, yr.device());  // [Nb, D] this rank's rows, then padding
  ep.reduce_scatter(full, block, comm::ReduceOp::Sum);
  // [N, D]: the rows, sharing the block's storage (the padding rows hold zeros and are not returned).
  return N == Nb ? block : block.slice_rows(0, N);
}

}  // namespace kestrel::parallel
