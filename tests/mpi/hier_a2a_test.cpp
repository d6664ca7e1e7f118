// Hierarchical all-to-all-v under mpirun (tests/scripts/mpi_hier_a2a.sh, 2 and
// 4 ranks): "nodes" given by KESTREL_TEST_NODES (comm::node_ids' test
// hook: one machine stands in for several), the three-step exchange
// (gather within the node, one message per node pair, scatter) delivers
// exactly what the flat group.all_to_allv delivers, bit for bit, for random
// counts (empty blocks included) in f32, bf16 and i32, with nodes of
// consecutive and of interleaved ranks; and its inter-node messages are one
// per node pair (a leader sends nodes - 1, the other ranks none) where the flat
// call sends one per remote rank. Prints "[hier a2a]" lines.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/nodes.h"
#include "comm/world.h"
#include "core/rng.h"
#include "mpi_testing.h"
#include "comm/hierarchical_a2a.h"

using namespace kestrel;
using namespace kestrel::comm;

namespace {

// Elements rank s sends rank d in round `seed` (0 for about one pair in five).
int64_t count_of(uint64_t seed, int s, int d) {
  Philox p{seed, uint64_t(s * 64 + d)};
  const float u = p.uniform(0);
  return u < 0.2f ? 0 : 1 + int64_t(p.uniform(1) * 37);
}

// A distinct 16-bit pattern per (source, destination, element), so any
// misplaced element shows, in any dtype.
uint16_t pattern(int s, int d, int64_t i) { return uint16_t(((s * 131 + d * 17) * 613 + i * 7) & 0x7bff); }

void check_layout(const char* nodes, uint64_t seed) {
  comm::World& world = *comm::World::current();
  auto& g = *world.group();
  const int n = g.size(), me = g.rank();
  setenv("KESTREL_TEST_NODES", nodes, 1);
  const HierarchicalA2a h(world, world.group());
  unsetenv("KESTREL_TEST_NODES");
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    const size_t es = dtype_size(dt);
    std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) sc[size_t(d)] = count_of(seed, me, d);
    for (int s = 0; s < n; ++s) rc[size_t(s)] = count_of(seed, s, me);
    std::vector<char> send;
    for (int d = 0; d < n; ++d)
      for (int64_t i = 0; i < sc[size_t(d)]; ++i) {
        const uint16_t v = pattern(me, d, i);
        char bytes[4] = {char(v & 0xff), char(v >> 8), char(v & 0x0f), 0};  // little-endian f32/bf16/i32, finite
        send.insert(send.end(), bytes, bytes + es);
      }
    int64_t total = 0;
    for (int64_t x : rc) total += x;
    std::vector<char> flat(size_t(total) * es), hier(size_t(total) * es, char(0x5a));
    g.all_to_allv(send.data(), sc, flat.data(), rc, dt);
    A2aTraffic t;
    h.all_to_allv(send.data(), sc, hier.data(), rc, dt, &t);
    EXPECT_EQ(std::memcmp(flat.data(), hier.data(), flat.size()), 0)
        << "nodes " << nodes << " " << dtype_name(dt) << ": hierarchical differs from the flat exchange";
    const A2aTraffic f = flat_a2a_traffic(h.node_of(), me, sc, dt);
    int64_t remote_nodes_with_data = 0;  // what a leader must send: one message per other node it has data for
    if (h.is_leader()) {
      for (int b = 0; b < h.nodes(); ++b) {
        if (b == h.node_of()[size_t(me)]) continue;
        int64_t sum = 0;
        for (int s = 0; s < n; ++s)
          for (int d = 0; d < n; ++d)
            if (h.node_of()[size_t(s)] == h.node_of()[size_t(me)] && h.node_of()[size_t(d)] == b)
              sum += count_of(seed, s, d);
        remote_nodes_with_data += sum > 0;
      }
    }
    EXPECT_EQ(t.inter_node_messages, remote_nodes_with_data) << nodes;
    EXPECT_LE(t.inter_node_messages, h.nodes() - 1) << nodes;
    if (dt == DType::F32)
      std::printf("[hier a2a] nodes %s rank %d (%s): inter-node messages flat %lld (%.0f B), hierarchical %lld "
                  "(%.0f B); intra-node flat %lld, hierarchical %lld\n",
                  nodes, me, h.is_leader() ? "leader" : "member", (long long)f.inter_node_messages,
                  f.inter_node_bytes, (long long)t.inter_node_messages, t.inter_node_bytes,
                  (long long)f.intra_node_messages, (long long)t.intra_node_messages);
  }
}

}  // namespace

TEST(HierA2a, DeliversWhatTheFlatExchangeDelivers) {
  const int n = kestrel::testing::world_group().size();
  if (n == 2) {
    check_layout("0,1", 11);
    check_layout("0,0", 12);  // one node: gather and scatter through the leader
  } else if (n == 4) {
    check_layout("0,0,1,1", 21);
    check_layout("0,1,0,1", 22);  // interleaved: a node's ranks are not consecutive
    check_layout("0,1,2,3", 23);  // a rank per node: the leaders' exchange is the flat one
  } else {
    GTEST_SKIP() << "written for 2 and 4 ranks";
  }
}

TEST(HierA2a, NodesComeFromMpiOrTheTestHook) {
  comm::World& world = *comm::World::current();
  // No hook: this launch's ranks share one machine.
  const std::vector<int> real = comm::node_ids(world);
  for (int id : real) EXPECT_EQ(id, 0);
  setenv("KESTREL_TEST_NODES", "3,7", 1);
  if (world.size() != 2) {
    try {
      comm::node_ids(world);
      ADD_FAILURE() << "a node list of the wrong length was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("one per rank"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(comm::node_ids(world), (std::vector<int>{0, 1}));  // renumbered in rank order
  }
  unsetenv("KESTREL_TEST_NODES");
}
