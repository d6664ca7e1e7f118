// Launch detection, the size-1 World and abort_world outside MPI: all single
// process. The multi-rank behaviour is in tests/mpi (run under mpirun).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "comm/world.h"

using namespace kestrel;
using namespace kestrel::comm;

namespace {
EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(DetectLaunch, PlainProcessIsNotLaunched) {
  auto info = detect_launch(fake_env({}));
  ASSERT_TRUE(info.is_ok());
  EXPECT_FALSE(info->launched);
  EXPECT_EQ(info->size, 1);
  EXPECT_EQ(info->rank, 0);
}

TEST(DetectLaunch, ReadsOpenMpiPmiAndSlurm) {
  auto ompi = detect_launch(fake_env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"}}));
  ASSERT_TRUE(ompi.is_ok());
  EXPECT_TRUE(ompi->launched);
  EXPECT_EQ(ompi->size, 4);
  EXPECT_EQ(ompi->rank, 2);
  EXPECT_EQ(ompi->source, "OMPI_COMM_WORLD_SIZE=4");

  auto pmi = detect_launch(fake_env({{"PMI_SIZE", "3"}, {"PMI_RANK", "1"}}));
  ASSERT_TRUE(pmi.is_ok());
  EXPECT_EQ(pmi->size, 3);
  EXPECT_EQ(pmi->rank, 1);

  // srun's step size wins over the allocation's task count.
  auto slurm = detect_launch(fake_env({{"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}}));
  ASSERT_TRUE(slurm.is_ok());
  EXPECT_EQ(slurm->size, 2);
  EXPECT_EQ(slurm->rank, 1);
  auto alloc = detect_launch(fake_env({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}}));
  ASSERT_TRUE(alloc.is_ok());
  EXPECT_EQ(alloc->size, 8);
  EXPECT_EQ(alloc->rank, 5);
}

TEST(DetectLaunch, MalformedValuesNameTheVariable) {
  auto bad = detect_launch(fake_env({{"OMPI_COMM_WORLD_SIZE", "four"}}));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("OMPI_COMM_WORLD_SIZE='four' is not a positive integer"), std::string::npos)
      << bad.status().message();
  auto zero = detect_launch(fake_env({{"PMI_SIZE", "0"}}));
  EXPECT_FALSE(zero.is_ok());
  auto rank = detect_launch(fake_env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"}}));
  ASSERT_FALSE(rank.is_ok());
  EXPECT_NE(rank.status().message().find("OMPI_COMM_WORLD_RANK='2' is not a rank in [0, 2)"), std::string::npos)
      << rank.status().message();
}

TEST(CheckLaunch, ManyRanksNeedMpi) {
  LaunchInfo four;
  four.launched = true;
  four.size = 4;
  four.source = "OMPI_COMM_WORLD_SIZE=4";
  const Status s = check_launch(four, /*have_mpi=*/false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(),
            "not supported yet: built without MPI (configure with -DKESTREL_MPI=ON): launched as 4 ranks "
            "(OMPI_COMM_WORLD_SIZE=4)");
  EXPECT_TRUE(check_launch(four, /*have_mpi=*/true).is_ok());
  LaunchInfo one;
  EXPECT_TRUE(check_launch(one, /*have_mpi=*/false).is_ok());
}

TEST(World, PlainProcessIsTheSizeOneLocalWorld) {
  ASSERT_EQ(World::current(), nullptr);
  {
    World world;
    EXPECT_EQ(World::current(), &world);
    EXPECT_FALSE(world.uses_mpi());
    EXPECT_EQ(world.size(), 1);
    EXPECT_EQ(world.rank(), 0);
    EXPECT_EQ(world.group()->name(), "world");
    EXPECT_THROW(World second, Error);

    auto sub = world.split(0, 0, "tp");
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->name(), "tp");
    EXPECT_EQ(sub->size(), 1);
    EXPECT_EQ(world.split(World::kNoGroup, 0, "embedding"), nullptr);

    // Size-1 collectives are copies.
    float in[3] = {1, 2, 3}, out[3] = {};
    world.group()->all_gather(in, out, 3, DType::F32);
    EXPECT_EQ(out[2], 3.0f);
    world.group()->all_reduce(in, 3, DType::F32, ReduceOp::Avg);
    EXPECT_EQ(in[1], 2.0f);
  }
  EXPECT_EQ(World::current(), nullptr);
}

TEST(AbortWorld, WithoutMpiPrintsAndReturns) {
  ::testing::internal::CaptureStderr();
  abort_world("step 3: loss is NaN");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "kestrel: rank 0: step 3: loss is NaN\n");
}

#if !defined(KESTREL_HAVE_MPI)
// Only in -DKESTREL_MPI=OFF builds: a multi-rank launch must fail loudly, not
// run N independent copies.
TEST(World, WithoutMpiRefusesAMultiRankLaunch) {
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  try {
    World world;
    ADD_FAILURE() << "a 2-rank launch was accepted without MPI";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet: built without MPI (configure with -DKESTREL_MPI=ON)"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  WorldOptions always;
  always.mpi = MpiMode::Always;
  EXPECT_THROW(World w(always), Error);
}
#endif
