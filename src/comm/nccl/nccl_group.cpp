// NcclGroup: comm::device_group()'s implementation (comm/device_group.h).
//
// One ProcessGroup, two transports. A call whose buffers are device memory
// (cuda::is_device_pointer) runs on the group's NCCL communicator, enqueued
// on the backend's one stream (cuda::stream()) after the kernels that wrote
// its inputs and before those that read its outputs, so no host
// synchronisation is needed; a call on host buffers goes to the wrapped host
// group (MPI) as before. Buffers of one call are all on one side (else an
// error); null buffers (nothing to send or receive on this rank) count as
// device, the side the other ranks of a device run use.
//
// The communicator: one per group, made at the group's first device call
// (collective over the group, as every call is): rank 0 calls
// ncclGetUniqueId, the 128-byte id is broadcast over the host group, and each
// rank joins with its host rank, so NCCL ranks are the group's ranks.
//
// Point to point: NCCL has no tags. Messages between two ranks match in the
// order they are posted, whatever their tags, so both sides must post their
// sends and receives to each other in the same order (the pipeline schedule
// and the context-parallel ring do: each posts K before V, activations before
// gradients). isend/irecv are queued and issued together as one NCCL group
// (ncclGroupStart/End) at the first wait()/test() of any of them, at a
// blocking send/recv (which joins that group) or at the group's next
// collective, so a ring where every rank receives and sends at once cannot
// deadlock, as it could with each send alone on the stream. A wait()
// enqueues; the stream orders the rest (the buffer may be reused by later
// kernels at once). A receive's element count is not checked against the
// send's: NCCL cannot; a mismatch is undefined, as with NCCL itself.
//
// Errors name the NCCL call, the group and NCCL's text, abort the
// communicator (so this rank's queued work cannot hang) and throw; the
// command's top level then takes the usual abort path (comm::abort_world,
// MPI_Abort), so the other ranks stop too. Asynchronous NCCL errors are
// polled at every device call (ncclCommGetAsyncError).
//
// Timeouts: host calls keep the MPI group's (comm/mpi/health.h). Device
// calls return before they run, so a watchdog thread (one per process,
// started at the first device call) follows them: each call records a
// cuda::StreamMark, and when the oldest unfinished one is older than
// World::collective_timeout() (verl's nccl_timeout, 600 s), or a
// communicator reports an asynchronous error, it aborts every NCCL
// communicator of the process (so kernels waiting on a lost peer return) and
// the job (comm::abort_world: MPI_Abort), naming the call, the group and the
// limit. A timeout <= 0 records no marks.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "comm/device_group.h"
#include "comm/nccl/nccl_api.h"
#include "comm/world.h"
#include "core/status.h"

