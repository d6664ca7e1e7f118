// A fake NCCL for the emulator (shim/nccl.h): the calls Kestrel's device
// transport (src/comm/nccl) makes, carried by MPI between the processes of an
// mpirun, so that transport runs unchanged under the emulator.
//
// A communicator is an MPI communicator of the same ranks in NCCL's rank
// order, wrapped in Kestrel's MpiGroup (so bf16 sums round as the MPI group's
// do, Avg divides as it does, and its collective timeout applies). Bootstrap
// (ncclCommInitRank, collective over the members only): the unique id names
// the root's world rank and a sequence number; every member sends the root
// its (NCCL rank, world rank), the root answers with the table, and all call
// MPI_Comm_create_group over those world ranks.
//
// Each call runs at once (the emulated stream is synchronous, so stream order
// holds): device buffers are copied to host vectors through the emulated
// runtime's cudaMemcpy (which checks they are device memory, in bounds, and
// opens the arena only for the copy), MPI moves the host vectors, results are
// copied back. Sends and receives between ncclGroupStart and ncclGroupEnd are
// posted together at ncclGroupEnd, as NCCL fuses them, and the call returns
// when all of them are done (the stream would wait for the group there).
// A send is synchronous (MPI_Issend): it completes only once its receiver
// has posted the matching receive, as an NCCL send may wait on the stream
// for its peer (rendezvous; no eager buffering is promised). So a program
// that can deadlock on GPUs (a send alone in its group while the peer first
// waits on its own send to us) deadlocks here too, and the collective
// timeout or the test's time limit ends it, instead of MPI's eager protocol
// hiding it. Point to point uses one MPI tag, so messages between a pair
// match in posting order, as NCCL's do.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/health.h"
#include "comm/mpi/mpi_group.h"
#include "comm/mpi/mpi_runtime.h"
#include "core/status.h"

struct ncclComm {
  std::unique_ptr<kestrel::comm::MpiGroup> group;
  std::string last_error;
};

namespace {

constexpr uint32_t kMagic = 0x4b464e43;  // "KFNC"
constexpr int kTagBase = 31000;          // bootstrap tags on MPI_COMM_WORLD: kTagBase + 2 * (seq % 500) (+1)

struct IdBody {
  uint32_t magic;
  int root_world;
  int seq;
};

thread_local std::string g_last_error;

struct Pending {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  ncclComm_t comm;
};
int g_depth = 0;  // ncclGroupStart nesting
std::vector<Pending> g_pending;

kestrel::DType to_dtype(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return kestrel::DType::F32;
    case ncclBfloat16: return kestrel::DType::BF16;
    case ncclFloat16: return kestrel::DType::F16;
    case ncclInt32: return kestrel::DType::I32;
    case ncclInt64: return kestrel::DType::I64;
    case ncclUint8: return kestrel::DType::U8;
    default: break;
  }
  KS_FAIL("fake NCCL: data type ", int(t), " is not emulated");
}
kestrel::comm::ReduceOp to_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return kestrel::comm::ReduceOp::Sum;
    case ncclMax: return kestrel::comm::ReduceOp::Max;
    case ncclMin: return kestrel::comm::ReduceOp::Min;
    case ncclAvg: return kestrel::comm::ReduceOp::Avg;
    default: break;
  }
  KS_FAIL("fake NCCL: reduction ", int(op), " is not emulated");
}

