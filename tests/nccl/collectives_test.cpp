// The NCCL transport (comm/device_group.h) under mpirun: every collective and
// point-to-point call on device buffers gives what the same call on host
// buffers gives over MPI, byte for byte, for f32, bf16, f16, i32 and i64 and
// every reduction. Values are small integers, so sums, maxima and averages
// over 2 or 4 ranks are exact in every dtype (Avg of integers truncates on
// both transports). On the emulator NCCL is tests/cuda_emu's fake over MPI;
// on GPUs (one per rank) the real library.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "comm/device_group.h"
#include "comm/nodes.h"
#include "mpi/mpi_testing.h"
#include "nccl_testing.h"
#include "parallel/grid.h"

namespace kestrel::testing {
namespace {

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
constexpr comm::ReduceOp kOps[] = {comm::ReduceOp::Sum, comm::ReduceOp::Max, comm::ReduceOp::Min,
                                   comm::ReduceOp::Avg};

// n values of this rank (salted), on the host.
Tensor host_values(int64_t n, DType dt, int rank, int salt = 0) {
  Tensor t = Tensor::empty({n}, dt, MemCategory::Other);
  for (int64_t i = 0; i < n; ++i) t.set(i, float(small_value(rank + salt, i)));
  return t;
}

// The device tensor's bytes equal the host tensor's.
void expect_same_bytes(const Tensor& dev, const Tensor& host, const std::string& what) {
  ASSERT_EQ(dev.device(), Device::CUDA) << what;
  const Tensor back = dev.copy_to(Device::CPU);
  ASSERT_EQ(back.nbytes(), host.nbytes()) << what;
  EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0)
      << what << ": device " << back.to_float_vector()[0] << ", ... vs host " << host.to_float_vector()[0] << ", ...";
}

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_ready()) GTEST_SKIP() << "no device: " << cuda::describe();
  }
  comm::ProcessGroup& g() { return device_world(); }
};

TEST_F(NcclCollectives, AllReduceEveryOpAndDtype) {
  const int64_t n = 37;
  for (DType dt : kDtypes)
    for (comm::ReduceOp op : kOps) {
      Tensor h = host_values(n, dt, g().rank());
      Tensor d = h.copy_to(Device::CUDA);
      g().all_reduce(h, op);  // host buffers: MPI
      g().all_reduce(d, op);  // device buffers: NCCL
      expect_same_bytes(d, h, std::string("all_reduce ") + dtype_name(dt) + " op " + std::to_string(int(op)));
      if (op == comm::ReduceOp::Sum) {  // and the MPI result is the sum
        float want = 0;
        for (int r = 0; r < g().size(); ++r) want += float(small_value(r, 5));
        EXPECT_EQ(h.get(5), want) << dtype_name(dt);
      }
    }
}

TEST_F(NcclCollectives, ReduceScatterAndAllGatherAlsoInPlace) {
  const int64_t n = 5, P = g().size();
  for (DType dt : kDtypes) {
    const std::string what = dtype_name(dt);
    for (comm::ReduceOp op : {comm::ReduceOp::Sum, comm::ReduceOp::Avg}) {
      Tensor hs = host_values(n * P, dt, g().rank()), hr = Tensor::zeros({n}, dt, MemCategory::Other);
      Tensor ds = hs.copy_to(Device::CUDA), dr = Tensor::zeros({n}, dt, MemCategory::Other, Device::CUDA);
      g().reduce_scatter(hs, hr, op);
      g().reduce_scatter(ds, dr, op);
      expect_same_bytes(dr, hr, "reduce_scatter " + what);
      // send == recv: the whole input in the buffer, the reduced block at its start.
      Tensor hi = host_values(n * P, dt, g().rank(), 3), di = hi.copy_to(Device::CUDA);
      g().reduce_scatter(hi.raw(), hi.raw(), n, dt, op);
      g().reduce_scatter(di.raw(), di.raw(), n, dt, op);
      expect_same_bytes(di.slice_rows(0, n), hi.slice_rows(0, n).clone(), "reduce_scatter in place " + what);
    }
    Tensor hs = host_values(n, dt, g().rank()), hr = Tensor::zeros({n * P}, dt, MemCategory::Other);
    Tensor ds = hs.copy_to(Device::CUDA), dr = Tensor::zeros({n * P}, dt, MemCategory::Other, Device::CUDA);
    g().all_gather(hs, hr);
    g().all_gather(ds, dr);
    expect_same_bytes(dr, hr, "all_gather " + what);
    // In place: this rank's block already at recv + rank * n.
    Tensor hi = Tensor::zeros({n * P}, dt, MemCategory::Other), di;
    hi.slice_rows(g().rank() * n, (g().rank() + 1) * n).copy_from(hs);
    di = hi.copy_to(Device::CUDA);
    g().all_gather(hi.slice_rows(g().rank() * n, (g().rank() + 1) * n).raw(), hi.raw(), n, dt);
    g().all_gather(di.slice_rows(g().rank() * n, (g().rank() + 1) * n).raw(), di.raw(), n, dt);
    expect_same_bytes(di, hi, "all_gather in place " + what);
    expect_same_bytes(di, hr, "all_gather in place equals out of place " + what);
  }
}

TEST_F(NcclCollectives, BroadcastFromEveryRoot) {
  for (DType dt : kDtypes)
    for (int root = 0; root < g().size(); ++root) {
      Tensor h = host_values(11, dt, g().rank()), d = h.copy_to(Device::CUDA);
      g().broadcast(h, root);
      g().broadcast(d, root);
      expect_same_bytes(d, h, std::string("broadcast ") + dtype_name(dt) + " root " + std::to_string(root));
      EXPECT_EQ(h.get(3), float(small_value(root, 3)));
    }
}