namespace kestrel::comm {
namespace {

ncclDataType_t nccl_type(DType dt, const char* call, const std::string& group) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  KS_FAIL(call, " on group '", group, "': dtype ", int(dt), " has no NCCL type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;  // integers truncate, as the MPI group's Avg does
  }
  return ncclSum;
}

const char* offset(const void* p, int64_t elems, DType dt) {
  return static_cast<const char*>(p) + elems * int64_t(dtype_size(dt));
}
char* offset(void* p, int64_t elems, DType dt) { return static_cast<char*>(p) + elems * int64_t(dtype_size(dt)); }

// One queued isend/irecv on device memory.
struct P2p {
  bool send;
  void* buf;
  int64_t count;
  DType dtype;
  int peer;
};

class NcclComm;
// The process's watchdog (below): follows a device call just enqueued on
// `comm`; forgets a communicator before it is destroyed. It never owns one,
// so a communicator is always destroyed by the thread that used it.
void watch(NcclComm* comm, const char* call);
void forget(NcclComm* comm);

// The NCCL communicator of one group and its queued point-to-point calls.
// Shared with the group's pending transfers, which may flush the queue, and
// polled by the watchdog thread: mu_ guards the handle against it.
class NcclComm {
 public:
  explicit NcclComm(ProcessGroup& host) : host_(&host), name_(host.name()), rank_(host.rank()), size_(host.size()) {}
  ~NcclComm() {
    forget(this);
    std::lock_guard<std::mutex> g(mu_);
    if (comm_ && !aborted_) nccl::api().CommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  const std::string& name() const { return name_; }
  std::string where() const {
    return "group '" + name_ + "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }

  // After a successful enqueue: the watchdog follows the call (named for its message).
  void watched(const char* call) { watch(this, call); }

  // For the watchdog thread: NCCL's asynchronous error (ncclSuccess when none,
  // still in progress, or no communicator yet).
  ncclResult_t async_error() {
    std::lock_guard<std::mutex> g(mu_);
    ncclResult_t e = ncclSuccess;
    if (!comm_ || aborted_ || nccl::api().CommGetAsyncError(comm_, &e) != ncclSuccess) return ncclSuccess;
    return e == ncclInProgress ? ncclSuccess : e;
  }
  // For the watchdog thread, before it ends the job: kernels waiting on a
  // lost peer return. The handle stays (the main thread may hold it); it is
  // never destroyed after this.
  void abort_for_watchdog() {
    std::lock_guard<std::mutex> g(mu_);
    if (comm_ && !aborted_) nccl::api().CommAbort(comm_);
    aborted_ = true;
  }

  // The communicator, made on the first call; checks for asynchronous errors.
  ncclComm_t handle() {
    KS_CHECK(!broken_, "group '", name_, "': its NCCL communicator was aborted after an earlier failure");
    if (!comm_) create();
    ncclResult_t async = ncclSuccess;
    check(nccl::api().CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    check(async, "an earlier NCCL call (asynchronous error)");
    return comm_;
  }

  // Throws "<call> on group 'g' (rank r of n) failed: <NCCL's text>" after
  // aborting the communicator, unless r is ncclSuccess.
  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) [[likely]]
      return;
    const nccl::Api& a = nccl::api();
    std::string detail = a.GetErrorString(r);
    const char* last = a.GetLastError(comm_);
    if (last && *last) detail += std::string(" (") + last + ")";
    {
      std::lock_guard<std::mutex> g(mu_);
      if (comm_ && !aborted_) a.CommAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
    }
    KS_FAIL(call, " on group '", name_, "' (rank ", rank_, " of ", size_, ") failed: ", detail);
  }

  uint64_t enqueue(const P2p& p) {
    handle();
    queued_.push_back(p);
    return ++posted_;
  }
  bool issued(uint64_t ticket) const { return ticket <= issued_; }
  // Issues every queued transfer as one NCCL group on the stream.
  void flush() {
    if (queued_.empty()) return;
    std::vector<P2p> q;
    q.swap(queued_);
    issued_ = posted_;
    run_group(q);
  }
  // `ops` as one NCCL group (every call checked after ncclGroupEnd, so the group is always closed).
  void run_group(const std::vector<P2p>& ops) {
    const nccl::Api& a = nccl::api();
    ncclComm_t c = handle();
    cudaStream_t s = cuda::stream();
    ncclResult_t first = a.GroupStart();
    const char* failed = "ncclGroupStart";
    for (const P2p& p : ops) {
      if (first != ncclSuccess) break;
      const ncclDataType_t t = nccl_type(p.dtype, p.send ? "isend" : "irecv", name_);
      first = p.send ? a.Send(p.buf, size_t(p.count), t, p.peer, c, s) : a.Recv(p.buf, size_t(p.count), t, p.peer, c, s);
      failed = p.send ? "ncclSend" : "ncclRecv";
    }
    const ncclResult_t end = a.GroupEnd();
    check(first, failed);
    check(end, "ncclGroupEnd");
    watched(ops.size() == 1 ? failed : "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd");
  }

 private:
  void create() {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(nccl::api().GetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(&id, int64_t(sizeof id), DType::U8, 0);
    ncclComm_t c = nullptr;
    check(nccl::api().CommInitRank(&c, size_, id, rank_), "ncclCommInitRank");
    std::lock_guard<std::mutex> g(mu_);
    comm_ = c;
  }

  ProcessGroup* host_;  // owned by the NcclGroup; used only while it is alive (create() runs from its calls)
  std::string name_;
  int rank_, size_;
  std::mutex mu_;  // comm_ and aborted_ against the watchdog thread (only this thread changes comm_)
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;   // aborted after a failure seen here: every later call fails
  bool aborted_ = false;  // aborted by the watchdog (the job is ending)
  std::vector<P2p> queued_;
  uint64_t posted_ = 0, issued_ = 0;  // tickets: queued transfers numbered from 1
};

// The process's watchdog thread (see the file comment): follows every device
// call in stream order and ends the job when the oldest one outlives the
// collective timeout or a communicator reports an asynchronous error.
class Watchdog {
 public:
  // Never destroyed: communicators of static lifetime forget themselves at
  // exit, after any static watchdog would be gone; the thread ends with the process.
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog;
    return *w;
  }

  void watch(NcclComm* comm, const char* call) {
    const double limit = World::collective_timeout();
    // Recorded outside the lock: the thread polls marks under it.
    auto mark = limit > 0 ? std::make_unique<cuda::StreamMark>() : nullptr;
    std::lock_guard<std::mutex> g(mu_);
    if (std::find(comms_.begin(), comms_.end(), comm) == comms_.end()) comms_.push_back(comm);
    if (mark)
      calls_.push_back({std::move(mark),
                        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit)),
                        limit, std::string(call) + " on " + comm->where()});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }

