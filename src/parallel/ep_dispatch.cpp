#include "parallel/ep_dispatch.h"

#include <numeric>

#include "ops/copy.h"
#include "parallel/ep_allgather.h"

namespace kestrel::parallel {

int64_t EpLayout::received() const { return std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t(0)); }

int64_t experts_per_rank(int64_t E, int ep) {
  KS_CHECK(E > 0 && E % ep == 0, "expert parallelism: ", E, " experts do not split over expert_model_parallel_size ",
           ep, "; choose a size dividing num_experts");
  return E / ep;
}

EpLayout ep_layout_from_counts(int ep, int rank, const std::vector<int64_t>& tpe, std::vector<int64_t> recv_counts) {
  EpLayout L;
  L.ep = ep;
  L.rank = rank;
  const int64_t E = int64_t(tpe.size());
  const int64_t k = experts_per_rank(E, ep);
  KS_CHECK(int64_t(recv_counts.size()) == E, "ep_layout_from_counts: ", recv_counts.size(), " received counts for ", E,
           " experts");
  L.experts_per_rank = k;
  L.send_rows.assign(size_t(L.ep), 0);
  for (int j = 0; j < L.ep; ++j)
    for (int64_t e = 0; e < k; ++e) L.send_rows[size_t(j)] += tpe[size_t(j * k + e)];
  L.recv_counts = std::move(recv_counts);
  L.recv_rows.assign(size_t(L.ep), 0);
  L.local_group_sizes.assign(size_t(k), 0);
  for (int s = 0; s < L.ep; ++s)
    for (int64_t e = 0; e < k; ++e) {
      L.recv_rows[size_t(s)] += L.recv_counts[size_t(s * k + e)];
      L.local_group_sizes[size_t(e)] += L.recv_counts[size_t(s * k + e)];
    }
  return L;
}

EpLayout ep_dispatch_layout(comm::ProcessGroup& ep, const std::vector<int64_t>& tpe, EpDispatcher dispatcher,
                            Device dev) {
  if (dispatcher == EpDispatcher::AllGather) return ep_allgather_layout(ep, tpe, dev);
  const int64_t E = int64_t(tpe.size());
  // recv_counts[s * k + e]: rank s's rows for local expert e, in one all-to-all
  // of the counts (host buffers: the host transport, also for a device group).
  std::vector<int64_t> recv_counts(size_t(E), 0);
  ep.all_to_all(tpe.data(), recv_counts.data(), experts_per_rank(E, ep.size()), DType::I64);
  EpLayout L = ep_layout_from_counts(ep.size(), ep.rank(), tpe, std::move(recv_counts));
  const int64_t k = L.experts_per_rank;
  // Received rows: source-major, then local expert. Sorted rows: local
  // expert-major, then source.
  const int64_t Nr = L.received();
  std::vector<int64_t> src_start(size_t(E) + 1, 0);  // received row of (s, e)'s first row, s-major
  for (int64_t i = 0; i < E; ++i) src_start[size_t(i) + 1] = src_start[size_t(i)] + L.recv_counts[size_t(i)];
  std::vector<int32_t> sort(static_cast<size_t>(Nr)), unsort(static_cast<size_t>(Nr));
  int64_t pos = 0;
  for (int64_t e = 0; e < k; ++e)
    for (int s = 0; s < L.ep; ++s) {
      const int64_t first = src_start[size_t(s * k + e)], n = L.recv_counts[size_t(s * k + e)];
      for (int64_t r = 0; r < n; ++r, ++pos) {
        sort[size_t(pos)] = int32_t(first + r);
        unsort[size_t(first + r)] = int32_t(pos);
      }
    }
  L.sort_index = Tensor::from_host(sort, {Nr}, MemCategory::Activations, dev);
  L.unsort_index = Tensor::from_host(unsort, {Nr}, MemCategory::Activations, dev);
  return L;
}

namespace {

void exchange(comm::ProcessGroup& ep, const comm::HierarchicalA2a* hier, const Tensor& send,
              const std::vector<int64_t>& send_rows, Tensor& recv, const std::vector<int64_t>& recv_rows,
              int64_t width) {
  // [sum send_rows, width] -> [sum recv_rows, width]; counts in elements.
  std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
  for (size_t j = 0; j < sc.size(); ++j) sc[j] = send_rows[j] * width;
  for (size_t j = 0; j < rc.size(); ++j) rc[j] = recv_rows[j] * width;
  if (hier) hier->all_to_allv(send, sc, recv, rc);
  else ep.all_to_allv(send, sc, recv, rc);
}

}  // namespace

Tensor ep_dispatch(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& xs, const comm::HierarchicalA2a* hier,
                   MemCategory cat) {
  if (L.dispatcher == EpDispatcher::AllGather) {
    KS_CHECK(!hier, "moe_hierarchical_alltoallv exchanges the alltoall dispatcher's rows; the allgather "
             "dispatcher has no all-to-all: set moe_token_dispatcher_type=alltoall or the hierarchical exchange off");
    return ep_allgather_dispatch(ep, L, xs, cat);
  }
  const int64_t N = std::accumulate(L.send_rows.begin(), L.send_rows.end(), int64_t(0)), Nr = L.received();
  KS_CHECK(xs.dim() == 2 && xs.size(0) == N, "ep_dispatch: ", xs.describe(), " is not the ", N,
           " permuted rows the layout sends");
  const int64_t D = xs.size(1);
  Tensor recv = Tensor::empty({Nr, D}, xs.dtype(), cat, xs.device());  // [Nr, D] source-major
  exchange(ep, hier, xs, L.send_rows, recv, L.recv_rows, D);
  Tensor sorted = Tensor::empty({Nr, D}, xs.dtype(), cat, xs.device());  // [Nr, D] local expert-major
  ops::gather_rows(recv, L.sort_index, sorted);
  return sorted;
}

Tensor ep_combine(comm::ProcessGroup& ep, const EpLayout& L, const Tensor& yr, const comm::HierarchicalA2a* hier,
                  MemCategory cat) {
  if (L.dispatcher == EpDispatcher::AllGather) {
    KS_CHECK(!hier, "moe_hierarchical_alltoallv exchanges the alltoall dispatcher's rows; the allgather "
             "dispatcher has no all-to-all: set moe_token_dispatcher_type=alltoall or the hierarchical exchange off");
    return ep_allgather_combine(ep, L, yr, cat);
  }
  const int64_t N = std::accumulate(L.send_rows.begin(), L.send_rows.end(), int64_t(0)), Nr = L.received();
  KS_CHECK(yr.dim() == 2 && yr.size(0) == Nr, "ep_combine: ", yr.describe(), " is not the ", Nr,
           " rows this rank's experts received");
  const int64_t D = yr.size(1);
  Tensor unsorted = Tensor::empty({Nr, D}, yr.dtype(), cat, yr.device());  // [Nr, D] source-major
  ops::gather_rows(yr, L.unsort_index, unsorted);
  Tensor back = Tensor::empty({N, D}, yr.dtype(), cat, yr.device());  // [N, D] in xs's order
  exchange(ep, hier, unsorted, L.recv_rows, back, L.send_rows, D);
  return back;
}

}  // namespace kestrel::parallel