TEST_F(NcclCollectives, AllToAllAndAllToAllv) {
  const int P = g().size(), me = g().rank();
  for (DType dt : kDtypes) {
    const std::string what = dtype_name(dt);
    Tensor hs = host_values(3 * P, dt, me), hr = Tensor::zeros({3 * P}, dt, MemCategory::Other);
    Tensor ds = hs.copy_to(Device::CUDA), dr = Tensor::zeros({3 * P}, dt, MemCategory::Other, Device::CUDA);
    g().all_to_all(hs.raw(), hr.raw(), 3, dt);
    g().all_to_all(ds.raw(), dr.raw(), 3, dt);
    expect_same_bytes(dr, hr, "all_to_all " + what);
    // Rank s sends (s + 2 d) % 4 elements to rank d: uneven, some blocks empty.
    auto count = [](int s, int d) { return int64_t((s + 2 * d) % 4); };
    std::vector<int64_t> sc(static_cast<size_t>(P)), rc(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) {
      sc[size_t(r)] = count(me, r);
      rc[size_t(r)] = count(r, me);
    }
    const int64_t ns = std::accumulate(sc.begin(), sc.end(), int64_t(0));
    const int64_t nr = std::accumulate(rc.begin(), rc.end(), int64_t(0));
    Tensor hv = host_values(std::max<int64_t>(ns, 1), dt, me, 1);
    Tensor hw = Tensor::zeros({std::max<int64_t>(nr, 1)}, dt, MemCategory::Other);
    Tensor dv = hv.copy_to(Device::CUDA), dw = Tensor::zeros(hw.shape(), dt, MemCategory::Other, Device::CUDA);
    g().all_to_allv(hv, sc, hw, rc);
    g().all_to_allv(dv, sc, dw, rc);
    expect_same_bytes(dw, hw, "all_to_allv " + what);
  }
}

TEST_F(NcclCollectives, SendRecvInOrderAndARingThatCannotDeadlock) {
  const int P = g().size(), me = g().rank();
  for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
    const std::string what = dtype_name(dt);
    // Blocking: rank 0 sends two messages to rank 1 on different tags; they arrive in posting order.
    if (me == 0) {
      g().send(host_values(6, dt, 0).copy_to(Device::CUDA), 1, 7);
      g().send(host_values(6, dt, 0, 5).copy_to(Device::CUDA), 1, 8);
    } else if (me == 1) {
      Tensor a = Tensor::zeros({6}, dt, MemCategory::Other, Device::CUDA), b = a.clone();
      g().recv(a, 0, 7);
      g().recv(b, 0, 8);
      expect_same_bytes(a, host_values(6, dt, 0), "send/recv first " + what);
      expect_same_bytes(b, host_values(6, dt, 0, 5), "send/recv second " + what);
    }
    // A ring as context parallelism runs it: every rank posts its receives from prev (K then V), then its
    // sends to next (K then V), then waits. One at a time on a stream this would deadlock on NCCL.
    const int next = (me + 1) % P, prev = (me + P - 1) % P;
    Tensor k = host_values(9, dt, me).copy_to(Device::CUDA), v = host_values(4, dt, me, 2).copy_to(Device::CUDA);
    Tensor rk = Tensor::zeros({9}, dt, MemCategory::Other, Device::CUDA);
    Tensor rv = Tensor::zeros({4}, dt, MemCategory::Other, Device::CUDA);
    auto a = g().irecv(rk, prev, 1), b = g().irecv(rv, prev, 2);
    auto c = g().isend(k, next, 1), e = g().isend(v, next, 2);
    b->wait();
    EXPECT_TRUE(a->test());
    a->wait();
    c->wait();
    e->wait();
    expect_same_bytes(rk, host_values(9, dt, prev), "ring K " + what);
    expect_same_bytes(rv, host_values(4, dt, prev, 2), "ring V " + what);
  }
  g().barrier();
}

TEST_F(NcclCollectives, MixedBuffersFailNamingTheGroup) {
  Tensor h = host_values(4, DType::F32, 0), d = Tensor::zeros({4 * g().size()}, DType::F32, MemCategory::Other,
                                                               Device::CUDA);
  try {
    g().all_gather(h.raw(), d.raw(), 4, DType::F32);
    ADD_FAILURE() << "a host send buffer with a device receive buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'world'"), std::string::npos) << e.what();
  }
}

// The grid built for the device: its groups move device buffers, and a device group wraps only once.
TEST_F(NcclCollectives, GridGroupsOnTheDevice) {
  parallel::ParallelDims dims;
  dims.tp = 2;
  parallel::ProcessGrid grid(*comm::World::current(), dims, Device::CUDA);
  comm::ProcessGroup& tp = grid.tp();
  Tensor h = host_values(8, DType::BF16, tp.rank()), d = h.copy_to(Device::CUDA);
  tp.all_reduce(h);
  tp.all_reduce(d);
  expect_same_bytes(d, h, "tp all_reduce");
  EXPECT_EQ(grid.adopt(grid.group(parallel::GroupKind::Tp)), grid.group(parallel::GroupKind::Tp));
  Tensor w = Tensor::from_host(std::vector<int32_t>{1}, {1}, MemCategory::Other, Device::CUDA);
  grid.world()->all_reduce(w);
  EXPECT_EQ(w.copy_to(Device::CPU).get(0), float(g().size()));
}

}  // namespace
}  // namespace kestrel::testing