  // Waits out a poll in progress, so the communicator is never used after.
  void forget(NcclComm* comm) {
    std::lock_guard<std::mutex> g(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Call {
    std::unique_ptr<cuda::StreamMark> mark;
    Clock::time_point deadline;
    double limit;
    std::string what;  // "ncclAllReduce on group 'dp' (rank 0 of 2)"
  };

  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait_for(lk, std::chrono::milliseconds(200));
      // One stream: calls finish in the order they were queued.
      while (!calls_.empty() && calls_.front().mark->done()) calls_.pop_front();
      if (!calls_.empty() && Clock::now() > calls_.front().deadline)
        end_job(calls_.front().what + " did not complete on the device within " +
                std::to_string(int64_t(calls_.front().limit)) +
                " s (the collective timeout, actor_rollout_ref.nccl_timeout): another rank stopped, hung, or is behind "
                "by more than the timeout; the NCCL communicators were aborted");
      for (NcclComm* c : comms_)  // under mu_: forget() waits, so c is alive
        if (const ncclResult_t e = c->async_error(); e != ncclSuccess)
          end_job("NCCL reported an asynchronous error on " + c->where() + ": " + nccl::api().GetErrorString(e) +
                  "; the NCCL communicators were aborted");
    }
  }

  // With mu_ held (no communicator can go meanwhile): aborts every one, then
  // the job (MPI_Abort). Runs on the watchdog thread.
  [[noreturn]] void end_job(const std::string& msg) {
    for (NcclComm* c : comms_) c->abort_for_watchdog();
    comm::abort_world(msg);
    // abort_world returns only without MPI (no NCCL group then); nothing else
    // could unblock the main thread, so this is the last resort.
    std::abort();
  }

  std::mutex mu_;  // taken before a communicator's own mutex, never after
  std::condition_variable cv_;
  std::deque<Call> calls_;
  std::vector<NcclComm*> comms_;  // communicators with device calls, alive (their destructor forgets them)
  std::thread thread_;
};

void watch(NcclComm* comm, const char* call) { Watchdog::instance().watch(comm, call); }
void forget(NcclComm* comm) { Watchdog::instance().forget(comm); }

class NcclTransfer final : public PendingTransfer {
 public:
  NcclTransfer(std::shared_ptr<NcclComm> comm, uint64_t ticket) : comm_(std::move(comm)), ticket_(ticket) {}
  ~NcclTransfer() override {
    // Like the MPI transfer: destruction completes it (here: issues it, if no wait did).
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (!comm_->issued(ticket_)) comm_->flush();
  }
  bool test() override {
    wait();
    return true;  // enqueued: the stream orders every later use of the buffer
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  uint64_t ticket_;
};

class NcclGroup final : public ProcessGroup {
 public:
  explicit NcclGroup(std::shared_ptr<ProcessGroup> host)
      : host_(std::move(host)), comm_(std::make_shared<NcclComm>(*host_)) {}
  ~NcclGroup() override {
    try {
      comm_->flush();
    } catch (...) {
    }
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }

  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    KS_CHECK(count >= 0, "all_reduce count ", count);
    if (count == 0) return;
    if (!on_device("all_reduce", {buf})) return host_->all_reduce(buf, count, dtype, op);
    ncclComm_t c = ready();
    comm_->check(nccl::api().AllReduce(buf, buf, size_t(count), type(dtype, "all_reduce"), nccl_op(op), c,
                                       cuda::stream()),
                 "ncclAllReduce");
    comm_->watched("ncclAllReduce");
  }

