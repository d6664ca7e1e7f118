// ProcessGroup over an MPI communicator. Every call is checked: the
// communicator carries MPI_ERRORS_RETURN, and a failing call becomes a
// kestrel::Error naming the MPI function, the group and MPI's message.
// With a collective timeout (the default) every call is issued non-blocking
// and completed by mpi::wait, so a hang becomes a timeout naming the ranks
// that did not answer (comm/mpi/health.h); without one, the blocking calls.
// Counts are int64 in the interface but int in MPI-3: single-buffer calls
// (all_reduce, broadcast, send, recv) are chunked; block collectives fail with
// "not supported yet" above 2^31-1 elements (or displacement) per call.
#pragma once
// Only MPI's C API is used; keep its deprecated C++ bindings out.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace kestrel::comm {

class MpiGroup final : public ProcessGroup {
 public:
  // Adopts `comm` (freed on destruction unless MPI is already finalised) and
  // sets MPI_ERRORS_RETURN on it.
  MpiGroup(MPI_Comm comm, std::string name);
  ~MpiGroup() override;
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  // A private duplicate of MPI_COMM_WORLD, so Kestrel's traffic never matches
  // messages of other code using MPI_COMM_WORLD directly.
  static std::shared_ptr<MpiGroup> dup_world(std::string name = "world");

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  void all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DType dtype) override;
  void send(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  void recv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<PendingTransfer> isend(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<PendingTransfer> irecv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  void barrier() override;

  // Collective over this group (MPI_Comm_split): ranks passing the same color
  // form a group ordered by key. color < 0 means "no group": returns nullptr.
  std::shared_ptr<MpiGroup> split(int color, int key, std::string name) const;

  // Collective over this group: for every rank of it, the lowest group rank
  // sharing its node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED: the
  // ranks that can share memory, i.e. one machine).
  std::vector<int> shared_memory_leaders() const;

 private:
  void check(int rc, const char* call) const;
  int to_int(int64_t n, const char* call, const char* what) const;
  void check_peer(int peer, const char* call) const;
  // Completes a request of this group through mpi::wait (the collective
  // timeout and liveness report, comm/mpi/health.h); `call` names the
  // blocking MPI function it stands for.
  void complete(MPI_Request& req, MPI_Status* st, const char* call) const;
  friend class MpiTransfer;
  // No collective timeout (<= 0): the plain blocking MPI calls, no polling.
  static bool blocking();

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1;
};

}  // namespace kestrel::comm
