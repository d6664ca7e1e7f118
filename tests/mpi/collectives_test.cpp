// Every MpiGroup collective against values computed locally, for the dtypes
// and ops training uses. Runs under mpirun -np 2 and -np 4 (also -np 1).
#include <climits>
#include <chrono>
#include <cmath>
#include <thread>

#include "comm/mpi/mpi_group.h"
#include "comm/world.h"
#include "common/testing.h"
#include "mpi_testing.h"

using namespace kestrel;
using namespace kestrel::comm;
using kestrel::testing::small_value;
using kestrel::testing::world_group;

namespace {

// Stores doubles into a buffer of `dt` and reads them back.
std::vector<uint8_t> encode(const std::vector<double>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    void* p = out.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::F32: { float f = float(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::BF16: { uint16_t b = float_to_bf16(float(v[i])); std::memcpy(p, &b, 2); break; }
      case DType::F16: { uint16_t h = float_to_f16(float(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::I32: { int32_t x = int32_t(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::I64: { int64_t x = int64_t(v[i]); std::memcpy(p, &x, 8); break; }
      case DType::U8: { uint8_t x = uint8_t(v[i]); std::memcpy(p, &x, 1); break; }
    }
  }
  return out;
}
std::vector<double> decode(const std::vector<uint8_t>& b, DType dt) {
  std::vector<double> out(b.size() / dtype_size(dt));
  for (size_t i = 0; i < out.size(); ++i) {
    const void* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::F32: { float f; std::memcpy(&f, p, 4); out[i] = f; break; }
      case DType::BF16: { uint16_t x; std::memcpy(&x, p, 2); out[i] = bf16_to_float(x); break; }
      case DType::F16: { uint16_t x; std::memcpy(&x, p, 2); out[i] = f16_to_float(x); break; }
      case DType::I32: { int32_t x; std::memcpy(&x, p, 4); out[i] = x; break; }
      case DType::I64: { int64_t x; std::memcpy(&x, p, 8); out[i] = double(x); break; }
      case DType::U8: { uint8_t x; std::memcpy(&x, p, 1); out[i] = x; break; }
    }
  }
  return out;
}

// The reduction of small_value(q, i) over ranks q, rounded into dt like the group does.
double reduced(int n, int64_t i, ReduceOp op, DType dt) {
  double s = 0, mx = -1e9, mn = 1e9;
  for (int q = 0; q < n; ++q) {
    const double v = small_value(q, i);
    s += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  switch (op) {
    case ReduceOp::Sum: return s;
    case ReduceOp::Max: return mx;
    case ReduceOp::Min: return mn;
    case ReduceOp::Avg:
      if (dt == DType::I32 || dt == DType::I64) return double(int64_t(s) / n);
      if (dt == DType::BF16) return round_bf16(float(s) / float(n));
      if (dt == DType::F16) return f16_to_float(float_to_f16(float(s) / float(n)));
      return float(s) / float(n);
  }
  return 0;
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};
const char* op_name(ReduceOp op) {
  const char* names[] = {"sum", "max", "min", "avg"};
  return names[int(op)];
}

}  // namespace

TEST(MpiCollectives, WorldIsMpi) {
  EXPECT_TRUE(World::current()->uses_mpi());
  EXPECT_EQ(World::current()->size(), world_group().size());
  EXPECT_NE(dynamic_cast<MpiGroup*>(&world_group()), nullptr);
  world_group().barrier();
}

TEST(MpiCollectives, AllReduceEveryDtypeAndOp) {
  auto& g = world_group();
  const int64_t n = 1003;
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps) {
      std::vector<double> mine(n), want(n);
      for (int64_t i = 0; i < n; ++i) {
        mine[i] = small_value(g.rank(), i);
        want[i] = reduced(g.size(), i, op, dt);
      }
      auto buf = encode(mine, dt);
      g.all_reduce(buf.data(), n, dt, op);
      EXPECT_EQ(decode(buf, dt), want) << dtype_name(dt) << " " << op_name(op);
    }
}

TEST(MpiCollectives, AllReduceBf16RandomSumWithinRounding) {
  auto& g = world_group();
  const int64_t n = 4096;
  std::vector<uint16_t> buf(n);
  std::vector<double> want(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int q = 0; q < g.size(); ++q) want[i] += round_bf16(kestrel::testing::uniform_value(7, q, i));
    buf[i] = float_to_bf16(kestrel::testing::uniform_value(7, g.rank(), i));
  }
  g.all_reduce(buf.data(), n, DType::BF16, ReduceOp::Sum);
  std::vector<double> got(n);
  for (int64_t i = 0; i < n; ++i) got[i] = bf16_to_float(buf[i]);
  // size-1 roundings of partial sums bounded by size: one bf16 ulp of 4 is 2^-5.
  EXPECT_TRUE(kestrel::testing::all_close(got, want, {0.05, 0.0}, "bf16 sum"));
  // Every rank holds the same bits.
  std::vector<uint16_t> mx = buf, mn = buf;
  g.all_reduce(mx.data(), n, DType::BF16, ReduceOp::Max);
  g.all_reduce(mn.data(), n, DType::BF16, ReduceOp::Min);
  EXPECT_EQ(mx, buf);
  EXPECT_EQ(mn, buf);
}

TEST(MpiCollectives, ReduceScatter) {
  auto& g = world_group();
  const int64_t m = 37;
  for (DType dt : {DType::F32, DType::BF16, DType::I32})
    for (ReduceOp op : kOps) {
      std::vector<double> mine(m * g.size()), want(m);
      for (int64_t i = 0; i < m * g.size(); ++i) mine[i] = small_value(g.rank(), i);
      for (int64_t j = 0; j < m; ++j) want[j] = reduced(g.size(), g.rank() * m + j, op, dt);
      auto send = encode(mine, dt);
      std::vector<uint8_t> recv(m * dtype_size(dt));
      g.reduce_scatter(send.data(), recv.data(), m, dt, op);
      EXPECT_EQ(decode(recv, dt), want) << dtype_name(dt) << " " << op_name(op);
      // In place: the result lands at the start of the buffer.
      g.reduce_scatter(send.data(), send.data(), m, dt, op);
      send.resize(recv.size());
      EXPECT_EQ(decode(send, dt), want) << "in place " << dtype_name(dt) << " " << op_name(op);
    }
}

TEST(MpiCollectives, AllGatherAndInPlace) {
  auto& g = world_group();
  const int64_t m = 5;
  std::vector<int64_t> mine(m), got(m * g.size()), want(m * g.size());
  for (int64_t j = 0; j < m; ++j) mine[j] = small_value(g.rank(), j) + (int64_t(1) << 40);
  for (int q = 0; q < g.size(); ++q)
    for (int64_t j = 0; j < m; ++j) want[q * m + j] = small_value(q, j) + (int64_t(1) << 40);
  g.all_gather(mine.data(), got.data(), m, DType::I64);
  EXPECT_EQ(got, want);
  std::vector<int64_t> inplace(m * g.size(), -1);
  std::copy(mine.begin(), mine.end(), inplace.begin() + g.rank() * m);
  g.all_gather(inplace.data() + g.rank() * m, inplace.data(), m, DType::I64);
  EXPECT_EQ(inplace, want);
  // bf16 travels through the 2-byte type unchanged.
  uint16_t b = float_to_bf16(0.1f * float(g.rank() + 1));
  std::vector<uint16_t> bs(g.size());
  g.all_gather(&b, bs.data(), 1, DType::BF16);
  for (int q = 0; q < g.size(); ++q) EXPECT_EQ(bs[q], float_to_bf16(0.1f * float(q + 1)));
}

TEST(MpiCollectives, BroadcastFromEveryRoot) {
  auto& g = world_group();
  for (int root = 0; root < g.size(); ++root) {
    std::vector<float> buf(100);
    for (int64_t i = 0; i < 100; ++i) buf[i] = g.rank() == root ? float(small_value(root, i)) + 0.5f : -99.0f;
    g.broadcast(buf.data(), 100, DType::F32, root);
    for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(buf[i], float(small_value(root, i)) + 0.5f) << "root " << root;
  }
  std::vector<uint16_t> h(3, g.rank() == 0 ? float_to_f16(1.5f) : 0);
  g.broadcast(h.data(), 3, DType::F16, 0);
  EXPECT_EQ(h, std::vector<uint16_t>(3, float_to_f16(1.5f)));
}

TEST(MpiCollectives, AllToAllAndInPlace) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  const int64_t m = 3;
  // Rank r sends block q (elements 1000r + 10q + j) to rank q.
  std::vector<int32_t> send(n * m), recv(n * m), want(n * m);
  for (int q = 0; q < n; ++q)
    for (int64_t j = 0; j < m; ++j) {
      send[q * m + j] = 1000 * r + 10 * q + int32_t(j);
      want[q * m + j] = 1000 * q + 10 * r + int32_t(j);
    }
  g.all_to_all(send.data(), recv.data(), m, DType::I32);
  EXPECT_EQ(recv, want);
  g.all_to_all(send.data(), send.data(), m, DType::I32);
  EXPECT_EQ(send, want);
}

TEST(MpiCollectives, AllToAllvUnevenCountsWithZeros) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  // count(src, dst) includes zeros (a rank that routes no tokens to an expert).
  auto count = [](int src, int dst) { return int64_t((src + 2 * dst) % 3 + (src == dst ? 0 : 1)); };
  std::vector<int64_t> sc(n), rc(n);
  std::vector<float> send, want;
  for (int q = 0; q < n; ++q) {
    sc[q] = count(r, q);
    rc[q] = count(q, r);
    for (int64_t j = 0; j < sc[q]; ++j) send.push_back(float(1000 * r + 10 * q + j));
    for (int64_t j = 0; j < rc[q]; ++j) want.push_back(float(1000 * q + 10 * r + j));
  }
  std::vector<float> recv(want.size(), -1.0f);
  send.push_back(0.0f);  // keep data() distinct from recv even when empty
  g.all_to_allv(send.data(), sc, recv.data(), rc, DType::F32);
  EXPECT_EQ(recv, want);
  EXPECT_THROW(g.all_to_allv(send.data(), {1}, recv.data(), rc, DType::F32), Error);
}

TEST(MpiCollectives, SendRecvRing) {
  auto& g = world_group();
  const int n = g.size(), r = g.rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<int64_t> out(64), in(64, -1);
  for (int64_t i = 0; i < 64; ++i) out[i] = int64_t(r) * 100000 + i;
  // Even ranks send first, odd ranks receive first: no cycle of blocked sends.
  if (r % 2 == 0) {
    g.send(out.data(), 64, DType::I64, next, 5);
    g.recv(in.data(), 64, DType::I64, prev, 5);
  } else {
    g.recv(in.data(), 64, DType::I64, prev, 5);
    g.send(out.data(), 64, DType::I64, next, 5);
  }
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(in[i], int64_t(prev) * 100000 + i);
}

TEST(MpiCollectives, RecvSizeMismatchIsAnError) {
  auto& g = world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  float buf[8] = {};
  if (g.rank() == 0) {
    g.send(buf, 3, DType::F32, 1, 11);
    g.send(buf, 8, DType::F32, 1, 12);
  } else if (g.rank() == 1) {
    try {
      g.recv(buf, 5, DType::F32, 0, 11);
      ADD_FAILURE() << "short message accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected 5 f32 elements, the matching send carried 3"), std::string::npos)
          << e.what();
    }
    try {  // a longer message than the buffer: MPI's own error, converted
      g.recv(buf, 4, DType::F32, 0, 12);
      ADD_FAILURE() << "truncated message accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MPI_Recv failed on group 'world' (rank 1 of"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("MPI_ERR_TRUNCATE"), std::string::npos) << e.what();
    }
  }
  g.barrier();
}

