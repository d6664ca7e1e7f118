// Context-parallel attention under mpirun (2 or 4 ranks, the world as the cp
// group; tests/scripts/mpi_cp_attention.sh): Ulysses, ring (zigzag) and the
// hybrid (2x2 on 4 ranks) give every real row the output, log-sum-exp and
// dq/dk/dv of one process's ops::attention_fwd/bwd over the full batch --
// several sequences of mixed lengths (shorter than 2cp up to 1000 tokens),
// GQA, MHA, kv heads fewer than the Ulysses degree, values narrower than the
// heads. f32 within 1e-5 of the largest reference value; bf16 within 2^-8 of
// it (one bf16 rounding step at the top of the range: both sides round once
// from f32 sums taken in different orders; measured up to 4.3e-4). Pad rows get zero
// gradients. The bytes each rank sends equal cp_attention_bytes, counted by
// decorating the groups. Every rank runs the reference itself.
#include <cmath>
#include <cstdio>
#include <memory>

#include "comm/world.h"
#include "core/rng.h"
#include "mpi_testing.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "parallel/comm_counter.h"
#include "parallel/cp_attention.h"
#include "parallel/grid.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {

// The ring's point-to-point bytes: parallel::CountingGroup counts all-to-alls
// but sends its isend through the blocking send (ProcessGroup's default),
// which can deadlock a ring whose ranks all send first; this decorator
// forwards isend/irecv and counts the bytes sent.
class RingCounter final : public comm::ProcessGroup {
 public:
  explicit RingCounter(std::shared_ptr<comm::ProcessGroup> inner) : in_(std::move(inner)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  std::string name() const override { return in_->name(); }
  void all_reduce(void* b, int64_t n, DType d, comm::ReduceOp op) override { in_->all_reduce(b, n, d, op); }
  void reduce_scatter(const void* s, void* r, int64_t n, DType d, comm::ReduceOp op) override {
    in_->reduce_scatter(s, r, n, d, op);
  }
  void all_gather(const void* s, void* r, int64_t n, DType d) override { in_->all_gather(s, r, n, d); }
  void broadcast(void* b, int64_t n, DType d, int root) override { in_->broadcast(b, n, d, root); }
  void all_to_all(const void* s, void* r, int64_t n, DType d) override { in_->all_to_all(s, r, n, d); }
  void all_to_allv(const void* s, const std::vector<int64_t>& sc, void* r, const std::vector<int64_t>& rc,
                   DType d) override {
    in_->all_to_allv(s, sc, r, rc, d);
  }
  void send(const void* b, int64_t n, DType d, int peer, int tag) override {
    count(n, d);
    in_->send(b, n, d, peer, tag);
  }
  void recv(void* b, int64_t n, DType d, int peer, int tag) override { in_->recv(b, n, d, peer, tag); }
  std::unique_ptr<comm::PendingTransfer> isend(const void* b, int64_t n, DType d, int peer, int tag) override {
    count(n, d);
    return in_->isend(b, n, d, peer, tag);
  }
  std::unique_ptr<comm::PendingTransfer> irecv(void* b, int64_t n, DType d, int peer, int tag) override {
    return in_->irecv(b, n, d, peer, tag);
  }
  void barrier() override { in_->barrier(); }
  using comm::ProcessGroup::irecv;
  using comm::ProcessGroup::isend;

  double bytes = 0;
  int64_t sends = 0;

 private:
  void count(int64_t n, DType d) {
    bytes += double(n) * double(dtype_size(d));
    ++sends;
  }
  std::shared_ptr<comm::ProcessGroup> in_;
};

// Uniform in [-a, a), the same on every rank.
Tensor rnd(Shape s, uint64_t seed, DType dt, float a = 1.f) {
  Tensor t = Tensor::empty(s, DType::F32, MemCategory::Other);
  Philox p{seed, 7};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, a * (2 * p.uniform(uint64_t(i)) - 1));
  return dt == DType::F32 ? t : t.to(dt);
}

struct Case {
  const char* name;
  int64_t H, Hkv, hd, vd;  // vd 0: = hd
  DType dt = DType::F32;
};

// cp ranks for the 2- and 4-rank runs share one batch: lengths below 2cp,
// around it, and long.
const std::vector<int> kLens = {1, 3, 7, 9, 61, 1000};

