#include "parallel/comm_counter.h"

#include <sstream>

namespace kestrel::parallel {

const char* collective_kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::SendRecv: return "send_recv";
    case CollectiveKind::kCount: break;
  }
  return "?";
}

double CommStats::total_wire_bytes() const {
  double s = 0;
  for (const auto& c : by_kind) s += c.wire_bytes;
  return s;
}
double CommStats::total_payload_bytes() const {
  double s = 0;
  for (const auto& c : by_kind) s += c.payload_bytes;
  return s;
}
int64_t CommStats::total_calls() const {
  int64_t s = 0;
  for (const auto& c : by_kind) s += c.calls;
  return s;
}

std::string CommStats::to_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < by_kind.size(); ++i) {
    const auto& c = by_kind[i];
    if (!c.calls) continue;
    os << "    " << collective_kind_name(CollectiveKind(i)) << ": " << c.calls << " calls, payload " << c.payload_bytes
       << " B, wire " << c.wire_bytes << " B\n";
  }
  return os.str();
}

CountingGroup::CountingGroup(std::shared_ptr<comm::ProcessGroup> inner) : inner_(std::move(inner)) {
  KS_CHECK(inner_ != nullptr, "CountingGroup needs a group");
}

void CountingGroup::add(CollectiveKind k, double payload, double wire) {
  auto& c = stats_.by_kind[size_t(k)];
  ++c.calls;
  c.payload_bytes += payload;
  c.wire_bytes += size() > 1 ? wire : 0.0;
}

void CountingGroup::all_reduce(void* buf, int64_t count, DType dtype, comm::ReduceOp op) {
  const double n = size(), s = double(count) * double(dtype_size(dtype));
  add(CollectiveKind::AllReduce, s, 2.0 * (n - 1) / n * s);
  inner_->all_reduce(buf, count, dtype, op);
}

void CountingGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, comm::ReduceOp op) {
  const double n = size(), s = n * double(recv_count) * double(dtype_size(dtype));
  add(CollectiveKind::ReduceScatter, s, (n - 1) / n * s);
  inner_->reduce_scatter(send, recv, recv_count, dtype, op);
}

void CountingGroup::all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
  const double n = size(), s = n * double(send_count) * double(dtype_size(dtype));
  add(CollectiveKind::AllGather, s, (n - 1) / n * s);
  inner_->all_gather(send, recv, send_count, dtype);
}

void CountingGroup::broadcast(void* buf, int64_t count, DType dtype, int root) {
  const double s = double(count) * double(dtype_size(dtype));
  add(CollectiveKind::Broadcast, s, rank() == root ? s : 0.0);
  inner_->broadcast(buf, count, dtype, root);
}

void CountingGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  const double n = size(), s = n * double(count_per_rank) * double(dtype_size(dtype));
  add(CollectiveKind::AllToAll, s, (n - 1) / n * s);
  inner_->all_to_all(send, recv, count_per_rank, dtype);
}

void CountingGroup::all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                const std::vector<int64_t>& recv_counts, DType dtype) {
  double total = 0, others = 0;
  for (size_t r = 0; r < send_counts.size(); ++r) {
    total += double(send_counts[r]);
    if (int(r) != rank()) others += double(send_counts[r]);
  }
  const double es = double(dtype_size(dtype));
  add(CollectiveKind::AllToAll, total * es, others * es);
  inner_->all_to_allv(send, send_counts, recv, recv_counts, dtype);
}

void CountingGroup::send(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  const double s = double(count) * double(dtype_size(dtype));
  add(CollectiveKind::SendRecv, s, s);
  inner_->send(buf, count, dtype, peer, tag);
}

void CountingGroup::recv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  inner_->recv(buf, count, dtype, peer, tag);
}

std::unique_ptr<comm::PendingTransfer> CountingGroup::isend(const void* buf, int64_t count, DType dtype, int peer,
                                                            int tag) {
  const double s = double(count) * double(dtype_size(dtype));
  add(CollectiveKind::SendRecv, s, s);
  return inner_->isend(buf, count, dtype, peer, tag);
}

std::unique_ptr<comm::PendingTransfer> CountingGroup::irecv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  return inner_->irecv(buf, count, dtype, peer, tag);
}

}  // namespace kestrel::parallel