TEST(MpiCollectives, BadArgumentsFailBeforeCommunicating) {
  auto& g = world_group();
  float x = 0;
  EXPECT_THROW(g.broadcast(&x, 1, DType::F32, g.size()), Error);
  EXPECT_THROW(g.send(&x, 1, DType::F32, -1, 0), Error);
  try {
    g.all_gather(nullptr, nullptr, int64_t(INT_MAX) + 1, DType::F32);
    ADD_FAILURE() << "a count above INT_MAX was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet: MPI_Allgather on group 'world' with send_count 2147483648"),
              std::string::npos)
        << e.what();
  }
}

TEST(MpiCollectives, SplitEvenOddReversedKeys) {
  World& w = *World::current();
  const int r = w.rank();
  // Rank 0 opts out; the others split by parity, ordered by descending world rank.
  auto sub = w.split(r == 0 ? World::kNoGroup : r % 2, -r, "parity");
  if (r == 0) {
    EXPECT_EQ(sub, nullptr);
  } else if (!sub) {
    ADD_FAILURE() << "rank " << r << " got no group";
  } else {
    std::vector<int> members;
    for (int q = w.size() - 1; q >= 1; --q)
      if (q % 2 == r % 2) members.push_back(q);
    EXPECT_EQ(sub->size(), int(members.size()));
    EXPECT_EQ(sub->name(), "parity");
    std::vector<int32_t> got(sub->size());
    int32_t me = r;
    sub->all_gather(&me, got.data(), 1, DType::I32);
    EXPECT_EQ(std::vector<int>(got.begin(), got.end()), members);
    int32_t s = r;
    sub->all_reduce(&s, 1, DType::I32, ReduceOp::Sum);
    int32_t want = 0;
    for (int q : members) want += q;
    EXPECT_EQ(s, want);
  }
  w.group()->barrier();
}

// Rank 0's one-time start-up work (the GEMM measurement, the SFT warm start)
// is waited for without the collective timeout, which is restored after:
// stop 36's CI aborted a run whose rank 1 waited 9 s at the start-up barrier
// under nccl_timeout=8 while rank 0 measured the GEMM libraries.
TEST(MpiCollectives, StartUpWindowWaitsPastTheTimeout) {
  auto& g = world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const double saved = World::collective_timeout();
  World::set_collective_timeout(1);
  {
    const UntimedCollectives window;
    EXPECT_EQ(World::collective_timeout(), 0);
    if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // "measuring"
    g.barrier();  // past the 1 s timeout on every other rank: aborted the job before the fix
  }
  EXPECT_EQ(World::collective_timeout(), 1);
  g.barrier();  // timed again, and every rank is here
  World::set_collective_timeout(saved);
}