  // send == recv: the whole input sits in recv and block rank lands at its start (the MPI group's contract).
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    KS_CHECK(recv_count >= 0, "reduce_scatter count ", recv_count);
    if (recv_count == 0) return;
    if (!on_device("reduce_scatter", {send, recv})) return host_->reduce_scatter(send, recv, recv_count, dtype, op);
    ncclComm_t c = ready();
    // NCCL's in-place form is recv == send + rank * recv_count; for send == recv
    // reduce there and move the block to the start (disjoint for rank >= 1).
    void* out = send == recv ? offset(recv, int64_t(rank()) * recv_count, dtype) : recv;
    comm_->check(nccl::api().ReduceScatter(send, out, size_t(recv_count), type(dtype, "reduce_scatter"), nccl_op(op),
                                           c, cuda::stream()),
                 "ncclReduceScatter");
    if (out != recv)
      KS_CUDA_CHECK(cudaMemcpyAsync(recv, out, size_t(recv_count) * dtype_size(dtype), cudaMemcpyDeviceToDevice,
                                    cuda::stream()));
    comm_->watched("ncclReduceScatter");
  }

  // In place when send == recv + rank * send_count, for MPI and NCCL alike.
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    KS_CHECK(send_count >= 0, "all_gather count ", send_count);
    if (send_count == 0) return;
    if (!on_device("all_gather", {send, recv})) return host_->all_gather(send, recv, send_count, dtype);
    ncclComm_t c = ready();
    comm_->check(nccl::api().AllGather(send, recv, size_t(send_count), type(dtype, "all_gather"), c, cuda::stream()),
                 "ncclAllGather");
    comm_->watched("ncclAllGather");
  }

  void broadcast(void* buf, int64_t count, DType dtype, int root) override {
    KS_CHECK(count >= 0, "broadcast count ", count);
    check_peer(root, "broadcast");
    if (count == 0) return;
    if (!on_device("broadcast", {buf})) return host_->broadcast(buf, count, dtype, root);
    ncclComm_t c = ready();
    comm_->check(nccl::api().Broadcast(buf, buf, size_t(count), type(dtype, "broadcast"), root, c, cuda::stream()),
                 "ncclBroadcast");
    comm_->watched("ncclBroadcast");
  }

  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    KS_CHECK(count_per_rank >= 0, "all_to_all count ", count_per_rank);
    if (count_per_rank == 0) return;
    if (!on_device("all_to_all", {send, recv})) return host_->all_to_all(send, recv, count_per_rank, dtype);
    const std::vector<int64_t> counts(size_t(size()), count_per_rank);
    exchange("all_to_all", send, counts, recv, counts, dtype);
  }

  void all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DType dtype) override {
    if (!on_device("all_to_allv", {send, recv}))
      return host_->all_to_allv(send, send_counts, recv, recv_counts, dtype);
    exchange("all_to_allv", send, send_counts, recv, recv_counts, dtype);
  }

  // Blocking send and recv join the queued isend/irecv in one NCCL group, so
  // "isend to a peer, then recv from it" on both sides cannot deadlock.
  void send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    KS_CHECK(count >= 0 && tag >= 0, "send count ", count, " tag ", tag);
    check_peer(peer, "send");
    if (!on_device("send", {buf})) return host_->send(buf, count, dtype, peer, tag);
    (void)type(dtype, "send");
    comm_->enqueue({true, const_cast<void*>(buf), count, dtype, peer});
    comm_->flush();
  }

  void recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    KS_CHECK(count >= 0 && tag >= 0, "recv count ", count, " tag ", tag);
    check_peer(peer, "recv");
    if (!on_device("recv", {buf})) return host_->recv(buf, count, dtype, peer, tag);
    (void)type(dtype, "recv");
    comm_->enqueue({false, buf, count, dtype, peer});
    comm_->flush();
  }

  std::unique_ptr<PendingTransfer> isend(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    KS_CHECK(count >= 0 && tag >= 0, "isend count ", count, " tag ", tag);
    check_peer(peer, "isend");
    if (!on_device("isend", {buf})) return host_->isend(buf, count, dtype, peer, tag);
    (void)type(dtype, "isend");
    return std::make_unique<NcclTransfer>(comm_, comm_->enqueue({true, const_cast<void*>(buf), count, dtype, peer}));
  }

  std::unique_ptr<PendingTransfer> irecv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    KS_CHECK(count >= 0 && tag >= 0, "irecv count ", count, " tag ", tag);
    check_peer(peer, "irecv");
    if (!on_device("irecv", {buf})) return host_->irecv(buf, count, dtype, peer, tag);
    (void)type(dtype, "irecv");
    return std::make_unique<NcclTransfer>(comm_, comm_->enqueue({false, buf, count, dtype, peer}));
  }

  // The host group's barrier (queued device transfers are issued first).
  void barrier() override {
    comm_->flush();
    host_->barrier();
  }

 private:
  // Whether the call runs on NCCL: some buffer is device memory (all of them
  // must be, null ones aside), or every buffer is null.
  bool on_device(const char* call, std::initializer_list<const void*> bufs) const {
    int dev = 0, host = 0;
    for (const void* p : bufs)
      if (p) ++(cuda::is_device_pointer(p) ? dev : host);
    if (dev > 0 && host > 0)
      KS_FAIL(call, " on group '", name(), "': some buffers are device memory and some host memory; a call moves "
              "one kind (copy the host side to the device first)");
    return host == 0;
  }
  // The communicator, with the queued transfers issued before the next call.
  ncclComm_t ready() {
    comm_->flush();
    return comm_->handle();
  }
  ncclDataType_t type(DType dt, const char* call) const { return nccl_type(dt, call, name()); }
  void check_peer(int peer, const char* call) const {
    if (peer < 0 || peer >= size())
      KS_FAIL(call, " on group '", name(), "': peer rank ", peer, " is outside [0, ", size(), ")");
  }

  // Blocks of counts[r] elements, packed in rank order, to and from every
  // rank: one NCCL group of sends and receives (empty blocks skipped on both sides).
  void exchange(const char* call, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                const std::vector<int64_t>& recv_counts, DType dtype) {
    const int n = size();
    if (int(send_counts.size()) != n || int(recv_counts.size()) != n)
      KS_FAIL(call, " on group '", name(), "': ", send_counts.size(), " send counts and ", recv_counts.size(),
              " recv counts for ", n, " ranks (need one per rank)");
    KS_CHECK(send != recv, call, " on group '", name(), "' cannot run in place on device buffers");
    (void)type(dtype, call);
    std::vector<P2p> ops;
    int64_t so = 0, ro = 0;
    for (int r = 0; r < n; ++r) {
      KS_CHECK(send_counts[size_t(r)] >= 0 && recv_counts[size_t(r)] >= 0, call, ": negative count for rank ", r);
      if (send_counts[size_t(r)] > 0)
        ops.push_back({true, const_cast<char*>(offset(send, so, dtype)), send_counts[size_t(r)], dtype, r});
      if (recv_counts[size_t(r)] > 0) ops.push_back({false, offset(recv, ro, dtype), recv_counts[size_t(r)], dtype, r});
      so += send_counts[size_t(r)];
      ro += recv_counts[size_t(r)];
    }
    comm_->flush();
    if (!ops.empty()) comm_->run_group(ops);
  }

  std::shared_ptr<ProcessGroup> host_;
  std::shared_ptr<NcclComm> comm_;
};

}  // namespace

bool built_with_nccl() { return true; }

std::shared_ptr<ProcessGroup> device_group(std::shared_ptr<ProcessGroup> host) {
  if (!host || host->size() == 1 || dynamic_cast<NcclGroup*>(host.get())) return host;
  return std::make_shared<NcclGroup>(std::move(host));
}

}  // namespace kestrel::comm
