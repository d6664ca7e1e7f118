// Expert parallelism's token dispatch (issue 15, item 6): bytes each rank
// sends per MoE layer and micro-batch (forward + backward: one layout, two
// dispatches, two combines) for the alltoall, allgather and hierarchical
// alltoall dispatchers, against the closed forms, with the messages and
// bytes that cross "nodes", and the wall time.
//
//   OMP_NUM_THREADS=1 mpirun -np 4 build/<b>/bench_ep_dispatch_bench [--nodes 0,0,1,1] [--tokens 512]
//       [--hidden 1024] [--experts 64] [--topk 8] [--etp 2]
//
// --etp e > 1 measures expert tensor parallelism instead: the world as ep =
// n / e groups of e etp ranks (Megatron's order, etp innermost), each
// expert's FFN split over its etp group, so after the alltoall over the ep
// group every etp rank's rows are gathered to every shard and the outputs
// reduce-scattered back (parallel/etp_dispatch.h). Closed form per rank: the
// alltoall's over the ep group plus (e-1) x (k_local 8 + 2 x 2 x Na_b D b),
// Na_b the largest etp rank's received rows (the padded block; one layout,
// then a gather and a reduce-scatter in the forward and again in the backward).
//
// --nodes gives the test hook's node of every rank (KESTREL_TEST_NODES;
// default: two nodes of consecutive ranks), so the hierarchical exchange has
// nodes to cross on one machine. Rows are bf16 (the training dtype). Each
// rank routes its tokens top-k over the experts: `tokens` each and uniformly, or
// skewed: expert e drawn with weight 1/(1+e) (Zipf-like, the early experts'
// ranks hot) and rank r holding tokens x (1 - r/(2 ep)) (packed micro-batches
// differ), so the allgather pads every block to rank 0's rows.
// Closed forms per rank (b = 2 bytes, D hidden, E experts, k = E/ep, Nb = the
// largest rank's permuted rows, rows out/in = rows to/from other ranks):
//   alltoall:     layout (ep-1) k 8  + 2 x (rows out + rows in) D b
//   allgather:    layout (ep-1) E 8  + 2 x 2 (ep-1) Nb D b        (all-gather + reduce-scatter, ring model)
//   hierarchical: layout (ep-1) k 8  + 4 count all-gathers (ep-1) ep 8 + the three steps' bytes
//                 (comm::A2aTraffic: the whole send buffer to the node's leader, the leader's
//                 one message per other node, its scatter to the node's ranks)
// Wire bytes of the collectives are the ring cost model's (parallel/comm_counter.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/hierarchical_a2a.h"
#include "comm/world.h"
#include "core/rng.h"
#include "ops/copy.h"
#include "ops/moe.h"
#include "parallel/comm_counter.h"
#include "parallel/ep_dispatch.h"
#include "parallel/etp_dispatch.h"

using namespace kestrel;
using parallel::EpDispatcher;
using parallel::EpLayout;

namespace {

struct Args {
  int64_t tokens = 512, hidden = 1024, experts = 64, topk = 8, etp = 1;
  std::string nodes;
};

// Top-k distinct experts per token: uniform, or expert e with weight 1 / (1 + e).
std::vector<int64_t> route(const Args& a, int rank, int ep, bool skewed) {
  const int64_t T = skewed ? a.tokens - a.tokens * rank / (2 * ep) : a.tokens;
  Philox p{11, uint64_t(rank)};
  std::vector<double> cdf(size_t(a.experts));
  double s = 0;
  for (int64_t e = 0; e < a.experts; ++e) cdf[size_t(e)] = s += skewed ? 1.0 / double(1 + e) : 1.0;
  std::vector<int32_t> idx;
  uint64_t draw = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> mine;
    while (int64_t(mine.size()) < a.topk) {
      const double u = p.uniform_double(draw++) * s;
      const int32_t e = int32_t(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      if (e < a.experts && std::find(mine.begin(), mine.end(), e) == mine.end()) mine.push_back(e);
    }
    idx.insert(idx.end(), mine.begin(), mine.end());
  }
  return ops::moe_routing(Tensor::from_host(idx, {T, a.topk}), a.experts).group_sizes;
}

struct Row {
  double sent = 0, formula = 0, inter_bytes = 0, ms = 0;
  int64_t inter_msgs = 0;
  bool nodes_known = true;  // false: the collective's algorithm decides (all-gather, reduce-scatter)
};

double sum_except(const std::vector<int64_t>& v, int me) {
  double s = 0;
  for (size_t j = 0; j < v.size(); ++j) s += int(j) == me ? 0.0 : double(v[j]);
  return s;
}

// Bytes rank `me` sends in the hierarchical exchange's three steps for the element counts C
// (C[s * n + d]: rank s to rank d): a non-leader its whole buffer to the leader; a leader, per other
// node, what its node's ranks send that node's ranks, and to each mate what arrived for it.
double hier_bytes(const std::vector<int64_t>& C, const std::vector<int>& node, int me, double es) {
  const int n = int(node.size());
  const bool leader = int(std::find(node.begin(), node.end(), node[size_t(me)]) - node.begin()) == me;
  double e = 0;
  if (!leader) {
    for (int d = 0; d < n; ++d) e += double(C[size_t(me * n + d)]);
    return e * es;
  }
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      const bool from_mine = node[size_t(s)] == node[size_t(me)], to_mine = node[size_t(d)] == node[size_t(me)];
      if ((from_mine && !to_mine) || (to_mine && d != me)) e += double(C[size_t(s * n + d)]);
    }
  return e * es;
}

