#include "parallel/etp_dispatch.h"

#include <algorithm>
#include <numeric>

#include "ops/copy.h"

namespace kestrel::parallel {

int64_t EtpLayout::gathered() const {
  return std::accumulate(group_sizes.begin(), group_sizes.end(), int64_t(0));
}

EtpLayout etp_layout(comm::ProcessGroup& etp, const std::vector<int64_t>& local_group_sizes, Device dev) {
  EtpLayout L;
  L.etp = etp.size();
  L.rank = etp.rank();
  const int64_t k = int64_t(local_group_sizes.size());
  std::vector<int64_t> counts(size_t(k * L.etp), 0);  // [etp, k]: rank s's rows of local expert e
  etp.all_gather(local_group_sizes.data(), counts.data(), k, DType::I64);
  L.rows.assign(size_t(L.etp), 0);
  L.group_sizes.assign(size_t(k), 0);
  for (int s = 0; s < L.etp; ++s)
    for (int64_t e = 0; e < k; ++e) {
      L.rows[size_t(s)] += counts[size_t(s * k + e)];
      L.group_sizes[size_t(e)] += counts[size_t(s * k + e)];
    }
  L.block_rows = *std::max_element(L.rows.begin(), L.rows.end());
  // Gathered buffer: rank s's rows at s * block_rows, sorted by local expert.
  // Sorted rows: local expert-major, then source rank.
  std::vector<int64_t> start(size_t(k * L.etp), 0);  // padded row of (s, e)'s first row
  for (int s = 0; s < L.etp; ++s) {
    int64_t at = s * L.block_rows;
    for (int64_t e = 0; e < k; ++e) {
      start[size_t(s * k + e)] = at;
      at += counts[size_t(s * k + e)];
    }
  }
  std::vector<int32_t> sort;
  sort.reserve(size_t(L.gathered()));
  for (int64_t e = 0; e < k; ++e)
    for (int s = 0; s < L.etp; ++s)
      for (int64_t r = 0; r < counts[size_t(s * k + e)]; ++r) sort.push_back(int32_t(start[size_t(s * k + e)] + r));
  L.sort_index = Tensor::from_host(sort, {int64_t(sort.size())}, MemCategory::Activations, dev);
  return L;
}

Tensor etp_gather(comm::ProcessGroup& etp, const EtpLayout& L, const Tensor& rows, MemCategory cat) {
  const int64_t Nr = L.rows[size_t(L.rank)];
  KS_CHECK(rows.dim() == 2 && rows.size(0) == Nr, "etp_gather: ", rows.describe(), " is not this rank's ", Nr,
           " rows of the layout");
  const int64_t D = rows.size(1);
  const Device dev = rows.device();
  Tensor mine = Tensor::empty({L.block_rows, D}, rows.dtype(), cat, dev);  // [block, D], zero-padded
  ops::pad_rows(rows, mine);
  Tensor padded = Tensor::empty({L.etp * L.block_rows, D}, rows.dtype(), cat, dev);  // [etp * block, D]
  etp.all_gather(mine, padded);
  Tensor sorted = Tensor::empty({L.gathered(), D}, rows.dtype(), cat, dev);  // [Na, D]
  ops::gather_rows(padded, L.sort_index, sorted);
  return sorted;
}

Tensor etp_reduce_scatter(comm::ProcessGroup& etp, const EtpLayout& L, const Tensor& all, MemCategory cat) {
  KS_CHECK(all.dim() == 2 && all.size(0) == L.gathered(), "etp_reduce_scatter: ", all.describe(), " is not the ",
           L.gathered(), " rows the layout gathered");
  const int64_t D = all.size(1), Nr = L.rows[size_t(L.rank)];
  Tensor padded = Tensor::zeros({L.etp * L.block_rows, D}, all.dtype(), cat, all.device());  // [etp * block, D]
  ops::scatter_rows(all, L.sort_index, padded);
  Tensor mine = Tensor::empty({L.block_rows, D}, all.dtype(), cat, all.device());  // [block, D]
  etp.reduce_scatter(padded, mine);
  return Nr == L.block_rows ? mine : mine.slice_rows(0, Nr).clone(cat);
}

}  // namespace kestrel::parallel