struct FullBatch {
  std::vector<int32_t> cu{0}, pos;
  Tensor cu_t;
  FullBatch() {
    for (int L : kLens) {
      for (int i = 0; i < L; ++i) pos.push_back(i);
      cu.push_back(int32_t(pos.size()));
    }
    cu_t = Tensor::from_host(cu, {int64_t(cu.size())});
  }
  int64_t T() const { return int64_t(pos.size()); }
};

// max |a - b| / max |ref| over all elements (the reference's scale).
double rel_err(const Tensor& a, const Tensor& ref) {
  const auto x = a.to_float_vector(), y = ref.to_float_vector();
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    d = std::max(d, std::abs(double(x[i]) - double(y[i])));
    m = std::max(m, std::abs(double(y[i])));
  }
  return d / m;
}

struct Groups {
  std::unique_ptr<ProcessGrid> grid;
  CpGroups g;
  std::shared_ptr<CountingGroup> ulysses_count;
  std::shared_ptr<RingCounter> ring_count;
};

Groups make_groups(int u) {
  const comm::World& world = *comm::World::current();
  Groups G;
  ParallelDims d;
  d.cp = world.size();
  G.grid = std::make_unique<ProcessGrid>(world, d);
  G.g = make_cp_groups(world, *G.grid, u);
  G.ulysses_count = std::make_shared<CountingGroup>(G.g.ulysses);
  G.ring_count = std::make_shared<RingCounter>(G.g.ring);
  G.g.ulysses = G.ulysses_count;
  G.g.ring = G.ring_count;
  return G;
}

