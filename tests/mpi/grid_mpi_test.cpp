// ProcessGrid built with MPI: each communicator's members, in group-rank
// order, are exactly the pure-arithmetic table (GridLayout::ranks_of).
#include "mpi_testing.h"
#include "parallel/grid.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {

std::vector<ParallelDims> grids_for(int world) {
  std::vector<ParallelDims> out;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2})
      for (int pp : {1, 2, 4})
        for (int ep : {1, 2}) {
          ParallelDims d;
          d.tp = tp;
          d.cp = cp;
          d.pp = pp;
          d.ep = ep;
          if (validate(d, world).is_ok()) out.push_back(d);
          d.order = "tp-cp-ep-pp-dp";
          if (validate(d, world).is_ok()) out.push_back(d);
        }
  return out;
}

}  // namespace

TEST(GridMpi, GroupsMatchTheRankTables) {
  comm::World& world = *comm::World::current();
  const auto grids = grids_for(world.size());
  EXPECT_GE(grids.size(), 1u);
  for (const ParallelDims& d : grids) {
    const std::string cfg = "tp" + std::to_string(d.tp) + " cp" + std::to_string(d.cp) + " pp" +
                            std::to_string(d.pp) + " ep" + std::to_string(d.ep) + " " + d.order;
    ProcessGrid grid(world, d);
    const auto c = grid.coords();
    EXPECT_EQ(grid.tp().rank(), c.tp) << cfg;
    EXPECT_EQ(grid.cp().rank(), c.cp) << cfg;
    EXPECT_EQ(grid.dp().rank(), c.dp) << cfg;
    EXPECT_EQ(grid.pp().rank(), c.pp) << cfg;
    EXPECT_EQ(grid.group(GroupKind::Ep)->rank(), c.ep) << cfg;
    EXPECT_EQ(grid.group(GroupKind::Edp)->rank(), c.edp) << cfg;
    for (GroupKind k : kAllGroupKinds) {
      const auto where = grid.layout().locate(k, world.rank());
      const auto& g = grid.group(k);
      if (where.group < 0) {
        EXPECT_EQ(g, nullptr) << cfg << " " << group_kind_name(k);
        continue;
      }
      if (!g) {
        ADD_FAILURE() << cfg << " " << group_kind_name(k) << ": no group on rank " << world.rank();
        continue;
      }
      EXPECT_EQ(g->name(), group_kind_name(k));
      std::vector<int32_t> members(g->size());
      int32_t me = world.rank();
      g->all_gather(&me, members.data(), 1, DType::I32);
      const std::vector<int> want = grid.ranks_of(k)[where.group];
      EXPECT_EQ(std::vector<int>(members.begin(), members.end()), want) << cfg << " " << group_kind_name(k);
      EXPECT_EQ(g->rank(), where.index) << cfg << " " << group_kind_name(k);
    }
    // The data-parallel gradient all-reduce of a tp shard: every dp_cp peer holds the same shard index.
    int32_t shard = c.tp;
    grid.dp_cp().all_reduce(&shard, 1, DType::I32, comm::ReduceOp::Max);
    EXPECT_EQ(shard, c.tp) << cfg;
  }
}
