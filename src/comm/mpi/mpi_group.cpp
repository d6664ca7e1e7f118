#include "comm/mpi/mpi_group.h"

#include <algorithm>
#include <climits>

#include "comm/mpi/health.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/reduce_kernels.h"
#include "core/status.h"

namespace kestrel::comm {

namespace {
// Largest piece one chunked MPI call moves; well below INT_MAX elements.
constexpr int64_t kChunk = int64_t(1) << 30;

const char* byte_ptr(const void* p, int64_t elems, DType dt) {
  return static_cast<const char*>(p) + elems * int64_t(dtype_size(dt));
}
char* byte_ptr(void* p, int64_t elems, DType dt) { return static_cast<char*>(p) + elems * int64_t(dtype_size(dt)); }
}  // namespace

MpiGroup::MpiGroup(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  KS_CHECK(comm_ != MPI_COMM_NULL, "MpiGroup '", name_, "' built from MPI_COMM_NULL");
  try {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  } catch (...) {
    MPI_Comm_free(&comm_);  // the destructor will not run for a half-built group
    throw;
  }
}

MpiGroup::~MpiGroup() {
  // After MPI_Finalize the handle is dead; freeing it then is itself an error.
  if (comm_ != MPI_COMM_NULL && mpi::is_active()) MPI_Comm_free(&comm_);
}

std::shared_ptr<MpiGroup> MpiGroup::dup_world(std::string name) {
  MPI_Comm c = MPI_COMM_NULL;
  mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &c), "MPI_Comm_dup", "MPI_COMM_WORLD");
  return std::make_shared<MpiGroup>(c, std::move(name));
}

void MpiGroup::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  mpi::check(rc, call, "group '" + name_ + "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")");
}

int MpiGroup::to_int(int64_t n, const char* call, const char* what) const {
  KS_CHECK(n >= 0, call, " on group '", name_, "': negative ", what, " ", n);
  if (n > INT_MAX)
    KS_FAIL("not supported yet: ", call, " on group '", name_, "' with ", what, " ", n,
            " (above 2^31-1; MPI ", MPI_VERSION, ".", MPI_SUBVERSION,
            " has no large-count collectives): split the buffer into smaller calls");
  return int(n);
}

void MpiGroup::check_peer(int peer, const char* call) const {
  if (peer < 0 || peer >= size_)
    KS_FAIL(call, " on group '", name_, "': peer rank ", peer, " is outside [0, ", size_, ")");
}

void MpiGroup::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  KS_CHECK(count >= 0, "all_reduce count ", count);
  const MPI_Datatype t = mpi::datatype(dtype);
  const MPI_Op o = mpi::reduce_op(dtype, op);
  // Chunks keep every rank's calls identical (same count sequence), so they match.
  for (int64_t off = 0; off < count; off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    void* p = byte_ptr(buf, off, dtype);
    if (blocking()) {
      check(MPI_Allreduce(MPI_IN_PLACE, p, n, t, o, comm_), "MPI_Allreduce");
      continue;
    }
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, p, n, t, o, comm_, &req), "MPI_Iallreduce");
    complete(req, MPI_STATUS_IGNORE, "MPI_Allreduce");
  }
  if (op == ReduceOp::Avg) divide_inplace(buf, count, dtype, size_);
}

void MpiGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) {
  const int n = to_int(recv_count, "MPI_Reduce_scatter_block", "recv_count");
  to_int(recv_count * size_, "MPI_Reduce_scatter_block", "total elements");
  // send == recv: the whole input sits in recv and block `rank` lands at its start.
  const void* s = send == recv ? MPI_IN_PLACE : send;
  const MPI_Datatype t = mpi::datatype(dtype);
  const MPI_Op o = mpi::reduce_op(dtype, op);
  if (blocking()) {
    check(MPI_Reduce_scatter_block(s, recv, n, t, o, comm_), "MPI_Reduce_scatter_block");
  } else {
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(s, recv, n, t, o, comm_, &req), "MPI_Ireduce_scatter_block");
    complete(req, MPI_STATUS_IGNORE, "MPI_Reduce_scatter_block");
  }
  if (op == ReduceOp::Avg) divide_inplace(recv, recv_count, dtype, size_);
}

void MpiGroup::all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
  const int n = to_int(send_count, "MPI_Allgather", "send_count");
  to_int(send_count * size_, "MPI_Allgather", "total elements");
  // MPI_IN_PLACE means "my block is already at recv + rank*count".
  const void* s = send == byte_ptr(recv, int64_t(rank_) * send_count, dtype) ? MPI_IN_PLACE : send;
  const MPI_Datatype t = mpi::datatype(dtype);
  if (blocking()) {
    check(MPI_Allgather(s, n, t, recv, n, t, comm_), "MPI_Allgather");
    return;
  }
  MPI_Request req;
  check(MPI_Iallgather(s, n, t, recv, n, t, comm_, &req), "MPI_Iallgather");
  complete(req, MPI_STATUS_IGNORE, "MPI_Allgather");
}