// Runs one case on the world as the cp group with Ulysses degree u and checks
// everything against the one-process attention.
void check_case(const Case& c, int u, const char* algo) {
  SCOPED_TRACE(::testing::Message() << algo << " u " << u << " " << c.name << " " << dtype_name(c.dt));
  Groups G = make_groups(u);
  const int cp = G.g.cp->size(), rank = G.g.cp->rank();
  const FullBatch fb;
  const int64_t T = fb.T();
  const CpLayout L = make_cp_layout({&fb.cu, &fb.pos}, cp, rank, u);
  ops::AttentionShape s{c.H, c.Hkv, c.hd, 0.f, c.vd};
  const int64_t vd = s.value_dim();
  const double tol = c.dt == DType::F32 ? 1e-5 : 1.0 / 256;

  // The one-process reference over the full batch.
  Tensor q = rnd({T, c.H * c.hd}, 1, c.dt), k = rnd({T, c.Hkv * c.hd}, 2, c.dt), v = rnd({T, c.Hkv * vd}, 3, c.dt);
  Tensor dout = rnd({T, c.H * vd}, 4, c.dt);
  Tensor out = Tensor::empty({T, c.H * vd}, c.dt), lse = Tensor::empty({c.H, T}, DType::F32);
  ops::attention_fwd(q, k, v, fb.cu_t, s, out, lse);
  Tensor dq = Tensor::empty(q.shape(), c.dt), dk = Tensor::empty(k.shape(), c.dt), dv = Tensor::empty(v.shape(), c.dt);
  ops::attention_bwd(q, k, v, out, lse, dout, fb.cu_t, s, dq, dk, dv);

  // This rank's rows; pad rows of q/k/v hold junk that must not reach a real row.
  Tensor ql = cp_local_rows(L, q, 0.37f), kl = cp_local_rows(L, k, -0.61f), vl = cp_local_rows(L, v, 0.83f);
  Tensor doutl = cp_local_rows(L, dout, 0.f);  // pad rows never reach a loss
  const int64_t Tl = L.local_tokens;
  Tensor outl = Tensor::empty({Tl, c.H * vd}, c.dt);
  CpAttentionSaved saved;
  G.ulysses_count->reset();
  G.ring_count->bytes = 0;
  G.ring_count->sends = 0;
  cp_attention_fwd(G.g, L, s, ql, kl, vl, outl, saved);
  const double fwd_a2a = G.ulysses_count->stats().of(CollectiveKind::AllToAll).wire_bytes;
  const int64_t fwd_a2a_calls = G.ulysses_count->stats().of(CollectiveKind::AllToAll).calls;
  const double fwd_ring = G.ring_count->bytes;
  const int64_t fwd_sends = G.ring_count->sends;
  G.ulysses_count->reset();
  G.ring_count->bytes = 0;
  G.ring_count->sends = 0;
  Tensor dql = Tensor::empty(ql.shape(), c.dt), dkl = Tensor::empty(kl.shape(), c.dt);
  Tensor dvl = Tensor::empty(vl.shape(), c.dt);
  cp_attention_bwd(G.g, L, s, saved, doutl, dql, dkl, dvl);

  // Bytes against the closed form.
  const CpAttentionBytes want = cp_attention_bytes(L, s, c.dt);
  EXPECT_EQ(fwd_a2a, want.ulysses_fwd);
  EXPECT_EQ(fwd_a2a_calls, want.ulysses_calls_fwd);
  EXPECT_EQ(fwd_ring, want.ring_fwd);
  EXPECT_EQ(fwd_sends, want.ring_sends_fwd);
  EXPECT_EQ(G.ulysses_count->stats().of(CollectiveKind::AllToAll).wire_bytes, want.ulysses_bwd);
  EXPECT_EQ(G.ulysses_count->stats().of(CollectiveKind::AllToAll).calls, want.ulysses_calls_bwd);
  EXPECT_EQ(G.ring_count->bytes, want.ring_bwd);
  EXPECT_EQ(G.ring_count->sends, want.ring_sends_bwd);
  if (rank == 0)
    std::printf("[cp bytes] %s cp=%d u=%d %s %s Tl=%lld: fwd all-to-all %.0f B (%lld calls) + ring %.0f B (%lld "
                "sends); bwd all-to-all %.0f B + ring %.0f B\n",
                algo, cp, u, c.name, dtype_name(c.dt), (long long)Tl, fwd_a2a, (long long)fwd_a2a_calls, fwd_ring,
                (long long)fwd_sends, G.ulysses_count->stats().of(CollectiveKind::AllToAll).wire_bytes,
                G.ring_count->bytes);

  // Every real row against the reference (gathered from every rank).
  const struct { const char* what; const Tensor& local; const Tensor& ref; } cmp[] = {
      {"out", outl, out}, {"dq", dql, dq}, {"dk", dkl, dk}, {"dv", dvl, dv}};
  for (const auto& x : cmp) {
    const double e = rel_err(cp_gather_rows(*G.g.cp, L, x.local), x.ref);
    EXPECT_LE(e, tol) << x.what;
    if (rank == 0) std::printf("[cp err] %s cp=%d u=%d %s %s %s: %.3g\n", algo, cp, u, c.name, dtype_name(c.dt),
                               x.what, e);
  }
  // Pad rows: zero gradients.
  for (const Tensor* g : {&dql, &dkl, &dvl}) {
    const auto h = g->to_float_vector();
    const int64_t w = g->size(1);
    int bad = 0;
    for (int64_t i = 0; i < Tl; ++i)
      if (L.local.full_row[size_t(i)] < 0)
        for (int64_t j = 0; j < w; ++j) bad += h[size_t(i * w + j)] != 0.f;
    EXPECT_EQ(bad, 0) << "nonzero gradient on pad rows";
  }
  // The log-sum-exp of this rank's heads on its work rows equals the reference's.
  const int64_t Hw = c.H / u, Tg = L.work_tokens;
  ASSERT_EQ(saved.lse.shape(), (Shape{Hw, Tg}));
  const auto lw = saved.lse.to_float_vector(), lr = lse.to_float_vector();
  double lse_err = 0;
  for (int64_t h = 0; h < Hw; ++h)
    for (int64_t w = 0; w < Tg; ++w) {
      const int32_t f = L.work.full_row[size_t(w)];
      if (f < 0) continue;
      const int64_t head = L.ulysses_index() * Hw + h;
      lse_err = std::max(lse_err, std::abs(double(lw[size_t(h * Tg + w)]) - double(lr[size_t(head * T + f)])));
    }
  EXPECT_LE(lse_err, c.dt == DType::F32 ? 1e-4 : 1e-2) << "lse";
}

const Case kF32Cases[] = {
    {"gqa", 4, 2, 16, 0},
    {"mha", 4, 4, 16, 0},
    {"kv1", 4, 1, 16, 0},        // kv heads fewer than the Ulysses degree: replicated
    {"v_narrow", 4, 2, 24, 16},  // v_head_dim != head_dim (MLA's decompressed heads)
};

bool world_fits() {
  const int n = comm::World::current()->size();
  return n == 2 || n == 4;
}

}  // namespace

TEST(CpAttentionMpi, UlyssesEqualsOneProcess) {
  if (!world_fits()) GTEST_SKIP() << "needs 2 or 4 ranks";
  const int cp = comm::World::current()->size();
  for (const Case& c : kF32Cases) check_case(c, cp, "ulysses");
  check_case({"gqa", 4, 2, 16, 0, DType::BF16}, cp, "ulysses");
}

