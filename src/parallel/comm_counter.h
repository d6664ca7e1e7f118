// A ProcessGroup decorator that counts what passes through it, so the bytes a
// training step communicates can be compared with the closed-form formulas
// (bench/comm_bench.cpp). Two numbers per collective kind:
//  - payload bytes: the size of the logical buffer the collective works on
//    (all_reduce: the buffer; reduce_scatter: the full input, size()*recv;
//    all_gather: the full output; all_to_all(v): what this rank sends);
//  - wire bytes: what this rank sends under the bandwidth-optimal ring
//    algorithms, the usual cost model (NCCL's "bus bandwidth"):
//    all_reduce 2(n-1)/n * S, reduce_scatter and all_gather (n-1)/n * S,
//    broadcast S (root) / 0, all_to_all(v) the bytes addressed to other ranks,
//    send S. A size-1 group sends nothing.
#pragma once
#include <array>
#include <memory>
#include <string>

#include "comm/process_group.h"

namespace kestrel::parallel {

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, SendRecv, kCount };
const char* collective_kind_name(CollectiveKind k);

struct CommCounts {
  int64_t calls = 0;
  double payload_bytes = 0;
  double wire_bytes = 0;
};

struct CommStats {
  std::array<CommCounts, size_t(CollectiveKind::kCount)> by_kind{};
  const CommCounts& of(CollectiveKind k) const { return by_kind[size_t(k)]; }
  double total_wire_bytes() const;
  double total_payload_bytes() const;
  int64_t total_calls() const;
  std::string to_string() const;  // one line per kind with calls
};

class CountingGroup final : public comm::ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<comm::ProcessGroup> inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }

  void all_reduce(void* buf, int64_t count, DType dtype, comm::ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, comm::ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  void all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DType dtype) override;
  void send(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  void recv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  // Forwarded as the inner group's own non-blocking transfers (a ring whose
  // ranks all post a send first must not block), counted like send.
  std::unique_ptr<comm::PendingTransfer> isend(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<comm::PendingTransfer> irecv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  void barrier() override { inner_->barrier(); }
  using comm::ProcessGroup::all_reduce;
  using comm::ProcessGroup::broadcast;
  using comm::ProcessGroup::irecv;
  using comm::ProcessGroup::isend;

  const CommStats& stats() const { return stats_; }
  void reset() { stats_ = CommStats(); }
  const std::shared_ptr<comm::ProcessGroup>& inner() const { return inner_; }

 private:
  void add(CollectiveKind k, double payload, double wire);
  std::shared_ptr<comm::ProcessGroup> inner_;
  CommStats stats_;
};

}  // namespace kestrel::parallel