// Device bytes to a host vector and back, through the emulated runtime's checks.
std::vector<char> to_host(const void* dev, size_t bytes) {
  std::vector<char> h(bytes);
  if (bytes && cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    KS_FAIL("fake NCCL: a send buffer is not device memory (or runs past its allocation)");
  return h;
}
void to_device(void* dev, const std::vector<char>& h) {
  if (!h.empty() && cudaMemcpy(dev, h.data(), h.size(), cudaMemcpyHostToDevice) != cudaSuccess)
    KS_FAIL("fake NCCL: a receive buffer is not device memory (or runs past its allocation)");
}

// Runs f, turning a Kestrel error into NCCL's style: a code and a last-error text.
template <class F>
ncclResult_t guarded(ncclComm_t comm, F&& f) {
  try {
    f();
    return ncclSuccess;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    if (comm) comm->last_error = e.what();
    return ncclInternalError;
  }
}

void mpi_check(int rc, const char* call) { kestrel::comm::mpi::check(rc, call, "fake NCCL bootstrap"); }

// Posts every pending send (synchronous: MPI_Issend) and receive, then waits
// for all, under the collective timeout (comm/mpi/health.h) as the MPI
// group's waits. Messages over 1 GiB travel in 1 GiB pieces, matched in order.
void run_pending(std::vector<Pending>& ops) {
  constexpr size_t kPiece = size_t(1) << 30;
  auto check = [](int rc, const char* call) { kestrel::comm::mpi::check(rc, call, "fake NCCL point to point"); };
  struct Piece {
    MPI_Request req;
    size_t op;  // index into ops
    int bytes;
  };
  std::vector<std::vector<char>> bufs(ops.size());
  std::vector<Piece> pieces;
  for (size_t i = 0; i < ops.size(); ++i) {
    Pending& p = ops[i];
    bufs[i] = p.send ? to_host(p.buf, p.bytes) : std::vector<char>(p.bytes);
    const MPI_Comm c = p.comm->group->comm();
    size_t off = 0;
    do {
      Piece pc{MPI_REQUEST_NULL, i, int(std::min(kPiece, p.bytes - off))};
      check(p.send ? MPI_Issend(bufs[i].data() + off, pc.bytes, MPI_BYTE, p.peer, 0, c, &pc.req)
                   : MPI_Irecv(bufs[i].data() + off, pc.bytes, MPI_BYTE, p.peer, 0, c, &pc.req),
            p.send ? "MPI_Issend" : "MPI_Irecv");
      pieces.push_back(pc);
      off += size_t(pc.bytes);
    } while (off < p.bytes);
  }
  const std::string name = "fake-nccl";
  for (Piece& pc : pieces) {
    const Pending& p = ops[pc.op];
    const char* call = p.send ? "ncclSend (MPI_Issend)" : "ncclRecv (MPI_Irecv)";
    MPI_Status st;
    check(kestrel::comm::mpi::wait(&pc.req, p.send ? MPI_STATUS_IGNORE : &st,
                                   {call, &name, p.comm->group->rank(), p.comm->group->size()}),
          call);
    if (p.send) continue;
    int got = 0;
    check(MPI_Get_count(&st, MPI_BYTE, &got), "MPI_Get_count");
    KS_CHECK(got == pc.bytes, "fake NCCL: an ncclRecv of ", p.bytes, " bytes from rank ", p.peer,
             " matched a send of another size: the two sides posted their transfers between this pair in "
             "different orders");
  }
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].send) to_device(ops[i].buf, bufs[i]);
}

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm) {
  return guarded(comm, [&] {
    KS_CHECK(comm && comm->group, "fake NCCL: no communicator");
    KS_CHECK(peer >= 0 && peer < comm->group->size(), "fake NCCL: peer ", peer, " outside the communicator");
    Pending p{send, buf, count * kestrel::dtype_size(to_dtype(dt)), peer, comm};
    if (g_depth > 0) {
      g_pending.push_back(p);
      return;
    }
    std::vector<Pending> one{p};
    run_pending(one);
  });
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  *version = 22800;  // claims 2.28.0: the features Kestrel uses
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int seq = 0;
  return guarded(nullptr, [&] {
    KS_CHECK(kestrel::comm::mpi::is_active(), "fake NCCL: needs MPI (run under mpirun with a KESTREL_MPI build)");
    std::memset(id, 0, sizeof *id);
    const IdBody b{kMagic, kestrel::comm::mpi::world_rank(), seq++};
    std::memcpy(id->internal, &b, sizeof b);
  });
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return guarded(nullptr, [&] {
    IdBody b;
    std::memcpy(&b, id.internal, sizeof b);
    KS_CHECK(b.magic == kMagic, "fake NCCL: not a unique id from ncclGetUniqueId (was it broadcast?)");
    KS_CHECK(rank >= 0 && rank < nranks, "fake NCCL: rank ", rank, " of ", nranks);
    const int tag = kTagBase + 2 * (b.seq % 500);
    const int me = kestrel::comm::mpi::world_rank();
    std::vector<int> world(size_t(nranks), -1);
    if (rank == 0) {
      KS_CHECK(me == b.root_world, "fake NCCL: NCCL rank 0 is not the process that made the id");
      world[0] = me;
      for (int i = 1; i < nranks; ++i) {
        int msg[2];
        mpi_check(MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
        KS_CHECK(msg[0] > 0 && msg[0] < nranks && world[size_t(msg[0])] < 0, "fake NCCL: rank ", msg[0],
                 " joined twice or is outside ", nranks);
        world[size_t(msg[0])] = msg[1];
      }
      for (int i = 1; i < nranks; ++i)
        mpi_check(MPI_Send(world.data(), nranks, MPI_INT, world[size_t(i)], tag + 1, MPI_COMM_WORLD), "MPI_Send");
    } else {
      int msg[2] = {rank, me};
      mpi_check(MPI_Send(msg, 2, MPI_INT, b.root_world, tag, MPI_COMM_WORLD), "MPI_Send");
      mpi_check(MPI_Recv(world.data(), nranks, MPI_INT, b.root_world, tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Recv");
    }
    MPI_Group all, mine;
    mpi_check(MPI_Comm_group(MPI_COMM_WORLD, &all), "MPI_Comm_group");
    mpi_check(MPI_Group_incl(all, nranks, world.data(), &mine), "MPI_Group_incl");
    MPI_Comm c = MPI_COMM_NULL;
    mpi_check(MPI_Comm_create_group(MPI_COMM_WORLD, mine, tag, &c), "MPI_Comm_create_group");
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    auto comm = std::make_unique<ncclComm>();
    comm->group = std::make_unique<kestrel::comm::MpiGroup>(c, "fake-nccl");
    KS_CHECK(comm->group->rank() == rank, "fake NCCL: MPI placed rank ", rank, " at ", comm->group->rank());
    *out = comm.release();
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async_error) {
  *async_error = ncclSuccess;  // every call completes (or fails) before it returns
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInternalError: return "internal error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "fake NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : g_last_error.c_str(); }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  return guarded(comm, [&] {
    const kestrel::DType t = to_dtype(dt);
    std::vector<char> h = to_host(send, count * kestrel::dtype_size(t));
    comm->group->all_reduce(h.data(), int64_t(count), t, to_op(op));
    to_device(recv, h);
  });
}

// NCCL's in-place form (recv == send + rank * recv_count) works too: the input is copied out first.
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t) {
  return guarded(comm, [&] {
    const kestrel::DType t = to_dtype(dt);
    const size_t block = recv_count * kestrel::dtype_size(t);
    std::vector<char> in = to_host(send, block * size_t(comm->group->size())), out(block);
    comm->group->reduce_scatter(in.data(), out.data(), int64_t(recv_count), t, to_op(op));
    to_device(recv, out);
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t) {
  return guarded(comm, [&] {
    const kestrel::DType t = to_dtype(dt);
    const size_t block = send_count * kestrel::dtype_size(t);
    std::vector<char> in = to_host(send, block), out(block * size_t(comm->group->size()));
    comm->group->all_gather(in.data(), out.data(), int64_t(send_count), t);
    to_device(recv, out);
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t) {
  return guarded(comm, [&] {
    const kestrel::DType t = to_dtype(dt);
    const size_t bytes = count * kestrel::dtype_size(t);
    std::vector<char> h = comm->group->rank() == root ? to_host(send, bytes) : std::vector<char>(bytes);
    comm->group->broadcast(h.data(), int64_t(count), t, root);
    to_device(recv, h);
  });
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t) {
  return p2p(true, const_cast<void*>(buf), count, dt, peer, comm);
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t) {
  return p2p(false, buf, count, dt, peer, comm);
}

ncclResult_t ncclGroupStart() {
  ++g_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_depth == 0) {
    g_last_error = "ncclGroupEnd without ncclGroupStart";
    return ncclInvalidUsage;
  }
  if (--g_depth > 0) return ncclSuccess;
  std::vector<Pending> ops;
  ops.swap(g_pending);
  return guarded(ops.empty() ? nullptr : ops.front().comm, [&] { run_pending(ops); });
}