void MpiGroup::broadcast(void* buf, int64_t count, DType dtype, int root) {
  KS_CHECK(count >= 0, "broadcast count ", count);
  check_peer(root, "broadcast");
  const MPI_Datatype t = mpi::datatype(dtype);
  for (int64_t off = 0; off < count; off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    void* p = byte_ptr(buf, off, dtype);
    if (blocking()) {
      check(MPI_Bcast(p, n, t, root, comm_), "MPI_Bcast");
      continue;
    }
    MPI_Request req;
    check(MPI_Ibcast(p, n, t, root, comm_, &req), "MPI_Ibcast");
    complete(req, MPI_STATUS_IGNORE, "MPI_Bcast");
  }
}

void MpiGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  const int n = to_int(count_per_rank, "MPI_Alltoall", "count_per_rank");
  to_int(count_per_rank * size_, "MPI_Alltoall", "total elements");
  const void* s = send == recv ? MPI_IN_PLACE : send;
  const MPI_Datatype t = mpi::datatype(dtype);
  if (blocking()) {
    check(MPI_Alltoall(s, n, t, recv, n, t, comm_), "MPI_Alltoall");
    return;
  }
  MPI_Request req;
  check(MPI_Ialltoall(s, n, t, recv, n, t, comm_, &req), "MPI_Ialltoall");
  complete(req, MPI_STATUS_IGNORE, "MPI_Alltoall");
}

void MpiGroup::all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DType dtype) {
  if (int64_t(send_counts.size()) != size_ || int64_t(recv_counts.size()) != size_)
    KS_FAIL("all_to_allv on group '", name_, "': ", send_counts.size(), " send counts and ", recv_counts.size(),
            " recv counts for ", size_, " ranks (need one per rank)");
  KS_CHECK(send != recv, "all_to_allv on group '", name_, "' cannot run in place");
  // Blocks are packed back to back in rank order; displacements are their prefix sums.
  std::vector<int> sc(size_), rc(size_), sd(size_), rd(size_);
  int64_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    sd[r] = to_int(so, "MPI_Alltoallv", "send displacement");
    rd[r] = to_int(ro, "MPI_Alltoallv", "recv displacement");
    sc[r] = to_int(send_counts[r], "MPI_Alltoallv", "send count");
    rc[r] = to_int(recv_counts[r], "MPI_Alltoallv", "recv count");
    so += send_counts[r];
    ro += recv_counts[r];
  }
  const MPI_Datatype t = mpi::datatype(dtype);
  if (blocking()) {
    check(MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_), "MPI_Alltoallv");
    return;
  }
  MPI_Request req;
  check(MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_, &req), "MPI_Ialltoallv");
  complete(req, MPI_STATUS_IGNORE, "MPI_Alltoallv");
}

void MpiGroup::send(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  KS_CHECK(count >= 0 && tag >= 0, "send count ", count, " tag ", tag);
  check_peer(peer, "send");
  const MPI_Datatype t = mpi::datatype(dtype);
  // Messages between one pair on one tag do not overtake, so chunks arrive in order.
  int64_t off = 0;
  do {
    const int n = int(std::min(kChunk, count - off));
    const void* p = byte_ptr(buf, off, dtype);
    if (blocking()) {
      check(MPI_Send(p, n, t, peer, tag, comm_), "MPI_Send");
    } else {
      MPI_Request req;
      check(MPI_Isend(p, n, t, peer, tag, comm_, &req), "MPI_Isend");
      complete(req, MPI_STATUS_IGNORE, "MPI_Send");
    }
    off += n;
  } while (off < count);
}

void MpiGroup::recv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  KS_CHECK(count >= 0 && tag >= 0, "recv count ", count, " tag ", tag);
  check_peer(peer, "recv");
  const MPI_Datatype t = mpi::datatype(dtype);
  int64_t off = 0;
  do {
    const int n = int(std::min(kChunk, count - off));
    MPI_Status st;
    void* p = byte_ptr(buf, off, dtype);
    if (blocking()) {
      check(MPI_Recv(p, n, t, peer, tag, comm_, &st), "MPI_Recv");
    } else {
      MPI_Request req;
      check(MPI_Irecv(p, n, t, peer, tag, comm_, &req), "MPI_Irecv");
      complete(req, &st, "MPI_Recv");
    }
    int got = 0;
    check(MPI_Get_count(&st, t, &got), "MPI_Get_count");
    if (got != n)
      KS_FAIL("recv on group '", name_, "' from rank ", peer, " tag ", tag, ": expected ", n, " ", dtype_name(dtype),
              " elements, the matching send carried ", got);
    off += n;
  } while (off < count);
}