TEST(CpAttentionMpi, RingEqualsOneProcess) {
  if (!world_fits()) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const Case& c : kF32Cases) check_case(c, 1, "ring");
  check_case({"gqa", 4, 2, 16, 0, DType::BF16}, 1, "ring");
}

TEST(CpAttentionMpi, HybridEqualsOneProcess) {
  if (comm::World::current()->size() != 4) GTEST_SKIP() << "the 2x2 hybrid needs 4 ranks";
  for (const Case& c : kF32Cases) check_case(c, 2, "hybrid");
  check_case({"gqa", 4, 2, 16, 0, DType::BF16}, 2, "hybrid");
}

// scatter then gather is the identity (and, with kv heads copied to several
// ranks, the sum of the copies: (u / n_heads) * x).
TEST(CpAttentionMpi, AllToAllRoundTripIsTheIdentity) {
  if (!world_fits()) GTEST_SKIP() << "needs 2 or 4 ranks";
  const comm::World& world = *comm::World::current();
  const int cp = world.size();
  const FullBatch fb;
  for (int u : {cp, cp / 2}) {
    if (u < 2) continue;
    Groups G = make_groups(u);
    const CpLayout L = make_cp_layout({&fb.cu, &fb.pos}, cp, G.g.cp->rank(), u);
    for (int64_t heads : {int64_t(u), int64_t(2 * u), int64_t(1)}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        Tensor x = rnd({L.local_tokens, heads * 5}, 11 + uint64_t(G.g.cp->rank()), dt);
        Tensor w = ulysses_scatter_heads(*G.g.ulysses, L, x, heads);
        EXPECT_EQ(w.shape(), (Shape{L.work_tokens, std::max<int64_t>(heads / u, 1) * 5}));
        Tensor back = Tensor::empty(x.shape(), dt);
        ulysses_gather_heads(*G.g.ulysses, L, w, heads, back);
        auto a = back.to_float_vector(), b = x.to_float_vector();
        if (heads < u)
          for (float& f : b) f = float(double(f) * double(u / heads));
        EXPECT_EQ(a, b) << "u " << u << " heads " << heads << " " << dtype_name(dt);
      }
    }
  }
}

TEST(CpAttentionMpi, HeadConstraintsNameTheNumbers) {
  if (!world_fits()) GTEST_SKIP() << "needs 2 or 4 ranks";
  const int cp = comm::World::current()->size();
  Groups G = make_groups(cp);
  const FullBatch fb;
  const CpLayout L = make_cp_layout({&fb.cu, &fb.pos}, cp, G.g.cp->rank(), cp);
  const int64_t Tl = L.local_tokens, H = 2 * cp + 1;  // odd: never divisible by the degree
  ops::AttentionShape s{H, 1, 8, 0.f, 0};
  Tensor q = Tensor::zeros({Tl, H * 8}, DType::F32), k = Tensor::zeros({Tl, 8}, DType::F32);
  Tensor v = k.clone(), out = q.clone();
  CpAttentionSaved saved;
  try {  // every rank fails before any collective
    cp_attention_fwd(G.g, L, s, q, k, v, out, saved);
    ADD_FAILURE() << "heads " << H << " over " << cp << " accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(H) + " query heads"), std::string::npos) << m;
    EXPECT_NE(m.find("Ulysses degree " + std::to_string(cp)), std::string::npos) << m;
  }
  const Status st = check_cp_heads(12, 3, 1, 4, 4);
  EXPECT_NE(st.message().find("3 kv heads"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Ulysses degree 4"), std::string::npos) << st.message();
}

// Scoring's per-row results come back to the full batch's rows on every rank.
TEST(CpAttentionMpi, GatherRowsInvertsTheSplit) {
  if (!world_fits()) GTEST_SKIP() << "needs 2 or 4 ranks";
  const comm::World& world = *comm::World::current();
  const FullBatch fb;
  const CpLayout L = make_cp_layout({&fb.cu, &fb.pos}, world.size(), world.rank(), 1);
  Tensor full = rnd({fb.T()}, 5, DType::F32);
  Tensor local = cp_local_rows(L, full, -1.f);
  EXPECT_EQ(cp_gather_rows(*world.group(), L, local).to_float_vector(), full.to_float_vector());
}
