// The process's place in a multi-process run. A World is constructed once in
// main(): under mpirun/srun (detected from the environment) it initialises MPI
// and finalises it on destruction; a plain `kestrel ...` never touches MPI and
// gets the size-1 LocalGroup. No MPI header here, so every layer can include it.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "core/status.h"

namespace kestrel::comm {

// True when this build has the MPI backend (-DKESTREL_MPI=ON).
bool built_with_mpi();

// What the launcher told us through the environment.
struct LaunchInfo {
  bool launched = false;  // started by mpirun, an MPICH/PMI launcher or srun
  int size = 1;           // ranks the launcher started
  int rank = 0;           // this process's rank as the launcher numbers it
  std::string source;     // the variable that told us, for messages ("OMPI_COMM_WORLD_SIZE=4")
};
// Returns the value of an environment variable or nullptr.
using EnvLookup = std::function<const char*(const char*)>;
// Reads OMPI_COMM_WORLD_SIZE/RANK (Open MPI), PMI_SIZE/RANK (MPICH, Intel MPI),
// then SLURM_STEP_NUM_TASKS or SLURM_NTASKS with SLURM_PROCID (srun). A
// malformed value is an error naming the variable. `env` defaults to getenv.
Result<LaunchInfo> detect_launch(const EnvLookup& env = nullptr);
// The launch is runnable by this build: more than one rank needs MPI.
Status check_launch(const LaunchInfo& info, bool have_mpi);

enum class MpiMode {
  Auto,    // MPI when launched by mpirun/srun, LocalGroup otherwise
  Always,  // MPI even for a single process started without a launcher (tests)
};
enum class ThreadLevel { Single, Funneled, Serialized, Multiple };  // MPI_THREAD_*
struct WorldOptions {
  MpiMode mpi = MpiMode::Auto;
  // Kestrel calls MPI from one thread at a time; the OpenMP kernels never do.
  ThreadLevel threads = ThreadLevel::Serialized;
};

class World {
 public:
  // Throws kestrel::Error when the launch cannot run here (size > 1 without
  // MPI, MPI already finalised, another World alive).
  explicit World(WorldOptions opts = {}, int* argc = nullptr, char*** argv = nullptr);
  // Finalises MPI, unless an exception is unwinding through the World: then
  // other ranks may be blocked in a collective and MPI_Finalize would hang, so
  // it is left to comm::abort_world (or to the launcher noticing the exit).
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  bool uses_mpi() const { return uses_mpi_; }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  // All ranks, named "world".
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  // Collective over the world: ranks with the same color form one group,
  // ordered by key. Every rank must call it, in the same order as the others.
  // color == kNoGroup: this rank joins no group and gets nullptr.
  static constexpr int kNoGroup = -1;
  std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) const;

  // Seconds any collective or point-to-point call may wait before the job is
  // aborted with a report of which ranks did not answer (comm/mpi/health.h);
  // <= 0 waits forever. Default 600 (verl's actor_rollout_ref.nccl_timeout).
  // Process-wide: it applies to every group of this World.
  static void set_collective_timeout(double seconds);
  static double collective_timeout();

  // The live World, or nullptr.
  static World* current();

 private:
  bool uses_mpi_ = false;
  int uncaught_at_start_ = 0;
  std::shared_ptr<ProcessGroup> group_;
};

// A start-up window in which one rank does one-time work while the others
// wait for it (rank 0 measures the GEMM libraries, writes the built-in data
// and runs the SFT warm start): its length has no bound known in advance, so
// the collective timeout, which bounds the imbalance of a training phase, is
// off inside it (stop 36's CI: an 8 s nccl_timeout fired while rank 0 measured
// the GEMM for 8.5 s on a busy machine). A rank that fails inside still aborts
// the job (KS_FAIL under MPI); a killed one is named by the launcher.
class UntimedCollectives {
 public:
  UntimedCollectives() : saved_(World::collective_timeout()) { World::set_collective_timeout(0); }
  ~UntimedCollectives() { World::set_collective_timeout(saved_); }
  UntimedCollectives(const UntimedCollectives&) = delete;
  UntimedCollectives& operator=(const UntimedCollectives&) = delete;

 private:
  double saved_;
};

// Last resort when an exception escapes on one rank: prints
// "kestrel: rank R: <message>" to stderr and, under MPI, MPI_Abort(MPI_COMM_WORLD, 1)
// so ranks blocked in collectives die too instead of hanging. Without MPI it
// only prints and returns; the caller then exits non-zero.
void abort_world(const std::string& message);

}  // namespace kestrel::comm
