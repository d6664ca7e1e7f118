#include "comm/world.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

#include "core/progress.h"
#include "core/status.h"

#if defined(KESTREL_HAVE_MPI)
#include "comm/mpi/health.h"
#include "comm/mpi/mpi_group.h"
#include "comm/mpi/mpi_runtime.h"
#endif

namespace kestrel::comm {

namespace {

World* g_current = nullptr;

// Parses a non-negative decimal integer; false on anything else.
bool parse_int(const char* s, int* out) {
  if (!s || !*s) return false;
  long v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return false;
    v = v * 10 + (*p - '0');
    if (v > 1 << 30) return false;
  }
  *out = int(v);
  return true;
}

const char* kBuiltWithoutMpi = "not supported yet: built without MPI (configure with -DKESTREL_MPI=ON)";

int g_launch_rank = 0;
// Set by abort_world: the launcher's SIGTERM that follows our own MPI_Abort
// needs no second message.
volatile sig_atomic_t g_aborting = 0;

// SIGTERM under a launcher: mpirun/srun terminate the surviving ranks when one
// dies. Their own report names the lost rank; this line adds where each
// survivor was, then the default action ends the process. (Installed only in
// a build with MPI; [[maybe_unused]] keeps a build without it warning-free.)
[[maybe_unused]] void termination_notice(int sig) {
  if (g_aborting) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  char buf[256];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s && n < sizeof buf - 2) buf[n++] = *s++;
  };
  char rank[16];
  int v = g_launch_rank, k = 0;
  char tmp[16];
  do {
    tmp[k++] = char('0' + v % 10);
    v /= 10;
  } while (v && k < 15);
  for (int i = 0; i < k; ++i) rank[i] = tmp[k - 1 - i];
  rank[k] = '\0';
  put("kestrel: rank ");
  put(rank);
  put(": terminated by the launcher ");
  n += progress_text_signal_safe(buf + n, sizeof buf - 2 - n);
  put(" (usually because another rank failed: see the launcher's message for which)");
  buf[n++] = '\n';
  (void)!write(2, buf, n);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

bool built_with_mpi() {
#if defined(KESTREL_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

Result<LaunchInfo> detect_launch(const EnvLookup& env_in) {
  const EnvLookup env = env_in ? env_in : EnvLookup([](const char* k) -> const char* { return std::getenv(k); });
  struct Source { const char* size; const char* rank; };
  // srun exports SLURM_NTASKS inside any allocation, even to a batch script
  // that runs kestrel directly; SLURM_STEP_NUM_TASKS is the step srun started.
  const Source sources[] = {{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                            {"PMI_SIZE", "PMI_RANK"},
                            {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"},
                            {"SLURM_NTASKS", "SLURM_PROCID"}};
  for (const Source& s : sources) {
    const char* v = env(s.size);
    if (!v) continue;
    LaunchInfo info;
    info.launched = true;
    info.source = std::string(s.size) + "=" + v;
    if (!parse_int(v, &info.size) || info.size < 1)
      return KS_ERR("environment variable ", s.size, "='", v, "' is not a positive integer (set by the launcher; unset it to run one process)");
    const char* r = env(s.rank);
    if (r && (!parse_int(r, &info.rank) || info.rank >= info.size))
      return KS_ERR("environment variable ", s.rank, "='", r, "' is not a rank in [0, ", info.size, ") (", info.source, ")");
    return info;
  }
  return LaunchInfo{};
}

Status check_launch(const LaunchInfo& info, bool have_mpi) {
  if (info.size > 1 && !have_mpi)
    return KS_ERR(kBuiltWithoutMpi, ": launched as ", info.size, " ranks (", info.source, ")");
  return Status::ok();
}

World::World(WorldOptions opts, int* argc, char*** argv) {
  KS_CHECK(g_current == nullptr, "a comm::World already exists; construct exactly one, in main()");
  auto launch = detect_launch();
  launch.status().throw_if_error();
  check_launch(*launch, built_with_mpi()).throw_if_error();
  const bool want_mpi = launch->launched || opts.mpi == MpiMode::Always;
#if defined(KESTREL_HAVE_MPI)
  if (want_mpi) {
    const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
    mpi::init(argc, argv, levels[int(opts.threads)]);
    uses_mpi_ = true;
    try {
      group_ = MpiGroup::dup_world("world");
      mpi::health_init();
    } catch (...) {
      mpi::finalize();
      throw;
    }
    g_launch_rank = group_->rank();
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = termination_notice;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
  }
#else
  if (want_mpi && opts.mpi == MpiMode::Always) KS_FAIL(kBuiltWithoutMpi);
#endif
  if (!group_) group_ = local_group("world");
  uncaught_at_start_ = std::uncaught_exceptions();
  g_current = this;
}

World::~World() {
  g_current = nullptr;
#if defined(KESTREL_HAVE_MPI)
  if (uses_mpi_) {
    group_.reset();  // frees the duplicated communicator while MPI still runs
    mpi::health_finalize();
    if (std::uncaught_exceptions() <= uncaught_at_start_) mpi::finalize();
  }
#endif
}

World* World::current() { return g_current; }

void World::set_collective_timeout(double seconds) {
#if defined(KESTREL_HAVE_MPI)
  mpi::set_collective_timeout(seconds);
#else
  (void)seconds;
#endif
}

double World::collective_timeout() {
#if defined(KESTREL_HAVE_MPI)
  return mpi::collective_timeout();
#else
  return 0;
#endif
}

std::shared_ptr<ProcessGroup> World::split(int color, int key, const std::string& name) const {
#if defined(KESTREL_HAVE_MPI)
  if (uses_mpi_) return static_cast<MpiGroup&>(*group_).split(color, key, name);
#endif
  if (color < 0) return nullptr;
  return local_group(name);
}

void abort_world(const std::string& message) {
  int rank = 0;
#if defined(KESTREL_HAVE_MPI)
  if (mpi::is_active()) rank = mpi::world_rank();
  else
#endif
  {
    auto launch = detect_launch();
    if (launch.is_ok()) rank = launch->rank;
  }
  // One write of the whole line: cerr is unbuffered, so piecewise insertion
  // interleaved with other ranks' output in mpirun's merged stream (seen:
  // "kestrel: rank " ... a gtest banner ... "1: abort demo ...").
  const std::string line = "kestrel: rank " + std::to_string(rank) + ": " + message + "\n";
  std::cerr << line << std::flush;
  g_aborting = 1;
#if defined(KESTREL_HAVE_MPI)
  mpi::abort(1);
#endif
}

}  // namespace kestrel::comm