// One isend/irecv: a request per chunk (messages between one pair on one tag
// do not overtake, so the chunks match in order), completed by wait() through
// MpiGroup::complete (the collective timeout's polling).
class MpiTransfer final : public PendingTransfer {
 public:
  MpiTransfer(const MpiGroup& g, bool is_recv, int peer, int tag, DType dt)
      : g_(g), recv_(is_recv), peer_(peer), tag_(tag), dt_(dt) {}
  ~MpiTransfer() override {
    try {
      wait();
    } catch (...) {  // the error was (or will be) reported by the rank's own wait; never throw from a destructor
    }
  }
  void add(MPI_Request r, int n) {
    reqs_.push_back(r);
    counts_.push_back(n);
  }
  bool test() override {
    while (done_ < reqs_.size()) {
      int flag = 0;
      MPI_Status st;
      g_.check(MPI_Test(&reqs_[done_], &flag, recv_ ? &st : MPI_STATUS_IGNORE), "MPI_Test");
      if (!flag) return false;
      if (recv_) check_count(st);
      ++done_;
    }
    return true;
  }
  void wait() override {
    for (; done_ < reqs_.size(); ++done_) {
      MPI_Status st;
      g_.complete(reqs_[done_], recv_ ? &st : MPI_STATUS_IGNORE, recv_ ? "MPI_Recv" : "MPI_Send");
      if (recv_) check_count(st);
    }
  }

 private:
  void check_count(const MPI_Status& st) const {
    int got = 0;
    g_.check(MPI_Get_count(&st, mpi::datatype(dt_), &got), "MPI_Get_count");
    if (got != counts_[done_])
      KS_FAIL("irecv on group '", g_.name(), "' from rank ", peer_, " tag ", tag_, ": expected ", counts_[done_], " ",
              dtype_name(dt_), " elements, the matching send carried ", got);
  }

  const MpiGroup& g_;
  bool recv_;
  int peer_, tag_;
  DType dt_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> counts_;
  size_t done_ = 0;
};

std::unique_ptr<PendingTransfer> MpiGroup::isend(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  KS_CHECK(count >= 0 && tag >= 0, "isend count ", count, " tag ", tag);
  check_peer(peer, "isend");
  const MPI_Datatype t = mpi::datatype(dtype);
  auto tr = std::make_unique<MpiTransfer>(*this, false, peer, tag, dtype);
  int64_t off = 0;
  do {
    const int n = int(std::min(kChunk, count - off));
    MPI_Request req;
    check(MPI_Isend(byte_ptr(buf, off, dtype), n, t, peer, tag, comm_, &req), "MPI_Isend");
    tr->add(req, n);
    off += n;
  } while (off < count);
  return tr;
}

std::unique_ptr<PendingTransfer> MpiGroup::irecv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  KS_CHECK(count >= 0 && tag >= 0, "irecv count ", count, " tag ", tag);
  check_peer(peer, "irecv");
  const MPI_Datatype t = mpi::datatype(dtype);
  auto tr = std::make_unique<MpiTransfer>(*this, true, peer, tag, dtype);
  int64_t off = 0;
  do {
    const int n = int(std::min(kChunk, count - off));
    MPI_Request req;
    check(MPI_Irecv(byte_ptr(buf, off, dtype), n, t, peer, tag, comm_, &req), "MPI_Irecv");
    tr->add(req, n);
    off += n;
  } while (off < count);
  return tr;
}

void MpiGroup::barrier() {
  if (blocking()) {
    check(MPI_Barrier(comm_), "MPI_Barrier");
    return;
  }
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  complete(req, MPI_STATUS_IGNORE, "MPI_Barrier");
}

bool MpiGroup::blocking() { return mpi::collective_timeout() <= 0; }

void MpiGroup::complete(MPI_Request& req, MPI_Status* st, const char* call) const {
  check(mpi::wait(&req, st, mpi::WaitSite{call, &name_, rank_, size_}), call);
}

std::vector<int> MpiGroup::shared_memory_leaders() const {
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  // The node's lowest group rank (key = group rank: it is the node's rank 0).
  int leader = rank_;
  int rc = MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  check(rc, "MPI_Bcast");
  std::vector<int> all(size_t(size_), 0);
  check(MPI_Allgather(&leader, 1, MPI_INT, all.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  return all;
}

std::shared_ptr<MpiGroup> MpiGroup::split(int color, int key, std::string name) const {
  MPI_Comm c = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c), "MPI_Comm_split");
  if (c == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiGroup>(c, std::move(name));
}

}  // namespace kestrel::comm