// [N, D] bf16 permuted rows of tpe's counts.
Tensor permuted_rows(const std::vector<int64_t>& tpe, int64_t D) {
  int64_t N = 0;
  for (int64_t c : tpe) N += c;
  Tensor xs = Tensor::empty({N, D}, DType::BF16, MemCategory::Other);
  ops::fill(xs, 0.5f);
  return xs;
}

// The median of 3 timed runs of `exchange` (after a warm-up), in ms, each
// started together on every rank; `reset` clears the byte counters first.
template <class Reset, class Exchange>
double median_ms(comm::World& world, Reset reset, Exchange exchange) {
  std::vector<double> ms;
  for (int rep = 0; rep < 4; ++rep) {
    world.group()->barrier();
    reset();
    const auto t0 = std::chrono::steady_clock::now();
    exchange();
    ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin() + 1, ms.end());  // the first is a warm-up
  return ms[2];
}

// One MoE layer's exchanges in a micro-batch: the layout, then dispatch and combine in the forward
// and again (of the gradients) in the backward.
Row measure(comm::World& world, const std::shared_ptr<parallel::CountingGroup>& g, const comm::HierarchicalA2a& h,
            EpDispatcher d, bool hierarchical, const std::vector<int64_t>& tpe, const Args& a) {
  const int n = g->size(), me = g->rank();
  const int64_t D = a.hidden, b = 2, k = a.experts / n;
  const comm::HierarchicalA2a* hier = hierarchical ? &h : nullptr;
  Tensor xs = permuted_rows(tpe, D);  // [N, D]
  Row r;
  r.ms = median_ms(world, [&] { g->reset(); }, [&] {
    const EpLayout L = parallel::ep_dispatch_layout(*g, tpe, d);
    Tensor xr = parallel::ep_dispatch(*g, L, xs, hier, MemCategory::Other);  // [Nr, D]
    Tensor y = parallel::ep_combine(*g, L, xr, hier, MemCategory::Other);    // [N, D]
    xr = parallel::ep_dispatch(*g, L, y, hier, MemCategory::Other);
    y = parallel::ep_combine(*g, L, xr, hier, MemCategory::Other);
  });
  r.sent = g->stats().total_wire_bytes();  // the hierarchical steps' own groups are added below
  const EpLayout L = parallel::ep_dispatch_layout(*world.group(), tpe, d);  // uncounted: for the closed forms
  if (d == EpDispatcher::AllGather) {
    r.formula = double((n - 1) * a.experts * 8) + 4.0 * double(n - 1) * double(L.block_rows * D * b);
    r.nodes_known = false;
    return r;
  }
  // Elements to / from each rank in the dispatch.
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) sc[size_t(j)] = L.send_rows[size_t(j)] * D, rc[size_t(j)] = L.recv_rows[size_t(j)] * D;
  r.formula = double((n - 1) * k * 8);
  if (!hierarchical) {
    r.formula += 2.0 * (sum_except(sc, me) + sum_except(rc, me)) * double(b);
    for (const auto* c : {&sc, &rc}) {
      const comm::A2aTraffic t = comm::flat_a2a_traffic(h.node_of(), me, *c, DType::BF16);
      r.inter_msgs += 2 * t.inter_node_messages;
      r.inter_bytes += 2.0 * t.inter_node_bytes;
    }
    return r;
  }
  // The counts matrix of the dispatch (C[s * n + d]) and of the combine (its transpose).
  std::vector<int64_t> C(size_t(n * n)), Ct(size_t(n * n));
  world.group()->all_gather(sc.data(), C.data(), n, DType::I64);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) Ct[size_t(t * n + s)] = C[size_t(s * n + t)];
  r.formula += 4.0 * double((n - 1) * n * 8) + 2.0 * (hier_bytes(C, h.node_of(), me, double(b)) +
                                                      hier_bytes(Ct, h.node_of(), me, double(b)));
  // The three steps' traffic, by the exchange's own counters (the same calls ep_dispatch makes).
  Tensor xr = Tensor::empty({L.received(), D}, DType::BF16, MemCategory::Other);
  for (int x = 0; x < 2; ++x) {
    comm::A2aTraffic t;
    if (x == 0) h.all_to_allv(xs, sc, xr, rc, &t);
    else h.all_to_allv(xr, rc, xs, sc, &t);
    r.sent += 2.0 * (t.inter_node_bytes + t.intra_node_bytes);
    r.inter_msgs += 2 * t.inter_node_messages;
    r.inter_bytes += 2.0 * t.inter_node_bytes;
  }
  return r;
}

