// The communication interface every parallel layer talks through. MPI
// implements it now (comm/mpi/), NCCL later; a size-1 LocalGroup is the plain
// single-process case, so model code never branches on "is parallel".
// All buffers are contiguous; counts are in elements of `dtype`.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kestrel::comm {

enum class ReduceOp { Sum, Max, Min, Avg };

// A point-to-point transfer in flight (ProcessGroup::isend / irecv). The
// buffer must stay alive, and for a send unchanged, until wait() returns;
// destruction waits, so a transfer never outlives its buffer's owner
// unnoticed. A receive's wait() checks the element count that arrived.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  virtual void wait() = 0;
  // True when the transfer has completed (then wait() returns at once);
  // never blocks, so a sender can free a buffer as soon as it is sent.
  virtual bool test() { return true; }
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "tp", "dp", "world", ... for messages

  // In place over `count` elements.
  virtual void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds size()*recv_count elements; rank r receives the reduced block r.
  virtual void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) = 0;
  // recv holds size()*send_count elements, rank blocks in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  virtual void broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // Equal blocks of count_per_rank elements to and from every rank.
  virtual void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) = 0;
  virtual void all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DType dtype) = 0;
  virtual void send(const void* buf, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual void recv(void* buf, int64_t count, DType dtype, int peer, int tag) = 0;
  // Non-blocking send / receive (the pipeline's activations and gradients:
  // a stage posts its send and computes on, so two stages sending to each
  // other never deadlock). Messages between one pair on one tag arrive in the
  // order they were posted. The defaults complete at once through send/recv.
  virtual std::unique_ptr<PendingTransfer> isend(const void* buf, int64_t count, DType dtype, int peer, int tag);
  virtual std::unique_ptr<PendingTransfer> irecv(void* buf, int64_t count, DType dtype, int peer, int tag);
  virtual void barrier() = 0;

  // Tensor conveniences over the calls above: the transport reads and writes
  // the tensors' buffers (device buffers with a device-aware transport).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce(t.raw(), t.numel(), t.dtype(), op); }
  void broadcast(Tensor& t, int root) { broadcast(t.raw(), t.numel(), t.dtype(), root); }
  // recv: size() * send.numel() elements of send's dtype, rank blocks in rank order.
  void all_gather(const Tensor& send, Tensor& recv) {
    KS_CHECK(send.dtype() == recv.dtype() && recv.numel() == send.numel() * size(), "all_gather: ", send.describe(),
             " into ", recv.describe(), " over ", size(), " ranks");
    all_gather(send.raw(), recv.raw(), send.numel(), send.dtype());
  }
  // send: size() * recv.numel() elements of recv's dtype; rank r receives the
  // reduction of every rank's block r.
  void reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op = ReduceOp::Sum) {
    KS_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel() * size(), "reduce_scatter: ",
             send.describe(), " into ", recv.describe(), " over ", size(), " ranks");
    reduce_scatter(send.raw(), recv.raw(), recv.numel(), send.dtype(), op);
  }
  // Point to point on whole tensors (the pipeline's activations and
  // gradients): t's elements in its dtype; an irecv's tensor is written.
  void send(const Tensor& t, int peer, int tag) { send(t.raw(), t.numel(), t.dtype(), peer, tag); }
  void recv(Tensor& t, int peer, int tag) { recv(t.raw(), t.numel(), t.dtype(), peer, tag); }
  std::unique_ptr<PendingTransfer> isend(const Tensor& t, int peer, int tag) {
    return isend(t.raw(), t.numel(), t.dtype(), peer, tag);
  }
  std::unique_ptr<PendingTransfer> irecv(Tensor& t, int peer, int tag) {
    return irecv(t.raw(), t.numel(), t.dtype(), peer, tag);
  }
  // Counts in elements of the tensors' dtype; send and recv hold their sums.
  void all_to_allv(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                   const std::vector<int64_t>& recv_counts) {
    int64_t ns = 0, nr = 0;
    for (int64_t c : send_counts) ns += c;
    for (int64_t c : recv_counts) nr += c;
    KS_CHECK(send.dtype() == recv.dtype() && send.numel() >= ns && recv.numel() >= nr, "all_to_allv: ",
             send.describe(), " (", ns, " to send) into ", recv.describe(), " (", nr, " to receive)");
    all_to_allv(send.raw(), send_counts, recv.raw(), recv_counts, send.dtype());
  }
};

// The size-1 group: every collective is a copy or a no-op.
class LocalGroup final : public ProcessGroup {
 public:
  explicit LocalGroup(std::string name = "local") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, int64_t n, DType dt, ReduceOp) override;
  void all_gather(const void* send, void* recv, int64_t n, DType dt) override;
  void broadcast(void*, int64_t, DType, int) override {}
  void all_to_all(const void* send, void* recv, int64_t n, DType dt) override;
  void all_to_allv(const void* send, const std::vector<int64_t>& sc, void* recv, const std::vector<int64_t>& rc,
                   DType dt) override;
  void send(const void*, int64_t, DType, int peer, int) override;
  void recv(void*, int64_t, DType, int peer, int) override;
  void barrier() override {}

 private:
  std::string name_;
};

std::shared_ptr<ProcessGroup> local_group(const std::string& name = "local");

}  // namespace kestrel::comm