// Expert tensor parallelism: the alltoall over the ep group, then the etp
// gather and reduce-scatter, forward and backward. Bytes sent per rank (both
// groups' collectives) against the closed form.
Row measure_etp(comm::World& world, const std::shared_ptr<parallel::CountingGroup>& ep,
                const std::shared_ptr<parallel::CountingGroup>& etp, const std::vector<int64_t>& tpe, const Args& a) {
  const int n = ep->size(), e = etp->size(), me = ep->rank();
  const int64_t D = a.hidden, b = 2, k = a.experts / n;
  const Tensor xs = permuted_rows(tpe, D);  // [N, D]
  Row r;
  r.ms = median_ms(world, [&] { ep->reset(), etp->reset(); }, [&] {
    const EpLayout L = parallel::ep_dispatch_layout(*ep, tpe);
    const parallel::EtpLayout T = parallel::etp_layout(*etp, L.local_group_sizes);
    Tensor y = xs;
    for (int pass = 0; pass < 2; ++pass) {  // forward, then the gradients in the backward
      Tensor xr = parallel::ep_dispatch(*ep, L, y, nullptr, MemCategory::Other);       // [Nr, D]
      Tensor xa = parallel::etp_gather(*etp, T, xr, MemCategory::Other);               // [Na, D]
      xr = parallel::etp_reduce_scatter(*etp, T, xa, MemCategory::Other);              // [Nr, D]
      y = parallel::ep_combine(*ep, L, xr, nullptr, MemCategory::Other);              // [N, D]
    }
  });
  r.sent = ep->stats().total_wire_bytes() + etp->stats().total_wire_bytes();
  const EpLayout L = parallel::ep_dispatch_layout(*ep, tpe);  // after the counted runs: for the closed form
  const parallel::EtpLayout T = parallel::etp_layout(*etp, L.local_group_sizes);
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) sc[size_t(j)] = L.send_rows[size_t(j)] * D, rc[size_t(j)] = L.recv_rows[size_t(j)] * D;
  r.formula = double((n - 1) * k * 8) + 2.0 * (sum_except(sc, me) + sum_except(rc, me)) * double(b) +
              double(e - 1) * (double(k * 8) + 4.0 * double(T.block_rows * D * b));
  r.nodes_known = false;
  return r;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokens") a.tokens = std::atoll(v.c_str());
    else if (k == "--hidden") a.hidden = std::atoll(v.c_str());
    else if (k == "--experts") a.experts = std::atoll(v.c_str());
    else if (k == "--topk") a.topk = std::atoll(v.c_str());
    else if (k == "--nodes") a.nodes = v;
    else if (k == "--etp") a.etp = std::atoll(v.c_str());
    else KS_FAIL("ep_dispatch_bench: unknown option ", k, " (--tokens, --hidden, --experts, --topk, --nodes, --etp)");
  }
  return a;
}

// The --etp table: every rank's bytes against the closed form, uniform and skewed routing.
int run_etp(comm::World& world, const Args& a) {
  const int n = world.size(), me = world.rank(), e = int(a.etp);
  KS_CHECK(e >= 2 && n % e == 0 && a.experts % (n / e) == 0, "ep_dispatch_bench: --etp ", e, " must divide the ",
           n, " ranks, and the ep size n / etp the ", a.experts, " experts");
  auto etp = std::make_shared<parallel::CountingGroup>(world.split(me / e, me, "etp"));  // etp innermost
  auto ep = std::make_shared<parallel::CountingGroup>(world.split(me % e, me, "ep"));
  if (me == 0)
    std::printf("ep %d x etp %d, %lld tokens/rank, top-%lld of %lld experts, hidden %lld, bf16 rows; per MoE layer "
                "and micro-batch (forward + backward), bytes sent by each rank\n\n",
                ep->size(), e, (long long)a.tokens, (long long)a.topk, (long long)a.experts, (long long)a.hidden);
  for (bool skewed : {false, true}) {
    const std::vector<int64_t> tpe = route(a, me, n, skewed);
    int64_t N = 0;
    for (int64_t c : tpe) N += c;
    const Row r = measure_etp(world, ep, etp, tpe, a);
    const int64_t mine[4] = {N, std::llround(r.sent), std::llround(r.formula), std::llround(r.ms * 1e3)};
    std::vector<int64_t> all(size_t(4 * n));
    world.group()->all_gather(mine, all.data(), 4, DType::I64);
    if (me != 0) continue;
    std::printf("routing: %s\n\n| layout | rank | rows N | bytes sent | closed form | ms (median of 3) |\n"
                "|---|---|---|---|---|---|\n",
                skewed ? "skewed (expert e with weight 1/(1+e), rank r with tokens x (1 - r/(2 ep)))"
                       : "uniform, equal tokens");
    for (int q = 0; q < n; ++q) {
      const int64_t* v = all.data() + 4 * q;
      std::printf("| alltoall ep %d + etp %d | %d | %lld | %lld | %lld | %.2f |\n", ep->size(), e, q,
                  (long long)v[0], (long long)v[1], (long long)v[2], double(v[3]) * 1e-3);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<comm::World> world;
  try {
    world = std::make_unique<comm::World>(comm::WorldOptions{}, &argc, &argv);
    Args a = parse(argc, argv);
    const int n = world->size(), me = world->rank();
    KS_CHECK(n >= 2 && a.experts % n == 0, "ep_dispatch_bench: run under mpirun with a rank count dividing --experts ",
             a.experts);
    if (a.etp > 1) return run_etp(*world, a);
    if (a.nodes.empty())
      for (int r = 0; r < n; ++r) a.nodes += (r ? "," : "") + std::to_string(r * 2 / n);  // two nodes
    setenv("KESTREL_TEST_NODES", a.nodes.c_str(), 1);
    auto g = std::make_shared<parallel::CountingGroup>(world->group());
    const comm::HierarchicalA2a hier(*world, g);  // its count all-gathers go through the counter
    unsetenv("KESTREL_TEST_NODES");
    if (me == 0)
      std::printf("ep %d, nodes %s, %lld tokens/rank, top-%lld of %lld experts, hidden %lld, bf16 rows; per MoE layer "
                  "and micro-batch (forward + backward), bytes sent by each rank\n\n",
                  n, a.nodes.c_str(), (long long)a.tokens, (long long)a.topk, (long long)a.experts,
                  (long long)a.hidden);
    for (bool skewed : {false, true}) {
      const std::vector<int64_t> tpe = route(a, me, n, skewed);
      if (me == 0)
        std::printf("routing: %s\n\n| dispatcher | rank | rows N | bytes sent | closed form | inter-node messages | "
                    "inter-node bytes | ms (median of 3) |\n|---|---|---|---|---|---|---|---|\n",
                    skewed ? "skewed (expert e with weight 1/(1+e), rank r with tokens x (1 - r/(2 ep)))"
                           : "uniform, equal tokens");
      int64_t N = 0;
      for (int64_t c : tpe) N += c;
      struct Case {
        const char* name;
        EpDispatcher d;
        bool hier;
      };
      for (const Case& c : {Case{"alltoall", EpDispatcher::AllToAll, false}, Case{"allgather", EpDispatcher::AllGather, false},
                            Case{"alltoall + hierarchical", EpDispatcher::AllToAll, true}}) {
        const Row r = measure(*world, g, hier, c.d, c.hier, tpe, a);
        // Rank 0 prints every rank's row: gather [N, sent, formula, msgs, bytes, ms].
        // Bytes are whole numbers; the time goes as microseconds.
        const int64_t mine[6] = {N, std::llround(r.sent), std::llround(r.formula), r.inter_msgs,
                                 std::llround(r.inter_bytes), std::llround(r.ms * 1e3)};
        std::vector<int64_t> all(size_t(6 * n));
        world->group()->all_gather(mine, all.data(), 6, DType::I64);
        if (me != 0) continue;
        for (int q = 0; q < n; ++q) {
          const int64_t* v = all.data() + 6 * q;
          char msgs[32] = "(collective's choice)", bytes[32] = "";
          if (r.nodes_known) {
            std::snprintf(msgs, sizeof msgs, "%lld", (long long)v[3]);
            std::snprintf(bytes, sizeof bytes, "%lld", (long long)v[4]);
          }
          std::printf("| %s | %d | %lld | %lld | %lld | %s | %s | %.2f |\n", c.name, q, (long long)v[0],
                      (long long)v[1], (long long)v[2], msgs, bytes, double(v[5]) * 1e-3);
        }
      }
      if (me == 0) std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    if (world && world->size() > 1) comm::abort_world(e.what());
    std::fprintf(stderr, "ep_dispatch_bench: %s\n", e.what());
    return 1;
  }
}
